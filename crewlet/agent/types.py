"""The vocabulary shared by providers, tools and the turn loop.

A conversation is a list of :class:`Message`; a provider answers one with a
:class:`Reply` (text, tool calls, usage). Tools are offered as
:class:`ToolSpec` (a name and a JSON schema). Nothing here talks to anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# A tool name every provider accepts (OpenAI: ^[a-zA-Z0-9_-]{1,64}$), so an
# MCP server's tool is offered as <server>__<tool>.
TOOL_NAME_MAX = 64


@dataclass(frozen=True)
class ToolSpec:
    name: str           # [A-Za-z0-9_-]{1,64}
    description: str
    parameters: dict[str, Any]  # a JSON schema of type "object"


@dataclass(frozen=True)
class ToolCall:
    id: str             # the provider's id for the call (made up by providers that have none)
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Message:
    """One entry of a conversation.

    * ``user``: ``text`` is what arrived (the mail).
    * ``assistant``: ``text`` and the ``calls`` the model made.
    * ``tool``: the result of one call: ``call_id``, ``name``, ``text``,
      ``error`` when the tool failed.
    """

    role: Literal["user", "assistant", "tool"]
    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    call_id: str | None = None
    name: str | None = None
    error: bool = False


@dataclass(frozen=True)
class Usage:
    input: int = 0      # tokens read
    output: int = 0     # tokens written

    @property
    def total(self) -> int:
        return self.input + self.output

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input + other.input, self.output + other.output)


@dataclass(frozen=True)
class Reply:
    text: str
    calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    stop: str = "end"   # why the model stopped: end | tools | length | other
