"""The embedded broker's credentials: only crewlet talks to its broker.

An embedded broker (``stream.type: embedded``) admits no client without a
user and password. They are made at the node's first start, random, in its
run dir (:data:`CREDENTIALS_FILE`, mode 0600, in a run dir that is 0700), and
kept across restarts. The broker's generated ``nats.conf`` (0600 as well)
names them; every process of the node that dials the broker — crewletd's
fleet child, each role (:func:`crewlet.bus.connect`), the broker's readiness
probe — and ``crewletctl`` read them from the same file. Whoever cannot read
the run dir (another local user, an MCP server run as someone else, anyone
who reaches the port from elsewhere) is refused with ``Authorization
Violation`` before anything is read or written.

The file is JSON: ``{"users": {"<user>": "<password>"}}``, one password of
its own per user (:data:`USERS`):

================  ===========================================================
``crewlet``       crewletd (its fleet child, the readiness probe) and
                  ``crewletctl``: every right. crewletd makes the streams and
                  buckets, claims the node's presence, applies companies and
                  creates mailboxes; crewletctl is the operator's tool.
``data_applier``  the role of the same name, and so on for ``ingress``,
``ingress``       ``seats`` and ``workers``: each only what that role needs
``seats``         (:mod:`crewlet.permissions` has the lists and why), so the
``workers``       ``grants`` bucket is the applier's alone, ingress never
                  publishes to the estate log, no role deletes a stream.
================  ===========================================================

A file made by an older crewlet (``crewlet`` alone) gets the missing users
added by crewletd's next start (:func:`ensure`), its password kept; the
file is replaced whole, atomically, 0600.

Rotating: stop the node, delete the file, start the node; new passwords are
made for every user and nothing else changes (nothing outside the node ever
held them). To rotate one user's alone, delete its entry from the file
instead: the next start makes it a new one and keeps the others.

A fleet's links. Each node makes its own client credentials, so no node
knows another's; the links between the nodes of a fleet take a secret they
share instead: ``stream.fleet_credentials``, a file made by ``crewletctl
fleet-secret`` (:func:`new_fleet_secret`, 32 random bytes as url-safe text),
copied to every node, and refused unless it is its owner's only
(:func:`check_private`). A node with ``stream.cluster`` or ``stream.leaf``
and no such file is refused at start (exit 78 naming the key). The secret
is never in the model (the config only names the file), never logged, and
never in the environment, which every child — agents and MCP servers
included — would inherit; ``${CREDENTIALS_DIRECTORY}/...`` in the path
takes a systemd credential.

With it the generated ``nats.conf`` of a member admits routes only as the
fleet user (``cluster { authorization { user, password } }``) and leaves
likewise (``leafnodes { authorization { users } }``); its routes and a
leaf's remotes dial with it in their URLs (:func:`with_user`,
:func:`dial_urls`). The user
name is made from the secret (:func:`fleet_user`), so two secrets in use at
once are two users. Nothing else is admitted on those ports: a server
routing or dialling without the secret gets ``Authorization Violation``
and never joins.

Rotating without losing the quorum. nats-server admits one route user, and
a reload (SIGHUP) with a new one closes at once the routes to members still
on the old (measured with 2.15.1), so a fleet cannot switch all at once.
Instead the file holds, for the time of a rotation, two lines: the secret in
force, then the one it replaces (``crewletctl fleet-secret --rotate``). A
member admits routes with the first only, and dials each peer with the one
that peer admits, asked before its broker starts (:mod:`roles.broker.routes`),
so a member already restarted reaches those not yet restarted with the old
one. They cannot reach it (it no longer takes theirs), but one route between
two members is enough, whichever side dialled. Never one peer with both (a
URL each): nats-server registers a route it dials before the peer has
checked its credentials, and the connection the peer is about to refuse
can take the place of the good one for good (the routes module says how).
Leaves are admitted with either, and a leaf's remote tries its URLs one at
a time. So: copy the rotated file to every node, restart the members one at
a time (each back before the next), then the leaves; then ``--retire`` (the
old line goes), copy, and restart them all again the same way. The old
secret admits nobody after that. Until the retire, a member may log a
refused route now and then for the secret a peer restarted since no longer
takes.

TLS (``stream.tls: {ca, cert, key}``): the client port, the routes and the
leaf links serve this node's cert; routes and leaves require the peer's
cert from the same CA (mutual TLS), clients sign in with their password
over TLS. crewlet's clients — every role, the broker's readiness probe,
crewletctl — get an SSL context trusting only the CA
(:func:`tls_context`) from :func:`client_options`. Certificates must name
the addresses peers and clients dial (checked: a name mismatch is refused).

An external broker (``stream.type: nats``): ``stream.credentials`` names a
file of its credentials (:func:`read_external`), a NATS ``.creds`` file or
one line ``user:password``, 0600; :func:`client_options` gives them to
every client, and ``stream.tls`` the CA to trust.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import secrets
import ssl


CREDENTIALS_FILE = "broker-users.json"
CREWLET_USER = "crewlet"
# The users of a node's broker: crewlet's own (crewletd, crewletctl) and one
# per role, named as the role's child (crewlet.config.model.CHILD_FOR_ROLE).
ROLE_USERS = ("data_applier", "ingress", "seats", "workers")  # = CHILD_FOR_ROLE's values (config imports this module)
USERS = (CREWLET_USER, *ROLE_USERS)
PASSWORD_BYTES = 32  # of randomness; url-safe base64 text, so it is a URL's userinfo as it stands


def path(run_dir: str) -> str:
    return os.path.join(run_dir, CREDENTIALS_FILE)


def ensure(run_dir: str) -> dict[str, str]:
    """The users of the broker of the node whose run dir is *run_dir*
    (``{user: password}``, every one of :data:`USERS`): made (0600, written
    whole before it is visible) if the file does not exist; a file that
    lacks some (an older crewlet's, crewlet's user alone) gets them added,
    the passwords it holds kept; read otherwise. crewletd calls it, before
    it starts the broker; everyone else only reads."""
    try:
        users = read(run_dir)
    except FileNotFoundError:
        users = None
    if users is not None:
        missing = [u for u in USERS if u not in users]
        if missing:
            users = {**users, **{u: _password() for u in missing}}
            _write(run_dir, users, replace=True)
        return users
    _write(run_dir, {u: _password() for u in USERS}, replace=False)
    return read(run_dir)


def _password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


def _write(run_dir: str, users: dict[str, str], *, replace: bool) -> None:
    """Write the users file whole, 0600, under a temporary name first: a
    reader sees the old file or the new one. *replace*: over the file there;
    else only if there is none (another process's made meanwhile is kept)."""
    target = path(run_dir)
    tmp = f"{target}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (json.dumps({"users": users}) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if replace:
            os.replace(tmp, target)
            return
        os.link(tmp, target)  # fails if another process made one meanwhile: keep theirs
    except FileExistsError:
        pass
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read(run_dir: str) -> dict[str, str]:
    """The node's broker users; FileNotFoundError if it has none yet."""
    with open(path(run_dir), encoding="utf-8") as f:
        users = json.load(f)["users"]
    if not isinstance(users, dict) or CREWLET_USER not in users:
        raise ValueError(f"{path(run_dir)}: no {CREWLET_USER!r} user; delete the file "
                         "and restart the node to make new credentials")
    return users


def password(run_dir: str, user: str = CREWLET_USER) -> str:
    """*user*'s password; ValueError naming the file if it has none (a file
    an older crewlet made, before the node's crewletd started again)."""
    users = read(run_dir)
    if user not in users:
        raise ValueError(f"{path(run_dir)}: no {user!r} user; start the node (crewletd) "
                         "to add it, or delete the file and restart the node")
    return users[user]


def client_options(stream, run_dir: str, user: str = CREWLET_USER) -> dict:
    """The keyword arguments of ``nats.connect`` that authenticate a client of
    the node whose ``stream`` section and run dir are given, as *user* (a
    role's child name, or crewlet's) for an embedded broker; for
    ``stream.type: nats`` those of ``stream.credentials`` (none without: its
    URLs carry whatever it asks for). With ``stream.tls``, the SSL context
    that trusts its CA as well."""
    if stream.type != "embedded":
        return {**external_options(stream), **tls_options(stream)}
    return {"user": user, "password": password(run_dir, user), **tls_options(stream)}


def external_options(stream) -> dict[str, str]:
    """``stream.credentials`` as ``nats.connect`` options (:func:`read_external`)."""
    return read_external(stream.credentials) if stream.credentials else {}


def tls_options(stream) -> dict:
    """``{"tls": <ssl context>}`` with ``stream.tls`` (:func:`tls_context`), else {}."""
    ctx = tls_context(stream)
    return {} if ctx is None else {"tls": ctx}


def client_url(listen: str, run_dir: str, user: str = CREWLET_USER) -> str:
    """``nats://<user>:<password>@<listen>``: the URL of the embedded broker
    listening on *listen*, authenticated as *user* (crewlet by default) —
    for a tool or a test that dials a node's broker itself (nats-py takes a
    server's user from its URL, so a pool of several nodes' URLs works too).
    It holds the password: never log it."""
    return f"nats://{user}:{password(run_dir, user)}@{listen}"


# --------------------------------------------------------------------------
# A fleet's links: the secret its members' routes and leaves share
# --------------------------------------------------------------------------

# A fleet secret: url-safe text (it is a URL's userinfo as it stands, and a
# quoted string in nats.conf with nothing to escape; never bcrypt's "$2a$").
FLEET_SECRET_RE = re.compile(r"^[A-Za-z0-9._~-]{32,256}$")
# Lines of a fleet credentials file: the secret in force, and the one it
# replaces while a rotation is under way (see the module docstring).
FLEET_SECRETS_MAX = 2
FLEET_USER_PREFIX = "fleet-"
# Hex digits of the secret's sha256 in its user name: enough to tell two apart.
FLEET_USER_DIGITS = 12


def check_private(path: str) -> None:
    """Refuse (ValueError) a secret file that group or others may read or
    write; OSError if it cannot be looked at."""
    mode = os.stat(path).st_mode
    if mode & 0o077:
        raise ValueError(f"{path} is mode {mode & 0o777:04o}, open to group or others: "
                         "a secret must be its owner's only (chmod 600)")


def read_fleet_secrets(path: str) -> list[str]:
    """The secrets of the fleet credentials file *path*, the one in force
    first. ValueError saying what is wrong with it; OSError if unreadable."""
    check_private(path)
    with open(path, encoding="utf-8") as f:
        text = f.read(64 * 1024)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"{path} holds no secret: make one with `crewletctl fleet-secret {path}`")
    if len(lines) > FLEET_SECRETS_MAX:
        raise ValueError(f"{path} holds {len(lines)} secrets; at most {FLEET_SECRETS_MAX}: "
                         "the one in force and, while a rotation is under way, the one before")
    for n, line in enumerate(lines, 1):
        if not FLEET_SECRET_RE.match(line):
            raise ValueError(f"{path}: secret {n} must be 32-256 letters, digits, '.', '_', '~' or '-' "
                             "(`crewletctl fleet-secret` makes one)")
    if len(set(lines)) != len(lines):
        raise ValueError(f"{path} holds the same secret twice")
    return lines


def fleet_secrets(stream) -> list[str]:
    """The fleet's secrets from ``stream.fleet_credentials``, the one in force
    first; [] when the node is not configured with any."""
    return read_fleet_secrets(stream.fleet_credentials) if stream.fleet_credentials else []


def fleet_user(secret: str) -> str:
    """The user name routes and leaves authenticate with along *secret*: made
    from it, so two secrets in use at once (a rotation) are two users."""
    return FLEET_USER_PREFIX + hashlib.sha256(secret.encode()).hexdigest()[:FLEET_USER_DIGITS]


def with_user(url: str, secret: str) -> str:
    """*url* carrying the fleet user of *secret*, unless it names a user already
    (an operator's own choice, kept as it stands)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://{fleet_user(secret)}:{secret}@{rest}"


def dial_urls(urls: list[str], held: list[str]) -> list[str]:
    """Each of *urls* with each secret, the one in force first: a leaf's
    remote, which tries its URLs one at a time, so a member not yet
    restarted onto a new secret is still reached with the old. Not a
    member's routes: nats-server dials every route URL at once, and two to
    one member race (:mod:`roles.broker.routes`)."""
    return [with_user(u, s) for u in urls for s in held]


def new_fleet_secret() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


def write_fleet_secrets(path: str, lines: list[str]) -> None:
    """Write *lines* to *path* (0600), whole before it is visible."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, ("\n".join(lines) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


# --------------------------------------------------------------------------
# An external broker (stream.type: nats), and TLS
# --------------------------------------------------------------------------

CREDS_JWT_MARK = "-----BEGIN NATS USER JWT-----"


def read_external(path: str) -> dict[str, str]:
    """The ``nats.connect`` options of the credentials file *path* of an
    external broker: a NATS ``.creds`` file (a user JWT and its nkey seed;
    nats-py needs the ``nkeys`` package to sign with it), or a file whose
    one line is ``user:password``. ValueError saying what is wrong."""
    check_private(path)
    with open(path, encoding="utf-8") as f:
        text = f.read(64 * 1024)
    if CREDS_JWT_MARK in text:
        if importlib.util.find_spec("nkeys") is None:  # nats-py imports it to sign the server's nonce
            raise ValueError(f"{path} is a NATS .creds file, which needs the nkeys package "
                             "(pip install 'nats-py[nkeys]')")
        return {"user_credentials": path}
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    user, sep, password = lines[0].partition(":") if len(lines) == 1 else ("", "", "")
    if not (user and sep and password):
        raise ValueError(f"{path} must be a NATS .creds file or hold one line user:password")
    return {"user": user, "password": password}


def tls_context(stream) -> ssl.SSLContext | None:
    """The client side of ``stream.tls``: trusts its ``ca`` only (and checks
    the server's name against the address dialled), presenting this node's
    cert when it has one; None without ``stream.tls``."""
    tls = stream.tls
    if tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca)
    if tls.cert and tls.key:
        ctx.load_cert_chain(tls.cert, tls.key)
    return ctx
