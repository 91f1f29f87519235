"""crewlet.webserver: uvicorn's server as a role runs it, stopped promptly."""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from crewlet import webserver

# uvicorn's own shutdown pauses 0.1 s whatever is open; with nothing open
# ours does not take it (a spy on uvicorn's says whether it ran: a time bound
# would be a speed assertion, which a loaded machine breaks).


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


async def _serve(app) -> tuple[webserver.Server, asyncio.Task, int]:
    sock = _listening()
    server = webserver.Server(uvicorn.Config(app, lifespan="off", log_config=None))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    await asyncio.wait_for(server.listening.wait(), 5)
    return server, serving, sock.getsockname()[1]


async def _ok(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _spy_on_uvicorn_shutdown(monkeypatch) -> list[bool]:
    ran: list[bool] = []
    real = uvicorn.Server.shutdown

    async def shutdown(self, sockets=None):
        ran.append(True)
        await real(self, sockets)
    monkeypatch.setattr(uvicorn.Server, "shutdown", shutdown)
    return ran


def test_a_server_with_nothing_open_stops_without_uvicorn_s_pause(monkeypatch):
    ran = _spy_on_uvicorn_shutdown(monkeypatch)

    async def main() -> None:
        server, serving, port = await _serve(_ok)
        server.should_exit = True
        await asyncio.wait_for(serving, 5)
        with socket.socket() as probe:   # the listener is closed
            assert probe.connect_ex(("127.0.0.1", port)) != 0

    asyncio.run(main())
    assert ran == []


def test_a_request_in_flight_is_still_answered_when_the_server_stops(monkeypatch):
    ran = _spy_on_uvicorn_shutdown(monkeypatch)

    async def main() -> bytes:
        began = asyncio.Event()

        async def slow(scope, receive, send) -> None:
            began.set()
            await asyncio.sleep(0.3)
            await _ok(scope, receive, send)

        server, serving, port = await _serve(slow)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.wait_for(began.wait(), 5)
        server.should_exit = True
        answer = await asyncio.wait_for(reader.read(), 5)
        await asyncio.wait_for(serving, 5)
        writer.close()
        return answer

    answer = asyncio.run(main())
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
    assert ran == [True]   # uvicorn's own shutdown, which lets it finish
