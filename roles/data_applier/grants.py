"""Whether a fencing token is a lease the fleet granted: the verdict every copy follows.

A seat's fence (:mod:`crewlet.estate.apply`) refuses every write whose token
is below the highest one seen. Anyone who can publish to the estate log
could otherwise raise it to 10¹² and lock the seat out for good. So a copy
raises a seat's fence to a token only if that token is a lease the fleet
granted **to that seat, for the op's node**: the token is the revision of
the claim in the ``leases`` bucket (:mod:`crewlet.coord.lease`), so the
proof is the ``KV_leases`` stream's message at that sequence.

Why a verdict, and not each copy reading ``leases`` itself
----------------------------------------------------------
Every copy must reach the same outcome for the same log entry, whenever it
applies it. ``leases`` does not keep what a copy would need: the claim's
message is replaced by the first renewal (the bucket keeps one revision a
key) and gone with the lease's TTL; the live lease moves on to the next
owner. A copy applying the entry at once finds the claim; one that lags a
minute, or a copy built from the log's first entry a month later, finds
nothing — and cannot tell an honest token whose claim was renewed away from
a forged one naming a sequence that was deleted (most sequences below the
stream's last are). Reading live state cannot be deterministic.

So the first copy to meet a token **judges** it from ``leases`` while the
evidence is fresh (an honest fence op is applied within milliseconds of its
claim), and writes the verdict to the ``grants`` bucket with a create-only
write: the first verdict wins a race, it is never changed, and every copy —
now or years later — reads and follows it instead of judging again. A copy
that can neither read a verdict nor judge (no quorum, no answer) applies
nothing and tries again: it never guesses.

The judgement, of token *T* for seat *S* and node *N* (first that holds):

1. ``KV_leases`` holds a message at sequence *T*: granted iff it is a write
   of ``seat.S`` (not a delete or an expiry marker) whose value names node *N*
   and whose own token is *T* (a claim: a renewal's revision is not a token);
2. *T* is past the stream's last sequence: refused (never granted);
3. the message is gone: granted iff the live lease of ``seat.S`` is node *N*'s
   under token *T* (renewals carry the claim's token); otherwise refused —
   a gone token nobody holds any more fences nothing worth fencing: its
   owner lost the seat, and the next owner's token is higher anyway.

Only an op whose token would *raise* the fence is judged (one per claim of a
seat, not one per write). Who can forge a verdict can write the ``grants``
bucket: the broker's permissions decide that, not this module.

Verdicts live as long as the estate log keeps ops that name their tokens;
a duty that trims the log may drop those below every copy's applied seq.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterable

from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from crewlet.coord import buckets
from crewlet.coord.lease import read_owner

# A fence's identity: (seat, token, node).
Fence = tuple[str, int, str]
# "no message found" (the sequence is gone or never was), as against the
# stream itself missing (10059), which is the broker's trouble: asked again.
_NO_MESSAGE = 10037


def key(seat: str, token: int, node: str) -> str:
    """The ``grants`` key of a fence (a node name may hold what a key may not)."""
    return f"{seat}.{token}.{hashlib.sha256(node.encode()).hexdigest()[:16]}"


async def judge(js: JetStreamContext, seat: str, token: int, node: str) -> str | None:
    """Why *token* is not a lease of *seat* granted to *node* (None: it is),
    read from ``leases`` now (module doc). Raises what the reads raised.
    The bucket is ensured first (every node makes it at boot; a data node
    may be first): a fleet without one has granted nothing."""
    stream = buckets.stream(buckets.LEASES.name)
    subject = f"$KV.{buckets.LEASES.name}.seat.{seat}"
    try:
        msg = await js.get_msg(stream, seq=token, direct=False)  # the leader's: never behind
    except NotFoundError as exc:
        if getattr(exc, "err_code", None) not in (_NO_MESSAGE, None):
            raise
        msg = None
    if msg is not None:
        if msg.subject != subject:
            return f"revision {token} of the leases bucket is not seat {seat}'s lease"
        headers = msg.headers or {}
        if headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers:
            return f"revision {token} of seat {seat}'s lease is its release or expiry, not a claim"
        owner = read_owner(token, msg.data or b"")
        if owner is None or owner.token != token:
            return f"revision {token} of seat {seat}'s lease is not a claim"
        if owner.node != node:
            return f"revision {token} of seat {seat}'s lease was granted to node {owner.node}, not {node}"
        return None
    info = await js.stream_info(stream)
    if token > info.state.last_seq:
        return f"the leases bucket has no revision {token} (it is at {info.state.last_seq})"
    _, value = await buckets.last(js, buckets.LEASES.name, f"seat.{seat}", leader=True)
    owner = read_owner(0, value) if value else None
    if owner is not None and owner.token == token and owner.node == node:
        return None
    return (f"revision {token} of seat {seat}'s lease is gone and the seat's lease now is not "
            f"it: it cannot be vouched for")


async def open_bucket(js: JetStreamContext, replicas: int) -> KeyValue:
    """The ``grants`` bucket, ensured with ``leases`` beside it (every node
    makes both at boot, but a data node may be first). Once per copy, not
    per batch: an R3 bucket cannot be created while a member is down, and
    the verdicts only need it to exist."""
    kv = await buckets.ensure(js, buckets.GRANTS, replicas)
    await buckets.ensure(js, buckets.LEASES, replicas)
    return kv


async def verdicts(js: JetStreamContext, kv: KeyValue, fences: Iterable[Fence]
                   ) -> dict[Fence, str | None]:
    """The verdict on each fence: None (granted) or why not. Read from
    ``grants`` (*kv*, from :func:`open_bucket`); judged and recorded there by
    the first copy to ask."""
    fences = set(fences)
    if not fences:
        return {}
    out: dict[Fence, str | None] = {}
    for fence in sorted(fences):
        name = key(*fence)
        _, value = await buckets.last(js, buckets.GRANTS.name, name, leader=True)
        if value is None:
            why = await judge(js, *fence)
            seat, token, node = fence
            record = json.dumps({"seat": seat, "token": token, "node": node, "granted": why is None,
                                 "why": why}, separators=(",", ":")).encode()
            try:
                await kv.create(name, record)
                value = record
            except KeyWrongLastSequenceError:
                # Another copy judged it first: its verdict stands.
                _, value = await buckets.last(js, buckets.GRANTS.name, name, leader=True)
                if value is None:
                    raise LookupError(f"the verdict on {name} was written yet cannot be read")
        out[fence] = _verdict(value)
    return out


def _verdict(value: bytes) -> str | None:
    try:
        record = json.loads(value)
        return None if record["granted"] is True else str(record.get("why") or "not granted")
    except (ValueError, KeyError, TypeError):
        # Not a verdict this module wrote: trust nothing in it.
        return "the recorded verdict cannot be read"
