"""The control plane: company revisions and the activation epoch (DESIGN §4, §7).

Both live in the ``config`` KV bucket:

``rev.<n>`` (n = 1, 2, 3 …)
    An immutable revision, JSON ``{"rev", "company", "digest", "source",
    "applied_by", "at"}``: the validated company as a plain dict
    (``Company.model_validate(r["company"])`` rebuilds it), its digest, the
    file it came from, ``user@host`` and a unix time. Appending is
    ``create(rev.<n>)`` with n one past the highest existing key; losing
    that race to another writer moves on to n+1. Never overwritten.

``active``
    The activation epoch, JSON ``{"rev", "epoch", "at"}``. Activating a
    revision is a compare-and-set on the last revision of the key read
    (``create`` when absent) with ``epoch + 1``; a conflict re-reads and
    retries, at most ``ACTIVATE_ATTEMPTS`` times. The epoch therefore counts
    every activation; the active revision is the one activated last (not
    necessarily the highest: two concurrent applies both land and both
    count, and whichever activates second is active; a rollback may
    activate an older one).

Every node watches ``active`` (:meth:`ControlPlane.watch`), applies the
revision it names, and records what it reached in ``status``.

Applying a company whose digest equals the active revision's still appends a
revision and bumps the epoch: an apply is an explicit act, and re-applying
the same file is how an operator makes every node apply it again.

Errors from NATS (timeouts, no JetStream, no quorum, a value over the
server's max payload) become :class:`ControlPlaneError` with a message that
says what was being done. Give the JetStream context a short timeout
(``nc.jetstream(timeout=JS_TIMEOUT)``).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from crewlet.company.model import Company
from crewlet.coord.buckets import CONFIG, ensure

JS_TIMEOUT = 2.0          # seconds: JetStream requests of the control plane
ACTIVATE_ATTEMPTS = 5     # compare-and-set tries of `active` before giving up
APPEND_ATTEMPTS = 50      # rev.<n> creates (n, n+1, …) before giving up
ACTIVE = "active"
REV_PREFIX = "rev."
_STREAM = f"KV_{CONFIG.name}"
_KV_OPS_GONE = ("DEL", "PURGE")


class ControlPlaneError(Exception):
    """The control plane could not be read or written; the message says what and why."""


class RevisionNotFound(ControlPlaneError):
    """No ``rev.<n>`` for the asked n."""


def applied_by() -> str:
    """``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry and no $USER, e.g. a bare container
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _json(data: bytes, key: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ControlPlaneError(f"{CONFIG.name}/{key} holds something that is not JSON: {bytes(data[:80])!r}")
    return value


class ControlPlane:
    """Revisions and the activation epoch over one JetStream context."""

    def __init__(self, js: JetStreamContext, kv: KeyValue):
        self.js, self.kv = js, kv

    @classmethod
    async def open(cls, js: JetStreamContext, replicas: int = 1) -> ControlPlane:
        """The control plane, creating the ``config`` bucket with *replicas* if needed."""
        try:
            kv = await ensure(js, CONFIG, replicas)
        except (NatsError, asyncio.TimeoutError) as exc:
            raise ControlPlaneError(f"opening the {CONFIG.name} bucket: {_why(exc)}") from exc
        return cls(js, kv)

    # ---------------------------------------------------------------- reading

    async def _get(self, key: str) -> tuple[dict[str, Any], int] | None:
        """(value, KV revision) of *key*, or None when absent."""
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return None
        except (NatsError, asyncio.TimeoutError) as exc:
            raise ControlPlaneError(f"reading {CONFIG.name}/{key}: {_why(exc)}") from exc
        return _json(entry.value or b"", key), entry.revision

    async def active(self) -> dict[str, Any] | None:
        """The active pointer ``{"rev", "epoch", "at"}``, or None before the first apply."""
        got = await self._get(ACTIVE)
        return got[0] if got else None

    async def revision(self, n: int) -> dict[str, Any]:
        """The full revision *n*; :class:`RevisionNotFound` if there is none."""
        got = await self._get(f"{REV_PREFIX}{n}")
        if got is None:
            raise RevisionNotFound(f"no revision {n}")
        return got[0]

    async def highest(self) -> int:
        """The highest n of any ``rev.<n>`` key ever written (0: none)."""
        try:
            info = await self.js.stream_info(_STREAM, subjects_filter=f"$KV.{CONFIG.name}.{REV_PREFIX}>")
        except (NatsError, asyncio.TimeoutError) as exc:
            raise ControlPlaneError(f"listing revisions: {_why(exc)}") from exc
        subjects = info.state.subjects or {}
        numbers = [s.rpartition(".")[2] for s in subjects]
        return max((int(n) for n in numbers if n.isdigit()), default=0)

    async def revisions(self) -> list[dict[str, Any]]:
        """Every revision, in full, ascending by rev."""
        out: list[dict[str, Any]] = []
        try:
            watcher = await self.kv.watch(f"{REV_PREFIX}>")
            try:
                while True:
                    entry = await watcher.updates(timeout=JS_TIMEOUT)
                    if entry is None:  # the end of what is stored
                        break
                    if entry.operation not in _KV_OPS_GONE:
                        out.append(_json(entry.value or b"", entry.key))
            finally:
                await watcher.stop()
        except (NatsError, asyncio.TimeoutError) as exc:
            raise ControlPlaneError(f"reading revisions: {_why(exc)}") from exc
        return sorted(out, key=lambda r: r.get("rev", 0))

    async def history(self) -> list[dict[str, Any]]:
        """A summary of every revision, ascending: rev, digest, source,
        applied_by, at, seats (count) and active (bool)."""
        revisions = await self.revisions()
        pointer = await self.active()
        current = pointer.get("rev") if pointer else None
        return [{"rev": r.get("rev"), "active": r.get("rev") == current, "at": r.get("at"),
                 "seats": len((r.get("company") or {}).get("seats") or []), "digest": r.get("digest"),
                 "source": r.get("source"), "applied_by": r.get("applied_by")}
                for r in revisions]

    async def watch(self) -> AsyncIterator[dict[str, Any]]:
        """Yield the active pointer now (if there is one), then each time it
        changes, for as long as the caller iterates. Before the first apply
        the first item is the first activation."""
        try:
            watcher = await self.kv.watch(ACTIVE)
        except (NatsError, asyncio.TimeoutError) as exc:
            raise ControlPlaneError(f"watching {CONFIG.name}/{ACTIVE}: {_why(exc)}") from exc
        seen = 0
        try:
            async for entry in watcher:
                if entry is None or entry.operation in _KV_OPS_GONE or entry.revision <= seen:
                    continue  # the end-of-initial marker, a delete, or a replay after a reconnect
                seen = entry.revision
                yield _json(entry.value or b"", ACTIVE)
        finally:
            try:
                await watcher.stop()
            except Exception:  # a closed connection has nothing left to stop
                pass

    # ---------------------------------------------------------------- writing

    async def append(self, company: Company, source: str, by: str | None = None) -> int:
        """Store *company* as the next revision; its number. Does not activate."""
        record = {"company": company.model_dump(mode="json"), "digest": company.digest(),
                  "source": source, "applied_by": by or applied_by(), "at": time.time()}
        n = await self.highest() + 1
        for _ in range(APPEND_ATTEMPTS):
            key = f"{REV_PREFIX}{n}"
            value = json.dumps({"rev": n, **record}, separators=(",", ":")).encode()
            try:
                await self.kv.create(key, value)
                return n
            except KeyWrongLastSequenceError:
                n += 1  # somebody else appended rev.<n> first
            except (NatsError, asyncio.TimeoutError) as exc:
                if await self._stored(key, value):
                    return n  # it timed out, yet was stored: it is ours
                raise ControlPlaneError(f"writing {CONFIG.name}/{key}: {_why(exc)}") from exc
        raise ControlPlaneError(f"appending a revision: lost the race {APPEND_ATTEMPTS} times")

    async def _stored(self, key: str, value: bytes) -> bool:
        """Does *key* hold exactly *value*? (False when that cannot be read either.)"""
        try:
            got = await self._get(key)
        except ControlPlaneError:
            return False
        return got is not None and got[0] == json.loads(value)

    async def activate(self, n: int) -> int:
        """Make revision *n* the active one; the new epoch."""
        await self.revision(n)  # refuse to point at nothing
        for _ in range(ACTIVATE_ATTEMPTS):
            got = await self._get(ACTIVE)
            epoch = (got[0].get("epoch") or 0) + 1 if got else 1
            value = json.dumps({"rev": n, "epoch": epoch, "at": time.time()}, separators=(",", ":")).encode()
            try:
                if got is None:
                    await self.kv.create(ACTIVE, value)
                else:
                    await self.kv.update(ACTIVE, value, last=got[1])
                return epoch
            except KeyWrongLastSequenceError:
                continue  # another activation landed in between (or quorum is lost): re-read
            except (NatsError, asyncio.TimeoutError) as exc:
                raise ControlPlaneError(f"activating revision {n}: {_why(exc)}") from exc
        raise ControlPlaneError(f"activating revision {n}: the compare-and-set failed "
                                f"{ACTIVATE_ATTEMPTS} times (busy, or no quorum)")

    async def apply(self, company: Company, source: str, by: str | None = None) -> tuple[int, int]:
        """Append *company* as a new revision and activate it: (rev, epoch)."""
        n = await self.append(company, source, by)
        return n, await self.activate(n)
