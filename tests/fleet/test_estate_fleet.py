"""The estate across real nodes: every data node a full copy, nodes without
data served through the router, appliers and whole nodes killed and caught up.

Nodes share one real broker (``stream.type: nats``), as in test_fleet. The
test process reads each node's LMDB copy read-only, and routes as a node
without data would (tests/estate.py).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import nats
import pytest

from crewlet import groups
from crewlet.estate import store
from tests.conftest import start_all, wait_for
from tests.estate import (applied, copy_of, log_last, op, publish_all, publish_to, query, random_log,
                          random_ops, routed, run)
from tests.fleet.test_fleet import apply, fleet_node
from tests.seats import ctl, ctl_json, held, write_company

pytestmark = pytest.mark.fleet

DATA_ONLY = {"roles": ["data"]}
# Ops in flight at once while the appliers are killed: few, so the log grows
# in many small steps (and the kills land between them, not after them).
PUBLISH_WINDOW = 10
# Seconds the publisher goes on past the mix while kills are still to come
# (the mix alone takes well under a second here; six kills and restarts, more).
PUBLISH_MORE_FOR = 40.0


def data_node(make_node, natsd, node_id: str, **overrides):
    node = overrides.pop("node", {})
    return fleet_node(make_node, natsd, node_id, node={**DATA_ONLY, **node}, **overrides)


def converged(nodes, last: int) -> bool:
    return all(applied(n) >= last for n in nodes)


def digests(nodes) -> set[str]:
    return {store.digest(copy_of(n)) for n in nodes}


def kill_applier(node) -> None:
    pid = node.process_pids()["data_applier"]
    os.kill(pid, signal.SIGKILL)
    node.wait_running(exclude={"data_applier": pid})


def test_three_data_nodes_converge_with_their_appliers_killed_mid_stream(natsd, make_node):
    """A random mix of ops (refusals, duplicated ids, stale tokens among them)
    is published from a thread of its own, a few at a time, while b's and
    c's appliers are SIGKILLed in turn, six times: each kill lands while the
    log grows, and all three copies end identical, row for row."""
    nodes = start_all([data_node(make_node, natsd, n) for n in "abc"])
    a, b, c = nodes
    wait_for(lambda: all(copy_of(n) is not None for n in nodes), 20, what="three copies made")
    items = random_log(11, 1600)
    kills = 6
    killed = threading.Event()  # set once every kill is done
    failed: list[BaseException] = []

    async def publish() -> None:
        nc = await nats.connect(natsd.url)
        try:
            js = nc.jetstream(timeout=5)
            await publish_all(js, items, window=PUBLISH_WINDOW)
            # Slower kills (a loaded machine) must still land mid-stream:
            # more of the mix until they are done, within a bound.
            more, stop_by = random.Random(12), time.monotonic() + PUBLISH_MORE_FOR
            while not killed.is_set() and time.monotonic() < stop_by:
                await publish_all(js, random_ops(more, PUBLISH_WINDOW), window=PUBLISH_WINDOW)
        finally:
            await nc.close()

    def publisher() -> None:
        try:
            run(publish(), 90)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=publisher, name="publisher")
    thread.start()
    try:
        for k in range(kills):
            before = run(log_last(natsd.url))
            assert thread.is_alive(), f"kill {k + 1}: the publisher was done ({failed})"
            kill_applier(b if k % 2 == 0 else c)  # and its restart
            after = run(log_last(natsd.url))
            assert after > before, f"kill {k + 1}: the log did not grow across it ({before})"
    finally:
        killed.set()
        thread.join(60)
    assert not thread.is_alive() and not failed, failed
    last = run(log_last(natsd.url))
    assert last >= len(items)
    wait_for(lambda: converged(nodes, last), 30, what=f"every copy at {last}")
    assert len(digests(nodes)) == 1
    assert store.dump(copy_of(a)) == store.dump(copy_of(b)) == store.dump(copy_of(c))
    # Refusals and duplicates were among them, and are the same everywhere.
    outcomes = [store.Reader(copy_of(n)).outcome(items[5].id, items[5].token) for n in nodes]
    assert outcomes[0] is not None and outcomes.count(outcomes[0]) == 3
    # Each applier says how far it got, in the fleet's status.
    wait_for(lambda: {n["id"]: (n.get("estate") or {}).get("applied")
                      for n in a.status()["fleet"]["nodes"]} == {"a": last, "b": last, "c": last},
             15, what="every node's estate record at the log's end")


# One seat, w, working the estate with scripted rules; it is placed on the
# nodes labelled zone ZONE (estate_company(zone) fills it in).
ESTATE_COMPANY = """
company: {name: t}
providers:
  p:
    kind: scripted
    rules:
      - match: 'create a task (.+)'
        reply: '{tools}'
        tools: [{name: task_create, args: {title: '\\1'}}]
      - match: 'list the tasks'
        reply: 'tasks: {tools}'
        tools: [{name: task_list}]
      - match: 'write a page ([a-z/]+): (.+)'
        reply: '{tools}'
        tools: [{name: page_write, args: {path: '\\1', title: '\\1', body: '\\2'}}]
      - match: 'search (.+)'
        reply: 'found: {tools}'
        tools: [{name: page_search, args: {query: '\\1'}}]
seats:
  - {name: w, persona: a worker, provider: p, placement: {labels: {zone: ZONE}}}
"""


def estate_company(zone: str) -> str:
    return ESTATE_COMPANY.replace("ZONE", zone)


def turn(node, seat: str, text: str) -> dict:
    out = ctl_json(node, "send", seat, text, "--wait", "60")
    assert out["turn"] is not None, f"no turn for {text!r}"
    assert out["turn"]["outcome"] == "done", out["turn"]
    return out["turn"]


async def _consumers(url: str) -> list[tuple[str, str, str | None]]:
    import nats
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        found = []
        for stream in await js.streams_info():
            for info in await js.consumers_info(stream.config.name):
                found.append((stream.config.name, info.name, info.config.durable_name))
        return found
    finally:
        await nc.close()


def test_a_node_without_data_writes_and_reads_the_estate_through_the_router(natsd, make_node, short_tmp):
    """A seat on a node with no copy creates a task, writes a page, lists and
    searches: every data node holds it all; crewletctl shows the estate from
    any node; the seat's turn records are kept by every data node, each once."""
    a, b, s = start_all([data_node(make_node, natsd, "a"), data_node(make_node, natsd, "b"),
                         fleet_node(make_node, natsd, "s", node={"roles": ["seats"], "labels": {"zone": "edge"}})])
    apply(s, write_company(short_tmp, estate_company("edge"), "stateless.yaml"))
    wait_for(lambda: held(s).get("w") == "s", 20, what="s holds w")
    assert not os.path.exists(os.path.join(s.config["data_dir"], "estate"))  # no copy here

    created = turn(s, "w", "create a task ship the estate")
    task_id = created["reply"].split()[1]
    assert task_id.startswith("T"), created["reply"]
    assert "ship the estate" in turn(s, "w", "list the tasks")["reply"]
    turn(s, "w", "write a page eng/deploy: run make deploy carefully")
    assert "eng/deploy" in turn(s, "w", "search deploy")["reply"]

    last = run(log_last(natsd.url))
    wait_for(lambda: converged([a, b], last), 20, what="both copies at the log's end")
    for node in (a, b):
        assert query(node, "task.get", id=task_id)["task"]["created_by"] == "w"
        assert query(node, "page.read", path="eng/deploy")["page"]["body"] == "run make deploy carefully"
        assert {t["seat"] for t in query(node, "turn.list", seat="w")["turns"]} == {"w"}
    assert len(digests([a, b])) == 1

    # crewletctl from the node without data, and from a data node.
    for node in (s, a):
        tasks = ctl_json(node, "tasks")
        assert [t["id"] for t in tasks["tasks"]] == [task_id]
        hits = ctl_json(node, "search", "deploy")
        assert hits["searched"] and [h["path"] for h in hits["hits"]] == ["eng/deploy"]
    assert ctl_json(a, "pages", "eng/deploy")["page"]["version"] == 1

    # The turns' records: stored once in the log (custody's EVENTS batches
    # are no more), and so kept by every data node, each of w's four turns once.
    def done_of_w(node) -> list[str]:
        return [t["trigger"] for t in query(node, "turn.list", seat="w")["turns"] if t["outcome"] == "done"]
    wait_for(lambda: all(len(done_of_w(n)) >= 4 for n in (a, b)), 20, what="w's four turn records kept")
    for node in (a, b):
        assert len(done_of_w(node)) == len(set(done_of_w(node))) == 4
    # Every durable consumer the fleet made belongs to a group of the table.
    durables = [(st, name) for st, name, durable in run(_consumers(natsd.url)) if durable]
    assert durables and all(groups.of_consumer(st, name) is not None for st, name in durables), durables
    assert ("EVENTS", groups.durable(groups.CUSTODY)) in durables


def test_a_data_node_with_its_applier_stopped_keeps_its_seats_served_by_a_peer(natsd, make_node, short_tmp):
    """a's applier is stopped (SIGSTOP): a keeps seat w, whose task goes
    through b's copy; a catches up when its applier goes on. Then w moves to
    b, and a write under a's older token is refused on every copy."""
    # A long grace: crewletd must not end the stopped applier for its silence.
    a, b = start_all([data_node(make_node, natsd, "a", node={"roles": ["data", "seats"], "labels": {"zone": "a"}},
                                supervisor={"heartbeat_grace": 120, "wedge_after": 120}),
                      data_node(make_node, natsd, "b", node={"roles": ["data", "seats"], "labels": {"zone": "b"}})])
    apply(a, write_company(short_tmp, estate_company("a"), "a.yaml"))
    wait_for(lambda: held(a).get("w") == "a", 20, what="a holds w")
    first = turn(a, "w", "create a task before")

    applier = a.process_pids()["data_applier"]
    os.kill(applier, signal.SIGSTOP)
    try:
        # a's own copy is out of service once its applier has been silent: a
        # search from a is then answered by b.
        wait_for(lambda: ctl_json(a, "search", "anything")["node"] == "b", 20,
                 what="a's estate served by b")
        during = turn(a, "w", "create a task while a's applier is stopped")
        assert held(a).get("w") == "a"  # a kept its seat
        task_id = during["reply"].split()[1]
        assert query(b, "task.get", id=task_id)["task"]["title"] == "while a's applier is stopped"
    finally:
        os.kill(applier, signal.SIGCONT)
    last = run(log_last(natsd.url))
    wait_for(lambda: converged([a, b], last), 20, what="a caught up")
    assert len(digests([a, b])) == 1

    # w moves to b (a higher token, fenced on every copy); a zombie write of
    # a's under its older token is refused.
    old_token = first["token"]
    apply(a, write_company(short_tmp, estate_company("b"), "b.yaml"))
    wait_for(lambda: held(b).get("w") == "b", 30, what="b took w")
    # b's claim raised w's fence to its token on every copy, before any turn of b's.
    token = next(s["token"] for s in b.status()["fleet"]["seats"] if s["name"] == "w")
    fence = f"fence:w:{token}"

    def fenced(node):
        return store.Reader(copy_of(node)).outcome(fence)
    wait_for(lambda: fenced(a) and fenced(b), 20, what=f"{fence} applied on both copies")
    assert fenced(a) == fenced(b) and fenced(a)["ok"]
    assert fenced(a)["result"] == {"seat": "w", "token": token}
    turn(b, "w", "create a task on b")
    zombie = op("task.create", {"title": "zombie"}, seat="w", token=old_token, id="zombie-1", node="a")
    run(publish_to(natsd.url, [zombie]))
    last = run(log_last(natsd.url))
    wait_for(lambda: converged([a, b], last), 20, what="both copies at the log's end")
    for node in (a, b):
        outcome = store.Reader(copy_of(node)).outcome("zombie-1", old_token)  # kept beside its token
        assert not outcome["ok"]
        assert outcome["error"].startswith(f"stale fencing token {old_token} for seat w")


def test_the_fleet_answers_while_a_data_node_is_down_and_it_catches_up(natsd, make_node):
    """Kill one of three data nodes whole: writes and floor-carrying reads go
    on through the others; restarted, it catches up to the same copy."""
    nodes = start_all([data_node(make_node, natsd, n) for n in "abc"])
    a, b, c = nodes
    wait_for(lambda: all(copy_of(n) is not None for n in nodes), 20, what="three copies made")

    async def write_and_read(router, n: int, tag: str) -> list[str]:
        made = []
        for i in range(n):
            outcome = await router.write(op("task.create", {"title": f"{tag} {i}"}, id=f"{tag}-{i}",
                                            node="tester", at=time.time()), timeout=30)
            assert outcome["ok"], outcome
            made.append(outcome["result"]["task"]["id"])
            # Read-your-writes: whoever answers has applied our floor.
            got = await router.read("task.get", {"id": made[-1]}, timeout=30)
            assert got["task"]["title"] == f"{tag} {i}"
        return made

    async def scenario() -> None:
        async with routed(natsd.url, read_wait=3, write_wait=10, serving=("a", "b", "c")) as router:
            await write_and_read(router, 20, "before")
            c.kill_all()
            await write_and_read(router, 20, "during")
    run(scenario())
    c.start()
    last = run(log_last(natsd.url))
    wait_for(lambda: converged(nodes, last), 30, what="c caught up")
    assert len(digests(nodes)) == 1
    assert len(query(c, "task.list", limit=100)["tasks"]) == 40


def test_nobody_answering_is_an_error_naming_every_data_node(natsd, make_node):
    """With its only data node evicted, or gone, a node without data says so —
    never an empty list — and a search says it could not be searched."""
    # A long grace: crewletd must not end (and restart) the stopped applier.
    a, s = start_all([data_node(make_node, natsd, "a", supervisor={"heartbeat_grace": 120, "wedge_after": 120}),
                      fleet_node(make_node, natsd, "s", node={"roles": ["seats"]})])
    wait_for(lambda: copy_of(a) is not None, 20, what="a's copy made")
    assert ctl_json(s, "tasks")["tasks"] == []  # answered: the company has none

    def refused():
        out = ctl(s, "tasks")
        return out if out.returncode == 1 else None

    # The last copy in service is not evicted without --force (the gate).
    wait_for(lambda: ctl(s, "tasks").returncode == 0, 20, what="a's copy in service")
    gated = ctl(s, "evict", "a", "--reason", "disk failing")
    assert gated.returncode == 1 and "only copy of the estate in service" in gated.stderr, gated.stderr
    assert ctl(s, "tasks").returncode == 0  # still served
    # Evicted (from a node without data: any node may say so), then back.
    evict = ctl(s, "evict", "a", "--reason", "disk failing", "--force")
    assert evict.returncode == 0 and evict.stdout.strip() == "evicted a: disk failing", evict.stderr
    out = wait_for(refused, 20, what="crewletctl tasks refused while a is evicted")
    assert "node a: out of service: node evicted: disk failing" in out.stderr
    assert ctl(s, "evict", "a", "--undo").returncode == 0
    wait_for(lambda: ctl(s, "tasks").returncode == 0, 20, what="a back in service")

    os.kill(a.process_pids()["data_applier"], signal.SIGSTOP)  # a still present, its applier not
    try:
        out = wait_for(refused, 30, what="crewletctl tasks refused")
        assert "no data node answered" in out.stderr and "node a:" in out.stderr
        search = ctl(s, "search", "anything")
        assert search.returncode == 1 and "could not be searched" in search.stderr
        assert "node a:" in search.stderr
    finally:
        a.kill_all()


@pytest.mark.timeout(180)
def test_a_seat_on_a_leaf_node_works_the_estate_of_an_embedded_r3_cluster(make_node, short_tmp):
    """The production shape: three data nodes whose brokers are one R3
    cluster, and a node without data on a leaf of them (no JetStream of its
    own: it reaches the log and the appliers through the domain and the leaf
    connection). Its seat's writes land on all three copies."""
    from tests.fleet.test_cluster import make_members, start_alone

    fast = {"heartbeat": 1, "lease_ttl": 5, "sweep": 0.5}
    members, leaf_urls = make_members(make_node, fleet=fast)
    edge = make_node(node={"id": "fd", "roles": ["seats"], "labels": {"zone": "edge"}}, fleet=fast,
                     stream={"replicas": 3, "leaf": {"remotes": leaf_urls}})
    for node in members:
        start_alone(node)
    for node in members:
        node.wait_running(timeout=60)
    edge.start()
    wait_for(lambda: len((members[0].status()["fleet"] or {}).get("nodes", [])) == 4, 60,
             what="four nodes present")
    apply(edge, write_company(short_tmp, estate_company("edge"), "leaf.yaml"))
    wait_for(lambda: held(edge).get("w") == "fd", 60, what="the leaf node holds w")

    task_id = turn(edge, "w", "create a task from the edge")["reply"].split()[1]
    turn(edge, "w", "write a page edge/notes: written beyond the leaf")
    assert "edge/notes" in turn(edge, "w", "search beyond")["reply"]
    assert [t["id"] for t in ctl_json(edge, "tasks")["tasks"]] == [task_id]

    def at_end() -> bool:
        lasts = [applied(n) for n in members]
        return min(lasts) > 0 and len(set(lasts)) == 1 and all(
            query(n, "task.get", id=task_id)["task"] is not None for n in members)
    wait_for(at_end, 30, what="the three copies at the same place, holding the task")
    assert len(digests(members)) == 1
