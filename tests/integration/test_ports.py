"""A node's listening addresses: bind failures are configuration errors (exit
78, one line naming the file and the key), and the broker a node takes for
its own is its own.

Real crewletd nodes, real nats-servers, real sockets held by the test; each
node's refusal is bounded to a few seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import time

import pytest

from crewlet.config import NodeConfig
from crewlet.coord import buckets
from roles import broker
from supervisor.node import Node
from supervisor.spec import StartFailed
from supervisor.zygote import Zygote
from tests.conftest import free_port, make_fleet_secret, nats_binary, wait_for
from tests.seats import held, node_url, read_nats, write_company

# A refusal at start takes crewletd's imports and the check: well under this.
REFUSED_WITHIN = 5.0

COMPANY = """
company: {name: t}
providers: {p: {kind: scripted}}
seats:
  - {name: s0, persona: seat 0, provider: p}
  - {name: s1, persona: seat 1, provider: p}
  - {name: s2, persona: seat 2, provider: p}
"""


def refused(node, key: str) -> str:
    """Start *node*; it must exit 78 within REFUSED_WITHIN with one line naming
    its config file and *key*. Returns that line's problem."""
    t0 = time.monotonic()
    node.start(wait_ready=False)
    code = node.wait_exit(REFUSED_WITHIN)
    took = time.monotonic() - t0
    log = node.read_log()
    assert code == 78, f"exit {code}:\n{log[-3000:]}"
    assert took < REFUSED_WITHIN
    lines = [line for line in log.splitlines() if line.startswith("crewletd: configuration error: ")]
    assert len(lines) == 1, log[-3000:]
    prefix = f"crewletd: configuration error: {node.config_path}: {key}: "
    assert lines[0].startswith(prefix), lines[0]
    assert "Traceback" not in log
    return lines[0][len(prefix):]


def listening(port: int, host: str = "127.0.0.1") -> socket.socket:
    """A plain socket (not a broker) listening on *port*, as the test's own."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen()
    return sock


def port_of(value: str) -> int:
    return int(value.rpartition(":")[2])


def seat_leases(node) -> dict[str, tuple[str, int]]:
    """seat -> (holding node, fence token), as *node*'s fleet view shows it."""
    st = node.status() or {}
    return {s["name"]: (s["node"], s["token"]) for s in (st.get("fleet") or {}).get("seats") or []}


# ------------------------------------------------------------ another node's broker

def test_a_node_on_another_nodes_stream_port_exits_78_and_the_other_keeps_every_seat(make_node):
    a = make_node(node={"id": "a"})
    a.start(args=("--company", write_company(a.dir, COMPANY)))
    wait_for(lambda: held(a) == {"s0": "a", "s1": "a", "s2": "a"}, 30, what="a holding every seat")
    before = seat_leases(a)
    a_broker = a.children()["broker"]["pid"]

    b = make_node(node={"id": "b"}, stream={"listen": a.config["stream"]["listen"]})
    problem = refused(b, "stream.listen")
    assert problem.startswith(f"{a.config['stream']['listen']} is in use")
    assert f"by pid {a_broker}:" in problem  # the holder, named

    # a's seats never moved (a seat released and claimed again has a new token),
    # and b never joined a's fleet: no presence of b was ever written.
    assert seat_leases(a) == before
    assert [n["id"] for n in a.status()["fleet"]["nodes"]] == ["a"]
    ever = read_nats(node_url(a), lambda nc, js: buckets.subjects(js, "leases", "node.>"))
    assert ever == ["node.a"]
    assert a.children()["broker"]["pid"] == a_broker


# ------------------------------------------------------------ checked before any child

def test_ingress_port_in_use_exits_78_naming_ingress_listen(make_node):
    node = make_node()
    with listening(port_of(node.config["ingress"]["listen"])):
        problem = refused(node, "ingress.listen")
    assert problem.startswith(f"{node.config['ingress']['listen']} is in use (by pid {os.getpid()}:")


def test_stream_port_held_by_a_plain_socket_exits_78_naming_stream_listen(make_node):
    node = make_node()
    with listening(port_of(node.config["stream"]["listen"])):
        problem = refused(node, "stream.listen")
    assert problem.startswith(f"{node.config['stream']['listen']} is in use")


def test_stream_port_equal_to_ingress_port_exits_78(make_node):
    both = f"127.0.0.1:{free_port()}"
    node = make_node(stream={"listen": both}, ingress={"listen": both})
    # Refused by the config's own check (crewlet/config/model.py) before any bind is tried.
    problem = refused(node, "ingress.listen")
    assert both in problem and "stream.listen" in problem, problem


@pytest.mark.parametrize("section, address, problem", [
    ("stream", "no-such-host.invalid:4222", "cannot resolve host 'no-such-host.invalid'"),
    ("ingress", "no-such-host.invalid:7420", "cannot resolve host 'no-such-host.invalid'"),
    # TEST-NET-1 (RFC 5737): never an address of this machine.
    ("stream", "192.0.2.1:4222", "192.0.2.1 is not an address of this machine"),
    ("ingress", "192.0.2.1:7420", "192.0.2.1 is not an address of this machine"),
])
def test_a_host_that_cannot_be_listened_on_exits_78_naming_the_key(make_node, section, address,
                                                                    problem):
    node = make_node(**{section: {"listen": address}})
    assert refused(node, f"{section}.listen").startswith(problem)


def test_a_members_cluster_port_in_use_exits_78_naming_stream_cluster_listen(make_node):
    member = {"name": "c", "listen": f"127.0.0.1:{free_port()}",
              "routes": [f"nats-route://127.0.0.1:{free_port()}"]}
    node = make_node(stream={"cluster": member})
    with listening(port_of(member["listen"])):
        problem = refused(node, "stream.cluster.listen")
    assert problem.startswith(f"{member['listen']} is in use")


# ------------------------------------------------------------ taken after the check

def test_ingress_port_taken_after_the_check_exits_78_naming_ingress_listen(make_node):
    """The race the check cannot close: the port is free when crewletd checks
    it and taken before ingress binds (ingress starts after the broker, fleet
    and data_applier are ready). The child's bind failure is the config error."""
    node = make_node()
    node.start(wait_ready=False)
    node.wait_event("crewletd_starting", timeout=REFUSED_WITHIN)  # the check is behind it
    with listening(port_of(node.config["ingress"]["listen"])):
        code = node.wait_exit(30)
    assert code == 78, node.read_log()[-3000:]
    assert node.wait_event("config_error", role="ingress")["key"] == "ingress.listen"
    lines = [line for line in node.read_log().splitlines()
             if line.startswith("crewletd: configuration error: ")]
    assert len(lines) == 1 and lines[0].startswith(
        f"crewletd: configuration error: {node.config_path}: ingress.listen: "
        f"{node.config['ingress']['listen']} is in use (by pid {os.getpid()}:"), lines
    # Not restarted: restarting cannot fix a configuration.
    assert sum(e.get("event") == "child_start_failed" and e.get("child") == "ingress"
               for e in node.events()) == 1


def _broker_start(cfg: NodeConfig):
    """Start only *cfg*'s broker child, as crewletd's tree would (no pre-flight
    check): returns the start's StartFailed, or the running child's exit."""
    async def main():
        zygote = Zygote(title="test zygote", preload=())
        node = Node(cfg, zygote)
        await node.host.open()
        try:
            try:
                running = await node.broker_child().start(0)
            except StartFailed as exc:
                return "start failed", exc.info, node
            try:
                info = await asyncio.wait_for(asyncio.shield(running.exited), 10)
            finally:
                await running.stop(5)
            return "exited", info, node
        finally:
            node.host.close()
            await zygote.aclose()
            node._ctx.term()
    return asyncio.run(main())


def _config(short_tmp: str, **stream) -> NodeConfig:
    if "cluster" in stream:  # a member holds the fleet's secret
        stream["fleet_credentials"] = make_fleet_secret(os.path.join(short_tmp, "fleet.secret"))
    return NodeConfig.model_validate({
        "node": {"id": "ours"}, "data_dir": os.path.join(short_tmp, "data"),
        "stream": stream, "supervisor": {"ready_timeout": 10},
    }).model_copy(update={"source": "/etc/ours.yaml"})


def test_a_broker_whose_port_another_broker_answers_is_not_taken_for_ours(natsd, short_tmp):
    """The race again, on the broker: another node's broker answers on the
    port. Readiness must not accept it (the node would join its fleet); the
    child's own fatal bind error is the config error, named by its key."""
    cfg = _config(short_tmp, listen=f"127.0.0.1:{natsd.port}")
    os.makedirs(cfg.run_dir, mode=0o700)
    how, info, node = _broker_start(cfg)
    assert how == "start failed", f"another broker was taken for ours: {info}"
    assert info.code == 78
    assert info.reason.startswith(f"/etc/ours.yaml: stream.listen: 127.0.0.1:{natsd.port} is in use")
    assert node.config_problem == info.reason


def test_a_members_cluster_port_taken_after_the_check_is_a_config_error(short_tmp):
    """nats-server opens its client port before its cluster port: it may be
    ready, then die of the cluster port. That exit is a config error too."""
    cluster = {"name": "c", "listen": f"127.0.0.1:{free_port()}",
               "routes": [f"nats-route://127.0.0.1:{free_port()}"]}
    cfg = _config(short_tmp, listen=f"127.0.0.1:{free_port()}", cluster=cluster)
    os.makedirs(cfg.run_dir, mode=0o700)
    with listening(port_of(cluster["listen"])):
        _, info, _ = _broker_start(cfg)
    assert info.code == 78
    assert info.reason.startswith(f"/etc/ours.yaml: stream.cluster.listen: {cluster['listen']} is in use")


def test_the_probe_does_not_take_another_server_for_this_nodes_broker(natsd):
    """Another server on the port: not ready, by pid (this test process does
    not hold the port) nor by name (it is not called ours)."""
    async def probe(within: float, **ours):
        await broker.probe(natsd.url, asyncio.get_running_loop().time() + within, **ours)

    for ours in ({"pid": os.getpid()}, {"name": "ours"}):
        with pytest.raises(TimeoutError, match="not ready: .*(another process|not 'ours')"):
            asyncio.run(probe(0.5, **ours))
    asyncio.run(probe(5, name="solo", pid=natsd.proc.pid))  # the server's own name and pid: ready


# ------------------------------------------------------------ nats-server's own words

@pytest.mark.parametrize("where", ["port", "cluster", "leafnodes"])
def test_nats_servers_fatal_bind_line_names_the_key(short_tmp, where):
    """What a real nats-server says when a listener is taken, read as the key."""
    taken = free_port()
    cluster = {"name": "c", "listen": f"127.0.0.1:{free_port()}",
               "routes": [f"nats-route://127.0.0.1:{free_port()}"],
               "leaf_listen": f"127.0.0.1:{free_port()}"}
    key = {"port": "stream.listen", "cluster": "stream.cluster.listen",
           "leafnodes": "stream.cluster.leaf_listen"}[where]
    listen = f"127.0.0.1:{taken if where == 'port' else free_port()}"
    if where == "cluster":
        cluster["listen"] = f"127.0.0.1:{taken}"
    elif where == "leafnodes":
        cluster["leaf_listen"] = f"127.0.0.1:{taken}"
    cfg = _config(short_tmp, listen=listen, cluster=cluster)
    os.makedirs(cfg.run_dir, mode=0o700)
    conf = broker.write_config(cfg)
    with listening(taken):
        out = subprocess.run([nats_binary(), "-c", conf], capture_output=True, timeout=10)
    assert out.returncode != 0
    found = [p for line in (out.stdout + out.stderr).splitlines()
             if (p := broker.listen_problem(cfg, line))]
    assert len(found) == 1 and found[0][0] == key
    assert re.match(rf"127\.0\.0\.1:{taken} is in use", found[0][1])
