"""Fake model endpoints on 127.0.0.1 for the provider tests.

A :class:`WireServer` answers every POST with the next response a test
queued (:meth:`WireServer.queue`) and keeps what it received
(:attr:`WireServer.requests`), so a test scripts the endpoint and then
asserts the request bodies. With nothing queued it answers its ``always``
(a steady endpoint for a node under load), else 418, which no provider
retries, so an unexpected call fails fast and visibly.

A queued *stream* (:meth:`WireServer.queue_stream`) is answered as
server-sent events, chunk by chunk as the real APIs send them: an item may be
a ``threading.Event`` the server waits for before going on (so a test shows a
delta reached the client while the stream was still open; one not set in
:data:`GATE_WAIT` counts in :attr:`WireServer.gates_missed`), or :data:`CUT`,
where the connection is dropped mid-body. The ``openai_*`` and
``anthropic_*`` helpers build bodies and event streams in each API's wire
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
# In a queued stream: drop the connection here, without ending the chunked body.
CUT = object()
# How long a stream waits for a test's threading.Event before going on anyway.
GATE_WAIT = 10.0


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
    events: list[Any] | None = None   # a stream: (event name or None, data), Event or CUT
    delay: float = 0.0                # seconds before the answer (a slow model)


class WireServer:
    """One fake endpoint; ``with WireServer() as srv: ... srv.url``."""

    def __init__(self, always: Canned | None = None) -> None:
        self.always = always    # the answer when nothing is queued (None: 418)
        self.requests: list[Received] = []
        self.gates_missed = 0   # stream gates that were not opened in GATE_WAIT
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

    def queue_stream(self, events: list[Any]) -> None:
        """Answer the next unanswered request with this event stream (200)."""
        with self._lock:
            self._queue.append(Canned(events=list(events)))

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
            if self.always is not None:
                return self.always
        return Canned(NOTHING_QUEUED, {"error": {"message": "wire: no response queued"}})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive, as the real APIs

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                canned = server._answer("POST", self.path, headers, raw)
                if canned.delay:
                    time.sleep(canned.delay)
                if canned.events is not None:
                    return self._stream(canned.events)
                data = b"" if canned.body is None else json.dumps(canned.body).encode()
                self.send_response(canned.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in canned.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, events: list[Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for item in events:
                    if item is CUT:
                        self.close_connection = True   # the socket closes mid-body
                        return
                    if isinstance(item, threading.Event):
                        if not item.wait(GATE_WAIT):
                            server.gates_missed += 1
                        continue
                    name, data = item
                    text = ((f"event: {name}\n" if name else "")
                            + f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n")
                    chunk = text.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")

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


def openai_stream(pieces: list[str] = (), calls: list[tuple[int, str, str, str]] = (), *,
                  usage: tuple[int, int] = (0, 0), finish: str | None = None,
                  end: bool = True) -> list[tuple[None, Any]]:
    """A streamed chat completion, as ``stream_options.include_usage`` sends it:
    a chunk per text piece, then per tool call fragment — *calls* are (index,
    id, name, argument fragment), id and name given with a call's first
    fragment only, as OpenAI does — the finish, the usage, ``[DONE]`` (unless
    not *end*)."""
    def chunk(delta: dict[str, Any], reason: str | None = None) -> tuple[None, Any]:
        return None, {"id": "chatcmpl-wire", "object": "chat.completion.chunk", "model": "wire-model",
                      "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in pieces]
    seen: set[int] = set()
    for index, cid, name, fragment in calls:
        part: dict[str, Any] = {"index": index, "function": {"arguments": fragment}}
        if index not in seen:
            seen.add(index)
            part.update(id=cid, type="function")
            part["function"]["name"] = name
        out.append(chunk({"tool_calls": [part]}))
    out.append(chunk({}, finish or ("tool_calls" if calls else "stop")))
    out.append((None, {"id": "chatcmpl-wire", "object": "chat.completion.chunk", "choices": [],
                       "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                 "total_tokens": usage[0] + usage[1]}}))
    return out + [(None, "[DONE]")] if end else out


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


def anthropic_stream(blocks: list[tuple[str, ...]], *, usage: tuple[int, int] = (0, 0),
                     cache: tuple[int, int] = (0, 0), stop: str | None = None) -> list[tuple[str, Any]]:
    """A streamed Messages API answer. *blocks* are ``("text", piece, …)`` or
    ``("tool_use", id, name, json fragment, …)``; *usage* (input, output) and
    *cache* (created, read) as the API splits them: input and cache in
    ``message_start``, the output count in ``message_delta``."""
    def event(kind: str, **data: Any) -> tuple[str, Any]:
        return kind, {"type": kind, **data}

    out = [event("message_start", message={
        "id": "msg_wire", "type": "message", "role": "assistant", "model": "wire-model", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "cache_creation_input_tokens": cache[0],
                  "cache_read_input_tokens": cache[1], "output_tokens": 1}}), event("ping")]
    for index, (kind, *rest) in enumerate(blocks):
        if kind == "text":
            out.append(event("content_block_start", index=index, content_block={"type": "text", "text": ""}))
            out += [event("content_block_delta", index=index, delta={"type": "text_delta", "text": p})
                    for p in rest]
        else:
            cid, name, *fragments = rest
            out.append(event("content_block_start", index=index, content_block={
                "type": "tool_use", "id": cid, "name": name, "input": {}}))
            out += [event("content_block_delta", index=index,
                          delta={"type": "input_json_delta", "partial_json": f}) for f in fragments]
        out.append(event("content_block_stop", index=index))
    tools = any(b[0] == "tool_use" for b in blocks)
    out.append(event("message_delta", delta={"stop_reason": stop or ("tool_use" if tools else "end_turn"),
                                             "stop_sequence": None},
                     usage={"output_tokens": usage[1]}))
    return out + [event("message_stop")]
