"""Each way into the estate names its origin, and only its origin writes there
(crewlet/estate/origins.py, crewlet/permissions.py; DESIGN §14).

Two halves. On a bare broker: a log made before the seats' subject is given
it when an applier starts, and two copies pass over the same entries a
seats subject may not carry — applied past, kept nowhere, logged. On a real
node with the roles' real credentials (its ``broker-users.json``): the seats
user cannot publish on ``estate.ops`` (the broker refuses), what it does
publish on its own subject that is not a fence or a turn record is passed
over by the applier (not in the copy, logged ``estate_op_refused``), it asks
an applier only for a seat's writes, it writes no lease but ``seat.*`` and
its own ``life.<node>``; ingress and workers publish on no log subject.
"""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import StreamConfig

from crewlet.estate import store, wire
from crewlet.estate import log as estate_log
from crewlet.estate.ops import make_op
from tests.conftest import wait_for
from tests.estate import copy_of, run, until
from tests.integration.test_applier import applier, connection
from tests.integration.test_broker_permissions import Client, _state, _streams
from tests.seats import node_url, read_nats

NODE = "orig"
DEADLINE = 30.0


# ------------------------------------------------------------------ a bare broker

def test_an_older_log_gets_the_seats_subject_and_copies_pass_over_the_same_entries(natsd, short_tmp):
    seats = estate_log.seats_subject("n1")

    async def check():
        async with connection(natsd.url) as (nc, js):
            # The log as an older crewlet made it: one subject.
            await js.add_stream(StreamConfig(name=estate_log.STREAM, subjects=[estate_log.SUBJECT],
                                             duplicate_window=estate_log.DUPLICATE_WINDOW))
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: _subjects(js), 10, "the log given the seats' subject")
                assert (await js.stream_info(estate_log.STREAM)).config.subjects == estate_log.SUBJECTS
                forged = [make_op("task.create", {"title": "forged"}, node="n1", id="forged-task"),
                          make_op("page.write", {"path": "p", "title": "P", "body": "x"}, node="n1",
                                  seat="s", token=1, id="forged-page"),
                          make_op("turn.record", {"record": {"n": 1}}, node="n2", seat="s", token=1,
                                  id="other-node")]
                fence = make_op("seat.fence", {}, node="n1", seat="s", token=1, id="fence")
                task = make_op("task.create", {"title": "real"}, node="n1", id="real-task")
                for op in forged:
                    await js.publish(seats, op.encode(), headers={"Nats-Msg-Id": op.msg_id})
                await js.publish(seats, b"\x93not an op")
                await js.publish(seats, fence.encode(), headers={"Nats-Msg-Id": fence.msg_id})
                last = (await js.publish(estate_log.SUBJECT, task.encode(),
                                         headers={"Nats-Msg-Id": task.msg_id})).seq
                async with applier(natsd.url, f"{short_tmp}/b", "b") as b:
                    await until(lambda: a.applied == last and b.applied == last, 15, "both applied")
                    for copy in (a, b):
                        assert copy.stats["refused"] == 4
                        assert all(copy.reader.outcome(op.id, op.token) is None for op in forged)
                        assert copy.reader.outcome(fence.id, fence.token)["ok"] is not None
                        assert copy.reader.outcome(task.id)["ok"] is True
                        assert [t["title"] for t in copy.reader.query("task.list", {})["tasks"]] == ["real"]
                    assert store.dump(a.store) == store.dump(b.store)
                    assert a.in_service and b.in_service
    run(check(), DEADLINE)


async def _subjects(js) -> bool:
    return (await js.stream_info(estate_log.STREAM)).config.subjects == estate_log.SUBJECTS


def test_an_applier_refuses_a_request_its_origin_does_not_make_and_answers_an_older_node(natsd, short_tmp):
    from roles.data_applier import serve_nats

    async def ask(nc, subject, op):
        msg = await nc.request(subject, wire.encode(wire.write_request(op, wait=5)), timeout=6)
        return wire.decode(msg.data)

    async def check():
        async with connection(natsd.url) as (nc, js):
            await estate_log.ensure_stream(js, 1)
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                subs = await serve_nats(nc, a)
                try:
                    trim = make_op("turn.trim", {"before": 1.0}, node="w1")
                    for origin in ("seats", "ingress"):
                        said = await ask(nc, wire.subject("a", origin, "w1"), trim)
                        assert said["status"] == wire.BAD_REQUEST, said
                        assert f"{origin} may not write turn.trim" in said["reason"], said
                    # Another node's op, asked as this one; a subject naming no origin we know.
                    said = await ask(nc, wire.subject("a", "workers", "w2"), trim)
                    assert "names node 'w1'" in said["reason"], said
                    said = await ask(nc, "estate.req.a.root.w1", trim)
                    assert said["status"] == wire.BAD_REQUEST and "no origin" in said["reason"], said
                    assert a.applied == 0 and a.stats["asks_refused"] == 3
                    # Its own origin's kind lands; so does an older node's request (no origin).
                    said = await ask(nc, wire.subject("a", "workers", "w1"), trim)
                    assert said["status"] == wire.OK and said["answer"]["ok"], said
                    said = await ask(nc, wire.subject("a"),
                                     make_op("task.create", {"title": "old node"}, node="old"))
                    assert said["status"] == wire.OK and said["answer"]["ok"], said
                    # Reads are open to every origin.
                    read = await nc.request(wire.subject("a", "seats", "w1"), wire.encode(
                        wire.read_request("task.list", {}, floor=said["seq"], wait=5)), timeout=6)
                    assert [t["title"] for t in wire.decode(read.data)["answer"]["tasks"]] == ["old node"]
                finally:
                    await subs.unsubscribe()
    run(check(), DEADLINE)


# ------------------------------------------------------------------ a real node

@pytest.fixture(scope="module")
def node():
    from tests.conftest import Nodes
    nodes = Nodes()
    try:
        n = nodes(node={"id": NODE})
        n.start()
        wait_for(lambda: _streams(n) >= {"KV_grants", "KV_leases", "KV_config", "ESTATE"}, 30,
                 what="crewlet's streams made")
        # The applier follows the log (it made or updated the stream's subjects).
        wait_for(lambda: read_nats(node_url(n), _log_subjects) == estate_log.SUBJECTS, 30,
                 what="the log's subjects")
        yield n
    finally:
        nodes.close()


async def _log_subjects(nc, js):
    return (await js.stream_info(estate_log.STREAM)).config.subjects


def _ids_in_log(node, after: int) -> set:
    """The op ids in the log past seq *after*."""
    async def read(nc, js):
        last = (await js.stream_info(estate_log.STREAM)).state.last_seq
        ids = set()
        for seq in range(after + 1, last + 1):
            try:
                data = (await js.get_msg(estate_log.STREAM, seq)).data
            except Exception:
                continue  # trimmed
            try:
                ids.add(wire.decode(data).get("id"))
            except (ValueError, AttributeError):
                pass
        return ids
    return read_nats(node_url(node), read)


async def _publish(c: Client, subject: str, op) -> int:
    ack = await c.nc.jetstream(timeout=2).publish(subject, op.encode(), headers={"Nats-Msg-Id": op.msg_id})
    return ack.seq


def test_the_seats_publish_on_their_own_subject_and_the_applier_passes_over_an_operator_op(node):
    seats = estate_log.seats_subject(NODE)
    page = make_op("page.write", {"path": "ops/forged", "title": "Forged", "body": "x"}, node=NODE,
                   id="forged-page")
    task = make_op("task.create", {"title": "forged"}, node=NODE, id="forged-task")
    fence = make_op("seat.fence", {}, node=NODE, seat="nobody", token=10**12, id="forged-fence")

    async def go():
        async with Client(node, "seats") as c:
            # estate.ops is the appliers' and the operator's: the broker refuses it.
            refused = await c.refused(estate_log.SUBJECT, task.encode(), request=True)
            other = await c.refused(estate_log.seats_subject("elsewhere"), task.encode(), request=True)
            seqs = [await _publish(c, seats, op) for op in (page, task, fence)]
            return refused, other, seqs

    before = _state(node)["estate"]
    refused, other, seqs = asyncio.run(go())
    assert refused and other, (refused, other)
    assert before < seqs[0] < seqs[1] < seqs[2], (before, seqs)  # the broker took them

    def applied():
        copy = copy_of(node)
        return copy is not None and copy.applied() >= seqs[-1] and copy
    copy = wait_for(applied, 20, what="the copy applied past the seats' entries")
    reader = store.Reader(copy)
    assert reader.query("page.read", {"path": "ops/forged"}).get("page") is None
    assert "forged" not in [t["title"] for t in reader.query("task.list", {})["tasks"]]
    assert reader.outcome(page.id) is None and reader.outcome(task.id) is None
    # The fence reached apply (its origin fits) and was judged there: no lease granted it.
    assert "not a lease the fleet granted" in reader.outcome(fence.id, fence.token)["error"]
    for op, seq in ((page, seqs[0]), (task, seqs[1])):
        ev = node.wait_event("estate_op_refused", timeout=10, seq=seq)
        assert ev["level"] == "warning" and ev["subject"] == seats and ev["kind"] == op.kind, ev
        assert ev["op"] == op.id and "may not be published by seats" in ev["why"], ev
    # Passed over, the copy serves on.
    assert node.children()["data_applier"]["state"] == "running"
    wait_for(lambda: (node.children()["data_applier"].get("stats") or {}).get("refused") == 2,
             10, what="the refusals counted")


def test_a_role_asks_only_under_its_own_origin_and_only_for_its_kinds(node):
    file_delete = make_op("file.delete", {"project": "p", "path": "f"}, node=NODE, seat="w", token=1,
                          id="seat-file-delete")
    operator_task = make_op("task.create", {"title": "as the operator"}, node=NODE, id="seats-operator-task")
    trim = make_op("turn.trim", {"before": 1.0}, node=NODE, id="ingress-trim")

    async def ask(c: Client, origin: str, op) -> dict:
        msg = await c.nc.request(wire.subject(NODE, origin, NODE),
                                 wire.encode(wire.write_request(op, wait=5)), timeout=6)
        return wire.decode(msg.data)

    async def go():
        out = {}
        async with Client(node, "seats") as c:
            out["seats file.delete"] = await ask(c, "seats", file_delete)
            out["seats operator op"] = await ask(c, "seats", operator_task)
            # Under another origin, another node, or none (an older node's): the broker refuses.
            out["seats as ingress"] = await c.refused(wire.subject(NODE, "ingress", NODE), request=True)
            out["seats as crewlet"] = await c.refused(wire.subject(NODE, "crewlet", NODE), request=True)
            out["seats of another node"] = await c.refused(wire.subject(NODE, "seats", "elsewhere"),
                                                           request=True)
            out["seats bare"] = await c.refused(wire.subject(NODE), request=True)
        async with Client(node, "ingress") as c:
            out["ingress turn.trim"] = await ask(c, "ingress", trim)
        async with Client(node, "workers") as c:
            out["workers as seats"] = await c.refused(wire.subject(NODE, "seats", NODE), request=True)
        return out

    before = _state(node)["estate"]
    out = asyncio.run(go())
    for what, kind in (("seats file.delete", "seats may not write file.delete"),
                       ("seats operator op", "a seats op is a seat's"),
                       ("ingress turn.trim", "ingress may not write turn.trim")):
        said = out.pop(what)
        assert said["status"] == wire.BAD_REQUEST and said["reason"].startswith("refused: "), said
        assert kind in said["reason"], said
    assert all(out.values()), out
    assert not {file_delete.id, operator_task.id, trim.id} & _ids_in_log(node, before), \
        "nothing refused reached the log"
    node.wait_event("estate_request_refused", timeout=10, origin="seats", kind="file.delete")


def test_ingress_and_workers_publish_on_no_log_subject(node):
    op = make_op("task.create", {"title": "forged"}, node=NODE)

    async def go():
        out = {}
        for role in ("ingress", "workers"):
            async with Client(node, role) as c:
                out[role] = [await c.refused(subject, op.encode(), request=True)
                             for subject in (estate_log.SUBJECT, estate_log.seats_subject(NODE))]
        return out

    before = _state(node)["estate"]
    assert asyncio.run(go()) == {"ingress": [True, True], "workers": [True, True]}
    assert op.id not in _ids_in_log(node, before)


def test_seats_write_only_seat_leases_and_their_own_life(node):
    async def go():
        async with Client(node, "seats") as c:
            refused = {key: await c.refused(f"$KV.leases.{key}", request=True)
                       for key in ("node.x", "duty.x", "conv.x", "life.elsewhere", "seat.a.b")}
            for bucket in ("config", "grants"):
                refused[bucket] = await c.refused(f"$KV.{bucket}.x", request=True)
            return refused

    refused = asyncio.run(go())
    assert all(refused.values()), refused
    leases = _state(node)["leases"]
    assert not {"node.x", "duty.x", "conv.x", "life.elsewhere", "seat.a.b"} & set(leases), leases
