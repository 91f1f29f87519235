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

**No secret gets in** (DESIGN §14): every tool result, and every reply's
text and tool-call arguments, pass through :func:`crewlet.redaction.scrub`
before anything else sees them — the model, the hooks (a conversation's
stored messages), the sink (the run events, the live feed) and the record
(its reply) — and the streamed text through a
:class:`~crewlet.redaction.Stream`, which holds back the tail that might
still become a secret until the provider call ends. A call the model makes
with a secret in its arguments runs with :data:`~crewlet.redaction.REDACTED`
there instead. A record's ``error``, made from an exception's text wherever
the turn failed, is scrubbed as it is set (:class:`TurnRecord`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from crewlet import redaction
from crewlet.agent.providers import Provider
from crewlet.agent.tools import Registry, ToolContext
from crewlet.agent.types import Message, Sink, ToolCall, Usage

# Rounds one turn may take before it is ended as failed: a model that keeps
# calling tools forever must not hold a turn slot forever.
MAX_ROUNDS = 8
# Characters of the final reply kept in the turn record.
REPLY_KEPT = 2000
# Characters of the ask kept in the turn record (its episode keeps as many).
ASK_KEPT = 500


class Fenced(Exception):
    """The seat's lease is no longer ours under this turn's token."""


@dataclass
class TurnRecord:
    """What one turn did; published on the live feed as ``feed.turn.<seat>`` and
    kept in the estate's ``turns`` table (many turns' in one ``turn.records`` op)."""

    seat: str
    trigger: str
    node: str
    token: int
    deliveries: int
    sender: str | None = None     # the seat that sent the mail (Crewlet-From), if one did
    # Who the turn worked with and what it was asked (its episode's, crewlet.estate.skills):
    # seat:<name>, person:<id>, hook:<integration>, conversation:<id> or operator.
    counterparty: str = "operator"
    ask: str = ""                 # the mail's or the user's words, cut to ASK_KEPT, scrubbed
    skills_seq: int | None = None  # a run's pin: the log seq its skills are read as of
    outcome: str = "running"      # done | failed | fenced | interrupted | skipped | deferred
    error: str | None = None
    rounds: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {name, error, round}
    tokens: dict[str, int] = field(default_factory=lambda: {"input": 0, "output": 0})
    reply: str = ""
    started_at: float = field(default_factory=time.time)
    # From the turn's start (its delivery in hand) to its side effects done: a
    # worked turn's ledger entry and this record are written after it, together.
    took_ms: float = 0.0
    provider_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict (its recursive deep copy showed in the seats
        # process's profile): the record's own fields, its two containers copied.
        body = {**vars(self), "tool_calls": [dict(c) for c in self.tool_calls],
                "tokens": dict(self.tokens)}
        body["error"] = body.pop("_error")
        return body


def _get_error(record: TurnRecord) -> str | None:
    return record._error


def _set_error(record: TurnRecord, value: str | None) -> None:
    record._error = redaction.scrub(value) if isinstance(value, str) and value else value


# A record's error is scrubbed as it is set (redaction.scrub: the values known
# and the credential shapes): it is built from an exception's text — a
# provider's, the broker's, a tool's, roles/seats/turns.py's ``f"{type(exc)}:
# {exc}"`` — which may quote a secret, and it leaves the process every way the
# record does (the live feed, the estate's row, the seat's stats, the
# ``turn`` log line). Once, on the rare record that has one; a property, not a
# __setattr__, so the other fields' writes cost nothing more.
TurnRecord.error = property(_get_error, _set_error)  # type: ignore[assignment]


class AwaitingApproval(Exception):
    """A call the seat may make only with a person's approval: the turn stops
    before it (the calls of its round before it ran), to be resumed once it
    is decided (:class:`Hooks`)."""

    def __init__(self, call: ToolCall, round_no: int, index: int):
        super().__init__(f"tool {call.name} waits for a person's approval")
        self.call, self.round_no, self.index = call, round_no, index


class Hooks:
    """What a conversation's turn adds to the rounds; a mail turn has none.

    Every method does nothing here: a conversation overrides them
    (:mod:`crewlet.conversations.turn`).
    """

    async def before_round(self, round_no: int) -> None:
        """Round *round_no* is about to ask the model: raise to stop first
        (an interrupt)."""

    async def message(self, message: Message, round_no: int, index: int | None) -> None:
        """*message* happened (the model's, or a tool's result: *index*, its
        call's place in the round): keep it before the turn goes on."""

    def decision(self, call: ToolCall) -> tuple[str, str | None] | None:
        """A person's decision on *call* — ``("approve" | "deny", note)`` — or
        None: the call was not decided (the rounds then ask :meth:`needs_approval`)."""
        return None

    def needs_approval(self, call: ToolCall) -> bool:
        """Does *call* wait for a person before it runs?"""
        return False


# What the model reads of a call a person denied.
DENIED = "A person denied this call{note}. Do not make it again; go on without it."


async def run_rounds(record: TurnRecord, *, text: str | None = None, history: list[Message] | None = None,
                     persona: str, provider: Provider, registry: Registry, services: Any,
                     fence: Callable[[], bool], deadline: float, sink: Sink | None = None,
                     hooks: Hooks | None = None,
                     pending: tuple[int, list[tuple[int, ToolCall]]] | None = None,
                     gate: Callable[[], Awaitable[None]] | None = None) -> Usage:
    """Run the rounds of one turn into *record*; the tokens used.

    The model reads *history* (a conversation's messages so far), or one
    user message, *text* (a mail). *pending*: ``(round, [(index, call)])``,
    calls of the history's last model message that have no result yet (a
    turn picked up after a crash, or resumed after an approval): they run
    first, under their own round's number, so a tool keying its side effect
    on the call (:attr:`~crewlet.agent.tools.ToolContext.call_key`) is not
    done twice.

    Raises :class:`Fenced` when the fence fails before a round's tool calls,
    :class:`AwaitingApproval` before a call that needs a person's approval,
    whatever *hooks* raise, and whatever the provider raises
    (:class:`~crewlet.agent.providers.ProviderError`). *record* says how far
    the turn got either way. *sink*: told the turn's progress as it happens
    (none: the provider is asked without streaming). *gate*: awaited once,
    before the first tool call (the turn's first side effect), and it may
    raise to end the turn there — what may run before it is only the model.
    """
    messages: list[Message] = list(history) if history is not None else [Message("user", text or "")]
    hooks = hooks or Hooks()
    scrubbed = _ScrubbedSink(sink) if sink is not None else None
    usage = Usage()
    round_no, calls = pending if pending is not None else (0, [])
    for asked_count in range(MAX_ROUNDS + 1):
        if calls:
            if gate is not None:
                await gate()
                gate = None
            if not fence():
                raise Fenced(f"lease of seat {record.seat} lost before round {round_no}'s tool calls")
            for index, call in calls:
                messages.append(await _call(record, call, round_no, index, registry, services, deadline,
                                            scrubbed, hooks))
            calls = []
        if asked_count == MAX_ROUNDS:
            break
        round_no += 1
        record.rounds = round_no
        await hooks.before_round(round_no)
        if scrubbed is not None:
            await scrubbed.begin_round(round_no)
        asked = time.monotonic()
        reply = await provider.complete(persona, messages, registry.specs(), deadline=deadline,
                                        sink=scrubbed)
        record.provider_ms += (time.monotonic() - asked) * 1000
        usage = usage + reply.usage
        record.tokens = {"input": usage.input, "output": usage.output}
        if scrubbed is not None:
            await scrubbed.end_call()
        reply_text, reply_calls = redaction.scrub(reply.text), tuple(map(_scrub_call, reply.calls))
        said = Message("assistant", reply_text, calls=reply_calls)
        messages.append(said)
        await hooks.message(said, round_no, None)
        if not reply_calls:
            record.reply = reply_text[:REPLY_KEPT]
            record.outcome = "done"
            return usage
        calls = list(enumerate(reply_calls))
    record.outcome = "failed"
    record.error = f"no final reply after {MAX_ROUNDS} rounds"
    return usage


async def _call(record: TurnRecord, call: ToolCall, round_no: int, index: int, registry: Registry,
                services: Any, deadline: float, sink: Sink | None, hooks: Hooks) -> Message:
    """Run one tool call (or tell the model a person denied it): its result,
    kept by *hooks* before the next call."""
    decided = hooks.decision(call)
    if decided is None and hooks.needs_approval(call):
        raise AwaitingApproval(call, round_no, index)
    if sink is not None:
        await sink.tool_call(call)
    if decided is not None and decided[0] == "deny":
        note = f" ({decided[1]})" if decided[1] else ""
        result, error = DENIED.format(note=note), True
    else:
        ctx = ToolContext(seat=record.seat, trigger=record.trigger, token=record.token,
                          call_key=f"{record.trigger}.{round_no}.{index}", services=services,
                          deadline=deadline, skills_as_of=record.skills_seq)
        result, error = await registry.call(ctx, call.name, call.args)
        result = redaction.scrub(result)
    record.tool_calls.append({"name": call.name, "error": error, "round": round_no})
    if sink is not None:
        await sink.tool_result(call, result, error)
    message = Message("tool", result, call_id=call.id, name=call.name, error=error)
    await hooks.message(message, round_no, index)
    return message


def _scrub_call(call: ToolCall) -> ToolCall:
    """*call* with no known secret (nor a credential's shape) in its arguments."""
    args = redaction.scrub_value(call.args)
    return call if args is call.args else ToolCall(call.id, call.name, args)


class _ScrubbedSink(Sink):
    """*sink* told the turn's progress with no secret in it: the model's text
    through a :class:`~crewlet.redaction.Stream` (its held tail released at
    the end of each provider call, :meth:`end_call`, and before a round or a
    tool call); calls and results arrive scrubbed already (:func:`run_rounds`)."""

    def __init__(self, sink: Sink):
        self.sink = sink
        self.stream = redaction.Stream()

    async def end_call(self) -> None:
        rest = self.stream.end()
        if rest:
            await self.sink.delta(rest)

    async def begin_round(self, round_no: int) -> None:
        await self.end_call()
        await self.sink.begin_round(round_no)

    async def delta(self, text: str) -> None:
        out = self.stream.feed(text)
        if out or not text:  # an empty delta is told as the provider told it
            await self.sink.delta(out)

    async def restart(self) -> None:
        self.stream.drop()
        await self.sink.restart()

    async def tool_call(self, call: ToolCall) -> None:
        await self.end_call()
        await self.sink.tool_call(call)

    async def tool_result(self, call: ToolCall, result: str, error: bool) -> None:
        await self.sink.tool_result(call, result, error)
