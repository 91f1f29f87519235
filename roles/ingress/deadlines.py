"""Deadlines for what a client sends: uvicorn's HTTP/1.1 protocol (h11), with
a request's headers and body held to a clock.

uvicorn (0.55) bounds an idle keep-alive connection (``timeout_keep_alive``)
and, with ``limit_concurrency``, answers 503 past a number of connections;
it has no deadline for a request being *received*: a client sending a byte
a second held its connection, and its slot, for ever (issue 24's probe: 150
such connections stayed open). So, as Apache's ``mod_reqtimeout`` does:

* **headers**: a request's headers complete within :data:`HEADER_TIMEOUT`
  seconds of its first byte (of the connection's opening, for the first
  request): else the connection is answered 408 and closed;
* **body**: from the end of the headers, a body arrives at
  :data:`BODY_MIN_RATE` bytes a second or more, after :data:`BODY_GRACE`
  seconds: the deadline is ``start + grace + received / rate``, so a 100 MiB
  upload at any real speed never meets it, and a body trickled in is cut.
  Time the server itself stopped reading (flow control: the app not taking
  the body yet) is not counted against the client.

A connection that became a WebSocket, or whose request was received whole,
has no deadline here (the app answers; the keep-alive timer takes the idle
connection after). Checked every :data:`TICK` seconds per connection
receiving a request. A cut is logged once, ``ingress_slow_client_cut``.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from crewlet import log

HEADER_TIMEOUT = 10.0
BODY_GRACE = 20.0
BODY_MIN_RATE = 1024
TICK = 0.5

_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\ncontent-length: 35\r\n\r\n"
                b"the request was not sent in time.\r\n")


class DeadlineProtocol(H11Protocol):
    """:class:`H11Protocol` whose requests are received against a deadline
    (module doc). The class attributes are the limits (a subclass may narrow
    them: the tests)."""

    header_timeout = HEADER_TIMEOUT
    body_grace = BODY_GRACE
    body_min_rate = BODY_MIN_RATE

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
