"""``OUTBOX``: notifications on their way out, and what became of each.

A **notification** is an email to send: ``{id, channel: email, to, subject,
body}`` (:class:`Notification`, sizes bounded below). Whoever has one to send
— a seat's ``notify`` tool, crewlet's own notices (:func:`notice`: a dead
letter, a copy out of service) — :func:`put`\\ s it on ``OUTBOX`` and goes
on; one node of the fleet, the holder of the ``sender`` duty
(:mod:`roles.workers.duties.sender`), sends them at the company's
``notify.rate``.

**The id** names one notification for ever: it is the message's
``Nats-Msg-Id`` (a repeat inside :data:`DUPLICATE_WINDOW` is not stored
twice) and the key of its claim (a repeat later still is not *sent* twice).
Whoever puts one derives the id from what caused it (the tool: the turn's
trigger, round and call; a dead letter: its mailbox sequence), never from
the clock, so doing the same thing again gives the same id.

**Claims and outcomes** live in the ``claims`` bucket under
``outbox.<digest of the id>`` (:func:`claim_key`; an integration may not be
called ``outbox``), one JSON value a notification, kept as long as that
bucket keeps a key (a week)::

    (none) ──claim──▶ sending ──▶ sent | dead | retry ──claim──▶ sending …
                         └── found by a later sender: unknown

* ``sending`` — a sender claimed it (create-only, or compare-and-set from
  ``retry``) and is talking to the SMTP server;
* ``sent`` — the server accepted it (its words kept in ``reason``);
* ``retry`` — a passing failure (a 4xx, no connection): sent again later;
* ``dead`` — a permanent refusal (a 5xx, with the server's words), or the
  retries spent; the notification is kept in the record;
* ``unknown`` — a sender found it ``sending`` under somebody else's claim: the
  one that claimed it died (or lost its connection) before the server's
  answer reached it. It may or may not have arrived, and it is **never sent
  again** — a recipient prefers a lost email to a duplicate (at-most-once).

:func:`outcomes` lists the records, oldest change first (``crewletctl
outbox``, the control command ``outbox``).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Literal

from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from crewlet import bus, log
from crewlet.bus import MAX_READERS, publish_until
from crewlet.config.model import Email
from crewlet.coord import buckets

STREAM = "OUTBOX"
SUBJECT = "outbox."                # + channel
# Seconds the broker remembers a notification id: a resend after an
# unanswered publish lands once; past it, the claim keeps a repeat from being sent.
DUPLICATE_WINDOW = 120.0
KEEP_DAYS = 7                      # a notification nobody sent by then is dropped (no sender configured)
# The stream's bound, in notifications (older ones go first). Not in bytes: a
# stream's max_bytes is reserved from the broker's store when it is made, and
# on a small disk a node could then make no stream at all.
MAX_MSGS = 100_000
PUT_PATIENCE = 10.0                # seconds a put is resent while unanswered (a leader election)

# Sizes of a notification (characters): an id holds a seat, a trigger (200) and
# a call's place; a subject is one header line; a body is a message, not an
# attachment store.
ID_MAX = 300
SUBJECT_MAX = 200
BODY_MAX = 64 * 1024
TO_MAX = 20
REASON_KEPT = 500                  # characters of an SMTP server's answer kept in a record

CLAIM_PREFIX = "outbox."           # + digest of the id, in the claims bucket
SENDING, SENT, RETRY, DEAD, UNKNOWN = "sending", "sent", "retry", "dead", "unknown"
STATES = (SENDING, SENT, RETRY, DEAD, UNKNOWN)
FINAL = (SENT, DEAD, UNKNOWN)



class Notification(BaseModel):
    """One email to send. ``to`` is one address or a few."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=ID_MAX, pattern=r"^[^\s]+$")
    channel: Literal["email"] = "email"
    to: list[Email] = Field(min_length=1, max_length=TO_MAX)
    # One header line: no line breaks (a header injection).
    subject: str = Field(min_length=1, max_length=SUBJECT_MAX, pattern=r"^[^\r\n]*$")
    body: str = Field(max_length=BODY_MAX)
    by: str = ""                   # who put it: "seat:<name>" or "crewlet"

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def decode(cls, data: bytes) -> "Notification":
        return cls.model_validate_json(data)


def problem(exc: ValidationError) -> str:
    """A notification's first problem, as one line naming the field."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "notification"
    return f"{where}: {err.get('msg')}"


def stream_config(replicas: int) -> StreamConfig:
    # Work queue: a sent (acked) notification leaves the stream, so what is
    # there is what is still to send.
    return StreamConfig(name=STREAM, subjects=[SUBJECT + ">"], retention=RetentionPolicy.WORK_QUEUE,
                        storage=StorageType.FILE, num_replicas=replicas, max_age=KEEP_DAYS * 86400,
                        max_msgs=MAX_MSGS, duplicate_window=DUPLICATE_WINDOW,
                        max_consumers=MAX_READERS)


async def ensure_stream(js, replicas: int) -> None:
    """``OUTBOX`` exists (an existing one is left as it is)."""
    if await bus.ensure_stream(js, stream_config(replicas)):
        log.event("outbox_stream_created", replicas=replicas)


async def put(js, notification: Notification, *, patience: float = PUT_PATIENCE) -> bool:
    """Put *notification* on ``OUTBOX``; True if its id was there already
    (a repeat inside the window). Raises :class:`~crewlet.bus.Unanswered`."""
    ack = await publish_until(js, SUBJECT + notification.channel, notification.encode(),
                              msg_id=notification.id, deadline=time.monotonic() + patience)
    return bool(getattr(ack, "duplicate", False))


async def notice(js, to: list[str], id: str, subject: str, body: str) -> None:
    """Put one of crewlet's own notices (to the operators, Tier A
    ``smtp.notices_to``); nothing when nobody is to be told. Used for a dead
    letter (crewlet/queue/jetstream.py) and a copy going out of service
    (roles/data_applier/applier.py) and a tool call waiting for a person's
    decision (crewlet/conversations/turn.py, ``notice.approval.<approval id>``). Never raises: a
    notice that could not be put is logged (what it tells is logged anyway)."""
    if not to:
        return
    try:
        await put(js, Notification(id=id[:ID_MAX], to=to, subject=subject[:SUBJECT_MAX],
                                   body=body[:BODY_MAX], by="crewlet"))
    except Exception as exc:
        log.event("outbox_notice_failed", "warning", id=id, error=f"{type(exc).__name__}: {exc}")


# ------------------------------------------------------------------ claims

def claim_key(id: str) -> str:
    """The claims-bucket key of notification *id* (any id fits a key this way)."""
    return CLAIM_PREFIX + hashlib.sha256(id.encode()).hexdigest()[:32]


async def read(js, id: str) -> tuple[int, dict[str, Any] | None]:
    """The claim record of *id*: its revision (0: none) and value (None: none),
    read from the stream's leader (a replica may lag the last write)."""
    seq, data = await buckets.last(js, buckets.CLAIMS.name, claim_key(id), leader=True)
    if data is None:
        return seq, None
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    return seq, value if isinstance(value, dict) else {"state": UNKNOWN, "reason": "unreadable record"}


def record(n: Notification, state: str, **fields: Any) -> bytes:
    """A claim record's value."""
    value = {"id": n.id, "state": state, "to": n.to, "subject": n.subject, "by": n.by,
             "at": time.time(), **fields}
    if "reason" in value and value["reason"] is not None:
        value["reason"] = " ".join(str(value["reason"]).split())[:REASON_KEPT]
    return json.dumps(value, separators=(",", ":")).encode()


async def outcomes(js, *, state: str | None = None, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
    """Claim records in the order they last changed (the bucket's sequence),
    from after sequence *after*; only those in *state* if given. Each carries
    its ``seq`` (the next page's *after*)."""
    stream, subject = buckets.stream(buckets.CLAIMS.name), f"$KV.{buckets.CLAIMS.name}.{CLAIM_PREFIX}>"
    out: list[dict[str, Any]] = []
    seq = after + 1
    while len(out) < limit:
        try:
            msg = await js.get_msg(stream, seq=seq, next=True, subject=subject)
        except NotFoundError:
            break
        seq = msg.seq + 1
        if not msg.data:
            continue  # a delete marker
        try:
            value = json.loads(msg.data)
        except ValueError:
            continue
        if state is None or value.get("state") == state:
            out.append({"seq": msg.seq, **value})
    return out
