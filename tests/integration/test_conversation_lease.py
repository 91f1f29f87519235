"""The driver lease of a conversation (crewlet.conversations.lease) against a real
nats-server: one driver at a time, a second one waiting for a release or a
lapse (woken by the process's one lease watch) and then told who drives,
renewals for as long as the run lasts, and a lost lease said."""

from __future__ import annotations

import asyncio
import contextlib
import time

import nats
import pytest

from crewlet.conversations.lease import ConversationBusy, Drivers, key
from crewlet.coord import buckets
from crewlet.coord.holders import Holders

TTL = 2  # seconds: renewed every 2/3 s; a lapse is seen within a few seconds


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@contextlib.asynccontextmanager
async def fleet(url: str):
    """A connection with the leases bucket, and a running watch of it (what
    the ingress role's projection runs)."""
    nc = await nats.connect(url, connect_timeout=2)
    js = nc.jetstream(timeout=2)
    await buckets.ensure(js, buckets.LEASES, 1)
    holders = Holders.of_bucket(js, heartbeat=60)
    watching = asyncio.create_task(holders.run())
    try:
        await asyncio.wait_for(holders.listed.wait(), 10)
        yield js, holders
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await nc.close()


async def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_the_second_driver_waits_and_takes_the_lease_once_the_first_lets_go(natsd):
    """Abort and retry: the retry waits while the abandoned run tears down,
    and is let in when it releases — woken by the watch, not at its deadline."""
    async def main():
        async with fleet(natsd.url) as (js, holders):
            a = Drivers(js, "node-a", "boot-a", ttl=TTL, holders=holders)
            b = Drivers(js, "node-b", "boot-b", ttl=TTL, holders=holders)
            first = await a.acquire("c1", "r1", wait=0)
            assert first.holds() and first.node == "node-a"
            wait = 10.0
            second = asyncio.create_task(b.acquire("c1", "r2", wait=wait))
            # The abandoned run takes a moment to tear down: the retry waits.
            await asyncio.sleep(0.3)
            assert not second.done(), "the second run did not wait for the lease"
            released_at = time.monotonic()
            assert await first.release()
            taken = await asyncio.wait_for(second, wait)
            woke_after = time.monotonic() - released_at
            assert woke_after < 2.0, f"woken {woke_after:.2f}s after the release: not by the watch"
            assert taken.run == "r2" and taken.token > first.token, "the fencing token grows"
            owner = await a.holder("c1")
            assert (owner.node, owner.info["run"], owner.token) == ("node-b", "r2", taken.token)
            assert not first.holds()
            await taken.release()
            assert await a.holder("c1") is None
    run(main())


def test_a_driver_that_stays_is_named_when_the_wait_runs_out(natsd):
    async def main():
        async with fleet(natsd.url) as (js, holders):
            a = Drivers(js, "node-a", "boot-a", ttl=TTL, holders=holders)
            b = Drivers(js, "node-b", "boot-b", ttl=TTL, holders=holders)
            async with await a.acquire("c1", "r1", wait=0) as first:
                started = time.monotonic()
                with pytest.raises(ConversationBusy) as refused:
                    await b.acquire("c1", "r2", wait=1.0)
                waited = time.monotonic() - started
                assert 1.0 <= waited < 3.0, waited
                busy = refused.value
                assert (busy.conversation, busy.run, busy.node) == ("c1", "r1", "node-a")
                assert busy.since == first.since
                assert 1 <= busy.retry_after <= TTL
                # The first run renewed all along: still its lease, same token.
                assert first.holds() and await first.current()
    run(main())


def test_take_it_without_waiting_answers_at_once(natsd):
    """The session runner's mode: a conversation driven elsewhere is left there."""
    async def main():
        async with fleet(natsd.url) as (js, holders):
            a = Drivers(js, "node-a", "boot-a", ttl=TTL, holders=holders)
            runner = Drivers(js, "node-b", "boot-b", ttl=TTL, holders=holders)
            async with await a.acquire("c1", "r1", wait=0):
                started = time.monotonic()
                with pytest.raises(ConversationBusy) as refused:
                    await runner.acquire("c1", "r2", wait=0)
                assert time.monotonic() - started < 0.5
                assert refused.value.run == "r1"
                # Different conversations never contend, the same seat's or not.
                async with await runner.acquire("c2", "r3", wait=0) as other:
                    assert other.holds()
            # Released on leaving the block: free at once.
            async with await runner.acquire("c1", "r4", wait=0) as next_one:
                assert next_one.run == "r4"
    run(main())


def test_a_refused_claim_names_the_holder_from_its_own_read(natsd):
    """The 409's decision is the claim's write and its read of the key, as a bare
    kv.create's: the holder it names is what that read found, not a third request."""
    async def main():
        async with fleet(natsd.url) as (js, holders):
            a = Drivers(js, "node-a", "boot-a", ttl=TTL, holders=holders)
            b = Drivers(js, "node-b", "boot-b", ttl=TTL, holders=holders)

            async def no_more_reads(key):
                raise AssertionError(f"a read of {key} after the refused claim")

            async with await a.acquire("c1", "r1", wait=0) as first:
                b.leases.owner = no_more_reads
                for wait in (0, 0.2):  # at once, and after a wait's last look
                    with pytest.raises(ConversationBusy) as refused:
                        await b.acquire("c1", "r2", wait=wait)
                    busy = refused.value
                    assert (busy.run, busy.node, busy.since) == ("r1", "node-a", first.since)
    run(main())


def test_renewals_keep_the_lease_for_as_long_as_the_run_lasts(natsd):
    async def main():
        async with fleet(natsd.url) as (js, holders):
            a = Drivers(js, "node-a", "boot-a", ttl=TTL, holders=holders)
            b = Drivers(js, "node-b", "boot-b", ttl=TTL, holders=holders)
            async with await a.acquire("c1", "r1", wait=0) as driving:
                token = driving.token
                first_at = (await a.holder("c1")).info["at"]
                deadline = time.monotonic() + 2.5 * TTL
                while time.monotonic() < deadline:  # the run goes on for 2.5 TTLs
                    with pytest.raises(ConversationBusy):
                        await b.acquire("c1", "r2", wait=0)
                    await asyncio.sleep(0.25)
                assert driving.holds() and not driving.lost.is_set()
                owner = await a.holder("c1")
                assert owner.token == token and owner.info["at"] > first_at
                assert owner.info["since"] == driving.since
    run(main())


def test_a_driver_that_stops_renewing_loses_the_lease_at_its_ttl_and_is_told(natsd):
    """A wedged driver (its renewals stopped): its own clock tells it the
    lease is lost after a TTL, the server drops the key, and a waiting run
    takes it with a larger token; the stale holder's release leaves the
    successor's lease alone."""
    async def main():
        async with fleet(natsd.url) as (js, holders):
            a = Drivers(js, "node-a", "boot-a", ttl=TTL, holders=holders)
            b = Drivers(js, "node-b", "boot-b", ttl=TTL, holders=holders)
            stale = await a.acquire("c1", "r1", wait=0)
            stale._renewer.cancel()  # the renewals stop; nothing else does
            stopped = time.monotonic()
            taken = await b.acquire("c1", "r2", wait=3 * TTL)
            await asyncio.wait_for(stale.lost.wait(), 1)
            assert time.monotonic() - stopped >= TTL - 1  # renewed last at most a third before
            assert "TTL" in stale.why and not stale.holds()
            assert taken.token > stale.token
            assert await stale.release() is False
            assert (await b.holder("c1")).token == taken.token
            assert await taken.current()
            await taken.release()
    run(main())


def test_a_lease_deleted_under_its_driver_is_lost_at_the_next_renewal(natsd):
    async def main():
        async with fleet(natsd.url) as (js, holders):
            a = Drivers(js, "node-a", "boot-a", ttl=TTL, holders=holders)
            driving = await a.acquire("c1", "r1", wait=0)
            kv = await js.key_value(buckets.LEASES.name)
            await kv.delete(key("c1"))  # an operator's hand
            await asyncio.wait_for(driving.lost.wait(), TTL)
            assert "taken or deleted" in driving.why and not driving.holds()
            assert not await driving.current()
            assert await driving.release() is False
    run(main())


def test_without_a_watch_a_waiter_looks_again_at_its_deadline(natsd):
    async def main():
        async with fleet(natsd.url) as (js, holders):
            a = Drivers(js, "node-a", "boot-a", ttl=TTL, holders=holders)
            blind = Drivers(js, "node-b", "boot-b", ttl=TTL)
            first = await a.acquire("c1", "r1", wait=0)
            waiting = asyncio.create_task(blind.acquire("c1", "r2", wait=1.0))
            await asyncio.sleep(0.2)
            await first.release()
            async with await waiting as taken:
                assert taken.run == "r2"
    run(main())


def test_ids_that_are_not_estate_row_ids_are_refused(natsd):
    async def main():
        async with fleet(natsd.url) as (js, holders):
            drivers = Drivers(js, "node-a", "boot-a", ttl=TTL, holders=holders)
            for conversation, run_id in (("a b", "r1"), ("c1", "r>"), ("*", "r1"), ("", "r1")):
                with pytest.raises(ValueError):
                    await drivers.acquire(conversation, run_id, wait=0)
            # A dotted id is one key, its own.
            async with await drivers.acquire("team.c1", "r1", wait=0) as dotted:
                assert dotted.key == "conv.team.c1"
                async with await drivers.acquire("team", "r2", wait=0):
                    pass
    run(main())


def test_a_request_that_goes_away_mid_claim_leaves_the_lease_free(natsd):
    """A client gone while its run's claim is under way: whatever the claim
    took is let go at once, not held by nobody for a TTL (30 s here)."""
    async def main():
        async with fleet(natsd.url) as (js, holders):
            drivers = Drivers(js, "node-a", "boot-a", ttl=30, holders=holders)
            for passes in range(6):  # cancelled at different points of the claim
                acquiring = asyncio.create_task(drivers.acquire("c1", f"gone{passes}", wait=0))
                for _ in range(passes):
                    await asyncio.sleep(0)
                acquiring.cancel()
                try:
                    await (await acquiring).release()  # done before the cancel came: fine too
                except asyncio.CancelledError:
                    pass
                # The next run gets it within a busy wait, woken by the release.
                async with await drivers.acquire("c1", f"next{passes}", wait=2) as driving:
                    assert driving.run == f"next{passes}"
    run(main())
