#!/usr/bin/env python3
"""Benchmark: the object store (files) -- crewlet's backends beside their bare clients.

Starts its own ``nats-server -js`` on a free 127.0.0.1 port (store in a temp
dir under /tmp, stopped by its pid) and, where boto3 and moto are installed,
a moto S3 server in this process on another free 127.0.0.1 port (stopped at
the end). For each size (``--sizes``, default 1 MiB and 100 MiB) it times, in
rounds whose first side alternates, a put and a full read of one object:

* **nats**: crewlet's :class:`~crewlet.objects.nats.NatsObjectStore` beside
  bare nats-py's object store (``js.create_object_store``, ``put`` from a
  file object, ``get``) on the same server, each on a bucket of its own;
* **s3**: crewlet's :class:`~crewlet.objects.s3.S3ObjectStore` beside bare
  boto3 on the same moto server: ``put_object`` of the whole bytes, and
  ``get_object`` read whole (the plainest calls; crewlet streams in parts of
  8 MiB and reads in chunks of 1 MiB instead, never holding an object whole);
  and ``put_managed``: boto3's ``upload_fileobj`` (multipart above 8 MiB, 10
  threads), the bare figure a multipart upload pays on the same server.

Each figure is the median of its rounds in ms (and MiB/s); ratios are
crewlet/bare (under 1: crewlet faster). Exit status: 0 unless the benchmark
itself broke.

    /work/venv/bin/python bench/objects.py [--sizes 1,100] [--rounds 10,2] [--skip-s3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import io
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any, Awaitable, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import nats  # noqa: E402
from nats.aio.client import __version__ as NATS_PY_VERSION  # noqa: E402

from bench.common import (add_smoke, BenchError, NatsServer, emit, find_nats_server, free_ports, ratio, say,  # noqa: E402
                          server_version, wait_jetstream)
from crewlet import log  # noqa: E402
from crewlet.objects.nats import NatsObjectStore  # noqa: E402

MiB = 1024 * 1024


async def _timed(call: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await call()
    return (time.perf_counter() - t0) * 1000


async def _pair(sides: dict[str, Callable[[], Awaitable[Any]]], rounds: int) -> dict[str, list[float]]:
    """Each side's times in ms over *rounds*, the first side alternating."""
    names = list(sides)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else list(reversed(names))):
            times[n].append(await sides[n]())
    return times


def _figure(times: dict[str, list[float]], size: int) -> dict[str, Any]:
    med = {n: statistics.median(v) for n, v in times.items()}
    return {**{f"{n}_ms": round(m, 2) for n, m in med.items()},
            **{f"{n}_mib_s": round(size / MiB / (m / 1000), 1) for n, m in med.items()},
            "ratio": round(ratio(med["crewlet"], med["bare"]) or 0, 3), "rounds": len(next(iter(times.values())))}


async def bench_nats(url: str, sizes: list[int], rounds: list[int]) -> dict[str, Any]:
    nc = await nats.connect(url, connect_timeout=2)
    try:
        js = nc.jetstream(timeout=30)
        crewlet = NatsObjectStore(js, nc, bucket="crewlet")
        await crewlet.ensure()
        bare = await js.create_object_store("bare")
        out: dict[str, Any] = {}
        for size, n in zip(sizes, rounds):
            data = os.urandom(size)
            digest = hashlib.sha256(data).hexdigest()
            label = f"{size // MiB} MiB"
            say(f"nats {label}: {n} rounds")

            async def c_put():
                return await _timed(lambda: crewlet.put("obj", io.BytesIO(data), max_bytes=size))

            async def b_put():
                return await _timed(lambda: bare.put("obj", io.BytesIO(data)))

            async def c_get():
                async def read():
                    sha = hashlib.sha256()
                    async with await crewlet.open("obj") as reader:
                        async for chunk in reader:
                            sha.update(chunk)
                    assert sha.hexdigest() == digest
                return await _timed(read)

            async def b_get():
                async def read():
                    got = await bare.get("obj")
                    assert hashlib.sha256(got.data).hexdigest() == digest
                return await _timed(read)

            out[label] = {"put": _figure(await _pair({"crewlet": c_put, "bare": b_put}, n), size),
                          "get": _figure(await _pair({"crewlet": c_get, "bare": b_get}, n), size)}
        return out
    finally:
        await nc.close()


async def bench_s3(sizes: list[int], rounds: list[int]) -> dict[str, Any]:
    import boto3
    from moto.server import ThreadedMotoServer

    from crewlet.objects.s3 import S3ObjectStore

    port = free_ports(1)[0]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    keys = {"region": "us-east-1", "access_key": "bench", "secret_key": "bench"}
    try:
        crewlet = S3ObjectStore(endpoint_url=url, bucket="crewlet-files", create_bucket=True, **keys)
        await crewlet.ensure()
        bare = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="bench",
                            aws_secret_access_key="bench")
        bare.create_bucket(Bucket="bare-files")
        out: dict[str, Any] = {}
        for size, n in zip(sizes, rounds):
            data = os.urandom(size)
            digest = hashlib.sha256(data).hexdigest()
            label = f"{size // MiB} MiB"
            say(f"s3 {label}: {n} rounds")

            async def c_put():
                return await _timed(lambda: crewlet.put("obj", io.BytesIO(data), max_bytes=size))

            async def b_put():
                return await _timed(lambda: asyncio.to_thread(bare.put_object, Bucket="bare-files", Key="obj",
                                                              Body=data))

            async def c_get():
                async def read():
                    sha = hashlib.sha256()
                    async with await crewlet.open("obj") as reader:
                        async for chunk in reader:
                            sha.update(chunk)
                    assert sha.hexdigest() == digest
                return await _timed(read)

            async def b_get():
                async def read():
                    body = await asyncio.to_thread(lambda: bare.get_object(Bucket="bare-files", Key="obj")["Body"].read())
                    assert hashlib.sha256(body).hexdigest() == digest
                return await _timed(read)

            async def m_put():
                return await _timed(lambda: asyncio.to_thread(bare.upload_fileobj, io.BytesIO(data), "bare-files",
                                                              "obj"))

            out[label] = {"put": _figure(await _pair({"crewlet": c_put, "bare": b_put}, n), size),
                          # boto3's managed upload: multipart (8 MiB parts, 10 threads) above 8 MiB
                          "put_managed": _figure(await _pair({"crewlet": c_put, "bare": m_put}, n), size),
                          "get": _figure(await _pair({"crewlet": c_get, "bare": b_get}, n), size)}
        await crewlet.close()
        return out
    finally:
        server.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    rounds = [int(r) for r in args.rounds.split(",")]
    if len(rounds) != len(sizes):
        raise BenchError("--rounds needs one count per size")
    binary = find_nats_server(args.nats_server)
    tmp = tempfile.mkdtemp(prefix="cwobj", dir="/tmp")
    report: dict[str, Any] = {"nats_server": server_version(binary), "nats_py": NATS_PY_VERSION}
    server = NatsServer(binary, os.path.join(tmp, "nats"))
    try:
        server.start()
        asyncio.run(wait_jetstream(server.url))
        report["nats"] = asyncio.run(bench_nats(server.url, sizes, rounds))
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.skip_s3:
        report["s3"] = "skipped (--skip-s3)"
    else:
        if not all(importlib.util.find_spec(m) for m in ("boto3", "moto", "flask")):
            report["s3"] = "skipped: boto3 and moto[server] are not installed"
        else:
            report["s3"] = asyncio.run(bench_s3(sizes, rounds))
    return report


def print_text(report: dict[str, Any]) -> None:
    print(f"object store: nats-server {report['nats_server']}, nats-py {report['nats_py']}; "
          f"median ms (MiB/s); ratio = crewlet/bare")
    for backend in ("nats", "s3"):
        part = report.get(backend)
        if not isinstance(part, dict):
            print(f"{backend}: {part}")
            continue
        for label, ops in part.items():
            for op, f in ops.items():
                print(f"{backend:4} {op:11} {label:>8}: crewlet {f['crewlet_ms']:9.1f} ms ({f['crewlet_mib_s']:7.1f} MiB/s)"
                      f"   bare {f['bare_ms']:9.1f} ms ({f['bare_mib_s']:7.1f} MiB/s)   x{f['ratio']:.2f}"
                      f"   [{f['rounds']} rounds]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,100", help="object sizes in MiB, comma-separated (default 1,100)")
    ap.add_argument("--rounds", default="10,2", help="rounds per size, comma-separated (default 10,2)")
    ap.add_argument("--skip-s3", action="store_true", help="only the NATS backend")
    ap.add_argument("--nats-server", help="the nats-server binary (default: next to python, then $PATH)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--keep", action="store_true", help="keep the temp store dir")
    add_smoke(ap, None, {"sizes": "1,9", "rounds": "1,1"})
    args = ap.parse_args()
    # SIGTERM ends the run through the finally blocks (the servers and nodes it started stop), like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # crewlet's own events (buckets made, watches waiting ...) go to stderr: stdout is the report.
    log.configure(node=None, role="bench", level="warning", fmt="json", stream=sys.stderr)
    return emit(run(args), args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
