"""The turn loop of a node's seats (DESIGN §5): mail in, turns run, acks out.

For every seat this node holds there is one :class:`SeatWork`: it starts the
seat's MCP servers, then works its mailbox one turn at a time. Every turn on
the node passes one gate, ``node.max_concurrent`` turn slots; a seat fetches
**one** message only once it holds a slot, so nothing waits in this node's
hands that it is not running (no prefetch).

A turn, in order:

1. **admission** — this node's last successful renew is under one heartbeat
   old (:meth:`SeatSweeper.admitted`); otherwise the seat stops fetching
   until it is, and a message already fetched is NAKed straight back;
   and the node's disk is above ``node.disk_floor`` (:mod:`crewlet.disk`):
   a turn's writes (its in-flight record, the ledger, the ack, the records)
   land on it, so while it is low the mail waits in the mailbox, unfetched;
2. **budget** — the org and seat caps of the company; a seat over one fetches
   nothing (its mail waits in the mailbox) and says so once (``turn_deferred``);
   a provider key cooling after a 429 is waited out the same way;
3. **the ledger** — a trigger already worked is acked and skipped (for
   plain mail, read while the model is first asked: only that call comes
   before its answer);
4. **the rounds** (:func:`crewlet.agent.turn.run_rounds`), the fence checked
   before each round's side effects;
5. **the ledger** entry and the **turn record**, together, each sent again
   through a stream leader election (:data:`SETTLE_PATIENCE`), then the
   **ack**, sent once and not waited on, with the connection's next write
   (:func:`crewlet.bus.publish_later`) (the ledger answers for the trigger
   by then); a ledger entry that cannot be written leaves the delivery
   unacked (see ``SeatWork._settle``). The record goes on the live feed
   (``feed.turn.<seat>``, core NATS, stored nowhere) and, durably, into the
   estate's log in one ``turn.records`` op with the records of other turns
   ending meanwhile (roles/seats/kept.py): the ``turns`` table of every data
   node's copy, each record held to its seat's fence and kept once under its
   own id. That table is the turns' one stored copy (custody's ``EVENTS``
   batches are no more). Ingress hears the records in batches, each seats
   process's of the last :data:`FEED_EVERY` s in one message
   (``feed.turns.<node>.<process>``). A turn that ends any other way (failed, handed
   back, skipped) is recorded after it settled.

A seat's tools reach the estate (tracker, knowledge base, files) through the
node's :class:`~crewlet.estate.router.Router`; on claiming a seat the node
writes a ``seat.fence`` op, so whatever the previous owner still writes under
its older token is refused on every copy.

A message counts as in this node's hands from its fetch to its ack. Its ack
token is written to ``<run>/inflight/<seat>`` first, so when the seats role
is killed mid-turn its next incarnation (or crewletd's, within the lease's
TTL) NAKs it on claiming the seat again, and the turn is redone at once
rather than after the 30-minute ack wait. After the ack (sent once, not
waited on) the record stays, marked acked, until the next fetch: the next
incarnation sends that ack again, confirmed, for one cut off on its way out
by the kill. A node that dies whole has no next incarnation to do this; its
mail comes back after the ack wait, as DESIGN says. A record that cannot be
written (the disk filled under the turn) is no reason to keep the delivery:
it is handed back to come again in :data:`RETRY_DELAY` s, unworked — never
left to the ack wait.

**Poison mail.** The in-flight record also counts the crashes of the seats
process its delivery was in hand at, one after the other (``<token> <seq>
<crashes>``): a mail whose turn kills the process (a catastrophic regex in a
scripted rule, a provider that segfaults) would otherwise be redone for ever,
dropping every seat of the node each time, too far apart for the
supervisor's restart intensity to notice. A delivery taken back after a crash
is a *suspect*: its redo runs alone among the node's suspects (so mail that
merely shared a crash with it is not blamed for the next one), and once it
was in hand at :data:`POISON_CRASHES` crashes it is dead-lettered
(:data:`POISON_REASON`) instead of worked. A redo that ends any other way
(worked, failed, handed back) clears its count; so does a crash it was not
in hand at. Killing the seats process from outside (an operator, the OOM
killer) mid-turn counts the same: the same mail in hand at that many kills
in a row is taken for the cause.

**Lost to a crash.** Between the broker sending a delivery and this process
noting its token there is a moment no file can cover: a process killed then
(its loop wedged by another seat's turn, say) leaves a delivery nobody can
NAK, which would come back only after the ack wait. So the in-flight record
says ``fetching`` while a fetch is out; whoever holds the seat next on this
node and finds that left by a process that died resets the seat's mailbox to
its ack floor (:meth:`~crewlet.queue.base.Mailboxes.reset`): the lost
delivery comes again at once, and with it whatever else was unacked — a
NAK's delay cut short, mail acked out of order skipped by the ledger.

Mail wakes a seat: the node subscribes to ``agents.inbox.*`` (plain NATS, no
JetStream state; a member of a pool of several, to each of its seats' own
subject) and wakes the seat a message was published for. The wake names the
mail's trigger, so an idle seat begins its ledger read then, beside the fetch
(:meth:`SeatWork.wake`). After a turn the seat looks again only when the
delivery said mail was behind it or a wake came meanwhile (:meth:`SeatWork._drain`):
a look that finds nothing was a broker request a turn. A seat also
looks every :data:`POLL` seconds, for what a wake cannot announce: a delivery
whose ack wait ran out — less often when the node holds so many seats that
their looks together would pass :data:`POLLS_PER_S` (idle cost must not grow
with seats; a delivery that waited out a 30-minute ack wait can wait minutes).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import importlib
import json
import os
import random
import re
import time
import traceback
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crewlet import disk, log, outbox, redaction, sandbox
from crewlet.bus import JETSTREAM_TIMEOUT
from crewlet.agent.providers import CoolingDown, Provider, ProviderError, make_provider
from crewlet.agent.estate_tools import estate_tools
from crewlet.agent.skill_tools import skill_tools
from crewlet.agent.tools import Registry, builtin_tools
from crewlet.agent.turn import ASK_KEPT, Fenced, TurnRecord, run_rounds
from crewlet.company import Company, Seat
from crewlet.company.model import effective_sandbox
from crewlet.conversations import turn as conversation_turn
from crewlet.conversations.turn import RunTurn
from crewlet.coord.control_plane import ControlPlane, RevisionNotFound
from crewlet.coord.counters import Budgets, Cooldowns, CounterError, Ledger
from crewlet.estate.ops import SEAT_NAME, OpError, make_op, op_id
from crewlet.estate.router import EstateError
from crewlet.skills.registry import Registry as SkillRegistry
from crewlet.queue.base import Delivery, Mailbox, MailboxError, Mailboxes
from crewlet.queue.jetstream import SUBJECT as MAIL_SUBJECT
from crewlet.queue.post import TURN_SUBJECT, TURNS_SUBJECT
from crewlet.queue.notify import PERSON_HEADER
from roles.seats.kept import KeptTurns
from roles.seats.sweeper import SeatSweeper

# Seconds between a seat's own looks at its mailbox when no mail wakes it:
# only a delivery whose ack wait (30 min) ran out arrives unannounced, so a
# minute's delay on that is nothing. At most POLLS_PER_S looks a second for
# the whole node, though: 10,000 idle seats look every ~8 minutes each,
# not ~170 requests a second.
POLL = 60.0
POLLS_PER_S = 20.0
# Pauses before looking again when a wake found the mailbox empty (see _run).
WAKE_SETTLE = (0.02, 0.1, 0.5)
# Earlier company revisions kept for conversation runs that pinned them.
PINNED_KEPT = 4
# Seconds one turn may take, all rounds and tool calls included (well under the ack wait).
TURN_TIMEOUT = 300.0
# Seconds the writes after a turn's side effects (its ledger entry, its ack, its
# records) are sent again while unanswered: several stream leader elections
# (~5–6 s each, DESIGN §4), well under the ack wait.
SETTLE_PATIENCE = 30.0
# Delay of a NAK after a failure that may pass (a provider down, a cooldown):
# the first, doubled per delivery, up to the cap.
RETRY_DELAY = 5.0
RETRY_DELAY_MAX = 300.0
# Seconds after a NAK's delay that the seat looks for the redelivery.
REDELIVERY_MARGIN = 0.1
# Seconds between looks while a seat waits on admission, its fence or a budget;
# a cooling provider key is waited out until it cools, at most this long at a time.
RECHECK = 0.5
COOLING_RECHECK_MAX = 5.0
# Seconds a seat's loop pauses after a mailbox error (a leader election, a broker away).
MAILBOX_TROUBLE_PAUSE = 1.0
# Seconds between the stats reports to crewletd (crewletctl status --watch), and
# how many seats that only finished turns they carry (the most recent ones).
STATS_EVERY = 1.0
STATS_RECENT = 10
# A turn's brief (TurnEngine.brief): the episodes with its counterparty it is
# offered, the characters of each shown, and the seconds its reads may take
# (a stateless node asks a data node: not worth holding the turn up long).
EPISODES_OFFERED = 5
EPISODE_SHOWN = 300
BRIEF_TIMEOUT = 2.0
_SEAT_NAME = re.compile(SEAT_NAME)
# The live feed's batches for ingress (crewlet.queue.post.TURNS_SUBJECT): the
# records of turns ending within FEED_EVERY s of the last batch go in one
# message, the first record of a quiet moment at once; a batch past
# FEED_BATCH_BYTES goes at once (the broker's payload limit is 1 MiB). One
# message a turn was most of what ingress did for it (bench/slow_turns.py).
FEED_EVERY = 0.1
FEED_BATCH_BYTES = 256 * 1024
# Seconds a ledger read begun at a wake (SeatWork.wake) may be old when its
# turn starts: a read older than this is made again, so the answer a turn
# acts on is never much older than its fetch.
EARLY_LEDGER_FRESH = 1.0
# Seconds an old provider (the company changed it) is kept for the turns still using it.
PROVIDER_RETIRE_AFTER = TURN_TIMEOUT + 10
# Concurrent seat stops when the node stops or releases everything.
STOP_PARALLEL = 64
# The tool bridge's unix socket in the run dir (bound into a confined agent's
# sandbox): the first seats process's; a pool's other members serve theirs at
# bridge.<child>.sock (a second server on one path is refused).
BRIDGE_SOCKET = "bridge.sock"
# Crashes of the seats process one delivery may be in hand at, one after the
# other, before it is taken for their cause and dead-lettered (see "Poison
# mail" above). Three: one crash is bad luck, two may be a neighbour's doing.
POISON_CRASHES = 3
POISON_REASON = f"in hand at {POISON_CRASHES} crashes of the seats process"
# The last field of an in-flight record: who wrote it (the engine's
# ``incarnation``), or this for a stop whose NAK failed. A record left by this
# very process (a seat's loop restarted, a seat claimed again) or by a stop was
# in hand at no crash, and does not count as one.
_STOPPED = "stopped"
# The in-flight record's token while a fetch is out: the broker may hand a
# delivery to this process that it dies before noting (see "Lost to a crash").
_FETCHING = "fetching"
# The last field of a record whose delivery was worked, in the ledger, and its
# ack sent unconfirmed — queued on the connection, which a kill may cut before
# it is written. Whoever finds this sends the ack again, confirmed (an ack of
# a delivery acked already is answered and changes nothing): else such a
# delivery would wait out the ack wait (30 min) to be skipped by the ledger.
_ACKED = "acked"


if TYPE_CHECKING:
    from crewlet.agent.bridge import Bridge
    from crewlet.vault import Vault
    from crewlet.agent.mcp import SeatServers
    from crewlet.sandbox import Sandbox
    from crewlet.estate.router import Router


async def _mcp():
    """:mod:`crewlet.agent.mcp`, imported the first time a seat has MCP servers.

    The MCP SDK is ~30 MB and ~0.4 s of imports; a node whose seats run no
    MCP server never pays for it, and the import runs in a thread so the
    loop keeps turning meanwhile."""
    return await asyncio.to_thread(importlib.import_module, "crewlet.agent.mcp")


@dataclass
class Services:
    """What the built-in tools reach (see :class:`crewlet.agent.tools.ToolContext`)."""

    mailboxes: Mailboxes
    seats: frozenset[str]
    estate: "Router | None" = None  # the tracker, knowledge base and file tools' way in
    node: str = ""                  # this node's id: ops name the node that issued them
    outbox: Any = None              # await outbox(notification): onto OUTBOX (the notify tool)
    # The file tools' store (crewlet/agent/file_tools.py): the node's files: section and
    # the connection its nats store goes through.
    files: Any = None
    js: Any = None
    nc: Any = None
    replicas: int = 1
    # The company's people by id (crewlet.company.model.Person): the notify tool
    # sends to a person's address when given their id.
    people: Mapping[str, Any] = field(default_factory=dict)
    # The node's skill registry (crewlet.skills.registry): the skill_read tool's way in.
    skills: Any = None


class TurnEngine:
    """Every held seat's work on this node, and the node's turn slots.

    Invariants: ``work`` has an entry exactly for the seats the sweeper holds
    (added by :meth:`on_claim`, removed by :meth:`on_release`); ``running`` is
    the number of turns between fetch and ack, never above ``max_concurrent``.
    """

    def __init__(self, *, node: str, run_dir: str, mark: str, mailboxes: Mailboxes, ledger: Ledger,
                 budgets: Budgets, cooldowns: Cooldowns, sweeper: SeatSweeper,
                 max_concurrent: int, events_js, estate: "Router | None" = None,
                 space: disk.Watch | None = None, run_event_ttl: float = 4500.0,
                 approval_ttl: float = 86400.0, nc=None, files=None, replicas: int = 1,
                 sandbox: "Sandbox | None" = None, vault: "Vault | None" = None,
                 skills: "SkillRegistry | None" = None, bridge_socket: str = BRIDGE_SOCKET):
        self.node = node
        # The node's skill registry: a turn's prompt lists its seat's skills
        # from it, skill_read reads them through it (None: no skills, unit tests).
        self.skills = skills
        self.vault = vault  # the fleet's secrets its providers read their keys from (crewlet.vault)
        # Where the seats' tools and agents run (crewlet.sandbox); None: unwrapped (unit tests).
        self.sandbox = sandbox
        self.files, self.replicas = files, replicas  # the file tools' store (Services)
        self.nc = nc  # the connection a conversation run's turn hears a request to stop on
        self.space = space  # the node's disk: no turn starts while it is low
        self.estate = estate
        self.mark = mark
        self.run_dir = run_dir
        self.inflight_dir = os.path.join(run_dir, "inflight")
        self._bridge: "Bridge | None" = None  # started on first use (bridge())
        # Its socket file in the run dir: each member of a seats pool serves its own.
        self.bridge_socket = os.path.join(run_dir, bridge_socket)
        self._bridge_lock = asyncio.Lock()
        # Names this process in the in-flight records it writes. Made here, not
        # at import: roles are forked from a zygote that imported this module.
        self.incarnation = uuid.uuid4().hex[:12]
        os.makedirs(self.inflight_dir, mode=0o700, exist_ok=True)
        self.mailboxes = mailboxes
        self.ledger = ledger
        self.budgets = budgets
        self.cooldowns = cooldowns
        self.sweeper = sweeper
        self.js = events_js
        self.max_concurrent = max_concurrent
        # A conversation run's events are kept this long; its approvals wait this long.
        self.run_event_ttl = run_event_ttl
        self.approval_ttl = approval_ttl
        self.slots = asyncio.Semaphore(max_concurrent)
        self.running = 0
        self.peak = 0
        self.turns = 0
        # The seats whose turns ended last, oldest first: at most STATS_RECENT,
        # each once (what `stats` shows, without sorting every seat each time).
        self.recent: collections.OrderedDict[str, None] = collections.OrderedDict()
        # Turns whose side effects were done but whose ledger entry could not
        # be written (handed back, see SeatWork._settle), and records that did
        # not land: each a failure an operator must see.
        self.unsettled = 0
        self.records_failed = 0
        # Turn records to the log, many turns' in one op while many end at once.
        self.kept = KeptTurns(self._store_kept)
        # The live feed's batch being gathered (see FEED_EVERY): the encoded
        # records, their bytes, when the last batch went, its timer.
        self._feed: list[bytes] = []
        self._feed_bytes = 0
        self._feed_sent = float("-inf")
        self._feed_timer: asyncio.TimerHandle | None = None
        self._feed_subject = f"{TURNS_SUBJECT}{node}.{self.incarnation}"
        self.company: Company | None = None
        self.revision: int | None = None  # the company revision in force here
        # Earlier revisions a conversation run pinned, and their providers
        # where they differ from the ones in force (see pinned()).
        self._pinned: dict[int, Company] = {}
        self._pinned_providers: dict[tuple[int, str], Provider] = {}
        self.seat_cfgs: dict[str, Seat] = {}  # the company's seats by name
        self.services: Services | None = None
        self.providers: dict[str, Provider] = {}
        self._provider_specs: dict[str, Any] = {}
        self.work: dict[str, SeatWork] = {}
        # Held by the turn of a suspect (a delivery in hand at a crash), so
        # suspects are redone one at a time (see "Poison mail").
        self.quarantine = asyncio.Lock()
        self.poisoned = 0  # deliveries dead-lettered as poison mail
        self.brief_failures = 0  # turns whose skills or episodes could not be read (brief())
        # Set (to the wake callback) when each seat's work subscribes to its
        # own mailbox's subject rather than the process to every one's
        # (roles/seats/__init__.py: a member of a pool of several).
        self.wakes_per_seat: Any = None
        # Background work that must finish before the role ends (servers stopping).
        self._pending: set[asyncio.Task] = set()

    # ------------------------------------------------------------ company

    def set_company(self, company: Company, rev: int | None = None) -> None:
        self.company = company
        self.revision = rev
        self.seat_cfgs = {seat.name: seat for seat in company.seats}
        self.services = Services(self.mailboxes, frozenset(s.name for s in company.seats),
                                 self.estate, self.node, outbox=functools.partial(outbox.put, self.js),
                                 files=self.files, js=self.js, nc=self.nc, replicas=self.replicas,
                                 people=company.people, skills=self.skills)
        specs = {name: p.model_dump() for name, p in company.providers.items()}
        for name in list(self.providers):
            if specs.get(name) != self._provider_specs.get(name):
                self._retire(self.providers.pop(name))
        for name, spec in company.providers.items():
            if name not in self.providers:
                self.providers[name] = make_provider(name, spec, cooldowns=self.cooldowns, vault=self.vault)
        self._provider_specs = specs
        for seat, work in self.work.items():
            self._watch_budget(seat)
            work.wake()  # budgets or providers may have changed

    async def pinned(self, rev: int, seat: str) -> tuple[Seat, Provider] | None:
        """*seat* and its provider as company revision *rev* has them — the one
        a conversation run pinned when it started — or None when that is the
        revision in force (or *rev* no longer has the seat, or is gone: the
        run goes on with what is in force, said in the log). The seat's tools
        are the ones its servers offer now: they run with the lease, not per
        revision. Raises :class:`~crewlet.coord.control_plane.ControlPlaneError`
        when the revision could not be read (the turn is handed back)."""
        if self.company is None or rev == self.revision:
            return None
        company = self._pinned.get(rev)
        if company is None:
            try:
                record = await ControlPlane(self.js, None).revision(rev)
            except RevisionNotFound:
                log.event("run_revision_gone", "warning", seat=seat, rev=rev, using=self.revision)
                return None
            # Read whole from its parts (a damaged one raises, and the turn is
            # handed back); validated in a thread: 10,000 seats take a second.
            company = await asyncio.to_thread(Company.model_validate, record["company"])
            while len(self._pinned) >= PINNED_KEPT:
                oldest = min(self._pinned)
                self._pinned.pop(oldest)
                for key in [k for k in self._pinned_providers if k[0] == oldest]:
                    self._retire(self._pinned_providers.pop(key))
            self._pinned[rev] = company
        seat_cfg = next((s for s in company.seats if s.name == seat), None)
        spec = company.providers.get(seat_cfg.provider) if seat_cfg is not None else None
        if seat_cfg is None or spec is None:
            log.event("run_revision_without_seat", "warning", seat=seat, rev=rev, using=self.revision)
            return None
        name = seat_cfg.provider
        if self._provider_specs.get(name) == spec.model_dump() and name in self.providers:
            return seat_cfg, self.providers[name]
        provider = self._pinned_providers.get((rev, name))
        if provider is None:
            provider = self._pinned_providers[(rev, name)] = make_provider(
                name, spec, cooldowns=self.cooldowns, vault=self.vault)
        return seat_cfg, provider

    def _retire(self, provider: Provider) -> None:
        """Close a provider the company replaced once the turns using it are over."""
        async def later() -> None:
            await asyncio.sleep(PROVIDER_RETIRE_AFTER)
            await provider.close()
        self._background(later())

    def _background(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _watch_budget(self, seat: str) -> None:
        # Only a capped seat's total is read back each flush: at 10,000 seats,
        # reading every seat's would keep the broker busy for nothing.
        if self.company is not None and seat in self.company.budgets.seats:
            self.budgets.watch(seat)
        else:
            self.budgets.unwatch(seat)

    # ------------------------------------------------------------ the hooks

    async def on_claim(self, seat: str, held, fence: bool = True) -> None:
        """The sweeper holds *seat* now: start its work (never blocks the sweep).
        *fence*: a holder before us may still be writing, so the seat's fence
        is raised to our token on every copy at once."""
        log.event("seat_claimed", seat=seat, token=held.token if held else None)
        old = self.work.pop(seat, None)
        if old is not None:
            await old.stop()
        work = SeatWork(self, seat, held.token)
        self.work[seat] = work
        self._watch_budget(seat)
        work.start()
        if self.estate is not None and fence:
            self._background(self._fence(seat, held.token))

    async def _fence(self, seat: str, token: int) -> None:
        """Raise the seat's fence on every copy to our token (best effort: our
        own first write would raise it too; this closes the gap before it)."""
        try:
            op = make_op("seat.fence", {}, node=self.node, seat=seat, token=token,
                         id=op_id("fence", seat, str(token)))
            await self.estate.to_log(self.js, op, timeout=JETSTREAM_TIMEOUT)
        except Exception as exc:
            log.event("seat_fence_failed", "warning", seat=seat, token=token,
                      error=f"{type(exc).__name__}: {exc}")

    async def on_release(self, seat: str, held) -> None:
        """*seat* is given up or lost: hand back what was fetched, stop its work.

        The NAK happens before this returns (and so before the lease is
        deleted), so the successor's first fetch finds the mail. The seat's
        MCP servers are stopped after, without holding up the sweep.
        """
        log.event("seat_released", seat=seat)
        work = self.work.pop(seat, None)
        self.budgets.unwatch(seat)
        if work is not None:
            await work.stop(servers_later=True)

    def busy(self, seat: str) -> bool:
        """Is a turn of *seat* running now (a draining node waits for it)?"""
        work = self.work.get(seat)
        return work is not None and work.turn is not None

    def wake(self, seat: str, trigger: str | None = None) -> None:
        """Mail was published for *seat* (its *trigger*, when the mail said)."""
        work = self.work.get(seat)
        if work is not None:
            work.wake(trigger)

    async def quiesce(self) -> None:
        """Stop every seat's work at once, handing back what is in hand (the
        node is stopping: the leases are released after, all NAKs done)."""
        works = list(self.work.values())
        self.work.clear()
        limit = asyncio.Semaphore(STOP_PARALLEL)

        async def one(work: SeatWork) -> None:
            async with limit:
                await work.stop()
        await asyncio.gather(*(one(w) for w in works))

    async def close(self) -> None:
        await self.quiesce()
        await self.kept.close()
        await self._send_feed()  # the last records' batch, now: not left to its timer
        for task in list(self._pending):
            task.cancel()  # providers waiting to retire: close them now, below
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        for provider in [*self.providers.values(), *self._pinned_providers.values()]:
            await provider.close()
        if self._bridge is not None:
            await self._bridge.close()

    async def bridge(self) -> "Bridge":
        """The tool bridge (crewlet.agent.bridge): crewlet's own tools over MCP
        for the seats' CLI agents, started the first time a CLI agent's turn
        needs it — a node whose seats run no CLI agent never serves it."""
        async with self._bridge_lock:
            if self._bridge is None:
                module = await asyncio.to_thread(importlib.import_module, "crewlet.agent.bridge")
                bridge = module.Bridge()
                # Reached by a confined agent only through its bind of the socket
                # (the run dir is 0700): 0666 lets a seat's own uid connect, and
                # its turn's token is what admits it.
                shared = self.sandbox is not None and self.sandbox.root
                await bridge.start(socket_path=self.bridge_socket,
                                   socket_mode=0o666 if shared else 0o600)
                self._bridge = bridge
        return self._bridge

    # ------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        """The node's turns for crewletctl status: seats busy now, and the most recent."""
        shown = {seat for seat in self.recent if seat in self.work} | \
            {seat for seat, w in self.work.items() if w.turn is not None or w.deferred or w.servers}
        return {"running": self.running, "max_concurrent": self.max_concurrent, "peak": self.peak,
                "turns": self.turns, "held": len(self.work), "org_spent": self.budgets.spent("")[0],
                "unsettled": self.unsettled, "records_failed": self.records_failed,
                "record_batches": self.kept.batches, "records_kept": self.kept.records,
                "poisoned": self.poisoned, "brief_failures": self.brief_failures,
                # The node's skill registry: how many it holds, when it last walked.
                "skills": self.skills.status() if self.skills is not None else None,
                # What this process's own probe found: its tools run under it
                # (crewletd's status shows this one once reported).
                "sandbox": self.sandbox.describe() if self.sandbox is not None else None,
                "seats": {seat: self.work[seat].stats() for seat in sorted(shown)}}

    # ------------------------------------------------------------ helpers

    def fence(self, seat: str, token: int) -> bool:
        """Does this node still hold *seat* under *token*, by its own clock?

        A lease renewed at *t* lives on the server until at least *t* + TTL,
        and nobody can claim a live key, so a fresh lease needs no round trip.
        """
        return self.sweeper.holds(seat, token)

    def over_budget(self, seat: str) -> str | None:
        """Why *seat* may not start a turn now for its spend, or None."""
        company = self.company
        if company is None:
            return None
        org_spent, seat_spent = self.budgets.spent(seat)
        cap = company.budgets.org
        # The reason names the cap, not the spend: it is said once per change.
        if cap is not None and org_spent >= cap:
            return f"org budget of {cap} tokens spent"
        cap = company.budgets.seats.get(seat)
        if cap is not None and seat_spent >= cap:
            return f"seat budget of {cap} tokens spent"
        return None

    async def brief(self, seat: str, counterparty: str, as_of: int | None = None) -> str:
        """What a turn's system prompt adds to the seat's persona: the skills
        that apply to it (as of a run's pin, else the registry's), and its
        recent episodes with this counterparty. Memory is help, not a
        condition of the turn: a read that fails leaves its part out (said
        once in a while in the log)."""
        parts: list[str] = []
        try:
            if self.skills is not None:
                parts.append(self.skills.prompt(seat) if as_of is None
                             else await self.skills.prompt_as_of(seat, as_of))
            if self.estate is not None:
                answer = await self.estate.read("episode.list", {"seat": seat, "counterparty": counterparty,
                                                                 "limit": EPISODES_OFFERED},
                                                timeout=BRIEF_TIMEOUT)
                parts.append(episodes_text(counterparty, answer.get("episodes") or []))
        except (EstateError, OpError, TimeoutError) as exc:
            self.brief_failures += 1
            if self.brief_failures % 100 == 1:
                log.event("turn_brief_failed", "warning", seat=seat, failures=self.brief_failures,
                          error=f"{type(exc).__name__}: {exc}")
        return "".join(f"\n\n{p}" for p in parts if p)

    def inflight_path(self, seat: str) -> str:
        return os.path.join(self.inflight_dir, seat)

    @staticmethod
    def _record_id(record: TurnRecord) -> str:
        # One row per delivery worked, and one `done` row per trigger: a resend
        # of either, by any node, alone or in another op, lands once.
        which = "done" if record.outcome == "done" else str(record.deliveries)
        return op_id(record.seat, "turn", record.trigger, which)

    async def _durable_record(self, record: TurnRecord, body: dict[str, Any], deadline: float,
                              token: int | None = None) -> None:
        """The record as an op of its own (while a data node of the fleet
        cannot read ``turn.records``: :meth:`Router.batches_records`)."""
        op = make_op("turn.record", {"record": body}, node=self.node, seat=record.seat,
                     token=record.token if token is None else token, id=self._record_id(record))
        await self.estate.to_log(self.js, op, timeout=JETSTREAM_TIMEOUT, deadline=deadline)

    async def _store_kept(self, records: list[dict[str, Any]], deadline: float) -> None:
        """The records of turns ending together, as one ``turn.records`` op
        in the log (roles/seats/kept.py); its id is fresh, each record's is its own."""
        op = make_op("turn.records", {"records": records}, node=self.node,
                     id=f"turns:{uuid.uuid4().hex}")
        await self.estate.to_log(self.js, op, timeout=JETSTREAM_TIMEOUT, deadline=deadline)

    async def record_done_again(self, seat: str, trigger: str, worked: dict[str, Any]) -> None:
        """Publish again the ``done`` record of a trigger the ledger says was
        worked, from its ledger entry (*worked*): on the live feed and as the
        durable row, under this seat's token. The row lands once (its id), so
        for the estate this is a no-op when the record landed (the usual
        case); the feed's listeners may hear it twice. It is the record the
        turn's own process did not live to publish otherwise."""
        if worked.get("seat") != seat:
            return  # the ledger is by trigger: another seat's turn is that seat's to record
        try:
            record = TurnRecord(seat, trigger, str(worked.get("node") or ""), int(worked.get("token") or 0),
                                0, outcome="done", rounds=int(worked.get("rounds") or 0),
                                started_at=float(worked.get("at") or time.time()))
        except (TypeError, ValueError) as exc:
            self.records_failed += 1
            log.event("turn_record_failed", "error", seat=seat, trigger=trigger,
                      error=f"the ledger entry is not a turn: {type(exc).__name__}: {exc}")
            return
        held = self.sweeper.held.get(seat)
        await self.publish_record(record, token=held.token if held is not None else None)

    async def publish_record(self, record: TurnRecord, patience: float = SETTLE_PATIENCE,
                             token: int | None = None) -> None:
        """The live feed and the durable row (under *token*, else the
        record's), at once; the row sent again through a stream leader
        election for *patience* seconds, in one ``turn.records`` op with the
        records of turns ending meanwhile (roles/seats/kept.py). A record
        that still did not land is counted (``records_failed`` in the stats)
        and said: the turn itself is settled by then, its ledger entry
        written. The feed is core NATS, heard by whoever listens now; a
        record with no trigger (a deferral) is news for it alone, not a turn
        worked, and is not stored.

        A seat that is stopping gives its last record only a moment: its stop
        must end within the role's shutdown time, quorum or not."""
        body = record.as_dict()
        data = json.dumps(body).encode()
        deadline = time.monotonic() + patience
        published = [self.nc.publish(TURN_SUBJECT + record.seat, data)]
        self._batch_feed(data)
        if self.estate is not None and record.trigger:
            token = record.token if token is None else token
            if self.estate.batches_records():
                entry = {"id": self._record_id(record), "seat": record.seat, "token": token,
                         "record": body}
                published.append(self.kept.keep(entry, len(data), deadline))
            else:
                published.append(self._durable_record(record, body, deadline, token))
        for result in await asyncio.gather(*published, return_exceptions=True):
            if isinstance(result, BaseException):
                self.records_failed += 1
                log.event("turn_record_failed", "error", seat=record.seat, trigger=record.trigger,
                          error=f"{type(result).__name__}: {result}")


    def _batch_feed(self, data: bytes) -> None:
        """Add a record (*data*, encoded) to the live feed's next batch."""
        self._feed.append(data)
        self._feed_bytes += len(data)
        if self._feed_bytes >= FEED_BATCH_BYTES:
            self._background(self._send_feed())
        elif self._feed_timer is None:
            wait = max(0.0, self._feed_sent + FEED_EVERY - time.monotonic())
            self._feed_timer = asyncio.get_running_loop().call_later(
                wait, lambda: self._background(self._send_feed()))

    async def _send_feed(self) -> None:
        """Publish the records gathered as one batch (core NATS: heard by
        whoever listens now, as each record on its own subject is)."""
        if self._feed_timer is not None:
            self._feed_timer.cancel()
            self._feed_timer = None
        if not self._feed:
            return
        batch = b"[" + b",".join(self._feed) + b"]"
        count = len(self._feed)
        self._feed, self._feed_bytes, self._feed_sent = [], 0, time.monotonic()
        try:
            await self.nc.publish(self._feed_subject, batch)
        except Exception as exc:  # the connection's trouble: the feed is news, not custody
            log.event("turn_feed_failed", "warning", records=count, error=f"{type(exc).__name__}: {exc}")


def episodes_text(counterparty: str, episodes: list[dict[str, Any]]) -> str:
    """The lines of a prompt that tell a seat its recent work with *counterparty*
    (oldest first; '' when there is none)."""
    if not episodes:
        return ""
    who = "the operator" if counterparty == "operator" else counterparty
    lines = [f"Your recent work with {who} (oldest first):"]
    for e in episodes:
        when = time.strftime("%Y-%m-%d", time.gmtime(e.get("at") or 0))
        if e.get("compacted"):
            lines.append(f"- until {when}, {e['compacted']} earlier turns: {e.get('summary', '')[:EPISODE_SHOWN]}")
            continue
        tools = f"; you used {', '.join(e['tools'])}" if e.get("tools") else ""
        lines.append(f"- {when}: asked \"{(e.get('ask') or '')[:EPISODE_SHOWN // 2]}\"{tools}; "
                     f"{e.get('outcome')}: {(e.get('summary') or '')[:EPISODE_SHOWN]}")
    return "\n".join(lines)


def counterparty(headers: dict[str, str]) -> str:
    """Who a mail's turn works with, as its episode names them
    (crewlet.estate.skills): the person a webhook's sender is, the seat or
    integration that sent it, a conversation's, or the operator."""
    person = headers.get(PERSON_HEADER)
    if person:
        return f"person:{person}"
    conversation = headers.get(conversation_turn.CONVERSATION_HEADER)
    if conversation:
        return f"conversation:{conversation}"
    sender = headers.get("Crewlet-From") or ""
    if sender.startswith(("hook:", "schedule:")):
        return sender
    if _SEAT_NAME.match(sender):
        return f"seat:{sender}"
    return "operator"  # crewletctl's, the API's (the people behind them are not told apart)


def _retrieved(read: asyncio.Future) -> None:
    """A ledger read begun early that no turn took: its failure is nobody's news."""
    if not read.cancelled():
        read.exception()


async def _answer(ledger: asyncio.Future) -> dict[str, Any] | None:
    """What the ledger read *ledger* answered; None when it failed."""
    try:
        return await ledger
    except Exception:
        return None


class _Worked(Exception):
    """The ledger answered, during a turn's first model call, that its trigger was worked."""

    def __init__(self, worked: dict[str, Any]):
        super().__init__("the trigger was worked")
        self.worked = worked


class SeatWork:
    """One held seat: its MCP servers, its tools and its mailbox loop.

    Invariants: ``fetched`` is the delivery in this node's hands whose turn
    has not started, ``turn`` the one being worked (both NAKed on stop, a
    turn ``settling`` only once it ended: then it acked its delivery itself);
    once ``stopped`` is set the loop fetches nothing more, even if the
    cancel that follows is lost (Python 3.11's ``wait_for`` can swallow one).
    """

    def __init__(self, engine: TurnEngine, seat: str, token: int):
        self.engine = engine
        self.seat = seat
        self.token = token
        self.registry = Registry()
        for tool in builtin_tools() + (estate_tools() if engine.estate is not None else []) \
                + (skill_tools() if engine.skills is not None else []):
            self.registry.add(tool)
        self.servers: "SeatServers | None" = None
        self.mailbox: Mailbox = engine.mailboxes.attach(seat)
        self.fetched: Delivery | None = None
        self.turn: Delivery | None = None
        # Not None while the turn in hand settles (its side effects done: its
        # ledger entry, record and ack under way); set once that turn is over.
        self.settling: asyncio.Event | None = None
        self.deferred: str | None = None
        self.last: dict[str, Any] | None = None
        self.turns = 0
        self.looks = 0  # fetches from the mailbox, found something or not (see _drain)
        self.restarts = 0  # failures of the loop in a row (reset by a turn)
        self.stopped = False
        self._trouble: str | None = None  # the mailbox error last logged
        self._wake = asyncio.Event()
        # Whether this loop found the mailbox empty since it started, and the
        # wakes heard since it last did less the first deliveries fetched
        # since: while every message is announced by a wake, a delivery that
        # left nothing behind it (its ``pending`` 0) needs no look after its
        # turn (see _drain).
        self._emptied = False
        self._announced = 0
        self._left: int | None = None  # the last delivery's pending, if a first delivery
        self._all_fetched = False  # the last drain ended on such a delivery, not an empty look
        # A ledger read begun when a wake named the mail's trigger while the
        # seat had no turn in hand: (trigger, the read, when it began).
        self._early: tuple[str, asyncio.Future, float] | None = None
        self._task: asyncio.Task | None = None
        self._wakes: Any = None  # this seat's own wake subscription (TurnEngine.wakes_per_seat)
        self._inflight_fd: int | None = None  # <run>/inflight/<seat>, open while turns run
        # (stream seq, crashes) of the delivery taken back after a crash, until
        # its redo starts; the crashes the turn in hand was in hand at before.
        self.suspect: tuple[int, int] | None = None
        self._crashes = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"seat {self.seat}")
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        """The loop only ends by stop(); anything else is a failure: say so, start again."""
        if task.cancelled() or self.stopped:
            return
        exc = task.exception()
        log.event("seat_work_failed", "error", seat=self.seat,
                  error=f"{type(exc).__name__}: {exc}" if exc else "ended",
                  traceback="".join(traceback.format_exception(exc)) if exc else None)
        self.restarts += 1
        pause = min(RETRY_DELAY_MAX, RECHECK * 2 ** min(self.restarts, 10))
        self._task = asyncio.create_task(self._again(pause), name=f"seat {self.seat}")
        self._task.add_done_callback(self._ended)

    async def _again(self, pause: float) -> None:
        await asyncio.sleep(pause)
        await self._run()

    def wake(self, trigger: str | None = None) -> None:
        """Look at the mailbox; *trigger*: the mail a publish announced.

        Its ledger read starts now, beside the fetch that will bring the
        mail, when no turn of this seat is in hand: one that is could still
        write the same trigger's ledger entry, so a read begun meanwhile
        might be stale (issue 13's lever: the read off the turn's path)."""
        self._announced += 1
        self._wake.set()
        if trigger and self._early is None and self.turn is None and self.fetched is None \
                and not self.stopped and self._task is not None:
            read = asyncio.ensure_future(self.engine.ledger.done(trigger))
            read.add_done_callback(_retrieved)
            self._early = (trigger, read, time.monotonic())

    def _ledger_read(self, trigger: str) -> asyncio.Future:
        """The ledger read of *trigger* for the turn starting now: the one a
        wake began, if it named this trigger and is fresh, else a new one.
        Either way no other read waits for a later turn (see wake)."""
        early, self._early = self._early, None
        if early is not None:
            named, read, began = early
            if named == trigger and time.monotonic() - began < EARLY_LEDGER_FRESH:
                return read
            read.cancel()
        return asyncio.ensure_future(self.engine.ledger.done(trigger))

    def _forget_early(self) -> None:
        if self._early is not None:
            self._early[1].cancel()
            self._early = None

    def stats(self) -> dict[str, Any]:
        return {"running": self.turn is not None, "turns": self.turns, "looks": self.looks,
                "deferred": self.deferred,
                "last": self.last, "mcp": self.servers.status() if self.servers else {}}

    async def stop(self, *, servers_later: bool = False) -> None:
        """Stop fetching; NAK what is in hand (a turn cut short too, unless it
        is settling: that one is let end); stop the servers."""
        self.stopped = True
        self._forget_early()
        settling = self.settling
        if settling is not None:
            # Its side effects are done and its ledger entry and `done` record
            # are on their way: cut short, its delivery would be NAKed all the
            # same, and the successor would skip it with a second `done`
            # record — or, the entry not in yet, work it again (a rebalance's
            # release landed there under load; issue 26). Let it end: it acks
            # (or hands back) its delivery itself, in a broker round trip,
            # bounded by SETTLE_PATIENCE and the role's stop budget; nothing
            # more is fetched once stopped.
            await settling.wait()
        # Read before cancelling: the loop forgets them as it unwinds. A turn
        # that acked just before the cancel lands is NAKed too, which is ignored.
        in_hand = [d for d in (self.fetched, self.turn) if d is not None]
        in_turn = self.turn  # the one the in-flight record names
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception as exc:
                log.event("seat_work_failed", "error", seat=self.seat, error=f"{type(exc).__name__}: {exc}")
        handed_back = True
        for delivery in in_hand:
            try:
                await self.mailbox.nak(delivery)
            except Exception as exc:
                # Keep the in-flight record: whoever holds the seat next on this
                # node NAKs it; elsewhere the ack wait brings it back. Marked
                # as a stop, not a crash: it is no evidence of poison.
                handed_back = False
                log.event("seat_nak_failed", "warning", seat=self.seat, error=f"{type(exc).__name__}: {exc}")
                if delivery is in_turn:
                    self._remember_inflight(delivery, self._crashes, _STOPPED)
        self.fetched = self.turn = None
        if handed_back:
            self._forget_inflight()
        self._close_inflight()
        if self._wakes is not None:
            wakes, self._wakes = self._wakes, None
            with contextlib.suppress(Exception):  # the connection's trouble: it goes with it
                await wakes.unsubscribe()
        try:
            await self.mailbox.detach()
        except Exception as exc:
            log.event("seat_detach_failed", "warning", seat=self.seat, error=f"{type(exc).__name__}: {exc}")
        if self.servers is not None:
            if servers_later:
                self.engine._background(self.servers.stop())
            else:
                await self.servers.stop()

    # ------------------------------------------------------------ the loop

    async def _run(self) -> None:
        engine = self.engine
        await self._recover_inflight()
        seat_cfg = self._seat_cfg()
        if seat_cfg is not None and seat_cfg.mcp and self.servers is None:
            mcp = await _mcp()
            self.servers = mcp.SeatServers(self.seat, seat_cfg.mcp, self.registry, mark=engine.mark,
                                           sandbox=engine.sandbox, seat_sandbox=seat_cfg.sandbox)
            await self.servers.start()
        if engine.wakes_per_seat is not None and self._wakes is None:
            # Before the first look: mail published after it wakes the seat.
            self._wakes = await engine.nc.subscribe(f"{MAIL_SUBJECT}{self.seat}", cb=engine.wakes_per_seat)
        self._wake.set()
        while not self.stopped:
            # A wake that came while the last drain ran is taken at once: no
            # timer armed and cancelled for it (one a turn, under load).
            woken = self._wake.is_set()
            if not woken:
                try:
                    poll = max(POLL, len(engine.work) / POLLS_PER_S)
                    async with asyncio.timeout(poll * random.uniform(0.8, 1.2)):
                        await self._wake.wait()
                    woken = True
                except TimeoutError:
                    pass
            # Work until the mailbox is empty; mail arriving meanwhile sets the
            # event again, so clearing it first loses no wake.
            self._wake.clear()
            if woken and self._all_fetched and self._announced <= 0:
                # The wake was for mail the last drain fetched already (it came
                # while that drain's turn ran): nothing to look for.
                self._all_fetched = False
                continue
            worked = await self._drain()
            # A wake can outrun the stream's store of the message it announces
            # (measured: ~3 % of sends on one server, more on a cluster, a fetch
            # right after the wake finds nothing): look again shortly, holding no slot.
            for pause in WAKE_SETTLE if woken and not worked else ():
                await asyncio.sleep(pause)
                if await self._drain():
                    break

    async def _drain(self) -> int:
        """Work messages until the mailbox has none; how many there were.

        A look that finds the mailbox empty is a broker request and a reply
        (a tenth of the seats process's work a turn, at 100 in flight, with
        one message a seat at a time), so it is skipped when the last
        delivery said the mailbox held nothing after it, the loop found the
        mailbox empty since it started, and every wake heard since was for
        mail fetched since: then anything published after that delivery
        wakes the seat again, and a delivery that comes back (a NAK's delay,
        the ack wait) is looked for by its own timer or the poll, as it is
        when the seat is idle."""
        worked = 0
        self._all_fetched = False
        while await self._one():
            worked += 1
            if self._emptied and self._announced <= 0 and self._left == 0:
                self._all_fetched = True
                break
        return worked

    async def _one(self) -> bool:
        """Fetch and work one message; False when there was none to work."""
        engine = self.engine
        await self._wait_until_startable()
        # A suspect's redo waits for the other suspects' to end (see "Poison mail").
        async with engine.quarantine if self.suspect is not None else contextlib.nullcontext():
            async with engine.slots:
                if self.stopped:
                    return False
                try:
                    self._mark_fetching()
                    self.looks += 1
                    delivery = await self.mailbox.next()
                except (MailboxError, OSError) as exc:
                    self._forget_inflight_quietly()
                    await self._mailbox_trouble(exc)
                    return False
                if delivery is None:
                    self._forget_inflight_quietly()
                    self.suspect = None  # it went elsewhere (worked or dead-lettered)
                    self._emptied, self._announced = True, 0
                    return False
                self.fetched = delivery
                # What the mailbox held after it (see _drain): only a first
                # delivery was announced; a redelivery may have others behind it.
                self._left = delivery.pending if delivery.deliveries == 1 else None
                if delivery.deliveries == 1:
                    # Not below 0: mail published before this loop listened
                    # was never announced, and must not cancel a wake to come.
                    self._announced = max(0, self._announced - 1)
                if self.stopped or not engine.sweeper.admitted() or engine.sweeper.draining \
                        or not engine.fence(self.seat, self.token):
                    # Our renewals are late, or the seat is going: hand it back at
                    # once and fetch nothing more until that changes. It comes
                    # back unannounced: the next drain looks until it is empty.
                    self.fetched = None
                    self._emptied = False
                    await self.mailbox.nak(delivery)
                    self._forget_inflight_quietly()
                    return False
                engine.running += 1
                engine.peak = max(engine.peak, engine.running)
                self.turn, self.fetched = delivery, None
                try:
                    await self._turn(delivery)
                finally:
                    self.turn = None
                    engine.running -= 1
                    if self.settling is not None:
                        self.settling.set()  # a stop waiting for this turn goes on
                        self.settling = None
        return True

    async def _mailbox_trouble(self, exc: Exception) -> None:
        """A fetch failed (a leader election, the broker away): say so once, pause."""
        why = f"{type(exc).__name__}: {exc}"
        if why != self._trouble:
            log.event("seat_mailbox_trouble", "warning", seat=self.seat, error=why)
            self._trouble = why
        await asyncio.sleep(MAILBOX_TROUBLE_PAUSE)

    async def _wait_until_startable(self) -> None:
        """Admission, the fence, the budget and cooldowns, waited out here so no mail
        is fetched meanwhile."""
        engine = self.engine
        while not self.stopped:
            pause = RECHECK
            why = None
            if not engine.sweeper.admitted():
                why = "admission: this node's lease renewals are late"
            elif engine.sweeper.draining:
                why = "admission: this node is draining (its seats are handed over)"
            elif not engine.fence(self.seat, self.token):
                why = "admission: the seat's lease is not fresh"
            elif engine.space is not None and (low := engine.space.low()) is not None:
                why = low.reason()
            elif (budget := engine.over_budget(self.seat)) is not None:
                why = budget
            else:
                provider = self._provider()
                until = await provider.cooling() if provider is not None else None
                if until is not None:
                    why = f"provider {provider.name} is cooling after a 429"
                    pause = min(COOLING_RECHECK_MAX, max(RECHECK, until - time.time()))
                    pause *= random.uniform(1.0, 1.2)  # seats sharing a key do not wake together
            if why is None:
                if self.deferred is not None:
                    log.event("turn_resumed", seat=self.seat)
                self.deferred = None
                return
            if why != self.deferred and not why.startswith("admission"):
                log.event("turn_deferred", "warning", seat=self.seat, reason=why)
                await engine.publish_record(TurnRecord(self.seat, "", engine.node, self.token, 0,
                                                       outcome="deferred", error=why),
                                            JETSTREAM_TIMEOUT)  # news, not work: once is enough
            self.deferred = why
            await asyncio.sleep(pause)

    async def _turn(self, delivery: Delivery) -> None:
        engine = self.engine
        record = TurnRecord(self.seat, delivery.trigger, engine.node, self.token, delivery.deliveries,
                            sender=delivery.headers.get("Crewlet-From"),
                            counterparty=counterparty(delivery.headers))
        started = time.monotonic()
        # The crashes this delivery was in hand at, if it is the suspect taken
        # back after the last one; any other delivery starts a count of its own.
        suspect, self.suspect = self.suspect, None
        self._crashes = suspect[1] if suspect is not None and suspect[0] == delivery.seq else 0
        try:
            self._remember_inflight(delivery, self._crashes)
        except OSError as exc:
            # Escaping from here, the delivery stayed in hand unacked: it came
            # back only after the ack wait (30 min). Unrecorded, it is not worked
            # (a crash would lose it to that wait again): it goes back now.
            why = engine.space.explain(exc) if engine.space is not None else None
            log.event("turn_deferred", "warning", seat=self.seat, trigger=delivery.trigger,
                      reason=f"the in-flight record could not be written: {why or exc}")
            await self._hand_back(delivery, RETRY_DELAY)
            return
        settled = False  # acked, NAKed or dead-lettered: no longer in our hands
        grant = None  # the tool bridge's grant to this turn's CLI agent, revoked as it ends
        recorded = False  # the turn record was published before the ack
        # The ledger is read while the model is first asked: nothing of the
        # turn happens before the ledger answers but that call, whose answer
        # is thrown away if the trigger was worked (a redelivery after a
        # crash between ledger and ack; the same trigger mailed again) — a
        # broker round trip less on every turn for a model call more on
        # those. Not for a suspect (its model call may be what kills the
        # process) nor a conversation's run (its work reads and writes the
        # estate from the start).
        ledger = self._ledger_read(delivery.trigger)
        try:
            seat_cfg, provider = self._seat_cfg(), self._provider()
            run = self._run_of(delivery, seat_cfg)
            if run is None:
                record.ask = redaction.scrub(delivery.data[:ASK_KEPT * 4].decode(errors="replace")[:ASK_KEPT])
            early = self._crashes == 0 and run is None and seat_cfg is not None and provider is not None
            if not early:
                worked = await ledger
                if worked is not None:
                    await self._skip(delivery, record, worked, run)
                    settled = True
                    return
            if self._crashes >= POISON_CRASHES:
                # Its turn kills the process: working it again would drop every
                # seat of the node once more. The other seats go on meanwhile.
                record.outcome, record.error = "failed", POISON_REASON
                log.event("turn_poison", "error", seat=self.seat, trigger=delivery.trigger,
                          seq=delivery.seq, crashes=self._crashes)
                await self.mailbox.dead_letter(delivery, POISON_REASON)
                engine.poisoned += 1
                settled = True
                return
            if seat_cfg is None or provider is None:
                record.outcome, record.error = "failed", "seat or provider not in the company"
                await self._hand_back(delivery, RETRY_DELAY)
                settled = True
                return

            async def unworked() -> None:
                try:
                    worked = await ledger
                except Exception as exc:  # not the turn's own timeout: the ledger's trouble (below)
                    raise RuntimeError(f"the ledger did not answer: {type(exc).__name__}: {exc}") from exc
                if worked is not None:
                    raise _Worked(worked)
            limit: asyncio.Timeout | None = None
            try:
                async with asyncio.timeout(TURN_TIMEOUT) as limit:
                    fence = lambda: engine.fence(self.seat, self.token) and not self.stopped  # noqa: E731
                    deadline = time.monotonic() + TURN_TIMEOUT
                    if provider.kind == "cli":
                        # A CLI agent reaches crewlet's tools through the bridge, as
                        # this seat under its fence, for this turn only.
                        grant = (await engine.bridge()).grant(
                            seat=self.seat, token=self.token, trigger=delivery.trigger,
                            registry=self.registry, services=engine.services, fence=fence,
                            deadline=deadline)
                    # The seat a CLI agent of this turn runs as, and the turn's
                    # grant (crewlet.sandbox.SEAT): set for the work alone, reset
                    # as it ends — this task runs the seat's next turn too.
                    try:
                        with sandbox.turn(sandbox.Seat(engine.sandbox, self.seat,
                                                       effective_sandbox(seat_cfg.sandbox), grant=grant)):
                            if run is not None:
                                # A conversation's run: its history, messages and end
                                # are the run's (crewlet.conversations.turn).
                                await run.work(record, provider=provider, registry=self.registry,
                                               services=engine.services, fence=fence, deadline=deadline)
                            else:
                                persona = seat_cfg.persona + await engine.brief(self.seat, record.counterparty)
                                await run_rounds(
                                    record, text=delivery.data.decode(errors="replace"),
                                    persona=persona, provider=provider, registry=self.registry,
                                    services=engine.services, fence=fence, deadline=deadline,
                                    gate=unworked if early else None)
                                if early:
                                    await unworked()  # a turn of no tool calls: before its settling
                    finally:
                        if grant is not None:
                            # The agent's work is over: its token dies now, not
                            # once the turn's records have settled (its reply is
                            # on the feed already, and settling may take retries).
                            engine._bridge.revoke(grant)
            except _Worked as skipped:
                engine.budgets.add(self.seat, sum(record.tokens.values()))
                await self._skip(delivery, record, skipped.worked, run)
                settled = True
                return
            except Fenced as exc:
                record.outcome, record.error = "fenced", str(exc)
                log.event("turn_fenced", "warning", seat=self.seat, trigger=delivery.trigger)
                # Hand it to the successor now rather than after the ack wait;
                # it checks the ledger like anybody.
                self._emptied = False  # it comes back unannounced
                await self.mailbox.nak(delivery)
                settled = True
                return
            except ProviderError as exc:
                engine.budgets.add(self.seat, sum(record.tokens.values()))
                record.outcome, record.error = "failed", str(exc)
                if isinstance(exc, CoolingDown) or exc.retryable:
                    # The redo reads the ledger first.
                    await self._hand_back(delivery, self._retry_delay(delivery, exc))
                elif early and (worked := await _answer(ledger)) is not None:
                    await self._skip(delivery, record, worked, run)  # worked before: not a dead letter
                else:
                    # A failure that will not pass (a bad request, a missing key).
                    await self.mailbox.dead_letter(delivery, f"turn failed: {record.error}")
                settled = True
                return
            except TimeoutError as exc:
                engine.budgets.add(self.seat, sum(record.tokens.values()))
                record.outcome = "failed"
                if limit is not None and limit.expired():
                    record.error = f"the turn took longer than {TURN_TIMEOUT:g}s"
                else:
                    # nats-py's timeouts are TimeoutErrors too: a request the broker
                    # did not answer (a leader election), not a turn that ran long.
                    record.error = f"the broker did not answer a request of the turn: {type(exc).__name__}: {exc}"
                    log.event("turn_unanswered", "warning", seat=self.seat, trigger=delivery.trigger,
                              error=record.error)
                await self._hand_back(delivery, self._retry_delay(delivery, None))
                settled = True
                return
            engine.budgets.add(self.seat, sum(record.tokens.values()))
            self.settling = asyncio.Event()  # from here on a stop waits for the turn (see stop)
            recorded = await self._settle(delivery, record, started)
            settled = True
            self.restarts = 0
        except asyncio.CancelledError:
            record.outcome, record.error = "interrupted", "the seat was released mid-turn"
            raise  # stop() NAKs it
        except Exception as exc:
            # The ledger or the mailbox did not answer, or a bug: nothing is
            # lost if the message goes back (a redo checks the ledger first).
            record.outcome, record.error = "failed", f"{type(exc).__name__}: {exc}"
            log.event("turn_failed", "error", seat=self.seat, trigger=delivery.trigger,
                      error=record.error, traceback=redaction.scrub(traceback.format_exc()))
            try:
                await self._hand_back(delivery, self._retry_delay(delivery, None))
                settled = True
            except Exception as nak_exc:
                log.event("seat_nak_failed", "warning", seat=self.seat,
                          error=f"{type(nak_exc).__name__}: {nak_exc}")
        finally:
            if grant is not None:
                engine._bridge.revoke(grant)  # its token answers 401 from here on
            if not ledger.done():
                ledger.cancel()  # the turn ended before it mattered (a failure, a cancel)
            elif not ledger.cancelled():
                ledger.exception()  # retrieved: a failed read ended the turn already, or never mattered
            if settled and not recorded:  # a recorded turn's _settle left its _ACKED record
                self._forget_inflight()
            if not recorded:
                record.took_ms = round((time.monotonic() - started) * 1000, 3)
            self.turns += 1
            engine.turns += 1
            self.last = {"trigger": record.trigger, "outcome": record.outcome, "at": record.started_at,
                         "took_ms": record.took_ms, "error": record.error}
            engine.recent.pop(self.seat, None)
            engine.recent[self.seat] = None
            if len(engine.recent) > STATS_RECENT:
                engine.recent.popitem(last=False)
            log.event("turn", seat=self.seat, trigger=record.trigger, outcome=record.outcome,
                      rounds=record.rounds, tools=len(record.tool_calls), took_ms=record.took_ms,
                      error=record.error)
            if not recorded:
                await engine.publish_record(record, JETSTREAM_TIMEOUT if self.stopped else SETTLE_PATIENCE)

    async def _skip(self, delivery: Delivery, record: TurnRecord, worked: dict[str, Any],
                    run: RunTurn | None) -> None:
        """The ledger says the trigger was *worked*: ack the delivery, unworked."""
        record.outcome = "skipped"
        await self.mailbox.ack(delivery)
        # The turn that worked it may have been cut short between its ledger
        # entry and its durable record: write that record again (it lands
        # once, under the same op id).
        await self.engine.record_done_again(self.seat, delivery.trigger, worked)
        if run is not None:
            await run.end_again()  # and the run's end, which may not have been told

    async def _settle(self, delivery: Delivery, record: TurnRecord, started: float) -> bool:
        """The turn's side effects are done: write the ledger entry and the
        turn record, then ack. True once the record was published (so it is
        not published again).

        The ledger entry and the record go out together, each sent again
        through stream leader elections for :data:`SETTLE_PATIENCE` seconds,
        and the ack is sent once both are in, not waited on. Once the ledger
        holds the trigger a redelivery is skipped, so an ack that never
        lands costs nothing; an ack before the ledger could leave the
        trigger unrecorded, and the same trigger sent again would be worked
        twice. The record goes before the ack for the same reason: a process
        killed between an ack and the record would leave a worked trigger
        with no ``done`` record anywhere, for nothing comes back to write
        it; killed before the ack, the delivery comes back, the ledger skips
        it and writes the record again (:meth:`TurnEngine.record_done_again`,
        landing once under its op id). Neither needs the other first: the
        ``done`` record of a trigger lands once however often it is sent,
        so a record whose ledger entry was lost (the process killed between
        the two) is sent again, as the same record, by the redo. Together
        they are one broker round trip of the turn, not two.

        A ledger entry that cannot be written in that time (no quorum) is
        not acked as if all were well: the node counts it (``unsettled`` in
        the stats), a second record says ``unsettled``, and the delivery is
        NAKed to be worked again once the fleet answers — its side effects
        may then happen twice (the README's "does not promise"); its redo's
        ``done`` record is the one already sent.
        """
        engine = self.engine
        deadline = time.monotonic() + SETTLE_PATIENCE
        record.took_ms = round((time.monotonic() - started) * 1000, 3)
        entry = {"seat": self.seat, "node": engine.node, "token": self.token,
                 "outcome": record.outcome, "at": time.time(), "rounds": record.rounds}
        ledger, _ = await asyncio.gather(engine.ledger.record(delivery.trigger, entry, deadline=deadline),
                                         engine.publish_record(record, SETTLE_PATIENCE),
                                         return_exceptions=True)
        if isinstance(ledger, BaseException):
            if not isinstance(ledger, CounterError):
                raise ledger  # a bug, or a cancel: the turn's own handlers have it
            engine.unsettled += 1
            record.outcome, record.error = "unsettled", f"the ledger entry was not written: {ledger}"
            log.event("ledger_write_failed", "error", seat=self.seat, trigger=delivery.trigger,
                      error=str(ledger))
            await self._hand_back(delivery, self._retry_delay(delivery, None))
            return False
        try:
            # Not waited on: the ledger answers for the trigger now, so an ack
            # lost on the way (an election, the connection dropping) costs a
            # redelivery after the ack wait that the ledger skips — and a
            # confirmed ack was a broker round trip and reply on every turn.
            await self.mailbox.ack_unconfirmed(delivery)
        except MailboxError as exc:
            # Worked and recorded in the ledger: a redelivery (after the ack
            # wait) is skipped. The turn is done.
            record.error = f"the ack was not sent: {exc}"
            log.event("turn_ack_unconfirmed", "warning", seat=self.seat, trigger=delivery.trigger,
                      error=str(exc))
        try:
            self._remember_inflight(delivery, 0, _ACKED)  # in place of forgetting it (see _ACKED)
        except OSError:
            self._forget_inflight_quietly()
        return True

    async def _hand_back(self, delivery: Delivery, delay: float) -> None:
        """NAK *delivery* to come back after *delay* s, and look for it then: a
        redelivery is not announced by a wake, and the seat's own poll is a
        minute away."""
        await self.mailbox.nak(delivery, delay)
        asyncio.get_running_loop().call_later(delay + REDELIVERY_MARGIN, self.wake)

    def _retry_delay(self, delivery: Delivery, exc: ProviderError | None) -> float:
        if isinstance(exc, CoolingDown):
            return max(RETRY_DELAY, exc.until - time.time())
        return min(RETRY_DELAY_MAX, RETRY_DELAY * 2 ** (delivery.deliveries - 1))

    # ------------------------------------------------------------ lookups

    def _run_of(self, delivery: Delivery, seat_cfg) -> RunTurn | None:
        """The conversation run *delivery* carries (None: it is plain mail)."""
        run = delivery.headers.get(conversation_turn.RUN_HEADER)
        conversation = delivery.headers.get(conversation_turn.CONVERSATION_HEADER)
        engine = self.engine
        if not run or not conversation or seat_cfg is None or engine.estate is None:
            return None
        floor = delivery.headers.get(conversation_turn.FLOOR_HEADER, "")
        return RunTurn(estate=engine.estate, js=engine.js, nc=engine.nc, node=engine.node, seat=seat_cfg,
                       token=self.token, conversation=conversation, run=run, event_ttl=engine.run_event_ttl,
                       approval_ttl=engine.approval_ttl, redo=delivery.deliveries > 1,
                       floor=int(floor) if floor.isdigit() and len(floor) < 20 else 0, pin=engine.pinned,
                       notices_to=self._deciders(), brief=engine.brief)

    def _deciders(self) -> list[str]:
        """Who is told by email that a call of this seat waits for a decision:
        the people the company names for its approvals (their addresses),
        then the operators (Tier A ``smtp.notices_to``)."""
        company = self.engine.company
        people = [] if company is None else [company.people[p].email for p in company.approvers(self.seat)]
        to = [*filter(None, people), *getattr(self.engine.mailboxes, "notices_to", ())]
        return list(dict.fromkeys(to))[:outbox.TO_MAX]

    def _seat_cfg(self):
        return self.engine.seat_cfgs.get(self.seat)

    def _provider(self) -> Provider | None:
        seat_cfg = self._seat_cfg()
        return self.engine.providers.get(seat_cfg.provider) if seat_cfg is not None else None

    # ------------------------------------------------------------ in flight

    def _remember_inflight(self, delivery: Delivery, crashes: int, how: str | None = None) -> None:
        # One line, ``<ack token> <stream seq> <crashes> <writer>``: the token to
        # NAK, and what tells a poison mail (see "Poison mail").
        self._write_inflight(" ".join((delivery.ack_token, str(delivery.seq), str(crashes),
                                       how or self.engine.incarnation)))

    def _mark_fetching(self) -> None:
        # Written before the fetch goes out, overwritten by the delivery's own
        # record once it is in hand (or cleared when there was none).
        self._write_inflight(f"{_FETCHING} 0 0 {self.engine.incarnation}")

    def _write_inflight(self, record: str) -> None:
        # Not fsynced: it must survive this process being killed, not the machine.
        # The file stays open and its first line is overwritten in place, one
        # pwrite a record: creating, renaming and unlinking a file on every
        # turn cost a third of the seats process under load, and cutting it
        # to length after each write (an ftruncate) doubled the syscalls for
        # nothing (bench/slow_turns.py). It is read to its first newline
        # (:func:`parse_inflight`), so what an older, longer record left
        # after it means nothing, and one pwrite is whole or not there at a
        # kill: the record is this one or the last (already acked, and a
        # NAK of it is ignored).
        if self._inflight_fd is None:
            self._inflight_fd = os.open(self.engine.inflight_path(self.seat), os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(self._inflight_fd, (record + "\n").encode(), 0)

    def _forget_inflight_quietly(self) -> None:
        with contextlib.suppress(OSError):
            self._forget_inflight()

    def _forget_inflight(self) -> None:
        if self._inflight_fd is not None:
            os.pwrite(self._inflight_fd, b"\n", 0)  # an empty first line: nothing in flight
            return
        try:
            os.unlink(self.engine.inflight_path(self.seat))
        except FileNotFoundError:
            pass

    def _close_inflight(self) -> None:
        if self._inflight_fd is not None:
            os.close(self._inflight_fd)
            self._inflight_fd = None

    async def _recover_inflight(self) -> None:
        """NAK the delivery an earlier process of this node left mid-turn, and
        count the crash it was in hand at (see "Poison mail").

        Safe because we hold the seat's lease now: nobody else is working its
        mailbox, and a NAK of a delivery that was acked after all is ignored
        (and its count with it: the next fetch brings another message).
        """
        path = self.engine.inflight_path(self.seat)
        try:
            with open(path) as f:
                token, seq, crashes, how = parse_inflight(f.read())
        except FileNotFoundError:
            return
        if token == _FETCHING:
            if how not in (_STOPPED, self.engine.incarnation):  # a process that died mid-fetch
                try:
                    floor = await self.engine.mailboxes.reset(self.seat)
                    log.event("mailbox_reset", "warning", seat=self.seat, to=floor,
                              reason="a process of this node died with a fetch out")
                except MailboxError as exc:  # the broker away: the ack wait has it
                    log.event("mailbox_reset_failed", "warning", seat=self.seat, error=str(exc))
        elif token and how == _ACKED:
            # Worked; its ack may not have left the process that died (see _ACKED).
            try:
                await self.engine.mailboxes.ack(token)
            except MailboxError as exc:  # its consumer is gone, or the broker away: the ack wait has it
                log.event("turn_ack_failed", "warning", seat=self.seat, error=str(exc))
        elif token:
            if how not in (_STOPPED, self.engine.incarnation):  # left by a process that died
                crashes += 1
            self.suspect = (seq, crashes) if seq and crashes else None
            try:
                await self.engine.mailboxes.nak(token)
                log.event("turn_recovered", "warning", seat=self.seat, seq=seq, crashes=crashes)
            except MailboxError as exc:  # its consumer is gone, or the broker away: the ack wait has it
                log.event("turn_recover_failed", "warning", seat=self.seat, error=str(exc))
        self._forget_inflight()


def parse_inflight(text: str) -> tuple[str, int, int, str]:
    """``(token, stream seq, crashes, writer)`` of an in-flight record; ``("",
    0, 0, "")`` when none. A record of an earlier version (the token alone)
    counts no crash before this one."""
    fields = text.split("\n", 1)[0].split()
    if not fields:
        return "", 0, 0, ""
    try:
        seq = int(fields[1]) if len(fields) > 1 else 0
        crashes = int(fields[2]) if len(fields) > 2 else 0
    except ValueError:
        seq = crashes = 0
    return fields[0], seq, crashes, fields[3] if len(fields) > 3 else ""
