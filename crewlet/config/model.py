"""Tier A node config: the typed model, and the one place its defaults live.

Every section forbids unknown keys, so a typo is an error rather than a
silently ignored setting. Field defaults below are the defaults; nothing else
in crewlet may restate them. All durations are float seconds.

Validators raise ``ValueError`` with a message that reads as the tail of
``<file>: <key>: <problem>``; :mod:`crewlet.config.load` turns pydantic's
errors into :class:`~crewlet.config.load.ConfigError`. Cross-field checks are
field validators that read earlier fields from ``info.data`` (so the error
lands on the precise key) and use ``validate_default`` so they also run when
the key is absent.

Every number has bounds the runtime can live with, each with its reason in
the field's comment: below them a node storms (restarts, writes, wakeups),
above them a value overflows a NATS setting or an int64, or leaves seats and
mail waiting for hours. ``HOUR`` and ``DAY`` name the usual ceilings.

The model is validated with an optional context ``{"base_dir": <dir>}``: the
config file's directory, against which relative paths are resolved.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

from crewlet import credentials, tokens
from crewlet.objects.base import identity_of

# sun_path is 108 bytes including the terminating NUL.
MAX_UNIX_SOCKET_PATH = 107
# The ipc:// endpoints bound under run_dir; the longest name decides the check.
RUN_DIR_SOCKETS = ("control", "health", "events", "estate", "applied")
# The node id becomes a NATS server name and part of KV keys.
NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
# Child processes in start order, keyed by the role that runs them.
CHILD_FOR_ROLE = {"data": "data_applier", "ingress": "ingress", "seats": "seats", "workers": "workers"}
# Seats processes a node may be given: past this a pool is a typo, not a machine.
MAX_SEATS_PROCESSES = 256

Role = Literal["data", "ingress", "seats", "workers"]

# Ceilings of durations, in seconds.
HOUR = 3600.0
DAY = 86400.0
# Ceiling of per-node counts (turn slots, claims and releases a sweep): ten times the
# 10,000 seats crewlet is sized for (their revision ~25 MB of the 64 MiB one may hold).
COUNT_MAX = 100_000
MIB = 1 << 20


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"expected host:port with port 1..65535, got {value!r}")
    return value


def _url(*schemes: str):
    def check(value: str) -> str:
        try:
            parts = urlsplit(value)
            ok = parts.scheme in schemes and bool(parts.hostname) and (parts.port is None or parts.port > 0)
        except ValueError:  # e.g. a non-numeric port
            ok = False
        if not ok:
            raise ValueError(f"expected a {' or '.join(s + '://' for s in schemes)} URL, got {value!r}")
        return value

    return AfterValidator(check)


def _read_with(reader, value: str, info: ValidationInfo) -> str:
    """*value* as a path resolved against the config file, once *reader* could
    read it (its own ValueError, naming the problem, passes through)."""
    path = _resolve_path(value, info)
    try:
        reader(path)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    return path


def _resolve_path(value: str, info: ValidationInfo) -> str:
    """~ expanded; relative paths are relative to the config file's directory."""
    base = (info.context or {}).get("base_dir") or os.getcwd()
    return os.path.abspath(os.path.join(base, os.path.expanduser(value)))


def default_data_dir() -> str:
    """$CREWLET_DATA_DIR, else $XDG_DATA_HOME/crewlet, else ~/.local/share/crewlet."""
    env = os.environ
    path = env.get("CREWLET_DATA_DIR") or os.path.join(env.get("XDG_DATA_HOME") or "~/.local/share", "crewlet")
    return os.path.abspath(os.path.expanduser(path))


HostPort = Annotated[str, AfterValidator(_host_port)]
NatsUrl = Annotated[str, _url("nats", "tls")]
RouteUrl = Annotated[str, _url("nats-route", "nats", "tls")]
LeafUrl = Annotated[str, _url("nats-leaf", "nats", "tls", "ws", "wss")]


class _Section(BaseModel):
    # Numbers are accepted where strings are expected (e.g. `id: 7`, label values).
    # No number is infinite or NaN (YAML's .inf and .nan): every one is a count or a
    # duration the runtime turns into an int, a timer or a NATS setting.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True, allow_inf_nan=False)


def pool_child(role: str, member: int) -> str:
    """The child name of *role*'s pool member *member*: the first member keeps
    the role's own name, so a node of one seats process looks as it always did."""
    return role if member == 0 else f"{role}.{member}"


def pool_members(size: int) -> list[str]:
    """The child names of a seats pool of *size*: ``seats``, ``seats.1`` …"""
    return [pool_child("seats", k) for k in range(size)]


def pool_member(child: str) -> tuple[str, int]:
    """(role, member) of a role child's name: ``seats.2`` is ("seats", 2)."""
    role, _, member = child.partition(".")
    return role, int(member or 0)


# Roles that read this node's own copy of the estate, so need the data role.
NEEDS_DATA = ("ingress", "workers")


class NodeSection(_Section):
    id: str = "node-0"  # this node's name in the fleet: distinct and stable per node
    roles: list[Role] = Field(default_factory=lambda: ["data", "ingress", "seats", "workers"], min_length=1)  # what this node runs
    labels: dict[str, str] = Field(default_factory=dict)  # free-form tags for placement and display
    # Agent turns this node runs at once: each is a live task with its memory; >10,000 is a typo.
    max_concurrent: int = Field(32, ge=1, le=10_000)
    # Seats processes of the pool (roles/seats/pool.py): each holds a stable share of
    # the node's seats and of its turn slots. None: one per CPU this node may run on,
    # at most max_concurrent (a process with no turn slot would hold seats it cannot work).
    seats_processes: int | None = Field(None, ge=1, le=MAX_SEATS_PROCESSES)
    # Bytes that must stay free on the filesystems of data_dir and the broker's store
    # (crewlet.disk): below it the node is not ready and refuses new mail, applies and
    # turns rather than fail mid-write. 1 MiB at least (a full disk always counts as
    # low); 1 TiB at most, past any disk a node is given.
    disk_floor: int = Field(64 * MIB, ge=MIB, le=MIB << 20)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not NODE_ID_RE.match(v):
            raise ValueError(f"must be 1-63 letters, digits, '_' or '-', starting with a letter or digit, got {v!r}")
        return v

    @field_validator("roles")
    @classmethod
    def _roles(cls, v: list[str]) -> list[str]:
        dupes = sorted({r for r in v if v.count(r) > 1})
        if dupes:
            raise ValueError(f"duplicate role {', '.join(map(repr, dupes))}")
        # DESIGN §10: ingress's retention, capacity, eviction and backup
        # surfaces, and the workers' duties, read this node's own copy of the
        # estate. A node without the data role runs seats only.
        needing = [r for r in NEEDS_DATA if r in v]
        if needing and "data" not in v:
            one = len(needing) == 1
            raise ValueError(f"{' and '.join(needing)} need{'s' if one else ''} the data role "
                             f"({'it reads' if one else 'they read'} this node's copy of the estate): "
                             "add data, or run seats only on a node without it")
        return v


# A NATS name that is also a subject token (cluster name, JetStream domain).
NATS_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""}


def _nats_name(v: str) -> str:
    if not NATS_NAME_RE.match(v):
        raise ValueError(f"must be 1-63 letters, digits, '_' or '-', starting with a letter or digit, "
                         f"got {v!r}")
    return v


def is_route_to_self(route: str, listen: str) -> bool:
    """True if *route* names this member's own cluster address *listen*.

    nats-server must not be given a route to itself: measured with 2.15.1, a
    member with a route to itself opened and dropped ~300 route connections
    a second ("Duplicate Route"), and two of three members configured that
    way elected no meta leader until the third joined (with routes to the
    others only, two do). Same port and the same host, or a loopback route
    to a loopback or unspecified listen address.
    """
    parts = urlsplit(route)
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if parts.port is None or str(parts.port) != port:
        return False
    return parts.hostname == host or (parts.hostname in _LOOPBACK and host in _LOOPBACK)


_ANY_HOST = {"0.0.0.0", "::", ""}


def same_socket(a: str, b: str) -> bool:
    """True if host:port *a* and *b* cannot both be bound: the same port, and the
    same host, or loopback names both, or either the unspecified address."""
    (ha, _, pa), (hb, _, pb) = a.rpartition(":"), b.rpartition(":")
    ha, hb = ha.strip("[]"), hb.strip("[]")
    return pa == pb and (ha == hb or ha in _ANY_HOST or hb in _ANY_HOST
                         or (ha in _LOOPBACK and hb in _LOOPBACK))


def broker_listens(stream: "StreamSection") -> list[tuple[str, str]]:
    """(key, host:port) of every address the embedded broker binds, in the file's order."""
    if stream.type != "embedded":
        return []
    out = [("listen", stream.listen)]
    if stream.cluster is not None:
        out.append(("cluster.listen", stream.cluster.listen))
        if stream.cluster.leaf_listen is not None:
            out.append(("cluster.leaf_listen", stream.cluster.leaf_listen))
    return out


class ClusterSection(_Section):
    name: str = Field(min_length=1)  # NATS cluster name; the same on every member
    listen: HostPort  # where this member accepts routes from the other members
    routes: list[RouteUrl] = Field(default_factory=list, validate_default=True)  # the other members' cluster addresses
    leaf_listen: HostPort | None = None  # where this member accepts leaf connections of nodes without data; None: none

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _nats_name(v)

    @field_validator("routes")
    @classmethod
    def _routes(cls, v: list[str], info: ValidationInfo) -> list[str]:
        listen = info.data.get("listen")
        others = [r for r in v if listen is None or not is_route_to_self(r, listen)]
        if not others:
            raise ValueError("must list at least one other member's nats-route://host:port "
                             "(nats-server refuses a JetStream cluster without routes; a route to this "
                             "member's own listen address does not count)")
        return v


class LeafSection(_Section):
    remotes: list[LeafUrl] = Field(min_length=1)  # the members' leaf addresses; the leaf dials one, fails over to the next


def _readable(v: str, info: ValidationInfo, *, secret: bool = False) -> str:
    """*v* resolved (:func:`_resolve_path`) and readable; with *secret*, not
    open to group or others (:func:`crewlet.credentials.check_private`)."""
    v = _resolve_path(v, info)
    try:
        with open(v, "rb"):
            pass
        if secret:
            credentials.check_private(v)
    except OSError as exc:
        raise ValueError(f"cannot read {v}: {exc.strerror or exc}") from None
    return v


class TlsSection(_Section):
    """TLS on the embedded broker's client port, routes and leaf links, or to
    an external broker (``stream.type: nats``). PEM files."""

    ca: str  # the CA that signed every node's certificate: what the node's clients and its peers trust
    cert: str | None = None  # this node's certificate, naming the addresses peers and clients dial; required when embedded
    key: str | None = Field(None, validate_default=True)  # its private key (0600); required with cert

    @field_validator("ca", "cert")
    @classmethod
    def _file(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else _readable(v, info)

    @field_validator("key")
    @classmethod
    def _key(cls, v: str | None, info: ValidationInfo) -> str | None:
        if (v is None) != (info.data.get("cert") is None) and "cert" in info.data:
            raise ValueError("cert and key go together: give both, or neither")
        return None if v is None else _readable(v, info, secret=True)


class StreamSection(_Section):
    type: Literal["embedded", "nats"] = "embedded"  # run our own nats-server, or use an existing NATS
    listen: HostPort = "127.0.0.1:4222"  # client address of the embedded nats-server
    servers: list[NatsUrl] = Field(default_factory=list, validate_default=True)  # NATS URLs when type is nats; ignored when embedded
    binary: str | None = Field(None, min_length=1)  # nats-server binary for embedded; None: the one next to the interpreter
    replicas: int = Field(1, ge=1, le=5)  # JetStream replicas of crewlet's streams and KV buckets
    domain: str = "crewlet"  # JetStream domain the embedded JetStream serves; a leaf reaches the members' through it
    cluster: ClusterSection | None = None  # embedded broker is a member of this JetStream cluster (data nodes); ignored when type is nats
    leaf: LeafSection | None = None  # embedded broker is a leaf of the members, without JetStream (nodes without data); ignored when type is nats
    # The fleet's shared secret: a file (`crewletctl fleet-secret FILE`, 0600), the same on every node.
    # A member's routes and leaf listener admit only nodes that hold it; required with cluster or leaf.
    fleet_credentials: str | None = Field(None, validate_default=True)
    # type nats: the broker's credentials, a NATS .creds file or one line user:password (0600).
    credentials: str | None = None
    tls: TlsSection | None = Field(None, validate_default=True)  # TLS on the broker's client port, routes and leaves; None: none

    @field_validator("servers")
    @classmethod
    def _servers(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if info.data.get("type") == "nats" and not v:
            raise ValueError("must list at least one nats:// URL when stream.type is nats")
        return v

    @field_validator("binary")
    @classmethod
    def _binary(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else _resolve_path(v, info)

    @field_validator("domain")
    @classmethod
    def _domain(cls, v: str) -> str:
        return _nats_name(v)

    @field_validator("leaf")
    @classmethod
    def _leaf(cls, v: LeafSection | None, info: ValidationInfo) -> LeafSection | None:
        if v is not None and info.data.get("type") == "embedded" and info.data.get("cluster") is not None:
            raise ValueError("cannot be set together with stream.cluster: the embedded broker is either a "
                             "cluster member (a data node) or a leaf of the members (a node without data)")
        return v

    @field_validator("fleet_credentials")
    @classmethod
    def _fleet_credentials(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            linked = [k for k in ("cluster", "leaf") if info.data.get(k) is not None]
            if linked and info.data.get("type") == "embedded":
                raise ValueError(f"required with stream.{linked[0]}: a fleet's routes and leaves admit only "
                                 "the nodes that hold its secret. Make one with `crewletctl fleet-secret FILE`, "
                                 "copy it to every node (mode 0600) and name it here")
            return v
        return _read_with(credentials.read_fleet_secrets, v, info)

    @field_validator("credentials")
    @classmethod
    def _credentials(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        return _read_with(credentials.read_external, v, info)

    @field_validator("tls")
    @classmethod
    def _tls(cls, v: TlsSection | None, info: ValidationInfo) -> TlsSection | None:
        if v is not None and info.data.get("type") == "embedded" and v.cert is None:
            raise ValueError("an embedded broker serves TLS with this node's certificate: give cert and key")
        return v

    @property
    def broker_kind(self) -> Literal["standalone", "member", "leaf"] | None:
        """What the embedded broker is; None when type is nats (no broker child)."""
        if self.type != "embedded":
            return None
        if self.cluster is not None:
            return "member"
        return "leaf" if self.leaf is not None else "standalone"


class ApiToken(_Section):
    name: str  # what logs and the API show of the token (never the token)
    sha256: str  # the token's sha256, hex: `crewletctl token` prints it
    scopes: list[Literal["read", "write", "admin"]] = Field(min_length=1)  # admin > write > read
    # the company's person (an id of its people:) the token belongs to: who decides an
    # approval made with it, and whether they may
    person: str | None = Field(None, pattern=tokens.PERSON_RE.pattern)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not tokens.NAME_RE.match(v):
            raise ValueError(f"must be 1-63 letters, digits, '_', '.', '@' or '-', got {v!r}")
        return v

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not tokens.SHA256_RE.match(v):
            raise ValueError("must be the token's sha256, 64 lowercase hex digits (never the token itself)")
        return v


class IngressSection(_Section):
    listen: HostPort = "127.0.0.1:7420"  # HTTP address of the ingress role
    # API tokens (hashed). Neither tokens nor tokens_file: the node makes one
    # admin token on first start, in its run dir (crewlet.tokens).
    tokens: list[ApiToken] = Field(default_factory=list)
    tokens_file: str | None = None  # a file of lines "<sha256> <scopes> <name>"
    metrics_open: bool = False  # /metrics without a token (a scraper on a trusted network)
    cors_origins: list[str] = Field(default_factory=list)  # origins allowed cross-origin calls; none: CORS off
    # Bytes of a request body; more is a 413. A page's body (200,000 characters) may take
    # 2.4 MB as JSON when every character is escaped.
    # Held whole in memory before it is parsed, hence at most 64 MiB.
    max_body: int = Field(4_194_304, ge=1024, le=64 * 1024 * 1024)
    # Seconds the live feed keeps a node that left, shown as gone, before it forgets it;
    # at most a day (a fleet's churn would pile up rows).
    gone_for: float = Field(600.0, ge=0, le=DAY)
    # What a client sending a request is held to (roles/ingress/deadlines.py), so that
    # one trickling a byte a second cannot hold a connection for ever:
    # Seconds a request's headers have from its first byte (the connection's opening,
    # for its first); past them a 408 and the connection closed. A second at least (a
    # client sends its headers in milliseconds; under a second one on a busy link is
    # cut); 5 minutes at most (past that a client sending nothing holds its slot
    # about as long as if there were no deadline).
    header_timeout: float = Field(10.0, ge=1, le=300)
    # Seconds a request's body may take before its pace counts; an hour at most.
    body_grace: float = Field(20.0, ge=0, le=HOUR)
    # Bytes a second a body must average after body_grace, else it is cut. 1 at least;
    # 10 MiB/s at most (an upload over an ordinary link would be cut).
    body_min_rate: int = Field(1024, ge=1, le=10 * MIB)
    # Connections (and requests in progress) served at once; a request past them is a
    # 503 at once. 8 at least (each dashboard's live feed holds one; fewer leaves no room
    # for /readyz beside them); COUNT_MAX at most (each holds a socket and a buffer).
    max_connections: int = Field(1024, ge=8, le=COUNT_MAX)
    # Bytes of a request's line and headers held while they are incomplete (h11's bound:
    # what a connection may make the server keep); past it a 400. 1 KiB at least (a
    # browser's headers with a bearer token take ~1 KiB); 1 MiB at most (held in memory,
    # per connection).
    max_header_bytes: int = Field(16384, ge=1024, le=MIB)

    @field_validator("tokens_file")
    @classmethod
    def _tokens_file(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        v = _resolve_path(v, info)
        try:
            tokens.read_file(v)
        except OSError as exc:
            raise ValueError(f"cannot read {v}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ValueError(f"{v}: {exc}") from None
        return v

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        for origin in v:
            if origin != "*" and not re.match(r"^https?://[^/\s]+$", origin):
                raise ValueError(f"expected origins like https://app.example.com (no path) or *, got {origin!r}")
        return v

    @property
    def configured_tokens(self) -> bool:
        """Tokens were configured (so no first-start admin token is made)."""
        return bool(self.tokens) or self.tokens_file is not None


class SupervisorSection(_Section):
    # Restarts allowed within `period` before the supervisor gives up and escalates;
    # at most 10,000 (each is kept in the restart history for `period`).
    intensity: int = Field(5, ge=0, le=10_000)
    # The window `intensity` is counted over: under a second the limit never trips
    # (a restart storm goes on for ever); over a day it is never forgotten.
    period: float = Field(30.0, ge=1, le=DAY)
    # Wait before the 2nd consecutive restart of a child (the 1st is immediate); at most
    # an hour, like backoff_max.
    backoff_min: float = Field(0.1, ge=0, le=HOUR)
    # Cap of the doubling restart backoff: a child stays down at most an hour.
    backoff_max: float = Field(10.0, le=HOUR, validate_default=True)
    # A child up this long has its backoff reset: 0.1 s at least, or every crash looks
    # stable and restarts at once; a day at most.
    stable_after: float = Field(10.0, ge=0.1, le=DAY)
    auto_shutdown: Literal["never", "any_significant", "all_significant"] = "never"  # stop the node when significant children exit
    # Role children: SIGTERM, then SIGKILL after this; 0.1 s lets one flush, an hour
    # is the most a stop (and systemd's TimeoutStopSec) should wait.
    shutdown_timeout: float = Field(10.0, ge=0.1, le=HOUR)
    # The same for the broker, which flushes JetStream; the same bounds.
    broker_shutdown_timeout: float = Field(30.0, ge=0.1, le=HOUR)
    # Not ready by then: killed, and counted as a failed start. A child needs a second to
    # fork, import and connect; under that every start fails (a restart storm).
    ready_timeout: float = Field(30.0, ge=1, le=HOUR)
    # A role's event loop stalled this long: the child exits 75. Under a second a busy
    # loop or a GC pause kills children (a restart storm); an hour at most.
    wedge_after: float = Field(10.0, ge=1, le=HOUR)
    # How often a child reports to the supervisor: each beat is a message to crewletd, so
    # not more than 10 a second (1e-6 was a restart storm); below wedge_after.
    heartbeat_interval: float = Field(1.0, ge=0.1, validate_default=True)
    # Silent past wedge_after + this: SIGKILL from the supervisor; an hour at most.
    heartbeat_grace: float = Field(5.0, ge=0, le=HOUR)

    @field_validator("backoff_max")
    @classmethod
    def _backoff_max(cls, v: float, info: ValidationInfo) -> float:
        lo = info.data.get("backoff_min")
        if lo is not None and v < lo:
            raise ValueError(f"must be >= backoff_min ({lo:g}), got {v:g}")
        return v

    @field_validator("heartbeat_interval")
    @classmethod
    def _heartbeat(cls, v: float, info: ValidationInfo) -> float:
        wedge = info.data.get("wedge_after")
        if wedge is not None and v >= wedge:
            raise ValueError(f"must be < wedge_after ({wedge:g}), got {v:g}")
        return v


class LogSection(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"  # least severe level written
    format: Literal["auto", "json", "text"] = "auto"  # auto: text on a terminal, else json


class Fault(_Section):
    # The role child to hurt, or crewletd itself (wedge only: its own watchdog).
    role: Literal["crewletd", "data_applier", "ingress", "seats", "workers"]
    # wedge: block the loop; crash: exit at once; mute: stop heartbeats;
    # orphan: start a short-lived process whose parent exits at once;
    # grandchild: start a long-lived process that ignores SIGTERM;
    # late (seats only): renew the seats' life not at all for `seconds`;
    # lag (data_applier only): apply nothing to the copy for `seconds`.
    kind: Literal["wedge", "crash", "mute", "orphan", "grandchild", "late", "lag"]
    after: float = Field(0.0, ge=0, le=DAY)  # seconds after the child reports ready; a test lasts less than a day
    seconds: float = Field(3600.0, gt=0, le=DAY)  # how long a wedge blocks the loop, late or lag holds back; a day at most
    code: int = Field(1, ge=0, le=255)  # exit code of a crash
    once: bool = True  # only in the child's first incarnation (restart count 0)

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("role") == "crewletd" and v != "wedge":
            raise ValueError(f"crewletd only takes kind wedge, got {v!r}")
        if v == "late" and info.data.get("role") != "seats":
            raise ValueError("kind late is the seats role's (its life's renewals held back)")
        if v == "lag" and info.data.get("role") != "data_applier":
            raise ValueError("kind lag is the data_applier role's (its copy held back)")
        return v


class FleetSection(_Section):
    """The fleet's timing constants (DESIGN §4): the defaults are the design's;
    tests shorten them. Every node of a fleet should use the same values."""

    # Presence and lease renewals, and the admission freshness: a KV write per seat per
    # beat, so not more than 2 a second; at most 10 minutes (below lease_ttl).
    heartbeat: float = Field(15.0, ge=0.5, le=600)
    # A lease not renewed this long lapses (NATS keeps whole seconds, hence >= 1); at most an
    # hour: a dead node's seats are unheld that long.
    lease_ttl: float = Field(45.0, ge=1, le=HOUR, validate_default=True)
    # The seat sweep's interval: each reads the leases, so 0.1 s at least; 10 minutes at most.
    sweep: float = Field(5.0, ge=0.1, le=600)
    claims_per_sweep: int = Field(4, ge=1, le=COUNT_MAX)  # MCP process trees forked per sweep window
    releases_per_sweep: int = Field(2, ge=1, le=COUNT_MAX)  # a release interrupts a live agent
    # A mailbox's ack wait: mail in the hands of a node that died comes back after it.
    # Set when a mailbox is created (the first node to create it decides). NATS keeps it in
    # int64 nanoseconds; a day at most, or a dead node's mail waits longer than anyone will.
    ack_wait: float = Field(1800.0, ge=1, le=DAY)
    # Seconds a drained node's running turns (and the conversation runs it drives) are
    # given to finish before they are cut short and handed over (crewlet/coord/drain.py);
    # `crewletctl drain --deadline` gives one drain another. A day at most.
    drain_deadline: float = Field(120.0, ge=0, le=DAY)

    @field_validator("lease_ttl")
    @classmethod
    def _ttl(cls, v: float, info: ValidationInfo) -> float:
        beat = info.data.get("heartbeat")
        if beat is not None and v <= beat:
            raise ValueError(f"must be > heartbeat ({beat:g}), got {v:g}")
        return v


class ConversationsSection(_Section):
    """Conversation runs (DESIGN §11): the driver lease ``conv.<id>`` and the
    run events in ``RUNS`` (crewlet/conversations). Every node of a fleet
    should use the same values."""

    # Seconds a second run of a busy conversation waits for its lease before it is refused
    # (409 conversation_busy): an aborted stream retried at once is let in once the abandoned
    # run has torn down. A minute at most: an HTTP request held longer is a hung one.
    busy_wait: float = Field(2.0, ge=0, le=60)
    # A driver lease not renewed this long lapses and the session runner may take the run
    # over (renewed every third of it). Shorter than a seat's: a person is waiting on the
    # stream; long enough to ride out a stream leader election (~6 s) with a renewal to spare.
    # NATS keeps whole seconds, hence >= 1; an hour at most, like fleet.lease_ttl.
    lease_ttl: float = Field(15.0, ge=1, le=HOUR)
    # Seconds RUNS keeps a run's events after the run ended (Last-Event-ID resumes within
    # it), for runs no longer than max_run: each event lives retention + max_run. A minute
    # at least; a week at most (the stream's size is bounded by count anyway).
    retention: float = Field(3600.0, ge=60, le=7 * DAY)
    # The longest a run is expected to last, from its first event to its last: a turn is
    # capped at 5 minutes, and a run may wait behind its seat's earlier turns. A minute at
    # least; a day at most.
    max_run: float = Field(900.0, ge=60, le=DAY)
    # Events RUNS keeps at most, oldest dropped first (a bound on its disk: ~300 bytes an
    # event with deltas coalesced, so ~600 MB; some 10,000 runs of a streamed answer and a
    # few tool calls each). Set when the stream is made; a node asking for more raises it.
    # 10,000 at least (a few runs); a billion at most.
    max_events: int = Field(2_000_000, ge=10_000, le=1_000_000_000)


class SessionsSection(_Section):
    """The session runner every ingress node runs (DESIGN §11,
    crewlet/conversations/runner.py): the runs no browser drives."""

    # Runs this node's session runner drives at once (queued runs, resumptions after an
    # approval, runs whose driver died); the environment variable SESSION_RUNNER_CONCURRENCY,
    # when set, wins. 1 at least; 10,000 at most (each is a lease and a follower).
    runner_concurrency: int = Field(8, ge=1, le=10_000)
    # Seconds between the runner's looks for work it was not told of (a driver that died
    # elsewhere, an approval that expired). Told of work on this node, it looks at once.
    sweep: float = Field(2.0, ge=0.1, le=60)


class ApprovalsSection(_Section):
    """Tool calls that wait for a person (DESIGN §11, the company's ``approval:``)."""

    # Seconds a pending approval waits for a decision before it is denied as expired
    # (the model is told so). A second at least (tests); 30 days at most.
    ttl: float = Field(DAY, ge=1, le=30 * DAY)


# An email address: local@domain, no spaces or angle brackets (a header injection).
EMAIL_RE = re.compile(r"^[^@\s<>,;\"]{1,64}@[A-Za-z0-9.-]{1,253}$")


def _email(v: str) -> str:
    if not EMAIL_RE.match(v):
        raise ValueError(f"expected an email address like ops@example.com, got {v!r}")
    return v


Email = Annotated[str, AfterValidator(_email)]


class SmtpSection(_Section):
    """How this node sends email when it holds the ``sender`` duty
    (roles/workers/duties/sender.py). A node without ``host`` never takes the
    duty; give every workers node of a fleet the same section. The rate is
    the company's (``notify:``), so it is one number fleet-wide."""

    host: str | None = Field(None, min_length=1)  # the SMTP server; None: this node sends no email
    port: int = Field(587, ge=1, le=65535)  # 587 (submission, STARTTLS), 465 (tls: implicit), 25
    # starttls: upgrade after connecting, refusing a server that cannot; implicit: TLS from the
    # first byte (port 465); none: plain text (a relay on loopback only).
    tls: Literal["starttls", "implicit", "none"] = "starttls"
    username: str | None = Field(None, min_length=1)  # log in as this; None: no login
    # The password: the environment variable named here, or a file of mode 0600 (never the
    # password itself, which would land in every copy of this file).
    password_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    password_file: str | None = None
    sender: Email = "crewlet@localhost"  # the From: of every email
    # Seconds one SMTP exchange may take: under the sender's ack wait's heartbeat, and long
    # enough for a slow relay; an answer not had by then leaves that email `unknown`.
    timeout: float = Field(30.0, ge=1, le=300)
    # Seconds before the first retry after a passing failure (4xx, connection refused),
    # doubling per attempt up to an hour; tests shorten it.
    retry_after: float = Field(30.0, ge=0.1, le=HOUR)
    # Sends of one notification (passing failures) before it is dead-lettered.
    attempts: int = Field(10, ge=1, le=100)
    # Where crewlet's own notices go (a dead letter, a copy out of service); none: no notices.
    notices_to: list[Email] = Field(default_factory=list, max_length=20)

    @field_validator("password_file")
    @classmethod
    def _password_file(cls, v: str | None, info: ValidationInfo) -> str | None:
        return _secret_file(v, info, "password_env")

    def password(self) -> str | None:
        """The password, read now (a rotated file is picked up at the next connect)."""
        return _read_secret(self.password_env, self.password_file)


class FilesSection(_Section):
    """Where the company's files are: one object store the whole fleet shares
    (crewlet.objects). The first node records it in the ``objects`` slot; a
    node configured with another store refuses to boot, naming both. Give
    every node of a fleet the same section."""

    store: Literal["nats", "s3"] = "nats"  # nats: a bucket on the fleet's own broker; s3: an S3 bucket
    # The bucket: the object store bucket on the broker (replicas follow stream.replicas), or the S3 bucket.
    bucket: str = Field("files", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
    endpoint: str | None = Field(None, min_length=1)  # s3: the endpoint URL (MinIO, Ceph, …); None: AWS
    region: str | None = Field(None, min_length=1)  # s3: the bucket's region; None: boto3's default
    access_key: str | None = Field(None, min_length=1)  # s3: the access key id; None: boto3's own lookup
    # s3: the secret key, from the environment variable named here or a file of mode 0600.
    secret_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    secret_key_file: str | None = None
    max_bytes: int = Field(100 * MIB, ge=1, le=MIB << 20)  # the largest upload; above it: 413, nothing stored
    # Seconds an object no file row names is kept before the collector removes it: longer
    # than any upload takes to write its row, so an upload racing its row is never collected.
    grace: float = Field(HOUR, ge=1, le=30 * DAY)
    # Seconds between the collector's walks of the store (the ``collector`` duty).
    collect_every: float = Field(600.0, ge=1, le=DAY)

    @field_validator("store")
    @classmethod
    def _store(cls, v: str) -> str:
        if v == "s3" and importlib.util.find_spec("boto3") is None:
            raise ValueError("the s3 store needs boto3, which is not installed: pip install 'crewlet[s3]'")
        return v

    @field_validator("secret_key_file")
    @classmethod
    def _secret_key_file(cls, v: str | None, info: ValidationInfo) -> str | None:
        return _secret_file(v, info, "secret_key_env")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None:
            parts = urlsplit(v)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"expected an http:// or https:// URL, got {v!r}")
        return v

    def secret_key(self) -> str | None:
        """The S3 secret key, read now."""
        return _read_secret(self.secret_key_env, self.secret_key_file)

    def identity(self) -> str:
        """Which store this names, as the ``objects`` slot records it (the
        same string :meth:`crewlet.objects.ObjectStore.identity` gives)."""
        return identity_of(self.store, self.bucket, self.endpoint)


def _secret_file(v: str | None, info: ValidationInfo, env_field: str) -> str | None:
    """A secret's file: resolved, and refused when readable by others or given
    beside the environment variable *env_field*."""
    if v is None:
        return v
    if info.data.get(env_field) is not None:
        raise ValueError(f"give {env_field} or {info.field_name}, not both")
    v = _resolve_path(v, info)
    try:
        mode = os.stat(v).st_mode
    except OSError as exc:
        raise ValueError(f"cannot read {v}: {exc.strerror or exc}") from None
    if mode & 0o077:
        raise ValueError(f"{v} is readable by others (mode {mode & 0o777:o}): chmod 600 it")
    return v


def _read_secret(env: str | None, path: str | None) -> str | None:
    if env is not None:
        return os.environ.get(env)
    if path is not None:
        with open(path) as f:
            return f.read().strip()
    return None


class EstateSection(_Section):
    """The replicated estate's upkeep: snapshots of the copies, and the log's trim."""

    # Ops applied between snapshots: the data node with the lowest id in service puts a
    # consistent copy of its estate in the files store every this many ops, and a node
    # joining late (or below the log) starts from the newest (crewlet/estate/snapshot.py).
    snapshot_every: int = Field(100_000, ge=1, le=1_000_000_000)
    # Seconds between trims of the ESTATE log by the maintenance duty: up to the lowest seq
    # every in-service copy applied, never past the newest snapshot.
    trim_every: float = Field(HOUR, ge=1, le=DAY)


class SandboxSection(_Section):
    """How a seat's own tools and agents run (crewlet.sandbox): ``auto`` confines
    them under bubblewrap when it works here, else runs them unconfined and says
    so everywhere an operator looks; ``required`` refuses to start an
    unconfined tool; ``off`` runs them unconfined, the operator's choice."""

    mode: Literal["auto", "required", "off"] = "auto"


class SecretsSection(_Section):
    """Where the key that seals the fleet's secrets comes from (crewlet.vault.keys):
    ``key_file`` when given, else ``stream.fleet_credentials``, else the node's own
    key in its run dir (a single node)."""

    # A file made by `crewletctl fleet-secret FILE` (0600), the same on every node: for a
    # fleet without a fleet secret (stream.type: nats, a broker someone else runs).
    key_file: str | None = None

    @field_validator("key_file")
    @classmethod
    def _key_file(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else _read_with(credentials.read_fleet_secrets, v, info)


class SkillsSection(_Section):
    """The node's skill registry (crewlet.skills.registry): a cache of the
    company's skills, told of each change by a broadcast, walked whole at
    start and every ``walk_every`` seconds (what a missed broadcast waits for)."""

    walk_every: float = Field(300.0, ge=1, le=DAY)


class DebugSection(_Section):
    faults: list[Fault] = Field(default_factory=list)  # injected failures, for testing supervision


def _fail_at(loc: tuple, value: object, message: str):
    """Raise a validation error at *loc* below the field being validated, so a
    cross-section check still names the precise key (e.g. ``stream.leaf``)."""
    raise ValidationError.from_exception_data("NodeConfig", [InitErrorDetails(
        type=PydanticCustomError("value_error", "{error}", {"error": message}), loc=loc, input=value)])


class NodeConfig(_Section):
    node: NodeSection = Field(default_factory=NodeSection)  # who this node is and what it runs
    data_dir: str = Field(default_factory=default_data_dir, min_length=1, validate_default=True)  # node state; absolute after loading
    stream: StreamSection = Field(default_factory=StreamSection)  # the NATS connection
    ingress: IngressSection = Field(default_factory=IngressSection, validate_default=True)  # the HTTP front door
    supervisor: SupervisorSection = Field(default_factory=SupervisorSection)  # restart policy and timeouts
    log: LogSection = Field(default_factory=LogSection)  # logging
    fleet: FleetSection = Field(default_factory=FleetSection)  # lease and sweep timing
    smtp: SmtpSection = Field(default_factory=SmtpSection)  # sending email (the sender duty)
    files: FilesSection = Field(default_factory=FilesSection)  # where the company's files are
    estate: EstateSection = Field(default_factory=EstateSection)  # snapshots and the log's trim
    conversations: ConversationsSection = Field(default_factory=ConversationsSection)  # run drivers and events
    sessions: SessionsSection = Field(default_factory=SessionsSection)  # the session runner
    approvals: ApprovalsSection = Field(default_factory=ApprovalsSection)  # tool calls waiting for a person
    sandbox: SandboxSection = Field(default_factory=SandboxSection)  # confinement of seats' tools and agents
    secrets: SecretsSection = Field(default_factory=SecretsSection)  # the key the fleet's secrets are sealed with
    skills: SkillsSection = Field(default_factory=SkillsSection)  # the node's skill registry
    debug: DebugSection = Field(default_factory=DebugSection)  # fault injection
    # Filled by the loader via model_copy(update=...), never from the file: hence
    # excluded from dumps, and rejected as unknown keys if a file sets them.
    warnings: list[str] = Field(default_factory=list, exclude=True)  # things the operator should fix
    source: str = Field("<defaults>", exclude=True)  # the file loaded, or "<defaults>"

    @field_validator("warnings", "source", mode="before")
    @classmethod
    def _not_a_key(cls, v: object) -> object:
        raise PydanticCustomError("extra_forbidden", "Extra inputs are not permitted")

    @field_validator("data_dir")
    @classmethod
    def _data_dir(cls, v: str, info: ValidationInfo) -> str:
        v = _resolve_path(v, info)
        run = os.path.join(v, "run")
        longest = len(os.fsencode(os.path.join(run, max(RUN_DIR_SOCKETS, key=len))))
        if longest > MAX_UNIX_SOCKET_PATH:
            raise ValueError(
                f"run dir {run} is {len(os.fsencode(run))} bytes, so its socket paths reach {longest} bytes; "
                f"a unix socket path must be at most {MAX_UNIX_SOCKET_PATH} bytes: choose a shorter data_dir"
            )
        return v

    @field_validator("stream")
    @classmethod
    def _broker_kind(cls, v: StreamSection, info: ValidationInfo) -> StreamSection:
        """The broker follows the roles (reference: scaling-out): a data node's
        embedded broker is a cluster member, a node without data runs a leaf."""
        listens = broker_listens(v)
        for i, (key, addr) in enumerate(listens):
            for other, was in listens[:i]:
                if same_socket(addr, was):
                    _fail_at(tuple(key.split(".")), addr, f"{addr} is also stream.{other} ({was}): "
                             "every address this node listens on must be its own")
        node = info.data.get("node")
        if node is None or v.type != "embedded":
            return v  # node invalid (already reported), or no broker child: cluster/leaf unused
        if "data" in node.roles and v.leaf is not None:
            _fail_at(("leaf",), v.leaf, "a data node must be a broker member, not a leaf: give it "
                     "stream.cluster (or, on a single node, neither), or drop the data role")
        if "data" not in node.roles and v.cluster is not None:
            _fail_at(("cluster",), v.cluster, "a node without the data role runs a leaf of the members, not a "
                     "member holding replicas and a vote: set stream.leaf to the members' leaf addresses, "
                     "or add the data role")
        return v

    @field_validator("ingress")
    @classmethod
    def _ingress_listen(cls, v: IngressSection, info: ValidationInfo) -> IngressSection:
        """The HTTP port is not one the embedded broker binds (both would start,
        and one of them fail to bind, exiting 69 with the cause in a child's log)."""
        stream = info.data.get("stream")
        for key, addr in broker_listens(stream) if stream is not None else []:
            if same_socket(v.listen, addr):
                _fail_at(("listen",), v.listen, f"{v.listen} is also stream.{key} ({addr}): "
                         "the HTTP API and the broker each need a port of their own")
        return v

    @property
    def run_dir(self) -> str:
        """Where the node's ipc:// sockets and pid files live."""
        return os.path.join(self.data_dir, "run")

    def children(self) -> list[str]:
        """Role children this node starts, in start order: the seats role is
        its pool's members, ``seats`` then ``seats.1`` … (roles/seats/pool.py)."""
        out = []
        for role, child in CHILD_FOR_ROLE.items():
            if role in self.node.roles:
                out.extend(pool_members(self.seats_pool) if role == "seats" else [child])
        return out

    @functools.cached_property
    def seats_pool(self) -> int:
        """How many seats processes this node runs (``node.seats_processes``
        resolved: one per CPU it may run on, at most ``max_concurrent``).
        Resolved once per config: the CPUs a process may run on can change
        under it, and the pool's size must not (crewletd passes it on to the
        members in the config they get: supervisor/node.py)."""
        wanted = self.node.seats_processes
        if wanted is None:
            wanted = min(len(os.sched_getaffinity(0)), MAX_SEATS_PROCESSES)
        return max(1, min(wanted, self.node.max_concurrent))
