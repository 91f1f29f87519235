"""What the route modules share: cursors, Idempotency-Key, estate errors.

A cursor is opaque: only the ``next`` of a page is one, and anything else is
a 400 ``bad_cursor`` (never a 422 or a 5xx), so its documented pattern is
documentation only (``json_schema_extra``), not a check that would answer
422 first. The Idempotency-Key is documented the same way: a bad one is a
400 ``bad_idempotency_key``.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Awaitable, TypeVar

from fastapi import Header, Query

from crewlet.estate.ops import OpError
from crewlet.estate.router import BadRequest, NobodyAnswered, OutcomeUnknown
from roles.ingress.problems import Problem

T = TypeVar("T")

# An Idempotency-Key: it becomes an op id or a trigger, so printable and short.
KEY_RE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
# Seconds a route gives the estate router (it asks data nodes in turn within it): a
# read; a write, which may wait out a leader election on one node, then ask the next.
ESTATE_WAIT = 15.0
WRITE_WAIT = 4 * ESTATE_WAIT
# Characters of a cursor: ours are a few dozen. A longer one is not ours, and is
# not decoded (deeply nested JSON would blow the parser's recursion limit: a 500).

# A text that is not all whitespace: holds one character that is whitespace
# neither to the documented schema's regex dialect (ECMAScript's \s) nor to
# the validator's (Unicode White_Space). A bare \S meant two things: U+0085
# alone passed the schema and was refused with a 422 (schemathesis found it).
NOT_BLANK = r"[^\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
CURSOR_MAX = 1000
# The largest sequence a cursor or a path may name: JetStream's and the estate
# log's are uint64; past it the broker or the store refuses the request (a 503).
SEQ_MAX = 2**64 - 1
# The largest integer a request may carry (a rev, a version, a dead letter's seq):
# exact in every JSON parser (JavaScript's Number.MAX_SAFE_INTEGER), where SEQ_MAX
# is not, and far past any the estate or the broker will reach. Unbounded, an int
# past uint64 failed the op's msgpack (a 503) or the broker's request (a 503).
INT_MAX = 2**53 - 1

CURSOR = Query(None, description="The `next` of the previous page, unchanged (none or empty: the first "
                                  "page); anything else is a 400 `bad_cursor`",
               json_schema_extra={"pattern": "^[A-Za-z0-9_-]*$", "maxLength": CURSOR_MAX})


def encode_cursor(position: dict[str, Any]) -> str:
    """An opaque cursor for the next page: what the listing resumes from."""
    raw = json.dumps(position, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, *keys: str) -> dict[str, Any]:
    """The position a cursor holds ({} without one); 400 for one we did not make."""
    if not cursor:
        return {}
    try:
        if len(cursor) > CURSOR_MAX:
            raise ValueError
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        position = json.loads(raw)
        if not isinstance(position, dict) or set(position) - set(keys):
            raise ValueError
    except (ValueError, RecursionError):
        raise Problem(400, "bad_cursor", "cursor is not one this listing gave out: pass the `next` "
                                         "of the previous page unchanged") from None
    return position


def seq_at(position: dict[str, Any], key: str, low: int = 1, high: int = SEQ_MAX) -> int:
    """The sequence a cursor's *key* holds; 400 unless an int in ``low..high``."""
    value = position[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Problem(400, "bad_cursor", "cursor is not one this listing gave out")
    return value


async def idempotency_key(key: str | None = Header(None, alias="Idempotency-Key",
                                                   description="Makes a retry of this write land once: "
                                                               "1-100 of A-Z, a-z, 0-9, '_', '-'",
                                                   json_schema_extra={"pattern": KEY_RE.pattern})) -> str | None:
    if key is not None and not KEY_RE.match(key):
        raise Problem(400, "bad_idempotency_key", "Idempotency-Key must be 1-100 of A-Z, a-z, 0-9, "
                                                  "'_' or '-'")
    return key


async def estate(call: Awaitable[T]) -> T:
    """*call* to the estate router, its failures as problems."""
    try:
        return await call
    except OpError as exc:
        raise Problem(422, "invalid", str(exc)) from None
    except BadRequest as exc:
        raise Problem(400, "bad_request", str(exc)) from None
    except OutcomeUnknown as exc:
        raise Problem(503, "outcome_unknown", f"{exc}; send the same request with the same "
                                              "Idempotency-Key to learn its outcome",
                      headers={"Retry-After": "5"}, op=exc.op_id, answers=exc.answers) from None
    except NobodyAnswered as exc:
        raise Problem(503, "estate_unavailable", str(exc), headers={"Retry-After": "5"},
                      answers=exc.answers) from None


def refused(outcome: dict[str, Any]) -> Problem:
    """The problem of a write the estate refused (its outcome's ``error``)."""
    why = str(outcome.get("error") or "refused")
    if why.startswith("no task") and "parent" not in why or why.startswith("no page"):
        return Problem(404, "not_found", why)
    if " is at rev " in why or " is at version " in why:
        return Problem(409, "conflict", why)
    return Problem(409, "refused", why)


async def read(f, query: str, args: dict[str, Any]) -> dict[str, Any]:
    """The answer of estate read *query* through *f*'s router (a Front), counted
    in the router metrics; its failures as problems (:func:`estate`)."""
    try:
        answer = await estate(f.router.read(query, args, timeout=ESTATE_WAIT))
    except Problem:
        if f.metrics is not None:
            f.metrics.router("read", "failed")
        raise
    if f.metrics is not None:
        f.metrics.router("read", "ok")
    return answer or {}
