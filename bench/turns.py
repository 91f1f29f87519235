#!/usr/bin/env python3
"""Benchmark: one node with 100 / 1,000 / 10,000 seats at the design's fleet timings (issue 13).

For each size N (``--sizes``, default 100,1000,10000 seats) a real node,
``crewletd start -c <temp config> --company <temp company>`` (embedded
broker, everything on 127.0.0.1, a short temp data dir), with N seats on the
``scripted`` provider (one rule, ``.*`` -> ok; a short persona, ``--persona``
for another), **no fleet section** — the design's defaults: heartbeat 15 s,
lease TTL 45 s, sweep 5 s, 4 claims (MCP spawns) a sweep — and
``node.max_concurrent: 32``. Beside it, bare nats-py on a bare ``nats-server
-js`` of its own (free 127.0.0.1 port, store in the temp dir): a limits
stream on ``agents.inbox.>`` (``max_consumers`` raised) with N durable pull
consumers (one per seat: filter subject, explicit ack, ack wait 1800 s).
Measured (numbered as issue 13 numbers them; run in the order 1, 4, 2, 3, 5),
each figure beside a same-run baseline where one makes sense:

1. **start -> all seats served.** From crewletd's start until every seat has
   worked one mail: the bench connects to the node's broker as soon as it
   answers, publishes one mail per seat (headers ``Crewlet-Trigger`` and
   ``Nats-Msg-Id``, as ``Mailboxes.send`` sets them; ``--window`` in flight)
   as soon as the ``AGENTS`` stream exists, and counts the ``done`` turn
   records on ``feed.turn.>`` (a core subscription made before the first
   publish). The node's log gives the stages (each child ready, mailboxes
   created, the seats process's life begun, the claims). Baseline: the bare
   server started, N consumers created (64 at a time, as crewlet does), one
   message published to each and fetched (``fetch(1)``) + acked by 32
   workers. Target: <= 10 s at 10,000 seats.
2. **seats child kill -9 -> all seats held, and served.** The seats child's
   pid from the node's status; SIGKILL; at once one more mail per seat is
   published. Timed: until the status shows a new seats child whose stats say
   every seat held (the stats are sent at most once a second: the log's
   ``seats_life_begun`` with ``adopted`` is the precise moment), and until
   every mail is worked. No bare baseline fits (a fork is not a recovery):
   *held* is absolute (target <= 2 s at 10,000); *served* is shown beside the
   time the same N mails take at this size's measured turns/s.
3. **idle.** After ``--hold`` s with the seats held and no mail (default 60),
   over a ``--idle`` s window (default 60): writes per second to the
   ``leases`` bucket (its stream ``KV_leases``'s last sequence, before and
   after) and to every stream (the sum of the same), the node's broker CPU,
   the node's CPU (crewletd and every child but the broker; also each child),
   and the bare server's. Beside the 100-seat figures; targets: at 10,000
   seats within 2x of 100, broker and node each <= 5 % of a core.
4. **turns per second** (``--rounds`` interleaved rounds of ``--messages``
   messages round-robin over a seeded shuffle of the seats, after a warm-up
   of ``--warmup``): publish to ``agents.inbox.<seat>`` -> the turn (fetch,
   ledger, provider, ledger write, **confirmed** ack) -> its ``done`` record;
   t = first publish -> last record. Beside the bare side publishing the
   same messages the same way, then 32 workers doing ``fetch(1)`` + a
   fire-and-forget ``ack()``. Medians; targets >= 0.5x bare at 100 seats, and
   at more seats >= 0.8x the 100-seat figure. Also the stream writes and the
   JetStream API requests (the account's count) a turn makes, and a bare
   message. ``bench/turn_floor.py`` is the floor under this ratio.
5. **PSS** (psutil ``memory_full_info().pss``) of crewletd and every
   descendant, with and without the broker, at the end of the idle window;
   beside a node of ``--ref-seats`` seats (default 30, the sample company's
   size) measured first in the same run: started, its seats served, a round
   of ``--messages`` turns, then a few seconds idle. Target: <= 2x at 10,000.

After 1, the bench waits (``--sweep-wait``, up to 600 s) for the node's first
maintenance sweep to end — it trims every mailbox (a filtered purge of
``AGENTS`` each) once the company is known, and then hourly — so that the
bare side, the rounds and the idle window do not measure it; when it ended,
and every request the broker logged it "took too long" over (with its
subject and time since the start), are reported.

CPU figures are psutil CPU times over wall time (100 % = one core). A size
that fails is reported with the stage it reached, the node's warnings and
errors (from its log, before the stop and during it), the CPU figures and its
seats' stats; the next size still runs. ``--profile DIR`` runs ``py-spy
record`` (raw collapsed stacks, non-blocking) on the node's python processes
(:class:`Profiles` says which, per stage) during the start, the rounds, the
recovery and the idle window, and reports the
hottest frames (such runs cost the machine a py-spy: their figures are not
the bench's). Exit status: 0 unless the benchmark itself broke.

    python bench/turns.py [--sizes 100,1000,10000] [--quick] [--idle 60] [--json]
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
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import nats  # noqa: E402
import psutil  # noqa: E402
from nats import errors as nats_errors  # noqa: E402
from nats.js import errors as js_errors  # noqa: E402
from nats.aio.client import __version__ as NATS_PY_VERSION  # noqa: E402
from nats.js.api import (AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy,  # noqa: E402
                         StorageType)

from bench.common import (add_smoke, BenchError, CpuMeter, Crewletd, NatsServer, collapsed_stacks, emit,  # noqa: E402
                          find_nats_server, ratio, say, server_version, summary, wait_jetstream)
from crewlet.company.model import REVISION_MAX  # noqa: E402
from crewlet.config.model import FleetSection  # noqa: E402

NODE_ID = "bench"
SEED = 20240611
SUBJECT = "agents.inbox."          # + seat, as crewlet's mailboxes
STREAM = "AGENTS"
LEASES_STREAM = "KV_leases"        # the leases bucket's stream
CONSUMER = "inbox-"                # + seat: the bare side names its durables like crewlet
PAYLOAD = b"a message for a seat, about this long, answered ok"
TRIGGER_HEADER = "Crewlet-Trigger"
MAX_CONCURRENT = 32                # node.max_concurrent: the design's turn slots per node
ACK_WAIT = 1800.0                  # s, the mailbox ack wait on both sides
CREATE_CONCURRENCY = 64            # bare consumers are created as many at once as crewlet's
FETCH_TIMEOUT = 10.0               # s a bare fetch(1) may wait: its message is already stored
JS_TIMEOUT = 10.0                  # s: generous, so a slow server shows as slow, not as an error
PUBLISH_RETRY = 0.2                # s between tries of a publish that timed out (same Nats-Msg-Id)
LOOK_EVERY = 0.05                  # s between looks for the node's broker and its AGENTS stream
ROLE_SHUTDOWN = 60.0               # s the node's supervisor gives a role (and its broker) to stop
REF_SETTLE = 5.0                   # s the reference node idles before its PSS is read
FLEET = FleetSection()             # the design's fleet timings: the node runs with these
# Targets (informational, issue 13).
TARGET_START_S = 10.0              # start -> all seats served, at 10,000 seats
TARGET_HELD_S = 2.0                # seats child killed -> every seat held again, at 10,000
TARGET_RAW_RATIO = 0.5             # crewlet turns/s >= half of bare msgs/s, at 100 seats
TARGET_SCALE = 0.8                 # at more seats, >= 0.8x the 100-seat figure
TARGET_IDLE_GROWTH = 2.0           # idle writes and CPU at 10,000 seats within 2x of 100
TARGET_IDLE_CPU = 5.0              # % of a core, broker and node each, idle at 10,000
TARGET_PSS = 2.0                   # PSS at 10,000 seats within 2x of the reference node
BIG = 10_000                       # the size the absolute targets are for
# A seat's persona. Short, so that the figures are the turns' and not a big company's (a
# revision is stored in parts: crewlet.coord.control_plane; REVISION_MAX bounds it).
PERSONA = "bench"
# Seconds without a finished turn before a round counts as stalled: a message handed back (NAKed)
# is announced by nothing, so it waits for its seat's own look (POLL, 60 s +- 20 % in
# roles/seats/turns.py, less often with many seats).
STALL = 150.0
LAST_KEPT = 3                      # the last finished turns of a round kept (stragglers show)
REASON_KEPT = 60                   # characters of a log record's reason that tell its kind apart
MB = 1024 * 1024
# Log events that tell where a start's or a recovery's time went (crewletd's and the roles').
TIMELINE = ("child_started", "child_exited", "company_applied", "mailboxes_ready", "seats_company",
            "seats_life_begun", "seats_claimed", "mailboxes_trimmed", "maintenance_swept")
TIMELINE_FIELDS = ("child", "child_pid", "seats", "created", "took_ms", "adopted", "tried", "claimed",
                   "signal", "purged", "failed", "errors")
# The first maintenance sweep (roles/workers/duties/maintenance.py) trims every mailbox once the node
# has its company, and again every hour: at 10,000 seats that is ~10,000 filtered purges of AGENTS,
# each stalling the broker now and then for seconds. The rounds wait for it to end (at most this
# long) so that they measure turns, not the trim; when it ended is reported.
SWEPT = "maintenance_swept"
SWEEP_WAIT = 600.0
# The broker's own warning of a request it took long over (nats-server: 'Internal subscription on
# "<subject>" took too long: <duration>'), forwarded by crewletd as the broker's child_output.
STALL_MARK = "took too long"
PROFILE_TOP = 12                   # frames a profile's summary keeps
LOOP_STEPS = ("Handle._run ", "Task.__step ", "Task.__step_run_and_handle_result ")  # asyncio's step frames


# --------------------------------------------------------------------------
# What is sent, to whom
# --------------------------------------------------------------------------

def seat_names(n: int) -> list[str]:
    return [f"s{i:05d}" for i in range(n)]


def plan(seats: list[str], messages: int, tag: str) -> list[tuple[str, str]]:
    """(seat, trigger) per message: round-robin over a seeded shuffle of the seats
    (*messages* = len(seats): one mail to every seat)."""
    order = list(seats)
    random.Random(SEED).shuffle(order)
    return [(order[i % len(order)], f"{tag}-{i}") for i in range(messages)]


async def publish_all(js, mail: list[tuple[str, str]], window: int, patience: float = 60.0) -> None:
    """Publish every (seat, trigger), *window* at a time in flight (each awaits its PubAck). A
    publish that times out (a broker busy creating 10,000 consumers) is sent again under the same
    ``Nats-Msg-Id`` for up to *patience* s."""
    todo = iter(mail)

    async def pump() -> None:
        for seat, trigger in todo:
            give_up = time.monotonic() + patience
            while True:
                try:
                    await js.publish(SUBJECT + seat, PAYLOAD, timeout=JS_TIMEOUT,
                                     headers={TRIGGER_HEADER: trigger, "Nats-Msg-Id": f"{seat}:{trigger}"})
                    break
                except (nats_errors.TimeoutError, js_errors.NoStreamResponseError):
                    if time.monotonic() > give_up:
                        raise
                    await asyncio.sleep(PUBLISH_RETRY)

    await asyncio.gather(*(pump() for _ in range(min(window, len(mail)))))


def listening(port: int) -> bool:
    """Does something accept connections on 127.0.0.1:*port*?"""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def per_s(count: int, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


def cpu_seconds(procs: dict[str, psutil.Process]) -> dict[str, float]:
    """Each process's CPU time so far (user + system), s."""
    out = {}
    for name, p in procs.items():
        try:
            t = p.cpu_times()
            out[name] = t.user + t.system
        except psutil.Error:
            pass
    return out


def pss(procs: dict[str, psutil.Process]) -> dict[str, int]:
    """Each process's PSS, bytes."""
    out = {}
    for name, p in procs.items():
        try:
            out[name] = p.memory_full_info().pss
        except psutil.Error:
            pass
    return out


# --------------------------------------------------------------------------
# The two sides' clients
# --------------------------------------------------------------------------

async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: the failures of a connect that is tried again are not news."""


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
    """A client of the node: publishes mail, and counts turn records on ``feed.turn.>``."""

    def __init__(self, node: "CrewletNode"):
        self.node = node
        self.nc: Any = None
        self._want: set[str] = set()
        # trigger -> (received at, took_ms, deliveries, seat)
        self._done: dict[str, tuple[float, float, int, str]] = {}
        self._outcomes: collections.Counter = collections.Counter()
        self._finished = asyncio.Event()

    async def open(self, deadline: float) -> None:
        """Connect as soon as the node's broker admits us (its credentials are written by its
        broker role), then subscribe to the turn records."""
        last: Exception | None = None
        while True:
            self.node.check_alive()
            # Not before it listens: nats-py's first connect to a closed port blocks for seconds.
            if not listening(self.node.stream_port):
                if time.perf_counter() > deadline:
                    raise BenchError("the node's broker never listened")
                await asyncio.sleep(LOOK_EVERY / 5)
                continue
            try:
                self.nc = await nats.connect(self.node.url, name="bench-turns", connect_timeout=1,
                                             allow_reconnect=False, max_reconnect_attempts=0,
                                             error_cb=_quiet)
                break
            except Exception as exc:  # no credentials yet, not listening yet
                last = exc
            if time.perf_counter() > deadline:
                raise BenchError(f"the node's broker did not admit us: {type(last).__name__}: {last}")
            await asyncio.sleep(LOOK_EVERY)
        self.js = self.nc.jetstream(timeout=JS_TIMEOUT)
        await self.nc.subscribe("feed.turn.>", cb=self._on_record)
        await self.nc.flush()  # the subscription is in place before the first publish

    async def wait_stream(self, name: str, deadline: float) -> None:
        """Until the stream *name* exists on the node's broker."""
        while True:
            self.node.check_alive()
            try:
                await self.js.stream_info(name)
                return
            except (js_errors.APIError, nats_errors.TimeoutError, nats_errors.NoRespondersError):
                pass  # not made yet, or JetStream not up yet
            if time.perf_counter() > deadline:
                raise BenchError(f"no {name} stream on the node's broker")
            await asyncio.sleep(LOOK_EVERY)

    async def stream_seqs(self) -> dict[str, int]:
        """Every stream's last sequence on the node's broker."""
        out: dict[str, int] = {}
        offset = 0
        while True:
            page = await self.js.streams_info(offset)
            for info in page:
                out[info.config.name] = info.state.last_seq
            offset += len(page)
            if not page or len(page) < 256:
                return out

    async def api_calls(self) -> int:
        """The JetStream API requests the node's broker has answered for its account."""
        return (await self.js.account_info()).api.total

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

    async def round(self, mail: list[tuple[str, str]], window: int, stall: float, *,
                    since: float | None = None, deadline: float | None = None) -> dict[str, Any]:
        """Publish *mail*, wait for every done record. Times count from *since* (a
        ``perf_counter`` of the caller's: the node's start, a kill) or from the first publish."""
        self._want, self._done = {t for _, t in mail}, {}
        self._outcomes, self._finished = collections.Counter(), asyncio.Event()
        t_pub = time.perf_counter()
        t0 = t_pub if since is None else since
        await publish_all(self.js, mail, window)
        t_published = time.perf_counter()
        seen, last_change = -1, time.perf_counter()
        while not self._finished.is_set():
            try:
                await asyncio.wait_for(self._finished.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
            now = time.perf_counter()
            if len(self._done) != seen:
                seen, last_change = len(self._done), now
            elif now - last_change > stall:
                raise BenchError(f"turns stalled: {len(self._done)} of {len(mail)} done, none for "
                                 f"{stall:g}s; turn records by outcome: {dict(self._outcomes)}")
            if deadline is not None and now > deadline and not self._finished.is_set():
                raise BenchError(f"{len(self._done)} of {len(mail)} mails worked after {now - t0:.0f}s; "
                                 f"turn records by outcome: {dict(self._outcomes)}")
            self.node.check_alive()
        done = sorted(self._done.values())
        finished = [d[0] for d in done]
        t_end = finished[-1]
        took = summary([d[1] for d in done])
        # A pause in the flow of finished turns (admission lapsing, a sweep hogging the loop)
        # shows here when the rate alone would hide it.
        gaps = [b - a for a, b in zip([t_pub] + finished, finished)]
        return {"messages": len(mail), "seconds": t_end - t0, "per_s": per_s(len(mail), t_end - t0),
                "published_s": t_published - t0, "publish_per_s": per_s(len(mail), t_published - t_pub),
                "outcomes": dict(self._outcomes),
                "turn_took_ms": {k: took[k] for k in ("median", "p95", "max")},
                "first_done_s": finished[0] - t0, "longest_gap_s": max(gaps),
                "redelivered": sum(1 for d in done if d[2] > 1),
                "last_done": [{"s": round(d[0] - t0, 3), "seat": d[3], "deliveries": d[2]}
                              for d in done[-LAST_KEPT:]]}


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------

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
        # No fleet section: the design's timings (FLEET), as a node runs by default.
        super().__init__(base, {
            "node": {"id": NODE_ID, "max_concurrent": MAX_CONCURRENT},
            "supervisor": {"shutdown_timeout": ROLE_SHUTDOWN, "broker_shutdown_timeout": ROLE_SHUTDOWN},
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
    def seats_child(st: dict[str, Any] | None) -> dict[str, Any]:
        for c in (st or {}).get("children", []):
            if c.get("name") == "seats":
                return c
        return {}

    @classmethod
    def seats_stats(cls, st: dict[str, Any] | None) -> dict[str, Any]:
        """The seats pool's stats taken together (crewletctl status's view)."""
        from crewlet.ctl.render import seats_stats
        return seats_stats((st or {}).get("children", [])) or {}

    @staticmethod
    def held(st: dict[str, Any] | None) -> int:
        """Seats this node holds, as its fleet view shows them."""
        seats = ((st or {}).get("fleet") or {}).get("seats") or []
        return sum(1 for s in seats if s.get("node") == NODE_ID)

    def working(self, st: dict[str, Any] | None) -> int:
        """Seats the seats process works (its stats' ``held``)."""
        held = self.seats_stats(st).get("held")
        return held if isinstance(held, int) else 0

    def all_processes(self) -> dict[str, psutil.Process]:
        """crewletd, its broker, the zygote, each role child and any other descendant."""
        return self.processes(others=True)

    def events(self, start: int, names: tuple[str, ...]) -> list[dict[str, Any]]:
        """The records of its log from byte *start* whose event is one of *names*."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                blob = f.read()
        except OSError:
            return []
        wanted = [f'"event":"{n}"'.encode() for n in names]
        out = []
        for line in blob.splitlines():
            if not any(w in line for w in wanted):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("event") in names:
                out.append(rec)
        return out

    def wait_event(self, name: str, start: int, timeout: float) -> dict[str, Any] | None:
        """The first record of event *name* in its log from byte *start*, waited for up to
        *timeout* s (None: not within it)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.events(start, (name,))
            if found:
                return found[0]
            self.check_alive()
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)

    def broker_stalls(self, wall0: float) -> list[dict[str, Any]]:
        """The broker's warnings of requests it took long over: when (s after *wall0*), the
        subject, how long (s)."""
        out = []
        for rec in self.events(0, ("child_output",)):
            line = str(rec.get("line", ""))
            if rec.get("role") != "broker" or STALL_MARK not in line:
                continue
            subject = line.split('"')[1] if line.count('"') >= 2 else "?"
            took = line.rpartition(":")[2].strip()
            try:
                secs = float(took[:-2]) / 1000 if took.endswith("ms") else float(took.rstrip("s"))
            except ValueError:
                secs = None
            out.append({"t": round(float(rec.get("ts", wall0)) - wall0, 1), "subject": subject, "s": secs})
        return out

    def works_started(self, start: int, wall0: float, pid: int | None = None) -> dict[str, Any]:
        """The seats whose work a seats process started (its ``seat_claimed`` records, one a
        seat, from the log's byte *start*; of *pid* only when given): how many, and when the
        last one was, s after *wall0*."""
        recs = [r for r in self.events(start, ("seat_claimed",))
                if r.get("role") == "seats" and (pid is None or r.get("pid") == pid)]
        last = max((float(r.get("ts", wall0)) for r in recs), default=None)
        return {"count": len(recs), "last_s": None if last is None else round(last - wall0, 3)}

    def timeline(self, start: int, wall0: float) -> list[dict[str, Any]]:
        """What happened after *wall0* (a ``time.time()``), from the log's bytes from *start*:
        the :data:`TIMELINE` events, each with its time since *wall0* and its telling fields."""
        out = []
        for rec in self.events(start, TIMELINE):
            row = {"t": round(float(rec.get("ts", wall0)) - wall0, 3), "event": rec["event"],
                   "role": rec.get("role")}
            row.update({k: rec[k] for k in TIMELINE_FIELDS if k in rec})
            out.append(row)
        return out

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
# py-spy on the seats process (--profile)
# --------------------------------------------------------------------------

class Profiler:
    """``py-spy record`` of one process into a raw (collapsed stacks) file, until stopped."""

    def __init__(self, binary: str | None, path: str):
        self.binary, self.path = binary, path
        self.proc: subprocess.Popen | None = None

    def start(self, pid: int) -> "Profiler":
        if self.binary:
            self.log = open(self.path + ".log", "wb")
            self.proc = subprocess.Popen([self.binary, "record", "-p", str(pid), "--nonblocking",
                                          "--format", "raw", "-r", "100", "-o", self.path],
                                         stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def stop(self) -> dict[str, Any] | None:
        """SIGINT it (py-spy writes its file then), wait; the hottest frames of the file."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return top_frames(self.path)


def top_frames(path: str, k: int = PROFILE_TOP) -> dict[str, Any] | None:
    """From a py-spy raw file: samples, and the *k* frames with the most samples as the innermost
    frame (``self``: the line; ``self_fn``: the function, any line) and anywhere on the stack
    below the event loop's step (``total_fn``, by function), as shares of all samples."""
    selfs: collections.Counter = collections.Counter()
    self_fn: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    n = 0
    try:
        for stack, c in collapsed_stacks(path):
            frames = [fr for fr in stack if not fr.startswith(("process ", "thread "))]
            if not frames:
                continue
            n += c
            selfs[frames[-1]] += c
            self_fn[_function(frames[-1])] += c
            # Below the event loop's step (a task's or a callback's frames): the loop's own
            # frames are on every stack and say nothing.
            steps = [i for i, fr in enumerate(frames) if fr.startswith(LOOP_STEPS)]
            for fr in {_function(fr) for fr in frames[steps[-1] + 1 if steps else 0:]}:
                total[fr] += c
    except OSError:
        return None
    if not n:
        return {"samples": 0, "file": path}
    return {"samples": n, "file": path,
            "self": [(fr, round(c / n, 3)) for fr, c in selfs.most_common(k)],
            "self_fn": [(fr, round(c / n, 3)) for fr, c in self_fn.most_common(k)],
            "total_fn": [(fr, round(c / n, 3)) for fr, c in total.most_common(k)]}


def _function(frame: str) -> str:
    """A py-spy frame ``name (file:line)`` without its line."""
    head, sep, tail = frame.rpartition(":")
    return f"{head})" if sep and tail.rstrip(")").isdigit() else frame


class Profiles:
    """The profiles of one size, when ``--profile`` asks for them: per stage, one file per
    python process profiled (``turns-<seats>-<stage>-<process>.txt``)."""

    # The node's python processes each stage profiles (the seats child always).
    STAGES = {"start": ("seats", "crewletd"),
              "rounds": ("seats", "data_applier", "ingress", "crewletd", "workers"),
              "kill": ("seats", "crewletd"),
              "idle": ("crewletd", "ingress", "seats", "workers", "data_applier")}

    def __init__(self, args: argparse.Namespace, n: int, out: dict[str, Any]):
        self.dir = args.profile
        self.binary = (shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")) \
            if self.dir else None
        self.n, self.out = n, out
        self.current: dict[str, Profiler] = {}
        self.stage = ""

    def start(self, stage: str, pids: dict[str, int | None]) -> None:
        """Profile the processes of *pids* (name -> pid) that :data:`STAGES` names for *stage*."""
        self.stop()
        if not self.binary:
            return
        os.makedirs(self.dir, exist_ok=True)
        self.stage = stage
        for name in self.STAGES[stage]:
            if pids.get(name):
                path = os.path.join(self.dir, f"turns-{self.n}-{stage}-{name}.txt")
                self.current[name] = Profiler(self.binary, path).start(pids[name])
        say(f"  py-spy on {', '.join(f'{k} {pids[k]}' for k in self.current)} ({stage})")

    def stop(self) -> None:
        for name, prof in self.current.items():
            self.out.setdefault("profiles", {})[f"{self.stage} {name}"] = prof.stop()
        self.current = {}


def pids_of(procs: dict[str, psutil.Process]) -> dict[str, int | None]:
    return {k: p.pid for k, p in procs.items()}


def watch_seats_pid(node: CrewletNode, until: threading.Event, not_pid: int | None,
                    then: Callable[[int], None]) -> None:
    """Call *then* with the seats child's pid once the status shows one other than *not_pid*."""
    while not until.is_set():
        pid = node.seats_child(node.status()).get("pid")
        if pid and pid != not_pid:
            then(pid)
            return
        until.wait(0.1)


# --------------------------------------------------------------------------
# The stages of one size
# --------------------------------------------------------------------------

async def node_start(node: CrewletNode, turns: Turns, seats: list[str], args: argparse.Namespace,
                     out: dict[str, Any], profiles: Profiles) -> None:
    """1. crewletd's start -> every seat has worked one mail."""
    res = out["start"] = {}
    out["stage"] = "start: crewletd starting"
    wall0, t0 = time.time(), time.perf_counter()
    node.start()
    deadline = t0 + args.hold_timeout
    found = threading.Event()
    watcher = threading.Thread(target=watch_seats_pid, daemon=True,
                               args=(node, found, None, lambda pid: profiles.start(
                                   "start", {"seats": pid, "crewletd": node.proc.pid})))
    if profiles.binary:
        watcher.start()
    try:
        await turns.open(deadline)
        res["broker_s"] = time.perf_counter() - t0
        out["stage"] = "start: waiting for the AGENTS stream"
        await turns.wait_stream(STREAM, deadline)
        res["stream_s"] = time.perf_counter() - t0
        out["stage"] = "start: serving every seat"
        r = await turns.round(plan(seats, len(seats), "boot"), args.window, args.stall, since=t0,
                              deadline=deadline)
    finally:
        found.set()
        if watcher.is_alive():
            await asyncio.to_thread(watcher.join, 2 * CrewletNode.STATUS_TIMEOUT)
        profiles.stop()
        res["timeline"] = node.timeline(0, wall0)
        res["works_started"] = node.works_started(0, wall0)
    res.update({k: r[k] for k in ("seconds", "published_s", "first_done_s", "longest_gap_s",
                                  "redelivered", "turn_took_ms", "last_done")})
    res["served_s"] = r["seconds"]
    res["wall0"] = wall0
    # Every process began after t0: its CPU time so far is the start's.
    res["cpu_s"] = {k: round(v, 2) for k, v in cpu_seconds(node.all_processes()).items()}
    say(f"  crewlet: start -> {len(seats)} seats served in {res['served_s']:.1f}s "
        f"(broker {res['broker_s']:.1f}s, AGENTS {res['stream_s']:.1f}s, first done {r['first_done_s']:.1f}s)")


async def bare_start(server: NatsServer, bare: Bare, seats: list[str], args: argparse.Namespace,
                     out: dict[str, Any]) -> None:
    """1, baseline: the bare server started -> N consumers -> one message each published, fetched, acked."""
    res = out["bare_start"] = {}
    out["stage"] = "bare start"
    t0 = time.perf_counter()
    server.start()
    await wait_jetstream(server.url)
    res["up_s"] = time.perf_counter() - t0
    res["consumers_s"] = await bare.open()
    t1 = time.perf_counter()
    r = await bare.round(plan(seats, len(seats), "boot"), args.window)
    res["round_s"] = r["seconds"]
    res["subscribe_s"] = time.perf_counter() - t1 - r["seconds"]
    res["served_s"] = time.perf_counter() - t0
    say(f"  bare: start -> {len(seats)} consumers served in {res['served_s']:.1f}s "
        f"(consumers {res['consumers_s']:.1f}s)")


async def rounds(node_ok: bool, bare: Bare, turns: Turns, procs: dict[str, psutil.Process],
                 bare_broker: psutil.Process, seats: list[str], args: argparse.Namespace,
                 out: dict[str, Any], profiles: Profiles) -> None:
    """4. turns/s beside bare publish + fetch(1) + ack, interleaved rounds."""
    me = psutil.Process()
    if args.warmup:
        out["stage"] = "warm-up"
        await bare.round(plan(seats, args.warmup, "warm"), args.window)
        if node_ok:
            await turns.round(plan(seats, args.warmup, "warm"), args.window, args.stall)
    if node_ok and "seats" in procs:
        profiles.start("rounds", pids_of(procs))
    seq0 = await turns.stream_seqs() if node_ok else {}
    calls0 = {"crewlet": await turns.api_calls() if node_ok else 0,
              "bare": (await bare.js.account_info()).api.total}
    try:
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
    finally:
        profiles.stop()
    if node_ok:
        # What a turn writes, by stream: the stores the rounds made on the node's broker.
        seq1, worked = await turns.stream_seqs(), args.rounds * args.messages
        out["writes_per_turn"] = {k: round((v - seq0.get(k, 0)) / worked, 3) for k, v in seq1.items()
                                  if v != seq0.get(k, 0)}
        # JetStream API requests (fetches, info, leader reads; not publishes nor direct gets)
        # per turn and per bare message, all the node's processes together.
        out["api_per_turn"] = round((await turns.api_calls() - calls0["crewlet"]) / worked, 2)
    out["api_per_message"] = round(((await bare.js.account_info()).api.total - calls0["bare"])
                                   / (args.rounds * args.messages), 2)


async def kill_seats(node: CrewletNode, turns: Turns, seats: list[str], args: argparse.Namespace,
                     out: dict[str, Any], profiles: Profiles) -> None:
    """2. SIGKILL of the seats child -> every seat held by the next one, and every seat served."""
    n = len(seats)
    res = out["kill"] = {}
    out["stage"] = "kill: finding the seats child"
    st = await asyncio.to_thread(node.status)
    old = node.seats_child(st).get("pid")
    if not old:
        raise BenchError("no seats child in the node's status")
    before = node.all_processes()
    cpu0 = cpu_seconds(before)
    mail = plan(seats, n, "crash")
    log_at = node.log_size()
    done = threading.Event()
    held: dict[str, Any] = {}
    # A status of 10,000 seats is a megabyte that crewletd builds (~0.1 s of its CPU): read it
    # less often on a big node, where it would take CPU from the seats child being measured.
    every = args.status_every or (0.2 if n <= 1000 else 1.0)

    def look() -> None:
        """Until a new seats child says every seat is held (its stats, sent at most once a second)."""
        t_pid = None
        while not done.is_set():
            st = node.status()
            child = node.seats_child(st)
            now = time.perf_counter()
            pid = child.get("pid")
            if pid and pid != old:
                if t_pid is None:
                    t_pid = held["new_pid_s"] = now - t1
                    held["pid"] = pid
                    profiles.start("kill", {"seats": pid, "crewletd": node.proc.pid})
                if node.working(st) >= n:
                    held["held_s"] = now - t1
                    return
            done.wait(every)

    out["stage"] = "kill: waiting for every seat held and served"
    wall1, t1 = time.time(), time.perf_counter()
    os.kill(old, signal.SIGKILL)
    watcher = asyncio.ensure_future(asyncio.to_thread(look))
    try:
        r = await turns.round(mail, args.window, args.stall, since=t1, deadline=t1 + args.hold_timeout)
        try:
            await asyncio.wait_for(asyncio.shield(watcher),
                                   max(1.0, t1 + args.hold_timeout - time.perf_counter()))
        except asyncio.TimeoutError:
            raise BenchError(f"every mail worked, but the status never showed all {n} seats held "
                             f"(last: {node.working(await asyncio.to_thread(node.status))})") from None
    finally:
        done.set()
        await asyncio.wait({watcher}, timeout=30)
        profiles.stop()
        res["timeline"] = node.timeline(log_at, wall1)
        res["works_started"] = node.works_started(log_at, wall1, held.get("pid"))
    res.update(held)
    res["served_s"] = r["seconds"]
    res.update({k: r[k] for k in ("published_s", "first_done_s", "longest_gap_s", "redelivered", "last_done")})
    begun = [e for e in res["timeline"] if e["event"] == "seats_life_begun"]
    if begun:
        res["life_begun_s"], res["adopted"] = begun[-1]["t"], begun[-1].get("adopted")
    after = node.all_processes()
    cpu1 = cpu_seconds(after)
    # A process there before the kill: its CPU since; the new seats child: all of its own.
    res["cpu_s"] = {k: round(v - cpu0.get(k, 0.0) if k in before and before[k].pid == after[k].pid else v, 2)
                    for k, v in cpu1.items()}
    say(f"  kill -9 of the seats child: a new one in {_f(res.get('new_pid_s'), '.2f')}s, life adopted "
        f"({res.get('adopted')} seats) at {_f(res.get('life_begun_s'), '.2f')}s, all held (stats) at "
        f"{_f(res.get('held_s'), '.2f')}s, all served at {res['served_s']:.1f}s")


async def idle(node: CrewletNode, turns: Turns, procs: dict[str, psutil.Process],
               bare_broker: psutil.Process | None, args: argparse.Namespace, out: dict[str, Any],
               profiles: Profiles) -> None:
    """3. the idle node's writes and CPU; 5. its PSS at the end of the window."""
    out["stage"] = f"idle: holding {args.hold:g}s"
    await asyncio.sleep(args.hold)
    out["stage"] = f"idle: the {args.idle:g}s window"
    seq0 = await turns.stream_seqs()
    meter = CpuMeter({**procs, **({"bare broker": bare_broker} if bare_broker else {})}).start()
    if "seats" in procs:
        profiles.start("idle", pids_of(procs))
    t0 = time.perf_counter()
    await asyncio.sleep(args.idle)
    cpu = meter.read()
    seq1 = await turns.stream_seqs()
    wall = time.perf_counter() - t0
    profiles.stop()
    node.check_alive()
    writes = {s: (seq1[s] - seq0.get(s, 0)) / wall for s in seq1}
    node_cpu = [v for k, v in cpu.items() if k not in ("broker", "bare broker") and v is not None]
    out["idle"] = {
        "seconds": wall, "writes_per_s": {s: round(v, 3) for s, v in writes.items() if v},
        "leases_writes_per_s": writes.get(LEASES_STREAM, 0.0), "all_writes_per_s": sum(writes.values()),
        "cpu": cpu, "broker_cpu": cpu.get("broker"), "bare_broker_cpu": cpu.get("bare broker"),
        "node_cpu": sum(node_cpu) if node_cpu else None}
    mem = pss(procs)
    out["pss"] = {"procs": mem, "all": sum(mem.values()),
                  "without_broker": sum(v for k, v in mem.items() if k != "broker"),
                  # The bare server holds as many consumers: what a broker of N mailboxes costs anyway.
                  "bare_broker": pss({"bare": bare_broker}).get("bare") if bare_broker else None}
    say(f"  idle {wall:.0f}s: leases {out['idle']['leases_writes_per_s']:.2f} writes/s, all streams "
        f"{out['idle']['all_writes_per_s']:.2f}/s; CPU % broker {_f(cpu.get('broker'), '.1f')}, node "
        f"{_f(out['idle']['node_cpu'], '.1f')}; PSS {out['pss']['all'] / MB:.0f} MB "
        f"({out['pss']['without_broker'] / MB:.0f} without the broker)")


async def measure(server: NatsServer, node: CrewletNode, seats: list[str], args: argparse.Namespace,
                  out: dict[str, Any], profiles: Profiles) -> None:
    turns, bare = Turns(node), Bare(server.url, seats)
    node_ok = True
    procs: dict[str, psutil.Process] = {}
    try:
        try:
            await node_start(node, turns, seats, args, out, profiles)
        except BenchError as exc:
            # The node could not serve its seats: say what it did, and still measure the bare side.
            failed(out, exc)
            await asyncio.to_thread(diagnose, node, out, 5.0)
            node_ok = False
        if node_ok:
            procs = await asyncio.to_thread(node.all_processes)
            if "broker" not in procs:
                raise BenchError("no nats-server among crewletd's descendants")
            out["pids"] = {k: p.pid for k, p in procs.items()}
            out["stage"] = "waiting for the first maintenance sweep (mailbox trim) to end"
            t = time.perf_counter()
            swept = await asyncio.to_thread(node.wait_event, SWEPT, 0, args.sweep_wait)
            out["maintenance"] = {"waited_s": time.perf_counter() - t, "done": swept is not None,
                                  **({"at_s": swept["ts"] - out["start"]["wall0"],
                                      "errors": swept.get("errors"), "removed": swept.get("removed")}
                                     if swept else {})}
            say("  the first maintenance sweep " + (f"ended {out['maintenance']['at_s']:.1f}s after the start"
                                                     if swept else f"not over after {args.sweep_wait:g}s")
                + f" (waited {out['maintenance']['waited_s']:.1f}s)")
        await bare_start(server, bare, seats, args, out)
        await rounds(node_ok, bare, turns, procs, psutil.Process(server.pid), seats, args, out, profiles)
        if node_ok:
            out["seats_stats"] = {k: v for k, v in node.seats_stats(await asyncio.to_thread(node.status)).items()
                                  if k != "seats"}
            per_s_here = statistics.median(r["per_s"] for r in out["crewlet"]["rounds"]) \
                if out["crewlet"]["rounds"] else None
            try:
                await kill_seats(node, turns, seats, args, out, profiles)
                out["kill"]["at_turns_rate_s"] = len(seats) / per_s_here if per_s_here else None
            except BenchError as exc:
                failed(out, exc)
                await asyncio.to_thread(diagnose, node, out, 5.0)
                node_ok = False
        await bare.close()
        if node_ok:
            procs = await asyncio.to_thread(node.all_processes)  # the seats child is another now
            await idle(node, turns, procs, psutil.Process(server.pid), args, out, profiles)
            out["stage"] = "done"
    finally:
        profiles.stop()
        await bare.close()
        await turns.close()


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
        meter = CpuMeter(node.all_processes()).start()
        time.sleep(seconds)
        out["cpu_at_failure"] = meter.read()
        st = node.status()
        out["at_failure"] = {"held": node.held(st), "working": node.working(st),
                             "seats_stats": {k: v for k, v in node.seats_stats(st).items() if k != "seats"}}
    except Exception as exc:  # a courtesy: the failure itself is already recorded
        out["at_failure_error"] = f"{type(exc).__name__}: {exc}"


def wind_up(node: CrewletNode, server: NatsServer | None, base: str, args: argparse.Namespace,
            out: dict[str, Any]) -> None:
    stop_at = node.log_size()
    out["log"] = node.problems(0, stop_at)
    wall0 = _get(out, "start", "wall0")
    if wall0:
        out["broker_stalls"] = node.broker_stalls(wall0)
    say("  stopping crewletd" + (" and the bare server" if server else ""))
    out["node_stop_seconds"] = node.stop()
    out["stop_log"] = node.problems(stop_at)["counts"]
    if server is not None:
        out["bare_stop_seconds"] = server.stop()
    if args.keep or out.get("error"):
        out["kept"] = base
        say(f"  kept {base} (crewletd log: {node.log_path})")
    else:
        shutil.rmtree(base, ignore_errors=True)


def run_size(binary: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    seats = seat_names(n)
    base = tempfile.mkdtemp(prefix="cwt", dir="/tmp")
    server = NatsServer(binary, os.path.join(base, "bare"))
    node = CrewletNode(os.path.join(base, "n"), binary, seats, args)
    out: dict[str, Any] = {"seats": n, "stage": "", "crewlet": {"rounds": []}, "bare": {"rounds": []},
                           "company_revision_bytes": node.revision_bytes}
    profiles = Profiles(args, n, out)
    say(f"{n} seats (crewletd broker :{node.stream_port}, bare :{server.port}, dir {base}; company "
        f"revision {node.revision_bytes / 1024:.0f} KiB)")
    if node.revision_bytes > REVISION_MAX:
        say(f"  the company revision is over REVISION_MAX ({REVISION_MAX} bytes): "
            "expect the node to refuse it (shorten --persona)")
    try:
        asyncio.run(measure(server, node, seats, args, out, profiles))
    except Exception as exc:  # a size that broke is reported, and the next one runs
        failed(out, exc)
        diagnose(node, out, 5.0)
    finally:
        profiles.stop()
        wind_up(node, server, base, args, out)
    for side in ("crewlet", "bare"):
        rates = [r["per_s"] for r in out[side]["rounds"] if r.get("per_s")]
        out[side]["per_s"] = statistics.median(rates) if rates else None
    return out


async def measure_ref(node: CrewletNode, seats: list[str], args: argparse.Namespace,
                      out: dict[str, Any]) -> None:
    turns = Turns(node)
    try:
        await node_start(node, turns, seats, args, out, Profiles(argparse.Namespace(profile=None), 0, {}))
        out["stage"] = "a round of turns"
        r = await turns.round(plan(seats, args.messages, "r"), args.window, args.stall)
        out["per_s"] = r["per_s"]
        out["stage"] = "idle"
        await asyncio.sleep(args.ref_settle)
        procs = await asyncio.to_thread(node.all_processes)
        mem = pss(procs)
        out["pss"] = {"procs": mem, "all": sum(mem.values()),
                      "without_broker": sum(v for k, v in mem.items() if k != "broker")}
        out["stage"] = "done"
    finally:
        await turns.close()


def run_ref(binary: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The reference node of *n* seats: start -> served, a round of turns, its PSS."""
    seats = seat_names(n)
    base = tempfile.mkdtemp(prefix="cwr", dir="/tmp")
    node = CrewletNode(os.path.join(base, "n"), binary, seats, args)
    out: dict[str, Any] = {"seats": n, "stage": ""}
    say(f"reference node: {n} seats (crewletd broker :{node.stream_port}, dir {base})")
    try:
        asyncio.run(measure_ref(node, seats, args, out))
        say(f"  {n} seats: {out['per_s']:.0f} turns/s; PSS {out['pss']['all'] / MB:.0f} MB "
            f"({out['pss']['without_broker'] / MB:.0f} without the broker)")
    except Exception as exc:
        failed(out, exc)
    finally:
        wind_up(node, None, base, args, out)
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


def _get(d: dict[str, Any] | None, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def build_report(results: list[dict[str, Any]], ref_node: dict[str, Any] | None,
                 args: argparse.Namespace, binary: str) -> dict[str, Any]:
    ref = next((r for r in results if r["seats"] == 100), results[0] if results else None)
    ref_pss = _get(ref_node, "pss")
    rows = []
    for r in results:
        c, b = r["crewlet"], r["bare"]
        idle, ridle = r.get("idle") or {}, (ref or {}).get("idle") or {}
        rows.append({
            "seats": r["seats"],
            "start_served_s": _get(r, "start", "served_s"), "bare_start_served_s": _get(r, "bare_start", "served_s"),
            "start_ratio": ratio(_get(r, "start", "served_s"), _get(r, "bare_start", "served_s")),
            "kill_held_s": _get(r, "kill", "held_s"), "kill_life_begun_s": _get(r, "kill", "life_begun_s"),
            "kill_adopted": _get(r, "kill", "adopted"),
            "kill_started_s": _get(r, "kill", "works_started", "last_s"),
            "kill_served_s": _get(r, "kill", "served_s"),
            "kill_at_turns_rate_s": _get(r, "kill", "at_turns_rate_s"),
            "kill_served_ratio": ratio(_get(r, "kill", "served_s"), _get(r, "kill", "at_turns_rate_s")),
            "crewlet_turns_per_s": c["per_s"], "bare_msgs_per_s": b["per_s"],
            "ratio": ratio(c["per_s"], b["per_s"]),
            "vs_ref": ratio(c["per_s"], ref["crewlet"]["per_s"]) if ref else None,
            "bare_vs_ref": ratio(b["per_s"], ref["bare"]["per_s"]) if ref else None,
            "idle_leases_writes_per_s": idle.get("leases_writes_per_s"),
            "idle_all_writes_per_s": idle.get("all_writes_per_s"),
            "idle_writes_vs_ref": ratio(idle.get("all_writes_per_s"), ridle.get("all_writes_per_s")),
            "idle_broker_cpu": idle.get("broker_cpu"), "idle_bare_broker_cpu": idle.get("bare_broker_cpu"),
            "idle_node_cpu": idle.get("node_cpu"),
            "idle_broker_vs_ref": ratio(idle.get("broker_cpu"), ridle.get("broker_cpu")),
            "idle_node_vs_ref": ratio(idle.get("node_cpu"), ridle.get("node_cpu")),
            "pss_bytes": _get(r, "pss", "all"), "pss_without_broker_bytes": _get(r, "pss", "without_broker"),
            "pss_broker_bytes": _get(r, "pss", "procs", "broker"), "pss_bare_broker_bytes": _get(r, "pss", "bare_broker"),
            "pss_vs_ref": ratio(_get(r, "pss", "all"), _get(ref_pss, "all")),
            "pss_without_broker_vs_ref": ratio(_get(r, "pss", "without_broker"), _get(ref_pss, "without_broker")),
            "busy_cpu": {"crewlet": mean_cpu(c["rounds"]), "bare": mean_cpu(b["rounds"])},
            "error": r.get("error"),
        })
    return {"rows": rows, "ref_seats": ref["seats"] if ref else None, "ref_node": ref_node,
            "results": results, "targets": targets(rows),
            "config": {"sizes": args.sizes, "messages": args.messages, "rounds": args.rounds,
                       "warmup": args.warmup, "window": args.window, "workers": MAX_CONCURRENT,
                       "hold_s": args.hold, "idle_s": args.idle, "ref_seats": args.ref_seats,
                       "profile": args.profile, "fleet": FLEET.model_dump(),
                       "nats_server": server_version(binary), "nats_py": NATS_PY_VERSION,
                       "python": sys.version.split()[0], "cpus": os.cpu_count()}}


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target: what, the figure, the bound, met or not (None: not measured)."""
    out = []

    def check(what: str, value: float | None, bound: float, at_least: bool = False) -> None:
        met = None if value is None else (value >= bound if at_least else value <= bound)
        out.append({"what": what, "value": value, "bound": bound, "at_least": at_least, "met": met})

    by = {r["seats"]: r for r in rows}
    if 100 in by:
        check("turns/s at 100 seats / bare", by[100]["ratio"], TARGET_RAW_RATIO, at_least=True)
    big = by.get(BIG)
    if big is not None:
        check(f"start -> all served at {BIG} seats, s", big["start_served_s"], TARGET_START_S)
        check(f"seats child kill -> all held at {BIG} seats (stats), s", big["kill_held_s"], TARGET_HELD_S)
        # The stats reach the status at most once a second; the log's moment
        # the new seats process took over its predecessor's life is exact:
        # from then on every seat is held (bound to that life) again.
        if big.get("kill_adopted") == BIG:
            check(f"seats child kill -> all held at {BIG} seats (life adopted), s",
                  big["kill_life_begun_s"], TARGET_HELD_S)
        check(f"seats child kill -> every seat's work started at {BIG} seats, s",
              big["kill_started_s"], TARGET_HELD_S)
        check(f"turns/s at {BIG} seats / 100 seats", big["vs_ref"], TARGET_SCALE, at_least=True)
        check(f"idle writes/s at {BIG} seats / 100 seats", big["idle_writes_vs_ref"], TARGET_IDLE_GROWTH)
        check(f"idle broker CPU at {BIG} seats / 100 seats", big["idle_broker_vs_ref"], TARGET_IDLE_GROWTH)
        check(f"idle node CPU at {BIG} seats / 100 seats", big["idle_node_vs_ref"], TARGET_IDLE_GROWTH)
        check(f"idle broker CPU % at {BIG} seats", big["idle_broker_cpu"], TARGET_IDLE_CPU)
        check(f"idle node CPU % at {BIG} seats", big["idle_node_cpu"], TARGET_IDLE_CPU)
        check(f"PSS at {BIG} seats / reference node", big["pss_vs_ref"], TARGET_PSS)
    return out


def _f(v: float | None, spec: str) -> str:
    """*v* formatted by *spec* (width first), or n/a in the same width."""
    width = int(spec.split(".")[0] or 0)
    return f"{v:{spec}}" if v is not None else f"{'n/a':>{width}}"


def _pcts(cpu: dict[str, float | None], digits: int = 0) -> str:
    return ", ".join(f"{k} {v:.{digits}f}" for k, v in cpu.items() if v is not None) or "n/a"


def _mb(v: float | None, width: int = 6) -> str:
    return _f(None if v is None else v / MB, f"{width}.0f")


def _timeline(rows: list[dict[str, Any]]) -> str:
    """A start's or a recovery's log events, briefly; a run of seats_claimed folded into one."""
    parts, claimed = [], [e for e in rows if e["event"] == "seats_claimed"]
    for e in rows:
        ev = e["event"]
        if ev == "seats_claimed":
            if e is claimed[0]:
                got = sum(x.get("claimed") or 0 for x in claimed)
                parts.append(f"claims {e['t']:.1f}..{claimed[-1]['t']:.1f}s ({got} in {len(claimed)} sweeps)")
            continue
        what = {"child_started": lambda: f"{e.get('child')} ready",
                "child_exited": lambda: f"{e.get('child')} exited",
                "company_applied": lambda: f"company applied ({e.get('seats')} seats, {e.get('took_ms')} ms)",
                "mailboxes_ready": lambda: f"mailboxes ({e.get('created')} made, {e.get('took_ms')} ms)",
                "seats_company": lambda: "seats has the company",
                "seats_life_begun": lambda: f"life begun (adopted {e.get('adopted')})",
                "mailboxes_trimmed": lambda: f"mailboxes trimmed ({e.get('purged')} purged, "
                                             f"{e.get('failed')} failed)",
                "maintenance_swept": lambda: "maintenance sweep done"}[ev]()
        parts.append(f"{what} {e['t']:.2f}s")
    return "; ".join(parts)


def _profile(name: str, prof: dict[str, Any] | None) -> list[str]:
    if not prof:
        return []
    lines = [f"   py-spy, {name}: {prof.get('samples')} samples ({prof.get('file')})"]
    for kind in ("self", "self_fn", "total_fn"):
        for fr, share in (prof.get(kind) or [])[:8]:
            lines.append(f"      {kind:8} {share:6.1%}  {fr}")
    return lines


def print_text(rep: dict[str, Any]) -> None:
    cfg, fleet = rep["config"], rep["config"]["fleet"]
    print(f"crewlet seats-at-scale benchmark  (python {cfg['python']}, {cfg['cpus']} cpus, nats-server "
          f"{cfg['nats_server']}, nats-py {cfg['nats_py']}; fleet defaults: heartbeat {fleet['heartbeat']:g} s, "
          f"lease ttl {fleet['lease_ttl']:g} s, sweep {fleet['sweep']:g} s, claims per sweep "
          f"{fleet['claims_per_sweep']}; {cfg['workers']} turns at once; turns: {cfg['rounds']} interleaved "
          f"rounds of {cfg['messages']} messages, medians; idle: {cfg['idle_s']:g} s window after "
          f"{cfg['hold_s']:g} s)")
    print()
    print("1. start -> all seats served; 2. seats child kill -9 -> all held / all served")
    print(f"{'seats':>6} {'start s':>8} {'bare s':>7} {'x':>6}   {'kill->held s':>12} {'(life)':>7} "
          f"{'adopted':>7} {'(work)':>7} {'->served s':>10} {'N/turns s':>9} {'x':>5}")
    for row in rep["rows"]:
        print(f"{row['seats']:6d} {_f(row['start_served_s'], '8.1f')} {_f(row['bare_start_served_s'], '7.1f')} "
              f"{_f(row['start_ratio'], '6.2f')}   {_f(row['kill_held_s'], '12.2f')} "
              f"{_f(row['kill_life_begun_s'], '7.2f')} {_f(row['kill_adopted'], '7.0f')} "
              f"{_f(row['kill_started_s'], '7.2f')} "
              f"{_f(row['kill_served_s'], '10.1f')} {_f(row['kill_at_turns_rate_s'], '9.1f')} "
              f"{_f(row['kill_served_ratio'], '5.2f')}")
    print()
    ref = f"vs {rep['ref_seats']}"
    print("4. turns per second")
    print(f"{'seats':>6} {'crewlet':>9} {'bare':>9} {'ratio':>6} {ref:>7} {'bare ' + ref:>12}")
    for row in rep["rows"]:
        print(f"{row['seats']:6d} {_f(row['crewlet_turns_per_s'], '9.0f')} {_f(row['bare_msgs_per_s'], '9.0f')} "
              f"{_f(row['ratio'], '6.2f')} {_f(row['vs_ref'], '7.2f')} {_f(row['bare_vs_ref'], '12.2f')}")
    print()
    print(f"3. idle ({cfg['idle_s']:g} s window, {cfg['hold_s']:g} s after the last mail); writes/s, CPU % "
          f"of a core; x = {ref}")
    print(f"{'seats':>6} {'leases w/s':>10} {'all w/s':>8} {'x':>5} {'broker %':>9} {'x':>5} {'node %':>7} "
          f"{'x':>5} {'bare broker %':>13}")
    for row in rep["rows"]:
        print(f"{row['seats']:6d} {_f(row['idle_leases_writes_per_s'], '10.2f')} "
              f"{_f(row['idle_all_writes_per_s'], '8.2f')} {_f(row['idle_writes_vs_ref'], '5.2f')} "
              f"{_f(row['idle_broker_cpu'], '9.2f')} {_f(row['idle_broker_vs_ref'], '5.2f')} "
              f"{_f(row['idle_node_cpu'], '7.2f')} {_f(row['idle_node_vs_ref'], '5.2f')} "
              f"{_f(row['idle_bare_broker_cpu'], '13.2f')}")
    print()
    rn = rep.get("ref_node") or {}
    print(f"5. PSS, MB (crewletd and every descendant; x = the {rn.get('seats', '?')}-seat reference node: "
          f"{_mb(_get(rn, 'pss', 'all'), 0).strip()} MB, {_mb(_get(rn, 'pss', 'without_broker'), 0).strip()} "
          f"without the broker)")
    print(f"{'seats':>6} {'all':>7} {'x':>5} {'no broker':>10} {'x':>5} {'broker':>7} {'bare server':>12}")
    for row in rep["rows"]:
        print(f"{row['seats']:6d} {_mb(row['pss_bytes'], 7)} {_f(row['pss_vs_ref'], '5.2f')} "
              f"{_mb(row['pss_without_broker_bytes'], 10)} {_f(row['pss_without_broker_vs_ref'], '5.2f')} "
              f"{_mb(row['pss_broker_bytes'], 7)} {_mb(row['pss_bare_broker_bytes'], 12)}")
    print()
    if rn:
        if rn.get("error"):
            print(f"reference node FAILED {rn['error']}")
        else:
            print(f"reference node ({rn['seats']} seats): start -> served {_f(_get(rn, 'start', 'served_s'), '.1f')} s, "
                  f"{_f(rn.get('per_s'), '.0f')} turns/s; PSS by process, MB: "
                  + ", ".join(f"{k} {v / MB:.0f}" for k, v in (_get(rn, 'pss', 'procs') or {}).items()))
    for row, r in zip(rep["rows"], rep["results"]):
        n, c = r["seats"], r["crewlet"]
        print(f"{n} seats:")
        if r.get("error"):
            print(f"   FAILED {row['error']}")
            if r.get("cpu_at_failure"):
                print(f"   CPU % then: {_pcts(r['cpu_at_failure'])}")
            if r.get("at_failure"):
                print(f"   the node then: {r['at_failure']}")
        s = r.get("start") or {}
        if s.get("timeline"):
            print(f"   start: broker answered {_f(s.get('broker_s'), '.2f')}s, AGENTS {_f(s.get('stream_s'), '.2f')}s, "
                  f"mail published by {_f(s.get('published_s'), '.1f')}s, first done {_f(s.get('first_done_s'), '.1f')}s, "
                  f"work started for {_get(s, 'works_started', 'count')} seats by "
                  f"{_f(_get(s, 'works_started', 'last_s'), '.1f')}s; "
                  + _timeline(s["timeline"]))
        if s.get("cpu_s"):
            print(f"   start: CPU s by process until served: {_pcts(s['cpu_s'], 1)}")
        m = r.get("maintenance") or {}
        if m:
            print("   the first maintenance sweep (every mailbox trimmed) "
                  + (f"ended {m['at_s']:.1f}s after the start; errors: {m.get('errors') or 'none'}"
                     if m.get("done") else f"had not ended after {m['waited_s']:.0f}s more")
                  + f"; the bare side and the rounds waited {m['waited_s']:.1f}s for it")
        stalls = r.get("broker_stalls") or []
        if stalls:
            by: collections.Counter = collections.Counter(x["subject"] for x in stalls)
            worst = max((x for x in stalls if x["s"] is not None), key=lambda x: x["s"], default=None)
            print(f"   the broker took too long over {len(stalls)} requests ("
                  + ", ".join(f"{k} x{v}" for k, v in by.most_common(4))
                  + (f"; the longest {worst['s']:.1f}s at {worst['t']:.0f}s" if worst else "")
                  + "; at " + ", ".join(f"{x['t']:.0f}" for x in stalls[:12]) + " s after the start)")
        bs = r.get("bare_start") or {}
        if bs.get("served_s") is not None:
            print(f"   bare start: server up {bs['up_s']:.2f}s, {n} consumers {bs['consumers_s']:.1f}s, "
                  f"{n} pull subscriptions {bs['subscribe_s']:.1f}s, one message each {bs['round_s']:.1f}s")
        if c["rounds"]:
            took = [x["turn_took_ms"]["median"] for x in c["rounds"] if x["turn_took_ms"]["median"]]
            print("   rounds, crewlet turns/s: " + ", ".join(f"{x['per_s']:.0f}" for x in c["rounds"])
                  + "; bare msgs/s: " + ", ".join(f"{x['per_s']:.0f}" for x in r["bare"]["rounds"]))
            gaps = ", ".join(f"{x['longest_gap_s']:.2f}" for x in c["rounds"])
            again = ", ".join(str(x["redelivered"]) for x in c["rounds"])
            print(f"   a turn inside the seats process (took_ms: fetched -> side effects done), median ms per round: "
                  f"{', '.join(f'{t:.1f}' for t in took)}; the longest pause between finished "
                  f"turns, s: {gaps}; turns of a redelivered message: {again}")
            print(f"   CPU % while the turns ran: {_pcts(row['busy_cpu']['crewlet'])}; "
                  f"bare side: {_pcts(row['busy_cpu']['bare'])}")
            if r.get("writes_per_turn"):
                print("   stream writes per turn (the rounds' stores on the node's broker / turns): "
                      + ", ".join(f"{k} {v:.2f}" for k, v in r["writes_per_turn"].items()))
            if r.get("api_per_turn") is not None:
                print(f"   JetStream API requests per turn: {r['api_per_turn']:.2f}; "
                      f"per bare message: {r.get('api_per_message', 0):.2f}")
        k = r.get("kill") or {}
        if k.get("timeline"):
            ws = k.get("works_started") or {}
            print(f"   kill: new seats pid seen {_f(k.get('new_pid_s'), '.2f')}s, work started for "
                  f"{ws.get('count')} seats by {_f(ws.get('last_s'), '.2f')}s (log), first done "
                  f"{_f(k.get('first_done_s'), '.2f')}s; " + _timeline(k["timeline"]))
        if k.get("cpu_s"):
            print(f"   kill: CPU s by process until served: {_pcts(k['cpu_s'], 1)}")
        i = r.get("idle") or {}
        if i:
            print(f"   idle CPU %: {_pcts(i['cpu'], 2)}")
            print("   idle writes/s by stream: "
                  + (", ".join(f"{s} {v:.2f}" for s, v in i["writes_per_s"].items()) or "none"))
        if r.get("pss"):
            print("   PSS by process, MB: " + ", ".join(f"{k} {v / MB:.0f}" for k, v in r["pss"]["procs"].items()))
        print(f"   company revision {r['company_revision_bytes'] / 1024:.0f} KiB; stopped in: node "
              f"{_f(r.get('node_stop_seconds'), '.1f')} s, bare server {_f(r.get('bare_stop_seconds'), '.1f')} s")
        counts = (r.get("log") or {}).get("counts") or {}
        if counts:
            print("   node log warnings/errors before the stop: "
                  + ", ".join(f"{k} x{v}" for k, v in list(counts.items())[:12]))
        if r.get("stop_log"):
            print("   ... while stopping: "
                  + ", ".join(f"{k} x{v}" for k, v in list(r["stop_log"].items())[:8]))
        for name, prof in (r.get("profiles") or {}).items():
            for line in _profile(name, prof):
                print(line)
        if r.get("kept"):
            print(f"   kept: {r['kept']}")
    print()
    print("targets (informational):")
    for t in rep["targets"]:
        mark = "n/a " if t["met"] is None else ("met " if t["met"] else "MISS")
        print(f"   {mark} {t['what']}: {_f(t['value'], '.2f')} ({'>=' if t['at_least'] else '<='} {t['bound']:g})")
    print("Bare acks are fire-and-forget, crewlet's confirmed. The seats stats reach the status at most "
          "once a second: 'life' is the log's moment the next seats child adopted its predecessor's seats, "
          "'work' the last of its seat_claimed records (every seat's work started).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,1000,10000",
                    help="seat counts, comma separated (default 100,1000,10000: ~15 minutes)")
    ap.add_argument("--quick", action="store_true",
                    help="shorter: --messages 500 --rounds 2 --warmup 100 --hold 5 --idle 10, unless given")
    ap.add_argument("--messages", type=int, help="messages per round (default 2000)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per side (default 3)")
    ap.add_argument("--warmup", type=int, help="warm-up messages per side (default 200)")
    ap.add_argument("--window", type=int, default=256, help="publishes in flight (default 256)")
    ap.add_argument("--hold", type=float, help="seconds held with no mail before the idle window (default 60)")
    ap.add_argument("--idle", type=float, help="the idle window, seconds (default 60)")
    ap.add_argument("--ref-seats", type=int, default=30,
                    help="seats of the reference node for PSS (default 30, the sample company; 0: none)")
    ap.add_argument("--hold-timeout", type=float, default=300.0,
                    help="seconds a start or a recovery may take to serve every seat (default 300)")
    ap.add_argument("--sweep-wait", type=float, default=SWEEP_WAIT,
                    help=f"seconds the rounds wait for the node's first maintenance sweep to end "
                         f"(default {SWEEP_WAIT:g}; 0: do not wait)")
    ap.add_argument("--status-every", type=float,
                    help="seconds between status reads after the kill (default 0.2; 1 above 1,000 seats)")
    ap.add_argument("--stall", type=float, default=STALL,
                    help=f"seconds without a finished turn before a round counts as stalled "
                         f"(default {STALL:g})")
    ap.add_argument("--persona", default=PERSONA,
                    help=f"every seat's persona (default {PERSONA!r}; the company must fit 64 MiB)")
    ap.add_argument("--profile", metavar="DIR",
                    help="py-spy record the seats process per stage into DIR (distorts the figures)")
    ap.add_argument("--nats-server",
                    help="the nats-server binary for both sides (default: as crewlet finds it)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (a failed size keeps its own)")
    ap.add_argument("--ref-settle", type=float, default=REF_SETTLE,
                    help=f"seconds the reference node idles before its PSS is read (default {REF_SETTLE:g})")
    add_smoke(ap, argv, {"sizes": "5", "messages": 20, "rounds": 1, "warmup": 5, "hold": 0.2, "idle": 0.5,
                         "ref_seats": 2, "ref_settle": 0.2})
    args = ap.parse_args(argv)
    quick = {"messages": 500, "rounds": 2, "warmup": 100, "hold": 5.0, "idle": 10.0}
    full = {"messages": 2000, "rounds": 3, "warmup": 200, "hold": 60.0, "idle": 60.0}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error("--sizes: whole numbers, comma separated")
    if not args.sizes or min(args.sizes) < 1 or min(args.messages, args.rounds, args.window) < 1 \
            or args.warmup < 0 or args.hold < 0 or args.idle <= 0 or args.ref_seats < 0:
        ap.error("--sizes, --messages, --rounds and --window must be >= 1, --warmup, --hold and "
                 "--ref-seats >= 0, --idle > 0")
    # SIGTERM ends the run through the finally blocks, like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        binary = find_nats_server(args.nats_server)
    except BenchError as exc:
        print(f"bench/turns.py: {exc}", file=sys.stderr)
        return 1
    ref_node = run_ref(binary, args.ref_seats, args) if args.ref_seats else None
    results = [run_size(binary, n, args) for n in args.sizes]
    return emit(build_report(results, ref_node, args, binary), args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
