"""An external broker (``stream.type: nats``) with a user and password:
``stream.credentials`` names a file holding them (crewlet.credentials).

A real nats-server that admits one user, and a real node dialling it: with
the file the node runs and crewletctl reaches the broker; without it, or
with a wrong password, every connection is refused and the node never runs.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from crewlet import credentials
from crewlet.config import ConfigError, load_node_config
from tests.conftest import CREWLETCTL, NatsServer, free_port, wait_for

USER, PASSWORD = "crewlet-ext", "s3cret-of-the-external-broker"


@pytest.fixture
def guarded(short_tmp):
    """A JetStream nats-server that admits only USER."""
    d = os.path.join(short_tmp, "guarded")
    server = NatsServer("guarded", d, free_port(), conf=[
        f'jetstream {{ store_dir: "{os.path.join(d, "js")}" }}',
        f'authorization {{ users: [ {{ user: "{USER}", password: "{PASSWORD}" }} ] }}']).start()
    yield server
    server.stop()


def _creds(short_tmp: str, name: str, line: str, mode: int = 0o600) -> str:
    path = os.path.join(short_tmp, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.write(fd, f"# the external broker's user\n{line}\n".encode())
    os.close(fd)
    os.chmod(path, mode)
    return path


def _external(make_node, guarded, creds: str | None, node_id: str):
    stream = {"type": "nats", "servers": [guarded.url]}
    if creds is not None:
        stream["credentials"] = creds
    return make_node(node={"id": node_id, "roles": ["data", "seats"]}, stream=stream,
                     supervisor={"intensity": 2, "period": 60, "ready_timeout": 5})


@pytest.mark.timeout(90)
def test_a_node_on_an_external_broker_signs_in_with_its_credentials_file(guarded, make_node, short_tmp):
    node = _external(make_node, guarded, _creds(short_tmp, "ext.creds", f"{USER}:{PASSWORD}"), "ext")
    node.start(wait_ready=False)
    kids = node.wait_running(timeout=45)
    assert {"data_applier", "seats"} <= set(kids)
    wait_for(lambda: len((node.status()["fleet"] or {}).get("nodes", [])) == 1, 30, what="its presence")
    # crewletctl reads the same Tier A and signs in with the same file.
    done = subprocess.run([*CREWLETCTL, "-c", node.config_path, "history"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("line", [None, f"{USER}:not-the-password"])
def test_without_the_right_credentials_the_broker_refuses_the_node(guarded, make_node, short_tmp, line):
    creds = None if line is None else _creds(short_tmp, "wrong.creds", line)
    node = _external(make_node, guarded, creds, "refused")
    node.start(wait_ready=False)
    # Refused at every try, the node gives up (its restart intensity) rather than run.
    code = node.wait_exit(60)
    assert code != 0
    wait_for(lambda: "Authorization Violation" in node.read_log(), 5, what="the broker's refusal logged")
    assert "fleet" not in (node.status() or {})


@pytest.mark.parametrize("line, mode, problem", [
    (f"{USER}:{PASSWORD}", 0o644, "is mode 0644, open to group or others"),
    ("just-a-password", 0o600, "must be a NATS .creds file or hold one line user:password"),
    ("-----BEGIN NATS USER JWT-----\neyJ0eXAi\n------END NATS USER JWT------", 0o600, "needs the nkeys package"),
])
def test_a_credentials_file_that_will_not_do_is_a_config_error(short_tmp, line, mode, problem):
    creds = _creds(short_tmp, "bad.creds", line, mode)
    path = os.path.join(short_tmp, "crewlet.yaml")
    with open(path, "w") as f:
        f.write(f"stream: {{type: nats, servers: ['nats://127.0.0.1:4222'], credentials: {creds}}}\n")
    if problem == "needs the nkeys package" and credentials.importlib.util.find_spec("nkeys"):
        pytest.skip("nkeys is installed here: a .creds file is taken")
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    assert info.value.key == "stream.credentials" and problem in info.value.problem
    assert creds in info.value.problem
