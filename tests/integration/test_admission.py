"""Admission reads the freshness of the last renew (roles/seats/sweeper.py).

A node whose seats' life was last renewed longer ago than a heartbeat takes
no new turn: mail that arrives meanwhile waits in its mailbox, and is worked
once a renewal is fresh again. The renewals are held back by a fault
(``debug.faults`` kind ``late``), for less than the lease's TTL: the node
keeps its seats, it only may not act on them.
"""

from __future__ import annotations

import time

from tests.conftest import wait_for
from tests.seats import ctl_json, held, node_url, read_nats, turn_records, write_company

HEARTBEAT = 1.0
LATE = 4.0      # seconds the renewals are held back: well past a heartbeat, well within the TTL
FLEET = {"heartbeat": HEARTBEAT, "lease_ttl": 15, "sweep": 0.5}
AFTER = 6.0     # seconds after the seats role is ready: the seat is held by then
COMPANY = """
company: {name: t}
providers: {p: {kind: scripted, rules: [{match: '.*', reply: 'ok'}]}}
seats:
  - {name: w, persona: works, provider: p}
"""


def _event(node, name: str) -> dict | None:
    return next(iter(node.events_named(name)), None)


def test_late_renewals_hold_every_turn_back_until_a_renewal_is_fresh(make_node):
    node = make_node(fleet=FLEET, debug={"faults": [{"role": "seats", "kind": "late", "after": AFTER,
                                                     "seconds": LATE}]})
    node.start(args=("--company", write_company(node.dir, COMPANY)))
    wait_for(lambda: held(node).get("w"), 30, what="seat w held")
    turn = ctl_json(node, "send", "w", "before", "--wait", "20")["turn"]
    assert turn["outcome"] == "done", turn

    began = wait_for(lambda: (e := _event(node, "fault_injected")) and e.get("kind") == "late" and e,
                     AFTER + 10, what="the renewals held back")
    # Past a heartbeat since the last renewal, whatever its phase: not admitted from here.
    wait_for(lambda: time.time() > began["ts"] + 1.5 * HEARTBEAT, 10, interval=0.05)
    sent = ctl_json(node, "send", "w", "meanwhile", "--trigger", "meanwhile")
    assert sent["seq"] >= 1
    over = wait_for(lambda: _event(node, "fault_late_over"), LATE + 10, what="the renewals going again")

    def worked():
        return next((r for r in read_nats(node_url(node), turn_records)
                     if r["trigger"] == "meanwhile" and r["outcome"] == "done"), None)
    record = wait_for(worked, 20, what="the mail worked once the renewals were fresh")
    # Held back while the renewals were late; started only after they went again.
    assert record["started_at"] >= over["ts"] - 0.05, (record["started_at"], over["ts"])
    assert held(node).get("w") == node.config["node"]["id"], "the seat was kept throughout"
    assert not node.events_named("seat_lost")
