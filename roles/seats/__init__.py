"""The seats role: seat leases, mailboxes and turns (later issues).

Today it holds the node's NATS connection, heartbeats and reports ready.
"""

from __future__ import annotations

from crewlet.runtime import RoleContext


async def main(ctx: RoleContext) -> None:
    await ctx.ready()
    await ctx.stopping.wait()
