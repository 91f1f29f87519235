"""Duty ``mailbox_retirement``: remove the mailboxes of seats the company dropped,
and trim worked mail from the ones it keeps.

Every node creates every seat's mailbox (DESIGN §5), so no node may remove
one on its own account: a seat dropped from the company would come back on
the next node to boot with an older revision. This singleton removes a
dropped seat's mailbox once it is **drained** (nothing pending, nothing in
anybody's hands) or once its mail has waited past the company's
``retention.mail_days`` — whichever comes first, so mail nobody can work any
more is not kept forever either — and never before the seat has been seen
dropped for :data:`GRACE_INTERVALS` intervals.

Worked mail (below a mailbox's ack floor) is purged every :data:`TRIM_EVERY`
seconds; the mailbox stream's ``max_age`` is the backstop behind it.
"""

from __future__ import annotations

import asyncio
import time

from crewlet import log
from crewlet.queue.jetstream import JetStreamMailboxes
from roles.workers.duties import Duty

# Seconds between trims of worked mail: it costs a request per seat, and worked
# mail only takes space.
TRIM_EVERY = 3600.0
# Mailboxes trimmed at once.
TRIM_PARALLEL = 16
# Intervals a seat must have been seen dropped before its mailbox goes, drained or
# not: this node may still be on an older revision than a node that just created
# the mailbox of a seat the newer revision adds.
GRACE_INTERVALS = 5


async def run(ctx) -> None:
    mailboxes = JetStreamMailboxes(ctx.role.jetstream(), ctx.role.nats)
    dropped_since: dict[str, float] = {}  # seat -> when this duty first saw it dropped
    last_trim: float | None = None  # monotonic; None: not yet (the first pass trims)
    while True:
        company = ctx.company()
        if company is not None:
            current = {s.name for s in company.seats}
            existing = await mailboxes.existing()
            retention = company.retention.mail_days * 86400
            now = time.time()
            for seat in sorted(existing - current):
                since = dropped_since.setdefault(seat, now)
                if now - since < GRACE_INTERVALS * ctx.interval:
                    continue
                info = await mailboxes.info(seat)
                drained = not info.get("pending") and not info.get("in_flight")
                if drained or now - since >= retention:
                    await mailboxes.remove(seat)
                    dropped_since.pop(seat, None)
                    log.event("mailbox_retired", seat=seat, drained=drained,
                              pending=info.get("pending"), in_flight=info.get("in_flight"))
            for seat in list(dropped_since):
                if seat not in existing or seat in current:
                    dropped_since.pop(seat)  # gone, or back in the company
            if last_trim is None or time.monotonic() - last_trim >= TRIM_EVERY:
                last_trim = time.monotonic()
                await _trim(mailboxes, sorted(existing & current))
        await asyncio.sleep(ctx.interval)


async def _trim(mailboxes: JetStreamMailboxes, seats: list[str]) -> None:
    limit = asyncio.Semaphore(TRIM_PARALLEL)

    async def one(seat: str) -> int:
        async with limit:
            return await mailboxes.trim(seat)

    purged = await asyncio.gather(*(one(s) for s in seats), return_exceptions=True)
    failed = [s for s, n in zip(seats, purged) if isinstance(n, BaseException)]
    log.event("mailboxes_trimmed", seats=len(seats),
              purged=sum(n for n in purged if isinstance(n, int)), failed=len(failed))


DUTY = Duty("mailbox_retirement", run)
