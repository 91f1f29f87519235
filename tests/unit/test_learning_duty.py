"""The learning duty's own rules, without a broker or a store: which episodes
a pass compacts, the old-episode cutoff, and the SKILL.md a draft gets from
whatever the model answered (roles/workers/duties/learning.py). The pass
itself, against a real node, is tests/integration/test_learning.py."""

from __future__ import annotations

import pytest
import yaml

from crewlet.learning.cluster import cluster
from crewlet.skills import format as skill_format
from roles.workers.duties.learning import (COMPACT_BATCH, CUTOFF_GRAIN, compactions, cutoff, draft_md,
                                           draft_name, recent)

DAY = 86400


def row(seq: int, at: float, seat: str = "pm", party: str = "operator", **more) -> dict:
    return {"seat": seat, "counterparty": party, "seq": seq, "at": at, "ask": f"ask {seq}",
            "summary": f"did {seq}", "tools": ["github"], "outcome": "done", "compacted": 0, **more}


def test_the_cutoff_is_rounded_so_overlapping_holders_agree():
    now = 1_800_000_123.5
    a, b = cutoff(now, 7 * DAY), cutoff(now + CUTOFF_GRAIN / 3, 7 * DAY)
    assert a % CUTOFF_GRAIN == 0 and a <= now - 7 * DAY < a + CUTOFF_GRAIN and b in (a, a + CUTOFF_GRAIN)
    assert cutoff(now, 10) % 10 == 0 and now - 20 < cutoff(now, 10) <= now - 10  # a short one, its own grain
    assert cutoff(5.0, 7 * DAY) == 0


def test_what_a_pass_compacts():
    old, young = 1000.0, 9000.0
    rows = [row(1, old), row(2, old), row(5, young),                      # pm/operator: 1-2 old
            row(3, young, party="seat:dev"),                              # nothing old
            row(4, old, party="person:ann", compacted=7, trigger="compacted:2"),  # a summary alone
            row(6, old, seat="dev"), row(7, young, seat="dev"), row(8, old, seat="dev")]
    found = {(s, p): (through, [r["seq"] for r in upto]) for s, p, through, upto in compactions(rows, 5000.0)}
    # Every episode up to the newest old one goes, a young one between included.
    assert found == {("pm", "operator"): (2, [1, 2]), ("dev", "operator"): (8, [6, 7, 8])}
    assert [r["seq"] for r in recent(rows, 5000.0)] == [5, 3, 7]
    # A compacted episode is summarised again with new old ones (carried on).
    rows.append(row(9, old, party="person:ann"))
    assert ("pm", "person:ann") in {(s, p) for s, p, _, _ in compactions(rows, 5000.0)}
    # A backlog goes a batch at a time, a prefix by seq (the op removes all up to through).
    many = [row(i, old) for i in range(1, COMPACT_BATCH + 50)]
    ((_, _, through, upto),) = compactions(many, 5000.0)
    assert through == COMPACT_BATCH and [r["seq"] for r in upto] == list(range(1, COMPACT_BATCH + 1))


TRIAGE = [f"Triage issue {n}: {what}. Labelled bug, assigned to the web team."
          for n, what in ((1, "login page broken"), (2, "signup email missing"), (3, "avatar upload slow"))]


@pytest.fixture
def c():
    (found,) = cluster([{"seat": "pm", "seq": i + 1, "tools": ["github", "send"], "ask": t, "summary": "done"}
                        for i, t in enumerate(TRIAGE)])
    return found


VALID = """---
name: something-else
description: Triage a new bug report.
metadata:
  version: "1"
  crewlet-cluster: wrong
---
# Triage

1. Read the issue.
"""


@pytest.mark.parametrize("reply, own", [
    (VALID, True),                                       # valid: kept, its name and cluster set
    ("```markdown\n" + VALID + "```", True),             # in a code fence
    ("---\nname: x\ndescription: [unclosed\n---\nBody\n", False),   # bad YAML
    ("---\nname: x\n", False),                           # front matter never closed
    ("Triage a bug: read it, label it, assign it.\n\nMore.", False),   # no front matter
    ("---\nname: x\ndescription: d\nversion: 2\n---\nbody", False),     # a key the format has not
    ("", False),                                         # nothing
    ("x" * (skill_format.FILE_CHARS_MAX + 10), False),   # too long to keep: the episodes instead
])
def test_a_draft_is_always_a_valid_skill_naming_its_cluster(c, reply, own):
    name = draft_name(c, set())
    body, was_own = draft_md(c, name, reply)
    assert was_own is own
    meta = skill_format.check(name, [{"path": "SKILL.md", "body": body}], draft=True)
    assert meta.name == name == c.name and meta.cluster == c.id
    assert meta.metadata["crewlet-tools"] == "github send" and meta.metadata["crewlet-seats"] == "pm"
    if own:
        assert meta.description == "Triage a new bug report." and meta.metadata["version"] == "1"
        assert body.rstrip().endswith("1. Read the issue.")
    elif reply.startswith("Triage"):
        assert meta.description == "Triage a bug: read it, label it, assign it."
    elif not reply.strip() or len(reply) > skill_format.FILE_CHARS_MAX:  # nothing of the model's to keep
        assert "login page broken" in body and "Tools: github, send." in body
    front = yaml.safe_load(body.split("---\n")[1])
    assert set(front) <= set(skill_format.KEYS)


def test_a_taken_name_gets_the_cluster_id_after_it(c):
    assert draft_name(c, {"other"}) == c.name
    taken = draft_name(c, {c.name})
    assert taken.endswith("-" + c.id[:8]) and len(taken) <= skill_format.NAME_MAX
    assert skill_format.check(taken, [{"path": "SKILL.md", "body": draft_md(c, taken, "")[0]}], draft=True)
