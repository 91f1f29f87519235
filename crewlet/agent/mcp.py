"""A seat's stdio MCP servers: started with its lease, stopped with it.

Claiming a seat starts its ``seats[].mcp[]`` servers (DESIGN §5); their
tools join the seat's :class:`~crewlet.agent.tools.Registry` as
``<server>__<tool>`` (owner ``mcp:<server>``) while the server is up, and
leave it when it goes down. Releasing the seat stops them.

Each server lives in one long-lived task that holds the SDK's
``stdio_client`` and ``ClientSession`` contexts from start to end (anyio
cancel scopes must be entered and left in the same task); turns call its
tools from their own tasks through the session.

Processes: the SDK starts each server in a session and process group of its
own. We find its pid right after the spawn (our child carrying this
incarnation's ``CREWLET_MCP_ID``) and watch it with a pidfd, so a crash is
noticed when it happens, not at the next tool call. Whenever an incarnation
ends — a crash, a failed start, a stop — its tools leave the registry, the
SDK shuts the server down (stdin closed, then TERM, then KILL to the group),
and then the group is SIGKILLed: a server that exited by itself leaves its
own children running, and one that ignores SIGTERM would outlive the SDK.
A crashed or failed server is started again after a backoff (doubling from
``backoff_min`` to ``backoff_max``, back to the start after it stayed up
:data:`STABLE_AFTER` seconds).

Every server's environment carries ``CREWLET_SPAWNED_BY=<mark>`` and
``CREWLET_SEAT``: a seats role killed before it could stop its servers
leaves them to its successor's :func:`crewlet.agent.janitor.kill_marked`.

**Its stderr is its own.** Each incarnation's stderr is a pipe of its own
that this process reads (:class:`_Stderr`), never the seats role's own
stderr: crewletd parses that output as crewlet's own JSON log events
(:func:`crewlet.log.forward`), so a tool writing there could forge any
event at any level. Each line becomes an ``mcp_server_output`` event
(info) tagged with the seat and the server, its text a field — never parsed
— cut at :data:`OUTPUT_LINE_MAX` characters (``cut``), control characters
escaped (no terminal tricks in a text log), known secrets and credential
shapes redacted (:func:`crewlet.redaction.scrub`); at most
:data:`OUTPUT_LINES_PER_S` lines a second a server are logged, the rest
counted in the next one that is (``unlogged``).

Events: ``mcp_server_started``, ``mcp_server_exited``, ``mcp_server_failed``
(a start that did not come up), ``mcp_server_stopped``, ``mcp_tool_skipped``,
``mcp_server_output``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Sequence
from functools import partial
from typing import Any

import anyio
import mcp_types
import psutil
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

import crewlet
from crewlet import log, redaction
from crewlet.agent.janitor import SPAWNED_BY
from crewlet.agent.tools import Registry, Tool, ToolContext, ToolError
from crewlet.agent.types import TOOL_NAME_MAX
from crewlet.company.model import McpServer, SandboxPolicy, effective_sandbox
from crewlet.sandbox import Sandbox, SandboxError

# A server up this long is healthy: its next crash starts the backoff over.
STABLE_AFTER = 30.0
# Seconds one tool call may take before the turn gets an error result.
CALL_TIMEOUT = 120.0
# Where there is no pidfd (not Linux), how often a server's pid is looked at.
_WATCH_POLL = 0.5
# How long a SIGKILLed group may take to be gone, looked at this often: the
# kernel needs a moment to deliver it, nothing may ignore it.
_BURY_WAIT = 5.0
_BURY_POLL = 0.01
# How long a just-spawned server may take to show its environment (and so be
# found among our children), looked at this often.
_FIND_WAIT = 2.0
_FIND_POLL = 0.005
# Names this incarnation of a server in its environment, to find its pid.
_INSTANCE_ENV = "CREWLET_MCP_ID"
# Characters of one line of a server's stderr kept in its event (the rest of
# the line is dropped), and lines a second one server may log: a tool
# printing without end must not become the node's log.
OUTPUT_LINE_MAX = 2000
OUTPUT_LINES_PER_S = 50
# Bytes read from a server's stderr at a time; what is left in the pipe when
# an incarnation ends is read up to this many more.
_OUTPUT_READ = 65536
_OUTPUT_DRAIN = 1 << 20
# Control characters escaped in a line (tab kept): ANSI escapes, bells, CRs.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_-]")
# Who we are to a server (its logs may show it).
_CLIENT_INFO = mcp_types.Implementation(name="crewlet", version=crewlet.__version__)


def tool_name(server: str, tool: str) -> str:
    """The registry name of *server*'s *tool*: ``<server>__<tool>``, sanitized."""
    return _NOT_A_NAME.sub("_", f"{server}__{tool}")[:TOOL_NAME_MAX]


class SeatServers:
    """The MCP servers of one seat held by this process."""

    def __init__(self, seat: str, servers: Sequence[McpServer], registry: Registry, *,
                 mark: str, start_timeout: float = 20.0, backoff_min: float = 0.5,
                 backoff_max: float = 30.0, sandbox: Sandbox | None = None,
                 seat_sandbox: SandboxPolicy | None = None):
        self.seat = seat
        # Where the servers run (crewlet.sandbox); None: as this process's
        # children with nothing hidden (unit tests of the client alone).
        self.sandbox = sandbox
        self.seat_sandbox = seat_sandbox
        self.registry = registry
        self.mark = mark
        self.start_timeout = start_timeout
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self._servers = [_Server(self, spec) for spec in servers]

    async def start(self) -> None:
        """Spawn every server; return when each is up or its first start failed
        (a failed one keeps retrying with backoff in the background)."""
        for server in self._servers:
            server.launch()
        await asyncio.gather(*(server.first.wait() for server in self._servers))

    async def stop(self) -> None:
        """Stop every server and remove its tools; when this returns no process
        of any server's group is alive.

        Each server is first given the SDK's shutdown (stdin closed, up to
        2 s to exit, SIGTERM to its group, up to 2 s more, SIGKILL), then its
        group is SIGKILLed; servers stop concurrently, so a stop takes about
        4 s at worst."""
        await asyncio.gather(*(server.stop() for server in self._servers))

    def status(self) -> dict[str, dict[str, Any]]:
        """Per server: state (starting|up|backoff|refused|stopped), restarts,
        pid, pgid, confined, tools, last_error."""
        return {server.spec.name: server.status() for server in self._servers}


class _Server:
    """One server of a seat: its task, its current incarnation, its counters."""

    def __init__(self, seats: SeatServers, spec: McpServer):
        self.seats = seats
        self.spec = spec
        self.owner = f"mcp:{spec.name}"
        self.state = "stopped"
        self.restarts = 0
        self.pid: int | None = None
        self.tools: list[str] = []
        self.last_error: str | None = None
        self.first = asyncio.Event()     # the first start is over, up or not
        self._task: asyncio.Task | None = None
        self._scope: anyio.CancelScope | None = None
        self._stopping = False
        self._session: ClientSession | None = None
        self._up_since: float | None = None
        self._code: int | None = None
        self.confined: bool | None = None  # the running incarnation's (None: none runs)

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "restarts": self.restarts, "pid": self.pid,
                "confined": self.confined,
                "pgid": self.pid,  # start_new_session: the group is named after its leader
                "tools": list(self.tools), "last_error": self.last_error}

    def _fields(self) -> dict[str, Any]:
        return {"seat": self.seats.seat, "server": self.spec.name}

    def launch(self) -> None:
        if self._task is None:
            self._stopping = False
            self.first = asyncio.Event()  # a start after a stop waits for its own first start
            self.state = "starting"
            self._task = asyncio.create_task(self._life(),
                                             name=f"mcp {self.seats.seat}/{self.spec.name}")

    async def stop(self) -> None:
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()
        task, self._task = self._task, None
        if task is not None:
            await asyncio.shield(task)  # a cancelled caller must not leave the group alive
        self.state = "stopped"

    # ------------------------------------------------------------ the life

    async def _life(self) -> None:
        delay = self.seats.backoff_min
        spawns = 0
        try:
            while not self._stopping:
                self.restarts = spawns
                spawns += 1
                self.state = "starting"
                self._up_since = self._code = None
                failure: str | None = None
                with anyio.CancelScope() as self._scope:
                    try:
                        await self._incarnation()
                    except SandboxError as exc:
                        failure = str(exc)
                        refused = True
                    except Exception as exc:
                        failure = _describe(exc)
                        refused = False
                    else:
                        refused = False
                self._scope = None
                self._down()
                await self._bury()
                self.first.set()
                if self._stopping:
                    break
                if refused:
                    # Not a crash a retry could mend: the node's sandbox mode or
                    # the server's policy says no until the company or node changes.
                    self.state, self.last_error = "refused", failure
                    log.event("mcp_server_refused", "warning", **self._fields(), error=failure)
                    with anyio.CancelScope() as self._scope:
                        await anyio.sleep_forever()
                    self._scope = None
                    break
                up = self._up_since
                if up is not None and time.monotonic() - up >= STABLE_AFTER:
                    delay = self.seats.backoff_min
                if up is not None:
                    self.last_error = failure or f"exited with code {self._code}"
                    log.event("mcp_server_exited", "warning", **self._fields(), code=self._code,
                              restarts=self.restarts, error=failure, retry_in=delay)
                else:
                    self.last_error = failure or "exited before it was up"
                    log.event("mcp_server_failed", "warning", **self._fields(), error=self.last_error,
                              restarts=self.restarts, retry_in=delay)
                self.state = "backoff"
                with anyio.CancelScope() as self._scope:
                    await anyio.sleep(delay)
                self._scope = None
                delay = min(delay * 2, self.seats.backoff_max)
        finally:
            self._scope = None
            self._down()
            await self._bury()
            self.state = "stopped"
            self.first.set()
            log.event("mcp_server_stopped", "debug", **self._fields(), restarts=self.restarts)

    async def _incarnation(self) -> None:
        """Run the server once: returns when its process exited; raises when it
        could not be started (or the session broke)."""
        nonce = uuid.uuid4().hex
        # Built from nothing: the spec's env and our marks (the SDK adds HOME,
        # PATH and the like where these do not say; the sandbox sets its own).
        env = {**self.spec.env, SPAWNED_BY: self.seats.mark, "CREWLET_SEAT": self.seats.seat,
               _INSTANCE_ENV: nonce}
        box = self.seats.sandbox
        if box is not None:
            policy = effective_sandbox(self.seats.seat_sandbox, self.spec.sandbox)
            launch = await asyncio.to_thread(box.wrap, [self.spec.command, *self.spec.args], env,
                                             self.seats.seat, policy)
            self.confined = launch.confined
            params = StdioServerParameters(command=launch.argv[0], args=launch.argv[1:], env=launch.env,
                                           cwd=launch.cwd)
        else:
            params = StdioServerParameters(command=self.spec.command, args=list(self.spec.args), env=env)
        errors = _Stderr(self._fields())
        client = stdio_client(params, errlog=errors.file)
        process = None
        try:
            async with client as (read, write):
                errors.spawned()
                process = _sdk_process(client)
                # The SDK's own process when it can be seen (no scan of our
                # children, which blocks the loop at thousands of seats).
                self.pid = getattr(process, "pid", None) or await _spawned(nonce)
                if self.pid is None:
                    raise RuntimeError("the server process exited at once")
                async with ClientSession(read, write, client_info=_CLIENT_INFO) as session:
                    try:
                        with anyio.fail_after(self.seats.start_timeout):
                            await session.initialize()
                            listed = await _list_tools(session)
                    except TimeoutError:
                        raise RuntimeError(f"not up within {self.seats.start_timeout:g}s") from None
                    self._adopt(session, listed)
                    log.event("mcp_server_started", **self._fields(), server_pid=self.pid,
                              tools=len(self.tools), restarts=self.restarts)
                    await _exited(self.pid)
                    self._down()  # at once, for the turns calling it; the SDK's shutdown follows
        finally:
            errors.close()  # its last words read: the SDK has stopped it
            self._code = getattr(process, "returncode", None)

    def _adopt(self, session: ClientSession, listed: list[mcp_types.Tool]) -> None:
        self._session = session
        for tool in listed:
            name = tool_name(self.spec.name, tool.name)
            try:
                self.seats.registry.add(Tool(
                    name=name, description=tool.description or tool.title or tool.name,
                    parameters=tool.input_schema, run=partial(self._call, tool.name), owner=self.owner))
            except ValueError as exc:
                log.event("mcp_tool_skipped", "warning", **self._fields(), tool=tool.name, error=str(exc))
                continue
            self.tools.append(name)
        self._up_since = time.monotonic()
        self.state = "up"
        self.first.set()

    def _down(self) -> None:
        """This incarnation's tools leave the registry; calls find it down."""
        self._session = None
        if self.tools:
            self.seats.registry.remove_owner(self.owner)
            self.tools = []
        if self.state == "up":
            self.state = "backoff"

    async def _bury(self) -> None:
        """SIGKILL the ended incarnation's process group and wait until none of
        it runs — nor anything it started in a session of its own (a confined
        server runs in bubblewrap's new session and pid namespace, which the
        kernel kills once bubblewrap is gone, in its own time: on a loaded
        machine a few ms after). Once only: a pgid kept longer could name
        another group one day."""
        pgid, self.pid = self.pid, None
        if pgid is None:
            return
        tree = _descendants(pgid)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + _BURY_WAIT
        while _group_running(pgid) or _any_running(tree):
            if time.monotonic() > deadline:
                log.event("mcp_server_unkillable", "error", **self._fields(), pgid=pgid)
                return
            await asyncio.sleep(_BURY_POLL)

    # ------------------------------------------------------------ calls

    async def _call(self, tool: str, ctx: ToolContext, args: dict[str, Any]) -> str:
        session = self._session
        if session is None:
            raise ToolError(f"mcp server {self.spec.name} is down")
        try:
            result = await session.call_tool(tool, args, read_timeout_seconds=CALL_TIMEOUT)
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                raise ToolError(f"mcp server {self.spec.name} is down") from None
            raise ToolError(f"mcp server {self.spec.name}: {exc.message}") from None
        text = _text_of(result)
        if result.is_error:
            raise ToolError(text or f"{tool} failed")
        return text


# ------------------------------------------------------------------ helpers

async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _text_of(result: mcp_types.CallToolResult) -> str:
    """A tool result as the text a model reads."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource):
            res = block.resource
            parts.append(res.text if isinstance(res, mcp_types.TextResourceContents)
                         else f"[resource {res.uri} ({res.mime_type or 'binary'})]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource {block.uri}]")
        else:  # image, audio: named, not inlined
            parts.append(f"[{block.type} {getattr(block, 'mime_type', '')}]".replace(" ]", "]"))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


async def _spawned(nonce: str) -> int | None:
    """The pid of our child started with ``CREWLET_MCP_ID=<nonce>``.

    The SDK does not hand out its process. Its spawn returns as soon as the
    child is past the point of no return in exec, which can be before the
    kernel shows the new environment (measured under load: an empty
    environ for a few ms), so a child not found yet is looked for again.
    """
    deadline = time.monotonic() + _FIND_WAIT
    while True:
        for child in psutil.Process().children():
            try:
                if child.environ().get(_INSTANCE_ENV) == nonce:
                    return child.pid
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(_FIND_POLL)


def _sdk_process(client: Any) -> Any:
    """The SDK's own process object inside a live ``stdio_client`` context, if
    it can be seen — read for the exit code only, which nothing else keeps
    once the event loop has reaped the process."""
    frame = getattr(getattr(client, "gen", None), "ag_frame", None)
    return frame.f_locals.get("process") if frame is not None else None


async def _exited(pid: int) -> None:
    """Return when process *pid* (our child) has exited.

    A pidfd becomes readable the moment the process ends, so the event loop
    hears of it without polling; elsewhere, look every :data:`_WATCH_POLL` s.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        while _alive(pid):
            await asyncio.sleep(_WATCH_POLL)
        return
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _descendants(pid: int) -> list[tuple[int, float]]:
    """Every process *pid* started, and theirs: ``(pid, create time)``."""
    try:
        return [(p.pid, p.create_time()) for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _any_running(tree: list[tuple[int, float]]) -> bool:
    """Does a process of *tree* still run (the same process: its create time)?"""
    for pid, created in tree:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def _group_running(pgid: int) -> bool:
    """Does a process of group *pgid* still run? (Zombies do not: they are
    dead, waiting for a parent to reap them — maybe init, in its own time.)"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


class _Stderr:
    """One incarnation's stderr: a pipe read on the loop, each line logged as
    an ``mcp_server_output`` event of its seat and server (see the module's
    manual). :attr:`file` is the write end the SDK hands the process;
    :meth:`spawned` lets go of ours once the process holds its own, so the
    read end ends when the process (and whatever it started) is gone."""

    def __init__(self, fields: dict[str, Any]):
        self._fields = fields
        read, write = os.pipe()  # both close-on-exec: the child gets a dup as its fd 2
        os.set_blocking(read, False)
        self.file = os.fdopen(write, "w")
        self._fd: int | None = read
        self._line = bytearray()
        self._cut = False        # the line being read passed OUTPUT_LINE_MAX: the rest is dropped
        self._second = 0         # the second lines are being counted in
        self._logged = 0         # lines logged in it
        self._unlogged = 0       # lines not logged since the last one that was
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(read, self._read)

    def spawned(self) -> None:
        self.file.close()

    def close(self) -> None:
        """Read what is left (bounded), log the unfinished line, let go."""
        self.file.close()
        fd, self._fd = self._fd, None
        if fd is None:
            return
        self._loop.remove_reader(fd)
        try:
            left = _OUTPUT_DRAIN
            while left > 0:
                chunk = os.read(fd, min(_OUTPUT_READ, left))
                if not chunk:
                    break
                left -= len(chunk)
                self._take(chunk)
        except OSError:  # BlockingIOError: nothing more now (a grandchild still holds it)
            pass
        finally:
            os.close(fd)
        if self._line and not self._cut:
            self._emit(bytes(self._line), cut=False)
        if self._unlogged:
            log.event("mcp_server_output", **self._fields, line="", unlogged=self._unlogged)

    def _read(self) -> None:
        if self._fd is None:
            return
        try:
            chunk = os.read(self._fd, _OUTPUT_READ)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            self._take(chunk)
        else:  # every writer is gone; close() logs the unfinished line
            self._loop.remove_reader(self._fd)

    def _take(self, chunk: bytes) -> None:
        for n, piece in enumerate(chunk.split(b"\n")):
            if n:  # a newline ended the line before this piece
                if not self._cut:
                    self._emit(bytes(self._line), cut=False)
                self._line.clear()
                self._cut = False
            if self._cut:
                continue
            self._line += piece
            if len(self._line) > OUTPUT_LINE_MAX:
                self._emit(bytes(self._line[:OUTPUT_LINE_MAX]), cut=True)
                self._line.clear()
                self._cut = True

    def _emit(self, raw: bytes, *, cut: bool) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return
        now = int(time.monotonic())
        if now != self._second:
            self._second, self._logged = now, 0
        if self._logged >= OUTPUT_LINES_PER_S:
            self._unlogged += 1
            return
        self._logged += 1
        fields: dict[str, Any] = {}
        if cut:
            fields["cut"] = True
        if self._unlogged:
            fields["unlogged"], self._unlogged = self._unlogged, 0
        text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
        log.event("mcp_server_output", **self._fields, line=redaction.scrub(text)[:OUTPUT_LINE_MAX], **fields)


def _describe(exc: BaseException) -> str:
    """One line for an error; the SDK's task groups wrap the real cause."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
