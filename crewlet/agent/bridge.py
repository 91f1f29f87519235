"""The tool bridge: a seat's own tools served to its CLI agent over MCP (DESIGN §14).

A CLI agent in agent mode (``claude -p``, ``codex exec``, any MCP client) is a
program crewlet does not control, steered by model output. It reaches
crewlet's state through crewlet's own tools and no other way: the seats
process serves them as an MCP server (streamable HTTP, the ``mcp`` SDK's
server) and the agent calls them back through it.

Usage — one :class:`Bridge` per seats process, one grant per turn::

    bridge = Bridge()
    await bridge.start(socket_path="<run dir>/bridge.sock")   # 127.0.0.1:<any port>, and the socket
    ...
    with bridge.grant(seat="cto", token=7, trigger="m-41", registry=reg, services=services,
                      fence=lambda: holds("cto", 7), deadline=time.monotonic() + 300) as grant:
        config = bridge.config_file(grant, folder)    # {"mcpServers": {"crewlet": ...}}, mode 0600
        env = grant.env()                             # CREWLET_MCP_BRIDGE_URL / _TOKEN / _SOCKET
        ... run the agent, pointed at config or env ...
    # revoked here: its token answers 401 from now on, its config file is gone
    await bridge.close()

The seats role hands a turn's grant to its CLI agent on the turn's
:class:`crewlet.sandbox.Seat` (``grant``), set for the turn's length only
(:func:`crewlet.sandbox.turn`); the CLI provider writes the config and the
environment from it (:mod:`crewlet.agent.providers.cli`). Nothing of the
bridge is process-wide state a provider looks up.

What a grant is. A capability for one turn: a random secret (32 bytes,
URL-safe base64) bound to the seat, its fencing token, the turn's trigger and
the seat's :class:`~crewlet.agent.tools.Registry`. The agent presents it as
``Authorization: Bearer <secret>``; there is no other way to name a seat, so a
token can act as its own seat only. A grant dies when it is revoked (the end
of its turn) or at its deadline, whichever comes first; then its token
answers HTTP 401. Revoking also cancels the grant's calls still running (the
agent gets an error result, if it still listens) and deletes the config files
:meth:`Bridge.config_file` wrote for it. Grants left unrevoked past their
deadline are purged as new ones are made.

The bridge keeps no secret: it keeps the SHA-256 of each and finds a
presented token by the hash of what was presented, so neither a comparison's
time nor the bridge's memory tells anything of a live secret. The caller
holds the secret (on the :class:`Grant` it got) and hands it to the agent.
No secret is ever logged.

What is offered. ``tools/list`` answers the grant's registry's **built-in**
tools (owner ``"builtin"``: send, notify, the estate's tracker, knowledge
base, files and notes), with their descriptions and JSON schemas. The seat's
own MCP servers' tools (owner ``mcp:<server>``) are neither listed nor
callable here: they are third-party programs, not crewlet's tools, and the
bridge is the agent's way to crewlet's own state and to nothing else.

A call. ``tools/call`` runs ``registry.call`` — argument checks, a tool's
refusal and a bug all come back as an error *result* the agent reads — with a
:class:`~crewlet.agent.tools.ToolContext` of the grant's seat, trigger and
token, the grant's services and deadline, and the call key
``<trigger>.bridge.<n>``, where *n* counts the grant's ``tools/call``
requests from 0 in the order they arrive (the refused ones too; listing does
not count): a redone turn whose agent makes the
same calls in the same order keys them the same (so ``send`` lands once, an
estate write applies once). Before each call the grant's ``fence()`` is asked
whether this node still holds the seat under the grant's token; if not (or
if it raises) the call is refused with an error result saying the seat is
fenced, and the grant is revoked: its later requests get 401. A call runs at
most until the grant's deadline.

Refusals, in order, and what the client sees:

==========================  ===============================================
no/unknown/revoked token    401 (``WWW-Authenticate: Bearer``), before any MCP
expired grant               401, and the grant is revoked
a path but ``/mcp``         404
GET, DELETE, …              405: there is no stream of the server's own and
                            no session to end (the spec's answer for both)
a bad Host or any Origin    421 / 403 (the SDK's DNS-rebinding guard: an
                            agent is no browser)
a tool not built in         error result: unknown tool, and what there is
the seat fenced             error result: the seat is fenced; grant revoked
==========================  ===============================================

Transport. The server listens on ``127.0.0.1`` only (any other host is
refused), on the port given (0: any free one), and optionally on a unix
socket, for sandboxes with no network: the socket file is bind-mounted into
the sandbox and the agent's HTTP client speaks to it (any URL host of
``localhost`` or ``127.0.0.1``). The socket is made mode 0600 unless the
caller says otherwise (a tool dropped to another uid needs ``0o666``: the
token is the gate; the mode is set just after the bind, so keep the socket
in a directory only the node and the sandbox can enter). The config file
names the TCP URL: the common ``mcpServers`` shape has no unix socket, and
an agent behind ``--unshare-net`` needs a client (or a stdio shim) that
speaks HTTP to ``CREWLET_MCP_BRIDGE_SOCKET``. The SDK's session manager runs
*stateless* with JSON answers: every POST is one exchange, nothing of a
connection outlives it, so a revoked token has no session left to ride and
nothing needs reaping.

Cost: a call's round trip on loopback is about 1 ms (measured, client
included: mostly the SDK's per-request exchange), beside the tool's own time.

Everything here runs on the event loop the bridge was started on: grant,
revoke and config_file are called from it.

Events: ``bridge_started`` (url, socket), ``bridge_refused`` (reason, and
seat/trigger/tool when known; at most :data:`REFUSALS_LOGGED` a second, the
rest counted in the next one), ``bridge_stopped``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import socket
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import mcp_types
import uvicorn
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
# What uvicorn imports when a server starts: imported here so the zygote
# preloads it and a seats process's first turn does not pay for it.
import uvicorn.lifespan.off  # noqa: F401
import uvicorn.protocols.http.auto  # noqa: F401

import crewlet
from crewlet import log, redaction, webserver
from crewlet.agent.tools import Registry, Tool, ToolContext

# The only TCP address the bridge listens on: an agent runs on this machine.
LOOPBACK = "127.0.0.1"
# The MCP endpoint's path, and the server's name in a client's config file.
PATH = "/mcp"
SERVER_NAME = "crewlet"
# The owner of the tools the bridge offers (crewlet.agent.tools.Tool.owner).
BUILTIN = "builtin"
# Bytes of randomness in a grant's secret: 256 bits, never guessed.
SECRET_BYTES = 32
# A presented token longer than this is refused unhashed (a secret is 43 chars).
TOKEN_MAX = 128
# Environment variables of grant.env(): what a CLI provider passes its agent.
ENV_URL = "CREWLET_MCP_BRIDGE_URL"
ENV_TOKEN = "CREWLET_MCP_BRIDGE_TOKEN"
ENV_SOCKET = "CREWLET_MCP_BRIDGE_SOCKET"
# Seconds an idle keep-alive connection stays open: longer than any client's
# pool keeps one, so the client closes first and a call is never sent on a
# connection the server is closing (as roles.ingress.KEEP_ALIVE).
KEEP_ALIVE = 75
# Seconds close() lets calls in flight finish before their connections are cut.
GRACE = 2.0
# Refusals logged a second at most: anything on the machine can knock, and a
# flood of bad tokens must not become a flood of log lines.
REFUSALS_LOGGED = 20
# Grants kept before expired ones are purged (then twice as many as are live).
PURGE_AT = 256

# Where the ASGI layer leaves a request's grant for the MCP handlers (the
# SDK hands them the Starlette request, whose scope is the same dict).
_SCOPE_KEY = "crewlet.bridge.grant"


@dataclass(eq=False)
class _Entry:
    """What the bridge keeps of a grant: everything but its secret."""

    key: bytes                          # sha256 of the secret
    seat: str
    token: int
    trigger: str
    registry: Registry
    services: Any
    fence: Callable[[], bool]
    deadline: float | None
    calls: int = 0                      # tools/call requests so far: the next call's n
    revoked: bool = False
    running: set[asyncio.Task] = field(default_factory=set)
    files: list[str] = field(default_factory=list)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


class Grant:
    """One turn's capability: hand :attr:`secret` (or :meth:`env`, or a
    :meth:`Bridge.config_file`) to the agent; revoke it when the turn ends
    (``bridge.revoke(grant)``, or use it as a context manager)."""

    __slots__ = ("secret", "url", "socket_path", "id", "_bridge", "_entry")

    def __init__(self, bridge: Bridge, entry: _Entry, secret: str) -> None:
        self.secret = secret
        self.url = bridge.url
        self.socket_path = bridge.socket_path
        self.id = secrets.token_hex(6)  # names its config files; not derived from the secret
        self._bridge = bridge
        self._entry = entry

    @property
    def seat(self) -> str:
        return self._entry.seat

    @property
    def token(self) -> int:
        return self._entry.token

    @property
    def trigger(self) -> str:
        return self._entry.trigger

    @property
    def deadline(self) -> float | None:
        return self._entry.deadline

    @property
    def live(self) -> bool:
        """Not revoked and not past its deadline."""
        return not self._entry.revoked and not self._entry.expired(time.monotonic())

    def env(self) -> dict[str, str]:
        """The environment that points an agent at the bridge under this grant."""
        env = {ENV_URL: self.url, ENV_TOKEN: self.secret}
        if self.socket_path:
            env[ENV_SOCKET] = self.socket_path
        return env

    def config_file(self, directory: str, owner: int | None = None) -> str:
        """:meth:`Bridge.config_file` of this grant."""
        return self._bridge.config_file(self, directory, owner)

    def __enter__(self) -> Grant:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bridge.revoke(self)

    def __repr__(self) -> str:  # never the secret
        return f"<Grant {self.id} seat={self.seat} trigger={self.trigger} {'live' if self.live else 'dead'}>"


class Bridge:
    """The seats process's MCP server of its seats' own tools."""

    def __init__(self) -> None:
        self._entries: dict[bytes, _Entry] = {}
        self._purge_at = PURGE_AT
        self._port: int | None = None
        self._socket_path: str | None = None
        self._socket_ino: int | None = None
        self._http: webserver.Server | None = None
        self._manager: StreamableHTTPSessionManager | None = None
        self._task: asyncio.Task | None = None
        self._window = 0          # the second refusals are being counted in
        self._logged = 0          # refusals logged in it
        self._unlogged = 0        # refusals not logged since the last one that was
        self._mcp = Server(SERVER_NAME, version=crewlet.__version__,
                           on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        # No OpenTelemetry span a message: nothing here exports them, and the
        # middleware is on every call's path.
        self._mcp.middleware = []

    # ------------------------------------------------------------ life

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the bridge is not started")
        return f"http://{LOOPBACK}:{self._port}{PATH}"

    @property
    def socket_path(self) -> str | None:
        return self._socket_path

    async def start(self, host: str = LOOPBACK, port: int = 0, socket_path: str | None = None, *,
                    socket_mode: int = 0o600) -> None:
        """Listen on *host*:*port* (127.0.0.1 only; port 0: any free one) and,
        given *socket_path*, on a unix socket there, made *socket_mode* (a
        socket file nobody listens on is replaced; a live one, or anything
        else there, is a FileExistsError)."""
        if host != LOOPBACK:
            raise ValueError(f"the tool bridge listens on {LOOPBACK} only, not {host!r}")
        if self._task is not None:
            raise RuntimeError("the bridge is started already")
        socks: list[socket.socket] = []
        try:
            # proto given: asyncio sets TCP_NODELAY on what it accepts only then,
            # and without it an answer's second write waits out a delayed ACK (40 ms).
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            socks.append(tcp)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind((LOOPBACK, port))
            tcp.listen(128)
            if socket_path is not None:
                socks.append(self._bind_unix(socket_path, socket_mode))
        except BaseException:
            for sock in socks:
                sock.close()
            self._unlink_socket()
            raise
        self._port = tcp.getsockname()[1]
        hosts = [f"{LOOPBACK}:{self._port}", f"localhost:{self._port}"]
        if socket_path is not None:
            hosts += [LOOPBACK, "localhost"]  # a unix-socket client's URL names no port
        manager = StreamableHTTPSessionManager(
            app=self._mcp, json_response=True, stateless=True,
            security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=[]))
        config = uvicorn.Config(self._asgi, interface="asgi3", lifespan="off", log_config=None,
                                access_log=False, proxy_headers=False, server_header=False, ws="none",
                                timeout_keep_alive=KEEP_ALIVE, timeout_graceful_shutdown=GRACE)
        self._http = webserver.Server(config)
        self._manager = manager
        self._task = asyncio.create_task(self._serve(manager, socks), name="tool bridge")
        listening = asyncio.create_task(self._http.listening.wait())
        await asyncio.wait({self._task, listening}, return_when=asyncio.FIRST_COMPLETED)
        if not self._http.listening.is_set():
            listening.cancel()
            for sock in socks:
                sock.close()
            self._unlink_socket()
            self._task.result()  # raises what stopped it
            raise RuntimeError("the tool bridge could not start")
        log.event("bridge_started", url=self.url, socket=self._socket_path)

    async def _serve(self, manager: StreamableHTTPSessionManager, socks: list[socket.socket]) -> None:
        # One task holds the SDK's task group from start to end (anyio cancel
        # scopes must be left in the task that entered them).
        assert self._http is not None
        async with manager.run():
            await self._http.serve(sockets=socks)

    def _bind_unix(self, path: str, mode: int) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise FileExistsError(f"{path} exists and is not a socket")
            if _listened(path):
                raise FileExistsError(f"{path} is in use: another server listens on it")
            os.unlink(path)  # a socket left by a process gone: ours to replace
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, mode)
            self._socket_path = path
            self._socket_ino = os.lstat(path).st_ino
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        return sock

    def _unlink_socket(self) -> None:
        path, self._socket_path = self._socket_path, None
        if path is None:
            return
        with contextlib.suppress(OSError):
            if os.lstat(path).st_ino == self._socket_ino:  # not a successor's
                os.unlink(path)

    async def close(self) -> None:
        """Revoke every grant, stop serving, remove the socket file."""
        for entry in list(self._entries.values()):
            self._revoke(entry)
        if self._task is not None and self._http is not None:
            self._http.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
        self._unlink_socket()
        if self._task is not None:
            log.event("bridge_stopped")
        self._task = None

    # ------------------------------------------------------------ grants

    def grant(self, *, seat: str, token: int, trigger: str, registry: Registry, services: Any,
              fence: Callable[[], bool], deadline: float | None) -> Grant:
        """A capability for one turn of *seat* (see the module's manual).

        *token* is the seat's fencing token, *trigger* the turn's trigger id
        (the call keys' prefix), *services* what the tools' ToolContext
        carries; *fence* answers, synchronously and fast, whether this node
        still holds the seat under *token*: a call runs only when it returns
        ``True`` itself (anything else, an exception or a coroutine of an async
        callable by mistake, fences the seat); *deadline* is the turn's
        ``time.monotonic()`` deadline (None: until revoked).
        """
        if self._port is None:
            raise RuntimeError("the bridge is not started")
        if len(self._entries) >= self._purge_at:
            self._purge()
        secret = secrets.token_urlsafe(SECRET_BYTES)
        entry = _Entry(key=_hash(secret), seat=seat, token=token, trigger=trigger, registry=registry,
                       services=services, fence=fence, deadline=deadline)
        self._entries[entry.key] = entry
        return Grant(self, entry, secret)

    def revoke(self, grant: Grant) -> None:
        """End *grant*: its token answers 401, its running calls are cancelled,
        its config files are deleted. Idempotent."""
        self._revoke(grant._entry)

    def config_file(self, grant: Grant, directory: str, owner: int | None = None) -> str:
        """Write an MCP client config naming the bridge under *grant* into
        *directory* (mode 0600, a fresh name, *owner*'s uid and gid when
        given: a confined agent's own); its path. Deleted on revoke."""
        if not grant.live:
            raise ValueError("the grant is revoked or expired")
        path = os.path.join(directory, f"crewlet-mcp-{grant.id}.json")
        body = json.dumps({"mcpServers": {SERVER_NAME: {
            "type": "http", "url": grant.url,
            "headers": {"Authorization": f"Bearer {grant.secret}"}}}}, indent=2)
        # O_EXCL: never through a symlink or into a file someone else made.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if owner is not None:
                os.fchown(fd, owner, owner)
            os.write(fd, body.encode())
        finally:
            os.close(fd)
        grant._entry.files.append(path)
        return path

    def _revoke(self, entry: _Entry) -> None:
        entry.revoked = True
        self._entries.pop(entry.key, None)
        for task in entry.running:
            task.cancel()
        for path in entry.files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        entry.files.clear()

    def _purge(self) -> None:
        now = time.monotonic()
        for entry in [e for e in self._entries.values() if e.expired(now)]:
            self._revoke(entry)
        self._purge_at = max(PURGE_AT, 2 * len(self._entries))

    # ------------------------------------------------------------ HTTP

    async def _asgi(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        entry, why = self._authenticate(scope["headers"])
        if entry is None:
            self._refused(why, entry=None)
            await _answer(send, 401, {"error": "invalid_token",
                                      "error_description": "unknown, revoked or expired token"},
                          [(b"www-authenticate", b'Bearer realm="crewlet", error="invalid_token"')])
            return
        if scope["path"] != PATH:
            await _answer(send, 404, {"error": "not_found",
                                      "error_description": f"the MCP endpoint is {PATH}"})
            return
        if scope["method"] != "POST":
            # No stream of the server's own (GET) and no session to end
            # (DELETE): the spec's answer for both is 405. A GET let through
            # would hold an empty SSE stream open for as long as the agent lives.
            await _answer(send, 405, {"error": "method_not_allowed",
                                      "error_description": "this server takes POST only"},
                          [(b"allow", b"POST")])
            return
        scope[_SCOPE_KEY] = entry
        assert self._manager is not None  # serving means started
        await self._manager.handle_request(scope, receive, send)

    def _authenticate(self, headers: list[tuple[bytes, bytes]]) -> tuple[_Entry | None, str]:
        value = next((v for k, v in headers if k == b"authorization"), None)
        if value is None:
            return None, "no token"
        scheme, _, secret = value.partition(b" ")
        if scheme.lower() != b"bearer" or not secret or len(secret) > TOKEN_MAX:
            return None, "not a bearer token"
        entry = self._entries.get(hashlib.sha256(secret.strip()).digest())
        if entry is None:
            return None, "unknown or revoked token"
        if entry.expired(time.monotonic()):
            self._revoke(entry)
            self._refused("expired", entry=entry)
            return None, ""  # logged just now, with its seat
        return entry, ""

    def _refused(self, reason: str, *, entry: _Entry | None, **fields: Any) -> None:
        if not reason:
            return
        now = int(time.monotonic())
        if now != self._window:
            self._window, self._logged = now, 0
        if self._logged >= REFUSALS_LOGGED:
            self._unlogged += 1
            return
        self._logged += 1
        if entry is not None:
            fields.update(seat=entry.seat, trigger=entry.trigger)
        if self._unlogged:
            fields["unlogged"], self._unlogged = self._unlogged, 0
        log.event("bridge_refused", reason=reason, **fields)

    # ------------------------------------------------------------ MCP

    async def _list_tools(self, ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        entry = _entry_of(ctx)
        return mcp_types.ListToolsResult(tools=[
            mcp_types.Tool(name=t.name, description=t.description, input_schema=t.parameters)
            for t in _offered(entry.registry)])

    async def _call_tool(self, ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        entry = _entry_of(ctx)
        name = params.name
        if entry.revoked or entry.expired(time.monotonic()):
            # Revoked after this request was let in (the turn ended meanwhile).
            return _result("this turn is over: its tools are closed", True)
        n = entry.calls
        entry.calls += 1
        tool = _builtin(entry.registry, name)
        if tool is None:
            self._refused("not offered", entry=entry, tool=name)
            offered = ", ".join(t.name for t in _offered(entry.registry)) or "none"
            return _result(f"unknown tool {name!r}; tools: {offered}", True)
        try:
            held = entry.fence() is True
        except Exception as exc:  # an unanswerable fence is a lost one
            log.event("bridge_fence_failed", "warning", seat=entry.seat, error=f"{type(exc).__name__}: {exc}")
            held = False
        if not held:
            self._revoke(entry)
            self._refused("fenced", entry=entry, tool=name)
            return _result(f"refused: seat {entry.seat} is fenced (this node no longer holds it under "
                           f"token {entry.token}); this turn is over and nothing was done", True)
        call = ToolContext(seat=entry.seat, trigger=entry.trigger, token=entry.token,
                           call_key=f"{entry.trigger}.bridge.{n}", services=entry.services,
                           deadline=entry.deadline)
        # As a turn's own calls (crewlet.agent.turn): no known secret goes in
        # (an agent holds its own key) nor comes back out.
        args = redaction.scrub_value(params.arguments or {})
        task = asyncio.ensure_future(_bounded(entry.registry, call, name, args))
        entry.running.add(task)
        try:
            text, error = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the request itself is being cancelled (the client went away)
            return _result(f"{name} was stopped: this turn is over", True)
        finally:
            entry.running.discard(task)
        return _result(redaction.scrub(text), error)


# ------------------------------------------------------------------ helpers

def _listened(path: str) -> bool:
    """Whether a server listens on the unix socket at *path* (a live one is
    never taken over: its clients would be talking to us)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
        return True
    except OSError:  # refused: nobody is there
        return False
    finally:
        probe.close()


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def _entry_of(ctx: Any) -> _Entry:
    # The ASGI layer put it there for every request it let through.
    return ctx.request.scope[_SCOPE_KEY]


def _offered(registry: Registry) -> list[Tool]:
    """The registry's built-in tools, by name."""
    tools = registry._tools  # noqa: SLF001 — the registry has no accessor by owner
    return [tools[name] for name in sorted(tools) if tools[name].owner == BUILTIN]


def _builtin(registry: Registry, name: str) -> Tool | None:
    tool = registry._tools.get(name)  # noqa: SLF001
    return tool if tool is not None and tool.owner == BUILTIN else None


async def _bounded(registry: Registry, call: ToolContext, name: str, args: Any) -> tuple[str, bool]:
    """``registry.call``, ended at the turn's deadline."""
    left = call.time_left()
    if left is None:
        return await registry.call(call, name, args)
    try:
        async with asyncio.timeout(left):
            return await registry.call(call, name, args)
    except TimeoutError:
        return f"{name} was stopped: the turn's time ran out", True


def _result(text: str, error: bool) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(content=[mcp_types.TextContent(text=text)], is_error=error)


async def _answer(send: Callable, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data})
