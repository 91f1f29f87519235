"""``crewletctl schedules``: each schedule of the active company, when it fires next, and its last fire.

Read from the fleet's NATS like ``history``: the active revision (its
``schedules:``), the ``scheduler`` duty's record of each schedule
(``status/schedule.<name>``, :mod:`crewlet.coord.fired`) and who holds
``duty.scheduler`` now. One row per schedule: its name, seat, timing
(``every 30s`` or ``cron <fields> <tz>``), ``catch_up``, the next tick
(ISO-8601 UTC; ``due`` when it is past and nobody has fired it yet: no node
holds the duty, or the holder is busy), and the last tick fired — its
scheduled time, the node and fencing token that fired it, and when.

``--json`` prints ``{"rev", "holder", "schedules"}``: ``holder`` is
``{"node", "token"}`` of the duty or null; each schedule is an object with
the keys ``name, seat, timing, catch_up, next, due, last`` where ``last`` is
null or ``{"scheduled", "trigger", "fired_at", "node", "token"}`` (times ISO-8601
UTC but ``fired_at``, a unix time). Exit 69 when the node's NATS cannot be
reached, 1 when the active revision cannot be read as a company.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from crewlet.company.load import from_revision
from crewlet.config import ConfigError
from crewlet.coord.buckets import LEASES, last
from crewlet.coord.control_plane import ControlPlane, ControlPlaneError
from crewlet.coord.fired import Fired
from crewlet.coord.lease import read_owner
from crewlet.ctl import EXIT_REFUSED, Ctl, fail
from crewlet.ctl.apply import with_control_plane
from crewlet.schedules import rows

COLUMNS = ("schedule", "seat", "timing", "catch up", "next", "last fired", "by", "sent")
DUTY_KEY = "duty.scheduler"


def table(rev: Any, holder: dict[str, Any] | None, schedules: list[dict[str, Any]], now: float) -> str:
    """The schedules as aligned text columns, with a closing line on the duty's holder."""
    if not schedules:
        lines = [f"revision {rev} has no schedules"]
    else:
        cells = [COLUMNS]
        for s in schedules:
            fired = s["last"] or {}
            at = fired.get("fired_at")
            cells.append((s["name"], s["seat"], s["timing"], s["catch_up"],
                          s["next"] + (" (due)" if s["due"] else ""),
                          fired.get("scheduled") or "-",
                          f"{fired.get('node')} (token {fired.get('token')})" if fired else "-",
                          f"{max(0.0, now - at):.0f}s ago" if isinstance(at, (int, float)) else "-"))
        widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.append(f"duty scheduler: held by {holder['node']} (token {holder['token']})" if holder
                 else "duty scheduler: held by no node (no node runs workers, or it is moving)")
    return "\n".join(lines)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the schedules as JSON.")
@click.pass_obj
def schedules(ctl: Ctl, as_json: bool) -> None:
    """Show each schedule's next and last fire, and which node fired it."""

    async def read(plane: ControlPlane) -> tuple[Any, Any, dict, dict | None]:
        active = await plane.active()
        if active is None:
            return None, None, {}, None
        doc = await plane.revision(active["rev"])
        try:
            records = await Fired(plane.js).all()
            seq, data = await last(plane.js, LEASES.name, DUTY_KEY, leader=True)
        except Exception as exc:  # FiredError, or the broker's own: one line, exit 69
            raise ControlPlaneError(f"reading the schedules' records: {type(exc).__name__}: {exc}") from exc
        owner = read_owner(seq, data) if data else None
        holder = {"node": owner.node, "token": owner.token} if owner else None
        return active["rev"], doc.get("company"), records, holder

    rev, doc, records, holder = with_control_plane(ctl, read)
    if rev is None:
        fail("no company applied yet: crewletctl apply FILE stores the first", EXIT_REFUSED)
    try:
        company = from_revision(doc, f"revision {rev}")
    except ConfigError as exc:
        fail(f"the active company cannot be read: {exc}", EXIT_REFUSED)
    now = time.time()
    found = rows(company.schedules, records, now)
    if as_json:
        click.echo(json.dumps({"rev": rev, "holder": holder, "schedules": found}, indent=2))
    else:
        click.echo(table(rev, holder, found, now))
