"""What every role child runs around its own ``main``.

The zygote forks a child into :func:`run_role`. It gives the role:

* one asyncio loop, watched by the :class:`~crewlet.watchdog.Watchdog`;
* one NATS connection (``ctx.nats``) and one ZeroMQ context (``ctx.zmq``),
  both made here, after the fork — neither survives one;
* heartbeats to crewletd's ``health`` endpoint every ``heartbeat_interval``
  from the loop itself, so a stuck loop also goes silent;
* :meth:`RoleContext.ready`, which tells crewletd the child counts as started;
* SIGTERM as a request to stop: ``ctx.stopping`` is set, the role's ``main``
  returns, the connection drains and the process exits 0. A role still not
  done :data:`OVERDUE_AFTER` past its :meth:`RoleContext.stop_budget` says what
  its loop is still doing (:func:`doing`): a ``role_stop_overdue`` event, and
  a ``stop_overdue`` report crewletd names in its ``shutdown_timeout`` event
  should it have to SIGKILL the child;
* a :class:`~crewlet.config.ConfigError` out of ``main`` (say, ingress
  cannot bind ``ingress.listen``) as a ``config_error`` event naming the key,
  and exit 78: crewletd reads the event (:func:`config_problem`), names its
  config file, and exits 78 itself rather than restart the child;
* the fault injection of ``debug.faults`` (wedge, crash, mute, orphan), which
  only a config file can turn on.

A role module exposes ``async def main(ctx: RoleContext) -> None``: set up,
``await ctx.ready()``, ``await ctx.stopping.wait()``, clean up.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import subprocess
import time
import traceback
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import psutil
import zmq
import zmq.asyncio

from crewlet import bus, ipc, log, permissions, redaction
from crewlet.config import ConfigError, NodeConfig
from crewlet.config.model import pool_child
from crewlet.watchdog import Watchdog

# The event a role child states a configuration problem with, before it exits 78.
CONFIG_ERROR = "config_error"
# The parent-death signal of role children: distinct from SIGTERM, which is a
# request to stop, so a child orphaned by its zygote's death exits non-zero.
PARENT_GONE = signal.SIGUSR2
# Seconds between a role's re-asks of the company in force (see companies()).
COMPANY_RECHECK = 30.0
# ... and the first time this soon after subscribing: a broadcast sent while
# the subscription was on its way to crewletd is missed (ZeroMQ's slow
# joiner), and a role's first ask often comes just before the node's first
# apply (ingress then said "no company" until its next ask).
COMPANY_FIRST_RECHECK = 1.0
# Seconds a role waits for crewletd's answer with the company in force (a
# company of 10,000 seats is ~25 MB to pack, send and unpack).
COMPANY_ASK = 15.0
# Seconds the tasks still pending when a process's main coroutine ended get
# to finish after their cancel (see run_loop).
LEFTOVERS = 1.0
# Seconds of a role's shutdown time kept for what follows its main: the
# connection's drain (bus.close), the tasks it left (LEFTOVERS) and a margin.
CLOSE_RESERVE = bus.CLOSE_TIMEOUT + LEFTOVERS + 0.5
# The least a role's own stop is given, however short its shutdown time.
STOP_BUDGET_MIN = 0.5
# Seconds past its stop budget a role still stopping reports what it does:
# one that kept its budget is closing its connection by then (milliseconds).
OVERDUE_AFTER = 0.5
# Tasks a stop_overdue report names at most, and frames shown of each.
DOING_TASKS = 12
DOING_FRAMES = 4

T = TypeVar("T")


class RoleContext:
    """One role child's handles on its node. Made once per process."""

    def __init__(self, role: str, config: NodeConfig, incarnation: int, boot: str, member: int = 0):
        self.role = role
        # Which member of its role's pool this process is (the seats pool,
        # roles/seats/pool.py; 0 for every other role), and its child's name.
        self.member = member
        self.child = pool_child(role, member)
        self.config = config
        # The node's boot instance (crewletd's): leases this node holds carry
        # it, so a restarted role adopts what its node already held.
        self.boot = boot
        self.node_id = config.node.id
        self.run_dir = config.run_dir
        # How many times this child was started before; 0 for the first.
        self.incarnation = incarnation
        self.stopping = asyncio.Event()
        self.zmq = zmq.asyncio.Context()
        self.nats = None  # set by run_role before main runs
        self._health = self.zmq.socket(zmq.PUSH)
        # Keep a "stopping" report queued briefly past close, not forever.
        self._health.setsockopt(zmq.LINGER, 500)
        self._health.connect(ipc.endpoint(self.run_dir, "health"))
        self._heartbeats = True
        self._ready = asyncio.Event()
        self.exit_code = 0

    def jetstream(self):
        """JetStream over this process's one connection, as this node reaches it."""
        return bus.jetstream(self.nats, self.config.stream)

    async def companies(self) -> AsyncIterator[dict[str, Any]]:
        """The company revisions this node applies: the one in force now (if
        any), then each one the node applies later, as crewletd hands them out
        (``{"rev", "epoch", "digest", "company"}``). Before each is given, this
        process learns the secrets it names (:func:`crewlet.redaction.learn_company`),
        so nothing a tool of it says back is kept with one in it."""
        sub = self.zmq.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"company")
        sub.connect(ipc.endpoint(self.run_dir, "events"))
        seen, asked = None, False

        def news(company: dict[str, Any] | None) -> bool:
            """Is *company* one other than the last given? Its secrets are learned first."""
            nonlocal seen
            if company is None or company.get("epoch") == seen:
                return False
            seen = company.get("epoch")
            redaction.learn_company(company.get("company"), self.config)
            return True

        try:
            while True:
                # A SUB's subscription may reach crewletd a moment after our
                # request does, so a broadcast in between could be missed:
                # besides listening, ask again every COMPANY_RECHECK seconds.
                # Naming the epoch we have: the answer leaves the company out while
                # it is still in force (10,000 seats are ~25 MB).
                reply = await ipc.acall(self.zmq, self.run_dir, "company", timeout=COMPANY_ASK,
                                        epoch=seen)
                current = (reply.get("result") or {}).get("company")
                if news(current):
                    yield current
                pause = COMPANY_RECHECK if asked else COMPANY_FIRST_RECHECK
                deadline = asyncio.get_running_loop().time() + pause
                asked = True
                while (left := deadline - asyncio.get_running_loop().time()) > 0:
                    if not await sub.poll(int(left * 1000) + 1):
                        break
                    topic, payload = await sub.recv_multipart()
                    if topic != b"company":
                        continue  # a prefix match: "company_applied" and the like
                    update = ipc.unpack(payload)
                    if news(update):
                        yield update
        finally:
            sub.close()

    def stop_budget(self) -> float:
        """Seconds a role's own stop (handing back work, releasing leases,
        flushing) may take once it begins, so that the whole child ends
        within ``supervisor.shutdown_timeout`` of its SIGTERM, before the
        supervisor's SIGKILL."""
        return max(STOP_BUDGET_MIN, self.config.supervisor.shutdown_timeout - CLOSE_RESERVE)

    def fail(self, exc: BaseException | None) -> None:
        """A task the role cannot do without has ended: log it and stop, exit 1."""
        log.event("role_task_failed", "error",
                  error=f"{type(exc).__name__}: {exc}" if exc else "ended")
        self.exit_code = 1
        self.stopping.set()

    async def report(self, kind: str, **fields: Any) -> None:
        """Send one message on crewletd's health endpoint."""
        await self._health.send(ipc.pack({"t": kind, "child": self.child, "pid": os.getpid(), **fields}))

    async def report_stats(self, compute: Callable[[], dict[str, Any]], every: float) -> None:
        """Tell crewletd this child's stats (``crewletctl status`` shows them)
        as they change: looked at every *every* seconds, sent only when they
        differ from what was sent last — an idle node sends nothing."""
        sent = None
        while True:
            stats = compute()
            if stats != sent:
                await self.report("stats", stats=stats)
                sent = stats
            await asyncio.sleep(every)

    async def ready(self) -> None:
        """This child is up: its connection and sockets are open."""
        if not self._ready.is_set():
            self._ready.set()
            await self.report("ready")
            log.event("role_ready", incarnation=self.incarnation)

    async def _heartbeat(self) -> None:
        interval = self.config.supervisor.heartbeat_interval
        while True:
            if self._heartbeats:
                await self.report("hb")
            await asyncio.sleep(interval)

    def close(self) -> None:
        # Closes every socket the role left open too (each with its own linger:
        # a queued "stopping" report still goes out), so this cannot hang.
        self.zmq.destroy()


def doing(limit: int = DOING_TASKS) -> list[str]:
    """What this loop's tasks (the caller's aside) are waiting in, for a stop
    that overran: each task's name and its innermost frames, innermost first
    (``"duty scheduler: publish_until bus.py:190 < _write lease.py:165"``)."""
    me = asyncio.current_task()
    out = []
    # Tasks given a name first: the default ones (Task-<n>) are mostly the
    # NATS client's own loops.
    for task in sorted((t for t in asyncio.all_tasks() if t is not me and not t.done()),
                       key=lambda t: (t.get_name().startswith("Task-"), t.get_name())):
        frames = []
        coro = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) \
                or getattr(coro, "ag_frame", None)
            if frame is None:
                break
            frames.append(f"{frame.f_code.co_name} {os.path.basename(frame.f_code.co_filename)}:"
                          f"{frame.f_lineno}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) \
                or getattr(coro, "ag_await", None)
        out.append(f"{task.get_name()}: {' < '.join(reversed(frames[-DOING_FRAMES:]))}")
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


async def _watch_stop(ctx: RoleContext) -> None:
    """Once the role has been stopping past its stop budget: say what it is
    still doing, in the log and to crewletd (which names it if it has to
    SIGKILL the child)."""
    await ctx.stopping.wait()
    await asyncio.sleep(ctx.stop_budget() + OVERDUE_AFTER)
    tasks = doing()
    log.event("role_stop_overdue", "warning", budget_s=ctx.stop_budget(),
              after_s=ctx.stop_budget() + OVERDUE_AFTER, tasks=tasks)
    await ctx.report("stop_overdue", tasks=tasks)


def run_loop(main: Awaitable[T], *, leftovers: float) -> T:
    """``asyncio.run(main)``, except that it always ends.

    ``asyncio.run`` cancels the tasks still pending when *main* returns and
    then waits for every one of them, without limit: one task left behind by
    a bounded stop (above) would hold the process for ever. Here they get
    *leftovers* seconds after their cancel, and are then abandoned with the
    loop (as are async generators that do not close in that time).
    """
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:  # also when main raised: the tasks it left get their cleanup
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                _, stuck = loop.run_until_complete(asyncio.wait(pending, timeout=leftovers))
                if stuck:
                    log.event("tasks_abandoned", "warning", tasks=sorted(t.get_name() for t in stuck))
            loop.run_until_complete(asyncio.wait({loop.create_task(loop.shutdown_asyncgens())},
                                                 timeout=leftovers))
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def run_role(role: str, config: dict, incarnation: int = 0, boot: str = "", member: int = 0) -> int:
    """The zygote's target for every role child (*member*: which of its
    role's pool, see :class:`RoleContext`). Returns the exit code."""
    cfg = NodeConfig.model_validate(config)
    log.configure(node=cfg.node.id, role=pool_child(role, member), level=cfg.log.level, fmt="json")
    module = importlib.import_module(f"roles.{role}")
    try:
        return run_loop(_amain(role, cfg, incarnation, boot, module.main, member), leftovers=LEFTOVERS)
    except SystemExit:
        raise
    except ConfigError as exc:
        log.event(CONFIG_ERROR, "error", key=exc.key, problem=exc.problem)
        return ConfigError.EXIT_CODE
    except BaseException as exc:
        # One event with the whole traceback, rather than a line per event.
        log.event("role_crashed", "error", error=f"{type(exc).__name__}: {exc}",
                  traceback=traceback.format_exc())
        return 1


def config_problem(line: bytes) -> tuple[str | None, str] | None:
    """(key, problem) if *line* of a role child's output is its ``config_error``
    event; else None."""
    if CONFIG_ERROR.encode() not in line:
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("event") != CONFIG_ERROR:
        return None
    return record.get("key"), str(record.get("problem"))


async def _amain(role: str, cfg: NodeConfig, incarnation: int, boot: str, main, member: int = 0) -> int:
    loop = asyncio.get_running_loop()
    ctx = RoleContext(role, cfg, incarnation, boot, member)
    watchdog = Watchdog(cfg.supervisor.wedge_after)
    watchdog.start()
    loop.add_signal_handler(signal.SIGTERM, ctx.stopping.set)
    loop.add_signal_handler(signal.SIGINT, ctx.stopping.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: log.event("reload_requested"))

    def parent_gone() -> None:
        # The zygote died (and so, most likely, crewletd): nobody supervises
        # us, so stop, take what we started with us, and say it was not asked.
        log.event("parent_gone", "error")
        ctx.exit_code = 1
        ctx.stopping.set()

    loop.add_signal_handler(PARENT_GONE, parent_gone)
    heartbeat = asyncio.create_task(ctx._heartbeat(), name="heartbeat")
    faults = asyncio.create_task(_inject_faults(ctx), name="faults")
    overdue = asyncio.create_task(_watch_stop(ctx), name="stop watch")
    try:
        # As the role's own broker user, allowed only what the role needs (crewlet.permissions).
        ctx.nats = await bus.connect(cfg.stream, name=f"{cfg.node.id}/{ctx.child}", run_dir=cfg.run_dir,
                                     user=role, inbox=permissions.inbox(role, cfg.node.id))
        await main(ctx)
    finally:
        await ctx.report("stopping")
        faults.cancel()
        if ctx.nats is not None:
            await bus.close(ctx.nats)
        # After the close: a close that hangs is said too, and a loop that
        # still turns is not taken for a wedged one meanwhile.
        overdue.cancel()
        heartbeat.cancel()
        watchdog.stop()
        ctx.close()
        _kill_descendants()
    log.event("role_stopped", code=ctx.exit_code)
    return ctx.exit_code


def _kill_descendants() -> None:
    """Nothing a role started outlives it, even with no supervisor left to
    kill its process group."""
    for proc in psutil.Process().children(recursive=True):
        try:
            proc.kill()
        except psutil.Error:
            pass


# --------------------------------------------------------------------------
# Fault injection (debug.faults). Off unless a config file lists faults.
# --------------------------------------------------------------------------

async def _inject_faults(ctx: RoleContext) -> None:
    faults = [f for f in ctx.config.debug.faults
              if f.role == ctx.role and (not f.once or ctx.incarnation == 0)]
    if not faults:
        return
    await ctx._ready.wait()
    await asyncio.gather(*(_inject(ctx, f) for f in faults))


async def _inject(ctx: RoleContext, fault) -> None:
    await asyncio.sleep(fault.after)
    log.event("fault_injected", "warning", kind=fault.kind)
    if fault.kind == "wedge":
        time.sleep(fault.seconds)  # blocks the loop on purpose
    elif fault.kind == "crash":
        os._exit(fault.code)
    elif fault.kind == "mute":
        ctx._heartbeats = False
    elif fault.kind == "lag":
        # The copy applies nothing for a while, its process otherwise well: the
        # log's trim must wait for it (an in-service copy that has not applied).
        ctx.applier.lag(fault.seconds)
        await asyncio.sleep(fault.seconds)
        log.event("fault_lag_over", "warning", seconds=fault.seconds)
    elif fault.kind == "late":
        # The seats' life not renewed for a while: admission must hold every
        # turn back until a renewal is fresh again.
        ctx.sweeper.hold_renewals(fault.seconds)
        await asyncio.sleep(fault.seconds)
        log.event("fault_late_over", "warning", seconds=fault.seconds)
    elif fault.kind == "orphan":
        # A grandchild whose parent exits at once: the kernel re-parents it to
        # the nearest subreaper (crewletd), which must reap it when it ends.
        out = subprocess.run(["sh", "-c", "sleep 0.5 >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True, env=redaction.bare_env())
        log.event("fault_orphan_spawned", orphan_pid=int(out.stdout.strip()))
    elif fault.kind == "grandchild":
        # Stays in this child's process group; only the group's SIGKILL ends it.
        proc = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 1; done"],
                                env=redaction.bare_env())
        log.event("fault_grandchild_spawned", grandchild_pid=proc.pid)
