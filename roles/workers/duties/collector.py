"""Duty ``collector``: remove the file objects no file row names, once they are older than ``files.grace``.

A file is its row in the estate and its bytes in the store the whole fleet
shares (:mod:`crewlet.objects.files`). An upload writes the object first and
the row after, and a row goes (``file.delete``) or moves on to a new object (a
path uploaded again) without touching the bytes: so the store gathers objects
no row names — a writer that died between the two writes, a replaced or
deleted file. This duty removes them. One node of the fleet does, the holder
of the ``duty.collector`` lease: the object store's collector is one logical
instance (reference "Scaling out").

A **walk** runs when this node takes the duty and every ``files.collect_every``
seconds after the last one ended:

1. **List the objects** (``store.names()``), keeping each file object's name,
   size and ``created`` (see :func:`~crewlet.objects.files.is_file_object`),
   and each of the estate's snapshots' (``snapshots/…``); any other object
   is counted, never touched.
2. **Read the rows**: the ``object`` of every file row, paged through
   ``file.list`` (:func:`estate_names`). If any page fails — no copy answers,
   none is current enough — the walk **removes nothing** and says why.
3. **Remove** each listed file object that no row names and whose ``created``
   is before ``start − grace``, *start* being when step 1 began; then each
   listed snapshot the ``objects`` slot's ``snapshots`` key (read after the
   listing) does not name, on the same age rule — a snapshot whose publish
   died between its object and the slot, or an old one whose delete failed
   (:func:`crewlet.estate.snapshot.publish` names a snapshot within moments
   of putting it, far inside any grace).
4. **Sweep** the leftovers of uploads killed mid-way (``store.sweep(grace)``).
5. **Report**: the ``objects`` slot's ``collector`` key
   (:func:`crewlet.objects.slot.write_found`), the ``status`` key
   ``duty.collector`` (:mod:`crewlet.coord.duty_reports`, with ``totals``
   carried on from the previous holder), and an ``objects_collected`` event.

The invariant
-------------
*An object is removed only if no row read in step 2 names it and it was
created more than ``grace`` before the walk began.* Why that never removes an
object a row names: an upload writes its row within ``grace`` of its object
(``files.grace`` is chosen longer than any upload takes), so an object created
before ``start − grace`` had its row in the log before *start*; step 2 begins
after *start* and reads with a floor no lower than what the furthest copy had
applied then (:func:`estate_names`), so every page shows that row, unless a
later op removed it or moved it to another object (then the object is
rightly unnamed). An object created after *start* is younger than grace and
kept whatever the rows say.

The order is what makes the walk's length not matter. Reading the rows first
and listing the objects after would let an object uploaded in between, and
its row written after its page was read, be taken for an orphan; and measuring
age against the time of each removal rather than *start* would need grace to
outlast the walk. Listing first and measuring from *start* needs neither.

What the invariant leans on, not held here: ``grace`` exceeds the time from
an upload's object to its row being applied by some copy, by more than the
copies' status period (the floor is their last records, :func:`estate_names`);
a row written naming an object that already exists (the seats'
``file_register`` tool takes an ``object``) is protected only while that
object is young or named by another row the walk read; and the store's clock
(``created``) and this node's differ by much less than ``grace``. A row a page
misses because it landed behind the page's cursor was written after the walk
began, so it names no object the walk may remove (but such a re-naming).

A walk a hand-over makes overlap another (the old holder cancelled mid-walk,
the new one starting) is harmless: each walk keeps the invariant on its own,
and a removal is idempotent. A cancel between two removals leaves nothing half
done. The set of names is held in memory: some 100 bytes a file row.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from crewlet import log
from crewlet.coord import duty_reports
from crewlet.estate import snapshot
from crewlet.estate.ops import LIST_MAX
from crewlet.estate.router import Router
from crewlet.objects import slot
from crewlet.objects.base import ObjectStore
from crewlet.objects.files import is_file_object, store_of
from roles.workers.duties import Duty, going_on, rest

NAME = "collector"
# Rows a file.list page asks for: the most a query gives, so a company of a
# million files is read in 2,000 requests.
PAGE = LIST_MAX
# Seconds one page may take through the router: it waits up to 10 s per data
# node (crewlet.estate.router.READ_WAIT), so three copies each get their turn.
PAGE_TIMEOUT = 30.0
# Seconds the router's view of the data nodes may take to list them before the
# rows are read: without it no floor can be set, and nothing is removed.
VIEW_WAIT = 10.0
# What a walk counts over time, carried from holder to holder.
# Seconds before a walk that could not read the file rows is tried again.
UNREAD_RETRY = 30.0
TOTALED = ("removed", "removed_bytes", "swept")

# The rows' side of a walk: every object name some file row gives, or an
# exception when the estate could not be read whole.
Named = Callable[[], Awaitable[set[str]]]


class EstateUnread(Exception):
    """The file rows could not all be read: the walk removes nothing."""


def estate_names(router: Any, *, page: int = PAGE, timeout: float = PAGE_TIMEOUT) -> Named:
    """The rows' side of a walk through *router* (the role's estate router):
    the ``object`` of every file row, read page by page through
    ``file.list``. Raises :class:`EstateUnread` naming what failed.

    The pages are read through a router of their own over the role's view and
    copy, its floor raised to the furthest applied seq the data nodes last
    recorded (``status`` ``estate.<node>``, every 2 s): a copy behind it
    answers ``behind`` and the next is asked, so no page comes from a copy
    that has not applied what the log held when the walk began. (The log's
    own last seq would be exact, but the workers' broker user may not read
    ``ESTATE``'s info; the records are at most a few seconds behind it, well
    inside any grace.) Its own router, so the raised floor is not the node's:
    the node's other readers keep theirs."""
    async def named() -> set[str]:
        if router is None:
            raise EstateUnread("this node has no estate router")
        view = router.view
        if not await view.wait_ready(VIEW_WAIT):
            raise EstateUnread(f"the data nodes were not listed within {VIEW_WAIT:g} s")
        reader = Router(router.nc, node_id=router.node_id, view=view, local=router.local,
                        read_wait=router.read_wait)
        reader.raise_floor(max([router.floor, *(s.applied for s in view.data_nodes())]))
        names: set[str] = set()
        args: dict[str, Any] = {"limit": page}
        pages = 0
        while True:
            going_on()  # up to a page per LIST_MAX rows, each up to PAGE_TIMEOUT
            try:
                answer = await reader.read("file.list", args, timeout=timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise EstateUnread(f"file.list page {pages + 1} (floor {reader.floor}): "
                                   f"{type(exc).__name__}: {exc}") from exc
            rows = (answer or {}).get("files")
            if not isinstance(rows, list):
                raise EstateUnread(f"file.list page {pages + 1} answered no list of files")
            pages += 1
            names.update(row["object"] for row in rows if isinstance(row, dict) and row.get("object"))
            if len(rows) < page:
                return names
            last = rows[-1]
            args = {"limit": page, "after": {"project": last["project"], "path": last["path"]}}
    return named


def slot_snapshots(js) -> Named:
    """The snapshots' side of a walk: the objects the ``objects`` slot names."""
    async def named() -> set[str]:
        return {m.name + snapshot.DATA for m in await snapshot.manifests(js)}
    return named


async def walk(store: ObjectStore, named: Named, *, grace: float,
               snapshots_named: Named | None = None) -> dict[str, Any]:
    """One walk of *store* (the module doc's steps 1-4) against the names
    *named* answers (and the snapshots *snapshots_named* does): what it found
    (``objects``/``bytes``: the file objects listed; ``named``: of them, those
    a row names, None when the rows could not be read; ``kept_young``:
    unnamed but younger than grace; ``removed``, ``removed_bytes``, snapshots
    included; ``snapshots``: the snapshot objects listed; ``others``: objects
    that are neither; ``swept``; ``error``: None, or why the walk did less
    than all of it)."""
    start = time.time()
    cutoff = start - grace
    found: dict[str, Any] = {"at": start, "grace": grace, "objects": 0, "bytes": 0, "named": None,
                             "kept_young": 0, "removed": 0, "removed_bytes": 0, "snapshots": 0,
                             "others": 0, "swept": 0, "error": None}
    errors: list[str] = []
    listed = []
    snapshots = []
    try:
        async for info in store.names():                        # 1. the objects first
            going_on()
            if info.name.startswith(snapshot.PREFIX) and snapshots_named is not None:
                snapshots.append(info)
                found["snapshots"] += 1
                continue
            if not is_file_object(info.name):
                found["others"] += 1
                continue
            listed.append(info)
            found["objects"] += 1
            found["bytes"] += info.size
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        errors.append(f"listing the store: {type(exc).__name__}: {exc}; nothing removed")
        listed = []
    names: set[str] | None = None
    if not errors:
        try:
            names = await named()                                # 2. then the rows
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            errors.append(f"the file rows could not all be read, so nothing was removed: {exc}")
    if names is not None:
        found["named"] = 0
        for info in listed:                                      # 3. unnamed and old
            going_on()
            if info.name in names:
                found["named"] += 1
            elif info.created >= cutoff:
                found["kept_young"] += 1
            elif not await _remove(store, info, start, found, errors):
                break
    if snapshots and not errors:
        try:
            kept = await snapshots_named()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            errors.append(f"the snapshots slot could not be read, so no snapshot was removed: "
                          f"{type(exc).__name__}: {exc}")
        else:
            for info in snapshots:
                going_on()
                if info.name not in kept and info.created < cutoff:
                    if not await _remove(store, info, start, found, errors):
                        break
    try:
        found["swept"] = await store.sweep(older_than=grace)     # 4. dead writers' leftovers
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        errors.append(f"sweeping: {type(exc).__name__}: {exc}")
    found["took_ms"] = round((time.time() - start) * 1000, 1)
    found["error"] = "; ".join(errors) or None
    return found


async def _remove(store: ObjectStore, info, start: float, found: dict[str, Any],
                  errors: list[str]) -> bool:
    """Remove one object a walk found unnamed and old; False (said in
    *errors*) when that failed and the walk stops removing."""
    try:
        await store.delete(info.name)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the next walk finds it again
        errors.append(f"removing {info.name}: {type(exc).__name__}: {exc}; the walk stopped removing")
        return False
    found["removed"] += 1
    found["removed_bytes"] += info.size
    log.event("object_collected", object=info.name, size=info.size,
              age_s=round(start - info.created, 1))
    return True


class Collector:
    """One holder's walks and what it reports."""

    def __init__(self, ctx, store: ObjectStore):
        self.ctx = ctx
        self.store = store
        self.js = ctx.role.jetstream()
        self.named = estate_names(ctx.estate)
        self.totals = {what: 0 for what in TOTALED}

    async def carry_totals(self) -> None:
        """Go on from the previous holder's totals (a counter must not restart at a hand-over)."""
        await duty_reports.carry_totals(self.js, NAME, self.totals)

    async def once(self) -> dict[str, Any]:
        """A walk, recorded in the slot and the duty's report; what it found."""
        files = self.ctx.config.files
        found = await walk(self.store, self.named, grace=files.grace,
                           snapshots_named=slot_snapshots(self.js))
        found.update(node=self.ctx.config.node.id, token=self.ctx.token, store=self.store.identity())
        for what in TOTALED:
            self.totals[what] += found[what]
        log.event("objects_collected", "warning" if found["error"] else "info",
                  **{k: found[k] for k in ("objects", "bytes", "named", "kept_young", "removed",
                                           "removed_bytes", "snapshots", "others", "swept", "took_ms",
                                           "error")})
        try:
            await slot.write_found(self.js, found)
        except Exception as exc:  # the next walk writes again
            log.event("collector_found_unwritten", "warning", error=f"{type(exc).__name__}: {exc}")
        try:
            await duty_reports.write(self.js, NAME, {**found, "totals": dict(self.totals),
                                                     "errors": [found["error"]] if found["error"] else []})
        except Exception as exc:
            log.event("collector_report_failed", "warning", error=f"{type(exc).__name__}: {exc}")
        return found


async def run(ctx) -> None:
    role = ctx.role
    store = store_of(ctx.config.files, js=role.jetstream(), nc=role.nats,
                     replicas=ctx.config.stream.replicas)
    try:
        collector = Collector(ctx, store)
        await collector.carry_totals()
        if ctx.estate is not None:
            await ctx.estate.serving(UNREAD_RETRY, going_on)
        while going_on():
            found = await collector.once()
            # A walk that could not read the rows (the copies not in service yet,
            # as at a node's start) is tried again soon, not a whole interval on.
            every = ctx.config.files.collect_every
            await rest(min(every, UNREAD_RETRY) if found.get("named") is None else every)
    finally:
        await store.close()


DUTY = Duty(NAME, run)
