#!/usr/bin/env python3
"""Benchmark: skills (issue 25) — what 200 skills add to a turn, how fast a changed skill reaches
every node's next turn, and a learning pass over 100,000 episodes; each beside a same-run baseline.

Everything on 127.0.0.1, in one run (``--parts``, default 1,2,3):

1. **A turn's added cost with 200 skills in the store beside none.** A real
   node (``bench/slow_turns.py``'s: ``crewletd start --company``, embedded
   broker, all four roles) whose ``--seats`` seats (default 4) use the
   ``openai`` provider on a fake OpenAI server in a process of its own (this
   file with ``--serve-provider``: every chat completion answered after
   ``--answer-ms`` (20 ms), each request noted: its tag — the mail's text —,
   size, system prompt length, arrival; a probe's whole system prompt). Every
   seat is driven in a closed loop (slow_turns' ``Round``: a mail to
   ``agents.inbox.<seat>``, the next once its ``done`` record is on
   ``feed.turn.<seat>``) over a steady window of ``--seconds`` s; the node's
   CPU per turn is every process of crewletd's tree (the broker, crewletd,
   the zygote and the four roles, psutil CPU times over the window) divided
   by the turns done in it. Rounds alternate **none** (no skill in the
   store) and **with** (``--skills`` 200 skills written to the estate's log
   as ``skill.write`` ops: a realistic ``SKILL.md`` — front matter with
   ``name``, a ~150-character ``description``, ``license``, ``metadata`` with
   a version and no ``crewlet-seats``, so each applies to every seat — and a
   Markdown body of ~1 kB, plus a ``references/CHECKLIST.md``); before a
   *with* round the bench writes them (new revisions each time) and probes
   seat 0 until its request's system prompt holds the very list
   ``crewlet.skills.format.prompt_list`` makes of them (bounded at 4,000
   characters: ~20 of the 200 and a count of the rest); before a *none*
   round it retires them (``skill.retire``) and probes until the list has
   left the prompt; then ``--settle`` s. Order none/with, then with/none
   (ABBA), for ``--rounds`` pairs; figures are medians over the rounds of a
   side. Reported: node CPU ms per turn with / none (**target ≤ 1.1×**),
   the seats process's alone, turns/s, the request body and the system
   prompt (median bytes / characters), and how long the 200 writes took to
   be in a prompt.
2. **A changed skill's time to reach every node's next turn.** A loopback
   fleet of three nodes on one bare ``nats-server -js`` (``stream.type:
   nats``, the fleet tests' timings: heartbeat 1 s, lease TTL 3 s, sweep
   0.5 s): two data nodes (every role) and one stateless node (roles
   ``[seats]``: no copy of the estate; it learns of a change only by the
   broadcast and its walks — ``skills.walk_every`` stays at its 300 s, so
   the walks play no part). The company (``crewletctl apply``) has one seat
   placed on each node (``placement.labels.zone``), on the same fake
   provider. ``--changes`` times (default 5): one ``skill.write`` of a new
   skill is published to the log; from its publish's **ack**, each node's
   seat is sent mail, one turn after another, until its request's system
   prompt names the skill. Per node: the time from the ack to the arrival
   at the provider of the first request naming it (an upper bound of the
   moment the node's seats would put it in a prompt), and of the last one
   not naming it (a lower bound); the max over nodes per change (**target
   ≤ 1 s**). Beside it: a bare nats-py core publish → three subscribers
   (three connections, as the three nodes' registries) on the same broker,
   until all three have it (the broadcast's floor), and a probe's own time
   from its mail's publish to its request at the provider (the
   measurement's resolution).
3. **A learning pass over 100,000 episodes** (``--episodes``): time and
   peak memory (tracemalloc) of ``crewlet.learning.cluster.cluster`` — the
   clustering function (the learning pass's grouping: by tool set, then
   single-linkage over the Jaccard index of the ask's and summary's words;
   written beside this bench, so a checkout without it reports this part as
   not run) — over synthetic episode rows drawn from a fixed seed (40 seats,
   200 counterparties, 30 tool sets of 14 tools, 300 topics each with its
   usual tool set: an ask and a summary made of the topic's words and a few
   others, 3 % of the rows on another tool set, 3 % noise), beside **the same
   grouping done by a plain script over the same rows**: a dict of lists by
   tool set, the same words (the module's stop words), and in each tool set
   every row joined to the first group whose first row is at least as
   similar (Jaccard), else a group of its own (leader clustering: the plain
   way; it splits what a chain joins, so its groups are reported beside).
   Interleaved ``--learning-rounds`` (2) timed runs of each, then one each
   under tracemalloc for the peak (the rows themselves are made before and
   not counted; their own size is shown).

``--smoke``: 2 seats, 10 skills, windows of 1 s, one change, 2,000 episodes
(every part once, in well under two minutes; the figures mean nothing).
Everything started is stopped by its pid, on failure and on Ctrl-C too.
Exit status: 0 unless the benchmark itself broke.

    python bench/skills.py [--parts 1,2,3] [--skills 200] [--rounds 2] [--seconds 10] [--changes 5]
                           [--episodes 100000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import httpx2  # noqa: E402
import nats  # noqa: E402
import psutil  # noqa: E402
from nats.aio.client import __version__ as NATS_PY_VERSION  # noqa: E402

from bench.common import (BenchError, Crewletd, NatsServer, add_smoke, child_env, emit,  # noqa: E402
                          find_nats_server, ratio, say, server_version, summary, wait_jetstream)
from bench.slow_turns import HOST, MODEL, PERSONA, Mail, Provider, Round, SlowNode, added  # noqa: E402
from bench.turns import JS_TIMEOUT, CrewletNode  # noqa: E402
from crewlet.estate import log as estate_log  # noqa: E402
from crewlet.estate.ops import make_op  # noqa: E402
from crewlet.skills import format as skill_format  # noqa: E402
from crewlet.skills.registry import PROMPT_CHARS  # noqa: E402

ANSWER_MS = 20.0                   # the fake provider's answer time
PROBE = "p"                        # a probe's tag starts so (its system prompt is noted whole)
FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}   # the fleet tests' timings
FLEET_NODES = 3                    # two data nodes and a stateless one
TARGET_RATIO = 1.1                 # node CPU per turn, 200 skills / none (issue 25)
TARGET_REACH_S = 1.0               # a changed skill in every node's next turn (issue 25)
PUBLISH_WINDOW = 50                # skill ops in flight at once
PROBE_TIMEOUT = 60.0               # s a prompt may take to show a change
BARE_MESSAGES = 200                # core publishes of the broadcast's floor
SEED = 25
STOP_GRACE = 60.0                  # s a node gets to stop


# --------------------------------------------------------------------------
# The provider: a fake OpenAI chat completions server noting system prompts
# (a subprocess: this file with --serve-provider)
# --------------------------------------------------------------------------

def serve_provider(port: int, answer_s: float) -> None:
    """Answer every chat completion after *answer_s* (not streamed); note each request:
    ``[tag, server ms, request bytes, system prompt chars, arrival (wall clock), system
    prompt (probes only, else None)]``; ``GET /bench/log`` hands the notes over and forgets them."""
    notes: list[list[Any]] = []
    answer = json.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}},
        separators=(",", ":")).encode()

    def respond(writer, status: str, body: bytes) -> None:
        writer.write(f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
                     f"content-length: {len(body)}\r\n\r\n".encode() + body)

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
                t_in, at = time.monotonic(), time.time()
                if method == "POST" and path.endswith("/chat/completions"):
                    try:
                        messages = json.loads(body)["messages"]
                        tag = str(messages[-1]["content"])
                        system = str(messages[0]["content"]) if messages[0].get("role") == "system" else ""
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                        respond(writer, "400 Bad Request", b'{"error":{"message":"not a chat completion"}}')
                    else:
                        await asyncio.sleep(max(0.0, t_in + answer_s - time.monotonic()))
                        respond(writer, "200 OK", answer)
                        await writer.drain()
                        notes.append([tag, (time.monotonic() - t_in) * 1000, len(body), len(system), at,
                                      system if tag.startswith(PROBE) else None])
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
        server = await asyncio.start_server(handle, HOST, port, backlog=1024)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with server:
            await stop.wait()

    asyncio.run(main())


@dataclass
class Note:
    tag: str
    ms: float          # the server's own time for the request
    size: int          # request bytes
    system_chars: int
    at: float          # arrival, wall clock (time.time())
    system: str | None


class SkillsProvider(Provider):
    """slow_turns' provider process, running this file's server (the answer time and the
    notes of system prompts are this bench's)."""

    def __init__(self, dir: str, answer_s: float):
        super().__init__(dir, 1, 1.0 / answer_s)
        self.answer_s = answer_s
        self.client: httpx2.AsyncClient | None = None   # one, kept: a probe's notes are read at once

    def start(self) -> None:
        argv = [sys.executable, os.path.abspath(__file__), "--serve-provider", str(self.port),
                str(self.answer_s)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=child_env(), start_new_session=True)

    async def take(self) -> list[Note]:
        """What it served since the last call."""
        if self.client is None:
            self.client = httpx2.AsyncClient()
        r = await self.client.get(f"http://{HOST}:{self.port}/bench/log", timeout=30)
        r.raise_for_status()
        return [Note(*row) for row in r.json()]

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None


class Notes:
    """The provider's notes, gathered: probes running at once each find their own."""

    def __init__(self, provider: SkillsProvider):
        self.provider = provider
        self.held: dict[str, Note] = {}
        self._lock = asyncio.Lock()

    async def _pull(self) -> None:
        async with self._lock:
            for note in await self.provider.take():
                self.held[note.tag] = note

    async def of(self, tag: str, wait: float = 5.0) -> Note:
        deadline = time.monotonic() + wait
        while True:
            note = self.held.pop(tag, None)
            if note is not None:
                return note
            if time.monotonic() > deadline:
                raise BenchError(f"the provider has no note of request {tag!r}")
            await self._pull()
            if tag not in self.held:
                await asyncio.sleep(0.01)

    async def take(self) -> dict[str, Note]:
        await self._pull()
        out, self.held = self.held, {}
        return out


class Prober:
    """Mail to one seat, one turn at a time; each turn's request as the provider saw it."""

    def __init__(self, mail: Mail, notes: Notes, seat: str, prefix: str):
        assert prefix.startswith(PROBE) and "-" not in prefix
        self.turn = mail.for_seats([seat])
        self.notes, self.seat, self.prefix, self.k = notes, seat, prefix, 0

    async def once(self) -> tuple[float, Note]:
        """(when its mail was published (wall clock), the note of its request)."""
        tag = f"{self.prefix}-0-{self.k}"
        self.k += 1
        sent = time.time()
        await self.turn(tag)
        return sent, await self.notes.of(tag)

    async def until(self, holds: Callable[[str], bool], timeout: float = PROBE_TIMEOUT
                    ) -> tuple[list[tuple[float, Note]], tuple[float, Note]]:
        """Probe until a request's system prompt *holds*: (every probe before it, that one),
        each probe as (its mail's publish, wall clock; its request's note)."""
        deadline = time.monotonic() + timeout
        before: list[tuple[float, Note]] = []
        while True:
            sent, note = await self.once()
            if holds(note.system or ""):
                return before, (sent, note)
            before.append((sent, note))
            if time.monotonic() > deadline:
                last = (note.system or "")[-300:]
                raise BenchError(f"seat {self.seat}: the prompt did not change within {timeout:g} s "
                                 f"({len(before)} probes; the last system prompt: {last!r})")


# --------------------------------------------------------------------------
# Skills (part 1's 200, part 2's changes)
# --------------------------------------------------------------------------

AREAS = ("invoice", "refund", "release", "incident", "onboarding", "contract", "payroll", "deploy", "backup",
         "ticket", "calendar", "expense", "vendor", "audit", "pricing", "churn", "roadmap", "hiring",
         "security", "inventory")
TASKS = ("triage", "review", "report", "reconcile", "escalation", "checklist", "summary", "handoff",
         "followup", "cleanup")


def skill_md(name: str, description: str, area: str, task: str) -> str:
    return f"""---
name: {name}
description: {json.dumps(description)}
license: Apache-2.0
metadata:
  version: "1.2"
  author: operations
---
# {area.capitalize()} {task}

Use this skill when someone asks for a {area} {task}, or when a {area} record arrives that
needs one. It is the way this team does it; deviations go to the channel first.

## Steps

1. Find the {area} records in question: search the wiki under `ops/{area}/` and the open tasks
   tagged `{area}`. Read the newest first; note each one's owner and status.
2. Check each against the policy page `policy/{area}` (limits, who approves, what is logged).
   Anything over a limit needs the approver named there before you go on.
3. Do the {task}: write what you found, what you changed and what is left, one line each.
4. Write the result to `ops/{area}/{task}-<date>` and link it from the task; tell the requester.

## Pitfalls

- Never close a {area} item another seat owns without asking it first.
- Amounts and dates are copied, never retyped. Quote the record's id.
- See `references/CHECKLIST.md` for the checks a reviewer will make.
"""


def checklist_md(area: str, task: str) -> str:
    return (f"# {area.capitalize()} {task}: checklist\n\n"
            + "".join(f"- [ ] {line}\n" for line in (
                f"every {area} record has an owner", "the policy's limits were checked",
                "the approver is named where one is needed", "the result page is linked from the task",
                "the requester was told")))


def make_skills(n: int) -> list[tuple[str, list[dict[str, str]]]]:
    """*n* skills (name, files), no two alike; every one applies to every seat (no crewlet-seats)."""
    out = []
    for i in range(n):
        area, task = AREAS[i % len(AREAS)], TASKS[(i // len(AREAS)) % len(TASKS)]
        lap = i // (len(AREAS) * len(TASKS))
        name = f"{area}-{task}" + (f"-{lap}" if lap else "")
        description = (f"{task.capitalize()} of {area} work: gathers the {area} records, checks them "
                       f"against the policy page and writes the result to the wiki. Use when a {area} "
                       f"{task} is asked for.")
        out.append((name, [{"path": "SKILL.md", "body": skill_md(name, description, area, task)},
                           {"path": "references/CHECKLIST.md", "body": checklist_md(area, task)}]))
    return out


async def publish_ops(js, ops: list[Any]) -> list[int]:
    """Publish *ops* to the estate's log, :data:`PUBLISH_WINDOW` at a time; their seqs."""
    seqs: list[int] = []
    for start in range(0, len(ops), PUBLISH_WINDOW):
        acks = await asyncio.gather(*(estate_log.publish(js, op, timeout=JS_TIMEOUT)
                                      for op in ops[start:start + PUBLISH_WINDOW]))
        seqs.extend(seq for seq, _ in acks)
    return seqs


# --------------------------------------------------------------------------
# Part 1: a turn's added cost with 200 skills beside none
# --------------------------------------------------------------------------

async def part_turns(provider: SkillsProvider, binary: str, args: argparse.Namespace, base: str,
                     out: dict[str, Any]) -> None:
    seats = [f"s{i}" for i in range(args.seats)]
    node = SlowNode(os.path.join(base, "n"), binary, seats, argparse.Namespace(
        max_concurrent=32, sweep=1.0, heartbeat=5.0, lease_ttl=15.0, providers=1), provider.base_url)
    node.STOP_GRACE = STOP_GRACE
    notes = Notes(provider)
    skills = make_skills(args.skills)
    listed = skill_format.prompt_list([skill_format.check(n, f) for n, f in skills], PROMPT_CHARS)
    out.update({"seats": len(seats), "skills": len(skills), "listed_chars": len(listed),
                "listed_skills": listed.count("\n- ") - ("- … and" in listed), "stage": "starting the node",
                "transitions": []})
    say(f"part 1: a node with {len(seats)} seats (broker :{node.stream_port}), {len(skills)} skills "
        f"({len(listed)} characters of prompt list), {args.rounds} pairs of rounds of {args.seconds:g} s")
    mail = nc = None
    try:
        node.start()
        out["held_seconds"], _ = await asyncio.to_thread(node.wait_seats, args.hold_timeout, [])
        procs = await asyncio.to_thread(node.processes)
        out["pids"] = {k: p.pid for k, p in procs.items()}
        metered = {**procs, "provider": provider.process(), "bench": psutil.Process()}
        mail = Mail(node.url)
        await mail.open()
        nc = await nats.connect(node.url, name="bench-skills", connect_timeout=2, allow_reconnect=False)
        js = nc.jetstream(timeout=JS_TIMEOUT)
        probe = Prober(mail, notes, seats[0], "p1")
        out["stage"] = "the first probe"
        await probe.until(lambda s: skill_format.PROMPT_HEADER not in s)
        state = False   # skills in the store
        rargs = argparse.Namespace(tokens=1, rate=1000.0 / args.answer_ms, ramp=args.ramp, ramp_timeout=120.0)
        for i in range(args.rounds):
            for side in (("none", "with") if i % 2 == 0 else ("with", "none")):
                want = side == "with"
                if want != state:
                    out["stage"] = f"round {i + 1}: {'writing' if want else 'retiring'} the skills"
                    t0 = time.monotonic()
                    if want:
                        ops = [make_op("skill.write", {"name": n, "files": f, "note": "bench"}, node="bench")
                               for n, f in skills]
                    else:
                        ops = [make_op("skill.retire", {"name": n}, node="bench") for n, _ in skills]
                    await publish_ops(js, ops)
                    acked = time.monotonic() - t0
                    before, _ = await probe.until((lambda s: listed in s) if want
                                                  else (lambda s: skill_format.PROMPT_HEADER not in s))
                    took = time.monotonic() - t0
                    out["transitions"].append({"to": side, "ops_acked_s": acked, "in_prompt_s": took,
                                               "probes": len(before) + 1})
                    say(f"  {len(ops)} {ops[0].kind} ops acked in {acked:.2f} s, "
                        f"the prompt {'full' if want else 'clear'} after {took:.2f} s")
                    state = want
                await asyncio.sleep(args.settle)
                await notes.take()   # forget the probes'
                out["stage"] = f"round {i + 1}, {side}"
                rnd = Round(side, len(seats), rargs, metered)
                r = await rnd.run(mail.for_seats(seats), f"r{i}{side[0]}", args.seconds)
                served = await notes.take()
                window = rnd.in_window()
                a = added(window, {t: (n.ms, False, n.size) for t, n in served.items()})
                a.pop("_raw", None)
                chars = [served[t].system_chars for t, *_ in window if t in served]
                r.update({"added_ms": a, "request_bytes": a["request_bytes"],
                          "system_chars": statistics.median(chars) if chars else None})
                out.setdefault(side, {"rounds": []})["rounds"].append(r)
                cpu = r["cpu_ms_per_turn"]
                say(f"  round {i + 1} {side}: {r['per_s']:.0f} turns/s, node CPU {cpu.get('node', 0):.2f} "
                    f"ms/turn (seats {cpu.get('seats') or 0:.2f}), request {r['request_bytes']} B, "
                    f"system prompt {r['system_chars']} chars")
        node.check_alive()
        out["stage"] = "done"
    finally:
        if mail is not None:
            await mail.close()
        if nc is not None:
            try:
                await asyncio.wait_for(nc.close(), 10)
            except Exception:
                pass
        out["log"] = node.problems()["counts"]
        out["node_stop_seconds"] = await asyncio.to_thread(node.stop)
    for side in ("none", "with"):
        rounds = (out.get(side) or {}).get("rounds") or []
        if not rounds:
            continue
        out[side].update({
            "per_s": statistics.median(r["per_s"] for r in rounds),
            "node_cpu_ms_per_turn": statistics.median(r["cpu_ms_per_turn"]["node"] for r in rounds),
            "seats_cpu_ms_per_turn": statistics.median(r["cpu_ms_per_turn"].get("seats") or 0.0
                                                       for r in rounds),
            "request_bytes": statistics.median(r["request_bytes"] for r in rounds if r["request_bytes"]),
            "system_chars": statistics.median(r["system_chars"] for r in rounds if r["system_chars"])})
    if out.get("none") and out.get("with"):
        w, n = out["with"], out["none"]
        out["ratio_node_cpu"] = ratio(w["node_cpu_ms_per_turn"], n["node_cpu_ms_per_turn"])
        out["ratio_seats_cpu"] = ratio(w["seats_cpu_ms_per_turn"], n["seats_cpu_ms_per_turn"])
        out["ratio_request_bytes"] = ratio(w["request_bytes"], n["request_bytes"])


# --------------------------------------------------------------------------
# Part 2: a changed skill's time to every node's next turn
# --------------------------------------------------------------------------

class FleetNode(Crewletd):
    STOP_GRACE = STOP_GRACE

    seats_stats = staticmethod(CrewletNode.seats_stats)


def fleet_company(base_url: str, seats: dict[str, str]) -> dict[str, Any]:
    return {"company": {"name": "bench-skills"},
            "providers": {"p": {"kind": "openai", "base_url": base_url, "model": MODEL}},
            "seats": [{"name": seat, "persona": PERSONA, "provider": "p",
                       "placement": {"labels": {"zone": zone}}} for seat, zone in seats.items()]}


def apply_company(node: Crewletd, path: str, timeout: float = 120.0) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "crewletctl")
    argv = [exe] if os.access(exe, os.X_OK) else [sys.executable, "-m", "supervisor.crewletctl"]
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(argv + ["-c", node.config_path, "apply", path], capture_output=True, text=True,
                              timeout=120, env=child_env())
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"crewletctl apply failed: {done.stderr[-500:]}")
        time.sleep(1.0)


def fleet_ready(nodes: list[FleetNode], seats: dict[str, str], timeout: float) -> float:
    """Until every seat is held by its node and every node's seats process works it; seconds."""
    t0 = time.monotonic()
    while True:
        for node in nodes:
            node.check_alive()
        st = nodes[0].status() or {}
        holders = {s["name"]: s.get("node") for s in (st.get("fleet") or {}).get("seats") or []}
        placed = all(holders.get(seat) == zone for seat, zone in seats.items())
        working = placed and all((n.seats_stats(n.status()).get("held") or 0) >= 1 for n in nodes)
        if working:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise BenchError(f"the fleet's seats not held within {timeout:g} s: {holders}")
        time.sleep(0.25)


async def bare_broadcast(url: str, n: int, subscribers: int) -> dict[str, Any]:
    """A bare core publish until *subscribers* connections have it, *n* times: ms."""
    pub = await nats.connect(url, name="bench-bare-pub", allow_reconnect=False)
    subs = [await nats.connect(url, name=f"bench-bare-sub{i}", allow_reconnect=False)
            for i in range(subscribers)]
    waiting: list[asyncio.Future] = []
    try:
        async def heard(msg) -> None:
            for fut in waiting:
                if not fut.done():
                    fut.set_result(time.perf_counter())
                    break
        for sub in subs:
            await sub.subscribe("bench.skills.changed", cb=heard)
            await sub.flush()
        times = []
        for i in range(n):
            loop = asyncio.get_running_loop()
            waiting[:] = [loop.create_future() for _ in subs]
            t = time.perf_counter()
            await pub.publish("bench.skills.changed", json.dumps({"names": [f"bare-{i}"], "seq": i}).encode())
            got = await asyncio.wait_for(asyncio.gather(*waiting), 10)
            times.append((max(got) - t) * 1000)
            await asyncio.sleep(0.005)
        return summary(times)
    finally:
        for c in [pub, *subs]:
            try:
                await asyncio.wait_for(c.close(), 5)
            except Exception:
                pass


async def part_fleet(provider: SkillsProvider, binary: str, args: argparse.Namespace, base: str,
                     out: dict[str, Any]) -> None:
    notes = Notes(provider)
    server = NatsServer(binary, os.path.join(base, "nats"), name="fleet")
    nodes: list[FleetNode] = []
    zones = [f"f{i}" for i in range(FLEET_NODES)]
    seats = {f"z{i}": zone for i, zone in enumerate(zones)}       # seat -> the node it is placed on
    out.update({"nodes": {zone: ("stateless (roles [seats])" if i == FLEET_NODES - 1 else "data (every role)")
                          for i, zone in enumerate(zones)}, "stage": "starting the broker", "changes": []})
    mail = nc = None
    try:
        server.start()
        await wait_jetstream(server.url)
        say(f"part 2: {FLEET_NODES} nodes on nats-server :{server.port} ({base})")
        out["stage"] = "starting the nodes"
        for i, zone in enumerate(zones):
            node_cfg: dict[str, Any] = {"id": zone, "labels": {"zone": zone}}
            if i == FLEET_NODES - 1:
                node_cfg["roles"] = ["seats"]
            node = FleetNode(os.path.join(base, zone), {
                "node": node_cfg, "fleet": FAST, "stream": {"type": "nats", "servers": [server.url]}})
            node.start()
            nodes.append(node)
        path = os.path.join(base, "company.yaml")
        with open(path, "w") as f:
            json.dump(fleet_company(provider.base_url, seats), f)
        out["stage"] = "applying the company"
        await asyncio.to_thread(apply_company, nodes[0], path)
        out["stage"] = "waiting for the seats"
        out["ready_seconds"] = await asyncio.to_thread(fleet_ready, nodes, seats, args.hold_timeout)
        mail = Mail(server.url)
        await mail.open()
        nc = await nats.connect(server.url, name="bench-skills", connect_timeout=2, allow_reconnect=False)
        js = nc.jetstream(timeout=JS_TIMEOUT)
        probers = {zone: Prober(mail, notes, seat, f"p2{zone}") for seat, zone in seats.items()}
        out["stage"] = "the first probes"
        await asyncio.gather(*(p.once() for p in probers.values()))
        resolution: list[float] = []   # a probe: its mail published -> its request at the provider
        cycle: list[float] = []        # one probe's request -> the next's, on one node
        for c in range(args.changes):
            out["stage"] = f"change {c + 1}"
            name = f"a{c:02d}-changed-{random.Random(SEED + c).randrange(16 ** 6):06x}"
            description = (f"Changed skill {c + 1}: what the bench wrote to see how soon every node's "
                           f"seats list it.")
            files = [{"path": "SKILL.md", "body": skill_md(name, description, "release", "review")}]
            skill_format.check(name, files)   # the applier would refuse it otherwise, and no prompt change
            op = make_op("skill.write", {"name": name, "files": files}, node="bench")
            t_pub = time.time()
            seq, _ = await estate_log.publish(js, op, timeout=JS_TIMEOUT)
            t_ack = time.time()
            mark = f"- {name}: "
            found = await asyncio.gather(*(p.until(lambda s: mark in s) for p in probers.values()))
            row: dict[str, Any] = {"skill": name, "seq": seq, "ack_ms": (t_ack - t_pub) * 1000, "nodes": {}}
            for zone, (before, (sent, first)) in zip(probers, found):
                probes = [*before, (sent, first)]
                resolution += [n.at - s for s, n in probes]
                cycle += [b[1].at - a[1].at for a, b in zip(probes, probes[1:])]
                row["nodes"][zone] = {"reached_s": first.at - t_ack,
                                      "not_yet_s": max((n.at - t_ack for _, n in before), default=None),
                                      "probes": len(before) + 1}
            row["max_s"] = max(n["reached_s"] for n in row["nodes"].values())
            row["max_not_yet_s"] = max((n["not_yet_s"] or 0.0) for n in row["nodes"].values())
            out["changes"].append(row)
            say(f"  change {c + 1} (seq {seq}): in the prompt after " + ", ".join(
                f"{z} {n['reached_s'] * 1000:.0f} ms ({n['probes']} probes)"
                for z, n in row["nodes"].items()))
            await asyncio.sleep(args.gap)
        for p in probers.values():   # the probe's own time, mail published -> request at the provider
            for _ in range(3):
                sent, note = await p.once()
                resolution.append(note.at - sent)
        out["probe_ms"] = summary([s * 1000 for s in resolution])
        out["probe_cycle_ms"] = summary([s * 1000 for s in cycle])
        out["stage"] = "the bare broadcast"
        out["bare_ms"] = await bare_broadcast(server.url, args.bare_messages, FLEET_NODES)
        for node in nodes:
            node.check_alive()
        out["stage"] = "done"
    finally:
        if mail is not None:
            await mail.close()
        if nc is not None:
            try:
                await asyncio.wait_for(nc.close(), 10)
            except Exception:
                pass
        out["log"] = {n.dir.rsplit("/", 1)[-1]: n.problems() for n in nodes}
        stops: list[Any] = [None] * len(nodes)

        def stop(i: int) -> None:
            stops[i] = nodes[i].stop()
        threads = [threading.Thread(target=stop, args=(i,)) for i in range(len(nodes))]
        for t in threads:
            t.start()
        for t in threads:
            await asyncio.to_thread(t.join)
        out["node_stop_seconds"] = stops
        server.stop()
    if out["changes"]:
        per_node = {z: summary([ch["nodes"][z]["reached_s"] * 1000 for ch in out["changes"]]) for z in zones}
        out["reached_ms"] = per_node
        out["max_ms"] = summary([ch["max_s"] * 1000 for ch in out["changes"]])
        out["max_not_yet_ms"] = summary([ch["max_not_yet_s"] * 1000 for ch in out["changes"]])
        out["ratio_vs_bare"] = ratio(out["max_ms"]["median"], (out.get("bare_ms") or {}).get("median"))


# --------------------------------------------------------------------------
# Part 3: a learning pass over 100,000 episodes
# --------------------------------------------------------------------------

TOOLS = ("crm_lookup", "refund_issue", "page_write", "page_read", "task_create", "search", "http_get",
         "mail_send", "calendar_add", "invoice_create", "ticket_update", "deploy_run", "git_log", "sql_query")
VERBS = ("refund", "review", "schedule", "draft", "update", "close", "escalate", "reconcile", "summarise",
         "deploy", "invite", "renew", "audit", "archive", "price")
NOUNS = ("invoice", "order", "contract", "release", "ticket", "meeting", "payment", "account", "report",
         "customer", "vendor", "budget", "license", "incident", "roadmap", "shipment", "refund", "policy",
         "backup", "quote", "subscription", "forecast", "campaign", "survey", "warranty")
OPENERS = ("please", "can you", "could you", "need to", "", "asap:", "when you can,")
SYLLABLES = ("ka", "lo", "mi", "ne", "ra", "to", "vi", "su", "pe", "da", "go", "ri", "ba", "fe", "zu", "shi",
             "tor", "len", "mar", "quin")


def episodes(n: int, seed: int = SEED) -> list[dict[str, Any]]:
    """*n* synthetic episode rows (as ``episode.scan`` answers them), from *seed*."""
    rng = random.Random(seed)
    vocab = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(5000)})
    seat_names = [f"seat{i:02d}" for i in range(40)]
    counterparties = ([f"person:p{i}" for i in range(120)] + [f"seat:seat{i:02d}" for i in range(40)]
                      + [f"hook:gh{i}" for i in range(20)] + [f"conversation:c{i}" for i in range(19)]
                      + ["operator"])
    tool_sets = []
    while len(tool_sets) < 30:
        ts = sorted(rng.sample(TOOLS, rng.randint(1, 3)))
        if ts not in tool_sets:
            tool_sets.append(ts)
    topics = [(rng.choice(VERBS), *rng.sample(NOUNS, 2), *rng.sample(vocab, 2), rng.choice(tool_sets))
              for _ in range(300)]
    weights = [1.0 / (i + 1) ** 0.8 for i in range(len(topics))]   # some topics far commoner than others
    rows, seq, at = [], 1000, 1_760_000_000.0
    for i in range(n):
        seq += rng.randint(1, 5)
        at += rng.random() * 3
        seat, who = rng.choice(seat_names), rng.choice(counterparties)
        roll = rng.random()
        if roll < 0.03:   # noise: nothing like any other
            words = rng.sample(vocab, 6)
            ask, summary_ = " ".join(words[:4]), f"answered {' '.join(words[4:])}"
            tools = rng.choice(tool_sets)
        else:
            verb, n1, n2, w1, w2, tools = rng.choices(topics, weights)[0]
            keys = [verb, n1, n2, w1, w2]
            if rng.random() < 0.3:
                keys.remove(rng.choice(keys[1:]))
            fillers = " ".join(rng.sample(vocab, rng.randint(0, 2)))
            ask = f"{rng.choice(OPENERS)} {' '.join(keys)} {fillers} #{rng.randint(1, 99999)}".strip()
            summary_ = f"{verb}d the {n1} {n2} for {w1}, {rng.choice(('done', 'sent', 'filed', 'noted'))}"
            if roll < 0.06:
                tools = rng.choice(tool_sets)
        used = list(tools) + ([tools[0]] if rng.random() < 0.2 else [])
        rng.shuffle(used)
        rows.append({"seat": seat, "trigger": f"t{i}", "counterparty": who, "ask": ask,
                     "tools": list(dict.fromkeys(used)),
                     "outcome": "done" if rng.random() < 0.95 else "failed",
                     "summary": summary_, "seq": seq, "at": at, "compacted": 0})
    return rows


def plain_grouping(rows: list[dict[str, Any]], stop: frozenset[str], similar: float,
                   min_cluster: int) -> list[list[int]]:
    """The plain script: a dict of lists by tool set, each row joined to the first group
    whose first row is at least *similar* (Jaccard of the words), groups of *min_cluster*
    rows or more kept, as lists of seqs."""
    word = re.compile(r"[^\W_]+")
    by_tools: dict[tuple[str, ...], list[tuple[int, set[str]]]] = {}
    for r in rows:
        tools = tuple(sorted(set(r["tools"])))
        if not tools:
            continue
        words = {w for w in word.findall(f"{r['ask']}\n{r['summary']}".lower())
                 if len(w) > 1 and not w.isdigit() and w not in stop}
        by_tools.setdefault(tools, []).append((r["seq"], words))
    found = []
    for members in by_tools.values():
        groups: list[tuple[set[str], list[int]]] = []
        for seq, words in members:
            if not words:
                continue
            for first, seqs in groups:
                shared = len(words & first)
                if shared >= similar * (len(words) + len(first) - shared):
                    seqs.append(seq)
                    break
            else:
                groups.append((words, [seq]))
        found += [seqs for _, seqs in groups if len(seqs) >= min_cluster]
    return found


def traced(fn: Callable[[], Any]) -> tuple[Any, int]:
    """fn() under tracemalloc: (its result, the peak bytes allocated meanwhile)."""
    gc.collect()
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def part_learning(args: argparse.Namespace, out: dict[str, Any]) -> None:
    try:
        from crewlet.learning import cluster as clustering
    except ImportError as exc:
        out["error"] = f"crewlet.learning.cluster is not importable here: {exc}"
        say(f"part 3: not run ({out['error']})")
        return
    out["stage"] = "making the rows"
    t0 = time.perf_counter()
    rows, rows_bytes = traced(lambda: episodes(args.episodes))
    out.update({"episodes": len(rows), "rows_made_s": time.perf_counter() - t0, "rows_bytes": rows_bytes,
                "similar": clustering.SIMILAR, "min_cluster": clustering.MIN_CLUSTER})
    say(f"part 3: {len(rows)} episodes ({rows_bytes / 2 ** 20:.0f} MB traced), "
        f"{args.learning_rounds} timed rounds a side")
    sides: dict[str, Callable[[], Any]] = {
        "crewlet": lambda: clustering.cluster(rows),
        "plain": lambda: plain_grouping(rows, clustering.STOP, clustering.SIMILAR, clustering.MIN_CLUSTER)}
    results: dict[str, Any] = {}
    for i in range(args.learning_rounds):
        for name in (("crewlet", "plain") if i % 2 == 0 else ("plain", "crewlet")):
            out["stage"] = f"round {i + 1}, {name}"
            gc.collect()
            t = time.perf_counter()
            results[name] = sides[name]()
            took = time.perf_counter() - t
            out.setdefault(name, {"seconds": []})["seconds"].append(took)
            say(f"  round {i + 1} {name}: {took:.2f} s")
    for name, fn in sides.items():
        out["stage"] = f"{name} under tracemalloc"
        _, peak = traced(fn)
        side = out[name]
        side.update({"median_s": statistics.median(side["seconds"]), "peak_bytes": peak})
        say(f"  {name}: peak {peak / 2 ** 20:.1f} MB")
    mine = {frozenset(c.episodes) for c in results["crewlet"]}
    theirs = {frozenset(g) for g in results["plain"]}
    out["crewlet"].update({"clusters": len(mine), "clustered": sum(map(len, mine))})
    out["plain"].update({"clusters": len(theirs), "clustered": sum(map(len, theirs))})
    out["same_clusters"] = len(mine & theirs)
    out["ratio_time"] = ratio(out["crewlet"]["median_s"], out["plain"]["median_s"])
    out["ratio_peak"] = ratio(out["crewlet"]["peak_bytes"], out["plain"]["peak_bytes"])
    out["stage"] = "done"


# --------------------------------------------------------------------------
# The run, the report
# --------------------------------------------------------------------------

async def run_nodes(binary: str, args: argparse.Namespace, report: dict[str, Any]) -> None:
    base = tempfile.mkdtemp(prefix="cwsk", dir="/tmp")
    provider = SkillsProvider(base, args.answer_ms / 1000)
    failed = False
    try:
        provider.start()
        await provider.wait()
        for part, fn, key in ((1, part_turns, "turns"), (2, part_fleet, "fleet")):
            if part not in args.parts:
                continue
            out = report[key] = {}
            try:
                await fn(provider, binary, args, os.path.join(base, key), out)
            except Exception as exc:   # a part that broke is reported, and the next one runs
                failed = True
                out["error"] = f"while {out.get('stage')}: " + (
                    str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}")
                say(f"  FAILED {out['error']}")
    finally:
        await provider.close()
        provider.stop()
        if args.keep or failed:
            report["kept"] = base
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def _f(v: Any, spec: str = ".2f", unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{spec}}{unit}"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f}"


def _mb(n: int | None, spec: str) -> str:
    return "n/a" if n is None else f"{n / 2 ** 20:{spec}}"


def _s(s: dict[str, Any] | None, spec: str = ".0f") -> str:
    if not s or not s.get("n"):
        return "n/a"
    return f"{s['median']:{spec}} / {s['p95']:{spec}} / {s['max']:{spec}}"


def print_text(rep: dict[str, Any]) -> None:
    cfg = rep["config"]
    print(f"crewlet skills benchmark  (python {cfg['python']}, {cfg['cpus']} cpus, nats-server "
          f"{cfg['nats_server']}, nats-py {cfg['nats_py']}; the fake provider answers in "
          f"{cfg['answer_ms']:g} ms)")
    t = rep.get("turns")
    if t is not None:
        print()
        print(f"1. a turn's cost with {t.get('skills')} skills beside none ({t.get('seats')} seats in "
              f"closed loops, {cfg['rounds']} ABBA pairs of {cfg['seconds']:g} s windows; the prompt lists "
              f"{t.get('listed_skills')} of them in {t.get('listed_chars')} chars)")
        if t.get("error"):
            print(f"   FAILED {t['error']}")
        print(f"   {'':6} {'turns/s':>8} {'node CPU ms/turn':>17} {'seats ms/turn':>14} {'request B':>10} "
              f"{'system chars':>13}")
        for side in ("none", "with"):
            s = t.get(side) or {}
            print(f"   {side:6} {_f(s.get('per_s'), '8.1f')} {_f(s.get('node_cpu_ms_per_turn'), '17.2f')} "
                  f"{_f(s.get('seats_cpu_ms_per_turn'), '14.2f')} {_f(s.get('request_bytes'), '10.0f')} "
                  f"{_f(s.get('system_chars'), '13.0f')}")
        print(f"   with / none: node CPU {_f(t.get('ratio_node_cpu'))}x (target <= {TARGET_RATIO:g}x), "
              f"seats process {_f(t.get('ratio_seats_cpu'))}x, request {_f(t.get('ratio_request_bytes'))}x")
        for side in ("none", "with"):
            rounds = (t.get(side) or {}).get("rounds") or []
            if rounds:
                print(f"   rounds {side}: " + "; ".join(
                    f"{r['per_s']:.0f}/s {r['cpu_ms_per_turn']['node']:.2f} ms" for r in rounds))
        for tr in t.get("transitions") or []:
            full = tr["to"] == "with"
            print(f"   skills {'written' if full else 'retired'}: ops acked in {tr['ops_acked_s']:.2f} s, "
                  f"the prompt {'full' if full else 'clear'} after {tr['in_prompt_s']:.2f} s")
        if t.get("log"):
            print("   node log warnings/errors: "
                  + ", ".join(f"{k} x{v}" for k, v in list(t["log"].items())[:8]))
    f = rep.get("fleet")
    if f is not None:
        print()
        nodes = f.get("nodes") or {}
        print(f"2. a changed skill -> every node's next turn ({len(nodes)} nodes on one nats-server: "
              + ", ".join(f"{z} {k}" for z, k in nodes.items()) + f"; {len(f.get('changes') or [])} changes)")
        if f.get("error"):
            print(f"   FAILED {f['error']}")
        print("   ms from the write's ack to the first request naming it, median / p95 / max:")
        for z, s in (f.get("reached_ms") or {}).items():
            print(f"     {z}: {_s(s)}")
        print(f"     every node (max over nodes): {_s(f.get('max_ms'))}  "
              f"(target <= {TARGET_REACH_S * 1000:.0f} ms); its lower bound (the last request not naming "
              f"it): {_s(f.get('max_not_yet_ms'))}")
        print(f"   bare core publish -> all {FLEET_NODES} subscribers, ms: {_s(f.get('bare_ms'), '.3f')};  "
              f"x (median) {_f(f.get('ratio_vs_bare'), '.0f')}")
        print(f"   a probe's own time (mail published -> its request at the provider), ms: "
              f"{_s(f.get('probe_ms'))}; one probe's request -> the next's: {_s(f.get('probe_cycle_ms'))}")
        for ch in f.get("changes") or []:
            print(f"   {ch['skill']} (seq {ch['seq']}, ack {ch['ack_ms']:.1f} ms): " + ", ".join(
                f"{z} {n['reached_s'] * 1000:.0f} ms (not yet at {_ms(n['not_yet_s'])}, {n['probes']} probes)"
                for z, n in ch["nodes"].items()))
        for z, lg in (f.get("log") or {}).items():
            if lg.get("counts"):
                print(f"   {z} log warnings/errors: "
                      + ", ".join(f"{k} x{v}" for k, v in list(lg["counts"].items())[:6]))
    lp = rep.get("learning")
    if lp is not None:
        print()
        print(f"3. a learning pass over {lp.get('episodes')} episodes "
              f"(rows: {_mb(lp.get('rows_bytes'), '.0f')} MB; Jaccard >= {lp.get('similar')}, "
              f"clusters of >= {lp.get('min_cluster')})")
        if lp.get("error"):
            print(f"   NOT RUN: {lp['error']}")
        else:
            print(f"   {'':28} {'s (median)':>10} {'peak MB':>8} {'clusters':>9} {'episodes in them':>17}")
            for name, label in (("crewlet", "crewlet.learning.cluster"), ("plain", "plain script (leader)")):
                s = lp.get(name) or {}
                print(f"   {label:28} {_f(s.get('median_s'), '10.2f')} {_mb(s.get('peak_bytes'), '8.1f')} "
                      f"{_f(s.get('clusters'), '9d')} {_f(s.get('clustered'), '17d')}")
            print(f"   crewlet / plain: time {_f(lp.get('ratio_time'))}x, "
                  f"peak memory {_f(lp.get('ratio_peak'))}x; "
                  f"clusters with the very same episodes: {lp.get('same_clusters')}")
    if rep.get("kept"):
        print(f"\nkept: {rep['kept']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-provider"]:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops us, by pid
        serve_provider(int(argv[1]), float(argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="1,2,3", help="which parts to run, comma separated (default 1,2,3)")
    ap.add_argument("--seats", type=int, default=4, help="part 1: seats driven in closed loops (default 4)")
    ap.add_argument("--skills", type=int, default=200, help="part 1: skills in the store (default 200)")
    ap.add_argument("--rounds", type=int, default=2, help="part 1: ABBA pairs of rounds (default 2)")
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="part 1: a round's steady window, s (default 10)")
    ap.add_argument("--ramp", type=float, default=2.0, help="part 1: s before a round's window (default 2)")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="part 1: s between the prompt showing a change and the round (default 2)")
    ap.add_argument("--answer-ms", type=float, default=ANSWER_MS,
                    help=f"the fake provider's answer time, ms (default {ANSWER_MS:g})")
    ap.add_argument("--changes", type=int, default=5,
                    help="part 2: skills changed, one after another (default 5)")
    ap.add_argument("--gap", type=float, default=1.0, help="part 2: s between two changes (default 1)")
    ap.add_argument("--bare-messages", type=int, default=BARE_MESSAGES,
                    help=f"part 2: bare broadcasts timed (default {BARE_MESSAGES})")
    ap.add_argument("--episodes", type=int, default=100_000, help="part 3: episode rows (default 100,000)")
    ap.add_argument("--learning-rounds", type=int, default=2, help="part 3: timed runs a side (default 2)")
    ap.add_argument("--hold-timeout", type=float, default=180.0, help="s a node may take to hold its seats")
    ap.add_argument("--nats-server", help="the nats-server binary (default: as crewlet finds it)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (a failed run keeps its own)")
    add_smoke(ap, argv, {"seats": 2, "skills": 10, "rounds": 1, "seconds": 1.0, "ramp": 0.3, "settle": 0.2,
                         "changes": 1, "gap": 0.1, "bare_messages": 20, "episodes": 2000,
                         "learning_rounds": 1})
    args = ap.parse_args(argv)
    try:
        args.parts = {int(p) for p in args.parts.split(",") if p.strip()}
    except ValueError:
        ap.error("--parts: numbers among 1,2,3, comma separated")
    counts = (args.seats, args.skills, args.rounds, args.changes, args.episodes, args.learning_rounds)
    if not args.parts <= {1, 2, 3} or min(counts) < 1 or args.seconds <= 0 or args.answer_ms <= 0:
        ap.error("--parts among 1,2,3; --seats, --skills, --rounds, --changes, --episodes >= 1; "
                 "--seconds, --answer-ms > 0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        binary = find_nats_server(args.nats_server)
    except BenchError as exc:
        print(f"bench/skills.py: {exc}", file=sys.stderr)
        return 1
    report: dict[str, Any] = {
        "targets": {"ratio_node_cpu": TARGET_RATIO, "reach_s": TARGET_REACH_S},
        "config": {"parts": sorted(args.parts), "seats": args.seats, "skills": args.skills,
                   "rounds": args.rounds, "seconds": args.seconds, "answer_ms": args.answer_ms,
                   "changes": args.changes, "episodes": args.episodes, "nats_server": server_version(binary),
                   "nats_py": NATS_PY_VERSION, "python": sys.version.split()[0], "cpus": os.cpu_count()}}
    if args.parts & {1, 2}:
        asyncio.run(run_nodes(binary, args, report))
    if 3 in args.parts:
        report["learning"] = {}
        part_learning(args, report["learning"])
    return emit(report, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
