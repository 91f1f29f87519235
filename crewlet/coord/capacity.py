"""The capacity handshake: whether a fleet change leaves the estate its copies
and the streams their replicas.

Two rules, read off the presence leases (``node.<id>`` in ``leases``):

* **Broker members.** The streams keep ``stream.replicas`` copies on the
  broker's members. A presence counts as a member by its broker kind, whatever
  its roles — a node without data on an embedded member still holds replicas
  and votes — and a presence that does not say its kind counts as one (an
  older node: better to wait for one more than to trim under a member that
  does hold a replica). A leaf holds none; an external broker's replicas are
  its own business (roles/workers/duties/fleet_shape.py says the same rule,
  through here).
* **Copies in service.** The trim, the eviction gate and the search fan-out
  count data nodes only (a stateless node has no copy), by the estate's view
  of each copy (crewlet.estate.view).

The changes that ask: the log's trim refuses while the live broker members
are fewer than ``stream.replicas`` (a member that is away comes back needing
what it missed from the log, and a trim would leave a stream that cannot be
made whole); an eviction refuses to take the last copy in service.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

MEMBER, EXTERNAL = "member", "external"


def is_member(presence: Mapping[str, Any]) -> bool:
    """Does this presence count as a broker member (holding replicas)? Its
    broker kind says ``member``, or it says none."""
    return presence.get("broker", MEMBER) == MEMBER


def members(presences: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The live presences that count as broker members, by id."""
    return sorted(node for node, info in presences.items() if is_member(info))


def short_of_replicas(presences: Mapping[str, Mapping[str, Any]], replicas: int) -> str | None:
    """Why the streams are short of their replicas now (None: they are not).
    A fleet whose every node uses an external broker is never short here:
    its replicas are that broker's business."""
    if presences and all(info.get("broker") == EXTERNAL for info in presences.values()):
        return None
    live = members(presences)
    if len(live) >= replicas:
        return None
    return (f"the streams keep {replicas} replicas but {len(live)} broker member"
            f"{'' if len(live) == 1 else 's'} {'is' if len(live) == 1 else 'are'} live"
            f"{' (' + ', '.join(live) + ')' if live else ''}")


def eviction_refused(copies: Iterable[Any], target: str) -> str | None:
    """Why evicting *target*'s copy is refused (None: it may go): it is the
    last copy in service. *copies* are the data nodes' states (``id``,
    ``in_service``)."""
    copies = list(copies)
    serving = [c.id for c in copies if c.in_service]
    if serving == [target]:
        return (f"node {target} holds the only copy of the estate in service: evicted, the fleet "
                f"would have none (add a data node, or bring another copy back, first)")
    return None
