#!/usr/bin/env python3
"""Benchmark: the replicated estate — applying, writing, reading and searching, beside raw LMDB,
raw JetStream and raw SQLite FTS5 measured in the same run.

Four parts, each printed beside its same-run baseline as a ratio (medians over
interleaved rounds; the side going first rotates, so the machine's noise
falls on all sides alike):

1. **apply** — ``--ops`` ops of a realistic mix (:data:`MIX`: mostly
   ``task.create``, then ``task.update``, ``task.comment`` and ``page.write``
   of ~1 KB; the updates and comments name tasks created earlier in the same
   run, ops come from eight seats with their fencing token) are encoded once,
   then applied with :func:`crewlet.estate.apply.apply_batch` in batches of
   ``--batch`` into a fresh :func:`crewlet.estate.store.open_env` per round —
   ops/s — beside **raw LMDB**: as many ``txn.put(seq key, the op's bytes)``
   (the same byte sizes), batched the same way, into a fresh environment
   opened with the store's own flags (sync on, metasync off) — puts/s.
   Target: ops/s >= 15 % of puts/s (issue 28). Informational beside it: how
   many keys an op leaves in the copy, raw LMDB's rate at that many puts an
   op, and **the floor** (:func:`floor_round`): the same entries through only
   the LMDB and msgpack calls any apply that keeps an outcome and a fence per
   op must make (unpack, the outcome and fence lookups, a nested transaction
   with the op's 3.5 keys, the row and outcome packed) — what no Python of
   crewlet's on top can beat.

   Then the **end-to-end** rate of a real applier: ``--e2e-ops`` ops (the same
   mix, fresh ids, task ids shifted to where the ops land in the log) are
   published to the ``ESTATE`` stream of a real node
   (:func:`crewlet.estate.log.publish`, ``--window`` in flight) and timed
   from the first publish until the node's copy — polled read-only through
   :class:`crewlet.estate.store.Reader` — has applied the last one; beside
   **raw pipelined publishes** of the same bytes, with the same
   ``Nats-Msg-Id`` headers and window, to a stream of the same config on the
   same server (``BENCH``). Informational.

2. **router write latency** — ``task.create`` ops written one at a time,
   publish -> applied -> answered, through (a) a
   :class:`crewlet.estate.router.Router` without a local copy, over NATS
   request/reply to the node's applier (what a node without data does) and
   (b) a Router over :class:`crewlet.estate.local.LocalCopy` pointed at the
   node's run_dir and data_dir (what a seat on the data node does): since
   2026-12-06 it publishes the op to the log itself and reads the outcome from
   the copy once the applier's ``applied`` message says it applied it
   (crewlet.estate.router, "Straight to the log"; before, it asked the applier
   over its ZeroMQ ``estate`` endpoint); beside a **raw** ``js.publish`` round trip
   (one at a time, same bytes and header) to the same server. Median and p99
   ms. Target: median <= 5x raw (issue 28). A core subscription on ``estate.ops`` sees
   each op enter the log, which splits a write into request -> in the log
   and in the log -> applied and answered.

3. **local read latency** — ``task.get`` of a task with comments, from the
   node's copy: ``LocalCopy.ask`` (the request a router sends it),
   ``Router.read`` over the local copy and over NATS (for comparison), and a
   direct ``Reader.query``; beside a **raw** ``txn.get`` of the task's key in
   the same environment. Median µs. Informational.

4. **search over ``--pages`` pages** (100,000; 10,000 with ``--quick``) of ~80
   words drawn from a fixed vocabulary (:data:`VOCABULARY` words, Zipf
   frequencies, as text has): the ``page.write`` ops are applied with
   ``apply_batch`` into a fresh copy, then indexed with
   :meth:`crewlet.estate.search.SearchIndex.catch_up` (both times reported).
   Then 1-2 word queries (words drawn as they occur in pages, the 20 most
   common left out as stop words) through ``SearchIndex.search`` (a
   read-only handle, as a reader process has) and through ``LocalCopy.ask``
   (``page.search``; this LocalCopy reads the bench's copy and index, and
   takes its "in service" from the node's applier, since the node's own copy
   does not hold these pages); beside a **raw** FTS5 query on the same file
   (``MATCH ... ORDER BY rank LIMIT 10`` on its own read-only connection,
   without the snippet and the path join), and **split over three data
   nodes**: the same queries searched in the three shard ranges
   :meth:`crewlet.estate.router.Router.search` gives three nodes (each range
   timed alone, as if each node had its own CPU; the slowest range plus the
   merge is what the asker waits for). Median and p99 ms; the split's p99
   beside the issue's target (<= 20 ms). Informational.

The node is ``crewletd start -c <temp config>`` with the ``data`` role only
(embedded broker on a free 127.0.0.1 port, a short temp data dir); nothing
listens anywhere but loopback, and everything started is stopped by its pid.
A part that fails is reported with its error and the next part still runs.
``--quick`` makes every size small (the whole run < 60 s; the full run takes
about 2 minutes on 2 cores). Exit status: 0 (a failed part is in the
report), 1 when no nats-server binary is found.

    /tmp/venv/bin/python bench/estate.py [--quick] [--json]     # --help for the rest
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import os
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import lmdb  # noqa: E402
import msgpack  # noqa: E402
import nats  # noqa: E402
import zmq.asyncio  # noqa: E402
from nats.aio.client import __version__ as NATS_PY_VERSION  # noqa: E402
from nats.js.api import RetentionPolicy, StorageType, StreamConfig  # noqa: E402

from bench.common import (add_smoke, BenchError, Crewletd, emit, find_nats_server, ratio, say,  # noqa: E402
                          server_version, summary)
from crewlet import log  # noqa: E402
from crewlet.estate import apply as estate_apply  # noqa: E402
from crewlet.estate import log as estate_log  # noqa: E402
from crewlet.estate import store as estate_store  # noqa: E402
from crewlet.estate import wire  # noqa: E402
from crewlet.coord.lease import Leases  # noqa: E402
from crewlet.estate.local import LocalCopy  # noqa: E402
from crewlet.estate.search import index_path  # noqa: E402
from crewlet.estate.store import copy_path  # noqa: E402
from crewlet.estate.ops import Op, make_op  # noqa: E402
from crewlet.estate.router import Router  # noqa: E402
from crewlet.estate.search import SearchIndex, fts_query  # noqa: E402
from crewlet.estate.router import merge_hits, split_shards  # noqa: E402
from crewlet.estate.view import EstateView  # noqa: E402

# ----------------------------------------------------------------- constants

NODE_ID = "bench"
ASKER_ID = "bench-asker"       # the Router without a copy: a node without data, by another name
SEED = 20240705
# The op mix of part 1 (weights): a tracker mostly creates tasks; updates and
# comments name tasks created earlier; pages are the knowledge base's ~1 KB writes.
MIX = (("task.create", 60), ("task.update", 15), ("task.comment", 15), ("page.write", 10))
SEATS = [f"s{i}" for i in range(8)]   # the issuing seats
# Each seat's fencing token. Offline (part 1's fresh copies, applied without
# verdicts) any token goes; against the node, every copy judges a token that
# raises a fence by the ``leases`` bucket (roles.data_applier.grants): the
# bench claims each seat for its node there and writes under those tokens.
TOKENS = {seat: 1 for seat in SEATS}
LABELS = ("bug", "ops", "infra", "docs", "customer", "urgent")
STATUSES = ("open", "doing", "blocked", "done")
PAGE_BYTES = 1000              # a part-1 page body, about
PAGE_WORDS = 80                # a part-4 page body, words
VOCABULARY = 5000              # distinct words of the synthetic language
STOP_WORDS = 20                # the most common words, never searched for
ZIPF_S = 1.0                   # word frequency ~ 1 / rank^s, as in natural text
AT = 1_700_000_000.0           # ops' issue times: fixed, so every run writes the same rows
# Targets (issue 28's): applied ops/s >= 15 % of raw LMDB puts/s; a router
# write's median <= 5x a raw JetStream publish round trip.
TARGET_APPLY_RATIO = 0.15
TARGET_WRITE_RATIO = 5.0
# A search split over three data nodes (part 4), the issue's: p99 <= 20 ms.
TARGET_SEARCH_P99_MS = 20.0
# The raw baseline's stream on the node's broker: the ESTATE stream's config under another name.
RAW_STREAM = "BENCH"
RAW_SUBJECT = "bench.raw"
JS_TIMEOUT = 10.0              # s: generous, so a slow server shows as slow, not as an error
APPLY_WAIT = 120.0             # s the node's copy may take to apply one end-to-end round
POLL = 0.001                   # s between reads of the copy's applied seq
NODE_START = 60.0              # s for the node to run its applier and be in service
SEARCH_LIMIT = 10
RAW_FTS = "SELECT rowid, rank FROM pages_fts WHERE pages_fts MATCH ? ORDER BY rank LIMIT ?"

# Sizes: full, and --quick (the whole run < 60 s on 2 cores).
FULL = {"ops": 50_000, "e2e_ops": 20_000, "writes": 500, "reads": 5000, "pages": 100_000,
        "queries": 1000, "rounds": 3}
QUICK = {"ops": 5000, "e2e_ops": 2000, "writes": 100, "reads": 1000, "pages": 10_000,
         "queries": 200, "rounds": 3}


def per_s(count: int, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


def orders(i: int, sides: tuple[str, ...]) -> tuple[str, ...]:
    """Round *i*'s order of *sides*: rotated each round, so no side always goes first."""
    k = i % len(sides)
    return sides[k:] + sides[:k]


# --------------------------------------------------------------------------
# What is written: the synthetic language, the op mix, the pages
# --------------------------------------------------------------------------

class Words:
    """A fixed vocabulary of pronounceable words with Zipf frequencies (seeded)."""

    def __init__(self, n: int = VOCABULARY, seed: int = SEED):
        rng = random.Random(seed)
        words: dict[str, None] = {}
        while len(words) < n:
            words["".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou")
                          for _ in range(rng.randint(2, 4)))] = None
        self.words = list(words)
        weights = [1.0 / (r + 1) ** ZIPF_S for r in range(n)]
        self.cum = list(itertools.accumulate(weights))
        # Query words: as they occur in pages, the stop words left out.
        self.query_cum = list(itertools.accumulate(weights[STOP_WORDS:]))

    def text(self, rng: random.Random, k: int) -> str:
        return " ".join(rng.choices(self.words, cum_weights=self.cum, k=k))

    def sized(self, rng: random.Random, nbytes: int) -> str:
        out, size = [], 0
        while size < nbytes:
            w = self.words[bisect.bisect(self.cum, rng.random() * self.cum[-1])]
            out.append(w)
            size += len(w) + 1
        return " ".join(out)

    def query(self, rng: random.Random) -> str:
        k = 1 if rng.random() < 0.5 else 2
        return " ".join(rng.choices(self.words[STOP_WORDS:], cum_weights=self.query_cum, k=k))


def _op(kind: str, args: dict[str, Any], i: int, rng: random.Random) -> Op:
    """An op as a seat issues it. Built without the schema check (it is the
    applier's to make, and the apply part counts refusals: there must be none)."""
    seat = rng.choice(SEATS)
    return Op(id=uuid.uuid4().hex, kind=kind, args=args, seat=seat, token=TOKENS[seat],
              node=NODE_ID, at=AT + i * 0.001)


def op_mix(n: int, base: int, words: Words, tag: str, seed: int = SEED) -> tuple[list[Op], str | None]:
    """*n* ops of :data:`MIX` landing at seqs ``base + 1 .. base + n``, and a task that
    got comments (read in part 3). Updates and comments name tasks created before them."""
    rng = random.Random(seed)
    kinds = [k for k, _ in MIX]
    weights = [w for _, w in MIX]
    ops: list[Op] = []
    tasks: list[str] = []
    commented: dict[str, int] = {}
    pages = 0
    for i in range(n):
        kind = rng.choices(kinds, weights)[0]
        if kind in ("task.update", "task.comment") and not tasks:
            kind = "task.create"
        if kind == "task.create":
            args: dict[str, Any] = {"title": f"{tag} task {i}: " + words.text(rng, 5),
                                    "body": words.sized(rng, 200),
                                    "labels": rng.sample(LABELS, rng.randint(0, 2))}
            if rng.random() < 0.5:
                args["assignee"] = rng.choice(SEATS)
            tasks.append(f"T{base + i + 1}")
        elif kind == "task.update":
            args = {"id": rng.choice(tasks[-500:]), "status": rng.choice(STATUSES),
                    "assignee": rng.choice(SEATS)}
        elif kind == "task.comment":
            target = rng.choice(tasks[-500:])
            commented[target] = commented.get(target, 0) + 1
            args = {"id": target, "body": words.sized(rng, 150)}
        else:
            # A new page mostly; one write in four edits an earlier one (its version goes up).
            p = rng.randrange(pages) if pages and rng.random() < 0.25 else pages
            if p == pages:
                pages += 1
            args = {"path": f"kb/{tag}/p{p}", "title": f"page {p} " + words.text(rng, 3),
                    "body": words.sized(rng, PAGE_BYTES)}
        ops.append(_op(kind, args, i, rng))
    busiest = max(commented, key=commented.get) if commented else None
    return ops, busiest


def page_ops(n: int, words: Words) -> list[tuple[int, bytes]]:
    """*n* ``page.write`` log entries ``(seq, data)`` of ~80 words each."""
    rng = random.Random(SEED + 4)
    out = []
    for i in range(n):
        args = {"path": f"kb/{i // 1000:03d}/page-{i}", "title": words.text(rng, 4),
                "body": words.text(rng, PAGE_WORDS)}
        out.append((i + 1, _op("page.write", args, i, rng).encode()))
    return out


def batches(entries: list, size: int) -> list[list]:
    return [entries[i:i + size] for i in range(0, len(entries), size)]


# --------------------------------------------------------------------------
# Part 1a: apply_batch beside raw LMDB puts
# --------------------------------------------------------------------------

def raw_env(path: str) -> tuple[lmdb.Environment, Any]:
    """An environment opened with the store's flags (sync on, metasync off), and one table."""
    env = lmdb.open(path, map_size=estate_store.MAP_SIZE, max_dbs=len(estate_store.TABLES) + 4,
                    subdir=True, metasync=False, sync=True, max_readers=estate_store.MAX_READERS)
    return env, env.open_db(b"raw")


def apply_round(entries: list[list[tuple[int, bytes]]], path: str) -> dict[str, Any]:
    store = estate_store.open_env(path)
    refused = 0
    try:
        t0 = time.perf_counter()
        for batch in entries:
            for _, outcome in estate_apply.apply_batch(store, batch):
                refused += not outcome.get("ok")
        took = time.perf_counter() - t0
        with store.env.begin() as txn:   # what an op leaves behind, for the report
            keys = sum(txn.stat(store.dbs[t])["entries"] for t in estate_store.REPLICATED)
    finally:
        estate_store.close_env(store)
        shutil.rmtree(path, ignore_errors=True)
    n = sum(len(b) for b in entries)
    return {"n": n, "seconds": took, "per_s": per_s(n, took), "refused": refused, "keys": keys}


def floor_round(entries: list[list[tuple[int, bytes]]], path: str) -> dict[str, Any]:
    """The floor under any apply that keeps an outcome and a fence per op, in
    the copy's own environment: per op only the LMDB and msgpack calls such an
    apply cannot do without — unpack the op, look its id up (and its fenced
    key), read its seat's fence, a nested transaction holding as many puts as
    the mix leaves an op (the row, an index entry, a second one every other
    op: 3.5 keys with the outcome), pack the row and the outcome, put the
    outcome — and no Python of crewlet's: no schema, no checks, no dispatch."""
    store = estate_store.open_env(path)
    env, dbs = store.env, store.dbs
    ops_db, fences, tasks, index, meta = dbs["ops"], dbs["fences"], dbs["tasks"], dbs["index"], dbs["meta"]
    try:
        t0 = time.perf_counter()
        for batch in entries:
            with env.begin(write=True) as txn:
                for seq, data in batch:
                    d = msgpack.unpackb(data, raw=False)
                    key = d["id"].encode()
                    txn.get(key, db=ops_db)
                    txn.get(key + b"\0" + str(d["token"]).encode(), db=ops_db)
                    txn.get(d["seat"].encode(), db=fences)
                    row_key, seq8 = b"T%d" % seq, estate_store.seq_key(seq)
                    with env.begin(write=True, parent=txn) as child:
                        child.put(row_key, msgpack.packb(d["args"], use_bin_type=True), db=tasks)
                        child.put(b"task\0all\0" + seq8, row_key, db=index)
                        if seq % 2:
                            child.put(b"task\0status\0open\0" + seq8, row_key, db=index)
                    txn.put(key, msgpack.packb({"ok": True, "seq": seq, "result": d["args"]},
                                               use_bin_type=True), db=ops_db)
                txn.put(estate_apply.APPLIED, estate_store.seq_key(batch[-1][0]), db=meta)
        took = time.perf_counter() - t0
    finally:
        estate_store.close_env(store)
        shutil.rmtree(path, ignore_errors=True)
    n = sum(len(b) for b in entries)
    return {"n": n, "seconds": took, "per_s": per_s(n, took)}


def raw_put_round(entries: list[list[tuple[bytes, bytes]]], path: str) -> dict[str, Any]:
    """*entries*: batches of ``(key, value)``, the keys made beforehand."""
    env, db = raw_env(path)
    try:
        t0 = time.perf_counter()
        for batch in entries:
            with env.begin(write=True) as txn:
                for key, value in batch:
                    txn.put(key, value, db=db)
        took = time.perf_counter() - t0
    finally:
        env.close()
        shutil.rmtree(path, ignore_errors=True)
    n = sum(len(b) for b in entries)
    return {"n": n, "seconds": took, "per_s": per_s(n, took)}


def part_apply(base: str, args: argparse.Namespace, words: Words, out: dict[str, Any]) -> None:
    ops, _ = op_mix(args.ops, 0, words, "a")
    entries = [(i + 1, op.encode()) for i, op in enumerate(ops)]   # encoded once
    sizes = [len(d) for _, d in entries]
    out["op_bytes"] = {"mean": statistics.mean(sizes), "max": max(sizes)}
    out["mix"] = {k: sum(1 for op in ops if op.kind == k) for k, _ in MIX}
    chunks = batches(entries, args.batch)
    keyed = [[(estate_store.seq_key(seq), data) for seq, data in b] for b in chunks]
    warm = min(len(chunks), max(1, 1000 // args.batch))
    n = itertools.count()
    apply_round(chunks[:warm], os.path.join(base, f"w{next(n)}"))
    raw_put_round(keyed[:warm], os.path.join(base, f"w{next(n)}"))
    out["apply"], out["raw_put"], out["floor"] = [], [], []
    for i in range(args.rounds):
        for side in orders(i, ("apply", "raw_put", "floor")):
            path = os.path.join(base, f"r{next(n)}")
            out[side].append(apply_round(chunks, path) if side == "apply" else
                             floor_round(chunks, path) if side == "floor" else raw_put_round(keyed, path))
        say(f"  apply round {i + 1}: {out['apply'][-1]['per_s']:.0f} ops/s, "
            f"raw LMDB {out['raw_put'][-1]['per_s']:.0f} puts/s, "
            f"the floor {out['floor'][-1]['per_s']:.0f} ops/s")
    if any(r["refused"] for r in out["apply"]):
        say(f"  note: {out['apply'][-1]['refused']} ops refused per round (the mix should have none)")


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------

class Node(Crewletd):
    """One crewletd we started: the data role only, embedded broker on loopback."""

    def __init__(self, base: str, binary: str):
        super().__init__(base, {"node": {"id": NODE_ID, "roles": ["data"]}}, binary=binary)

    def applier_running(self) -> bool:
        return any(c.get("name") == "data_applier" and c.get("state") == "running"
                   for c in (self.status() or {}).get("children", []))


async def wait_until(what: str, ok: Callable[[], bool], deadline: float, node: Node) -> None:
    while not ok():
        node.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{what} not within {NODE_START:g}s:\n{node.log_tail()}")
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------
# Part 1b: the applier end to end, beside raw pipelined publishes
# --------------------------------------------------------------------------

async def pipelined(publish: Callable[[Any], Any], items: list, window: int) -> list:
    """``publish(item)`` for every item, *window* in flight; the results in item order."""
    results: list = [None] * len(items)
    todo = iter(enumerate(items))

    async def pump() -> None:
        for i, item in todo:
            results[i] = await publish(item)

    await asyncio.gather(*(pump() for _ in range(min(window, len(items)))))
    return results


async def e2e_round(js, reader: estate_store.Reader, ops: list[Op], base: int,
                    window: int) -> dict[str, Any]:
    target = base + len(ops)

    async def watch() -> float:
        while reader.applied() < target:
            await asyncio.sleep(POLL)
        return time.perf_counter()

    t0 = time.perf_counter()
    watcher = asyncio.create_task(watch())
    try:
        acks = await pipelined(lambda op: estate_log.publish(js, op, timeout=JS_TIMEOUT), ops, window)
        t_published = time.perf_counter()
        t_applied = await asyncio.wait_for(watcher, APPLY_WAIT)
    finally:
        watcher.cancel()
    misplaced = sum(1 for i, (seq, _) in enumerate(acks) if seq != base + i + 1)
    return {"n": len(ops), "seconds": t_applied - t0, "per_s": per_s(len(ops), t_applied - t0),
            "publish_per_s": per_s(len(ops), t_published - t0),
            "applied_after_published_ms": (t_applied - t_published) * 1000, "misplaced": misplaced}


async def raw_publish_round(js, datas: list[tuple[str, bytes]], window: int) -> dict[str, Any]:
    async def one(item: tuple[str, bytes]):
        return await js.publish(RAW_SUBJECT, item[1], timeout=JS_TIMEOUT, stream=RAW_STREAM,
                                headers={estate_log.MSG_ID: item[0]})

    t0 = time.perf_counter()
    await pipelined(one, datas, window)
    took = time.perf_counter() - t0
    return {"n": len(datas), "seconds": took, "per_s": per_s(len(datas), took)}


async def part_e2e(js, reader: estate_store.Reader, args: argparse.Namespace, words: Words,
                   out: dict[str, Any], tags: itertools.count) -> str | None:
    """The end-to-end rounds; returns a task with comments in the node's copy (for part 3)."""
    busiest = None

    async def crewlet_round(n: int) -> dict[str, Any]:
        nonlocal busiest
        _, last = await estate_log.bounds(js)
        ops, busiest = op_mix(n, last, words, f"e{next(tags)}", seed=SEED + next(tags))
        return await e2e_round(js, reader, ops, last, args.window)

    async def raw_round(n: int) -> dict[str, Any]:
        ops, _ = op_mix(n, 0, words, f"e{next(tags)}", seed=SEED + next(tags))
        return await raw_publish_round(js, [(op.id, op.encode()) for op in ops], args.window)

    warm = min(args.e2e_ops, 500)
    await crewlet_round(warm)
    await raw_round(warm)
    out["e2e"], out["raw_publish"] = [], []
    for i in range(args.rounds):
        for side in orders(i, ("e2e", "raw_publish")):
            out[side].append(await (crewlet_round if side == "e2e" else raw_round)(args.e2e_ops))
        e = out["e2e"][-1]
        say(f"  end-to-end round {i + 1}: applied {e['per_s']:.0f} ops/s (its publishes "
            f"{e['publish_per_s']:.0f}/s), raw publish {out['raw_publish'][-1]['per_s']:.0f} msgs/s")
    return busiest


# --------------------------------------------------------------------------
# Part 2: write latency
# --------------------------------------------------------------------------

def create_op(i: int, tag: str) -> Op:
    return make_op("task.create", {"title": f"{tag} latency task {i}", "body": "measured one at a time",
                                   "labels": ["bench"]}, node=NODE_ID, seat=SEATS[0], token=TOKENS[SEATS[0]])


async def timed_writes(write: Callable[[Op], Any], ops: list[Op],
                       in_log: dict[str, float]) -> tuple[list[float], list[float]]:
    """ms per write, one at a time (every outcome must be ok), and ms from the
    start of each write until its op was seen in the log (when it was)."""
    ms, to_log = [], []
    for op in ops:
        t0 = time.perf_counter()
        outcome = await write(op)
        ms.append((time.perf_counter() - t0) * 1000)
        if isinstance(outcome, dict) and not outcome.get("ok", True):
            raise BenchError(f"write of {op.id} refused: {outcome.get('error')}")
        seen = in_log.pop(op.msg_id, None)
        if seen is not None:
            to_log.append((seen - t0) * 1000)
    return ms, to_log


async def part_writes(nc, js, routers: dict[str, Router], args: argparse.Namespace,
                      out: dict[str, Any], tags: itertools.count) -> None:
    async def raw(op: Op):
        ack = await js.publish(RAW_SUBJECT, op.encode(), timeout=JS_TIMEOUT, stream=RAW_STREAM,
                               headers={estate_log.MSG_ID: op.id})
        return {"ok": True, "seq": ack.seq}

    # Where a write's time goes: a core subscription sees each op pass into the
    # log (the applier's publish), splitting request -> in the log -> answered.
    in_log: dict[str, float] = {}

    async def seen(msg) -> None:
        in_log[(msg.headers or {}).get(estate_log.MSG_ID, "")] = time.perf_counter()

    sub = await nc.subscribe(estate_log.SUBJECT, cb=seen)
    writers: dict[str, Callable[[Op], Any]] = {name: r.write for name, r in routers.items()}
    writers["raw_publish"] = raw
    sides = tuple(writers)
    try:
        for side in sides:  # warm-up: connections, the view, the applier's first answers
            tag = f"w{next(tags)}"
            await timed_writes(writers[side], [create_op(i, tag) for i in range(min(20, args.writes))],
                               in_log)
        ms: dict[str, list[float]] = {s: [] for s in sides}
        to_log: dict[str, list[float]] = {s: [] for s in sides}
        rounds: dict[str, list[float]] = {s: [] for s in sides}
        for i in range(args.rounds):
            for side in orders(i, sides):
                tag = f"w{next(tags)}"
                got, logged = await timed_writes(
                    writers[side], [create_op(j, tag) for j in range(args.writes)], in_log)
                ms[side] += got
                to_log[side] += logged
                rounds[side].append(statistics.median(got))
            say(f"  write round {i + 1}: median ms " + ", ".join(f"{s} {rounds[s][-1]:.2f}" for s in sides))
    finally:
        await sub.unsubscribe()
    out["write_ms"] = {s: {**summary(ms[s]), "round_medians": rounds[s],
                           "to_log_median": statistics.median(to_log[s]) if to_log[s] else None}
                       for s in sides}


# --------------------------------------------------------------------------
# Part 3: read latency
# --------------------------------------------------------------------------

def timed_sync(fn: Callable[[], Any], n: int) -> list[float]:
    us = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        us.append((time.perf_counter_ns() - t0) / 1000)
    return us


async def timed_async(fn: Callable[[], Any], n: int) -> list[float]:
    us = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await fn()
        us.append((time.perf_counter_ns() - t0) / 1000)
    return us


async def part_reads(store: estate_store.Store, local: LocalCopy, routers: dict[str, Router],
                     task_id: str, args: argparse.Namespace, out: dict[str, Any]) -> None:
    reader = estate_store.Reader(store)
    found = reader.query("task.get", {"id": task_id})
    if found["task"] is None:
        raise BenchError(f"task {task_id} is not in the node's copy")
    out["read_task"] = {"id": task_id, "comments": len(found["comments"]),
                        "bytes": len(estate_store.pack(found))}
    key, tasks = task_id.encode(), store.dbs["tasks"]
    qargs = {"id": task_id}

    async def local_ask():
        answer = await local.ask(wire.read_request("task.get", qargs))
        if answer.get("status") != wire.OK:
            raise BenchError(f"LocalCopy.ask answered {answer}")

    def raw_get():
        with store.env.begin() as txn:
            txn.get(key, db=tasks)

    sync_sides: dict[str, Callable[[], Any]] = {
        "reader_query": lambda: reader.query("task.get", qargs), "raw_get": raw_get}
    async_sides: dict[str, Callable[[], Any]] = {"local_ask": local_ask}
    for name, r in routers.items():
        async_sides[name] = (lambda r=r: r.read("task.get", qargs))
    sides = tuple(async_sides) + tuple(sync_sides)

    async def run(side: str, n: int) -> list[float]:
        if side in sync_sides:
            return timed_sync(sync_sides[side], n)
        return await timed_async(async_sides[side], n)

    for side in sides:
        await run(side, min(200, args.reads))
    us: dict[str, list[float]] = {s: [] for s in sides}
    rounds: dict[str, list[float]] = {s: [] for s in sides}
    for i in range(args.rounds):
        for side in orders(i, sides):
            got = await run(side, args.reads)
            us[side] += got
            rounds[side].append(statistics.median(got))
        say(f"  read round {i + 1}: median µs " + ", ".join(f"{s} {rounds[s][-1]:.1f}" for s in sides))
    out["read_us"] = {s: {**summary(us[s]), "round_medians": rounds[s]} for s in sides}


# --------------------------------------------------------------------------
# Part 4: search
# --------------------------------------------------------------------------

def build_search(data_dir: str, args: argparse.Namespace, words: Words, out: dict[str, Any]) -> None:
    """Apply the pages into a fresh copy, then index them; both timed."""
    say(f"  making {args.pages} pages of ~{PAGE_WORDS} words")
    entries = page_ops(args.pages, words)
    out["pages"] = args.pages
    out["page_bytes_mean"] = statistics.mean(len(d) for _, d in entries)
    store = estate_store.open_env(copy_path(data_dir))
    try:
        t0 = time.perf_counter()
        for batch in batches(entries, args.batch):
            estate_apply.apply_batch(store, batch)
        out["apply_s"] = time.perf_counter() - t0
        del entries
        index = SearchIndex(index_path(data_dir))
        try:
            t0 = time.perf_counter()
            indexed = index.catch_up(store)
            out["index_s"] = time.perf_counter() - t0
            out["indexed"], out["indexed_pages"] = indexed, index.count()
        finally:
            index.close()
    finally:
        # Closed before anything reads it: LMDB allows one handle per path and process.
        estate_store.close_env(store)
    out["index_bytes"] = sum(os.path.getsize(p) for p in Path(data_dir).glob("estate-search.sqlite*"))
    say(f"  {args.pages} pages applied in {out['apply_s']:.1f}s, indexed in {out['index_s']:.1f}s")


async def part_search(data_dir: str, local: LocalCopy | None, args: argparse.Namespace, words: Words,
                      out: dict[str, Any]) -> None:
    rng = random.Random(SEED + 5)
    queries = [words.query(rng) for _ in range(args.queries)]
    index = SearchIndex(index_path(data_dir), readonly=True)
    raw = sqlite3.connect(Path(index_path(data_dir)).as_uri() + "?mode=ro", uri=True,
                          isolation_level=None, check_same_thread=False)
    try:
        matched = [raw.execute("SELECT count(*) FROM pages_fts WHERE pages_fts MATCH ?",
                               (fts_query(q),)).fetchone()[0] for q in queries[:100]]
        out["queries"] = {"n": len(queries), "one_word": sum(1 for q in queries if " " not in q),
                          "examples": queries[:6], "pages_matched_median": statistics.median(matched),
                          "pages_matched_max": max(matched),
                          "with_hits": sum(1 for m in matched if m) / len(matched)}
        fts = [fts_query(q) for q in queries]   # the raw side gets its MATCH strings made

        def run_index() -> list[float]:
            ms = []
            for q in queries:
                t0 = time.perf_counter()
                index.search(q, SEARCH_LIMIT)
                ms.append((time.perf_counter() - t0) * 1000)
            return ms

        def run_raw() -> list[float]:
            ms = []
            for m in fts:
                t0 = time.perf_counter()
                raw.execute(RAW_FTS, (m, SEARCH_LIMIT)).fetchall()
                ms.append((time.perf_counter() - t0) * 1000)
            return ms

        async def run_local() -> list[float]:
            assert local is not None
            # A synchronous side just held the loop: let the copy hear the applier again.
            deadline = time.monotonic() + 5.0
            while not local.in_service() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            ms = []
            for q in queries:
                t0 = time.perf_counter()
                answer = await local.ask(wire.read_request("page.search", {"query": q,
                                                                          "limit": SEARCH_LIMIT}))
                ms.append((time.perf_counter() - t0) * 1000)
                if answer.get("status") != wire.OK:
                    raise BenchError(f"LocalCopy.ask(page.search) answered {answer}")
            return ms

        thirds = list(split_shards(["n1", "n2", "n3"]).values())

        def run_split() -> list[float]:
            # Three data nodes, each its own CPU: the asker waits for the slowest
            # range (each timed alone here), then merges.
            ms = []
            for q in queries:
                slowest, parts = 0.0, []
                for shards in thirds:
                    t0 = time.perf_counter()
                    parts.append(index.search(q, SEARCH_LIMIT, shards))
                    slowest = max(slowest, time.perf_counter() - t0)
                t0 = time.perf_counter()
                merge_hits(parts, SEARCH_LIMIT)
                ms.append((slowest + time.perf_counter() - t0) * 1000)
            return ms

        sides: dict[str, Callable[[], Any]] = {"search_index": run_index, "split_3": run_split,
                                               "raw_fts5": run_raw}
        if local is not None:
            sides["local_ask"] = run_local
        names = tuple(sides)

        async def run(side: str) -> list[float]:
            got = sides[side]()
            return await got if asyncio.iscoroutine(got) else got

        ms: dict[str, list[float]] = {s: [] for s in names}
        rounds: dict[str, list[float]] = {s: [] for s in names}
        for side in names:   # warm-up: the page cache, sqlite's
            await run(side)
        for i in range(args.rounds):
            for side in orders(i, names):
                got = await run(side)
                ms[side] += got
                rounds[side].append(statistics.median(got))
            say(f"  search round {i + 1}: median ms "
                + ", ".join(f"{s} {rounds[s][-1]:.3f}" for s in names))
        out["search_ms"] = {s: {**summary(ms[s]), "round_medians": rounds[s]} for s in names}
    finally:
        index.close()
        raw.close()


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

async def wait_in_service(node: Node, view: EstateView, locals_: list[LocalCopy]) -> float:
    t0 = time.monotonic()
    deadline = t0 + NODE_START
    await wait_until("the applier running", node.applier_running, deadline, node)
    for local in locals_:
        await wait_until("the local copy in service", local.in_service, deadline, node)
    await wait_until("the node in service in the view",
                     lambda: (s := view.state(NODE_ID)) is not None and s.in_service, deadline, node)
    return time.monotonic() - t0


def failed(out: dict[str, Any], part: str, exc: BaseException) -> None:
    what = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
    out.setdefault("errors", {})[part] = what
    say(f"  {part} FAILED: {what}")


async def with_node(node: Node, base: str, args: argparse.Namespace, words: Words,
                    out: dict[str, Any]) -> None:
    t0 = time.monotonic()
    node.start()
    nc = await _connect(node, t0)
    js = nc.jetstream(timeout=JS_TIMEOUT)
    zctx = zmq.asyncio.Context()
    view = EstateView(js)
    view_task = asyncio.create_task(view.run())
    local = LocalCopy(zctx, node_id=NODE_ID, run_dir=node.run_dir, data_dir=node.data_dir).start()
    searcher, copy = None, None
    if "search" in out:
        searcher = LocalCopy(zctx, node_id=NODE_ID, run_dir=node.run_dir,
                             data_dir=os.path.join(base, "s")).start()
    try:
        await wait_in_service(node, view, [local] + ([searcher] if searcher else []))
        out["node"]["in_service_s"] = time.monotonic() - t0
        say(f"  node in service {out['node']['in_service_s']:.1f}s after its start")
        await js.add_stream(StreamConfig(name=RAW_STREAM, subjects=[RAW_SUBJECT],
                                         retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
                                         num_replicas=1, duplicate_window=estate_log.DUPLICATE_WINDOW))
        copy = estate_store.open_env(copy_path(node.data_dir), readonly=True)
        routers = {"router_nats": Router(nc, node_id=ASKER_ID, view=view),
                   "router_local": Router(nc, node_id=NODE_ID, view=view, local=local)}
        tags = itertools.count()
        task_id = None
        await claim_seats(js)
        say("part 1b: the node's applier end to end")
        try:
            task_id = await part_e2e(js, estate_store.Reader(copy), args, words, out["apply"], tags)
        except Exception as exc:
            failed(out, "e2e", exc)
        say("part 2: write latency")
        try:
            await part_writes(nc, js, routers, args, out["writes"], tags)
        except Exception as exc:
            failed(out, "writes", exc)
        say("part 3: read latency")
        try:
            if task_id is None:   # part 1b failed: read a task part 2 wrote, without comments
                task_id = f"T{copy.applied()}"
            await part_reads(copy, local, {"router_local_read": routers["router_local"],
                                           "router_nats_read": routers["router_nats"]},
                             task_id, args, out["reads"])
        except Exception as exc:
            failed(out, "reads", exc)
        if "search" in out:
            say("part 4: search latency")
            try:
                await part_search(os.path.join(base, "s"), searcher, args, words, out["search"])
            except Exception as exc:
                failed(out, "search", exc)
    finally:
        for lc in (local, searcher):
            if lc is not None:
                await lc.close()
        if copy is not None:
            estate_store.close_env(copy)
        view_task.cancel()
        await asyncio.gather(view_task, return_exceptions=True)
        try:
            await asyncio.wait_for(nc.close(), 10)
        except Exception:
            pass
        zctx.term()


async def claim_seats(js) -> None:
    """Claim every bench seat for the node in ``leases``, as a seats process
    would (an hour's TTL: the run is shorter), and write under those tokens."""
    leases = Leases(js, NODE_ID, uuid.uuid4().hex, ttl=3600)
    for seat in SEATS:
        held = await leases.claim(f"seat.{seat}")
        if held is None:
            raise BenchError(f"seat {seat}'s lease is held by somebody else")
        TOKENS[seat] = held.token


async def _connect(node: Node, t0: float):
    """A connection to the node's broker, once it listens (probed first: a refused
    nats.connect prints a traceback)."""
    while True:
        node.check_alive()
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", node.stream_port)) == 0:
                break
        if time.monotonic() - t0 > NODE_START:
            raise BenchError(f"the node's broker not listening within {NODE_START:g}s:\n"
                             + node.log_tail())
        await asyncio.sleep(0.05)
    return await nats.connect(node.url, name="bench-estate", connect_timeout=2,
                              allow_reconnect=False, max_reconnect_attempts=0)


def run(binary: str, args: argparse.Namespace) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="cwe", dir="/tmp")
    words = Words()
    out: dict[str, Any] = {"apply": {}, "writes": {}, "reads": {}, "node": {}}
    node = Node(os.path.join(base, "n"), binary)
    say(f"dir {base}; node broker :{node.stream_port}")
    broke = False
    try:
        say(f"part 1a: apply_batch beside raw LMDB puts ({args.ops} ops, {args.rounds} rounds)")
        try:
            part_apply(os.path.join(base, "a"), args, words, out["apply"])
        except Exception as exc:
            failed(out, "apply", exc)
        if args.pages:
            say(f"part 4 (build): {args.pages} pages")
            try:
                out["search"] = {}
                build_search(os.path.join(base, "s"), args, words, out["search"])
            except Exception as exc:
                failed(out, "search build", exc)
                out.pop("search", None)
        say("starting the node (data role)")
        try:
            asyncio.run(with_node(node, base, args, words, out))
        except Exception as exc:
            broke = True
            failed(out, "node", exc)
    finally:
        say("stopping crewletd")
        out["node"]["stop_s"] = node.stop()
        out["node"]["log_problems"] = node.problems()   # the stop's own included
        if args.keep or broke:
            out["kept"] = base
            say(f"kept {base} (crewletd log: {node.log_path})")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return out


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def _median(rounds: list[dict[str, Any]], key: str = "per_s") -> float | None:
    vals = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def build_report(raw: dict[str, Any], args: argparse.Namespace, binary: str) -> dict[str, Any]:
    a, w = raw["apply"], raw["writes"].get("write_ms", {})
    apply_s, put_s = _median(a.get("apply", [])), _median(a.get("raw_put", []))
    floor_s = _median(a.get("floor", []))
    e2e_s, pub_s = _median(a.get("e2e", [])), _median(a.get("raw_publish", []))
    apply_ratio = ratio(apply_s, put_s)
    keys = [r["keys"] / r["n"] for r in a.get("apply", []) if r.get("n")]
    keys_per_op = statistics.median(keys) if keys else None
    # Informational: raw LMDB doing as many puts as the keys an op leaves in the copy.
    put_ops_s = ratio(put_s, keys_per_op)
    raw_write = (w.get("raw_publish") or {}).get("median")
    targets = {"apply_vs_raw_put": {"target": TARGET_APPLY_RATIO, "value": apply_ratio,
                                    "pass": apply_ratio is not None and apply_ratio >= TARGET_APPLY_RATIO}}
    for side in ("router_nats", "router_local"):
        r = ratio((w.get(side) or {}).get("median"), raw_write)
        targets[f"{side}_write_vs_raw_publish"] = {"target": TARGET_WRITE_RATIO, "value": r,
                                                   "pass": r is not None and r <= TARGET_WRITE_RATIO}
    return {
        "apply": {"ops_per_s": apply_s, "raw_puts_per_s": put_s, "ratio": apply_ratio,
                  "keys_per_op": keys_per_op, "raw_at_keys_per_op": put_ops_s,
                  "ratio_at_keys_per_op": ratio(apply_s, put_ops_s),
                  "refused": max((r.get("refused", 0) for r in a.get("apply", [])), default=None),
                  "e2e_ops_per_s": e2e_s, "raw_publish_per_s": pub_s, "e2e_ratio": ratio(e2e_s, pub_s),
                  "e2e_publish_per_s": _median(a.get("e2e", []), "publish_per_s"),
                  "e2e_lag_ms": _median(a.get("e2e", []), "applied_after_published_ms"),
                  **{k: a.get(k) for k in ("op_bytes", "mix")},
                  "floor_ops_per_s": floor_s, "floor_ratio": ratio(floor_s, put_s),
                  "apply_vs_floor": ratio(apply_s, floor_s),
                  "rounds": {k: a.get(k, []) for k in ("apply", "raw_put", "floor", "e2e", "raw_publish")}},
        "write_ms": w,
        "read_us": raw["reads"].get("read_us", {}),
        "read_task": raw["reads"].get("read_task"),
        "search": raw.get("search"),
        "targets": targets,
        "errors": raw.get("errors", {}),
        "node": raw["node"],
        "kept": raw.get("kept"),
        "config": {"quick": args.quick, "rounds": args.rounds, "ops": args.ops, "e2e_ops": args.e2e_ops,
                   "batch": args.batch, "window": args.window, "writes": args.writes, "reads": args.reads,
                   "pages": args.pages, "queries": args.queries,
                   "nats_server": server_version(binary), "nats_py": NATS_PY_VERSION,
                   "lmdb": lmdb.version(), "sqlite": sqlite3.sqlite_version,
                   "python": sys.version.split()[0], "cpus": os.cpu_count()},
    }


def _f(v: float | None, spec: str) -> str:
    width = int(spec.split(".")[0] or 0)
    return f"{v:{spec}}" if v is not None else f"{'n/a':>{width}}"


def _x(r: float | None) -> str:
    return "   n/a" if r is None else f"{r:6.2f}x"


def _mark(t: dict[str, Any]) -> str:
    return "n/a " if t["value"] is None else ("PASS" if t["pass"] else "MISS")


def _latencies(sides: dict[str, Any], labels: dict[str, str], raw: str, spec: str, unit: str = "",
               p99_vs_raw: bool = True) -> None:
    """A latency table: a row (n, median, p99 in *spec*) for each side of *labels* that was
    measured, the sides beside the *raw* one with their ratios to it (median, and p99)."""
    print(f"   {unit:44} {'n':>5} {'median':>8} {'p99':>8}   vs raw: median"
          + ("    p99" if p99_vs_raw else ""))
    base = sides.get(raw) or {}
    for side, label in labels.items():
        m = sides.get(side)
        if not m:
            continue
        tail = "" if side == raw else f"   {'':7}{_x(ratio(m['median'], base.get('median')))}"
        if side != raw and p99_vs_raw:
            tail += f" {_x(ratio(m['p99'], base.get('p99')))}"
        print(f"   {label:44} {m['n']:5d} {m['median']:{spec}} {m['p99']:{spec}}{tail}")


def print_text(rep: dict[str, Any]) -> None:
    cfg, a = rep["config"], rep["apply"]
    print(f"crewlet estate benchmark  (python {cfg['python']}, {cfg['cpus']} cpus, nats-server "
          f"{cfg['nats_server']}, nats-py {cfg['nats_py']}, lmdb {'.'.join(map(str, cfg['lmdb']))}, "
          f"sqlite {cfg['sqlite']}; {cfg['rounds']} interleaved rounds, medians"
          f"{'; --quick' if cfg['quick'] else ''})")
    print()
    print(f"1. apply: {cfg['ops']} ops in batches of {cfg['batch']}, mix {a.get('mix')}, "
          f"{_f((a.get('op_bytes') or {}).get('mean'), '.0f')} bytes an op on average")
    print(f"   {'apply_batch into a fresh copy':44} {_f(a['ops_per_s'], '10.0f')} ops/s")
    print(f"   {'raw LMDB txn.put, same sizes and batches':44} {_f(a['raw_puts_per_s'], '10.0f')} puts/s"
          f"   apply/raw {_x(a['ratio'])}")
    if a.get("keys_per_op"):
        print(f"   {'  an op leaves ' + format(a['keys_per_op'], '.1f') + ' keys in the copy; raw puts':44} "
              f"{_f(a['raw_at_keys_per_op'], '10.0f')} ops/s   apply/that {_x(a['ratio_at_keys_per_op'])}"
              f"   (informational)")
    if a.get("floor_ops_per_s"):
        print(f"   {'  the floor: its LMDB and msgpack calls alone':44} {_f(a['floor_ops_per_s'], '10.0f')} ops/s"
              f"   floor/raw {_x(a['floor_ratio'])}   apply/floor {_x(a['apply_vs_floor'])}")
    if a.get("refused"):
        print(f"   ({a['refused']} ops of a round were refused: the mix should have none)")
    print(f"   end to end, {cfg['e2e_ops']} ops published ({cfg['window']} in flight) to the node's log:")
    print(f"   {'  published -> applied by the node':44} {_f(a['e2e_ops_per_s'], '10.0f')} ops/s"
          f"   (its publishes alone {_f(a['e2e_publish_per_s'], '.0f')}/s; the last op applied "
          f"{_f(a['e2e_lag_ms'], '.0f')} ms after its ack)")
    misplaced = sum(r.get("misplaced", 0) for r in a["rounds"]["e2e"])
    if misplaced:
        print(f"   ({misplaced} ops landed at another seq than sent: their updates may be refused)")
    print(f"   {'  raw pipelined js.publish, same bytes':44} {_f(a['raw_publish_per_s'], '10.0f')} msgs/s"
          f"   e2e/raw   {_x(a['e2e_ratio'])}")
    print()
    w = rep["write_ms"]
    print("2. write latency, task.create one at a time (publish -> applied -> answered), ms")
    labels = {"router_nats": "Router over NATS (node without data)",
              "router_local": "Router over LocalCopy (ZeroMQ, data node)",
              "raw_publish": "raw js.publish round trip"}
    _latencies(w, labels, "raw_publish", "8.2f")
    split = [f"{labels[s].split(' (')[0]}: in the log after {w[s]['to_log_median']:.2f} ms, answered "
             f"{w[s]['median'] - w[s]['to_log_median']:.2f} ms later"
             for s in ("router_nats", "router_local") if (w.get(s) or {}).get("to_log_median") is not None]
    if split:
        print("   medians, where the time goes (a core subscription sees the op enter the log):")
        for line in split:
            print(f"     {line}")
    print()
    r = rep["read_us"]
    t = rep.get("read_task") or {}
    print(f"3. read latency, task.get {t.get('id', '?')} ({t.get('comments', '?')} comments, "
          f"{t.get('bytes', '?')} bytes answered), µs")
    _latencies(r, {"local_ask": "LocalCopy.ask(read task.get)", "reader_query": "Reader.query(task.get)",
                   "router_local_read": "Router.read over LocalCopy",
                   "router_nats_read": "Router.read over NATS (for comparison)",
                   "raw_get": "raw txn.get of the task's key"}, "raw_get", "8.1f", p99_vs_raw=False)
    print()
    s = rep.get("search")
    if s:
        q = s.get("queries") or {}
        print(f"4. search over {s['pages']} pages (~{PAGE_WORDS} words, {VOCABULARY} word vocabulary, "
              f"{_f(s.get('page_bytes_mean'), '.0f')} bytes an op)")
        print(f"   applied with apply_batch in {_f(s.get('apply_s'), '.2f')} s "
              f"({_f(ratio(s['pages'], s.get('apply_s')), '.0f')} pages/s); indexed with catch_up in "
              f"{_f(s.get('index_s'), '.2f')} s ({_f(ratio(s['pages'], s.get('index_s')), '.0f')} pages/s); "
              f"index {_f((s.get('index_bytes') or 0) / 2**20, '.1f')} MiB")
        if q:
            print(f"   {q['n']} queries, {q['one_word']} of one word, the rest two (e.g. "
                  f"{', '.join(repr(x) for x in q['examples'][:4])}); pages matched: median "
                  f"{q['pages_matched_median']:g}, max {q['pages_matched_max']}, "
                  f"{q['with_hits']:.0%} with hits (of the first 100)")
        _latencies(s.get("search_ms") or {}, {"search_index": "SearchIndex.search (read-only handle)",
                                               "split_3": "split over 3 nodes (slowest third + merge)",
                                               "local_ask": "LocalCopy.ask(page.search)",
                                               "raw_fts5": "raw FTS5 MATCH ORDER BY rank LIMIT 10"},
                   "raw_fts5", "8.3f", unit="ms")
        split = (s.get("search_ms") or {}).get("split_3")
        if split:
            ok = split["p99"] <= TARGET_SEARCH_P99_MS
            print(f"   split search p99 {split['p99']:.2f} ms: target <= {TARGET_SEARCH_P99_MS:g} ms "
                  f"{'PASS' if ok else 'MISS'} (informational: not in the targets below)")
        print()
    print("targets")
    tg = rep["targets"]
    x = tg["apply_vs_raw_put"]
    print(f"   {'apply ops/s vs raw LMDB puts/s':48} {_f(x['value'], '6.2f')}x  target >= "
          f"{x['target']:.2f}x  {_mark(x)}")
    for side, label in (("router_nats", "Router over NATS"), ("router_local", "Router over LocalCopy")):
        x = tg[f"{side}_write_vs_raw_publish"]
        print(f"   {label + ' write median vs raw publish':48} {_f(x['value'], '6.2f')}x  target <= "
              f"{x['target']:.2f}x  {_mark(x)}")
    node = rep["node"]
    print()
    print(f"node: in service {_f(node.get('in_service_s'), '.1f')} s after its start, stopped in "
          f"{_f(node.get('stop_s'), '.1f')} s; log warnings/errors: "
          + (", ".join(f"{k} x{v}" for k, v in (node.get("log_problems") or {}).items()) or "none"))
    for part, err in rep["errors"].items():
        print(f"FAILED {part}: {err}")
    if rep.get("kept"):
        print(f"kept: {rep['kept']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small sizes (the whole run < 60 s): "
                    + ", ".join(f"{k} {v}" for k, v in QUICK.items()))
    ap.add_argument("--ops", type=int, help=f"ops per apply round (default {FULL['ops']})")
    ap.add_argument("--e2e-ops", type=int, help=f"ops per end-to-end round (default {FULL['e2e_ops']})")
    ap.add_argument("--writes", type=int, help=f"writes per side and round (default {FULL['writes']})")
    ap.add_argument("--reads", type=int, help=f"reads per side and round (default {FULL['reads']})")
    ap.add_argument("--pages", type=int, help=f"pages searched (default {FULL['pages']}; 0: no search)")
    ap.add_argument("--queries", type=int, help=f"queries per side and round (default {FULL['queries']})")
    ap.add_argument("--rounds", type=int, help=f"interleaved rounds (default {FULL['rounds']})")
    ap.add_argument("--batch", type=int, default=1000, help="ops per apply_batch / LMDB txn (default 1000)")
    ap.add_argument("--window", type=int, default=256, help="publishes in flight (default 256)")
    ap.add_argument("--nats-server", help="the nats-server binary (default: as crewlet finds it)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    add_smoke(ap, argv, {"ops": 200, "e2e_ops": 100, "writes": 20, "reads": 20, "pages": 20,
                         "queries": 5, "rounds": 1})
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    for k, v in sizes.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.ops, args.e2e_ops, args.writes, args.reads, args.queries, args.rounds,
           args.batch, args.window) < 1 or args.pages < 0:
        ap.error("sizes must be >= 1 (--pages >= 0)")
    # SIGTERM ends the run through the finally blocks, like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        binary = find_nats_server(args.nats_server)
    except BenchError as exc:
        print(f"bench/estate.py: {exc}", file=sys.stderr)
        return 1
    # crewlet's own events (buckets made, watches waiting ...) go to stderr: stdout is the report.
    log.configure(node=None, role="bench", level="warning", fmt="json", stream=sys.stderr)
    t0 = time.monotonic()
    raw = run(binary, args)
    say(f"done in {time.monotonic() - t0:.0f}s")
    return emit(build_report(raw, args, binary), args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
