"""Turns across nodes: hand-over of mail in hand, and counters the fleet shares.

Nodes share one real broker (``stream.type: nats``), as in test_fleet; the
fleet's timings are shortened by config. Seats are pinned to nodes with
placement labels so each test knows which node works which seat.
"""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from tests.conftest import wait_for
from tests.fleet.test_fleet import apply, fleet_node
from tests.seats import (MCP_SERVER, ctl_json, deferrals, held, read_nats, turn_records, wait_napping,
                         worker_company, write_company)
from tests.integration.wire import WireServer

pytestmark = pytest.mark.fleet

def records(natsd) -> list[dict]:
    return read_nats(natsd.url, turn_records)


def write(dir: str, name: str, text: str) -> str:
    return write_company(dir, text, name)


HANDOVER = """
company: {{name: t}}
providers:
  p:
    kind: scripted
    rules:
      - match: 'long job'
        reply: done
        tools: [{{name: slow__nap, args: {{seconds: 20}}}}]
seats:
  - name: w
    persona: a worker
    provider: p
    mcp: [{{name: slow, command: {python}, args: [{server}]}}]
"""


def test_a_graceful_stop_hands_a_turn_in_progress_to_the_successor(natsd, make_node):
    """The stopping node NAKs the turn it cuts short; the successor redoes it at
    once — not after the 30-minute ack wait."""
    a = fleet_node(make_node, natsd, "a").start()
    apply(a, write(a.dir, "company.yaml", HANDOVER.format(python=sys.executable, server=MCP_SERVER)))
    wait_for(lambda: held(a).get("w") == "a", 20, what="a holds w")
    b = fleet_node(make_node, natsd, "b").start()
    ctl_json(a, "send", "w", "long job", "--trigger", "job-1")
    wait_napping(a, "w", 20)  # (a turn whose tool failed would be over, nothing to hand over)
    a.proc.send_signal(signal.SIGTERM)
    assert a.wait_exit(30) == 0
    wait_for(lambda: held(b).get("w") == "b", 20, what="b took w over")
    # b redoes the turn: its nap starts well before any ack wait could pass.
    wait_for(lambda: any(r["trigger"] == "job-1" and r["node"] == "a" and r["outcome"] == "interrupted"
                         for r in records(natsd)), 10, what="a's record of the interrupted turn")
    # Only a NAK can have put it in b's hands this soon: the ack wait is 30 min.
    naks = [e for e in a.events() if e.get("event") in ("seat_nak_failed", "seat_work_failed")]
    wait_for(lambda: any(c["name"] == "seats" and (c.get("stats") or {}).get("running")
                         for c in b.status()["children"]), 20,
             what=f"the turn running on b (a's NAK trouble: {naks})")
    (row,) = [r for r in ctl_json(b, "seats")["seats"] if r["seat"] == "w"]
    assert row["owner"] == "b" and row["in_flight"] == 1


BUDGET = """
company: {name: t}
providers:
  p:
    kind: scripted
    rules: [{match: '.*', reply: 'a reply of five words'}]
seats:
  - {name: sa, persona: seat a, provider: p, placement: {labels: {zone: a}}}
  - {name: sb, persona: seat b, provider: p, placement: {labels: {zone: b}}}
budgets:
  org: 20
"""


def test_the_org_budget_holds_across_nodes(natsd, make_node):
    a = fleet_node(make_node, natsd, "a", node={"labels": {"zone": "a"}}).start()
    b = fleet_node(make_node, natsd, "b", node={"labels": {"zone": "b"}}).start()
    apply(a, write(a.dir, "company.yaml", BUDGET))
    wait_for(lambda: held(a) == {"sa": "a", "sb": "b"}, 20, what="each node holds its seat")
    # One turn on a spends past the org cap (system + message + reply words).
    out = ctl_json(a, "send", "sa", " ".join(["word"] * 20), "--wait", "20")
    assert out["turn"]["outcome"] == "done"
    assert sum(out["turn"]["tokens"].values()) > 20
    # Both nodes learn of the spend, and neither starts another turn.
    for node in (a, b):
        wait_for(lambda: any(c["name"] == "seats" and (c.get("stats") or {}).get("org_spent", 0) > 20
                             for c in node.status()["children"]), 10, what="the spend known")
    ctl_json(a, "send", "sa", "again")
    ctl_json(b, "send", "sb", "and here")
    wait_for(lambda: deferrals(a, "sa") and deferrals(b, "sb"), 20, what="a turn deferred on each node")
    assert all("org budget of 20 tokens spent" in why for why in deferrals(a, "sa") + deferrals(b, "sb"))
    rows = {r["seat"]: r for r in ctl_json(a, "seats")["seats"]}
    assert rows["sa"]["pending"] == 1 and rows["sb"]["pending"] == 1
    assert [r["outcome"] for r in records(natsd) if r["outcome"] not in ("deferred",)] == ["done"]


COOLING = """
company: {{name: t}}
providers:
  gpt: {{kind: openai, model: m, base_url: '{url}/v1', api_key_env: CREWLET_TEST_KEY}}
seats:
  - {{name: sa, persona: seat a, provider: gpt, placement: {{labels: {{zone: a}}}}}}
  - {{name: sb, persona: seat b, provider: gpt, placement: {{labels: {{zone: b}}}}}}
"""


def test_a_429_on_one_node_cools_the_key_on_every_node(natsd, make_node, monkeypatch):
    monkeypatch.setenv("CREWLET_TEST_KEY", "sk-test")  # inherited by the nodes
    with WireServer() as endpoint:
        endpoint.queue({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "120"})
        a = fleet_node(make_node, natsd, "a", node={"labels": {"zone": "a"}}).start()
        b = fleet_node(make_node, natsd, "b", node={"labels": {"zone": "b"}}).start()
        apply(a, write(a.dir, "company.yaml", COOLING.format(url=endpoint.url)))
        wait_for(lambda: held(a) == {"sa": "a", "sb": "b"}, 20, what="each node holds its seat")
        ctl_json(a, "send", "sa", "hi")
        wait_for(lambda: len(endpoint.received()) == 1, 20, what="the 429")
        ctl_json(b, "send", "sb", "hi")
        found = wait_for(lambda: deferrals(b, "sb"), 20, what="b's seat deferred for the cooling key")
        assert "provider gpt is cooling after a 429" in found[0]
        assert len(endpoint.received()) == 1, "b called an endpoint whose key is cooling"


def test_killing_the_node_mid_turn_loses_no_message(natsd, make_node):
    """kill -9 of the whole node that runs a seat mid-turn: the successor gets
    the mail after the ack wait (3 s here, 30 min by default), redoes the turn
    once, and its side effect lands once.

    The kill comes once the owner's tool says it began its 10 s nap (its
    stderr line, in the owner's log): a turn seen "running" in the stats
    could have been one whose tool call failed (its MCP server not up), over
    before the kill landed — CI saw the owner's own ledger entry twice."""
    nodes = [fleet_node(make_node, natsd, f"n{i}", fleet={"ack_wait": 3}).start() for i in range(3)]
    apply(nodes[0], write(nodes[0].dir, "company.yaml",
                          worker_company(nap=10)))
    owner_id = wait_for(lambda: held(nodes[0]).get("w"), 20, what="w held")
    owner = next(n for n in nodes if n.config["node"]["id"] == owner_id)
    ctl_json(nodes[0], "send", "w", "job 7", "--trigger", "job-7")
    wait_napping(owner, "w", 10)
    seen = time.monotonic()
    owner.kill_tree()
    # The line is forwarded up to 0.25 s late: a kill within the nap's 10 s of it is mid-turn.
    assert time.monotonic() - seen < 9, "the machine is too slow: the kill may have come after the nap"
    survivor = next(n for n in nodes if n is not owner)

    async def landed(nc, js):
        kv = await js.key_value("ledger")
        try:
            entry = await kv.get("job-7")
        except Exception:
            return None
        sink = await js.stream_info("AGENTS", subjects_filter="agents.inbox.sink")
        return json.loads(entry.value), (sink.state.subjects or {}).get("agents.inbox.sink", 0)

    entry, sunk = wait_for(lambda: read_nats(natsd.url, landed), 60, what="the turn redone by a successor")
    assert entry["node"] != owner_id and entry["node"] in {n.config["node"]["id"] for n in nodes}
    assert sunk == 1
    # (The survivor's view of the leases follows its watch: a moment behind the ledger.)
    wait_for(lambda: held(survivor).get("w") not in (None, owner_id), 10, what="w held by a survivor")
