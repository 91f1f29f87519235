"""The estate's log: the ``ESTATE`` stream, and publishing an op to it.

One stream, one subject (``estate.ops``), every op of the company in the
order the broker stored them. Its sequence is the op's **seq**: what apply
derives ids from (``T<seq>``), what a copy's ``applied`` counts, what a
caller's floor names.

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
it exactly as it is: every data node calls it at every start, and a node
configured with another ``stream.replicas`` must not move the fleet's log
(changing replicas is an operator's decision, made on the stream itself).

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
from crewlet.estate.ops import Op

STREAM = "ESTATE"
SUBJECT = "estate.ops"
# Seconds the broker remembers an op id. Two minutes covers a writer's whole
# retry (a write waits at most 60 s on one data node) with room for a second
# node asked under the same id; past it, the appliers' op table still makes a
# late resend a no-op (it lands in the log again, but changes nothing).
DUPLICATE_WINDOW = 120.0
MSG_ID = "Nats-Msg-Id"

_ERR_STREAM_NAME_IN_USE = 10058


def stream_config(replicas: int) -> StreamConfig:
    return StreamConfig(name=STREAM, subjects=[SUBJECT], retention=RetentionPolicy.LIMITS,
                        storage=StorageType.FILE, num_replicas=replicas,
                        duplicate_window=DUPLICATE_WINDOW, max_consumers=MAX_READERS)


async def ensure_stream(js: JetStreamContext, replicas: int) -> StreamInfo:
    """The ``ESTATE`` stream's info, creating the stream if it does not exist.

    An existing stream is never re-created nor updated (its replicas stay
    what they are), but for a consumer limit where it has none. Raises what JetStream raised when it did not answer.
    """
    try:
        info = await js.stream_info(STREAM)
        # The one change made to a stream that exists: a consumer limit where
        # it has none (a log made before crewlet set one).
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
    """
    if deadline is not None:
        ack = await publish_until(js, SUBJECT, op.encode(), msg_id=op.msg_id, deadline=deadline,
                                  timeout=timeout, stream=STREAM)
    else:
        ack = await js.publish(SUBJECT, op.encode(), timeout=timeout, stream=STREAM,
                               headers={MSG_ID: op.msg_id})
    return ack.seq, bool(ack.duplicate)
