"""Seat mailboxes: where a seat's work waits for whoever holds the seat (DESIGN §4, §5).

A seat's **mailbox** is a durable queue of its own. Mail sent to a seat waits in
it whether or not anybody holds the seat; the node holding the seat's lease
attaches, fetches ONE message when it has a free turn slot, and acks it when the
turn is done. The cursor belongs to the mailbox, not to the node reading it, so a
change of owner replays nothing and loses nothing: what the loser never acked is
exactly what the successor is handed.

How the pieces are used::

    mb = JetStreamMailboxes(js, nc)                      # one per process
    await mb.ensure_streams(replicas=3, max_consumers=seats + 100, events_days=7)
    await mb.ensure(company_seats)                       # at boot and at every apply,
                                                         # before anything publishes
    await mb.send("alice", "hello", trigger="slack.123") # the trigger dedupes the send
    box = mb.attach("alice")                             # the lease holder, at claim
    d = await box.next(wait=5)                           # one message, or None
    ...                                                  # the turn (ledger on d.trigger)
    await box.ack(d)                                     # done: never delivered again
    await box.nak(d)                                     # on release, if not started:
                                                         # the successor has it at once

* **Hand-over.** A node releasing a seat NAKs what it fetched and did not start.
  A node that dies mid-turn NAKs nothing: that message comes back after the ack
  wait (30 min). Long turns call ``in_progress`` to hold on to theirs.
* **Delivery budget.** A message delivered more than ``DELIVERY_BUDGET`` (25)
  times — a hand-over NAK spends one — is not handed out again: ``next()`` moves
  it to the dead letters with the reason, and ``requeue`` sends it back with a
  fresh budget.
* **Size.** A mail holds at most ``MAIL_MAX`` (100,000) characters
  (:func:`~crewlet.queue.base.check_mail`): every surface that sends for
  someone refuses more, naming the limit, before anything is published.
* **Worked mail** is dropped by ``trim(seat)`` (the ``maintenance`` duty): what
  lies below a mailbox's ack floor. Nothing ages mail out: an unowned seat's
  unworked mail waits in its mailbox until somebody claims the seat.
* ``ack(token)`` / ``nak(token)`` on :class:`Mailboxes` act on a delivery by its
  token alone, e.g. after a restart.

Modules:

* :mod:`crewlet.queue.base` — the interface every backend implements, and its types
* :mod:`crewlet.queue.jetstream` — the shipped backend: a durable pull consumer per
  seat on the ``AGENTS`` stream; its constants carry the measurements behind them
* :mod:`crewlet.queue.conformance` — the ONE behaviour suite every backend runs
"""

from crewlet.queue.base import (DELIVERY_BUDGET, MAIL_MAX, SEAT_NAME, TRIGGER_HEADER, DeadLetter, Delivery,
                                Mailbox, MailboxError, Mailboxes, check_mail, check_seat)

__all__ = ["DELIVERY_BUDGET", "MAIL_MAX", "SEAT_NAME", "TRIGGER_HEADER", "DeadLetter", "Delivery", "Mailbox",
           "MailboxError", "Mailboxes", "check_mail", "check_seat", "JetStreamMailboxes"]


def __getattr__(name: str):
    # The backend imports nats: loaded when first named, so that importing
    # crewlet.queue.base (crewletctl checks mail with it) does not load it.
    if name == "JetStreamMailboxes":
        from crewlet.queue.jetstream import JetStreamMailboxes

        return JetStreamMailboxes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
