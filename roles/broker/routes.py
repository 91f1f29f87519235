"""Which of the fleet's secrets to dial each member's routes with, while a
rotation holds two.

A member admits routes with one secret only (nats-server takes one route
user), the one in force. While a rotation is under way the file holds two
(:mod:`crewlet.credentials`), and a member restarted onto it must still reach
the members not yet restarted, which admit only the old one. It must not
dial one member with both, one URL per secret: nats-server registers a route
it solicited when the other side's INFO arrives, before that side has read
its credentials, so the URL it is about to refuse holds the member's place
for a moment, and the connection made with the right secret at the same
time is closed as a "Duplicate Route" — for the system account's route, and
for a pool connection that finds the pool full, with no reconnect. What goes
on retrying is the refused URL, and the member on the other side cannot dial
back (it holds the old secret only, which the restarted one refuses). The
pair is left without its ``$SYS`` route, which JetStream's raft traffic
uses, or one of its pool connections, for as long as both run (measured with
nats-server 2.15.1: 5 restarts of 15 on a 2-core machine; one URL per member,
0 of 15). Two members that still gossip each other but cannot vote together
lose the quorum as soon as the third one goes.

So before the broker starts, crewletd asks each member which secret it
admits (:func:`admits`: the route protocol's CONNECT with one secret, then a
PING: PONG is admitted, ``-ERR`` refused; no INFO is sent, so the member
registers nothing) and dials it with that one only. A member it cannot reach
is dialled with the secret in force: it is down, and when it starts it will
hold this node's copy of the file and admit that one. Whichever of two
members started last asked the other, so one of the two always dials right.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from urllib.parse import urlsplit

from crewlet import credentials
from crewlet.config import NodeConfig
from crewlet.config.model import is_route_to_self

# Seconds one question may take (connect, INFO, the answer), and for how
# long a member that accepts the connection but does not answer (a loaded
# machine) is asked again. A member refusing the connection is down: not
# asked again.
ASK_TIMEOUT = 2.0
ASK_WITHIN = 6.0

ADMITTED, REFUSED, DOWN, SILENT = "admitted", "refused", "down", "silent"


async def admits(url: str, secret: str, *, cluster: str, tls: ssl.SSLContext | None,
                 timeout: float = ASK_TIMEOUT) -> str:
    """Whether the member whose cluster address is *url* admits a route
    signing in with *secret*: ADMITTED, REFUSED, DOWN (no connection) or
    SILENT (connected, no answer in time)."""
    parts = urlsplit(url)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port), timeout)
    except (OSError, asyncio.TimeoutError):
        return DOWN
    try:
        if tls is not None:  # a route's TLS comes first, before the member's INFO
            await asyncio.wait_for(writer.start_tls(tls, server_hostname=parts.hostname), timeout)
        line = await asyncio.wait_for(reader.readline(), timeout)
        if not line.startswith(b"INFO "):
            return SILENT
        json.loads(line[5:])  # a nats-server's INFO, or this is not a member (ValueError)
        connect = {"verbose": False, "pedantic": False, "tls_required": tls is not None,
                   "user": credentials.fleet_user(secret), "pass": secret,
                   "name": "crewlet-route-question", "cluster": cluster}
        writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        await writer.drain()
        while True:
            line = await asyncio.wait_for(reader.readline(), timeout)
            if not line:
                return SILENT
            if line.startswith(b"PONG"):
                return ADMITTED
            if line.startswith(b"-ERR"):
                return REFUSED
    except (OSError, ssl.SSLError, ValueError, asyncio.TimeoutError):
        return SILENT
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), timeout)
        except (OSError, ssl.SSLError, asyncio.TimeoutError):
            pass


async def _choose(url: str, held: list[str], cluster: str, tls: ssl.SSLContext | None) -> tuple[str, str]:
    """(the secret to dial *url* with, what the member said)."""
    deadline = time.monotonic() + ASK_WITHIN
    for secret in held:
        while True:
            said = await admits(url, secret, cluster=cluster, tls=tls)
            if said != SILENT or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)
        if said == ADMITTED:
            return secret, said
        if said != REFUSED:  # down or silent: it will hold the secret in force
            return held[0], said
    return held[0], REFUSED  # it admits neither: a fleet misconfigured, say so


async def dial_secrets(cfg: NodeConfig) -> tuple[dict[str, str], dict[str, str]]:
    """({route URL: the secret to dial it with}, {route URL without
    credentials: what the member answered, by user}) for a member holding
    two secrets; ({}, {}) otherwise (every route is dialled with the one)."""
    stream = cfg.stream
    cluster = stream.cluster
    if stream.type != "embedded" or cluster is None or stream.leaf is not None:
        return {}, {}
    held = credentials.fleet_secrets(stream)
    if len(held) < 2:
        return {}, {}
    routes = [r for r in cluster.routes if not is_route_to_self(r, cluster.listen)
              and credentials.with_user(r, held[0]) != r]  # a URL naming its own user is the operator's
    tls = credentials.tls_context(stream)
    chosen = await asyncio.gather(*(_choose(r, held, cluster.name, tls) for r in routes))
    dial = {r: secret for r, (secret, _) in zip(routes, chosen)}
    told = {r: f"{said}: {credentials.fleet_user(secret)}" for r, (secret, said) in zip(routes, chosen)}
    return dial, told
