"""The duty runner's stop (roles/workers/runner.py), with leases that never
answer: the runner returns as soon as it is told to stop, even in the middle
of a renewal, and a duty's loop ends on a cancel a request swallowed (at its next round, or
at its pause between rounds).

No processes, no broker: the leases here are a stand-in whose renewals
hang, as a lease write does without quorum (it waits its patience).
"""

from __future__ import annotations

import asyncio
import time

from crewlet.config import NodeConfig
from crewlet.coord.lease import Held
from roles.workers.duties import Duty, going_on, rest
from roles.workers.runner import DutyRunner


class HangingLeases:
    """Claims are granted; renewals never answer; releases are counted."""

    def __init__(self):
        self.renewing = asyncio.Event()
        self.released: list[str] = []

    async def claim_or_adopt(self, key: str) -> Held:
        return Held(key, token=1, revision=1, renewed=time.monotonic(), ttl=10.0)

    async def renew(self, held: Held) -> Held:
        self.renewing.set()
        await asyncio.sleep(3600)  # no quorum: no answer
        return held

    async def release(self, held: Held) -> bool:
        self.released.append(held.key)
        return True


async def _forever(ctx) -> None:
    while going_on():
        await asyncio.sleep(3600)


def test_a_runner_stops_at_once_mid_renewal_and_releases_every_lease():
    async def main():
        config = NodeConfig.model_validate({"fleet": {"heartbeat": 0.5, "lease_ttl": 10}})
        leases = HangingLeases()
        duties = tuple(Duty(f"d{i}", _forever) for i in range(3))
        runner = DutyRunner(config, leases, duties)
        stopping = asyncio.Event()
        running = asyncio.create_task(runner.run(stopping))
        await asyncio.wait_for(leases.renewing.wait(), 10)  # in the second round's first renewal
        tasks = list(runner.tasks.values())
        stopping.set()
        started = time.monotonic()
        await asyncio.wait_for(running, 1.0)
        await asyncio.wait_for(runner.stop(), 2.0)
        assert time.monotonic() - started < 1.5
        assert sorted(leases.released) == ["duty.d0", "duty.d1", "duty.d2"]
        assert runner.held == {} and runner.tasks == {}
        assert all(t.cancelled() for t in tasks)

    asyncio.run(main())


def test_a_duty_loop_ends_after_a_cancel_that_a_request_swallowed():
    async def swallowing_request() -> None:
        # What Python 3.11's wait_for does when a cancel lands with the answer.
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass

    rounds = 0

    async def duty() -> None:
        nonlocal rounds
        while going_on():
            rounds += 1
            await swallowing_request()

    async def main():
        task = asyncio.create_task(duty())
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        assert task.cancelled()
        assert rounds == 1

    asyncio.run(main())


def test_a_duty_whose_cancel_was_swallowed_ends_at_its_pause_not_after_it():
    """The round's request swallows the cancel and the round finishes; the
    pause that follows (a whole interval) must not hold the role's stop up."""
    async def swallowing_request() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass

    async def duty(pause) -> None:
        while going_on():
            await swallowing_request()
            await pause(3600)

    async def main(pause) -> bool:
        task = asyncio.create_task(duty(pause))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
        ended = task.done()
        task.cancel()  # the bare sleep's case: ended by a second cancel
        await asyncio.wait({task}, timeout=1.0)
        return ended

    assert asyncio.run(main(rest)) is True
    assert asyncio.run(main(asyncio.sleep)) is False  # a bare sleep waits out the pause
