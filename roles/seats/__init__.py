"""The seats role: seat leases now; mailboxes and turns in the turns issue.

It follows the company revisions this node applies (from crewletd), runs the
seat sweep (:mod:`roles.seats.sweeper`), and sweeps early when the fleet
changes: a seat or node lease deleted or expired, or a node appearing.
"""

from __future__ import annotations

import asyncio

from crewlet import log
from crewlet.coord.buckets import LEASES
from crewlet.coord.lease import Leases
from crewlet.runtime import RoleContext
from roles.seats.sweeper import SeatSweeper


async def _follow(ctx: RoleContext, sweeper: SeatSweeper) -> None:
    async for company in ctx.companies():
        sweeper.set_company(company["company"])
        log.event("seats_company", rev=company["rev"], seats=len(sweeper.seats))


async def _watch_fleet(ctx: RoleContext, sweeper: SeatSweeper) -> None:
    """Wake the sweep when a lease goes away or a node appears."""
    pause = 0.1
    while True:  # the fleet's JetStream may not answer yet (no quorum)
        try:
            kv = await ctx.jetstream().key_value(LEASES.name)
            watcher = await kv.watchall(include_history=False)
            break
        except Exception:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
    nodes: set[str] = set()
    try:
        async for entry in watcher:
            if entry is None:
                continue
            if not entry.key.startswith(("node.", "seat.")):
                continue  # duties, conversations: not the sweep's business
            if entry.operation in ("DEL", "PURGE"):
                nodes.discard(entry.key)
                sweeper.wake()
            elif entry.key.startswith("node.") and entry.key not in nodes:
                nodes.add(entry.key)
                sweeper.wake()
    finally:
        await watcher.stop()


async def main(ctx: RoleContext) -> None:
    fleet = ctx.config.fleet
    leases = Leases(ctx.jetstream(), ctx.node_id, ctx.boot, fleet.lease_ttl)
    sweeper = SeatSweeper(leases, ctx.node_id, ctx.config.node.labels, boot=ctx.boot,
                          sweep=fleet.sweep, heartbeat=fleet.heartbeat,
                          claims=fleet.claims_per_sweep, releases=fleet.releases_per_sweep)
    ctx.sweeper = sweeper  # the turn loop reads admission from here
    helpers = [asyncio.create_task(_follow(ctx, sweeper)),
               asyncio.create_task(_watch_fleet(ctx, sweeper))]
    for task in helpers:
        # These must run as long as the role does: one that fails ends the
        # role (and so is restarted by its supervisor), never silently.
        task.add_done_callback(lambda t: t.cancelled() or ctx.fail(t.exception()))
    await ctx.ready()
    try:
        await sweeper.run(ctx.stopping)
    finally:
        for task in helpers:
            task.cancel()
