"""Leases: a key in the ``leases`` bucket with a TTL and a fencing token.

* **claim** — write the key only if nobody holds it (expected last subject
  sequence = what is there now: nothing, a delete, or an expiry marker), with
  a per-key TTL (``Nats-TTL``). The write's sequence is the **fencing token**:
  stream sequences only grow, so a later owner always holds a larger token.
* **renew** — compare-and-set on the revision we last wrote, setting the TTL
  again. nats-py 2.16's ``update()`` takes no TTL, so renewals publish to the
  key's subject with ``Nats-Expected-Last-Subject-Sequence`` and ``Nats-TTL``.
* **release** — delete with the same compare-and-set, so we never delete a
  successor's claim.
* **current** — is this token still the key's? A read of the key: what a
  duty (the scheduler) and a conversation's driver ask before their side
  effects. A seat's turns ask their process's own view instead (the holders
  watch and the life lease's clock), and the estate's copies check every
  write's token against the seat's fence.

A lapsed lease is gone for everybody: the server removes the key when its TTL
runs out and leaves a limit marker (watchers see a PURGE). nats-py 2.16 reads
such a marker as a live, empty value and its ``create()`` then fails, so reads
here treat ``Nats-Marker-Reason`` like a delete.

When the cluster has lost quorum a compare-and-set fails with the same error
as a real conflict (DESIGN §4): a failed renewal re-reads the key before
deciding it is lost, and a publish that timed out may still have been stored,
so a renewal that finds its own newer write adopts it. Retries are bounded.

The value of a lease is JSON: ``{"node", "boot", "token", ...info}`` — the
holder's node id and boot instance, and from the first renewal on the
fencing token (a claim cannot know its own sequence before it is written).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import APIError

from crewlet.bus import Unanswered, kv_subject, publish_until
from crewlet.coord.buckets import LEASES, last
from crewlet.bus import EXPECTED_LAST as _EXPECTED_LAST
from crewlet.bus import WRONG_LAST_SEQUENCE as _WRONG_LAST_SEQUENCE

_RENEW_ATTEMPTS = 2


class LeaseError(Exception):
    """The fleet's state could not be read or written (no quorum, timeout)."""


@dataclass(frozen=True)
class Owner:
    """Who holds a key now, as read from the bucket."""

    node: str
    boot: str
    token: int
    revision: int
    info: dict[str, Any]


@dataclass(frozen=True)
class Held:
    """A lease this process holds.

    Invariant: ``revision`` is the last sequence we wrote for the key;
    ``renewed`` the monotonic time that write was acknowledged.
    """

    key: str
    token: int
    revision: int
    renewed: float
    ttl: float

    def fresh(self, now: float | None = None) -> bool:
        """Still ours by our own clock: less than a TTL since the last renewal.

        A process that was paused (SIGSTOP, a long GC) finds this False on
        waking, before it asks anybody, and must stop acting for the lease.
        """
        return (time.monotonic() if now is None else now) - self.renewed < self.ttl


def read_owner(revision: int, data: bytes) -> Owner | None:
    """The owner a lease value written at *revision* names; None if *data* is
    not a lease. A claim's value has no token yet: its own revision is it."""
    try:
        value = json.loads(data)
        return Owner(node=value["node"], boot=value["boot"],
                     token=value.get("token") or revision, revision=revision,
                     info={k: v for k, v in value.items() if k not in ("node", "boot", "token")})
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _value(node: str, boot: str, token: int | None, info: dict[str, Any]) -> bytes:
    return json.dumps({**info, "node": node, "boot": boot, "token": token},
                      separators=(",", ":")).encode()


class Leases:
    """Claim, renew, release and check leases for one node incarnation."""

    def __init__(self, js: JetStreamContext, node: str, boot: str, ttl: float,
                 patience: float | None = None):
        if ttl < 1:
            raise ValueError("a lease TTL must be at least 1 s (the server's granularity)")
        # The server keeps whole seconds (nats-py sends int(ttl)): our own idea
        # of freshness must not outlast what the server keeps.
        ttl = float(int(ttl))
        self.js = js
        self._put = kv_subject(js, LEASES.name)  # through a leaf's domain when there is one
        self.node = node
        self.boot = boot
        self.ttl = ttl
        # How long an unanswered write is resent (a stream leader election
        # takes ~5 s) before the caller is told the outcome is unknown; a
        # third of the TTL leaves a renewal time to land while the lease holds.
        self.patience = min(ttl / 3, 10.0) if patience is None else patience

    # ---------------------------------------------------------------- reading

    async def read(self, key: str) -> tuple[int, Owner | None]:
        """The key's last sequence (0: never written) and its live owner, if any.

        Read from the stream's leader, not with a direct get: any replica may
        answer a direct get, and a follower can still be behind a delete a
        watcher has already shown (measured: a few in a hundred hand-overs).
        """
        try:
            seq, data = await last(self.js, LEASES.name, key, leader=True)
        except Exception as exc:
            raise LeaseError(f"reading {key}: {type(exc).__name__}: {exc}") from exc
        if data is None:
            return seq, None
        owner = read_owner(seq, data)
        if owner is None:
            raise LeaseError(f"{key} holds something that is not a lease: {data[:80]!r}")
        return seq, owner

    async def owner(self, key: str) -> Owner | None:
        """Who holds *key* now (None: nobody)."""
        return (await self.read(key))[1]

    async def current(self, key: str, token: int) -> bool:
        """Is *token* still the fencing token of *key*? (The fence check.)"""
        owner = await self.owner(key)
        return owner is not None and owner.token == token

    # ---------------------------------------------------------------- writing

    async def cas(self, key: str, value: bytes, expected: int, *,
                  ttl: float | None | bool = True) -> int | None:
        """Compare-and-set *key* to *value* (a lease's bytes, see
        :func:`read_owner`) over its last sequence *expected*: the new
        sequence, or None when *expected* was stale.
        The key lives a lease TTL (*ttl* True), *ttl* seconds, or for ever (None).

        A publish that got no answer (a stream leader election takes seconds)
        is sent again under the same ``Nats-Msg-Id``: if the first one was
        stored after all, the broker's dedupe answers with its sequence.
        """
        # One id per write, shared by its resends only: an id reused by a later
        # write (say, a second claim expecting 0) would be "deduplicated" into
        # the first one's old acknowledgement without being stored.
        msg_id = f"{key}:{uuid.uuid4().hex}"
        try:
            ack = await publish_until(self.js, self._put + key, value, msg_id=msg_id,
                                      headers={_EXPECTED_LAST: str(expected)},
                                      msg_ttl=self.ttl if ttl is True else ttl,
                                      deadline=time.monotonic() + self.patience)
            return ack.seq
        except APIError as exc:
            if exc.err_code in _WRONG_LAST_SEQUENCE:
                return None
            raise LeaseError(f"writing {key}: {exc}") from exc
        except Unanswered as exc:
            raise LeaseError(f"writing {key}: no answer within {self.patience:g}s: {exc}") from exc
        except Exception as exc:
            raise LeaseError(f"writing {key}: {type(exc).__name__}: {exc}") from exc

    async def claim(self, key: str, *, expected: int = 0, **info: Any) -> Held | None:
        """Take *key* if nobody holds it; None if somebody does.

        The write goes first, expecting *expected* (the key's last sequence as
        the caller last saw it; 0: never written), so a claim of a fresh key is
        one round trip. Refused, it reads what is there and, if that is not a
        live lease (a delete, an expiry marker), writes once more over it.
        """
        return (await self.claim_or_owner(key, expected=expected, **info))[0]

    async def claim_or_owner(self, key: str, *, expected: int = 0,
                             **info: Any) -> tuple[Held | None, Owner | None]:
        """:meth:`claim`, and when refused the live owner its read found
        (None when somebody claimed the key between that read and our write),
        so a caller that names the holder needs no read of its own."""
        value = _value(self.node, self.boot, None, info)
        sent = time.monotonic()  # before the write: a resent write may land late
        seq = await self.cas(key, value, expected)
        if seq is None:
            last, owner = await self.read(key)
            if owner is not None:
                return None, owner
            seq = await self.cas(key, value, last)
            if seq is None:
                return None, None  # somebody else claimed it between our read and write
        return Held(key, token=seq, revision=seq, renewed=sent, ttl=self.ttl), None

    async def claim_or_adopt(self, key: str, **info: Any) -> Held | None:
        """Claim *key*, or adopt it if this node incarnation already holds it
        (a role that restarted finds its node's leases still live)."""
        held = await self.claim(key, **info)
        if held is not None:
            return held
        owner = await self.owner(key)
        if owner is None or owner.node != self.node or owner.boot != self.boot:
            return None
        return await self.renew(Held(key, owner.token, owner.revision, renewed=0.0, ttl=self.ttl),
                                **info)

    async def take_over(self, owner: Owner, key: str, **info: Any) -> Held | None:
        """Replace *owner*'s live lease on *key*, known to be dead (our own
        previous incarnation); None if the key changed since it was read."""
        sent = time.monotonic()
        seq = await self.cas(key, _value(self.node, self.boot, None, info), owner.revision)
        if seq is None:
            return None
        return Held(key, token=seq, revision=seq, renewed=sent, ttl=self.ttl)

    async def renew(self, held: Held, **info: Any) -> Held | None:
        """Extend *held* by another TTL; None if it is no longer ours.

        Raises :class:`LeaseError` when the answer is unknown (no quorum): the
        caller keeps the lease only while :meth:`Held.fresh`.
        """
        value = _value(self.node, self.boot, held.token, info)
        expected = held.revision
        for _ in range(_RENEW_ATTEMPTS):
            sent = time.monotonic()
            seq = await self.cas(held.key, value, expected)
            if seq is not None:
                return replace(held, revision=seq, renewed=sent)
            # A conflict, or quorum loss saying the same thing: look before deciding.
            _, owner = await self.read(held.key)
            if owner is None or owner.boot != self.boot or owner.token != held.token \
                    or owner.info.get("proc") != info.get("proc"):
                return None  # not our write: another process (a life's "proc") adopted it
            expected = owner.revision  # our own write that timed out yet was stored
        raise LeaseError(f"renewing {held.key}: the compare-and-set kept failing")

    async def release(self, held: Held) -> bool:
        """Give *held* up; False if it was not ours any more.

        A renewal that timed out yet was stored leaves ``held.revision``
        behind: a refused delete re-reads, and deletes at the current revision
        when the lease is still ours (same boot and token).
        """
        expected = held.revision
        for _ in range(2):
            try:
                await self.js.publish(self._put + held.key, b"",
                                      headers={_EXPECTED_LAST: str(expected),
                                               "KV-Operation": "DEL"})
                return True
            except APIError as exc:
                if exc.err_code not in _WRONG_LAST_SEQUENCE:
                    raise LeaseError(f"releasing {held.key}: {exc}") from exc
            except Exception as exc:
                raise LeaseError(f"releasing {held.key}: {type(exc).__name__}: {exc}") from exc
            _, owner = await self.read(held.key)
            if owner is None or owner.boot != self.boot or owner.token != held.token:
                return False
            expected = owner.revision
        return False
