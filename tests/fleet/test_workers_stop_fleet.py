"""The last node of a three-member cluster stops its workers in time.

What the chaos test met at its end (tests/fleet/test_chaos.py): the nodes
were SIGTERMed one after the other, and the last one up — its broker alone,
so JetStream without quorum — had its ``workers`` child SIGKILLed at its 5 s
shutdown timeout: every duty lease renewal it tried waited out its patience
(a third of the TTL), duty after duty, before the runner looked at its stop.

Three data nodes running workers (their brokers one R3 cluster) at the chaos
test's lease TTL; the two that hold no duty are stopped, so the one holding
the duties is left without quorum and fails its renewals; then it is
SIGTERMed, and its workers must exit 0 within the shutdown time.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.conftest import wait_for
from tests.fleet.test_cluster import make_members, start_alone

pytestmark = pytest.mark.fleet

SHUTDOWN = 5  # the chaos test's supervisor.shutdown_timeout
FLEET = {"heartbeat": 1, "lease_ttl": 10, "sweep": 0.5}
DUTIES = {"fleet_shape", "maintenance", "scheduler"}  # no smtp.host: no sender


def _held(node) -> set[str]:
    """The duties *node* runs now, by its own events."""
    held: set[str] = set()
    for e in node.events():
        if e.get("event") == "duty_started":
            held.add(e["duty"])
        elif e.get("event") == "duty_stopped":
            held.discard(e["duty"])
    return held


@pytest.mark.timeout(180)
def test_the_last_member_up_without_quorum_stops_its_workers_within_the_shutdown_time(make_node):
    def data_and_workers(**config):
        return make_node(**{**config, "node": {**config["node"], "roles": ["data", "workers"]}})

    nodes, _ = make_members(data_and_workers, ids=("wa", "wb", "wc"), cluster="workstop",
                            fleet=FLEET, supervisor={"shutdown_timeout": SHUTDOWN})
    for node in nodes:
        start_alone(node)
    for node in nodes:
        node.wait_running(timeout=60)
    wait_for(lambda: set().union(*(_held(n) for n in nodes)) >= DUTIES, 60, what="every duty held")
    holder = max(nodes, key=lambda n: len(_held(n)))
    assert _held(holder), "no node holds a duty"
    for node in nodes:
        if node is not holder:
            node.proc.send_signal(signal.SIGTERM)
            assert node.wait_exit(60) == 0, node.read_log()[-3000:]
    # Alone: its renewals go unanswered, and it keeps trying every heartbeat.
    seen = len(holder.events())
    wait_for(lambda: any(e.get("event") == "duty_lease_unknown" for e in holder.events()[seen:]),
             30, what="a duty lease renewal unanswered")
    seen = len(holder.events())
    started = time.monotonic()
    holder.proc.send_signal(signal.SIGTERM)

    def workers_stopped():
        return [e for e in holder.events()[seen:]
                if e.get("event") == "child_stopped" and e.get("child") == "workers"]
    stopped = wait_for(workers_stopped, SHUTDOWN + 10, what="workers stopped")[0]
    took = time.monotonic() - started
    assert holder.wait_exit(60) == 0, holder.read_log()[-3000:]
    events = holder.events()[seen:]
    said = "\n".join(json.dumps(e) for e in events if e.get("role") == "workers")
    overdue = [e for e in events if e.get("event") == "shutdown_timeout" and e.get("child") == "workers"]
    assert not overdue, f"{overdue}; workers said while stopping:\n{said}"
    assert stopped.get("code") == 0 and stopped.get("signal") is None, f"{stopped}\n{said}"
    assert took < SHUTDOWN, f"workers took {took:.1f}s to stop"
