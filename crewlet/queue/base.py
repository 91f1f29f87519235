"""The mailbox backend interface: what a seat's mailbox promises, whoever implements it.

A backend is one :class:`Mailboxes` per process (it holds the connection) and
any number of cheap :class:`Mailbox` handles, one per attached seat. The
behaviour every backend owes is held by :mod:`crewlet.queue.conformance`;
timings are the business of ``bench/``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterable

# Deliveries a message may take before it is a dead letter (DESIGN §4, "The
# numbers"). A hand-over NAK spends one, so this is generous on purpose.
DELIVERY_BUDGET = 25

# The header a message's trigger id travels in; the ledger is keyed by it.
TRIGGER_HEADER = "Crewlet-Trigger"

# Seat names are NATS subject tokens and consumer names: no dots, no wildcards.
SEAT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


# What one mail to a seat may hold, in characters (str length, as the API's
# JSON Schema maxLength counts): the one limit of every surface that sends
# mail for someone (crewletctl send, POST /v1/seats/{seat}/mail, post()).
# Characters rather than bytes, because that is what a caller can count and
# what the API already promised; at most 4 UTF-8 bytes each, 100,000 of them
# are 400,000 bytes, so any mail within it fits the broker's 1 MiB message
# with its headers, in the mailbox and again in the dead letters.
MAIL_MAX = 100_000


def check_mail(text: str) -> str:
    """*text*, if a mail may hold it; ``ValueError`` naming MAIL_MAX otherwise."""
    if len(text) > MAIL_MAX:
        raise ValueError(f"the text is {len(text):,} characters; a mail holds at most {MAIL_MAX:,}")
    return text


# The highest stream sequence: JetStream counts messages in a uint64. A dead
# letter's number (what `dlq requeue` takes) is one.
SEQ_MAX = 2**64 - 1


# A trigger id keys the ledger (a KV key) and names the redo of a tool call
# (<trigger>.<round>.<call>), so it is a run of KV key characters with room to grow.
TRIGGER = re.compile(r"^[A-Za-z0-9_=-][A-Za-z0-9_=.-]{0,199}$")


def check_trigger(trigger: str) -> str:
    """*trigger*, if it is a valid trigger id; ``ValueError`` otherwise."""
    if not isinstance(trigger, str) or not TRIGGER.match(trigger) or ".." in trigger:
        raise ValueError(f"bad trigger id {trigger!r}: 1-200 of letters, digits, '_', '=', '-' "
                         f"and single '.' between them")
    return trigger


class MailboxError(Exception):
    """A mailbox could not be reached or used (no such mailbox, broker unavailable)."""


def check_seat(seat: str) -> str:
    """*seat*, if it is a valid seat name; ``ValueError`` otherwise."""
    if not isinstance(seat, str) or not SEAT_NAME.match(seat):
        raise ValueError(f"bad seat name {seat!r}: must match {SEAT_NAME.pattern}")
    return seat


@dataclass(frozen=True)
class Delivery:
    """One message handed to the holder of a seat, not yet acked."""

    seat: str
    seq: int                # stream sequence in the mailbox stream
    data: bytes
    headers: dict[str, str]
    deliveries: int         # 1 on first delivery
    trigger: str            # headers["Crewlet-Trigger"] if present, else f"{seat}.{seq}"
    ack_token: str          # opaque; whoever holds it may ack/nak it
    # Messages the mailbox held after this one, never delivered yet, as the
    # broker counted them when it handed this one over (None: not told). A
    # turn loop that knows every message since is announced to it (a wake)
    # need not look again when this is 0 (roles/seats/turns.py). It may lag a
    # send the broker has just acknowledged (nats-server counts a stored
    # message for its consumers after the publish's ack), so it can say 0
    # with mail behind: that mail's wake is still to come, and the loop looks
    # again on it. It is never a reason to drop or skip mail.
    pending: int | None = None


@dataclass(frozen=True)
class Stored:
    """What the mailbox answered a send: where the message is, and whether it
    held that trigger already (so nothing new was stored)."""

    seq: int                # its sequence in the mailbox stream (the first copy's, for a duplicate)
    duplicate: bool = False


@dataclass(frozen=True)
class DeadLetter:
    """A message that spent its delivery budget, as kept in the dead-letter stream."""

    seq: int                # its sequence in the dead-letter stream (what requeue takes)
    seat: str
    data: bytes
    headers: dict[str, str]  # the original message's own headers (the trigger among them)
    reason: str
    deliveries: int
    original_seq: int       # its sequence in the mailbox stream
    at: float               # when it became a dead letter (time.time())

    def row(self) -> dict:
        """What every surface shows of it (crewletctl dlq --json, GET /v1/dlq)."""
        return {"seq": self.seq, "seat": self.seat, "reason": self.reason,
                "deliveries": self.deliveries, "original_seq": self.original_seq, "at": self.at,
                "trigger": self.headers.get(TRIGGER_HEADER), "sender": self.headers.get("Crewlet-From"),
                "text": self.data.decode(errors="replace")}


class Mailbox(ABC):
    """One seat's mailbox, attached by the node holding the seat's lease.

    The cursor belongs to the mailbox, not to this handle: detaching loses
    nothing, and whoever attaches next is handed what was never acked.
    """

    seat: str

    @abstractmethod
    async def next(self, wait: float = 0.0) -> Delivery | None:
        """Fetch ONE message (no prefetch); wait up to *wait* s for one (0: do not wait).

        A delivery past the budget is never returned: it goes to the dead
        letters and the next message is fetched instead."""

    @abstractmethod
    async def ack(self, d: Delivery, deadline: float | None = None) -> None:
        """The turn is done: the message is not delivered again. With a
        monotonic *deadline*, an unconfirmed ack is sent again until then."""

    async def ack_unconfirmed(self, d: Delivery) -> None:
        """:meth:`ack`, sent once without waiting for the server's word: for a
        delivery something else already answers for (the turn ledger), so an
        ack lost on the way costs only a redelivery that is skipped."""
        await self.ack(d)

    @abstractmethod
    async def nak(self, d: Delivery, delay: float | None = None) -> None:
        """Give it back, to be delivered again now (or after *delay* s)."""

    @abstractmethod
    async def in_progress(self, d: Delivery) -> None:
        """Still working on it: start its ack wait again (long turns)."""

    @abstractmethod
    async def dead_letter(self, d: Delivery, reason: str) -> None:
        """Move it to the dead letters now, with *reason*: a failure that will not pass."""

    @abstractmethod
    async def detach(self) -> None:
        """Flush what this handle sent; nothing else (the cursor is the mailbox's)."""


class Mailboxes(ABC):
    """Every seat's mailbox, through one process's connection."""

    @abstractmethod
    async def ensure_streams(self, *, replicas: int, max_consumers: int, events_days: int) -> None:
        """Create (or bring up to date) the streams mailboxes live in; never
        ages out mail (worked mail goes by ``trim``)."""

    @abstractmethod
    async def ensure(self, seats: Iterable[str]) -> int:
        """Create the missing mailboxes of *seats*, leaving existing ones alone; how many created."""

    @abstractmethod
    async def existing(self) -> set[str]:
        """The seats that have a mailbox."""

    @abstractmethod
    async def put(self, seat: str, text_or_bytes: str | bytes, *, trigger: str | None = None,
                  headers: dict[str, str] | None = None) -> Stored:
        """Put a message in *seat*'s mailbox: its stream sequence, and whether
        it was a duplicate.

        *trigger* (made up if None) travels as ``Crewlet-Trigger``; sending the
        same trigger to the same seat again stores it once, and that second
        send is answered ``duplicate`` with the first one's sequence (within
        the backend's duplicate window; later it is stored again, and the
        seat's ledger skips it)."""

    async def send(self, seat: str, text_or_bytes: str | bytes, *, trigger: str | None = None,
                   headers: dict[str, str] | None = None) -> int:
        """:meth:`put`, answering only the stream sequence."""
        return (await self.put(seat, text_or_bytes, trigger=trigger, headers=headers)).seq

    @abstractmethod
    def attach(self, seat: str) -> Mailbox:
        """A handle on *seat*'s mailbox; cheap, no broker state per attach."""

    @abstractmethod
    async def ack(self, ack_token: str, deadline: float | None = None) -> None:
        """Ack a delivery by its token (a restarted process holds only the token)."""

    @abstractmethod
    async def nak(self, ack_token: str, delay: float | None = None) -> None:
        """NAK a delivery by its token."""

    @abstractmethod
    async def reset(self, seat: str) -> int:
        """Take back every delivery of *seat*'s mailbox not yet acked, as if
        none had been made: all of them (a NAK's delay and the count of
        deliveries included) come again from the ack floor on, at once;
        the sequence the mailbox was reset to.

        For a delivery the broker handed to a process that died before it
        could note it (so holds no token to NAK): only the seat's holder may
        call it, with nothing in its own hands."""

    @abstractmethod
    async def info(self, seat: str) -> dict:
        """``{"pending", "in_flight", "redelivered", "ack_floor"}`` of *seat*'s mailbox."""

    @abstractmethod
    async def remove(self, seat: str) -> None:
        """Delete *seat*'s mailbox and its mail (idempotent)."""

    @abstractmethod
    async def trim(self, seat: str, at_least: int = 1) -> int:
        """Drop *seat*'s worked mail (acked, below the ack floor); how many
        messages went. Nothing while any of its mail is in flight (a delivery
        NAKed to come back later included), nor while it has fewer than
        *at_least* worked messages: those wait for a later trim."""

    @abstractmethod
    async def dead_letters(self, seat: str | None = None, limit: int = 100, after: int = 0) -> list[DeadLetter]:
        """Dead letters, oldest first, of one seat or of all; *after*: only those past that seq."""

    @abstractmethod
    async def requeue(self, dlq_seq: int) -> int:
        """Send a dead letter back to its seat with a fresh budget; its new sequence."""
