"""The inside wall (issue 23): a seat's own tools and agents, confined.

A real node runs a company whose seat ``mallory`` has a hostile MCP server of
its own (tests/integration/hostile_tool.py) twice — once with the host's
network, once with ``network: none`` — and whose seat ``cli-mallory``'s
provider is the same hostile program as a CLI agent. Asked to, each tries
everything the issue's probe did and more against the node that runs it;
every attempt must fail, each for the reason expected; the seats answer,
other seats go on, nothing crashes and the node says nothing above info.

Needs bubblewrap (Debian's ``bubblewrap``): without it these tests skip,
unless ``CREWLET_TEST_SANDBOX=required`` (CI sets it), which fails them.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys

import pytest

from crewlet import sandbox
from crewlet.config import NodeConfig
from tests.conftest import wait_for
from tests.seats import ctl_json, held, seats_stats, write_company

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTILE = os.path.join(HERE, "hostile_tool.py")
FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
LIMITS = {"processes": 32, "memory": 256 << 20}
# Secrets in crewletd's environment: a tool must never hold one but its own.
SECRETS = {"AGENT_KEY": "agent-own-key-0123456789abcdef",
           "OTHER_API_KEY": "sk-other-provider-key-0123456789",
           "HOOK_SECRET": "webhook-secret-0123456789abcdef"}


def bwrap_works() -> bool:
    box = sandbox.Sandbox(data_dir="/nonexistent", hidden=("/nonexistent",))
    box.probe()
    return box.state == "confined"


def needs_bwrap():
    if bwrap_works():
        return
    why = "bubblewrap (bwrap) does not work here: install Debian's bubblewrap package"
    if os.environ.get("CREWLET_TEST_SANDBOX") == "required":
        pytest.fail(why)
    pytest.skip(why)


COMPANY = """
company: {{name: walls}}
providers:
  p:
    kind: scripted
    rules:
      - match: '^probe (\\{{.+\\}})$'
        reply: '{{tools}}'
        tools: [{{name: evil__probe, args: {{targets: '\\1'}}}}]
      - match: '^offline (\\{{.+\\}})$'
        reply: '{{tools}}'
        tools: [{{name: offline__probe, args: {{targets: '\\1'}}}}]
      - match: '.*'
        reply: hello back
  agent:
    kind: cli
    command: [{python}, {hostile}, --cli]
    api_key_env: AGENT_KEY
  unused: {{kind: openai, model: m, api_key_env: OTHER_API_KEY}}
seats:
  - name: mallory
    persona: a tool author with bad intentions
    provider: p
    sandbox: {limits}
    mcp:
      - {{name: evil, command: {python}, args: [{hostile}]}}
      - {{name: offline, command: {python}, args: [{hostile}], sandbox: {{network: none}}}}
  - name: cli-mallory
    persona: an agent with bad intentions
    provider: agent
    sandbox: {{network: none, processes: 32, memory: {memory}}}
  - name: bob
    persona: an honest colleague
    provider: p
"""


def company(dir: str) -> str:
    return write_company(dir, COMPANY.format(python=sys.executable, hostile=HOSTILE,
                                             limits=json.dumps(LIMITS), memory=LIMITS["memory"]))


def refused(report: dict, name: str, *how: str) -> None:
    entry = report[name]
    assert entry["ok"] is False, f"{name} worked: {entry}"
    assert entry["how"] in how, f"{name} failed, but for {entry}, not {how}"


def test_a_hostile_tool_and_agent_can_do_nothing_to_the_node(make_node, monkeypatch):
    needs_bwrap()
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    node = make_node(fleet=FAST)
    node.start(args=("--company", company(node.dir)))
    wait_for(lambda: {"mallory", "cli-mallory", "bob"} <= set(held(node)), 30, what="seats held")

    def servers_up():
        mcp = seats_stats(node).get("seats", {}).get("mallory", {}).get("mcp", {})
        return len(mcp) == 2 and all(s["state"] == "up" and s["confined"] for s in mcp.values())
    try:
        wait_for(servers_up, 30, what="mallory's two servers up, confined")
    except AssertionError:
        raise AssertionError(f"servers: {seats_stats(node)}\n{node.read_log()[-4000:]}") from None

    st = node.status()
    data_dir = node.config["data_dir"]
    pids = sorted({st["node"]["pid"], *node.process_pids().values()})
    other = os.path.join(data_dir, "workspaces", "bob")
    os.makedirs(other, exist_ok=True)
    with open(os.path.join(other, "diary.txt"), "w") as f:
        f.write("bob's own")
    targets = {"data_dir": data_dir, "run_dir": node.run_dir, "config": node.config_path,
               "other_workspace": other, "pids": pids,
               "broker": node.config["stream"]["listen"], "api": node.config["ingress"]["listen"]}
    started = len(node.events())

    reports = {}
    for seat, verb, name in (("mallory", "probe", "mcp"), ("mallory", "offline", "offline"),
                             ("cli-mallory", "probe", "cli")):
        asked = {**targets, "name": name, "say_env": "AGENT_KEY"}
        out = ctl_json(node, "send", seat, f"{verb} {json.dumps(asked)}", "--wait", "60")
        assert out["turn"]["outcome"] == "done", out
        if name == "cli":  # it said its own key back: crewlet keeps none of it
            assert out["turn"]["reply"] == "probed; key [redacted]", out["turn"]
        with open(os.path.join(data_dir, "workspaces", seat, f"report-{name}.json")) as f:
            reports[name] = json.load(f)
    # Another seat goes on.
    assert ctl_json(node, "send", "bob", "hello", "--wait", "30")["turn"]["reply"] == "hello back"

    crewlet_comms = {"crewletd", "nats-server", "python3", "python"}
    for name, report in reports.items():
        # Who it is: an unprivileged uid of its seat's own, no capability, no way back up.
        me = report["identity"]["how"]
        assert me["uid"] != 0 and me["gid"] != 0 and me["cwd"] == sandbox.WORKSPACE, me
        assert me["status"]["CapEff"] == me["status"]["CapPrm"] == "0000000000000000", me
        assert me["status"]["NoNewPrivs"] == "1", me
        refused(report, "setuid_root", "EPERM")
        # What it holds: no secret but its own.
        env = report["env"]["how"]
        mine = {"AGENT_KEY"} if name == "cli" else set()
        for key, value in SECRETS.items():
            assert (value in env.values()) == (key in mine), (name, key, sorted(env))
        # Crewlet's files: not there at all.
        for what in ("read_broker_users", "read_api_token", "read_config", "read_control_socket",
                     "walk_data_dir", "walk_other_workspace"):
            refused(report, what, "ENOENT")
        # Crewlet's processes: not visible, not signalled, not traced.
        seen = report["processes"]["how"]
        assert not {pid for pid, _ in seen["pids"]} & set(pids), seen["pids"]
        assert len(seen["pids"]) <= 4, seen["pids"]  # bwrap's init, the tool (and a python child)
        assert not [e for e in seen["environs"] if any(v in e for v in SECRETS.values() if v != SECRETS["AGENT_KEY"])]
        for pid in pids:
            refused(report, f"signal_{pid}", "ESRCH")
            refused(report, f"ptrace_{pid}", "ESRCH")
        # The broker and the API: no credential to be found; guesses refused.
        offline = name in ("offline", "cli")
        brokers = [k for k in report if k.startswith("broker_")]
        apis = [k for k in report if k.startswith("api_")]
        assert len(brokers) == 3 and len(apis) == 2, (brokers, apis)  # nothing found to try
        for key in brokers:
            refused(report, key, "ECONNREFUSED" if offline else "EACCES")
            if not offline:
                assert "Authorization Violation" in report[key]["detail"], report[key]
        for key in apis:
            refused(report, key, "ECONNREFUSED" if offline else "EACCES")
            if not offline:
                assert "401" in report[key]["detail"], report[key]
        # Writes: only its workspace and its own /tmp.
        for what in ("write_usr", "write_etc", "write_install"):
            refused(report, what, "EROFS", "EACCES")
        refused(report, "write_root", "EACCES", "EROFS")
        refused(report, "write_data_dir", "ENOENT")
        refused(report, "write_run_dir", "ENOENT")
        assert report["write_workspace"]["ok"], report["write_workspace"]
        assert report["write_tmp"]["ok"], report["write_tmp"]
        # Limits.
        refused(report, "fork_bomb", "EAGAIN")
        refused(report, "allocate", "MemoryError")

    # The workspace is the seat's own uid's, on the host too; nothing leaked out of /tmp.
    ws = os.path.join(data_dir, "workspaces", "mallory")
    assert os.stat(os.path.join(ws, "mine.txt")).st_uid == reports["mcp"]["identity"]["how"]["uid"]
    assert not os.path.exists("/tmp/mine.txt") or os.stat("/tmp/mine.txt").st_uid == 0
    assert not os.path.exists(os.path.join(data_dir, "owned"))

    # The agent's key is nowhere crewlet keeps or shows anything: the log,
    # the API's turns, the data dir (but the agent's own workspace).
    key = SECRETS["AGENT_KEY"]
    assert key not in node.read_log()
    import urllib.request
    with open(os.path.join(node.run_dir, "api-token")) as f:
        token = f.read().strip()
    request = urllib.request.Request(f"http://{node.config['ingress']['listen']}/v1/turns?seat=cli-mallory",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        turns = r.read().decode()
    assert "[redacted]" in turns and key not in turns
    for top, dirs, files in os.walk(data_dir):
        dirs[:] = [d for d in dirs if os.path.join(top, d) != os.path.join(data_dir, "workspaces")]
        for name in files:
            path = os.path.join(top, name)
            if not os.path.isfile(path) or os.path.islink(path):
                continue  # sockets (run/control, run/bridge.sock)
            with open(path, "rb") as f:
                assert key.encode() not in f.read(), os.path.join(top, name)

    # Nothing crashed; the node said nothing above info while it was attacked.
    assert all(c["restarts"] == 0 for c in node.status()["children"]), node.status()["children"]
    loud = [e for e in node.events()[started:] if e.get("level") in ("warning", "error")]
    assert not loud, loud


def test_required_without_bubblewrap_refuses_the_seats_servers_and_says_so(make_node, monkeypatch, short_tmp):
    """sandbox.mode required on a machine without bubblewrap (a PATH without
    it): the seat's servers fail with the reason, status and /readyz say so,
    the seat still answers and nothing crashes."""
    bare = os.path.join(short_tmp, "bin")
    os.makedirs(bare)
    for tool in ("setpriv", "prlimit", "true", "sh"):
        found = shutil.which(tool)
        if found:
            os.symlink(found, os.path.join(bare, tool))
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), bare]))
    node = make_node(fleet=FAST, sandbox={"mode": "required"})
    node.start(args=("--company", company(node.dir)))
    wait_for(lambda: "mallory" in held(node), 30, what="mallory held")

    def refused_servers():
        mcp = seats_stats(node).get("seats", {}).get("mallory", {}).get("mcp", {})
        return len(mcp) == 2 and all(s["state"] == "refused" for s in mcp.values()) and mcp
    mcp = wait_for(refused_servers, 30, what="mallory's servers refused")
    assert all("bubblewrap is not installed" in s["last_error"] for s in mcp.values()), mcp
    box = node.status()["node"]["sandbox"]
    assert box["state"] == "refused" and "bubblewrap" in box["reason"], box
    out = ctl_json(node, "send", "bob", "hello", "--wait", "30")
    assert out["turn"]["reply"] == "hello back"
    # The CLI agent fails its turn with the reason, and nothing else.
    text = ctl_json(node, "send", "cli-mallory", "hello", "--wait", "30")["turn"]
    assert text["outcome"] == "failed" and "bubblewrap is not installed" in text["error"], text
    assert all(c["restarts"] == 0 for c in node.status()["children"])

    import urllib.request
    with urllib.request.urlopen(f"http://{node.config['ingress']['listen']}/readyz", timeout=5) as r:
        ready = json.load(r)
    assert ready["sandbox"]["state"] == "refused", ready
    from tests.seats import ctl
    shown = ctl(node, "status").stdout
    assert "REFUSED" in shown and "bubblewrap" in shown, shown


def test_the_policy_is_the_seats_then_the_servers_key_by_key():
    from crewlet.company.model import SandboxPolicy, effective_sandbox
    seat = SandboxPolicy(network="none", processes=10)
    server = SandboxPolicy.model_validate({"processes": 20, "memory": 0})
    policy = effective_sandbox(seat, server)
    assert policy.network == "none" and policy.processes == 20 and policy.memory is None
    assert policy.open_files == sandbox.DEFAULT_OPEN_FILES
    assert effective_sandbox(None, None) == sandbox.DEFAULT_POLICY
    # As the control plane delivers it: every key present, the unset ones null.
    again = SandboxPolicy.model_validate(seat.model_dump())
    assert effective_sandbox(again, SandboxPolicy.model_validate(server.model_dump())) == policy


def test_a_bind_that_would_show_the_data_dir_is_refused_and_an_install_around_it_covers_it(short_tmp):
    needs_bwrap()
    import subprocess
    app = os.path.join(short_tmp, "app")
    data = os.path.join(app, "data")
    os.makedirs(os.path.join(data, "run"))
    with open(os.path.join(data, "run", "api-token"), "w") as f:
        f.write("secret")
    box = sandbox.Sandbox.of(NodeConfig.model_validate({"data_dir": data}))
    for path in (data, short_tmp, os.path.join(data, "run")):
        with pytest.raises(sandbox.SandboxError, match="must never see"):
            box.wrap(["true"], {}, "s", sandbox.Policy(read_only=(path,)))
    # A program installed around the data dir (a node run from a checkout):
    # its install is shown, the data dir in it is an empty directory.
    os.makedirs(os.path.join(app, "bin"))
    tool = os.path.join(app, "bin", "tool")
    with open(tool, "w") as f:
        f.write(f"#!/bin/sh\nls -A {data}; cat {data}/run/api-token\n")
    os.chmod(tool, 0o755)
    launch = box.wrap([tool], {}, "s", sandbox.Policy())
    done = subprocess.run(launch.argv, env=launch.env, cwd=launch.cwd, capture_output=True, text=True, timeout=30)
    assert done.stdout == "" and "No such file" in done.stderr, done


def test_a_confined_servers_whole_tree_goes_with_its_stop(short_tmp):
    """A confined server that leaves a grandchild ignoring SIGTERM behind its
    stdio (tests/integration/mcp_server.py --grandchild): stop() leaves no
    process of it on the host — its pid namespace goes with it."""
    needs_bwrap()
    import asyncio
    import psutil
    from crewlet.agent.mcp import SeatServers
    from crewlet.agent.tools import Registry
    from crewlet.company.model import McpServer
    from tests.seats import MCP_SERVER

    data = os.path.join(short_tmp, "data")
    box = sandbox.Sandbox.of(NodeConfig.model_validate({"data_dir": data}))
    mark = f"test/sandbox/{os.getpid()}"

    def marked() -> list[int]:
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("CREWLET_SPAWNED_BY") == mark:
                    found.append(proc.pid)
            except psutil.Error:
                continue
        return found

    async def main():
        registry = Registry()
        servers = SeatServers("gc", [McpServer(name="t", command=sys.executable,
                                               args=[MCP_SERVER, "--grandchild", "/workspace/gc.pid"])],
                              registry, mark=mark, sandbox=box)
        await servers.start()
        status = servers.status()["t"]
        assert status["state"] == "up" and status["confined"], status
        assert "t__echo" in registry.names()
        assert os.path.exists(os.path.join(data, "workspaces", "gc", "gc.pid"))
        assert len(marked()) >= 3  # bwrap, its init, the server (and the grandchild)
        await servers.stop()
        assert marked() == []  # stop() returns once nothing of it runs, namespace and all
    asyncio.run(main())
