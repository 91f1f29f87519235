"""The HTTP API across a fleet: three data nodes, each with ingress.

One fleet for the whole module, in the production shape: three data nodes
whose embedded brokers are one R3 JetStream cluster (tests/fleet/test_cluster's
``make_members``), all four roles on each, fast fleet timings. Every node
has the github integration's secret in its environment (``secret_env``), and
makes its own first-start admin token. Everything is real HTTP to each node's
ingress on loopback.

The tests run in file order and the last one kills a node whole.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import pytest

from tests.conftest import Nodes, wait_for
from tests.estate import query
from tests.fleet.test_cluster import make_members
from tests.fleet.test_fleet import apply
from tests.integration.test_hooks_api import (SECRETS, api_token, api_url, company_in_force,
                                              github_delivery, http, post_hook, secrets_env, settled_mail,
                                              wait_trimmed_once)
from tests.seats import held, write_company

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(300)]

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
# A stopped (SIGSTOPped) applier must not be ended by crewletd for its silence.
PATIENT = {"heartbeat_grace": 120, "wedge_after": 120}
IDS = ("fa", "fb", "fc")
# Seconds past the lease TTL a dead node may take to show as gone: the lease's
# expiry is the broker's, and the dead node's broker may have led the bucket's
# stream (an election is ~5-6 s).
GONE_MARGIN = 12.0

COMPANY = """
company: {name: t}
providers: {p: {kind: scripted}}
seats:
  - {name: cto, persona: the cto, provider: p}
  - {name: ops, persona: operations, provider: p}
  - {name: qa, persona: quality, provider: p}
integrations:
  github:
    kind: github
    secret_env: CW_TEST_GITHUB_SECRET
    routes:
      - {event: issues, repository: acme/web, seat: cto}
"""


@pytest.fixture(scope="module")
def fleet():
    """Three data nodes with ingress, the company applied: ``(nodes, tokens)``."""
    made = Nodes()
    try:
        nodes, _ = make_members(made, ids=IDS, cluster="apitest", fleet=FAST, supervisor=PATIENT)
        for node in nodes:  # not waiting for each: a member is ready only once a quorum is
            node.start(wait_ready=False, prefix=secrets_env({"CW_TEST_GITHUB_SECRET":
                                                             SECRETS["CW_TEST_GITHUB_SECRET"]}))
        for node in nodes:
            node.wait_running(timeout=90)
        apply(nodes[0], write_company(made.dir, COMPANY, "api-fleet.yaml"))
        wait_for(lambda: len(held(nodes[0])) == 3, 60, what="the three seats held")
        tokens = [api_token(n) for n in nodes]
        for node, token in zip(nodes, tokens):
            wait_for(lambda: company_in_force(node, token), 30, what="the company in force at ingress")
        wait_trimmed_once(nodes)
        yield nodes, tokens
    finally:
        made.close()


def get(node, path: str, token: str) -> tuple[int, dict]:
    return http("GET", f"{api_url(node)}{path}", token=token)


def fleet_view(node, token: str) -> dict[str, dict]:
    status, body = get(node, "/v1/fleet", token)
    assert status == 200, body
    return {n["id"]: n for n in body["nodes"]}


def test_every_node_answers_reads_with_its_own_token(fleet):
    """Each node made its own api-token; with it, each answers GET /v1/fleet
    (itself answering, all three nodes up, the revision in force), /v1/seats
    (the company's seats) and /v1/tasks. Another node's token is a 401 there."""
    nodes, tokens = fleet
    assert len(set(tokens)) == 3
    for i, (node, token) in enumerate(zip(nodes, tokens)):
        me = IDS[i]
        wait_for(lambda: {k: v["state"] for k, v in fleet_view(node, token).items()}
                 == {n: "up" for n in IDS}, 20, interval=0.2, what=f"{me} sees three nodes up")
        status, body = get(node, "/v1/fleet", token)
        assert status == 200 and body["node"] == me, body
        assert body["company"]["rev"] >= 1, body["company"]
        assert all(set(n["roles"]) == {"data", "ingress", "seats", "workers"} for n in body["nodes"])

        status, seats = get(node, "/v1/seats", token)
        assert status == 200, seats
        assert [s["seat"] for s in seats["items"]] == ["cto", "ops", "qa"]
        wait_for(lambda: all(s["owner"] in IDS for s in get(node, "/v1/seats", token)[1]["items"]), 20,
                 interval=0.2, what=f"{me} shows every seat's owner")

        status, tasks = get(node, "/v1/tasks", token)
        assert status == 200 and isinstance(tasks["items"], list), tasks

        other = tokens[(i + 1) % 3]
        status, body = get(node, "/v1/fleet", other)
        assert (status, body["code"]) == (401, "unauthorized"), body


def test_a_task_created_through_one_node_is_read_through_the_others(fleet):
    """POST /v1/tasks on fa; GET /v1/tasks/{id} and the listing on fb and fc."""
    (a, b, c), (ta, tb, tc) = fleet
    title = f"fix the login page {uuid.uuid4().hex[:6]}"
    status, made = http("POST", f"{api_url(a)}/v1/tasks", json.dumps({"title": title}).encode(), token=ta)
    assert status == 201, made
    task = made["task"]
    assert task["title"] == title and task["id"].startswith("T")
    for node, token in ((b, tb), (c, tc)):
        status, got = wait_for(lambda: (lambda r: r if r[0] == 200 else None)(
            get(node, f"/v1/tasks/{task['id']}", token)), 20, interval=0.2,
            what=f"{task['id']} read through {node.config['node']['id']}")
        assert got["task"]["title"] == title and got["comments"] == []
        status, listing = get(node, "/v1/tasks", token)
        assert status == 200 and task["id"] in [t["id"] for t in listing["items"]]


def test_the_same_delivery_posted_to_two_nodes_is_one_mail(fleet):
    """A delivery posted to fa and then to fb (a sender's retry that a load
    balancer sent elsewhere) is stored once — fb answers duplicate:true — and
    another posted to fb and fc at the same moment: both answered 200. Each
    is exactly one mail to cto."""
    (a, b, c), _ = fleet
    first = f"gh-{uuid.uuid4().hex[:12]}"
    status, body = post_hook(a, "github", github_delivery(first))
    assert status == 200 and body["duplicate"] is False and body["seat"] == "cto", body
    status, body = post_hook(b, "github", github_delivery(first))
    assert status == 200 and body["duplicate"] is True, body

    both = f"gh-{uuid.uuid4().hex[:12]}"
    answers: dict[str, tuple] = {}
    go = threading.Barrier(2)

    def send(node) -> None:
        go.wait(10)
        answers[node.config["node"]["id"]] = post_hook(node, "github", github_delivery(both))
    threads = [threading.Thread(target=send, args=(n,)) for n in (b, c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    failed = [e for n in (b, c) for e in n.events_named("webhook_store_failed")]
    assert {n: s for n, (s, _) in answers.items()} == {"fb": 200, "fc": 200}, (answers, failed)
    assert settled_mail(a, [first, both]) == {first: {"cto": 1}, both: {"cto": 1}}


def test_with_its_applier_stopped_a_node_answers_tracker_reads_through_a_peer(fleet):
    """fb's applier is stopped (SIGSTOP): fb's copy goes out of service (its
    own GET /v1/fleet says so) and falls behind. A task created through fc
    meanwhile is not in fb's copy, yet fb's API answers GET /v1/tasks/{id}
    and lists it: answered by a peer. Let go, fb's applier catches up."""
    (a, b, c), (ta, tb, tc) = fleet
    applier = b.process_pids()["data_applier"]
    os.kill(applier, signal.SIGSTOP)
    try:
        title = f"while fb's applier is stopped {uuid.uuid4().hex[:6]}"
        status, made = http("POST", f"{api_url(c)}/v1/tasks", json.dumps({"title": title}).encode(), token=tc)
        assert status == 201, made
        task_id = made["task"]["id"]

        def read_through_b():
            status, got = get(b, f"/v1/tasks/{task_id}", tb)
            return got if status == 200 else None
        got = wait_for(read_through_b, 30, interval=0.2, what=f"{task_id} read through fb")
        assert got["task"]["title"] == title
        assert query(b, "task.get", id=task_id)["task"] is None  # not from fb's own copy
        status, listing = get(b, "/v1/tasks", tb)
        assert status == 200 and task_id in [t["id"] for t in listing["items"]]

        def out_of_service():
            copy = fleet_view(b, tb)["fb"].get("copy") or {}
            return copy if copy.get("in_service") is False else None
        copy = wait_for(out_of_service, 30, interval=0.5, what="fb's copy out of service in fb's fleet view")
        assert copy["reason"] == "applier stopped", copy
        assert query(b, "task.get", id=task_id)["task"] is None
    finally:
        os.kill(applier, signal.SIGCONT)
    wait_for(lambda: (query(b, "task.get", id=task_id)["task"] or {}).get("title") == title, 30,
             interval=0.2, what="fb's copy caught up")
    wait_for(lambda: (fleet_view(b, tb)["fb"].get("copy") or {}).get("in_service") is True, 30,
             interval=0.5, what="fb's copy back in service")


def test_a_node_killed_whole_shows_as_gone_within_the_lease_ttl(fleet):
    """SIGKILL of fc's whole process tree (crewletd, broker, roles): fa's and
    fb's GET /v1/fleet show fc ``gone`` within the lease TTL and a margin, and
    fa and fb up (the two brokers left keep the cluster's quorum)."""
    (a, b, c), (ta, tb, tc) = fleet
    assert fleet_view(a, ta)["fc"]["state"] == "up"
    c.kill_tree()
    killed = time.monotonic()

    def states(node, token) -> dict[str, str] | None:
        try:
            status, body = get(node, "/v1/fleet", token)
        except OSError:
            return None
        return {n["id"]: n["state"] for n in body["nodes"]} if status == 200 else None

    for node, token in ((a, ta), (b, tb)):
        wait_for(lambda: (states(node, token) or {}).get("fc") == "gone",
                 killed + FAST["lease_ttl"] + GONE_MARGIN - time.monotonic(), interval=0.1,
                 what=f"fc gone in {node.config['node']['id']}'s view")
        row = fleet_view(node, token)["fc"]
        assert row["gone_at"] is not None and row["children"] is None and row["seats"] == 0
    # A leader election after the kill may have let a survivor's presence lapse
    # for a moment (its TTL is 3 s here); it renews itself once the bucket answers.
    wanted = {"fa": "up", "fb": "up", "fc": "gone"}
    wait_for(lambda: states(a, ta) == wanted and states(b, tb) == wanted, 20, interval=0.2,
             what="fa and fb up, fc gone, in both views")
