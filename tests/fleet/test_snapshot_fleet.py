"""Snapshots and the log's trim across real nodes (crewlet/estate/snapshot.py,
roles/data_applier/snapshots.py, roles/workers/duties/log_trim.py).

Three data nodes apply a log; the lowest in service puts snapshots in the
files store; the maintenance duty trims the log up to what all applied, never
past the newest snapshot. One of them stops, and the log is trimmed past it. A
fourth data node that joins after the trim, and the stopped one back with its
rows below the log, start from the snapshot, follow the log from there, and
their copies are byte for byte their peers' (the digest of every replicated
table)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import nats
import pytest

from crewlet.estate import log as estate_log
from crewlet.estate import store
from tests.conftest import wait_for
from tests.estate import applied, copy_of, log_last, publish_to, random_log, run
from tests.fleet.test_fleet import fleet_node

pytestmark = pytest.mark.fleet

UPKEEP = {"snapshot_every": 200, "trim_every": 1}


def _bounds_and_snapshots(url: str) -> tuple[int, list[dict]]:
    async def read():
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            first = (await js.stream_info(estate_log.STREAM)).state.first_seq
            try:
                raw = (await (await js.key_value("objects")).get("snapshots")).value
            except Exception:
                return first, []
            return first, json.loads(raw)["snapshots"]
        finally:
            await nc.close()
    return asyncio.run(read())


def test_a_fourth_data_node_joining_after_the_trim_starts_from_a_snapshot_and_matches_its_peers(
        natsd, make_node):
    a = fleet_node(make_node, natsd, "a", node={"roles": ["data", "workers"]}, estate=UPKEEP).start()
    b = fleet_node(make_node, natsd, "b", node={"roles": ["data"]}, estate=UPKEEP).start()
    c = fleet_node(make_node, natsd, "c", node={"roles": ["data"]}, estate=UPKEEP).start()
    wait_for(lambda: all(copy_of(n) is not None for n in (a, b, c)), 20, what="three copies made")
    run(publish_to(natsd.url, random_log(21, 900)))
    last = run(log_last(natsd.url))
    wait_for(lambda: all(applied(n) >= last for n in (a, b, c)), 60, what="the copies applied the log")

    # A snapshot by the lowest id in service (a), and the log trimmed up to it.
    wait_for(lambda: (s := _bounds_and_snapshots(natsd.url)) and s[1] and s[0] > 1, 60,
             what="a snapshot made and the log trimmed")
    first, snaps = _bounds_and_snapshots(natsd.url)
    assert {s["node"] for s in snaps} == {"a"}
    assert first - 1 <= max(s["seq"] for s in snaps)  # never trimmed past the newest snapshot
    wait_for(lambda: "estate_log_trimmed" in a.read_log(), 5, what="the trim said")

    # b stops; the log goes on and is trimmed past what b applied (b, away, does not hold it back).
    os.kill(b.proc.pid, signal.SIGTERM)
    assert b.wait_exit(60) == 0
    b_applied = applied(b)  # read once it stopped: its applier may commit up to its last moment
    run(publish_to(natsd.url, random_log(22, 450)))
    wait_for(lambda: _bounds_and_snapshots(natsd.url)[0] > b_applied + 1, 60,
             what="the log trimmed past b's copy")

    # A fourth data node, and b back with its rows below the log: both start from the snapshot.
    d = fleet_node(make_node, natsd, "d", node={"roles": ["data"]}, estate=UPKEEP).start()
    b.start()
    # This process's handle on b's copy is the replaced file's (LMDB: one handle per path).
    store.close_env(copy_of(b))
    last = run(log_last(natsd.url))
    try:
        wait_for(lambda: all(applied(n) >= last for n in (a, b, c, d)), 60,
                 what="the new copy and b's caught up")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: applied a {applied(a)}, b {applied(b)}, c {applied(c)}, d {applied(d)} "
                             f"of {last}\nb: {b.read_log()[-2500:]}\nd: {d.read_log()[-2500:]}") from None
    wait_for(lambda: "estate_bootstrapped" in d.read_log(), 5, what="d started from the snapshot")
    # crewletd forwards a child's lines up to supervisor.process.FORWARD_EVERY late.
    wait_for(lambda: f'"replaced":{b_applied}' in b.read_log().replace(" ", ""), 5,
             what=f"b's copy (applied {b_applied}) replaced by the snapshot")
    digests = {n.config["node"]["id"]: store.digest(copy_of(n)) for n in (a, b, c, d)}
    assert len(set(digests.values())) == 1, digests
    # The new copy serves.
    wait_for(lambda: _record(natsd.url, "d").get("in_service") is True, 20, what="d's copy in service")


def _record(url: str, node: str) -> dict:
    async def read():
        nc = await nats.connect(url)
        try:
            return json.loads((await (await nc.jetstream().key_value("status")).get(f"estate.{node}")).value)
        finally:
            await nc.close()
    return asyncio.run(read())


LAG = 8.0  # seconds b's copy applies nothing (debug.faults kind lag), its node otherwise well


def test_the_trim_waits_for_a_copy_in_service_that_has_not_applied(natsd, make_node):
    """The trim goes no further than what every copy in service has applied:
    while b's applier holds back (in service, its process well), a applies
    the whole log and makes a snapshot, and the log keeps every entry b has
    not applied; once b catches up, the trim goes on past it."""
    from tests.conftest import start_all
    a, b = start_all([
        fleet_node(make_node, natsd, "a", node={"roles": ["data", "workers"]}, estate=UPKEEP),
        fleet_node(make_node, natsd, "b", node={"roles": ["data"]}, estate=UPKEEP,
                   debug={"faults": [{"role": "data_applier", "kind": "lag", "seconds": LAG}]})])
    began = wait_for(lambda: next(iter(b.events_named("fault_injected", kind="lag")), None), 20, what="b's copy held back")
    held_at = applied(b)
    run(publish_to(natsd.url, random_log(23, 450)))
    last = run(log_last(natsd.url))
    wait_for(lambda: applied(a) >= last, 30, what="a applied the log")
    wait_for(lambda: _bounds_and_snapshots(natsd.url)[1], 30, what="a snapshot made by a")
    checks = 0
    while not any(e.get("event") == "fault_lag_over" for e in b.events()):
        assert time.time() < began["ts"] + LAG + 10, "b's lag never ended"
        first, _ = _bounds_and_snapshots(natsd.url)
        assert first <= applied(b) + 1, f"trimmed to {first} past b's copy at {applied(b)}"
        assert _record(natsd.url, "b").get("in_service") is True
        checks += 1
        time.sleep(0.25)
    assert checks >= 4, checks
    # Caught up, b no longer holds it back: the log is trimmed past where b was.
    wait_for(lambda: applied(b) >= last, 30, what="b caught up")
    wait_for(lambda: _bounds_and_snapshots(natsd.url)[0] > held_at + 1, 30, what="the log trimmed past b's old place")
