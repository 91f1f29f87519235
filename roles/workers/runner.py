"""Running the singleton duties: hold a duty's lease, run it while held.

Every ``fleet.heartbeat`` the runner tends each registered duty: a duty not
held here is claimed if nobody holds it (or adopted if this node already did,
before this process restarted), and started; a held duty's lease is renewed,
and if it was lost — taken over after this node was paused past the TTL — the
duty is cancelled at once. A renewal whose outcome is unknown (no quorum)
keeps the duty running only while the lease is still fresh by our own clock.

While this node's presence says ``draining`` (:mod:`crewlet.coord.drain`)
a tend gives up each duty held here — cancelled, given
:data:`DUTY_END_WAIT`, its lease released, so a peer takes it at its next
tend — and claims none; the duties come back with the next tend after the
order goes, as any free duty does.

On stop (:meth:`DutyRunner.run` returns as soon as *stopping* is set, cutting
short a tend in progress: without quorum each lease write waits out its
patience, a third of the TTL, and a round of tends takes that once per duty)
every duty is cancelled and given :data:`DUTY_END_WAIT` to end
(:meth:`DutyRunner.halt`), then its lease released, so a peer takes it
over at its next tend rather than after the TTL (:meth:`DutyRunner.release`).
The role bounds the whole of it by its stop budget: a lease not released
lapses within its TTL.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from crewlet import log
from crewlet.company import Company
from crewlet.config import NodeConfig
from crewlet.coord import drain
from crewlet.coord.holders import Holders
from crewlet.coord.lease import Held, LeaseError, Leases
from roles.workers.duties import Duty, going_on

# Seconds a cancelled duty is given to end (its own cleanup: a subscription
# dropped, an SMTP connection closed) before its lease is released anyway.
DUTY_END_WAIT = 0.5


@dataclass
class DutyContext:
    """What a running duty is given."""

    config: NodeConfig
    leases: Leases
    interval: float   # how often a periodic duty looks again
    token: int        # this duty's fencing token: every write it makes carries it
    role: Any = None  # the workers role's RoleContext (its NATS connection, jetstream())
    holders: Holders | None = None  # who holds which lease: the role's one watch of them
    company: Callable[[], Company | None] = lambda: None  # the company in force on this node
    estate: Any = None  # the role's estate router (crewlet.estate.router.Router): ops to the log


class DutyRunner:
    """Invariant: ``held[name]`` and ``tasks[name]`` exist together, for the
    duties this node runs now."""

    def __init__(self, config: NodeConfig, leases: Leases, duties: tuple[Duty, ...], *,
                 role: Any = None, holders: Holders | None = None, estate: Any = None):
        self.config = config
        self.estate = estate
        self.leases = leases
        self.holders = holders
        self.duties = duties
        self.role = role
        self.company: Company | None = None  # set by the role as revisions arrive
        self.held: dict[str, Held] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self._tending: asyncio.Task | None = None
        self._stopped = False  # stop() began: no duty starts any more

    async def run(self, stopping: asyncio.Event) -> None:
        """Tend the duties every ``fleet.heartbeat`` until *stopping* is set;
        return then at once, a tend in progress cut short (a claim or renewal
        cut short may have landed: that lease lapses within its TTL, or is
        found ours and released by :meth:`stop`). Raises what a tend raised."""
        self._tending = asyncio.create_task(self._tend_until(stopping), name="duties: tending")
        stop = asyncio.create_task(stopping.wait(), name="duties: stopping")
        try:
            await asyncio.wait({self._tending, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            self._tending.cancel()
        if self._tending.done() and not self._tending.cancelled():
            self._tending.result()

    async def _tend_until(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            for duty in self.duties:
                # Looked at before each tend, not once a round: a round
                # without quorum takes one write's patience per duty.
                if stopping.is_set() or not going_on():
                    return
                if duty.wanted(self.config):
                    await self._tend(duty)
            try:
                # Not wait_for: Python 3.11's may swallow a cancel (DESIGN §4).
                async with asyncio.timeout(self.config.fleet.heartbeat):
                    await stopping.wait()
            except TimeoutError:
                pass

    def draining(self) -> bool:
        """Does this node's presence say it is drained (as our watch shows it)?"""
        if self.holders is None:
            return False
        mine = self.holders.get(f"node.{self.config.node.id}")
        return mine is not None and drain.draining(mine.info) is not None

    async def _give_up(self, name: str) -> None:
        """Stop duty *name* and release its lease: this node is drained."""
        held = self.held.get(name)
        task = self.tasks.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=DUTY_END_WAIT)
        if held is not None:
            await self._release(name, held)
        log.event("duty_given_up", duty=name, reason="the node is draining")

    async def _tend(self, duty: Duty) -> None:
        key = f"duty.{duty.name}"
        held = self.held.get(duty.name)
        if self.draining():
            if held is not None:
                await self._give_up(duty.name)
            return
        try:
            if held is None:
                held = await self.leases.claim_or_adopt(key)
                if held is not None:
                    self._start(duty, held)
                return
            if not held.fresh():
                # Stale by our own clock (we were paused): stop before asking.
                self._stop(duty.name, "lease stale on waking")
                return
            renewed = await self.leases.renew(held)
        except LeaseError as exc:
            log.event("duty_lease_unknown", "warning", duty=duty.name, error=str(exc))
            if held is not None and not held.fresh():
                self._stop(duty.name, "lease stale")
            return
        if renewed is None:
            self._stop(duty.name, "lease lost")
        else:
            self.held[duty.name] = renewed
            task = self.tasks[duty.name]
            if task.done() and not task.cancelled() and not self._stopped:
                # A duty that ended (or crashed) starts again while we hold it.
                if task.exception() is not None:
                    log.event("duty_crashed", "error", duty=duty.name, error=repr(task.exception()))
                self.tasks[duty.name] = self._task(duty, renewed)

    def _task(self, duty: Duty, held: Held) -> asyncio.Task:
        ctx = DutyContext(self.config, self.leases, self.config.fleet.heartbeat, held.token,
                          role=self.role, company=lambda: self.company, holders=self.holders,
                          estate=self.estate)
        return asyncio.create_task(duty.run(ctx), name=f"duty {duty.name}")

    def _start(self, duty: Duty, held: Held) -> None:
        if self._stopped:
            return  # a tend that outlived its cancel: the claim lapses within its TTL
        self.held[duty.name] = held
        self.tasks[duty.name] = self._task(duty, held)
        log.event("duty_started", duty=duty.name, token=held.token)

    def _stop(self, name: str, why: str) -> None:
        self.held.pop(name, None)
        task = self.tasks.pop(name, None)
        if task is not None:
            task.cancel()
        log.event("duty_stopped", "warning", duty=name, reason=why)

    async def stop(self) -> None:
        """:meth:`halt`, then :meth:`release`."""
        await self.halt()
        await self.release()

    async def halt(self) -> None:
        """Cancel every duty and give them :data:`DUTY_END_WAIT` to end."""
        self._stopped = True
        tending = self._tending
        if tending is not None and not tending.done():
            # A cancel swallowed by a request (3.11's wait_for): it ends at its
            # next look at going_on(), and starts no duty meanwhile (_start).
            tending.cancel()
            await asyncio.wait({tending}, timeout=DUTY_END_WAIT)
        for task in self.tasks.values():
            task.cancel()
        if self.tasks:
            _, late = await asyncio.wait(self.tasks.values(), timeout=DUTY_END_WAIT)
            if late:
                log.event("duty_stop_overdue", "warning", waited_s=DUTY_END_WAIT,
                          duties=sorted(t.get_name() for t in late))
        self.tasks.clear()

    async def release(self) -> None:
        """Release the leases held, side by side. Not bounded here (each
        waits its request's timeout): the caller bounds it by its own stop
        budget, and a lease left is gone within its TTL."""
        await asyncio.gather(*(asyncio.create_task(self._release(name, held), name=f"release {held.key}")
                               for name, held in list(self.held.items())))

    async def _release(self, name: str, held: Held) -> None:
        try:
            await self.leases.release(held)
        except LeaseError as exc:  # unreachable: the lease lapses within a TTL
            log.event("duty_release_failed", "warning", duty=name, error=str(exc))
        self.held.pop(name, None)

    def view(self) -> dict[str, Any]:
        return {name: held.token for name, held in self.held.items()}
