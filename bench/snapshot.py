#!/usr/bin/env python3
"""Benchmark: a snapshot bootstrap of a copy of the estate, beside a raw file copy of the same bytes.

Builds a copy of about ``--size-mb`` MiB (default 1024) with
:func:`crewlet.estate.apply.apply_batch` (``page.write`` ops of ~4 KiB, the
knowledge base's shape), then times what a data node joining after a trim
goes through (crewlet/estate/snapshot.py), each phase on its own:

* **make**: ``Environment.copy`` (compacted) under one read transaction, and the
  digest of every replicated table in that transaction;
* **put**: the copy into a JetStream object store bucket
  (:class:`crewlet.objects.nats.NatsObjectStore`) and its manifest into the
  ``objects`` slot, on a bare ``nats-server -js`` started here (127.0.0.1, a
  free port, its store in a temp dir under /tmp; stopped by its pid);
* **fetch**: the copy read back from the bucket into a new file (its sha256
  checked as it streams), opened and hashed against the manifest, its
  ``events`` emptied;
* **install**: put in place of an empty copy;

beside the **raw** baseline: ``shutil.copyfile`` of the same ``data.mdb`` and an
``fsync`` of the copy. The ratio is crewlet's whole bootstrap (make + put +
fetch + install) over the raw copy. ``--rounds`` rounds, medians; the side
going first alternates.

    /work/venv/bin/python bench/snapshot.py [--size-mb 1024] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import nats  # noqa: E402

from bench.common import (add_smoke, NatsServer, emit, find_nats_server, ratio, say, server_version,  # noqa: E402
                          wait_jetstream)
from crewlet import log  # noqa: E402
from crewlet.coord import buckets  # noqa: E402
from crewlet.estate import apply, snapshot  # noqa: E402
from crewlet.estate import store as estate_store  # noqa: E402
from crewlet.estate.ops import Op  # noqa: E402
from crewlet.objects.nats import NatsObjectStore  # noqa: E402

MiB = 1024 * 1024
PAGE_BYTES = 4000      # a page body
BATCH = 1000           # ops per apply_batch
WORDS = [f"w{i}" for i in range(4000)]


def build_copy(data_dir: str, size_mb: int) -> dict[str, Any]:
    """A copy of about *size_mb* MiB of ``page.write`` rows."""
    st = estate_store.open_env(estate_store.copy_path(data_dir))
    rng = random.Random(7)
    seq, t0 = 0, time.perf_counter()
    path = os.path.join(estate_store.copy_path(data_dir), "data.mdb")
    while os.path.getsize(path) < size_mb * MiB:
        batch = []
        for _ in range(BATCH):
            seq += 1
            body = " ".join(rng.choices(WORDS, k=PAGE_BYTES // 6))[:PAGE_BYTES]
            op = Op(id=f"p{seq}", kind="page.write", args={"path": f"kb/p{seq}", "title": f"page {seq}",
                                                            "body": body}, seat=None, token=None,
                    node="bench", at=1_700_000_000.0 + seq)
            batch.append((seq, op.encode()))
        apply.apply_batch(st, batch)
    estate_store.record_rules(st, apply.RULES)
    estate_store.close_env(st)
    return {"pages": seq, "bytes": os.path.getsize(path), "built_s": time.perf_counter() - t0}


async def crewlet_round(js, nc, data_dir: str, work: str) -> dict[str, float]:
    objects = NatsObjectStore(js, nc, bucket="snapbench")
    st = estate_store.open_env(estate_store.copy_path(data_dir), readonly=True)
    out: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        path, manifest = await asyncio.to_thread(snapshot.make, st, os.path.join(work, "made"), "bench")
        out["make"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        await snapshot.publish(objects, js, path, manifest)
        out["put"] = time.perf_counter() - t0
        joiner = os.path.join(work, "joiner")
        os.makedirs(joiner, mode=0o700)
        t0 = time.perf_counter()
        incoming = await snapshot.fetch(objects, manifest, joiner)
        out["fetch"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        await asyncio.to_thread(snapshot.install, incoming, joiner)
        out["install"] = time.perf_counter() - t0
        out["total"] = sum(out[k] for k in ("make", "put", "fetch", "install"))
        await objects.delete(manifest.name + snapshot.DATA)
    finally:
        estate_store.close_env(st)
        shutil.rmtree(os.path.join(work, "made"), ignore_errors=True)
        shutil.rmtree(os.path.join(work, "joiner"), ignore_errors=True)
    return out


def raw_round(data_dir: str, work: str) -> dict[str, float]:
    src = os.path.join(estate_store.copy_path(data_dir), "data.mdb")
    dst = os.path.join(work, "raw.mdb")
    t0 = time.perf_counter()
    shutil.copyfile(src, dst)
    with open(dst, "rb+") as f:
        os.fsync(f.fileno())
    took = time.perf_counter() - t0
    os.unlink(dst)
    return {"total": took}


async def run(args: argparse.Namespace, binary: str) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="cws", dir="/tmp")
    server = NatsServer(binary, os.path.join(base, "nats")).start()
    try:
        await wait_jetstream(server.url)
        say(f"building a copy of ~{args.size_mb} MiB")
        built = build_copy(os.path.join(base, "d"), args.size_mb)
        say(f"  {built['pages']} pages, {built['bytes'] / MiB:.0f} MiB in {built['built_s']:.1f}s")
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=30)
        await buckets.ensure(js, buckets.OBJECTS, 1)
        await NatsObjectStore(js, nc, bucket="snapbench").ensure()
        rounds: dict[str, list[dict[str, float]]] = {"crewlet": [], "raw": []}
        for i in range(args.rounds):
            for side in (("crewlet", "raw") if i % 2 == 0 else ("raw", "crewlet")):
                if side == "crewlet":
                    r = await crewlet_round(js, nc, os.path.join(base, "d"), base)
                else:
                    r = raw_round(os.path.join(base, "d"), base)
                rounds[side].append(r)
                say(f"  round {i + 1} {side}: " + ", ".join(f"{k} {v:.2f}s" for k, v in r.items()))
        await nc.close()
        med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in rounds.items()}
        return {"copy": built, "rounds": rounds, "median": med,
                "ratio": ratio(med["crewlet"]["total"], med["raw"]["total"]),
                "server": server_version(binary), "size_mb": args.size_mb}
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def print_text(rep: dict[str, Any]) -> None:
    c, m = rep["copy"], rep["median"]
    mib = c["bytes"] / MiB
    print(f"crewlet snapshot bootstrap  (nats-server {rep['server']}; {len(rep['rounds']['raw'])} rounds, medians)")
    print(f"  a copy of {c['pages']:,} pages, {mib:,.0f} MiB")
    for k in ("make", "put", "fetch", "install"):
        print(f"    {k:8} {m['crewlet'][k]:7.2f} s")
    print(f"  bootstrap (make + put + fetch + install) {m['crewlet']['total']:7.2f} s  "
          f"({mib / m['crewlet']['total']:,.0f} MiB/s)")
    print(f"  raw file copy + fsync                   {m['raw']['total']:7.2f} s  "
          f"({mib / m['raw']['total']:,.0f} MiB/s)   ratio {rep['ratio']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="the copy's size, about (default 1024)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per side (default 2)")
    parser.add_argument("--nats-server", help="the nats-server binary (default: as crewlet finds it)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    add_smoke(parser, argv, {"size_mb": 2, "rounds": 1})
    args = parser.parse_args(argv)
    # SIGTERM ends the run through the finally blocks (the servers and nodes it started stop), like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # crewlet's own events (buckets made, watches waiting ...) go to stderr: stdout is the report.
    log.configure(node=None, role="bench", level="warning", fmt="json", stream=sys.stderr)
    rep = asyncio.run(run(args, find_nats_server(args.nats_server)))
    return emit(rep, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
