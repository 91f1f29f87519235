#!/usr/bin/env python3
"""Benchmark: how fast a killed role child is replaced, and what an idle node costs.

Starts a real node (``crewletd start -c <temp config>``, everything on
127.0.0.1, data_dir in a short temp dir) and measures, in one run:

1. kill -> replacement ready: SIGKILL a role child (rotating over
   data_applier, ingress, seats, workers) and time until crewletd publishes
   ``child_started`` for that child with a new pid on its ``events`` endpoint
   (a local ZeroMQ SUB; t0 is taken right before ``os.kill``).
2. the same-run baselines it is compared with:
   * fork: a parent that imported what the zygote imports (gc-frozen, like the
     zygote) forks a child that connects a NATS client to the node's broker
     and writes one byte to a pipe; fork -> byte;
   * spawn: ``python -c "<same imports>; <connect NATS>; <write byte>"``;
     Popen -> byte.
   The kills and the baselines are interleaved in rounds, so the machine's
   noise falls on all of them alike.
3. idle memory: PSS of crewletd and every descendant (zygote, nats-server,
   role children) after the node sat idle, beside the PSS of a bare python
   and of a python that imported the preload list.

Every figure is printed beside its same-run baseline as a ratio; the targets
(median kill -> ready <= 50 ms, idle node PSS <= 150 MB) are marked PASS/MISS
for information only. Exit status: 0 unless the benchmark itself broke.

    /tmp/venv/bin/python bench/restart.py [--kills 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import msgpack  # noqa: E402
import psutil  # noqa: E402
import zmq  # noqa: E402

from bench.common import add_smoke, BenchError, Crewletd, child_env, emit, ratio, say, split, summary  # noqa: E402
from crewlet import ipc  # noqa: E402
from supervisor.zygote import DEFAULT_PRELOAD  # noqa: E402

ROTATION = ("data_applier", "ingress", "seats", "workers")
EXPECTED = ("broker",) + ROTATION
EXTRA_IMPORTS = ("zmq", "nats", "lmdb", "uvicorn", "starlette")
IMPORTS = tuple(DEFAULT_PRELOAD) + EXTRA_IMPORTS
TARGET_KILL_MEDIAN_MS = 50.0
TARGET_NODE_PSS_MB = 150.0
MB = 1024 * 1024

# A preloaded parent, as close to the zygote as a baseline gets: imports, then
# gc.collect() + gc.freeze(), no threads, no loop, no ZeroMQ context. One fork
# per "fork" line on stdin; one JSON line per fork on stdout.
FORK_PARENT = r"""
import asyncio, gc, importlib, json, os, select, signal, sys, time
mods, url = sys.argv[1].split(","), sys.argv[2]
for m in mods:
    importlib.import_module(m)
import nats
gc.collect(); gc.freeze()
print(json.dumps({"ready": True}), flush=True)

async def connect(w):
    await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    os.write(w, b"r")

while True:
    line = sys.stdin.readline()
    if not line:
        break
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            asyncio.run(connect(w))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 10.0)
    t1 = time.perf_counter()
    ok = bool(ready) and os.read(r, 1) == b"r"
    if not ok:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.close(r)
    os.waitpid(pid, 0)
    print(json.dumps({"ok": ok, "ms": (t1 - t0) * 1000.0}), flush=True)
"""

# The spawn baseline's child: the same imports, then the same NATS connect.
SPAWN_CHILD = r"""
import asyncio, importlib, os, sys
for m in sys.argv[1].split(","):
    importlib.import_module(m)
import nats
async def connect(w):
    await nats.connect(sys.argv[2], connect_timeout=2, allow_reconnect=False)
    os.write(w, b"r")
asyncio.run(connect(int(sys.argv[3])))
os._exit(0)
"""

# Memory floors: an idle bare interpreter, and one holding the preload list.
BARE_PY = "import os, time; os.write(1, b'r'); time.sleep(30)"
PRELOADED_PY = ("import gc, importlib, os, sys, time\n"
                "[importlib.import_module(m) for m in sys.argv[1].split(',')]\n"
                "gc.collect(); gc.freeze(); os.write(1, b'r'); time.sleep(30)")


def wait_proc(proc: subprocess.Popen, timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def kill_proc(proc: subprocess.Popen | None) -> None:
    """SIGKILL one process we started (by its pid) and reap it."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    wait_proc(proc, 5)


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------

class Node(Crewletd):
    """One crewletd we started, and a SUB on its events endpoint."""

    STOP_GRACE = 20.0   # s for crewletd to stop before SIGKILL
    TAIL = 25           # lines of its log that a failure quotes

    def __init__(self, data_dir: str):
        # data_dir holds its config and its log too.
        super().__init__(data_dir, {
            "node": {"id": "bench", "roles": ["data", "ingress", "seats", "workers"]},
            "supervisor": {"intensity": 1000, "period": 1, "backoff_min": 0,
                           "stable_after": 0.1, "shutdown_timeout": 5,
                           "broker_shutdown_timeout": 10},
        }, data_dir=data_dir)
        self.sub: zmq.Socket | None = None
        self.startup_events = 0

    def start(self) -> None:
        super().start()
        # Subscribe at once: ipc:// connects are retried until crewletd binds,
        # so the SUB is in place long before the first kill.
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 100000)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(ipc.endpoint(self.run_dir, "events"))

    def exit_message(self) -> str:
        assert self.proc is not None
        return f"crewletd exited with {self.proc.returncode}; log: {self.log_path}\n" + self.log_tail()

    def next_event(self, deadline: float) -> tuple[float, str, dict] | None:
        """The next event, stamped when received; None once *deadline* passed."""
        assert self.sub is not None
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            if self.sub.poll(max(1, int(left * 1000))):
                frames = self.sub.recv_multipart()
                t = time.perf_counter()
                try:
                    fields = msgpack.unpackb(frames[1], raw=False) if len(frames) > 1 else {}
                except Exception:
                    fields = {}
                return t, frames[0].decode(errors="replace"), fields if isinstance(fields, dict) else {}

    def idle_until(self, deadline: float) -> None:
        """Wait until *deadline*, consuming events (and noticing a dead crewletd)."""
        while time.perf_counter() < deadline:
            self.next_event(min(deadline, time.perf_counter() + 0.25))
            self.check_alive()

    def drain(self) -> None:
        assert self.sub is not None
        while self.sub.poll(0):
            self.sub.recv_multipart()

    def wait_running(self, timeout: float) -> dict[str, dict]:
        """Block until every expected child is running; returns them by name."""
        deadline = time.perf_counter() + timeout
        last = None
        while True:
            self.check_alive()
            st = self.status()
            if st is not None:
                children = {c["name"]: c for c in st.get("children", [])}
                last = {n: c.get("state") for n, c in children.items()}
                if all(children.get(n, {}).get("state") == "running" and children[n].get("pid")
                       for n in EXPECTED):
                    return children
            if time.perf_counter() >= deadline:
                raise BenchError(f"node not all running within {timeout:g}s (last: {last})\n"
                                 + self.log_tail())
            # Wait for an event (a child started) or 50 ms, whichever is first.
            ev = self.next_event(min(deadline, time.perf_counter() + 0.05))
            if ev is not None:
                self.startup_events += 1

    def descendants(self) -> list[psutil.Process]:
        assert self.proc is not None
        me = psutil.Process(self.proc.pid)
        return [me] + me.children(recursive=True)

    def stop(self) -> float | None:
        if self.sub is not None:
            self.sub.close(0)
            self.sub = None
        return super().stop()


# --------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------

def kill_one(node: Node, name: str, gap: float, last_ready: float) -> dict[str, Any]:
    """SIGKILL child *name* once the node is all running and *gap* s passed
    since the last replacement was ready; time kill -> new child_started."""
    node.wait_running(30.0)
    node.idle_until(last_ready + gap)
    children = node.wait_running(30.0)  # still all running after the gap, with current pids
    old_pid = children[name]["pid"]
    node.drain()
    t0 = time.perf_counter()
    os.kill(old_pid, signal.SIGKILL)
    t_exit = None
    deadline = t0 + 30.0
    while True:
        ev = node.next_event(deadline)
        if ev is None:
            node.check_alive()
            raise BenchError(f"no child_started for {name} within 30 s of killing pid {old_pid}\n"
                             + node.log_tail())
        t, event, fields = ev
        if event == "supervisor_gave_up":
            raise BenchError(f"supervisor gave up: {fields}")
        if fields.get("child") != name:
            continue
        if event == "child_exited" and t_exit is None:
            t_exit = t
        elif event == "child_start_failed":
            raise BenchError(f"{name} failed to start again: {fields}")
        elif event == "child_started" and fields.get("child_pid") not in (None, old_pid):
            return {"child": name, "ms": (t - t0) * 1000.0,
                    "exit_noticed_ms": None if t_exit is None else (t_exit - t0) * 1000.0,
                    "old_pid": old_pid, "new_pid": fields["child_pid"],
                    "incarnation": fields.get("incarnation"), "t_ready": t}


class ForkParent:
    """The preloaded parent of the fork baseline (a process of its own)."""

    def __init__(self, nats_url: str):
        self.proc = subprocess.Popen([sys.executable, "-c", FORK_PARENT, ",".join(IMPORTS), nats_url],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env(),
                                     cwd=ROOT, text=True, bufsize=1)

    def _line(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise BenchError(f"fork baseline parent gave no answer within {timeout:g}s "
                             f"(exit {self.proc.poll()})")
        return json.loads(line)

    def wait_ready(self) -> None:
        self._line(60.0)

    def fork(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("fork\n")
        self.proc.stdin.flush()
        answer = self._line(15.0)
        if not answer.get("ok"):
            raise BenchError("fork baseline child did not get ready within 10 s")
        return answer["ms"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            if not wait_proc(self.proc, 5):
                kill_proc(self.proc)


def spawn_one(nats_url: str, procs: list[subprocess.Popen]) -> float:
    r, w = os.pipe()
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", SPAWN_CHILD, ",".join(IMPORTS), nats_url, str(w)],
                                pass_fds=(w,), stdin=subprocess.DEVNULL, env=child_env(), cwd=ROOT)
        procs.append(proc)
        os.close(w)
        w = -1
        ready, _, _ = select.select([r], [], [], 30.0)
        t1 = time.perf_counter()
        if not ready or os.read(r, 1) != b"r":
            kill_proc(proc)
            raise BenchError(f"spawn baseline child not ready within 30 s (exit {proc.poll()})")
        if not wait_proc(proc, 10):
            kill_proc(proc)
        return (t1 - t0) * 1000.0
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def process_name(proc: psutil.Process) -> str:
    try:
        argv = proc.cmdline()
    except psutil.Error:
        argv = []
    if not argv:
        return proc.name()
    argv = [os.path.basename(argv[0])] + argv[1:]
    name = " ".join(" ".join(argv).split())  # setproctitle pads the title
    return name if len(name) <= 60 else name[:57] + "..."


def memory_of(proc: psutil.Process) -> dict[str, Any]:
    info = proc.memory_full_info()
    return {"pid": proc.pid, "name": process_name(proc), "pss": info.pss, "rss": info.rss, "uss": info.uss}


def floor_process(code: str, args: list[str], procs: list[subprocess.Popen]) -> dict[str, Any]:
    """Start a python that writes one byte once it is set up, then sleeps; measure it."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, env=child_env(), cwd=ROOT)
    procs.append(proc)
    ready, _, _ = select.select([proc.stdout], [], [], 30.0)
    if not ready or proc.stdout.read(1) != b"r":
        raise BenchError(f"memory floor process not ready within 30 s (exit {proc.poll()})")
    try:
        return memory_of(psutil.Process(proc.pid))
    finally:
        kill_proc(proc)
        proc.stdout.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    data_dir = tempfile.mkdtemp(prefix="cwb", dir="/tmp")
    node = Node(data_dir)
    fork_parent: ForkParent | None = None
    extra: list[subprocess.Popen] = []
    broke = False  # keep data_dir (crewletd.log) when the benchmark itself failed
    try:
        say(f"starting crewletd (data_dir {data_dir}, broker :{node.stream_port}, "
            f"ingress :{node.ingress_port})")
        t_start = time.perf_counter()
        node.start()
        children = node.wait_running(90.0)
        startup_s = time.perf_counter() - t_start
        say(f"node running in {startup_s:.2f}s: "
            + ", ".join(f"{n}={children[n]['pid']}" for n in EXPECTED))
        fork_parent = ForkParent(node.url)
        fork_parent.wait_ready()

        rounds = max(1, min(args.rounds, args.kills))
        kills, forks, spawns = [], [], []
        last_ready = time.perf_counter()
        i = 0
        for rnd, (nk, nf, ns) in enumerate(zip(split(args.kills, rounds), split(args.forks, rounds),
                                              split(args.spawns, rounds)), 1):
            for _ in range(nk):
                sample = kill_one(node, ROTATION[i % len(ROTATION)], args.gap, last_ready)
                last_ready = sample.pop("t_ready")
                kills.append(sample)
                i += 1
            for _ in range(nf):
                forks.append(fork_parent.fork())
            for _ in range(ns):
                spawns.append(spawn_one(node.url, extra))
            say(f"round {rnd}/{rounds}: {len(kills)} kills, {len(forks)} forks, {len(spawns)} spawns")
        fork_parent.close()
        fork_parent = None

        # Idle memory: everything settled and no baseline process alive.
        node.wait_running(30.0)
        say(f"idling {args.idle:g}s before measuring memory")
        node.idle_until(time.perf_counter() + args.idle)
        node.wait_running(30.0)
        procs = []
        for p in node.descendants():
            try:
                procs.append(memory_of(p))
            except psutil.Error:
                pass
        bare = floor_process(BARE_PY, [], extra)
        preloaded = floor_process(PRELOADED_PY, [",".join(IMPORTS)], extra)
        return {"kills": kills, "forks": forks, "spawns": spawns, "node_procs": procs,
                "bare_python": bare, "preloaded_python": preloaded, "startup_s": startup_s,
                "config": {"kills": args.kills, "forks": args.forks, "spawns": args.spawns,
                           "rounds": rounds, "gap_s": args.gap, "idle_s": args.idle,
                           "preload": list(IMPORTS), "python": sys.version.split()[0],
                           "cpus": os.cpu_count()}}
    except BenchError:
        broke = True
        raise
    finally:
        if fork_parent is not None:
            fork_parent.close()
        for p in extra:
            kill_proc(p)
        say("stopping the node")
        node.stop()
        if broke or args.keep:
            say(f"kept {data_dir} (crewletd.log is there)")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def build_report(raw: dict[str, Any]) -> dict[str, Any]:
    kill = summary([k["ms"] for k in raw["kills"]])
    noticed = summary([k["exit_noticed_ms"] for k in raw["kills"] if k["exit_noticed_ms"] is not None])
    fork, spawn = summary(raw["forks"]), summary(raw["spawns"])
    per_child = {n: summary([k["ms"] for k in raw["kills"] if k["child"] == n]) for n in ROTATION}
    node_pss = sum(p["pss"] for p in raw["node_procs"])
    node_rss = sum(p["rss"] for p in raw["node_procs"])
    bare, pre = raw["bare_python"], raw["preloaded_python"]
    return {
        "kill_to_ready_ms": kill,
        "kill_to_exit_noticed_ms": noticed,
        "kill_to_ready_ms_by_child": per_child,
        "baseline_fork_ms": fork,
        "baseline_spawn_ms": spawn,
        "ratio_vs_fork": {"median": ratio(kill["median"], fork["median"]),
                          "p95": ratio(kill["p95"], fork["p95"])},
        "ratio_vs_spawn": {"median": ratio(kill["median"], spawn["median"]),
                           "p95": ratio(kill["p95"], spawn["p95"])},
        "node_pss_bytes": node_pss,
        "node_rss_bytes": node_rss,
        "node_processes": raw["node_procs"],
        "bare_python": bare,
        "preloaded_python": pre,
        "ratio_node_pss_vs_bare_python": ratio(node_pss, bare["pss"]),
        "ratio_node_pss_vs_preloaded_python": ratio(node_pss, pre["pss"]),
        "targets": {
            "kill_to_ready_median_ms": {"target": TARGET_KILL_MEDIAN_MS, "value": kill["median"],
                                        "pass": kill["median"] is not None
                                        and kill["median"] <= TARGET_KILL_MEDIAN_MS},
            "node_idle_pss_mb": {"target": TARGET_NODE_PSS_MB, "value": node_pss / MB,
                                 "pass": node_pss / MB <= TARGET_NODE_PSS_MB},
        },
        "node_startup_s": raw["startup_s"],
        "samples": {"kills": raw["kills"], "forks": raw["forks"], "spawns": raw["spawns"]},
        "config": raw["config"],
    }


def _x(r: float | None) -> str:
    return "   n/a" if r is None else f"{r:6.2f}x"


def print_text(rep: dict[str, Any]) -> None:
    k, f, s = rep["kill_to_ready_ms"], rep["baseline_fork_ms"], rep["baseline_spawn_ms"]
    cfg = rep["config"]
    print(f"crewlet restart benchmark  (python {cfg['python']}, {cfg['cpus']} cpus, "
          f"{cfg['rounds']} interleaved rounds, node started in {rep['node_startup_s']:.2f}s)")
    print()
    print("1. kill -> replacement ready (SIGKILL to child_started of a new pid), ms")
    print(f"   {'':38} {'n':>4} {'median':>8} {'p95':>8}   crewlet/baseline: median    p95")

    def row(label: str, m: dict, base: dict | None) -> None:
        tail = "" if base is None else \
            f"   {'':17}{_x(ratio(m['median'], base['median']))} {_x(ratio(m['p95'], base['p95']))}"
        print(f"   {label:38} {m['n']:4d} {m['median']:8.1f} {m['p95']:8.1f}{tail}")

    row("crewlet kill -> ready", k, None)

    def brow(label: str, b: dict) -> None:
        print(f"   {label:38} {b['n']:4d} {b['median']:8.1f} {b['p95']:8.1f}"
              f"   {'':17}{_x(ratio(k['median'], b['median']))} {_x(ratio(k['p95'], b['p95']))}")

    brow("baseline: fork from preloaded parent", f)
    brow("baseline: spawn python", s)
    print("   crewlet by child (ratio vs the fork baseline):")
    for name, m in rep["kill_to_ready_ms_by_child"].items():
        if m["n"]:
            row(f"  {name}", m, f)
    n = rep["kill_to_exit_noticed_ms"]
    if n["n"]:
        print(f"   of which kill -> child_exited published: median {n['median']:.1f} ms "
              f"({ratio(n['median'], k['median']):.0%} of kill -> ready), p95 {n['p95']:.1f} ms")
    print()
    print("2. idle node memory (crewletd and all its descendants)")
    pre, bare = rep["preloaded_python"], rep["bare_python"]
    print(f"   {'process':60} {'pid':>7} {'PSS MB':>8} {'RSS MB':>8} {'USS MB':>8} {'PSS/preload':>11}")
    for p in rep["node_processes"]:
        print(f"   {p['name']:60} {p['pid']:7d} {p['pss'] / MB:8.1f} {p['rss'] / MB:8.1f} "
              f"{p['uss'] / MB:8.1f} {_x(ratio(p['pss'], pre['pss'])):>11}")
    print(f"   {'TOTAL (' + str(len(rep['node_processes'])) + ' processes)':60} {'':7} "
          f"{rep['node_pss_bytes'] / MB:8.1f} {rep['node_rss_bytes'] / MB:8.1f}")
    print("   same-run floors:")
    for label, p in (("bare python (sleeping)", bare), ("python + preload list (sleeping)", pre)):
        print(f"   {label:60} {p['pid']:7d} {p['pss'] / MB:8.1f} {p['rss'] / MB:8.1f} {p['uss'] / MB:8.1f}")
    print(f"   node PSS / bare python PSS: {_x(rep['ratio_node_pss_vs_bare_python']).strip()}   "
          f"node PSS / preloaded python PSS: {_x(rep['ratio_node_pss_vs_preloaded_python']).strip()}")
    print("   (PSS splits a shared page among all processes mapping it, this benchmark's own included;"
          " the floors are measured after the node, while it still runs)")
    print()
    print("3. targets (informational)")
    t = rep["targets"]
    km, pm = t["kill_to_ready_median_ms"], t["node_idle_pss_mb"]
    print(f"   median kill -> ready  {km['value']:8.1f} ms  target <= {km['target']:g} ms   "
          f"{'PASS' if km['pass'] else 'MISS'}  (fork baseline {f['median']:.1f} ms, "
          f"{_x(ratio(km['value'], f['median'])).strip()})")
    print(f"   idle node PSS         {pm['value']:8.1f} MB  target <= {pm['target']:g} MB  "
          f"{'PASS' if pm['pass'] else 'MISS'}  (preloaded python {pre['pss'] / MB:.1f} MB, "
          f"{_x(rep['ratio_node_pss_vs_preloaded_python']).strip()})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=50, help="role children to kill (default 50)")
    ap.add_argument("--forks", type=int, default=30, help="fork baseline samples (default 30)")
    ap.add_argument("--spawns", type=int, default=10, help="spawn baseline samples (default 10)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleave kills and baselines in this many rounds (default 5)")
    ap.add_argument("--gap", type=float, default=0.25,
                    help="seconds between a replacement being ready and the next kill (default 0.25)")
    ap.add_argument("--idle", type=float, default=3.0,
                    help="seconds the node idles before memory is measured (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--keep", action="store_true", help="keep the temp data_dir")
    add_smoke(ap, argv, {"kills": 4, "forks": 1, "spawns": 1, "rounds": 1, "gap": 0.05, "idle": 0.5})
    args = ap.parse_args(argv)
    if args.kills < 1 or args.forks < 1 or args.spawns < 1:
        ap.error("--kills, --forks and --spawns must be >= 1")
    # SIGTERM ends the run through the finally blocks, like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        rep = build_report(run(args))
    except BenchError as exc:
        print(f"bench/restart.py: {exc}", file=sys.stderr)
        return 1
    finally:
        zmq.Context.instance().term()
    return emit(rep, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
