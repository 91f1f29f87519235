"""The spawn janitor: kill what a predecessor spawned and left behind.

A seat's MCP servers and CLI agents run in process groups of their own (so
one can be stopped with everything it forked), which also puts them out of
reach of the supervisor stopping the seats role's group. A role that was
SIGKILLed — or whose whole node was — leaves them running. Everything the
seats role spawns therefore carries ``CREWLET_SPAWNED_BY=<mark>`` in its
environment (and passes it on to whatever it forks), where the mark names
the role, not one incarnation of it; a restarted role calls
:func:`kill_marked` before it spawns anything of its own.
"""

from __future__ import annotations

import os
import signal

import psutil

from crewlet import log

# The environment variable that marks a process as spawned by a crewlet role.
SPAWNED_BY = "CREWLET_SPAWNED_BY"


def kill_marked(mark: str) -> list[int]:
    """SIGKILL every process group with a process marked ``CREWLET_SPAWNED_BY=<mark>``.

    This process and its ancestors are spared, and so are their groups: a
    marked process that shares one of them is killed alone. Returns the pids
    signalled, sorted.
    """
    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    spared_groups = {g for g in map(_pgid, spared) if g is not None}
    groups: dict[int, list[int]] = {}
    marked: list[tuple[int, int]] = []
    for proc in psutil.process_iter():
        pgid = _pgid(proc.pid)
        if pgid is None:
            continue
        groups.setdefault(pgid, []).append(proc.pid)
        if proc.pid in spared:
            continue
        try:
            if proc.environ().get(SPAWNED_BY) == mark:
                marked.append((proc.pid, pgid))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone, a zombie, or not ours to read: not ours to kill either
    killed: set[int] = set()
    done: set[int] = set()
    for pid, pgid in marked:
        if pgid in spared_groups:
            if _kill(os.kill, pid):
                killed.add(pid)
        elif pgid not in done:
            done.add(pgid)
            if _kill(os.killpg, pgid):
                killed.update(groups[pgid])
    if killed:
        log.event("spawn_janitor_killed", "warning", mark=mark, pids=sorted(killed))
    return sorted(killed)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _kill(how, target: int) -> bool:
    try:
        how(target, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False
