"""Turn records to custody, in batches: a group commit.

Every turn's record is kept by exactly one data node (custody,
roles/data_applier/custody.py), from ``EVENTS``. One stored message per turn
was measured as a fifth of the broker's work and a third of the applier's at
100 busy seats (bench/turns.py), so a seats process sends its records
together, on :data:`~crewlet.queue.jetstream.KEPT_TURNS` as
``{"records": [record, ...]}``:

* the first record of a quiet moment goes out at once, alone;
* records that come while a batch is being stored wait for it, and go out
  together as the next batch, up to :data:`BATCH_BYTES`.

No record waits on a timer, so a lone turn's record is as quick as before;
many busy seats share one message. The live feed is not batched: each record
also goes out on its own on core NATS (crewlet.queue.post.TURN_SUBJECT).

:meth:`KeptTurns.keep` returns once the batch holding the record is stored,
so a turn is acked only after its record landed, as before; it raises what
storing it raised, or :class:`TimeoutError` at the record's own deadline (a
batch goes on trying until the latest deadline among its records). A batch
is one message id through its retries (``publish_until``): stored once. A
record sent again (a trigger's ``done`` record after a redo) may be kept
twice by custody; the estate's ``turns`` table, keyed by op id, has it once.
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from typing import Awaitable, Callable

# A batch's largest body: well under the broker's 1 MiB payload, and small
# enough that one applier transaction of custody stays short.
BATCH_BYTES = 256 * 1024

# (the record's JSON, its deadline on the monotonic clock, who waits for it)
_Waiting = tuple[bytes, float, asyncio.Future]
Send = Callable[[bytes, str, float], Awaitable[None]]  # (body, msg id, deadline)


def _settle(landed: asyncio.Future, error: BaseException | None) -> None:
    """Tell whoever waits for *landed*; an error nobody awaits any more (its
    record's deadline passed) is not reported again by asyncio."""
    if landed.done():
        return
    if error is None:
        landed.set_result(None)
    else:
        landed.set_exception(error)
        landed.exception()  # retrieved: the record's own turn says it, if it still waits


class KeptTurns:
    """One seats process's records on their way to custody.

    Invariants: ``_waiting`` holds the records not yet in a batch, oldest
    first; ``_sender`` is the task storing batches while there are any, else
    None (so a record that finds it None starts one).
    """

    def __init__(self, send: Send):
        self._send = send
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._sender: asyncio.Task | None = None
        self.batches = 0   # batches stored
        self.records = 0   # records in them

    async def keep(self, record: bytes, deadline: float) -> None:
        """Store *record* (a turn record's JSON) in custody's stream, with the
        records of other turns ending meanwhile; by *deadline* (monotonic)."""
        landed = asyncio.get_running_loop().create_future()
        self._waiting.append((record, deadline, landed))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_batches())
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            await asyncio.shield(landed)

    async def close(self) -> None:
        """Stop sending; whoever still waits is told so."""
        if self._sender is not None:
            self._sender.cancel()
            try:
                await self._sender
            except asyncio.CancelledError:
                pass
        # A sender cancelled before it first ran never reached its finally.
        self._sender = None
        self._fail(self._waiting)

    async def _send_batches(self) -> None:
        batch: list[_Waiting] = []
        try:
            while self._waiting:
                batch = self._next_batch()
                error: BaseException | None = None
                try:
                    await self._send(b'{"records":[' + b",".join(r for r, _, _ in batch) + b"]}",
                                     f"turns:{uuid.uuid4().hex}", max(d for _, d, _ in batch))
                    self.batches += 1
                    self.records += len(batch)
                except Exception as exc:  # said by each record's own turn
                    error = exc
                for _, _, landed in batch:
                    _settle(landed, error)
                batch = []
        finally:
            # Left only by close() (or nothing left): whoever still waits is told.
            self._sender = None
            self._fail([*batch, *self._waiting])

    def _fail(self, items) -> None:
        for _, _, landed in items:
            _settle(landed, ConnectionError("the seats process stopped sending turn records"))
        self._waiting.clear()

    def _next_batch(self) -> list[_Waiting]:
        """The oldest waiting records whose bodies fit :data:`BATCH_BYTES`
        (always at least one: a record is far smaller than a message may be)."""
        batch = [self._waiting.popleft()]
        size = len(batch[0][0])
        while self._waiting and size + len(self._waiting[0][0]) + 1 <= BATCH_BYTES:
            item = self._waiting.popleft()
            batch.append(item)
            size += len(item[0]) + 1
        return batch
