"""Data nodes' brokers form one JetStream cluster; a node without data is a leaf.

Real crewletd processes (``make_node``) on free loopback ports. Each node is
started without waiting for it, node by node, as an operator would: a member
whose peers are not up yet must still count as started (its JetStream answers
only once a quorum of members has elected a meta leader). Anything that talks
to JetStream right after the cluster formed retries until a deadline: the
meta leader is elected some time after the routes are up.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import nats
import pytest

from crewlet import bus, credentials, permissions
from crewlet.config import NodeConfig
from roles import broker
from tests.conftest import CREWLETCTL, free_port, make_fleet_secret, wait_for
from tests.seats import node_url

DOMAIN = "crewlet"  # the default stream.domain


def url(node) -> str:
    return node_url(node)


def make_members(make_node, ids=("fa", "fb", "fc"), cluster="crewtest", **overrides):
    """Three data nodes (config only) whose brokers are members of one cluster,
    each accepting leaves; returns (nodes, their leaf URLs). *overrides* go to
    every node's config."""
    cports = [free_port() for _ in ids]
    lports = [free_port() for _ in ids]
    nodes = []
    for i, node_id in enumerate(ids):
        nodes.append(make_node(node={"id": node_id}, **overrides, stream={"replicas": 3, "cluster": {
            "name": cluster,
            "listen": f"127.0.0.1:{cports[i]}",
            "routes": [f"nats-route://127.0.0.1:{p}" for j, p in enumerate(cports) if j != i],
            "leaf_listen": f"127.0.0.1:{lports[i]}"}}))
    return nodes, [f"nats-leaf://127.0.0.1:{p}" for p in lports]


def start_alone(node, timeout: float = 15.0) -> None:
    """Start *node* and wait until its broker counts as started, whatever else is up."""
    node.start(wait_ready=False)

    def broker_running():
        assert node.proc.poll() is None, f"crewletd exited {node.proc.returncode}:\n{node.read_log()[-3000:]}"
        return node.children().get("broker", {}).get("state") == "running"
    wait_for(broker_running, timeout, what=f"{node.config['node']['id']}'s broker running")


async def retry(make, timeout: float = 20.0, what: str = "JetStream"):
    """Await ``make()`` until it succeeds; the last error once *timeout* passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await make()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.fleet
@pytest.mark.timeout(90)
def test_three_data_nodes_started_one_by_one_form_one_r3_cluster(make_node):
    nodes, _ = make_members(make_node)
    ids = {n.config["node"]["id"] for n in nodes}
    for node in nodes:
        # The first member has no peer yet: its broker is ready all the same.
        start_alone(node)
    for node in nodes:
        kids = node.wait_running(timeout=30)
        assert all(c["restarts"] == 0 for c in kids.values()), kids
    for node in nodes:
        conf = open(os.path.join(node.run_dir, "nats.conf")).read()
        assert "cluster {" in conf and f'domain: "{DOMAIN}"' in conf
        assert node.config["stream"]["cluster"]["listen"] not in conf.split("routes:")[1]

    async def check():
        ncs = [await nats.connect(url(n), connect_timeout=2) for n in nodes]
        try:
            js1, js2, js3 = (bus.jetstream(nc, NodeConfig.model_validate(n.config).stream)
                             for nc, n in zip(ncs, nodes))
            await retry(lambda: js1.add_stream(name="FLEET", subjects=["fleet.>"], num_replicas=3),
                        what="an R3 stream")
            ack = await retry(lambda: js2.publish("fleet.hello", b"from node 2",
                                                  headers={"Nats-Msg-Id": "hello-1"}))
            got = await retry(lambda: js3.get_msg("FLEET", ack.seq))
            assert got.data == b"from node 2"
            sub = await js3.pull_subscribe("fleet.hello", stream="FLEET")
            [msg] = await retry(lambda: sub.fetch(1, timeout=2))
            assert msg.data == b"from node 2"
            await msg.ack()
            info = await js3.stream_info("FLEET")
            assert info.config.num_replicas == 3
            assert info.cluster.name == "crewtest"
            peers = [info.cluster.leader, *(p.name for p in info.cluster.replicas)]
            assert sorted(peers) == sorted(ids)  # a leader and two replicas, one per node
            for nc in ncs:
                assert nc._server_info.get("domain") == DOMAIN
        finally:
            for nc in ncs:
                await nc.close()

    asyncio.run(check())


@pytest.mark.fleet
@pytest.mark.timeout(90)
def test_stateless_node_runs_a_leaf_and_reaches_the_members_jetstream_through_the_domain(make_node):
    members, leaf_urls = make_members(make_node)
    stateless = make_node(node={"id": "fd", "roles": ["seats"]},
                          stream={"replicas": 3, "leaf": {"remotes": leaf_urls}})
    # A leaf is ready with no member up: it keeps dialling them.
    stateless.start(wait_ready=False)
    stateless.wait_running(timeout=15)
    for node in members:
        start_alone(node)
    for node in members:
        node.wait_running(timeout=30)
    kids = stateless.wait_running(timeout=5)
    assert set(kids) >= {"broker", "seats"} and "data_applier" not in kids and "ingress" not in kids
    assert all(c["state"] == "running" and c["restarts"] == 0 for c in kids.values()), kids
    conf = open(os.path.join(stateless.run_dir, "nats.conf")).read()
    assert "jetstream" not in conf and "leafnodes {" in conf
    assert not os.path.exists(broker.store_dir(NodeConfig.model_validate(stateless.config)))

    async def check():
        member = await nats.connect(url(members[0]), connect_timeout=2)
        leaf = await nats.connect(url(stateless), connect_timeout=2)
        try:
            assert not leaf._server_info.get("jetstream")  # no JetStream of its own
            await retry(lambda: member.jetstream(timeout=2).add_stream(
                name="WORK", subjects=["work.>"], num_replicas=3), what="an R3 stream")
            js = bus.jetstream(leaf, NodeConfig.model_validate(stateless.config).stream)
            # What the test asks for, spelled out: the domain is how a leaf gets there.
            direct = leaf.jetstream(domain=DOMAIN, timeout=2)
            account = await retry(direct.account_info, what="JetStream through the leaf")
            assert account.domain == DOMAIN
            assert (await js.account_info()).domain == DOMAIN
            # Without the domain nobody answers (the leaf has no JetStream of its own).
            # (the leaf's server answers 503 for a JetStream it does not have).
            with pytest.raises(nats.js.errors.ServiceUnavailableError):
                await leaf.jetstream(timeout=0.5).account_info()
            ack = await retry(lambda: js.publish("work.1", b"from the leaf",
                                                 headers={"Nats-Msg-Id": "leaf-1"}))
            assert ack.stream == "WORK" and ack.domain == DOMAIN
            got = await member.jetstream(timeout=2).get_msg("WORK", ack.seq)
            assert got.data == b"from the leaf"
            info = await js.stream_info("WORK")
            assert info.config.num_replicas == 3 and len(info.cluster.replicas) == 2
        finally:
            await leaf.close()
            await member.close()

    async def seats_on_the_leaf():
        # A role's rights hold on the leaf's broker, where it connects: the
        # leaf's seats user reaches the members' leases through the domain,
        # and the leaf refuses it the grants bucket before anything is forwarded.
        errors = []

        async def keep(exc):
            errors.append(str(exc).lower())
        leaf = await nats.connect(credentials.client_url(stateless.config["stream"]["listen"],
                                                         stateless.run_dir, "seats"),
                                  connect_timeout=2, error_cb=keep,
                                  inbox_prefix=permissions.inbox("seats", "fd"))
        try:
            js = bus.jetstream(leaf, NodeConfig.model_validate(stateless.config).stream)
            # The members' crewletd makes the bucket once they have a quorum: maybe not yet.
            info = await retry(lambda: js.stream_info("KV_leases"), 30, what="KV_leases through the domain")
            assert info.config.name == "KV_leases"
            with pytest.raises(nats.errors.TimeoutError):
                await leaf.request(f"$JS.{DOMAIN}.API.$KV.grants.forged.1.0", b"{}", timeout=0.5)
            assert any("permissions violation" in e and "$kv.grants.forged" in e for e in errors), errors
        finally:
            await leaf.close()

    asyncio.run(check())
    asyncio.run(seats_on_the_leaf())
    # A fleet secret set through the leaf's crewletd is written through the
    # domain, read by every member, and followed by the leaf's own seats.
    def set_probe():
        out = subprocess.run([*CREWLETCTL, "-c", stateless.config_path, "secret", "set", "probe"],
                             input="leaf-set-value-0123", capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 or "not joined the fleet yet" in out.stderr, out
        return out.returncode == 0 and out
    out = wait_for(set_probe, 30, interval=0.5, what="the leaf's crewletd joined, the secret set")
    assert "version 1" in out.stdout, out
    def listed_by_a_member():
        out = subprocess.run([*CREWLETCTL, "-c", members[0].config_path, "secret", "list", "--json"],
                             capture_output=True, text=True, timeout=60)
        return out.returncode == 0 and json.loads(out.stdout)["secrets"]
    listed = wait_for(listed_by_a_member, 60, interval=0.5, what="the secret listed by a member")
    assert [(s["name"], s["version"], s["readable"]) for s in listed] == [("probe", 1, True)], listed
    wait_for(lambda: '"secret_changed"' in stateless.read_log() and '"secret":"probe"' in
             stateless.read_log().replace(" ", ""), 15, what="the leaf's seats holding the secret")
    assert "leaf-set-value-0123" not in stateless.read_log()
    assert stateless.wait_running(timeout=5)


@pytest.mark.fleet
@pytest.mark.parametrize("roles, stream, key, problem", [
    (["data", "ingress", "seats", "workers"], {"leaf": {"remotes": ["nats-leaf://127.0.0.1:7422"]}},
     "stream.leaf", "a data node must be a broker member, not a leaf"),
    (["seats"], {"cluster": {"name": "c", "listen": "127.0.0.1:6222",
                                        "routes": ["nats-route://127.0.0.1:6223"]}},
     "stream.cluster", "without the data role runs a leaf"),
    (["ingress", "seats"], {}, "node.roles", "ingress needs the data role"),
    (["seats", "workers"], {}, "node.roles", "workers needs the data role"),
])
def test_roles_and_broker_kind_that_do_not_fit_are_refused_with_exit_78(make_node, roles, stream, key, problem):
    node = make_node(node={"id": "bad", "roles": roles}, stream=stream)
    node.start(wait_ready=False)
    assert node.wait_exit(20) == 78
    text = node.read_log()
    assert f"{node.config_path}: {key}: " in text and problem in text, text[-2000:]
    assert not os.path.exists(os.path.join(node.run_dir, "nats.conf"))


# -- the generated nats.conf (no processes) -------------------------------------------


def _cfg(tmp_path, **overrides) -> NodeConfig:
    """A node's config; a member or a leaf holds the fleet secret file *tmp_path*/fleet.secret."""
    stream = overrides.get("stream") or {}
    if ("cluster" in stream or "leaf" in stream) and "fleet_credentials" not in stream:
        path = str(tmp_path / "fleet.secret")
        if not os.path.exists(path):
            make_fleet_secret(path)
        overrides["stream"] = {**stream, "fleet_credentials": path}
    return NodeConfig.model_validate({"data_dir": str(tmp_path / "d"), "node": {"id": "n1"}, **overrides})


def test_standalone_config_runs_jetstream_in_the_domain(tmp_path):
    cfg = _cfg(tmp_path)
    assert broker.kind(cfg) == "standalone"
    text = "\n".join(broker.config_lines(cfg))
    assert 'server_name: "n1"' in text and 'host: "127.0.0.1"' in text and "port: 4222" in text
    assert f'store_dir: "{tmp_path}/d/broker"' in text and 'domain: "crewlet"' in text
    assert "cluster" not in text and "leafnodes" not in text


def test_member_config_drops_a_route_to_itself(tmp_path):
    cfg = _cfg(tmp_path, stream={"domain": "prod", "cluster": {
        "name": "crew", "listen": "127.0.0.1:6222", "leaf_listen": "127.0.0.1:7422",
        "routes": ["nats-route://127.0.0.1:6222", "nats-route://localhost:6223",
                   "nats-route://10.0.0.2:6222"]}})
    assert broker.kind(cfg) == "member"
    lines = broker.config_lines(cfg)
    text = "\n".join(lines)
    assert 'domain: "prod"' in text and 'name: "crew"' in text and 'listen: "127.0.0.1:6222"' in text
    secret, = credentials.read_fleet_secrets(cfg.stream.fleet_credentials)
    who = f"{credentials.fleet_user(secret)}:{secret}@"
    assert "127.0.0.1:6222\"" not in text.split("routes:")[1]  # itself
    assert f'"nats-route://{who}localhost:6223"' in text and f'"nats-route://{who}10.0.0.2:6222"' in text
    # Routes and leaves admit the fleet's user only.
    assert text.count(f'user: "{credentials.fleet_user(secret)}"') == 2 and text.count(secret) == 4
    assert "leafnodes {" in text and 'listen: "127.0.0.1:7422"' in text
    no_leaves = _cfg(tmp_path, stream={"cluster": {"name": "crew", "listen": "127.0.0.1:6222",
                                                   "routes": ["nats-route://127.0.0.1:6223"]}})
    assert "leafnodes" not in "\n".join(broker.config_lines(no_leaves))


def test_leaf_config_has_no_jetstream_and_one_remote_over_every_member(tmp_path):
    remotes = ["nats-leaf://127.0.0.1:7422", "nats-leaf://127.0.0.1:7423"]
    cfg = _cfg(tmp_path, node={"id": "n1", "roles": ["seats"]}, stream={"leaf": {"remotes": remotes}})
    assert broker.kind(cfg) == "leaf"
    text = "\n".join(broker.config_lines(cfg))
    assert "jetstream" not in text and "cluster" not in text
    # Dialled as the fleet user the members' leaf listeners admit (crewlet.credentials).
    secret, = credentials.read_fleet_secrets(cfg.stream.fleet_credentials)
    user = credentials.fleet_user(secret)
    assert (f'urls: ["nats-leaf://{user}:{secret}@127.0.0.1:7422", '
            f'"nats-leaf://{user}:{secret}@127.0.0.1:7423"]') in text


def test_jetstream_helper_uses_the_domain_only_from_a_leaf(tmp_path):
    nc = nats.NATS()  # never connected: the context only records its prefix
    standalone = _cfg(tmp_path).stream
    leaf = _cfg(tmp_path, node={"id": "n1", "roles": ["seats"]},
                stream={"domain": "prod", "leaf": {"remotes": ["nats-leaf://h:7422"]}}).stream
    external = _cfg(tmp_path, stream={"type": "nats", "servers": ["nats://h:4222"]}).stream
    assert bus.jetstream(nc, standalone)._prefix == "$JS.API"
    assert bus.jetstream(nc, external)._prefix == "$JS.API"
    assert bus.jetstream(nc, leaf)._prefix == "$JS.prod.API"
    assert bus.jetstream(nc, leaf, timeout=0.5)._timeout == 0.5


@pytest.mark.fleet
@pytest.mark.timeout(180)
def test_seats_over_an_embedded_r3_cluster_survive_a_member_killed(make_node, short_tmp):
    """The README's fleet, shortened: three data nodes whose brokers are one R3
    cluster, a company applied, its seats spread; kill -9 one node's whole
    process tree and the survivors — on a cluster with one member gone — hold
    every seat within the lease TTL plus two sweeps (and some slack)."""
    from tests.fleet.test_fleet import apply, company, spread

    # A TTL longer than a stream leader election (~5 s, DESIGN §4): a member
    # killed may have led the leases bucket, and the survivors' renewals wait
    # out the election without their leases lapsing.
    FAST = {"heartbeat": 3, "lease_ttl": 10, "sweep": 0.5}
    cports = [free_port() for _ in range(3)]
    nodes = []
    for i in range(3):
        nodes.append(make_node(node={"id": f"m{i}"}, fleet=FAST, stream={"replicas": 3, "cluster": {
            "name": "seats", "listen": f"127.0.0.1:{cports[i]}",
            "routes": [f"nats-route://127.0.0.1:{p}" for j, p in enumerate(cports) if j != i]}}))
    for node in nodes:
        start_alone(node)
    for node in nodes:
        node.wait_running(timeout=60)
    wait_for(lambda: len((nodes[0].status()["fleet"] or {}).get("nodes", [])) == 3, 60,
             what="three nodes present")
    apply(nodes[0], company(short_tmp))
    wait_for(lambda: (c := spread(nodes[0])) and sorted(c.values()) == [10, 10, 10], 60,
             what="30 seats spread 10/10/10")
    victim = nodes[2]
    victim.kill_tree()
    t0 = time.monotonic()
    wait_for(lambda: (c := spread(nodes[0])) and set(c) == {"m0", "m1"}, 60,
             what="the two survivors holding all 30 seats")
    took = time.monotonic() - t0
    # TTL + two sweeps, plus a stream leader election when the victim led the
    # leases bucket (~5 s measured, sometimes more under load).
    assert took < FAST["lease_ttl"] + 2 * FAST["sweep"] + 10, took
    # Leases keep renewing on the two-member quorum: for a TTL (every lease
    # renewed many times over) all 30 stay held, 15 and 15.
    deadline = time.monotonic() + FAST["lease_ttl"]
    while time.monotonic() < deadline:
        counts = spread(nodes[0])
        assert counts and sorted(counts.values()) == [15, 15], counts
        time.sleep(0.2)
