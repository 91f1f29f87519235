"""A node's skill registry: its cache of the company's skills (DESIGN §15).

Not shared state: every node with seats keeps its own, and nothing shared is
decided from it — it is how a turn finds, without asking anybody, which
skills apply to its seat and what they say they are for. The estate is the
store (:mod:`crewlet.estate.skills`); the registry learns it three ways:

* **the boot walk** — the whole list, read once the estate serves;
* **the periodic walk** — every ``skills.walk_every`` seconds, the list read
  again: a broadcast this node missed (it was down, or its connection was)
  is made good by then;
* **a broadcast** — ``skills.changed`` (core NATS), ``{"names": [...], "seq":
  N}``, sent by every data node's applier that applied a change to those
  skills at log seq *N* (and by ingress for a write it made): the named
  skills alone are read again, at a floor of *N*, so the read never answers
  from a copy that has not seen the change. A stateless node, which has no
  copy, learns only this way and by its walks.

What a turn reads through it: :meth:`Registry.prompt` (the lines of the
system prompt that list the seat's skills — name and description, bounded)
and :meth:`Registry.read` (a skill's file, the ``skill_read`` tool's). A
conversation's run reads the skills as of its pin (:meth:`read` and
:meth:`listing` with ``as_of``), from the estate rather than the cache: the
cache holds only the current revision.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from crewlet import log
from crewlet.estate.ops import LIST_MAX
from crewlet.skills import format as skill_format

# The broadcast's subject (core NATS): a changed skill.
CHANGED_SUBJECT = "skills.changed"
# Seconds between walks when the node's config says nothing (skills.walk_every).
WALK_EVERY = 300.0
# The boot walk, while no copy serves yet: tried again this often, and said
# (skills_walk_failed) only once it has failed this long.
BOOT_RETRY = 1.0
BOOT_QUIET = 30.0
# Seconds one read through the estate may take (a walk, a broadcast's re-read).
READ_TIMEOUT = 10.0
# Characters of a turn's system prompt the skills list may take.
PROMPT_CHARS = 4000
# Skills one walk reads (the query's page): a company's skills are tens, not thousands.
WALK_LIMIT = LIST_MAX
_NAME = re.compile(skill_format.NAME)


@dataclass(frozen=True)
class Entry:
    """One skill as the cache holds it: its current revision's brief."""
    name: str
    seq: int
    meta: skill_format.Meta
    files: tuple[str, ...]


class Registry:
    """The cache, in one process (the seats role's); see the module doc.

    ``entries``: name → :class:`Entry`, the newest revision this process has
    read of every skill that is not retired; a change read at a lower seq
    than the one held is ignored (a walk's answer overtaken by a broadcast).
    """

    def __init__(self, estate: Any, nc: Any, *, walk_every: float = WALK_EVERY):
        self.estate = estate          # the role's router (crewlet.estate.router.Router)
        self.nc = nc
        self.walk_every = walk_every
        self.entries: dict[str, Entry] = {}
        self._prompts: dict[str, str] = {}  # seat → its lines, until the next change
        self._tasks: list[asyncio.Task] = []
        self._sub = None
        self.walked_at: float | None = None
        self.stats = {"walks": 0, "walk_failures": 0, "broadcasts": 0, "rereads": 0}

    # -------------------------------------------------------------- life

    async def start(self) -> None:
        """Listen for broadcasts, then walk now and every ``walk_every`` s."""
        self._sub = await self.nc.subscribe(CHANGED_SUBJECT, cb=self._heard)
        self._tasks.append(asyncio.create_task(self._walking(), name="skills-walk"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:
                pass  # the connection is going too
            self._sub = None

    async def _walking(self) -> None:
        # At a node's start no copy may serve yet: the boot walk is tried again
        # every BOOT_RETRY s, said only once it has failed for BOOT_QUIET s.
        started = time.monotonic()
        while True:
            try:
                await self.walk()
                pause = self.walk_every
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats["walk_failures"] += 1
                booting = self.walked_at is None and time.monotonic() - started < BOOT_QUIET
                if not booting:
                    log.event("skills_walk_failed", "warning", error=f"{type(exc).__name__}: {exc}")
                pause = min(self.walk_every, BOOT_RETRY) if self.walked_at is None else self.walk_every
            await asyncio.sleep(pause)

    async def walk(self) -> None:
        """Read the whole list again (the boot and periodic walks)."""
        answer = await self.estate.read("skill.list", {"limit": WALK_LIMIT}, timeout=READ_TIMEOUT)
        fresh = {}
        for row in answer.get("skills") or ():
            entry = _entry(row)
            if entry is not None:
                fresh[entry.name] = entry
        # A broadcast read meanwhile may be newer than this answer: keep it.
        for name, held in self.entries.items():
            if name in fresh and held.seq > fresh[name].seq:
                fresh[name] = held
        self._set(fresh)
        self.stats["walks"] += 1
        self.walked_at = time.time()

    async def _heard(self, msg) -> None:
        try:
            body = json.loads(msg.data)
            names = [n for n in body.get("names", ()) if isinstance(n, str)][:WALK_LIMIT]
            seq = body.get("seq")
        except (ValueError, AttributeError):
            return  # not a broadcast of ours: nothing to read
        self.stats["broadcasts"] += 1
        if isinstance(seq, int) and seq > 0:
            self.estate.raise_floor(seq)  # read from a copy that has the change
        for name in names:
            try:
                await self.reread(name)
            except Exception as exc:
                log.event("skills_reread_failed", "warning", skill=name[:100],
                          error=f"{type(exc).__name__}: {exc}")

    async def reread(self, name: str) -> None:
        """Read skill *name* again (a broadcast named it)."""
        if not _NAME.match(name):
            return
        answer = await self.estate.read("skill.read", {"name": name}, timeout=READ_TIMEOUT)
        self.stats["rereads"] += 1
        row = answer.get("skill")
        entries = dict(self.entries)
        if row is None:
            entries.pop(name, None)
        else:
            entry = _entry(row)
            held = entries.get(name)
            if entry is None or (held is not None and held.seq > entry.seq):
                return
            entries[name] = entry
        self._set(entries)

    def _set(self, entries: dict[str, Entry]) -> None:
        if entries != self.entries:
            self.entries = entries
            self._prompts = {}

    def status(self) -> dict[str, Any]:
        """What crewletctl status shows of the registry."""
        return {"skills": len(self.entries), "walked_at": self.walked_at, **self.stats}

    # -------------------------------------------------------------- reads

    def for_seat(self, seat: str) -> list[Entry]:
        return [e for name, e in sorted(self.entries.items()) if skill_format.applies_to(e.meta, seat)]

    def prompt(self, seat: str) -> str:
        """The system prompt's lines listing *seat*'s skills ('' when none)."""
        text = self._prompts.get(seat)
        if text is None:
            text = self._prompts[seat] = skill_format.prompt_list(
                [e.meta for e in self.for_seat(seat)], PROMPT_CHARS)
        return text

    async def listing(self, seat: str, as_of: int | None = None) -> list[dict[str, Any]]:
        """The skills that apply to *seat*: the cache's, or as of a run's pin."""
        if as_of is None:
            return [{"name": e.name, "description": e.meta.description, "files": list(e.files), "seq": e.seq}
                    for e in self.for_seat(seat)]
        answer = await self.estate.read("skill.list", {"as_of": as_of, "seat": seat, "limit": WALK_LIMIT},
                                        timeout=READ_TIMEOUT)
        return answer.get("skills") or []

    async def prompt_as_of(self, seat: str, as_of: int) -> str:
        rows = await self.listing(seat, as_of)
        metas = [m for m in (_meta(r) for r in rows) if m is not None]
        return skill_format.prompt_list(metas, PROMPT_CHARS)

    async def read(self, name: str, file: str | None = None, *, as_of: int | None = None,
                   timeout: float = READ_TIMEOUT) -> dict[str, Any]:
        """``{skill, file}`` as the estate answers ``skill.read``."""
        args: dict[str, Any] = {"name": name}
        if file:
            args["file"] = file
        if as_of is not None:
            args["as_of"] = as_of
        return await self.estate.read("skill.read", args, timeout=timeout)


def _meta(row: dict[str, Any]) -> skill_format.Meta | None:
    try:
        return skill_format.Meta.from_dict(row["meta"])
    except (KeyError, TypeError, ValueError):
        return None  # a row this version cannot read: passed over, not fatal


def _entry(row: dict[str, Any]) -> Entry | None:
    meta = _meta(row)
    if meta is None or not isinstance(row.get("seq"), int):
        return None
    return Entry(row["name"], row["seq"], meta, tuple(row.get("files") or ()))
