"""``RUNS``: a conversation run's events, one subject per run.

Every event of a run is a small JSON object on ``runs.<conversation>.<run>``
(each id a subject token: :func:`subject`), published by whoever is at that
point of the run — the driver (``run.started``, an interruption), the seat's
turn where the seat is held (the model's text, tool calls, the end). An
event's **stream sequence** is its SSE ``id``, so a client that lost its
stream resumes on any node with ``Last-Event-ID``: :func:`follow` from that
sequence yields every later event of the run once, in order, and ends after
the terminal one.

Events
------
``{"type", "run", "conversation", "at", ...}`` — ``at`` the wall-clock time
it was made; the rest by type (:data:`TYPES`):

======================  ==================================================
``run.started``         the driver has the lease: ``node`` (its node), ...
``message.delta``       the model's text: ``round`` (the provider call of
                        the turn, from 1), ``text``; ``restart: true`` —
                        first drop what this round showed so far (the
                        provider's attempt failed mid-stream and is tried
                        again), then append ``text`` (:mod:`.sink`)
``tool.call``           ``round``, ``call`` (its id), ``name``, ``args``
``tool.result``         ``round``, ``call``, ``name``, ``result``, ``error``
``approval.requested``  the approval's id, tool and arguments
``run.completed``       the end: exactly one of these three, the last event
``run.failed``          of the run (:data:`TERMINAL`)
``run.interrupted``
======================  ==================================================

A request to stop a run (``POST .../cancel``, the ``interrupt`` and
``rollback`` strategies) is not an event: it is kept one token further,
``runs.<conversation>.<run>.cancel`` (:func:`request_cancel`), where the
turn looks before each round and a follower of the run never sees it.

An event is at most :data:`EVENT_MAX` bytes: a longer one has its longest
fields cut (``truncated: true``); what a tool returned in full, or a call's
exact arguments, live in the estate (the conversation's messages, the
approval), not here.

Publishing (:class:`RunEvents`)
-------------------------------
One publisher per run per process: its events are stored in the order it
was given them (one in flight at a time, each acknowledged before the
next), and each is sent again through a stream leader election under one
``Nats-Msg-Id`` (:func:`crewlet.bus.publish_until`), so an event lands once.
A caller with an id of its own for an event (one a retried turn would send
again) passes it; the terminal events share the id ``<run>:end``, so within
the broker's duplicate window a run ends once whoever ends it (a driver's
interruption racing the turn's completion: the second is answered with the
first one's sequence and not stored).

Retention: each event carries a per-message TTL (``Nats-TTL``) of
``conversations.retention + conversations.max_run`` (Tier A: 1 h + 15 min
by default), so every event of a run that lasted at most ``max_run`` is
kept at least ``retention`` after the run's end — what the issue's "1 h
after the run ends" asks, without knowing when a run will end when its
first event is written. Chosen over the stream's ``max_age`` because the
publisher's own node decides it: no stream config for nodes to disagree
on, and a changed retention applies to the next event without touching
the stream. The stream itself is bounded by count
(``conversations.max_events``, oldest dropped first: a fleet running more
than that in a retention sees its oldest events go early — the horizon
shrinks rather than the disk filling) and by event size; not by bytes,
whose limit the broker reserves from its store when the stream is made
(crewlet/outbox.py). The count is set when the stream is made and only ever
raised by a node asking for more, so nodes configured differently do not
undo each other.

Following (:func:`follow`)
--------------------------
An ordered consumer (ephemeral, memory, one replica, flow-controlled)
filtered on the run's subject, from ``after_seq + 1``. nats-py re-creates it
from the last sequence it delivered after two missed heartbeats (a leader
change, a reconnect), and the follower drops anything at or below the last
sequence it yielded, so the order and the once hold across that. A
follower's consumer is deleted when it ends — at the read after the
terminal event, or when closed (leave its ``async with``) — and one whose process died goes
:data:`FOLLOW_INACTIVE` seconds later: nothing a reader leaves behind grows
with time (DESIGN §4, issue 10). The stream admits :data:`MAX_FOLLOWERS`
consumers: one per live stream of a run, fleet-wide.

A follower waits for as long as its run gives it nothing: a run nobody
drives any more, or whose events aged out, keeps it waiting. :func:`last`
says whether a run's latest event is terminal (or none is left); the
caller bounds the wait (the SSE route: its heartbeats, the run's status in
the estate).

The ordered consumer reads the stream sequence from its ack subject in the
plain form; a leaf's domain form is not read by nats-py 2.16. Followers run
in ``ingress``, which a data node (a cluster member) runs, never a leaf.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import uuid
from typing import Any, Mapping

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import (ConsumerConfig, DeliverPolicy, DiscardPolicy, RetentionPolicy,
                         StorageType, StreamConfig)
from nats.js.errors import APIError, NotFoundError

from crewlet import bus, log
from crewlet.bus import Unanswered, publish_until
from crewlet.coord.buckets import drop_consumer, limit_consumers
from crewlet.estate.ops import ROW_ID

STREAM = "RUNS"
SUBJECT = "runs."                  # + conversation token + "." + run token
CANCEL_TOKEN = ".cancel"           # + after a run's subject: the request to stop it

STARTED = "run.started"
DELTA = "message.delta"
TOOL_CALL = "tool.call"
TOOL_RESULT = "tool.result"
APPROVAL_REQUESTED = "approval.requested"
COMPLETED = "run.completed"
FAILED = "run.failed"
INTERRUPTED = "run.interrupted"
TERMINAL = frozenset((COMPLETED, FAILED, INTERRUPTED))
TYPES = (STARTED, DELTA, TOOL_CALL, TOOL_RESULT, APPROVAL_REQUESTED, COMPLETED, FAILED, INTERRUPTED)
# The fields every event has, set by the publisher.
ENVELOPE = ("type", "run", "conversation", "at")

# Bytes of one event: a screenful of text or a tool's answer at a glance;
# the whole of either is in the estate. The stream's max_msg_size is this
# and room for the headers (the event's id and TTL), which count too.
EVENT_MAX = 32 * 1024
HEADERS_MAX = 1024
ID_MAX = 512  # characters of an event id of the caller's
# Consumers the stream admits: one per live follower, fleet-wide, plus those
# of killed readers for FOLLOW_INACTIVE seconds. Set deliberately: at -1 the
# stream would refuse its 1,001st all the same (DESIGN §4).
MAX_FOLLOWERS = 10_000
# Seconds the broker remembers an event id: a resend after an unanswered
# publish (a leader election stalls ~6 s) lands once.
DUPLICATE_WINDOW = 120.0
# Seconds an event is resent while unanswered before the publisher says so.
PUBLISH_PATIENCE = 10.0
# A follower's idle heartbeat: nats-py re-creates its consumer after two
# missed ones (~4 s after a leader change); one small message per idle
# follower every 2 s.
FOLLOW_HEARTBEAT = 2.0
# Seconds a follower's consumer outlives its reader's interest (a killed
# process): as a KV watch's (crewlet.coord.buckets.WATCH_INACTIVE).
FOLLOW_INACTIVE = 10.0
# Seconds a follower's read waits before it looks whether it was closed
# (Python 3.11's wait_for may swallow a cancel, DESIGN §4).
FOLLOW_POLL = 1.0
# Seconds closing a follower waits for its consumer's deletion.
CLOSE_WAIT = 0.5

_ROW_ID = re.compile(ROW_ID)
_CUT = " …"  # what ends a cut field


class RunsError(Exception):
    """An event could not be stored, or the stream could not be read."""


def token(row_id: str) -> str:
    """*row_id* (an estate row id) as one subject token: '.' (allowed in a row
    id, a token separator in a subject) becomes '~' (not allowed in one), so
    two runs never share a subject."""
    if not _ROW_ID.match(row_id):
        raise ValueError(f"not a conversation or run id: {row_id!r}")
    return row_id.replace(".", "~")


def subject(conversation: str, run: str) -> str:
    """The subject of *run*'s events."""
    return f"{SUBJECT}{token(conversation)}.{token(run)}"


def cancel_subject(conversation: str, run: str) -> str:
    """Where a request to stop *run* is kept (one token past the run's events'
    subject, so a follower of the run never sees it)."""
    return subject(conversation, run) + CANCEL_TOKEN


async def request_cancel(js: JetStreamContext, conversation: str, run: str, *, ttl: float,
                         by: str, why: str = "cancelled") -> int:
    """Ask *run* to stop before its next round: idempotent (one id per run:
    asked twice, kept once, the first asker's reason standing), from any
    node. The turn working the run reads it (:func:`cancel_requested`)
    before each round and when it starts."""
    data = _dumps({"run": run, "conversation": conversation, "by": by, "why": why, "at": time.time()})
    try:
        ack = await publish_until(js, cancel_subject(conversation, run), data, msg_id=f"{run}:cancel",
                                  deadline=time.monotonic() + PUBLISH_PATIENCE, msg_ttl=ttl)
    except (APIError, Unanswered) as exc:
        raise RunsError(f"cancelling run {run}: {exc}") from exc
    return ack.seq


async def cancel_requested(js: JetStreamContext, conversation: str, run: str) -> dict[str, Any] | None:
    """The request to stop *run* (who, why), or None if nobody asked."""
    try:
        msg = await js.get_msg(STREAM, subject=cancel_subject(conversation, run))
    except NotFoundError:
        return None
    try:
        asked = json.loads(msg.data or b"{}")
    except ValueError:
        asked = {}
    return asked if isinstance(asked, dict) else {}


def event_ttl(retention: float, max_run: float) -> float:
    """Seconds each event is kept: a run no longer than *max_run* keeps its
    first event *retention* past its last."""
    return float(retention + max_run)


# ---------------------------------------------------------------- the stream

def stream_config(replicas: int, max_events: int) -> StreamConfig:
    return StreamConfig(
        name=STREAM, subjects=[SUBJECT + ">"], retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, num_replicas=replicas, max_msgs=max_events,
        max_msg_size=EVENT_MAX + HEADERS_MAX, discard=DiscardPolicy.OLD, duplicate_window=DUPLICATE_WINDOW,
        max_consumers=MAX_FOLLOWERS, allow_msg_ttl=True)


async def ensure_stream(js: JetStreamContext, replicas: int, max_events: int) -> None:
    """``RUNS`` exists, with *replicas* replicas and room for *max_events*
    events (``conversations.max_events``) if this call makes it. An existing
    one is left as it is but for per-message TTLs (without them every publish
    is refused), a count limit below *max_events* (raised), and its consumer
    limit where it has none."""
    if await bus.ensure_stream(js, stream_config(replicas, max_events)):
        log.event("runs_stream_created", replicas=replicas, max_events=max_events)
        return
    info = await js.stream_info(STREAM)
    config, changed = info.config, {}
    if not config.allow_msg_ttl:
        config.allow_msg_ttl = changed["allow_msg_ttl"] = True
    if config.max_msgs is not None and 0 < config.max_msgs < max_events:
        config.max_msgs = changed["max_events"] = max_events
    if changed:
        await js.update_stream(config)
        log.event("runs_stream_updated", **changed)
    await limit_consumers(js, STREAM, MAX_FOLLOWERS, info)


# ---------------------------------------------------------------- events

def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def encode(event: Mapping[str, Any], limit: int = EVENT_MAX) -> bytes:
    """*event* as JSON of at most *limit* bytes: the longest fields outside
    the envelope cut (a structure first made its JSON text) until it fits,
    and ``truncated: true`` said."""
    data = _dumps(event)
    if len(data) <= limit:
        return data
    event = {**event, "truncated": True}
    while True:
        data = _dumps(event)
        over = len(data) - limit
        if over <= 0:
            return data
        fields = [k for k, v in event.items()
                  if k not in ENVELOPE and isinstance(v, (str, list, dict)) and v]
        if not fields:
            raise ValueError(f"an event of type {event.get('type')} does not fit {limit} bytes")
        longest = max(fields, key=lambda k: len(_dumps(event[k])))
        value = event[longest]
        if not isinstance(value, str):
            event[longest] = _dumps(value).decode()  # cut as text on the next pass
            continue
        # Cut in proportion to the bytes to lose (a character takes 1 to 6 as
        # JSON): exact for text of one kind, and each pass cuts some more.
        size = len(_dumps(value))
        keep = int(len(value) * max(0, size - over - len(_CUT.encode())) / size)
        event[longest] = value[:keep] + _CUT if keep else ""


def decode(data: bytes) -> dict[str, Any] | None:
    """An event read back; None if *data* is not one."""
    try:
        event = json.loads(data)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("type"), str) else None


class RunEvents:
    """Publishes one run's events, in order, each landing once.

    *ttl*: seconds each event is kept (:func:`event_ttl` of the node's
    ``conversations`` section). ``last_seq`` is the sequence of the last event
    this publisher stored (0: none yet); ``duplicate`` says whether the last
    publish was answered as a repeat (its id had landed already: a resend,
    or another publisher's terminal event ended the run first).
    """

    def __init__(self, js: JetStreamContext, conversation: str, run: str, *, ttl: float,
                 patience: float = PUBLISH_PATIENCE):
        if ttl < 1:
            raise ValueError("an event's TTL must be at least 1 s (the server's granularity)")
        self.js = js
        self.conversation = conversation
        self.run = run
        self.subject = subject(conversation, run)
        self.ttl = ttl
        self.patience = patience
        self.last_seq = 0
        self.duplicate = False
        self._lock = asyncio.Lock()
        # Ids of this publisher's events: unique to it, so two publishers of a
        # run (the driver, the turn) never collide inside the dedupe window.
        self._prefix = f"{run}:{uuid.uuid4().hex[:12]}:"
        self._numbers = itertools.count(1)

    def event_id(self, type_: str) -> str:
        """A fresh id for an event of *type_* (the terminal ones share one)."""
        if type_ in TERMINAL:
            return f"{self.run}:end"
        return f"{self._prefix}{next(self._numbers)}"

    async def publish(self, event: Mapping[str, Any], *, id: str | None = None) -> int:
        """Store *event* (``type`` and its fields; the envelope is filled in):
        its stream sequence — the SSE id. *id*: its ``Nats-Msg-Id``, for an
        event whoever sends it again must land once; by default a fresh one
        (:meth:`event_id`).

        Raises :class:`RunsError` when it was refused, or went unanswered
        for :attr:`patience` seconds (it may or may not be stored; sent again
        under the same *id*, it lands once).
        """
        type_ = event.get("type")
        if type_ not in TYPES:
            raise ValueError(f"not a run event type: {type_!r} (one of {', '.join(TYPES)})")
        body = {"type": type_, "run": self.run, "conversation": self.conversation,
                "at": event.get("at") or time.time()}
        body.update((k, v) for k, v in event.items() if k not in body)
        data = encode(body)
        if id is not None and not 0 < len(id) <= ID_MAX:
            raise ValueError(f"an event id is 1 to {ID_MAX} characters, got {len(id)}")
        msg_id = id or self.event_id(type_)
        async with self._lock:
            try:
                ack = await publish_until(self.js, self.subject, data, msg_id=msg_id,
                                          deadline=time.monotonic() + self.patience, msg_ttl=self.ttl)
            except (APIError, Unanswered) as exc:
                raise RunsError(f"{type_} of run {self.run}: {exc}") from exc
            self.last_seq = max(self.last_seq, ack.seq)
            self.duplicate = bool(ack.duplicate)
            return ack.seq


# ---------------------------------------------------------------- reading

async def last(js: JetStreamContext, conversation: str, run: str) -> tuple[int, dict[str, Any]] | None:
    """*run*'s latest stored event and its sequence; None if it has none
    (never published, or aged out). A terminal one says the run is over."""
    try:
        msg = await js.get_msg(STREAM, subject=subject(conversation, run))
    except NotFoundError:
        return None
    event = decode(msg.data or b"")
    return None if event is None else (msg.seq, event)


def follow(js: JetStreamContext, conversation: str, run: str, *, after_seq: int = 0) -> "Follower":
    """The events of *run* stored after *after_seq* (0: all of them), as they
    come: ``async with follow(...) as events: async for seq, event in events``.
    Ends after the terminal event."""
    return Follower(js, conversation, run, after_seq)


class Follower:
    """One reader of one run's events; see :func:`follow`.

    Invariants: ``after`` is the sequence of the last event yielded (or the
    start given); ``_sub`` is the open subscription, None before it is opened
    and once closed; a closed follower yields nothing more.
    """

    def __init__(self, js: JetStreamContext, conversation: str, run: str, after_seq: int):
        if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0:
            raise ValueError(f"after_seq must be a sequence (an int >= 0), got {after_seq!r}")
        self.js = js
        self.conversation = conversation
        self.run = run
        self.subject = subject(conversation, run)
        self.after = after_seq
        self.ended = False  # the terminal event was yielded
        self._sub: Any = None
        self._closed = False

    @property
    def consumer(self) -> str | None:
        """The name of this follower's consumer now (None: none open)."""
        return None if self._sub is None else self._sub._consumer

    async def open(self) -> "Follower":
        """Create the consumer (done by the first read otherwise): a missing
        stream or a refusal shows here, before anything was sent on."""
        if self._sub is None and not self._closed:
            try:
                self._sub = await self.js.subscribe(
                    self.subject, stream=STREAM, ordered_consumer=True,
                    idle_heartbeat=FOLLOW_HEARTBEAT, inactive_threshold=FOLLOW_INACTIVE,
                    config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                          opt_start_seq=self.after + 1))
            except Exception as exc:
                raise RunsError(f"following run {self.run}: {type(exc).__name__}: {exc}") from exc
        return self

    async def close(self) -> None:
        """Stop reading and delete the consumer now (best effort: one left
        behind goes by itself after :data:`FOLLOW_INACTIVE`). Idempotent."""
        self._closed = True
        sub, self._sub = self._sub, None
        if sub is None:
            return
        try:
            await sub.unsubscribe()
        except Exception:
            pass  # the connection's trouble
        await drop_consumer(sub, CLOSE_WAIT)

    async def __aenter__(self) -> "Follower":
        return await self.open()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __aiter__(self) -> "Follower":
        return self

    async def __anext__(self) -> tuple[int, dict[str, Any]]:
        if self.ended or self._closed:
            # Past the terminal event: its consumer goes now, after the event
            # reached the reader (deleting it first cost the end a round trip).
            await self.close()
            raise StopAsyncIteration
        await self.open()
        while True:
            sub = self._sub
            if sub is None:  # closed while we waited
                raise StopAsyncIteration
            try:
                msg = await sub.next_msg(timeout=FOLLOW_POLL)
            except nats.errors.TimeoutError:
                _cancel_swallowed()
                continue
            except asyncio.CancelledError:
                # close() from another task cancels the read it waits in.
                if self._closed and not _cancelling():
                    raise StopAsyncIteration from None
                raise
            except nats.errors.Error as exc:
                if self._closed:
                    raise StopAsyncIteration from None
                raise RunsError(f"following run {self.run}: {type(exc).__name__}: {exc}") from exc
            _cancel_swallowed()
            seq = msg.metadata.sequence.stream
            if seq <= self.after:
                continue  # delivered again by a re-created consumer
            self.after = seq
            event = decode(msg.data)
            if event is None:
                log.event("runs_event_unreadable", "warning", run=self.run, seq=seq)
                continue
            if event["type"] in TERMINAL:
                self.ended = True  # the next read closes it (or the reader's close)
            return seq, event


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _cancel_swallowed() -> None:
    """Raise the cancel nats-py's read may have swallowed (Python 3.11's
    wait_for, DESIGN §4): a reader whose client left must stop."""
    if _cancelling():
        raise asyncio.CancelledError
