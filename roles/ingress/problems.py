"""Errors of the HTTP API: ``application/problem+json`` (RFC 9457).

Every error the API answers is one :class:`Problem`: an HTTP ``status``, a
machine ``code`` (stable, snake_case: what a client branches on) and a human
``detail`` (one sentence: what was wrong and what to do). Extra members ride
along (``answers``: what each data node said, for a 503 of the estate).

The handlers installed by :func:`install` turn everything else into one too:
FastAPI's validation errors (422, naming each field), Starlette's 404/405
(a 405's ``Allow`` names every method of the path, not only one route's:
``app.state.route_methods``, ``[(path regex, methods)]``, set by the app),
and any other exception (500, logged with its traceback; the body says only
that it is a bug, never the exception's text).

**The fleet re-forming is not a bug** (issue 29). While a member of an R3
fleet dies, freezes or loses its broker, the broker's JetStream elects new
stream and meta leaders (~5-6 s, DESIGN §4): its requests time out, find no
responders, or are answered "temporarily unavailable". :func:`reforming`
tells such a failure from any other, by the exception or what it was
raised from (``raise ... from exc``, or ``from None`` over it), and it is
mapped here, in one place:

* escaping a route before its answer started (:class:`Reforming`, around
  every route): a 503 ``fleet_reforming`` with ``Retry-After``, logged
  ``api_fleet_reforming`` at warning — never a 500, nothing at error level;
* cutting a started answer short (a stream, a download): the connection is
  cut as for any failure (a client must not take it for a whole answer),
  and uvicorn's record of it is a warning (:class:`QuietReforming`);
* a route that maps its own failure to a 503 (``runs_unavailable``, …)
  makes it with :func:`unavailable`: ``fleet_reforming`` when that is the
  cause, its own code otherwise.

Every 503 carries ``Retry-After`` (:data:`RETRY_AFTER` unless it says
another). A route whose read can ride the election out retries first, for a
bound a client would wait (:func:`roles.ingress.api.common.ride_out`).
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from nats import errors as nats_errors
from nats.js import errors as js_errors
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from crewlet import log
from crewlet.bus import Unanswered

MEDIA_TYPE = "application/problem+json"

# Codes Starlette's own errors become.
_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 409: "conflict",
               413: "body_too_large", 415: "unsupported_media_type", 422: "invalid",
               429: "too_many_requests", 503: "unavailable", 507: "insufficient_storage"}

# Seconds a 503 asks a client to wait before it tries again, unless it says
# another: a leader election is over in ~5-6 s, so the second retry meets a
# fleet that has re-formed.
RETRY_AFTER = 2
# The code of a 503 whose cause is the broker re-forming (reforming()).
REFORMING = "fleet_reforming"
# nats-py's errors of a broker that did not answer, or not yet: a request
# timed out (an election, a frozen member), nobody listened (a leader not
# elected yet), the connection is down or being re-made (this node's broker
# restarting), a publish got no stream answer.
_UNANSWERED = (nats_errors.TimeoutError, nats_errors.NoRespondersError, nats_errors.ConnectionClosedError,
               nats_errors.ConnectionReconnectingError, nats_errors.ConnectionDrainingError,
               nats_errors.StaleConnectionError, nats_errors.NoServersError,
               nats_errors.OutboundBufferLimitError, js_errors.NoStreamResponseError, Unanswered)
# JetStream API errors of a cluster electing: "JetStream system temporarily
# unavailable" (10008, a 503) and "JetStream cluster can not handle request"
# (10009, no leader to take it). Any API error of status 503 is one too.
TRANSIENT_ERR_CODES = frozenset({10008, 10009})
# Exceptions followed through their causes, at most (a cycle ends sooner).
_CHAIN_MAX = 16


class ProblemBody(BaseModel):
    """The body of every error (the OpenAPI document's schema for them)."""

    model_config = ConfigDict(extra="allow")
    type: str = "about:blank"
    title: str
    status: int
    code: str
    detail: str


class Problem(Exception):
    """An error answer: raise it from a route."""

    def __init__(self, status: int, code: str, detail: str, *, headers: dict[str, str] | None = None,
                 **extra: Any):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> JSONResponse:
        return problem_response(self.status, self.code, self.detail, headers=self.headers, **self.extra)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, _UNANSWERED):
        return True
    if isinstance(exc, (js_errors.NotFoundError, js_errors.BadRequestError)):
        return False
    # nats-py's APIError, and crewlet's own readings of the raw API (the
    # mailboxes' refusal): a status and the server's error code.
    if isinstance(exc, js_errors.APIError) or hasattr(exc, "err_code"):
        return getattr(exc, "code", None) == 503 or getattr(exc, "err_code", None) in TRANSIENT_ERR_CODES
    return False


def reforming(exc: BaseException | None) -> BaseException | None:
    """The failure in *exc* that says the broker's JetStream is re-forming
    (a leader election; a member dead or frozen; this node's broker being
    restarted) or does not answer: *exc* itself, or what it was raised from —
    its ``__cause__``, or the ``__context__`` a ``raise ... from None``
    replaced; every one of a group's exceptions. None: another failure (a
    bug stays a 500, even one raised while handling a timeout)."""
    seen: set[int] = set()
    for _ in range(_CHAIN_MAX):
        if exc is None or id(exc) in seen:
            return None
        seen.add(id(exc))
        if isinstance(exc, BaseExceptionGroup):
            found = [reforming(e) for e in exc.exceptions]
            return found[0] if found and all(found) else None
        if _transient(exc):
            return exc
        exc = exc.__cause__ or (exc.__context__ if exc.__suppress_context__ else None)
    return None


# The last failure of a route that was the fleet re-forming: (monotonic
# time, what it was). Readiness says it for RETRY_AFTER seconds.
_lately: tuple[float, str] | None = None


def _saw(why: BaseException, where: str) -> None:
    global _lately
    _lately = (time.monotonic(), f"{where}: {describe(why)}")


def lately_reforming(within: float = RETRY_AFTER) -> str | None:
    """What a route of this process last met that was the fleet re-forming,
    if within the last *within* seconds (readiness says the same); None."""
    seen = _lately
    if seen is None or time.monotonic() - seen[0] > within:
        return None
    return f"the fleet is re-forming: {seen[1]}"


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def unavailable(exc: BaseException, code: str, detail: str, *, retry_after: int = RETRY_AFTER,
                **extra: Any) -> Problem:
    """The 503 of a failure a route knows (*code*, *detail*): its code is
    :data:`REFORMING` when the broker re-forming is its cause
    (:func:`reforming`), with ``Retry-After`` either way."""
    why = reforming(exc)
    if why is not None:
        _saw(why, code)
        code = REFORMING
        detail = f"the fleet is re-forming (a leader election): {detail}; try again shortly"
    return Problem(503, code, detail, headers={"Retry-After": str(retry_after)}, **extra)


class Reforming:
    """ASGI, around every route: a failure that is the broker re-forming
    (:func:`reforming`) and escaped the route before its answer started is
    answered 503 :data:`REFORMING` with ``Retry-After`` and logged
    ``api_fleet_reforming`` at warning (not as a bug: a 500, at error). Once
    the answer started it is raised on, to cut it short (uvicorn's log of it
    is a warning: :class:`QuietReforming`)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            why = reforming(exc)
            if why is None or started:
                raise
            _saw(why, scope["path"])
            log.event("api_fleet_reforming", "warning", method=scope["method"], path=scope["path"],
                      error=describe(why))
            detail = (f"the fleet is re-forming (a leader election): the broker did not answer "
                      f"({type(why).__name__}); try again shortly")
            await problem_response(503, REFORMING, detail)(scope, receive, send)


class QuietReforming(logging.Filter):
    """On uvicorn's error logger: its "Exception in ASGI application" for an
    answer cut short by the broker re-forming (:class:`Reforming` raised it
    on) is a warning, not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.exc_info and reforming(record.exc_info[1]) is not None:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "an answer was cut short: the fleet is re-forming", ()
        return True


def _title(status: int) -> str:
    from http import HTTPStatus
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_response(status: int, code: str, detail: str, *, headers: dict[str, str] | None = None,
                     **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": _title(status), "status": status, "code": code,
            "detail": detail, **extra}
    if status == 503 and not any(name.lower() == "retry-after" for name in headers or ()):
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER)}
    return JSONResponse(body, status, headers=headers, media_type=MEDIA_TYPE)


def _field(loc: tuple) -> str:
    # ("body", "title") -> "body.title"; ("query", "limit") -> "query parameter limit"
    where, *rest = loc or ("request",)
    name = ".".join(str(p) for p in rest)
    if where == "body":
        return f"body.{name}" if name else "the body"
    if where in ("query", "path", "header"):
        return f"{where} parameter {name}"
    return ".".join(str(p) for p in loc)


def _error(e: dict[str, Any]) -> dict[str, str]:
    loc = tuple(e.get("loc") or ())
    if e.get("type") == "json_invalid":  # loc is ("body", <character>): not a field
        where = f" at character {loc[1]}" if len(loc) > 1 else ""
        why = (e.get("ctx") or {}).get("error") or e.get("msg")
        return {"field": "the body", "problem": f"not JSON: {why}{where}"}
    return {"field": _field(loc), "problem": str(e.get("msg"))}


def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [_error(e) for e in exc.errors()]
    detail = "; ".join(f"{e['field']}: {e['problem']}" for e in errors[:5])
    if len(errors) > 5:
        detail += f" (+{len(errors) - 5} more)"
    return problem_response(422, "invalid", detail or "the request is not valid", errors=errors)


def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else _title(exc.status_code)
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no such route: {request.method} {request.url.path}"
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
        # Starlette's Allow is the first matching route's methods: a path served by two
        # routes (GET and POST /v1/company) would advertise only one of them.
        headers["Allow"] = _allowed(request) or headers.get("Allow", "")
    return problem_response(exc.status_code, _HTTP_CODES.get(exc.status_code, "error"), detail,
                            headers=headers or None)


def _allowed(request: Request) -> str:
    methods: set[str] = set()
    for regex, allowed in getattr(request.app.state, "route_methods", ()):
        if regex.match(request.scope["path"]):
            methods |= set(allowed)
    return ", ".join(sorted(methods))


def _bug(request: Request, exc: Exception) -> JSONResponse:
    why = reforming(exc)
    if why is not None:
        _saw(why, request.url.path)
        # Raised on by Reforming once the answer had started (a stream cut
        # short; Starlette calls this handler all the same, and sends what it
        # answers only if nothing was sent yet).
        log.event("api_fleet_reforming", "warning", method=request.method, path=request.url.path,
                  error=describe(why), cut=True)
        return problem_response(503, REFORMING, "the fleet is re-forming (a leader election); try again "
                                                "shortly")
    # From the exception: a handler runs outside the except block, where format_exc()
    # has nothing ("NoneType: None").
    log.event("api_internal_error", "error", method=request.method, path=request.url.path,
              error=f"{type(exc).__name__}: {exc}", traceback="".join(traceback.format_exception(exc)))
    return problem_response(500, "internal", "the API failed on this request: a bug, logged on the "
                                             "node; nothing was changed unless the route says otherwise")


def install(app: FastAPI) -> None:
    """The handlers, and :class:`Reforming` around the routes (added first:
    the innermost of the app's middleware, inside what observes a request)."""
    app.add_exception_handler(Problem, lambda request, exc: exc.response())
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _bug)
    app.add_middleware(Reforming)
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, QuietReforming) for f in logger.filters):
        logger.addFilter(QuietReforming())


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route, for the OpenAPI document."""
    return {s: {"model": ProblemBody, "description": _title(s),
                "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ProblemBody"}}}}
            for s in statuses}
