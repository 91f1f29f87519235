"""Helpers for tests of the estate: random logs, a node's copy read from the
test process, publishing ops, and a router of the test's own.

A node's copy is opened read-only here (LMDB allows readers in any process),
so reading it changes nothing; the test process is "a node without data"
when it routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from typing import AsyncIterator

import nats

from crewlet.estate import log as estate_log
from crewlet.estate import ops, store
from crewlet.estate.ops import Op, make_op
from crewlet.estate.router import Router
from crewlet.estate.view import EstateView


def op(kind, args, id=None, seat=None, token=None, at=1000.0, node="n1") -> Op:
    return make_op(kind, args, node=node, seat=seat, token=token, id=id, at=at)


def random_ops(rnd: random.Random, n: int, node: str = "n1") -> list[Op]:
    """A mix of every kind of write: refusals (missing tasks, stale tokens,
    version conflicts), duplicated ids and seat fences among them."""
    made: list[Op] = []
    for i in range(n):
        kind = rnd.choice(["task.create", "task.update", "task.comment", "page.write", "page.delete",
                           "diary.write", "dup", "fence", "file.register"])
        seat, token = rnd.choice([(None, None), ("cto", rnd.randint(1, 5)), ("ceo", rnd.randint(1, 5))])
        at = 1000.0 + i
        if kind == "dup" and made:
            made.append(rnd.choice(made))
            continue
        if kind in ("dup", "fence"):
            made.append(op("seat.fence", {}, seat=seat or "cto", token=token or 3, at=at, node=node))
        elif kind == "task.create":
            made.append(op(kind, {"title": f"t{i}", "assignee": rnd.choice(["cto", "ceo"])},
                           seat=seat, token=token, at=at, node=node))
        elif kind == "task.update":
            made.append(op(kind, {"id": f"T{rnd.randint(1, i + 1)}", "status": rnd.choice(ops.TASK_STATUSES)},
                           seat=seat, token=token, at=at, node=node))
        elif kind == "task.comment":
            made.append(op(kind, {"id": f"T{rnd.randint(1, i + 1)}", "body": f"c{i}"}, seat=seat,
                           token=token, at=at, node=node))
        elif kind == "page.write":
            made.append(op(kind, {"path": f"p/{rnd.randint(0, 9)}", "title": "t", "body": f"words {i} deploy"},
                           seat=seat, token=token, at=at, node=node))
        elif kind == "page.delete":
            made.append(op(kind, {"path": f"p/{rnd.randint(0, 9)}"}, seat=seat, token=token, at=at, node=node))
        elif kind == "file.register":
            made.append(op(kind, {"project": "x", "path": f"f{rnd.randint(0, 5)}", "size": i,
                                  "sha256": f"{i:064x}"}, seat=seat, token=token, at=at, node=node))
        else:
            who = seat or "cto"
            made.append(op(kind, {"seat": who, "text": f"note {rnd.randint(0, 20)}"}, seat=who,
                           token=token or 1, at=at, node=node))
    return made


def copy_path(node) -> str:
    return os.path.join(node.config["data_dir"], "estate")


def copy_of(node) -> store.Store | None:
    """*node*'s copy, read-only from this process; None until its applier made one."""
    try:
        return store.open_env(copy_path(node), readonly=True)
    except store.StoreUnavailable:
        return None


def applied(node) -> int:
    copy = copy_of(node)
    return copy.applied() if copy is not None else 0


def query(node, name: str, **args):
    return store.Reader(copy_of(node)).query(name, args)


async def publish_all(url: str, items: list[Op], *, window: int = 200) -> int:
    """Publish *items* to the log (pipelined, each under its id, resent on a
    timeout under the same id); the last sequence."""
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=5)
    last = 0
    try:
        for start in range(0, len(items), window):
            for attempt in range(10):
                try:
                    acks = await asyncio.gather(*(estate_log.publish(js, o, timeout=5)
                                                  for o in items[start:start + window]))
                    last = max(last, max(seq for seq, _ in acks))
                    break
                except Exception:
                    if attempt == 9:
                        raise
                    await asyncio.sleep(0.2)
    finally:
        await nc.close()
    return last


async def log_last(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(estate_log.STREAM)).state.last_seq
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def routed(url: str, node_id: str = "tester", **router_args) -> AsyncIterator[Router]:
    """A router of the test process's own: a node without data, over NATS."""
    nc = await nats.connect(url)
    view = EstateView(nc.jetstream(timeout=2))
    watch = asyncio.create_task(view.run())
    try:
        await view.wait_ready(10)
        yield Router(nc, node_id=node_id, view=view, **router_args)
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await nc.close()


def run(coro):
    return asyncio.run(coro)


def random_log(seed: int, n: int) -> list[Op]:
    return random_ops(random.Random(seed), n)
