"""Turn records to the estate, many turns' in one op: a group commit.

Every turn worked leaves a record in the estate's ``turns`` table on every
data node (DESIGN §6). One log entry per turn was measured as a sixth of a
turn's broker work and most of the applier's at 100 busy seats
(bench/turns.py, bench/turn_floor.py), so a seats process sends the records
of turns ending together as one ``turn.records`` op
(:mod:`crewlet.estate.ops`), straight to the log on its node's subject:

* the first record of a quiet moment goes out at once, alone;
* records that come while an op is being stored wait for it, and go out
  together as the next op, up to :data:`BATCH_BYTES` and
  :data:`~crewlet.estate.ops.TURN_RECORDS_MAX` records.

No record waits on a timer, so a lone turn's record is as quick as before;
many busy seats share one log entry. Each record in the op keeps its own op
id, seat and fencing token: every applier holds it to its seat's fence and
keeps its outcome under its id, so a record sent again — in another op, by
this node or the seat's next holder (a trigger's ``done`` record after a
redo) — lands once (:func:`crewlet.estate.apply._turn_records`).

This is the record's one stored copy. It used to be stored twice more: on
``EVENTS`` for custody (one data node's event log; now the ``turns`` table
of every copy is that log) and as an op of its own per turn. The live feed
is not stored: each record also goes out on its own on core NATS
(:data:`crewlet.queue.post.TURN_SUBJECT`), heard by whoever listens now, and
in a batch of the seats process's records of the last tenth of a second
(:data:`crewlet.queue.post.TURNS_SUBJECT`, for ingress: a timer there, as a
live feed may wait that long; the log's batches wait on no timer).

:meth:`KeptTurns.keep` returns once the op holding the record is in the
log, so a turn is acked only after its record landed, as before; it raises
what storing it raised, or :class:`TimeoutError` at the record's own
deadline (an op goes on trying until the latest deadline among its
records). An op is one message id through its retries
(:func:`crewlet.bus.publish_until`): stored once.

A record the op's check refuses (:class:`~crewlet.estate.ops.OpError`:
nothing was sent) fails its turn alone: the records of that batch are sent
again one an op, so only the bad one raises.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Awaitable, Callable

from crewlet.estate.ops import TURN_RECORDS_MAX, OpError

# An op's records, encoded, at most: well under the op's own bound
# (crewlet.estate.ops.TURN_RECORDS_MAX_BYTES) and the broker's 1 MiB payload,
# and small enough that one apply of it on every copy stays short. A record
# larger than this (up to a lone record's bound) goes in an op of its own.
BATCH_BYTES = 256 * 1024

# (the record as the op carries it, its encoded size, its deadline on the
# monotonic clock, who waits for it)
_Waiting = tuple[dict[str, Any], int, float, asyncio.Future]
Send = Callable[[list[dict[str, Any]], float], Awaitable[None]]  # (records, deadline)


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
    """One seats process's turn records on their way to the log.

    Invariants: ``_waiting`` holds the records not yet in an op, oldest
    first; ``_sender`` is the task storing ops while there are any, else
    None (so a record that finds it None starts one); the first ``_alone``
    of ``_waiting`` go one an op (a batch the check refused, sent again).
    """

    def __init__(self, send: Send):
        self._send = send
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._sender: asyncio.Task | None = None
        self._alone = 0
        self.batches = 0   # ops stored
        self.records = 0   # records in them

    async def keep(self, record: dict[str, Any], size: int, deadline: float) -> None:
        """Store *record* (``{"id", "seat", "token", "record"}``, *size*
        bytes encoded) in the log, with the records of other turns ending
        meanwhile; by *deadline* (monotonic)."""
        landed = asyncio.get_running_loop().create_future()
        self._waiting.append((record, size, deadline, landed))
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
                    await self._send([r for r, _, _, _ in batch], max(d for _, _, d, _ in batch))
                    self.batches += 1
                    self.records += len(batch)
                except OpError as exc:
                    if len(batch) > 1:
                        # Refused before anything was sent: each record again, alone.
                        self._waiting.extendleft(reversed(batch))
                        self._alone = len(batch)
                        batch = []
                        continue
                    error = exc
                except Exception as exc:  # said by each record's own turn
                    error = exc
                for _, _, _, landed in batch:
                    _settle(landed, error)
                batch = []
        finally:
            # Left only by close() (or nothing left): whoever still waits is told.
            self._sender = None
            self._fail([*batch, *self._waiting])

    def _fail(self, items) -> None:
        for _, _, _, landed in items:
            _settle(landed, ConnectionError("the seats process stopped sending turn records"))
        self._waiting.clear()
        self._alone = 0

    def _next_batch(self) -> list[_Waiting]:
        """The oldest waiting records that fit :data:`BATCH_BYTES` and
        :data:`~crewlet.estate.ops.TURN_RECORDS_MAX` (always at least one)."""
        batch = [self._waiting.popleft()]
        if self._alone:
            self._alone -= 1
            return batch
        size = batch[0][1]
        while (self._waiting and len(batch) < TURN_RECORDS_MAX
               and size + self._waiting[0][1] <= BATCH_BYTES):
            item = self._waiting.popleft()
            batch.append(item)
            size += item[1]
        return batch
