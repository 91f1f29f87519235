"""The estate's log: the ``ESTATE`` stream, and publishing an op to it.

One stream, every op of the company in the order the broker stored them.
Its sequence is the op's **seq**: what apply derives ids from (``T<seq>``),
what a copy's ``applied`` counts, what a caller's floor names.

Its subjects name who published an op (:mod:`crewlet.estate.origins`):
``estate.ops`` (:data:`SUBJECT`) the appliers' and the operator's, every
kind; ``estate.ops.seats.<node>`` (:func:`seats_subject`) the seats role of
``<node>``, which publishes there a seat's fence and its turn records
straight. :func:`publish` picks the subject from the connection's broker
user; every applier reads both (:data:`SUBJECTS`) and refuses an op that does
not fit the subject it is on.

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

:func:`publish` makes **one** attempt. Whether a publish that went
unanswered may be sent again is the op kind's rule (``move_on`` or ``once``,
:mod:`crewlet.estate.ops`), so the caller decides; a resend under the same id
inside the window lands once either way.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig, StreamInfo
from nats.js.errors import BadRequestError, NotFoundError

from crewlet import log
from crewlet.bus import MAX_READERS, publish_until
from crewlet.coord.buckets import limit_consumers
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

_ERR_STREAM_NAME_IN_USE = 10058


def seats_subject(node: str) -> str:
    """The subject the seats role of node *node* publishes its ops on."""
    return SEATS_PREFIX + node


def subject_for(origin: str, node: str) -> str:
    """The log subject an op from *origin* (:mod:`crewlet.estate.origins`)
    issued by node *node* is published on."""
    return seats_subject(node) if origin == origins.SEATS else SUBJECT


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
    are; it gets the subjects of :data:`SUBJECTS` it lacks (a log made
    before the seats' subject) and a consumer limit where it has none.
    Raises what JetStream raised when it did not answer.
    """
    try:
        info = await js.stream_info(STREAM)
        # The changes made to a stream that exists: its subjects (an older
        # log's) and a consumer limit where it has none (a log made before
        # crewlet set one).
        info = await _add_subjects(js, info)
        await limit_consumers(js, STREAM, MAX_READERS, info)
        return info
    except NotFoundError:
        pass
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


async def _add_subjects(js: JetStreamContext, info: StreamInfo) -> StreamInfo:
    """*info*'s stream given the subjects of :data:`SUBJECTS` it lacks (the
    others it has are left)."""
    have = list(info.config.subjects or [])
    missing = [s for s in SUBJECTS if s not in have]
    if not missing:
        return info
    info.config.subjects = have + missing
    info = await js.update_stream(info.config)
    log.event("estate_log_subjects", stream=STREAM, subjects=info.config.subjects)
    return info


async def bounds(js: JetStreamContext) -> tuple[int, int]:
    """The log's first and last sequence now (``first == last + 1``: empty)."""
    info = await js.stream_info(STREAM)
    return info.state.first_seq, info.state.last_seq


async def publish(js: JetStreamContext, op: Op, *, timeout: float,
                  deadline: float | None = None) -> tuple[int, bool]:
    """Publish *op* once, under :attr:`Op.msg_id <crewlet.estate.ops.Op.msg_id>`
    as ``Nats-Msg-Id``: ``(seq, duplicate)``.

    ``duplicate`` is the broker saying the id was already in the log within
    the window; ``seq`` is then the first one's. Raises what nats-py raises:
    ``NoStreamResponseError`` (no stream listens: nothing was stored),
    ``nats.errors.TimeoutError`` (unanswered: it may have been stored),
    ``APIError`` (refused).

    With a monotonic *deadline*, an unanswered publish is sent again under
    the same id until then (:func:`crewlet.bus.publish_until`; it raises
    ``Unanswered``): only for an op whose kind may be sent twice.

    The subject is the origin's (:func:`subject_for`): the broker user *js*'s
    connection is (:func:`crewlet.estate.origins.of_connection`), and the
    op's node — the seats role publishes on its node's seats subject, which
    its broker user alone may.
    """
    subject = subject_for(origins.of_connection(getattr(js, "_nc", None)), op.node)
    if deadline is not None:
        ack = await publish_until(js, subject, op.encode(), msg_id=op.msg_id, deadline=deadline,
                                  timeout=timeout, stream=STREAM)
    else:
        ack = await js.publish(subject, op.encode(), timeout=timeout, stream=STREAM,
                               headers={MSG_ID: op.msg_id})
    return ack.seq, bool(ack.duplicate)
