"""Custody of the turn events: each event of ``EVENTS`` kept by exactly one data node.

Seats of a version before 2026-12-06 published their turn records on
``events.>`` (the ``EVENTS`` stream, which crewletd's fleet makes with the
mailboxes; custody waits for it to exist rather than making it). Seats of
this version send them to the estate's log alone (roles/seats/kept.py):
every copy's ``turns`` table is their one stored copy, so they are not
stored a second time here. Custody keeps whatever still arrives. Every data node's applier attaches to one
durable pull consumer, the :data:`crewlet.groups.CUSTODY` group, so each
event is handed to one of them, which keeps it in its copy's node-local
``events`` table and only then acks it. A node without data never attaches
(:func:`crewlet.groups.check_attach` refuses it by name): it would take its
share and keep it nowhere.

Each fetched batch is written in one LMDB transaction on the applier's writer
thread: key the event's 8-byte stream sequence, value msgpack of
``{"subject", "data", "at"}`` (``data`` decoded as JSON when it is JSON, else
text; ``at`` the time the stream stored it). Then each is acked. A fetch
that finds nothing (either of nats-py's timeouts) is an idle stream, counted
(``idle``) and not logged. An event
already in the table (an ack that was lost, a redelivery) is acked and not
written again. An event this node took and did not ack within
:data:`ACK_WAIT` goes to whichever node fetches next. A node whose copy is
out of service (evicted, say, for a failing disk) takes no events meanwhile:
the other data nodes keep them.

Exactly one node keeps an event in normal running; a node killed between its
commit and its ack leaves the event to be kept again elsewhere after
:data:`ACK_WAIT` (at least once, in that window).

**Retention.** Kept events follow the company's ``retention.events_days``,
the same age the ``EVENTS`` stream keeps them for. The table is this node's
own (no other copy holds the same events), so each data node prunes its own:
:meth:`Custody.prune_loop` removes the events stored more than that many
days ago, oldest first (keys are stream sequences, so stored order), at most
:data:`PRUNE_BATCH` per transaction on the writer thread, when the retention
is first known or changes and every :data:`PRUNE_EVERY` seconds. Until the
node has a company nothing is pruned. ``pruned`` in the stats counts them
(``crewletctl status``'s ``estate`` line).

The consumer is created only when it does not exist
(:func:`crewlet.queue.jetstream.create_consumer`, as the mailboxes are).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable, Iterable

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from crewlet import groups
from crewlet import log as events
from crewlet.estate.store import Store, pack, seq_key, unpack
from crewlet.queue.jetstream import EVENTS_STREAM, api_prefix, create_consumer

# A node that took events and died gives them back after this: long enough for
# a batch's write and acks, short enough that a dead node's share is kept
# elsewhere soon.
ACK_WAIT = 30.0
# Events fetched and kept per LMDB transaction.
FETCH_BATCH = 100
# Seconds one fetch waits for events before asking again.
FETCH_WAIT = 2.0
# Unacked events one node may hold: a batch in hand and the next one coming.
MAX_ACK_PENDING = 1000
# Pause while the stream or JetStream is missing, doubling up to the maximum.
RETRY_MIN = 0.2
RETRY_MAX = 5.0
ACK_TIMEOUT = 2.0
# Seconds between prunes of the kept events (and the first, once the
# retention is known): old events only take space.
PRUNE_EVERY = 600.0
# Events removed per LMDB transaction: the writer thread applies the log too.
PRUNE_BATCH = 1000

_NS = 1_000_000_000


def event_value(msg) -> dict[str, Any]:
    """What the ``events`` table keeps of one event."""
    try:
        data: Any = json.loads(msg.data)
    except ValueError:
        data = msg.data.decode(errors="replace")
    return {"subject": msg.subject, "data": data, "at": msg.metadata.timestamp.timestamp()}


def keep_events(store: Store, rows: list[tuple[bytes, bytes]]) -> int:
    """Write the events not in the table yet, in one transaction; how many were new."""
    new = 0
    with store.env.begin(write=True) as txn:
        for key, value in rows:
            if txn.put(key, value, db=store.dbs["events"], overwrite=False):
                new += 1
    return new


def prune_events(store: Store, before: float, limit: int = PRUNE_BATCH) -> tuple[int, bool]:
    """Remove the kept events stored before wall-clock *before*, oldest
    first, at most *limit*, in one transaction: ``(removed, more)``, *more*
    when it stopped at *limit* with old events left. An event that says no
    time (none is kept so) counts as old."""
    removed = 0
    with store.env.begin(write=True) as txn:
        cur = txn.cursor(db=store.dbs["events"])
        found = cur.first()
        while found:
            at = unpack(cur.value()).get("at")
            if isinstance(at, (int, float)) and at >= before:
                return removed, False
            if removed >= limit:
                return removed, True
            removed += 1
            found = cur.delete() and bool(cur.key())  # deleting moves the cursor to the next
    return removed, False


class Custody:
    """This node's share of ``EVENTS``, kept in its copy."""

    def __init__(self, nc: Client, js: JetStreamContext, store: Store,
                 write: Callable[..., Awaitable[Any]], *, roles: Iterable[str],
                 serving: Callable[[], bool] = lambda: True):
        self.nc = nc
        self.js = js
        self.store = store
        self._write = write  # runs a function on the copy's writer thread
        self.roles = tuple(roles)
        self.serving = serving  # the copy is in service: only then are events taken
        self.name = groups.durable(groups.CUSTODY)
        self.stats = {"kept": 0, "again": 0, "ack_failed": 0, "idle": 0,  # idle: fetches that found none
                      "pruned": 0}
        self.stopping = False  # loops end on it as well as on a cancel (the applier's stop)
        self.keep_days: int | None = None  # the company's retention.events_days, once known
        self._retention_changed = asyncio.Event()

    def set_keep_days(self, days: int) -> None:
        """The company's ``retention.events_days`` (a new revision): pruned by it at once if it changed."""
        if days != self.keep_days:
            self.keep_days = days
            self._retention_changed.set()

    async def prune_loop(self) -> None:
        """Prune the kept events past the retention, for ever (module doc)."""
        while not self.stopping:
            try:
                async with asyncio.timeout(PRUNE_EVERY):
                    await self._retention_changed.wait()
            except TimeoutError:
                pass
            self._retention_changed.clear()
            if self.keep_days is None:
                continue
            try:
                await self.prune(time.time() - self.keep_days * 86400)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the disk, or the copy closing: the next round tries again
                events.event("custody_prune_failed", "warning", error=f"{type(exc).__name__}: {exc}")

    async def prune(self, before: float) -> int:
        """Remove the kept events stored before *before*, a batch per write; how many."""
        removed, more = 0, True
        while more and not self.stopping:
            n, more = await self._write(prune_events, self.store, before)
            removed += n
        self.stats["pruned"] += removed
        if removed:
            events.event("custody_pruned", removed=removed, before=round(before, 3),
                         days=self.keep_days)
        return removed

    async def run(self) -> None:
        # A node without a copy may not take events: refused here, by name.
        groups.check_attach(groups.CUSTODY, self.roles)
        pause = RETRY_MIN
        while not self.stopping:
            try:
                await self._wait_for_stream()
                await self._ensure_consumer()
                psub = await self.js.pull_subscribe_bind(durable=self.name, stream=EVENTS_STREAM)
                events.event("custody_attached", consumer=self.name, stream=EVENTS_STREAM)
                pause = RETRY_MIN
                try:
                    await self._drain(psub)
                finally:
                    try:
                        await psub.unsubscribe()
                    except Exception:
                        pass
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                events.event("custody_failed", "warning", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_MAX)

    async def _wait_for_stream(self) -> None:
        pause, said = RETRY_MIN, False
        while not self.stopping:
            try:
                await self.js.stream_info(EVENTS_STREAM)
                return
            except NotFoundError:
                if not said:
                    events.event("custody_waiting", stream=EVENTS_STREAM,
                                 why="the stream does not exist yet (crewletd's fleet makes it)")
                    said = True
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_MAX)

    async def _ensure_consumer(self) -> None:
        config = {"name": self.name, "durable_name": self.name, "deliver_policy": "all",
                  "ack_policy": "explicit", "ack_wait": int(ACK_WAIT * _NS),
                  "max_ack_pending": MAX_ACK_PENDING, "replay_policy": "instant",
                  "num_replicas": 0}  # 0: the stream's replicas, so custody survives a member
        if await create_consumer(self.nc, api_prefix(self.js), EVENTS_STREAM, config):
            events.event("custody_consumer_created", consumer=self.name, stream=EVENTS_STREAM)

    async def _drain(self, psub) -> None:
        while not self.stopping:
            if not self.serving():
                await _hand_back_queued(psub)
                await asyncio.sleep(FETCH_WAIT)
                continue
            try:
                msgs = await psub.fetch(FETCH_BATCH, timeout=FETCH_WAIT)
            except TimeoutError:
                # Nothing to keep: an idle stream, not a failure. nats-py says so
                # with its own TimeoutError (a subclass), or with a bare
                # asyncio one when the server's "no messages" to its first
                # probe came after the wait was used up. Taking the bare one
                # for a failure logged custody_failed and attached again,
                # every few minutes on an idle node.
                self.stats["idle"] += 1
                continue
            msgs = [m for m in msgs if m.reply]  # status messages carry no ack subject
            if msgs and not self.serving():
                # Went out of service while the fetch waited: hand them back at once.
                await asyncio.gather(*(m.nak() for m in msgs), return_exceptions=True)
            elif msgs:
                await self._keep(msgs)

    async def _keep(self, msgs: list) -> None:
        rows = [(seq_key(m.metadata.sequence.stream), pack(event_value(m))) for m in msgs]
        new = await self._write(keep_events, self.store, rows)
        self.stats["kept"] += new
        self.stats["again"] += len(rows) - new
        # Kept first, then acked: a lost ack brings the event back, and it is
        # found in the table and acked without a second row.
        results = await asyncio.gather(*(m.ack_sync(timeout=ACK_TIMEOUT) for m in msgs),
                                       return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            self.stats["ack_failed"] += len(failed)
            events.event("custody_ack_failed", "warning", failed=len(failed), of=len(msgs),
                         error=f"{type(failed[0]).__name__}: {failed[0]}")


async def _hand_back_queued(psub) -> None:
    """NAK the events already delivered to this process but not yet fetched.

    A pull the server answered after our fetch gave up (its wait used up)
    leaves events in the subscription's queue; a copy that went out of
    service fetches no more, so without this they would wait out the ack
    wait (30 s) before another data node could keep them. nats-py has no
    public way to take them without pulling more, so its queue is read
    directly (as its own fetch does first)."""
    queue = getattr(getattr(psub, "_sub", None), "_pending_queue", None)
    handed = []
    while queue is not None and not queue.empty():
        msg = queue.get_nowait()
        psub._sub._pending_size -= len(msg.data)
        if msg.reply:  # status messages carry no ack subject
            handed.append(msg)
    if handed:
        await asyncio.gather(*(m.nak() for m in handed), return_exceptions=True)
