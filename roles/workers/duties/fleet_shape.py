"""Duty ``fleet_shape``: is the fleet, as assembled, able to do every job?

A role is subtracted from a node, not from the company, so a fleet can be put
together node by node into a shape where a whole job is done by nobody while
no single node's config is wrong. Every ``interval`` this duty compares live
presence with what the company needs and logs, once per change:

* ``fleet_role_unmanned`` — a role (data, ingress, seats, workers) no live
  node runs;
* ``fleet_data_on_leaf`` — a data node whose broker is a leaf (it holds no
  replica and has no vote; such a node is refused at its own boot, so this
  means mixed versions or an outside broker);
* ``fleet_replicas_short`` — fewer broker members than ``stream.replicas``:
  streams cannot place their replicas;
* ``fleet_protocol_mixed`` — live nodes speak different protocol versions;
* ``fleet_seat_unplaceable`` — seats of the company whose placement labels no
  live seats node has: nobody may hold them, so their mail waits unworked
  (the first :data:`UNPLACEABLE_SHOWN` names, and how many). Only said while
  some node runs seats (else the role is unmanned, said above).

A presence that does not say its broker kind counts as a member.

The first look waits until the watch shows this node's own presence (at most
:data:`OWN_PRESENCE_WAIT` seconds): a node's roles come up while its crewletd
joins the fleet, and a fleet judged before then is one of no nodes at all.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable

from crewlet import log
from crewlet.coord import capacity
from crewlet.coord.sweep import NodeView, SeatView, may_hold
from roles.workers.duties import Duty, going_on, rest

ROLES = ("data", "ingress", "seats", "workers")
# Names of unplaceable seats a report carries; the count says how many in all.
UNPLACEABLE_SHOWN = 20
# Seconds the first look waits for this node's own presence to show; a node
# that has not joined by then is judged as the watch shows it.
OWN_PRESENCE_WAIT = 30.0
# Seconds between looks for it meanwhile.
OWN_PRESENCE_POLL = 0.1


def seat_views(company: dict[str, Any] | None) -> list[SeatView]:
    """The seats of *company* (its document, as applied) with their placement labels."""
    return [SeatView(s["name"], dict((s.get("placement") or {}).get("labels") or {}))
            for s in (company or {}).get("seats") or []]


def unplaceable(nodes: dict[str, dict[str, Any]], seats: Iterable[SeatView]) -> list[str]:
    """The seats no live seats node in *nodes* may hold, by name; [] while no
    node runs seats at all (that is ``fleet_role_unmanned``)."""
    holders = [NodeView(i, dict(n.get("labels") or {})) for i, n in nodes.items()
               if "seats" in n.get("roles", ())]
    if not holders:
        return []
    return sorted(s.name for s in seats if not any(may_hold(s, n) for n in holders))


def problems(nodes: dict[str, dict[str, Any]], replicas: int,
             seats: Iterable[SeatView] = ()) -> dict[str, dict[str, Any]]:
    """The shape errors in *nodes* (node id -> presence info) for the
    company's *seats*, by event name."""
    found: dict[str, dict[str, Any]] = {}
    unmanned = [r for r in ROLES if not any(r in n.get("roles", ()) for n in nodes.values())]
    if unmanned:
        found["fleet_role_unmanned"] = {"roles": unmanned, "nodes": sorted(nodes)}
    on_leaf = sorted(i for i, n in nodes.items()
                     if "data" in n.get("roles", ()) and n.get("broker") == "leaf")
    if on_leaf:
        found["fleet_data_on_leaf"] = {"nodes": on_leaf}
    if capacity.short_of_replicas(nodes, replicas) is not None:
        found["fleet_replicas_short"] = {"members": capacity.members(nodes), "replicas": replicas}
    protocols = sorted({n.get("protocol") for n in nodes.values() if n.get("protocol") is not None})
    if len(protocols) > 1:
        found["fleet_protocol_mixed"] = {
            "protocols": protocols,
            "nodes": {i: n.get("protocol") for i, n in sorted(nodes.items())}}
    nobody = unplaceable(nodes, seats)
    if nobody:
        found["fleet_seat_unplaceable"] = {"seats": nobody[:UNPLACEABLE_SHOWN], "count": len(nobody)}
    return found


async def _own_presence(ctx) -> None:
    """Until the lease watch shows this node's presence, or :data:`OWN_PRESENCE_WAIT`."""
    await ctx.holders.listed.wait()
    own = f"node.{ctx.config.node.id}"
    deadline = asyncio.get_running_loop().time() + OWN_PRESENCE_WAIT
    while ctx.holders.get(own) is None and asyncio.get_running_loop().time() < deadline and going_on():
        await asyncio.sleep(OWN_PRESENCE_POLL)


async def run(ctx) -> None:
    reported: dict[str, dict[str, Any]] = {}
    await _own_presence(ctx)
    while going_on():
        nodes = {key.removeprefix("node."): owner.info for key, owner in ctx.holders.of("node.").items()}
        company = ctx.company()
        seats = [SeatView(s.name, dict(s.placement.labels)) for s in company.seats] if company else ()
        now = problems(nodes, ctx.config.stream.replicas, seats)
        for name, detail in now.items():
            if reported.get(name) != detail:
                log.event(name, "warning", **detail)
        for name in reported.keys() - now.keys():
            log.event(name.replace("fleet_", "fleet_resolved_", 1), **{"was": reported[name]})
        reported = now
        await rest(ctx.interval)


DUTY = Duty("fleet_shape", run)
