"""Nothing a turn writes after its side effects is tried only once (issue 10).

On a real three-member R3 cluster the member leading a stream is SIGKILLed
just before the write; the write is made through a surviving member with the
turn's own calls — the ledger entry, the durable turn record, the live
record, the mailbox ack — and must land exactly once, within its deadline.
A leader election leaves publishes unanswered for ~5–6 s (DESIGN §4).
"""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest

from crewlet.bus import publish_until
from crewlet.coord import buckets
from crewlet.coord.counters import Ledger
from crewlet.estate import log as estate_log
from crewlet.estate.ops import make_op
from crewlet.queue.jetstream import JetStreamMailboxes
from tests.fleet.test_cluster import retry

pytestmark = pytest.mark.fleet

PATIENCE = 30.0  # the turns' SETTLE_PATIENCE


async def _quiet(exc) -> None:
    pass


async def _through_a_survivor(cluster, stream: str):
    """Kill the member leading *stream*; a connection to a member that lives."""
    async with _connect([s.url for s in cluster]) as (nc, js):
        leader = (await js.stream_info(stream)).cluster.leader
    dead = next(s for s in cluster if s.name == leader)
    dead.kill()
    return [s.url for s in cluster if s is not dead]


class _connect:
    def __init__(self, urls):
        self.urls = urls

    async def __aenter__(self):
        self.nc = await nats.connect(servers=self.urls, error_cb=_quiet, reconnect_time_wait=0.2,
                                     max_reconnect_attempts=-1)
        return self.nc, self.nc.jetstream(timeout=2)

    async def __aexit__(self, *exc):
        await self.nc.close()


def test_a_ledger_entry_written_during_a_leader_election_lands_once(nats_cluster):
    async def main():
        async with _connect([s.url for s in nats_cluster]) as (nc, js):
            await retry(lambda: buckets.ensure(js, buckets.LEDGER, 3))
        survivors = await _through_a_survivor(nats_cluster, buckets.stream(buckets.LEDGER.name))
        async with _connect(survivors) as (nc, js):
            started = time.monotonic()
            seq = await Ledger(js, ttl=60).record("job-1", {"seat": "w"},
                                                  deadline=started + PATIENCE)
            assert seq > 0
            assert (await Ledger(js, ttl=60).done("job-1"))["seat"] == "w"
            info = await js.stream_info(buckets.stream(buckets.LEDGER.name))
            assert info.state.messages == 1  # resent under one id: stored once
            return time.monotonic() - started
    took = asyncio.run(main())
    print(f"ledger write through the election: {took:.1f}s")


def test_a_ledger_of_three_replicas_is_read_from_its_leader(nats_cluster):
    """A replica may lag a write by a moment, and a trigger worked a moment
    ago must not read as unworked: with three replicas the ledger reads from
    the stream's leader (tests/integration/test_counters.py: with one, by a
    direct get). The members' API counters are no witness here (they are
    each member's own, and moved by direct gets too), so the choice is read."""
    async def main():
        async with _connect([s.url for s in nats_cluster]) as (nc, js):
            await retry(lambda: buckets.ensure(js, buckets.LEDGER, 3))
            ledger = Ledger(js, ttl=60)
            await ledger.record("job-1", {"seat": "w"}, deadline=time.monotonic() + PATIENCE)
            assert (await ledger.done("job-1"))["seat"] == "w"
            assert await ledger._leader() is True
    asyncio.run(main())


def test_turn_records_published_during_a_leader_election_land_once(nats_cluster):
    async def main():
        async with _connect([s.url for s in nats_cluster]) as (nc, js):
            await retry(lambda: estate_log.ensure_stream(js, 3))
            mailboxes = JetStreamMailboxes(js, nc)
            await retry(lambda: mailboxes.ensure_streams(replicas=3, max_consumers=1000))
        survivors = await _through_a_survivor(nats_cluster, estate_log.STREAM)
        async with _connect(survivors) as (nc, js):
            deadline = time.monotonic() + PATIENCE
            op = make_op("turn.record", {"record": {"seat": "w", "trigger": "job-1", "outcome": "done"}},
                         node="a", seat="w", token=7, id="w:turn:job-1:1")
            seq, duplicate = await estate_log.publish(js, op, timeout=2, deadline=deadline)
            assert seq == 1 and not duplicate
            # The same op sent again (the turn's process resending it) lands once.
            assert await estate_log.publish(js, op, timeout=2, deadline=deadline) == (1, True)
            ack = await publish_until(js, "events.turn.w", json.dumps({"trigger": "job-1"}).encode(),
                                      msg_id="turn:x", deadline=deadline)
            assert ack.stream == "EVENTS"
            assert (await js.stream_info(estate_log.STREAM)).state.messages == 1
    asyncio.run(main())


def test_an_ack_sent_during_a_leader_election_is_confirmed(nats_cluster):
    async def main():
        async with _connect([s.url for s in nats_cluster]) as (nc, js):
            mailboxes = JetStreamMailboxes(js, nc)
            await retry(lambda: mailboxes.ensure_streams(replicas=3, max_consumers=1000))
            await retry(lambda: mailboxes.ensure(["w"]))
            await mailboxes.send("w", "job 1", trigger="job-1")
            delivery = await mailboxes.attach("w").next(wait=5)
            assert delivery is not None
            token = delivery.ack_token
        survivors = await _through_a_survivor(nats_cluster, "AGENTS")
        async with _connect(survivors) as (nc, js):
            mailboxes = JetStreamMailboxes(js, nc)
            await mailboxes.ack(token, deadline=time.monotonic() + PATIENCE)
            # Acked: nothing is left to deliver, now or after a NAK of it.
            info = await retry(lambda: js.consumer_info("AGENTS", "inbox-w"))
            assert info.num_ack_pending == 0 and info.num_pending == 0
    asyncio.run(main())


def test_one_write_sent_by_two_processes_at_once_lands_once_and_both_are_answered(nats_cluster):
    """Two nodes storing the same webhook delivery at the same moment (the
    claim's loser stores too, in case the winner died): an R3 leader answers
    the second publish of a message id it is still proposing with 10158,
    "duplicate message id is in process" — not a refusal, the write may yet
    land — so each is sent again until the duplicate ack comes (CI once
    answered such a delivery 503)."""
    async def main():
        async with _connect([nats_cluster[0].url]) as (nc1, js1), \
                _connect([nats_cluster[1].url]) as (nc2, js2):
            await retry(lambda: js1.add_stream(name="TWICE", subjects=["twice.>"], num_replicas=3))
            await retry(lambda: js1.publish("twice.warm", b"w", timeout=5))
            deadline = time.monotonic() + PATIENCE
            for i in range(150):
                acks = await asyncio.gather(*(
                    publish_until(js, f"twice.{i}", b"x", msg_id=f"delivery-{i}", deadline=deadline)
                    for js in (js1, js2)))
                assert sorted(bool(a.duplicate) for a in acks) == [False, True], acks
                assert acks[0].seq == acks[1].seq
            info = await js1.stream_info("TWICE")
            assert info.state.messages == 151
    asyncio.run(main())
