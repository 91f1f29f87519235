"""Supervisor semantics with real forked processes, modelled on OTP's supervisor suite.

Each test drives a :class:`Supervisor` in this process; its children are forked
from a real zygote (preloading ``tests.integration.kids``) and report on a real
``health`` socket. Deaths are real signals.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import time

import psutil
import pytest
import zmq.asyncio

from crewlet import log
from supervisor import spec as S
from supervisor.process import FORWARD_EVERY, ProcessHost, process_child
from supervisor.spec import StartFailed, SupFlags
from supervisor.supervisor import Supervisor, nested
from supervisor.zygote import Zygote

KIDS = "tests.integration.kids:serve"


class Harness:
    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.zygote = Zygote(title="test zygote", preload=("tests.integration.kids",))
        self.ctx = zmq.asyncio.Context()
        self.host = ProcessHost(run_dir, self.zygote, self.ctx)
        self.events: list[tuple[str, dict]] = []

    def notify(self, name: str, level: str = "info", **fields) -> None:
        self.events.append((name, fields))

    def kid(self, name: str, *, ready_timeout: float = 5.0, heartbeat_silence: float | None = None,
            kid: dict | None = None, **spec) -> S.ChildSpec:
        return process_child(self.host, name, target=KIDS,
                             kwargs={"run_dir": self.run_dir, "name": name, **(kid or {})},
                             title=f"kid {name}", ready_timeout=ready_timeout,
                             heartbeat_silence=heartbeat_silence, **spec)

    def sup(self, name: str, children, **flags) -> Supervisor:
        return Supervisor(name, SupFlags(**flags), children, notify=self.notify)


def run(run_dir: str, scenario) -> None:
    """Run ``scenario(harness)`` on a fresh loop; always tear everything down."""
    async def main():
        h = Harness(run_dir)
        await h.host.open()
        try:
            await asyncio.wait_for(scenario(h), 60)
        finally:
            h.host.close()
            await h.zygote.aclose()
            h.ctx.term()
    asyncio.run(main())


def pids(sup: Supervisor) -> dict[str, int | None]:
    return {c["name"]: c["pid"] for c in sup.children() if c["type"] == S.WORKER}


def child(sup: Supervisor, name: str) -> dict:
    return next((c for c in sup.children() if c["name"] == name),
                {"name": name, "state": None, "pid": None})


async def until(predicate, timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
    return value


def _pid_titled(parent: int, title: str) -> int | None:
    """The child of *parent* whose process title is *title*."""
    for proc in psutil.Process(parent).children():
        try:
            if proc.cmdline()[:1] == [title]:
                return proc.pid
        except psutil.Error:
            pass
    return None


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def restarted(sup: Supervisor, name: str, old_pid: int) -> int:
    return await until(lambda: (c := child(sup, name))["state"] == "running"
                       and c["pid"] != old_pid and c["pid"], what=f"{name} restarted")


# ---------------------------------------------------------------- restart types

def test_permanent_child_is_restarted_after_any_exit(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a")], intensity=5, period=10)
        await sup.start()
        first = pids(sup)["a"]
        os.kill(first, signal.SIGKILL)
        second = await restarted(sup, "a", first)
        assert child(sup, "a")["last_exit"]["signal"] == signal.SIGKILL
        os.kill(second, signal.SIGUSR1)  # a normal exit nobody asked for
        third = await restarted(sup, "a", second)
        assert child(sup, "a")["last_exit"]["code"] == 0
        assert child(sup, "a")["restarts"] == 2
        await sup.stop()
        assert gone(third)
    run(short_tmp, scenario)


def test_transient_child_restarted_only_after_abnormal_exit(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a", restart=S.TRANSIENT)], intensity=5, period=10)
        await sup.start()
        first = pids(sup)["a"]
        os.kill(first, signal.SIGUSR2)  # exit 3
        second = await restarted(sup, "a", first)
        assert child(sup, "a")["last_exit"]["reason"] == "exit 3"
        os.kill(second, signal.SIGUSR1)  # exit 0: done, stays down
        await until(lambda: child(sup, "a")["state"] == "stopped", what="a stopped")
        assert child(sup, "a")["pid"] is None and child(sup, "a")["restarts"] == 1
        assert not sup.exited.done()
        await sup.stop()
    run(short_tmp, scenario)


def test_temporary_child_is_never_restarted(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a", restart=S.TEMPORARY), h.kid("b")], intensity=5, period=10)
        await sup.start()
        os.kill(pids(sup)["a"], signal.SIGKILL)
        await until(lambda: child(sup, "a")["state"] == "stopped", what="a stopped")
        assert child(sup, "a")["restarts"] == 0
        assert child(sup, "b")["state"] == "running"
        await sup.stop()
    run(short_tmp, scenario)


# ------------------------------------------------------------------- strategies

def test_one_for_one_restarts_only_the_dead_child(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a"), h.kid("b"), h.kid("c")], intensity=5, period=10)
        await sup.start()
        before = pids(sup)
        os.kill(before["b"], signal.SIGKILL)
        await restarted(sup, "b", before["b"])
        after = pids(sup)
        assert after["a"] == before["a"] and after["c"] == before["c"]
        await sup.stop()
    run(short_tmp, scenario)


def test_one_for_all_restarts_every_child(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a"), h.kid("b"), h.kid("c")], strategy=S.ONE_FOR_ALL,
                    intensity=5, period=10)
        await sup.start()
        before = pids(sup)
        os.kill(before["b"], signal.SIGKILL)
        for name in "abc":
            await restarted(sup, name, before[name])
        assert all(gone(pid) for pid in before.values())
        await sup.stop()
    run(short_tmp, scenario)


def test_rest_for_one_restarts_the_dead_child_and_those_after_it(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a"), h.kid("b"), h.kid("c")], strategy=S.REST_FOR_ONE,
                    intensity=5, period=10)
        await sup.start()
        before = pids(sup)
        os.kill(before["b"], signal.SIGKILL)
        await restarted(sup, "b", before["b"])
        await restarted(sup, "c", before["c"])
        assert pids(sup)["a"] == before["a"]
        await sup.stop()
    run(short_tmp, scenario)


# ------------------------------------------------ intensity, backoff, escalation

def test_intensity_exceeded_stops_children_and_gives_up(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a"), h.kid("b")], intensity=2, period=30)
        await sup.start()
        for _ in range(2):
            old = pids(sup)["a"]
            os.kill(old, signal.SIGKILL)
            await restarted(sup, "a", old)
        b = pids(sup)["b"]
        os.kill(pids(sup)["a"], signal.SIGKILL)  # the third within the period
        info = await asyncio.wait_for(sup.exited, 10)
        assert info.code == 69 and "intensity" in info.reason
        assert gone(b), "a supervisor that gives up stops its other children"
        assert any(name == "supervisor_gave_up" for name, _ in h.events)
    run(short_tmp, scenario)


def test_backoff_delays_consecutive_restarts(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a")], intensity=10, period=30, backoff_min=0.4,
                    backoff_max=1.0, stable_after=30)
        await sup.start()
        first = pids(sup)["a"]
        t0 = time.monotonic()
        os.kill(first, signal.SIGKILL)
        second = await restarted(sup, "a", first)
        immediate = time.monotonic() - t0
        t1 = time.monotonic()
        os.kill(second, signal.SIGKILL)
        await until(lambda: child(sup, "a")["state"] == "backoff", what="backoff state")
        await restarted(sup, "a", second)
        delayed = time.monotonic() - t1
        assert delayed >= 0.4, f"second restart in a row waited only {delayed:.3f}s"
        assert immediate < delayed
        await sup.stop()
    run(short_tmp, scenario)


def test_nested_supervisor_escalates_to_its_parent(short_tmp):
    async def scenario(h: Harness):
        inner_pids: list[dict] = []

        def inner() -> Supervisor:
            return h.sup("inner", [h.kid("x"), h.kid("y")], intensity=0, period=10)

        root = h.sup("root", [h.kid("first"), nested("inner", inner)],
                     strategy=S.REST_FOR_ONE, intensity=3, period=10)
        await root.start()
        before = pids(root)
        inner_pids.append(before)
        os.kill(before["x"], signal.SIGKILL)  # inner has intensity 0: it gives up at once
        await restarted(root, "x", before["x"])
        await restarted(root, "y", before["y"])
        assert pids(root)["first"] == before["first"], "rest_for_one spares children before"
        assert child(root, "inner")["restarts"] == 1
        await root.stop()
        assert all(gone(pid) for pid in pids(root).values() if pid) and all(
            gone(pid) for pid in before.values())
    run(short_tmp, scenario)


def test_auto_shutdown_any_significant(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a"), h.kid("job", restart=S.TRANSIENT, significant=True)],
                    intensity=5, period=10, auto_shutdown=S.ANY_SIGNIFICANT)
        await sup.start()
        a = pids(sup)["a"]
        os.kill(pids(sup)["job"], signal.SIGUSR1)  # the significant child is done
        info = await asyncio.wait_for(sup.exited, 10)
        assert info.code == 0 and "auto_shutdown" in info.reason
        assert gone(a)
    run(short_tmp, scenario)


def test_exit_78_is_never_restarted_and_ends_the_supervisor(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a"), h.kid("conf", kid={"usr2_code": 78})],
                    intensity=5, period=10)
        await sup.start()
        a = pids(sup)["a"]
        os.kill(pids(sup)["conf"], signal.SIGUSR2)  # exit 78: bad configuration
        info = await asyncio.wait_for(sup.exited, 10)
        assert info.code == 78 and "bad configuration" in info.reason
        assert child(sup, "conf")["state"] == "fatal" and child(sup, "conf")["restarts"] == 0
        assert gone(a)
    run(short_tmp, scenario)


# --------------------------------------------------------- start, stop, shutdown

def test_start_is_ordered_and_waits_for_ready(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("slow", kid={"ready_after": 0.3}), h.kid("next")],
                    intensity=1, period=10)
        t0 = time.monotonic()
        await sup.start()
        assert time.monotonic() - t0 >= 0.3
        slow, nxt = child(sup, "slow"), child(sup, "next")
        assert slow["started_at"] <= nxt["started_at"]
        stopped = []
        h.events.clear()
        await sup.stop()
        stopped = [f["child"] for name, f in h.events if name == "child_stopped"]
        assert stopped == ["next", "slow"], "stop runs in reverse start order"
    run(short_tmp, scenario)


def test_child_never_ready_fails_the_start(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("ok"), h.kid("mute", ready_timeout=0.5,
                                             kid={"report_ready": False})], intensity=1, period=10)
        with pytest.raises(StartFailed) as err:
            await sup.start()
        assert "not ready within 0.5s" in str(err.value)
        assert all(c["pid"] is None for c in sup.children())
    run(short_tmp, scenario)


def test_child_ignoring_sigterm_is_killed_after_its_shutdown_timeout(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("stubborn", shutdown=0.5, kid={"ignore_term": True})],
                    intensity=1, period=10)
        await sup.start()
        pid = pids(sup)["stubborn"]
        t0 = time.monotonic()
        await sup.stop()
        took = time.monotonic() - t0
        assert 0.5 <= took < 5
        assert gone(pid)
        last = child(sup, "stubborn")["last_exit"]
        assert last["signal"] == signal.SIGKILL and "did not stop within 0.5s" in last["reason"]
    run(short_tmp, scenario)


def test_a_shutdown_timeout_names_what_the_child_said_it_was_still_doing(short_tmp):
    doing = ["workers goodbye: publish client.py:208 < release lease.py:251"]

    async def scenario(h: Harness):
        h.host.notify = h.notify  # the host's own events (shutdown_timeout) too
        sup = h.sup("s", [h.kid("stuck", shutdown=1.0, heartbeat_silence=5.0,
                                kid={"ignore_term": True, "heartbeat": 0.05, "overdue": doing})],
                    intensity=1, period=10)
        await sup.start()
        await sup.stop()
        [timeout] = [f for name, f in h.events if name == "shutdown_timeout"]
        assert timeout["child"] == "stuck" and timeout["doing"] == doing
        assert h.host.doing == {}  # forgotten with the child
    run(short_tmp, scenario)


def test_brutal_kill_does_not_wait(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a", shutdown=S.BRUTAL_KILL, kid={"ignore_term": True})],
                    intensity=1, period=10)
        await sup.start()
        await sup.stop()
        assert child(sup, "a")["last_exit"]["reason"] == "killed: brutal_kill"
    run(short_tmp, scenario)


def test_silent_child_is_killed_for_lost_heartbeat(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a", heartbeat_silence=0.5, kid={"heartbeat": 0.05, "beats": 5})],
                    intensity=5, period=10)
        await sup.start()
        first = pids(sup)["a"]
        await restarted(sup, "a", first)
        assert gone(first)
        assert child(sup, "a")["last_exit"]["reason"] == "killed: no heartbeat"
        await sup.stop()
    run(short_tmp, scenario)


# ------------------------------------------------------------ failure handling

def test_backoff_after_a_long_stable_run_still_grows(short_tmp):
    """A child that ran stably, then keeps failing to start, must back off
    rather than be restarted in a tight loop until intensity runs out."""
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a", kid={"fail_from": 1})], intensity=4, period=30,
                    backoff_min=0.1, backoff_max=1.0, stable_after=0.2)
        await sup.start()
        first = pids(sup)["a"]
        await asyncio.sleep(0.3)  # a stable run: longer than stable_after
        t0 = time.monotonic()
        os.kill(first, signal.SIGKILL)
        info = await asyncio.wait_for(sup.exited, 20)
        took = time.monotonic() - t0
        assert info.code == 69
        delays = [f["delay_s"] for name, f in h.events if name == "child_backoff"]
        assert delays == [0.1, 0.2, 0.4], delays
        assert took >= 0.7
    run(short_tmp, scenario)


def test_a_busy_loop_does_not_lose_an_early_ready(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a", ready_timeout=3)], intensity=1, period=10)
        starting = asyncio.create_task(sup.start())
        await asyncio.sleep(0)        # the fork request goes out
        time.sleep(0.3)               # our loop stalls while the child starts and reports
        await asyncio.wait_for(starting, 2)
        assert child(sup, "a")["state"] == "running"
        await sup.stop()
    run(short_tmp, scenario)


def test_a_garbage_health_frame_does_not_deafen_the_supervisor(short_tmp):
    async def scenario(h: Harness):
        from crewlet import ipc
        push = h.ctx.socket(zmq.PUSH)
        push.connect(ipc.endpoint(h.run_dir, "health"))
        await push.send(b"\xc1 not msgpack")
        await push.send(b"\x93\x01\x02\x03")  # msgpack, but not a map
        sup = h.sup("s", [h.kid("a", heartbeat_silence=0.5, kid={"heartbeat": 0.05})],
                    intensity=1, period=10)
        await sup.start()
        pid = pids(sup)["a"]
        await asyncio.sleep(1.0)  # twice the silence: heartbeats must be getting through
        assert pids(sup)["a"] == pid and child(sup, "a")["restarts"] == 0
        push.close()
        await sup.stop()
    run(short_tmp, scenario)


def test_any_start_error_is_a_failed_start_not_a_hang(short_tmp):
    async def scenario(h: Harness):
        async def broken(incarnation: int):
            raise RuntimeError("no file descriptors left")
        sup = h.sup("s", [S.ChildSpec("broken", broken)], intensity=1, period=10)
        with pytest.raises(StartFailed, match="start error: RuntimeError: no file descriptors"):
            await asyncio.wait_for(sup.start(), 5)
        assert child(sup, "broken")["state"] == "exited"
    run(short_tmp, scenario)


def test_cancelling_a_start_stops_the_child_being_started(short_tmp):
    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a"), h.kid("slow", ready_timeout=30, kid={"ready_after": 20})],
                    intensity=1, period=10)
        starting = asyncio.create_task(sup.start())
        await until(lambda: child(sup, "a")["state"] == "running", what="a running")
        a = pids(sup)["a"]
        slow = await until(lambda: _pid_titled(h.zygote.pid, "kid slow"), what="slow forked")
        t0 = time.monotonic()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert time.monotonic() - t0 < 5
        assert gone(a) and gone(slow)
        assert (await sup.exited).reason == "stopped while starting"
        assert [c["state"] for c in sup.children()] == ["stopped", "stopped"]
    run(short_tmp, scenario)


# ---------------------------------------------------------------- output

def test_a_childs_output_is_forwarded_whole_in_order_and_soon(short_tmp):
    # 20,000 lines (~1.3 MB) in one burst: more than the pipe holds while it is
    # left alone between batches. Every line arrives, in order; a line after a
    # quiet spell arrives at once (within a batch's rest), not a period later.
    out = io.StringIO()
    log.configure(node="t", role="crewletd", fmt="json", stream=out)
    lines = 20_000

    def forwarded(event: str) -> list[dict]:
        return [r for r in map(json.loads, out.getvalue().splitlines()) if r.get("event") == event]

    async def scenario(h: Harness):
        sup = h.sup("s", [h.kid("a", kid={"lines": lines, "quiet": 1.0})])
        await sup.start()
        await until(lambda: len(forwarded("kid_line")) == lines, 20, "every line forwarded")
        assert [r["n"] for r in forwarded("kid_line")] == list(range(lines))
        late = await until(lambda: forwarded("kid_late"), 5, "the late line forwarded")
        seen = time.time()
        assert seen - late[0]["ts"] < FORWARD_EVERY + 0.5
        await sup.stop()
    try:
        run(short_tmp, scenario)
    finally:
        log.configure(node=None, role="crewlet", fmt="json")
