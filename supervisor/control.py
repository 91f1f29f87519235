"""The ``control`` endpoint: what crewletctl (and children) may ask crewletd.

One small function per command, registered in :data:`COMMANDS`; its docstring
is its help. A request is ``{"id", "op", "deadline", "args"}``; the reply is
``{"id", "ok": true, "result"}`` or ``{"id", "ok": false, "error"}``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import zmq

from crewlet import ipc, log

if TYPE_CHECKING:
    from supervisor.node import Node


class CommandError(Exception):
    """A request crewletd understood and refuses; the message says why."""


async def status(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """The node, its children and its supervisors, and the fleet as this node
    sees it (``fleet``; null while the node is not in one)."""
    result = node.status()
    result["fleet"] = node.fleet.view() if node.fleet is not None else None
    return result


async def company(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """The company revision in force on this node (``null`` before one is applied)."""
    return {"company": node.fleet.company if node.fleet is not None else None}


async def restart(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Stop and start one child by name (``child``); not counted as a failure."""
    name = args.get("child")
    sup = node.root.find(name) if node.root and isinstance(name, str) else None
    if sup is None:
        names = [c["name"] for c in node.status()["children"]]
        raise CommandError(f"no child named {name!r}; children: {', '.join(names)}")
    # Answer once the restart is done, so `crewletctl restart` returns when the
    # child is ready again.
    await sup.restart_child(name)
    return {"restarted": name}


async def stop(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Stop the whole node, as SIGTERM does; answers before stopping."""
    node.request_stop("crewletctl stop")
    return {"stopping": True}


COMMANDS: dict[str, Callable[["Node", dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "status": status,
    "company": company,
    "restart": restart,
    "stop": stop,
}


async def serve(node: "Node", sock: zmq.asyncio.Socket) -> None:
    """Answer requests on the bound ROUTER *sock* until cancelled."""
    while True:
        frames = await sock.recv_multipart()
        asyncio.create_task(_answer(node, sock, frames))


async def _answer(node: "Node", sock, frames: list[bytes]) -> None:
    envelope, payload = frames[:-1], frames[-1]
    try:
        req = ipc.unpack(payload)
        op = req.get("op")
    except Exception:
        req, op = {}, None
    reply: dict[str, Any] = {"id": req.get("id")}
    command = COMMANDS.get(op)  # type: ignore[arg-type]
    if command is None:
        reply.update(ok=False, error=f"unknown command {op!r}; known: {', '.join(COMMANDS)}")
    elif isinstance(req.get("deadline"), (int, float)) and req["deadline"] < time.time():
        reply.update(ok=False, error="deadline passed before the request was read")
    else:
        try:
            reply.update(ok=True, result=await command(node, req.get("args") or {}))
        except CommandError as exc:
            reply.update(ok=False, error=str(exc))
        except Exception as exc:  # a bug: say so to the caller and in the log
            log.event("control_command_failed", "error", op=op, error=repr(exc))
            reply.update(ok=False, error=f"internal error: {exc!r}")
    await sock.send_multipart([*envelope, ipc.pack(reply)])
