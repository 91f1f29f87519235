"""Turns, the tracker, the knowledge base: every route through the estate router.

Exactly as a seat's tools reach the estate (DESIGN §10): this node's copy
when it is in service, else a peer's; nobody answering is a 503 naming what
each data node said; a search nobody could run is ``searched: false``, and
one with no word to look for (no letter or digit: ``?!``) matches nothing, so
it answers no hits without asking anybody (the document cannot say "a letter
or digit" the same way to every regex engine; "not only spaces" it can).
Writes are ops issued by the operator (``operator@<node>``); an
``Idempotency-Key`` names the op, with the op's kind and the task or page it
writes, so the same request sent again lands once and answers the first
outcome, and the same key sent with another kind of write is another op (not
the first one's outcome, in a shape the route does not answer).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from crewlet.estate import ops
from crewlet.estate.search import fts_query
from crewlet.estate.wire import SEARCH_SHARDS
from roles.ingress.api.common import (CURSOR, ESTATE_WAIT, NOT_BLANK, WRITE_WAIT, read, INT_MAX, SEQ_MAX, decode_cursor,
                                      encode_cursor, estate, idempotency_key, refused, seq_at)
from roles.ingress.auth import READ, WRITE
from roles.ingress.front import Front, front
from roles.ingress.problems import Problem, responses

# 400: a cursor this listing did not give out, a bad Idempotency-Key, a body that is
# not JSON, or a request the estate router refuses as malformed. A write's WRITE comes
# before its Idempotency-Key: dependencies run in order, and a token is checked first.
router = APIRouter(prefix="/v1", responses=responses(400, 401, 403, 422, 503))

Status = Literal["open", "doing", "blocked", "done", "cancelled"]
TaskId = Path(pattern=ops.TASK_ID, description="A task id, like T12")
# A label, as the tracker takes them (the document says so, not only the route).
Label = Annotated[str, Field(min_length=1, max_length=100)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Turn(_Open):
    seat: str
    trigger: str
    outcome: str
    seq: int | None = None


class TurnPage(BaseModel):
    items: list[Turn]
    next: str | None = Field(description="Cursor of the next page; null on the last")


class Task(_Open):
    id: str
    title: str
    status: str
    assignee: str | None = None
    labels: list[str] = []
    parent: str | None = None
    rev: int


class Comment(_Open):
    id: str
    task: str
    body: str


class TaskPage(BaseModel):
    items: list[Task]
    next: str | None


class TaskDetail(BaseModel):
    task: Task
    comments: list[Comment]


class Page(_Open):
    path: str
    title: str
    version: int


class File(_Open):
    id: str
    project: str
    path: str
    size: int
    sha256: str
    version: int


class FileList(BaseModel):
    items: list[File]
    next: str | None


class PageList(BaseModel):
    items: list[Page]
    next: str | None


class SearchResult(BaseModel):
    hits: list[dict[str, Any]]
    searched: bool = Field(description="false: no data node could run the search (not: nothing matched)")
    node: str | None
    answers: dict[str, str]
    coverage: dict[str, Any] | None = Field(
        None, description="how much of the knowledge base was searched: searched (shards) of 64, "
                          "and missing (the data nodes whose shards were not searched); "
                          "searched < of is a partial result")
    partial: bool = Field(False, description="true: some shards were not searched "
                                             "(coverage.missing did not answer)")


class TaskCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=1, max_length=ops.TITLE_MAX)
    body: str = Field("", max_length=ops.TASK_BODY_MAX)
    status: Status = "open"
    assignee: str | None = Field(None, pattern=ops.SEAT_NAME)
    labels: list[Label] = Field(default_factory=list, max_length=50)
    parent: str | None = Field(None, pattern=ops.TASK_ID)


class TaskChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str | None = Field(None, min_length=1, max_length=ops.TITLE_MAX)
    body: str | None = Field(None, max_length=ops.TASK_BODY_MAX)
    status: Status | None = None
    assignee: str | None = Field(None, description="A seat, or \"\" to unassign", pattern=r"^$|" + ops.SEAT_NAME)
    labels: list[Label] | None = Field(None, max_length=50)
    expect_rev: int | None = Field(None, ge=1, le=INT_MAX,
                                   description="Refused (409) unless the task is at this rev")


class CommentNew(BaseModel):
    model_config = ConfigDict(extra="forbid")
    body: str = Field(min_length=1, max_length=ops.COMMENT_MAX)


class PageWrite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=1, max_length=ops.TITLE_MAX)
    body: str = Field(max_length=ops.PAGE_BODY_MAX)
    expect_version: int | None = Field(None, ge=1, le=INT_MAX,
                                       description="Refused (409) unless the page is at this version")


async def _write(f: Front, kind: str, args: dict[str, Any], key: str | None) -> dict[str, Any]:
    # The key alone would make a task.create and a later page.write under it one op:
    # the page route would be answered the task's outcome.
    target = str(args.get("id") or args.get("path") or "")
    op = ops.make_op(kind, args, node=f.node_id, id=ops.op_id("api", kind, target, key) if key else None)
    outcome = await estate(f.router.write(op, timeout=WRITE_WAIT))
    if f.metrics is not None:
        f.metrics.router("write", "ok" if outcome.get("ok") else "refused")
    if not outcome.get("ok"):
        raise refused(outcome)
    return outcome


# ------------------------------------------------------------------ turns

@router.get("/turns", response_model=TurnPage, tags=["turns"], summary="Turn records, newest first")
async def turns(request: Request, seat: str | None = Query(None, pattern=ops.SEAT_NAME),
                since: float | None = Query(None, ge=0, description="Only turns started at or after "
                                                                      "this unix time"),
                limit: int = Query(50, ge=1, le=ops.LIST_MAX), cursor: str | None = CURSOR,
                _=Depends(READ)) -> TurnPage:
    f = front(request)
    at = decode_cursor(cursor, "before")
    args: dict[str, Any] = {"limit": limit}
    if seat is not None:
        args["seat"] = seat
    if since is not None:
        args["since"] = since
    if "before" in at:
        args["before"] = seq_at(at, "before")
    rows = (await read(f, "turn.list", args)).get("turns") or []
    last = rows[-1].get("seq") if len(rows) == limit and rows else None
    return TurnPage(items=rows, next=encode_cursor({"before": last}) if isinstance(last, int) else None)


# ------------------------------------------------------------------ tasks

@router.get("/tasks", response_model=TaskPage, tags=["tasks"], summary="Tasks, newest first")
async def list_tasks(request: Request, status: Status | None = None,
                     assignee: str | None = Query(None, pattern=ops.SEAT_NAME),
                     limit: int = Query(ops.LIST_DEFAULT, ge=1, le=ops.LIST_MAX),
                     cursor: str | None = CURSOR, _=Depends(READ)) -> TaskPage:
    f = front(request)
    at = decode_cursor(cursor, "after")
    args: dict[str, Any] = {"limit": limit}
    if status:
        args["status"] = status
    if assignee:
        args["assignee"] = assignee
    if "after" in at:
        if (not isinstance(at["after"], str) or not re.match(ops.TASK_ID, at["after"])
                or int(at["after"][1:]) > SEQ_MAX):  # a task's number is its log seq
            raise Problem(400, "bad_cursor", "cursor is not one this listing gave out")
        args["after"] = at["after"]
    rows = (await read(f, "task.list", args)).get("tasks") or []
    nxt = encode_cursor({"after": rows[-1]["id"]}) if len(rows) == limit and rows else None
    return TaskPage(items=rows, next=nxt)


@router.get("/tasks/{id}", response_model=TaskDetail, tags=["tasks"], summary="One task with its comments",
            responses=responses(404))
async def get_task(request: Request, id: str = TaskId, _=Depends(READ)) -> TaskDetail:
    answer = await read(front(request), "task.get", {"id": id})
    if not answer.get("task"):
        raise Problem(404, "not_found", f"no task {id}")
    return TaskDetail(task=answer["task"], comments=answer.get("comments") or [])


@router.post("/tasks", status_code=201, response_model=TaskDetail, tags=["tasks"],
             summary="Open a task", responses=responses(404, 409))
async def create_task(request: Request, body: TaskCreate, _=Depends(WRITE),
                      key: str | None = Depends(idempotency_key)) -> TaskDetail:
    args = body.model_dump(exclude_none=True)
    outcome = await _write(front(request), "task.create", args, key)
    task = (outcome.get("result") or {}).get("task") or {}
    return TaskDetail(task=task, comments=[])


@router.patch("/tasks/{id}", response_model=TaskDetail, tags=["tasks"], summary="Change a task",
              responses=responses(404, 409))
async def change_task(request: Request, body: TaskChange, id: str = TaskId, _=Depends(WRITE),
                      key: str | None = Depends(idempotency_key)) -> TaskDetail:
    args = {"id": id, **body.model_dump(exclude_unset=True)}
    if args.get("assignee") is None and "assignee" in args:
        args["assignee"] = ""
    for k in [k for k, v in args.items() if v is None]:
        del args[k]
    outcome = await _write(front(request), "task.update", args, key)
    task = (outcome.get("result") or {}).get("task") or {}
    return TaskDetail(task=task, comments=[])


@router.post("/tasks/{id}/comments", status_code=201, response_model=Comment, tags=["tasks"],
             summary="Comment on a task", responses=responses(404, 409))
async def comment(request: Request, body: CommentNew, id: str = TaskId, _=Depends(WRITE),
                  key: str | None = Depends(idempotency_key)) -> Comment:
    outcome = await _write(front(request), "task.comment", {"id": id, "body": body.body}, key)
    return Comment(**((outcome.get("result") or {}).get("comment") or {}))


# ------------------------------------------------------------------ pages

@router.get("/pages", response_model=PageList, tags=["pages"], summary="Knowledge-base pages, by path")
async def list_pages(request: Request, prefix: str = Query("", max_length=200),
                     limit: int = Query(ops.LIST_DEFAULT, ge=1, le=ops.LIST_MAX),
                     cursor: str | None = CURSOR, _=Depends(READ)) -> PageList:
    at = decode_cursor(cursor, "after")
    args: dict[str, Any] = {"limit": limit, "prefix": prefix}
    if "after" in at:
        if (not isinstance(at["after"], str) or len(at["after"]) > ops.PAGE_PATH_MAX
                or not re.match(ops.PAGE_PATH, at["after"])):
            raise Problem(400, "bad_cursor", "cursor is not one this listing gave out")
        args["after"] = at["after"]
    rows = (await read(front(request), "page.list", args)).get("pages") or []
    nxt = encode_cursor({"after": rows[-1]["path"]}) if len(rows) == limit and rows else None
    return PageList(items=rows, next=nxt)


PagePath = Path(pattern=ops.PAGE_PATH, max_length=ops.PAGE_PATH_MAX,
                description="A page path, like ops/runbook: segments of a-z, 0-9, '_', '.', '-', "
                            "each starting with a letter or digit, joined by single '/'")


@router.get("/pages/{path:path}", response_model=Page, tags=["pages"], summary="One page with its body",
            responses=responses(404))
async def get_page(request: Request, path: str = PagePath, _=Depends(READ)) -> Page:
    page = (await read(front(request), "page.read", {"path": path})).get("page")
    if not page:
        raise Problem(404, "not_found", f"no page {path}")
    return Page(**page)


@router.put("/pages/{path:path}", response_model=Page, tags=["pages"], summary="Write a page (create or replace)",
            # 404: a path with a line break matches no route (the path convertor's "." stops there)
            responses={**responses(404, 409),
                       201: {"model": Page, "description": "Created: the page is new"}})
async def put_page(request: Request, body: PageWrite, response: Response, path: str = PagePath,
                   _=Depends(WRITE), key: str | None = Depends(idempotency_key)) -> Page:
    outcome = await _write(front(request), "page.write", {"path": path, **body.model_dump(exclude_none=True)},
                           key)
    page = (outcome.get("result") or {}).get("page") or {}
    if page.get("version") == 1:
        response.status_code = 201
    return Page(**page)


# ------------------------------------------------------------------ search

@router.get("/search", response_model=SearchResult, tags=["pages"], summary="Search the knowledge base")
async def search(request: Request, q: str = Query(min_length=1, max_length=500, pattern=NOT_BLANK,
                                                  description="Words; only those with a letter or digit "
                                                              "are looked for"),
                 limit: int = Query(ops.SEARCH_DEFAULT, ge=1, le=ops.SEARCH_MAX), _=Depends(READ)) -> SearchResult:
    f = front(request)
    try:
        fts_query(q)
    except ValueError:  # no word to look for: nothing can match (the router would say 400)
        return SearchResult(hits=[], searched=True, node=None, answers={},
                            coverage={"searched": SEARCH_SHARDS, "of": SEARCH_SHARDS, "missing": []})
    answer = await estate(f.router.search(q, limit, timeout=ESTATE_WAIT))
    if f.metrics is not None:
        f.metrics.router("search", "ok" if answer.searched else "unsearched")
    return SearchResult(hits=list(answer.hits), searched=bool(answer.searched), node=answer.node,
                        answers=dict(answer.answers or {}), coverage=dict(answer.coverage),
                        partial=bool(answer.searched and answer.partial))


# ------------------------------------------------------------------ files

@router.get("/files", response_model=FileList, tags=["files"],
            summary="Files seats registered, by project and path")
async def list_files(request: Request, project: str | None = Query(None, pattern=ops.PROJECT),
                     limit: int = Query(ops.LIST_DEFAULT, ge=1, le=ops.LIST_MAX),
                     cursor: str | None = CURSOR, _=Depends(READ)) -> FileList:
    at = decode_cursor(cursor, "project", "path")
    args: dict[str, Any] = {"limit": limit}
    if project is not None:
        args["project"] = project
    if at:
        if (set(at) != {"project", "path"} or not isinstance(at["project"], str)
                or not re.match(ops.PROJECT, at["project"]) or not isinstance(at["path"], str)
                or not 1 <= len(at["path"]) <= ops.FILE_PATH_MAX):
            raise Problem(400, "bad_cursor", "cursor is not one this listing gave out")
        args["after"] = at
    rows = (await read(front(request), "file.list", args)).get("files") or []
    nxt = (encode_cursor({"project": rows[-1]["project"], "path": rows[-1]["path"]})
           if len(rows) == limit and rows else None)
    return FileList(items=rows, next=nxt)
