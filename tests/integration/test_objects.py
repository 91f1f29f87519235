"""The object store against real servers: the conformance suite on NATS and on S3.

Every check of :mod:`crewlet.objects.conformance` runs against a single
nats-server (the :func:`natsd` fixture) and against a real moto S3 server
this module starts on 127.0.0.1 (skipped, saying so, where boto3 or moto is
not installed). A few backend facts follow: what a put over its limit or an
overwrite leaves in the NATS stream and in the S3 bucket, that a read sees
a corrupted object as one, that sweep() takes a dead writer's leftovers and
nothing else, and that the factory dispatches by kind.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import uuid
from contextlib import asynccontextmanager

import nats
import pytest

from crewlet.objects import NotFound, ObjectStoreError, open_store
from crewlet.objects.conformance import CHECKS
from tests.conftest import free_port, wait_for

CHECKS_BY_NAME = dict(CHECKS)
DEADLINE = 120.0            # s for one whole check, connection setup included
HAVE_S3 = all(importlib.util.find_spec(m) is not None for m in ("boto3", "moto", "flask"))
NO_S3 = "boto3 and moto[server] are not installed (the s3 and test extras)"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


# ---------------------------------------------------------------- NATS

def nats_factory(url: str, bucket: str = "files", replicas: int = 1):
    @asynccontextmanager
    async def factory():
        ncs = []
        try:
            stores = []
            for _ in range(2):
                nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
                ncs.append(nc)
                stores.append(await open_store("nats", js=nc.jetstream(timeout=2), nc=nc,
                                               bucket=bucket, replicas=replicas))
            yield tuple(stores)
        finally:
            for nc in ncs:
                await nc.close()
    return factory


@pytest.mark.parametrize("name", [n for n, _ in CHECKS])
def test_conformance_nats(natsd, name):
    run(CHECKS_BY_NAME[name](nats_factory(natsd.url)))


def test_nats_leaves_no_chunks(natsd):
    """Over the limit, overwritten, deleted: the stream keeps only the live
    object's chunks and meta — no orphaned chunk subject, no delete marker."""
    async def main():
        async with nats_factory(natsd.url, bucket="tidy")() as (a, b):
            js = a.js
            await a.put("kept", os.urandom(600_000), max_bytes=1 << 30)
            await b.put("kept", os.urandom(300_000), max_bytes=1 << 30)      # replaces: old chunks purged
            with pytest.raises(Exception) as exc:
                await a.put("big", os.urandom(1_000_000), max_bytes=500_000)
            assert type(exc.value).__name__ == "TooLarge"
            await a.put("gone", b"x" * 200_000, max_bytes=1 << 30)
            await b.delete("gone")
            info = await js.stream_info("OBJ_tidy", subjects_filter=">")
            subjects = info.state.subjects or {}
            chunks = [s for s in subjects if ".C." in s]
            metas = [s for s in subjects if ".M." in s]
            assert len(chunks) == 1 and subjects[chunks[0]] == 3, subjects   # 300,000 B in 128 KiB chunks
            assert len(metas) == 1, subjects
            # The bucket is ADR-20's: nats-py's own client reads what crewlet wrote.
            obs = await js.object_store("tidy")
            assert len((await obs.get("kept")).data) == 300_000
    run(main())


def test_nats_reads_what_nats_py_wrote_and_checks_digest(natsd):
    async def main():
        async with nats_factory(natsd.url, bucket="interop")() as (a, _):
            obs = await a.js.object_store("interop")
            data = os.urandom(1_000_000)
            await obs.put("theirs", data)
            assert await a.read("theirs", max_bytes=len(data)) == data
            # A chunk changed behind the store's back: the read fails, never passes it off.
            info = await obs.get_info("theirs")
            subject = f"$O.interop.C.{info.nuid}"
            await a.js.purge_stream("OBJ_interop", subject=subject)
            for i in range(0, len(data), 128 * 1024):
                block = data[i:i + 128 * 1024]
                await a.js.publish(subject, block if i else b"\0" + block[1:])
            with pytest.raises(ObjectStoreError, match="read back"):
                await a.read("theirs", max_bytes=len(data))
    run(main())


def test_nats_sweep_takes_a_dead_writers_chunks(natsd):
    async def main():
        async with nats_factory(natsd.url, bucket="sweep")() as (a, _):
            await a.put("live", os.urandom(300_000), max_bytes=1 << 30)
            await a.js.publish("$O.sweep.C.deadwriter", b"half an upload")    # chunks, no meta
            assert await a.sweep(older_than=3600) == 0                        # young: maybe still writing
            assert await a.sweep(older_than=0) == 1
            info = await a.js.stream_info("OBJ_sweep", subjects_filter="$O.sweep.C.>")
            assert list(info.state.subjects or {}) != [] and all("deadwriter" not in s for s in info.state.subjects)
            assert len(await a.read("live", max_bytes=1 << 30)) == 300_000
    run(main())


def test_nats_ensure_is_idempotent(natsd):
    async def main():
        async with nats_factory(natsd.url, bucket="twice")() as (a, b):
            await a.put("x", b"1", max_bytes=1)
            await b.ensure()
            await a.ensure()
            assert await b.read("x", max_bytes=1) == b"1"
            assert a.identity() == "nats:twice"
    run(main())


def test_open_store_dispatches_by_kind():
    async def main():
        with pytest.raises(ValueError, match="unknown object store"):
            await open_store("ftp")
    run(main())


# ---------------------------------------------------------------- S3 (moto)

@pytest.fixture(scope="module")
def moto_s3():
    """A real moto S3 server on a free 127.0.0.1 port, stopped at the end."""
    if not HAVE_S3:
        pytest.skip(NO_S3)
    from moto.server import ThreadedMotoServer
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        import socket
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    wait_for(up, 10, what="moto listening")
    yield url
    server.stop()


S3_KEYS = {"access_key": "testing", "secret_key": "testing", "region": "us-east-1"}


def s3_factory(url: str, bucket: str):
    @asynccontextmanager
    async def factory():
        stores = []
        try:
            for _ in range(2):
                stores.append(await open_store("s3", endpoint_url=url, bucket=bucket, create_bucket=True,
                                               **S3_KEYS))
            yield tuple(stores)
        finally:
            for store in stores:
                await store.close()
    return factory


@pytest.mark.parametrize("name", [n for n, _ in CHECKS])
def test_conformance_s3(moto_s3, name):
    run(CHECKS_BY_NAME[name](s3_factory(moto_s3, f"files-{uuid.uuid4().hex[:8]}")))


def _bare_s3(url: str):
    import boto3
    return boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1")


def test_s3_leaves_no_upload_behind(moto_s3):
    """Over the limit after a part went up: the multipart upload is aborted;
    a multipart put leaves no staging key; the digest is in the object's metadata."""
    bucket = f"tidy-{uuid.uuid4().hex[:8]}"

    async def main():
        async with s3_factory(moto_s3, bucket)() as (a, _):
            with pytest.raises(Exception) as exc:
                await a.put("big", os.urandom(20 * 1024 * 1024), max_bytes=12 * 1024 * 1024)
            assert type(exc.value).__name__ == "TooLarge"
            data = os.urandom(17 * 1024 * 1024)
            info = await a.put("multi", data, max_bytes=len(data))
            assert (await a.info("multi")).digest == info.digest
            with pytest.raises(ValueError, match="this store's own"):
                await a.put(".crewlet-uploads/x", b"x", max_bytes=1)
    run(main())
    bare = _bare_s3(moto_s3)
    assert bare.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    keys = [o["Key"] for o in bare.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == ["multi"], keys
    head = bare.head_object(Bucket=bucket, Key="multi")
    assert head["ContentLength"] == 17 * 1024 * 1024 and len(head["Metadata"]["sha256"]) == 64


def test_s3_sweep_and_corruption(moto_s3):
    """sweep() aborts a dead writer's upload; a read of an object whose bytes
    do not match its digest fails; an unreachable endpoint is Unavailable."""
    bucket = f"sweep-{uuid.uuid4().hex[:8]}"

    async def main():
        async with s3_factory(moto_s3, bucket)() as (a, _):
            bare = _bare_s3(moto_s3)
            upload = bare.create_multipart_upload(Bucket=bucket, Key="somebody")["UploadId"]
            # A part written just now: the upload is young by its last part (moto
            # answers a fixed date from 2010 for when an upload was initiated).
            bare.upload_part(Bucket=bucket, Key="somebody", UploadId=upload, PartNumber=1, Body=b"half")
            assert await a.sweep(older_than=3600) == 0
            assert await a.sweep(older_than=0) == 1
            assert bare.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
            bare.put_object(Bucket=bucket, Key="forged", Body=b"abc", Metadata={"sha256": "0" * 64})
            with pytest.raises(ObjectStoreError, match="read back"):
                await a.read("forged", max_bytes=3)
            with pytest.raises(NotFound):
                await a.open("nothing")
        from crewlet.objects.s3 import S3ObjectStore
        nowhere = S3ObjectStore(endpoint_url=f"http://127.0.0.1:{free_port()}", bucket="b", **S3_KEYS)
        with pytest.raises(Exception) as exc:
            await nowhere.ensure()
        assert type(exc.value).__name__ == "Unavailable"
        await nowhere.close()
    run(main())
