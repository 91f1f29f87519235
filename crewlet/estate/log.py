"""The estate's log: the ``ESTATE`` stream, and publishing an op to it.

One stream, every op of the company in the order the broker stored them.
Its sequence is the op's **seq**: what apply derives ids from (``T<seq>``),
what a copy's ``applied`` counts, what a caller's floor names.

Its subjects name who published an op (:mod:`crewlet.estate.origins`):
``estate.ops`` (:data:`SUBJECT`) the appliers' and the operator's, every
kind; ``estate.ops.seats.<node>`` (:func:`seats_subject`) the seats role of
``<node>``, which publishes there a seat's fence and its turn records
straight. The caller of :func:`publish` names the subject: the operator's
is the default, which no role's broker user may publish on (a role that
forgets to name its own is refused by the broker, never taken for the
operator). Every applier reads every subject the stream has and refuses an
op that does not fit the subject it is on.

The seats' subject is read only by appliers of protocol
:data:`SEATS_READ_SINCE` and later; an older applier follows ``estate.ops``
alone and takes each seats entry for a gap (it starts its follow again, and
its copy misses the entry). So a seats process publishes there only while
every live data node's presence says a protocol that reads it
(:func:`reads_seats`); until then it asks an applier of this version to
publish the op on ``estate.ops`` for it
(:meth:`crewlet.estate.router.Router.to_log`).

The stream:

==================  ===========================================================
retention           limits: the log is kept until a duty trims it (appliers
                    are readers, not consumers that remove what they read)
storage             file
replicas            ``stream.replicas`` (the fleet's quorum arithmetic)
duplicate window    :data:`DUPLICATE_WINDOW`: an op resent under the same
                    ``Nats-Msg-Id`` within it is not stored twice, and the
                    broker's answer names the first one's seq
==================  ===========================================================

:func:`ensure_stream` makes the stream if it is missing and otherwise leaves
it as it is but for its subjects (a log made before the seats' subject gets
it) and a consumer limit where it has none: every data node calls it at
every start, and a node configured with another ``stream.replicas`` must not
move the fleet's log (changing replicas is an operator's decision, made on
the stream itself).

Those two changes are asked for, not required. An external broker's
account may lack ``STREAM.UPDATE`` (the broker then leaves the request
unanswered); the stream is then taken as it is, said once (per log, per process)
(``estate_log_unchanged``, warning: ops published on a subject it lacks are
not captured until an operator updates it), and asked again at most every
:data:`UPDATE_AGAIN_AFTER` seconds. An applier follows the subjects the
stream has (:func:`followed`), so a log it cannot change is followed all the
same; once an operator adds the seats' subject, its first entry there is a
gap to that follow (seen at the next entry, or as a stall), which then
starts again on the subjects the stream has by then.

:func:`publish` makes **one** attempt. Whether a publish that went
unanswered may be sent again is the op kind's rule (``move_on`` or ``once``,
:mod:`crewlet.estate.ops`), so the caller decides; a resend under the same id
inside the window lands once either way.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig, StreamInfo
from nats.js.errors import BadRequestError, NotFoundError

from crewlet import log
from crewlet.bus import MAX_READERS, publish_until
from crewlet.estate import origins
from crewlet.estate.ops import Op

STREAM = "ESTATE"
# The appliers' and the operator's subject: every kind (an applier publishes
# only what it checked); also every op an older node's seats published.
SUBJECT = "estate.ops"
# The seats role of one node: ``estate.ops.seats.<node>`` (seats_subject).
SEATS_PREFIX = SUBJECT + "." + origins.SEATS + "."
SUBJECTS = [SUBJECT, SEATS_PREFIX + "*"]
# Seconds the broker remembers an op id. Two minutes covers a writer's whole
# retry (a write waits at most 60 s on one data node) with room for a second
# node asked under the same id; past it, the appliers' op table still makes a
# late resend a no-op (it lands in the log again, but changes nothing).
DUPLICATE_WINDOW = 120.0
MSG_ID = "Nats-Msg-Id"

# The first protocol version (crewlet.PROTOCOL_VERSION, in each node's
# presence) whose appliers read the seats' subjects; an older one follows
# estate.ops alone.
SEATS_READ_SINCE = 2
# The first protocol version whose appliers apply ``turn.records`` (many
# turns' records in one op); an older one refused the kind.
RECORDS_READ_SINCE = 3
# The first protocol version whose appliers apply the seats' own writes
# (crewlet.estate.origins.SEAT_WRITES: their tools', their conversation
# turns') found on the seats' subject; an older one passed them over.
WRITES_READ_SINCE = 4
# Seconds before a process asks again for a change to the stream the broker
# refused or left unanswered (each try may cost a JetStream timeout).
UPDATE_AGAIN_AFTER = 60.0

_ERR_STREAM_NAME_IN_USE = 10058

# This process's refused changes, by log (name and creation time): when last
# asked (monotonic). A log's first refusal is said; the others are not.
_unchanged: dict[tuple[str, str], float] = {}


def seats_subject(node: str) -> str:
    """The subject the seats role of node *node* publishes its ops on."""
    return SEATS_PREFIX + node


def reads_seats(protocol: Any) -> bool:
    """Whether an applier of *protocol* (a node's presence says it; None: a
    node older than saying it) reads the seats' subjects."""
    return isinstance(protocol, int) and not isinstance(protocol, bool) \
        and protocol >= SEATS_READ_SINCE


def reads_records(protocol: Any) -> bool:
    """Whether an applier of *protocol* applies ``turn.records`` ops."""
    return reads_seats(protocol) and protocol >= RECORDS_READ_SINCE


def reads_writes(protocol: Any) -> bool:
    """Whether an applier of *protocol* applies the seats' own writes found on
    their subject (:data:`WRITES_READ_SINCE`)."""
    return reads_seats(protocol) and protocol >= WRITES_READ_SINCE


def origin_of(subject: str | None) -> tuple[str, str | None] | None:
    """``(origin, node)`` of an entry found on log subject *subject*: the
    operator's for :data:`SUBJECT` (and for None: an entry whose subject is
    not known, as a test's), ``("seats", node)`` for a seats subject; None for
    a subject that is neither (refused)."""
    if subject is None or subject == SUBJECT:
        return origins.OPERATOR, None
    if subject.startswith(SEATS_PREFIX):
        node = subject[len(SEATS_PREFIX):]
        if node and "." not in node:
            return origins.SEATS, node
    return None


def stream_config(replicas: int) -> StreamConfig:
    return StreamConfig(name=STREAM, subjects=list(SUBJECTS), retention=RetentionPolicy.LIMITS,
                        storage=StorageType.FILE, num_replicas=replicas,
                        duplicate_window=DUPLICATE_WINDOW, max_consumers=MAX_READERS)


async def ensure_stream(js: JetStreamContext, replicas: int) -> StreamInfo:
    """The ``ESTATE`` stream's info, creating the stream if it does not exist.

    An existing stream is never re-created, and its replicas stay what they
    are; it is asked for the subjects of :data:`SUBJECTS` it lacks (a log
    made before the seats' subject) and a consumer limit where it has none,
    and taken as it is when that is refused (module doc). Raises what
    JetStream raised when the stream could not be read or made.
    """
    try:
        info = await js.stream_info(STREAM)
    except NotFoundError:
        pass
    else:
        return await _update(js, info)
    try:
        info = await js.add_stream(stream_config(replicas))
        log.event("estate_log_created", stream=STREAM, replicas=replicas)
        return info
    except BadRequestError as exc:
        # Another data node made it meanwhile (with its own idea of the
        # config): theirs stands.
        if exc.err_code != _ERR_STREAM_NAME_IN_USE:
            raise
    return await js.stream_info(STREAM)


async def _update(js: JetStreamContext, info: StreamInfo) -> StreamInfo:
    """*info*'s stream given the subjects of :data:`SUBJECTS` it lacks (an
    older log's; the others it has are left) and a consumer limit where it
    has none (a log made before crewlet set one) — or *info* as it is when
    the broker refuses the change or leaves it unanswered (module doc)."""
    have = list(info.config.subjects or [])
    missing = [s for s in SUBJECTS if s not in have]
    unlimited = info.config.max_consumers in (None, -1, 0)
    if not missing and not unlimited:
        return info
    log_id = (STREAM, info.created.isoformat() if info.created is not None else "")
    asked = _unchanged.get(log_id)
    if asked is not None and time.monotonic() - asked < UPDATE_AGAIN_AFTER:
        return info
    # A copy: a refused change must not show in the info handed back.
    config = dataclasses.replace(info.config, subjects=have + missing,
                                 max_consumers=MAX_READERS if unlimited else info.config.max_consumers)
    try:
        updated = await js.update_stream(config)
    except nats.errors.Error as exc:
        # A permissions violation is unanswered (a timeout); an APIError is
        # a refusal in words (another stream holds the subject, say).
        if asked is None:
            log.event("estate_log_unchanged", "warning", stream=STREAM, subjects=have,
                      missing=missing, error=f"{type(exc).__name__}: {exc}",
                      why=("ops published on " + ", ".join(missing) + " are not captured by the log "
                           "until an operator adds them to its subjects; the log is followed on the "
                           "subjects it has") if missing else
                          f"the log keeps no consumer limit (an operator may set {MAX_READERS})")
        _unchanged[log_id] = time.monotonic()
        return info
    _unchanged.pop(log_id, None)
    if missing:
        log.event("estate_log_subjects", stream=STREAM, subjects=updated.config.subjects)
    if unlimited:
        log.event("stream_consumers_limited", "debug", stream=STREAM, max_consumers=MAX_READERS)
    return updated


def followed(info: StreamInfo) -> list[str]:
    """The subjects an applier follows the log on: every subject the stream
    has (whatever it is: an entry on a subject that is no origin's is
    refused, not skipped — a skipped one would be a gap to the follow), or
    :data:`SUBJECTS` when its info names none."""
    return list(info.config.subjects or SUBJECTS)


async def bounds(js: JetStreamContext) -> tuple[int, int]:
    """The log's first and last sequence now (``first == last + 1``: empty)."""
    info = await js.stream_info(STREAM)
    return info.state.first_seq, info.state.last_seq


async def publish(js: JetStreamContext, op: Op, *, timeout: float, subject: str = SUBJECT,
                  deadline: float | None = None) -> tuple[int, bool]:
    """Publish *op* once on *subject*, under :attr:`Op.msg_id
    <crewlet.estate.ops.Op.msg_id>` as ``Nats-Msg-Id``: ``(seq, duplicate)``.

    *subject* is the publisher's own (module doc): :data:`SUBJECT`, the
    default, the operator's and the appliers'; :func:`seats_subject` of its
    node for a seats process (:meth:`crewlet.estate.router.Router.to_log`
    chooses). Nothing here guesses it: a role's broker user refuses a
    subject that is not its own.

    ``duplicate`` is the broker saying the id was already in the log within
    the window; ``seq`` is then the first one's. Raises what nats-py raises:
    ``NoStreamResponseError`` (no stream listens: nothing was stored),
    ``nats.errors.TimeoutError`` (unanswered: it may have been stored),
    ``APIError`` (refused).

    With a monotonic *deadline*, an unanswered publish is sent again under
    the same id until then (:func:`crewlet.bus.publish_until`; it raises
    ``Unanswered``): only for an op whose kind may be sent twice.
    """
    if deadline is not None:
        ack = await publish_until(js, subject, op.encode(), msg_id=op.msg_id, deadline=deadline,
                                  timeout=timeout, stream=STREAM)
    else:
        ack = await js.publish(subject, op.encode(), timeout=timeout, stream=STREAM,
                               headers={MSG_ID: op.msg_id})
    return ack.seq, bool(ack.duplicate)
