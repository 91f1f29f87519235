"""Conversations in the estate (DESIGN §11): their runs, messages and
approvals as ops applied to a copy, and the queries over them
(crewlet.estate.ops, apply, store). Real LMDB in temp dirs, as
tests/unit/test_estate_apply.py."""

from __future__ import annotations

import math

import msgpack
import pytest

from crewlet.estate import apply, ops, store
from crewlet.estate.ops import OpError, make_op
from tests.estate import op


@pytest.fixture
def copy(tmp_path):
    made = []

    def make(name: str = "a") -> store.Store:
        made.append(store.open_env(str(tmp_path / name)))
        return made[-1]
    yield make
    for s in made:
        store.close_env(s)


def run(s, *ops_):
    first = s.applied() + 1
    return [o for _, o in apply.apply_batch(s, [(first + i, o.encode()) for i, o in enumerate(ops_)])]


def one(s, o):
    return run(s, o)[0]


def q(s, name, **args):
    return store.Reader(s).query(name, args)


def conv(id="c1", seat="cto", **kw):
    return op("conversation.create", {"id": id, "seat": seat, **kw})


def new_run(id, conversation="c1", status="queued", at=1000.0, **kw):
    args = {"id": id, "conversation": conversation, "strategy": "reject", "on_disconnect": "continue",
            "revision": 4, "input": f"input of {id}", "status": status, **kw}
    return op("run.create", args, at=at, node="ingress-a")


def update(run_id, status, seat=None, token=None, at=1000.0, **kw):
    return op("run.update", {"id": run_id, "status": status, **kw}, seat=seat, token=token, at=at)


def msg(id, run_id, role="assistant", text=None, conversation="c1", seat="cto", token=1, **kw):
    args = {"conversation": conversation, "id": id, "run": run_id, "role": role,
            "text": text if text is not None else f"text of {id}", **kw}
    return op("conversation.message", args, seat=seat, token=token)


def request(id, run_id, conversation="c1", seat="cto", token=1, expires_at=2000.0, at=1000.0, **kw):
    args = {"id": id, "conversation": conversation, "run": run_id, "seat": seat, "tool": "wire_money",
            "call_id": "call_1", "args": {"to": "acme", "amount": 120}, "expires_at": expires_at, **kw}
    return op("approval.request", args, seat=seat, token=token, at=at)


def decide(id, decision, at=1000.0, seat=None, token=None, **kw):
    return op("approval.decide", {"id": id, "decision": decision, **kw}, at=at, seat=seat, token=token)


def texts(s, conversation="c1"):
    return [m["text"] for m in q(s, "conversation.messages", conversation=conversation)["messages"]]


# ------------------------------------------------------------ conversations

def test_a_conversation_is_created_idle_and_a_resend_lands_once(copy):
    s = copy()
    first = one(s, conv(metadata={"user": "u-7", "tags": ["web"]}))
    assert first["ok"]
    row = first["result"]["conversation"]
    assert (row["id"], row["seat"], row["status"], row["run"], row["approval"]) == ("c1", "cto", "idle", None, None)
    assert (row["metadata"], row["created_by"], row["created_at"]) == ({"user": "u-7", "tags": ["web"]},
                                                                     "operator@n1", 1000.0)
    # The same op again: the broker's or the copy's dedupe, the first outcome.
    same = conv(metadata={"user": "u-7", "tags": ["web"]}, id="c1")
    resent = op("conversation.create", same.args, id="op-create-c1")
    dup, again, other = run(s, resent, resent, conv(seat="ceo"))
    # Another op writing the same conversation: answered with it, nothing new.
    assert dup["ok"] and dup["result"]["already"] and dup["result"]["conversation"] == row
    assert again == {**dup, "duplicate": True}
    # The same id with another seat is another conversation: a conflict.
    assert not other["ok"] and other["code"] == "conflict" and "exists" in other["error"]
    got = q(s, "conversation.get", id="c1")
    assert got == {"conversation": row, "run": None, "approval": None}
    assert q(s, "conversation.get", id="c9") == {"conversation": None, "run": None, "approval": None}


def test_conversations_list_newest_first_by_seat_and_status_and_resume(copy):
    s = copy()
    run(s, *[conv(f"c{i}", seat="cto" if i % 2 else "ceo") for i in range(7)])
    run(s, new_run("r1", "c3", status="running"))
    page = q(s, "conversation.list", limit=3)
    assert [c["id"] for c in page["conversations"]] == ["c6", "c5", "c4"]
    page = q(s, "conversation.list", limit=3, before=page["next"])
    assert [c["id"] for c in page["conversations"]] == ["c3", "c2", "c1"]
    page = q(s, "conversation.list", limit=3, before=page["next"])
    assert [c["id"] for c in page["conversations"]] == ["c0"] and page["next"] is None
    assert [c["id"] for c in q(s, "conversation.list", seat="cto")["conversations"]] == ["c5", "c3", "c1"]
    assert [c["id"] for c in q(s, "conversation.list", status="running")["conversations"]] == ["c3"]
    idle_cto = q(s, "conversation.list", seat="cto", status="idle")["conversations"]
    assert [c["id"] for c in idle_cto] == ["c5", "c1"]


def test_a_seat_may_not_open_a_conversation_start_a_run_or_roll_one_back():
    for kind, args in [("conversation.create", {"id": "c1", "seat": "cto"}),
                       ("run.create", {"id": "r1", "conversation": "c1", "strategy": "reject",
                                       "on_disconnect": "continue", "revision": 1}),
                       ("conversation.rollback", {"conversation": "c1", "run": "r1"})]:
        with pytest.raises(OpError, match="not a seat's"):
            make_op(kind, args, node="n1", seat="cto", token=1)


def test_the_applier_refuses_a_seats_conversation_create_published_anyway(copy):
    s = copy()
    forged = {**conv().as_dict(), "seat": "cto", "token": 3}
    [(_, outcome)] = apply.apply_batch(s, [(1, msgpack.packb(forged, use_bin_type=True))])
    assert outcome["ok"] is False and "the API's, not a seat's" in outcome["error"]
    assert q(s, "conversation.get", id="c1")["conversation"] is None


# --------------------------------------------------------------------- runs

def test_a_run_is_queued_started_and_ended_and_the_conversation_follows(copy):
    s = copy()
    created, queued = run(s, conv(), new_run("r1"))
    assert queued["ok"] and queued["result"]["run"]["status"] == "queued"
    assert "input" not in queued["result"]["run"]  # kept once, in the row: run.get has it
    assert q(s, "run.get", id="r1")["run"]["input"] == "input of r1"
    assert q(s, "conversation.get", id="c1")["conversation"]["status"] == "idle"

    started = one(s, update("r1", "running", at=1001.0))
    r, c = started["result"]["run"], started["result"]["conversation"]
    assert (r["status"], r["node"], r["started_at"], r["started_seq"]) == ("running", "n1", 1001.0, 3)
    assert (c["status"], c["run"]) == ("running", "r1")

    # The driver died; another node picks the run up: its node changes, its start does not.
    picked = one(s, update("r1", "running", at=1050.0, node="ingress-b"))
    assert picked["ok"] and picked["result"]["run"]["node"] == "ingress-b"
    assert picked["result"]["run"]["started_at"] == 1001.0

    ended = one(s, update("r1", "completed", seat="cto", token=1, at=1060.0))
    assert ended["ok"] and ended["result"]["run"]["ended_at"] == 1060.0
    got = q(s, "conversation.get", id="c1")
    assert got["conversation"]["status"] == "idle" and got["run"]["status"] == "completed"
    assert got["run"]["updated_by"] == "cto"


def test_a_run_ends_once_the_same_end_again_is_answered_the_same_another_is_a_conflict(copy):
    s = copy()
    run(s, conv(), new_run("r1", status="running"))
    failed, again, other, back = run(s, update("r1", "failed", error="provider down"), update("r1", "failed"),
                                     update("r1", "completed"), update("r1", "running"))
    assert failed["ok"] and failed["result"]["conversation"]["status"] == "error"
    assert failed["result"]["run"]["error"] == "provider down"
    assert again["ok"] and again["result"]["already"] and again["result"]["run"]["status"] == "failed"
    for refused in (other, back):
        assert refused["code"] == "conflict" and refused["error"] == "run r1 has ended: failed"
    # An error is left by the next run.
    assert one(s, new_run("r2", status="running"))["result"]["conversation"]["status"] == "running"


def test_one_run_of_a_conversation_runs_at_a_time_and_others_never_contend(copy):
    s = copy()
    run(s, conv(), conv("c2"), new_run("r1", status="running"))
    busy = one(s, new_run("r2", status="running"))
    assert busy["ok"] is False and busy["code"] == "conversation_busy"
    assert busy["detail"] == {"run": "r1", "node": "ingress-a"}
    assert q(s, "run.get", id="r2")["run"] is None  # a refused op leaves no row
    # The same seat's other conversation is not held up.
    assert one(s, new_run("r3", "c2", status="running"))["ok"]
    # Queued, then started once the first ended (interrupt: the strategy's first step).
    queued, early, stop, start = run(s, new_run("r2"), update("r2", "running"), update("r1", "interrupted"),
                                     update("r2", "running"))
    assert queued["ok"] and early["code"] == "conversation_busy"
    assert stop["result"]["conversation"]["status"] == "idle"
    assert start["ok"] and start["result"]["conversation"]["run"] == "r2"


def test_queued_runs_list_in_the_order_they_were_queued_per_conversation_and_across(copy):
    s = copy()
    run(s, conv(), conv("c2"), new_run("r0", status="running"),
        *[new_run(f"q{i}", "c1" if i % 2 == 0 else "c2") for i in range(6)])
    queued = q(s, "run.list", conversation="c1", status="queued")
    assert [r["id"] for r in queued["runs"]] == ["q0", "q2", "q4"] and queued["next"] is None
    assert all("input" not in r for r in queued["runs"])  # lines: run.get has the input
    page = q(s, "run.list", status="queued", limit=4)
    assert [r["id"] for r in page["runs"]] == ["q0", "q1", "q2", "q3"]
    assert [r["id"] for r in q(s, "run.list", status="queued", after=page["next"])["runs"]] == ["q4", "q5"]
    # A queued run cancelled before it started: out of the queue, the conversation untouched.
    cancelled = one(s, update("q0", "interrupted"))
    assert cancelled["ok"] and cancelled["result"]["conversation"]["status"] == "running"
    assert [r["id"] for r in q(s, "run.list", conversation="c1", status="queued")["runs"]] == ["q2", "q4"]
    assert [r["id"] for r in q(s, "run.list", conversation="c1")["runs"]] == ["r0", "q0", "q2", "q4"]
    never = one(s, update("q2", "completed"))
    assert never["code"] == "conflict" and "has not started" in never["error"]


def test_a_run_resend_lands_once_and_a_run_id_reused_otherwise_is_a_conflict(copy):
    s = copy()
    run(s, conv(), new_run("r1"))
    again, other = run(s, new_run("r1"), new_run("r1", strategy="enqueue"))
    assert again["ok"] and again["result"]["already"]
    assert other["code"] == "conflict" and "exists" in other["error"]
    missing = one(s, new_run("r2", conversation="nope"))
    assert missing["code"] == "not_found" and missing["error"] == "no conversation nope"
    assert one(s, update("r9", "running"))["code"] == "not_found"


# ----------------------------------------------------------------- messages

def test_messages_keep_their_order_and_a_resend_lands_once(copy):
    s = copy()
    run(s, conv(), new_run("r1", status="running"))
    user = op("conversation.message", {"conversation": "c1", "id": "r1.0", "run": "r1", "role": "user",
                                       "text": "pay acme"})  # the driver writes the input
    call = msg("r1.1", "r1", text="", calls=[{"id": "call_1", "name": "wire_money", "args": {"amount": 1}}])
    result = msg("r1.2", "r1", role="tool", text="sent", call_id="call_1", name="wire_money")
    landed = run(s, user, call, result)
    assert all(o["ok"] for o in landed)
    assert landed[0]["result"]["message"]["by"] == "operator@n1" and "text" not in landed[0]["result"]["message"]
    # The turn redone: the same message under another op id lands once...
    again = one(s, op("conversation.message", result.args, seat="cto", token=1))
    assert again["ok"] and again["result"]["already"]
    # ...and another message under a used id is a conflict.
    clash = one(s, msg("r1.2", "r1", role="tool", text="other", call_id="call_1", name="wire_money"))
    assert clash["code"] == "conflict"
    got = q(s, "conversation.messages", conversation="c1")["messages"]
    assert [(m["id"], m["role"], m["text"]) for m in got] == [("r1.0", "user", "pay acme"), ("r1.1", "assistant", ""),
                                                               ("r1.2", "tool", "sent")]
    assert got[1]["calls"] == [{"id": "call_1", "name": "wire_money", "args": {"amount": 1}}]
    assert (got[2]["call_id"], got[2]["name"], got[2]["error"]) == ("call_1", "wire_money", False)


def test_a_late_message_of_an_interrupted_run_stays_with_its_run(copy):
    """Messages read run by run, in the order the runs ran: a tool result the
    interrupted run's turn wrote after the next run started comes before it."""
    s = copy()
    run(s, conv(), new_run("r1", status="running"), msg("a", "r1"), update("r1", "interrupted"),
        new_run("r2", status="running"), msg("b", "r2"), msg("late", "r1", role="tool", text="late result",
                                                              call_id="k", name="t"), msg("c", "r2"))
    assert [m["id"] for m in q(s, "conversation.messages", conversation="c1")["messages"]] == ["a", "late", "b", "c"]


def test_a_message_is_refused_for_an_unstarted_unknown_or_foreign_run_and_another_seat(copy):
    s = copy()
    run(s, conv(), conv("c2", seat="ceo"), new_run("q1"), new_run("r2", "c2", status="running"))
    unstarted, unknown, foreign, other_seat = run(
        s, msg("m1", "q1"), msg("m2", "r9"), msg("m3", "r2"),
        msg("m4", "r2", conversation="c2", seat="cto"))
    assert unstarted["code"] == "conflict" and unstarted["error"] == "run q1 has not started"
    assert unknown["code"] == foreign["code"] == "not_found"
    assert foreign["error"] == "no run r2 in conversation c1"
    assert other_seat["code"] == "forbidden" and other_seat["error"] == "seat cto cannot write seat ceo's conversation c2"
    assert one(s, msg("m5", "r2", conversation="c2", seat="ceo"))["ok"]


def test_a_stale_seat_token_is_refused_on_every_conversation_write(copy):
    s = copy()
    run(s, conv(), new_run("r1", status="running"), msg("m1", "r1", token=4))
    assert one(s, op("seat.fence", {}, seat="cto", token=9))["ok"]
    stale = run(s, msg("m2", "r1", token=4), update("r1", "completed", seat="cto", token=4),
                request("a1", "r1", token=4))
    for outcome in stale:
        assert outcome["ok"] is False and outcome["error"] == "stale fencing token 4 for seat cto: the seat is at 9"
    assert q(s, "run.get", id="r1")["run"]["status"] == "running"
    assert q(s, "approval.get", id="a1")["approval"] is None
    assert one(s, msg("m2", "r1", token=9))["ok"]  # the new owner's lands
    assert [m["id"] for m in q(s, "conversation.messages", conversation="c1")["messages"]] == ["m1", "m2"]


def test_a_run_writes_at_most_so_many_messages(copy, monkeypatch):
    monkeypatch.setattr(apply, "RUN_MESSAGES_MAX", 3)
    s = copy()
    run(s, conv(), new_run("r1", status="running"), *[msg(f"m{i}", "r1") for i in range(3)])
    over = one(s, msg("m3", "r1"))
    assert over["code"] == "conflict" and "3 messages, the most one run may" in over["error"]


def test_messages_page_forward_and_back_with_resume_points(copy):
    s = copy()
    run(s, conv(), new_run("r1", status="running"), *[msg(f"m{i}", "r1") for i in range(7)])

    def ids(page):
        return [m["id"] for m in page["messages"]]
    first = q(s, "conversation.messages", conversation="c1", limit=3)
    assert ids(first) == ["m0", "m1", "m2"] and first["before"] is None
    second = q(s, "conversation.messages", conversation="c1", limit=3, after=first["after"])
    assert ids(second) == ["m3", "m4", "m5"]
    last = q(s, "conversation.messages", conversation="c1", limit=3, after=second["after"])
    assert ids(last) == ["m6"] and last["after"] is None
    # Backwards from the newest, each page in order.
    newest = q(s, "conversation.messages", conversation="c1", limit=3, newest=True)
    assert ids(newest) == ["m4", "m5", "m6"] and newest["after"] is None
    older = q(s, "conversation.messages", conversation="c1", limit=3, before=newest["before"])
    assert ids(older) == ["m1", "m2", "m3"]
    oldest = q(s, "conversation.messages", conversation="c1", limit=3, before=older["before"])
    assert ids(oldest) == ["m0"] and oldest["before"] is None and oldest["after"] == oldest["messages"][0]["place"]
    assert q(s, "conversation.messages", conversation="nope") == {"messages": [], "after": None, "before": None}


def test_a_page_of_messages_stops_at_its_byte_bound_and_resumes(copy, monkeypatch):
    monkeypatch.setattr(store, "ANSWER_MAX_BYTES", 3000)
    s = copy()
    run(s, conv(), new_run("r1", status="running"), *[msg(f"m{i}", "r1", text="x" * 1000) for i in range(5)])
    seen, after = [], None
    while True:
        page = q(s, "conversation.messages", conversation="c1", **({"after": after} if after else {}))
        assert 1 <= len(page["messages"]) <= 2
        seen += [m["id"] for m in page["messages"]]
        after = page["after"]
        if after is None:
            break
    assert seen == [f"m{i}" for i in range(5)]


# ----------------------------------------------------------------- rollback

def test_a_rollback_removes_only_that_runs_messages_and_says_which_calls_ran(copy):
    s = copy()
    run(s, conv(), conv("c2"),
        new_run("r1", status="running"), msg("a1", "r1"), update("r1", "completed"),
        new_run("x1", "c2", status="running"), msg("x", "x1", conversation="c2"),
        new_run("r2", status="running"), msg("b1", "r2", calls=[{"id": "k1", "name": "send", "args": {}}]),
        msg("b2", "r2", role="tool", text="sent", call_id="k1", name="send"))
    early = one(s, op("conversation.rollback", {"conversation": "c1", "run": "r2"}))
    assert early["code"] == "conflict" and "must end" in early["error"]
    rolled = run(s, update("r2", "interrupted"), op("conversation.rollback", {"conversation": "c1", "run": "r2"}))[1]
    assert rolled["ok"] and rolled["result"]["removed"] == 2
    assert rolled["result"]["calls"] == [{"call_id": "k1", "name": "send", "error": False}]
    assert rolled["result"]["run"]["rolled_back"] is True
    assert texts(s) == ["text of a1"] and texts(s, "c2") == ["text of x"]
    # A late write of the rolled-back run finds nothing to add to; a second rollback nothing to remove.
    late, again = run(s, msg("b3", "r2"), op("conversation.rollback", {"conversation": "c1", "run": "r2"}))
    assert late["code"] == "conflict" and "rolled back" in late["error"]
    assert again["ok"] and again["result"]["already"] and again["result"]["removed"] == 0
    # The next run writes as ever.
    assert run(s, new_run("r3", status="running"), msg("c1", "r3"))[1]["ok"]
    assert texts(s) == ["text of a1", "text of c1"]
    with s.env.begin() as txn:  # the removed messages' ids went with them
        keys = [k for k, _ in txn.cursor(db=s.dbs["index"]) if k.startswith(b"msg\0id\0c1\0")]
    assert sorted(keys) == [store.join("msg", "id", "c1", i) for i in ("a1", "c1")]


# ---------------------------------------------------------------- approvals

def test_an_approval_request_ends_the_run_and_holds_the_conversation_until_decided(copy):
    s = copy()
    run(s, conv(), new_run("r1", status="running"))
    asked = one(s, request("a1", "r1", at=1010.0))
    assert asked["ok"]
    a = asked["result"]["approval"]
    assert (a["status"], a["tool"], a["call_id"], a["requested_at"], a["expires_at"]) == (
        "pending", "wire_money", "call_1", 1010.0, 2000.0)
    assert asked["result"]["run"]["status"] == "completed"
    got = q(s, "conversation.get", id="c1")
    assert got["conversation"]["status"] == "awaiting_approval" and got["approval"]["id"] == "a1"
    assert got["approval"]["args"] == {"to": "acme", "amount": 120}  # exactly as recorded
    # The turn ending the run too: answered the same; the conversation still waits.
    assert one(s, update("r1", "completed", seat="cto", token=1))["result"]["already"]
    # A new run waits for the decision; resuming needs one.
    blocked, premature = run(s, new_run("r2", status="running"), new_run("r3", approval="a1"))
    assert blocked["code"] == "pending_approval" and blocked["detail"] == {"approval": "a1"}
    assert premature["code"] == "pending_approval"
    # Decided: the resumption runs, and the conversation is running again.
    decided, resumed = run(s, decide("a1", "approve", by="ann", note="ok"),
                           new_run("r3", approval="a1", status="running"))
    assert decided["result"]["approval"]["by"] == "ann" and "args" not in decided["result"]["approval"]
    assert resumed["ok"] and resumed["result"]["conversation"]["status"] == "running"
    assert resumed["result"]["conversation"]["approval"] is None


def test_an_approval_is_asked_only_by_the_running_run_of_its_seats_conversation(copy):
    s = copy()
    run(s, conv(), new_run("q1"), new_run("r1", status="running"))
    not_running, wrong_seat, by_the_driver = run(
        s, request("a1", "q1"), op("approval.request", {**request("a2", "r1").args, "seat": "ceo"}),
        op("approval.request", {**request("a3", "r1").args}))
    assert not_running["code"] == "conflict" and "not conversation c1's running run" in not_running["error"]
    assert "is seat cto's, not seat ceo's" in wrong_seat["error"]
    assert by_the_driver["ok"]
    second = one(s, request("a4", "r1"))  # the run ended with the first
    assert second["code"] == "conflict"


def test_a_decision_is_idempotent_and_a_conflicting_one_is_refused_with_the_decision_that_stands(copy):
    s = copy()
    run(s, conv(), new_run("r1", status="running"), request("a1", "r1"))
    approve = decide("a1", "approve", by="ann")
    first, dup, again, deny = run(s, approve, approve, decide("a1", "approve", by="bob"),
                                  decide("a1", "deny", by="bob"))
    assert first["ok"] and dup == {**first, "duplicate": True}
    assert again["ok"] and again["result"]["already"] and again["result"]["approval"]["by"] == "ann"
    assert deny["ok"] is False and deny["code"] == "conflict"
    assert deny["error"] == "approval a1 was decided already: approve"
    assert deny["detail"] == {"approval": "a1", "decision": "approve", "by": "ann", "decided_at": 1000.0,
                              "expired": False}
    assert one(s, decide("a9", "deny"))["code"] == "not_found"


def test_expiry_is_a_denial_anyone_may_write_and_a_decision_after_it_is_a_conflict(copy):
    s = copy()
    run(s, conv(), new_run("r1", status="running"), request("a1", "r1", expires_at=1500.0),
        conv("c2"), new_run("r2", "c2", status="running"), request("a2", "r2", "c2", expires_at=1500.0))
    # A seat never decides: not before expiry, and never to approve.
    early, self_approve = run(s, decide("a1", "deny", note="expired", at=1499.0, seat="ceo", token=1),
                              decide("a1", "approve", at=1600.0, seat="cto", token=1))
    assert early["code"] == self_approve["code"] == "forbidden"
    late_approve = one(s, decide("a1", "approve", at=1500.0, by="ann"))
    assert late_approve["code"] == "conflict" and "expired at 1500.0: too late to approve" in late_approve["error"]
    expiry = one(s, decide("a1", "deny", note="expired", at=1600.0, seat="ceo", token=1))
    a = expiry["result"]["approval"]
    assert (a["decision"], a["note"], a["expired"], a["by"], a["decided_at"]) == ("deny", "expired", True, "ceo",
                                                                                 1600.0)
    # After the expiry: a denial is answered the same, an approval is a conflict.
    deny, approve = run(s, decide("a1", "deny", by="ann", at=1700.0), decide("a1", "approve", by="ann", at=1700.0))
    assert deny["ok"] and deny["result"]["already"]
    assert approve["code"] == "conflict" and approve["error"] == "approval a1 was decided already: deny (it expired)"
    # A person's denial past expires_at is the expiry.
    person = one(s, decide("a2", "deny", note="no", by="ann", at=1501.0))
    assert person["result"]["approval"]["note"] == "expired" and person["result"]["approval"]["expired"]


def test_approvals_list_pending_and_decided_in_order_and_resume(copy):
    s = copy()
    for i in range(5):
        run(s, conv(f"c{i}"), new_run(f"r{i}", f"c{i}", status="running"), request(f"a{i}", f"r{i}", f"c{i}"))
    run(s, decide("a1", "approve"), decide("a3", "deny"))
    pending = q(s, "approval.list", status="pending", limit=2)
    assert [a["id"] for a in pending["approvals"]] == ["a0", "a2"]
    rest = q(s, "approval.list", status="pending", limit=2, after=pending["next"])
    assert [a["id"] for a in rest["approvals"]] == ["a4"] and rest["next"] is None
    assert [a["id"] for a in q(s, "approval.list", status="decided")["approvals"]] == ["a1", "a3"]
    assert [a["id"] for a in q(s, "approval.list")["approvals"]] == ["a0", "a1", "a2", "a3", "a4"]
    assert [a["id"] for a in q(s, "approval.list", conversation="c3", status="decided")["approvals"]] == ["a3"]
    assert q(s, "approval.list", conversation="c3", status="pending")["approvals"] == []


# -------------------------------------------------------------- determinism

def test_two_copies_applying_a_conversation_log_in_other_batches_hold_the_same_bytes(copy):
    log = [conv(), new_run("r1", status="running"), msg("m1", "r1"), request("a1", "r1"),
           decide("a1", "approve"), new_run("r2", approval="a1", status="running"), msg("m2", "r2"),
           update("r2", "interrupted"), op("conversation.rollback", {"conversation": "c1", "run": "r2"}),
           new_run("r3"), update("r3", "running"), msg("m3", "r3"), update("r3", "completed")]
    a, b = copy("a"), copy("b")
    outcomes = run(a, *log)
    assert all(o["ok"] for o in outcomes), [o for o in outcomes if not o["ok"]]
    for o in log:
        run(b, o)
    assert store.digest(a) == store.digest(b)
    assert texts(a) == ["text of m1", "text of m3"]


# --------------------------------------------------------------- bad input

GOOD = {
    "conversation.create": {"id": "c1", "seat": "cto", "metadata": {"k": "v"}},
    "run.create": {"id": "r1", "conversation": "c1", "strategy": "reject", "on_disconnect": "continue",
                   "revision": 1},
    "run.update": {"id": "r1", "status": "running"},
    "conversation.message": {"conversation": "c1", "id": "m1", "run": "r1", "role": "user", "text": "hi"},
    "conversation.rollback": {"conversation": "c1", "run": "r1"},
    "approval.request": {"id": "a1", "conversation": "c1", "run": "r1", "seat": "cto", "tool": "t",
                         "args": {}, "expires_at": 2000.0},
    "approval.decide": {"id": "a1", "decision": "approve"},
}


@pytest.mark.parametrize("kind,change,why", [
    ("conversation.create", {"id": "has space"}, "id"),
    ("conversation.create", {"id": "x" * 101}, "id"),
    ("conversation.create", {"id": "-leading"}, "id"),
    ("conversation.create", {"seat": "Not A Seat"}, "seat"),
    ("conversation.create", {"metadata": {"big": "x" * (ops.METADATA_MAX_BYTES + 1)}}, "metadata is"),
    ("conversation.create", {"metadata": {f"k{i}": i for i in range(ops.METADATA_KEYS_MAX + 1)}}, "metadata"),
    ("conversation.create", {"metadata": {"n": math.nan}}, "not a finite number"),
    ("conversation.create", {"metadata": "text"}, "metadata"),
    ("conversation.create", {"extra": 1}, "must not contain"),
    ("run.create", {"strategy": "queue"}, "strategy"),
    ("run.create", {"on_disconnect": "drop"}, "on_disconnect"),
    ("run.create", {"revision": 0}, "revision"),
    ("run.create", {"revision": 1.5}, "revision"),
    ("run.create", {"status": "completed"}, "status"),
    ("run.create", {"input": "x" * (ops.MESSAGE_TEXT_MAX + 1)}, "input"),
    ("run.update", {"status": "queued"}, "status"),
    ("run.update", {"error": "e" * (ops.ERROR_MAX + 1)}, "error"),
    ("run.update", {"node": "a b"}, "node"),
    ("conversation.message", {"role": "system"}, "role"),
    ("conversation.message", {"text": "x" * (ops.MESSAGE_TEXT_MAX + 1)}, "text"),
    ("conversation.message", {"text": "\U0001f600" * 150_000, "role": "assistant"}, "bytes encoded"),
    ("conversation.message", {"calls": [{"id": "k", "name": "t", "args": {}}]}, "only an assistant's"),
    ("conversation.message", {"role": "tool"}, "names the call_id"),
    ("conversation.message", {"call_id": "k"}, "only a tool's message"),
    ("conversation.message", {"role": "assistant", "calls": [{"id": "k", "name": "t"}]}, "calls"),
    ("conversation.message", {"role": "assistant", "calls": [{"id": "k", "name": "t", "args": {}}] * 129},
     "calls"),
    ("approval.request", {"expires_at": math.nan}, "not a finite number"),
    ("approval.request", {"expires_at": math.inf}, "not a finite number"),
    ("approval.request", {"expires_at": 999.0}, "is not after the request"),
    ("approval.request", {"args": [1]}, "args"),
    ("approval.request", {"args": {"x": 2**60}}, "out of range"),
    ("approval.decide", {"decision": "maybe"}, "decision"),
    ("approval.decide", {"note": "n" * (ops.NOTE_MAX + 1)}, "note"),
])
def test_a_conversation_op_with_a_bad_field_is_refused_before_sending_and_by_the_applier(copy, kind, change, why):
    args = {**GOOD[kind], **change}
    with pytest.raises(OpError, match=why):
        make_op(kind, args, node="n1", at=1000.0)
    # Published anyway: every applier refuses it with the same reason, and the log goes on.
    raw = {**op(kind, GOOD[kind], id="bad-1").as_dict(), "args": args}
    s = copy()
    [(op_id, outcome)] = apply.apply_batch(s, [(1, msgpack.packb(raw, use_bin_type=True))])
    assert op_id == "bad-1" and outcome["ok"] is False and outcome["error"].startswith("bad op: ")
    assert s.applied() == 1


@pytest.mark.parametrize("name,args", [
    ("conversation.get", {"id": "a b"}),
    ("conversation.list", {"status": "busy"}),
    ("conversation.list", {"before": 0}),
    ("conversation.messages", {}),
    ("conversation.messages", {"conversation": "c1", "after": [1]}),
    ("conversation.messages", {"conversation": "c1", "after": [1, 2], "before": [1, 2]}),
    ("conversation.messages", {"conversation": "c1", "after": [1, 2], "newest": True}),
    ("conversation.messages", {"conversation": "c1", "after": [1, math.nan]}),
    ("run.list", {}),
    ("run.list", {"conversation": "c1", "status": "paused"}),
    ("approval.list", {"status": "expired"}),
    ("approval.list", {"limit": ops.LIST_MAX + 1}),
])
def test_a_conversation_query_with_bad_arguments_is_refused(name, args):
    with pytest.raises(OpError):
        ops.check_query(name, args)


def test_adding_the_conversation_kinds_moved_the_rules_on():
    """An applier of rules 3 refused these kinds as unknown: a copy it made
    lacks the rows, so it must be applied again (roles/data_applier/applier.py)."""
    assert apply.RULES >= 4
    assert {"conversation.create", "run.create", "run.update", "conversation.message", "conversation.rollback",
            "approval.request", "approval.decide"} <= set(ops.KINDS)
    assert all(ops.KINDS[k].retry == "move_on" for k in ops.KINDS if ops.KINDS[k].area == "conversations")
