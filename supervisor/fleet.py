"""The node's membership in the fleet: the ``fleet`` child of crewletd.

It runs in crewletd (a task child, :mod:`supervisor.task`), after the broker
and before the roles, holding crewletd's one NATS connection:

* at start it connects; then it creates the coordination buckets
  (idempotent; waiting for JetStream to have a quorum) and **joins**:
  claims ``node.<id>`` — another live node with our id makes crewletd exit 78
  with a message naming that node;
* given ``crewletd start --company FILE`` and a fleet with no company yet,
  it applies that file (as ``crewletctl apply`` does);
* it renews the presence every ``fleet.heartbeat``; a presence found lost
  (this node was paused past its TTL) is joined again;
* it watches the control plane's activation epoch, loads the revision it
  names — whole, from its parts, checked against the sha256 its record
  names (:mod:`crewlet.coord.control_plane`) — validates it (in a thread:
  10,000 seats take a second or two), and hands it to the node's roles: on
  ``events`` (topic ``company``) and to any role asking ``control`` for
  ``company``. A revision that does not validate, or whose parts are
  missing or damaged (read :data:`DAMAGED_READS` times), is recorded with
  its error in ``status`` and the previous one stays in force;
  ``company_applied`` says how long the read, the validation and the whole
  apply (mailboxes included) took;
* before it hands a revision to the roles it creates every seat's mailbox
  that does not exist yet (DESIGN §5: before anything publishes), and sizes
  the mailbox stream for the company; the estate's log, ``ESTATE``, is
  ensured with the other streams, so a node without data can write to it
  before any applier ran;
* it holds crewletd's way to the estate (``router``), through which
  crewletctl's ``tasks``, ``pages`` and ``search`` are answered;
* it records in the ``status`` bucket the revision this node reached;
* it follows the operator's drain orders (``status`` ``drain.*``,
  :mod:`crewlet.coord.drain`) and says its own in its presence
  (``draining``), renewed at once when it changes — read before it joins, so
  a node drained, stopped and started again comes back drained;
* before it joins, it refuses to (exit 78, naming both) when live nodes
  that serve speak another protocol than this one: a protocol bump needs
  the whole fleet drained first (DESIGN §16);
* on a clean stop it leaves: removes its presence, so peers react at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

import crewlet
from crewlet import bus, log, outbox
from crewlet.company.model import Company
from crewlet.company.load import from_revision
from crewlet.config import ConfigError, NodeConfig
from crewlet.conversations import runs
from crewlet.coord import buckets, drain, duty_reports
from crewlet.coord.control_plane import ControlPlane, ControlPlaneError, RevisionDamaged, RevisionNotFound
from crewlet.coord.holders import Holders
from crewlet.coord import life
from crewlet.coord.lease import Held, LeaseError, Leases
from crewlet.coord.presence import DuplicateNode, Presence
from crewlet import vault
from crewlet.estate import log as estate_log
from crewlet.vault import store as vault_store
from crewlet.estate.access import EstateAccess
from crewlet.objects import slot as objects_slot
from crewlet.objects.nats import NatsObjectStore
from crewlet.queue import notify
from crewlet.queue.jetstream import JetStreamMailboxes
from roles.workers.duties import fleet_shape
from supervisor.procs import EXIT_CONFIG
from supervisor.task import Exit


def broker_kind(cfg: NodeConfig) -> str:
    """member | leaf | external: what this node's broker is to the fleet."""
    if cfg.stream.type == "nats":
        return "external"
    return "leaf" if cfg.stream.leaf is not None else "member"


# The mailbox stream's consumer limit (DESIGN §4 pitfall: the 1001st consumer
# is refused unless it is raised): room for twice the company, so the
# mailboxes of removed seats can wait for retirement beside their successors.
MAILBOX_FLOOR = 1000


def mailbox_capacity(seats: int) -> int:
    return max(MAILBOX_FLOOR, 2 * seats)


# Seconds between samples of the streams while a replica catches up.
CATCH_UP_SAMPLE = 1.0
# Reads of a revision found damaged (a part missing, its bytes not what its
# record names) before it is refused: its parts are immutable, so a second
# look only rules out a read that went wrong on the way.
DAMAGED_READS = 3


def _stream_row(info) -> dict[str, Any]:
    """One stream of the sample: its consumers against its limit, its messages,
    and on a cluster its ``leader`` (None: none elected) and the replicas
    ``behind`` it (not current, or offline), by server name."""
    row = {"name": info.config.name, "consumers": info.state.consumer_count,
           "max_consumers": info.config.max_consumers, "messages": info.state.messages}
    cluster = getattr(info, "cluster", None)
    if cluster is not None and (info.config.num_replicas or 1) > 1:
        row["leader"] = cluster.leader or None
        row["behind"] = sorted(p.name for p in (cluster.replicas or []) if p.offline or not p.current)
    return row


def _cancelled() -> bool:
    """This task was asked to stop. A loop checks it as well as awaiting a
    cancel: Python 3.11's wait_for (nats-py's requests use it) can swallow
    the CancelledError, and a loop that went round again would hold the
    node's stop (``task_stop_overdue``) — but the request stays counted."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _validated(doc: Any, rev: int) -> tuple[Company, dict[str, Any]]:
    """The company of revision *rev*'s document, validated, and its dump as
    the roles are handed it; :class:`ConfigError` naming the revision."""
    company = from_revision(doc, f"revision {rev}")
    return company, company.model_dump(mode="json")


def _going_on() -> bool:
    """True, or CancelledError if this task was asked to stop: the head of a
    retry loop whose caller must not take a stop for a result."""
    if _cancelled():
        raise asyncio.CancelledError()
    return True

class Fleet:
    """State of the ``fleet`` child. One per crewletd run.

    Invariants: ``company`` is the revision in force on this node (None until
    one was applied); ``applied`` says which and since when, ``error`` why the
    last revision seen was not applied (None when it was).
    """

    def __init__(self, cfg: NodeConfig, boot: str, publish: Callable[..., None],
                 broadcast: Callable[[str, dict], None], seed: tuple | None = None, zctx=None,
                 children: Callable[[], list[dict[str, Any]]] | None = None,
                 sandbox: Callable[[], dict[str, Any] | None] | None = None):
        self.cfg = cfg
        self.boot = boot
        self.publish = publish        # log an event and tell local subscribers
        self.broadcast = broadcast    # tell local subscribers only (big payloads)
        self.seed = seed              # (Company, source): applied if the fleet has none
        self.zctx = zctx              # crewletd's ZeroMQ context (this node's estate copy)
        self.children = children      # this node's role children, in brief (told with the presence)
        self.sandbox = sandbox        # how its seats' tools run (crewlet.sandbox), told likewise
        self.estate: EstateAccess | None = None  # set once joined
        self.started_at = time.time()
        self.nc = None
        self.leases: Leases | None = None
        # Set once the node stops (not a restart of this child): its teardown
        # then also ends the seats' life, after every seats process stopped.
        self.leaving = False
        self.presence: Presence | None = None
        self.control: ControlPlane | None = None
        self.company: dict[str, Any] | None = None
        self.model: Company | None = None  # the same company, validated (crewletctl send asks it)
        self.applied: dict[str, Any] | None = None
        self.error: str | None = None
        self._js = None  # set once the fleet's JetStream answered
        self.mailboxes: JetStreamMailboxes | None = None  # likewise
        self._unmanned: dict[str, Any] | None = None  # last fleet_role_unmanned we logged
        self._seat_views: tuple[Any, list] = (None, [])  # (company rev, its seats' placements)
        # Live leases, kept by crewletd's one watch of the bucket (set once joined).
        self.holders: Holders | None = None
        # Every stream on the broker: its consumers against its limit, and its
        # messages (crewletctl status's streams line), sampled every heartbeat,
        # every second while a stream of the cluster is without a leader or
        # has a replica behind (a member catching up after a restart).
        self.streams: list[dict[str, Any]] | None = None
        # Each duty's last pass (status duty.<name>: crewlet.coord.duty_reports),
        # sampled with the streams.
        self.reports: dict[str, dict[str, Any]] = {}
        # node id -> the revision it reached (status node.<id>), kept by a
        # watcher; its estate copy and eviction are the estate view's.
        self._status_view: dict[str, dict[str, Any]] = {}
        # Every node's drain order, kept by a watcher; this node's is ``drain``
        # (None: it serves), told in its presence.
        self.drains = drain.Orders(changed=self._drain_changed, refused=self._drain_refused)
        self.vault: "vault.Vault | None" = None  # the fleet's secrets opened here (status; redaction)
        self.drain: drain.Order | None = None
        self._beat = asyncio.Event()  # set: renew the presence now (its drain changed)

    @property
    def router(self):
        """crewletd's way to the estate (None until joined)."""
        return self.estate.router if self.estate is not None else None

    @property
    def js(self):
        """The fleet's JetStream context over crewletd's connection (None until joined)."""
        return self._js

    def describe(self) -> dict[str, Any]:
        """What this node is, as its presence tells the fleet."""
        node = self.cfg.node
        return {"roles": list(node.roles), "broker": broker_kind(self.cfg),
                "labels": dict(node.labels), "version": crewlet.__version__,
                "protocol": crewlet.protocol(), "boot": self.boot,
                "max_concurrent": node.max_concurrent, "started_at": self.started_at,
                "rev": (self.applied or {}).get("rev"),
                # The operator's drain order in force here (crewlet.coord.drain): every
                # process of the fleet reads it from here.
                "draining": self.drain.presence() if self.drain is not None else None,
                # Each heartbeat: what peers' dashboards show of this node's children.
                "children": self.children() if self.children is not None else None,
                # Whether its seats' tools are confined: every dashboard shows a node that is not.
                "sandbox": self.sandbox() if self.sandbox is not None else None}

    # ------------------------------------------------------------ lifecycle

    async def setup(self) -> None:
        try:
            await self._setup()
        except BaseException:
            if self.nc is not None:  # a failed start must not leave a connection behind
                await bus.close(self.nc)
            raise

    async def _setup(self) -> None:
        # Ready once connected: the broker's JetStream may still be waiting for
        # a quorum (a fleet's first member, started alone), and the node's
        # roles must come up meanwhile. Joining happens in run().
        self.nc = await bus.connect(self.cfg.stream, name=f"{self.cfg.node.id}/crewletd",
                                    run_dir=self.cfg.run_dir)

    async def run(self) -> None:
        await self._join()
        # One fails, all stop (and the child exits, to be restarted whole):
        # never half a membership left running beside a new one.
        async with asyncio.TaskGroup() as group:
            group.create_task(self._heartbeat())
            group.create_task(self._follow_control_plane())
            group.create_task(self.holders.run())
            group.create_task(self._sample_streams())
            group.create_task(buckets.follow(lambda: self._js.key_value(buckets.STATUS.name),
                                             "node.*", self._status_seen, name="status node.*"))
            # The secrets' values learnt, so a child's line that says one is
            # redacted as it is forwarded (crewlet.log.forward).
            self.vault = vault.Vault.of(self._js, self.cfg, "crewletd")
            group.create_task(self.vault.run())
            group.create_task(buckets.follow(lambda: self._js.key_value(buckets.STATUS.name),
                                             drain.KEYS, self.drains.seen, opened=self.drains.opened,
                                             listed=self.drains.listed, name="status drain.*"))

    async def _join(self) -> None:
        """Create the buckets, claim our presence, apply the active company —
        waiting, as long as it takes, for the fleet's JetStream to answer."""
        cfg = self.cfg
        js = bus.jetstream(self.nc, cfg.stream)
        pause, waiting = 0.1, False
        while _going_on():
            try:
                await buckets.ensure_all(js, cfg.stream.replicas)
                await self._files_store(js)
                break
            except Exit:
                raise
            except Exception as exc:  # no JetStream yet (no quorum, hub unreachable)
                if not waiting:
                    log.event("fleet_waiting_for_jetstream", "warning",
                              error=f"{type(exc).__name__}: {exc}")
                    waiting = True
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
        self._js = js
        self.mailboxes = JetStreamMailboxes(js, self.nc, ack_wait=cfg.fleet.ack_wait)
        self.leases = Leases(js, cfg.node.id, self.boot, cfg.fleet.lease_ttl)
        self.holders = Holders.of_bucket(js, heartbeat=cfg.fleet.heartbeat)
        self.presence = Presence(self.leases, cfg.node.id, cfg.data_dir, self.describe)
        # Born drained when the operator said so before this start (an upgrade's
        # restart): no role of ours is to take work in between.
        self.drain = await self._own_drain(js)
        if self.drain is not None:
            self.publish("node_draining", "warning", deadline=self.drain.deadline, until=self.drain.until,
                         by=self.drain.by, at_start=True)
        await self._check_protocol(js)
        try:
            await self.presence.join()
        except DuplicateNode as exc:
            raise Exit(EXIT_CONFIG, f"{cfg.source}: node.id: {exc}") from None
        self.publish("fleet_joined", token=self.presence.held.token)
        if self.zctx is not None:
            self.estate = EstateAccess(cfg, self.nc, js, self.zctx, holders=self.holders).start()
        await self._reseal(js)
        self.control = await ControlPlane.open(js, cfg.stream.replicas)
        active = await self.control.active()
        if active is None and self.seed is not None:
            company, source = self.seed
            rev, epoch = await self.control.apply(company, source)
            self.publish("company_seeded", rev=rev, epoch=epoch, source=source)
        # The revision in force is applied by _follow_control_plane, beside the
        # heartbeat: creating a big company's mailboxes on a cluster can take
        # longer than our presence's TTL.

    async def _reseal(self, js) -> None:
        """Seal again with this node's sealing key the secrets sealed with
        another key it holds (a rotated fleet secret's old line; its own key
        from before it joined a fleet), so the fleet secret's old line can be
        retired. Never stops a start: what is left is left for the next."""
        try:
            keys = vault.Keys.of(self.cfg, own_too=True)
            done = await vault_store.reseal(js, keys)
        except Exception as exc:  # no key here, the bucket unreachable: said, not fatal
            log.event("secrets_reseal_failed", "warning", error=f"{type(exc).__name__}: {exc}")
            return
        if done:
            self.publish("secrets_resealed", names=done, key=keys.sealing_id)

    async def _own_drain(self, js) -> "drain.Order | None":
        """This node's drain order, read once before joining (None on no answer:
        the watch says it a moment later)."""
        try:
            kv = await js.key_value(buckets.STATUS.name)
            entry = await kv.get(drain.KEY + self.cfg.node.id)
            return drain.parse(entry.value) if entry is not None and entry.value else None
        except Exception:  # no such key (the usual), or unread: the watch tells
            return None

    async def _files_store(self, js) -> None:
        """Record (or check) which store the company's files are in — a node
        configured with another refuses to boot, exit 78 — and make the
        broker's bucket when the files are there (the roles only use it)."""
        cfg = self.cfg
        try:
            await objects_slot.claim(js, cfg.files.identity(), cfg.node.id)
        except objects_slot.StoreMismatch as exc:
            raise Exit(EXIT_CONFIG, f"{cfg.source}: files: {exc}") from None
        if cfg.files.store == "nats":
            await NatsObjectStore(js, self.nc, bucket=cfg.files.bucket,
                                  replicas=cfg.stream.replicas).ensure()

    async def teardown(self) -> None:
        if self.estate is not None:
            await self.estate.close()
        if self.presence is not None and self.nc is not None and self.nc.is_connected:
            await self._end_seats_life()
            try:
                await self.presence.leave()
                self.publish("fleet_left")
            except LeaseError as exc:
                log.event("fleet_leave_failed", "warning", error=str(exc))
        if self.nc is not None:
            await bus.close(self.nc)

    async def _end_seats_life(self) -> None:
        """End this boot's seats life, once the roles (every seats process)
        have stopped: a pool's members leave it to the node (roles/seats/pool.py),
        so every seat is free for the fleet in one write, as a lone seats
        process's own stop makes it. Not ours (another boot's), or gone
        already: nothing to do."""
        if not self.leaving or "seats" not in self.cfg.node.roles or self.leases is None:
            return  # a fleet child restarting: the seats processes may still run
        key = life.key(self.cfg.node.id)
        try:
            owner = await self.leases.owner(key)
            if owner is not None and owner.boot == self.boot:
                await self.leases.release(Held(key, owner.token, owner.revision, renewed=0.0,
                                               ttl=self.leases.ttl))
                log.event("seats_life_ended", token=owner.token)
        except LeaseError as exc:  # it lapses within a TTL
            log.event("seats_life_end_failed", "warning", error=str(exc))

    # ---------------------------------------------------------------- drain

    def _drain_changed(self, node: str, order: "drain.Order | None") -> None:
        if node != self.cfg.node.id or order == self.drain:
            return
        was, self.drain = self.drain, order
        if order is None:
            self.publish("node_undrained")
        elif was is None:
            self.publish("node_draining", "warning", deadline=order.deadline, until=order.until, by=order.by)
        self._beat.set()  # said in our presence now, not a heartbeat later

    def _drain_refused(self, node: str, error: str) -> None:
        log.event("drain_order_refused", "warning", node=node, error=error)

    async def _check_protocol(self, js) -> None:
        """Refuse to join beside live nodes that serve in another protocol
        (exit 78, naming both) — before our presence, so no role of ours
        takes anything: the fleet must be drained whole for a bump. Each
        presence is read once (the stream's subjects, then each key: no
        watch). Unread (no answer), it is said and joining goes on."""
        mine = crewlet.protocol()
        differ = []
        try:
            keys = await buckets.subjects(js, buckets.LEASES.name, "node.*")
            for key in keys:
                if key == f"node.{self.cfg.node.id}":
                    continue
                owner = await self.leases.owner(key)
                if owner is not None and drain.draining(owner.info) is None \
                        and owner.info.get("protocol") != mine:
                    differ.append(f"{key.removeprefix('node.')} ({owner.info.get('protocol')})")
        except Exception as exc:
            log.event("fleet_protocol_unread", "warning", error=f"{type(exc).__name__}: {exc}")
        if differ:
            raise Exit(EXIT_CONFIG, f"protocol: this node speaks protocol {mine}, and live nodes that serve "
                                    f"speak another: {', '.join(differ)}; a protocol bump needs the whole "
                                    f"fleet drained first (crewletctl drain NODE, for each)")

    # ------------------------------------------------------------- presence

    def _check_workers_manned(self) -> None:
        """The fleet_shape duty runs in the workers role — so when no live node
        runs workers, nobody would say so. The live node with the lowest id
        does, here."""
        nodes = {k.removeprefix("node."): o.info for k, o in self.holders.of("node.").items()}
        unmanned = bool(nodes) and not any("workers" in n.get("roles", ()) for n in nodes.values())
        if not unmanned or min(nodes) != self.cfg.node.id:
            self._unmanned = None
            return
        found = fleet_shape.problems(nodes, self.cfg.stream.replicas)["fleet_role_unmanned"]
        if found != self._unmanned:
            log.event("fleet_role_unmanned", "warning", **found)
        self._unmanned = found

    async def _heartbeat(self) -> None:
        assert self.presence is not None
        while not _cancelled():
            self._check_workers_manned()
            try:
                # Not wait_for: Python 3.11's may swallow a cancel (DESIGN §4).
                async with asyncio.timeout(self.cfg.fleet.heartbeat):
                    await self._beat.wait()
            except TimeoutError:
                pass
            self._beat.clear()
            try:
                if self.presence.held is None or await self.presence.renew() is None:
                    # Paused past our TTL (or evicted): we were gone; come back.
                    self.publish("fleet_presence_lost", "warning")
                    await self.presence.join()
                    self.publish("fleet_joined", token=self.presence.held.token)
            except LeaseError as exc:
                log.event("fleet_presence_renew_failed", "warning", error=str(exc))
            except DuplicateNode as exc:
                raise Exit(EXIT_CONFIG, f"{self.cfg.source}: node.id: {exc}") from None

    async def _sample_streams(self) -> None:
        """Read every stream's consumer count and limit, every heartbeat: what
        a leak of consumers looks like before a stream refuses one (issue 10);
        and, on a cluster, its leader and the replicas not caught up with it:
        a member is back from a restart once none is behind, and only then may
        the next one go (two current replicas of three are the quorum). Until
        then (or while the streams cannot be read) every second, so that an
        operator waiting for it learns it within a second rather than a
        heartbeat."""
        failing = False
        while not _cancelled():
            try:
                infos = await self._js.streams_info()
                self.streams = sorted((_stream_row(i) for i in infos), key=lambda row: row["name"])
                self.reports = await duty_reports.read_all(self._js)
                failing = False
            except Exception as exc:  # no quorum, a leader moving: keep the last sample
                if not failing:
                    log.event("fleet_streams_unread", "warning", error=f"{type(exc).__name__}: {exc}")
                failing = True
            settled = not failing and all(row.get("leader") and not row["behind"]
                                          for row in self.streams or [] if "behind" in row)
            await asyncio.sleep(self.cfg.fleet.heartbeat if settled else min(CATCH_UP_SAMPLE,
                                                                              self.cfg.fleet.heartbeat))

    # -------------------------------------------------------- control plane

    async def _follow_control_plane(self) -> None:
        assert self.control is not None
        async for active in self.control.watch():
            if self.applied is None or active.get("epoch") != self.applied.get("epoch"):
                await self._apply(active)

    async def _apply(self, active: dict[str, Any]) -> None:
        """Apply the revision *active* names, or record why not.

        A revision is read whole or not at all (its parts checked against its
        record, :meth:`ControlPlane.revision`): one found damaged is read
        again, then refused like an invalid one — the previous revision
        stays in force, and status says why."""
        assert self.control is not None
        rev, epoch = active["rev"], active.get("epoch")
        pause, damaged = 0.2, 0
        problem: str | None = None
        started = time.monotonic()
        while _going_on():  # a read that got no answer is tried again, not taken for a bad revision
            try:
                doc = await self.control.revision(rev)
                break
            except RevisionNotFound:
                doc, problem = None, "named active, but there is no such revision"
                break
            except RevisionDamaged as exc:
                damaged += 1
                if damaged >= DAMAGED_READS:
                    doc, problem = None, str(exc).removeprefix(f"revision {rev}: ")
                    break
                log.event("company_read_failed", "warning", rev=rev, error=str(exc))
            except ControlPlaneError as exc:
                log.event("company_read_failed", "warning", rev=rev, error=str(exc))
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)
        read = time.monotonic()
        try:
            if doc is None:
                raise ConfigError(f"revision {rev}", None, problem or "unread")
            # Validated again (this node may know rules the writer did not), in a
            # thread: at 10,000 seats the loop keeps turning meanwhile.
            company, dump = await asyncio.to_thread(_validated, doc.get("company"), rev)
        except ConfigError as exc:  # invalid or unreadable: keep what we run; the line names the key
            self.error = str(exc)
            self.publish("company_refused", "error", rev=rev, epoch=epoch, error=self.error)
        except Exception as exc:  # keep what we run
            self.error = f"revision {rev}: {type(exc).__name__}: {exc}"
            self.publish("company_refused", "error", rev=rev, epoch=epoch, error=self.error)
        else:
            validated = time.monotonic()
            await self._ensure_mailboxes(company)
            self.error = None
            self.company = {"rev": rev, "epoch": epoch, "digest": doc.get("digest"), "company": dump}
            self.model = company
            self.applied = {"rev": rev, "epoch": epoch, "at": time.time()}
            self.publish("company_applied", rev=rev, epoch=epoch, seats=len(company.seats),
                         read_ms=_ms(read - started), validated_ms=_ms(validated - read),
                         took_ms=_ms(time.monotonic() - started))
            self.broadcast("company", self.company)
        await self._record_status()

    async def _ensure_mailboxes(self, company: Company) -> None:
        """Every seat's mailbox exists before the roles hear of the company.

        Tried until it works: a role told of a seat whose mailbox is missing
        would fetch from nothing, and mail sent meanwhile would be refused.
        """
        assert self.mailboxes is not None
        seats = [s.name for s in company.seats]
        pause = 0.2
        while _going_on():
            try:
                started = time.monotonic()
                await self.mailboxes.ensure_streams(
                    replicas=self.cfg.stream.replicas, events_days=company.retention.events_days,
                    max_consumers=mailbox_capacity(len(seats)))
                created = await self.mailboxes.ensure(seats)
                await estate_log.ensure_stream(self._js, self.cfg.stream.replicas)
                await notify.ensure_stream(self._js, self.cfg.stream.replicas)
                await outbox.ensure_stream(self._js, self.cfg.stream.replicas)
                await runs.ensure_stream(self._js, self.cfg.stream.replicas,
                                         self.cfg.conversations.max_events)
                log.event("mailboxes_ready", seats=len(seats), created=created,
                          took_ms=round((time.monotonic() - started) * 1000, 1))
                return
            except Exception as exc:
                log.event("mailboxes_failed", "warning", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    async def _record_status(self) -> None:
        record = {"node": self.cfg.node.id, "boot": self.boot, "applied": self.applied,
                  "error": self.error, "at": time.time()}
        try:
            # A plain publish, not kv.put: it must be answered from a leaf too.
            await self._js.publish(bus.kv_subject(self._js, buckets.STATUS.name)
                                   + f"node.{self.cfg.node.id}", json.dumps(record).encode())
        except Exception as exc:
            log.event("fleet_status_write_failed", "warning", error=f"{type(exc).__name__}: {exc}")

    # --------------------------------------------------------------- status
    #
    # The fleet's view is kept up to date by watchers, so that status answers
    # from memory at once — also when the broker is down, when it matters most.

    def _status_seen(self, entry) -> None:
        node = entry.key.removeprefix("node.")
        if entry.operation is not None or not entry.value:
            self._status_view.pop(node, None)
            return
        try:
            self._status_view[node] = json.loads(entry.value)
        except ValueError:
            pass

    def view(self) -> dict[str, Any]:
        """The fleet as this node sees it: nodes, seats, duties (crewletctl status)."""
        def prefixed(prefix: str) -> dict[str, dict]:
            leases = self.holders.of(prefix) if self.holders is not None else {}
            return {k.removeprefix(prefix): {"node": o.node, "token": o.token,
                                             "info": {**o.info, "boot": o.boot}}
                    for k, o in leases.items()}
        nodes, seats, duties = prefixed("node."), prefixed("seat."), prefixed("duty.")
        conversations = prefixed("conv.")
        statuses = self._status_view
        # Seats no live node may hold (the fleet_shape duty logs them): from
        # memory, like the rest, the placements kept per company revision.
        rev = (self.company or {}).get("rev")
        if self._seat_views[0] != rev:
            self._seat_views = (rev, fleet_shape.seat_views((self.company or {}).get("company")))
        unplaceable = fleet_shape.unplaceable({k: o["info"] for k, o in nodes.items()},
                                              self._seat_views[1])
        estate = self.estate.view if self.estate is not None else None  # copies and evictions
        return {
            "company": {k: v for k, v in (self.company or {}).items() if k != "company"} or None,
            "error": self.error,
            "nodes": [{**{k: v for k, v in node["info"].items() if k not in ("node", "token")},
                       "id": nid,
                       "applied": (statuses.get(nid) or {}).get("applied"),
                       "status_error": (statuses.get(nid) or {}).get("error"),
                       "estate": estate.record(nid) if estate is not None else None,
                       "evicted": estate.eviction(nid) if estate is not None else None,
                       "seats": sorted(k for k, o in seats.items() if o["node"] == nid),
                       "duties": sorted(k for k, o in duties.items() if o["node"] == nid),
                       "conversations": sum(1 for o in conversations.values() if o["node"] == nid)}
                      for nid, node in sorted(nodes.items())],
            "seats": [{"name": k, "node": o["node"], "token": o["token"]}
                      for k, o in sorted(seats.items())],
            "duties": [{"name": k, "node": o["node"], "token": o["token"]}
                       for k, o in sorted(duties.items())],
            "unplaceable": {"seats": unplaceable[:fleet_shape.UNPLACEABLE_SHOWN],
                            "count": len(unplaceable)},
            "connected": bool(self.nc is not None and self.nc.is_connected),
            "streams": self.streams,
            # Drain orders in force, also of nodes that are not up (drained and stopped).
            "drains": {n: o.presence() for n, o in sorted(self.drains.orders.items())},
            "reports": self.reports,
        }
