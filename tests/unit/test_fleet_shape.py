"""The fleet_shape duty's judgement of an assembled fleet."""

from __future__ import annotations

from crewlet.coord.sweep import SeatView
from roles.workers.duties.fleet_shape import UNPLACEABLE_SHOWN, problems, seat_views, unplaceable

ALL = ["data", "ingress", "seats", "workers"]


def node(roles, broker="member", protocol=1):
    return {"roles": roles, "broker": broker, "protocol": protocol}


def test_a_whole_fleet_has_no_problems():
    nodes = {f"n{i}": node(ALL) for i in range(3)}
    assert problems(nodes, replicas=3) == {}


def test_a_role_nobody_runs_is_unmanned():
    nodes = {"a": node(["data", "ingress", "seats"]), "b": node(["data", "seats"]),
             "c": node(["data"])}
    assert problems(nodes, replicas=3) == {
        "fleet_role_unmanned": {"roles": ["workers"], "nodes": ["a", "b", "c"]}}


def test_data_on_a_leaf_and_too_few_members():
    nodes = {"a": node(ALL), "b": node(["data", "seats"], broker="leaf"),
             "c": node(["seats"], broker="leaf")}
    found = problems(nodes, replicas=3)
    assert found["fleet_data_on_leaf"] == {"nodes": ["b"]}
    assert found["fleet_replicas_short"] == {"members": ["a"], "replicas": 3}


def test_a_presence_that_does_not_say_counts_as_a_member():
    nodes = {"a": {"roles": ALL}, "b": {"roles": ALL}, "c": {"roles": ALL}}
    assert problems(nodes, replicas=3) == {}


def test_an_external_cluster_needs_no_members():
    nodes = {"a": node(ALL, broker="external")}
    assert "fleet_replicas_short" not in problems(nodes, replicas=3)


def test_mixed_protocols():
    nodes = {"a": node(ALL, protocol=1), "b": node(ALL, protocol=2)}
    assert problems(nodes, replicas=1)["fleet_protocol_mixed"]["protocols"] == [1, 2]


def test_a_seat_no_live_node_may_hold_is_unplaceable():
    nodes = {"a": {**node(ALL), "labels": {"zone": "eu"}},
             "b": {**node(["data", "seats"]), "labels": {"zone": "us", "gpu": "yes"}},
             "c": {**node(["data", "workers"]), "labels": {"zone": "mars"}}}  # runs no seats
    seats = seat_views({"seats": [
        {"name": "anywhere"}, {"name": "eu", "placement": {"labels": {"zone": "eu"}}},
        {"name": "gpu-us", "placement": {"labels": {"zone": "us", "gpu": "yes"}}},
        {"name": "gpu-eu", "placement": {"labels": {"zone": "eu", "gpu": "yes"}}},
        {"name": "mars", "placement": {"labels": {"zone": "mars"}}}]})
    assert unplaceable(nodes, seats) == ["gpu-eu", "mars"]
    assert problems(nodes, replicas=3, seats=seats)["fleet_seat_unplaceable"] == {
        "seats": ["gpu-eu", "mars"], "count": 2}
    assert "fleet_seat_unplaceable" not in problems(nodes, replicas=3, seats=seats[:3])
    # No seats node at all: that is the unmanned role, not every seat unplaceable.
    nobody = {"c": nodes["c"]}
    assert unplaceable(nobody, seats) == []
    assert set(problems(nobody, replicas=1, seats=seats)) == {"fleet_role_unmanned"}


def test_many_unplaceable_seats_are_counted_and_a_few_named():
    nodes = {"a": node(ALL)}
    seats = [SeatView(f"s{i:03}", {"zone": "nowhere"}) for i in range(100)]
    found = problems(nodes, replicas=1, seats=seats)["fleet_seat_unplaceable"]
    assert found["count"] == 100 and found["seats"] == [f"s{i:03}" for i in range(UNPLACEABLE_SHOWN)]
