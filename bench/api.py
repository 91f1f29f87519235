#!/usr/bin/env python3
"""Benchmark: the HTTP API of one node (ingress) beside a bare Starlette app on uvicorn.

Starts, on 127.0.0.1 only, a real node (``crewletd start --company``:
embedded broker, ingress, seats, data; a temp data dir under /tmp) running
the sample company ``etc/company.yaml`` plus two things the bench needs: a
seat ``bench-sink`` that no node may hold (a placement label no node has),
so mail sent to it is stored and never worked, and a ``github`` integration
(secret in ``$BENCH_GITHUB_SECRET`` of crewletd's environment) routing
``issues`` deliveries to that seat. Beside it: a bare ``nats-server -js``
(streams made by crewlet's own code: ``AGENTS`` with a ``bench-sink``
consumer, ``NOTIFY``, the ``claims`` bucket, so the broker does the same work
per request) and a **bare Starlette app** served by uvicorn in a subprocess
the same way ingress is (one asyncio loop, ``lifespan off``, uvicorn's
default HTTP implementation, no access log), whose routes are:

* ``GET /seats`` — ``JSONResponse`` of the very body crewlet's ``GET
  /v1/seats`` answered just before (the same bytes, serialised per request);
* ``POST /mail`` — ``await request.json()``, one ``js.publish`` of its text
  to ``agents.inbox.bench-sink`` (with a ``Nats-Msg-Id``), ``{"seq"}``;
* ``POST /hook`` — the body, one ``kv.create`` in ``claims`` and one
  ``js.publish`` to ``notify.github`` (the broker work a delivery needs).

Every figure is beside that same-run baseline, as a ratio (crewlet/bare; the
machine is noisy, absolute times are not stable). Rounds are interleaved
(the side going first alternates), a warm-up per side is not counted;
latencies are pooled over the rounds (p50/p95/p99, nearest rank),
throughput is the median over rounds. CPU (psutil, 100 % = one core) of
every process of each side is kept while its rounds ran.

0. **The client.** Requests are made by the bench's own HTTP/1.1 keep-alive
   client over asyncio streams (pre-encoded requests, one connection per
   concurrent worker, opened before a round) or by httpx2's ``AsyncClient``;
   both are measured on the bare ``GET /seats`` at concurrency 1 and 16 and
   the one with the lower median latency at concurrency 1 (the client's own
   overhead) is used for the rest (``--client`` forces one).
1. **Reads and mail.** ``GET /v1/seats`` (the whole company, one page) and
   ``POST /v1/seats/bench-sink/mail`` (``{"text": ...}``), each at
   concurrency 1 and 16 (``--concurrency``), ``--requests`` per round and
   side (x4 at concurrency > 1): latency and requests/s beside the bare app's
   ``GET /seats`` and ``POST /mail``.
2. **Webhooks.** Signed GitHub ``issues`` deliveries (a ~1.2 KB body,
   ``X-Hub-Signature-256`` by :func:`crewlet.hooks.sign`, a distinct
   ``X-GitHub-Delivery`` each) to ``/v1/hooks/github``, one at a time and at
   ``--hook-concurrency``, each answered 200 ``duplicate: false``, beside the
   bare app's ``POST /hook``. Target: p99 <= 50 ms. Then the broker calls
   alone, no HTTP, from the bench to the bare server: crewlet's
   ``notify.claim`` + ``notify.store`` + ``notify.mark_stored`` beside a bare
   ``kv.create`` + ``js.publish``.
3. **The live feed.** ``--subscribers`` SSE clients of ``GET /v1/events``
   (each its own connection, the chunked stream read and parsed as it
   comes); once all had their ``snapshot``, ``--turns`` mails (``hello``,
   Idempotency-Key a fresh trigger) to a worked seat (``--feed-seat``), one at
   a time; for each subscriber the delay from the turn's end (its record's
   ``started_at + took_ms / 1000``, wall clock of this machine) to the moment
   it parsed the ``turn`` event of that trigger (outcome ``done``). Also the
   delay to the bench's own core-NATS subscription on the node's
   ``feed.turn.>`` (what ingress hears: the broker's hop), first over a
   few turns with no SSE subscriber open, then beside them. Baseline: as
   many bare nats-py connections each subscribed to one subject on the bare
   server, one message (a captured turn record, same size) published per
   round, the delay from publish to each callback having parsed it. Target:
   p99 <= 100 ms.

``--quick`` (small counts) is a smoke run under a minute. Everything started
is stopped by its pid, on failure and on Ctrl-C too. Exit status: 0 unless
the benchmark itself broke.

    /work/venv/bin/python bench/api.py [--quick] [--json]    # --help for the rest
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import nats  # noqa: E402
import psutil  # noqa: E402
from nats.aio.client import __version__ as NATS_PY_VERSION  # noqa: E402

from crewlet import log  # noqa: E402
from bench.common import (add_smoke, stop_process, BenchError, CpuMeter, Crewletd, NatsServer, child_env, emit,  # noqa: E402
                          find_nats_server, free_ports, ratio, say, server_version, summary, tail,
                          wait_jetstream)

HOST = "127.0.0.1"
NODE_ID = "bench"
COMPANY = os.path.join(ROOT, "etc", "company.yaml")
SINK = "bench-sink"                 # the seat no node may hold: mail and deliveries stay stored
SECRET_ENV = "BENCH_GITHUB_SECRET"  # crewletd's environment holds the integration's secret
SECRET = "bench-secret-" + uuid.uuid4().hex[:8]
INTEGRATION = "github"
FEED_SEAT = "qa-lead"               # a worked seat of the sample company; "hello" -> one reply
MAIL_TEXT = "a message for a seat, about this long, from the api bench"
JS_TIMEOUT = 10.0                   # s: generous, so a slow server shows as slow, not as an error
ROUND_TIMEOUT = 300.0               # s a round of requests may take at most
READY_TIMEOUT = 120.0               # s for the node to serve, hold its seats and work a turn
EVENT_WAIT = 15.0                   # s every subscriber may take to see one turn
FEED_GAP = 0.25                     # s between the feed's turns (and bare publishes)
FEED_SUBJECT = "bench.feed"         # the bare fan-out's subject
TARGET_HOOK_P99 = 50.0              # ms, informational
TARGET_FEED_P99 = 100.0             # ms, informational
STOP_GRACE = 10.0                   # s the baseline server gets after SIGTERM, before SIGKILL

# A GitHub "issues" delivery, a small one (~1.2 KB; real ones run to several KB).
HOOK_BODY = json.dumps({
    "action": "opened",
    "issue": {"number": 4711, "title": "The login page loops after a password reset",
              "body": "Steps: reset the password, follow the mail's link, log in. Expected: the "
                      "dashboard. Seen: the login page again, with no error. " * 6,
              "state": "open", "labels": [{"name": "bug"}, {"name": "auth"}],
              "user": {"login": "octocat", "id": 1}, "html_url": "https://github.com/acme/web/issues/4711"},
    "repository": {"id": 42, "name": "web", "full_name": "acme/web", "private": False,
                   "html_url": "https://github.com/acme/web", "default_branch": "main"},
    "sender": {"login": "octocat", "id": 1, "type": "User"},
}, separators=(",", ":")).encode()


# --------------------------------------------------------------------------
# The bare app (a subprocess: this file with --serve-baseline)
# --------------------------------------------------------------------------

def serve_baseline(port: int, nats_url: str, seats_file: str) -> None:
    """A bare Starlette app on uvicorn, served as ingress serves its own (lifespan off, no
    access log, uvicorn's default HTTP implementation, one asyncio loop); SIGTERM ends it."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from crewlet.coord import buckets
    from crewlet.queue import notify

    with open(seats_file) as f:
        seats = json.load(f)

    async def main() -> None:
        nc = await nats.connect(nats_url, name="bench-bare-app", connect_timeout=2)
        js = nc.jetstream(timeout=JS_TIMEOUT)
        kv = await js.key_value(buckets.CLAIMS.name)

        async def get_seats(request):
            return JSONResponse(seats)

        async def post_mail(request):
            body = await request.json()
            ack = await js.publish("agents.inbox." + SINK, body["text"].encode(),
                                   headers={"Nats-Msg-Id": uuid.uuid4().hex})
            return JSONResponse({"seq": ack.seq}, 202)

        async def post_hook(request):
            body = await request.body()
            delivery = request.headers["x-github-delivery"]
            await kv.create(f"{INTEGRATION}.{delivery}", b'{"state":"claimed"}')
            await js.publish(notify.SUBJECT + INTEGRATION, body,
                             headers={"Nats-Msg-Id": f"{INTEGRATION}:{delivery}"})
            return JSONResponse({"delivery": delivery, "duplicate": False})

        app = Starlette(routes=[Route("/seats", get_seats), Route("/mail", post_mail, methods=["POST"]),
                                Route("/hook", post_hook, methods=["POST"])])
        config = uvicorn.Config(app, host=HOST, port=port, lifespan="off", log_config=None,
                                access_log=False, ws="none", timeout_graceful_shutdown=2)
        try:
            await uvicorn.Server(config).serve()
        finally:
            await nc.close()

    asyncio.run(main())


class BareApp:
    """The bare app's subprocess, stopped by its pid."""

    def __init__(self, dir: str, nats_url: str, seats: dict[str, Any]):
        self.port = free_ports(1)[0]
        self.seats_file = os.path.join(dir, "seats.json")
        self.log_path = os.path.join(dir, "bare-app.log")
        with open(self.seats_file, "w") as f:
            json.dump(seats, f)
        self.nats_url = nats_url
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        argv = [sys.executable, os.path.abspath(__file__), "--serve-baseline", str(self.port),
                self.nats_url, self.seats_file]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=child_env(), start_new_session=True)

    async def wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchError(f"the bare app exited with {self.proc.returncode}:\n{tail(self.log_path, 15)}")
            try:
                conn = await Conn(self.port).open()
                try:
                    status, _ = await conn.request(http_request("GET", "/seats", self.port))
                finally:
                    conn.close()
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"the bare app not serving within {timeout:g}s:\n{tail(self.log_path, 15)}")
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        stop_process(self.proc, "the bare app", STOP_GRACE)


# --------------------------------------------------------------------------
# The clients
# --------------------------------------------------------------------------

def http_request(method: str, path: str, port: int, headers: dict[str, str] | None = None,
                 body: bytes = b"") -> bytes:
    """One HTTP/1.1 request, encoded whole."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method != "GET":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _header(head: bytes, name: bytes) -> bytes | None:
    """The value of header *name* (lower case) in a response's head, or None."""
    at = head.lower().find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    return head[start:head.index(b"\r\n", start)].strip()


class Conn:
    """One HTTP/1.1 keep-alive connection over asyncio streams: requests go out pre-encoded,
    a response is its status line and head (one ``readuntil``) and a Content-Length body
    (one ``readexactly``) or a chunked one."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> "Conn":
        self.reader, self.writer = await asyncio.open_connection(HOST, self.port, limit=1 << 22)
        self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    async def head(self) -> tuple[int, bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        return int(head[9:12]), head

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        status, head = await self.head()
        length = _header(head, b"content-length")
        if length is not None:
            return status, await self.reader.readexactly(int(length)) if length != b"0" else b""
        if _header(head, b"transfer-encoding") == b"chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    return status, b"".join(parts)
                parts.append(chunk[:-2])
        return status, b""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Load:
    """Requests, the same list for both sides' shapes: (method, path, headers, body)."""

    def __init__(self, port: int, reqs: list[tuple[str, str, dict[str, str], bytes]], expect: int,
                 check: Callable[[bytes], bool] | None = None):
        self.port, self.reqs, self.expect, self.check = port, reqs, expect, check


async def run_raw(load: Load, concurrency: int) -> dict[str, Any]:
    """*load* over *concurrency* keep-alive connections of our own client."""
    raws = [http_request(m, p, load.port, h, b) for m, p, h, b in load.reqs]
    n = len(raws)
    conns = [await Conn(load.port).open() for _ in range(min(concurrency, n))]
    lat = [0.0] * n
    bad: list[tuple[int, bytes]] = []
    todo = iter(range(n))

    async def worker(conn: Conn) -> None:
        perf = time.perf_counter
        for i in todo:
            t0 = perf()
            status, body = await conn.request(raws[i])
            lat[i] = perf() - t0
            if status != load.expect or (load.check is not None and not load.check(body)):
                bad.append((status, body[:300]))

    try:
        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker(c) for c in conns)), ROUND_TIMEOUT)
        wall = time.perf_counter() - t0
    finally:
        for c in conns:
            c.close()
    return _result(lat, wall, bad)


async def run_httpx(load: Load, concurrency: int) -> dict[str, Any]:
    """*load* through one httpx2 ``AsyncClient`` of *concurrency* keep-alive connections."""
    import httpx2

    n = len(load.reqs)
    base = f"http://{HOST}:{load.port}"
    lat = [0.0] * n
    bad: list[tuple[int, bytes]] = []
    todo = iter(range(n))
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx2.AsyncClient(base_url=base, limits=limits, timeout=JS_TIMEOUT) as client:
        # Open the connections before the clock starts, as the raw client does.
        await asyncio.gather(*(client.get("/healthz") for _ in range(concurrency)))

        async def worker() -> None:
            perf = time.perf_counter
            for i in todo:
                method, path, headers, body = load.reqs[i]
                t0 = perf()
                r = await client.request(method, path, headers=headers, content=body or None)
                lat[i] = perf() - t0
                if r.status_code != load.expect or (load.check is not None and not load.check(r.content)):
                    bad.append((r.status_code, r.content[:300]))

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(min(concurrency, n)))), ROUND_TIMEOUT)
        wall = time.perf_counter() - t0
    return _result(lat, wall, bad)


def _result(lat: list[float], wall: float, bad: list[tuple[int, bytes]]) -> dict[str, Any]:
    if bad:
        status, body = bad[0]
        raise BenchError(f"{len(bad)} of {len(lat)} requests answered unexpectedly, the first "
                         f"{status}: {body.decode(errors='replace')}")
    return {"lat": lat, "wall": wall}


CLIENTS = {"raw": run_raw, "httpx2": run_httpx}


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------

def bench_company() -> dict[str, Any]:
    """The sample company, plus the sink seat and the github integration routed to it."""
    from crewlet.config.load import parse_yaml

    with open(COMPANY) as f:
        company = parse_yaml(f.read(), COMPANY)
    company["seats"].append({"name": SINK, "persona": "Never held: the api bench's mail sink.",
                             "provider": company["seats"][0]["provider"],
                             "placement": {"labels": {"bench": "nowhere"}}})
    company["integrations"] = {INTEGRATION: {"kind": "github", "secret_env": SECRET_ENV,
                                             "routes": [{"event": "issues", "seat": SINK}]}}
    return company


class ApiNode(Crewletd):
    """A real node on the sample company (and the bench's sink seat and integration)."""

    STOP_GRACE = 60.0

    def __init__(self, base: str, binary: str):
        super().__init__(base, {
            "node": {"id": NODE_ID},
            # Every seat claimed in the first sweeps (the design's 4 per 5 s would take ~40 s).
            "fleet": {"claims_per_sweep": 64, "sweep": 1.0},
        }, binary=binary)
        self.company = bench_company()
        self.company_path = os.path.join(base, "company.yaml")
        with open(self.company_path, "w") as f:
            json.dump(self.company, f)
        self.seats = [s["name"] for s in self.company["seats"]]
        self.token = ""

    def start(self) -> None:
        os.environ[SECRET_ENV] = SECRET  # crewletd's environment is ours (child_env)
        # The ceo seat's MCP server (crewlet-demo-mcp) lives beside this python.
        bindir = os.path.dirname(sys.executable)
        if bindir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        super().start("--company", self.company_path)


async def wait_ready(node: ApiNode, timeout: float) -> dict[str, float]:
    """Until ingress serves with the node's token, every seat but the sink is held by this
    node, and a seat works a turn; the seconds from now to each."""
    t0 = time.monotonic()
    out: dict[str, float] = {}
    token_path = os.path.join(node.run_dir, "api-token")
    seats_req = None
    while True:
        node.check_alive()
        if time.monotonic() - t0 > timeout:
            raise BenchError(f"the node not ready within {timeout:g}s (reached: {sorted(out) or 'nothing'}); "
                             f"its log:\n{node.log_tail()}")
        if not node.token:
            try:
                with open(token_path) as f:
                    node.token = f.read().strip()
            except OSError:
                await asyncio.sleep(0.2)
                continue
            seats_req = http_request("GET", "/v1/seats", node.ingress_port, auth(node))
        try:
            conn = await Conn(node.ingress_port).open()
            try:
                status, body = await conn.request(seats_req)
            finally:
                conn.close()
        except OSError:
            await asyncio.sleep(0.2)
            continue
        if status == 200:
            out.setdefault("serving_s", time.monotonic() - t0)
            rows = json.loads(body)["items"]
            held = {r["seat"] for r in rows if r.get("owner") == NODE_ID}
            if held >= set(node.seats) - {SINK}:
                out["held_s"] = time.monotonic() - t0
                break
        await asyncio.sleep(0.25)
    # A turn, end to end: the seat works mail (and the feed seat's code paths are warm).
    body = json.dumps({"text": "hello", "wait": 30}).encode()
    conn = await Conn(node.ingress_port).open()
    try:
        status, answer = await conn.request(http_request(
            "POST", f"/v1/seats/{FEED_SEAT}/mail", node.ingress_port,
            {**auth(node), "Content-Type": "application/json"}, body))
    finally:
        conn.close()
    if status != 202 or not (json.loads(answer).get("turn") or {}).get("outcome") == "done":
        raise BenchError(f"a first turn of {FEED_SEAT} did not end done: {status} {answer[:300]!r}")
    out["first_turn_s"] = time.monotonic() - t0
    return out


def node_problems(node: Crewletd) -> dict[str, dict[str, Any]]:
    """The node log's warnings and errors by level, role and event: a count, when the first
    was (s after the log's first line) and what it said."""
    out: dict[str, dict[str, Any]] = {}
    t0 = None
    try:
        with open(node.log_path, "rb") as f:
            t0 = json.loads(f.readline()).get("ts")
    except (OSError, ValueError, AttributeError):
        pass
    for rec in node.warnings():
        key = node.problem(rec)
        if key in out:
            out[key]["count"] += 1
            continue
        said = rec.get("error") or rec.get("reason") or rec.get("why") or " ".join(
            f"{k}={rec[k]}" for k in ("method", "path", "status", "code") if k in rec)
        at = rec.get("ts")
        out[key] = {"count": 1, "first_s": round(at - t0, 1) if at and t0 else None, "said": str(said)[:160]}
    return out


def auth(node: ApiNode) -> dict[str, str]:
    return {"Authorization": f"Bearer {node.token}"}


# --------------------------------------------------------------------------
# Rounds, interleaved
# --------------------------------------------------------------------------

async def interleaved(name: str, sides: dict[str, Callable[[], Load]], procs: dict[str, dict[str, Any]],
                      rounds: int, runs: dict[str, Callable], concurrency: int, warmup: int) -> dict[str, Any]:
    """*rounds* rounds of each side's load (made fresh by ``sides[side]()``) run by
    ``runs[side]``, the side going first alternating, after a warm-up of *warmup* requests a
    side; per side pooled latencies (ms), requests/s per round (and their median), the CPU %
    of *procs[side]* while it ran, and their CPU ms per request."""
    out: dict[str, Any] = {s: {"lat": [], "rps": [], "cpu": [], "n": 0} for s in sides}
    order = list(sides)
    for side in order:  # warm-up, not counted
        load = sides[side]()
        load.reqs = load.reqs[:warmup]
        await runs[side](load, concurrency)
    for i in range(rounds):
        for side in (order if i % 2 == 0 else order[::-1]):
            load = sides[side]()
            meter = CpuMeter(procs[side]).start()
            r = await runs[side](load, concurrency)
            cpu = meter.read()
            o = out[side]
            o["lat"] += [x * 1000.0 for x in r["lat"]]
            o["rps"].append(len(r["lat"]) / r["wall"])
            o["cpu"].append((r["wall"], cpu))
            o["n"] += len(r["lat"])
    for side in sides:
        o = out[side]
        o["latency_ms"] = summary(o.pop("lat"))
        o["rps_median"] = statistics.median(o["rps"])
        readings, n = o.pop("cpu"), o.pop("n")
        o["cpu"] = mean_cpu(readings)
        o["cpu_ms"] = {k: round(v, 4) for k, v in cpu_per_request(readings, n).items()}
    c, b = out.get("crewlet"), out.get("bare")
    row = {"name": name, "concurrency": concurrency, **out}
    if c and b:
        row["ratio"] = {"p50": ratio(c["latency_ms"]["median"], b["latency_ms"]["median"]),
                        "p95": ratio(c["latency_ms"]["p95"], b["latency_ms"]["p95"]),
                        "p99": ratio(c["latency_ms"]["p99"], b["latency_ms"]["p99"]),
                        "rps": ratio(c["rps_median"], b["rps_median"]),
                        "server_cpu": ratio(c["cpu_ms"].get("ingress"), b["cpu_ms"].get("app")),
                        "all_cpu": ratio(served_cpu(c["cpu_ms"]), served_cpu(b["cpu_ms"]))}
    say(f"  {name} c={concurrency}: " + "; ".join(
        f"{s} p50 {out[s]['latency_ms']['median']:.2f} p99 {out[s]['latency_ms']['p99']:.2f} ms, "
        f"{out[s]['rps_median']:.0f}/s, bench CPU {out[s]['cpu'].get('bench', 0):.0f} %" for s in sides))
    return row


def cpu_per_request(readings: list[tuple[float, dict[str, float | None]]], n: int) -> dict[str, float]:
    """Each process's CPU ms per request over the rounds (*n* requests in all)."""
    total: dict[str, float] = collections.defaultdict(float)
    for seconds, cpu in readings:
        for name, pct in cpu.items():
            if pct is not None:
                total[name] += pct / 100.0 * seconds
    return {name: t / n * 1000.0 for name, t in total.items()} if n else {}


def served_cpu(cpu_ms: dict[str, float]) -> float:
    """CPU ms per request of the serving side: every process measured but the bench's own."""
    return sum(v for k, v in cpu_ms.items() if k != "bench")


def mean_cpu(readings: list[tuple[float, dict[str, float | None]]]) -> dict[str, float]:
    """Each process's CPU % averaged over the rounds, weighted by their length."""
    total: dict[str, float] = collections.defaultdict(float)
    wall: dict[str, float] = collections.defaultdict(float)
    for seconds, cpu in readings:
        for name, pct in cpu.items():
            if pct is not None:
                total[name] += pct * seconds
                wall[name] += seconds
    return {name: round(total[name] / wall[name], 1) for name in total if wall[name]}


# --------------------------------------------------------------------------
# 0. the client
# --------------------------------------------------------------------------

async def measure_clients(bare: BareApp, args: argparse.Namespace, me: psutil.Process) -> dict[str, Any]:
    """Each client on the same bare route, interleaved: what the client itself adds."""
    rows = []
    for c in args.concurrency:
        n = args.requests * (1 if c == 1 else 4)
        sides = {name: (lambda: Load(bare.port, [("GET", "/seats", {}, b"")] * n, 200)) for name in CLIENTS}
        procs = {name: {"bench": me, "app": psutil.Process(bare.proc.pid)} for name in CLIENTS}
        rows.append(await interleaved("client", sides, procs, max(2, args.rounds // 2), CLIENTS, c, args.warmup))
    return {"rows": rows}


# --------------------------------------------------------------------------
# 1 + 2. routes
# --------------------------------------------------------------------------

def mail_loads(node: ApiNode, bare: BareApp, n: int) -> dict[str, Callable[[], Load]]:
    body = json.dumps({"text": MAIL_TEXT}).encode()
    hdrs = {**auth(node), "Content-Type": "application/json"}
    return {"crewlet": lambda: Load(node.ingress_port, [("POST", f"/v1/seats/{SINK}/mail", hdrs, body)] * n, 202),
            "bare": lambda: Load(bare.port, [("POST", "/mail", hdrs, body)] * n, 202)}


def seats_loads(node: ApiNode, bare: BareApp, n: int) -> dict[str, Callable[[], Load]]:
    hdrs = auth(node)
    return {"crewlet": lambda: Load(node.ingress_port, [("GET", "/v1/seats", hdrs, b"")] * n, 200),
            "bare": lambda: Load(bare.port, [("GET", "/seats", hdrs, b"")] * n, 200)}


def hook_loads(node: ApiNode, bare: BareApp, n: int) -> dict[str, Callable[[], Load]]:
    from crewlet import hooks

    signed = {**hooks.sign("github", SECRET.encode(), HOOK_BODY), "X-GitHub-Event": "issues",
              "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/bench"}

    def reqs(path: str) -> list[tuple[str, str, dict[str, str], bytes]]:
        # A fresh delivery id each (the signature is over the body alone).
        return [("POST", path, {**signed, "X-GitHub-Delivery": str(uuid.uuid4())}, HOOK_BODY) for _ in range(n)]

    fresh = (lambda body: b'"duplicate":false' in body)
    return {"crewlet": lambda: Load(node.ingress_port, reqs(f"/v1/hooks/{INTEGRATION}"), 200, fresh),
            "bare": lambda: Load(bare.port, reqs("/hook"), 200, fresh)}


async def hook_calls(url: str, n: int) -> dict[str, Any]:
    """The broker work of a delivery alone, from this process to the bare server: crewlet's
    ``notify.claim`` + ``store`` + ``mark_stored`` beside a bare ``kv.create`` + ``js.publish``;
    and ``js.key_value()`` alone (a STREAM.INFO request, which claim and mark_stored each make)."""
    from crewlet.coord import buckets
    from crewlet.queue import notify

    nc = await nats.connect(url, name="bench-hook-calls", connect_timeout=2, allow_reconnect=False)
    try:
        js = nc.jetstream(timeout=JS_TIMEOUT)
        kv = await js.key_value(buckets.CLAIMS.name)
        text = HOOK_BODY.decode()
        perf = time.perf_counter
        times: dict[str, list[float]] = collections.defaultdict(list)

        async def crewlet(i: int) -> None:
            d = f"calls-c-{i}-{uuid.uuid4().hex[:8]}"
            t0 = perf()
            had = await notify.claim(js, INTEGRATION, d, node=NODE_ID, seat=SINK)
            t1 = perf()
            await notify.store(js, INTEGRATION, d, SINK, text)
            t2 = perf()
            await notify.mark_stored(js, INTEGRATION, d, node=NODE_ID, seat=SINK)
            t3 = perf()
            assert had is None
            times["crewlet"].append(t3 - t0)
            times["claim"].append(t1 - t0)
            times["store"].append(t2 - t1)
            times["mark_stored"].append(t3 - t2)

        async def bare(i: int) -> None:
            d = f"calls-b-{i}-{uuid.uuid4().hex[:8]}"
            t0 = perf()
            await kv.create(f"{INTEGRATION}.{d}", b'{"state":"claimed"}')
            await js.publish(notify.SUBJECT + INTEGRATION, HOOK_BODY, headers={"Nats-Msg-Id": f"{INTEGRATION}:{d}"})
            times["bare"].append(perf() - t0)
            t0 = perf()
            await js.key_value(buckets.CLAIMS.name)
            times["key_value"].append(perf() - t0)

        for i in range(20):  # warm
            await crewlet(i)
            await bare(i)
        times.clear()
        for i in range(n):
            await (crewlet(i) if i % 2 == 0 else bare(i))
            await (bare(i) if i % 2 == 0 else crewlet(i))
    finally:
        await nc.close()
    out = {k: summary([x * 1000.0 for x in v]) for k, v in times.items()}
    out["ratio_p50"] = ratio(out["crewlet"]["median"], out["bare"]["median"])
    say(f"  broker calls alone: crewlet {out['crewlet']['median']:.2f} ms, bare {out['bare']['median']:.2f} ms "
        f"(key_value() {out['key_value']['median']:.2f} ms)")
    return out


# --------------------------------------------------------------------------
# 3. the live feed
# --------------------------------------------------------------------------

class Arrivals:
    """For each trigger, when each subscriber had its event parsed (wall clock)."""

    def __init__(self, n: int):
        self.n = n
        self.at: dict[str, dict[int, float]] = {}
        self.done: dict[str, asyncio.Event] = {}

    def expect(self, trigger: str) -> asyncio.Event:
        self.at[trigger] = {}
        self.done[trigger] = ev = asyncio.Event()
        return ev

    def seen(self, trigger: str, who: int, t: float) -> None:
        got = self.at.get(trigger)
        if got is not None and who not in got:
            got[who] = t
            if len(got) >= self.n:
                self.done[trigger].set()


class SseReader:
    """One subscriber of ``GET /v1/events``: its own connection, the chunked stream parsed
    event by event as it arrives; a ``turn`` event's data is parsed only then."""

    def __init__(self, who: int, port: int, raw: bytes, arrivals: Arrivals):
        self.who, self.port, self.raw, self.arrivals = who, port, raw, arrivals
        self.snapshot = asyncio.Event()
        self.events: collections.Counter = collections.Counter()
        self.ended: str | None = None
        self.conn = Conn(port)

    async def open(self) -> None:
        await self.conn.open()
        self.conn.writer.write(self.raw)
        status, head = await self.conn.head()
        if status != 200 or _header(head, b"transfer-encoding") != b"chunked":
            raise BenchError(f"GET /v1/events answered {status}: {head[:300]!r}")

    async def run(self) -> None:
        reader, buf = self.conn.reader, b""
        try:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    self.ended = "the stream ended"
                    return
                buf += chunk[:-2]
                while (end := buf.find(b"\n\n")) >= 0:
                    block, buf = buf[:end], buf[end + 2:]
                    self._event(block)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.ended = f"{type(exc).__name__}"

    def _event(self, block: bytes) -> None:
        kind = data = None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                kind = line[7:]
            elif line.startswith(b"data: "):
                data = line[6:]
        if kind is None:
            return
        self.events[kind.decode()] += 1
        if kind == b"turn":
            record = json.loads(data)
            t = time.time()
            if record.get("outcome") == "done":
                self.arrivals.seen(record.get("trigger"), self.who, t)
        elif kind == b"snapshot":
            self.snapshot.set()

    def close(self) -> None:
        self.conn.close()


async def feed_crewlet(node: ApiNode, args: argparse.Namespace, rounds: list[int], store: dict,
                       subscribers: int) -> None:
    """Open *subscribers* SSE readers (0: none, only the bench's own core-NATS subscription on
    the node's ``feed.turn.>``), then per round one mail -> one turn -> its event at each."""
    n = subscribers
    arrivals = Arrivals(n)
    hop = Arrivals(1)
    raw = http_request("GET", "/v1/events", node.ingress_port, {**auth(node), "Accept": "text/event-stream"})
    readers = [SseReader(i, node.ingress_port, raw, arrivals) for i in range(n)]
    tasks: list[asyncio.Task] = []
    nc = await nats.connect(node.url, name="bench-feed-hop", connect_timeout=2, allow_reconnect=False)
    ends: dict[str, float] = {}

    async def on_record(msg) -> None:
        record = json.loads(msg.data)
        t = time.time()
        if record.get("outcome") == "done":
            hop.seen(record.get("trigger"), 0, t)
            ends.setdefault(record.get("trigger"), record["started_at"] + record["took_ms"] / 1000.0)

    try:
        await nc.subscribe("feed.turn.>", cb=on_record)
        await nc.flush()
        t0 = time.perf_counter()
        for r in readers:
            await r.open()
            tasks.append(asyncio.create_task(r.run()))
        await asyncio.wait_for(asyncio.gather(*(r.snapshot.wait() for r in readers)), 30.0)
        if n:
            store["connect_s"] = time.perf_counter() - t0
        mail = await Conn(node.ingress_port).open()
        hdrs = {**auth(node), "Content-Type": "application/json"}
        body = json.dumps({"text": "hello"}).encode()
        try:
            for k in rounds:
                trigger = f"feed-{uuid.uuid4().hex[:12]}-{k}"
                done, hop_done = arrivals.expect(trigger), hop.expect(trigger)
                status, answer = await mail.request(http_request(
                    "POST", f"/v1/seats/{args.feed_seat}/mail", node.ingress_port,
                    {**hdrs, "Idempotency-Key": trigger}, body))
                if status != 202:
                    raise BenchError(f"mail to {args.feed_seat}: {status} {answer[:300]!r}")
                try:
                    await asyncio.wait_for(asyncio.gather(*([done.wait()] if n else []), hop_done.wait()),
                                           EVENT_WAIT)
                except asyncio.TimeoutError:
                    pass
                end = ends.get(trigger)
                got = arrivals.at[trigger]
                if end is None:
                    store["missing"].append({"trigger": trigger, "why": "no done record on feed.turn"})
                    continue
                store["hop"] += [(t - end) * 1000.0 for t in hop.at[trigger].values()]
                if n:
                    delays = [(t - end) * 1000.0 for t in got.values()]
                    store["delays"] += delays
                    store["per_turn"].append({"p50": statistics.median(delays) if delays else None,
                                              "max": max(delays) if delays else None, "got": len(got)})
                    if len(got) < n:
                        store["missing"].append({"trigger": trigger, "got": len(got), "of": n})
                await asyncio.sleep(FEED_GAP)
        finally:
            mail.close()
        events = collections.Counter(store.get("events") or {})
        for r in readers:
            events.update(r.events)
        store["events"] = dict(events)
        store["ended"] = store.get("ended", []) + [r.ended for r in readers if r.ended]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for r in readers:
            r.close()
        await nc.close()


async def feed_bare(url: str, args: argparse.Namespace, record: dict[str, Any], rounds: list[int],
                    store: dict) -> None:
    """As many bare nats-py subscribers (a connection each) of one subject; one message a round."""
    n = args.subscribers
    arrivals = Arrivals(n)
    conns = []

    def callback(who: int):
        async def cb(msg) -> None:
            rec = json.loads(msg.data)
            arrivals.seen(rec["trigger"], who, time.time())
        return cb

    try:
        for i in range(n):
            c = await nats.connect(url, name=f"bench-feed-{i}", connect_timeout=2, allow_reconnect=False)
            conns.append(c)
            await c.subscribe(FEED_SUBJECT, cb=callback(i))
            await c.flush()
        pub = await nats.connect(url, name="bench-feed-pub", connect_timeout=2, allow_reconnect=False)
        conns.append(pub)
        for k in rounds:
            trigger = f"bare-{uuid.uuid4().hex[:12]}-{k}"
            data = json.dumps({**record, "trigger": trigger}).encode()
            done = arrivals.expect(trigger)
            t0 = time.time()
            await pub.publish(FEED_SUBJECT, data)
            await pub.flush()
            try:
                await asyncio.wait_for(done.wait(), EVENT_WAIT)
            except asyncio.TimeoutError:
                store["missing"].append({"trigger": trigger, "got": len(arrivals.at[trigger]), "of": n})
            delays = [(t - t0) * 1000.0 for t in arrivals.at[trigger].values()]
            store["delays"] += delays
            store["per_turn"].append({"p50": statistics.median(delays) if delays else None,
                                      "max": max(delays) if delays else None, "got": len(delays)})
            await asyncio.sleep(FEED_GAP)
    finally:
        for c in conns:
            try:
                await asyncio.wait_for(c.close(), 5)
            except Exception:
                pass


async def last_record(node: ApiNode) -> dict[str, Any]:
    """A turn record as the feed carries it (the feed seat's last), for the bare message."""
    conn = await Conn(node.ingress_port).open()
    try:
        status, body = await conn.request(http_request("GET", f"/v1/seats/{FEED_SEAT}", node.ingress_port,
                                                       auth(node)))
    finally:
        conn.close()
    if status != 200:
        raise BenchError(f"GET /v1/seats/{FEED_SEAT}: {status} {body[:300]!r}")
    return json.loads(body).get("last_turn") or {}


async def measure_feed(node: ApiNode, bare_url: str, args: argparse.Namespace, me) -> dict[str, Any]:
    record = await last_record(node)
    out: dict[str, Any] = {"crewlet": {"delays": [], "hop": [], "per_turn": [], "missing": []},
                           "bare": {"delays": [], "per_turn": [], "missing": []},
                           "hop_alone": {"delays": [], "hop": [], "per_turn": [], "missing": []},
                           "record_bytes": len(json.dumps(record, separators=(",", ":")))}
    # Interleaved: half the crewlet turns, the bare rounds, the other half (subscribers stay up
    # on each side only while it runs: 2 x N connections at once would skew both).
    half = args.turns // 2
    first, second = list(range(half)), list(range(half, args.turns))
    procs = await asyncio.to_thread(node.processes, others=True)
    meter = CpuMeter({**procs, "bench": me}).start()
    # The broker's hop alone first: turn end -> the record at a core-NATS subscriber, no SSE open.
    await feed_crewlet(node, args, list(range(max(3, args.turns // 2))), out["hop_alone"], 0)
    await feed_crewlet(node, args, first, out["crewlet"], args.subscribers)
    await feed_bare(bare_url, args, record, list(range(args.turns)), out["bare"])
    await feed_crewlet(node, args, second, out["crewlet"], args.subscribers)
    # Over the whole phase (the bare rounds included): what the node spends on a quiet feed.
    out["crewlet"]["cpu"] = {k: round(v, 1) for k, v in meter.read().items() if v is not None}
    for side in ("crewlet", "bare", "hop_alone"):
        s = out[side]
        s["delay_ms"] = summary(s.pop("delays"))
        if "hop" in s:
            s["hop_ms"] = summary(s.pop("hop"))
    c, b = out["crewlet"]["delay_ms"], out["bare"]["delay_ms"]
    out["ratio"] = {"p50": ratio(c["median"], b["median"]), "p99": ratio(c["p99"], b["p99"])}
    say(f"  feed: crewlet p50 {_f(c['median'], '.1f')} p99 {_f(c['p99'], '.1f')} max {_f(c['max'], '.1f')} ms; "
        f"bare p50 {_f(b['median'], '.1f')} p99 {_f(b['p99'], '.1f')} ms")
    return out


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

async def prepare_bare(url: str) -> None:
    """The bare server's streams and bucket, made by crewlet's own code."""
    from crewlet.coord import buckets
    from crewlet.queue import notify
    from crewlet.queue.jetstream import JetStreamMailboxes

    await wait_jetstream(url)
    nc = await nats.connect(url, name="bench-prepare", connect_timeout=2, allow_reconnect=False)
    try:
        js = nc.jetstream(timeout=JS_TIMEOUT)
        mb = JetStreamMailboxes(js, nc)
        await mb.ensure_streams(replicas=1, max_consumers=1000)
        await mb.ensure([SINK])
        await notify.ensure_stream(js, 1)
        await buckets.ensure(js, buckets.CLAIMS, 1)
    finally:
        await nc.close()


async def seats_body(node: ApiNode) -> dict[str, Any]:
    conn = await Conn(node.ingress_port).open()
    try:
        status, body = await conn.request(http_request("GET", "/v1/seats", node.ingress_port, auth(node)))
    finally:
        conn.close()
    if status != 200:
        raise BenchError(f"GET /v1/seats: {status} {body[:300]!r}")
    return json.loads(body)


async def measure(node: ApiNode, server: NatsServer, base: str, args: argparse.Namespace,
                  rep: dict[str, Any], started: list) -> None:
    rep["stage"] = "starting the node and the bare server"
    node.start()
    server.start()
    await prepare_bare(server.url)
    rep["stage"] = "waiting for the node"
    rep["node"] = await wait_ready(node, READY_TIMEOUT)
    say(f"node serving after {rep['node']['serving_s']:.1f}s, seats held after {rep['node']['held_s']:.1f}s, "
        f"a first turn after {rep['node']['first_turn_s']:.1f}s")
    seats = await seats_body(node)
    bare = BareApp(base, server.url, seats)
    started.append(bare)
    bare.start()
    await bare.wait()
    me = psutil.Process()
    node_procs = await asyncio.to_thread(node.processes, others=True)
    rep["pids"] = {k: p.pid for k, p in node_procs.items()}
    procs = {"crewlet": {**node_procs, "bench": me},
             "bare": {"app": psutil.Process(bare.proc.pid), "broker": psutil.Process(server.pid), "bench": me}}
    rep["seats_bytes"] = len(json.dumps(seats, separators=(",", ":")))

    rep["stage"] = "(0) the client"
    say("(0) the client: ours (asyncio streams) beside httpx2, on the bare GET /seats")
    rep["client"] = await measure_clients(bare, args, me)
    if args.client == "auto":
        c1 = next(r for r in rep["client"]["rows"] if r["concurrency"] == min(args.concurrency))
        args.client = min(CLIENTS, key=lambda k: c1[k]["latency_ms"]["median"])
    rep["client"]["chosen"] = args.client
    runs = {"crewlet": CLIENTS[args.client], "bare": CLIENTS[args.client]}
    say(f"  using {args.client}")

    rep["stage"] = "(1) reads and mail"
    say(f"(1) GET /v1/seats and POST /v1/seats/{SINK}/mail beside the bare app")
    rep["api"] = []
    for name, loads in (("GET /v1/seats", seats_loads), (f"POST /v1/seats/{SINK}/mail", mail_loads)):
        for c in args.concurrency:
            n = args.requests * (1 if c == 1 else 4)
            log0 = node.log_size()
            row = await interleaved(name, loads(node, bare, n), procs, args.rounds, runs, c, args.warmup)
            row["node_log_bytes"] = node.log_size() - log0
            row["requests"] = n * args.rounds
            row["requests_sent"] = n * args.rounds + min(n, args.warmup) * 2
            rep["api"].append(row)

    rep["stage"] = "(2) webhooks"
    say(f"(2) webhooks: signed github deliveries to /v1/hooks/{INTEGRATION} beside the bare app")
    rep["hooks"] = []
    for c in (1, args.hook_concurrency):
        n = args.hooks * (1 if c == 1 else 2)
        row = await interleaved("POST /v1/hooks/github", hook_loads(node, bare, n), procs, args.rounds, runs, c,
                                args.warmup)
        row["requests"] = n * args.rounds
        rep["hooks"].append(row)
    rep["hook_calls"] = await hook_calls(server.url, args.hook_calls)

    rep["stage"] = "(3) the live feed"
    say(f"(3) the live feed: {args.subscribers} SSE subscribers, {args.turns} turns of {args.feed_seat}")
    rep["feed"] = await measure_feed(node, server.url, args, me)
    node.check_alive()
    rep["stage"] = "done"


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    binary = find_nats_server(args.nats_server)
    base = tempfile.mkdtemp(prefix="cwapi", dir="/tmp")
    node = ApiNode(os.path.join(base, "n"), binary)
    server = NatsServer(binary, os.path.join(base, "bare"))
    rep: dict[str, Any] = {"stage": "", "config": config(args, binary)}
    started: list[BareApp] = []
    t0 = time.monotonic()
    say(f"dir {base}; node ingress :{node.ingress_port}, broker :{node.stream_port}; bare broker :{server.port}")
    try:
        asyncio.run(measure(node, server, base, args, rep, started))
    except BenchError as exc:
        rep["error"] = f"while {rep['stage']}: {exc}"
        say(f"FAILED {rep['error']}")
    finally:
        wind_up(rep, args, base, node, server, started, t0)
    return rep


def wind_up(rep: dict[str, Any], args: argparse.Namespace, base: str, node: Crewletd, server: NatsServer,
            apps: list, t0: float) -> None:
    """Stop what a node's benchmark started — its bare apps, crewletd, the bare
    server, by pid — note the node's complaints and its stop time, keep the
    dir when asked (``--keep``) or when the run failed, and time the whole."""
    say("stopping the bare app, crewletd and the bare server")
    for app in apps:
        app.stop()
    rep["node_log"] = node_problems(node) if node.proc is not None else {}
    rep["node_stop_s"] = node.stop()
    server.stop()
    if args.keep or rep.get("error"):
        rep["kept"] = base
        say(f"kept {base} (crewletd log: {node.log_path})")
    else:
        shutil.rmtree(base, ignore_errors=True)
    rep["seconds"] = round(time.monotonic() - t0, 1)


def config(args: argparse.Namespace, binary: str) -> dict[str, Any]:
    import importlib.util

    import uvicorn
    # What uvicorn's http="auto" (ingress's, and the bare app's) picks.
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return {"quick": args.quick, "rounds": args.rounds, "requests": args.requests,
            "concurrency": args.concurrency, "hooks": args.hooks, "hook_concurrency": args.hook_concurrency,
            "hook_calls": args.hook_calls, "subscribers": args.subscribers, "turns": args.turns,
            "feed_seat": args.feed_seat, "warmup": args.warmup, "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "nats_server": server_version(binary), "nats_py": NATS_PY_VERSION,
            "uvicorn": uvicorn.__version__, "http": http,
            "date": time.strftime("%Y-%m-%d")}


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def _f(v: float | None, spec: str) -> str:
    width = int(spec.split(".")[0] or 0)
    return f"{v:{spec}}" if v is not None else f"{'n/a':>{width}}"


def _lat(s: dict[str, Any]) -> str:
    return f"{_f(s['median'], '6.2f')} {_f(s['p95'], '6.2f')} {_f(s['p99'], '6.2f')}"


def _cpu(cpu: dict[str, float], names: tuple[str, ...]) -> str:
    """The named processes' CPU %, and the rest of the side's summed as ``rest``."""
    shown = [f"{k} {cpu[k]:.0f}" for k in names if k in cpu]
    rest = sum(v for k, v in cpu.items() if k not in names)
    return ", ".join(shown + ([f"rest {rest:.0f}"] if rest >= 0.5 else []))


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"    {'route':32} {'c':>3}  {'crewlet p50 p95 p99 ms':>22}  {'bare p50 p95 p99 ms':>22}  "
          f"{'x p50':>6} {'x p99':>6}  {'crewlet/s':>9} {'bare/s':>8} {'x /s':>5}")
    for r in rows:
        c, b, x = r["crewlet"], r["bare"], r["ratio"]
        print(f"    {r['name']:32} {r['concurrency']:3d}  {_lat(c['latency_ms']):>22}  {_lat(b['latency_ms']):>22}  "
              f"{_f(x['p50'], '6.2f')} {_f(x['p99'], '6.2f')}  {c['rps_median']:9.0f} {b['rps_median']:8.0f} "
              f"{_f(x['rps'], '5.2f')}")
    print("    CPU ms per request (the HTTP server process: ingress / the bare app; the serving side: every "
          "process of the node / the bare app + broker), and CPU % while each side ran (100 % = one core):")
    for r in rows:
        c, b, x = r["crewlet"]["cpu_ms"], r["bare"]["cpu_ms"], r["ratio"]
        print(f"      {r['name']} c={r['concurrency']}: server {_f(c.get('ingress'), '.3f')} / "
              f"{_f(b.get('app'), '.3f')} ms (x {_f(x['server_cpu'], '.1f')}), serving side "
              f"{served_cpu(c):.3f} / {served_cpu(b):.3f} ms (x {_f(x['all_cpu'], '.1f')}); CPU % crewlet "
              f"{_cpu(r['crewlet']['cpu'], ('ingress', 'broker', 'crewletd', 'bench'))}; "
              f"bare {_cpu(r['bare']['cpu'], ('app', 'broker', 'bench'))}")


def print_text(rep: dict[str, Any]) -> None:
    cfg = rep["config"]
    print(f"crewlet API benchmark  ({cfg['date']}, python {cfg['python']}, {cfg['cpus']} cpus, nats-server "
          f"{cfg['nats_server']}, nats-py {cfg['nats_py']}, uvicorn {cfg['uvicorn']} ({cfg['http']}); "
          f"{cfg['rounds']} interleaved rounds per figure; x = crewlet/bare)")
    if rep.get("error"):
        print(f"FAILED {rep['error']}")
    node = rep.get("node")
    if node:
        print(f"node: serving {node['serving_s']:.1f} s after start, every seat held at {node['held_s']:.1f} s, "
              f"a first turn at {node['first_turn_s']:.1f} s; GET /v1/seats body {rep['seats_bytes']} bytes "
              f"(the bare GET /seats serves the same)")
    print()
    if rep.get("client"):
        cl = rep["client"]
        print("(0) the client, on the bare GET /seats: ours (HTTP/1.1 keep-alive over asyncio streams) "
              "beside httpx2 AsyncClient")
        for r in cl["rows"]:
            print(f"    c={r['concurrency']:<3} " + "   ".join(
                f"{k}: p50 {r[k]['latency_ms']['median']:.2f} ms p99 {r[k]['latency_ms']['p99']:.2f} ms, "
                f"{r[k]['rps_median']:.0f}/s, client CPU {_f(r[k]['cpu_ms'].get('bench'), '.3f')} ms/request"
                for k in CLIENTS))
        c1 = cl["rows"][0]
        extra = ratio(c1["httpx2"]["latency_ms"]["median"], c1["raw"]["latency_ms"]["median"])
        print(f"    used: {cl['chosen']} (httpx2's median at c={c1['concurrency']} is "
              f"{_f(extra, '.2f')}x ours: the difference is client overhead, the server being the same)")
        print()
    if rep.get("api"):
        print(f"(1) a real node (etc/company.yaml + {SINK}) beside a bare Starlette app on uvicorn; mail to "
              f"{SINK}, stored and never worked (bare: one js.publish to the same kind of stream)")
        print_rows(rep["api"])
        for r in rep["api"]:
            if r["name"].startswith("POST") and r.get("node_log_bytes"):
                print(f"      node log while {r['name']} c={r['concurrency']} ran: "
                      f"{r['node_log_bytes'] / r['requests_sent']:.0f} bytes per request (both sides') "
                      "(ingress logs every non-GET request: api_request, forwarded by crewletd)")
        print()
    if rep.get("hooks"):
        print(f"(2) webhooks: signed github deliveries ({len(HOOK_BODY)} B body, distinct ids), answered 200 "
              f"(stored); bare: kv.create + js.publish. Target p99 <= {TARGET_HOOK_P99:g} ms")
        print_rows(rep["hooks"])
        for r in rep["hooks"]:
            p99 = r["crewlet"]["latency_ms"]["p99"]
            print(f"      c={r['concurrency']}: crewlet p99 {p99:.1f} ms: "
                  f"{'meets' if p99 <= TARGET_HOOK_P99 else 'MISSES'} the target")
        hc = rep.get("hook_calls")
        if hc:
            print(f"    the broker calls alone (no HTTP; bench -> bare server, sequential, medians): crewlet "
                  f"notify.claim {hc['claim']['median']:.2f} + store {hc['store']['median']:.2f} + mark_stored "
                  f"{hc['mark_stored']['median']:.2f} = {hc['crewlet']['median']:.2f} ms, beside bare create + "
                  f"publish {hc['bare']['median']:.2f} ms ({_f(hc['ratio_p50'], '.2f')}x); js.key_value() "
                  f"alone (a STREAM.INFO, made by claim and by mark_stored) {hc['key_value']['median']:.2f} ms")
        print()
    feed = rep.get("feed")
    if feed:
        c, b = feed["crewlet"], feed["bare"]
        cd, bd, hop = c["delay_ms"], b["delay_ms"], c.get("hop_ms") or {}
        print(f"(3) the live feed: {cfg['subscribers']} SSE subscribers of GET /v1/events, {cfg['turns']} turns "
              f"of {cfg['feed_seat']}; delay from the turn's end to each subscriber's parsed turn event "
              f"(ms, over subscribers x turns). Target p99 <= {TARGET_FEED_P99:g} ms")
        print(f"    crewlet  p50 {_f(cd['median'], '7.1f')}  p95 {_f(cd['p95'], '7.1f')}  p99 {_f(cd['p99'], '7.1f')}  "
              f"max {_f(cd['max'], '7.1f')}   (n {cd['n']})  "
              f"{'meets' if cd['p99'] is not None and cd['p99'] <= TARGET_FEED_P99 else 'MISSES'} the target")
        print(f"    bare     p50 {_f(bd['median'], '7.1f')}  p95 {_f(bd['p95'], '7.1f')}  p99 {_f(bd['p99'], '7.1f')}  "
              f"max {_f(bd['max'], '7.1f')}   (n {bd['n']}; {cfg['subscribers']} nats-py connections, one "
              f"{feed['record_bytes']} B message, delay from publish)")
        print(f"    x        p50 {_f(feed['ratio']['p50'], '7.2f')}              p99 {_f(feed['ratio']['p99'], '7.2f')}")
        quiet = feed.get("hop_alone", {}).get("hop_ms") or {}
        print(f"    the turn record at the bench's own core-NATS subscription on feed.turn.> (where ingress hears "
              f"it): p50 {_f(quiet.get('median'), '.1f')} max {_f(quiet.get('max'), '.1f')} ms with no SSE "
              f"subscriber open (n {quiet.get('n', 0)}); p50 {_f(hop.get('median'), '.1f')} max "
              f"{_f(hop.get('max'), '.1f')} ms with the {cfg['subscribers']} open")
        per = [t for t in c["per_turn"] if t["p50"] is not None]
        if per:
            print("    per turn, crewlet p50/max ms: " + ", ".join(f"{t['p50']:.0f}/{t['max']:.0f}" for t in per))
        if c.get("missing") or b.get("missing"):
            print(f"    MISSING: crewlet {c.get('missing')}; bare {b.get('missing')}")
        if c.get("ended"):
            print(f"    subscribers whose stream ended: {len(c['ended'])} ({collections.Counter(c['ended'])})")
        print(f"    events seen by the subscribers: {c.get('events')}; connecting all took "
              f"{_f(c.get('connect_s'), '.2f')} s; CPU % over the crewlet rounds: "
              f"{_cpu(c.get('cpu') or {}, ('ingress', 'broker', 'seats', 'crewletd', 'bench'))}")
        print()
    problems = rep.get("node_log") or {}
    if problems:
        print("node log warnings/errors (count, first at s after start, what the first said):")
        for k, v in list(problems.items())[:12]:
            print(f"    {k} x{v['count']}, at {_f(v['first_s'], '.1f')} s: {v['said']}")
    print(f"took {rep['seconds']:.0f} s; node stopped in {_f(rep.get('node_stop_s'), '.1f')} s"
          + (f"; kept {rep['kept']}" if rep.get("kept") else ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-baseline"]:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops us, by pid
        serve_baseline(int(argv[1]), argv[2], argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke run (< 60 s)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per figure (default 5; quick 2)")
    ap.add_argument("--requests", type=int,
                    help="requests per round and side at concurrency 1, x4 above (default 2000; quick 200)")
    ap.add_argument("--concurrency", default="1,16", help="concurrencies of (0) and (1) (default 1,16)")
    ap.add_argument("--hooks", type=int, help="deliveries per round and side one at a time, x2 at "
                                              "--hook-concurrency (default 600; quick 60)")
    ap.add_argument("--hook-concurrency", type=int, default=4, help="the small concurrency of (2) (default 4)")
    ap.add_argument("--hook-calls", type=int, help="rounds of the broker calls alone (default 500; quick 60)")
    ap.add_argument("--subscribers", type=int, default=100, help="SSE subscribers of (3) (default 100)")
    ap.add_argument("--turns", type=int, help="turns watched in (3) (default 20; quick 4)")
    ap.add_argument("--feed-seat", default=FEED_SEAT, help=f"the worked seat mailed in (3) (default {FEED_SEAT})")
    ap.add_argument("--warmup", type=int, default=50, help="warm-up requests per side and figure (default 50)")
    ap.add_argument("--client", choices=("auto", *CLIENTS), default="auto",
                    help="the load client (default auto: the lower median at concurrency 1 in (0))")
    ap.add_argument("--nats-server", help="the nats-server binary for both sides (default: as crewlet finds it)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (a failed run keeps it)")
    add_smoke(ap, argv, {"rounds": 1, "requests": 20, "concurrency": "1,2", "hooks": 5,
                         "hook_calls": 5, "subscribers": 3, "turns": 1, "warmup": 2})
    args = ap.parse_args(argv)
    quick = args.quick
    for name, full, small in (("rounds", 5, 2), ("requests", 2000, 200), ("hooks", 600, 60),
                              ("hook_calls", 500, 60), ("turns", 20, 4)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    try:
        args.concurrency = sorted({int(x) for x in args.concurrency.split(",") if x.strip()})
    except ValueError:
        ap.error("--concurrency: whole numbers, comma separated")
    if not args.concurrency or min(args.concurrency) < 1 or min(args.rounds, args.requests, args.hooks,
                                                                 args.hook_calls, args.subscribers,
                                                                 args.turns, args.hook_concurrency) < 1:
        ap.error("counts and concurrencies must be >= 1")
    # SIGTERM ends the run through the finally blocks, like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # crewlet's own events (the bare server's streams made, ...) would mix with the report.
    log.configure(node=None, role="bench", level="warning", fmt="json", stream=sys.stderr)
    try:
        rep = run_all(args)
    except BenchError as exc:
        print(f"bench/api.py: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # everything started was stopped on the way out (run_all's finally)
        print("bench/api.py: interrupted", file=sys.stderr)
        return 130
    return emit(rep, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
