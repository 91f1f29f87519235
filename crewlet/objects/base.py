"""The object store interface: what a store of a company's files promises, whoever implements it.

A company's files are the one thing not held in the data nodes' copies
(reference "Files are the exception"): each upload is one object in one
store the whole fleet shares. A store is one :class:`ObjectStore` per process
(it holds the connection or client). Every operation names an object by a
path-like *name* (:func:`check_name`); what the object is *for* is the business
of the row that names it, not of the store.

* ``put`` streams: an object is never held whole in memory, and one larger
  than the caller's ``max_bytes`` raises :class:`TooLarge` and leaves nothing
  behind (a name that held an object keeps the old one). A put replaces an
  object whole: a reader sees the old bytes or the new, never a mix.
* ``open`` answers an :class:`ObjectReader`, an async iterator of chunks that
  checks the object's sha256 at its end (a mismatch raises
  :class:`ObjectStoreError`, never a short file passed off as whole).
* ``names`` lists everything (the collector's walk), ``sweep`` removes what
  writers that died mid-upload left behind, ``identity`` names the store so
  the fleet can refuse a node configured with another (the ``objects`` slot).

The behaviour every backend owes is held by :mod:`crewlet.objects.conformance`;
timings are the business of ``bench/objects.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable

# The longest object name, in UTF-8 bytes: what S3 and most filesystems take
# as one path component's worth, and well under S3's 1,024-byte key limit, so a
# key prefix or a base64 form (the NATS meta subject, 4/3 as long) still fits.
NAME_MAX_BYTES = 255

# Bytes read from a file-like source at a time. The backends cut what they
# write to their own sizes (a NATS chunk, an S3 part) whatever comes in.
READ_SIZE = 1024 * 1024

DIGEST_PREFIX = "sha256="


class ObjectStoreError(Exception):
    """The store refused or failed an operation (a digest mismatch, a bad bucket, …)."""


class NotFound(ObjectStoreError):
    """No object of that name."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"no object {name!r}")


class TooLarge(ObjectStoreError):
    """The source held more than the caller's limit; nothing was stored."""

    def __init__(self, name: str, limit: int):
        self.name, self.limit = name, limit
        super().__init__(f"object {name!r} is larger than its limit of {limit:,} bytes")


class Unavailable(ObjectStoreError):
    """The store could not be reached, or cannot write now (no quorum, an
    election that outlasted our patience): the same call may work later."""


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object."""

    name: str
    size: int               # bytes
    digest: str | None      # "sha256=<hex>"; None for an object some other writer stored without one
    created: float          # epoch seconds it was stored, by the store's clock where it keeps one


def check_name(name: str) -> str:
    """*name*, if it may name an object; ``ValueError`` saying why otherwise.

    Path-like (``project/7/report.pdf``) and otherwise free, because it is the
    callers' to choose: not empty, at most :data:`NAME_MAX_BYTES` bytes of
    UTF-8, no NUL (C strings, S3 and filesystems cut there), no leading ``/``
    and no ``..`` segment (an object name ends up in URLs and paths, where
    those escape what the name meant).
    """
    if not isinstance(name, str):
        raise ValueError(f"an object name is a str, not {type(name).__name__}")
    if not name:
        raise ValueError("an object name may not be empty")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"object name {name!r} is not valid unicode (a lone surrogate)") from None
    if size > NAME_MAX_BYTES:
        raise ValueError(f"object name is {size} bytes of UTF-8; at most {NAME_MAX_BYTES}")
    if "\0" in name:
        raise ValueError(f"object name {name!r} holds a NUL")
    if name.startswith("/"):
        raise ValueError(f"object name {name!r} starts with '/'")
    if ".." in name.split("/"):
        raise ValueError(f"object name {name!r} has a '..' segment")
    return name


def identity_of(kind: str, bucket: str, endpoint: str | None = None) -> str:
    """Which store this is, as the fleet's ``objects`` slot records it:
    ``nats:<bucket>`` or ``s3:<endpoint, or aws>/<bucket>``. The config's
    view of a store and the store's own :meth:`ObjectStore.identity` both
    say it through here, so they compare equal."""
    if kind == "nats":
        return f"nats:{bucket}"
    return f"{kind}:{(endpoint or 'aws').rstrip('/').lower()}/{bucket}"


def digest_of(sha256_hex: str) -> str:
    return DIGEST_PREFIX + sha256_hex


# ---------------------------------------------------------------- sources

Source = bytes | bytearray | memoryview | AsyncIterable[bytes] | Iterable[bytes] | Any
"""What ``put`` takes: bytes, an async (or plain) iterable of bytes chunks, or
a binary file object (its ``read(n)`` plain or a coroutine, as Starlette's
``UploadFile``'s is)."""


async def chunks_of(source: Source, read_size: int = READ_SIZE) -> AsyncIterator[bytes]:
    """*source* as an async iterator of bytes chunks of whatever size it gives.

    A plain file is read in a thread (a disk read must not stall the event
    loop), *read_size* bytes at a time; nothing is read ahead of the consumer.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source):
            yield bytes(source)
        return
    read = getattr(source, "read", None)
    if callable(read):
        asynchronous = inspect.iscoroutinefunction(read)
        while True:
            block = await read(read_size) if asynchronous else await asyncio.to_thread(read, read_size)
            if not block:
                return
            yield bytes(block)
    if hasattr(source, "__aiter__"):
        async for block in source:
            if block:
                yield bytes(block)
        return
    if hasattr(source, "__iter__"):
        for block in source:
            if block:
                yield bytes(block)
        return
    raise TypeError(f"cannot put a {type(source).__name__}: give bytes, a binary file or an "
                    f"(async) iterable of bytes")


async def rechunk(chunks: AsyncIterable[bytes], size: int) -> AsyncIterator[bytes]:
    """*chunks* cut to blocks of exactly *size* bytes, the last one shorter.

    Holds at most one block: a 100 MiB chunk in is sliced, not copied whole
    again and again.
    """
    pending = bytearray()
    async for chunk in chunks:
        view, at = memoryview(chunk), 0
        if pending:
            at = size - len(pending)
            pending += view[:at]
            if len(pending) < size:
                continue
            yield bytes(pending)
            pending = bytearray()
        while len(view) - at >= size:
            yield bytes(view[at:at + size])
            at += size
        pending += view[at:]
    if pending:
        yield bytes(pending)


# ---------------------------------------------------------------- reading

class ObjectReader:
    """An open object: its :class:`ObjectInfo` and its bytes as an async
    iterator of chunks, in order. Checks the digest after the last chunk.

    Close it if you stop before the end (``async with`` does): the backend
    holds a subscription or a connection for it until then.
    """

    def __init__(self, info: ObjectInfo, chunks: AsyncIterator[bytes]):
        self.info = info
        self._chunks = chunks

    def __aiter__(self) -> "ObjectReader":
        return self

    async def __anext__(self) -> bytes:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> "ObjectReader":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


# ---------------------------------------------------------------- the store

class ObjectStore(ABC):
    """A store of objects shared by the whole fleet.

    The public methods check names and adapt sources once, here; a backend
    implements the underscored ones and may assume both done.
    """

    async def ensure(self) -> None:
        """Make (or find) what the store needs (a bucket); idempotent, never recreates."""

    async def close(self) -> None:
        """Let go of what this handle holds (not the connection it was given)."""

    @abstractmethod
    def identity(self) -> str:
        """A stable string naming which store this is: two handles on the same
        store answer the same, on another store another (``nats:<bucket>``,
        ``s3:<endpoint>/<bucket>``); never secrets."""

    async def put(self, name: str, source: Source, *, max_bytes: int) -> ObjectInfo:
        """Store *source* as object *name*, replacing any object of that name.

        Streams, never holding the whole object; more than *max_bytes* bytes
        raises :class:`TooLarge`, leaving nothing of it behind (an object of
        that name before stays as it was)."""
        check_name(name)
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be a whole number of bytes ≥ 0, not {max_bytes!r}")
        return await self._put(name, chunks_of(source), max_bytes)

    async def open(self, name: str) -> ObjectReader:
        """Object *name* to be read as it streams; :class:`NotFound` when there is none."""
        return await self._open(check_name(name))

    async def read(self, name: str, *, max_bytes: int) -> bytes:
        """All of object *name* in memory, for small ones: :class:`TooLarge`
        above *max_bytes* (checked before reading)."""
        async with await self.open(name) as reader:
            if reader.info.size > max_bytes:
                raise TooLarge(name, max_bytes)
            return b"".join([chunk async for chunk in reader])

    async def info(self, name: str) -> ObjectInfo | None:
        """Object *name*'s info, None when there is none."""
        return await self._info(check_name(name))

    async def delete(self, name: str) -> None:
        """Delete object *name*; nothing to do when there is none."""
        await self._delete(check_name(name))

    @abstractmethod
    def names(self) -> AsyncIterator[ObjectInfo]:
        """Every object in the store, in no promised order (the collector's
        walk: it compares them with the rows that name files, and spares
        what is younger than its grace by ``created``)."""

    @abstractmethod
    async def sweep(self, older_than: float) -> int:
        """Remove what puts that never finished left behind (a writer killed
        mid-upload) whose last write is over *older_than* seconds old; how
        many leftovers went. Never touches a stored object. *older_than* must
        exceed the longest pause of a live upload."""

    @abstractmethod
    async def _put(self, name: str, chunks: AsyncIterator[bytes], max_bytes: int) -> ObjectInfo: ...

    @abstractmethod
    async def _open(self, name: str) -> ObjectReader: ...

    @abstractmethod
    async def _info(self, name: str) -> ObjectInfo | None: ...

    @abstractmethod
    async def _delete(self, name: str) -> None: ...


async def call_until(deadline: float, call: Callable[[], Awaitable[Any]], retryable: tuple[type[BaseException], ...],
                     what: str, pause: float = 0.1, pause_max: float = 1.0) -> Any:
    """``await call()``, again after a pause (doubling to *pause_max*) while
    it raises one of *retryable*, until the monotonic *deadline*: then
    :class:`Unavailable` naming *what*."""
    while True:
        try:
            return await call()
        except retryable as exc:
            why = exc
        if time.monotonic() + pause >= deadline:
            raise Unavailable(f"{what}: no answer in time ({type(why).__name__}: {why})") from why
        await asyncio.sleep(pause)
        pause = min(pause * 2, pause_max)
