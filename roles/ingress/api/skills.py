"""Skills: the company's Agent Skills folders, kept in the estate (DESIGN §15).

* ``GET /v1/skills`` (``?seat=``: those that apply to a seat; ``?as_of=``:
  as they were at a log seq, a run's pin) — each skill's current revision,
  without its files' bodies.
* ``GET /v1/skills/{name}`` (``?file=``, default ``SKILL.md``; ``?as_of=``)
  — the skill's revision and one file's body, byte for byte as written.
* ``GET /v1/skills/{name}/revisions`` — its history, newest first (a
  retirement is a revision too).
* ``PUT /v1/skills/{name}`` ``{files: [{path, body}], note?}`` — every file
  of the skill: its next revision (``skill.write``). Held to the format
  (:func:`crewlet.skills.format.check`) before anything is sent: a skill
  that is not one is a 422 ``invalid_skill`` naming the ``file`` and the
  ``field`` at fault (the applier holds every copy to the same rules; its
  refusal is the same 422, its message naming them).
* ``DELETE /v1/skills/{name}`` — retire it (``skill.retire``): its pages
  go, its history stays; 404 when there is no such skill.
* ``GET /v1/skills/drafts`` (``?status=``), ``GET /v1/skills/drafts/{name}``
  (``?file=``) — what the curation pass drafted, and a draft's files.
* ``POST /v1/skills/drafts/{name}/promote`` and ``/reject`` ``{note?}`` —
  decide the draft's promotion approval (``approval.decide``; the same as
  ``POST /v1/approvals/{id}`` on it): promoted, its files are the skill's
  next revision in the same op.

Who decides a promotion (:func:`roles.ingress.api.conversations.promotion_decider`):
when the company names people with ``decides.promotions``, only a token
belonging to one of them (403 ``not_allowed`` naming who may, whatever the
token's scope); else an admin token. The decision records
``person:<id>``, or ``api:<token name>`` for a token of nobody.

Writes are ops issued by the operator (``operator@<node>``) through the
estate router, as the tracker's and the knowledge base's are; an
``Idempotency-Key`` names the op with the skill's name. After a write that
changed a skill, the applier tells every node's registry
(``skills.changed``).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.convertors import Convertor, register_url_convertor

from crewlet.estate import ops
from crewlet.estate.apply import CONFLICT, NOT_FOUND
from crewlet.skills import format as skill_format
from roles.ingress.api.common import INT_MAX, WRITE_WAIT, estate, idempotency_key, read
from roles.ingress.api.conversations import Approval, _call, _conductor, promotion_decider
from roles.ingress.auth import READ, WRITE
from roles.ingress.front import Front, front
from roles.ingress.problems import Problem, responses

router = APIRouter(prefix="/v1", tags=["skills"], responses=responses(400, 401, 403, 422, 503))


class _SkillName(Convertor):
    """A path segment that may name a skill: any but ``drafts``, whose paths
    are the drafts' — so ``PUT /v1/skills/drafts`` is a 405 naming the
    methods ``/v1/skills/drafts`` takes, not a write of a skill so named (the
    format reserves the name). The name's own rule is the route's (a 422)."""

    regex = r"(?!drafts(?:/|$))[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("skill_name", _SkillName())

SkillName = Path(pattern=ops.SKILL_NAME, max_length=ops.SKILL_NAME_MAX,
                 description="A skill's name: 1-64 lower-case letters, digits and single hyphens")
AsOf = Query(None, ge=1, le=INT_MAX, description="As the skills were at this estate log seq (a run's pin); "
                                                 "none: now")
FileQuery = Query(None, min_length=1, max_length=ops.SKILL_FILE_PATH_MAX,
                  description="The file's path in the skill, as written (references/REFERENCE.md); "
                              "matched without regard to case; default SKILL.md")
DraftStatus = Literal["pending", "promoted", "rejected"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class SkillMeta(_Open):
    """A skill's front matter, as the estate keeps it."""

    name: str
    description: str
    license: str | None = None
    compatibility: str | None = None
    allowed_tools: list[str] = Field(default_factory=list, description="allowed-tools, split on spaces")
    metadata: dict[str, str] = Field(default_factory=dict)
    seats: list[str] = Field(default_factory=list, description="The seats it applies to (metadata "
                                                               "crewlet-seats: names or patterns); empty: "
                                                               "every seat")
    tools: list[str] = Field(default_factory=list, description="The tools it is about (metadata crewlet-tools)")
    cluster: str | None = Field(None, description="The learning cluster it was drafted from "
                                                  "(metadata crewlet-cluster)")


class Skill(_Open):
    """One revision of a skill, without its files' bodies."""

    name: str
    seq: int = Field(description="The revision: the estate log seq of the write that made it")
    at: float = Field(description="When it was written (seconds since 1970)")
    by: str = Field(description="Who wrote it: operator@<node>, a seat, or the learning passes")
    note: str | None = None
    retired: bool = Field(description="This revision retired the skill (its files are the last ones it had "
                                      "in meta, none in files)")
    draft: str | None = Field(None, description="The draft it was promoted from")
    description: str | None = None
    meta: SkillMeta
    files: list[str] = Field(description="Its files' paths, in path order")


class SkillFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, max_length=ops.SKILL_FILE_PATH_MAX,
                      description="Its path in the skill's folder: SKILL.md, references/REFERENCE.md, "
                                  "scripts/extract.py")
    body: str = Field(max_length=ops.PAGE_BODY_MAX, description="Its text, byte for byte (UTF-8)")


class SkillList(BaseModel):
    items: list[Skill]
    as_of: int | None = Field(description="The log seq they are as of; null: now")


class SkillRead(BaseModel):
    skill: Skill
    file: SkillFile


class Revisions(BaseModel):
    items: list[Skill] = Field(description="Newest first")


class SkillWrite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: list[SkillFile] = Field(min_length=1, max_length=skill_format.FILES_MAX,
                                   description="Every file of the skill, SKILL.md among them; a file of the "
                                               "revision before that is not here is gone from this one")
    note: str | None = Field(None, max_length=ops.NOTE_MAX, description="What changed, for its history")


class Draft(_Open):
    """A skill the curation pass drafted, waiting for a person (or promoted, or rejected)."""

    name: str
    cluster: str = Field(description="The cluster of episodes it was drafted from")
    seat: str = Field(description="The seat whose episodes they are")
    episodes: list[int] = Field(description="The episodes' log seqs")
    status: DraftStatus
    approval: str = Field(description="Its promotion approval (POST /v1/approvals/{id} decides it too)")
    seq: int
    at: float
    by: str
    meta: SkillMeta
    files: list[str]
    decided_at: float | None = None
    decided_by: str | None = None


class DraftList(BaseModel):
    items: list[Draft]


class DraftRead(BaseModel):
    draft: Draft
    file: SkillFile


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str | None = Field(None, max_length=ops.NOTE_MAX, description="Why, for the record")


class Decided(BaseModel):
    draft: Draft
    approval: Approval
    skill: Skill | None = Field(description="Promoted: the skill's revision made of the draft; else null")


def _invalid(exc: skill_format.SkillError) -> Problem:
    return Problem(422, "invalid_skill", str(exc), file=exc.file, field=exc.field)


async def _write(f: Front, kind: str, args: dict[str, Any], key: str | None) -> dict[str, Any]:
    """Write one op of *kind* as the operator; its result. A refusal: 404 for
    a skill that is not there, 422 ``invalid_skill`` (its message naming
    the file and the field) for one the applier will not keep."""
    ident = ops.op_id("api", kind, args["name"], key) if key else None
    op = ops.make_op(kind, args, node=f.node_id, id=ident)
    outcome = await estate(f.router.write(op, timeout=WRITE_WAIT))
    if f.metrics is not None:
        f.metrics.router("write", "ok" if outcome.get("ok") else "refused")
    if not outcome.get("ok"):
        why = str(outcome.get("error") or "refused")
        if outcome.get("code") == NOT_FOUND:
            raise Problem(404, "not_found", why)
        raise Problem(422, "invalid_skill", why)
    return outcome.get("result") or {}


def _file(name: str, answer: dict[str, Any], file: str | None, what: str) -> dict[str, Any]:
    found = answer.get("file")
    if found is None:
        have = ", ".join(answer["skill"].get("files") or [])
        raise Problem(404, "not_found", f"{what} {name} has no file {file or skill_format.SKILL_FILE} "
                                        f"(its files: {have})")
    return found


# ------------------------------------------------------------------ drafts (before /skills/{name})

@router.get("/skills/drafts", response_model=DraftList, summary="Skills the learning passes drafted")
async def list_drafts(request: Request, status: DraftStatus | None = None,
                      limit: int = Query(ops.LIST_DEFAULT, ge=1, le=ops.LIST_MAX), _=Depends(READ)) -> DraftList:
    args: dict[str, Any] = {"limit": limit}
    if status is not None:
        args["status"] = status
    rows = (await read(front(request), "skill.drafts", args)).get("drafts") or []
    return DraftList(items=rows)


async def _draft(f: Front, name: str, file: str | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"name": name, "draft": True}
    if file is not None:
        args["file"] = file
    answer = await read(f, "skill.read", args)
    if not answer.get("skill"):
        raise Problem(404, "not_found", f"no draft {name}")
    return answer


@router.get("/skills/drafts/{name}", response_model=DraftRead, responses=responses(404),
            summary="A draft and one of its files (default SKILL.md)")
async def get_draft(request: Request, name: str = SkillName, file: str | None = FileQuery,
                    _=Depends(READ)) -> DraftRead:
    answer = await _draft(front(request), name, file)
    return DraftRead(draft=answer["skill"], file=_file(name, answer, file, "draft"))


async def _decide(request: Request, name: str, decision: str, note: str | None, grant) -> Decided:
    f = front(request)
    conductor = _conductor(f)
    draft = (await _draft(f, name))["skill"]
    by = promotion_decider(f.need_company(), grant)
    args: dict[str, Any] = {"id": draft["approval"], "decision": decision, "by": by}
    if note:
        args["note"] = note
    try:
        # The op the approvals route writes for the same decision (its id), so either lands it once.
        result = await _call(conductor.write("approval.decide", args, f"{draft['approval']}:{decision}"))
    except Problem as problem:
        if problem.code == CONFLICT:
            problem.code = "already_decided"
        raise
    approval = result.get("approval") or {}
    promoted = approval.get("decision") == "approve"
    draft = {**draft, "status": "promoted" if promoted else "rejected",
             "decided_at": approval.get("decided_at"), "decided_by": approval.get("by")}
    skill = result.get("skill")
    if promoted and skill is None:  # decided before (the same again): the skill as it is now
        skill = (await read(f, "skill.read", {"name": name})).get("skill")
    return Decided(draft=draft, approval=approval, skill=skill if promoted else None)


@router.post("/skills/drafts/{name}/promote", response_model=Decided, responses=responses(404, 409),
             summary="Promote a draft: its files become the skill's next revision")
async def promote(request: Request, body: Verdict | None = None, name: str = SkillName,
                  grant=Depends(WRITE)) -> Decided:
    return await _decide(request, name, "approve", body.note if body else None, grant)


@router.post("/skills/drafts/{name}/reject", response_model=Decided, responses=responses(404, 409),
             summary="Reject a draft: it stays a draft, rejected")
async def reject(request: Request, body: Verdict | None = None, name: str = SkillName,
                 grant=Depends(WRITE)) -> Decided:
    return await _decide(request, name, "deny", body.note if body else None, grant)


# ------------------------------------------------------------------ skills

@router.get("/skills", response_model=SkillList, summary="The skills, by name (of a seat, as of a seq)")
async def list_skills(request: Request, seat: str | None = Query(None, pattern=ops.SEAT_NAME,
                                                                 description="Only those that apply to this seat"),
                      as_of: int | None = AsOf, limit: int = Query(ops.LIST_DEFAULT, ge=1, le=ops.LIST_MAX),
                      _=Depends(READ)) -> SkillList:
    args: dict[str, Any] = {"limit": limit}
    if seat is not None:
        args["seat"] = seat
    if as_of is not None:
        args["as_of"] = as_of
    answer = await read(front(request), "skill.list", args)
    return SkillList(items=answer.get("skills") or [], as_of=answer.get("as_of"))


@router.get("/skills/{name:skill_name}", response_model=SkillRead, responses=responses(404),
            summary="A skill and one of its files (default SKILL.md)")
async def get_skill(request: Request, name: str = SkillName, file: str | None = FileQuery,
                    as_of: int | None = AsOf, _=Depends(READ)) -> SkillRead:
    args: dict[str, Any] = {"name": name}
    if file is not None:
        args["file"] = file
    if as_of is not None:
        args["as_of"] = as_of
    answer = await read(front(request), "skill.read", args)
    if not answer.get("skill"):
        raise Problem(404, "not_found", f"no skill {name}" + (f" as of seq {as_of}" if as_of else ""))
    return SkillRead(skill=answer["skill"], file=_file(name, answer, file, "skill"))


@router.get("/skills/{name:skill_name}/revisions", response_model=Revisions, responses=responses(404),
            summary="A skill's revisions, newest first")
async def revisions(request: Request, name: str = SkillName,
                    limit: int = Query(ops.LIST_DEFAULT, ge=1, le=ops.LIST_MAX), _=Depends(READ)) -> Revisions:
    rows = (await read(front(request), "skill.revisions", {"name": name, "limit": limit})).get("revisions") or []
    if not rows:
        raise Problem(404, "not_found", f"no skill {name} was ever written")
    return Revisions(items=rows)


@router.put("/skills/{name:skill_name}", response_model=Skill, responses=responses(409),
            summary="Write a skill: every file of it, its next revision")
async def put_skill(request: Request, body: SkillWrite, name: str = SkillName, _=Depends(WRITE),
                    key: str | None = Depends(idempotency_key)) -> Skill:
    files = [{"path": f.path, "body": f.body} for f in body.files]
    try:
        skill_format.check(name, files)
    except skill_format.SkillError as exc:
        raise _invalid(exc) from None
    args: dict[str, Any] = {"name": name, "files": files}
    if body.note:
        args["note"] = body.note
    result = await _write(front(request), "skill.write", args, key)
    return Skill(**result["skill"])


@router.delete("/skills/{name:skill_name}", response_model=Skill, responses=responses(404, 409),
               summary="Retire a skill: its pages go, its history stays")
async def retire_skill(request: Request, name: str = SkillName, _=Depends(WRITE),
                       key: str | None = Depends(idempotency_key)) -> Skill:
    result = await _write(front(request), "skill.retire", {"name": name}, key)
    return Skill(**result["skill"])
