"""A node's data is the service user's only: directories 0700, files 0600.

Set at creation: ``crewletd`` sets the umask :data:`UMASK` before anything
else, and every process of the node (the zygote's forks, the roles,
``nats-server``) inherits it, so whatever they create — the estate's LMDB
files, the search index, the broker's store, the floor, the run dir and its
sockets — has no bits for group or others. Where a library takes a mode,
crewlet gives it (``lmdb.open(mode=FILE_MODE)``, ``os.open(..., 0o600)``).

Checked at start (:func:`tighten`): the data dir itself and crewlet's own
entries in it (:data:`OWN`) are walked, and whatever group or others may
reach is **fixed, with a ``data_dir_tightened`` event** naming what changed.
Fixed rather than refused: every data dir made before this rule is 0755
with 0644 files, and refusing would stop every upgraded node until an
operator ran the same chmod by hand; the fix only ever takes access away
from other users. What cannot be fixed (a data dir owned by another user, a
read-only file system) is refused: exit 78 naming ``data_dir``.

Only :data:`OWN` is walked, never the whole tree: a data dir pointed at a
home directory by mistake must not have every file in it chmodded. The data
dir's own 0700 already keeps others out of anything else in it. Symbolic
links are never followed. Sockets get the file rule too: only the same user
connects to them.
"""

from __future__ import annotations

import os
import stat

# Nothing for group or others, for everything the node's processes create.
UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600
# What crewlet keeps in a data dir (the estate's copy and search index, the
# broker's store, the run dir, the scratch floor).
OWN = ("estate", "estate-search.sqlite", "estate-search.sqlite-wal", "estate-search.sqlite-shm",
       "broker", "run", "scratch")
# Paths named in the event; the rest are counted.
SHOWN = 20


class NotPrivate(Exception):
    """The data dir is reachable by others and cannot be made private."""


def restrict() -> None:
    """This process, and all it starts, creates files for its user only."""
    os.umask(UMASK)


def make_dir(path: str) -> None:
    """*path* and its missing parents, each 0700 (``os.makedirs`` gives
    the parents it makes the default mode)."""
    missing: list[str] = []
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for made in reversed(missing):
        os.makedirs(made, mode=DIR_MODE, exist_ok=True)
        os.chmod(made, DIR_MODE)


def exposed(mode: int) -> bool:
    """Whether a file of *mode* is reachable by group or others (or, not a
    directory, carries more than read and write for its owner)."""
    if stat.S_ISDIR(mode):
        return bool(mode & 0o077)
    return bool(mode & 0o177)


def _want(mode: int) -> int:
    return DIR_MODE if stat.S_ISDIR(mode) else FILE_MODE


def _walk(data_dir: str):
    yield data_dir
    for name in OWN:
        top = os.path.join(data_dir, name)
        if not os.path.lexists(top):
            continue
        yield top
        if os.path.isdir(top) and not os.path.islink(top):
            for root, dirs, files in os.walk(top):  # never follows links
                for entry in dirs + files:
                    yield os.path.join(root, entry)


def tighten(data_dir: str) -> list[str]:
    """Make *data_dir* (created if missing) and crewlet's entries in it the
    user's only; the paths changed. Raises :class:`NotPrivate`."""
    try:
        make_dir(data_dir)
    except OSError as exc:
        raise NotPrivate(f"{data_dir} cannot be made: {exc.strerror or exc}") from None
    fixed: list[str] = []
    for path in _walk(data_dir):
        try:
            # The data dir itself may be the operator's link to it: followed.
            st = os.stat(path) if path == data_dir else os.lstat(path)
        except FileNotFoundError:
            continue  # gone meanwhile
        if stat.S_ISLNK(st.st_mode) or not exposed(st.st_mode):
            continue
        try:
            os.chmod(path, _want(st.st_mode))
        except OSError as exc:
            raise NotPrivate(f"{path} is {stat.filemode(st.st_mode)} (readable by others) and cannot "
                             f"be made private: {exc.strerror or exc}") from None
        fixed.append(path)
    return fixed
