"""The inside wall (issue 23): a seat's own tools and agents, confined.

A real node runs a company whose seat ``mallory`` has a hostile MCP server of
its own (tests/integration/hostile_tool.py) twice — once with the host's
network, once with ``network: none`` — and whose seat ``cli-mallory``'s
provider is the same hostile program as a CLI agent. Asked to, each tries
everything the issue's probe did and more against the node that runs it;
every attempt must fail, each for the reason expected; the seats answer,
other seats go on, nothing crashes and the node says nothing above info.

Beside it, each wall on its own with real bubblewrap and real processes: a
tool's stderr is its tagged output, never a crewlet log event; a data dir
reached through links stays hidden; a path a server's arguments name is shown
read-only, nothing of /etc; an upgraded tool gets its new install; a shared
prefix (~/.cargo, ~/.local) or a checkout shows its code alone; a seat's MCP
server cannot read its CLI agent's bridge config.

Needs bubblewrap (Debian's ``bubblewrap``): without it these tests skip,
unless ``CREWLET_TEST_SANDBOX=required`` (CI sets it), which fails them.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time

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

    # What each server wrote on its stderr as it started — a forged record
    # of crewletd's, an error — is in the node's log as that server's output
    # alone, tagged with its seat and server, never an event of its own.
    from tests.integration.hostile_tool import FORGED
    events = node.events()
    assert not [e for e in events if e.get("event") == FORGED["event"] or e.get("node") == FORGED["node"]]
    said = {(e["role"], e["seat"], e["server"], e["level"]) for e in events
            if e.get("event") == "mcp_server_output" and e.get("line") == json.dumps(FORGED)}
    assert said == {("seats", "mallory", "evil", "info"), ("seats", "mallory", "offline", "info")}, said

    # The status says how the seats role itself found the sandbox: its tools run under that probe.
    box = wait_for(lambda: (node.status()["node"]["sandbox"] or {}).get("by") == "seats"
                   and node.status()["node"]["sandbox"], 10, what="the seats role's probe in the status")
    assert box == {**seats_stats(node)["sandbox"], "by": "seats"} and box["state"] == "confined", box

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
    box = wait_for(lambda: (node.status()["node"]["sandbox"] or {}).get("by") == "seats"
                   and node.status()["node"]["sandbox"], 10, what="the seats role's probe in the status")
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


# --------------------------------------------------------------------------
# What a confined tool's stderr becomes
# --------------------------------------------------------------------------

def test_a_tools_stderr_is_its_output_tagged_never_a_crewlet_event(short_tmp):
    """A confined server writes a forged crewlet log record to its stderr
    (an error of crewletd's), a known secret, an endless line and a terminal
    escape: each is an ``mcp_server_output`` event of its seat and server,
    its text a field — the forged record is never an event of its own."""
    needs_bwrap()
    import asyncio
    from crewlet import redaction
    from crewlet.agent import mcp
    from crewlet.agent.mcp import SeatServers
    from crewlet.agent.tools import Registry
    from crewlet.company.model import McpServer
    from tests.integration.hostile_tool import FORGED
    from tests.integration.test_mcp import captured_events, until

    secret = "tool-says-secret-0123456789"
    redaction.learn([secret])
    box = sandbox.Sandbox.of(NodeConfig.model_validate({"data_dir": os.path.join(short_tmp, "data")}))
    flood = [f"flood {n}" for n in range(3 * mcp.OUTPUT_LINES_PER_S)]
    said = [f"the key is {secret}", "x" * (mcp.OUTPUT_LINE_MAX * 3), "\x1b[2Jcleared", *flood]

    async def main(events):
        servers = SeatServers("mallory", [McpServer(name="evil", command=sys.executable, args=[HOSTILE],
                                                    env={"HOSTILE_STDERR": json.dumps(said)})],
                              Registry(), mark=f"test/sandbox/{os.getpid()}", sandbox=box)
        await servers.start()
        try:
            assert servers.status()["evil"]["state"] == "up", servers.status()
            return await until(lambda: len(events.named("mcp_server_output")) >= 4 and
                               events.named("mcp_server_output"), 10, "the server's stderr lines")
        finally:
            await servers.stop()

    with captured_events() as events:
        lines = asyncio.run(main(events))
        assert not events.named(FORGED["event"])
        everything = events.named("mcp_server_output")
    # A flood is bounded: what was not logged is counted (the last count as the server stops).
    logged = [e for e in everything if e["line"]]
    held_back = sum(e.get("unlogged", 0) for e in everything)
    assert held_back and len(logged) + held_back == 1 + len(said), (len(logged), held_back)
    assert all(e["seat"] == "mallory" and e["server"] == "evil" and e["level"] == "info" for e in lines), lines
    assert lines[0]["line"] == json.dumps(FORGED)
    assert lines[1]["line"] == f"the key is {redaction.REDACTED}"
    assert lines[2]["line"] == "x" * mcp.OUTPUT_LINE_MAX and lines[2]["cut"] is True
    assert lines[3]["line"] == "\\x1b[2Jcleared"


# --------------------------------------------------------------------------
# What an install shows, and what it never does
# --------------------------------------------------------------------------

def run_confined(box: sandbox.Sandbox, argv: list[str], seat: str = "s", policy=sandbox.DEFAULT_POLICY):
    import subprocess
    launch = box.wrap(argv, {}, seat, policy)
    assert launch.confined
    return subprocess.run(launch.argv, env=launch.env, cwd=launch.cwd, capture_output=True, text=True,
                          timeout=30)


def make_script(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


# A shell function the tools below use: say what reading each path did.
TRY = 'try() { if cat "$1" >/dev/null 2>&1; then echo "$1 read"; else echo "$1 refused"; fi; }\n'


def test_a_symlinked_data_dir_stays_hidden_from_a_tool(short_tmp):
    """The data dir is a link into a checkout the tool is installed from,
    and the tool is run through a link to that checkout: the data is in no
    path the tool can name — the link, its target, nor under the install's
    own linked path — while the rest of the install is there."""
    needs_bwrap()
    app = os.path.join(short_tmp, "app")
    real = os.path.join(app, "var", "data")
    os.makedirs(os.path.join(real, "run"))
    with open(os.path.join(real, "run", "api-token"), "w") as f:
        f.write("secret")
    with open(os.path.join(app, "ok.txt"), "w") as f:
        f.write("fine")
    data, applink = os.path.join(short_tmp, "data"), os.path.join(short_tmp, "applink")
    os.symlink(real, data)
    os.symlink(app, applink)
    box = sandbox.Sandbox.of(NodeConfig.model_validate({"data_dir": data}))
    assert box.hidden[0] == os.path.realpath(real)
    paths = [os.path.join(p, "run", "api-token") for p in (data, real, os.path.join(applink, "var", "data"))]
    tool = make_script(os.path.join(app, "bin", "tool"),
                       "#!/bin/sh\n" + TRY + "".join(f"try {p}\n" for p in [*paths, f"{app}/ok.txt"]))
    # Started by its own path, the install is there (ok.txt); by the link, it is
    # there under the link alone — and the data dir is nowhere either way.
    for how, ok in ((tool, "read"), (os.path.join(applink, "bin", "tool"), "refused")):
        done = run_confined(box, [how])
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [*(f"{p} refused" for p in paths), f"{app}/ok.txt {ok}"], \
            (how, done.stdout)
    # Nor by a policy's path: the link, the checkout around it, the linked checkout.
    for path in (data, app, applink):
        with pytest.raises(sandbox.SandboxError, match="must never see"):
            box.wrap(["true"], {}, "s", sandbox.Policy(read_only=(path,)))


def test_a_path_named_in_a_servers_args_is_shown_read_only_and_nothing_of_etc(short_tmp):
    """``sh /srv/tools/run.sh --conf=/etc/hostname``: the script's directory
    is there, read-only (the modules beside it); /etc/hostname is not, nor
    anything not named."""
    needs_bwrap()
    tools, other = os.path.join(short_tmp, "tools"), os.path.join(short_tmp, "other")
    for folder, name, text in ((tools, "beside.txt", "a module"), (other, "secret.txt", "not named")):
        os.makedirs(folder)
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    os.chmod(tools, 0o777)  # writable by anyone: only the read-only bind stops a write
    run = make_script(os.path.join(tools, "run.sh"), TRY + "\n".join([
        f"try {tools}/beside.txt", "try /etc/hostname", f"try {other}/secret.txt",
        f"if touch {tools}/new 2>/dev/null; then echo written; else echo read-only; fi", ""]))
    box = sandbox.Sandbox.of(NodeConfig.model_validate({"data_dir": os.path.join(short_tmp, "data")}))
    done = run_confined(box, ["sh", run, "--conf=/etc/hostname", "/etc/ssl/private"])
    assert done.stdout.split("\n")[:-1] == [f"{tools}/beside.txt read", "/etc/hostname refused",
                                            f"{other}/secret.txt refused", "read-only"], (done.stdout, done.stderr)
    assert not os.path.exists(os.path.join(tools, "new"))


def test_an_upgraded_tool_gets_its_new_install_bound(short_tmp):
    """The tool's file is replaced by one naming an interpreter installed
    elsewhere: the next start binds that install (a walk remembered from
    before would leave the new interpreter out, and the tool would not run)."""
    needs_bwrap()
    box = sandbox.Sandbox.of(NodeConfig.model_validate({"data_dir": os.path.join(short_tmp, "data")}))
    interpreters = {}
    for name in ("one", "two"):
        interpreters[name] = os.path.join(short_tmp, name, "bin", "sh")
        os.makedirs(os.path.dirname(interpreters[name]))
        os.symlink("/bin/sh", interpreters[name])
    tool = make_script(os.path.join(short_tmp, "app", "bin", "tool"), f"#!{interpreters['one']}\necho one\n")
    assert run_confined(box, [tool]).stdout == "one\n"
    make_script(tool + ".new", f"#!{interpreters['two']}\necho two\n")
    os.replace(tool + ".new", tool)  # as an upgrade writes it: a new file renamed over the old
    done = run_confined(box, [tool])
    assert done.stdout == "two\n", done.stderr


def test_a_tool_in_a_shared_prefix_or_from_a_checkout_sees_its_code_not_what_lies_beside(short_tmp, monkeypatch):
    """~/.cargo/bin/tool: not ~/.cargo/credentials.toml; ~/.local/bin/tool:
    ~/.local/lib, not ~/.local/share; a venv's editable install from a
    checkout: its package, not the checkout's .env or .git."""
    needs_bwrap()
    home = os.path.join(short_tmp, "home")
    monkeypatch.setenv("HOME", home)
    files = {".cargo/credentials.toml": "token", ".local/lib/x/data.txt": "code",
             ".local/share/keyrings/login": "secret", ".ssh/id": "key",
             "src/app/pkg/__init__.py": "", "src/app/.env": "API_KEY=x", "src/app/.git/config": "url"}
    for name, text in files.items():
        make_script(os.path.join(home, name), text)
    venv = os.path.join(short_tmp, "venv")
    site = os.path.join(venv, "lib", "python3.11", "site-packages")
    os.makedirs(site)
    with open(os.path.join(venv, "pyvenv.cfg"), "w") as f:
        f.write("home = /usr/bin\n")
    with open(os.path.join(site, "app.pth"), "w") as f:
        f.write(os.path.join(home, "src", "app") + "\n")
    body = "#!/bin/sh\n" + TRY + "".join(f"try {os.path.join(home, n)}\n" for n in files)
    box = sandbox.Sandbox.of(NodeConfig.model_validate({"data_dir": os.path.join(short_tmp, "data")}))
    readable = {}
    for where in (".cargo/bin/tool", ".local/bin/tool", "bin/tool", "tool"):
        done = run_confined(box, [make_script(os.path.join(home, where), body)])
        assert done.returncode == 0, (where, done.stderr)
        readable[where] = {os.path.relpath(line.split()[0], home) for line in done.stdout.splitlines()
                           if line.endswith(" read")}
    done = run_confined(box, [make_script(os.path.join(venv, "bin", "tool"), body)])
    readable["venv"] = {os.path.relpath(line.split()[0], home) for line in done.stdout.splitlines()
                        if line.endswith(" read")}
    assert readable == {".cargo/bin/tool": set(), ".local/bin/tool": {".local/lib/x/data.txt"},
                        "bin/tool": set(), "tool": set(), "venv": {"src/app/pkg/__init__.py"}}, readable


# --------------------------------------------------------------------------
# A CLI turn's bridge config is its agent's alone
# --------------------------------------------------------------------------

def test_a_seats_mcp_server_cannot_read_its_cli_agents_bridge_config(short_tmp):
    """While a seat's CLI agent holds its turn (and reads its bridge config
    at /run/crewlet/mcp.json), the same seat's MCP server — the same
    workspace, the same uid — finds neither that path nor the file on the
    host. The call made the seat's workspace once, and nothing of the turn
    is left set after it."""
    needs_bwrap()
    import asyncio
    import glob
    from crewlet.agent.bridge import Bridge
    from crewlet.agent.mcp import SeatServers
    from crewlet.agent.providers import make_provider
    from crewlet.agent.tools import Registry, ToolContext
    from crewlet.agent.types import Message
    from crewlet.company.model import McpServer
    from crewlet.company.model import Provider as ProviderSpec

    class Counted(sandbox.Sandbox):
        made = 0

        def workspace(self, seat):
            Counted.made += 1
            return super().workspace(seat)

    data = os.path.join(short_tmp, "data")
    box = Counted.of(NodeConfig.model_validate({"data_dir": data}))
    workspace = os.path.join(data, "workspaces", "s")
    agent = make_provider("agent", ProviderSpec.model_validate(
        {"kind": "cli", "command": [sys.executable, HOSTILE, "--hold"]}))

    async def main():
        registry = Registry()
        servers = SeatServers("s", [McpServer(name="peek", command=sys.executable, args=[HOSTILE])], registry,
                              mark=f"test/sandbox/{os.getpid()}", sandbox=box)
        bridge = Bridge()
        await bridge.start()
        await servers.start()
        try:
            assert servers.status()["peek"]["state"] == "up", servers.status()
            grant = bridge.grant(seat="s", token=1, trigger="t", registry=registry, services=None,
                                 fence=lambda: True, deadline=None)
            Counted.made = 0
            with sandbox.turn(sandbox.Seat(box, "s", grant=grant)):
                call = asyncio.create_task(agent.complete("", [Message("user", "hold")], [],
                                                          deadline=time.monotonic() + 60))
            assert sandbox.SEAT.get() is None
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(workspace, "held")):
                assert time.monotonic() < deadline and not call.done(), call.done() and call.result()
                await asyncio.sleep(0.02)
            written = glob.glob(os.path.join(data, "run", "grants", "*.json"))
            assert len(written) == 1
            ctx = ToolContext(seat="s", trigger="t", token=1, call_key="t.0", services=None)
            text, error = await registry.call(ctx, "peek__peek_at", {"paths": json.dumps(
                [sandbox.BRIDGE_CONFIG, written[0], os.path.dirname(written[0]), f"{sandbox.WORKSPACE}/held"])})
            assert not error, text
            with open(os.path.join(workspace, "release"), "w"):
                pass
            reply = await asyncio.wait_for(call, 30)
            bridge.revoke(grant)
            assert not os.path.exists(written[0])
            return json.loads(text), json.loads(reply.text)
        finally:
            await servers.stop()
            await bridge.close()

    seen, said = asyncio.run(main())
    assert said == {"config": sandbox.BRIDGE_CONFIG, "read": True}  # the agent's own, in its sandbox
    held = f"{sandbox.WORKSPACE}/held"  # the workspace both share: there
    assert seen == {sandbox.BRIDGE_CONFIG: "ENOENT", held: "read",
                    **{p: "ENOENT" for p in seen if p not in (sandbox.BRIDGE_CONFIG, held)}}, seen
    assert Counted.made == 1
