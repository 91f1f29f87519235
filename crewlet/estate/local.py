"""This node's own copy, as its other roles reach it (seats, crewletd).

On a data node the router asks this copy first (reference, "How a request
reaches the estate"). :class:`LocalCopy` answers in the asking role's own
process:

* **reads** straight from the node's LMDB environment (opened read-only:
  LMDB allows many reader processes beside its one writer, the applier) and
  ``page.search`` from the applier's search index (read-only, in a worker
  thread: a search over a large corpus must not hold the role's loop);
* **writes** as a request to the applier over the node's ZeroMQ ``estate``
  endpoint (a DEALER to its ROUTER), which publishes them to the log — or,
  for a write the router publishes itself (its "Straight to the log"), the
  outcome this copy keeps once it has applied the op (:meth:`reach`,
  :meth:`outcome`);
* whether the copy is **in service**, from the applier's ``applied`` PUB: it
  is iff a message saying ``in_service`` was heard in the last
  :data:`LOCAL_STALE` seconds (the applier publishes after every commit and
  every second). Silence means the applier is not running: "applier stopped".
  Before the clock alone says so, what already waits on the socket is read:
  this process's own loop may have been too busy to read it.

:meth:`LocalCopy.ask` takes a request of the wire's shape
(:mod:`crewlet.estate.wire`) and answers the wire's answers — ``ok``,
``behind``, ``out_of_service``, ``unvouched`` (from the applier),
``bad_request`` — so the router treats this copy and a peer's alike. A read
waits for the copy to reach the request's floor: woken by the ``applied``
messages, and re-reading LMDB's own ``applied`` (which is the truth; a PUB
message may be lost) at least every :data:`FLOOR_POLL` seconds. A search
waits for the index to reflect the floor
(:meth:`crewlet.estate.search.SearchIndex.reflects`), since it is the index
that answers; the applier publishes ``applied`` for a commit that changed
pages only once the index has caught up with it.

The search index is a file the applier may replace: it drops and rebuilds
one SQLite cannot read (:mod:`crewlet.estate.search`). A reader holding the
old file open would go on reading the deleted inode, so before each use the
path is stat'ed, and the index opened again when its inode changed.

A write nobody answered within the wait raises :class:`TimeoutError`: the
caller (the router) decides what that means for the op. So does a write whose
applier went silent while it waited (:class:`ApplierSilent`, a TimeoutError):
the copy is out of service from then on, as :meth:`LocalCopy.reason` says, and
a stopped applier answers nothing, so the write is not waited on for the rest
of its wait (a minute) — the router asks a peer under the same op id. A read
waiting for its floor likewise ends as soon as the copy is out of service.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any

import zmq
import zmq.asyncio

from crewlet import ipc, log
from crewlet.estate import store as estate_store
from crewlet.estate import wire
from crewlet.estate.ops import SEARCH_DEFAULT, OpError, check_query
from crewlet.estate.search import SearchIndex, SearchUnavailable, check_shards, index_path
from crewlet.estate.view import STOPPED

# In service iff the applier said so within this many seconds. It publishes
# every second, and its loop may stall for up to the watchdog's wedge_after
# (2 s by default) without being wedged: 1 + 2 s of silence is a busy
# applier, not a stopped one. (At 3 s a busy CI machine saw a live copy
# called stopped, and /readyz answered 503.)
LOCAL_STALE = 5.0
# A read waiting for its floor re-reads LMDB's applied at least this often,
# in case an ``applied`` message was lost (a SUB may miss any message).
FLOOR_POLL = 0.1
# Seconds between reads of the applier's messages while no request of this
# process waits on them: the applier publishes after every commit (tens a
# second on a busy node), and every process of the node that keeps a LocalCopy
# woke for each; now it reads them together (the newest is what counts).
HEAR_EVERY = 1.0
# (Waits here use asyncio.timeout, not wait_for: Python 3.11's wait_for loses
# a cancellation that arrives just as the awaited thing completes.)
# A write's reply may come this long after the wait the applier was given
# (its answer travels, and it notices the wait's end a moment late).
REPLY_MARGIN = 1.0

APPLIED_TOPIC = wire.APPLIED_TOPIC


class ApplierSilent(TimeoutError):
    """The applier went silent (stopped, as :meth:`LocalCopy.reason` judges
    silence) while a write waited for its answer: it may have the request,
    and may run it when it goes on."""


class LocalCopy:
    """This node's copy, from one of its role processes. One per process.

    Call :meth:`start` inside the role's loop before asking, :meth:`close`
    when done.
    """

    def __init__(self, zctx: zmq.asyncio.Context, *, node_id: str, run_dir: str, data_dir: str,
                 stale: float = LOCAL_STALE):
        self.zctx = zctx
        self.node_id = node_id
        self.run_dir = run_dir
        self.data_dir = data_dir
        self.stale = stale
        self._heard: dict[str, Any] | None = None   # the last applied message
        self._heard_at: float | None = None         # monotonic time it came
        self._made_at = time.monotonic()            # a copy not heard yet is not stopped before `stale`
        self._tick = asyncio.Event()                # set (and replaced) on each message
        self._waiting = 0                           # waits that want each message as it comes
        self._wanted = asyncio.Event()              # set while _waiting
        self._pending: dict[str, asyncio.Future] = {}
        self._sub: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task] = []
        self._store: estate_store.Store | None = None
        self._reader: estate_store.Reader | None = None
        self._store_ino: int | None = None          # the inode of the copy open
        self._index = None
        self._index_ino: int | None = None          # the inode the index was opened at

    # ---------------------------------------------------------- lifecycle

    def start(self) -> "LocalCopy":
        if self._tasks:
            return self
        self._sub = self.zctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 100_000)  # a second of messages waits unread
        self._sub.setsockopt(zmq.SUBSCRIBE, APPLIED_TOPIC)
        self._sub.connect(ipc.endpoint(self.run_dir, "applied"))
        self._dealer = self.zctx.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.connect(ipc.endpoint(self.run_dir, "estate"))
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._replies())]
        return self

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        self._pending.clear()
        for sock in (self._sub, self._dealer):
            if sock is not None:
                sock.close()
        self._sub = self._dealer = None
        if self._index is not None:
            self._index.close()
            self._index = None
        self._index_ino = None

    async def _listen(self) -> None:
        """Follow the applier's ``applied`` messages: each as it comes while a
        wait wants them, else those waiting every HEAR_EVERY s."""
        assert self._sub is not None
        while True:
            if self._waiting:
                self._hear(await self._sub.recv_multipart())
                continue
            self._hear_waiting()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEAR_EVERY):
                    await self._wanted.wait()

    @contextlib.contextmanager
    def _wanting(self):
        """While in it, each ``applied`` message is heard as it comes."""
        self._waiting += 1
        self._wanted.set()
        self._hear_waiting()
        try:
            yield
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._wanted.clear()

    def _hear(self, frames: list[bytes]) -> None:
        try:
            body = frames[-1]
            if len(frames) == 1:  # one frame: the topic is its prefix
                body = body[len(APPLIED_TOPIC):]
            message = ipc.unpack(body)
        except Exception:
            return
        if not isinstance(message, dict):
            return
        self._heard, self._heard_at = message, time.monotonic()
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    def _hear_waiting(self) -> None:
        """Read the messages already on the socket, without waiting: after a
        stall of this process's loop, the applier's last messages may be
        there unread while the clock says they never came."""
        while self._sub is not None:
            # A non-blocking recv of zmq.asyncio answers at once, in a done future.
            got = self._sub.recv_multipart(zmq.NOBLOCK)
            if got.exception() is not None:
                return  # zmq.Again: nothing more waits
            self._hear(got.result())

    async def _replies(self) -> None:
        """Hand each of the applier's replies to the request that carries its id."""
        assert self._dealer is not None
        while True:
            frames = await self._dealer.recv_multipart()
            try:
                reply = ipc.unpack(frames[-1])
            except Exception:
                continue
            fut = self._pending.pop(reply.get("id"), None) if isinstance(reply, dict) else None
            if fut is not None and not fut.done():
                fut.set_result(reply)

    # ------------------------------------------------------------- state

    def in_service(self) -> bool:
        return self.reason() is None

    def reason(self) -> str | None:
        """Why this copy is out of service; None when it is in service. The
        messages waiting unread are read first (they are read together, not
        as they come: _listen): the newest is what counts."""
        self._hear_waiting()
        if self._is_stale():
            return STOPPED
        if not self._heard.get("in_service"):
            return self._heard.get("reason") or "out of service"
        return None

    def _is_stale(self) -> bool:
        return self._heard is None or self._heard_at is None \
            or time.monotonic() - self._heard_at > self.stale

    def applied(self) -> int:
        """The copy's applied seq, read from LMDB (StoreUnavailable: no copy)."""
        return self._open().applied()

    def _open(self) -> estate_store.Store:
        """The copy, read-only; opened again when the file at its path is not
        the one open (a new copy put in place from a snapshot)."""
        path = estate_store.copy_path(self.data_dir)
        try:
            ino: int | None = os.stat(os.path.join(path, "data.mdb")).st_ino
        except FileNotFoundError:
            ino = None
        if self._store is not None and ino != self._store_ino:
            estate_store.close_env(self._store)
            self._store = self._reader = None
        if self._store is None:
            self._store = estate_store.open_env(path, readonly=True)
            self._reader = estate_store.Reader(self._store)
            self._store_ino = ino
        return self._store

    def _search_index(self):
        """The applier's search index, read-only; opened again when the file
        at its path is not the one open (the applier rebuilt it). Raises
        SearchUnavailable when there is none to read."""
        path = index_path(self.data_dir)
        try:
            # Before opening: a file replaced in between is then seen next time.
            ino: int | None = os.stat(path).st_ino
        except FileNotFoundError:
            ino = None
        if self._index is not None and ino != self._index_ino:
            # Rare (a rebuild); closing waits for a search running in a worker thread.
            self._index.close()
            self._index = None
        if self._index is None:
            self._index = SearchIndex(path, readonly=True)
            self._index_ino = ino
        return self._index

    # --------------------------------------------------------------- ask

    async def ask(self, request: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Answer *request* (the wire's shape) from this copy.

        Writes go to the applier and their answer is its answer; *timeout*
        bounds the wait for it (default: the request's wait, capped by its
        deadline, plus :data:`REPLY_MARGIN`), after which
        :class:`TimeoutError` is raised.
        """
        await self.first_word()
        why = self.reason()
        if why is not None:
            return self._answer(wire.OUT_OF_SERVICE, reason=why)
        kind = request.get("kind")
        if kind == wire.READ:
            return await self._read(request)
        if kind == wire.WRITE:
            return await self._write(request, timeout)
        return self._answer(wire.BAD_REQUEST, reason=f"unknown request kind {kind!r}")

    async def first_word(self) -> None:
        """Call before judging the copy by :meth:`reason` for a request. A
        subscription made a moment ago misses what the applier published
        before it joined (ZeroMQ's slow joiner), so a request in this
        process's first seconds waits for the applier's next message (it
        publishes every second) rather than take the silence for "applier
        stopped" — at most until ``stale`` after the copy was made, when
        silence means what it says. At once once anything was heard."""
        left = self._made_at + self.stale - time.monotonic()
        if self._heard is None and left > 0:
            with contextlib.suppress(TimeoutError), self._wanting():
                async with asyncio.timeout(left):
                    while self._heard is None:
                        await self._tick.wait()

    def _answer(self, status: str, **fields: Any) -> dict[str, Any]:
        return wire.answer(status, self.node_id, **fields)

    def _until(self, request: dict[str, Any]) -> float:
        """The monotonic time a request's wait ends: its wait, capped by its deadline."""
        now = time.monotonic()
        until = now + float(request.get("wait") or 0)
        deadline = request.get("deadline")
        if deadline is not None:
            until = min(until, now + (float(deadline) - time.time()))
        return until

    async def _read(self, request: dict[str, Any]) -> dict[str, Any]:
        query, args = request.get("query"), request.get("args") or {}
        try:
            check_query(query, args)
        except OpError as exc:
            return self._answer(wire.BAD_REQUEST, reason=str(exc))
        try:
            self._open()
        except estate_store.StoreUnavailable as exc:
            return self._answer(wire.OUT_OF_SERVICE, reason=f"no copy here: {exc}")
        floor = int(request.get("floor") or 0)
        search = query == "page.search"
        shards = request.get("shards")
        if shards is not None:
            # A search of shards [lo, hi) only (the router split it between nodes).
            try:
                if not search:
                    raise ValueError(f"shards is for page.search only, not {query}")
                shards = check_shards(shards)
            except ValueError as exc:
                return self._answer(wire.BAD_REQUEST, reason=str(exc))
        if search:

            def reached() -> int:  # through _search_index each time: the file may be rebuilt
                # Not indexed(): the applier catches up only after commits that
                # changed pages, so the index is current beyond its mark.
                return self._search_index().reflects(self._open())
            try:
                reached()
            except SearchUnavailable as exc:
                return self._answer(wire.OUT_OF_SERVICE, reason=f"search index: {exc}")
        else:
            reached = self.applied
        try:
            if not await self._reach(floor, reached, self._until(request)):
                why = self.reason()
                if why is not None:  # it stopped meanwhile: not behind, out of service
                    return self._answer(wire.OUT_OF_SERVICE, reason=why)
                # For a search, what is behind is the index: say how far it is.
                return self._answer(wire.BEHIND, applied=reached(), floor=floor)
            if search:
                index = self._search_index()
                hits, docs = await asyncio.to_thread(
                    lambda: (index.search(args["query"], args.get("limit", SEARCH_DEFAULT), shards),
                             index.count()))
                answer: Any = {"hits": hits, "docs": docs,
                               "shards": list(shards or (0, wire.SEARCH_SHARDS))}
            else:
                assert self._reader is not None
                answer = self._reader.query(query, args)
        except ValueError as exc:  # a search with nothing to search for
            return self._answer(wire.BAD_REQUEST, reason=str(exc))
        except Exception as exc:  # the index (or copy) could not be read: not this copy's day
            name = type(exc).__name__
            log.event("estate_local_read_failed", "warning", query=query, error=f"{name}: {exc}")
            return self._answer(wire.OUT_OF_SERVICE, reason=f"{query} failed here: {name}: {exc}")
        return self._answer(wire.OK, applied=self.applied(), answer=answer)

    def outcome(self, op) -> dict[str, Any] | None:
        """The outcome this copy keeps for *op* (its id, and its refusal for
        its token); None when it keeps none. Raises StoreUnavailable (no copy)."""
        self._open()
        assert self._reader is not None
        return self._reader.outcome(op.id, op.token)

    async def reach(self, seq: int, until: float) -> bool:
        """Wait until this copy has applied *seq*, or monotonic *until*: whether it has."""
        return await self._reach(seq, self.applied, until)

    async def _reach(self, floor: int, reached, until: float) -> bool:
        """Wait until ``reached()`` is at least *floor*, or *until* (monotonic)."""
        if reached() >= floor:
            return True
        with self._wanting():
            return await self._reach_wanting(floor, reached, until)

    async def _reach_wanting(self, floor: int, reached, until: float) -> bool:
        while True:
            if reached() >= floor:
                return True
            left = until - time.monotonic()
            if left <= 0 or self._is_stale():  # a stopped applier reaches no floor
                return False
            try:
                async with asyncio.timeout(min(left, FLOOR_POLL)):
                    await self._tick.wait()
            except TimeoutError:
                pass

    async def _write(self, request: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        assert self._dealer is not None, "LocalCopy.start() was not called"
        if timeout is None:
            timeout = float(request.get("wait") or 0)
            deadline = request.get("deadline")
            if deadline is not None:
                timeout = min(timeout, float(deadline) - time.time())
            timeout += REPLY_MARGIN
        rid = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        dealer = self._dealer

        async def send_and_hear() -> dict[str, Any]:
            # The send too: a DEALER with no ROUTER to hand it to waits for one.
            await dealer.send_multipart([b"", wire.encode({**request, "id": rid})])
            return await fut
        try:
            async with asyncio.timeout(max(timeout, 0.0)):  # raises TimeoutError
                reply = await self._while_heard(send_and_hear())
        finally:
            self._pending.pop(rid, None)
        reply.pop("id", None)
        reply.setdefault("node", self.node_id)
        return reply

    async def _while_heard(self, awaitable) -> Any:
        """What *awaitable* gives, while the applier is heard from: once its
        silence says it stopped (:meth:`_is_stale`, as :meth:`reason` judges)
        :class:`ApplierSilent` is raised rather than waiting on. Each
        ``applied`` message is heard as it comes meanwhile, so a live
        applier's messages keep it going however long its answer takes."""
        task = asyncio.ensure_future(awaitable)
        try:
            with self._wanting():
                while True:
                    if self._is_stale():
                        raise ApplierSilent(f"{STOPPED}: nothing heard from it for "
                                            f"{self.stale:g}s while the write waited")
                    assert self._heard_at is not None
                    left = self._heard_at + self.stale - time.monotonic()
                    await asyncio.wait({task}, timeout=max(left, FLOOR_POLL))
                    if task.done():
                        return task.result()
        finally:
            task.cancel()   # (a no-op once done) not awaited: this one may be cancelled itself
