"""A company's files over HTTP: upload, download, delete (``/v1/files/{project}/{path}``).

A file is a row of the estate naming its bytes in the fleet's file store
(:mod:`crewlet.objects.files`); the listing, ``GET /v1/files``, is the
estate's (roles/ingress/api/estate.py). Here:

``PUT``     streams the body into a new object, then writes the row
            (``file.register``, issued by the operator): 201 with the row, 200
            when the path already had a file (the row's next version). The
            request's ``Content-Type`` is kept as the file's. The body is never
            held whole: larger than ``files.max_bytes`` is a 413, by its
            ``Content-Length`` before a byte is read or once a chunked body
            passes the limit, and nothing is stored. An ``Idempotency-Key``
            makes a retried upload register once (the retry's bytes are left
            to the collector); the same key with other bytes or another
            Content-Type is a 422 ``idempotency_key_reused``. The path is
            held to the estate's rule (ops.FILE_PATH): a 422 otherwise.
``GET``     streams the bytes back: the row's ``Content-Type``, ``Content-Length``,
            ``ETag`` (the sha256, quoted), ``Content-Disposition: attachment``
            (a safe ASCII ``filename`` and the UTF-8 ``filename*``).
            ``HEAD`` answers the same headers without opening the bytes.
``DELETE``  removes the row (``file.delete``; ``expect_version`` guards a race);
            the bytes are the collector's once no row names them.

The store is made once per process, on first use, from the node's ``files:``
section over ingress's own broker connection. It being unreachable is a 503
with ``Retry-After``, as the estate's is.
"""

from __future__ import annotations

import re
from typing import Any, AsyncIterator
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from crewlet.estate import ops
from crewlet.objects.base import NotFound, ObjectReader, ObjectStore, ObjectStoreError, TooLarge, Unavailable
from crewlet.objects.files import open_file, row_refused, store_of, upload
from roles.ingress.api.common import (INT_MAX, WRITE_WAIT, claim_key, estate, idempotency_key,
                                      idempotency_key_only, read)
from roles.ingress.api.estate import File
from roles.ingress.auth import READ, WRITE
from roles.ingress.front import Front, front
from roles.ingress.problems import Problem, responses, unavailable

router = APIRouter(prefix="/v1", tags=["files"])

OCTETS = "application/octet-stream"
# The longest content type a row keeps (file.register's content_type).
CONTENT_TYPE_MAX = ops.KINDS["file.register"].schema["properties"]["content_type"]["maxLength"]
# What a Content-Type header may be answered with: printable ASCII, no line breaks.
_HEADER_SAFE = re.compile(r"^[\x20-\x7e]+$")
# Seconds a client is told to wait before trying a store that did not answer.
RETRY_AFTER = 5

Project = Path(pattern=ops.PROJECT, description="The project: 1-100 of A-Z, a-z, 0-9, '_', '.', '-', "
                                                "starting with a letter or digit")
# The path's rule is ops.FILE_PATH, the one the estate holds every file row to
# (the same as a page path's, with a wider alphabet): documented here, checked
# by _path so a refusal says what is wrong in words (422 invalid).
FilePath = Path(min_length=1, max_length=ops.FILE_PATH_MAX,
                description=f"The file's path in its project: {ops.FILE_PATH_RULE}",
                json_schema_extra={"pattern": ops.FILE_PATH})

_BYTES = {"schema": {"type": "string", "format": "binary"}}
_UPLOAD = {"requestBody": {
    "required": False,
    "description": "The file's bytes, streamed (empty: an empty file). Any media type: the request's "
                   "Content-Type is kept as the file's, and answered when it is downloaded.",
    "content": {OCTETS: _BYTES}}}
_DOWNLOAD = {200: {"description": "The file's bytes, in the media type it was uploaded with",
                   "content": {"*/*": _BYTES}}}


# ------------------------------------------------------------------ helpers

def _store(request: Request, f: Front) -> ObjectStore:
    """This process's file store, made on first use."""
    store = getattr(request.app.state, "file_store", None)
    if store is None:
        store = store_of(f.cfg.files, js=f.js, nc=f.nc, replicas=f.cfg.stream.replicas)
        request.app.state.file_store = store
    return store


def _store_problem(exc: ObjectStoreError) -> Problem:
    """The 503 of a store that failed or could not be reached."""
    code = "store_unavailable" if isinstance(exc, Unavailable) else "store_failed"
    return unavailable(exc, code, f"the file store: {exc}", retry_after=RETRY_AFTER)


def _file_problem(why: str) -> Problem:
    """The problem of a file write the estate refused."""
    if why.startswith("no file "):
        return Problem(404, "not_found", why)
    if " is at version " in why:
        return Problem(409, "conflict", why)
    return Problem(409, "refused", why)


async def _write(f: Front, kind: str, args: dict[str, Any], key: str | None) -> dict[str, Any]:
    """Op *kind* issued by the operator through the router; its result (problems otherwise)."""
    target = f"{args['project']}/{args['path']}"
    try:
        op = ops.make_op(kind, args, node=f.node_id, id=ops.op_id("api", kind, target, key) if key else None)
    except ops.OpError as exc:
        raise Problem(422, "invalid", str(exc)) from None
    outcome = await estate(f.router.write(op, timeout=WRITE_WAIT))
    if f.metrics is not None:
        f.metrics.router("write", "ok" if outcome.get("ok") else "refused")
    if not outcome.get("ok"):
        raise _file_problem(str(outcome.get("error") or "refused"))
    return outcome.get("result") or {}


def _check(project: str, path: str, content_type: str | None) -> None:
    """422 unless a row for *project*/*path* could be written: checked before
    a byte is stored (the op's own rules, so they are said once)."""
    why = row_refused(project, path, content_type)
    if why is not None:
        raise Problem(422, "invalid", why)


def _too_large(limit: int) -> Problem:
    return Problem(413, "file_too_large", f"the file is larger than this fleet takes ({limit:,} bytes: "
                                          "files.max_bytes); nothing was stored")


async def _row(f: Front, project: str, path: str) -> dict[str, Any]:
    row = (await read(f, "file.get", {"project": project, "path": path})).get("file")
    if not row:
        raise Problem(404, "not_found", f"no file {path} in project {project}")
    return row


def _path(path: str) -> str:
    """*path*, or 422 naming what is wrong with it (the estate's rule)."""
    why = ops.path_problem(path)
    if why is not None:
        raise Problem(422, "invalid", why)
    return path


# What no downloaded name keeps: control and bidi characters (a right-to-left
# override turns "gpj.exe" into what reads "exe.jpg"), and the path separators.
_UNSAFE_NAME = re.compile(f"[{ops.UNSAFE_CHARS}/\\\\]")


def _disposition(path: str) -> str:
    """``attachment`` named by the path's last segment (RFC 6266): an ASCII
    fallback ``filename=`` — control, bidi and separator characters dropped,
    anything else outside printable ASCII, a quote or a '%' made '_' — and
    the UTF-8 name ``filename*=`` (RFC 8187), also without control and bidi
    characters. A row's path holds none of them (ops.FILE_PATH); this holds
    for any row whatever it holds."""
    name = _UNSAFE_NAME.sub("", path.rsplit("/", 1)[-1]).strip(" .") or "file"
    fallback = re.sub(r'[^\x20-\x7e]|["\\%]', "_", name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def _headers(row: dict[str, Any], size: int) -> dict[str, str]:
    return {"Content-Length": str(size), "ETag": f'"{row.get("sha256")}"',
            "Content-Disposition": _disposition(str(row.get("path") or ""))}


def _media_type(row: dict[str, Any]) -> str:
    kind = row.get("content_type")
    return kind if isinstance(kind, str) and _HEADER_SAFE.match(kind) else OCTETS


async def _streamed(reader: ObjectReader) -> AsyncIterator[bytes]:
    """The reader's chunks, the reader closed however the response ends (a
    client gone mid-download too). A digest that does not match at the end
    raises here: the connection is cut short of its Content-Length, never a
    wrong file passed off as whole."""
    try:
        async for chunk in reader:
            yield chunk
    finally:
        await reader.aclose()


# ------------------------------------------------------------------ routes

@router.put("/files/{project}/{path:path}", response_model=File, summary="Upload a file (create or replace)",
            openapi_extra=_UPLOAD,
            # 404: a path with a line break matches no route (the path convertor's "." stops there)
            responses={**responses(400, 401, 403, 404, 409, 413, 422, 503, 507),
                       201: {"model": File, "description": "Created: the path had no file"}})
async def put_file(request: Request, response: Response, project: str = Project, path: str = FilePath,
                   _=Depends(WRITE), key: str | None = Depends(idempotency_key_only)) -> File:
    f = front(request)
    _path(path)
    limit = f.cfg.files.max_bytes
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise Problem(400, "bad_request", "Content-Length is not a number")
        if int(length) > limit:
            raise _too_large(limit)
    content_type = request.headers.get("content-type") or None
    if content_type is not None and len(content_type) > CONTENT_TYPE_MAX:
        raise Problem(422, "invalid", f"Content-Type is longer than {CONTENT_TYPE_MAX} characters")
    _check(project, path, content_type)
    if f.cfg.files.store == "nats":  # the bytes land on the fleet's broker, maybe this node's disk
        f.need_space("the file was not stored")

    async def register(args: dict[str, Any]) -> dict[str, Any]:
        if key is not None:  # the key held to these bytes and this type (422 if it came with others)
            await claim_key(request, key, f"{args['sha256']}\0{content_type or ''}")
        return (await _write(f, "file.register", args, key)).get("file") or {}

    try:
        row = await upload(_store(request, f), project=project, path=path, source=request.stream(),
                           max_bytes=limit, register=register, content_type=content_type)
    except TooLarge:
        raise _too_large(limit) from None
    except ObjectStoreError as exc:
        raise _store_problem(exc) from None
    except ClientDisconnect:
        raise Problem(400, "incomplete_body", "the client went before the whole body came; nothing "
                                              "was stored") from None
    if row.get("version") == 1:
        response.status_code = 201
    return File(**row)


@router.get("/files/{project}/{path:path}", summary="Download a file", response_class=StreamingResponse,
            responses={**_DOWNLOAD, **responses(401, 403, 404, 422, 503)})
async def get_file(request: Request, project: str = Project, path: str = FilePath,
                   _=Depends(READ)) -> StreamingResponse:
    f = front(request)
    row = await _row(f, project, _path(path))
    try:
        reader = await open_file(_store(request, f), row)
    except NotFound:
        raise Problem(404, "no_bytes", f"file {path} in project {project} is recorded, but its bytes "
                                       "are not in the file store") from None
    except ObjectStoreError as exc:
        raise _store_problem(exc) from None
    return StreamingResponse(_streamed(reader), media_type=_media_type(row),
                             headers=_headers(row, reader.info.size))


@router.head("/files/{project}/{path:path}", include_in_schema=False)
async def head_file(request: Request, project: str = Project, path: str = FilePath,
                    _=Depends(READ)) -> Response:
    row = await _row(front(request), project, _path(path))
    size = row.get("size") if isinstance(row.get("size"), int) else 0
    return Response(media_type=_media_type(row), headers=_headers(row, size))


@router.delete("/files/{project}/{path:path}", status_code=204, response_class=Response,
               summary="Delete a file (its row; the bytes are collected later)",
               responses=responses(400, 401, 403, 404, 409, 422, 503))
async def delete_file(request: Request, project: str = Project, path: str = FilePath,
                      expect_version: int | None = Query(None, ge=1, le=INT_MAX,
                                                         description="Refused (409) unless the file is "
                                                                     "at this version"),
                      _=Depends(WRITE), key: str | None = Depends(idempotency_key)) -> Response:
    args: dict[str, Any] = {"project": project, "path": _path(path)}
    if expect_version is not None:
        args["expect_version"] = expect_version
    await _write(front(request), "file.delete", args, key)
    return Response(status_code=204)
