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


class _Estate:
    """An estate router that knows one running conversation and no runs, and notes each read."""

    floor = 0

    def __init__(self):
        self.reads: list[str] = []

    async def read(self, query, args, timeout=None):
        self.reads.append(query)
        if query == "conversation.get":
            return {"conversation": {"id": args["id"], "seat": "s1", "status": "running", "run": "r-first"},
                    "approval": None}
        return {"run": None} if query == "run.get" else {}


class _Busy:
    ttl = 15.0
    holders = None

    async def acquire(self, conversation, run, *, wait):
        raise ConversationBusy(conversation, "r-first", "node-a", 1.0, 15)


def test_a_run_without_an_idempotency_key_is_not_looked_up_before_its_claim():
    """Its id is fresh: the one read before the claim (and the 409) is the conversation's.
    With a key, the same request again is answered with its run, so that one is looked up."""
    import asyncio

    from crewlet.conversations.driver import Conductor

    def start(key):
        estate = _Estate()
        conductor = Conductor(js=None, router=estate, mailboxes=None, drivers=_Busy(), node="n",
                              busy_wait=0, max_run=60, event_ttl=60, runner_concurrency=1, sweep=1,
                              company=lambda: 1)
        with pytest.raises(ConversationBusy):
            asyncio.run(conductor.start("c1", input="hi", strategy="reject", on_disconnect="continue",
                                        key=key))
        return estate.reads

    assert start(None) == ["conversation.get"]
    assert start("k1") == ["conversation.get", "run.get"]
