"""The fleet-shared counters on a real nats-server: ledger, cooldowns, budgets.

Two "nodes" are two NATS connections; what one writes, the other must see.
"""

from __future__ import annotations

import asyncio
import time

import nats

from crewlet.coord import buckets
from crewlet.coord.counters import Budgets, Cooldowns, Ledger
from tests.estate import until


async def _connections(natsd, n: int = 2):
    conns = [await nats.connect(natsd.url) for _ in range(n)]
    js = conns[0].jetstream(timeout=5)
    for bucket in (buckets.LEDGER, buckets.COOLDOWNS, buckets.BUDGETS):
        await buckets.ensure(js, bucket, 1)
    return conns


def test_ledger_records_once_per_trigger_and_every_node_reads_it(natsd):
    async def main():
        a, b = await _connections(natsd)
        try:
            la, lb = Ledger(a.jetstream(), ttl=60), Ledger(b.jetstream(), ttl=60)
            assert await lb.done("t-1") is None
            await la.record("t-1", {"seat": "s", "node": "a"}, deadline=time.monotonic() + 5)
            assert (await lb.done("t-1"))["node"] == "a"
            assert await lb.done("t-2") is None
        finally:
            await a.close()
            await b.close()
    asyncio.run(main())


async def _api_calls(js) -> int:
    """The JetStream API requests the account has made (a direct get is not one)."""
    return (await js.account_info()).api.total


def test_a_ledger_of_one_replica_is_read_by_direct_gets_not_the_leaders_api(natsd):
    """One replica: the server that answers a direct get is the leader, so a
    turn's ledger read costs the broker a direct get (tests/fleet/test_settle.py:
    with three, every read asks the leader)."""
    async def main():
        a, b = await _connections(natsd)
        try:
            ledger, js = Ledger(a.jetstream(), ttl=60), b.jetstream()
            await Ledger(js, ttl=60).record("t-1", {"seat": "s"}, deadline=time.monotonic() + 5)
            before = await _api_calls(js)
            answers = [await ledger.done("t-1")] + [await ledger.done(f"t-{i}") for i in range(2, 12)]
            calls = await _api_calls(js) - before - 1  # less the account_info itself
            assert answers[0]["seat"] == "s" and answers[1:] == [None] * 10
            assert calls == 1, f"{calls} API calls for 11 reads: the stream's info, once, was expected"
        finally:
            await a.close()
            await b.close()
    asyncio.run(main())


def test_a_watched_cooldown_is_answered_from_memory_and_follows_every_write(natsd):
    """A seats process watches the bucket: a turn's two cooldown looks cost no round trip."""
    async def main():
        a, b = await _connections(natsd)
        ca, cb = Cooldowns(a.jetstream()), Cooldowns(b.jetstream())
        await ca.cool("gpt", "k0", time.time() + 30)  # the bucket exists before the watch
        watching = asyncio.create_task(cb.run())
        try:
            await until(lambda: cb._listed, 10, "the cooldowns listed")
            assert abs(await cb.until("gpt", "k0") - time.time() - 30) < 2
            later = time.time() + 60
            await ca.cool("gpt", "k1", later, reason="429")
            await until(lambda: cb._until.get("gpt.k1") == later, 5, "k1 seen by the watch")
            requests = b.stats["out_msgs"]
            for _ in range(100):
                assert abs(await cb.until("gpt", "k1") - later) < 0.01
                assert await cb.until("gpt", "k2") is None
            assert b.stats["out_msgs"] == requests  # asked nobody
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await a.close()
            await b.close()
    asyncio.run(main())


def test_a_cooldown_is_seen_by_every_node_and_never_shortened(natsd):
    async def main():
        a, b = await _connections(natsd)
        try:
            ca, cb = Cooldowns(a.jetstream()), Cooldowns(b.jetstream())
            assert await cb.until("gpt", "k1") is None
            later = time.time() + 60
            await ca.cool("gpt", "k1", later, reason="429")
            assert abs(await cb.until("gpt", "k1") - later) < 0.01
            await cb.cool("gpt", "k1", time.time() + 5)  # shorter: the longer one stays
            assert abs(await ca.until("gpt", "k1") - later) < 0.01
            assert await ca.until("gpt", "k2") is None  # another key is not cooling
            await ca.cool("gpt", "k3", time.time() - 1)  # already over
            assert await cb.until("gpt", "k3") is None
        finally:
            await a.close()
            await b.close()
    asyncio.run(main())


def test_budgets_add_up_across_nodes_flushing_at_once(natsd):
    """Concurrent flushes from three nodes lose no token (compare-and-set)."""
    async def main():
        conns = await _connections(natsd, 3)
        try:
            nodes = [Budgets(c.jetstream(), tally_every=0) for c in conns]
            nodes[0].watch("s0")
            for round_ in range(5):
                for i, budget in enumerate(nodes):
                    budget.add(f"s{i}", 10 + i)
                await asyncio.gather(*(b.flush() for b in nodes))
            await nodes[0].flush()  # re-read the org total after everybody's last flush
            org, seat0 = nodes[0].spent("s0")
            assert org == 5 * (10 + 11 + 12) and seat0 == 50
            # A node reads back only the seats it watches; the org always.
            nodes[2].watch("s1")
            await nodes[2].flush()
            assert nodes[2].spent("s1") == (org, 55)
            assert nodes[2].spent("s0") == (org, 0)
        finally:
            for c in conns:
                await c.close()
    asyncio.run(main())


def test_an_uncapped_seats_spend_is_tallied_once_a_minute_and_all_of_it_at_stop(natsd):
    """The org total and the watched (capped) seats go out at every flush;
    an unwatched seat's spend only once ``tally_every`` passed, or when the
    role stops (``everything``): at 10,000 busy seats a write per seat per
    second was nearly a key write per turn."""
    async def main():
        conns = await _connections(natsd, 2)
        now = [1000.0]
        try:
            node = Budgets(conns[0].jetstream(), tally_every=60, clock=lambda: now[0])
            reader = Budgets(conns[1].jetstream())
            node.watch("capped")
            node.add("capped", 5)
            node.add("free", 7)
            await node.flush()

            async def totals() -> tuple[int, int, int]:
                reader.watch("capped")
                reader.watch("free")
                await reader.flush()
                return reader.spent("capped")[0], reader.spent("capped")[1], reader.spent("free")[1]

            assert await totals() == (12, 5, 0)       # the org and the capped seat, not the free one
            now[0] += 59
            await node.flush()
            assert await totals() == (12, 5, 0)
            now[0] += 1
            await node.flush()
            assert await totals() == (12, 5, 7)       # a minute on: tallied
            node.add("free", 3)
            await node.flush(everything=True)         # as the seats role stops
            assert await totals() == (15, 5, 10)
            assert node.unflushed() == 0
        finally:
            for c in conns:
                await c.close()
    asyncio.run(main())
