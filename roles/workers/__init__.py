"""The workers role: the company-wide singleton duties.

Each duty in :data:`roles.workers.duties.DUTIES` runs on exactly one node of
the fleet, the holder of its ``duty.<name>`` lease (:mod:`roles.workers.runner`).
A duty that writes to the estate (``maintenance``'s turn trims) goes through
the role's estate router (:class:`~crewlet.estate.access.EstateAccess`), as
every other writer does.

Stopping ends within the role's stop budget whatever the broker does: the
runner returns at once (a tend in progress cut short), and what is polite on
the way out — the duties ended, their leases released, the estate access
closed — shares :meth:`~crewlet.runtime.RoleContext.stop_budget`. Without
quorum every release would wait out its request's timeout; cut short
(``workers_stop_cut_short``, naming what was left and what was still
running), nothing is lost: a lease not released lapses within its TTL.
"""

from __future__ import annotations

import asyncio

from crewlet import log, runtime
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

    helpers = [asyncio.create_task(follow(), name="company follow"),
               asyncio.create_task(holders.run(), name="holders watch")]
    for task in helpers:
        task.add_done_callback(lambda t: t.cancelled() or ctx.fail(t.exception()))
    await ctx.ready()
    try:
        await runner.run(ctx.stopping)
    finally:
        async def goodbye() -> None:
            await runner.halt()  # the duties end before what they use closes
            await asyncio.gather(runner.release(), estate.close())

        # Bounded by waiting, not by cancelling: a cancel a request swallows
        # would not bound it (DESIGN §4). What is left when the budget is
        # spent is cancelled here and abandoned with the loop (runtime.run_loop).
        closing = asyncio.create_task(goodbye(), name="workers goodbye")
        done, _ = await asyncio.wait({closing}, timeout=ctx.stop_budget())
        if not done:
            log.event("workers_stop_cut_short", "warning", budget_s=ctx.stop_budget(),
                      unreleased=sorted(runner.held), doing=runtime.doing())
            closing.cancel()
        elif closing.exception() is not None:
            log.event("workers_stop_failed", "warning",
                      error=f"{type(closing.exception()).__name__}: {closing.exception()}")
        for task in helpers:
            task.cancel()
