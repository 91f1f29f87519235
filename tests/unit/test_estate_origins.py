"""Who may write what to the estate (crewlet/estate/origins.py): the table held
against the code both ways, and what apply and the request check do with it.

Static half: the code of each role (below, :data:`CODE`) is read with
:mod:`ast`, not imported; every string constant that names an op kind is a
kind that role writes. (a) every kind a role's code names is in its row —
a role that starts writing a new kind must be given it, or every applier
refuses it; (b) every kind in a row is named in that role's code — a row
granting a kind nobody writes is a right nobody needs. And no other code
names a kind (a writer the table does not know).

The rest: real LMDB in temp dirs, as tests/unit/test_estate_apply.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from crewlet.estate import apply, origins, store, wire
from crewlet.estate import log as estate_log
from crewlet.estate.ops import KINDS, make_op

ROOT = Path(__file__).resolve().parents[2]

# The code each role's process runs that writes to the estate.
CODE = {
    "seats": ("roles/seats", "crewlet/agent", "crewlet/conversations/turn.py"),
    "ingress": ("roles/ingress", "crewlet/conversations/driver.py"),
    "workers": ("roles/workers",),
    "data_applier": ("roles/data_applier",),
}
# Code that names kinds without writing them: the estate itself (the kinds,
# apply, the table), a check of a file row's shape, crewletctl's rendering.
NOT_WRITERS = ("crewlet/estate", "crewlet/objects/files.py", "crewlet/ctl")


def _files(path: str) -> list[Path]:
    p = ROOT / path
    return [p] if p.is_file() else sorted(p.rglob("*.py"))


def _kinds_named(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in KINDS}


def _written(role: str) -> set[str]:
    return set().union(*(_kinds_named(f) for path in CODE[role] for f in _files(path)))


def _allowed(role: str) -> set[str]:
    return set(origins.LOG_KINDS.get(role, ())) | set(origins.ASKS.get(role, ()))


@pytest.mark.parametrize("role", sorted(CODE))
def test_the_table_is_what_each_role_s_code_writes(role):
    written = _written(role)
    assert written - _allowed(role) == set(), \
        f"{role}'s code writes kinds its row in crewlet/estate/origins.py does not give it"
    assert _allowed(role) - written == set(), f"{role}'s row gives kinds its code never writes"


def test_the_seats_publish_on_their_subject_their_fence_turn_records_and_own_writes():
    direct = set().union(*(_kinds_named(f) for f in _files("roles/seats")))
    assert direct == {"seat.fence", "turn.record", "turn.records"}
    # Their subject takes those and every write they ask for (straight on a
    # data node whose copy serves: crewlet.estate.router, Router.write) ...
    assert set(origins.LOG_KINDS["seats"]) == direct | origins.ASKS["seats"]
    assert origins.ASKS["seats"] == origins.SEAT_WRITES
    # ... and may ask an applier for them all (the way while an older applier
    # cannot read their subject): no kind besides.
    assert origins.may_ask("seats") == origins.ASKS["seats"] | origins.LOG_KINDS["seats"]
    for origin in ("ingress", "workers", "data_applier"):
        assert origins.may_ask(origin) == origins.ASKS[origin], origin


def test_no_other_code_names_a_kind():
    mapped = {f for paths in CODE.values() for path in paths for f in _files(path)}
    skipped = {f for path in NOT_WRITERS for f in _files(path)}
    stray = {str(f.relative_to(ROOT)): sorted(_kinds_named(f))
             for top in ("crewlet", "roles") for f in sorted((ROOT / top).rglob("*.py"))
             if f not in mapped and f not in skipped and _kinds_named(f)}
    assert stray == {}, "code that writes ops but is in no role's row of CODE (and the table)"


# ------------------------------------------------------------------ subjects

def test_the_subjects_name_the_origin_and_the_node():
    assert estate_log.seats_subject("n1") == "estate.ops.seats.n1"
    assert estate_log.origin_of("estate.ops") == ("crewlet", None)
    assert estate_log.origin_of("estate.ops.seats.n1") == ("seats", "n1")
    assert estate_log.origin_of("estate.ops.ingress.n1") is None
    assert estate_log.origin_of("estate.ops.seats.") is None
    assert wire.subject("d1", "seats", "n1") == "estate.req.d1.seats.n1"
    assert wire.subject("d1") == "estate.req.d1"
    assert wire.parse_subject("d1", "estate.req.d1.seats.n1") == ("seats", "n1")
    assert wire.parse_subject("d1", "estate.req.d1") == (wire.LEGACY, None)
    for bad in ("estate.req.d1.nobody.n1", "estate.req.d1.seats", "estate.req.d1.seats.n1.x",
                "estate.req.d2.seats.n1"):
        assert wire.parse_subject("d1", bad) is None, bad


def test_only_an_applier_of_protocol_2_or_later_reads_the_seats_subject():
    assert estate_log.SEATS_READ_SINCE == 2
    assert estate_log.reads_seats(2) and estate_log.reads_seats(3)
    # protocol 1, a presence that says none (older still), or nonsense: no.
    for protocol in (1, 0, None, True, "2", 2.0, [2]):
        assert not estate_log.reads_seats(protocol), protocol


def test_the_origin_is_the_broker_user_the_connection_is():
    class Conn:
        def __init__(self, user):
            self.options = {"user": user}
    assert origins.of_connection(Conn("seats")) == "seats"
    assert origins.of_connection(Conn("crewlet")) == "crewlet"
    assert origins.of_connection(Conn(None)) == "crewlet"      # no user of ours
    assert origins.of_connection(Conn("someone")) == "crewlet"  # an external broker's
    assert origins.of_connection(None) == "crewlet"


# ------------------------------------------------------------------ requests

def _op(kind, args, *, node="n1", seat=None, token=None):
    return make_op(kind, args, node=node, seat=seat, token=token, at=1000.0)


def test_a_request_is_refused_a_kind_its_origin_never_writes():
    trim = _op("turn.trim", {"before": 1.0})
    assert origins.request_refusal("workers", "n1", trim) is None
    assert origins.request_refusal("crewlet", None, trim) is None
    assert origins.request_refusal(origins.LEGACY, None, trim) is None
    why = origins.request_refusal("seats", "n1", _op("turn.trim", {"before": 1.0}))
    assert why.startswith("seats may not write turn.trim")
    assert "ingress may not write turn.trim" in origins.request_refusal("ingress", "n1", trim)
    assert origins.request_refusal("data_applier", "n1", trim) is not None
    # An origin that is no role's never gets here (the subject names one of
    # ORIGINS): a caller's bug, said loudly rather than judged.
    with pytest.raises(KeyError):
        origins.request_refusal("nobody", "n1", trim)


def test_a_seat_s_request_is_a_seat_s_and_the_operator_s_no_seat_s_of_its_own_node():
    page = {"path": "a", "title": "A", "body": ""}
    assert origins.request_refusal("seats", "n1", _op("page.write", page, seat="s", token=3)) is None
    assert "carries its seat" in origins.request_refusal("seats", "n1", _op("page.write", page))
    assert origins.request_refusal("ingress", "n1", _op("page.write", page)) is None
    assert "writes as no seat" in origins.request_refusal("ingress", "n1",
                                                          _op("page.write", page, seat="s", token=3))
    assert "names node 'n2'" in origins.request_refusal("seats", "n1",
                                                         _op("page.write", page, node="n2", seat="s", token=3))


def test_the_seats_may_ask_for_their_log_kinds_held_as_on_their_subject():
    fence, record = _op("seat.fence", {}, seat="s", token=3), \
        _op("turn.record", {"record": {"x": 1}}, seat="s", token=3)
    for op in (fence, record):
        assert origins.request_refusal("seats", "n1", op) is None, op.kind
        assert origins.log_refusal("seats", "n1", op) is None, op.kind
    # What the subject refuses, the request refuses too: no seat, another node.
    unseated = _op("turn.record", {"record": {"x": 1}})
    assert "carries its seat" in origins.request_refusal("seats", "n1", unseated)
    assert "carries its seat" in origins.log_refusal("seats", "n1", unseated)
    other = _op("seat.fence", {}, node="n2", seat="s", token=3)
    assert "names node 'n2'" in origins.request_refusal("seats", "n1", other)
    assert "names node 'n2'" in origins.log_refusal("seats", "n1", other)
    # Nobody else asks for them.
    for origin in ("ingress", "workers", "data_applier"):
        assert f"{origin} may not write seat.fence" in origins.request_refusal(origin, "n1", fence)


# ------------------------------------------------------------------ the log

@pytest.fixture
def copy(tmp_path):
    s = store.open_env(str(tmp_path / "estate"))
    yield s
    store.close_env(s)


def test_an_entry_its_origin_may_not_publish_is_passed_over_and_kept_nowhere(copy):
    seats = "estate.ops.seats.n1"
    forged = _op("file.delete", {"project": "p", "path": "f"}, seat="s", token=1)  # no seat's kind
    operator_kind = _op("task.create", {"title": "forged"})
    other_node = _op("turn.record", {"record": {"x": 1}}, node="n2", seat="s", token=1)
    unseated = _op("turn.record", {"record": {"x": 1}})
    fence = _op("seat.fence", {}, seat="s", token=5)
    record = _op("turn.record", {"record": {"x": 1}}, seat="s", token=5)
    entries = [(1, forged.encode(), seats), (2, operator_kind.encode(), seats),
               (3, other_node.encode(), seats), (4, unseated.encode(), seats),
               (5, b"\x93not an op", seats), (6, fence.encode(), seats),
               (7, record.encode(), seats), (8, _op("task.create", {"title": "x"}).encode(), "estate.ops.x"),
               (9, _op("task.create", {"title": "ok"}).encode(), "estate.ops")]
    # Only the fence that may be applied asks for a verdict.
    assert apply.raising(copy, entries) == {("s", 5, "n1")}
    out = apply.apply_batch(copy, entries)
    refused = [seq for (op_id, o), seq in zip(out, range(1, 10)) if o.get("code") == apply.WRONG_ORIGIN]
    assert refused == [1, 2, 3, 4, 5, 8]
    assert all(op_id is None for op_id, o in out if o.get("code") == apply.WRONG_ORIGIN)
    assert [o["ok"] for _, o in out[5:7]] + [out[8][1]["ok"]] == [True, True, True]
    assert "file.delete may not be published by seats" in out[0][1]["error"]
    assert "a seats op is a seat's" in out[1][1]["error"]
    assert copy.applied() == 9
    reader = store.Reader(copy)
    # Nothing of the refused entries: no task T2, no outcome under their ids.
    assert [t["title"] for t in reader.query("task.list", {})["tasks"]] == ["ok"]
    for op in (forged, operator_kind, other_node, unseated):
        assert reader.outcome(op.id, op.token) is None, op.kind
    # The same op on the applier's own subject (it checked it) is applied:
    # the refusal took no id.
    again = apply.apply_batch(copy, [(10, operator_kind.encode(), "estate.ops")])
    assert again[0] == (operator_kind.id, {"ok": True, "seq": 10, "result": again[0][1]["result"]})
    # A seat's own write, under its fence, is applied from the seats' subject.
    page = _op("page.write", {"path": "p", "title": "T", "body": "mine"}, seat="s", token=5)
    [(page_id, outcome)] = apply.apply_batch(copy, [(11, page.encode(), seats)])
    assert page_id == page.id and outcome["ok"] is True, outcome
    assert reader.query("page.read", {"path": "p"})["page"]["body"] == "mine"
    assert reader.outcome(page.id, page.token) == outcome


def test_two_copies_pass_over_the_same_entries(tmp_path):
    forged = _op("file.delete", {"project": "p", "path": "f"}, seat="s", token=1)
    record = _op("turn.record", {"record": {"n": 1}}, seat="s", token=1)
    task = _op("task.create", {"title": "b"})
    entries = [(1, forged.encode(), "estate.ops.seats.n1"), (2, record.encode(), "estate.ops.seats.n1"),
               (3, task.encode(), "estate.ops")]
    copies = [store.open_env(str(tmp_path / name)) for name in ("a", "b")]
    try:
        whole = apply.apply_batch(copies[0], entries)
        single = [o for e in entries for o in apply.apply_batch(copies[1], [e])]  # one at a time
        for outcomes in (whole, single):
            # The forged entry was passed over, on both copies alike; the others applied.
            assert [(op_id, o.get("code"), o["ok"]) for op_id, o in outcomes] == \
                [(None, apply.WRONG_ORIGIN, False), (record.id, None, True), (task.id, None, True)]
            assert "file.delete may not be published by seats" in outcomes[0][1]["error"]
        dumps = []
        for c in copies:
            assert c.applied() == 3
            assert store.Reader(c).outcome(forged.id, forged.token) is None
            assert [t["title"] for t in store.Reader(c).query("task.list", {})["tasks"]] == ["b"]
            with c.env.begin() as txn:
                dumps.append({name: list(txn.cursor(db=db)) for name, db in sorted(c.dbs.items())
                              if name != "local"})
        assert dumps[0] == dumps[1]
    finally:
        for c in copies:
            store.close_env(c)


def _doc_rows() -> dict[str, set[str]]:
    """The kinds each row of origins.py's docstring table names."""
    import re
    lines = origins.__doc__.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("=====")]
    rows: dict[str, str] = {}
    current = None
    for line in lines[rules[1] + 1:rules[2]]:
        if line and not line[0].isspace():
            current = line.split()[0].strip("`")
            rows[current] = line
        elif current is not None:
            rows[current] += " " + line
    return {origin: set(re.findall(r"``([a-z]+\.[a-z]+)``", text)) & set(KINDS)
            for origin, text in rows.items()}


def test_the_docstring_table_says_what_the_table_holds():
    rows = _doc_rows()
    assert set(rows) == set(origins.ORIGINS)
    for origin in ("seats", "ingress", "workers"):
        assert rows[origin] == _allowed(origin), origin
    assert rows["crewlet"] == rows["data_applier"] == set()   # every kind / none, in words
