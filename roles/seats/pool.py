"""The seats pool: a node's seats over several seats processes (issue 28).

One seats process saturates one core: at 1,000 slow turns in flight it ran
at most of a core while the rest of a bigger machine sat idle. So a node
runs ``node.seats_processes`` of them (default: one per CPU it may run on,
at most ``node.max_concurrent``), each a child of the roles supervisor —
``seats``, ``seats.1``, ``seats.2`` … — and each a whole seats role of its
own: its connection, its lease watch, its sweep, its turns, its MCP servers.

**Shares.** Which member works a seat is a hash of the seat's name
(:func:`member_of`): stable across restarts, the same in every member, and
needing nobody to agree on it. A member only ever holds seats of its share,
so a member killed takes down only its share; the one restarted in its place
adopts exactly that share, bound to the life as it was (no write per seat).
A pool resized by a new node config is a new crewletd boot, whose life is
new: every seat is claimed afresh, into the new shares.

**One life, one fair share, per node.** The fleet sees one node, not its
members:

* every member's seat leases are bound to the node's one life
  (``life.<node>``, :mod:`crewlet.coord.life`), and any member may renew it
  — it is the pool's (its ``proc`` names the pool, not a process), so a
  member's renewal that finds a sibling renewed first renews over it. The
  life lives while any member renews; a member paused past the TTL still
  drops its seats by its own clock before it asks anybody.
* the node's fair share is split by the shares: each member plans its sweep
  (:func:`crewlet.coord.sweep.plan`) over the seats of its share only, with
  the node's identity, labels and owners. A fair share is a sum over seats
  (each counts ``1/k`` toward the ``k`` nodes that may hold it), so the
  members' shares add up to the node's, each rounded up: a node may want up
  to one seat a member more than a node of one process would, never fewer.
* what a member may spend is its part of the node's: turn slots
  (``max_concurrent``), MCP spawns and releases a sweep — split so they add
  up to the node's, every member given at least one.

**Stopping.** A member's clean stop hands back the work it holds and leaves
its seats bound to the life: alone, it is a member being restarted, and its
successor adopts them. When the node stops, crewletd ends the life once
every member has stopped (:meth:`supervisor.fleet.Fleet.teardown`): every
seat free for the fleet in one write. (A pool of one ends its life itself,
as a node of one seats process always did.) A draining member ends the life
only once the whole node holds no seat.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

# The life's ``proc`` when the pool has several members: any of them renews it.
POOL_PROC = "pool"


def member_of(seat: str, size: int) -> int:
    """The member of a pool of *size* that works *seat*. CRC-32, not
    ``hash()``: Python salts string hashes per process."""
    return zlib.crc32(seat.encode()) % size if size > 1 else 0


def part(total: int, member: int, size: int) -> int:
    """*member*'s part of *total* split over *size* members: the parts add
    up to *total* when it is at least *size*, and none is below one."""
    return max(1, total // size + (1 if member < total % size else 0))


@dataclass(frozen=True)
class Pool:
    """This process's place in its node's seats pool.

    Invariant: ``0 <= member < size``."""

    member: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.member < self.size:
            raise ValueError(f"member {self.member} of a pool of {self.size}")

    @property
    def alone(self) -> bool:
        """A pool of one: the node's only seats process."""
        return self.size == 1

    def mine(self, seat: str) -> bool:
        """Is *seat* in this member's share?"""
        return member_of(seat, self.size) == self.member

    def part(self, total: int) -> int:
        """This member's part of a node-wide allowance of *total*."""
        return part(total, self.member, self.size)

    def proc(self, own: str) -> str:
        """The ``proc`` its life is renewed under: this process's own (*own*)
        when alone, the pool's when any member may renew it."""
        return own if self.alone else POOL_PROC
