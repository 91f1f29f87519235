"""The schedules: each one's next tick and last fire, and by whom (what ``crewletctl schedules`` shows).

The company is this node's revision in force; the last fires are the
``scheduler`` duty's records (``status/schedule.<name>``, read from the
stream's leader, one request a schedule); the holder is this ingress's watch
of the leases. Records that cannot be read are a 503.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from crewlet.coord.fired import Fired, FiredError
from crewlet.schedules import rows
from roles.ingress.api.common import ride_out
from roles.ingress.auth import READ
from roles.ingress.front import front
from roles.ingress.problems import responses, unavailable

router = APIRouter(prefix="/v1", tags=["schedules"], responses=responses(401, 403, 503))


class Fire(BaseModel):
    scheduled: str = Field(description="When the tick was due, ISO-8601 UTC")
    trigger: str | None = Field(description="Its trigger id: <schedule>=<YYYYMMDDTHHMMSSZ>")
    fired_at: float | None = Field(description="When its mail was sent, unix time")
    node: str | None = Field(description="The node that sent it")
    token: int | None = Field(description="The duty's fencing token it was sent under")


class Schedule(BaseModel):
    name: str
    seat: str
    timing: str = Field(description="every <n>s, or cron <five fields> <tz>")
    catch_up: str
    next: str = Field(description="The next tick, ISO-8601 UTC")
    due: bool = Field(description="The next tick is past and nobody fired it yet (no holder, or busy)")
    last: Fire | None


class Schedules(BaseModel):
    rev: int | None = Field(description="The company revision in force on this node")
    holder: dict[str, Any] | None = Field(description="{node, token} holding duty.scheduler, or null")
    schedules: list[Schedule]
    at: float


@router.get("/schedules", response_model=Schedules,
            summary="Each schedule's next tick and last fire, and by whom")
async def schedules(request: Request, _=Depends(READ)) -> Any:
    f = front(request)
    p = f.projection
    holder = next(({"node": d["node"], "token": d["token"]} for d in p.duties() if d["name"] == "scheduler"),
                  None)
    now = p.clock()
    if f.company is None:
        return {"rev": None, "holder": holder, "schedules": [], "at": now}
    try:
        records = await ride_out(Fired(f.js).all) if f.company.schedules else {}
    except FiredError as exc:
        raise unavailable(exc, "unavailable", f"the schedules' records could not be read: {exc}") from None
    return {"rev": (p.company_summary() or {}).get("rev"), "holder": holder,
            "schedules": rows(f.company.schedules, records, now), "at": now}
