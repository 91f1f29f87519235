"""Anthropic's Messages API, with tool use.

``POST {base_url}/v1/messages`` (default base: Anthropic's) with ``x-api-key``
and ``anthropic-version``. The system prompt is a top-level field, and
``max_tokens`` is required: :data:`MAX_TOKENS` when the company does not say.

Messages alternate user and assistant, each a list of content blocks: an
assistant turn is its text and a ``tool_use`` block per call; the results of
those calls go back in the next *user* message as ``tool_result`` blocks
(``is_error`` for a failed tool), so consecutive tool results — and mail that
follows them — merge into one user message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crewlet.agent.providers.base import HttpProvider, tool_args
from crewlet.agent.types import Message, Reply, ToolCall, ToolSpec, Usage

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
# The API requires a cap on the answer; this one leaves room for long tool arguments.
MAX_TOKENS = 4096
_STOP = {"end_turn": "end", "stop_sequence": "end", "tool_use": "tools", "max_tokens": "length"}


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
        if tools:
            body["tools"] = [{"name": t.name, "description": t.description,
                              "input_schema": t.parameters} for t in tools]
        return body

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
