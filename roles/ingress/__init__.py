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
# What uvicorn imports when a server starts: imported here so the zygote
# preloads it and a restarted ingress does not pay for it (~10 ms).
import uvicorn.lifespan.off  # noqa: F401
import uvicorn.protocols.http.auto  # noqa: F401
import uvicorn.protocols.websockets.auto  # noqa: F401

from crewlet.runtime import RoleContext
from roles.ingress.app import make_app


class _Server(uvicorn.Server):
    """uvicorn's server, minus its signal handling, telling us when it listens."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.listening = asyncio.Event()

    def capture_signals(self):  # the role runtime owns signals
        return contextlib.nullcontext()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()


async def main(ctx: RoleContext) -> None:
    host, _, port = ctx.config.ingress.listen.rpartition(":")
    config = uvicorn.Config(make_app(ctx), host=host, port=int(port), lifespan="off",
                            log_config=None, access_log=False, timeout_graceful_shutdown=2)
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    listening = asyncio.create_task(server.listening.wait())
    await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
    if not server.listening.is_set():
        listening.cancel()
        serving.result()  # raises what stopped it
        raise SystemExit(f"ingress could not listen on {ctx.config.ingress.listen}")
    await ctx.ready()
    stop = asyncio.create_task(ctx.stopping.wait())
    await asyncio.wait({serving, stop}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
