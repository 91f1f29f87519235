"""Providers against the real thing they talk to.

openai and anthropic run against local servers speaking their wire formats
(:mod:`tests.integration.wire`), streamed or not, cooldowns against a real
nats-server's ``cooldowns`` bucket, the cli provider with real processes and
real signals.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import os
import random
import sys
import threading
import time

import nats
import psutil
import pytest

from crewlet.agent.providers import CoolingDown, ProviderError, make_provider
from crewlet.agent.providers.scripted import NO_MATCH
from crewlet.agent.providers.base import env_proxy
from crewlet.agent.types import Message, Reply, Sink, ToolCall, ToolSpec, Usage
from crewlet.company.model import Provider as ProviderSpec
from crewlet.coord import buckets
from crewlet.coord.counters import Cooldowns
from tests.conftest import alive, free_port, wait_for
from tests.integration.wire import (CUT, WireServer, anthropic_error, anthropic_reply,
                                    anthropic_stream, openai_error, openai_reply, openai_stream)

KEY = "sk-test-wire-0123456789"
KEY_ID = hashlib.sha256(KEY.encode()).hexdigest()[:12]
ENV = {"WIRE_KEY": KEY}
SYSTEM = "You are the CTO."
SEND = ToolSpec("send", "Send a message to a seat.",
                {"type": "object", "properties": {"to": {"type": "string"}, "text": {"type": "string"}},
                 "required": ["to", "text"]})


def soon(seconds: float) -> float:
    return time.monotonic() + seconds


@pytest.fixture
def wire():
    with WireServer() as server:
        yield server


async def fleet_cooldowns(url: str) -> tuple[nats.aio.client.Client, Cooldowns]:
    """A node's own NATS connection and its view of the ``cooldowns`` bucket."""
    nc = await nats.connect(url, allow_reconnect=False)
    js = nc.jetstream(timeout=2.0)
    await buckets.ensure(js, buckets.COOLDOWNS, 1)
    return nc, Cooldowns(js)


# ------------------------------------------------------------------ scripted

SCRIPT = ProviderSpec.model_validate({"kind": "scripted", "rules": [
    {"match": r"(?i)\bhello\b", "reply": "Hello! What can I do for you?"},
    {"match": r"ask (\w+) (.*)", "reply": r"I have passed that on to \1.",
     "tools": [{"name": "send", "args": {"to": r"\1", "text": r"\2", "cc": [r"\1", "ceo"], "n": 3}},
               {"name": "note", "args": {"about": r"\g<1>"}}]},
    {"match": r"urgent|hello", "reply": "never: an earlier rule matches first"},
    {"match": r"calculate (.+)", "reply": r"\1 = {tools}",
     "tools": [{"name": "desk__calc", "args": {"expression": r"\1"}}, {"name": "desk__clock"}]},
    {"match": r"plain", "reply": "Nothing to add{tools}."},
]})


def test_scripted_round_one_calls_tools_with_groups_and_round_two_replies():
    async def main():
        p = make_provider("scripted", SCRIPT)
        user = Message("user", "please ask cto to review the billing design")
        r1 = await p.complete(SYSTEM, [user], [SEND], deadline=soon(5))
        assert r1.text == "" and r1.stop == "tools"
        assert r1.calls == (
            ToolCall("call_1", "send", {"to": "cto", "text": "to review the billing design",
                                        "cc": ["cto", "ceo"], "n": 3}),
            ToolCall("call_2", "note", {"about": "cto"}))
        assert r1.usage == Usage(4 + 8, 2)   # words of system + mail; one per call

        done = [user, Message("assistant", calls=r1.calls),
                Message("tool", "sent", call_id="call_1", name="send"),
                Message("tool", "noted", call_id="call_2", name="note")]
        r2 = await p.complete(SYSTEM, done, [SEND], deadline=soon(5))
        assert (r2.text, r2.calls, r2.stop) == ("I have passed that on to cto.", (), "end")

        failed = [*done[:3], Message("tool", "no such seat", call_id="call_2", name="note", error=True)]
        r3 = await p.complete(SYSTEM, failed, [SEND], deadline=soon(5))
        assert r3.text == "I have passed that on to cto. (tool note failed: no such seat)"
        await p.close()
    asyncio.run(main())


def test_scripted_reply_shows_the_tool_results():
    async def main():
        p = make_provider("scripted", SCRIPT)
        user = Message("user", "calculate (2 + 3) * 7")
        r1 = await p.complete(SYSTEM, [user], [], deadline=soon(5))
        assert r1.calls == (ToolCall("call_1", "desk__calc", {"expression": "(2 + 3) * 7"}),
                            ToolCall("call_2", "desk__clock", {}))
        answered = [user, Message("assistant", calls=r1.calls),
                    Message("tool", "35", call_id="call_1", name="desk__calc"),
                    Message("tool", "12:00", call_id="call_2", name="desk__clock")]
        r2 = await p.complete(SYSTEM, answered, [], deadline=soon(5))
        assert r2.text == "(2 + 3) * 7 = 35; 12:00"

        answered[3] = Message("tool", "clock stopped", call_id="call_2", name="desk__clock", error=True)
        r3 = await p.complete(SYSTEM, answered, [], deadline=soon(5))
        assert r3.text == "(2 + 3) * 7 = 35; (tool desk__clock failed: clock stopped)", "shown once"

        r4 = await p.complete(SYSTEM, [Message("user", "plain")], [], deadline=soon(5))
        assert r4.text == "Nothing to add.", "no tools called: the placeholder is empty"
    asyncio.run(main())


def test_scripted_first_rule_wins_no_match_and_determinism():
    async def main():
        p = make_provider("scripted", SCRIPT)
        r = await p.complete(SYSTEM, [Message("user", "Hello there, urgent")], [], deadline=soon(5))
        assert (r.text, r.calls, r.stop) == ("Hello! What can I do for you?", (), "end")
        assert r.usage == Usage(4 + 3, 7)

        older = [Message("user", "hello"), Message("assistant", "Hello!"), Message("user", "what now?")]
        r = await p.complete(SYSTEM, older, [], deadline=soon(5))
        assert r.text == NO_MATCH, "only the last user message is matched"

        again = [await make_provider("s2", SCRIPT).complete(SYSTEM, older[:1], [], deadline=soon(5))
                 for _ in range(3)]
        assert again[0] == again[1] == again[2]
        assert await p.cooling() is None
    asyncio.run(main())


# ------------------------------------------------------------------ openai

def openai_spec(wire: WireServer, **kw) -> ProviderSpec:
    return ProviderSpec(kind="openai", model="gpt-wire", base_url=wire.url + "/v1",
                        api_key_env="WIRE_KEY", **kw)


def test_openai_plain_reply_with_usage(wire):
    async def main():
        wire.queue(openai_reply("Roadmap attached.", usage=(31, 4)))
        p = make_provider("oai", openai_spec(wire), env=ENV)
        r = await p.complete(SYSTEM, [Message("user", "send me the roadmap")], [], deadline=soon(10))
        await p.close()
        assert (r.text, r.calls, r.usage, r.stop) == ("Roadmap attached.", (), Usage(31, 4), "end")
        [req] = wire.received()
        assert req.path == "/v1/chat/completions"
        assert req.headers["authorization"] == f"Bearer {KEY}"
        assert req.body == {"model": "gpt-wire", "messages": [
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": "send me the roadmap"}]}
    asyncio.run(main())


def test_openai_tool_call_round_trip(wire):
    async def main():
        wire.queue(openai_reply(None, [("call_a", "send", {"to": "cto", "text": "hi"}),
                                       ("call_b", "send", "{not json")], usage=(20, 7)))
        wire.queue(openai_reply("Both sent.", usage=(40, 3)))
        p = make_provider("oai", openai_spec(wire), env=ENV)
        user = Message("user", "tell the cto hi")
        r1 = await p.complete(SYSTEM, [user], [SEND], deadline=soon(10))
        assert r1.stop == "tools" and r1.text == "" and r1.usage == Usage(20, 7)
        assert r1.calls == (ToolCall("call_a", "send", {"to": "cto", "text": "hi"}),
                            ToolCall("call_b", "send", {"_raw": "{not json"}))

        history = [user, Message("assistant", calls=r1.calls),
                   Message("tool", "sent", call_id="call_a", name="send"),
                   Message("tool", "bad arguments", call_id="call_b", name="send", error=True)]
        r2 = await p.complete(SYSTEM, history, [SEND], deadline=soon(10))
        await p.close()
        assert (r2.text, r2.stop) == ("Both sent.", "end")

        first, second = wire.received()
        assert first.body["tools"] == [{"type": "function", "function": {
            "name": "send", "description": SEND.description, "parameters": SEND.parameters}}]
        assert second.body["messages"][2:] == [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "send", "arguments": json.dumps({"to": "cto", "text": "hi"})}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "send", "arguments": json.dumps({"_raw": "{not json"})}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "sent"},
            {"role": "tool", "tool_call_id": "call_b", "content": "error: bad arguments"}]
    asyncio.run(main())


def test_openai_429_cools_the_key_in_the_fleet_and_retries_after_it(wire, natsd):
    async def main():
        nc, cooldowns = await fleet_cooldowns(natsd.url)
        wire.queue(openai_error("Rate limit reached", "rate_limit_error"), 429, {"retry-after": "1"})
        wire.queue(openai_reply("after the limit", usage=(5, 3)))
        p = make_provider("oai", openai_spec(wire), cooldowns=cooldowns, env=ENV)
        r = await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
        await p.close()
        assert r.text == "after the limit"
        limited, retried = wire.received()
        assert retried.at - limited.at >= 1.0

        entry = await (await nc.jetstream(timeout=2.0).key_value("cooldowns")).get(f"oai.{KEY_ID}")
        assert json.loads(entry.value)["until"] >= limited.at + 1
        assert KEY.encode() not in entry.value
        await nc.close()
    asyncio.run(main())


def test_openai_429_past_the_deadline_cools_every_node_without_calling(wire, natsd):
    async def main():
        nc_a, cool_a = await fleet_cooldowns(natsd.url)
        nc_b, cool_b = await fleet_cooldowns(natsd.url)   # another node: its own connection
        wire.queue(openai_error("Rate limit reached", "rate_limit_error"), 429, {"retry-after": "30"})
        a = make_provider("oai", openai_spec(wire), cooldowns=cool_a, env=ENV)
        with pytest.raises(CoolingDown) as caught:
            await a.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(5))
        [limited] = wire.received()
        assert caught.value.key == KEY_ID and caught.value.retryable
        assert caught.value.until >= limited.at + 30

        b = make_provider("oai", openai_spec(wire), cooldowns=cool_b, env=ENV)
        assert (await b.cooling()) >= limited.at + 30
        started = time.monotonic()
        with pytest.raises(CoolingDown):
            await b.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(5))
        assert time.monotonic() - started < 1.0, "gave up at once: the key cools past the deadline"
        assert len(wire.received()) == 1, "no node calls the endpoint while the key cools"

        other = make_provider("oai", openai_spec(wire), cooldowns=cool_b, env={"WIRE_KEY": "sk-other"})
        assert await other.cooling() is None, "another key of the same provider does not cool"
        for p in (a, b, other):
            await p.close()
        await nc_a.close()
        await nc_b.close()
    asyncio.run(main())


def test_openai_5xx_is_retried_after_a_backoff(wire):
    async def main():
        wire.queue(openai_error("The server had an error", "server_error"), 500)
        wire.queue(openai_reply("second time lucky"))
        p = make_provider("oai", openai_spec(wire), env=ENV)
        r = await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
        await p.close()
        assert r.text == "second time lucky"
        failed, retried = wire.received()
        assert retried.at - failed.at >= 0.5
    asyncio.run(main())


def test_connection_errors_are_retried_until_the_deadline():
    async def main():
        closed = ProviderSpec(kind="openai", base_url=f"http://127.0.0.1:{free_port()}/v1")
        p = make_provider("oai", closed, env={})
        started = time.monotonic()
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(2))
        await p.close()
        # Attempts at 0, 0.5 and 1.5 s; the next backoff (2 s) would pass the deadline.
        assert 1.4 < time.monotonic() - started < 2.5
        assert caught.value.retryable and "Cannot connect to host" in str(caught.value)
    asyncio.run(main())


def test_a_proxy_the_providers_environment_names_carries_its_requests(wire):
    async def main():
        wire.queue(openai_reply("Through the proxy."))
        wire.queue(openai_reply("Again."))
        spec = ProviderSpec(kind="openai", model="gpt-wire", base_url="http://model.invalid/v1",
                            api_key_env="WIRE_KEY")
        p = make_provider("oai", spec, env={**ENV, "HTTP_PROXY": wire.url, "no_proxy": "localhost"})
        for said in ("Through the proxy.", "Again."):
            r = await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
            assert r.text == said
        await p.close()
        # Absolute-form request lines: what a client says to a forward proxy.
        assert [req.path for req in wire.received()] == ["http://model.invalid/v1/chat/completions"] * 2
    asyncio.run(main())


def test_env_proxy_reads_scheme_proxies_and_no_proxy_as_curl_does():
    url = "https://api.openai.com/v1"
    assert env_proxy(url, {}) is None
    assert env_proxy(url, {"HTTPS_PROXY": "http://p:3128"}) == "http://p:3128"
    assert env_proxy(url, {"HTTP_PROXY": "http://p:3128"}) is None, "the scheme's own proxy only"
    both = {"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2"}
    assert env_proxy(url, both) == "http://lower:2"
    assert env_proxy(url, {"https_proxy": "http://p:3128", "NO_PROXY": ".openai.com"}) is None
    assert env_proxy(url, {"https_proxy": "http://p:3128", "no_proxy": "*"}) is None
    assert env_proxy(url, {"https_proxy": "http://p:3128", "no_proxy": "example.com"}) == "http://p:3128"
    assert env_proxy(url, {"https_proxy": ""}) is None


def test_openai_4xx_fails_at_once_with_the_endpoints_words(wire):
    async def main():
        wire.queue(openai_error("The model `gpt-wire` does not exist"), 400)
        p = make_provider("oai", openai_spec(wire), env=ENV)
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
        assert not caught.value.retryable
        assert "HTTP 400" in str(caught.value) and "does not exist" in str(caught.value)
        assert len(wire.received()) == 1

        keyless = make_provider("oai", openai_spec(wire), env={})
        with pytest.raises(ProviderError) as caught:
            await keyless.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
        assert not caught.value.retryable and "WIRE_KEY" in str(caught.value)
        assert len(wire.received()) == 1
        await p.close()
        await keyless.close()
    asyncio.run(main())


def test_an_error_echoing_the_key_is_redacted(wire):
    """Issue 16: an endpoint that echoes the key (or its Authorization header)
    in an error does not put it in the ProviderError, whatever its shape."""
    async def main():
        plain = "correcthorsebattery42"  # a key in no vendor's shape: found by its value
        env = {"WIRE_KEY": plain}
        p = make_provider("oai", openai_spec(wire), env=env)
        wire.queue(openai_error(f"Incorrect API key provided: {plain}; header was Bearer {plain}"), 401)
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
        said = str(caught.value)
        assert plain not in said and "HTTP 401" in said and "Incorrect API key provided: [redacted]" in said

        # Key shapes are redacted even when they are not this provider's key, and
        # on the 5xx retry path (logged as provider_retry) and a malformed 200 too.
        wire.queue({"error": {"message": "upstream said sk-proj-AAAAAAAAAAAAAAAAAAAA1"}}, 503)
        wire.queue({"oops": f"x-api-key: {plain}"}, 200)
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
        said = str(caught.value)
        assert "unexpected response" in said and plain not in said and "[redacted]" in said
        await p.close()

        a = make_provider("ant", anthropic_spec(wire), env={"WIRE_KEY": KEY})
        wire.queue(anthropic_error(f"invalid x-api-key {KEY}", "authentication_error"), 401)
        with pytest.raises(ProviderError) as caught:
            await a.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
        assert KEY not in str(caught.value) and "authentication_error" in str(caught.value)
        await a.close()
    asyncio.run(main())


# ------------------------------------------------------------------ anthropic

def anthropic_spec(wire: WireServer) -> ProviderSpec:
    return ProviderSpec(kind="anthropic", model="claude-wire", base_url=wire.url, api_key_env="WIRE_KEY")


def test_anthropic_plain_reply(wire):
    async def main():
        wire.queue(anthropic_reply("Roadmap attached.", usage=(31, 4)))
        p = make_provider("ant", anthropic_spec(wire), env=ENV)
        r = await p.complete(SYSTEM, [Message("user", "send me the roadmap")], [], deadline=soon(10))
        await p.close()
        assert (r.text, r.calls, r.usage, r.stop) == ("Roadmap attached.", (), Usage(31, 4), "end")
        [req] = wire.received()
        assert req.path == "/v1/messages"
        assert req.headers["x-api-key"] == KEY and req.headers["anthropic-version"] == "2023-06-01"
        assert req.body == {"model": "claude-wire", "max_tokens": 4096, "system": SYSTEM, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "send me the roadmap"}]}]}
    asyncio.run(main())


def test_anthropic_tool_use_round_trip(wire):
    async def main():
        wire.queue(anthropic_reply("Sending both.", [("toolu_1", "send", {"to": "cto", "text": "hi"}),
                                                     ("toolu_2", "send", {"to": "nobody", "text": "hi"})],
                                   usage=(50, 12)))
        wire.queue(anthropic_reply("One went through."))
        p = make_provider("ant", anthropic_spec(wire), env=ENV)
        user = Message("user", "tell the cto and nobody hi")
        r1 = await p.complete(SYSTEM, [user], [SEND], deadline=soon(10))
        assert (r1.text, r1.stop, r1.usage) == ("Sending both.", "tools", Usage(50, 12))
        assert r1.calls == (ToolCall("toolu_1", "send", {"to": "cto", "text": "hi"}),
                            ToolCall("toolu_2", "send", {"to": "nobody", "text": "hi"}))

        history = [user, Message("assistant", r1.text, calls=r1.calls),
                   Message("tool", "sent", call_id="toolu_1", name="send"),
                   Message("tool", "unknown seat nobody", call_id="toolu_2", name="send", error=True)]
        r2 = await p.complete(SYSTEM, history, [SEND], deadline=soon(10))
        await p.close()
        assert r2.text == "One went through."

        first, second = wire.received()
        assert first.body["tools"] == [{"name": "send", "description": SEND.description,
                                        "input_schema": SEND.parameters}]
        assert second.body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": user.text}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Sending both."},
                {"type": "tool_use", "id": "toolu_1", "name": "send", "input": {"to": "cto", "text": "hi"}},
                {"type": "tool_use", "id": "toolu_2", "name": "send",
                 "input": {"to": "nobody", "text": "hi"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sent", "is_error": False},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "unknown seat nobody",
                 "is_error": True}]}]
    asyncio.run(main())


def test_anthropic_429_with_an_http_date_cools_then_answers(wire):
    async def main():
        # An HTTP date has whole seconds: 2 s ahead cools the key for 1-2 s.
        wire.queue(anthropic_error("Number of requests has exceeded your rate limit", "rate_limit_error"),
                   429, {"retry-after": email.utils.formatdate(time.time() + 2, usegmt=True)})
        wire.queue(anthropic_reply("after the limit"))
        p = make_provider("ant", anthropic_spec(wire), env=ENV)   # no fleet: the instance remembers
        with pytest.raises(CoolingDown) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(0.5))
        [limited] = wire.received()
        assert await p.cooling() == caught.value.until > limited.at + 0.5

        r = await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
        await p.close()
        assert r.text == "after the limit"
        _, retried = wire.received()
        assert retried.at >= caught.value.until
    asyncio.run(main())


# ------------------------------------------------------------------ cli

def cli_spec(command: list[str], max_concurrent: int | None = None, key: str | None = None) -> ProviderSpec:
    return ProviderSpec(kind="cli", command=command, max_concurrent=max_concurrent, api_key_env=key)


def write_script(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def group_alive(pgid: int) -> list[int]:
    """Processes of group *pgid* that still run (a zombie waiting for its reaper does not)."""
    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return out


def test_cli_reply_is_the_agents_stdout(short_tmp):
    script = write_script(os.path.join(short_tmp, "agent.py"), (
        "import os, sys\n"
        "print(sys.stdin.read().upper())\n"
        "print('spawned by', os.environ['CREWLET_SPAWNED_BY'])\n"))
    env = {**os.environ, "CREWLET_SPAWN_MARK": "seats-boot-42"}

    async def main():
        p = make_provider("agent", cli_spec([sys.executable, script]), env=env)
        history = [Message("user", "hello there"), Message("assistant", "Hi."),
                   Message("tool", "42 rows", call_id="c1", name="query")]
        r = await p.complete(SYSTEM, history, [SEND], deadline=soon(20))
        await p.close()
        assert r.text == ("YOU ARE THE CTO.\n\nUSER: HELLO THERE\nASSISTANT: HI.\nTOOL QUERY: 42 ROWS\n\n"
                          "spawned by seats-boot-42")
        assert (r.calls, r.stop) == ((), "end")
        assert r.usage == Usage(4 + 2 + 1 + 2, len(r.text.split()))
    asyncio.run(main())


def test_cli_failure_carries_the_stderr_tail():
    async def main():
        p = make_provider("agent", cli_spec(["sh", "-c", "echo partial; echo 'it broke badly' >&2; exit 3"]))
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(20))
        assert not caught.value.retryable
        assert "exit 3" in str(caught.value) and "it broke badly" in str(caught.value)
    asyncio.run(main())


def test_cli_failure_redacts_secrets_of_its_environment():
    async def main():
        env = {**os.environ, "SOME_API_KEY": "hunter2hunter2"}
        p = make_provider("agent", cli_spec(["sh", "-c", "echo \"bad key $SOME_API_KEY\" >&2; exit 1"],
                                            key="SOME_API_KEY"), env=env)
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(20))
        assert "hunter2hunter2" not in str(caught.value) and "bad key [redacted]" in str(caught.value)
    asyncio.run(main())


def test_cli_agent_gets_its_own_key_and_no_other_secret():
    """An agent's environment is built from nothing: its provider's own key,
    never another provider's key, a webhook secret or crewlet's variables."""
    async def main():
        env = {**os.environ, "MINE_API_KEY": "mine-mine-mine-mine", "OTHER_API_KEY": "other-other-other",
               "HOOK_SECRET": "hook-hook-hook-hook", "CREWLET_SPAWN_MARK": "n/seats/x"}
        p = make_provider("agent", cli_spec(["sh", "-c", "env"], key="MINE_API_KEY"), env=env)
        reply = await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(20))
        seen = dict(line.split("=", 1) for line in reply.text.splitlines() if "=" in line)
        assert seen["MINE_API_KEY"] == "mine-mine-mine-mine"
        assert seen["CREWLET_SPAWNED_BY"] == "n/seats/x"
        assert "OTHER_API_KEY" not in seen and "HOOK_SECRET" not in seen
        assert not [v for v in seen.values() if "other-other" in v or "hook-hook" in v]
    asyncio.run(main())


def test_a_key_held_as_a_fleet_secret_reaches_the_next_request_and_agent(natsd, wire):
    """api_key_secret: the key is read from the process's vault at every
    request (a rotated one is the next request's), and a CLI agent is given
    it under its api_key_env's name, from no variable of crewlet's."""
    import nats

    from crewlet.coord import buckets
    from crewlet.vault import Keys, Vault
    from crewlet.vault import store

    async def main():
        keys = Keys(["k" * 43])
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=5)
        try:
            await buckets.ensure(js, buckets.SECRETS, 1)
            await store.put(js, keys, "llm", "vault-key-one-0123", by="t")
            vault = Vault(js, keys, role="test")
            follow = asyncio.create_task(vault.run())
            http = make_provider("oai", ProviderSpec(kind="openai", model="m", base_url=wire.url,
                                                     api_key_secret="llm"), env={}, vault=vault)
            agent = make_provider("agent", ProviderSpec(kind="cli", command=["sh", "-c", "env"],
                                                        api_key_secret="llm", api_key_env="AGENT_KEY"),
                                  env={**os.environ, "AGENT_KEY": "from-crewlets-env"}, vault=vault)
            wire.queue(openai_reply("one"))
            await http.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
            await store.put(js, keys, "llm", "vault-key-two-4567", by="t")
            async with asyncio.timeout(5):
                while await vault.value("llm") != "vault-key-two-4567":
                    await asyncio.sleep(0.01)
            wire.queue(openai_reply("two"))
            await http.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
            assert [r.headers["authorization"] for r in wire.received()] == [
                "Bearer vault-key-one-0123", "Bearer vault-key-two-4567"]
            reply = await agent.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(20))
            seen = dict(line.split("=", 1) for line in reply.text.splitlines() if "=" in line)
            assert seen["AGENT_KEY"] == "vault-key-two-4567"
            await store.remove(js, "llm")
            async with asyncio.timeout(5):
                while await vault.value("llm") is not None:
                    await asyncio.sleep(0.01)
            with pytest.raises(ProviderError, match="secret llm .* is not set"):
                await http.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10))
            follow.cancel()
            await http.close()
        finally:
            await nc.close()
    asyncio.run(main())


def test_cli_past_the_deadline_kills_the_whole_group(short_tmp):
    pids = os.path.join(short_tmp, "pids")
    command = ["sh", "-c", f"echo $$ > {pids}; sleep 300 & echo $! >> {pids}; sleep 300"]

    async def main():
        p = make_provider("agent", cli_spec(command))
        started = time.monotonic()
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(1.5))
        assert time.monotonic() - started < 5
        assert "timed out" in str(caught.value) and not caught.value.retryable
    asyncio.run(main())
    leader, grandchild = (int(x) for x in open(pids).read().split())
    # The agent leads its own group (start_new_session); the grandchild is in it.
    wait_for(lambda: not group_alive(leader), 5, what="the agent's process group to be gone")
    assert not alive(leader) and not alive(grandchild)


def test_cli_cancelled_turn_kills_the_whole_group(short_tmp):
    pids = os.path.join(short_tmp, "pids")
    command = ["sh", "-c", f"sleep 300 & echo $! > {pids}.tmp; mv {pids}.tmp {pids}; sleep 300"]

    async def main():
        p = make_provider("agent", cli_spec(command))
        turn = asyncio.ensure_future(p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(60)))
        deadline = time.monotonic() + 10
        while not os.path.exists(pids):
            assert time.monotonic() < deadline and not turn.done(), "the agent never started"
            await asyncio.sleep(0.02)
        grandchild = int(open(pids).read())
        pgid = os.getpgid(grandchild)
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        return pgid
    pgid = asyncio.run(main())
    assert pgid != os.getpgid(0)
    wait_for(lambda: not group_alive(pgid), 5, what="the agent's process group to be gone")


def test_cli_turn_cancelled_while_its_agent_starts_ends_at_once_and_leaves_nothing():
    """A cancel that lands while asyncio is still connecting the new agent's
    pipes (a seat released at that moment): Python's own handling there
    kills the agent and then waits for its pipes to close, which a child it
    left behind holds open — the turn hung for as long as that child lived
    (CI, once). Cancelled at each of the first loop turns of the start, the
    turn ends within seconds and no process of its group is left."""
    marker = f"{random.randint(100, 199)}.{os.getpid()}"   # a sleep nobody else runs
    command = ["sh", "-c", f"sleep {marker} & sleep {marker}"]

    def left() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"])
                if (p.info["cmdline"] or [])[-1:] == [marker]]

    async def main(turns: int) -> float:
        p = make_provider("agent", cli_spec(command))
        turn = asyncio.ensure_future(p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(60)))
        for _ in range(turns):
            await asyncio.sleep(0)
        turn.cancel()
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(turn, 20)
        return time.monotonic() - started

    for turns in range(6):
        took = asyncio.run(main(turns))
        assert took < 10, (turns, took)
        wait_for(lambda: not left(), 5, what=f"no agent process left (cancelled after {turns} loop turns)")


def test_cli_max_concurrent_bounds_agents_at_once(short_tmp):
    runs = os.path.join(short_tmp, "runs")
    os.makedirs(runs)
    script = write_script(os.path.join(short_tmp, "agent.py"), (
        "import os, sys, time\n"
        "sys.stdin.read()\n"
        "start = time.time()\n"
        "time.sleep(0.4)\n"
        f"open(os.path.join({runs!r}, str(os.getpid())), 'w').write(f'{{start}} {{time.time()}}')\n"
        "print('done')\n"))

    async def main():
        p = make_provider("agent", cli_spec([sys.executable, script], max_concurrent=2))
        assert p.max_concurrent == 2
        replies = await asyncio.gather(*(p.complete(SYSTEM, [Message("user", f"job {i}")], [],
                                                    deadline=soon(20)) for i in range(4)))
        assert [r.text for r in replies] == ["done"] * 4
    asyncio.run(main())

    spans = [tuple(map(float, open(os.path.join(runs, f)).read().split())) for f in os.listdir(runs)]
    assert len(spans) == 4
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running, most = 0, 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most == 2, f"at most 2 agents at once, and 2 did run together: {sorted(spans)}"


# ------------------------------------------------------------------ streaming

class Recorder(Sink):
    """What a sink was told, in order; *opens* is set at the first delta."""

    def __init__(self, opens: threading.Event | None = None):
        self.told: list[tuple] = []
        self.opens = opens

    async def delta(self, text):
        self.told.append(("delta", text))
        if self.opens is not None:
            self.opens.set()

    async def restart(self):
        self.told.append(("restart",))

    def text(self) -> str:
        """The text of the call, as a consumer of deltas reads it: what came after the last restart."""
        after = self.told[max((i for i, t in enumerate(self.told) if t == ("restart",)), default=-1) + 1:]
        return "".join(t[1] for t in after)


def deltas(*pieces: str) -> list[tuple]:
    return [("delta", p) for p in pieces]


def test_openai_streams_text_as_it_comes_and_answers_as_without_streaming(wire):
    async def main():
        pieces = ["Road", "map ", "attached", "."]
        gate = threading.Event()
        stream = openai_stream(pieces, usage=(31, 4))
        stream.insert(2, gate)   # after the first piece: the rest waits for the sink to have it
        wire.queue(openai_reply("Roadmap attached.", usage=(31, 4)))
        wire.queue_stream(stream)
        p = make_provider("oai", openai_spec(wire), env=ENV)
        mail = [Message("user", "send me the roadmap")]
        plain = await p.complete(SYSTEM, mail, [], deadline=soon(10))
        sink = Recorder(opens=gate)
        streamed = await p.complete(SYSTEM, mail, [], deadline=soon(10), sink=sink)
        await p.close()
        assert streamed == plain == Reply("Roadmap attached.", usage=Usage(31, 4), stop="end")
        assert sink.told == deltas(*pieces)
        assert wire.gates_missed == 0, "the first delta reached the sink while the stream was open"
        first, second = wire.received()
        assert "stream" not in first.body, "no sink: the request is as it always was"
        assert second.body == {**first.body, "stream": True, "stream_options": {"include_usage": True}}
    asyncio.run(main())


def test_openai_streamed_tool_calls_assemble_from_their_fragments(wire):
    async def main():
        # Two calls whose fragments interleave: each is keyed by its index.
        fragments = [(0, "call_a", "send", '{"to": '), (1, "call_b", "send", "{not"),
                     (0, None, None, '"cto", "text"'), (1, None, None, " json"), (0, None, None, ': "hi"}')]
        wire.queue(openai_reply("Sending.", [("call_a", "send", {"to": "cto", "text": "hi"}),
                                             ("call_b", "send", "{not json")], usage=(20, 7)))
        wire.queue_stream(openai_stream(["Send", "ing."], fragments, usage=(20, 7)))
        p = make_provider("oai", openai_spec(wire), env=ENV)
        user = [Message("user", "tell the cto hi")]
        plain = await p.complete(SYSTEM, user, [SEND], deadline=soon(10))
        sink = Recorder()
        streamed = await p.complete(SYSTEM, user, [SEND], deadline=soon(10), sink=sink)
        await p.close()
        assert streamed == plain
        assert streamed.calls == (ToolCall("call_a", "send", {"to": "cto", "text": "hi"}),
                                  ToolCall("call_b", "send", {"_raw": "{not json"}))
        assert (streamed.stop, streamed.usage) == ("tools", Usage(20, 7))
        assert sink.told == deltas("Send", "ing.")
    asyncio.run(main())


def test_openai_stream_cut_midway_restarts_the_sink_and_is_retried(wire):
    async def main():
        wire.queue(openai_error("The server had an error", "server_error"), 500)  # before any stream
        wire.queue_stream(openai_stream(["All ", "is "])[:3] + [CUT])              # role, All, is, cut
        wire.queue_stream(openai_stream(["All ", "is ", "well."], usage=(9, 3)))
        p = make_provider("oai", openai_spec(wire), env=ENV)
        sink = Recorder()
        r = await p.complete(SYSTEM, [Message("user", "status?")], [], deadline=soon(10), sink=sink)
        assert sink.told == [*deltas("All ", "is "), ("restart",), *deltas("All ", "is ", "well.")], \
            "a failure before the stream tells the sink nothing; a cut one restarts it"
        assert r == Reply("All is well.", usage=Usage(9, 3)) and sink.text() == r.text
        failed, cut, whole = wire.received()
        assert cut.at - failed.at >= 0.5 and whole.at - cut.at >= 1.0, "the one retry loop's backoff"

        # Cut with no time left to retry: the sink is told, the error is retryable.
        wire.queue_stream(openai_stream(["Half"])[:2] + [CUT])
        sink = Recorder()
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "status?")], [], deadline=soon(0.4), sink=sink)
        await p.close()
        assert caught.value.retryable and "payload is not completed" in str(caught.value)
        assert sink.told == [*deltas("Half"), ("restart",)]
    asyncio.run(main())


def test_openai_error_chunk_midway_is_read_as_its_status(wire):
    async def main():
        refusal = (None, {"error": {"message": "context too long", "type": "BadRequestError", "code": 400}})
        wire.queue_stream(openai_stream(["Par"])[:2] + [refusal])
        p = make_provider("oai", openai_spec(wire), env=ENV)
        sink = Recorder()
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10), sink=sink)
        await p.close()
        assert not caught.value.retryable and "context too long" in str(caught.value)
        assert sink.told == [*deltas("Par"), ("restart",)] and len(wire.received()) == 1
    asyncio.run(main())


def test_anthropic_streams_text_and_tool_use_and_answers_as_without_streaming(wire):
    async def main():
        call = ("toolu_1", "send", {"to": "cto", "text": "hi"})
        wire.queue(anthropic_reply("Sending it.", [call], usage=(31, 9)))
        wire.queue_stream(anthropic_stream([("text", "Send", "ing it."),
                                            ("tool_use", "toolu_1", "send", '{"to": "c', 'to", "text": "hi"}')],
                                           usage=(31, 9)))
        p = make_provider("ant", anthropic_spec(wire), env=ENV)
        user = [Message("user", "tell the cto hi")]
        plain = await p.complete(SYSTEM, user, [SEND], deadline=soon(10))
        sink = Recorder()
        streamed = await p.complete(SYSTEM, user, [SEND], deadline=soon(10), sink=sink)
        assert streamed == plain and streamed.calls == (ToolCall(*call),)
        assert sink.told == deltas("Send", "ing it.")
        first, second = wire.received()
        assert second.body == {**first.body, "stream": True}

        # Text blocks join with a newline, in the deltas too; a tool use without input
        # fragments has none; cache reads and writes count as input, as unstreamed.
        wire.queue_stream(anthropic_stream([("text", "Both.", ""), ("tool_use", "toolu_2", "clock"),
                                            ("text", "", "Done.")], usage=(12, 5), cache=(3, 4)))
        sink = Recorder()
        r = await p.complete(SYSTEM, user, [SEND], deadline=soon(10), sink=sink)
        await p.close()
        assert r == Reply("Both.\nDone.", (ToolCall("toolu_2", "clock", {}),), Usage(12 + 3 + 4, 5), "tools")
        assert sink.told == deltas("Both.", "\nDone.") and sink.text() == r.text
    asyncio.run(main())


def test_anthropic_error_events_and_truncated_streams(wire):
    async def main():
        whole = anthropic_stream([("text", "Let me ", "think.")], usage=(5, 2))
        # message_start, ping, block start, "Let me ", then the API is overloaded.
        overloaded = whole[:4] + [("error", anthropic_error("Overloaded", "overloaded_error"))]
        wire.queue_stream(overloaded)
        wire.queue_stream(whole[:-1])   # everything but message_stop, then the stream closes
        wire.queue_stream(whole)
        p = make_provider("ant", anthropic_spec(wire), env=ENV)
        sink = Recorder()
        r = await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10), sink=sink)
        assert r == Reply("Let me think.", usage=Usage(5, 2))
        assert sink.told == [*deltas("Let me "), ("restart",), *deltas("Let me ", "think."), ("restart",),
                             *deltas("Let me ", "think.")]
        assert len(wire.received()) == 3

        refused = whole[:4] + [("error", anthropic_error("prompt is too long"))]
        wire.queue_stream(refused)
        sink = Recorder()
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(10), sink=sink)
        await p.close()
        assert not caught.value.retryable and "invalid_request_error: prompt is too long" in str(caught.value)
        assert sink.told == [*deltas("Let me "), ("restart",)] and len(wire.received()) == 4
    asyncio.run(main())


def test_scripted_streams_its_reply_word_by_word():
    async def main():
        p = make_provider("scripted", SCRIPT)
        sink = Recorder()
        hello = [Message("user", "hello")]
        r = await p.complete(SYSTEM, hello, [], deadline=soon(5), sink=sink)
        assert sink.told == deltas("Hello! ", "What ", "can ", "I ", "do ", "for ", "you?")
        assert r == await p.complete(SYSTEM, hello, [], deadline=soon(5))

        sink = Recorder()
        r = await p.complete(SYSTEM, [Message("user", "ask cto for a plan")], [SEND], deadline=soon(5),
                             sink=sink)
        assert r.calls and sink.told == [], "tool calls only: no text to stream"
    asyncio.run(main())


def test_scripted_paces_its_words_when_the_rule_asks():
    paced = ProviderSpec.model_validate({"kind": "scripted", "rules": [
        {"match": "slow", "reply": "one two three", "pace": 0.2}]})

    async def main():
        p = make_provider("scripted", paced)
        sink = Recorder()
        started = time.monotonic()
        r = await p.complete(SYSTEM, [Message("user", "slow")], [], deadline=soon(5), sink=sink)
        assert time.monotonic() - started >= 0.4, "two waits between three words"
        assert sink.told == deltas("one ", "two ", "three") and r.text == "one two three"

        sink = Recorder()
        with pytest.raises(ProviderError) as caught:
            await p.complete(SYSTEM, [Message("user", "slow")], [], deadline=soon(0.3), sink=sink)
        assert caught.value.retryable and "deadline" in str(caught.value)
        assert sink.told[0] == ("delta", "one ") and sink.told[-1] == ("restart",)
    asyncio.run(main())


def test_cli_streams_its_reply_as_one_delta():
    async def main():
        p = make_provider("agent", cli_spec(["sh", "-c", "cat >/dev/null; echo all at once"]))
        sink = Recorder()
        r = await p.complete(SYSTEM, [Message("user", "hi")], [], deadline=soon(20), sink=sink)
        assert r.text == "all at once" and sink.told == deltas("all at once")
    asyncio.run(main())
