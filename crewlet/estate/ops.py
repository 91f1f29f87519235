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

Conversations (DESIGN §11) are estate data too, in the area
``conversations``: a conversation with one seat, its messages, its runs and
the approvals its turns asked for. Who may write each kind, and under which
fence (an op with no seat is the operator's: the API, a run's driver, a
duty — any process with the broker's credentials, as for ``task.create``;
the applier holds a seat's op to its fence and to its own rows):

========================  ===================================================
``conversation.create``   the API; never a seat
``run.create``            the API or a run's driver; never a seat
``run.update``            the run's driver, or the seat's turn under its fence
``conversation.message``  the seat's turn under its fence (the usual way), or
                          the driver (the user's input as the run starts)
``conversation.rollback`` the run's driver; never a seat
``approval.request``      the seat's turn under its fence (or the driver)
``approval.decide``       a person, through the API; a seat only the expiry
                          (``deny``, note ``expired``, once past
                          ``expires_at``) — a seat never decides its own
========================  ===================================================

A conversation's **status** (``idle``, ``running``, ``awaiting_approval``,
``error``) has no op of its own: it moves with the run and approval ops that
cause it, in the same op, so it never disagrees with its runs
(:mod:`crewlet.estate.apply` says how). Every row id of a conversation (its
own, a run's, an approval's, a message's) is made by the writer
(:data:`ROW_ID`), so a resend under a new op id finds the row and lands once.

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
import unicodedata
import uuid
from dataclasses import dataclass
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
# '/', each starting with a letter, a digit or '_' (a skill's resource may be
# "scripts/__init__.py") — so no empty segment ("a//b"),
# no "." or ".." ("eng/../../etc/passwd"), no leading or trailing '/', no
# upper case. A path that names a page one way only needs no rule to say
# which of two spellings is "the" page, on any copy or in any URL. (No
# lookahead, so the ingress's Rust-regex Path pattern takes it as it is; the
# length is PAGE_PATH_MAX, checked beside it.)
#
# File paths are held to the same rule, with a wider alphabet (a file keeps
# the name a person gave it: upper case, spaces, "résumé.pdf", "<b>.txt"):
# segments joined by single '/', none empty and none starting with '.' (so
# no ".", "..", ".hidden") or a space, none holding a '\' (a folder separator
# elsewhere), a control character (C0, DEL, C1: NUL, a line break) or a
# bidi control (U+061C, U+200E/F, U+202A-E, U+2066-9, and the line and
# paragraph separators U+2028/9: a right-to-left override makes
# "txt.exe" read "exe.txt"); at most FILE_PATH_MAX characters. One
# template makes both patterns (path_pattern), one function says what is
# wrong with a path (path_problem); the patterns are ECMAScript, Python and
# Rust regex alike (\xNN and \uNNNN escapes, no lookaround).


def path_pattern(first: str, rest: str) -> str:
    """The pattern of a path of '/'-joined segments, each one *first*
    character then any number of *rest*."""
    return rf"^{first}{rest}*(?:/{first}{rest}*)*$"


PAGE_PATH = path_pattern("[a-z0-9_]", "[a-z0-9_.-]")
PAGE_PATH_MAX = 200
_PAGE_PATH = re.compile(PAGE_PATH)
# Control and bidi characters, as a character class's body.
UNSAFE_CHARS = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[{UNSAFE_CHARS}]")
FILE_PATH = path_pattern(rf"[^./\\ {UNSAFE_CHARS}]", rf"[^/\\{UNSAFE_CHARS}]")
_FILE_PATH = re.compile(FILE_PATH)
SEAT_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_SEAT = re.compile(SEAT_NAME)
PROJECT = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
FILE_PATH_MAX = 300
FILE_PATH_RULE = ("a file path is segments joined by single '/', none empty or starting with '.' or "
                  f"a space, without '\\', control or bidi characters, at most {FILE_PATH_MAX} characters")
# A file's bytes in the store: files/<project>/<32 hex>, one object per upload.
OBJECT = r"^files/[A-Za-z0-9][A-Za-z0-9_.-]{0,99}/[0-9a-f]{32}$"
OBJECT_MAX = 140
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
NODE_PATTERN = rf"^[\x21-\x7e]{{1,{NODE_MAX}}}$"
_NODE = re.compile(NODE_PATTERN)
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
# Turn records one ``turn.records`` op carries, at most: the seats process
# sends the records of turns ending together as one op (roles/seats/kept.py),
# and a record's place among the turns is its op's seq times this plus its
# position in the op (crewlet.estate.store.turn_place), so it bounds both.
TURN_RECORDS_MAX = 1024
# One ``turn.records`` op's records, encoded, at most: one log entry stays
# well under the broker's 1 MiB payload, and one apply of it short.
TURN_RECORDS_MAX_BYTES = 768 * 1024

# ---- conversations (DESIGN §11)
# The ids a writer makes for a conversation, a run, an approval, a message:
# keys of every copy and parts of index keys and URLs, so short and plain.
ROW_ID_MAX = 100
ROW_ID = rf"^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{ROW_ID_MAX - 1}}}$"
CONVERSATION_STATUSES = ("idle", "running", "awaiting_approval", "error")
RUN_STATUSES = ("queued", "running", "completed", "failed", "interrupted")
RUN_ENDED = ("completed", "failed", "interrupted")
STRATEGIES = ("reject", "enqueue", "interrupt", "rollback")
ON_DISCONNECT = ("continue", "cancel")
ROLES = ("user", "assistant", "tool")
DECISIONS = ("approve", "deny")
APPROVAL_STATUSES = ("pending", "decided")
# The note an expiry writes: a denial anyone may write once past expires_at.
EXPIRED = "expired"
# A conversation's metadata: a small free-form object (a web app's tags).
METADATA_MAX_BYTES = 16 * 1024
METADATA_KEYS_MAX = 64
# One message's text (a tool's result may be long) and a run's input.
MESSAGE_TEXT_MAX = PAGE_BODY_MAX
# Tool calls one assistant message may carry, and the strings naming one.
CALLS_MAX = 128
CALL_ID_MAX = 200
TOOL_NAME_MAX = 200
# Messages one run may write: bounds a rollback's work on every copy (a turn
# is at most crewlet.agent.turn.MAX_ROUNDS rounds, far below this).
RUN_MESSAGES_MAX = 1000
NOTE_MAX = 2000
ERROR_MAX = 2000
DECIDER_MAX = 200
# ---- skills and episodes (DESIGN §15)
# A skill's name (the Agent Skills format's: crewlet.skills.format.NAME); the
# files of one revision go in one op, so a skill is at most this big.
SKILL_NAME = r"^[a-z0-9]+(-[a-z0-9]+)*$"
SKILL_NAME_MAX = 64
SKILL_FILES_MAX = 100
SKILL_FILE_PATH_MAX = 180
# A learning cluster's id (crewlet.learning.cluster): short and plain.
CLUSTER_MAX = 100
# An episode's counterparty: who the seat worked with — ``seat:<name>``,
# ``person:<id>``, ``hook:<integration>``, ``conversation:<id>``,
# ``schedule:<name>`` or ``operator`` (crewletctl, the API).
COUNTERPARTY = r"^(operator|(seat|person|hook|conversation|schedule):[\x21-\x7e]{1,200})$"
COUNTERPARTY_MAX = 220
EPISODE_TEXT_MAX = 2000
# The arguments of one op of these kinds, encoded: well under the broker's 1 MiB.
ARGS_MAX_BYTES = RECORD_MAX_BYTES
# A page of messages stops growing past this many encoded bytes (at least one
# message, however big): an answer travels as one NATS message of 1 MiB at most.
ANSWER_MAX_BYTES = 512 * 1024


class OpError(ValueError):
    """An op or a query that cannot be made: the message names the field and why."""


@dataclass(frozen=True)
class Kind:
    name: str
    area: str    # tracker | kb | files | turns | seat | conversations | skills
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
_SKILL = _str(1, SKILL_NAME_MAX, pattern=SKILL_NAME)
_SKILL_FILES = {"type": "array", "minItems": 1, "maxItems": SKILL_FILES_MAX, "items": {
    "type": "object", "required": ["path", "body"], "additionalProperties": False,
    "properties": {"path": {"type": "string", "minLength": 1, "maxLength": SKILL_FILE_PATH_MAX},
                   "body": {"type": "string", "maxLength": PAGE_BODY_MAX}}}}
_COUNTERPARTY = _str(1, COUNTERPARTY_MAX, pattern=COUNTERPARTY)
_LABELS = {"type": "array", "items": _str(1, 100), "maxItems": 50}
# At most 2**53 - 1: exact in every JSON parser, and an int msgpack always encodes.
_REV = {"type": "integer", "minimum": 1, "maximum": INT_MAX}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": LIST_MAX}
_TASK = _str(pattern=TASK_ID)
_PATH = _str(1, PAGE_PATH_MAX, pattern=PAGE_PATH)
_FILE = _str(1, FILE_PATH_MAX, pattern=FILE_PATH)
_ROW = _str(1, ROW_ID_MAX, pattern=ROW_ID)
_NODE_NAME = _str(1, NODE_MAX, pattern=NODE_PATTERN)
_AT = {"type": "number", "minimum": 0, "maximum": AT_MAX}
_SEQ = {"type": "integer", "minimum": 1, "maximum": INT_MAX}
_CALL = _obj(("id", "name", "args"), id=_str(1, CALL_ID_MAX), name=_str(1, TOOL_NAME_MAX),
             args={"type": "object"})
# A message's place in its conversation: (its run's start seq, its own seq).
_PLACE = {"type": "array", "items": _SEQ, "minItems": 2, "maxItems": 2}

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
    # A file's row; ``object`` names its bytes in the file store (crewlet.objects.files),
    # absent for a file recorded without them.
    Kind("file.register", "files", "move_on", _obj(
        ("project", "path", "size", "sha256"), project=_str(pattern=PROJECT), path=_FILE,
        size={"type": "integer", "minimum": 0, "maximum": INT_MAX}, sha256=_str(64, 64, pattern=r"^[0-9a-f]{64}$"),
        content_type=_str(1, 200), object=_str(1, OBJECT_MAX, pattern=OBJECT))),
    # The row goes; its bytes are the collector's once no row names them.
    Kind("file.delete", "files", "once", _obj(
        ("project", "path"), project=_str(pattern=PROJECT), path=_FILE, expect_version=_REV)),
    Kind("turn.record", "turns", "move_on", _obj(("record",), record={"type": "object"})),
    # The records of many turns in one op (the seats' group commit,
    # roles/seats/kept.py): each is a ``turn.record`` of its own seat, token
    # and id — fenced, deduplicated and kept under that id as if it had come
    # alone; the op itself is the node's and carries no seat.
    Kind("turn.records", "turns", "move_on", _obj(
        ("records",), records={"type": "array", "minItems": 1, "maxItems": TURN_RECORDS_MAX,
                               "items": _obj(("id", "seat", "token", "record"),
                                             id=_str(1, OP_ID_MAX, pattern=OP_ID.pattern),
                                             seat=_NAME, token=_REV,
                                             record={"type": "object"})})),
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
    # ``limit`` of them past the place ``after`` (a turn's seq); the operator's, never a seat's.
    Kind("turn.trim", "turns", "move_on", _obj(
        ("before",), before={"type": "number", "minimum": 0, "maximum": AT_MAX},
        limit={"type": "integer", "minimum": 1, "maximum": TURN_TRIM_MAX},
        after={"type": "integer", "minimum": 0, "maximum": INT_MAX})),
    # ---- skills (DESIGN §15): a revision is every file of the skill, checked
    # as a whole (crewlet.skills.format.check) by every applier.
    Kind("skill.write", "skills", "move_on", _obj(
        ("name", "files"), name=_SKILL, files=_SKILL_FILES, note=_str(0, NOTE_MAX))),
    Kind("skill.retire", "skills", "move_on", _obj(("name",), name=_SKILL, note=_str(0, NOTE_MAX))),
    # Curation's draft of a cluster, and the promotion approval that waits on it.
    Kind("skill.draft", "skills", "move_on", _obj(
        ("name", "cluster", "seat", "episodes", "files", "approval", "expires_at"), name=_SKILL,
        cluster=_str(1, CLUSTER_MAX, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"), seat=_NAME,
        episodes={"type": "array", "items": _SEQ, "maxItems": 1000}, files=_SKILL_FILES,
        approval=_ROW, expires_at=_AT)),
    # A seat's episodes with one counterparty up to ``through`` (an episode's seq: a place) become one.
    Kind("episode.compact", "seat", "move_on", _obj(
        ("seat", "counterparty", "through", "summary"), seat=_NAME, counterparty=_COUNTERPARTY,
        through=_SEQ, summary=_str(1, TASK_BODY_MAX))),
    # ---- conversations (module doc: who writes each)
    Kind("conversation.create", "conversations", "move_on", _obj(
        ("id", "seat"), id=_ROW, seat=_NAME,
        metadata={"type": "object", "maxProperties": METADATA_KEYS_MAX})),
    # A run of a conversation, queued (the default) or started at once. It pins
    # the company revision it started with; ``approval``: the decided approval
    # it resumes (the recorded call is run, or the model told it was denied).
    Kind("run.create", "conversations", "move_on", _obj(
        ("id", "conversation", "strategy", "on_disconnect", "revision"), id=_ROW,
        conversation=_ROW, strategy={"enum": list(STRATEGIES)},
        on_disconnect={"enum": list(ON_DISCONNECT)}, revision=_REV,
        input=_str(0, MESSAGE_TEXT_MAX), approval=_ROW, status={"enum": ["queued", "running"]},
        node=_NODE_NAME)),
    Kind("run.update", "conversations", "move_on", _obj(
        ("id", "status"), id=_ROW, status={"enum": [s for s in RUN_STATUSES if s != "queued"]},
        error=_str(0, ERROR_MAX), node=_NODE_NAME)),
    # One message, as crewlet.agent.types.Message has it: an assistant's
    # ``calls``; a tool's result names its ``call_id`` and tool ``name``.
    Kind("conversation.message", "conversations", "move_on", _obj(
        ("conversation", "id", "run", "role", "text"), conversation=_ROW, id=_ROW, run=_ROW,
        role={"enum": list(ROLES)}, text=_str(0, MESSAGE_TEXT_MAX),
        calls={"type": "array", "items": _CALL, "maxItems": CALLS_MAX},
        call_id=_str(1, CALL_ID_MAX), name=_str(1, TOOL_NAME_MAX), error={"type": "boolean"})),
    # Removes the messages of one ended run (the ``rollback`` strategy).
    Kind("conversation.rollback", "conversations", "move_on", _obj(
        ("conversation", "run"), conversation=_ROW, run=_ROW)),
    Kind("approval.request", "conversations", "move_on", _obj(
        ("id", "conversation", "run", "seat", "tool", "args", "expires_at"), id=_ROW,
        conversation=_ROW, run=_ROW, seat=_NAME, tool=_str(1, TOOL_NAME_MAX),
        call_id=_str(1, CALL_ID_MAX), args={"type": "object"}, expires_at=_AT)),
    Kind("approval.decide", "conversations", "move_on", _obj(
        ("id", "decision"), id=_ROW, decision={"enum": list(DECISIONS)}, note=_str(0, NOTE_MAX),
        by=_str(1, DECIDER_MAX))),
)}

# Kinds only the operator writes (an op of them carrying a seat is refused
# before it is sent, and by every applier).
OPERATOR_ONLY = {
    "turn.trim": "turn.trim is the maintenance duty's, not a seat's",
    "conversation.create": "conversation.create is the API's, not a seat's",
    "run.create": "run.create is the API's or a run driver's, not a seat's",
    "conversation.rollback": "conversation.rollback is a run driver's, not a seat's",
    "skill.retire": "skill.retire is a person's, not a seat's",
    "skill.draft": "skill.draft is the learning passes', not a seat's",
    "episode.compact": "episode.compact is the learning passes', not a seat's",
}

QUERIES: dict[str, dict[str, Any]] = {
    "task.get": _obj(("id",), id=_TASK),
    "task.list": _obj(status={"enum": list(TASK_STATUSES)}, assignee=_NAME, limit=_LIMIT, after=_TASK),
    "page.read": _obj(("path",), path=_PATH),
    "page.list": _obj(prefix=_str(0, 200), limit=_LIMIT, after=_PATH),
    "page.search": _obj(("query",), query=_str(1, 500),
                        limit={"type": "integer", "minimum": 1, "maximum": SEARCH_MAX}),
    "file.get": _obj(("project", "path"), project=_str(pattern=PROJECT), path=_FILE),
    "file.list": _obj(project=_str(pattern=PROJECT), limit=_LIMIT,
                      after=_obj(("project", "path"), project=_str(pattern=PROJECT),
                                 path=_FILE)),
    # before: only records below that log seq (the next page); since: only turns started at or after
    # before: a turn's seq, which is its place (crewlet.estate.store.turn_place)
    "turn.list": _obj(seat=_NAME, limit=_LIMIT, before={"type": "integer", "minimum": 1, "maximum": INT_MAX},
                      since={"type": "number", "minimum": 0}),
    "diary.list": _obj(("seat",), seat=_NAME, limit=_LIMIT),
    # newest ``limit``, oldest first; with a counterparty, that one's only
    "episode.list": _obj(("seat",), seat=_NAME, counterparty=_COUNTERPARTY, limit=_LIMIT),
    # every seat's episodes in key order (seat, seq): the learning passes' walk
    "episode.scan": _obj(limit=_LIMIT, after={"type": "array", "minItems": 2, "maxItems": 2,
                                              "prefixItems": [_NAME, _SEQ]}),
    "episode.count": _obj(("seat",), seat=_NAME),
    # skills as of a log seq (a run's pin) or now; of one seat's; curation's drafts
    "skill.list": _obj(as_of=_SEQ, seat=_NAME, limit=_LIMIT, drafts={"type": "boolean"}),
    "skill.read": _obj(("name",), name=_SKILL, file=_str(1, SKILL_FILE_PATH_MAX), as_of=_SEQ,
                       draft={"type": "boolean"}),
    "skill.revisions": _obj(("name",), name=_SKILL, limit=_LIMIT),
    "skill.drafts": _obj(limit=_LIMIT, status={"enum": ["pending", "promoted", "rejected"]}),
    "op.outcome": _obj(("id",), id=_str(1, OP_ID_MAX)),
    "event.list": _obj(limit=_LIMIT, after={"type": "integer", "minimum": 0}),
    # ---- conversations. Each list answers ``next``: the resume point to pass
    # back (as ``before`` for conversations, newest first; as ``after`` for
    # runs and approvals, oldest first), None on the last page.
    "conversation.get": _obj(("id",), id=_ROW),
    "conversation.list": _obj(seat=_NAME, status={"enum": list(CONVERSATION_STATUSES)},
                              limit=_LIMIT, before=_SEQ),
    # In order. after: the page past that place; before: the page up to it;
    # neither: the first page, or with newest the last. Answers ``after`` and
    # ``before``: where the next later and the next earlier page start (None
    # when there is none).
    "conversation.messages": {**_obj(("conversation",), conversation=_ROW, limit=_LIMIT,
                                     after=_PLACE, before=_PLACE, newest={"type": "boolean"}),
                              "not": {"anyOf": [{"required": ["after", "before"]},
                                                {"required": ["after", "newest"]},
                                                {"required": ["before", "newest"]}]}},
    "run.get": _obj(("id",), id=_ROW),
    # By conversation (all its runs, or those of one status: ``queued`` is
    # its queue), or across the company by status.
    "run.list": {**_obj(conversation=_ROW, status={"enum": list(RUN_STATUSES)}, limit=_LIMIT,
                        after=_SEQ),
                 "anyOf": [{"required": ["conversation"]}, {"required": ["status"]}]},
    "approval.get": _obj(("id",), id=_ROW),
    "approval.list": _obj(status={"enum": list(APPROVAL_STATUSES)}, conversation=_ROW,
                          limit=_LIMIT, after=_SEQ),
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


_FIELDS = ("id", "kind", "args", "seat", "token", "node", "at")


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
        if self.kind in OPERATOR_ONLY and self.seat is not None:
            # Retention is the company's: a seat may not remove turn records;
            # nor open a conversation, start a run or roll one back.
            raise OpError(OPERATOR_ONLY[self.kind])
        if not isinstance(self.node, str) or not _NODE.match(self.node):
            raise OpError(f"node must be 1-{NODE_MAX} printable ASCII characters, got {_show(self.node)}")
        if not (_is_number(self.at) and 0 <= self.at <= AT_MAX):
            # NaN and the infinities fail the comparison too.
            raise OpError(f"at must be wall-clock seconds from 0 to {AT_MAX:.0f}, got {_show(self.at)}")
        if not isinstance(self.args, dict):
            raise OpError(f"{self.kind}: arguments must be an object, got {type(self.args).__name__}")
        if not _is_plain(self.args, FREE_DEPTH + 1):
            problem = _plain(self.args, "args", FREE_DEPTH + 1)
            if problem:
                raise OpError(f"{self.kind}: {problem}")
        if KINDS[self.kind].area == "files" and "path" in self.args:
            # Said in words before the schema's pattern would be.
            problem = path_problem(self.args["path"])
            if problem:
                raise OpError(f"{self.kind}: {problem}")
        problem = _problem(_kind_check(self.kind), self.args, self.kind)
        if problem:
            raise OpError(problem)
        if self.kind == "turn.record":
            size = len(msgpack.packb(self.args["record"], use_bin_type=True))
            if size > RECORD_MAX_BYTES:
                raise OpError(f"turn.record: record is {size} bytes encoded, more than {RECORD_MAX_BYTES}")
        elif self.kind == "turn.records":
            if self.seat is not None:
                raise OpError("turn.records is a node's: its records carry their seats and tokens")
            for i, entry in enumerate(self.args["records"]):
                # The schema's "integer" takes 5.0: a token every copy keeps
                # and compares exactly, as an op's own (apply.raising skips
                # any other, and the record would wait for a verdict for ever).
                if not _is_int(entry["token"]):
                    raise OpError(f"turn.records: records[{i}].token must be an integer, "
                                  f"got {_show(entry['token'])}")
            size = len(msgpack.packb(self.args["records"], use_bin_type=True))
            if size > TURN_RECORDS_MAX_BYTES:
                raise OpError(f"turn.records: {size} bytes encoded, more than {TURN_RECORDS_MAX_BYTES}")
            if size > RECORD_MAX_BYTES:  # only then may one record be past a lone one's bound
                for i, entry in enumerate(self.args["records"]):
                    one = len(msgpack.packb(entry["record"], use_bin_type=True))
                    if one > RECORD_MAX_BYTES:
                        raise OpError(f"turn.records: records[{i}] is {one} bytes encoded, "
                                      f"more than {RECORD_MAX_BYTES}")
        if KINDS[self.kind].area == "conversations":
            problem = _conversation_problem(self)
            if problem:
                raise OpError(f"{self.kind}: {problem}")

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
        # Not dataclasses.asdict: its deep copy of args was ~4 % of a busy seats
        # process. An op is frozen and its args are not changed once it is made.
        return {"id": self.id, "kind": self.kind, "args": self.args, "seat": self.seat,
                "token": self.token, "node": self.node, "at": self.at}

    def encode(self) -> bytes:
        return msgpack.packb(self.as_dict(), use_bin_type=True)

    @classmethod
    def from_dict(cls, d: Any) -> "Op":
        """An op from its dict form; OpError if it is not one (checked)."""
        if not isinstance(d, dict):
            raise OpError(f"an op is a map, got {type(d).__name__}")
        try:
            fields = {f: d[f] for f in _FIELDS}
        except KeyError as exc:
            raise OpError(f"an op needs {exc.args[0]!r}") from None
        # The frozen dataclass's __init__ sets each field through
        # object.__setattr__ (~1.5 µs an op, on every applier for every op):
        # the same instance, its fields put in place at once.
        op = object.__new__(cls)
        op.__dict__.update(fields)
        op.check()
        return op

    @classmethod
    def decode(cls, data: bytes) -> "Op":
        try:
            d = msgpack.unpackb(data, raw=False)
        except Exception as exc:
            raise OpError(f"not an encoded op: {type(exc).__name__}: {exc}") from None
        return cls.from_dict(d)


def _conversation_problem(op: Op) -> str | None:
    """What the schema cannot say about a conversation op (None: nothing)."""
    a = op.args
    size = len(msgpack.packb(a, use_bin_type=True))
    if size > ARGS_MAX_BYTES:
        return f"arguments are {size} bytes encoded, more than {ARGS_MAX_BYTES}"
    if op.kind == "conversation.create" and "metadata" in a:
        size = len(msgpack.packb(a["metadata"], use_bin_type=True))
        if size > METADATA_MAX_BYTES:
            return f"metadata is {size} bytes encoded, more than {METADATA_MAX_BYTES}"
    elif op.kind == "conversation.message":
        role = a["role"]
        if "calls" in a and role != "assistant":
            return "only an assistant's message carries calls"
        if role == "tool" and not ("call_id" in a and "name" in a):
            return "a tool's message names the call_id and the tool's name it answers"
        if role != "tool" and ("call_id" in a or "error" in a):
            return "only a tool's message answers a call_id or says error"
        if role == "user" and "name" in a:
            return "a user's message names no tool"
    elif op.kind == "approval.request":
        if not a["expires_at"] > op.at:
            return f"expires_at {_show(a['expires_at'])} is not after the request ({_show(op.at)})"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(value: Any) -> str:
    """*value* for a refusal: its repr, cut short (a refusal is kept as an
    outcome on every copy, so it must not carry a huge value along)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_plain(value: Any, depth: int) -> bool:
    """Whether :func:`_plain` would find nothing wrong with *value*, for the
    types a decoded op holds, without naming where each value sits: every
    applier checks every op's arguments, and making each value's path for a
    message nobody reads was most of the check's time. False may be wrong
    (a subclass of a plain type): :func:`_plain` has the last word."""
    t = type(value)
    if t is str:
        return len(value) <= FREE_STR_MAX
    if t is int:
        return -INT_MAX <= value <= INT_MAX
    if t is float:
        return math.isfinite(value)
    if value is None or t is bool:
        return True
    if t is dict:
        if depth <= 0 or len(value) > FREE_ITEMS_MAX:
            return False
        for key, item in value.items():
            if type(key) is not str or len(key) > FREE_KEY_MAX or not _is_plain(item, depth - 1):
                return False
        return True
    if t is list or t is tuple:
        if depth <= 0 or len(value) > FREE_ITEMS_MAX:
            return False
        for item in value:
            if not _is_plain(item, depth - 1):
                return False
        return True
    return False


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


def path_problem(path: Any, *, page: bool = False) -> str | None:
    """What is wrong with *path* as a file's path (*page*: a page's), in
    words (None: nothing); the rule is the pattern's (:data:`FILE_PATH`,
    :data:`PAGE_PATH`), the words are for the person who sent it."""
    limit, pattern = (PAGE_PATH_MAX, _PAGE_PATH) if page else (FILE_PATH_MAX, _FILE_PATH)
    if not isinstance(path, str):
        return f"path must be a string, got {type(path).__name__}"
    if not path:
        return "path is empty"
    if len(path) > limit:
        return f"path is {len(path)} characters, more than {limit}"
    if pattern.match(path):
        return None
    unsafe = _UNSAFE.search(path)
    segments = path.split("/")
    if unsafe:
        kind = {"Cc": "a control character", "Zl": "a line separator", "Zp": "a paragraph separator"}.get(
            unicodedata.category(unsafe.group()), "a bidi control")
        why = f"{kind} (U+{ord(unsafe.group()):04X})"
    elif "" in segments:
        why = "an empty segment ('//', or '/' at its start or end)"
    elif any(s in (".", "..") for s in segments):
        why = "a '.' or '..' segment"
    elif any(s.startswith(".") for s in segments):
        why = "a segment starting with '.'"
    elif page:
        why = "a character other than a-z, 0-9, '_', '.', '-', or a segment not starting with one of a-z, 0-9"
    elif "\\" in path:
        why = "a '\\'"
    else:
        why = "a segment starting with a space"
    rule = ("a page path is segments of a-z, 0-9, '_', '.', '-', each starting with a letter or digit, "
            "joined by single '/'") if page else FILE_PATH_RULE
    return f"path {_show(path)} has {why}: {rule}"


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
    if name in ("file.get", "file.list") and isinstance(args, dict):
        path = args.get("path") if name == "file.get" else (args.get("after") or {}).get("path") \
            if isinstance(args.get("after"), dict) else None
        problem = path_problem(path) if path is not None else None
        if problem:
            raise OpError(f"{name}: {problem}")
    problem = _problem(_query_check(name), args, name)
    if problem:
        raise OpError(problem)
