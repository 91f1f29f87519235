"""The live feed (roles.ingress.feed): ids, resuming, dropping a subscriber that fell behind."""

from __future__ import annotations

import asyncio

from roles.ingress import feed as feed_mod
from roles.ingress.feed import Feed


def _drain(sub) -> list:
    out = []
    while not sub.queue.empty():
        out.append(sub.queue.get_nowait())
    return out


def test_events_are_numbered_and_reach_every_subscriber_in_order():
    async def go():
        f = Feed(epoch="e1")
        a, b = f.subscribe(), f.subscribe()
        assert a.missed is None  # a new subscriber starts from a snapshot
        for i in range(3):
            f.publish("turn", {"i": i})
        assert [e.id for e in _drain(a)] == ["e1-1", "e1-2", "e1-3"]
        assert [e.data["i"] for e in _drain(b)] == [0, 1, 2]
        assert f.last_id == "e1-3"
        f.unsubscribe(a)
        f.publish("turn", {"i": 3})
        assert _drain(a) == [] and len(_drain(b)) == 1
    asyncio.run(go())


def test_a_subscriber_resumes_from_its_last_id_while_the_ring_holds_it():
    async def go():
        f = Feed(ring=5, epoch="e1")
        assert f.subscribe("e1-0").missed == []  # nothing published yet: nothing missed
        for i in range(8):
            f.publish("turn", {"i": i})
        assert [e.id for e in f.subscribe("e1-6").missed] == ["e1-7", "e1-8"]
        assert f.subscribe("e1-8").missed == []
        assert [e.id for e in f.subscribe("e1-3").missed] == ["e1-4", "e1-5", "e1-6", "e1-7", "e1-8"]
        # Older than the ring, another feed's epoch, from the future, or not an id: a snapshot.
        for gone in ("e1-2", "e0-7", "e1-99", "garbage", "e1-x"):
            assert f.subscribe(gone).missed is None, gone
    asyncio.run(go())


def test_a_subscriber_that_falls_behind_is_dropped_not_the_feed_slowed(monkeypatch):
    monkeypatch.setattr(feed_mod, "QUEUE", 3)

    async def go():
        f = Feed(epoch="e1")
        slow, fast = f.subscribe(), f.subscribe()
        for i in range(5):
            f.publish("turn", {"i": i})
            _drain(fast)
        got = _drain(slow)
        assert got[-1] is None and slow.dropped  # told it was dropped, after what it had
        assert [e.id for e in got[:-1]] == ["e1-1", "e1-2", "e1-3"]
        assert len(f) == 1
        # It comes back with its last id and catches up from the ring.
        assert [e.id for e in f.subscribe("e1-3").missed] == ["e1-4", "e1-5"]
    asyncio.run(go())
