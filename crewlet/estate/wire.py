"""The applier's wire: what a request to a data node's copy and its answer look like.

One shape for both ways in (msgpack maps):

* ZeroMQ, the node's ``estate`` ROUTER, for this node's own roles: a DEALER
  sends ``[b"", encode({"id": hex, **request})]`` and the reply carries the
  same ``id``;
* NATS request/reply on :func:`subject` (``estate.req.<node>.<origin>.<asker>``),
  for any node: a plain subscription, no queue group (one applier per
  node). nats-py's ``NoRespondersError`` means nobody listens there: nothing
  ran. ``<origin>`` is who asks — the asking process's broker user, a role's
  or ``crewlet``'s (:mod:`crewlet.estate.origins`) — and ``<asker>`` the node
  it asks from: each role's user may publish only on its own origin and node
  (:mod:`crewlet.permissions`), so the applier knows who asked, and refuses
  a write that origin does not make. Over ZeroMQ a request may say its
  ``origin`` itself (the node's own processes); none is the operator's.

  Mixed versions: a node older than origins asks on ``estate.req.<node>``
  (:data:`LEGACY`, :func:`parse_subject`), which an applier still answers,
  every kind as before; a node of this version never asks there (its
  roles' users may not) — and finds no applier on an older data node's
  subject for it (``NoResponders``: it asks the next data node).

Requests::

    {"kind": "write", "op": op.as_dict(), "floor": int, "wait": s, "deadline": t}
    {"kind": "read", "query": name, "args": {...}, "floor": int, "wait": s, "deadline": t}
    {"kind": "read", "query": "page.search", ..., "shards": [lo, hi]}

``shards`` (``page.search`` only, optional) limits a search to the pages of
search shards ``lo`` up to, not including, ``hi`` (of :data:`SEARCH_SHARDS`;
:func:`crewlet.estate.search.shard_of`); without it the whole copy is
searched. A search's answer is ``{"hits", "docs", "shards"}``: the hits (best
first, each with its ``score``, comparable across nodes), how many pages the
node's index holds, and the range searched.

``floor`` is the caller's highest seq of its own writes (a read answers only
once the copy applied it); ``wait`` is how long this node may take (at most
:data:`READ_WAIT` / :data:`WRITE_WAIT` are the router's); ``deadline`` is
absolute wall-clock seconds: a request that reaches the applier past it is
dropped unrun and unanswered, and no wait runs past it.

Answers (``status`` first, then the node that answered)::

    ok              {"applied", "answer"}  (+ "seq" for a write: where it landed)
    behind          {"applied", "floor"}   the floor was not reached within the wait
    out_of_service  {"reason"}             this copy answers nothing now
    unvouched       {"reason", "seq"?}     a write went to the log (or may have);
                                           its outcome is unknown here
    bad_request     {"reason"}             the request itself is wrong

A write's ``answer`` is the op's outcome (``{"ok": True, "seq", "result"}``
or ``{"ok": False, "seq", "error"}``: refused); a read's is the query's.

The ``applied`` PUB (topic :data:`APPLIED_TOPIC`) carries
:func:`applied_message` after every commit and every second.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack

from crewlet.estate import origins
from crewlet.estate.ops import Op

OK = "ok"
BEHIND = "behind"
OUT_OF_SERVICE = "out_of_service"
UNVOUCHED = "unvouched"
BAD_REQUEST = "bad_request"
STATUSES = (OK, BEHIND, OUT_OF_SERVICE, UNVOUCHED, BAD_REQUEST)

WRITE = "write"
READ = "read"

# What one data node may take on one request (DESIGN §4): a read, then the
# next node is asked; a write, which may wait out a leader election.
READ_WAIT = 10.0
WRITE_WAIT = 60.0

# The knowledge index's search shards: a page's is a hash of its path, mod this.
SEARCH_SHARDS = 64

SUBJECT_PREFIX = "estate.req."
APPLIED_TOPIC = b"applied"
# The origin a request on the bare ``estate.req.<node>`` is taken from: an
# older node's, which names none (crewlet.estate.origins.LEGACY).
LEGACY = origins.LEGACY


def subject(node: str, origin: str | None = None, asker: str | None = None) -> str:
    """The NATS subject node *node*'s applier answers requests of *origin*
    from node *asker* on; without them, the bare subject an older node asks on."""
    if origin is None:
        return SUBJECT_PREFIX + node
    return f"{SUBJECT_PREFIX}{node}.{origin}.{asker}"


def subjects(node: str) -> tuple[str, str]:
    """What node *node*'s applier subscribes to: every origin's subject, and the bare one."""
    return SUBJECT_PREFIX + node + ".>", SUBJECT_PREFIX + node


def parse_subject(node: str, subj: str) -> tuple[str, str | None] | None:
    """``(origin, asker)`` of a request to node *node*'s applier that came on
    *subj*: ``(LEGACY, None)`` for the bare subject; None for one that is not
    ``estate.req.<node>.<origin>.<asker>`` with an origin of
    :data:`crewlet.estate.origins.ORIGINS`."""
    base = SUBJECT_PREFIX + node
    if subj == base:
        return LEGACY, None
    if not subj.startswith(base + "."):
        return None
    parts = subj[len(base) + 1:].split(".")
    if len(parts) != 2 or parts[0] not in origins.ORIGINS or not parts[1]:
        return None
    return parts[0], parts[1]


def write_request(op: Op | dict[str, Any], floor: int = 0, wait: float = WRITE_WAIT,
                  deadline: float | None = None) -> dict[str, Any]:
    return {"kind": WRITE, "op": op.as_dict() if isinstance(op, Op) else dict(op),
            "floor": int(floor), "wait": float(wait),
            "deadline": deadline if deadline is not None else time.time() + wait}


def read_request(query: str, args: dict[str, Any] | None = None, floor: int = 0,
                 wait: float = READ_WAIT, deadline: float | None = None,
                 shards: tuple[int, int] | None = None) -> dict[str, Any]:
    request = {"kind": READ, "query": query, "args": dict(args or {}), "floor": int(floor),
               "wait": float(wait),
               "deadline": deadline if deadline is not None else time.time() + wait}
    if shards is not None:
        request["shards"] = [int(shards[0]), int(shards[1])]
    return request


def answer(status: str, node: str, **fields: Any) -> dict[str, Any]:
    assert status in STATUSES, status
    return {"status": status, "node": node, **fields}


def applied_message(node: str, seq: int, in_service: bool, reason: str | None,
                    at: float | None = None) -> dict[str, Any]:
    """What the ``applied`` PUB carries: how far this copy is, and whether it serves."""
    return {"node": node, "seq": seq, "in_service": in_service, "reason": reason,
            "at": time.time() if at is None else at}


def encode(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def decode(data: bytes) -> Any:
    """The message in *data*; ValueError if it is not msgpack."""
    try:
        return msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise ValueError(f"not a msgpack message: {type(exc).__name__}: {exc}") from None
