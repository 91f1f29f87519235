"""Helpers for tests of the estate: random logs, a node's copy read from the
test process, publishing ops, waiting in a loop, and a router of the test's own.

A node's copy is opened read-only here (LMDB allows readers in any process),
so reading it changes nothing; the test process is "a node without data"
when it routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import time
from typing import Any, AsyncIterator, Callable

import nats

from crewlet.estate import log as estate_log
from crewlet.estate import ops, store
from crewlet.estate.ops import Op, make_op
from crewlet.estate.router import Router
from crewlet.estate.view import EstateView

# Seconds one :func:`run` may take: generous (a fleet test's scenario runs
# for a while), but a hung broker call fails the test instead of the suite.
RUN_CAP = 120.0
# Seconds :func:`publish_all` goes on resending a window the broker did not
# answer (no stream leader yet, after a member was killed).
PUBLISH_WITHIN = 20.0
# Seconds one publish waits for its ack.
PUBLISH_TIMEOUT = 5.0
# How often :func:`until` looks again.
POLL = 0.02


def op(kind, args, id=None, seat=None, token=None, at=1000.0, node="n1") -> Op:
    return make_op(kind, args, node=node, seat=seat, token=token, id=id, at=at)


def random_ops(rnd: random.Random, n: int, node: str = "n1") -> list[Op]:
    """A mix of every kind of write: refusals (missing tasks, stale tokens,
    version conflicts), duplicated ids and seat fences among them, turn
    records (some without a start time) and trims of them."""
    made: list[Op] = []
    for i in range(n):
        kind = rnd.choice(["task.create", "task.update", "task.comment", "page.write", "page.delete",
                           "diary.write", "dup", "fence", "file.register", "turn.record", "turn.trim"])
        seat, token = rnd.choice([(None, None), ("cto", rnd.randint(1, 5)), ("ceo", rnd.randint(1, 5))])
        if kind == "dup" and made:
            made.append(rnd.choice(made))  # the same op, id and all
            continue
        if kind in ("dup", "fence"):
            kind, args, seat, token = "seat.fence", {}, seat or "cto", token or 3
        elif kind == "task.create":
            args = {"title": f"t{i}", "assignee": rnd.choice(["cto", "ceo"])}
        elif kind == "task.update":
            args = {"id": f"T{rnd.randint(1, i + 1)}", "status": rnd.choice(ops.TASK_STATUSES)}
        elif kind == "task.comment":
            args = {"id": f"T{rnd.randint(1, i + 1)}", "body": f"c{i}"}
        elif kind == "page.write":
            args = {"path": f"p/{rnd.randint(0, 9)}", "title": "t", "body": f"words {i} deploy"}
        elif kind == "page.delete":
            args = {"path": f"p/{rnd.randint(0, 9)}"}
        elif kind == "file.register":
            args = {"project": "x", "path": f"f{rnd.randint(0, 5)}", "size": i, "sha256": f"{i:064x}"}
        elif kind == "turn.record":
            seat, token = seat or "cto", token or 1
            record = {"seat": seat, "trigger": f"t{i}", "outcome": "done"}
            if rnd.random() < 0.9:
                record["started_at"] = 1000.0 + i - rnd.randint(0, 30)  # logged roughly in order
            args = {"record": record}
        elif kind == "turn.trim":
            seat, token = None, None
            args = {"before": 1000.0 + rnd.randint(0, i + 1), "limit": rnd.randint(1, 5),
                    "after": rnd.choice([0, 0, rnd.randint(0, i + 1)])}
        else:  # diary.write: a seat writes its own diary
            seat, token = seat or "cto", token or 1
            args = {"seat": seat, "text": f"note {rnd.randint(0, 20)}"}
        made.append(op(kind, args, seat=seat, token=token, at=1000.0 + i, node=node))
    return made


def random_log(seed: int, n: int) -> list[Op]:
    return random_ops(random.Random(seed), n)


# ------------------------------------------------------------------ a node's copy

def copy_path(node) -> str:
    return os.path.join(node.config["data_dir"], "estate")


def copy_of(node) -> store.Store | None:
    """*node*'s copy (a test node, with ``config["data_dir"]``), read-only from
    this process; None until its applier made one."""
    try:
        return store.open_env(copy_path(node), readonly=True)
    except store.StoreUnavailable:
        return None


def applied(node) -> int:
    copy = copy_of(node)
    return copy.applied() if copy is not None else 0


def query(node, name: str, **args):
    return store.Reader(copy_of(node)).query(name, args)


# ------------------------------------------------------------------ the log

async def publish_all(js, items: list[Op], *, window: int = 200,
                      within: float = PUBLISH_WITHIN) -> list[tuple[int, str]]:
    """Publish *items* to the log through JetStream context *js*, *window* at
    a time (pipelined), each under its id: ``[(seq, op id)]`` in *items*' order.

    A window the broker did not answer whole is sent again under the same
    ids (the broker's duplicate window makes that land once) until *within*
    seconds pass, so a leader election mid-stream costs a pause, not an op.
    """
    landed: list[tuple[int, str]] = []
    for start in range(0, len(items), window):
        batch = items[start:start + window]
        deadline = time.monotonic() + within
        while True:
            # Every publish of the window ends before the next try (none is
            # left running behind it), whatever the others did.
            acks = await asyncio.gather(*(estate_log.publish(js, o, timeout=PUBLISH_TIMEOUT)
                                          for o in batch), return_exceptions=True)
            failed = [a for a in acks if isinstance(a, BaseException)]
            if not failed:
                break
            if not all(isinstance(a, nats.errors.Error) for a in failed) \
                    or time.monotonic() > deadline:
                raise failed[0]
            await asyncio.sleep(0.05)
        landed.extend((seq, o.id) for (seq, _), o in zip(acks, batch))
    return landed


async def publish_to(url: str, items: list[Op], **kw) -> list[tuple[int, str]]:
    """:func:`publish_all` over a connection of its own to *url*."""
    nc = await nats.connect(url)
    try:
        return await publish_all(nc.jetstream(timeout=PUBLISH_TIMEOUT), items, **kw)
    finally:
        await nc.close()


async def log_last(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(estate_log.STREAM)).state.last_seq
    finally:
        await nc.close()


# ------------------------------------------------------------------ waiting, routing, running

async def until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition", *,
                ignoring: tuple[type[BaseException], ...] = ()) -> Any:
    """The async form of :func:`tests.conftest.wait_for`: poll *predicate*
    (sync, or returning an awaitable) until truthy and return that; fail
    after *timeout*. An exception of a type in *ignoring* (a key not written
    yet) counts as "not yet"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except ignoring:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(POLL)


@contextlib.asynccontextmanager
async def routed(url: str, node_id: str = "tester", **router_args) -> AsyncIterator[Router]:
    """A router of the test process's own: a node without data, over NATS."""
    nc = await nats.connect(url)
    view = EstateView(nc.jetstream(timeout=2))
    watch = asyncio.create_task(view.run())
    try:
        assert await view.wait_ready(10), "the estate view never listed the buckets"
        yield Router(nc, node_id=node_id, view=view, **router_args)
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await nc.close()


def run(coro, within: float = RUN_CAP):
    """``asyncio.run(coro)``, failing with TimeoutError after *within* seconds."""
    return asyncio.run(asyncio.wait_for(coro, within))


async def grant(js, seat: str, node: str, *, release: bool = True) -> int:
    """A real lease of *seat* for *node* in the ``leases`` bucket, as a node's
    sweep claims one: its fencing token (the claim's revision). Released at
    once unless *release* is False, so the next claim (another node's)
    takes the seat with a higher token."""
    from crewlet.coord import buckets
    from crewlet.coord.lease import Leases
    await buckets.ensure(js, buckets.LEASES, 1)
    leases = Leases(js, node, f"boot-{node}", ttl=60)
    held = await leases.claim(f"seat.{seat}")
    assert held is not None, f"seat.{seat} is held by another"
    if release:
        await leases.release(held)
    return held.token
