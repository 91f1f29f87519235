"""The dashboard (roles/ingress/dashboard) on real nodes, in a real headless Chromium.

Every test starts real crewletd nodes (tests/conftest.py), opens the node's
``/ui/`` the way an operator would (the token in the address's fragment, or
typed into the sign-in box) and acts on the API from the test with urllib.
Waits are Playwright's own (``expect``/``wait_for``) or :func:`wait_for`,
each with its deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx2
import pytest
import yaml

from tests.browser.conftest import base_url, call, company_known, dashboard, ok, ready, token_of
from tests.conftest import CREWLETCTL, wait_for
from tests.seats import SAMPLE, held, write_company

pytestmark = pytest.mark.browser

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
# The sample company plus a seat whose provider can never answer: its mail is
# dead-lettered on the first try (a missing API key is not worth retrying).
FAILING = {"provider": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                        "api_key_env": "CREWLET_TEST_NO_SUCH_KEY"},
           "seat": {"name": "billing", "persona": "You send the invoices.", "provider": "gone"}}


# A seat whose task_create waits for a person (as in tests/integration/test_conversations.py).
APPROVING = r"""
company: {name: Front Desk}
providers:
  scripted:
    kind: scripted
    rules:
      - match: '(?i)create a task (.+)'
        reply: 'Created: {tools}'
        tools:
          - {name: task_create, args: {title: '\1'}}
      - match: '.*'
        reply: 'Heard you.'
seats:
  - {name: clerk, persona: You file tasks., provider: scripted, approval: [task_create]}
"""


def sample_with_failing_seat(dir: str) -> str:
    with open(SAMPLE) as f:
        company = yaml.safe_load(f)
    company["providers"]["gone"] = FAILING["provider"]
    company["seats"].append(FAILING["seat"])
    return write_company(dir, yaml.safe_dump(company, sort_keys=False))


def items(node, path: str) -> list | None:
    """The items of a listing, or None while the node cannot answer (for wait_for)."""
    status, answer = call(node, "GET", path)
    return answer["items"] if status == 200 else None


def open_dashboard(page, node):
    """The node's dashboard, signed in through the address's fragment, live."""
    from playwright.sync_api import expect
    page.goto(dashboard(node) + "#token=" + token_of(node))
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    return expect


# --------------------------------------------------------------------------


def test_mail_sent_through_the_api_shows_its_turn_in_the_feed_within_2s(make_node, page):
    node = make_node(fleet=FAST).start(args=("--company", SAMPLE))
    wait_for(lambda: held(node).get("ceo") == "t1", 30, what="ceo held")
    company_known(node)  # the mail route's: ingress hears of the company on its own
    # The ceo's first turn waits for its own MCP server to start (seconds):
    # worked once before the clock runs, so what is timed is the dashboard.
    first = ok(node, "POST", "/v1/seats/ceo/mail", {"text": "hello", "wait": 30})
    assert first["turn"] and first["turn"]["outcome"] == "done", first
    expect = open_dashboard(page, node)
    expect(page.locator(f"[data-testid=turn][data-trigger='{first['trigger']}']")).to_be_visible()

    # The token left the address bar for this tab's session storage (not kept past it).
    assert "token" not in page.url
    assert page.evaluate("sessionStorage.getItem('crewlet.token')") == token_of(node)
    assert page.evaluate("localStorage.getItem('crewlet.token')") is None
    # The fleet and the company, as the snapshot has them.
    expect(page.get_by_test_id("company-name")).to_have_text("Lantern Software")
    expect(page.get_by_test_id("company-rev")).to_have_text("revision 1")
    card = page.get_by_test_id("node-t1")
    expect(card).to_have_attribute("data-state", "up")
    expect(card.get_by_test_id("child-ingress")).to_have_attribute("data-state", "running")
    # Its seats' tools run confined, and the card says so (unconfined: a warning, with the fix).
    expect(card.get_by_test_id("node-sandbox")).to_have_attribute("data-state", "confined")
    expect(card.get_by_test_id("node-sandbox")).to_contain_text("Confined")
    # Its own upkeep, for an admin's token (GET /v1/admin/capacity, /retention).
    expect(card.get_by_test_id("node-capacity")).to_contain_text("free")
    expect(card.get_by_test_id("node-capacity")).to_contain_text("estate copy")
    expect(card.get_by_test_id("node-retention")).to_contain_text("turns 90 d · events 7 d · mail 14 d")
    expect(page.get_by_test_id("duty-fleet_shape")).to_have_attribute("data-node", "t1")
    expect(page.locator("[data-testid^=seat-row-]")).to_have_count(30)
    expect(page.get_by_test_id("seat-row-ceo")).to_contain_text("t1")

    sent = ok(node, "POST", "/v1/seats/ceo/mail", {"text": "hello from the browser test"})
    posted = time.monotonic()
    turn = page.locator(f"[data-testid=turn][data-trigger='{sent['trigger']}']")
    turn.wait_for(state="attached", timeout=2000)
    took = time.monotonic() - posted
    assert took < 2.0, f"the turn showed {took:.2f}s after the mail was sent"
    expect(turn).to_have_attribute("data-outcome", "done")
    expect(turn).to_contain_text("Hello! What can I do for you?")
    expect(turn).to_contain_text("on t1")
    # The newest turn is on top, and the seat's row says what its last turn did.
    expect(page.get_by_test_id("turn").first).to_have_attribute("data-trigger", sent["trigger"])
    expect(page.get_by_test_id("turn").nth(1)).to_have_attribute("data-trigger", first["trigger"])
    expect(page.get_by_test_id("seat-row-ceo")).to_contain_text("Done")

    # Mail sent from the page's own form is worked like any other.
    page.get_by_test_id("mail-seat").select_option("ceo")
    page.get_by_test_id("mail-text").fill("calculate 6 * 7")
    page.get_by_test_id("mail-send").click()
    expect(page.get_by_test_id("mail-result")).to_contain_text("Sent to ceo")
    expect(page.get_by_test_id("turn").filter(has_text="6 * 7 = 42")).to_have_attribute("data-outcome", "done")

    # The seats table filters by name.
    page.get_by_test_id("seat-filter").fill("backend")
    expect(page.locator("[data-testid^=seat-row-]")).to_have_count(4)
    expect(page.get_by_test_id("seat-row-ceo")).to_have_count(0)


@pytest.mark.fleet
def test_a_killed_node_shows_as_gone_within_its_lease(natsd, make_node, page):
    """Two nodes on one broker (as tests/fleet/test_fleet.py runs a fleet);
    node b's whole tree is killed; a's dashboard shows b gone."""
    def fleet_node(node_id: str):
        return make_node(node={"id": node_id}, stream={"type": "nats", "servers": [natsd.url]},
                         fleet=FAST)
    a, b = fleet_node("a").start(), fleet_node("b").start()
    expect = open_dashboard(page, a)
    expect(page.get_by_test_id("node-b")).to_have_attribute("data-state", "up")
    expect(page.get_by_test_id("node-a")).to_have_attribute("data-state", "up")
    expect(page.get_by_test_id("tile-nodes")).to_have_attribute("data-kind", "ok")
    # Drained by the operator (from a's side), b says so and by whom; undrained, it is up again.
    drain = subprocess.run([*CREWLETCTL, "-c", a.config_path, "drain", "b", "--no-wait"],
                           capture_output=True, text=True, timeout=30)
    assert drain.returncode == 0, drain.stderr
    expect(page.get_by_test_id("node-b")).to_have_attribute("data-state", "drained", timeout=10_000)
    expect(page.get_by_test_id("node-b").get_by_test_id("node-state")).to_have_text("Drained")
    expect(page.get_by_test_id("node-b").get_by_test_id("node-drain")).to_contain_text("by crewletctl@a")
    undrain = subprocess.run([*CREWLETCTL, "-c", a.config_path, "undrain", "b"],
                             capture_output=True, text=True, timeout=30)
    assert undrain.returncode == 0, undrain.stderr
    expect(page.get_by_test_id("node-b")).to_have_attribute("data-state", "up", timeout=10_000)

    b.kill_tree()
    killed = time.monotonic()
    margin = 4.0
    expect(page.get_by_test_id("node-b")).to_have_attribute(
        "data-state", "gone", timeout=(FAST["lease_ttl"] + margin) * 1000)
    took = time.monotonic() - killed
    assert took < FAST["lease_ttl"] + margin, took
    expect(page.get_by_test_id("node-b").get_by_test_id("node-state")).to_have_text("Gone")
    expect(page.get_by_test_id("tile-nodes")).to_have_attribute("data-kind", "bad")
    expect(page.get_by_test_id("tile-nodes")).to_contain_text("1 gone")
    expect(page.get_by_test_id("node-a")).to_have_attribute("data-state", "up")


def test_requeue_from_the_page_puts_the_dead_letter_back_in_its_mailbox(make_node, page):
    node = make_node(fleet=FAST)
    node.start(args=("--company", sample_with_failing_seat(node.dir)))
    wait_for(lambda: held(node).get("billing") == "t1", 30, what="seat billing held")
    company_known(node)
    sent = ok(node, "POST", "/v1/seats/billing/mail", {"text": "send the <b>invoices</b>", "wait": 30})
    assert sent["turn"] and sent["turn"]["outcome"] == "failed", sent

    (letter,) = wait_for(lambda: items(node, "/v1/dlq"), 10, what="the dead letter")
    assert letter["trigger"] == sent["trigger"]

    expect = open_dashboard(page, node)
    row = page.get_by_test_id(f"dlq-row-{letter['seq']}")
    expect(row).to_contain_text("send the <b>invoices</b>")   # as text, not markup
    expect(row).to_contain_text("CREWLET_TEST_NO_SUCH_KEY")
    expect(page.get_by_test_id("tile-dead")).to_have_attribute("data-kind", "bad")
    expect(page.get_by_test_id("seat-row-billing")).to_have_attribute("data-status", "bad")

    page.get_by_test_id(f"requeue-{letter['seq']}").click()
    expect(page.get_by_test_id("dlq-result")).to_contain_text("Requeued")
    expect(page.get_by_test_id("dlq-result")).to_have_attribute("data-kind", "ok")

    # It left the dead letters, went back to the seat's mailbox and was worked
    # again: its turn (the requeue's trigger) is on record and in the feed.
    assert all(d["seq"] != letter["seq"] for d in ok(node, "GET", "/v1/dlq")["items"])
    again = f"{letter['trigger']}.requeue.{letter['seq']}"

    def worked_again():
        return [t for t in items(node, "/v1/turns?seat=billing") or () if t["trigger"] == again]
    (turn,) = wait_for(worked_again, 15, what="the requeued mail worked again")
    assert turn["outcome"] == "failed"  # still no key: it fails again, and is a new dead letter
    expect(page.locator(f"[data-testid=turn][data-trigger='{again}']")).to_have_attribute("data-outcome", "failed")
    new = wait_for(lambda: [d for d in items(node, "/v1/dlq") or () if d["trigger"] == again], 10,
                   what="the new dead letter")
    expect(page.get_by_test_id(f"dlq-row-{new[0]['seq']}")).to_be_visible()
    expect(page.get_by_test_id(f"dlq-row-{letter['seq']}")).to_have_count(0)


def test_sign_in_refuses_a_wrong_token_and_every_text_is_escaped(make_node, page):
    node = make_node(fleet=FAST).start(args=("--company", SAMPLE))
    ready(node)  # a task is written below: the estate must answer
    from playwright.sync_api import expect

    # No token: the sign-in box, saying where the token is.
    page.goto(dashboard(node))
    signin = page.get_by_test_id("signin")
    expect(signin).to_be_visible()
    expect(signin).to_contain_text("crewletctl status")
    expect(page.locator("main")).to_be_hidden()
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "signedout")

    # A wrong token: refused, in words.
    page.get_by_test_id("signin-token").fill("not-the-token")
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("signin-error")).to_contain_text("does not accept that token")
    expect(page.locator("main")).to_be_hidden()
    assert page.evaluate("localStorage.getItem('crewlet.token')") is None
    assert page.evaluate("sessionStorage.getItem('crewlet.token')") is None

    # A stored token the node refuses (a 401 on the feed): back to the sign-in box. The
    # page's other reads with it are held on their way (the network's timing, not the
    # node's answer) until the person has signed in again.
    held = []

    def hold_stale(route):
        stale = route.request.headers.get("authorization") == "Bearer stale"
        if stale and "/v1/events" not in route.request.url:
            held.append(route)
        else:
            route.continue_()
    page.route("**/v1/**", hold_stale)
    page.evaluate("localStorage.setItem('crewlet.token', 'stale')")
    page.reload()
    expect(page.get_by_test_id("signin-error")).to_contain_text("did not accept the saved token")

    # The right one: signed in, live, kept.
    page.get_by_test_id("signin-token").fill(token_of(node))
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    # The stale token's reads answered 401 only now: they sign nobody out.
    assert held, "the stale token read nothing but the feed"
    for route in held:
        route.continue_()
    for route in held:
        assert route.request.response().status == 401
    page.unroute("**/v1/**")
    with pytest.raises(AssertionError):  # waited for a sign-out 1.5 s after their refusals: none came
        expect(page.get_by_test_id("connection")).not_to_have_attribute("data-state", "live", timeout=1500)
    expect(signin).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('crewlet.token')") == token_of(node)
    assert page.evaluate("localStorage.getItem('crewlet.token')") is None  # "keep me signed in" not ticked
    assert "token" not in page.url

    # Text from the API is shown as text: a task titled like markup stays a title.
    title = "<img src=x onerror=\"window.__xss=1\"> fix the login <b>page</b>"
    task = ok(node, "POST", "/v1/tasks", {"title": title, "body": "<script>window.__xss=2</script>"})["task"]
    page.get_by_test_id("tab-tasks").click()
    row = page.get_by_test_id(f"task-row-{task['id']}")
    expect(row.get_by_test_id("task-title")).to_have_text(title)
    row.click()
    expect(page.get_by_test_id("task-detail-title")).to_contain_text(title)
    expect(page.get_by_test_id("task-detail")).to_contain_text("<script>window.__xss=2</script>")
    assert page.locator("#panel-tasks img, #panel-tasks b, #panel-tasks script").count() == 0
    assert page.evaluate("window.__xss") is None

    # Search: nothing found is said apart from a search nobody could run.
    page.get_by_test_id("tab-pages").click()
    page.get_by_test_id("search-input").fill("zebra")
    page.get_by_test_id("search-submit").click()
    expect(page.get_by_test_id("search-status")).to_contain_text("No page matches")
    page.route("**/v1/search?*", lambda route: route.fulfill(
        status=200, content_type="application/json",
        body='{"hits": [], "searched": false, "node": null, "answers": {"t1": "copy out of service"}}'))
    page.get_by_test_id("search-submit").click()
    status = page.get_by_test_id("search-status")
    expect(status).to_contain_text("could not be searched")
    expect(status).to_contain_text("t1: copy out of service")
    expect(status).not_to_contain_text("No page matches")
    # A partial search (a data node's shards missing) shows its hits and says it is partial.
    page.route("**/v1/search?*", lambda route: route.fulfill(
        status=200, content_type="application/json",
        body='{"hits": [{"path": "eng/deploy", "title": "Deploy", "snippet": "run make deploy"}], '
             '"searched": true, "node": "a, c", "answers": {}, "partial": true, '
             '"coverage": {"searched": 43, "of": 64, "missing": ["b"]}}'))
    page.get_by_test_id("search-submit").click()
    expect(status).to_contain_text("1 page matches")
    expect(status).to_contain_text("Partial: searched 43 of 64 shards; b did not answer.")

    # Files: the listing, and a download that carries the token (a plain link would not).
    body = b"the bytes of a report\n"
    r = httpx2.put(base_url(node) + "/v1/files/site/<b>report</b>.txt", content=body, trust_env=False,
                   headers={"Authorization": f"Bearer {token_of(node)}", "Content-Type": "text/plain"})
    assert r.status_code == 201, r.text
    page.get_by_test_id("tab-files").click()
    row = page.get_by_test_id("file-row-site/<b>report</b>.txt")
    expect(row).to_contain_text("site/<b>report</b>.txt")  # said as text, never markup
    expect(row).to_contain_text("text/plain")
    expect(page.get_by_test_id("files-status")).to_contain_text("1 file")
    with page.expect_download() as download:
        page.get_by_test_id("file-download-site/<b>report</b>.txt").click()
    with open(download.value.path(), "rb") as f:
        assert f.read() == body
    expect(page.get_by_test_id("files-status")).to_contain_text("Downloaded site/<b>report</b>.txt")
    assert page.locator("#panel-files b, #panel-files script").count() == 0

    # And the API itself refuses the wrong token the page was refused with.
    assert call(node, "GET", "/v1/fleet", token="not-the-token")[0] == 401


def test_pending_approvals_are_approved_and_denied_from_the_page(make_node, page):
    node = make_node(fleet=FAST, sessions={"sweep": 0.5}, approvals={"ttl": 600})
    path = os.path.join(node.dir, "company.yaml")
    with open(path, "w") as f:
        f.write(APPROVING)
    node.start(args=("--company", path))
    wait_for(lambda: held(node).get("clerk") == "t1", 30, what="seat clerk held")
    company_known(node)
    http = httpx2.Client(base_url=base_url(node), timeout=60, trust_env=False,
                         headers={"Authorization": f"Bearer {token_of(node)}"})

    def api(method: str, path: str, status: int = 200, **kw):
        r = http.request(method, path, **kw)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        return r.json()

    def conversation(conv: str) -> dict:
        return api("GET", f"/v1/conversations/{conv}", params={"limit": 500})

    def awaiting(title: str) -> tuple[str, dict]:
        """A conversation with clerk asked to create a task *title*: (its id, its pending approval)."""
        conv = api("POST", "/v1/conversations", 201, json={"seat": "clerk"})["id"]
        api("POST", f"/v1/conversations/{conv}/runs", 202, json={"input": f"create a task {title}"})
        wait_for(lambda: conversation(conv)["conversation"]["status"] == "awaiting_approval", 30,
                 what=f"conversation {conv} awaiting approval")
        approval = api("GET", f"/v1/approvals/{conversation(conv)['conversation']['approval']}")
        assert approval["status"] == "pending" and approval["args"] == {"title": title}, approval
        return conv, approval

    def tasks_titled(title: str) -> int:
        return sum(t["title"] == title for t in api("GET", "/v1/tasks", params={"limit": 500})["items"])

    def hold_decisions():
        """Hold every decision the page POSTs until released: the routes held."""
        routes: list = []
        page.route(lambda url: "/v1/approvals/" in url, lambda route: (
            routes.append(route) if route.request.method == "POST" else route.continue_()))
        return routes

    def until(condition, what: str, timeout: float = 10.0):
        """*condition* true within *timeout* s, Playwright's events dispatched meanwhile."""
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
            page.evaluate("0")

    try:
        expect = open_dashboard(page, node)
        expect(page.get_by_test_id("approvals-empty")).to_be_visible()
        expect(page.get_by_test_id("tile-approvals")).to_have_attribute("data-kind", "ok")

        # ---- 1. One pending approval, shown in full (its arguments as text), then approved.
        title = 'ship <b>v2</b> & "tell" them'
        conv, first = awaiting(title)
        item = page.get_by_test_id(f"approval-{first['id']}")
        expect(item).to_be_visible()   # by the page's own reading: every 5 s, or on the run's turn
        expect(item.get_by_test_id("approval-seat")).to_have_text("clerk")
        expect(item.get_by_test_id("approval-tool")).to_have_text("task_create")
        expect(item.get_by_test_id("approval-args")).to_have_text(json.dumps({"title": title}, indent=2))
        expect(item.get_by_test_id("approval-conversation")).to_have_text(conv)
        expect(item.get_by_test_id("approval-expires")).to_have_text("expires in 9 min")
        assert item.locator("b").count() == 0   # the arguments are text, not markup
        expect(page.get_by_test_id("approvals-count")).to_have_text("1")
        expect(page.get_by_test_id("tile-approvals")).to_have_attribute("data-kind", "warn")
        expect(page.locator("#sum-approvals")).to_have_text("1")
        assert tasks_titled(title) == 0

        posts = hold_decisions()
        approve, deny = item.get_by_role("button", name="Approve"), item.get_by_role("button", name="Deny")
        approve.click()
        # While the request is in flight, neither button can be pressed again.
        expect(approve).to_be_disabled()
        expect(deny).to_be_disabled()
        expect(approve).to_have_text("Approving…")
        until(lambda: posts, "the approval POSTed")
        posts[0].continue_()
        expect(item).to_have_count(0)
        expect(page.get_by_test_id("approvals-result")).to_contain_text("Approved: clerk's call to task_create")
        expect(page.get_by_test_id("approvals-count")).to_be_hidden()
        expect(page.get_by_test_id("approvals-empty")).to_be_visible()
        decided = api("GET", f"/v1/approvals/{first['id']}")
        assert decided["status"] == "decided" and decided["decision"] == "approve", decided
        wait_for(lambda: conversation(conv)["conversation"]["status"] == "idle", 30, what="resumed after approval")
        assert tasks_titled(title) == 1
        page.unroute_all()

        # ---- 2. Denied with a note: a network failure first (said in place), then for real.
        title = "rewrite everything in COBOL"
        conv, second = awaiting(title)
        item = page.get_by_test_id(f"approval-{second['id']}")
        expect(item).to_be_visible()
        note = "not this sprint <i>sorry</i>"
        item.get_by_label("Note").fill(note)
        page.route(lambda url: "/v1/approvals/" in url, lambda route: (
            route.abort() if route.request.method == "POST" else route.continue_()))
        deny = item.get_by_role("button", name="Deny")
        deny.click()
        message = item.get_by_test_id("approval-message")
        expect(message).to_contain_text("Not decided: the node did not answer")
        expect(message).to_have_attribute("data-kind", "bad")
        expect(deny).to_be_enabled()
        expect(deny).to_have_text("Deny")
        expect(item.get_by_label("Note")).to_have_value(note)
        assert api("GET", f"/v1/approvals/{second['id']}")["status"] == "pending"
        page.unroute_all()
        deny.click()
        expect(item).to_have_count(0)
        expect(page.get_by_test_id("approvals-result")).to_contain_text("Denied: clerk's call to task_create")
        decided = api("GET", f"/v1/approvals/{second['id']}")
        assert (decided["status"], decided["decision"], decided["note"]) == ("decided", "deny", note), decided
        wait_for(lambda: conversation(conv)["conversation"]["status"] == "idle", 30, what="resumed after denial")
        tools = [m for m in conversation(conv)["messages"] if m["role"] == "tool"]
        assert tools[-1]["error"] and "denied" in tools[-1]["text"] and note in tools[-1]["text"], tools[-1]
        assert tasks_titled(title) == 0
        # The Conversations tab tells the same.
        page.get_by_test_id("tab-convs").click()
        page.get_by_test_id(f"conv-row-{conv}").click()
        expect(page.get_by_test_id("conv-detail-status")).to_have_attribute("data-status", "idle")
        last_tool = page.locator("[data-testid=conv-message][data-role=tool]").last
        expect(last_tool).to_have_attribute("data-error", "true")
        expect(last_tool).to_contain_text("denied")
        expect(last_tool).to_contain_text(note)   # as text
        assert page.locator("#conv-detail i").count() == 0
        expect(page.get_by_test_id("conv-detail")).not_to_contain_text("null")

        # ---- 3. Decided by someone else while this page's decision was on its way: a 409, said in place.
        conv, third = awaiting("order more chairs")
        item = page.get_by_test_id(f"approval-{third['id']}")
        expect(item).to_be_visible()
        posts = hold_decisions()
        item.get_by_role("button", name="Approve").click()
        until(lambda: posts, "the approval POSTed")
        api("POST", f"/v1/approvals/{third['id']}", json={"decision": "deny", "note": "someone else"})
        # The page reads the list meanwhile: it is not pending any more, but the item being decided stays.
        page.get_by_test_id("approvals").get_by_role("button", name="Refresh", exact=True).click()
        expect(page.get_by_test_id("approvals-count")).to_be_hidden()
        expect(item).to_be_visible()
        expect(item.get_by_role("button", name="Approve")).to_be_disabled()
        posts[0].continue_()
        message = item.get_by_test_id("approval-message")
        expect(message).to_contain_text("Already decided: it was denied by api:")
        expect(message).to_contain_text("Yours was not recorded")
        expect(item).to_have_attribute("data-state", "settled")
        expect(item.get_by_test_id("approval-expires")).to_have_text("no longer waiting")
        expect(item.get_by_role("button", name="Approve")).to_have_count(0)
        expect(page.get_by_test_id("approvals-count")).to_be_hidden()   # it is not waiting any more
        item.get_by_role("button", name="Dismiss").click()
        expect(item).to_have_count(0)
        assert api("GET", f"/v1/approvals/{third['id']}")["decision"] == "deny"
        assert tasks_titled("order more chairs") == 0
    finally:
        http.close()


# ------------------------------------------------------------------ browser hardening (issue 24 §2)

# Every Content-Security-Policy violation the page sees, from the document's own event.
CSP_WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(`${e.effectiveDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`);
});
"""


def watch_csp(page) -> list[str]:
    """The console's CSP complaints on *page* (the list fills as they come)."""
    complaints: list[str] = []
    page.on("console", lambda m: complaints.append(m.text)
            if "Content Security Policy" in m.text or "Refused to" in m.text else None)
    page.add_init_script(CSP_WATCH)
    return complaints


def no_csp_violation(page, complaints: list[str]) -> None:
    seen = page.evaluate("window.__csp || []")
    assert seen == [] and complaints == [], (seen, complaints)


def test_hardened_dashboard_no_csp_violation_never_framed_token_per_tab(make_node, page):
    """No inline script or style (the strict CSP holds on every panel, and on /docs
    with swagger-ui from this origin); another site cannot frame the page; the
    token lives in the tab unless "Keep me signed in" is ticked; signing out clears both."""
    node = make_node(fleet=FAST).start(args=("--company", SAMPLE))
    from playwright.sync_api import expect
    complaints = watch_csp(page)
    origin = base_url(node)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))

    # Signed in through the form, not kept: this tab's session storage only.
    page.goto(dashboard(node))
    expect(page.get_by_test_id("signin")).to_be_visible()
    expect(page.get_by_test_id("signin-keep")).not_to_be_checked()
    page.get_by_test_id("signin-token").fill(token_of(node))
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    assert page.evaluate("sessionStorage.getItem('crewlet.token')") == token_of(node)
    assert page.evaluate("localStorage.getItem('crewlet.token')") is None
    expect(page.locator("[data-testid^=seat-row-]")).to_have_count(30)
    for tab in ("tasks", "pages", "skills", "files", "convs", "dlq"):
        page.get_by_test_id(f"tab-{tab}").click()
        expect(page.get_by_test_id(f"tab-{tab}")).to_have_attribute("aria-selected", "true")
    page.get_by_test_id("seat-row-ceo").locator("button").first.click()
    # A reload keeps the tab signed in; another tab is not.
    page.reload()
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    other = page.context.new_page()
    other.goto(dashboard(node))
    expect(other.get_by_test_id("signin")).to_be_visible()
    expect(other.get_by_test_id("connection")).to_have_attribute("data-state", "signedout")
    other.close()
    no_csp_violation(page, complaints)
    assert all(url.startswith(origin + "/") or url.startswith("data:") for url in requests), \
        [u for u in requests if not u.startswith(origin)]

    # Signed out: both stores empty. Kept ("Keep me signed in"): local storage, seen by a new tab.
    page.get_by_test_id("sign-out").click()
    expect(page.get_by_test_id("signin")).to_be_visible()
    assert page.evaluate("[sessionStorage.getItem('crewlet.token'), localStorage.getItem('crewlet.token')]") \
        == [None, None]
    page.get_by_test_id("signin-token").fill(token_of(node))
    page.get_by_test_id("signin-keep").check()
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    assert page.evaluate("localStorage.getItem('crewlet.token')") == token_of(node)
    assert page.evaluate("sessionStorage.getItem('crewlet.token')") is None
    other = page.context.new_page()
    other.goto(dashboard(node))
    expect(other.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    other.get_by_test_id("sign-out").click()
    expect(other.get_by_test_id("signin")).to_be_visible()
    assert other.evaluate("[sessionStorage.getItem('crewlet.token'), localStorage.getItem('crewlet.token')]") \
        == [None, None]
    other.close()
    # The #token= fragment signs a tab in for the tab only, and replaces a kept token.
    page.evaluate("localStorage.setItem('crewlet.token', 'an-older-one')")
    other = page.context.new_page()
    other.goto(dashboard(node) + "#token=" + token_of(node))
    expect(other.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    assert "token" not in other.url
    assert other.evaluate("[sessionStorage.getItem('crewlet.token'), localStorage.getItem('crewlet.token')]") \
        == [token_of(node), None]
    other.close()
    no_csp_violation(page, complaints)

    # Another site framing the dashboard (its approve, deny and requeue buttons): refused.
    page.route("http://framer.test/", lambda route: route.fulfill(
        status=200, content_type="text/html",
        body=f'<!doctype html><p>a site</p>'
             f'<iframe src="{dashboard(node)}" onload="window.__framed = true"></iframe>'))
    page.goto("http://framer.test/")
    page.wait_for_function("window.__framed === true", timeout=10_000)
    child = page.frames[1]
    assert not child.url.startswith(origin), child.url  # an error page in its place
    assert page.frame_locator("iframe").locator("[data-testid=signin], [data-testid=summary]").count() == 0

    # The API docs: swagger-ui from this origin, started by a script file, no violation.
    complaints.clear()
    requests.clear()
    page.goto(origin + "/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("crewlet")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
    no_csp_violation(page, complaints)
    assert requests and all(url.startswith(origin + "/") or url.startswith("data:") for url in requests), \
        [u for u in requests if not u.startswith(origin)]
