"""What confinement costs a seat's tools (issue 23): confined beside unconfined, same run.

Measured through crewlet's own code path (:class:`crewlet.agent.mcp.SeatServers`
with a :class:`crewlet.sandbox.Sandbox`), the sample company's MCP server
(``crewlet-demo-mcp``) as the tool, rounds interleaved so drift hits both sides:

1. **spawn → ready**: ``SeatServers.start()`` until the server's tools are in
   the seat's registry (spawn, MCP ``initialize``, ``tools/list``), confined
   (bubblewrap, a uid of the seat's own, rlimits) beside the same with
   ``sandbox.mode: off`` — target ≤ 1.5×;
2. **a tool call's round trip**: ``Registry.call`` of ``desk__word_count``
   on a running server, confined beside unconfined — target ≤ 1.1×;
3. **claims at issue 13's pace**: ``--seats`` seats (default 200; 1,000 takes
   ~25 GB of python servers) started ``claims_per_sweep`` (4) at a time, as
   the sweeper does: the time one batch of confined starts takes beside the
   sweep window (5 s) it must fit in, and beside unconfined batches.

    python bench/sandbox.py [--rounds 30] [--calls 500] [--seats 200] [--json]

Needs bubblewrap (Debian's ``bubblewrap``). Everything stays on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import add_smoke, emit, ratio, say, summary  # noqa: E402
from crewlet import log  # noqa: E402
from crewlet.agent.mcp import SeatServers  # noqa: E402
from crewlet.agent.tools import Registry, ToolContext  # noqa: E402
from crewlet.company.model import McpServer  # noqa: E402
from crewlet.sandbox import Sandbox  # noqa: E402

SWEEP = 5.0          # the design's sweep window (DESIGN §4)
CLAIMS_PER_SWEEP = 4  # MCP process trees forked per sweep


def boxes(data_dir: str) -> dict[str, Sandbox]:
    confined = Sandbox(data_dir=data_dir, mode="auto", hidden=(data_dir,))
    confined.probe()
    if confined.state != "confined":
        raise SystemExit(f"bubblewrap does not work here: {confined.reason}")
    off = Sandbox(data_dir=data_dir, mode="off", hidden=(data_dir,))
    off.probe()
    return {"confined": confined, "unconfined": off}


def spec() -> McpServer:
    command = shutil.which("crewlet-demo-mcp", path=os.pathsep.join(
        [os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    if command is None:
        raise SystemExit("crewlet-demo-mcp is not installed beside this python")
    return McpServer(name="desk", command=command)


async def start(box: Sandbox, seat: str) -> tuple[SeatServers, float]:
    registry = Registry()
    servers = SeatServers(seat, [spec()], registry, mark="bench/sandbox", sandbox=box)
    began = time.perf_counter()
    await servers.start()
    took = time.perf_counter() - began
    status = servers.status()["desk"]
    if status["state"] != "up":
        raise SystemExit(f"the server did not come up: {status}")
    return servers, took


async def spawns(boxes_: dict[str, Sandbox], rounds: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {k: [] for k in boxes_}
    for n in range(rounds):
        for kind, box in (boxes_.items() if n % 2 else reversed(boxes_.items())):
            servers, took = await start(box, f"spawn-{kind}")
            times[kind].append(took * 1000)
            await servers.stop()
    return {k: summary(v) for k, v in times.items()}


async def calls(boxes_: dict[str, Sandbox], count: int) -> dict[str, Any]:
    up = {kind: await start(box, f"call-{kind}") for kind, box in boxes_.items()}
    times: dict[str, list[float]] = {k: [] for k in boxes_}
    ctx = ToolContext(seat="bench", trigger="t", token=1, call_key="t.1.0", services=None)
    for n in range(count):
        for kind in (list(up) if n % 2 else list(reversed(up))):
            registry = up[kind][0].registry
            began = time.perf_counter()
            text, error = await registry.call(ctx, "desk__word_count", {"text": "one two three"})
            times[kind].append((time.perf_counter() - began) * 1000)
            if error or text != "3":
                raise SystemExit(f"the call failed: {text}")
    for servers, _ in up.values():
        await servers.stop()
    return {k: summary(v) for k, v in times.items()}


async def claims(boxes_: dict[str, Sandbox], seats: int) -> dict[str, Any]:
    """Seats started CLAIMS_PER_SWEEP at a time, each batch timed; all kept up
    until the side is done (as a node holds them), then stopped."""
    out: dict[str, Any] = {}
    for kind, box in boxes_.items():
        held: list[SeatServers] = []
        batches: list[float] = []
        began = time.perf_counter()
        for first in range(0, seats, CLAIMS_PER_SWEEP):
            batch_began = time.perf_counter()
            started = await asyncio.gather(*(start(box, f"seat-{kind}-{i}")
                                             for i in range(first, min(seats, first + CLAIMS_PER_SWEEP))))
            batches.append((time.perf_counter() - batch_began) * 1000)
            held += [s for s, _ in started]
        total = time.perf_counter() - began
        await asyncio.gather(*(s.stop() for s in held))
        out[kind] = {"batch_ms": summary(batches), "all_up_s": round(total, 2), "seats": seats}
        say(f"{kind}: {seats} seats up in {total:.1f} s")
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    data = tempfile.mkdtemp(prefix="cwsb", dir="/tmp")
    try:
        kinds = boxes(data)
        say("spawn -> ready")
        spawn = await spawns(kinds, args.rounds)
        say("tool calls")
        call = await calls(kinds, args.calls)
        claim = await claims(kinds, args.seats) if args.seats else None
    finally:
        shutil.rmtree(data, ignore_errors=True)
    report: dict[str, Any] = {
        "spawn_ms": spawn, "spawn_x": ratio(spawn["confined"]["median"], spawn["unconfined"]["median"]),
        "call_ms": call, "call_x": ratio(call["confined"]["median"], call["unconfined"]["median"]),
        "claims": claim, "targets": {"spawn_x": 1.5, "call_x": 1.1,
                                     "batch_ms": f"<= {SWEEP * 1000:.0f} (one sweep window)"}}
    if claim:
        report["batch_x"] = ratio(claim["confined"]["batch_ms"]["median"], claim["unconfined"]["batch_ms"]["median"])
    return report


def show(report: dict[str, Any]) -> None:
    s, c = report["spawn_ms"], report["call_ms"]
    print(f"spawn -> ready   confined {s['confined']['median']:.1f} ms  unconfined {s['unconfined']['median']:.1f} ms"
          f"  x{report['spawn_x']:.2f}  (target <= 1.5)")
    print(f"tool call        confined {c['confined']['median']:.3f} ms  unconfined {c['unconfined']['median']:.3f} ms"
          f"  x{report['call_x']:.2f}  (target <= 1.1)")
    claim = report.get("claims")
    if claim:
        for kind in ("confined", "unconfined"):
            k = claim[kind]
            print(f"claims {kind:10s} {k['seats']} seats, batches of {CLAIMS_PER_SWEEP}: median "
                  f"{k['batch_ms']['median']:.0f} ms, p99 {k['batch_ms']['p99']:.0f} ms a batch "
                  f"(sweep window {SWEEP * 1000:.0f} ms); all up in {k['all_up_s']} s")
        print(f"                 confined/unconfined batch x{report['batch_x']:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="spawns per side")
    ap.add_argument("--calls", type=int, default=500, help="tool calls per side")
    ap.add_argument("--seats", type=int, default=200, help="seats started at the sweep's pace (0: skip)")
    ap.add_argument("--json", action="store_true")
    add_smoke(ap, argv, {"rounds": 1, "calls": 5, "seats": 1})
    args = ap.parse_args(argv)
    # SIGTERM ends the run through the finally blocks (the servers and nodes it started stop), like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # The servers' events would fill the report: warnings only, on stderr.
    log.configure(node=None, role="bench", level="warning", fmt="json", stream=sys.stderr)
    return emit(asyncio.run(run(args)), args.json, show)


if __name__ == "__main__":
    sys.exit(main())
