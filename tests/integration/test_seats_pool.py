"""The seats pool (roles/seats/pool.py) on one real node: several seats
processes, each holding a stable share of the node's seats under the node's
one life.

Each test starts a real crewletd with ``node.seats_processes: 2`` (embedded
nats-server, real roles, real SIGKILLs) and reads what landed on the broker.
"""

from __future__ import annotations

import os
import random
import signal
import time

from roles.seats.pool import member_of
from tests.conftest import wait_for
from tests.seats import (ctl, ctl_json, held, ledger_keys, mail_of, node_url, read_nats, seats_stats,
                         send_all, worker_company, write_company)

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5, "claims_per_sweep": 8}
POOL = {"id": "t1", "seats_processes": 2, "max_concurrent": 8}
WORKERS = [f"w{i}" for i in range(6)]


def company(nap: float) -> str:
    """Six worker seats whose turns nap in their own MCP server, then send
    "job N done" to a sink nobody may hold: the sink counts the side effects."""
    return worker_company(nap, tuple(WORKERS))


def members(node) -> dict[str, dict]:
    """The pool's children by name, with their last stats."""
    return {c["name"]: c for c in (node.status() or {}).get("children", [])
            if c["name"].partition(".")[0] == "seats"}


def tokens(node) -> dict[str, int]:
    """seat -> its lease's fencing token, as the node's fleet view shows it."""
    st = node.status() or {}
    return {s["name"].removeprefix("seat."): s["token"]
            for s in ((st.get("fleet") or {}).get("seats") or [])}


def worked_by(node) -> dict[str, str]:
    """seat -> the member whose stats show a turn of it finished."""
    out = {}
    for name, child in members(node).items():
        for seat, row in ((child.get("stats") or {}).get("seats") or {}).items():
            if row.get("turns"):
                out[seat] = name
    return out


def test_a_pool_shares_the_seats_by_a_stable_hash_and_works_them_all(make_node):
    """Two seats processes; each seat is held and worked by the member its
    name hashes to; the node's status adds the pool up."""
    node = make_node(node=POOL, fleet=FAST)
    path = write_company(node.dir, company(nap=0.05))
    node.start(args=("--company", path))
    assert set(members(node)) == {"seats", "seats.1"}
    wait_for(lambda: all(held(node).get(w) == "t1" for w in WORKERS), 30, what="every worker held")
    wait_for(lambda: seats_stats(node).get("held") == len(WORKERS), 10, what="the pool's held seats")
    assert seats_stats(node)["max_concurrent"] == POOL["max_concurrent"]  # 4 + 4

    send_all(node, [(w, f"job {i}", f"job-{i}") for i, w in enumerate(WORKERS)])
    wait_for(lambda: len(read_nats(node_url(node), ledger_keys)) == len(WORKERS), 30,
             what="every job in the ledger")
    wait_for(lambda: len(worked_by(node)) == len(WORKERS), 10, what="each seat's turn in its member's stats")
    expected = {w: "seats" if member_of(w, 2) == 0 else "seats.1" for w in WORKERS}
    assert worked_by(node) == expected
    # Both members work (the names were chosen so each has a share).
    assert set(expected.values()) == {"seats", "seats.1"}
    wait_for(lambda: seats_stats(node).get("turns") == len(WORKERS), 5, what="the pool's turns added up")
    sink = read_nats(node_url(node), lambda nc, js: mail_of("sink", nc, js))
    assert sorted(sink) == sorted(f"job {i} done" for i in range(len(WORKERS)))


def test_a_member_killed_mid_turn_loses_nothing_duplicates_nothing_and_keeps_its_share(make_node):
    """SIGKILL a pool member in the middle of turns, several times: every job
    is worked exactly once (one ledger entry, one side effect each), the
    killed member's successor adopts its share under the same tokens, and
    the other member's seats never change hands."""
    jobs = 36
    node = make_node(node=POOL, fleet=FAST)
    path = write_company(node.dir, company(nap=0.4))
    node.start(args=("--company", path))
    wait_for(lambda: all(held(node).get(w) == "t1" for w in WORKERS), 30, what="every worker held")
    before = tokens(node)
    send_all(node, [(WORKERS[i % len(WORKERS)], f"job {i}", f"job-{i}") for i in range(jobs)])

    rng = random.Random(11)
    kills: dict[str, int] = {}
    url = node_url(node)

    def running_member():
        if len(read_nats(url, ledger_keys)) == jobs:
            return "done"
        running = [n for n, c in members(node).items() if (c.get("stats") or {}).get("running")]
        return rng.choice(sorted(running)) if running else None

    while sum(kills.values()) < 4:
        victim = wait_for(running_member, 30, what="a member running a turn")
        if victim == "done":
            break
        pid = node.process_pids()[victim]
        time.sleep(rng.uniform(0.0, 0.3))  # a random point in the turn, not a wait for anything
        os.kill(pid, signal.SIGKILL)
        kills[victim] = kills.get(victim, 0) + 1
        node.wait_running(exclude={victim: pid})
        # Its share is its own again at once, under the same tokens: adopted,
        # not claimed anew (no other member or node took a seat meanwhile).
        assert tokens(node) == before, (victim, before, tokens(node))
    assert sum(kills.values()) >= 3, "the jobs finished before the pool could be killed a few times"

    wait_for(lambda: len(read_nats(url, ledger_keys)) == jobs, 60, what="every job in the ledger")
    assert read_nats(url, ledger_keys) == {f"job-{i}" for i in range(jobs)}
    sink = read_nats(url, lambda nc, js: mail_of("sink", nc, js))
    assert sorted(sink) == sorted(f"job {i} done" for i in range(jobs)), sink
    assert tokens(node) == before
    # Nothing pending or in flight once the last acks are in.
    def left() -> list[tuple[int, int]]:
        return [(r["pending"], r["in_flight"]) for r in ctl_json(node, "seats")["seats"]
                if r["seat"] in WORKERS]
    wait_for(lambda: set(left()) == {(0, 0)}, 20, what="nothing pending or in flight")
    # Each member only ever worked its own share.
    assert worked_by(node) == {w: "seats" if member_of(w, 2) == 0 else "seats.1"
                               for w in worked_by(node)}


def test_the_node_stopping_frees_every_seat_of_the_pool_in_one_write(make_node):
    """A member restarted alone keeps the life (its successor adopts its share);
    the node's stop ends it, so every seat is free for the fleet at once."""
    node = make_node(node=POOL, fleet=FAST)
    path = write_company(node.dir, company(nap=0.05))
    node.start(args=("--company", path))
    wait_for(lambda: all(held(node).get(w) == "t1" for w in WORKERS), 30, what="every worker held")
    before = tokens(node)
    out = ctl(node, "restart", "seats.1")
    assert out.returncode == 0 and "restarted seats.1" in out.stdout, out.stderr
    wait_for(lambda: seats_stats(node).get("held") == len(WORKERS), 20, what="the share adopted again")
    assert tokens(node) == before
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(30) == 0
    assert node.events_named("seats_life_ended")
