"""The coordination buckets (DESIGN §4), created idempotently at boot.

Every node creates every bucket it may touch, at every boot, with the fleet's
``stream.replicas``; an existing bucket is left as it is (a node never
re-creates what another made), but for its consumer limit. Every bucket
allows per-key TTLs; ``leases`` also keeps a *limit marker* when a key
expires, so a watcher sees an expiry as a PURGE rather than as silence.

**Nothing on the broker may grow with time.** A watch is an ephemeral
consumer; nats-py gives one a five-minute inactive threshold and its
``stop()`` only unsubscribes, so a watch opened per call outlives its use by
five minutes (issue 10: two per seat sweep filled ``KV_leases`` to the
server's 1,000 consumers in 90 s, and every sweep failed from then on). So:

* a process keeps **one long-lived watch** per bucket it follows
  (:func:`follow`, and :class:`crewlet.coord.holders.Holders` for ``leases``),
  and reads what it needs from that watch's memory;
* every watch is opened by :func:`open_watch` with an inactive threshold of
  :data:`WATCH_INACTIVE` seconds (a killed process's watch is gone that soon)
  and closed by :func:`close_watch`, which deletes its consumer;
* listing keys (:func:`subjects`) asks the stream for its subjects and
  creates no consumer at all;
* every bucket's stream has a deliberate ``max_consumers``
  (:data:`crewlet.bus.MAX_WATCHES`), so a leak shows against its own limit
  in ``crewletctl status`` long before the server's hidden one.

=========  ==============================================  =========================
bucket     keys                                            answers
=========  ==============================================  =========================
leases     node.<id>, seat.<id>, duty.<name>, conv.<id>    who is alive, who runs what
config     rev.<n>, active, part.<upload>.<i>              company revisions, the epoch, a
                                                           revision's company in parts
                                                           (crewlet/coord/control_plane.py)
status     node.<id>, estate.<id>, evicted.<id>,           revision reached, estate copy, eviction,
           schedule.<name>,                                a schedule's last fire (crewlet.coord.fired),
           duty.<name>                                     a duty's last pass (crewlet.coord.duty_reports)
ledger     <trigger id>                                    has a trigger been worked
claims     <integration>.<delivery id>                     delivery dedupe, a week
           outbox.<digest of a notification id>            a notification's claim and
                                                           outcome (crewlet/outbox.py)
cooldowns  <provider>.<key id>                             provider key cooling
rate       <valve>                                         the notification valve: a GCRA
                                                           state the sender admits each
                                                           send by (crewlet/coord/valve.py)
budgets    org, seat.<id>                                  token spend against caps
objects    (none yet)                                      made, not used: the file store's
                                                           record once files live in one
grants     <seat>.<token>.<node digest>                    is a fencing token a lease
                                                           the fleet granted (the verdict
                                                           every estate copy follows:
                                                           roles/data_applier/grants.py)
secrets    <name>                                          a fleet secret, sealed: its
                                                           newest version, and the one it
                                                           replaced while a grace lasts
                                                           (crewlet/vault/store.py)
=========  ==============================================  =========================
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from nats.js import JetStreamContext
from nats.js.api import StreamInfo
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from crewlet import log
from crewlet.bus import MAX_WATCHES


@dataclass(frozen=True)
class Bucket:
    name: str
    history: int = 1
    # Seconds a limit marker (an expiry, seen by watchers as a PURGE) stays.
    limit_marker_ttl: float | None = None
    # Seconds a key lives past its last write (the stream's max_age); None: for ever.
    max_age: float | None = None


LEASES = Bucket("leases", limit_marker_ttl=60)
CONFIG = Bucket("config")
STATUS = Bucket("status")
LEDGER = Bucket("ledger")
# A delivery id is remembered a week: senders retry within hours (GitHub's
# redeliveries, Slack's three retries); one posted again later is new mail.
CLAIMS = Bucket("claims", max_age=7 * 86400)
COOLDOWNS = Bucket("cooldowns")
RATE = Bucket("rate")
BUDGETS = Bucket("budgets")
OBJECTS = Bucket("objects")
# Written once per key, never aged: a verdict is needed for as long as the
# estate log keeps an op that names its token (a copy built from the log's
# first entry follows every verdict ever given). One key per seat claim.
GRANTS = Bucket("grants")
# One key per secret, its newest version sealed (crewlet.vault.store).
SECRETS = Bucket("secrets")

ALL = (LEASES, CONFIG, STATUS, LEDGER, CLAIMS, COOLDOWNS, RATE, BUDGETS, OBJECTS, GRANTS, SECRETS)

# Seconds a watch's consumer outlives its subscriber's interest (a killed
# process, a dropped connection). nats-py's ordered consumer answers the
# server's heartbeats while subscribed, and re-creates a consumer the
# server dropped, so a live watch never meets this.
WATCH_INACTIVE = 10.0
# Seconds closing a watch waits for its consumer's deletion.
CLOSE_WATCH_WAIT = 0.5


def stream(bucket: str) -> str:
    """The name of the stream that holds *bucket*."""
    return f"KV_{bucket}"


async def ensure(js: JetStreamContext, bucket: Bucket, replicas: int) -> KeyValue:
    """The bucket, created with *replicas* replicas if it does not exist yet,
    its consumer limit :data:`MAX_WATCHES`."""
    try:
        kv = await js.key_value(bucket.name)
    except (BucketNotFoundError, NotFoundError):
        # Direct gets are ~25 % faster and answer from any replica (DESIGN §4).
        kv = await js.create_key_value(bucket=bucket.name, history=bucket.history,
                                       replicas=replicas, direct=True,
                                       limit_marker_ttl=bucket.limit_marker_ttl,
                                       ttl=bucket.max_age)
    info = await js.stream_info(stream(bucket.name))
    if bucket.max_age and not info.config.max_age:
        # A bucket made before it had an age limit: nothing on the broker may
        # grow with time (the claims of issue 11's webhooks would).
        info.config.max_age = bucket.max_age
        await js.update_stream(info.config)
        log.event("bucket_aged", stream=info.config.name, max_age=bucket.max_age)
    await limit_consumers(js, stream(bucket.name), MAX_WATCHES, info)
    return kv


async def limit_consumers(js: JetStreamContext, name: str, limit: int,
                          info: StreamInfo | None = None) -> None:
    """Give stream *name* the consumer limit *limit* unless it has one already
    (an operator's own choice, or a bigger one a mailbox stream grew to).

    nats-py's ``create_key_value`` cannot set it, and a stream left at ``-1``
    meets the server's hidden limit of 1,000 with no warning (DESIGN §4)."""
    info = info or await js.stream_info(name)
    if info.config.max_consumers in (None, -1, 0):
        info.config.max_consumers = limit
        await js.update_stream(info.config)
        log.event("stream_consumers_limited", "debug", stream=name, max_consumers=limit)


async def open_watch(kv: KeyValue, keys: str, **options: Any):
    """``kv.watch(keys)`` whose consumer the broker drops :data:`WATCH_INACTIVE`
    seconds after its subscriber went away (nats-py's default: five minutes).

    Not cut in the middle by a cancel: nats-py's ``watch`` cancelled between
    its subscribe and its consumer info (one round trip; a role stopped just
    after it started) leaves a subscription whose callback waits the
    JetStream timeout (2 s) on a setup that never comes, and the process's
    drain waits for that callback (a workers stop took 2 s). Cancelled, the
    open is let finish — given at most :data:`CLOSE_WATCH_WAIT` — and the
    watch closed, and then the cancel goes on."""
    opening = asyncio.ensure_future(kv.watch(keys, inactive_threshold=WATCH_INACTIVE, **options))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        # Left to end by itself if it overruns: a watch that fails to open
        # unsubscribes (nats-py), one that opens late is the inactive threshold's.
        opening.add_done_callback(lambda t: t.cancelled() or t.exception())
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_WATCH_WAIT):
                watcher = await asyncio.shield(opening)
            await close_watch(watcher)
        raise


async def close_watch(watcher) -> None:
    """Stop *watcher* and delete its consumer now (best effort: a consumer
    left behind goes by itself after :data:`WATCH_INACTIVE`)."""
    sub = watcher._sub  # nats-py keeps the watch's subscription here
    try:
        await watcher.stop()
    except Exception:
        pass  # the connection's trouble
    await drop_consumer(sub, CLOSE_WATCH_WAIT)


async def drop_consumer(sub, wait: float) -> None:
    """Delete the consumer of *sub* (an ordered or ephemeral subscription)
    now, waiting at most *wait* seconds: a process stopping without quorum
    must not spend its shutdown time here. Best effort: one left behind goes
    by itself after its inactive threshold."""
    try:
        # An ordered consumer re-created after a gap is named here too.
        async with asyncio.timeout(wait):
            await sub._js.delete_consumer(sub._stream, sub._consumer)
    except Exception:
        pass  # gone already, or the broker away: the inactive threshold has it


async def subjects(js: JetStreamContext, bucket: str, keys: str = ">") -> list[str]:
    """The keys of *bucket* matching *keys* that were ever written and are
    still in its stream (deleted ones included: their delete marker is).

    Asked of the stream, so no consumer is made (nats-py's ``keys()`` opens a
    watch for it)."""
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(stream(bucket), subjects_filter=prefix + keys)
    return sorted(s[len(prefix):] for s in (info.state.subjects or {}))


async def ensure_all(js: JetStreamContext, replicas: int) -> dict[str, KeyValue]:
    """Every coordination bucket, by name."""
    return {b.name: await ensure(js, b, replicas) for b in ALL}


async def last(js: JetStreamContext, bucket: str, key: str, *, leader: bool = False
               ) -> tuple[int, bytes | None]:
    """*key*'s last sequence in *bucket* (0: never written) and its value (None:
    deleted, purged or expired). Raises what the read raised, NotFoundError aside.

    An expiry leaves a limit marker (``Nats-Marker-Reason``) that nats-py 2.16
    would read as a live, empty value; here it is a delete, as it is to the
    server. *leader*: ask the stream's leader rather than any replica, which
    may lag a write by a moment.
    """
    try:
        msg = await js.get_msg(stream(bucket), subject=f"$KV.{bucket}.{key}", direct=not leader)
    except NotFoundError:
        return 0, None
    headers = msg.headers or {}
    if headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers:
        return msg.seq, None
    return msg.seq, msg.data


# Pause before a watch that failed or ended is opened again, doubling up to the
# maximum (no JetStream quorum yet, the connection down, a leader moving).
WATCH_RETRY_MIN = 0.1
WATCH_RETRY_MAX = 2.0


def _go_on() -> None:
    """CancelledError if this task was asked to stop. A cancel that lands as
    a request's answer does is swallowed by Python 3.11's ``wait_for`` (which
    nats-py's requests use, DESIGN §4): a watch cancelled while its bucket was
    being opened went on to open its watch and wait on it for ever, and its
    owner, waiting for it to end, with it (a duty's stop overdue)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError()


async def follow(open_kv: Callable[[], Awaitable[KeyValue]], keys: str, seen: Callable[[Any], None],
                 *, opened: Callable[[], None] = lambda: None, listed: Callable[[], None] = lambda: None,
                 name: str = "", stopping: Callable[[], bool] = lambda: False,
                 idle: float | None = None, refresh: float | None = None) -> None:
    """Watch *keys* of the bucket *open_kv* opens, for ever (until cancelled,
    or *stopping*): ``seen(entry)`` for each entry.

    Every watch — the first and each one opened again — starts with
    ``opened()``, lists what the keys hold now, then calls ``listed()``: a
    caller that keeps a copy of the keys starts a fresh one at ``opened`` and
    puts it in force at ``listed``, so a key deleted while nobody watched is
    forgotten too. A failure is logged once per run of failures
    (``kv_watch_failed``), then the watch is opened again after a pause
    (:data:`WATCH_RETRY_MIN`, doubling up to :data:`WATCH_RETRY_MAX`).

    A bucket not found before this watch ever opened is not yet made, not
    lost: a node's roles come up while crewletd joins the fleet and makes
    the buckets (``supervisor/fleet.py``), so that is said once as
    ``kv_watch_waiting`` (info), and the watch opens as soon as the bucket
    is there. Not found after it had opened is a bucket deleted under the
    fleet, a warning like any other failure.

    A watch does not fail when its consumer is lost (its member killed, a
    partition): nats-py notices only after two missed heartbeats (10–20 s)
    and then quietly resumes from where it was, so what lapsed meanwhile may
    be missed for good once its marker is gone. So a watch is also opened
    again — listed anew — when nothing arrived for *idle* seconds (for keys
    that are rewritten that often while the watch is sound: leases), and
    every *refresh* seconds whatever happens.
    """
    pause, complained, ever_opened = WATCH_RETRY_MIN, False, False
    while not stopping():
        watcher = None
        try:
            kv = await open_kv()
            _go_on()
            watcher = await open_watch(kv, keys)
            _go_on()
            ever_opened = True
            opened()
            until = None if refresh is None else asyncio.get_running_loop().time() + refresh
            entries = aiter(watcher)
            while True:
                try:
                    async with asyncio.timeout(idle):  # not wait_for: 3.11's may swallow a cancel
                        entry = await anext(entries)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    log.event("kv_watch_idle", "debug", watch=name or keys, idle=idle)
                    pause = 0.0
                    break
                if entry is None:  # the first listing is complete
                    listed()
                else:
                    seen(entry)
                pause, complained = WATCH_RETRY_MIN, False
                if until is not None and asyncio.get_running_loop().time() >= until:
                    pause = 0.0
                    break  # time to list anew
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not complained:
                # (BucketNotFoundError is a NotFoundError.)
                waiting = not ever_opened and isinstance(exc, NotFoundError)
                log.event("kv_watch_waiting" if waiting else "kv_watch_failed",
                          "info" if waiting else "warning", watch=name or keys,
                          error=f"{type(exc).__name__}: {exc}")
                complained = True
        finally:
            if watcher is not None:
                await close_watch(watcher)
        await asyncio.sleep(pause)
        pause = min(max(pause * 2, WATCH_RETRY_MIN), WATCH_RETRY_MAX)
