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
* ``fleet_protocol_mixed`` — live nodes speak different protocol versions.

A presence that does not say its broker kind counts as a member.
"""

from __future__ import annotations

import asyncio
from typing import Any

from crewlet import log
from roles.workers.duties import Duty

ROLES = ("data", "ingress", "seats", "workers")


def problems(nodes: dict[str, dict[str, Any]], replicas: int) -> dict[str, dict[str, Any]]:
    """The shape errors in *nodes* (node id -> presence info), by event name."""
    found: dict[str, dict[str, Any]] = {}
    unmanned = [r for r in ROLES if not any(r in n.get("roles", ()) for n in nodes.values())]
    if unmanned:
        found["fleet_role_unmanned"] = {"roles": unmanned, "nodes": sorted(nodes)}
    on_leaf = sorted(i for i, n in nodes.items()
                     if "data" in n.get("roles", ()) and n.get("broker") == "leaf")
    if on_leaf:
        found["fleet_data_on_leaf"] = {"nodes": on_leaf}
    members = sorted(i for i, n in nodes.items() if n.get("broker", "member") == "member")
    if any(n.get("broker", "member") != "external" for n in nodes.values()) \
            and len(members) < replicas:
        found["fleet_replicas_short"] = {"members": members, "replicas": replicas}
    protocols = sorted({n.get("protocol") for n in nodes.values() if n.get("protocol") is not None})
    if len(protocols) > 1:
        found["fleet_protocol_mixed"] = {
            "protocols": protocols,
            "nodes": {i: n.get("protocol") for i, n in sorted(nodes.items())}}
    return found


async def run(ctx) -> None:
    reported: dict[str, dict[str, Any]] = {}
    await ctx.holders.listed.wait()
    while True:
        nodes = {key.removeprefix("node."): owner.info for key, owner in ctx.holders.of("node.").items()}
        now = problems(nodes, ctx.config.stream.replicas)
        for name, detail in now.items():
            if reported.get(name) != detail:
                log.event(name, "warning", **detail)
        for name in reported.keys() - now.keys():
            log.event(name.replace("fleet_", "fleet_resolved_", 1), **{"was": reported[name]})
        reported = now
        await asyncio.sleep(ctx.interval)


DUTY = Duty("fleet_shape", run)
