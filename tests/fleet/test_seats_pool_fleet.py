"""A node with a seats pool beside a node without one (roles/seats/pool.py).

Two nodes share one real broker (``stream.type: nats``). Node ``pool`` runs
two seats processes, node ``solo`` one. The fleet sees two nodes: the seats
are shared between them as between any two nodes, the pool's members
splitting theirs by the seats' names. A member killed keeps its share on
its node; a drained pool hands every seat over and ends its one life;
undrained, it takes its share back.
"""

from __future__ import annotations

import os
import signal

import pytest

from roles.seats.pool import member_of
from tests.conftest import start_all, wait_for
from tests.fleet.test_drain import ctl
from tests.fleet.test_fleet import apply, company, fleet_node, seats_of

pytestmark = pytest.mark.fleet

SEATS = 30


def tokens(node) -> dict[str, tuple[str, int]]:
    """seat -> (holding node, fencing token), as *node*'s fleet view shows it."""
    fleet = (node.status() or {}).get("fleet") or {}
    return {s["name"]: (s["node"], s["token"]) for s in fleet.get("seats", [])}


def working(node, child: str) -> int | None:
    """How many seats the pool member *child* says it works."""
    for c in (node.status() or {}).get("children", []):
        if c["name"] == child:
            return (c.get("stats") or {}).get("held")
    return None


def _not_split(*nodes) -> str:
    """What each node shows of the seats' holders, and what it logged above info."""
    said = [f"{SEATS} seats not held by both nodes within 60 s"]
    for node in nodes:
        held = seats_of(node)
        said.append(f"{node.config['node']['id']} sees {len(held)} held: "
                    f"{ {n: list(held.values()).count(n) for n in set(held.values())} }; "
                    f"children {[(c['name'], c['state'], (c.get('stats') or {}).get('held')) for c in (node.status() or {}).get('children', [])]}")
        said += [f"  {e}" for e in node.events() if e.get("level") in ("warning", "error")][-30:]
    return "\n".join(said)


def test_a_pooled_node_is_one_node_to_the_fleet(natsd, make_node, short_tmp):
    pool = fleet_node(make_node, natsd, "pool", node={"seats_processes": 2})
    solo = fleet_node(make_node, natsd, "solo")
    start_all([pool, solo])
    apply(pool, company(short_tmp, SEATS))

    def split():
        held = seats_of(solo)
        return held if len(held) == SEATS and set(held.values()) == {"pool", "solo"} else None
    try:
        held = wait_for(split, 60, what=f"{SEATS} seats held by both nodes")
    except AssertionError:
        raise AssertionError(_not_split(pool, solo)) from None
    mine = sorted(s for s, n in held.items() if n == "pool")
    # Each member's share rounds up: the pool wants at most one seat more a member.
    assert SEATS // 2 - 2 <= len(mine) <= SEATS // 2 + 2, held

    # A member killed: its share stays the pool's, under the same tokens.
    before = tokens(solo)
    victim = pool.process_pids()["seats.1"]
    os.kill(victim, signal.SIGKILL)
    pool.wait_running(exclude={"seats.1": victim})
    wait_for(lambda: len(seats_of(solo)) == SEATS, 30, what="every seat held")
    assert tokens(solo) == before
    assert tokens(pool) == before

    # Drained, the pool hands everything over and ends its life: the node is
    # drained only once both members hold nothing.
    out = ctl(pool, "drain", "--deadline", "5")
    assert out.returncode == 0 and "pool is drained" in out.stdout, (out.stdout, out.stderr)
    wait_for(lambda: set(seats_of(solo).values()) == {"solo"} and len(seats_of(solo)) == SEATS, 30,
             what="solo holding every seat")
    pool.wait_event("seats_drained", 10)  # (crewletd forwards its children's lines up to 0.25 s late)

    # Undrained, it takes its share back, each member only seats of its own share.
    out = ctl(pool, "undrain")
    assert out.returncode == 0, (out.stdout, out.stderr)
    def back():  # solo hands its surplus over a few a sweep (a release interrupts a live agent)
        held = seats_of(solo)
        return len(held) == SEATS and sum(1 for n in held.values() if n == "pool") >= SEATS // 2 - 2
    wait_for(back, 60, what="the pool holding its share again")
    # Each member works the seats of its own share, and only those.
    def shares_worked():
        taken = {s for s, n in seats_of(pool).items() if n == "pool"}
        share = {child: sum(1 for s in taken if member_of(s, 2) == member)
                 for child, member in (("seats", 0), ("seats.1", 1))}
        return {c: working(pool, c) for c in share} == share
    wait_for(shares_worked, 10, what="the members working the seats of their shares")
