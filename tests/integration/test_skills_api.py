"""Skills through the people's surfaces on one real node: ``crewletctl skills``
and ``/v1/skills`` (roles/ingress/api/skills.py, crewlet/ctl/skills.py).

One node for the whole module (a node start costs the suite seconds), its
company naming who decides promotions (alice) and who does not (bob), its
tokens an admin's that belongs to nobody and one for each of them. In turn:

* a checkout of two real-looking skills (front matter, a reference, a script
  with CRLF endings, tabs and non-ASCII text) pushed with ``crewletctl skills
  push`` is listed, and every file reads back byte for byte, through the API
  and through ``crewletctl skills show NAME FILE``;
* a malformed skill is refused naming the file and the field: by crewletctl
  (exit 2, nothing of it written, the good skill pushed beside it written)
  and by the API (422 ``invalid_skill`` with ``file`` and ``field``);
* the second push made a second revision; the first still reads as of its seq;
* a retired skill leaves the list, its history stays, retiring it again is a 404;
* two drafts written on the log as the curation pass writes them: their
  approvals are listed among the approvals (kind ``promotion``, of no
  conversation); one is promoted through ``POST /v1/approvals/{id}`` by
  alice (bob's token and the admin's: 403 ``not_allowed`` naming her), and the
  skill is then listed; the other is rejected with ``crewletctl skills reject``
  (bob's token refused first), and promoting it after is a 409.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import httpx2
import pytest

from crewlet import tokens
from crewlet.company.load import parse_company
from crewlet.estate.ops import make_op
from roles.ingress.api.conversations import promotion_decider
from roles.ingress.problems import Problem
from tests.conftest import CREWLETCTL, Nodes, wait_for
from tests.estate import publish_to
from tests.seats import node_url, write_company

pytestmark = pytest.mark.timeout(240)

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
COMPANY = """
company: {name: skills-api}
providers: {p: {kind: scripted, rules: [{match: '.*', reply: 'ok'}]}}
seats:
  - {name: clerk, persona: You file things., provider: p}
people:
  alice: {name: Alice Doe, decides: {promotions: true}}
  bob: {name: Bob Roe, decides: {approvals: [clerk]}}
"""

PDF_SKILL = """---
name: pdf-processing
description: Extracts text and tables from PDF files, fills forms and merges documents. Use when a task \
names a PDF.
license: Apache-2.0
compatibility: Needs Python 3.11 and the pypdf package
allowed-tools: Bash(python:*) Read
metadata:
  version: "1.2"
  crewlet-seats: clerk, eng-*
  crewlet-tools: file_read
---
# PDF processing

1. Read the PDF with `scripts/extract.py FILE`.
2. For forms, see [the reference](references/REFERENCE.md).
"""
PDF_REFERENCE = """# Reference

| field | what |
|---|---|
| `/T` | the field's name |
| `/V` | its value — UTF-8: « déjà vu », 日本語 |
"""
# CRLF line endings and tabs: kept byte for byte.
PDF_SCRIPT = ("#!/usr/bin/env python3\r\n\"\"\"Print a PDF's text.\"\"\"\r\nimport sys\r\n\r\n"
              "from pypdf import PdfReader\r\n\r\nfor page in PdfReader(sys.argv[1]).pages:\r\n"
              "\tprint(page.extract_text())\r\n")
NOTES_SKILL = """---
name: release-notes
description: Writes release notes from merged pull requests. Use when a release is cut.
metadata:
  crewlet-seats: clerk
---
# Release notes

Group the merged pull requests by kind, newest first. Use the template.
"""
NOTES_TEMPLATE = "## {version}\n\n### Added\n\n### Fixed\n"
# metadata.version as a bare number: the format's values under metadata are strings.
BROKEN_SKILL = """---
name: broken-skill
description: Looks like a skill.
metadata:
  version: 1.0
---
Body.
"""

ADMIN, ALICE, BOB = tokens.new_token(), tokens.new_token(), tokens.new_token()


def _write(root: str, files: dict[str, str]) -> None:
    for path, body in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8", newline="") as f:
            f.write(body)


@pytest.fixture(scope="module")
def node():
    made = Nodes()
    node = made(fleet=FAST, ingress={"tokens": [
        {"name": "ops", "sha256": tokens.digest(ADMIN), "scopes": ["admin"]},
        {"name": "alice-laptop", "sha256": tokens.digest(ALICE), "scopes": ["write"], "person": "alice"},
        {"name": "bob-laptop", "sha256": tokens.digest(BOB), "scopes": ["write"], "person": "bob"}]})
    try:
        node.start(args=("--company", write_company(node.dir, COMPANY)))
        base = f"http://{node.config['ingress']['listen']}"
        node.clients = {who: httpx2.Client(base_url=base, timeout=60, trust_env=False,
                                           headers={"Authorization": f"Bearer {token}"})
                        for who, token in (("admin", ADMIN), ("alice", ALICE), ("bob", BOB))}
        admin = node.clients["admin"]
        wait_for(lambda: admin.get("/readyz").status_code == 200, 30, what="the node ready")
        wait_for(lambda: admin.get("/v1/company").json().get("rev"), 20, what="the company in ingress")
        yield node
    finally:
        for client in getattr(node, "clients", {}).values():
            client.close()
        made.close()


def skills_ctl(node, *args: str, token: str = ADMIN) -> subprocess.CompletedProcess:
    """``crewletctl skills ARGS`` against *node*, its writes made with *token*; stdout as bytes."""
    env = {**os.environ, "CREWLET_API_TOKEN": token}
    return subprocess.run([*CREWLETCTL, "-c", node.config_path, "skills", *args], capture_output=True,
                          timeout=90, env=env)


def skills_json(node, *args: str, token: str = ADMIN):
    out = skills_ctl(node, *args, "--json", token=token)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def test_push_list_read_back_refuse_revise_and_retire(node, tmp_path):
    api = node.clients["admin"]
    checkout = str(tmp_path / "checkout")
    pdf = {"SKILL.md": PDF_SKILL, "references/REFERENCE.md": PDF_REFERENCE, "scripts/extract.py": PDF_SCRIPT}
    notes = {"SKILL.md": NOTES_SKILL, "references/TEMPLATE.md": NOTES_TEMPLATE}
    _write(checkout, {f"skills/pdf-processing/{p}": b for p, b in pdf.items()}
           | {f"skills/release-notes/{p}": b for p, b in notes.items()}
           | {"README.md": "# Our skills\n", ".git/HEAD": "ref: refs/heads/main\n"})

    # A checkout holding skills: both pushed, each as its first revision.
    pushed = skills_json(node, "push", checkout, "--note", "from the team's repository")
    assert pushed["problems"] == [] and pushed["refused"] == [], pushed
    assert sorted(w["name"] for w in pushed["written"]) == ["pdf-processing", "release-notes"]
    first = {w["name"]: w["seq"] for w in pushed["written"]}
    listed = api.get("/v1/skills").json()
    assert [(s["name"], s["files"]) for s in listed["items"]] == [
        ("pdf-processing", ["SKILL.md", "references/REFERENCE.md", "scripts/extract.py"]),
        ("release-notes", ["SKILL.md", "references/TEMPLATE.md"])], listed
    pdf_row = listed["items"][0]
    assert pdf_row["note"] == "from the team's repository"
    assert pdf_row["description"].startswith("Extracts text and tables from PDF files")
    assert pdf_row["meta"]["seats"] == ["clerk", "eng-*"] and pdf_row["meta"]["metadata"]["version"] == "1.2"
    assert pdf_row["meta"]["allowed_tools"] == ["Bash(python:*)", "Read"]
    assert [s["name"] for s in api.get("/v1/skills", params={"seat": "eng-web"}).json()["items"]] == \
        ["pdf-processing"]
    assert [s["name"] for s in skills_json(node, "--seat", "clerk")["skills"]] == ["pdf-processing", "release-notes"]

    # Every file back byte for byte: through the API, and through crewletctl.
    for name, files in (("pdf-processing", pdf), ("release-notes", notes)):
        for path, body in files.items():
            r = api.get(f"/v1/skills/{name}", params={"file": path})
            assert r.status_code == 200 and r.json()["file"] == {"path": path, "body": body}, r.text
            out = skills_ctl(node, "show", name, path)
            assert out.returncode == 0 and out.stdout == body.encode(), (path, out.stdout, out.stderr)
    shown = skills_json(node, "show", "pdf-processing")  # SKILL.md by default
    assert shown["file"]["body"] == PDF_SKILL and shown["skill"]["seq"] == first["pdf-processing"]
    r = api.get("/v1/skills/pdf-processing", params={"file": "scripts/missing.py"})
    assert r.status_code == 404 and "scripts/extract.py" in r.json()["detail"], r.text
    assert api.get("/v1/skills/no-such-skill").status_code == 404

    # A malformed skill beside a changed good one: refused here naming the file and the
    # field, never sent; the good one written (its second revision).
    _write(str(tmp_path / "more"), {"broken-skill/SKILL.md": BROKEN_SKILL,
                                     "release-notes/SKILL.md": NOTES_SKILL + "\nSay who reviewed each.\n",
                                     "release-notes/references/TEMPLATE.md": NOTES_TEMPLATE})
    out = skills_ctl(node, "push", str(tmp_path / "more" / "broken-skill"), str(tmp_path / "more" / "release-notes"))
    err = out.stderr.decode()
    assert out.returncode == 2, (out.returncode, err)
    assert f"{tmp_path}/more/broken-skill/SKILL.md: metadata.version: must be a string, got float" in err, err
    assert "wrote release-notes: revision" in out.stdout.decode(), out.stdout
    assert "broken-skill" not in [s["name"] for s in api.get("/v1/skills").json()["items"]]
    # The API holds a skill to the same rules before it sends anything.
    r = api.put("/v1/skills/broken-skill", json={"files": [{"path": "SKILL.md", "body": BROKEN_SKILL}]})
    assert r.status_code == 422, r.text
    assert (r.json()["code"], r.json()["file"], r.json()["field"]) == \
        ("invalid_skill", "broken-skill/SKILL.md", "metadata.version"), r.text
    r = api.put("/v1/skills/release-notes", json={"files": [{"path": "SKILL.md", "body": PDF_SKILL}]})
    assert r.status_code == 422 and r.json()["field"] == "name", r.text  # its front matter names another
    r = api.put("/v1/skills/release-notes", json={"files": [{"path": "../SKILL.md", "body": NOTES_SKILL}]})
    assert r.status_code == 422 and r.json()["field"] == "path", r.text

    # Revisions: the second push is the newest; the first reads as of its seq.
    revisions = api.get("/v1/skills/release-notes/revisions").json()["items"]
    assert len(revisions) == 2 and revisions[1]["seq"] == first["release-notes"], revisions
    assert [r["seq"] for r in skills_json(node, "revisions", "release-notes")["revisions"]] == \
        [r["seq"] for r in revisions]
    now = api.get("/v1/skills/release-notes").json()
    assert now["file"]["body"].endswith("Say who reviewed each.\n") and now["skill"]["seq"] == revisions[0]["seq"]
    then = api.get("/v1/skills/release-notes", params={"as_of": first["release-notes"]}).json()
    assert then["file"]["body"] == NOTES_SKILL
    assert skills_json(node, "show", "release-notes", "--as-of", str(first["release-notes"]))["file"]["body"] == \
        NOTES_SKILL

    # Retired: out of the list and unreadable, its history kept; again, a 404.
    retired = skills_json(node, "retire", "pdf-processing")
    assert retired["retired"] is True and retired["files"] == []
    assert [s["name"] for s in api.get("/v1/skills").json()["items"]] == ["release-notes"]
    assert api.get("/v1/skills/pdf-processing").status_code == 404
    assert [r["retired"] for r in api.get("/v1/skills/pdf-processing/revisions").json()["items"]] == [True, False]
    r = api.delete("/v1/skills/pdf-processing")
    assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
    out = skills_ctl(node, "retire", "pdf-processing")
    assert out.returncode == 1 and b"no skill pdf-processing" in out.stderr, out.stderr


def _draft_op(name: str, cluster: str, approval: str):
    body = (f"---\nname: {name}\ndescription: Drafted from the clerk's work on {cluster}.\n"
            f"metadata:\n  crewlet-cluster: {cluster}\n---\n# {name}\n\nDo it the way it worked.\n")
    return make_op("skill.draft", {"name": name, "cluster": cluster, "seat": "clerk", "episodes": [3, 5],
                                   "files": [{"path": "SKILL.md", "body": body}], "approval": approval,
                                   "expires_at": time.time() + 3600}, node="tester")


def test_drafts_are_promoted_and_rejected_by_who_decides_promotions(node):
    api, alice, bob = node.clients["admin"], node.clients["alice"], node.clients["bob"]
    asyncio.run(publish_to(node_url(node), [_draft_op("triage-bugs", "c-triage", "promote-triage"),
                                            _draft_op("weekly-report", "c-weekly", "promote-weekly")]))
    drafts = wait_for(lambda: (lambda d: d if len(d) == 2 else None)(
        api.get("/v1/skills/drafts", params={"status": "pending"}).json()["items"]), 20, what="both drafts")
    assert [(d["name"], d["approval"], d["seat"]) for d in drafts] == [
        ("triage-bugs", "promote-triage", "clerk"), ("weekly-report", "promote-weekly", "clerk")]
    draft = api.get("/v1/skills/drafts/triage-bugs").json()
    assert draft["file"]["body"].startswith("---\nname: triage-bugs\n") and draft["draft"]["episodes"] == [3, 5]
    assert [d["name"] for d in skills_json(node, "drafts")["drafts"]] == ["triage-bugs", "weekly-report"]

    # Their approvals are listed among the approvals: a promotion's, of no conversation.
    pending = {a["id"]: a for a in api.get("/v1/approvals", params={"status": "pending"}).json()["items"]}
    assert {"promote-triage", "promote-weekly"} <= set(pending), pending
    row = api.get("/v1/approvals/promote-triage").json()
    assert (row["kind"], row["conversation"], row["run"], row["tool"]) == \
        ("promotion", None, None, "skill.promote"), row

    # Only alice decides promotions: bob (who decides the clerk's tool calls) and the
    # admin are refused, naming her; nothing decided meanwhile.
    for who in (bob, api):
        r = who.post("/v1/approvals/promote-triage", json={"decision": "approve"})
        assert r.status_code == 403 and r.json()["code"] == "not_allowed", r.text
        assert "skill promotions are decided by alice" in r.json()["detail"], r.text
    r = api.post("/v1/skills/drafts/triage-bugs/promote", json={})
    assert r.status_code == 403 and r.json()["code"] == "not_allowed", r.text
    assert api.get("/v1/approvals/promote-triage").json()["status"] == "pending"
    r = alice.post("/v1/approvals/promote-triage", json={"decision": "approve", "note": "it works"})
    assert r.status_code == 200, r.text
    assert (r.json()["by"], r.json()["decision"], r.json()["kind"]) == ("person:alice", "approve", "promotion")
    # The skill is listed, its revision made of the draft; the draft says so.
    listed = {s["name"]: s for s in api.get("/v1/skills").json()["items"]}
    assert listed["triage-bugs"]["draft"] == "triage-bugs", listed
    assert api.get("/v1/skills/triage-bugs").json()["file"]["body"] == draft["file"]["body"]
    assert api.get("/v1/skills/drafts/triage-bugs").json()["draft"]["status"] == "promoted"
    # The same decision again, through the skills route: answered the same.
    again = alice.post("/v1/skills/drafts/triage-bugs/promote")
    assert again.status_code == 200 and again.json()["skill"]["name"] == "triage-bugs", again.text

    # The other rejected with crewletctl: bob's token refused first, alice's taken.
    out = skills_ctl(node, "reject", "weekly-report", token=BOB)
    assert out.returncode == 1 and b"not_allowed" in out.stderr, out.stderr
    rejected = skills_json(node, "reject", "weekly-report", "--note", "too narrow", token=ALICE)
    assert (rejected["draft"]["status"], rejected["approval"]["by"], rejected["skill"]) == \
        ("rejected", "person:alice", None), rejected
    r = alice.post("/v1/skills/drafts/weekly-report/promote", json={"note": "changed my mind"})
    assert r.status_code == 409 and r.json()["code"] == "already_decided", r.text
    assert "weekly-report" not in [s["name"] for s in api.get("/v1/skills").json()["items"]]
    assert api.post("/v1/skills/drafts/no-such-draft/promote").status_code == 404


def test_who_decides_a_promotion_when_nobody_is_named_and_when_somebody_is():
    """No node: the rule itself. Nobody named for promotions: an admin token
    (of a person or not), never a write token; somebody named: only their
    tokens, the admin's refused."""
    def grant(name: str, scope: str, person: str | None = None) -> tokens.Grant:
        return tokens.Grant(name, "0" * 64, tokens.implied([scope]), person)

    def refusal(company, g) -> str:
        with pytest.raises(Problem) as refused:
            promotion_decider(company, g)
        assert (refused.value.status, refused.value.code) == (403, "not_allowed")
        return refused.value.detail

    nobody = parse_company(COMPANY.replace("decides: {promotions: true}", "decides: {}"))
    assert promotion_decider(nobody, grant("ops", "admin")) == "api:ops"
    assert promotion_decider(nobody, grant("alice-admin", "admin", "alice")) == "person:alice"
    assert "an admin token" in refusal(nobody, grant("alice-laptop", "write", "alice"))
    named = parse_company(COMPANY)
    assert promotion_decider(named, grant("alice-laptop", "write", "alice")) == "person:alice"
    assert "decided by alice: bob is not one of them" in refusal(named, grant("bob-laptop", "write", "bob"))
    assert "belongs to nobody" in refusal(named, grant("ops", "admin"))
