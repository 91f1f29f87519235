"""Worker children that are OS processes, and the services they share.

:class:`ProcessHost` is what one supervising process (crewletd, or a test)
holds for all its process children: the zygote they are forked from, the
``health`` socket they report on, the pipes their output arrives on, and — in
crewletd — the reaper for orphans.

:func:`process_child` makes the :class:`ChildSpec` of one such child. Its
start forks the child from the zygote and returns only once the child is
*ready*: it reported ready on ``health``, or (for a program that cannot
report, like the broker) the spec's own readiness probe passed. A child that
exits first, or is not ready within ``ready_timeout``, fails to start.

A child's output is re-emitted line by line, tagged with its name. It is
read in batches: a line after a quiet spell is read at once, and then the
pipe is left alone for :data:`FORWARD_EVERY` seconds while what the child
writes meanwhile waits in it (the pipe made :data:`PIPE_BYTES` large, so a
busy child does not block on its output), to be forwarded with one write. A
child logging a line per turn so costs crewletd a few wakeups a second
rather than one a turn, and an idle child none; a line waits at most
:data:`FORWARD_EVERY` to be seen.
A spec's ``diagnose`` reads each line for a configuration problem the child
states before it fails (the broker's "address already in use", a role's
``config_error`` event): a child that then exits non-zero is taken to have
exited 78 with that problem as its reason, so its supervisor escalates it as
bad configuration rather than restarting it. The exit is matched to what the
child wrote deterministically: whatever it wrote is in the pipe before its
exit is known, and is read before the exit is decided.

While it runs, a child that reports heartbeats and goes silent for longer than
``wedge_after + heartbeat_grace`` is SIGKILLed ("killed: no heartbeat") — the
case where its own watchdog thread could not end it. When a child ends, for
whatever reason, its whole process group is SIGKILLed by whoever reaps it (the
zygote, or crewletd for orphans) before the zombie is reaped, so nothing it
started outlives it and the group id cannot have been reused.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
from typing import Any, Awaitable, Callable

import zmq
import zmq.asyncio

from crewlet import ipc, log
from supervisor import procs
from supervisor.procs import EXIT_CONFIG, EXIT_OK, ExitInfo
from supervisor.spec import BRUTAL_KILL, INFINITY, ChildSpec, StartFailed
from supervisor.zygote import ForkFailed, Zygote, ZygoteGone

ReadyProbe = Callable[[int], Awaitable[None]]
# One line of a child's output -> the configuration problem it states, else None.
Diagnose = Callable[[bytes], "str | None"]
_READ_SIZE = 65536
# fcntl's F_SETPIPE_SZ (Linux; Python names it from 3.10 on some builds only).
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# Seconds a child's pipe is left alone after a read (see the module docstring):
# what it writes meanwhile is read and forwarded together.
FORWARD_EVERY = 0.25
# The capacity asked for a child's output pipe (Linux's default is 64 KiB; an
# unprivileged process may have up to /proc/sys/fs/pipe-max-size, 1 MiB by
# default): what a child logs in FORWARD_EVERY must fit, or it blocks on a write.
PIPE_BYTES = 1 << 20
# Reads of one batch at most: a child writing faster than we read still lets
# our loop turn.
_BATCH_READS = 16
# Reads of a dead child's pipe before its exit is decided: enough for a full
# pipe (PIPE_BYTES), bounded should a grandchild keep writing into it.
_DRAIN_READS = PIPE_BYTES // _READ_SIZE


class ProcessHost:
    """Shared by every process child of one supervising process.

    Invariants: ``_ready[pid]`` is a future for each child started and not yet
    ready; ``_beats[pid]`` is the heartbeat callback of each running child that
    heartbeats; ``stats[pid]`` the last stats report of each child that
    sends them (the seats role: its turns), dropped with the child;
    ``doing[pid]`` what a child stopping past its stop budget said it was
    still doing (its ``stop_overdue`` report), dropped with the child.
    """

    def __init__(self, run_dir: str, zygote: Zygote, ctx: zmq.asyncio.Context,
                 notify: Callable[..., None] | None = None):
        self.run_dir = run_dir
        self.zygote = zygote
        self.ctx = ctx
        self.notify = notify or log.event
        self._ready: dict[int, asyncio.Future[None]] = {}
        self._beats: dict[int, Callable[[], None]] = {}
        self.stats: dict[int, dict[str, Any]] = {}
        self.doing: dict[int, list[str]] = {}
        # The output pipe of each child not yet ended.
        self._outputs: dict[int, _Output] = {}
        self._health: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None

    async def open(self) -> None:
        ipc.ensure_run_dir(self.run_dir)
        self._health = ipc.bind(self.ctx, self.run_dir, zmq.PULL, "health")
        self._reader = asyncio.create_task(self._read_health())

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._health is not None:
            self._health.close()

    async def _read_health(self) -> None:
        assert self._health is not None
        while True:
            frame = await self._health.recv()
            try:
                msg = ipc.unpack(frame)
                pid, kind = msg.get("pid"), msg.get("t")
            except Exception:  # one bad frame must not deafen us to every child
                self.notify("health_message_unreadable", "warning", size=len(frame))
                continue
            if kind == "hb":
                beat = self._beats.get(pid)
                if beat is not None:
                    beat()
            elif kind == "stats":
                if pid in self._beats:  # a child we run, not one already gone
                    self.stats[pid] = msg.get("stats") or {}
            elif kind == "stop_overdue":
                if pid in self._beats:
                    self.doing[pid] = list(msg.get("tasks") or [])
            elif kind == "ready":
                # A ready that arrives before its starter asks (our loop was
                # busy) is kept: ready_of finds the future already resolved.
                fut = self.ready_of(pid)
                if not fut.done():
                    fut.set_result(None)

    def ready_of(self, pid: int) -> asyncio.Future[None]:
        """A future resolved when *pid* reports ready (or already has)."""
        fut = self._ready.get(pid)
        if fut is None:
            fut = self._ready[pid] = asyncio.get_running_loop().create_future()
        return fut

    def forget(self, pid: int) -> None:
        """*pid* is ready or gone: drop what we kept for it."""
        self._ready.pop(pid, None)

    def reap(self) -> None:
        """crewletd's SIGCHLD handler: reap every exited child of ours.

        Exits of children the zygote left behind (it died) go to whoever waits
        on them; anything else is an orphan re-parented to us, reaped so no
        zombie stays.
        """
        for pid, status in procs.reap_nohang(kill_group=self.zygote.waits_for):
            if pid == self.zygote.pid:
                self.notify("zygote_exited", "warning", reason=ExitInfo.from_status(status).reason)
                self.zygote.reaped()
            elif not self.zygote.deliver_exit(pid, status):
                self.notify("orphan_reaped", orphan_pid=pid,
                            reason=ExitInfo.from_status(status).reason)

    def pump(self, fd: int, *, role: str, pid: int, diagnose: Diagnose | None = None) -> None:
        """Read a child's output pipe to EOF, re-emitting each line tagged."""
        self._outputs[pid] = _Output(fd, role, pid, diagnose)

    def last_words(self, pid: int) -> str | None:
        """The configuration problem child *pid* (which has ended) stated with
        its ``diagnose``, everything it wrote read first; None if it stated none.
        (A pipe a grandchild still holds open goes on being read.)"""
        out = self._outputs.pop(pid, None)
        if out is None:
            return None
        for _ in range(_DRAIN_READS):
            if not out.read():
                break
        return out.problem


class _Output:
    """One child's output pipe, read in batches as the loop finds it readable
    (see the module docstring).

    Invariant: while not closed, either the loop watches ``fd`` or ``_rest``
    is the timer that watches it again.
    """

    def __init__(self, fd: int, role: str, pid: int, diagnose: Diagnose | None):
        self.fd, self.role, self.pid = fd, role, pid
        self.diagnose = diagnose
        self.problem: str | None = None
        self.closed = False
        self._buf = bytearray()
        self._rest: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        os.set_blocking(fd, False)
        try:
            fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # over this system's limit: the default size, and a child may wait on a full pipe
        self._loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        """Forward what is in the pipe now, then leave it for FORWARD_EVERY."""
        for _ in range(_BATCH_READS):
            if not self.read():
                break
        if not self.closed:
            self._loop.remove_reader(self.fd)
            self._rest = self._loop.call_later(FORWARD_EVERY, self._watch)

    def _watch(self) -> None:
        self._rest = None
        if not self.closed:
            self._loop.add_reader(self.fd, self._readable)

    def read(self) -> bool:
        """Read what is in the pipe now (one read); False when nothing was (or it closed)."""
        if self.closed:
            return False
        try:
            chunk = os.read(self.fd, _READ_SIZE)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if chunk:
            self._buf.extend(chunk)
            end = self._buf.rfind(b"\n")
            if end >= 0:
                lines = bytes(self._buf[:end]).split(b"\n")
                del self._buf[:end + 1]
                self._lines(lines)
            return True
        if self._buf:
            self._lines([bytes(self._buf)])
            self._buf.clear()
        self.closed = True
        if self._rest is not None:
            self._rest.cancel()
            self._rest = None
        self._loop.remove_reader(self.fd)
        os.close(self.fd)
        return False

    def _lines(self, lines: list[bytes]) -> None:
        log.forward_lines(lines, role=self.role, pid=self.pid)
        if self.diagnose is not None:
            for line in lines:
                if self.problem is not None:
                    break
                self.problem = self.diagnose(line)


class ProcessRunning:
    """A started process child. ``exited`` resolves with how it ended.

    Invariant: ``_kill_reason`` is set before we SIGKILL the child ourselves,
    so the exit is shown as what we did ("killed: no heartbeat") rather than
    as a bare "signal 9".
    """

    def __init__(self, host: ProcessHost, name: str, pid: int, status: asyncio.Future[int]):
        self.host = host
        self.name = name
        self.pid = pid
        self._kill_reason: str | None = None
        self._beat_timer: asyncio.TimerHandle | None = None
        self.exited: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()
        status.add_done_callback(self._on_status)

    def _on_status(self, fut: asyncio.Future[int]) -> None:
        info = ExitInfo.from_status(fut.result(), self._kill_reason) if not fut.exception() \
            else ExitInfo(None, None, "lost: zygote gone")
        problem = self.host.last_words(self.pid)
        if problem is not None and info.code not in (EXIT_OK, None) and self._kill_reason is None:
            info = ExitInfo(EXIT_CONFIG, None, problem)  # it said why it could not go on
        if self._beat_timer is not None:
            self._beat_timer.cancel()
        self.host._beats.pop(self.pid, None)
        self.host.stats.pop(self.pid, None)
        self.host.doing.pop(self.pid, None)
        self.host.forget(self.pid)
        # Whatever the child started went with it: its reaper SIGKILLed the
        # group while the child's zombie still held the group id.
        if not self.exited.done():
            self.exited.set_result(info)

    def kill(self, reason: str) -> None:
        if self._kill_reason is None:
            self._kill_reason = reason
        procs.signal_group(self.pid, signal.SIGKILL)

    def watch_heartbeats(self, silence: float) -> None:
        """SIGKILL the child if no heartbeat arrives for *silence* seconds."""
        loop = asyncio.get_running_loop()

        def expired(deadline: float) -> None:
            if loop.time() - deadline > silence / 2:
                # We ran late ourselves: this whole node was paused (SIGSTOP),
                # children included. Silence measured across it means nothing.
                beat()
                return
            self.host.notify("heartbeat_lost", "error", child=self.name, child_pid=self.pid,
                             silent_s=silence)
            self.kill("killed: no heartbeat")

        def beat() -> None:
            if self._beat_timer is not None:
                self._beat_timer.cancel()
            deadline = loop.time() + silence
            self._beat_timer = loop.call_at(deadline, expired, deadline)

        self.host._beats[self.pid] = beat
        beat()

    async def stop(self, shutdown: float | str) -> ExitInfo:
        if self.exited.done():
            return self.exited.result()
        if shutdown == BRUTAL_KILL:
            self.kill("killed: brutal_kill")
        else:
            procs.signal_group(self.pid, signal.SIGTERM)
            timeout = None if shutdown == INFINITY else float(shutdown)
            try:
                return await asyncio.wait_for(asyncio.shield(self.exited), timeout)
            except asyncio.TimeoutError:
                # What it was still doing, if it said (crewlet.runtime: a role
                # stopping past its stop budget reports its tasks).
                doing = self.host.doing.get(self.pid)
                self.host.notify("shutdown_timeout", "warning", child=self.name, child_pid=self.pid,
                                 timeout_s=timeout, **({"doing": doing} if doing else {}))
                self.kill(f"killed: did not stop within {timeout:g}s")
        return await self.exited

    def children(self) -> list[dict]:
        return []


def process_child(host: ProcessHost, name: str, *, target: str, kwargs: dict[str, Any],
                  title: str, ready_timeout: float, heartbeat_silence: float | None,
                  probe: ReadyProbe | None = None, pdeathsig: int = signal.SIGTERM,
                  diagnose: Diagnose | None = None, **spec: Any) -> ChildSpec:
    """The spec of a worker child forked from the zygote to run *target*.

    ``heartbeat_silence`` None: the child does not heartbeat (the broker).
    ``probe``: readiness checked by us rather than reported by the child.
    ``diagnose``: reads the child's output for a configuration problem (see
    the module docstring).
    """

    async def start(incarnation: int) -> ProcessRunning:
        r, w = os.pipe()
        fork = asyncio.ensure_future(host.zygote.fork(
            target, {**kwargs, "incarnation": incarnation}, title=title, out_fd=w,
            pdeathsig=pdeathsig))
        try:
            pid = await asyncio.shield(fork)
        except (ZygoteGone, ForkFailed) as exc:
            os.close(r)
            raise StartFailed(ExitInfo(None, None, str(exc))) from exc
        except asyncio.CancelledError:
            # Cancelled while the zygote forks: the child exists (or is about
            # to); learn its pid and kill it rather than leave it behind.
            os.close(r)
            try:
                procs.signal_group(await fork, signal.SIGKILL)
            except (ZygoteGone, ForkFailed):
                pass
            raise
        finally:
            os.close(w)
        host.pump(r, role=name, pid=pid, diagnose=diagnose)
        running = ProcessRunning(host, name, pid, host.zygote.exit_of(pid))
        ready = asyncio.ensure_future(probe(pid) if probe else host.ready_of(pid))
        try:
            done, _ = await asyncio.wait({ready, running.exited}, timeout=ready_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # The node is stopping while this child starts: take it down too.
            ready.cancel()
            running.kill("killed: node stopping while it started")
            await asyncio.shield(running.exited)
            raise
        host.forget(pid)
        if ready in done and ready.exception() is None:
            if heartbeat_silence is not None:
                running.watch_heartbeats(heartbeat_silence)
            return running
        ready.cancel()
        if running.exited in done:
            raise StartFailed(running.exited.result())
        if ready in done:  # the probe itself failed
            running.kill(f"killed: not ready ({ready.exception()})")
        else:
            running.kill(f"killed: not ready within {ready_timeout:g}s")
        raise StartFailed(await running.exited)

    return ChildSpec(name, start, **spec)
