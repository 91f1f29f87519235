"""The ``objects`` slot: which store the company's files are in, and what the collector last found.

Every node reaches the same store (reference "Files are the exception"), so
the first node to join records the store its ``files:`` section names, and
every later node compares: a node configured with another store would write
files its peers cannot read, so it refuses to boot (exit 78), naming both.
The record is a create-only write: the first wins a race, and it is never
changed by a node (an operator moving the company's files empties the slot
with ``crewletctl`` after moving them).

Keys of the ``objects`` bucket (:data:`crewlet.coord.buckets.OBJECTS`):

=============  ==============================================================
``store``      ``{"store": "nats:files", "node": …, "at": …}``: the store
``collector``  the collector duty's last walk (:func:`write_found`): objects
               seen, kept, removed, bytes, when, by which node
``snapshots``  the estate's snapshots in the store, newest last
               (:mod:`crewlet.estate.snapshot`): one read finds them
=============  ==============================================================
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import APIError

from crewlet.bus import EXPECTED_LAST, WRONG_LAST_SEQUENCE, kv_subject, publish_until
from crewlet.coord import buckets

STORE = "store"
COLLECTOR = "collector"
SNAPSHOTS = "snapshots"
# Seconds a write is sent again through a stream leader election.
PATIENCE = 10.0


class StoreMismatch(Exception):
    """This node's store is not the one the fleet's files are in."""


async def claim(js: JetStreamContext, identity: str, node: str) -> dict[str, Any]:
    """Record *identity* as the fleet's store if none is; the record in force.
    Raises :class:`StoreMismatch` when another store is recorded."""
    record = {"store": identity, "node": node, "at": time.time()}
    try:
        # Create-only (expecting no earlier write), through a leaf's domain too.
        await _write(js, STORE, record, headers={EXPECTED_LAST: "0"})
        return record
    except APIError as exc:
        if exc.err_code not in WRONG_LAST_SEQUENCE:
            raise
    _, raw = await buckets.last(js, buckets.OBJECTS.name, STORE, leader=True)
    try:
        found = json.loads(raw) if raw else None
    except ValueError:
        found = None
    if not isinstance(found, dict) or not isinstance(found.get("store"), str):
        raise StoreMismatch(f"the objects slot holds something that is not a store record: {raw[:80]!r}")
    if found["store"] != identity:
        raise StoreMismatch(f"this node's files store is {identity}, but the fleet's files are in "
                            f"{found['store']} (recorded by node {found.get('node')}); give every node "
                            f"the same files: section")
    return found


async def read(js: JetStreamContext, keys: tuple[str, ...] = (STORE, COLLECTOR, SNAPSHOTS),
               *, leader: bool = False) -> dict[str, Any]:
    """The slot's *keys* as ``{key: record or None}``."""
    out: dict[str, Any] = {}
    for key in keys:
        _, raw = await buckets.last(js, buckets.OBJECTS.name, key, leader=leader)
        try:
            out[key] = json.loads(raw) if raw else None
        except ValueError:
            out[key] = None
    return out


async def write_found(js: JetStreamContext, found: dict[str, Any]) -> None:
    """Keep what the collector found on its last walk."""
    await _write(js, COLLECTOR, found)


async def write_snapshots(js: JetStreamContext, manifests: list[dict[str, Any]]) -> None:
    """Name the snapshots the store holds now (newest last)."""
    await _write(js, SNAPSHOTS, {"snapshots": manifests})


async def _write(js: JetStreamContext, key: str, value: dict[str, Any], **options: Any) -> None:
    await publish_until(js, kv_subject(js, buckets.OBJECTS.name) + key,
                        json.dumps(value, separators=(",", ":")).encode(),
                        msg_id=f"objects.{key}:{uuid.uuid4().hex}",
                        deadline=time.monotonic() + PATIENCE, **options)
