"""The seat tools over the estate (crewlet.agent.estate_tools), called as a
turn calls them: through a seat's Registry, with a router over a real
nats-server to a real applier (the harness of test_router).

What a model reads matters here: a redone call lands once and says the same,
a refusal says why, a knowledge base nobody could search says so rather than
"no pages matched".
"""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

from crewlet.agent.estate_tools import ESTATE_TOOL_NAMES, estate_tools
from crewlet.agent.tools import Registry, ToolContext, builtin_tools
from tests.estate import grant
from tests.integration.test_router import WRITE_WAIT, Fleet, asker_with_first, fleet_test


def seat_tools() -> Registry:
    reg = Registry()
    for tool in builtin_tools() + estate_tools():
        reg.add(tool)
    return reg


async def routed_services(fleet: Fleet, *nodes: str, asker: str = "edge") -> SimpleNamespace:
    router = await fleet.router(asker)
    await fleet.in_service(router.view, *nodes)
    # Real leases: a copy raises a seat's fence only to a token the fleet granted.
    tokens = {seat: await grant(fleet.js, seat, asker, release=False) for seat in ("cto", "ceo")}
    return SimpleNamespace(estate=router, node=asker, seats=frozenset({"cto", "ceo"}), mailboxes=None,
                           tokens=tokens)


def call(services, key: str, seat: str = "cto", token: int | None = None) -> ToolContext:
    token = services.tokens[seat] if token is None else token
    return ToolContext(seat=seat, trigger=key.split(".")[0], token=token, call_key=key, services=services)


async def ok(reg: Registry, ctx: ToolContext, name: str, args: dict) -> str:
    text, error = await reg.call(ctx, name, args)
    assert not error, text
    return text


@fleet_test
async def test_the_tracker_tools_create_update_comment_and_read_and_a_redone_call_lands_once(fleet):
    applier = await fleet.add("a")
    services = await routed_services(fleet, "a")
    reg = seat_tools()
    assert set(ESTATE_TOOL_NAMES) <= set(reg.names())
    assert set(ESTATE_TOOL_NAMES) == {tool.name for tool in estate_tools()}

    first = call(services, "job1.0.0")
    created = await ok(reg, first, "task_create", {"title": "ship the estate", "assignee": "cto"})
    assert created.startswith("created T") and created.endswith("ship the estate (assignee: cto)")
    task_id = created.split()[1]
    # The turn is redone (the same call key): the same answer, one task.
    assert await ok(reg, first, "task_create", {"title": "ship the estate", "assignee": "cto"}) == created
    assert (await ok(reg, call(services, "job1.1.0"), "task_list", {})).splitlines() == [created[len("created "):]]

    updated = await ok(reg, call(services, "job2.0.0"), "task_update",
                       {"id": task_id, "status": "done", "expect_rev": 1})
    assert updated == f"updated {task_id} [done] ship the estate (assignee: cto) (now rev 2)"
    text, error = await reg.call(call(services, "job3.0.0"), "task_update",
                                 {"id": task_id, "status": "open", "expect_rev": 1})
    assert error and text == f"refused: task {task_id} is at rev 2, not 1"
    assert (await ok(reg, call(services, "job4.0.0"), "task_comment", {"id": task_id, "body": "well done"})
            ).startswith(f"commented on {task_id} (C")
    shown = await ok(reg, call(services, "job5.0.0"), "task_get", {"id": task_id})
    assert "well done" in shown and "rev 2" in shown
    text, error = await reg.call(call(services, "job5.1.0"), "task_get", {"id": "T999"})
    assert error and text == "no task T999"
    assert await ok(reg, call(services, "job5.2.0"), "task_list", {"status": "open"}) == "no tasks (status open)"

    # A write under an older token than the seat's is refused, on every copy alike.
    mine = services.tokens["cto"]
    text, error = await reg.call(call(services, "job6.0.0", token=mine - 1), "task_create", {"title": "zombie"})
    assert error and text == f"refused: stale fencing token {mine - 1} for seat cto: the seat is at {mine}"
    assert applier.reader.query("task.list", {})["tasks"][0]["id"] == task_id


@fleet_test
async def test_the_knowledge_base_files_and_notes(fleet):
    await fleet.add("a")
    services = await routed_services(fleet, "a")
    reg = seat_tools()

    wrote = await ok(reg, call(services, "kb1.0.0"), "page_write",
                     {"path": "eng/deploy", "title": "Deploy", "body": "run make deploy, then watch"})
    assert wrote == "wrote eng/deploy (version 1)"
    assert "run make deploy" in await ok(reg, call(services, "kb2.0.0"), "page_read", {"path": "eng/deploy"})
    found = await ok(reg, call(services, "kb3.0.0"), "page_search", {"query": "deploy"})
    assert found.startswith("eng/deploy — Deploy:") and "**deploy**" in found
    assert await ok(reg, call(services, "kb3.1.0"), "page_search", {"query": "kubernetes"}) == "no pages matched"
    assert (await ok(reg, call(services, "kb4.0.0"), "page_list", {"prefix": "eng/"})).startswith("eng/deploy — Deploy (v1")
    text, error = await reg.call(call(services, "kb5.0.0"), "page_read", {"path": "eng/missing"})
    assert error and text.startswith("no page at eng/missing")

    registered = await ok(reg, call(services, "f1.0.0"), "file_register",
                          {"project": "site", "path": "logo.png", "size": 1234, "sha256": "ab" * 32})
    assert registered.startswith("registered F") and "site/logo.png (1234 bytes, version 1)" in registered

    # Notes are the seat's diary: the same text is kept once, and only the seat's own.
    assert await ok(reg, call(services, "n1.0.0"), "note_write", {"text": "the client prefers mornings"}) == "noted"
    assert await ok(reg, call(services, "n2.0.0"), "note_write", {"text": "the client prefers mornings"}) == \
        "already noted"
    assert await ok(reg, call(services, "n3.0.0"), "note_write", {"text": "ship on friday"}) == "noted"
    notes = (await ok(reg, call(services, "n4.0.0"), "notes_read", {})).splitlines()
    assert [line.split("Z ", 1)[1] for line in notes] == ["the client prefers mornings", "ship on friday"]
    assert await ok(reg, call(services, "n5.0.0", seat="ceo"), "notes_read", {}) == "no notes yet"
    text, error = await reg.call(call(services, "n6.0.0"), "notes_read", {"limit": 0})
    assert error and text.startswith("invalid arguments for notes_read: limit: 0 is less than")


@fleet_test
async def test_a_search_nobody_could_run_is_not_no_hits_and_a_lost_page_write_is_unknown(fleet):
    proc = await fleet.spawn("s")
    services = await routed_services(fleet, "s", asker=asker_with_first("s", ["s"]))
    reg = seat_tools()
    await ok(reg, call(services, "w1.0.0"), "page_write", {"path": "a", "title": "A", "body": "alpha"})
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        text, error = await reg.call(call(services, "w2.0.0"), "page_write",
                                     {"path": "a", "title": "A", "body": "beta"})
        assert error and text.startswith("the page.write may or may not have landed")
        assert f"no answer within {WRITE_WAIT:g}s" in text and "check with page_read a" in text
        text, error = await reg.call(call(services, "w3.0.0"), "page_search", {"query": "alpha"})
        assert error and text.startswith("the knowledge base could not be searched:")
        assert "no pages matched" not in text
        # A tool waits no longer than its turn has left, whatever the router's per-node wait.
        short = ToolContext(seat="cto", trigger="w4", token=services.tokens["cto"], call_key="w4.0.0", services=services,
                            deadline=time.monotonic() + 0.3)
        started = time.monotonic()
        text, error = await reg.call(short, "task_create", {"title": "in a hurry"})
        assert error and time.monotonic() - started < WRITE_WAIT / 2, text
    finally:
        os.kill(proc.pid, signal.SIGCONT)
