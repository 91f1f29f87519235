"""Each way into the estate names its origin, and only its origin writes there
(crewlet/estate/origins.py, crewlet/permissions.py; DESIGN §14).

Two halves. On a bare broker: a log made before the seats' subject is given
it when an applier starts, and two copies pass over the same entries a
seats subject may not carry — applied past, kept nowhere, logged; on a
broker whose account may not update the stream, an applier follows the log
as it is (said once) and the seats' subject as soon as an operator adds it.
On a real node with the roles' real credentials (its ``broker-users.json``):
the seats user cannot publish on ``estate.ops`` (the broker refuses), a
seat's own write goes straight to its subject, what it publishes there that
is no kind of the seats' or not a seat's is passed over by the applier (not
in the copy, logged ``estate_op_refused``),
it asks an applier only for a seat's writes — and for its fence and turn
records while a data node of protocol 1 is live, which then land on
``estate.ops`` —, it writes no lease but ``seat.*`` and its own
``life.<node>``; ingress and workers publish on no log subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os

import nats
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import NoStreamResponseError

from crewlet.estate import store, wire
from crewlet.estate import log as estate_log
from crewlet.estate.ops import make_op
from crewlet.estate.router import Router
from crewlet.estate.view import EstateView
from tests.conftest import NatsServer, free_port, wait_for
from tests.estate import copy_of, grant, in_service, publish_all, run, until
from tests.integration.test_applier import applier, connection
from tests.integration.test_broker_permissions import Client, _state, _streams
from tests.integration.test_joining import Said
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
                          # a seat's, but no kind the seats write
                          make_op("file.delete", {"project": "p", "path": "f"}, node="n1",
                                  seat="s", token=1, id="forged-delete"),
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


# An external broker's account that may do all but update the log's stream.
OPERATOR_USER, ACCOUNT_USER = "operator", "account"


@pytest.fixture
def guarded(short_tmp):
    d = os.path.join(short_tmp, "guarded")
    server = NatsServer("guarded", d, free_port(), conf=[
        f'jetstream {{ store_dir: "{os.path.join(d, "js")}" }}',
        "authorization { users: [",
        f'  {{ user: "{OPERATOR_USER}", password: "{OPERATOR_USER}" }},',
        f'  {{ user: "{ACCOUNT_USER}", password: "{ACCOUNT_USER}", permissions: {{',
        f'      publish: {{ allow: [">"], deny: ["$JS.API.STREAM.UPDATE.{estate_log.STREAM}"] }},',
        '      subscribe: [">"] } }',
        "] }"]).start()
    yield server
    server.stop()


def _as(server: NatsServer, user: str) -> str:
    return f"nats://{user}:{user}@127.0.0.1:{server.port}"


def test_an_applier_follows_a_log_its_account_may_not_update(guarded, short_tmp, monkeypatch):
    # Asked again at every ensure: the warning is once, not merely throttled.
    monkeypatch.setattr(estate_log, "UPDATE_AGAIN_AFTER", 0.0)

    async def check():
        async with connection(_as(guarded, OPERATOR_USER)) as (_, ojs):
            # The log as an older crewlet made it: one subject, no consumer limit.
            await ojs.add_stream(StreamConfig(name=estate_log.STREAM, subjects=[estate_log.SUBJECT],
                                              duplicate_window=estate_log.DUPLICATE_WINDOW))
            with Said() as said:
                async with applier(_as(guarded, ACCOUNT_USER), f"{short_tmp}/a", "a") as a:
                    tasks = [make_op("task.create", {"title": f"t{i}"}, node="n1", id=f"task-{i}")
                             for i in range(3)]
                    last = (await publish_all(ojs, tasks))[-1][0]
                    await until(lambda: a.applied == last, 15, "the copy applied the log it may not update")
                    assert a.in_service and a.reader.outcome("task-2")["ok"] is True
                    # Asked again (another start of the follow, crewletd's boot): not said again.
                    async with connection(_as(guarded, ACCOUNT_USER)) as (_, ajs):
                        again = await estate_log.ensure_stream(ajs, 1)
                    assert again.config.subjects == [estate_log.SUBJECT]
                    said_once = said.events("estate_log_unchanged")
                    assert len(said_once) == 1, said_once
                    ev = said_once[0]
                    assert ev["level"] == "warning" and ev["missing"] == [estate_log.SUBJECTS[1]], ev
                    assert "not captured by the log until an operator" in ev["why"], ev
                    # Not captured indeed: no stream listens on the seats' subject.
                    with pytest.raises(NoStreamResponseError):
                        await ojs.publish(estate_log.seats_subject("n1"), b"x", timeout=2)

                    # An operator updates the stream: the copy follows the seats' subject too.
                    info = await ojs.stream_info(estate_log.STREAM)
                    await ojs.update_stream(dataclasses.replace(
                        info.config, subjects=list(estate_log.SUBJECTS), max_consumers=64))
                    token = await grant(ojs, "s", "n1", release=False)  # held: the claim is the proof
                    fence = make_op("seat.fence", {}, node="n1", seat="s", token=token, id="fence")
                    after = make_op("task.create", {"title": "after"}, node="n1", id="after")
                    seqs = [(await ojs.publish(subject, op.encode(), headers={"Nats-Msg-Id": op.msg_id})).seq
                            for subject, op in ((estate_log.seats_subject("n1"), fence),
                                                (estate_log.SUBJECT, after))]
                    await until(lambda: a.applied == seqs[-1], 15, "the copy applied past the seats' entry")
                    fenced = a.reader.outcome(fence.id, fence.token)
                    assert fenced["ok"] is True, fenced
                    assert a.reader.outcome("after")["ok"] is True
    run(check(), DEADLINE)


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
    # A seat's op of a kind the seats never write, and a kind they write but as no seat.
    delete = make_op("file.delete", {"project": "p", "path": "f"}, node=NODE, seat="w", token=1,
                     id="forged-delete")
    task = make_op("task.create", {"title": "forged"}, node=NODE, id="forged-task")
    fence = make_op("seat.fence", {}, node=NODE, seat="nobody", token=10**12, id="forged-fence")

    async def go():
        async with Client(node, "seats") as c:
            # estate.ops is the appliers' and the operator's: the broker refuses it.
            refused = await c.refused(estate_log.SUBJECT, task.encode(), request=True)
            other = await c.refused(estate_log.seats_subject("elsewhere"), task.encode(), request=True)
            seqs = [await _publish(c, seats, op) for op in (delete, task, fence)]
            return refused, other, seqs

    before = _state(node)["estate"]
    # The refusals counted so far, whatever ran on this node before.
    counted = _applier_stats(node, before)["refused"]
    refused, other, seqs = asyncio.run(go())
    assert refused and other, (refused, other)
    assert before < seqs[0] < seqs[1] < seqs[2], (before, seqs)  # the broker took them

    def applied():
        copy = copy_of(node)
        return copy is not None and copy.applied() >= seqs[-1] and copy
    copy = wait_for(applied, 20, what="the copy applied past the seats' entries")
    reader = store.Reader(copy)
    assert "forged" not in [t["title"] for t in reader.query("task.list", {})["tasks"]]
    assert reader.outcome(delete.id, delete.token) is None and reader.outcome(task.id) is None
    # The fence reached apply (its origin fits) and was judged there: no lease granted it.
    assert "not a lease the fleet granted" in reader.outcome(fence.id, fence.token)["error"]
    for op, seq, why in ((delete, seqs[0], "may not be published by seats"),
                         (task, seqs[1], "a seats op is a seat's")):
        ev = node.wait_event("estate_op_refused", timeout=10, seq=seq)
        assert ev["level"] == "warning" and ev["subject"] == seats and ev["kind"] == op.kind, ev
        assert ev["op"] == op.id and why in ev["why"], ev
    # Passed over, the copy serves on; the two (the fence was applied) are counted.
    assert node.children()["data_applier"]["state"] == "running"
    assert _applier_stats(node, seqs[-1])["refused"] - counted == 2


def _applier_stats(node, applied: int) -> dict:
    """The applier's stats as it reports them, once they say it applied *applied*
    (its counts then include every entry up to it)."""
    def reported():
        stats = node.children()["data_applier"].get("stats") or {}
        return stats if (stats.get("applied") or 0) >= applied else None
    return wait_for(reported, 20, what=f"the applier's stats at {applied}")


OLDER = "older"


def test_the_seats_ask_an_applier_while_a_data_node_of_protocol_1_is_live(node):
    """An applier of protocol 1 reads estate.ops alone: while one is live, the
    seats' fence and turn records go through an applier of this version to
    estate.ops; once none is, straight to their own subject."""
    seat = "mixed"
    # As crewletd writes a presence (crewlet.coord.lease's value): a data node of protocol 1.
    presence = {"roles": ["data"], "protocol": 1, "broker": "member", "node": OLDER,
                "boot": f"boot-{OLDER}", "token": None}

    async def go():
        async with connection(node_url(node)) as (_, cjs), Client(node, "seats") as c:
            leases = await cjs.key_value("leases")
            token = await grant(cjs, seat, NODE, release=False)  # held: the claim is the proof
            fence = make_op("seat.fence", {}, node=NODE, seat=seat, token=token, id=f"mixed-fence-{token}")
            record = make_op("turn.record", {"record": {"seat": seat, "trigger": "mixed", "outcome": "done"}},
                             node=NODE, seat=seat, token=token, id=f"mixed-record-{token}")
            js = c.nc.jetstream(timeout=2)   # the seats' own broker user, as the seats process is
            view = EstateView(js)
            watch = asyncio.create_task(view.run())
            await leases.put(f"node.{OLDER}", json.dumps(presence).encode())
            try:
                assert await view.wait_ready(10), "the view never listed the buckets"
                await in_service(view, NODE)
                await until(lambda: any(s.id == OLDER and s.protocol == 1 for s in view.data_nodes()),
                            10, "the older data node in the view")
                router = Router(c.nc, node_id=NODE, view=view, origin="seats")
                asked = await router.to_log(js, fence, timeout=10)
                assert router.log_way == "asked"
                await leases.delete(f"node.{OLDER}")
                await until(lambda: OLDER not in {s.id for s in view.data_nodes()}, 10, "the older node gone")
                straight = await router.to_log(js, record, timeout=5)
                assert router.log_way == "straight"
            finally:
                with contextlib.suppress(Exception):
                    await leases.delete(f"node.{OLDER}")
                with contextlib.suppress(Exception):
                    await leases.delete(f"seat.{seat}")
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
            subjects = [(await cjs.get_msg(estate_log.STREAM, seq)).subject for seq in (asked, straight)]
            return fence, record, subjects, straight

    fence, record, subjects, last = asyncio.run(go())
    # Asked: the node's applier (protocol 2) checked it and published it where
    # protocol 1 reads; then straight on the seats' own subject.
    assert subjects == [estate_log.SUBJECT, estate_log.seats_subject(NODE)], subjects
    copy = wait_for(lambda: (c := copy_of(node)) is not None and c.applied() >= last and c, 20,
                    what="the copy applied both")
    reader = store.Reader(copy)
    assert reader.outcome(fence.id, fence.token)["ok"] is True
    assert reader.outcome(record.id, record.token)["ok"] is True


def test_a_seat_s_tool_write_goes_straight_to_its_subject_under_the_seats_own_user(node):
    """On a data node whose copy serves, a seat's write is published by the
    seats themselves, on their subject (the broker lets their user), and its
    outcome is read from the copy (crewlet.estate.router, "Straight to the log")."""
    import zmq.asyncio

    from crewlet.estate.local import LocalCopy

    seat = "straight"

    async def go():
        async with connection(node_url(node)) as (_, cjs), Client(node, "seats") as c:
            token = await grant(cjs, seat, NODE, release=False)  # held: the claim is the proof
            js = c.nc.jetstream(timeout=2)   # the seats' own broker user, as the seats process is
            view = EstateView(js)
            watch = asyncio.create_task(view.run())
            zctx = zmq.asyncio.Context()
            local = LocalCopy(zctx, node_id=NODE, run_dir=node.run_dir,
                              data_dir=node.config["data_dir"]).start()
            try:
                assert await view.wait_ready(10), "the view never listed the buckets"
                await in_service(view, NODE)
                await until(local.in_service, 10, "the node's copy in service")
                router = Router(c.nc, node_id=NODE, view=view, local=local, origin="seats", js=js)
                task = make_op("task.create", {"title": "straight from the seats"}, node=NODE,
                               seat=seat, token=token)
                outcome = await router.write(task)
                subject = (await cjs.get_msg(estate_log.STREAM, outcome["seq"])).subject
                read = await router.read("task.get", {"id": f"T{outcome['seq']}"})
                return outcome, subject, read
            finally:
                await local.close()
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
                zctx.term()

    outcome, subject, read = asyncio.run(go())
    assert outcome["ok"] is True, outcome
    assert subject == estate_log.seats_subject(NODE)
    assert read["task"]["title"] == "straight from the seats" and read["task"]["created_by"] == seat


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
