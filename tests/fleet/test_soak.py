"""Nothing on the broker grows with time or with sweeps (issue 10).

Two real nodes on one real nats-server, sweeping every 0.5 s (ten times the
design's pace), the sample company, a seats child SIGKILLed once: after a
warm-up, no stream's consumer count may grow. Before issue 10 every sweep
left two consumers on ``KV_leases`` for five minutes: +120 per node in the
30 s watched here. The long version is ``bench/soak.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import nats
import pytest

from crewlet.coord.buckets import WATCH_INACTIVE
from tests.conftest import start_all, wait_for
from tests.fleet.test_fleet import apply, fleet_node, seats_of

pytestmark = pytest.mark.fleet

WATCHED = 30.0  # seconds of sweeping after the warm-up
LINGERING = 2   # watches a seats process keeps on one bucket, left behind when it is killed


def consumers(url: str) -> dict[str, int]:
    async def read():
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
        try:
            return {i.config.name: i.state.consumer_count
                    for i in await nc.jetstream(timeout=5).streams_info()}
        finally:
            await nc.close()
    return asyncio.run(read())


def test_no_streams_consumers_grow_while_a_fleet_sweeps(natsd, make_node):
    nodes = start_all([fleet_node(make_node, natsd, f"n{i}") for i in range(2)])
    apply(nodes[0])  # the sample company, etc/company.yaml
    wait_for(lambda: len(seats_of(nodes[0])) == 30 and len(set(seats_of(nodes[0]).values())) == 2,
             60, what="30 seats held over both nodes")
    # Warm: every process has opened what it keeps open, and whatever was
    # short-lived has gone (a watch lingers WATCH_INACTIVE at most).
    time.sleep(WATCH_INACTIVE + 2)  # a pace, not a condition: what lingers needs this long to go
    warm = consumers(natsd.url)
    seats_pid = nodes[1].process_pids()["seats"]
    os.kill(seats_pid, signal.SIGKILL)  # its successor opens its watches anew
    nodes[1].wait_running(exclude={"seats": seats_pid})
    seen = [warm]
    deadline = time.monotonic() + WATCHED
    while time.monotonic() < deadline:
        time.sleep(2)
        seen.append(consumers(natsd.url))
    # The killed process's watch goes within its inactive threshold.
    settled = wait_for(lambda: (now := consumers(natsd.url)) and all(
        now.get(s, 0) <= warm.get(s, 0) for s in now) and now, WATCH_INACTIVE + 10,
        what=f"every stream back to its warm count {warm}")
    most = {s: max(c.get(s, 0) for c in seen) for s in warm}
    # While the killed child's watches linger beside its successor's: as many
    # more as it kept on a bucket (its lease holders and its estate view's
    # watches: one on leases, two on status), no more.
    grown = {s: (warm[s], most[s]) for s in warm if most[s] > warm[s] + LINGERING}
    assert not grown, f"consumers grew (warm, most): {grown}; all: {most}"
    # Per node on leases: one watch each of crewletd, seats, workers and ingress
    # (their Holders; the estate views read their presences from them), and the
    # data applier's estate view (which copy makes the snapshots).
    assert settled.get("KV_leases", 0) <= 2 * 5, settled
    for stream in ("KV_leases", "KV_config", "KV_status", "ESTATE", "EVENTS", "DLQ"):
        assert stream in warm, warm
