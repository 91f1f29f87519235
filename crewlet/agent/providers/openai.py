"""Any OpenAI-compatible chat completions endpoint, with tool calls.

``POST {base_url}/chat/completions`` (default base: OpenAI's), the key from the
environment variable the company names, as ``Authorization: Bearer``. A
provider without ``api_key_env`` sends no key (a local server, say).

A conversation maps onto the wire as: the system prompt first; a user message;
an assistant message with its ``tool_calls`` (arguments as JSON text); one
``tool`` message per result, answering its ``tool_call_id``. Tools are offered
as functions. Arguments that are not a JSON object reach the tool as
``{"_raw": text}``, so the tool, not this module, tells the model what was wrong.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from crewlet.agent.providers.base import HttpProvider, tool_args
from crewlet.agent.types import Message, Reply, ToolCall, ToolSpec, Usage

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# A failed tool's result is marked in its text: the wire format has no error flag.
ERROR_PREFIX = "error: "
_STOP = {"stop": "end", "tool_calls": "tools", "function_call": "tools", "length": "length"}


class OpenAIProvider(HttpProvider):
    kind = "openai"

    def _url(self) -> str:
        return (self.spec.base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"

    def _headers(self, key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    def _body(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
              ) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": _messages(system, messages)}
        if self.spec.model:
            body["model"] = self.spec.model
        if tools:
            body["tools"] = [{"type": "function",
                              "function": {"name": t.name, "description": t.description,
                                           "parameters": t.parameters}} for t in tools]
        return body

    def _reply(self, body: Any) -> Reply:
        choice = body["choices"][0]
        message = choice["message"]
        calls = tuple(
            ToolCall(id=c.get("id") or f"call_{i}", name=c["function"]["name"],
                     args=tool_args(c["function"].get("arguments")))
            for i, c in enumerate(message.get("tool_calls") or (), start=1))
        usage = body.get("usage") or {}
        stop = "tools" if calls else _STOP.get(choice.get("finish_reason") or "stop", "other")
        return Reply(text=message.get("content") or "", calls=calls,
                     usage=Usage(int(usage.get("prompt_tokens") or 0),
                                 int(usage.get("completion_tokens") or 0)),
                     stop=stop)


def _messages(system: str, messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for m in messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.text})
        elif m.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.calls:
                entry["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.args)}} for c in m.calls]
            out.append(entry)
        else:
            out.append({"role": "tool", "tool_call_id": m.call_id,
                        "content": ERROR_PREFIX + m.text if m.error else m.text})
    return out
