"""supervisor/zygote.py's client side, against a real zygote process."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import psutil

from supervisor.zygote import Zygote

SLOW_IMPORT_S = 2.5


def test_closing_a_zygote_still_importing_keeps_the_loop_turning(short_tmp):
    """A node that fails at once (a missing broker binary) closes a zygote that
    is still importing its preloads: crewletd's loop must go on turning while
    it waits for it, or its own watchdog calls it wedged (exit 75, not 78)."""
    module = "crewlet_test_slow_preload"
    with open(os.path.join(short_tmp, module + ".py"), "w") as f:
        f.write(f"import time\ntime.sleep({SLOW_IMPORT_S})\n")
    sys.path.insert(0, short_tmp)  # the zygote's PYTHONPATH is this process's path
    try:
        zygote = Zygote(title="test zygote", preload=(module,))

        async def main() -> tuple[float, float, int]:
            zygote.start()
            zygote.attach()
            pid = zygote.pid
            gaps: list[float] = []

            async def tick() -> None:
                last = time.monotonic()
                while True:
                    await asyncio.sleep(0.02)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            ticker = asyncio.create_task(tick())
            began = time.monotonic()
            await zygote.aclose(timeout=SLOW_IMPORT_S + 5)
            took = time.monotonic() - began
            ticker.cancel()
            return took, max(gaps, default=took), pid

        took, widest_gap, pid = asyncio.run(main())
    finally:
        sys.path.remove(short_tmp)
    # It waited for the zygote to end on its own (no SIGKILL at once)...
    assert took >= SLOW_IMPORT_S * 0.5, took
    assert zygote.pid is None and not psutil.pid_exists(pid), "the zygote is gone and reaped"
    # ...while the loop went on turning.
    assert widest_gap < 0.5, f"the loop stood still {widest_gap:.2f}s while the zygote ended"


def test_a_zygote_that_will_not_end_is_killed_after_the_timeout(short_tmp):
    module = "crewlet_test_stuck_preload"
    with open(os.path.join(short_tmp, module + ".py"), "w") as f:
        f.write("import time\ntime.sleep(60)\n")
    sys.path.insert(0, short_tmp)
    try:
        zygote = Zygote(title="test zygote", preload=(module,))

        async def main() -> tuple[float, int]:
            zygote.start()
            zygote.attach()
            pid = zygote.pid
            began = time.monotonic()
            await zygote.aclose(timeout=0.5)
            return time.monotonic() - began, pid

        took, pid = asyncio.run(main())
    finally:
        sys.path.remove(short_tmp)
    assert 0.4 <= took < 5, took
    assert not psutil.pid_exists(pid), "SIGKILLed and reaped"


def test_a_fork_goes_as_soon_as_its_module_is_preloaded_the_rest_after_the_preload(short_tmp):
    """The broker is forked while the roles' modules are still being imported:
    a fork whose target's module is in goes at once, one whose module comes
    later waits for it. A title sent meanwhile is the zygote's once it serves."""
    fast, slow = "crewlet_test_early_target", "crewlet_test_late_target"
    with open(os.path.join(short_tmp, fast + ".py"), "w") as f:
        f.write("def run():\n    return 0\n")
    with open(os.path.join(short_tmp, slow + ".py"), "w") as f:
        f.write(f"import time\ntime.sleep({SLOW_IMPORT_S})\n\ndef run():\n    return 0\n")
    sys.path.insert(0, short_tmp)
    try:
        zygote = Zygote(title="test zygote", preload=(fast, slow))

        async def main() -> tuple[float, float, str, list[int]]:
            zygote.start()
            zygote.attach()
            zygote.retitle("test zygote renamed")
            began = time.monotonic()
            out_r, out_w = os.pipe()
            try:
                early = await zygote.fork(f"{fast}:run", {}, title="early", out_fd=out_w)
                early_at = time.monotonic() - began
                late = await zygote.fork(f"{slow}:run", {}, title="late", out_fd=out_w)
                late_at = time.monotonic() - began
                title = psutil.Process(zygote.pid).cmdline()[0]
                codes = [await zygote.exit_of(pid) for pid in (early, late)]
            finally:
                os.close(out_r)
                os.close(out_w)
                await zygote.aclose()
            return early_at, late_at, title, codes

        early_at, late_at, title, codes = asyncio.run(main())
    finally:
        sys.path.remove(short_tmp)
    assert early_at < SLOW_IMPORT_S * 0.5, f"forked {early_at:.2f}s in, not while {slow} was imported"
    assert late_at >= SLOW_IMPORT_S * 0.8, f"forked {late_at:.2f}s in, before its module was imported"
    assert title == "test zygote renamed"
    assert codes == [0, 0], "both ran their target and exited 0"
