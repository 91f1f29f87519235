"""The ``collector`` duty: a walk against a real nats-server, and the duty on a real node.

Against :func:`natsd`, the walk (:func:`roles.workers.duties.collector.walk`)
is given the rows' side as a plain async callable (the set of names a row
gives), so one store holds every case at once: an object a row names, an
orphan older than grace, an orphan younger, an object outside ``files/``.
A walk whose rows' side fails — given as a callable that raises, and as the
real estate reader on a fleet with no data node — removes nothing.

On a real node (its own broker, the workers and data roles, ``files: {grace:
3, collect_every: 1}``), an orphan put straight into the node's files bucket
lasts until grace and then goes; an object a ``file.register`` row names is
never removed; the ``objects`` slot's ``collector`` record and the duty's
report say so. The estate reader pages through ``file.list`` whole.
"""

from __future__ import annotations

import time
import uuid

import nats

from crewlet.coord import buckets, duty_reports
from crewlet.estate.ops import make_op
from crewlet.objects import open_store, slot
from crewlet.objects.files import object_name
from roles.workers.duties.collector import EstateUnread, estate_names, walk
from tests.conftest import wait_for
from tests.estate import applied, publish_all, query, routed, run, until
from tests.seats import node_url

GRACE = 1.0          # s: the walk tests' grace (the node test's is its config's)
MAX = 1 << 20


async def _store(url: str, nc_out: list):
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    nc_out.append(nc)
    return await open_store("nats", js=nc.jetstream(timeout=5), nc=nc, bucket="files")


async def _older_than_grace(store, name: str) -> None:
    """Wait (a condition with a deadline) until object *name* is over GRACE old."""
    created = (await store.info(name)).created
    await until(lambda: time.time() - created > GRACE + 0.05, GRACE + 5, what=f"{name} older than grace")


async def _stocked(store) -> dict[str, str]:
    """The four cases in *store*: named, old orphan, young orphan, another prefix's."""
    case = {"named": object_name("p"), "old": object_name("p"), "young": object_name("q"),
            "other": "snapshots/s1"}
    await store.put(case["named"], b"n" * 1000, max_bytes=MAX)
    await store.put(case["old"], b"o" * 3000, max_bytes=MAX)
    await store.put(case["other"], b"s" * 10, max_bytes=MAX)
    await _older_than_grace(store, case["old"])
    await store.put(case["young"], b"y" * 500, max_bytes=MAX)
    return case


async def _names(store) -> set[str]:
    return {info.name async for info in store.names()}


def test_a_walk_removes_only_the_old_orphan(natsd):
    async def main():
        ncs: list = []
        try:
            store = await _store(natsd.url, ncs)
            case = await _stocked(store)
            asked = []

            async def named() -> set[str]:
                asked.append(await _names(store))   # the objects were listed before the rows are read
                return {case["named"], object_name("p")}   # a row whose object is gone: nothing to do

            found = await walk(store, named, grace=GRACE)
            assert asked == [set(case.values())]
            assert await _names(store) == {case["named"], case["young"], case["other"]}
            assert {k: found[k] for k in ("objects", "bytes", "named", "kept_young", "removed",
                                          "removed_bytes", "others", "swept", "error")} == {
                "objects": 3, "bytes": 4500, "named": 1, "kept_young": 1, "removed": 1,
                "removed_bytes": 3000, "others": 1, "swept": 0, "error": None}

            # Once the young orphan is old too, the next walk takes it; the named one stays.
            await _older_than_grace(store, case["young"])
            found = await walk(store, named, grace=GRACE)
            assert found["removed"] == 1 and found["named"] == 1 and found["kept_young"] == 0
            assert await _names(store) == {case["named"], case["other"]}
        finally:
            for nc in ncs:
                await nc.close()
    run(main(), 60)


def test_a_walk_removes_the_old_snapshots_the_slot_does_not_name(natsd):
    """A snapshot whose publish died between its object and the slot, or an
    old one whose delete failed, goes once older than grace; the ones the
    slot names stay, and nothing goes while the slot cannot be read."""
    async def main():
        ncs: list = []
        try:
            store = await _store(natsd.url, ncs)
            named_one, orphan, young = (f"snapshots/{seq:020d}.mdb" for seq in (20, 10, 30))
            for name in (named_one, orphan):
                await store.put(name, b"m" * 400, max_bytes=MAX)
            await _older_than_grace(store, orphan)
            await store.put(young, b"y" * 40, max_bytes=MAX)

            async def no_rows() -> set[str]:
                return set()

            async def unreadable() -> set[str]:
                raise TimeoutError("the slot's leader is being elected")

            found = await walk(store, no_rows, grace=GRACE, snapshots_named=unreadable)
            assert await _names(store) == {named_one, orphan, young}
            assert found["removed"] == 0 and "no snapshot was removed" in found["error"], found

            async def slot() -> set[str]:
                return {named_one}

            found = await walk(store, no_rows, grace=GRACE, snapshots_named=slot)
            assert await _names(store) == {named_one, young}
            assert (found["snapshots"], found["removed"], found["removed_bytes"], found["error"]) == \
                (3, 1, 400, None)
        finally:
            for nc in ncs:
                await nc.close()
    run(main(), 60)


def test_a_walk_that_cannot_read_the_rows_removes_nothing(natsd):
    async def main():
        ncs: list = []
        try:
            store = await _store(natsd.url, ncs)
            case = await _stocked(store)
            before = await _names(store)

            async def failing() -> set[str]:
                raise EstateUnread("file.list page 3: NobodyAnswered: every copy out of service")

            found = await walk(store, failing, grace=GRACE)
            assert await _names(store) == before
            assert found["removed"] == 0 and found["named"] is None and found["objects"] == 3
            assert "nothing was removed" in found["error"] and "page 3" in found["error"]

            # The real estate reader, on a fleet with no data node at all: nobody
            # answers file.list, and still nothing goes.
            js = ncs[0].jetstream(timeout=5)
            for bucket in (buckets.LEASES, buckets.STATUS):
                await buckets.ensure(js, bucket, 1)
            async with routed(natsd.url, read_wait=0.5) as router:
                reader = estate_names(router, timeout=1.0)
                try:
                    await reader()
                    raise AssertionError("file.list answered with no data node")
                except EstateUnread as exc:
                    assert "file.list page 1" in str(exc), exc
                found = await walk(store, reader, grace=GRACE)
            assert await _names(store) == before
            assert found["removed"] == 0 and "NobodyAnswered" in found["error"], found
            assert case["old"] in before
        finally:
            for nc in ncs:
                await nc.close()
    run(main(), 60)


# ---------------------------------------------------------------- on a real node

FAST = {"heartbeat": 0.5, "lease_ttl": 3, "sweep": 0.5}
FILES = {"grace": 3, "collect_every": 1}


def _register(project: str, path: str, obj: str | None, i: int):
    args = {"project": project, "path": path, "size": 1, "sha256": "ab" * 32}
    if obj is not None:
        args["object"] = obj
    return make_op("file.register", args, node="tester", id=f"test:file:{i}:{uuid.uuid4().hex[:8]}")


def test_the_duty_on_a_node_collects_orphans_after_grace_and_never_a_named_object(make_node):
    n = make_node(fleet=FAST, files=FILES).start()
    url = node_url(n)
    n.wait_event("duty_started", 30, duty="collector")
    n.wait_event("objects_collected", 30)   # a walk of the empty store

    async def main():
        ncs: list = []
        try:
            store = await _store(url, ncs)
            js = ncs[0].jetstream(timeout=5)
            # Rows first (their objects are not stored yet: an upload racing
            # its row the other way round must not matter either), then the objects.
            named = [object_name("p") for _ in range(5)]
            ops = [_register("p", f"f{i}.txt", name, i) for i, name in enumerate(named)]
            ops.append(_register("p", "bare.txt", None, 99))          # a row without bytes
            landed = await publish_all(js, ops)
            last = max(seq for seq, _ in landed)
            await until(lambda: applied(n) >= last, 20, what="the rows applied")
            assert len(query(n, "file.list")["files"]) == 6

            # The estate reader pages through file.list whole (2 rows a page).
            async with routed(url, serving=("t1",)) as router:
                assert await estate_names(router, page=2)() == set(named)

            for name in named:
                await store.put(name, b"kept", max_bytes=MAX)
            orphan = object_name("p")
            await store.put(orphan, b"x" * 700, max_bytes=MAX)
            created = (await store.info(orphan)).created   # by the store's clock, as the walk sees it
            other = "backups/never-collected"   # neither a file's nor a snapshot's
            await store.put(other, b"s", max_bytes=MAX)

            # The orphan lasts until grace, then goes; nothing else does.
            await until(lambda: _gone(store, orphan), 30, what="the orphan collected")
            gone_at = time.time()
            assert gone_at - created >= FILES["grace"], gone_at - created
            names = await _names(store)
            assert set(named) | {other} == names, names

            # Several more walks: the named objects stay.
            record = (await slot.read(js))["collector"]
            walks = record["at"]
            await until(lambda: _walked_since(js, walks + 2 * FILES["collect_every"]), 30,
                        what="two more walks")
            assert await _names(store) == set(named) | {other}

            found = (await slot.read(js))["collector"]
            assert found["node"] == "t1" and found["error"] is None, found
            assert found["objects"] == 5 and found["named"] == 5 and found["removed"] == 0
            assert found["bytes"] == 5 * len(b"kept") and found["others"] == 1
            assert {"at", "kept_young", "removed_bytes", "swept"} <= found.keys()
            report = await duty_reports.read(js, "collector")
            assert report["totals"]["removed"] == 1 and report["totals"]["removed_bytes"] == 700
            assert report["token"] >= 1 and report["errors"] == []
            # The slot is the objects bucket's, as crewletctl reads it.
            assert (await buckets.last(js, buckets.OBJECTS.name, slot.COLLECTOR))[1]
        finally:
            for nc in ncs:
                await nc.close()
    run(main(), 150)
    # The log's lines come a moment after the report the test waited on (crewletd forwards them).
    wait_for(lambda: n.events_named("objects_collected", removed=1) and n.events_named("object_collected"),
             10, what="the removing walk's log lines forwarded")
    walks = n.events_named("objects_collected")
    assert any(e["kept_young"] == 1 for e in walks), walks   # the orphan seen, and kept while young
    removed = n.events_named("object_collected")
    assert len(removed) == 1 and removed[0]["size"] == 700 and removed[0]["age_s"] >= FILES["grace"]
    assert any(e["removed"] == 1 and e["error"] is None for e in walks), walks


async def _gone(store, name: str) -> bool:
    return await store.info(name) is None


async def _walked_since(js, at: float) -> bool:
    found = (await slot.read(js))["collector"] or {}
    return found.get("at", 0) > at

