"""What the API's routes reach: one :class:`Front` per ingress process.

Made by :func:`roles.ingress.main` after the child connected, put on
``app.state.front``; a route gets it with :func:`front`. Everything here
uses the ingress child's own NATS connection: ingress asks crewletd only
for its own children and readiness, and for what only crewletd may write
(a drain order: :meth:`Front.ask_node`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from crewlet import disk, ipc
from crewlet.company.model import Company
from crewlet.config import NodeConfig
from roles.ingress.problems import Problem


@dataclass
class Front:
    cfg: NodeConfig
    nc: Any                      # the child's NATS connection
    js: Any                      # JetStream over it
    mailboxes: Any               # crewlet.queue.jetstream.JetStreamMailboxes
    router: Any                  # crewlet.estate.router.Router (EstateAccess's)
    projection: Any              # roles.ingress.projection.Projection
    control_plane: Any           # crewlet.coord.control_plane.ControlPlane (None until opened)
    company: Company | None = None
    seat_names: frozenset[str] = frozenset()  # the company's seats (a lookup per request, at any size)
    metrics: Any = None          # roles.ingress.metrics.Metrics
    conductor: Any = None        # crewlet.conversations.driver.Conductor: runs driven here
    space: disk.Watch | None = field(default=None)  # this node's disk (made from cfg)
    zctx: Any = None             # the child's ZeroMQ context: how it asks crewletd (ask_node)
    vault: Any = None            # crewlet.vault.Vault: the webhook secrets named by the company

    def __post_init__(self) -> None:
        if self.space is None:
            self.space = disk.Watch.of(self.cfg)

    @property
    def node_id(self) -> str:
        return self.cfg.node.id

    async def ask_node(self, op: str, timeout: float = 5.0, **args: Any) -> dict[str, Any]:
        """Ask this node's crewletd *op* (supervisor/control.py) for the API: its
        result; a refusal is a 409 naming why (404 for what is not there), no
        answer a 503."""
        try:
            reply = await ipc.acall(self.zctx, self.cfg.run_dir, op, timeout=timeout, **args)
        except ipc.NodeUnreachable as exc:
            raise Problem(503, "node_unreachable", str(exc), headers={"Retry-After": "2"}) from None
        if not reply.get("ok"):
            if reply.get("code") == "not_found":
                raise Problem(404, "not_found", str(reply.get("error")))
            raise Problem(409, "refused", str(reply.get("error") or "refused"))
        return reply.get("result") or {}

    def need_company(self) -> Company:
        if self.company is None:
            raise Problem(503, "no_company", "no company is applied yet: POST /v1/company, or "
                                             "crewletctl apply FILE", headers={"Retry-After": "5"})
        return self.company

    def set_company(self, company: Company) -> None:
        self.company = company
        self.seat_names = frozenset(s.name for s in company.seats)

    def need_space(self, what: str) -> None:
        """A 507 naming the path and its free bytes while this node's disk is
        below node.disk_floor (crewlet.disk): refused, not a publish that times out."""
        try:
            self.space.refuse_if_low(what)
        except disk.NoSpace as exc:
            raise Problem(507, "insufficient_storage", str(exc), headers={"Retry-After": "30"}) from None

    def need_seat(self, seat: str) -> str:
        company = self.need_company()
        if seat not in self.seat_names:
            raise Problem(404, "no_such_seat", f"no seat named {seat!r} in company "
                                               f"{company.company.name}")
        return seat


def front(request: Request) -> Front:
    return request.app.state.front
