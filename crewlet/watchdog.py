"""The event-loop watchdog: a wedged process ends itself with exit 75.

A loop that has stopped turning neither works nor dies, and no signal can be
handled by the code that is stuck. So every role child (and crewletd itself)
runs a watchdog *thread* watching a timestamp the loop refreshes every tick.
When the loop has not turned for ``wedge_after`` seconds the thread logs
``event_loop_wedged``, dumps every thread's stack (the dump says where the loop
is stuck) and calls ``os._exit(75)``; the supervisor reads 75 as "wedged event
loop" and restarts the child. A process that was paused as a whole (SIGSTOP)
is not wedged: the thread notices that it overslept too, and waits again.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import sys
import threading
import time

from crewlet import log

EXIT_WEDGED = 75


class Watchdog:
    """Refreshed by the loop with :meth:`start` 's ticker; checked by a thread.

    Invariant: ``_last`` is the monotonic time the loop last ran the ticker.
    """

    def __init__(self, wedge_after: float):
        self.wedge_after = wedge_after
        # A tick is a wakeup of the loop and of the thread, in every process of
        # the node, idle or not: a second at most (a wedge is seen within
        # wedge_after plus a tick; 10 s plus 1 by default).
        self.tick = min(1.0, wedge_after / 10)
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start the ticker on the running loop and the watching thread."""
        loop = asyncio.get_running_loop()

        def ticker() -> None:
            self._last = time.monotonic()
            self._handle = loop.call_later(self.tick, ticker)

        ticker()
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()

    def _watch(self) -> None:
        checked = time.monotonic()
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            if now - checked > self.tick + self.wedge_after / 2:
                # This thread overslept too: the whole process was paused
                # (SIGSTOP, a suspended VM), not its loop wedged. Give the
                # loop a fresh period to show it turns.
                self._last = checked = now
                continue
            checked = now
            stalled = now - self._last
            if stalled >= self.wedge_after:
                log.event("event_loop_wedged", "error", stalled_s=round(stalled, 2),
                          wedge_after_s=self.wedge_after)
                try:
                    sys.stderr.flush()
                    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                    sys.stderr.flush()
                finally:
                    os._exit(EXIT_WEDGED)
