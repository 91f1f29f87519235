"""Who may call the API: bearer tokens and their scopes (:mod:`crewlet.tokens`).

Every ``/v1`` route depends on :func:`need` with the scope it takes; no token
(or one the node does not know) is a 401 with ``WWW-Authenticate: Bearer``, a
token without the scope a 403 naming the scope it needs. The caller's grant
is put on ``request.state.caller``, so logs and writes name the token's
*name*; the token itself is never kept or logged.
"""

from __future__ import annotations

from typing import Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from crewlet import log, tokens
from crewlet.config import NodeConfig
from crewlet.tokens import Grant, Keyring
from roles.ingress.problems import Problem

# The OpenAPI document names the scheme; auto_error off: we answer the 401 ourselves.
bearer = HTTPBearer(auto_error=False, description="An API token: `Authorization: Bearer <token>`")
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="crewlet"'}


def keyring(cfg: NodeConfig) -> Keyring:
    """The tokens this node accepts (Tier A), or its first-start admin token."""
    ingress = cfg.ingress
    if ingress.configured_tokens:
        grants = [Grant(t.name, t.sha256, tokens.implied(t.scopes), t.person) for t in ingress.tokens]
        if ingress.tokens_file is not None:
            grants += tokens.read_file(ingress.tokens_file)
        return Keyring(grants)
    token, made = tokens.ensure_admin_token(cfg.run_dir)
    if made:
        log.event("api_token_made", path=tokens.admin_token_path(cfg.run_dir))
    return Keyring([Grant("admin@" + cfg.node.id, tokens.digest(token), tokens.implied(["admin"]))])


def caller(request: Request, token: str | None) -> Grant:
    """The grant of *token*, or the 401."""
    ring: Keyring = request.app.state.keyring
    grant = ring.check(token) if token else None
    if grant is None:
        why = "no bearer token" if not token else "a token this node does not know"
        raise Problem(401, "unauthorized", f"{why}: send Authorization: Bearer <token> "
                                           "(crewletctl status says where a node keeps its first one)",
                      headers=CHALLENGE)
    request.state.caller = grant
    return grant


def need(scope: str) -> Callable:
    """A dependency: the caller's grant, which has *scope* (else 401/403)."""
    assert scope in tokens.SCOPES

    # async: FastAPI runs a plain def dependency in its thread pool, a hop to a
    # thread and back on every request for a sha256 and a set lookup.
    async def check(request: Request,
                    credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Grant:
        grant = caller(request, credentials.credentials if credentials else None)
        if scope not in grant.scopes:
            raise Problem(403, "forbidden", f"token {grant.name} has scopes "
                                            f"{', '.join(sorted(grant.scopes)) or 'none'}; "
                                            f"this needs {scope}")
        return grant

    return check


READ, WRITE, ADMIN = need("read"), need("write"), need("admin")
