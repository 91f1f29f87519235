"""Random op records fed to the applier (issue 16): whatever the log holds —
random fields, NaN, infinities, huge numbers, wrong types, deep nesting, bad
page paths, bytes that are no op at all — ``apply_batch`` never raises,
every copy fed the same log ends with the same digest however the log is cut
into batches, and every reader query still answers afterwards.

Real LMDB in temp dirs, as tests/unit/test_estate_apply.py. Bounded: a few
seconds of examples.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crewlet.estate import apply, ops, store
from tests.estate import random_ops

EXAMPLES = 60

_numbers = st.one_of(
    st.integers(min_value=-2**63, max_value=2**64 - 1), st.just(2**53), st.just(-1), st.just(0),
    st.floats(allow_nan=True, allow_infinity=True), st.just(math.nan), st.just(math.inf),
    st.just(-math.inf), st.just(1e308), st.booleans())
_leaves = st.one_of(st.none(), _numbers, st.text(max_size=30), st.binary(max_size=10))


def _nested(depth: int):
    return st.recursive(_leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
        max_leaves=depth)


def _deep(n: int):
    value: object = "bottom"
    for _ in range(n):
        value = {"d": [value]}
    return value


_paths = st.one_of(st.sampled_from(["a", "a//b", "eng/../../etc/passwd", "/a", "a/", ".", "..", "A",
                                    "eng/runbook", "a/./b", "x" * 300, ""]),
                   st.from_regex(ops.PAGE_PATH, fullmatch=True).filter(lambda p: len(p) <= 200),
                   st.text(max_size=20))
_anything = st.one_of(_leaves, _nested(12), st.builds(_deep, st.integers(1, 30)))
_kinds = st.one_of(st.sampled_from(list(ops.KINDS)), st.text(max_size=12), _numbers)
_seats = st.one_of(st.none(), st.sampled_from(["cto", "ceo"]), st.text(max_size=8), _numbers)
_tokens = st.one_of(st.none(), st.integers(1, 6), _numbers)


@st.composite
def _args(draw, kind):
    pool = {
        "title": st.one_of(st.text(max_size=20), _anything), "body": st.one_of(st.text(max_size=50), _anything),
        "id": st.one_of(st.sampled_from(["T1", "T2", "T99", "Tx"]), _anything),
        "status": st.one_of(st.sampled_from(list(ops.TASK_STATUSES)), _anything),
        "path": _paths, "expect_version": st.one_of(st.integers(0, 3), _numbers),
        "expect_rev": st.one_of(st.integers(0, 3), _numbers),
        "record": st.one_of(st.dictionaries(st.text(max_size=10), _anything, max_size=4), _anything),
        "seat": _seats, "text": st.one_of(st.text(min_size=1, max_size=20), _anything),
        "summary": st.text(max_size=20), "labels": st.one_of(st.lists(st.text(max_size=5), max_size=3), _anything),
        "project": st.sampled_from(["site", "", "x y"]), "size": _numbers,
        "sha256": st.sampled_from(["ab" * 32, "zz"]), "parent": st.sampled_from(["T1", "bad"]),
        # conversations: ids that meet (and that are no id), enums and their near misses
        "conversation": st.one_of(st.sampled_from(["c0", "c1", "c 1", ""]), _anything),
        "run": st.one_of(st.sampled_from(["r0", "r1", "r2", "-r"]), _anything),
        "metadata": st.one_of(st.dictionaries(st.text(max_size=8), _anything, max_size=4), _anything),
        "strategy": st.one_of(st.sampled_from(list(ops.STRATEGIES) + ["queue"]), _anything),
        "on_disconnect": st.sampled_from(list(ops.ON_DISCONNECT) + ["drop", None]),
        "revision": _numbers, "input": st.one_of(st.text(max_size=20), _anything),
        "role": st.one_of(st.sampled_from(list(ops.ROLES) + ["system"]), _anything),
        "calls": st.one_of(st.lists(st.fixed_dictionaries({"id": st.text(max_size=5), "name": st.text(max_size=5),
                                                           "args": _anything}), max_size=3), _anything),
        "call_id": st.one_of(st.text(max_size=5), _anything), "name": st.text(max_size=8),
        "error": st.one_of(st.booleans(), _anything), "tool": st.text(max_size=8), "args": _anything,
        "expires_at": _numbers, "decision": st.one_of(st.sampled_from(list(ops.DECISIONS)), _anything),
        "note": st.one_of(st.just(ops.EXPIRED), st.text(max_size=8)), "by": st.text(max_size=8),
        "approval": st.sampled_from(["a0", "a1", ""]), "node": st.one_of(st.just("n2"), _anything),
    }
    names = draw(st.lists(st.sampled_from(sorted(pool)), max_size=5, unique=True))
    if kind == "page.write" and draw(st.booleans()):
        names = sorted(set(names) | {"path", "title", "body"})
    args = {n: draw(pool[n]) for n in names}
    return draw(st.one_of(st.just(args), _anything)) if draw(st.integers(0, 9)) == 0 else args


@st.composite
def _entry(draw) -> bytes:
    """One log entry: mostly op-shaped maps with random fields, sometimes a
    well-formed op, sometimes garbage."""
    roll = draw(st.integers(0, 19))
    if roll == 0:
        return draw(st.binary(max_size=40))
    if roll <= 7:  # a well-formed op of any kind (refusals, duplicates and fences among them)
        return random_ops(random.Random(draw(st.integers(0, 10**6))), 1)[0].encode()
    if roll <= 13:  # a well-formed op with one field, or one argument, made bad
        good = random_ops(random.Random(draw(st.integers(0, 10**6))), 1)[0].as_dict()
        bad = draw(st.one_of(_numbers, _anything))
        if draw(st.booleans()) and good["args"]:
            good["args"][draw(st.sampled_from(sorted(good["args"])))] = bad
        elif draw(st.booleans()):
            good["kind"], good["args"] = "turn.record", {"record": {"x": bad}}
        else:
            good[draw(st.sampled_from(["at", "token", "seat", "node", "id"]))] = bad
        try:
            return msgpack.packb(good, use_bin_type=True)
        except (OverflowError, TypeError, ValueError):
            return b"\xc1"
    kind = draw(_kinds)
    d = {"id": draw(st.one_of(st.sampled_from(["op1", "op2", "op3"]), st.text(max_size=10), _numbers)),
         "kind": kind, "args": draw(_args(kind)), "seat": draw(_seats), "token": draw(_tokens),
         "node": draw(st.one_of(st.just("n1"), st.text(max_size=5), _numbers)),
         "at": draw(st.one_of(st.floats(0, 2e9), _numbers))}
    for name in draw(st.lists(st.sampled_from(sorted(d)), max_size=2, unique=True)):
        if draw(st.booleans()):
            del d[name]
        else:
            d[name] = draw(_anything)
    try:
        return msgpack.packb(d, use_bin_type=True)
    except (OverflowError, TypeError, ValueError):
        return msgpack.packb({k: v for k, v in d.items() if k in ("id", "kind")}, use_bin_type=True) \
            if isinstance(d.get("id"), (str, int)) else b"\xc1"


def _grants(fences):
    """A fixed verdict per fence, as the grants bucket gives every copy the same."""
    return {f: (None if f[1] % 2 == 0 else "not granted") for f in fences}


def _apply(copy: store.Store, entries: list[tuple[int, bytes]], cut: int) -> None:
    for i in range(0, len(entries), cut):
        batch = entries[i:i + cut]
        apply.apply_batch(copy, batch, grants=_grants(apply.raising(copy, batch)))


def _every_query_answers(copy: store.Store) -> None:
    reader = store.Reader(copy)
    for name, args in [("task.list", {}), ("task.get", {"id": "T1"}), ("page.list", {}),
                       ("page.read", {"path": "a"}), ("file.list", {}), ("turn.list", {}),
                       ("turn.list", {"seat": "cto", "since": 0}), ("diary.list", {"seat": "cto"}),
                       ("episode.list", {"seat": "ceo"}), ("op.outcome", {"id": "op1"}),
                       ("event.list", {}), ("conversation.get", {"id": "c0"}),
                       ("conversation.list", {}), ("conversation.list", {"seat": "cto", "status": "idle"}),
                       ("conversation.messages", {"conversation": "c0"}),
                       ("conversation.messages", {"conversation": "c1", "newest": True, "limit": 2}),
                       ("run.get", {"id": "r1"}), ("run.list", {"conversation": "c0"}),
                       ("run.list", {"status": "queued"}), ("approval.get", {"id": "a0.0"}),
                       ("approval.list", {}), ("approval.list", {"status": "pending"})]:
        answer = reader.query(name, args)
        # What a reader hands on (the API, crewletctl) must encode as JSON and msgpack alike.
        msgpack.packb(answer, use_bin_type=True)
        assert _finite(answer), (name, answer)
    for raw in (v for _, v in copy.env.begin().cursor(db=copy.dbs["ops"])):
        assert _finite(store.unpack(raw))


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_entry(), min_size=1, max_size=25), st.integers(1, 7))
def test_random_op_records_leave_every_copy_the_same_and_every_reader_working(data, cut):
    entries = list(enumerate(data, start=1))
    tmp = tempfile.mkdtemp(prefix="fuzz")
    try:
        whole, cut_up = store.open_env(f"{tmp}/a"), store.open_env(f"{tmp}/b")
        try:
            _apply(whole, entries, len(entries))
            _apply(cut_up, entries, cut)
            assert whole.applied() == cut_up.applied() == len(entries)  # the log goes on
            assert store.digest(whole) == store.digest(cut_up)
            _every_query_answers(whole)
        finally:
            store.close_env(whole)
            store.close_env(cut_up)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
