"""The live feed: ``GET /v1/events`` (Server-Sent Events) and ``/v1/ws`` (WebSocket).

Both carry the same events (:mod:`roles.ingress.feed`): first a ``snapshot``
(the whole state: nodes, duties, seats, recent turns) unless the client came
back with an id this feed still holds, then each change as it is seen.

* SSE: ``Authorization: Bearer`` like every route; send ``Last-Event-ID`` (a
  browser's EventSource does it by itself) to resume. A comment line every
  :data:`KEEPALIVE` seconds keeps proxies from closing a quiet stream.
* WebSocket: a browser cannot set headers on one, so the token may instead
  be the first message, ``{"token": "...", "last_event_id": "..."}``, within
  :data:`WS_AUTH_WAIT` seconds; each event is then one JSON message
  ``{"id", "event", "data"}``. A refused token closes with code 4401. A
  client that leaves, before its token or after, is a departure
  (:func:`departed`): nothing is logged as an error. Anything else raised —
  a RuntimeError that is not the client gone among them — is a fault, and
  uvicorn logs it.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Depends, Header, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.websockets import WebSocketDisconnected, WebSocketState

from crewlet.tokens import Keyring
from roles.ingress.auth import READ
from roles.ingress.feed import Event, Subscription
from roles.ingress.front import front
from roles.ingress.problems import responses

router = APIRouter(prefix="/v1", tags=["live"])

KEEPALIVE = 15.0
WS_AUTH_WAIT = 5.0
WS_REFUSED = 4401     # the close code of a WebSocket whose token was refused


def _opening(request_front, sub: Subscription) -> list[Event]:
    """What a new subscription is sent first: what it missed, or a snapshot."""
    if sub.missed is not None:
        return sub.missed
    p = request_front.projection
    return [Event(p.feed.last_id, "snapshot", p.snapshot(), p.clock())]


@router.get("/events", summary="The live feed (Server-Sent Events)", responses={
    **responses(401, 403),
    200: {"description": "An event stream: snapshot, then turn, node, seat, duty, copy, mailboxes, "
                         "children and company events", "content": {"text/event-stream": {}}}},
    response_class=StreamingResponse)
async def events(request: Request, last_event_id: str | None = Header(None, alias="Last-Event-ID"),
                 _=Depends(READ)) -> StreamingResponse:
    f = front(request)
    feed = f.projection.feed
    sub = feed.subscribe(last_event_id)
    opening = _opening(f, sub)

    async def stream():
        try:
            yield b"retry: 1000\n\n"
            for event in opening:
                yield event.sse
            while True:
                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for can
                    # lose a client's disconnect (a cancel) as an item arrives.
                    async with asyncio.timeout(KEEPALIVE):
                        event = await sub.queue.get()
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if event is None:  # dropped for falling behind: the client resumes by id
                    return
                yield event.sse
        finally:
            feed.unsubscribe(sub)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


# What a WebSocket whose client has gone raises when it is read or written:
# Starlette's disconnect, and its WebSocketDisconnected (a RuntimeError: a
# receive or send once the disconnect was seen), and the server's own
# (uvicorn's ClientDisconnected, an OSError).
GONE = (WebSocketDisconnect, WebSocketDisconnected, OSError)
# The one RuntimeError of uvicorn's that is a departure too: a send after it
# closed the connection itself (the client missed its pings, or sent a broken
# frame) and before it saw the socket go. Known by its words, as uvicorn
# raises it as a plain RuntimeError.
_CLOSED_BY_SERVER = "after sending 'websocket.close'"


def departed(exc: BaseException) -> bool:
    """Is *exc* the client having gone (quiet), rather than a fault (raised,
    so uvicorn logs it)? Any other RuntimeError — an ASGI message out of
    order, a bug — is a fault."""
    if isinstance(exc, GONE):
        return True
    return isinstance(exc, RuntimeError) and _CLOSED_BY_SERVER in str(exc)


async def _close(socket: WebSocket, code: int, reason: str) -> None:
    """Close *socket*, unless its client went first: a departure is not an
    error (it once logged ``Exception in ASGI application`` at error level)."""
    if socket.client_state != WebSocketState.CONNECTED:
        return
    try:
        await socket.close(code, reason)
    except Exception as exc:
        if not departed(exc):
            raise


@router.websocket("/ws")
async def ws(socket: WebSocket) -> None:
    f = socket.app.state.front
    ring: Keyring = socket.app.state.keyring
    try:
        await socket.accept()
    except Exception as exc:
        if departed(exc):
            return  # gone during the handshake
        raise
    header = socket.headers.get("authorization") or ""
    token = header[7:].strip() if header.lower().startswith("bearer ") else None
    last_id = None
    if token is None:
        try:
            first = json.loads(await asyncio.wait_for(socket.receive_text(), WS_AUTH_WAIT))
            token, last_id = first.get("token"), first.get("last_event_id")
        except (asyncio.TimeoutError, ValueError, AttributeError, KeyError):
            token = None  # nothing in time, not JSON, not an object, not text: no token
        except Exception as exc:
            if departed(exc):
                return  # the client left before it authenticated: nothing to answer
            raise
    grant = ring.check(token) if isinstance(token, str) else None
    if grant is None or "read" not in grant.scopes:
        await _close(socket, WS_REFUSED, "unauthorized: send {\"token\": ...} first, or Authorization")
        return
    feed = f.projection.feed
    sub = feed.subscribe(last_id if isinstance(last_id, str) else None)
    try:
        for event in _opening(f, sub):
            await socket.send_json(event.message())
        receiving = asyncio.create_task(_drain(socket))
        try:
            while True:
                getting = asyncio.create_task(sub.queue.get())
                done, _ = await asyncio.wait({getting, receiving}, return_when=asyncio.FIRST_COMPLETED)
                if receiving in done:
                    getting.cancel()
                    receiving.result()  # the client went (None), or a fault, raised here
                    return
                event = getting.result()
                if event is None:
                    await _close(socket, 1013, "fell behind: reconnect with the last id")
                    return
                await socket.send_json(event.message())
        finally:
            receiving.cancel()
    except Exception as exc:
        if not departed(exc):
            raise  # a fault: uvicorn logs it
        # The client went: a departure, not an error.
    finally:
        feed.unsubscribe(sub)


async def _drain(socket: WebSocket) -> None:
    """Read (and ignore) what the client sends, text or bytes, until it goes;
    a fault is raised."""
    try:
        while (await socket.receive())["type"] != "websocket.disconnect":
            pass
    except Exception as exc:
        if not departed(exc):
            raise
