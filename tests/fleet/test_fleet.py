"""A fleet of real crewletd nodes sharing one real broker (``stream.type: nats``).

Tests ask for ``natsd`` before ``make_node``, so the broker outlives the nodes
at teardown (fixtures are torn down in reverse order).

Timing constants are shortened by config (heartbeat 1 s, lease TTL 3 s,
sweep 0.5 s); the claim and release limits stay the design's (4 and 2).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter

import nats
import psutil
import pytest

from tests.conftest import CREWLETCTL, start_all, wait_for

pytestmark = pytest.mark.fleet

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
COMPANY = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "company.yaml")


def fleet_node(make_node, natsd, node_id: str, **overrides):
    cfg = {"node": {"id": node_id, **overrides.pop("node", {})},
           "stream": {"type": "nats", "servers": [natsd.url]},
           "fleet": {**FAST, **overrides.pop("fleet", {})}}
    return make_node(**cfg, **overrides)


def company(tmp: str, seats: int = 30, placed: dict[str, dict] | None = None) -> str:
    """A company file of *seats* seats (``s00``…), plus *placed* seats with
    their placement labels."""
    path = os.path.join(tmp, f"company-{seats}-{len(placed or {})}.yaml")
    with open(path, "w") as f:
        f.write("company: {name: t}\nproviders: {p: {kind: scripted}}\nseats:\n")
        f.writelines(f"  - {{name: s{i:02d}, persona: seat {i}, provider: p}}\n"
                     for i in range(seats))
        f.writelines(f"  - {{name: {name}, persona: placed, provider: p, "
                     f"placement: {{labels: {json.dumps(labels)}}}}}\n"
                     for name, labels in (placed or {}).items())
    return path


def apply(node, path: str = COMPANY) -> None:
    out = subprocess.run([*CREWLETCTL, "-c", node.config_path, "apply", path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def seats_of(node) -> dict[str, str]:
    """seat -> holding node, as this node's fleet view shows it."""
    st = node.status()
    fleet = (st or {}).get("fleet") or {}
    return {s["name"]: s["node"] for s in fleet.get("seats", [])}


def spread(node, seats: int = 30) -> Counter | None:
    """Seats held per node, once all *seats* are held (else None)."""
    held = seats_of(node)
    if len(held) != seats:
        return None
    return Counter(held[s] for s in held)


def test_a_single_node_holds_every_seat_and_every_duty(natsd, make_node):
    node = fleet_node(make_node, natsd, "solo").start()
    apply(node)  # the sample company, etc/company.yaml
    wait_for(lambda: len(seats_of(node)) == 30, 30, what="30 seats held")
    duties = {"collector": "solo", "fleet_shape": "solo", "learning": "solo", "maintenance": "solo",
              "reconcile": "solo", "scheduler": "solo"}
    wait_for(lambda: {d["name"]: d["node"] for d in node.status()["fleet"]["duties"]} == duties,
             10, what="every duty held")
    (me,) = node.status()["fleet"]["nodes"]
    assert me["id"] == "solo" and me["broker"] == "external" and me["applied"]["rev"] == 1
    assert len(me["seats"]) == 30 and me["duties"] == sorted(duties)


def test_thirty_seats_over_three_nodes_held_once_and_evenly(natsd, make_node, short_tmp):
    nodes = start_all([fleet_node(make_node, natsd, f"n{i}") for i in range(3)])
    apply(nodes[0], company(short_tmp))
    ids = [f"n{i}" for i in range(3)]

    def even():
        counts = spread(nodes[0])
        return counts if counts and all(9 <= counts[i] <= 11 for i in ids) else None
    counts = wait_for(even, 60, what="30 seats spread over 3 nodes")
    assert sum(counts.values()) == 30
    # Every node sees the same: each seat held exactly once, by one node.
    wait_for(lambda: seats_of(nodes[0]) == seats_of(nodes[1]) == seats_of(nodes[2]), 10,
             what="every node seeing the same owners")
    # The seats have no MCP servers: claims are not paced, yet nobody took
    # more than its share (every node's life was counted from the start).
    for node in nodes:
        claims = node.events_named("seat_claimed")
        assert len(claims) <= 11, (node.config["node"], len(claims))


def test_kill_9_of_a_node_moves_its_seats_within_ttl_and_two_sweeps(natsd, make_node, short_tmp):
    nodes = start_all([fleet_node(make_node, natsd, f"n{i}") for i in range(3)])
    apply(nodes[0], company(short_tmp))
    wait_for(lambda: spread(nodes[0]) and len(spread(nodes[0])) == 3, 60,
             what="every node holding seats")
    victim = nodes[2]
    wait_for(lambda: nodes[0].status()["fleet"]["duties"], 10, what="fleet_shape held")
    victim.kill_tree()
    t0 = time.monotonic()
    wait_for(lambda: (c := spread(nodes[0])) and set(c) == {"n0", "n1"}, 30,
             what="survivors holding all 30 seats")
    took = time.monotonic() - t0
    # TTL + two sweeps (orphans without MCP servers are claimed all at once).
    assert took < FAST["lease_ttl"] + 2 * FAST["sweep"] + 2, took
    wait_for(lambda: {d["name"]: d["node"] for d in nodes[0].status()["fleet"]["duties"]}
             .get("fleet_shape") in ("n0", "n1"), 15, what="fleet_shape held by a survivor")


def test_three_thousand_seats_of_a_killed_node_are_held_again_within_ttl_and_two_sweeps(
        natsd, make_node, short_tmp):
    """No claim pace for seats without MCP servers: a dead node's thousand
    seats move as fast as one did (issue 13)."""
    nodes = start_all([fleet_node(make_node, natsd, f"n{i}") for i in range(3)])
    apply(nodes[0], company(short_tmp, 3000))
    wait_for(lambda: spread(nodes[0], 3000) == {"n0": 1000, "n1": 1000, "n2": 1000}, 60,
             what="3,000 seats spread evenly")
    # Every node sees the same owners: no seat was claimed over a live holder.
    wait_for(lambda: seats_of(nodes[0]) == seats_of(nodes[1]) == seats_of(nodes[2]), 15,
             what="every node seeing the same owners")
    nodes[2].kill_tree()
    t0 = time.monotonic()
    wait_for(lambda: (c := spread(nodes[0], 3000)) and set(c) == {"n0", "n1"}, 30,
             what="survivors holding all 3,000 seats")
    took = time.monotonic() - t0
    # TTL + two sweeps, and the time two nodes take to claim 1,000 seats
    # between them (~1 s quiet, more beside other tests).
    assert took < FAST["lease_ttl"] + 2 * FAST["sweep"] + 5, took
    wait_for(lambda: seats_of(nodes[0]) == seats_of(nodes[1]), 15, what="both survivors agreeing")


def test_graceful_stop_hands_seats_over_before_the_ttl(natsd, make_node, short_tmp):
    slow = {"lease_ttl": 30}  # a TTL the hand-over must not wait for
    nodes = start_all([fleet_node(make_node, natsd, f"n{i}", fleet=slow) for i in range(2)])
    apply(nodes[0], company(short_tmp))
    wait_for(lambda: (c := spread(nodes[0])) and len(c) == 2, 60, what="both holding")
    t0 = time.monotonic()
    nodes[1].proc.send_signal(signal.SIGTERM)
    assert nodes[1].wait_exit(30) == 0
    wait_for(lambda: (c := spread(nodes[0])) and set(c) == {"n0"}, 20,
             what="the survivor holding all 30")
    assert time.monotonic() - t0 < 15  # well before the 30 s TTL


def test_a_second_node_with_the_same_id_is_refused_and_takes_nothing(natsd, make_node, short_tmp):
    first = fleet_node(make_node, natsd, "twin").start()
    apply(first, company(short_tmp, 6))
    wait_for(lambda: len(seats_of(first)) == 6, 30, what="6 seats held")
    tokens = {s["name"]: s["token"] for s in first.status()["fleet"]["seats"]}
    other = fleet_node(make_node, natsd, "twin")
    other.start(wait_ready=False)
    assert other.wait_exit(30) == 78
    assert "node id 'twin' is held by a live node" in other.read_log()
    # Its roles ran for a moment under the same id: they must not have taken
    # over the live node's seats (same tokens, no seat lost there).
    assert {s["name"]: s["token"] for s in first.status()["fleet"]["seats"]} == tokens
    assert "seat_lost" not in first.read_log()


def test_placement_labels_are_honoured(natsd, make_node, short_tmp):
    eu, _ = start_all([fleet_node(make_node, natsd, "eu", node={"labels": {"zone": "eu"}}),
                       fleet_node(make_node, natsd, "us", node={"labels": {"zone": "us"}})])
    apply(eu, company(short_tmp, 28, {"gdpr-1": {"zone": "eu"}, "gdpr-2": {"zone": "eu"}}))
    wait_for(lambda: len(seats_of(eu)) == 30, 60, what="30 seats held")
    held = seats_of(eu)
    assert held["gdpr-1"] == "eu" and held["gdpr-2"] == "eu"
    assert Counter(held.values())["us"] > 0


# crewletd must not end a child for the silence of a pause: what is tested is
# that the paused process fences itself on waking, by its own clock.
PATIENT = {"heartbeat_grace": 120, "wedge_after": 120}


def lost_since(node, mark: int) -> set[str]:
    """The seats *node* logged ``seat_lost`` for after its first *mark* events:
    a loaded start can drop a seat or two before the fault (CI saw one), and
    those are not what the fault made it lose."""
    return {e["seat"] for e in node.events()[mark:] if e.get("event") == "seat_lost"}


def test_a_paused_node_is_fenced_and_its_seats_taken(natsd, make_node, short_tmp):
    nodes = start_all([fleet_node(make_node, natsd, f"n{i}", supervisor=PATIENT) for i in range(2)])
    apply(nodes[0], company(short_tmp))
    wait_for(lambda: (c := spread(nodes[0])) and len(c) == 2, 60, what="both holding")
    zombie = nodes[1]
    before = {s: n for s, n in seats_of(nodes[0]).items() if n == "n1"}
    mark = len(zombie.events())
    tree = [psutil.Process(p) for p in zombie.tree_pids()]
    for proc in tree:
        proc.suspend()
    try:
        wait_for(lambda: (c := spread(nodes[0])) and set(c) == {"n0"}, 30,
                 what="the live node taking the paused node's seats")
    finally:
        for proc in tree:
            try:
                proc.resume()
            except psutil.NoSuchProcess:
                pass
    # Awake again, the zombie finds its leases gone and gives the seats up.
    lost = wait_for(lambda: lost_since(zombie, mark), 30, what="a seat_lost on waking")
    assert lost <= set(before)
    # Nobody holds a seat twice, and the fleet settles evenly again.
    wait_for(lambda: (c := spread(nodes[0])) and len(c) == 2, 60, what="resettled")
    # Both views are a watch of the same bucket, each a moment behind it while
    # seats still move to the fair share (CI saw one claim a view apart).
    wait_for(lambda: seats_of(nodes[0]) == seats_of(zombie), 30, what="both nodes seeing the same holders")


def test_a_seats_process_that_stops_renewing_loses_its_seats_and_holds_nothing_twice(
        natsd, make_node, short_tmp):
    """crewletd renews the node's presence; only its seats process is paused.
    The node is no seats-node while its seats process is not renewing: its
    peers take its seats within TTL + 2 sweeps, and on waking it drops them."""
    nodes = start_all([fleet_node(make_node, natsd, f"n{i}", supervisor=PATIENT) for i in range(2)])
    apply(nodes[0], company(short_tmp))
    # Settled first: seats still moving to the fair share would blur what it lost.
    wait_for(lambda: spread(nodes[0]) == {"n0": 15, "n1": 15}
             and seats_of(nodes[0]) == seats_of(nodes[1]), 60, what="15 seats each")
    stuck = nodes[1]
    before = {s for s, n in seats_of(nodes[0]).items() if n == "n1"}
    mark = len(stuck.events())
    seats = psutil.Process(stuck.process_pids()["seats"])
    seats.suspend()
    t0 = time.monotonic()
    try:
        wait_for(lambda: (c := spread(nodes[0])) and set(c) == {"n0"}, 30,
                 what="the live node taking the stuck seats process's seats")
        took = time.monotonic() - t0
        # Its presence stayed live all along: only the life lapsed.
        assert "n1" in {n["id"] for n in nodes[0].status()["fleet"]["nodes"]}
    finally:
        seats.resume()
    assert took < FAST["lease_ttl"] + 2 * FAST["sweep"] + 2, took
    # It drops every seat it held (one at a time, each handing its work back).
    wait_for(lambda: lost_since(stuck, mark) >= before, 30, what="every seat it held dropped on waking")
    # Awake, it begins a new life and takes its share back: each seat once.
    wait_for(lambda: (c := spread(nodes[0])) and len(c) == 2, 60, what="resettled")
    wait_for(lambda: seats_of(nodes[0]) == seats_of(stuck), 30, what="both nodes seeing the same holders")


def test_a_revision_reaches_every_node_and_a_bad_one_is_refused(natsd, make_node, short_tmp):
    nodes = start_all([fleet_node(make_node, natsd, f"n{i}") for i in range(2)])
    apply(nodes[0], company(short_tmp))

    def applied(rev):
        fleet = nodes[0].status()["fleet"]
        return all((n.get("applied") or {}).get("rev") == rev for n in fleet["nodes"]) \
            and len(fleet["nodes"]) == 2
    wait_for(lambda: applied(1), 30, what="revision 1 on both nodes")
    wait_for(lambda: len(seats_of(nodes[0])) == 30, 60, what="30 seats held")

    async def sneak_in_a_bad_revision():
        # What apply would refuse, written straight into the control plane.
        nc = await nats.connect(natsd.url)
        kv = await nc.jetstream().key_value("config")
        await kv.create("rev.2", json.dumps({"rev": 2, "company": {"seats": "nope"}}).encode())
        active = await kv.get("active")
        await kv.update("active", json.dumps({"rev": 2, "epoch": 2}).encode(),
                        last=active.revision)
        await nc.close()
    asyncio.run(sneak_in_a_bad_revision())
    for node in nodes:
        node.wait_event("company_refused", timeout=20, rev=2)
    # Each node says so in its presence, which the other sees a renewal later.
    def both_refused():
        fleet = nodes[0].status()["fleet"]
        return all(n["applied"]["rev"] == 1 and "revision 2" in (n["status_error"] or "")
                   for n in fleet["nodes"])
    wait_for(both_refused, 20, what="both nodes reporting revision 2 refused on revision 1")
    assert len(seats_of(nodes[0])) == 30  # still running revision 1


def test_fleet_role_unmanned_is_logged_when_no_node_runs_workers(natsd, make_node):
    a, _ = start_all([fleet_node(make_node, natsd, "a", node={"roles": ["data", "ingress", "seats"]}),
                      fleet_node(make_node, natsd, "b", node={"roles": ["data", "seats"]})])
    # a may say so first alone, before b joins; then again for both.
    ev = a.wait_event("fleet_role_unmanned", timeout=20, nodes=["a", "b"])
    assert ev["roles"] == ["workers"]


def test_start_with_a_company_seeds_an_empty_fleet_only(natsd, make_node, short_tmp):
    first = fleet_node(make_node, natsd, "a").start()
    assert first.status()["fleet"]["company"] is None
    # A node started with --company seeds the fleet, which had none...
    second = fleet_node(make_node, natsd, "b").start(
        wait_ready=False, args=("--company", company(short_tmp, 4)))
    second.wait_event("company_seeded", timeout=30)
    wait_for(lambda: (first.status()["fleet"]["company"] or {}).get("rev") == 1, 20,
             what="the seeded company reaching the first node")
    # ...and a node started later with another --company does not override it.
    third = fleet_node(make_node, natsd, "c").start(args=("--company", company(short_tmp, 6)))
    wait_for(lambda: (third.status()["fleet"]["company"] or {}).get("rev") == 1, 20,
             what="the third node on revision 1")
    assert "company_seeded" not in third.read_log()
