"""Files on the fleet's own broker: a NATS JetStream object store bucket (the default backend).

The bucket is the JetStream object store of ADR-20, so ``nats object`` (the
CLI) and other clients read and write the same objects: stream
``OBJ_<bucket>``, an object's bytes as chunk messages on
``$O.<bucket>.C.<nuid>`` (a fresh nuid per put), its description as ONE meta
message on ``$O.<bucket>.M.<base64url name>`` (a JSON ``ObjectInfo``,
published with ``Nats-Rollup: sub`` so it is the only one of its subject).
The stream's replicas follow ``stream.replicas``: three members at three
replicas keep writing files with one down (reference "Files are the exception").

nats-py's ``ObjectStore`` is not used; it is the wire format, not the client:

* **Reads.** nats-py's ``get`` reads through an ordered push consumer whose
  flow-control loop wakes every 0.25 s, and gathers the object in memory:
  measured here (nats-server 2.15.1, nats-py 2.16.0) 550–740 ms for 10 MiB.
  :meth:`NatsObjectStore.open` reads chunks with **batched direct gets**
  (``DIRECT.GET`` with ``next_by_subj`` + ``batch``, server ≥ 2.11): no
  consumer to create or delete, :data:`BATCH_CHUNKS` chunks per request,
  yielded as they come, the digest checked at the end — ~20 ms for the same
  10 MiB (``bench/objects.py``).
* **Writes.** nats-py's ``put`` streams from a file, but sends every chunk
  once (a leader election fails the put), has no size limit, and replaces
  an object by reading its meta, writing, and purging the old chunks — two
  writers of one name at once leave one's chunks behind for ever. Here every
  publish is sent again under its ``Nats-Msg-Id`` until answered
  (:func:`crewlet.bus.publish_until`: an election stalls writes ~6 s), the
  meta is a **compare-and-set** on the meta subject's last sequence, so the
  put that replaced an object knows exactly whose chunks to purge, and a put
  over ``max_bytes`` (or failing, or cancelled) purges its own chunks.
* **Deletes** write ADR-20's delete marker (compare-and-set too), purge the
  chunks, then purge the marker itself (``seq``-bounded, so a put that came
  after it stays): deleted names leave nothing in the stream.

Meta reads that decide something (``info``, ``open``, the compare-and-set)
go to the stream leader (``STREAM.MSG.GET``): on R3 a follower may lag the
put that just returned. Chunk reads may come from any replica (direct gets):
one that lags answers short, and the read looks again until
:data:`PATIENCE` runs out. ``names`` walks the metas with direct gets too: it
may miss a put of the last moment, which the collector's grace covers.

From a leaf (a JetStream domain), the API goes through the domain prefix of
the context; writes to ``$O.…`` are published as they are (the leaf forwards
them to the members' stream, as it does mail), not under the prefix, which
the server maps for ``$KV`` alone (:func:`crewlet.bus.kv_subject`).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import json
import time
from typing import Any, AsyncIterator

from nats.aio.client import Client
from nats.errors import NoRespondersError, TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError
from nats.nuid import NUID

from crewlet import log
from crewlet.bus import (EXPECTED_LAST, JETSTREAM_TIMEOUT, MAX_READERS, WRONG_LAST_SEQUENCE, Unanswered,
                         ensure_stream, publish_until)
from crewlet.objects.base import (ObjectInfo, ObjectReader, ObjectStore, ObjectStoreError, NotFound, TooLarge,
                                  Unavailable, call_until, digest_of, identity_of, rechunk)

DEFAULT_BUCKET = "files"

# Bytes of one chunk message: ADR-20's default, what the Go client and the
# CLI write too. Measured here it is no slower than larger chunks on one
# server, and keeps each message far under the 1 MiB payload limit.
CHUNK_SIZE = 128 * 1024

# Chunks asked for in one direct get, and the bytes it may answer: what one
# read holds in memory at most (another writer's chunks may be larger).
BATCH_CHUNKS = 8
BATCH_BYTES = BATCH_CHUNKS * CHUNK_SIZE

# Seconds one step (a chunk's publish, a meta read, a batch of chunks) is
# tried again before the store is Unavailable: a stream leader election
# stalls writes ~6 s (DESIGN §4), so this rides out one with room to spare.
# Each try waits JETSTREAM_TIMEOUT at most: a request in flight when a
# member dies waits its whole timeout.
PATIENCE = 15.0

ROLLUP = "Nats-Rollup"
ROLLUP_SUBJECT = "sub"
_ADR20_DIGEST = "SHA-256="
_NO_MESSAGE = 10037             # err_code: no message of that subject
_STREAM_MISSING = 10059
# Status codes a direct get answers with instead of a message.
_EOB, _NOTHING, _UNAVAILABLE = "204", "404", "503"
# Errors that mean "no answer now": an election, a member gone, a leader not yet known.
_RETRYABLE = (NoStreamResponseError, NatsTimeoutError, NoRespondersError, Unanswered)


class _Busy(Exception):
    """The JetStream API answered 5xx (no leader yet, cluster busy): try again."""


class _Short(Exception):
    """A direct get answered with fewer chunks than the object has (a lagging replica)."""


def _api_prefix(js: JetStreamContext) -> str:
    # nats-py keeps a context's API prefix in a private attribute, as
    # crewlet.bus.kv_subject and crewlet.queue.jetstream read it.
    return getattr(js, "_prefix", "$JS.API")


def _b64name(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode("utf-8")).decode()


def _hex_digest(adr20: str | None) -> str | None:
    """ADR-20's ``SHA-256=<base64url>`` as ``sha256=<hex>``."""
    if not adr20 or not adr20.upper().startswith(_ADR20_DIGEST):
        return None
    raw = adr20[len(_ADR20_DIGEST):]
    return digest_of(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex())


def _epoch(stamp: str | datetime.datetime | None) -> float:
    """A JetStream time (RFC 3339 with nanoseconds, or nats-py's datetime) as epoch seconds."""
    if stamp is None:
        return 0.0
    if isinstance(stamp, datetime.datetime):
        return stamp.replace(tzinfo=stamp.tzinfo or datetime.timezone.utc).timestamp()
    stamp = stamp.strip().replace("Z", "+00:00")
    head, _, rest = stamp.partition(".")
    fraction = ""
    if rest:                    # Python takes at most 6 digits of fraction
        digits = len(rest) - len(rest.lstrip("0123456789"))
        fraction, stamp = rest[:digits], head + rest[digits:]
    when = datetime.datetime.fromisoformat(stamp)
    return when.timestamp() + (float("0." + fraction) if fraction else 0.0)


class NatsObjectStore(ObjectStore):
    """Objects in JetStream object store bucket *bucket*, through *js* on *nc*.

    *replicas*: the fleet's ``stream.replicas``, used when the bucket is made
    (an existing bucket is left as it is). ``await ensure()`` before use.
    """

    def __init__(self, js: JetStreamContext, nc: Client, *, bucket: str = DEFAULT_BUCKET, replicas: int = 1,
                 chunk_size: int = CHUNK_SIZE, patience: float = PATIENCE,
                 timeout: float = JETSTREAM_TIMEOUT):
        if not bucket or not all(c.isalnum() or c in "-_" for c in bucket):
            raise ValueError(f"bad bucket name {bucket!r}: letters, digits, '-' and '_'")
        self.js, self.nc, self.bucket, self.replicas = js, nc, bucket, replicas
        self.chunk_size, self.patience, self.timeout = chunk_size, patience, timeout
        self.stream = f"OBJ_{bucket}"
        self._prefix = _api_prefix(js)
        self._nuid = NUID()

    def identity(self) -> str:
        return identity_of("nats", self.bucket)

    # ------------------------------------------------------------ subjects

    def _chunks_subject(self, nuid: str) -> str:
        return f"$O.{self.bucket}.C.{nuid}"

    def _meta_subject(self, name: str) -> str:
        return f"$O.{self.bucket}.M.{_b64name(name)}"

    def _write_subject(self, subject: str) -> str:
        """Where a write to stream subject *subject* is published: as it is,
        from a leaf too. (The server maps a domain's ``$JS.<domain>.API.$KV.…``
        onto ``$KV.…`` for KV writes, but no ``$O.…``: measured, a domain-
        prefixed chunk is answered "no stream".)"""
        return subject

    # ------------------------------------------------------------ plumbing

    def _deadline(self) -> float:
        return time.monotonic() + self.patience

    async def _api(self, what: str, call, deadline: float | None = None) -> Any:
        """``await call()`` through elections and busy leaders, until the deadline."""
        async def once():
            try:
                return await call()
            except APIError as exc:
                if exc.code is not None and exc.code >= 500:
                    raise _Busy(f"{exc.code} {exc.description}") from exc
                raise
        return await call_until(deadline or self._deadline(), once, (*_RETRYABLE, _Busy), what)

    async def _publish(self, subject: str, data: bytes, msg_id: str, headers: dict | None = None):
        try:
            return await publish_until(self.js, self._write_subject(subject), data, msg_id=msg_id,
                                       deadline=self._deadline(), headers=headers, timeout=self.timeout)
        except Unanswered as exc:
            raise Unavailable(f"{self.identity()}: {exc}") from exc

    async def _last_meta(self, name: str) -> tuple[int, dict, float] | None:
        """(sequence, meta, stored at) of *name*'s meta message, read from the
        stream leader; None when the subject holds none."""
        async def get():
            try:
                return await self.js.get_last_msg(self.stream, self._meta_subject(name))
            except NotFoundError as exc:
                if exc.err_code == _STREAM_MISSING:
                    raise ObjectStoreError(f"{self.identity()}: no stream {self.stream} (ensure() it)") from exc
                return None
        msg = await self._api(f"reading {name!r}", get)
        if msg is None:
            return None
        try:
            return msg.seq, json.loads(msg.data or b"{}"), _epoch(msg.time)
        except ValueError as exc:
            raise ObjectStoreError(f"{self.identity()}: the meta of {name!r} is not JSON") from exc

    async def _purge(self, subject: str, *, below: int | None = None, quietly: bool = False) -> None:
        """Purge *subject*'s messages (those below sequence *below* only).
        *quietly*: a failure is logged and left to :meth:`sweep`."""
        try:
            await self._api(f"purging {subject}",
                            lambda: self.js.purge_stream(self.stream, subject=subject, seq=below))
        except (ObjectStoreError, APIError) as exc:
            if not quietly:
                raise
            log.event("objects_purge_failed", "warning", subject=subject, error=f"{type(exc).__name__}: {exc}")

    def _info_of(self, meta: dict, created: float) -> ObjectInfo:
        return ObjectInfo(name=meta.get("name", ""), size=int(meta.get("size") or 0),
                          digest=_hex_digest(meta.get("digest")), created=created)

    # ------------------------------------------------------------ the interface

    async def ensure(self) -> None:
        """The bucket's stream exists: made if missing (ADR-20's config, with
        ``max_consumers`` set as every crewlet stream's is), an existing one
        left as it is — but for direct gets, which reads need: an old
        bucket made without them has them turned on."""
        config = StreamConfig(
            name=self.stream, description="crewlet files (ADR-20 object store)",
            subjects=[f"$O.{self.bucket}.C.>", f"$O.{self.bucket}.M.>"],
            storage=StorageType.FILE, num_replicas=self.replicas, discard=DiscardPolicy.NEW,
            allow_rollup_hdrs=True, allow_direct=True, max_consumers=MAX_READERS)
        if await self._api(f"ensuring {self.stream}", lambda: ensure_stream(self.js, config)):
            log.event("objects_bucket_created", bucket=self.bucket, replicas=self.replicas)
            return
        info = await self._api(f"reading {self.stream}", lambda: self.js.stream_info(self.stream))
        if not info.config.allow_direct or not info.config.allow_rollup_hdrs:
            info.config.allow_direct = info.config.allow_rollup_hdrs = True
            await self._api(f"updating {self.stream}", lambda: self.js.update_stream(info.config))
            log.event("objects_bucket_updated", bucket=self.bucket, allow_direct=True)

    async def _put(self, name: str, chunks: AsyncIterator[bytes], max_bytes: int) -> ObjectInfo:
        nuid = self._nuid.next().decode()
        subject = self._chunks_subject(nuid)
        sha, size, count = hashlib.sha256(), 0, 0
        sent = committed = False
        try:
            async for block in rechunk(chunks, self.chunk_size):
                if size + len(block) > max_bytes:
                    raise TooLarge(name, max_bytes)
                sha.update(block)
                sent = True             # from here a chunk may be stored, answered or not
                # One id per chunk: a resend after a timeout is stored once.
                await self._publish(subject, block, msg_id=f"{nuid}.{count}")
                size += len(block)
                count += 1
            meta = {"name": name, "bucket": self.bucket, "nuid": nuid, "size": size, "chunks": count,
                    "mtime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    "digest": _ADR20_DIGEST + base64.urlsafe_b64encode(sha.digest()).decode(),
                    "options": {"max_chunk_size": self.chunk_size}}
            replaced = await self._commit(name, meta, nuid)
            committed = True
        finally:
            # Failed, too large or cancelled: nothing of this put may stay.
            # (A cancelled put purges on its way out; a killed one is swept.)
            if sent and not committed:
                await self._purge(subject, quietly=True)
        if replaced is not None and replaced.get("nuid") and not replaced.get("deleted"):
            await self._purge(self._chunks_subject(replaced["nuid"]), quietly=True)
        return ObjectInfo(name=name, size=size, digest=digest_of(sha.hexdigest()), created=time.time())

    async def _commit(self, name: str, meta: dict, nuid: str) -> dict | None:
        """Publish *meta* as *name*'s, replacing whatever meta it had by a
        compare-and-set on the subject's last sequence; the meta it replaced.

        Two puts of one name at once: each CAS names the meta it saw, so the
        loser reads again and replaces the winner (last writer wins), and
        each purges exactly the chunks of the meta it replaced."""
        data = json.dumps(meta).encode()
        deadline = self._deadline()
        for attempt in range(1_000_000):
            last = await self._last_meta(name)
            try:
                await self._publish(self._meta_subject(name), data, msg_id=f"{nuid}.meta.{attempt}",
                                    headers={ROLLUP: ROLLUP_SUBJECT, EXPECTED_LAST: str(last[0] if last else 0)})
                return last[1] if last else None
            except APIError as exc:
                if exc.err_code not in WRONG_LAST_SEQUENCE or time.monotonic() > deadline:
                    raise ObjectStoreError(f"{self.identity()}: storing {name!r}: {exc}") from exc
        raise AssertionError("unreachable")

    async def _info(self, name: str) -> ObjectInfo | None:
        last = await self._last_meta(name)
        if last is None or last[1].get("deleted"):
            return None
        return self._info_of(last[1], last[2])

    async def _delete(self, name: str) -> None:
        deadline = self._deadline()
        for attempt in range(1_000_000):
            last = await self._last_meta(name)
            if last is None or last[1].get("deleted"):
                return
            seq, meta, _ = last
            marker = {**meta, "deleted": True, "size": 0, "chunks": 0, "digest": "", "mtime": ""}
            try:
                ack = await self._publish(self._meta_subject(name), json.dumps(marker).encode(),
                                          msg_id=f"{meta.get('nuid')}.delete.{seq}.{attempt}",
                                          headers={ROLLUP: ROLLUP_SUBJECT, EXPECTED_LAST: str(seq)})
                break
            except APIError as exc:
                if exc.err_code not in WRONG_LAST_SEQUENCE or time.monotonic() > deadline:
                    raise ObjectStoreError(f"{self.identity()}: deleting {name!r}: {exc}") from exc
        if meta.get("nuid"):
            await self._purge(self._chunks_subject(meta["nuid"]))
        # The marker too: up to it only, so a put of the name made since stays.
        await self._purge(self._meta_subject(name), below=ack.seq + 1, quietly=True)

    async def _open(self, name: str) -> ObjectReader:
        last = await self._last_meta(name)
        if last is None or last[1].get("deleted"):
            raise NotFound(name)
        info = self._info_of(last[1], last[2])
        return ObjectReader(info, self._read(name, last[1], info))

    async def _read(self, name: str, meta: dict, info: ObjectInfo) -> AsyncIterator[bytes]:
        expected = int(meta.get("chunks") or 0)
        if not expected:
            if info.size:
                raise ObjectStoreError(f"{self.identity()}: {name!r} says {info.size} bytes in no chunks")
            return
        subject = self._chunks_subject(meta["nuid"])
        sha, size, count = hashlib.sha256(), 0, 0
        async for data, _ in self._walk(subject, lambda: count >= expected,
                                        lambda: self._still(name, meta["nuid"])):
            sha.update(data)
            size += len(data)
            count += 1
            yield data
        if count != expected or size != info.size or digest_of(sha.hexdigest()) != info.digest:
            raise ObjectStoreError(f"{self.identity()}: {name!r} read back {size} bytes in {count} chunks "
                                   f"with {digest_of(sha.hexdigest())}; its meta says {info.size} bytes in "
                                   f"{expected} chunks with {info.digest}")

    async def _still(self, name: str, nuid: str) -> None:
        """After a short read: NotFound / ObjectStoreError when *name* was
        deleted or replaced meanwhile (its chunks purged), else return (a replica lags)."""
        last = await self._last_meta(name)
        if last is None or last[1].get("deleted"):
            raise NotFound(name)
        if last[1].get("nuid") != nuid:
            raise ObjectStoreError(f"{self.identity()}: {name!r} was replaced while it was read")

    async def _walk(self, subject: str, done, short) -> AsyncIterator[tuple[bytes, dict]]:
        """Every message on *subject* (a wildcard may be), oldest first, as
        (data, headers), by batched direct gets from any replica. *done()*:
        nothing more is wanted (None: read to the end the replica knows of).
        When a replica answers nothing more before *done()*, ``await short()``
        (which raises to give up) and look again until PATIENCE runs out."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox + ".*")
        request = f"{self._prefix}.DIRECT.GET.{self.stream}"
        seq, asked = 1, 0
        deadline = self._deadline()
        try:
            while done is None or not done():
                asked += 1
                reply = f"{inbox}.{asked}"      # its own reply subject: a late answer to an older ask is told apart
                body = {"seq": seq, "next_by_subj": subject, "batch": BATCH_CHUNKS, "max_bytes": BATCH_BYTES}
                await self.nc.publish(request, json.dumps(body).encode(), reply=reply)
                batch, end = [], None
                try:
                    while end is None:
                        msg = await sub.next_msg(timeout=self.timeout)
                        if msg.subject != reply:
                            continue
                        status = (msg.headers or {}).get("Status")
                        if status:
                            end = status
                        else:
                            batch.append((msg.data, msg.headers))
                except NatsTimeoutError:
                    end = "timeout"
                if end not in (_EOB, _NOTHING, _UNAVAILABLE, "timeout"):
                    raise ObjectStoreError(f"{self.identity()}: reading {subject}: direct get answered {end} "
                                           f"{(msg.headers or {}).get('Description', '')}")
                for data, headers in batch:
                    yield data, headers
                    seq = int(headers["Nats-Sequence"]) + 1
                if batch:
                    deadline = self._deadline()          # progress: patience starts again
                    if end == _EOB:
                        continue
                if end in (_EOB, _NOTHING) and done is None:
                    return                               # the end of what there is
                if end in (_EOB, _NOTHING):
                    await short()                        # raises if it is gone for good
                if time.monotonic() > deadline:
                    raise Unavailable(f"{self.identity()}: reading {subject}: {end} and no more chunks "
                                      f"within {self.patience:g}s")
                if end != "timeout":
                    await _pause()
        finally:
            try:
                await sub.unsubscribe()
            except Exception:                            # the connection went: nothing to undo
                pass

    async def names(self) -> AsyncIterator[ObjectInfo]:
        async for data, headers in self._walk(f"$O.{self.bucket}.M.>", None, None):
            try:
                meta = json.loads(data)
            except ValueError:
                continue
            if meta.get("deleted") or not meta.get("name"):
                continue
            # The time the store took the meta (its clock, as info() answers).
            yield self._info_of(meta, _epoch(headers.get("Nats-Time-Stamp")))

    async def sweep(self, older_than: float) -> int:
        live = {info_nuid async for info_nuid in self._nuids()}
        cutoff = time.time() - older_than
        gone = 0
        for subject in await self._chunk_subjects():
            nuid = subject.rsplit(".", 1)[-1]
            if nuid in live:
                continue
            try:
                last = await self._api(f"reading {subject}", lambda: self.js.get_last_msg(self.stream, subject))
            except NotFoundError:
                continue                # purged meanwhile
            if _epoch(last.time) < cutoff:
                await self._purge(subject)
                log.event("objects_swept", bucket=self.bucket, subject=subject)
                gone += 1
        return gone

    async def _nuids(self) -> AsyncIterator[str]:
        async for data, _ in self._walk(f"$O.{self.bucket}.M.>", None, None):
            try:
                nuid = json.loads(data).get("nuid")
            except ValueError:
                continue
            if nuid:
                yield nuid

    async def _chunk_subjects(self) -> list[str]:
        """Every chunk subject holding messages (STREAM.INFO's subjects, paged)."""
        subjects: list[str] = []
        while True:
            body = json.dumps({"subjects_filter": f"$O.{self.bucket}.C.>", "offset": len(subjects)}).encode()
            msg = await self._api("listing chunk subjects", lambda: self.nc.request(
                f"{self._prefix}.STREAM.INFO.{self.stream}", body, timeout=self.timeout))
            answer = json.loads(msg.data)
            if "error" in answer:
                raise ObjectStoreError(f"{self.identity()}: listing chunks: {answer['error']}")
            page = list((answer.get("state") or {}).get("subjects") or {})
            subjects += page
            if not page or len(subjects) >= int(answer.get("total") or 0):
                return subjects


async def _pause(seconds: float = 0.05) -> None:
    await asyncio.sleep(seconds)
