"""``/v1/mcp``: the operator MCP server (:mod:`crewlet.operator`) over
streamable HTTP, for an operator's agent holding an API token.

A request shows its token as every ``/v1`` request does
(``Authorization: Bearer``); one this node does not know is a 401 before
any MCP is read. Its tool calls are then API requests made with that same
token to this node's own API (over loopback, as any client's), so each is
held to the token's scopes, the API's checks and its limits — a read token's
agent can list and read, not write. Stateless JSON answers: no session, no
stream of the server's own (a GET or DELETE is a 405).

The MCP SDK is loaded at the first request that passes those checks, not
when ingress starts: its import is ~0.35 s of CPU, a third of what a node's
zygote preloads, and most nodes are never asked (that request waits for it,
up to :data:`START_WAIT`).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import Any, Callable

from crewlet.tokens import Keyring

PATH = "/v1/mcp"
_TOKEN = "crewlet.operator_token"  # where a request's token waits for its tool calls (the ASGI scope)
TOKEN_MAX = 512
# Seconds the first request waits for the SDK to load and the server to start
# before it is answered 503 (it takes ~0.5 s; a loaded machine, a few).
START_WAIT = 15.0


def _load_sdk() -> tuple[Any, ...]:
    """The SDK's parts this endpoint uses (imported in a worker thread: the loop goes on)."""
    httpx2 = importlib.import_module("httpx2")
    manager = importlib.import_module("mcp.server.streamable_http_manager")
    security = importlib.import_module("mcp.server.transport_security")
    operator = importlib.import_module("crewlet.operator.server")
    return (httpx2, manager.StreamableHTTPSessionManager, security.TransportSecuritySettings,
            operator.OperatorServer, operator.CALL_TIMEOUT)


def own_url(listen: str) -> str:
    """This node's API as a client on this machine reaches it."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class McpEndpoint:
    """The ASGI app at :data:`PATH`. :meth:`run` must run while it serves
    (the SDK's task group)."""

    def __init__(self, openapi: Callable[[], dict[str, Any]], keyring: Keyring | None, listen: str):
        self._openapi = openapi
        self.keyring = keyring
        self.base_url = own_url(listen)
        self._server = None    # the OperatorServer, once the SDK is loaded
        self._manager = None   # the SDK's StreamableHTTPSessionManager, likewise
        self._wanted = asyncio.Event()   # set by the first request: load and start
        self._ready = asyncio.Event()

    async def run(self) -> None:
        await self._wanted.wait()
        httpx2, Manager, Security, OperatorServer, call_timeout = await asyncio.to_thread(_load_sdk)
        async with httpx2.AsyncClient(base_url=self.base_url, timeout=call_timeout, trust_env=False) as client:
            self._server = OperatorServer(self._openapi, client, lambda ctx: ctx.request.scope.get(_TOKEN))
            # Token-gated, so no browser can drive it unasked (a page cannot set the
            # header): the SDK's Host and Origin guard would only refuse a proxy's Host.
            self._manager = Manager(
                app=self._server.mcp, json_response=True, stateless=True,
                security_settings=Security(enable_dns_rebinding_protection=False))
            async with self._manager.run():
                self._ready.set()
                await asyncio.Event().wait()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        token = _bearer(scope.get("headers") or [])
        if token is None or self.keyring is None or self.keyring.check(token) is None:
            await _answer(send, 401, "unauthorized", "an API token is needed: Authorization: Bearer <token>",
                          [(b"www-authenticate", b'Bearer realm="crewlet"')])
            return
        if scope["method"] != "POST":
            await _answer(send, 405, "method_not_allowed", "this MCP endpoint takes POST only (stateless JSON)",
                          [(b"allow", b"POST")])
            return
        if not self._ready.is_set():
            self._wanted.set()
            try:
                async with asyncio.timeout(START_WAIT):
                    await self._ready.wait()
            except TimeoutError:
                await _answer(send, 503, "not_ready", "the MCP server is starting", [(b"retry-after", b"1")])
                return
        scope = {**scope, _TOKEN: token}
        assert self._manager is not None
        await self._manager.handle_request(scope, receive, send)


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    value = next((v for k, v in headers if k.lower() == b"authorization"), None)
    if value is None:
        return None
    scheme, _, secret = value.partition(b" ")
    secret = secret.strip()
    if scheme.lower() != b"bearer" or not secret or len(secret) > TOKEN_MAX:
        return None
    try:
        return secret.decode("ascii")
    except UnicodeDecodeError:
        return None


async def _answer(send: Callable, status: int, code: str, detail: str,
                  headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps({"type": "about:blank", "status": status, "code": code, "detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/problem+json"),
                            (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data})
