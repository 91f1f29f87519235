"""Seat mailboxes on NATS JetStream: one durable pull consumer per seat on ``AGENTS``.

A seat's mail is published on ``agents.inbox.<seat>``; its mailbox is the
durable consumer ``inbox-<seat>`` filtered to that subject. The cursor is the
consumer's, so whichever node attaches next is handed exactly what the last
holder never acked (DESIGN §5, reference "Where the constants come from").

Scale (10,000 seats on one node) shapes the client:

* **No subscription per mailbox.** A fetch is a plain ``CONSUMER.MSG.NEXT``
  request for ONE message whose reply goes to this process's single fetch
  inbox (``<inbox>.<seat>.<request id>``). ``nc.request``'s shared inbox cannot
  be used: JetStream hands a pulled message over under its *original* subject
  (``agents.inbox.<seat>``), which nats-py's request muxer cannot match and
  drops (measured). So fetches of one seat are serialised in this process, and
  a message is matched to its fetch by the consumer named in its ack subject;
  status replies (404/408 no message, 409, 503) come back on the request's own
  inbox subject. A message that arrives after its fetch gave up is NAKed at
  once, so it is not held hostage for an ack wait.
* **Creation never re-creates.** ``ensure`` lists the consumers (paging past
  256) and creates only the missing ones, concurrently, with
  ``action: create`` (an existing consumer is never silently updated).
* **Acks are confirmed** (ack, NAK and TERM are requests the server answers
  once it has applied them): a turn's ack that was only queued in a socket
  buffer would come back 30 minutes later, and a hand-over NAK must have
  landed before the lease is let go. Work-in-progress stays fire-and-forget.

Dead letters are the client's job: a delivery whose count passed
:data:`~crewlet.queue.base.DELIVERY_BUDGET` is copied to ``DLQ`` (subject
``dlq.<seat>``, original data and headers plus ``Crewlet-Dlq-*``), TERMed and
deleted from ``AGENTS``. The server's max-deliveries advisory is a core-NATS
message, lost when nobody listens; ``max_deliver`` is only the backstop.

From a leaf, the JetStream API is reached through the domain prefix of *js*
(read like :func:`crewlet.bus.kv_subject` does); publishes to stream subjects
and acks travel as they are (measured through a leaf with a domain).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import itertools
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from crewlet import groups, log, outbox
from crewlet.bus import JETSTREAM_TIMEOUT, MAX_READERS, Unanswered, publish_later, publish_until
from crewlet.queue.base import (DELIVERY_BUDGET, TRIGGER_HEADER, DeadLetter, Delivery, Mailbox,
                                MailboxError, Mailboxes, Stored, check_seat, check_trigger)

# ---------------------------------------------------------------- fleet-wide constants

STREAM = "AGENTS"
SUBJECT = "agents.inbox."            # + seat
CONSUMER = "inbox-"                  # + seat: the durable's name
DLQ_STREAM = "DLQ"
DLQ_SUBJECT = "dlq."                 # + seat
EVENTS_STREAM = "EVENTS"
# Turn records as custody keeps them: ``{"records": [record, ...]}``, a batch
# of the records a seats process of a version before 2026-12-06 had to send at
# once. This version's go to the estate's log alone (roles/seats/kept.py).
KEPT_TURNS = "events.turns"
# The turn events' age limit when nobody names one (the company's
# retention.events_days, whose default this is): custody keeps each event in
# one data node's table for as long (roles/data_applier/custody.py), and the
# estate keeps the turn records themselves durably elsewhere.
EVENTS_DAYS = 7

# Limits, not interest: measured with bench/mailboxes.py (nats-server 2.15.1, nats-py 2.16, 2 cores,
# one server, file storage; 2,000 x publish + fetch(1) + confirmed ack over 200 random seats,
# 32 at once; bare nats-py msgs/s, lowest-highest of four runs on a machine shared with other work):
#     consumers    interest       limits
#     1,000        610-2,240      1,660-3,390
#     5,000        140-650        910-5,290
#     10,000       70-330         710-6,630      (limits 10-47x interest within every run)
# Interest retention falls about tenfold from 1,000 to 10,000 mailboxes (DESIGN §4 saw the same
# cliff); limits does not fall with their number. (The idle CPU burn DESIGN reports after
# interest runs did not show here: 0-5 % of a core idle in every case.) Limits keeps worked
# mail, so trim() -- the maintenance duty -- drops what lies below a mailbox's ack floor.
# The stream has no max_age: an age limit would drop an unowned seat's unworked mail too,
# and a mailbox keeps its seat's mail until somebody claims the seat.
RETENTION = "limits"

DEFAULT_ACK_WAIT = 1800.0            # s: what a node that died mid-turn holds comes back after this
# Server-side backstop only: the client dead-letters the delivery past the budget itself,
# and the headroom lets a dead-lettering that failed (the DLQ unanswered, the process
# killed) be tried again on a later delivery instead of the message being stranded.
MAX_DELIVER = DELIVERY_BUDGET + 5
DLQ_REASON = f"delivery budget of {DELIVERY_BUDGET} spent"
REASON_KEPT = 1000                   # characters of a dead letter's reason kept in its header

# Creating consumers: concurrency enough to keep a server busy without queuing past the
# per-request wait on an R3 cluster (measured, 1,000 mailboxes: 0.4-1.0 s on one server,
# 7-12 s on R3; when they all exist already, ensure() lists them in 2-5 ms). A create that
# timed out is sent again: with action "create" that is harmless.
CREATE_CONCURRENCY = 64
CREATE_TIMEOUT = 10.0
CREATE_ATTEMPTS = 3

# A publish the stream did not answer (leader election stalls writes ~6 s, DESIGN §4)
# is resent under the same Nats-Msg-Id for this long; the pause doubles up to 1 s.
SEND_PATIENCE = 10.0
RETRY_PAUSE = 0.1
ACK_ATTEMPTS = 2                     # a confirmed ack/NAK/TERM is sent this many times
# A fetch that waits and hears "no responders" asks again after this (see JetStreamMailbox.next).
NO_RESPONDERS_PAUSE = 0.1

_NS = 1_000_000_000
_DAY = 86_400
_NO_MESSAGE = ("404", "408")         # no_wait found nothing / expires ran out
_ERR_STREAM_NOT_FOUND = 10059
_ERR_STREAM_NAME_IN_USE = 10058
_ERR_CONSUMER_NOT_FOUND = 10014
_ERR_CONSUMER_EXISTS = (10148, 10013)  # exists with another config / name in use
_ERR_NO_MESSAGE = 10037


class _Refused(MailboxError):
    """The JetStream API answered with an error."""

    def __init__(self, what: str, error: dict[str, Any]):
        self.err_code = error.get("err_code")
        self.code = error.get("code")
        super().__init__(f"{what}: {error.get('description')} (err {self.err_code})")


class _Unanswered(MailboxError):
    """The JetStream API did not answer in time."""


class _NoResponders(MailboxError):
    """A fetch heard "no responders": the seat has no mailbox, or its
    consumer has no leader yet."""


def api_prefix(js: JetStreamContext) -> str:
    """The JetStream API prefix of *js*: ``$JS.API``, or ``$JS.<domain>.API`` on a leaf.

    nats-py keeps it in a private attribute; this and :func:`crewlet.bus.kv_subject`
    are the places that read it."""
    return getattr(js, "_prefix", "$JS.API")


async def jetstream_api(nc, prefix: str, what: str, body: dict | None, timeout: float) -> dict[str, Any]:
    """One raw JetStream API request (``<prefix>.<what>``): its answer, or
    :class:`_Refused` (the API's error) / :class:`_Unanswered`."""
    payload = b"" if body is None else json.dumps(body).encode()
    try:
        msg = await nc.request(f"{prefix}.{what}", payload, timeout=timeout)
    except NoRespondersError as exc:
        raise _Unanswered(f"{what}: JetStream is not available") from exc
    except NatsTimeoutError as exc:
        raise _Unanswered(f"{what}: no answer within {timeout:g}s") from exc
    resp = json.loads(msg.data)
    if "error" in resp:
        raise _Refused(what, resp["error"])
    return resp


async def create_consumer(nc, prefix: str, stream: str, config: dict[str, Any], *,
                          subject: str | None = None) -> bool:
    """Create the durable consumer *config* on *stream* unless it exists; True
    if this call made it. ``action: create``, because ``add_consumer`` on an
    existing durable silently updates it (DESIGN §4) and two nodes starting at
    once must not fight over its config. An unanswered request is tried again
    (:data:`CREATE_ATTEMPTS`). *subject*: the filter, named in the API subject."""
    what = f"CONSUMER.CREATE.{stream}.{config['durable_name']}" + (f".{subject}" if subject else "")
    body = {"stream_name": stream, "config": config, "action": "create"}
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        try:
            await jetstream_api(nc, prefix, what, body, CREATE_TIMEOUT)
            return True
        except _Refused as exc:
            if exc.err_code in _ERR_CONSUMER_EXISTS:
                return False
            raise
        except _Unanswered:
            if attempt == CREATE_ATTEMPTS:
                raise
    return False


@dataclass(frozen=True)
class AckMeta:
    consumer: str
    delivered: int
    stream_seq: int
    pending: int | None = None  # the consumer's messages not yet delivered, after this one


def ack_meta(reply: str | None) -> AckMeta | None:
    """What an ack subject says, or None if it is not one.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``, or with a
    domain and account hash after ``ACK`` (and perhaps a random token at the end):
    the nine-token form is read as is, the longer one from its sixth token."""
    if not reply:
        return None
    tokens = reply.split(".")
    if tokens[:2] != ["$JS", "ACK"]:
        return None
    if len(tokens) == 9:
        fields = tokens[2:9]
    elif len(tokens) >= 11:
        fields = tokens[4:11]
    else:
        return None
    try:
        meta = AckMeta(fields[1], int(fields[2]), int(fields[3]))
    except ValueError:
        return None
    try:
        return AckMeta(meta.consumer, meta.delivered, meta.stream_seq, int(fields[6]))
    except ValueError:
        return meta


def _headers(raw: dict | None) -> dict[str, str]:
    # nats-py keys a few headers by a str Enum; use their plain names.
    return {getattr(k, "value", k): v for k, v in (raw or {}).items()}


def _parse_headers(blob: str | None) -> dict[str, str]:
    """Headers of a stored message (``STREAM.MSG.GET``: base64 of ``NATS/1.0`` lines)."""
    if not blob:
        return {}
    lines = base64.b64decode(blob).decode(errors="replace").split("\r\n")
    out: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


def _epoch(stamp: str | None) -> float:
    """An RFC 3339 stamp with nanoseconds (as the server writes them) as time.time()."""
    if not stamp:
        return 0.0
    head, _, frac = stamp.rstrip("Z").partition(".")
    frac = (frac + "000000")[:6]
    return datetime.datetime.fromisoformat(f"{head}.{frac}+00:00").timestamp()


def _is_control(name: str) -> bool:
    # Nats-* headers steer a publish (dedupe id, expectations): never copied along.
    return name.lower().startswith("nats-")


class JetStreamMailbox(Mailbox):
    """A handle on one seat's mailbox; all state is the consumer's (and its owner's)."""

    def __init__(self, owner: "JetStreamMailboxes", seat: str):
        self._owner = owner
        self.seat = seat

    async def next(self, wait: float = 0.0) -> Delivery | None:
        deadline = time.monotonic() + max(wait, 0.0)
        while True:
            left = max(0.0, deadline - time.monotonic()) if wait > 0 else 0.0
            try:
                d = await self._owner._fetch(self.seat, left)
            except _NoResponders:
                # No mailbox, or one whose leader is still being chosen: on a
                # cluster a consumer just made answers only after its first
                # election (seen: a fetch right after ensure). Asked again
                # while the wait lasts; a fetch that does not wait is told at once.
                if deadline - time.monotonic() < NO_RESPONDERS_PAUSE:
                    raise
                await asyncio.sleep(NO_RESPONDERS_PAUSE)
                continue
            if d is None or d.deliveries <= DELIVERY_BUDGET:
                return d
            try:
                await self._owner._dead_letter(d)
            except BaseException:
                # Not dead-lettered: give it back, the next delivery tries again.
                await asyncio.shield(self._owner._nak_quietly(d.ack_token))
                raise

    async def ack(self, d: Delivery, deadline: float | None = None) -> None:
        await self._owner.ack(d.ack_token, deadline)

    async def ack_unconfirmed(self, d: Delivery) -> None:
        try:
            # With the connection's next write, not one of its own (crewlet.bus).
            await publish_later(self._owner._nc, d.ack_token, b"+ACK")
        except Exception as exc:  # the connection's trouble: the ack wait brings it back
            raise MailboxError(f"+ACK not sent for {d.ack_token}: {type(exc).__name__}: {exc}") from exc

    async def nak(self, d: Delivery, delay: float | None = None) -> None:
        await self._owner.nak(d.ack_token, delay)

    async def in_progress(self, d: Delivery) -> None:
        await self._owner._nc.publish(d.ack_token, b"+WPI")

    async def dead_letter(self, d: Delivery, reason: str) -> None:
        await self._owner._dead_letter(d, reason)

    async def detach(self) -> None:
        await self._owner._nc.flush(timeout=self._owner._timeout)

    def __repr__(self) -> str:
        return f"JetStreamMailbox({self.seat!r})"


class JetStreamMailboxes(Mailboxes):
    """Every seat's mailbox through one NATS connection (one per process)."""

    def __init__(self, js: JetStreamContext, nc: Client, *, ack_wait: float = DEFAULT_ACK_WAIT,
                 timeout: float = JETSTREAM_TIMEOUT):
        self._js = js
        self._nc = nc
        self.ack_wait = ack_wait
        self._timeout = timeout
        self._api_prefix = api_prefix(js)
        self._inbox: str | None = None       # this process's fetch inbox, made on first fetch
        self._sub: Any = None
        self._sub_lock = asyncio.Lock()
        self._seat_locks: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, tuple[int, asyncio.Future]] = {}   # seat -> the fetch in flight
        self._request_ids = itertools.count(1)
        # Who is told of a dead letter (Tier A smtp.notices_to), set by the
        # process that dead-letters (the seats role); empty: nobody.
        self.notices_to: list[str] = []

    # ------------------------------------------------------------ the API, raw

    async def _api(self, what: str, body: dict | None = None, *,
                   timeout: float | None = None) -> dict[str, Any]:
        return await jetstream_api(self._nc, self._api_prefix, what, body, timeout or self._timeout)

    # ------------------------------------------------------------ streams

    async def ensure_streams(self, *, replicas: int, max_consumers: int,
                             events_days: int = EVENTS_DAYS) -> None:
        """``AGENTS``, ``DLQ`` and ``EVENTS``, created or brought up to date.

        ``max_consumers`` only ever grows (a stream refuses its 1001st consumer
        otherwise, DESIGN §4). ``AGENTS`` has no age limit (0), and one made
        with an age limit by an older version loses it: unworked mail is never
        aged out; worked mail goes by :meth:`trim`. ``events_days`` is how
        long ``EVENTS`` keeps a turn event. Retention is never changed on an
        existing stream; an age limit is."""
        await self._ensure_stream(STREAM, {
            "subjects": [SUBJECT + ">"], "retention": RETENTION, "max_consumers": max_consumers,
            "max_age": 0, "num_replicas": replicas})
        await self._ensure_stream(DLQ_STREAM, {
            "subjects": [DLQ_SUBJECT + ">"], "retention": "limits", "num_replicas": replicas,
            "max_consumers": MAX_READERS})
        await self._ensure_stream(EVENTS_STREAM, {
            "subjects": ["events.>"], "retention": "limits", "num_replicas": replicas,
            "max_consumers": MAX_READERS,
            "max_age": events_days * _DAY * _NS})

    async def _ensure_stream(self, name: str, want: dict[str, Any]) -> None:
        try:
            info = await self._api(f"STREAM.INFO.{name}")
        except _Refused as exc:
            if exc.err_code != _ERR_STREAM_NOT_FOUND:
                raise
            try:
                await self._api(f"STREAM.CREATE.{name}",
                                {"name": name, "storage": "file", "discard": "old", **want})
                log.event("mailbox_stream_created", stream=name, replicas=want["num_replicas"])
                return
            except _Refused as again:
                if again.err_code != _ERR_STREAM_NAME_IN_USE:   # another node made it meanwhile
                    raise
            info = await self._api(f"STREAM.INFO.{name}")
        config = info["config"]
        changed: dict[str, Any] = {}
        for key, value in want.items():
            have = config.get(key)
            if key == "retention":
                if have != value:
                    log.event("mailbox_stream_retention_kept", "warning", stream=name, have=have,
                              want=value)
                continue
            if key == "subjects":
                value = sorted(set(have or ()) | set(value))
                have = sorted(have or ())
            elif key == "max_consumers" and have is not None and have > 0:
                value = max(value, have)
            if have != value:
                changed[key] = value
        if changed:
            await self._api(f"STREAM.UPDATE.{name}", {**config, **changed})
            log.event("mailbox_stream_updated", stream=name, changed=changed)

    # ------------------------------------------------------------ mailboxes

    def _consumer_config(self, seat: str) -> dict[str, Any]:
        name = groups.durable(groups.MAILBOX, seat=seat)
        return {
            "name": name, "durable_name": name,
            "deliver_policy": "all", "ack_policy": "explicit", "replay_policy": "instant",
            "ack_wait": int(self.ack_wait * _NS), "max_deliver": MAX_DELIVER,
            "filter_subject": SUBJECT + seat,
            # num_replicas 0 inherits the stream's: a mailbox survives a member's loss.
            # File storage: on R3, mem_storage created consumers only 25-35 % faster (bench).
            # No inactive_threshold (a durable waits for its seat forever); the default
            # max_ack_pending, since a hand-over must never block on it.
            "num_replicas": 0,
        }

    async def _create(self, seat: str) -> bool:
        """Create *seat*'s consumer unless it exists; True if this call made it."""
        return await create_consumer(self._nc, self._api_prefix, STREAM, self._consumer_config(seat),
                                     subject=SUBJECT + seat)

    async def ensure(self, seats: Iterable[str]) -> int:
        wanted = {check_seat(s) for s in seats}
        missing = sorted(wanted - await self.existing())
        if not missing:
            return 0
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)
        failed: dict[str, str] = {}

        async def one(seat: str) -> bool:
            async with gate:
                try:
                    return await self._create(seat)
                except MailboxError as exc:
                    failed[seat] = str(exc)
                    return False

        made = sum(await asyncio.gather(*(one(s) for s in missing)))
        if failed:
            first = next(iter(sorted(failed.items())))
            raise MailboxError(f"{len(failed)} of {len(missing)} mailboxes could not be created "
                               f"(first: {first[0]}: {first[1]})")
        if made:
            log.event("mailboxes_created", count=made)
        return made

    async def existing(self) -> set[str]:
        seats: set[str] = set()
        offset = 0
        while True:
            page = await self._api(f"CONSUMER.NAMES.{STREAM}", {"offset": offset})
            names = page.get("consumers") or []
            seats.update(n[len(CONSUMER):] for n in names if n.startswith(CONSUMER))
            offset += len(names)
            if not names or offset >= page.get("total", 0):
                return seats

    def attach(self, seat: str) -> Mailbox:
        return JetStreamMailbox(self, check_seat(seat))

    async def info(self, seat: str) -> dict:
        got = await self._api(f"CONSUMER.INFO.{STREAM}.{CONSUMER}{check_seat(seat)}")
        return {"pending": got.get("num_pending", 0), "in_flight": got.get("num_ack_pending", 0),
                "redelivered": got.get("num_redelivered", 0),
                "ack_floor": (got.get("ack_floor") or {}).get("stream_seq", 0)}

    async def reset(self, seat: str) -> int:
        # nats-server ≥ 2.14 (ADR-60): the consumer's delivery state goes back
        # to its ack floor; pending deliveries and their redelivery counts go.
        got = await self._api(f"CONSUMER.RESET.{STREAM}.{CONSUMER}{check_seat(seat)}", {})
        return int(got.get("reset_seq") or 0)

    async def remove(self, seat: str) -> None:
        check_seat(seat)
        try:
            await self._api(f"CONSUMER.DELETE.{STREAM}.{CONSUMER}{seat}")
        except _Refused as exc:
            if exc.err_code != _ERR_CONSUMER_NOT_FOUND:
                raise
        await self._api(f"STREAM.PURGE.{STREAM}", {"filter": SUBJECT + seat})
        log.event("mailbox_removed", seat=seat)

    async def trim(self, seat: str, at_least: int = 1) -> int:
        info = await self.info(seat)
        floor = info["ack_floor"]
        if floor <= 0 or info["in_flight"]:
            # Not while mail is in anybody's hands (a delivery NAKed to come
            # back later included): a purge also rewrites the consumer's
            # delivery state (its pending set, its redelivery queue), and
            # mail in flight must answer to its ack or NAK alone. Worked mail
            # waits for the next sweep.
            return 0
        # Only when there is enough to drop. A purge takes the stream's lock
        # while it walks the stream's blocks and consumers (seconds on a big
        # AGENTS), where this look is one indexed read.
        subject = SUBJECT + seat
        got = await self._api(f"STREAM.INFO.{STREAM}", {"subjects_filter": subject})
        stored = int(((got.get("state") or {}).get("subjects") or {}).get(subject, 0))
        if stored - info["pending"] < max(1, at_least):
            return 0
        # Everything of this seat's subject at or below the ack floor was acked (or
        # dead-lettered): the consumer hands out a subject's messages in sequence order.
        got = await self._api(f"STREAM.PURGE.{STREAM}", {"filter": subject, "seq": floor + 1})
        return int(got.get("purged", 0))

    # ------------------------------------------------------------ sending

    async def _publish(self, subject: str, data: bytes, headers: dict[str, str]) -> Stored:
        """Publish under the ``Nats-Msg-Id`` in *headers*, resent while unanswered
        for :data:`SEND_PATIENCE` seconds; the stored message's sequence, and
        whether the stream held that id already (its duplicate flag: after a
        resend through a leader election, possibly this call's own first try)."""
        try:
            ack = await publish_until(self._js, subject, data, msg_id=headers["Nats-Msg-Id"],
                                      headers=headers, timeout=self._timeout,
                                      deadline=time.monotonic() + SEND_PATIENCE)
        except Unanswered as exc:
            raise MailboxError(f"publish to {subject} unanswered for {SEND_PATIENCE:g}s: {exc}") from exc
        except APIError as exc:
            raise MailboxError(f"publish to {subject} refused: {exc}") from exc
        return Stored(ack.seq, bool(getattr(ack, "duplicate", False)))

    async def put(self, seat: str, text_or_bytes: str | bytes, *, trigger: str | None = None,
                  headers: dict[str, str] | None = None) -> Stored:
        check_seat(seat)
        data = text_or_bytes.encode() if isinstance(text_or_bytes, str) else bytes(text_or_bytes)
        trigger = check_trigger(trigger) if trigger is not None else uuid.uuid4().hex
        hdrs = {k: v for k, v in (headers or {}).items() if not _is_control(k)}
        hdrs[TRIGGER_HEADER] = trigger
        # Deduplicated per seat: one trigger may rightly be sent to several seats.
        hdrs["Nats-Msg-Id"] = f"{seat}:{trigger}"
        return await self._publish(SUBJECT + seat, data, hdrs)

    # ------------------------------------------------------------ acking

    async def _confirmed(self, token: str, body: bytes, deadline: float | None = None) -> None:
        """Send *body* on *token* until the server confirms it: :data:`ACK_ATTEMPTS`
        times, or until the monotonic *deadline* when one is given (a resent ack
        or NAK is answered like the first, measured)."""
        attempt, pause = 0, RETRY_PAUSE
        while True:
            attempt += 1
            timeout = self._timeout if deadline is None else \
                max(0.05, min(self._timeout, deadline - time.monotonic()))
            try:
                await self._nc.request(token, body, timeout=timeout)
                return
            except NoRespondersError as exc:
                # Also what a consumer's leader election answers for a moment.
                if deadline is None:
                    raise MailboxError(f"{body[:5].decode()}: the mailbox of {token} is gone") from exc
                why = "the mailbox is gone or electing a leader"
            except NatsTimeoutError:
                why = "unanswered"
            if (attempt >= ACK_ATTEMPTS if deadline is None else time.monotonic() + pause >= deadline):
                raise MailboxError(f"{body[:5].decode()} {why} for {token}")
            if deadline is not None:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    async def ack(self, ack_token: str, deadline: float | None = None) -> None:
        await self._confirmed(ack_token, b"+ACK", deadline)

    async def _nak_quietly(self, ack_token: str) -> None:
        try:
            await self._nc.publish(ack_token, b"-NAK")
        except Exception as exc:  # the connection's trouble; the ack wait brings it back
            log.event("mailbox_nak_failed", "warning", error=f"{type(exc).__name__}: {exc}")

    async def nak(self, ack_token: str, delay: float | None = None) -> None:
        body = b"-NAK" if not delay else b"-NAK " + json.dumps({"delay": int(delay * _NS)}).encode()
        await self._confirmed(ack_token, body)

    # ------------------------------------------------------------ fetching

    async def _listen(self) -> str:
        """This process's one fetch inbox, subscribed on first use."""
        async with self._sub_lock:
            if self._inbox is None:
                inbox = self._nc.new_inbox()
                self._sub = await self._nc.subscribe(inbox + ".>", cb=self._on_msg)
                self._inbox = inbox
            return self._inbox

    async def _on_msg(self, msg: Msg) -> None:
        inbox = self._inbox or ""
        if msg.subject.startswith(inbox + "."):
            # A status reply on the fetch's own subject: <inbox>.<seat>.<request id>.
            seat, _, request = msg.subject[len(inbox) + 1:].rpartition(".")
            waiting = self._waiting.get(seat)
            if waiting and str(waiting[0]) == request and not waiting[1].done():
                waiting[1].set_result(msg)
            return
        meta = ack_meta(msg.reply)
        if meta is None or not meta.consumer.startswith(CONSUMER):
            return
        waiting = self._waiting.get(meta.consumer[len(CONSUMER):])
        if waiting and not waiting[1].done():
            waiting[1].set_result(msg)
            return
        # Its fetch gave up (timed out, cancelled): give it straight back.
        await self._nak_quietly(msg.reply)

    async def _fetch(self, seat: str, wait: float) -> Delivery | None:
        inbox = await self._listen()
        lock = self._seat_locks.setdefault(seat, asyncio.Lock())
        async with lock:  # one fetch per seat at a time: replies are matched by seat
            request = next(self._request_ids)
            answer: asyncio.Future = asyncio.get_running_loop().create_future()
            self._waiting[seat] = (request, answer)
            body = ({"batch": 1, "no_wait": True} if wait <= 0
                    else {"batch": 1, "expires": max(1, int(wait * _NS))})
            try:
                await self._nc.publish(f"{self._api_prefix}.CONSUMER.MSG.NEXT.{STREAM}.{CONSUMER}{seat}",
                                       json.dumps(body).encode(), reply=f"{inbox}.{seat}.{request}")
                try:
                    msg = await asyncio.wait_for(answer, wait + self._timeout)
                except asyncio.TimeoutError:
                    raise _Unanswered(f"fetch from {seat}'s mailbox: no answer") from None
            finally:
                if self._waiting.get(seat, (None,))[0] == request:
                    del self._waiting[seat]
        headers = _headers(msg.headers)
        if msg.subject.startswith(inbox + "."):
            status = headers.get("Status", "")
            description = headers.get("Description", "")
            if status in _NO_MESSAGE or (status == "409" and "Leadership" in description):
                return None
            if status == "503":
                raise _NoResponders(f"seat {seat} has no mailbox")
            raise MailboxError(f"fetch from {seat}'s mailbox: {status} {description}")
        meta = ack_meta(msg.reply)
        assert meta is not None
        return Delivery(seat=seat, seq=meta.stream_seq, data=msg.data, headers=headers,
                        deliveries=meta.delivered,
                        trigger=headers.get(TRIGGER_HEADER) or f"{seat}.{meta.stream_seq}",
                        ack_token=msg.reply, pending=meta.pending)

    async def close(self) -> None:
        """Stop listening for fetch replies (the connection stays the caller's)."""
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass
            self._sub, self._inbox = None, None

    # ------------------------------------------------------------ dead letters

    async def _dead_letter(self, d: Delivery, reason: str = DLQ_REASON) -> None:
        """Copy *d* to the dead letters, then TERM it and delete it from the mailbox stream.

        In that order: a crash in between leaves a copy in both, never in neither
        (and the DLQ publish is deduplicated by the stream sequence)."""
        headers = {k: v for k, v in d.headers.items() if not _is_control(k)}
        # A header value is one line; an error message may not be.
        reason = " ".join(reason.split())[:REASON_KEPT]
        headers.update({
            "Crewlet-Dlq-Reason": reason, "Crewlet-Dlq-Stream-Seq": str(d.seq),
            "Crewlet-Dlq-Deliveries": str(d.deliveries), "Crewlet-Dlq-Seat": d.seat,
            "Nats-Msg-Id": f"dlq-{d.seq}"})
        await self._publish(DLQ_SUBJECT + d.seat, d.data, headers)
        await self._confirmed(d.ack_token, b"+TERM")
        await self._delete(STREAM, d.seq)
        log.event("mailbox_dead_letter", "warning", seat=d.seat, seq=d.seq, deliveries=d.deliveries,
                  trigger=d.trigger, reason=reason)
        # Its id is the dead letter's: dead-lettering again after a crash
        # puts the same notice, sent once.
        await outbox.notice(self._js, self.notices_to, f"notice.dead-letter.{d.seq}",
                            f"crewlet: mail to seat {d.seat} was dead-lettered",
                            f"Mail {d.trigger or d.seq} to seat {d.seat} was dead-lettered after "
                            f"{d.deliveries} deliveries: {reason}\n\n"
                            f"`crewletctl dlq {d.seat}` lists it; `crewletctl dlq requeue SEQ` puts it back.\n")

    async def _delete(self, stream: str, seq: int) -> None:
        try:
            await self._api(f"STREAM.MSG.DELETE.{stream}", {"seq": seq})
        except _Refused as exc:
            if exc.err_code != _ERR_NO_MESSAGE:
                raise

    @staticmethod
    def _dead_letter_of(stored: dict[str, Any]) -> DeadLetter:
        headers = _parse_headers(stored.get("hdrs"))
        subject = stored.get("subject", "")
        seat = headers.get("Crewlet-Dlq-Seat") or subject[len(DLQ_SUBJECT):]
        own = {k: v for k, v in headers.items()
               if not k.startswith("Crewlet-Dlq-") and not _is_control(k)}
        return DeadLetter(
            seq=int(stored["seq"]), seat=seat, data=base64.b64decode(stored.get("data") or ""),
            headers=own, reason=headers.get("Crewlet-Dlq-Reason", ""),
            deliveries=int(headers.get("Crewlet-Dlq-Deliveries") or 0),
            original_seq=int(headers.get("Crewlet-Dlq-Stream-Seq") or 0),
            at=_epoch(stored.get("time")))

    async def dead_letters(self, seat: str | None = None, limit: int = 100, after: int = 0) -> list[DeadLetter]:
        subject = DLQ_SUBJECT + (check_seat(seat) if seat is not None else ">")
        out: list[DeadLetter] = []
        seq = after + 1
        while len(out) < limit:
            try:
                got = await self._api(f"STREAM.MSG.GET.{DLQ_STREAM}", {"seq": seq, "next_by_subj": subject})
            except _Refused as exc:
                if exc.err_code == _ERR_NO_MESSAGE:
                    break
                raise
            out.append(self._dead_letter_of(got["message"]))
            seq = out[-1].seq + 1
        return out

    async def requeue(self, dlq_seq: int) -> int:
        try:
            got = await self._api(f"STREAM.MSG.GET.{DLQ_STREAM}", {"seq": dlq_seq})
        except _Refused as exc:
            if exc.err_code == _ERR_NO_MESSAGE:
                raise MailboxError(f"no dead letter {dlq_seq}") from exc
            raise
        dead = self._dead_letter_of(got["message"])
        old = dead.headers.get(TRIGGER_HEADER) or f"{dead.seat}.{dead.original_seq}"
        headers = {k: v for k, v in dead.headers.items() if k != TRIGGER_HEADER}
        seq = await self.send(dead.seat, dead.data, trigger=f"{old}.requeue.{dlq_seq}", headers=headers)
        await self._delete(DLQ_STREAM, dlq_seq)
        log.event("mailbox_requeued", seat=dead.seat, dlq_seq=dlq_seq, seq=seq)
        return seq
