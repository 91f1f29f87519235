"""The driver lease of a conversation: ``conv.<id>`` in the ``leases`` bucket.

A run of a conversation has exactly one **driver** — the ingress node that
took the request, or a session runner — and the driver holds ``conv.<id>``
for the whole run, streaming or not (DESIGN §11). It is a lease like a
seat's (:class:`crewlet.coord.lease.Leases`: a claim is a compare-and-set
with a per-key TTL, the claim's stream sequence is the fencing token, a
renewal is a compare-and-set that sets the TTL again, a release deletes
only our own), so one process per conversation drives, and a driver that
dies lets go at the TTL. Different conversations never contend: one key
each.

:class:`Drivers` is a process's door to them:

* ``await drivers.acquire(conversation, run, wait=s)`` claims the key. If it
  is held it waits up to *wait* seconds for it to be released or to lapse,
  woken by the process's one watch of the bucket
  (:meth:`crewlet.coord.holders.Holders.gone`) — no consumer per waiter, no
  polling — with one last attempt at the deadline in case the watch lags.
  Then it raises :class:`ConversationBusy` naming the holder: its run, node,
  since when, and ``retry_after`` (what a 409 ``conversation_busy`` says).
  ``wait=0`` is one attempt: the session runner's "take it without
  waiting", which leaves a conversation driven elsewhere to its driver.
  The API's wait is ``conversations.busy_wait`` (Tier A).
* What it returns, :class:`Driving`, is the held lease. It renews itself in
  a background task every third of the TTL for as long as it is held, and
  says when it was **lost** (``lost``, an event, and ``why``): a renewal
  refused (the key was taken or deleted), or no renewal acknowledged within
  a TTL by this process's own clock (a broker without quorum, a loop that
  stalled). A run stops before its next side effect once :meth:`Driving.holds`
  is False; :meth:`Driving.current` asks the bucket itself. It is an async
  context manager: leaving it (or :meth:`Driving.release`) stops the
  renewals and deletes the key if it is still ours.

The **TTL** is ``conversations.lease_ttl``, 15 s by default, not the seats'
``fleet.lease_ttl`` (45 s): a seat's mail can wait, but a person watching a
stream waits on a dead driver for a TTL (plus the session runner's sweep)
before the run is picked up elsewhere. 15 s still rides out a stream leader
election (~6 s, DESIGN §4): a renewal is due every 5 s and its resends last
up to 5 s more, so one stalled renewal leaves a third of the TTL. Its cost:
a KV write per running conversation every 5 s (1,000 running at once: 200
writes/s, a tenth of what one server takes).

The lease's value is the :mod:`crewlet.coord.lease` value (``node``,
``boot``, ``token``) with ``conversation``, ``run`` (the driving run's id),
``since`` (wall-clock time of the claim), ``at`` (of the latest write) and
``ttl`` (the holder's), so a refused run can be told whom it waits for and
for how long at most.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import Any

from nats.js import JetStreamContext

from crewlet import log
from crewlet.coord.holders import Holders
from crewlet.coord.lease import Held, LeaseError, Leases, Owner
from crewlet.estate.ops import ROW_ID

# The key of a conversation's driver lease: this + the conversation's id.
KEY_PREFIX = "conv."
# Renewals per TTL: two may fail (or stall through a leader election) and the
# lease still holds, as the seats' heartbeat is a third of their TTL.
RENEWALS_PER_TTL = 3
# Seconds between renewal attempts whose outcome was unknown (no quorum, a
# dropped connection) while the lease is still fresh by our clock.
RENEW_RETRY = 0.25

_ROW_ID = re.compile(ROW_ID)


def key(conversation: str) -> str:
    """The lease key of *conversation* (an estate row id)."""
    if not _ROW_ID.match(conversation):
        raise ValueError(f"not a conversation id: {conversation!r}")
    return KEY_PREFIX + conversation


class ConversationBusy(Exception):
    """Another run drives the conversation: what a 409 ``conversation_busy`` says.

    ``run`` and ``node`` name the driving run and its driver's node (None when
    the key holds a lease that does not say, or went between the refused
    claim and the read); ``since``: wall-clock time it took the lease;
    ``retry_after``: whole seconds until the lease lapses unless its driver
    renews it — when a retry can succeed at the latest if that driver is
    dead; at least 1.
    """

    def __init__(self, conversation: str, run: str | None, node: str | None,
                 since: float | None, retry_after: int):
        self.conversation = conversation
        self.run = run
        self.node = node
        self.since = since
        self.retry_after = retry_after
        super().__init__(f"conversation {conversation} is driven by run {run} on node {node}; "
                         f"retry after {retry_after}s")

    @classmethod
    def of(cls, conversation: str, owner: Owner | None, now: float | None = None) -> "ConversationBusy":
        if owner is None:
            return cls(conversation, None, None, None, 1)
        info = owner.info
        now = time.time() if now is None else now
        ttl = _number(info.get("ttl")) or 1.0
        at = _number(info.get("at"))
        # Clocks of two nodes differ: bounded to [1, ttl] whatever they say.
        left = ttl if at is None else min(max(at + ttl - now, 1.0), ttl)
        return cls(conversation, _text(info.get("run")), owner.node, _number(info.get("since")),
                   math.ceil(left))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class Drivers:
    """The driver leases of conversations, for one process.

    *ttl*: ``conversations.lease_ttl``; *holders*: the process's watch of the
    ``leases`` bucket (running), which waiting acquirers wake on; without
    one, a waiting :meth:`acquire` only tries again at its deadline.
    """

    def __init__(self, js: JetStreamContext, node: str, boot: str, *, ttl: float,
                 holders: Holders | None = None):
        self.leases = Leases(js, node, boot, ttl)
        self.ttl = self.leases.ttl  # whole seconds, as the server keeps them
        self.node = node
        self.holders = holders
        self._letting_go: set[asyncio.Task] = set()  # releases of claims their callers left

    async def holder(self, conversation: str) -> Owner | None:
        """Who drives *conversation* now (None: nobody), read from the bucket."""
        return await self.leases.owner(key(conversation))

    async def acquire(self, conversation: str, run: str, *, wait: float) -> "Driving":
        """Take *conversation*'s driver lease for *run*, waiting up to *wait*
        seconds for it to be released or to lapse.

        Raises :class:`ConversationBusy` when it stayed held, and
        :class:`~crewlet.coord.lease.LeaseError` when the bucket could not be
        read or written (no quorum, a timeout): the caller answers 503, not
        409. The result renews itself until released: use it as ``async with``.
        """
        lease_key = key(conversation)
        if not _ROW_ID.match(run):
            raise ValueError(f"not a run id: {run!r}")
        deadline = time.monotonic() + max(wait, 0.0)
        waking = self.holders.gone(lease_key) if self.holders is not None and wait > 0 else _no_wake()
        with waking as gone:
            final = False
            while True:
                # Cleared before the claim: a release seen after it wakes us.
                gone.clear()
                since = time.time()
                held, owner = await self._claim(lease_key, conversation, run, since)
                if held is not None:
                    return Driving(self, held, conversation, run, since)
                left = deadline - time.monotonic()
                if left <= 0 or final:
                    break
                try:
                    async with asyncio.timeout(left):
                        await gone.wait()
                except TimeoutError:
                    final = True  # the deadline: one last look, the watch may lag
        # The refused claim's own read named the holder (no read of ours: the
        # 409's decision is a write and a read, as a bare kv.create's).
        if owner is None:
            owner = await self.leases.owner(lease_key)
        if owner is None:
            # Gone between the refused claim and the read: one more try
            # rather than a 409 naming nobody.
            since = time.time()
            held, owner = await self._claim(lease_key, conversation, run, since)
            if held is not None:
                return Driving(self, held, conversation, run, since)
            if owner is None:
                owner = await self.leases.owner(lease_key)
        raise ConversationBusy.of(conversation, owner)

    async def _claim(self, lease_key: str, conversation: str, run: str,
                     since: float) -> tuple[Held | None, Owner | None]:
        """One claim (:meth:`~crewlet.coord.lease.Leases.claim_or_owner`), let
        go of if the caller is cancelled while it is under way (a client that
        went away mid-request): its write may land all the same, and nobody
        would drive that lease until its TTL."""
        claiming = asyncio.ensure_future(
            self.leases.claim_or_owner(lease_key, **self._info(conversation, run, since)))
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            claiming.add_done_callback(self._let_go)
            raise

    def _let_go(self, claiming: asyncio.Future) -> None:
        if claiming.cancelled() or claiming.exception() is not None or claiming.result()[0] is None:
            return
        task = asyncio.get_running_loop().create_task(self.leases.release(claiming.result()[0]))
        self._letting_go.add(task)  # referenced until done
        task.add_done_callback(self._released_orphan)

    def _released_orphan(self, task: asyncio.Task) -> None:
        self._letting_go.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.event("conversation_lease_release_failed", "warning", error=str(task.exception()))

    def _info(self, conversation: str, run: str, since: float) -> dict[str, Any]:
        return {"conversation": conversation, "run": run, "since": since, "at": time.time(),
                "ttl": self.ttl}


class _no_wake:
    """An event nobody sets: a waiter without a watch waits for its deadline."""

    def __enter__(self) -> asyncio.Event:
        return asyncio.Event()

    def __exit__(self, *exc) -> None:
        return None


class Driving:
    """A conversation's driver lease, held by this process for one run.

    Invariants: ``_held`` is the lease as last written by us; the lapse timer
    fires a TTL after that write was sent; ``lost`` is set once, and then
    nothing renews.
    """

    def __init__(self, drivers: Drivers, held: Held, conversation: str, run: str, since: float):
        self._drivers = drivers
        self._held = held
        self.conversation = conversation
        self.run = run
        self.since = since
        self.node = drivers.node
        self.lost = asyncio.Event()
        self.why: str | None = None
        self._released = False
        loop = asyncio.get_running_loop()
        self._lapse = loop.call_later(self._fresh_for(), self._lapsed)
        self._renewer = loop.create_task(self._renew(), name=f"renew {held.key}")

    @property
    def key(self) -> str:
        return self._held.key

    @property
    def token(self) -> int:
        """The fencing token: it only grows from one driver of the conversation to the next."""
        return self._held.token

    @property
    def ttl(self) -> float:
        return self._held.ttl

    def holds(self) -> bool:
        """Still ours by our own reckoning: not lost, not released, renewed
        within a TTL. The check before each side effect of the run."""
        return not self.lost.is_set() and not self._released and self._held.fresh()

    async def current(self) -> bool:
        """Is our token still the key's, as the bucket says (a round trip)?"""
        return self.holds() and await self._drivers.leases.current(self.key, self.token)

    async def release(self) -> bool:
        """Stop renewing and give the lease up; False if it was not ours any
        more (or the broker did not answer: logged, and the lease then lapses
        at its TTL). A second call does nothing and says False."""
        if self._released:
            return False
        self._released = True
        self._lapse.cancel()
        self._renewer.cancel()
        await asyncio.gather(self._renewer, return_exceptions=True)
        try:
            released = await self._drivers.leases.release(self._held)
        except LeaseError as exc:
            log.event("conversation_lease_release_failed", "warning", key=self.key, run=self.run,
                      error=str(exc))
            return False
        if not released and not self.lost.is_set():
            self._lose("found taken when released")
        return released

    async def __aenter__(self) -> "Driving":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.release()

    # ------------------------------------------------------------ renewing

    def _fresh_for(self) -> float:
        return max(0.0, self._held.renewed + self._held.ttl - time.monotonic())

    def _lapsed(self) -> None:
        if not self._held.fresh():
            self._lose(f"no renewal acknowledged within its TTL ({self.ttl:g}s)")
        else:  # a renewal landed just now: look again when that one runs out
            self._lapse = asyncio.get_running_loop().call_later(self._fresh_for(), self._lapsed)

    def _lose(self, why: str) -> None:
        if self.lost.is_set():
            return
        self.why = why
        self.lost.set()
        self._lapse.cancel()
        if asyncio.current_task() is not self._renewer:
            self._renewer.cancel()
        log.event("conversation_lease_lost", "warning", key=self.key, run=self.run,
                  token=self.token, why=why)

    async def _renew(self) -> None:
        every = self._held.ttl / RENEWALS_PER_TTL
        leases = self._drivers.leases
        while not self.lost.is_set():
            await asyncio.sleep(max(0.0, self._held.renewed + every - time.monotonic()))
            left = self._fresh_for()
            if left <= 0:
                self._lose(f"no renewal acknowledged within its TTL ({self.ttl:g}s)")
                return
            try:
                # Never past our own freshness: what is not ours by then is lost.
                async with asyncio.timeout(left):
                    held = await leases.renew(self._held, **self._drivers._info(
                        self.conversation, self.run, self.since))
            except (LeaseError, TimeoutError) as exc:
                log.event("conversation_lease_renew_failed", "debug", key=self.key,
                          error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(min(RENEW_RETRY, self._fresh_for()))
                continue
            if held is None:
                self._lose("taken or deleted: a renewal found another value under the key")
                return
            self._held = held
            self._lapse.cancel()
            self._lapse = asyncio.get_running_loop().call_later(self._fresh_for(), self._lapsed)
