"""The notification valve: a fleet-exact rate limit in the ``rate`` bucket.

A valve is one key, ``<valve>`` (``email``), whose value is a **GCRA** state:
the *theoretical arrival time* (TAT, wall-clock seconds) of the next send at
the configured rate, and the fencing token of the duty holder that last wrote
it. With ``T = 1 / rate`` and the tolerance ``τ = (burst − 1)·T``, a send at
``now`` is admitted when ``max(TAT, now) − τ ≤ now``, and moves the TAT to
``max(TAT, now) + T`` (:func:`gcra`). That admits, in **any** window of
length L, at most ``burst + ⌊L·rate⌋`` sends.

**Admission is decided before the send, by a compare-and-set** of that new
state on the revision the old one was read at (:meth:`Valve.admit`). Two
writers — a new sender and the old one it replaced, still running — are
serialised by the CAS: each admission moves the one TAT the other reads, so
together they stay within the rate. An admission whose CAS went unanswered
counts as *not* admitted (it may have landed: a slot is lost, never one too
many). A sender killed after its admission and before its send loses that
slot the same way. So the rate holds across a hand-over whichever way the
old sender ends.

**Fencing.** The value carries the writer's fencing token (the ``duty.sender``
lease's): a valve holding a larger token than ours refuses us
(:class:`Deposed`), and a new holder writes its token in before its first
send (:meth:`Valve.take_over`), so a deposed holder's next CAS loses (the
revision moved) and its re-read refuses it.

The clock is each sender's wall clock: nodes of a fleet must keep time (NTP).
A new holder whose clock runs d seconds ahead of its predecessor's may send
up to ``d·rate`` early once, at the hand-over; one behind waits d longer.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from nats.js.errors import KeyWrongLastSequenceError

from crewlet.coord import buckets

# Tries of one admission's CAS when the revision keeps moving or the answer
# is lost (no quorum reads as a conflict, DESIGN §4): re-read before each.
CAS_ATTEMPTS = 5
CAS_PAUSE = 0.05


class Deposed(Exception):
    """The valve names a newer holder than us: stop sending."""


class ValveError(Exception):
    """The valve could not be read or written (no quorum, timeout)."""


@dataclass(frozen=True)
class Decision:
    admit: bool
    tat: float     # the TAT to write if admitted
    wait: float    # seconds until admission if not


def gcra(tat: float, now: float, rate: float, burst: int) -> Decision:
    """The GCRA's verdict on a send at *now* against the state *tat*."""
    interval = 1.0 / rate
    tolerance = (burst - 1) * interval
    start = max(tat, now)
    if start - tolerance <= now:
        return Decision(True, start + interval, 0.0)
    return Decision(False, tat, start - tolerance - now)


def most_in_window(length: float, rate: float, burst: int) -> int:
    """The most sends the valve admits in any window of *length* seconds."""
    return burst + int(length * rate + 1e-9)


class Valve:
    """One valve, as one holder (*token*) writes it."""

    def __init__(self, js, name: str, token: int, *, clock=time.time):
        self.js = js
        self.name = name
        self.token = token
        self.clock = clock
        self._kv = None
        self._last: tuple[int, float] | None = None  # (revision, tat) we last wrote or read

    async def _bucket(self):
        if self._kv is None:
            self._kv = await self.js.key_value(buckets.RATE.name)
        return self._kv

    async def _read(self) -> tuple[int, float]:
        try:
            seq, data = await buckets.last(self.js, buckets.RATE.name, self.name, leader=True)
        except Exception as exc:
            raise ValveError(f"reading {self.name}: {type(exc).__name__}: {exc}") from exc
        if data is None:
            return seq, 0.0
        try:
            value = json.loads(data)
            tat, token = float(value["tat"]), int(value["token"])
        except (ValueError, KeyError, TypeError):
            return seq, 0.0  # not ours to read: overwritten by our CAS
        if token > self.token:
            raise Deposed(f"valve {self.name} is held under token {token}, ours is {self.token}")
        return seq, tat

    async def _write(self, revision: int, tat: float) -> bool:
        """CAS *tat* on *revision*: True if it landed. Raises ValveError when
        the answer was lost (it may have landed)."""
        kv = await self._bucket()
        value = json.dumps({"tat": tat, "token": self.token, "at": self.clock()}).encode()
        try:
            seq = await kv.update(self.name, value, last=revision)
        except KeyWrongLastSequenceError:
            self._last = None
            return False
        except Exception as exc:
            self._last = None
            raise ValveError(f"writing {self.name}: {type(exc).__name__}: {exc}") from exc
        self._last = (seq, tat)
        return True

    async def take_over(self) -> None:
        """Write our token into the valve (its TAT unchanged) before the first
        send: a deposed holder's next CAS loses from here on."""
        for _ in range(CAS_ATTEMPTS):
            revision, tat = await self._read()
            if await self._write(revision, tat):
                return
            await asyncio.sleep(CAS_PAUSE)
        raise ValveError(f"taking over {self.name}: the compare-and-set kept failing")

    async def admit(self, rate: float, burst: int, *, sleep=asyncio.sleep) -> float:
        """Return once one send is admitted at *rate* and *burst* (waiting
        for the slot as long as it takes): the time it was admitted at (the
        GCRA's *now*). Raises :class:`Deposed`, and :class:`ValveError` when
        the valve cannot be reached."""
        failures = 0
        while True:
            revision, tat = self._last if self._last is not None else await self._read()
            now = self.clock()
            verdict = gcra(tat, now, rate, burst)
            if not verdict.admit:
                await sleep(verdict.wait)
                continue
            try:
                if await self._write(revision, verdict.tat):
                    return now
            except ValveError:
                failures += 1
                if failures >= CAS_ATTEMPTS:
                    raise
            else:
                failures += 1  # somebody else wrote: read again
                if failures >= CAS_ATTEMPTS:
                    raise ValveError(f"admitting on {self.name}: the compare-and-set kept failing")
            await sleep(CAS_PAUSE)
