"""``/v1/admin``: what an operator does to this node's own copy, over HTTP, for
an admin token — what ``crewletctl`` does on the machine.

============================  ===============================================
``GET /v1/admin/capacity``    this node's disk (free, size, the floor), its
                              copy's size, the estate log's length, first and
                              last sequence and bytes, the snapshots, the
                              log's growth a day and when, at that rate, the
                              disk's free space meets the floor
``GET /v1/admin/retention``   the company's retention, what the maintenance
                              duty's last sweep removed and in all, and what
                              the next one removes (records older than each
                              cut-off)
``GET /v1/admin/backup``      a backup of this node's copy, its files' bytes
                              and the company (``crewletctl backup``'s
                              directory), streamed as a tar as it is read
``POST /v1/admin/evict/{n}``  take node *n*'s copy out of service (or, with
                              ``undo``, put it back); the last copy in service
                              only with ``force`` (the eviction gate)
============================  ===============================================

The growth is the log's bytes over the age of its first entry: a rate, not a
promise (a trimmed log has a short memory, and a quiet week reads as none).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tarfile
import tempfile
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from crewlet import disk
from crewlet.company.model import Retention
from crewlet.coord import duty_reports
from crewlet.estate import backup as estate_backup
from crewlet.estate import log as estate_log
from crewlet.estate import snapshot
from crewlet.estate import store as estate_store
from crewlet.objects.files import store_of
from roles.ingress.auth import ADMIN
from roles.ingress.front import front
from roles.ingress.problems import Problem, responses

router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=responses(401, 403))

DAY = 86400.0
CHUNK = 256 * 1024  # bytes a read of a backup's file hands the stream at a time


# ---------------------------------------------------------------- capacity

async def _log_state(js) -> dict[str, Any]:
    info = await js.stream_info(estate_log.STREAM)
    state = info.state
    first_at = None
    if state.messages:
        try:
            first = await js.get_msg(estate_log.STREAM, state.first_seq)
            first_at = _stamp(getattr(first, "time", None))
        except Exception:  # trimmed under us: no age, no rate
            first_at = None
    return {"first_seq": state.first_seq, "last_seq": state.last_seq, "messages": state.messages,
            "bytes": state.bytes, "first_at": first_at}


def _stamp(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return value.timestamp()
    return None


def growth(log: dict[str, Any], now: float) -> float | None:
    """The log's bytes a day: its bytes over the age of its first entry (None: no age)."""
    first_at = log.get("first_at")
    if not first_at or now - first_at < 60:
        return None
    return log["bytes"] / ((now - first_at) / DAY)


def forecast(free: int | None, floor: int, per_day: float | None, now: float) -> float | None:
    """When free space meets the floor at *per_day* (a time), None: never, or unknown."""
    if free is None or not per_day or per_day <= 0:
        return None
    return now + max(0.0, free - floor) / per_day * DAY


@router.get("/capacity", summary="This node's disk, copy, log and snapshots, the growth and a forecast",
            responses=responses(503))
async def capacity(request: Request, _=Depends(ADMIN)) -> dict[str, Any]:
    f = front(request)
    cfg = f.cfg
    now = time.time()
    spaces = disk.survey(disk.node_paths(cfg.data_dir), cfg.node.disk_floor)
    data = spaces[0] if spaces else None  # the data dir's own filesystem (survey names it first)
    copy = estate_store.copy_path(cfg.data_dir)
    try:
        copy_bytes = sum(os.path.getsize(os.path.join(copy, n)) for n in os.listdir(copy)
                         if os.path.isfile(os.path.join(copy, n)))
    except OSError:
        copy_bytes = None
    try:
        log = await _log_state(f.js)
        snaps = [{"seq": m.seq, "size": m.size, "node": m.node, "made_at": m.made_at}
                 for m in await snapshot.manifests(f.js)]
    except Exception as exc:
        raise Problem(503, "unavailable", f"the fleet's JetStream did not answer: {type(exc).__name__}: {exc}",
                      headers={"Retry-After": "5"}) from None
    per_day = growth(log, now)
    free = data.free if data is not None else None
    return {"node": cfg.node.id, "at": now,
            "disk": {"path": data.path if data else cfg.data_dir, "free": free,
                     "size": disk.capacity(cfg.data_dir), "floor": cfg.node.disk_floor,
                     "low": bool(data and data.low), "filesystems": [s.row() for s in spaces]},
            "copy": {"path": copy, "bytes": copy_bytes},
            "log": log, "snapshots": snaps,
            "growth": {"log_bytes_per_day": per_day,
                       "floor_reached_at": forecast(free, cfg.node.disk_floor, per_day, now)}}


# ---------------------------------------------------------------- retention

@router.get("/retention", summary="What retention removed, and what it removes next", responses=responses(503))
async def retention(request: Request, _=Depends(ADMIN)) -> dict[str, Any]:
    f = front(request)
    now = time.time()
    kept = (f.company.retention if f.company is not None else Retention())
    try:
        report = await duty_reports.read(f.js, "maintenance")
    except Exception as exc:
        raise Problem(503, "unavailable", f"the duties' reports did not answer: {type(exc).__name__}: {exc}",
                      headers={"Retry-After": "5"}) from None
    return {"retention": kept.model_dump(),
            "last_sweep": report,
            "removed_in_all": (report or {}).get("totals"),
            "next": {"turns_recorded_before": now - kept.turns_days * DAY,
                     "events_before": now - kept.events_days * DAY,
                     "retired_mailboxes_idle_since": now - kept.mail_days * DAY}}


# ---------------------------------------------------------------- backup

async def _tar(dest: str, parent: str) -> AsyncIterator[bytes]:
    """*dest* as a tar (POSIX), each file read and handed on CHUNK bytes at a
    time, never whole in memory; *parent* removed at the end, read or not."""
    try:
        for root, dirs, files in os.walk(dest):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                info = tarfile.TarInfo(os.path.join("backup", os.path.relpath(path, dest)))
                info.size, info.mtime, info.mode = os.path.getsize(path), int(time.time()), 0o600
                yield info.tobuf(tarfile.PAX_FORMAT)
                with open(path, "rb") as fh:
                    left = info.size
                    while left > 0:
                        chunk = await asyncio.to_thread(fh.read, min(CHUNK, left))
                        if not chunk:
                            raise OSError(f"{path} shrank while it was read")
                        left -= len(chunk)
                        yield chunk
                yield b"\0" * (-info.size % tarfile.BLOCKSIZE)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)  # the end of the archive
    finally:
        await _discard(parent)


BACKUP_PREFIX = "backup-"  # a backup's working copy in the data dir: backup-<random>/backup
# The working copies this process is making or streaming now (the others are stale).
_making: set[str] = set()


async def _discard(parent: str) -> None:
    _making.discard(parent)
    await asyncio.to_thread(shutil.rmtree, parent, True)


def _sweep_stale(data_dir: str) -> None:
    for name in os.listdir(data_dir):
        path = os.path.join(data_dir, name)
        if name.startswith(BACKUP_PREFIX) and path not in _making and os.path.isdir(path):
            shutil.rmtree(path, True)


@router.get("/backup", summary="A backup of this node's copy, the files and the company, as a tar",
            responses={**responses(409, 503), 200: {"content": {"application/x-tar": {}},
                                                     "description": "the backup's directory, as a tar"}})
async def backup(request: Request, _=Depends(ADMIN)) -> StreamingResponse:
    """What ``crewletctl backup`` writes (``backup.json`` last), made in the
    node's data dir and streamed as it is read; the working copy goes when
    the stream ends, whether it was read to the end or not."""
    f = front(request)
    cfg = f.cfg
    # Working copies of backups that never streamed (a client gone before the first
    # byte, a process killed meanwhile) go before a new one is made.
    await asyncio.to_thread(_sweep_stale, cfg.data_dir)
    parent = tempfile.mkdtemp(prefix=BACKUP_PREFIX, dir=cfg.data_dir)
    _making.add(parent)
    dest = os.path.join(parent, "backup")
    try:
        company = None
        if f.control_plane is not None:
            active = await f.control_plane.active()
            if active is not None:
                company = await f.control_plane.revision(active["rev"])
        objects = store_of(cfg.files, js=f.js, nc=f.nc, replicas=cfg.stream.replicas)
        try:
            made = await estate_backup.write(dest, data_dir=cfg.data_dir, node=cfg.node.id, objects=objects,
                                             company=company)
        finally:
            await objects.close()
    except estate_backup.BackupError as exc:
        await _discard(parent)
        raise Problem(409, "no_backup", str(exc)) from None
    except Exception as exc:
        await _discard(parent)
        raise Problem(503, "unavailable", f"the backup could not be made: {type(exc).__name__}: {exc}",
                      headers={"Retry-After": "5"}) from None
    name = f"crewlet-backup-{cfg.node.id}-{made['estate']['seq']}.tar"
    return StreamingResponse(_tar(dest, parent), media_type="application/x-tar",
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})


# ---------------------------------------------------------------- eviction

class Eviction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: str | None = Field(None, min_length=1, max_length=500, description="Why (shown with the copy)")
    force: bool = Field(False, description="Evict even the last copy in service (the fleet has none then)")
    undo: bool = Field(False, description="Put the copy back in service instead")


@router.post("/evict/{node}", responses=responses(400, 404, 409, 422, 503),
             summary="Take a node's copy of the estate out of service, or put it back (the eviction gate)")
async def evict(request: Request, body: Eviction | None = None,
                node: str = Path(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"),
                grant=Depends(ADMIN)) -> dict[str, Any]:
    """As ``crewletctl evict``: the last copy in service is refused without
    ``force`` (409 naming why)."""
    body = body or Eviction()
    args: dict[str, Any] = {"node": node, "by": f"api:{grant.name}"}
    if body.undo:
        args["undo"] = True
    else:
        args["reason"] = body.reason or "evicted by the operator"
        if body.force:
            args["force"] = True
    return await front(request).ask_node("evict", **args)
