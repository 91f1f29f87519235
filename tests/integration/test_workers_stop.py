"""The workers role stops within its shutdown time whatever its broker does.

What the chaos test met (tests/fleet/test_chaos.py): the last node of a
three-member cluster, its peers gone and so JetStream without quorum, was
SIGTERMed and its ``workers`` child did not stop within its 5 s: every
duty's lease renewal waited out its own patience, one duty after the other,
before the runner looked at its stop, and the releases after them waited
their own timeouts again.

Here the node's broker (a real nats-server, ``stream.type: nats``) is
SIGSTOPped: every request then goes unanswered, as without quorum, and the
connection stays up. Once the runner has found one renewal unanswered (so
it is in the middle of tending the duties), crewletd gets SIGTERM; workers
must exit 0 within its shutdown time, with no ``shutdown_timeout``.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.conftest import wait_for
from tests.fleet.test_fleet import fleet_node

SHUTDOWN = 5  # the chaos test's supervisor.shutdown_timeout
# The chaos test's fleet timings but a faster heartbeat: the runner renews
# every duty's lease each second, and each unanswered renewal waits its
# patience (a third of the TTL), so the runner is always inside one.
FLEET = {"heartbeat": 1, "lease_ttl": 10, "sweep": 0.5}


def _events_after(node, since: int, name: str, **match):
    return [e for e in node.events()[since:]
            if e.get("event") == name and all(e.get(k) == v for k, v in match.items())]


@pytest.mark.timeout(120)
def test_workers_stop_within_their_shutdown_time_while_the_broker_answers_nothing(natsd, make_node):
    node = fleet_node(make_node, natsd, "ws", node={"roles": ["data", "workers"]}, fleet=FLEET,
                      supervisor={"shutdown_timeout": SHUTDOWN}).start()
    node.wait_event("duty_started", 30, duty="scheduler")
    node.wait_event("duty_started", 30, duty="maintenance")
    node.wait_event("duty_started", 30, duty="fleet_shape")
    seen = len(node.events())
    os.kill(natsd.proc.pid, signal.SIGSTOP)
    try:
        # A renewal went unanswered: the runner is now tending the next duty.
        wait_for(lambda: _events_after(node, seen, "duty_lease_unknown"), 30,
                 what="a duty lease renewal unanswered")
        seen = len(node.events())
        started = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        stopped = wait_for(lambda: _events_after(node, seen, "child_stopped", child="workers"),
                           SHUTDOWN + 10, what="workers stopped")[0]
        took = time.monotonic() - started
    finally:
        os.kill(natsd.proc.pid, signal.SIGCONT)
    assert node.wait_exit(60) == 0, node.read_log()[-3000:]
    overdue = [e for e in _events_after(node, seen, "shutdown_timeout") if e.get("child") == "workers"]
    workers = "\n".join(json.dumps(e) for e in node.events()[seen:] if e.get("role") == "workers")
    assert not overdue, f"{overdue}; workers said while stopping:\n{workers}"
    assert stopped.get("code") == 0 and stopped.get("signal") is None, f"{stopped}\n{workers}"
    assert took < SHUTDOWN, f"workers took {took:.1f}s to stop"
