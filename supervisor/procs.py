"""Process hygiene: prctl, process groups, titles, and what an exit means.

Every child runs in its own process group (its pid is the group id), so
signalling the group reaches whatever the child started — MCP servers, CLI
agents — and killing the group after the child is gone leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
from dataclasses import dataclass
from typing import Callable

import setproctitle

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def set_child_subreaper() -> None:
    """Orphans of our descendants are re-parented to us, so we can reap them."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def set_parent_death_signal(sig: int) -> None:
    """The kernel sends *sig* to this process when its parent dies."""
    _prctl(_PR_SET_PDEATHSIG, int(sig))


def set_title(title: str) -> None:
    """What ``ps`` and ``top`` show for this process."""
    setproctitle.setproctitle(title)


def signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    return signal_group(pgid, 0)


# The exit-code contract (DESIGN §2). Codes the supervisor treats specially.
EXIT_OK = 0
EXIT_WEDGED = 75       # EX_TEMPFAIL: the child's event loop stopped turning
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: crewletd gave up (restart intensity)
EXIT_CONFIG = 78       # EX_CONFIG: bad configuration, restarting cannot help

_CODE_REASON = {EXIT_OK: "exit 0", EXIT_WEDGED: "wedged event loop",
                EXIT_CONFIG: "bad configuration", EXIT_UNAVAILABLE: "gave up: restart intensity"}


@dataclass(frozen=True)
class ExitInfo:
    """How one process ended: a code or a signal, and the reason shown to people.

    Exactly one of ``code`` and ``signal`` is set, except for exits nobody
    could observe (``code is None and signal is None``).
    """

    code: int | None
    signal: int | None
    reason: str

    @property
    def normal(self) -> bool:
        """A clean, asked-for stop: what ``transient`` does not restart."""
        return self.code == EXIT_OK

    def as_dict(self) -> dict:
        return {"code": self.code, "signal": self.signal, "reason": self.reason}

    @classmethod
    def from_status(cls, status: int, reason: str | None = None) -> "ExitInfo":
        """Decode a raw ``waitpid`` status; *reason* overrides the default text
        (the supervisor knows when it was the one that killed the child)."""
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return cls(None, sig, reason or f"signal {sig} ({_signame(sig)})")
        code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None
        return cls(code, None, reason or _CODE_REASON.get(code, f"exit {code}"))


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "?"


def reap_nohang(kill_group: Callable[[int], bool] = lambda pid: True) -> list[tuple[int, int]]:
    """Reap every exited child of this process without blocking.

    Before reaping a child for which ``kill_group(pid)`` holds, its process
    group is SIGKILLed: while its zombie is unreaped the group id cannot be
    reused, so nothing the child started outlives it and no stranger is hit.
    """
    reaped = []
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None:
            return reaped
        if kill_group(info.si_pid):
            signal_group(info.si_pid, signal.SIGKILL)
        try:
            pid, status = os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if pid:
            reaped.append((pid, status))
