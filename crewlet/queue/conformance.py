"""The ONE conformance suite every mailbox backend runs.

It asserts the behaviour the hand-over constants rest on (DESIGN §4, reference
"Where the constants come from") — that a durable mailbox keeps mail with
nothing attached, that re-attaching replays in order, that a successor receives
what its predecessor never acked, that one client's detach leaves its peers
attached, that nothing is prefetched, that the delivery budget ends in the dead
letters, that a reset takes back a delivery nobody holds a token for — and it
asserts no timing. A broker that got slower does not fail it; a broker that
stopped behaving this way does. (The waits below are deadlines
for something that must happen, never measurements.)

A backend is checked through a **factory**: ``factory(ack_wait=...)`` is an
async context manager yielding two independent :class:`Mailboxes` — two
clients, as two nodes would hold them — over the same broker, with the streams
already ensured (``max_consumers`` of at least 1,000). ``ack_wait`` is the
backend's ack wait in seconds; the checks that need an ack wait to run out ask
for :data:`SHORT_ACK_WAIT`, the rest take the default (30 min), so anything
they see come back came back without waiting on it.

Each check is ``async def check(factory) -> None`` raising ``AssertionError``;
:data:`CHECKS` lists them as ``(name, check)`` for a test runner to parametrize.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import AbstractAsyncContextManager
from typing import Awaitable, Callable

from crewlet.queue.base import DELIVERY_BUDGET, TRIGGER_HEADER, Delivery, Mailboxes

Factory = Callable[..., AbstractAsyncContextManager[tuple[Mailboxes, Mailboxes]]]

SHORT_ACK_WAIT = 1.0        # s: for the checks where a predecessor vanishes without a word
AT_ONCE = 5.0               # s: the most a fetch may wait for a NAKed message (ack wait: 30 min)
REDELIVERY_WAIT = 15.0      # s: deadline for a message to come back after SHORT_ACK_WAIT
REDELIVERY_DELAY = 1.0      # s: a NAK's delay in the checks that wait it out
NOTHING_WAIT = 0.5          # s: how long a fetch that must find nothing waits to be sure
PAGE_PAST = 300             # mailboxes: more than one 256-entry page of a consumer listing


def _seat(name: str) -> str:
    """A seat name of its own per run, so a shared broker's leftovers never interfere."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def _one(box, wait: float = AT_ONCE) -> Delivery:
    d = await box.next(wait=wait)
    assert d is not None, f"no message in {box.seat}'s mailbox within {wait:g}s"
    return d


async def _counted(mb: Mailboxes, seat: str, pending: int, wait: float = AT_ONCE) -> dict:
    """*seat*'s mailbox info once it counts *pending* messages undelivered, or
    as it is at the deadline. The broker's count may lag a send it has just
    acknowledged (nats-server counts a stored message for the stream's
    consumers after the publish's ack, off the publish path), so a check of
    the count waits for it to come up, not for it to be exact at once."""
    deadline = time.monotonic() + wait
    while (info := await mb.info(seat))["pending"] < pending and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return info


async def _send_all(mb: Mailboxes, seat: str, count: int, tag: str) -> list[int]:
    return [await mb.send(seat, f"{tag}{i}", trigger=f"{seat}-{tag}{i}") for i in range(count)]


# --------------------------------------------------------------------------- 1

async def check_durable_mailbox_keeps_mail(factory: Factory) -> None:
    """Mail sent with nothing attached waits; the first attach gets all of it, in order."""
    async with factory() as (a, b):
        seat = _seat("keeps")
        assert await a.ensure([seat]) == 1
        seqs = await _send_all(a, seat, 3, "m")
        # The same trigger sent again to the same seat is stored once, and says so.
        assert await a.send(seat, "m0", trigger=f"{seat}-m0") == seqs[0]
        again = await b.put(seat, "m1", trigger=f"{seat}-m1")
        assert (again.seq, again.duplicate) == (seqs[1], True)
        fresh = await a.put(seat, "m3", trigger=f"{seat}-m3")
        assert not fresh.duplicate and fresh.seq > seqs[2]
        box = b.attach(seat)
        got = [await _one(box) for _ in range(4)]
        assert [d.data for d in got] == [b"m0", b"m1", b"m2", b"m3"]
        assert [d.seq for d in got] == [*seqs, fresh.seq]
        assert [d.trigger for d in got] == [f"{seat}-m{i}" for i in range(4)]
        assert all(d.seat == seat and d.deliveries == 1 for d in got)
        assert all(d.headers.get(TRIGGER_HEADER) == d.trigger for d in got)
        for d in got:
            await box.ack(d)
        assert await box.next(wait=NOTHING_WAIT) is None
        await box.detach()


# --------------------------------------------------------------------------- 2

async def check_reattach_replays_in_order(factory: Factory) -> None:
    """What one client fetched and never acked is replayed to the next one, first
    unacked first; what it acked is not, an ack sent unconfirmed included (as
    a turn acks: the ledger answers for it)."""
    async with factory(ack_wait=SHORT_ACK_WAIT) as (a, b):
        seat = _seat("replay")
        await a.ensure([seat])
        await _send_all(a, seat, 3, "r")
        first = a.attach(seat)
        done = await _one(first)
        await first.ack_unconfirmed(done)
        held = [await _one(first), await _one(first)]      # fetched, never acked
        await first.detach()
        second = b.attach(seat)                              # the other client
        again = []
        for _ in held:
            d = await _one(second, REDELIVERY_WAIT)
            await second.ack(d)
            again.append(d)
        assert [d.seq for d in again] == [d.seq for d in held]
        assert [d.data for d in again] == [b"r1", b"r2"]
        assert all(d.deliveries == 2 for d in again)
        assert await second.next(wait=NOTHING_WAIT) is None, "an acked message was replayed"


# --------------------------------------------------------------------------- 3

async def check_successor_gets_unacked(factory: Factory) -> None:
    """A successor is handed what its predecessor never acked: at once after the
    predecessor's NAKs (the ack wait is 30 min), and after the ack wait when it
    vanished without a word."""
    async with factory() as (a, b):
        seat = _seat("handover")
        await a.ensure([seat])
        await _send_all(a, seat, 2, "h")
        loser = a.attach(seat)
        fetched = [await _one(loser), await _one(loser)]
        for d in fetched:                                    # release: NAK what was not started
            await loser.nak(d)
        await loser.detach()
        successor = b.attach(seat)
        got = [await _one(successor, AT_ONCE) for _ in fetched]
        assert [d.seq for d in got] == [d.seq for d in fetched]
        assert all(d.deliveries == 2 for d in got)
        for d in got:
            await successor.ack(d)

    async with factory(ack_wait=SHORT_ACK_WAIT) as (a, b):
        seat = _seat("vanish")
        await a.ensure([seat])
        await a.send(seat, "lost?", trigger=f"{seat}-1")
        held = await _one(a.attach(seat))                    # ... and the node dies: no NAK
        d = await _one(b.attach(seat), REDELIVERY_WAIT)
        assert (d.seq, d.data, d.deliveries, d.trigger) == (held.seq, b"lost?", 2, held.trigger)
        await b.ack(d.ack_token)                             # by token, as after a restart


# --------------------------------------------------------------------------- 4

async def check_detach_leaves_peers_attached(factory: Factory) -> None:
    """Two clients attached to one mailbox; one detaches; the other still gets new mail."""
    async with factory() as (a, b):
        seat = _seat("peers")
        await a.ensure([seat])
        box_a, box_b = a.attach(seat), b.attach(seat)
        await a.send(seat, "before", trigger=f"{seat}-0")
        d = await _one(box_a)
        await box_a.ack(d)
        await box_a.detach()
        waiting = asyncio.ensure_future(box_b.next(wait=AT_ONCE))   # B waits for mail ...
        await asyncio.sleep(0)
        await a.send(seat, "after", trigger=f"{seat}-1")           # ... sent after A left
        d = await waiting
        assert d is not None and d.data == b"after" and d.deliveries == 1
        await box_b.ack(d)
        await b.send(seat, "later", trigger=f"{seat}-2")
        d = await _one(box_b)
        assert d.data == b"later"
        await box_b.ack(d)


# --------------------------------------------------------------------------- 5

async def check_nothing_is_prefetched(factory: Factory) -> None:
    """A client holds only what it asked for: one fetch, one message in flight."""
    async with factory() as (a, b):
        seat = _seat("noprefetch")
        await a.ensure([seat])
        await _send_all(a, seat, 2, "p")
        da = await _one(a.attach(seat))
        info = await _counted(b, seat, 1)
        assert info["in_flight"] == 1, info
        assert info["pending"] == 1, info
        db = await b.attach(seat).next()                     # no wait: it is there now
        assert db is not None, "the second message was held by the client that fetched the first"
        assert (da.data, db.data) == (b"p0", b"p1")
        await a.ack(da.ack_token)
        await b.ack(db.ack_token)
        info = await a.info(seat)
        assert (info["in_flight"], info["pending"]) == (0, 0), info


# --------------------------------------------------------------------------- 6

async def check_budget_spent_goes_to_dead_letters(factory: Factory) -> None:
    """The delivery past the budget is not handed out: it lands in the dead letters with
    the original message and the reason, and leaves the mailbox; requeue sends it back
    with a fresh budget."""
    async with factory() as (a, b):
        seat = _seat("doomed")
        await a.ensure([seat])
        trigger = f"{seat}-t"
        seq = await a.send(seat, b"poison", trigger=trigger, headers={"X-Test": "kept"})
        box = a.attach(seat)
        for n in range(1, DELIVERY_BUDGET + 1):
            d = await _one(box)
            assert (d.seq, d.deliveries) == (seq, n)
            await box.nak(d)
        assert await box.next(wait=NOTHING_WAIT) is None, "a delivery past the budget was handed out"
        info = await a.info(seat)
        assert (info["pending"], info["in_flight"]) == (0, 0), info

        dead = await b.dead_letters(seat)
        assert len(dead) == 1, dead
        dl = dead[0]
        assert (dl.seat, dl.data, dl.original_seq) == (seat, b"poison", seq)
        assert dl.headers.get(TRIGGER_HEADER) == trigger and dl.headers.get("X-Test") == "kept"
        assert dl.reason == f"delivery budget of {DELIVERY_BUDGET} spent"
        assert dl.deliveries == DELIVERY_BUDGET + 1
        assert dl.at > 0
        assert [x.seq for x in await b.dead_letters()].count(dl.seq) == 1   # all seats' too

        new_seq = await b.requeue(dl.seq)
        assert await a.dead_letters(seat) == []
        d = await _one(b.attach(seat))
        assert (d.seq, d.data, d.deliveries) == (new_seq, b"poison", 1)
        assert d.trigger == f"{trigger}.requeue.{dl.seq}" and d.headers.get("X-Test") == "kept"
        await b.attach(seat).ack(d)


# --------------------------------------------------------------------------- 7

async def check_ensure_is_idempotent(factory: Factory) -> None:
    """ensure() creates only what is missing and never resets a mailbox's cursor;
    existing() lists them all, past one page."""
    async with factory() as (a, b):
        seat = _seat("idem")
        assert await a.ensure([seat]) == 1
        assert await a.ensure([seat]) == 0
        assert await b.ensure([seat]) == 0
        await _send_all(a, seat, 2, "i")
        box = a.attach(seat)
        d = await _one(box)
        await box.ack(d)
        assert await b.ensure([seat]) == 0                  # another node's boot
        d = await _one(box)
        assert d.data == b"i1" and d.deliveries == 1, "ensure reset the cursor"
        await box.ack(d)
        assert await box.next(wait=NOTHING_WAIT) is None

        many = [f"page{i:03d}-{seat}" for i in range(PAGE_PAST)]
        assert await a.ensure(many) == PAGE_PAST
        have = await b.existing()
        assert set(many) <= have and seat in have, f"{len(set(many) - have)} missing"
        assert await b.ensure([*many, seat]) == 0


# --------------------------------------------------------------------------- 8

async def check_remove_and_trim(factory: Factory) -> None:
    """remove() deletes a mailbox and its mail; trim() drops worked mail, never pending."""
    async with factory() as (a, b):
        gone, kept = _seat("gone"), _seat("kept")
        await a.ensure([gone, kept])
        await a.send(gone, "stale", trigger=f"{gone}-1")
        await a.remove(gone)
        assert gone not in await b.existing()
        await b.remove(gone)                                 # idempotent
        assert await b.ensure([gone]) == 1
        assert await b.attach(gone).next(wait=NOTHING_WAIT) is None, "a removed mailbox kept its mail"

        await _send_all(a, kept, 4, "k")
        box = a.attach(kept)
        for _ in range(2):
            await box.ack(await _one(box))
        assert await b.trim(kept) == 2                       # k0, k1: worked, nothing in flight
        info = await b.info(kept)
        assert (info["pending"], info["in_flight"]) == (2, 0), info
        third = await _one(box)
        assert third.data == b"k2"
        assert await b.trim(kept) == 0, "trim purged while mail was in flight"
        await box.nak(third)
        again = await _one(box)
        assert (again.seq, again.data) == (third.seq, b"k2"), "trim dropped unworked mail"
        await box.ack(again)
        assert await b.trim(kept) == 1                       # k2
        assert await b.trim(kept) == 0                       # nothing below the floor left
        fourth = await _one(box)
        assert fourth.data == b"k3", "trim dropped unworked mail"

        await box.ack(fourth)

        # A delivery NAKed to come back later is in flight until then: a trim
        # meanwhile leaves the mailbox alone, and the delivery comes back on time.
        await _send_all(a, kept, 2, "n")
        await box.ack(await _one(box))
        later = await _one(box)
        await box.nak(later, delay=REDELIVERY_DELAY)
        assert await b.trim(kept) == 0, "trim purged while mail was in flight"
        back = await _one(box, wait=REDELIVERY_DELAY + AT_ONCE)
        assert (back.seq, back.data) == (later.seq, b"n1"), "trim held back a NAKed delivery"
        await box.ack(back)
        assert await b.trim(kept) == 3                       # k3, n0, n1


# --------------------------------------------------------------------------- 9

async def check_reset_takes_back_a_lost_delivery(factory: Factory) -> None:
    """A delivery handed to a client that vanished without its token (no NAK
    possible) comes back at once after a reset, not after the ack wait; so
    does one waiting out a NAK's delay. What was acked below them stays
    acked."""
    async with factory() as (a, b):
        seat = _seat("reset")
        await a.ensure([seat])
        await _send_all(a, seat, 3, "x")
        box = a.attach(seat)
        await box.ack(await _one(box))                       # x0: worked
        lost = await _one(box)                               # x1: ... and its token dies with it
        later = await _one(box)                              # x2: handed back for later
        await box.nak(later, 600)
        successor = b.attach(seat)
        assert await successor.next(wait=NOTHING_WAIT) is None
        assert await b.reset(seat) == lost.seq
        got = [await _one(successor, AT_ONCE) for _ in range(2)]
        assert [(d.seq, d.data) for d in got] == [(lost.seq, b"x1"), (later.seq, b"x2")]
        for d in got:
            await successor.ack(d)
        assert await successor.next(wait=NOTHING_WAIT) is None, "an acked message came back"


async def check_a_delivery_says_what_is_behind_it(factory: Factory) -> None:
    """Each first delivery counts the mail not yet delivered after it (a turn
    loop that hears every publish need not look again after a 0); a backend
    that cannot tell says None.

    The count is the broker's as it hands a message over, and may lag a send
    it has just acknowledged (see _counted): a delivery made before the
    broker counted the mail behind it says 0 (seen once in CI under load:
    [0, 0, 0]). So the deliveries are fetched once the mailbox's own count
    shows all three sent."""
    async with factory() as (a, _b):
        seat = _seat("behind")
        await a.ensure([seat])
        await _send_all(a, seat, 3, "p")
        await _counted(a, seat, 3)
        box = a.attach(seat)
        got = [await _one(box) for _ in range(3)]
        for d in got:
            await box.ack(d)
        pending = [d.pending for d in got]
        assert pending in ([2, 1, 0], [None, None, None]), pending
        await box.detach()


CHECKS: list[tuple[str, Callable[[Factory], Awaitable[None]]]] = [
    ("durable_mailbox_keeps_mail", check_durable_mailbox_keeps_mail),
    ("reattach_replays_in_order", check_reattach_replays_in_order),
    ("successor_gets_unacked", check_successor_gets_unacked),
    ("detach_leaves_peers_attached", check_detach_leaves_peers_attached),
    ("nothing_is_prefetched", check_nothing_is_prefetched),
    ("budget_spent_goes_to_dead_letters", check_budget_spent_goes_to_dead_letters),
    ("ensure_is_idempotent", check_ensure_is_idempotent),
    ("remove_and_trim", check_remove_and_trim),
    ("reset_takes_back_a_lost_delivery", check_reset_takes_back_a_lost_delivery),
    ("a_delivery_says_what_is_behind_it", check_a_delivery_says_what_is_behind_it),
]
