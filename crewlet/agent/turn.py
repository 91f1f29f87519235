"""One turn: a message in a seat's mailbox, answered in rounds (DESIGN §5).

A round is one provider call and then the tool calls it asked for. Before a
round's side effects — its tool calls — the **fence** is checked: does this
node still hold the seat's lease under the token the turn started with? A
turn that lost its seat stops there (``fenced``) and its message is left to
the successor. What a round already did stays done; that is the window the
reference names ("A wedged-alive zombie can act for up to one LLM round"),
narrowed by every tool keying its side effect on the round
(:attr:`~crewlet.agent.tools.ToolContext.call_key`), so a redone turn's send
is deduplicated by the broker.

This module runs the rounds and says what happened in a :class:`TurnRecord`;
where the mail comes from, the ledger and the ack are the seats role's
(:mod:`roles.seats.turns`). A caller that wants the turn as it happens (a
conversation run) passes a :class:`~crewlet.agent.types.Sink`: the model's
text streams to it, then each tool call as it starts (past the fence) and
its result as it ends.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from crewlet.agent.providers import Provider
from crewlet.agent.tools import Registry, ToolContext
from crewlet.agent.types import Message, Sink, Usage

# Rounds one turn may take before it is ended as failed: a model that keeps
# calling tools forever must not hold a turn slot forever.
MAX_ROUNDS = 8
# Characters of the final reply kept in the turn record.
REPLY_KEPT = 2000


class Fenced(Exception):
    """The seat's lease is no longer ours under this turn's token."""


@dataclass
class TurnRecord:
    """What one turn did; published on ``EVENTS`` as ``events.turn.<seat>``."""

    seat: str
    trigger: str
    node: str
    token: int
    deliveries: int
    sender: str | None = None     # the seat that sent the mail (Crewlet-From), if one did
    outcome: str = "running"      # done | failed | fenced | interrupted | skipped | deferred
    error: str | None = None
    rounds: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {name, error, round}
    tokens: dict[str, int] = field(default_factory=lambda: {"input": 0, "output": 0})
    reply: str = ""
    started_at: float = field(default_factory=time.time)
    took_ms: float = 0.0
    provider_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def run_rounds(record: TurnRecord, *, text: str, persona: str, provider: Provider,
                     registry: Registry, services: Any, fence: Callable[[], bool],
                     deadline: float, sink: Sink | None = None) -> Usage:
    """Run the rounds of one turn into *record*; the tokens used.

    Raises :class:`Fenced` when the fence fails before a round's tool calls,
    and whatever the provider raises (:class:`~crewlet.agent.providers.ProviderError`).
    *record* says how far the turn got either way. *sink*: told the turn's
    progress as it happens (none: the provider is asked without streaming).
    """
    messages: list[Message] = [Message("user", text)]
    usage = Usage()
    for round_no in range(1, MAX_ROUNDS + 1):
        record.rounds = round_no
        asked = time.monotonic()
        reply = await provider.complete(persona, messages, registry.specs(), deadline=deadline,
                                        sink=sink)
        record.provider_ms += (time.monotonic() - asked) * 1000
        usage = usage + reply.usage
        record.tokens = {"input": usage.input, "output": usage.output}
        if not reply.calls:
            record.reply = reply.text[:REPLY_KEPT]
            record.outcome = "done"
            return usage
        messages.append(Message("assistant", reply.text, calls=tuple(reply.calls)))
        if not fence():
            raise Fenced(f"lease of seat {record.seat} lost before round {round_no}'s tool calls")
        for index, call in enumerate(reply.calls):
            ctx = ToolContext(seat=record.seat, trigger=record.trigger, token=record.token,
                              call_key=f"{record.trigger}.{round_no}.{index}", services=services,
                              deadline=deadline)
            if sink is not None:
                await sink.tool_call(call)
            result, error = await registry.call(ctx, call.name, call.args)
            record.tool_calls.append({"name": call.name, "error": error, "round": round_no})
            if sink is not None:
                await sink.tool_result(call, result, error)
            messages.append(Message("tool", result, call_id=call.id, name=call.name, error=error))
    record.outcome = "failed"
    record.error = f"no final reply after {MAX_ROUNDS} rounds"
    return usage
