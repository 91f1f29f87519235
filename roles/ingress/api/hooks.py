"""Webhooks: ``POST /v1/hooks/{integration}`` (DESIGN §10).

No bearer token: a delivery proves itself by its signature, made with the
integration's secret: a fleet secret (``secret``, :mod:`crewlet.vault`; its
old version is still taken while a rotation's grace lasts) or ``secret_env``
on every ingress node — never in the company revision. The order of work is
the contract:

1. the integration is looked up (404 if the company has none by that name);
2. the signature is checked, in constant time, before the body is read for
   anything else (:func:`crewlet.hooks.receive`): a bad one is a 401;
3. a Slack ``url_verification`` is answered at once, and stores nothing;
4. the delivery is routed to a seat (the integration's routes, first match);
   none matching is a 202 ``routed: false``, stored nowhere;
5. its id is claimed in ``claims`` with a create — the first node wins; a
   delivery already stored is a 200 ``duplicate: true`` and goes nowhere;
6. it is stored in ``NOTIFY`` (:mod:`crewlet.queue.notify`), and only then
   answered 200. A store nobody answered is a 503: the sender retries.

What happens when a node dies between 5 and 6: :mod:`crewlet.queue.notify`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from crewlet import hooks, log
from crewlet.bus import Unanswered
from crewlet.queue import notify
from roles.ingress.front import front
from roles.ingress.problems import Problem, responses, unavailable

router = APIRouter(prefix="/v1", tags=["webhooks"])


class Accepted(BaseModel):
    delivery: str
    integration: str
    routed: bool
    seat: str | None
    duplicate: bool
    person: str | None = None  # the company's person who sent it (people.<id>.identities), if known


class Challenge(BaseModel):
    challenge: str


@router.post("/hooks/{integration}", summary="Receive a webhook delivery",
             response_model=Accepted | Challenge,
             responses={**responses(400, 401, 404, 503),
                        200: {"description": "Stored (or a repeat of one stored); a Slack "
                                             "url_verification is answered its challenge"},
                        202: {"model": Accepted, "description": "Accepted, but no route matched: not stored"}},
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"type": "object"}}}}})
async def receive(request: Request, integration: str = Path(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")) -> Any:
    f = front(request)
    metrics = f.metrics
    company = f.need_company()
    spec = company.integrations.get(integration)
    if spec is None:
        raise Problem(404, "no_such_integration", f"the company has no integration {integration!r}")
    if spec.secret is not None:
        # The newest version, and the one it replaced while its grace lasts.
        secrets = await f.vault.accepted(spec.secret) if f.vault is not None else []
        fix = f"crewletctl secret set {spec.secret}"
    else:
        secrets = [os.environ.get(spec.secret_env) or ""]
        fix = f"set ${spec.secret_env} on every ingress node"
    if not any(secrets):
        log.event("webhook_secret_missing", "error", integration=integration,
                  secret=spec.secret, env=spec.secret_env)
        raise Problem(503, "secret_missing", f"this node has no secret for integration {integration}: {fix}",
                      headers={"Retry-After": "60"})
    body = await request.body()
    try:
        delivery = hooks.receive(integration, spec, request.headers, body,
                                 secret=[s.encode() for s in secrets if s], now=time.time(),
                                 known_as=company.person_known_as)
    except hooks.Refused as exc:
        if metrics is not None:
            metrics.webhook(integration, exc.code)
        raise Problem(exc.status, exc.code, exc.detail) from None
    if delivery.answer is not None:
        return JSONResponse(delivery.answer)
    seat = hooks.route(spec, delivery)
    if seat is None:
        if metrics is not None:
            metrics.webhook(integration, "unrouted")
        return JSONResponse(Accepted(delivery=delivery.id, integration=integration, person=delivery.person,
                                     routed=False, seat=None,
                                     duplicate=False).model_dump(), 202)
    try:
        had = await notify.claim(f.js, integration, delivery.id, node=f.node_id, seat=seat)
        if had == notify.STORED:
            if metrics is not None:
                metrics.webhook(integration, "duplicate")
            return Accepted(delivery=delivery.id, integration=integration, person=delivery.person,
                            routed=True, seat=seat,
                            duplicate=True)
        # Ours, or claimed by a node that may have died before storing it: store it.
        repeat = await notify.store(f.js, integration, delivery.id, seat, delivery.text, delivery.person)
    except Unanswered as exc:
        if metrics is not None:
            metrics.webhook(integration, "unstored")
        raise unavailable(exc, "not_stored", f"the delivery could not be stored: {exc}; send it again",
                          retry_after=5) from None
    except Exception as exc:  # the claims bucket unanswered: nothing stored, the sender retries
        if metrics is not None:
            metrics.webhook(integration, "unstored")
        log.event("webhook_store_failed", "warning", integration=integration, delivery=delivery.id,
                  error=f"{type(exc).__name__}: {exc}")
        raise unavailable(exc, "not_stored", "the delivery could not be claimed or stored; send it again",
                          retry_after=5) from None
    try:
        await notify.mark_stored(f.js, integration, delivery.id, node=f.node_id, seat=seat)
    except Exception as exc:  # stored all the same: a retry stores it again, harmlessly
        log.event("webhook_claim_unmarked", "warning", integration=integration, delivery=delivery.id,
                  error=f"{type(exc).__name__}: {exc}")
    duplicate = had is not None and repeat
    if metrics is not None:
        metrics.webhook(integration, "duplicate" if duplicate else "stored")
    return Accepted(delivery=delivery.id, integration=integration, person=delivery.person,
                    routed=True, seat=seat,
                    duplicate=duplicate)
