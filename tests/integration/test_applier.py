"""The data applier against a real nats-server and real LMDB copies.

Most checks run :class:`roles.data_applier.applier.Applier` in-process (two of
them stand for two data nodes, each with its own connection and data dir);
the kill check runs a real crewletd node and SIGKILLs its ``data_applier``
child while the log grows, then holds its copy against an in-process
applier's that applied the same log without interruption.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from contextlib import asynccontextmanager
from typing import Any

import nats
import pytest
import zmq

from crewlet import ipc
from crewlet.estate import log as estate_log
from crewlet.estate import apply, store, wire
from crewlet.estate.origins import OPERATOR
from crewlet.estate.ops import make_op
from crewlet.groups import GroupRefused
from crewlet.queue import JetStreamMailboxes
from roles.data_applier.applier import Applier, rows_below, rules_changed, rules_newer
from roles.data_applier import custody as custody_module
from roles.data_applier import grants
from roles.data_applier.custody import Custody
from tests.conftest import wait_for
from tests.seats import node_url
from tests.estate import applied, copy_of, grant, publish_all, run, until

DEADLINE = 30.0  # s for one whole check (tests.estate.run's cap)


async def _quiet(exc: Exception) -> None:
    """nats-py prints every connection error with a traceback unless told otherwise."""


@asynccontextmanager
async def connection(url: str):
    nc = await nats.connect(url, connect_timeout=2, error_cb=_quiet)
    try:
        yield nc, nc.jetstream(timeout=2)
    finally:
        try:
            await nc.close()
        except OSError:
            pass  # closing toward a broker that went away (nats-py drains the socket)


@asynccontextmanager
async def applier(url: str, data_dir: str, node: str, *, custody: bool = False):
    """A running in-process applier with its own connection, stopped on exit."""
    async with connection(url) as (nc, js):
        a = Applier(nc, js, node, data_dir)
        a.start(custody_roles=("data",) if custody else None)
        try:
            yield a
        finally:
            await a.stop()


def mixed_op(rng: random.Random, writer: str, i: int):
    """One op of a random mix of every kind (refusals included: they are outcomes too)."""
    seat = rng.choice(["cto", "cfo"])
    task = f"T{rng.randint(1, 40)}"
    choice = rng.randrange(10)
    if choice == 0:
        return make_op("task.create", {"title": f"{writer} task {i}", "labels": ["x"]}, node=writer)
    if choice == 1:
        return make_op("task.update", {"id": task, "status": rng.choice(["doing", "done"]),
                                       "assignee": seat}, node=writer)
    if choice == 2:
        return make_op("task.comment", {"id": task, "body": f"comment {i}"}, node=writer)
    if choice == 3:
        return make_op("page.write", {"path": f"kb/p{rng.randint(1, 8)}", "title": f"page {i}",
                                      "body": f"deploy notes {i} " * 5}, node=writer)
    if choice == 4:
        return make_op("page.delete", {"path": f"kb/p{rng.randint(1, 8)}"}, node=writer)
    if choice == 5:
        return make_op("file.register", {"project": "p", "path": f"f{rng.randint(1, 5)}",
                                         "size": i, "sha256": "ab" * 32}, node=writer)
    if choice == 6:
        return make_op("turn.record", {"record": {"seat": seat, "turn": i}}, node=writer,
                       seat=seat, token=rng.randint(1, 6))
    if choice == 7:
        return make_op("diary.write", {"seat": seat, "text": f"note {rng.randint(1, 5)}"},
                       node=writer, seat=seat, token=rng.randint(1, 6))
    if choice == 8:
        return make_op("episode.add", {"seat": seat, "summary": f"did {i}"}, node=writer)
    return make_op("seat.fence", {}, node=writer, seat=seat, token=rng.randint(1, 6))


# ------------------------------------------------------------------ the log

def test_two_writers_land_in_order_and_identically_in_two_copies(natsd, short_tmp):
    async def check():
        async with connection(natsd.url) as (nc, js):
            await estate_log.ensure_stream(js, 1)
            # Ensuring again changes nothing (and never re-creates).
            again = await estate_log.ensure_stream(js, 3)
            assert again.config.num_replicas == 1 and again.config.duplicate_window == 120
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                async with connection(natsd.url) as (_, js1), connection(natsd.url) as (_, js2):
                    ops1 = [mixed_op(random.Random(1), "w1", i) for i in range(300)]
                    rng = random.Random(2)
                    ops2 = [mixed_op(rng, "w2", i) for i in range(300)]
                    landed = sum(await asyncio.gather(publish_all(js1, ops1), publish_all(js2, ops2)),
                                 [])
                last = max(seq for seq, _ in landed)
                assert sorted(seq for seq, _ in landed) == list(range(1, 601))
                # b starts after the log is written: it catches up in batches.
                async with applier(natsd.url, f"{short_tmp}/b", "b") as b:
                    await until(lambda: a.applied == last and b.applied == last, 15, "both applied")
                    tokens = {op.id: op.token for op in ops1 + ops2}  # stale refusals are kept by token
                    for copy in (a, b):
                        for seq, op_id in landed:
                            assert copy.reader.outcome(op_id, tokens[op_id])["seq"] == seq
                    assert store.digest(a.store) == store.digest(b.store)
                    assert store.dump(a.store) == store.dump(b.store)
                    # Ids come from the log: every task is T<its seq>.
                    tasks = a.reader.query("task.list", {"limit": 500})["tasks"]
                    assert tasks and all(t["id"] == f"T{t['seq']}" for t in tasks)
                    # The search index reflects the copy (it catches up only
                    # after commits that changed pages), and finds every page.
                    assert a.index.reflects(a.store) == last
                    hits = (await a.handle(wire.read_request("page.search", {"query": "deploy"},
                                                             floor=last), origin=OPERATOR))["answer"]["hits"]
                    pages = a.reader.query("page.list", {})["pages"]
                    assert {h["path"] for h in hits} == {p["path"] for p in pages}
    run(check(), DEADLINE)


def test_a_duplicated_op_id_lands_once_and_both_answers_carry_the_first_outcome(natsd, short_tmp):
    async def check():
        async with applier(natsd.url, f"{short_tmp}/a", "a") as a, \
                connection(natsd.url) as (_, js):
            await until(lambda: a.log_first is not None, what="the log ensured")
            # Published twice: the broker stores it once.
            op = make_op("task.create", {"title": "once"}, node="w")
            seq1, dup1 = await estate_log.publish(js, op, timeout=2)
            seq2, dup2 = await estate_log.publish(js, op, timeout=2)
            assert (dup1, dup2) == (False, True) and seq1 == seq2
            # Sent twice through the applier: published once, the same outcome twice.
            op2 = make_op("task.create", {"title": "twice"}, node="w")
            first = await a.handle(wire.write_request(op2, wait=5), origin=OPERATOR)
            second = await a.handle(wire.write_request(op2, wait=5), origin=OPERATOR)
            assert first["status"] == second["status"] == "ok"
            assert first["answer"] == second["answer"]
            assert first["answer"]["ok"] and first["answer"]["result"]["task"]["title"] == "twice"
            assert first["seq"] == second["seq"] == first["answer"]["seq"]
            # Past the broker's window the op may land in the log again: the
            # copy's op table makes it a no-op with the first outcome.
            await js.publish(estate_log.SUBJECT, op2.encode(), headers={"Nats-Msg-Id": "late-resend"})
            info = await js.stream_info(estate_log.STREAM)
            await until(lambda: a.applied == info.state.last_seq, what="the resend applied")
            third = await a.handle(wire.write_request(op2, wait=5), origin=OPERATOR)
            assert third["answer"] == first["answer"]
            titles = [t["title"] for t in a.reader.query("task.list", {})["tasks"]]
            assert sorted(titles) == ["once", "twice"]
            assert info.state.messages == 3
    run(check(), DEADLINE)


def test_a_stale_fencing_token_is_refused_and_the_refusal_is_the_outcome(natsd, short_tmp):
    async def check():
        async with applier(natsd.url, f"{short_tmp}/a", "a") as a, \
                connection(natsd.url) as (_, js):
            old = await grant(js, "cto", "n1")
            new = await grant(js, "cto", "n2", release=False)
            fence = make_op("seat.fence", {}, node="n2", seat="cto", token=new)
            got = await a.handle(wire.write_request(fence, wait=5), origin=OPERATOR)
            assert got["status"] == "ok" and got["answer"]["ok"]
            stale = make_op("task.create", {"title": "late"}, node="n1", seat="cto", token=old)
            got = await a.handle(wire.write_request(stale, wait=5), origin=OPERATOR)
            assert got["status"] == "ok"
            assert got["answer"]["ok"] is False
            assert got["answer"]["error"] == f"stale fencing token {old} for seat cto: the seat is at {new}"
            # The refusal is kept: asked again, the same answer, nothing published.
            again = await a.handle(wire.write_request(stale, wait=5), origin=OPERATOR)
            assert again["answer"] == got["answer"]
            assert a.reader.query("task.list", {})["tasks"] == []
    run(check(), DEADLINE)


def test_a_forged_fence_token_is_refused_and_locks_nobody_out(natsd, short_tmp):
    """A seat.fence published straight to the log under a token no lease
    granted (too high, another seat's, another node's, a renewal's revision)
    is refused on every copy alike, and the owner's writes still land."""
    async def check():
        async with applier(natsd.url, f"{short_tmp}/a", "a") as a, \
                connection(natsd.url) as (_, js):
            other = await grant(js, "ceo", "n2", release=False)
            token = await grant(js, "cto", "n2", release=False)
            forged = [make_op("seat.fence", {}, node="n2", seat="cto", token=10**12, id="f1"),
                      make_op("seat.fence", {}, node="n2", seat="cto", token=other + 100, id="f2"),
                      make_op("seat.fence", {}, node="n2", seat="cto", token=max(token, other) + 1, id="f3"),
                      make_op("seat.fence", {}, node="evil", seat="ceo", token=other, id="f4"),
                      make_op("seat.fence", {}, node="n2", seat="cto", token=other, id="f5")]
            await publish_all(js, forged)
            await until(lambda: all(a.reader.outcome(o.id, o.token) for o in forged), what="forgeries applied")
            for o in forged:
                outcome = a.reader.outcome(o.id, o.token)
                assert outcome["ok"] is False and "not a lease the fleet granted" in outcome["error"], outcome
            # The owner's write lands, and raises the fence to its own token.
            write = make_op("task.create", {"title": "still mine"}, node="n2", seat="cto", token=token)
            got = await a.handle(wire.write_request(write, wait=5), origin=OPERATOR)
            assert got["answer"]["ok"], got
            # A second copy built later from the same log reaches the same
            # outcomes (the verdicts are recorded, not judged again).
            async with applier(natsd.url, f"{short_tmp}/b", "b") as b:
                await until(lambda: b.applied == a.applied, what="the second copy caught up")
                assert store.digest(b.store) == store.digest(a.store)
    run(check(), DEADLINE)


def test_a_read_waits_for_its_floor_or_answers_behind(natsd, short_tmp):
    async def check():
        async with applier(natsd.url, f"{short_tmp}/a", "a") as a, \
                connection(natsd.url) as (_, js):
            await until(lambda: a.log_first is not None, what="the log ensured")
            # A floor the log has not reached yet: the read waits for it...
            pending = asyncio.create_task(a.handle(wire.read_request("task.get", {"id": "T1"},
                                                                     floor=1, wait=10), origin=OPERATOR))
            await until(lambda: a._waiters, 5, "the read waiting for its floor")
            assert not pending.done()
            await publish_all(js, [make_op("task.create", {"title": "first"}, node="w")])
            got = await pending
            assert got["status"] == "ok" and got["applied"] >= 1
            assert got["answer"]["task"]["title"] == "first"
            # ...and says it is behind when the floor is not reached in the wait.
            t0 = time.monotonic()
            got = await a.handle(wire.read_request("task.list", {}, floor=50, wait=0.5), origin=OPERATOR)
            assert got == {"status": "behind", "node": "a", "applied": 1, "floor": 50}
            assert 0.4 < time.monotonic() - t0 < 3
            # Never past the deadline, whatever the wait says.
            t0 = time.monotonic()
            got = await a.handle(wire.read_request("task.list", {}, floor=50, wait=10,
                                                   deadline=time.time() + 0.3), origin=OPERATOR)
            assert got["status"] == "behind" and time.monotonic() - t0 < 2
            # A bad request says which field and why.
            bad = await a.handle(wire.read_request("task.get", {"id": "nope"}), origin=OPERATOR)
            assert bad["status"] == "bad_request" and "task.get: id" in bad["reason"]
            bad = await a.handle({"kind": "write", "op": {"id": "x"}, "wait": 1}, origin=OPERATOR)
            assert bad["status"] == "bad_request" and "'kind'" in bad["reason"]
    run(check(), DEADLINE)


def test_concurrent_writes_are_committed_together_each_answered_with_its_own_seq(natsd, short_tmp):
    """Group commit: writes arriving while a transaction commits join the
    next one. Each is answered once committed, with the seq it landed at and
    its own outcome; the copy commits fewer transactions than it applies ops."""
    n = 200

    async def check():
        async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
            await until(lambda: a.log_first is not None and a.in_service, what="the log ensured")
            commits = a.commits
            ops = [make_op("task.create", {"title": f"together {i}"}, node="w") for i in range(n)]
            answers = await asyncio.gather(*(a.handle(wire.write_request(op, wait=20), origin=OPERATOR)
                                             for op in ops))
            assert all(x["status"] == "ok" and x["answer"]["ok"] for x in answers), answers[:3]
            seqs = [x["seq"] for x in answers]
            assert sorted(seqs) == list(range(1, n + 1))  # each its own
            for op, x in zip(ops, answers):
                # The answer is the outcome the copy keeps, and durable there
                # when it is given: a reader of the files sees it.
                assert x["answer"]["seq"] == x["seq"] and x["applied"] >= x["seq"]
                assert x["answer"]["result"]["task"] == {**x["answer"]["result"]["task"],
                                                         "id": f"T{x['seq']}", "title": op.args["title"]}
                assert a.reader.outcome(op.id) == x["answer"]
            assert a.applied == n and a.stats["ops"] == n
            assert 0 < a.commits - commits < n
            # Ops that arrive while the writer is busy queue for it, and it
            # takes them all into its next transaction itself: one commit.
            release = threading.Event()
            busy = asyncio.create_task(a.write(release.wait, 20))
            queued = [make_op("task.create", {"title": f"queued {i}"}, node="w") for i in range(50)]
            writes = [asyncio.create_task(a.handle(wire.write_request(op, wait=20), origin=OPERATOR))
                      for op in queued]
            await until(lambda: a._queued == len(queued), 10, "the ops queued behind the busy writer")
            commits = a.commits
            assert not any(w.done() for w in writes)  # none answered before its commit
            release.set()
            assert await busy
            answers = await asyncio.gather(*writes)
            assert sorted(x["seq"] for x in answers) == list(range(n + 1, n + 51))
            assert all(x["answer"]["ok"] for x in answers) and a.commits - commits == 1
            # Nothing changed a page: the index was not caught up, and still
            # reflects the copy (a search with any of these floors runs).
            found = await a.handle(wire.read_request("page.search", {"query": "together"}, floor=n),
                                   origin=OPERATOR)
            assert found["status"] == "ok" and found["answer"]["hits"] == []
            # A page written among other writes is found by a search that
            # carries its seq as the floor, as soon as the write is answered.
            page = make_op("page.write", {"path": "kb/joined", "title": "Joined",
                                          "body": "written amid tasks"}, node="w")
            more = [make_op("task.create", {"title": f"beside {i}"}, node="w") for i in range(20)]
            got = await asyncio.gather(*(a.handle(wire.write_request(op, wait=20), origin=OPERATOR)
                                         for op in [*more[:10], page, *more[10:]]))
            wrote = got[10]
            assert wrote["status"] == "ok" and wrote["answer"]["ok"]
            found = await a.handle(wire.read_request("page.search", {"query": "amid"},
                                                     floor=wrote["seq"], wait=1), origin=OPERATOR)
            assert found["status"] == "ok"
            assert [h["path"] for h in found["answer"]["hits"]] == ["kb/joined"]
    run(check(), DEADLINE)


def test_a_request_past_its_deadline_is_not_run(natsd, short_tmp):
    async def check():
        async with applier(natsd.url, f"{short_tmp}/a", "a") as a, \
                connection(natsd.url) as (_, js):
            await until(lambda: a.log_first is not None, what="the log ensured")
            op = make_op("task.create", {"title": "too late"}, node="w")
            got = await a.handle(wire.write_request(op, wait=5, deadline=time.time() - 0.01),
                                 origin=OPERATOR)
            assert got is None  # dropped: no answer, nothing ran
            info = await js.stream_info(estate_log.STREAM)
            assert info.state.messages == 0
            assert a.reader.outcome(op.id) is None
            assert a.stats["dropped"] == 1
    run(check(), DEADLINE)


def test_the_applier_follows_the_log_across_a_stream_leader_change(nats_cluster, short_tmp):
    """R3: the member leading ESTATE, which the applier is connected to, is
    SIGKILLed mid-stream; the copy still reaches every op the log holds."""
    urls = [s.url for s in nats_cluster]

    async def check():
        async with connection(urls[0]) as (nc, js):
            # A fresh cluster may refuse its first stream a moment.
            info = await until(lambda: estate_log.ensure_stream(js, 3), 10, "the log on the cluster",
                               ignoring=(nats.errors.Error,))
            leader = info.cluster.leader
            # As a node does at boot: an R3 bucket cannot be made with a member down.
            await until(lambda: grants.open_bucket(js, 3), 10, "the grants bucket on the cluster",
                        ignoring=(nats.errors.Error,))
        first = next(s for s in nats_cluster if s.name == leader)
        others = [s.url for s in nats_cluster if s is not first]
        nc = await nats.connect(servers=[first.url, *others], dont_randomize=True, error_cb=_quiet,
                                reconnect_time_wait=0.2, max_reconnect_attempts=-1)
        pnc = await nats.connect(servers=others, reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                                 error_cb=_quiet)
        a = Applier(nc, nc.jetstream(timeout=2), "a", f"{short_tmp}/a", replicas=3)
        a.start()
        try:
            pjs = pnc.jetstream(timeout=2)
            rng = random.Random(7)
            await publish_all(pjs, [mixed_op(rng, "w", i) for i in range(200)])
            first.kill()
            await publish_all(pjs, [mixed_op(rng, "w", 200 + i) for i in range(200)])
            last = (await pjs.stream_info(estate_log.STREAM)).state.last_seq
            assert last == 400
            await until(lambda: a.applied == last, 15, "every op applied after the change")
            assert a.in_service
        finally:
            await a.stop()
            await nc.close()
            await pnc.close()
    run(check(), DEADLINE)


# ------------------------------------------------------------------ out of service

def test_rows_below_the_logs_first_sequence_put_the_copy_out_of_service(natsd, short_tmp):
    async def check():
        async with connection(natsd.url) as (nc, js):
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: a.log_first is not None, what="the log ensured")
                await publish_all(js, [make_op("task.create", {"title": f"t{i}"}, node="w")
                                       for i in range(10)])
                await until(lambda: a.applied == 10, what="ten applied")
            # Stopped: the log grows and is trimmed past what this copy applied.
            await publish_all(js, [make_op("task.create", {"title": f"u{i}"}, node="w")
                                   for i in range(10)])
            await js.purge_stream(estate_log.STREAM, seq=15)
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                reason = rows_below(10, 15)
                assert reason == "rows below the log's first sequence (applied 10, the log starts at 15)"
                await until(lambda: a.reason == reason, what="out of service")
                assert not a.in_service and a.applied == 10
                got = await a.handle(wire.read_request("task.list", {}), origin=OPERATOR)
                assert got == {"status": "out_of_service", "node": "a", "reason": reason}
                op = make_op("task.create", {"title": "nope"}, node="w")
                got = await a.handle(wire.write_request(op, wait=2), origin=OPERATOR)
                assert got["status"] == "out_of_service"
                kv = await js.key_value("status")
                await until(lambda: a.log_first == 15, what="the bounds read")
                record = json.loads((await kv.get("estate.a")).value)
                assert record["in_service"] is False and record["reason"] == reason
                assert (record["applied"], record["log_first"], record["log_last"]) == (10, 15, 20)
                assert a.applied == 10  # nothing applied past the hole
    run(check(), DEADLINE)


def _as_an_older_version_left_it(data_dir: str) -> None:
    """Make the copy at *data_dir* what a version before rules were kept
    left: no rules recorded, and a row this version's checks refuse (a task
    whose ``at`` is NaN, as the probe of issue 16 stored)."""
    copy = store.open_env(store.copy_path(data_dir))
    try:
        with copy.env.begin(write=True) as txn:
            txn.delete(store.RULES, db=copy.dbs["local"])
            txn.put(b"T999", store.pack({"id": "T999", "title": "forged", "at": float("nan")}),
                    db=copy.dbs["tasks"])
    finally:
        store.close_env(copy)


def test_a_copy_applied_under_older_rules_is_applied_again_from_the_log(natsd, short_tmp):
    async def check():
        async with connection(natsd.url) as (nc, js):
            await estate_log.ensure_stream(js, 1)
            rng = random.Random(3)
            await publish_all(js, [mixed_op(rng, "w", i) for i in range(60)])
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: a.applied == 60, what="the log applied")
                made_now = store.digest(a.store)
                assert store.rules(a.store) == apply.RULES
            _as_an_older_version_left_it(f"{short_tmp}/a")
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: a.applied == 60 and a.in_service, what="applied again")
                assert store.rules(a.store) == apply.RULES
                assert store.digest(a.store) == made_now  # the forged row is gone
                got = await a.handle(wire.read_request("task.get", {"id": "T999"}), origin=OPERATOR)
                assert got["status"] == "ok" and got["answer"]["task"] is None
            # The log no longer starts at 1: nothing to apply again from.
            await js.purge_stream(estate_log.STREAM, seq=10)
            _as_an_older_version_left_it(f"{short_tmp}/a")
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: a.reason == rules_changed(None, 10), what="out of service")
                assert a.reason == rules_changed(None, 10)
                assert "rules 1" in a.reason and f"rules {apply.RULES}" in a.reason
                assert not a.in_service and a.applied == 60
    run(check(), DEADLINE)


def test_a_copy_written_by_a_newer_version_is_refused_and_kept_as_it_is(natsd, short_tmp):
    async def check():
        async with connection(natsd.url) as (nc, js):
            await estate_log.ensure_stream(js, 1)
            rng = random.Random(5)
            await publish_all(js, [mixed_op(rng, "w", i) for i in range(20)])
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: a.applied == 20, what="the log applied")
                made_now = store.digest(a.store)
                store.record_rules(a.store, apply.RULES + 1)  # as a newer crewlet leaves it
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: a.reason == rules_newer(apply.RULES + 1), what="refused")
                assert "newer crewlet" in a.reason and f"rules {apply.RULES + 1}" in a.reason
                got = await a.handle(wire.read_request("task.list", {}), origin=OPERATOR)
                assert got["status"] == "out_of_service"
                assert store.digest(a.store) == made_now and a.applied == 20  # nothing emptied
                assert store.rules(a.store) == apply.RULES + 1
    run(check(), DEADLINE)


def test_a_copy_is_migrated_by_one_process_while_another_holds_the_lock(natsd, short_tmp):
    """An older copy is emptied and applied again under the migration lock;
    while another process holds it this applier waits, out of service, and
    migrates once the lock is free."""
    async def check():
        async with connection(natsd.url) as (nc, js):
            await estate_log.ensure_stream(js, 1)
            rng = random.Random(6)
            await publish_all(js, [mixed_op(rng, "w", i) for i in range(30)])
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: a.applied == 30, what="the log applied")
                made_now = store.digest(a.store)
            _as_an_older_version_left_it(f"{short_tmp}/a")
            path = os.path.join(store.copy_path(f"{short_tmp}/a"), "migrate.lock")
            holder = subprocess.Popen(  # another process holding the lock
                [sys.executable, "-c", "import fcntl, os, sys, time\n"
                 f"fd = os.open({path!r}, os.O_RDWR | os.O_CREAT)\n"
                 "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"],
                stdout=subprocess.PIPE, text=True)
            try:
                assert holder.stdout.readline().strip() == "held"
                async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                    await until(lambda: "another process is migrating" in (a.reason or ""),
                                what="waiting for the lock")
                    assert not a.in_service
                    holder.kill()
                    holder.wait()
                    await until(lambda: a.applied == 30 and a.in_service, what="migrated")
                    assert store.rules(a.store) == apply.RULES
                    assert store.digest(a.store) == made_now
            finally:
                if holder.poll() is None:
                    holder.kill()
                    holder.wait()
    run(check(), DEADLINE)


def test_a_log_made_anew_under_a_copy_puts_it_out_of_service(natsd, short_tmp):
    async def check():
        async with connection(natsd.url) as (nc, js):
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: a.log_first is not None, what="the log ensured")
                await publish_all(js, [make_op("task.create", {"title": f"t{i}"}, node="w")
                                       for i in range(5)])
                await until(lambda: a.applied == 5, what="five applied")
                await js.delete_stream(estate_log.STREAM)
                # Noticed, the log ensured again (empty): this copy is not of it.
                await until(lambda: (a.reason or "").startswith(
                    "the copy is ahead of the log (applied 5, the log ends at 0)"), 10, "ahead")
                # Even once the new log grows past the copy, it is another log.
                await publish_all(js, [make_op("task.create", {"title": f"n{i}"}, node="w")
                                       for i in range(8)])
                await until(lambda: (a.reason or "").startswith("the log was made anew"), 10,
                            "made anew")
                assert a.applied == 5
                got = await a.handle(wire.read_request("task.list", {}), origin=OPERATOR)
                assert got["status"] == "out_of_service"
    run(check(), DEADLINE)


def test_with_the_broker_gone_reads_answer_from_the_copy_and_writes_are_unvouched(
        natsd, short_tmp):
    async def check():
        async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
            op = make_op("task.create", {"title": "kept"}, node="w")
            got = await a.handle(wire.write_request(op, wait=5), origin=OPERATOR)
            assert got["status"] == "ok"
            natsd.stop()
            got = await a.handle(wire.read_request("task.list", {}, floor=got["seq"]), origin=OPERATOR)
            assert got["status"] == "ok" and [t["title"] for t in got["answer"]["tasks"]] == ["kept"]
            for kind, args in (("task.create", {"title": "lost?"}),
                               ("page.write", {"path": "kb/x", "title": "x", "body": "x"})):
                t0 = time.monotonic()
                got = await a.handle(wire.write_request(make_op(kind, args, node="w"), wait=1),
                                     origin=OPERATOR)
                assert got["status"] == "unvouched", got
                assert "may be in it" in got["reason"] or "not published" in got["reason"]
                assert time.monotonic() - t0 < 2.5  # never past the wait
    run(check(), DEADLINE)


def test_eviction_takes_the_copy_out_of_service_and_its_removal_brings_it_back(natsd, short_tmp):
    async def check():
        async with connection(natsd.url) as (nc, js):
            async with applier(natsd.url, f"{short_tmp}/a", "a") as a:
                await until(lambda: a.log_first is not None, what="the log ensured")
                kv = await until(lambda: js.key_value("status"), what="the status bucket",
                                 ignoring=(nats.errors.Error,))
                await kv.put("evicted.a", json.dumps({"reason": "disk failing", "at": 1}).encode())
                await until(lambda: a.reason == "node evicted: disk failing", what="evicted")
                got = await a.handle(wire.read_request("task.list", {}), origin=OPERATOR)
                assert got == {"status": "out_of_service", "node": "a",
                               "reason": "node evicted: disk failing"}

                async def recorded(in_service: bool) -> bool:
                    return json.loads((await kv.get("estate.a")).value)["in_service"] is in_service
                await until(lambda: recorded(False), what="the record out of service",
                            ignoring=(nats.errors.Error,))
                await kv.delete("evicted.a")
                await until(lambda: a.in_service, what="back in service")
                got = await a.handle(wire.read_request("task.list", {}), origin=OPERATOR)
                assert got["status"] == "ok"
                await until(lambda: recorded(True), what="the record in service",
                            ignoring=(nats.errors.Error,))
            # A clean stop leaves one last record saying so.
            final = json.loads((await kv.get("estate.a")).value)
            assert final["in_service"] is False and final["reason"] == "applier stopped"
    run(check(), DEADLINE)


# ------------------------------------------------------------------ custody

def test_an_idle_custody_is_quiet(natsd, short_tmp, monkeypatch):
    """Issue 16: an idle node logged ``custody_failed TimeoutError:`` every few
    minutes and attached again. nats-py answers a fetch that found nothing
    with its own TimeoutError, or, when the server's "no messages" to its
    first probe used up the wait, with a bare asyncio one. Both are an idle
    stream. A fetch wait of a few ms meets the second many times a second:
    custody stays attached and silent, and still keeps what comes."""
    import io

    from crewlet import log as crewlet_log

    lines = io.StringIO()
    # JSON lines at info, whatever an earlier test of this process configured.
    monkeypatch.setattr(crewlet_log._state, "stream", lines)
    monkeypatch.setattr(crewlet_log._state, "level", crewlet_log._LEVEL_NO["info"])
    monkeypatch.setattr(crewlet_log._state, "text", False)
    monkeypatch.setattr(custody_module, "FETCH_WAIT", 0.002)

    async def check():
        async with connection(natsd.url) as (nc, js):
            await JetStreamMailboxes(js, nc).ensure_streams(replicas=1, max_consumers=100)
            async with applier(natsd.url, f"{short_tmp}/a", "a", custody=True) as a:
                kept = await until(lambda: a.custody, what="custody running")
                await until(lambda: kept.stats["idle"] >= 500, 20, "500 idle fetches")
                await js.publish("events.turn.x", b"after the idle spell")
                await until(lambda: kept.stats["kept"] == 1, 10, "the event kept")
        events = [json.loads(line)["event"] for line in lines.getvalue().splitlines()]
        assert "custody_failed" not in events
        assert events.count("custody_attached") == 1, events
    run(check(), DEADLINE)


def test_each_event_is_kept_by_exactly_one_data_node(natsd, short_tmp):
    async def check():
        async with connection(natsd.url) as (nc, js):
            # crewletd's fleet makes EVENTS (with the mailboxes); here the test does.
            await JetStreamMailboxes(js, nc).ensure_streams(replicas=1, max_consumers=100)
            # A node without data may not attach: refused by name.
            refused = Custody(nc, js, None, None, roles=("seats", "workers"))
            with pytest.raises(GroupRefused, match="custody"):
                await refused.run()
            async with applier(natsd.url, f"{short_tmp}/a", "a", custody=True) as a, \
                    applier(natsd.url, f"{short_tmp}/b", "b", custody=True) as b:
                for i in range(200):
                    data = json.dumps({"n": i}).encode() if i % 2 else f"plain {i}".encode()
                    await js.publish("events.turn.x", data)

                def kept(copy):
                    with copy.store.env.begin() as txn:
                        return {store.key_seq(k): store.unpack(v)
                                for k, v in txn.cursor(db=copy.store.dbs["events"])}
                await until(lambda: len(kept(a)) + len(kept(b)) >= 200, 15, "every event kept")
                ka, kb = kept(a), kept(b)
                assert not set(ka) & set(kb), "an event kept twice"
                assert set(ka) | set(kb) == set(range(1, 201)), "an event lost"
                both = {**ka, **kb}
                assert both[2] == {"subject": "events.turn.x", "data": {"n": 1},
                                   "at": both[2]["at"]}
                assert both[1]["data"] == "plain 0"
                # Acked: nothing waits on the consumer.
                async def all_acked():
                    info = await js.consumer_info("EVENTS", "custody")
                    return info if info.num_ack_pending == 0 and info.num_pending == 0 else None
                info = await until(all_acked, what="every event acked", ignoring=(nats.errors.Error,))
                assert info.config.ack_wait == 30
                # The node-local table is not part of the copy's digest.
                got = await a.handle(wire.read_request("event.list", {"limit": 500}), origin=OPERATOR)
                assert len(got["answer"]["events"]) == len(ka)
                # A node out of service (evicted) takes no events: b keeps them all.
                status = await js.key_value("status")
                await status.put("evicted.a", json.dumps({"reason": "disk failing"}).encode())
                await until(lambda: not a.in_service, 10, "a evicted")
                before_a = len(kept(a))
                for i in range(200, 250):
                    await js.publish("events.turn.x", f"plain {i}".encode())
                await until(lambda: len(kept(a)) + len(kept(b)) >= 250, 15, "the new events kept")
                assert len(kept(a)) == before_a and set(range(201, 251)) <= set(kept(b))
    run(check(), DEADLINE)


# ------------------------------------------------------------------ a real node

def test_a_killed_applier_converges_to_an_uninterrupted_copy(make_node, short_tmp):
    node = make_node(node={"id": "t1", "roles": ["data"]},
                     supervisor={"intensity": 20, "backoff_min": 0.05, "backoff_max": 0.2})
    node.start()
    url = node_url(node)
    kills = 4
    chunk = 500
    started = [threading.Event() for _ in range(kills)]
    restarted = [threading.Event() for _ in range(kills)]
    landed: list[tuple[int, str]] = []
    failed: list[BaseException] = []

    async def publisher():
        async with connection(url) as (_, js):
            await estate_log.ensure_stream(js, 1)
            rng = random.Random(5)
            for k in range(kills):
                ops = [mixed_op(rng, "w", k * chunk + i) for i in range(chunk)]
                landed.extend(await publish_all(js, ops[:chunk // 5]))
                started[k].set()  # the kill lands while the rest is published
                landed.extend(await publish_all(js, ops[chunk // 5:]))
                # The next chunk goes to the next incarnation.
                await asyncio.wait_for(asyncio.to_thread(restarted[k].wait), 20)

    def publish_in_thread():
        try:
            run(publisher(), DEADLINE)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=publish_in_thread)
    thread.start()
    try:
        seen = 0
        for k in range(kills):
            assert started[k].wait(20), failed
            # Mid-stream: this incarnation has committed part of the log, more is coming.
            seen = wait_for(lambda: (n := applied(node)) > seen and n, 20,
                            what=f"incarnation {k} applying")
            pid = node.children()["data_applier"]["pid"]
            os.kill(pid, signal.SIGKILL)
            node.wait_running(timeout=15, exclude={"data_applier": pid})
            restarted[k].set()
    finally:
        for event in restarted:
            event.set()
        thread.join(30)
    assert not failed, failed
    assert node.children()["data_applier"]["restarts"] >= kills
    last = max(seq for seq, _ in landed)
    assert last == kills * chunk

    async def converge():
        async with applier(url, f"{short_tmp}/ref", "ref") as ref:
            await until(lambda: ref.applied == last, 20, "the uninterrupted copy")
            reference = store.digest(ref.store)
        async with connection(url) as (nc, js):
            kv = await js.key_value("status")
            async def node_applied() -> bool:
                return json.loads((await kv.get("estate.t1")).value)["applied"] == last
            await until(node_applied, what="the node applied", ignoring=(nats.errors.Error,))
            record = json.loads((await kv.get("estate.t1")).value)
            assert record["in_service"] is True and record["log_last"] == last
            # Asked over NATS (any node's way in): answered from its copy.
            seq, op_id = landed[-1]
            reply = await nc.request(wire.subject("t1"), wire.encode(wire.read_request(
                "op.outcome", {"id": op_id}, floor=last)), timeout=5)
            got = wire.decode(reply.data)
            assert got["status"] == "ok" and got["answer"]["outcome"]["seq"] == seq
        return reference

    reference = run(converge(), DEADLINE)
    copy = copy_of(node)
    try:
        assert copy.applied() == last
        assert store.digest(copy) == reference
    finally:
        store.close_env(copy)
    # The node's own roles' way in: the estate ROUTER, and the applied PUB.
    ctx = zmq.Context()
    dealer, sub = ctx.socket(zmq.DEALER), ctx.socket(zmq.SUB)
    try:
        for sock in (dealer, sub):
            sock.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, wire.APPLIED_TOPIC)
        sub.connect(ipc.endpoint(node.run_dir, "applied"))
        dealer.connect(ipc.endpoint(node.run_dir, "estate"))
        dealer.send_multipart([b"", wire.encode({"id": "r1", **wire.read_request("task.list", {})})])
        assert dealer.poll(5000)
        got = wire.decode(dealer.recv_multipart()[-1])
        assert got["id"] == "r1" and got["status"] == "ok" and got["applied"] == last
        assert sub.poll(5000)
        topic, payload = sub.recv_multipart()
        heard = wire.decode(payload)
        assert heard["node"] == "t1" and heard["seq"] == last and heard["in_service"] is True
    finally:
        dealer.close()
        sub.close()
        ctx.term()
    # Each incarnation that got as far as following the log did so from its
    # own copy's applied + 1 (one killed while starting never says so).
    wait_for(lambda: len(node.events_named("estate_log_following")) >= 2, 10,
             what="two incarnations' log lines forwarded")
    starts = [e["start"] for e in node.events_named("estate_log_following")]
    assert starts == sorted(starts) and starts[-1] > 1, starts
    # crewletctl status shows the child's stats.
    stats = wait_for(lambda: node.children()["data_applier"].get("stats"), 5, what="stats")
    assert stats["applied"] == last and stats["in_service"] is True


def test_writes_answered_before_the_applier_is_killed_are_all_in_its_copy(make_node, short_tmp):
    """Writers keep a node's applier committing group after group; it is
    SIGKILLed between (or during) commits. Every write it answered was
    durable: after the restart each is in the copy at the seq its answer
    carried, and every op the log accepted is applied."""
    node = make_node(node={"id": "t2", "roles": ["data"]},
                     supervisor={"intensity": 20, "backoff_min": 0.05, "backoff_max": 0.2})
    node.start()
    url = node_url(node)
    answered: dict[str, int] = {}
    phase: dict[str, Any] = {"killed": False, "stop": False, "at_kill": 0}

    async def writers() -> int:
        async with connection(url) as (nc, js):
            subject = wire.subject("t2", OPERATOR, "tester")

            async def writer(w: int) -> None:
                i = 0
                while not phase["stop"]:
                    op = make_op("task.create", {"title": f"writer {w} op {i}"}, node="tester")
                    i += 1
                    try:
                        reply = await nc.request(subject, wire.encode(wire.write_request(op, wait=2)),
                                                 timeout=3)
                    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                        continue  # the applier is down: unanswered, maybe in the log
                    got = wire.decode(reply.data)
                    if got["status"] == "ok":
                        assert got["answer"]["ok"] and got["answer"]["seq"] == got["seq"]
                        answered[op.id] = got["seq"]
                    else:
                        await asyncio.sleep(0.02)  # starting, out of service a moment

            tasks = [asyncio.create_task(writer(w)) for w in range(8)]
            try:
                # Until the restarted applier has answered a hundred more.
                await until(lambda: phase["killed"] and len(answered) >= phase["at_kill"] + 100
                            or any(t.done() for t in tasks), 40, "writes answered around the kill")
            finally:
                phase["stop"] = True
                await asyncio.gather(*tasks)
            _, last = await estate_log.bounds(js)
            return last

    def kill_mid_stream() -> None:
        wait_for(lambda: len(answered) >= 100, 30, what="writes answered")
        pid = node.children()["data_applier"]["pid"]
        phase["at_kill"] = len(answered)
        os.kill(pid, signal.SIGKILL)
        node.wait_running(timeout=15, exclude={"data_applier": pid})
        phase["killed"] = True

    killer = threading.Thread(target=kill_mid_stream)
    killer.start()
    try:
        last = run(writers(), 60)
    finally:
        phase["stop"] = True
        killer.join(40)
    assert phase["killed"] and len(answered) >= phase["at_kill"] + 100
    wait_for(lambda: applied(node) >= last, 20, what="the restarted applier at the log's end")
    copy = copy_of(node)
    try:
        reader = store.Reader(copy)
        assert copy.applied() == last
        lost = {op_id: seq for op_id, seq in answered.items()
                if (reader.outcome(op_id) or {}).get("seq") != seq}
        assert not lost, f"{len(lost)} answered writes are not in the copy as answered"
    finally:
        store.close_env(copy)
    assert node.children()["data_applier"]["restarts"] >= 1


def test_each_data_node_prunes_its_own_kept_events_by_the_retention(natsd, short_tmp, monkeypatch):
    """Kept events past the company's ``retention.events_days`` go from this
    node's table, oldest first, in batches, once the retention is known;
    younger ones stay; what went is counted (stats and the status record)."""
    monkeypatch.setattr(custody_module, "PRUNE_BATCH", 3)  # several batches, for the walk's sake

    def age(a, keys, days):
        """Make the kept events at *keys* as if stored *days* ago (the stream's
        timestamps cannot be set: the rows are rewritten in place)."""
        with a.store.env.begin(write=True) as txn:
            for key in keys:
                row = store.unpack(txn.get(key, db=a.store.dbs["events"]))
                txn.put(key, store.pack({**row, "at": row["at"] - days * 86400}), db=a.store.dbs["events"])

    async def check():
        async with connection(natsd.url) as (nc, js):
            await JetStreamMailboxes(js, nc).ensure_streams(replicas=1, max_consumers=100)
            async with applier(natsd.url, f"{short_tmp}/a", "a", custody=True) as a:
                kept = await until(lambda: a.custody, what="custody running")
                for i in range(10):
                    await js.publish(f"events.turn.s{i}", json.dumps({"i": i}).encode())
                await until(lambda: kept.stats["kept"] == 10, 10, "ten events kept")
                await a.write(age, a, [store.seq_key(seq) for seq in range(1, 8)], 10)
                assert kept.stats["pruned"] == 0 and kept.keep_days is None  # no company: none pruned
                kept.set_keep_days(7)
                await until(lambda: kept.stats["pruned"] == 7, 10, "the old events pruned")
                left = [e["event"]["data"] for e in store.Reader(a.store).query("event.list", {})["events"]]
                assert left == [{"i": 7}, {"i": 8}, {"i": 9}]
                assert a.status()["events_pruned"] == 7
    run(check(), DEADLINE)
