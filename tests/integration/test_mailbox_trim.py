"""The maintenance duty's worked-mail trimmer against a real nats-server:
which mailboxes it trims, its rest after each purge, its budget, and where
the next sweep goes on."""

from __future__ import annotations

import asyncio

import nats

from crewlet.queue import JetStreamMailboxes
from roles.workers.duties.mailbox_retirement import Trimmer, worth_a_purge

DEADLINE = 60.0


def run(natsd, body, seats: list[str]) -> None:
    """*body(boxes)* on a fresh connection, with *seats*' mailboxes made."""
    async def main():
        nc = await nats.connect(natsd.url, connect_timeout=2, allow_reconnect=False)
        try:
            boxes = JetStreamMailboxes(nc.jetstream(timeout=2), nc)
            await boxes.ensure_streams(replicas=1, max_consumers=100)
            await boxes.ensure(seats)
            await body(boxes)
        finally:
            await nc.close()
    asyncio.run(asyncio.wait_for(main(), DEADLINE))


async def _work(boxes: JetStreamMailboxes, seat: str, sent: int, acked: int):
    """*sent* mails to *seat*, the first *acked* of them worked; the mailbox."""
    for i in range(sent):
        await boxes.put(seat, f"m{i}", trigger=f"{seat}-{i}")
    box = boxes.attach(seat)
    for _ in range(acked):
        await box.ack(await box.next(wait=5))
    return box


def test_a_sweep_trims_worked_mail_leaves_busy_mailboxes_and_goes_on_where_it_stopped(natsd):
    seats = ["a", "b", "c", "d"]

    async def body(boxes):
        await _work(boxes, "a", 3, 2)
        busy = await _work(boxes, "b", 3, 1)
        in_hand = await busy.next(wait=5)           # b's second mail is in flight
        await _work(boxes, "c", 2, 2)
        # d: nothing sent, nothing to trim

        trimmer = Trimmer(boxes, budget=60)
        assert await trimmer.sweep(seats) == (4, 0)  # a's 2, c's 2; b is busy
        assert trimmer.after == "d"
        assert (await boxes.info("b"))["in_flight"] == 1
        await busy.ack(in_hand)
        assert await trimmer.sweep(seats) == (2, 0)  # b's 2 now
        assert await trimmer.sweep(seats) == (0, 0)  # nothing below any floor

        # Out of budget, a sweep looks at nothing and keeps its place.
        await _work(boxes, "a", 0, 1)                 # a's third mail worked
        spent = Trimmer(boxes, budget=0)
        spent.after = "b"
        assert await spent.sweep(seats) == (0, 0) and spent.after == "b"
        # The next sweep starts after "b": c, d, a, b.
        spent.budget = 60
        assert await spent.sweep(seats) == (1, 0) and spent.after == "b"
        assert (await boxes.info("a"))["pending"] == 0
    run(natsd, body, seats)


def test_a_purge_is_followed_by_a_rest_in_proportion(natsd):
    async def body(boxes):
        trimmer = Trimmer(boxes, budget=60)
        await _work(boxes, "y", 1, 0)
        assert await trimmer.sweep(["x", "y"]) == (0, 0)
        assert trimmer.rested == 0                  # no purge, no rest
        await _work(boxes, "x", 2, 2)
        assert await trimmer.sweep(["x", "y"]) == (2, 0)
        assert trimmer.rested > 0                   # after x's purge
    run(natsd, body, ["x", "y"])


def test_a_mailbox_is_trimmed_once_it_has_enough_worked_mail_for_the_mailboxes_there_are(natsd):
    assert [worth_a_purge(n) for n in (1, 100, 199, 200, 10_000)] == [1, 1, 1, 2, 100]

    async def body(boxes):
        box = await _work(boxes, "z", 4, 2)
        assert await boxes.trim("z", at_least=3) == 0   # 2 worked, 2 unworked
        await box.ack(await box.next(wait=5))
        assert await boxes.trim("z", at_least=3) == 3
        assert (await boxes.info("z"))["pending"] == 1
    run(natsd, body, ["z"])
