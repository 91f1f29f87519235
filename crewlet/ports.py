"""The addresses a node listens on, each known by its config key, and whether
each can be bound.

A node listens on:

``stream.listen``
    its embedded broker's clients (``stream.type: embedded``);
``stream.cluster.listen``, ``stream.cluster.leaf_listen``
    a broker member's routes and leaf nodes;
``ingress.listen``
    the HTTP API (the ingress role).

Before it starts any child, crewletd binds each of them (:func:`preflight`)
the way its server will: ``SO_REUSEADDR`` (nats-server's Go runtime and
uvicorn's asyncio both set it, so a port in ``TIME_WAIT`` passes as it would
for them), and listening, all held at once so that two keys naming one
address clash; then it closes them. A problem is a
:class:`~crewlet.config.ConfigError` naming the key — the port is in use (by
pid N, where this user can see it), the host is not an address of this
machine, the host does not resolve, the port needs privileges — and crewletd
exits 78 with it: restarting cannot help.

Between that check and a server's own bind another process may take the
port. The children's bind failures are configuration errors too: ingress
binds through :func:`bind` and exits 78 naming ``ingress.listen``, and
crewletd reads nats-server's fatal line (:func:`roles.broker.listen_problem`)
with :func:`problem` worded the same.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

import psutil

from crewlet.config import ConfigError, NodeConfig

# What a check listens with: nobody connects in the moment it lasts.
_BACKLOG = 1
# Characters of a holder's command line shown in a problem.
_HOLDER_CHARS = 100


@dataclass(frozen=True)
class Address:
    """One listening address of a node: the config key and its value."""

    key: str
    value: str  # host:port, as configured
    # Bind every address the host resolves to (asyncio's create_server, so
    # uvicorn) or only the first, IPv4 preferred (Go's net.Listen, so nats-server).
    every: bool


class BindError(Exception):
    """An address cannot be listened on. ``str()`` is the problem, one line,
    worded to follow ``<file>: <key>: ``; ``errno`` is the OS's (None: the
    host did not resolve)."""

    def __init__(self, problem: str, errno: int | None = None):
        super().__init__(problem)
        self.errno = errno


def addresses(cfg: NodeConfig) -> list[Address]:
    """Every address this node's own servers listen on, in start order."""
    out = []
    stream = cfg.stream
    if stream.type == "embedded":
        out.append(Address("stream.listen", stream.listen, every=False))
        if stream.cluster is not None:
            out.append(Address("stream.cluster.listen", stream.cluster.listen, every=False))
            if stream.cluster.leaf_listen is not None:
                out.append(Address("stream.cluster.leaf_listen", stream.cluster.leaf_listen,
                                   every=False))
    if "ingress" in cfg.node.roles:
        out.append(Address("ingress.listen", cfg.ingress.listen, every=True))
    return out


def split(value: str) -> tuple[str, int]:
    """``host:port`` (host maybe ``[v6]`` or empty) as (host, port)."""
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def problem(value: str, code: int | None, detail: str = "") -> str:
    """The problem of listening on *value*, by the error's errno (None: the
    host did not resolve); *detail* is the OS's own words, for the rest."""
    host, port = split(value)
    if code is None:
        return f"cannot resolve host {host!r}" + (f" ({detail})" if detail else "")
    if code == errno.EADDRINUSE:
        return f"{value} is in use{holder(port)}"
    if code == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine"
    if code == errno.EACCES:
        return f"port {port} needs privileges this user lacks"
    return f"cannot listen on {value}: {detail or errno.errorcode.get(code, code)}"


def holder(port: int) -> str:
    """`` (by pid N: its command line)`` of whoever listens on *port*, where this
    user can see it; else ``""``."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port \
                    and conn.pid:
                proc = psutil.Process(conn.pid)
                line = " ".join(" ".join(proc.cmdline()).split()) or proc.name()
                if len(line) > _HOLDER_CHARS:
                    line = line[:_HOLDER_CHARS - 1] + "…"
                return f" (by pid {conn.pid}: {line})"
    except (psutil.Error, OSError):
        pass
    return ""


def listens(pid: int, port: int) -> bool:
    """True if process *pid* itself holds a listening TCP socket on *port*."""
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in psutil.Process(pid).net_connections(kind="tcp"))
    except (psutil.Error, OSError):
        return False


def bind(value: str, *, every: bool = True) -> list[socket.socket]:
    """Listening sockets on *value*, bound as its server binds (see
    :class:`Address`); raises :class:`BindError`. The caller closes them."""
    host, port = split(value)
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BindError(problem(value, None, exc.strerror)) from None
    if not every:
        infos = sorted(infos, key=lambda i: i[0] != socket.AF_INET)[:1]
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and every:
                # asyncio does so: the IPv4 address is bound by a socket of its own.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(_BACKLOG)
    except OSError as exc:
        for sock in socks:
            sock.close()
        raise BindError(problem(value, exc.errno, exc.strerror or ""), exc.errno) from None
    return socks


def preflight(cfg: NodeConfig) -> None:
    """Bind and close every address of :func:`addresses`; raises
    :class:`~crewlet.config.ConfigError` naming the key of the first that cannot be."""
    held: list[tuple[Address, list[socket.socket]]] = []
    try:
        for address in addresses(cfg):
            try:
                held.append((address, bind(address.value, every=address.every)))
            except BindError as exc:
                ours = _ours(held, address) if exc.errno == errno.EADDRINUSE else None
                raise ConfigError(cfg.source, address.key,
                                  f"{address.value} is also {ours.key}" if ours else str(exc)) from None
    finally:
        for _, socks in held:
            for sock in socks:
                sock.close()


def _ours(held: list[tuple[Address, list[socket.socket]]], address: Address) -> Address | None:
    """The address already held by this check that *address* clashed with."""
    _, port = split(address.value)
    return next((a for a, socks in held if any(s.getsockname()[1] == port for s in socks)), None)
