"""The pure parts of the supervisor: exit meanings, specs, backoff, state moves."""

from __future__ import annotations

import os
import signal

import pytest

from supervisor import spec as S
from supervisor import states
from supervisor.procs import ExitInfo


def _status(code: int | None = None, sig: int | None = None) -> int:
    # Build raw wait statuses the way the kernel encodes them.
    return (code << 8) if sig is None else sig


@pytest.mark.parametrize("status, code, sig, reason", [
    (_status(0), 0, None, "exit 0"),
    (_status(1), 1, None, "exit 1"),
    (_status(75), 75, None, "wedged event loop"),
    (_status(78), 78, None, "bad configuration"),
    (_status(sig=9), None, 9, "signal 9 (SIGKILL)"),
    (_status(sig=15), None, 15, "signal 15 (SIGTERM)"),
])
def test_exit_info_reads_wait_statuses(status, code, sig, reason):
    info = ExitInfo.from_status(status)
    assert (info.code, info.signal, info.reason) == (code, sig, reason)
    assert os.WIFSIGNALED(status) == (sig is not None)


def test_supervisor_kill_reason_overrides_the_bare_signal():
    info = ExitInfo.from_status(_status(sig=signal.SIGKILL), "killed: no heartbeat")
    assert info.signal == 9 and info.reason == "killed: no heartbeat" and not info.normal


def test_only_exit_0_is_normal():
    assert ExitInfo(0, None, "").normal
    assert not ExitInfo(3, None, "").normal
    assert not ExitInfo(None, 15, "").normal


def test_backoff_first_restart_immediate_then_exponential_and_capped():
    flags = S.SupFlags(backoff_min=0.1, backoff_max=1.0)
    assert [flags.backoff(n) for n in range(1, 7)] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.0]


def test_specs_refuse_what_otp_refuses():
    async def start(i):  # pragma: no cover - never called
        raise AssertionError
    with pytest.raises(ValueError, match="permanent child cannot be significant"):
        S.ChildSpec("a", start, restart=S.PERMANENT, significant=True)
    with pytest.raises(ValueError):
        S.ChildSpec("a", start, restart="sometimes")
    with pytest.raises(ValueError):
        S.ChildSpec("a", start, shutdown="later")
    with pytest.raises(ValueError):
        S.SupFlags(strategy="all_for_none")
    with pytest.raises(ValueError):
        S.SupFlags(auto_shutdown="maybe")


def test_state_moves_are_guarded():
    states.check("a", states.STOPPED, states.STARTING)
    states.check("a", states.RUNNING, states.EXITED)
    with pytest.raises(states.BadTransition):
        states.check("a", states.STOPPED, states.RUNNING)
    with pytest.raises(states.BadTransition):
        states.check("a", states.RUNNING, states.BACKOFF)
    # Every state can be left somehow, and every target is a known state.
    known = set(states.TRANSITIONS)
    for old, targets in states.TRANSITIONS.items():
        assert targets and targets <= known, old


# ------------------------------------------------------------ task children

def _stop_task_child(body, shutdown, teardown=None):
    """Start a task child running *body*, stop it with *shutdown*: (ExitInfo, seconds)."""
    import asyncio
    import time

    from crewlet.runtime import run_loop
    from supervisor.task import task_child

    async def main():
        async def setup():
            pass
        child = task_child("t", setup=setup, run=body, teardown=teardown, ready_timeout=1,
                           shutdown=shutdown)
        running = await child.start(1)
        await asyncio.sleep(0.05)  # let run() get going
        started = time.monotonic()
        info = await running.stop(shutdown)
        return info, time.monotonic() - started
    return run_loop(main(), leftovers=0.2)


async def _stubborn():
    """A task child's run() that swallows every cancel: what a buggy retry
    loop (or Python 3.11's wait_for) can do."""
    import asyncio
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass


def test_a_task_child_that_swallows_its_cancel_is_still_stopped_within_its_shutdown():
    torn_down = []

    async def teardown():
        torn_down.append(True)

    info, took = _stop_task_child(_stubborn, 0.4, teardown)
    assert info.code == 0
    assert took < 1.0, took
    assert torn_down == [True]  # the teardown still ran, in the time left


def test_a_task_child_whose_teardown_hangs_is_stopped_within_its_shutdown():
    import asyncio

    async def body():
        await asyncio.sleep(3600)

    async def hangs():
        await asyncio.sleep(3600)

    info, took = _stop_task_child(body, 0.4, hangs)
    assert info.code == 0 and took < 1.0, took


def test_a_task_child_that_stops_at_once_takes_no_time():
    import asyncio

    async def body():
        await asyncio.sleep(3600)

    info, took = _stop_task_child(body, 30)
    assert info.code == 0 and took < 0.5, took


def test_a_task_child_is_torn_down_once_even_when_run_ends_by_itself_after_its_cancel():
    import asyncio
    torn_down = []

    async def raises_late():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            raise RuntimeError("cleanup failed")  # ends by itself: its own teardown path runs too

    async def teardown():
        torn_down.append(True)
        await asyncio.sleep(0.1)

    info, took = _stop_task_child(raises_late, 2.0, teardown)
    assert torn_down == [True], torn_down
    assert took < 1.5


def test_brutal_kill_of_a_task_child_waits_for_nothing_but_still_tears_it_down():
    from supervisor import spec as S
    torn_down = []

    async def teardown():
        torn_down.append(True)

    info, took = _stop_task_child(_stubborn, S.BRUTAL_KILL, teardown)
    assert torn_down == [True] and took < 0.5, (torn_down, took)


def test_a_start_abandoned_by_a_stop_leaves_nothing_running_even_if_it_swallowed_its_cancel():
    """The start finishes despite its cancel (as 3.11's wait_for may let it):
    the child it started is stopped, not left running unsupervised."""
    import asyncio

    from crewlet.runtime import run_loop
    from supervisor.spec import ChildSpec
    from supervisor.supervisor import Supervisor
    from supervisor.task import TaskRunning

    ran: list[str] = []

    async def body():
        ran.append("run")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ran.append("cancelled")
            raise

    async def start(incarnation):
        try:
            await asyncio.sleep(0.3)
        except asyncio.CancelledError:
            pass  # swallowed: the start goes on and returns a running child
        return TaskRunning(asyncio.get_running_loop().create_task(body()), None)

    async def main():
        sup = Supervisor("s", S.SupFlags(), [ChildSpec("t", start, shutdown=1)],
                         notify=lambda *a, **k: None)
        starting = asyncio.create_task(sup.start())
        await asyncio.sleep(0.05)
        await asyncio.wait_for(sup.stop(), 5)
        await asyncio.gather(starting, return_exceptions=True)
        await asyncio.sleep(0.05)
        return list(ran)  # before the loop's own end cancels whatever is left

    assert run_loop(main(), leftovers=0.2) == ["run", "cancelled"]


def test_the_company_is_answered_without_its_seats_to_a_role_that_has_its_epoch():
    """Roles re-ask every COMPANY_RECHECK seconds; 10,000 seats are ~25 MB each time."""
    import asyncio
    from types import SimpleNamespace

    from supervisor import control
    current = {"rev": 3, "epoch": 5, "digest": "d", "company": {"seats": ["…"]}}
    node = SimpleNamespace(fleet=SimpleNamespace(company=current))
    ask = lambda **args: asyncio.run(control.company(node, args))["company"]  # noqa: E731
    assert ask() == current and ask(epoch=None) == current and ask(epoch=4) == current
    assert ask(epoch=5) == {"rev": 3, "epoch": 5, "digest": "d"}
    assert asyncio.run(control.company(SimpleNamespace(fleet=None), {"epoch": 5})) == {"company": None}
