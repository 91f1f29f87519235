"""``NOTIFY``: webhook deliveries on their way to a seat's mailbox.

Where an outside event enters (DESIGN §10): ingress checks a delivery's
signature, claims its id in ``claims`` (first node wins across the fleet),
:func:`store`\\ s it here and only then answers the sender's 2xx. The
:data:`~crewlet.groups.NOTIFY` consumer group then turns each stored delivery
into mail to the seat it was routed to (:func:`deliver`), with the delivery
id as the mail's trigger, and acks it once the mailbox has it.

So a delivery, once answered, is either in ``NOTIFY`` or already mail; and a
delivery the sender sends again (a retry, a second node) is:

* a stored one: answered ``duplicate`` and dropped (the claim says stored);
* one whose node died between claiming and storing: stored by the retry
  (the claim says claimed, not stored, so the retry takes it over). Storing
  twice is harmless: ``NOTIFY`` drops a repeat of the message id within its
  duplicate window, the mailbox likewise, and the seat's ledger skips a
  trigger already worked.

The sender never got a 2xx for a delivery nobody stored, so it is never lost
silently: it is the sender's to retry (GitHub's redeliver, Slack's retries).

Message: subject ``notify.<integration>``, body the mail text, headers
``Crewlet-Seat`` and ``Crewlet-Trigger``; ``Nats-Msg-Id`` is
``<integration>:<delivery id>``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import weakref
from typing import Any, Callable

from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from crewlet import bus, groups, log
from crewlet.bus import MAX_READERS, publish_until
from crewlet.coord import buckets
from crewlet.queue.base import MailboxError
from crewlet.queue.jetstream import api_prefix, create_consumer
from crewlet.bus import EXPECTED_LAST as _EXPECTED_LAST
from crewlet.bus import WRONG_LAST_SEQUENCE as _WRONG_LAST_SEQUENCE

STREAM = "NOTIFY"
SUBJECT = "notify."                # + integration
SEAT_HEADER = "Crewlet-Seat"
TRIGGER_HEADER = "Crewlet-Trigger"
# The company's person a delivery came from (people.<id>.identities), carried to its mail.
PERSON_HEADER = "Crewlet-Person"
KEEP_DAYS = 7                      # a delivery not made into mail by then is dropped
ACK_WAIT = 30.0                    # a node that died holding a delivery: it comes back after this
RETRY_DELAY = 5.0                  # a mailbox that would not take it: asked again after this
BATCH = 32
MAX_ACK_PENDING = 1000
FETCH_WAIT = 5.0
STORE_PATIENCE = 10.0              # seconds a store is resent while unanswered (leader election)
# Claim states (the claims bucket's value, JSON).
CLAIMED, STORED = "claimed", "stored"


def claim_key(integration: str, delivery: str) -> str:
    return f"{integration}.{delivery}"


# The claims bucket's handle per JetStream context: opening one asks the
# stream for its info, a round trip per delivery otherwise (bench/api.py).
_claims: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def _claims_kv(js):
    kv = _claims.get(js)
    if kv is None:
        kv = _claims[js] = await js.key_value(buckets.CLAIMS.name)
    return kv


def stream_config(replicas: int) -> StreamConfig:
    return StreamConfig(name=STREAM, subjects=[SUBJECT + ">"], retention=RetentionPolicy.LIMITS,
                        storage=StorageType.FILE, num_replicas=replicas,
                        max_age=KEEP_DAYS * 86400, duplicate_window=120, max_consumers=MAX_READERS)


async def ensure_stream(js, replicas: int) -> None:
    """``NOTIFY`` exists (an existing one is left as it is)."""
    if await bus.ensure_stream(js, stream_config(replicas)):
        log.event("notify_stream_created", replicas=replicas)


async def claim(js, integration: str, delivery: str, *, node: str, seat: str) -> str | None:
    """Claim *delivery* of *integration*: None if this call made the claim,
    else the state the claim already had (:data:`CLAIMED` or :data:`STORED`).

    A :func:`create_claim` with :data:`STORE_PATIENCE` seconds of patience.
    Raises :class:`~crewlet.bus.Unanswered` when nothing answered in that
    time (the sender is told to retry)."""
    value = json.dumps({"state": CLAIMED, "node": node, "seat": seat, "at": time.time()}).encode()
    made, _, data = await create_claim(js, claim_key(integration, delivery), value,
                                       deadline=time.monotonic() + STORE_PATIENCE)
    if made:
        return None
    # A claim deleted by hand (no value) counts as claimed: the caller stores, harmlessly.
    try:
        return json.loads(data).get("state") or CLAIMED
    except (TypeError, ValueError, AttributeError):
        return CLAIMED


# Creates a claim makes against a key let go (deleted) under it meanwhile,
# before it counts as held: a claim let go and taken again in between is rare.
CLAIM_TRIES = 3


async def create_claim(js, key: str, value: bytes, *, deadline: float, msg_ttl: float | None = None,
                       take_deleted: bool = False) -> tuple[bool, int, bytes | None]:
    """Create *key* in the ``claims`` bucket with *value*, first writer wins
    fleet-wide: ``(True, its sequence, None)`` if this call made it, else
    ``(False, the key's last sequence, its value)`` as the stream's leader
    has it (a direct get, which any replica answers, may come from one
    lagging the winner's write and say "no such key"). The one claim both
    webhook deliveries (:func:`claim`) and the API's Idempotency-Keys
    (roles/ingress/api/common.py) make.

    The create is a compare-and-set (the key has no message, or with
    *take_deleted* its last is a delete: a claim let go, whose sequence is
    then expected, at most :data:`CLAIM_TRIES` times) sent again through a
    stream leader election until *deadline* under one ``Nats-Msg-Id``.
    The broker judges a resend's expected sequence before its id (measured,
    nats-server 2.15), so a create that landed unanswered comes back as a
    lost race: the key's last message is then read, and if it carries this
    create's id it is ours. *msg_ttl*: seconds the claim lives
    (``Nats-TTL``; the bucket's age otherwise). Reads are retried likewise.

    Raises :class:`~crewlet.bus.Unanswered`, or the read's timeout, when
    nothing answered by *deadline*; a refusal other than a lost race at once."""
    subject = bus.kv_subject(js, buckets.CLAIMS.name) + key
    options = {"msg_ttl": msg_ttl} if msg_ttl else {}
    last, data = 0, None
    for _ in range(CLAIM_TRIES):
        msg_id = f"claim:{uuid.uuid4().hex}"
        try:
            ack = await publish_until(js, subject, value, msg_id=msg_id, deadline=deadline,
                                      headers={_EXPECTED_LAST: str(last)}, **options)
            return True, ack.seq, None
        except APIError as exc:
            if exc.err_code not in _WRONG_LAST_SEQUENCE:
                raise
        last, data, written_by = await read_claim(js, key, deadline)
        if written_by == msg_id:
            return True, last, None  # ours, landed while its answer was lost
        if data is not None or not take_deleted:
            return False, last, data
    return False, last, data


async def release_claim(js, key: str, seq: int, *, deadline: float, msg_ttl: float | None = None) -> bool:
    """Delete the claim of *key* made at sequence *seq* (:func:`create_claim`'s),
    and no other: a compare-and-set on *seq*, sent again through a stream
    leader election until *deadline* under one ``Nats-Msg-Id`` (a resend of
    a delete that landed unanswered is known by that id, as
    :func:`create_claim`'s). True if it was deleted; False if the key had
    moved on (that claim expired, and the key is another's now: left as it
    is). *msg_ttl*: seconds the delete marker stays. Raises
    :class:`~crewlet.bus.Unanswered` when nothing answered by *deadline*;
    another refusal at once."""
    options = {"msg_ttl": msg_ttl} if msg_ttl else {}
    msg_id = f"unclaim:{uuid.uuid4().hex}"
    try:
        await publish_until(js, bus.kv_subject(js, buckets.CLAIMS.name) + key, b"", msg_id=msg_id,
                            deadline=deadline, headers={"KV-Operation": "DEL", _EXPECTED_LAST: str(seq)},
                            **options)
        return True
    except APIError as exc:
        if exc.err_code not in _WRONG_LAST_SEQUENCE:
            raise
    return (await read_claim(js, key, deadline))[2] == msg_id


async def read_claim(js, key: str, deadline: float) -> tuple[int, bytes | None, str | None]:
    """*key*'s last sequence in ``claims`` (0: never written, or gone), its
    value (None: deleted, purged or expired, as
    :func:`crewlet.coord.buckets.last` reads them) and the ``Nats-Msg-Id``
    it was written under, read from the stream's leader; asked again while
    the leader does not answer (an election) until *deadline*."""
    pause = 0.1
    while True:
        try:
            msg = await js.get_msg(buckets.stream(buckets.CLAIMS.name),
                                   subject=f"$KV.{buckets.CLAIMS.name}.{key}", direct=False)
            break
        except NotFoundError:
            return 0, None, None
        except (NatsTimeoutError, NoStreamResponseError, NoRespondersError):
            if time.monotonic() + pause >= deadline:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
    headers = msg.headers or {}
    gone = headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers
    return msg.seq, None if gone else msg.data, headers.get("Nats-Msg-Id")


async def mark_stored(js, integration: str, delivery: str, *, node: str, seat: str) -> None:
    kv = await _claims_kv(js)
    await kv.put(claim_key(integration, delivery),
                 json.dumps({"state": STORED, "node": node, "seat": seat, "at": time.time()}).encode())


async def store(js, integration: str, delivery: str, seat: str, text: str, person: str | None = None) -> bool:
    """Store a delivery in ``NOTIFY``; True if it was already there (a repeat
    within the duplicate window). *person*: the company's person who sent it
    (its mail carries it as ``Crewlet-Person``). Raises :class:`~crewlet.bus.Unanswered`."""
    headers = {SEAT_HEADER: seat, TRIGGER_HEADER: delivery}
    if person:
        headers[PERSON_HEADER] = person
    ack = await publish_until(js, SUBJECT + integration, text.encode(), msg_id=f"{integration}:{delivery}",
                              headers=headers, deadline=time.monotonic() + STORE_PATIENCE)
    return bool(getattr(ack, "duplicate", False))


async def deliver(js, nc, mailboxes, *, roles, stopping: Callable[[], bool],
                  known: Callable[[str], bool], on_mail: Callable[[str, str], Any] = lambda i, s: None) -> None:
    """Be one of the :data:`~crewlet.groups.NOTIFY` group: make each stored
    delivery mail to its seat, until *stopping*. *known* says whether a seat
    is still in the company (a delivery for a removed seat is dropped, logged).

    The group's consumer is created with ``action: create`` (never silently
    updating one another node made, DESIGN §4) and then bound to."""
    groups.check_attach(groups.NOTIFY, roles)
    name = groups.durable(groups.NOTIFY)
    config = {"name": name, "durable_name": name, "deliver_policy": "all", "ack_policy": "explicit",
              "ack_wait": int(ACK_WAIT * 1e9), "max_ack_pending": MAX_ACK_PENDING,
              "replay_policy": "instant", "num_replicas": 0}  # 0: the stream's replicas
    pause = 0.2
    failing = False  # logged once per spell of failures (the stream is made after we start)
    while not stopping():
        psub = None
        try:
            await js.stream_info(STREAM)
            if await create_consumer(nc, api_prefix(js), STREAM, config):
                log.event("notify_consumer_created", consumer=name)
            psub = await js.pull_subscribe_bind(durable=name, stream=STREAM)
            log.event("notify_attached", consumer=name)
            pause, failing = 0.2, False
            while not stopping():
                try:
                    msgs = await psub.fetch(BATCH, timeout=FETCH_WAIT)
                except asyncio.TimeoutError:
                    continue
                for msg in msgs:
                    await _one(msg, mailboxes, known, on_mail)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no stream yet, a leader moving: try again
            if not failing:
                log.event("notify_failed", "warning", error=f"{type(exc).__name__}: {exc}")
            failing = True
        finally:
            if psub is not None:
                try:
                    await psub.unsubscribe()
                except Exception:
                    pass
        await asyncio.sleep(pause)
        pause = min(pause * 2, 5.0)


async def _one(msg, mailboxes, known: Callable[[str], bool], on_mail) -> None:
    headers = msg.headers or {}
    seat, trigger = headers.get(SEAT_HEADER), headers.get(TRIGGER_HEADER)
    integration = msg.subject[len(SUBJECT):]
    if not seat or not trigger or not known(seat):
        log.event("notify_dropped", "warning", integration=integration, seat=seat, trigger=trigger,
                  why="no seat or trigger" if not seat or not trigger else "seat not in the company")
        await msg.term()
        return
    try:
        mail_headers = {"Crewlet-From": f"hook:{integration}"}
        if headers.get(PERSON_HEADER):
            mail_headers[PERSON_HEADER] = headers[PERSON_HEADER]
        await mailboxes.send(seat, msg.data, trigger=trigger, headers=mail_headers)
    except (MailboxError, ValueError) as exc:
        log.event("notify_mail_failed", "warning", seat=seat, trigger=trigger, error=str(exc))
        await msg.nak(delay=RETRY_DELAY)
        return
    await msg.ack_sync()
    on_mail(integration, seat)
