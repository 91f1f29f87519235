"""The /v1 API of real nodes, over real HTTP on loopback.

Two nodes serve the whole module, each started once (a start and its seat
claims take seconds):

* ``main``: the sample company (etc/company.yaml), its first-start admin
  token (the run dir's ``api-token``), default limits. Mail and turns, the
  tracker, the knowledge base, the company, the live feed, the fleet, the seats.
* ``guarded``: configured tokens (read, write and admin, kept as their
  sha256), ``metrics_open``, ``max_body: 2048``, and a small company with a
  seat no node may hold (``sink``: its mail stays in its mailbox). Scopes, the
  body limit, dead letters.

Every call is HTTP (httpx2) or WebSocket (websockets) to the node's ingress;
NATS to the broker only for what the API cannot do itself: spend a mail's
delivery budget. Waits are conditions with deadlines, never bare sleeps. The
test that greps the logs for tokens runs last: it looks at what all the others
left behind.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import time
import uuid
from dataclasses import dataclass

import httpx2
import pytest
import yaml
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from crewlet import tokens
from crewlet.queue.base import DELIVERY_BUDGET
from crewlet.queue.jetstream import JetStreamMailboxes
from tests.conftest import Node, Nodes, wait_for
from tests.seats import SAMPLE, held, node_url, read_nats

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
MAX_BODY = 2048
PROBLEM = "application/problem+json"
GUARDED_COMPANY = """
company: {name: Guarded}
providers:
  scripted:
    kind: scripted
    rules:
      - {match: '.*', reply: Noted.}
seats:
  - {name: ceo, persona: You run the place., provider: scripted}
  - {name: cto, persona: You build it., provider: scripted}
  - name: sink
    persona: Nobody may hold this seat.
    provider: scripted
    placement: {labels: {zone: nowhere}}
"""
# The names of guarded's tokens, by scope: what its logs show of them.
NAMES = {"read": "reader", "write": "writer", "admin": "operator"}
# What a route's path parameters are filled with when a test calls every route.
PATH_PARAMS = {"seat": "ceo", "id": "T1", "path": "eng/deploy", "seq": "1", "integration": "github",
               "conversation": "c-none", "run": "r-none", "approval": "a-none", "project": "site",
               "node": "no-such-node",  # never the node under test: it would be drained
               "name": "token-test-secret"}


class Api:
    """HTTP to one node's ingress; ``api(method, path, as_="write")`` sends that
    token (``as_=None``: none)."""

    def __init__(self, node: Node, secrets: dict[str, str]):
        self.node, self.tokens = node, secrets
        listen = node.config["ingress"]["listen"]
        self.base = f"http://{listen}"
        self.ws_url = f"ws://{listen}/v1/ws"
        # trust_env off: loopback, never through a proxy from the environment.
        self.http = httpx2.Client(base_url=self.base, timeout=60, trust_env=False)

    def __call__(self, method: str, path: str, *, as_: str | None = "admin", headers=None,
                 **kw) -> httpx2.Response:
        headers = dict(headers or {})
        if as_ is not None:
            headers["Authorization"] = f"Bearer {self.tokens[as_]}"
        return self.http.request(method, path, headers=headers, **kw)

    def ok(self, method: str, path: str, status: int = 200, **kw) -> dict:
        r = self(method, path, **kw)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        return r.json()

    def operations(self) -> list[tuple[str, str]]:
        """Every (METHOD, path template) of the live OpenAPI document."""
        doc = self.http.get("/v1/openapi.json").json()
        return [(method.upper(), path) for path, ops in doc["paths"].items() for method in ops]


@dataclass
class Apis:
    main: Api
    guarded: Api


@pytest.fixture(scope="module")
def nodes():
    made = Nodes()
    secrets = {scope: tokens.new_token() for scope in tokens.SCOPES}
    started: list[Node] = []
    try:
        main = made(fleet=FAST)
        guarded = made(node={"id": "g1"}, fleet=FAST, ingress={
            "metrics_open": True, "max_body": MAX_BODY, "tokens": [
                {"name": NAMES[scope], "sha256": tokens.digest(secret), "scopes": [scope]}
                for scope, secret in secrets.items()]})
        company = os.path.join(guarded.dir, "company.yaml")
        with open(company, "w") as f:
            f.write(GUARDED_COMPANY)
        # Both start at once: a node's start is mostly waiting on its own children.
        for node, path in ((main, SAMPLE), (guarded, company)):
            node.start(wait_ready=False, args=("--company", path))
            started.append(node)
        for node in started:
            node.wait_running()
        wait_for(lambda: len(held(main)) == 30, 60, what="all 30 seats of main held")
        wait_for(lambda: {"ceo", "cto"} <= set(held(guarded)), 30, what="ceo and cto of guarded held")
        apis = Apis(Api(main, {"admin": tokens.read_admin_token(main.run_dir)}), Api(guarded, secrets))
        for api in (apis.main, apis.guarded):  # the ingress follows the company on its own
            wait_for(lambda: api("GET", "/v1/company").json().get("rev"), 20, what="the company in ingress")
        yield apis
        for api in (apis.main, apis.guarded):
            api.http.close()
    finally:
        made.close()


@pytest.fixture(scope="module")
def main(nodes) -> Api:
    return nodes.main


@pytest.fixture(scope="module")
def guarded(nodes) -> Api:
    return nodes.guarded


# -------------------------------------------------------------------- helpers

def problem(r: httpx2.Response, status: int, code: str | None = None) -> dict:
    """*r* is the problem (RFC 9457) *status*, with *code*: its body."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body = r.json()
    assert body["status"] == status and body["title"] and body["detail"], body
    if code is not None:
        assert body["code"] == code, body
    return body


def fill(template: str, **params: str) -> str:
    """A concrete path for a path template (KeyError for a parameter nobody named)."""
    values = {**PATH_PARAMS, **params}
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], template)


def sample_company() -> dict:
    """etc/company.yaml as a document, named as the company test applies it."""
    with open(SAMPLE) as f:
        company = yaml.safe_load(f)
    company["company"]["name"] = "Lantern Software (API)"  # in place of ${CREWLET_COMPANY_NAME:-…}
    return company


def key() -> str:
    return uuid.uuid4().hex


def cursor_of(position) -> str:
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")


def walk(api: Api, path: str, *, as_: str = "admin", **params) -> tuple[list[dict], int]:
    """Every item of a listing, page by page through ``next``; (items, pages)."""
    items, pages, cursor = [], 0, None
    while True:
        query = dict(params, **({"cursor": cursor} if cursor else {}))
        page = api.ok("GET", path, params=query, as_=as_)
        items += page["items"]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            return items, pages
        assert pages < 200, "a listing that never ends"


def mail(api: Api, seat: str, text: str, *, wait: float | None = 30, trigger: str | None = None,
         as_: str = "admin") -> dict:
    body = {"text": text, **({"wait": wait} if wait else {})}
    headers = {"Idempotency-Key": trigger} if trigger else {}
    return api.ok("POST", f"/v1/seats/{seat}/mail", 202, json=body, headers=headers, as_=as_)


def turns_of(api: Api, seat: str, trigger: str) -> list[dict]:
    page = api.ok("GET", "/v1/turns", params={"seat": seat, "limit": 500})
    return [t for t in page["items"] if t["trigger"] == trigger]


class EventStream:
    """One ``GET /v1/events`` stream, read event by event with deadlines."""

    def __init__(self, api: Api, last_event_id: str | None = None, as_: str = "admin"):
        headers = {"Authorization": f"Bearer {api.tokens[as_]}"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self._stream = api.http.stream("GET", "/v1/events", headers=headers,
                                       timeout=httpx2.Timeout(10, read=30))
        self.response = self._stream.__enter__()
        assert self.response.status_code == 200, self.response.read()
        assert self.response.headers["content-type"].startswith("text/event-stream")
        self._lines = self.response.iter_lines()

    def next(self) -> dict:
        event: dict = {}
        for line in self._lines:
            if not line:
                if "event" in event:
                    return event
                continue  # the end of a block that is no event (the stream's retry:)
            if line.startswith(":"):
                continue  # keepalive
            field, _, value = line.partition(": ")
            if field == "data":
                event["data"] = json.loads(value)
            elif field in ("id", "event"):
                event[field] = value
        raise AssertionError("the event stream ended")

    def until(self, match, timeout: float = 30.0) -> tuple[dict, list[dict]]:
        """Events until one *match*es: (it, every event read, it included)."""
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            event = self.next()
            seen.append(event)
            if match(event):
                return event, seen
        raise AssertionError(f"no matching event within {timeout}s: {[e['event'] for e in seen]}")

    def close(self) -> None:
        self._stream.__exit__(None, None, None)


def turn_event(trigger: str):
    return lambda e: (e["event"] == "turn" and e["data"].get("trigger") == trigger
                      and e["data"].get("outcome") not in (None, "running"))


def ids_of(event_ids: list[str]) -> list[int]:
    return [int(i.rpartition("-")[2]) for i in event_ids]


# ---------------------------------------------------------------- tokens

def test_every_route_without_a_token_is_a_401_with_a_challenge(guarded, main):
    operations = guarded.operations()
    assert len(operations) >= 19 and ("POST", "/v1/company") in operations and \
        ("GET", "/v1/events") in operations, operations
    for api in (guarded, main):
        for method, template in api.operations():
            if template.startswith("/v1/hooks/"):
                continue  # webhooks prove themselves by signature, not token
            body = {} if method in ("POST", "PUT", "PATCH") else None
            for headers in ({}, {"Authorization": "Bearer cwl_nobody-knows-this-one"},
                            {"Idempotency-Key": "not a key"}):  # the token is checked first
                r = api(method, fill(template), as_=None, headers=headers, json=body)
                problem(r, 401, "unauthorized")
                assert r.headers["www-authenticate"] == 'Bearer realm="crewlet"', (method, template)
    assert "does not know" in problem(guarded("GET", "/v1/fleet", as_=None, headers={
        "Authorization": "Bearer cwl_nobody-knows-this-one"}), 401)["detail"]


def test_a_read_token_cannot_write_and_a_write_token_cannot_apply_a_company(guarded):
    writes = [(m, t) for m, t in guarded.operations()
              if m in ("POST", "PUT", "PATCH") and not t.startswith("/v1/hooks/")]
    assert len(writes) == 19, writes
    for method, template in writes:
        body = problem(guarded(method, fill(template), as_="read", json={}), 403, "forbidden")
        assert "reader" in body["detail"] and "this needs" in body["detail"], body
    body = problem(guarded("POST", "/v1/company", as_="write", json={}), 403, "forbidden")
    assert body["detail"].endswith("this needs admin"), body
    # Reads are what a read token is for.
    assert guarded.ok("GET", "/v1/fleet", as_="read")["node"] == "g1"
    assert guarded.ok("GET", "/v1/seats/ceo", as_="read")["seat"] == "ceo"


def test_health_and_readiness_need_no_token(main):
    r = main("GET", "/healthz", as_=None)
    assert r.status_code == 200 and r.json() == {"status": "ok", "node": "t1"}
    # Ready: asked until it says so (a copy unheard for 5 s on a loaded machine is, rightly, not).
    r = wait_for(lambda: (r := main("GET", "/readyz", as_=None)).status_code == 200 and r, 15,
                 what="/readyz ready")
    assert r.json()["ready"] is True and r.json()["not_running"] == [], r.text


def test_metrics_need_a_token_unless_configured_open(main, guarded):
    problem(main("GET", "/metrics", as_=None), 401, "unauthorized")
    assert mail(main, "ceo", "hello metrics")["turn"]["outcome"] == "done"

    def counted():  # the ingress counts a turn when its own projection sees the record
        r = main("GET", "/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
        return [line for line in r.text.splitlines()
                if line.startswith("crewlet_turns_total{") and 'seat="ceo"' in line]
    line = wait_for(counted, 10, what="crewlet_turns_total of ceo")[0]
    assert float(line.rsplit(" ", 1)[1]) >= 1, line
    r = guarded("GET", "/metrics", as_=None)  # ingress.metrics_open
    assert r.status_code == 200 and "crewlet_" in r.text


def test_metrics_say_what_retention_removed(main):
    """The maintenance duty's totals (from its last sweep's report, by what)
    and this data node's pruned events are on /metrics."""
    def removed():
        text = main("GET", "/metrics").text
        return {line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line.startswith("crewlet_retention_removed_total{")}
    async def reported(nc, js):
        from crewlet.coord import buckets, duty_reports
        totals = ((await duty_reports.read(js, "maintenance")) or {}).get("totals") or {}
        _, data = await buckets.last(js, buckets.STATUS.name, "estate.t1")
        pruned = json.loads(data).get("events_pruned") if data else None
        return {**{f'node="",what="{w}"': float(totals[w]) for w in ("turns", "mail", "mailboxes") if w in totals},
                **({'node="t1",what="events"': float(pruned)} if isinstance(pruned, int) else {})}

    def agree():
        got, said = removed(), read_nats(node_url(main.node), reported)
        return len(got) == 4 and got == said and got
    got = wait_for(agree, 15, what="the retention counters saying what the duty and the applier reported")
    assert set(got) == {'node="",what="turns"', 'node="",what="mail"', 'node="",what="mailboxes"',
                        'node="t1",what="events"'}, got


# ---------------------------------------------------------------- mail and turns

def test_mail_with_wait_answers_the_turn_and_a_key_sent_twice_is_worked_once(main):
    trigger = key()
    sent = mail(main, "ceo", "hello there", trigger=trigger)
    assert sent["seat"] == "ceo" and sent["trigger"] == trigger and sent["seq"] >= 1
    turn = sent["turn"]
    assert turn["outcome"] == "done" and turn["trigger"] == trigger and turn["seat"] == "ceo", turn
    assert turn["reply"].startswith("Hello!") and turn["sender"] == "api:admin@t1", turn

    assert sent["duplicate"] is False and sent["worked"] is False
    again = mail(main, "ceo", "hello there", trigger=trigger, wait=None)
    assert (again["seq"], again["trigger"]) == (sent["seq"], trigger)  # the mailbox kept the first
    assert again["duplicate"] is True
    # Waiting on a repeat of worked mail is answered at once: no turn will come.
    started = time.monotonic()
    again = mail(main, "ceo", "hello there", trigger=trigger, wait=30)
    assert time.monotonic() - started < 5 and again["turn"] is None
    assert (again["duplicate"], again["worked"]) == (True, True)
    # Mail is worked in order: once a later one's turn is recorded, a second turn of
    # the repeat would be too.
    later = key()
    assert mail(main, "ceo", "hello again", trigger=later)["turn"]["outcome"] == "done"
    wait_for(lambda: turns_of(main, "ceo", later), 20, what="the later turn recorded")
    assert len(turns_of(main, "ceo", trigger)) == 1

    problem(main("POST", "/v1/seats/nobody/mail", json={"text": "hi"}), 404, "no_such_seat")
    body = problem(main("POST", "/v1/seats/ceo/mail", json={"text": ""}), 422, "invalid")
    assert "body.text" in body["detail"], body
    problem(main("POST", "/v1/seats/ceo/mail", json={"text": " \n "}), 422, "invalid")
    problem(main("POST", "/v1/seats/ceo/mail", json={"text": "hi"}, headers={"Idempotency-Key": "not a key"}),
            400, "bad_idempotency_key")
    problem(main("POST", "/v1/seats/ceo/mail", json={"text": "hi", "wait": 1000}), 422, "invalid")


def test_turns_page_back_through_older_records_with_since_and_a_cursor(main):
    triggers = [key() for _ in range(3)]
    for trigger in triggers:
        assert mail(main, "cto", f"note {trigger}", trigger=trigger)["turn"]["outcome"] == "done"
    wait_for(lambda: all(turns_of(main, "cto", t) for t in triggers), 20, what="the three turns recorded")

    everything = main.ok("GET", "/v1/turns", params={"seat": "cto", "limit": 500})["items"]
    walked, pages = walk(main, "/v1/turns", seat="cto", limit=1)
    assert len(everything) >= 3 and pages >= len(everything)
    assert [t["seq"] for t in walked] == [t["seq"] for t in everything]
    seqs = [t["seq"] for t in walked]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs)  # newest first, once each
    assert {t["seat"] for t in walked} == {"cto"}

    since = next(t for t in everything if t["trigger"] == triggers[1])["started_at"]
    recent = main.ok("GET", "/v1/turns", params={"seat": "cto", "since": since})["items"]
    assert {t["trigger"] for t in recent} >= set(triggers[1:]) and triggers[0] not in {
        t["trigger"] for t in recent}
    assert all(t["started_at"] >= since for t in recent)
    walked, _ = walk(main, "/v1/turns", seat="cto", since=since, limit=1)
    assert [t["seq"] for t in walked] == [t["seq"] for t in recent]
    # All seats' turns, paged the same way.
    walked, _ = walk(main, "/v1/turns", limit=7)
    assert len({t["seq"] for t in walked}) == len(walked) and set(triggers) <= {t["trigger"] for t in walked}


# ---------------------------------------------------------------- the tracker

def test_tasks_are_created_once_per_key_changed_with_expect_rev_and_commented(main):
    k = key()
    created = main.ok("POST", "/v1/tasks", 201, json={"title": "fix the login page", "labels": ["web"],
                                                      "assignee": "cto"}, headers={"Idempotency-Key": k})
    task = created["task"]
    assert (task["title"], task["status"], task["rev"], task["assignee"]) == \
        ("fix the login page", "open", 1, "cto") and re.match(r"^T\d+$", task["id"])
    again = main.ok("POST", "/v1/tasks", 201, json={"title": "fix the login page", "labels": ["web"],
                                                    "assignee": "cto"}, headers={"Idempotency-Key": k})
    assert again["task"]["id"] == task["id"]

    tid = task["id"]
    assert main.ok("GET", f"/v1/tasks/{tid}")["task"]["title"] == "fix the login page"
    changed = main.ok("PATCH", f"/v1/tasks/{tid}", json={"status": "doing", "expect_rev": 1})["task"]
    assert (changed["status"], changed["rev"]) == ("doing", 2)
    stale = main("PATCH", f"/v1/tasks/{tid}", json={"status": "done", "expect_rev": 1})
    body = problem(stale, 409, "conflict")
    assert "rev 2" in body["detail"], body
    comment = main.ok("POST", f"/v1/tasks/{tid}/comments", 201, json={"body": "on it"})
    assert comment["task"] == tid and comment["body"] == "on it"
    shown = main.ok("GET", f"/v1/tasks/{tid}")
    assert shown["task"]["rev"] == 2 and [c["body"] for c in shown["comments"]] == ["on it"]
    # The same key on another kind of write is another write, not the task's outcome.
    page = main.ok("PUT", "/v1/pages/eng/keyed", 201, json={"title": "Keyed", "body": "x"},
                   headers={"Idempotency-Key": k})
    assert page["path"] == "eng/keyed"

    missing = "T999999999"
    problem(main("GET", f"/v1/tasks/{missing}"), 404, "not_found")
    problem(main("PATCH", f"/v1/tasks/{missing}", json={"status": "done"}), 404, "not_found")
    problem(main("POST", f"/v1/tasks/{missing}/comments", json={"body": "hello?"}), 404, "not_found")
    problem(main("POST", "/v1/tasks", json={"title": "x", "labels": [""]}), 422, "invalid")
    problem(main("PATCH", f"/v1/tasks/{tid}", json={"expect_rev": 2**70}), 422, "invalid")


def test_task_listings_page_with_a_cursor_missing_nothing(main):
    mine = [main.ok("POST", "/v1/tasks", 201, json={"title": f"paged {n}", "assignee": "qa-1"})["task"]["id"]
            for n in range(11)]
    walked, pages = walk(main, "/v1/tasks", assignee="qa-1", limit=4)
    ids = [t["id"] for t in walked]
    assert pages >= 3 and sorted(ids) == sorted(mine) and len(set(ids)) == len(ids)
    numbers = [int(i[1:]) for i in ids]
    assert numbers == sorted(numbers, reverse=True)  # newest first
    walked, _ = walk(main, "/v1/tasks", limit=5)  # all of them, others' tasks too
    ids = [t["id"] for t in walked]
    assert len(set(ids)) == len(ids) and set(mine) <= set(ids)
    opened, _ = walk(main, "/v1/tasks", status="open", assignee="qa-1", limit=3)
    assert sorted(t["id"] for t in opened) == sorted(mine)


# ---------------------------------------------------------------- the knowledge base

def test_pages_are_written_replaced_listed_and_found(main):
    word = "zq" + key()[:10]
    path = f"eng/deploy-{word}"
    first = main.ok("PUT", f"/v1/pages/{path}", 201, json={"title": "Deploy", "body": "run make deploy"})
    assert (first["path"], first["version"]) == (path, 1)
    second = main.ok("PUT", f"/v1/pages/{path}", 200, json={"title": "Deploy",
                                                             "body": f"run make deploy from main {word}"})
    assert second["version"] == 2
    shown = main.ok("GET", f"/v1/pages/{path}")
    assert shown["version"] == 2 and word in shown["body"]
    body = problem(main("PUT", f"/v1/pages/{path}", json={"title": "x", "body": "y", "expect_version": 1}),
                   409, "conflict")
    assert "version 2" in body["detail"], body
    problem(main("GET", f"/v1/pages/eng/nothing-{word}"), 404, "not_found")

    def found():
        answer = main.ok("GET", "/v1/search", params={"q": word})
        return answer if answer["searched"] and any(h["path"] == path for h in answer["hits"]) else None
    wait_for(found, 20, what="the page found by search")
    assert main.ok("GET", "/v1/search", params={"q": "?!"})["hits"] == []  # no word: nothing matches

    prefix = f"kb-{word}/"
    paths = [main.ok("PUT", f"/v1/pages/{prefix}p{n}", 201, json={"title": f"P{n}", "body": "b"})["path"]
             for n in range(5)]
    walked, pages = walk(main, "/v1/pages", prefix=prefix, limit=2)
    assert [p["path"] for p in walked] == sorted(paths) and pages == 3
    assert all("body" not in p for p in walked)  # a list is lines: the page has the body
    # A path not in its one form is refused, never stored nor rewritten (%2e: the
    # client would fold a literal "..").
    for bad in ("a//b", "eng/%2e%2e/%2e%2e/etc/passwd", "eng/", "Eng/x"):
        r = main("PUT", f"/v1/pages/{bad}", json={"title": "x", "body": "y"})
        assert r.status_code in (400, 404, 422), (bad, r.status_code, r.text)


# ---------------------------------------------------------------- errors

def test_bodies_past_max_body_are_a_413_problem(guarded):
    big = {"title": "x" * (MAX_BODY + 100)}
    body = problem(guarded("POST", "/v1/tasks", as_="write", json=big), 413, "body_too_large")
    assert str(MAX_BODY) in body["detail"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b'{"title": "' + b"y" * 500
    r = guarded("POST", "/v1/tasks", as_="write", content=chunks(),
                headers={"Content-Type": "application/json"})
    problem(r, 413, "body_too_large")
    # Under the limit, the same route answers as ever.
    assert guarded.ok("POST", "/v1/tasks", 201, as_="write", json={"title": "small"})["task"]["rev"] == 1


def test_malformed_requests_are_4xx_problems_with_a_reason(main):
    for raw in (b'{"title": ', b"not json", b"\xff\xfe", b"[]", b"null", b'{"title": 5}'):
        r = main("POST", "/v1/tasks", content=raw, headers={"Content-Type": "application/json"})
        assert 400 <= r.status_code < 500, (raw, r.status_code, r.text)
        assert r.headers["content-type"].startswith(PROBLEM) and r.json()["detail"], r.text
    assert "not JSON" in problem(main("POST", "/v1/tasks", content=b'{"title": ',
                                      headers={"Content-Type": "application/json"}), 422)["detail"]
    problem(main("POST", "/v1/tasks", json={"title": "x", "surprise": 1}), 422, "invalid")

    deep = base64.urlsafe_b64encode(b"[" * 3000).decode()
    for listing in ("/v1/seats", "/v1/turns", "/v1/tasks", "/v1/pages", "/v1/dlq"):
        for bad in ("nope!", cursor_of({"elsewhere": 1}), cursor_of({"after": 2**70, "before": 2**70}),
                    cursor_of([1]), deep):
            problem(main("GET", listing, params={"cursor": bad}), 400, "bad_cursor")
    for listing, position in (("/v1/turns", {"before": 2**70}), ("/v1/tasks", {"after": "T" + "9" * 30}),
                              ("/v1/dlq", {"after": 2**70}), ("/v1/seats", {"after": 5})):
        problem(main("GET", listing, params={"cursor": cursor_of(position)}), 400, "bad_cursor")

    for path in ("/v1/nothing", "/nothing", "/v1/seats/ceo/nothing"):
        problem(main("GET", path), 404, "not_found")
    r = main("OPTIONS", "/v1/company")
    problem(r, 405, "method_not_allowed")
    assert set(r.headers["allow"].split(", ")) == {"GET", "POST"}, r.headers  # every route of the path
    problem(main("POST", "/v1/dlq/18446744073709551616/requeue"), 422, "invalid")


# ---------------------------------------------------------------- the company

def test_an_admin_applies_a_company_revision_and_an_invalid_one_is_a_422_naming_the_key(main):
    before = main.ok("GET", "/v1/company")
    company = sample_company()
    company["seats"][1]["persona"] += " You also review API changes."
    applied = main.ok("POST", "/v1/company", 201, json=company)
    assert applied["rev"] > before["rev"] and applied["seats"] == 30

    def in_force():
        now = main.ok("GET", "/v1/company")
        return now if now["rev"] == applied["rev"] else None
    now = wait_for(in_force, 20, what=f"revision {applied['rev']} in force")
    assert now["name"] == "Lantern Software (API)" and now["digest"] == applied["digest"]
    assert now["company"]["seats"][1]["persona"].endswith("You also review API changes.")
    # The same company again (a retry whose answer was lost): no second revision.
    again = main.ok("POST", "/v1/company", 200, json=company)
    assert again == {**applied, "changed": False}, again
    assert main.ok("GET", "/v1/company")["rev"] == applied["rev"]

    wrong = copy.deepcopy(company)
    wrong["seats"][2]["provider"] = "nowhere"
    body = problem(main("POST", "/v1/company", json=wrong), 422, "invalid_company")
    assert body["key"] == "seats[2].provider" and "nowhere" in body["detail"], body
    wrong = copy.deepcopy(company)
    wrong["seats"][0]["surprise"] = True
    body = problem(main("POST", "/v1/company", json=wrong), 422, "invalid_company")
    assert body["key"] == "seats[0].surprise", body
    problem(main("POST", "/v1/company", content=b"seats: [", headers={"Content-Type": "application/yaml"}),
            422, "invalid_company")
    problem(main("POST", "/v1/company", content=b"x", headers={"Content-Type": "text/plain"}),
            415, "unsupported_media_type")
    assert main.ok("GET", "/v1/company")["rev"] == applied["rev"]  # nothing refused was stored


# ---------------------------------------------------------------- the live feed

def test_the_event_stream_opens_with_a_snapshot_and_resumes_after_an_id(main):
    feed = EventStream(main)
    try:
        snapshot = feed.next()
        assert snapshot["event"] == "snapshot" and snapshot["id"], snapshot
        assert {"nodes", "seats"} <= set(snapshot["data"]), list(snapshot["data"])
        trigger = key()
        mail(main, "ceo", "hello feed", trigger=trigger, wait=None)
        turn, _ = feed.until(turn_event(trigger))
        assert turn["data"]["seat"] == "ceo" and turn["data"]["outcome"] == "done"
    finally:
        feed.close()

    again = EventStream(main, last_event_id=snapshot["id"])
    try:
        replayed, seen = again.until(turn_event(trigger))
        assert seen[0]["event"] != "snapshot" and "snapshot" not in [e["event"] for e in seen]
        assert replayed["id"] == turn["id"]
        numbers = ids_of([e["id"] for e in seen])
        assert numbers == sorted(numbers) and numbers[0] > ids_of([snapshot["id"]])[0]
    finally:
        again.close()

    for unknown in ("0000-5", "nonsense"):
        fresh = EventStream(main, last_event_id=unknown)
        try:
            assert fresh.next()["event"] == "snapshot"
        finally:
            fresh.close()


def test_the_websocket_takes_its_token_as_the_first_message(main):
    with ws_connect(main.ws_url, open_timeout=10) as ws:
        ws.send(json.dumps({"token": main.tokens["admin"]}))
        first = json.loads(ws.recv(timeout=10))
        assert first["event"] == "snapshot" and first["id"] and "seats" in first["data"]
        trigger = key()
        mail(main, "ceo", "hello socket", trigger=trigger, wait=None)
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "no turn event on the socket"
            event = json.loads(ws.recv(timeout=10))
            if event["event"] == "turn" and event["data"].get("trigger") == trigger \
                    and event["data"].get("outcome") == "done":
                break
    for first in ({"token": "cwl_nobody-knows-this-one"}, {"nothing": 1}):
        with ws_connect(main.ws_url, open_timeout=10) as ws:
            ws.send(json.dumps(first))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


# ---------------------------------------------------------------- the fleet and the seats

def test_the_fleet_shows_this_node_up_with_its_children_running(main):
    def running():
        fleet = main.ok("GET", "/v1/fleet")
        me = next((n for n in fleet["nodes"] if n["id"] == "t1"), None)
        return (fleet, me) if me and me["children"] and me["seats"] == 30 and \
            all(c["state"] == "running" for c in me["children"]) else None
    fleet, me = wait_for(running, 15, what="t1 with its 30 seats and its children running in /v1/fleet")
    assert fleet["node"] == "t1" and fleet["company"]["rev"] >= 1
    assert me["state"] == "up" and me["gone_at"] is None
    assert {"data", "ingress", "seats", "workers"} <= set(me["roles"])
    assert {"broker", "data_applier", "ingress", "seats", "workers"} <= {c["name"] for c in me["children"]}
    assert "copy" in me  # by its alias


def test_the_seats_page_with_a_cursor_over_the_whole_company(main):
    company = {s["name"] for s in main.ok("GET", "/v1/company")["company"]["seats"]}
    assert len(company) == 30
    def all_held():
        walked, pages = walk(main, "/v1/seats", limit=7)
        return (walked, pages) if {s["owner"] for s in walked} == {"t1"} else None
    walked, pages = wait_for(all_held, 15, what="every seat held by t1 in /v1/seats")
    names = [s["seat"] for s in walked]
    assert pages == 5 and names == sorted(company)
    one = main.ok("GET", "/v1/seats/ceo")
    assert one["seat"] == "ceo" and one["owner"] == "t1" and isinstance(one["last_turns"], list)
    problem(main("GET", "/v1/seats/nobody"), 404, "no_such_seat")


# ---------------------------------------------------------------- dead letters

def test_a_dead_letter_is_listed_requeued_once_and_back_in_its_mailbox(guarded):
    trigger = key()

    async def spend_the_budget(nc, js):
        # sink: in the company, held by nobody, so only this reader fetches its mail.
        boxes = JetStreamMailboxes(js, nc)
        try:
            seq = await boxes.send("sink", b"poison pill", trigger=trigger)
            box = boxes.attach("sink")
            naks = 0
            while naks < DELIVERY_BUDGET:
                d = await box.next(wait=5)
                assert d is not None, f"the mail stopped coming after {naks} deliveries"
                if d.seq != seq:  # anything else in sink's mailbox is not this test's
                    await box.ack(d)
                    continue
                naks += 1
                assert d.deliveries == naks
                await box.nak(d)
            assert await box.next(wait=1) is None  # the next delivery was dead-lettered
            return seq
        finally:
            await boxes.close()

    seq = read_nats(node_url(guarded.node), spend_the_budget)
    letters = guarded.ok("GET", "/v1/dlq", params={"seat": "sink"}, as_="read")["items"]
    letter = next(d for d in letters if d["trigger"] == trigger)
    assert (letter["seat"], letter["text"], letter["original_seq"]) == ("sink", "poison pill", seq)
    assert letter["deliveries"] == DELIVERY_BUDGET + 1 and "budget" in letter["reason"]
    assert letter["seq"] in [d["seq"] for d in walk(guarded, "/v1/dlq", limit=1, as_="read")[0]]

    problem(guarded("POST", f"/v1/dlq/{letter['seq']}/requeue", as_="read"), 403, "forbidden")
    requeued = guarded.ok("POST", f"/v1/dlq/{letter['seq']}/requeue", as_="write")
    assert requeued["requeued"] == letter["seq"] and requeued["seq"] > seq
    body = problem(guarded("POST", f"/v1/dlq/{letter['seq']}/requeue", as_="write"), 404, "not_found")
    assert str(letter["seq"]) in body["detail"]
    left = guarded.ok("GET", "/v1/dlq", params={"seat": "sink"})["items"]
    assert trigger not in [d["trigger"] for d in left]

    async def fetch_it_back(nc, js):
        boxes = JetStreamMailboxes(js, nc)
        try:
            box = boxes.attach("sink")
            while True:
                d = await box.next(wait=5)
                assert d is not None, "the requeued mail is not in sink's mailbox"
                await box.ack(d)
                if d.seq == requeued["seq"]:
                    return d
        finally:
            await boxes.close()

    back = read_nats(node_url(guarded.node), fetch_it_back)
    assert (back.data, back.deliveries) == (b"poison pill", 1)
    assert back.trigger == f"{trigger}.requeue.{letter['seq']}"


# ---------------------------------------------------------------- tokens stay secret
# Last: it reads what every other test left behind.

WRITES = {
    ("POST", "/v1/seats/{seat}/mail"): {"text": "hello from the token test"},
    ("POST", "/v1/tasks"): {"title": "from the token test"},
    ("PATCH", "/v1/tasks/{id}"): {"status": "doing"},
    ("POST", "/v1/tasks/{id}/comments"): {"body": "token test"},
    ("PUT", "/v1/pages/{path}"): {"title": "Tokens", "body": "never in a log"},
    ("POST", "/v1/dlq/{seq}/requeue"): None,
    ("POST", "/v1/conversations"): {"seat": "cto"},
    ("POST", "/v1/conversations/{conversation}/runs"): {"input": "hello from the token test"},
    ("POST", "/v1/conversations/{conversation}/runs/{run}/cancel"): None,
    ("POST", "/v1/approvals/{approval}"): {"decision": "deny"},
    ("PUT", "/v1/files/{project}/{path}"): {"file": "never in a log"},
    ("DELETE", "/v1/files/{project}/{path}"): None,
    ("POST", "/v1/fleet/nodes/{node}/drain"): {"deadline": 5},
    ("POST", "/v1/fleet/nodes/{node}/undrain"): None,
    ("PUT", "/v1/secrets/{name}"): {"value": "from-the-token-test-0123", "grace": 0},
    ("POST", "/v1/admin/evict/{node}"): {"reason": "the token test"},
    ("DELETE", "/v1/secrets/{name}"): None,
    ("PUT", "/v1/skills/{name}"): {"files": [{"path": "SKILL.md", "body": "---\nname: token-test-secret\n"
                                              "description: The token test's.\n---\nNever in a log.\n"}]},
    ("DELETE", "/v1/skills/{name}"): None,
    ("POST", "/v1/skills/drafts/{name}/promote"): {"note": "the token test"},
    ("POST", "/v1/skills/drafts/{name}/reject"): None,
}


def _exercise(api: Api, who: str, company: dict) -> None:
    """Every route of *api* with token *who*: reads, writes (*company* for the
    company's), the feed, the socket."""
    writes = {**WRITES, ("POST", "/v1/company"): company}
    task = api("POST", "/v1/tasks", as_="admin", json={"title": "for the token test"}).json()["task"]["id"]
    for method, template in api.operations():
        path = fill(template, id=task, seat="cto")
        if template == "/v1/events":
            feed = EventStream(api, as_=who)
            assert feed.next()["event"] == "snapshot"
            feed.close()
            continue
        if template.startswith("/v1/hooks/"):  # no such integration: a 404, token or not
            r = api(method, path, as_=who, json={})
        else:
            r = api(method, path, as_=who, json=writes[(method, template)] if method != "GET" else None)
        assert r.status_code < 500, (method, template, r.status_code, r.text)
    for headers in ({"Authorization": f"Bearer {api.tokens[who]}"}, {}):
        with ws_connect(api.ws_url, open_timeout=10, additional_headers=headers) as ws:
            if not headers:
                ws.send(json.dumps({"token": api.tokens[who]}))
            assert json.loads(ws.recv(timeout=10))["event"] == "snapshot"


def _leaks(node: Node, secrets: list[str], *, allowed: set[str] = frozenset()) -> list[str]:
    """Where any of *secrets* is written: any file of the node's dir (its log,
    config, data dir: the estate, the broker's streams, the run dir)."""
    found = []
    for root, _, files in os.walk(node.dir):
        for name in files:
            path = os.path.join(root, name)
            if path in allowed or not os.path.isfile(path):  # sockets are not files
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:  # gone meanwhile (a temp file of the broker's)
                continue
            found += [f"{path}: {s[:8]}…" for s in secrets if s.encode() in data]
    return found


def test_tokens_never_appear_in_logs_or_data(main, guarded):
    for who in ("read", "write", "admin"):
        _exercise(guarded, who, yaml.safe_load(GUARDED_COMPANY))
    _exercise(main, "admin", sample_company())
    wait_for(lambda: '"caller":"writer"' in guarded.node.read_log(), 10, what="writes logged by token name")
    wait_for(lambda: '"caller":"admin@t1"' in main.node.read_log(), 10, what="the admin's writes logged")

    assert _leaks(guarded.node, list(guarded.tokens.values())) == []
    admin_file = tokens.admin_token_path(main.node.run_dir)
    assert _leaks(main.node, [main.tokens["admin"]], allowed={admin_file}) == []
    assert open(admin_file).read().strip() == main.tokens["admin"]  # where it is meant to be
