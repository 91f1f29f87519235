#!/usr/bin/env python3
"""Benchmark: conversation runs through the HTTP API of one node, beside same-run baselines.

Starts, on 127.0.0.1 only, a real node (``crewletd start --company``: embedded
broker, data, ingress, seats; a temp data dir under /tmp) whose company has
``--seats`` seats (``s000`` ...) on the ``scripted`` provider (offline,
deterministic; no ``pace`` on the rule the figures use: ``hello`` -> a
six-word reply streamed at once) plus one seat ``holder`` for part 3, whose
rule (``hold ...``) streams 200 words a second apart. The node's config:
``conversations.busy_wait: 0`` (a refusal is the decision itself, part 3),
``sessions.runner_concurrency`` twice the concurrency of part 2 and more (a run
nobody streams is the session runner's, and counts until its driver let go:
past that it would be kept queued), every
seat claimed in the first sweep. Beside it, started by the bench as well: a
**bare SSE app** (a Starlette app served by uvicorn in a subprocess the way
ingress serves its own: one asyncio loop, lifespan off, uvicorn's default
HTTP implementation, no access log) and a bare ``nats-server -js``.
Requests are made by ``bench/api.py``'s own HTTP/1.1 keep-alive client over
asyncio streams (pre-encoded requests; an SSE answer read chunk by chunk and
parsed event by event as it arrives). Every figure is printed beside its
same-run baseline as a ratio x = crewlet/baseline; rounds are interleaved (the
side going first alternates) after a warm-up per side; latencies are pooled
over the rounds (p50/p95/p99, nearest rank), rates are the median round.

1. **Time to first event of a streamed run.** ``POST
   /v1/conversations/{id}/runs {input: "hello", stream: true}`` on a fresh
   conversation each (made before the clock starts; the seats taken in turn,
   so no run waits behind another's turn), one at a time with a short gap:
   request sent -> the ``run.started`` event parsed, -> the first
   ``message.delta`` parsed, -> the terminal event (``run.completed``)
   parsed. Baselines: (a) the bare SSE app's ``POST /runs`` (``await
   request.json()``, then a text/event-stream answering the same ``retry``
   line and one ``run.started`` event at once) for ``run.started``; (b) a
   **bare turn** for the first delta and the end: ``POST
   /v1/seats/{seat}/mail {text: "hello", wait: 30}`` on the same node,
   request sent -> the answer (the turn's record: ``outcome: done``). That is
   the honest bare turn here: the same HTTP front, the same seat, mailbox,
   turn and provider reply a run goes through, answered when the turn ended,
   so what is left between it and a run's events is what conversations add
   (the estate reads and writes of the run and its messages, the driver
   lease, ``RUNS`` publishes and the follower). ``bench/turns.py``'s figure
   is a throughput with no HTTP in it, not a latency: it is part 2's
   baseline; each bare turn's own time inside the seats process (its
   record's ``took_ms``) is reported beside it. With no ``pace`` the reply is
   streamed whole at once, so the first delta is the sink's batch
   (crewlet/conversations/sink.py: published after ``DELTA_WINDOW`` = 50 ms,
   or when the run ends, whichever is first).
2. **Runs per second at ``--concurrency`` (100) conversations.**
   ``--concurrency`` workers, each its own connection and seat (``s{i}``),
   each starting runs one after another (``stream: false``: 202 and the
   node's session runner drives it) and waiting for each run's
   ``run.completed`` before the next — heard on the node's broker (a core
   NATS subscription on ``runs.>``, the events' own subjects). Each run is
   on a fresh conversation made before the round: a run started the moment
   the previous one's terminal event is read may find the conversation's
   lease not yet released (busy_wait 0: a 409). Runs/s = runs / (first
   request -> last ``run.completed``). Baselines on the same node in the same
   run: ``bench/turns.py``'s turns per second (its own ``Turns`` class
   imported: as many mails published straight to ``agents.inbox.<seat>``,
   256 in flight, round-robin over the same seats, counted by their ``done``
   records on ``feed.turn.>``; open loop, no HTTP), the ratio runs/s ÷
   turns/s; and, closed loop like the runs, as many ``POST
   /v1/seats/{seat}/mail {wait}`` from the same workers (each answered when
   its turn ended). CPU of every process of the node meanwhile.
3. **The 409 decision.** A run of ``holder`` is started (``hold ...``:
   200 s of words) and, once it runs, ``--refusals`` second runs of that
   conversation (``stream: true``, the default strategy ``reject``) one at a
   time: request sent -> the whole 409 ``conversation_busy`` problem read
   (checked: problem+json, no SSE). Baselines on the bare ``nats-server``
   (its ``leases`` bucket made by crewlet's own code): a bare ``kv.create``
   of an existing key (the claim that fails: a publish refused for its
   expected last sequence, then nats-py's read that the key is live), and,
   between the two, crewlet's ``Drivers.acquire(wait=0)`` of a conversation
   held by another ``Drivers`` (the lease claim that decides, alone: no HTTP,
   no estate). Afterwards the held run is cancelled.

``--quick`` (small counts) is a smoke run under a minute. Everything started
is stopped by its pid, on failure and on Ctrl-C too. Exit status: 0 unless
the benchmark itself broke.

    python bench/conversations.py [--quick] [--json]    # --help for the rest
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import nats  # noqa: E402
import psutil  # noqa: E402
from nats.aio.client import __version__ as NATS_PY_VERSION  # noqa: E402

from crewlet import log  # noqa: E402
from bench.api import Conn, _header, http_request, wind_up  # noqa: E402  (the bench's HTTP/1.1 client)
from bench.common import (add_smoke, stop_process, BenchError, CpuMeter, Crewletd, NatsServer, child_env, emit,  # noqa: E402
                          find_nats_server, free_ports, ratio, say, server_version, summary, tail,
                          wait_jetstream)
from bench.turns import Turns, plan as turns_plan  # noqa: E402  (bench/turns.py's measurement)

HOST = "127.0.0.1"
NODE_ID = "bench"
HOLDER = "holder"                   # the seat of part 3's long run
INPUT = "hello"                     # -> the scripted rule with no pace
HOLD_INPUT = "hold the line"        # -> the rule streaming HOLD_WORDS words, HOLD_PACE s apart
HOLD_WORDS = 200
HOLD_PACE = 1.0                     # s a word: the run lasts 200 s (a turn may last 300)
REPLY = "ok, heard you, thank you kindly"
PROBLEM = b"application/problem+json"
TERMINAL = ("run.completed", "run.failed", "run.interrupted")
GAP = 0.05                          # s between the sequential requests of part 1 (tails settle)
JS_TIMEOUT = 10.0                   # s: generous, so a slow server shows as slow, not as an error
REQUEST_TIMEOUT = 60.0              # s one request (a whole streamed run) may take
STALL = 120.0                       # s without a finished run before a round of part 2 is stalled
READY_TIMEOUT = 120.0               # s for the node to serve, hold its seats and run a first run
STOP_GRACE = 10.0                   # s the bare app gets after SIGTERM, before SIGKILL
# s a connection of part 2 may idle (its worker waiting for a run's end) before it is opened
# anew: uvicorn closes one idle for its timeout_keep_alive (5 s, ingress's and the bare app's).
IDLE_REOPEN = 3.0
MAKE_CONCURRENCY = 8                # connections making conversations before a round
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
BUSY_KEY = "conv.c-bench-busy"      # the bare side's held key (the same shape as crewlet's)


# --------------------------------------------------------------------------
# The bare SSE app (a subprocess: this file with --serve-baseline)
# --------------------------------------------------------------------------

def serve_baseline(port: int) -> None:
    """A bare Starlette app on uvicorn, served as ingress serves its own (lifespan off, no
    access log, uvicorn's default HTTP implementation, one asyncio loop); SIGTERM ends it.
    ``POST /runs``: the JSON body read, then an SSE answer: a ``retry`` line and one
    ``run.started`` event, at once, then the end."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def start_run(request):
        body = await request.json()
        event = json.dumps({"type": "run.started", "run": "r-" + uuid.uuid4().hex[:24],
                            "conversation": "c-bare", "at": time.time(), "node": "bare",
                            "seat": "s000", "input": len(body.get("input") or "")},
                           separators=(",", ":"))

        async def events():
            yield b"retry: 1000\n\n"
            yield f"id: 1\nevent: run.started\ndata: {event}\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    app = Starlette(routes=[Route("/runs", start_run, methods=["POST"])])
    config = uvicorn.Config(app, host=HOST, port=port, lifespan="off", log_config=None,
                            access_log=False, ws="none", timeout_graceful_shutdown=2)
    asyncio.run(uvicorn.Server(config).serve())


class BareSse:
    """The bare SSE app's subprocess, stopped by its pid."""

    def __init__(self, dir: str):
        self.port = free_ports(1)[0]
        self.log_path = os.path.join(dir, "bare-sse.log")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        argv = [sys.executable, os.path.abspath(__file__), "--serve-baseline", str(self.port)]
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                         stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)

    async def wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        raw = run_request(self.port, "/runs", {"input": INPUT, "stream": True}, {})
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchError(f"the bare SSE app exited with {self.proc.returncode}:\n"
                                 f"{tail(self.log_path, 15)}")
            try:
                conn = await Conn(self.port).open()
                try:
                    got = await read_stream(conn, raw)
                finally:
                    conn.close()
                if got["status"] == 200 and got["started"] is not None:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"the bare SSE app not serving within {timeout:g}s:\n"
                                 f"{tail(self.log_path, 15)}")
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        stop_process(self.proc, "the bare SSE app", STOP_GRACE)


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------

def seat_names(n: int) -> list[str]:
    return [f"s{i:03d}" for i in range(n)]


def bench_company(seats: list[str]) -> dict[str, Any]:
    hold = " ".join(f"w{i}" for i in range(HOLD_WORDS))
    return {
        "company": {"name": "bench"},
        "providers": {"p": {"kind": "scripted", "rules": [
            {"match": "^hold ", "reply": hold, "pace": HOLD_PACE},
            {"match": ".*", "reply": REPLY}]}},
        "seats": [{"name": s, "persona": "bench", "provider": "p"} for s in [*seats, HOLDER]],
    }


class ConvNode(Crewletd):
    """A real node with the bench's company and conversation settings."""

    STOP_GRACE = 60.0

    def __init__(self, base: str, binary: str, seats: list[str], runner: int):
        super().__init__(base, {
            "node": {"id": NODE_ID},
            # Every seat claimed in the first sweep (the design's 4 per 5 s would take minutes).
            "fleet": {"claims_per_sweep": len(seats) + 1, "sweep": 1.0},
            "conversations": {"busy_wait": 0},
            "sessions": {"runner_concurrency": runner},
        }, binary=binary)
        self.seats = seats
        self.company_path = os.path.join(base, "company.yaml")
        with open(self.company_path, "w") as f:
            json.dump(bench_company(seats), f)
        self.token = ""

    def start(self) -> None:
        # The environment's runner concurrency would win over the config's (crewlet/config/load.py).
        os.environ.pop("SESSION_RUNNER_CONCURRENCY", None)
        super().start("--company", self.company_path)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def json_request(node: ConvNode, method: str, path: str, body: Any = None) -> bytes:
    hdrs = node.auth()
    data = b""
    if body is not None:
        hdrs["Content-Type"] = "application/json"
        data = json.dumps(body, separators=(",", ":")).encode()
    return http_request(method, path, node.ingress_port, hdrs, data)


def run_request(port: int, path: str, body: dict[str, Any], hdrs: dict[str, str]) -> bytes:
    return http_request("POST", path, port, {**hdrs, "Content-Type": "application/json",
                                             "Accept": "text/event-stream"},
                        json.dumps(body, separators=(",", ":")).encode())


async def call(conn: Conn, raw: bytes) -> tuple[int, Any]:
    status, body = await asyncio.wait_for(conn.request(raw), REQUEST_TIMEOUT)
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, body[:300]


async def wait_ready(node: ConvNode, timeout: float) -> dict[str, float]:
    """Until ingress serves with the node's admin token, every seat is held by this node, the
    company is in ingress, and a streamed run completes; the seconds from now to each."""
    from crewlet import tokens

    t0 = time.monotonic()
    out: dict[str, float] = {}
    want = set(node.seats) | {HOLDER}
    while True:
        node.check_alive()
        if time.monotonic() - t0 > timeout:
            raise BenchError(f"the node not ready within {timeout:g}s (reached: {sorted(out) or 'nothing'}); "
                             f"its log:\n{node.log_tail()}")
        await asyncio.sleep(0.25)
        if not node.token:
            try:
                node.token = tokens.read_admin_token(node.run_dir)
            except OSError:
                continue
        try:
            conn = await Conn(node.ingress_port).open()
        except OSError:
            continue
        try:
            status, body = await call(conn, json_request(node, "GET", "/v1/seats?limit=500"))
            if status != 200:
                continue
            out.setdefault("serving_s", time.monotonic() - t0)
            held = {r["seat"] for r in body["items"] if r.get("owner") == NODE_ID}
            if not held >= want:
                continue
            out.setdefault("held_s", time.monotonic() - t0)
            status, body = await call(conn, json_request(node, "GET", "/v1/company"))
            if status != 200 or not body.get("rev"):
                continue
            status, body = await call(conn, json_request(node, "POST", "/v1/conversations",
                                                         {"seat": node.seats[0]}))
            if status != 201:
                continue
            got = await read_stream(conn, run_request(node.ingress_port, f"/v1/conversations/{body['id']}/runs",
                                                      {"input": INPUT, "stream": True}, node.auth()))
            if got["status"] != 200 or got["end"] != "run.completed":
                raise BenchError(f"a first streamed run did not complete: {got}")
            out["first_run_s"] = time.monotonic() - t0
            return out
        finally:
            conn.close()


# --------------------------------------------------------------------------
# Reading an SSE answer
# --------------------------------------------------------------------------

async def read_stream(conn: Conn, raw: bytes) -> dict[str, Any]:
    """Send *raw* (a POST answered with an SSE stream, or a problem) on *conn* and read the
    answer whole: perf_counter times of the request sent, the head read, the first
    ``run.started``, the first ``message.delta`` and the terminal event parsed (None:
    not seen); a non-200 answer's body is kept as ``problem``."""
    perf = time.perf_counter
    reader = conn.reader
    out: dict[str, Any] = {"status": None, "head": None, "started": None, "delta": None, "ended": None,
                           "end": None, "events": 0, "problem": None, "content_type": None, "at": {}}
    out["wall"], out["sent"] = time.time(), perf()
    conn.writer.write(raw)
    status, head = await conn.head()
    out["head"] = perf()
    out["status"] = status
    out["content_type"] = _header(head, b"content-type")
    if status != 200:
        length = _header(head, b"content-length")
        body = await reader.readexactly(int(length)) if length else b""
        out["ended"], out["problem"] = perf(), body
        return out
    if _header(head, b"transfer-encoding") != b"chunked":
        raise BenchError(f"an SSE answer not chunked: {head[:300]!r}")
    buf = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return out
        buf += chunk[:-2]
        while (end := buf.find(b"\n\n")) >= 0:
            block, buf = buf[:end], buf[end + 2:]
            kind = data = None
            for line in block.split(b"\n"):
                if line.startswith(b"event: "):
                    kind = line[7:].decode()
                elif line.startswith(b"data: "):
                    data = line[6:]
            if kind is None:
                continue
            t = perf()
            out["events"] += 1
            if kind == "run.started" and out["started"] is None:
                out["started"] = t
            elif kind == "message.delta" and out["delta"] is None:
                out["delta"] = t
            elif kind in TERMINAL and out["ended"] is None:
                out["ended"], out["end"] = t, kind
            else:
                continue
            # When the event was made (its "at": the wall clock of the process that
            # published it, this machine's), for the stages of the run.
            try:
                out["at"][kind] = float(json.loads(data)["at"])
            except (TypeError, ValueError, KeyError):
                pass


def ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (b - a) * 1000.0


# --------------------------------------------------------------------------
# Conversations made before a round
# --------------------------------------------------------------------------

async def make_conversations(node: ConvNode, seats: list[str]) -> list[str]:
    """A fresh conversation with each of *seats* (in order; repeats make more), made over
    :data:`MAKE_CONCURRENCY` connections; their ids in the same order."""
    ids: list[str | None] = [None] * len(seats)
    todo = iter(range(len(seats)))

    async def worker() -> None:
        conn = await Conn(node.ingress_port).open()
        try:
            for i in todo:
                status, body = await call(conn, json_request(node, "POST", "/v1/conversations", {"seat": seats[i]}))
                if status != 201:
                    raise BenchError(f"POST /v1/conversations: {status} {body}")
                ids[i] = body["id"]
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(min(MAKE_CONCURRENCY, len(seats)))))
    return ids  # type: ignore[return-value]


# --------------------------------------------------------------------------
# 1. time to first event
# --------------------------------------------------------------------------

# The stages of a streamed run, from the events' own "at" (the publisher's wall clock) and the
# bench's wall clock at the request and at each event parsed: name -> (from, to).
STAGES = {
    "request -> run.started made": ("sent", "run.started"),
    "run.started made -> parsed": ("run.started", "started"),
    "run.started made -> first delta made": ("run.started", "message.delta"),
    "first delta made -> parsed": ("message.delta", "delta"),
    "first delta made -> run.completed made": ("message.delta", "run.completed"),
    "run.completed made -> parsed": ("run.completed", "ended"),
}


def stages(got: dict[str, Any]) -> dict[str, float | None]:
    """ms of each of :data:`STAGES` for one streamed run read by :func:`read_stream`."""
    def wall(point: str) -> float | None:
        if point == "sent":
            return got["wall"]
        if point in ("started", "delta", "ended"):
            return None if got[point] is None else got["wall"] + (got[point] - got["sent"])
        return got["at"].get(point)

    return {name: ms(wall(a), wall(b)) for name, (a, b) in STAGES.items()}


async def first_events_crewlet(node: ConvNode, convs: list[str]) -> dict[str, list[float]]:
    conn = await Conn(node.ingress_port).open()
    out: dict[str, list[float]] = {"head": [], "started": [], "delta": [], "ended": [],
                                   **{name: [] for name in STAGES}}
    try:
        for conv in convs:
            got = await asyncio.wait_for(read_stream(conn, run_request(
                node.ingress_port, f"/v1/conversations/{conv}/runs", {"input": INPUT, "stream": True},
                node.auth())), REQUEST_TIMEOUT)
            if got["status"] != 200 or got["end"] != "run.completed" or got["started"] is None \
                    or got["delta"] is None:
                raise BenchError(f"a streamed run of {conv}: status {got['status']}, end {got['end']}, "
                                 f"{got['events']} events; {got['problem']!r}")
            for k in ("head", "started", "delta", "ended"):
                out[k].append(ms(got["sent"], got[k]))
            for k, v in stages(got).items():
                if v is not None:
                    out[k].append(v)
            await asyncio.sleep(GAP)
    finally:
        conn.close()
    return out


async def first_events_bare(bare: BareSse, n: int) -> dict[str, list[float]]:
    conn = await Conn(bare.port).open()
    raw = run_request(bare.port, "/runs", {"input": INPUT, "stream": True}, {})
    out: dict[str, list[float]] = {"head": [], "started": []}
    try:
        for _ in range(n):
            got = await asyncio.wait_for(read_stream(conn, raw), REQUEST_TIMEOUT)
            if got["status"] != 200 or got["started"] is None:
                raise BenchError(f"the bare SSE app: {got}")
            out["head"].append(ms(got["sent"], got["head"]))
            out["started"].append(ms(got["sent"], got["started"]))
            await asyncio.sleep(GAP)
    finally:
        conn.close()
    return out


async def bare_turns(node: ConvNode, seats: list[str]) -> dict[str, list[float]]:
    """Mail with wait, one at a time: request -> the answer with the ended turn."""
    conn = await Conn(node.ingress_port).open()
    out: dict[str, list[float]] = {"answer": [], "took": []}
    perf = time.perf_counter
    try:
        for seat in seats:
            raw = json_request(node, "POST", f"/v1/seats/{seat}/mail", {"text": INPUT, "wait": 30})
            t0 = perf()
            status, body = await call(conn, raw)
            t1 = perf()
            turn = (body or {}).get("turn") if isinstance(body, dict) else None
            if status != 202 or not turn or turn.get("outcome") != "done":
                raise BenchError(f"mail with wait to {seat}: {status} {body}")
            out["answer"].append((t1 - t0) * 1000.0)
            out["took"].append(float(turn.get("took_ms") or 0.0))
            await asyncio.sleep(GAP)
    finally:
        conn.close()
    return out


async def measure_first_events(node: ConvNode, bare: BareSse, args: argparse.Namespace) -> dict[str, Any]:
    n, seats = args.runs, node.seats
    order = itertools.cycle(seats)
    pools: dict[str, dict[str, list[float]]] = {"crewlet": collections.defaultdict(list),
                                                "sse": collections.defaultdict(list),
                                                "turn": collections.defaultdict(list)}

    async def side(name: str, count: int) -> dict[str, list[float]]:
        picked = [next(order) for _ in range(count)]
        if name == "crewlet":
            return await first_events_crewlet(node, await make_conversations(node, picked))
        if name == "sse":
            return await first_events_bare(bare, count)
        return await bare_turns(node, picked)

    names = ["crewlet", "sse", "turn"]
    for name in names:  # warm-up, not counted
        await side(name, max(3, n // 5))
    for i in range(args.rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            got = await side(name, n)
            for k, v in got.items():
                pools[name][k] += v
        say(f"  round {i + 1}: run.started p50 {statistics.median(pools['crewlet']['started']):.1f} ms, "
            f"bare SSE {statistics.median(pools['sse']['started']):.1f} ms, first delta "
            f"{statistics.median(pools['crewlet']['delta']):.1f} ms, bare turn "
            f"{statistics.median(pools['turn']['answer']):.1f} ms")
    out = {name: {k: summary(v) for k, v in pool.items()} for name, pool in pools.items()}
    c, s, t = out["crewlet"], out["sse"], out["turn"]
    out["ratio"] = {
        "started_vs_sse": {q: ratio(c["started"][k], s["started"][k]) for q, k in QS},
        "delta_vs_turn": {q: ratio(c["delta"][k], t["answer"][k]) for q, k in QS},
        "ended_vs_turn": {q: ratio(c["ended"][k], t["answer"][k]) for q, k in QS},
    }
    return out


QS = (("p50", "median"), ("p95", "p95"), ("p99", "p99"))


# --------------------------------------------------------------------------
# 2. runs per second at N concurrent conversations
# --------------------------------------------------------------------------

class RunEnds:
    """The terminal events of runs, heard on the node's broker (core NATS, ``runs.>``)."""

    def __init__(self, url: str):
        self.url = url
        self.nc: Any = None
        self.ended: dict[str, tuple[float, str]] = {}
        self.waiting: dict[str, asyncio.Future] = {}

    async def open(self) -> None:
        self.nc = await nats.connect(self.url, name="bench-run-ends", connect_timeout=2, allow_reconnect=False)
        await self.nc.subscribe("runs.>", cb=self._on_event)
        await self.nc.flush()

    async def close(self) -> None:
        if self.nc is not None:
            try:
                await asyncio.wait_for(self.nc.close(), 10)
            except Exception:
                pass

    async def _on_event(self, msg) -> None:
        data = msg.data
        if b'"type":"run.completed"' not in data and b'"type":"run.failed"' not in data \
                and b'"type":"run.interrupted"' not in data:
            return
        t = time.perf_counter()
        try:
            event = json.loads(data)
        except ValueError:
            return
        run = event.get("run")
        if run in self.ended:
            return
        self.ended[run] = (t, event.get("type"))
        fut = self.waiting.pop(run, None)
        if fut is not None and not fut.done():
            fut.set_result(self.ended[run])

    async def wait(self, run: str, timeout: float) -> tuple[float, str]:
        if run in self.ended:
            return self.ended[run]
        fut = self.waiting.setdefault(run, asyncio.get_running_loop().create_future())
        return await asyncio.wait_for(fut, timeout)


async def closed_loop(port: int, jobs: list[list[bytes]], handle) -> dict[str, Any]:
    """One worker per list of *jobs* (pre-encoded requests), each on its own connection
    (opened before the clock), one request after another; ``await handle(status, body,
    t_sent)`` -> the time the job counts as finished. Rate over the first request -> the
    last finish."""
    conns = [await Conn(port).open() for _ in jobs]
    finished: list[float] = []
    lat: list[float] = []
    perf = time.perf_counter

    async def worker(i: int, mine: list[bytes]) -> None:
        used = perf()
        for raw in mine:
            if perf() - used > IDLE_REOPEN:  # uvicorn closes a connection idle for its keep-alive
                conns[i].close()
                conns[i] = await Conn(port).open()
            t0 = perf()
            status, body = await call(conns[i], raw)
            used = perf()
            t1 = await handle(status, body, t0)
            finished.append(t1)
            lat.append((t1 - t0) * 1000.0)

    try:
        t0 = perf()
        await asyncio.gather(*(worker(i, m) for i, m in enumerate(jobs)))
    finally:
        for c in conns:
            c.close()
    seconds = max(finished) - t0
    return {"n": len(finished), "seconds": seconds, "per_s": len(finished) / seconds if seconds > 0 else None,
            "latency_ms": summary(lat), "lat": lat}


async def runs_round(node: ConvNode, ends: RunEnds, seats: list[str], per_worker: int,
                     convs: list[str]) -> dict[str, Any]:
    """*per_worker* runs a worker (one per seat of *seats*), on *convs* (made before: that many
    each, in the seats' order)."""
    jobs = [[json_request(node, "POST", f"/v1/conversations/{c}/runs", {"input": INPUT, "stream": False})
             for c in convs[i * per_worker:(i + 1) * per_worker]] for i in range(len(seats))]
    queued = 0
    outcomes: collections.Counter = collections.Counter()

    async def handle(status: int, body: Any, t0: float) -> float:
        nonlocal queued
        if status != 202 or not isinstance(body, dict):
            raise BenchError(f"POST a run: {status} {body}")
        queued += bool(body.get("queued"))
        t, kind = await ends.wait(body["run"]["id"], STALL)
        outcomes[kind] += 1
        return t

    r = await closed_loop(node.ingress_port, jobs, handle)
    r["queued"], r["outcomes"] = queued, dict(outcomes)
    if outcomes.get("run.completed", 0) != r["n"]:
        raise BenchError(f"runs ended {dict(outcomes)}")
    return r


async def mails_round(node: ConvNode, seats: list[str], per_worker: int) -> dict[str, Any]:
    jobs = [[json_request(node, "POST", f"/v1/seats/{s}/mail", {"text": INPUT, "wait": STALL})] * per_worker
            for s in seats]

    async def handle(status: int, body: Any, t0: float) -> float:
        t = time.perf_counter()
        turn = body.get("turn") if isinstance(body, dict) else None
        if status != 202 or not turn or turn.get("outcome") != "done":
            raise BenchError(f"mail with wait: {status} {body}")
        return t

    return await closed_loop(node.ingress_port, jobs, handle)


async def measure_throughput(node: ConvNode, args: argparse.Namespace) -> dict[str, Any]:
    c = args.concurrency
    workers = [node.seats[i % len(node.seats)] for i in range(c)]
    per = args.runs_per_conversation
    ends, turns = RunEnds(node.url), Turns(node)
    procs = await asyncio.to_thread(node.processes, others=True)
    me = psutil.Process()
    rounds: dict[str, list[dict[str, Any]]] = {"runs": [], "turns": [], "mails": []}
    try:
        await ends.open()
        await turns.open(time.perf_counter() + 30)

        async def side(name: str, tag: str, k: int) -> dict[str, Any]:
            if name == "runs":  # made before the clock and the CPU meter start
                convs = await make_conversations(node, [s for s in workers for _ in range(k)])
            meter = CpuMeter({**procs, "bench": me}).start()
            if name == "runs":
                r = await runs_round(node, ends, workers, k, convs)
            elif name == "turns":
                r = await turns.round(turns_plan(node.seats, c * k, f"{tag}-{uuid.uuid4().hex[:6]}"), 256, STALL)
            else:
                r = await mails_round(node, workers, k)
            r["cpu"] = {n: round(v, 1) for n, v in meter.read().items() if v is not None}
            return r

        names = ["runs", "turns", "mails"]
        for name in names:  # warm-up, not counted
            await side(name, "warm", 1)
        for i in range(args.rounds):
            for name in (names if i % 2 == 0 else names[::-1]):
                rounds[name].append(await side(name, f"r{i}", per))
            say(f"  round {i + 1}: runs {rounds['runs'][-1]['per_s']:.1f}/s, turns (bench/turns.py) "
                f"{rounds['turns'][-1]['per_s']:.1f}/s, mail+wait c={c} {rounds['mails'][-1]['per_s']:.1f}/s")
    finally:
        await ends.close()
        await turns.close()
    out: dict[str, Any] = {"rounds": rounds}
    for name, rs in rounds.items():
        out[name] = statistics.median(r["per_s"] for r in rs) if rs else None
        if name != "turns":  # request -> the run's end heard (the mail's answer), pooled over rounds
            out[f"{name}_latency_ms"] = summary([x for r in rs for x in r.pop("lat")])
    out["ratio"] = {"runs_vs_turns": ratio(out["runs"], out["turns"]),
                    "runs_vs_mails": ratio(out["runs"], out["mails"])}
    return out


# --------------------------------------------------------------------------
# 3. the 409 decision
# --------------------------------------------------------------------------

async def refusals_crewlet(node: ConvNode, conv: str, running: str, n: int) -> list[float]:
    conn = await Conn(node.ingress_port).open()
    raw = run_request(node.ingress_port, f"/v1/conversations/{conv}/runs", {"input": INPUT, "stream": True},
                      node.auth())
    lat = []
    try:
        for _ in range(n):
            got = await asyncio.wait_for(read_stream(conn, raw), REQUEST_TIMEOUT)
            if got["status"] != 409 or not (got["content_type"] or b"").startswith(PROBLEM):
                raise BenchError(f"a second run of a busy conversation: {got['status']} "
                                 f"{got['content_type']!r} {got['problem']!r}")
            problem = json.loads(got["problem"])
            if problem.get("code") != "conversation_busy" or problem.get("run_id") != running \
                    or b"event:" in got["problem"]:
                raise BenchError(f"a second run of a busy conversation: {problem}")
            lat.append(ms(got["sent"], got["ended"] or time.perf_counter()))
    finally:
        conn.close()
    return lat


async def refusals_bare(kv, n: int) -> list[float]:
    from nats.js.errors import KeyWrongLastSequenceError

    lat, perf = [], time.perf_counter
    for _ in range(n):
        t0 = perf()
        try:
            await kv.create(BUSY_KEY, b"x")
        except KeyWrongLastSequenceError:
            lat.append((perf() - t0) * 1000.0)
        else:
            raise BenchError("a bare kv.create of an existing key succeeded")
    return lat


async def refusals_drivers(drivers, conv: str, n: int) -> list[float]:
    from crewlet.conversations.lease import ConversationBusy

    lat, perf = [], time.perf_counter
    for i in range(n):
        t0 = perf()
        try:
            driving = await drivers.acquire(conv, f"r-bench-{i}", wait=0)
        except ConversationBusy:
            lat.append((perf() - t0) * 1000.0)
        else:
            await driving.release()
            raise BenchError("Drivers.acquire of a held conversation succeeded")
    return lat


async def cancel_run(node: ConvNode, conv: str | None, run: str | None) -> None:
    """Cancel *run* (the held one goes, interrupted before its next word); best effort."""
    if conv is None or run is None or not node.alive():
        return
    try:
        conn = await Conn(node.ingress_port).open()
        try:
            await call(conn, json_request(node, "POST", f"/v1/conversations/{conv}/runs/{run}/cancel"))
        finally:
            conn.close()
    except (OSError, asyncio.TimeoutError) as exc:
        say(f"  cancelling the held run: {type(exc).__name__}: {exc}")


async def measure_refusals(node: ConvNode, server: NatsServer, args: argparse.Namespace) -> dict[str, Any]:
    from crewlet.conversations.lease import Drivers
    from crewlet.coord import buckets

    conv = running = None
    conn = await Conn(node.ingress_port).open()
    try:
        status, body = await call(conn, json_request(node, "POST", "/v1/conversations", {"seat": HOLDER}))
        if status != 201:
            raise BenchError(f"POST /v1/conversations: {status} {body}")
        conv = body["id"]
        status, body = await call(conn, json_request(node, "POST", f"/v1/conversations/{conv}/runs",
                                                     {"input": HOLD_INPUT, "stream": False}))
        if status != 202 or body.get("queued"):
            raise BenchError(f"the holding run: {status} {body}")
        running = body["run"]["id"]
        deadline = time.monotonic() + 30
        while True:  # until the conversation runs (the turn has the run)
            status, got = await call(conn, json_request(node, "GET", f"/v1/conversations/{conv}"))
            if status == 200 and got["conversation"]["status"] == "running" and got.get("messages"):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"the holding run not running within 30 s: {got}")
            await asyncio.sleep(0.2)
    finally:
        conn.close()
    bare_nc = holder_driving = None
    pools: dict[str, list[float]] = {"crewlet": [], "bare": [], "drivers": []}
    try:
        bare_nc = await nats.connect(server.url, name="bench-refusals", connect_timeout=2,
                                     allow_reconnect=False)
        js = bare_nc.jetstream(timeout=JS_TIMEOUT)
        kv = await buckets.ensure(js, buckets.LEASES, 1)
        await kv.create(BUSY_KEY, b"held")
        # A conversation driven by "another node", and this node's claim of it.
        other = Drivers(js, "other", "boot-" + uuid.uuid4().hex[:8], ttl=15)
        mine = Drivers(js, NODE_ID, "boot-" + uuid.uuid4().hex[:8], ttl=15)
        bare_conv = "c-bench-drivers"
        holder_driving = await other.acquire(bare_conv, "r-bench-holder", wait=0)
        sides = {"crewlet": lambda k: refusals_crewlet(node, conv, running, k),
                 "bare": lambda k: refusals_bare(kv, k),
                 "drivers": lambda k: refusals_drivers(mine, bare_conv, k)}
        names = list(sides)
        for name in names:  # warm-up, not counted
            await sides[name](max(5, args.refusals // 5))
        for i in range(args.rounds):
            for name in (names if i % 2 == 0 else names[::-1]):
                pools[name] += await sides[name](args.refusals)
            say(f"  round {i + 1}: 409 p50 {statistics.median(pools['crewlet']):.2f} ms, Drivers.acquire "
                f"{statistics.median(pools['drivers']):.2f} ms, bare kv.create "
                f"{statistics.median(pools['bare']):.2f} ms")
    finally:
        if holder_driving is not None:
            await holder_driving.release()
        if bare_nc is not None:
            await bare_nc.close()
        await cancel_run(node, conv, running)
    out: dict[str, Any] = {k: summary(v) for k, v in pools.items()}
    out["ratio"] = {"vs_bare": {q: ratio(out["crewlet"][k], out["bare"][k]) for q, k in QS},
                    "drivers_vs_bare": {q: ratio(out["drivers"][k], out["bare"][k]) for q, k in QS},
                    "vs_drivers": {q: ratio(out["crewlet"][k], out["drivers"][k]) for q, k in QS}}
    return out


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

async def measure(node: ConvNode, server: NatsServer, bare: BareSse, args: argparse.Namespace,
                  rep: dict[str, Any]) -> None:
    rep["stage"] = "starting the node, the bare server and the bare SSE app"
    node.start()
    server.start()
    bare.start()
    await wait_jetstream(server.url)
    await bare.wait()
    rep["stage"] = "waiting for the node"
    rep["node"] = await wait_ready(node, READY_TIMEOUT)
    say(f"node serving after {rep['node']['serving_s']:.1f}s, seats held after {rep['node']['held_s']:.1f}s, "
        f"a first run after {rep['node']['first_run_s']:.1f}s")
    rep["pids"] = {k: p.pid for k, p in (await asyncio.to_thread(node.processes, others=True)).items()}
    if "1" in args.parts:
        rep["stage"] = "(1) time to first event"
        say(f"(1) time to first event: {args.rounds} rounds of {args.runs} streamed runs, bare SSE, bare turns")
        rep["first_events"] = await measure_first_events(node, bare, args)
    if "2" in args.parts:
        rep["stage"] = "(2) runs per second"
        say(f"(2) runs/s at {args.concurrency} conversations: {args.rounds} rounds of "
            f"{args.concurrency * args.runs_per_conversation} runs, turns (bench/turns.py), mail+wait")
        rep["throughput"] = await measure_throughput(node, args)
    if "3" in args.parts:
        rep["stage"] = "(3) the 409 decision"
        say(f"(3) the 409 decision: {args.rounds} rounds of {args.refusals} refusals, Drivers.acquire, "
            f"bare kv.create")
        rep["refusals"] = await measure_refusals(node, server, args)
    node.check_alive()
    rep["stage"] = "done"


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    binary = find_nats_server(args.nats_server)
    base = tempfile.mkdtemp(prefix="cwconv", dir="/tmp")
    seats = seat_names(args.seats)
    # Room for the workers' runs and for as many whose drivers are still letting go (the end is
    # heard before the driver deletes its follower and releases its lease): past the runner's
    # concurrency a run nobody streams is kept queued and waits for the runner.
    node = ConvNode(os.path.join(base, "n"), binary, seats, runner=2 * args.concurrency + 16)
    server = NatsServer(binary, os.path.join(base, "bare"))
    bare = BareSse(base)
    rep: dict[str, Any] = {"stage": "", "config": config(args, binary)}
    t0 = time.monotonic()
    say(f"dir {base}; node ingress :{node.ingress_port}, broker :{node.stream_port}; bare broker "
        f":{server.port}, bare SSE app :{bare.port}")
    try:
        asyncio.run(measure(node, server, bare, args, rep))
    except BenchError as exc:
        rep["error"] = f"while {rep['stage']}: {exc}"
        say(f"FAILED {rep['error']}")
    finally:
        wind_up(rep, args, base, node, server, [bare], t0)
    return rep


def config(args: argparse.Namespace, binary: str) -> dict[str, Any]:
    import importlib.util

    import uvicorn
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return {"quick": args.quick, "rounds": args.rounds, "runs": args.runs, "concurrency": args.concurrency,
            "runs_per_conversation": args.runs_per_conversation, "refusals": args.refusals,
            "seats": args.seats, "parts": args.parts, "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "nats_server": server_version(binary), "nats_py": NATS_PY_VERSION, "uvicorn": uvicorn.__version__,
            "http": http, "date": time.strftime("%Y-%m-%d")}


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def _f(v: float | None, spec: str) -> str:
    width = int(spec.split(".")[0] or 0)
    return f"{v:{spec}}" if v is not None else f"{'n/a':>{width}}"


def _lat(s: dict[str, Any]) -> str:
    return f"{_f(s['median'], '7.2f')} {_f(s['p95'], '7.2f')} {_f(s['p99'], '7.2f')}"


def _x(r: dict[str, float | None]) -> str:
    return " ".join(_f(r[q], "6.2f") for q, _ in QS)


def _cpu(cpu: dict[str, float]) -> str:
    names = ("ingress", "seats", "data_applier", "broker", "workers", "crewletd", "bench")
    shown = [f"{k} {cpu[k]:.0f}" for k in names if k in cpu]
    rest = sum(v for k, v in cpu.items() if k not in names)
    return ", ".join(shown + ([f"rest {rest:.0f}"] if rest >= 0.5 else []))


def print_text(rep: dict[str, Any]) -> None:
    cfg = rep["config"]
    print(f"crewlet conversations benchmark  ({cfg['date']}, python {cfg['python']}, {cfg['cpus']} cpus, "
          f"nats-server {cfg['nats_server']}, nats-py {cfg['nats_py']}, uvicorn {cfg['uvicorn']} ({cfg['http']}); "
          f"{cfg['rounds']} interleaved rounds per figure; x = crewlet/baseline)")
    if rep.get("error"):
        print(f"FAILED {rep['error']}")
    node = rep.get("node")
    if node:
        print(f"node: {cfg['seats']} seats + {HOLDER}; serving {node['serving_s']:.1f} s after start, every seat "
              f"held at {node['held_s']:.1f} s, a first streamed run completed at {node['first_run_s']:.1f} s")
    print()
    fe = rep.get("first_events")
    if fe:
        c, s, t = fe["crewlet"], fe["sse"], fe["turn"]
        print(f"(1) a streamed run (POST /v1/conversations/{{id}}/runs, stream: true, a fresh conversation "
              f"each, one at a time), ms from the request sent; n {c['started']['n']}")
        print(f"    {'':38} {'p50':>7} {'p95':>7} {'p99':>7}      {'x p50':>6} {'x p95':>6} {'x p99':>6}")
        print(f"    {'crewlet: the answer head':38} {_lat(c['head'])}")
        print(f"    {'crewlet: run.started parsed':38} {_lat(c['started'])}  vs (a) {_x(fe['ratio']['started_vs_sse'])}")
        print(f"    {'(a) bare SSE app: its event parsed':38} {_lat(s['started'])}")
        print(f"    {'crewlet: first message.delta parsed':38} {_lat(c['delta'])}  vs (b) {_x(fe['ratio']['delta_vs_turn'])}")
        print(f"    {'crewlet: run.completed parsed':38} {_lat(c['ended'])}  vs (b) {_x(fe['ratio']['ended_vs_turn'])}")
        print(f"    {'(b) bare turn: mail + wait answered':38} {_lat(t['answer'])}")
        print(f"    {'    its turn inside seats (took_ms)':38} {_lat(t['took'])}")
        print("    the run's stages, from each event's own 'at' (the publisher's clock) and the bench's:")
        for name in STAGES:
            if c.get(name, {}).get("n"):
                print(f"      {name:36} {_lat(c[name])}")
        print()
    tp = rep.get("throughput")
    if tp:
        rs = tp["rounds"]
        print(f"(2) runs per second at {cfg['concurrency']} concurrent conversations (stream: false, closed "
              f"loop, {cfg['concurrency'] * cfg['runs_per_conversation']} runs a round), medians over rounds")
        print(f"    crewlet runs/s            {_f(tp['runs'], '8.1f')}   (rounds: "
              + ", ".join(f"{r['per_s']:.1f}" for r in rs["runs"]) + f"; queued {sum(r['queued'] for r in rs['runs'])})")
        print(f"    turns/s (bench/turns.py)  {_f(tp['turns'], '8.1f')}   (rounds: "
              + ", ".join(f"{r['per_s']:.1f}" for r in rs["turns"]) + ")")
        print(f"    mail + wait c={cfg['concurrency']:<3}/s      {_f(tp['mails'], '8.1f')}   (rounds: "
              + ", ".join(f"{r['per_s']:.1f}" for r in rs["mails"]) + ")")
        print(f"    runs/s ÷ turns/s {_f(tp['ratio']['runs_vs_turns'], '.2f')};  runs/s ÷ mail+wait/s "
              f"{_f(tp['ratio']['runs_vs_mails'], '.2f')}")
        lat = [r["latency_ms"] for r in rs["runs"]]
        if lat:
            print("    a run, request -> run.completed heard, ms per round p50/p99: "
                  + ", ".join(f"{x['median']:.0f}/{x['p99']:.0f}" for x in lat)
                  + "; mail + wait: " + ", ".join(f"{r['latency_ms']['median']:.0f}/{r['latency_ms']['p99']:.0f}"
                                                for r in rs["mails"]))
        for name in ("runs", "turns", "mails"):
            if rs[name]:
                print(f"    CPU % while {name} ran (first round): {_cpu(rs[name][0]['cpu'])}")
        print()
    rf = rep.get("refusals")
    if rf:
        c, d, b = rf["crewlet"], rf["drivers"], rf["bare"]
        print(f"(3) the 409 decision: a second run of a busy conversation (busy_wait 0), ms, n {c['n']}")
        print(f"    {'':40} {'p50':>7} {'p95':>7} {'p99':>7}      {'x p50':>6} {'x p95':>6} {'x p99':>6}")
        print(f"    {'crewlet: 409 conversation_busy read':40} {_lat(c)}  vs bare {_x(rf['ratio']['vs_bare'])}")
        print(f"    {'Drivers.acquire(wait=0), no HTTP':40} {_lat(d)}  vs bare {_x(rf['ratio']['drivers_vs_bare'])}")
        print(f"    {'bare kv.create of an existing key':40} {_lat(b)}")
        print()
    problems = rep.get("node_log") or {}
    if problems:
        print("node log warnings/errors (count, what the first said):")
        for k, v in list(problems.items())[:12]:
            print(f"    {k} x{v['count']}: {v['said']}")
    print(f"took {rep['seconds']:.0f} s; node stopped in {_f(rep.get('node_stop_s'), '.1f')} s"
          + (f"; kept {rep['kept']}" if rep.get("kept") else ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-baseline"]:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops us, by pid
        serve_baseline(int(argv[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke run (< 60 s)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per figure (default 5; quick 2)")
    ap.add_argument("--runs", type=int, help="(1) streamed runs per round and side (default 50; quick 10)")
    ap.add_argument("--concurrency", type=int, default=100, help="(2) conversations at once (default 100)")
    ap.add_argument("--runs-per-conversation", type=int,
                    help="(2) runs each worker starts a round (default 5; quick 1)")
    ap.add_argument("--refusals", type=int, help="(3) refusals per round and side (default 200; quick 40)")
    ap.add_argument("--seats", type=int, default=100, help="worked seats (default 100)")
    ap.add_argument("--parts", default="123", help="which parts to run (default 123)")
    ap.add_argument("--nats-server", help="the nats-server binary for both sides (default: as crewlet finds it)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (a failed run keeps it)")
    add_smoke(ap, argv, {"rounds": 1, "runs": 2, "concurrency": 3, "runs_per_conversation": 1,
                         "refusals": 3, "seats": 3})
    args = ap.parse_args(argv)
    for name, full, small in (("rounds", 5, 2), ("runs", 50, 10), ("runs_per_conversation", 5, 1),
                              ("refusals", 200, 40)):
        if getattr(args, name) is None:
            setattr(args, name, small if args.quick else full)
    if min(args.rounds, args.runs, args.concurrency, args.runs_per_conversation, args.refusals, args.seats) < 1:
        ap.error("counts must be >= 1")
    if args.seats > 999:
        ap.error("--seats: at most 999")
    # SIGTERM ends the run through the finally blocks, like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log.configure(node=None, role="bench", level="warning", fmt="json", stream=sys.stderr)
    try:
        rep = run_all(args)
    except BenchError as exc:
        print(f"bench/conversations.py: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # everything started was stopped on the way out (run_all's finally)
        print("bench/conversations.py: interrupted", file=sys.stderr)
        return 130
    return emit(rep, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
