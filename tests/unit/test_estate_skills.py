"""Skills and episodes in a copy (crewlet.estate.skills): real LMDB in temp dirs."""

from __future__ import annotations

import pytest

from crewlet.estate import apply, store
from tests.estate import op

SKILL_MD = """---
name: release-notes
description: Writes release notes from merged pull requests. Use when a release is cut.
metadata:
  crewlet-seats: cto, writer-*
---
# Release notes

1. List the merged pull requests.
2. Group them by kind.
"""

OTHER_MD = SKILL_MD.replace("from merged pull requests", "from the changelog")


@pytest.fixture
def copy(tmp_path):
    made = []
    yield lambda name="a": made.append(store.open_env(str(tmp_path / name))) or made[-1]
    for s in made:
        store.close_env(s)


def run(s, *ops_):
    first = s.applied() + 1
    return [o for _, o in apply.apply_batch(s, [(first + i, o.encode()) for i, o in enumerate(ops_)])]


def q(s, query, **args):
    return store.Reader(s).query(query, args)


def files(md=SKILL_MD, **more):
    return [{"path": "SKILL.md", "body": md}] + [{"path": p.replace("__", "/"), "body": b}
                                                 for p, b in more.items()]


def test_a_skill_is_kept_by_revision_and_mirrored_as_pages(copy):
    s = copy()
    first, second = run(s, op("skill.write", {"name": "release-notes",
                                              "files": files(references__GUIDE_md="# Guide\n")}),
                        op("skill.write", {"name": "release-notes", "files": files(OTHER_MD)}))
    assert first["ok"] and second["ok"], (first, second)
    assert first["result"]["skills_changed"] == ["release-notes"]
    # The pages are the current revision's: the guide went with the second.
    page = q(s, "page.read", path="skills/release-notes/skill.md")["page"]
    assert (page["title"], page["body"], page["version"]) == ("SKILL.md", OTHER_MD, 2)
    assert q(s, "page.read", path="skills/release-notes/references/guide_md")["page"] is None
    # Each revision is readable whole, as of its seq, byte for byte.
    at1, at2 = first["seq"], second["seq"]
    assert q(s, "skill.read", name="release-notes", as_of=at1)["file"]["body"] == SKILL_MD
    assert q(s, "skill.read", name="release-notes", file="references/GUIDE_md", as_of=at1)["file"] == \
        {"path": "references/GUIDE_md", "body": "# Guide\n"}
    assert q(s, "skill.read", name="release-notes")["file"]["body"] == OTHER_MD
    assert [r["seq"] for r in q(s, "skill.revisions", name="release-notes")["revisions"]] == [at2, at1]
    assert [(r["seq"], r["files"]) for r in q(s, "skill.list", as_of=at1)["skills"]] == \
        [(at1, ["SKILL.md", "references/GUIDE_md"])]
    listed = q(s, "skill.list")["skills"]
    assert [(r["name"], r["seq"], r["files"]) for r in listed] == [("release-notes", at2, ["SKILL.md"])]
    assert listed[0]["description"].startswith("Writes release notes from the changelog")


def test_a_skill_applies_to_the_seats_its_metadata_names(copy):
    s = copy()
    run(s, op("skill.write", {"name": "release-notes", "files": files()}))
    assert [r["name"] for r in q(s, "skill.list", seat="writer-2")["skills"]] == ["release-notes"]
    assert q(s, "skill.list", seat="ceo")["skills"] == []


def test_a_malformed_skill_is_refused_naming_the_file_and_field(copy):
    s = copy()
    bad_name, no_md, drafts = run(
        s, op("skill.write", {"name": "other", "files": files()}),
        op("skill.write", {"name": "x", "files": [{"path": "notes.md", "body": "hi"}]}),
        op("skill.write", {"name": "drafts", "files": files()}))
    assert not bad_name["ok"] and "SKILL.md" in bad_name["error"] and "name" in bad_name["error"]
    assert not no_md["ok"] and "SKILL.md" in no_md["error"]
    assert not drafts["ok"] and drafts["code"] == "forbidden"
    assert q(s, "skill.list")["skills"] == [] and q(s, "page.list", prefix="skills/")["pages"] == []


def test_a_seats_page_write_is_one_file_of_a_new_revision(copy):
    s = copy()
    orphan, md, ref, gone = run(
        s, op("page.write", {"path": "skills/release-notes/ref.md", "title": "ref.md", "body": "x"},
              seat="cto", token=1),
        op("page.write", {"path": "skills/release-notes/skill.md", "title": "whatever", "body": SKILL_MD},
           seat="cto", token=1),
        op("page.write", {"path": "skills/release-notes/ref.md", "title": "REF.md", "body": "see"},
           seat="cto", token=1),
        op("page.delete", {"path": "skills/release-notes/skill.md"}))
    assert not orphan["ok"] and "write skills/release-notes/skill.md first" in orphan["error"]
    assert md["ok"] and ref["ok"], (md, ref)
    assert ref["result"]["skill"]["files"] == ["REF.md", "SKILL.md"]
    assert q(s, "skill.read", name="release-notes", file="ref.md", as_of=ref["seq"])["file"]["body"] == "see"
    # Deleting its SKILL.md retires the skill; its history stays.
    assert gone["ok"] and q(s, "skill.list")["skills"] == []
    assert q(s, "skill.read", name="release-notes")["skill"] is None
    assert q(s, "skill.read", name="release-notes", as_of=ref["seq"])["file"]["body"] == SKILL_MD
    assert q(s, "page.list", prefix="skills/")["pages"] == []
    bad_md, = run(s, op("page.write", {"path": "skills/x/skill.md", "title": "SKILL.md", "body": "no front"},
                        seat="cto", token=1))
    assert not bad_md["ok"] and "SKILL.md" in bad_md["error"]


def test_a_draft_is_promoted_by_its_approval_once(copy):
    s = copy()
    draft_args = {"name": "release-notes", "cluster": "c1", "seat": "cto", "episodes": [3, 1],
                  "files": files(), "approval": "promote-c1", "expires_at": 9e9}
    first, again, other = run(s, op("skill.draft", draft_args),
                              op("skill.draft", {**draft_args, "name": "other-name"}),
                              op("skill.draft", {**draft_args, "cluster": "c2", "approval": "promote-c2"}))
    assert first["ok"] and again["result"]["already"] and again["result"]["draft"]["name"] == "release-notes"
    assert not other["ok"] and other["code"] == "conflict"  # the name is the first cluster's
    assert q(s, "page.read", path="skills/drafts/release-notes/skill.md")["page"]["body"] == SKILL_MD
    assert q(s, "skill.list")["skills"] == []
    approval = q(s, "approval.get", id="promote-c1")["approval"]
    assert (approval["kind"], approval["status"], approval["tool"]) == ("promotion", "pending", "skill.promote")
    assert [a["id"] for a in q(s, "approval.list", status="pending")["approvals"]] == ["promote-c1"]
    decided, twice = run(s, op("approval.decide", {"id": "promote-c1", "decision": "approve", "by": "person:alice"}),
                         op("approval.decide", {"id": "promote-c1", "decision": "approve"}))
    assert decided["ok"] and decided["result"]["skills_changed"] == ["release-notes"]
    assert twice["result"]["already"]
    listed = q(s, "skill.list")["skills"]
    assert [(r["name"], r["draft"]) for r in listed] == [("release-notes", "release-notes")]
    assert [r["seq"] for r in q(s, "skill.revisions", name="release-notes")["revisions"]] == [decided["seq"]]
    (d,) = q(s, "skill.drafts")["drafts"]
    assert (d["status"], d["decided_by"], d["episodes"]) == ("promoted", "person:alice", [1, 3])


def test_a_denied_draft_stays_a_draft(copy):
    s = copy()
    run(s, op("skill.draft", {"name": "release-notes", "cluster": "c1", "seat": "cto", "episodes": [1],
                              "files": files(), "approval": "p1", "expires_at": 9e9}),
        op("approval.decide", {"id": "p1", "decision": "deny"}))
    assert q(s, "skill.list")["skills"] == []
    assert q(s, "skill.drafts", status="rejected")["drafts"][0]["name"] == "release-notes"


def turn(seat, trigger, outcome="done", *, token=1, **record):
    body = {"seat": seat, "trigger": trigger, "outcome": outcome, "reply": f"did {trigger}",
            "tool_calls": [{"name": "page_write"}, {"name": "task_create"}, {"name": "page_write"}], **record}
    which = "done" if outcome == "done" else str(record.get("deliveries", 1))
    return op("turn.record", {"record": body}, seat=seat, token=token, id=f"{seat}:turn:{trigger}:{which}")


def test_a_turn_makes_one_episode_per_trigger_and_counts_it_once(copy):
    s = copy()
    run(s, turn("cto", "m1", "failed", counterparty="person:alice", ask="ship it", error="model down",
                deliveries=1),
        turn("cto", "m1", "failed", counterparty="person:alice", ask="ship it", deliveries=2),
        turn("cto", "m1", counterparty="person:alice", ask="ship it"),
        turn("cto", "m1", counterparty="person:alice", ask="ship it", token=2),  # a redone turn's record
        turn("cto", "m2", counterparty="seat:ceo", ask="plan"),
        turn("cto", "m3", "interrupted"))
    eps = q(s, "episode.list", seat="cto")["episodes"]
    assert [(e["trigger"], e["outcome"], e["counterparty"]) for e in eps] == \
        [("m1", "done", "person:alice"), ("m2", "done", "seat:ceo")]
    assert eps[0]["tools"] == ["page_write", "task_create"] and eps[0]["ask"] == "ship it"
    assert eps[0]["summary"] == "did m1"
    assert q(s, "episode.count", seat="cto")["counts"] == {"person:alice": 1, "seat:ceo": 1}
    assert [e["trigger"] for e in q(s, "episode.list", seat="cto", counterparty="seat:ceo")["episodes"]] == ["m2"]


def test_compaction_folds_a_counterpartys_old_episodes_into_one(copy):
    s = copy()
    run(s, *[turn("cto", f"m{i}", counterparty="person:alice") for i in range(4)], turn("cto", "x", counterparty="seat:ceo"))
    through = q(s, "episode.list", seat="cto", counterparty="person:alice")["episodes"][2]["seq"]
    done, again = run(s, op("episode.compact", {"seat": "cto", "counterparty": "person:alice",
                                                "through": through, "summary": "alice asks for releases"},
                            id="c1"),
                      op("episode.compact", {"seat": "cto", "counterparty": "person:alice",
                                             "through": through, "summary": "x"}, id="c1"))
    assert done["ok"] and done["result"]["removed"] == 3 and again.get("duplicate")
    eps = q(s, "episode.list", seat="cto", counterparty="person:alice")["episodes"]
    assert [(e["trigger"], e["compacted"]) for e in eps] == [("m3", 0), (f"compacted:{through}", 3)]
    # A trigger compacted away stays seen: its redone record adds nothing.
    run(s, turn("cto", "m0", counterparty="person:alice", token=3))
    assert len(q(s, "episode.list", seat="cto", counterparty="person:alice")["episodes"]) == 2
    assert q(s, "episode.count", seat="cto")["counts"]["person:alice"] == 4
    scan = q(s, "episode.scan", limit=2)
    assert len(scan["episodes"]) == 2 and scan["next"] is not None
    rest = q(s, "episode.scan", after=scan["next"], limit=10)
    assert len(scan["episodes"]) + len(rest["episodes"]) == 3 and rest["next"] is None


def test_two_copies_hold_the_same_bytes(copy):
    a, b = copy("a"), copy("b")
    log = [op("skill.write", {"name": "release-notes", "files": files()}, at=1.0),
           turn("cto", "m1", counterparty="person:alice"),
           op("skill.draft", {"name": "drafted", "cluster": "c9", "seat": "cto", "episodes": [2],
                              "files": files(SKILL_MD.replace("name: release-notes", "name: drafted")),
                              "approval": "p9", "expires_at": 9e9}, at=2.0),
           op("approval.decide", {"id": "p9", "decision": "approve"}, at=3.0)]
    for s in (a, b):
        run(s, *log)
    assert store.digest(a) == store.digest(b)
