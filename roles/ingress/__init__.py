"""The ingress role: the node's HTTP surface.

Serves the ASGI app of :mod:`roles.ingress.app` with uvicorn on
``ingress.listen`` inside this child's own event loop (so the watchdog and
heartbeats cover it). Signals stay the role runtime's: uvicorn's own handlers
are not installed, and SIGTERM ends the server through ``ctx.stopping``.
"""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn

from crewlet.runtime import RoleContext
from roles.ingress.app import make_app


class _Server(uvicorn.Server):
    def capture_signals(self):  # the role runtime owns signals
        return contextlib.nullcontext()


async def main(ctx: RoleContext) -> None:
    host, _, port = ctx.config.ingress.listen.rpartition(":")
    config = uvicorn.Config(make_app(ctx), host=host, port=int(port), lifespan="off",
                            log_config=None, access_log=False, timeout_graceful_shutdown=2)
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            serving.result()  # raises what stopped it (e.g. the port is taken)
            raise SystemExit(1)
        await asyncio.sleep(0.005)
    await ctx.ready()
    stop = asyncio.create_task(ctx.stopping.wait())
    await asyncio.wait({serving, stop}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
