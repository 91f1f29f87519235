"""The vocabulary shared by providers, tools and the turn loop.

A conversation is a list of :class:`Message`; a provider answers one with a
:class:`Reply` (text, tool calls, usage). Tools are offered as
:class:`ToolSpec` (a name and a JSON schema). A turn's progress, as it
happens, goes to a :class:`Sink`. Nothing here talks to anything.
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


class Sink:
    """Where a turn tells its progress as it happens: the model's text as it
    comes, each tool call as it starts and its result as it ends (what a
    conversation run turns into ``message.delta``, ``tool.call`` and
    ``tool.result`` events). Every method does nothing here: a consumer
    overrides what it wants. A sink's own exception ends the turn.

    The deltas of one provider call join into its :attr:`Reply.text`. When
    an attempt that already streamed fails — a stream cut mid-way, an error
    event, a malformed chunk, a deadline — ``restart`` is called before
    anything else: every delta of that call so far is void. The provider's
    retry loop may then try again, streaming the answer from its first
    token, or give up and raise. So a call's text is what came after its
    last ``restart``, and the :class:`Reply` it returns is the final word.
    An attempt that fails before streaming anything says nothing.
    """

    async def begin_round(self, round_no: int) -> None:
        """The turn asks the model again: round *round_no* (from 1; a turn
        picked up mid-way starts past 1). Text from here is this round's."""

    async def delta(self, text: str) -> None:
        """More of the model's text."""

    async def restart(self) -> None:
        """The deltas of the current provider call so far are void."""

    async def tool_call(self, call: ToolCall) -> None:
        """The turn is about to run *call* (the fence held)."""

    async def tool_result(self, call: ToolCall, result: str, error: bool) -> None:
        """*call* ended: what the model will read, and whether the tool failed."""
