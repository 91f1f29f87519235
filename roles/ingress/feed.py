"""The live feed: what changed, in order, to every subscriber of this ingress.

The :class:`~roles.ingress.projection.Projection` publishes an event for
each change it sees (a turn that ended, a node that came or went, a seat
that moved, a mailbox that filled); :class:`Feed` numbers it, keeps the last
:data:`RING` in memory, and hands it to each subscriber's queue.

Ids are ``<epoch>-<n>``: *epoch* names this feed (one per ingress process),
*n* counts up from 1. A subscriber that comes back with ``Last-Event-ID``
gets what it missed, if this feed still holds it; otherwise (another
process, or too long ago) it starts again from a ``snapshot`` — the whole
state — which is also what a new subscriber gets first. So a client never
mistakes a gap for a quiet spell.

A subscriber that falls :data:`QUEUE` events behind is dropped (its queue
ends with ``None``): it reconnects with its last id and catches up from the
ring, rather than slowing the feed for everyone.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

# Events kept for subscribers that come back.
RING = 2000
# Events a subscriber may fall behind before it is dropped.
QUEUE = 1000


@dataclass(frozen=True)
class Event:
    id: str
    kind: str
    data: dict[str, Any]
    at: float

    @functools.cached_property
    def sse(self) -> bytes:
        """The event as a Server-Sent Events block: encoded once, however many read it."""
        return (f"id: {self.id}\nevent: {self.kind}\ndata: "
                f"{json.dumps(self.data, separators=(',', ':'), default=str)}\n\n").encode()

    def message(self) -> dict[str, Any]:
        """The event as one WebSocket JSON message."""
        return {"id": self.id, "event": self.kind, "data": self.data}


@dataclass(eq=False)
class Subscription:
    """One subscriber: its queue, and what it missed (None: start from a snapshot)."""

    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(QUEUE + 1))
    missed: list[Event] | None = None
    dropped: bool = False


class Feed:
    """Invariants: ``_ring`` holds the newest events, ids strictly increasing;
    every live subscription is in ``_subs`` and sees each event published after
    it subscribed, in order, until it is dropped."""

    def __init__(self, *, ring: int = RING, epoch: str | None = None):
        self.epoch = epoch or secrets.token_hex(4)
        self._n = itertools.count(1)
        self._ring: collections.deque[Event] = collections.deque(maxlen=ring)
        self._subs: set[Subscription] = set()
        self.published = 0

    def __len__(self) -> int:
        return len(self._subs)

    @property
    def last_id(self) -> str:
        """The id of the newest event (``<epoch>-0`` before any): a snapshot's id."""
        return self._ring[-1].id if self._ring else f"{self.epoch}-0"

    def publish(self, kind: str, data: dict[str, Any]) -> Event:
        event = Event(f"{self.epoch}-{next(self._n)}", kind, data, time.time())
        self._ring.append(event)
        self.published += 1
        for sub in list(self._subs):
            if sub.queue.qsize() >= QUEUE:
                self._drop(sub)
            else:
                sub.queue.put_nowait(event)
        return event

    def subscribe(self, last_id: str | None = None) -> Subscription:
        sub = Subscription(missed=self._since(last_id))
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    def _drop(self, sub: Subscription) -> None:
        self._subs.discard(sub)
        sub.dropped = True
        sub.queue.put_nowait(None)

    def _since(self, last_id: str | None) -> list[Event] | None:
        """The events after *last_id*, if this feed still holds them all; else None."""
        if not last_id:
            return None
        epoch, _, n = last_id.partition("-")
        if epoch != self.epoch or not n.isdigit():
            return None
        n = int(n)
        if not self._ring:
            return [] if n == 0 else None
        first = int(self._ring[0].id.rpartition("-")[2])
        last = int(self._ring[-1].id.rpartition("-")[2])
        if n > last or n < first - 1:
            return None
        return [e for e in self._ring if int(e.id.rpartition("-")[2]) > n]
