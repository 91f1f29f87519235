"""Skills and episodes at work on one node (DESIGN §15; crewlet.skills.registry,
crewlet.estate.skills, crewlet.agent.skill_tools).

A real node. A skill written to the estate's log reaches the next turn's
system prompt (read at a local endpoint speaking OpenAI's wire, which keeps
every request) through the applier's broadcast, and its body through the
``skill_read`` tool (the scripted provider's rule calls it); a retired skill
leaves the prompt. Every turn makes one episode, keyed on its trigger: the
seat's next turn with the same counterparty is offered it; mail sent twice
under one trigger, and a seats child killed with turns in hand, land no
second episode and no second count.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from crewlet.estate.ops import make_op
from tests.conftest import wait_for
from crewlet.estate import store
from tests.estate import copy_of, publish_to, query
from tests.integration.wire import Canned, WireServer, openai_reply
from tests.seats import ctl_json, held, node_url, seats_stats, send_all_to, write_company

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
COMPANY = """
company: {{name: skills}}
providers:
  p:
    kind: scripted
    rules:
      - match: 'use (\\S+)'
        tools: [{{name: skill_read, args: {{name: '\\1'}}}}]
        reply: 'read: {{tools}}'
      - {{match: '.*', reply: 'ok'}}
  llm: {{kind: openai, base_url: '{url}', model: m, api_key_env: HOME}}
seats:
  - {{name: writer, persona: You write release notes., provider: llm}}
  - {{name: reader, persona: You read skills., provider: p}}
"""

SKILL_MD = """---
name: release-notes
description: Writes release notes from merged pull requests. Use when a release is cut.
metadata:
  crewlet-seats: writer reader
---
# Release notes

Group the merged pull requests by kind, newest first.
"""


def skill_op(name: str, body: str, **args) -> object:
    return make_op("skill.write", {"name": name, "files": [{"path": "SKILL.md", "body": body}], **args},
                   node="tester")


def system_prompts(srv: WireServer) -> list[str]:
    return [r.body["messages"][0]["content"] for r in srv.received()
            if isinstance(r.body, dict) and r.body.get("messages")]


def test_a_skill_reaches_the_next_turn_and_is_read_on_demand(make_node):
    with WireServer(always=Canned(200, openai_reply("noted"))) as srv:
        node = make_node(fleet=FAST)
        node.start(args=("--company", write_company(node.dir, COMPANY.format(url=srv.url))))
        wait_for(lambda: {"writer", "reader"} <= set(held(node)), 30, what="both seats held")
        url = node_url(node)

        ctl_json(node, "send", "writer", "hello", "--wait", "20", "--trigger", "before")
        assert "release-notes" not in system_prompts(srv)[-1]

        written_at = time.monotonic()
        [(seq, _)] = asyncio.run(publish_to(url, [skill_op("release-notes", SKILL_MD)]))

        def listed() -> bool:
            ctl_json(node, "send", "writer", "next", "--wait", "20")
            return "- release-notes: Writes release notes" in system_prompts(srv)[-1]
        wait_for(listed, 20, interval=0.1, what="the skill in the writer's next prompt")
        reached = time.monotonic() - written_at
        print(f"\nskill in the next turn's prompt {reached:.3f} s after it was written (seq {seq})")
        # crewletctl status says how many the node's registry holds, and that it walked.
        reg = wait_for(lambda: (seats_stats(node).get("skills") or {}).get("skills") == 1
                       and seats_stats(node)["skills"], 10, what="the registry in the status")
        assert reg["walked_at"] and reg["walks"] >= 1 and reg["broadcasts"] >= 1, reg
        # The tool reads its body whole, on demand.
        said = ctl_json(node, "send", "reader", "use release-notes", "--wait", "20")
        assert said["turn"]["outcome"] == "done", said
        assert "Group the merged pull requests by kind" in said["turn"]["reply"], said
        unknown = ctl_json(node, "send", "reader", "use no-such-skill", "--wait", "20")
        assert "no skill no-such-skill" in unknown["turn"]["reply"], unknown

        # Retired, it leaves the prompt (its history stays in the estate).
        asyncio.run(publish_to(url, [make_op("skill.retire", {"name": "release-notes"},
                                                           node="tester")]))

        def unlisted() -> bool:
            ctl_json(node, "send", "writer", "after", "--wait", "20")
            return "release-notes" not in system_prompts(srv)[-1]
        wait_for(unlisted, 20, interval=0.1, what="the retired skill out of the prompt")
        revisions = store.Reader(copy_of(node)).query("skill.revisions", {"name": "release-notes"})
        assert [r["retired"] for r in revisions["revisions"]] == [True, False]


def test_one_episode_per_trigger_across_a_redo_and_a_killed_seats_child(make_node):
    with WireServer(always=Canned(200, openai_reply("done it"))) as srv:
        node = make_node(fleet=FAST)
        node.start(args=("--company", write_company(node.dir, COMPANY.format(url=srv.url))))
        wait_for(lambda: "writer" in held(node), 30, what="the writer held")
        url = node_url(node)

        first = ctl_json(node, "send", "writer", "ship the release", "--wait", "20", "--trigger", "t-first")
        assert first["turn"]["outcome"] == "done", first
        # The same trigger again: worked once (the ledger), one episode.
        ctl_json(node, "send", "writer", "ship the release", "--trigger", "t-first")
        wait_for(lambda: len(query(node, "episode.list", seat="writer")["episodes"]) >= 1, 20,
                 what="the first episode")
        # The seat's next turn with the same counterparty is offered it.
        ctl_json(node, "send", "writer", "and now?", "--wait", "20", "--trigger", "t-second")
        assert 'Your recent work with the operator' in system_prompts(srv)[-1]
        assert 'asked "ship the release"' in system_prompts(srv)[-1]

        # Load, and the seats child killed with turns in hand.
        triggers = [f"load-{i}" for i in range(40)]
        send_all_to(url, [("writer", f"job {t}", t) for t in triggers])
        wait_for(lambda: len(srv.received()) >= 10, 20, what="turns under way")
        seats_pid = node.process_pids()["seats"]
        os.kill(seats_pid, signal.SIGKILL)
        node.wait_running(30, exclude={"seats": seats_pid})

        def all_worked():
            eps = query(node, "episode.list", seat="writer", limit=100)["episodes"]
            return eps if {e["trigger"] for e in eps} >= set(triggers) else None
        episodes = wait_for(all_worked, 60, interval=0.2, what="an episode for every trigger")
        seen = [e["trigger"] for e in episodes]
        assert len(seen) == len(set(seen)), f"a trigger with two episodes: {sorted(seen)}"
        assert set(seen) == {"t-first", "t-second", *triggers}
        counts = query(node, "episode.count", seat="writer")["counts"]
        assert counts == {"operator": len(triggers) + 2}, counts
        assert all(e["outcome"] == "done" and e["counterparty"] == "operator" for e in episodes)
