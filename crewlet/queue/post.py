"""Putting mail in a seat's mailbox on an operator's behalf, and watching its turn.

One function for every surface that sends mail for someone outside the
company — ``crewletctl send`` (through crewletd) and ``POST
/v1/seats/{seat}/mail`` (ingress) — so they cannot drift apart: the mail
carries ``Crewlet-From`` naming the sender, a trigger id (the caller's, which
makes a resend land once: the mailbox drops a repeat within its duplicate
window, and the seat's ledger skips a trigger already worked), and with
*wait* the first turn record of that trigger is answered.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from crewlet.queue.base import Mailboxes, check_mail, check_trigger

# Turn records: every seat publishes each of its turns here (roles.seats.turns).
TURN_SUBJECT = "events.turn."
FROM_HEADER = "Crewlet-From"


async def post(nc, mailboxes: Mailboxes, seat: str, text: str, *, sender: str,
               trigger: str | None = None, wait: float | None = None) -> dict[str, Any]:
    """Send *text* to *seat*; ``{"seat", "seq", "trigger", "turn"}`` (``turn``
    None unless *wait* seconds saw the turn end). ValueError for a bad trigger
    or a text over ``MAIL_MAX``; :class:`~crewlet.queue.base.MailboxError` if
    the mailbox would not take it."""
    check_mail(text)
    trigger = check_trigger(trigger) if trigger else uuid.uuid4().hex
    headers = {FROM_HEADER: sender}
    if not wait:
        seq = await mailboxes.send(seat, text, trigger=trigger, headers=headers)
        return {"seat": seat, "seq": seq, "trigger": trigger, "turn": None}
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
        seq = await mailboxes.send(seat, text, trigger=trigger, headers=headers)
        try:
            turn = await asyncio.wait_for(done, float(wait))
        except asyncio.TimeoutError:
            turn = None
    finally:
        await sub.unsubscribe()
    return {"seat": seat, "seq": seq, "trigger": trigger, "turn": turn}
