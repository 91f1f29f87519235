"""A drain order (crewlet/coord/drain.py): what the ``drain.<node>`` key may
hold, what a watch of them keeps, and when a node counts as drained."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from crewlet.coord import drain


@dataclass
class Entry:
    """What a KV watch delivers: a key, its value, and an operation for deletes."""
    key: str
    value: bytes
    operation: str | None = None


def test_an_order_round_trips_and_says_its_deadline():
    order = drain.new(30, "crewletctl@n1", now=1000.0)
    assert drain.parse(order.record()) == order
    assert order.until == 1030.0
    assert order.presence() == {"since": 1000.0, "until": 1030.0, "by": "crewletctl@n1"}


@pytest.mark.parametrize("value, says", [
    (b"not json", "not JSON"),
    (b"[1]", "not an object"),
    (json.dumps({"deadline": 5, "by": "x"}).encode(), "at must be a time"),
    (json.dumps({"at": "noon", "deadline": 5}).encode(), "at must be a time"),
    (json.dumps({"at": 1.0, "deadline": -1}).encode(), "deadline must be"),
    (json.dumps({"at": 1.0, "deadline": True}).encode(), "deadline must be"),
    (json.dumps({"at": 1.0, "deadline": 1e9}).encode(), "deadline must be"),
    (json.dumps({"at": 1.0, "deadline": 5, "by": 7}).encode(), "by must be a string"),
])
def test_a_value_that_is_no_order_is_refused_saying_why(value, says):
    with pytest.raises(drain.BadOrder, match=says):
        drain.parse(value)


def test_the_watch_keeps_each_nodes_order_and_says_each_change_once():
    changes, refusals = [], []
    orders = drain.Orders(changed=lambda node, order: changes.append((node, order)),
                          refused=lambda node, error: refusals.append(node))
    a, b = drain.new(10, "x", now=1.0), drain.new(20, "y", now=2.0)
    orders.opened()
    orders.seen(Entry("drain.n1", a.record()))
    assert changes == []  # a listing is put in force whole, at its end
    orders.listed()
    assert changes == [("n1", a)] and orders.orders == {"n1": a}
    orders.seen(Entry("drain.n2", b.record()))
    orders.seen(Entry("drain.n2", b"garbage"))  # refused: what was in force stays
    assert orders.orders == {"n1": a, "n2": b} and refusals == ["n2"]
    orders.seen(Entry("drain.n1", b"", operation="DEL"))
    assert changes[-1] == ("n1", None) and "n1" not in orders.orders
    # Listed anew (a watch reopened) while n2's order went meanwhile: said gone.
    orders.opened()
    orders.listed()
    assert changes[-1] == ("n2", None) and orders.orders == {}
    assert len(changes) == 4


def test_a_node_is_drained_once_it_holds_no_seat_duty_or_run():
    order = drain.new(10, "x", now=1.0).presence()
    assert drain.state({"seats": ["s1"], "duties": [], "conversations": 0}) is None
    assert drain.state({"draining": order, "seats": ["s1"], "duties": [], "conversations": 0}) == "draining"
    assert drain.state({"draining": order, "seats": 0, "duties": ["sender"]}) == "draining"
    assert drain.state({"draining": order, "seats": 0, "duties": [], "conversations": 2}) == "draining"
    assert drain.state({"draining": order, "seats": [], "duties": [], "conversations": 0}) == "drained"
    assert not drain.past_deadline({"draining": order}, now=10.9)
    assert drain.past_deadline({"draining": order}, now=11.0)
    assert not drain.past_deadline({}, now=1e12)
