"""Anthropic's Messages API, with tool use.

``POST {base_url}/v1/messages`` (default base: Anthropic's) with ``x-api-key``
and ``anthropic-version``. The system prompt is a top-level field, and
``max_tokens`` is required: :data:`MAX_TOKENS` when the company does not say.

Messages alternate user and assistant, each a list of content blocks: an
assistant turn is its text and a ``tool_use`` block per call; the results of
those calls go back in the next *user* message as ``tool_result`` blocks
(``is_error`` for a failed tool), so consecutive tool results — and mail that
follows them — merge into one user message.

Streamed (a caller with a sink), the request asks for ``stream`` and the
events rebuild the message: ``message_start`` (its id and input usage),
``content_block_start`` / ``content_block_delta`` (``text_delta``; a tool
use's ``input_json_delta`` fragments, concatenated and decoded at the end),
``message_delta`` (the stop reason and the output usage, cumulative),
``message_stop`` (the end). A later text block's first delta starts with the
newline that joins text blocks in the reply, so the deltas still add up to
its text. An ``error`` event is read as the HTTP status its type stands for
(:data:`ERROR_STATUS`): an ``overloaded_error`` is retried, a
``rate_limit_error`` cools the key, an ``invalid_request_error`` fails.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from crewlet.agent.providers.base import Assembly, HttpProvider, Refused, error_words, tool_args
from crewlet.agent.types import Message, Reply, ToolCall, ToolSpec, Usage

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
# The API requires a cap on the answer; this one leaves room for long tool arguments.
MAX_TOKENS = 4096
_STOP = {"end_turn": "end", "stop_sequence": "end", "tool_use": "tools", "max_tokens": "length"}
# The HTTP status an error event's type stands for (Anthropic's error table); others: 500.
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
                "api_error": 500, "overloaded_error": 529}


class AnthropicProvider(HttpProvider):
    kind = "anthropic"

    def _url(self) -> str:
        return (self.spec.base_url or DEFAULT_BASE_URL).rstrip("/") + "/v1/messages"

    def _headers(self, key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if key:
            headers["x-api-key"] = key
        return headers

    def _body(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
              ) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": MAX_TOKENS, "messages": _messages(messages)}
        if self.spec.model:
            body["model"] = self.spec.model
        if system:
            body["system"] = system
        return body

    def _tool(self, tool: ToolSpec) -> dict[str, Any]:
        return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}

    def _reply(self, body: Any) -> Reply:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in body["content"]:
            if block.get("type") == "text" and block.get("text"):
                texts.append(block["text"])
            elif block.get("type") == "tool_use":
                calls.append(ToolCall(id=block["id"], name=block["name"],
                                      args=tool_args(block.get("input"))))
        usage = body.get("usage") or {}
        # Cache reads and writes are input the key is billed for, so budgets count them.
        read = sum(int(usage.get(k) or 0) for k in
                   ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
        stop = "tools" if calls else _STOP.get(body.get("stop_reason") or "end_turn", "other")
        return Reply(text="\n".join(texts), calls=tuple(calls),
                     usage=Usage(read, int(usage.get("output_tokens") or 0)), stop=stop)

    def _assembly(self) -> Assembly:
        return _Events()


class _Events(Assembly):
    """Messages API stream events back into the message."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.said = False   # has any text been streamed yet?

    def feed(self, event: str, data: str) -> str:
        payload = json.loads(data)
        kind = payload["type"]
        if kind == "message_start":
            self.message = payload["message"]
        elif kind == "content_block_start":
            block = dict(payload["content_block"])
            if block["type"] == "text":
                block["text"] = block.get("text") or ""
            elif block["type"] == "tool_use":
                block["input"] = ""   # JSON text, from its input_json_delta fragments
            self.blocks[payload["index"]] = block
        elif kind == "content_block_delta":
            block, delta = self.blocks[payload["index"]], payload["delta"]
            if delta["type"] == "text_delta" and delta["text"]:
                text = delta["text"]
                if self.said and not block["text"]:
                    text = "\n" + text   # _reply joins text blocks with a newline
                block["text"] += delta["text"]
                self.said = True
                return text
            if delta["type"] == "input_json_delta":
                block["input"] += delta["partial_json"]
            # Other deltas (thinking, signatures, citations) are no part of a Reply.
        elif kind == "message_delta":
            self.message.update(payload.get("delta") or {})
            counted = {k: v for k, v in (payload.get("usage") or {}).items() if v is not None}
            self.message["usage"] = {**(self.message.get("usage") or {}), **counted}
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            err = payload.get("error") or {}
            raise Refused(ERROR_STATUS.get(err.get("type"), 500), f"stream error: {error_words(payload)}")
        return ""

    def body(self) -> Any:
        return {**self.message, "content": [b for _, b in sorted(self.blocks.items())]}


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        role, blocks = _blocks(m)
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def _blocks(m: Message) -> tuple[str, list[dict[str, Any]]]:
    # The API refuses empty text blocks, so an empty text is left out.
    if m.role == "tool":
        return "user", [{"type": "tool_result", "tool_use_id": m.call_id, "content": m.text,
                         "is_error": m.error}]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.text}] if m.text else []
    if m.role == "assistant":
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.args} for c in m.calls]
    return m.role, blocks
