"""When the garbage collector runs in a process of many long turns.

CPython's collector is generational: a young collection walks what was made
since the last one, and once enough objects have been promoted to the oldest
generation, a *full* collection walks every tracked object — the loop stands
still meanwhile. A seats process with 1,000 turns in flight makes objects
that live as long as a turn (seconds: the provider's answer), so every one
of them is promoted, and full collections came every ~3 s, each pausing the
loop 40-96 ms and finding nothing to free (bench/slow_turns.py, 1,000 turns
in flight: a quarter of the added latency at p99 of every turn on the node).

So a process that calls :func:`take_over`:

* keeps CPython's young collections as they are (they free the young
  cycles, which are most of the garbage, in pauses of a millisecond or so);
* never starts a full collection by itself; :func:`collect_fully` runs one
  every :data:`FULL_EVERY` seconds instead. A pause once in that long falls
  on under 1 % of the turns of a busy node (a 2-s turn meets one with
  probability 2/300), and the cycles that reached the oldest generation wait
  at most that long to be freed.

Objects frozen by the zygote (``gc.freeze``) stay frozen: unfreezing them
would make every child write to the pages it shares with its siblings.
"""

from __future__ import annotations

import asyncio
import gc
import time

from crewlet import log

# Seconds between full collections.
FULL_EVERY = 300.0
# A full collection never comes by CPython's own count (its third threshold
# counts middle collections; this many would take years).
_NEVER = 2**31 - 1


def take_over() -> None:
    """From now on, full collections come from :func:`collect_fully` only."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)


async def collect_fully(every: float = FULL_EVERY) -> None:
    """A full collection every *every* seconds, for the life of the process
    (until cancelled). Each is said (``heap_collected``): how long the loop
    stood still, and what it freed."""
    while True:
        await asyncio.sleep(every)
        started = time.perf_counter()
        freed = gc.collect()
        log.event("heap_collected", ms=round(1000 * (time.perf_counter() - started), 1), freed=freed)
