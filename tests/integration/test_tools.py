"""The tool registry and the built-in tool, against a real nats-server:
schemas and argument checks, and ``send`` into real mailboxes (once, however
often a turn is redone). The estate's tools (notes among them) are
tests/integration/test_estate_tools.py's."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import nats
import pytest

from crewlet.agent.tools import Registry, Tool, ToolContext, ToolError, builtin_tools
from crewlet.agent.types import ToolSpec
from crewlet.queue.jetstream import STREAM, JetStreamMailboxes


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def ctx(seat: str, key: str = "trig-1.0.0", services=None) -> ToolContext:
    return ToolContext(seat=seat, trigger=key.split(".")[0], token=7, call_key=key, services=services)


def registry(*extra: Tool) -> Registry:
    reg = Registry()
    for tool in [*builtin_tools(), *extra]:
        reg.add(tool)
    return reg


# ------------------------------------------------------------------ the registry

def test_the_registry_offers_sorted_schemas_and_turns_every_failure_into_an_error_result():
    async def refuse(ctx, args):
        raise ToolError("not today")

    async def broken(ctx, args):
        return {}["missing"]

    async def stuck(ctx, args):
        await asyncio.sleep(3600)

    async def number(ctx, args):
        return 42

    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    reg = registry(Tool("zz_refuse", "refuses", schema, refuse, owner="mcp:x"),
                   Tool("aa_broken", "raises", schema, broken, owner="mcp:x"),
                   Tool("stuck", "never ends", schema, stuck, owner="mcp:y"),
                   Tool("number", "not a string", schema, number))
    assert reg.names() == ["aa_broken", "notify", "number", "send", "stuck", "zz_refuse"]
    specs = reg.specs()
    assert [s.name for s in specs] == reg.names() and all(isinstance(s, ToolSpec) for s in specs)
    send = {s.name: s for s in specs}["send"]
    assert send.parameters["type"] == "object" and send.parameters["required"] == ["seat", "text"]

    # What add refuses: a taken name, a name no provider accepts, a schema that is not one.
    with pytest.raises(ValueError, match="taken"):
        reg.add(Tool("send", "again", schema, refuse))
    with pytest.raises(ValueError, match="bad tool name"):
        reg.add(Tool("has space", "x", schema, refuse))
    with pytest.raises(ValueError, match="bad tool name"):
        reg.add(Tool("x" * 65, "x", schema, refuse))
    with pytest.raises(ValueError, match="type object"):
        reg.add(Tool("arr", "x", {"type": "array"}, refuse))
    with pytest.raises(ValueError, match="bad parameters schema"):
        reg.add(Tool("bad", "x", {"type": "object", "properties": {"a": {"type": "nope"}}}, refuse))

    async def main():
        c = ctx("alice")
        text, error = await reg.call(c, "nope", {})
        assert error and text.startswith("unknown tool 'nope'; tools: aa_broken, notify, number, send")
        assert await reg.call(c, "send", {"seat": "bob"}) == \
            ("invalid arguments for send: 'text' is a required property", True)
        assert await reg.call(c, "send", {"seat": "bob", "text": 3}) == \
            ("invalid arguments for send: text: 3 is not of type 'string'", True)
        text, error = await reg.call(c, "send", {"seat": "bob", "text": "hi", "cc": "carol"})
        assert error and "'cc' was unexpected" in text
        assert await reg.call(c, "send", "hello") == \
            ("invalid arguments for send: expected an object, got str", True)
        assert await reg.call(c, "zz_refuse", {}) == ("not today", True)
        assert await reg.call(c, "aa_broken", {}) == ("aa_broken failed: KeyError: 'missing'", True)
        assert await reg.call(c, "number", {}) == ("42", False)
        # Only cancellation gets through: a turn being interrupted must stop.
        task = asyncio.create_task(reg.call(c, "stuck", {}))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        reg.remove_owner("mcp:x")
        assert reg.names() == ["notify", "number", "send", "stuck"]
        reg.add(Tool("zz_refuse", "back", schema, refuse, owner="mcp:x"))  # the name is free again

    run(main())


# ------------------------------------------------------------------ send

async def mailboxes(url: str, seats: list[str]):
    nc = await nats.connect(url, connect_timeout=2)
    js = nc.jetstream(timeout=2)
    boxes = JetStreamMailboxes(js, nc)
    await boxes.ensure_streams(replicas=1, max_consumers=100)
    await boxes.ensure(seats)
    return nc, js, boxes


def test_send_lands_in_the_other_seats_mailbox_once_however_often_the_turn_is_redone(natsd):
    async def main():
        nc, js, boxes = await mailboxes(natsd.url, ["alice", "bob"])
        services = SimpleNamespace(mailboxes=boxes, seats={"alice", "bob"})
        reg = registry()
        call = ctx("alice", "mail-1.0.2", services)
        assert await reg.call(call, "send", {"seat": "bob", "text": "hello bob"}) == ("sent to bob", False)
        # The turn is redone (the node died before its ack): the same call key again.
        assert await reg.call(call, "send", {"seat": "bob", "text": "hello bob"}) == ("sent to bob", False)
        assert (await js.stream_info(STREAM)).state.messages == 1

        bob = boxes.attach("bob")
        got = await bob.next(wait=2.0)
        assert got is not None and got.data == b"hello bob"
        assert got.headers["Crewlet-From"] == "alice" and got.trigger == "mail-1.0.2"
        await bob.ack(got)
        assert await bob.next(wait=0.3) is None

        # Refused, and nothing sent: a seat that does not exist, and oneself.
        text, error = await reg.call(call, "send", {"seat": "carol", "text": "hi"})
        assert error and text == "unknown seat 'carol'; seats: alice, bob"
        text, error = await reg.call(call, "send", {"seat": "alice", "text": "hi"})
        assert error and text.startswith("you cannot send to yourself")
        assert (await js.stream_info(STREAM)).state.messages == 1

        # Another call (another round) is another message.
        again = ctx("alice", "mail-1.1.0", services)
        assert await reg.call(again, "send", {"seat": "bob", "text": "and again"}) == ("sent to bob", False)
        got = await bob.next(wait=2.0)
        assert got is not None and got.data == b"and again" and got.trigger == "mail-1.1.0"
        await bob.ack(got)
        await boxes.close()
        await nc.close()

    run(main())
