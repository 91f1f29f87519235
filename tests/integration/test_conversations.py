"""Conversations through the /v1 API of one real node (DESIGN §11, issue 12).

One node serves the module: a small company whose scripted provider streams
its replies word by word (``pace``), creates tasks with a tool (a side effect
counted in the estate), and one seat (``clerk``) whose ``task_create`` waits
for a person's approval. Everything goes over HTTP to the node's ingress; the
streams are read as a client reads them (status line, content type, the
bytes of the SSE). Waits are conditions with deadlines.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import httpx2
import yaml
import pytest

from crewlet import tokens
from tests.conftest import Nodes, wait_for
from tests.seats import held
from tests.smtp import ID_HEADER, SmtpServer

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
RUNNER = 2  # sessions.runner_concurrency
PROBLEM = "application/problem+json"
COMPANY = r"""
company: {name: Talk}
providers:
  scripted:
    kind: scripted
    rules:
      - match: '(?i)create a task (.+)'
        reply: 'Created: {tools}'
        tools:
          - {name: task_create, args: {title: '\1'}}
      - match: '(?i)slowly (.+)'
        reply: 'one two three four five six seven eight nine ten eleven twelve \1'
        pace: 0.25
      - match: '(?i)briefly (.+)'
        reply: 'one two three four five six \1'
        pace: 0.1
      - match: '.*'
        reply: 'Heard you.'
seats:
  - {name: ceo, persona: You answer., provider: scripted}
  - {name: clerk, persona: You file tasks., provider: scripted, approval: [task_create]}
"""


class Api:
    def __init__(self, node):
        self.node = node
        self.base = f"http://{node.config['ingress']['listen']}"
        self.token = tokens.read_admin_token(node.run_dir)
        self.http = httpx2.Client(base_url=self.base, timeout=60, trust_env=False,
                                  headers={"Authorization": f"Bearer {self.token}"})

    def ok(self, method: str, path: str, status: int = 200, **kw) -> dict:
        r = self.http.request(method, path, **kw)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        return r.json()

    def conversation(self, seat: str = "ceo") -> str:
        return self.ok("POST", "/v1/conversations", 201, json={"seat": seat})["id"]

    def stream(self, path: str, body: dict | None = None, headers: dict | None = None,
               stop_after: int | None = None) -> tuple[httpx2.Response, list[tuple[int, str, dict]]]:
        """Events of an SSE answer: (response, [(id, event, data)]), until the
        stream ends or *stop_after* events were read (the client then goes away)."""
        method = "POST" if body is not None else "GET"
        events: list[tuple[int, str, dict]] = []
        with self.http.stream(method, path, json=body, headers=headers or {}) as r:
            if r.status_code != 200:
                r.read()
                return r, events
            for block in _blocks(r.iter_lines()):
                if "event" in block:
                    events.append((int(block["id"]), block["event"], json.loads(block["data"])))
                    if stop_after is not None and len(events) >= stop_after:
                        break
        return r, events


def _blocks(lines):
    block: dict[str, str] = {}
    for line in lines:
        if not line:
            if block:
                yield block
            block = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        block[field] = value[1:] if value.startswith(" ") else value


@pytest.fixture(scope="module")
def smtpd():
    """Where the node's notices go (a waiting approval's among them)."""
    server = SmtpServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api(smtpd):
    made = Nodes()
    try:
        node = made(fleet=FAST, sessions={"sweep": 0.5, "runner_concurrency": RUNNER}, approvals={"ttl": 60},
                    smtp={"host": "127.0.0.1", "port": smtpd.port, "tls": "none",
                          "notices_to": ["ops@example.com"]})
        path = os.path.join(node.dir, "company.yaml")
        with open(path, "w") as f:
            f.write(COMPANY)
        node.start(args=("--company", path))
        wait_for(lambda: {"ceo", "clerk"} <= set(held(node)), 30, what="ceo and clerk held")
        client = Api(node)
        wait_for(lambda: client.http.get("/v1/company").json().get("rev"), 20, what="the company in ingress")
        # Seats are held within a sweep now; conversations also need the estate in service.
        wait_for(lambda: client.http.get("/readyz").status_code == 200, 30, what="the node ready")
        yield client
        client.http.close()
    finally:
        made.close()


def problem(r, status: int, code: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body = r.json()
    assert body["code"] == code, body
    return body


def run_of(api: Api, conv: str, run: str) -> dict:
    return api.ok("GET", f"/v1/conversations/{conv}/runs/{run}")


def tasks_titled(api: Api, title: str) -> int:
    items = api.ok("GET", "/v1/tasks", params={"limit": 500})["items"]
    return sum(1 for t in items if t.get("title") == title)


# -------------------------------------------------------------------- tests

def test_a_streamed_run_tells_its_start_the_words_the_tool_and_one_end(api):
    conv = api.conversation()
    r, events = api.stream(f"/v1/conversations/{conv}/runs", {"input": "create a task water the plants",
                                                               "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    kinds = [e[1] for e in events]
    assert kinds[0] == "run.started" and events[0][2]["node"] == api.node.config["node"]["id"]
    assert kinds.index("tool.call") < kinds.index("tool.result") < kinds.index("message.delta")
    assert kinds[-1] == "run.completed" and sum(k.startswith("run.") and k != "run.started" for k in kinds) == 1
    ids = [e[0] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    text = "".join(e[2]["text"] for e in events if e[1] == "message.delta")
    assert "Created" in text and events[-1][2]["reply"] == text
    # The conversation keeps the exchange, in order: input, the call, its result, the reply.
    detail = api.ok("GET", f"/v1/conversations/{conv}")
    assert detail["conversation"]["status"] == "idle"
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert tasks_titled(api, "water the plants") == 1


def test_a_second_run_is_refused_before_any_sse_header_and_names_the_first(api):
    conv = api.conversation()
    first: dict = {}

    def slow():
        first["r"], first["events"] = api.stream(f"/v1/conversations/{conv}/runs",
                                                 {"input": "slowly please", "stream": True})
    t = threading.Thread(target=slow)
    t.start()
    try:
        wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["status"] == "running",
                 20, what="the first run running")
        running = api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["run"]
        started = time.monotonic()
        with api.http.stream("POST", f"/v1/conversations/{conv}/runs",
                             json={"input": "hello", "stream": True}) as r:
            raw = r.read()
        assert time.monotonic() - started >= 1.9  # it waited busy_wait (2 s) for the lease first
        body = problem(r, 409, "conversation_busy")
        assert b"event:" not in raw and body["run_id"] == running
        assert body["node"] == api.node.config["node"]["id"] and body["retry_after"] >= 1
        assert r.headers["retry-after"] == str(body["retry_after"])
    finally:
        t.join(60)
    assert [e[1] for e in first["events"]][-1] == "run.completed"


def test_an_aborted_stream_retried_at_once_is_accepted(api):
    conv = api.conversation()
    r, events = api.stream(f"/v1/conversations/{conv}/runs",
                           {"input": "slowly abandon", "stream": True, "on_disconnect": "cancel"},
                           stop_after=2)
    assert events[0][1] == "run.started"
    r, events = api.stream(f"/v1/conversations/{conv}/runs", {"input": "hello again", "stream": True})
    assert r.status_code == 200, r.text
    assert events[-1][1] == "run.completed"
    runs = api.ok("GET", f"/v1/conversations/{conv}/runs")["items"]
    assert [x["status"] for x in runs] == ["interrupted", "completed"]


def test_interrupt_stops_the_running_run_mid_answer_and_starts_the_new_one(api):
    conv = api.conversation()
    first: dict = {}
    t = threading.Thread(target=lambda: first.update(zip(("r", "events"), api.stream(
        f"/v1/conversations/{conv}/runs", {"input": "slowly long answer", "stream": True}))))
    t.start()
    try:
        wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["status"] == "running",
                 20, what="the first run running")
        r, events = api.stream(f"/v1/conversations/{conv}/runs",
                               {"input": "hello", "stream": True, "multitask_strategy": "interrupt"})
        assert r.status_code == 200, r.text
        assert events[-1][1] == "run.completed"
    finally:
        t.join(60)
    assert first["events"][-1][1] == "run.interrupted"
    words = "".join(e[2]["text"] for e in first["events"] if e[1] == "message.delta")
    assert "twelve" not in words  # stopped mid-answer
    runs = api.ok("GET", f"/v1/conversations/{conv}/runs")["items"]
    assert [x["status"] for x in runs] == ["interrupted", "completed"]


def test_enqueue_keeps_order(api):
    conv = api.conversation()
    first = api.ok("POST", f"/v1/conversations/{conv}/runs", 202, json={"input": "slowly first"})
    assert not first["queued"]
    queued = [api.ok("POST", f"/v1/conversations/{conv}/runs", 202,
                     json={"input": f"number {n}", "multitask_strategy": "enqueue"}) for n in (2, 3)]
    assert all(q["queued"] for q in queued)
    wait_for(lambda: all(x["status"] == "completed" for x in
                         api.ok("GET", f"/v1/conversations/{conv}/runs")["items"]), 60, what="all three done")
    runs = api.ok("GET", f"/v1/conversations/{conv}/runs")["items"]
    assert [x["id"] for x in runs] == [first["run"]["id"], *(q["run"]["id"] for q in queued)]
    starts = [x["started_at"] for x in runs]
    assert starts == sorted(starts)
    users = [m["text"] for m in api.ok("GET", f"/v1/conversations/{conv}")["messages"] if m["role"] == "user"]
    assert users == ["slowly first", "number 2", "number 3"]


def test_rollback_removes_the_interrupted_runs_messages(api):
    conv = api.conversation()
    api.ok("POST", f"/v1/conversations/{conv}/runs", 202, json={"input": "slowly to be undone"})
    wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["messages"], 20,
             what="the turn working it (its input kept)")
    answer = api.ok("POST", f"/v1/conversations/{conv}/runs", 202,
                    json={"input": "hello", "multitask_strategy": "rollback"})
    assert answer["rolled_back"]["removed"] >= 1
    wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["status"] == "idle",
             30, what="idle again")
    texts = [m["text"] for m in api.ok("GET", f"/v1/conversations/{conv}")["messages"]]
    assert "slowly to be undone" not in texts and texts[0] == "hello"


def test_a_streamed_rollback_tells_what_it_removed_in_its_start(api):
    conv = api.conversation()
    api.ok("POST", f"/v1/conversations/{conv}/runs", 202, json={"input": "slowly undo me too"})
    wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["messages"], 20, what="the turn working it")
    r, events = api.stream(f"/v1/conversations/{conv}/runs",
                           {"input": "hello", "stream": True, "multitask_strategy": "rollback"})
    assert events[0][1] == "run.started" and events[0][2]["rolled_back"]["removed"] >= 1
    assert events[-1][1] == "run.completed"


def test_interrupt_denies_a_pending_approval_first(api):
    conv = api.conversation("clerk")
    api.ok("POST", f"/v1/conversations/{conv}/runs", 202, json={"input": "create a task never made"})
    wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["status"] == "awaiting_approval",
             30, what="awaiting a decision")
    approval = api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["approval"]
    r, events = api.stream(f"/v1/conversations/{conv}/runs",
                           {"input": "hello instead", "stream": True, "multitask_strategy": "interrupt"})
    assert r.status_code == 200 and events[-1][1] == "run.completed"
    denied = api.ok("GET", f"/v1/approvals/{approval}")
    assert denied["decision"] == "deny" and "interrupted" in denied["note"]
    assert tasks_titled(api, "never made") == 0


def test_resuming_with_last_event_id_gives_every_later_event_once(api):
    conv = api.conversation()
    r, head = api.stream(f"/v1/conversations/{conv}/runs", {"input": "slowly resume me", "stream": True},
                         stop_after=3)
    run = head[0][2]["run"]
    r, rest = api.stream(f"/v1/conversations/{conv}/runs/{run}/stream",
                         headers={"Last-Event-ID": str(head[-1][0])})
    assert r.status_code == 200
    assert all(e[0] > head[-1][0] for e in rest) and rest[-1][1] == "run.completed"
    r, whole = api.stream(f"/v1/conversations/{conv}/runs/{run}/stream")
    assert [e[0] for e in whole] == [e[0] for e in head] + [e[0] for e in rest]
    # At the end already: nothing more, at once.
    r, none = api.stream(f"/v1/conversations/{conv}/runs/{run}/stream",
                         headers={"Last-Event-ID": str(whole[-1][0])})
    assert r.status_code == 200 and none == []


def test_cancel_is_idempotent_and_works_on_a_run_streamed_elsewhere(api):
    conv = api.conversation()
    started = api.ok("POST", f"/v1/conversations/{conv}/runs", 202, json={"input": "slowly cancel me"})
    run = started["run"]["id"]
    wait_for(lambda: run_of(api, conv, run)["status"] == "running", 20, what="running")
    api.ok("POST", f"/v1/conversations/{conv}/runs/{run}/cancel", 202)
    api.ok("POST", f"/v1/conversations/{conv}/runs/{run}/cancel", 202)
    wait_for(lambda: run_of(api, conv, run)["status"] == "interrupted", 20, what="interrupted")
    r, events = api.stream(f"/v1/conversations/{conv}/runs/{run}/stream")
    assert events[-1][1] == "run.interrupted"
    assert sum(e[1].startswith("run.") and e[1] != "run.started" for e in events) == 1
    assert api.ok("POST", f"/v1/conversations/{conv}/runs/{run}/cancel", 202)["status"] == "interrupted"


def test_an_approved_call_runs_once_as_recorded_and_a_denied_one_is_told(api, smtpd):
    conv = api.conversation("clerk")
    title = f"approved {uuid.uuid4().hex[:8]}"
    r, events = api.stream(f"/v1/conversations/{conv}/runs", {"input": f"create a task {title}", "stream": True})
    kinds = [e[1] for e in events]
    assert kinds[-2:] == ["approval.requested", "run.completed"]
    approval = events[-2][2]["approval"]
    # The operators are told by email: the seat, the tool, its exact arguments, how to decide.
    notice = wait_for(lambda: next((m for m in list(smtpd.messages)
                                    if m[ID_HEADER] == f"notice.approval.{approval}"), None), 30,
                      interval=0.1, what="the approval's notice sent")
    assert notice["Subject"] == "clerk waits for a decision: task_create" and notice["To"] == "ops@example.com"
    text = notice.get_payload(decode=True).decode() if not notice.is_multipart() else \
        notice.get_payload(0).get_payload(decode=True).decode()
    assert title in text and f"/v1/approvals/{approval}" in text, text
    assert events[-2][2]["args"] == {"title": title} and tasks_titled(api, title) == 0
    assert api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["status"] == "awaiting_approval"
    pending = api.ok("GET", "/v1/approvals", params={"status": "pending"})["items"]
    assert approval in [a["id"] for a in pending]
    # A new message meanwhile is refused, naming the approval.
    body = problem(api.http.post(f"/v1/conversations/{conv}/runs", json={"input": "hello"}), 409,
                   "pending_approval")
    assert body["approval"] == approval
    decided = api.ok("POST", f"/v1/approvals/{approval}", json={"decision": "approve", "note": "fine"})
    assert decided["status"] == "decided"
    again = api.ok("POST", f"/v1/approvals/{approval}", json={"decision": "approve"})
    assert again["decision"] == "approve"
    problem(api.http.post(f"/v1/approvals/{approval}", json={"decision": "deny"}), 409, "already_decided")
    wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["status"] == "idle", 30,
             what="resumed and done")
    assert tasks_titled(api, title) == 1
    # Denied: the model is told, nothing is created.
    title = f"denied {uuid.uuid4().hex[:8]}"
    api.ok("POST", f"/v1/conversations/{conv}/runs", 202, json={"input": f"create a task {title}"})
    wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["status"] == "awaiting_approval",
             30, what="awaiting again")
    approval = api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["approval"]
    api.ok("POST", f"/v1/approvals/{approval}", json={"decision": "deny", "note": "not now"})
    wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["status"] == "idle", 30,
             what="resumed after the denial")
    tools = [m for m in api.ok("GET", f"/v1/conversations/{conv}", params={"limit": 500})["messages"]
             if m["role"] == "tool"]
    assert tools[-1]["error"] and "denied" in tools[-1]["text"] and "not now" in tools[-1]["text"]
    assert tasks_titled(api, title) == 0


def test_bad_input_gets_a_4xx_with_a_reason(api):
    problem(api.http.post("/v1/conversations", json={"seat": "nobody"}), 404, "no_such_seat")
    problem(api.http.get("/v1/conversations/c-none"), 404, "not_found")
    problem(api.http.post("/v1/conversations/c-none/runs", json={"input": "x"}), 404, "not_found")
    conv = api.conversation()
    problem(api.http.post(f"/v1/conversations/{conv}/runs", json={"input": "x", "multitask_strategy": "shout"}),
            422, "invalid")
    # Oversized: past what one message holds (200,000 characters), under the body limit.
    body = problem(api.http.post(f"/v1/conversations/{conv}/runs", json={"input": "x" * 200_001}), 422,
                   "invalid")
    assert "input" in body["detail"]
    r = api.ok("POST", f"/v1/conversations/{conv}/runs", 202, json={"input": "hello"})
    run = r["run"]["id"]
    for bad in ("abc", "-1", "1" * 30):
        problem(api.http.get(f"/v1/conversations/{conv}/runs/{run}/stream", headers={"Last-Event-ID": bad}),
                400, "bad_last_event_id")
    problem(api.http.get(f"/v1/conversations/{conv}/runs/r-none"), 404, "not_found")


def test_the_session_runner_never_drives_more_than_its_concurrency(api):
    convs = [api.conversation() for _ in range(3 * RUNNER)]
    answers = [api.ok("POST", f"/v1/conversations/{c}/runs", 202, json={"input": f"briefly run {n}"})
               for n, c in enumerate(convs)]
    assert sum(a["queued"] for a in answers) >= len(convs) - RUNNER
    ids = [(c, a["run"]["id"]) for c, a in zip(convs, answers)]
    wait_for(lambda: all(run_of(api, c, r)["status"] == "completed" for c, r in ids), 90,
             what="every run completed")
    spans = [(row["started_at"], row["ended_at"]) for row in (run_of(api, c, r) for c, r in ids)]
    # The most runs that were running at any one moment, from their own times.
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak <= RUNNER, spans


def test_a_resumption_runs_on_the_company_revision_its_run_pinned(api):
    """Last: it applies a new revision. The run that asked for an approval
    pinned revision n; the company changes the rule's reply in n+1; the
    resumption after the decision answers as n did."""
    conv = api.conversation("clerk")
    title = f"pinned {uuid.uuid4().hex[:8]}"
    r, events = api.stream(f"/v1/conversations/{conv}/runs", {"input": f"create a task {title}", "stream": True})
    approval = next(e[2]["approval"] for e in events if e[1] == "approval.requested")
    pinned = run_of(api, conv, events[0][2]["run"])["revision"]
    changed = yaml.safe_load(COMPANY)
    changed["providers"]["scripted"]["rules"][0]["reply"] = "Changed: {tools}"
    rev = api.ok("POST", "/v1/company", 201, json=changed)["rev"]
    assert rev > pinned
    wait_for(lambda: api.http.get("/v1/company").json().get("rev") == rev, 20, what="the new revision in force")
    api.ok("POST", f"/v1/approvals/{approval}", json={"decision": "approve"})
    wait_for(lambda: api.ok("GET", f"/v1/conversations/{conv}")["conversation"]["status"] == "idle", 30,
             what="resumed and done")
    last = api.ok("GET", f"/v1/conversations/{conv}", params={"limit": 500})["messages"][-1]
    assert last["role"] == "assistant" and last["text"].startswith("Created:"), last
    resumed = api.ok("GET", f"/v1/conversations/{conv}/runs")["items"][-1]
    assert resumed["revision"] == pinned and resumed["approval"] == approval
    # A new run pins the revision in force.
    r, events = api.stream(f"/v1/conversations/{api.conversation()}/runs", {"input": "create a task x", "stream": True})
    assert events[-1][2]["reply"].startswith("Changed:")


def test_listings_page_through_everything_once(api):
    convs = {api.conversation() for _ in range(3)}
    seen, cursor, pages = [], None, 0
    while True:
        page = api.ok("GET", "/v1/conversations", params={"seat": "ceo", "limit": 2,
                                                          **({"cursor": cursor} if cursor else {})})
        seen += [c["id"] for c in page["items"]]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) and convs <= set(seen) and pages >= 2
    everything = api.ok("GET", "/v1/conversations", params={"seat": "ceo", "limit": 500})["items"]
    assert [c["id"] for c in everything] == seen  # newest first, the same order
    problem(api.http.get("/v1/conversations", params={"cursor": "garbage"}), 400, "bad_cursor")

