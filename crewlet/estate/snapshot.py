"""Snapshots of a copy: how a new data node starts without the whole log.

The log is trimmed (roles/workers/duties/maintenance.py), so a data node that
joins late — or one whose rows fell below the log's first sequence — cannot
apply it from the first op. It starts from a **snapshot**: a consistent LMDB
copy of a peer's estate plus the sequence it stands at, handed over through
the file store (crewlet.objects; on the default backend, a bucket on the
fleet's own broker), then follows the log from the next sequence.

A snapshot is one object, ``snapshots/<seq, 20 digits>.mdb``: the copy,
``Environment.copy`` under one read transaction, compacted. Its
:class:`Manifest` is kept in the ``objects`` slot's ``snapshots`` key
(crewlet.objects.slot), written once the object is whole: one read finds the
newest, without walking the store (which holds every file).

The copy holds the node-local tables as they were on the peer that made it;
:func:`install` empties ``events`` (a node keeps only the turn events its
custody gives it) and keeps ``local``'s record of the log the copy follows
and the rules it was applied under, so the installed copy is, to the applier,
a copy that applied the log up to ``seq``. The manifest's ``digest`` is
:func:`crewlet.estate.store.digest` of the replicated tables, taken in the
same transaction: :func:`fetch` refuses a snapshot whose copy does not hash
to it.

Who makes them: the applier of the data node with the lowest id among those
in service (roles/data_applier/applier.py), every ``estate.snapshot_every``
ops; :data:`KEEP` are kept. The trim never passes the newest snapshot, so a
new node always finds one it can follow the log from.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

import lmdb

from crewlet import private
from crewlet.estate import store as estate_store
from crewlet.estate.search import index_path
from crewlet.objects import slot
from crewlet.objects.base import NotFound, ObjectStore

PREFIX = "snapshots/"
DATA = ".mdb"
# Snapshots kept in the store; older ones go when a new one is published.
KEEP = 2


class SnapshotError(Exception):
    """A snapshot could not be made, found or installed."""


@dataclass(frozen=True)
class Manifest:
    seq: int            # the copy applied the log up to here
    rules: int | None   # the rules its rows were applied under
    log_created: str | None  # the log it follows (its creation time)
    digest: str         # store.digest of the replicated tables
    size: int           # bytes of the .mdb object
    node: str           # who made it
    made_at: float

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.seq:020d}"

    @staticmethod
    def parse(raw: bytes) -> "Manifest":
        """A manifest from its JSON; :class:`SnapshotError` if it is not one."""
        try:
            return Manifest.of(json.loads(raw))
        except ValueError as exc:
            raise SnapshotError(f"not a snapshot manifest: {exc}") from None

    @staticmethod
    def of(d: object) -> "Manifest":
        """A manifest from its fields (a record's dict); :class:`SnapshotError` if it is not one."""
        try:
            m = Manifest(seq=int(d["seq"]), rules=d.get("rules"), log_created=d.get("log_created"),
                         digest=str(d["digest"]), size=int(d["size"]), node=str(d["node"]),
                         made_at=float(d["made_at"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SnapshotError(f"not a snapshot manifest: {exc}") from None
        if m.seq < 0 or m.size < 0 or (m.rules is not None and not isinstance(m.rules, int)):
            raise SnapshotError(f"not a snapshot manifest: {d!r:.200}")
        return m


# ----------------------------------------------------------------- making

def make(st: estate_store.Store, dest_dir: str, node: str) -> tuple[str, Manifest]:
    """Copy *st* into *dest_dir* (made, 0700) under one read transaction:
    the copy's path and its manifest (``size`` filled in)."""
    private.make_dir(dest_dir)
    with st.env.begin() as txn:
        raw = txn.get(estate_store.APPLIED, db=st.dbs["meta"])
        seq = int.from_bytes(raw, "big") if raw else 0
        rules = txn.get(estate_store.RULES, db=st.dbs["local"])
        created = txn.get(estate_store.LOG_CREATED, db=st.dbs["local"])
        digest = estate_store.digest_txn(txn, st.dbs)
        st.env.copy(dest_dir, compact=True, txn=txn)
    path = os.path.join(dest_dir, "data.mdb")
    os.chmod(path, private.FILE_MODE)
    return path, Manifest(seq=seq, rules=int(rules) if rules is not None else None,
                          log_created=bytes(created).decode() if created is not None else None,
                          digest=digest, size=os.path.getsize(path), node=node, made_at=time.time())


async def publish(objects: ObjectStore, js, path: str, manifest: Manifest) -> None:
    """Put the copy, then name it in the slot; then drop all but the newest :data:`KEEP`."""
    with open(path, "rb") as f:
        await objects.put(manifest.name + DATA, f, max_bytes=manifest.size)
    kept = [m for m in await manifests(js) if m.seq != manifest.seq] + [manifest]
    kept.sort(key=lambda m: m.seq)
    await slot.write_snapshots(js, [asdict(m) for m in kept[-KEEP:]])
    for old in kept[:-KEEP]:  # named no more: nobody starts from them now
        await objects.delete(old.name + DATA)


# ----------------------------------------------------------------- finding

async def manifests(js) -> list[Manifest]:
    """The snapshots the slot names, oldest first (read from the stream's leader)."""
    record = (await slot.read(js, (slot.SNAPSHOTS,), leader=True))[slot.SNAPSHOTS] or {}
    found = []
    for raw in record.get("snapshots") or []:
        try:
            found.append(Manifest.of(raw))
        except SnapshotError:
            continue
    return sorted(found, key=lambda m: m.seq)


async def latest(js) -> Manifest | None:
    found = await manifests(js)
    return found[-1] if found else None


# ----------------------------------------------------------------- installing

async def fetch(objects: ObjectStore, manifest: Manifest, data_dir: str) -> str:
    """Download *manifest*'s copy beside this node's (``<data_dir>/estate.incoming``),
    check it against the manifest, and empty its node-local ``events``: the
    directory, ready for :func:`install`. Raises :class:`SnapshotError`."""
    incoming = estate_store.copy_path(data_dir) + ".incoming"
    shutil.rmtree(incoming, ignore_errors=True)
    private.make_dir(incoming)
    path = os.path.join(incoming, "data.mdb")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, private.FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            async with await objects.open(manifest.name + DATA) as reader:  # its sha256 checked at the end
                async for chunk in reader:
                    f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    except NotFound:
        raise SnapshotError(f"snapshot {manifest.seq} is gone from the store") from None
    try:
        env, dbs = estate_store.open_file(incoming)
    except lmdb.Error as exc:
        raise SnapshotError(f"snapshot {manifest.seq} is not an estate copy: {exc}") from None
    try:
        with env.begin() as txn:
            digest = estate_store.digest_txn(txn, dbs)
        if digest != manifest.digest:
            raise SnapshotError(f"snapshot {manifest.seq} does not hash to its manifest's digest")
        with env.begin(write=True) as txn:
            txn.drop(dbs["events"], delete=False)  # the peer's custody, not ours
    except lmdb.Error as exc:
        raise SnapshotError(f"snapshot {manifest.seq} is not an estate copy: {exc}") from None
    finally:
        env.close()
    return incoming


def install(incoming: str, data_dir: str) -> None:
    """Put the copy :func:`fetch` made where this node's copy lives (closed by
    this process), with the search index rebuilt from it (the old one is
    removed). The old copy's node-local ``events`` (the turn events this
    node's custody kept) are carried over into the new one."""
    target = estate_store.copy_path(data_dir)
    if os.path.exists(os.path.join(target, "data.mdb")):
        _carry_events(target, incoming)
    if os.path.exists(target):
        aside = tempfile.mkdtemp(prefix="estate.replaced.", dir=data_dir)
        os.rename(target, os.path.join(aside, "estate"))
        shutil.rmtree(aside, ignore_errors=True)
    os.rename(incoming, target)
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(index_path(data_dir) + suffix)
        except FileNotFoundError:
            pass


def _carry_events(old: str, new: str) -> None:
    """Copy the ``events`` table of the copy at *old* into the one at *new*."""
    src, src_dbs = estate_store.open_file(old, readonly=True)
    try:
        dst, dst_dbs = estate_store.open_file(new)
        try:
            with src.begin() as rtxn, dst.begin(write=True) as wtxn:
                for key, value in rtxn.cursor(db=src_dbs["events"]):
                    wtxn.put(key, value, db=dst_dbs["events"])
        finally:
            dst.close()
    finally:
        src.close()
