"""The data_applier role: applies the estate log into this node's LMDB copy.

It is the one writer of the node's LMDB environment (``<data_dir>/estate``)
and binds the node's ``estate`` (ROUTER) and ``applied`` (PUB) endpoints.
Applying the log arrives with the estate issue; today the environment is
opened, the endpoints are bound, and an estate request is answered with an
error saying the estate is not served yet — never silence.
"""

from __future__ import annotations

import asyncio
import os

import lmdb
import zmq

from crewlet import ipc
from crewlet.runtime import RoleContext

MAP_SIZE = 1 << 34  # address space only; LMDB grows the file as it is written


def _bind(ctx: RoleContext, kind: int, name: str):
    sock = ctx.zmq.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    path = os.path.join(ctx.run_dir, name)
    if os.path.exists(path):
        os.unlink(path)  # a previous incarnation's; only one applier per node
    sock.bind(ipc.endpoint(ctx.run_dir, name))
    return sock


async def _serve_estate(sock) -> None:
    while True:
        frames = await sock.recv_multipart()
        try:
            req = ipc.unpack(frames[-1])
        except Exception:
            req = {}
        reply = {"id": req.get("id"), "ok": False, "error": "the estate is not served yet"}
        await sock.send_multipart([*frames[:-1], ipc.pack(reply)])


async def main(ctx: RoleContext) -> None:
    path = os.path.join(ctx.config.data_dir, "estate")
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(path, map_size=MAP_SIZE, max_dbs=32, subdir=True)
    try:
        estate = _bind(ctx, zmq.ROUTER, "estate")
        _bind(ctx, zmq.PUB, "applied")  # nothing to publish yet; closed with the context
        server = asyncio.create_task(_serve_estate(estate))
        await ctx.ready()
        await ctx.stopping.wait()
        server.cancel()
    finally:
        env.close()
