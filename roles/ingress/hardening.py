"""What a browser is told, and what a log is not (issue 24 §2).

* :class:`SecurityHeaders`: every HTTP answer of ingress — the API, the
  dashboard, the API docs, errors, 404s, ``/healthz`` — carries a strict
  ``Content-Security-Policy`` (:data:`CSP`: scripts, styles and connections
  from this origin only, nothing inline, never framed), ``X-Frame-Options:
  DENY``, ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy:
  no-referrer``. Plain ASGI with the headers encoded once, wrapped around
  Starlette's whole stack (:func:`install`), so its own 500s carry them too.
  What the server answers before the app is reached — the 408 of a slow
  client, the 503 past ``ingress.max_connections``, the 400 of a request
  that could not be parsed — carries :data:`HEADERS` as well, written by
  :mod:`roles.ingress.deadlines`' protocol.
* The API docs (``/docs``): swagger-ui's files from the ``fastapi-offline``
  package (:data:`SWAGGER_DIR`), served under ``/docs/assets/``, started by a
  script of ours (``/docs/init.js``) rather than FastAPI's page, whose start
  script is inline and whose files come from a public CDN. No third-party
  origin: the CDN's code could otherwise read the dashboard's token, which
  lives on the same origin.
* :class:`LogRedaction`: uvicorn writes a request's path *with its query*
  (the WebSocket handshake's line at info; the access log, when on; the
  websockets library's request line and headers at debug). A token put in a
  URL, whatever its parameter's name, would be written whole. This filter on
  uvicorn's loggers replaces every query value with ``[redacted]`` (the
  names stay: the line still says what was asked) and scrubs credential
  shapes (:func:`crewlet.redaction.scrub`: an ``Authorization`` header's).
"""

from __future__ import annotations

import logging
import os
import re

import fastapi_offline
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from crewlet import redaction

CSP = "; ".join((
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "font-src 'self'",
    # The dashboard reads the live feed with fetch (Server-Sent Events), not a WebSocket.
    "connect-src 'self'",
    "manifest-src 'self'",
    "frame-ancestors 'none'",
    "base-uri 'none'",
    "form-action 'self'",
))
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
_NAMES = frozenset(name for name, _ in HEADERS)


class SecurityHeaders:
    """Adds :data:`HEADERS` to every HTTP answer (one a route set itself is
    kept as it is). A WebSocket's handshake is passed through."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or ())
                if any(name.lower() in _NAMES for name, _ in headers):
                    have = {name.lower() for name, _ in headers}
                    headers += [h for h in HEADERS if h[0] not in have]
                else:
                    headers += HEADERS
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, sending)


def install(app: FastAPI) -> None:
    """:class:`SecurityHeaders` around *app*'s whole stack (outside Starlette's
    ServerErrorMiddleware, which ``add_middleware`` cannot reach), the API
    docs, and :class:`LogRedaction` on uvicorn's loggers."""
    build = app.build_middleware_stack
    app.build_middleware_stack = lambda: SecurityHeaders(build())
    _docs(app)
    LogRedaction.install()


# ------------------------------------------------------------------ the API docs

SWAGGER_DIR = os.path.join(os.path.dirname(os.path.abspath(fastapi_offline.__file__)), "static")
DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>crewlet API</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/init.js"></script>
</body>
</html>
"""
# validatorUrl null: swagger-ui would otherwise show a badge from its public validator.
DOCS_INIT = """"use strict";
window.ui = SwaggerUIBundle({
  url: "/v1/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
"""


def _docs(app: FastAPI) -> None:
    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(DOCS_PAGE)

    @app.get("/docs/init.js", include_in_schema=False)
    async def docs_init() -> Response:
        return Response(DOCS_INIT, media_type="text/javascript")

    app.mount("/docs/assets", StaticFiles(directory=SWAGGER_DIR), name="docs-assets")


# ------------------------------------------------------------------ logs

# A path with a query, as uvicorn and websockets write it: `/v1/ws?token=abc`.
_QUERY = re.compile(r"(?P<path>/[^\s\"'?]*)\?(?P<query>[^\s\"']*)")
_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "websockets",
            "websockets.server", "websockets.protocol")


def redact_queries(text: str) -> str:
    """*text* with every query value of a path in it replaced by
    :data:`~crewlet.redaction.REDACTED` (whatever the parameter's name)."""
    if "?" not in text:
        return text
    return _QUERY.sub(lambda m: m["path"] + "?" + "&".join(
        (part.partition("=")[0] + "=" + redaction.REDACTED) if "=" in part else redaction.REDACTED
        for part in m["query"].split("&")), text)


class LogRedaction(logging.Filter):
    """On uvicorn's loggers: a record's message with its query values
    redacted and credential shapes scrubbed. A record is rewritten only when
    that changed it (``msg`` the clean text, no ``args``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: log.py writes record.msg as is
            message = str(record.msg)
        clean = redaction.scrub(redact_queries(message))
        if clean != message:
            record.msg, record.args = clean, ()
        return True

    @classmethod
    def install(cls) -> None:
        for name in _LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, cls) for f in logger.filters):
                logger.addFilter(cls())
