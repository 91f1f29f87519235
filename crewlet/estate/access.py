"""A process's way to the estate, made the same way in every role that needs one.

The seats role (its tools), crewletd (crewletctl's ``tasks``, ``pages`` and
``search``) and any later surface build an :class:`EstateAccess` from the
node's config and their one NATS connection:

* the :class:`~crewlet.estate.view.EstateView` of the fleet's data nodes;
* on a data node, the :class:`~crewlet.estate.local.LocalCopy` — this node's
  copy, read in this process; a node without data has none and asks peers;
* the node's shared :class:`~crewlet.estate.floor.NodeFloor`, so what one of
  the node's processes wrote, any other reads;
* the :class:`~crewlet.estate.router.Router` over all three.
"""

from __future__ import annotations

import asyncio

from crewlet import log
from crewlet.config import NodeConfig
from crewlet.estate.floor import NodeFloor
from crewlet.estate.local import LocalCopy
from crewlet.estate.router import Router
from crewlet.estate.view import EstateView
from crewlet.groups import DATA_ROLE


class EstateAccess:
    """Invariant: ``router`` is usable once :meth:`start` returned; nothing
    here outlives :meth:`close`."""

    def __init__(self, cfg: NodeConfig, nc, js, zctx, *, holders=None):
        # holders: the process's one watch of leases, which the view then reads
        # its presences from (crewlet.estate.view); its maker runs it.
        self.view = EstateView(js, holders=holders)
        self.local = (LocalCopy(zctx, node_id=cfg.node.id, run_dir=cfg.run_dir, data_dir=cfg.data_dir)
                      if DATA_ROLE in cfg.node.roles else None)
        self.floor = NodeFloor(cfg.data_dir)
        self.router = Router(nc, node_id=cfg.node.id, view=self.view, local=self.local, node_floor=self.floor,
                             js=js)
        self._view_task: asyncio.Task | None = None

    def start(self) -> "EstateAccess":
        if self.local is not None:
            self.local.start()
        self._view_task = asyncio.create_task(self._watch(), name="estate view")
        return self

    async def _watch(self) -> None:
        try:
            await self.view.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the router then asks with what it last knew
            log.event("estate_view_failed", "error", error=f"{type(exc).__name__}: {exc}")

    async def close(self) -> None:
        if self._view_task is not None:
            self._view_task.cancel()
            await asyncio.gather(self._view_task, return_exceptions=True)
        if self.local is not None:
            await self.local.close()
        self.floor.close()
