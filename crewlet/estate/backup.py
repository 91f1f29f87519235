"""Backup and restore of a company: its estate, its files' bytes and its company revision.

A **backup** is a directory (``crewletctl backup DEST``, made 0700)::

    DEST/estate/data.mdb     a consistent copy of this data node's estate (one read
                             transaction: crewlet.estate.snapshot.make)
    DEST/objects/<name>      the bytes of every file a row of that copy names
    DEST/company.json        the company revision in force: {"rev", "company", ...}
    DEST/backup.json         what the backup holds (:func:`manifest`), written LAST:
                             a directory without it is not a backup

**Restore** (``crewletctl restore SRC``) starts a new fleet from one: a fleet
whose estate log is empty (a fleet just started — it is refused otherwise,
nothing changed). Its files go to the new fleet's store, its company
becomes revision 1 (or the next), and its copy becomes the fleet's first
snapshot at the backup's seq; the log is moved on to start after it (a purge
of the empty stream sets its first sequence), so every data node's copy,
empty and now below the log, starts from that snapshot
(roles/data_applier/snapshots.py) and follows the new log from there.

Two things of the old fleet mean nothing in the new one and are dropped from
the restored copy: the seats' **fences** (tokens of the old fleet's leases;
the new fleet's tokens start low again, and would all be refused as stale),
and the node-local **events** (custody is per node). The copy then follows
the new log (its ``local`` record of the log it follows is the new one's).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from typing import Any

import lmdb

from crewlet import private
from crewlet.estate import log as estate_log
from crewlet.estate import snapshot
from crewlet.estate import store as estate_store
from crewlet.objects.base import ObjectStore, check_name
from crewlet.objects.files import is_file_object

FORMAT = 1
MANIFEST = "backup.json"
COMPANY = "company.json"
# Largest object restored in one piece is not bounded here: the new store's own
# limit applies (files.max_bytes is the API's, not the store's).
OBJECT_MAX = 1 << 40


class BackupError(Exception):
    """A backup could not be written, read or restored; says why."""


# ------------------------------------------------------------------ backup

async def write(dest: str, *, data_dir: str, node: str, objects: ObjectStore,
                company: dict[str, Any] | None) -> dict[str, Any]:
    """Write a backup of this node's copy (at *data_dir*), the files it names
    (from *objects*) and *company* (the revision in force) into *dest*, which
    must not exist or be empty. Its manifest."""
    if os.path.exists(dest) and os.listdir(dest):
        raise BackupError(f"{dest} is not empty: a backup goes into a new directory")
    private.make_dir(dest)
    try:
        st = estate_store.open_env(estate_store.copy_path(data_dir), readonly=True)
    except estate_store.StoreUnavailable as exc:
        raise BackupError(f"this node has no copy of the estate to back up: {exc}") from None
    path, estate = snapshot.make(st, os.path.join(dest, "estate"), node)
    # The files the copy names, from the copy itself (what this backup restores).
    restored = estate_store.open_env(os.path.dirname(path), readonly=True)
    try:
        names = sorted(_objects_named(restored))
    finally:
        estate_store.close_env(restored)
    total = 0
    for name in names:
        target = os.path.join(dest, "objects", name)
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        with open(target, "wb") as f:
            os.fchmod(f.fileno(), private.FILE_MODE)
            async with await objects.open(name) as reader:
                async for chunk in reader:
                    f.write(chunk)
                    total += len(chunk)
    if company is not None:
        _write_json(os.path.join(dest, COMPANY), company)
    made = {"format": FORMAT, "made_at": time.time(), "node": node, "estate": asdict(estate),
            "objects": len(names), "object_bytes": total,
            "company_rev": (company or {}).get("rev")}
    _write_json(os.path.join(dest, MANIFEST), made)
    return made


def _objects_named(st: estate_store.Store) -> set[str]:
    names = set()
    with st.env.begin() as txn:
        for _, raw in txn.cursor(db=st.dbs["files"]):
            row = estate_store.unpack(raw)
            name = row.get("object") if isinstance(row, dict) else None
            if isinstance(name, str) and is_file_object(name):
                names.add(name)
    return names


def _write_json(path: str, value: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, private.FILE_MODE)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())


# ------------------------------------------------------------------ reading one

def manifest(src: str) -> dict[str, Any]:
    """The manifest of the backup at *src*, checked; :class:`BackupError` if
    *src* is not a whole backup this version can restore."""
    try:
        with open(os.path.join(src, MANIFEST)) as f:
            made = json.load(f)
    except FileNotFoundError:
        raise BackupError(f"{src} is not a backup (no {MANIFEST}: not one, or not written whole)") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"{src}/{MANIFEST} cannot be read: {exc}") from None
    if not isinstance(made, dict) or made.get("format") != FORMAT:
        raise BackupError(f"{src} is a backup of format {made.get('format') if isinstance(made, dict) else '?'}; "
                          f"this version restores format {FORMAT}")
    try:
        snapshot.Manifest.of(made.get("estate"))
    except snapshot.SnapshotError as exc:
        raise BackupError(f"{src}: {exc}") from None
    if not os.path.exists(os.path.join(src, "estate", "data.mdb")):
        raise BackupError(f"{src} holds no estate/data.mdb")
    return made


# ------------------------------------------------------------------ restore

async def restore(src: str, *, js, objects: ObjectStore, replicas: int, node: str) -> dict[str, Any]:
    """Restore the estate and files of the backup at *src* into the fleet of
    *js* (its company is the caller's to apply). Refused, with nothing
    changed, unless the fleet's estate log is empty. What was restored."""
    made = manifest(src)
    estate = snapshot.Manifest.of(made["estate"])
    info = await estate_log.ensure_stream(js, replicas)
    if info.state.last_seq > 0 or info.state.first_seq > 1:
        raise BackupError(f"this fleet's estate log is not empty (it holds ops up to {info.state.last_seq}): "
                          f"a backup is restored into a new fleet")
    created = info.created.isoformat() if info.created is not None else None
    work = tempfile.mkdtemp(prefix="restore.", dir=os.path.dirname(os.path.abspath(src)) or ".")
    try:
        private.make_dir(work)
        copy = os.path.join(work, "data.mdb")
        shutil.copyfile(os.path.join(src, "estate", "data.mdb"), copy)
        os.chmod(copy, private.FILE_MODE)
        digest = _as_a_new_fleets(work, created)
        # The files first: a copy naming bytes the store does not hold would serve 404s.
        restored = 0
        base = os.path.join(src, "objects")
        for root, _, files in os.walk(base):
            for leaf in files:
                name = os.path.relpath(os.path.join(root, leaf), base)
                check_name(name)
                with open(os.path.join(root, leaf), "rb") as f:
                    await objects.put(name, f, max_bytes=OBJECT_MAX)
                restored += 1
        first = snapshot.Manifest(seq=estate.seq, rules=estate.rules, log_created=created, digest=digest,
                                  size=os.path.getsize(copy), node=node, made_at=time.time())
        await snapshot.publish(objects, js, copy, first)
        # Last: the log starts after the snapshot, and every empty copy starts from it.
        if estate.seq > 0:
            await js.purge_stream(estate_log.STREAM, seq=estate.seq + 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"seq": estate.seq, "objects": restored, "company_rev": made.get("company_rev")}


def _as_a_new_fleets(path: str, created: str | None) -> str:
    """Make the copy at *path* one of the new fleet: no fences, no events,
    following the log made *created*. Its digest."""
    try:
        env, dbs = estate_store.open_file(path)
    except lmdb.Error as exc:
        raise BackupError(f"the backup's estate/data.mdb is not an estate copy: {exc}") from None
    try:
        with env.begin(write=True) as txn:
            txn.drop(dbs["fences"], delete=False)
            txn.drop(dbs["events"], delete=False)
            if created is not None:
                txn.put(estate_store.LOG_CREATED, created.encode(), db=dbs["local"])
        with env.begin() as txn:
            return estate_store.digest_txn(txn, dbs)
    except lmdb.Error as exc:
        raise BackupError(f"the backup's estate/data.mdb is not an estate copy: {exc}") from None
    finally:
        env.close()
