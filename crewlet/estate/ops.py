"""What an operation on the estate is, and which there are.

An :class:`Op` is one write to the estate: an ``id`` (published as the
message's ``Nats-Msg-Id``, and kept with its outcome by every applier, so an
op sent twice lands once), a ``kind`` from :data:`KINDS`, its ``args``, the
``seat`` and fencing ``token`` that issued it (none for the operator), the
issuing ``node`` and the wall-clock time ``at`` which the rows it writes take
as theirs — an applier never reads its own clock, so every copy writes the
same bytes.

Each kind names its **area** and its **retry** rule, which the router obeys
once a data node may have run the op (reference, "How a request reaches the
estate"):

``move_on``  ask the next data node under the same op id (tracker, files,
             turns, the seat's own rows): the applier's outcome table makes
             the second sending a no-op;
``once``     never send twice: an op that went unanswered is reported as
             unknown (the knowledge base).

:data:`QUERIES` are the reads, each with the JSON schema of its arguments.
Arguments are checked where an op or a query is made (:func:`make_op`,
:func:`check_query`), and again by the applier before it applies anything,
so a bad op is refused with the field and the reason, never half applied.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import fastjsonschema
import msgpack

# Ids and names: an op id is a Nats-Msg-Id and a key of every copy (LMDB keys
# are at most 511 bytes), so it is printable ASCII; a page path is a key and a
# URL part; seat names are the company's (crewlet.company.model).
OP_ID_MAX = 200
OP_ID = re.compile(rf"^[\x21-\x7e]{{1,{OP_ID_MAX}}}$")
# A page path is refused unless it is already in its one normal form, never
# rewritten into it: segments of a-z, 0-9, '_', '.', '-' joined by single
# '/', each starting with a letter or digit — so no empty segment ("a//b"),
# no "." or ".." ("eng/../../etc/passwd"), no leading or trailing '/', no
# upper case. A path that names a page one way only needs no rule to say
# which of two spellings is "the" page, on any copy or in any URL. (No
# lookahead, so the ingress's Rust-regex Path pattern takes it as it is; the
# length is PAGE_PATH_MAX, checked beside it.)
PAGE_PATH = r"^[a-z0-9][a-z0-9_.-]*(?:/[a-z0-9][a-z0-9_.-]*)*$"
PAGE_PATH_MAX = 200
_PAGE_PATH = re.compile(PAGE_PATH)
SEAT_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_SEAT = re.compile(SEAT_NAME)
PROJECT = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
FILE_PATH_MAX = 300
TASK_ID = r"^T[0-9]+$"
TASK_STATUSES = ("open", "doing", "blocked", "done", "cancelled")
TITLE_MAX = 300
TASK_BODY_MAX = 20_000
COMMENT_MAX = 20_000
# A page is a document; this keeps one op well under the broker's 1 MiB.
PAGE_BODY_MAX = 200_000
DIARY_TEXT_MAX = 4000
LIST_MAX = 500
LIST_DEFAULT = 100
SEARCH_MAX = 100
SEARCH_DEFAULT = 10
# The numbers an op may carry: exact in every JSON parser and in msgpack
# (a float that is NaN or infinite is neither; an int past 2**64 does not encode).
INT_MAX = 2**53 - 1
# Wall-clock seconds an op's ``at`` may name: from the epoch to the year 9999.
AT_MAX = 253_402_300_799.0
# A node's name, as the op carries it (crewlet.config's node.id is narrower).
NODE_MAX = 100
_NODE = re.compile(rf"^[\x21-\x7e]{{1,{NODE_MAX}}}$")
# A free-form value (a turn record): how deep it may nest, how long one of its
# strings or keys may be, how many items one container may hold, and how big
# it may be encoded — one op stays well under the broker's 1 MiB, and no
# reader of a copy meets a value it cannot walk.
FREE_DEPTH = 8
FREE_STR_MAX = PAGE_BODY_MAX
FREE_KEY_MAX = 200
FREE_ITEMS_MAX = 10_000
RECORD_MAX_BYTES = 512 * 1024
# Turn records one ``turn.trim`` looks at, at most (removed or passed over): an
# op's work on every copy stays a few milliseconds, however much is old. The
# maintenance duty sends the next op while an outcome says ``more``.
TURN_TRIM_MAX = 1000
TURN_TRIM_DEFAULT = 500


class OpError(ValueError):
    """An op or a query that cannot be made: the message names the field and why."""


@dataclass(frozen=True)
class Kind:
    name: str
    area: str    # tracker | kb | files | turns | seat
    retry: str   # move_on | once (module doc)
    schema: dict[str, Any]


def _obj(required: tuple[str, ...] = (), **props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


def _str(lo: int = 1, hi: int | None = None, **extra: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string", "minLength": lo, **extra}
    if hi is not None:
        s["maxLength"] = hi
    return s


_NAME = _str(pattern=SEAT_NAME)  # a seat
_LABELS = {"type": "array", "items": _str(1, 100), "maxItems": 50}
# At most 2**53 - 1: exact in every JSON parser, and an int msgpack always encodes.
_REV = {"type": "integer", "minimum": 1, "maximum": INT_MAX}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": LIST_MAX}
_TASK = _str(pattern=TASK_ID)
_PATH = _str(1, PAGE_PATH_MAX, pattern=PAGE_PATH)

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("task.create", "tracker", "move_on", _obj(
        ("title",), title=_str(1, TITLE_MAX), body=_str(0, TASK_BODY_MAX),
        status={"enum": list(TASK_STATUSES)}, assignee=_NAME, labels=_LABELS, parent=_TASK)),
    Kind("task.update", "tracker", "move_on", _obj(
        ("id",), id=_TASK, title=_str(1, TITLE_MAX), body=_str(0, TASK_BODY_MAX),
        status={"enum": list(TASK_STATUSES)},
        assignee={"anyOf": [_NAME, {"const": ""}, {"type": "null"}]}, labels=_LABELS, expect_rev=_REV)),
    Kind("task.comment", "tracker", "move_on", _obj(
        ("id", "body"), id=_TASK, body=_str(1, COMMENT_MAX))),
    Kind("page.write", "kb", "once", _obj(
        ("path", "title", "body"), path=_PATH, title=_str(1, TITLE_MAX),
        body=_str(0, PAGE_BODY_MAX), expect_version=_REV)),
    Kind("page.delete", "kb", "once", _obj(("path",), path=_PATH, expect_version=_REV)),
    Kind("file.register", "files", "move_on", _obj(
        ("project", "path", "size", "sha256"), project=_str(pattern=PROJECT), path=_str(1, FILE_PATH_MAX),
        size={"type": "integer", "minimum": 0, "maximum": INT_MAX}, sha256=_str(64, 64, pattern=r"^[0-9a-f]{64}$"),
        content_type=_str(1, 200))),
    Kind("turn.record", "turns", "move_on", _obj(("record",), record={"type": "object"})),
    Kind("episode.add", "seat", "move_on", _obj(
        ("seat", "summary"), seat=_NAME, summary=_str(1, TASK_BODY_MAX), trigger=_str(1, 300),
        outcome=_str(1, 50))),
    Kind("diary.write", "seat", "move_on", _obj(
        ("seat", "text"), seat=_NAME, text=_str(1, DIARY_TEXT_MAX), key=_str(1, 300))),
    # Raises the seat's fence to the op's token: what a new owner publishes on
    # claiming a seat, so its predecessor's later writes are refused at once.
    Kind("seat.fence", "seat", "move_on", _obj()),
    # Removes turn records that started before ``before`` (the maintenance
    # duty's retention, crewlet.estate.apply._turn_trim), looking at most at
    # ``limit`` of them past log seq ``after``; the operator's, never a seat's.
    Kind("turn.trim", "turns", "move_on", _obj(
        ("before",), before={"type": "number", "minimum": 0, "maximum": AT_MAX},
        limit={"type": "integer", "minimum": 1, "maximum": TURN_TRIM_MAX},
        after={"type": "integer", "minimum": 0, "maximum": INT_MAX})),
)}

QUERIES: dict[str, dict[str, Any]] = {
    "task.get": _obj(("id",), id=_TASK),
    "task.list": _obj(status={"enum": list(TASK_STATUSES)}, assignee=_NAME, limit=_LIMIT, after=_TASK),
    "page.read": _obj(("path",), path=_PATH),
    "page.list": _obj(prefix=_str(0, 200), limit=_LIMIT, after=_PATH),
    "page.search": _obj(("query",), query=_str(1, 500),
                        limit={"type": "integer", "minimum": 1, "maximum": SEARCH_MAX}),
    "file.list": _obj(project=_str(pattern=PROJECT), limit=_LIMIT,
                      after=_obj(("project", "path"), project=_str(pattern=PROJECT),
                                 path=_str(1, FILE_PATH_MAX))),
    # before: only records below that log seq (the next page); since: only turns started at or after
    "turn.list": _obj(seat=_NAME, limit=_LIMIT, before={"type": "integer", "minimum": 1},
                      since={"type": "number", "minimum": 0}),
    "diary.list": _obj(("seat",), seat=_NAME, limit=_LIMIT),
    "episode.list": _obj(("seat",), seat=_NAME, limit=_LIMIT),
    "op.outcome": _obj(("id",), id=_str(1, OP_ID_MAX)),
    "event.list": _obj(limit=_LIMIT, after={"type": "integer", "minimum": 0}),
}


# The schemas compiled to Python once (fastjsonschema): every applier checks
# every op it applies, and jsonschema's interpreter took 33 µs an op here —
# more than half of applying one — against ~1 µs compiled.
# Each compiled the first time it is used (~1.5 ms each): a process that only
# reads this module's names (crewletctl) does not pay for all of them.
@functools.cache
def _kind_check(kind: str):
    return fastjsonschema.compile(KINDS[kind].schema)


@functools.cache
def _query_check(name: str):
    return fastjsonschema.compile(QUERIES[name])


def _problem(check, args: Any, what: str) -> str | None:
    if not isinstance(args, dict):
        return f"{what}: arguments must be an object, got {type(args).__name__}"
    try:
        check(args)
    except fastjsonschema.JsonSchemaValueException as exc:
        # "data.title must be ..." names the field after "data"; say it plainly.
        message = exc.message
        for lead in ("data.", "data "):
            if message.startswith(lead):
                message = message[len(lead):]
                break
        return f"{what}: {message}"
    return None


@dataclass(frozen=True)
class Op:
    id: str
    kind: str
    args: dict[str, Any]
    seat: str | None
    token: int | None
    node: str
    at: float

    def check(self) -> None:
        """OpError unless this op is well formed (what the applier refuses
        otherwise): every field of the right type and within its bounds, no
        number that is not finite or not exact, nothing nested past
        :data:`FREE_DEPTH`."""
        if not isinstance(self.id, str) or not OP_ID.match(self.id):
            raise OpError(f"op id must be 1-{OP_ID_MAX} printable ASCII characters without spaces, "
                          f"got {_show(self.id)}")
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise OpError(f"unknown op kind {_show(self.kind)}; kinds: {', '.join(KINDS)}")
        if (self.seat is None) != (self.token is None):
            raise OpError("an op carries a seat and its fencing token together, or neither")
        if self.seat is not None and (not isinstance(self.seat, str) or not _SEAT.match(self.seat)):
            raise OpError(f"seat must be a seat's name (1-63 of a-z, 0-9, '_', '-'), got {_show(self.seat)}")
        if self.token is not None and not (_is_int(self.token) and 1 <= self.token <= INT_MAX):
            raise OpError(f"token must be an integer from 1 to {INT_MAX}, got {_show(self.token)}")
        if self.kind == "seat.fence" and self.seat is None:
            raise OpError("seat.fence needs the seat and its token")
        if self.kind == "turn.trim" and self.seat is not None:
            # Retention is the company's: a seat may not remove turn records.
            raise OpError("turn.trim is the maintenance duty's, not a seat's")
        if not isinstance(self.node, str) or not _NODE.match(self.node):
            raise OpError(f"node must be 1-{NODE_MAX} printable ASCII characters, got {_show(self.node)}")
        if not (_is_number(self.at) and 0 <= self.at <= AT_MAX):
            # NaN and the infinities fail the comparison too.
            raise OpError(f"at must be wall-clock seconds from 0 to {AT_MAX:.0f}, got {_show(self.at)}")
        if not isinstance(self.args, dict):
            raise OpError(f"{self.kind}: arguments must be an object, got {type(self.args).__name__}")
        problem = _plain(self.args, "args", FREE_DEPTH + 1)
        if problem:
            raise OpError(f"{self.kind}: {problem}")
        problem = _problem(_kind_check(self.kind), self.args, self.kind)
        if problem:
            raise OpError(problem)
        if self.kind == "turn.record":
            size = len(msgpack.packb(self.args["record"], use_bin_type=True))
            if size > RECORD_MAX_BYTES:
                raise OpError(f"turn.record: record is {size} bytes encoded, more than {RECORD_MAX_BYTES}")

    @property
    def retry(self) -> str:
        return KINDS[self.kind].retry

    @property
    def msg_id(self) -> str:
        """The ``Nats-Msg-Id`` it is published under: its id, and its token when
        a seat issued it. The broker then drops a resend of the same op, but
        not the same write redone by the seat's next owner (a higher token)
        after the first was refused for its stale token; the copies' outcome
        table still makes a redo of a write that *landed* a no-op."""
        return self.id if self.token is None else f"{self.id}@{self.token}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def encode(self) -> bytes:
        return msgpack.packb(self.as_dict(), use_bin_type=True)

    @classmethod
    def from_dict(cls, d: Any) -> "Op":
        """An op from its dict form; OpError if it is not one (checked)."""
        if not isinstance(d, dict):
            raise OpError(f"an op is a map, got {type(d).__name__}")
        try:
            op = cls(**{f: d[f] for f in ("id", "kind", "args", "seat", "token", "node", "at")})
        except KeyError as exc:
            raise OpError(f"an op needs {exc.args[0]!r}") from None
        op.check()
        return op

    @classmethod
    def decode(cls, data: bytes) -> "Op":
        try:
            d = msgpack.unpackb(data, raw=False)
        except Exception as exc:
            raise OpError(f"not an encoded op: {type(exc).__name__}: {exc}") from None
        return cls.from_dict(d)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(value: Any) -> str:
    """*value* for a refusal: its repr, cut short (a refusal is kept as an
    outcome on every copy, so it must not carry a huge value along)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _plain(value: Any, where: str, depth: int) -> str | None:
    """What is wrong with *value* as data every copy keeps and every reader
    reads back (None: nothing): only None, booleans, integers within
    ±:data:`INT_MAX`, finite floats, strings of at most
    :data:`FREE_STR_MAX` characters, and lists and string-keyed maps of at most
    :data:`FREE_ITEMS_MAX` items, nested at most *depth* deep."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -INT_MAX <= value <= INT_MAX else f"{where}: integer out of range ±{INT_MAX}"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where}: {value!r} is not a finite number"
    if isinstance(value, str):
        return None if len(value) <= FREE_STR_MAX else f"{where}: a string longer than {FREE_STR_MAX}"
    if isinstance(value, (list, tuple, dict)):
        if depth <= 0:
            return f"{where}: nested deeper than {FREE_DEPTH}"
        if len(value) > FREE_ITEMS_MAX:
            return f"{where}: more than {FREE_ITEMS_MAX} items"
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str) or len(key) > FREE_KEY_MAX:
                    return f"{where}: keys must be strings of at most {FREE_KEY_MAX} characters, got {_show(key)}"
                problem = _plain(item, f"{where}.{key}", depth - 1)
                if problem:
                    return problem
        else:
            for i, item in enumerate(value):
                problem = _plain(item, f"{where}[{i}]", depth - 1)
                if problem:
                    return problem
        return None
    return f"{where}: {type(value).__name__} is not a plain value"


def op_id(*parts: str) -> str:
    """A stable op id from *parts* (``seat``, ``kind``, ``call key``…), joined
    by ``:``; past :data:`OP_ID_MAX`, everything after the first part is
    named by its digest (still the same when the write is made again)."""
    plain = ":".join(parts)
    if len(plain) <= OP_ID_MAX and OP_ID.match(plain):
        return plain
    rest = hashlib.sha256(":".join(parts[1:]).encode()).hexdigest()
    return f"{parts[0][:OP_ID_MAX - 65]}:{rest}"


def make_op(kind: str, args: dict[str, Any], *, node: str, seat: str | None = None,
            token: int | None = None, id: str | None = None, at: float | None = None) -> Op:
    """A checked op. *id* defaults to a fresh one: give a stable id (a seat's
    call key) wherever the same write may be made again."""
    op = Op(id=id or uuid.uuid4().hex, kind=kind, args=dict(args), seat=seat, token=token,
            node=node, at=time.time() if at is None else at)
    op.check()
    return op


def check_query(name: str, args: Any) -> None:
    """OpError unless *name* is a query and *args* its arguments."""
    if not isinstance(name, str) or name not in QUERIES:
        raise OpError(f"unknown query {name!r}; queries: {', '.join(QUERIES)}")
    problem = _plain(args, "args", FREE_DEPTH) if isinstance(args, dict) else None
    if problem:
        raise OpError(f"{name}: {problem}")
    problem = _problem(_query_check(name), args, name)
    if problem:
        raise OpError(problem)
