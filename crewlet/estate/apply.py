"""What an op does to a copy: deterministic, one function per kind.

:func:`apply_batch` applies log entries ``(seq, data)`` — or ``(seq, data,
subject)``, the log subject the entry was found on — in one LMDB write
transaction and commits the applied sequence with the rows, so a copy is
always exactly "the log up to ``applied``" — an applier killed mid-batch
starts again from the last commit and applies the same entries again.

Determinism is the whole contract: every copy that applies the same log must
hold the same bytes. So an apply function reads only the op (its args, seat,
token, node and ``at``), its seq and the tables — never a clock, a random
number, the node it runs on or anything outside the transaction — and it
builds every row's dict in a fixed key order (msgpack keeps insertion order).

Before anything is written, in order:

0. **its origin** — an entry on a log subject that names an origin (the
   seats role of a node, :mod:`crewlet.estate.origins`) must be an op that
   origin publishes: one of its kinds, a seat's, issued by that node. One
   that is not (or does not decode) is passed over: nothing written, **no
   outcome kept** under its id (a forger must not take an id a real op will
   use), ``applied`` moved past it; its outcome (``code``
   :data:`WRONG_ORIGIN`, no id) is logged as ``estate_op_refused``. Every
   copy reads the same subject, so every copy passes over the same entries;
1. **the op itself** — an entry that does not decode or check is refused
   (kept under its id when it has one, so a resend gets the same answer);
2. **its id** — an id already in ``ops`` changes nothing; the answer is the
   first outcome (with ``duplicate``);
3. **the fence** — ``fences`` keeps each seat's highest token seen in an
   applied op; a lower token is refused. Tokens only grow from one owner to
   the next, so once the new owner has written (``seat.fence``, on claiming)
   its predecessor's writes are refused on every copy alike. A token that
   would *raise* the fence must be a lease the fleet granted to that seat
   for the op's node: the caller hands in the verdicts (*grants*: see
   :mod:`roles.data_applier.grants`, which makes them the same for every
   copy), and an op whose token was not granted is refused, the fence left
   where it was — so a forged token cannot lock a seat out. Either refusal
   is kept under the op id *and its token* (:func:`~crewlet.estate.store.fenced_key`),
   so the new owner redoing the same write under its own token is not
   refused for its predecessor's;
4. **the kind's own checks** (:class:`Refused`, whose outcome may carry a
   ``code`` — ``conflict``, ``not_found``… — for a writer that must answer
   one refusal otherwise than another, as the API a 409 or a 404).

Then the kind's writes, in a nested transaction of their own — a refusal or
a bug half way leaves none of its rows — and its outcome, kept in ``ops``
under the op id. A key too long for LMDB refuses the op (the same on every
copy); any other LMDB error is this node's (a full disk) and fails the
batch, which is applied again.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import lmdb

from crewlet import log
from crewlet.estate import log as estate_log
from crewlet.estate import origins
from crewlet.estate.ops import (EXPIRED, KINDS, OP_ID, RUN_ENDED, RUN_MESSAGES_MAX, TURN_TRIM_DEFAULT, Op,
                                OpError)
from crewlet.estate.store import (APPLIED, Store, fenced_key, join, key_seq, pack, place_key, seq_key,
                                  turn_place, unpack)


# The rules ops are applied by. Bump it when an op this module accepted would
# now be refused or applied otherwise: a copy applied under other rules holds
# rows a copy made now would not (a NaN ``at``, a page at ``a//b``), so the
# applier applies the log again from its first op (roles/data_applier/applier.py).
#   1  (unrecorded) before issue 16
#   2  every field checked (finite numbers, one form of page path), fences
#      raised only by granted tokens
#   3  turn.trim (an older applier refused it as an unknown kind, keeping the
#      rows a newer one removes)
#   4  conversations, runs, messages, approvals (DESIGN §11): an older applier
#      refused their ops as unknown kinds — keeping a "bad op" outcome under
#      each id, so not even a resend lands — where a newer one keeps the rows
#   5  files' bytes: file.register's ``object`` (its own project's only),
#      file.delete (an older applier refused both as bad ops)
#   6  file paths in one form, as page paths are (issue 24): no empty, '.'
#      or '..' segment, none starting with '.', no '\', control or bidi
#      character (an older applier kept "../../etc/passwd" as given)
#   7  skills and episodes (DESIGN §15, crewlet.estate.skills): pages under
#      skills/ are a skill's files, checked and kept by revision; a turn
#      record makes its trigger's episode (an older applier wrote neither);
#      a page path's segment may start with '_' ("scripts/__init__.py")
#   8  turn.records (many turns' records in one op, each fenced and kept under
#      its own id; an older applier refused the kind), and every turn kept at
#      its place (crewlet.estate.store.turn_place: seq x 1024 + position), which
#      is its record's seq and its episode's, where an older applier kept it
#      at the op's seq
#   9  the seats' own writes (crewlet.estate.origins.SEAT_WRITES) found on
#      their subject are applied (an older applier passed them over)
# A copy applied under rules *newer* than these was written by a newer
# crewlet: it is refused, never emptied (the applier says so).
RULES = 9

# What a refusal is, when a writer must tell one from another (the API's
# status and problem code): kept in the outcome as ``code``. Refusals of the
# older kinds carry none (their outcomes' bytes stay what they were).
NOT_FOUND = "not_found"                  # no such conversation, run or approval
CONFLICT = "conflict"                    # the row is otherwise: decided, ended, another's
BUSY = "conversation_busy"               # another run of the conversation is running
PENDING_APPROVAL = "pending_approval"    # the conversation awaits a decision first
FORBIDDEN = "forbidden"                  # not this writer's to write
# An entry on a log subject whose origin may not publish it: passed over,
# kept nowhere (the module doc, step 0).
WRONG_ORIGIN = origins.WRONG_ORIGIN


class Refused(Exception):
    """The op is well formed but cannot be applied; the message says why.
    *code* (one of the names above) and *detail* (what is in the way, by id:
    a refusal is kept on every copy for good, so never a row's free-form
    values) go into the outcome beside the message."""

    def __init__(self, message: str, code: str | None = None, **detail: Any):
        super().__init__(message)
        self.code = code
        self.detail = detail

    def outcome(self, seq: int) -> dict[str, Any]:
        outcome: dict[str, Any] = {"ok": False, "seq": seq, "error": str(self)}
        if self.code is not None:
            outcome["code"] = self.code
        if self.detail:
            outcome["detail"] = self.detail
        return outcome


Outcome = dict[str, Any]


# A fence's identity, as a verdict is asked for: (seat, token, node).
Fence = tuple[str, int, str]
# A verdict: None when the token is a lease the fleet granted, else why not.
Grants = dict[Fence, str | None]


class Unjudged(LookupError):
    """A token would raise a fence and no verdict on it was handed in: the
    batch is not applied (a copy never guesses; :func:`raising` says which
    verdicts a batch needs)."""


def raising(store: Store, entries: list[tuple[int, bytes]]) -> set[Fence]:
    """The fences the ops of *entries* (not yet applied) would raise: those
    whose token is above their seat's fence now. A superset of what
    :func:`apply_batch` asks *grants* for (fences only rise as it applies)."""
    wanted: set[Fence] = set()
    with store.env.begin() as txn:
        raw = txn.get(APPLIED, db=store.dbs["meta"])
        applied = int.from_bytes(raw, "big") if raw else 0
        fences: dict[str, int] = {}
        for seq, data, *subject in entries:
            if seq <= applied:
                continue
            # Only the three fields, not the whole op checked (a third of
            # applying one): any op that checks has them of these types.
            try:
                d = unpack(data)
                seat, token, node = d.get("seat"), d.get("token"), d.get("node")
            except Exception:
                continue
            if not isinstance(node, str):
                continue
            if subject and not _may_raise(subject[0], d.get("kind"), node):
                continue  # passed over unapplied (_origin_refusal): its fence is nobody's to judge
            if d.get("kind") == "turn.records":
                # The op is the node's; each record is its seat's, under its token.
                args = d.get("args")
                records = args.get("records") if isinstance(args, dict) else None
                seated = [(r.get("seat"), r.get("token")) for r in records
                          if isinstance(r, dict)] if isinstance(records, list) else []
            else:
                seated = [(seat, token)]
            for seat, token in seated:
                if not (isinstance(seat, str) and isinstance(token, int)):
                    continue
                if seat not in fences:
                    raw = txn.get(seat.encode(), db=store.dbs["fences"]) if 0 < len(seat) < 512 else None
                    fences[seat] = unpack(raw) if raw is not None else 0
                if token > fences[seat]:
                    wanted.add((seat, token, node))
    return wanted


def apply_batch(store: Store, entries: list[tuple[int, bytes]], *,
                grants: Grants | None = None) -> list[tuple[str | None, Outcome]]:
    """Apply log entries in order in one transaction; ``[(op id, outcome)]``
    for the entries applied now (those at or below ``applied`` are skipped).

    *grants*: the verdict on every fence the batch may raise
    (:func:`raising`); a missing one raises :class:`Unjudged` and nothing is
    committed. None: every token is taken as granted (a copy that is told
    of no leases: the unit tests of what a fence does).

    Raises what LMDB raised for a reason of this node's own (a full map, a
    disk error): nothing of the batch is committed, and the applier tries
    again — never an outcome that would differ from another copy's."""
    out: list[tuple[str | None, Outcome]] = []
    dbs = store.dbs
    with store.env.begin(write=True) as txn:
        raw = txn.get(APPLIED, db=dbs["meta"])
        applied = int.from_bytes(raw, "big") if raw else 0
        for seq, data, *subject in entries:
            if seq <= applied:
                continue
            why, op = _origin_refusal(subject[0], data) if subject else (None, None)
            if why is not None:
                out.append(_refuse_origin(seq, subject[0], data, why))
            else:
                out.append(_apply_one(store.env, txn, dbs, seq, data, grants, op))
            applied = seq
        txn.put(APPLIED, seq_key(applied), db=dbs["meta"])
    return out


def _may_raise(subject: str, kind: Any, node: str) -> bool:
    """Could an entry of *kind* for *node* on log subject *subject* be applied
    for its origin? The fields :func:`_origin_refusal` judges, read without
    decoding the op (:func:`raising` runs on every entry)."""
    found = estate_log.origin_of(subject)
    if found is None:
        return False
    origin, of = found
    return origin == origins.OPERATOR or (kind in origins.LOG_KINDS.get(origin, ()) and of == node)


def _origin_refusal(subject: str | None, data: bytes) -> tuple[str | None, Op | None]:
    """``(why, op)``: why the entry *data* found on log subject *subject* is
    refused for its origin (None: it is applied as any op), and the op when
    it was decoded to tell. Reads only the entry and its subject: the same on
    every copy."""
    found = estate_log.origin_of(subject)
    if found is None:
        return f"{subject!r} is not a subject of the log", None
    origin, node = found
    if origin == origins.OPERATOR:
        return None, None
    try:
        op = Op.decode(data)
    except OpError as exc:
        return f"not an op: {exc}", None
    return origins.log_refusal(origin, node, op), op


def _refuse_origin(seq: int, subject: str, data: bytes, why: str) -> tuple[None, Outcome]:
    """The outcome of an entry refused for its origin: kept nowhere, told by no id."""
    kind = op_id = None
    try:
        d = unpack(data)
        kind, op_id = d.get("kind"), d.get("id")
    except Exception:
        pass
    log.event("estate_op_refused", "warning", seq=seq, subject=subject,
              kind=kind[:100] if isinstance(kind, str) else None,  # a forger's: cut short
              op=op_id if isinstance(op_id, str) and OP_ID.match(op_id) else None, why=why)
    return None, {"ok": False, "seq": seq, "error": f"refused on {subject}: {why}", "code": WRONG_ORIGIN}


def _apply_one(env, txn, dbs, seq: int, data: bytes, grants: Grants | None,
               op: Op | None = None) -> tuple[str | None, Outcome]:
    try:
        op = op or Op.decode(data)
    except OpError as exc:
        op_id = _id_of(data)
        outcome = {"ok": False, "seq": seq, "error": f"bad op: {exc}"}
        if op_id is not None and txn.get(op_id.encode(), db=dbs["ops"]) is None:
            txn.put(op_id.encode(), pack(outcome), db=dbs["ops"])
        return op_id, outcome
    return op.id, _apply_op(env, txn, dbs, seq, op, grants)


def _apply_op(env, txn, dbs, seq: int, op: Op, grants: Grants | None,
              position: int | None = None) -> Outcome:
    """Steps 2-4 of the module doc and the kind's writes, for a checked *op*;
    its outcome, kept under its id. *position*: a turn record carried by a
    ``turn.records`` op at that position (its place, crewlet.estate.store)."""
    key = op.id.encode()
    first = txn.get(key, db=dbs["ops"])
    if first is None and op.token is not None:
        fenced = fenced_key(op.id, op.token)
        first = txn.get(fenced, db=dbs["ops"])
    if first is not None:
        return {**unpack(first), "duplicate": True}
    try:
        _fence(txn, dbs, op, grants)
    except Refused as exc:
        # Kept under the id *and token*: a resend of this op gets the same
        # refusal, while the seat's next owner redoing the same write under
        # its own, higher token is not refused for its predecessor's (nor
        # for a forger's ungranted one).
        outcome = {"ok": False, "seq": seq, "error": str(exc)}
        txn.put(fenced, pack(outcome), db=dbs["ops"])
        return outcome
    try:
        # Each op in a transaction of its own inside the batch's: a refusal
        # or a bug half way leaves none of its rows behind (~2 µs an op).
        with env.begin(write=True, parent=txn) as child:
            if op.kind == "turn.records":
                result = _turn_records(env, child, dbs, op, seq, grants)
            elif position is not None:
                result = _turn_record(child, dbs, op, seq, position)
            else:
                result = KIND_APPLY[op.kind](child, dbs, op, seq)
        outcome = {"ok": True, "seq": seq, "result": result}
    except Refused as exc:
        outcome = exc.outcome(seq)
    except lmdb.BadValsizeError:
        # A key of this op is too long for LMDB (511 bytes): the same on every copy.
        outcome = {"ok": False, "seq": seq, "error": f"{op.kind}: a name or path is too long to keep"}
    except (lmdb.Error, Unjudged):
        # The node's own trouble (a full map, the disk), or a record of a
        # turn.records op whose verdict is missing: not the op's outcome.
        raise
    except Exception as exc:
        # A bug in an apply function. It is the same bug on every copy (the
        # code is deterministic), so refusing the op keeps the copies equal.
        log.event("estate_apply_failed", "error", seq=seq, op=op.id, kind=op.kind,
                  error=f"{type(exc).__name__}: {exc}")
        outcome = {"ok": False, "seq": seq, "error": f"internal error applying {op.kind}: {exc}"}
    txn.put(key, pack(outcome), db=dbs["ops"])
    return outcome


def _id_of(data: bytes) -> str | None:
    """The id of an entry that is not a well-formed op, if it has a usable one."""
    try:
        op_id = unpack(data).get("id")
    except Exception:
        return None
    return op_id if isinstance(op_id, str) and OP_ID.match(op_id) else None


def _fence(txn, dbs, op: Op, grants: Grants | None) -> None:
    if op.seat is None:
        return
    key = op.seat.encode()
    raw = txn.get(key, db=dbs["fences"])
    current = unpack(raw) if raw is not None else 0
    if op.token < current:
        raise Refused(f"stale fencing token {op.token} for seat {op.seat}: the seat is at {current}")
    if op.token > current:
        if grants is not None:
            fence = (op.seat, op.token, op.node)
            if fence not in grants:
                raise Unjudged(f"no verdict on token {op.token} of seat {op.seat} for node {op.node}")
            why = grants[fence]
            if why is not None:
                raise Refused(f"fencing token {op.token} for seat {op.seat} is not a lease the fleet "
                              f"granted to node {op.node}: {why}")
        txn.put(key, pack(op.token), db=dbs["fences"])


def _by(op: Op) -> str:
    return op.seat or f"operator@{op.node}"


def _get(txn, dbs, table: str, key: bytes) -> Any:
    raw = txn.get(key, db=dbs[table])
    return unpack(raw) if raw is not None else None


# ------------------------------------------------------------------ tracker

def _task_index(txn, dbs, task: dict[str, Any], *, delete: bool = False) -> None:
    seq8 = seq_key(int(task["id"][1:]))
    keys = [join("task", "status", task["status"], seq8)]
    if task.get("assignee"):
        keys.append(join("task", "assignee", task["assignee"], seq8))
    for k in keys:
        if delete:
            txn.delete(k, db=dbs["index"])
        else:
            txn.put(k, task["id"].encode(), db=dbs["index"])


def _task_create(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    parent = a.get("parent")
    if parent is not None and txn.get(parent.encode(), db=dbs["tasks"]) is None:
        raise Refused(f"no task {parent} to be the parent")
    task = {"id": f"T{seq}", "title": a["title"], "body": a.get("body", ""),
            "status": a.get("status", "open"), "assignee": a.get("assignee") or None,
            "labels": list(a.get("labels", [])), "parent": parent, "rev": 1, "seq": seq,
            "created_at": op.at, "created_by": _by(op), "updated_at": op.at, "updated_by": _by(op)}
    txn.put(task["id"].encode(), pack(task), db=dbs["tasks"])
    txn.put(join("task", "all", seq_key(seq)), task["id"].encode(), db=dbs["index"])
    _task_index(txn, dbs, task)
    return {"task": task}


_TASK_FIELDS = ("title", "body", "status", "assignee", "labels")


def _task_update(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    task = _get(txn, dbs, "tasks", a["id"].encode())
    if task is None:
        raise Refused(f"no task {a['id']}")
    if "expect_rev" in a and a["expect_rev"] != task["rev"]:
        raise Refused(f"task {a['id']} is at rev {task['rev']}, not {a['expect_rev']}")
    _task_index(txn, dbs, task, delete=True)
    for field in _TASK_FIELDS:  # a fixed order: the row's bytes must not depend on the args'
        if field in a:
            task[field] = (a[field] or None) if field == "assignee" else a[field]
    task.update(rev=task["rev"] + 1, updated_at=op.at, updated_by=_by(op))
    txn.put(a["id"].encode(), pack(task), db=dbs["tasks"])
    _task_index(txn, dbs, task)
    return {"task": task}


def _task_comment(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    task_id = op.args["id"]
    if txn.get(task_id.encode(), db=dbs["tasks"]) is None:
        raise Refused(f"no task {task_id}")
    comment = {"id": f"C{seq}", "task": task_id, "body": op.args["body"], "seq": seq,
               "created_at": op.at, "created_by": _by(op)}
    txn.put(join(task_id, seq_key(seq)), pack(comment), db=dbs["comments"])
    return {"comment": comment}


# ----------------------------------------------------------- knowledge base

def _page_check_version(page: dict[str, Any] | None, op: Op) -> None:
    want = op.args.get("expect_version")
    if want is None:
        return
    have = page["version"] if page is not None else 0
    if want != have:
        raise Refused(f"page {op.args['path']} is at version {have}, not {want}")


def _page_write(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    if a["path"].startswith(skills.PREFIX):
        return skills.page_write(txn, dbs, op, seq)  # a file of a skill: a new revision
    key = a["path"].encode()
    old = _get(txn, dbs, "pages", key)
    _page_check_version(old, op)
    page = {"path": a["path"], "title": a["title"], "body": a["body"],
            "version": (old["version"] + 1) if old else 1, "seq": seq,
            "created_at": old["created_at"] if old else op.at,
            "created_by": old["created_by"] if old else _by(op),
            "updated_at": op.at, "updated_by": _by(op)}
    txn.put(key, pack(page), db=dbs["pages"])
    txn.put(seq_key(seq), key, db=dbs["pages_by_seq"])
    return {"page": page}


def _page_delete(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    if op.args["path"].startswith(skills.PREFIX):
        return skills.page_delete(txn, dbs, op, seq)
    key = op.args["path"].encode()
    old = _get(txn, dbs, "pages", key)
    if old is None:
        raise Refused(f"no page {op.args['path']}")
    _page_check_version(old, op)
    txn.delete(key, db=dbs["pages"])
    txn.put(seq_key(seq), key, db=dbs["pages_by_seq"])  # the index drops it too
    return {"deleted": op.args["path"]}


# -------------------------------------------------------------------- files

def _file_register(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    obj = a.get("object")
    if obj is not None and not obj.startswith(f"files/{a['project']}/"):
        # A row names only its own project's bytes: not another project's file.
        raise Refused(f"object {obj} is not one of project {a['project']}'s")
    key = join(a["project"], a["path"])
    old = _get(txn, dbs, "files", key)
    row = {"id": old["id"] if old else f"F{seq}", "project": a["project"], "path": a["path"],
           "size": a["size"], "sha256": a["sha256"], "content_type": a.get("content_type"),
           "object": a.get("object"),
           "version": (old["version"] + 1) if old else 1, "seq": seq,
           "registered_at": op.at, "registered_by": _by(op)}
    txn.put(key, pack(row), db=dbs["files"])
    return {"file": row}


def _file_delete(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    key = join(a["project"], a["path"])
    old = _get(txn, dbs, "files", key)
    if old is None:
        raise Refused(f"no file {a['path']} in project {a['project']}")
    expect = a.get("expect_version")
    if expect is not None and expect != old["version"]:
        raise Refused(f"file {a['path']} is at version {old['version']}, not {expect}")
    txn.delete(key, db=dbs["files"])
    return {"deleted": {"project": a["project"], "path": a["path"]}}


# ---------------------------------------------------------- a seat's rows

def _turn_record(txn, dbs, op: Op, seq: int, position: int = 0) -> dict[str, Any]:
    # Kept at its place (crewlet.estate.store.turn_place), which is its seq
    # to readers: one op may carry many turns' records, each its own row.
    place = turn_place(seq, position)
    record = {**op.args["record"], "seq": place}
    txn.put(seq_key(place), pack(record), db=dbs["turns"])
    if op.seat is not None:  # indexed by the seat that issued it, whatever the record says
        txn.put(join("turn", "seat", op.seat, seq_key(place)), seq_key(place), db=dbs["index"])
    episode = skills.episode_of_turn(txn, dbs, op, place, record)
    return {"turn": place} if episode is None else {"turn": place, "episode": place}


def _turn_records(env, txn, dbs, op: Op, seq: int, grants: Grants | None) -> dict[str, Any]:
    """The records of many turns, each applied as the ``turn.record`` it
    stands for — its own id (a record sent again, alone or in another batch,
    lands once), its seat's fence and token, its own nested transaction (one
    refused record leaves the others) — at the place of its position. The
    outcome counts them: landed now, landed before (``again``), refused."""
    landed = again = refused = 0
    for position, entry in enumerate(op.args["records"]):
        one = Op(id=entry["id"], kind="turn.record", args={"record": entry["record"]},
                 seat=entry["seat"], token=entry["token"], node=op.node, at=op.at)
        outcome = _apply_op(env, txn, dbs, seq, one, grants, position)
        if outcome.get("duplicate"):
            again += 1
        elif outcome.get("ok"):
            landed += 1
        else:
            refused += 1
    return {"turns": landed, "again": again, "refused": refused}


# LMDB's longest key: an index key longer than this was never written.
_KEY_MAX = 511


def turn_time(row: Any) -> float | None:
    """When a turn record's turn started (``started_at``, else ``at``), or None
    when it does not say (a record is free-form: nothing then says its age)."""
    if not isinstance(row, dict):
        return None
    for field in ("started_at", "at"):
        value = row.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value  # finite: every op's numbers are (crewlet.estate.ops._plain)
    return None


def _turn_trim(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    """Remove the turn records that started before ``before``, in log order
    from past seq ``after``, looking at no more than ``limit`` of them.

    Records land when their turns end, so their start times are in log order
    only roughly: the walk stops at the first record young enough to keep,
    and an older one logged after it (a turn that ran long) goes at a later
    trim, once the cutoff has passed the first. A record that names no start
    time is passed over and kept. The outcome says how many were removed,
    how many passed over, the last seq looked at (``after`` for the next op)
    and whether the look stopped at ``limit`` with records still to look at
    (``more``)."""
    before = op.args["before"]
    limit = op.args.get("limit", TURN_TRIM_DEFAULT)
    after = op.args.get("after", 0)
    removed = passed = 0
    more = False
    cur = txn.cursor(db=dbs["turns"])
    found = cur.set_range(seq_key(after + 1))
    while found:
        if removed + passed >= limit:
            more = True
            break
        key = cur.key()
        row = unpack(cur.value())
        started = turn_time(row)
        if started is not None and started >= before:
            break
        after = key_seq(key)
        if started is None:
            passed += 1
            found = cur.next()
            continue
        seat = row.get("seat")
        if isinstance(seat, str) and seat:
            # Indexed under the seat that recorded it, which a record names
            # (turns.py); an index key naming another is left to dangle, and
            # readers pass over an index entry whose row is gone.
            index_key = join("turn", "seat", seat, key)
            if len(index_key) <= _KEY_MAX:
                txn.delete(index_key, db=dbs["index"])
        removed += 1
        found = cur.delete() and bool(cur.key())  # deleting moves the cursor to the next row
    return {"removed": removed, "passed": passed, "after": after, "more": more, "before": before}


def _seat_of(op: Op) -> str:
    seat = op.args["seat"]
    if op.seat is not None and op.seat != seat:
        raise Refused(f"seat {op.seat} cannot write seat {seat}'s rows")
    return seat


def _episode_add(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    # An episode written as such (a turn's come from its record: crewlet.estate.skills).
    seat = _seat_of(op)
    row = {"seat": seat, "trigger": op.args.get("trigger"), "counterparty": "operator", "ask": "",
           "tools": [], "outcome": op.args.get("outcome"), "summary": op.args["summary"],
           "seq": turn_place(seq), "at": op.at, "compacted": 0}  # a place, as a turn's episode
    skills.episode_put(txn, dbs, row)
    return {"episode": row}


def _diary_write(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    seat = _seat_of(op)
    text = op.args["text"]
    # Identical content collapses on write (reference): one entry per text.
    digest_key = join(seat, hashlib.sha256(text.encode()).digest()[:16])
    same = txn.get(digest_key, db=dbs["diary_digest"])
    if same is not None:
        return {"entry": _get(txn, dbs, "diary", join(seat, same)), "collapsed": True}
    row = {"seat": seat, "text": text, "key": op.args.get("key"), "seq": seq, "at": op.at}
    txn.put(join(seat, seq_key(seq)), pack(row), db=dbs["diary"])
    txn.put(digest_key, seq_key(seq), db=dbs["diary_digest"])
    return {"entry": row, "collapsed": False}


def _seat_fence(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    return {"seat": op.seat, "token": op.token}  # the fence itself moved in _fence


# ------------------------------------------------------------ conversations
#
# A conversation's status moves with the op that causes it, in that op:
#
# * a run going ``running`` (run.create with status running, run.update) makes
#   it the conversation's current run and the conversation ``running`` —
#   refused (``conversation_busy``) while another of its runs is running, and
#   (``pending_approval``) while an approval it asked for is undecided; a run
#   already running may go ``running`` again (a pickup after its driver died:
#   its node changes, its start does not);
# * the current run ending makes the conversation ``idle`` (``completed``,
#   ``interrupted``) or ``error`` (``failed``) — unless it awaits an approval;
# * ``approval.request`` ends the current run (``completed``) and leaves the
#   conversation ``awaiting_approval`` until a run goes ``running`` again (the
#   resumption once it is decided, or a new run once it is denied).
#
# A run's status only moves on: queued → running → completed | failed |
# interrupted, queued → failed | interrupted (cancelled before it started);
# the same end twice is answered the same (``already``), another end is a
# conflict. A message lands in a run that started and was not rolled back,
# ended or not (a tool's result may come after an interrupt): it is kept at
# its run's place (crewlet.estate.store), so the history reads run by run.

def _conversation(txn, dbs, conv_id: str) -> dict[str, Any]:
    conv = _get(txn, dbs, "conversations", conv_id.encode())
    if conv is None:
        raise Refused(f"no conversation {conv_id}", NOT_FOUND)
    return conv


def _run_of(txn, dbs, run_id: str, conv_id: str | None = None) -> dict[str, Any]:
    run = _get(txn, dbs, "runs", run_id.encode())
    if run is None or (conv_id is not None and run["conversation"] != conv_id):
        where = f" in conversation {conv_id}" if conv_id is not None else ""
        raise Refused(f"no run {run_id}{where}", NOT_FOUND)
    return run


def _own(op: Op, conv: dict[str, Any]) -> None:
    """A seat writes only its own conversations (the operator any)."""
    if op.seat is not None and op.seat != conv["seat"]:
        raise Refused(f"seat {op.seat} cannot write seat {conv['seat']}'s conversation {conv['id']}",
                      FORBIDDEN)


def _same(row: dict[str, Any], fields: dict[str, Any]) -> bool:
    """Whether *row* is what *fields* would have written (a resend of it)."""
    return all(row.get(k) == v for k, v in fields.items())


# An outcome is kept under its op id on every copy for good: it names the
# rows it wrote, without their big free-form values (a message's text and
# calls, a run's input, an approval's arguments), which the queries give.
_BULK = ("text", "calls", "input", "args")


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in _BULK}


def _touch(row: dict[str, Any], op: Op) -> None:
    row["updated_at"] = op.at
    row["updated_by"] = _by(op)


def _conversation_put(txn, dbs, conv: dict[str, Any], was: str | None) -> None:
    """Keep *conv*, moving its status index entry from *was* (None: new)."""
    key = conv["id"].encode()
    seq8 = seq_key(conv["seq"])
    if was != conv["status"]:
        if was is not None:
            txn.delete(join("conv", "status", was, seq8), db=dbs["index"])
        txn.put(join("conv", "status", conv["status"], seq8), key, db=dbs["index"])
    txn.put(key, pack(conv), db=dbs["conversations"])


def _run_put(txn, dbs, run: dict[str, Any], was: str | None) -> None:
    """Keep *run*, moving its status index entries from *was* (None: new)."""
    key = run["id"].encode()
    seq8 = seq_key(run["seq"])
    if was is None:
        txn.put(join("run", "conv", run["conversation"], "all", seq8), key, db=dbs["index"])
    if was != run["status"]:
        if was is not None:
            txn.delete(join("run", "conv", run["conversation"], was, seq8), db=dbs["index"])
            txn.delete(join("run", "status", was, seq8), db=dbs["index"])
        txn.put(join("run", "conv", run["conversation"], run["status"], seq8), key, db=dbs["index"])
        txn.put(join("run", "status", run["status"], seq8), key, db=dbs["index"])
    txn.put(key, pack(run), db=dbs["runs"])


def _conversation_create(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    key = a["id"].encode()
    metadata = a.get("metadata", {})
    old = _get(txn, dbs, "conversations", key)
    if old is not None:
        if _same(old, {"seat": a["seat"], "metadata": metadata}):
            return {"conversation": old, "already": True}
        raise Refused(f"conversation {a['id']} exists, with another seat or metadata", CONFLICT)
    conv = {"id": a["id"], "seat": a["seat"], "metadata": metadata, "status": "idle", "run": None,
            "approval": None, "seq": seq, "created_at": op.at, "created_by": _by(op),
            "updated_at": op.at, "updated_by": _by(op)}
    seq8 = seq_key(seq)
    txn.put(join("conv", "all", seq8), key, db=dbs["index"])
    txn.put(join("conv", "seat", a["seat"], seq8), key, db=dbs["index"])
    _conversation_put(txn, dbs, conv, None)
    return {"conversation": conv}


def _start(txn, dbs, op: Op, seq: int, run: dict[str, Any], conv: dict[str, Any],
           node: str | None) -> None:
    """*run* goes ``running`` as *conv*'s current run (the rules above)."""
    current = conv["run"]
    if current is not None and current != run["id"]:
        other = _get(txn, dbs, "runs", current.encode())
        if other is not None and other["status"] == "running":
            raise Refused(f"conversation {conv['id']} is running run {current}", BUSY,
                          run=current, node=other["node"])
    if conv["approval"] is not None:
        approval = _get(txn, dbs, "approvals", conv["approval"].encode())
        if approval is not None and approval["status"] == "pending":
            raise Refused(f"conversation {conv['id']} awaits a decision on approval {approval['id']}",
                          PENDING_APPROVAL, approval=approval["id"])
    was = run["status"]
    run["status"] = "running"
    run["node"] = node or op.node
    if run["started_seq"] is None:
        run["started_seq"] = seq
        run["started_at"] = op.at
    if run.get("skills") is None:
        run["skills"] = seq
    _touch(run, op)
    _run_put(txn, dbs, run, was)
    was = conv["status"]
    conv["status"] = "running"
    conv["run"] = run["id"]
    conv["approval"] = None  # decided: this run resumes it, or goes on past its denial
    _touch(conv, op)
    _conversation_put(txn, dbs, conv, was)


def _end(txn, dbs, op: Op, run: dict[str, Any], conv: dict[str, Any], status: str,
         error: str | None) -> None:
    """*run* ends as *status*; the conversation with it, if it is its current run."""
    if run["started_seq"] is None and status == "completed":
        raise Refused(f"run {run['id']} has not started: it cannot have completed", CONFLICT)
    was = run["status"]
    run["status"] = status
    run["error"] = error
    run["ended_at"] = op.at
    _touch(run, op)
    _run_put(txn, dbs, run, was)
    if conv["run"] == run["id"] and conv["approval"] is None:
        was = conv["status"]
        conv["status"] = "error" if status == "failed" else "idle"
        _touch(conv, op)
        _conversation_put(txn, dbs, conv, was)


def _run_create(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    conv = _conversation(txn, dbs, a["conversation"])
    key = a["id"].encode()
    fields = {"conversation": a["conversation"], "strategy": a["strategy"],
              "on_disconnect": a["on_disconnect"], "revision": a["revision"],
              "input": a.get("input", ""), "approval": a.get("approval")}
    old = _get(txn, dbs, "runs", key)
    if old is not None:
        if _same(old, fields):
            return {"run": _brief(old), "conversation": conv, "already": True}
        raise Refused(f"run {a['id']} exists, with other arguments", CONFLICT)
    if fields["approval"] is not None:
        approval = _get(txn, dbs, "approvals", fields["approval"].encode())
        if approval is None or approval["conversation"] != conv["id"]:
            raise Refused(f"no approval {fields['approval']} in conversation {conv['id']}", NOT_FOUND)
        if approval["status"] != "decided":
            raise Refused(f"approval {approval['id']} is not decided: nothing to resume yet",
                          PENDING_APPROVAL, approval=approval["id"])
    # The skills the run reads are the log's as of its pin (crewlet.estate.skills):
    # its start, or — resuming an approval — the pin of the run that asked for it.
    pin = None
    if fields["approval"] is not None:
        asked = _get(txn, dbs, "runs", approval["run"].encode()) if approval.get("run") else None
        pin = asked.get("skills") if asked is not None else None
    run = {"id": a["id"], "conversation": conv["id"], "seat": conv["seat"], "status": "queued",
           **{k: fields[k] for k in ("strategy", "on_disconnect", "revision", "input", "approval")},
           "node": None, "error": None, "rolled_back": False, "seq": seq, "started_seq": None,
           "skills": pin,
           "created_at": op.at, "created_by": _by(op), "started_at": None, "ended_at": None,
           "updated_at": op.at, "updated_by": _by(op)}
    _run_put(txn, dbs, run, None)
    if a.get("status") == "running":
        _start(txn, dbs, op, seq, run, conv, a.get("node"))
    return {"run": _brief(run), "conversation": conv}


def _run_update(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    run = _run_of(txn, dbs, a["id"])
    conv = _conversation(txn, dbs, run["conversation"])
    _own(op, conv)
    status = a["status"]
    if run["status"] in RUN_ENDED:
        if status == run["status"]:
            return {"run": _brief(run), "conversation": conv, "already": True}
        raise Refused(f"run {run['id']} has ended: {run['status']}", CONFLICT, status=run["status"])
    if status == "running":
        _start(txn, dbs, op, seq, run, conv, a.get("node"))
    else:
        _end(txn, dbs, op, run, conv, status, a.get("error"))
    return {"run": _brief(run), "conversation": conv}


def _messages_key(run_id: str) -> bytes:
    return join("run", "messages", run_id)  # in index: how many messages the run wrote


def _conversation_message(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    conv = _conversation(txn, dbs, a["conversation"])
    _own(op, conv)
    run = _run_of(txn, dbs, a["run"], conv["id"])
    if run["rolled_back"]:
        raise Refused(f"run {run['id']} was rolled back: it keeps no messages", CONFLICT)
    if run["started_seq"] is None:
        raise Refused(f"run {run['id']} has not started", CONFLICT)
    calls = [{"id": c["id"], "name": c["name"], "args": c["args"]} for c in a.get("calls", [])]
    fields = {"run": run["id"], "role": a["role"], "text": a["text"], "calls": calls,
              "call_id": a.get("call_id"), "name": a.get("name"), "error": a.get("error", False)}
    id_key = join("msg", "id", conv["id"], a["id"])
    place = txn.get(id_key, db=dbs["index"])
    if place is not None:
        old = _get(txn, dbs, "messages", join(conv["id"], b"") + place)
        if old is not None and _same(old, fields):
            return {"message": _brief(old), "already": True}
        raise Refused(f"message {a['id']} of conversation {conv['id']} exists, with other content",
                      CONFLICT)
    raw = txn.get(_messages_key(run["id"]), db=dbs["index"])
    count = key_seq(raw) if raw is not None else 0
    if count >= RUN_MESSAGES_MAX:
        raise Refused(f"run {run['id']} has written {count} messages, the most one run may", CONFLICT)
    key = place_key(conv["id"], run["started_seq"], seq)
    message = {"id": a["id"], "conversation": conv["id"], **fields, "seq": seq,
               "place": [run["started_seq"], seq], "at": op.at, "by": _by(op)}
    txn.put(key, pack(message), db=dbs["messages"])
    txn.put(id_key, key[-16:], db=dbs["index"])
    txn.put(_messages_key(run["id"]), seq_key(count + 1), db=dbs["index"])
    return {"message": _brief(message)}


def _conversation_rollback(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    """Remove one ended run's messages; the outcome lists the tool calls
    among them that ran (their results): what they did stays done."""
    a = op.args
    conv = _conversation(txn, dbs, a["conversation"])
    run = _run_of(txn, dbs, a["run"], conv["id"])
    if run["rolled_back"]:
        return {"run": _brief(run), "removed": 0, "calls": [], "already": True}
    if run["status"] not in RUN_ENDED:
        raise Refused(f"run {run['id']} is {run['status']}: it must end (be interrupted) before "
                      f"it is rolled back", CONFLICT, status=run["status"])
    removed = 0
    calls: list[dict[str, Any]] = []
    if run["started_seq"] is not None:
        # One range of keys: the run's place (crewlet.estate.store), at most
        # RUN_MESSAGES_MAX of them.
        prefix = join(conv["id"], b"") + seq_key(run["started_seq"])
        cur = txn.cursor(db=dbs["messages"])
        found = cur.set_range(prefix)
        while found and cur.key().startswith(prefix):
            message = unpack(cur.value())
            txn.delete(join("msg", "id", conv["id"], message["id"]), db=dbs["index"])
            if message["role"] == "tool":
                calls.append({"call_id": message["call_id"], "name": message["name"],
                              "error": message["error"]})
            removed += 1
            found = cur.delete() and bool(cur.key())  # deleting moves the cursor to the next row
    txn.delete(_messages_key(run["id"]), db=dbs["index"])
    run["rolled_back"] = True
    _touch(run, op)
    _run_put(txn, dbs, run, run["status"])
    return {"run": _brief(run), "removed": removed, "calls": calls}


def _approval_request(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    conv = _conversation(txn, dbs, a["conversation"])
    _own(op, conv)
    if a["seat"] != conv["seat"]:
        raise Refused(f"conversation {conv['id']} is seat {conv['seat']}'s, not seat {a['seat']}'s",
                      FORBIDDEN)
    key = a["id"].encode()
    fields = {"conversation": conv["id"], "run": a["run"], "seat": a["seat"], "tool": a["tool"],
              "call_id": a.get("call_id"), "args": a["args"], "expires_at": a["expires_at"]}
    old = _get(txn, dbs, "approvals", key)
    if old is not None:
        if _same(old, fields):
            return {"approval": _brief(old), "already": True}
        raise Refused(f"approval {a['id']} exists, with other arguments", CONFLICT)
    run = _run_of(txn, dbs, a["run"], conv["id"])
    if conv["run"] != run["id"] or run["status"] != "running":
        raise Refused(f"run {run['id']} is not conversation {conv['id']}'s running run", CONFLICT,
                      run=conv["run"])
    approval = {"id": a["id"], **fields, "status": "pending", "decision": None, "note": None,
                "by": None, "expired": False, "seq": seq, "requested_at": op.at,
                "requested_by": _by(op), "decided_at": None}
    seq8 = seq_key(seq)
    for index_key in (join("appr", "all", seq8), join("appr", "status", "pending", seq8),
                      join("appr", "conv", conv["id"], seq8)):
        txn.put(index_key, key, db=dbs["index"])
    txn.put(key, pack(approval), db=dbs["approvals"])
    # The request ends the run; the conversation awaits the decision.
    was = conv["status"]
    conv["status"] = "awaiting_approval"
    conv["approval"] = approval["id"]
    _touch(conv, op)
    _conversation_put(txn, dbs, conv, was)
    _end(txn, dbs, op, run, conv, "completed", None)
    return {"approval": _brief(approval), "run": _brief(run), "conversation": conv}


def _decided(approval: dict[str, Any]) -> dict[str, Any]:
    """What a conflicting decision is told: the decision that stands (a
    refusal's detail is kept on every copy for good, so never the call's
    arguments)."""
    return {"approval": approval["id"], "decision": approval["decision"], "by": approval["by"],
            "decided_at": approval["decided_at"], "expired": approval["expired"]}


def _approval_decide(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    """Decide once: the same decision again is answered the same (``already``),
    another is a conflict. Past ``expires_at`` (by the op's ``at``) the
    approval has expired: a denial then is its expiry (note ``expired``, the
    one write a seat may make here), an approval a conflict."""
    a = op.args
    key = a["id"].encode()
    approval = _get(txn, dbs, "approvals", key)
    if approval is None:
        raise Refused(f"no approval {a['id']}", NOT_FOUND)
    decision = a["decision"]
    if approval["status"] == "decided":
        if approval["decision"] == decision:
            return {"approval": _brief(approval), "already": True}
        how = " (it expired)" if approval["expired"] else ""
        raise Refused(f"approval {a['id']} was decided already: {approval['decision']}{how}", CONFLICT,
                      **_decided(approval))
    expired = op.at >= approval["expires_at"]
    if op.seat is not None and not (expired and decision == "deny" and a.get("note") == EXPIRED):
        raise Refused(f"approval {a['id']} is a person's to decide, not seat {op.seat}'s "
                      f"(a seat may only write its expiry)", FORBIDDEN)
    if expired and decision == "approve":
        raise Refused(f"approval {a['id']} expired at {approval['expires_at']}: too late to approve",
                      CONFLICT, approval=approval["id"], expires_at=approval["expires_at"])
    approval["status"] = "decided"
    approval["decision"] = decision
    approval["note"] = EXPIRED if expired else a.get("note")
    approval["by"] = a.get("by") or _by(op)
    approval["expired"] = expired
    approval["decided_at"] = op.at
    seq8 = seq_key(approval["seq"])
    txn.delete(join("appr", "status", "pending", seq8), db=dbs["index"])
    txn.put(join("appr", "status", "decided", seq8), key, db=dbs["index"])
    txn.put(key, pack(approval), db=dbs["approvals"])
    if approval.get("kind") == "promotion":  # a draft skill's (crewlet.estate.skills)
        return {"approval": _brief(approval), **skills.decided(txn, dbs, op, seq, approval)}
    return {"approval": _brief(approval)}


KIND_APPLY: dict[str, Callable[..., dict[str, Any]]] = {
    "task.create": _task_create,
    "task.update": _task_update,
    "task.comment": _task_comment,
    "page.write": _page_write,
    "page.delete": _page_delete,
    "file.register": _file_register,
    "file.delete": _file_delete,
    "turn.record": _turn_record,
    # Applied by _apply_op itself, which hands it the fleet's verdicts for
    # each record's token (a kind's own function is given none).
    "turn.records": _turn_records,
    "episode.add": _episode_add,
    "diary.write": _diary_write,
    "seat.fence": _seat_fence,
    "turn.trim": _turn_trim,
    "conversation.create": _conversation_create,
    "run.create": _run_create,
    "run.update": _run_update,
    "conversation.message": _conversation_message,
    "conversation.rollback": _conversation_rollback,
    "approval.request": _approval_request,
    "approval.decide": _approval_decide,
}

# Skills and episodes have a module of their own; it uses this one's Refused
# and helpers, so it is imported once they are defined.
from crewlet.estate import skills  # noqa: E402

KIND_APPLY.update({
    "skill.write": skills.skill_write,
    "skill.retire": skills.skill_retire,
    "skill.draft": skills.skill_draft,
    "episode.compact": skills.episode_compact,
})

assert set(KIND_APPLY) == set(KINDS), "every op kind has exactly one apply function"
