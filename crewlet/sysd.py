"""systemd's notify protocol (``Type=notify``, ``WatchdogSec=``), stdlib only.

No-ops unless systemd set ``$NOTIFY_SOCKET``.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send one state line (``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``…)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(state.encode(), addr)
        except OSError:
            return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings systemd expects (half its timeout)."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6
