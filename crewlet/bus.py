"""The one NATS connection a process holds (DESIGN §4).

KV and streams ride the same connection on purpose: two connections to one
broker fail independently, and a node alive on one and deaf on the other is
the worst state to be in. Every state change of the connection is logged.
"""

from __future__ import annotations

import asyncio

import nats
from nats.aio.client import Client

from crewlet import log


def servers_of(stream) -> list[str]:
    """The URLs a process dials for a node's ``stream`` config section."""
    if stream.type == "nats":
        return list(stream.servers)
    return [f"nats://{stream.listen}"]


async def connect(stream, *, name: str, connect_timeout: float = 2.0) -> Client:
    """Open this process's connection; reconnects forever once established."""

    async def disconnected() -> None:
        log.event("nats_disconnected", "warning")

    async def reconnected() -> None:
        log.event("nats_reconnected", url=str(nc.connected_url.netloc if nc.connected_url else None))

    async def error(exc: Exception) -> None:
        log.event("nats_error", "warning", error=f"{type(exc).__name__}: {exc}")

    async def closed() -> None:
        log.event("nats_closed", "debug")

    nc = await nats.connect(
        servers=servers_of(stream), name=name, connect_timeout=connect_timeout,
        max_reconnect_attempts=-1, reconnect_time_wait=0.5, allow_reconnect=True,
        disconnected_cb=disconnected, reconnected_cb=reconnected, error_cb=error,
        closed_cb=closed)
    log.event("nats_connected", url=str(nc.connected_url.netloc if nc.connected_url else None))
    return nc


async def close(nc: Client, timeout: float = 2.0) -> None:
    """Close this process's connection: drain it when the broker is there to
    drain to, else just close (a drain toward a dead broker waits it out)."""
    try:
        if nc.is_connected:
            await asyncio.wait_for(nc.drain(), timeout)
        else:
            await nc.close()
    except (Exception, asyncio.CancelledError) as exc:
        log.event("nats_close_failed", "debug", error=f"{type(exc).__name__}: {exc}")
