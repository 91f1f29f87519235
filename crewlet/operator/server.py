"""The operator MCP server: the :mod:`.tools` offered over MCP (the ``mcp``
SDK's low-level server), two ways:

* :func:`serve_stdio` — ``crewletctl mcp``: a desktop client starts it and
  talks over its stdin and stdout; its calls go to the node's API over HTTP
  with the node's local token;
* :class:`OperatorServer` in ingress at ``/v1/mcp`` (streamable HTTP,
  ``roles/ingress/mcp.py``): each request's own bearer token is what its
  calls are made with, to the API in the same process.

Either way a tool is an API request made with the caller's token: the scopes,
the validation and the answers are the API's, and so are its limits.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import httpx2
import mcp_types
from mcp.server.lowlevel.server import Server

import crewlet
from crewlet.operator.tools import OperatorTool, call, tools_of

SERVER_NAME = "crewlet-operator"
INSTRUCTIONS = ("The crewlet company as tools: its seats and their mail, turns, the tracker, the "
                "knowledge base, files, conversations with seats (start a run, read its events), "
                "approvals, dead letters and the fleet. Every call is an API request made with your "
                "token, under its scopes.")
CALL_TIMEOUT = 120.0  # seconds an API request of a tool may take (a mail's wait, a run's events)


class OperatorServer:
    """The server over one API. Invariant: ``tools`` are those of the API's
    OpenAPI document, by name; ``token_of(ctx)`` is the token a request's
    calls are made with (None: refused)."""

    def __init__(self, openapi: Callable[[], dict[str, Any]], client: httpx2.AsyncClient,
                 token_of: Callable[[Any], str | None]):
        self._openapi = openapi
        self._tools: dict[str, OperatorTool] | None = None  # made at first use (see tools)
        self.client = client
        self.token_of = token_of
        self.mcp = Server(SERVER_NAME, version=crewlet.__version__, instructions=INSTRUCTIONS,
                          on_list_tools=self._list, on_call_tool=self._call)
        self.mcp.middleware = []  # no OpenTelemetry span a message: nothing exports them

    async def tools(self) -> dict[str, OperatorTool]:
        """The tools, by name: made from the OpenAPI document at first use, in a
        thread (generating the document is ~a second of CPU: not in a node's
        start, nor on its loop)."""
        if self._tools is None:
            made = await asyncio.to_thread(lambda: tools_of(self._openapi()))
            self._tools = {t.name: t for t in made}
        return self._tools

    async def _list(self, ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=[
            mcp_types.Tool(name=t.name, description=t.description, input_schema=t.schema)
            for t in (await self.tools()).values()])

    async def _call(self, ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        tools = await self.tools()
        tool = tools.get(params.name)
        if tool is None:
            return _result(f"unknown tool {params.name!r}; tools: {', '.join(tools)}", True)
        token = self.token_of(ctx)
        if not token:
            return _result("no API token: this server acts with the caller's token only", True)
        try:
            text, error = await call(self.client, tool, dict(params.arguments or {}), token)
        except httpx2.HTTPError as exc:
            return _result(f"the API did not answer: {type(exc).__name__}: {exc}", True)
        return _result(text, error)


def _result(text: str, error: bool) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(content=[mcp_types.TextContent(text=text)], is_error=error)


async def serve_stdio(base_url: str, token: str) -> None:
    """``crewletctl mcp``: the server on stdin/stdout, its calls to the API at
    *base_url* with *token*, until the client closes its end."""
    from mcp.server.stdio import stdio_server
    async with httpx2.AsyncClient(base_url=base_url, timeout=CALL_TIMEOUT, trust_env=False) as client:
        response = await client.get("/v1/openapi.json")
        response.raise_for_status()
        document = response.json()
        server = OperatorServer(lambda: document, client, lambda ctx: token)
        async with stdio_server() as (read, write):
            await server.mcp.run(read, write, server.mcp.create_initialization_options())
