"""The control plane: company revisions and the activation epoch (DESIGN §4, §7).

Both live in the ``config`` KV bucket:

``rev.<n>`` (n = 1, 2, 3 …)
    An immutable revision, JSON ``{"rev", "company", "digest", "source",
    "applied_by", "at"}``: the validated company as a plain dict
    (``Company.model_validate(r["company"])`` rebuilds it), its digest, the
    file it came from, ``user@host`` and a unix time. Appending creates
    ``rev.<n>`` with n one past the highest key ever written (a write that
    expects the key to have no history); losing that race to another writer
    moves on to n+1. Never overwritten.

``active``
    The activation epoch, JSON ``{"rev", "epoch", "at"}``. Activating a
    revision is a compare-and-set on the key's last sequence as read (none
    yet: expect none) with ``epoch + 1``; a conflict re-reads and retries
    after a short random pause, at most ``ACTIVATE_ATTEMPTS`` times. The epoch therefore counts every
    activation; the active revision is the one activated last — not
    necessarily the highest: of two concurrent applies both land and both
    count, and whichever activates second is active; a rollback may
    activate an older one.

A revision is one message, so the whole record (with its write's headers)
must fit the broker's ``MAX_PAYLOAD``: :func:`check_size` measures the record
:meth:`ControlPlane.append` would write and raises :class:`RevisionTooLarge`,
naming the size and the limit; ``crewletctl apply`` (``--check`` too) and
``crewletd start --company`` call it before anything is sent, and ``append``
itself refuses before publishing.

Every node watches ``active`` (:meth:`ControlPlane.watch`), applies the
revision it names, and records what it reached in ``status``.

Applying a company whose digest equals the active revision's still appends a
revision and bumps the epoch: an apply is an explicit act, and re-applying
the same file is how an operator makes every node apply it again.

Reliability (DESIGN §4 pitfalls): reads go to the stream's leader, not a
direct get or a KV watcher's initial values, since a follower can be behind
a write just made (on an R3 bucket nats-py's ``kv.create`` and ``kv.keys``
were both seen to miss fresh revisions that way). Writes are
compare-and-set publishes with a ``Nats-Msg-Id``; one that gets no answer
(a leader election stalls writes for seconds) is sent again under the same
id, so one stored after all is acknowledged by the broker's dedupe rather
than written twice. Unanswered requests are retried for ``PATIENCE``
seconds; each waits the JetStream context's timeout — give it a short one,
``nc.jetstream(timeout=JS_TIMEOUT)``. Anything else from NATS (no JetStream,
a value over the server's max payload) becomes :class:`ControlPlaneError`,
whose message says what was being done.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError
from nats.js.kv import KeyValue

from crewlet.company.model import Company
from crewlet.bus import MAX_PAYLOAD, kv_subject
from crewlet.coord.buckets import CONFIG, ensure, follow, last, subjects
from crewlet.bus import EXPECTED_LAST as _EXPECTED_LAST
from crewlet.bus import WRONG_LAST_SEQUENCE as _WRONG_LAST_SEQUENCE

JS_TIMEOUT = 2.0          # seconds: the JetStream request timeout callers should use
PATIENCE = 10.0           # seconds an unanswered request is retried (a leader election takes ~6 s)
FORMING_PATIENCE = 20.0   # seconds more a request refused for a cluster still forming is retried
RETRY_PAUSE = 0.1         # seconds before the first retry; doubles, up to 1 s
ACTIVATE_ATTEMPTS = 10    # compare-and-set tries of `active` before giving up
ACTIVATE_JITTER = 0.02    # seconds: a lost compare-and-set waits up to attempt × this, at random
READ_CONCURRENCY = 16     # revisions read at once by revisions() and history()
APPEND_ATTEMPTS = 50      # rev.<n> creates (n, n+1, …) before giving up
ACTIVE = "active"
REV_PREFIX = "rev."
# Bytes kept for a write's headers (Nats-Expected-Last-Subject-Sequence and a
# Nats-Msg-Id of the key and 32 hex digits take ~110), which the broker counts
# in the message's size; and the widest revision number a record may carry.
HEADERS_ROOM = 256
REV_WIDEST = 2**53 - 1

_KV_OPS_GONE = ("DEL", "PURGE")
_UNANSWERED = (NoStreamResponseError, NatsTimeoutError, asyncio.TimeoutError)
# JetStream refusals that pass by themselves, so are waited out like silence:
# "insufficient resources" / "no suitable peers for placement" (a cluster whose
# members are still meeting) and "JetStream system temporarily unavailable".
_NOT_YET = (10005, 10023, 10008)

T = TypeVar("T")


class ControlPlaneError(Exception):
    """The control plane could not be read or written; the message says what and why."""


class RevisionNotFound(ControlPlaneError):
    """No ``rev.<n>`` for the asked n."""


class RevisionTooLarge(ControlPlaneError):
    """A company whose stored revision would not fit one broker message;
    ``size`` and ``limit`` in bytes. Nothing was sent."""

    def __init__(self, size: int, limit: int):
        self.size, self.limit = size, limit
        super().__init__(f"the company's stored revision would be {size:,} bytes, over the broker's limit "
                         f"of {limit:,} bytes ({limit / 2**20:g} MiB) a message: fewer seats, or shorter "
                         "personas and rules")


def _record(company: Company, source: str, by: str | None) -> dict[str, Any]:
    """A revision's record, without its number: what :meth:`ControlPlane.append` stores."""
    return {"company": company.model_dump(mode="json"), "digest": company.digest(),
            "source": source, "applied_by": by or applied_by(), "at": time.time()}


def revision_size(company: Company, source: str, by: str | None = None) -> int:
    """Bytes the broker would count for *company* stored as a revision: the
    record at its widest revision number, and room for the write's headers."""
    return len(_dumps({"rev": REV_WIDEST, **_record(company, source, by)})) + HEADERS_ROOM


def check_size(company: Company, source: str, by: str | None = None, limit: int = MAX_PAYLOAD) -> int:
    """The revision's size (:func:`revision_size`); :class:`RevisionTooLarge` over *limit*."""
    size = revision_size(company, source, by)
    if size > limit:
        raise RevisionTooLarge(size, limit)
    return size


def applied_by() -> str:
    """``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry and no $USER, e.g. a bare container
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _json(data: bytes, key: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ControlPlaneError(f"{CONFIG.name}/{key} holds something that is not JSON: {bytes(data[:80])!r}")
    return value


def _dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def _patiently(what: str, call: Callable[[], Awaitable[T]]) -> T:
    """``await call()``, again while it gets no answer, for up to PATIENCE
    seconds, or while a cluster still forming refuses it (:data:`_NOT_YET`),
    FORMING_PATIENCE seconds more; every NATS error becomes a
    ControlPlaneError about *what*."""
    deadline = time.monotonic() + PATIENCE
    pause = RETRY_PAUSE
    while True:
        try:
            return await call()
        except _UNANSWERED as exc:
            if time.monotonic() + pause > deadline:
                raise ControlPlaneError(f"{what}: no answer within {PATIENCE:g}s: {_why(exc)}") from exc
        except APIError as exc:
            # A cluster just formed: its members are not all known yet, so a
            # stream with replicas cannot be placed for a moment.
            if exc.err_code not in _NOT_YET or time.monotonic() + pause > deadline + FORMING_PATIENCE:
                raise ControlPlaneError(f"{what}: {_why(exc)}") from exc
        except NatsError as exc:
            raise ControlPlaneError(f"{what}: {_why(exc)}") from exc
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


class ControlPlane:
    """Revisions and the activation epoch over one JetStream context."""

    def __init__(self, js: JetStreamContext, kv: KeyValue):
        self.js, self.kv = js, kv

    @classmethod
    async def open(cls, js: JetStreamContext, replicas: int = 1) -> ControlPlane:
        """The control plane, creating the ``config`` bucket with *replicas* if needed."""
        kv = await _patiently(f"opening the {CONFIG.name} bucket", lambda: ensure(js, CONFIG, replicas))
        return cls(js, kv)

    # ---------------------------------------------------------------- reading

    async def _read(self, key: str) -> tuple[dict[str, Any] | None, int]:
        """(value or None when absent or deleted, the key's last sequence or 0).
        Read from the stream's leader: a follower may lag a write just made."""
        seq, data = await _patiently(f"reading {CONFIG.name}/{key}",
                                     lambda: last(self.js, CONFIG.name, key, leader=True))
        return (None if data is None else _json(data, key)), seq

    async def active(self) -> dict[str, Any] | None:
        """The active pointer ``{"rev", "epoch", "at"}``, or None before the first apply."""
        return (await self._read(ACTIVE))[0]

    async def revision(self, n: int) -> dict[str, Any]:
        """The full revision *n*; :class:`RevisionNotFound` if there is none."""
        value, _ = await self._read(f"{REV_PREFIX}{n}")
        if value is None:
            raise RevisionNotFound(f"no revision {n}")
        return value

    async def _revision_keys(self) -> list[int]:
        """The n of every ``rev.<n>`` key ever written, ascending (from the
        stream's leader, which knows every subject)."""
        keys = await _patiently("listing revisions",
                                lambda: subjects(self.js, CONFIG.name, f"{REV_PREFIX}>"))
        numbers = [key.removeprefix(REV_PREFIX) for key in keys]
        return sorted(int(n) for n in numbers if n.isdigit())

    async def highest(self) -> int:
        """The highest n of any ``rev.<n>`` key ever written (0: none)."""
        return max(await self._revision_keys(), default=0)

    async def revisions(self) -> list[dict[str, Any]]:
        """Every revision, in full, ascending by rev."""
        gate = asyncio.Semaphore(READ_CONCURRENCY)

        async def one(n: int) -> dict[str, Any] | None:
            async with gate:
                return (await self._read(f"{REV_PREFIX}{n}"))[0]

        found = await asyncio.gather(*(one(n) for n in await self._revision_keys()))
        return [r for r in found if r is not None]

    async def history(self) -> list[dict[str, Any]]:
        """A summary of every revision, ascending: rev, active (bool), at,
        seats (count), digest, source and applied_by."""
        revisions = await self.revisions()
        pointer = await self.active()
        current = pointer.get("rev") if pointer else None
        return [{"rev": r.get("rev"), "active": r.get("rev") == current, "at": r.get("at"),
                 "seats": len((r.get("company") or {}).get("seats") or []), "digest": r.get("digest"),
                 "source": r.get("source"), "applied_by": r.get("applied_by")}
                for r in revisions]

    async def watch(self) -> AsyncIterator[dict[str, Any]]:
        """Yield the active pointer now (if there is one), then each time it
        changes, for as long as the caller iterates. Before the first apply
        the first item is the first activation.

        The watch is opened again, for ever, whenever it fails
        (:func:`crewlet.coord.buckets.follow`): a node whose broker cannot
        give it a watch now (no quorum yet, the stream at its consumer
        limit) waits for one rather than failing."""
        entries: asyncio.Queue = asyncio.Queue()

        async def bucket() -> KeyValue:
            return self.kv
        following = asyncio.create_task(follow(bucket, ACTIVE, entries.put_nowait,
                                               name=f"{CONFIG.name} {ACTIVE}"))
        seen = 0
        try:
            while True:
                entry = await entries.get()
                if entry.operation in _KV_OPS_GONE or entry.revision <= seen:
                    continue  # a delete, or a replay after a reconnect or a new watch
                seen = entry.revision
                yield _json(entry.value or b"", ACTIVE)
        finally:
            following.cancel()

    # ---------------------------------------------------------------- writing

    async def _write(self, key: str, value: bytes, expected: int) -> bool:
        """Compare-and-set *key* to *value* if its last sequence is *expected*
        (0: no history); False when it is not."""
        headers = {_EXPECTED_LAST: str(expected), "Nats-Msg-Id": f"{key}:{uuid.uuid4().hex}"}

        async def publish() -> bool:
            try:
                await self.js.publish(kv_subject(self.js, CONFIG.name) + key, value, headers=headers)
            except APIError as exc:
                if exc.err_code in _WRONG_LAST_SEQUENCE:
                    return False
                raise
            return True

        return await _patiently(f"writing {CONFIG.name}/{key}", publish)

    async def append(self, company: Company, source: str, by: str | None = None) -> int:
        """Store *company* as the next revision; its number. Does not activate.
        :class:`RevisionTooLarge` (nothing sent) when it would not fit a message."""
        record = _record(company, source, by)
        check_size(company, source, record["applied_by"])
        n = await self.highest() + 1
        for _ in range(APPEND_ATTEMPTS):
            if await self._write(f"{REV_PREFIX}{n}", _dumps({"rev": n, **record}), 0):
                return n
            n += 1  # somebody else appended rev.<n> first
        raise ControlPlaneError(f"appending a revision: lost the race {APPEND_ATTEMPTS} times")

    async def activate(self, n: int) -> int:
        """Make revision *n* the active one; the new epoch."""
        await self.revision(n)  # refuse to point at nothing
        for attempt in range(ACTIVATE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(random.uniform(0, attempt * ACTIVATE_JITTER))  # spread contenders
            pointer, last = await self._read(ACTIVE)
            epoch = (pointer or {}).get("epoch", 0) + 1
            if await self._write(ACTIVE, _dumps({"rev": n, "epoch": epoch, "at": time.time()}), last):
                return epoch
            # Another activation landed in between — or quorum is lost, which
            # answers the same (DESIGN §4): re-read before trying again.
        raise ControlPlaneError(f"activating revision {n}: the compare-and-set failed "
                                f"{ACTIVATE_ATTEMPTS} times (busy, or no quorum)")

    async def apply(self, company: Company, source: str, by: str | None = None) -> tuple[int, int]:
        """Append *company* as a new revision and activate it: (rev, epoch)."""
        n = await self.append(company, source, by)
        return n, await self.activate(n)
