"""systemd's notify protocol (``Type=notify``, ``WatchdogSec=``), stdlib only.

No-ops unless systemd set ``$NOTIFY_SOCKET``. :func:`take_environment` moves
systemd's variables out of the environment at start, so no child inherits a
socket that is crewletd's alone to notify on.
"""

from __future__ import annotations

import os
import socket

_NAMES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
_env: dict[str, str] = {}


def take_environment() -> None:
    """Keep systemd's variables for this process and remove them from os.environ."""
    for name in _NAMES:
        if name in os.environ:
            _env[name] = os.environ.pop(name)


def _get(name: str) -> str | None:
    return _env.get(name) or os.environ.get(name)


def notify(state: str) -> bool:
    """Send one state line (``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``…)."""
    addr = _get("NOTIFY_SOCKET")
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
    usec = _get("WATCHDOG_USEC")
    pid = _get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6
