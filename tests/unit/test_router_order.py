"""The router's order over the data nodes, and the view's node states (no processes).

Reference, "How a request reaches the estate": the node that last answered,
then an order spreading askers over the data nodes; a node silent in the
last 30 s last; lagging nodes and nodes behind the caller's floor after the
others; out-of-service nodes passed over.
"""

from __future__ import annotations

from collections import Counter

from crewlet.estate.router import (SILENT_FOR, NobodyAnswered, OutcomeUnknown, applier_wait,
                                   order)
from crewlet.estate.view import (LAG_OPS, NO_RECORD, STATUS_STALE, STOPPED, EstateView,
                                 NodeState, _state, with_lag)

NOW = 1000.0


def nodes(*ids: str, applied: int = 50) -> list[NodeState]:
    return [NodeState(i, True, None, applied, NOW) for i in ids]


def ids(states: list[NodeState]) -> list[str]:
    return [s.id for s in states]


def test_last_answered_is_asked_first_whatever_the_spread():
    states = nodes("a", "b", "c", "d")
    plain = ids(order("asker", states, 0, None, {}, NOW))
    for first in "abcd":
        got = ids(order("asker", states, 0, first, {}, NOW))
        assert got[0] == first
        assert got[1:] == [n for n in plain if n != first]  # the rest keep the asker's order


def test_askers_are_spread_over_the_data_nodes_and_each_keeps_its_order():
    states = nodes(*(f"d{i}" for i in range(8)))
    firsts = Counter(order(f"asker-{i}", states, 0, None, {}, NOW)[0].id for i in range(400))
    assert set(firsts) == {s.id for s in states}           # every node is somebody's first
    assert max(firsts.values()) < 400 * 0.25               # and nobody is everybody's
    a = ids(order("node-a", states, 0, None, {}, NOW))
    b = ids(order("node-b", states, 0, None, {}, NOW))
    assert a != b and a[0] != b[0]
    # The same asker asks in the same order every time, whatever order the view lists.
    assert ids(order("node-a", list(reversed(states)), 0, None, {}, NOW)) == a


def test_a_node_silent_in_the_last_30s_is_asked_last_and_forgiven_after():
    states = nodes("a", "b", "c")
    plain = ids(order("asker", states, 0, None, {}, NOW))
    silent = plain[0]
    got = ids(order("asker", states, 0, None, {silent: NOW - 1}, NOW))
    assert got[-1] == silent and got[:-1] == plain[1:]
    # Silent even though it answered last: still last.
    assert ids(order("asker", states, 0, silent, {silent: NOW - 1}, NOW))[-1] == silent
    # Silent longer ago than SILENT_FOR: back in its place.
    assert ids(order("asker", states, 0, None, {silent: NOW - SILENT_FOR - 1}, NOW)) == plain


def test_lagging_and_behind_the_floor_come_after_the_others_before_the_silent():
    states = [NodeState("ok1", True, None, 5000, NOW), NodeState("ok2", True, None, 5000, NOW),
              NodeState("lag", True, None, 5000 - LAG_OPS - 1, NOW),
              NodeState("low", True, None, 4990, NOW), NodeState("mute", True, None, 5000, NOW)]
    states = with_lag(states)
    assert [s.id for s in states if s.lagging] == ["lag"]
    got = ids(order("asker", states, 4995, "low", {"mute": NOW - 2}, NOW))
    assert set(got[:2]) == {"ok1", "ok2"}
    assert set(got[2:4]) == {"lag", "low"} and got[2] == "low"  # last answered first in its tier
    assert got[4] == "mute"
    # Without a floor the node at 4990 is as good as any.
    assert "low" in ids(order("asker", states, 0, None, {}, NOW))[:3]


def test_out_of_service_nodes_are_not_in_the_order_nor_this_node_when_its_copy_was_tried():
    states = [*nodes("a", "b"), NodeState("gone", False, STOPPED, 50, NOW - 60),
              NodeState("evicted", False, "node evicted: disk", 50, NOW)]
    assert set(ids(order("a", states, 0, "gone", {}, NOW))) == {"a", "b"}
    assert ids(order("a", states, 0, None, {}, NOW, exclude={"a"})) == ["b"]
    assert order("a", [], 0, None, {}, NOW) == []


# ------------------------------------------------------------- node states

def test_a_node_state_says_why_it_is_out_of_service():
    presence = {"roles": ["data", "seats"], "broker": "member"}
    fresh = {"applied": 7, "in_service": True, "reason": None, "at": NOW - 1}
    assert _state("a", presence, fresh, None, NOW) == NodeState("a", True, None, 7, NOW - 1,
                                                                broker="member")
    assert _state("a", presence, None, None, NOW).reason == NO_RECORD
    stale = {**fresh, "at": NOW - STATUS_STALE - 0.5}
    assert _state("a", presence, stale, None, NOW).reason == STOPPED
    below = {**fresh, "in_service": False,
             "reason": "rows below the log's first sequence (applied 3, the log starts at 9)"}
    assert _state("a", presence, below, None, NOW).reason.startswith("rows below")
    evicted = _state("a", presence, fresh, {"reason": "disk failing", "at": NOW}, NOW)
    assert not evicted.in_service and evicted.reason == "node evicted: disk failing"


def test_a_fixed_view_answers_its_states_with_lag():
    view = EstateView.of([NodeState("a", True, None, 10, NOW),
                          NodeState("b", True, None, 10 + LAG_OPS + 1, NOW)])
    assert view.ready
    assert {s.id: s.lagging for s in view.data_nodes()} == {"a": True, "b": False}


# ---------------------------------------------------------------- messages

def test_nobody_answered_names_every_node_and_what_it_said():
    exc = NobodyAnswered({"b": "no answer within 10s", "c": "out of service: applier stopped"})
    assert str(exc) == ("no data node answered: node b: no answer within 10s; "
                        "node c: out of service: applier stopped")
    assert "names no data node" in str(NobodyAnswered({}))
    unknown = OutcomeUnknown("op-1", {"b": "no answer within 60s"})
    assert unknown.op_id == "op-1" and "op-1" in str(unknown) and "node b" in str(unknown)


def test_the_applier_is_told_to_answer_before_the_router_stops_listening():
    assert applier_wait(10.0) == 9.5
    assert 0 < applier_wait(1.0) < 1.0
    assert applier_wait(0.0) == 0.0


# ------------------------------------------- decisions made without asking

def test_nobody_to_ask_is_nobody_answered_and_a_search_not_searched_never_empty():
    """Out-of-service nodes are passed over unasked (the router has no
    connection here: anything it sent would fail)."""
    import asyncio

    import pytest

    from crewlet.estate.ops import OpError, make_op
    from crewlet.estate.router import Router

    view = EstateView.of([NodeState("b", False, STOPPED, 5, NOW),
                          NodeState("c", False, "node evicted: disk", 5, NOW)])
    router = Router(None, node_id="a", view=view)

    async def main():
        with pytest.raises(NobodyAnswered) as caught:
            await router.read("task.list", {})
        assert caught.value.answers == {"b": "out of service: applier stopped",
                                        "c": "out of service: node evicted: disk"}
        with pytest.raises(NobodyAnswered):  # nothing may have run: not "unknown"
            await router.write(make_op("page.write", {"path": "p", "title": "t", "body": ""},
                                       node="a"))
        found = await router.search("anything")
        assert (found.searched, found.hits, found.node) == (False, [], None)
        assert found.answers == caught.value.answers
        with pytest.raises(OpError):
            await router.read("task.get", {"id": "not-a-task-id"})
        empty = Router(None, node_id="a", view=EstateView.of([]))
        with pytest.raises(NobodyAnswered, match="names no data node"):
            await empty.read("task.list", {})
    asyncio.run(main())
