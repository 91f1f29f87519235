"""A company of ~25 MB of JSON applies on a fleet of three data nodes whose
embedded brokers are one R3 cluster (issue 13).

``crewletctl apply`` through one node stores it in parts in the R3 ``config``
bucket; every node reads it whole from the stream's leader, ensures the
seats' mailboxes, hands it to its roles and reports the revision applied.

How many seats: ``CREWLET_TEST_BIG_SEATS`` (default 2,000), the personas
sized so that the company stays ~25 MB. 10,000 seats with ~2.4 KiB personas
is issue 13's shape; it needs a machine that carries 10,000 R3 mailboxes —
each an R3 consumer, a Raft group on every member. On the 2-core machine
this was written on, three members took ~30 consumer creates a second and,
past ~5,000 consumers, their fsyncs drove the load average into the
thousands and every request timed out: the revision was never the
bottleneck (2,000 seats: every node applied in 20-50 s, nearly all of it
the mailboxes; one node with 10,000: tests/integration/test_big_company.py).
"""

from __future__ import annotations

import os
import random
import time

import pytest
import yaml

from tests.conftest import wait_for
from tests.fleet.test_cluster import make_members, start_alone
from tests.integration.test_big_company import big_company
from tests.seats import ctl

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(600)]

IDS = ("ba", "bb", "bc")
SEATS = int(os.environ.get("CREWLET_TEST_BIG_SEATS", "2000"))
COMPANY_BYTES = 24_000_000  # of personas: with the rest, ~25 MB of JSON


def applied_everywhere(node, rev: int, count: int = len(IDS)) -> bool:
    """Every node of the fleet reports *rev* applied, as *node* sees the status bucket."""
    fleet = ((node.status(timeout=5) or {}).get("fleet") or {})
    nodes = fleet.get("nodes") or []
    return len(nodes) == count and all((n.get("applied") or {}).get("rev") == rev for n in nodes)


def first(node, event: str, **match) -> dict | None:
    return next((e for e in node.events() if e.get("event") == event
                 and all(e.get(k) == v for k, v in match.items())), None)


def test_a_company_of_25_mb_applies_on_three_r3_members(make_node, short_tmp):
    nodes, _ = make_members(make_node, ids=IDS, cluster="bigtest")
    for node in nodes:
        start_alone(node)
    for node in nodes:
        node.wait_running(timeout=90)
    wait_for(lambda: len(((nodes[0].status() or {}).get("fleet") or {}).get("nodes") or []) == 3, 60,
             interval=0.2, what="three nodes in the fleet")
    path = big_company(short_tmp, seats=SEATS, persona=COMPANY_BYTES // SEATS)

    began = time.monotonic()
    done = ctl(nodes[0], "apply", path, timeout=300)
    stored = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert f"revision 1 (epoch 1), {SEATS} seats" in done.stdout, done.stdout
    # Polled once a second from the status view: reading three logs fifty times a
    # second (wait_event) costs a loaded machine more than the nodes' own work.
    wait_for(lambda: applied_everywhere(nodes[1], 1), 480, interval=1.0,
             what="every node reporting revision 1 applied")
    took = time.monotonic() - began
    events = {n.config["node"]["id"]: first(n, "company_applied", rev=1) for n in nodes}
    assert all(ev is not None and ev["seats"] == SEATS for ev in events.values()), events
    for node in nodes:
        wait_for(lambda: first(node, "seats_company", rev=1, seats=SEATS), 120, interval=1.0,
                 what="the seats role handed the company")
        assert node.proc.poll() is None
    summary = ", ".join(f"{nid} {ev['took_ms'] / 1000:.1f} s (read {ev['read_ms'] / 1000:.1f} s)"
                        for nid, ev in sorted(events.items()))
    print(f"\n{SEATS:,} seats ({os.path.getsize(path) / 1e6:.1f} MB of YAML) on three R3 members: "
          f"crewletctl apply {stored:.1f} s; every node applied and reported {took:.1f} s after it "
          f"began; per node, from seeing it active: {summary}")


def test_a_company_in_parts_is_applied_through_a_leaf_and_read_by_it_through_the_domain(make_node, short_tmp):
    """A node without data runs a leaf of the members: its crewletctl writes
    the parts and the record through the JetStream domain, and its fleet
    child reads them back the same way."""
    members, leaf_urls = make_members(make_node, ids=IDS, cluster="bigleaf")
    stateless = make_node(node={"id": "bd", "roles": ["seats"]},
                          stream={"replicas": 3, "leaf": {"remotes": leaf_urls}})
    for node in members:
        start_alone(node)
    stateless.start(wait_ready=False)
    for node in (*members, stateless):
        node.wait_running(timeout=90)
    wait_for(lambda: len(((members[0].status() or {}).get("fleet") or {}).get("nodes") or []) == 4, 60,
             interval=0.2, what="four nodes in the fleet")
    rng = random.Random(9)  # hex personas compress little: ~2.5 MB of JSON, several parts
    path = os.path.join(short_tmp, "noisy.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"company": {"name": "Noise"}, "providers": {"p": {"kind": "scripted"}},
                        "seats": [{"name": f"s{i:02d}", "persona": rng.randbytes(25_000).hex(), "provider": "p"}
                                  for i in range(50)]}, f)
    done = ctl(stateless, "apply", path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "revision 1 (epoch 1), 50 seats" in done.stdout, done.stdout
    wait_for(lambda: applied_everywhere(stateless, 1, count=4), 120, interval=0.5,
             what="every node, the leaf's too, reporting revision 1 applied")
    history = ctl(stateless, "history", "--json")
    assert history.returncode == 0 and '"seats": 50' in history.stdout, history.stderr
