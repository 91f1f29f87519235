"""Leases against a real nats-server: claim, renew, release, expiry, fencing."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from crewlet.coord import buckets
from crewlet.coord.lease import Leases


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def connect(url: str, replicas: int = 1):
    nc = await nats.connect(url, connect_timeout=2)
    js = nc.jetstream(timeout=2)
    await buckets.ensure(js, buckets.LEASES, replicas)
    return nc, js


async def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := await predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return value


def test_one_holder_at_a_time_and_release_frees_the_key(natsd):
    async def main():
        nc, js = await connect(natsd.url)
        a, b = Leases(js, "a", "boot-a", ttl=5), Leases(js, "b", "boot-b", ttl=5)
        held = await a.claim("seat.s1", role="seats")
        assert held is not None and held.token > 0
        assert await b.claim("seat.s1") is None
        owner = await b.owner("seat.s1")
        assert (owner.node, owner.boot, owner.token, owner.info) == ("a", "boot-a", held.token,
                                                                     {"role": "seats"})
        assert await a.release(held)
        assert await b.owner("seat.s1") is None
        taken = await b.claim("seat.s1")
        assert taken is not None and taken.token > held.token
        await nc.close()
    run(main())


def test_renewal_keeps_a_lease_past_its_ttl_and_the_token_stays(natsd):
    async def main():
        nc, js = await connect(natsd.url)
        a = Leases(js, "a", "boot-a", ttl=1)
        held = await a.claim("seat.s1")
        token = held.token
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5:  # 2.5 TTLs
            held = await a.renew(held)
            assert held is not None
            await asyncio.sleep(0.3)
        owner = await a.owner("seat.s1")
        assert owner is not None and owner.token == token and owner.revision == held.revision
        assert await a.current("seat.s1", token)
        await nc.close()
    run(main())


def test_a_lapsed_lease_is_fenced_and_taken_over(natsd):
    """The paused-node case: a holder that stops renewing past its TTL (SIGSTOP,
    a long pause) finds on waking that its lease is gone, its token refused,
    and its renewal and release no longer touch the successor's key."""
    async def main():
        nc, js = await connect(natsd.url)
        a, b = Leases(js, "a", "boot-a", ttl=1), Leases(js, "b", "boot-b", ttl=1)
        old = await a.claim("seat.s1")
        # a goes quiet; the server expires the key after one TTL.
        new = await until(lambda: b.claim("seat.s1"), 5, "the lease to lapse")
        assert new.token > old.token, "the fencing token grows from one owner to the next"
        assert not old.fresh(), "by its own clock the paused holder knows it is stale"
        assert not await a.current("seat.s1", old.token)
        assert await b.current("seat.s1", new.token)
        assert await a.renew(old) is None
        assert await a.release(old) is False
        assert (await b.owner("seat.s1")).node == "b"
        await nc.close()
    run(main())


def test_expiry_is_seen_by_a_watcher(natsd):
    async def main():
        nc, js = await connect(natsd.url)
        a = Leases(js, "a", "boot-a", ttl=1)
        kv = await js.key_value("leases")
        watcher = await kv.watch("seat.*", include_history=False)
        await a.claim("seat.s1")
        ops = []
        async def seen():
            async for entry in watcher:
                if entry is not None:
                    ops.append(entry.operation)
                    if entry.operation is not None:
                        return entry
        entry = await asyncio.wait_for(seen(), 5)
        assert entry.key == "seat.s1" and entry.operation == "PURGE"
        await watcher.stop()
        await nc.close()
    run(main())


def test_concurrent_claims_have_exactly_one_winner(natsd):
    async def main():
        nc, js = await connect(natsd.url)
        contenders = [Leases(js, f"n{i}", f"boot-{i}", ttl=5) for i in range(10)]
        results = await asyncio.gather(*(c.claim("duty.fleet_shape") for c in contenders))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        owner = await contenders[0].owner("duty.fleet_shape")
        assert owner.token == winners[0].token
        await nc.close()
    run(main())


@pytest.mark.fleet
def test_leases_survive_losing_one_of_three_members(nats_cluster):
    async def main():
        nc, js = await connect(nats_cluster[0].url, replicas=3)
        # A TTL longer than a stream leader election (~5 s, DESIGN §4).
        a = Leases(js, "a", "boot-a", ttl=30)
        b = Leases(js, "b", "boot-b", ttl=30)
        held = await a.claim("seat.s1")
        assert held is not None
        nats_cluster[2].kill()  # one of three members gone: KV keeps quorum
        for _ in range(5):
            held = await a.renew(held)
            assert held is not None
            await asyncio.sleep(0.2)
        assert await b.claim("seat.s2") is not None
        assert await b.claim("seat.s1") is None
        await nc.close()
    run(main())


def test_claiming_the_same_key_again_really_writes_it(natsd):
    """Within the broker's duplicate window, a second claim of a released key
    must be stored anew, not deduplicated into the first claim's ack."""
    async def main():
        nc, js = await connect(natsd.url)
        a = Leases(js, "a", "boot-a", ttl=5)
        first = await a.claim("seat.s1")
        await a.release(first)
        again = await a.claim("seat.s1")
        assert again is not None and again.token > first.token
        assert (await a.owner("seat.s1")).token == again.token
        await nc.close()
    run(main())
