#!/usr/bin/env python3
"""Benchmark: what a crewlet lease costs beside bare nats-py KV operations.

Starts its own ``nats-server -js`` on free 127.0.0.1 ports (store in a temp
dir under /tmp; ``--cluster``: three members routed on loopback, buckets with
3 replicas, both streams' leaders moved to the same member) and measures, in
one run:

1. claim throughput: ``Leases.claim`` of distinct keys, sequential, ops/s,
   beside bare ``kv.create(key, value, msg_ttl=45)`` of as many distinct keys;
2. renew throughput: ``Leases.renew`` of every held lease, beside a bare
   compare-and-set with TTL (``js.publish`` to ``$KV.bench_raw.<key>`` with
   ``Nats-Expected-Last-Subject-Sequence`` and ``msg_ttl=45``);
3. release throughput: ``Leases.release`` beside bare ``kv.delete(key, last=rev)``;
4. hand-over of one seat between two nodes (two ``Leases`` on two NATS
   connections): A holds ``seat.h<i>``; B watches ``seat.>`` with a KV
   watcher; t0 just before A's release, t1 once B's claim succeeded after its
   watcher showed the delete (a refused claim is retried at once and counted:
   in a cluster a direct get may be answered by a follower that has not yet
   applied the delete). Beside the same dance in bare nats-py (A
   ``kv.delete``, B's watcher sees it, B ``kv.create``).

crewlet writes to the ``leases`` bucket (``buckets.ensure``); the baseline to
``bench_raw``, created with the same settings (history 1, direct gets, limit
marker TTL 60 s, same replicas). Both sides write the same JSON value and
never-written keys, and all measurements are interleaved over rounds (the
side that goes first alternates), so the machine's noise falls on both.
Throughput ratios are crewlet/bare ops/s (target >= 50 %), latency ratios
crewlet/bare ms; targets (and the hand-over median <= 100 ms) are
informational. Exit status: 0 unless the benchmark itself broke.

    /tmp/venv/bin/python bench/leases.py [--ops 2000] [--handovers 100] [--cluster] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import nats  # noqa: E402
from nats.aio.client import __version__ as NATS_PY_VERSION  # noqa: E402
from nats.errors import TimeoutError as NatsTimeoutError  # noqa: E402
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError  # noqa: E402

from bench import common  # noqa: E402
from bench.common import add_smoke, BenchError, emit, free_ports, ratio, say, split, summary  # noqa: E402,F401
from crewlet.coord import buckets  # noqa: E402
from crewlet.coord.lease import Held, Leases  # noqa: E402

RAW = "bench_raw"
TTL = 45                   # seconds, on both sides
TARGET_THROUGHPUT_RATIO = 0.5
TARGET_HANDOVER_MEDIAN_MS = 100.0
WATCH_TIMEOUT = 10.0       # seconds a watcher may take to show an expected entry
WARMUP_OPS = 50
WARMUP_HANDOVERS = 3
CLAIM_PATIENCE = 5.0       # seconds B keeps retrying a refused claim after the delete showed
OPS = ("claim", "renew", "release")


def value(node: str, boot: str, token: int | None) -> bytes:
    """The bytes a lease holds (the same shape as crewlet's), for the baseline too."""
    return json.dumps({"node": node, "boot": boot, "token": token}, separators=(",", ":")).encode()


# --------------------------------------------------------------------------
# The servers
# --------------------------------------------------------------------------

def find_nats_server(explicit: str | None) -> str:
    candidates = [explicit] if explicit else [
        os.environ.get("CREWLET_NATS_SERVER"),
        os.path.join(os.path.dirname(sys.executable), "nats-server"),
        shutil.which("nats-server")]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise BenchError("nats-server not found (give --nats-server)")


class Server:
    """One nats-server we started, stopped by its pid."""

    def __init__(self, binary: str, name: str, base: str, port: int,
                 cluster_port: int | None = None, routes: list[str] | None = None):
        self.binary, self.name, self.port = binary, name, port
        self.dir = os.path.join(base, name)
        self.log_path = os.path.join(self.dir, "nats.log")
        self.argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-n", name,
                     "-js", "-sd", os.path.join(self.dir, "js")]
        if cluster_port is not None:
            self.argv += ["--cluster", f"nats://127.0.0.1:{cluster_port}", "--cluster_name", "bench"]
            if routes:
                self.argv += ["--routes", ",".join(routes)]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # A session of its own: a Ctrl-C reaches us, and we stop it in order.
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise BenchError(f"nats-server {self.name} exited with {self.proc.returncode}:\n"
                                 + self.log_tail())
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise BenchError(f"nats-server {self.name} not listening within {timeout:g}s:\n"
                                 + self.log_tail())
            time.sleep(0.05)

    def log_tail(self, n: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.terminate()
            except ProcessLookupError:
                pass

    def reap(self, timeout: float) -> None:
        """Wait for the SIGTERM'd server; SIGKILL it (by pid) if it lingers."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            say(f"nats-server {self.name} (pid {self.proc.pid}) did not stop: SIGKILL")
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait(10)


def server_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.strip().split()[-1].lstrip("v")
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


def make_servers(binary: str, base: str, cluster: bool) -> list[Server]:
    if not cluster:
        return [Server(binary, "solo", base, free_ports(1)[0])]
    ports = free_ports(6)
    client, route = ports[:3], ports[3:]
    urls = [f"nats://127.0.0.1:{p}" for p in route]
    return [Server(binary, f"m{i}", base, client[i], route[i], [u for j, u in enumerate(urls) if j != i])
            for i in range(3)]


# --------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------

async def wait_jetstream(urls: list[str], timeout: float) -> None:
    """Until JetStream answers on every server (the cluster's meta group has a leader)."""
    deadline = time.monotonic() + timeout
    for url in urls:
        await common.wait_jetstream(url, max(0.1, deadline - time.monotonic()))


async def retrying(what: str, make, timeout: float = 30.0):
    """*make()* until it works (a fresh cluster may refuse the first stream)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await make()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise BenchError(f"{what}: {type(exc).__name__}: {exc}") from exc
            await asyncio.sleep(0.5)


async def next_entry(watcher, key: str, deleted: bool):
    """The watcher's next entry for *key* that is (or is not) a delete/purge."""
    deadline = time.monotonic() + WATCH_TIMEOUT
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            entry = await watcher.updates(timeout=left)
        except NatsTimeoutError:
            break
        if entry is None or entry.key != key:
            continue
        if (entry.operation in ("DEL", "PURGE")) == deleted:
            return entry
    raise BenchError(f"the watcher did not show {'the delete of' if deleted else 'a value for'} "
                     f"{key} within {WATCH_TIMEOUT:g}s")


class Bench:
    """Both nodes' connections, the two buckets, and one measurement per method."""

    def __init__(self, urls: list[str], replicas: int):
        self.urls = urls
        self.replicas = replicas
        self.conns: list[Any] = []
        self.watchers: list[Any] = []
        self.serial = 0
        self.leaders: dict[str, str | None] = {}

    async def open(self) -> None:
        # Node A on the first server, node B on the second (cluster) or the same.
        url_a, url_b = self.urls[0], self.urls[1 % len(self.urls)]
        self.nc_a = await nats.connect(url_a, name="bench-a", connect_timeout=2, allow_reconnect=False)
        self.conns.append(self.nc_a)
        self.nc_b = await nats.connect(url_b, name="bench-b", connect_timeout=2, allow_reconnect=False)
        self.conns.append(self.nc_b)
        self.js_a, self.js_b = self.nc_a.jetstream(timeout=5), self.nc_b.jetstream(timeout=5)
        await retrying("creating the leases bucket",
                       lambda: buckets.ensure(self.js_a, buckets.LEASES, self.replicas))
        await retrying(f"creating the {RAW} bucket",
                       lambda: self.js_a.create_key_value(bucket=RAW, history=1, direct=True,
                                                          limit_marker_ttl=60, replicas=self.replicas))
        if self.replicas > 1:
            self.leaders = await self.align_leaders()
        self.kv_a = await self.js_a.key_value(RAW)
        self.kv_b = await self.js_b.key_value(RAW)
        self.lease_a = Leases(self.js_a, "bench-a", "boot-a", ttl=TTL)
        self.lease_b = Leases(self.js_b, "bench-b", "boot-b", ttl=TTL)
        # B's watchers: the way a seats node learns of a release early.
        leases_kv_b = await self.js_b.key_value(buckets.LEASES.name)
        self.watch_crewlet = await leases_kv_b.watch("seat.>")
        self.watchers.append(self.watch_crewlet)
        self.watch_bare = await self.kv_b.watch("seat.>")
        self.watchers.append(self.watch_bare)

    async def leader(self, stream: str) -> str | None:
        info = await self.js_a.stream_info(stream)
        return info.cluster.leader if info.cluster else None

    async def align_leaders(self, timeout: float = 30.0) -> dict[str, str | None]:
        """Move the baseline stream's leader to where the leases stream's is, so
        neither side's writes take a hop the other's do not."""
        want = f"KV_{buckets.LEASES.name}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                target, current = await self.leader(want), await self.leader(f"KV_{RAW}")
                if target is not None and target == current:
                    return {"leases": target, RAW: current}
                if target is not None and current is not None:
                    await self.nc_a.request(f"$JS.API.STREAM.LEADER.STEPDOWN.KV_{RAW}",
                                            json.dumps({"placement": {"preferred": target}}).encode(),
                                            timeout=5)
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"could not put the {RAW} stream's leader beside the leases one's")
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        for w in self.watchers:
            try:
                await asyncio.wait_for(w.stop(), 5)
            except Exception:
                pass
        for nc in self.conns:
            try:
                await asyncio.wait_for(nc.close(), 5)
            except Exception:
                pass

    def keys(self, tag: str, n: int) -> list[str]:
        self.serial += 1
        return [f"tp.{tag}{self.serial}.k{i}" for i in range(n)]

    # --------------------------------------------------------- throughput

    async def crewlet_claim(self, keys: list[str]) -> tuple[float, list[Held]]:
        held = []
        t0 = time.perf_counter()
        for key in keys:
            h = await self.lease_a.claim(key)
            if h is None:
                raise BenchError(f"Leases.claim({key}) found the key held")
            held.append(h)
        return time.perf_counter() - t0, held

    async def crewlet_renew(self, held: list[Held]) -> tuple[float, list[Held]]:
        out = []
        t0 = time.perf_counter()
        for h in held:
            r = await self.lease_a.renew(h)
            if r is None:
                raise BenchError(f"Leases.renew({h.key}) lost the lease")
            out.append(r)
        return time.perf_counter() - t0, out

    async def crewlet_release(self, held: list[Held]) -> float:
        t0 = time.perf_counter()
        for h in held:
            if not await self.lease_a.release(h):
                raise BenchError(f"Leases.release({h.key}) found the lease not ours")
        return time.perf_counter() - t0

    async def bare_claim(self, keys: list[str]) -> tuple[float, list[tuple[str, int]]]:
        val = value("bench-a", "boot-a", None)
        held = []
        t0 = time.perf_counter()
        for key in keys:
            held.append((key, await self.kv_a.create(key, val, msg_ttl=TTL)))
        return time.perf_counter() - t0, held

    async def bare_renew(self, held: list[tuple[str, int]]) -> tuple[float, list[tuple[str, int]]]:
        out = []
        t0 = time.perf_counter()
        for key, rev in held:
            # The same value crewlet writes from the first renewal on (with its token).
            ack = await self.js_a.publish(f"$KV.{RAW}.{key}", value("bench-a", "boot-a", rev),
                                          headers={"Nats-Expected-Last-Subject-Sequence": str(rev)},
                                          msg_ttl=TTL)
            out.append((key, ack.seq))
        return time.perf_counter() - t0, out

    async def bare_release(self, held: list[tuple[str, int]]) -> float:
        t0 = time.perf_counter()
        for key, rev in held:
            await self.kv_a.delete(key, last=rev)
        return time.perf_counter() - t0

    async def throughput_round(self, n: int, crewlet_first: bool) -> dict[str, dict[str, float]]:
        """claim, renew, release of *n* fresh keys on each side; seconds per op and side."""
        out: dict[str, dict[str, float]] = {op: {} for op in OPS}
        c_keys, b_keys = self.keys("c", n), self.keys("b", n)
        sides = ("crewlet", "bare") if crewlet_first else ("bare", "crewlet")
        held: dict[str, list] = {}
        for side in sides:
            if side == "crewlet":
                out["claim"][side], held[side] = await self.crewlet_claim(c_keys)
            else:
                out["claim"][side], held[side] = await self.bare_claim(b_keys)
        for side in sides:
            if side == "crewlet":
                out["renew"][side], held[side] = await self.crewlet_renew(held[side])
            else:
                out["renew"][side], held[side] = await self.bare_renew(held[side])
        for side in sides:
            if side == "crewlet":
                out["release"][side] = await self.crewlet_release(held[side])
            else:
                out["release"][side] = await self.bare_release(held[side])
        return out

    # ----------------------------------------------------------- hand-over

    @staticmethod
    async def until_claimed(key: str, attempt) -> tuple[Any, int]:
        """*attempt()* until it returns a claim; (that claim, attempts refused).

        In an R3 cluster a direct get may be answered by a follower that has
        not applied the delete the watcher (fed by the leader) just showed:
        the key then looks held (or never written) and the claim is refused.
        """
        deadline = time.monotonic() + CLAIM_PATIENCE
        refused = 0
        while True:
            got = await attempt()
            if got is not None:
                return got, refused
            refused += 1
            if time.monotonic() > deadline:
                raise BenchError(f"B's claim of {key} refused {refused} times over "
                                 f"{CLAIM_PATIENCE:g}s after the delete showed")

    async def crewlet_handover(self, key: str) -> tuple[float, float, int]:
        """(release -> B's claim succeeded, release -> B's watcher showed the
        delete, ms; B's claims refused before that)."""
        held = await self.lease_a.claim(key)
        if held is None:
            raise BenchError(f"A could not claim {key}")
        await next_entry(self.watch_crewlet, key, deleted=False)     # B knows A holds it
        t0 = time.perf_counter()
        if not await self.lease_a.release(held):
            raise BenchError(f"A's release of {key} found it not A's")
        await next_entry(self.watch_crewlet, key, deleted=True)
        t_seen = time.perf_counter()
        mine, refused = await self.until_claimed(key, lambda: self.lease_b.claim(key))
        t1 = time.perf_counter()
        # Untimed: B gives it back, and the watcher is drained up to that.
        await next_entry(self.watch_crewlet, key, deleted=False)
        await self.lease_b.release(mine)
        await next_entry(self.watch_crewlet, key, deleted=True)
        return (t1 - t0) * 1000.0, (t_seen - t0) * 1000.0, refused

    async def bare_handover(self, key: str) -> tuple[float, float, int]:
        rev = await self.kv_a.create(key, value("bench-a", "boot-a", None), msg_ttl=TTL)
        await next_entry(self.watch_bare, key, deleted=False)
        t0 = time.perf_counter()
        await self.kv_a.delete(key, last=rev)
        await next_entry(self.watch_bare, key, deleted=True)
        t_seen = time.perf_counter()
        async def create() -> int | None:
            try:
                return await self.kv_b.create(key, value("bench-b", "boot-b", None), msg_ttl=TTL)
            except (KeyWrongLastSequenceError, KeyNotFoundError):  # the same stale reads
                return None
        rev_b, refused = await self.until_claimed(key, create)
        t1 = time.perf_counter()
        await next_entry(self.watch_bare, key, deleted=False)
        await self.kv_b.delete(key, last=rev_b)
        await next_entry(self.watch_bare, key, deleted=True)
        return (t1 - t0) * 1000.0, (t_seen - t0) * 1000.0, refused

    async def handover_pair(self, crewlet_first: bool) -> dict[str, tuple[float, float, int]]:
        self.serial += 1
        key = f"seat.h{self.serial}"          # never written before, on either side
        out = {}
        for side in (("crewlet", "bare") if crewlet_first else ("bare", "crewlet")):
            out[side] = await (self.crewlet_handover(key) if side == "crewlet"
                               else self.bare_handover(key))
        return out


async def measure(urls: list[str], args: argparse.Namespace, replicas: int) -> dict[str, Any]:
    await wait_jetstream(urls, 30.0)
    bench = Bench(urls, replicas)
    try:
        await bench.open()
        say(f"buckets ready (replicas {replicas}); warming up")
        await bench.throughput_round(WARMUP_OPS, True)
        for i in range(WARMUP_HANDOVERS):
            await bench.handover_pair(i % 2 == 0)

        rounds = max(1, min(args.rounds, args.ops, args.handovers))
        tp: dict[str, dict[str, list[dict[str, float]]]] = {
            op: {"crewlet": [], "bare": []} for op in OPS}
        hand: dict[str, list[dict[str, float]]] = {"crewlet": [], "bare": []}
        for rnd, (n_ops, n_hand) in enumerate(zip(split(args.ops, rounds),
                                                  split(args.handovers, rounds)), 1):
            # The side that goes first alternates from round to round ...
            got = await bench.throughput_round(n_ops, crewlet_first=rnd % 2 == 1)
            for op in OPS:
                for side in ("crewlet", "bare"):
                    tp[op][side].append({"ops": n_ops, "s": got[op][side]})
            # ... and from hand-over to hand-over.
            for j in range(n_hand):
                pair = await bench.handover_pair(crewlet_first=(j + rnd) % 2 == 0)
                for side, (total, seen, refused) in pair.items():
                    hand[side].append({"ms": total, "seen_ms": seen, "refused": refused})
            say(f"round {rnd}/{rounds}: {n_ops} keys per side through claim/renew/release, "
                f"{n_hand} hand-overs per side "
                f"(claim {n_ops / got['claim']['crewlet']:.0f} vs {n_ops / got['claim']['bare']:.0f} ops/s)")
        return {"throughput": tp, "handovers": hand, "rounds": rounds, "leaders": bench.leaders}
    finally:
        await bench.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    binary = find_nats_server(args.nats_server)
    base = tempfile.mkdtemp(prefix="cwlease", dir="/tmp")
    servers = make_servers(binary, base, args.cluster)
    replicas = 3 if args.cluster else 1
    broke = False
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_listening(15.0)
        say(f"nats-server {'cluster of 3' if args.cluster else 'single'} on "
            + ", ".join(f"{s.name}=:{s.port} (pid {s.proc.pid})" for s in servers) + f", store {base}")
        raw = asyncio.run(measure([s.url for s in servers], args, replicas))
        raw["config"] = {"ops": args.ops, "handovers": args.handovers, "rounds": raw.pop("rounds"),
                         "cluster": args.cluster, "servers": len(servers), "replicas": replicas,
                         "stream_leaders": raw.pop("leaders"),
                         "ttl_s": TTL, "python": sys.version.split()[0], "cpus": os.cpu_count(),
                         "nats_server": server_version(binary), "nats_py": NATS_PY_VERSION}
        return raw
    except BenchError:
        broke = True
        raise
    finally:
        say("stopping nats-server" + ("s" if len(servers) > 1 else ""))
        for s in servers:
            s.terminate()
        for s in servers:
            s.reap(15.0)
        if broke or args.keep:
            say(f"kept {base} (nats.log of each server is there)")
        else:
            shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def build_report(raw: dict[str, Any]) -> dict[str, Any]:
    through: dict[str, Any] = {}
    for op, sides in raw["throughput"].items():
        entry: dict[str, Any] = {}
        for side, rounds in sides.items():
            ops, secs = sum(r["ops"] for r in rounds), sum(r["s"] for r in rounds)
            entry[side] = {"ops": ops, "seconds": secs, "ops_per_s": ops / secs if secs else None,
                           "per_round_ops_per_s": [r["ops"] / r["s"] for r in rounds]}
        entry["ratio"] = ratio(entry["crewlet"]["ops_per_s"], entry["bare"]["ops_per_s"])
        entry["per_round_ratio"] = [ratio(c, b) for c, b in zip(entry["crewlet"]["per_round_ops_per_s"],
                                                                  entry["bare"]["per_round_ops_per_s"])]
        entry["pass"] = entry["ratio"] is not None and entry["ratio"] >= TARGET_THROUGHPUT_RATIO
        through[op] = entry
    hand: dict[str, Any] = {}
    for side, samples in raw["handovers"].items():
        hand[side] = {"total_ms": summary([s["ms"] for s in samples]),
                      "seen_ms": summary([s["seen_ms"] for s in samples]),
                      "first_claim_refused": sum(1 for s in samples if s["refused"]),
                      "claims_refused": sum(s["refused"] for s in samples)}
    c, b = hand["crewlet"]["total_ms"], hand["bare"]["total_ms"]
    hand["ratio"] = {"median": ratio(c["median"], b["median"]), "p95": ratio(c["p95"], b["p95"])}
    return {
        "throughput": through,
        "handover": hand,
        "targets": {
            **{f"{op}_throughput_ratio": {"target": TARGET_THROUGHPUT_RATIO, "value": through[op]["ratio"],
                                          "pass": through[op]["pass"]} for op in OPS},
            "handover_median_ms": {"target": TARGET_HANDOVER_MEDIAN_MS, "value": c["median"],
                                   "pass": c["median"] is not None
                                   and c["median"] <= TARGET_HANDOVER_MEDIAN_MS},
        },
        "not_measured": "the successor fetching the seat's mailbox (waits for the mailbox issue)",
        "samples": {"handovers": raw["handovers"], "throughput": raw["throughput"]},
        "config": raw["config"],
    }


def _x(r: float | None) -> str:
    return "   n/a" if r is None else f"{r:6.2f}x"


def print_text(rep: dict[str, Any]) -> None:
    cfg = rep["config"]
    where = (f"3-member cluster, R{cfg['replicas']}, A on m0 / B on m1, both stream leaders on "
             f"{cfg['stream_leaders'].get('leases')}" if cfg["cluster"]
             else "single server, R1")
    print(f"crewlet lease benchmark  (python {cfg['python']}, {cfg['cpus']} cpus, "
          f"nats-server {cfg['nats_server']}, nats-py {cfg['nats_py']}, {where}, "
          f"{cfg['rounds']} interleaved rounds)")
    print()
    print("1-3. throughput, sequential on one connection, distinct never-written keys, TTL "
          f"{cfg['ttl_s']} s (ops/s)")
    print(f"   {'':9} {'n':>5} {'crewlet':>10} {'bare':>10}   crewlet/bare   per round")
    labels = {"claim": ("Leases.claim", "kv.create"),
              "renew": ("Leases.renew", "publish CAS+TTL"),
              "release": ("Leases.release", "kv.delete(last=)")}
    for op, t in rep["throughput"].items():
        rounds = " ".join(f"{r:.2f}" for r in t["per_round_ratio"])
        print(f"   {op:9} {t['crewlet']['ops']:5d} {t['crewlet']['ops_per_s']:10.0f} "
              f"{t['bare']['ops_per_s']:10.0f}   {_x(t['ratio']):>12}   {rounds}")
    print("   " + "; ".join(f"{op}: {c} vs {b}" for op, (c, b) in labels.items()))
    print("   (Leases.claim writes first: 1 round trip for a never-written key, like kv.create;"
          " renew adds a Nats-Msg-Id)")
    print()
    h = rep["handover"]
    print("4. hand-over of one seat: t0 before A's release -> B's watcher shows the delete "
          "-> B's claim succeeded (ms)")
    print(f"   {'':34} {'n':>4} {'median':>8} {'p95':>8} {'max':>8}   watcher saw it: median    p95")
    for side, label in (("crewlet", "crewlet Leases (release/claim)"),
                        ("bare", "bare nats-py (delete/create)")):
        t, s = h[side]["total_ms"], h[side]["seen_ms"]
        print(f"   {label:34} {t['n']:4d} {t['median']:8.2f} {t['p95']:8.2f} {t['max']:8.2f}"
              f"   {'':14}{s['median']:8.2f} {s['p95']:6.2f}")
    print(f"   {'crewlet/bare':34} {'':4} {_x(h['ratio']['median']):>8} {_x(h['ratio']['p95']):>8}")
    print("   (B's claim after a delete: Leases.claim = refused write, leader get, CAS: 3 round trips;"
          " bare kv.create on a deleted key fails, reads, retries: 3)")
    print(f"   B's first claim refused after the delete showed (retried at once; t1 = the claim that "
          f"succeeded): crewlet {h['crewlet']['first_claim_refused']}/{h['crewlet']['total_ms']['n']}, "
          f"bare {h['bare']['first_claim_refused']}/{h['bare']['total_ms']['n']}")
    if h["crewlet"]["first_claim_refused"] or h["bare"]["first_claim_refused"]:
        print("   (a direct get answered by a follower replica that has not yet applied the delete"
              " the watcher showed:\n    the key still looks held, or unwritten so the CAS expects 0)")
    print("   not measured yet: the successor fetching the seat's mailbox -- waits for the mailbox issue")
    print()
    print("5. targets (informational)")
    for op in OPS:
        t = rep["targets"][f"{op}_throughput_ratio"]
        print(f"   {op + ' throughput':20} {t['value']:8.0%} of bare   target >= "
              f"{t['target']:.0%}   {'PASS' if t['pass'] else 'MISS'}")
    t = rep["targets"]["handover_median_ms"]
    print(f"   {'hand-over median':20} {t['value']:8.2f} ms        target <= {t['target']:g} ms  "
          f"{'PASS' if t['pass'] else 'MISS'}  (bare {h['bare']['total_ms']['median']:.2f} ms, "
          f"{_x(h['ratio']['median']).strip()})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=2000,
                    help="keys claimed, renewed and released per side, over all rounds (default 2000)")
    ap.add_argument("--handovers", type=int, default=100,
                    help="seat hand-overs per side, over all rounds (default 100)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleave crewlet and the baseline in this many rounds (default 3)")
    ap.add_argument("--cluster", action="store_true",
                    help="a 3-member JetStream cluster on loopback, buckets with 3 replicas")
    ap.add_argument("--nats-server", help="the nats-server binary (default: next to python, then $PATH)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--keep", action="store_true", help="keep the temp store dir")
    add_smoke(ap, argv, {"ops": 20, "handovers": 3, "rounds": 1})
    args = ap.parse_args(argv)
    if args.ops < 1 or args.handovers < 1 or args.rounds < 1:
        ap.error("--ops, --handovers and --rounds must be >= 1")
    # SIGTERM ends the run through the finally blocks, like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        rep = build_report(run(args))
    except BenchError as exc:
        print(f"bench/leases.py: {exc}", file=sys.stderr)
        return 1
    return emit(rep, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
