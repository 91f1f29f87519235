"""The seats role: seat leases, mailboxes, turns and MCP servers (DESIGN §5).

It follows the company revisions this node applies (from crewletd), runs the
seat sweep (:mod:`roles.seats.sweeper`) over one long-lived watch of the
leases (:class:`crewlet.coord.holders.Holders`) — sweeping early when the
fleet changes: a seat or node lease deleted or expired, or a node appearing — and
the turn loop (:mod:`roles.seats.turns`), whose hooks start and stop a seat's
work as its lease is claimed and released.

A node runs a pool of these processes (``node.seats_processes``,
:mod:`roles.seats.pool`): each holds a stable share of the node's seats and
of its turn slots, under the node's one life.

Every process a seat spawns (MCP servers, CLI agents) carries the mark
``CREWLET_SPAWNED_BY=<node>/<child>/<data dir hash>`` (``seats``, ``seats.1`` …);
a new seats process first kills what the member before it left behind
(:func:`crewlet.agent.janitor.kill_marked`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import uuid

from crewlet import disk, heap, log
from crewlet.agent.janitor import kill_marked
from crewlet.company import Company
from crewlet.company.model import Retention
from crewlet.conversations import runs
from crewlet.coord import drain
from crewlet.coord.counters import Budgets, CounterError, Cooldowns, Ledger
from crewlet.coord.holders import Holders
from crewlet.queue import notify
from crewlet.vault import Vault
from crewlet.coord.lease import Leases
from crewlet.estate.access import EstateAccess
from crewlet.queue.base import TRIGGER_HEADER
from crewlet.queue.jetstream import MAX_DELIVER, JetStreamMailboxes
from crewlet.runtime import RoleContext
from crewlet.sandbox import Sandbox
from crewlet.skills.registry import Registry as SkillRegistry
from crewlet.sandbox import log_state as log_sandbox
from roles.seats.pool import Pool
from roles.seats.sweeper import SeatSweeper
from roles.seats.turns import BRIDGE_SOCKET, STATS_EVERY, TurnEngine

# Days a ledger entry outlives the longest it is needed for.
LEDGER_MARGIN_DAYS = 1


def ledger_ttl(mail_days: int, ack_wait: float) -> int:
    """Seconds a ledger entry lives: as long as its mail could be delivered again.

    An entry is written after its turn, just before the ack; mail is never
    aged out any more, but once acked it is not delivered again. What can
    come back is a delivery whose ack was lost: after the ack wait, once per
    delivery left in its budget, until it is dead-lettered
    (:data:`~crewlet.queue.jetstream.MAX_DELIVER` × ``ack_wait`` bounds it,
    up to 30 days at the longest ack wait of a day). A dead letter sent back
    (``crewletctl dlq requeue``) or the same trigger mailed again is covered
    for the company's ``retention.mail_days``. The longer of the two, and a
    margin."""
    # Whole seconds: the broker's per-message TTL header takes an integer.
    return int(max(mail_days * 86400, MAX_DELIVER * ack_wait)) + LEDGER_MARGIN_DAYS * 86400


async def _follow(ctx: RoleContext, sweeper: SeatSweeper, engine: TurnEngine,
                  heard: asyncio.Event | None = None) -> None:
    async for company in ctx.companies():
        model = Company.model_validate(company["company"])
        engine.set_company(model, rev=company["rev"])
        engine.ledger.ttl = ledger_ttl(model.retention.mail_days, ctx.config.fleet.ack_wait)
        sweeper.set_company(company["company"])
        log.event("seats_company", rev=company["rev"], seats=len(sweeper.seats))
        if heard is not None:
            heard.set()


async def _deliver_notices(ctx: RoleContext, mailboxes, engine: TurnEngine, heard: asyncio.Event) -> None:
    """This node's share of the NOTIFY group (crewlet.groups): stored webhook
    deliveries made mail. Ingress runs it where it runs; a node without it —
    a node without data, which runs no ingress — takes its share here, as
    the group wants any node to (it needs the mailboxes, not the estate)."""
    await heard.wait()  # a delivery's seat is checked against the company
    await notify.deliver(ctx.jetstream(), ctx.nats, mailboxes, roles=ctx.config.node.roles,
                         stopping=ctx.stopping.is_set, known=lambda seat: seat in engine.seat_cfgs)


def _wake_on_change(sweeper: SeatSweeper):
    """What the lease watch calls: wake the sweep when a seat, node or life
    lease went away (released, expired; a seat also when its life did), or a
    node or a life appeared (a life claimed anew is another token: its
    seats went), or a node was drained or undrained (its presence says so)."""
    def changed(key: str, was, now) -> None:
        if not key.startswith(("node.", "seat.", "life.")):
            return  # duties, conversations: not the sweep's business
        if now is None or (was is None and not key.startswith("seat.")) \
                or (key.startswith("life.") and was.token != now.token) \
                or (key.startswith("node.") and drain.draining(was.info) != drain.draining(now.info)):
            sweeper.wake()
    return changed


async def _report(ctx: RoleContext, engine: TurnEngine) -> None:
    """Tell crewletd what the turns are doing (crewletctl status shows it)."""
    await ctx.report_stats(engine.stats, STATS_EVERY)


async def main(ctx: RoleContext) -> None:
    fleet = ctx.config.fleet
    # The data dir makes the mark this node's alone, even beside another node
    # that (wrongly) shares its id on the same machine.
    mark = f"{ctx.node_id}/{ctx.child}/{hashlib.sha1(ctx.run_dir.encode()).hexdigest()[:8]}"
    pool = Pool(ctx.member, ctx.config.seats_pool)
    os.environ["CREWLET_SPAWN_MARK"] = mark  # the cli provider marks its agents with it
    # Commands installed beside crewlet (crewlet-demo-mcp in a venv) resolve
    # even when that venv's bin dir is not on the PATH crewletd was started with.
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, [bindir, os.environ.get("PATH")]))
    left = kill_marked(mark)
    if left:
        log.event("seats_leftovers_killed", "warning", pids=left)
    # Where the seats' tools and agents run: probed once (a run of `true`
    # under bubblewrap), said at start (crewlet.sandbox).
    box = await asyncio.to_thread(Sandbox.of, ctx.config)
    log_sandbox(box, "seats")
    js = ctx.jetstream()
    leases = Leases(js, ctx.node_id, ctx.boot, fleet.lease_ttl)
    holders = Holders.of_bucket(js, heartbeat=fleet.heartbeat)
    sweeper = SeatSweeper(leases, holders, ctx.node_id, ctx.config.node.labels, boot=ctx.boot,
                          proc=f"{os.getpid()}.{uuid.uuid4().hex[:8]}", sweep=fleet.sweep,
                          heartbeat=fleet.heartbeat, grace=fleet.lease_ttl,
                          spawns=fleet.claims_per_sweep, releases=fleet.releases_per_sweep, pool=pool)
    mailboxes = JetStreamMailboxes(js, ctx.nats)
    mailboxes.notices_to = list(ctx.config.smtp.notices_to)
    # The seats' tools reach the estate through the router: this node's own
    # copy first when it is a data node, else the data nodes over NATS.
    estate = EstateAccess(ctx.config, ctx.nats, js, ctx.zmq, holders=holders).start()
    vault = Vault.of(js, ctx.config, "seats")
    # The node's cache of the company's skills: what a turn's prompt lists.
    skills = SkillRegistry(estate.router, ctx.nats, walk_every=ctx.config.skills.walk_every)
    engine = TurnEngine(node=ctx.node_id, run_dir=ctx.run_dir, mark=mark, mailboxes=mailboxes,
                        ledger=Ledger(js, ttl=ledger_ttl(Retention().mail_days, fleet.ack_wait)),
                        budgets=Budgets(js),
                        cooldowns=Cooldowns(js), sweeper=sweeper,
                        max_concurrent=pool.part(ctx.config.node.max_concurrent), events_js=js,
                        estate=estate.router, space=disk.Watch.of(ctx.config),
                        files=ctx.config.files, replicas=ctx.config.stream.replicas,
                        run_event_ttl=runs.event_ttl(ctx.config.conversations.retention,
                                                     ctx.config.conversations.max_run),
                        approval_ttl=ctx.config.approvals.ttl, nc=ctx.nats, sandbox=box, vault=vault,
                        skills=skills,
                        bridge_socket=f"bridge.{ctx.child}.sock" if ctx.member else BRIDGE_SOCKET)
    sweeper.on_claim, sweeper.on_release = engine.on_claim, engine.on_release
    holders.on_change = _wake_on_change(sweeper)
    sweeper.on_stop = engine.quiesce
    sweeper.busy = engine.busy
    ctx.sweeper = sweeper  # the turn loop reads admission from here
    # Mail wakes its seat: a plain subscription, no JetStream state per seat.
    # A member of a pool of several subscribes per seat it holds (SeatWork):
    # on one subscription for every mailbox, each member heard every mail of
    # the node's (and the fleet's) seats, most of them another member's.
    async def wake(msg) -> None:
        # The trigger, when the mail names one, starts its ledger read now,
        # beside the fetch (SeatWork.wake).
        engine.wake(msg.subject.rpartition(".")[2], (msg.headers or {}).get(TRIGGER_HEADER))

    if pool.alone:
        wakes = await ctx.nats.subscribe("agents.inbox.*", cb=wake)
    else:
        engine.wakes_per_seat = wake
        wakes = None
    await skills.start()
    heap.take_over()  # no full collection in the middle of a thousand turns (crewlet.heap)
    heard = asyncio.Event()
    helpers = [asyncio.create_task(_follow(ctx, sweeper, engine, heard)),
               asyncio.create_task(heap.collect_fully()),
               asyncio.create_task(holders.run()),
               asyncio.create_task(engine.budgets.run(ctx.stopping)),
               asyncio.create_task(engine.cooldowns.run()),
               asyncio.create_task(vault.run(ctx.stopping.is_set)),
               asyncio.create_task(_report(ctx, engine))]
    if "ingress" not in ctx.config.node.roles and pool.member == 0:
        helpers.append(asyncio.create_task(_deliver_notices(ctx, mailboxes, engine, heard)))
    for task in helpers:
        # These must run as long as the role does: one that fails ends the
        # role (and so is restarted by its supervisor), never silently.
        task.add_done_callback(lambda t: t.cancelled() or ctx.stopping.is_set()
                               or ctx.fail(t.exception()))
    await ctx.ready()
    try:
        await sweeper.run(ctx.stopping)
    finally:
        # Everything polite on the way out — work in hand handed back, leases
        # released, spend flushed — shares one budget inside the role's
        # shutdown time: without quorum each step would wait out its own
        # timeouts, and the supervisor's SIGKILL would end it half-done.
        # Cut short, nothing is lost: the leases lapse within a TTL, and
        # what was in hand comes back through its in-flight record (the next
        # seats process) or the ack wait.
        try:
            async with asyncio.timeout(ctx.stop_budget()):
                await sweeper.release_all()
                if wakes is not None:
                    await wakes.unsubscribe()
                await engine.close()
                await skills.close()
                await _flush_spend(engine)
                await estate.close()
        except TimeoutError:
            log.event("seats_stop_cut_short", "warning", budget=ctx.stop_budget(),
                      seats_unreleased=len(sweeper.held))
        finally:
            for task in helpers:
                task.cancel()


async def _flush_spend(engine: TurnEngine) -> None:
    try:
        await engine.budgets.flush(everything=True)
    except CounterError as exc:  # no quorum as the node stops: this spend is not counted
        log.event("budget_flush_failed", "warning", error=str(exc), unflushed=engine.budgets.unflushed())
