"""The ingress role: the node's HTTP surface (DESIGN §10).

Serves the ASGI app of :mod:`roles.ingress.app` with uvicorn on
``ingress.listen`` inside this child's own event loop (so the watchdog and
heartbeats cover it). Signals stay the role runtime's: uvicorn's own handlers
are not installed, and SIGTERM ends the server through ``ctx.stopping``.
The listening sockets are bound first thing, here (:func:`crewlet.ports.bind`,
as uvicorn would): an address that cannot be bound is a configuration error
naming ``ingress.listen`` (exit 78), not a crash to restart.

Beside the server, on the child's one NATS connection:

* the :class:`~roles.ingress.projection.Projection`, this node's live
  picture of the company, which the reads and the live feed answer from;
* the estate router (:class:`~crewlet.estate.access.EstateAccess`), for
  every tracker, knowledge-base and turn route;
* the company in force (``ctx.companies()``);
* one member of the ``NOTIFY`` consumer group, which turns stored webhook
  deliveries into mail (:func:`crewlet.queue.notify.deliver`);
* the :class:`~crewlet.conversations.driver.Conductor`: the conversation runs
  this node drives, and its session runner.

The API's tokens are read once, at start (:func:`roles.ingress.auth.keyring`);
with none configured, the node's first-start admin token is made here.
"""

from __future__ import annotations

import asyncio

import uvicorn
# What uvicorn imports when a server starts: imported here so the zygote
# preloads it and a restarted ingress does not pay for it (~10 ms).
import uvicorn.lifespan.off  # noqa: F401
import uvicorn.protocols.http.auto  # noqa: F401
import uvicorn.protocols.websockets.auto  # noqa: F401

from crewlet import log, ports, webserver
from crewlet.company.model import Company
from crewlet.config import ConfigError
from crewlet.coord.control_plane import ControlPlane
from crewlet.conversations import runs
from crewlet.conversations.driver import Conductor
from crewlet.conversations.lease import Drivers
from crewlet.coord.holders import Holders
from crewlet.estate.access import EstateAccess
from crewlet.estate.router import START_WAIT
from crewlet.queue import notify
from crewlet.queue.jetstream import JetStreamMailboxes
from crewlet.runtime import RoleContext
from crewlet.vault import Vault
from roles.ingress import auth, deadlines
from roles.ingress.app import make_app
from roles.ingress.front import Front
from roles.ingress.metrics import Metrics
from roles.ingress.projection import Projection

# Seconds an idle keep-alive connection stays open. Longer than the idle
# timeout of what commonly sits in front (60 s: nginx, cloud load balancers)
# and of clients' pools: the side that closes first must be the client, or a
# request sent just as the server closes is lost ("connection closed without
# response"), which uvicorn's default of 5 s made common under load.
KEEP_ALIVE = 75
# Turn records the live feed starts with, read from the estate.
SEED_TURNS = 50


async def main(ctx: RoleContext) -> None:
    cfg = ctx.config
    try:
        sockets = ports.bind(cfg.ingress.listen)
    except ports.BindError as exc:
        raise ConfigError(cfg.source, "ingress.listen", str(exc)) from None
    keyring = auth.keyring(cfg)
    js = ctx.jetstream()
    holders = Holders.of_bucket(js, heartbeat=cfg.fleet.heartbeat)  # run by the projection
    access = EstateAccess(cfg, ctx.nats, js, ctx.zmq, holders=holders).start()
    projection = Projection(node_id=cfg.node.id, nc=ctx.nats, js=js, holders=holders,
                            estate_view=access.view, run_dir=cfg.run_dir, zctx=ctx.zmq,
                            gone_for=cfg.ingress.gone_for)
    front = Front(cfg=cfg, nc=ctx.nats, js=js,
                  mailboxes=JetStreamMailboxes(js, ctx.nats, ack_wait=cfg.fleet.ack_wait),
                  router=access.router, projection=projection, control_plane=None, zctx=ctx.zmq)
    front.metrics = Metrics(projection)
    front.vault = Vault.of(js, cfg, "ingress")
    conv = cfg.conversations
    conductor = Conductor(
        js=js, router=access.router, mailboxes=front.mailboxes, node=cfg.node.id,
        drivers=Drivers(js, cfg.node.id, ctx.boot, ttl=conv.lease_ttl, holders=holders),
        busy_wait=conv.busy_wait, max_run=conv.max_run, event_ttl=runs.event_ttl(conv.retention, conv.max_run),
        runner_concurrency=cfg.sessions.runner_concurrency, sweep=cfg.sessions.sweep,
        company=lambda: (projection.company or {}).get("rev"))
    front.conductor = conductor
    projection.on_turn = front.metrics.turn

    host, _, port = cfg.ingress.listen.rpartition(":")
    app = make_app(ctx, front, keyring)
    config = uvicorn.Config(app, host=host, port=int(port), lifespan="off",
                            log_config=None, access_log=False, timeout_graceful_shutdown=2,
                            timeout_keep_alive=KEEP_ALIVE, ws="websockets-sansio",
                            # The request deadlines and the connection bound: ingress.header_timeout,
                            # body_grace, body_min_rate, max_connections, max_header_bytes.
                            **deadlines.server_options(cfg.ingress))
    server = webserver.Server(config)
    serving = asyncio.create_task(server.serve(sockets=sockets))
    listening = asyncio.create_task(server.listening.wait())
    await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
    if not server.listening.is_set():
        listening.cancel()
        serving.result()  # raises what stopped it
        raise SystemExit(f"ingress could not listen on {cfg.ingress.listen}")

    background = [
        asyncio.create_task(projection.run(), name="projection"),
        asyncio.create_task(_follow_company(ctx, front), name="company"),
        asyncio.create_task(_open_control_plane(front), name="control plane"),
        asyncio.create_task(_deliver_notices(ctx, front), name="notify"),
        asyncio.create_task(conductor.run_sessions(), name="sessions"),
        asyncio.create_task(front.vault.run(ctx.stopping.is_set), name="secrets"),
        asyncio.create_task(app.state.mcp.run(), name="operator mcp"),
    ]
    for task in background:
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is None
                               or ctx.fail(t.exception()))
    await ctx.ready()
    stop = asyncio.create_task(ctx.stopping.wait())
    await asyncio.wait({serving, stop}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
    for task in background:
        task.cancel()
    await asyncio.gather(*background, return_exceptions=True)
    await conductor.close()
    await access.close()


async def _deliver_notices(ctx: RoleContext, front: Front) -> None:
    # Not before a company is heard: NOTIFY is made before the roles hear of one.
    await front.projection.company_heard.wait()
    await notify.deliver(front.js, ctx.nats, front.mailboxes, roles=ctx.config.node.roles,
                         stopping=ctx.stopping.is_set, known=_known(front),
                         on_mail=lambda i, s: front.metrics.webhook(i, "mailed"))


def _known(front: Front):
    return lambda seat: seat in front.seat_names


async def _follow_company(ctx: RoleContext, front: Front) -> None:
    seeded = False
    async for current in ctx.companies():
        try:
            front.set_company(Company.model_validate(current["company"]))
        except Exception as exc:  # crewletd validated it; a mismatch is a bug to see, not to die of
            log.event("ingress_company_refused", "error", error=f"{type(exc).__name__}: {exc}")
            continue
        front.projection.set_company(current)
        if not seeded:
            seeded = await _seed_turns(front)


async def _seed_turns(front: Front) -> bool:
    # At a node's start the copies come into service a moment after ingress.
    await front.router.serving(START_WAIT)
    try:
        answer = await front.router.read("turn.list", {"limit": SEED_TURNS}, timeout=10.0)
    except Exception as exc:  # the feed starts empty; live turns fill it
        log.event("ingress_turns_unseeded", "warning", error=f"{type(exc).__name__}: {exc}")
        return False
    await front.projection.seed_turns(list(reversed((answer or {}).get("turns") or [])))
    return True


async def _open_control_plane(front: Front) -> None:
    front.control_plane = await ControlPlane.open(front.js, front.cfg.stream.replicas)
