"""Duty ``maintenance``: the company's retention, and retiring dropped seats' mailboxes.

What goes, and by which rule (the company's ``retention``):

==============  ============================================  =====================
what            rule                                          done by
==============  ============================================  =====================
a dropped       drained, or seen dropped ``mail_days``        this duty, every
seat's mailbox  (never within its grace)                      interval
worked mail     below its mailbox's ack floor                 this duty, each sweep
unworked mail   **never aged out** while its seat exists:     —
                an unowned seat's mailbox keeps it until
                somebody claims the seat (``AGENTS`` has no
                age limit)
turn records    started more than ``turns_days`` ago:         this duty, each sweep,
                ``turn.trim`` ops on the estate's log, so     through the estate
                every copy removes the same rows              router
kept events     kept more than ``events_days``: the           each data node, of its
                ``EVENTS`` stream's age, and each data        own (custody's table
                node's custody table, pruned by that node     is node-local)
ledger entries  their own TTL, longer than their mail can     the broker (a per-key
                be redelivered (roles/seats)                  TTL)
==============  ============================================  =====================

A **sweep** runs when this node takes the duty, every :data:`SWEEP_EVERY`
seconds, and at once when a company revision changes ``retention``. Turn
records older than the cutoff (now − ``turns_days``, rounded down to
:data:`CUTOFF_GRAIN`) go in ops of at most
:data:`~crewlet.estate.ops.TURN_TRIM_DEFAULT` records each, sent one after
the other while an outcome says ``more`` (at most :data:`TRIM_OPS` a sweep).
Op ``n`` of a cutoff has the id ``maintenance:turns:<cutoff>:<n>``, and its
``after`` comes from op ``n-1``'s outcome — the same on every copy — so two
holders overlapping at a hand-over send the same ops, and each lands once.

**Reports.** Each sweep writes its record to ``status`` key
``duty.maintenance`` (:mod:`crewlet.coord.duty_reports`): ``removed`` (this
sweep's counts: ``turns``, ``mail``, ``mailboxes``, the mailboxes retired
since the last report), ``totals`` (carried on from the previous holder's
record), the turns cutoff, and ``errors``. ``crewletctl status`` shows it as
the ``maintenance`` line; ``/metrics`` as ``crewlet_retention_removed_total``.
Each data node's pruned events are in its own ``estate`` line and stats.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from crewlet import log
from crewlet.company import Company
from crewlet.coord import duty_reports
from crewlet.estate.ops import TURN_TRIM_DEFAULT, make_op, op_id
from crewlet.queue.jetstream import JetStreamMailboxes
from roles.workers.duties import Duty, going_on, log_trim, rest
from roles.workers.duties.mailbox_retirement import Retirement, Trimmer

NAME = "maintenance"
# Seconds between sweeps: a trim costs a request per seat, and worked mail
# and old turn records only take space.
SWEEP_EVERY = 3600.0
# The turns cutoff is rounded down to this many seconds, so two holders
# sweeping within it send the same op ids (and each op lands once).
CUTOFF_GRAIN = 3600
# turn.trim ops one sweep sends at most (TRIM_OPS x TURN_TRIM_DEFAULT records):
# a backlog bigger than that is worked off over the next sweeps.
TRIM_OPS = 200
# Seconds a sweep spends trimming worked mail at most; the next sweep goes on
# from where it stopped.
TRIM_BUDGET = SWEEP_EVERY / 4
# Seconds one turn.trim may take through the router (it waits per data node).
TRIM_TIMEOUT = 60.0
# What a sweep counts, in the order a report shows them.
COUNTED = ("turns", "mail", "mailboxes")
# Seconds the first sweep waits for a copy of the estate to serve (its turn
# records are read through one), at most: a node's start takes a second or two.
COPY_WAIT = 30.0


def cutoff(now: float, turns_days: int) -> int:
    """The start time before which turn records go, rounded down to :data:`CUTOFF_GRAIN`."""
    raw = int(now) - turns_days * 86400
    return max(0, raw - raw % CUTOFF_GRAIN)


async def trim_turns(router, node: str, before: int) -> tuple[int, bool]:
    """Send ``turn.trim`` ops for cutoff *before* until none says ``more`` (at
    most :data:`TRIM_OPS`): ``(records removed, more left for the next sweep)``.
    Raises what the router raised, or RuntimeError for a refused op."""
    removed, after = 0, 0
    for n in range(TRIM_OPS):
        going_on()  # up to TRIM_OPS requests of up to a minute each
        op = make_op("turn.trim", {"before": before, "limit": TURN_TRIM_DEFAULT, "after": after},
                     node=node, id=op_id(NAME, "turns", str(before), str(n)))
        outcome = await router.write(op, timeout=TRIM_TIMEOUT)
        if not outcome.get("ok"):
            raise RuntimeError(f"turn.trim refused: {outcome.get('error')}")
        result = outcome.get("result") or {}
        if not outcome.get("duplicate"):
            removed += int(result.get("removed") or 0)  # a duplicate's rows went with the first
        if not result.get("more"):
            return removed, False
        after = int(result.get("after") or after)
    return removed, True


class Maintenance:
    """One holder's sweeps and what it reports."""

    def __init__(self, ctx, mailboxes: JetStreamMailboxes):
        self.ctx = ctx
        self.mailboxes = mailboxes
        self.js = ctx.role.jetstream()
        self.retirement = Retirement(mailboxes, ctx.interval)
        self.trimmer = Trimmer(mailboxes, TRIM_BUDGET)
        self.totals = {what: 0 for what in COUNTED}
        self.retired = 0  # mailboxes retired since the last report

    async def carry_totals(self) -> None:
        """Go on from the previous holder's totals (a counter must not restart at a hand-over)."""
        await duty_reports.carry_totals(self.js, NAME, self.totals)

    async def sweep(self, company: Company, kept: set[str]) -> dict[str, Any]:
        """Worked mail, then turn records; the report, written and returned."""
        started = time.monotonic()
        removed = {what: 0 for what in COUNTED}
        errors: list[str] = []
        mail, failed = await self.trimmer.sweep(sorted(kept))
        removed["mail"] = mail
        if failed:
            errors.append(f"worked mail: {failed} mailboxes could not be trimmed")
        before = cutoff(time.time(), company.retention.turns_days)
        more = False
        if self.ctx.estate is None:
            errors.append("turn records: no estate router on this node")
        else:
            try:
                removed["turns"], more = await trim_turns(self.ctx.estate, self.ctx.config.node.id,
                                                          before)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                errors.append(f"turn records: {type(exc).__name__}: {exc}")
        removed["mailboxes"], self.retired = self.retired, 0
        for what, n in removed.items():
            self.totals[what] += n
        report = {"node": self.ctx.config.node.id, "token": self.ctx.token, "at": time.time(),
                  "took_ms": round((time.monotonic() - started) * 1000, 1),
                  "removed": removed, "totals": dict(self.totals),
                  "turns": {"days": company.retention.turns_days, "before": before, "more": more},
                  "errors": errors}
        log.event("maintenance_swept", "warning" if errors else "info", removed=removed,
                  turns_before=before, turns_more=more, errors=errors)
        try:
            await duty_reports.write(self.js, NAME, report)
        except Exception as exc:  # the next sweep writes again; the totals are kept here meanwhile
            log.event("maintenance_report_failed", "warning", error=f"{type(exc).__name__}: {exc}")
        return report


async def _trim_log(ctx, js) -> None:
    """The estate log's trim (roles/workers/duties/log_trim.py), said when it fails."""
    presences = {k.removeprefix("node."): o.info for k, o in ctx.holders.of("node.").items()} \
        if ctx.holders is not None and ctx.holders.listed.is_set() else {}
    if not presences:
        # Not listed yet, or not even this node's own presence seen yet (the
        # first sweep after a start): every broker member would look gone, and
        # the trim be refused with a warning. The next look trims.
        log.event("estate_log_trim_skipped", reason="the node presences are not known yet")
        return
    try:
        await log_trim.trim(js, ctx.estate.view.data_nodes(), presences, ctx.config.stream.replicas)
    except Exception as exc:  # no quorum, the view not ready: the next look tries again
        log.event("estate_log_trim_failed", "warning", error=f"{type(exc).__name__}: {exc}")


async def run(ctx) -> None:
    work = Maintenance(ctx, JetStreamMailboxes(ctx.role.jetstream(), ctx.role.nats))
    await work.carry_totals()
    if ctx.estate is not None:
        await ctx.estate.serving(COPY_WAIT, going_on)
    last_sweep: float | None = None  # monotonic; None: not yet (the first look sweeps)
    last_trim: float | None = None   # of the estate log, likewise
    retention = None                 # the company's retention at the last sweep
    while going_on():
        if ctx.estate is not None and (last_trim is None
                                       or time.monotonic() - last_trim >= ctx.config.estate.trim_every):
            last_trim = time.monotonic()
            await _trim_log(ctx, work.js)
        company = ctx.company()
        if company is not None:
            retired, kept = await work.retirement.step(company)
            work.retired += retired
            due = last_sweep is None or time.monotonic() - last_sweep >= SWEEP_EVERY
            if due or company.retention != retention:
                last_sweep, retention = time.monotonic(), company.retention
                await work.sweep(company, kept)
        await rest(ctx.interval)


DUTY = Duty(NAME, run)
