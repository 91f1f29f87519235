"""The control plane: company revisions and the activation epoch (DESIGN §4, §7).

All of it lives in the ``config`` KV bucket:

``part.<upload>.<i>`` (i = 0, 1, … ; upload a random 32-hex id)
    The company of a revision: its JSON (``company.model_dump(mode="json")``,
    compact), compressed with zlib, cut into parts of :data:`PART_BYTES`.
    Each part is created once (a write that expects the key to have no
    history) and never overwritten. A company of any size up to
    :data:`~crewlet.company.model.REVISION_MAX` is stored this way: one
    broker message holds at most ``MAX_PAYLOAD`` (1 MiB), and 10,000 seats
    with 2 KiB personas are ~25 MB of JSON (~1/4 of that compressed).

``rev.<n>`` (n = 1, 2, 3 …)
    An immutable revision: the small record ``{"rev", "digest", "source",
    "applied_by", "at", "seats", "body"}`` — the company's digest
    (:meth:`Company.digest`), the file it came from, ``user@host``, a unix
    time, its number of seats, and ``body``, which names its parts:
    ``{"upload", "parts", "bytes", "size", "sha256", "encoding": "zlib"}``
    (how many parts, the compressed bytes they join to, the JSON's size,
    the sha256 of the compressed bytes). Appending creates ``rev.<n>`` with
    n one past the highest key ever written (a write that expects the key to
    have no history); losing that race to another writer moves on to n+1
    with the same parts. Never overwritten. A record holding the company
    itself, ``{"rev", "company", "digest", …}`` (what crewlet wrote before
    revisions had parts, or one written by hand), is read as well.

``active``
    The activation epoch, JSON ``{"rev", "epoch", "at"}``. Activating a
    revision is a compare-and-set on the key's last sequence as read (none
    yet: expect none) with ``epoch + 1``; a conflict re-reads and retries
    after a short random pause, at most ``ACTIVATE_ATTEMPTS`` times. The epoch therefore counts every
    activation; the active revision is the one activated last — not
    necessarily the highest: of two concurrent applies both land and both
    count, and whichever activates second is active; a rollback may
    activate an older one.

**Order, and why a node never applies half a company.** :meth:`ControlPlane.apply`
writes every part and has each acknowledged (stored on a quorum) before it
creates ``rev.<n>``, and creates ``rev.<n>`` before it moves ``active``. A
reader follows ``active`` → ``rev.<n>`` → the parts, from the stream's
leader, so whatever names a revision was written after all of its bytes.
A reader also checks what it joined against the record — every part there,
the byte count, the sha256, the size once inflated — and raises
:class:`RevisionDamaged` otherwise (:meth:`ControlPlane.revision`): never a
partial company. A writer that died between its parts and its record
leaves parts no revision names; they are never read (and are a few MB at
most: the broker keeps them like any old revision).

The company's size is its compact JSON's, before compression:
:func:`revision_size` measures it and :func:`check_size` raises
:class:`RevisionTooLarge` past :data:`~crewlet.company.model.REVISION_MAX`
(64 MiB), naming the size and the limit; ``crewletctl apply`` (``--check``
too), ``crewletd start --company`` and ``POST /v1/company`` call it before
anything is sent, and ``append`` itself refuses before writing a part.

Every node watches ``active`` (:meth:`ControlPlane.watch`), applies the
revision it names, and records what it reached in ``status``.

Applying a company whose digest equals the active revision's still appends a
revision and bumps the epoch: an apply is an explicit act, and re-applying
the same file is how an operator makes every node apply it again.

Reliability (DESIGN §4 pitfalls): reads go to the stream's leader, not a
direct get or a KV watcher's initial values, since a follower can be behind
a write just made (on an R3 bucket nats-py's ``kv.create`` and ``kv.keys``
were both seen to miss fresh revisions that way). Writes are
compare-and-set publishes with a ``Nats-Msg-Id``, on the bucket's subject
as :func:`crewlet.bus.kv_subject` spells it (through the JetStream domain
from a leaf); one that gets no answer (a leader election stalls writes for
seconds) is sent again under the same id, so one stored after all is
acknowledged by the broker's dedupe rather than written twice. Unanswered
requests are retried for ``PATIENCE`` seconds; each waits the JetStream
context's timeout — give it a short one, ``nc.jetstream(timeout=JS_TIMEOUT)``.
Anything else from NATS (no JetStream, a value over the server's max
payload) becomes :class:`ControlPlaneError`, whose message says what was
being done. The parts are in the ``config`` bucket rather than an object
store: nats-py's object store publishes without the domain prefix (no
answer from a leaf), reads through a consumer of its own (a right the
roles do not have, and ~0.6 s per 10 MiB), while a KV read is the one leader
get every role that reads revisions may already make.
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import json
import os
import random
import socket
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError
from nats.js.kv import KeyValue

from crewlet.company.model import REVISION_MAX, Company
from crewlet.bus import DUPLICATE_IN_PROCESS, kv_subject
from crewlet.coord.buckets import CONFIG, ensure, follow, last, subjects
from crewlet.bus import EXPECTED_LAST as _EXPECTED_LAST
from crewlet.bus import WRONG_LAST_SEQUENCE as _WRONG_LAST_SEQUENCE

JS_TIMEOUT = 2.0          # seconds: the JetStream request timeout callers should use
PATIENCE = 10.0           # seconds an unanswered request is retried (a leader election takes ~6 s)
FORMING_PATIENCE = 20.0   # seconds more a request refused for a cluster still forming is retried
RETRY_PAUSE = 0.1         # seconds before the first retry; doubles, up to 1 s
ACTIVATE_ATTEMPTS = 10    # compare-and-set tries of `active` before giving up
ACTIVATE_JITTER = 0.02    # seconds: a lost compare-and-set waits up to attempt × this, at random
READ_CONCURRENCY = 16     # revision records read at once by records() and history()
APPEND_ATTEMPTS = 50      # rev.<n> creates (n, n+1, …) before giving up
ACTIVE = "active"
REV_PREFIX = "rev."
PART_PREFIX = "part."
# Bytes of compressed company a part holds: half the broker's 1 MiB message,
# since a leader read answers with the value in base64 inside JSON (4/3 of
# it), and a write's headers count too. 64 MiB of JSON that does not
# compress at all would be 128 parts.
PART_BYTES = 512 * 1024
PART_CONCURRENCY = 8      # parts written, or read, at once
ENCODING = "zlib"
# zlib's default level: 21 MB of JSON (10,000 seats of prose) to 3.9 MB in ~1.5 s
# here (level 1: 5.5 MB in 0.15 s); inflating is ~0.2 s either way. Written once,
# kept for ever (a revision is never deleted), read by every node.
ZLIB_LEVEL = 6

_KV_OPS_GONE = ("DEL", "PURGE")
_UNANSWERED = (NoStreamResponseError, NatsTimeoutError, asyncio.TimeoutError)
# JetStream refusals that pass by themselves, so are waited out like silence:
# "insufficient resources" / "no suitable peers for placement" (a cluster whose
# members are still meeting), "JetStream system temporarily unavailable", and
# "stream not found" from a member of a fresh cluster that has not caught up
# with a bucket its peers made a moment ago (the official CI saw crewletctl
# apply refused so right after a three-member fleet said it was ready); and
# a resend of a write whose first try the leader is still proposing
# (crewlet.bus.DUPLICATE_IN_PROCESS: once stored, the resend is its duplicate).
_NOT_YET = (10005, 10023, 10008, 10059, DUPLICATE_IN_PROCESS)

T = TypeVar("T")


class ControlPlaneError(Exception):
    """The control plane could not be read or written; the message says what and why."""


class RevisionNotFound(ControlPlaneError):
    """No ``rev.<n>`` for the asked n."""


class RevisionDamaged(ControlPlaneError):
    """A revision whose company cannot be read whole: a part missing, or the
    parts not what its record says (count, bytes, sha256, size). Nothing of
    it may be applied; the message names the revision and what is wrong."""


class RevisionTooLarge(ControlPlaneError):
    """A company over :data:`~crewlet.company.model.REVISION_MAX`; ``size``
    and ``limit`` in bytes. Nothing was sent."""

    def __init__(self, size: int, limit: int):
        self.size, self.limit = size, limit
        super().__init__(f"the company's stored revision would be {size:,} bytes, over the limit of "
                         f"{limit:,} bytes ({limit / 2**20:g} MiB) a company revision may have: fewer "
                         "seats, or shorter personas and rules")


def _company_json(company: Company) -> bytes:
    """What a revision stores of *company*, before compression."""
    return _dumps(company.model_dump(mode="json"))


def revision_size(company: Company) -> int:
    """Bytes *company* measures as a stored revision: its compact JSON,
    before compression (what :data:`REVISION_MAX` limits)."""
    return len(_company_json(company))


def check_size(company: Company, *, limit: int = REVISION_MAX) -> int:
    """The revision's size (:func:`revision_size`); :class:`RevisionTooLarge` over *limit*."""
    size = revision_size(company)
    _check(size, limit)
    return size


def _check(size: int, limit: int) -> None:
    if size > limit:
        raise RevisionTooLarge(size, limit)


def encode(company: Company, limit: int = REVISION_MAX) -> tuple[dict[str, Any], list[bytes]]:
    """(the record's ``body`` without its upload id, the parts) of *company*;
    :class:`RevisionTooLarge` over *limit*. CPU-bound: run it off the loop."""
    plain = _company_json(company)
    _check(len(plain), limit)
    packed = zlib.compress(plain, ZLIB_LEVEL)
    parts = [packed[i:i + PART_BYTES] for i in range(0, len(packed), PART_BYTES)]
    return {"parts": len(parts), "bytes": len(packed), "size": len(plain),
            "sha256": hashlib.sha256(packed).hexdigest(), "encoding": ENCODING}, parts


def decode(body: dict[str, Any], parts: list[bytes], what: str) -> dict[str, Any]:
    """The company document of joined *parts*, checked against *body*;
    :class:`RevisionDamaged` naming *what* (``revision 3``) otherwise.
    CPU-bound: run it off the loop."""
    packed = b"".join(parts)
    if len(packed) != body["bytes"]:
        raise RevisionDamaged(f"{what}: its parts join to {len(packed):,} bytes, its record says "
                              f"{body['bytes']:,}")
    if hashlib.sha256(packed).hexdigest() != body["sha256"]:
        raise RevisionDamaged(f"{what}: its parts do not match the sha256 its record names")
    inflate = zlib.decompressobj()
    try:
        plain = inflate.decompress(packed, body["size"] + 1)
    except zlib.error as exc:
        raise RevisionDamaged(f"{what}: its parts do not inflate: {exc}") from None
    if len(plain) != body["size"] or not inflate.eof:
        raise RevisionDamaged(f"{what}: its company inflates to other than the {body['size']:,} bytes "
                              "its record says")
    try:
        company = json.loads(plain)
    except ValueError:
        company = None
    if not isinstance(company, dict):
        raise RevisionDamaged(f"{what}: its company is not a JSON object")
    return company


def _body_of(record: dict[str, Any], what: str) -> dict[str, Any]:
    """A record's ``body``, its fields checked; :class:`RevisionDamaged` otherwise."""
    body = record.get("body")
    fields = {"upload": str, "parts": int, "bytes": int, "size": int, "sha256": str, "encoding": str}
    if not isinstance(body, dict) or any(not isinstance(body.get(k), t) or isinstance(body.get(k), bool)
                                         for k, t in fields.items()):
        raise RevisionDamaged(f"{what}: its record names no company (neither a company nor its parts)")
    if not body["upload"] or body["upload"].strip("0123456789abcdef"):  # a key's part: no dots, no wildcards
        raise RevisionDamaged(f"{what}: its record names its parts {body['upload']!r}, not an upload id")
    if body["encoding"] != ENCODING:
        raise RevisionDamaged(f"{what}: its company is encoded as {body['encoding']!r}, which this "
                              f"node does not read (only {ENCODING!r})")
    if not 1 <= body["parts"] <= REVISION_MAX // PART_BYTES + 2 or not 0 <= body["size"] <= REVISION_MAX:
        raise RevisionDamaged(f"{what}: its record names {body['parts']} parts of a {body['size']:,}-byte "
                              "company: past what any revision may hold")
    return body


def part_key(upload: str, i: int) -> str:
    return f"{PART_PREFIX}{upload}.{i}"


def _seats(record: dict[str, Any]) -> int:
    """A revision's number of seats, from its record (or its company, in an old one)."""
    if isinstance(record.get("seats"), int):
        return record["seats"]
    company = record.get("company")
    return len((company.get("seats") or []) if isinstance(company, dict) else [])


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

    async def _raw(self, key: str) -> tuple[bytes | None, int]:
        """(value or None when absent or deleted, the key's last sequence or 0).
        Read from the stream's leader: a follower may lag a write just made."""
        seq, data = await _patiently(f"reading {CONFIG.name}/{key}",
                                     lambda: last(self.js, CONFIG.name, key, leader=True))
        return data, seq

    async def _read(self, key: str) -> tuple[dict[str, Any] | None, int]:
        """:meth:`_raw`, the value read as a JSON object."""
        data, seq = await self._raw(key)
        return (None if data is None else _json(data, key)), seq

    async def active(self) -> dict[str, Any] | None:
        """The active pointer ``{"rev", "epoch", "at"}``, or None before the first apply."""
        return (await self._read(ACTIVE))[0]

    async def record(self, n: int) -> dict[str, Any]:
        """Revision *n*'s record as stored — its digest, source, seats and the
        parts of its company, not the company itself (an old record holding
        its company inline is returned as it is); :class:`RevisionNotFound`
        if there is none. One small read, whatever the company's size."""
        value, _ = await self._read(f"{REV_PREFIX}{n}")
        if value is None:
            raise RevisionNotFound(f"no revision {n}")
        return value

    async def revision(self, n: int) -> dict[str, Any]:
        """The full revision *n*: its record with ``company``, the company's
        document, read from its parts and checked against the record.
        :class:`RevisionNotFound` if there is none; :class:`RevisionDamaged`
        when its company cannot be read whole (a part missing, a byte
        wrong): never a part of one."""
        record = await self.record(n)
        if "company" in record:  # an old record, or one written by hand: the company inline
            return record
        what = f"revision {n}"
        body = _body_of(record, what)
        gate = asyncio.Semaphore(PART_CONCURRENCY)

        async def one(i: int) -> bytes:
            key = part_key(body["upload"], i)
            async with gate:
                data, _ = await self._raw(key)
            if data is None:
                raise RevisionDamaged(f"{what}: part {i} of {body['parts']} ({CONFIG.name}/{key}) is missing")
            return bytes(data)

        parts = await asyncio.gather(*(one(i) for i in range(body["parts"])))
        company = await asyncio.to_thread(decode, body, parts, what)
        return {**record, "company": company}

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

    async def records(self) -> list[dict[str, Any]]:
        """Every revision's record (:meth:`record`), ascending by rev."""
        gate = asyncio.Semaphore(READ_CONCURRENCY)

        async def one(n: int) -> dict[str, Any] | None:
            async with gate:
                return (await self._read(f"{REV_PREFIX}{n}"))[0]

        found = await asyncio.gather(*(one(n) for n in await self._revision_keys()))
        return [r for r in found if r is not None]

    async def revisions(self) -> list[dict[str, Any]]:
        """Every revision, in full (:meth:`revision`: each company read from
        its parts), ascending by rev."""
        return [await self.revision(r["rev"]) for r in await self.records()]

    async def history(self) -> list[dict[str, Any]]:
        """A summary of every revision, ascending: rev, active (bool), at,
        seats (count), digest, source and applied_by. From the records
        alone: no company is read."""
        records = await self.records()
        pointer = await self.active()
        current = pointer.get("rev") if pointer else None
        return [{"rev": r.get("rev"), "active": r.get("rev") == current, "at": r.get("at"),
                 "seats": _seats(r), "digest": r.get("digest"),
                 "source": r.get("source"), "applied_by": r.get("applied_by")}
                for r in records]

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

    async def _write_parts(self, upload: str, parts: list[bytes]) -> None:
        """Create every part, each acknowledged before this returns."""
        gate = asyncio.Semaphore(PART_CONCURRENCY)

        async def one(i: int, part: bytes) -> None:
            async with gate:
                if not await self._write(part_key(upload, i), part, 0):
                    # The upload id is this call's own: nobody else writes there.
                    raise ControlPlaneError(f"writing {CONFIG.name}/{part_key(upload, i)}: "
                                            "the key exists already")

        try:
            async with asyncio.TaskGroup() as group:  # one fails: the others stop
                for i, part in enumerate(parts):
                    group.create_task(one(i, part))
        except* ControlPlaneError as failed:
            raise failed.exceptions[0] from None

    async def append(self, company: Company, source: str, by: str | None = None) -> int:
        """Store *company* as the next revision; its number. Does not activate.
        Writes the company's parts first, then the record naming them.
        :class:`RevisionTooLarge` (nothing sent) over ``REVISION_MAX``."""
        body, parts = await asyncio.to_thread(encode, company)
        digest = await asyncio.to_thread(company.digest)
        upload = uuid.uuid4().hex
        await self._write_parts(upload, parts)
        record = {"digest": digest, "source": source, "applied_by": by or applied_by(),
                  "at": time.time(), "seats": len(company.seats), "body": {"upload": upload, **body}}
        n = await self.highest() + 1
        for _ in range(APPEND_ATTEMPTS):
            if await self._write(f"{REV_PREFIX}{n}", _dumps({"rev": n, **record}), 0):
                return n
            n += 1  # somebody else appended rev.<n> first
        raise ControlPlaneError(f"appending a revision: lost the race {APPEND_ATTEMPTS} times")

    async def activate(self, n: int) -> int:
        """Make revision *n* the active one; the new epoch."""
        await self.record(n)  # refuse to point at nothing
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
