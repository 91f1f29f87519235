"""The one NATS connection a process holds (DESIGN §4).

KV and streams ride the same connection on purpose: two connections to one
broker fail independently, and a node alive on one and deaf on the other is
the worst state to be in. Every state change of the connection is logged.

nats-py (2.16) gives every ordered consumer — each KV watch, the applier's
log reader, a run's events — a task that wakes every 0.25 s to see whether a
flow-control reply is due: four wakeups a second per watch, ~20 in every
process of a node, idle or not. Importing this module makes that task sleep
until the broker asks for flow control, and poll only until it is answered
(:func:`_flow_control_on_demand`): the replies go out exactly as before.

:func:`publish_later` sends what nobody waits on (a turn's ack) with the
connection's next write rather than in a write of its own.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

import nats
from nats.aio.client import Client
from nats.errors import NoRespondersError, TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError, NotFoundError
from nats.protocol import command as nats_command

from crewlet import credentials, log

# Seconds between looks while a flow-control reply waits for its message to
# be delivered (nats-py's own interval).
FLOW_CONTROL_CHECK = 0.25


def _flow_control_on_demand() -> None:
    """Replace nats-py's ordered consumers' flow-control poll (every 0.25 s,
    for ever) with one that waits for the broker's flow-control request and
    polls only while its reply is due. Left as it is if nats-py's internals
    are not the ones this was written against."""
    jsi = getattr(JetStreamContext, "_JSI", None)
    schedule = getattr(jsi, "schedule_flow_control_response", None)
    close = getattr(Client, "_close", None)
    if jsi is None or schedule is None or close is None or not hasattr(jsi, "check_flow_control_response"):
        return
    if getattr(schedule, "on_demand", False):
        return  # patched already

    def schedule_flow_control_response(self, reply: str) -> None:
        schedule(self, reply)
        wake = self.__dict__.get("_fc_wake")
        if wake is not None:
            wake.set()

    async def check_flow_control_response(self) -> None:
        # nats-py's loop, minus its sleep while no reply is due. Its sleep also
        # saw the connection closed (or drained) with the subscription still
        # open: woken by the close instead, it ends as nats-py's did.
        wake = self._fc_wake = asyncio.Event()
        self._conn.__dict__.setdefault("_crewlet_fc_wakes", weakref.WeakSet()).add(wake)
        while True:
            try:
                if self._conn.is_closed:
                    break
                if self._fcr is None:
                    await wake.wait()
                    wake.clear()
                    continue
                if (self._fciseq - self._psub._pending_queue.qsize()) >= self._fcd:
                    fc_reply = self._fcr
                    try:
                        if fc_reply:
                            await self._conn.publish(fc_reply)
                    except Exception:
                        pass
                    self._fcr = None
                    self._fcd = 0
                    continue
                await asyncio.sleep(FLOW_CONTROL_CHECK)
            except asyncio.CancelledError:
                break

    async def close_waking_flow_control(self, *args: Any, **kwargs: Any) -> None:
        try:
            await close(self, *args, **kwargs)
        finally:
            for wake in list(self.__dict__.get("_crewlet_fc_wakes", ())):
                wake.set()

    schedule_flow_control_response.on_demand = True
    jsi.schedule_flow_control_response = schedule_flow_control_response
    jsi.check_flow_control_response = check_flow_control_response
    Client._close = close_waking_flow_control


_flow_control_on_demand()


def servers_of(stream) -> list[str]:
    """The URLs a process dials for a node's ``stream`` config section."""
    if stream.type == "nats":
        return list(stream.servers)
    return [f"nats://{stream.listen}"]


# Bytes of one message, headers included: nats-server's default max_payload,
# which crewlet's embedded broker keeps. What is bigger (a mail) is refused
# before it is sent, naming its own limit; a company revision is stored in
# parts well under it (crewlet.coord.control_plane.PART_BYTES). An external
# NATS configured lower says so itself when it refuses.
MAX_PAYLOAD = 1024 * 1024

FIRST_CONNECT_ATTEMPTS = 3  # per server, 0.1 s apart, before a first connect gives up

# Consumers a stream admits, set deliberately on every stream crewlet makes:
# left at -1, a stream refuses its 1,001st consumer all the same, with no
# warning (DESIGN §4), and a leak is only noticed when everything stops.
# With a limit of its own, ``crewletctl status`` shows a stream's count
# against it. The mailbox stream's is the company's size
# (:func:`supervisor.fleet.mailbox_capacity`).
#
# A KV bucket's consumers are watches: at most one per bucket per process,
# five processes a node, and a killed process's watch lingers
# ``buckets.WATCH_INACTIVE`` seconds beside its successor's. 256 is fifty
# nodes each restarting every process at once.
MAX_WATCHES = 256
# ESTATE, EVENTS and DLQ are read by one consumer per data node (its
# applier's ordered consumer, the custody group's durable) and by operators'
# tools; an ephemeral consumer of a killed reader lingers seconds.
MAX_READERS = 64

# Short, as DESIGN §4 asks: a request in flight when a connection drops waits
# its whole timeout, and a publish that timed out is retried (same Nats-Msg-Id).
JETSTREAM_TIMEOUT = 2.0


def jetstream(nc: Client, stream, *, timeout: float = JETSTREAM_TIMEOUT) -> JetStreamContext:
    """The JetStream context for a node's ``stream`` config section.

    A leaf (embedded, ``stream.leaf``) has no JetStream of its own: it reaches
    the members' through their domain, ``stream.domain``. A member or a
    standalone server answers the plain API (it serves the domain as well),
    and so, we assume, does a cluster dialled with ``type: nats``.

    Beware on a leaf: nats-py's KV helper publishes puts on
    ``$KV.<bucket>.<key>`` without the domain, and from a leaf those get no
    answer (measured: ``NoStreamResponseError``); publish them to
    ``$JS.<domain>.API.$KV.<bucket>.<key>`` instead. Reads and the API calls
    go through the domain and work.
    """
    domain = stream.domain if stream.type == "embedded" and stream.leaf is not None else None
    return nc.jetstream(domain=domain, timeout=timeout)


def kv_subject(js: JetStreamContext, bucket: str) -> str:
    """The subject prefix a KV write to *bucket* is published on, through *js*.

    Plainly ``$KV.<bucket>.``; through a JetStream domain (a leaf),
    ``$JS.<domain>.API.$KV.<bucket>.`` — the only form a leaf's writes are
    answered on (DESIGN §4). nats-py keeps the API prefix of a context in a
    private attribute; it is the one place this module reads it.
    """
    prefix = getattr(js, "_prefix", "$JS.API")
    return f"$KV.{bucket}." if prefix == "$JS.API" else f"{prefix}.$KV.{bucket}."


async def connect(stream, *, name: str, run_dir: str, connect_timeout: float = 2.0,
                  user: str = credentials.CREWLET_USER, inbox: str | None = None) -> Client:
    """Open this process's connection; reconnects forever once established.

    Authenticated as *user* — a role's own (its child name), else crewlet —
    with the credentials in *run_dir* (:mod:`crewlet.credentials`) when the
    broker is the node's own. *inbox*: the prefix of the connection's
    inboxes (a role's user may subscribe only under its own,
    :func:`crewlet.permissions.inbox`).
    """

    async def disconnected() -> None:
        log.event("nats_disconnected", "warning")

    async def reconnected() -> None:
        log.event("nats_reconnected", url=str(nc.connected_url.netloc if nc.connected_url else None))

    async def error(exc: Exception) -> None:
        log.event("nats_error", "warning", error=f"{type(exc).__name__}: {exc}")

    async def closed() -> None:
        log.event("nats_closed", "debug")

    servers = servers_of(stream)
    auth = credentials.client_options(stream, run_dir, user)
    if inbox is not None:
        auth["inbox_prefix"] = inbox
    # The first connect tries each server a few times and then fails, so a
    # child started while its broker is down exits (and is restarted with
    # backoff) instead of hanging in "starting". Once connected, reconnect
    # forever: nats-py reads this option on every reconnect.
    nc = await nats.connect(
        servers=servers, name=name, connect_timeout=connect_timeout,
        max_reconnect_attempts=FIRST_CONNECT_ATTEMPTS, reconnect_time_wait=0.1,
        allow_reconnect=True, disconnected_cb=disconnected, reconnected_cb=reconnected,
        error_cb=error, closed_cb=closed, **auth)
    nc.options["max_reconnect_attempts"] = -1
    nc.options["reconnect_time_wait"] = 0.5
    log.event("nats_connected", url=str(nc.connected_url.netloc if nc.connected_url else None))
    return nc


# Seconds a process's connection is given to drain when it closes.
CLOSE_TIMEOUT = 2.0
# The callback nats-py's ``KeyValue.watch`` gives a watch's subscription:
# how :func:`close` tells a KV watch from the subscriptions it drains.
KV_WATCH_CALLBACK = "KeyValue.watch.<locals>.watch_updates"


async def _unwatch(nc: Client) -> None:
    """Unsubscribe every KV watch of *nc*, rather than drain it: what a watch
    would still deliver is for a reader that is going away. And a watch
    caught opening (its consumer info asked) would hold the drain: the drain
    drops the replies' subscription, the answer never comes, and the watch's
    callback waits nats-py's setup for the JetStream timeout (2 s) with a
    message in hand, which the drain waits for (a workers stop took 2 s)."""
    for sub in list(nc._subs.values()):
        if getattr(getattr(sub, "_cb", None), "__qualname__", None) == KV_WATCH_CALLBACK:
            try:
                await sub.unsubscribe()
            except Exception:
                pass  # closed already, or the connection's trouble: the drain has it


async def _drain(nc: Client) -> None:
    await _unwatch(nc)
    await nc.drain()


async def close(nc: Client, timeout: float = CLOSE_TIMEOUT) -> None:
    """Close this process's connection: drain it when the broker is there to
    drain to, else just close (a drain toward a dead broker waits it out).

    Done within *timeout* whatever the broker does. Bounded by waiting, not
    by ``wait_for``: nats-py's drain swallows the cancel of a ``wait_for``
    that timed out and then flushes with its own 10 s timeout, so a broker
    that took the connection but answered nothing (SIGSTOPped) held a close
    for 12 s. A close not done by then is left running (``nats_close_abandoned``):
    the process is ending, and its socket goes with it. Its KV watches are
    not drained but unsubscribed (:func:`_unwatch`).
    """
    closing = asyncio.create_task(_drain(nc) if nc.is_connected else nc.close(), name="nats close")
    done, _ = await asyncio.wait({closing}, timeout=timeout)
    if not done:
        log.event("nats_close_abandoned", "warning", timeout_s=timeout)
        return
    if not closing.cancelled() and closing.exception() is not None:
        exc = closing.exception()
        log.event("nats_close_failed", "debug", error=f"{type(exc).__name__}: {exc}")


# Pauses between resends of an unanswered publish: the first, doubling up to the last.
RESEND_PAUSE = 0.1
RESEND_PAUSE_MAX = 1.0
# "duplicate message id is in process": a clustered leader proposing that id already.
DUPLICATE_IN_PROCESS = 10158
# A compare-and-set on a subject (a KV key): the header naming the last
# sequence the writer expects (0: the key must not exist), and the error codes
# of a write that lost (the key moved on, or exists).
EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = (10071, 10164)


# Seconds a publish sent with publish_later may wait for the connection's
# next write before it is written on its own.
LATER_WITHIN = 0.05


def _later_possible(nc: Client) -> bool:
    """Has *nc* the nats-py internals publish_later was written against?"""
    return all(hasattr(nc, name) for name in ("_send_command", "_flush_pending", "_flush_queue",
                                              "_pending_data_size", "stats"))


async def publish_later(nc: Client, subject: str, payload: bytes, within: float = LATER_WITHIN) -> None:
    """Publish *payload* on *subject* (core NATS, no headers, no reply) with
    the connection's next write — another publish's, a request's — or after
    *within* s at the latest, not in a write of its own. For a message nobody
    waits on whose moment does not matter (a turn's ack, sent once: a lost
    one is covered already): on loopback a write is a syscall and a wake of
    the broker, and at 100 turns in flight (bench/slow_turns.py) the ack
    was a write of its own on nearly every turn. In order with everything
    else on the connection. A plain publish where nats-py's internals are
    not the ones this was written against."""
    if not _later_possible(nc) or not nc.is_connected:
        await nc.publish(subject, payload)
        return
    nc.stats["out_msgs"] += 1
    nc.stats["out_bytes"] += len(payload)
    await nc._send_command(nats_command.pub_cmd(subject, "", payload))
    state = nc.__dict__
    if state.get("_crewlet_later") is None:  # one timer a connection, however many wait
        loop = asyncio.get_running_loop()

        def write_now() -> None:
            state["_crewlet_later"] = None
            queue = nc._flush_queue
            if nc._pending_data_size > 0 and nc.is_connected and queue is not None and queue.empty():
                # Held until the next one: the loop keeps only a weak reference to a task.
                state["_crewlet_flush"] = loop.create_task(nc._flush_pending())
        state["_crewlet_later"] = loop.call_later(within, write_now)


class Unanswered(Exception):
    """A publish got no answer until its deadline: it may or may not be stored."""


async def publish_until(js: JetStreamContext, subject: str, data: bytes, *, msg_id: str,
                        deadline: float, headers: dict[str, str] | None = None,
                        timeout: float = JETSTREAM_TIMEOUT, **options):
    """Publish *data* under ``Nats-Msg-Id`` *msg_id*, sent again while it gets
    no answer, until the monotonic *deadline*: its ``PubAck``.

    What a write after a side effect needs (a turn's ledger entry, its
    records): a stream leader election leaves publishes unanswered for ~5–6 s
    (``NoStreamResponseError``, a timeout), and a publish that timed out is
    sometimes stored after all — so the resend keeps the id, and the
    broker's dedupe answers it with the first one's ack (DESIGN §4). *msg_id*
    must name this one write: an id reused by another write inside the
    window would be answered without being stored.

    A clustered stream's leader answers a publish of an id it is still
    proposing (another process's write of the same thing, or our own first
    try) with :data:`DUPLICATE_IN_PROCESS`: not a refusal, for that copy may
    yet land, so it is sent again like an unanswered one, and once the copy
    is stored the broker answers with its duplicate ack.

    Raises :class:`Unanswered` once the deadline passed; a refusal
    (``APIError``: a compare-and-set that lost, a bad subject) at once.
    """
    headers = {**(headers or {}), "Nats-Msg-Id": msg_id}
    pause = RESEND_PAUSE
    while True:
        left = deadline - time.monotonic()
        try:
            return await js.publish(subject, data, headers=headers,
                                    timeout=max(0.05, min(timeout, left)), **options)
        except (NoStreamResponseError, NatsTimeoutError, NoRespondersError) as exc:
            why = exc
        except APIError as exc:
            if exc.err_code != DUPLICATE_IN_PROCESS:
                raise
            why = exc
        if time.monotonic() + pause >= deadline:
            raise Unanswered(f"publishing on {subject}: no answer in time: {type(why).__name__}")
        await asyncio.sleep(pause)
        pause = min(pause * 2, RESEND_PAUSE_MAX)


_ERR_STREAM_NAME_IN_USE = 10058


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> bool:
    """Stream ``config.name`` exists: made with *config* if it did not (True),
    an existing one left as it is (False) — a node that lost a race to make it
    takes the winner's."""
    try:
        await js.stream_info(config.name)
        return False
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
        return True
    except BadRequestError as exc:
        if exc.err_code != _ERR_STREAM_NAME_IN_USE:
            raise
        return False
