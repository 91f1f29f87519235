"""The applier: the one writer of a data node's copy, and what answers its requests.

:class:`Applier` knows nothing of ZeroMQ or of NATS request/reply (the role's
``__init__`` serves it on both); it runs in-process in tests as it runs in the
``data_applier`` child. It holds:

* the node's copy, ``<data_dir>/estate`` (:func:`crewlet.estate.store.open_env`,
  the writer handle), and the search index beside it
  (``<data_dir>/estate-search.sqlite``), both written only here;
* the JetStream context, to read the log, publish ops and keep ``status``.

The log loop
------------
Ensure the ``ESTATE`` stream (tried until JetStream answers: a data node may
start before its cluster has a quorum), then compare the copy with the log:
``applied + 1 < first`` means entries this copy never applied are gone from
the log, so the copy is out of service and applies nothing (it needs
rebuilding, not patching). Otherwise follow the log with an **ordered
consumer** from ``applied + 1``: ephemeral, flow-controlled, nobody's group
(every data node reads every entry), on every subject the stream has
(:func:`crewlet.estate.log.followed`: a log whose subjects the broker would
not let it change is followed as it is) — each entry is applied with the
subject it was found on, and one whose origin may not publish it there
(:mod:`crewlet.estate.origins`) is passed over (``estate_op_refused``, the
``refused`` stat; :mod:`crewlet.estate.apply`). Writes to LMDB run on one
worker thread (all but a lone short run, below), so a large batch does not
stall the event loop (and with it the child's heartbeats).

**Group commit.** The log loop checks what arrived (in order, the verdicts
below) and hands it to the writer thread's queue without waiting for
commits; the writer takes everything that waits, up to :data:`BATCH_MAX`
entries, into one LMDB transaction (:func:`crewlet.estate.apply.apply_batch`,
which commits ``applied`` with the rows), and after each commit looks at the
queue again itself: ops that arrived during a commit's ``fsync`` join the
next transaction without a trip back to the event loop, so a busy log costs
one ``fsync`` for many ops (:attr:`Applier.commits` counts them). A short
run (:data:`INLINE_MAX`) arriving while the writer thread has nothing to do
is committed on the loop itself (:meth:`Applier._commit_here`): a lone
write's two thread hand-offs cost as much as its apply. Only a
commit that changed a page (the copy's last ``pages_by_seq`` key moved) is
followed by a search-index catch-up, on the writer thread, before the commit
is told. Then the loop hears of it (:meth:`Applier._committed`): the copy's
``applied`` moves, the writes waiting for these outcomes are answered and
the reads waiting for that floor run — nothing is answered before it is
committed. A failed transaction commits nothing; what was handed over is
dropped and followed again from ``applied + 1``.

A token that would raise a seat's fence is applied only with the verdict on
it, read from (or judged into) the ``grants`` bucket first
(:mod:`roles.data_applier.grants`): a batch whose verdicts cannot be had is
not applied, and is tried again like any failure to follow the log.

The loop trusts nothing it did not check: every entry must be the next seq.
An entry past a gap ends the subscription, and a fresh one starts from
``applied + 1``; on a fresh subscription a first entry past ``applied + 1``
is only accepted when the log still starts at or below it (a hole the
broker skipped), else the copy is out of service as above. nats-py resets an
ordered consumer that misses two heartbeats (a stream leader change, a
reconnect to a restarted server) by itself; as a second line, a subscription
that brings nothing for :data:`STALL_AFTER` while the log is known to hold
more is dropped and made again, and so is one whose stream was deleted (the
stream is then ensured again, and the copy held against it).

A copy follows one log. The log's creation time is kept in the copy's
node-local ``local`` table when the copy is empty (or has no record yet); a
log found with another creation time was made anew under this copy, and no
seq of the new log means what it meant in the old one, so the copy is out of
service even once the new log has grown past it.

A copy is applied under one set of rules (:data:`crewlet.estate.apply.RULES`,
kept in ``local``). A copy applied under other rules — an older version that
accepted a NaN ``at`` or a page at ``a//b`` — may hold rows a copy made now
would not, so it is emptied and applied again from the log's first op, out of
service (``reapplying``) until it is back where it was. A log that no longer
starts at 1 cannot redo it: the copy is out of service, to be rebuilt.

Requests (:meth:`Applier.handle`)
---------------------------------
The shapes are :mod:`crewlet.estate.wire`'s. A request past its deadline is
dropped unrun (``None``: no answer). A bad request — not a map, unknown kind
or query, an op or arguments that do not check — is ``bad_request`` with the
field and the reason. A write whose op does not fit the origin that asks
(the subject it came on: :mod:`crewlet.estate.origins`) is ``bad_request``
too, ``refused: <why>``, logged as ``estate_request_refused`` and counted
(``asks_refused``); nothing is published. A copy out of service answers
``out_of_service`` with the reason.

*Write*: an op id already in the copy's ``ops`` table answers with that first
outcome and publishes nothing. Otherwise the op is published under its id:
``move_on`` kinds are published again under the same id until one is
answered or the wait ends; a ``once`` kind is published once and its answer
awaited for the whole wait — only a publish nobody could have stored
(no stream listening) is tried again. Then the answer waits for this copy to
commit the op's seq (a duplicate's answer names the first seq) and is the
outcome kept in ``ops``, handed over by that commit. A publish never
answered, or a seq not applied within the wait, is ``unvouched`` (with the
seq when it is known): the op may be in the log, and another node may be
asked under the same id.

*Read*: waits for ``applied >= floor`` up to the wait (else ``behind``), then
runs the query: ``page.search`` on the search index, every other query on the
copy (:class:`crewlet.estate.store.Reader`).

In service, and why not
-----------------------
Out of service for one of (the first that holds is the reason given):
``applier stopped`` (it is stopping), ``node evicted: <reason>`` (the
``status`` key ``evicted.<node>`` exists; deleting it brings the node back),
``rows below the log's first sequence (applied N, the log starts at M)``,
``the copy is ahead of the log (...)`` or ``the log was made anew (...)``
(the copy holds an older log's rows), ``no space on <path>: N bytes free,
under the floor of M (node.disk_floor)`` (the node's disk is low,
:mod:`crewlet.disk`: the copy applies nothing until it is not, rather than
fail mid-write) or the same for a write that failed all the same (ENOSPC
from LMDB; ``the copy … is full`` for LMDB's own map limit), which lasts
until a batch applies. The status record ``estate.<node>`` in the ``status`` bucket
says so every :data:`STATUS_EVERY` seconds and at once on a change.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Iterable

import lmdb
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from crewlet import bus, disk, outbox
from crewlet import log as events
from crewlet.coord import buckets
from crewlet.estate import apply, origins, store, wire
from crewlet.estate import log as estate_log
from crewlet.estate import skills as estate_skills
from crewlet.skills import registry as skills_registry
from crewlet.estate.ops import SEARCH_DEFAULT, Op, OpError, check_query
from crewlet.estate.search import SearchIndex, SearchUnavailable, check_shards, index_path, last_page_change
from crewlet.estate.view import STOPPED  # the reason, in the words the router and crewletctl show
from crewlet.queue.jetstream import ack_meta
from roles.data_applier import grants
from roles.data_applier.custody import Custody

# ----------------------------------------------------------------- constants

# Entries applied in one LMDB transaction: one fsync for all of them, and a
# bound on how long the worker thread holds the write lock (~0.1 s measured).
BATCH_MAX = 1000
# Entries the log loop may hand the writer ahead of its commits: past this it
# waits (what waits beyond stays in the subscription's own bounded queue).
QUEUED_MAX = 4 * BATCH_MAX
# Seconds the writer thread goes on committing what keeps arriving before it
# lets its other writes (custody's) have a turn.
DRAIN_FOR = 0.25
# A run of at most this many entries, arriving while the writer thread has
# nothing to do, is committed on the loop itself: the two thread hand-offs
# (there and back, each a thread's wake-up and the GIL) were a third of a
# lone write's time beside its fsync, and the loop had nothing else to do
# meanwhile. A burst comes in longer runs, and goes to the thread.
INLINE_MAX = 16
# Page changes indexed per search-index transaction when catching up.
INDEX_SLICE = 5000
# The ordered consumer's idle heartbeat: nats-py re-creates it after two
# missed ones, so a stream leader change or a restarted server costs ~2 s.
HEARTBEAT = 1.0
# Seconds a subscription may bring nothing while the log holds entries past
# applied before it is dropped and made again (the second line, above).
STALL_AFTER = 5.0
# How often a quiet subscription checks whether it stalled.
STALL_CHECK = 1.0
# Seconds between status records (the router counts a record older than 10 s
# as "applier stopped", so five may be lost).
STATUS_EVERY = 2.0
# Pause before trying JetStream again, doubling up to the maximum.
RETRY_MIN = 0.1
RETRY_MAX = 2.0
# One publish attempt of a move_on op (DESIGN §4: short, and retried).
PUBLISH_TIMEOUT = bus.JETSTREAM_TIMEOUT
# Pause between publish attempts of one op, doubling up to 1 s.
PUBLISH_PAUSE = 0.05

# Waits that timed out stay queued until their seq is applied; past this many
# queued, the ended ones are dropped.
WAITERS_PRUNED_AT = 1000

_CAUSES = ("stopped", "evicted", "log", "anew", "rules", "reapplying", "disk", "write")  # the order reasons are given in


def rows_below(applied: int, first: int) -> str:
    return f"rows below the log's first sequence (applied {applied}, the log starts at {first})"


def ahead_of_log(applied: int, last: int) -> str:
    return (f"the copy is ahead of the log (applied {applied}, the log ends at {last}): "
            f"the log was made anew; rebuild this copy")


def log_made_anew(applied: int, followed: str, now: str) -> str:
    return (f"the log was made anew (this copy applied {applied} ops of the log created "
            f"{followed}; the log now was created {now}): rebuild this copy")


def rules_newer(kept: int) -> str:
    return (f"this copy was written by a newer crewlet (rules {kept}; this version applies rules "
            f"{apply.RULES}): run that version here, or rebuild this copy")


def rules_changed(kept: int | None, first: int) -> str:
    return (f"this copy was applied under rules {kept or 1} and this version applies rules "
            f"{apply.RULES}, but the log starts at {first}, not 1: rebuild this copy")


def _follows(st: store.Store, created: str, empty: bool) -> str:
    """The creation time of the log this copy follows. *created* (the log's
    now) is recorded when the copy is empty (an empty copy fits any log) or
    has no record yet (it is trusted once)."""
    with st.env.begin(write=True) as txn:
        kept = txn.get(store.LOG_CREATED, db=st.dbs["local"])
        if empty or kept is None:
            txn.put(store.LOG_CREATED, created.encode(), db=st.dbs["local"])
            return created
        return bytes(kept).decode()


class _Restart(Exception):
    """The subscription to the log is to be made again from applied + 1."""


class _NoSpace(Exception):
    """A batch not applied for want of space: tried again from applied + 1."""


def write_failed(path: str, exc: BaseException, space: disk.Watch | None) -> str | None:
    """The out-of-service reason for an LMDB write that failed for want of
    space — the map's own limit (``MapFullError``), or the disk's: ENOSPC, or
    any error while the disk is low (LMDB 0.9 reports a commit the disk could
    not take as EIO, measured on tmpfs) —; None for any other failure."""
    if isinstance(exc, lmdb.MapFullError):
        return f"the copy {path} is full: LMDB's map of {store.MAP_SIZE:,} bytes (MapFullError)"
    why = space.explain(exc) if space is not None else None
    if why is None and disk.is_no_space(exc):
        why = f"no space on {path}: {exc}"
    return why and f"{why} (writing the copy {path}: {exc})"


class Applier:
    """One node's copy and its writer. Construct inside the running loop."""

    def __init__(self, nc: Client, js: JetStreamContext, node: str, data_dir: str, *,
                 replicas: int = 1, floor: int | None = None):
        self.nc = nc
        self._lag_until = 0.0  # nothing applied before this (monotonic): debug.faults kind lag
        # The node's disk (None: not watched); below its floor nothing is applied.
        self.space = disk.Watch(data_dir, floor) if floor else None
        self.copy_path = store.copy_path(data_dir)
        self.js = js
        self.node = node
        self.replicas = replicas
        self.store = store.open_env(store.copy_path(data_dir))
        self.reader = store.Reader(self.store)
        self.index = SearchIndex(index_path(data_dir))
        # Every LMDB write (apply, custody) on one thread: one writer, in order.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="estate-writer")
        # Set once the index has caught up with the copy as it was found (a
        # child killed between a commit and its catch-up; an index rebuilt).
        self._index_ready = asyncio.Event()
        # The seq the index last caught up to (the writer thread's): a commit
        # that moved the copy's last page change past it catches up again
        # (-1: the last catch-up failed, so the next commit tries).
        self._indexed_to = -1
        self.applied = self.store.applied()
        # Group commit: runs of log entries the log loop checked (in order,
        # verdicts had), waiting for the writer thread, which takes all that
        # wait into its next transaction (_drain).
        self._queue: deque[tuple[list[tuple[int, bytes, str]], apply.Grants]] = deque()
        self._queued = 0                       # entries in _queue
        self._queue_lock = threading.Lock()    # _queue, _queued, _draining, _write_error, _closing
        self._draining = False                 # a drain is on the writer thread, or queued to it
        self._write_error: BaseException | None = None  # the writer's failure, for the log loop
        self._closing = False
        self._handed = self.applied            # the last seq handed to the writer
        self._room = asyncio.Event()           # set when the writer took entries (or failed)
        self._jobs = 0                         # write() calls on the writer thread, not done
        # Transactions committed by the log loop's writer (group commit: a
        # busy log commits fewer than it applies ops).
        self.commits = 0
        self.log_first: int | None = None
        self.log_last: int | None = None
        self._log_missing = False
        self._out: dict[str, str] = {}
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        # op id -> the writes waiting for its outcome, told as soon as the
        # transaction that applied it is committed (_committed).
        self._outcomes: dict[str, list[asyncio.Future]] = {}
        self._loop = asyncio.get_running_loop()
        self._tick = itertools.count()
        # Set on every change of service, and on every commit unless on_commit
        # tells it: the applied PUB waits on it.
        self.changed = asyncio.Event()
        # Told of each commit at once, on the loop (the role sends the applied
        # PUB from it: a reader waiting for its write learns of the commit
        # without a wake of the PUB's task in between); None: ``changed`` is set.
        self.on_commit: Callable[[], None] | None = None
        self._service_changed = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        # Loops end on this as well as on a cancel: Python 3.11's wait_for
        # (nats-py's requests use it) can swallow a cancel.
        self.stopping = False
        self._sub = None
        # The grants bucket, opened on the first fence to judge and kept.
        self._grants = None
        # While "reapplying": the seq the copy had reached under older rules.
        self._reapplying_to = self.applied
        kept = store.rules(self.store)
        if kept is not None and kept > apply.RULES:
            self._out["rules"] = rules_newer(kept)
        elif self.applied and kept != apply.RULES:
            # Not served before the log is asked whether it can be applied again.
            self._out["reapplying"] = (f"the copy was applied under rules {kept or 1}, "
                                       f"this version's are {apply.RULES}")
        self._status_failing = False
        self._status_written = False  # once: a failure before means status is not made yet
        # Who is told when this copy goes out of service (Tier A smtp.notices_to).
        self.notices_to: list[str] = []
        self.custody = None
        # refused: log entries passed over for their origin; asks_refused:
        # write requests refused for theirs (crewlet.estate.origins).
        self.stats: dict[str, Any] = {"ops": 0, "requests": 0, "dropped": 0,
                                      "resubscribed": 0, "refused": 0, "asks_refused": 0}
        self._rate = (time.monotonic(), 0)
        self.ops_per_s = 0.0
        self._telling: set[asyncio.Task] = set()  # skills broadcasts on their way

    # ------------------------------------------------------------ service

    @property
    def in_service(self) -> bool:
        return not self._out

    @property
    def reason(self) -> str | None:
        for cause in _CAUSES:
            if cause in self._out:
                return self._out[cause]
        return None

    def set_out(self, cause: str, reason: str | None) -> None:
        """Mark (*reason*) or clear (None) one cause of being out of service."""
        before = (self.in_service, self.reason)
        if reason is None:
            self._out.pop(cause, None)
        else:
            self._out[cause] = reason
        if (self.in_service, self.reason) != before:
            events.event("estate_service", "info" if self.in_service else "warning",
                         in_service=self.in_service, reason=self.reason, applied=self.applied)
            if before[0] and not self.in_service and cause != "stopped" and self.notices_to:
                # The operators are told (Tier A smtp.notices_to); a stop is not news.
                # One notice per going out, so its id names the moment.
                self._spawn(outbox.notice(
                    self.js, self.notices_to, f"notice.out-of-service.{self.node}.{time.time():.0f}",
                    f"crewlet: the estate copy of node {self.node} is out of service",
                    f"Node {self.node}'s copy of the estate went out of service at applied "
                    f"sequence {self.applied}: {self.reason}\n\nIt answers no reads until "
                    "this is mended; the other copies serve meanwhile.\n"), "notice")
            self._service_changed.set()
            self.changed.set()

    # ------------------------------------------------------------ running

    def start(self, *, custody_roles: Iterable[str] | None = None) -> None:
        """Start the log loop, the status record and the eviction watch (and
        custody of the events, given the node's roles)."""
        self._spawn(self._log_loop(), "log")
        self._spawn(self._status_loop(), "status")
        self._spawn(self._eviction_loop(), "eviction")
        if custody_roles is not None:
            self.custody = Custody(self.nc, self.js, self.store, self.write, roles=custody_roles,
                                   serving=lambda: self.in_service)
            self._spawn(self.custody.run(), "custody")
            self._spawn(self.custody.prune_loop(), "custody prune")

    def _spawn(self, coro: Awaitable, name: str) -> None:
        task = asyncio.create_task(coro, name=f"applier-{name}")
        task.add_done_callback(_say_if_failed)
        self._tasks.append(task)

    async def stop(self) -> None:
        """Out of service ("applier stopped"), one last status record, then close."""
        self.stopping = True
        if self.custody is not None:
            self.custody.stopping = True
        self.set_out("stopped", STOPPED)
        await cancel_all(self._tasks)
        self._tasks.clear()
        await self._unsubscribe()
        self._wake(all_=True)
        await self.write_status()
        with self._queue_lock:
            # What was handed over and not committed is in the log: the next
            # start applies it from the copy's applied + 1.
            self._closing = True
            self._queue.clear()
            self._queued = 0
        await asyncio.get_running_loop().run_in_executor(None, self._writer.shutdown)
        self.index.close()
        store.close_env(self.store)

    async def write(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run *fn* on the writer thread (every LMDB write but the log loop's
        short runs goes through here: :meth:`_hand_over`)."""
        self._jobs += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)
        finally:
            self._jobs -= 1

    # ------------------------------------------------------------ the log

    async def _log_loop(self) -> None:
        # On the writer thread: a rebuild of a lost index may take a while.
        await self.write(self._catch_up_index)
        self._index_ready.set()
        pause = RETRY_MIN
        while not self.stopping:
            try:
                await self._follow()
                pause = RETRY_MIN
            except _Restart:
                self.stats["resubscribed"] += 1
                pause = RETRY_MIN
            except _NoSpace:
                # Out of service, saying so (set_out); from applied + 1 once there is room.
                await asyncio.sleep(disk.CHECK_EVERY)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                events.event("estate_log_unavailable", "warning",
                             error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_MAX)
            finally:
                await self._unsubscribe()

    def lag(self, seconds: float) -> None:
        """Apply nothing for *seconds*, the process otherwise well (fault
        injection, ``debug.faults`` kind ``lag``: a copy slow to acknowledge)."""
        self._lag_until = time.monotonic() + seconds

    async def _follow(self) -> None:
        """Check the copy against the log, then apply it from applied + 1 until
        something calls for a fresh subscription."""
        # What an earlier follow handed the writer is committed (or dropped,
        # if the writer failed) before the copy is held against the log.
        await self._writer_settled()
        info = await estate_log.ensure_stream(self.js, self.replicas)
        self._bounds(info.state.first_seq, info.state.last_seq, self.applied)
        await self._check_log_identity(info)
        await self._check_rules()
        if "log" in self._out or "anew" in self._out or "rules" in self._out:
            await asyncio.sleep(STATUS_EVERY)  # the status loop keeps looking
            return
        start = self.applied + 1
        self._handed = self.applied
        # Every subject the log has (each origin's, crewlet.estate.origins): a
        # copy applies or passes over every entry, by the subject it is on.
        # The stream's, not the ones it should have: one it lacks (an account
        # that may not update it) carries nothing, and one it has that no
        # filter named would be a gap to this follow at each of its entries.
        self._sub = await self.js.subscribe(
            estate_log.SUBJECT, stream=estate_log.STREAM, ordered_consumer=True,
            idle_heartbeat=HEARTBEAT,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                  opt_start_seq=start,
                                  filter_subjects=estate_log.followed(info)))
        events.event("estate_log_following", start=start, log_first=self.log_first,
                     log_last=self.log_last)
        fresh = True
        progress = time.monotonic()
        while not self.stopping:
            self._raise_write_error()
            try:
                first = await self._sub.next_msg(timeout=STALL_CHECK)
            except nats.errors.TimeoutError:
                if self._log_missing:
                    # Deleted under us: ensure it again (and hold the copy against it).
                    raise _Restart() from None
                if self._queued:
                    progress = time.monotonic()  # the writer is behind, not the log
                elif (self.log_last or 0) > self.applied and time.monotonic() - progress > STALL_AFTER:
                    events.event("estate_log_stalled", "warning", applied=self.applied,
                                 log_last=self.log_last)
                    raise _Restart() from None
                continue
            batch = [first]
            while len(batch) < BATCH_MAX and self._sub.pending_msgs > 0:
                batch.append(await self._sub.next_msg(timeout=STALL_CHECK))
            entries, gap = await self._in_order(batch, fresh)
            fresh = False
            while time.monotonic() < self._lag_until and not self.stopping:
                await asyncio.sleep(0.1)  # a fault holds the copy back (debug.faults kind lag)
            if entries:
                await self._hand_over(entries)
                progress = time.monotonic()
            if gap:
                raise _Restart()

    async def _in_order(self, batch: list, fresh: bool) -> tuple[list[tuple[int, bytes, str]], bool]:
        """The entries of *batch* that follow what was handed to the writer
        without a gap, each ``(seq, data, subject)``, and whether a gap was
        found (the rest of the batch is then dropped)."""
        entries: list[tuple[int, bytes, str]] = []
        expected = self._handed + 1
        for msg in batch:
            seq = stream_seq(msg)
            if seq < expected:
                continue  # already applied (a reset subscription starting early)
            if seq > expected:
                if fresh and not entries:
                    # The broker skipped to the next entry it has: a hole, or
                    # the log no longer holds what this copy lacks.
                    first, last = await estate_log.bounds(self.js)
                    self._bounds(first, last, self.applied)
                    if "log" in self._out:
                        return [], True
                else:
                    events.event("estate_log_gap", "warning", expected=expected, got=seq)
                    return entries, True
            entries.append((seq, msg.data, msg.subject))
            expected = seq + 1
        return entries, False

    async def _hand_over(self, entries: list[tuple[int, bytes, str]]) -> None:
        """Hand *entries* (in order, next after what was handed before) to the
        writer thread, with the verdicts on the tokens among them that would
        raise a seat's fence, read (or judged) first: the same for every copy
        (grants.py). Unanswered, this raises, and the log is followed again
        from applied + 1."""
        self._check_space()
        if "disk" in self._out:
            raise _NoSpace()
        # Against the committed fences: entries handed over and not yet
        # committed only raise them, so this asks for a superset.
        fences = apply.raising(self.store, entries)
        if fences and self._grants is None:
            self._grants = await grants.open_bucket(self.js, self.replicas)
        verdicts = await grants.verdicts(self.js, self._grants, fences)
        while self._queued >= QUEUED_MAX and not self.stopping:
            self._room.clear()
            self._raise_write_error()
            await wait_event(self._room, STALL_CHECK)
        self._raise_write_error()
        if len(entries) <= INLINE_MAX and not self._draining and not self._jobs:
            self._handed = entries[-1][0]
            self._commit_here(entries, verdicts)
            return
        with self._queue_lock:
            self._queue.append((entries, verdicts))
            self._queued += len(entries)
            start = not self._draining
            self._draining = True
        self._handed = entries[-1][0]
        if start:
            self._writer.submit(self._drain)

    def _commit_here(self, entries: list[tuple[int, bytes, str]], verdicts: apply.Grants) -> None:
        """Apply and commit a short run on the loop (:data:`INLINE_MAX`), the
        writer thread idle. A commit that changed a page has the index catch
        up on the thread (SQLite may take a while over a long page), and is
        told once that is done; runs handed over meanwhile queue behind it."""
        try:
            outcomes = apply.apply_batch(self.store, entries, grants=verdicts)
            applied = self.store.applied()
        except BaseException as exc:
            self._write_error = exc
            self._write_failed(exc)
            self._raise_write_error()  # raises: the write error, as the loop's own commits do
        if last_page_change(self.store) > self._indexed_to:
            with self._queue_lock:
                self._draining = True
            self._writer.submit(self._index_then_drain, outcomes, applied)
            return
        self._committed(outcomes, applied)

    def _index_then_drain(self, outcomes: list[tuple[str | None, dict[str, Any]]], applied: int) -> None:
        """On the writer thread: the index catches up with a commit made on the
        loop, the commit is told, then whatever queued behind it is committed."""
        self._catch_up_index()
        self._loop.call_soon_threadsafe(self._committed, outcomes, applied)
        self._drain()

    def _raise_write_error(self) -> None:
        """The writer's failure, raised in the log loop (which follows the log
        again from applied + 1): ``_NoSpace`` for want of room, else as it was."""
        exc = self._write_error
        if exc is None:
            return
        if isinstance(exc, lmdb.Error) and "write" in self._out:
            raise _NoSpace() from exc
        raise exc

    async def _writer_settled(self) -> None:
        """Wait until the writer has committed (or dropped) what was handed to
        it, then forget its failure: a new follow starts from applied + 1."""
        while True:
            await self.write(_nothing)
            with self._queue_lock:
                if not self._draining:
                    self._write_error = None
                    self._queue.clear()
                    self._queued = 0
                    return

    # ------------------------------------------------------------ the writer thread

    def _drain(self) -> None:
        """On the writer thread: commit what the log loop handed over, one
        transaction after another, each taking every entry that waits — those
        that arrived during the last commit join the next without a trip back
        to the event loop (group commit: one fsync for all of them). Each
        commit is told to the loop at once (:meth:`_committed`): that is when
        its writes are answered."""
        began = time.monotonic()
        while True:
            with self._queue_lock:
                if not self._queue or self._closing or self._write_error is not None:
                    self._draining = False
                    return
                if time.monotonic() - began > DRAIN_FOR:
                    # The thread's other writes (custody) queued meanwhile go first.
                    self._writer.submit(self._drain)
                    return
                entries, verdicts = self._take()
            try:
                outcomes = apply.apply_batch(self.store, entries, grants=verdicts)
                applied = self.store.applied()
                if last_page_change(self.store) > self._indexed_to:
                    # Before the commit is told: a search carrying a page
                    # write's seq as its floor finds the page.
                    self._catch_up_index()
            except BaseException as exc:
                with self._queue_lock:
                    # Nothing of this transaction was committed; what waits is
                    # in the log, applied again from applied + 1.
                    self._write_error = exc
                    self._queue.clear()
                    self._queued = 0
                    self._draining = False
                self._loop.call_soon_threadsafe(self._write_failed, exc)
                return
            self._loop.call_soon_threadsafe(self._committed, outcomes, applied)

    def _take(self) -> tuple[list[tuple[int, bytes, str]], apply.Grants]:
        """The runs waiting, up to :data:`BATCH_MAX` entries (at least one run),
        and their verdicts together. Under the queue's lock."""
        entries: list[tuple[int, bytes, str]] = []
        verdicts: apply.Grants = {}
        while self._queue and (not entries or len(entries) + len(self._queue[0][0]) <= BATCH_MAX):
            run, judged = self._queue.popleft()
            entries += run
            verdicts.update(judged)
        self._queued -= len(entries)
        return entries, verdicts

    # ------------------------------------------------------------ back on the loop

    def _committed(self, outcomes: list[tuple[str | None, dict[str, Any]]], applied: int) -> None:
        """A commit of the writer's, on the loop: the copy has applied up to
        *applied*; the writes waiting for these outcomes are answered, the
        reads waiting for this floor run."""
        self.commits += 1
        self.set_out("write", None)
        self.stats["ops"] += len(outcomes)
        # Entries passed over for their origin (apply logged each).
        self.stats["refused"] += sum(1 for op_id, o in outcomes
                                     if op_id is None and o.get("code") == apply.WRONG_ORIGIN)
        self.applied = max(self.applied, applied)
        if "reapplying" in self._out and self.applied >= self._reapplying_to:
            self.set_out("reapplying", None)
        # The log holds at least what was applied from it (its bounds are
        # read every few seconds; "applied 34 of log 30" would read wrong).
        self.log_last = max(self.log_last or 0, self.applied)
        if self.on_commit is not None:
            self.on_commit()
        else:
            self.changed.set()
        self._resolve(outcomes)
        self._wake()
        self._room.set()
        changed = sorted({name for _, o in outcomes if o.get("ok")
                          for name in (o.get("result") or {}).get(estate_skills.CHANGED, ())})
        if changed:
            task = asyncio.create_task(self._tell_skills(changed, self.applied))
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)

    def _write_failed(self, exc: BaseException) -> None:
        """The writer's transaction failed (on the loop): out of service at
        once if it was for want of space; the log loop follows the log again."""
        if isinstance(exc, lmdb.Error):
            why = write_failed(self.copy_path, exc, self.space)
            if why is not None:
                self.set_out("write", why)
        self._room.set()

    async def _tell_skills(self, changed: list[str], applied: int) -> None:
        """Broadcast the skills a commit changed (crewlet.skills.registry):
        every node's registry reads them again. Every copy that applies the
        change says so — a node hears it from whichever copy is first, and
        reads it again once per copy at most."""
        try:
            await self.nc.publish(skills_registry.CHANGED_SUBJECT,
                                  json.dumps({"names": changed, "seq": applied}).encode())
        except Exception as exc:  # the walks make it good: a missed broadcast is late, not lost
            events.event("skills_broadcast_failed", "warning", error=f"{type(exc).__name__}: {exc}")

    def _resolve(self, outcomes: list[tuple[str | None, dict[str, Any]]]) -> None:
        if not self._outcomes:
            return
        for op_id, outcome in outcomes:
            for fut in self._outcomes.pop(op_id, ()) if op_id is not None else ():
                if not fut.done():
                    fut.set_result({k: v for k, v in outcome.items() if k != "duplicate"})

    def _catch_up_index(self) -> None:
        try:
            # In slices: a first catch-up over a big copy (an index rebuilt)
            # must not hold every page's body in memory at once.
            done = -1
            while (reached := self.index.catch_up(self.store, limit=INDEX_SLICE)) != done:
                done = reached
            self._indexed_to = done
        except Exception as exc:
            # The index is derived: searches answer from what it has, and the
            # next commit tries again.
            self._indexed_to = -1
            events.event("estate_index_failed", "error", error=f"{type(exc).__name__}: {exc}")

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:
                pass  # the connection's trouble; the consumer is ephemeral anyway

    def _bounds(self, first: int, last: int, applied: int) -> None:
        """Take the log's bounds, and whether the copy still fits the log.

        *applied* must be read before the bounds were asked for (it only
        grows, as the log's bounds do): then a copy ahead of *last* really is.
        """
        self.log_first, self.log_last = first, last
        self._log_missing = False
        if self.applied + 1 < first:
            self.set_out("log", rows_below(self.applied, first))
        elif applied > last:
            self.set_out("log", ahead_of_log(applied, last))
        else:
            self.set_out("log", None)

    async def _check_log_identity(self, info) -> None:
        """The copy follows one log: the stream it was applied from, known by
        its creation time (kept in the node-local ``local`` table). A log made
        anew under a copy that holds rows is not that log, even once it has
        grown past the copy's applied seq."""
        if info.created is None:
            return
        created = info.created.isoformat()
        kept = await self.write(_follows, self.store, created, self.applied == 0)
        self.set_out("anew", log_made_anew(self.applied, kept, created) if kept != created else None)

    async def _check_rules(self) -> None:
        """A copy applied under other rules than this version's
        (:data:`crewlet.estate.apply.RULES`) may hold rows a copy made now
        would not: it is emptied and applied again from the log's first op,
        out of service until it is back where it was. A log that no longer
        starts at 1 cannot redo it: out of service, to be rebuilt."""
        kept = await self.write(store.rules, self.store)
        if kept == apply.RULES:
            return
        if kept is not None and kept > apply.RULES:
            # Emptied by an older version, its rows would come back as that
            # version reads the log: a newer one's ops refused as unknown.
            self.set_out("rules", rules_newer(kept))
            self.set_out("reapplying", None)
            return
        if self.applied == 0:
            await self.write(store.record_rules, self.store, apply.RULES)
            return
        if (self.log_first or 0) > 1:
            self.set_out("rules", rules_changed(kept, self.log_first))
            self.set_out("reapplying", None)
            return
        was = self.applied
        events.event("estate_copy_reapplying", "warning", applied=was, rules=kept or 1,
                     now=apply.RULES)
        self._reapplying_to = was
        self.set_out("reapplying", f"applying the log again under rules {apply.RULES} "
                                   f"(the copy was at {was} under rules {kept or 1})")
        try:
            await self.write(self._reset_copy)
        except store.MigrationBusy as exc:
            # Out of service until the other process is gone (_follow comes back here).
            self.set_out("rules", str(exc))
            return
        self.set_out("rules", None)
        self.applied = await self.write(self.store.applied)  # 0, unless another process migrated it

    def _reset_copy(self) -> None:
        with store.migration_lock(self.store):
            if store.rules(self.store) == apply.RULES:
                return  # migrated meanwhile, by the process that held the lock
            store.reset(self.store, apply.RULES)
        self._catch_up_index()  # the copy is behind the index now: the index starts over

    # ------------------------------------------------------------ waiting

    async def wait_applied(self, seq: int, until: float) -> bool:
        """Whether this copy applied *seq* by wall-clock time *until*."""
        if self.applied >= seq:
            return True
        left = until - time.time()
        if left <= 0 or "stopped" in self._out:
            return False
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._tick), fut))
        try:
            async with asyncio.timeout(left):
                await fut
        except TimeoutError:
            if len(self._waiters) > WAITERS_PRUNED_AT:
                # Floors the log never reached: drop the waits that ended.
                self._waiters = [w for w in self._waiters if not w[2].done()]
                heapq.heapify(self._waiters)
        return self.applied >= seq

    def _wake(self, all_: bool = False) -> None:
        while self._waiters and (all_ or self._waiters[0][0] <= self.applied):
            fut = heapq.heappop(self._waiters)[2]
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------ requests

    async def handle(self, request: Any, *, origin: str,
                     asker: str | None = None) -> dict[str, Any] | None:
        """The answer to one request (:mod:`crewlet.estate.wire`); None: dropped
        unrun, its deadline had passed.

        *origin* is who asks (:mod:`crewlet.estate.origins`; the subject it
        came on names it) and *asker* the node it asks from: a write whose op
        does not fit them is ``bad_request``, nothing published. No default:
        whoever hands a request in says who sent it, and the operator (every
        right) is said, never assumed."""
        self.stats["requests"] += 1
        if not isinstance(request, dict):
            return self._bad(f"a request is a map, got {type(request).__name__}")
        deadline = request.get("deadline")
        if deadline is not None and not _is_number(deadline):
            return self._bad(f"deadline must be wall-clock seconds, got {deadline!r}")
        if deadline is not None and time.time() >= deadline:
            self.stats["dropped"] += 1
            return None
        kind = request.get("kind")
        floor = request.get("floor", 0)
        if not isinstance(floor, int) or isinstance(floor, bool) or floor < 0:
            return self._bad(f"floor must be a sequence (an integer >= 0), got {floor!r}")
        default = wire.WRITE_WAIT if kind == wire.WRITE else wire.READ_WAIT
        wait = request.get("wait", default)
        if not _is_number(wait) or wait < 0:
            return self._bad(f"wait must be seconds >= 0, got {wait!r}")
        until = time.time() + wait
        if deadline is not None:
            until = min(until, deadline)
        try:
            if kind == wire.WRITE:
                op = Op.from_dict(request.get("op"))
                why = origins.request_refusal(origin, asker, op)
                if why is not None:
                    self.stats["asks_refused"] += 1
                    events.event("estate_request_refused", "warning", origin=origin, asker=asker,
                                 kind=op.kind, op=op.id, why=why)
                    return self._bad(f"refused: {why}")
                return await self._write(op, until)
            if kind == wire.READ:
                query, args = request.get("query"), request.get("args")
                args = {} if args is None else args
                check_query(query, args)
                return await self._read(query, args, floor, until,
                                        shards=request.get("shards"))
        except OpError as exc:
            return self._bad(str(exc))
        return self._bad(f"unknown request kind {kind!r}: {wire.WRITE} or {wire.READ}")

    def _bad(self, reason: str) -> dict[str, Any]:
        return wire.answer(wire.BAD_REQUEST, self.node, reason=reason)

    def _out_of_service(self) -> dict[str, Any]:
        return wire.answer(wire.OUT_OF_SERVICE, self.node, reason=self.reason)

    def _ok(self, answer: Any, **fields: Any) -> dict[str, Any]:
        return wire.answer(wire.OK, self.node, applied=self.applied, answer=answer, **fields)

    async def _write(self, op: Op, until: float) -> dict[str, Any]:
        if not self.in_service:
            return self._out_of_service()
        first = self.reader.outcome(op.id, op.token)
        if first is not None:
            return self._ok(first, seq=first.get("seq"))
        # Listen for the outcome before publishing: the op may be applied
        # before the publish's acknowledgement is read.
        told = self._loop.create_future()
        self._outcomes.setdefault(op.id, []).append(told)
        try:
            seq, why = await self._publish(op, until)
            if seq is None:
                return wire.answer(wire.UNVOUCHED, self.node, reason=why)
            if self.applied < seq:
                # Answered as soon as the commit that applied it is told to
                # the loop: durable in this copy, and a read carrying this
                # seq as its floor (here or from LMDB) finds it.
                try:
                    async with asyncio.timeout(max(0.0, until - time.time())):
                        outcome = await told
                    return self._ok(outcome, seq=outcome.get("seq", seq))
                except TimeoutError:
                    pass
        finally:
            waiting = self._outcomes.get(op.id)
            if waiting is not None and told in waiting:
                waiting.remove(told)
                if not waiting:
                    del self._outcomes[op.id]
        if not await self.wait_applied(seq, until):
            why = (f"the op is in the log at {seq}; this copy applied {self.applied} within the wait"
                   if self.in_service else f"the op is in the log at {seq}; this copy went out "
                                           f"of service: {self.reason}")
            return wire.answer(wire.UNVOUCHED, self.node, reason=why, seq=seq)
        outcome = self.reader.outcome(op.id, op.token)
        if outcome is None:
            return wire.answer(wire.UNVOUCHED, self.node, seq=seq,
                               reason=f"applied past {seq} but no outcome is kept for op {op.id}")
        return self._ok(outcome, seq=outcome.get("seq", seq))

    async def _publish(self, op: Op, until: float) -> tuple[int | None, str]:
        """Publish *op* by its kind's rule: ``(seq, "")``, or ``(None, why)``."""
        pause = PUBLISH_PAUSE
        why = "the wait ended before the op could be published"
        while (left := until - time.time()) > 0:
            timeout = left if op.retry == "once" else min(PUBLISH_TIMEOUT, left)
            try:
                # The appliers' own subject: every copy reads it, whatever its version.
                seq, _ = await estate_log.publish(self.js, op, timeout=timeout,
                                                  subject=estate_log.SUBJECT)
                return seq, ""
            except NoStreamResponseError:
                # Nobody listened: nothing was stored, so even a once-op may go again.
                why = "the log did not answer (no stream listening): not published"
            except nats.errors.TimeoutError:
                why = f"the log did not acknowledge the op within {timeout:.3g}s: it may be in it"
                if op.retry == "once":
                    return None, why
            except APIError as exc:
                why = f"the log refused the op: {exc}"
                if op.retry == "once":
                    return None, why
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError) as exc:
                return None, f"no connection to the log: {type(exc).__name__}"
            except nats.errors.MaxPayloadError as exc:
                return None, f"the op is too large for the log: {exc}"
            await asyncio.sleep(min(pause, max(0.0, until - time.time())))
            pause = min(pause * 2, 1.0)
        return None, why

    async def _read(self, query: str, args: dict[str, Any], floor: int,
                    until: float, shards: Any = None) -> dict[str, Any]:
        if shards is not None:
            # A search of shards [lo, hi) only (the router split it between nodes).
            if query != "page.search":
                return self._bad(f"shards is for page.search only, not {query}")
            try:
                shards = check_shards(shards)
            except ValueError as exc:
                return self._bad(str(exc))
        if not self.in_service:
            return self._out_of_service()
        if not await self.wait_applied(floor, until):
            if not self.in_service:
                return self._out_of_service()
            return wire.answer(wire.BEHIND, self.node, applied=self.applied, floor=floor)
        if query == "page.search":
            if not await wait_event(self._index_ready, until - time.time()):
                return wire.answer(wire.BEHIND, self.node, applied=self.applied, floor=floor)
            if floor and await asyncio.to_thread(self.index.reflects, self.store) < floor:
                # Applied, but the index failed to catch up (it is retried on
                # the next commit): the caller's own page may be missing here.
                return wire.answer(wire.BEHIND, self.node, applied=self.applied, floor=floor,
                                   reason="the search index is behind the copy")
            try:
                hits, docs = await asyncio.to_thread(self._search, args["query"],
                                                     args.get("limit", SEARCH_DEFAULT), shards)
            except ValueError as exc:
                return self._bad(str(exc))
            except SearchUnavailable as exc:
                return wire.answer(wire.OUT_OF_SERVICE, self.node,
                                   reason=f"the search index cannot be read: {exc}")
            return self._ok({"hits": hits, "docs": docs,
                             "shards": list(shards or (0, wire.SEARCH_SHARDS))})
        return self._ok(self.reader.query(query, args))

    def _search(self, query: str, limit: int,
                shards: tuple[int, int] | None) -> tuple[list[dict[str, Any]], int]:
        """A search's hits (of *shards* only, if given) and the pages indexed (a worker thread)."""
        return self.index.search(query, limit, shards), self.index.count()

    # ------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        return {"node": self.node, "applied": self.applied, "in_service": self.in_service,
                "reason": self.reason, "log_first": self.log_first, "log_last": self.log_last,
                "at": time.time(),
                # Since this applier started: the ingresses' retention metric reads it.
                "events_pruned": self.custody.stats["pruned"] if self.custody is not None else 0}

    async def write_status(self) -> None:
        """One ``estate.<node>`` record in ``status`` (a plain publish: the
        form every node's writes are answered in, DESIGN §4)."""
        subject = bus.kv_subject(self.js, buckets.STATUS.name) + f"estate.{self.node}"
        try:
            await self.js.publish(subject, json.dumps(self.status()).encode(),
                                  timeout=PUBLISH_TIMEOUT)
        except Exception as exc:
            if not self._status_failing:  # said once, not every 2 s while the broker is away
                # Before any write landed, the node is still joining: crewletd
                # makes the status bucket as it joins, a moment after this
                # role starts. After, the bucket (or the broker) went away.
                waiting = not self._status_written
                events.event("estate_status_waiting" if waiting else "estate_status_write_failed",
                             "info" if waiting else "warning", error=f"{type(exc).__name__}: {exc}")
            self._status_failing = True
            return
        if self._status_failing:
            events.event("estate_status_written")
        self._status_failing, self._status_written = False, True

    def _check_space(self) -> None:
        """Out of service while the node's disk is below its floor, back once it is not."""
        low = self.space.low() if self.space is not None else None
        self.set_out("disk", low.reason() if low is not None else None)

    async def _status_loop(self) -> None:
        while not self.stopping:
            self._check_space()
            await self._refresh_bounds()
            await self.write_status()
            self._service_changed.clear()
            await wait_event(self._service_changed, STATUS_EVERY)

    async def _refresh_bounds(self) -> None:
        applied = self.applied
        try:
            first, last = await estate_log.bounds(self.js)
        except NotFoundError:
            # Deleted under us, if it was here; at a first start the log loop
            # makes it a moment later.
            events.event("estate_log_missing", "warning" if self.log_last is not None else "info",
                         stream=estate_log.STREAM)
            self._log_missing = True
            return
        except Exception:
            return  # unanswered: the log loop says what is wrong with the log
        self._bounds(first, last, applied)

    def rate(self) -> float:
        """Ops applied per second since the last call."""
        now = time.monotonic()
        then, ops = self._rate
        if now - then > 0:
            self.ops_per_s = (self.stats["ops"] - ops) / (now - then)
        self._rate = (now, self.stats["ops"])
        return self.ops_per_s

    # ------------------------------------------------------------ eviction

    async def _eviction_loop(self) -> None:
        """Follow ``status`` key ``evicted.<node>``: present, this copy is out of service."""
        listed_it = False  # the key was in the current watch's listing

        def opened() -> None:
            nonlocal listed_it
            listed_it = False

        def seen(entry) -> None:
            nonlocal listed_it
            listed_it = True
            self.set_out("evicted", _eviction(entry))

        def listed() -> None:
            if not listed_it:  # removed while no watch was open
                self.set_out("evicted", None)

        await buckets.follow(lambda: buckets.ensure(self.js, buckets.STATUS, self.replicas),
                             f"evicted.{self.node}", seen, opened=opened, listed=listed,
                             name="eviction", stopping=lambda: self.stopping)


def _nothing() -> None:
    """A job for the writer thread that does nothing: done, what was queued before it is."""


def _say_if_failed(task: asyncio.Task) -> None:
    """A loop of the applier ended on its own (its loops retry whatever fails,
    so this is a refusal, such as custody's on a node without data, or a bug)."""
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        events.event("applier_task_failed", "error", task=task.get_name(),
                     error=f"{type(exc).__name__}: {exc}")


def stream_seq(msg) -> int:
    """A delivered entry's log seq, read off its ack subject (nats-py's
    ``msg.metadata`` parses the timestamp too, a third of the per-entry cost
    of following the log; the seq is all the loop needs)."""
    meta = ack_meta(msg.reply)
    return meta.stream_seq if meta is not None else msg.metadata.sequence.stream


async def cancel_all(tasks: Iterable[asyncio.Task], rounds: int = 5) -> None:
    """Cancel *tasks* and wait for them to end, cancelling again any that
    swallowed the cancel (Python 3.11's wait_for can, mid-request)."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(rounds):
        if not pending:
            return
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
    for task in pending:
        events.event("task_would_not_stop", "error", task=task.get_name())


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Whether *event* was set within *timeout*. (Not ``asyncio.wait_for``:
    in Python 3.11 it swallows a cancel that arrives as the event is set.)"""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False


def _eviction(entry) -> str | None:
    """The out-of-service reason an ``evicted.<node>`` entry gives (None: not evicted)."""
    if entry.operation is not None or not entry.value:
        return None
    try:
        why = json.loads(entry.value).get("reason")
    except (ValueError, AttributeError):
        why = None
    return f"node evicted: {why or 'no reason given'}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
