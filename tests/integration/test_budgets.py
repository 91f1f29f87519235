"""A seat's budget cap stops that seat's turns and no other (roles.seats.turns).

One real node, two seats on one provider, a cap on one of them
(``budgets.seats``). A turn that spends past the cap is done; the capped
seat's next mail waits in its mailbox (its turn deferred, saying which cap),
while the other seat's mail is worked as before. Raised in a new revision,
the cap lets the waiting mail through.
"""

from __future__ import annotations

from tests.conftest import wait_for
from tests.seats import ctl, ctl_json, deferrals, held, node_url, read_nats, turn_records, write_company

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
COMPANY = """
company: {{name: t}}
providers:
  p:
    kind: scripted
    rules: [{{match: '.*', reply: 'a reply of five words'}}]
seats:
  - {{name: capped, persona: seat a, provider: p}}
  - {{name: free, persona: seat b, provider: p}}
budgets:
  seats: {{capped: {cap}}}
"""


def test_a_seat_budget_stops_that_seat_and_no_other(make_node):
    node = make_node(fleet=FAST)
    node.start(args=("--company", write_company(node.dir, COMPANY.format(cap=20))))
    wait_for(lambda: {"capped", "free"} <= set(held(node)), 30, what="both seats held")

    spent = ctl_json(node, "send", "capped", " ".join(["word"] * 20), "--wait", "20", "--trigger", "big")
    assert spent["turn"]["outcome"] == "done" and sum(spent["turn"]["tokens"].values()) > 20, spent

    def records():
        return read_nats(node_url(node), turn_records)
    ctl_json(node, "send", "capped", "again", "--trigger", "held-back")
    # Deferred before its mail is fetched: said with the seat and why (not stored: no turn was worked).
    deferred = wait_for(lambda: deferrals(node, "capped"), 20, what="the capped seat's next turn deferred")
    assert "seat budget of 20 tokens spent" in deferred[0], deferred
    # The other seat works on, on the same node and provider.
    free = ctl_json(node, "send", "free", " ".join(["word"] * 20), "--wait", "20", "--trigger", "other")
    assert free["turn"]["outcome"] == "done", free
    rows = {r["seat"]: r for r in ctl_json(node, "seats")["seats"]}
    assert rows["capped"]["pending"] == 1 and rows["free"]["pending"] == 0, rows
    assert not [r for r in records() if r["trigger"] == "held-back"], "the capped seat's mail was worked"
    assert not deferrals(node, "free")

    # The cap raised: the waiting mail is worked.
    out = ctl(node, "apply", write_company(node.dir, COMPANY.format(cap=100_000), "raised.yaml"))
    assert out.returncode == 0, out.stderr
    wait_for(lambda: any(r["trigger"] == "held-back" and r["outcome"] == "done"
                         for r in read_nats(node_url(node), turn_records)), 30,
             what="the held-back mail worked once the cap was raised")
