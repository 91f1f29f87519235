"""Which data nodes the fleet has and how each is doing: the router's view.

The router asks data nodes in an order (:mod:`crewlet.estate.router`), and
passes over those that could not answer; this module keeps, in memory, what
that order is made from. It is kept by KV watchers over the process's one
NATS connection (DESIGN §4), so the router decides from memory at once,
without asking the broker first:

=========  ================  ================================================
bucket     keys              says
=========  ================  ================================================
leases     ``node.<id>``     the node is alive (its presence lease), its
                             roles — a node with the ``data`` role holds a
                             copy —, its broker kind and its protocol
                             version (which log subjects its applier reads:
                             :meth:`Router.to_log
                             <crewlet.estate.router.Router.to_log>`)
status     ``estate.<id>``   the node's applier's record, written every 2 s:
                             applied seq, in service or not and why, when
status     ``evicted.<id>``  present: the operator evicted the node (why)
=========  ================  ================================================

A data node is **in service** while its applier says so, its record is at
most :data:`STATUS_STALE` seconds old (older: the applier stopped writing
it, so it is taken for stopped) and it is not evicted. A data node is
**lagging** when its applied seq is more than :data:`LAG_OPS` behind the
highest applied seq among the data nodes: the router asks it after the
others (reference, "How a request reaches the estate").

A node without a presence lease is no data node, whatever its last status
record says: a node that left or lapsed is not asked.

Given the process's :class:`~crewlet.coord.holders.Holders` (which already
follows ``leases``), the view reads the presences from it rather than keep a
watch of its own: one consumer fewer on ``KV_leases`` per process (issue 10's
rule, DESIGN §4). Whoever made the holders runs them.

:meth:`EstateView.of` makes a view from given states, for code (and tests)
that decide an order without a broker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from crewlet.coord.buckets import LEASES, STATUS, follow
from crewlet.groups import DATA_ROLE

# The applier writes its record every 2 s: five missed writes mean it is not
# running (or cannot reach the broker), and its copy is taken out of service.
STATUS_STALE = 10.0
# A copy this many ops behind the furthest one is asked after the others:
# it would most likely answer "behind" to a floor, or answer stale reads.
LAG_OPS = 1000

NODE_KEYS = "node.*"
ESTATE_KEYS = "estate.*"
EVICTED_KEYS = "evicted.*"

NO_RECORD = "no applier record"
# A copy whose applier is not running: the one spelling of it (the local copy
# and the applier say it too, crewletctl shows it).
STOPPED = "applier stopped"


@dataclass(frozen=True)
class NodeState:
    """One data node, as the router sees it."""

    id: str
    in_service: bool
    reason: str | None = None     # why not in service (None when it is)
    applied: int = 0              # its applier's last recorded applied seq
    at: float | None = None       # wall-clock time of that record
    lagging: bool = False         # more than LAG_OPS behind the furthest copy
    broker: str | None = None     # member | leaf | external, from its presence
    protocol: int | None = None   # crewlet.PROTOCOL_VERSION, from its presence (None: says none)


def _state(node: str, presence: dict[str, Any], record: dict[str, Any] | None,
           evicted: dict[str, Any] | None, now: float) -> NodeState:
    """A data node's state from its presence, applier record and eviction."""
    applied = int((record or {}).get("applied") or 0)
    at = (record or {}).get("at")
    broker, protocol = presence.get("broker"), presence.get("protocol")
    if not isinstance(protocol, int) or isinstance(protocol, bool):
        protocol = None  # a presence that says none, or something else: older than saying it
    if evicted is not None:
        why = evicted.get("reason") or "no reason given"
        return NodeState(node, False, f"node evicted: {why}", applied, at, broker=broker, protocol=protocol)
    if record is None:
        return NodeState(node, False, NO_RECORD, 0, None, broker=broker, protocol=protocol)
    if not isinstance(at, (int, float)) or now - at > STATUS_STALE:
        return NodeState(node, False, STOPPED, applied, at, broker=broker, protocol=protocol)
    if not record.get("in_service"):
        return NodeState(node, False, record.get("reason") or "out of service", applied, at,
                         broker=broker, protocol=protocol)
    return NodeState(node, True, None, applied, at, broker=broker, protocol=protocol)


def with_lag(states: Iterable[NodeState]) -> list[NodeState]:
    """*states* with ``lagging`` set from the furthest applied seq among them."""
    states = list(states)
    top = max((s.applied for s in states), default=0)
    return [s if (top - s.applied > LAG_OPS) == s.lagging else
            dataclasses.replace(s, lagging=top - s.applied > LAG_OPS)
            for s in states]


class EstateView:
    """The data nodes and their states, kept by watchers (:meth:`run`)."""

    def __init__(self, js, *, clock: Callable[[], float] = time.time, holders=None):
        self.js = js
        self.clock = clock
        self.holders = holders                           # the presences' source, if given
        self._presence: dict[str, dict[str, Any]] = {}   # node -> its presence value (no holders)
        self._records: dict[str, dict[str, Any]] = {}    # node -> its applier's record
        self._evicted: dict[str, dict[str, Any]] = {}    # node -> eviction record
        self._fixed: list[NodeState] | None = None
        self._listed: set[str] = set()                   # watches whose first listing is done
        self._ready = asyncio.Event()

    @classmethod
    def of(cls, states: Iterable[NodeState]) -> "EstateView":
        """A view that always answers *states* (lag computed among them)."""
        view = cls(None)
        view._fixed = with_lag(states)
        view._ready.set()
        return view

    # ------------------------------------------------------------ answers

    def data_nodes(self) -> list[NodeState]:
        """Every data node with a live presence, by id."""
        if self._fixed is not None:
            return list(self._fixed)
        now = self.clock()
        return with_lag(
            _state(node, presence, self._records.get(node), self._evicted.get(node), now)
            for node, presence in sorted(self._presences().items())
            if DATA_ROLE in (presence.get("roles") or ()))

    def _presences(self) -> dict[str, dict[str, Any]]:
        if self.holders is None:
            return self._presence
        return {key[len("node."):]: owner.info for key, owner in self.holders.of("node.").items()}

    def record(self, node: str) -> dict[str, Any] | None:
        """*node*'s applier record (``status`` ``estate.<node>``), as written."""
        return self._records.get(node)

    def eviction(self, node: str) -> dict[str, Any] | None:
        """*node*'s eviction (``status`` ``evicted.<node>``), None when it is not evicted."""
        return self._evicted.get(node)

    def state(self, node: str) -> NodeState | None:
        return next((s for s in self.data_nodes() if s.id == node), None)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """True once every watch has listed what the buckets hold (False on timeout)."""
        # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a
        # cancellation that arrives as the awaited thing completes.
        try:
            async with asyncio.timeout(timeout):
                await self._ready.wait()
            return True
        except TimeoutError:
            return False

    # ------------------------------------------------------------ watching

    async def run(self) -> None:
        """Watch the buckets until cancelled."""
        if self._fixed is not None:
            return
        async with asyncio.TaskGroup() as group:
            if self.holders is None:
                group.create_task(self._watch(LEASES.name, NODE_KEYS, self._presence))
            else:
                group.create_task(self._holders_listed())
            group.create_task(self._watch(STATUS.name, ESTATE_KEYS, self._records))
            group.create_task(self._watch(STATUS.name, EVICTED_KEYS, self._evicted))

    async def _holders_listed(self) -> None:
        await self.holders.listed.wait()
        self._listed_one(f"{LEASES.name}/{NODE_KEYS}")

    async def _watch(self, bucket: str, keys: str, into: dict[str, dict[str, Any]]) -> None:
        """Keep *into* (node id -> JSON value) equal to *bucket*'s *keys*, for
        ever: each watch's listing replaces what was known (a key deleted
        while nobody watched is forgotten too), then its changes apply."""
        name = f"{bucket}/{keys}"
        listing: dict[str, dict[str, Any]] | None = None  # a watch's first listing, while it lasts

        def opened() -> None:
            nonlocal listing
            listing = {}

        def seen(entry) -> None:
            _seen(entry, listing if listing is not None else into)

        def listed() -> None:
            nonlocal listing
            if listing is not None:
                into.clear()
                into.update(listing)
                listing = None
                self._listed_one(name)

        await follow(lambda: self.js.key_value(bucket), keys, seen, opened=opened, listed=listed,
                     name=f"estate view {name}")

    def _listed_one(self, name: str) -> None:
        self._listed.add(name)
        if len(self._listed) == 3:
            self._ready.set()


def _seen(entry, into: dict[str, dict[str, Any]]) -> None:
    """One watched KV entry into *into*: a value kept, a delete or expiry forgotten."""
    node = entry.key.split(".", 1)[1]
    if entry.operation is not None or not entry.value:
        into.pop(node, None)
        return
    try:
        value = json.loads(entry.value)
    except ValueError:
        return
    if isinstance(value, dict):
        into[node] = value
