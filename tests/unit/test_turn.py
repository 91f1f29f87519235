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
                         ("delta", "6 "), ("delta", "* "), ("delta", "7 "), ("delta", "is "), ("delta", "42")]
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
