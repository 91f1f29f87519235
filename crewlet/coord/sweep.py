"""What one seat sweep should do: a pure decision, given the fleet as seen now.

Every seats-node runs the same sweep on its own view of the fleet (presence
leases, seat leases, the company's seats) and decides for itself:

* **share** — this node's fair share: each seat counts ``1 / k`` toward every
  one of the ``k`` live seats-nodes its placement allows, and a node's share
  is the ceiling of its sum. With no placement that is ``ceil(seats / nodes)``;
  a seat only one node may hold counts fully there.
* **release** — seats this node may no longer hold (placement changed, seat
  removed from the company) first, then seats above the share; at most
  ``releases`` per sweep, since a release interrupts a live agent.
* **claim** — unowned seats this node may hold, while below its share. What
  is paced is what a claim costs, not the claim: a seat with stdio MCP servers
  forks one process tree per server (its **cost**), and at most ``spawns``
  trees are forked per sweep window (a seat costing more than a whole window
  counts as one whole window); a seat without servers is one KV write and is
  claimed at once. Seats fewest nodes may hold go first (a seat only this
  node may hold is claimed even above the share); otherwise each node tries
  seats in its own order (a hash of seat and node), so nodes starting
  together rarely race for a seat.

Renewing every held seat is not a decision: the sweep always does it first.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SeatView:
    name: str
    placement: dict[str, str] = field(default_factory=dict)
    cost: int = 0  # process trees its claim forks: its stdio MCP servers


def cost(seat: SeatView, limit: int) -> int:
    """What claiming *seat* takes from a window of *limit* spawns."""
    return min(seat.cost, limit)


@dataclass(frozen=True)
class NodeView:
    id: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeShare:
    """A seats pool member's view of its whole node, beside its own subset
    (see :func:`plan`). Invariant: every figure is over the whole company and
    every member of the node's pool, not over one member's subset."""
    share: int  # the node's fair share over all the company's seats
    held: int  # what all the node's members hold, by the lease watch
    slack: int  # the pool's size less one: members that may take a last place at once


@dataclass(frozen=True)
class Plan:
    share: int
    claim: list[str]
    release: list[str]


def may_hold(seat: SeatView, node: NodeView) -> bool:
    """A node may hold a seat when its labels include the seat's placement."""
    return all(node.labels.get(k) == v for k, v in seat.placement.items())


def fair_share(me: NodeView, seats: list[SeatView], nodes: list[NodeView]) -> int:
    total = 0.0
    for seat in seats:
        if may_hold(seat, me):
            total += 1 / sum(1 for n in nodes if may_hold(seat, n))
    # Round before the ceiling: 30 × 1/3 must be 10, not 10.000000000000002.
    return math.ceil(round(total, 9))


def _order(seat: str, node: str) -> bytes:
    return hashlib.blake2b(f"{seat}/{node}".encode(), digest_size=8).digest()


def plan(me: NodeView, seats: list[SeatView], nodes: list[NodeView], owners: dict[str, str],
         held: set[str], *, spawns: int, spawn_limit: int, releases: int,
         pool: NodeShare | None = None) -> Plan:
    """Decide one sweep for node *me*.

    *nodes* are the live seats-nodes (including *me*); *owners* maps each held
    seat to its holder's node id; *held* are the seats *me* holds; *spawns*
    what is left of this window's *spawn_limit*.

    *pool*: for a member of a seats pool of several, planning over its own
    subset *seats*, the whole node's :class:`NodeShare`.
    Other nodes do not know the members' subsets, so a subset can have seats
    its member may not take (it is at its share) and another node will not
    (it is at its own). So a member at its share claims one seat a
    sweep more while the node is below the node's share; and it releases its
    surplus only once the node holds more than the node's share and *slack*
    (two members taking the last place at once must not then give it back
    and take it in turn).
    """
    if me.id not in {n.id for n in nodes}:
        nodes = [*nodes, me]
    share = fair_share(me, seats, nodes)
    by_name = {s.name: s for s in seats}
    # Scarce seats first: those fewest nodes may hold are the hardest to place.
    reach = {s.name: sum(1 for n in nodes if may_hold(s, n)) for s in seats}

    def scarce_first(seat: str) -> tuple[int, bytes]:
        return reach.get(seat, 0), _order(seat, me.id)

    unfit = sorted(s for s in held if s not in by_name or not may_hold(by_name[s], me))
    keep = sorted((s for s in held if s not in unfit), key=scarce_first)
    surplus = list(reversed(keep[share:]))  # give up the most widely placeable first
    if pool is not None and pool.held <= pool.share + pool.slack:
        surplus = []  # the node is within its share (and the pool's slack): keep
    release = (unfit + surplus)[:releases]
    free = sorted((s.name for s in seats if s.name not in owners and may_hold(s, me)),
                  key=scarce_first)
    # A seat nobody else may hold is claimed even above the share: otherwise
    # it would wait for a surplus release that never comes.
    only_here = [s for s in free if reach[s] == 1]
    room = max(0, share - len(keep) - len(only_here))
    if pool is not None and room == 0 and pool.held < pool.share:
        room = 1  # the node is short of its share: one more, this sweep
    others = [s for s in free if reach[s] > 1]
    claim: list[str] = []
    for seat in only_here + others:
        if reach[seat] > 1 and room <= 0:
            break
        price = cost(by_name[seat], spawn_limit)
        if price > spawns:
            continue  # its trees wait for the next window; cheaper seats go on
        spawns -= price
        claim.append(seat)
        if reach[seat] > 1:
            room -= 1
    return Plan(share=share, claim=claim, release=release)
