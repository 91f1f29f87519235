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

The file is JSON: ``{"users": {"<user>": "<password>"}}``. Today it holds one
user, :data:`CREWLET_USER`, allowed every subject: every role and crewletctl
use it. Narrowing it to one user per role with the subjects that role needs
is the next step, and the file's shape leaves room for it.

Rotating: stop the node, delete the file, start the node; a new password is
made and nothing else changes (nothing outside the node ever held it).

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

CREDENTIALS_FILE = "broker-users.json"
CREWLET_USER = "crewlet"
# A fleet's leaf links, until a fleet shares credentials: public, not a secret.
LEAF_USER = "crewlet-leaf"
LEAF_PASSWORD = "crewlet-leaf"
PASSWORD_BYTES = 32  # of randomness; url-safe base64 text, so it is a URL's userinfo as it stands


def path(run_dir: str) -> str:
    return os.path.join(run_dir, CREDENTIALS_FILE)


def ensure(run_dir: str) -> dict[str, str]:
    """The users of the broker of the node whose run dir is *run_dir*
    (``{user: password}``): made (0600, written whole before it is visible)
    if the file does not exist, read otherwise."""
    try:
        return read(run_dir)
    except FileNotFoundError:
        pass
    target = path(run_dir)
    users = {CREWLET_USER: secrets.token_urlsafe(PASSWORD_BYTES)}
    tmp = f"{target}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (json.dumps({"users": users}) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, target)  # fails if another process made one meanwhile: keep theirs
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return read(run_dir)


def read(run_dir: str) -> dict[str, str]:
    """The node's broker users; FileNotFoundError if it has none yet."""
    with open(path(run_dir), encoding="utf-8") as f:
        users = json.load(f)["users"]
    if not isinstance(users, dict) or CREWLET_USER not in users:
        raise ValueError(f"{path(run_dir)}: no {CREWLET_USER!r} user; delete the file "
                         "and restart the node to make new credentials")
    return users


def client_options(stream, run_dir: str) -> dict[str, str]:
    """The keyword arguments of ``nats.connect`` that authenticate a client of
    the node whose ``stream`` section and run dir are given: crewlet's user
    for an embedded broker; none for ``stream.type: nats`` (its URLs carry
    whatever it asks for)."""
    if stream.type != "embedded":
        return {}
    return {"user": CREWLET_USER, "password": read(run_dir)[CREWLET_USER]}


def client_url(listen: str, run_dir: str) -> str:
    """``nats://crewlet:<password>@<listen>``: the URL of the embedded broker
    listening on *listen*, authenticated as crewlet — for a tool or a test
    that dials a node's broker itself (nats-py takes a server's user from its
    URL, so a pool of several nodes' URLs works too). It holds the password:
    never log it."""
    return f"nats://{CREWLET_USER}:{read(run_dir)[CREWLET_USER]}@{listen}"


def leaf_url(remote: str) -> str:
    """A leaf's *remote* URL with the leaf user in it, unless it names a user already."""
    scheme, sep, rest = remote.partition("://")
    if not sep or "@" in rest.split("/", 1)[0]:
        return remote
    return f"{scheme}://{LEAF_USER}:{LEAF_PASSWORD}@{rest}"
