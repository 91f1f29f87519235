"""The ingress ASGI application (Starlette).

* ``GET /healthz`` — this process answers: 200 with the node id.
* ``GET /readyz`` — the node's children are all running: 200, else 503 with
  the children that are not (asked of crewletd over ``control``).
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from crewlet import ipc
from crewlet.runtime import RoleContext


def make_app(ctx: RoleContext) -> Starlette:
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "node": ctx.node_id})

    async def readyz(request: Request) -> JSONResponse:
        try:
            reply = await ipc.acall(ctx.zmq, ctx.run_dir, "status", timeout=2.0)
        except ipc.NodeUnreachable as exc:
            return JSONResponse({"ready": False, "node": ctx.node_id, "reason": str(exc)}, 503)
        children = reply["result"]["children"]
        waiting = [{"name": c["name"], "state": c["state"]}
                   for c in children if c["state"] != "running"]
        body = {"ready": not waiting, "node": ctx.node_id, "not_running": waiting}
        return JSONResponse(body, 200 if not waiting else 503)

    return Starlette(routes=[Route("/healthz", healthz), Route("/readyz", readyz)])
