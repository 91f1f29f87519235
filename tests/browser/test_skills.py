"""The dashboard's Skills tab (roles/ingress/dashboard/js/skills.js) and a
promotion's card in the Approvals panel, on a real node in a real Chromium.

One node (a node start costs the suite seconds): its company names alice to
decide promotions; its tokens are an admin's (the test's own calls, as
``crewletctl skills push`` would make them), alice's and bob's. A skill is
written through the API (a SKILL.md full of markup and odd whitespace, and a
reference), three drafts are published on the estate's log as the curation
pass writes them, one of them rejected by alice. Then, in the page:

* the tab lists the skill (name, description, revision, files, who), opens
  it and shows its SKILL.md exactly, as text (no element of its markup
  made), opens its other file, and lists its revision;
* the drafts are listed waiting first, each with its seat and episode count;
  a draft opens like a skill;
* bob's Promote is refused, saying who decides (the API's reason), and
  nothing is decided; the tab counts the two promotions waiting;
* the other draft's card in the Approvals panel reads as a promotion, not
  as a tool call of conversation null;
* signed in as alice, Promote makes the draft a skill listed in the tab (the
  list read again), decided by her, its card gone from the Approvals panel;
  approving the other draft's card there lists that skill in the tab too;
* Retire asks first: cancelled, nothing happens; confirmed, the skill leaves
  the list and its history shows the retirement.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import pytest

from crewlet import tokens
from crewlet.estate.ops import make_op
from tests.integration.test_skills_api import COMPANY as API_COMPANY
from tests.browser.conftest import call, dashboard, ready
from tests.conftest import wait_for
from tests.estate import publish_to
from tests.seats import node_url, write_company

pytestmark = pytest.mark.browser

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
ADMIN, ALICE, BOB = tokens.new_token(), tokens.new_token(), tokens.new_token()

# The same company as the API's test: a clerk, alice who decides promotions, bob who does not.
COMPANY = API_COMPANY

# Markup, entities, indentation, trailing spaces, a tab and blank lines: all of it shown as written.
SKILL_MD = """---
name: release-notes
description: Writes release notes from merged pull requests. Use when a release is cut.
metadata:
  crewlet-seats: clerk
---
# Release notes

Group the merged pull requests by kind, <b>newest</b> first.
<script>window.__pwned = 1</script>
<img src="x" onerror="window.__pwned = 2">

    Indented: &amp; an ampersand, "quotes" and trailing spaces{trailing}
\tA tab, then  two  spaces.


Last line.
""".format(trailing="   ")
CHECKLIST = "# Checklist\n\n- [ ] <i>every</i> PR has a label\n- [ ] the version is bumped\n"


def draft_body(name: str, description: str) -> str:
    return (f"---\nname: {name}\ndescription: {description}\n---\n# {name}\n\n"
            f"Do it the way it <em>worked</em>:\n  1. read\n  2. act\n")


def draft_op(name: str, cluster: str, approval: str, episodes: list[int], description: str):
    return make_op("skill.draft", {
        "name": name, "cluster": cluster, "seat": "clerk", "episodes": episodes,
        "files": [{"path": "SKILL.md", "body": draft_body(name, description)}],
        "approval": approval, "expires_at": time.time() + 3600}, node="tester")


def publish(node, ops: list) -> None:
    """The ops on the node's estate log, from another thread: Playwright's sync API
    holds this one's event loop (tests/browser/conftest.py)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, publish_to(node_url(node), ops)).result(timeout=60)


def api(node, method: str, path: str, body=None, token: str = ADMIN, status: int = 200):
    got, answer = call(node, method, path, body, token=token)
    assert got == status, (method, path, got, answer)
    return answer


def hold_approval_reads(page) -> list:
    """Hold the page's readings of the pending approvals (every 5 s: they would read
    the Skills tab again too) until released: the routes held."""
    held: list = []
    page.route(lambda url: "/v1/approvals?" in url, lambda route: held.append(route))
    return held


def release(page, held: list) -> None:
    page.unroute_all()
    for route in held:
        try:
            route.continue_()
        except Exception as exc:  # playwright's Error: handled already (the page moved on) — nothing to release
            if "already handled" not in str(exc):
                raise


def signed_in(page, node, token: str):
    from playwright.sync_api import expect
    page.goto(dashboard(node) + "#token=" + token)
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    return expect


def test_skills_listed_read_promoted_and_retired_and_a_promotions_card(make_node, page):
    node = make_node(fleet=FAST, ingress={"tokens": [
        {"name": "ops", "sha256": tokens.digest(ADMIN), "scopes": ["admin"]},
        {"name": "alice-laptop", "sha256": tokens.digest(ALICE), "scopes": ["write"], "person": "alice"},
        {"name": "bob-laptop", "sha256": tokens.digest(BOB), "scopes": ["write"], "person": "bob"}]})
    node.start(args=("--company", write_company(node.dir, COMPANY)))
    ready(node)
    wait_for(lambda: (call(node, "GET", "/v1/company", token=ADMIN)[1] or {}).get("rev"), 20,
             what="the company in ingress")

    written = api(node, "PUT", "/v1/skills/release-notes", {
        "files": [{"path": "SKILL.md", "body": SKILL_MD},
                  {"path": "references/CHECKLIST.md", "body": CHECKLIST}],
        "note": "from the team's repository"})
    seq = written["seq"]
    publish(node, [
        draft_op("archive-logs", "c-archive", "promote-archive", [2], "Archives old logs."),
        draft_op("triage-bugs", "c-triage", "promote-triage", [3, 5, 8], "Triages new bug reports by area."),
        draft_op("weekly-report", "c-weekly", "promote-weekly", [4, 6],
                 "Writes the weekly report on Fridays.")])
    wait_for(lambda: len(api(node, "GET", "/v1/skills/drafts")["items"]) == 3, 20, what="the three drafts")
    api(node, "POST", "/v1/skills/drafts/archive-logs/reject", {"note": "too narrow"}, token=ALICE)

    # ---- bob: reads everything, may not promote.
    expect = signed_in(page, node, BOB)
    page.get_by_test_id("tab-skills").click()
    expect(page.get_by_test_id("panel-skills")).to_be_visible()
    row = page.get_by_test_id("skill-row-release-notes")
    expect(row.get_by_test_id("skill-description")).to_have_text(
        "Writes release notes from merged pull requests. Use when a release is cut.")
    expect(row.get_by_test_id("skill-seq")).to_have_text(f"revision {seq}")
    expect(row.get_by_test_id("skill-files")).to_have_text("2 files: SKILL.md, references/CHECKLIST.md")
    expect(row.get_by_test_id("skill-written")).to_contain_text("by operator@")
    expect(page.locator("[data-testid^=skill-row-]")).to_have_count(1)
    expect(page.get_by_test_id("skills-status")).to_have_text("1 skill")

    # Opened: its SKILL.md exactly, as text; its other file; its revision.
    row.click()
    expect(row).to_have_attribute("aria-pressed", "true")
    box = page.get_by_test_id("skill-detail")
    expect(box.get_by_test_id("skill-detail-title")).to_have_text("release-notes")
    expect(box.get_by_test_id("skill-file-path")).to_have_text("SKILL.md")
    body = box.get_by_test_id("skill-file-body")
    expect(body).to_contain_text("Last line.")
    assert body.text_content() == SKILL_MD
    assert page.locator(", ".join(f"#panel-skills {tag}" for tag in ("b", "script", "img", "i"))).count() == 0
    assert page.evaluate("window.__pwned") is None
    expect(box.get_by_test_id("skill-detail-seq")).to_have_text(str(seq))
    expect(box.locator("[data-testid^=revision-]")).to_have_count(1)
    expect(box.get_by_test_id(f"revision-{seq}")).to_contain_text("from the team's repository")
    box.get_by_test_id("skill-file-references/CHECKLIST.md").click()
    expect(box.get_by_test_id("skill-file-path")).to_have_text("references/CHECKLIST.md")
    expect(box.get_by_test_id("skill-file-body")).to_contain_text("the version is bumped")
    assert box.get_by_test_id("skill-file-body").text_content() == CHECKLIST
    expect(box.get_by_test_id("skill-file-references/CHECKLIST.md")).to_have_attribute("aria-current", "true")

    # The drafts: those waiting first (by name), then the decided; each with its seat and episodes.
    drafts = page.get_by_test_id("drafts-list").locator("[data-testid^=draft-row-]")
    expect(drafts).to_have_count(3)
    assert [drafts.nth(i).get_attribute("data-testid") for i in range(3)] == \
        ["draft-row-triage-bugs", "draft-row-weekly-report", "draft-row-archive-logs"]
    triage = page.get_by_test_id("draft-row-triage-bugs")
    expect(triage).to_have_attribute("data-status", "pending")
    expect(triage.get_by_test_id("draft-source")).to_contain_text(
        "From 3 episodes of seat clerk · cluster c-triage")
    expect(triage.get_by_test_id("draft-description")).to_have_text("Triages new bug reports by area.")
    expect(page.get_by_test_id("draft-row-weekly-report").get_by_test_id("draft-source")).to_contain_text(
        "From 2 episodes of seat clerk")
    archived = page.get_by_test_id("draft-row-archive-logs")
    expect(archived).to_have_attribute("data-status", "rejected")
    expect(archived.get_by_test_id("draft-decided")).to_contain_text("Rejected by person:alice")
    expect(archived.get_by_test_id("draft-promote")).to_have_count(0)
    expect(page.get_by_test_id("drafts-status")).to_have_text("2 waiting for a decision · 1 decided")
    # A draft opens like a skill.
    triage.get_by_test_id("draft-open").click()
    expect(box.get_by_test_id("skill-detail-title")).to_have_text("Draft triage-bugs")
    assert box.get_by_test_id("skill-file-body").text_content() == \
        draft_body("triage-bugs", "Triages new bug reports by area.")
    assert page.locator("#skill-detail em").count() == 0
    # The Approvals panel's reading counts the promotions waiting on the tab.
    expect(page.get_by_test_id("tab-skills-count")).to_have_text("2")

    # Bob's Promote: refused with the API's reason, the draft still waiting.
    triage.get_by_test_id("draft-promote").click()
    message = triage.get_by_test_id("draft-message")
    expect(message).to_contain_text("Not decided: This token is not allowed to do that: "
                                    "skill promotions are decided by alice: bob is not one of them")
    expect(message).to_have_attribute("data-kind", "bad")
    expect(triage.get_by_test_id("draft-promote")).to_be_enabled()
    expect(triage.get_by_test_id("draft-promote")).to_have_text("Promote")
    assert api(node, "GET", "/v1/skills/drafts/triage-bugs")["draft"]["status"] == "pending"
    api(node, "GET", "/v1/skills/triage-bugs", status=404)

    # The other draft's card in the Approvals panel reads as a promotion.
    card = page.get_by_test_id("approval-promote-weekly")
    expect(card).to_have_attribute("data-approval-kind", "promotion")
    expect(card.get_by_test_id("approval-title")).to_have_text(
        "Promote drafted skill weekly-report (from 2 episodes of seat clerk)")
    expect(card.get_by_test_id("approval-description")).to_have_text("Writes the weekly report on Fridays.")
    expect(card.get_by_test_id("approval-draft")).to_have_text("weekly-report")
    expect(card.get_by_test_id("approval-conversation")).to_have_count(0)
    expect(card).not_to_contain_text("null")
    expect(card).not_to_contain_text("wants to call")
    card.get_by_test_id("approval-draft").click()   # read in the Skills tab
    expect(box.get_by_test_id("skill-detail-title")).to_have_text("Draft weekly-report")
    expect(box.get_by_test_id("skill-file-body")).to_contain_text("Writes the weekly report on Fridays.")

    # ---- alice, who decides promotions: signed in through the form, the tab read again.
    page.get_by_test_id("sign-out").click()
    expect(page.get_by_test_id("signin")).to_be_visible()
    page.get_by_test_id("signin-token").fill(ALICE)
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    expect(page.get_by_test_id("tab-skills")).to_have_attribute("aria-selected", "true")
    triage = page.get_by_test_id("draft-row-triage-bugs")
    expect(triage.get_by_test_id("draft-message")).to_have_text("")   # nothing of bob's page stayed
    expect(box.get_by_test_id("skill-detail-title")).to_have_count(0)
    expect(page.get_by_test_id("approval-promote-triage")).to_be_visible()
    triage.get_by_test_id("draft-open").click()
    expect(box.get_by_test_id("draft-detail-status")).to_have_attribute("data-status", "pending")
    triage.get_by_test_id("draft-note").fill("it <b>works</b>")
    # The approvals are not read meanwhile: what follows is the tab's own doing.
    held = hold_approval_reads(page)
    triage.get_by_test_id("draft-promote").click()
    expect(page.get_by_test_id("skills-result")).to_contain_text(
        "Promoted: draft triage-bugs is now skill triage-bugs")
    promoted = page.get_by_test_id("skill-row-triage-bugs")
    expect(promoted).to_be_visible()   # the list read again
    expect(page.get_by_test_id("approval-promote-triage")).to_have_count(0)   # the panel told
    expect(promoted.get_by_test_id("skill-description")).to_have_text("Triages new bug reports by area.")
    expect(triage).to_have_attribute("data-status", "promoted")
    expect(triage.get_by_test_id("draft-decided")).to_contain_text("Promoted by person:alice")
    approval = api(node, "GET", "/v1/approvals/promote-triage")
    assert (approval["decision"], approval["by"], approval["note"]) == \
        ("approve", "person:alice", "it <b>works</b>")
    skill = api(node, "GET", "/v1/skills/triage-bugs")
    assert skill["skill"]["draft"] == "triage-bugs"
    assert skill["file"]["body"] == draft_body("triage-bugs", "Triages new bug reports by area.")
    expect(promoted.get_by_test_id("skill-seq")).to_have_text(f"revision {skill['skill']['seq']}")
    # The draft shown in the detail was read again: decided, no buttons.
    expect(box.get_by_test_id("draft-detail-status")).to_have_attribute("data-status", "promoted")
    expect(box.get_by_test_id("draft-promote")).to_have_count(0)

    # The other promoted from its card in the Approvals panel: the tab lists that skill too.
    card = page.get_by_test_id("approval-promote-weekly")
    card.get_by_role("button", name="Approve").click()
    expect(card).to_have_count(0)
    expect(page.get_by_test_id("approvals-result")).to_contain_text(
        "Promoted: drafted skill weekly-report is now a skill")
    expect(page.get_by_test_id("skill-row-weekly-report")).to_be_visible()
    expect(page.get_by_test_id("draft-row-weekly-report")).to_have_attribute("data-status", "promoted")
    release(page, held)
    expect(page.get_by_test_id("tab-skills-count")).to_be_hidden()   # read again: none waits
    assert api(node, "GET", "/v1/approvals/promote-weekly")["by"] == "person:alice"
    expect(page.locator("[data-testid^=skill-row-]")).to_have_count(3)

    # ---- Retire asks first: cancelled, nothing; confirmed, it leaves the list, its history says so.
    page.get_by_test_id("skill-row-release-notes").click()
    expect(box.get_by_test_id("skill-detail-title")).to_have_text("release-notes")
    box.get_by_test_id("skill-retire").click()
    question = box.get_by_test_id("skill-retire-question")
    expect(question).to_contain_text("Retire skill release-notes?")
    box.get_by_test_id("skill-retire-cancel").click()
    expect(question).to_have_count(0)
    expect(box.get_by_test_id("skill-retire")).to_be_focused()
    assert api(node, "GET", "/v1/skills/release-notes")["skill"]["seq"] == seq
    box.get_by_test_id("skill-retire").click()
    box.get_by_test_id("skill-retire-confirm").click()
    expect(page.get_by_test_id("skills-result")).to_contain_text("Retired skill release-notes")
    expect(page.get_by_test_id("skill-row-release-notes")).to_have_count(0)
    expect(page.locator("[data-testid^=skill-row-]")).to_have_count(2)
    expect(box.get_by_test_id("skill-retired")).to_contain_text("no seat sees it any more")
    revisions = box.locator("[data-testid^=revision-]")
    expect(revisions).to_have_count(2)
    expect(revisions.first).to_have_attribute("data-retired", "true")
    expect(revisions.nth(1)).to_have_attribute("data-testid", f"revision-{seq}")
    api(node, "GET", "/v1/skills/release-notes", status=404)
    history = api(node, "GET", "/v1/skills/release-notes/revisions")["items"]
    assert [r["retired"] for r in history] == [True, False]
