#!/usr/bin/env python3
"""Benchmark: turns per second end to end on one node, beside bare JetStream publish + fetch + ack.

For each size N (``--sizes``, default 100,1000,10000 seats), in one run:

* **crewlet** — a real node, ``crewletd start -c <temp config> --company
  <temp company>`` (embedded broker, everything on 127.0.0.1, a short temp
  data dir): N seats with the ``scripted`` provider (one rule, ``.*`` -> ok;
  a short persona by default, ``--persona`` for another; a company revision
  is stored in parts, up to 64 MiB of JSON), ``fleet: {claims_per_sweep: min(N, 1000),
  sweep: 1, heartbeat: 5, lease_ttl: 15}`` so the seats are claimed in seconds
  (the design's 4 per 5 s would take hours at 10,000; all 10,000 in one sweep
  outlasts the TTL, see :data:`CLAIMS_CAP`), ``node.max_concurrent: 32``.
  Timed: crewletd's start -> all N seats held (the node's fleet view) -> all
  N working (the seats process reports them). A round publishes ``--messages`` messages to
  ``agents.inbox.<seat>`` (headers ``Crewlet-Trigger`` and ``Nats-Msg-Id``, as
  ``Mailboxes.send`` sets them), ``--window`` publishes in flight, while a
  core-NATS subscription on ``events.turn.>`` (made before the first publish)
  counts the turn records with outcome ``done``; t = first publish -> the last
  done record received. A turn is a fetch, the ledger check, the scripted
  provider, the ledger write, a **confirmed** ack, the turn record. Kept per
  round as well: the turn's own time (the record's ``took_ms``), the longest
  pause between finished turns, and how many turns worked a redelivered
  message (a fetched message NAKed back, e.g. when admission lapsed, waits
  for its seat's next look: nothing announces it).
* **bare** — nats-py on a bare ``nats-server -js`` of its own (free
  127.0.0.1 port, store in the temp dir): a limits stream on
  ``agents.inbox.>`` (``max_consumers`` raised) with N durable pull consumers
  (one per seat: filter subject, explicit ack, ack wait 1800 s). A round
  publishes the same messages to the same seats the same way, then 32
  workers (the node's turn slots) do ``fetch(1)`` + ``ack()`` until all are
  acked; t = first publish -> last ack (and a flush, so the acks reached the
  server). ``ack()`` is fire-and-forget; crewlet's acks are confirmed (a
  request the server answers once it applied the ack), a round trip more.

Messages go round-robin over a seeded shuffle of the seats (the same spread
on both sides; every seat of a small company is busy). After a warm-up batch
on each side (``--warmup``, not counted) the sides run ``--rounds``
interleaved rounds (the side going first alternates), so the machine's noise
falls on both; the figures are medians over the rounds. Then both sides idle
``--idle`` s and the CPU of each process over that one window is measured
(psutil, 100 % = one core): the node's broker (a descendant of crewletd named
``nats-server``), its seats process and the rest, and the bare server. The
CPU of every process while its side's rounds ran is kept as well.

Targets (informational): crewlet >= 50 % of bare at 100 seats; at larger
sizes a throughput within 20 % of the 100-seat figure and an idle broker near
0 % CPU. A size that fails (seats not held in time, turns stalling) is
reported with the stage it reached, the node's warnings and errors (from its
log, before the stop and during it), the CPU figures and its seats' stats,
and the next size still runs. Exit status: 0 unless the benchmark itself
broke.

    /tmp/venv/bin/python bench/turns.py [--sizes 100,1000,10000] [--messages 2000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import signal
import statistics
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
from nats.js.api import (AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy,  # noqa: E402
                         StorageType)

from bench.common import (BenchError, CpuMeter, Crewletd, NatsServer, emit,  # noqa: E402
                          find_nats_server, ratio, say, server_version, summary, wait_jetstream)
from crewlet.company.model import REVISION_MAX  # noqa: E402

NODE_ID = "bench"
SEED = 20240611
SUBJECT = "agents.inbox."          # + seat, as crewlet's mailboxes
STREAM = "AGENTS"
CONSUMER = "inbox-"                # + seat: the bare side names its durables like crewlet
PAYLOAD = b"a message for a seat, about this long, answered ok"
TRIGGER_HEADER = "Crewlet-Trigger"
MAX_CONCURRENT = 32                # node.max_concurrent: the design's turn slots per node
ACK_WAIT = 1800.0                  # s, the mailbox ack wait on both sides
CREATE_CONCURRENCY = 64            # bare consumers are created as many at once as crewlet's
FETCH_TIMEOUT = 10.0               # s a bare fetch(1) may wait: its message is already stored
JS_TIMEOUT = 10.0                  # s: generous, so a slow server shows as slow, not as an error
TARGET_RAW_RATIO = 0.5             # crewlet turns/s >= half of bare msgs/s, at 100 seats
TARGET_SCALE = 0.2                 # at more seats, within 20 % of the 100-seat figure
SETTLE = 1.0                       # s after the last round before the idle window opens
ROLE_SHUTDOWN = 60.0               # s the node's supervisor gives a role (and its broker) to stop
NOTE_EVERY = 10.0                  # s between progress notes while the seats are being claimed
# A seat's persona. Short, so that the figures are the turns' and not a big company's (a
# revision is stored in parts: crewlet.coord.control_plane; REVISION_MAX bounds it).
PERSONA = "bench"
# Claims per sweep at most (the node's fleet.claims_per_sweep is min(seats, this)): one sweep's
# claims must end well within the lease TTL, since the sweep renews nothing meanwhile. Measured
# (2 cores): ~150 claims/s at 10,000 seats, so all 10,000 in one sweep took ~60 s > the 15 s TTL
# and the node churned -- seats lapsed ("seat_lost: lease stale on waking") as fast as it claimed
# them, never holding more than ~4,000. 1,000 takes ~7 s. --claims 0: no cap.
CLAIMS_CAP = 1000
# Seconds without a finished turn before a round counts as stalled: a message handed back (NAKed)
# is announced by nothing, so it waits for its seat's own look (POLL, 60 s +- 20 % in
# roles/seats/turns.py), at 10,000 seats sometimes twice (measured: a third delivery at 120 s).
STALL = 150.0
LAST_KEPT = 3                      # the last finished turns of a round kept (stragglers show)
REASON_KEPT = 60                   # characters of a log record's reason that tell its kind apart


# --------------------------------------------------------------------------
# What is sent, to whom
# --------------------------------------------------------------------------

def seat_names(n: int) -> list[str]:
    return [f"s{i:05d}" for i in range(n)]


def plan(seats: list[str], messages: int, tag: str) -> list[tuple[str, str]]:
    """(seat, trigger) per message: round-robin over a seeded shuffle of the seats."""
    order = list(seats)
    random.Random(SEED).shuffle(order)
    return [(order[i % len(order)], f"{tag}-{i}") for i in range(messages)]


async def publish_all(js, mail: list[tuple[str, str]], window: int) -> None:
    """Publish every (seat, trigger), *window* at a time in flight (each awaits its PubAck)."""
    todo = iter(mail)

    async def pump() -> None:
        for seat, trigger in todo:
            await js.publish(SUBJECT + seat, PAYLOAD, timeout=JS_TIMEOUT,
                             headers={TRIGGER_HEADER: trigger, "Nats-Msg-Id": f"{seat}:{trigger}"})

    await asyncio.gather(*(pump() for _ in range(min(window, len(mail)))))


def per_s(count: int, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


# --------------------------------------------------------------------------
# The two sides' clients
# --------------------------------------------------------------------------

async def close_quietly(nc) -> None:
    """Close a bench connection, if any, whatever state it is in (at most 10 s)."""
    if nc is not None:
        try:
            await asyncio.wait_for(nc.close(), 10)
        except Exception:
            pass


class Bare:
    """The bare server's stream, its N consumers, and rounds of publish -> fetch(1) + ack."""

    def __init__(self, url: str, seats: list[str]):
        self.url, self.seats = url, seats
        self.nc: Any = None
        self.subs: dict[str, Any] = {}

    async def open(self) -> float:
        """Connect, create the stream and every seat's consumer; the seconds the consumers took."""
        self.nc = await nats.connect(self.url, name="bench-bare", connect_timeout=2, allow_reconnect=False)
        self.js = self.nc.jetstream(timeout=JS_TIMEOUT)
        await self.js.add_stream(name=STREAM, subjects=[SUBJECT + ">"], retention=RetentionPolicy.LIMITS,
                                 storage=StorageType.FILE, max_consumers=max(1000, 2 * len(self.seats)))
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)

        async def one(seat: str) -> None:
            async with gate:
                await self.js.add_consumer(STREAM, ConsumerConfig(
                    durable_name=CONSUMER + seat, filter_subject=SUBJECT + seat,
                    ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL, ack_wait=ACK_WAIT))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(s) for s in self.seats))
        return time.perf_counter() - t0

    async def close(self) -> None:
        await close_quietly(self.nc)

    async def round(self, mail: list[tuple[str, str]], window: int) -> dict[str, Any]:
        # One bound pull subscription (a core subscription) per seat with mail,
        # made before the clock starts, as crewlet's fetch inbox is.
        for seat, _ in mail:
            if seat not in self.subs:
                self.subs[seat] = await self.js.pull_subscribe_bind(durable=CONSUMER + seat, stream=STREAM)
        queue = collections.deque(seat for seat, _ in mail)
        locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)  # a seat's one at a time

        async def worker() -> int:
            acked = 0
            while queue:
                seat = queue.popleft()
                async with locks[seat]:
                    for msg in await self.subs[seat].fetch(1, timeout=FETCH_TIMEOUT):
                        await msg.ack()
                        acked += 1
            return acked

        t0 = time.perf_counter()
        await publish_all(self.js, mail, window)
        t_published = time.perf_counter()
        acked = sum(await asyncio.gather(*(worker() for _ in range(MAX_CONCURRENT))))
        await self.nc.flush(timeout=JS_TIMEOUT)
        t_end = time.perf_counter()
        if acked != len(mail):
            raise BenchError(f"bare: {acked} of {len(mail)} messages acked")
        return {"messages": len(mail), "seconds": t_end - t0, "per_s": per_s(len(mail), t_end - t0),
                "publish_per_s": per_s(len(mail), t_published - t0)}


class Turns:
    """A client of the node: publishes mail, and counts turn records on ``events.turn.>``."""

    def __init__(self, url: str):
        self.url = url
        self.nc: Any = None
        self._want: set[str] = set()
        # trigger -> (received at, took_ms, deliveries, seat)
        self._done: dict[str, tuple[float, float, int, str]] = {}
        self._outcomes: collections.Counter = collections.Counter()
        self._finished = asyncio.Event()

    async def open(self) -> None:
        self.nc = await nats.connect(self.url, name="bench-turns", connect_timeout=2, allow_reconnect=False)
        self.js = self.nc.jetstream(timeout=JS_TIMEOUT)
        await self.nc.subscribe("events.turn.>", cb=self._on_record)
        await self.nc.flush()  # the subscription is in place before the first publish

    async def close(self) -> None:
        await close_quietly(self.nc)

    async def _on_record(self, msg) -> None:
        t = time.perf_counter()
        try:
            rec = json.loads(msg.data)
        except ValueError:
            return
        outcome, trigger = rec.get("outcome"), rec.get("trigger")
        self._outcomes[outcome] += 1
        if outcome == "done" and trigger in self._want and trigger not in self._done:
            self._done[trigger] = (t, float(rec.get("took_ms") or 0.0), int(rec.get("deliveries") or 1),
                                   str(rec.get("seat")))
            if len(self._done) == len(self._want):
                self._finished.set()

    async def round(self, mail: list[tuple[str, str]], window: int, stall: float) -> dict[str, Any]:
        self._want, self._done = {t for _, t in mail}, {}
        self._outcomes, self._finished = collections.Counter(), asyncio.Event()
        t0 = time.perf_counter()
        await publish_all(self.js, mail, window)
        t_published = time.perf_counter()
        seen, last_change = -1, time.perf_counter()
        while not self._finished.is_set():
            try:
                await asyncio.wait_for(self._finished.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
            if len(self._done) != seen:
                seen, last_change = len(self._done), time.perf_counter()
            elif time.perf_counter() - last_change > stall:
                raise BenchError(f"turns stalled: {len(self._done)} of {len(mail)} done, none for "
                                 f"{stall:g}s; turn records by outcome: {dict(self._outcomes)}")
        done = sorted(self._done.values())
        finished = [d[0] for d in done]
        t_end = finished[-1]
        took = summary([d[1] for d in done])
        # A pause in the flow of finished turns (admission lapsing, a sweep hogging the loop)
        # shows here when the rate alone would hide it.
        gaps = [b - a for a, b in zip([t0] + finished, finished)]
        return {"messages": len(mail), "seconds": t_end - t0, "per_s": per_s(len(mail), t_end - t0),
                "publish_per_s": per_s(len(mail), t_published - t0), "outcomes": dict(self._outcomes),
                "turn_took_ms": {k: took[k] for k in ("median", "p95", "max")},
                "first_done_s": finished[0] - t0, "longest_gap_s": max(gaps),
                "redelivered": sum(1 for d in done if d[2] > 1),
                "last_done": [{"s": round(d[0] - t0, 3), "seat": d[3], "deliveries": d[2]}
                              for d in done[-LAST_KEPT:]]}


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------

def claims_per_sweep(seats: int, args: argparse.Namespace) -> int:
    return min(seats, args.claims) if args.claims else seats


def revision_bytes(company: dict[str, Any]) -> int:
    """The size of the company revision crewlet stores (its JSON before compression, as
    ``ControlPlane.append`` measures it against ``REVISION_MAX``)."""
    from crewlet.company.model import Company
    from crewlet.coord.control_plane import revision_size
    return revision_size(Company.model_validate(company))


class CrewletNode(Crewletd):
    """One crewletd we started on a temp data dir, its config and its company."""

    STOP_GRACE = 180.0      # s for crewletd to stop: 10,000 leases, a broker of 10,000 consumers
    STATUS_TIMEOUT = 10.0   # s for a status answer: 10,000 seats make it a megabyte

    def __init__(self, base: str, binary: str, seats: list[str], args: argparse.Namespace):
        self.seats = seats
        super().__init__(base, {
            "node": {"id": NODE_ID, "max_concurrent": MAX_CONCURRENT},
            "supervisor": {"shutdown_timeout": ROLE_SHUTDOWN, "broker_shutdown_timeout": ROLE_SHUTDOWN},
            "fleet": {"claims_per_sweep": claims_per_sweep(len(seats), args), "sweep": args.sweep,
                      "heartbeat": args.heartbeat, "lease_ttl": args.lease_ttl},
        }, binary=binary)
        company = {
            "company": {"name": "bench"},
            "providers": {"p": {"kind": "scripted", "rules": [{"match": ".*", "reply": "ok"}]}},
            "seats": [{"name": s, "persona": args.persona, "provider": "p"} for s in self.seats],
        }
        self.revision_bytes = revision_bytes(company)
        self.company_path = os.path.join(base, "company.yaml")
        with open(self.company_path, "w") as f:
            json.dump(company, f)

    def start(self) -> None:
        super().start("--company", self.company_path)

    def exit_message(self) -> str:
        # No log tail: the report has the log's warnings and errors (problems).
        assert self.proc is not None
        return f"crewletd exited with {self.proc.returncode}"

    @staticmethod
    def seats_stats(st: dict[str, Any] | None) -> dict[str, Any]:
        for c in (st or {}).get("children", []):
            if c.get("name") == "seats":
                return c.get("stats") or {}
        return {}

    @staticmethod
    def held(st: dict[str, Any] | None) -> int:
        seats = ((st or {}).get("fleet") or {}).get("seats") or []
        return sum(1 for s in seats if s.get("node") == NODE_ID)

    def working(self, st: dict[str, Any] | None) -> int:
        """Seats the seats process works (its stats' ``held``; older ones listed every seat)."""
        stats = self.seats_stats(st)
        held = stats.get("held")
        return held if isinstance(held, int) else len(stats.get("seats") or {})

    def wait_seats(self, timeout: float, progress: list[dict]) -> tuple[float, float]:
        """Seconds from the start until all seats were held, and until the seats
        process worked them all; a sample every :data:`NOTE_EVERY` s goes to *progress*."""
        n, t0 = len(self.seats), time.perf_counter()
        held_s = None
        interval = 0.25 if n <= 1000 else 1.0   # a 10,000-seat status costs crewletd a megabyte
        next_note, meter = t0 + NOTE_EVERY, None
        while True:
            self.check_alive()
            st = self.status()
            now = time.perf_counter()
            held, working = self.held(st), self.working(st)
            if held_s is None and held >= n:
                held_s = now - t0
                say(f"  all {n} seats held after {held_s:.1f}s")
            if held_s is not None and working >= n:
                return held_s, now - t0
            if now >= next_note:
                cpu = meter.read() if meter is not None else {}
                progress.append({"t": round(now - t0, 1), "held": held, "working": working,
                                 "cpu": {k: _round(v) for k, v in cpu.items()}})
                say(f"  {now - t0:5.0f}s: {held}/{n} held, {working} working; CPU % "
                    + " ".join(f"{k} {v:.0f}" for k, v in cpu.items() if v is not None))
                meter = CpuMeter(self.processes()).start()
                next_note = now + NOTE_EVERY
            if now - t0 > timeout:
                raise BenchError(f"{held} of {n} seats held, {working} working, after {timeout:g}s")
            time.sleep(interval)

    def problems(self, start: int = 0, end: int | None = None) -> dict[str, Any]:
        """Warnings and errors in the log's bytes [start, end): a count per level and
        role/event, and the first of each."""
        counts: collections.Counter = collections.Counter()
        first: dict[str, dict] = {}
        for rec in self.warnings(start, end):
            key = self.problem(rec)
            if isinstance(rec.get("reason"), str):
                key += f" ({rec['reason'][:REASON_KEPT]})"
            counts[key] += 1
            first.setdefault(key, _clip({k: v for k, v in rec.items() if k not in ("node", "level")}))
        return {"counts": dict(counts.most_common()), "first": first}


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def _clip(rec: dict, width: int = 300) -> dict:
    return {k: (v[:width] + "..." if isinstance(v, str) and len(v) > width else v) for k, v in rec.items()}


# --------------------------------------------------------------------------
# One size
# --------------------------------------------------------------------------

async def measure(server: NatsServer, node: CrewletNode, seats: list[str], args: argparse.Namespace,
                  out: dict[str, Any]) -> None:
    out["stage"] = "starting the servers"
    server.start()
    node.start()
    await wait_jetstream(server.url)
    out["stage"] = "waiting for the seats to be held"
    node_ok = True
    try:
        out["held_seconds"], out["working_seconds"] = await asyncio.to_thread(
            node.wait_seats, args.hold_timeout, out["progress"])
    except BenchError as exc:
        # The node could not hold its seats: say what it did, and still measure the bare side.
        failed(out, exc)
        await asyncio.to_thread(diagnose, node, out, min(args.idle, 5.0))
        node_ok = False
    procs = await asyncio.to_thread(node.processes) if node.alive() else {}
    if node_ok and "broker" not in procs:
        raise BenchError("no nats-server among crewletd's descendants")
    out["pids"] = {k: p.pid for k, p in procs.items()}
    me, bare_broker = psutil.Process(), psutil.Process(server.pid)
    bare, turns = Bare(server.url, seats), Turns(node.url)
    try:
        out["stage"] = f"creating {len(seats)} bare consumers"
        out["bare_consumers_seconds"] = await bare.open()
        if node_ok:
            await turns.open()
        if args.warmup:
            out["stage"] = "warm-up"
            await bare.round(plan(seats, args.warmup, "warm"), args.window)
            if node_ok:
                await turns.round(plan(seats, args.warmup, "warm"), args.window, args.stall)
        for i in range(args.rounds):
            for side in ("bare", "crewlet") if i % 2 == 0 else ("crewlet", "bare"):
                if side == "crewlet" and not node_ok:
                    continue
                out["stage"] = f"round {i + 1}, {side}"
                mail = plan(seats, args.messages, f"r{i}")
                if side == "bare":
                    meter = CpuMeter({"broker": bare_broker, "bench": me}).start()
                    r = await bare.round(mail, args.window)
                else:
                    meter = CpuMeter({**procs, "bench": me}).start()
                    r = await turns.round(mail, args.window, args.stall)
                r["cpu"] = meter.read()
                out[side]["rounds"].append(r)
            say(f"  round {i + 1}: "
                + (f"crewlet {out['crewlet']['rounds'][-1]['per_s']:.0f} turns/s, " if node_ok else "")
                + f"bare {out['bare']['rounds'][-1]['per_s']:.0f} msgs/s")
        if node_ok:
            st = await asyncio.to_thread(node.status)
            out["seats_stats"] = {k: v for k, v in node.seats_stats(st).items() if k != "seats"}
    finally:
        await bare.close()
        await turns.close()
    out["stage"] = "idle"
    await asyncio.sleep(SETTLE)
    meter = CpuMeter({**procs, "bare broker": bare_broker}).start()
    await asyncio.sleep(args.idle)
    out["idle_cpu"] = meter.read()
    if node_ok:
        node.check_alive()
        out["stage"] = "done"


def failed(out: dict[str, Any], exc: Exception) -> None:
    what = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
    error = f"while {out['stage']}: {what}"
    out["error"] = f"{out['error']}; then {error}" if out.get("error") else error
    say(f"  FAILED {error}")


def diagnose(node: CrewletNode, out: dict[str, Any], seconds: float) -> None:
    """What the node was doing when the size failed: CPU over *seconds*, its seats' stats."""
    try:
        if not node.alive() or "cpu_at_failure" in out:
            return
        meter = CpuMeter(node.processes()).start()
        time.sleep(seconds)
        out["cpu_at_failure"] = meter.read()
        st = node.status()
        out["at_failure"] = {"held": node.held(st), "working": node.working(st),
                             "seats_stats": {k: v for k, v in node.seats_stats(st).items() if k != "seats"}}
    except Exception as exc:  # a courtesy: the failure itself is already recorded
        out["at_failure_error"] = f"{type(exc).__name__}: {exc}"


def run_size(binary: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    seats = seat_names(n)
    base = tempfile.mkdtemp(prefix="cwt", dir="/tmp")
    server = NatsServer(binary, os.path.join(base, "bare"))
    node = CrewletNode(os.path.join(base, "n"), binary, seats, args)
    out: dict[str, Any] = {"seats": n, "stage": "", "progress": [],
                           "crewlet": {"rounds": []}, "bare": {"rounds": []}}
    out["company_revision_bytes"] = node.revision_bytes
    say(f"{n} seats: {args.rounds} rounds of {args.messages} messages per side "
        f"(crewletd broker :{node.stream_port}, bare :{server.port}, dir {base}; company revision "
        f"{node.revision_bytes / 1024:.0f} KiB)")
    if node.revision_bytes > REVISION_MAX:
        say(f"  the company revision is over REVISION_MAX ({REVISION_MAX} bytes): "
            "expect the node to refuse it (shorten --persona)")
    try:
        asyncio.run(measure(server, node, seats, args, out))
    except Exception as exc:  # a size that broke is reported, and the next one runs
        failed(out, exc)
        diagnose(node, out, min(args.idle, 5.0))
    finally:
        stop_at = node.log_size()
        out["log"] = node.problems(0, stop_at)
        say("  stopping crewletd and the bare server")
        out["node_stop_seconds"] = node.stop()
        out["stop_log"] = node.problems(stop_at)["counts"]
        out["bare_stop_seconds"] = server.stop()
        if args.keep or out.get("error"):
            out["kept"] = base
            say(f"  kept {base} (crewletd log: {node.log_path})")
        else:
            shutil.rmtree(base, ignore_errors=True)
    for side in ("crewlet", "bare"):
        rates = [r["per_s"] for r in out[side]["rounds"] if r.get("per_s")]
        out[side]["per_s"] = statistics.median(rates) if rates else None
    return out


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def mean_cpu(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Each process's CPU % averaged over the rounds, weighted by their length."""
    total: dict[str, float] = collections.defaultdict(float)
    wall: dict[str, float] = collections.defaultdict(float)
    for r in rounds:
        for name, pct in (r.get("cpu") or {}).items():
            if pct is not None:
                total[name] += pct * r["seconds"]
                wall[name] += r["seconds"]
    return {name: total[name] / wall[name] for name in total if wall[name]}


def build_report(results: list[dict[str, Any]], args: argparse.Namespace, binary: str) -> dict[str, Any]:
    ref = next((r for r in results if r["seats"] == 100), results[0] if results else None)
    rows = []
    for r in results:
        c, b, idle = r["crewlet"], r["bare"], r.get("idle_cpu") or {}
        rows.append({
            "seats": r["seats"], "crewlet_turns_per_s": c["per_s"], "bare_msgs_per_s": b["per_s"],
            "ratio": ratio(c["per_s"], b["per_s"]),
            "vs_ref": ratio(c["per_s"], ref["crewlet"]["per_s"]) if ref else None,
            "bare_vs_ref": ratio(b["per_s"], ref["bare"]["per_s"]) if ref else None,
            "idle_broker_cpu": {"crewlet": idle.get("broker"), "bare": idle.get("bare broker")},
            "idle_seats_cpu": idle.get("seats"),
            "held_seconds": r.get("held_seconds"), "working_seconds": r.get("working_seconds"),
            "busy_cpu": {"crewlet": mean_cpu(c["rounds"]), "bare": mean_cpu(b["rounds"])},
            "error": r.get("error"),
        })
    return {"rows": rows, "ref_seats": ref["seats"] if ref else None, "results": results,
            "targets": {"ratio_at_100": TARGET_RAW_RATIO, "within_of_100": TARGET_SCALE},
            "config": {"sizes": args.sizes, "messages": args.messages, "rounds": args.rounds,
                       "warmup": args.warmup, "window": args.window, "workers": MAX_CONCURRENT,
                       "idle_s": args.idle,
                       "fleet": {"sweep": args.sweep, "heartbeat": args.heartbeat,
                                 "lease_ttl": args.lease_ttl,
                                 "claims_per_sweep": args.claims or "seats"},
                       "nats_server": server_version(binary), "nats_py": NATS_PY_VERSION,
                       "python": sys.version.split()[0], "cpus": os.cpu_count()}}


def _f(v: float | None, spec: str) -> str:
    """*v* formatted by *spec* (width first), or n/a in the same width."""
    width = int(spec.split(".")[0] or 0)
    return f"{v:{spec}}" if v is not None else f"{'n/a':>{width}}"


def _pcts(cpu: dict[str, float | None], digits: int = 0) -> str:
    return ", ".join(f"{k} {v:.{digits}f}" for k, v in cpu.items() if v is not None) or "n/a"


def print_text(rep: dict[str, Any]) -> None:
    cfg, fleet = rep["config"], rep["config"]["fleet"]
    print(f"crewlet turns benchmark  (python {cfg['python']}, {cfg['cpus']} cpus, nats-server "
          f"{cfg['nats_server']}, nats-py {cfg['nats_py']}; per size {cfg['rounds']} interleaved rounds "
          f"of {cfg['messages']} messages, medians; {cfg['workers']} turns at once; fleet sweep "
          f"{fleet['sweep']:g} s, claims per sweep {fleet['claims_per_sweep']}, heartbeat "
          f"{fleet['heartbeat']:g} s, lease ttl {fleet['lease_ttl']:g} s)")
    print()
    ref = f"vs {rep['ref_seats']}"
    print(f"{'seats':>6} {'crewlet':>9} {'bare':>9} {'ratio':>6} {ref:>7}  {'idle broker CPU %':>17}  "
          f"{'idle seats':>10}  {'seats held s':>13}")
    print(f"{'':>6} {'turns/s':>9} {'msgs/s':>9} {'>=0.5':>6} {'>=0.8':>7}  {'crewlet / bare':>17}  "
          f"{'CPU %':>10}  {'(working)':>13}")
    for row in rep["rows"]:
        ib = row["idle_broker_cpu"]
        held = _f(row["held_seconds"], ".1f").strip() + \
            (f" ({row['working_seconds']:.1f})" if row["working_seconds"] is not None else "")
        print(f"{row['seats']:6d} {_f(row['crewlet_turns_per_s'], '9.0f')} "
              f"{_f(row['bare_msgs_per_s'], '9.0f')} {_f(row['ratio'], '6.2f')} {_f(row['vs_ref'], '7.2f')}  "
              f"{_f(ib['crewlet'], '8.1f')} / {_f(ib['bare'], '6.1f')}  "
              f"{_f(row['idle_seats_cpu'], '10.1f')}  {held:>13}")
    print()
    for row, r in zip(rep["rows"], rep["results"]):
        n, c = r["seats"], r["crewlet"]
        print(f"{n} seats:")
        if r.get("error"):
            print(f"   FAILED {row['error']}")
            if r.get("cpu_at_failure"):
                print(f"   CPU % then: {_pcts(r['cpu_at_failure'])}")
            if r.get("at_failure"):
                print(f"   the node then: {r['at_failure']}")
        if c["rounds"]:
            took = [x["turn_took_ms"]["median"] for x in c["rounds"] if x["turn_took_ms"]["median"]]
            print("   rounds, crewlet turns/s: " + ", ".join(f"{x['per_s']:.0f}" for x in c["rounds"])
                  + "; bare msgs/s: " + ", ".join(f"{x['per_s']:.0f}" for x in r["bare"]["rounds"]))
            gaps = ", ".join(f"{x['longest_gap_s']:.2f}" for x in c["rounds"])
            again = ", ".join(str(x["redelivered"]) for x in c["rounds"])
            print(f"   a turn inside the seats process (fetched -> acked), median ms per round: "
                  f"{', '.join(f'{t:.1f}' for t in took)}; the longest pause between finished "
                  f"turns, s: {gaps}; turns of a redelivered message: {again}")
            print(f"   publishing alone, msgs/s: crewlet "
                  f"{statistics.median(x['publish_per_s'] for x in c['rounds']):.0f}, bare "
                  f"{statistics.median(x['publish_per_s'] for x in r['bare']['rounds']):.0f}")
            print(f"   CPU % while the turns ran: {_pcts(row['busy_cpu']['crewlet'])}; "
                  f"bare side: {_pcts(row['busy_cpu']['bare'])}")
        if r.get("idle_cpu"):
            print(f"   CPU % idle ({cfg['idle_s']:g} s): {_pcts(r['idle_cpu'], 1)}")
        if r.get("progress"):
            last = r["progress"][-1]
            print(f"   claiming: {len(r['progress'])} notes, the last at {last['t']} s: {last['held']} held, "
                  f"{last['working']} working, CPU % {_pcts(last['cpu'])}")
        print(f"   company revision {r['company_revision_bytes'] / 1024:.0f} KiB "
              f"(stored in parts; at most {REVISION_MAX // 2**20} MiB)")
        if r.get("bare_consumers_seconds") is not None:
            print(f"   bare consumers created in {r['bare_consumers_seconds']:.1f} s; stopped in: node "
                  f"{_f(r.get('node_stop_seconds'), '.1f')} s, "
                  f"bare server {_f(r.get('bare_stop_seconds'), '.1f')} s")
        counts = (r.get("log") or {}).get("counts") or {}
        if counts:
            print("   node log warnings/errors before the stop: "
                  + ", ".join(f"{k} x{v}" for k, v in list(counts.items())[:12]))
        if r.get("stop_log"):
            print("   ... while stopping: "
                  + ", ".join(f"{k} x{v}" for k, v in list(r["stop_log"].items())[:8]))
        if r.get("kept"):
            print(f"   kept: {r['kept']}")
    print()
    print(f"targets (informational): crewlet/bare >= {TARGET_RAW_RATIO:g} at 100 seats; at more seats "
          f"within {TARGET_SCALE:.0%} of the {rep['ref_seats']}-seat figure, and an idle broker near "
          f"0 % CPU. Bare acks are fire-and-forget, crewlet's confirmed.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,1000,10000",
                    help="seat counts, comma separated (default 100,1000,10000; 100,1000 takes ~2 min)")
    ap.add_argument("--messages", type=int, default=2000, help="messages per round (default 2000)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side (default 3)")
    ap.add_argument("--warmup", type=int, default=200, help="warm-up messages per side (default 200)")
    ap.add_argument("--window", type=int, default=256, help="publishes in flight (default 256)")
    ap.add_argument("--idle", type=float, default=5.0, help="idle CPU window, seconds (default 5)")
    ap.add_argument("--sweep", type=float, default=1.0, help="the node's fleet.sweep (default 1)")
    ap.add_argument("--heartbeat", type=float, default=5.0, help="the node's fleet.heartbeat (default 5)")
    ap.add_argument("--lease-ttl", type=float, default=15.0, help="the node's fleet.lease_ttl (default 15)")
    ap.add_argument("--claims", type=int, default=CLAIMS_CAP,
                    help=f"cap on fleet.claims_per_sweep (default {CLAIMS_CAP}; 0: all seats in one sweep)")
    ap.add_argument("--hold-timeout", type=float, default=300.0,
                    help="seconds the node may take to hold and work every seat (default 300)")
    ap.add_argument("--stall", type=float, default=STALL,
                    help=f"seconds without a finished turn before a round counts as stalled "
                         f"(default {STALL:g})")
    ap.add_argument("--persona", default=PERSONA,
                    help=f"every seat's persona (default {PERSONA!r}; the company must fit 64 MiB)")
    ap.add_argument("--nats-server",
                    help="the nats-server binary for both sides (default: as crewlet finds it)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (a failed size keeps its own)")
    args = ap.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error("--sizes: whole numbers, comma separated")
    if not args.sizes or min(args.sizes) < 1 or min(args.messages, args.rounds, args.window) < 1 \
            or args.warmup < 0:
        ap.error("--sizes, --messages, --rounds and --window must be >= 1, --warmup >= 0")
    # SIGTERM ends the run through the finally blocks, like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        binary = find_nats_server(args.nats_server)
    except BenchError as exc:
        print(f"bench/turns.py: {exc}", file=sys.stderr)
        return 1
    rep = build_report([run_size(binary, n, args) for n in args.sizes], args, binary)
    return emit(rep, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
