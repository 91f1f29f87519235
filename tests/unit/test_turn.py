"""The rounds of a turn (crewlet.agent.turn.run_rounds), with the scripted
provider and a tool of the test's own: what a sink is told, in order."""

from __future__ import annotations

import asyncio
import time

import pytest

from crewlet.agent.providers import make_provider
from crewlet.agent.tools import Registry, Tool
from crewlet.agent.turn import Fenced, TurnRecord, run_rounds
from crewlet.agent.types import Sink
from crewlet.company.model import Provider as ProviderSpec

SCRIPT = ProviderSpec.model_validate({"kind": "scripted", "rules": [
    {"match": r"calculate (.+)", "reply": r"\1 is {tools}",
     "tools": [{"name": "calc", "args": {"expression": r"\1"}}]}]})


class Recorder(Sink):
    def __init__(self):
        self.told: list[tuple] = []

    async def delta(self, text):
        self.told.append(("delta", text))

    async def restart(self):
        self.told.append(("restart",))

    async def tool_call(self, call):
        self.told.append(("call", call.id, call.name, call.args))

    async def tool_result(self, call, result, error):
        self.told.append(("result", call.id, result, error))


def calculator() -> Registry:
    async def calc(ctx, args):
        return {"6 * 7": "42"}[args["expression"]]

    registry = Registry()
    registry.add(Tool("calc", "Evaluates arithmetic.", {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        calc))
    return registry


def turn(*, sink: Sink | None, fence=lambda: True) -> tuple[TurnRecord, object]:
    record = TurnRecord(seat="cto", trigger="t-1", node="n1", token=1, deliveries=1)
    usage = asyncio.run(run_rounds(
        record, text="calculate 6 * 7", persona="You count.", provider=make_provider("s", SCRIPT),
        registry=calculator(), services=None, fence=fence, deadline=time.monotonic() + 10, sink=sink))
    return record, usage


def test_a_sink_is_told_the_tool_calls_their_results_and_the_text_in_order():
    sink = Recorder()
    record, usage = turn(sink=sink)
    assert sink.told == [("call", "call_1", "calc", {"expression": "6 * 7"}),
                         ("result", "call_1", "42", False),
                         # The text streamed in five pieces; a tail that might still become a secret
                         # is held back until the provider call ends (crewlet.redaction.Stream), and
                         # this reply is all tail.
                         ("delta", "6 * 7 is 42")]
    assert record.reply == "6 * 7 is 42" and record.outcome == "done"

    plain, plain_usage = turn(sink=None)
    differs = {"started_at", "took_ms", "provider_ms"}
    assert ({k: v for k, v in plain.as_dict().items() if k not in differs}
            == {k: v for k, v in record.as_dict().items() if k not in differs}), "a sink changes nothing else"
    assert plain_usage == usage


def test_a_failed_fence_stops_before_the_sink_hears_of_a_call():
    sink = Recorder()
    with pytest.raises(Fenced):
        turn(sink=sink, fence=lambda: False)
    assert sink.told == []


SECRET = "correcthorse-0123456789-battery"


def test_no_known_secret_reaches_the_model_the_sink_the_hooks_or_the_record():
    """A tool that says a known secret back, and mail that names one the model
    puts in a call's arguments: the tool runs with [redacted] there, and
    neither the model, the sink, the messages kept nor the record hold it."""
    from crewlet import redaction
    from crewlet.agent.turn import Hooks

    script = ProviderSpec.model_validate({"kind": "scripted", "rules": [
        {"match": r"reveal", "reply": "it is {tools}", "tools": [{"name": "reveal", "args": {}}]},
        {"match": r"say (.+)", "reply": "said {tools}", "tools": [{"name": "echo", "args": {"text": r"\1"}}]}]})
    got: list[str] = []

    async def reveal(ctx, args):
        return f"the key is {SECRET}"

    async def echo(ctx, args):
        got.append(args["text"])
        return args["text"]

    registry = Registry()
    registry.add(Tool("reveal", "Says a secret.", {"type": "object", "properties": {}}, reveal))
    registry.add(Tool("echo", "Says it back.", {"type": "object", "properties": {"text": {"type": "string"}}},
                      echo))

    class Keep(Hooks):
        def __init__(self):
            self.kept = []

        async def message(self, message, round_no, index):
            self.kept.append(message)

    redaction.forget_all()
    redaction.learn([SECRET])
    try:
        for mail in ("reveal it", f"say {SECRET}"):
            sink, hooks = Recorder(), Keep()
            record = TurnRecord(seat="cto", trigger="t-1", node="n1", token=1, deliveries=1)
            asyncio.run(run_rounds(record, text=mail, persona="p", provider=make_provider("s", script),
                                   registry=registry, services=None, fence=lambda: True,
                                   deadline=time.monotonic() + 10, sink=sink, hooks=hooks))
            assert record.outcome == "done" and "[redacted]" in record.reply, record
            seen = repr(sink.told) + repr(hooks.kept) + repr(record.as_dict())
            assert SECRET not in seen and "[redacted]" in seen
        assert got == ["[redacted]"]  # the call ran with the secret's place marked
    finally:
        redaction.forget_all()
