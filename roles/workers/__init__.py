"""The workers role: the company-wide singleton duties.

Each duty in :data:`roles.workers.duties.DUTIES` runs on exactly one node of
the fleet, the holder of its ``duty.<name>`` lease (:mod:`roles.workers.runner`).
A duty that writes to the estate (``maintenance``'s turn trims) goes through
the role's estate router (:class:`~crewlet.estate.access.EstateAccess`), as
every other writer does.
"""

from __future__ import annotations

import asyncio

from crewlet.company import Company
from crewlet.coord.holders import Holders
from crewlet.coord.lease import Leases
from crewlet.estate.access import EstateAccess
from crewlet.runtime import RoleContext
from roles.workers.duties import DUTIES
from roles.workers.runner import DutyRunner


async def main(ctx: RoleContext) -> None:
    leases = Leases(ctx.jetstream(), ctx.node_id, ctx.boot, ctx.config.fleet.lease_ttl)
    holders = Holders.of_bucket(ctx.jetstream(), heartbeat=ctx.config.fleet.heartbeat)
    estate = EstateAccess(ctx.config, ctx.nats, ctx.jetstream(), ctx.zmq, holders=holders).start()
    runner = DutyRunner(ctx.config, leases, DUTIES, role=ctx, holders=holders, estate=estate.router)

    async def follow() -> None:
        async for company in ctx.companies():
            runner.company = Company.model_validate(company["company"])

    helpers = [asyncio.create_task(follow()), asyncio.create_task(holders.run())]
    for task in helpers:
        task.add_done_callback(lambda t: t.cancelled() or ctx.fail(t.exception()))
    await ctx.ready()
    try:
        await runner.run(ctx.stopping)
    finally:
        for task in helpers:
            task.cancel()
        await estate.close()
