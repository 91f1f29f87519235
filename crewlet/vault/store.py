"""A fleet's secrets in the ``secrets`` bucket: one key per secret, its
newest version sealed (:mod:`crewlet.vault.keys`).

A record (the key's value, JSON) says everything about a secret but its
value in the clear::

    {"name": "openai", "version": 3, "by": "crewletctl@a", "at": 1765000000.0,
     "sealed": {"key": "<key id>", "nonce": "…", "box": "…"},
     "previous": {"version": 2, "sealed": {…}, "until": 1765003600.0} | null}

``previous`` is the version it replaced, kept sealed for a grace period
(``until``, wall clock): a webhook's sender is told the new secret by a
person, some time after it is set here, and what it signs meanwhile with the
old one is still taken (:meth:`crewlet.vault.follow.Vault.accepted`). A
provider key has no grace: the next request uses the new one.

Writes are compare-and-set on the key's last sequence, so two operators
setting a secret at once make two versions, one after the other, never one
version twice. Only crewletd writes (the ``crewlet`` user: ``crewletctl
secret``, the API's admin routes, both through crewletd's control socket);
the roles that use secrets read (:mod:`crewlet.permissions`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import APIError

from crewlet import bus
from crewlet.company.model import SECRET_NAME_RE as NAME_RE  # a KV key token (no dots)
from crewlet.coord import buckets
from crewlet.vault.keys import Keys, Unsealable

VALUE_MAX = 64 * 1024        # bytes of one secret's value: keys and tokens, not files
GRACE_DEFAULT = 3600.0       # seconds the replaced version is still accepted (webhooks)
GRACE_MAX = 7 * 86400.0
BY_MAX = 200                 # characters of who set it
CAS_ATTEMPTS = 8             # compare-and-set tries before giving up (others writing too)


class BadSecret(ValueError):
    """A name, value or grace that cannot be stored (the message says why)."""


class BadRecord(ValueError):
    """A value in the bucket that is not a secret's record."""


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise BadSecret(f"bad secret name {name!r}: 1-64 letters, digits, '_' or '-', "
                        "starting with a letter")
    return name


def check_value(value: Any) -> str:
    if not isinstance(value, str):
        raise BadSecret("a secret's value must be text")
    if not value:
        raise BadSecret("a secret's value must not be empty")
    if len(value.encode()) > VALUE_MAX:
        raise BadSecret(f"a secret's value is at most {VALUE_MAX} bytes")
    if "\0" in value:
        raise BadSecret("a secret's value must not hold a NUL")
    return value


def check_grace(grace: Any) -> float:
    if grace is None:
        return GRACE_DEFAULT
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace <= GRACE_MAX:
        raise BadSecret(f"grace must be 0 to {GRACE_MAX:.0f} seconds, not {grace!r}")
    return float(grace)


@dataclass(frozen=True)
class Record:
    name: str
    version: int
    by: str
    at: float
    sealed: dict
    previous: dict | None = None   # {version, sealed, until}

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    def listing(self, keys: Keys | None = None) -> dict[str, Any]:
        """What may be shown of it (never a value): name, version, who set it
        and when, the key that sealed it and whether *keys* open it, and
        until when the replaced version is still accepted."""
        shown = {"name": self.name, "version": self.version, "by": self.by, "at": self.at,
                 "key": self.sealed["key"], "previous_until": None}
        if self.previous is not None and self.previous["until"] > time.time():
            shown["previous_until"] = self.previous["until"]
        if keys is not None:
            shown["readable"] = keys.holds(self.sealed["key"])
        return shown


def _sealed(value: Any) -> dict:
    if not (isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("key", "nonce", "box"))):
        raise BadRecord("sealed must be {key, nonce, box}")
    return {k: value[k] for k in ("key", "nonce", "box")}


def parse(name: str, data: bytes) -> Record:
    """The record stored under *name*; :class:`BadRecord` saying what is wrong."""
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict) or raw.get("name") != name:
            raise BadRecord(f"not the record of {name}")
        version, at, by = raw["version"], raw["at"], raw["by"]
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise BadRecord("version must be a whole number from 1")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not isinstance(by, str):
            raise BadRecord("at must be a time and by a string")
        previous = raw.get("previous")
        if previous is not None:
            pv, until = previous.get("version"), previous.get("until")
            if not (isinstance(pv, int) and 1 <= pv < version and isinstance(until, (int, float))):
                raise BadRecord("previous must be {version below this one, sealed, until}")
            previous = {"version": pv, "sealed": _sealed(previous.get("sealed")), "until": float(until)}
        return Record(name, version, by[:BY_MAX], float(at), _sealed(raw["sealed"]), previous)
    except BadRecord:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadRecord(f"not a secret's record: {type(exc).__name__}: {exc}") from None


def named_by(company: Any) -> dict[str, list[str]]:
    """The secrets *company* (a Company or its JSON dump) names, each with
    the keys naming it (``providers.llm.api_key_secret``)."""
    def get(obj: Any, key: str) -> Any:
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    found: dict[str, list[str]] = {}
    for section, field in (("providers", "api_key_secret"), ("integrations", "secret"),
                           ("integrations", "reconcile.token_secret")):
        for name, spec in (get(company, section) or {}).items() if company is not None else ():
            value = spec
            for part in field.split("."):
                value = get(value, part) if value is not None else None
            if value:
                found.setdefault(value, []).append(f"{section}.{name}.{field}")
    return found


WRITE_PATIENCE = 10.0   # seconds a write is resent while unanswered (a leader election)
# Seconds a caller (crewletctl, the API) waits for a set or a removal: past every resend
# and compare-and-set try — told it failed when it landed, a retry would be a new version
# and spend the old one's grace.
CALLER_WAIT = 30.0


async def _write(js: JetStreamContext, name: str, data: bytes, last: int, *, delete: bool = False) -> bool:
    """Compare-and-set *name* over its last sequence *last*: False if it moved
    on. Published on the key's subject through *js* (from a leaf, through
    the fleet's domain, which nats-py's KV helper does not do: DESIGN §4),
    resent under one id while unanswered."""
    headers = {bus.EXPECTED_LAST: str(last)}
    if delete:
        headers["KV-Operation"] = "DEL"
    try:
        await bus.publish_until(js, bus.kv_subject(js, buckets.SECRETS.name) + name, data,
                                msg_id=f"secret:{name}:{uuid.uuid4().hex}", headers=headers,
                                deadline=time.monotonic() + WRITE_PATIENCE)
        return True
    except APIError as exc:
        if exc.err_code in bus.WRONG_LAST_SEQUENCE:
            return False
        raise


async def read(js: JetStreamContext, name: str, *, damaged_as_none: bool = False) -> tuple[int, Record | None]:
    """*name*'s last sequence and record (None: never set, or removed; with
    *damaged_as_none*, also one that does not parse — what a write replaces)."""
    seq, data = await buckets.last(js, buckets.SECRETS.name, name, leader=True)
    if data is None:
        return seq, None
    try:
        return seq, parse(name, data)
    except BadRecord:
        if damaged_as_none:
            return seq, None
        raise


async def put(js: JetStreamContext, keys: Keys, name: str, value: str, *, by: str,
              grace: float | None = None) -> Record:
    """Store *value* as the next version of secret *name*, sealed with
    *keys*; the version it replaces stays accepted for *grace* seconds
    (:data:`GRACE_DEFAULT`). :class:`BadSecret` for bad input."""
    check_name(name)
    check_value(value)
    grace = check_grace(grace)
    for _ in range(CAS_ATTEMPTS):
        seq, old = await read(js, name, damaged_as_none=True)  # a damaged record is replaced
        version = 1 if old is None else old.version + 1
        previous = None
        if old is not None and grace > 0:
            previous = {"version": old.version, "sealed": old.sealed, "until": time.time() + grace}
        record = Record(name, version, by[:BY_MAX], time.time(), keys.seal(name, version, value), previous)
        if await _write(js, name, record.to_bytes(), seq):
            return record
        await asyncio.sleep(0.05)  # someone else set it meanwhile: on top of theirs
    raise BadSecret(f"secret {name} kept changing under us: try again")


async def remove(js: JetStreamContext, name: str) -> bool:
    """Remove secret *name* (every version); False if it was not set."""
    check_name(name)
    for _ in range(CAS_ATTEMPTS):
        seq, data = await buckets.last(js, buckets.SECRETS.name, name, leader=True)
        if data is None:
            return False  # (a damaged record is removed like any other)
        if await _write(js, name, b"", seq, delete=True):
            return True
        await asyncio.sleep(0.05)
    raise BadSecret(f"secret {name} kept changing under us: try again")


async def records(js: JetStreamContext) -> list[Record]:
    """Every secret's record, by name. A record that does not parse is left out."""
    found = []
    for name in await buckets.subjects(js, buckets.SECRETS.name):
        try:
            _, record = await read(js, name)
        except BadRecord:
            continue
        if record is not None:
            found.append(record)
    return found


async def reseal(js: JetStreamContext, keys: Keys) -> list[str]:
    """Seal again, with *keys*' sealing key, every secret sealed with another
    key *keys* holds (a fleet secret being rotated; a single node's own key
    after it became a fleet): the names resealed. The version is kept (it
    is the same value); a record changed meanwhile is left for the next
    start. What *keys* cannot open is left as it is."""
    done = []
    for record in await records(js):
        stale = [s["key"] for s in (record.sealed, (record.previous or {}).get("sealed")) if s]
        if all(k == keys.sealing_id or not keys.holds(k) for k in stale):
            continue  # nothing sealed under another key this node holds (a grace's too)
        try:
            value = (keys.open(record.name, record.version, record.sealed)
                     if keys.holds(record.sealed["key"]) else None)
            previous = record.previous
            if previous is not None and keys.holds(previous["sealed"]["key"]):
                prior = keys.open(record.name, previous["version"], previous["sealed"])
                previous = {**previous, "sealed": keys.seal(record.name, previous["version"], prior)}
        except Unsealable:
            continue
        sealed = record.sealed if value is None else keys.seal(record.name, record.version, value)
        again = Record(record.name, record.version, record.by, record.at, sealed, previous)
        seq, now = await read(js, record.name)
        if now != record:
            continue
        if await _write(js, record.name, again.to_bytes(), seq):
            done.append(record.name)
    return done
