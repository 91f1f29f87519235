"""The tool bridge (crewlet.agent.bridge): a seat's own tools served over MCP
to an agent, under one capability token a turn.

The agent is a process of its own (tests/integration/bridge_agent.py, the
SDK's streamable HTTP client) that finds the bridge through the config file
or the environment a grant gives, as ``claude -p`` or ``codex exec`` would.
Its calls land for real: mail in the other seat's JetStream mailbox, tasks
in the estate through a router to a real applier (test_router's harness).
The refusals are checked at the HTTP level with a plain client.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
import time

import httpx2
import nats
import pytest

from crewlet.agent import bridge as bridge_mod
from crewlet.agent.bridge import Bridge
from crewlet.agent.estate_tools import ESTATE_TOOL_NAMES, estate_tools
from crewlet.agent.tools import Registry, Tool, builtin_tools
from crewlet.estate import store
from crewlet.queue.jetstream import STREAM, JetStreamMailboxes
from tests.estate import run, until
from tests.integration.test_estate_tools import routed_services
from tests.integration.test_mcp import captured_events
from tests.integration.test_router import fleet_test

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Seconds an agent process may take (its start is most of it).
AGENT_WAIT = 30.0
OBJECT = {"type": "object", "properties": {}, "additionalProperties": False}
HANDSHAKE = {"protocolVersion": "2025-06-18", "capabilities": {},
             "clientInfo": {"name": "test", "version": "1"}}


async def agent(steps: list, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    """Run the agent process with *steps*; its JSON lines."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.bridge_agent", *args, json.dumps(steps),
        cwd=ROOT, env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), AGENT_WAIT)
    lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    assert proc.returncode == 0, (lines, err.decode()[-2000:])
    return lines


async def rpc(url: str, secret: str | None, method: str, params: dict | None = None, *,
              uds: str | None = None, headers: dict | None = None) -> httpx2.Response:
    """One JSON-RPC request to the bridge, as any MCP client's POST."""
    sent = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18",
            **({"Authorization": f"Bearer {secret}"} if secret is not None else {}), **(headers or {})}
    # verify=False: plain HTTP, and no TLS context to build (40 ms a client).
    transport = httpx2.AsyncHTTPTransport(uds=uds, verify=False) if uds else None
    async with httpx2.AsyncClient(transport=transport, timeout=10, verify=False) as http:
        return await http.post(url, headers=sent,
                               json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})


def answer(response: httpx2.Response) -> tuple[str, bool]:
    """A tools/call's (text, error)."""
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    return "".join(c["text"] for c in result["content"]), result["isError"]


def a_registry(*extra: Tool) -> Registry:
    reg = Registry()
    for tool in [*builtin_tools(), *extra]:
        reg.add(tool)
    return reg


async def an_mcp_tool(ctx, args):
    raise AssertionError("a seat's own MCP tool was called through the bridge")


MCP_TOOL = Tool("files__read", "a tool of the seat's own MCP server", OBJECT, an_mcp_tool, owner="mcp:files")


# ------------------------------------------------------------------ an agent at work

@fleet_test
async def test_an_agent_lists_the_seats_own_tools_sends_mail_and_writes_the_estate_once_per_turn(fleet):
    """Over TCP with a config file, then the turn redone over the unix socket
    with the environment: the same calls key the same, so the mail and the
    task land once."""
    await fleet.add("a")
    await fleet.add("b")
    services = await routed_services(fleet, "a", "b")
    nc = await nats.connect(fleet.url, connect_timeout=2)
    js = nc.jetstream(timeout=2)
    services.mailboxes = JetStreamMailboxes(js, nc)
    await services.mailboxes.ensure_streams(replicas=1, max_consumers=100)
    await services.mailboxes.ensure(["cto", "ceo"])
    reg = a_registry(*estate_tools(), MCP_TOOL)
    bridge = Bridge()
    sock = os.path.join(fleet.tmp, "bridge.sock")
    await bridge.start(socket_path=sock)
    held = {"cto": True}
    try:
        steps = [["list"],
                 ["call", "send", {"seat": "ceo", "text": "the estate ships friday"}],
                 ["call", "task_create", {"title": "ship the estate", "assignee": "cto"}],
                 ["call", MCP_TOOL.name, {}]]

        def turn():
            return bridge.grant(seat="cto", token=services.tokens["cto"], trigger="mail-7", registry=reg,
                                services=services, fence=lambda: held["cto"],
                                deadline=time.monotonic() + 60)

        with captured_events() as events, turn() as grant:
            config = bridge.config_file(grant, fleet.tmp)
            listed, sent, created, mcp = await agent(steps, "--config", config)
        assert not os.path.exists(config)  # revoked with its grant

        # Offered: the built-ins and the estate's, with their schemas; not the seat's MCP tools.
        names = [t["name"] for t in listed["tools"]]
        assert names == sorted(["send", "notify", *ESTATE_TOOL_NAMES])
        send = next(t for t in listed["tools"] if t["name"] == "send")
        assert send["schema"] == next(t for t in builtin_tools() if t.name == "send").parameters
        assert send["description"].startswith("Send a message to another seat's mailbox")
        assert sent == {"text": "sent to ceo", "error": False}
        assert created["text"].startswith("created T") and not created["error"]
        assert mcp["error"] and mcp["text"].startswith(f"unknown tool {MCP_TOOL.name!r}; tools: ")
        assert MCP_TOOL.name not in mcp["text"].split("tools: ")[1]
        assert events.named("bridge_refused", reason="not offered", seat="cto", tool=MCP_TOOL.name)

        # The mail is in ceo's real mailbox, from cto, keyed by the call's place in the turn.
        ceo = services.mailboxes.attach("ceo")
        got = await ceo.next(wait=5.0)
        assert got is not None and got.data == b"the estate ships friday"
        assert got.headers["Crewlet-From"] == "cto" and got.trigger == "mail-7.bridge.0"
        await ceo.ack(got)

        # The turn is redone (the node died before its ack): a new grant, the
        # same trigger, the same calls — over the unix socket this time.
        with turn() as again:
            env = again.env()
            assert env == {"CREWLET_MCP_BRIDGE_URL": bridge.url, "CREWLET_MCP_BRIDGE_TOKEN": again.secret,
                           "CREWLET_MCP_BRIDGE_SOCKET": sock}
            assert again.secret != grant.secret
            redone = await agent(steps[1:3], "--env", "--socket",
                                 env={**env, "CREWLET_MCP_BRIDGE_URL": "http://127.0.0.1:1/mcp"})
        assert redone == [sent, created]
        assert (await js.stream_info(STREAM)).state.messages == 1
        assert await ceo.next(wait=0.3) is None
        tasks = fleet.appliers["a"].reader.query("task.list", {})["tasks"]
        assert [t["title"] for t in tasks] == ["ship the estate"]
        # The write carried the seat's fence: every copy has it, and the seat's fence there.
        token = services.tokens["cto"]

        async def on_every_copy():
            for node in ("a", "b"):
                applier = fleet.appliers[node]
                if [t["title"] for t in applier.reader.query("task.list", {})["tasks"]] != ["ship the estate"]:
                    return False
                with applier.store.env.begin() as txn:
                    fence = txn.get(b"cto", db=applier.store.dbs["fences"])
                if fence is None or store.unpack(fence) != token:
                    return False
            return True
        await until(on_every_copy, 10)
        # No secret is ever logged.
        assert events.records and not any(grant.secret in json.dumps(r) or again.secret in json.dumps(r)
                                          for r in events.records)
    finally:
        await bridge.close()
        await services.mailboxes.close()
        await nc.close()
    assert not os.path.exists(sock)


# ------------------------------------------------------------------ refusals

async def echo(ctx, args):
    return f"{ctx.seat} {ctx.trigger} {ctx.token} {ctx.call_key} {ctx.services}"


ECHO = Tool("echo", "says who called", OBJECT, echo)


def test_a_token_opens_its_own_turn_only_and_dies_with_it(short_tmp):
    async def main():
        bridge = Bridge()
        sock = os.path.join(short_tmp, "b.sock")
        await bridge.start(socket_path=sock)
        reg = a_registry(ECHO, MCP_TOOL)
        try:
            with captured_events() as events:
                grant = bridge.grant(seat="cto", token=7, trigger="t1", registry=reg, services="svc",
                                     fence=lambda: True, deadline=time.monotonic() + 60)
                other = bridge.grant(seat="ceo", token=3, trigger="t9", registry=reg, services="svc2",
                                     fence=lambda: True, deadline=None)
                assert grant.url == bridge.url == f"http://127.0.0.1:{bridge.url.split(':')[2]}"
                assert len(grant.secret) >= 43 and grant.socket_path == sock
                assert grant.secret not in repr(grant)

                ok = await rpc(grant.url, grant.secret, "initialize", HANDSHAKE)
                assert ok.status_code == 200 and ok.json()["result"]["serverInfo"]["name"] == "crewlet"
                listed = (await rpc(grant.url, grant.secret, "tools/list")).json()["result"]["tools"]
                assert [t["name"] for t in listed] == ["echo", "notify", "send"]
                assert listed[0]["inputSchema"] == OBJECT and listed[0]["description"] == "says who called"
                # Each token acts as its own seat and turn; calls count within the grant.
                assert answer(await rpc(grant.url, grant.secret, "tools/call", {"name": "echo"})) == \
                    ("cto t1 7 t1.bridge.0 svc", False)
                assert answer(await rpc(grant.url, other.secret, "tools/call", {"name": "echo"})) == \
                    ("ceo t9 3 t9.bridge.0 svc2", False)
                assert answer(await rpc("http://localhost/mcp", grant.secret, "tools/call",
                                        {"name": "echo", "arguments": {}}, uds=sock)) == \
                    ("cto t1 7 t1.bridge.1 svc", False)
                # Arguments the schema refuses are the agent's to correct, as in a turn.
                text, error = answer(await rpc(grant.url, grant.secret, "tools/call",
                                               {"name": "send", "arguments": {"seat": "ceo"}}))
                assert error and text == "invalid arguments for send: 'text' is a required property"
                # A seat's own MCP tool is not there.
                text, error = answer(await rpc(grant.url, grant.secret, "tools/call",
                                               {"name": MCP_TOOL.name}))
                assert error and text == f"unknown tool {MCP_TOOL.name!r}; tools: echo, notify, send"

                # No token, a made-up one, another scheme: 401 before any MCP.
                for secret, headers in ((None, None), ("made-up", None), ("x" * 5000, None),
                                        (None, {"Authorization": f"Basic {grant.secret}"})):
                    refused = await rpc(grant.url, secret, "tools/list", headers=headers)
                    assert refused.status_code == 401, refused.text
                    assert refused.headers["www-authenticate"].startswith("Bearer")
                    assert "jsonrpc" not in refused.json()
                assert (await rpc(grant.url, "made-up", "tools/list", uds=sock)).status_code == 401
                # A good token elsewhere than /mcp; a browser's Origin; a foreign Host.
                assert (await rpc(grant.url + "x", grant.secret, "tools/list")).status_code == 404
                assert (await rpc(grant.url, grant.secret, "tools/list",
                                  headers={"Origin": "http://evil.example"})).status_code == 403
                assert (await rpc(grant.url, grant.secret, "tools/list",
                                  headers={"Host": "evil.example"})).status_code == 421
                # No stream of the server's own to open, no session to end.
                async with httpx2.AsyncClient(verify=False, timeout=10) as http:
                    for method in ("GET", "DELETE"):
                        got = await http.request(method, grant.url, headers={
                            "Authorization": f"Bearer {grant.secret}", "Accept": "text/event-stream"})
                        assert got.status_code == 405 and got.headers["allow"] == "POST"
                # A client of the 2026-07-28 protocol (no handshake) is served the same.
                modern = await rpc(grant.url, grant.secret, "tools/call", {
                    "name": "echo", "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                              "io.modelcontextprotocol/clientCapabilities": {}}},
                    headers={"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
                             "Mcp-Name": "echo"})
                # (Every tools/call of the grant counts, the refused ones too: this is its fifth.)
                assert answer(modern) == ("cto t1 7 t1.bridge.4 svc", False)

                # The turn ends: its token is dead, the other turn's lives on.
                bridge.revoke(grant)
                bridge.revoke(grant)  # idempotent
                assert not grant.live
                assert (await rpc(grant.url, grant.secret, "tools/list")).status_code == 401
                refused = await rpc("http://localhost/mcp", grant.secret, "tools/list", uds=sock)
                assert refused.status_code == 401
                assert answer(await rpc(other.url, other.secret, "tools/call", {"name": "echo"}))[0] == \
                    "ceo t9 3 t9.bridge.1 svc2"
                with pytest.raises(ValueError, match="revoked"):
                    bridge.config_file(grant, short_tmp)

                # At its deadline a grant dies by itself.
                late = bridge.grant(seat="cto", token=7, trigger="t2", registry=reg, services=None,
                                    fence=lambda: True, deadline=time.monotonic() - 0.001)
                assert not late.live
                assert (await rpc(late.url, late.secret, "tools/list")).status_code == 401

            refusals = [r["reason"] for r in events.named("bridge_refused")]
            assert refusals.count("no token") == 1 and refusals.count("not a bearer token") == 2
            assert refusals.count("unknown or revoked token") == 4 and refusals.count("not offered") == 1
            assert events.named("bridge_refused", reason="expired", seat="cto", trigger="t2")
            for secret in (grant.secret, other.secret, late.secret):
                assert not any(secret in json.dumps(r) for r in events.records)

            # The config file: the common mcpServers shape, for the owner's eyes only.
            with bridge.grant(seat="cto", token=7, trigger="t3", registry=reg, services=None,
                              fence=lambda: True, deadline=None) as third:
                path = bridge.config_file(third, short_tmp)
                assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
                with open(path) as f:
                    assert json.load(f) == {"mcpServers": {"crewlet": {
                        "type": "http", "url": bridge.url,
                        "headers": {"Authorization": f"Bearer {third.secret}"}}}}
                assert third.env() == {"CREWLET_MCP_BRIDGE_URL": bridge.url,
                                       "CREWLET_MCP_BRIDGE_TOKEN": third.secret,
                                       "CREWLET_MCP_BRIDGE_SOCKET": sock}
            assert not os.path.exists(path)
            assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        finally:
            await bridge.close()
        assert not os.path.exists(sock)

    run(main())


def test_a_fenced_seat_gets_nothing_done_and_its_token_dies(short_tmp):
    async def main():
        ran = []

        async def act(ctx, args):
            ran.append(ctx.call_key)
            return "done"

        reg = a_registry(Tool("act", "a side effect", OBJECT, act))
        bridge = Bridge()
        await bridge.start()
        try:
            holds = {"now": True}
            with captured_events() as events:
                grant = bridge.grant(seat="cto", token=7, trigger="t1", registry=reg, services=None,
                                     fence=lambda: holds["now"], deadline=time.monotonic() + 60)
                done = await rpc(grant.url, grant.secret, "tools/call", {"name": "act"})
                assert answer(done) == ("done", False)
                holds["now"] = False  # another node took the seat under a higher token
                text, error = answer(await rpc(grant.url, grant.secret, "tools/call", {"name": "act"}))
                assert error and text.startswith("refused: seat cto is fenced") and "token 7" in text
                assert ran == ["t1.bridge.0"] and not grant.live
                assert (await rpc(grant.url, grant.secret, "tools/call", {"name": "act"})).status_code == 401

                # A fence that cannot answer is a lost one.
                def broken():
                    raise RuntimeError("lease bucket unreachable")
                shaky = bridge.grant(seat="cto", token=8, trigger="t2", registry=reg, services=None,
                                     fence=broken, deadline=time.monotonic() + 60)
                text, error = answer(await rpc(shaky.url, shaky.secret, "tools/call", {"name": "act"}))
                assert error and "fenced" in text and ran == ["t1.bridge.0"]
                assert (await rpc(shaky.url, shaky.secret, "tools/list")).status_code == 401
            assert events.named("bridge_refused", reason="fenced", seat="cto", trigger="t1", tool="act")
            assert events.named("bridge_fence_failed", seat="cto")
        finally:
            await bridge.close()

    run(main())


def test_a_call_still_running_ends_with_its_turn_or_its_deadline(short_tmp):
    async def main():
        started = asyncio.Event()

        async def stuck(ctx, args):
            started.set()
            await asyncio.Event().wait()  # never set: only cancellation ends it

        reg = a_registry(Tool("stuck", "never ends", OBJECT, stuck))
        bridge = Bridge()
        await bridge.start()
        try:
            grant = bridge.grant(seat="cto", token=7, trigger="t1", registry=reg, services=None,
                                 fence=lambda: True, deadline=time.monotonic() + 60)
            call = asyncio.create_task(rpc(grant.url, grant.secret, "tools/call", {"name": "stuck"}))
            await asyncio.wait_for(started.wait(), 10)
            bridge.revoke(grant)
            assert answer(await asyncio.wait_for(call, 10)) == ("stuck was stopped: this turn is over", True)

            # A call runs no longer than its turn has left.
            started.clear()
            short = bridge.grant(seat="cto", token=7, trigger="t2", registry=reg, services=None,
                                 fence=lambda: True, deadline=time.monotonic() + 0.5)
            began = time.monotonic()
            assert answer(await rpc(short.url, short.secret, "tools/call", {"name": "stuck"})) == \
                ("stuck was stopped: the turn's time ran out", True)
            assert time.monotonic() - began < 5
        finally:
            await bridge.close()

    run(main())


def test_the_bridge_listens_on_loopback_only_and_keeps_no_stranger_files(short_tmp):
    async def main():
        with pytest.raises(ValueError, match="127.0.0.1 only"):
            await Bridge().start(host="0.0.0.0")
        with pytest.raises(RuntimeError, match="not started"):
            Bridge().grant(seat="cto", token=1, trigger="t", registry=a_registry(), services=None,
                           fence=lambda: True, deadline=None)
        # A regular file where the socket should be is not ours to remove.
        taken = os.path.join(short_tmp, "file")
        with open(taken, "w") as f:
            f.write("not a socket")
        with pytest.raises(FileExistsError):
            await Bridge().start(socket_path=taken)
        with open(taken) as f:
            assert f.read() == "not a socket"

        # A socket left by a process gone is replaced.
        stale = os.path.join(short_tmp, "stale.sock")
        left = socket.socket(socket.AF_UNIX)
        left.bind(stale)
        left.close()
        bridge = Bridge()
        await bridge.start(socket_path=stale, socket_mode=0o666)
        try:
            assert stat.S_IMODE(os.stat(stale).st_mode) == 0o666
            # A live one is not: its clients would be talking to a stranger.
            with pytest.raises(FileExistsError, match="in use"):
                await Bridge().start(socket_path=stale)
            host, port = bridge.url.removeprefix("http://").removesuffix("/mcp").split(":")
            assert host == "127.0.0.1"
            with socket.create_connection((host, int(port)), timeout=2):
                pass
            grant = bridge.grant(seat="cto", token=1, trigger="t", registry=a_registry(ECHO), services=None,
                                 fence=lambda: True, deadline=None)
            assert answer(await rpc("http://localhost/mcp", grant.secret, "tools/call", {"name": "echo"},
                                    uds=stale))[0] == "cto t 1 t.bridge.0 None"
        finally:
            await bridge.close()
        assert not os.path.exists(stale)
        with pytest.raises(httpx2.ConnectError):
            await rpc(grant.url, grant.secret, "tools/list")

    run(main())


def test_grants_nobody_revoked_are_purged_after_their_deadline(short_tmp, monkeypatch):
    async def main():
        monkeypatch.setattr(bridge_mod, "PURGE_AT", 4)
        bridge = Bridge()
        await bridge.start()
        try:
            reg = a_registry()
            forgotten = [bridge.grant(seat="cto", token=1, trigger=f"t{i}", registry=reg, services=None,
                                      fence=lambda: True, deadline=time.monotonic() + 0.05) for i in range(3)]
            await until(lambda: not any(g.live for g in forgotten), 5, "the grants' deadline")
            kept = bridge.grant(seat="cto", token=1, trigger="k", registry=reg, services=None,
                                fence=lambda: True, deadline=None)
            assert len(bridge._entries) == 4  # nobody presented the dead ones
            bridge.grant(seat="cto", token=1, trigger="new", registry=reg, services=None,
                         fence=lambda: True, deadline=None)
            assert len(bridge._entries) == 2 and kept.live
        finally:
            await bridge.close()

    run(main())


# --------------------------------------------------------------------------
# On a real node: a confined CLI agent in agent mode, through the bridge
# --------------------------------------------------------------------------

BRIDGE_CLI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bridge_cli.py")
AGENT_COMPANY = """
company: {{name: bridged}}
providers:
  agent: {{kind: cli, command: [{python}, {script}]}}
  p: {{kind: scripted, rules: [{{match: '.*', reply: ok}}]}}
seats:
  - {{name: agent, persona: an agent in agent mode, provider: agent}}
  - {{name: offline, persona: an agent with no network, provider: agent, sandbox: {{network: none}}}}
  - {{name: sink, persona: a sink, provider: p, placement: {{labels: {{zone: nowhere}}}}}}
"""


def test_a_confined_cli_agent_uses_crewlets_tools_through_the_bridge_in_its_turn_only(make_node):
    """A CLI agent (confined, its own uid) creates a task and mails a seat
    through the bridge — by the config file over TCP, and with no network by
    the unix socket bound into its sandbox; the mail says which seat sent it;
    the turn's token is dead once the turn is over."""
    from tests.integration.test_sandbox import needs_bwrap
    from tests.seats import ctl_json, held, mail_of, node_url, read_nats, write_company

    needs_bwrap()
    node = make_node(fleet={"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5})
    node.start(args=("--company", write_company(node.dir, AGENT_COMPANY.format(
        python=sys.executable, script=BRIDGE_CLI))))
    until_held = time.monotonic() + 30
    while not {"agent", "offline"} <= set(held(node)):
        assert time.monotonic() < until_held, held(node)
        time.sleep(0.05)

    sock = os.path.join(node.run_dir, "bridge.sock")
    for seat, prompt, over in (("agent", "go", "config"), ("offline", "go by socket", "socket")):
        turn = ctl_json(node, "send", seat, prompt, "--wait", "60")["turn"]
        assert turn["outcome"] == "done", turn
        answers = [json.loads(part) for part in turn["reply"].split(" | ")]
        assert [a.get("error") for a in answers] == [False, False], answers
        # The token the agent held is dead now that its turn is over.
        with open(os.path.join(node.config["data_dir"], "workspaces", seat, "token.txt")) as f:
            token = f.read().strip()
        assert token
        with httpx2.Client(transport=httpx2.HTTPTransport(uds=sock), timeout=10) as http:
            after = http.post("http://localhost/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                              headers={"Authorization": f"Bearer {token}",
                                       "Accept": "application/json, text/event-stream"})
        assert after.status_code == 401, after.text

    tasks = ctl_json(node, "tasks")["tasks"]
    assert sorted(t["title"] for t in tasks) == ["filed by the agent over config", "filed by the agent over socket"]

    async def sent(nc, js):
        return await mail_of("sink", nc, js)
    assert read_nats(node_url(node), sent) == ["the agent says hi", "the agent says hi"]
