#!/usr/bin/env python3
"""Benchmark: many slow turns at once — turns a node holds in flight against a slow provider,
beside a bare HTTP client driving the same provider (issue 13, "scale up").

Real turns wait seconds on a model, so what matters is how many a node holds
in flight, not how fast it runs instant ones. For each size N (``--sizes``,
default 100,1000 turns in flight), in one run, on 127.0.0.1 only:

* **the provider** — a fake OpenAI-compatible server in a process of its own
  (this file with ``--serve-provider``; plain asyncio streams, HTTP/1.1
  keep-alive, listen backlog 4096), so its CPU is its own and measured.
  ``POST /v1/chat/completions`` answers every request with the same
  ``--tokens`` tokens (default 100) generated at ``--rate`` tokens/s (default
  50): **the whole answer takes tokens/rate = 2.0 s**, no separate time to
  first token. Asked with ``stream: true`` it streams them as OpenAI does
  (one ``data:`` chunk per token every 1/rate s, then a chunk with
  ``finish_reason``, a usage chunk, ``data: [DONE]``; chunked transfer
  encoding); asked without, it answers the whole ``chat.completion`` body at
  the same moment the stream would have ended. It notes for every request
  its tag (the last user message's text), its own time (request read ->
  last byte written, ms) and the request's size; ``GET /bench/log`` hands
  the notes over and forgets them. **A mail turn does not stream**: crewlet's
  turn loop passes no sink for plain mail (only conversation runs stream), so
  the node's provider asks without ``stream`` and gets the body after 2 s.
* **crewlet** — a real node, ``crewletd start -c <temp config> --company
  <temp company>`` (embedded broker, all four roles, a short temp data dir):
  N seats, each with the ``openai`` provider whose ``base_url`` is the fake
  server (no key, ``model: bench-slow``); ``--providers K`` spreads the seats
  over K identical providers (each a client of its own in the seats
  process); ``node.max_concurrent`` ``--max-concurrent`` (default 1000);
  ``fleet: {sweep: 1, heartbeat: 5, lease_ttl: 15}`` (seats without MCP
  servers are claimed at once, whatever ``claims_per_sweep``). Every seat is driven in a **closed loop**: the bench
  publishes one mail to ``agents.inbox.<seat>`` (headers ``Crewlet-Trigger``
  and ``Nats-Msg-Id``, the text is the trigger, so the provider's note names
  the turn) and, once that turn's ``done`` record arrives on
  ``feed.turn.<seat>`` (a core subscription made first), the next one; so
  N turns are in flight, one per seat (a seat runs one turn at a time).
* **bare** — N workers in the bench process, each posting to the same server
  one request after the other in a closed loop over a keep-alive connection
  of its own, with the bench's own HTTP/1.1 client (bench/api.py's ``Conn``:
  asyncio streams, next to no CPU), the very request body crewlet sends
  (system persona, the tag as the user message, the 14 tools of a seat on a
  data node, ``model``; JSON-encoded per request) and the answer parsed. This
  is the provider's own latency and the turns/s the fake server allows on
  this machine at N in flight: the baseline of the ratios.
* **bare aiohttp** — the same with ``aiohttp``'s ``ClientSession``, the HTTP
  library crewlet's providers use, one session with no pool limit (as
  crewlet's): what the library alone costs at N connections.
  ``--bare-stream`` adds a fourth side, the bare client asking for streams
  (``stream: true``, 100 chunks an answer): what a streamed conversation
  run's wire costs the provider and a client.

Every worker's first request waits ``w/N`` of an answer's time, so the
workers are spread evenly over the 2 s and stay so (without it they stay in
step: every answer of a round lands in the same few ms, and the time a
client spends behind the rest of that burst would count as added latency).

A round of a side runs until every worker has finished one turn (the ramp:
connections opened, the loop full; at least ``--ramp`` s), then counts over a
**steady window** of ``--seconds`` s: completed turns/s (turns whose done
record or response arrived in the window), CPU of every process over the
window (psutil) as **CPU-ms per turn** — the node's seats process, broker,
data applier, crewletd and the other roles; the provider server; the bench
itself (on the bare side, the bare client) — and per turn the **latency added
over the provider's own time for that request** (the server's note):

* end to end: crewlet, mail published -> its done record received, minus the
  server's time; bare, request started -> response body read, minus the
  server's time;
* inside the turn (crewlet): the record's ``took_ms`` (the turn from its
  start after the fetch to its side effects done, before its ledger entry
  and record are written; until 2026-12-03 it ended after the ledger write)
  minus the server's time, and
  ``provider_ms`` (the provider call: cooldown read, HTTP) minus it.

Before the rounds, once every seat is held and its first turn done, the
node is metered **idle** for ``--idle`` s (nothing in flight): each process's
CPU ms per second whether or not it works. The report then splits crewlet's
CPU per turn into that idle cost spread over the round's turns/s and **what a
turn adds** (``CPU ms per turn over idle``), with ``others`` (crewletd, the
zygote, ingress, workers: the processes that play no part in a turn). At
100 in flight the idle cost is a large share of a turn's (50 turns/s); at
1,000 it is a tenth of that.

Then the workers stop issuing and the turns in flight are let finish. Sides
alternate in ``--rounds`` interleaved rounds (the side going first alternates);
rates are medians over rounds, latencies pooled, CPU per turn from the median
round. Targets (issue 13, informational): >= 400 turns/s at 1,000 in flight,
and <= 50 ms added at p99.

``--profile S`` (default 20; 0: off) adds, at the largest size, one more
crewlet round of S s, not counted, with py-spy recording the seats process
(``py-spy record --function --format raw``, 100 samples/s; blocking: each
sample pauses the process a moment, ~20 % fewer turns/s meanwhile, while
``--profile-nonblocking`` reads stacks as it runs and put a visible share of
samples on frames that were not running); the report lists
its hot spots by function (file:line of the def) as % of the samples: self
(the function on top; and the self samples by package) and total (anywhere
in the stack, the loop's own roots left out). The collapsed
stacks are kept in ``--profile-dir`` (default /tmp) for a flame graph.

``--quick`` (100 in flight, one round of 6 s, no profile) takes ~1.5 minutes;
the default (100 and 1,000, two rounds of 20 s, the profile) ~10 minutes.
Everything started is stopped by its pid, on failure and on Ctrl-C too.
Exit status: 0 unless the benchmark itself broke.

    python bench/slow_turns.py [--quick] [--sizes 100,1000] [--providers 1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import aiohttp  # noqa: E402
import httpx2  # noqa: E402
import nats  # noqa: E402
import psutil  # noqa: E402
from nats.aio.client import __version__ as NATS_PY_VERSION  # noqa: E402

from bench.api import Conn, http_request  # noqa: E402  (the bench's HTTP/1.1 client)
from bench.common import (add_smoke, stop_process, BenchError, CpuMeter, Crewletd, child_env, collapsed_stacks, emit,  # noqa: E402
                          find_nats_server, free_ports, ratio, say, server_version, summary, tail)
from bench.turns import (JS_TIMEOUT, NODE_ID, ROLE_SHUTDOWN, SUBJECT, TRIGGER_HEADER,  # noqa: E402
                         CrewletNode, revision_bytes, seat_names)

HOST = "127.0.0.1"
MODEL = "bench-slow"
NOTE_EVERY = 10.0  # s between progress notes while the seats are taken
PERSONA = "bench"                  # short: a company revision is one KV value (bench/turns.py)
TOKENS = 100                       # tokens per answer
RATE = 50.0                        # tokens/s: the answer takes TOKENS / RATE = 2.0 s
MAX_CONCURRENT = 1000              # node.max_concurrent (issue 13)
BACKLOG = 4096                     # the provider's listen backlog: 1,000 clients connect at once
REQUEST_TIMEOUT = 120.0            # s a bare request may take (crewlet's own cap per attempt)
STALL = 120.0                      # s one turn may take before the round counts as stalled
STOP_GRACE = 10.0                  # s the provider server gets after SIGTERM, before SIGKILL
TARGET_PER_S = 400.0               # turns/s at 1,000 in flight (issue 13)
TARGET_ADDED_P99 = 50.0            # ms added at p99 (issue 13)
PROFILE_RATE = 100                 # py-spy samples/s
PROFILE_TOP = 15                   # hot spots listed
OTHER_THREAD = "Thread._bootstrap"  # the root frame of a thread that is not the main one
ROOT_SHARE = 0.9                   # a frame this near the commonest is the loop's root, not a hot spot
LOG_EVERY = 5.0                    # s between progress notes in a round
OUTSIDE_NODE = ("provider", "bench")   # metered processes that are not crewletd's
OTHERS = ("crewletd", "zygote", "ingress", "workers")   # the node's processes that play no part in a turn
IDLE_SETTLE = 2.0                  # s of quiet before the idle window (the seats' first turns just ended)
SIDES = ("crewlet", "bare", "bare aiohttp", "bare stream")


# --------------------------------------------------------------------------
# The provider: a fake OpenAI chat completions server (a subprocess: this file
# with --serve-provider)
# --------------------------------------------------------------------------

def serve_provider(port: int, tokens: int, rate: float) -> None:
    """Answer chat completions in tokens/rate s, streamed or whole; note each request."""
    words = [f" w{i % 10}" for i in range(tokens)]
    text = "".join(words)
    notes: list[tuple[str, float, bool, int]] = []   # (tag, server ms, streamed, request bytes)
    chunk_head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": MODEL}

    def sse(obj: Any) -> bytes:
        data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)   # one HTTP chunk

    # Every chunk but the usage one is the same for every request: encoded once.
    token_chunks = [sse({**chunk_head, "choices": [{"index": 0, "delta": (
        {"role": "assistant", "content": w} if i == 0 else {"content": w}), "finish_reason": None}]})
        for i, w in enumerate(words)]
    finish_chunk = sse({**chunk_head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    done_chunk = b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")
    stream_head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                   b"transfer-encoding: chunked\r\n\r\n")

    def usage(request_bytes: int) -> dict[str, int]:
        prompt = request_bytes // 4
        return {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}

    def respond(writer, status: str, body: bytes, ctype: str = "application/json") -> None:
        writer.write(f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n"
                     .encode() + body)

    async def completion(writer, body: bytes, t_in: float) -> None:
        try:
            req = json.loads(body)
            tag = str(req["messages"][-1]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            respond(writer, "400 Bad Request", b'{"error":{"type":"invalid_request_error",'
                                               b'"message":"not a chat completion request"}}')
            return
        streamed = bool(req.get("stream"))
        if streamed:
            writer.write(stream_head)
            for i, chunk in enumerate(token_chunks):
                await asyncio.sleep(max(0.0, t_in + (i + 1) / rate - time.monotonic()))
                writer.write(chunk)
            writer.write(finish_chunk)
            if (req.get("stream_options") or {}).get("include_usage"):
                writer.write(sse({**chunk_head, "choices": [], "usage": usage(len(body))}))
            writer.write(done_chunk + b"0\r\n\r\n")
        else:
            await asyncio.sleep(max(0.0, t_in + tokens / rate - time.monotonic()))
            respond(writer, "200 OK", json.dumps({
                "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": usage(len(body))}, separators=(",", ":")).encode())
        await writer.drain()
        notes.append((tag, (time.monotonic() - t_in) * 1000, streamed, len(body)))

    async def handle(reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                size = int(headers.get("content-length") or 0)
                body = await reader.readexactly(size) if size else b""
                t_in = time.monotonic()
                if method == "POST" and path.endswith("/chat/completions"):
                    await completion(writer, body, t_in)
                elif path == "/bench/log":
                    taken = notes[:]
                    del notes[:len(taken)]
                    respond(writer, "200 OK", json.dumps(taken).encode())
                elif path == "/bench/ping":
                    respond(writer, "200 OK", b"{}")
                else:
                    respond(writer, "404 Not Found", b'{"error":{"message":"no such route"}}')
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, HOST, port, backlog=BACKLOG)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with server:
            await stop.wait()

    asyncio.run(main())


class Provider:
    """The fake provider's subprocess, stopped by its pid."""

    def __init__(self, dir: str, tokens: int, rate: float):
        self.port = free_ports(1)[0]
        self.tokens, self.rate = tokens, rate
        self.log_path = os.path.join(dir, "provider.log")
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def start(self) -> None:
        argv = [sys.executable, os.path.abspath(__file__), "--serve-provider", str(self.port),
                str(self.tokens), str(self.rate)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=child_env(), start_new_session=True)

    def process(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)

    async def wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        async with httpx2.AsyncClient() as client:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise BenchError(f"the provider exited with {self.proc.returncode}:\n"
                                     f"{tail(self.log_path, 15)}")
                try:
                    if (await client.get(f"http://{HOST}:{self.port}/bench/ping", timeout=2)).status_code == 200:
                        return
                except httpx2.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise BenchError(f"the provider not serving within {timeout:g}s:\n{tail(self.log_path, 15)}")
                await asyncio.sleep(0.1)

    async def notes(self) -> dict[str, tuple[float, bool, int]]:
        """What it served since the last call: tag -> (server ms, streamed, request bytes);
        a tag served twice (a retry) keeps its last."""
        async with httpx2.AsyncClient() as client:
            r = await client.get(f"http://{HOST}:{self.port}/bench/log", timeout=30)
        r.raise_for_status()
        return {tag: (ms, streamed, size) for tag, ms, streamed, size in r.json()}

    def stop(self) -> None:
        stop_process(self.proc, "the provider", STOP_GRACE)


# --------------------------------------------------------------------------
# A round: closed-loop workers, a ramp, a steady window, the drain
# --------------------------------------------------------------------------

class Round:
    """One side's round: *n* workers each doing turns one after another.

    A worker calls ``turn(tag)`` -> (t_start, t_end, extra) until the window
    has closed. The window opens once every worker finished a turn (and
    ``ramp`` s passed), and lasts ``seconds``; CPU is metered over it.
    """

    def __init__(self, name: str, n: int, args: argparse.Namespace, procs: dict[str, psutil.Process | None],
                 sample: Callable[[], Any] | None = None):
        self.name, self.n, self.args, self.procs = name, n, args, procs
        self.sample = sample   # called (in a thread) mid-window: what the node says it runs
        self.done: list[tuple[str, float, float, dict]] = []   # (tag, t_start, t_end, extra)
        self.started = 0       # workers that finished their first turn
        self.all_started = asyncio.Event()
        self.window: tuple[float, float] | None = None
        self.closing = False

    async def run(self, turn: Callable[[str], Any], prefix: str, seconds: float) -> dict[str, Any]:
        t0 = time.monotonic()

        async def worker(w: int) -> None:
            # Starts spread over one answer's time: otherwise the workers stay in step, every
            # answer of a round lands in the same few ms, and the client's time queueing
            # behind the rest of the burst would count as latency added.
            await asyncio.sleep(w / self.n * self.args.tokens / self.args.rate)
            k = 0
            while not self.closing:
                tag = f"{prefix}-{w}-{k}"
                t_start, t_end, extra = await turn(tag)
                self.done.append((tag, t_start, t_end, extra))
                if k == 0:
                    self.started += 1
                    if self.started == self.n:
                        self.all_started.set()
                k += 1

        tasks = [asyncio.create_task(worker(w)) for w in range(self.n)]
        watcher = asyncio.ensure_future(asyncio.gather(*tasks))
        out: dict[str, Any] = {}
        try:
            ramp_end = t0 + self.args.ramp
            deadline = t0 + self.args.ramp_timeout
            while not self.all_started.is_set():
                if watcher.done():
                    watcher.result()   # a worker failed: raise it
                if time.monotonic() > deadline:
                    raise BenchError(f"{self.name}: {self.started} of {self.n} workers finished a first "
                                     f"turn in {self.args.ramp_timeout:g}s")
                try:
                    await asyncio.wait_for(asyncio.shield(self.all_started.wait()), 1.0)
                except asyncio.TimeoutError:
                    pass
            await asyncio.sleep(max(0.0, ramp_end - time.monotonic()))
            ws = time.monotonic()
            out["ramp_s"] = ws - t0
            meter = CpuMeter(self.procs).start()
            sampled = None
            if self.sample is not None:
                await asyncio.sleep(seconds / 2)
                sampled = await asyncio.to_thread(self.sample)
            while time.monotonic() < ws + seconds:
                if watcher.done():
                    watcher.result()
                await asyncio.sleep(min(LOG_EVERY, ws + seconds - time.monotonic()))
            cpu = meter.read()
            we = time.monotonic()
            self.window = (ws, we)
            self.closing = True
            out["in_flight_sampled"] = sampled
            await asyncio.wait_for(watcher, STALL)
            out["drain_s"] = time.monotonic() - we
        finally:
            self.closing = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        turns = [d for d in self.done if ws <= d[2] < we]
        wall = we - ws
        per_turn = {k: (v / 100 * wall * 1000 / len(turns) if v is not None and turns else None)
                    for k, v in cpu.items()}
        node = [v for k, v in per_turn.items() if k not in OUTSIDE_NODE and v is not None]
        if "seats" in per_turn:
            per_turn["node"] = sum(node)   # every process of crewletd's tree
        out.update({"workers": self.n, "seconds": wall, "turns": len(turns), "per_s": len(turns) / wall,
                    "cpu_pct": cpu, "cpu_ms_per_turn": per_turn})
        return out

    def in_window(self) -> list[tuple[str, float, float, dict]]:
        assert self.window is not None
        ws, we = self.window
        return [d for d in self.done if ws <= d[2] < we]


def added(turns: list[tuple[str, float, float, dict]], served: dict[str, tuple[float, bool, int]]
          ) -> dict[str, Any]:
    """Latency over the provider's own time for each turn (ms): end to end, and for crewlet's
    turns also inside the turn (took_ms) and in the provider call (provider_ms)."""
    e2e, inside, call, server, missing, sizes = [], [], [], [], 0, []
    for tag, t_start, t_end, extra in turns:
        note = served.get(tag)
        if note is None:
            missing += 1
            continue
        ms, _, size = note
        server.append(ms)
        sizes.append(size)
        e2e.append((t_end - t_start) * 1000 - ms)
        if "took_ms" in extra:
            inside.append(extra["took_ms"] - ms)
            call.append(extra["provider_ms"] - ms)
    raw = {"end_to_end": e2e, "server_ms": server}
    if inside:
        raw.update({"in_turn": inside, "in_provider_call": call})
    out: dict[str, Any] = {k: summary(v) for k, v in raw.items()}
    out.update({"unmatched": missing, "request_bytes": statistics.median(sizes) if sizes else None,
                "_raw": raw})
    return out


# --------------------------------------------------------------------------
# The sides
# --------------------------------------------------------------------------

def request_body(stream: bool = False) -> dict[str, Any]:
    """The body crewlet's openai provider sends for a mail turn of a seat on a data node
    (crewlet/agent/providers/openai.py ``_body``), its user text to be filled in."""
    from crewlet.agent.estate_tools import estate_tools
    from crewlet.agent.tools import Registry, builtin_tools

    registry = Registry()
    for tool in builtin_tools() + estate_tools():
        registry.add(tool)
    body: dict[str, Any] = {
        "messages": [{"role": "system", "content": PERSONA}, {"role": "user", "content": ""}],
        "model": MODEL,
        "tools": [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                    "parameters": t.parameters}} for t in registry.specs()]}
    if stream:
        body.update({"stream": True, "stream_options": {"include_usage": True}})
    return body


class Bare:
    """The bare client: the bench's own HTTP/1.1 keep-alive client over asyncio streams
    (bench/api.py's, a connection per worker), crewlet's request body encoded per
    request, the answer parsed; or (*library*) aiohttp's ClientSession, crewlet's
    HTTP library, with no pool limit."""

    def __init__(self, provider: Provider, stream: bool = False, library: bool = False):
        self.port, self.path = provider.port, "/v1/chat/completions"
        self.url = provider.base_url + "/chat/completions"
        self.stream = stream
        self.body = request_body(stream)
        self.headers = {"content-type": "application/json"}
        self.conns: dict[str, Conn] = {}
        self.library = library
        self.client: aiohttp.ClientSession | None = None  # made on the loop that uses it

    async def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        if self.client is not None:
            await self.client.close()

    def _body(self, tag: str) -> dict[str, Any]:
        return {**self.body, "messages": [self.body["messages"][0], {"role": "user", "content": tag}]}

    async def turn(self, tag: str) -> tuple[float, float, dict]:
        t = time.monotonic()
        if self.library:
            await self._aiohttp(tag)
        else:
            await self._raw(tag)
        return t, time.monotonic(), {}

    async def _raw(self, tag: str) -> None:
        worker = tag.rsplit("-", 2)[1]
        conn = self.conns.get(worker)
        if conn is None:
            conn = self.conns[worker] = await Conn(self.port).open()
        status, body = await conn.request(http_request(
            "POST", self.path, self.port, self.headers, json.dumps(self._body(tag)).encode()))
        if status != 200:
            raise BenchError(f"bare: HTTP {status}: {body[:200]!r}")
        if not self.stream:
            json.loads(body)["choices"][0]["message"]["content"]
            return
        text, ended = [], False
        for line in body.decode().split("\n"):
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                ended = True
                break
            for choice in json.loads(data).get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
        if not ended:
            raise BenchError("bare stream: the stream ended before [DONE]")

    async def _aiohttp(self, tag: str) -> None:
        if self.client is None:
            self.client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT))
        async with self.client.post(self.url, headers=self.headers,
                                    data=json.dumps(self._body(tag)).encode()) as r:
            body = await r.read()
        if r.status != 200:
            raise BenchError(f"bare aiohttp: HTTP {r.status}: {body[:200]!r}")
        json.loads(body)["choices"][0]["message"]["content"]


class Mail:
    """The node's side: a seat's turn is one mail published, waited for by its done record."""

    def __init__(self, url: str):
        self.url = url
        self.nc: Any = None
        self.waiting: dict[str, asyncio.Future] = {}
        self.outcomes: collections.Counter = collections.Counter()

    async def open(self) -> None:
        self.nc = await nats.connect(self.url, name="bench-slow-turns", connect_timeout=2,
                                     allow_reconnect=False, pending_size=64 * 1024 * 1024)
        self.js = self.nc.jetstream(timeout=JS_TIMEOUT)
        await self.nc.subscribe("feed.turn.>", cb=self._on_record, pending_msgs_limit=1_000_000)
        await self.nc.flush()

    async def close(self) -> None:
        if self.nc is not None:
            try:
                await asyncio.wait_for(self.nc.close(), 10)
            except Exception:
                pass

    async def _on_record(self, msg) -> None:
        t = time.monotonic()
        try:
            rec = json.loads(msg.data)
        except ValueError:
            return
        self.outcomes[rec.get("outcome")] += 1
        if rec.get("outcome") != "done":
            return
        fut = self.waiting.pop(rec.get("trigger"), None)
        if fut is not None and not fut.done():
            fut.set_result((t, {"took_ms": float(rec.get("took_ms") or 0.0),
                                "provider_ms": float(rec.get("provider_ms") or 0.0),
                                "deliveries": int(rec.get("deliveries") or 1)}))

    def for_seats(self, seats: list[str]) -> Callable[[str], Any]:
        """turn(tag) for the Round: worker w mails seats[w]."""
        async def turn(tag: str) -> tuple[float, float, dict]:
            # The tag is the trigger and the mail's text (which the provider notes).
            seat, trigger = seats[int(tag.rsplit("-", 2)[1])], tag
            fut = asyncio.get_running_loop().create_future()
            self.waiting[trigger] = fut
            t = time.monotonic()
            await self.js.publish(SUBJECT + seat, tag.encode(), timeout=JS_TIMEOUT,
                                  headers={TRIGGER_HEADER: trigger, "Nats-Msg-Id": trigger})
            try:
                t_end, extra = await asyncio.wait_for(fut, STALL)
            except asyncio.TimeoutError:
                raise BenchError(f"no done record for {trigger} within {STALL:g}s; records by outcome: "
                                 f"{dict(self.outcomes)}") from None
            return t, t_end, extra
        return turn


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------

class SlowNode(CrewletNode):
    """bench/turns.py's node (its seat waits, stats and log reading), with the openai
    provider(s) on the fake server and node.max_concurrent from the args."""

    def __init__(self, base: str, binary: str, seats: list[str], args: argparse.Namespace, base_url: str):
        self.seats = seats
        Crewletd.__init__(self, base, {
            "node": {"id": NODE_ID, "max_concurrent": args.max_concurrent,
                     # bench/skills.py drives this node with its own options: no pool size there.
                     **({"seats_processes": args.seats_processes}
                        if getattr(args, "seats_processes", None) else {})},
            "supervisor": {"shutdown_timeout": ROLE_SHUTDOWN, "broker_shutdown_timeout": ROLE_SHUTDOWN},
            "fleet": {"sweep": args.sweep, "heartbeat": args.heartbeat, "lease_ttl": args.lease_ttl},
        }, binary=binary)
        providers = [f"p{i}" for i in range(args.providers)]
        company = {
            "company": {"name": "bench"},
            "providers": {p: {"kind": "openai", "base_url": base_url, "model": MODEL} for p in providers},
            "seats": [{"name": s, "persona": PERSONA, "provider": providers[i % len(providers)]}
                      for i, s in enumerate(seats)],
        }
        self.revision_bytes = revision_bytes(company)
        self.company_path = os.path.join(base, "company.yaml")
        with open(self.company_path, "w") as f:
            json.dump(company, f)

    def wait_seats(self, timeout: float, progress: list[dict]) -> tuple[float, float]:
        """Seconds from the start until all seats were held, and until the seats
        process worked them all; a sample every :data:`NOTE_EVERY` s goes to *progress*."""
        n, t0 = len(self.seats), time.perf_counter()
        held_s = None
        next_note = t0 + NOTE_EVERY
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
                progress.append({"t": round(now - t0, 1), "held": held, "working": working})
                say(f"  {now - t0:5.0f}s: {held}/{n} held, {working} working")
                next_note = now + NOTE_EVERY
            if now - t0 > timeout:
                raise BenchError(f"{held} of {n} seats held, {working} working, after {timeout:g}s")
            time.sleep(0.25)

    def running(self) -> dict[str, Any]:
        """What the seats process says it runs now (turns between fetch and ack), and its peak."""
        stats = self.seats_stats(self.status())
        return {"running": stats.get("running"), "peak": stats.get("peak")}


# --------------------------------------------------------------------------
# The profile
# --------------------------------------------------------------------------

def find_py_spy() -> str | None:
    exe = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return exe if os.access(exe, os.X_OK) else shutil.which("py-spy")


def _package(frame: str) -> str:
    """Where a py-spy frame (``name (path:line)``) lives: the path's top directory
    (``aiohttp``, ``nats``, ``asyncio``), two levels for crewlet's own (``crewlet/agent``)."""
    path = frame.rpartition(" (")[2].rstrip(")").rpartition(":")[0]
    parts = path.split("/")
    if parts[0] in ("crewlet", "roles", "supervisor") and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0] if len(parts) > 1 else path


def hot_spots(path: str, top: int = PROFILE_TOP) -> dict[str, Any]:
    """py-spy's collapsed stacks (``--format raw``: ``frame;frame;... count`` a line, the
    leaf last) of the main thread (the loop; other threads' samples are only counted)
    as the *top* functions by self and by total, % of the samples, and the
    self samples by package. The total list leaves out the frames nearly every sample
    of the loop's thread has (the loop and the role's start: in :data:`ROOT_SHARE` of the
    most common frame's samples or more)."""
    self_n: collections.Counter = collections.Counter()
    total_n: collections.Counter = collections.Counter()
    by_package: collections.Counter = collections.Counter()
    samples = others = 0
    for frames, n in collapsed_stacks(path):
        if frames[0].startswith(OTHER_THREAD):
            others += n   # the watchdog's thread, to_thread's workers: not the loop
            continue
        samples += n
        self_n[frames[-1]] += n
        by_package[_package(frames[-1])] += n
        for frame in set(frames):
            total_n[frame] += n
    if not samples:
        return {"samples": 0, "other_threads": others, "self": [], "total": [], "packages": []}

    def pct(c: int) -> float:
        return round(100.0 * c / samples, 1)

    roots = ROOT_SHARE * total_n.most_common(1)[0][1]
    below_roots = [(f, c) for f, c in total_n.most_common() if c < roots]
    return {"samples": samples, "other_threads": others,
            "self": [{"function": f, "pct": pct(c)} for f, c in self_n.most_common(top)],
            "total": [{"function": f, "pct": pct(c)} for f, c in below_roots[:top]],
            "packages": [{"package": k, "pct": pct(c)} for k, c in by_package.most_common(top)]}


async def profile_round(node: SlowNode, seats: list[str], mail: Mail, procs: dict[str, Any],
                        args: argparse.Namespace, out: dict[str, Any]) -> None:
    """One more crewlet round, not counted, with py-spy recording the seats process."""
    py_spy = find_py_spy()
    seats_proc = procs.get("seats")
    if py_spy is None or seats_proc is None:
        out["profile"] = {"error": "py-spy not found" if py_spy is None else "no seats process"}
        return
    path = os.path.join(args.profile_dir, f"slow_turns-seats-{len(seats)}-{os.getpid()}.collapsed")
    argv = [py_spy, "record", "-p", str(seats_proc.pid), "-d", str(int(args.profile)), "-r", str(PROFILE_RATE),
            "--function", "--format", "raw", "-o", path] + (["--nonblocking"] if args.profile_nonblocking else [])
    rnd = Round("crewlet (profiled)", len(seats), args, procs)
    spy: subprocess.Popen | None = None

    async def start_spy() -> None:
        nonlocal spy
        await rnd.all_started.wait()
        await asyncio.sleep(max(0.0, args.ramp - 1))
        spy = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    starter = asyncio.create_task(start_spy())
    try:
        r = await rnd.run(mail.for_seats(seats), "prof", args.profile + 2)
    finally:
        starter.cancel()
        if spy is not None and spy.poll() is None:
            try:
                await asyncio.to_thread(spy.wait, args.profile + 30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(10)
    said = spy.stdout.read().decode(errors="replace").strip()[-600:] if spy and spy.stdout else ""
    if spy is None or spy.returncode != 0 or not os.path.exists(path):
        out["profile"] = {"error": f"py-spy exited with {spy.returncode if spy else None}: {said}"}
        return
    out["profile"] = {"path": path, "seconds": args.profile, "rate": PROFILE_RATE,
                      "nonblocking": args.profile_nonblocking,
                      "per_s": r["per_s"], "cpu_pct": r["cpu_pct"], "py_spy": said[-300:],
                      **hot_spots(path)}


# --------------------------------------------------------------------------
# One size
# --------------------------------------------------------------------------

async def idle_window(procs: dict[str, psutil.Process | None], seconds: float) -> dict[str, Any]:
    """CPU ms per second of each of the node's processes over *seconds* with
    every seat held and no turn in flight (after :data:`IDLE_SETTLE` s of
    quiet, at most *seconds*): what the node costs whether or not it works,
    which a round's CPU per turn includes as ``idle / turns per s``."""
    await asyncio.sleep(min(IDLE_SETTLE, seconds))
    meter = CpuMeter(procs).start()
    await asyncio.sleep(seconds)
    pct = meter.read()
    ms_per_s = {k: (v * 10 if v is not None else None) for k, v in pct.items()}   # % of a core -> ms/s
    return {"seconds": seconds, "cpu_ms_per_s": ms_per_s}


def over_idle(per_turn: dict[str, float | None] | None, idle: dict[str, Any] | None,
              per_s: float | None) -> dict[str, float] | None:
    """CPU ms per turn over the idle cost (*per_turn* minus each process's
    idle ms/s spread over the round's turns/s): what a turn itself adds; with
    ``node`` (every process of crewletd's tree) and ``others`` (those that
    play no part in a turn: crewletd, the zygote, ingress, workers)."""
    if not per_turn or not idle or not per_s:
        return None
    out: dict[str, float] = {}
    for k, v in per_turn.items():
        base = idle["cpu_ms_per_s"].get(k)
        if v is not None and base is not None:
            out[k] = v - base / per_s
    node = [v for k, v in out.items() if k not in OUTSIDE_NODE]
    out["node"] = sum(node)
    out["others"] = sum(v for k, v in out.items() if k in OTHERS)
    return out


async def measure(provider: Provider, node: SlowNode, seats: list[str], args: argparse.Namespace,
                  out: dict[str, Any], profile: bool) -> None:
    out["stage"] = "starting the provider and the node"
    provider.start()
    node.start()
    await provider.wait()
    out["stage"] = "waiting for the seats to be held"
    out["held_seconds"], out["working_seconds"] = await asyncio.to_thread(
        node.wait_seats, args.hold_timeout, out["progress"])
    node_procs = await asyncio.to_thread(node.processes)
    out["pids"] = {k: p.pid for k, p in node_procs.items()}
    me, server = psutil.Process(), provider.process()
    out["pids"].update({"provider": server.pid, "bench": me.pid})
    mail = Mail(node.url)
    await mail.open()
    if args.idle > 0:
        out["stage"] = "metering the node idle"
        out["idle"] = await idle_window(node_procs, args.idle)
        say("  idle, every seat held, nothing in flight: CPU ms/s "
            + " ".join(f"{k} {v:.1f}" for k, v in out["idle"]["cpu_ms_per_s"].items() if v is not None))
    sides: dict[str, tuple[dict[str, Any], Callable[[str], Any], str]] = {}
    clients: list[Bare] = []
    n = len(seats)
    try:
        # Per side: the processes metered, the turn, a short tag.
        bares = {"bare": Bare(provider), "bare aiohttp": Bare(provider, library=True)}
        if args.bare_stream:
            bares["bare stream"] = Bare(provider, stream=True)
        for short, (name, client) in zip("bhs", bares.items()):
            clients.append(client)
            sides[name] = ({"provider": server, "bench": me}, client.turn, short)
        sides["crewlet"] = ({**node_procs, "provider": server, "bench": me}, mail.for_seats(seats), "c")
        order = list(sides)
        for i in range(args.rounds):
            for name in order if i % 2 == 0 else order[::-1]:
                out["stage"] = f"round {i + 1}, {name}"
                procs, turn, short = sides[name]
                rnd = Round(name, n, args, procs, sample=node.running if name == "crewlet" else None)
                r = await rnd.run(turn, f"r{i}{short}", args.seconds)
                served = await provider.notes()
                r["added_ms"] = added(rnd.in_window(), served)
                if name == "crewlet":
                    r["outcomes"] = dict(mail.outcomes)
                    r["redelivered"] = sum(1 for d in rnd.in_window() if d[3].get("deliveries", 1) > 1)
                    mail.outcomes.clear()
                out.setdefault(name, {"rounds": []})["rounds"].append(r)
                a = r["added_ms"]["end_to_end"]
                say(f"  round {i + 1} {name}: {r['per_s']:.0f}/s over {r['seconds']:.0f} s "
                    f"(ramp {r['ramp_s']:.1f} s), added p50/p99 {_f(a['median'], '.1f')}/{_f(a['p99'], '.1f')} ms, "
                    f"CPU % " + " ".join(f"{k} {v:.0f}" for k, v in r["cpu_pct"].items() if v is not None))
        if profile and args.profile > 0:
            out["stage"] = "profiling the seats process"
            say(f"  profiling the seats process for {args.profile:g} s (py-spy, a round not counted)")
            await profile_round(node, seats, mail, node_procs, args, out)
            await provider.notes()   # forget them
        st = await asyncio.to_thread(node.status)
        out["seats_stats"] = {k: v for k, v in node.seats_stats(st).items() if k != "seats"}
        node.check_alive()
        out["stage"] = "done"
    finally:
        await mail.close()
        for c in clients:
            await c.close()


def run_size(binary: str, n: int, args: argparse.Namespace, profile: bool) -> dict[str, Any]:
    seats = seat_names(n)
    base = tempfile.mkdtemp(prefix="cws", dir="/tmp")
    provider = Provider(base, args.tokens, args.rate)
    node = SlowNode(os.path.join(base, "n"), binary, seats, args, provider.base_url)
    out: dict[str, Any] = {"in_flight": n, "stage": "", "progress": []}
    say(f"{n} in flight: {args.rounds} rounds of {args.seconds:g} s per side (provider :{provider.port}, "
        f"crewletd broker :{node.stream_port}, {args.providers} provider(s), dir {base})")
    try:
        asyncio.run(measure(provider, node, seats, args, out, profile))
    except Exception as exc:  # a size that broke is reported, and the next one runs
        what = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        out["error"] = f"while {out['stage']}: {what}"
        say(f"  FAILED {out['error']}")
    finally:
        stop_at = node.log_size()
        out["log"] = node.problems(0, stop_at)
        say("  stopping crewletd and the provider")
        out["node_stop_seconds"] = node.stop()
        out["stop_log"] = node.problems(stop_at)["counts"]
        provider.stop()
        if args.keep or out.get("error"):
            out["kept"] = base
            say(f"  kept {base} (crewletd log: {node.log_path})")
        else:
            shutil.rmtree(base, ignore_errors=True)
    for side in SIDES:
        if side in out:
            rounds = out[side]["rounds"]
            out[side]["per_s"] = statistics.median(r["per_s"] for r in rounds)
            mid = sorted(rounds, key=lambda r: r["per_s"])[(len(rounds) - 1) // 2]
            out[side]["cpu_ms_per_turn"] = mid["cpu_ms_per_turn"]
            out[side]["added_ms"] = pooled(rounds)
    return out


def pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' added latencies pooled: one summary over every turn of every window.
    Takes the raw values out of the rounds (the report keeps their summaries)."""
    values: dict[str, list[float]] = collections.defaultdict(list)
    for r in rounds:
        for key, vs in r["added_ms"].pop("_raw", {}).items():
            values[key] += vs
    return {key: summary(vs) for key, vs in values.items()}


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def build_report(results: list[dict[str, Any]], args: argparse.Namespace, binary: str) -> dict[str, Any]:
    rows = []
    for r in results:
        row: dict[str, Any] = {"in_flight": r["in_flight"], "held_seconds": r.get("held_seconds"),
                               "error": r.get("error")}
        for side in SIDES:
            got = r.get(side) or {}
            row[side] = {"per_s": got.get("per_s"), "added_ms": got.get("added_ms"),
                         "cpu_ms_per_turn": got.get("cpu_ms_per_turn")}
        c = row["crewlet"]["per_s"]
        row["idle"] = r.get("idle")
        row["crewlet"]["cpu_ms_per_turn_over_idle"] = over_idle(row["crewlet"]["cpu_ms_per_turn"],
                                                                r.get("idle"), c)
        row["ratio"] = ratio(c, row["bare"]["per_s"])
        row["ratio_aiohttp"] = ratio(c, row["bare aiohttp"]["per_s"])
        rows.append(row)
    return {"rows": rows, "results": results,
            "targets": {"per_s_at_1000": TARGET_PER_S, "added_p99_ms": TARGET_ADDED_P99},
            "config": {"sizes": args.sizes, "rounds": args.rounds, "seconds": args.seconds, "ramp": args.ramp,
                       "tokens": args.tokens, "rate": args.rate, "answer_s": args.tokens / args.rate,
                       "providers": args.providers, "max_concurrent": args.max_concurrent,
                       "fleet": {"sweep": args.sweep, "heartbeat": args.heartbeat, "lease_ttl": args.lease_ttl},
                       "nats_server": server_version(binary), "nats_py": NATS_PY_VERSION,
                       "aiohttp": aiohttp.__version__, "python": sys.version.split()[0],
                       "cpus": os.cpu_count()}}


def _f(v: float | None, spec: str) -> str:
    width = int(spec.split(".")[0] or 0)
    return f"{v:{spec}}" if v is not None else f"{'n/a':>{width}}"


def _lat(a: dict[str, Any] | None, key: str = "end_to_end") -> str:
    s = (a or {}).get(key)
    if not s or not s.get("n"):
        return "n/a"
    return f"{s['median']:.1f} / {s['p95']:.1f} / {s['p99']:.1f}"


def _cpu(cpu: dict[str, float | None] | None) -> str:
    if not cpu:
        return "n/a"
    return ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if v is not None)


def print_text(rep: dict[str, Any]) -> None:
    cfg = rep["config"]
    print(f"crewlet slow turns benchmark  (python {cfg['python']}, {cfg['cpus']} cpus, nats-server "
          f"{cfg['nats_server']}, nats-py {cfg['nats_py']}, aiohttp {cfg['aiohttp']}; the provider answers "
          f"{cfg['tokens']} tokens at {cfg['rate']:g}/s = {cfg['answer_s']:.1f} s; node.max_concurrent "
          f"{cfg['max_concurrent']}, {cfg['providers']} provider(s); {cfg['rounds']} interleaved rounds of "
          f"{cfg['seconds']:g} s per side, medians)")
    print()
    print(f"{'in flight':>9} {'crewlet':>8} {'bare':>8} {'x':>5} {'aiohttp':>8} {'x':>5}  "
          f"{'added ms p50 / p95 / p99, end to end':>38}")
    print(f"{'':>9} {'turns/s':>8} {'req/s':>8} {'':>5} {'req/s':>8} {'':>5}  "
          f"{'crewlet':>22} | {'bare':>20} | {'aiohttp':>20}")
    for row in rep["rows"]:
        print(f"{row['in_flight']:9d} {_f(row['crewlet']['per_s'], '8.1f')} {_f(row['bare']['per_s'], '8.1f')} "
              f"{_f(row['ratio'], '5.2f')} {_f(row['bare aiohttp']['per_s'], '8.1f')} "
              f"{_f(row['ratio_aiohttp'], '5.2f')}  {_lat(row['crewlet']['added_ms']):>22} | "
              f"{_lat(row['bare']['added_ms']):>20} | {_lat(row['bare aiohttp']['added_ms']):>20}")
    print()
    for row, r in zip(rep["rows"], rep["results"]):
        print(f"{r['in_flight']} in flight:")
        if r.get("error"):
            print(f"   FAILED {r['error']}")
        print("   rounds, per s: " + "; ".join(
            f"{side} " + ", ".join(f"{x['per_s']:.1f}" for x in r[side]["rounds"]) for side in SIDES if r.get(side)))
        c = r.get("crewlet")
        if c:
            print(f"   crewlet added ms inside the turn (took_ms - server): {_lat(c['added_ms'], 'in_turn')}; "
                  f"in the provider call (provider_ms - server): {_lat(c['added_ms'], 'in_provider_call')}; "
                  f"the server's own ms: {_lat(c['added_ms'], 'server_ms')}")
            sampled = [x.get("in_flight_sampled") for x in c["rounds"]]
            ramps = ", ".join(f"{x['ramp_s']:.1f}" for x in c["rounds"])
            again = ", ".join(str(x.get("redelivered")) for x in c["rounds"])
            print("   crewlet turns running mid-window (the seats process's count, peak): "
                  + ", ".join(f"{s['running']} ({s['peak']})" for s in sampled if s)
                  + f"; ramp s: {ramps}; turns of a redelivered mail: {again}")
        for side in SIDES:
            if row[side]["cpu_ms_per_turn"]:
                print(f"   CPU ms per turn, {side}: {_cpu(row[side]['cpu_ms_per_turn'])}")
        if row.get("idle"):
            others = sum(v for k, v in row["idle"]["cpu_ms_per_s"].items() if k in OTHERS and v is not None)
            print(f"   CPU ms/s idle (every seat held, nothing in flight, {row['idle']['seconds']:g} s): "
                  f"{_cpu(row['idle']['cpu_ms_per_s'])}; others {others:.1f}")
        if row["crewlet"].get("cpu_ms_per_turn_over_idle"):
            print(f"   CPU ms per turn over idle, crewlet (what a turn adds): "
                  f"{_cpu(row['crewlet']['cpu_ms_per_turn_over_idle'])}")
        if r.get("held_seconds") is not None:
            print(f"   all seats held {r['held_seconds']:.1f} s after crewletd's start")
        counts = (r.get("log") or {}).get("counts") or {}
        if counts:
            print("   node log warnings/errors: " + ", ".join(f"{k} x{v}" for k, v in list(counts.items())[:10]))
        prof = r.get("profile")
        if prof:
            if prof.get("error"):
                print(f"   profile: {prof['error']}")
            else:
                print(f"   py-spy on the seats process, {prof['seconds']:g} s at {prof['rate']}/s "
                      f"({prof['samples']} samples of the loop's thread, {prof['other_threads']} of others; "
                      f"{prof['per_s']:.0f} turns/s meanwhile; {prof['path']}):")
                for kind in ("self", "total"):
                    print(f"     {kind}:")
                    for h in prof[kind]:
                        print(f"       {h['pct']:5.1f} %  {h['function']}")
                print("     self, by package: " + ", ".join(f"{h['package']} {h['pct']:.1f} %"
                                                          for h in prof["packages"]))
        if r.get("kept"):
            print(f"   kept: {r['kept']}")
    print()
    print(f"x: crewlet / bare. targets (issue 13, informational): >= {TARGET_PER_S:g} turns/s at 1,000 in "
          f"flight; <= {TARGET_ADDED_P99:g} ms added at p99 (end to end, over the provider's own time "
          f"for the request).")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-provider"]:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops us, by pid
        serve_provider(int(argv[1]), int(argv[2]), float(argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 in flight, one round of 6 s, no profile (~1 min)")
    ap.add_argument("--sizes", help="turns in flight (= seats), comma separated (default 100,1000)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per side (default 2; quick 1)")
    ap.add_argument("--seconds", type=float, help="the steady window of a round, s (default 20; quick 6)")
    ap.add_argument("--ramp", type=float, default=4.0,
                    help="s at least from a round's start to its window, after every worker's first turn "
                         "(default 4)")
    ap.add_argument("--ramp-timeout", type=float, default=180.0,
                    help="s every worker may take to finish its first turn (default 180)")
    ap.add_argument("--tokens", type=int, default=TOKENS, help=f"tokens per answer (default {TOKENS})")
    ap.add_argument("--rate", type=float, default=RATE, help=f"tokens/s of the provider (default {RATE:g})")
    ap.add_argument("--providers", type=int, default=1,
                    help="identical openai providers the seats are spread over (default 1)")
    ap.add_argument("--max-concurrent", type=int, default=MAX_CONCURRENT,
                    help=f"node.max_concurrent (default {MAX_CONCURRENT})")
    ap.add_argument("--seats-processes", type=int,
                    help="node.seats_processes: the seats pool's size (default: the node's, one a CPU)")
    ap.add_argument("--idle", type=float,
                    help="s the node is metered idle (every seat held, nothing in flight) before the rounds, "
                         "to split CPU per turn into idle and what a turn adds (default 10; quick 6; 0: off)")
    ap.add_argument("--bare-stream", action="store_true", help="also a bare client asking for streams")
    ap.add_argument("--profile", type=float, help="s of py-spy on the seats process at the largest size "
                                                  "(default 20; quick 0: off)")
    ap.add_argument("--profile-nonblocking", action="store_true",
                    help="py-spy --nonblocking: no pauses of the seats process, but stacks read while it "
                         "runs (some land on the wrong frame)")
    ap.add_argument("--profile-dir", default=tempfile.gettempdir(), help="where the collapsed stacks go")
    ap.add_argument("--sweep", type=float, default=1.0, help="the node's fleet.sweep (default 1)")
    ap.add_argument("--heartbeat", type=float, default=5.0, help="the node's fleet.heartbeat (default 5)")
    ap.add_argument("--lease-ttl", type=float, default=15.0, help="the node's fleet.lease_ttl (default 15)")
    ap.add_argument("--hold-timeout", type=float, default=300.0,
                    help="s the node may take to hold and work every seat (default 300)")
    ap.add_argument("--nats-server", help="the nats-server binary (default: as crewlet finds it)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (a failed size keeps its own)")
    add_smoke(ap, argv, {"sizes": "5", "rounds": 1, "seconds": 0.5, "ramp": 0.2, "tokens": 5,
                         "rate": 50.0, "profile": 0.0, "bare_stream": True, "idle": 0.5})
    args = ap.parse_args(argv)
    quick = args.quick
    args.sizes = args.sizes or ("100" if quick else "100,1000")
    args.rounds = args.rounds or (1 if quick else 2)
    args.seconds = args.seconds or (6.0 if quick else 20.0)
    args.profile = args.profile if args.profile is not None else (0.0 if quick else 20.0)
    args.idle = args.idle if args.idle is not None else (6.0 if quick else 10.0)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error("--sizes: whole numbers, comma separated")
    if not args.sizes or min(args.sizes) < 1 or min(args.rounds, args.providers, args.tokens) < 1 \
            or args.seconds <= 0 or args.rate <= 0:
        ap.error("--sizes, --rounds, --providers, --tokens must be >= 1; --seconds, --rate > 0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        binary = find_nats_server(args.nats_server)
    except BenchError as exc:
        print(f"bench/slow_turns.py: {exc}", file=sys.stderr)
        return 1
    largest = max(args.sizes)
    results, profiled = [], False
    for n in args.sizes:
        profile = n == largest and not profiled
        profiled = profiled or profile
        results.append(run_size(binary, n, args, profile))
    return emit(build_report(results, args, binary), args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
