"""A real SMTP server for tests: aiosmtpd on 127.0.0.1, in a thread of its own.

It counts every message it accepts, by the notification id crewlet puts in
``X-Crewlet-Notification``, with the wall-clock time its DATA ended (the
arrival), and answers as told: :attr:`SmtpServer.refuse` maps an id to a
final answer (``"550 …"``) given to its DATA, :attr:`SmtpServer.defer` an id
to how many times it is first answered ``451`` (a passing failure).
"""

from __future__ import annotations

import threading
import time
from email import message_from_bytes

from aiosmtpd.controller import Controller

from tests.conftest import free_port

ID_HEADER = "X-Crewlet-Notification"


class _Handler:
    def __init__(self, server: "SmtpServer"):
        self.server = server

    async def handle_DATA(self, server, session, envelope):
        at = time.time()
        msg = message_from_bytes(envelope.content)
        id = msg.get(ID_HEADER, "")
        s = self.server
        with s.lock:
            if id in s.refuse:
                s.refused.append(id)
                return s.refuse[id]
            if s.defer.get(id, 0) > 0:
                s.defer[id] -= 1
                s.deferred.append(id)
                return "451 4.3.0 try again later"
            s.arrivals.append((id, at))
            s.messages.append(msg)
        return "250 2.0.0 queued as " + id[-12:]


class SmtpServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.lock = threading.Lock()
        self.arrivals: list[tuple[str, float]] = []
        self.messages: list = []
        self.refuse: dict[str, str] = {}
        self.defer: dict[str, int] = {}
        self.refused: list[str] = []
        self.deferred: list[str] = []
        self._controller = Controller(_Handler(self), hostname="127.0.0.1", port=self.port,
                                      ready_timeout=10)

    def start(self) -> "SmtpServer":
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def ids(self) -> list[str]:
        with self.lock:
            return [i for i, _ in self.arrivals]

    def times(self) -> list[float]:
        with self.lock:
            return sorted(t for _, t in self.arrivals)


def worst_window(times: list[float], rate: float, burst: int, jitter: float = 0.0) -> float:
    """The largest overshoot, in messages, of any window over the sorted
    *times*: the most of ``(j − i + 1) − (burst + rate·(t_j − t_i + jitter))``
    over i ≤ j. ≤ 0 means no window held more than the rate and burst allow
    (allowing each arrival *jitter* seconds of lateness after its admission).

    With ``f(k) = k − rate·t_k`` that is ``max f(j) − min f(i≤j)`` plus a
    constant, so one pass finds it."""
    worst, low = float("-inf"), float("inf")
    for k, t in enumerate(times):
        f = k - rate * t
        low = min(low, f)
        worst = max(worst, f - low)
    return worst + 1 - burst - rate * jitter if times else 0.0
