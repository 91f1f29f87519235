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


def test_a_write_waits_for_a_live_applier_and_gives_up_once_it_is_silent(short_tmp):
    asyncio.run(_silent(str(short_tmp)))


async def _silent(run_dir: str) -> None:
    """A write is not waited on for its whole wait (a minute in the router)
    once the applier is silent, as SIGSTOP leaves it: it ends as soon as the
    copy would be called stopped, so the router asks a peer. A live applier
    (it keeps saying applied) is waited for however long it takes."""
    from crewlet.estate.local import ApplierSilent
    zctx = zmq.asyncio.Context()
    applied = ipc.bind(zctx, run_dir, zmq.PUB, "applied")
    estate = ipc.bind(zctx, run_dir, zmq.ROUTER, "estate")  # the applier's: it answers when told
    copy = LocalCopy(zctx, node_id="n", run_dir=run_dir, data_dir=run_dir, stale=STALE)
    copy.start()

    def say() -> None:
        applied.send_multipart([wire.APPLIED_TOPIC, wire.encode(wire.applied_message("n", 7, True, None))])
    request = {"kind": wire.WRITE, "wait": 30.0}
    try:
        async def heard() -> None:  # a SUB misses what came before it joined: say it until heard
            while copy.reason() is not None:
                say()
                await asyncio.sleep(0.05)
        await asyncio.wait_for(heard(), 10)

        # Live: it speaks every tenth of the stale time, and answers after 3x stale.
        write = asyncio.create_task(copy.ask(dict(request)))
        started = time.monotonic()
        while time.monotonic() - started < STALE * 3:
            say()
            await asyncio.sleep(STALE / 10)
        assert not write.done(), "a live applier's write was given up"
        frames = await asyncio.wait_for(estate.recv_multipart(), 5)   # [who, b"", request]
        asked = wire.decode(frames[-1])
        await estate.send_multipart([*frames[:-1], wire.encode({"id": asked["id"], "status": wire.OK})])
        answer = await asyncio.wait_for(write, 5)
        assert answer["status"] == wire.OK and answer["node"] == "n"

        # Silent from here (stopped): the next write ends once stale, not after its 30 s.
        say()
        started = time.monotonic()
        try:
            await asyncio.wait_for(copy.ask(dict(request)), 10)
        except ApplierSilent:
            pass
        else:
            raise AssertionError("a write to a silent applier was answered")
        took = time.monotonic() - started
        assert took < STALE * 4, f"a silent applier's write was waited on for {took:.2f}s"
        assert copy.reason() == STOPPED
    finally:
        await copy.close()
        applied.close()
        estate.close()
        zctx.term()
