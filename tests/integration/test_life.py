"""Seat leases bound to a seats process's life (crewlet.coord.life), on a real
nats-server: a held seat costs no write per heartbeat, a life that goes
takes its seats along, claims over a dead life are compare-and-sets whose
tokens keep growing, and adoption keeps a token only for this crewletd."""

from __future__ import annotations

import asyncio
import time

import nats

from crewlet.coord import buckets
from crewlet.coord.holders import Holders
from crewlet.coord.lease import Leases, Owner
from crewlet.coord.life import Life
from tests.estate import until



async def _last_seq(js) -> int:
    return (await js.stream_info(buckets.stream(buckets.LEASES.name))).state.last_seq


def _run(natsd, body):
    async def main():
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=5)
        await buckets.ensure(js, buckets.LEASES, 1)
        changes: list[tuple[str, bool, bool]] = []
        holders = Holders.of_bucket(js, heartbeat=60, on_change=lambda k, was, now: changes.append(
            (k, was is not None, now is not None)))
        watching = asyncio.create_task(holders.run())
        try:
            await asyncio.wait_for(holders.listed.wait(), 5)
            await body(js, holders, changes)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await nc.close()
    asyncio.run(main())


def test_seats_live_and_die_with_their_life_and_move_by_compare_and_set(natsd):
    async def body(js, holders, changes):
        a = Life(Leases(js, "a", "boot-a", ttl=30), "a", "p1")
        b = Life(Leases(js, "b", "boot-b", ttl=30), "b", "p1")
        await a.begin()
        await b.begin()
        claims = [await a.claim(f"seat.s{i}") for i in range(50)]
        assert all(c is not None and not c.successor for c in claims)
        await until(lambda: len(holders.of("seat.")) == 50, what="50 seats seen held by a")
        # b cannot take a seat of a live life with a view that is behind it.
        assert await b.claim("seat.s0", 0) is None
        assert holders.free("seat.s0") is None  # held: no revision to expect
        assert await b.claim("seat.s0", claims[0].held.token - 1) is None
        # Holding costs one write a renewal, not one a seat.
        before = await _last_seq(js)
        for _ in range(3):
            await a.renew()
        assert await _last_seq(js) - before == 3
        # a's life goes: every seat bound to it goes with it, for every reader.
        changes.clear()
        assert await a.end()
        await until(lambda: not holders.of("seat."), what="a's seats gone with its life")
        assert {k for k, was, now in changes if was and not now} >= {f"seat.s{i}" for i in range(50)}
        assert holders.get("seat.s0") is None and holders.free("seat.s0") == claims[0].held.token
        # b claims over the dead binding: a compare-and-set, the token grows.
        taken = await b.claim("seat.s0", holders.free("seat.s0"))
        assert taken is not None and taken.successor and taken.held.token > claims[0].held.token
        await until(lambda: (o := holders.get("seat.s0")) is not None and o.node == "b",
                     what="s0 seen held by b")
        # A stale view's claim still lands over a dead one (it reads, then writes).
        late = await b.claim("seat.s1", 0)
        assert late is not None and late.successor
    _run(natsd, body)


def test_a_lapsed_life_frees_its_seats_at_its_ttl(natsd):
    async def body(js, holders, changes):
        a = Life(Leases(js, "a", "boot-a", ttl=1), "a", "p1")
        await a.begin()
        for i in range(5):
            await a.claim(f"seat.s{i}")
        await until(lambda: len(holders.of("seat.")) == 5, what="seats held")
        t0 = time.monotonic()
        await until(lambda: not holders.of("seat."), 10, "seats freed by the life's TTL")
        assert time.monotonic() - t0 < 5
        assert not a.fresh()  # its own clock says so too
    _run(natsd, body)


def test_adoption_keeps_the_token_for_this_crewletd_and_not_for_an_earlier_one(natsd):
    async def body(js, holders, changes):
        first = Life(Leases(js, "a", "boot-1", ttl=30), "a", "p1")
        life = await first.begin()
        seat = await first.claim("seat.s0")
        # The seats process restarts under the same crewletd: same life token.
        second = Life(Leases(js, "a", "boot-1", ttl=30), "a", "p2")
        adopted = await second.begin()
        assert adopted is not None and adopted.token == life.token
        await until(lambda: holders.get("life.a") is not None
                     and holders.get("life.a").info.get("proc") == "p2", what="p2's life seen")
        assert set(holders.bound_to("a", life.token)) == {"seat.s0"}
        assert holders.get("seat.s0").token == seat.held.token  # still live, same token
        # The first process, had it survived, has lost its life.
        assert await first.renew() is None
        # crewletd restarted (another boot): a new life token; the seats bound
        # to the old one are free at once.
        third = Life(Leases(js, "a", "boot-2", ttl=30), "a", "p3")
        taken = await third.begin()
        assert taken is not None and taken.token > life.token
        await until(lambda: holders.get("seat.s0") is None, what="the old boot's seat freed")
        again = await third.claim("seat.s0", holders.free("seat.s0"))
        assert again is not None and again.held.token > seat.held.token
    _run(natsd, body)


def test_a_sweep_that_would_decide_nothing_again_skips_its_walks_until_something_changes(natsd):
    from roles.seats.sweeper import SeatSweeper

    async def body(js, holders, changes):
        leases = Leases(js, "n1", "boot-1", 30)
        assert await leases.claim("node.n1", roles=["seats"], labels={}) is not None
        started: list[str] = []

        async def on_claim(seat, held, fence):
            started.append(seat)

        sweeper = SeatSweeper(leases, holders, "n1", {}, boot="boot-1", proc="p1", sweep=5,
                              heartbeat=5, grace=30, spawns=4, releases=2, on_claim=on_claim)
        sweeper.set_company({"seats": [{"name": "a"}, {"name": "b"}]})
        await until(lambda: holders.get("node.n1"), what="the presence seen")
        await sweeper.sweep()                      # the life begun, a and b claimed
        assert sorted(started) == ["a", "b"]
        await until(lambda: holders.get("seat.a") and holders.get("seat.b"), what="the claims seen")
        await sweeper.sweep()                      # decides nothing: remembered
        await sweeper.sweep()
        assert sweeper.skipped == 1
        # A renewal of the life changes nothing anybody holds: still quiet.
        renewals = holders.changes
        await sweeper.life.renew()
        await until(lambda: holders.raw("life.n1").revision > sweeper.held["a"].revision,
                    what="the renewal seen")
        assert holders.changes == renewals
        await sweeper.sweep()
        assert sweeper.skipped == 2
        # Another node takes seat b (its key rewritten with another token):
        # the next sweep walks, and drops b.
        other = Leases(js, "n2", "boot-2", 30)
        taken = await other.claim("seat.b", expected=holders.raw("seat.b").revision)
        assert taken is not None
        await until(lambda: holders.raw("seat.b").node == "n2", what="the take seen")
        await sweeper.sweep()
        assert sweeper.skipped == 2 and "b" not in sweeper.held
        # A new company revision is read: c is claimed.
        await sweeper.sweep()
        sweeper.set_company({"seats": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})
        skipped = sweeper.skipped
        await sweeper.sweep()
        assert sweeper.skipped == skipped and "c" in sweeper.held
    _run(natsd, body)


def test_pool_members_renewing_in_turn_write_once_a_renewal(natsd):
    """Two members of a seats pool renew one life (the same boot, token and
    proc). Each renewal that is given the life as the watch shows it expects
    the sibling's revision: one write, none refused. Without it, every
    renewal after the sibling's is refused first (two writes)."""
    async def body(js, holders, changes):
        a = Life(Leases(js, "n", "boot-n", ttl=30), "n", "pool")
        b = Life(Leases(js, "n", "boot-n", ttl=30), "n", "pool")
        assert await a.begin() is not None
        assert await b.begin() is not None  # adopted: the pool's life, one token
        assert a.token == b.token
        writes: list[str] = []

        async def heard(msg):
            writes.append(msg.subject)
        sub = await js._nc.subscribe(f"$KV.{buckets.LEASES.name}.{a.key}", cb=heard)
        await js._nc.flush()

        async def renew_in_turn(member: Life, watched: bool) -> int:
            latest = max(a.held.revision, b.held.revision)
            await until(lambda: (o := holders.raw(a.key)) is not None and o.revision == latest,
                        what="the watch has the sibling's renewal")
            before = len(writes)
            held = await member.renew(holders.raw(a.key) if watched else None)
            assert held is not None and held.token == a.token
            await js._nc.flush()
            await until(lambda: len(writes) > before, what="the renewal's write heard")
            return len(writes) - before

        assert [await renew_in_turn(m, True) for m in (a, b, a, b)] == [1, 1, 1, 1]
        assert [await renew_in_turn(m, False) for m in (a, b)] == [2, 2]
        # A life seen under another token is not ours to expect: the write reads, and keeps it.
        stale = holders.raw(a.key)
        other = Owner(stale.node, stale.boot, stale.token + 1, stale.revision + 10, stale.info)
        assert (await a.renew(other)) is not None
        await sub.unsubscribe()
    _run(natsd, body)
