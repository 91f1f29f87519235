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

Bound leases
------------
A seat lease has no TTL of its own: it is **bound** to its holder's life,
the ``life.<node>`` lease the seats process renews (:mod:`crewlet.coord.life`),
and names that life's token (``"life"`` in its value). It is live while
that life is: the same key, live, with the same token. So everything read
here — :meth:`of`, :meth:`get`, ``on_change`` — shows a bound lease only
while its life is live, and a life that lapses, is deleted or is claimed
anew (another token) takes every lease bound to it along, each reported to
``on_change`` as gone. The bound key itself stays in the bucket until the
next holder's compare-and-set replaces it: :meth:`revision` gives the
sequence such a claim must expect.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
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
        self._live: dict[str, Owner] = {}  # every lease key the watch shows, bound ones whatever their life
        self._bound: dict[str, set[str]] = {}  # node -> the keys in _live bound to a life of that node
        self._since: dict[str, tuple[int, float]] = {}  # key -> (token, monotonic time first seen)
        self._next: dict[str, Owner] | None = None
        self._gone: dict[str, set[asyncio.Event]] = {}  # key -> the events gone() handed out
        # Grows whenever who holds a key may have changed (a claim, a release,
        # an expiry, a life's new token, a listing), never on a renewal alone:
        # equal counts mean every reading above would answer the same holders.
        self.changes = 0
        self.listed = asyncio.Event()

    @classmethod
    def of_bucket(cls, js, **kw) -> "Holders":
        """Holders of the fleet's ``leases`` bucket, reached through *js*, in a
        fleet whose nodes renew their presence every *heartbeat* seconds."""
        return cls(lambda: js.key_value(LEASES.name), **kw)

    # -------------------------------------------------------------- reading

    def of(self, prefix: str) -> dict[str, Owner]:
        """Every live lease whose key starts with *prefix* (``seat.``, ``node.``)."""
        return {k: o for k, o in self._live.items()
                if k.startswith(prefix) and _alive(o, self._live)}

    def get(self, key: str) -> Owner | None:
        owner = self._live.get(key)
        return owner if owner is not None and _alive(owner, self._live) else None

    def bound_to(self, node: str, life: int) -> dict[str, Owner]:
        """The leases bound to *node*'s life under token *life*, as the watch
        shows them, whether that life is live or not (adoption reads them)."""
        return {k: o for k in self._bound.get(node, ())
                if (o := self._live[k]).info.get("life") == life}

    def since(self, key: str) -> float | None:
        """The monotonic time this watch first saw *key*'s current owner
        (its token); None when no live lease holds it."""
        owner = self.get(key)
        seen = self._since.get(key)
        return seen[1] if owner is not None and seen and seen[0] == owner.token else None

    def raw(self, key: str) -> Owner | None:
        """The lease *key* holds as the watch last saw it, live or bound to a dead life."""
        return self._live.get(key)

    def free(self, key: str) -> int | None:
        """The sequence a claim of *key* must expect, as the watch shows it
        now: 0 for no key, a dead bound lease's revision (it is still
        there); None while somebody holds *key* — never a live lease's
        revision, which a compare-and-set would take from its holder."""
        owner = self._live.get(key)
        if owner is None:
            return 0
        return None if _alive(owner, self._live) else owner.revision

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
        self.changes += 1
        old = _in_force(self._live)
        self._live = fresh
        self._bound = {}
        self._since = {k: v for k, v in self._since.items() if k in fresh}
        for key, owner in fresh.items():
            self._index(key, owner)
        new = _in_force(fresh)
        for key in old.keys() | new.keys():
            if old.get(key) != new.get(key):
                self.on_change(key, old.get(key), new.get(key))
        for key in [k for k in self._gone if k not in new]:
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
        key = entry.key
        # What readers saw before: this key, and if it is a life whose token
        # changes (claimed, lapsed, deleted), every lease bound to it. A
        # renewal keeps the token, and changes nothing bound to it: at 10,000
        # seats, looking at them all on every renewal was a third of an idle
        # seats process.
        was_raw = self._live.get(key)
        moved = key.startswith(LIFE) and (was_raw is None or owner is None
                                          or was_raw.token != owner.token)
        bound = sorted(self._bound.get(key.removeprefix(LIFE), ())) if moved else []
        before = {k: self.get(k) for k in (key, *bound)}
        raw = self._live.pop(key, None)
        if raw is None or owner is None or (raw.node, raw.token) != (owner.node, owner.token):
            self.changes += 1
        if raw is not None:
            self._unindex(key, raw)
            if owner is None:
                self._since.pop(key, None)
        if owner is not None:
            self._live[key] = owner
            self._index(key, owner)
        for k, was in before.items():
            now = self.get(k)
            if now is None:
                self._wake_gone(k)
            if was != now:
                self.on_change(k, was, now)

    def _index(self, key: str, owner: Owner) -> None:
        seen = self._since.get(key)
        if seen is None or seen[0] != owner.token:
            self._since[key] = (owner.token, time.monotonic())
        if "life" in owner.info:
            self._bound.setdefault(owner.node, set()).add(key)

    def _unindex(self, key: str, owner: Owner) -> None:
        keys = self._bound.get(owner.node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._bound[owner.node]


# The key prefix of a seats process's life (crewlet.coord.life), spelt here
# too: a bound lease's liveness is read from it.
LIFE = "life."


def _alive(owner: Owner, live: dict[str, Owner]) -> bool:
    """Is *owner* live given the leases *live*? Unbound: yes (its TTL is the
    server's business); bound: while its life is there with its token."""
    life = owner.info.get("life")
    if life is None:
        return True
    holder = live.get(LIFE + owner.node)
    return holder is not None and holder.token == life


def _in_force(live: dict[str, Owner]) -> dict[str, Owner]:
    return {k: o for k, o in live.items() if _alive(o, live)}
