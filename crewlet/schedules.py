"""When a schedule fires: its ticks, their trigger ids, and which missed ones fire (``catch_up``).

Pure functions of times given as unix seconds (UTC instants); nothing here
reads a clock or the fleet. The ``scheduler`` duty
(:mod:`roles.workers.duties.scheduler`) and ``crewletctl schedules`` use them,
and the company model (:mod:`crewlet.company.model`) checks a schedule with
:func:`check_cron` and :func:`zone` so a bad one is refused at apply.

**Ticks.** A ``cron`` schedule ticks when its five fields (minute hour
day-of-month month day-of-week) match the wall clock of its ``tz`` (an IANA
name, default ``UTC``), evaluated by cronsim, which treats the daylight-saving
jumps as Debian's cron does: a time skipped in spring fires once at the
jump (``30 2 * * *`` at 03:00 on that day), a time repeated in autumn fires
once (the first) for a job with a fixed hour, and wildcard-hour jobs fire at
every real instant. An ``every`` schedule ticks at the multiples of its period
since the Unix epoch, so every node computes the same ticks without agreeing
on a start (``every: 1d`` is midnight UTC; use cron for a local time).

**Trigger ids.** A tick's trigger id is ``<schedule>@<scheduled time>``,
spelled ``<schedule>=<YYYYMMDDTHHMMSSZ>`` (ISO-8601 basic format, UTC: a
trigger is a KV key, which allows neither ``@`` nor ``:``). It names the
scheduled time, never the time it was sent, so one tick sent twice is one
trigger: the mailbox drops the repeat and the seat's ledger skips it.

**Catch-up.** :func:`plan` decides which ticks due since the last one
settled a holder fires now. A tick that comes due while this holder runs
the schedule is fired, late if the broker was away. A tick that came due
*before* this holder took the duty — while no node held it, or before its
predecessor recorded it — is *missed*, and the schedule's ``catch_up``
says what happens:

``latest`` (the default)
    the most recent missed tick is fired once; the older ones are skipped;
``all``
    every missed tick is fired, oldest first, at most the
    :data:`CATCH_UP_ALL_MAX` most recent (older ones are skipped);
``none``
    no missed tick is fired.

Skipped ticks are settled too (not looked at again), and the duty logs
how many (``schedule_ticks_skipped``).
"""

from __future__ import annotations

import calendar
import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any, Iterable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

UTC = timezone.utc
DEFAULT_TZ = "UTC"
CATCH_UP = ("latest", "all", "none")
DEFAULT_CATCH_UP = "latest"
# Missed ticks catch_up: all fires after a gap, at most (the most recent): a
# tick is a turn, and a turn spends tokens, so a week's outage of a
# five-minute schedule must not become 2,016 turns at once.
CATCH_UP_ALL_MAX = 24
# Ticks counted in one gap at most (a cron's ticks are walked one by one:
# ~3 µs each); more are reported as this many.
COUNT_MAX = 100_000
# The scheduled time in a trigger id: ISO-8601 basic format, UTC.
TRIGGER_TIME = "%Y%m%dT%H%M%SZ"
TRIGGER_SEP = "="


def zone(name: str) -> ZoneInfo:
    """The time zone called *name* (IANA); ValueError naming it if unknown."""
    try:
        return _zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name like UTC or Europe/Paris)") from None


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def check_cron(expr: str) -> str:
    """*expr* if cronsim takes it as five fields that ever match; ValueError saying why."""
    if len(expr.split()) != 5:
        raise ValueError(f"expected five cron fields (minute hour day month weekday), got {expr!r}")
    try:
        CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ValueError(f"not a valid cron expression {expr!r}: {exc}") from None
    return expr


@dataclass(frozen=True)
class Timing:
    """When a schedule ticks: *every* seconds, or *cron* in time zone *tz*."""

    every: int | None = None
    cron: str | None = None
    tz: str = DEFAULT_TZ

    def __post_init__(self) -> None:
        if (self.every is None) == (self.cron is None):
            raise ValueError("a timing is every or cron, exactly one")

    @property
    def spec(self) -> str:
        """One line naming the timing: a record of the last fire under another
        spec is not this schedule's (the schedule was changed)."""
        return f"every {self.every}s" if self.every is not None else f"cron {self.cron} {self.tz}"

    def next_after(self, t: float) -> float:
        """The first tick strictly after *t*."""
        if self.every is not None:
            return (math.floor(t / self.every) + 1) * self.every
        start = datetime.fromtimestamp(math.floor(t), zone(self.tz))
        return next(CronSim(self.cron, start)).timestamp()

    def between(self, after: float, until: float, keep: int) -> tuple[list[float], int]:
        """The last *keep* ticks in (*after*, *until*], ascending, and how many
        there are in all (a cron's counted up to :data:`COUNT_MAX`)."""
        if until <= after:
            return [], 0
        if self.every is not None:
            p = self.every
            first, last = math.floor(after / p) + 1, math.floor(until / p)
            count = max(0, last - first + 1)
            return [k * p for k in range(max(first, last - keep + 1), last + 1)], count
        # Walked back from the end: the ticks kept are the latest whatever the gap.
        walk = CronSim(self.cron, datetime.fromtimestamp(math.floor(until) + 1, zone(self.tz)), reverse=True)
        kept: list[float] = []
        count = 0
        for when in walk:
            t = when.timestamp()
            if t <= after or count >= COUNT_MAX:
                break
            count += 1
            if len(kept) < keep:
                kept.append(t)
        return kept[::-1], count


@dataclass(frozen=True)
class Plan:
    """What a holder does now: *fire* these ticks (ascending), settle every
    tick up to *settled*; *skipped* ticks due are not fired (``first_skipped``
    and ``last_skipped`` bound them)."""

    fire: list[float]
    settled: float
    skipped: int = 0
    first_skipped: float | None = None
    last_skipped: float | None = None


def plan(timing: Timing, after: float, now: float, since: float, catch_up: str = DEFAULT_CATCH_UP) -> Plan | None:
    """Which ticks in (*after*, *now*] to fire now, for a holder that has run
    the schedule since *since* (see the module's *Catch-up*); None when
    none is due."""
    if catch_up not in CATCH_UP:
        raise ValueError(f"catch_up must be one of {', '.join(CATCH_UP)}, got {catch_up!r}")
    due, count = timing.between(after, now, COUNT_MAX)
    if not due:
        return None
    settled = due[-1]
    on_time = [t for t in due if t >= since]
    missed = [t for t in due if t < since]
    missed_count = count - len(on_time)  # all of them, where due holds only the latest COUNT_MAX
    keep = {"latest": 1, "all": CATCH_UP_ALL_MAX, "none": 0}[catch_up]
    fired_missed = missed[len(missed) - keep:] if keep else []
    # On-time ticks are fired whatever the policy, but never more than the bound at once.
    fire = (fired_missed + on_time)[-CATCH_UP_ALL_MAX:]
    skipped = missed[:len(missed) - len(fired_missed)]  # fired_missed is a suffix of missed
    extra = missed_count - len(missed)  # older than what was walked: skipped too
    first_skipped = None
    if extra > 0:
        first_skipped = timing.next_after(after)
    elif skipped:
        first_skipped = skipped[0]
    return Plan(fire=fire, settled=settled, skipped=len(skipped) + max(0, extra),
                first_skipped=first_skipped, last_skipped=skipped[-1] if skipped else None)


def trigger(schedule: str, when: float) -> str:
    """The trigger id of *schedule*'s tick scheduled at *when*."""
    return f"{schedule}{TRIGGER_SEP}{time.strftime(TRIGGER_TIME, time.gmtime(round(when)))}"


def tick_of(trigger_id: str) -> tuple[str, float] | None:
    """(schedule, scheduled time) of a tick's trigger id; None if it is not one."""
    name, sep, stamp = trigger_id.rpartition(TRIGGER_SEP)
    if not sep or not name:
        return None
    try:
        return name, float(calendar.timegm(time.strptime(stamp, TRIGGER_TIME)))
    except ValueError:
        return None


def iso(when: float | None) -> str | None:
    """*when* as ISO-8601 UTC with seconds (``2025-03-10T09:00:00Z``); None stays None."""
    if when is None:
        return None
    return (datetime.fromtimestamp(0, UTC) + timedelta(seconds=round(when))).strftime("%Y-%m-%dT%H:%M:%SZ")


def rows(schedules: Iterable[Any], records: dict[str, dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """Each of *schedules* (the company's :class:`~crewlet.company.model.Schedule`)
    with its next tick and its last fire from *records* (name -> the duty's
    record, :mod:`crewlet.coord.fired`): what ``crewletctl schedules --json``
    and ``GET /v1/schedules`` show. A record of another timing is history,
    not this schedule's."""
    out = []
    for s in schedules:
        timing = s.timing
        record = records.get(s.name) or {}
        ours = record.get("spec") == timing.spec
        settled = record.get("settled") if ours else None
        nxt = timing.next_after(float(settled) if isinstance(settled, (int, float)) else now)
        fired = record.get("fired") if ours else None
        out.append({
            "name": s.name, "seat": s.seat, "timing": timing.spec, "catch_up": s.catch_up,
            "next": iso(nxt), "due": nxt <= now,
            "last": None if not isinstance(fired, (int, float)) else {
                "scheduled": iso(fired), "trigger": record.get("trigger"),
                "fired_at": record.get("fired_at"), "node": record.get("node"),
                "token": record.get("token")}})
    return out
