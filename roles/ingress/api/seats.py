"""The seats: who holds each, its mailbox, its last turns; and mail to one.

Listings answer from this ingress's :class:`~roles.ingress.projection.Projection`
(no broker request per seat, at any company size); one seat's page adds its
mailbox's counts as the broker has them now and its last turns from the
estate. Mail is what ``crewletctl send`` does (:func:`crewlet.queue.post.post`):
the ``Idempotency-Key`` becomes the mail's trigger, so sending again under it
is worked once (answered ``duplicate``, at once when it was worked already).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from crewlet.coord.counters import Ledger
from crewlet.estate import ops
from crewlet.queue.base import MAIL_MAX, MailboxError
from crewlet.queue.post import post
from roles.ingress.api.common import CURSOR, NOT_BLANK, decode_cursor, encode_cursor, idempotency_key, read
from roles.ingress.api.estate import Turn
from roles.ingress.auth import READ, WRITE
from roles.ingress.front import front
from roles.ingress.problems import Problem, responses, unavailable

router = APIRouter(prefix="/v1", tags=["seats"], responses=responses(401, 403, 422, 503))

# Seconds a caller may wait for the turn that works its mail.
WAIT_MAX = 120.0
SeatPath = Path(pattern=ops.SEAT_NAME, description="A seat's name")


class SeatRow(BaseModel):
    model_config = ConfigDict(extra="allow")
    seat: str
    owner: str | None = Field(description="The node holding the seat's lease; null: nobody")
    token: int | None = Field(description="The lease's fencing token")
    pending: int | None = Field(description="Mail waiting (null until first sampled)")
    in_flight: int | None = Field(description="Mail being worked")
    dead_letters: int
    last_turn: dict[str, Any] | None


class SeatPage(BaseModel):
    items: list[SeatRow]
    next: str | None


class SeatDetail(SeatRow):
    redelivered: int | None = None
    last_turns: list[Turn]


class Mail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=MAIL_MAX, pattern=NOT_BLANK)
    wait: float | None = Field(None, gt=0, le=WAIT_MAX,
                               description="Seconds to wait for the turn that works the mail")


class Sent(BaseModel):
    seat: str
    seq: int = Field(description="The mail's sequence in the mailbox stream")
    trigger: str
    duplicate: bool = Field(False, description="The mailbox held this trigger already: no new "
                                               "mail, no turn of its own (with wait: answered at "
                                               "once when its first copy was worked)")
    worked: bool = Field(False, description="With wait: a duplicate whose trigger the seat's "
                                            "ledger says was worked already (turn is null)")
    turn: dict[str, Any] | None = Field(description="With wait: the turn, if it ended in time")


@router.get("/seats", response_model=SeatPage, summary="Every seat: owner, mailbox, last turn",
            responses=responses(400))
async def list_seats(request: Request, limit: int = Query(100, ge=1, le=1000), cursor: str | None = CURSOR,
                     _=Depends(READ)) -> SeatPage:
    f = front(request)
    f.need_company()
    after = decode_cursor(cursor, "after").get("after")
    names = sorted(f.projection.seat_names)
    if after is not None:
        if not isinstance(after, str):
            raise Problem(400, "bad_cursor", "cursor is not one this listing gave out")
        names = [n for n in names if n > after]
    page = names[:limit]
    nxt = encode_cursor({"after": page[-1]}) if len(names) > limit else None
    return SeatPage(items=[f.projection.seat(n) for n in page], next=nxt)


@router.get("/seats/{seat}", response_model=SeatDetail, summary="One seat, with its last turns",
            responses=responses(404))
async def get_seat(request: Request, seat: str = SeatPath, _=Depends(READ)) -> SeatDetail:
    f = front(request)
    f.need_seat(seat)
    row = f.projection.seat(seat)
    try:
        row.update(await f.mailboxes.info(seat))  # as the broker has it now
    except Exception:
        pass  # the sampled counts stand
    turns = (await read(f, "turn.list", {"seat": seat, "limit": 10})).get("turns") or []
    return SeatDetail(**row, last_turns=turns)


@router.post("/seats/{seat}/mail", status_code=202, response_model=Sent, summary="Send a seat mail",
             responses=responses(400, 404, 507))
async def mail(request: Request, body: Mail, seat: str = SeatPath, grant=Depends(WRITE),
               key: str | None = Depends(idempotency_key)) -> Sent:  # the token first: a 401 before a 400
    f = front(request)
    f.need_seat(seat)
    f.need_space("the mail was not sent")
    try:
        sent = await post(f.nc, f.mailboxes, seat, body.text, sender=f"api:{grant.name}",
                          trigger=key, wait=body.wait, ledger=Ledger(f.js, ttl=0))
    except MailboxError as exc:
        raise unavailable(exc, "mailbox_unavailable", f"the mailbox did not take the mail: {exc}; send it "
                                                      "again with the same Idempotency-Key") from None
    if f.metrics is not None:
        f.metrics.mail_sent.inc()
    return Sent(**sent)
