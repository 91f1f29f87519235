"""The data_applier role: the one writer of this data node's copy of the estate.

What it does
------------
Applies the ``ESTATE`` log, in order, into the node's LMDB environment
(``<data_dir>/estate``) and keeps the knowledge base's search index beside it
(``<data_dir>/estate-search.sqlite``); answers the estate's reads and writes
for this node's own roles and for any node of the fleet; keeps this node's
share of the turn events (custody). The work itself is
:class:`roles.data_applier.applier.Applier` (the log, requests, service) and
:class:`roles.data_applier.custody.Custody` (events); this module puts them
on the wire.

Where it answers
----------------
==================  ==========  ==================================================
endpoint            pattern     carries
==================  ==========  ==================================================
``estate``          ZeroMQ      requests of this node's roles
                    ROUTER      (:mod:`crewlet.estate.wire`; the reply carries the
                                request's ``id``)
``estate.req.<id>`` NATS        the same requests from any node; reply msgpack;
``.<origin>.<node>``            who asks is in the subject (an older node's,
                                the bare ``estate.req.<id>``: every kind)
``applied``         ZeroMQ PUB  ``{"node", "seq", "in_service", "reason", "at"}``
                                after every commit and every second
``status`` KV       JetStream   ``estate.<node>``: applied, in service and why,
                                the log's first and last seq; every 2 s
==================  ==========  ==================================================

Each request runs as its own task, so a write waiting for its op to come back
from the log never holds up a read. A request past its deadline is dropped
unanswered (nobody waits for it any more).

Starting and stopping
---------------------
The child counts as started once the sockets are bound and the NATS
subscription is made; it does not wait for JetStream, which may have no
quorum yet (the log loop keeps trying, and answers wait or say why). On
SIGTERM it stops serving, marks itself out of service ("applier stopped") in
one last ``status`` record and ``applied`` message, and closes the copy. A
SIGKILLed applier loses nothing: the applied seq is committed with the rows,
and the restarted child follows the log from there.

Out of service
--------------
``applier stopped``, ``node evicted: <reason>`` (``crewletctl evict`` writes
``status`` key ``evicted.<node>``; deleting it brings the node back), ``rows
below the log's first sequence (applied N, the log starts at M)`` (the log
was trimmed past what this copy applied: rebuild the copy), ``the copy is
ahead of the log`` / ``the log was made anew`` (the stream was deleted and
made again under this copy: rebuild it). Out of service,
it still answers — with that reason — so callers go to a peer at once.

Watching it
-----------
``crewletctl status`` shows this child's stats (applied, in service, reason,
ops applied per second, requests, events kept and pruned by the company's
``retention.events_days``); the events to grep for are
``estate_service``, ``estate_log_following``, ``estate_log_gap``,
``estate_log_stalled``, ``estate_log_unavailable``, ``estate_copy_reapplying``,
``custody_*``.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import zmq

from crewlet import ipc
from crewlet.company import Company
from crewlet import log as events
from crewlet.estate import origins, wire
from crewlet.runtime import RoleContext
from crewlet.estate.view import EstateView
from crewlet.objects.files import store_of
from roles.data_applier.applier import Applier, cancel_all, wait_event
from roles.data_applier.snapshots import Snapshots, bootstrap, restart_for_a_snapshot

# Seconds between applied messages when nothing was committed (a copy silent
# for 3 s counts as stopped to the node's roles).
APPLIED_EVERY = 1.0
# Seconds between stats reports to crewletd (crewletctl status).
STATS_EVERY = 1.0
# How long the last applied message ("applier stopped") may wait to go out.
PUB_LINGER_MS = 500


async def answer(applier: Applier, request: Any, *, origin: str,
                 asker: str | None = None) -> dict[str, Any] | None:
    """*applier*'s answer to *request* from *origin* on node *asker*; an
    error of ours is an answer too, never silence."""
    try:
        return await applier.handle(request, origin=origin, asker=asker)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        events.event("estate_request_failed", "error", error=f"{type(exc).__name__}: {exc}",
                     traceback=traceback.format_exc())
        return wire.answer(wire.OUT_OF_SERVICE, applier.node,
                           reason=f"internal error: {type(exc).__name__}: {exc}")


# The requests being answered, in this process: cancelled (and awaited) when
# the role stops, before the copy they read is closed.
_requests: set[asyncio.Task] = set()


def _spawn(coro) -> None:
    task = asyncio.create_task(coro)
    _requests.add(task)
    task.add_done_callback(_requests.discard)


async def serve_zmq(sock, applier: Applier) -> None:
    """Answer the ``estate`` ROUTER's requests, each in its own task."""
    async def one(frames: list[bytes]) -> None:
        try:
            request = wire.decode(frames[-1])
        except ValueError as exc:
            request, reply = None, wire.answer(wire.BAD_REQUEST, applier.node, reason=str(exc))
        else:
            # The node's own processes say who they are (the same uid's
            # socket: declared, not proven); none is the operator.
            said = request.get("origin") if isinstance(request, dict) else None
            reply = await answer(applier, request, asker=applier.node,
                                 origin=said if said in origins.ORIGINS else origins.OPERATOR)
        if reply is None:
            return
        rid = request.get("id") if isinstance(request, dict) else None
        try:
            await sock.send_multipart([*frames[:-1], wire.encode({"id": rid, **reply})])
        except zmq.ZMQError as exc:  # the socket closed under a late answer: stopping
            events.event("estate_reply_failed", "warning", error=f"{type(exc).__name__}: {exc}")

    while True:
        _spawn(one(await sock.recv_multipart()))


class Subscriptions:
    """The applier's subscriptions, unsubscribed together."""

    def __init__(self, subs: list):
        self.subs = subs

    async def unsubscribe(self) -> None:
        for sub in self.subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass  # the connection's trouble: it goes with it


async def serve_nats(nc, applier: Applier) -> Subscriptions:
    """Answer ``estate.req.<node>.<origin>.<asker>`` and an older node's
    ``estate.req.<node>`` (plain subscriptions: one applier per node)."""
    async def one(msg) -> None:
        who = wire.parse_subject(applier.node, msg.subject)
        if who is None:
            reply = wire.answer(wire.BAD_REQUEST, applier.node,
                                reason=f"{msg.subject} names no origin this applier knows: "
                                       f"{wire.subject(applier.node, '<origin>', '<node>')}, "
                                       f"<origin> one of {', '.join(origins.ORIGINS)}")
        else:
            try:
                request = wire.decode(msg.data)
            except ValueError as exc:
                reply = wire.answer(wire.BAD_REQUEST, applier.node, reason=str(exc))
            else:
                reply = await answer(applier, request, origin=who[0], asker=who[1])
        if reply is None or not msg.reply:
            return
        data = wire.encode(reply)
        if len(data) > nc.max_payload:
            # Silence would cost the asker its whole wait, then a "nobody answered".
            data = wire.encode(wire.answer(
                wire.BAD_REQUEST, applier.node,
                reason=f"the answer is {len(data)} bytes, more than the broker carries "
                       f"({nc.max_payload}): ask for fewer (limit) or page (after)"))
        try:
            await msg.respond(data)
        except Exception as exc:
            events.event("estate_reply_failed", "warning", error=f"{type(exc).__name__}: {exc}")

    async def on_request(msg) -> None:
        _spawn(one(msg))  # never block the subscription's dispatch

    return Subscriptions([await nc.subscribe(subject, cb=on_request)
                          for subject in wire.subjects(applier.node)])


def applied_message(applier: Applier) -> dict[str, Any]:
    return wire.applied_message(applier.node, applier.applied, applier.in_service, applier.reason)


async def publish_applied(sock, applier: Applier) -> None:
    """The ``applied`` PUB: after every commit (sent from the commit itself,
    :attr:`Applier.on_commit`), on every change of service, and every second."""
    def tell() -> None:
        # A PUB never blocks: NOBLOCK sends now (a message past the high-water
        # mark is dropped, as any PUB message may be; the next one says the same).
        sock.send_multipart([wire.APPLIED_TOPIC, wire.encode(applied_message(applier))], zmq.NOBLOCK)
    applier.on_commit = tell
    try:
        while True:
            applier.changed.clear()
            await sock.send_multipart([wire.APPLIED_TOPIC, wire.encode(applied_message(applier))])
            await wait_event(applier.changed, APPLIED_EVERY)
    finally:
        applier.on_commit = None


def stats(applier: Applier) -> dict[str, Any]:
    custody = applier.custody.stats if applier.custody is not None else {}
    return {"applied": applier.applied, "in_service": applier.in_service,
            "reason": applier.reason, "ops_per_s": round(applier.rate(), 1),
            "log_first": applier.log_first, "log_last": applier.log_last,
            "requests": applier.stats["requests"], "dropped": applier.stats["dropped"],
            "resubscribed": applier.stats["resubscribed"],
            # passed over on the log, and write requests refused, for their origin
            "refused": applier.stats["refused"], "asks_refused": applier.stats["asks_refused"],
            "events_kept": custody.get("kept", 0), "events_pruned": custody.get("pruned", 0)}


async def follow_retention(ctx: RoleContext, applier: Applier) -> None:
    """Each company revision's ``retention.events_days`` to custody, which
    prunes this node's kept events by it (roles/data_applier/custody.py)."""
    async for company in ctx.companies():
        if applier.custody is not None:
            days = Company.model_validate(company["company"]).retention.events_days
            applier.custody.set_keep_days(days)


async def report_stats(ctx: RoleContext, applier: Applier) -> None:
    await ctx.report_stats(lambda: stats(applier), STATS_EVERY)


async def main(ctx: RoleContext) -> None:
    cfg = ctx.config
    objects = store_of(cfg.files, js=ctx.jetstream(), nc=ctx.nats, replicas=cfg.stream.replicas)
    # A new copy where the log was trimmed starts from a snapshot (snapshots.py).
    await bootstrap(ctx.jetstream(), objects, cfg.data_dir)
    applier = Applier(ctx.nats, ctx.jetstream(), ctx.node_id, cfg.data_dir,
                      replicas=cfg.stream.replicas, floor=cfg.node.disk_floor)
    view = EstateView(ctx.jetstream())
    snapshots = Snapshots(applier, objects, view, cfg.estate.snapshot_every)
    applier.notices_to = list(ctx.config.smtp.notices_to)
    ctx.applier = applier  # fault injection reaches it (debug.faults kind lag)
    estate = ipc.bind(ctx.zmq, ctx.run_dir, zmq.ROUTER, "estate")
    applied = ipc.bind(ctx.zmq, ctx.run_dir, zmq.PUB, "applied", linger=PUB_LINGER_MS)
    subs = await serve_nats(ctx.nats, applier)
    tasks = [asyncio.create_task(serve_zmq(estate, applier)),
             asyncio.create_task(publish_applied(applied, applier)),
             asyncio.create_task(report_stats(ctx, applier)),
             asyncio.create_task(view.run()),
             asyncio.create_task(snapshots.run()),
             asyncio.create_task(restart_for_a_snapshot(applier, ctx))]
    for task in tasks:
        task.add_done_callback(lambda t: t.cancelled() or ctx.fail(t.exception()))
    applier.start(custody_roles=ctx.config.node.roles)
    follow = asyncio.create_task(follow_retention(ctx, applier))
    follow.add_done_callback(lambda t: t.cancelled() or ctx.fail(t.exception()))
    tasks.append(follow)
    await ctx.ready()
    try:
        await ctx.stopping.wait()
    finally:
        await subs.unsubscribe()
        await cancel_all(tasks)
        await cancel_all(list(_requests))
        await applier.stop()
        await objects.close()
        await applied.send_multipart([wire.APPLIED_TOPIC, wire.encode(applied_message(applier))])
        estate.close()
        applied.close()
