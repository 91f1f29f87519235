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


# The conversation kinds random_ops draws from, and the few ids their ops
# name (so they meet: runs of one conversation, approvals of one run).
CONVERSATION_KINDS = ["conversation.create", "run.create", "run.update", "conversation.message",
                      "conversation.rollback", "approval.request", "approval.decide"]


def _conversation_args(rnd: random.Random, kind: str, i: int) -> tuple[dict[str, Any], str]:
    """Arguments for a conversation op of *kind* (the *i*-th of the log), and
    the seat that would write it: the ids slide along the log, so ops mostly
    meet live rows (a conversation's runs, a run's messages and approvals)
    and often conflict."""
    k = rnd.randint(0, 1) + i // 40   # the run; five runs a conversation
    n = k // 5 if rnd.random() < 0.95 else k // 5 + 1
    conv, seat, run = f"c{n}", ("cto", "ceo")[n % 2], f"r{k}"
    approval = f"a{k}.{rnd.randint(0, 1)}"
    if rnd.random() < 0.05:
        seat = ("cto", "ceo")[(n + 1) % 2]  # another's conversation
    if kind == "conversation.create":
        return {"id": conv, "seat": seat,
                "metadata": rnd.choice([{}, {"from": "web", "n": rnd.randint(0, 2)}])}, seat
    if kind == "run.create":
        same = random.Random(k)  # a run's arguments, mostly the same each time it is sent
        args = {"id": run, "conversation": conv, "strategy": same.choice(ops.STRATEGIES),
                "on_disconnect": same.choice(ops.ON_DISCONNECT), "revision": same.randint(1, 3),
                "input": f"do {k}", "status": rnd.choice(["queued", "running"])}
        if rnd.random() < 0.1:
            args["approval"] = approval
        return args, seat
    if kind == "run.update":
        return {"id": run, "status": rnd.choice(ops.RUN_STATUSES[1:]),
                "error": rnd.choice(["", "boom"])}, seat
    if kind == "conversation.message":
        role = rnd.choice(ops.ROLES)
        args = {"conversation": conv, "id": f"m{rnd.randint(0, 3) + i // 10}", "run": run,
                "role": role, "text": f"words {i}"}
        if role == "assistant" and rnd.random() < 0.5:
            args["calls"] = [{"id": f"k{i}", "name": "send", "args": {"to": "x", "n": i}}]
        if role == "tool":
            args.update(call_id=f"k{rnd.randint(0, i + 1)}", name="send", error=rnd.random() < 0.2)
        return args, seat
    if kind == "conversation.rollback":
        return {"conversation": conv, "run": run}, seat
    if kind == "approval.request":
        return {"id": approval, "conversation": conv, "run": run, "seat": seat, "tool": "send",
                "call_id": f"k{i}", "args": {"to": "x"},
                "expires_at": 1000.0 + i + rnd.randint(1, 20)}, seat
    return {"id": approval, "decision": rnd.choice(ops.DECISIONS),
            "note": rnd.choice(["", ops.EXPIRED, "fine"]), "by": "ann"}, seat


def random_ops(rnd: random.Random, n: int, node: str = "n1") -> list[Op]:
    """A mix of every kind of write: refusals (missing tasks, stale tokens,
    version conflicts, busy conversations, decided approvals), duplicated ids
    and seat fences among them, turn records (some without a start time) and
    trims of them, conversations with their runs, messages and approvals."""
    made: list[Op] = []
    for i in range(n):
        kind = rnd.choice(["task.create", "task.update", "task.comment", "page.write", "page.delete",
                           "diary.write", "dup", "fence", "file.register", "turn.record", "turn.trim",
                           "conversation", "conversation", "conversation"])
        seat, token = rnd.choice([(None, None), ("cto", rnd.randint(1, 5)), ("ceo", rnd.randint(1, 5))])
        if kind == "conversation":
            # Creates a third of the time: the rest then mostly meet live rows.
            kind = rnd.choice(CONVERSATION_KINDS[:2] if rnd.random() < 0.3 else CONVERSATION_KINDS)
            args, writer = _conversation_args(rnd, kind, i)
            # The operator, or the seat under a token that is mostly current.
            if kind in ops.OPERATOR_ONLY or rnd.random() < 0.5:
                seat, token = None, None
            else:
                seat, token = writer, rnd.choice([5, 5, 5, rnd.randint(1, 5)])
            made.append(op(kind, args, seat=seat, token=token, at=1000.0 + i, node=node))
            continue
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
async def routed(url: str, node_id: str = "tester", *, serving: tuple[str, ...] = (),
                 **router_args) -> AsyncIterator[Router]:
    """A router of the test process's own: a node without data, over NATS,
    once the data nodes *serving* are in service as its view sees them (a
    node's first applier record may come a while after its copy applies)."""
    nc = await nats.connect(url)
    view = EstateView(nc.jetstream(timeout=2))
    watch = asyncio.create_task(view.run())
    try:
        assert await view.wait_ready(10), "the estate view never listed the buckets"
        await in_service(view, *serving)
        yield Router(nc, node_id=node_id, view=view, **router_args)
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await nc.close()


async def in_service(view: EstateView, *nodes: str, within: float = 15.0) -> None:
    """Until *view* lists every one of *nodes* as a data node in service."""
    def serving() -> bool:
        states = {s.id: s for s in view.data_nodes()}
        return all(n in states and states[n].in_service for n in nodes)
    await until(serving, within, f"{nodes} in service")


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
