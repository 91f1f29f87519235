"""Worker children that are tasks on the supervising process's own loop.

Some of a node's work belongs in crewletd itself — its presence in the fleet
is the node's, not any role's — yet should be supervised like any child:
started in order, restarted per its spec, its failure counted toward restart
intensity. :func:`task_child` makes such a child from two coroutines:

* ``setup()`` runs to completion before the child counts as started (its
  *ready*); raising fails the start;
* ``run()`` is the child's life; returning is a normal exit (code 0), raising
  is a crash (code 1, reason the exception), and :class:`Exit` ends it with a
  code of its choosing — ``Exit(78, why)`` for a configuration problem.

Stopping cancels ``run()``; a ``teardown()`` coroutine, if given, runs after.
**A stop always ends** within the child's ``shutdown`` seconds, whatever
``run()`` is doing: a task cannot be SIGKILLed, and one that swallows its
cancel (Python 3.11's ``wait_for`` can, DESIGN §4) or is stuck in a cleanup
would otherwise hold the whole node's stop for ever (issue 10: nodes that
needed SIGKILL after 35–60 s). Such a task is left behind after half the shutdown time, said
(``task_stop_overdue``), and the teardown runs in the time that is left.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Awaitable, Callable

from crewlet import log
from supervisor.procs import ExitInfo
from supervisor.spec import BRUTAL_KILL, INFINITY, ChildSpec, StartFailed


# Seconds a brutal_kill'd task child's teardown gets (it closes connections).
BRUTAL_TEARDOWN = 1.0


class Exit(Exception):
    """End a task child with this code and reason."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _info(exc: BaseException) -> ExitInfo:
    if isinstance(exc, BaseExceptionGroup):  # from a TaskGroup: an Exit in it decides
        exits = [e for e in exc.exceptions if isinstance(e, Exit)]
        exc = exits[0] if exits else exc.exceptions[0]
    if isinstance(exc, Exit):
        return ExitInfo(exc.code, None, exc.reason)
    return ExitInfo(1, None, f"error: {type(exc).__name__}: {exc}")


class TaskRunning:
    """A started task child; ``pid`` is the supervising process's own."""

    def __init__(self, task: asyncio.Task, teardown: Callable[[], Awaitable[None]] | None):
        self.pid = os.getpid()
        self._task = task
        self._teardown = teardown
        self.exited: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return  # stop() resolves exited once teardown has run
        exc = task.exception()
        info = ExitInfo(0, None, "exit 0") if exc is None else _info(exc)
        # Ended by itself: tear down before it counts as exited, so what it
        # held (a connection, a presence) is gone before a replacement starts.
        asyncio.get_running_loop().create_task(self._finish(info))

    async def _finish(self, info: ExitInfo) -> None:
        teardown, self._teardown = self._teardown, None  # runs once, whoever gets here first
        if teardown is not None:
            try:
                await teardown()
            except Exception:
                pass
        if not self.exited.done():
            self.exited.set_result(info)

    async def stop(self, shutdown: float | str) -> ExitInfo:
        # brutal_kill: no wait for run() (a task cannot be killed, only left),
        # a moment for the teardown; infinity: wait as long as it takes.
        limit = {BRUTAL_KILL: BRUTAL_TEARDOWN, INFINITY: None}.get(shutdown, shutdown)
        deadline = None if limit is None else time.monotonic() + float(limit)

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._task.done():
            self._task.cancel()
            # Half the time at most: the teardown that follows releases what
            # the node holds in the fleet (its presence), which peers would
            # otherwise wait a TTL to see go.
            wait = 0.0 if shutdown == BRUTAL_KILL else None if limit is None else float(limit) / 2
            await asyncio.wait({self._task}, timeout=wait)
            if not self._task.done() and shutdown != BRUTAL_KILL:
                log.event("task_stop_overdue", "error", task=self._task.get_name(), waited=limit)
        teardown, self._teardown = self._teardown, None  # runs once, whoever gets here first
        if teardown is not None:
            try:
                await asyncio.wait_for(teardown(), left())
            except (asyncio.TimeoutError, Exception):
                pass  # a teardown that fails must not block the node's stop
        if not self.exited.done():
            self.exited.set_result(ExitInfo(0, None, "exit 0"))
        return self.exited.result()

    def children(self) -> list[dict]:
        return []


def task_child(name: str, *, setup: Callable[[], Awaitable[Any]],
               run: Callable[[], Awaitable[None]],
               teardown: Callable[[], Awaitable[None]] | None = None,
               ready_timeout: float, **spec: Any) -> ChildSpec:
    """The spec of a child that is a task of this process (see the module doc)."""

    async def start(incarnation: int) -> TaskRunning:
        try:
            await asyncio.wait_for(setup(), ready_timeout)
        except asyncio.TimeoutError:
            raise StartFailed(ExitInfo(None, None, f"not ready within {ready_timeout:g}s"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise StartFailed(_info(exc)) from exc
        return TaskRunning(asyncio.get_running_loop().create_task(run(), name=name), teardown)

    return ChildSpec(name, start, **spec)

