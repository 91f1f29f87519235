"""A duty's last pass, where the whole fleet reads it: ``status`` key ``duty.<name>``.

A duty runs on one node at a time and moves between nodes, so what its last
pass did is kept in the fleet's ``status`` bucket rather than in the holder's
memory: ``crewletctl status`` on any node shows it (crewletd samples the keys
every heartbeat), and ``/metrics`` on any ingress reads it. A record is the
duty's own dict; by convention it carries ``node``, ``token`` and ``at`` (wall
clock), and a duty that counts what it did over time keeps ``totals`` that its
next holder carries on from (:func:`read`), so a counter does not start again
at every hand-over.

Writes are plain publishes on the bucket's subject (answered from a leaf too,
as every ``status`` write is); reads are direct gets and one stream-info for
the key list, so no consumer is made.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from nats.js import JetStreamContext

from crewlet import log
from crewlet.bus import kv_subject, publish_until
from crewlet.coord.buckets import STATUS, last, subjects

PREFIX = "duty."


def key(name: str) -> str:
    return PREFIX + name


# Seconds a report write is sent again while unanswered (an election takes ~6 s).
WRITE_PATIENCE = 10.0


async def write(js: JetStreamContext, name: str, record: dict[str, Any]) -> None:
    """Put *record* as duty *name*'s last pass: a write after the pass's
    effects, so sent again under one id while a leader election leaves it
    unanswered (:func:`crewlet.bus.publish_until`; its running totals would
    otherwise be lost). Raises what the publish raised."""
    await publish_until(js, kv_subject(js, STATUS.name) + key(name), json.dumps(record).encode(),
                        msg_id=f"{key(name)}:{uuid.uuid4().hex}", deadline=time.monotonic() + WRITE_PATIENCE)


async def read(js: JetStreamContext, name: str, *, leader: bool = True) -> dict[str, Any] | None:
    """Duty *name*'s last record, or None (never written, or not a record).
    *leader*: as the stream's leader has it (a holder carrying totals on must
    not read a lagging replica); else any replica's (a display)."""
    _, data = await last(js, STATUS.name, key(name), leader=leader)
    try:
        record = json.loads(data) if data else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


async def carry_totals(js: JetStreamContext, name: str, totals: dict[str, int]) -> None:
    """Raise *totals* to duty *name*'s last recorded ``totals`` where those are
    higher: a holder goes on from its predecessor's counts (a counter must not
    restart at a hand-over). A record that cannot be read is said, and the
    counts start from here."""
    try:
        last = await read(js, name)
    except Exception as exc:
        log.event(f"{name}_report_unread", "warning", error=f"{type(exc).__name__}: {exc}")
        return
    for what, n in ((last or {}).get("totals") or {}).items():
        if what in totals and isinstance(n, int) and not isinstance(n, bool) and n > totals[what]:
            totals[what] = n


async def read_all(js: JetStreamContext) -> dict[str, dict[str, Any]]:
    """Every duty's last record, by duty name."""
    found: dict[str, dict[str, Any]] = {}
    for name in await subjects(js, STATUS.name, PREFIX + "*"):
        duty = name[len(PREFIX):]
        record = await read(js, duty, leader=False)
        if record is not None:
            found[duty] = record
    return found
