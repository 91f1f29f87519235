"""A stand-in for a CLI agent in agent mode, for tests of the tool bridge
(crewlet.agent.bridge): a process of its own that finds the bridge as a real
agent would and speaks MCP to it with the SDK's streamable HTTP client.

    python -m tests.integration.bridge_agent (--config FILE | --env [--socket]) STEPS

``--config``: an MCP client config in the common ``mcpServers`` shape (what
``claude --mcp-config`` reads); ``--env``: ``CREWLET_MCP_BRIDGE_URL`` and
``_TOKEN`` from the environment, and with ``--socket`` the unix socket of
``CREWLET_MCP_BRIDGE_SOCKET`` instead of TCP.

STEPS is a JSON list: ``["list"]`` or ``["call", name, arguments]``. One JSON
line a step on stdout: ``{"tools": [{name, description, schema}, ...]}`` or
``{"text": ..., "error": bool}``; a failure of the session is one line
``{"failed": "<exception>"}`` and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client


def where(args: argparse.Namespace) -> tuple[str, dict[str, str], str | None]:
    """The endpoint's URL, the headers to send, and the unix socket if any."""
    if args.config:
        with open(args.config) as f:
            server = json.load(f)["mcpServers"]["crewlet"]
        assert server["type"] == "http", server
        return server["url"], server["headers"], None
    headers = {"Authorization": f"Bearer {os.environ['CREWLET_MCP_BRIDGE_TOKEN']}"}
    if args.socket:
        return "http://localhost/mcp", headers, os.environ["CREWLET_MCP_BRIDGE_SOCKET"]
    return os.environ["CREWLET_MCP_BRIDGE_URL"], headers, None


async def run(args: argparse.Namespace) -> None:
    url, headers, uds = where(args)
    transport = httpx2.AsyncHTTPTransport(uds=uds) if uds else None
    async with httpx2.AsyncClient(headers=headers, transport=transport, timeout=20) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for step in json.loads(args.steps):
                    if step[0] == "list":
                        listed = await session.list_tools()
                        out = {"tools": [{"name": t.name, "description": t.description,
                                          "schema": t.input_schema} for t in listed.tools]}
                    else:
                        _, name, arguments = step
                        result = await session.call_tool(name, arguments)
                        out = {"text": "".join(c.text for c in result.content if c.type == "text"),
                               "error": result.is_error}
                    print(json.dumps(out), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--config")
    how.add_argument("--env", action="store_true")
    parser.add_argument("--socket", action="store_true")
    parser.add_argument("steps")
    args = parser.parse_args()
    try:
        asyncio.run(run(args))
    except BaseException as exc:  # the SDK wraps what failed in exception groups
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        print(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}), flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
