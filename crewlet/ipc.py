"""ZeroMQ between the processes of one node (DESIGN §3).

Every endpoint is an ``ipc://`` socket in the node's run directory
(``<data_dir>/run``, mode 0700). Frames are msgpack maps. A request carries an
``id`` and a ``deadline`` (wall-clock seconds); its reply carries the same
``id``.

========  ============  ========  =================================================
endpoint  bound by      pattern   carries
========  ============  ========  =================================================
control   crewletd      ROUTER    crewletctl and children: status, restart, stop
health    crewletd      PULL      children's heartbeats, ready / stopping
events    crewletd      PUB       node-local state changes (child started/exited)
estate    data_applier  ROUTER    this node's estate reads and writes
applied   data_applier  PUB       the log sequence applied so far
========  ============  ========  =================================================

A child that asks crewletd often keeps one socket for it (:class:`Caller`):
a socket and a connection made per ask cost both processes more than the ask.

A ZeroMQ context never survives a fork: every process makes its own, after it
is forked.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from crewlet import private

ENDPOINTS = ("control", "health", "events", "estate", "applied")

# sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class NodeUnreachable(Exception):
    """No crewletd answered on a control endpoint."""


def endpoint(run_dir: str, name: str) -> str:
    """The ``ipc://`` address of endpoint *name* in *run_dir*."""
    assert name in ENDPOINTS, name
    return "ipc://" + os.path.join(run_dir, name)


def ensure_run_dir(run_dir: str) -> None:
    """Create the run directory, owner-only, and check socket paths fit AF_UNIX."""
    longest = max(len(os.fsencode(os.path.join(run_dir, n))) for n in ENDPOINTS)
    if longest > MAX_SOCKET_PATH:
        raise ValueError(f"run directory {run_dir} makes unix socket paths of {longest} bytes; "
                         f"at most {MAX_SOCKET_PATH} fit")
    private.make_dir(run_dir)
    os.chmod(run_dir, private.DIR_MODE)


def bind(ctx: zmq.asyncio.Context, run_dir: str, kind: int, name: str, *, linger: int = 0):
    """A socket of *kind* bound to endpoint *name* in *run_dir*. A socket file
    left there is removed first: only its one owner binds an endpoint (crewletd,
    holding the run dir's lock, or the node's one applier), so a file there is
    a dead predecessor's."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger)
    path = os.path.join(run_dir, name)
    if os.path.exists(path):
        os.unlink(path)
    sock.bind(endpoint(run_dir, name))
    return sock


def pack(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpack(frame: bytes) -> dict[str, Any]:
    return msgpack.unpackb(frame, raw=False)


def request_message(op: str, timeout: float, **args: Any) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "op": op, "deadline": time.time() + timeout, "args": args}


def call(run_dir: str, op: str, timeout: float = 3.0, **args: Any) -> dict[str, Any]:
    """Send one control request and wait for its reply (blocking; for crewletctl).

    Raises :class:`NodeUnreachable` when nothing answers before *timeout*.
    """
    path = os.path.join(run_dir, "control")
    if not os.path.exists(path):
        raise NodeUnreachable(f"no control socket at {path}")
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint(run_dir, "control"))
        msg = request_message(op, timeout, **args)
        sock.send_multipart([b"", pack(msg)])
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(int(left * 1000) + 1):
                break
            reply = unpack(sock.recv_multipart()[-1])
            if reply.get("id") == msg["id"]:
                return reply
        raise NodeUnreachable(f"nothing answered on {endpoint(run_dir, 'control')} within {timeout:g}s")
    finally:
        sock.close()


async def acall(ctx: zmq.asyncio.Context, run_dir: str, op: str, timeout: float = 2.0,
                **args: Any) -> dict[str, Any]:
    """The asyncio form of :func:`call`, for children asking crewletd."""
    sock = _control_socket(ctx, run_dir)
    try:
        return await _ask(sock, op, timeout, **args)
    finally:
        sock.close()


def _control_socket(ctx: zmq.asyncio.Context, run_dir: str) -> zmq.asyncio.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint(run_dir, "control"))
    return sock


async def _ask(sock: zmq.asyncio.Socket, op: str, timeout: float, **args: Any) -> dict[str, Any]:
    """One request on *sock*, its reply by id (an earlier ask's late reply passed over)."""
    msg = request_message(op, timeout, **args)
    await sock.send_multipart([b"", pack(msg)])
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not await sock.poll(int(left * 1000) + 1):
            break
        reply = unpack((await sock.recv_multipart())[-1])
        if reply.get("id") == msg["id"]:
            return reply
    raise NodeUnreachable(f"crewletd did not answer {op!r} within {timeout:g}s")


class Caller:
    """One DEALER to crewletd's ``control`` kept for a child's repeated asks
    (ingress's projection asks for the node's children every second), rather
    than a socket and a connection per ask as :func:`acall` makes. Asks go one
    at a time; a reply that comes after its ask gave up is passed over by its
    id (an ask that got none in time closes the socket: the next makes
    another)."""

    def __init__(self, ctx: zmq.asyncio.Context, run_dir: str):
        self.ctx, self.run_dir = ctx, run_dir
        self._sock: zmq.asyncio.Socket | None = None
        self._lock = asyncio.Lock()

    async def call(self, op: str, timeout: float = 2.0, **args: Any) -> dict[str, Any]:
        """As :func:`acall`: the reply, or :class:`NodeUnreachable` after *timeout*."""
        async with self._lock:
            if self._sock is None:
                self._sock = _control_socket(self.ctx, self.run_dir)
            try:
                return await _ask(self._sock, op, timeout, **args)
            except NodeUnreachable:
                # As acall's socket would be: closed with what it queued, so
                # a crewletd away for a while is not met on its return by an
                # unanswered ask a second.
                self.close()
                raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
