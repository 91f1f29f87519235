"""A process's secrets, opened and kept in memory: one watch of the
``secrets`` bucket for the life of the process.

A new version reaches a process as its watch sees it (a KV watcher sees a
put ~1 ms after it on one server): the next provider request made after
that uses it, with no restart and no activation. Every value opened is
learnt by :mod:`crewlet.redaction`, so a tool or an agent that says one back
has it replaced before crewlet keeps or shows the text.

A version this process cannot open (sealed with a key it does not hold: a
node that has not got the rotated fleet secret yet) is said once in the log
(``secret_unreadable``, its name, version and key id) and the version it
had stays in use: better the key that worked than none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from nats.js import JetStreamContext

from crewlet import log, redaction
from crewlet.coord import buckets
from crewlet.vault import store
from crewlet.vault.keys import Keys, Unsealable

RELOAD_EVERY = 10.0  # seconds between reads of the node's keys for a key not held


@dataclass(frozen=True)
class Opened:
    """A secret as this process holds it."""

    version: int
    value: str
    previous: str | None = None   # the version it replaced, while its grace lasts
    until: float = 0.0            # wall clock: when *previous* stops being accepted
    box: str = ""                 # the sealed value it was opened from: what tells two
    #                               records of one version apart (a secret removed and set anew)


class Vault:
    """Invariant: once :attr:`listed`, ``_held`` is every secret in the
    bucket whose record this process could open, as of the last entry its
    watch saw (one it could not open keeps what it held before); ``_next``
    is the listing being filled."""

    def __init__(self, js: JetStreamContext, keys: Keys | None, *, role: str = "",
                 reload: Callable[[], Keys | None] | None = None):
        self.js = js
        self.keys = keys
        self.role = role
        # The node's keys read again (its key file changed: a fleet secret rotated while
        # this process ran), at most every RELOAD_EVERY s, when a record names a key not held.
        self._reload = reload
        self._reloaded = float("-inf")
        self._held: dict[str, Opened] = {}
        self._next: dict[str, Opened] | None = None
        self.listed = False
        self.unreadable: set[str] = set()   # names whose newest version this process cannot open

    @classmethod
    def of(cls, js: JetStreamContext, config, role: str) -> "Vault":
        """The vault of *role* on the node configured by *config*: its keys, read
        again when a record names one it lacks (a rotated key file)."""
        from crewlet.vault.keys import vault_keys
        return cls(js, vault_keys(config, role), role=role, reload=lambda: vault_keys(config, role))

    # ------------------------------------------------------------ reading

    async def value(self, name: str) -> str | None:
        """Secret *name*'s value (None: not set, or not one this process can
        open). From memory once the watch has listed the bucket; read from
        it before that (a turn at start, before the listing)."""
        held = await self._get(name)
        return None if held is None else held.value

    async def accepted(self, name: str) -> list[str]:
        """The values a signature made with secret *name* may be checked
        against: its newest, and the one it replaced while the grace lasts."""
        held = await self._get(name)
        if held is None:
            return []
        if held.previous is not None and time.time() < held.until:
            return [held.value, held.previous]
        return [held.value]

    async def _get(self, name: str) -> Opened | None:
        if self.listed:
            return self._held.get(name)
        try:
            _, record = await store.read(self.js, name)
        except store.BadRecord:
            return None
        return None if record is None else self._open(record, None)

    # ------------------------------------------------------------ following

    async def run(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Watch the bucket for the life of the process (until cancelled)."""
        await buckets.follow(lambda: self.js.key_value(buckets.SECRETS.name), ">", self._seen,
                             opened=self._opened, listed=self._listed, name="secrets",
                             stopping=stopping)

    def _opened(self) -> None:
        self._next = {}

    def _listed(self) -> None:
        old, self._held, self._next = self._held, self._next or {}, None
        self.listed = True
        for name in sorted(set(old) | set(self._held)):
            was, now = old.get(name), self._held.get(name)
            if (was and was.version) != (now and now.version):
                self._said(name, now)

    def _seen(self, entry) -> None:
        name = entry.key
        target = self._next if self._next is not None else self._held
        before = target.get(name) or self._held.get(name)  # a listing starts from what was held
        if entry.operation is not None or not entry.value:
            target.pop(name, None)
            self.unreadable.discard(name)
            now = None
        else:
            try:
                record = store.parse(name, entry.value)
            except store.BadRecord as exc:
                log.event("secret_record_refused", "warning", secret=name, error=str(exc))
                return
            now = self._open(record, before)
            if now is None:
                if before is not None:
                    target[name] = before  # unreadable: what worked stays
                return
            target[name] = now
        if target is self._held and (before and before.version) != (now and now.version):
            self._said(name, now)

    def _open(self, record: store.Record, before: Opened | None) -> Opened | None:
        """*record* opened; None (and said once) when it cannot be, so *before* stays."""
        if before is not None and before.version == record.version and before.box == record.sealed["box"]:
            return before
        self._reload_for(record.sealed["key"])
        try:
            if self.keys is None:
                raise Unsealable("no vault key on this node")
            value = self.keys.open(record.name, record.version, record.sealed)
            previous, until = None, 0.0
            prior = record.previous
            if prior is not None and prior["until"] > time.time():
                try:
                    previous = self.keys.open(record.name, prior["version"], prior["sealed"])
                    until = prior["until"]
                except Unsealable:
                    pass  # the grace is lost on this node; the newest still works
        except Unsealable as exc:
            if record.name not in self.unreadable:
                log.event("secret_unreadable", "warning", role=self.role, secret=record.name,
                          version=record.version, key=record.sealed["key"], error=str(exc),
                          keeps=before.version if before else None)
            self.unreadable.add(record.name)
            return None
        self.unreadable.discard(record.name)
        redaction.learn([value, previous])
        return Opened(record.version, value, previous, until, record.sealed["box"])

    def _reload_for(self, kid: str) -> None:
        """Read the node's keys again if *kid* is not among them (rate-limited)."""
        if self._reload is None or (self.keys is not None and self.keys.holds(kid)):
            return
        now = time.monotonic()
        if now - self._reloaded < RELOAD_EVERY:
            return
        self._reloaded = now
        fresh = self._reload()
        if fresh is not None:
            self.keys = fresh

    def _said(self, name: str, now: Opened | None) -> None:
        # Never the value: its name and version say what changed.
        log.event("secret_changed", role=self.role, secret=name,
                  version=None if now is None else now.version)

    def stats(self) -> dict[str, object]:
        """What ``crewletctl status`` shows: how many it holds, which it cannot open."""
        return {"held": len(self._held), "unreadable": sorted(self.unreadable), "listed": self.listed}
