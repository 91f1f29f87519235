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
"""

from __future__ import annotations

import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from crewlet import log

MEDIA_TYPE = "application/problem+json"

# Codes Starlette's own errors become.
_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 409: "conflict",
               413: "body_too_large", 415: "unsupported_media_type", 422: "invalid",
               429: "too_many_requests", 503: "unavailable", 507: "insufficient_storage"}


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
    # From the exception: a handler runs outside the except block, where format_exc()
    # has nothing ("NoneType: None").
    log.event("api_internal_error", "error", method=request.method, path=request.url.path,
              error=f"{type(exc).__name__}: {exc}", traceback="".join(traceback.format_exception(exc)))
    return problem_response(500, "internal", "the API failed on this request: a bug, logged on the "
                                             "node; nothing was changed unless the route says otherwise")


def install(app: FastAPI) -> None:
    app.add_exception_handler(Problem, lambda request, exc: exc.response())
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _bug)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route, for the OpenAPI document."""
    return {s: {"model": ProblemBody, "description": _title(s),
                "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ProblemBody"}}}}
            for s in statuses}
