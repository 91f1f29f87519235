"""The seat sweep (DESIGN §5): hold this node's fair share of the company's seats.

Every ``fleet.sweep`` seconds, and early when the fleet changes (a seat, a
node or a seats process's life gone, a node appearing, a new company
revision):

1. **renew the life** (a loop of its own, every sweep interval) — this process's ``life.<node>`` lease, to which every
   seat it holds is bound (:mod:`crewlet.coord.life`): one write a sweep,
   whatever the number of seats. A life lost (taken after this process was
   paused past the TTL) drops every seat at once; a renewal whose outcome is
   unknown keeps them only while the life is fresh by our own clock. The
   time of the last renewal is the node's **last renew**, which admission
   reads: a turn starts only if it is less than one heartbeat old.
2. **begin the life** when this process has none — claimed, or adopted
   from this crewletd's previous seats process with its token, so every
   seat bound to it is this process's again at once (a role restart costs
   one write, not one per seat); then **adopt** those seats.
3. **decide** with :func:`crewlet.coord.sweep.plan` on the fleet as this
   process's one lease watch shows it (:class:`crewlet.coord.holders.Holders`:
   seats-nodes from presence and life, owners from the live seat leases —
   memory, not a question to the broker per sweep), then release and claim.

What is paced is what costs: a seat's MCP servers, each a process tree
forked when its work starts — at most ``fleet.claims_per_sweep`` trees per
sweep window, counted across early sweeps too, for claims and adoptions
alike (an adopted seat with servers waits its turn holding its lease). A
seat without servers is one KV write and is claimed at once, as many as
the fair share allows, several at a time. Releases stay paced
(``releases_per_sweep``), since a release interrupts a live agent.

**Draining** (:mod:`crewlet.coord.drain`): while this node's presence says
``draining``, a sweep neither begins a life nor claims; it releases every
seat whose turn is not running — all of them in one sweep, unpaced: the
node is leaving, nothing is being balanced — and, past the order's
deadline, the seats still in a turn too (the turn is cut short, its mail
NAKed). Once it holds nothing it ends its life, and is no seats-node any
more. Peers do not count a draining node among the seats-nodes, so its
seats fall to them as they are released. When the order goes, the next
sweep begins a new life and claims the fair share again.

Claiming and releasing call the hooks (``on_claim``, ``on_release``) that
start and stop a seat's work — its MCP servers and mailbox in
:mod:`roles.seats.turns`. On stop the work is handed back and the life is
deleted: every seat is free for the fleet in one write.

A node's seats may be worked by a pool of seats processes
(:mod:`roles.seats.pool`): each runs this sweep over its own share of the
seats, under the node's one life.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any, Awaitable, Callable

from crewlet import log
from crewlet.coord import drain
from crewlet.coord.holders import Holders
from crewlet.coord.lease import Held, LeaseError, Leases
from crewlet.coord.life import Life
from crewlet.coord.life import key as life_key
from crewlet.coord.sweep import NodeShare, NodeView, SeatView, cost, fair_share, plan
from roles.seats.pool import Pool

# on_claim(seat, held, fence): fence says a holder before us may still be writing.
ClaimHook = Callable[[str, Held, bool], Awaitable[None]]
ReleaseHook = Callable[[str, Held | None], Awaitable[None]]
# Claims in flight at once (each one compare-and-set publish).
CLAIM_PARALLEL = 128
# Seconds a sweep cut short by a stop is given to unwind.
SWEEP_UNWIND = 0.5


async def _log_claim(seat: str, held: Held, fence: bool) -> None:
    log.event("seat_claimed", seat=seat, token=held.token)


async def _log_release(seat: str, held: Held | None) -> None:
    log.event("seat_released", seat=seat)


class SeatSweeper:
    """Invariants: ``held`` is every seat this process holds, each bound to
    ``life`` (cleared whenever the life is lost); ``started`` the ones whose
    work was started (``on_claim``), the rest waiting for spawns in
    ``_waiting`` order; ``_spawned``/``_releases`` the monotonic times of
    recent process-tree spawns (one entry a tree) and releases."""

    def __init__(self, leases: Leases, holders: Holders, node_id: str, labels: dict[str, str], *,
                 boot: str, proc: str, sweep: float, heartbeat: float, grace: float, spawns: int,
                 releases: int, on_claim: ClaimHook = _log_claim,
                 on_release: ReleaseHook = _log_release, pool: Pool = Pool()):
        self.leases = leases
        self.holders = holders
        # This process's place in the node's seats pool (roles/seats/pool.py):
        # it holds, adopts and plans only the seats of its share.
        self.pool = pool
        self.life = Life(leases, node_id, pool.proc(proc))
        self.me = NodeView(node_id, dict(labels))
        self.boot = boot
        self.interval = sweep
        self.heartbeat = heartbeat
        # How long a node whose presence is new counts as a seats-node before
        # its seats process has begun its life.
        self.grace = grace
        self.spawns = pool.part(spawns)
        self.releases = pool.part(releases)
        self.on_claim = on_claim
        self.on_release = on_release
        # Called once before every seat is released on stop.
        self.on_stop: Callable[[], Awaitable[None]] | None = None
        self._late_until = 0.0  # no renewal before this (monotonic): debug.faults kind late
        # Is a turn of this seat running now? (the turn engine's): a draining
        # node hands such a seat over only once it ends, or at the deadline.
        self.busy: Callable[[str], bool] = lambda seat: False
        # This node's presence says ``draining``: no turn starts, no claim.
        self.draining = False
        # None until the first company revision arrives: before that the sweep
        # only renews (everything would look "not in the company" otherwise).
        self.seats: list[SeatView] | None = None
        self.every: list[SeatView] | None = None  # all the company's seats, in a pool of several
        self._costs: dict[str, int] = {}
        self.held: dict[str, Held] = {}
        self.started: set[str] = set()
        self._waiting: dict[str, None] = {}  # held, work not started: an ordered set
        self.last_renew: float | None = None
        self._spawned: deque[float] = deque()
        self._releases: deque[float] = deque()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()  # replaced by run()'s
        self.sweeps = 0
        # What the last sweep that decided nothing read (_inputs); a sweep
        # reading the same skips its walks over every seat. None: the next
        # sweep walks.
        self._quiet: tuple | None = None
        self._company_changes = 0  # grows with each set_company
        # The node's fair share over every seat (a pool of several), and what
        # it was computed from: (company changes, live nodes). It is a walk
        # over the whole company, so it is done again only when those change.
        self._node_share: tuple[tuple, int] | None = None
        self.skipped = 0  # sweeps skipped so

    # -------------------------------------------------------------- the API

    def admitted(self, now: float | None = None) -> bool:
        """May a turn start here? Only if this node's last renew is fresh."""
        now = time.monotonic() if now is None else now
        return self.last_renew is not None and now - self.last_renew < self.heartbeat

    def holds(self, seat: str, token: int) -> bool:
        """Does this process hold *seat* under *token*, by its own clock? A
        life renewed at *t* lives on the server until at least *t* + TTL, and
        nobody claims a seat bound to a live life: no round trip needed."""
        held = self.held.get(seat)
        return held is not None and held.token == token and self.life.fresh()

    def set_company(self, company: dict[str, Any]) -> None:
        # Only this member's share: the plan is made over it (roles/seats/pool.py).
        every = [SeatView(s["name"], dict(s.get("placement", {}).get("labels", {})),
                          cost=len(s.get("mcp") or ()))
                 for s in company.get("seats", [])]
        self.seats = [s for s in every if self.pool.mine(s.name)]
        # The whole company's, for the node's share (a pool of several: see plan()).
        self.every = None if self.pool.alone else every
        self._costs = {s.name: s.cost for s in self.seats}
        self._company_changes += 1
        self.wake()

    def wake(self) -> None:
        """Sweep early (the limits still hold)."""
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Sweep until *stopping*; the caller then gives the seats up
        (:meth:`release_all`), within the time its stop has. The life is
        renewed by a loop of its own: a sweep that claims a thousand seats
        must not hold up the renewal every one of them depends on."""
        self._stopping = stopping
        # Either ending by a failure ends both (and the role, which is restarted).
        async with asyncio.TaskGroup() as group:
            group.create_task(self._pulse(stopping), name="seats life")
            group.create_task(self._sweep_until(stopping), name="seat sweep")

    def hold_renewals(self, seconds: float) -> None:
        """Renew nothing for *seconds* (fault injection, ``debug.faults`` kind
        ``late``: what a loaded or cut-off process looks like to admission)."""
        self._late_until = time.monotonic() + seconds

    async def _pulse(self, stopping: asyncio.Event) -> None:
        """Renew the life every sweep interval, until *stopping*."""
        while not stopping.is_set():
            try:
                if time.monotonic() >= self._late_until:
                    await self._renew()
            except LeaseError as exc:
                log.event("seats_life_renew_failed", "warning", error=str(exc))
            try:
                await asyncio.wait_for(stopping.wait(), self.interval)
            except TimeoutError:
                pass

    async def _sweep_until(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self._wake.clear()  # before: a change seen during the sweep wakes the next
            started = time.monotonic()
            # A stop does not wait for the sweep in progress: without quorum
            # its writes each wait out their patience. A claim cut short that
            # did land is bound to a life the stop deletes.
            sweeping = asyncio.ensure_future(self.sweep())
            halt = asyncio.ensure_future(stopping.wait())
            await asyncio.wait({sweeping, halt}, return_when=asyncio.FIRST_COMPLETED)
            halt.cancel()
            if not sweeping.done():
                sweeping.cancel()
                await asyncio.wait({sweeping}, timeout=SWEEP_UNWIND)
                return
            try:
                sweeping.result()
            except LeaseError as exc:
                log.event("sweep_failed", "warning", error=str(exc))
            # Early sweeps are spaced, so a burst of changes is one sweep. The
            # spacing waits on the stop too: a node stopped just after a sweep
            # (its first, at start) would otherwise wait out a tenth of the
            # interval before giving its seats up.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, self.interval / 10 - (time.monotonic() - started))):
                    await stopping.wait()
            if stopping.is_set():
                return
            waiting = asyncio.ensure_future(self._wake.wait())
            halt = asyncio.ensure_future(stopping.wait())
            await asyncio.wait({waiting, halt}, timeout=self.interval,
                               return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            halt.cancel()

    # ------------------------------------------------------------ one sweep

    async def sweep(self) -> None:
        self.sweeps += 1
        if not self.holders.listed.is_set():
            return  # no view of the fleet yet: hold what we hold, decide nothing
        nodes = self.holders.of("node.")
        mine = nodes.get(f"node.{self.me.id}")
        if mine is None or mine.boot != self.boot:
            # Our node has not joined (yet), or another node holds our id:
            # never act on the fleet under an identity we do not own.
            return
        if drain.draining(mine.info) is not None:
            await self._drain_out(mine.info)
            return
        if self.draining:
            self.draining = False
            log.event("seats_undrained")
        # Begun before the company is known: peers count this node among the
        # seats-nodes from the first revision on, not after its first claims.
        if self.life.held is None and not await self._begin():
            return
        if self.seats is None:
            return  # no company yet: everything would look "not in the company"
        now = time.monotonic()
        live = [NodeView(k.removeprefix("node."), dict(o.info.get("labels", {})))
                for k, o in nodes.items()
                if "seats" in o.info.get("roles", ()) and drain.draining(o.info) is None
                and self._seats_node(k, now)]
        # The same as at a sweep that decided nothing, the walks below would
        # decide nothing again (at 10,000 seats they were most of an idle
        # seats process).
        if self._inputs(live) == self._quiet:
            self.skipped += 1
            await self._start_waiting()
            return
        self._quiet = None
        self._adopt()
        await self._drop_taken()
        await self._start_waiting()
        owners = {k.removeprefix("seat."): o.node for k, o in self.holders.of("seat.").items()}
        # What we hold is ours whether or not the watch has shown our claim yet.
        owners = {**owners, **dict.fromkeys(self.held, self.me.id)}
        pooled = None
        if self.every is not None:
            nodes = live if self.me.id in {n.id for n in live} else [*live, self.me]
            pooled = NodeShare(share=self._share_of_node(nodes),
                               held=sum(1 for node in owners.values() if node == self.me.id),
                               slack=self.pool.size - 1)
        decision = plan(self.me, self.seats, live, owners,
                        set(self.held), spawns=self._budget(self._spawned, self.spawns),
                        spawn_limit=self.spawns,
                        releases=self._budget(self._releases, self.releases), pool=pooled)
        if not decision.claim and not decision.release:
            self._quiet = self._inputs(live)  # after the walks: they may have adopted, dropped, started
        for seat in decision.release:
            await self._release(seat)
        if decision.claim:
            started = time.monotonic()
            claimed = await self._claim_all(decision.claim)
            log.event("seats_claimed", tried=len(decision.claim), claimed=claimed,
                      took_ms=round((time.monotonic() - started) * 1000, 1))

    async def _drain_out(self, presence: dict[str, Any]) -> None:
        """A sweep of a draining node: hand over each seat not in a turn (each
        one in a turn too, past the deadline); once nothing is held, end the
        life. Unpaced and side by side: the node is leaving."""
        if not self.draining:
            self.draining = True  # first: no turn starts from here on
            self._quiet = None
            log.event("seats_draining", held=len(self.held), busy=sum(map(self.busy, self.held)))
        late = drain.past_deadline(presence)
        going = [seat for seat in self.held if late or not self.busy(seat)]
        if going:
            limit = asyncio.Semaphore(CLAIM_PARALLEL)

            async def one(seat: str) -> None:
                async with limit:
                    await self._release(seat)
            results = await asyncio.gather(*(one(s) for s in going), return_exceptions=True)
            for exc in results:
                if isinstance(exc, BaseException) and not isinstance(exc, LeaseError):
                    raise exc
            log.event("seats_handed_over", seats=len(going), cut_short=late and bool(going),
                      left=len(self.held))
        if not self.held and self.life.held is not None and self._node_holds_none():
            await self.life.end()
            self.last_renew = None
            log.event("seats_drained")

    def _node_holds_none(self) -> bool:
        """Does no member of this node's pool hold a seat (by the watch)? The
        life is the pool's: ending it while a sibling holds seats would free
        them under a member that still works them."""
        life = self.life.held
        return self.pool.alone or life is None or not self.holders.bound_to(self.me.id, life.token)

    def _share_of_node(self, nodes: list[NodeView]) -> int:
        """The node's fair share over the whole company (a pool of several)."""
        key = (self._company_changes, tuple((n.id, tuple(sorted(n.labels.items()))) for n in nodes))
        if self._node_share is None or self._node_share[0] != key:
            self._node_share = (key, fair_share(self.me, self.every or [], nodes))
        return self._node_share[1]

    def _inputs(self, live: list[NodeView]) -> tuple:
        """Everything a sweep's walks and plan read, in a form compared whole:
        who holds what (the watch's change count), our life, the seats we
        hold, the company, the live seats-nodes, and both budgets."""
        return (self.holders.changes, self.life.token, len(self.held), self._company_changes,
                tuple(live), self._budget(self._spawned, self.spawns),
                self._budget(self._releases, self.releases))

    def _seats_node(self, presence: str, now: float) -> bool:
        """Does the node of *presence* count toward the fair share? While its
        seats process's life is live — or, for a node that just joined,
        for ``grace`` while that process begins it."""
        node = presence.removeprefix("node.")
        if node == self.me.id or self.holders.get(life_key(node)) is not None:
            return True
        since = self.holders.since(presence)
        return since is not None and now - since < self.grace

    async def _renew(self) -> None:
        """Renew the life; on losing it, drop every seat."""
        if self.life.held is None:
            return
        started = time.monotonic()
        # Stale by our own clock (we were paused): stop acting first, ask after.
        if not self.life.fresh(started):
            self.life.lose()  # first: a sweep meanwhile claims under a new life, never this one
            await self._drop_all("life stale on waking")
            return
        try:
            renewed = await self.life.renew(self.holders.raw(self.life.key))
        except LeaseError as exc:
            if not self.life.fresh():
                self.life.lose()
                await self._drop_all(f"life renewal unknown and the life is stale: {exc}")
            return
        if renewed is None:
            await self._drop_all("life lost")
            return
        self.last_renew = started

    async def _begin(self) -> bool:
        """Begin this process's life (claimed, adopted or taken over)."""
        started = time.monotonic()
        held = await self.life.begin()
        if held is None:
            return False
        self.last_renew = started
        adopted = len(self.holders.bound_to(self.me.id, held.token))
        log.event("seats_life_begun", token=held.token, adopted=adopted)
        return True

    def _adopt(self) -> None:
        """Hold the seats bound to our life that this process does not know
        of (the process before it held them): no write, their token kept.
        Their work starts in :meth:`_start_waiting`, spawns paced."""
        life = self.life.held
        assert life is not None
        for key, owner in self.holders.bound_to(self.me.id, life.token).items():
            seat = key.removeprefix("seat.")
            if seat in self.held or not self.pool.mine(seat):
                continue  # ours already, or a sibling member's
            self.held[seat] = Held(key, owner.token, owner.revision, renewed=life.renewed,
                                   ttl=life.ttl)
            self._waiting[seat] = None

    async def _start_waiting(self) -> None:
        """Start the work of held seats not started yet, while spawns allow."""
        for seat in list(self._waiting):
            if seat not in self.held:
                del self._waiting[seat]
                continue
            if self._price(seat) > self._budget(self._spawned, self.spawns):
                continue  # the next window; a seat without servers goes on now
            del self._waiting[seat]
            await self._start(seat, self.held[seat], fence=False)

    async def _start(self, seat: str, held: Held, *, fence: bool) -> None:
        self._spawned.extend([time.monotonic()] * self._price(seat))
        self.started.add(seat)
        await self.on_claim(seat, held, fence)

    async def _drop_taken(self) -> None:
        """Drop a seat whose key the watch shows written by another claim
        (another token): never by a claim of ours, so a holder that is
        wrong about it stops acting at once rather than at its next fence."""
        for seat, held in list(self.held.items()):
            owner = self.holders.raw(held.key)
            if owner is not None and owner.token != held.token and owner.revision > held.revision:
                await self._drop(seat, f"taken by {owner.node}")

    async def _drop(self, seat: str, why: str) -> None:
        """Stop acting for *seat* (no write: it is not ours any more). The
        pulse and the sweep both drop: whichever comes second finds it gone."""
        held = self.held.pop(seat, None)
        if held is None:
            return
        self._waiting.pop(seat, None)
        log.event("seat_lost", "warning", seat=seat, reason=why, token=held.token)
        if seat in self.started:
            self.started.discard(seat)
            await self.on_release(seat, held)

    def _price(self, seat: str) -> int:
        """What starting *seat*'s work takes from a window's spawns."""
        return cost(SeatView(seat, cost=self._costs.get(seat, 0)), self.spawns)

    async def _claim_all(self, seats: list[str]) -> int:
        """Claim *seats*, several at a time; start each one's work as it
        lands. How many were claimed."""
        limit = asyncio.Semaphore(CLAIM_PARALLEL)
        token = self.life.token

        async def one(seat: str) -> bool:
            async with limit:
                if self.life.token != token or self._stopping.is_set():
                    return False  # the life was lost meanwhile: a claim would be dead at birth
                # Read now, not when the sweep decided: a seat another node
                # claimed since is not free, and expecting its revision
                # would take it from its holder.
                expected = self.holders.free(f"seat.{seat}")
                if expected is None:
                    return False
                claim = await self.life.claim(f"seat.{seat}", expected)
            if claim is None or self.life.token != token:
                return False
            self.held[seat] = claim.held
            await self._start(seat, claim.held, fence=claim.successor)
            return True
        results = await asyncio.gather(*(one(s) for s in seats), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        for exc in failed:
            if not isinstance(exc, LeaseError):
                raise exc
        if failed:
            raise failed[0]
        return sum(1 for r in results if r is True)

    async def _release(self, seat: str) -> None:
        held = self.held.pop(seat, None)
        if held is None:
            return  # dropped meanwhile (the life was lost): nothing of ours to delete
        self._waiting.pop(seat, None)
        self._releases.append(time.monotonic())
        if seat in self.started:
            self.started.discard(seat)
            await self.on_release(seat, held)
        await self.leases.release(held)

    async def _drop_all(self, why: str) -> None:
        self.last_renew = None  # first: no turn starts while the seats are dropped
        for seat in list(self.held):
            await self._drop(seat, why)

    async def release_all(self) -> None:
        """Give every seat up: first ``on_stop`` (the turns hand back what they
        hold, all at once), then the life, one delete for every seat. When
        the fleet's state cannot be written, the life lapses by itself
        within a TTL. A member of a pool of several leaves the life alone
        (roles/seats/pool.py: it is the pool's, and crewletd ends it at the
        node's stop)."""
        if self.on_stop is not None:
            await self.on_stop()
        for seat in list(self.held):
            held = self.held.pop(seat, None)
            if held is not None and seat in self.started:
                self.started.discard(seat)
                await self.on_release(seat, held)
        self._waiting.clear()
        if not self.pool.alone:
            # The pool's life outlives a member: alone this is a restart, whose
            # successor adopts our share; at the node's stop crewletd ends it.
            self.life.lose()
            return
        try:
            await self.life.end()
        except LeaseError as exc:
            log.event("seats_life_end_failed", "warning", error=str(exc))

    def _budget(self, times: deque[float], limit: int) -> int:
        """What is left of *limit* in the current sweep window."""
        now = time.monotonic()
        while times and now - times[0] >= self.interval:
            times.popleft()
        return max(0, limit - len(times))
