"""Skills across a fleet (DESIGN §15; issue 25): the registry on every node, a run's pin.

Three nodes on one test broker: two data nodes with every role, and a
stateless one (seats only), which has no copy and learns of skills only from
the broadcast and its walks. Their seats answer through a local endpoint
speaking OpenAI's wire, which keeps every request: a request's system prompt
says which skills its turn was given, and its user message (the mail's text,
tagged) which node's seat asked.

* A skill written to the log is in the next turn's prompt on every node
  within a bounded time (measured, printed).
* A node whose seats child was killed while a skill was written (so it
  missed the broadcast) has it once its new seats child walked.
* A conversation run started before a skill changed keeps its pinned
  revision: its approval, decided through another node, resumes it — on the
  seat's holder — with the skills as they were at its start, while mail turns
  on every node have the new revision.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid

import pytest

from crewlet.estate.ops import make_op
from tests.conftest import start_all, wait_for
from tests.estate import publish_to
from tests.fleet.test_fleet import apply, fleet_node, seats_of
from tests.integration.test_conversations import Api
from tests.integration.wire import Canned, WireServer, openai_reply, openai_stream
from tests.seats import send_all_to, write_company

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(300)]

SEATS = 6
# The stateless node hears of a change from the broadcast; this is how long
# any node may take to have it in a turn's prompt (measured well below).
REACH = 10.0
COMPANY = """
company: {{name: skills-fleet}}
providers:
  llm: {{kind: openai, base_url: '{url}', model: m, api_key_env: HOME}}
seats:
  - {{name: clerk, persona: You file things., provider: llm, approval: [send]}}
{seats}
"""


def skill_md(name: str, description: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n# {name}\n\nDo it well.\n"


def write_skill(url: str, name: str, description: str) -> int:
    op = make_op("skill.write", {"name": name, "files": [{"path": "SKILL.md", "body": skill_md(name, description)}]},
                 node="tester")
    [(seq, _)] = asyncio.run(publish_to(url, [op]))
    return seq


class Prompts:
    """The system prompt of the request each tagged mail made, by tag."""

    def __init__(self, srv: WireServer):
        self.srv = srv

    def by_tag(self) -> dict[str, str]:
        out = {}
        for r in self.srv.received():
            msgs = (r.body or {}).get("messages") or []
            if len(msgs) >= 2 and msgs[0]["role"] == "system":
                out[str(msgs[-1].get("content"))] = msgs[0]["content"]
        return out


def probe(url: str, prompts: Prompts, seats: dict[str, str], needle: str, within: float) -> dict[str, float]:
    """Mail one seat held by each node, again every 0.1 s, until each node's
    turn's prompt holds *needle*: seconds from now to the first such mail, by node."""
    start = time.monotonic()
    by_node = {}
    for seat, node in sorted(seats.items()):
        by_node.setdefault(node, seat)
    reached: dict[str, float] = {}
    sent: dict[str, tuple[str, float]] = {}  # tag -> (node, when sent)
    deadline = start + within
    while len(reached) < len(by_node):
        assert time.monotonic() < deadline, f"{needle!r} reached only {sorted(reached)} of {sorted(by_node)}"
        batch = []
        for node, seat in by_node.items():
            if node not in reached:
                tag = f"probe-{uuid.uuid4().hex[:10]}"
                sent[tag] = (node, time.monotonic() - start)
                batch.append((seat, tag, tag))
        send_all_to(url, batch)
        time.sleep(0.1)
        for tag, prompt in prompts.by_tag().items():
            if tag in sent and needle in prompt:
                node, at = sent[tag]
                reached.setdefault(node, at)
    return reached


def test_skills_reach_every_node_a_missed_broadcast_is_walked_and_a_run_keeps_its_pin(natsd, make_node):
    with WireServer(always=Canned(200, openai_reply("noted"))) as srv:
        prompts = Prompts(srv)
        nodes = start_all([fleet_node(make_node, natsd, "k0"), fleet_node(make_node, natsd, "k1"),
                           fleet_node(make_node, natsd, "k2", node={"roles": ["seats"]},
                                      skills={"walk_every": 3})])
        seats = "\n".join(f"  - {{name: s{i}, persona: seat {i}, provider: llm}}" for i in range(SEATS))
        apply(nodes[0], write_company(nodes[0].dir, COMPANY.format(url=srv.url, seats=seats), "skills.yaml"))
        wait_for(lambda: len(seats_of(nodes[0])) == SEATS + 1 and len(set(seats_of(nodes[0]).values())) == 3,
                 60, what="every seat held, on all three nodes")
        held = {s: n for s, n in seats_of(nodes[0]).items() if s != "clerk"}

        # 1. A skill written reaches the next turn on every node, the stateless one too.
        write_skill(natsd.url, "release-notes", "First words of release notes.")
        reached = probe(natsd.url, prompts, held, "- release-notes: First words", REACH)
        print(f"\nthe skill in a turn's prompt after (s): "
              + ", ".join(f"{n} {t:.3f}" for n, t in sorted(reached.items())))
        assert set(reached) == {"k0", "k1", "k2"}

        # 2. The stateless node's seats child killed: a skill written meanwhile is
        # walked into its next incarnation's registry.
        k2 = nodes[2]
        pid = k2.process_pids()["seats"]
        os.kill(pid, signal.SIGKILL)
        write_skill(natsd.url, "triage", "Sorts incoming bugs.")
        k2.wait_running(30, exclude={"seats": pid})
        wait_for(lambda: len(seats_of(nodes[0])) == SEATS + 1 and "k2" in set(seats_of(nodes[0]).values()),
                 60, what="the stateless node holding seats again")
        held = {s: n for s, n in seats_of(nodes[0]).items() if s != "clerk"}
        assert "k2" in probe(natsd.url, prompts, held, "- triage: Sorts incoming bugs.", REACH)

        # 3. A run started before a change keeps its pin across a request served elsewhere.
        a, b = Api(nodes[0]), Api(nodes[1])
        conv = a.conversation("clerk")
        srv.queue_stream(openai_stream([], calls=[(0, "call_1", "send", json.dumps({"seat": "s0", "text": "hi"}))]))
        _, events = a.stream(f"/v1/conversations/{conv}/runs", {"input": "send s0 hi", "stream": True})
        approval = next(e[2]["approval"] for e in events if e[1] == "approval.requested")
        asked = [r for r in srv.received() if (r.body or {}).get("messages", [{}])[-1].get("content") == "send s0 hi"]
        assert asked and "- release-notes: First words" in asked[-1].body["messages"][0]["content"]
        write_skill(natsd.url, "release-notes", "Second words of release notes.")
        held = {s: n for s, n in seats_of(nodes[0]).items() if s != "clerk"}
        probe(natsd.url, prompts, held, "- release-notes: Second words", REACH)  # mail sees the new one
        before = len(srv.received())
        srv.queue_stream(openai_stream(["sent it"]))
        b.ok("POST", f"/v1/approvals/{approval}", json={"decision": "approve"})
        resumed = wait_for(lambda: [r for r in srv.received()[before:]
                                    if any(m.get("role") == "tool" for m in (r.body or {}).get("messages", []))],
                           40, what="the resumed run's request")
        system = resumed[0].body["messages"][0]["content"]
        assert "- release-notes: First words" in system and "Second words" not in system, system
        a.http.close()
        b.http.close()
