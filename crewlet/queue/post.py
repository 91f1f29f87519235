"""Putting mail in a seat's mailbox on an operator's behalf, and watching its turn.

One function for every surface that sends mail for someone outside the
company — ``crewletctl send`` (through crewletd) and ``POST
/v1/seats/{seat}/mail`` (ingress) — so they cannot drift apart: the mail
carries ``Crewlet-From`` naming the sender, a trigger id (the caller's, which
makes a resend land once: the mailbox drops a repeat within its duplicate
window, and the seat's ledger skips a trigger already worked), and with
*wait* the first turn record of that trigger is answered.

A resend the mailbox drops as a duplicate starts no turn of its own. With
*wait*, it is answered at once when the seat's ledger says the trigger was
worked already (``duplicate`` and ``worked`` true, ``turn`` null: that turn's
record went by before anyone listened); a duplicate whose first copy is still
waiting or being worked is waited for like any mail, and its turn answered.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import TYPE_CHECKING, Any

from crewlet.queue.base import Mailboxes, check_mail, check_trigger

if TYPE_CHECKING:
    from crewlet.coord.counters import Ledger

# The live feed of turn records: every seat publishes each of its turns here
# (roles.seats.turns), on core NATS only. Nothing stores them here: the
# estate's ``turns`` table keeps them from the log (many turns' in one
# ``turn.records`` op, roles/seats/kept.py), on every data node.
TURN_SUBJECT = "feed.turn."
# The same records in batches, ``feed.turns.<node>.<seats process>``: a JSON
# array of the records of the turns a seats process ended within
# roles.seats.turns.FEED_EVERY s, the first of a quiet moment at once. What
# an ingress projection hears: one message for many turns, not one a turn.
TURNS_SUBJECT = "feed.turns."
FROM_HEADER = "Crewlet-From"


async def post(nc, mailboxes: Mailboxes, seat: str, text: str, *, sender: str,
               trigger: str | None = None, wait: float | None = None,
               ledger: "Ledger | None" = None) -> dict[str, Any]:
    """Send *text* to *seat*; ``{"seat", "seq", "trigger", "duplicate",
    "worked", "turn"}`` (``turn`` None unless *wait* seconds saw the turn end;
    ``duplicate``: the mailbox held this trigger already; ``worked``: with
    *wait*, a duplicate the ledger says was worked already, answered at once).
    *ledger*: where a duplicate's trigger is looked up (None: it is waited for).
    ValueError for a bad trigger or a text over ``MAIL_MAX``;
    :class:`~crewlet.queue.base.MailboxError` if the mailbox would not take it."""
    check_mail(text)
    trigger = check_trigger(trigger) if trigger else uuid.uuid4().hex
    headers = {FROM_HEADER: sender}
    if not wait:
        stored = await mailboxes.put(seat, text, trigger=trigger, headers=headers)
        return _answer(seat, stored, trigger, None, False)
    # Listen before sending, so a quick turn's record is not missed.
    done: asyncio.Future = asyncio.get_running_loop().create_future()

    async def seen(msg) -> None:
        try:
            record = json.loads(msg.data)
        except ValueError:
            return
        if (isinstance(record, dict) and record.get("trigger") == trigger
                and record.get("outcome") != "running" and not done.done()):
            done.set_result(record)

    sub = await nc.subscribe(TURN_SUBJECT + seat, cb=seen)
    try:
        stored = await mailboxes.put(seat, text, trigger=trigger, headers=headers)
        # Looked up after listening: a first copy worked after this look
        # publishes its record after it, to us.
        if stored.duplicate and await _worked(ledger, seat, trigger):
            return _answer(seat, stored, trigger, None, True)
        try:
            turn = await asyncio.wait_for(done, float(wait))
        except asyncio.TimeoutError:
            turn = None
    finally:
        await sub.unsubscribe()
    return _answer(seat, stored, trigger, turn, False)


def _answer(seat: str, stored, trigger: str, turn: dict[str, Any] | None, worked: bool) -> dict[str, Any]:
    return {"seat": seat, "seq": stored.seq, "trigger": trigger, "duplicate": stored.duplicate,
            "worked": worked, "turn": turn}


async def _worked(ledger: "Ledger | None", seat: str, trigger: str) -> bool:
    """Does *ledger* say *seat* worked *trigger*? False when it cannot say."""
    if ledger is None:
        return False
    try:
        entry = await ledger.done(trigger)
    except Exception:  # no answer: wait, as for any mail
        return False
    # The ledger is by trigger; a trigger one may rightly send to several seats.
    return entry is not None and entry.get("seat") in (seat, None)
