"""crewlet/estate/local.py: whether this node's copy is in service, as a role
process hears its applier's ``applied`` PUB (a real ZeroMQ socket over ipc)."""

from __future__ import annotations

import asyncio
import time

import zmq
import zmq.asyncio

from crewlet import ipc
from crewlet.estate import wire
from crewlet.estate.local import LocalCopy
from crewlet.estate.view import STOPPED

STALE = 0.5


async def _until(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds}s: {what}"
        await asyncio.sleep(0.02)


def test_a_stall_of_the_readers_own_loop_does_not_call_a_live_applier_stopped(short_tmp):
    asyncio.run(_stall(str(short_tmp)))


async def _stall(run_dir: str) -> None:
    zctx = zmq.asyncio.Context()
    applied = ipc.bind(zctx, run_dir, zmq.PUB, "applied")
    copy = LocalCopy(zctx, node_id="n", run_dir=run_dir, data_dir=run_dir, stale=STALE)
    copy.start()

    def say(in_service: bool, reason: str | None = None) -> None:
        # Sent from this loop without waiting: ZeroMQ's own thread carries it.
        applied.send_multipart([wire.APPLIED_TOPIC,
                                wire.encode(wire.applied_message("n", 7, in_service, reason))])
    try:
        async def heard() -> None:  # a SUB misses what came before it joined: say it until heard
            while copy.reason() is not None:
                say(True)
                await asyncio.sleep(0.05)
        await asyncio.wait_for(heard(), 10)

        # This loop is busy past the stale time; the applier spoke meanwhile.
        time.sleep(STALE * 0.6)
        say(True)
        time.sleep(STALE * 0.8)  # the clock alone: nothing heard for 1.4x stale
        assert copy.reason() is None, "a message waiting on the socket says the applier lives"

        time.sleep(STALE * 0.6)
        say(False, "disk low")
        time.sleep(STALE * 0.8)
        assert copy.reason() == "disk low", "the waiting message is read, not just counted"

        # Read past its listener's back, the socket still wakes the listener for what comes next.
        say(True, None)
        await _until(lambda: copy._heard is not None and copy._heard.get("in_service"), 5,
                     "the listener hears the next message")

        # Silence that is really silence: out of service once stale.
        await _until(lambda: copy.reason() == STOPPED, 5, "silence called stopped")
    finally:
        await copy.close()
        applied.close()
        zctx.term()
