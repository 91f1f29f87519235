"""``crewletctl mcp``: the company as MCP tools on stdin/stdout, for an
operator's own agent (Claude Desktop, Claude Code, any MCP client that starts
a server as a command).

It asks the node where its API is (``crewletctl status``'s ``api``), then
serves the operator's tools (:mod:`crewlet.operator`): each one API request
made with a token — ``$CREWLET_API_TOKEN``, else ``--token-file``, else the
node's first-start admin token in its run dir — and so held to that token's
scopes. A desktop client's config, for instance::

    {"mcpServers": {"crewlet": {"command": "crewletctl",
                                "args": ["-c", "/etc/crewlet/crewlet.yaml", "mcp"]}}}

The same tools are served over streamable HTTP at the node's ``/v1/mcp``.
"""

from __future__ import annotations

import asyncio
import os

import click

from crewlet.ctl import CALL_TIMEOUT, EXIT_CONFIG, EXIT_UNREACHABLE, Ctl, fail

TOKEN_ENV = "CREWLET_API_TOKEN"


@click.command()
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="A file holding the API token its calls are made with (default: $CREWLET_API_TOKEN, "
                   "else the node's first-start admin token).")
@click.pass_obj
def mcp(ctl: Ctl, token_file: str | None) -> None:
    """Serve the company as MCP tools on stdin/stdout (for a desktop agent).

    Exits 0 when the client closes its end; 69 when no node answers; 78 when
    no token can be found.
    """
    from crewlet.operator.server import serve_stdio

    url, token = api_access(ctl, token_file, "crewletctl mcp")
    asyncio.run(serve_stdio(url, token))


def api_access(ctl: Ctl, token_file: str | None, what: str) -> tuple[str, str]:
    """The node's API (its URL, no trailing ``/``) and the token to call it
    with: the one in the file *token_file* when given, else
    ``$CREWLET_API_TOKEN``, else the node's first-start admin token. Exits 69 when the node serves no API, 78 when
    no token can be found; *what* names the command in the first."""
    api = (ctl.ask("status", CALL_TIMEOUT).get("node") or {}).get("api") or {}
    url = api.get("url")
    if not url:
        fail(f"this node serves no API (it runs no ingress): run {what} against a node that does",
             EXIT_UNREACHABLE)
    token = os.environ.get(TOKEN_ENV)
    path = token_file or (None if token else api.get("token_file"))
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            fail(f"cannot read the API token in {path}: {exc.strerror or exc}", EXIT_CONFIG)
    if not token:
        fail(f"no API token: set ${TOKEN_ENV} or give --token-file (the node's tokens are configured, "
             "so it made no first-start token)", EXIT_CONFIG)
    return url.rstrip("/"), token
