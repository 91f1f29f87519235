"""API tokens: what a caller of the HTTP API presents, and what a node keeps.

A token is a random string the caller sends as ``Authorization: Bearer
<token>``. A node never keeps a token, only its sha256 (hex) with a name and
scopes; the token itself is shown once, to whoever made it, and is never
logged (requests are logged by the token's *name*).

Scopes, each implying the ones before it:

=======  =================================================================
read     every ``GET`` of ``/v1`` (and the live feed)
write    mail, tasks, pages, requeueing dead letters
admin    applying a company revision
=======  =================================================================

Where a node's tokens come from (Tier A, ``ingress``):

* ``ingress.tokens``: a list of ``{name, sha256, scopes}``;
* ``ingress.tokens_file``: a file of lines ``<sha256> <scope>[,<scope>] <name>
  [<person>]`` (``#`` starts a comment), for a secret store that writes files;
* neither: the node makes one admin token on its first start, in its run dir
  (:data:`ADMIN_TOKEN_FILE`, mode 0600), and keeps it across restarts.
  ``crewletctl`` reads it from there, and ``crewletctl status`` names it.

A token may belong to a person of the company (``person``, an id of its
``people:``): an approval decided with it is that person's, and only a person
the company allows for the seat may decide (:mod:`crewlet.people`).

``crewletctl token`` makes a new token and prints the line to configure.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from typing import Iterable

SCOPES = ("read", "write", "admin")
# The first-start admin token, in the node's run dir.
ADMIN_TOKEN_FILE = "api-token"
# What every made token starts with: a leaked one is recognisable (secret scanners).
PREFIX = "cwl_"
TOKEN_BYTES = 32
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}$")
# The id of a person of the company (``people:``), whom a token may belong to.
PERSON_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


def digest(token: str) -> str:
    """The sha256 (hex) a node keeps of *token*."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh token: :data:`PREFIX` and 256 random bits."""
    return PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def implied(scopes: Iterable[str]) -> frozenset[str]:
    """*scopes* with every scope they imply (admin ⊃ write ⊃ read)."""
    top = max((SCOPES.index(s) for s in scopes if s in SCOPES), default=-1)
    return frozenset(SCOPES[:top + 1])


@dataclass(frozen=True)
class Grant:
    """One configured token: its *name* (what logs show), its digest, its scopes."""

    name: str
    sha256: str
    scopes: frozenset[str]
    # The person of the company the token belongs to (``people:``): who decides
    # an approval made with it, and whether they may.
    person: str | None = None


class Keyring:
    """The tokens a node accepts. Invariant: no two grants share a digest."""

    def __init__(self, grants: Iterable[Grant]):
        self.grants = tuple(grants)

    def __len__(self) -> int:
        return len(self.grants)

    def check(self, token: str) -> Grant | None:
        """The grant of *token*, None if it is none of ours.

        Every digest is compared, in constant time, whatever matched: how
        long an answer takes says nothing about which token was close.
        """
        seen = digest(token)
        found = None
        for grant in self.grants:
            if hmac.compare_digest(seen, grant.sha256):
                found = grant
        return found


def parse_line(line: str) -> Grant | None:
    """A grant from one line of a tokens file; None for a blank or comment line.
    ValueError naming the problem otherwise."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    parts = text.split()
    if len(parts) not in (3, 4):
        raise ValueError(f"expected '<sha256> <scopes> <name> [<person>]', got {len(parts)} fields")
    sha, scopes, name = parts[:3]
    person = parts[3] if len(parts) == 4 else None
    if person is not None and not PERSON_RE.match(person):
        raise ValueError(f"bad person {person!r}: an id of the company's people (1-63 of a-z, 0-9, '_', '.', '-')")
    if not SHA256_RE.match(sha):
        raise ValueError("the first field must be a token's sha256, 64 lowercase hex digits")
    wanted = scopes.split(",")
    bad = [s for s in wanted if s not in SCOPES]
    if bad:
        raise ValueError(f"unknown scope {bad[0]!r}; scopes: {', '.join(SCOPES)}")
    if not NAME_RE.match(name):
        raise ValueError(f"bad token name {name!r}: 1-63 letters, digits, '_', '.', '@' or '-'")
    return Grant(name, sha, implied(wanted), person)


def read_file(path: str) -> list[Grant]:
    """The grants of tokens file *path*; ValueError ``line N: <problem>``."""
    grants = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                grant = parse_line(line)
            except ValueError as exc:
                raise ValueError(f"line {number}: {exc}") from None
            if grant is not None:
                grants.append(grant)
    return grants


def admin_token_path(run_dir: str) -> str:
    return os.path.join(run_dir, ADMIN_TOKEN_FILE)


def ensure_admin_token(run_dir: str) -> tuple[str, bool]:
    """The first-start admin token of the node whose run dir is *run_dir*:
    ``(token, made)``. Made (0600, written whole before it is visible) if the
    file does not exist; read otherwise."""
    path = admin_token_path(run_dir)
    try:
        return read_admin_token(run_dir), False
    except FileNotFoundError:
        pass
    token = new_token()
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)   # fails if another process made one meanwhile: keep theirs
        made = True
    except FileExistsError:
        made = False
    finally:
        os.unlink(tmp)
    return (token, True) if made else (read_admin_token(run_dir), False)


def read_admin_token(run_dir: str) -> str:
    """The node's first-start admin token; FileNotFoundError if it has none."""
    with open(admin_token_path(run_dir), encoding="utf-8") as f:
        return f.read().strip()
