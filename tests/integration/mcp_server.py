"""A stdio MCP server for tests, built with the mcp SDK's server API.

Tools: ``echo(text)``, ``add(a, b)``, ``fail()`` (an error result),
``crash()`` (the process exits 3 at once, mid-call) and ``nap(seconds)`` (a
slow tool, so a test can act while a turn is in it; it says ``napping
<seconds>`` on its stderr as it begins).

``--effects`` adds ``effect(path, text, nap_before, nap_after)``: an external
side effect, one line appended to *path* between two naps, so a kill may land
before or after it (tests/fleet/test_chaos.py).

``--reverse`` adds ``reverse(text)``: *text* backwards, so a test can have a
tool say a secret that neither the mail nor the call's arguments hold; it
says it on its stderr too, ``reversed: <text>`` (tests/integration/test_secrets.py).

``--grandchild PIDFILE`` forks, before serving, a grandchild that ignores
SIGTERM and keeps the server's stdio (the worst case: it holds the client's
pipes open after the server is gone) and writes its pid to PIDFILE.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import anyio

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("crewlet-test")


@server.tool()
def echo(text: str) -> str:
    """Say *text* back."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """The sum of a and b."""
    return a + b


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ToolError("this tool always fails")


@server.tool()
async def nap(seconds: float) -> str:
    """Answers after *seconds*; says ``napping <seconds>`` on its stderr as it
    begins, so a test can act while a turn is surely in it."""
    print(f"napping {seconds:g}", file=sys.stderr, flush=True)
    await anyio.sleep(seconds)
    return f"slept {seconds}"


async def effect(path: str, text: str, nap_before: float = 0.0, nap_after: float = 0.0) -> str:
    """Appends one line to the file at *path*: *text*, then tab-separated the
    node and seat that spawned this server, its pid and the wall-clock time.

    One ``write`` with ``O_APPEND`` of a line far below PIPE_BUF: lines from
    servers on several nodes never interleave.
    """
    await anyio.sleep(nap_before)
    node = os.environ.get("CREWLET_SPAWNED_BY", "").split("/")[0]
    line = f"{text}\t{node}\t{os.environ.get('CREWLET_SEAT', '')}\t{os.getpid()}\t{time.time():.3f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    await anyio.sleep(nap_after)
    return f"appended {text}"


def reverse(text: str) -> str:
    """Say *text* back, backwards."""
    print(f"reversed: {text[::-1]}", file=sys.stderr, flush=True)
    return text[::-1]


@server.tool()
def crash() -> str:
    """Ends the server at once."""
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grandchild", metavar="PIDFILE")
    parser.add_argument("--effects", action="store_true", help="serve the effect tool too")
    parser.add_argument("--reverse", action="store_true", help="serve the reverse tool too")
    args = parser.parse_args()
    if args.effects:
        server.tool()(effect)
    if args.reverse:
        server.tool()(reverse)
    if args.grandchild:
        # exec: the pid written is the process that ignores SIGTERM.
        child = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 300"])
        tmp = f"{args.grandchild}.tmp"
        with open(tmp, "w") as f:
            f.write(str(child.pid))
        os.replace(tmp, args.grandchild)  # a reader never sees half a pid
    server.run("stdio")


if __name__ == "__main__":
    main()
