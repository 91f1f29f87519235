"""The ONE conformance suite every object store backend runs.

It asserts what the files feature rests on — bytes come back as they went in,
with their sha256, whatever their size and whichever client reads them; a
put replaces an object whole; an object over its limit leaves nothing; a
delete is idempotent; the collector's listing sees every object with its
size, digest and age; names are checked alike everywhere — and it asserts no
timing (that is ``bench/objects.py``'s business).

A backend is checked through a **factory**: ``factory()`` is an async context
manager yielding two independent :class:`ObjectStore` handles — two clients,
as two nodes would hold them — on the same store, ensured. The store may hold
other objects (a shared broker's leftovers): every check names its own under
a prefix of its own.

Each check is ``async def check(factory) -> None`` raising ``AssertionError``;
:data:`CHECKS` lists them as ``(name, check)`` for a test runner to parametrize.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time
import uuid
from contextlib import AbstractAsyncContextManager
from typing import AsyncIterator, Awaitable, Callable

from crewlet.objects.base import NAME_MAX_BYTES, NotFound, ObjectInfo, ObjectStore, TooLarge

Factory = Callable[[], AbstractAsyncContextManager[tuple[ObjectStore, ObjectStore]]]

MiB = 1024 * 1024
BIG = 3 * MiB + MiB // 2        # many NATS chunks; one S3 part
OVER_A_PART = 10 * MiB          # more than one S3 part of 8 MiB: a multipart upload
NO_LIMIT = 1 << 40
CLOCK_SLACK = 5.0               # s: how far a store's clock and ours may differ


def _prefix(check: str) -> str:
    """A name prefix of its own per run, so a shared store's leftovers never interfere."""
    return f"conf/{check}-{uuid.uuid4().hex[:8]}/"


def _digest(data: bytes) -> str:
    return "sha256=" + hashlib.sha256(data).hexdigest()


async def _pieces(data: bytes, sizes: tuple[int, ...] = (1, 1000, 70_000, 333_333)) -> AsyncIterator[bytes]:
    """*data* as an async source of uneven chunks (none a backend's own size)."""
    at, i = 0, 0
    while at < len(data):
        size = sizes[i % len(sizes)]
        yield data[at:at + size]
        at, i = at + size, i + 1
        await asyncio.sleep(0)


async def _read_all(store: ObjectStore, name: str) -> tuple[ObjectInfo, bytes]:
    async with await store.open(name) as reader:
        data = b"".join([chunk async for chunk in reader])
    return reader.info, data


def _assert_info(info: ObjectInfo | None, name: str, data: bytes, since: float) -> None:
    assert info is not None, f"no info for {name!r}"
    assert (info.name, info.size, info.digest) == (name, len(data), _digest(data)), info
    assert since - CLOCK_SLACK <= info.created <= time.time() + CLOCK_SLACK, (info.created, since)


# --------------------------------------------------------------------------- 1

async def check_round_trip(factory: Factory) -> None:
    """Empty, one-byte and multi-chunk objects, from every kind of source, read
    back by the other client byte for byte, with their size and digest."""
    async with factory() as (a, b):
        p = _prefix("round")
        since = time.time()
        big = os.urandom(BIG)
        cases = {f"{p}empty": (b"", b""), f"{p}one": (b"x", b"x"),
                 f"{p}big-bytes": (big, big), f"{p}big-file": (io.BytesIO(big), big),
                 f"{p}big-pieces": (_pieces(big), big), f"{p}big-list": ([big[:5], big[5:]], big),
                 f"{p}deep/path/ünïcode name.txt": (b"hello", b"hello")}
        for name, (source, data) in cases.items():
            stored = await a.put(name, source, max_bytes=len(data))     # exactly the limit is allowed
            _assert_info(stored, name, data, since)
        for name, (_, data) in cases.items():
            info, got = await _read_all(b, name)
            assert got == data, f"{name!r} read back {len(got)} bytes, not the {len(data)} put"
            _assert_info(info, name, data, since)
            _assert_info(await b.info(name), name, data, since)
            assert await b.read(name, max_bytes=len(data)) == data
        # Chunks come as they stream, not the whole object at once.
        async with await b.open(f"{p}big-bytes") as reader:
            sizes = [len(chunk) async for chunk in reader]
        assert len(sizes) > 1 and max(sizes) < BIG, sizes
        try:
            await b.read(f"{p}big-bytes", max_bytes=BIG - 1)
            raise AssertionError("read() of an object over its max_bytes answered")
        except TooLarge as exc:
            assert exc.limit == BIG - 1


# --------------------------------------------------------------------------- 2

async def check_overwrite(factory: Factory) -> None:
    """A put replaces an object whole: big by small, small by big, by another client."""
    async with factory() as (a, b):
        name = _prefix("overwrite") + "doc"
        first, second, third = os.urandom(BIG), b"small", os.urandom(BIG // 3)
        await a.put(name, first, max_bytes=NO_LIMIT)
        await b.put(name, second, max_bytes=NO_LIMIT)
        info, got = await _read_all(a, name)
        assert got == second and info.size == len(second) and info.digest == _digest(second)
        await a.put(name, _pieces(third), max_bytes=NO_LIMIT)
        assert (await _read_all(b, name))[1] == third
        assert (await b.info(name)).digest == _digest(third)
        listed = [i async for i in a.names() if i.name == name]
        assert [(i.size, i.digest) for i in listed] == [(len(third), _digest(third))], listed


# --------------------------------------------------------------------------- 3

async def check_delete_is_idempotent(factory: Factory) -> None:
    """A deleted object is gone for both clients; deleting it again, or one that
    never was, is no error; its name can be used again."""
    async with factory() as (a, b):
        p = _prefix("delete")
        await a.put(p + "gone", os.urandom(BIG), max_bytes=NO_LIMIT)
        await b.delete(p + "gone")
        assert await a.info(p + "gone") is None
        try:
            await a.open(p + "gone")
            raise AssertionError("a deleted object opened")
        except NotFound as exc:
            assert exc.name == p + "gone"
        await a.delete(p + "gone")
        await b.delete(p + "never-was")
        assert p + "gone" not in [i.name async for i in a.names()]
        await b.put(p + "gone", b"again", max_bytes=NO_LIMIT)
        assert (await _read_all(a, p + "gone"))[1] == b"again"


# --------------------------------------------------------------------------- 4

async def check_names_lists_all(factory: Factory) -> None:
    """names() lists every object — size, digest, created — and no deleted one."""
    async with factory() as (a, b):
        p = _prefix("names")
        since = time.time()
        objects = {f"{p}{i}/f.bin": os.urandom(i * 70_001) for i in range(6)}
        for name, data in objects.items():
            await (a if len(name) % 2 else b).put(name, data, max_bytes=NO_LIMIT)
        await a.delete(f"{p}5/f.bin")
        del objects[f"{p}5/f.bin"]
        listed = {i.name: i async for i in b.names() if i.name.startswith(p)}
        assert sorted(listed) == sorted(objects), sorted(listed)
        for name, data in objects.items():
            _assert_info(listed[name], name, data, since)


# --------------------------------------------------------------------------- 5

async def check_too_large_leaves_nothing(factory: Factory) -> None:
    """A source over max_bytes raises TooLarge (carrying the limit) and leaves no
    object, whether it ran over in its first chunk or after many; an object that
    held the name before stays as it was."""
    async with factory() as (a, b):
        p = _prefix("large")
        for name, data, limit in ((p + "small", b"12345", 4), (p + "chunks", os.urandom(BIG), BIG - 1),
                                  (p + "parts", os.urandom(OVER_A_PART), OVER_A_PART - MiB),
                                  (p + "zero", b"x", 0)):
            try:
                await a.put(name, _pieces(data), max_bytes=limit)
                raise AssertionError(f"{len(data)} bytes stored under a limit of {limit}")
            except TooLarge as exc:
                assert (exc.limit, exc.name) == (limit, name)
            assert await b.info(name) is None, f"{name!r} left behind"
            try:
                await b.open(name)
                raise AssertionError(f"{name!r} left behind")
            except NotFound:
                pass
        kept = p + "kept"
        await a.put(kept, b"old", max_bytes=NO_LIMIT)
        try:
            await b.put(kept, os.urandom(BIG), max_bytes=MiB)
            raise AssertionError("stored over the limit")
        except TooLarge:
            pass
        assert (await _read_all(a, kept))[1] == b"old"
        assert [i.name async for i in a.names() if i.name.startswith(p)] == [kept]
        assert await a.sweep(older_than=3600) == 0, "sweep took what a TooLarge should have cleaned"


# --------------------------------------------------------------------------- 6

async def check_not_found(factory: Factory) -> None:
    """A missing object: open raises NotFound, info answers None, read raises NotFound."""
    async with factory() as (a, _):
        name = _prefix("missing") + "nothing"
        assert await a.info(name) is None
        for call in (lambda: a.open(name), lambda: a.read(name, max_bytes=10)):
            try:
                await call()
                raise AssertionError("a missing object answered")
            except NotFound as exc:
                assert exc.name == name


# --------------------------------------------------------------------------- 7

BAD_NAMES = ("", "/abs", "..", "a/../b", "a/..", "nul\0byte", "x" * (NAME_MAX_BYTES + 1),
             "é" * (NAME_MAX_BYTES // 2 + 1))


async def check_invalid_names_refused(factory: Factory) -> None:
    """Every operation refuses a bad name with ValueError, before touching the
    store; the longest good name works."""
    async with factory() as (a, _):
        for bad in BAD_NAMES:
            for call in (lambda: a.put(bad, b"x", max_bytes=10), lambda: a.open(bad),
                         lambda: a.info(bad), lambda: a.delete(bad)):
                try:
                    await call()
                    raise AssertionError(f"bad name {bad[:40]!r} taken")
                except ValueError as exc:
                    assert str(exc), "a refusal must say why"
        longest = _prefix("names")
        longest += "n" * (NAME_MAX_BYTES - len(longest))
        for good in (longest, _prefix("ok") + "a..b/.hidden/x y"):
            await a.put(good, b"ok", max_bytes=2)
            assert await a.read(good, max_bytes=2) == b"ok"
            await a.delete(good)
        try:
            await a.put(_prefix("limit"), b"x", max_bytes=-1)
            raise AssertionError("a negative max_bytes taken")
        except ValueError:
            pass


# --------------------------------------------------------------------------- 8

async def check_concurrent_puts(factory: Factory) -> None:
    """Puts of different names at once, from both clients, each reads back as
    its own; so do reads at once; a reader closed half way leaves nothing stuck."""
    async with factory() as (a, b):
        p = _prefix("concurrent")
        objects = {f"{p}{i}": os.urandom(MiB + i * 4099) for i in range(8)}
        await asyncio.gather(*((a if i % 2 else b).put(name, _pieces(data), max_bytes=NO_LIMIT)
                               for i, (name, data) in enumerate(objects.items())))
        got = await asyncio.gather(*(_read_all(b if i % 2 else a, name) for i, name in enumerate(objects)))
        for (name, data), (info, back) in zip(objects.items(), got):
            assert back == data and info.digest == _digest(data), name
        name = next(iter(objects))
        async with await a.open(name) as reader:
            async for _ in reader:
                break
        assert (await _read_all(a, name))[1] == objects[name]


# --------------------------------------------------------------------------- 9

async def check_identity(factory: Factory) -> None:
    """Two handles on one store name it alike, with no secret in it."""
    async with factory() as (a, b):
        assert a.identity() == b.identity() and ":" in a.identity()
        assert "secret" not in a.identity().lower()


CHECKS: list[tuple[str, Callable[[Factory], Awaitable[None]]]] = [
    ("round_trip", check_round_trip),
    ("overwrite", check_overwrite),
    ("delete_is_idempotent", check_delete_is_idempotent),
    ("names_lists_all", check_names_lists_all),
    ("too_large_leaves_nothing", check_too_large_leaves_nothing),
    ("not_found", check_not_found),
    ("invalid_names_refused", check_invalid_names_refused),
    ("concurrent_puts", check_concurrent_puts),
    ("identity", check_identity),
]
