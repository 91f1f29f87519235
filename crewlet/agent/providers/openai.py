"""Any OpenAI-compatible chat completions endpoint, with tool calls.

``POST {base_url}/chat/completions`` (default base: OpenAI's), the key from the
environment variable the company names, as ``Authorization: Bearer``. A
provider without ``api_key_env`` sends no key (a local server, say).

A conversation maps onto the wire as: the system prompt first; a user message;
an assistant message with its ``tool_calls`` (arguments as JSON text); one
``tool`` message per result, answering its ``tool_call_id``. Tools are offered
as functions. Arguments that are not a JSON object reach the tool as
``{"_raw": text}``, so the tool, not this module, tells the model what was wrong.

Streamed (a caller with a sink), the request asks for ``stream`` and
``stream_options.include_usage``; the chunks rebuild the chat completion:
``delta.content`` is the text, ``delta.tool_calls`` are keyed by their
``index`` (the id and name are the first given, the argument fragments are
concatenated), the usage comes in the last chunk, ``data: [DONE]`` ends the
stream. A chunk that is ``{"error": …}`` — how OpenAI-compatible servers
fail mid-stream — is read as the HTTP status in its ``code``, else a 500.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from crewlet.agent.providers.base import Assembly, HttpProvider, Refused, error_words, tool_args
from crewlet.agent.types import Message, Reply, ToolCall, ToolSpec, Usage

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# A failed tool's result is marked in its text: the wire format has no error flag.
ERROR_PREFIX = "error: "
_STOP = {"stop": "end", "tool_calls": "tools", "function_call": "tools", "length": "length"}
# The data of the stream's last event.
END_MARKER = "[DONE]"


class OpenAIProvider(HttpProvider):
    kind = "openai"
    # Without include_usage a stream says nothing of the tokens, and budgets would miss them.
    stream_fields = {"stream": True, "stream_options": {"include_usage": True}}

    def _url(self) -> str:
        return (self.spec.base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"

    def _headers(self, key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    def _body(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
              ) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": _messages(system, messages)}
        if self.spec.model:
            body["model"] = self.spec.model
        return body

    def _tool(self, tool: ToolSpec) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": tool.name, "description": tool.description,
                             "parameters": tool.parameters}}

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

    def _assembly(self) -> Assembly:
        return _Chunks()


class _Chunks(Assembly):
    """Chat completion chunks back into the chat completion."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, event: str, data: str) -> str:
        if data == END_MARKER:
            self.done = True
            return ""
        chunk = json.loads(data)
        if "error" in chunk:
            err = chunk["error"]
            code = err.get("code") if isinstance(err, dict) else None
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            raise Refused(status, f"stream error: {error_words(chunk)}")
        self.usage = chunk.get("usage") or self.usage
        text = ""
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:  # one answer asked for: the others are not ours
                continue
            self.finish = choice.get("finish_reason") or self.finish
            delta = choice.get("delta") or {}
            for part in delta.get("tool_calls") or ():
                call = self.calls.setdefault(part["index"], {"id": None, "name": None, "arguments": ""})
                function = part.get("function") or {}
                call["id"] = call["id"] or part.get("id")
                call["name"] = call["name"] or function.get("name")
                call["arguments"] += function.get("arguments") or ""
            text += delta.get("content") or ""
        self.text.append(text)
        return text

    def body(self) -> Any:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self.calls.items())]
        return {"choices": [{"index": 0, "message": message, "finish_reason": self.finish}],
                "usage": self.usage}


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
