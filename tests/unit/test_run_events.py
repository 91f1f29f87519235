"""The shapes of a conversation run's events and its driver's refusal
(crewlet.conversations.runs, .lease), without a broker: subjects, the size
bound, what a 409 conversation_busy is told."""

from __future__ import annotations

import json

import pytest

from crewlet.conversations import runs
from crewlet.conversations.lease import ConversationBusy, key
from crewlet.coord.lease import Owner


def test_every_run_has_a_subject_of_its_own_and_bad_ids_none():
    assert runs.subject("c1", "r1") == "runs.c1.r1"
    assert runs.subject("a.b", "c") == "runs.a~b.c" != runs.subject("a", "b.c") == "runs.a.b~c"
    assert runs.subject("x:1", "y-2_3") == "runs.x:1.y-2_3"
    for bad in ("", "a b", "a*", "a>", ".a", "~a"):
        with pytest.raises(ValueError):
            runs.subject(bad, "r1")
        with pytest.raises(ValueError):
            key(bad)
    assert key("a.b") == "conv.a.b"


def test_an_event_that_fits_is_sent_as_it_is():
    event = {"type": runs.DELTA, "run": "r", "conversation": "c", "at": 1.5, "round": 1, "text": "hé"}
    data = runs.encode(event)
    assert json.loads(data) == event and "truncated" not in json.loads(data)
    assert runs.decode(data) == event
    assert runs.decode(b"not json") is None and runs.decode(b"[1]") is None


def test_an_event_too_big_has_its_longest_fields_cut_and_says_so():
    event = {"type": runs.TOOL_CALL, "run": "r" * 100, "conversation": "c", "at": 1.0, "round": 1,
             "call": "k", "name": "x", "args": {"body": "\u0001" * 5000, "to": ["a@b"]}}
    data = runs.encode(event, limit=1000)
    assert len(data) <= 1000
    cut = json.loads(data)
    assert cut["truncated"] is True and cut["run"] == "r" * 100 and cut["call"] == "k"
    assert isinstance(cut["args"], str) and cut["args"].startswith('{"body"')
    # The envelope alone too big: said, not cut.
    with pytest.raises(ValueError):
        runs.encode({"type": runs.COMPLETED, "run": "r" * 2000, "conversation": "c", "at": 1.0},
                    limit=1000)


def test_a_busy_conversation_names_its_driver_and_when_it_lapses_at_the_latest():
    owner = Owner(node="node-a", boot="b", token=7, revision=9,
                  info={"run": "r1", "since": 100.0, "at": 110.0, "ttl": 15.0, "conversation": "c1"})
    busy = ConversationBusy.of("c1", owner, now=112.0)
    assert (busy.run, busy.node, busy.since, busy.retry_after) == ("r1", "node-a", 100.0, 13)
    # Clocks that disagree are bounded to [1, ttl].
    assert ConversationBusy.of("c1", owner, now=500.0).retry_after == 1
    assert ConversationBusy.of("c1", owner, now=0.0).retry_after == 15
    # A key holding a lease that does not say (or went meanwhile).
    assert ConversationBusy.of("c1", None).run is None
    assert ConversationBusy.of("c1", Owner("n", "b", 1, 1, {})).retry_after == 1
