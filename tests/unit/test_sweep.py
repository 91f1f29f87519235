"""The sweep decision, simulated over a fleet of nodes taking turns."""

from __future__ import annotations

from crewlet.coord.sweep import NodeShare, NodeView, Plan, SeatView, cost, fair_share, may_hold, plan

LIMITS = {"spawns": 4, "spawn_limit": 4, "releases": 2}


def simulate(nodes: list[NodeView], seats: list[SeatView], owners: dict[str, str],
             rounds: int) -> list[list[Plan]]:
    """Every node sweeps once per round, in turn, against the shared owners map."""
    history = []
    for _ in range(rounds):
        plans = []
        for node in nodes:
            held = {s for s, n in owners.items() if n == node.id}
            p = plan(node, seats, nodes, owners, held, **LIMITS)
            spent = sum(cost(next(s for s in seats if s.name == c), 4) for c in p.claim)
            assert spent <= LIMITS["spawns"] and len(p.release) <= LIMITS["releases"]
            for seat in p.release:
                del owners[seat]
            for seat in p.claim:
                owners.setdefault(seat, node.id)  # a claim fails if somebody got there first
            plans.append(p)
        history.append(plans)
    return history


def counts(owners: dict[str, str], nodes: list[NodeView]) -> dict[str, int]:
    return {n.id: sum(1 for o in owners.values() if o == n.id) for n in nodes}


def test_thirty_seats_over_three_nodes_converge_evenly():
    nodes = [NodeView(f"n{i}") for i in range(3)]
    seats = [SeatView(f"s{i:02d}") for i in range(30)]
    owners: dict[str, str] = {}
    simulate(nodes, seats, owners, rounds=3)
    assert len(owners) == 30
    assert counts(owners, nodes) == {"n0": 10, "n1": 10, "n2": 10}
    # Settled: another round changes nothing.
    before = dict(owners)
    simulate(nodes, seats, owners, rounds=1)
    assert owners == before


def test_a_dead_nodes_seats_are_absorbed_by_the_survivors():
    nodes = [NodeView(f"n{i}") for i in range(3)]
    seats = [SeatView(f"s{i:02d}") for i in range(30)]
    owners: dict[str, str] = {}
    simulate(nodes, seats, owners, rounds=3)
    survivors = nodes[:2]
    owners = {s: n for s, n in owners.items() if n != "n2"}  # its leases lapsed
    simulate(survivors, seats, owners, rounds=2)  # 10 orphans, 2 × 4 claims per round
    assert len(owners) == 30 and counts(owners, survivors) == {"n0": 15, "n1": 15}


def test_a_new_node_takes_its_share_without_anybody_releasing_too_fast():
    nodes = [NodeView(f"n{i}") for i in range(2)]
    seats = [SeatView(f"s{i:02d}") for i in range(30)]
    owners: dict[str, str] = {}
    simulate(nodes, seats, owners, rounds=4)
    nodes.append(NodeView("n2"))
    history = simulate(nodes, seats, owners, rounds=6)
    assert all(len(p.release) <= 2 for plans in history for p in plans)
    assert sorted(counts(owners, nodes).values()) == [10, 10, 10]


def test_placement_is_honoured_and_weighs_on_the_share():
    nodes = [NodeView("eu", {"zone": "eu"}), NodeView("us1", {"zone": "us"}),
             NodeView("us2", {"zone": "us"})]
    seats = [SeatView(f"s{i:02d}") for i in range(28)] + \
        [SeatView("gdpr1", {"zone": "eu"}), SeatView("gdpr2", {"zone": "eu"})]
    assert fair_share(nodes[0], seats, nodes) == 12  # 2 × 1 + 28 / 3
    assert fair_share(nodes[1], seats, nodes) == 10
    owners: dict[str, str] = {}
    simulate(nodes, seats, owners, rounds=5)
    assert owners["gdpr1"] == "eu" and owners["gdpr2"] == "eu"
    assert len(owners) == 30
    for seat, node in owners.items():
        assert may_hold(next(s for s in seats if s.name == seat),
                        next(n for n in nodes if n.id == node))


def test_seats_a_node_may_no_longer_hold_are_released_first():
    me = NodeView("n0", {"zone": "us"})
    seats = [SeatView("a"), SeatView("b", {"zone": "eu"})]
    p = plan(me, seats, [me], owners={"a": "n0", "b": "n0", "gone": "n0"},
             held={"a", "b", "gone"}, **LIMITS)
    assert p.release == ["b", "gone"] and p.claim == []


def test_nodes_starting_together_try_different_seats_first():
    nodes = [NodeView(f"n{i}") for i in range(3)]
    seats = [SeatView(f"s{i:02d}") for i in range(30)]
    first = [plan(n, seats, nodes, {}, set(), **LIMITS).claim[:4] for n in nodes]
    overlap = set(first[0]) & set(first[1]) | set(first[1]) & set(first[2])
    assert len(overlap) <= 2, first


def test_seats_without_servers_are_claimed_at_once_and_spawns_are_paced():
    me = NodeView("n0")
    cheap = [SeatView(f"c{i:04d}") for i in range(2000)]
    p = plan(me, cheap, [me], {}, set(), **LIMITS)
    assert len(p.claim) == 2000  # one KV write each: nothing to pace
    costly = [SeatView(f"m{i:02d}", cost=1) for i in range(20)]
    p = plan(me, cheap + costly, [me], {}, set(), **LIMITS)
    assert len(p.claim) == 2004 and sum(s.startswith("m") for s in p.claim) == 4
    # A window already spent claims servers-free seats only.
    p = plan(me, cheap + costly, [me], {}, set(), spawns=0, spawn_limit=4, releases=2)
    assert len(p.claim) == 2000
    # A seat with more servers than a window holds takes a whole window.
    p = plan(me, [SeatView("big", cost=9), SeatView("two", cost=2)], [me], {}, set(), **LIMITS)
    assert p.claim == ["big"] or p.claim == ["two"]


def test_the_share_still_bounds_what_cheap_claims_take():
    nodes = [NodeView(f"n{i}") for i in range(3)]
    seats = [SeatView(f"s{i:04d}") for i in range(3000)]
    p = plan(nodes[0], seats, nodes, {}, set(), **LIMITS)
    assert len(p.claim) == 1000


def _pool_sweep(me: NodeView, mine: list[SeatView], every: list[SeatView], nodes: list[NodeView],
                owners: dict[str, str], held: set[str], size: int, **limits) -> Plan:
    """One pool member's sweep, as roles/seats/sweeper.py plans it."""
    node_held = sum(1 for o in owners.values() if o == me.id)
    return plan(me, mine, nodes, owners, held, **limits,
                pool=NodeShare(fair_share(me, every, nodes), node_held, size - 1))


def test_a_pool_beside_a_node_that_took_a_skewed_half_still_holds_every_seat():
    """The other node holds 15 of 30 — 4 of member 0's subset of 12, 11 of member
    1's of 18 — so member 0's own share (6) leaves 2 of its seats to nobody.
    The pool's members take them while the node is short of its share, and
    nothing is then given back and taken again."""
    pool, solo = NodeView("pool"), NodeView("solo")
    nodes = [pool, solo]
    every = [SeatView(f"s{i:02d}") for i in range(30)]
    subsets = [every[:12], every[12:]]
    owners = {s.name: "solo" for s in subsets[0][:4] + subsets[1][:11]}
    held = [set(), set()]
    for rounds in range(20):
        for member in (0, 1):
            p = _pool_sweep(pool, subsets[member], every, nodes, owners, held[member], 2, **LIMITS)
            for seat in p.release:
                del owners[seat]
                held[member].discard(seat)
            for seat in p.claim:
                if owners.setdefault(seat, "pool") == "pool":
                    held[member].add(seat)
        if len(owners) == 30:
            break
    assert len(owners) == 30, f"unheld after {rounds + 1} sweeps: {sorted(s.name for s in every if s.name not in owners)}"
    assert counts(owners, nodes) == {"pool": 15, "solo": 15}
    before = dict(owners)
    for _ in range(10):
        for member in (0, 1):
            p = _pool_sweep(pool, subsets[member], every, nodes, owners, held[member], 2, **LIMITS)
            assert not p.claim and not p.release, p
    assert owners == before
    # Planned over their subsets alone, the members leave member 0's two to nobody.
    owners = {s.name: "solo" for s in subsets[0][:4] + subsets[1][:11]}
    for _ in range(20):
        for member in (0, 1):
            held_now = {s.name for s in subsets[member] if owners.get(s.name) == "pool"}
            for seat in plan(pool, subsets[member], nodes, owners, held_now, **LIMITS).claim:
                owners.setdefault(seat, "pool")
    assert len(owners) == 28
