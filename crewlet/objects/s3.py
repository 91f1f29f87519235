"""Files in an S3 bucket (AWS S3, or anything speaking its API: MinIO, Ceph, R2, …).

``objects.type: s3``: no node holds an object at all; capacity and copies are
the bucket's (reference "Files are the exception"). crewlet needs the bucket
to exist (an operator makes it, with its lifecycle rules); ``create_bucket``
is for tests.

**boto3 in threads, not aioboto3.** boto3 is the reference client, and one
dependency tree (botocore, s3transfer, jmespath); aioboto3 rides on
aiobotocore, which pins botocore to a narrow range (a resolver fight with
anything else using boto3) and pulls in aiohttp. A call's cost here is the
network and the bytes, not the hop to a thread (~50 µs against a part of
8 MiB), so each blocking call runs in this store's **own** thread pool
(:data:`THREADS`): a slow store then queues on its own threads, never on the
event loop's default executor that the rest of the process shares. A boto3
client is thread-safe. boto3 is imported when a store is made, so crewlet
runs without it unless ``s3`` is configured (the ``crewlet[s3]`` extra).

How the operations map:

* **put** holds the first :data:`PART_SIZE` bytes; a source that ends within
  them is ONE ``PutObject`` with its sha256 in the object's metadata
  (``x-amz-meta-sha256``). A larger one is a multipart upload (parts of
  :data:`PART_SIZE`, S3's minimum being 5 MiB) to a **staging key**
  (:data:`STAGING`), then a server-side copy to its name with the digest in
  its metadata, then the staging key is deleted. Metadata is fixed when a
  multipart upload begins, before the digest of a stream is known; the copy
  is what lets the object appear under its name whole and with its digest at
  once, never without one. Over ``max_bytes``, or failing, the upload is
  aborted: no part stays billed. A writer killed mid-upload leaves an
  incomplete upload (or a staging key): :meth:`S3ObjectStore.sweep` aborts
  them (a bucket lifecycle rule ``AbortIncompleteMultipartUpload`` is a good
  second net).
* **open** is one ``GetObject`` read in :data:`READ_SIZE` pieces; a read
  that breaks off resumes with a ``Range`` from where it was, ``If-Match`` the
  first answer's ETag (a replaced object is an error, not a spliced one). The
  sha256 is checked at the end.
* **names** lists the bucket and asks each object's head for its digest
  (S3 lists no metadata), :data:`HEAD_CONCURRENCY` at once.

Checksums: boto3 ≥ 1.36 adds CRC checksums to every upload by default, which
several S3-compatible stores refuse; crewlet asks only where S3 requires
them and checks its own sha256 end to end instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import itertools
import time
import uuid
from typing import Any, AsyncIterator, Callable

from crewlet import log
from crewlet.objects.base import (ObjectInfo, ObjectReader, ObjectStore, ObjectStoreError, NotFound, TooLarge,
                                  Unavailable, digest_of, identity_of, rechunk)

PART_SIZE = 8 * 1024 * 1024     # bytes of one uploaded part (S3: at least 5 MiB but the last)
READ_SIZE = 1024 * 1024         # bytes handed out per chunk of a read
THREADS = 16                    # this store's threads: its blocking calls at once
# Parts of one put uploading at once: what one put holds in memory is this
# many parts and the one being read. Parallel parts are how S3 is fast (one
# stream of one connection is not); measured on moto, 13 parts of 100 MiB
# went up in ~0.8 s one after another.
PARTS_IN_FLIGHT = 3
HEAD_CONCURRENCY = 8            # heads at once while listing
READ_RESUMES = 3                # a read broken off is resumed this many times
# Where multipart uploads land before they are copied to their names. A name
# may not start with it (check_name allows it; this store refuses it).
STAGING = ".crewlet-uploads/"
META_DIGEST = "sha256"          # x-amz-meta-sha256: the object's sha256, hex
# A single CopyObject takes up to 5 GiB; s3transfer copies larger ones in parts.
COPY_SINGLE_MAX = 5 * 1024 ** 3
CONNECT_TIMEOUT = 5.0           # s
READ_TIMEOUT = 60.0             # s: a part of 8 MiB on a slow link
RETRIES = 4                     # botocore's own retries ("standard" mode: throttling, 5xx, timeouts)

_MISSING = ("404", "NoSuchKey", "NotFound")
_UNAVAILABLE_CODES = ("500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown",
                      "RequestTimeout", "RequestTimeTooSkewed")


class S3ObjectStore(ObjectStore):
    """Objects in S3 bucket *bucket* at *endpoint_url* (None: AWS).

    Credentials: *access_key* / *secret_key*, or boto3's own chain (the
    environment, an instance role) when not given. ``await ensure()`` before use.
    """

    def __init__(self, *, bucket: str, endpoint_url: str | None = None, region: str | None = None,
                 access_key: str | None = None, secret_key: str | None = None,
                 part_size: int = PART_SIZE, create_bucket: bool = False):
        if not bucket:
            raise ValueError("an S3 store needs a bucket")
        if part_size < 5 * 1024 * 1024:
            raise ValueError(f"part_size {part_size:,}: S3 takes parts of at least 5 MiB")
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise ObjectStoreError("the s3 object store needs boto3: pip install 'crewlet[s3]'") from exc
        self.bucket, self.endpoint_url, self.region = bucket, endpoint_url, region
        self.part_size, self.create_bucket = part_size, create_bucket
        config = Config(
            region_name=region, connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT,
            retries={"mode": "standard", "max_attempts": RETRIES}, max_pool_connections=THREADS,
            # Path-style on a named endpoint: MinIO and most self-hosted stores
            # have no per-bucket DNS names.
            s3={"addressing_style": "path" if endpoint_url else "auto"},
            request_checksum_calculation="when_required", response_checksum_validation="when_required")
        self._client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
            config=config)
        self._pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="s3")

    def identity(self) -> str:
        return identity_of("s3", self.bucket, self.endpoint_url)

    # ------------------------------------------------------------ plumbing

    async def _call(self, method: str, **params) -> Any:
        """``client.<method>(**params)`` in this store's threads, its errors
        as the store's: Unavailable for what may pass, NotFound-shaped
        ``_Missing`` for a missing key, ObjectStoreError for the rest."""
        return await self._run(getattr(self._client, method), method, **params)

    async def _run(self, fn: Callable, what: str, *args, **params) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError, ConnectionError as BotoConnectionError
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, lambda: fn(*args, **params))
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _MISSING:
                raise _Missing(code) from exc
            if code in _UNAVAILABLE_CODES:
                raise Unavailable(f"{self.identity()}: {what}: {exc}") from exc
            raise ObjectStoreError(f"{self.identity()}: {what}: {exc}") from exc
        except BotoConnectionError as exc:       # endpoint unreachable, timeouts
            raise Unavailable(f"{self.identity()}: {what}: {exc}") from exc
        except BotoCoreError as exc:
            raise ObjectStoreError(f"{self.identity()}: {what}: {exc}") from exc

    def _check_key(self, name: str) -> str:
        if name.startswith(STAGING):
            raise ValueError(f"object name {name!r}: names under {STAGING!r} are this store's own")
        return name

    def _info_of(self, name: str, head: dict) -> ObjectInfo:
        sha = (head.get("Metadata") or {}).get(META_DIGEST)
        return ObjectInfo(name=name, size=int(head.get("ContentLength", head.get("Size", 0))),
                          digest=digest_of(sha) if sha else None, created=head["LastModified"].timestamp())

    # ------------------------------------------------------------ the interface

    async def ensure(self) -> None:
        try:
            await self._call("head_bucket", Bucket=self.bucket)
        except _Missing:
            if not self.create_bucket:
                raise ObjectStoreError(f"{self.identity()}: no such bucket (make it first)") from None
            params: dict = {"Bucket": self.bucket}
            if self.region and self.region != "us-east-1":
                params["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
            await self._call("create_bucket", **params)
            log.event("objects_bucket_created", bucket=self.bucket, store="s3")

    async def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._client.close()

    async def _put(self, name: str, chunks: AsyncIterator[bytes], max_bytes: int) -> ObjectInfo:
        self._check_key(name)
        sha, size = hashlib.sha256(), 0
        first: bytes | None = None
        staging = upload = None
        parts: list[dict] = []
        sending: set[asyncio.Task] = set()
        numbers = itertools.count(1)
        completed = False

        async def send(block: bytes) -> None:
            # A free slot first: at most PARTS_IN_FLIGHT parts in the air.
            while len(sending) >= PARTS_IN_FLIGHT:
                done, _ = await asyncio.wait(sending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    sending.discard(task)
                    task.result()               # a failed part fails the put
            sending.add(asyncio.create_task(self._part(staging, upload, parts, next(numbers), block)))

        try:
            async for block in rechunk(chunks, self.part_size):
                if size + len(block) > max_bytes:
                    raise TooLarge(name, max_bytes)
                sha.update(block)
                size += len(block)
                if upload is None and first is None:
                    first = block           # one part's worth: maybe the whole object
                    continue
                if upload is None:
                    staging = f"{STAGING}{uuid.uuid4().hex}"
                    upload = (await self._call("create_multipart_upload", Bucket=self.bucket,
                                               Key=staging))["UploadId"]
                    await send(first)
                    first = None
                await send(block)
            metadata = {META_DIGEST: sha.hexdigest()}
            if upload is None:
                await self._call("put_object", Bucket=self.bucket, Key=name, Body=first or b"",
                                 Metadata=metadata)
            else:
                await asyncio.gather(*sending)
                sending.clear()
                await self._call("complete_multipart_upload", Bucket=self.bucket, Key=staging, UploadId=upload,
                                 MultipartUpload={"Parts": sorted(parts, key=lambda p: p["PartNumber"])})
                completed = True
                await self._copy(staging, name, size, metadata)
        finally:
            if sending:                         # let parts in the air land before an abort,
                await asyncio.gather(*sending, return_exceptions=True)   # or S3 may keep one
            if upload is not None and not completed:
                await self._quietly("abort_multipart_upload", Bucket=self.bucket, Key=staging, UploadId=upload)
            if completed:
                await self._quietly("delete_object", Bucket=self.bucket, Key=staging)
        return ObjectInfo(name=name, size=size, digest=digest_of(sha.hexdigest()), created=_now())

    async def _part(self, key: str, upload: str, parts: list[dict], number: int, block: bytes) -> None:
        answer = await self._call("upload_part", Bucket=self.bucket, Key=key, UploadId=upload,
                                  PartNumber=number, Body=block)
        parts.append({"PartNumber": number, "ETag": answer["ETag"]})

    async def _copy(self, source: str, name: str, size: int, metadata: dict) -> None:
        if size <= COPY_SINGLE_MAX:
            await self._call("copy_object", Bucket=self.bucket, Key=name, Metadata=metadata,
                             MetadataDirective="REPLACE", CopySource={"Bucket": self.bucket, "Key": source})
            return
        from boto3.s3.transfer import TransferConfig
        await self._run(self._client.copy, "copy", {"Bucket": self.bucket, "Key": source}, self.bucket, name,
                        ExtraArgs={"Metadata": metadata, "MetadataDirective": "REPLACE"},
                        Config=TransferConfig(multipart_threshold=COPY_SINGLE_MAX, use_threads=False))

    async def _quietly(self, method: str, **params) -> None:
        """A clean-up call whose failure is logged and left to sweep()."""
        try:
            await self._call(method, **params)
        except (ObjectStoreError, _Missing) as exc:
            log.event("objects_cleanup_failed", "warning", call=method, key=params.get("Key"),
                      error=f"{type(exc).__name__}: {exc}")

    async def _info(self, name: str) -> ObjectInfo | None:
        if name.startswith(STAGING):
            return None
        try:
            return self._info_of(name, await self._call("head_object", Bucket=self.bucket, Key=name))
        except _Missing:
            return None

    async def _delete(self, name: str) -> None:
        self._check_key(name)
        await self._call("delete_object", Bucket=self.bucket, Key=name)   # S3's delete is idempotent

    async def _open(self, name: str) -> ObjectReader:
        if name.startswith(STAGING):
            raise NotFound(name)
        try:
            answer = await self._call("get_object", Bucket=self.bucket, Key=name)
        except _Missing:
            raise NotFound(name) from None
        info = self._info_of(name, answer)
        return ObjectReader(info, self._read(name, info, answer))

    async def _read(self, name: str, info: ObjectInfo, answer: dict) -> AsyncIterator[bytes]:
        from botocore.exceptions import BotoCoreError
        from urllib3.exceptions import HTTPError as Urllib3Error
        sha, at, resumes = hashlib.sha256(), 0, 0
        body, etag = answer["Body"], answer.get("ETag")
        try:
            while at < info.size:
                try:
                    block = await self._run(body.read, "reading", READ_SIZE)
                except (Unavailable, ObjectStoreError, BotoCoreError, Urllib3Error, OSError) as exc:
                    block, why = b"", exc
                else:
                    why = None
                if block:
                    sha.update(block)
                    at += len(block)
                    yield block
                    continue
                # Broken off (or ended early): ask for the rest of the same object.
                if resumes >= READ_RESUMES:
                    raise Unavailable(f"{self.identity()}: reading {name!r} broke off at {at:,} of "
                                      f"{info.size:,} bytes: {why}")
                resumes += 1
                body.close()
                try:
                    answer = await self._call("get_object", Bucket=self.bucket, Key=name,
                                              Range=f"bytes={at}-", IfMatch=etag)
                except _Missing:
                    raise NotFound(name) from None
                body = answer["Body"]
        finally:
            body.close()
        if info.digest is not None and digest_of(sha.hexdigest()) != info.digest:
            raise ObjectStoreError(f"{self.identity()}: {name!r} read back with {digest_of(sha.hexdigest())}; "
                                   f"stored with {info.digest}")

    async def names(self) -> AsyncIterator[ObjectInfo]:
        paginator = self._client.get_paginator("list_objects_v2")
        pages = iter(paginator.paginate(Bucket=self.bucket))
        heads = asyncio.Semaphore(HEAD_CONCURRENCY)

        async def head(key: str) -> ObjectInfo | None:
            async with heads:
                return await self._info(key)

        while True:
            page = await self._run(next, "listing", pages, None)
            if page is None:
                return
            keys = [item["Key"] for item in page.get("Contents") or () if not item["Key"].startswith(STAGING)]
            for info in await asyncio.gather(*(head(key) for key in keys)):
                if info is not None:        # deleted since the listing
                    yield info

    async def sweep(self, older_than: float) -> int:
        cutoff = _now() - older_than
        gone = 0
        pages = iter(self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket))
        while (page := await self._run(next, "listing uploads", pages, None)) is not None:
            for upload in page.get("Uploads") or ():
                if upload["Initiated"].timestamp() >= cutoff:
                    continue
                parts = await self._call("list_parts", Bucket=self.bucket, Key=upload["Key"],
                                         UploadId=upload["UploadId"])
                if any(p["LastModified"].timestamp() >= cutoff for p in parts.get("Parts") or ()):
                    continue                # still being written
                await self._quietly("abort_multipart_upload", Bucket=self.bucket, Key=upload["Key"],
                                    UploadId=upload["UploadId"])
                gone += 1
        pages = iter(self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=STAGING))
        while (page := await self._run(next, "listing staging", pages, None)) is not None:
            for item in page.get("Contents") or ():
                if item["LastModified"].timestamp() < cutoff:
                    await self._quietly("delete_object", Bucket=self.bucket, Key=item["Key"])
                    gone += 1
        if gone:
            log.event("objects_swept", bucket=self.bucket, store="s3", leftovers=gone)
        return gone


class _Missing(Exception):
    """S3 answered 404 / NoSuchKey (internal: the public methods answer NotFound or None)."""


def _now() -> float:
    return time.time()
