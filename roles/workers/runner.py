"""Running the singleton duties: hold a duty's lease, run it while held.

Every ``fleet.heartbeat`` the runner tends each registered duty: a duty not
held here is claimed if nobody holds it (or adopted if this node already did,
before this process restarted), and started; a held duty's lease is renewed,
and if it was lost — taken over after this node was paused past the TTL — the
duty is cancelled at once. A renewal whose outcome is unknown (no quorum)
keeps the duty running only while the lease is still fresh by our own clock.
On stop every duty is cancelled and its lease released, so a peer takes it
over at its next tend rather than after the TTL.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from crewlet import log
from crewlet.company import Company
from crewlet.config import NodeConfig
from crewlet.coord.holders import Holders
from crewlet.coord.lease import Held, LeaseError, Leases
from roles.workers.duties import Duty


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

    async def run(self, stopping: asyncio.Event) -> None:
        try:
            while not stopping.is_set():
                for duty in self.duties:
                    if duty.wanted(self.config):
                        await self._tend(duty)
                try:
                    await asyncio.wait_for(stopping.wait(), self.config.fleet.heartbeat)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self._release_all()

    async def _tend(self, duty: Duty) -> None:
        key = f"duty.{duty.name}"
        held = self.held.get(duty.name)
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
            if task.done() and not task.cancelled():
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
        self.held[duty.name] = held
        self.tasks[duty.name] = self._task(duty, held)
        log.event("duty_started", duty=duty.name, token=held.token)

    def _stop(self, name: str, why: str) -> None:
        self.held.pop(name, None)
        task = self.tasks.pop(name, None)
        if task is not None:
            task.cancel()
        log.event("duty_stopped", "warning", duty=name, reason=why)

    async def _release_all(self) -> None:
        for name, task in list(self.tasks.items()):
            task.cancel()
        for name, held in list(self.held.items()):
            try:
                await self.leases.release(held)
            except LeaseError as exc:  # unreachable: the leases lapse within a TTL
                log.event("duty_release_failed", "warning", duty=name, error=str(exc))
                break
        self.held.clear()
        self.tasks.clear()

    def view(self) -> dict[str, Any]:
        return {name: held.token for name, held in self.held.items()}
