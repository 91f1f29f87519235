"""uvicorn's server as a role runs it: in the role's own event loop, the
role's signals left to the role.

Used by ingress (the HTTP API) and the seats' tool bridge
(:mod:`crewlet.agent.bridge`).

uvicorn's own main loop wakes ten times a second to see whether it should
stop, and refreshes its ``date`` header on every tenth: ten wakeups a second
of an idle process. Here it wakes once a second (the header's resolution is a
second anyway), and at once when told to stop (``should_exit`` set).

uvicorn's shutdown pauses 0.1 s for the connections it asked to close, even
when there are none: a stopping node's ingress spent most of its stop there.
With no connection and no request open, the server here closes its
listeners and ends at once; with any, uvicorn's own shutdown runs as ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import uvicorn

logger = logging.getLogger("uvicorn.error")  # uvicorn's own, as its shutdown logs


# Seconds between the server's ticks: its date header, its request limit.
TICK = 1.0


class Server(uvicorn.Server):
    """uvicorn's server, minus its signal handling (the role runtime owns
    signals), telling us when it listens (:attr:`listening`), ticking once a
    second rather than ten times."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)
        self.listening = asyncio.Event()

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        # Set by whoever stops the server; wakes the main loop at once.
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    async def main_loop(self) -> None:
        # Each pass is a second of uvicorn's: its tick 0, when its once-a-second work runs.
        while not await self.on_tick(0):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK):
                    await self._exit.wait()

    def capture_signals(self):
        return contextlib.nullcontext()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()

    async def shutdown(self, sockets=None) -> None:
        state = self.server_state
        if not (state.connections or state.tasks):
            # Nothing open: the listeners closed, and one turn of the loop for
            # a connection accepted just before (its protocol is made then).
            for server in self.servers:
                server.close()
            for sock in sockets or []:
                sock.close()
            await asyncio.sleep(0)
            if not (state.connections or state.tasks):
                logger.info("Shutting down")
                for server in self.servers:
                    await server.wait_closed()
                if not self.force_exit:
                    await self.lifespan.shutdown()
                return
        # Connections open: uvicorn's own, whose pause lets them finish.
        await super().shutdown(sockets)
