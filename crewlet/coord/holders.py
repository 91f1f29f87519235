"""Who holds which lease: one watch of the ``leases`` bucket, kept open for the
life of a process, and the memory it keeps.

A seat sweep, crewletd's fleet view and the duties all ask "who is alive,
who holds what". Asking the broker each time made a consumer per question
(issue 10: two per sweep, until the stream refused its 1,001st and every
sweep failed); DESIGN §13 wants a node's idle cost not to grow with its
seats anyway. So a process runs one :class:`Holders` and reads it:

* :meth:`Holders.of` — the live leases under a prefix, from memory;
* ``on_change(key, was, now)`` — called for each lease that appeared, moved
  or went, as the watch sees it (the seat sweep wakes on these);
* :meth:`Holders.gone` — an event set when one key's lease goes (released,
  lapsed, deleted): what a conversation run waiting for a busy
  conversation's driver lease wakes on (:mod:`crewlet.conversations.lease`),
  however many wait, without a consumer of their own.

The watch is :func:`crewlet.coord.buckets.follow`: opened again after a
failure, each listing put in force whole, so a lease that lapsed while no
watch was open is forgotten too. A watch whose consumer was lost does not
fail, it goes quiet; but a sound one is never quiet for long — every live
node renews its presence every heartbeat — so a watch that heard nothing for
:data:`IDLE_HEARTBEATS` heartbeats is opened again, and every watch is
listed anew every :data:`REFRESH` seconds in any case (what lapsed during a
long gap is then forgotten even if its expiry marker was gone).

Reading from memory lags the bucket by a watch's delay (~1 ms) while the
watch is sound, and by at most those bounds when it is not. That is safe
because nothing *decides* on it alone: a claim is a compare-and-set that
fails on a live key, and the fence check before a side effect reads the
key itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Awaitable, Callable, Iterator

from nats.js.kv import KeyValue

from crewlet.coord.buckets import LEASES, follow
from crewlet.coord.lease import Owner, read_owner

Changed = Callable[[str, "Owner | None", "Owner | None"], None]

# Heartbeats without a single entry after which a watch is taken for lost.
IDLE_HEARTBEATS = 2
# Seconds after which a watch is opened and listed anew, lost or not.
REFRESH = 300.0


class Holders:
    """The live leases of the fleet, as this process's one watch sees them.

    Invariants: ``_live`` is every live lease (key -> owner) as of the last
    entry the watch delivered, once ``listed`` is set (before, it is empty
    and means nothing); ``_next`` is the copy a (re)opened watch is filling,
    None outside a listing.
    """

    def __init__(self, open_kv: Callable[[], Awaitable[KeyValue]], *, heartbeat: float,
                 on_change: Changed = lambda key, was, now: None):
        self._open_kv = open_kv
        self._idle = IDLE_HEARTBEATS * heartbeat
        self.on_change = on_change
        self._live: dict[str, Owner] = {}
        self._next: dict[str, Owner] | None = None
        self._gone: dict[str, set[asyncio.Event]] = {}  # key -> the events gone() handed out
        self.listed = asyncio.Event()

    @classmethod
    def of_bucket(cls, js, **kw) -> "Holders":
        """Holders of the fleet's ``leases`` bucket, reached through *js*, in a
        fleet whose nodes renew their presence every *heartbeat* seconds."""
        return cls(lambda: js.key_value(LEASES.name), **kw)

    # -------------------------------------------------------------- reading

    def of(self, prefix: str) -> dict[str, Owner]:
        """Every live lease whose key starts with *prefix* (``seat.``, ``node.``)."""
        return {k: o for k, o in self._live.items() if k.startswith(prefix)}

    def get(self, key: str) -> Owner | None:
        return self._live.get(key)

    @contextlib.contextmanager
    def gone(self, key: str) -> Iterator[asyncio.Event]:
        """An event set whenever the watch sees *key* hold no live lease (a
        delete, an expiry, a listing without it), while inside the block.

        Set on every such entry, even for a key this memory never held (the
        watch may have been re-listing when the lease came): a waiter takes a
        wake as "look again", never as proof. The caller clears it."""
        event = asyncio.Event()
        self._gone.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            waiting = self._gone.get(key)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._gone[key]

    def _wake_gone(self, key: str) -> None:
        for event in self._gone.get(key, ()):
            event.set()

    # ------------------------------------------------------------ the watch

    async def run(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Follow the bucket until cancelled (or *stopping*)."""
        await follow(self._open_kv, ">", self._seen, opened=self._opened, listed=self._listed,
                     name=LEASES.name, stopping=stopping, idle=self._idle, refresh=REFRESH)

    def _opened(self) -> None:
        self._next = {}

    def _listed(self) -> None:
        fresh, self._next = self._next or {}, None
        old, self._live = self._live, fresh
        for key in old.keys() | fresh.keys():
            if old.get(key) != fresh.get(key):
                self.on_change(key, old.get(key), fresh.get(key))
        for key in [k for k in self._gone if k not in fresh]:
            self._wake_gone(key)
        self.listed.set()

    def _seen(self, entry) -> None:
        owner = None
        if entry.operation is None and entry.value:
            owner = read_owner(entry.revision, entry.value)  # None: not a lease, ignored
        if self._next is not None:  # listing: fill the copy put in force at _listed
            if owner is None:
                self._next.pop(entry.key, None)
            else:
                self._next[entry.key] = owner
            return
        was = self._live.get(entry.key)
        if owner is None:
            self._live.pop(entry.key, None)
            self._wake_gone(entry.key)
        else:
            self._live[entry.key] = owner
        if was != owner:
            self.on_change(entry.key, was, owner)
