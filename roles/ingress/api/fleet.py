"""The fleet as this ingress sees it: nodes, their children and copies, duties;
and draining a node (:mod:`crewlet.coord.drain`), which crewletd writes for us."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from roles.ingress.auth import ADMIN, READ
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
    protocol: int | None = Field(None, description="The protocol it speaks (nodes of one fleet speak one)")
    conversations: int = Field(0, description="Conversation runs it drives now")
    draining: dict[str, Any] | None = Field(None, description="The operator's drain order in force: since, "
                                                              "until (running turns cut short then), by")
    drain: str | None = Field(None, description="draining: handing its work over; drained: it holds nothing; "
                                                "null: it serves")


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


class DrainOrder(BaseModel):
    model_config = ConfigDict(extra="forbid")
    deadline: float | None = Field(None, ge=0, le=86400,
                                   description="Seconds its running turns and driven runs are given before "
                                               "they are handed over (default: Tier A fleet.drain_deadline)")


class Drained(BaseModel):
    node: str
    draining: dict[str, Any] | None = Field(description="The order in force (since, until, by); null: undrained")


_NODE = Path(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", description="A node id")


@router.post("/fleet/nodes/{node}/drain", response_model=Drained, responses=responses(400, 404, 409, 422, 503),
             summary="Drain a node: it hands its seats, duties and runs over and serves nothing (admin)")
async def drain_node(request: Request, body: DrainOrder | None = None, node: str = _NODE,
                     grant=Depends(ADMIN)) -> Any:
    """The node stops claiming, hands its seats over (their mail NAKed, so a
    peer has it at once), lets its running turns finish up to the deadline,
    gives up its duties and the runs it drives, and answers ``/readyz`` 503
    ``draining``. It keeps its broker and its copy of the estate. The order
    outlives its restarts, until ``undrain`` (README: Upgrading a fleet)."""
    args: dict[str, Any] = {"node": node, "by": f"api:{grant.name}"}
    if body is not None and body.deadline is not None:
        args["deadline"] = body.deadline
    return await front(request).ask_node("drain", **args)


@router.post("/fleet/nodes/{node}/undrain", response_model=Drained, responses=responses(404, 409, 422, 503),
             summary="Put a drained node back to work (admin)")
async def undrain_node(request: Request, node: str = _NODE, grant=Depends(ADMIN)) -> Any:
    """The drain order goes: the node claims its fair share of seats again and
    takes duties and runs. A node of another protocol than the nodes serving
    is refused (409): upgrade it first."""
    return await front(request).ask_node("drain", node=node, undo=True, by=f"api:{grant.name}")
