"""This data node's part in the estate's snapshots: making them, and starting from one.

**Making.** Every :data:`CHECK_EVERY` seconds, the data node with the lowest
id among the copies in service (each applier sees the same ``status``
records, so they agree but for a moment) looks whether its copy has applied
``estate.snapshot_every`` ops past the newest snapshot; if so it copies its
estate under one read transaction (in a thread: the applier goes on
applying), puts it in the files store and names it in the ``objects`` slot
(:mod:`crewlet.estate.snapshot`). Two nodes that both think they are lowest
at a hand-over make two snapshots at two seqs: harmless, the slot keeps the
newest :data:`~crewlet.estate.snapshot.KEEP`.

**Starting from one** (:func:`bootstrap`, before the applier opens the copy).
A copy that is missing or empty where the log no longer starts at 1 (it was
trimmed), or whose rows fell below the log's first sequence (it was away
through a trim), cannot be applied from the log: the newest snapshot at or
past the log's first seq − 1 is fetched, checked against its manifest and put
in place — the old copy's node-local turn events carried over — and the
applier follows the log from its seq + 1. A running applier that finds its
copy so (:func:`restart_for_a_snapshot`) ends its child, and crewletd starts
it again into the bootstrap.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

from nats.js.errors import NotFoundError

from crewlet import log as events
from crewlet.estate import log as estate_log
from crewlet.estate import snapshot
from crewlet.estate import store as estate_store
from crewlet.estate.view import EstateView
from crewlet.objects.base import ObjectStore

# Seconds between looks at whether a snapshot is due.
CHECK_EVERY = 5.0
# Seconds bootstrap waits for the log's bounds before starting without a
# snapshot (no JetStream yet): short, for the child's readiness waits on it.
# The copy then says "rows below the log", and restart_for_a_snapshot ends the
# child into a bootstrap once the log answers.
BOUNDS_WAIT = 2.0


def _applied(data_dir: str) -> int:
    """This node's copy's applied seq (0: missing or empty)."""
    if not os.path.exists(os.path.join(estate_store.copy_path(data_dir), "data.mdb")):
        return 0
    try:
        st = estate_store.open_env(estate_store.copy_path(data_dir), readonly=True)
    except estate_store.StoreUnavailable:
        return 0  # made, not yet initialised
    try:
        return st.applied()
    finally:
        estate_store.close_env(st)


async def bootstrap(js, objects: ObjectStore, data_dir: str) -> int | None:
    """Put the newest usable snapshot in place of a copy that is empty where
    the log was trimmed, or whose rows fell below the log's first sequence
    (its node-local events carried over); the seq it stands at, or None when
    none was needed or found."""
    applied = await asyncio.to_thread(_applied, data_dir)
    deadline = time.monotonic() + (BOUNDS_WAIT if applied == 0 else 0)
    while True:
        try:
            async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                first, _ = await estate_log.bounds(js)
            break
        except NotFoundError:
            return None  # no log yet: a new fleet, applied from its first op
        except Exception as exc:  # no JetStream yet
            if time.monotonic() > deadline:
                # A copy with rows is asked once, briefly (its readiness waits
                # here): unanswered is no news for it, restart_for_a_snapshot
                # covers a copy below the log. An empty copy's is worth a warning.
                events.event("estate_bootstrap_skipped", "warning" if applied == 0 else "info",
                             reason=f"the log's bounds unread: {type(exc).__name__}: {exc}")
                return None
            await asyncio.sleep(0.5)
    if applied + 1 >= first:
        return None  # the log holds what this copy lacks: apply it
    usable = [m for m in await snapshot.manifests(js) if m.seq >= first - 1]
    if not usable:
        events.event("estate_bootstrap_failed", "error", log_first=first,
                     reason="no snapshot reaches the log's first sequence")
        return None
    manifest = usable[-1]
    started = time.monotonic()
    incoming = await snapshot.fetch(objects, manifest, data_dir)
    await asyncio.to_thread(snapshot.install, incoming, data_dir)
    events.event("estate_bootstrapped", seq=manifest.seq, size=manifest.size, made_by=manifest.node,
                 log_first=first, replaced=applied, took=round(time.monotonic() - started, 3))
    return manifest.seq


async def restart_for_a_snapshot(applier, ctx) -> None:
    """End the child (crewletd starts it again, and :func:`bootstrap` runs)
    once its copy is empty and below a log that a snapshot can be followed
    from: a fleet restored from a backup, or trimmed while this copy was
    being made anew by the operator."""
    while not applier.stopping:
        await asyncio.sleep(CHECK_EVERY)
        first = applier.log_first
        if first is None or applier.applied + 1 >= first:
            continue
        try:
            usable = [m for m in await snapshot.manifests(applier.js) if m.seq >= first - 1]
        except Exception:
            continue  # no quorum now: look again
        if usable:
            events.event("estate_restart_for_snapshot", "warning", log_first=first, seq=usable[-1].seq)
            ctx.fail(RuntimeError(f"the copy applied {applier.applied} and the log starts at {first}: "
                                  f"starting again from snapshot {usable[-1].seq}"))
            return


class Snapshots:
    """Makes the fleet's snapshots while this node is the lowest in service.

    Invariant: ``newest`` is the seq of the newest snapshot this process knows
    of (read from the slot, or made here); None until first read.
    """

    def __init__(self, applier, objects: ObjectStore, view: EstateView, every: int):
        self.applier = applier
        self.objects = objects
        self.view = view
        self.every = every
        self.newest: int | None = None

    async def run(self) -> None:
        while not self.applier.stopping:
            await asyncio.sleep(CHECK_EVERY)
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                events.event("estate_snapshot_failed", "warning", error=f"{type(exc).__name__}: {exc}")
                self.newest = None  # read the slot again: another node may have made one

    def _lowest(self) -> bool:
        serving = [s.id for s in self.view.data_nodes() if s.in_service]
        return bool(serving) and min(serving) == self.applier.node

    async def step(self) -> None:
        applier = self.applier
        if not applier.in_service or not self._lowest():
            self.newest = None  # another node makes them meanwhile
            return
        if self.newest is None:
            found = await snapshot.latest(applier.js)
            self.newest = found.seq if found is not None else 0
        if applier.applied - self.newest < self.every:
            return
        started = time.monotonic()
        where = applier.copy_path + ".snapshot"
        try:
            path, manifest = await asyncio.to_thread(snapshot.make, applier.store, where, applier.node)
            await snapshot.publish(self.objects, applier.js, path, manifest)
        finally:
            shutil.rmtree(where, ignore_errors=True)
        self.newest = manifest.seq
        events.event("estate_snapshot_made", seq=manifest.seq, size=manifest.size,
                     took=round(time.monotonic() - started, 3))
