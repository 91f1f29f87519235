"""Applying the log to a copy (crewlet.estate.apply, store): real LMDB in temp dirs."""

from __future__ import annotations

import random

import pytest

from crewlet.estate import apply, ops, store
from crewlet.estate.ops import OpError, make_op
from tests.estate import op, random_log


@pytest.fixture
def copy(tmp_path):
    def make(name: str = "a") -> store.Store:
        return store.open_env(str(tmp_path / name))
    made = []
    yield lambda name="a": made.append(make(name)) or made[-1]
    for s in made:
        store.close_env(s)


def run(s, *ops_, start=None):
    first = (s.applied() + 1) if start is None else start
    return [o for _, o in apply.apply_batch(s, [(first + i, o.encode()) for i, o in enumerate(ops_)])]


def q(s, name, **args):
    return store.Reader(s).query(name, args)


def test_a_task_is_created_updated_and_commented_with_ids_from_the_log(copy):
    s = copy()
    created, comment, updated = run(
        s, op("task.create", {"title": "ship it", "assignee": "cto", "labels": ["q4"]}, seat="ceo", token=3),
        op("task.comment", {"id": "T1", "body": "on it"}, seat="cto", token=1),
        op("task.update", {"id": "T1", "status": "done", "expect_rev": 1}))
    assert created["ok"] and created["result"]["task"]["id"] == "T1"
    assert comment["result"]["comment"]["id"] == "C2"
    task = updated["result"]["task"]
    assert (task["status"], task["rev"], task["updated_by"], task["created_by"]) == ("done", 2, "operator@n1", "ceo")
    got = q(s, "task.get", id="T1")
    assert got["task"] == task and [c["body"] for c in got["comments"]] == ["on it"]
    assert [t["id"] for t in q(s, "task.list", status="done")["tasks"]] == ["T1"]
    assert q(s, "task.list", status="open")["tasks"] == []
    assert [t["id"] for t in q(s, "task.list", assignee="cto")["tasks"]] == ["T1"]


def test_task_refusals_say_why_and_are_kept_as_the_outcome(copy):
    s = copy()
    run(s, op("task.create", {"title": "x"}))
    stale, missing, orphan = run(s, op("task.update", {"id": "T1", "title": "y", "expect_rev": 7}, id="u1"),
                                 op("task.comment", {"id": "T99", "body": "hi"}),
                                 op("task.create", {"title": "child", "parent": "T42"}))
    assert not stale["ok"] and stale["error"] == "task T1 is at rev 1, not 7"
    assert missing["error"] == "no task T99" and orphan["error"] == "no task T42 to be the parent"
    assert store.Reader(s).outcome("u1") == stale
    assert q(s, "task.get", id="T1")["task"]["title"] == "x"


def test_task_list_is_newest_first_and_pages_with_after(copy):
    s = copy()
    run(s, *[op("task.create", {"title": f"t{i}"}) for i in range(7)])
    first = [t["id"] for t in q(s, "task.list", limit=3)["tasks"]]
    assert first == ["T7", "T6", "T5"]
    assert [t["id"] for t in q(s, "task.list", limit=3, after="T5")["tasks"]] == ["T4", "T3", "T2"]
    assert [t["id"] for t in q(s, "task.list", after="T2")["tasks"]] == ["T1"]


def test_a_duplicated_op_id_lands_once_and_answers_the_first_outcome(copy):
    s = copy()
    again = op("task.create", {"title": "once"}, id="seat:trig.1.0")
    first, second = run(s, again, again)
    assert first["ok"] and second == {**first, "duplicate": True}
    assert len(q(s, "task.list")["tasks"]) == 1
    assert s.applied() == 2  # the duplicate is consumed, not stuck


def test_stale_fencing_tokens_are_refused_once_a_newer_owner_wrote(copy):
    s = copy()
    old = run(s, op("task.create", {"title": "by the old owner"}, seat="cto", token=4))[0]
    fence = run(s, op("seat.fence", {}, seat="cto", token=9))[0]
    zombie = run(s, op("task.create", {"title": "zombie"}, seat="cto", token=4))[0]
    current = run(s, op("task.create", {"title": "new owner"}, seat="cto", token=9))[0]
    assert old["ok"] and fence["ok"] and current["ok"]
    assert not zombie["ok"] and zombie["error"] == "stale fencing token 4 for seat cto: the seat is at 9"
    assert [t["title"] for t in q(s, "task.list")["tasks"]] == ["new owner", "by the old owner"]


def test_pages_are_versioned_deleted_and_indexed_by_seq(copy):
    s = copy()
    one, two, conflict = run(s, op("page.write", {"path": "eng/deploy", "title": "Deploy", "body": "v1"}),
                             op("page.write", {"path": "eng/deploy", "title": "Deploy", "body": "v2",
                                               "expect_version": 1}),
                             op("page.write", {"path": "eng/deploy", "title": "x", "body": "x",
                                               "expect_version": 1}))
    assert one["result"]["page"]["version"] == 1 and two["result"]["page"]["version"] == 2
    assert conflict["error"] == "page eng/deploy is at version 2, not 1"
    assert q(s, "page.read", path="eng/deploy")["page"]["body"] == "v2"
    assert [p["path"] for p in q(s, "page.list", prefix="eng/")["pages"]] == ["eng/deploy"]
    assert "body" not in q(s, "page.list")["pages"][0]
    deleted = run(s, op("page.delete", {"path": "eng/deploy"}))[0]
    assert deleted["ok"] and q(s, "page.read", path="eng/deploy")["page"] is None
    with s.env.begin() as txn:
        by_seq = [(store.key_seq(k), v) for k, v in txn.cursor(db=s.dbs["pages_by_seq"])]
    assert by_seq == [(1, b"eng/deploy"), (2, b"eng/deploy"), (4, b"eng/deploy")]


def test_the_diary_collapses_identical_text_and_a_seat_writes_only_its_own(copy):
    s = copy()
    a, b, c, other = run(s, op("diary.write", {"seat": "cto", "text": "ship friday"}, seat="cto", token=1),
                         op("diary.write", {"seat": "cto", "text": "ship friday"}, seat="cto", token=1),
                         op("diary.write", {"seat": "cto", "text": "ship monday"}, seat="cto", token=1),
                         op("diary.write", {"seat": "ceo", "text": "hi"}, seat="cto", token=1))
    assert b["result"]["collapsed"] and b["result"]["entry"] == a["result"]["entry"]
    assert [e["text"] for e in q(s, "diary.list", seat="cto")["entries"]] == ["ship friday", "ship monday"]
    assert other["error"] == "seat cto cannot write seat ceo's rows"


def test_files_turns_and_episodes(copy):
    s = copy()
    sha = "ab" * 32
    f1, f2, turn, ep = run(s, op("file.register", {"project": "p", "path": "a.txt", "size": 3, "sha256": sha}),
                           op("file.register", {"project": "p", "path": "a.txt", "size": 4, "sha256": sha}),
                           op("turn.record", {"record": {"seat": "cto", "trigger": "t1", "outcome": "ok"}},
                              seat="cto", token=2),
                           op("episode.add", {"seat": "cto", "summary": "did it"}, seat="cto", token=2))
    assert f2["result"]["file"]["id"] == f1["result"]["file"]["id"] == "F1"
    assert f2["result"]["file"]["version"] == 2
    assert q(s, "file.list", project="p")["files"] == [f2["result"]["file"]]
    assert [t["trigger"] for t in q(s, "turn.list", seat="cto")["turns"]] == ["t1"]
    assert q(s, "turn.list", seat="ceo")["turns"] == [] and len(q(s, "turn.list")["turns"]) == 1
    assert q(s, "episode.list", seat="cto")["episodes"][0]["summary"] == "did it"


def test_a_file_row_names_its_own_projects_bytes_only(copy):
    s = copy()
    sha = "ab" * 32
    mine, theirs, deleted, again = run(
        s, op("file.register", {"project": "p", "path": "a", "size": 1, "sha256": sha, "object": "files/p/" + "1" * 32}),
        op("file.register", {"project": "p", "path": "b", "size": 1, "sha256": sha, "object": "files/q/" + "2" * 32}),
        op("file.delete", {"project": "p", "path": "a"}),
        op("file.delete", {"project": "p", "path": "a"}))
    assert mine["ok"] and mine["result"]["file"]["object"] == "files/p/" + "1" * 32
    assert not theirs["ok"] and "is not one of project p's" in theirs["error"]
    assert deleted["ok"] and q(s, "file.get", project="p", path="a")["file"] is None
    assert not again["ok"] and "no file a" in again["error"]


def test_a_bad_entry_is_refused_with_its_reason_and_the_log_goes_on(copy):
    s = copy()
    bad, good = [o for _, o in apply.apply_batch(s, [(1, b"\x93not an op"), (2, op("task.create", {"title": "x"}).encode())])]
    assert not bad["ok"] and bad["error"].startswith("bad op:")
    assert good["ok"] and s.applied() == 2


def test_entries_at_or_below_applied_are_skipped(copy):
    s = copy()
    run(s, op("task.create", {"title": "x"}))
    assert apply.apply_batch(s, [(1, op("task.create", {"title": "again"}).encode())]) == []
    assert len(q(s, "task.list")["tasks"]) == 1


def test_two_copies_applying_the_same_log_in_different_batches_hold_the_same_bytes(copy):
    log = [o.encode() for o in random_log(7, 600)]
    a, b = copy("a"), copy("b")
    apply.apply_batch(a, list(enumerate(log, 1)))
    rnd = random.Random(8)
    seq = 1
    while seq <= len(log):
        n = rnd.randint(1, 40)
        # Overlapping batches too: what an applier killed before its commit re-reads.
        start = max(1, seq - rnd.randint(0, 3))
        apply.apply_batch(b, [(s, log[s - 1]) for s in range(start, min(seq + n, len(log) + 1))])
        seq += n
    assert a.applied() == b.applied() == len(log)
    assert store.digest(a) == store.digest(b)
    assert store.dump(a) == store.dump(b)
    # ...and the digest sees a difference.
    apply.apply_batch(b, [(len(log) + 1, op("task.create", {"title": "one more"}).encode())])
    assert store.digest(a) != store.digest(b)


def test_ops_and_queries_are_checked_with_the_field_and_the_reason():
    with pytest.raises(OpError, match="task.create: title"):
        op("task.create", {"title": ""})
    with pytest.raises(OpError, match="unknown op kind"):
        op("task.destroy", {})
    with pytest.raises(OpError, match="seat and its fencing token together"):
        make_op("task.create", {"title": "x"}, node="n", seat="cto")
    with pytest.raises(OpError, match="page.write: path"):
        op("page.write", {"path": "../etc", "title": "t", "body": ""})
    with pytest.raises(OpError, match="unknown query"):
        ops.check_query("task.delete", {})
    with pytest.raises(OpError, match="limit"):
        ops.check_query("task.list", {"limit": 0})
    assert ops.Op.decode(op("task.create", {"title": "x"}, id="i").encode()).id == "i"
    assert ops.KINDS["page.write"].retry == "once" and ops.KINDS["task.update"].retry == "move_on"


def test_a_reader_waits_for_the_writer_to_make_the_copy(tmp_path):
    with pytest.raises(store.StoreUnavailable):
        store.open_env(str(tmp_path / "none"), readonly=True)


def test_a_key_too_long_for_lmdb_refuses_the_op_and_leaves_nothing_half_written(copy):
    s = copy()
    path = "é" * 300  # 600 bytes: past LMDB's 511-byte keys
    long_file = op("file.register", {"project": "p", "path": path, "size": 1, "sha256": "ab" * 32})
    after = op("task.create", {"title": "the log goes on"})
    refused, ok = run(s, long_file, after)
    assert not refused["ok"] and refused["error"] == "file.register: a name or path is too long to keep"
    assert ok["ok"] and s.applied() == 2
    assert q(s, "file.list")["files"] == []


def test_an_op_that_fails_half_way_writes_none_of_its_rows(copy, monkeypatch):
    s = copy()

    def half(txn, dbs, op_, seq):  # a bug in an apply function, after a first write
        txn.put(b"T999", b"half", db=dbs["tasks"])
        raise RuntimeError("a bug half way")
    monkeypatch.setitem(apply.KIND_APPLY, "task.create", half)
    outcome = run(s, op("task.create", {"title": "x"}))[0]
    assert outcome["error"] == "internal error applying task.create: a bug half way"
    assert store.dump(s)["tasks"] == [] and s.applied() == 1


def test_a_new_owner_redoing_a_write_refused_for_its_predecessors_token_lands_it(copy):
    s = copy()
    run(s, op("seat.fence", {}, seat="cto", token=9, id="fence:cto:9"))
    stale = op("task.create", {"title": "redo me"}, seat="cto", token=5, id="cto:task.create:t1.0.0")
    redo = op("task.create", {"title": "redo me"}, seat="cto", token=9, id="cto:task.create:t1.0.0")
    assert stale.msg_id != redo.msg_id  # the broker must not drop the redo as the first's twin
    refused, again, landed, twice = run(s, stale, stale, redo, redo)
    assert refused["error"].startswith("stale fencing token 5") and again == {**refused, "duplicate": True}
    assert landed["ok"] and twice == {**landed, "duplicate": True}
    reader = store.Reader(s)
    assert reader.outcome(redo.id, 9) == landed and reader.outcome(stale.id, 5) == landed
    assert [t["title"] for t in q(s, "task.list")["tasks"]] == ["redo me"]


def test_task_list_by_status_and_assignee_matches_both_and_fills_the_limit(copy):
    s = copy()
    run(s, *[op("task.create", {"title": f"t{i}", "assignee": "cto" if i % 3 else "ceo"}) for i in range(12)])
    got = q(s, "task.list", status="open", assignee="ceo", limit=3)["tasks"]
    assert [t["id"] for t in got] == ["T10", "T7", "T4"]
    assert all("body" not in t for t in got)  # lists are lines; task.get has the body


def test_op_ids_are_printable_ascii_and_long_ones_are_named_by_a_digest():
    with pytest.raises(OpError, match="printable ASCII"):
        op("task.create", {"title": "x"}, id="😀" * 10)
    with pytest.raises(OpError, match="seat's name"):
        make_op("task.create", {"title": "x"}, node="n", seat="Not A Seat", token=1)
    long = ops.op_id("cto", "task.create", "t" * 300)
    assert len(long) <= ops.OP_ID_MAX and long.startswith("cto:")
    assert long == ops.op_id("cto", "task.create", "t" * 300)  # stable
    assert ops.op_id("cto", "task.create", "t1.0.0") == "cto:task.create:t1.0.0"


def test_listings_resume_past_where_a_page_ended(copy):
    """What the API's cursors carry: turn.list's before and since, page.list's
    and file.list's after."""
    s = copy()
    sha = "ab" * 32
    run(s, *[op("turn.record", {"record": {"seat": "cto", "trigger": f"t{i}", "outcome": "done",
                                           "started_at": 100.0 + i}}, seat="cto", token=1)
             for i in range(5)],
        *[op("page.write", {"path": f"eng/p{i}", "title": "t", "body": "b"}) for i in range(3)],
        op("page.write", {"path": "ops/x", "title": "t", "body": "b"}),
        *[op("file.register", {"project": p, "path": f"f{i}", "size": 1, "sha256": sha})
          for p in ("a", "b") for i in range(2)])
    newest = q(s, "turn.list", seat="cto", limit=2)["turns"]
    assert [t["trigger"] for t in newest] == ["t4", "t3"]
    older = q(s, "turn.list", seat="cto", limit=2, before=newest[-1]["seq"])["turns"]
    assert [t["trigger"] for t in older] == ["t2", "t1"]
    assert [t["trigger"] for t in q(s, "turn.list", before=older[-1]["seq"])["turns"]] == ["t0"]
    assert [t["trigger"] for t in q(s, "turn.list", seat="cto", since=102.0)["turns"]] == ["t4", "t3", "t2"]
    assert [p["path"] for p in q(s, "page.list", prefix="eng/", after="eng/p0")["pages"]] == ["eng/p1", "eng/p2"]
    assert [p["path"] for p in q(s, "page.list", after="eng/p2")["pages"]] == ["ops/x"]
    rest = q(s, "file.list", after={"project": "a", "path": "f1"})["files"]
    assert [(f["project"], f["path"]) for f in rest] == [("b", "f0"), ("b", "f1")]
    assert q(s, "file.list", project="a", after={"project": "a", "path": "f1"})["files"] == []


# ------------------------------------------------ bad input (issue 16)

@pytest.mark.parametrize("field,value", [
    ("at", float("nan")), ("at", float("inf")), ("at", -1.0), ("at", True), ("at", "1000"),
    ("token", 2**64), ("token", True), ("token", 1.5), ("node", ""), ("node", 7), ("node", "a b"),
    ("kind", ["task.create"]), ("id", {"x": 1}), ("seat", 3), ("args", [1]),
])
def test_an_op_with_a_bad_field_is_refused_before_sending_and_by_the_applier(copy, field, value):
    good = op("turn.record", {"record": {"a": 1}}, id="bad1", seat="cto", token=2).as_dict()
    with pytest.raises(OpError):
        ops.Op(**{**good, field: value}).check()
    s = copy()
    import msgpack
    try:
        data = msgpack.packb({**good, field: value}, use_bin_type=True)
    except (OverflowError, TypeError):
        return  # msgpack cannot carry it at all
    [(op_id, outcome)] = apply.apply_batch(s, [(1, data)])
    assert outcome["ok"] is False and outcome["error"].startswith("bad op: ")
    assert s.applied() == 1  # consumed: the log goes on
    assert q(s, "turn.list")["turns"] == []


@pytest.mark.parametrize("record", [
    {"x": float("nan")}, {"x": [1, {"y": float("-inf")}]}, {"x": 2**60}, {1: "int key"},
    {"x": "y" * (ops.FREE_STR_MAX + 1)}, {"k" * 300: 1},
    {"x": [[[[[[[[[["deep"]]]]]]]]]]}, {"x": b"bytes"}, {"x": list(range(ops.FREE_ITEMS_MAX + 1))},
    {f"k{i}": "v" * 100_000 for i in range(6)},  # over RECORD_MAX_BYTES
])
def test_a_turn_record_with_bad_values_or_too_deep_or_big_is_refused(record):
    with pytest.raises(OpError):
        make_op("turn.record", {"record": record}, node="n1", seat="cto", token=1)


@pytest.mark.parametrize("path", [
    "a//b", "eng/../../etc/passwd", "./a", "a/./b", "a/..", "/a", "a/", "..", ".", "A/b", "a/.hidden",
    "a" * 201, "", "a b", "a\\b",
])
def test_a_page_path_not_in_its_one_form_is_refused(path):
    with pytest.raises(OpError):
        make_op("page.write", {"path": path, "title": "t", "body": ""}, node="n1")
    with pytest.raises(OpError):
        ops.check_query("page.read", {"path": path})


@pytest.mark.parametrize("path", ["a", "eng/runbook", "a.b/c-d_e/f.md", "0/1/2", "a" * 200])
def test_a_page_path_in_its_one_form_is_taken(path):
    make_op("page.write", {"path": path, "title": "t", "body": ""}, node="n1")


def test_a_query_with_a_non_finite_number_is_refused():
    with pytest.raises(OpError):
        ops.check_query("turn.list", {"since": float("nan")})
    with pytest.raises(OpError):
        ops.check_query(["page.read"], {})


# ----------------------------------------------------------------- turn.trim

def _turn(seat, trigger, started_at=None, token=1):
    record = {"seat": seat, "trigger": trigger, "outcome": "done"}
    if started_at is not None:
        record["started_at"] = started_at
    return op("turn.record", {"record": record}, seat=seat, token=token)


def _index(s):
    return [k for k, _ in store.dump(s, ("index",))["index"] if k.startswith(b"turn\0seat\0")]


def test_turn_trim_removes_old_records_a_bounded_number_at_a_time(copy):
    """Records that started before the cutoff go, with their seat index
    entries, in log order, at most ``limit`` looked at per op; the outcome
    says how many and whether more remain; the next op goes on from
    ``after``. The walk stops at the first record young enough to keep."""
    s = copy()
    run(s, *[_turn("cto" if i % 2 else "ceo", f"t{i}", 100.0 + i) for i in range(8)])  # seqs 1-8
    first, = run(s, op("turn.trim", {"before": 105.0, "limit": 3}, id="trim:0"))
    # ``after`` is a place (a turn's seq): the log seq of its op x 1024 (store.turn_place).
    assert first["ok"] and first["result"] == {"removed": 3, "passed": 0, "after": store.turn_place(3),
                                               "more": True, "before": 105.0}
    second, = run(s, op("turn.trim", {"before": 105.0, "limit": 3, "after": store.turn_place(3)},
                        id="trim:1"))
    # t3 and t4 started before 105; t5 did not: the walk stops there.
    assert second["result"] == {"removed": 2, "passed": 0, "after": store.turn_place(5), "more": False,
                                "before": 105.0}
    kept = [t["trigger"] for t in q(s, "turn.list")["turns"]]
    assert kept == ["t7", "t6", "t5"]
    assert [t["trigger"] for t in q(s, "turn.list", seat="cto")["turns"]] == ["t7", "t5"]
    assert len(_index(s)) == 3  # the removed records' index entries went with them
    # Nothing left to remove: an op that removes nothing, and says so.
    third, = run(s, op("turn.trim", {"before": 105.0}))
    assert third["result"]["removed"] == 0 and not third["result"]["more"]


def test_turn_trim_passes_over_a_record_without_a_time_and_waits_behind_a_young_one(copy):
    """A record that names no start time is kept (nothing says its age) and
    passed over; an old record logged after a young one (a long turn that
    ended late) stays until the cutoff passes the young one too. Its ``at``
    stands in for a missing ``started_at``."""
    s = copy()
    run(s, _turn("cto", "timeless"),                                   # 1
        op("turn.record", {"record": {"seat": "cto", "trigger": "by-at", "at": 50.0}},
           seat="cto", token=1),                                       # 2
        _turn("cto", "young", 200.0),                                  # 3
        _turn("cto", "long", 90.0))                                    # 4: started early, logged late
    out, = run(s, op("turn.trim", {"before": 150.0}))
    assert out["result"] == {"removed": 1, "passed": 1, "after": store.turn_place(2), "more": False,
                             "before": 150.0}
    assert [t["trigger"] for t in q(s, "turn.list")["turns"]] == ["long", "young", "timeless"]
    out, = run(s, op("turn.trim", {"before": 250.0}))
    assert out["result"]["removed"] == 2
    assert [t["trigger"] for t in q(s, "turn.list")["turns"]] == ["timeless"]
    assert _index(s) == [store.join("turn", "seat", "cto", store.seq_key(store.turn_place(1)))]


def test_a_trim_sent_twice_lands_once_and_copies_agree(copy):
    """The duty's op id dedupes: the same trim resent is the first outcome,
    and removes nothing more; two copies applying the log hold the same bytes."""
    a, b = copy("a"), copy("b")
    log = [_turn("cto", f"t{i}", 100.0 + i) for i in range(5)]
    log += [op("turn.trim", {"before": 103.0, "limit": 2}, id="maintenance:turns:103:0"),
            _turn("cto", "late", 100.0),
            op("turn.trim", {"before": 103.0, "limit": 2}, id="maintenance:turns:103:0")]
    outcomes = run(a, *log)
    assert outcomes[-1]["duplicate"] and outcomes[-1]["result"] == outcomes[-3]["result"]
    assert [t["trigger"] for t in q(a, "turn.list")["turns"]] == ["late", "t4", "t3", "t2"]
    run(b, *log[:3])
    run(b, *log[3:])
    assert store.digest(a) == store.digest(b)


@pytest.mark.parametrize("args, seat, why", [
    ({"before": float("nan")}, None, "not a finite number"),
    ({"before": -1}, None, "before"),
    ({}, None, "before"),
    ({"before": 1.0, "limit": ops.TURN_TRIM_MAX + 1}, None, "limit"),
    ({"before": 1.0, "limit": 0}, None, "limit"),
    ({"before": 1.0, "after": -1}, None, "after"),
    ({"before": 1.0, "seat": "cto"}, None, "must not contain"),
    ({"before": 1.0}, "cto", "maintenance duty's, not a seat's"),
])
def test_turn_trim_checks_its_arguments_and_is_no_seats(args, seat, why):
    with pytest.raises(OpError, match=why):
        make_op("turn.trim", args, node="n1", seat=seat, token=1 if seat else None)


# -------------------------------------------------------------- turn.records

def _records(*entries, id=None, node="n1"):
    """A turn.records op of (seat, token, trigger, which) entries."""
    return op("turn.records", {"records": [
        {"id": ops.op_id(seat, "turn", trigger, which), "seat": seat, "token": token,
         "record": {"seat": seat, "trigger": trigger, "outcome": "done" if which == "done" else "failed",
                    "started_at": 100.0}}
        for seat, token, trigger, which in entries]}, id=id, node=node)


def test_one_op_carries_many_turns_records_each_landing_once_at_its_own_place(copy):
    """Each record of a turn.records op is its own row at its own place
    (seq x 1024 + position), indexed under its seat, with its trigger's
    episode; its outcome is kept under its own id, so the same record sent
    again — in another op, or alone as a turn.record — lands once."""
    s = copy()
    out, = run(s, _records(("cto", 1, "t1", "done"), ("ceo", 1, "t2", "done"), ("cto", 1, "t3", "1")))
    assert out["ok"] and out["result"] == {"turns": 3, "again": 0, "refused": 0}
    turns = q(s, "turn.list")["turns"]
    assert [(t["trigger"], t["seq"]) for t in turns] == [
        ("t3", store.turn_place(1, 2)), ("t2", store.turn_place(1, 1)), ("t1", store.turn_place(1, 0))]
    assert [t["trigger"] for t in q(s, "turn.list", seat="cto")["turns"]] == ["t3", "t1"]
    # Paging by seq (the API's cursor) walks the records of one op one by one.
    assert [t["trigger"] for t in q(s, "turn.list", before=store.turn_place(1, 1))["turns"]] == ["t1"]
    assert q(s, "op.outcome", id=ops.op_id("ceo", "turn", "t2", "done"))["outcome"]["ok"]
    episodes = q(s, "episode.list", seat="cto", counterparty="operator")["episodes"]
    assert sorted(e["trigger"] for e in episodes) == ["t1", "t3"]
    # t1 again (a redone turn's done record) beside a new one; then t2 alone, as an older node sends it.
    again, = run(s, _records(("cto", 1, "t1", "done"), ("cto", 1, "t4", "done")))
    assert again["result"] == {"turns": 1, "again": 1, "refused": 0}
    alone, = run(s, op("turn.record", {"record": {"seat": "ceo", "trigger": "t2", "outcome": "done"}},
                       seat="ceo", token=1, id=ops.op_id("ceo", "turn", "t2", "done")))
    assert alone["duplicate"]
    assert sorted(t["trigger"] for t in q(s, "turn.list")["turns"]) == ["t1", "t2", "t3", "t4"]


def test_a_records_op_sent_twice_lands_once_and_a_stale_record_is_refused_alone(copy):
    """The op's own id dedupes it whole; inside it, a record under a token
    below its seat's fence is refused (kept under its id and token) while
    the others land; the seat's next owner redoing it lands."""
    s = copy()
    run(s, op("seat.fence", {}, seat="cto", token=5))
    batch = _records(("cto", 4, "old", "done"), ("ceo", 1, "fine", "done"), id="turns:1")
    first, second = run(s, batch, batch)
    assert first["result"] == {"turns": 1, "again": 0, "refused": 1}
    assert second["duplicate"] and second["result"] == first["result"]
    assert [t["trigger"] for t in q(s, "turn.list")["turns"]] == ["fine"]
    redo, = run(s, _records(("cto", 5, "old", "done")))
    assert redo["result"] == {"turns": 1, "again": 0, "refused": 0}
    assert sorted(t["trigger"] for t in q(s, "turn.list")["turns"]) == ["fine", "old"]


def test_a_records_op_raises_fences_only_with_the_fleets_verdicts(copy):
    """A record whose token would raise its seat's fence needs the verdict on
    it like any seat's op (apply.raising names it): ungranted, the record is
    refused and the fence stays; without the verdict the batch is not applied."""
    s = copy()
    batch = _records(("cto", 7, "t1", "done"), ("ceo", 2, "t2", "done"))
    entries = [(1, batch.encode(), "estate.ops.seats.n1")]
    assert apply.raising(s, entries) == {("cto", 7, "n1"), ("ceo", 2, "n1")}
    with pytest.raises(apply.Unjudged):
        apply.apply_batch(s, entries, grants={("cto", 7, "n1"): None})
    (_, out), = apply.apply_batch(s, entries, grants={("cto", 7, "n1"): None,
                                                      ("ceo", 2, "n1"): "not a lease of ceo"})
    assert out["result"] == {"turns": 1, "again": 0, "refused": 1}
    assert [t["trigger"] for t in q(s, "turn.list")["turns"]] == ["t1"]


def test_a_records_op_is_the_seats_of_its_own_node_and_checked_whole(copy):
    """On the seats' subject a records op must name the subject's node; a bad
    record refuses the op before it is sent, and on every copy."""
    s = copy()
    other = _records(("cto", 1, "t1", "done"), node="n2")
    (_, out), = apply.apply_batch(s, [(1, other.encode(), "estate.ops.seats.n1")])
    assert out["code"] == apply.WRONG_ORIGIN and q(s, "turn.list")["turns"] == []
    with pytest.raises(OpError):
        _records(("cto", 0, "t1", "done"))                      # a token is >= 1
    with pytest.raises(OpError):
        op("turn.records", {"records": []})                     # at least one
    with pytest.raises(OpError):
        op("turn.records", {"records": [{"id": "x", "seat": "cto", "token": 1, "record": {}}]},
           seat="cto", token=1)                                 # the node's, not a seat's
    bad = ops.Op(id="turns:bad", kind="turn.records", node="n1", seat=None, token=None, at=1.0,
                 args={"records": [{"id": "x y", "seat": "cto", "token": 1, "record": {}}]})
    out, = run(s, bad)
    assert not out["ok"] and "bad op" in out["error"] and q(s, "turn.list")["turns"] == []


def test_a_records_op_with_a_token_that_is_not_an_integer_is_refused_and_the_log_goes_on(copy):
    """A record's token is an integer, as an op's own: 5.0 (which the
    schema's "integer" takes) is refused before sending and on every copy,
    never left waiting for a verdict that apply.raising does not ask for
    (which held the copy at that entry for good)."""
    s = copy()
    with pytest.raises(OpError, match=r"records\[0\]\.token must be an integer"):
        op("turn.records", {"records": [{"id": "x1", "seat": "cto", "token": 5.0, "record": {}}]})
    bad = ops.Op(id="turns:float", kind="turn.records", node="n1", seat=None, token=None, at=1.0,
                 args={"records": [{"id": "x1", "seat": "cto", "token": 5.0, "record": {}}]})
    entries = [(1, bad.encode(), "estate.ops.seats.n1"),
               (2, _records(("cto", 5, "t1", "done")).encode(), "estate.ops.seats.n1")]
    verdicts = {f: None for f in apply.raising(s, entries)}
    (_, refused), (_, landed) = apply.apply_batch(s, entries, grants=verdicts)
    assert not refused["ok"] and "token must be an integer" in refused["error"]
    assert landed["result"] == {"turns": 1, "again": 0, "refused": 0} and s.applied() == 2


# -------------------------------------------------------------- the op check's fast path

class _Key(str):
    """A str subclass: plain to the rule, not to the fast path's exact types."""


@pytest.mark.parametrize("args", [
    {"title": "plain", "labels": ["a", "b"], "n": 3, "x": 1.5, "flag": True, "none": None},
    {"deep": [[[[[[[[["too deep"]]]]]]]]]},
    {"deep": [[[[[[["just"]]]]]]]},
    {"n": ops.INT_MAX + 1}, {"n": -ops.INT_MAX - 1}, {"n": ops.INT_MAX},
    {"x": float("nan")}, {"x": float("inf")}, {"x": -0.0},
    {"s": "x" * (ops.FREE_STR_MAX + 1)}, {"s": "x" * ops.FREE_STR_MAX},
    {"k" * (ops.FREE_KEY_MAX + 1): 1}, {1: "int key"}, {_Key("sub"): "str subclass key"},
    {"b": b"bytes"}, {"t": (1, 2)}, {"set": {1, 2}},
    {"many": list(range(ops.FREE_ITEMS_MAX + 1))}, {"many": list(range(ops.FREE_ITEMS_MAX))},
])
def test_the_op_checks_fast_path_agrees_with_the_rule(args):
    """Every applier checks every op's arguments by a fast path that names no
    field; it must pass exactly what the full rule passes, and where it
    refuses, the rule (which says where and why) decides."""
    depth = ops.FREE_DEPTH + 1
    fast, rule = ops._is_plain(args, depth), ops._plain(args, "args", depth)
    assert not (fast and rule), (fast, rule)          # never passes what the rule refuses
    if rule is None and not isinstance(next(iter(args)), _Key):
        assert fast                                    # exact types: the same verdict


def test_a_value_the_fast_path_refuses_is_refused_naming_where():
    record = {"seat": "cto", "trigger": "t", "steps": [{"took": 1.0}, {"took": float("nan")}]}
    with pytest.raises(OpError, match=r"turn\.record: args\.record\.steps\[1\]\.took: nan is not a finite"):
        ops.Op.from_dict({"id": "x1", "kind": "turn.record", "args": {"record": record},
                          "seat": "cto", "token": 1, "node": "n1", "at": 1.0})


def test_a_decoded_op_is_the_op_it_was_and_stays_frozen():
    made = make_op("task.create", {"title": "t", "labels": ["x"]}, node="n1", seat="cto", token=2)
    again = ops.Op.decode(made.encode())
    assert again == made and again.encode() == made.encode()
    with pytest.raises(AttributeError):
        again.kind = "task.update"  # type: ignore[misc]


def test_rows_and_outcomes_pack_to_the_same_bytes_from_any_thread():
    """The copies' bytes must not depend on the packer: store.pack reuses one
    per thread, and must give what msgpack.packb gives, an error included."""
    import threading

    import msgpack
    values = [{"ok": True, "seq": 7, "result": {"task": {"id": "T7", "labels": ["a"], "at": 1.5}}},
              {"path": "kb/é", "body": "x" * 70_000, "blob": b"\x00\x01"}, [], None, 2**53]
    got: list = []

    def pack_all():
        got.append([store.pack(v) for v in values])

    threads = [threading.Thread(target=pack_all) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with pytest.raises(TypeError):
        store.pack({"bad": object()})
    want = [msgpack.packb(v, use_bin_type=True) for v in values]
    assert got == [want] * 4 and [store.pack(v) for v in values] == want
