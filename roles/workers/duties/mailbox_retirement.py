"""Mailbox retirement and worked-mail trimming: two passes of the ``maintenance`` duty.

Every node creates every seat's mailbox (DESIGN §5), so no node may remove
one on its own account: a seat dropped from the company would come back on
the next node to boot with an older revision. :class:`Retirement` removes a
dropped seat's mailbox once it is **drained** (nothing pending, nothing in
anybody's hands) or once it has been seen dropped for the company's
``retention.mail_days`` — whichever comes first, so mail nobody can work any
more is not kept forever either — and never before the seat has been seen
dropped for :data:`GRACE_INTERVALS` intervals.

A seat the company keeps loses only its **worked** mail (:func:`trim_worked`:
what lies below its mailbox's ack floor). Nothing ages out a kept seat's
unworked mail: an unowned seat's mailbox holds it until somebody claims the
seat.
"""

from __future__ import annotations

import asyncio
import time

from crewlet import log
from crewlet.company import Company
from crewlet.queue.jetstream import JetStreamMailboxes

# Mailboxes trimmed at once.
TRIM_PARALLEL = 16
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


async def trim_worked(mailboxes: JetStreamMailboxes, seats: list[str]) -> tuple[int, int]:
    """Drop the worked mail of *seats*' mailboxes: ``(messages purged, mailboxes failed)``."""
    limit = asyncio.Semaphore(TRIM_PARALLEL)

    async def one(seat: str) -> int:
        async with limit:
            return await mailboxes.trim(seat)

    purged = await asyncio.gather(*(one(s) for s in seats), return_exceptions=True)
    failed = [s for s, n in zip(seats, purged) if isinstance(n, BaseException)]
    total = sum(n for n in purged if isinstance(n, int))
    log.event("mailboxes_trimmed", seats=len(seats), purged=total, failed=len(failed))
    return total, len(failed)
