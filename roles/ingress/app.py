"""The ingress ASGI application: the API (``/v1``), health, metrics, the dashboard.

* ``GET /healthz`` — this process answers: 200 with the node id. No token.
* ``GET /readyz`` — the node's children are all running, its disk is
  above ``node.disk_floor`` and some copy of the estate is in service (its
  own, or a peer's the router would ask): 200, else 503 with the children
  that are not, ``disk`` (the reason naming the path and its free bytes,
  :mod:`crewlet.disk`; asked of crewletd over ``control``, its brief
  ``children`` answer, not the whole ``status``) and ``estate``; and the
  fleet's JetStream serves the API — the ``RUNS`` stream's leader answers
  within :data:`READY_PROBE` seconds, and no route answered
  ``fleet_reforming`` in the last :data:`~roles.ingress.problems.RETRY_AFTER`
  seconds — else 503 with ``fleet`` saying it is re-forming (a leader
  election: a member died or froze) and ``Retry-After``, as the API's routes
  say then (:mod:`roles.ingress.problems`); and the node is not drained
  (``draining``: the operator's order, :mod:`crewlet.coord.drain`).
  No token.
* ``/v1/...`` — the API (:mod:`roles.ingress.api`); its OpenAPI 3.1 document
  is ``/v1/openapi.json``, browsable at ``/docs``.
* ``GET /metrics`` — Prometheus (:mod:`roles.ingress.metrics`).
* ``GET /`` — the dashboard: static files talking to ``/v1``.

Around every request: the browser hardening of :mod:`roles.ingress.hardening`
(a strict Content-Security-Policy and its siblings on every answer); bodies past ``ingress.max_body`` are a 413 before a
route reads them (a file's upload: past ``files.max_bytes``, by its route); every error is ``application/problem+json``
(:mod:`roles.ingress.problems`); CORS only for ``ingress.cors_origins``.

The OpenAPI document says so too (:func:`_document_problems`): FastAPI's own
422 (``application/json``, its ``HTTPValidationError``) is replaced by the
problem it really is, an error is documented as ``application/problem+json``
only (FastAPI adds ``application/json`` beside it), and every operation that
takes a body may answer 413.
"""

from __future__ import annotations

import os
import re
import time

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

import crewlet
from crewlet import bus, ipc, log
from crewlet.conversations import runs
from crewlet.coord import drain
from crewlet.tokens import Keyring
from roles.ingress import auth, hardening
from roles.ingress.api import (admin, company, conversations, dlq, estate, feed, files, fleet, hooks, schedules,
                               seats, secrets, skills)
from roles.ingress import mcp
from roles.ingress.front import Front
from roles.ingress.problems import problem_response
from roles.ingress import problems

DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboard")
ROUTERS = (fleet.router, seats.router, estate.router, files.router, dlq.router, company.router,
           hooks.router, feed.router, schedules.router, conversations.router, secrets.router, admin.router,
           skills.router)


class BodyLimit:
    """A 413 for a body past *limit* bytes: by its Content-Length before the
    route runs, or once a chunked body passes it. A file's upload is held to
    ``files.max_bytes`` by its own route (roles/ingress/api/files.py), which
    streams it to the store rather than reading it."""

    # PUT /v1/files/{project}/{path}
    EXEMPT = re.compile(r"^/v1/files/[^/]+/.")

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or (scope["method"] == "PUT" and self.EXEMPT.match(scope["path"])):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        too_big = self._problem()
        if length is not None:
            try:
                if int(length) > self.limit:
                    return await too_big(scope, receive, send)
            except ValueError:
                return await problem_response(400, "bad_request", "Content-Length is not a number")(
                    scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooBig(self._detail())
            return message

        try:
            await self.app(scope, counted, send)
        except _TooBig:
            await too_big(scope, receive, send)

    def _detail(self) -> str:
        return f"the body is larger than this node takes ({self.limit} bytes: ingress.max_body)"

    def _problem(self) -> Response:
        return problem_response(413, "body_too_large", self._detail())


class _TooBig(StarletteHTTPException):
    """Raised by a chunked body's receive once it passes the limit. An HTTP
    exception, so FastAPI's body parsing lets it through (anything else it
    answers as a 400 "error parsing the body") and the app's handler answers
    it as the 413 problem (:mod:`roles.ingress.problems`)."""

    def __init__(self, detail: str):
        super().__init__(413, detail)


class Observe:
    """Each request timed into ``crewlet_api_request_duration_seconds`` by its
    route's template, and each write (and each 5xx) logged with the caller's
    token *name* — never the token. Plain ASGI: Starlette's ``@middleware``
    costs ~0.1-0.2 ms of CPU a request and sits in every event of a stream
    (bench/api.py). The live feed's streams are not timed: their length is
    how long a client stayed, not a latency."""

    def __init__(self, app, front: Front | None):
        self.app, self.front = app, front

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500  # what an exception that escaped every handler becomes

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self._observe(scope, status, time.perf_counter() - started)

    def _observe(self, scope, status: int, took: float) -> None:
        template = getattr(scope.get("route"), "path", None) or "unmatched"
        method = scope["method"]
        if self.front is not None and self.front.metrics is not None and template != "/v1/events":
            self.front.metrics.api.labels(method, template, str(status)).observe(took)
        if (method != "GET" or status >= 500) and (template, status) not in _ANSWERS:
            caller = (scope.get("state") or {}).get("caller")
            log.event("api_request", "info" if status < 500 else "warning", method=method,
                      route=template, status=status, ms=round(took * 1000, 1),
                      caller=caller.name if caller is not None else None)


# Statuses a route answers by design, not failures: not logged (a load
# balancer probing a starting node, or one whose disk is low, would fill the
# log with them; what keeps the node unready is logged where it happens).
_ANSWERS = frozenset({("/readyz", 503)})


def _document_problems(doc: dict) -> dict:
    """*doc*, the generated OpenAPI document, saying what the app answers around
    the routes: validation errors as problems, a 413 wherever a body is taken."""
    problem = {k: v for k, v in problems.responses(422)[422].items() if k != "model"}
    too_big = {k: v for k, v in problems.responses(413)[413].items() if k != "model"}
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            answers = operation.get("responses", {})
            if "422" in answers and problems.MEDIA_TYPE not in answers["422"].get("content", {}):
                answers["422"] = problem
            for answer in answers.values():
                if problems.MEDIA_TYPE in answer.get("content", {}):
                    answer["content"].pop("application/json", None)
            if "requestBody" in operation:
                answers.setdefault("413", too_big)
    schemas = doc.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return doc


def _no_estate(front: Front | None) -> str | None:
    """Why this node's API cannot reach the estate now (None: it can; also
    before the front has its router): on a node just started, until its
    applier has caught up and said so. The tracker, knowledge-base and
    conversation routes would answer 503 meanwhile."""
    router = getattr(front, "router", None)
    return router.unserved() if router is not None else None


JOINING = {"reason": "this node's presence is not seen yet: it may come back drained"}


def _draining(front: Front | None) -> dict | None:
    """This node's drain order, as its presence says it (None: it serves):
    a load balancer stops sending it anything from the moment it drains. Not
    known before the presence is seen (:data:`JOINING`): a node restarted in
    the middle of an upgrade comes back drained, and must not say ready first."""
    projection = getattr(front, "projection", None)
    if projection is None:
        return None
    mine = projection.holders.get(f"node.{projection.node_id}")
    return drain.draining(mine.info) if mine is not None else JOINING


# Seconds readiness waits for the fleet's JetStream to answer: a load
# balancer's probe is not held for an election's length.
READY_PROBE = 1.0


async def _reforming(front: Front | None) -> str | None:
    """Why the fleet's JetStream cannot serve this node's API now — the
    ``RUNS`` stream's leader not answering within :data:`READY_PROBE` (a
    leader election, a member dead or frozen, this node's broker
    restarting), or a route having answered ``fleet_reforming`` lately
    (:func:`roles.ingress.problems.lately_reforming`: a meta leader's
    election, another stream's) — or None. Not before the front is made
    nor before ``RUNS`` exists; any other failure of the probe is not this
    one's to say."""
    nc = getattr(front, "nc", None)
    if nc is None:
        return None
    js = bus.jetstream(nc, front.cfg.stream, timeout=READY_PROBE)
    try:
        await js.stream_info(runs.STREAM)
    except Exception as exc:
        why = problems.reforming(exc)
        if why is not None:
            return (f"the fleet is re-forming: stream {runs.STREAM}'s leader did not answer "
                    f"({problems.describe(why)})")
    return problems.lately_reforming()


def make_app(ctx, front: Front | None = None, keyring: Keyring | None = None) -> FastAPI:
    cfg = ctx.config
    app = FastAPI(title="crewlet", version=crewlet.__version__, openapi_url="/v1/openapi.json",
                  docs_url=None, redoc_url=None,  # /docs: roles.ingress.hardening
                  description="The HTTP API of a crewlet node: the fleet, the seats and their mail, "
                              "turns, the tracker, the knowledge base, dead letters, webhooks and "
                              "the live feed. Every /v1 route but the webhooks takes "
                              "`Authorization: Bearer <token>`; errors are application/problem+json.")
    app.state.front = front
    app.state.keyring = keyring
    problems.install(app)
    # Security headers on every answer, the API docs without a CDN, no query value in uvicorn's log.
    hardening.install(app)
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = _document_problems(generate())
        return app.openapi_schema

    app.openapi = openapi
    # Inside Observe (added later, so it wraps this): 413s are observed too.
    app.add_middleware(BodyLimit, limit=cfg.ingress.max_body)

    app.add_middleware(Observe, front=front)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "node": ctx.node_id})

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        try:
            reply = await ipc.acall(ctx.zmq, ctx.run_dir, "children", timeout=2.0)
        except ipc.NodeUnreachable as exc:
            return JSONResponse({"ready": False, "node": ctx.node_id, "reason": str(exc)}, 503)
        children = reply["result"]["children"]
        waiting = [{"name": c["name"], "state": c["state"]}
                   for c in children if c["state"] != "running"]
        space = reply["result"].get("disk") or {}
        # Not ready while the disk is low, or the broker waits for space to be restarted.
        no_space = space.get("reason") if space.get("low") else space.get("broker")
        no_estate = _no_estate(front)
        draining = _draining(front)
        reforming = await _reforming(front)
        ready = not waiting and not no_space and not no_estate and not reforming and not draining
        # How the seats' tools run: said, not a reason to be unready (the
        # node serves; an unconfined tool is the operator's to fix or accept).
        box = reply["result"].get("sandbox")
        body = {"ready": ready, "node": ctx.node_id, "not_running": waiting, "disk": no_space,
                "estate": no_estate, "fleet": reforming, "draining": draining, "sandbox": box}
        headers = {"Retry-After": str(problems.RETRY_AFTER)} if reforming else None
        return JSONResponse(body, 200 if ready else 503, headers=headers)

    metrics_auth = [] if cfg.ingress.metrics_open else [Depends(auth.READ)]

    @app.get("/metrics", include_in_schema=False, dependencies=metrics_auth)
    async def metrics() -> Response:
        if front is None or front.metrics is None:
            return problem_response(503, "unavailable", "metrics are not ready yet")
        return Response(generate_latest(front.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # The operator MCP server (crewlet.operator): its tools are this API's routes.
    app.state.mcp = mcp.McpEndpoint(app.openapi, keyring, cfg.ingress.listen)
    app.add_route(mcp.PATH, app.state.mcp, include_in_schema=False)
    for router in ROUTERS:
        app.include_router(router)
    # FastAPI keeps included routers whole (not their routes): what a 405's Allow names.
    app.state.route_methods = [(route.path_regex, route.methods) for router in ROUTERS
                               for route in router.routes if getattr(route, "methods", None)]

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse("/ui/")

    app.mount("/ui", StaticFiles(directory=DASHBOARD, html=True), name="dashboard")
    if cfg.ingress.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cfg.ingress.cors_origins),
                           allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "Idempotency-Key",
                                          "Last-Event-ID"])
    return app
