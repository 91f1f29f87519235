"""The company: the revision in force, and applying a new one (admin)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from crewlet.company import parse_company
from crewlet.config import ConfigError
from crewlet.coord.control_plane import ControlPlaneError, RevisionTooLarge, check_size
from roles.ingress.auth import ADMIN, READ
from roles.ingress.front import front
from roles.ingress.problems import Problem, responses, unavailable

router = APIRouter(prefix="/v1", tags=["company"], responses=responses(401, 403, 503))

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


class Revision(BaseModel):
    rev: int | None
    epoch: int | None
    digest: str | None
    name: str | None
    seats: int
    company: dict[str, Any] | None = Field(description="The whole company, as applied")


class Applied(BaseModel):
    rev: int
    epoch: int
    digest: str
    seats: int
    changed: bool = Field(description="false: this company was in force already (200), no revision made")


@router.get("/company", response_model=Revision, summary="The company revision in force on this node")
async def get_company(request: Request, _=Depends(READ)) -> Revision:
    f = front(request)
    current = f.projection.company
    if current is None:
        return Revision(rev=None, epoch=None, digest=None, name=None, seats=0, company=None)
    return Revision(rev=current.get("rev"), epoch=current.get("epoch"), digest=current.get("digest"),
                    name=current["company"]["company"]["name"], seats=len(current["company"]["seats"]),
                    company=current["company"])


@router.post("/company", status_code=201, response_model=Applied,
             responses={**responses(400, 415, 422, 507),
                        200: {"model": Applied, "description": "In force already: nothing changed"}},
             summary="Apply a company revision (admin)",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"type": "object"}},
                 "application/yaml": {"schema": {"type": "string"}}}}})
async def apply_company(request: Request, grant=Depends(ADMIN)) -> Applied:
    """The body is a company file: JSON, or YAML with a YAML content type. It is
    validated whole first; a bad one is a 422 naming the key, and nothing is
    stored. Every node of the fleet then applies the new revision (201). The
    company in force already is a 200 with ``changed: false``: applying is
    idempotent by content, so a retry makes no second revision."""
    f = front(request)
    kind = (request.headers.get("content-type") or "application/json").split(";")[0].strip().lower()
    raw = await request.body()
    source = f"api:{grant.name}"
    if kind in YAML_TYPES:
        text = raw.decode("utf-8", errors="replace")
    elif kind == "application/json":
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise Problem(400, "bad_body", f"the body is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise Problem(422, "invalid", "the body must be a company document (an object)")
        text = json.dumps(doc)  # JSON is YAML: one parser, one set of errors
    else:
        raise Problem(415, "unsupported_media_type", f"send the company as application/json or "
                                                     f"application/yaml, not {kind}")
    try:
        # In a thread: a company of 10,000 seats takes seconds to parse and validate.
        # env={}: no ${VAR} of this node's environment.
        company = await asyncio.to_thread(parse_company, text, source, env={})
    except ConfigError as exc:
        raise Problem(422, "invalid_company", str(exc), key=exc.key) from None
    try:
        # What the control plane would refuse, said before anything is sent.
        await asyncio.to_thread(check_size, company)
    except RevisionTooLarge as exc:
        raise Problem(413, "company_too_large", str(exc)) from None
    f.need_space("nothing was applied")
    if f.control_plane is None:
        raise Problem(503, "unavailable", "the control plane is not open yet", headers={"Retry-After": "2"})
    try:
        # The company in force already: a retry of an apply that landed (its answer lost),
        # or a deploy that changed nothing. Answered as it stands: no new revision.
        active = await f.control_plane.active()
        if active is not None:
            current = await f.control_plane.record(active["rev"])  # its digest: no company read
            if current.get("digest") == company.digest():
                return JSONResponse(Applied(rev=active["rev"], epoch=active["epoch"], digest=company.digest(),
                                            seats=len(company.seats), changed=False).model_dump())
        rev, epoch = await f.control_plane.apply(company, source, by=grant.name)
    except ControlPlaneError as exc:
        raise unavailable(exc, "control_plane_unavailable", str(exc), retry_after=5) from None
    return Applied(rev=rev, epoch=epoch, digest=company.digest(), seats=len(company.seats), changed=True)
