"""The NATS object store on a three-member R3 cluster: files go on with one member down.

Reference "Files are the exception": on the nats backend the files' copies
follow ``stream.replicas`` with the logs' quorum arithmetic — three members
at three replicas keep writing files with one down. Here the member that
leads the bucket's stream is stopped (the worst one to lose: its stream
elects a new leader, ~6 s without writes, DESIGN §4), and a put and a read
on each of the two clients must still succeed within a bounded deadline.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import nats
import pytest

from crewlet.objects import open_store

pytestmark = pytest.mark.fleet

BUCKET = "files"
SETTLE = 30.0               # s: the fresh cluster's first stream
AFTER_LOSS = 45.0           # s: a put and a read after the leader is stopped (an election is ~6 s)
MiB = 1024 * 1024


async def _connect(urls: list[str]):
    # Every member listed, reconnecting for ever: the client whose member is
    # stopped carries on on another.
    return await nats.connect(servers=urls, connect_timeout=2, reconnect_time_wait=0.2,
                              max_reconnect_attempts=-1)


async def _first_store(nc, deadline: float):
    """The store, ensured: a fresh cluster may refuse its first stream a moment."""
    while True:
        try:
            return await open_store("nats", js=nc.jetstream(timeout=2), nc=nc, bucket=BUCKET, replicas=3)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def test_files_survive_one_member_down(nats_cluster):
    urls = [s.url for s in nats_cluster]

    async def main():
        a_nc = await _connect(urls)
        b_nc = await _connect(list(reversed(urls)))
        try:
            a = await _first_store(a_nc, time.monotonic() + SETTLE)
            b = await _first_store(b_nc, time.monotonic() + SETTLE)
            info = await a_nc.jetstream(timeout=2).stream_info(a.stream)
            assert info.config.num_replicas == 3

            before = os.urandom(3 * MiB + 12345)
            put = await a.put("before/one.bin", before, max_bytes=len(before))
            assert put.digest == "sha256=" + hashlib.sha256(before).hexdigest()
            assert await b.read("before/one.bin", max_bytes=len(before)) == before

            # Stop the member leading the bucket's stream.
            leader = (await a_nc.jetstream(timeout=2).stream_info(a.stream)).cluster.leader
            victim = next(s for s in nats_cluster if s.name == leader)
            victim.stop()
            stopped = time.monotonic()

            async def after_loss(store, other, name: str) -> None:
                data = os.urandom(2 * MiB + 777)
                await store.put(name, data, max_bytes=len(data))
                assert await other.read(name, max_bytes=len(data)) == data
                assert await store.read("before/one.bin", max_bytes=len(before)) == before

            await asyncio.wait_for(asyncio.gather(after_loss(a, b, "after/a.bin"), after_loss(b, a, "after/b.bin")),
                                   AFTER_LOSS)
            took = time.monotonic() - stopped
            names = sorted([i.name async for i in a.names()])
            assert names == ["after/a.bin", "after/b.bin", "before/one.bin"], names
            await b.delete("before/one.bin")
            assert await a.info("before/one.bin") is None
            print(f"puts and reads with leader {leader} stopped: done {took:.1f}s after the stop")
        finally:
            await a_nc.close()
            await b_nc.close()

    asyncio.run(asyncio.wait_for(main(), SETTLE * 2 + AFTER_LOSS + 30))
