"""An OTP-style supervisor, run on the supervising process's event loop.

A :class:`Supervisor` owns an ordered list of children (:class:`ChildSpec`)
and keeps them running:

* **Start** is ordered and synchronous: each child is started, and counts as
  started only when it has reported *ready*, before the next one is started.
  If one cannot start, the ones already started are stopped (in reverse) and
  :meth:`Supervisor.start` raises :class:`StartFailed`.
* **Stop** runs in reverse start order, each child per its ``shutdown``.
* A child's death is noticed when it happens (its ``exited`` future), never by
  polling. What happens next is decided in one place, :meth:`_handle_exit`:
  the exit-code contract (78 is never restarted), the child's restart type,
  auto_shutdown, then restart intensity, then the strategy — chosen by one
  dispatch table, :data:`_STRATEGIES`.
* A supervisor that gives up stops its children and resolves ``exited``;
  under a parent supervisor it is an ordinary child, so its parent treats that
  like any other child's death (OTP's escalation).

Every decision is serialised through one lock, so two deaths noticed at the
same moment are decided one after the other, as a gen_server would. A death
is recorded the moment it is noticed (status never shows a dead child as
running), and a restart that must wait out its backoff waits on a timer, not
holding the lock: another child's death meanwhile is handled at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from supervisor import spec as S
from supervisor import states
from supervisor.procs import EXIT_CONFIG, EXIT_UNAVAILABLE, ExitInfo
from supervisor.spec import ChildSpec, Running, StartFailed, SupFlags

# Seconds an abandoned start gets to clean up at least (brutal_kill included).
ABANDON_MIN = 1.0

Notify = Callable[..., None]


class _Child:
    """One child's runtime record.

    Invariants: ``running`` is set exactly while ``state`` is running or
    stopping; ``incarnation`` counts starts attempted, and an exit report
    whose incarnation is older is stale and ignored; ``started_at`` is set
    only while running, ``ran_for`` is how long the last run lasted.
    """

    def __init__(self, spec: ChildSpec):
        self.spec = spec
        self.state = states.STOPPED
        self.running: Running | None = None
        self.incarnation = 0
        self.restarts = 0            # restarts performed (shown in status)
        self.consecutive = 0         # restarts in a row without a stable run (backoff)
        self.started_at: float | None = None   # monotonic, when last ready
        self.started_wall: float | None = None
        self.ran_for = 0.0
        self.last_exit: ExitInfo | None = None
        self.last_exit_at: float | None = None


class Supervisor:
    def __init__(self, name: str, flags: SupFlags, children: list[ChildSpec],
                 notify: Notify | None = None):
        ids = [c.id for c in children]
        if len(set(ids)) != len(ids):
            raise ValueError(f"supervisor {name}: duplicate child ids {ids}")
        self.name = name
        self.flags = flags
        self._children = [_Child(c) for c in children]
        self._notify = notify or (lambda *a, **k: None)
        self._lock = asyncio.Lock()
        self._restarts: list[float] = []   # monotonic times of restarts within `period`
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()          # decisions in flight
        self._timers: set[asyncio.TimerHandle] = set()  # restarts waiting out a backoff
        # Resolved when this supervisor ends on its own (gave up, auto_shutdown)
        # or is stopped: how it ended.
        self.exited: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()

    # ---------------------------------------------------------------- public

    async def start(self) -> None:
        """Start every child in order, each ready before the next.

        Cancelled (the node was asked to stop meanwhile), it stops what it had
        started and ends normally.
        """
        async with self._lock:
            for child in self._children:
                try:
                    await self._start(child)
                except StartFailed as exc:
                    await self._stop_all()
                    if self._stopping.is_set():  # stopped while starting: not a failure
                        self._finish(ExitInfo(0, None, "stopped while starting"))
                        return
                    code = EXIT_CONFIG if exc.info.code == EXIT_CONFIG else EXIT_UNAVAILABLE
                    self._finish(ExitInfo(code, None,
                                          f"{child.spec.id} failed to start: {exc.info.reason}"))
                    raise StartFailed(self.exited.result()) from exc
                except asyncio.CancelledError:
                    self._stopping.set()
                    await self._stop_all()
                    self._finish(ExitInfo(0, None, "stopped while starting"))
                    raise

    async def stop(self) -> ExitInfo:
        """Stop every child in reverse order; this supervisor ends normally."""
        self._stopping.set()
        async with self._lock:
            await self._stop_all()
            self._finish(ExitInfo(0, None, "stopped"))
        return self.exited.result()

    async def restart_child(self, child_id: str) -> None:
        """Stop and start one child by hand (``crewletctl restart``).

        A manual restart is not a failure: it counts toward neither intensity
        nor backoff.
        """
        async with self._lock:
            child = self._find(child_id)
            if self._stopping.is_set():
                return
            if child.running is not None:
                await self._stop_child(child)
            try:
                await self._start(child)
            except StartFailed as exc:
                await self._after_exit([(child, exc.info)])

    def find(self, child_id: str) -> "Supervisor | None":
        """The supervisor (this one or nested) that has a child *child_id*."""
        for child in self._children:
            if child.spec.id == child_id:
                return self
            nested = getattr(child.running, "supervisor", None)
            if nested is not None and (found := nested.find(child_id)) is not None:
                return found
        return None

    def children(self) -> list[dict[str, Any]]:
        """Status of every child, nested supervisors' children flattened in."""
        now = time.monotonic()
        out: list[dict[str, Any]] = []
        for child in self._children:
            up = child.state == states.RUNNING and child.started_at is not None
            out.append({
                "name": child.spec.id,
                "type": child.spec.type,
                "supervisor": self.name,
                "restart": child.spec.restart,
                "pid": child.running.pid if child.running is not None else None,
                "state": child.state,
                "restarts": child.restarts,
                "uptime_s": round(now - child.started_at, 3) if up else None,
                "started_at": child.started_wall if up else None,
                "last_exit": ({**child.last_exit.as_dict(), "at": child.last_exit_at}
                              if child.last_exit else None),
            })
            if child.running is not None:
                out.extend(child.running.children())
        return out

    def restarts_in_period(self) -> int:
        self._prune(time.monotonic())
        return len(self._restarts)

    # ---------------------------------------------------------- the decisions

    def _on_exit(self, child: _Child, incarnation: int, fut: asyncio.Future[ExitInfo]) -> None:
        """A running child ended by itself. Record it now; decide under the lock."""
        if fut.cancelled() or incarnation != child.incarnation or child.state != states.RUNNING:
            return  # stale, or being stopped by us (the stopper records it)
        info = fut.result()
        self._exited(child, info)
        self._spawn(self._decide(child, incarnation, info))

    async def _decide(self, child: _Child, incarnation: int, info: ExitInfo) -> None:
        async with self._lock:
            if self._stopping.is_set() or incarnation != child.incarnation \
                    or child.state != states.EXITED:
                return  # stopping, or already restarted along with a sibling
            await self._after_exit([(child, info)])

    async def _after_exit(self, pending: list[tuple[_Child, ExitInfo]]) -> None:
        """Children ended on their own (or failed to start). Decide, then act.

        Loops while restarting fails, so a child that keeps dying during its
        restart keeps spending restart intensity until the supervisor gives up.
        """
        while pending and not self._stopping.is_set():
            child, info = pending.pop(0)
            decision = self._handle_exit(child, info)
            if decision is None:
                continue
            if isinstance(decision, ExitInfo):
                await self._give_up(decision)
                return
            pending.extend(await self._restart(child, decision))

    def _handle_exit(self, child: _Child, info: ExitInfo) -> list[_Child] | ExitInfo | None:
        """The decision for one exit: children to restart, a reason to give up,
        or None (leave it down)."""
        if info.code == EXIT_CONFIG:
            # Restarting cannot fix a configuration; crewletd exits 78 with it.
            self._move(child, states.FATAL)
            return ExitInfo(EXIT_CONFIG, None, f"{child.spec.id}: {info.reason}")
        if not _RESTART[child.spec.restart](info):
            self._move(child, states.STOPPED)
            if child.spec.significant and self._auto_shutdown_due():
                # Non-zero when it crashed: a container should fail, not finish.
                return ExitInfo(0 if info.normal else EXIT_UNAVAILABLE, None,
                                f"auto_shutdown: significant child {child.spec.id} ended ({info.reason})")
            return None
        now = time.monotonic()
        self._prune(now)
        if len(self._restarts) + 1 > self.flags.intensity:
            return ExitInfo(EXIT_UNAVAILABLE, None,
                            f"reached max restart intensity ({self.flags.intensity} in "
                            f"{self.flags.period:g}s); last: {child.spec.id} {info.reason}")
        self._restarts.append(now)
        return _STRATEGIES[self.flags.strategy](self._children, child)

    def _auto_shutdown_due(self) -> bool:
        significant = [c for c in self._children if c.spec.significant]
        down = [c for c in significant if c.running is None]
        return {S.NEVER: False,
                S.ANY_SIGNIFICANT: bool(down),
                S.ALL_SIGNIFICANT: bool(significant) and len(down) == len(significant),
                }[self.flags.auto_shutdown]

    # --------------------------------------------------------------- actions

    async def _restart(self, failed: _Child, targets: list[_Child]) -> list[tuple[_Child, ExitInfo]]:
        """Restart *targets* (in start order) after *failed* died.

        Siblings the strategy takes down with it are stopped in reverse order
        first. Temporary siblings are not started again (OTP drops them). When
        *failed* must wait out a backoff, the whole restart is put on a timer
        and this returns at once. Returns the children that failed to start.
        """
        for sibling in reversed(targets):
            if sibling is not failed and sibling.running is not None:
                await self._stop_child(sibling)
        starting = [c for c in targets if c is failed or c.spec.restart != S.TEMPORARY]
        if failed.ran_for >= self.flags.stable_after:
            failed.consecutive = 0
        failed.consecutive += 1
        delay = self.flags.backoff(failed.consecutive)
        if delay <= 0:
            return await self._start_each(starting)
        for child in starting:
            self._move(child, states.BACKOFF)
        self._notify("child_backoff", child=failed.spec.id, supervisor=self.name,
                     delay_s=round(delay, 3))
        loop = asyncio.get_running_loop()
        handle = loop.call_later(delay, lambda: self._spawn(self._after_backoff(starting, handle)))
        self._timers.add(handle)
        return []

    async def _after_backoff(self, starting: list[_Child], handle: asyncio.TimerHandle) -> None:
        self._timers.discard(handle)
        async with self._lock:
            if self._stopping.is_set():
                return
            # A child restarted by hand meanwhile is no longer waiting.
            waiting = [c for c in starting if c.state == states.BACKOFF]
            await self._after_exit(await self._start_each(waiting))

    async def _start_each(self, children: list[_Child]) -> list[tuple[_Child, ExitInfo]]:
        failures = []
        for child in children:
            if self._stopping.is_set():
                break
            child.restarts += 1
            try:
                await self._start(child)
            except StartFailed as exc:
                failures.append((child, exc.info))
        return failures

    async def _give_up(self, info: ExitInfo) -> None:
        self._notify("supervisor_gave_up", "error", supervisor=self.name, reason=info.reason,
                     code=info.code)
        self._stopping.set()
        await self._stop_all()
        for child in self._children:
            if child.state == states.EXITED:  # the one that died last: not started again
                self._move(child, states.FATAL)
        self._finish(info)

    async def _start(self, child: _Child) -> None:
        """Start *child*; raises StartFailed (whatever went wrong) with why."""
        child.incarnation += 1
        incarnation = child.incarnation
        self._move(child, states.STARTING)
        try:
            running = await self._unless_stopping(child, child.spec.start(incarnation - 1))
        except StartFailed as exc:
            info = exc.info
        except asyncio.CancelledError:
            self._move(child, states.STOPPED)
            raise
        except Exception as exc:  # a bug or a resource limit: a failed start, not a hang
            info = ExitInfo(None, None, f"start error: {type(exc).__name__}: {exc}")
        else:
            child.running = running
            child.started_at, child.started_wall = time.monotonic(), time.time()
            self._move(child, states.RUNNING)
            running.exited.add_done_callback(lambda fut: self._on_exit(child, incarnation, fut))
            self._notify("child_started", child=child.spec.id, supervisor=self.name,
                         child_pid=running.pid, incarnation=incarnation - 1)
            return
        self._move(child, states.EXITED)
        child.ran_for = 0.0
        child.last_exit, child.last_exit_at = info, time.time()
        self._notify("child_start_failed", "error", child=child.spec.id,
                     supervisor=self.name, reason=info.reason)
        raise StartFailed(info)

    async def _unless_stopping(self, child: _Child, starting):
        """Await a child's start, abandoning it if this supervisor is asked to
        stop meanwhile: a start can wait up to ready_timeout, and the stop
        (say, of a parent restarting us after the broker died) must not.

        An abandoned start is cancelled and given the child's shutdown time
        to clean up (kill the child it forked). A start that finished anyway
        — it swallowed its cancel, as Python 3.11's ``wait_for`` can — has
        its child stopped, never left running unsupervised."""
        start = asyncio.ensure_future(starting)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({start, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Cancelled ourselves: the start's own cleanup (killing the child
            # it forked) must have run before we go on.
            await self._abandon(child, start)
            raise
        finally:
            stop.cancel()
        if start.done():
            return start.result()
        await self._abandon(child, start)
        raise StartFailed(ExitInfo(None, None, "start abandoned: stopping"))

    async def _abandon(self, child: _Child, start: asyncio.Future) -> None:
        start.cancel()  # the child being started is killed by its start's cleanup
        shutdown = child.spec.shutdown
        wait = None if shutdown == S.INFINITY else ABANDON_MIN if shutdown == S.BRUTAL_KILL \
            else max(float(shutdown), ABANDON_MIN)
        await asyncio.wait({start}, timeout=wait)
        if not start.done():
            self._notify("child_start_overdue", "error", child=child.spec.id, supervisor=self.name)
        elif not start.cancelled() and start.exception() is None:
            await start.result().stop(shutdown)  # started despite the cancel: stop it

    async def _stop_child(self, child: _Child) -> None:
        running = child.running
        assert running is not None
        self._move(child, states.STOPPING)
        info = await running.stop(child.spec.shutdown)
        self._record_end(child, info)
        self._move(child, states.STOPPED)
        self._notify("child_stopped", child=child.spec.id, supervisor=self.name,
                     code=info.code, signal=info.signal, reason=info.reason)

    async def _stop_all(self) -> None:
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        for child in reversed(self._children):
            if child.running is not None:
                await self._stop_child(child)
            elif child.state == states.BACKOFF:
                self._move(child, states.STOPPED)

    def _exited(self, child: _Child, info: ExitInfo) -> None:
        self._record_end(child, info)
        self._move(child, states.EXITED)
        self._notify("child_exited", "warning" if not info.normal else "info",
                     child=child.spec.id, supervisor=self.name, code=info.code,
                     signal=info.signal, reason=info.reason)

    def _record_end(self, child: _Child, info: ExitInfo) -> None:
        now = time.monotonic()
        child.ran_for = now - child.started_at if child.started_at is not None else 0.0
        child.started_at = child.started_wall = None
        child.running = None
        child.last_exit, child.last_exit_at = info, time.time()

    def _finish(self, info: ExitInfo) -> None:
        if not self.exited.done():
            self.exited.set_result(info)

    # --------------------------------------------------------------- helpers

    def _spawn(self, coro) -> None:
        """Run *coro* as a task we keep, and whose failure is logged, not lost."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self._notify("supervisor_error", "error", supervisor=self.name,
                             error=f"{type(t.exception()).__name__}: {t.exception()}")
        task.add_done_callback(done)

    def _move(self, child: _Child, new: str) -> None:
        if child.state == new:
            return
        states.check(child.spec.id, child.state, new)
        child.state = new

    def _prune(self, now: float) -> None:
        self._restarts = [t for t in self._restarts if now - t <= self.flags.period]

    def _find(self, child_id: str) -> _Child:
        for child in self._children:
            if child.spec.id == child_id:
                return child
        raise KeyError(child_id)


# Which exits each restart type restarts.
_RESTART: dict[str, Callable[[ExitInfo], bool]] = {
    S.PERMANENT: lambda info: True,
    S.TRANSIENT: lambda info: not info.normal,
    S.TEMPORARY: lambda info: False,
}

# strategy -> the children to restart (in start order) when one has died.
_STRATEGIES: dict[str, Callable[[list[_Child], _Child], list[_Child]]] = {
    S.ONE_FOR_ONE: lambda children, dead: [dead],
    S.ONE_FOR_ALL: lambda children, dead: list(children),
    S.REST_FOR_ONE: lambda children, dead: children[children.index(dead):],
}


class SupervisorChild:
    """A nested supervisor as its parent's child (``type: supervisor``)."""

    pid = None

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.exited = supervisor.exited

    async def stop(self, shutdown: float | str) -> ExitInfo:
        if self.exited.done():
            return self.exited.result()
        return await self.supervisor.stop()

    def children(self) -> list[dict]:
        return self.supervisor.children()


def nested(child_id: str, make: Callable[[], Supervisor], **spec: Any) -> ChildSpec:
    """A child spec whose child is a supervisor built by *make* at each start."""

    async def start(incarnation: int) -> SupervisorChild:
        sup = make()
        await sup.start()
        return SupervisorChild(sup)

    spec.setdefault("shutdown", S.INFINITY)
    return ChildSpec(child_id, start, type=S.SUPERVISOR, **spec)
