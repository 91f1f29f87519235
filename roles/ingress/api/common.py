"""What the route modules share: cursors, Idempotency-Key, estate errors.

A cursor is opaque: only the ``next`` of a page is one, and anything else is
a 400 ``bad_cursor`` (never a 422 or a 5xx), so its documented pattern is
documentation only (``json_schema_extra``), not a check that would answer
422 first. The Idempotency-Key is documented the same way: a bad one is a
400 ``bad_idempotency_key``.

An Idempotency-Key is claimed fleet-wide in the ``claims`` bucket
(:func:`claim_key`, the same create-only claim a webhook delivery makes:
:func:`crewlet.queue.notify.create_claim`) with the request's digest, and
kept **a day** (:data:`IDEMPOTENCY_TTL`, its own ``Nats-TTL``), so the keys
kept are bounded by a day of writes. A request refused as invalid lets its
claim go (:func:`_let_go`): a compare-and-set delete of that claim alone,
sent again through a leader election.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from fastapi import Header, Query, Request
from fastapi.exceptions import RequestValidationError

from crewlet import log
from crewlet.estate.ops import OpError
from crewlet.estate.router import BadRequest, NobodyAnswered, OutcomeUnknown
from crewlet.queue import notify
from roles.ingress.problems import Problem, reforming, unavailable

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

# Seconds a read of the broker (a run's last event, the dead letters, the
# schedules' records) rides out a leader election before its 503: an
# election is over in ~5-6 s (DESIGN §4), and a client waits a few seconds.
READ_PATIENCE = 5.0
# Pauses between its tries: the first, doubling up to the last.
RIDE_PAUSE = 0.1
RIDE_PAUSE_MAX = 1.0

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


_KEY_HEADER = Header(None, alias="Idempotency-Key",
                     description="Makes a retry of this write land once: 1-100 of A-Z, a-z, 0-9, '_', '-'. "
                                 "The same key with another request (method, path, query, body) is a 422 "
                                 "`idempotency_key_reused`",
                     json_schema_extra={"pattern": KEY_RE.pattern})


async def idempotency_key_only(key: str | None = _KEY_HEADER) -> str | None:
    """The Idempotency-Key, checked for its form only: for a route that
    claims it itself, once it knows its request's digest (a file's upload:
    its bytes' sha256, :func:`claim_key`)."""
    if key is not None and not KEY_RE.match(key):
        raise Problem(400, "bad_idempotency_key", "Idempotency-Key must be 1-100 of A-Z, a-z, 0-9, "
                                                  "'_' or '-'")
    return key


async def idempotency_key(request: Request, key: str | None = _KEY_HEADER) -> AsyncIterator[str | None]:
    """The Idempotency-Key, claimed for this request (:func:`claim_key`): a
    key that came first with another body is a 422 ``idempotency_key_reused``.
    FastAPI reads a JSON route's body before its dependencies run, so the
    body here is the one the route gets. A claim this request made is let go
    again when the request is refused before anything was written (its body
    not valid: a 422, a 400, a 413), so the corrected request may take it."""
    key = await idempotency_key_only(key)
    if key is None:
        yield None
        return
    made = await claim_key(request, key, body_digest(await request.body()))
    try:
        yield key
    except (RequestValidationError, Problem) as exc:
        if made and (not isinstance(exc, Problem) or exc.status in (400, 413, 422)):
            await _let_go(request)
        raise


# Where a key's claim is kept: the claims bucket, under a prefix no
# integration name (a-z, 0-9 first) nor outbox. takes.
IDEMPOTENCY_PREFIX = "Idem."
# Seconds a key's claim lives (its own Nats-TTL, under the bucket's week for
# webhook deliveries): a retry comes within minutes or hours (Stripe keeps
# keys a day), and a key a day old is forgotten, so the keys kept are bounded
# by a day of writes, not a week's. Past it the same key is checked as new
# (its write's op id still answers a redo with the first outcome, while the
# estate keeps it): a key is for retries; another write takes a new one.
IDEMPOTENCY_TTL = 86400
# Seconds the delete of a claim let go stays (a tombstone: nothing reads it).
LET_GO_TTL = 60
# Seconds a claim, or its letting go, is sent again through a leader election
# before a 503 (a claim) or giving up (a let-go: the key stays held until
# IDEMPOTENCY_TTL, as one whose write was made would).
CLAIM_PATIENCE = 10.0


def _claim_name(request: Request, key: str) -> str:
    return claim_name(request.method, request.url.path, key)


def claim_name(method: str, path: str, key: str) -> str:
    """The claims bucket key of *key* on a route: a key names one write of
    one method and path (the same key on another path is another write, as
    its op id says: ops.op_id("api", kind, target, key))."""
    scope = f"{method} {path}\0{key}"
    return IDEMPOTENCY_PREFIX + hashlib.sha256(scope.encode()).hexdigest()[:48]


# Members of a JSON body that shape the answer, not the write: how long to wait
# for the turn (mail), whether to stream the run's events (a run). A retry may
# change them and is still the same write.
ANSWER_ONLY = ("wait", "stream")


def body_digest(raw: bytes) -> str:
    """The sha256 of a request body as a write: a JSON object canonical (its
    members sorted, no spacing) and without :data:`ANSWER_ONLY`; any other
    body as its bytes."""
    try:
        doc = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k not in ANSWER_ONLY}
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(raw).hexdigest()


def request_digest(request: Request, body_digest: str) -> str:
    """What a retry must match: the method, the path, the query and the body
    (by its sha256, *body_digest*)."""
    whole = "\0".join((request.method, request.url.path, request.url.query, body_digest))
    return hashlib.sha256(whole.encode()).hexdigest()


async def claim_key(request: Request, key: str, body_digest: str) -> bool:
    """Claim *key* for this request, fleet-wide, for :data:`IDEMPOTENCY_TTL`
    seconds: True if this call made the claim, False if the same request
    made it before (a retry: the write's own op id answers it with the first
    outcome). A claim made by another request (another body, query or path:
    Stripe's rule) is a 422 ``idempotency_key_reused`` naming the key: the
    second write would otherwise be answered with the first one's result and
    dropped unseen. The claims bucket not answering is a 503 (nothing was
    written). The claim is :func:`crewlet.queue.notify.create_claim`'s, as a
    webhook delivery's is; a key let go (:func:`_let_go`) is taken again."""
    f = request.app.state.front
    name, digest = _claim_name(request, key), request_digest(request, body_digest)
    value = json.dumps({"digest": digest, "node": f.node_id, "at": time.time()}).encode()
    try:
        made, seq, data = await notify.create_claim(
            f.js, name, value, deadline=time.monotonic() + CLAIM_PATIENCE, msg_ttl=IDEMPOTENCY_TTL,
            take_deleted=True)
    except Exception as exc:  # the broker unanswered: nothing written yet
        raise unavailable(exc, "idempotency_unavailable", f"the Idempotency-Key could not be checked "
                                                          f"({type(exc).__name__}); send the request again",
                          retry_after=5) from None
    if made:
        # What _let_go needs to delete this claim and no other: its sequence.
        request.state.idempotency_claim = (name, seq)
        return True
    try:
        first = json.loads(data or b"{}").get("digest")
    except (ValueError, AttributeError):
        first = None
    if first is not None and first != digest:
        raise Problem(422, "idempotency_key_reused",
                      f"Idempotency-Key {key} was used with another request to {request.method} "
                      f"{request.url.path}: a retry must send the same request; use a new key for "
                      "another write", key=key)
    return False


async def _let_go(request: Request) -> None:
    """Delete the claim this request made (:func:`claim_key`), so the
    corrected request may take its key: a compare-and-set on the claim's own
    sequence — a claim that is no longer that write (it expired and another
    request claimed the key) is left alone — sent again through a leader
    election for :data:`CLAIM_PATIENCE` seconds under one ``Nats-Msg-Id``
    (:func:`crewlet.queue.notify.release_claim`). Best effort past that: a
    claim left holds the key to this request until it expires, as one whose
    write was made would. The delete marker itself lives :data:`LET_GO_TTL`
    seconds."""
    made = getattr(request.state, "idempotency_claim", None)
    if made is None:
        return
    name, seq = made
    f = request.app.state.front
    request.state.idempotency_claim = None
    try:
        await notify.release_claim(f.js, name, seq, deadline=time.monotonic() + CLAIM_PATIENCE,
                                   msg_ttl=LET_GO_TTL)
        # False: the key moved on since this request's claim (another's now), left as it is.
    except Exception as exc:  # unanswered for CLAIM_PATIENCE: the claim stays until it expires
        log.event("idempotency_let_go_failed", "warning", error=f"{type(exc).__name__}: {exc}")


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


async def ride_out(make: Callable[[], Awaitable[T]], patience: float = READ_PATIENCE) -> T:
    """``await make()``, made again while it fails because the broker is
    re-forming (:func:`roles.ingress.problems.reforming`: a leader election,
    a member dead or frozen) for up to *patience* seconds; past that its last
    failure is raised (the route's 503, :mod:`roles.ingress.problems`). Any
    other failure is raised at once. For reads and idempotent opens only: a
    write rides an election out under its own id (:func:`crewlet.bus.publish_until`)."""
    deadline = time.monotonic() + patience
    pause = RIDE_PAUSE
    while True:
        try:
            return await make()
        except Exception as exc:
            if reforming(exc) is None or time.monotonic() + pause >= deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, RIDE_PAUSE_MAX)
