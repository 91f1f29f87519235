"""The ``ESTATE`` log's trim: the maintenance duty's, every ``estate.trim_every`` seconds.

The log is trimmed up to the lowest seq that **every copy in service** has
applied — an evicted copy, or one whose applier is stopped, does not hold it
back (it starts again from a snapshot, or is rebuilt), and a node without the
data role has no copy to count — and **never past the newest snapshot**
(crewlet/estate/snapshot.py), so a data node that joins after the trim always
finds a snapshot it can follow the log from. No snapshot yet: no trim.

Refused while the live broker members are fewer than ``stream.replicas``
(crewlet/coord/capacity.py): a member that is away comes back needing the
log it missed.

The trim is one purge of the stream below that seq (the broker's
``STREAM.PURGE`` with ``seq``). A copy that had not applied that far when the
purge landed — it fell out of service in between — finds its rows below the
log and says so (the README's table), never a gap it would apply over.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from crewlet import log
from crewlet.coord import capacity
from crewlet.estate import log as estate_log
from crewlet.estate import snapshot
from crewlet.estate.view import NodeState


def trim_point(copies: Iterable[NodeState], newest_snapshot: int | None) -> tuple[int | None, str]:
    """The seq the log may be trimmed up to (inclusive), or None, and why."""
    serving = [c for c in copies if c.in_service]
    if not serving:
        return None, "no copy in service"
    if newest_snapshot is None:
        return None, "no snapshot yet: a data node joining later would have nothing to start from"
    low = min(c.applied for c in serving)
    if newest_snapshot < low:
        return newest_snapshot, f"the newest snapshot ({newest_snapshot}; every copy in service applied {low})"
    return low, f"the lowest copy in service applied {low} ({min(serving, key=lambda c: c.applied).id})"


async def trim(js, copies: Iterable[NodeState], presences: Mapping[str, Mapping[str, Any]],
               replicas: int) -> dict[str, Any]:
    """Trim the log once; what was done, for the duty's report. Refused
    while the streams are short of their replicas (the capacity handshake)."""
    first, last = await estate_log.bounds(js)
    report: dict[str, Any] = {"log_first": first, "log_last": last, "removed": 0}
    short = capacity.short_of_replicas(presences, replicas)
    if short is not None:
        report["why"] = f"refused: {short}"
        log.event("estate_log_trim_refused", "warning", reason=short)
        return report
    newest = await snapshot.latest(js)
    upto, report["why"] = trim_point(copies, newest.seq if newest is not None else None)
    if upto is None or upto + 1 <= first:
        return report
    why = report["why"]
    await js.purge_stream(estate_log.STREAM, seq=upto + 1)
    report.update(removed=upto + 1 - first, log_first=upto + 1)
    log.event("estate_log_trimmed", upto=upto, removed=upto + 1 - first, why=why)
    return report
