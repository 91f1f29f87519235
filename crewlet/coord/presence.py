"""This node's presence: the ``node.<id>`` lease in ``leases``.

A node is alive to the fleet while its presence lease is: crewletd claims it
at boot and renews it every heartbeat (15 s; TTL 45 s). Its value says what
the node is — roles, broker kind, labels, version and protocol version, pid,
boot instance, ``max_concurrent``, start time, host and data dir — and is
what the fleet's shape, fair shares and status are computed from.

Node ids must be distinct and stable. A live presence under our id with
another boot instance is another node using our id, and we refuse to start
(:class:`DuplicateNode`, exit 78) — unless it is our own previous incarnation
(same host and data dir: we hold the data dir's lock, so that process is
dead), whose lease we take over rather than wait out its TTL; and our own
boot instance's, left by this crewletd's fleet child before it restarted.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable

from crewlet.coord.lease import Held, Leases, Owner


class DuplicateNode(Exception):
    """Another live node holds this node's id."""

    def __init__(self, node_id: str, owner: Owner):
        info = owner.info
        super().__init__(
            f"node id {node_id!r} is held by a live node: pid {info.get('pid', '?')} on "
            f"{info.get('host', '?')} (data dir {info.get('data_dir', '?')}, boot {owner.boot}); "
            f"give every node a distinct node.id / CREWLET_NODE_ID")
        self.owner = owner


def key(node_id: str) -> str:
    return f"node.{node_id}"


class Presence:
    """Claim and renew ``node.<id>``.

    *describe* returns the node's current description; it is written with
    every renewal, so changes (the revision reached) reach the fleet within
    one heartbeat.
    """

    def __init__(self, leases: Leases, node_id: str, data_dir: str,
                 describe: Callable[[], dict[str, Any]]):
        self.leases = leases
        self.node_id = node_id
        self.data_dir = data_dir
        self.describe = describe
        self.held: Held | None = None

    def _info(self) -> dict[str, Any]:
        return {**self.describe(), "host": socket.gethostname(), "data_dir": self.data_dir,
                "pid": os.getpid(), "renewed_at": time.time()}

    async def join(self) -> Held:
        """Claim our presence; raises :class:`DuplicateNode` if another node has it."""
        while True:
            held = await self.leases.claim(key(self.node_id), **self._info())
            if held is not None:
                self.held = held
                return held
            owner = await self.leases.owner(key(self.node_id))
            if owner is None:
                continue  # it lapsed between our claim and our read
            ours = owner.boot == self.leases.boot  # this crewletd, rejoining
            if not ours and (owner.info.get("host") != socket.gethostname()
                             or owner.info.get("data_dir") != self.data_dir):
                raise DuplicateNode(self.node_id, owner)
            held = await self.leases.take_over(owner, key(self.node_id), **self._info())
            if held is not None:
                self.held = held
                return held

    async def renew(self) -> Held | None:
        """Renew once; None if our presence was lost (taken, or lapsed)."""
        assert self.held is not None
        self.held = await self.leases.renew(self.held, **self._info())
        return self.held

    async def leave(self) -> None:
        """Remove our presence (a clean stop): peers see us gone at once."""
        if self.held is not None:
            await self.leases.release(self.held)
            self.held = None
