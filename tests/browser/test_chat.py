"""Talking to a seat in the dashboard (roles/ingress/dashboard/js/chat.js), in a real Chromium.

A person opens the dashboard, starts a conversation, types, and watches the
answer come word by word with the tools it calls; stops a long answer, sends
while one is being written (each of the four strategies, in the words the page
uses), reloads mid-answer and sees it go on from where it was, nothing twice;
and approves or denies a tool call in place. Real nodes (tests/conftest.py),
the sample company's scripted provider (a rule's ``pace`` makes a slow model).
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.browser.conftest import call, company_known, dashboard, ok, ready, token_of
from tests.browser.test_dashboard import APPROVING, FAST, open_dashboard
from tests.conftest import wait_for
from tests.seats import SAMPLE, held, write_company

pytestmark = pytest.mark.browser

STORY_PACE = 0.15   # seconds between the story's words: ~9 s for the whole story


def sample_company(dir: str) -> tuple[str, str]:
    """The sample company, its story told at STORY_PACE: (its path, the story)."""
    with open(SAMPLE) as f:
        company = yaml.safe_load(f)
    rule = next(r for r in company["providers"]["scripted"]["rules"] if "story" in r["match"])
    rule["pace"] = STORY_PACE
    return write_company(dir, yaml.safe_dump(company, sort_keys=False)), rule["reply"]


def sample_node(make_node):
    """A node of the sample company, its ceo held and its estate answering: (node, the story)."""
    node = make_node(fleet=FAST, sessions={"sweep": 0.5})
    path, story = sample_company(node.dir)
    node.start(args=("--company", path))
    wait_for(lambda: held(node).get("ceo") == "t1", 30, what="ceo held")
    ready(node)
    company_known(node)  # a conversation's start needs ingress to have it
    return node, story


def chat_log(page):
    return page.get_by_test_id("conv-messages")


def answers(page):
    """The seat's words in the transcript, one locator per answer shown."""
    return chat_log(page).locator("[data-testid=conv-message][data-role=assistant] .message-text")


def send(page, text: str, strategy: str | None = None) -> None:
    if strategy is not None:
        page.get_by_test_id("chat-strategy").select_option(strategy)
    box = page.get_by_test_id("chat-input")
    box.fill(text)
    box.press("Enter")


def words_shown(page, at_least: int, below: int, timeout: float = 15_000) -> None:
    """The story being told shows between *at_least* and *below* words: its
    run (the last one asked for a story) is still being written."""
    page.wait_for_function(
        """([least, below]) => {
             const run = [...document.querySelectorAll("#chat-log > li.run[data-state=live]")].filter((r) =>
               [...r.querySelectorAll("[data-role=user] .message-text")].some((u) => u.textContent === "tell me a story")).pop();
             const shown = run && run.querySelector("[data-role=assistant] .message-text");
             const n = shown ? shown.textContent.split(/\\s+/).filter(Boolean).length : 0;
             return n >= least && n < below;
           }""", arg=[at_least, below], timeout=timeout)


def test_talk_to_the_ceo_word_by_word_with_its_tools_by_keyboard_at_400px(make_node, page):
    node, story = sample_node(make_node)
    expect = open_dashboard(page, node)

    # "Talk to a seat": one click from the page's first screen, the focus where the typing goes.
    page.get_by_test_id("talk-seat").select_option("ceo")
    page.get_by_test_id("talk-start").click()
    box = page.get_by_role("textbox", name="Message to ceo")
    expect(box).to_be_focused()
    expect(page.get_by_test_id("conv-detail-title")).to_have_text("Conversation with ceo")
    conv = page.get_by_test_id("chat-id").text_content()
    assert re.fullmatch(r"c-[0-9a-f]{24}", conv), conv
    assert f"conversation={conv}" in page.url   # a reload or a link opens it again
    row = page.get_by_test_id(f"conv-row-{conv}")
    expect(row).to_have_attribute("data-status", "idle")
    # The parts a screen reader names: the log, the box, the choice, the buttons.
    expect(page.get_by_role("log", name="Conversation with ceo")).to_be_visible()
    expect(page.get_by_role("combobox", name="If ceo is still answering")).to_have_value("enqueue")
    # The four strategies, in words a person reads (the API's names are the values).
    options = page.get_by_test_id("chat-strategy").locator("option")
    assert [(o.get_attribute("value"), o.text_content()) for o in options.all()] == [
        ("enqueue", "wait in line"), ("interrupt", "stop it and answer this"),
        ("rollback", "undo its answer and answer this"), ("reject", "don't send: tell me it's busy")]
    expect(page.get_by_role("button", name="Send to ceo")).to_be_visible()

    # Shift+Enter is a new line, not a send; Enter sends.
    box.type("calculate 6 * 7")
    box.press("Shift+Enter")
    expect(box).to_have_value("calculate 6 * 7\n")
    assert chat_log(page).locator("[data-role=user]").count() == 0
    box.fill("calculate 6 * 7")
    box.press("Enter")
    expect(box).to_have_value("")
    expect(box).to_be_focused()
    you = chat_log(page).locator("[data-role=user]")
    expect(you).to_have_count(1)
    expect(you).to_contain_text("calculate 6 * 7")
    # The tool call as it happened, then its result, then the answer.
    tool = chat_log(page).locator("[data-role=tool]")
    expect(tool.get_by_test_id("tool-name")).to_have_text("desk__calc")
    expect(tool.get_by_test_id("tool-args")).to_have_text(json.dumps({"expression": "6 * 7"}, indent=2))
    expect(tool.get_by_test_id("tool-result")).to_have_text("42")
    expect(tool).to_have_attribute("data-error", "false")
    expect(answers(page).last).to_have_text("6 * 7 = 42")
    expect(page.get_by_test_id("chat-status")).to_have_text("ceo answered.")
    expect(page.get_by_test_id("conv-detail-status")).to_have_attribute("data-status", "idle")

    # A long answer, word by word: seen part-written, the list saying so, then stopped with Escape.
    send(page, "tell me a story")
    words_shown(page, 3, len(story.split()))
    expect(row).to_have_attribute("data-status", "running")
    expect(page.get_by_role("button", name="Stop ceo's answer")).to_be_visible()
    box.press("Escape")
    ended = chat_log(page).locator("[data-testid=run-end]").last
    expect(ended).to_contain_text("Stopped")
    expect(page.get_by_test_id("chat-stop")).to_be_hidden()
    expect(row).to_have_attribute("data-status", "idle")
    shown = answers(page).last.text_content()
    assert 0 < len(shown) < len(story) and story.startswith(shown.rstrip()), shown
    status, detail = call(node, "GET", f"/v1/conversations/{conv}")
    assert status == 200 and detail["run"]["status"] == "interrupted", detail

    # Readable at 400 px: nothing wider than the screen, the box and Send in reach.
    page.set_viewport_size({"width": 400, "height": 800})
    box.scroll_into_view_if_needed()
    expect(box).to_be_in_viewport()
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    box.fill("hello")
    page.get_by_role("button", name="Send to ceo").click()
    expect(answers(page).last).to_have_text("Hello! What can I do for you?")
    assert page.evaluate("document.documentElement.scrollWidth") <= 400

    # The quick start's approval, as its words say: the sample ceo's task_create waits
    # for a person; approved in place, the run goes on and the task is made.
    send(page, "create a task ship it")
    card = page.get_by_role("group", name="ceo asks to call task_create")
    expect(card).to_be_visible()
    expect(card.get_by_test_id("approval-args")).to_have_text(json.dumps({"title": "ship it"}, indent=2))
    expect(row).to_have_attribute("data-status", "awaiting_approval")
    card.get_by_role("button", name="Approve").click()
    expect(page.get_by_test_id("chat-decided")).to_contain_text("Approved: ceo's call to task_create")
    made = chat_log(page).locator("[data-role=tool]").last
    expect(made.get_by_test_id("tool-name")).to_have_text("task_create")
    expect(made.get_by_test_id("tool-state")).to_have_text("done", timeout=30_000)
    expect(row).to_have_attribute("data-status", "idle")
    tasks = call(node, "GET", "/v1/tasks?limit=500")[1]["items"]
    assert [t["title"] for t in tasks].count("ship it") == 1, tasks

    # The list is live for the other conversations too: a run started elsewhere (the
    # API, another person) shows on its row as it runs, then ends there.
    other = ok(node, "POST", "/v1/conversations", {"seat": "ceo"})["id"]
    ok(node, "POST", f"/v1/conversations/{other}/runs", {"input": "tell me a story", "stream": False})
    theirs = page.get_by_test_id(f"conv-row-{other}")
    expect(theirs).to_have_attribute("data-status", "running", timeout=15_000)
    expect(theirs).to_have_attribute("data-status", "idle", timeout=30_000)
    expect(row).to_have_attribute("data-status", "idle")


def test_reload_mid_answer_resumes_after_the_last_event_and_the_four_strategies(make_node, page):
    node, story = sample_node(make_node)
    conv = ok(node, "POST", "/v1/conversations", {"seat": "ceo"})["id"]
    # A link to the conversation (token and conversation in the fragment) opens it.
    page.goto(dashboard(node) + f"#token={token_of(node)}&conversation={conv}")
    from playwright.sync_api import expect
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    expect(page.get_by_test_id("conv-detail-title")).to_have_text("Conversation with ceo")
    asked: list[str | None] = []
    page.on("request", lambda r: asked.append(r.headers.get("last-event-id"))
            if r.url.endswith("/stream") else None)

    # ---- Reloaded mid-answer: shown at once as it was, the stream asked only for what came after.
    send(page, "tell me a story")
    words_shown(page, 5, len(story.split()) - 10)
    assert asked == [None], asked    # the run's stream, from its start
    asked.clear()
    page.reload()
    expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live")
    expect(page.get_by_test_id("conv-detail-title")).to_have_text("Conversation with ceo")
    expect(answers(page)).to_have_count(1)
    wait_for(lambda: asked, 10, what="the stream asked again after the reload")
    assert asked[0] is not None and int(asked[0]) > 1, asked   # Last-Event-ID: after what was shown
    expect(answers(page).last).to_have_text(story, timeout=30_000)
    expect(answers(page)).to_have_count(1)                      # nothing twice
    expect(chat_log(page).locator("[data-role=user]")).to_have_count(1)
    expect(page.get_by_test_id("chat-status")).to_have_text("ceo answered.")

    # ---- "don't send: tell me it's busy" (reject): the 409 said as busy, retry in N s; nothing lost.
    send(page, "tell me a story")
    words_shown(page, 2, len(story.split()))
    send(page, "hello", strategy="reject")
    status = page.get_by_test_id("chat-status")
    expect(status).to_contain_text("ceo is busy answering, so this was not sent")
    expect(status).to_have_attribute("data-kind", "info")       # a word, not an error
    expect(page.get_by_test_id("chat-retry")).to_have_text(re.compile(r"busy, retry in \d+ s"))
    expect(page.get_by_test_id("chat-input")).to_have_value("hello")

    # ---- "stop it and answer this" (interrupt): the story stops, hello is answered.
    send(page, "hello", strategy="interrupt")
    runs = chat_log(page).get_by_test_id("run")
    expect(runs.nth(-2).get_by_test_id("run-end")).to_contain_text("Stopped")
    expect(answers(page).last).to_have_text("Hello! What can I do for you?")
    expect(page.get_by_test_id("conv-detail-status")).to_have_attribute("data-status", "idle")

    # ---- "wait in line" (enqueue): shown waiting; the story stopped with Stop, it is answered next.
    send(page, "tell me a story", strategy="enqueue")
    words_shown(page, 2, len(story.split()))
    send(page, "hello")
    waiting = runs.last
    expect(waiting).to_have_attribute("data-state", "queued")
    expect(waiting).to_contain_text("Waiting in line")
    page.get_by_test_id("chat-stop").click()
    expect(runs.nth(-2).get_by_test_id("run-end")).to_contain_text("Stopped")
    expect(waiting.locator("[data-role=assistant] .message-text")).to_have_text("Hello! What can I do for you?")
    expect(waiting).not_to_contain_text("Waiting in line")

    # ---- "undo its answer and answer this" (rollback): the story's run goes, with a word.
    send(page, "tell me a story")
    words_shown(page, 2, len(story.split()))
    before = runs.count()
    send(page, "what time is it?", strategy="rollback")
    undone = chat_log(page).get_by_test_id("chat-undone")
    expect(undone).to_contain_text(re.compile(r"Undid ceo's last answer \(\d+ messages? removed\)"))
    expect(answers(page).last).to_contain_text("It is ")
    expect(runs).to_have_count(before)   # the story's run replaced by the word, the new one added
    detail = ok(node, "GET", f"/v1/conversations/{conv}?limit=500")
    texts = [m["text"] for m in detail["messages"]]
    assert texts.count("tell me a story") == 3, texts   # four asked: the undone one's messages are gone

    # ---- A run another client starts shows up here, its answer read from the record once it ends.
    ok(node, "POST", f"/v1/conversations/{conv}/runs", {"input": "thanks, from a program",
                                                         "multitask_strategy": "enqueue"})
    theirs = chat_log(page).get_by_test_id("run").filter(has_text="thanks, from a program")
    expect(theirs.locator("[data-role=assistant] .message-text")).to_have_text("Noted.")
    detail = ok(node, "GET", f"/v1/conversations/{conv}?limit=500")

    # ---- Reloaded after all that: the transcript from the record, each message once.
    page.reload()
    expect(page.get_by_test_id("conv-detail-title")).to_have_text("Conversation with ceo")
    expect(chat_log(page).locator("[data-role=user]")).to_have_count(len(
        [m for m in detail["messages"] if m["role"] == "user"]))
    expect(answers(page).filter(has_text="Once upon a time")).to_have_count(1)


def test_a_tool_call_is_approved_and_denied_in_the_chat(make_node, page):
    node = make_node(fleet=FAST, sessions={"sweep": 0.5}, approvals={"ttl": 600})
    node.start(args=("--company", write_company(node.dir, APPROVING)))
    wait_for(lambda: held(node).get("clerk") == "t1", 30, what="seat clerk held")
    ready(node)
    company_known(node)
    expect = open_dashboard(page, node)
    page.get_by_test_id("tab-convs").click()
    page.get_by_test_id("conv-new-seat").select_option("clerk")
    page.get_by_test_id("conv-new-start").click()
    expect(page.get_by_test_id("conv-detail-title")).to_have_text("Conversation with clerk")
    conv = page.get_by_test_id("chat-id").text_content()

    def tasks_titled(title: str) -> int:
        return sum(t["title"] == title for t in ok(node, "GET", "/v1/tasks?limit=500")["items"])

    # ---- Asked in the run: shown in place, the exact tool and arguments; approved, the run goes on here.
    send(page, "create a task buy <b>milk</b>")
    card = page.get_by_role("group", name="clerk asks to call task_create")
    expect(card).to_be_visible()
    expect(card.get_by_test_id("approval-tool")).to_have_text("task_create")
    expect(card.get_by_test_id("approval-args")).to_have_text(json.dumps({"title": "buy <b>milk</b>"}, indent=2))
    assert card.locator("b").count() == 0
    expect(page.get_by_test_id("conv-detail-status")).to_have_attribute("data-status", "awaiting_approval")
    expect(page.get_by_test_id(f"conv-row-{conv}")).to_have_attribute("data-status", "awaiting_approval")
    # Sending meanwhile, refusing to wait: told to decide first, the focus on the decision.
    send(page, "hello", strategy="reject")
    expect(page.get_by_test_id("chat-status")).to_contain_text("waits for your decision")
    expect(card.get_by_role("button", name="Approve")).to_be_focused()
    assert tasks_titled("buy <b>milk</b>") == 0
    expect(page.get_by_test_id("chat-input")).to_have_value("hello")   # kept, to send after
    card.get_by_role("button", name="Approve").click()
    expect(page.get_by_test_id("chat-decided")).to_contain_text("Approved: clerk's call to task_create")
    expect(card).to_have_count(0)
    expect(answers(page).last).to_contain_text("Created:", timeout=30_000)
    expect(page.get_by_test_id("conv-detail-status")).to_have_attribute("data-status", "idle")
    # The call is shown once, where it was asked, its result on it.
    calls = chat_log(page).locator("[data-role=tool]")
    expect(calls).to_have_count(1)
    expect(calls.get_by_test_id("tool-state")).to_have_text("done")
    assert tasks_titled("buy <b>milk</b>") == 1
    # The panel does not ask for it any more.
    expect(page.get_by_test_id("approvals-empty")).to_be_visible()

    # ---- Denied with a note: the seat is told, in the transcript; no task made.
    page.get_by_test_id("chat-input").fill("")
    send(page, "create a task sell the car")
    card = page.get_by_role("group", name="clerk asks to call task_create")
    expect(card).to_be_visible()
    card.get_by_label("Note").fill("not this year")
    card.get_by_role("button", name="Deny").click()
    expect(page.get_by_test_id("chat-decided")).to_have_count(2)
    expect(page.get_by_test_id("chat-decided").last).to_contain_text("Denied")
    result = chat_log(page).locator("[data-role=tool][data-error=true]").last
    expect(result.get_by_test_id("tool-result")).to_contain_text("denied")
    expect(result.get_by_test_id("tool-result")).to_contain_text("not this year")
    expect(page.get_by_test_id("conv-detail-status")).to_have_attribute("data-status", "idle")
    expect(calls).to_have_count(2)
    assert tasks_titled("sell the car") == 0
    # Read again from the record (a reload): the same, each call once with its result.
    page.reload()
    expect(page.get_by_test_id("conv-detail-title")).to_have_text("Conversation with clerk")
    expect(calls).to_have_count(2)
    expect(calls.first.get_by_test_id("tool-state")).to_have_text("done")
    expect(calls.last).to_have_attribute("data-error", "true")
