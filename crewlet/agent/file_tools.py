"""The seat tools over the company's files: write a text file, read one.

==========  =================================================================
file_write  store UTF-8 text as a file of a project (a new version when the
            path had one), then its row, under the seat's fencing token
file_read   a file's text (cut past :data:`READ_SHOWN` bytes, saying so); a
            binary file is described, not shown (size, type, sha256)
==========  =================================================================

A file is a row of the estate naming its bytes in the fleet's file store
(:mod:`crewlet.objects.files`): the bytes go first, into a new object, then
the row through the seat's own estate write path
(:func:`crewlet.agent.estate_tools.write`: op id ``<seat>:file.register:<call
key>``, fenced by the seat's token). A redone turn stores the bytes again but
its row write lands once and answers the first outcome (the second object is
the collector's, as is a file's whose row write failed).

What the tools need on the :class:`~crewlet.agent.tools.ToolContext`'s
``services``, beside the estate tools' ``estate`` and ``node``: ``files``, the
node's ``files:`` section (:class:`crewlet.config.model.FilesSection`), and
the process's broker connection as ``nc`` and ``js`` (the ``nats`` store's
way in; optional ``replicas``). The store is made from them once per process,
on the first call (:func:`store`). Without them both tools say files are not
available on this node.
"""

from __future__ import annotations

import functools
from typing import Any

from crewlet.agent.estate_tools import read, when, write
from crewlet.agent.tools import Tool, ToolContext, ToolError
from crewlet.estate import ops
from crewlet.objects.base import NotFound, ObjectStore, ObjectStoreError, TooLarge, Unavailable
from crewlet.objects.files import open_file, row_refused, store_of, upload

# The most a file_write stores, in bytes of UTF-8 (files.max_bytes if smaller):
# what a model writes in one call; larger files come through the API.
WRITE_MAX = 1024 * 1024
# The most of a file file_read shows, in bytes: more than a turn should swallow whole.
READ_SHOWN = 64 * 1024
TEXT_PLAIN = "text/plain; charset=utf-8"

# (store identity, id(js)) -> (js, store): one store per process and connection.
# The js is held so its id is not reused by another while the store is cached.
_stores: dict[tuple[str, int], tuple[Any, ObjectStore]] = {}


def store(ctx: ToolContext) -> tuple[ObjectStore, Any]:
    """The file store and the ``files:`` section the seat's process reaches;
    ToolError when it was given neither."""
    services = ctx.services
    files = getattr(services, "files", None)
    js, nc = getattr(services, "js", None), getattr(services, "nc", None)
    if files is None or (files.store == "nats" and js is None):
        raise ToolError("files are not available on this node (its seats process has no file store)")
    key = (files.identity(), id(js))
    cached = _stores.get(key)
    if cached is None or cached[0] is not js:
        made = store_of(files, js=js, nc=nc, replicas=getattr(services, "replicas", 1))
        cached = _stores[key] = (js, made)
    return cached[1], files


def _check(project: str, path: str, content_type: str | None) -> None:
    """ToolError unless a row for *project*/*path* could be written: said
    before a byte is stored, by the op's own rules."""
    why = row_refused(project, path, content_type)
    if why is not None:
        raise ToolError(f"invalid arguments: {why}")


def _where(args: dict[str, Any]) -> str:
    return f"{args['project']}/{args['path']}"


async def _file_write(ctx: ToolContext, args: dict[str, Any]) -> str:
    project, path = args["project"], args["path"]
    content_type = args.get("content_type") or TEXT_PLAIN
    _check(project, path, content_type)
    objects, files = store(ctx)
    data = args["text"].encode("utf-8", errors="replace")
    limit = min(WRITE_MAX, files.max_bytes)
    if len(data) > limit:
        raise ToolError(f"the text is {len(data):,} bytes of UTF-8; file_write takes at most {limit:,}")

    async def register(row_args: dict[str, Any]) -> dict[str, Any]:
        result = await write(ctx, "file.register", row_args,
                             check=f"check with file_read {project} {path} whether it holds your text")
        return result.get("file") or {}

    try:
        row = await upload(objects, project=project, path=path, source=data, max_bytes=limit,
                           register=register, content_type=content_type)
    except TooLarge:
        raise ToolError(f"the text is larger than {limit:,} bytes; nothing was stored") from None
    except Unavailable as exc:
        raise ToolError(f"the file store is unavailable ({exc}); nothing was recorded, try again later") from None
    except ObjectStoreError as exc:
        raise ToolError(f"the file store failed ({exc}); nothing was recorded") from None
    return (f"wrote {_where(args)} (version {row.get('version')}, {row.get('size')} bytes, "
            f"sha256 {row.get('sha256')})")


def _is_text(head: bytes, cut: bool) -> bool:
    """Does *head* (a file's first bytes; *cut*: more follow) read as UTF-8 text?"""
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
        return True
    except UnicodeDecodeError as exc:
        # A character split by the cut is still text.
        return cut and exc.start >= len(head) - 3 and exc.reason == "unexpected end of data"


async def _file_read(ctx: ToolContext, args: dict[str, Any]) -> str:
    project, path = args["project"], args["path"]
    objects, _ = store(ctx)
    row = (await read(ctx, "file.get", {"project": project, "path": path})).get("file")
    if not row:
        raise ToolError(f"no file {path} in project {project}")
    head = bytearray()
    try:
        async with await open_file(objects, row) as reader:
            size = reader.info.size
            async for chunk in reader:
                head += chunk
                if len(head) > READ_SHOWN:
                    break
    except NotFound:
        raise ToolError(f"{_where(args)} is recorded, but its bytes are not in the file store") from None
    except Unavailable as exc:
        raise ToolError(f"the file store is unavailable ({exc}); try again later") from None
    except ObjectStoreError as exc:
        raise ToolError(f"{_where(args)} could not be read: {exc}") from None
    cut = size > READ_SHOWN
    shown = bytes(head[:READ_SHOWN])
    about = (f"{_where(args)} · version {row.get('version')} · {size:,} bytes · "
             f"{row.get('content_type') or 'no content type'} · by {row.get('registered_by')} "
             f"{when(row.get('registered_at'))}")
    if not _is_text(shown, cut):
        return f"{about}\nbinary, not shown (sha256 {row.get('sha256')})"
    text = shown.decode("utf-8", errors="ignore" if cut else "strict")
    if cut:
        text += f"\n… (cut: showing the first {READ_SHOWN:,} of {size:,} bytes)"
    return f"{about}\n\n{text}"


def file_tools() -> list[Tool]:
    """The file tools (:data:`FILE_TOOL_NAMES`)."""
    return list(_made())


@functools.lru_cache(maxsize=1)
def _made() -> tuple[Tool, ...]:
    project = ops.KINDS["file.register"].schema["properties"]["project"]
    path = ops.KINDS["file.register"].schema["properties"]["path"]
    content_type = ops.KINDS["file.register"].schema["properties"]["content_type"]
    return (
        Tool("file_write", f"Write a text file of a project (UTF-8, at most {WRITE_MAX // 1024} KiB); "
                           "writing a path again makes a new version. Everyone in the company can read it.",
             {"type": "object",
              "properties": {"project": {**project, "description": "the project it belongs to, e.g. website"},
                             "path": {**path, "description": "its path in the project, e.g. docs/plan.md"},
                             "text": {"type": "string", "maxLength": WRITE_MAX,
                                      "description": "the whole file"},
                             "content_type": {**content_type,
                                              "description": f"e.g. text/markdown (default {TEXT_PLAIN})"}},
              "required": ["project", "path", "text"], "additionalProperties": False},
             _file_write),
        Tool("file_read", f"Read a file of a project: its text (the first {READ_SHOWN // 1024} KiB), "
                          "or what it is when it is not text.",
             {"type": "object",
              "properties": {"project": {**project, "description": "the project"},
                             "path": {**path, "description": "the file's path in the project"}},
              "required": ["project", "path"], "additionalProperties": False},
             _file_read),
    )


FILE_TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in _made())
