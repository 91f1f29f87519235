"""The states a supervised child moves through, and the moves allowed.

::

    stopped ──start──▶ starting ──ready──▶ running ──stop──▶ stopping ──▶ stopped
                          │                   │
                          └──────exit─────────┴──▶ exited ──restart──▶ backoff ──▶ starting
                                                     │
                                                     └──(not restarted)──▶ stopped / fatal

``fatal`` is a child that will not be started again: its supervisor gave up
(restart intensity), or it exited with a configuration error (78).
"""

from __future__ import annotations

STOPPED = "stopped"
STARTING = "starting"
RUNNING = "running"
BACKOFF = "backoff"
STOPPING = "stopping"
EXITED = "exited"
FATAL = "fatal"

# state -> states it may move to
TRANSITIONS: dict[str, frozenset[str]] = {
    STOPPED: frozenset({STARTING, BACKOFF, FATAL}),  # backoff: a sibling's restart waits
    STARTING: frozenset({RUNNING, EXITED, STOPPED}),  # stopped: start abandoned
    RUNNING: frozenset({STOPPING, EXITED}),
    STOPPING: frozenset({STOPPED, EXITED}),
    EXITED: frozenset({BACKOFF, STARTING, STOPPED, FATAL}),
    BACKOFF: frozenset({STARTING, STOPPED, FATAL}),
    FATAL: frozenset({STARTING}),
}


class BadTransition(RuntimeError):
    pass


def check(child: str, old: str, new: str) -> None:
    """Raise if *child* may not move from *old* to *new*."""
    if new not in TRANSITIONS[old]:
        raise BadTransition(f"{child}: {old} -> {new}")
