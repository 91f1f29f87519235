"""The fleet as this ingress sees it: nodes, their children and copies, duties."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from roles.ingress.auth import READ
from roles.ingress.front import front
from roles.ingress.problems import responses

router = APIRouter(prefix="/v1", tags=["fleet"], responses=responses(401, 403))


class Node(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    state: str = Field(description="up: its presence is live; gone: it went (kept a while to show it)")
    roles: list[str]
    children: list[dict[str, Any]] | None = Field(description="Its role children; null if not known")
    copy_: dict[str, Any] | None = Field(alias="copy", description="Its copy of the estate (data nodes)")
    seats: int
    duties: list[str]
    sandbox: dict[str, Any] | None = Field(None, description="How its seats' tools run: mode (auto|required|off), "
                                           "state (confined|unconfined|refused), reason; null: no seats or not known")
    gone_at: float | None


class Fleet(BaseModel):
    node: str = Field(description="The node that answered")
    company: dict[str, Any] | None = Field(description="The revision in force: name, rev, epoch, digest")
    nodes: list[Node]
    duties: list[dict[str, Any]]
    at: float


@router.get("/fleet", response_model=Fleet, response_model_by_alias=True,
            summary="Nodes, their children and copies, duties, the revision")
async def fleet(request: Request, _=Depends(READ)) -> Any:
    p = front(request).projection
    return {"node": p.node_id, "company": p.company_summary(), "nodes": p.nodes(), "duties": p.duties(),
            "at": p.clock()}
