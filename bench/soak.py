"""Soak: a fleet at fast timings runs for minutes, and nothing on the broker grows.

Three real crewletd nodes share one bare ``nats-server -js`` (``stream.type:
nats``) with the fleet tests' timings (heartbeat 1 s, lease TTL 3 s, sweep
0.5 s — ten times the design's pace, so ten times the sweeps), the sample
company (30 seats), mail sent to a random seat twice a second, and one
node's seats child killed every ``--kill-every`` seconds (each restart opens
its watches anew). Every ``--sample`` seconds the broker's streams are read.

It prints, per stream, its consumers right after warm-up, the most seen
after it, and at the end, beside the count a *bare* nats-server holds for
the same streams with no crewlet running (0: the baseline of "nothing left
behind"); ``flat`` means the most seen after warm-up is no more than the
warm-up count plus the processes restarted within one watch's inactive
threshold. Before issue 10, ``KV_leases`` grew by two consumers per sweep
per node (~240 a minute here) until the server refused its 1,001st.

    python bench/soak.py [--minutes 10] [--json]
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

import nats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (add_smoke, BenchError, Crewletd, NatsServer, child_env, emit,  # noqa: E402
                          find_nats_server, say)
from crewlet.company.load import load_company  # noqa: E402
from crewlet.coord.buckets import WATCH_INACTIVE  # noqa: E402
from crewlet.queue.jetstream import JetStreamMailboxes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPANY = os.path.join(ROOT, "etc", "company.yaml")
FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
NODES = 3
WARM_UP = 60.0  # seconds before the counts taken as the reference


async def _consumers(url: str) -> dict[str, int]:
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        return {i.config.name: i.state.consumer_count for i in await nc.jetstream(timeout=5).streams_info()}
    finally:
        await nc.close()


async def _send(url: str, seats: list[str], until: float) -> int:
    """Mail to a random seat twice a second until *until*; how many were sent."""
    nc = await nats.connect(url)
    sent = 0
    try:
        mailboxes = JetStreamMailboxes(nc.jetstream(timeout=5), nc)
        while time.monotonic() < until:
            await mailboxes.send(random.choice(seats), f"soak {sent}", trigger=f"soak-{sent}")
            sent += 1
            await asyncio.sleep(0.5)
    finally:
        await nc.close()
    return sent


# Seconds the nodes are given to make the company's streams after the apply.
APPLY_WAIT = 60.0


def _kill_a_seats_child(nodes: list[Crewletd]) -> bool:
    node = random.choice(nodes)
    for child in (node.status() or {}).get("children", []):
        if child["name"] == "seats" and child.get("pid"):
            os.kill(child["pid"], signal.SIGKILL)
            return True
    return False


def run(args: argparse.Namespace) -> dict[str, Any]:
    binary = find_nats_server(args.nats_server)
    base = tempfile.mkdtemp(prefix="cwsoak", dir="/tmp")
    server = NatsServer(binary, os.path.join(base, "nats")).start()
    nodes: list[Crewletd] = []
    try:
        bare = asyncio.run(_consumers(server.url))  # nothing of crewlet's yet: the baseline
        for i in range(args.nodes):
            node = Crewletd(os.path.join(base, f"n{i}"), {
                "node": {"id": f"soak{i}"}, "fleet": FAST,
                "stream": {"type": "nats", "servers": [server.url]},
                "supervisor": {"backoff_min": 0.05, "backoff_max": 0.5, "stable_after": 1}})
            node.start()
            nodes.append(node)
        out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "crewletctl"),
                              "-c", nodes[0].config_path, "apply", COMPANY],
                             capture_output=True, text=True, timeout=120, env=child_env())
        if out.returncode:
            raise BenchError(f"apply failed: {out.stderr}")
        seats = [seat.name for seat in load_company(COMPANY).seats]
        # The window starts once the company's streams exist: on a loaded machine the
        # nodes' mailboxes can take longer than a smoke run's whole window.
        ready_by = time.monotonic() + APPLY_WAIT
        while not {"AGENTS", "KV_leases"} <= set(asyncio.run(_consumers(server.url))):
            if time.monotonic() > ready_by:
                raise BenchError(f"the company's streams were not made within {APPLY_WAIT:g}s")
            time.sleep(0.2)
        started = time.monotonic()
        end = started + args.minutes * 60
        sender = _thread_run(_send(server.url, seats, end))
        samples: list[tuple[float, dict[str, int]]] = []
        kills, next_kill = 0, started + args.kill_every
        while time.monotonic() < end:
            for node in nodes:
                node.check_alive()
            samples.append((time.monotonic() - started, asyncio.run(_consumers(server.url))))
            say(f"t={samples[-1][0]:.0f}s " + " ".join(f"{k}={v}" for k, v in sorted(samples[-1][1].items())
                                                        if v))
            if time.monotonic() >= next_kill:
                kills += _kill_a_seats_child(nodes)
                next_kill += args.kill_every
            time.sleep(args.sample)
        sent = sender.result()
    finally:
        stops = [node.stop() for node in nodes]
        server.stop()
    shutil.rmtree(base, ignore_errors=True)  # a failed run keeps it: the nodes' logs
    warm = next((c for t, c in samples if t >= args.warm_up), samples[-1][1] if samples else {})
    after = [c for t, c in samples if t >= args.warm_up]
    # A killed seats child's watches linger up to WATCH_INACTIVE beside its successor's.
    slack = args.nodes * 2 * max(1, round(WATCH_INACTIVE / args.kill_every + 1))
    streams = {}
    for name in sorted({n for _, c in samples for n in c}):
        most = max((c.get(name, 0) for c in after), default=None)
        streams[name] = {"bare": bare.get(name, 0), "warm": warm.get(name, 0), "max_after": most,
                         "end": samples[-1][1].get(name, 0) if samples else None,
                         "flat": most is not None and most <= warm.get(name, 0) + slack}
    return {"minutes": args.minutes, "nodes": args.nodes, "mail_sent": sent, "seats_children_killed": kills,
            "samples": len(samples), "slack": slack, "streams": streams,
            "node_stop_seconds": stops, "flat": all(s["flat"] for s in streams.values())}


def _thread_run(coro):
    """Run *coro* on a loop of its own in a thread; ``.result()`` waits for it."""
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(1)
    future = pool.submit(asyncio.run, coro)
    pool.shutdown(wait=False)
    return future


def _print(report: dict[str, Any]) -> None:
    print(f"soak: {report['nodes']} nodes, {report['minutes']:g} min at heartbeat 1 s / sweep 0.5 s, "
          f"{report['mail_sent']} mails, {report['seats_children_killed']} seats children killed")
    print(f"{'stream':<14}{'bare':>6}{'warm-up':>9}{'max after':>11}{'end':>6}  verdict")
    for name, s in report["streams"].items():
        print(f"{name:<14}{s['bare']:>6}{s['warm']:>9}{s['max_after'] if s['max_after'] is not None else '-':>11}"
              f"{s['end'] if s['end'] is not None else '-':>6}  {'flat' if s['flat'] else 'GROWS'}")
    print(f"every stream flat (within {report['slack']} of its warm-up count): "
          f"{'yes' if report['flat'] else 'NO'}; nodes stopped in "
          + ", ".join(f"{s:.1f}s" if s is not None else "?" for s in report["node_stop_seconds"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between reads of the streams")
    ap.add_argument("--kill-every", type=float, default=30.0, help="seconds between seats-child kills")
    ap.add_argument("--nats-server", help="the nats-server binary (default: as crewletd finds it)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nodes", type=int, default=NODES, help=f"nodes on the one broker (default {NODES})")
    ap.add_argument("--warm-up", type=float, default=WARM_UP,
                    help=f"seconds before the counts taken as the reference (default {WARM_UP:g})")
    add_smoke(ap, argv, {"minutes": 0.05, "sample": 1.0, "kill_every": 1.5, "nodes": 1, "warm_up": 1.0})
    args = ap.parse_args(argv)
    # SIGTERM ends the run through the finally blocks (the servers and nodes it started stop), like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return emit(run(args), args.json, _print)
    except BenchError as exc:
        say(f"failed: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
