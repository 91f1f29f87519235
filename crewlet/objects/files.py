"""A company's files: the row in the estate names the bytes in the store.

A file is two things (reference "Files are the exception"): its **row**, an
ordinary replicated row of the estate (``file.register``: project, path,
size, sha256, content type, ``object``), so listing is as local as any read;
and its **bytes**, one object in the store the whole fleet shares, named by
the row's ``object``. Every upload is a new object, ``files/<project>/<32
hex>``, never an overwrite: a reader holding a row reads the bytes that row
was written for, and a path uploaded again names a new object.

An upload writes the object first, then the row. So the store may hold an
object no row names — an upload whose writer died before its row landed, a
row replaced by a new upload, a file deleted — and it is the collector's
(the ``collector`` duty, roles/workers/duties/collector.py) to remove once it
is older than ``files.grace``. Never here: a row write that timed out may
still land, naming the object.

Used by the API (roles/ingress/api/files.py) and the seats' file tools
(crewlet/agent/file_tools.py), each with its own way of writing the row
(*register*: ``file.register`` args → the row, raising when refused).
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Awaitable, Callable

from crewlet.config.model import FilesSection
from crewlet.estate import ops
from crewlet.objects.base import DIGEST_PREFIX, NotFound, ObjectReader, ObjectStore, Source

# Where file objects live in the store; the collector looks nowhere else.
PREFIX = "files/"

Register = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def object_name(project: str) -> str:
    """A new object's name for an upload to *project*."""
    name = f"{PREFIX}{project}/{uuid.uuid4().hex}"
    if not re.match(ops.OBJECT, name):
        raise ValueError(f"project {project!r} cannot name files: {ops.PROJECT}")
    return name


def row_refused(project: str, path: str, content_type: str | None) -> str | None:
    """Why a file row for *project*/*path* could not be written (None: it
    could), by ``file.register``'s own rules: asked before a byte is stored."""
    args: dict[str, Any] = {"project": project, "path": path, "size": 0, "sha256": "0" * 64,
                            "object": f"{PREFIX}{project}/{'0' * 32}"}
    if content_type is not None:
        args["content_type"] = content_type
    try:
        ops.make_op("file.register", args, node="check")
    except ops.OpError as exc:
        return str(exc).replace("file.register: ", "")
    return None


def is_file_object(name: str) -> bool:
    """Is *name* a file's object (one the collector may remove)?"""
    return re.match(ops.OBJECT, name) is not None


async def upload(store: ObjectStore, *, project: str, path: str, source: Source, max_bytes: int,
                 register: Register, content_type: str | None = None) -> dict[str, Any]:
    """Stream *source* into a new object, then write the file's row through
    *register*; the row. Raises :class:`crewlet.objects.TooLarge` past
    *max_bytes* (nothing stored), what the store raised, what *register*
    raised (the object is then the collector's)."""
    name = object_name(project)
    info = await store.put(name, source, max_bytes=max_bytes)
    args: dict[str, Any] = {"project": project, "path": path, "size": info.size,
                            "sha256": (info.digest or "").removeprefix(DIGEST_PREFIX), "object": name}
    if content_type:
        args["content_type"] = content_type
    return await register(args)


async def open_file(store: ObjectStore, row: dict[str, Any]) -> ObjectReader:
    """The bytes of the file *row* names, streamed (the sha256 checked at the
    end). :class:`NotFound` for a row recorded without bytes, or whose object
    is gone."""
    name = row.get("object")
    if not name:
        raise NotFound(f"{row.get('project')}/{row.get('path')} (recorded without its bytes)")
    return await store.open(name)


def store_of(files: FilesSection, *, js=None, nc=None, replicas: int = 1) -> ObjectStore:
    """The store a node's ``files:`` section names, ready to use (its bucket
    is crewletd's to make: supervisor/fleet.py). *js*, *nc*: the role's
    broker connection (the ``nats`` store)."""
    if files.store == "nats":
        from crewlet.objects.nats import NatsObjectStore
        return NatsObjectStore(js, nc, bucket=files.bucket, replicas=replicas)
    from crewlet.objects.s3 import S3ObjectStore   # boto3: only when asked for
    return S3ObjectStore(bucket=files.bucket, endpoint_url=files.endpoint, region=files.region,
                         access_key=files.access_key, secret_key=files.secret_key())
