"""The zygote: the process every child of a node is forked from.

Forking is only safe from a process with one thread, no event loop and no
ZeroMQ context — none of the three survives a fork — and a child that imports
zmq, nats, lmdb and the HTTP stack itself takes ~130 ms to start. So crewletd
starts one zygote by fork+exec before it makes any of those: a fresh
interpreter that imports the heavy modules (the *preload* list), freezes them
out of the garbage collector so children share their pages, and then does
nothing but fork on request. A child forked from it is running its own code in
a few milliseconds. Requests are read between the preload's imports too: one
whose target's module is in already is forked then (the broker, which only
execs nats-server, starts while the roles' modules are still being
imported); the others wait for the preload, and are forked in order.

Protocol (a ``SOCK_SEQPACKET`` socketpair, one msgpack map per packet):

* crewletd → zygote: ``{"op": "fork", "id", "target": "pkg.mod:func",
  "kwargs", "title", "pdeathsig"}`` with the child's output pipe attached as an
  ``SCM_RIGHTS`` fd; it becomes the child's stdout and stderr.
* crewletd → zygote: ``{"op": "title", "title"}``: the zygote's process
  title from now on. crewletd starts its zygote before it has read its
  config (the zygote's imports then overlap crewletd's own), so it names it
  once it knows the node's id.
* zygote → crewletd: ``{"op": "forked", "id", "pid"}``, and later
  ``{"op": "exited", "pid", "status"}`` with the raw wait status. Both go over
  the same ordered socket, so ``forked`` always precedes its ``exited``.

The zygote is its children's parent and reaps them (SIGCHLD wakes it through a
wakeup fd, so an exit is reported the moment it happens). It dies with crewletd
(``PR_SET_PDEATHSIG``, and it exits at once should crewletd have died before
it set that), and its children die with it in turn; orphans it leaves are
re-parented to crewletd, the subreaper, which reaps them.

In the child, before any of its own code runs: its own process group, the
parent-death signal, default signal dispositions, the output pipe on fds 1
and 2, and its process title.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import itertools
import os
import selectors
import signal
import socket
import subprocess
import sys
import traceback
from typing import Any

import msgpack

from supervisor import procs

# What every node's zygote imports, in this order. A fork waits until its
# target's module is imported, with every module listed before it: a target
# not listed, or listed last, waits for the whole preload. So the broker
# (roles.broker:exec_server, which only execs nats-server) is forked as soon
# as its module is in, ~1 s before the roles' modules are, and starts while
# they are imported; the roles (crewlet.runtime:run_role, last) are forked
# from the whole preload, sharing its pages.
DEFAULT_PRELOAD = (
    "roles.broker",
    "crewlet.config",
    "roles.data_applier",
    # roles.ingress in parts (~0.3 s each at most, its whole ~0.4 s): requests
    # are read between them. (Not the MCP SDK: ingress loads it at the
    # operator endpoint's first request, roles.ingress.mcp.)
    "fastapi",
    "roles.ingress",
    "roles.seats",
    "roles.workers",
    "crewlet.runtime",
)

_MAX_PACKET = 1 << 20
# The environment variable telling the zygote its parent's pid (crewletd's).
PARENT_ENV = "CREWLET_ZYGOTE_PARENT"


# --------------------------------------------------------------------------
# The zygote process
# --------------------------------------------------------------------------

class _Serving:
    """The zygote's side of the socket: fork requests in, reports out.

    Invariant: ``deferred`` holds, in arrival order, the requests read but
    not yet forked: their target's module is not preloaded yet (:meth:`may`)."""

    def __init__(self, sock: socket.socket, title: str) -> None:
        self.sock = sock
        self.title = title
        self.pid = os.getpid()
        # The modules whose forks may go now; None: all (the preload is done).
        self.loaded: set[str] | None = set()
        self.deferred: list[tuple[dict[str, Any], list[int]]] = []
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd fires
        # Stopping is crewletd's to decide: the zygote ends on its socket's EOF or
        # with crewletd (parent-death signal), never because a terminal or a
        # process manager signalled a whole process group.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ, "request")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "sigchld")

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.send(msgpack.packb(msg, use_bin_type=True))
        except (BrokenPipeError, ConnectionResetError):
            sys.exit(0)  # crewletd is gone; our children follow by parent-death signal

    def may(self, req: dict[str, Any]) -> bool:
        """May *req* be forked now: is its target's module preloaded?"""
        return self.loaded is None or req["target"].partition(":")[0] in self.loaded

    def poll(self, timeout: float | None) -> bool:
        """Serve what arrives within *timeout* (None: wait for it); whether
        anything did. Exits the process once crewletd is gone (its socket's
        EOF)."""
        ready = self.sel.select(timeout)
        for key, _ in ready:
            if key.data == "sigchld":
                os.read(self.wake_r, 4096)
                for pid, status in procs.reap_nohang():
                    self.send({"op": "exited", "pid": pid, "status": status})
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, _MAX_PACKET, 4)
            except ConnectionResetError:
                data, fds = b"", []
            if not data:
                sys.exit(0)  # crewletd is gone
            req = msgpack.unpackb(data, raw=False)
            if req.get("op") == "title":
                self.title = req["title"]
                procs.set_title(self.title)
            elif self.may(req) and not self.deferred:
                self.fork(req, fds)
            else:
                self.deferred.append((req, fds))  # forked in order, once its module is in
        return bool(ready)

    def release(self) -> None:
        """Fork the deferred requests that may go now, in order."""
        while self.deferred and self.may(self.deferred[0][0]):
            self.fork(*self.deferred.pop(0))

    def fork(self, req: dict[str, Any], fds: list[int]) -> None:
        try:
            pid = os.fork()
        except OSError as exc:  # EAGAIN at a pids limit, ENOMEM: say so, keep serving
            for fd in fds:
                os.close(fd)
            self.send({"op": "forked", "id": req["id"], "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            _become_child(req, fds, self.pid,
                          [self.sock.fileno(), self.wake_r, self.wake_w, self.sel.fileno()])
        try:
            os.setpgid(pid, pid)  # also done in the child: whichever runs first wins
        except OSError:
            pass  # the child already exec'd or exited; its own setpgid stands
        for fd in fds:
            os.close(fd)
        self.send({"op": "forked", "id": req["id"], "pid": pid})


def _become_child(req: dict[str, Any], fds: list[int], zygote_pid: int,
                  close: list[int]) -> None:
    """Runs in the freshly forked child; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        procs.set_parent_death_signal(req.get("pdeathsig", signal.SIGTERM))
        if os.getppid() != zygote_pid:
            os._exit(1)  # the zygote died between fork and prctl
        for fd in close:
            os.close(fd)
        if fds:
            os.dup2(fds[0], 1)
            os.dup2(fds[0], 2)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
        if req.get("title"):
            procs.set_title(req["title"])
        module, _, func = req["target"].partition(":")
        target = getattr(importlib.import_module(module), func)
        result = target(**req.get("kwargs", {}))
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)  # SystemExit("why") says why, as Python does
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry of ``python -m supervisor.zygote FD``."""
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[0])
    # Die with crewletd; should it be gone already (it exited 78 while this
    # interpreter started), end now rather than after the preload.
    procs.set_parent_death_signal(signal.SIGKILL)
    if str(os.getppid()) != os.environ.pop(PARENT_ENV, str(os.getppid())):
        sys.exit(0)
    sock = socket.socket(fileno=fd)
    serving = _Serving(sock, os.environ.pop("CREWLET_ZYGOTE_TITLE", "crewlet zygote"))
    preload = os.environ.pop("CREWLET_ZYGOTE_PRELOAD", ",".join(DEFAULT_PRELOAD))
    for name in filter(None, preload.split(",")):
        importlib.import_module(name)
        # A fork whose target's module is in now goes now (the broker's, while
        # the roles' modules are still being imported), in request order.
        serving.loaded.add(name)
        while serving.poll(0):
            pass
        serving.release()
    procs.set_title(serving.title)
    # Everything imported so far is shared with every child; keep the collector
    # from touching (and so copying) those pages in each of them.
    gc.collect()
    gc.freeze()
    serving.loaded = None
    serving.release()
    while True:
        serving.poll(None)


# --------------------------------------------------------------------------
# The client side (crewletd, or a test driving a supervisor in-process)
# --------------------------------------------------------------------------

class ZygoteGone(Exception):
    """The zygote exited; pending forks fail with this."""


class ForkFailed(Exception):
    """The zygote could not fork (a process limit, memory)."""


class Zygote:
    """crewletd's handle on its zygote: start it, fork children, learn of exits.

    Invariants: ``_forks`` holds a future per fork request not yet answered;
    ``_exits`` holds a future per forked pid until its exit is reported and
    taken (:meth:`exit_of`).
    The zygote is (re)started lazily by :meth:`fork` when it is not running.
    """

    def __init__(self, *, title: str = "crewlet zygote", preload: tuple[str, ...] = DEFAULT_PRELOAD):
        self.title = title
        self.preload = preload
        self.pid: int | None = None
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        self._forks: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._reaping: set[asyncio.Task] = set()   # _end of a zygote that died, running

    def start(self) -> None:
        """Fork+exec the zygote (synchronous; safe from a threaded process)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env["CREWLET_ZYGOTE_TITLE"] = self.title
        env["CREWLET_ZYGOTE_PRELOAD"] = ",".join(self.preload)
        env[PARENT_ENV] = str(os.getpid())
        # The zygote imports what this process can import, wherever it came from.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        # Only its socket is passed on: no fd crewletd inherited leaks into the
        # zygote and so into every child. Its own process group keeps a
        # terminal's Ctrl-C (meant for crewletd) away from it.
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.zygote", str(theirs.fileno())], env=env,
            stdin=subprocess.DEVNULL, close_fds=True, pass_fds=(theirs.fileno(),),
            process_group=0)
        # Reaped by crewletd's reaper or by _reap, never through this object.
        proc.returncode = 0
        self.pid = proc.pid
        theirs.close()
        self._sock = ours

    def retitle(self, title: str) -> None:
        """Give the zygote (this one, and any started after it) *title*."""
        self.title = title
        if self._sock is not None:
            try:
                self._sock.send(msgpack.packb({"op": "title", "title": title}, use_bin_type=True))
            except OSError:
                pass  # it died: the next one is started with the title

    def kill(self) -> None:
        """SIGKILL the zygote and reap it (synchronous): for crewletd when it
        gives up before its loop ever ran (exit 78 on its config)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        pid, self.pid = self.pid, None
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass  # gone and reaped already

    def _ensure(self) -> socket.socket:
        if self._sock is None:
            self.start()
            asyncio.get_running_loop().add_reader(self._sock.fileno(), self._on_readable)
        return self._sock

    def attach(self) -> None:
        """Start reading the zygote's reports on the running loop."""
        assert self._sock is not None
        asyncio.get_running_loop().add_reader(self._sock.fileno(), self._on_readable)

    async def fork(self, target: str, kwargs: dict[str, Any], *, title: str, out_fd: int,
                   pdeathsig: int = signal.SIGTERM) -> int:
        """Fork a child that runs ``target(**kwargs)``; returns its pid.

        *out_fd* becomes the child's stdout and stderr; the caller still owns
        (and should close) its copy.
        """
        sock = self._ensure()
        req_id = next(self._ids)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._forks[req_id] = fut
        msg = {"op": "fork", "id": req_id, "target": target, "kwargs": kwargs,
               "title": title, "pdeathsig": int(pdeathsig)}
        try:
            socket.send_fds(sock, [msgpack.packb(msg, use_bin_type=True)], [out_fd])
        except OSError as exc:
            self._forks.pop(req_id, None)
            self._lost()
            raise ZygoteGone(f"zygote unreachable: {exc}") from exc
        return await fut

    def waits_for(self, pid: int) -> bool:
        """Is somebody waiting for *pid*'s exit (a child this zygote forked)?"""
        return pid in self._exits

    def reaped(self) -> None:
        """crewletd's reaper reaped the zygote: its pid is nobody's now."""
        self.pid = None

    def exit_of(self, pid: int) -> asyncio.Future[int]:
        """A future resolved with *pid*'s raw wait status when it exits.

        The exit may already have been reported (a child that died at once can
        have its ``exited`` read right after its ``forked``, before the forker
        resumed): the future is kept until asked for, then dropped once done.
        """
        fut = self._exits.get(pid)
        if fut is None:
            fut = self._exits[pid] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda _: self._exits.pop(pid, None))
        return fut

    def deliver_exit(self, pid: int, status: int) -> bool:
        """Report an exit learned elsewhere (crewletd's reaper reaping an orphan
        the zygote left behind). True if somebody was waiting for it."""
        fut = self._exits.pop(pid, None)
        if fut is not None and not fut.done():
            fut.set_result(status)
            return True
        return False

    def _on_readable(self) -> None:
        assert self._sock is not None
        try:
            data = self._sock.recv(_MAX_PACKET)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost()
            return
        msg = msgpack.unpackb(data, raw=False)
        if msg["op"] == "forked":
            fut = self._forks.pop(msg["id"], None)
            if fut is not None and not fut.done():
                if "error" in msg:
                    fut.set_exception(ForkFailed(msg["error"]))
                else:
                    fut.set_result(msg["pid"])
        elif msg["op"] == "exited":
            fut = self._exits.get(msg["pid"])
            if fut is None:
                fut = self._exits[msg["pid"]] = asyncio.get_running_loop().create_future()
            if not fut.done():
                fut.set_result(msg["status"])

    def _lost(self) -> None:
        """The zygote's socket closed: it died. Pending forks fail; children it
        leaves are orphans now, reported by whoever reaps them."""
        self._detach()
        for fut in self._forks.values():
            if not fut.done():
                fut.set_exception(ZygoteGone("zygote exited"))
        self._forks.clear()
        pid, self.pid = self.pid, None
        if pid is not None:
            # Its socket closed, so it is ending: reaped off the loop's path.
            reaping = asyncio.get_running_loop().create_task(_end(pid, 0.5))
            self._reaping.add(reaping)
            reaping.add_done_callback(self._reaping.discard)

    def close(self, timeout: float = 5.0) -> None:
        """:meth:`aclose`, for when no loop runs (crewletd after its loop ended):
        blocks up to *timeout* (+5 s after a SIGKILL)."""
        asyncio.run(self.aclose(timeout))

    async def aclose(self, timeout: float = 5.0) -> None:
        """Stop the zygote (it exits on its socket's EOF) and reap it, waiting
        up to *timeout* (then SIGKILL, and up to 5 s more) on the running
        loop, which goes on turning meanwhile: a zygote still importing its
        preloads (a node that fails at once) may take seconds to read its
        socket's EOF, and crewletd's watchdog would call a loop blocked that
        long wedged."""
        self._detach()
        pid, self.pid = self.pid, None
        if pid is not None:
            await _end(pid, timeout)

    def _detach(self) -> None:
        if self._sock is None:
            return
        try:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        except RuntimeError:
            pass  # no loop running: nothing was reading
        self._sock.close()
        self._sock = None

async def _end(pid: int, timeout: float) -> None:
    """Wait up to *timeout* for *pid* to exit (SIGKILL it after, and wait up to
    5 s more), then reap it, without blocking the loop: its pidfd is readable
    once it has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # exited and already reaped (crewletd's reaper got it)
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
    try:
        for wait, then_kill in ((timeout, True), (5.0, False)):
            try:
                async with asyncio.timeout(wait):
                    await asyncio.shield(ended)
                break
            except TimeoutError:
                if then_kill:
                    os.kill(pid, signal.SIGKILL)
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # reaped by crewletd's reaper


if __name__ == "__main__":
    main()
