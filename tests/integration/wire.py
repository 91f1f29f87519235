"""Fake model endpoints on 127.0.0.1 for the provider tests.

A :class:`WireServer` answers every POST with the next response a test
queued (:meth:`WireServer.queue`) and keeps what it received
(:attr:`WireServer.requests`), so a test scripts the endpoint and then
asserts the request bodies. With nothing queued it answers 418, which no
provider retries, so an unexpected call fails fast and visibly.

The ``openai_*`` and ``anthropic_*`` helpers build bodies in each API's wire
format. It is a stdlib ``ThreadingHTTPServer`` in a thread: the provider
under test runs its own event loop, and the server must answer while that
loop waits.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NOTHING_QUEUED = 418


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]     # lower-cased names
    body: Any                   # decoded JSON (None if the body was not JSON)
    at: float                   # time.time() the request arrived


@dataclass(frozen=True)
class Canned:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class WireServer:
    """One fake endpoint; ``with WireServer() as srv: ... srv.url``."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._queue: deque[Canned] = deque()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="wire", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def queue(self, body: Any = None, status: int = 200, headers: dict[str, str] | None = None) -> None:
        """Answer the next unanswered request with this."""
        with self._lock:
            self._queue.append(Canned(status, body, dict(headers or {})))

    def received(self) -> list[Received]:
        with self._lock:
            return list(self.requests)

    def start(self) -> WireServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> WireServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> Canned:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            self.requests.append(Received(method, path, headers, body, time.time()))
            if self._queue:
                return self._queue.popleft()
        return Canned(NOTHING_QUEUED, {"error": {"message": "wire: no response queued"}})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive, as the real APIs

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                canned = server._answer("POST", self.path, headers, raw)
                data = b"" if canned.body is None else json.dumps(canned.body).encode()
                self.send_response(canned.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in canned.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass    # the test's output stays the test's

        return Handler


# ------------------------------------------------------------------ OpenAI chat completions

def openai_reply(text: str | None = "", calls: list[tuple[str, str, Any]] = (), *,
                 usage: tuple[int, int] = (0, 0), finish: str | None = None) -> dict[str, Any]:
    """A chat completion; *calls* are (id, name, args), args a dict or raw argument text."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
            for cid, name, args in calls]
    return {"id": "chatcmpl-wire", "object": "chat.completion", "created": int(time.time()),
            "model": "wire-model",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": finish or ("tool_calls" if calls else "stop")}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                      "total_tokens": usage[0] + usage[1]}}


def openai_error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# ------------------------------------------------------------------ Anthropic messages

def anthropic_reply(text: str = "", calls: list[tuple[str, str, dict]] = (), *,
                    usage: tuple[int, int] = (0, 0), stop: str | None = None) -> dict[str, Any]:
    """A Messages API response; *calls* are (id, name, input)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls]
    return {"id": "msg_wire", "type": "message", "role": "assistant", "model": "wire-model",
            "content": content, "stop_reason": stop or ("tool_use" if calls else "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}


def anthropic_error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}
