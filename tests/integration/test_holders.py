"""Who holds which lease: one long-lived watch per process (crewlet.coord.holders),
on a real nats-server. Reading it must leave nothing on the broker (issue 10:
a consumer per listing filled KV_leases to the server's 1,000)."""

from __future__ import annotations

import asyncio
import time

import nats

from crewlet.coord import buckets
from crewlet.coord.holders import Holders
from crewlet.coord.lease import Leases
from tests.estate import until



async def _consumers(js) -> int:
    return (await js.stream_info(buckets.stream(buckets.LEASES.name))).state.consumer_count


def test_holders_list_live_leases_and_see_them_go(natsd):
    async def main():
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=5)
        await buckets.ensure(js, buckets.LEASES, 1)
        a = Leases(js, "a", "boot-a", ttl=1)
        kept = await a.claim("seat.s1")
        gone = await a.claim("seat.s2")
        await a.claim("node.a")
        await a.release(gone)
        changes: list[tuple[str, bool, bool]] = []
        holders = Holders.of_bucket(js, heartbeat=60, on_change=lambda k, was, now: changes.append(
            (k, was is not None, now is not None)))
        watching = asyncio.create_task(holders.run())
        try:
            await asyncio.wait_for(holders.listed.wait(), 5)
            assert set(holders.of("seat.")) == {"seat.s1"}
            assert holders.of("seat.")["seat.s1"].token == kept.token
            assert set(holders.of("node.")) == {"node.a"}
            # A lease taken after the listing appears; one left to lapse goes.
            later = await a.claim("seat.s3")
            await until(lambda: "seat.s3" in holders.of("seat."), what="s3 seen")
            assert holders.get("seat.s3").token == later.token
            await until(lambda: not holders.of("seat."), 10, "every seat lease lapsed (TTL 1 s)")
            assert ("seat.s3", False, True) in changes and ("seat.s3", True, False) in changes
            # Reading costs nothing on the broker: one consumer, however often.
            for _ in range(1000):
                holders.of("seat.")
            assert await _consumers(js) == 1
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        # Stopped: its consumer is deleted, not left for the inactive threshold.
        await until(lambda: True)
        assert await _consumers(js) == 0
        await nc.close()
    asyncio.run(main())


def test_a_watch_left_by_a_killed_process_goes_within_the_inactive_threshold(natsd):
    async def main():
        killed = await nats.connect(natsd.url)
        kv = await buckets.ensure(killed.jetstream(timeout=5), buckets.LEASES, 1)
        await buckets.open_watch(kv, ">")
        # The process dies without a word: its connection just goes.
        await killed.close()
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=5)
        assert await _consumers(js) == 1
        deadline = time.monotonic() + buckets.WATCH_INACTIVE + 5
        while await _consumers(js) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await _consumers(js) == 0
        await nc.close()
    asyncio.run(main())


def test_holders_wait_for_a_watch_the_broker_refuses_and_list_once_it_is_given(natsd):
    """The stream at its consumer limit: the watch is refused (10026), tried
    again with backoff, and the view lists once a consumer is free."""
    async def main():
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=5)
        kv = await buckets.ensure(js, buckets.LEASES, 1)
        info = await js.stream_info(buckets.stream(buckets.LEASES.name))
        info.config.max_consumers = 1
        await js.update_stream(info.config)
        squatter = await buckets.open_watch(kv, ">")
        holders = Holders.of_bucket(js, heartbeat=60)
        watching = asyncio.create_task(holders.run())
        try:
            await asyncio.sleep(0.5)
            assert not holders.listed.is_set()
            await buckets.close_watch(squatter)
            await asyncio.wait_for(holders.listed.wait(), 5)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await nc.close()
    asyncio.run(main())


def test_a_watch_whose_consumer_was_lost_is_listed_anew_within_two_heartbeats(natsd):
    """The broker drops the watch's consumer (its member killed, a partition):
    nats-py's watch just goes quiet, for 10-20 s. Holders opens it again once
    nothing arrived for two heartbeats, and sees what changed meanwhile."""
    async def main():
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=5)
        await buckets.ensure(js, buckets.LEASES, 1)
        a = Leases(js, "a", "boot-a", ttl=30)
        await a.claim("node.a")
        holders = Holders.of_bucket(js, heartbeat=0.5)
        watching = asyncio.create_task(holders.run())
        try:
            await asyncio.wait_for(holders.listed.wait(), 5)
            stream = buckets.stream(buckets.LEASES.name)
            for info in await js.consumers_info(stream):
                await js.delete_consumer(stream, info.name)
            await a.claim("seat.late")
            started = time.monotonic()
            await until(lambda: "seat.late" in holders.of("seat."), 8, "the lease claimed after the loss")
            assert time.monotonic() - started < 5
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await nc.close()
    asyncio.run(main())


# A process's close must not wait on a watch it was opening: one held by it
# takes the JetStream timeout, 2 s (a workers stop took 2 s); an unheld close
# takes milliseconds, so 1.5 s tells the two apart on a loaded machine too.
CLOSED_WITHIN = 1.5


async def _leases_with_three_seats(natsd):
    nc = await nats.connect(natsd.url)
    kv = await buckets.ensure(nc.jetstream(timeout=2), buckets.LEASES, 1)
    for i in range(3):
        await kv.put(f"seat.s{i}", b"x")
    return nc, kv


def test_a_watch_cancelled_while_opening_does_not_hold_the_close(natsd):
    from crewlet import bus

    async def main():
        nc, kv = await _leases_with_three_seats(natsd)
        # Cancelled at every point of its opening: its subscribe, its consumer info.
        for step in range(24):
            opening = asyncio.create_task(buckets.open_watch(kv, ">"))
            await asyncio.sleep(0.0005 * step)
            opening.cancel()
            try:
                await buckets.close_watch(await opening)
            except asyncio.CancelledError:
                pass
        began = time.monotonic()
        await bus.close(nc)
        return time.monotonic() - began

    took = asyncio.run(main())
    assert took < CLOSED_WITHIN, f"the close took {took:.2f}s"


def test_watches_still_opening_when_the_connection_closes_do_not_hold_it(natsd):
    from crewlet import bus

    async def main():
        nc, kv = await _leases_with_three_seats(natsd)
        opening = []
        for _ in range(20):  # some opened, some asked for their consumer info, some not yet
            opening.append(asyncio.create_task(buckets.open_watch(kv, ">")))
            await asyncio.sleep(0.0003)
        began = time.monotonic()
        await bus.close(nc)
        took = time.monotonic() - began
        for task in opening:
            task.cancel()
        await asyncio.gather(*opening, return_exceptions=True)
        return took

    took = asyncio.run(main())
    assert took < CLOSED_WITHIN, f"the close took {took:.2f}s"
