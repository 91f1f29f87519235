"""Conversations as estate data against a real nats-server, real appliers
and routers (DESIGN §11; crewlet.estate.apply's conversation kinds).

Two data nodes apply the log; a run's driver and a seat's turn write
through one router, a person decides through another that asks the other
node first, and any router reads the conversation back, paged. The
``Fleet`` of tests/integration/test_router.py stands the estate up: no
crewletd here. A seat's writes carry a real lease's token (the appliers
judge it from ``leases``, as on a node).
"""

from __future__ import annotations

from crewlet.estate import store
from crewlet.estate.floor import NodeFloor
from crewlet.estate.ops import make_op
from tests.estate import grant, until
from tests.integration.test_router import asker_with_first, fleet_test


@fleet_test
async def test_a_conversation_written_through_one_node_is_decided_and_read_through_another(fleet):
    for n in ("a", "b"):
        await fleet.add(n)
    # Two processes of one ingress node (one floor), asking a and b first.
    floor_dir = fleet.data_dir("ingress")
    driver = await fleet.router(asker_with_first("a", ["a", "b"]), node_floor=NodeFloor(floor_dir))
    person = await fleet.router(asker_with_first("b", ["a", "b"]), node_floor=NodeFloor(floor_dir))
    await fleet.in_service(driver.view, "a", "b")
    token = await grant(fleet.js, "cto", "seats-1", release=False)

    async def write(router, kind, args, *, seat=None, node="ingress", at=1000.0):
        return await router.write(make_op(kind, args, node=node, seat=seat,
                                          token=token if seat else None, at=at))

    async def turn(kind, args):  # the seat's turn, on the node holding the seat
        return await write(driver, kind, args, seat="cto", node="seats-1")

    assert (await write(driver, "conversation.create", {"id": "c1", "seat": "cto"}))["ok"]
    started = await write(driver, "run.create", {"id": "r1", "conversation": "c1", "strategy": "reject",
                                                 "on_disconnect": "continue", "revision": 2,
                                                 "input": "pay acme", "status": "running"})
    assert started["ok"] and started["result"]["conversation"]["status"] == "running"
    busy = await write(person, "run.create", {"id": "r2", "conversation": "c1", "strategy": "reject",
                                              "on_disconnect": "continue", "revision": 2, "status": "running"})
    assert busy["ok"] is False and busy["code"] == "conversation_busy" and busy["detail"]["run"] == "r1"

    assert (await write(driver, "conversation.message", {"conversation": "c1", "id": "r1.0", "run": "r1",
                                                         "role": "user", "text": "pay acme"}))["ok"]
    for i in range(1, 6):
        assert (await turn("conversation.message", {"conversation": "c1", "id": f"r1.{i}", "run": "r1",
                                                    "role": "assistant", "text": f"thinking {i}"}))["ok"]
    asked = await turn("approval.request", {"id": "a1", "conversation": "c1", "run": "r1", "seat": "cto",
                                            "tool": "wire_money", "call_id": "call_9",
                                            "args": {"to": "acme", "amount": 120}, "expires_at": 90_000.0})
    assert asked["ok"] and asked["result"]["conversation"]["status"] == "awaiting_approval"

    # A person approves through the other node; again is the same answer; a deny is a conflict.
    approve = {"id": "a1", "decision": "approve", "by": "ann"}
    first = await write(person, "approval.decide", approve)
    assert first["ok"] and person.last_answered == "b"
    again = await write(driver, "approval.decide", {**approve, "by": "bob"})
    assert again["ok"] and again["result"]["already"] and again["result"]["approval"]["by"] == "ann"
    deny = await write(driver, "approval.decide", {"id": "a1", "decision": "deny"})
    assert deny["ok"] is False and deny["code"] == "conflict" and deny["detail"]["decision"] == "approve"

    # Read back through the node that did not take the writes, paged, in order.
    got = await person.read("conversation.get", {"id": "c1"})
    assert got["conversation"]["status"] == "awaiting_approval"
    assert got["approval"]["decision"] == "approve" and got["approval"]["args"] == {"to": "acme", "amount": 120}
    seen, after = [], None
    while True:
        page = await person.read("conversation.messages",
                                 {"conversation": "c1", "limit": 4, **({"after": after} if after else {})})
        seen += [m["id"] for m in page["messages"]]
        after = page["after"]
        if after is None:
            break
    assert seen == [f"r1.{i}" for i in range(6)]
    pending = await driver.read("approval.list", {"status": "pending"})
    assert pending == {"approvals": [], "next": None}

    # The resumption starts once decided, and every copy holds the same bytes.
    resumed = await write(person, "run.create", {"id": "r2", "conversation": "c1", "strategy": "reject",
                                                 "on_disconnect": "continue", "revision": 2, "approval": "a1",
                                                 "status": "running"})
    assert resumed["ok"] and resumed["result"]["conversation"]["run"] == "r2"
    seq = resumed["seq"]
    for applier in fleet.appliers.values():
        await until(lambda: applier.applied >= seq, 5, "every copy applied the log")
    assert len({store.digest(a.store) for a in fleet.appliers.values()}) == 1
