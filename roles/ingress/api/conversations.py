"""Conversations: threads with one seat, driven run by run (DESIGN §11).

* ``POST /v1/conversations`` ``{seat, metadata}`` — a new conversation (201).
* ``GET /v1/conversations`` — by seat or status, newest first.
* ``GET /v1/conversations/{id}`` — its status, current run, pending approval,
  and its messages, oldest first, a page at a time (``cursor``).
* ``POST /v1/conversations/{id}/runs`` ``{input, multitask_strategy,
  on_disconnect, stream}`` — a run (:mod:`crewlet.conversations.driver`
  says what each strategy does). ``stream: true``: the answer is the run's
  events as Server-Sent Events, each ``id`` its sequence in ``RUNS``;
  otherwise 202 with the run. A busy conversation is a **409 before any SSE
  header**: ``conversation_busy`` naming the ``run_id`` driving it, its
  ``node`` and ``retry_after``; awaiting a decision, ``pending_approval``
  naming the approval.
* ``GET /v1/conversations/{id}/runs[/{run}]`` — its runs, one run.
* ``GET /v1/conversations/{id}/runs/{run}/stream`` — the run's events on any
  node; with ``Last-Event-ID``, every later one once, in order, the terminal
  one included.
* ``POST /v1/conversations/{id}/runs/{run}/cancel`` — stop it, from any node
  (idempotent): a queued run at once, a running one before its next round.
* ``GET /v1/approvals`` (``?status=pending``), ``GET /v1/approvals/{id}``,
  ``POST /v1/approvals/{id}`` ``{decision: approve|deny, note}`` — the same
  decision again is answered the same, another one is a 409; the answer's
  ``resumed_by`` is the run that resumes the conversation (follow its stream).
  An approval of kind ``promotion`` is a drafted skill's (of no conversation:
  :mod:`roles.ingress.api.skills`), decided as :func:`promotion_decider` says.

A stream sends a comment every :data:`HEARTBEAT` seconds of silence, and
every :data:`STATUS_EVERY` seconds of silence looks at the run's status in
the estate: a run that ended there without its terminal event on ``RUNS``
(its turn cut off between the two, its driver gone) has that end told by the
stream, once the end's grace passed (:meth:`~crewlet.conversations.driver.Conductor.tell_untold_end`),
so a client never waits for ever on a run that is over. A client
that goes away from a run started with ``on_disconnect: cancel`` cancels it;
with ``continue`` (the default) the run goes on, driven by this node, and its
events wait in ``RUNS`` to be resumed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from crewlet import log
from crewlet.conversations import runs
from crewlet.conversations.driver import Conductor, Draining, PendingApproval, Queued, Refused, resumption_id
from crewlet.conversations.lease import ConversationBusy
from crewlet.coord.lease import LeaseError
from crewlet.estate import ops
from crewlet.estate.apply import CONFLICT, NOT_FOUND
from roles.ingress.api.common import (CURSOR, READ_PATIENCE, decode_cursor, encode_cursor, estate,
                                      idempotency_key, ride_out, seq_at)
from roles.ingress.auth import READ, WRITE
from roles.ingress.front import Front, front
from roles.ingress.problems import Problem, responses, unavailable

# 400: a body that is not JSON, a cursor this listing did not give out, a bad
# Idempotency-Key or Last-Event-ID.
router = APIRouter(prefix="/v1", tags=["conversations"], responses=responses(400, 401, 403, 422, 503))

HEARTBEAT = 15.0
# Seconds of silence after which a stream asks the estate whether its run has
# ended (and, past the end's grace, tells an end nobody told): see _stream.
STATUS_EVERY = 5.0
ConvPath = Path(pattern=ops.ROW_ID, description="A conversation's id")
RunPath = Path(pattern=ops.ROW_ID, description="A run's id")
ApprovalPath = Path(pattern=ops.ROW_ID, description="An approval's id")
Strategy = Literal["reject", "enqueue", "interrupt", "rollback"]
OnDisconnect = Literal["continue", "cancel"]
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class NewConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seat: str = Field(pattern=ops.SEAT_NAME, description="The seat the conversation is with")
    metadata: dict[str, Any] = Field(default_factory=dict, max_length=ops.METADATA_KEYS_MAX,
                                     description="Free-form tags of yours (16 KiB at most)")


class Conversation(_Open):
    id: str
    seat: str
    status: Literal["idle", "running", "awaiting_approval", "error"]
    run: str | None = Field(None, description="Its current (or last) run")
    approval: str | None = Field(None, description="The approval it awaits")


class ConversationPage(BaseModel):
    items: list[Conversation]
    next: str | None


class ConversationDetail(BaseModel):
    conversation: Conversation
    run: dict[str, Any] | None = Field(description="Its current (or last) run")
    approval: dict[str, Any] | None = Field(description="The approval it awaits (or last asked)")
    messages: list[dict[str, Any]] = Field(description="Its messages, oldest first: this page")
    next: str | None = Field(description="Cursor of the next (later) page of messages; null on the last")


class NewRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: str = Field("", max_length=ops.MESSAGE_TEXT_MAX, description="The person's message")
    multitask_strategy: Strategy = Field("reject", description="What happens when the conversation is "
                                                               "busy: reject (409), enqueue, interrupt, rollback")
    on_disconnect: OnDisconnect = Field("continue", description="A streaming client that goes away: the run "
                                                                "continues, or is cancelled")
    stream: bool = Field(False, description="Answer with the run's events (text/event-stream)")


class Run(_Open):
    id: str
    conversation: str
    status: Literal["queued", "running", "completed", "failed", "interrupted"]


class RunAccepted(BaseModel):
    run: Run
    queued: bool = Field(description="Kept queued: it starts when the conversation is free")
    node: str | None = Field(None, description="The node driving it (null while queued)")
    rolled_back: dict[str, Any] | None = Field(None, description="rollback: the run whose messages were "
                                                                  "removed, how many, and the tool calls "
                                                                  "it ran (they stay done)")


class RunPage(BaseModel):
    items: list[Run]
    next: str | None


class Approval(_Open):
    id: str
    kind: str = Field("tool", description="tool: a seat's tool call, in a conversation's run; "
                                          "promotion: a drafted skill (GET /v1/skills/drafts), of no "
                                          "conversation")
    conversation: str | None = Field(None, description="The conversation whose run asked (null: a promotion)")
    run: str | None = Field(None, description="The run that asked (null: a promotion)")
    tool: str
    status: Literal["pending", "decided"]
    resumed_by: str | None = Field(None, description="Deciding: the run that resumes the conversation "
                                                      "(follow its stream)")


class ApprovalPage(BaseModel):
    items: list[Approval]
    next: str | None


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "deny"]
    note: str | None = Field(None, max_length=ops.NOTE_MAX)


def _conductor(f: Front) -> Conductor:
    if f.conductor is None:
        raise Problem(503, "not_ready", "conversations are not served yet on this node",
                      headers={"Retry-After": "2"})
    return f.conductor


async def _call(call):
    """*call* to the conductor, its failures as problems."""
    try:
        return await estate(call)
    except ConversationBusy as busy:
        raise Problem(409, "conversation_busy", str(busy), headers={"Retry-After": str(busy.retry_after)},
                      run_id=busy.run, node=busy.node, since=busy.since,
                      retry_after=busy.retry_after) from None
    except PendingApproval as pending:
        raise Problem(409, "pending_approval", str(pending), approval=pending.approval) from None
    except Draining as draining:
        # Not this node's to serve any more: a client (or its load balancer,
        # which /readyz told already) tries another.
        raise Problem(503, "node_draining", str(draining), headers={"Retry-After": "1"},
                      node=draining.node) from None
    except Refused as refused:
        if refused.code == NOT_FOUND:
            raise Problem(404, "not_found", str(refused)) from None
        if refused.code == "no_company":
            raise Problem(503, "no_company", str(refused), headers={"Retry-After": "5"}) from None
        raise Problem(409, refused.code or "refused", str(refused),
                      **(refused.outcome.get("detail") or {})) from None
    except LeaseError as exc:
        raise unavailable(exc, "leases_unavailable",
                          f"the driver leases could not be read or written: {exc}") from None
    except runs.RunsError as exc:
        raise unavailable(exc, "runs_unavailable", str(exc)) from None


async def _listing(f: Front, query: str, args: dict[str, Any], rows: str, resume: str,
                   cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """One page of estate listing *query* (*args* without the unset ones),
    resumed where *cursor* says (the query's *resume* argument): its *rows*
    and the cursor of the next page (None on the last)."""
    args = {k: v for k, v in args.items() if v is not None}
    position = decode_cursor(cursor, resume)
    if position:
        args[resume] = seq_at(position, resume)
    page = await _call(_conductor(f).read(query, args))
    nxt = page.get("next")
    return page.get(rows) or [], encode_cursor({resume: nxt}) if nxt else None


# ---------------------------------------------------------------- conversations

@router.post("/conversations", status_code=201, response_model=Conversation, summary="Start a conversation",
             responses=responses(400, 404, 409))
async def create_conversation(request: Request, body: NewConversation, _=Depends(WRITE),
                              key: str | None = Depends(idempotency_key)) -> Conversation:
    f = front(request)
    f.need_seat(body.seat)
    conductor = _conductor(f)
    ident = ("c-" + hashlib.sha256(key.encode()).hexdigest()[:24]) if key else "c-" + uuid.uuid4().hex[:24]
    result = await _call(conductor.write("conversation.create", {"id": ident, "seat": body.seat,
                                                                 "metadata": body.metadata}, ident))
    return Conversation(**result["conversation"])


@router.get("/conversations", response_model=ConversationPage, summary="Conversations, newest first",
            responses=responses(400))
async def list_conversations(request: Request, seat: str | None = Query(None, pattern=ops.SEAT_NAME),
                             status: Literal["idle", "running", "awaiting_approval", "error"] | None = None,
                             limit: int = Query(50, ge=1, le=ops.LIST_MAX), cursor: str | None = CURSOR,
                             _=Depends(READ)) -> ConversationPage:
    args = {"limit": limit, "seat": seat, "status": status}
    items, nxt = await _listing(front(request), "conversation.list", args, "conversations", "before", cursor)
    return ConversationPage(items=[Conversation(**c) for c in items], next=nxt)


@router.get("/conversations/{conversation}", response_model=ConversationDetail,
            summary="A conversation with a page of its messages", responses=responses(400, 404))
async def get_conversation(request: Request, conversation: str = ConvPath,
                           limit: int = Query(100, ge=1, le=ops.LIST_MAX), cursor: str | None = CURSOR,
                           _=Depends(READ)) -> ConversationDetail:
    conductor = _conductor(front(request))
    got = await _call(conductor.conversation(conversation))
    args: dict[str, Any] = {"conversation": conversation, "limit": limit}
    position = decode_cursor(cursor, "after")
    if position:
        place = position["after"]
        if not (isinstance(place, list) and len(place) == 2 and all(
                isinstance(p, int) and not isinstance(p, bool) and 0 < p < 2**63 for p in place)):
            raise Problem(400, "bad_cursor", "cursor is not one this listing gave out")
        args["after"] = place
    page = await _call(conductor.read("conversation.messages", args))
    after = page.get("after")
    return ConversationDetail(conversation=Conversation(**got["conversation"]), run=got.get("run"),
                              approval=got.get("approval"), messages=page.get("messages") or [],
                              next=encode_cursor({"after": after}) if after else None)


# ---------------------------------------------------------------- runs

@router.post("/conversations/{conversation}/runs", summary="Start a run (stream: its events as SSE)",
             status_code=202, response_model=RunAccepted, responses={
                 **responses(400, 404, 409),
                 200: {"description": "stream: the run's events: run.started, message.delta, tool.call, "
                                      "tool.result, approval.requested, then one of run.completed, "
                                      "run.failed, run.interrupted", "content": {"text/event-stream": {}}}})
async def start_run(request: Request, body: NewRun, conversation: str = ConvPath, grant=Depends(WRITE),
                    key: str | None = Depends(idempotency_key)):
    f = front(request)
    conductor = _conductor(f)
    f.need_space("the run was not started")
    started = await _call(conductor.start(conversation, input=body.input, strategy=body.multitask_strategy,
                                          on_disconnect=body.on_disconnect, key=key, stream=body.stream))
    queued = isinstance(started, Queued)
    if not body.stream or queued:
        return JSONResponse(RunAccepted(run=Run(**started.run), queued=queued,
                                        node=None if queued else started.node,
                                        rolled_back=started.rolled_back).model_dump(mode="json"), 202)
    # Everything that can refuse has been decided: from here the answer is the stream.
    return await _stream(f, conversation, started.run["id"], 0,
                         cancel_on_disconnect=body.on_disconnect == "cancel", by=f"api:{grant.name}")


@router.get("/conversations/{conversation}/runs", response_model=RunPage, summary="A conversation's runs",
            responses=responses(400, 404))
async def list_runs(request: Request, conversation: str = ConvPath,
                    status: Literal["queued", "running", "completed", "failed", "interrupted"] | None = None,
                    limit: int = Query(50, ge=1, le=ops.LIST_MAX), cursor: str | None = CURSOR,
                    _=Depends(READ)) -> RunPage:
    f = front(request)
    await _call(_conductor(f).conversation(conversation))
    args = {"conversation": conversation, "limit": limit, "status": status}
    items, nxt = await _listing(f, "run.list", args, "runs", "after", cursor)
    return RunPage(items=[Run(**r) for r in items], next=nxt)


async def _run(conductor: Conductor, conversation: str, run: str) -> dict[str, Any]:
    row = (await _call(conductor.read("run.get", {"id": run}))).get("run")
    if row is None or row["conversation"] != conversation:
        raise Problem(404, "not_found", f"no run {run} in conversation {conversation}")
    return row


@router.get("/conversations/{conversation}/runs/{run}", response_model=Run, summary="One run",
            responses=responses(404))
async def get_run(request: Request, conversation: str = ConvPath, run: str = RunPath, _=Depends(READ)) -> Run:
    return Run(**await _run(_conductor(front(request)), conversation, run))


@router.get("/conversations/{conversation}/runs/{run}/stream", summary="A run's events, resumable on any node",
            response_class=StreamingResponse, responses={
                **responses(400, 404, 410),
                200: {"description": "The run's events after Last-Event-ID (all of them without one)",
                      "content": {"text/event-stream": {}}}})
async def stream_run(request: Request, conversation: str = ConvPath, run: str = RunPath,
                     last_event_id: str = Header("", alias="Last-Event-ID",
                                                        description="The id of the last event you saw "
                                                                    "(anything else is a 400 bad_last_event_id)",
                                                        json_schema_extra={"pattern": r"^[0-9]{0,15}$"}),
                     _=Depends(READ)):
    f = front(request)
    conductor = _conductor(f)
    after = 0
    if last_event_id.strip():
        text = last_event_id.strip()
        if not text.isdigit() or len(text) > 20 or int(text) > ops.INT_MAX:
            raise Problem(400, "bad_last_event_id", "Last-Event-ID must be the id of an event of this run "
                                                    "(a whole number), as its stream sent it")
        after = int(text)
    row = await _run(conductor, conversation, run)
    latest = await _call(ride_out(lambda: runs.last(f.js, conversation, run), _resume_patience(f)))
    if latest is None:
        if row["status"] in ops.RUN_ENDED or after:
            raise Problem(410, "events_gone", f"run {run}'s events are no longer kept "
                                              f"(conversations.retention); its outcome: {row['status']}",
                          status=row["status"])
    elif after > latest[0]:
        raise Problem(400, "bad_last_event_id", f"Last-Event-ID {after} is past run {run}'s last event "
                                                f"({latest[0]})")
    elif after == latest[0] and latest[1]["type"] in runs.TERMINAL:
        return StreamingResponse(_nothing(), media_type="text/event-stream", headers=SSE_HEADERS)
    return await _stream(f, conversation, run, after, cancel_on_disconnect=False, by=None)


@router.post("/conversations/{conversation}/runs/{run}/cancel", response_model=Run, status_code=202,
             summary="Stop a run (idempotent, from any node)", responses=responses(404))
async def cancel_run(request: Request, conversation: str = ConvPath, run: str = RunPath,
                     grant=Depends(WRITE)) -> Run:
    conductor = _conductor(front(request))
    return Run(**await _call(conductor.cancel(conversation, run, by=f"api:{grant.name}")))


async def _look(conductor: Conductor, conversation: str, run: str) -> None:
    """A silent stream's look at its run: an end in the estate that nobody
    told on RUNS is told now (it reaches the stream through its follower).
    Best effort: a broker or estate re-forming is looked at again next time."""
    try:
        row = (await conductor.read("run.get", {"id": run})).get("run")
        if row is not None and row["conversation"] == conversation:
            await conductor.tell_untold_end(conversation, run, row)
    except Exception as exc:
        log.event("run_stream_look_failed", "debug", run=run, error=f"{type(exc).__name__}: {exc}")


async def _close(pumping: asyncio.Task, follower: runs.Follower) -> None:
    await asyncio.gather(pumping, return_exceptions=True)
    await follower.close()


async def _nothing():
    yield b"retry: 1000\n\n"


def _resume_patience(f: Front) -> float:
    """Seconds a stream's opening rides out a leader election (its last
    event read, its consumer made) before a 503: what a client resuming
    waits for a busy conversation (conversations.busy_wait), and no less than
    a read's."""
    return max(READ_PATIENCE, f.cfg.conversations.busy_wait)


async def _stream(f: Front, conversation: str, run: str, after: int, *, cancel_on_disconnect: bool,
                  by: str | None) -> StreamingResponse:
    follower = runs.follow(f.js, conversation, run, after_seq=after)
    # A refusal is still a problem here, before any header.
    await _call(ride_out(follower.open, _resume_patience(f)))

    async def body():
        queue: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            try:
                async for seq, event in follower:
                    await queue.put((seq, event))
            finally:
                await queue.put(None)
        pumping = asyncio.create_task(pump())
        ended = False
        looking: asyncio.Task | None = None  # the look at the run's status in the estate
        try:
            yield b"retry: 1000\n\n"
            sent = time.monotonic()  # the last bytes sent (the heartbeat's clock)
            while True:
                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for can
                    # lose a client's disconnect (a cancel) as an item arrives.
                    async with asyncio.timeout(min(STATUS_EVERY, HEARTBEAT)):
                        item = await queue.get()
                except TimeoutError:
                    # Issue 29: the follower alone waits for ever on a run whose
                    # end was written but never told (runs.follow leaves that
                    # bound to its caller). In the background, one at a time:
                    # telling it may ride out an election, and the heartbeats go on.
                    if f.conductor is not None and (looking is None or looking.done()):
                        looking = f.conductor.background(_look(f.conductor, conversation, run))
                    if time.monotonic() - sent >= HEARTBEAT:
                        sent = time.monotonic()
                        yield b": heartbeat\n\n"
                    continue
                if item is None:
                    return
                sent = time.monotonic()
                seq, event = item
                data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
                yield f"id: {seq}\nevent: {event['type']}\ndata: {data}\n\n".encode()
                if event["type"] in runs.TERMINAL:
                    ended = True
                    return
        finally:
            # Nothing awaited here: a client that went away cancels this
            # generator's scope, and every await in it would be cut short.
            pumping.cancel()
            if f.conductor is not None:
                if not ended and cancel_on_disconnect:  # on_disconnect: cancel
                    f.conductor.background(f.conductor.cancel(conversation, run, by=by or "api"))
                f.conductor.background(_close(pumping, follower))

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


# ---------------------------------------------------------------- approvals

@router.get("/approvals", response_model=ApprovalPage, summary="Approvals (?status=pending: those waiting)",
            responses=responses(400))
async def list_approvals(request: Request, status: Literal["pending", "decided"] | None = None,
                         conversation: str | None = Query(None, pattern=ops.ROW_ID),
                         limit: int = Query(50, ge=1, le=ops.LIST_MAX), cursor: str | None = CURSOR,
                         _=Depends(READ)) -> ApprovalPage:
    args = {"limit": limit, "status": status, "conversation": conversation}
    items, nxt = await _listing(front(request), "approval.list", args, "approvals", "after", cursor)
    return ApprovalPage(items=[Approval(**a) for a in items], next=nxt)


@router.get("/approvals/{approval}", response_model=Approval, summary="One approval: the call it is for",
            responses=responses(404))
async def get_approval(request: Request, approval: str = ApprovalPath, _=Depends(READ)) -> Approval:
    row = (await _call(_conductor(front(request)).read("approval.get", {"id": approval}))).get("approval")
    if row is None:
        raise Problem(404, "not_found", f"no approval {approval}")
    return Approval(**row)


def promotion_decider(company, grant) -> str:
    """Who decides a skill's promotion (a draft's approval, kind ``promotion``)
    with *grant*, as its record says it: when the company names people who
    decide promotions (``people.<id>.decides.promotions``), only a token
    belonging to one of them may (else a 403 naming who may, whatever the
    token's scope); when it names nobody, an admin token. ``person:<id>``, or
    ``api:<token name>`` for a token of nobody."""
    person = grant.person if grant.person in company.people else None
    promoters = [pid for pid, p in company.people.items() if p.decides.promotions]
    if promoters:
        if person not in promoters:
            who = ("this token belongs to nobody (ingress.tokens[].person)" if grant.person is None
                   else f"{grant.person} is not one of them")
            raise Problem(403, "not_allowed", f"skill promotions are decided by {', '.join(promoters)}: {who}")
    elif "admin" not in grant.scopes:
        raise Problem(403, "not_allowed", f"skill promotions are decided by an admin token when nobody is "
                                          f"named to (people.<id>.decides.promotions): token {grant.name} "
                                          f"has {', '.join(sorted(grant.scopes)) or 'no scopes'}")
    return f"person:{person}" if person else f"api:{grant.name}"


async def _decider(f, conductor, approval: str, grant) -> str:
    """Who decides *approval* with *grant*, as its record says it (``person:<id>``
    for a token that belongs to one of the company's people, else
    ``api:<token name>``); a 403 when the company names who decides the seat's
    approvals (``people.<id>.decides.approvals``) and the token's person is
    not one of them. A promotion's approval is decided as
    :func:`promotion_decider` says."""
    company = f.need_company()  # never decided unchecked while the company is not known yet (a 503)
    person = grant.person if grant.person in company.people else None
    approvers = []
    # Which kind of approval it is, and whose seat: read unless nothing can depend on
    # it (no people named, and an admin token, who may decide a promotion too).
    if company.people or "admin" not in grant.scopes:
        row = (await _call(conductor.read("approval.get", {"id": approval}))).get("approval")
        if row is None:
            raise Problem(404, "not_found", f"no approval {approval}")
        if row.get("kind") == "promotion":
            return promotion_decider(company, grant)
        if company.people:
            approvers = company.approvers(row.get("seat") or "")
        if approvers and person not in approvers:
            who = ("this token belongs to nobody (ingress.tokens[].person)" if grant.person is None
                   else f"{grant.person} is not one of them")
            raise Problem(403, "not_allowed", f"seat {row.get('seat')}'s approvals are decided by "
                                              f"{', '.join(approvers)}: {who}")
    return f"person:{person}" if person else f"api:{grant.name}"


@router.post("/approvals/{approval}", response_model=Approval,
             summary="Approve or deny a tool call, or a drafted skill's promotion",
             responses=responses(403, 404, 409))
async def decide(request: Request, body: Decision, approval: str = ApprovalPath,
                 grant=Depends(WRITE)) -> Approval:
    f = front(request)
    conductor = _conductor(f)
    by = await _decider(f, conductor, approval, grant)
    try:
        row = await _call(conductor.decide(approval, body.decision, note=body.note, by=by))
    except Problem as problem:
        if problem.code == CONFLICT:
            problem.code = "already_decided"
        raise
    if row.get("status") == "decided" and row.get("conversation"):
        # The run that resumes the conversation: a client follows its stream from here.
        row = {**row, "resumed_by": resumption_id(row["id"])}
    return Approval(**row)
