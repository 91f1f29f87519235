"""The node's floor: the highest log sequence of this node's own writes.

Every estate request carries it, so whichever data node answers has applied
what this node wrote — from any of its processes: a task a seat created is
seen by ``crewletctl tasks`` on the same node a moment later, even when the
answer comes from a peer's copy.

It lives in the node's **scratch store**, ``<data_dir>/scratch``, which
crewletd deletes at every boot (reference: a node without data keeps a
scratch store, deleted at every boot). Forgetting the floor across a restart
loses nothing: the writes of a node's previous life were answered (so
applied) by a data node before they were acknowledged to anybody.

One 8-byte file, raised under ``flock`` so two processes raising it at once
keep the higher value.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct

_U64 = struct.Struct(">Q")
FILE = "floor"


def scratch_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "scratch")


def wipe_scratch(data_dir: str) -> str:
    """Delete and re-make the node's scratch store (crewletd, at boot)."""
    path = scratch_dir(data_dir)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


class NodeFloor:
    """The node-wide floor, shared by the node's processes through one file.

    Opened lazily, in the process that uses it (a descriptor does not belong
    across the zygote's forks)."""

    def __init__(self, data_dir: str):
        self.path = os.path.join(scratch_dir(data_dir), FILE)
        self._fd: int | None = None
        self._pid = 0

    def _open(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._pid = os.getpid()
        return self._fd

    def get(self) -> int:
        raw = os.pread(self._open(), 8, 0)
        return _U64.unpack(raw)[0] if len(raw) == 8 else 0

    def raise_to(self, seq: int) -> int:
        """Make the floor at least *seq*; returns the floor now."""
        fd = self._open()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            current = self.get()
            if seq > current:
                os.pwrite(fd, _U64.pack(seq), 0)
                return seq
            return current
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None
