#!/usr/bin/env python3
"""Benchmark: seat mailboxes on JetStream -- the retention cliff, and creating mailboxes.

Starts its own nats-servers on free 127.0.0.1 ports (stores in a temp dir
under /tmp), stops them by pid, and measures in one run:

(a) **the retention cliff.** For each size N (``--sizes``, default
    1000,5000,10000) and each retention (interest, limits): a fresh single
    server, an ``AGENTS`` stream of that retention, N mailboxes (one durable
    pull consumer per seat, created by ``JetStreamMailboxes.ensure``, timed);
    then ``--msgs`` messages over ``--seats`` random seats, ``--concurrency``
    at once, each one publish -> fetch(1) -> confirmed ack, by bare nats-py
    (``js.publish``, a bound pull subscription's ``fetch(1)``, ``ack_sync``)
    and by crewlet (``send`` -> ``Mailbox.next`` -> ``ack``), in ``--rounds``
    rounds whose first side alternates; the broker's CPU while they ran, and
    over ``--idle`` s with nothing to do after (psutil on the nats-server pid;
    100 % = one core).
(b) **creating mailboxes.** ``ensure(--create seats)`` on a fresh single
    server beside bare ``add_consumer`` of as many (same config, 64 at once,
    on a twin stream); then a three-member cluster (routes on loopback, R3
    streams): the first ``ensure`` for the record, the "joining node" -- a
    second client on another member whose ``ensure`` finds them all existing
    -- beside what a naive boot would do (``add_consumer`` of all of them
    again, which the server takes as updates), and R3 consumer creation with
    file storage beside ``mem_storage`` (bare, ``--r3-sample`` each).

Ratios are crewlet/bare. Acks on both sides are confirmed (the server answers
once it applied them), as crewlet's are. Exit status: 0 unless the benchmark
itself broke.

    /tmp/venv/bin/python bench/mailboxes.py [--sizes 1000,5000,10000] [--skip-cluster] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import nats  # noqa: E402
import psutil  # noqa: E402
from nats.aio.client import __version__ as NATS_PY_VERSION  # noqa: E402

from bench.leases import (BenchError, Server, find_nats_server, free_ports, retrying,  # noqa: E402
                          say, server_version, wait_jetstream)
from bench.common import add_smoke, emit  # noqa: E402
from crewlet import log  # noqa: E402
from crewlet.queue import JetStreamMailboxes  # noqa: E402
from crewlet.queue import jetstream as jsq  # noqa: E402

SEED = 20240611
PAYLOAD = b'{"text": "a message for a seat, about this long"}'
CREATE_CONCURRENCY = jsq.CREATE_CONCURRENCY   # the bare side creates as many at once
STOP_GRACE = 5.0        # s a SIGTERM'd server gets before SIGKILL (10,000 consumers stop slowly)
BARE = "BARE"           # the twin stream the bare side creates consumers on
JS_TIMEOUT = 10.0       # s: generous, so a slow server shows as slow rather than as an error


# --------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------

def start(servers: list[Server]) -> None:
    for s in servers:
        s.start()
    for s in servers:
        s.wait_listening(15.0)


def stop(servers: list[Server]) -> float:
    """SIGTERM each, SIGKILL (by pid) what lingers; the seconds it took."""
    t0 = time.monotonic()
    for s in servers:
        s.terminate()
    for s in servers:
        if s.proc is None:
            continue
        try:
            s.proc.wait(max(0.1, STOP_GRACE - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            try:
                s.proc.kill()
            except ProcessLookupError:
                pass
            s.proc.wait(10)
    return time.monotonic() - t0


def single(binary: str, base: str, name: str) -> list[Server]:
    return [Server(binary, name, base, free_ports(1)[0])]


def cluster(binary: str, base: str) -> list[Server]:
    ports = free_ports(6)
    client, route = ports[:3], ports[3:]
    urls = [f"nats://127.0.0.1:{p}" for p in route]
    return [Server(binary, f"m{i}", base, client[i], route[i], [u for j, u in enumerate(urls) if j != i])
            for i in range(3)]


def idle_cpu(pid: int, seconds: float) -> float:
    """The process's CPU % (100 = one core) over *seconds* of doing nothing asked of it."""
    proc = psutil.Process(pid)
    proc.cpu_percent(None)
    time.sleep(seconds)
    return proc.cpu_percent(None)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

async def connect(url: str, name: str):
    nc = await nats.connect(url, name=name, connect_timeout=2, allow_reconnect=False)
    return nc, nc.jetstream(timeout=JS_TIMEOUT)


async def add_stream(js, name: str, subject: str, retention: str, replicas: int, max_consumers: int) -> None:
    await retrying(f"creating stream {name}", lambda: js.add_stream(
        name=name, subjects=[subject + ">"], retention=retention, num_replicas=replicas,
        max_consumers=max_consumers, storage="file"))


def consumer_config(name: str, subject: str, *, mem_storage: bool = False) -> dict[str, Any]:
    cfg = {"durable_name": name, "deliver_policy": "all", "ack_policy": "explicit",
           "ack_wait": jsq.DEFAULT_ACK_WAIT, "max_deliver": jsq.MAX_DELIVER, "filter_subject": subject}
    if mem_storage:
        cfg["mem_storage"] = True
    return cfg


async def bare_create(js, stream: str, subject_prefix: str, seats: list[str], **kw) -> float:
    """add_consumer of every seat, CREATE_CONCURRENCY at once; seconds."""
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(seat: str) -> None:
        async with gate:
            await js.add_consumer(stream, timeout=JS_TIMEOUT,
                                  **consumer_config(f"inbox-{seat}", subject_prefix + seat, **kw))
    t0 = time.perf_counter()
    await asyncio.gather(*(one(s) for s in seats))
    return time.perf_counter() - t0


def partition(seats: list[str], msgs: int, workers: int) -> list[list[str]]:
    """For each worker, the seats of its messages, round-robin over its own seats
    (no two workers share a seat, so every fetch finds its own worker's message)."""
    owned = [seats[i::workers] for i in range(workers)]
    counts = [msgs // workers + (1 if i < msgs % workers else 0) for i in range(workers)]
    return [[own[j % len(own)] for j in range(n)] for own, n in zip(owned, counts) if own]


async def bare_round(js, plan: list[list[str]], subs: dict[str, Any]) -> float:
    async def worker(seats: list[str]) -> None:
        for seat in seats:
            await js.publish(jsq.SUBJECT + seat, PAYLOAD)
            msgs = await subs[seat].fetch(1, timeout=JS_TIMEOUT)
            await msgs[0].ack_sync(timeout=JS_TIMEOUT)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(p) for p in plan))
    return time.perf_counter() - t0


async def crewlet_round(mb: JetStreamMailboxes, plan: list[list[str]]) -> float:
    async def worker(seats: list[str]) -> None:
        for seat in seats:
            box = mb.attach(seat)
            await mb.send(seat, PAYLOAD)
            d = await box.next(wait=JS_TIMEOUT)
            if d is None:
                raise BenchError(f"crewlet: nothing in {seat}'s mailbox after a send")
            await box.ack(d)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(p) for p in plan))
    return time.perf_counter() - t0


# --------------------------------------------------------------------------
# (a) the retention cliff
# --------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def cliff_case(url: str, pid: int, n: int, retention: str, args: argparse.Namespace,
                     crewlet_first: bool) -> dict[str, Any]:
    nc, js = await connect(url, "bench-cliff")
    try:
        await wait_jetstream([url], 30.0)
        await add_stream(js, jsq.STREAM, jsq.SUBJECT, retention, 1, n + 100)
        mb = JetStreamMailboxes(js, nc, timeout=JS_TIMEOUT)
        seats = [f"seat-{i:05d}" for i in range(n)]
        t0 = time.perf_counter()
        made = await mb.ensure(seats)
        create_s = time.perf_counter() - t0
        if made != n:
            raise BenchError(f"ensure made {made} of {n} mailboxes")
        rng = random.Random(SEED + n)
        sample = rng.sample(seats, min(args.seats, n))
        per_round = [args.msgs // args.rounds + (1 if i < args.msgs % args.rounds else 0)
                     for i in range(args.rounds)]
        plans = [partition(sample, m, args.concurrency) for m in per_round if m]
        subs = {seat: await js.pull_subscribe_bind(durable=f"inbox-{seat}", stream=jsq.STREAM)
                for seat in sample}
        # Warm both paths on a few seats first (connections, server caches).
        warm = partition(sample[:args.concurrency], args.concurrency, args.concurrency)
        await bare_round(js, warm, subs)
        await crewlet_round(mb, warm)
        secs = {"bare": 0.0, "crewlet": 0.0}
        cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
        # Rounds, the side that goes first alternating: the machine's noise falls on both.
        for rnd, plan in enumerate(plans):
            first = crewlet_first == (rnd % 2 == 0)
            for side in (("crewlet", "bare") if first else ("bare", "crewlet")):
                secs[side] += await (crewlet_round(mb, plan) if side == "crewlet"
                                     else bare_round(js, plan, subs))
        busy = 100.0 * (cpu_seconds(pid) - cpu0) / (time.perf_counter() - wall0)
        out = {side: args.msgs / s for side, s in secs.items()}
        for sub in subs.values():
            await sub.unsubscribe()
        await mb.close()
        return {"consumers": n, "retention": retention, "create_s": create_s,
                "bare_msgs_s": out["bare"], "crewlet_msgs_s": out["crewlet"], "busy_cpu_pct": busy}
    finally:
        await nc.close()


def run_cliff(binary: str, base: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for i, n in enumerate(args.sizes):
        for j, retention in enumerate(("interest", "limits")):
            servers = single(binary, base, f"cliff-{n}-{retention}")
            start(servers)
            try:
                row = asyncio.run(cliff_case(servers[0].url, servers[0].proc.pid, n, retention, args,
                                             crewlet_first=(i + j) % 2 == 0))
                row["idle_cpu_pct"] = idle_cpu(servers[0].proc.pid, args.idle)
            finally:
                row_stop = stop(servers)
            row["stop_s"] = row_stop
            rows.append(row)
            say(f"{n:6d} consumers, {retention:8}: created in {row['create_s']:.1f} s; "
                f"bare {row['bare_msgs_s']:.0f} msgs/s, crewlet {row['crewlet_msgs_s']:.0f} msgs/s; "
                f"broker CPU {row['busy_cpu_pct']:.0f} % busy, {row['idle_cpu_pct']:.0f} % idle; "
                f"stopped in {row_stop:.1f} s")
    return rows


# --------------------------------------------------------------------------
# (b) creating mailboxes
# --------------------------------------------------------------------------

async def create_single(url: str, count: int) -> dict[str, Any]:
    nc, js = await connect(url, "bench-create")
    try:
        await wait_jetstream([url], 30.0)
        mb = JetStreamMailboxes(js, nc, timeout=JS_TIMEOUT)
        await mb.ensure_streams(replicas=1, max_consumers=count + 100)
        await add_stream(js, BARE, "bare.inbox.", jsq.RETENTION, 1, count + 100)
        seats = [f"seat-{i:05d}" for i in range(count)]
        t0 = time.perf_counter()
        made = await mb.ensure(seats)
        crewlet_s = time.perf_counter() - t0
        bare_s = await bare_create(js, BARE, "bare.inbox.", seats)
        t0 = time.perf_counter()
        again = await mb.ensure(seats)
        again_s = time.perf_counter() - t0
        if (made, again) != (count, 0):
            raise BenchError(f"ensure made {made}, then {again}, of {count}")
        return {"count": count, "crewlet_s": crewlet_s, "bare_s": bare_s, "again_s": again_s}
    finally:
        await nc.close()


async def create_cluster(urls: list[str], count: int, sample: int) -> dict[str, Any]:
    await wait_jetstream(urls, 30.0)
    nc_a, js_a = await connect(urls[0], "bench-first")
    nc_b, js_b = await connect(urls[2], "bench-joining")
    try:
        mb_a = JetStreamMailboxes(js_a, nc_a, timeout=JS_TIMEOUT)
        await retrying("ensure_streams on the cluster", lambda: mb_a.ensure_streams(
            replicas=3, max_consumers=count + 100))
        await add_stream(js_a, BARE, "bare.inbox.", jsq.RETENTION, 3, count + 2 * sample + 100)
        seats = [f"seat-{i:05d}" for i in range(count)]
        say(f"R3: creating {count} mailboxes (the first node's boot)")
        t0 = time.perf_counter()
        made = await mb_a.ensure(seats)
        first_s = time.perf_counter() - t0
        mb_b = JetStreamMailboxes(js_b, nc_b, timeout=JS_TIMEOUT)
        t0 = time.perf_counter()
        joined = await mb_b.ensure(seats)
        joining_s = time.perf_counter() - t0
        if (made, joined) != (count, 0):
            raise BenchError(f"R3 ensure made {made}, then {joined}, of {count}")
        say(f"R3: a naive boot re-sending all {count} creates")
        t0 = time.perf_counter()
        await bare_create(js_b, jsq.STREAM, jsq.SUBJECT, seats)
        naive_s = time.perf_counter() - t0
        say(f"R3: {sample} consumers with file storage, {sample} with mem_storage (bare)")
        file_s = await bare_create(js_a, BARE, "bare.inbox.", [f"f{i:05d}" for i in range(sample)])
        mem_s = await bare_create(js_a, BARE, "bare.inbox.", [f"m{i:05d}" for i in range(sample)],
                                  mem_storage=True)
        return {"count": count, "first_s": first_s, "joining_s": joining_s, "naive_rejoin_s": naive_s,
                "sample": sample, "file_s": file_s, "mem_s": mem_s}
    finally:
        await nc_a.close()
        await nc_b.close()


def run_create(binary: str, base: str, args: argparse.Namespace) -> dict[str, Any]:
    servers = single(binary, base, "create-solo")
    start(servers)
    try:
        out: dict[str, Any] = {"single": asyncio.run(create_single(servers[0].url, args.create))}
    finally:
        stop(servers)
    s = out["single"]
    say(f"single server: ensure({args.create}) {s['crewlet_s']:.2f} s (bare {s['bare_s']:.2f} s), "
        f"again {s['again_s'] * 1000:.0f} ms")
    if args.skip_cluster:
        return out
    servers = cluster(binary, os.path.join(base, "r3"))
    start(servers)
    try:
        out["cluster"] = asyncio.run(create_cluster([x.url for x in servers], args.create, args.r3_sample))
    finally:
        stop(servers)
    c = out["cluster"]
    say(f"R3: first ensure {c['first_s']:.1f} s, joining ensure {c['joining_s'] * 1000:.0f} ms, "
        f"naive re-create {c['naive_rejoin_s']:.1f} s; {c['sample']} file {c['file_s']:.1f} s, "
        f"mem {c['mem_s']:.1f} s")
    return out


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def print_text(rep: dict[str, Any]) -> None:
    cfg = rep["config"]
    print(f"crewlet mailbox benchmark  (python {cfg['python']}, {cfg['cpus']} cpus, "
          f"nats-server {cfg['nats_server']}, nats-py {cfg['nats_py']}, file storage)")
    print()
    print(f"(a) retention cliff, one server: {cfg['msgs']} x (publish -> fetch(1) -> confirmed ack) over "
          f"{cfg['seats']} random seats,")
    print(f"    {cfg['concurrency']} at once, {cfg['rounds']} interleaved rounds (msgs/s); broker CPU "
          f"(100 % = one core) while both sides ran, and idle over {cfg['idle']:g} s after")
    print(f"    {'consumers':>9} {'retention':9} {'create s':>8} {'bare':>8} {'crewlet':>8} "
          f"{'crewlet/bare':>12} {'busy CPU':>9} {'idle CPU':>9} {'stop s':>7}")
    for r in rep["cliff"]:
        print(f"    {r['consumers']:9d} {r['retention']:9} {r['create_s']:8.1f} {r['bare_msgs_s']:8.0f} "
              f"{r['crewlet_msgs_s']:8.0f} {r['crewlet_msgs_s'] / r['bare_msgs_s']:11.2f}x "
              f"{r['busy_cpu_pct']:8.0f}% {r['idle_cpu_pct']:8.0f}% {r['stop_s']:7.1f}")
    print("    bare = js.publish, a bound pull subscription's fetch(1), ack_sync; crewlet = "
          "Mailboxes.send, Mailbox.next, ack")
    print("    (stop s: SIGTERM to exit; at the grace of "
          f"{STOP_GRACE:g} s it was SIGKILLed)")
    print()
    c = rep["create"]
    s = c["single"]
    print(f"(b) creating {s['count']} mailboxes (seconds)")
    print(f"    single server, fresh:        crewlet ensure {s['crewlet_s']:6.2f}   bare add_consumer "
          f"{s['bare_s']:6.2f}   {s['crewlet_s'] / s['bare_s']:5.2f}x")
    print(f"    single server, all existing: crewlet ensure {s['again_s']:6.3f}")
    if "cluster" in c:
        k = c["cluster"]
        print(f"    R3 cluster, first node:      crewlet ensure {k['first_s']:6.2f}")
        print(f"    R3 cluster, joining node:    crewlet ensure {k['joining_s']:6.3f}   naive re-create "
              f"{k['naive_rejoin_s']:6.2f}   {k['joining_s'] / k['naive_rejoin_s']:5.3f}x")
        print(f"    R3, {k['sample']} consumers (bare):   file storage {k['file_s']:6.2f}   mem_storage "
              f"{k['mem_s']:6.2f}   ({k['sample'] / k['file_s']:.0f} vs {k['sample'] / k['mem_s']:.0f} /s)")
    else:
        print("    R3 cluster: skipped (--skip-cluster)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,5000,10000",
                    help="consumer counts for the retention cliff (default 1000,5000,10000)")
    ap.add_argument("--msgs", type=int, default=2000, help="messages per side and case (default 2000)")
    ap.add_argument("--seats", type=int, default=200, help="random seats they go to (default 200)")
    ap.add_argument("--concurrency", type=int, default=32, help="at once (default 32)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="interleave crewlet and the baseline in this many rounds (default 4)")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measured (default 5)")
    ap.add_argument("--create", type=int, default=1000, help="mailboxes created in (b) (default 1000)")
    ap.add_argument("--r3-sample", type=int, default=300,
                    help="R3 consumers created per storage kind in (b) (default 300)")
    ap.add_argument("--skip-cluster", action="store_true", help="no R3 cluster in (b)")
    ap.add_argument("--nats-server", help="the nats-server binary (default: next to python, then $PATH)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    add_smoke(ap, argv, {"sizes": "20", "msgs": 20, "seats": 5, "concurrency": 4, "rounds": 1,
                         "idle": 0.2, "create": 20, "r3_sample": 5})
    args = ap.parse_args(argv)
    try:
        args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        ap.error("--sizes takes numbers separated by commas")
    if not args.sizes or min(args.sizes) < 1 or args.msgs < 1 or args.concurrency < 1 or args.seats < 1 \
            or args.rounds < 1:
        ap.error("sizes, --msgs, --seats, --concurrency and --rounds must be >= 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # crewlet's own events (mailboxes created, ...) would mix with the table.
    log.configure(node=None, role="bench", level="warning", fmt="json", stream=sys.stderr)
    binary = find_nats_server(args.nats_server)
    base = tempfile.mkdtemp(prefix="cwmbox", dir="/tmp")
    try:
        say(f"store {base}; cliff sizes {args.sizes}")
        rep = {"cliff": run_cliff(binary, base, args), "create": run_create(binary, base, args),
               "config": {"msgs": args.msgs, "seats": args.seats, "concurrency": args.concurrency,
                          "rounds": args.rounds, "idle": args.idle, "python": sys.version.split()[0],
                          "cpus": os.cpu_count(),
                          "nats_server": server_version(binary), "nats_py": NATS_PY_VERSION}}
    except BenchError as exc:
        print(f"bench/mailboxes.py: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return emit(rep, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
