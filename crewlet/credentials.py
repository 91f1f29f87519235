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

Not yet covered: the links between the nodes of a fleet. Each node makes
its own credentials, so no node knows another's. Cluster routes are admitted
without credentials, as before. A member's leaf-node listener must name some
user (without one, nats-server holds leaves to the client users, and a leaf
cannot know them), so it admits :data:`LEAF_USER` with the fixed, public
:data:`LEAF_PASSWORD`, and a leaf dials its remotes with them. That keeps a
fleet's leaves working and is no secret: the leaf port is as open as it was.
Credentials shared by a fleet (from a file or the environment) are the next
step; see the README, "Security".
"""

from __future__ import annotations

import json
import os
import secrets

from crewlet.config.model import CHILD_FOR_ROLE

CREDENTIALS_FILE = "broker-users.json"
CREWLET_USER = "crewlet"
# The users of a node's broker: crewlet's own (crewletd, crewletctl) and one
# per role, named as the role's child (crewlet.config.model.CHILD_FOR_ROLE).
ROLE_USERS = tuple(CHILD_FOR_ROLE.values())
USERS = (CREWLET_USER, *ROLE_USERS)
# A fleet's leaf links, until a fleet shares credentials: public, not a secret.
LEAF_USER = "crewlet-leaf"
LEAF_PASSWORD = "crewlet-leaf"
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


def client_options(stream, run_dir: str, user: str = CREWLET_USER) -> dict[str, str]:
    """The keyword arguments of ``nats.connect`` that authenticate a client of
    the node whose ``stream`` section and run dir are given, as *user* (a
    role's child name, or crewlet's): for an embedded broker; none for
    ``stream.type: nats`` (its URLs carry whatever it asks for)."""
    if stream.type != "embedded":
        return {}
    return {"user": user, "password": password(run_dir, user)}


def client_url(listen: str, run_dir: str, user: str = CREWLET_USER) -> str:
    """``nats://<user>:<password>@<listen>``: the URL of the embedded broker
    listening on *listen*, authenticated as *user* (crewlet by default) —
    for a tool or a test that dials a node's broker itself (nats-py takes a
    server's user from its URL, so a pool of several nodes' URLs works too).
    It holds the password: never log it."""
    return f"nats://{user}:{password(run_dir, user)}@{listen}"


def leaf_url(remote: str) -> str:
    """A leaf's *remote* URL with the leaf user in it, unless it names a user already."""
    scheme, sep, rest = remote.partition("://")
    if not sep or "@" in rest.split("/", 1)[0]:
        return remote
    return f"{scheme}://{LEAF_USER}:{LEAF_PASSWORD}@{rest}"
