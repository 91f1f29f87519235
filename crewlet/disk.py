"""A node's free space: a fact the node watches, and every writer looks at first.

The node's durable state is on the filesystems of its data dir: the broker's
JetStream store (``<data_dir>/broker``), the copy of the estate
(``<data_dir>/estate``) and the run dir. Any of them may be a mount of its
own; each distinct filesystem is looked at once (:func:`survey`, by
``os.statvfs``: the bytes an unprivileged writer may still use). A filesystem
with less free than ``node.disk_floor`` is **low**, and the node acts before
the disk is full rather than fail mid-write:

* crewletd looks every :data:`CHECK_EVERY` seconds and puts what it saw in
  its status (``node.disk``): ``/readyz`` answers 503 and ``crewletctl
  status`` exits 3, both naming the path and its free bytes;
* new mail (``crewletctl send``, the API) and company applies are refused,
  saying "no space on <path>", nothing stored;
* seats fetch no mail while low (it waits in the mailbox: nothing is lost);
* the data node's copy stops applying the log and is out of service with
  the same reason, and applies from where it stopped once space returns.

A write that fails all the same (the disk filled faster than the floor was
seen) is told by :func:`is_no_space` and reported as such, never as a
timeout. The broker is the one writer crewlet cannot ask first: nats-server
2.15 marks a stream whose store met a full disk with a *critical write
error* and answers no publish to it again until it restarts — not after
space returns, not on a config reload, and JetStream itself stays enabled —
so crewletd reads the broker's output for that line
(:func:`broker_store_failed`) and restarts the broker once the disk is above
its floor again (:mod:`supervisor.node`). And a broker started on a low
disk must not take that for its size: left unset, nats-server sets its
JetStream storage limit to 75 % of what is free *when it starts*, and a
broker (re)started on a nearly full disk then answers every write
``insufficient resources`` (10023) for the rest of its life, space or not.
So the broker's config sets ``max_file_store`` to the filesystem's whole
size (:func:`capacity`): the floor decides, not a snapshot.

Processes other than crewletd keep a :class:`Watch`: a survey at most
:data:`FRESH_FOR` seconds old, so a check before every write costs a
``statvfs`` a second at most.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from typing import Any

# Seconds between crewletd's looks at the disk.
CHECK_EVERY = 2.0
# Seconds a process's survey is taken as current (a check before each write).
FRESH_FOR = 1.0
# Where under the data dir the node writes: the broker's JetStream store
# (roles.broker.store_dir), the estate's copy (crewlet.estate.store.copy_path)
# and the run dir. The data dir itself is always looked at; these where they exist.
WRITTEN = ("broker", "estate", "run")
# The config key, for the messages.
KEY = "node.disk_floor"
# errnos that mean "the filesystem is full" (a quota counts).
_FULL = (errno.ENOSPC, errno.EDQUOT)
# nats-server's output when a stream's store could not write (2.15):
#   [ERR] Filestore [AGENTS] Critical write error: write …/2.blk: no space left on device
#   [ERR] JetStream failed to store a msg on stream '$G > AGENTS': write …: no space left on device
_BROKER_FULL = (b"no space left on device", b"disk quota exceeded")


@dataclass(frozen=True)
class Space:
    """One filesystem of the node as last seen: a *path* on it, its *free*
    bytes and the *floor* they must stay above."""

    path: str
    free: int
    floor: int

    @property
    def low(self) -> bool:
        return self.free < self.floor

    def reason(self) -> str:
        return (f"no space on {self.path}: {self.free:,} bytes free, under the floor of "
                f"{self.floor:,} ({KEY})")

    def row(self) -> dict[str, Any]:
        return {"path": self.path, "free_bytes": self.free, "floor": self.floor, "low": self.low}


class NoSpace(Exception):
    """A write refused (or failed) because the node's disk is low; the message names the path."""


def node_paths(data_dir: str) -> list[str]:
    """The data dir and the places under it the node writes, that exist."""
    return [data_dir, *(p for p in (os.path.join(data_dir, d) for d in WRITTEN) if os.path.isdir(p))]


def survey(paths: list[str], floor: int) -> list[Space]:
    """One :class:`Space` per distinct filesystem of *paths* (the first path
    named on each); paths that do not exist are skipped."""
    found: dict[int, Space] = {}
    for path in paths:
        try:
            dev = os.stat(path).st_dev
            if dev in found:
                continue
            vfs = os.statvfs(path)
        except OSError:
            continue
        found[dev] = Space(path, vfs.f_bavail * vfs.f_frsize, floor)
    return list(found.values())


def capacity(path: str) -> int | None:
    """The size in bytes of the filesystem holding *path* (or its nearest
    existing parent); None if none can be looked at."""
    while True:
        try:
            vfs = os.statvfs(path)
            return vfs.f_blocks * vfs.f_frsize
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if parent == path:
                return None
            path = parent
        except OSError:
            return None


def lowest(spaces: list[Space]) -> Space | None:
    """The low filesystem with the least free, else None."""
    low = [s for s in spaces if s.low]
    return min(low, key=lambda s: s.free) if low else None


def condition(spaces: list[Space], broker: str | None = None) -> dict[str, Any]:
    """What a node's status says of its disk: ``low`` and its ``reason``,
    each filesystem, and ``broker``: why the broker waits for space to be
    restarted (None while it does not)."""
    worst = lowest(spaces)
    return {"low": worst is not None, "reason": worst.reason() if worst else None,
            "filesystems": [s.row() for s in spaces], "broker": broker}


class Watch:
    """A process's view of its node's disk, surveyed at most every :data:`FRESH_FOR` s."""

    def __init__(self, data_dir: str, floor: int):
        self.data_dir, self.floor = data_dir, floor
        self._seen: list[Space] = []
        self._at = float("-inf")

    @classmethod
    def of(cls, cfg) -> "Watch":
        """The watch of a node config (:class:`crewlet.config.NodeConfig`)."""
        return cls(cfg.data_dir, cfg.node.disk_floor)

    def spaces(self) -> list[Space]:
        now = time.monotonic()
        if now - self._at >= FRESH_FOR:
            self._seen, self._at = survey(node_paths(self.data_dir), self.floor), now
        return self._seen

    def low(self) -> Space | None:
        """The low filesystem, if any (see :func:`lowest`)."""
        return lowest(self.spaces())

    def refuse_if_low(self, what: str = "") -> None:
        """Raise :class:`NoSpace` (``<reason>[: <what>]``) when the disk is low."""
        space = self.low()
        if space is not None:
            raise NoSpace(space.reason() + (f": {what}" if what else ""))

    def explain(self, exc: BaseException) -> str | None:
        """"no space on …" for an error that a full disk caused, or that came
        while the disk is low (a broker that cannot store answers nothing, so
        its publishes time out; LMDB says EIO for a commit the disk could not
        take); None otherwise. Surveyed afresh: the error is news."""
        self._at = float("-inf")
        space = self.low()
        if space is not None:
            return space.reason()
        if is_no_space(exc):
            return f"no space on {self.data_dir}: {exc}"
        return None


def is_no_space(exc: BaseException) -> bool:
    """Whether *exc* is a write that failed for want of space: ENOSPC or EDQUOT
    from the OS, or LMDB's (an ``lmdb.Error`` carrying that errno's text; its
    ``MapFullError`` is the map's own limit, not the disk: not this)."""
    if isinstance(exc, OSError) and exc.errno in _FULL:
        return True
    said = str(exc)
    return any(os.strerror(code) in said for code in _FULL)


def broker_store_failed(line: bytes) -> bool:
    """Whether a line of the broker's output says a stream's store met a full disk."""
    return b"[ERR]" in line and any(words in line for words in _BROKER_FULL)
