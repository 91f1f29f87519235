"""No 5xx while the fleet re-forms (issue 29): three R3 members, a run
streaming through one of them, then a member's fault — the RUNS stream
leader's broker killed alone, a node frozen whole (SIGSTOP), a node killed
whole (SIGKILL, crewletd and every process under it).

For a bounded window after each fault a client hits every read route of
the API, the live feed and the run's stream resume (``Last-Event-ID``) on
the surviving nodes in a loop, and another client follows the run to its
end. Every answer is a success, a 4xx, or a 503 with ``Retry-After`` and a
``code`` — never a 500 (nor another 5xx); no node logs
``api_internal_error`` nor anything at error level from its ingress; and
the followed stream ends with exactly one ``run.completed``, every event
once and in order. How long the 503s lasted after each fault is printed
(``pytest -s``).

One fleet serves the three faults, in file order: the broker's node
restarts its broker by itself, the frozen one is thawed (SIGCONT) and waited
for, and the killed one is last, so nothing is restarted after it. The node
frozen or killed is the seat's holder and the run's driver (both move); the
broker killed is on the third node, whose roles restart with it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx2
import pytest

from crewlet import tokens
from crewlet.bus import JETSTREAM_TIMEOUT
from crewlet.objects.nats import PATIENCE as OBJECT_PATIENCE
from roles.ingress.api.common import READ_PATIENCE
from tests.conftest import Nodes, wait_for
from tests.fleet.test_cluster import make_members
from tests.fleet.test_fleet import apply
from tests.integration.test_conversations import _blocks
from tests.seats import held, node_url, read_nats, write_company

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(420)]

IDS = ("ra", "rb", "rc")
FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
TERMINAL = ("run.completed", "run.failed", "run.interrupted")
# Seconds the loop goes on after a fault: at least WINDOW_MIN (past the
# ~5-6 s of an election, and the broker's restart), then until the followed
# run has ended and no 503 came for QUIET seconds; WINDOW_MAX at most.
WINDOW_MIN = 12.0
WINDOW_MAX = 30.0
QUIET = 3.0
# Seconds a read may take (its ride through an election included) before it
# counts as a client left waiting: the API's reads ride one out for
# common.READ_PATIENCE, each try waiting JETSTREAM_TIMEOUT at most; a
# download, for the file store's own patience (crewlet.objects.nats).
READ_BOUND = READ_PATIENCE + 2 * JETSTREAM_TIMEOUT
DOWNLOAD_BOUND = OBJECT_PATIENCE + 2 * JETSTREAM_TIMEOUT
DOWNLOAD = "/v1/files/{project}/{path}"
READYZ = "/readyz"
COMPANY = r"""
company: {name: Reform}
providers:
  scripted:
    kind: scripted
    rules:
      - match: '(?i)slowly (.+)'
        reply: 'one two three four five six seven eight nine ten eleven twelve thirteen fourteen \1'
        pace: 0.3
      - match: '.*'
        reply: 'Heard you.'
seats:
  - {name: ceo, persona: You answer., provider: scripted}
"""


class Client:
    """One node's API, as a client reaches it (its own connection pool)."""

    def __init__(self, node):
        self.node = node
        self.id = node.config["node"]["id"]
        token = tokens.read_admin_token(node.run_dir)
        self.http = httpx2.Client(base_url=f"http://{node.config['ingress']['listen']}", timeout=20,
                                  trust_env=False, headers={"Authorization": f"Bearer {token}"})

    def ok(self, method: str, path: str, status: int = 200, **kw) -> dict:
        r = self.http.request(method, path, **kw)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        return r.json()

    def close(self) -> None:
        self.http.close()


@dataclass
class Fleet:
    nodes: list
    made: Nodes
    task: str = ""
    page: str = "reform/notes"
    file: str = "site/reform.txt"


@pytest.fixture(scope="module")
def fleet():
    made = Nodes()
    try:
        nodes, _ = make_members(made, ids=IDS, cluster="reform", fleet=FAST, conversations={"lease_ttl": 3},
                                sessions={"sweep": 0.5})
        for node in nodes:
            node.start(wait_ready=False)
        for node in nodes:
            node.wait_running(timeout=90)
        apply(nodes[0], write_company(made.dir, COMPANY, "reform.yaml"))
        f = Fleet(nodes, made)
        settle(f)
        # Something for every read route to find.
        c = Client(nodes[0])
        try:
            f.task = c.ok("POST", "/v1/tasks", 201, json={"title": "reform"})["task"]["id"]
            c.ok("PUT", f"/v1/pages/{f.page}", 201, json={"title": "Notes", "body": "the fleet re-forms"})
            r = c.http.put(f"/v1/files/{f.file}", content=b"kept through faults")
            assert r.status_code in (200, 201), r.text
        finally:
            c.close()
        yield f
    finally:
        made.close()


# ---------------------------------------------------------------- the fleet whole again

def _streams_whole(node) -> bool:
    """Every stream of the fleet has a leader and two current replicas."""
    async def check(nc, js):
        for info in await js.streams_info():
            cluster = info.cluster
            if cluster is None or not cluster.leader:
                return False
            replicas = cluster.replicas or []
            if len(replicas) != 2 or not all(p.current and not p.offline for p in replicas):
                return False
        return True
    try:
        return read_nats(node_url(node), check)
    except Exception:
        return False


def settle(f: Fleet) -> None:
    """Wait until the fleet is whole: every node running and ready, every
    stream led and replicated, the seat held, the company at each ingress."""
    for node in f.nodes:
        node.wait_running(timeout=90)
    wait_for(lambda: _streams_whole(f.nodes[0]), 90, interval=0.3, what="every stream led, replicas current")
    wait_for(lambda: "ceo" in held(f.nodes[0]), 60, what="the seat held")
    for node in f.nodes:
        c = Client(node)
        try:
            wait_for(lambda: c.http.get("/readyz").status_code == 200, 60, interval=0.2,
                     what=f"{c.id} ready")
            wait_for(lambda: c.http.get("/v1/company").json().get("rev"), 30, what="the company at ingress")
        finally:
            c.close()


def runs_leader(f: Fleet) -> str:
    """The node whose broker leads the RUNS stream."""
    async def leader(nc, js):
        return (await js.stream_info("RUNS")).cluster.leader
    return wait_for(lambda: read_nats(node_url(f.nodes[0]), leader), 20, what="the RUNS leader")


def lead_runs_from(f: Fleet, node_id: str) -> None:
    """Move the RUNS stream's leadership to *node_id*'s broker (a step down
    naming it preferred; tried again until it leads)."""
    async def step(nc, js):
        info = await js.stream_info("RUNS")
        if info.cluster.leader == node_id:
            return True
        try:
            await nc.request("$JS.API.STREAM.LEADER.STEPDOWN.RUNS",
                             json.dumps({"placement": {"preferred": node_id}}).encode(), timeout=5)
        except Exception:
            pass
        return False
    wait_for(lambda: read_nats(node_url(f.nodes[0]), step), 60, interval=1.0,
             what=f"RUNS led from {node_id}")
    wait_for(lambda: _streams_whole(f.nodes[0]), 30, interval=0.3, what="every stream led, replicas current")


def node_of(f: Fleet, node_id: str):
    return next(n for n in f.nodes if n.config["node"]["id"] == node_id)


# ---------------------------------------------------------------- answers

@dataclass
class Answer:
    at: float           # seconds after the fault
    node: str
    route: str
    status: int         # 0: no answer at all (the client gave up)
    code: str | None
    retry_after: str | None
    took: float
    detail: str = ""


@dataclass
class Window:
    fault: str
    t0: float
    answers: list[Answer] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    follower: "Follower | None" = None

    def note(self, node: str, route: str, r: httpx2.Response | None, started: float,
             detail: str = "") -> Answer:
        code = retry = None
        status = 0
        if r is not None:
            status = r.status_code
            retry = r.headers.get("retry-after")
            if route == READYZ and status == 503:
                # Not a problem: what keeps the node unready, by name.
                body = json.loads(r.read())
                code = ",".join(k for k in ("not_running", "disk", "estate", "fleet") if body.get(k))
                detail = str(body.get("fleet") or "")
            elif status >= 400 and r.headers.get("content-type", "").startswith("application/problem+json"):
                try:
                    body = json.loads(r.read())
                    code, detail = body.get("code"), body.get("detail", "")
                except ValueError:
                    pass
        now = time.monotonic()
        answer = Answer(now - self.t0, node, route, status, code, retry, now - started, detail)
        with self.lock:
            self.answers.append(answer)
        return answer

    def unavailable(self, readyz: bool = False) -> list[Answer]:
        """The API's 503s (readiness's own, with *readyz*)."""
        with self.lock:
            return [a for a in self.answers if a.status == 503 and (a.route == READYZ) == readyz]

    def last_503(self) -> float | None:
        times = [a.at for a in self.unavailable() + self.unavailable(readyz=True)]
        return max(times) if times else None


def _routes(f: Fleet, conv: str, run: str) -> list[tuple[str, str, dict]]:
    """(template, path, params) of every read route of the API but the two
    streams (a template starting "HEAD " is asked with HEAD, the rest with GET)."""
    project, _, path = f.file.partition("/")
    return [
        ("/v1/fleet", "/v1/fleet", {}),
        ("/v1/seats", "/v1/seats", {}),
        ("/v1/seats/{seat}", "/v1/seats/ceo", {}),
        ("/v1/turns", "/v1/turns", {"limit": 5}),
        ("/v1/tasks", "/v1/tasks", {"limit": 5}),
        ("/v1/tasks/{id}", f"/v1/tasks/{f.task}", {}),
        ("/v1/pages", "/v1/pages", {}),
        ("/v1/pages/{path}", f"/v1/pages/{f.page}", {}),
        ("/v1/search", "/v1/search", {"q": "fleet"}),
        ("/v1/files", "/v1/files", {}),
        (DOWNLOAD, f"/v1/files/{project}/{path}", {}),
        ("HEAD " + DOWNLOAD, f"/v1/files/{project}/{path}", {}),
        ("/v1/dlq", "/v1/dlq", {}),
        ("/v1/company", "/v1/company", {}),
        ("/v1/schedules", "/v1/schedules", {}),
        ("/v1/conversations", "/v1/conversations", {"limit": 5}),
        ("/v1/conversations/{id}", f"/v1/conversations/{conv}", {}),
        ("/v1/conversations/{id}/runs", f"/v1/conversations/{conv}/runs", {}),
        ("/v1/conversations/{id}/runs/{run}", f"/v1/conversations/{conv}/runs/{run}", {}),
        ("/v1/approvals", "/v1/approvals", {"status": "pending"}),
        ("/v1/approvals/{id}", "/v1/approvals/a-none", {}),
        (READYZ, READYZ, {}),
        ("/healthz", "/healthz", {}),
        ("/metrics", "/metrics", {}),
    ]


def _open_sse(c: Client, w: Window, route: str, path: str, headers: dict) -> None:
    """Open an SSE route, read its first block (or its first line) and leave."""
    started = time.monotonic()
    try:
        with c.http.stream("GET", path, headers=headers) as r:
            if r.status_code == 200:
                for line in r.iter_lines():
                    if line == "" or line.startswith("event:"):
                        break
            else:
                r.read()
            w.note(c.id, route, r, started)
    except httpx2.HTTPError as exc:
        w.note(c.id, route, None, started, f"{type(exc).__name__}: {exc}")


def probe_round(f: Fleet, w: Window, clients: list[Client], conv: str, run: str, last_id: int) -> None:
    """Every read route, the live feed and the stream resume, once on each of *clients*."""
    for c in clients:
        for route, path, params in _routes(f, conv, run):
            started = time.monotonic()
            try:
                r = c.http.request("HEAD" if route.startswith("HEAD ") else "GET", path, params=params)
            except httpx2.HTTPError as exc:
                w.note(c.id, route, None, started, f"{type(exc).__name__}: {exc}")
                continue
            w.note(c.id, route, r, started)
        _open_sse(c, w, "/v1/events", "/v1/events", {})
        _open_sse(c, w, "/v1/conversations/{id}/runs/{run}/stream",
                  f"/v1/conversations/{conv}/runs/{run}/stream", {"Last-Event-ID": str(last_id)})


# ---------------------------------------------------------------- the followed run

class Follower(threading.Thread):
    """A client following the run to its end through the survivors, taking
    turns: resumed with Last-Event-ID after each broken stream or refusal."""

    def __init__(self, w: Window, clients: list[Client], conv: str, run: str,
                 seen: list[tuple[int, str, dict]], deadline: float):
        super().__init__(daemon=True)
        self.w, self.clients, self.conv, self.run_id = w, clients, conv, run
        self.events = list(seen)
        self.deadline = deadline
        self.done = threading.Event()
        self.error: str | None = None
        self.resumes = 0

    @property
    def last_id(self) -> int:
        return self.events[-1][0]

    def run(self) -> None:
        route = "/v1/conversations/{id}/runs/{run}/stream"
        try:
            n = 0
            while time.monotonic() < self.deadline:
                c = self.clients[n % len(self.clients)]
                n += 1
                self.resumes += 1
                started = time.monotonic()
                try:
                    with c.http.stream("GET", f"/v1/conversations/{self.conv}/runs/{self.run_id}/stream",
                                       headers={"Last-Event-ID": str(self.last_id)}) as r:
                        if r.status_code != 200:
                            r.read()
                            answer = self.w.note(c.id, route + " (followed)", r, started)
                            if answer.status == 503:
                                # A client waits as it is told, within reason.
                                pause = min(float(answer.retry_after or 1), 1.0)
                                self.done.wait(pause)
                            continue
                        self.w.note(c.id, route + " (followed)", r, started)
                        for block in _blocks(r.iter_lines()):
                            if "event" in block:
                                event = (int(block["id"]), block["event"], json.loads(block["data"]))
                                self.events.append(event)
                                if block["event"] in TERMINAL:
                                    return
                except httpx2.HTTPError as exc:
                    self.w.note(c.id, route + " (followed)", None, started, f"{type(exc).__name__}: {exc}")
            self.error = "the run did not end within the window"
        except Exception as exc:  # said by the test, not lost in the thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()


# ---------------------------------------------------------------- one fault

def start_streaming(c: Client, words: int = 4, seat: str = "ceo") -> tuple[str, str, list[tuple[int, str, dict]]]:
    """A conversation with *seat* whose run streams through *c*: its id, the
    run's id and the events seen once *words* words came (the client then
    goes away; the run goes on)."""
    conv = c.ok("POST", "/v1/conversations", 201, json={"seat": seat})["id"]
    events: list[tuple[int, str, dict]] = []
    with c.http.stream("POST", f"/v1/conversations/{conv}/runs",
                       json={"input": f"slowly {uuid.uuid4().hex[:6]}", "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for block in _blocks(r.iter_lines()):
            if "event" in block:
                events.append((int(block["id"]), block["event"], json.loads(block["data"])))
                if sum(e[1] == "message.delta" for e in events) >= words:
                    break
    assert events and events[0][1] == "run.started", events
    return conv, events[0][2]["run"], events


def ride(f: Fleet, fault: str, survivors: list, conv: str, run: str, seen: list, t0: float) -> Window:
    """Hit the survivors in a loop from *t0* for WINDOW_MIN seconds, then
    until the followed run ended and no 503 came for QUIET seconds
    (WINDOW_MAX at most); the answers."""
    w = Window(fault, t0)
    probes = [Client(n) for n in survivors]
    follows = [Client(n) for n in survivors]
    follower = Follower(w, follows, conv, run, seen, t0 + WINDOW_MAX)
    follower.start()
    try:
        while True:
            probe_round(f, w, probes, conv, run, follower.last_id)
            now = time.monotonic()
            last = w.last_503()
            quiet = now - t0 - (last if last is not None else 0.0)
            if follower.done.is_set() and quiet >= QUIET and now - t0 >= WINDOW_MIN:
                break
            if now - t0 >= WINDOW_MAX:
                break
        follower.join(QUIET)
    finally:
        for c in probes + follows:
            c.close()  # a follower still reading is cut short: it ends
        follower.join(QUIET)
    w.follower = follower
    return w


def _span(answers: list[Answer]) -> str:
    if not answers:
        return "none"
    return f"{len(answers)} from +{min(a.at for a in answers):.1f}s to +{max(a.at for a in answers):.1f}s"


def report(w: Window) -> str:
    down = w.unavailable()
    counts: dict[str, int] = {}
    for a in down:
        counts[f"{a.route} {a.code}"] = counts.get(f"{a.route} {a.code}", 0) + 1
    others: dict[str, int] = {}
    for a in w.answers:
        if a.status not in (200, 503) and a.route != "/v1/approvals/{id}":
            others[f"{a.route} {a.status}"] = others.get(f"{a.route} {a.status}", 0) + 1
    reads = [a for a in w.answers if "(followed)" not in a.route and a.route != DOWNLOAD]
    slowest = max(reads, key=lambda a: a.took)
    downloads = [a.took for a in w.answers if a.route == DOWNLOAD]
    unready = w.unavailable(readyz=True)
    return (f"\n[issue 29] {w.fault}: {len(w.answers)} answers in {max(a.at for a in w.answers):.1f}s; "
            f"API 503s: {_span(down)} after the fault, by route and code "
            f"{json.dumps(counts, sort_keys=True)}; "
            f"/readyz 503: {_span(unready)} ({sorted({a.code for a in unready})}); "
            f"slowest read {slowest.route} on {slowest.node} {slowest.took:.1f}s (status {slowest.status}); "
            f"slowest download {max(downloads, default=0):.1f}s; "
            f"other answers {json.dumps(others, sort_keys=True)}; "
            f"the followed run resumed {w.follower.resumes if w.follower else 0} times")


def check(w: Window, nodes: list, since: float) -> None:
    """The issue's rules for one fault's window."""
    print(report(w))
    bad = [a for a in w.answers if a.status >= 500 and not (a.status == 503 and a.retry_after and a.code)
           and a.route != READYZ]
    bad += [a for a in w.answers if a.route == READYZ and a.status not in (200, 503)]
    assert not bad, f"5xx other than 503 with Retry-After and a code: {bad[:10]}"
    lost = [a for a in w.answers if a.status == 0]
    assert not lost, f"requests left unanswered: {lost[:10]}"
    slow = [a for a in w.answers if "(followed)" not in a.route
            and a.took > (DOWNLOAD_BOUND if a.route == DOWNLOAD else READ_BOUND)]
    assert not slow, f"answers slower than a client waits: {slow[:10]}"
    unready = [a for a in w.unavailable(readyz=True) if "fleet" in (a.code or "") and not a.retry_after]
    assert not unready, f"readiness re-forming without Retry-After: {unready[:5]}"
    for node in nodes:
        # (parent_gone: a child of a node killed whole that outlived its crewletd for a
        # moment says so as it goes — the fault itself, not an answer of the API.)
        errors = [e for e in node.events() if e.get("ts", 0) >= since
                  and (e.get("event") == "api_internal_error"
                       or (e.get("level") == "error" and e.get("role") == "ingress"
                           and e.get("event") != "parent_gone"))]
        assert not errors, f"{node.config['node']['id']} logged at error level: {errors[:3]}"
    follower = w.follower
    assert follower is not None
    assert not follower.is_alive() and follower.error is None, \
        follower.error or "the follower is still reading"
    events = follower.events
    ids = [e[0] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), ids
    ends = [e[1] for e in events if e[1] in TERMINAL]
    assert ends == ["run.completed"] and events[-1][1] == "run.completed", [e[1] for e in events]


def _signal_tree(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- the faults

def test_the_runs_leaders_broker_killed_alone(fleet):
    # The RUNS leader is put on the node that neither holds the seat nor
    # drives the run: its broker's death is an election (and its own roles
    # restarting), which the run's driver and turn ride out. (On the seat's
    # holder, the turn's mail would wait out fleet.ack_wait: the seats
    # process, stopped while its broker is down, cannot hand it back.)
    # Whatever else that broker led is elected again too: when it led the
    # leases (KV_leases), the seat's life and the driver's lease lapse (TTL
    # 3 s here), and a turn cut off between writing its run's end in the
    # estate and telling it on RUNS left the run ended but untold, its
    # driver gone, until its mail came back (a doubling retry delay, or the
    # ack wait): the stream tells such an end itself (issue 29,
    # Conductor.tell_untold_end).
    settle(fleet)
    holder = held(fleet.nodes[0])["ceo"]
    victim, driver = [n for n in fleet.nodes if n.config["node"]["id"] != holder]
    leader = victim.config["node"]["id"]
    lead_runs_from(fleet, leader)
    survivors = [driver, node_of(fleet, holder)]
    since = time.time()
    c = Client(driver)
    try:
        conv, run, seen = start_streaming(c)
    finally:
        c.close()
    assert runs_leader(fleet) == leader
    broker = victim.children()["broker"]["pid"]
    t0 = time.monotonic()
    os.kill(broker, signal.SIGKILL)
    w = ride(fleet, f"RUNS leader's broker ({leader}) killed", survivors, conv, run, seen, t0)
    check(w, fleet.nodes, since)


def streaming_on_the_holder(fleet):
    """The settled fleet's seat holder with a run streaming through it: the
    holder's id, the node, the survivors, when, and the run (conv, run, seen)."""
    settle(fleet)
    holder = held(fleet.nodes[0])["ceo"]
    victim = node_of(fleet, holder)
    survivors = [n for n in fleet.nodes if n is not victim]
    since = time.time()
    c = Client(victim)
    try:
        conv, run, seen = start_streaming(c)
    finally:
        c.close()
    return holder, victim, survivors, since, (conv, run, seen)


def test_a_node_frozen_whole(fleet):
    holder, victim, survivors, since, (conv, run, seen) = streaming_on_the_holder(fleet)
    pids = victim.tree_pids()
    t0 = time.monotonic()
    _signal_tree(pids, signal.SIGSTOP)
    try:
        w = ride(fleet, f"{holder} frozen (SIGSTOP)", survivors, conv, run, seen, t0)
    finally:
        _signal_tree(pids, signal.SIGCONT)
    check(w, survivors, since)


def test_a_node_killed_whole(fleet):
    holder, victim, survivors, since, (conv, run, seen) = streaming_on_the_holder(fleet)
    t0 = time.monotonic()
    victim.kill_tree()
    w = ride(fleet, f"{holder} killed whole (SIGKILL)", survivors, conv, run, seen, t0)
    check(w, fleet.nodes, since)
