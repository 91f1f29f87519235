"""The operator MCP server (crewlet.operator) on one real node, both ways.

Over stdio, as a desktop client starts it (``crewletctl mcp`` under the SDK's
own client, with an admin token): the tools are listed with the API's own
schemas; mail is worked, a task is made and found, a conversation run is
started and its events read to the end, and a bad argument is the API's 422.
Over streamable HTTP at ``/v1/mcp``, with a read token: it reads, and a write
is refused by the API's scope (403), not done; no token is a 401 before any
MCP is read.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from crewlet import tokens
from tests.conftest import CREWLETCTL, wait_for
from tests.integration.test_bridge import answer, rpc
from tests.seats import held, write_company

pytestmark = pytest.mark.timeout(180)

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
ADMIN, READER = tokens.new_token(), tokens.new_token()
COMPANY = """
company: {name: Op}
providers:
  p:
    kind: scripted
    rules:
      - {match: '(?i)words', reply: 'one two three four five', pace: 0.05}
      - {match: '.*', reply: 'Noted.'}
seats:
  - {name: ceo, persona: You run things., provider: p}
"""


def _text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def test_an_operator_s_agent_runs_the_company_over_stdio_and_http(make_node):
    node = make_node(fleet=FAST, ingress={"tokens": [
        {"name": "ops", "sha256": tokens.digest(ADMIN), "scopes": ["admin"]},
        {"name": "viewer", "sha256": tokens.digest(READER), "scopes": ["read"]}]})
    node.start(args=("--company", write_company(node.dir, COMPANY)))
    wait_for(lambda: held(node).get("ceo"), 30, what="the ceo held")
    base = f"http://{node.config['ingress']['listen']}"
    wait_for(lambda: httpx2.get(base + "/readyz", trust_env=False).status_code == 200, 30, what="ready")

    async def over_stdio():
        params = StdioServerParameters(command=CREWLETCTL[0], args=[*CREWLETCTL[1:], "-c", node.config_path, "mcp"],
                                       env={**os.environ, "CREWLET_API_TOKEN": ADMIN})
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = {t.name: t for t in (await session.list_tools()).tools}
                assert {"fleet", "mail_send", "task_create", "tasks_list", "search", "run_start",
                        "run_events", "approval_decide", "dead_letters"} <= set(listed), sorted(listed)
                # The route's own schema: the mail's text and wait, the seat from the path.
                mail = listed["mail_send"].input_schema
                assert {"seat", "text", "wait"} <= set(mail["properties"]) and "seat" in mail["required"]

                done = await session.call_tool("mail_send", {"seat": "ceo", "text": "hello", "wait": 20})
                assert not done.is_error and json.loads(_text(done))["turn"]["outcome"] == "done", _text(done)
                made = await session.call_tool("task_create", {"title": "from the operator's agent"})
                assert not made.is_error, _text(made)
                found = json.loads(_text(await session.call_tool("tasks_list", {})))
                assert "from the operator's agent" in [t["title"] for t in found["items"]]
                bad = await session.call_tool("task_create", {"title": ""})
                assert bad.is_error and _text(bad).startswith("422"), _text(bad)
                # A parameter never reaches another route: one segment, or a path without '..'.
                away = await session.call_tool("seat_get", {"seat": "../fleet"})
                assert away.is_error and _text(away)[:3] in ("404", "422"), _text(away)  # not the fleet's answer
                dots = await session.call_tool("page_get", {"path": "eng/../../v1/fleet"})
                assert dots.is_error and "bad argument 'path'" in _text(dots), _text(dots)

                conv = json.loads(_text(await session.call_tool("conversation_start", {"seat": "ceo"})))["id"]
                run = json.loads(_text(await session.call_tool(
                    "run_start", {"conversation": conv, "input": "say some words", "stream": False})))
                run_id = run["run"]["id"]
                events = json.loads(_text(await session.call_tool(
                    "run_events", {"conversation": conv, "run": run_id, "wait": 20})))
                assert events["ended"] and events["events"][-1]["event"] == "run.completed", events
                words = "".join(e["data"]["text"] for e in events["events"] if e["event"] == "message.delta")
                assert words.split() == ["one", "two", "three", "four", "five"], events
                # Read again from after the first event: the rest only.
                rest = json.loads(_text(await session.call_tool(
                    "run_events", {"conversation": conv, "run": run_id, "after": events["events"][0]["id"]})))
                assert [e["id"] for e in rest["events"]] == [e["id"] for e in events["events"][1:]]

    asyncio.run(over_stdio())

    async def over_http():
        url = base + "/v1/mcp"
        assert (await rpc(url, None, "initialize", {})).status_code == 401
        assert (await rpc(url, "cwl_nobody-knows", "tools/list")).status_code == 401
        listed = (await rpc(url, READER, "tools/list")).json()["result"]["tools"]
        assert "task_create" in [t["name"] for t in listed]
        text, error = answer(await rpc(url, READER, "tools/call", {"name": "tasks_list", "arguments": {}}))
        assert not error and "from the operator's agent" in text
        text, error = answer(await rpc(url, READER, "tools/call",
                                       {"name": "task_create", "arguments": {"title": "not allowed"}}))
        assert error and text.startswith("403") and "this needs write" in text, text
        text, _ = answer(await rpc(url, ADMIN, "tools/call", {"name": "tasks_list", "arguments": {}}))
        assert "not allowed" not in text

    asyncio.run(over_http())
    assert ADMIN not in node.read_log() and READER not in node.read_log()
