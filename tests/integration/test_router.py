"""The router against a real nats-server and real appliers.

Reference, "How a request reaches the estate": this node's copy first when it
is in service; otherwise the data nodes in order, passing over those out of
service, silent, lagging or behind the floor; a tracker write moves on under
the same op id, a knowledge-base write that went unanswered is reported
unknown and never sent twice; nobody answering names what each node said; a
search nobody could run is "could not be searched", not "no hits".

Appliers are :class:`roles.data_applier.applier.Applier` served on NATS the
way the ``data_applier`` role serves them — in this process (their request
counters then tell who was asked) or, where a test must stop one with a
signal or read its copy from another process, in a process of its own
(``python -m tests.integration.test_router serve ...``, bottom of this file).
Presence leases are written by the test: there is no crewletd here.

Each router is given an asker id chosen so that the node a test is about is
(or is not) the router's first pick (:func:`asker_with_first`): the spread
is a pure function, so the choice is deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import nats
import pytest
import zmq
import zmq.asyncio
from nats.errors import NoRespondersError

from crewlet.coord import buckets
from crewlet.estate import log as estate_log
from crewlet.estate import store, wire
from crewlet.estate.floor import NodeFloor
from crewlet.estate.local import LocalCopy
from crewlet.estate.search import index_path
from crewlet.estate.ops import make_op
from crewlet.estate.router import NobodyAnswered, OutcomeUnknown, Router, order
from crewlet.estate.view import EstateView, NodeState
from roles.data_applier import serve_nats
from roles.data_applier.applier import Applier
from tests.estate import in_service, run, until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Short per-node waits: a silent node costs a test this long, not 10 or 60 s.
READ_WAIT = 1.0
WRITE_WAIT = 2.0


def asker_with_first(node: str, among: list[str], *, not_first: bool = False) -> str:
    """An asker id whose first pick among healthy *among* is *node* (or is not)."""
    states = [NodeState(n, True, None, 0, 0.0) for n in among]
    for i in range(10_000):
        asker = f"asker-{i}"
        first = order(asker, states, 0, None, {}, 0.0)[0].id
        if (first == node) != not_first:
            return asker
    raise AssertionError("no such asker")


def pause_log(applier: Applier) -> None:
    """Stop *applier* applying the log while it goes on answering and writing
    its status record (so the record shows it falling behind)."""
    for task in applier._tasks:
        if task.get_name() == "applier-log":
            task.cancel()


def resume_log(applier: Applier) -> None:
    applier._spawn(applier._log_loop(), "log")


class Fleet:
    """A test's estate: one nats-server, data nodes, routers, in this loop."""

    def __init__(self, url: str, tmp: str):
        self.url = url
        self.tmp = tmp
        self.conns: list[Any] = []
        self.appliers: dict[str, Applier] = {}
        self.subs: dict[str, Any] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.views: list[tuple[EstateView, asyncio.Task]] = []
        self.locals: list[LocalCopy] = []
        self.zctx = zmq.asyncio.Context()

    async def connect(self):
        nc = await nats.connect(self.url, connect_timeout=2)
        self.conns.append(nc)
        return nc, nc.jetstream(timeout=5)

    async def start(self) -> "Fleet":
        _, self.js = await self.connect()
        await buckets.ensure_all(self.js, 1)
        await estate_log.ensure_stream(self.js, 1)
        self.kv_leases = await self.js.key_value(buckets.LEASES.name)
        self.kv_status = await self.js.key_value(buckets.STATUS.name)
        return self

    def data_dir(self, node: str) -> str:
        return os.path.join(self.tmp, node)

    async def presence(self, node: str, roles=("data",), protocol: int | None = None) -> None:
        value = {"node": node, "boot": "test", "roles": list(roles), "broker": "member"}
        if protocol is not None:
            value["protocol"] = protocol
        await self.kv_leases.put(f"node.{node}", json.dumps(value).encode())

    async def add(self, node: str) -> Applier:
        """A data node whose applier runs in this process."""
        nc, js = await self.connect()
        applier = Applier(nc, js, node, self.data_dir(node))
        self.subs[node] = await serve_nats(nc, applier)
        applier.start()
        self.appliers[node] = applier
        await self.presence(node)
        return applier

    async def spawn(self, node: str) -> subprocess.Popen:
        """A data node whose applier runs in a process of its own (with its
        node's ZeroMQ endpoints in ``<data dir>/run``)."""
        out = open(os.path.join(self.tmp, f"{node}.log"), "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.test_router", "serve", self.url, node,
             self.data_dir(node), self.run_dir(node)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.procs[node] = proc
        await self.presence(node)
        return proc

    async def unlisten(self, node: str) -> None:
        """Take *node*'s applier off NATS (it goes on applying and writing its
        record): the server knows at once that nobody listens there."""
        await self.subs.pop(node).unsubscribe()
        await self.appliers[node].nc.flush()
        # Measured here: for a few ms after an UNSUB was processed, a request
        # may still be taken for the gone subscriber (and time out) — and
        # likewise a new SUB may not be seen yet (NoResponders). Wait until
        # the server says so.
        await until(lambda: self._nobody(node), 5, f"the server knowing nobody listens for {node}")

    async def _nobody(self, node: str) -> bool:
        try:
            await self.conns[0].request(wire.subject(node), b"", timeout=0.2)
        except NoRespondersError:
            return True
        except Exception:
            pass
        return False

    def run_dir(self, node: str) -> str:
        return os.path.join(self.data_dir(node), "run")

    async def view(self) -> EstateView:
        _, js = await self.connect()
        view = EstateView(js)
        self.views.append((view, asyncio.create_task(view.run())))
        assert await view.wait_ready(10)
        return view

    async def router(self, asker: str, *, local: LocalCopy | None = None,
                     node_floor=None, origin: str | None = None) -> Router:
        nc, _ = await self.connect()
        return Router(nc, node_id=asker, view=await self.view(), local=local,
                      read_wait=READ_WAIT, write_wait=WRITE_WAIT, node_floor=node_floor,
                      origin=origin)

    def local(self, node: str) -> LocalCopy:
        copy = LocalCopy(self.zctx, node_id=node, run_dir=self.run_dir(node),
                         data_dir=self.data_dir(node)).start()
        self.locals.append(copy)
        return copy

    async def in_service(self, view: EstateView, *nodes: str) -> None:
        await in_service(view, *nodes)

    def requests(self) -> dict[str, int]:
        return {n: a.stats["requests"] for n, a in self.appliers.items()}

    async def log_last(self) -> int:
        return (await estate_log.bounds(self.js))[1]

    async def close(self) -> None:
        for copy in self.locals:
            await copy.close()
        for _, task in self.views:
            task.cancel()
        await asyncio.gather(*(t for _, t in self.views), return_exceptions=True)
        for node, sub in self.subs.items():
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        for applier in self.appliers.values():
            if applier._tasks:
                await applier.stop()
        for proc in self.procs.values():
            stop_process(proc)
        for nc in self.conns:
            await nc.close()
        self.zctx.term()


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def fleet_test(fn):
    """Run ``fn(fleet)`` in a fresh loop with a started Fleet, always closed."""
    def test(natsd, short_tmp):
        async def main():
            fleet = await Fleet(natsd.url, short_tmp).start()
            try:
                await fn(fleet)
            finally:
                await fleet.close()
        run(main())
    test.__name__ = fn.__name__
    test.__doc__ = fn.__doc__
    return test


def task_op(title: str, **kw):
    return make_op("task.create", {"title": title}, node="elsewhere", **kw)


def page_op(path: str, body: str = "text", **kw):
    return make_op("page.write", {"path": path, "title": path, "body": body}, node="elsewhere",
                   **kw)


# --------------------------------------------------------------------- tests

@fleet_test
async def test_a_write_from_a_node_without_data_lands_and_a_floored_read_sees_it_elsewhere(fleet):
    for n in ("a", "b", "c"):
        await fleet.add(n)
    writer = await fleet.router("stateless", node_floor=NodeFloor(fleet.data_dir("stateless")))
    await fleet.in_service(writer.view, "a", "b", "c")

    op = task_op("ship the estate")
    outcome = await writer.write(op)
    assert outcome["ok"] and outcome["result"]["task"]["title"] == "ship the estate"
    seq = outcome["seq"]
    assert writer.floor == seq and outcome["result"]["task"]["id"] == f"T{seq}"
    wrote_on = writer.last_answered

    # Another process of the same node (same node floor) reads through another node.
    asker = asker_with_first(wrote_on, ["a", "b", "c"], not_first=True)
    reader = await fleet.router(asker, node_floor=NodeFloor(fleet.data_dir("stateless")))
    assert reader.floor == seq
    await fleet.in_service(reader.view, "a", "b", "c")  # its own view: the appliers' records seen
    answer = await reader.read("task.get", {"id": f"T{seq}"})
    assert answer["task"]["title"] == "ship the estate"
    assert reader.last_answered not in (None, wrote_on)
    # The op landed once, on every copy.
    for applier in fleet.appliers.values():
        await until(lambda: applier.applied >= seq, 5, "every copy applied the write")
        assert applier.reader.outcome(op.id) == outcome
    assert await fleet.log_last() == seq
    digests = {store.digest(a.store) for a in fleet.appliers.values()}
    assert len(digests) == 1


@fleet_test
async def test_the_router_passes_over_an_applier_nobody_listens_for(fleet):
    """An applier whose NATS subscription is gone (its record still says in
    service): nobody responds, nothing ran, the next node answers at once."""
    for n in ("a", "b"):
        await fleet.add(n)
    router = await fleet.router(asker_with_first("a", ["a", "b"]))
    await fleet.in_service(router.view, "a", "b")
    await fleet.unlisten("a")

    started = time.monotonic()
    answer = await router.search("anything")
    assert answer.searched and answer.node == "b"
    assert answer.answers == {"a": "nobody listening (no applier running)"}
    assert time.monotonic() - started < READ_WAIT  # no wait spent on a
    assert "a" in router.silent_since and router.last_answered == "b"


@fleet_test
async def test_the_router_passes_over_a_stopped_applier_without_asking_it(fleet):
    a = await fleet.add("a")
    await fleet.add("b")
    router = await fleet.router(asker_with_first("a", ["a", "b"]))
    await fleet.in_service(router.view, "a", "b")
    await a.stop()  # its last record: out of service, "applier stopped"
    await until(lambda: not router.view.state("a").in_service, 5, "a's record read")
    before = fleet.requests()["a"]

    answer = await router.search("anything")
    assert answer.searched and answer.node == "b" and answer.hits == []
    assert answer.answers == {"a": "out of service: applier stopped"}
    assert fleet.requests()["a"] == before


@fleet_test
async def test_the_router_passes_over_a_stuck_applier_after_its_wait_and_asks_it_last(fleet):
    """A SIGSTOPped applier: its subscription stands, nothing answers. The
    router waits its per-node wait, moves on, and asks it last afterwards."""
    proc = await fleet.spawn("s")
    await fleet.add("b")
    router = await fleet.router(asker_with_first("s", ["s", "b"]))
    await fleet.in_service(router.view, "s", "b")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        first = await router.read("task.list", {})
        took = time.monotonic() - started
        assert first == {"tasks": []} and router.last_answered == "b"
        assert READ_WAIT * 0.9 <= took < READ_WAIT + 2
        assert "s" in router.silent_since

        # Silent in the last 30 s: asked last, so the next read costs no wait.
        started = time.monotonic()
        answer = await router.search("anything")
        assert answer.node == "b" and answer.answers == {}
        assert time.monotonic() - started < READ_WAIT * 0.5

        # The caller's deadline caps the wait on a node, and nobody is asked past it.
        fresh = await fleet.router(asker_with_first("s", ["s", "b"]))
        started = time.monotonic()
        with pytest.raises(NobodyAnswered) as caught:
            await fresh.read("task.list", {}, timeout=0.3)
        assert time.monotonic() - started < 0.3 + 0.5
        assert caught.value.answers == {"s": "no answer within 0.3s",
                                        "b": "not asked: the caller's deadline had passed"}
    finally:
        os.kill(proc.pid, signal.SIGCONT)


@fleet_test
async def test_a_lagging_node_is_asked_after_the_others(fleet):
    nodes = ["a", "b", "c"]
    for n in nodes:
        await fleet.add(n)
    view = await fleet.view()
    await fleet.in_service(view, *nodes)
    lag = fleet.appliers["a"]
    pause_log(lag)
    # Others apply more than LAG_OPS ops the paused copy does not.
    ops = [task_op(f"t{i}") for i in range(1100)]
    for i in range(0, len(ops), 100):
        await asyncio.gather(*(estate_log.publish(fleet.js, op, timeout=5)
                               for op in ops[i:i + 100]))
    last = await fleet.log_last()

    def lagging():
        states = {s.id: s for s in view.data_nodes()}
        return (states["a"].lagging and states["a"].in_service
                and all(states[n].applied >= last for n in ("b", "c")))
    await until(lagging, 15, "a's record showing it lagging")

    router = await fleet.router(asker_with_first("a", nodes))
    before = fleet.requests()
    answer = await router.read("task.list", {"limit": 1})
    assert answer["tasks"][0]["title"] == "t1099"
    assert router.last_answered in ("b", "c")
    assert fleet.requests()["a"] == before["a"]  # never asked

    resume_log(lag)
    await until(lambda: lag.applied >= last, 15, "a catching up")


@fleet_test
async def test_a_node_behind_the_floor_is_asked_last_and_says_it_is_behind(fleet):
    x = await fleet.add("x")
    await fleet.add("y")
    view = await fleet.view()
    await fleet.in_service(view, "x", "y")
    pause_log(x)
    floor = NodeFloor(fleet.data_dir("writer-node"))
    writer = await fleet.router(asker_with_first("y", ["x", "y"]), node_floor=floor)
    outcome = await writer.write(task_op("after x stopped applying"))
    assert outcome["ok"] and writer.last_answered == "y"
    seq = outcome["seq"]
    await until(lambda: view.state("x").applied < seq <= view.state("y").applied, 5,
                "the records showing x behind the floor")

    # A router of the same node whose first pick is x: x is behind its floor.
    reader = await fleet.router(asker_with_first("x", ["x", "y"]), node_floor=floor)
    before = fleet.requests()
    answer = await reader.read("task.get", {"id": f"T{seq}"})
    assert answer["task"]["title"] == "after x stopped applying"
    assert reader.last_answered == "y" and fleet.requests()["x"] == before["x"]

    # With y gone, x is asked after all, and answers what it is: behind.
    await fleet.unlisten("y")
    with pytest.raises(NobodyAnswered) as caught:
        await reader.read("task.get", {"id": f"T{seq}"})
    assert caught.value.answers == {
        "y": "nobody listening (no applier running)",
        "x": f"behind: applied {x.applied}, the floor is {seq}"}
    assert str(caught.value) == (
        "no data node answered: node y: nobody listening (no applier running); "
        f"node x: behind: applied {x.applied}, the floor is {seq}")


@fleet_test
async def test_a_knowledge_base_write_nobody_answered_is_unknown_and_never_sent_twice(fleet):
    proc = await fleet.spawn("s")
    b = await fleet.add("b")
    router = await fleet.router(asker_with_first("s", ["s", "b"]))
    await fleet.in_service(router.view, "s", "b")
    last = await fleet.log_last()
    op = page_op("runbooks/deploy", "step one")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(OutcomeUnknown) as caught:
            await router.write(op)
        assert time.monotonic() - started < WRITE_WAIT + 2
        assert caught.value.op_id == op.id
        assert caught.value.answers == {"s": f"no answer within {WRITE_WAIT:g}s"}
        assert b.stats["requests"] == 0  # never sent to the next node
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    # s wakes past the request's deadline and drops it unrun: the op is nowhere.
    await fleet.in_service(router.view, "s")
    probe = await fleet.router(asker_with_first("s", ["s", "b"]))
    assert (await probe.read("op.outcome", {"id": op.id}))["outcome"] is None
    assert probe.last_answered == "s"
    assert b.reader.outcome(op.id) is None and await fleet.log_last() == last


@fleet_test
async def test_a_knowledge_base_write_answered_unvouched_is_unknown_and_not_resent(fleet):
    a, b = await fleet.add("a"), await fleet.add("b")
    router = await fleet.router(asker_with_first("a", ["a", "b"]))
    await fleet.in_service(router.view, "a", "b")
    pause_log(a)  # a publishes the op, then cannot vouch for its outcome
    op = page_op("notes/once")
    with pytest.raises(OutcomeUnknown) as caught:
        await router.write(op)
    assert list(caught.value.answers) == ["a"]
    assert caught.value.answers["a"].startswith("unvouched (published at seq ")
    assert b.stats["requests"] == 0


@fleet_test
async def test_a_tracker_write_moves_on_past_a_silent_node_and_lands_once(fleet):
    proc = await fleet.spawn("s")
    b = await fleet.add("b")
    router = await fleet.router(asker_with_first("s", ["s", "b"]))
    await fleet.in_service(router.view, "s", "b")
    last = await fleet.log_last()
    op = task_op("lands once")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        outcome = await router.write(op)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert outcome["ok"] and router.last_answered == "b" and "s" in router.silent_since
    assert await fleet.log_last() == last + 1 == outcome["seq"]
    # s drops the late request unrun, catches up, and holds the same copy.
    await until(lambda: router.view.state("s").applied >= outcome["seq"], 10, "s catching up")
    copy = store.open_env(os.path.join(fleet.data_dir("s"), "estate"), readonly=True)
    assert store.Reader(copy).outcome(op.id) == b.reader.outcome(op.id)
    assert store.digest(copy) == store.digest(b.store)
    assert await fleet.log_last() == last + 1


@fleet_test
async def test_a_tracker_write_answered_unvouched_is_asked_of_the_next_under_the_same_id(fleet):
    a, b = await fleet.add("a"), await fleet.add("b")
    router = await fleet.router(asker_with_first("a", ["a", "b"]))
    await fleet.in_service(router.view, "a", "b")
    last = await fleet.log_last()
    pause_log(a)
    op = task_op("vouched for by b")
    outcome = await router.write(op)
    assert outcome["ok"] and router.last_answered == "b"
    assert outcome == b.reader.outcome(op.id) and outcome["seq"] == last + 1
    assert await fleet.log_last() == last + 1  # b found it applied: published once
    resume_log(a)
    await until(lambda: a.applied >= outcome["seq"], 10, "a catching up")
    assert store.digest(a.store) == store.digest(b.store)


@fleet_test
async def test_nobody_answering_names_every_node_and_what_it_said(fleet):
    a = await fleet.add("a")
    for n in ("b", "c"):
        await fleet.add(n)
    router = await fleet.router("stateless")
    await fleet.in_service(router.view, "a", "b", "c")
    await a.stop()
    await fleet.unlisten("b")
    await fleet.kv_status.put("evicted.c", json.dumps({"reason": "disk failing"}).encode())
    await until(lambda: not router.view.state("a").in_service
                and not router.view.state("c").in_service, 5, "a stopped, c evicted")

    with pytest.raises(NobodyAnswered) as caught:
        await router.read("task.list", {})
    assert caught.value.answers == {"a": "out of service: applier stopped",
                                    "b": "nobody listening (no applier running)",
                                    "c": "out of service: node evicted: disk failing"}
    for part in ("node a: out of service: applier stopped",
                 "node b: nobody listening (no applier running)",
                 "node c: out of service: node evicted: disk failing"):
        assert part in str(caught.value)
    # A write nobody could have run is "nobody answered" too, not "unknown".
    with pytest.raises(NobodyAnswered):
        await router.write(task_op("nowhere"))


@fleet_test
async def test_a_search_nobody_could_run_is_not_searched_which_is_not_no_hits(fleet):
    await fleet.add("a")
    router = await fleet.router("stateless")
    await fleet.in_service(router.view, "a")
    assert (await router.write(page_op("kb/hello", "hello world")))["ok"]
    hit = await router.search("hello")
    assert hit.searched and [h["path"] for h in hit.hits] == ["kb/hello"]
    miss = await router.search("absent")
    assert miss.searched and miss.hits == [] and miss.node == "a"

    await fleet.unlisten("a")
    nobody = await router.search("hello")
    assert not nobody.searched and nobody.hits == [] and nobody.node is None
    assert nobody.answers == {"a": "nobody listening (no applier running)"}


@fleet_test
async def test_a_data_node_answers_from_its_own_copy_and_from_peers_when_it_is_out(fleet):
    proc = await fleet.spawn("s")
    b = await fleet.add("b")
    local = fleet.local("s")
    router = await fleet.router("s", local=local)
    await fleet.in_service(router.view, "s", "b")
    await until(local.in_service, 10, "s's copy in service")

    outcome = await router.write(task_op("from s's own roles"))
    assert outcome["ok"] and router.floor == outcome["seq"]
    task = await router.read("task.get", {"id": f"T{outcome['seq']}"})
    assert task["task"]["title"] == "from s's own roles"
    assert (await router.write(page_op("kb/local", "local words")))["ok"]
    found = await router.search("local")
    assert found.node == "s" and [h["path"] for h in found.hits] == ["kb/local"]
    # A write that changes no page leaves the index's own mark behind (it
    # catches up only after page changes); it still reflects the copy, so a
    # search carrying that write's seq as its floor is answered here at once.
    later = await router.write(task_op("after the page"))
    assert later["ok"] and router.floor == later["seq"]
    found = await router.search("local")
    assert found.node == "s" and [h["path"] for h in found.hits] == ["kb/local"]
    assert b.stats["requests"] == 0 and router.last_answered is None  # nobody else asked

    proc.terminate()  # the applier stops: its last applied message says so
    assert proc.wait(10) == 0
    await until(lambda: local.reason() == "applier stopped", 5, "s's copy out of service")
    found = await router.search("local")
    assert found.node == "b" and [h["path"] for h in found.hits] == ["kb/local"]
    assert found.answers == {"s": "out of service: applier stopped"}
    task = await router.read("task.get", {"id": f"T{outcome['seq']}"})
    assert task["task"]["title"] == "from s's own roles" and router.last_answered == "b"


async def _seats_of_a_data_node(fleet: Fleet) -> tuple[subprocess.Popen, Applier, LocalCopy, Router, int]:
    """Data node s (its applier a process of its own) and b, both of the
    protocol whose appliers apply the seats' own writes; a router of s's
    seats over s's copy, and seat cto's token, held by s."""
    from crewlet.estate import origins
    from tests.estate import grant

    proc = await fleet.spawn("s")
    b = await fleet.add("b")
    for node in ("s", "b"):
        await fleet.presence(node, protocol=estate_log.WRITES_READ_SINCE)
    local = fleet.local("s")
    router = await fleet.router("s", local=local, origin=origins.SEATS)
    await fleet.in_service(router.view, "s", "b")
    await until(local.in_service, 10, "s's copy in service")
    await until(lambda: all(n.protocol == estate_log.WRITES_READ_SINCE
                            for n in router.view.data_nodes()), 5, "the view read the protocols")
    return proc, b, local, router, await grant(fleet.js, "cto", "s", release=False)


async def _subject_at(js, seq: int) -> str:
    return (await js.get_msg(estate_log.STREAM, seq)).subject


@fleet_test
async def test_a_seat_on_a_data_node_writes_straight_to_the_log_and_reads_its_outcome_here(fleet):
    """Reference, "How a request reaches the estate", with the seats' own
    writes published by the seats (crewlet.estate.router, "Straight to the
    log"): on their own subject, the outcome read from this node's copy,
    nobody asked; a write already kept is not published again; while a data
    node of protocol 3 is live (it would pass them over) they are asked for."""
    proc, b, local, router, token = await _seats_of_a_data_node(fleet)

    def seat_op(kind: str, args: dict) -> Any:
        return make_op(kind, args, node="s", seat="cto", token=token)

    task = seat_op("task.create", {"title": "straight"})
    outcome = await router.write(task)
    assert outcome["ok"] and router.floor == outcome["seq"], outcome
    assert await _subject_at(fleet.js, outcome["seq"]) == estate_log.seats_subject("s")
    assert (await router.read("task.get", {"id": f"T{outcome['seq']}"}))["task"]["title"] == "straight"
    # A knowledge-base write (``once``) takes the same road.
    page = seat_op("page.write", {"path": "kb/straight", "title": "S", "body": "words"})
    written = await router.write(page)
    assert written["ok"] and await _subject_at(fleet.js, written["seq"]) == estate_log.seats_subject("s")
    # The same op again: the outcome kept, nothing published.
    last = await fleet.log_last()
    assert await router.write(task) == outcome
    assert await fleet.log_last() == last
    # A refusal is the copy's outcome like any other (a task that does not exist).
    missing = await router.write(seat_op("task.update", {"id": "T999999", "status": "done"}))
    assert missing["ok"] is False and missing["error"] == "no task T999999", missing
    assert b.stats["requests"] == 0   # nobody was asked

    # A data node of protocol 3 is live: asked for, and s's applier publishes it on its own subject.
    await fleet.presence("b", protocol=estate_log.WRITES_READ_SINCE - 1)
    await until(lambda: any(n.protocol == estate_log.WRITES_READ_SINCE - 1
                            for n in router.view.data_nodes()), 5, "the view read b's protocol")
    asked = await router.write(seat_op("task.create", {"title": "asked"}))
    assert asked["ok"] and await _subject_at(fleet.js, asked["seq"]) == estate_log.SUBJECT
    proc.terminate()
    assert proc.wait(10) == 0


@fleet_test
async def test_a_straight_write_this_copy_does_not_apply_in_time_moves_on_or_is_unknown(fleet):
    """The write is in the log but this node's applier is frozen: a tracker
    write is asked of a peer under the same id and lands once; a
    knowledge-base write is reported unknown and not published again."""
    proc, b, local, router, token = await _seats_of_a_data_node(fleet)
    proc.send_signal(signal.SIGSTOP)   # its last word still says "in service"

    task = make_op("task.create", {"title": "moved on"}, node="s", seat="cto", token=token)
    first = await fleet.log_last()
    outcome = await router.write(task)
    assert outcome["ok"] and router.last_answered == "b", outcome
    assert outcome["seq"] == first + 1 and await fleet.log_last() == first + 1   # in the log once
    assert await _subject_at(fleet.js, outcome["seq"]) == estate_log.seats_subject("s")

    page = make_op("page.write", {"path": "kb/unknown", "title": "U", "body": "x"}, node="s",
                   seat="cto", token=token)
    local.stale = 60.0   # s's silence is not yet "stopped": the page goes straight
    with pytest.raises(OutcomeUnknown) as raised:
        await router.write(page)
    assert "did not apply it within the wait" in str(raised.value)
    assert await fleet.log_last() == first + 2   # published once, never again
    await until(lambda: b.reader.outcome(page.id, page.token) is not None, 10, "b applied the page")
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    assert proc.wait(10) == 0


@fleet_test
async def test_a_copy_made_a_moment_ago_is_asked_not_passed_over_as_stopped(fleet):
    """A role's first request, the moment its copy is made: what the applier
    published before the subscription joined is lost (ZeroMQ's slow joiner),
    and that silence is not yet "applier stopped" — the request waits for the
    applier's next word (it speaks every second) and is answered by this copy."""
    proc = await fleet.spawn("s")
    earlier = fleet.local("s")
    router = await fleet.router("s", local=earlier)
    await fleet.in_service(router.view, "s")
    await until(earlier.in_service, 10, "s's copy in service")
    outcome = await router.write(task_op("kept before the role started"))
    assert outcome["ok"]

    fresh = fleet.local("s")   # a role started just now
    router.local = fresh
    assert fresh.reason() == "applier stopped"   # nothing heard yet: silence
    task = await router.read("task.get", {"id": f"T{outcome['seq']}"})
    assert task["task"]["title"] == "kept before the role started"
    assert fresh.in_service()
    proc.terminate()
    assert proc.wait(10) == 0


@fleet_test
async def test_a_data_nodes_own_copy_searches_the_index_its_applier_made_anew(fleet):
    """The search index is derived: deleted, the applier makes it anew from
    the copy (as it does one SQLite cannot read). The node's roles, which
    held the old file open, search the new one."""
    proc = await fleet.spawn("s")
    await fleet.add("b")
    local = fleet.local("s")
    router = await fleet.router("s", local=local)
    await fleet.in_service(router.view, "s", "b")
    await until(local.in_service, 10, "s's copy in service")
    assert (await router.write(page_op("kb/old", "old words")))["ok"]
    assert (await router.search("old")).node == "s"  # the index file is open here now

    proc.terminate()
    assert proc.wait(10) == 0
    path = index_path(fleet.data_dir("s"))
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)
    await fleet.spawn("s")  # its applier indexes the copy into a new file
    await until(local.in_service, 15, "s's copy back in service")

    assert (await router.write(page_op("kb/new", "new words")))["ok"]
    found = await router.search("words")
    assert found.node == "s", found.answers
    assert sorted(h["path"] for h in found.hits) == ["kb/new", "kb/old"]
    assert router.last_answered is None  # nobody else asked


@fleet_test
async def test_the_view_follows_presence_applier_records_and_evictions(fleet):
    """Written by hand here, as the fleet child, the applier and crewletctl
    evict write them."""
    view = await fleet.view()
    await fleet.presence("d", roles=("data", "seats"))
    await fleet.presence("s", roles=("seats",))  # holds no copy: never a data node

    def state():
        states = view.data_nodes()
        return states[0] if [x.id for x in states] == ["d"] else None
    assert (await until(state, 5, "d listed")).reason == "no applier record"

    async def record(**fields):
        value = {"node": "d", "applied": 7, "in_service": True, "reason": None, "at": time.time(),
                 **fields}
        await fleet.kv_status.put("estate.d", json.dumps(value).encode())
    await record()
    assert (await until(lambda: (s := state()) and s.in_service and s, 5, "d in service")
            ).applied == 7
    await record(at=time.time() - 60)  # the applier stopped writing it
    assert (await until(lambda: (s := state()) and not s.in_service and s, 5, "a stale record")
            ).reason == "applier stopped"
    await record(in_service=False, reason="rows below the log's first sequence (applied 7, "
                                          "the log starts at 9)")
    await until(lambda: (s := state()) and (s.reason or "").startswith("rows below"), 5,
                "the applier's own reason")
    await record()
    await fleet.kv_status.put("evicted.d", json.dumps({"reason": "bad disk"}).encode())
    await until(lambda: (s := state()) and s.reason == "node evicted: bad disk", 5, "evicted")
    await fleet.kv_status.delete("evicted.d")  # crewletctl's way back
    await until(lambda: (s := state()) and s.in_service, 5, "back in service")
    await fleet.kv_leases.delete("node.d")  # left the fleet: not asked any more
    await until(lambda: view.data_nodes() == [], 5, "d gone")


# ------------------------------------------------- an applier in its own process

async def _serve(url: str, node: str, data_dir: str, run_dir: str) -> None:
    """What the data_applier role runs, without crewletd: the applier on NATS
    and on the node's ZeroMQ ``estate`` and ``applied`` endpoints."""
    from crewlet import ipc
    from crewlet.estate import wire
    from roles.data_applier import applied_message, publish_applied, serve_zmq

    nc = await nats.connect(url, connect_timeout=2)
    js = nc.jetstream(timeout=5)
    applier = Applier(nc, js, node, data_dir)
    ipc.ensure_run_dir(run_dir)
    zctx = zmq.asyncio.Context()
    estate, applied = zctx.socket(zmq.ROUTER), zctx.socket(zmq.PUB)
    estate.setsockopt(zmq.LINGER, 0)
    applied.setsockopt(zmq.LINGER, 500)
    estate.bind(ipc.endpoint(run_dir, "estate"))
    applied.bind(ipc.endpoint(run_dir, "applied"))
    sub = await serve_nats(nc, applier)
    tasks = [asyncio.create_task(serve_zmq(estate, applier)),
             asyncio.create_task(publish_applied(applied, applier))]
    applier.start()
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await stopping.wait()
    await sub.unsubscribe()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await applier.stop()
    await applied.send_multipart([wire.APPLIED_TOPIC, wire.encode(applied_message(applier))])
    estate.close()
    applied.close()
    zctx.term()
    await nc.close()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    asyncio.run(_serve(*sys.argv[2:6]))
