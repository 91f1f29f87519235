"""uvicorn's server as a role runs it: in the role's own event loop, the
role's signals left to the role.

Used by ingress (the HTTP API) and the seats' tool bridge
(:mod:`crewlet.agent.bridge`).
"""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn


class Server(uvicorn.Server):
    """uvicorn's server, minus its signal handling (the role runtime owns
    signals), telling us when it listens (:attr:`listening`)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    def capture_signals(self):
        return contextlib.nullcontext()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()
