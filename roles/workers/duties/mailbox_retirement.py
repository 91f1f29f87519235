"""Mailbox retirement and worked-mail trimming: two passes of the ``maintenance`` duty.

Every node creates every seat's mailbox (DESIGN §5), so no node may remove
one on its own account: a seat dropped from the company would come back on
the next node to boot with an older revision. :class:`Retirement` removes a
dropped seat's mailbox once it is **drained** (nothing pending, nothing in
anybody's hands) or once it has been seen dropped for the company's
``retention.mail_days`` — whichever comes first, so mail nobody can work any
more is not kept forever either — and never before the seat has been seen
dropped for :data:`GRACE_INTERVALS` intervals.

A seat the company keeps loses only its **worked** mail (:class:`Trimmer`:
what lies below its mailbox's ack floor, paced for the broker). Nothing
ages out a kept seat's unworked mail: an unowned seat's mailbox holds it
until somebody claims the seat.
"""

from __future__ import annotations

import asyncio
import time

from crewlet import log
from crewlet.company import Company
from crewlet.queue.jetstream import JetStreamMailboxes

# A mailbox is trimmed once it has one worked message per this many mailboxes
# (see worth_a_purge).
MAILBOXES_PER_WORKED = 100
# After a purge, the trimmer rests this many times what the purge took: the
# AGENTS stream is locked during a purge at most 1/(1+PURGE_REST) of the time.
PURGE_REST = 4.0
# Intervals a seat must have been seen dropped before its mailbox goes, drained or
# not: this node may still be on an older revision than a node that just created
# the mailbox of a seat the newer revision adds.
GRACE_INTERVALS = 5


class Retirement:
    """The dropped seats this holder has seen, and since when (its own
    monotonic view: a new holder starts its grace again, which only delays)."""

    def __init__(self, mailboxes: JetStreamMailboxes, interval: float):
        self.mailboxes = mailboxes
        self.interval = interval
        self.dropped_since: dict[str, float] = {}  # seat -> when first seen dropped (wall clock)

    async def step(self, company: Company) -> tuple[int, set[str]]:
        """One look: ``(mailboxes retired, seats the company keeps that have one)``."""
        current = {s.name for s in company.seats}
        existing = await self.mailboxes.existing()
        keep_for = company.retention.mail_days * 86400
        now = time.time()
        retired = 0
        for seat in sorted(existing - current):
            since = self.dropped_since.setdefault(seat, now)
            if now - since < GRACE_INTERVALS * self.interval:
                continue
            info = await self.mailboxes.info(seat)
            drained = not info.get("pending") and not info.get("in_flight")
            if drained or now - since >= keep_for:
                await self.mailboxes.remove(seat)
                self.dropped_since.pop(seat, None)
                retired += 1
                log.event("mailbox_retired", seat=seat, drained=drained,
                          pending=info.get("pending"), in_flight=info.get("in_flight"))
        for seat in list(self.dropped_since):
            if seat not in existing or seat in current:
                self.dropped_since.pop(seat)  # gone, or back in the company
        return retired, existing & current


def worth_a_purge(mailboxes: int) -> int:
    """Worked messages a mailbox must have before it is trimmed, of *mailboxes*
    in all: a purge costs the broker a walk of every consumer of ``AGENTS``,
    so what one purge frees grows with their number (1 up to
    :data:`MAILBOXES_PER_WORKED` mailboxes, 100 at 10,000)."""
    return max(1, mailboxes // MAILBOXES_PER_WORKED)


class Trimmer:
    """Worked-mail trims, paced for the broker: one mailbox at a time, and
    after each purge a rest of :data:`PURGE_REST` times what it took. A
    purge holds the ``AGENTS`` stream's lock while the broker walks the
    stream's blocks for the seat's subject and every consumer (seconds, on a
    stream of 10,000 busy mailboxes), and every seat's mail waits behind
    that lock: the pace keeps the stream answering, and a mailbox is trimmed
    only once it has :func:`worth_a_purge` worked messages. A sweep stops
    after *budget* seconds; the next one goes on from the seat after the last
    one looked at, so every mailbox has its turn however many there are."""

    def __init__(self, mailboxes: JetStreamMailboxes, budget: float):
        self.mailboxes = mailboxes
        self.budget = budget
        self.after = ""  # the last seat looked at ("" : start from the first)
        self.rested = 0.0  # seconds rested after purges, all sweeps together

    async def sweep(self, seats: list[str]) -> tuple[int, int]:
        """Trim *seats*' worked mail, in name order from where the last sweep
        stopped: ``(messages purged, mailboxes failed)``."""
        order = sorted(seats)
        start = next((i for i, s in enumerate(order) if s > self.after), 0)
        order = order[start:] + order[:start]
        deadline = time.monotonic() + self.budget
        at_least = worth_a_purge(len(order))
        total = looked = 0
        failed: list[str] = []
        for seat in order:
            if time.monotonic() >= deadline:
                break
            began = time.monotonic()
            try:
                purged = await self.mailboxes.trim(seat, at_least)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed.append(seat)
                log.event("mailbox_trim_failed", "warning", seat=seat,
                          error=f"{type(exc).__name__}: {exc}")
                purged = 0
            looked += 1
            self.after = seat
            total += purged
            if purged:
                rest = (time.monotonic() - began) * PURGE_REST
                self.rested += rest
                await asyncio.sleep(rest)
        log.event("mailboxes_trimmed", seats=len(order), looked=looked, purged=total,
                  failed=len(failed))
        return total, len(failed)
