"""A company's files: one object store the whole fleet shares (DESIGN §4, reference "Files are the exception").

The content of files grows without bound, so it is in no data node's copy:
each upload is one object in one store every node reaches directly. The row
naming a file is an ordinary replicated row; only the bytes come from here.

How the pieces are used::

    store = await open_store("nats", js=js, nc=nc, replicas=3)     # or "s3", bucket=..., endpoint_url=...
    fleet_slot = store.identity()                  # "nats:files": recorded in the objects slot,
                                                   # a node configured otherwise refuses to boot
    info = await store.put("proj/7/report.pdf", upload, max_bytes=limit)   # streams; TooLarge leaves nothing
    async with await store.open("proj/7/report.pdf") as reader:           # NotFound when missing
        async for chunk in reader:                 # streamed; the sha256 is checked at the end
            ...
    await store.delete("proj/7/report.pdf")        # idempotent
    async for info in store.names(): ...           # the collector's walk (name, size, digest, created)
    await store.sweep(older_than=3600)             # what writers killed mid-upload left

* ``put``'s source is bytes, a binary file (plain, or with a coroutine
  ``read`` like Starlette's ``UploadFile``) or an (async) iterable of chunks.
* Names are path-like, ≤ 255 bytes of UTF-8, no NUL, no leading ``/``, no
  ``..`` segment (:func:`check_name`, ``ValueError`` saying why).
* :class:`Unavailable` is the one error worth retrying: the store did not
  answer in time, or cannot write now (no quorum).

Modules:

* :mod:`crewlet.objects.base` — the interface every backend implements, and its types
* :mod:`crewlet.objects.nats` — the default backend: a JetStream object store bucket
  (ADR-20 wire format) on the fleet's own broker, replicas following ``stream.replicas``
* :mod:`crewlet.objects.s3` — S3 and S3-compatible stores, through boto3 (the ``s3`` extra)
* :mod:`crewlet.objects.conformance` — the ONE behaviour suite every backend runs
"""

from __future__ import annotations

from typing import Any

from crewlet.objects.base import (NAME_MAX_BYTES, NotFound, ObjectInfo, ObjectReader, ObjectStore,
                                  ObjectStoreError, TooLarge, Unavailable, check_name)

KINDS = ("nats", "s3")


async def open_store(kind: str, **settings: Any) -> ObjectStore:
    """A ready store of *kind* (``nats`` | ``s3``), its bucket ensured.

    ``nats``: ``js``, ``nc``, and optionally ``bucket`` (``files``), ``replicas``
    (the fleet's ``stream.replicas``). ``s3``: ``bucket``, and optionally
    ``endpoint_url``, ``region``, ``access_key``, ``secret_key``, ``part_size``.
    """
    if kind == "nats":
        from crewlet.objects.nats import NatsObjectStore as make
    elif kind == "s3":
        from crewlet.objects.s3 import S3ObjectStore as make     # imports boto3: only when asked for
    else:
        raise ValueError(f"unknown object store {kind!r}: one of {', '.join(KINDS)}")
    store = make(**settings)
    try:
        await store.ensure()
    except BaseException:
        await store.close()
        raise
    return store


__all__ = ["KINDS", "NAME_MAX_BYTES", "NotFound", "ObjectInfo", "ObjectReader", "ObjectStore", "ObjectStoreError",
           "TooLarge", "Unavailable", "check_name", "open_store"]
