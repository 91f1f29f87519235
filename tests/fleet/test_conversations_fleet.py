"""Conversations across a fleet (DESIGN §11, issue 12): three data nodes with
ingress, their embedded brokers one R3 cluster, fast timings.

Any node takes a run and any node answers about it: a second driver is
refused through another node before any SSE header; an approval asked on
one node is decided through another and runs the recorded call once, on
the seat's holder; the driver's node killed mid-run leaves a run that
another node's session runner picks up, and a client resuming through a
third node with Last-Event-ID sees every event once. The load test runs a
thousand conversations at once. The kill is last: the tests run in file order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
import time
import uuid

import nats
import pytest

from tests.conftest import Nodes, wait_for
from tests.fleet.test_cluster import make_members
from tests.fleet.test_fleet import apply
from tests.integration.test_conversations import Api, problem, run_of, tasks_titled
from tests.seats import held, node_url, write_company

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(300)]

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
CONVERSATIONS = {"lease_ttl": 3}
SESSIONS = {"sweep": 0.5}
APPROVAL_TTL = 8.0
IDS = ("va", "vb", "vc")
# Seconds past a lapse a pickup may take: the dead node's broker may have led
# the leases bucket's stream (an election is ~5-6 s), and the seat moves too.
MARGIN = 12.0
LOAD = int(os.environ.get("CREWLET_TEST_CONV_LOAD", "1000"))
LOAD_SEATS = 20
CLIENTS = 32  # requests in flight at once, over the three nodes
COMPANY = r"""
company: {name: Talk fleet}
providers:
  scripted:
    kind: scripted
    rules:
      - match: '(?i)create a task (.+)'
        reply: 'Created: {tools}'
        tools:
          - {name: task_create, args: {title: '\1'}}
      - match: '(?i)file (.+) then talk'
        reply: 'Filed {tools}; and now a long story: one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen'
        pace: 0.3
        tools:
          - {name: task_create, args: {title: '\1'}}
      - match: '(?i)slowly (.+)'
        reply: 'one two three four five six seven eight nine ten eleven twelve \1'
        pace: 0.25
      - match: '.*'
        reply: 'Heard you.'
seats:
  - {name: ceo, persona: You answer., provider: scripted}
  - {name: clerk, persona: You file tasks., provider: scripted, approval: [task_create]}
""" + "".join(f"  - {{name: s{n:02d}, persona: You answer., provider: scripted}}\n" for n in range(LOAD_SEATS))


@pytest.fixture(scope="module")
def fleet():
    made = Nodes()
    try:
        nodes, _ = make_members(made, ids=IDS, cluster="convtest", fleet=FAST, conversations=CONVERSATIONS,
                                sessions=SESSIONS, approvals={"ttl": APPROVAL_TTL})
        for node in nodes:
            node.start(wait_ready=False)
        for node in nodes:
            node.wait_running(timeout=90)
        apply(nodes[0], write_company(made.dir, COMPANY, "conv-fleet.yaml"))
        wait_for(lambda: len(held(nodes[0])) == 2 + LOAD_SEATS, 60, what="every seat held")
        apis = [Api(n) for n in nodes]
        for api in apis:
            wait_for(lambda: api.http.get("/v1/company").json().get("rev"), 30, what="the company at ingress")
        yield apis
        for api in apis:
            api.http.close()
    finally:
        made.close()


def status(api: Api, conv: str) -> str | None:
    """The conversation's status as *api*'s node sees it; None while that node's
    copy has not applied its creation yet — reads carry the floor of the node
    they are made on (README, Reads), and this one may be another node's."""
    r = api.http.get(f"/v1/conversations/{conv}")
    if r.status_code == 404:
        return None
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()["conversation"]["status"]


def node_id(api: Api) -> str:
    return api.node.config["node"]["id"]


def test_a_second_driver_through_another_node_is_refused_before_any_header(fleet):
    a, b, _ = fleet
    conv = a.conversation()
    first: dict = {}
    t = threading.Thread(target=lambda: first.update(zip(("r", "events"), a.stream(
        f"/v1/conversations/{conv}/runs", {"input": "slowly first", "stream": True}))))
    t.start()
    try:
        wait_for(lambda: status(b, conv) == "running", 20, what="running, as node b sees it")
        running = b.ok("GET", f"/v1/conversations/{conv}")["conversation"]["run"]
        with b.http.stream("POST", f"/v1/conversations/{conv}/runs", json={"input": "hi", "stream": True}) as r:
            raw = r.read()
        body = problem(r, 409, "conversation_busy")
        assert b"event:" not in raw and body["run_id"] == running and body["node"] == node_id(a)
    finally:
        t.join(60)
    assert first["events"][-1][1] == "run.completed"


def test_an_approval_asked_on_one_node_and_decided_on_another_runs_the_call_once(fleet):
    a, _, c = fleet
    conv = a.conversation("clerk")
    title = f"fleet approved {uuid.uuid4().hex[:8]}"
    r, events = a.stream(f"/v1/conversations/{conv}/runs", {"input": f"create a task {title}", "stream": True})
    approval = next(e[2]["approval"] for e in events if e[1] == "approval.requested")
    decided = c.ok("POST", f"/v1/approvals/{approval}", json={"decision": "approve"})
    assert decided["decision"] == "approve"
    assert c.ok("POST", f"/v1/approvals/{approval}", json={"decision": "approve"})["decision"] == "approve"
    problem(a.http.post(f"/v1/approvals/{approval}", json={"decision": "deny"}), 409, "already_decided")
    wait_for(lambda: status(c, conv) == "idle", 40, what="resumed and done")
    assert tasks_titled(c, title) == 1
    # The resumption ran where the seat is held.
    resumed = [t for t in c.ok("GET", "/v1/turns", params={"seat": "clerk", "limit": 50})["items"]
               if t["trigger"].startswith("run=") and t["outcome"] == "done"]
    holder = held(c.node)["clerk"]
    assert resumed and resumed[0]["node"] == holder
    # Left undecided, an approval expires as a denial, which the model is told.
    title = f"fleet expired {uuid.uuid4().hex[:8]}"
    a.ok("POST", f"/v1/conversations/{conv}/runs", 202, json={"input": f"create a task {title}"})
    wait_for(lambda: status(c, conv) == "awaiting_approval", 30, what="awaiting a decision")
    approval = c.ok("GET", f"/v1/conversations/{conv}")["conversation"]["approval"]
    wait_for(lambda: status(c, conv) == "idle", APPROVAL_TTL + 30, what="denied as expired, and resumed")
    row = c.ok("GET", f"/v1/approvals/{approval}")
    assert row["decision"] == "deny" and row["expired"] is True
    tools = [m for m in c.ok("GET", f"/v1/conversations/{conv}", params={"limit": 500})["messages"]
             if m["role"] == "tool"]
    assert "denied" in tools[-1]["text"] and tasks_titled(c, title) == 0


def test_a_thousand_conversations_at_once_lose_nothing(fleet):
    started = time.monotonic()

    def one(n: int) -> tuple[str, str]:
        api = fleet[n % 3]
        conv = api.conversation(f"s{n % LOAD_SEATS:02d}")
        r = api.http.post(f"/v1/conversations/{conv}/runs", json={"input": "hello"})
        assert r.status_code == 202, r.text  # never a 409: each conversation is its own
        return conv, r.json()["run"]["id"]
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        runs = list(pool.map(one, range(LOAD)))

    def completed(some: list[tuple[int, tuple[str, str]]]) -> bool:
        # Each run asked of the node that started it: reads there carry that
        # node's floor (README, "Reads"); another node's copy may not have
        # applied the run's row yet under this load (CI once got a 404).
        return all(run_of(fleet[n % 3], c, r)["status"] == "completed" for n, (c, r) in some)
    numbered = list(enumerate(runs))
    wait_for(lambda: completed(numbered[-20:]), 180, interval=0.5, what="the last runs completed")
    wait_for(lambda: completed(numbered), 180, interval=0.5, what="every run completed")
    api = fleet[0]
    took = time.monotonic() - started
    # Every run's events: its start and exactly one end, none lost.
    events = asyncio.run(_all_run_events(node_url(api.node)))
    for conv, run in runs:
        kinds = events.get(run, [])
        assert kinds.count("run.started") >= 1 and kinds[-1] == "run.completed", (run, kinds)
        assert sum(k in ("run.completed", "run.failed", "run.interrupted") for k in kinds) == 1, (run, kinds)
    print(f"{LOAD} conversations, one run each, through 3 nodes by {CLIENTS} clients: {took:.1f}s")


async def _all_run_events(url: str) -> dict[str, list[str]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("RUNS")
        sub = await js.subscribe("runs.>", stream="RUNS", ordered_consumer=True)
        by_run: dict[str, list[str]] = {}
        for _ in range(info.state.messages):
            msg = await sub.next_msg(timeout=10)
            if msg.subject.endswith(".cancel"):
                continue
            event = json.loads(msg.data)
            by_run.setdefault(event["run"], []).append(event["type"])
        await sub.unsubscribe()
        return by_run
    finally:
        await nc.close()


def test_the_drivers_node_killed_mid_run_is_picked_up_and_resumed_through_a_third(fleet):
    # Driven through the node that holds the seat: killed, both the driver and
    # the turn go, and the seat moves too.
    holder = held(fleet[0].node)["ceo"]
    a = next(api for api in fleet if node_id(api) == holder)
    others = [api for api in fleet if api is not a]
    conv = a.conversation("ceo")
    title = f"kill {uuid.uuid4().hex[:8]}"
    r, seen = a.stream(f"/v1/conversations/{conv}/runs", {"input": f"file {title} then talk", "stream": True},
                       stop_after=6)
    kinds = [e[1] for e in seen]
    assert "tool.result" in kinds and kinds[-1] == "message.delta", kinds
    run = seen[0][2]["run"]
    killed = time.time()
    a.node.kill_tree()
    b, c = others
    wait_for(lambda: run_of(b, conv, run)["status"] == "completed", 90, what="the run completed after the kill")
    r, rest = c.stream(f"/v1/conversations/{conv}/runs/{run}/stream", headers={"Last-Event-ID": str(seen[-1][0])})
    assert r.status_code == 200
    ids = [e[0] for e in seen + rest]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    ends = [e for e in rest if e[1] in ("run.completed", "run.failed", "run.interrupted")]
    assert [e[1] for e in ends] == ["run.completed"] and rest[-1] is ends[0]
    taken = [e for e in rest if e[1] == "run.started" and e[2].get("taken_over")]
    assert taken and taken[0][2]["node"] != node_id(a)
    assert taken[0][2]["at"] - killed <= CONVERSATIONS["lease_ttl"] + SESSIONS["sweep"] + MARGIN
    # The redone round's text says restart; the tool call before the kill is not repeated.
    assert any(e[2].get("restart") for e in rest if e[1] == "message.delta")
    assert not [e for e in rest if e[1] in ("tool.call", "tool.result")]
    assert tasks_titled(c, title) == 1
