"""Chaos (issue 10): a three-node fleet at work while its processes are killed.

Three real crewletd nodes run every role; their embedded brokers are the
members of one JetStream cluster (``stream.replicas: 3``), at the fleet
timings of the other fleet tests (heartbeat 3 s, lease TTL 10 s, sweep
0.5 s, ack wait 20 s). A company of six worker seats uses the scripted
provider: mail ``job N`` makes one call to the ``effect`` tool of the seat's
own MCP server (tests/integration/mcp_server.py ``--effects``), which naps,
appends a line ``job N`` to a file this test owns (the external side effect)
and naps again, so a kill may land before or after the effect.

While ``JOBS`` jobs are sent at ``RATE`` a second with ``crewletctl send
--trigger job-N`` (to whichever node answers; a send crewletctl reports
accepted is accepted work), a fault thread:

- SIGKILLs a random role child (seats, data_applier, workers, ingress) of a
  random node that is up, every 1-3 s;
- SIGKILLs one member's broker once, a quarter of the way in: the one that
  leads the ``ledger`` bucket's stream, so turns finishing then meet a
  leader election;
- kills one whole node (``kill -9`` of its process tree) half-way, and starts
  it again ``NODE_DOWN_FOR`` seconds later with the same config and data dir.

A sampler reads the ``leases`` bucket (direct gets of the known keys: no
consumer, so the sampler adds nothing to the broker's state) several times a
second and records who holds each seat. A holder is *live* while its
crewletd runs and its lease is of that crewletd's boot (a killed node's boot
is dead for good, its restart has another).

When the load is over the test waits (with a deadline) for every job to be
done, then checks (every check below is computed and printed, then all
failures are reported together):

- **lost** — every accepted job's side effect is in the file;
- **ledger** — every job has its entry in the ``ledger`` bucket (key = its
  trigger), written once (the bucket keeps one value per key, so the count
  of writes is its stream's last sequence: it must equal the count of keys),
  exactly one ``done`` turn record, and the two name the same node and
  token. Turn records are read from the estate's ``turns`` table, not from
  custody's batches on EVENTS (limits retention, each batch kept by one data
  node only, a record sent again kept again), while the ``turn.record`` op is the durable
  row every data node's copy holds, deduplicated per delivery by its op id;
- **duplicate side effects** — each extra effect of a job must be excused by
  a distinct interruption of the job's seat on the node that made the
  earlier effect, between the two effects: a kill of that node's seats
  child, of its broker (its roles restart after it: rest_for_one), of the
  whole node, or a release of the seat by that node (a hand-over cuts the
  turn in hand short). One interruption excuses at most one duplicate per
  seat the node held when it happened;
- **dead letters** — none (the DLQ stream is empty; ``crewletctl dlq``);
- **copies** — every node's estate copy at the log's last sequence, with the
  same digest;
- **unheld seats** — no seat without a live holder for longer than the lease
  TTL + 2 sweeps + ``UNHELD_MARGIN`` (measured from the last sample that saw
  it held to the next, so an upper bound by one sample interval);
- **job latency** — no job waits from its accepted send to its ledger entry
  longer than the ack wait + one mailbox poll (roles/seats/turns.py ``POLL``,
  with its jitter) + ``LATENCY_MARGIN``;
- **SIGTERM** — stopped one after another, every node exits 0 within its
  shutdown time (the sum of its children's shutdown timeouts: they stop in
  turn), and logs no crashed or killed child while stopping;
- **orphans** — no process of the fleet is left: none of the processes seen
  in the nodes' trees, none marked ``CREWLET_SPAWNED_BY`` with one of the
  nodes' marks, none whose command line names this test's directory.

``-s`` shows a summary line (``chaos summary: ...``). ``CREWLET_CHAOS_SEED``
fixes the fault schedule's random choices; ``CREWLET_CHAOS_KEEP=<dir>`` keeps
the node logs, the effects file and a JSON report there.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import queue
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import nats
import psutil
import pytest
import yaml

from crewlet.coord.buckets import last
from crewlet.estate import store
from tests.conftest import wait_for
from tests.estate import copy_of
from tests.fleet.test_cluster import make_members, start_alone
from tests.seats import MCP_SERVER, ctl, ctl_json, node_url

pytestmark = [pytest.mark.fleet, pytest.mark.chaos]

IDS = ("ca", "cb", "cc")
FLEET = {"heartbeat": 3, "lease_ttl": 10, "sweep": 0.5, "ack_wait": 20}
# Kills every 1-3 s over three nodes: up to ~15 restarts in a period on one
# node's supervisors by bad luck. The test is about the fleet, not restart
# intensity (tests/integration has that): give it room.
SUPERVISOR = {"intensity": 100, "period": 30}
SEATS = tuple(f"w{i}" for i in range(6))
JOBS = 210
RATE = 3.0                      # jobs sent per second (70 s of load: the suite runs beside it)
NAP_BEFORE, NAP_AFTER = 0.1, 0.3  # the effect tool's naps around its append
CHILDREN = ("seats", "data_applier", "workers", "ingress")
KILL_EVERY = (1.0, 3.0)         # seconds between random role-child kills
BROKER_KILL_AT = 0.25           # of the load's duration
NODE_KILL_AT = 0.5
NODE_DOWN_FOR = 10.0
SENDERS = 5                     # threads running crewletctl send (each send starts a process)
SEND_TIMEOUT = 20.0             # one crewletctl send
SEND_WITHIN = 60.0              # a job not accepted by then is given up (and reported)
SAMPLE_EVERY = 0.3
UNHELD_MARGIN = 5.0
LATENCY_MARGIN = 10.0
STOP_MARGIN = 5.0
CONVERGE_WITHIN = 30.0
ORPHANS_WITHIN = 10.0
TIMEOUT = 300                   # the whole test, seconds


# --------------------------------------------------------------------- records

@dataclass
class Kill:
    t: float                    # wall clock
    kind: str                   # seats | data_applier | workers | ingress | broker | node
    node: str
    pid: int | None
    seats: list[str]            # seats the node held (leases) around the kill
    running: int | None = None  # turns the node's seats child reported running (stats lag ~1 s)


@dataclass
class Job:
    n: int
    seat: str
    trigger: str
    scheduled: float = 0.0
    accepted_at: float | None = None   # wall clock, start of the accepted crewletctl send
    accepted_by: str | None = None
    attempts: list[tuple[str, int | None, float, str]] = field(default_factory=list)


@dataclass
class Effect:
    n: int
    node: str
    seat: str
    pid: int
    t: float


class Chaos:
    """What the threads share: the nodes, their state, and everything recorded."""

    def __init__(self, nodes: dict[str, Any], effects: str, seed: int):
        self.nodes = nodes
        self.effects = effects
        self.seed = seed
        self.rnd = random.Random(seed)
        self.lock = threading.Lock()
        self.down: set[str] = set()       # crewletd not running
        self.starting: set[str] = set()   # restarted, not every child running yet
        self.dead_boots: set[str] = set()
        self.boots: dict[str, str] = {}   # node -> boot, from its presence lease
        self.owners: dict[str, str] = {}  # seat -> node of its lease, live or not (last sample)
        self.samples: list[tuple[float, dict[str, tuple[str, str]]]] = []
        self.kills: list[Kill] = []
        self.notes: list[str] = []        # what the harness saw that is worth saying
        self.procs: set[tuple[int, float]] = set()  # (pid, create time) seen in the trees
        self.marks: set[str] = set()      # CREWLET_SPAWNED_BY values seen in the trees
        self.consumers: list[tuple[float, int]] = []  # KV_leases consumer count over time
        self.stop = threading.Event()
        self.load_over = threading.Event()

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.append(f"{time.time():.3f} {text}")

    def up(self) -> list[str]:
        with self.lock:
            return [n for n in self.nodes if n not in self.down and n not in self.starting]

    def held_by(self, node: str, around: float) -> list[str]:
        """Seats whose lease named *node* in any sample within 2 s before *around*."""
        with self.lock:
            seats = {seat for t, states in self.samples if around - 2.0 <= t <= around + 0.5
                     for seat, (_, owner) in states.items() if owner == node}
            seats |= {seat for seat, owner in self.owners.items() if owner == node}
        return sorted(seats)


# --------------------------------------------------------------------- the company

def company_file(dir: str, effects: str) -> str:
    # The effects file is the one host path the seats' confined servers may
    # write (crewlet.sandbox): made first, writable by each seat's own uid.
    fd = os.open(effects, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    os.close(fd)
    os.chmod(effects, 0o666)
    seats = [{"name": seat, "persona": "a worker", "provider": "p",
              "sandbox": {"read_write": [effects]},
              "mcp": [{"name": "fx", "command": sys.executable, "args": [MCP_SERVER, "--effects"]}]}
             for seat in SEATS]
    company = {"company": {"name": "chaos"},
               "providers": {"p": {"kind": "scripted", "rules": [{
                   "match": r"^job (\d+)$", "reply": r"finished \1: {tools}",
                   "tools": [{"name": "fx__effect", "args": {
                       "path": effects, "text": r"job \1",
                       "nap_before": NAP_BEFORE, "nap_after": NAP_AFTER}}]}]}},
               "seats": seats}
    path = os.path.join(dir, "company.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(company, f, sort_keys=False)
    return path


def apply_company(node, path: str, within: float = 60.0) -> int:
    """``crewletctl apply``, again until it takes (issue 10: the first apply
    after a fleet starts may meet a cluster that cannot place the bucket yet);
    returns the tries it took."""
    deadline = time.monotonic() + within
    tries = 0
    while True:
        out = ctl(node, "apply", path, timeout=60)
        tries += 1
        if out.returncode == 0:
            return tries
        assert time.monotonic() < deadline, f"apply failed {tries} times, last: {out.stderr}"
        time.sleep(1.0)


def read_effects(path: str) -> list[Effect]:
    """The side effects so far: ``job N<TAB>node<TAB>seat<TAB>pid<TAB>time`` lines."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                if not line.endswith("\n"):
                    continue  # not written whole yet (one write each: it will be)
                text, node, seat, pid, t = line.rstrip("\n").split("\t")
                out.append(Effect(int(text.split()[1]), node, seat, int(pid), float(t)))
    except FileNotFoundError:
        pass
    return out


def job_of(trigger: Any) -> int | None:
    """N of trigger ``job-N``; None for any other."""
    head, _, n = str(trigger).partition("-")
    return int(n) if head == "job" and n.isdigit() else None


def mark_of(node) -> str:
    """The CREWLET_SPAWNED_BY mark of *node*'s seats role (roles/seats)."""
    return f"{node.config['node']['id']}/seats/{hashlib.sha1(node.run_dir.encode()).hexdigest()[:8]}"


def turns_rows(node) -> list[dict]:
    copy = copy_of(node)
    if copy is None:
        return []
    return [store.unpack(v) for _, v in store.dump(copy, ("turns",))["turns"]]


# --------------------------------------------------------------------- the sampler

async def _sample(chaos: Chaos) -> None:
    urls = [node_url(n) for n in chaos.nodes.values()]

    async def quiet(*_a, **_k):
        return None
    nc = await nats.connect(servers=urls, connect_timeout=2, reconnect_time_wait=0.2,
                            max_reconnect_attempts=-1, error_cb=quiet, disconnected_cb=quiet,
                            reconnected_cb=quiet, closed_cb=quiet)
    js = nc.jetstream(timeout=1.0)
    keys = [f"seat.{s}" for s in SEATS] + [f"node.{n}" for n in chaos.nodes]
    beat = 0
    try:
        while not chaos.stop.is_set():
            started = time.monotonic()
            got = await asyncio.gather(*(last(js, "leases", k) for k in keys), return_exceptions=True)
            now = time.time()
            leases: dict[str, dict | None | BaseException] = {}
            for key, result in zip(keys, got):
                if isinstance(result, BaseException):
                    leases[key] = result
                    continue
                try:
                    leases[key] = json.loads(result[1]) if result[1] else None
                except ValueError:
                    leases[key] = None
            states: dict[str, tuple[str, str]] = {}
            with chaos.lock:
                for n in chaos.nodes:
                    value = leases[f"node.{n}"]
                    if isinstance(value, dict) and value.get("boot"):
                        chaos.boots[n] = value["boot"]
                for seat in SEATS:
                    value = leases[f"seat.{seat}"]
                    if isinstance(value, BaseException):
                        states[seat] = ("unknown", "")
                    elif not isinstance(value, dict):
                        states[seat] = ("unheld", "")
                        chaos.owners.pop(seat, None)
                    else:
                        owner = value.get("node", "")
                        chaos.owners[seat] = owner
                        live = (owner in chaos.nodes and owner not in chaos.down
                                and value.get("boot") not in chaos.dead_boots)
                        states[seat] = ("held" if live else "dead", owner)
                chaos.samples.append((now, states))
            beat += 1
            if beat % 3 == 0:  # about once a second: every process of the trees
                for node in chaos.nodes.values():
                    for pid in node.tree_pids():
                        try:
                            proc = psutil.Process(pid)
                            chaos.procs.add((pid, proc.create_time()))
                            mark = proc.environ().get("CREWLET_SPAWNED_BY")
                            if mark:
                                chaos.marks.add(mark)
                        except psutil.Error:
                            pass
            if beat % 30 == 0:  # about every 10 s: the consumers of the leases bucket
                try:
                    info = await js.stream_info("KV_leases")
                    chaos.consumers.append((now, info.state.consumer_count))
                except Exception:
                    pass
            await asyncio.sleep(max(0.0, SAMPLE_EVERY - (time.monotonic() - started)))
    finally:
        await nc.close()


def sampler(chaos: Chaos) -> None:
    try:
        asyncio.run(_sample(chaos))
    except BaseException as exc:  # the test fails on a sampler that died (no samples)
        chaos.note(f"sampler died: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------- faults

def _status(node) -> dict | None:
    try:
        return node.status(timeout=1.0)
    except Exception:
        return None


def _all_running(node) -> bool:
    st = _status(node)
    return bool(st and st["node"]["ready"] and all(c["state"] == "running" for c in st["children"]))


def kill_child(chaos: Chaos, node_id: str, kinds: tuple[str, ...]) -> Kill | None:
    node = chaos.nodes[node_id]
    st = _status(node)
    if not st:
        return None
    me = st["node"]["pid"]
    kids = {c["name"]: c for c in st["children"]
            if c["name"] in kinds and c["pid"] and c["pid"] != me and c["state"] == "running"}
    if not kids:
        return None
    name = chaos.rnd.choice(sorted(kids))
    pid = kids[name]["pid"]
    running = _running(st)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    now = time.time()
    kill = Kill(now, name, node_id, pid, chaos.held_by(node_id, now), running)
    with chaos.lock:
        chaos.kills.append(kill)
    return kill


def _running(st: dict | None) -> int | None:
    """The turns the seats child last said it was running (its stats come each second)."""
    for c in (st or {}).get("children", []):
        if c["name"] == "seats":
            return (c.get("stats") or {}).get("running")
    return None


def kill_node(chaos: Chaos, node_id: str) -> Kill:
    node = chaos.nodes[node_id]
    running = _running(_status(node))
    with chaos.lock:
        chaos.down.add(node_id)
        boot = chaos.boots.get(node_id)
        if boot:
            chaos.dead_boots.add(boot)
    old = node.proc
    now = time.time()
    node.kill_tree()
    kill = Kill(now, "node", node_id, old.pid if old else None, chaos.held_by(node_id, now), running)
    with chaos.lock:
        chaos.kills.append(kill)
    if not boot:
        chaos.note(f"no presence boot known for {node_id} when it was killed")
    if old is not None:
        try:
            old.wait(10)
        except subprocess.TimeoutExpired:
            chaos.note(f"{node_id}'s killed crewletd {old.pid} not reaped in 10 s")
    return kill


async def _leaders(url: str) -> dict[str, str | None]:
    """The leader of each stream whose election a turn's writes wait out."""
    nc = await nats.connect(url, connect_timeout=2)
    try:
        js = nc.jetstream(timeout=2)
        out = {}
        for name in ("KV_ledger", "ESTATE", "AGENTS", "KV_leases"):
            try:
                out[name] = (await js.stream_info(name)).cluster.leader
            except Exception:
                out[name] = None
        return out
    finally:
        await nc.close()


def broker_victim_of(chaos: Chaos) -> str:
    """The node whose broker leads the ``ledger`` bucket's stream (a turn's
    ledger write then meets a leader election, issue 10's third defect);
    a random node if that cannot be told."""
    up = chaos.up()
    try:
        leaders = _run(_leaders(node_url(chaos.nodes[up[0]])), 10)
    except Exception as exc:
        chaos.note(f"stream leaders unknown ({type(exc).__name__}: {exc}): a random broker killed")
        return chaos.rnd.choice(up)
    chaos.note(f"stream leaders before the broker kill: {leaders}")
    return leaders["KV_ledger"] if leaders.get("KV_ledger") in up else chaos.rnd.choice(up)


def faults(chaos: Chaos, load_start: float, load_secs: float) -> None:
    """The fault schedule; runs until the load is over and the fleet is whole again."""
    rnd = chaos.rnd
    broker_at = load_start + BROKER_KILL_AT * load_secs
    node_at = load_start + NODE_KILL_AT * load_secs
    next_child = load_start + rnd.uniform(*KILL_EVERY)
    broker_victim: str | None = None
    broker_pid: int | None = None
    node_victim: str | None = None
    restart_at: float | None = None
    restarted_at: float | None = None
    try:
        while not chaos.stop.is_set():
            now = time.monotonic()
            over = chaos.load_over.is_set() or now > load_start + load_secs
            if broker_victim is not None and broker_pid is not None:
                # The broker's node counts as whole once its broker runs again:
                # no node is killed while two members might be down.
                kids = chaos.nodes[broker_victim].children()
                if kids.get("broker", {}).get("state") == "running" and kids["broker"]["pid"] != broker_pid:
                    broker_pid = None
            if restart_at is not None and now >= restart_at:
                chaos.nodes[node_victim].start(wait_ready=False)
                with chaos.lock:
                    chaos.down.discard(node_victim)
                    chaos.starting.add(node_victim)
                restart_at, restarted_at = None, now
            if restarted_at is not None:
                if _all_running(chaos.nodes[node_victim]):
                    with chaos.lock:
                        chaos.starting.discard(node_victim)
                    chaos.note(f"{node_victim} restarted and running after {now - restarted_at:.1f}s")
                    restarted_at = None
                elif now - restarted_at > 90:
                    chaos.note(f"{node_victim} restarted but not all its children running after 90 s")
                    with chaos.lock:
                        chaos.starting.discard(node_victim)
                    restarted_at = None
            whole = restart_at is None and restarted_at is None and not chaos.down and not chaos.starting
            if over:
                if whole:
                    return
                time.sleep(0.2)
                continue
            if broker_victim is None and now >= broker_at:
                broker_victim = broker_victim_of(chaos)
                kill = kill_child(chaos, broker_victim, ("broker",))
                broker_pid = kill.pid if kill else None
                if kill is None:
                    chaos.note(f"could not kill {broker_victim}'s broker")
            elif node_victim is None and now >= node_at and broker_pid is None and whole:
                node_victim = rnd.choice(chaos.up())
                kill_node(chaos, node_victim)
                restart_at = time.monotonic() + NODE_DOWN_FOR
            elif now >= next_child:
                up = chaos.up()
                if up:
                    kill_child(chaos, rnd.choice(up), CHILDREN)
                next_child = now + rnd.uniform(*KILL_EVERY)
            time.sleep(0.05)
    except BaseException as exc:
        chaos.note(f"fault thread died: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------- load

def send_job(chaos: Chaos, job: Job) -> None:
    ids = list(chaos.nodes)
    order = [ids[(job.n + k) % len(ids)] for k in range(len(ids))]
    deadline = time.monotonic() + SEND_WITHIN
    while time.monotonic() < deadline:
        for node_id in order:
            if node_id in chaos.down:
                continue
            started = time.time()
            try:
                out = ctl(chaos.nodes[node_id], "send", job.seat, f"job {job.n}", "--trigger", job.trigger,
                          "--json", timeout=SEND_TIMEOUT)
                rc, err = out.returncode, out.stderr.strip()[-200:]
            except subprocess.TimeoutExpired:
                rc, err = None, f"crewletctl send took over {SEND_TIMEOUT}s"
            job.attempts.append((node_id, rc, round(time.time() - started, 3), err))
            if rc == 0:
                job.accepted_at, job.accepted_by = started, node_id
                return
            time.sleep(0.2)
        time.sleep(0.5)


def sender(chaos: Chaos, jobs: "queue.Queue[Job]") -> None:
    while not chaos.stop.is_set():
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            return
        pause = job.scheduled - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        send_job(chaos, job)


# --------------------------------------------------------------------- reading the outcome

async def _ledger(url: str, triggers: list[str]) -> tuple[dict[str, dict | None], dict[str, int]]:
    nc = await nats.connect(url, connect_timeout=2)
    try:
        js = nc.jetstream(timeout=5)
        limit = asyncio.Semaphore(32)

        async def one(trigger: str):
            async with limit:
                for attempt in range(5):
                    try:
                        _, data = await last(js, "ledger", trigger, leader=True)
                        return json.loads(data) if data else None
                    except Exception:
                        if attempt == 4:
                            raise
                        await asyncio.sleep(0.5)
        entries = await asyncio.gather(*(one(t) for t in triggers))
        info = await js.stream_info("KV_ledger", subjects_filter="$KV.ledger.>")
        subjects = dict(info.state.subjects or {})
        # Every write is a message: with one value kept per key, the stream's
        # last sequence counts the writes ever made (no TTL ran out: 15 days).
        subjects["writes"] = info.state.last_seq
        return dict(zip(triggers, entries)), subjects
    finally:
        await nc.close()


async def _stream_facts(url: str) -> dict[str, Any]:
    nc = await nats.connect(url, connect_timeout=2)
    try:
        js = nc.jetstream(timeout=5)
        facts: dict[str, Any] = {}
        for info in await js.streams_info():
            facts[info.config.name] = {"messages": info.state.messages,
                                       "consumers": info.state.consumer_count,
                                       "last_seq": info.state.last_seq}
        return facts
    finally:
        await nc.close()


def _run(coro, within: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, within))


def pending_jobs(chaos: Chaos, jobs: list[Job], done: set[int], url: str, copy_node) -> set[int]:
    """Accepted jobs not yet done: side effect, ledger entry and done record all there."""
    effects = {e.n for e in read_effects(chaos.effects)}
    records = {job_of(r.get("trigger")) for r in turns_rows(copy_node) if r.get("outcome") == "done"}
    candidates = [j for j in jobs if j.accepted_at and j.n not in done and j.n in effects and j.n in records]
    if candidates:
        entries, _ = _run(_ledger(url, [j.trigger for j in candidates]))
        done |= {j.n for j in candidates if entries.get(j.trigger)}
    return {j.n for j in jobs if j.accepted_at} - done


def unheld_spans(samples, since: float, until: float) -> tuple[list[dict], float]:
    """Per seat, the stretches without a live holder: from the last sample that
    saw it held to the next that did. Also the longest stretch of unknown reads."""
    spans = []
    worst_unknown = 0.0
    until = min(until, max((t for t, _ in samples), default=until))
    for seat in SEATS:
        last_held: float | None = None
        gap_from: float | None = None
        gap_why: tuple[str, str] | None = None
        unknown_from: float | None = None
        for t, states in samples:
            if t < since or t > until:
                continue
            state, owner = states.get(seat, ("unknown", ""))
            if state == "unknown":
                unknown_from = t if unknown_from is None else unknown_from
                continue
            if unknown_from is not None:
                worst_unknown = max(worst_unknown, t - unknown_from)
                unknown_from = None
            if state == "held":
                if gap_from is not None:
                    spans.append({"seat": seat, "from": gap_from, "to": t, "secs": round(t - gap_from, 2),
                                  "was": gap_why, "then": owner})
                    gap_from = None
                last_held = t
            elif gap_from is None:
                gap_from = last_held if last_held is not None else t
                gap_why = (state, owner)
        if gap_from is not None:  # still unheld at the end
            spans.append({"seat": seat, "from": gap_from, "to": None, "secs": round(until - gap_from, 2),
                          "was": gap_why, "then": None})
    return spans, worst_unknown


def excuse_duplicates(jobs: dict[int, Job], effects: list[Effect], kills: list[Kill],
                      releases: list[dict]) -> tuple[int, list[dict], list[dict]]:
    """Match every extra side effect of a job to an interruption of its seat on
    the node that made the effect before it; each (interruption, seat) once.
    Returns the duplicates, those excused, and those not."""
    interruptions = [(k.t, k.node, k.kind, tuple(k.seats)) for k in kills
                     if k.kind in ("seats", "broker", "node")]
    interruptions += [(r["ts"], r["node"], "release", (r["seat"],)) for r in releases]
    interruptions.sort()
    used: set[tuple[int, str]] = set()
    by_job: dict[int, list[Effect]] = defaultdict(list)
    for e in effects:
        by_job[e.n].append(e)
    duplicates = 0
    excused, unexcused = [], []
    pairs = []
    for n, lines in by_job.items():
        lines.sort(key=lambda e: e.t)
        for before, after in zip(lines, lines[1:]):
            pairs.append((after.t, n, before, after))
    for _, n, before, after in sorted(pairs, key=lambda p: p[0]):
        duplicates += 1
        seat = jobs[n].seat if n in jobs else before.seat
        found = None
        for i, (t, node, kind, seats) in enumerate(interruptions):
            if (i, seat) in used or node != before.node or seat not in seats:
                continue
            if before.t - 1.0 <= t <= after.t + 0.5:
                found = i
                break
        row = {"job": n, "seat": seat, "first": (before.node, before.t), "again": (after.node, after.t)}
        if found is None:
            unexcused.append(row)
        else:
            used.add((found, seat))
            row["by"] = interruptions[found][2:3] + (interruptions[found][0],)
            excused.append(row)
    return duplicates, excused, unexcused


def stop_events(node, since: float) -> list[dict]:
    """What a node logged while stopping that a clean stop does not."""
    bad = []
    for ev in node.events():
        if ev.get("ts", 0) < since:
            continue
        name = ev.get("event")
        if name in ("role_crashed", "shutdown_timeout", "task_stop_overdue") or (
                name in ("child_stopped", "child_exited")
                and (ev.get("code") not in (0, None) or ev.get("signal"))):
            bad.append({k: ev.get(k) for k in ("ts", "node", "role", "event", "child", "code", "signal",
                                                "reason", "error") if ev.get(k) is not None})
    return bad


def job_events(nodes, triggers: set[str], limit: int = 30) -> list[dict]:
    """The node logs' lines about *triggers* (for a failure's message)."""
    out = []
    for node in nodes:
        for ev in node.events():
            if ev.get("trigger") in triggers:
                out.append({k: ev.get(k) for k in ("ts", "node", "role", "event", "seat", "trigger",
                                                    "outcome", "error") if ev.get(k) is not None})
    out.sort(key=lambda e: e.get("ts", 0))
    return out[:limit]


def warnings_seen(nodes) -> Counter:
    """Counts of the warning and error events in every node's log."""
    seen: Counter = Counter()
    for node in nodes:
        for ev in node.events():
            if ev.get("level") in ("warning", "error"):
                seen[ev.get("event")] += 1
    return seen


def find_orphans(chaos: Chaos, marks: set[str], root: str) -> list[dict]:
    found = {}
    for pid, created in chaos.procs:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                found[pid] = {"pid": pid, "why": "in a node's tree", "cmd": " ".join(p.cmdline())[:160]}
        except psutil.Error:
            pass
    for p in psutil.process_iter():
        try:
            if p.pid == os.getpid() or p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline())
            if root in cmd:
                found.setdefault(p.pid, {"pid": p.pid, "why": "names the test's dir", "cmd": cmd[:160]})
                continue
            mark = p.environ().get("CREWLET_SPAWNED_BY")
            if mark in marks:
                found.setdefault(p.pid, {"pid": p.pid, "why": f"marked {mark}", "cmd": cmd[:160]})
        except psutil.Error:
            continue
    return sorted(found.values(), key=lambda o: o["pid"])


def keep(chaos: Chaos, nodes, report: dict) -> None:
    dest = os.environ.get("CREWLET_CHAOS_KEEP")
    if not dest:
        return
    os.makedirs(dest, exist_ok=True)
    for node in nodes:
        if os.path.exists(node.log_path):
            shutil.copy(node.log_path, os.path.join(dest, f"{node.config['node']['id']}.log"))
    if os.path.exists(chaos.effects):
        shutil.copy(chaos.effects, os.path.join(dest, "effects.log"))
    with open(os.path.join(dest, "report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)


# --------------------------------------------------------------------- the test

@pytest.mark.timeout(TIMEOUT)
def test_a_fleet_under_chaos_loses_nothing_and_works_each_job_once(make_node, short_tmp):
    began = time.monotonic()
    seed = int(os.environ.get("CREWLET_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
    nodes, _ = make_members(make_node, ids=IDS, cluster="chaos", fleet=FLEET, supervisor=SUPERVISOR)
    by_id = {n.config["node"]["id"]: n for n in nodes}
    effects = os.path.join(short_tmp, "effects.log")
    chaos = Chaos(by_id, effects, seed)
    for node in nodes:
        start_alone(node)
    for node in nodes:
        node.wait_running(timeout=60)
    wait_for(lambda: len(((nodes[0].status() or {}).get("fleet") or {}).get("nodes") or []) == 3, 60,
             interval=0.2, what="three nodes in the fleet")
    applies = apply_company(nodes[0], company_file(short_tmp, effects))

    threads = [threading.Thread(target=sampler, args=(chaos,), name="sampler", daemon=True)]
    threads[0].start()

    def all_held() -> bool:
        with chaos.lock:
            if not chaos.samples:
                return False
            states = chaos.samples[-1][1]
        owners = {owner for state, owner in states.values() if state == "held"}
        return all(states.get(s, ("",))[0] == "held" for s in SEATS) and owners == set(IDS)
    wait_for(all_held, 90, interval=0.2, what="every seat held, by every node")
    ready_at = time.monotonic() - began

    # ---- load and faults
    load_secs = JOBS / RATE
    load_start = time.monotonic()
    load_wall = time.time()
    jobs = [Job(n, SEATS[n % len(SEATS)], f"job-{n}", scheduled=load_start + n / RATE) for n in range(JOBS)]
    todo: "queue.Queue[Job]" = queue.Queue()
    for job in jobs:
        todo.put(job)
    senders = [threading.Thread(target=sender, args=(chaos, todo), name=f"sender{i}", daemon=True)
               for i in range(SENDERS)]
    fault = threading.Thread(target=faults, args=(chaos, load_start, load_secs), name="faults", daemon=True)
    for t in senders + [fault]:
        t.start()
    threads += senders + [fault]
    settle_secs = None
    try:
        for t in senders:
            t.join(load_secs + SEND_WITHIN + 30)
        chaos.load_over.set()
        fault.join(120)
        assert not fault.is_alive(), "the fault thread did not end"
        load_done = time.monotonic()
        last_send = max((j.accepted_at or 0) for j in jobs)

        # ---- settle: every accepted job done (effect, ledger entry, done record)
        try:
            from roles.seats import turns as turns_module
            poll = getattr(turns_module, "POLL", 60.0) * 1.2  # with its jitter
        except Exception as exc:  # the product mid-change: the design's minute
            chaos.note(f"roles.seats.turns not importable ({exc}): a poll of 72 s assumed")
            poll = 72.0
        latency_bound = FLEET["ack_wait"] + poll + LATENCY_MARGIN
        # Within the latency bound of the last send, and leaving the checks and
        # the stop their time.
        settle_by = min(time.monotonic() + max(5.0, latency_bound - (time.time() - last_send)),
                        began + TIMEOUT - 120)
        url = node_url(nodes[0])
        done: set[int] = set()
        while True:
            try:
                left = pending_jobs(chaos, jobs, done, url, nodes[0])
            except Exception as exc:  # a broker read timed out: look again
                chaos.note(f"settle read failed: {type(exc).__name__}: {exc}")
                left = {-1}
            if not left:
                settle_secs = time.monotonic() - load_done
                break
            if time.monotonic() > settle_by:
                break
            time.sleep(1.0)

        # ---- copies: every copy at the log's end, the same digest
        converged: dict[str, Any] = {"seq": None, "applied": {}, "digests": {}}
        deadline = time.monotonic() + CONVERGE_WITHIN
        while time.monotonic() < deadline:
            try:
                end = _run(_stream_facts(url))["ESTATE"]["last_seq"]
            except Exception as exc:  # a broker read timed out: look again
                chaos.note(f"convergence read failed: {type(exc).__name__}: {exc}")
                time.sleep(0.5)
                continue
            applied = {i: (copy_of(n).applied() if copy_of(n) else 0) for i, n in by_id.items()}
            converged = {"seq": end, "applied": applied, "digests": {}}
            if all(a == end for a in applied.values()):
                converged["digests"] = {i: store.digest(copy_of(n)) for i, n in by_id.items()}
                if len(set(converged["digests"].values())) == 1 \
                        and _run(_stream_facts(url))["ESTATE"]["last_seq"] == end:
                    break
            time.sleep(0.5)
    finally:
        chaos.load_over.set()
        chaos.stop.set()
        for t in threads:
            t.join(10)

    # ---- what landed
    accepted = [j for j in jobs if j.accepted_at]
    found = read_effects(effects)
    per_job = Counter(e.n for e in found)
    entries, ledger_subjects = _run(_ledger(url, [j.trigger for j in jobs]))
    ledger_writes = ledger_subjects.pop("writes")
    rows = turns_rows(nodes[0])
    done_records: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("outcome") == "done":
            done_records[r.get("trigger")].append(r)
    outcomes = Counter(r.get("outcome") for r in rows)
    try:
        dlq = ctl_json(nodes[0], "dlq", "--json").get("dead_letters") or []
    except Exception as exc:
        dlq = [f"crewletctl dlq failed: {type(exc).__name__}: {exc}"]
    try:
        seat_rows = [{k: r.get(k) for k in ("seat", "owner", "pending", "in_flight", "dead_letters")}
                     for r in (ctl_json(nodes[0], "seats", "--json").get("seats") or [])]
    except Exception as exc:
        seat_rows = [f"crewletctl seats failed: {type(exc).__name__}: {exc}"]
    facts = _run(_stream_facts(url))

    # ---- SIGTERM, one node after another (the last stops without a quorum)
    s = nodes[0].config["supervisor"]
    stop_bound = (s["shutdown_timeout"] * (len(CHILDREN) + 1)  # the roles, then the fleet task
                  + s["broker_shutdown_timeout"] + STOP_MARGIN)
    stops = []
    stop_began = time.time()
    for node in reversed(nodes):
        t0 = time.time()
        node.proc.send_signal(signal.SIGTERM)
        try:
            rc = node.proc.wait(stop_bound)
        except subprocess.TimeoutExpired:
            rc = None
            node.kill_all()
        stops.append({"node": node.config["node"]["id"], "rc": rc, "secs": round(time.time() - t0, 1),
                      "unclean": stop_events(node, t0)})

    # ---- orphans
    marks = {mark_of(n) for n in nodes} | chaos.marks
    orphans: list[dict] = []
    deadline = time.monotonic() + ORPHANS_WITHIN
    while True:
        orphans = find_orphans(chaos, marks, short_tmp)
        if not orphans or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for o in orphans:  # leave nothing behind, whatever the verdict
        try:
            os.kill(o["pid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    # ---- the verdicts (times in seconds since the load began)
    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - load_wall, 1)

    jobs_by_n = {j.n: j for j in jobs}
    lost = sorted(j.n for j in accepted if per_job[j.n] == 0)
    no_ledger = sorted(j.n for j in accepted if not entries.get(j.trigger))
    not_one_done = {j.n: len(done_records.get(j.trigger, [])) for j in accepted
                    if len(done_records.get(j.trigger, [])) != 1}
    mismatched = sorted(j.n for j in accepted if entries.get(j.trigger) and len(done_records.get(j.trigger, [])) == 1
                        and (entries[j.trigger].get("node"), entries[j.trigger].get("token"))
                        != (done_records[j.trigger][0]["node"], done_records[j.trigger][0]["token"]))
    triggers = {j.trigger for j in jobs}
    stray = sorted(k for k in ledger_subjects if k.removeprefix("$KV.ledger.") not in triggers)
    releases = [ev for n in nodes for ev in n.events()
                if ev.get("event") == "seat_released" and load_wall <= ev.get("ts", 0) < stop_began]
    duplicates, excused, unexcused = excuse_duplicates(jobs_by_n, found, chaos.kills, releases)
    for row in excused + unexcused:
        row["first"] = (row["first"][0], rel(row["first"][1]))
        row["again"] = (row["again"][0], rel(row["again"][1]))
        if "by" in row:
            row["by"] = (row["by"][0], rel(row["by"][1]))
    unheld_bound = FLEET["lease_ttl"] + 2 * FLEET["sweep"] + UNHELD_MARGIN
    spans, worst_unknown = unheld_spans(chaos.samples, load_wall, stop_began)
    for sp in spans:
        sp["from"], sp["to"] = rel(sp["from"]), rel(sp["to"])
    too_long = [sp for sp in spans if sp["secs"] > unheld_bound]
    max_unheld = max((sp["secs"] for sp in spans), default=0.0)
    latencies = {}
    for j in accepted:
        # Done: its ledger entry written, else its done record's end.
        entry = entries.get(j.trigger) or {}
        records = done_records.get(j.trigger) or [{}]
        at = entry.get("at") or (records[0].get("started_at", 0) + records[0].get("took_ms", 0) / 1000
                                 if records[0] else None)
        if at:
            latencies[j.n] = max(0.0, at - j.accepted_at)
    slow = {n: round(lat, 1) for n, lat in latencies.items() if lat > latency_bound}
    slow.update({j.n: None for j in accepted if j.n not in latencies})
    kinds = Counter(k.kind for k in chaos.kills)
    interrupting = sum(1 for k in chaos.kills if k.kind in ("seats", "broker", "node"))
    bad_stops = [st for st in stops if st["rc"] != 0]
    unclean = [st for st in stops if st["unclean"]]
    lat_sorted = sorted(latencies.values())
    consumers = [c for _, c in chaos.consumers]
    big_kills = [(rel(k.t), k.kind, k.node, k.seats) for k in chaos.kills if k.kind in ("node", "broker")]
    summary = (
        f"chaos summary: seed={seed} ready={ready_at:.0f}s applies={applies} jobs={JOBS} "
        f"accepted={len(accepted)} send_retries={sum(len(j.attempts) - 1 for j in accepted)} "
        f"kills={dict(sorted(kinds.items()))} at {big_kills} "
        f"(seats child mid-turn≈{sum(1 for k in chaos.kills if k.kind == 'seats' and k.running)}) "
        f"releases={len(releases)} effects={len(found)} duplicates={duplicates} "
        f"(excused {len(excused)}, unexcused {len(unexcused)}; interrupting kills {interrupting}) "
        f"lost={len(lost)} ledger: keys={len(ledger_subjects)} writes={ledger_writes} missing={len(no_ledger)} "
        f"turn records={dict(outcomes)} not_one_done={len(not_one_done)} dlq={len(dlq)} "
        f"max_unheld={max_unheld:.1f}s (bound {unheld_bound:g}s, {len(too_long)} over) "
        f"unknown_reads_max={worst_unknown:.1f}s "
        f"latency max={max(lat_sorted, default=0):.1f}s p50={statistics.median(lat_sorted) if lat_sorted else 0:.1f}s "
        f"(bound {latency_bound:g}s) settle={'%.1fs' % settle_secs if settle_secs is not None else 'NOT SETTLED'} "
        f"copies={converged['applied']} log={converged['seq']} digests={len(set(converged['digests'].values()))} "
        f"stops={[(st['node'], st['rc'], st['secs']) for st in stops]} (bound {stop_bound:g}s) "
        f"orphans={len(orphans)} KV_leases consumers first/max/last="
        f"{consumers[:1] + [max(consumers, default=0)] + consumers[-1:]} "
        f"total={time.monotonic() - began:.0f}s")
    print("\n" + summary)
    for note in chaos.notes:
        print("  note:", note)
    report = {"summary": summary, "notes": chaos.notes, "load_wall": load_wall,
              "kills": [{**asdict(k), "at": rel(k.t)} for k in chaos.kills],
              "spans": spans, "stops": stops, "orphans": orphans, "facts": facts, "seats": seat_rows,
              "excused": excused, "unexcused": unexcused, "slow": slow, "lost": lost,
              "no_ledger": no_ledger, "not_one_done": not_one_done, "consumers": chaos.consumers,
              "jobs": [asdict(j) for j in jobs if len(j.attempts) > 1 or not j.accepted_at]}
    keep(chaos, nodes, report)

    failures = []
    if not chaos.samples:
        failures.append("harness: the sampler recorded nothing")
    if kinds["node"] != 1 or kinds["broker"] != 1:
        failures.append(f"harness: the fault schedule did not run whole: kills {dict(kinds)}; "
                        f"notes {chaos.notes}")
    if len(accepted) != JOBS:
        failures.append(f"load: {JOBS - len(accepted)} of {JOBS} jobs never accepted by any node: "
                        f"{[(j.n, j.attempts[-3:]) for j in jobs if not j.accepted_at][:5]}")
    if lost:
        failures.append(f"lost: {len(lost)} of {len(accepted)} accepted jobs without their side effect "
                        f"(not worked by the end of the wait): {lost[:20]}; seats then: {seat_rows}; "
                        f"log lines of the first: {job_events(nodes, {f'job-{n}' for n in lost[:5]})}")
    if no_ledger or not_one_done or mismatched or stray or ledger_writes != len(ledger_subjects):
        failures.append(
            f"ledger: {len(no_ledger)} of {len(accepted)} jobs without a ledger entry {no_ledger[:20]}; "
            f"{len(not_one_done)} without exactly one done turn record (job: records) "
            f"{dict(list(not_one_done.items())[:20])}; {len(mismatched)} whose entry and record name "
            f"another node or token {mismatched[:10]}; {len(stray)} ledger keys of no job {stray[:5]}; "
            f"{ledger_writes} ledger writes for {len(ledger_subjects)} keys; log lines of the first: "
            f"{job_events(nodes, {f'job-{n}' for n in (no_ledger + list(not_one_done))[:5]})}")
    if unexcused:
        failures.append(f"duplicate side effects: {duplicates} duplicates, {len(unexcused)} not excused by an "
                        f"interruption of the seat on the node that made the effect before "
                        f"(kills {dict(kinds)}, releases {len(releases)}): {unexcused[:10]}")
    if dlq or facts.get("DLQ", {}).get("messages"):
        failures.append(f"dead letters: {len(dlq)} listed, {facts.get('DLQ', {}).get('messages')} in the "
                        f"DLQ stream: {dlq[:5]}")
    if not converged["digests"] or len(set(converged["digests"].values())) != 1 \
            or any(a != converged["seq"] for a in converged["applied"].values()):
        failures.append(f"copies: not equal at the log's end {converged['seq']} within {CONVERGE_WITHIN:g}s: "
                        f"applied {converged['applied']}, digests {converged['digests']}")
    if too_long:
        failures.append(f"unheld seats: {len(too_long)} stretches over {unheld_bound:g}s "
                        f"(longest {max_unheld:.1f}s; 'to' None: still unheld at the end): {too_long[:10]}; "
                        f"node and broker kills: {big_kills}")
    if slow:
        failures.append(f"job latency: {len(slow)} of {len(accepted)} jobs took over {latency_bound:g}s "
                        f"from send to ledger entry (None: not done): {dict(list(slow.items())[:20])}")
    if bad_stops:
        failures.append(f"SIGTERM: {len(bad_stops)} of {len(stops)} nodes did not exit 0 within "
                        f"{stop_bound:g}s (rc None: killed): {bad_stops}")
    if unclean:
        failures.append(f"SIGTERM: {len(unclean)} of {len(stops)} nodes stopped uncleanly: {unclean}")
    if orphans:
        failures.append(f"orphans: {len(orphans)} processes of the fleet left (killed now): {orphans[:10]}")
    if failures:
        warned = warnings_seen(nodes)
        failures.append(f"(warnings and errors logged by the nodes: {dict(warned.most_common(25))})")
        pytest.fail("\n".join([summary, *failures]), pytrace=False)
