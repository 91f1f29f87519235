"""The built-in provider: deterministic, offline, no HTTP — the sample company's.

Its rules are searched in order against the conversation's last user message;
the first whose ``match`` is found (``re.search``) answers:

* round 1 — the user spoke last: a rule with ``tools`` asks for those calls
  (``call_1`` … ``call_n``; every string in their args expanded with the
  match's groups, ``\\1``, ``\\g<name>``), else it replies with its ``reply``;
* round 2 — a tool result came last: the rule's reply, with
  :data:`TOOL_RESULTS` in it replaced by what the tools answered (``; ``
  between them), so ``It is {tools}.`` shows the clock's answer. A call that
  failed shows as `` (tool <name> failed: <text>)`` — there, or appended to a
  reply without the placeholder — so the demo shows it.

No rule matching answers :data:`NO_MATCH`. Usage is counted in words, the same
every time: input is the words of the system prompt and every message, output
the words of the reply and one per call. A scripted provider has no key, so
it never cools.

Streamed (a caller with a sink), the reply goes out word by word, each word
with the whitespace after it (:func:`pieces`), at once — or ``pace`` seconds
apart when the rule asks, for a test that needs a slow model. A pace that
would run past the deadline tells the sink ``restart`` and fails, retryable.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from crewlet.agent.providers.base import Provider, ProviderError
from crewlet.agent.types import Message, Reply, Sink, ToolCall, ToolSpec, Usage
from crewlet.company.model import Provider as ProviderSpec

# What a scripted provider says when none of its rules matches the mail.
NO_MATCH = "(no rule matched)"
# In a rule's reply, replaced by the results of its tool calls (empty before any call).
TOOL_RESULTS = "{tools}"
# A streamed word: non-space, then the space after it (or leading space alone).
_PIECE = re.compile(r"\S+\s*|\s+")


def words(text: str) -> int:
    return len(text.split())


def conversation_words(system: str, messages: Sequence[Message]) -> int:
    """The deterministic stand-in for input tokens (scripted and cli)."""
    return words(system) + sum(words(m.text) for m in messages)


def pieces(text: str) -> list[str]:
    """*text* as streamed word by word: the pieces join back to it exactly."""
    return _PIECE.findall(text)


class ScriptedProvider(Provider):
    kind = "scripted"

    def __init__(self, name: str, spec: ProviderSpec, *, cooldowns: Any = None,
                 env: Mapping[str, str] = os.environ, vault: Any = None):
        super().__init__(name, spec, env=env, vault=vault)
        self._rules = [(re.compile(r.match), r) for r in spec.rules]

    async def complete(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], *,
                       deadline: float, sink: Sink | None = None) -> Reply:
        reply, pace = self._answer(system, messages)
        if sink is not None:
            await self._stream(reply.text, sink, pace, deadline)
        return reply

    async def _stream(self, text: str, sink: Sink, pace: float, deadline: float) -> None:
        for n, piece in enumerate(pieces(text)):
            if n and pace:
                if time.monotonic() + pace >= deadline:
                    await sink.restart()
                    raise ProviderError(f"provider {self.name}: deadline passed mid-reply "
                                        f"(pace {pace}s a word)", retryable=True)
                await asyncio.sleep(pace)
            await sink.delta(piece)

    def _answer(self, system: str, messages: Sequence[Message]) -> tuple[Reply, float]:
        """The reply, and the pace of the rule that gave it."""
        incoming = next((m.text for m in reversed(messages) if m.role == "user"), "")
        for i, (regex, rule) in enumerate(self._rules):
            match = regex.search(incoming)
            if match:
                break
        else:
            return self._reply(NO_MATCH, (), system, messages), 0.0
        try:
            reply = match.expand(rule.reply)
            if messages and messages[-1].role == "tool":
                text = _with_results(reply, messages)
            elif rule.tools:
                calls = tuple(ToolCall(id=f"call_{n}", name=t.name, args=_expand(match, t.args))
                              for n, t in enumerate(rule.tools, start=1))
                return self._reply("", calls, system, messages), rule.pace
            else:
                text = reply.replace(TOOL_RESULTS, "")
        except (re.error, IndexError) as exc:
            raise ProviderError(f"provider {self.name}: rules[{i}]: cannot expand the match's groups "
                                f"into its reply or tool args: {exc}", retryable=False) from exc
        return self._reply(text, (), system, messages), rule.pace

    def _reply(self, text: str, calls: tuple[ToolCall, ...], system: str,
               messages: Sequence[Message]) -> Reply:
        return Reply(text=text, calls=calls, stop="tools" if calls else "end",
                     usage=Usage(conversation_words(system, messages), words(text) + len(calls)))


def _expand(match: re.Match, value: Any) -> Any:
    """*value* with every string in it expanded by *match* (``\\1`` → group 1)."""
    if isinstance(value, str):
        return match.expand(value)
    if isinstance(value, Mapping):
        return {k: _expand(match, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(match, v) for v in value]
    return value


def _with_results(reply: str, messages: Sequence[Message]) -> str:
    """*reply* showing the tool results that end *messages* (those since the last call)."""
    results = []
    for m in reversed(messages):
        if m.role != "tool":
            break
        results.append(m)
    results.reverse()
    if TOOL_RESULTS in reply:
        shown = "; ".join(f"(tool {m.name} failed: {m.text})" if m.error else m.text for m in results)
        return reply.replace(TOOL_RESULTS, shown)
    return reply + "".join(f" (tool {m.name} failed: {m.text})" for m in results if m.error)
