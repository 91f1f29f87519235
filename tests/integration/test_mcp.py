"""A seat's MCP servers as real processes: tools in the registry, crashes,
restarts with backoff, and nothing left running after a stop — grandchildren
included. Also the spawn janitor, on real process trees."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil

from crewlet import log
from crewlet.agent.janitor import SPAWNED_BY, kill_marked
from crewlet.agent.mcp import SeatServers
from crewlet.agent.tools import Registry, ToolContext, builtin_tools
from crewlet.company.model import McpServer
from tests.conftest import alive, wait_for

SERVER = os.path.join(os.path.dirname(__file__), "mcp_server.py")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def server_spec(name: str = "t", *args: str) -> McpServer:
    return McpServer(name=name, command=sys.executable, args=[SERVER, *args])


def ctx(seat: str = "s1", key: str = "trig.0.0") -> ToolContext:
    return ToolContext(seat=seat, trigger="trig", token=1, call_key=key, services=None)


class Events:
    """This process's log events, captured as parsed records."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def write(self, line: str) -> None:
        for part in line.splitlines():
            if part.strip():
                self.records.append(json.loads(part))

    def flush(self) -> None:
        pass

    def named(self, name: str, **match) -> list[dict]:
        return [r for r in self.records
                if r["event"] == name and all(r.get(k) == v for k, v in match.items())]


@contextlib.contextmanager
def captured_events():
    events = Events()
    log.configure(node="t1", role="seats", fmt="json", stream=events)
    try:
        yield events
    finally:
        log.configure(node=None, role="crewlet", fmt="json", stream=sys.stdout)


async def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
    return value


def read_pid(path: str) -> int:
    return wait_for(lambda: os.path.exists(path) and int(open(path).read()), 10, what=f"pid in {path}")


def marked_running(mark: str) -> list[int]:
    """Processes that carry the mark and are not dead (zombies are dead)."""
    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get(SPAWNED_BY) == mark:
                out.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def test_tools_join_the_registry_and_stop_leaves_no_process_not_even_a_grandchild(short_tmp):
    mark = f"test-{uuid.uuid4().hex[:8]}"
    pidfile = os.path.join(short_tmp, "grandchild.pid")

    async def main():
        registry = Registry()
        for tool in builtin_tools():
            registry.add(tool)
        servers = SeatServers("s1", [server_spec("t", "--grandchild", pidfile)], registry, mark=mark)
        await servers.start()
        st = servers.status()["t"]
        assert st["state"] == "up" and st["restarts"] == 0 and st["last_error"] is None
        pid = st["pid"]
        assert st["pgid"] == pid == os.getpgid(pid) and pid != os.getpgid(0)  # a group of its own
        assert sorted(st["tools"]) == ["t__add", "t__crash", "t__echo", "t__fail", "t__nap"]
        assert registry.names() == ["notify", "send", "t__add", "t__crash", "t__echo", "t__fail", "t__nap"]
        add = {s.name: s for s in registry.specs()}["t__add"]
        assert add.description == "The sum of a and b."
        assert add.parameters["type"] == "object" and sorted(add.parameters["required"]) == ["a", "b"]
        assert add.parameters["properties"]["a"]["type"] == "integer"

        # The server's environment says who spawned it; its grandchild inherits it.
        grandchild = read_pid(pidfile)
        assert alive(grandchild) and os.getpgid(grandchild) == pid
        env = psutil.Process(grandchild).environ()
        assert env[SPAWNED_BY] == mark and env["CREWLET_SEAT"] == "s1"

        assert await registry.call(ctx(), "t__echo", {"text": "hi there"}) == ("hi there", False)
        assert await registry.call(ctx(), "t__add", {"a": 2, "b": 40}) == ("42", False)
        text, error = await registry.call(ctx(), "t__fail", {})
        assert error and "always fails" in text
        text, error = await registry.call(ctx(), "t__add", {"a": "two", "b": 1})
        assert error and "invalid arguments for t__add" in text  # the schema, before the server

        await servers.stop()
        # The promise of stop(): when it returns, nothing of the group runs.
        assert not alive(pid) and not alive(grandchild)
        assert marked_running(mark) == []
        assert registry.names() == ["notify", "send"]
        assert servers.status()["t"]["state"] == "stopped"
        assert await registry.call(ctx(), "t__echo", {"text": "x"}) == \
            ("unknown tool 't__echo'; tools: notify, send", True)

        # The seat claimed again: the same servers start afresh.
        await servers.start()
        assert servers.status()["t"]["state"] == "up"
        assert await registry.call(ctx(), "t__echo", {"text": "back"}) == ("back", False)
        await servers.stop()
        assert marked_running(mark) == []

    try:
        run(main())
    finally:
        kill_marked(mark)


def test_a_crash_is_reported_its_grandchild_killed_and_the_server_restarted_after_a_backoff(short_tmp):
    mark = f"test-{uuid.uuid4().hex[:8]}"
    pidfile = os.path.join(short_tmp, "grandchild.pid")

    async def main(events: Events):
        registry = Registry()
        servers = SeatServers("s1", [server_spec("t", "--grandchild", pidfile)], registry, mark=mark,
                              backoff_min=0.3, backoff_max=1.0)
        await servers.start()
        assert servers.status()["t"]["state"] == "up", events.records
        first = servers.status()["t"]["pid"]
        grandchild = read_pid(pidfile)
        os.unlink(pidfile)

        # The server dies mid-call: the call is an error result, not a hang.
        text, error = await asyncio.wait_for(registry.call(ctx(), "t__crash", {}), 10)
        assert error and text == "mcp server t is down"

        exited = await until(lambda: events.named("mcp_server_exited", server="t"), 10, "the exit event")
        assert exited[0]["code"] == 3 and exited[0]["restarts"] == 0 and exited[0]["seat"] == "s1"
        assert exited[0]["level"] == "warning"
        # A grandchild that ignores SIGTERM and holds the pipes does not outlive its server.
        assert not alive(grandchild)

        await until(lambda: servers.status()["t"]["state"] == "up", 15, "the restart")
        st = servers.status()["t"]
        assert st["restarts"] == 1 and st["pid"] != first and st["last_error"] == "exited with code 3"
        assert sorted(st["tools"]) == ["t__add", "t__crash", "t__echo", "t__fail", "t__nap"]
        started = events.named("mcp_server_started", server="t")
        assert [e["restarts"] for e in started] == [0, 1]
        assert started[1]["ts"] - exited[0]["ts"] >= 0.3 - 0.01  # the backoff was waited out
        assert await registry.call(ctx(), "t__echo", {"text": "again"}) == ("again", False)

        second_grandchild = read_pid(pidfile)
        await servers.stop()
        assert not alive(st["pid"]) and not alive(second_grandchild) and marked_running(mark) == []

    try:
        with captured_events() as events:
            run(main(events))
    finally:
        kill_marked(mark)


def test_servers_that_cannot_start_back_off_report_why_and_still_stop(short_tmp):
    mark = f"test-{uuid.uuid4().hex[:8]}"

    async def main(events: Events):
        registry = Registry()
        servers = SeatServers(
            "s1",
            [McpServer(name="missing", command="/nonexistent/crewlet-mcp-server"),
             McpServer(name="quits", command=sys.executable, args=["-c", "import sys; sys.exit(4)"]),
             McpServer(name="mute", command="sleep", args=["300"])],  # never answers initialize
            registry, mark=mark, start_timeout=1.0, backoff_min=0.05, backoff_max=0.2)
        t0 = time.monotonic()
        await servers.start()
        assert time.monotonic() - t0 < 10
        st = servers.status()
        assert st["missing"]["state"] in ("backoff", "starting")
        assert "No such file" in st["missing"]["last_error"]
        assert st["quits"]["last_error"] and st["quits"]["state"] in ("backoff", "starting")
        assert st["mute"]["last_error"] == "RuntimeError: not up within 1s"
        assert registry.names() == []

        # It keeps trying, each pause twice the last, up to backoff_max.
        await until(lambda: len(events.named("mcp_server_failed", server="missing")) >= 4, 10,
                    "four failed starts")
        pauses = [e["retry_in"] for e in events.named("mcp_server_failed", server="missing")][:4]
        assert pauses == [0.05, 0.1, 0.2, 0.2]
        assert servers.status()["missing"]["restarts"] >= 3

        t0 = time.monotonic()
        await servers.stop()
        assert time.monotonic() - t0 < 10
        assert {s["state"] for s in servers.status().values()} == {"stopped"}
        assert marked_running(mark) == []

    try:
        with captured_events() as events:
            run(main(events))
    finally:
        kill_marked(mark)


def _exec_done(popen: subprocess.Popen) -> list[int] | None:
    """The pids of *popen*'s tree (itself, and under ``sh`` its two sleeps) once
    each has finished exec: a process mid-exec shows no environment yet."""
    try:
        root = psutil.Process(popen.pid)
        tree = [root, *root.children()]
        names = [p.cmdline()[:1] for p in tree]
    except psutil.NoSuchProcess:
        return None
    want = [["sh"], ["sleep"], ["sleep"]] if popen.args[0] == "sh" else [["sleep"]]
    return [p.pid for p in tree] if names == want else None


def test_kill_marked_kills_marked_process_trees_and_leaves_the_rest_alone():
    mark = f"test-{uuid.uuid4().hex[:8]}"
    tree = "sleep 300 & sleep 300 & wait"
    marked = {**os.environ, SPAWNED_BY: mark}
    procs = [
        # A marked tree in its own group, as MCP servers run.
        subprocess.Popen(["sh", "-c", tree], env=marked, start_new_session=True),
        # A marked process in our own group: killed alone, the group (us) spared.
        subprocess.Popen(["sleep", "300"], env=marked),
        # Somebody else's tree: another mark, and none.
        subprocess.Popen(["sh", "-c", tree], env={**os.environ, SPAWNED_BY: mark + "-other"},
                         start_new_session=True),
        subprocess.Popen(["sh", "-c", tree], env={k: v for k, v in os.environ.items() if k != SPAWNED_BY},
                         start_new_session=True),
    ]
    try:
        trees = [wait_for(lambda p=p: _exec_done(p), 10, what="the tree's processes") for p in procs]
        killed = kill_marked(mark)
        assert sorted(killed) == sorted(trees[0] + trees[1])
        wait_for(lambda: not any(alive(pid) for pid in trees[0] + trees[1]), 10, what="the marked to die")
        assert all(alive(pid) for pid in trees[2] + trees[3])
        assert procs[0].wait(5) == -signal.SIGKILL and procs[1].wait(5) == -signal.SIGKILL
        assert kill_marked(mark) == []
    finally:
        for p in procs[2:]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.kill()
            p.wait(10)
