"""What an HTTP provider sends: the body encoded once, its tool list's JSON
made once per list of specs and never another list's."""

from __future__ import annotations

import json

import pytest

from crewlet.agent.providers import make_provider
from crewlet.agent.types import Message, ToolSpec
from crewlet.company.model import Provider as ProviderSpec


def _specs(*names: str) -> list[ToolSpec]:
    return [ToolSpec(n, f"the {n} tool", {"type": "object", "properties": {"x": {"type": "string"}}})
            for n in names]


@pytest.mark.parametrize("kind,entry", [
    ("openai", lambda t: {"type": "function", "function": {"name": t.name, "description": t.description,
                                                          "parameters": t.parameters}}),
    ("anthropic", lambda t: {"name": t.name, "description": t.description, "input_schema": t.parameters}),
])
def test_the_body_carries_its_tools_and_their_json_is_made_once_per_list(kind, entry):
    p = make_provider("p", ProviderSpec.model_validate({"kind": kind, "model": "m"}))
    msgs = [Message("user", "héllo")]
    tools = _specs("a", "b")
    body = p._body("a persona", msgs, tools)
    first = p._encode(body, tools)
    assert json.loads(first) == {**body, "tools": [entry(t) for t in tools]}
    assert "héllo".encode() in first                        # UTF-8, not \u escapes
    assert p._encode(body, tools) == first
    assert len(p._tools_json) == 1                         # made once for this list

    # The same names in new spec objects (another seat's servers): made anew.
    other = _specs("a", "b")
    other[1] = ToolSpec("b", "another b", other[1].parameters)
    again = json.loads(p._encode(body, other))
    assert again["tools"][1] == entry(other[1])
    # No tools: the body alone.
    assert json.loads(p._encode(body, [])) == body
    # A body of nothing but tools.
    assert json.loads(p._encode({}, tools)) == {"tools": [entry(t) for t in tools]}


def test_a_tool_gives_the_same_spec_each_time():
    from crewlet.agent.tools import builtin_tools
    tool = builtin_tools()[0]
    assert tool.spec() is tool.spec()
    assert (tool.spec().name, tool.spec().parameters) == (tool.name, tool.parameters)


def test_every_seat_without_servers_offers_the_very_same_tool_list():
    """Issue 28: a seat's tools are made once for every seat (the skill tool
    was made per seat), so a provider serving hundreds of seats encodes their
    tool list once, not on every turn — its JSON is kept by the specs'
    identity, and a hundred seats' distinct lists outran what it keeps."""
    from crewlet.agent.estate_tools import estate_tools
    from crewlet.agent.skill_tools import skill_tools
    from crewlet.agent.tools import Registry, builtin_tools

    def seat_registry() -> Registry:  # as roles/seats/turns.py's SeatWork makes one
        registry = Registry()
        for tool in builtin_tools() + estate_tools() + skill_tools():
            registry.add(tool)
        return registry
    p = make_provider("p", ProviderSpec.model_validate({"kind": "openai", "model": "m"}))
    body = p._body("a persona", [Message("user", "hello")], [])
    bodies = {p._encode(body, seat_registry().specs()) for _ in range(100)}
    assert len(bodies) == 1 and len(p._tools_json) == 1
