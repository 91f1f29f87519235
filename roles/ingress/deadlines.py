"""Deadlines for what a client sends: uvicorn's HTTP/1.1 protocol (h11), with
a request's headers and body held to a clock, and its connections bounded.

uvicorn (0.55) bounds an idle keep-alive connection (``timeout_keep_alive``)
and, with ``limit_concurrency``, answers 503 past a number of connections;
it has no deadline for a request being *received*: a client sending a byte
a second held its connection, and its slot, for ever (issue 24's probe: 150
such connections stayed open). So, as Apache's ``mod_reqtimeout`` does:

* **headers**: a request's headers complete within ``ingress.header_timeout``
  seconds (10) of its first byte (of the connection's opening, for the first
  request): else the connection is answered 408 and closed;
* **body**: from the end of the headers, a body arrives at
  ``ingress.body_min_rate`` bytes a second (1,024) or more, after
  ``ingress.body_grace`` seconds (20): the deadline is ``start + grace +
  received / rate``, so a 100 MiB upload at any real speed never meets it,
  and a body trickled in is cut. Time the server itself stopped reading
  (flow control: the app not taking the body yet) is not counted against
  the client;
* **connections**: at most ``ingress.max_connections`` (1,024) connections
  and requests in progress; a request past them is answered 503 at once. A
  request's line and headers still incomplete past ``ingress.max_header_bytes``
  (16 KiB, h11's own bound) are a 400.

A connection that became a WebSocket, or whose request was received whole,
has no deadline here (the app answers; the keep-alive timer takes the idle
connection after). Checked every :data:`TICK` seconds per connection
receiving a request. A cut is logged once, ``ingress_slow_client_cut``.

**Early answers are hardened too.** The 408, the 503 past the bound and the
400 of a request h11 could not parse are written here, not by the app, so
the app's :class:`~roles.ingress.hardening.SecurityHeaders` never sees them:
each carries :data:`roles.ingress.hardening.HEADERS` itself. For the 503
this protocol keeps the bound in place of uvicorn (whose own 503 is a fixed
app of its module, which no hook reaches): it takes ``limit_concurrency``
from uvicorn's config and answers over it with :func:`_unavailable`, with
uvicorn's own test (this connection counted, this request not).

The limits come from the node's config: :func:`server_options` is what the
ingress role gives ``uvicorn.Config``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from crewlet import log
from crewlet.config.model import IngressSection
from roles.ingress import hardening

TICK = 0.5

_DEFAULTS = IngressSection.model_fields
_HARDENING = b"".join(name + b": " + value + b"\r\n" for name, value in hardening.HEADERS)
_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\ncontent-length: 35\r\n" + _HARDENING + b"\r\n"
                b"the request was not sent in time.\r\n")
_UNAVAILABLE_HEADERS = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"19"),
                        (b"connection", b"close"), *hardening.HEADERS]


def server_options(ingress: IngressSection) -> dict[str, Any]:
    """What ``uvicorn.Config`` is given for *ingress* (the node's
    ``ingress:`` section): this protocol with its deadlines, the connection
    bound and the header bytes."""
    protocol = type("DeadlineProtocol", (DeadlineProtocol,), {
        "header_timeout": ingress.header_timeout, "body_grace": ingress.body_grace,
        "body_min_rate": ingress.body_min_rate})
    return {"http": protocol, "limit_concurrency": ingress.max_connections,
            "h11_max_incomplete_event_size": ingress.max_header_bytes}


async def _unavailable(scope, receive, send) -> None:
    """uvicorn's 503 past ``limit_concurrency``, with the hardening headers."""
    await send({"type": "http.response.start", "status": 503, "headers": _UNAVAILABLE_HEADERS})
    await send({"type": "http.response.body", "body": b"Service Unavailable", "more_body": False})


class DeadlineProtocol(H11Protocol):
    """:class:`H11Protocol` whose requests are received against a deadline,
    and whose early answers carry the hardening headers (module doc). The
    class attributes are the limits (:func:`server_options` makes a subclass
    with the node's)."""

    header_timeout: float = _DEFAULTS["header_timeout"].default
    body_grace: float = _DEFAULTS["body_grace"].default
    body_min_rate: int = _DEFAULTS["body_min_rate"].default

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The bound is kept here: uvicorn's own 503 is an app of its module,
        # sent without the hardening headers (module doc).
        self.max_connections, self.limit_concurrency = self.limit_concurrency, None
        if self.max_connections is not None:
            self._app, self.app = self.app, self._bounded

    async def _bounded(self, scope, receive, send) -> None:
        # uvicorn's test, made as the request's task starts: that task is
        # among self.tasks now, where uvicorn counted before adding it.
        if len(self.connections) >= self.max_connections or len(self.tasks) - 1 >= self.max_connections:
            self.logger.warning("Exceeded concurrency limit.")
            return await _unavailable(scope, receive, send)
        return await self._app(scope, receive, send)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's own (a request h11 could not parse, headers past
        # max_header_bytes), with the hardening headers.
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                   *hardening.HEADERS]
        for event in (h11.Response(status_code=400, headers=headers, reason=STATUS_PHRASES[400]),
                      h11.Data(data=msg.encode("ascii")), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._ticking: asyncio.TimerHandle | None = None
        self._headers_by: float | None = None   # the deadline of the headers being received
        self._body_from: float | None = None    # when the body being received started
        self._body_bytes = 0
        self._paused_for = 0.0                  # seconds reading was paused by us, this body
        self._arm_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._headers_by is None and self._body_from is None and self.conn.their_state is h11.IDLE:
            self._arm_headers()  # the first byte of the next request on a kept-alive connection
        before = self.conn.their_state
        super().data_received(data)
        self._follow(before, len(data))

    def _follow(self, before, size: int) -> None:
        state = self.conn.their_state
        if self.transport.get_protocol() is not self:  # upgraded (a WebSocket): not ours now
            self._stop()
        elif state is h11.SEND_BODY:
            if self._body_from is None:  # the headers are in: the body's clock starts
                self._headers_by, self._body_from = None, self.loop.time()
                self._body_bytes, self._paused_for = 0, 0.0
            elif before is h11.SEND_BODY:
                self._body_bytes += size
        elif state is not h11.IDLE:  # the request is in whole (DONE), or the connection is ending
            self._headers_by = self._body_from = None

    def _arm_headers(self) -> None:
        self._headers_by = self.loop.time() + self.header_timeout
        self._body_from = None
        if self._ticking is None:
            self._ticking = self.loop.call_later(TICK, self._tick)

    def _stop(self) -> None:
        if getattr(self, "_ticking", None) is not None:
            self._ticking.cancel()
        self._ticking = None
        self._headers_by = self._body_from = None

    def _tick(self) -> None:
        self._ticking = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return
        now = self.loop.time()
        if self._headers_by is not None and self.conn.their_state is h11.IDLE:
            if now >= self._headers_by:
                return self._cut("headers", self.header_timeout, respond=True)
        elif self._body_from is not None and self.conn.their_state is h11.SEND_BODY:
            if self.flow.read_paused:
                self._paused_for += TICK
            elif now >= self._body_from + self._paused_for + self.body_grace + \
                    self._body_bytes / self.body_min_rate:
                return self._cut("body", self.body_grace, respond=False)
        else:
            self._headers_by = self._body_from = None
            return  # nothing being received: no clock until the next request's first byte
        self._ticking = self.loop.call_later(TICK, self._tick)

    def _cut(self, what: str, seconds: float, *, respond: bool) -> None:
        client = "%s:%d" % self.client if self.client else "?"
        log.event("ingress_slow_client_cut", "info", client=client, part=what,
                  detail=(f"the request's headers did not come within {seconds:g} s" if what == "headers" else
                          f"the request's body came slower than {self.body_min_rate} bytes/s "
                          f"(after {seconds:g} s)"))
        self._headers_by = self._body_from = None
        if respond and self.cycle is None or respond and self.cycle.response_complete:
            try:
                self.transport.write(_TIMEOUT_408)
            except Exception:
                pass
        self.transport.close()
