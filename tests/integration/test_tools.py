"""The tool registry and the built-in tools, against a real nats-server:
schemas and argument checks, ``send`` into real mailboxes (once, however
often a turn is redone), and a seat's notes (once per key, concurrent
writers all landing, and written from a leaf)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from types import SimpleNamespace

import nats
import pytest

from crewlet.agent.tools import Notes, Registry, Tool, ToolContext, ToolError, builtin_tools
from crewlet.agent.types import ToolSpec
from crewlet.coord import buckets
from crewlet.queue.jetstream import STREAM, JetStreamMailboxes
from tests.conftest import free_port, nats_binary, wait_for


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
    assert reg.names() == ["aa_broken", "note_write", "notes_read", "number", "send", "stuck",
                           "zz_refuse"]
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
        assert error and text.startswith("unknown tool 'nope'; tools: aa_broken, note_write")
        assert await reg.call(c, "send", {"seat": "bob"}) == \
            ("invalid arguments for send: 'text' is a required property", True)
        assert await reg.call(c, "send", {"seat": "bob", "text": 3}) == \
            ("invalid arguments for send: text: 3 is not of type 'string'", True)
        text, error = await reg.call(c, "send", {"seat": "bob", "text": "hi", "cc": "carol"})
        assert error and "'cc' was unexpected" in text
        text, error = await reg.call(c, "notes_read", {"limit": 0})
        assert error and text.startswith("invalid arguments for notes_read: limit: 0 is less than")
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
        assert reg.names() == ["note_write", "notes_read", "number", "send", "stuck"]
        reg.add(Tool("zz_refuse", "back", schema, refuse, owner="mcp:x"))  # the name is free again

    run(main())


# ------------------------------------------------------------------ send

async def mailboxes(url: str, seats: list[str]):
    nc = await nats.connect(url, connect_timeout=2)
    js = nc.jetstream(timeout=2)
    boxes = JetStreamMailboxes(js, nc)
    await boxes.ensure_streams(replicas=1, max_consumers=100, mail_days=14)
    await boxes.ensure(seats)
    return nc, js, boxes


def test_send_lands_in_the_other_seats_mailbox_once_however_often_the_turn_is_redone(natsd):
    async def main():
        nc, js, boxes = await mailboxes(natsd.url, ["alice", "bob"])
        services = SimpleNamespace(mailboxes=boxes, seats={"alice", "bob"}, notes=None)
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


# ------------------------------------------------------------------ notes

async def notes_on(url: str, keep: int = 200):
    nc = await nats.connect(url, connect_timeout=2)
    js = nc.jetstream(timeout=2)
    await buckets.ensure(js, buckets.NOTES, 1)
    return nc, Notes(js, keep=keep)


def test_notes_are_private_written_once_per_key_and_kept_to_the_newest(natsd):
    async def main():
        nc, notes = await notes_on(natsd.url, keep=5)
        assert await notes.read("alice") == []
        assert await notes.write("alice", "the client prefers mornings", key="t1.0.0") is True
        assert await notes.write("alice", "the client prefers mornings", key="t1.0.0") is False
        assert await notes.write("bob", "bob's own", key="t1.0.0") is True  # another seat, its own key
        got = await notes.read("alice")
        assert [(n["text"], n["key"]) for n in got] == [("the client prefers mornings", "t1.0.0")]
        assert isinstance(got[0]["at"], float)

        for i in range(7):
            assert await notes.write("alice", f"n{i}", key=f"t2.{i}.0")
        assert [n["text"] for n in await notes.read("alice", limit=100)] == \
            ["n2", "n3", "n4", "n5", "n6"]  # the newest 5, newest last
        assert [n["text"] for n in await notes.read("alice", limit=2)] == ["n5", "n6"]
        assert [n["text"] for n in await notes.read("bob")] == ["bob's own"]

        # Through the tools: the seat is the caller's, the key the call's.
        reg = registry()
        services = SimpleNamespace(mailboxes=None, seats={"alice", "bob"}, notes=notes)
        call = ctx("bob", "t9.0.1", services)
        assert await reg.call(call, "note_write", {"text": "remember the milk"}) == ("noted", False)
        assert await reg.call(call, "note_write", {"text": "remember the milk"}) == ("already noted", False)
        text, error = await reg.call(call, "notes_read", {})
        lines = text.splitlines()
        assert not error and len(lines) == 2 and lines[1].endswith("Z remember the milk")
        assert await reg.call(ctx("carol", "t9.0.1", services), "notes_read", {}) == ("no notes yet", False)
        await nc.close()

    run(main())


def test_concurrent_writers_of_one_seats_notes_all_land(natsd):
    async def main():
        nc, notes = await notes_on(natsd.url)
        # Each on its own connection, as two nodes would be (a hand-over mid-turn).
        others = [await notes_on(natsd.url) for _ in range(4)]
        writers = [notes] + [n for _, n in others]
        results = await asyncio.gather(*(w.write("alice", f"from writer {i}", key=f"w{i}.0.0")
                                         for i, w in enumerate(writers)))
        assert results == [True] * 5
        assert sorted(n["text"] for n in await notes.read("alice")) == \
            [f"from writer {i}" for i in range(5)]
        for other, _ in others:
            await other.close()
        await nc.close()

    run(main())


# ------------------------------------------------------------------ from a leaf

DOMAIN = "hub"


def start_server(dir: str, name: str, conf: str) -> subprocess.Popen:
    path = os.path.join(dir, f"{name}.conf")
    with open(path, "w") as f:
        f.write(conf)
    log = open(os.path.join(dir, f"{name}.log"), "ab")
    proc = subprocess.Popen([nats_binary(), "-c", path], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc


def test_notes_are_written_from_a_leaf_through_the_jetstream_domain(short_tmp):
    """A leaf has no JetStream: its KV writes must go through the domain."""
    hub_port, leaf_port, leafnode_port = free_port(), free_port(), free_port()
    hub = start_server(short_tmp, "hub", f"""
        server_name: hub
        listen: 127.0.0.1:{hub_port}
        jetstream {{ store_dir: "{os.path.join(short_tmp, 'js')}", domain: {DOMAIN} }}
        leafnodes {{ listen: 127.0.0.1:{leafnode_port} }}
    """)
    leaf = start_server(short_tmp, "leaf", f"""
        server_name: leaf
        listen: 127.0.0.1:{leaf_port}
        leafnodes {{ remotes: [ {{ url: "nats-leaf://127.0.0.1:{leafnode_port}" }} ] }}
    """)

    async def main():
        hub_nc = await nats.connect(f"nats://127.0.0.1:{hub_port}", connect_timeout=2)
        await buckets.ensure(hub_nc.jetstream(timeout=2), buckets.NOTES, 1)
        nc = await nats.connect(f"nats://127.0.0.1:{leaf_port}", connect_timeout=2)
        js = nc.jetstream(domain=DOMAIN, timeout=2)
        deadline = asyncio.get_running_loop().time() + 15
        while True:  # until the leaf has joined the hub
            try:
                await js.account_info()
                break
            except Exception:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.1)
        notes = Notes(js)
        assert await notes.write("alice", "written from a leaf", key="l1.0.0") is True
        assert await notes.write("alice", "written from a leaf", key="l1.0.0") is False
        assert await notes.write("alice", "and a second", key="l1.1.0") is True
        assert [n["text"] for n in await notes.read("alice")] == ["written from a leaf", "and a second"]
        # The hub sees what the leaf wrote.
        assert [n["text"] for n in await Notes(hub_nc.jetstream(timeout=2)).read("alice")] == \
            ["written from a leaf", "and a second"]
        await nc.close()
        await hub_nc.close()

    try:
        wait_for(lambda: hub.poll() is None and leaf.poll() is None and _listening(hub_port)
                 and _listening(leaf_port), 10, what="hub and leaf listening")
        run(main())
    finally:
        for proc in (leaf, hub):
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
