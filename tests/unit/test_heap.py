"""crewlet.heap: full collections on a clock, never by CPython's own count.

Each test runs in a child interpreter: the collector's thresholds are the
process's, and this one's must stay as pytest had them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# Objects that outlive many young collections, as a thousand turns in flight
# make them: promoted to the oldest generation, they would start full
# collections by CPython's own count.
PROMOTE = textwrap.dedent("""
    import asyncio, gc, json, sys
    from crewlet import heap
    full = []
    gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2 and full.append(1))
    before = gc.get_threshold()
    if sys.argv[1] == "take_over":
        heap.take_over()
    kept = []
    for i in range(300_000):
        kept.append([i])
    print(json.dumps({"full": len(full), "before": before, "threshold": gc.get_threshold()}))
""")


def run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_take_over_cpython_starts_full_collections_itself():
    assert json.loads(run(PROMOTE, "default"))["full"] > 0, "the test's load must promote, or it shows nothing"


def test_after_take_over_no_full_collection_comes_by_itself_and_young_ones_stay():
    seen = json.loads(run(PROMOTE, "take_over"))
    assert seen["full"] == 0
    assert seen["threshold"][:2] == seen["before"][:2], "young and middle collections as CPython's own"


def test_collect_fully_collects_everything_on_its_clock_and_says_so():
    code = textwrap.dedent("""
        import asyncio, gc, json, time
        from crewlet import heap, log
        log.configure(node="t", role="seats", fmt="json")
        heap.take_over()
        full = []
        gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2
                            and full.append((time.monotonic(), info["collected"])))

        async def main():
            a = []; a.append(a)  # a cycle: only a collection frees it
            del a
            started = time.monotonic()
            task = asyncio.create_task(heap.collect_fully(every=0.2))
            deadline = started + 20
            while len(full) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            task.cancel()
            return started
        started = asyncio.run(main())
        print(json.dumps({"started": started, "full": full}))
    """)
    out = run(code).splitlines()
    seen = json.loads(out[-1])
    (first, freed), (second, _) = seen["full"][:2]
    assert first - seen["started"] >= 0.2 and second - first >= 0.2, "each after its 0.2 s, none by itself"
    assert freed >= 1, "the cycle was freed by the first"
    said = [json.loads(line) for line in out[:-1] if '"heap_collected"' in line]
    assert len(said) >= 2 and said[0]["freed"] >= 1 and said[0]["ms"] >= 0
