"""The fleet's secrets (:mod:`crewlet.vault`), for an admin token: list them,
set a new version, remove one — what ``crewletctl secret`` does, through this
node's crewletd, which seals and stores. A value goes in and never comes out:
no answer, listing or log holds one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from crewlet.company.model import SECRET_NAME_RE
from crewlet.vault.store import CALLER_WAIT as WRITE_TIMEOUT
from crewlet.vault.store import GRACE_MAX, VALUE_MAX
from roles.ingress.auth import ADMIN
from roles.ingress.front import front
from roles.ingress.problems import responses

router = APIRouter(prefix="/v1", tags=["secrets"], responses=responses(401, 403))

_NAME = Path(..., pattern=SECRET_NAME_RE.pattern, description="The secret's name, as the company names it")


class Secret(BaseModel):
    name: str
    version: int = Field(description="Each set is the next version")
    by: str = Field(description="Who set it: crewletctl@<node> or api:<token name>")
    at: float = Field(description="When it was set (seconds since 1970)")
    key: str = Field(description="The id of the key that sealed it (never the key)")
    readable: bool | None = Field(None, description="Whether this node holds that key")
    previous_until: float | None = Field(description="Until when the version it replaced is still accepted "
                                                     "by webhooks; null: it is not")
    named_by: list[str] = Field(default_factory=list, description="What in the company names it")


class Missing(BaseModel):
    name: str
    named_by: list[str]


class Secrets(BaseModel):
    secrets: list[Secret]
    missing: list[Missing] = Field(description="Named by the company, not set")
    key: str | None = Field(description="The id of the key this node seals with; null: it has none")


class NewVersion(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # a grace of `false` is no number
    value: str = Field(min_length=1, max_length=VALUE_MAX, description="The secret (never shown again)")
    grace: float | None = Field(None, ge=0, le=GRACE_MAX,
                                description="Seconds the version it replaces is still accepted by webhooks "
                                            "(default 3600; 0: none)")


class Set(BaseModel):
    secret: Secret


class Removed(BaseModel):
    removed: str
    named_by: list[str] = Field(description="What in the company still names it (it fails at its next use)")


@router.get("/secrets", response_model=Secrets, summary="The fleet's secrets: names and versions, never values "
                                                        "(admin)", responses=responses(409, 503))
async def list_secrets(request: Request, _=Depends(ADMIN)) -> Any:
    return await front(request).ask_node("secret", action="list")


@router.put("/secrets/{name}", response_model=Set, responses=responses(400, 409, 422, 503),
            summary="Set a new version of a secret, fleet-wide (admin)")
async def set_secret(request: Request, body: NewVersion, name: str = _NAME, grant=Depends(ADMIN)) -> Any:
    """Sealed and stored; every node uses it within a second, with no restart
    (README: Secrets, rotated without a restart)."""
    return await front(request).ask_node("secret", WRITE_TIMEOUT, action="set", name=name, value=body.value,
                                         grace=body.grace, by=f"api:{grant.name}")


@router.delete("/secrets/{name}", response_model=Removed, responses=responses(400, 404, 422, 503),
               summary="Remove a secret, every version (admin)")
async def remove_secret(request: Request, name: str = _NAME, grant=Depends(ADMIN)) -> Any:
    return await front(request).ask_node("secret", WRITE_TIMEOUT, action="remove", name=name,
                                         by=f"api:{grant.name}")
