"""A seats process's life, and the seat leases bound to it (issue 13).

A node may hold 10,000 seats. Renewing a TTL on each every sweep cost 2,000
KV writes a second, and every watcher in the fleet saw each one. So a seat
lease has no TTL: it is **bound** to the life of the seats process that
holds it, ``life.<node>`` in the ``leases`` bucket — an ordinary lease (TTL
``fleet.lease_ttl``, fencing token) that the seats process renews on its
own connection, once a sweep. A held seat costs nothing per heartbeat.

* **The life** — its value names the node, crewletd's boot and the seats
  process (``proc``); its token is the sequence of the write that claimed
  it, carried by every renewal (:class:`crewlet.coord.lease.Leases`).
* **A bound seat lease** — ``seat.<name>``, written without a TTL, its value
  ``{"node", "boot", "life": <life token>}``; its own fencing token is the
  sequence of the claim, as for any lease, and it is never renewed (so the
  claim message stays the key's last one: what a copy's grant judges,
  :mod:`roles.data_applier.grants`).
* **Live** — a bound lease is live while its life is: ``life.<node>`` is
  there with the token the seat names (:class:`crewlet.coord.holders.Holders`
  reads it so). A life that lapses, is deleted, or is claimed again under
  another token takes all its seats along at once.
* **Claiming** a seat is a compare-and-set on its key expecting its last
  sequence: nothing, a delete, or a lease bound to a dead life. Refused,
  the claim reads the key and its holder's life from the stream's leader
  and writes again over a dead one; a live one wins. Tokens keep growing
  from owner to owner: they are sequences of one stream.

Why the promises hold:

* **Nothing is held twice.** A seat changes hands only by a compare-and-set
  over a key whose life was dead when read — and a dead life stays dead:
  it comes back only as a new claim, with a new token, which the seat does
  not name. Adoption (below) keeps a token only by a compare-and-set on the
  live key.
* **The zombie is fenced.** A seats process paused past the TTL finds its
  life stale by its own clock on waking (:meth:`Life.fresh`: the renewal's
  time is taken before it is sent, so the server's TTL ends later) and
  drops every seat before it asks anybody; its next renewal then fails.
* **A dead node's seats move** when its life lapses, at most a TTL after its
  last renewal: every peer's watch sees the expiry, and they claim.
* **Admission** reads the time of this process's last renewal of its life.
* **A seats process that is not renewing is not a seats-node**: the fair
  share counts a node only while its life is live.

**Adoption.** A seats process that starts finds its node's life still live
when the one before it died within the TTL. If that life is crewletd's own
boot's, the process before was this crewletd's child, reaped before this
one was forked (a supervisor runs one child a role), so the life is taken
over *with its token* — one write, and every seat bound to it is this
process's at once. A life of an earlier crewletd boot is taken over with a
new token (that crewletd is dead: its node's presence is ours): its seats
are then free, and claimed anew like any others.

**Stopping** deletes the life: every seat is free for the fleet in one write.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

from crewlet.coord.holders import LIFE
from crewlet.coord.lease import Held, Leases, Owner

__all__ = ["LIFE", "Claim", "Life", "key"]


def key(node: str) -> str:
    """The life key of *node*'s seats process."""
    return LIFE + node


@dataclass(frozen=True)
class Claim:
    """A seat claimed: its lease, and whether the key had a holder before
    (who may still have writes in flight: the new token's fence is raised)."""

    held: Held
    successor: bool


class Life:
    """This seats process's life, and its claims of seats bound to it.

    Invariant: ``held`` is the life while this process holds it (None
    before it began and after it was lost or ended); ``renewed`` is the
    monotonic time of the last renewal that was acknowledged.
    """

    def __init__(self, leases: Leases, node: str, proc: str):
        self.leases = leases
        self.node = node
        self.proc = proc
        self.key = key(node)
        self.held: Held | None = None

    @property
    def token(self) -> int | None:
        return self.held.token if self.held is not None else None

    def fresh(self, now: float | None = None) -> bool:
        """Ours by our own clock: held, and less than a TTL since it was renewed."""
        return self.held is not None and self.held.fresh(now)

    # ---------------------------------------------------------------- the life

    async def begin(self) -> Held | None:
        """Claim our life, adopt this crewletd's previous seats process's (its
        token kept), or take over an earlier boot's (a new token); None when
        the key changed under us (the next sweep tries again)."""
        held = await self.leases.claim_or_adopt(self.key, proc=self.proc)
        if held is None:
            owner = await self.leases.owner(self.key)
            if owner is not None and owner.node == self.node and owner.boot != self.leases.boot:
                held = await self.leases.take_over(owner, self.key, proc=self.proc)
        self.held = held
        return held

    async def renew(self, seen: Owner | None = None) -> Held | None:
        """Renew once; None if the life was lost. Raises :class:`LeaseError`
        when the outcome is unknown (the caller acts while :meth:`fresh`).

        *seen*: the life as a watch of the bucket last showed it. When that is
        this very life written since our last renewal by a sibling of the
        seats pool (same boot, token and ``proc``: the pool renews it as one),
        the write expects the sibling's revision rather than our own stale
        one. Otherwise every member's renewal found its sibling's in the way
        each interval, and cost a refused write and a read before the write
        that lands. A *seen* that is behind is refused like any stale view,
        and read again (:meth:`Leases.renew`)."""
        assert self.held is not None
        held = self.held
        if seen is not None and seen.revision > held.revision and seen.boot == self.leases.boot \
                and seen.token == held.token and seen.info.get("proc") == self.proc:
            held = replace(held, revision=seen.revision)
        self.held = await self.leases.renew(held, proc=self.proc)
        return self.held

    def lose(self) -> None:
        self.held = None

    async def end(self) -> bool:
        """Delete our life (a clean stop): every seat bound to it is free."""
        held, self.held = self.held, None
        return held is not None and await self.leases.release(held)

    # ---------------------------------------------------------------- seats

    async def claim(self, seat_key: str, expected: int = 0) -> Claim | None:
        """Claim *seat_key* bound to our life, expecting its last sequence
        *expected*: one the caller saw free (nothing, a delete, a lease bound
        to a dead life — which stays dead), so the write goes over it in one
        round trip. A view that is behind (the key moved since) is refused
        and read again: None when somebody live holds it."""
        assert self.held is not None
        value = json.dumps({"node": self.node, "boot": self.leases.boot, "token": None,
                            "life": self.held.token}, separators=(",", ":")).encode()
        sent = time.monotonic()
        seq = await self.leases.cas(seat_key, value, expected, ttl=None)
        if seq is None:
            last = await self._dead_or_none(seat_key)
            if last is None:
                return None
            seq = await self.leases.cas(seat_key, value, last, ttl=None)
            if seq is None:
                return None  # claimed by somebody between our read and our write
            expected = last
        return Claim(Held(seat_key, token=seq, revision=seq, renewed=sent, ttl=self.leases.ttl),
                     successor=expected != 0)

    async def _dead_or_none(self, seat_key: str) -> int | None:
        """The last sequence of *seat_key* when nobody live holds it (a claim
        may be written over it), else None. Read from the stream's leader."""
        seq, owner = await self.leases.read(seat_key)
        if owner is None:
            return seq
        life = owner.info.get("life")
        if life is None:
            return None  # a lease with its own TTL: live while the key is
        _, holder = await self.leases.read(key(owner.node))
        return seq if holder is None or holder.token != life else None
