"""Every benchmark in bench/ still runs (issue 24 §5).

Each bench has a ``--smoke`` mode (``bench/common.py``'s :func:`add_smoke`):
tiny sizes and short holds, every part of the bench once, its figures printed
beside its baselines as always. Here each runs so, as a subprocess
(``python bench/X.py --smoke --json``, with a timeout), and must exit 0 with
the figures it promises in its JSON: a few keys a bench, never a speed — at
these sizes the figures are not measurements. A bench that a change to
crewlet (or to another bench it imports) broke fails here, not in the hands
of the next person who runs it.

They are all in this one module: one xdist group (tests/conftest.py), so one
worker runs them one after another, beside the others (and the fleet
group). Each takes seconds; the test prints its wall and CPU time.

``bench/sandbox.py`` needs bubblewrap: without it the test skips, unless
``CREWLET_TEST_SANDBOX=required`` (CI sets it), which fails it.
``bench/objects.py`` measures the s3 backend only where boto3 and
``moto[server]`` are installed (the test extras): without them its nats half
is checked and the test skips, saying the s3 half did not run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")

RUN_TIMEOUT = 120.0   # s a smoke run may take (a few seconds on a quiet machine; a loaded CI is slower)
STOP_GRACE = 30.0     # s a timed-out bench gets after SIGTERM to stop what it started


def run_bench(name: str, *extra: str) -> dict[str, Any]:
    """``python bench/<name>.py --smoke --json *extra``: its report, after checking it exited 0.

    On timeout the bench gets SIGTERM (each ends through its finally blocks, stopping
    the nodes and servers it started), then SIGKILL."""
    argv = [sys.executable, os.path.join(BENCH, f"{name}.py"), "--smoke", "--json", *extra]
    env = dict(os.environ)
    env.pop("CREWLET_CONFIG", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"bench/{name}.py --smoke did not finish within {RUN_TIMEOUT:g} s; "
                    f"its stderr ends:\n{err[-3000:]}")
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(f"bench/{name}.py --smoke {' '.join(extra)}: wall {wall:.1f} s, CPU {cpu:.1f} s "
          f"(the bench and the children it waited for)")
    assert proc.returncode == 0, \
        f"bench/{name}.py --smoke exited with {proc.returncode}; its stderr ends:\n{err[-3000:]}"
    try:
        return json.loads(out)
    except ValueError:
        pytest.fail(f"bench/{name}.py --smoke --json did not print one JSON document:\n{out[:2000]}")


def figure(rep: Any, *path: str | int) -> Any:
    """``rep[path[0]][path[1]]...``, which must be there and not None."""
    at = rep
    for i, key in enumerate(path):
        try:
            at = at[key]
        except (KeyError, IndexError, TypeError):
            pytest.fail(f"no {'.'.join(map(str, path[:i + 1]))} in the report: {json.dumps(rep)[:2000]}")
    assert at is not None, f"{'.'.join(map(str, path))} is None"
    return at


def median(rep: Any, *path: str | int) -> float:
    """A summary's median (bench/common.py's summary), with at least one sample."""
    s = figure(rep, *path)
    assert s["n"] >= 1 and s["median"] is not None, f"{'.'.join(map(str, path))}: {s}"
    return s["median"]


# ------------------------------------------------------------------ each bench's promises

def check_restart(rep: dict[str, Any]) -> None:
    # --smoke kills 4: every role child once (data_applier, ingress, seats, workers)
    for child in ("data_applier", "ingress", "seats", "workers"):
        median(rep, "kill_to_ready_ms_by_child", child)
    median(rep, "baseline_fork_ms")
    median(rep, "baseline_spawn_ms")
    figure(rep, "ratio_vs_fork", "median")
    figure(rep, "node_pss_bytes")
    figure(rep, "ratio_node_pss_vs_preloaded_python")


def check_leases(rep: dict[str, Any]) -> None:
    for op in ("claim", "renew", "release"):
        figure(rep, "throughput", op, "crewlet", "ops_per_s")
        figure(rep, "throughput", op, "bare", "ops_per_s")
    median(rep, "handover", "crewlet", "total_ms")
    median(rep, "handover", "bare", "total_ms")


def check_mailboxes(rep: dict[str, Any]) -> None:
    cliff = figure(rep, "cliff")
    assert {c["retention"] for c in cliff} >= {"interest", "limits"}, cliff
    for case in cliff:
        assert case["crewlet_msgs_s"] and case["bare_msgs_s"], case
    figure(rep, "create", "single", "crewlet_s")
    figure(rep, "create", "single", "bare_s")
    figure(rep, "create", "cluster", "joining_s")


def check_turns(rep: dict[str, Any]) -> None:
    row = figure(rep, "rows", 0)
    assert row["error"] is None, row["error"]
    for key in ("start_served_s", "bare_start_served_s", "kill_served_s", "crewlet_turns_per_s",
                "bare_msgs_per_s", "idle_broker_cpu", "pss_bytes", "pss_vs_ref"):
        figure(row, key)
    assert figure(rep, "ref_node", "stage") == "done", rep["ref_node"]


def check_turn_floor(rep: dict[str, Any]) -> None:
    assert {r["side"] for r in figure(rep, "rounds")} == {"bare", "skeleton"}
    assert all(r["per_s"] for r in rep["rounds"]), rep["rounds"]
    steps = figure(rep, "steps")
    assert len(steps) >= 5 and all(s["per_s"] for s in steps), steps


def check_estate(rep: dict[str, Any]) -> None:
    assert not rep["errors"], rep["errors"]
    for key in ("ops_per_s", "raw_puts_per_s", "e2e_ops_per_s", "raw_publish_per_s"):
        figure(rep, "apply", key)
    median(rep, "write_ms", "router_nats")
    median(rep, "write_ms", "raw_publish")
    median(rep, "read_us", "local_ask")
    median(rep, "search", "search_ms", "search_index")
    median(rep, "search", "search_ms", "raw_fts5")


def check_soak(rep: dict[str, Any]) -> None:
    assert figure(rep, "samples") >= 1
    streams = figure(rep, "streams")
    for name in ("AGENTS", "KV_leases"):
        assert "flat" in figure(streams, name) and figure(streams, name, "bare") is not None
    assert "flat" in rep


def check_snapshot(rep: dict[str, Any]) -> None:
    for step in ("make", "put", "fetch", "install", "total"):
        figure(rep, "median", "crewlet", step)
    figure(rep, "median", "raw", "total")
    figure(rep, "ratio")


def check_objects(rep: dict[str, Any]) -> None:
    for size in ("1 MiB", "9 MiB"):   # 9: past one 8 MiB part
        for op in ("put", "get"):
            figure(rep, "nats", size, op, "crewlet_ms")
            figure(rep, "nats", size, op, "bare_ms")
    if not all(importlib.util.find_spec(m) for m in ("boto3", "moto", "flask")):
        pytest.skip(f"bench/objects.py's nats half ran; its s3 half did not: {rep.get('s3')} "
                    f"(pip install boto3 'moto[server]')")
    for size in ("1 MiB", "9 MiB"):
        for op in ("put", "put_managed", "get"):
            figure(rep, "s3", size, op, "crewlet_ms")
            figure(rep, "s3", size, op, "bare_ms")


def check_api(rep: dict[str, Any]) -> None:
    assert rep["stage"] == "done", rep.get("error") or rep["stage"]
    for table in ("api", "hooks"):
        rows = figure(rep, table)
        assert rows, table
        for row in rows:
            median(row, "crewlet", "latency_ms")
            median(row, "bare", "latency_ms")
    figure(rep, "hook_calls")
    median(rep, "feed", "crewlet", "delay_ms")
    median(rep, "feed", "bare", "delay_ms")


def check_sender(rep: dict[str, Any]) -> None:
    rate = figure(rep, "rates", "10")
    figure(rate, "crewlet", "achieved")
    figure(rate, "bare", "achieved")
    figure(rate, "crewlet_vs_bare")
    figure(rep, "ceiling", "achieved")


def check_conversations(rep: dict[str, Any]) -> None:
    assert rep["stage"] == "done", rep.get("error") or rep["stage"]
    median(rep, "first_events", "crewlet", "started")
    median(rep, "first_events", "sse", "started")
    for key in ("runs", "turns", "mails"):
        figure(rep, "throughput", key)
    median(rep, "refusals", "crewlet")
    median(rep, "refusals", "bare")


def check_slow_turns(rep: dict[str, Any]) -> None:
    row = figure(rep, "rows", 0)
    assert row["error"] is None, row["error"]
    for side in ("crewlet", "bare", "bare aiohttp", "bare stream"):
        figure(row, side, "per_s")
    figure(row, "ratio")
    figure(row, "idle", "cpu_ms_per_s", "seats")
    figure(row, "crewlet", "cpu_ms_per_turn_over_idle", "others")


def check_broker_stop(rep: dict[str, Any]) -> None:
    size = figure(rep, "sizes", 0)
    assert size["used"] is True
    figure(size, "made_seconds")
    figure(size, "stop_seconds")


def check_sandbox(rep: dict[str, Any]) -> None:
    for part in ("spawn_ms", "call_ms"):
        median(rep, part, "confined")
        median(rep, part, "unconfined")
    median(rep, "claims", "confined", "batch_ms")
    median(rep, "claims", "unconfined", "batch_ms")
    figure(rep, "batch_x")


def check_redaction(rep: dict[str, Any]) -> None:
    cases = figure(rep, "cases")
    for name in ("json, no shape word", "json, a shape word", "words, 20 values known",
                 "stream, 4-char pieces"):
        figure(cases, name, "us_per_kb", "crewlet")
        assert figure(cases, name, "x"), name   # beside at least one baseline
    figure(cases, "json, no shape word", "x", "bare regex")
    figure(cases, "words, 20 values known", "crewlet_ms")


def check_learning_cluster(rep: dict[str, Any]) -> None:
    sizes = figure(rep, "sizes")
    assert sizes, rep
    for row in sizes.values():
        for key in ("cluster_s", "floor_s", "x", "clusters", "clustered", "topics", "topics_whole"):
            figure(row, key)
    for key in ("episodes", "all_pairs_s", "cluster_s", "differ"):
        figure(rep, "all_pairs", key)


def check_skills(rep: dict[str, Any]) -> None:
    turns = figure(rep, "turns")
    assert turns.get("error") is None, turns["error"]
    for side in ("none", "with"):
        figure(turns, side, "node_cpu_ms_per_turn")
        figure(turns, side, "request_bytes")
    figure(turns, "ratio_node_cpu")
    fleet = figure(rep, "fleet")
    assert fleet.get("error") is None, fleet["error"]
    for node in ("f0", "f1", "f2"):   # two data nodes and a stateless one
        median(fleet, "reached_ms", node)
    median(fleet, "max_ms")
    median(fleet, "bare_ms")
    learning = figure(rep, "learning")
    assert learning.get("error") is None, learning["error"]
    for side in ("crewlet", "plain"):
        figure(learning, side, "median_s")
        figure(learning, side, "peak_bytes")
    figure(learning, "ratio_time")


def needs_bwrap() -> None:
    """As tests/integration/test_sandbox.py: skip without a working bubblewrap, unless
    CREWLET_TEST_SANDBOX=required."""
    from crewlet import sandbox

    box = sandbox.Sandbox(data_dir="/nonexistent", hidden=("/nonexistent",))
    box.probe()
    if box.state == "confined":
        return
    why = f"bubblewrap (bwrap) does not work here ({box.reason}): install Debian's bubblewrap package"
    if os.environ.get("CREWLET_TEST_SANDBOX") == "required":
        pytest.fail(why)
    pytest.skip(why)


# (bench, extra arguments, check); the order is the README's.
BENCHES: list[tuple[str, tuple[str, ...], Callable[[dict[str, Any]], None]]] = [
    ("restart", (), check_restart),
    ("leases", (), check_leases),
    ("leases", ("--cluster",), check_leases),
    ("mailboxes", (), check_mailboxes),
    ("turns", (), check_turns),
    ("turn_floor", (), check_turn_floor),
    ("sandbox", (), check_sandbox),
    ("estate", (), check_estate),
    ("soak", (), check_soak),
    ("snapshot", (), check_snapshot),
    ("objects", (), check_objects),
    ("api", (), check_api),
    ("sender", (), check_sender),
    ("conversations", (), check_conversations),
    ("slow_turns", (), check_slow_turns),
    ("broker_stop", (), check_broker_stop),
    ("learning_cluster", (), check_learning_cluster),
    ("redaction", (), check_redaction),
    ("skills", (), check_skills),
]


def test_every_bench_is_smoke_tested():
    """A bench added to bench/ without a smoke run here fails."""
    here = {name for name, _, _ in BENCHES}
    there = {f[:-3] for f in os.listdir(BENCH) if f.endswith(".py") and f not in ("common.py", "__init__.py")}
    assert here == there


@pytest.mark.timeout(RUN_TIMEOUT + STOP_GRACE + 30)
@pytest.mark.parametrize("name,extra,check", BENCHES,
                         ids=["-".join([n, *(a.lstrip("-") for a in e)]) for n, e, _ in BENCHES])
def test_bench_smoke(name: str, extra: tuple[str, ...], check: Callable[[dict[str, Any]], None]):
    if name == "sandbox":
        needs_bwrap()
    check(run_bench(name, *extra))
