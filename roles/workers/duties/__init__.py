"""The company-wide singleton duties, one small module each, registered here.

A duty runs on exactly one node of the fleet at a time: whoever holds its
``duty.<name>`` lease. It reads its work from the company and the fleet's
shared state, never from the local node's seats (a ``workers`` node may run no
seats at all).

To add a duty: write a module with ``DUTY = Duty(name, run)`` and list it in
:data:`DUTIES`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

if TYPE_CHECKING:
    from roles.workers.runner import DutyContext


@dataclass(frozen=True)
class Duty:
    name: str
    # Runs while this node holds the duty; cancelled when the lease is lost.
    run: Callable[["DutyContext"], Awaitable[None]]
    # Does a node with this Tier A config take the duty? (The sender only
    # where an SMTP server is configured.) A node that does not never claims it.
    wanted: Callable[[Any], bool] = lambda config: True


def going_on() -> bool:
    """True, or CancelledError if this task was asked to stop: the head of a
    duty's loop. A cancel that lands as a request's answer does can be
    swallowed by Python 3.11's ``wait_for`` (nats-py's requests use it, DESIGN
    §4); the task's count of cancel requests stays, and a loop that looks at
    it does not go round again for ever after its lease was lost or its role
    stopped."""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError()
    return True


async def rest(seconds: float) -> None:
    """A duty's pause between its rounds: :func:`going_on` first. A cancel
    swallowed during the round (above) ends the duty here, not once the pause
    is over: a role stopping waits for its duties (roles/workers/runner.py's
    ``DUTY_END_WAIT``), and a pause is often the duty's whole interval."""
    going_on()
    await asyncio.sleep(seconds)


def _registry() -> tuple[Duty, ...]:
    from roles.workers.duties import (collector, fleet_shape, learning, maintenance, reconcile, scheduler,
                                      sender)
    return (collector.DUTY, fleet_shape.DUTY, learning.DUTY, maintenance.DUTY, reconcile.DUTY, scheduler.DUTY,
            sender.DUTY)


DUTIES: tuple[Duty, ...] = _registry()

