"""Child specs, supervisor flags and the names they use (OTP ``supervisor``).

A **child spec** says how one child is started, when it is restarted and how
it is stopped:

* ``restart`` — ``permanent`` (always restarted), ``transient`` (restarted
  only after an abnormal exit: anything but exit 0), ``temporary`` (never).
* ``shutdown`` — seconds between SIGTERM and SIGKILL, or ``brutal_kill``
  (SIGKILL at once), or ``infinity`` (wait; the default for supervisors).
* ``type`` — ``worker`` or ``supervisor``.
* ``significant`` — with ``auto_shutdown``, whether this child ending (and not
  being restarted) ends its supervisor. Only transient and temporary children
  may be significant, as in OTP: a permanent child never ends for good.

**Supervisor flags** pick the restart strategy and its limits:

* ``one_for_one`` restarts the child that died; ``one_for_all`` stops and
  restarts every child; ``rest_for_one`` restarts the dead child and every
  child started after it.
* more than ``intensity`` restarts within ``period`` seconds and the
  supervisor stops all its children and exits, escalating to its parent.
* the n-th consecutive restart of one child waits
  ``min(backoff_max, backoff_min * 2**(n-2))`` (the first is immediate); a
  child that stayed up ``stable_after`` seconds starts its count again.
* ``auto_shutdown`` — ``never``, ``any_significant``, ``all_significant``.

The defaults for a node live in :mod:`crewlet.config.model`; these classes
carry no defaults of their own beyond OTP's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from supervisor.procs import ExitInfo

# restart
PERMANENT = "permanent"
TRANSIENT = "transient"
TEMPORARY = "temporary"
# shutdown
BRUTAL_KILL = "brutal_kill"
INFINITY = "infinity"
# type
WORKER = "worker"
SUPERVISOR = "supervisor"
# strategy
ONE_FOR_ONE = "one_for_one"
ONE_FOR_ALL = "one_for_all"
REST_FOR_ONE = "rest_for_one"
# auto_shutdown
NEVER = "never"
ANY_SIGNIFICANT = "any_significant"
ALL_SIGNIFICANT = "all_significant"


class StartFailed(Exception):
    """A child did not reach *ready*: it exited, or took too long."""

    def __init__(self, info: ExitInfo):
        super().__init__(info.reason)
        self.info = info


class Running(Protocol):
    """A started child, as its supervisor sees it."""

    pid: int | None
    # Resolved once, when the child has ended, with how it ended.
    exited: asyncio.Future[ExitInfo]

    async def stop(self, shutdown: float | str) -> ExitInfo:
        """End the child per its shutdown spec; returns how it ended."""

    def children(self) -> list[dict]:
        """Status of the children under this one (a nested supervisor's)."""


# start(incarnation) -> a child that has reported ready; raises StartFailed.
StartFn = Callable[[int], Awaitable[Running]]


@dataclass(frozen=True)
class ChildSpec:
    id: str
    start: StartFn
    restart: str = PERMANENT
    shutdown: float | str = 5.0
    type: str = WORKER
    significant: bool = False

    def __post_init__(self) -> None:
        if self.restart not in (PERMANENT, TRANSIENT, TEMPORARY):
            raise ValueError(f"child {self.id}: restart {self.restart!r}")
        if self.significant and self.restart == PERMANENT:
            raise ValueError(f"child {self.id}: a permanent child cannot be significant")
        if isinstance(self.shutdown, str) and self.shutdown not in (BRUTAL_KILL, INFINITY):
            raise ValueError(f"child {self.id}: shutdown {self.shutdown!r}")


@dataclass(frozen=True)
class SupFlags:
    strategy: str = ONE_FOR_ONE
    intensity: int = 1
    period: float = 5.0
    auto_shutdown: str = NEVER
    backoff_min: float = 0.0
    backoff_max: float = 0.0
    stable_after: float = 10.0

    def __post_init__(self) -> None:
        if self.strategy not in (ONE_FOR_ONE, ONE_FOR_ALL, REST_FOR_ONE):
            raise ValueError(f"strategy {self.strategy!r}")
        if self.auto_shutdown not in (NEVER, ANY_SIGNIFICANT, ALL_SIGNIFICANT):
            raise ValueError(f"auto_shutdown {self.auto_shutdown!r}")

    def backoff(self, consecutive: int) -> float:
        """Seconds to wait before the *consecutive*-th restart in a row."""
        if consecutive <= 1:
            return 0.0
        return min(self.backoff_max, self.backoff_min * 2 ** (consecutive - 2))
