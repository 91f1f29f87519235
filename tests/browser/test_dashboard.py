"""The dashboard (roles/ingress/dashboard) on real nodes, in a real headless Chromium.

Every test starts real crewletd nodes (tests/conftest.py), opens the node's
``/ui/`` the way an operator would (the token in the address's fragment, or
typed into the sign-in box) and acts on the API from the test with urllib.
Waits are Playwright's own (``expect``/``wait_for``) or :func:`wait_for`,
each with its deadline.
"""

from __future__ import annotations

import time

import pytest
import yaml

from tests.browser.conftest import call, dashboard, ok, token_of
from tests.conftest import wait_for
from tests.seats import SAMPLE, held, write_company

pytestmark = pytest.mark.browser

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
# The sample company plus a seat whose provider can never answer: its mail is
# dead-lettered on the first try (a missing API key is not worth retrying).
FAILING = {"provider": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                        "api_key_env": "CREWLET_TEST_NO_SUCH_KEY"},
           "seat": {"name": "billing", "persona": "You send the invoices.", "provider": "gone"}}


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
    # The ceo's first turn waits for its own MCP server to start (seconds):
    # worked once before the clock runs, so what is timed is the dashboard.
    first = ok(node, "POST", "/v1/seats/ceo/mail", {"text": "hello", "wait": 30})
    assert first["turn"] and first["turn"]["outcome"] == "done", first
    expect = open_dashboard(page, node)
    expect(page.locator(f"[data-testid=turn][data-trigger='{first['trigger']}']")).to_be_visible()

    # The token left the address bar for local storage.
    assert "token" not in page.url
    assert page.evaluate("localStorage.getItem('crewlet.token')") == token_of(node)
    # The fleet and the company, as the snapshot has them.
    expect(page.get_by_test_id("company-name")).to_have_text("Lantern Software")
    expect(page.get_by_test_id("company-rev")).to_have_text("revision 1")
    card = page.get_by_test_id("node-t1")
    expect(card).to_have_attribute("data-state", "up")
    expect(card.get_by_test_id("child-ingress")).to_have_attribute("data-state", "running")
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

    # A stored token the node refuses (a 401 on the feed): back to the sign-in box.
    page.evaluate("localStorage.setItem('crewlet.token', 'stale')")
    page.reload()
    expect(page.get_by_test_id("signin-error")).to_contain_text("did not accept the saved token")

    # The right one: signed in, live, kept.
    page.get_by_test_id("signin-token").fill(token_of(node))
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    expect(signin).to_be_hidden()
    assert page.evaluate("localStorage.getItem('crewlet.token')") == token_of(node)
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

    # And the API itself refuses the wrong token the page was refused with.
    assert call(node, "GET", "/v1/fleet", token="not-the-token")[0] == 401
