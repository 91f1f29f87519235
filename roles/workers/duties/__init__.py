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
import time
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


async def a_copy_serves(router: Any, within: float) -> None:
    """Until some data node's copy is in service, or *within* s passed: a
    duty's first work at a node's start (the collector's walk, the maintenance
    sweep's turn records) found no copy to read the estate from, and said so
    as a warning every time."""
    if router is None:
        return
    deadline = time.monotonic() + within
    while going_on() and time.monotonic() < deadline:
        # As the router asks: this node's own copy by what its applier last
        # told this process (the status record may say "in service" first),
        # the others by their records.
        local = router.local
        if local is not None and local.reason() is None:
            return
        if router.view.ready and any(s.in_service for s in router.view.data_nodes()
                                     if local is None or s.id != router.node_id):
            return
        await asyncio.sleep(0.5)


def _registry() -> tuple[Duty, ...]:
    from roles.workers.duties import collector, fleet_shape, maintenance, scheduler, sender
    return (collector.DUTY, fleet_shape.DUTY, maintenance.DUTY, scheduler.DUTY, sender.DUTY)


DUTIES: tuple[Duty, ...] = _registry()

