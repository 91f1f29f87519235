"""The seat sweep (DESIGN §5): hold this node's fair share of the company's seats.

Every ``fleet.sweep`` seconds, and early when the fleet changes (a seat or a
node's lease deleted or expired, a node appearing, a new company revision):

1. **renew** every seat this node holds; a seat whose lease was lost (taken
   after this node was paused past the TTL) is dropped at once; a renewal
   whose outcome is unknown keeps the seat only while it is fresh by our own
   clock. When every renewal succeeded, that time is the node's **last
   renew**, which admission reads: a turn starts only if it is less than one
   heartbeat old.
2. **adopt** seats this node's own incarnation holds that this process does
   not know of (the seats role restarted), and **take over** seats held under
   this node's id by an earlier incarnation (crewletd restarted within the TTL).
3. **decide** with :func:`crewlet.coord.sweep.plan` on the fleet as this
   process's one lease watch shows it (:class:`crewlet.coord.holders.Holders`:
   live seats-nodes from presence, owners from seat leases — memory, not a
   question to the broker per sweep), then release and claim. Claims and releases are limited per ``fleet.sweep`` window, counted
   across early sweeps too: at most ``claims_per_sweep`` and
   ``releases_per_sweep``.

Claiming and releasing call the hooks (``on_claim``, ``on_release``) that
start and stop a seat's work — its MCP servers and mailbox in the turns issue.
On stop every held seat is released, so peers take them within a sweep
instead of after the TTL.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Awaitable, Callable

from crewlet import log
from crewlet.coord.holders import Holders
from crewlet.coord.lease import Held, LeaseError, Leases
from crewlet.coord.sweep import NodeView, SeatView, plan

Hook = Callable[[str, Held | None], Awaitable[None]]
# Leases released at once when the node stops.
RELEASE_PARALLEL = 32
# Seconds a sweep cut short by a stop is given to unwind.
SWEEP_UNWIND = 0.5


async def _log_claim(seat: str, held: Held | None) -> None:
    log.event("seat_claimed", seat=seat, token=held.token if held else None)


async def _log_release(seat: str, held: Held | None) -> None:
    log.event("seat_released", seat=seat)


class SeatSweeper:
    """Invariants: ``held`` is every seat this process acts for, with its lease;
    ``_claims``/``_releases`` hold the monotonic times of recent ones."""

    def __init__(self, leases: Leases, holders: Holders, node_id: str, labels: dict[str, str], *,
                 boot: str, sweep: float, heartbeat: float, claims: int, releases: int,
                 on_claim: Hook = _log_claim, on_release: Hook = _log_release):
        self.leases = leases
        self.holders = holders
        self.me = NodeView(node_id, dict(labels))
        self.boot = boot
        self.interval = sweep
        self.heartbeat = heartbeat
        self.claims = claims
        self.releases = releases
        self.on_claim = on_claim
        self.on_release = on_release
        # Called once before every seat is released on stop.
        self.on_stop: Callable[[], Awaitable[None]] | None = None
        # None until the first company revision arrives: before that the sweep
        # only renews (everything would look "not in the company" otherwise).
        self.seats: list[SeatView] | None = None
        self.held: dict[str, Held] = {}
        self.last_renew: float | None = None
        self._claims: deque[float] = deque()
        self._releases: deque[float] = deque()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()  # replaced by run()'s
        self.sweeps = 0

    # -------------------------------------------------------------- the API

    def admitted(self, now: float | None = None) -> bool:
        """May a turn start here? Only if this node's last renew is fresh."""
        now = time.monotonic() if now is None else now
        return self.last_renew is not None and now - self.last_renew < self.heartbeat

    def set_company(self, company: dict[str, Any]) -> None:
        self.seats = [SeatView(s["name"], dict(s.get("placement", {}).get("labels", {})))
                      for s in company.get("seats", [])]
        self.wake()

    def wake(self) -> None:
        """Sweep early (the limits still hold)."""
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Sweep until *stopping*; the caller then gives the seats up
        (:meth:`release_all`), within the time its stop has."""
        self._stopping = stopping
        while not stopping.is_set():
            self._wake.clear()  # before: a change seen during the sweep wakes the next
            started = time.monotonic()
            # A stop does not wait for the sweep in progress: without quorum
            # its writes each wait out their patience. A claim cut short that
            # did land is a lease nobody acts for, gone within a TTL.
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
            # Early sweeps are spaced, so a burst of changes is one sweep.
            await asyncio.sleep(max(0.0, self.interval / 10 - (time.monotonic() - started)))
            waiting = asyncio.ensure_future(self._wake.wait())
            halt = asyncio.ensure_future(stopping.wait())
            await asyncio.wait({waiting, halt}, timeout=self.interval,
                               return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            halt.cancel()

    # ------------------------------------------------------------ one sweep

    async def sweep(self) -> None:
        self.sweeps += 1
        await self._renew()
        if self.seats is None or not self.holders.listed.is_set():
            return  # no company, or no view of the fleet yet: hold what we hold, decide nothing
        nodes = self.holders.of("node.")
        mine = nodes.get(f"node.{self.me.id}")
        if mine is None or mine.boot != self.boot:
            # Our node has not joined (yet), or another node holds our id:
            # never act on the fleet under an identity we do not own.
            return
        owners = self.holders.of("seat.")
        await self._recover(owners)
        live = [NodeView(k.removeprefix("node."), dict(o.info.get("labels", {})))
                for k, o in nodes.items() if "seats" in o.info.get("roles", ())]
        # What we hold is ours whether or not the watch has shown our claim yet.
        seen = {k.removeprefix("seat."): o.node for k, o in owners.items()}
        decision = plan(self.me, self.seats, live, {**seen, **dict.fromkeys(self.held, self.me.id)},
                        set(self.held), claims=self._budget(self._claims, self.claims),
                        releases=self._budget(self._releases, self.releases))
        for seat in decision.release:
            await self._release(seat)
        for seat in decision.claim:
            held = await self.leases.claim(f"seat.{seat}")
            self._claims.append(time.monotonic())
            if held is not None:
                self.held[seat] = held
                await self.on_claim(seat, held)

    async def _renew(self) -> None:
        """Renew every held seat at once; drop the lost and the stale."""
        started = time.monotonic()
        # Stale by our own clock (we were paused): stop acting first, ask after.
        for seat, held in list(self.held.items()):
            if not held.fresh(started):
                await self._drop(seat, "lease stale on waking")
        seats = list(self.held)
        results = await asyncio.gather(*(self.leases.renew(self.held[s]) for s in seats),
                                       return_exceptions=True)
        all_renewed = True
        for seat, result in zip(seats, results):
            if seat not in self.held:
                continue
            if isinstance(result, BaseException):
                all_renewed = False
                if not isinstance(result, LeaseError):
                    raise result
                if not self.held[seat].fresh():
                    await self._drop(seat, f"renewal unknown and the lease is stale: {result}")
            elif result is None:
                all_renewed = False
                await self._drop(seat, "lease lost")
            else:
                self.held[seat] = result
        if all_renewed:
            self.last_renew = started

    async def _recover(self, owners) -> None:
        """Adopt our own incarnation's seats; take over an earlier incarnation's."""
        for key, owner in owners.items():
            seat = key.removeprefix("seat.")
            if owner.node != self.me.id or seat in self.held:
                continue
            if not self._budget(self._claims, self.claims):
                return  # adopting spawns a seat's work too: it counts as a claim
            if owner.boot == self.boot:
                held = await self.leases.renew(
                    Held(key, owner.token, owner.revision, renewed=0.0, ttl=self.leases.ttl))
            else:
                # An earlier incarnation of this node: our presence is ours
                # (checked by the caller), so that process is gone.
                held = await self.leases.take_over(owner, key)
            self._claims.append(time.monotonic())
            if held is not None:
                self.held[seat] = held
                await self.on_claim(seat, held)

    async def _release(self, seat: str) -> None:
        held = self.held.pop(seat)
        self._releases.append(time.monotonic())
        await self.on_release(seat, held)
        await self.leases.release(held)

    async def _drop(self, seat: str, why: str) -> None:
        held = self.held.pop(seat)
        log.event("seat_lost", "warning", seat=seat, reason=why, token=held.token)
        await self.on_release(seat, held)

    async def release_all(self) -> None:
        """Give every seat up: first ``on_stop`` (the turns hand back what they
        hold, all at once), then the leases, several at a time. When the
        fleet's state cannot be written, stop trying: the leases lapse by
        themselves within a TTL."""
        if self.on_stop is not None:
            await self.on_stop()
        limit = asyncio.Semaphore(RELEASE_PARALLEL)
        failed: list[str] = []

        async def one(seat: str) -> None:
            async with limit:
                if failed:
                    return
                try:
                    await self._release(seat)
                except LeaseError as exc:
                    failed.append(seat)
                    log.event("seat_release_failed", "warning", seat=seat, error=str(exc),
                              left_to_lapse=len(self.held))
        await asyncio.gather(*(one(seat) for seat in list(self.held)))

    def _budget(self, times: deque[float], limit: int) -> int:
        """What is left of *limit* in the current sweep window."""
        now = time.monotonic()
        while times and now - times[0] >= self.interval:
            times.popleft()
        return max(0, limit - len(times))
