"""Draining a node: the operator's order, and what a drained node looks like.

A node is taken out of service without stopping it (DESIGN §16): it stops
claiming, hands its seats over as a graceful stop does (NAKs: the successor
has the mail at once), lets its running turns finish up to a deadline, gives
up its duties and the conversations it drives, and answers ``/readyz`` 503
``draining``. It keeps its broker and its copy of the estate.

The order is a key of the ``status`` bucket, ``drain.<node>`` (JSON
:class:`Order`), which crewletd writes for ``crewletctl drain`` and the API
(``POST /v1/fleet/nodes/{id}/drain``) — from any node, whether or not the
drained one is up — and deletes for ``undrain``. It outlives the node's
restarts: a node drained, stopped, upgraded and started again comes back
drained, which is what a rolling upgrade needs (drain, stop, upgrade,
start, undrain, node by node).

The drained node's crewletd follows its order and says it in its presence
(``draining``: :meth:`Order.presence`), renewed at once when the order
changes. Everything else reads it from there — the node's own roles and
every peer, from the one watch of ``leases`` each process keeps:

* a peer's seat sweep no longer counts the node among the seats-nodes, so
  the fair share grows and the seats it hands over are claimed at once;
* the node's own sweep claims nothing, and releases each seat whose turn is
  not running, every sweep; a seat still in a turn at :attr:`Order.until`
  is released all the same (the turn is cut short and its mail NAKed);
* its duty runner gives up its duties and claims none;
* its session runner takes no run; runs it drives are left to end until the
  deadline, then let go, for a session runner elsewhere to take over;
* its ingress starts no run (503 ``node_draining``) and is not ready.

The node is **drained** once it holds nothing: no seat, duty or
conversation lease (:func:`holds_nothing`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

KEY = "drain."  # + node id, in the status bucket: present = drained by the operator
KEYS = KEY + "*"
# What a drain order without a deadline of its own gives running turns:
# Tier A fleet.drain_deadline (crewlet.config.model.FleetSection) is the default.
DEADLINE_MAX = 86400.0  # a day: a turn running longer is cut short by max_turn long before


@dataclass(frozen=True)
class Order:
    """A drain order. ``at``: when it was given (wall clock, the writer's);
    ``deadline``: seconds running turns and driven runs are given after
    ``at``; ``by``: who gave it (``crewletctl@<node>``, ``api:<token name>``)."""

    at: float
    deadline: float
    by: str

    @property
    def until(self) -> float:
        """When turns still running are cut short (wall clock)."""
        return self.at + self.deadline

    def record(self) -> bytes:
        return json.dumps({"at": self.at, "deadline": self.deadline, "by": self.by}).encode()

    def presence(self) -> dict[str, Any]:
        """What the node's presence says of it (``draining``)."""
        return {"since": self.at, "until": self.until, "by": self.by}


class BadOrder(ValueError):
    """A ``drain.<node>`` value that is not an order (written by hand, or damaged)."""


def new(deadline: float, by: str, now: float | None = None) -> Order:
    if not (isinstance(deadline, (int, float)) and math.isfinite(deadline)
            and 0 <= deadline <= DEADLINE_MAX):
        raise BadOrder(f"deadline must be a number of seconds in [0, {DEADLINE_MAX:g}], got {deadline!r}")
    return Order(time.time() if now is None else now, float(deadline), by)


def parse(value: bytes) -> Order:
    """The order in a ``drain.<node>`` value; :class:`BadOrder` if it is none.
    What arrives from the bucket is checked like any other input."""
    try:
        doc = json.loads(value)
    except ValueError as exc:
        raise BadOrder(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadOrder("not an object")
    at, deadline, by = doc.get("at"), doc.get("deadline"), doc.get("by", "?")
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
        raise BadOrder(f"at must be a time, got {at!r}")
    if not isinstance(by, str):
        raise BadOrder(f"by must be a string, got {by!r}")
    if isinstance(deadline, bool):  # JSON's true is no number of seconds
        raise BadOrder(f"deadline must be a number of seconds, got {deadline!r}")
    return new(deadline, by, now=at)


def draining(info: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``draining`` a presence's value carries (None: not draining)."""
    value = (info or {}).get("draining")
    return value if isinstance(value, dict) else None


def past_deadline(info: dict[str, Any] | None, now: float | None = None) -> bool:
    """Is a draining node past its order's deadline (running turns cut short)?"""
    value = draining(info)
    if value is None:
        return False
    until = value.get("until")
    return isinstance(until, (int, float)) and (time.time() if now is None else now) >= until


def holds_nothing(node: dict[str, Any]) -> bool:
    """A node row of the fleet view (crewletctl status) holding no seat, duty
    or conversation: drained, once it is draining."""
    return not node.get("seats") and not node.get("duties") and not node.get("conversations")


def state(node: dict[str, Any]) -> str | None:
    """``draining`` | ``drained`` for a node row of the fleet view; None when it serves."""
    if draining(node) is None:
        return None
    return "drained" if holds_nothing(node) else "draining"


class Orders:
    """Every node's drain order, as one watch of ``status`` ``drain.*`` sees
    them (:func:`crewlet.coord.buckets.follow`'s ``opened``/``seen``/
    ``listed``). ``changed(node, order)`` is called when a node's order
    appears, changes or goes (order None), a listing's differences included.

    Invariant: ``orders`` is every valid order as of the last entry seen,
    once a listing was put in force; ``_next`` is the listing being filled.
    """

    def __init__(self, changed=lambda node, order: None, refused=lambda node, error: None):
        self.orders: dict[str, Order] = {}
        self._next: dict[str, Order] | None = None
        self.changed = changed
        self.refused = refused

    def opened(self) -> None:
        self._next = {}

    def listed(self) -> None:
        fresh, self._next = self._next or {}, None
        old, self.orders = self.orders, fresh
        for node in sorted(set(old) | set(fresh)):
            if old.get(node) != fresh.get(node):
                self.changed(node, fresh.get(node))

    def seen(self, entry) -> None:
        node = entry.key.removeprefix(KEY)
        target = self._next if self._next is not None else self.orders
        was = target.get(node)
        if entry.operation is not None or not entry.value:
            target.pop(node, None)
            order = None
        else:
            try:
                order = parse(entry.value)
            except BadOrder as exc:
                self.refused(node, str(exc))
                return  # what was in force stays
            target[node] = order
        if target is self.orders and was != order:
            self.changed(node, order)
