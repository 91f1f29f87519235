"""The seat tools over the estate: the tracker, the knowledge base, the files.

=============  ==============================================================
task_create    open a task (title, body, status, assignee, labels, parent)
task_update    change a task's fields; ``expect_rev`` guards against a race
task_comment   comment on a task
task_list      tasks, newest first, by status and/or assignee
task_get       one task with its body and comments
page_write     write a knowledge-base page (create or replace)
page_read      one page
page_search    full-text search of the knowledge base
page_list      pages, by path prefix
file_register  record a file a seat stored (project, path, size, sha256)
note_write     write to this seat's own notes (its diary, kept across turns)
notes_read     this seat's newest notes
=============  ==============================================================

The notes are the seat's **diary** in the estate: only the seat writes and
reads its own (an op for another seat's diary is refused), and the same text
written twice is kept once.

Every tool reaches the estate through the node's router
(:class:`crewlet.estate.router.Router`): it answers from this node's own copy
when it has one in service, else from a data node over the broker. The seats
role puts two more attributes on the :class:`~crewlet.agent.tools.ToolContext`'s
``services`` for these tools: ``estate`` (the Router) and ``node`` (this
node's id, which every op names as its issuer).

No tool waits longer than its turn has left (the context's ``deadline``): the
router's per-node waits (10 s reads, 60 s writes) are cut to it.

**Writes** are ops (:func:`crewlet.estate.ops.make_op`) issued by the seat
under its fencing token, with the id ``<seat>:<kind>:<call key>`` — the same when a
turn is redone, so a redone write lands once and answers the first outcome.
A refused write (no such task, a version that moved on, a stale fencing
token) comes back as ``refused: <why>``. A write whose outcome nobody could
vouch for may or may not have landed: the model is told so and not to retry
it blindly (a retry is a new call, so a new op id, and could land twice);
for a page, to check with ``page_read`` first.

**Reads** carry the router's floor, so a seat reads its own writes whichever
data node answers. A search nobody could run says so ("the knowledge base
could not be searched: ...") — never "no pages matched", which would tell
the model the knowledge base holds nothing on the subject.

Results are short text for the model: a task is one line,
``T12 [open] title (assignee: cto)``; times are UTC.
"""

from __future__ import annotations

import copy
import functools
import time
from typing import Any

from crewlet.agent.tools import Tool, ToolContext, ToolError
from crewlet.estate import ops
from crewlet.estate.router import EstateError, NobodyAnswered, OutcomeUnknown, coverage_text, describe

# Characters of a search hit's snippet, and of a page body shown by page_read
# (a page can be 200,000 characters: more than a model's turn should swallow whole).
SNIPPET_CHARS = 300
PAGE_SHOWN = 50_000
# A diary entry's key (the call key that wrote it) is kept when it fits the op's limit.
DIARY_KEY_MAX = ops.KINDS["diary.write"].schema["properties"]["key"]["maxLength"]
TASK_LIST_DEFAULT = 50  # a screenful for a model; the query allows up to ops.LIST_MAX

NOTES_READ_DEFAULT = 20



# ------------------------------------------------------------------ text

def when(at: Any) -> str:
    """'2025-01-02 13:04Z' for a unix time; '?' otherwise."""
    if not isinstance(at, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(at)) + "Z"


def task_line(task: dict[str, Any]) -> str:
    """'T12 [open] title (assignee: cto; labels: a, b; parent: T3)'."""
    details = []
    if task.get("assignee"):
        details.append(f"assignee: {task['assignee']}")
    if task.get("labels"):
        details.append(f"labels: {', '.join(task['labels'])}")
    if task.get("parent"):
        details.append(f"parent: {task['parent']}")
    line = f"{task.get('id')} [{task.get('status')}] {task.get('title')}"
    return f"{line} ({'; '.join(details)})" if details else line


def task_text(task: dict[str, Any], comments: list[dict[str, Any]]) -> str:
    """A task with its body and comments, oldest first."""
    lines = [task_line(task),
             f"rev {task.get('rev')} · created by {task.get('created_by')} {when(task.get('created_at'))}"
             f" · updated by {task.get('updated_by')} {when(task.get('updated_at'))}", ""]
    lines.append(task.get("body") or "(no description)")
    if comments:
        lines += ["", f"comments ({len(comments)}):"]
        for c in comments:
            lines.append(f"{c.get('id')} {c.get('created_by')} {when(c.get('created_at'))}: {c.get('body')}")
    else:
        lines += ["", "no comments"]
    return "\n".join(lines)


def page_line(page: dict[str, Any]) -> str:
    """'ops/runbook — Runbook (v3, updated by cto 2025-01-02 13:04Z)'."""
    return (f"{page.get('path')} — {page.get('title')} (v{page.get('version')}, updated by "
            f"{page.get('updated_by')} {when(page.get('updated_at'))})")


def page_text(page: dict[str, Any]) -> str:
    body = page.get("body") or ""
    if len(body) > PAGE_SHOWN:
        body = body[:PAGE_SHOWN] + f"\n… (cut: the page is {len(page['body'])} characters)"
    return (f"# {page.get('title')}\npath: {page.get('path')} · version {page.get('version')} · "
            f"updated by {page.get('updated_by')} {when(page.get('updated_at'))}\n\n{body}")


# ------------------------------------------------------------------ the router

def _router(ctx: ToolContext):
    router = getattr(ctx.services, "estate", None)
    if router is None:
        raise ToolError("the estate is not reachable from this node yet; try again later")
    return router


async def write(ctx: ToolContext, kind: str, args: dict[str, Any], *, check: str) -> dict[str, Any]:
    """Issue op *kind* as this seat and return its result; ToolError when it was
    refused or its outcome is unknown (*check* says how the model can find out)."""
    try:
        # The kind is in the id: a redone turn whose model chose another
        # tool at the same call is another write, not the first one's echo.
        op = ops.make_op(kind, args, node=ctx.services.node, seat=ctx.seat, token=ctx.token,
                         id=ops.op_id(ctx.seat, kind, ctx.call_key))
    except ops.OpError as exc:
        raise ToolError(f"invalid arguments: {exc}") from None
    try:
        outcome = await _router(ctx).write(op, timeout=ctx.time_left())
    except OutcomeUnknown as exc:
        raise ToolError(f"the {kind} may or may not have landed: no data node could vouch for its "
                        f"outcome ({describe(exc.answers)}). Do not retry it blindly; {check}.") from None
    except NobodyAnswered as exc:
        raise ToolError(str(exc)) from None
    except EstateError as exc:
        raise ToolError(f"the estate refused: {exc}") from None
    if not outcome.get("ok"):
        raise ToolError(f"refused: {outcome.get('error') or 'no reason given'}")
    return outcome.get("result") or {}


async def read(ctx: ToolContext, query: str, args: dict[str, Any]) -> dict[str, Any]:
    """The answer to read *query*; ToolError when nobody could answer."""
    try:
        return await _router(ctx).read(query, args, timeout=ctx.time_left()) or {}
    except ops.OpError as exc:
        raise ToolError(f"invalid arguments: {exc}") from None
    except NobodyAnswered as exc:
        raise ToolError(str(exc)) from None
    except EstateError as exc:
        raise ToolError(f"the estate refused: {exc}") from None


# ------------------------------------------------------------------ the tools

async def _task_create(ctx: ToolContext, args: dict[str, Any]) -> str:
    result = await write(ctx, "task.create", args, check="check with task_list whether it was created")
    return f"created {task_line(result['task'])}"


async def _task_update(ctx: ToolContext, args: dict[str, Any]) -> str:
    result = await write(ctx, "task.update", args, check=f"check with task_get {args['id']}")
    task = result["task"]
    return f"updated {task_line(task)} (now rev {task.get('rev')})"


async def _task_comment(ctx: ToolContext, args: dict[str, Any]) -> str:
    result = await write(ctx, "task.comment", args, check=f"check with task_get {args['id']}")
    return f"commented on {args['id']} ({result['comment'].get('id')})"


async def _task_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    limit = args.get("limit", TASK_LIST_DEFAULT)
    tasks = (await read(ctx, "task.list", {**args, "limit": limit})).get("tasks") or []
    if not tasks:
        which = ", ".join(f"{k} {args[k]}" for k in ("status", "assignee", "after") if k in args)
        return f"no tasks{f' ({which})' if which else ''}"
    lines = [task_line(t) for t in tasks]
    if len(tasks) >= limit:
        lines.append(f"(the newest {limit}; older ones: after={tasks[-1].get('id')})")
    return "\n".join(lines)


async def _task_get(ctx: ToolContext, args: dict[str, Any]) -> str:
    answer = await read(ctx, "task.get", {"id": args["id"]})
    if not answer.get("task"):
        raise ToolError(f"no task {args['id']}")
    return task_text(answer["task"], answer.get("comments") or [])


async def _page_write(ctx: ToolContext, args: dict[str, Any]) -> str:
    result = await write(ctx, "page.write", args,
                         check=f"check with page_read {args['path']} whether it holds your text")
    page = result["page"]
    return f"wrote {page.get('path')} (version {page.get('version')})"


async def _page_read(ctx: ToolContext, args: dict[str, Any]) -> str:
    page = (await read(ctx, "page.read", {"path": args["path"]})).get("page")
    if not page:
        raise ToolError(f"no page at {args['path']} (page_list and page_search find pages)")
    return page_text(page)


async def _page_search(ctx: ToolContext, args: dict[str, Any]) -> str:
    try:
        answer = await _router(ctx).search(args["query"], args.get("limit", ops.SEARCH_DEFAULT),
                                           timeout=ctx.time_left())
    except (ops.OpError, EstateError) as exc:
        raise ToolError(f"the knowledge base could not be searched: {exc}") from None
    if not answer.searched:
        raise ToolError(f"the knowledge base could not be searched: {describe(answer.answers)}")
    # A split search some data nodes did not answer: say so first, so a seat
    # does not take "no match" (or these hits) for the whole knowledge base's.
    partial = coverage_text(answer.coverage)
    if not answer.hits:
        return f"no pages matched ({partial})" if partial else "no pages matched"
    lines = [f"{h.get('path')} — {h.get('title')}: "
             f"{' '.join(str(h.get('snippet') or '').split())[:SNIPPET_CHARS]}"
             for h in answer.hits]
    return "\n".join([partial, *lines] if partial else lines)


async def _page_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    pages = (await read(ctx, "page.list", args)).get("pages") or []
    if not pages:
        return f"no pages under {args['prefix']!r}" if args.get("prefix") else "no pages yet"
    return "\n".join(page_line(p) for p in pages)


async def _file_register(ctx: ToolContext, args: dict[str, Any]) -> str:
    result = await write(ctx, "file.register", args,
                         check="registering it again would record it twice (as a new version)")
    f = result["file"]
    return (f"registered {f.get('id')}: {f.get('project')}/{f.get('path')} "
            f"({f.get('size')} bytes, version {f.get('version')})")


async def _note_write(ctx: ToolContext, args: dict[str, Any]) -> str:
    note = {"seat": ctx.seat, "text": args["text"]}
    if len(ctx.call_key) <= DIARY_KEY_MAX:
        note["key"] = ctx.call_key
    result = await write(ctx, "diary.write", note, check="read your notes with notes_read first")
    return "already noted" if result.get("collapsed") else "noted"


async def _notes_read(ctx: ToolContext, args: dict[str, Any]) -> str:
    answer = await read(ctx, "diary.list", {"seat": ctx.seat, "limit": args.get("limit", NOTES_READ_DEFAULT)})
    entries = answer.get("entries") or []
    if not entries:
        return "no notes yet"
    return "\n".join(f"{when(e.get('at'))} {e.get('text', '')}" for e in entries)


def _schema(base: dict[str, Any], **described: str) -> dict[str, Any]:
    """*base* (an op's or a query's argument schema, so the limits stay in one
    place) with a description for the model on each property named."""
    schema = copy.deepcopy(base)
    for name, text in described.items():
        schema["properties"][name]["description"] = text
    return schema


def estate_tools() -> list[Tool]:
    """The tracker, knowledge-base and file tools (:data:`ESTATE_TOOL_NAMES`, and
    file_write / file_read: :mod:`crewlet.agent.file_tools`)."""
    from crewlet.agent.file_tools import file_tools  # it builds on this module
    return list(_made()) + file_tools()


@functools.lru_cache(maxsize=1)
def _made() -> tuple[Tool, ...]:
    """The tools, made once: every seat a node claims gets the same ones (a
    claim sweep may add them to thousands of registries)."""
    kind, query = ops.KINDS, ops.QUERIES
    statuses = ", ".join(ops.TASK_STATUSES)
    return (
        Tool("task_create", "Create a task in the company's tracker. Everyone in the company sees it.",
             _schema(kind["task.create"].schema, title="a short summary", body="what is to be done",
                     status=f"one of {statuses} (default open)", assignee="the seat that should do it",
                     labels="tags", parent="the id of the task this one is part of, e.g. T7"),
             _task_create),
        Tool("task_update", "Change a task: title, body, status, assignee (empty clears it), labels.",
             _schema(kind["task.update"].schema, id="the task, e.g. T12", status=f"one of {statuses}",
                     assignee="a seat, or empty to unassign",
                     labels="the new tags (replace the old ones)",
                     expect_rev="refuse unless the task is at this rev (from task_get): nobody changed it since"),
             _task_update),
        Tool("task_comment", "Add a comment to a task.",
             _schema(kind["task.comment"].schema, id="the task, e.g. T12", body="the comment"),
             _task_comment),
        Tool("task_list", "List tasks, newest first, by status and/or assignee.",
             _schema(query["task.list"], status=f"one of {statuses}", assignee="a seat",
                     limit=f"how many (default {TASK_LIST_DEFAULT})",
                     after="list tasks older than this one (paging)"),
             _task_list),
        Tool("task_get", "Read one task: its fields, body and comments.",
             _schema(query["task.get"], id="the task, e.g. T12"),
             _task_get),
        Tool("page_write", "Write a page of the company's knowledge base (creates it, or replaces its "
                           "title and body).",
             _schema(kind["page.write"].schema, path="e.g. eng/deploy-runbook (lowercase, / for folders)",
                     title="the page's title", body="the whole page, Markdown",
                     expect_version="refuse unless the page is at this version (from page_read); "
                                    "omit to overwrite"),
             _page_write),
        Tool("page_read", "Read a knowledge-base page.",
             _schema(query["page.read"], path="the page's path"),
             _page_read),
        Tool("page_search", "Search the knowledge base's pages by words; best matches first.",
             _schema(query["page.search"], query="words to look for",
                     limit=f"how many hits (default {ops.SEARCH_DEFAULT})"),
             _page_search),
        Tool("page_list", "List knowledge-base pages by path.",
             _schema(query["page.list"], prefix="only paths starting with this", limit="how many"),
             _page_list),
        Tool("file_register", "Record a file you stored, so the company can find it.",
             _schema(kind["file.register"].schema, project="the project it belongs to",
                     path="its path in the project", size="its size in bytes",
                     sha256="its SHA-256, 64 lowercase hex digits", content_type="e.g. text/csv"),
             _file_register),
        Tool("note_write", "Write a note to your own private notes, kept across turns.",
             {"type": "object",
              "properties": {"text": copy.deepcopy(kind["diary.write"].schema["properties"]["text"])},
              "required": ["text"], "additionalProperties": False},
             _note_write),
        Tool("notes_read", "Read your newest private notes, oldest first.",
             {"type": "object",
              "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": ops.LIST_MAX,
                                       "description": f"how many (default {NOTES_READ_DEFAULT})"}},
              "additionalProperties": False},
             _notes_read),
    )


# The tools' names, as the registry offers them.
# The file tools' names said here, not by making them: crewlet.agent.file_tools
# builds on this module, which may still be loading (tests/integration/test_estate_tools.py
# holds the names to the tools).
ESTATE_TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in _made()) + ("file_write", "file_read")
