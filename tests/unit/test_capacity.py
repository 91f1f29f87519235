"""The capacity handshake (crewlet/coord/capacity.py) and the log's trim point
(roles/workers/duties/log_trim.py): who counts as a broker member, the
eviction gate, and how far the log may be trimmed."""

from __future__ import annotations

from crewlet.coord import capacity
from crewlet.estate.view import NodeState
from roles.workers.duties.log_trim import trim_point


def test_a_broker_member_counts_whatever_its_roles_and_a_presence_that_does_not_say_counts_too():
    presences = {"a": {"roles": ["data"], "broker": "member"},
                 "b": {"roles": ["seats"], "broker": "member"},   # no data: still holds replicas
                 "c": {"roles": ["seats"], "broker": "leaf"},     # a leaf holds none
                 "d": {"roles": ["data"]}}                        # says nothing: counted
    assert capacity.members(presences) == ["a", "b", "d"]
    assert capacity.short_of_replicas(presences, 3) is None
    short = capacity.short_of_replicas({"a": presences["a"], "c": presences["c"]}, 3)
    assert short == "the streams keep 3 replicas but 1 broker member is live (a)"


def test_the_last_copy_in_service_cannot_be_evicted():
    copies = [NodeState("a", True), NodeState("b", False, "node evicted: x"), NodeState("c", False, "applier stopped")]
    why = capacity.eviction_refused(copies, "a")
    assert why is not None and "only copy of the estate in service" in why
    assert capacity.eviction_refused(copies, "b") is None   # already out: nothing lost
    assert capacity.eviction_refused(copies + [NodeState("d", True)], "a") is None


def test_the_trim_goes_to_the_lowest_copy_in_service_never_past_the_newest_snapshot():
    copies = [NodeState("a", True, applied=900), NodeState("b", True, applied=700),
              NodeState("evicted", False, "node evicted: x", applied=10),   # does not hold it back
              NodeState("stopped", False, "applier stopped", applied=20)]
    assert trim_point(copies, 800)[0] == 700
    assert trim_point(copies, 500)[0] == 500     # the newest snapshot bounds it
    upto, why = trim_point(copies, None)
    assert upto is None and "no snapshot" in why
    assert trim_point([NodeState("x", False, "applier stopped", applied=5)], 100)[0] is None
