"""Fleet-shared answers a turn needs: the ledger, provider cooldowns, budgets.

These were per-process state in a single engine and must be true for the
company instead (the reference's coupling class 4): an org cap of 500 k
tokens must not become N × 500 k, and a cooldown written on one node must
hold on every other. Each is a key in its own coordination bucket.

==========  =========================  ==========================================
bucket      key                        value
==========  =========================  ==========================================
ledger      ``<trigger>``              the turn that worked a trigger: read before
                                       a turn, written after it; kept with a TTL
                                       longer than the mail it answers for
cooldowns   ``<provider>.<key id>``    ``{"until": wall clock, "reason"}``
budgets     ``org``, ``seat.<id>``     tokens spent so far (an integer)
==========  =========================  ==========================================

Writes are plain publishes on :func:`crewlet.bus.kv_subject`, so they are
answered from a leaf too. Budgets are counted locally and flushed with a
compare-and-set: the org total and every capped seat's about once a second
(a turn's spend reaches the fleet within a flush, and the hot path of a turn
never waits on a counter), an uncapped seat's once a minute
(:data:`TALLY_EVERY`). A seat without a cap is only tallied, and at 10,000
busy seats a write per seat per second was nearly a key write per turn; a
node killed between two tallies loses at most that minute of its uncapped
seats' tallies (never the org total's). Caps stay in the company config (in
memory); only usage is shared.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import defaultdict
from typing import Any, Callable

from nats.js import JetStreamContext
from nats.js.errors import APIError

from crewlet import log
from crewlet.bus import kv_subject, publish_until
from crewlet.coord.buckets import BUDGETS, COOLDOWNS, LEDGER, follow, last, stream
from crewlet.bus import EXPECTED_LAST as _EXPECTED_LAST
from crewlet.bus import WRONG_LAST_SEQUENCE as _WRONG_LAST_SEQUENCE

# Compare-and-set attempts of one budget flush per key before it waits for the next flush.
_CAS_ATTEMPTS = 8
# Keys one budget flush writes at once.
_FLUSH_PARALLEL = 16
# Seconds between flushes of an uncapped seat's spend (see the module doc).
TALLY_EVERY = 60.0


class CounterError(Exception):
    """A shared counter could not be read or written."""


async def _read(js: JetStreamContext, bucket: str, key: str, *, leader: bool = False
                ) -> tuple[int, bytes | None]:
    """:func:`crewlet.coord.buckets.last`, its failures as :class:`CounterError`."""
    try:
        return await last(js, bucket, key, leader=leader)
    except Exception as exc:
        raise CounterError(f"reading {bucket}/{key}: {type(exc).__name__}: {exc}") from exc


class Ledger:
    """Has this trigger been worked? Checked before a turn, written after one."""

    def __init__(self, js: JetStreamContext, *, ttl: float):
        self.js = js
        self._put = kv_subject(js, LEDGER.name)
        # Longer than the mail the entry answers for can be redelivered.
        self.ttl = ttl
        # The ledger stream's replicas, once its info was read (None: not yet).
        self._replicas: int | None = None

    async def _leader(self) -> bool:
        """Must a read ask the stream's leader? Yes while it has replicas that
        may lag a write by a moment: a trigger worked a moment ago must not
        read as unworked. Not when it has one replica: the one server that
        answers a direct get then is the leader, and a direct get costs the
        broker ~30 us of CPU against ~50 us for the leader's API
        (bench/turn_floor.py; one ledger read per turn). Asked of the stream
        once per process; while that fails, the leader."""
        if self._replicas is None:
            try:
                info = await self.js.stream_info(stream(LEDGER.name))
            except Exception:
                return True
            self._replicas = info.config.num_replicas or 1
        return self._replicas > 1

    async def done(self, trigger: str) -> dict[str, Any] | None:
        """The record of the turn that worked *trigger*, or None."""
        _, data = await _read(self.js, LEDGER.name, trigger, leader=await self._leader())
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return {"raw": data.decode(errors="replace")}

    async def record(self, trigger: str, entry: dict[str, Any], *, deadline: float) -> int:
        """Write that *trigger* was worked; the write's sequence.

        Sent again while unanswered (a stream leader election), under one
        ``Nats-Msg-Id``, until the monotonic *deadline*: a turn's side
        effects are done by now, and a ledger entry lost here would let the
        same trigger, sent again, be worked twice."""
        try:
            ack = await publish_until(self.js, self._put + trigger, json.dumps(entry).encode(),
                                      msg_id=f"ledger:{uuid.uuid4().hex}", deadline=deadline,
                                      msg_ttl=self.ttl)
        except Exception as exc:
            raise CounterError(f"writing ledger/{trigger}: {type(exc).__name__}: {exc}") from exc
        return ack.seq


class Cooldowns:
    """Provider keys cooling after a 429, until a wall-clock time every node respects.

    Wall clock, not monotonic: a monotonic value means nothing on another
    machine. The skew between two nodes' clocks is the error of the answer.
    """

    def __init__(self, js: JetStreamContext):
        self.js = js
        self._put = kv_subject(js, COOLDOWNS.name)
        # Kept by :meth:`run`, the process's one watch of the bucket: key ->
        # until, for every cooldown the watch shows (put in force once listed).
        self._until: dict[str, float] = {}
        self._next: dict[str, float] | None = None
        self._listed = False

    @staticmethod
    def key(provider: str, key_id: str) -> str:
        return f"{provider}.{key_id}"

    async def until(self, provider: str, key_id: str) -> float | None:
        """When the key stops cooling (``time.time()``); None if it is not cooling.
        From memory while :meth:`run` watches the bucket (a turn asks before
        each request: two round trips a turn, otherwise); read when it does not."""
        key = self.key(provider, key_id)
        if self._listed:
            until = self._until.get(key)
        else:
            _, data = await _read(self.js, COOLDOWNS.name, key)
            until = _until_of(data)
        return until if until is not None and until > time.time() else None

    async def run(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Watch the bucket for the life of the process (until cancelled)."""
        def opened() -> None:
            self._next = {}

        def listed() -> None:
            self._until, self._next = self._next or {}, None
            self._listed = True

        def seen(entry) -> None:
            target = self._next if self._next is not None else self._until
            until = _until_of(entry.value) if entry.operation is None else None
            if until is None:
                target.pop(entry.key, None)
            else:
                target[entry.key] = until
        try:
            await follow(lambda: self.js.key_value(COOLDOWNS.name), ">", seen, opened=opened,
                         listed=listed, name=COOLDOWNS.name, stopping=stopping)
        finally:
            self._listed = False

    async def cool(self, provider: str, key_id: str, until: float, reason: str = "") -> None:
        """The key cools until *until*; a later cooldown already written stays."""
        key = self.key(provider, key_id)
        value = json.dumps({"until": until, "reason": reason, "at": time.time()}).encode()
        # Kept a little past its end, then gone by itself.
        ttl = max(1, int(until - time.time()) + 60)
        for _ in range(_CAS_ATTEMPTS):
            seq, data = await _read(self.js, COOLDOWNS.name, key, leader=True)
            if data:
                try:
                    if float(json.loads(data)["until"]) >= until:
                        return
                except (ValueError, KeyError, TypeError):
                    pass
            if await _cas(self.js, self._put + key, value, seq, ttl=ttl):
                return
        raise CounterError(f"writing cooldowns/{key}: the compare-and-set kept failing")


class Budgets:
    """Token spend, org-wide and per seat, shared by the fleet.

    Invariant: ``_known[key]`` is the fleet's total as last read or written
    by this process; ``_pending[key]`` is what this process spent since and
    has not flushed. :meth:`spent` is their sum — what this node knows.
    The watched keys (the org, the capped seats this node runs) are flushed
    every ``flush_every``; the others every ``tally_every``, and all of them
    by :meth:`flush` with ``everything``.
    """

    def __init__(self, js: JetStreamContext, *, flush_every: float = 1.0,
                 tally_every: float = TALLY_EVERY, clock: Callable[[], float] = time.monotonic):
        self.js = js
        self._put = kv_subject(js, BUDGETS.name)
        self.flush_every = flush_every
        self.tally_every = tally_every
        self.clock = clock
        self._known: dict[str, int] = defaultdict(int)
        self._pending: dict[str, int] = defaultdict(int)
        self._watched: set[str] = {"org"}
        self._tallied = clock()   # when the unwatched keys were last flushed
        self._lock = asyncio.Lock()

    def add(self, seat: str, tokens: int) -> None:
        """Count *tokens* spent by *seat* (flushed within ``flush_every``)."""
        if tokens <= 0:
            return
        self._pending["org"] += tokens
        self._pending[f"seat.{seat}"] += tokens

    def watch(self, seat: str) -> None:
        """Keep *seat*'s total fresh (a seat this node runs)."""
        self._watched.add(f"seat.{seat}")

    def unwatch(self, seat: str) -> None:
        """Stop reading *seat*'s total back (its spend is still flushed)."""
        self._watched.discard(f"seat.{seat}")

    def spent(self, seat: str) -> tuple[int, int]:
        """(org, seat) tokens spent, as this node knows them now."""
        s = f"seat.{seat}"
        return (self._known["org"] + self._pending["org"], self._known[s] + self._pending[s])

    def unflushed(self) -> int:
        """Tokens spent here that the fleet's totals do not hold yet."""
        return self._pending.get("org", 0)

    async def flush(self, *, everything: bool = False) -> None:
        """Add what this node spent to the shared totals of the watched keys
        (and of every key, once ``tally_every`` passed or *everything*);
        re-read the watched ones."""
        async with self._lock:
            keys = set(self._watched)
            if everything or self.clock() - self._tallied >= self.tally_every:
                self._tallied = self.clock()
                keys |= {k for k, v in self._pending.items() if v}
            keys = sorted(keys)
            limit = asyncio.Semaphore(_FLUSH_PARALLEL)

            async def one(key: str) -> None:
                async with limit:
                    await self._flush_key(key)
            await asyncio.gather(*(one(k) for k in keys))
            # A seat nobody watches needs no total here once its spend is out.
            for key in [k for k, v in self._pending.items() if not v and k not in self._watched]:
                del self._pending[key]
                self._known.pop(key, None)

    async def _flush_key(self, key: str) -> None:
        delta = self._pending.get(key, 0)
        for attempt in range(_CAS_ATTEMPTS):
            seq, data = await _read(self.js, BUDGETS.name, key, leader=True)
            total = int(data or 0)
            if not delta:
                self._known[key] = total
                return
            if await _cas(self.js, self._put + key, str(total + delta).encode(), seq):
                self._known[key] = total + delta
                self._pending[key] -= delta
                return
            await asyncio.sleep(random.uniform(0, 0.01 * (attempt + 1)))

    async def run(self, stopping: asyncio.Event) -> None:
        """Flush every ``flush_every`` seconds until *stopping* (the role
        flushes everything as it stops)."""
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), self.flush_every)
            except asyncio.TimeoutError:
                pass
            try:
                await self.flush()
            except CounterError as exc:
                log.event("budget_flush_failed", "warning", error=str(exc))


def _until_of(data: bytes | None) -> float | None:
    """The ``until`` of a cooldown's value; None for nothing or not a cooldown."""
    if not data:
        return None
    try:
        return float(json.loads(data)["until"])
    except (ValueError, KeyError, TypeError):
        return None


async def _cas(js: JetStreamContext, subject: str, value: bytes, expected: int,
               ttl: float | None = None) -> bool:
    """Publish *value* only if the key's last sequence is *expected*."""
    try:
        await js.publish(subject, value, headers={_EXPECTED_LAST: str(expected)}, msg_ttl=ttl)
        return True
    except APIError as exc:
        if exc.err_code in _WRONG_LAST_SEQUENCE:
            return False
        raise CounterError(f"writing {subject}: {exc}") from exc
    except Exception as exc:
        raise CounterError(f"writing {subject}: {type(exc).__name__}: {exc}") from exc
