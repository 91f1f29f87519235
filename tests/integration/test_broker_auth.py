"""Only crewlet talks to a node's embedded broker (crewlet.credentials).

A real node; clients that are not crewlet — without credentials, with
stolen-looking but wrong ones, and, where the suite runs as root, as another
local user (uid ``nobody``) — are refused before they read or write
anything, and the estate log is untouched. crewlet's own credentials, read
from the run dir, do work (the same probe succeeds with them), so the
refusals are the broker's and not the probe's.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time

import nats
import pytest

from crewlet import credentials
from tests.conftest import Nodes
from tests.seats import node_url, read_nats

NOBODY = 65534
REFUSED_WITHIN = 3.0  # s: a client without credentials hears "no" in well under this

# Run as the other user: stdlib only, the NATS protocol by hand, so it needs
# nothing of the suite's (whose files that user may not read).
INTRUDER = r"""
import json, os, socket, sys
host, port, run_dir, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
out = {}
for name in ("broker-users.json", "nats.conf"):
    try:
        open(os.path.join(run_dir, name)).read()
        out[name] = "read"
    except OSError as exc:
        out[name] = type(exc).__name__

def attempt(connect, forge=True):
    s = socket.create_connection((host, port), timeout=5)
    f = s.makefile("rb")
    f.readline()  # the server's INFO
    what = b"SUB agents.inbox.> 1\r\nPUB estate.ops 5\r\nforge\r\n" if forge else b""
    s.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\n" + what + b"PING\r\n")
    lines = []
    try:
        while True:
            line = f.readline()
            if not line:
                break
            lines.append(line.decode().strip())
            if line.startswith(b"PONG"):
                break
    except OSError:
        pass
    s.close()
    return lines

out["anonymous"] = attempt({"verbose": False, "pedantic": False})
out["wrong"] = attempt({"verbose": False, "user": "crewlet", "pass": "c" * 43})
if password:
    out["crewlet"] = attempt({"verbose": False, "user": "crewlet", "pass": password}, forge=False)
print(json.dumps(out))
"""


# The other user runs the system's interpreter: the suite's may live where it
# cannot reach (a pyenv under /root).
SYSTEM_PYTHON = "/usr/bin/python3"


def _intrude(node, *, as_uid: int | None = None, password: str = "") -> dict:
    host, _, port = node.config["stream"]["listen"].rpartition(":")
    argv = [SYSTEM_PYTHON if as_uid is not None else sys.executable, "-I", "-S", "-c", INTRUDER, host, port, node.run_dir, password]

    def become() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(as_uid)

    out = subprocess.run(argv, capture_output=True, timeout=30, cwd="/",
                         preexec_fn=become if as_uid is not None else None)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def _estate_last(node) -> int:
    async def last(nc, js):
        return (await js.stream_info("ESTATE")).state.last_seq
    return read_nats(node_url(node), last)


REFUSED = ["-ERR 'Authorization Violation'"]


@pytest.fixture(scope="module")
def node():
    """One node for the module: its tests only read its files and knock on its
    broker (their intrusions are refused and change nothing)."""
    made = Nodes()
    try:
        yield made(node={"id": "auth"}).start()
    finally:
        made.close()


def test_credentials_are_made_at_first_start_and_only_the_service_user_reads_them(node):
    for name in (credentials.CREDENTIALS_FILE, "nats.conf"):
        mode = stat.S_IMODE(os.stat(os.path.join(node.run_dir, name)).st_mode)
        assert mode == 0o600, f"{name} is {mode:o}"
    assert stat.S_IMODE(os.stat(node.run_dir).st_mode) == 0o700
    users = credentials.read(node.run_dir)
    assert len(users[credentials.CREWLET_USER]) >= 40  # 32 random bytes, base64


def test_a_client_without_credentials_is_refused_within_a_bound(node):
    bare = f"nats://{node.config['stream']['listen']}"

    async def connect():
        errors: list[Exception] = []

        async def keep(exc):
            errors.append(exc)

        started = time.monotonic()
        with pytest.raises(Exception):
            await nats.connect(bare, connect_timeout=2, allow_reconnect=False,
                               max_reconnect_attempts=0, error_cb=keep)
        return time.monotonic() - started, errors

    took, errors = asyncio.run(connect())
    assert took < REFUSED_WITHIN
    assert any("authorization violation" in str(e).lower() for e in errors), errors


def test_anonymous_and_wrong_credentials_are_refused_and_the_estate_is_untouched(node):
    before = _estate_last(node)
    seen = _intrude(node, password=credentials.read(node.run_dir)["crewlet"])
    assert seen["anonymous"] == REFUSED and seen["wrong"] == REFUSED
    # The same probe with crewlet's credentials is admitted.
    assert seen["crewlet"] == ["PONG"]
    assert _estate_last(node) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as uid nobody")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"no {SYSTEM_PYTHON} to run as nobody")
def test_as_nobody_the_broker_and_its_credentials_are_out_of_reach(node):
    before = _estate_last(node)
    seen = _intrude(node, as_uid=NOBODY)
    assert seen["broker-users.json"] == "PermissionError"
    assert seen["nats.conf"] == "PermissionError"
    assert seen["anonymous"] == REFUSED and seen["wrong"] == REFUSED
    assert _estate_last(node) == before
