"""What the ``scheduler`` duty last fired, per schedule: ``status/schedule.<name>``.

One key per schedule in the ``status`` bucket (beside each node's
``node.<id>``), JSON::

    {"spec": "cron 0 9 * * 1-5 Europe/Paris",  # the timing these times belong to
     "start": 1741590000.0,     # when the duty first saw the schedule with this spec
     "settled": 1741597200.0,   # every tick up to this scheduled time is fired or skipped
     "fired": 1741597200.0,     # the scheduled time of the last tick fired (null: none yet)
     "trigger": "daily-standup=20250310T090000Z",  # its trigger id
     "fired_at": 1741597200.4,  # when its mail was sent (wall clock)
     "node": "n1", "token": 412, "at": ...}        # who wrote this record, under which token

**Fenced.** Every write is a compare-and-set on the key's last sequence, and
carries the writer's fencing token (of ``duty.scheduler``). A writer that
finds a record of a larger token has been deposed: :class:`Deposed`, and it
writes nothing. So of two holders overlapping at a hand-over the older's
write loses — whichever lands first, the other's compare-and-set fails,
and the re-read tells the older one it lost. A record changed by a writer of
the same or a smaller token is :class:`Conflict`: the caller reads it again
and decides anew (its writer's duty has moved on, or an operator rewound it).

Writes are plain publishes on :func:`crewlet.bus.kv_subject`, answered from a
leaf too, resent under one message id through a leader election.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import APIError

from crewlet.bus import Unanswered, kv_subject, publish_until
from crewlet.coord.buckets import STATUS, last, subjects
from crewlet.bus import EXPECTED_LAST as _EXPECTED_LAST
from crewlet.bus import WRONG_LAST_SEQUENCE as _WRONG_LAST_SEQUENCE

PREFIX = "schedule."
# Seconds an unanswered write is resent (a stream leader election takes ~5-6 s).
PATIENCE = 10.0


class FiredError(Exception):
    """A record could not be read or written (no quorum, no answer)."""


class Conflict(FiredError):
    """The record changed since it was read, not by a later holder: read it again."""


class Deposed(Exception):
    """A record holds a larger fencing token than ours: another holder runs the schedules."""


def _load(data: bytes | None) -> dict[str, Any] | None:
    if not data:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class Fired:
    """Read and write the records over one JetStream context."""

    def __init__(self, js: JetStreamContext):
        self.js = js
        self._put = kv_subject(js, STATUS.name)

    async def read(self, name: str) -> tuple[int, dict[str, Any] | None]:
        """(the key's last sequence or 0, the record or None), from the stream's leader."""
        try:
            seq, data = await last(self.js, STATUS.name, PREFIX + name, leader=True)
        except Exception as exc:
            raise FiredError(f"reading {STATUS.name}/{PREFIX}{name}: {type(exc).__name__}: {exc}") from exc
        return seq, _load(data)

    async def all(self) -> dict[str, dict[str, Any]]:
        """Every schedule's record, by name (those of schedules since removed too)."""
        try:
            keys = await subjects(self.js, STATUS.name, PREFIX + ">")
        except Exception as exc:
            raise FiredError(f"listing {STATUS.name}/{PREFIX}*: {type(exc).__name__}: {exc}") from exc
        out = {}
        for key in keys:
            name = key.removeprefix(PREFIX)
            _, record = await self.read(name)
            if record is not None:
                out[name] = record
        return out

    async def write(self, name: str, record: dict[str, Any], *, expected: int, token: int,
                    node: str) -> tuple[int, dict[str, Any]]:
        """Write *record* (stamped with *node*, *token* and the time) if the
        key's last sequence is still *expected*; (the new sequence, the record
        as written).

        A lost compare-and-set re-reads: a record of a larger token raises
        :class:`Deposed`, any other :class:`Conflict` (the caller reads the
        record again and decides anew: what it meant to write was decided
        on a record that is no longer there)."""
        value = {**record, "node": node, "token": token, "at": time.time()}
        data = json.dumps(value, separators=(",", ":")).encode()
        key = PREFIX + name
        try:
            ack = await publish_until(self.js, self._put + key, data, msg_id=f"{key}:{uuid.uuid4().hex}",
                                      headers={_EXPECTED_LAST: str(expected)},
                                      deadline=time.monotonic() + PATIENCE)
            return ack.seq, value
        except APIError as exc:
            if exc.err_code not in _WRONG_LAST_SEQUENCE:
                raise FiredError(f"writing {STATUS.name}/{key}: {exc}") from exc
        except Unanswered as exc:
            raise FiredError(f"writing {STATUS.name}/{key}: {exc}") from exc
        except Exception as exc:
            raise FiredError(f"writing {STATUS.name}/{key}: {type(exc).__name__}: {exc}") from exc
        # Somebody wrote in between — or quorum is lost, which answers the
        # same (DESIGN §4): look before deciding.
        _, there = await self.read(name)
        if there is not None and int(there.get("token") or 0) > token:
            raise Deposed(f"{key} was written under token {there.get('token')} by {there.get('node')}; "
                          f"ours is {token}")
        raise Conflict(f"{key} changed since it was read (now by {(there or {}).get('node')}, "
                       f"token {(there or {}).get('token')})")
