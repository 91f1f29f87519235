"""The ``learning`` duty on real nodes: episodes compacted, clustered, drafted
into a skill, promoted — each step once, across passes and a hand-over.

A node dials an outside nats-server (``stream.type: nats``) and runs every
role; its company's scripted provider answers the turns (a triage mail makes a
``task_create`` call, so its episode used a tool), the compaction prompt
(``Summarise these episodes…``) and the drafting prompt (``Draft a skill named
…``); one test names another provider as ``learning.provider``.
``learning: {every: 1, …}`` makes a pass a second. What the estate holds is
read from the node's own copy (:mod:`tests.estate`); what a pass did from the
duty's report (``status`` ``duty.learning``), its events and ``/metrics``.
"""

from __future__ import annotations

import os
import urllib.request

from crewlet.coord import duty_reports
from crewlet.skills import format as skill_format
from tests.conftest import wait_for
from crewlet.estate import store
from tests.estate import copy_of, query
from tests.integration.test_conversations import Api
from tests.integration.wire import Canned, WireServer, openai_reply
from tests.seats import ctl, ctl_json, held, read_nats, send_all_to, write_company

FAST = {"heartbeat": 0.5, "lease_ttl": 3, "sweep": 0.5}

COMPANY = """
company: {{name: Learners}}
providers:
  p:
    kind: scripted
    rules:
      - match: '^Summarise these episodes of seat ([a-z0-9_-]+) with (\\S+),'
        reply: 'SUMMARY \\1 with \\2: triaged issues, all labelled and assigned.'
      - match: '^Draft a skill named ([a-z0-9-]+)'
        reply: |
          ---
          name: \\1
          description: Triage a new issue - label it and assign it to the team that owns it.
          ---
          # Triage

          1. Read the issue; create a task for it.
          2. Label it bug and assign it to the web team.
      - match: '(?i)^triage issue (\\d+): (.+)'
        tools:
          - name: task_create
            args: {{title: 'issue \\1: \\2'}}
        reply: Labelled bug, assigned to the web team.
      - match: '.*'
        reply: ok
seats:
  - {{name: pm, persona: triages issues, provider: p}}
  - {{name: qa, persona: triages issues too, provider: p}}
learning: {{every: 1, compact_after: {compact_after}, min_cluster: 3, auto_promote: {auto_promote},
           max_drafts_per_pass: {drafts}}}
"""

ISSUES = ["login page returns 500", "signup email never arrives", "dark mode toggle missing",
          "search results empty for accents", "avatar upload times out", "export button does nothing"]


def company(dir: str, name: str = "company.yaml", *, compact_after: int = 3600,
            auto_promote: bool = False, drafts: int = 5) -> str:
    return write_company(dir, COMPANY.format(compact_after=compact_after, drafts=drafts,
                                             auto_promote=str(auto_promote).lower()), name)


def node(make_node, natsd, node_id: str = "t1"):
    return make_node(node={"id": node_id}, stream={"type": "nats", "servers": [natsd.url]}, fleet=FAST)


def triage(natsd, seat: str, numbers: range) -> None:
    """Mail *seat* a triage request for each of *numbers*, through the fleet's broker."""
    send_all_to(natsd.url, [(seat, f"Triage issue {i}: {ISSUES[i % len(ISSUES)]}", f"triage-{seat}-{i}")
                 for i in numbers])


def seats_held(n, seats=("pm", "qa")) -> None:
    """Wait until *seats* are held somewhere: their mailboxes exist, so mail is kept
    (an interest stream drops what is published before a mailbox covers it)."""
    wait_for(lambda: set(seats) <= set(held(n)), 40, what=f"seats {', '.join(seats)} held")


def report(natsd) -> dict:
    """The learning duty's last report, as the fleet's broker has it."""
    return read_nats(natsd.url, lambda nc, js: duty_reports.read(js, "learning")) or {}


def ask(n, name: str, args: dict) -> dict:
    """Query *name* of *n*'s copy (args as a dict: skill.read has its own ``name``)."""
    return store.Reader(copy_of(n)).query(name, args)


def metrics(n) -> str:
    """The node's GET /metrics, with its API token."""
    with open(os.path.join(n.run_dir, "api-token")) as f:
        token = f.read().strip()
    asked = urllib.request.Request(f"http://{n.config['ingress']['listen']}/metrics",
                                   headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(asked, timeout=10) as answer:
        return answer.read().decode()


def drafts(n) -> list[dict]:
    return query(n, "skill.drafts")["drafts"]


def episodes(n, seat: str) -> list[dict]:
    return query(n, "episode.list", seat=seat, limit=500)["episodes"]


def test_a_cluster_of_alike_turns_is_drafted_once_and_promoted_when_it_grows(natsd, make_node):
    """Three alike triage turns of pm are a cluster: one draft, its SKILL.md valid
    and naming the cluster, a pending approval promote-<id>. Later passes ask the
    provider nothing more. Two more alike turns (qa's) grow the cluster: with
    auto_promote the approval is decided by auto-promote, the draft promoted and
    the skill listed. /metrics and the report count it all."""
    n = node(make_node, natsd).start()
    assert ctl(n, "apply", company(n.dir, auto_promote=True)).returncode == 0
    seats_held(n)
    n.wait_event("duty_started", 30, duty="learning")
    triage(natsd, "pm", range(3))
    wait_for(lambda: len([e for e in episodes(n, "pm") if e.get("tools")]) == 3, 30,
             what="3 episodes with tools")

    (draft,) = wait_for(lambda: drafts(n), 30, what="a draft")
    assert draft["status"] == "pending" and draft["seat"] == "pm" and len(draft["episodes"]) == 3
    assert draft["approval"] == f"promote-{draft['cluster']}"
    page = ask(n, "skill.read", {"name": draft["name"], "draft": True})
    meta = skill_format.parse(page["file"]["body"])
    assert meta.cluster == draft["cluster"] and meta.name == draft["name"]
    assert meta.tools == ("task_create",) and meta.description.startswith("Triage a new issue")
    assert query(n, "approval.get", id=draft["approval"])["approval"]["status"] == "pending"

    # Passes go on (a second each): the cluster is covered, nothing is asked again.
    first = wait_for(lambda: (r := report(natsd)).get("totals", {}).get("steps") and r, 10, what="a report")
    calls = first["totals"]["provider_calls"]
    at = first["at"]
    wait_for(lambda: report(natsd)["at"] > at + 3, 15, what="three more passes")
    assert report(natsd)["totals"]["provider_calls"] == calls == 1
    assert len(drafts(n)) == 1

    # qa does the same twice: the cluster grows past its draft's 3, and is promoted.
    triage(natsd, "qa", range(10, 12))
    wait_for(lambda: drafts(n)[0]["status"] == "promoted", 30, what="the draft promoted")
    decided = query(n, "approval.get", id=draft["approval"])["approval"]
    assert decided["decision"] == "approve" and decided["by"] == "auto-promote"
    listed = {s["name"]: s for s in query(n, "skill.list")["skills"]}
    assert listed[draft["name"]]["meta"]["cluster"] == draft["cluster"]
    wait_for(lambda: report(natsd)["totals"]["steps"] == 2, 10, what="draft and promotion counted")
    r = report(natsd)
    assert r["totals"]["provider_calls"] == 1 and r["totals"]["ops"] == 2 and r["errors"] == []
    assert wait_for(lambda: n.events_named("learning_drafted"), 5,
                    what="the draft said in the log")[0]["own"] is True
    wait_for(lambda: "crewlet_learning_steps_total 2.0" in metrics(n), 20, what="/metrics counting the steps")
    shown = metrics(n)
    assert "crewlet_learning_provider_calls_total 1.0" in shown and "crewlet_learning_ops_total 2.0" in shown


def test_old_episodes_become_one_summary_per_seat_and_counterparty(natsd, make_node):
    """compact_after 2 s: pm's triage episodes (all with the operator, who sent
    them) become one compacted episode holding the provider's summary; a later
    one joins it at the next compaction (the summary carried on), and the
    provider is asked once per compaction."""
    n = node(make_node, natsd).start()
    assert ctl(n, "apply", company(n.dir, compact_after=2, drafts=0)).returncode == 0  # compaction alone
    seats_held(n)
    triage(natsd, "pm", range(4))
    # The four may age across two passes: compacted 3, then 1 more with the first summary.
    (row,) = wait_for(lambda: (rows := episodes(n, "pm")) and [e.get("compacted") for e in rows] == [4]
                      and rows, 40, what="four episodes compacted into one")
    assert row["summary"].startswith("SUMMARY pm with operator") and row["trigger"].startswith("compacted:")
    triage(natsd, "pm", range(4, 5))
    wait_for(lambda: [e.get("compacted") for e in episodes(n, "pm")] == [5], 40,
             what="the fifth compacted in")
    # The provider was asked once per compaction, never again for one that landed.
    # The log's lines come a moment late (crewletd forwards them): both are read until they agree.
    wait_for(lambda: report(natsd)["totals"]["steps"] == len(n.events_named("learning_compacted")), 10,
             what="the report and the log caught up")
    compactions = n.events_named("learning_compacted")
    assert report(natsd)["totals"]["provider_calls"] == len(compactions) >= 2
    # A compacted episode alone is not summarised again, pass after pass.
    at = report(natsd)["at"]
    wait_for(lambda: report(natsd)["at"] > at + 4, 15, what="more passes")
    assert report(natsd)["totals"]["provider_calls"] == len(compactions)


def test_a_pass_run_again_by_another_node_repeats_nothing(natsd, make_node):
    """t1 drafts the cluster and is killed (kill -9, the whole node); t2 takes
    the duty and passes at once: the cluster is covered by t1's draft, so t2
    asks no provider and writes no op; the totals go on from t1's."""
    a = node(make_node, natsd, "t1").start()
    assert ctl(a, "apply", company(a.dir)).returncode == 0
    seats_held(a)
    a.wait_event("duty_started", 30, duty="learning")
    b = node(make_node, natsd, "t2").start()
    triage(natsd, "pm", range(3))
    (draft,) = wait_for(lambda: drafts(a), 30, what="a draft")
    before = wait_for(lambda: (r := report(natsd)).get("totals", {}).get("steps") and r, 10,
                      what="t1's report")
    a.kill_tree()
    b.wait_event("duty_started", 30, duty="learning")
    wait_for(lambda: report(natsd).get("node") == "t2", 30, what="t2's first pass")
    r = report(natsd)
    assert r["counts"]["provider_calls"] == 0 and r["counts"]["ops"] == 0, r
    assert r["totals"]["steps"] == before["totals"]["steps"] and r["new"] == 0
    assert drafts(b) == [draft]
    assert not b.events_named("learning_drafted")


CURATED = COMPANY.replace("seats:\n", """  curator:
    kind: scripted
    rules:
      - match: '^Draft a skill'
        reply: |
          Triage an incoming bug report: label it and route it to its team.

          Read it, create a task, label it bug, assign the owning team.
seats:
""", 1).replace("max_drafts_per_pass: {drafts}}}", "max_drafts_per_pass: {drafts}, provider: curator}}")


def test_the_learning_provider_drafts_and_prose_becomes_a_valid_skill(natsd, make_node):
    """learning.provider names another provider than the seat's: it is the one
    asked (its prose, not the seat provider's SKILL.md, is in the draft); its
    answer is no SKILL.md, so one is made from it — the cluster's name, the
    first line as the description, the rest as the body, crewlet-cluster set."""
    n = node(make_node, natsd).start()
    text = CURATED.format(compact_after=3600, drafts=5, auto_promote="false")
    assert ctl(n, "apply", write_company(n.dir, text)).returncode == 0
    seats_held(n)
    triage(natsd, "pm", range(3))
    (draft,) = wait_for(lambda: drafts(n), 40, what="a draft")
    body = ask(n, "skill.read", {"name": draft["name"], "draft": True})["file"]["body"]
    meta = skill_format.check(draft["name"], [("SKILL.md", body)], draft=True)
    assert meta.description == "Triage an incoming bug report: label it and route it to its team."
    assert meta.cluster == draft["cluster"] and meta.seats == ("pm",) and meta.tools == ("task_create",)
    assert "Read it, create a task" in body and "# Triage" not in body   # the seat's provider was not asked
    # crewletd forwards a child's lines up to supervisor.process.FORWARD_EVERY late.
    (drafted,) = wait_for(lambda: n.events_named("learning_drafted"), 5,
                          what="the draft said in the log")
    assert drafted["own"] is False and drafted["skill"] == draft["name"]


# Three kinds of work, each with a tool of its own: three clusters.
KINDS_COMPANY = r"""
company: {{name: Learners}}
providers:
  p:
    kind: scripted
    rules:
      - match: '^Draft a skill named ([a-z0-9-]+)'
        reply: |
          ---
          name: \1
          description: Triage a new issue - label it and assign it to the team that owns it.
          ---
          # Triage

          Create a task for the issue, label it bug, assign the owning team.
      - match: '(?i)^triage issue (\d+): (.+)'
        tools: [{{name: task_create, args: {{title: 'issue \1: \2'}}}}]
        reply: Labelled bug, assigned to the web team.
      - match: '(?i)^document feature (\d+): (.+)'
        tools: [{{name: page_write, args: {{path: 'docs/feature-\1', title: '\2', body: 'How \2 works.'}}}}]
        reply: Documented the feature for users.
      - match: '(?i)^remember customer (\d+): (.+)'
        tools: [{{name: note_write, args: {{text: 'customer \1: \2'}}}}]
        reply: Noted the customer's wish.
      - match: '(?i)^which skills'
        tools: [{{name: skill_read, args: {{name: '?'}}}}]
        reply: 'Mine: {{tools}}'
      - match: '.*'
        reply: ok
  slow: {{kind: openai, base_url: '{url}', model: m, api_key_env: HOME}}
seats:
  - {{name: pm, persona: does everything, provider: p}}
  - {{name: qa, persona: does everything too, provider: p}}
learning: {{every: 1, compact_after: 3600, min_cluster: 3, max_drafts_per_pass: 5, provider: {learner}}}
"""
WORK = {"triage issue": ISSUES,
        "document feature": ["dark mode toggle", "export to csv", "search by accents"],
        "remember customer": ["wants weekly invoices", "wants weekly invoices by email",
                              "wants invoices weekly please"]}


def work(natsd, seat: str, kind: str, numbers: range) -> None:
    words = WORK[kind]
    send_all_to(natsd.url, [(seat, f"{kind.capitalize()} {i}: {words[i % len(words)]}", f"{kind[:3]}-{seat}-{i}")
                            for i in numbers])


def test_a_holder_killed_mid_pass_leaves_the_rest_to_another_node_and_no_step_twice(natsd, make_node):
    """Three clusters to draft through a slow provider (1.5 s a draft): the
    holder is killed whole once its first draft landed, while it asks for the
    second. The other node takes the duty and drafts the rest: every cluster
    drafted once (one op each, by its id), and the provider asked again for
    the one draft that was in flight at the kill, and no other."""
    with WireServer(always=Canned(200, openai_reply("Handle it the usual way.\n\nDo the steps."),
                                  delay=1.5)) as srv:
        a = node(make_node, natsd, "t1").start()
        text = KINDS_COMPANY.format(url=srv.url, learner="slow")
        assert ctl(a, "apply", write_company(a.dir, text)).returncode == 0
        seats_held(a)
        a.wait_event("duty_started", 30, duty="learning")
        b = node(make_node, natsd, "t2").start()
        for kind in WORK:
            work(natsd, "pm", kind, range(3))
        wait_for(lambda: len([e for e in episodes(a, "pm") if e.get("tools")]) == 9, 40,
                 what="nine episodes with tools")
        a.wait_event("learning_drafted", 60)
        a.kill_tree()
        b.wait_event("duty_started", 30, duty="learning")
        found = wait_for(lambda: len(d := drafts(b)) == 3 and d, 60, what="three drafts, the rest by t2")
        assert len({d["cluster"] for d in found}) == 3 and len({d["name"] for d in found}) == 3
        def drafted() -> list[dict]:
            return [e for n in (a, b) for e in n.events_named("learning_drafted")]
        wait_for(lambda: len(drafted()) >= len(found), 10, what="every draft's log line forwarded")
        assert sorted(e["cluster"] for e in drafted()) == sorted(d["cluster"] for d in found), drafted()
        asked = [r.body["messages"][-1]["content"] for r in srv.received()]
        assert all(t.startswith("Draft a skill") for t in asked), asked
        by_cluster = {d["cluster"]: sum(d["name"] in t for t in asked) for d in found}
        # Each draft asked for once; the one in flight at the kill at most twice.
        assert sorted(by_cluster.values()) in ([1, 1, 1], [1, 1, 2]), by_cluster
        for d in found:
            outcome = query(b, "op.outcome", id=f"learning:draft:{d['cluster']}")["outcome"]
            assert outcome["ok"] and not outcome.get("duplicate"), outcome


def test_work_done_alike_becomes_a_skill_through_one_approval_and_is_used_on_any_node(natsd, make_node):
    """The issue's done-when: two seats on two nodes triage alike; the passes
    draft a skill of it; one person's approval, through the other node's API,
    promotes it; each seat, wherever held, then has it (skill_read lists it)."""
    a = node(make_node, natsd, "t1").start()
    text = KINDS_COMPANY.format(url="http://127.0.0.1:9", learner="p")  # the slow one is not asked
    assert ctl(a, "apply", write_company(a.dir, text)).returncode == 0
    b = node(make_node, natsd, "t2").start()
    wait_for(lambda: set(held(a).values()) == {"t1", "t2"} and len(held(a)) == 2, 40,
             what="pm and qa held on different nodes")
    for seat in ("pm", "qa"):
        work(natsd, seat, "triage issue", range(2))
    (draft,) = wait_for(lambda: drafts(a), 40, what="a draft of the triage work")
    assert draft["status"] == "pending"
    api = Api(b)
    decided = api.ok("POST", f"/v1/approvals/{draft['approval']}", json={"decision": "approve"})
    assert decided["decision"] == "approve"
    wait_for(lambda: draft["name"] in {s["name"] for s in query(a, "skill.list")["skills"]}, 20,
             what="the skill promoted")
    for seat in ("pm", "qa"):
        said = wait_for(lambda: (r := ctl_json(a, "send", seat, "Which skills do I have?", "--wait", "20"))
                        and draft["name"] in r["turn"]["reply"] and r, 20, interval=0.5,
                        what=f"{seat} listing the promoted skill")
        assert said["turn"]["node"] == held(a)[seat], said
    api.http.close()
