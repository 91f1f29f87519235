"""Dead letters: mail that spent its delivery budget, and putting one back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, Field

from crewlet.estate import ops
from crewlet.queue.base import MailboxError
from roles.ingress.api.common import CURSOR, INT_MAX, SEQ_MAX, decode_cursor, encode_cursor, ride_out, seq_at
from roles.ingress.auth import READ, WRITE
from roles.ingress.front import front
from roles.ingress.problems import Problem, responses, unavailable

router = APIRouter(prefix="/v1", tags=["dead letters"], responses=responses(401, 403, 422, 503))


class DeadLetter(BaseModel):
    seq: int
    seat: str
    reason: str
    deliveries: int
    original_seq: int
    at: float
    trigger: str | None
    sender: str | None
    text: str


class DeadLetterPage(BaseModel):
    items: list[DeadLetter]
    next: str | None


class Requeued(BaseModel):
    requeued: int = Field(description="The dead letter's seq, now gone from the DLQ")
    seq: int = Field(description="The mail's new seq in its seat's mailbox")


@router.get("/dlq", response_model=DeadLetterPage, summary="Dead letters, oldest first",
            responses=responses(400, 404))
async def list_dead(request: Request, seat: str | None = Query(None, pattern=ops.SEAT_NAME),
                    limit: int = Query(100, ge=1, le=500), cursor: str | None = CURSOR,
                    _=Depends(READ)) -> DeadLetterPage:
    f = front(request)
    if seat is not None:
        f.need_seat(seat)
    at = decode_cursor(cursor, "after")
    # The listing reads from after + 1, which must be a sequence the broker takes.
    after = seq_at(at, "after", low=0, high=SEQ_MAX - 1) if "after" in at else 0
    try:
        letters = await ride_out(lambda: f.mailboxes.dead_letters(seat, limit=limit + 1, after=after))
    except MailboxError as exc:
        raise unavailable(exc, "dlq_unavailable", f"the dead letters could not be read: {exc}") from None
    rows: list[dict[str, Any]] = [d.row() for d in letters[:limit]]
    nxt = encode_cursor({"after": rows[-1]["seq"]}) if len(letters) > limit else None
    return DeadLetterPage(items=rows, next=nxt)


@router.post("/dlq/{seq}/requeue", response_model=Requeued, summary="Put a dead letter back in its mailbox",
             responses=responses(404))
async def requeue(request: Request, seq: int = Path(ge=1, le=INT_MAX), _=Depends(WRITE)) -> Requeued:
    f = front(request)
    try:
        new = await f.mailboxes.requeue(seq)
    except LookupError as exc:
        raise Problem(404, "not_found", str(exc)) from None
    except MailboxError as exc:
        if str(exc).startswith("no dead letter"):
            raise Problem(404, "not_found", f"{exc} (already requeued, or never one)") from None
        raise unavailable(exc, "dlq_unavailable", f"could not requeue dead letter {seq}: {exc}") from None
    return Requeued(requeued=seq, seq=new)
