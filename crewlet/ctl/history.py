"""``crewletctl history``: the company revisions stored in the fleet, oldest first.

One row per revision: its number, ``*`` on the active one, when and by whom
it was applied, its seat count, digest and source file. ``--json`` prints
the same as a list of objects with the keys ``rev, active, at, seats,
digest, source, applied_by`` (``at`` a unix time). Exit 69 when the node's
NATS cannot be reached.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from crewlet.coord.control_plane import ControlPlane
from crewlet.ctl import Ctl
from crewlet.ctl.apply import with_control_plane

COLUMNS = ("rev", "", "applied at", "seats", "digest", "source", "applied by")


def table(rows: list[dict[str, Any]], active: dict[str, Any] | None) -> str:
    """The history as aligned text columns, with a closing line on the epoch."""
    if not rows:
        return "no revisions yet: crewletctl apply FILE stores the first"
    cells = [COLUMNS] + [(str(r["rev"]), "*" if r["active"] else "",
                          time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["at"])) if r.get("at") else "-",
                          str(r["seats"]), r.get("digest") or "-", r.get("source") or "-",
                          r.get("applied_by") or "-") for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    if active:
        lines.append(f"active: revision {active.get('rev')}, epoch {active.get('epoch')}")
    return "\n".join(lines)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the revisions as a JSON list.")
@click.pass_obj
def history(ctl: Ctl, as_json: bool) -> None:
    """List the company revisions, oldest first; * marks the active one."""

    async def read(plane: ControlPlane) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        return await plane.history(), await plane.active()

    rows, active = with_control_plane(ctl, read)
    click.echo(json.dumps(rows, indent=2) if as_json else table(rows, active))
