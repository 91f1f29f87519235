"""A fleet's links admit only the nodes holding its secret.

Real crewletd members (``make_members``, which gives every node of the test
the same fleet secret file) and, against them, rogue nats-servers of our own
configuration: one that routes to a member as a would-be cluster peer, one
that dials a member's leaf port as a leaf. Without the fleet's secret, or
with a wrong one, neither joins: the members' cluster still gossips only
the real members, and the rogue's clients reach no JetStream and see no
message of the fleet. With the secret (the control that shows the test can
tell), both do.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import nats
import pytest

from crewlet import credentials
from crewlet.config import NodeConfig
from roles import broker
from roles.broker import routes as broker_routes
from tests.conftest import CREWLETCTL, CREWLETD, NatsServer, free_port, make_fleet_secret, wait_for
from tests.fleet.test_cluster import make_members, retry, start_alone
from tests.seats import node_url
from tests.tls import make_ca, make_cert

CLUSTER = "links"
# Refusals of a rogue seen before it is checked for having joined after all:
# nats-server retries a route or a leaf every second, so it has tried again.
REFUSALS = 3


def _rogue(short_tmp: str, name: str, conf: list[str]) -> NatsServer:
    return NatsServer(name, os.path.join(short_tmp, name), free_port(), conf=conf).start()


def _route_conf(member_cluster: str, who: str) -> list[str]:
    """A server without JetStream that routes to *member_cluster* as *who*."""
    return ["cluster {", f'  name: "{CLUSTER}"', f'  listen: "127.0.0.1:{free_port()}"',
            f'  routes: ["nats-route://{who}{member_cluster}"]', "}"]


def _leaf_conf(member_leaf: str, who: str) -> list[str]:
    return ["leafnodes {", f'  remotes: [ {{ urls: ["nats-leaf://{who}{member_leaf}"] }} ]', "}"]


def _refusals(rogue: NatsServer) -> int:
    assert rogue.proc.poll() is None, rogue.log()[-2000:]
    return rogue.log().count("Authorization Violation")


async def _peer_ports(member) -> set[int]:
    """The client ports the member's cluster gossips: every server routed to it."""
    nc = await nats.connect(node_url(member), connect_timeout=2, allow_reconnect=False)
    try:
        return {int(u.rpartition(":")[2]) for u in nc._server_info.get("connect_urls") or []}
    finally:
        await nc.close()


async def _what_the_rogue_sees(rogue: NatsServer, member, *, domain: str | None) -> tuple[bool, bool]:
    """(JetStream answers a client of the rogue and it reads the member's
    presence in ``leases``, a message published on the member reaches a
    subscriber on the rogue)."""
    nc = await nats.connect(rogue.url, connect_timeout=2, allow_reconnect=False)
    ours = await nats.connect(node_url(member), connect_timeout=2, allow_reconnect=False)
    try:
        sub = await nc.subscribe("probe.>")
        await nc.flush()
        try:
            kv = await nc.jetstream(domain=domain, timeout=1).key_value("leases")
            entry = await kv.get(f"node.{member.config['node']['id']}")
            reads = entry.value is not None
        except Exception:
            reads = False
        await ours.publish("probe.1", b"fleet business")
        await ours.flush()
        try:
            await sub.next_msg(timeout=1)
            hears = True
        except nats.errors.TimeoutError:
            hears = False
        return reads, hears
    finally:
        await nc.close()
        await ours.close()


@pytest.mark.fleet
@pytest.mark.timeout(150)
def test_rogue_routes_and_leaves_without_the_fleet_secret_do_not_join(make_node, short_tmp):
    members, leaf_urls = make_members(make_node, cluster=CLUSTER)
    for node in members:
        start_alone(node)
    for node in members:
        node.wait_running(timeout=60)
    member = members[0]
    ids = {n.config["node"]["id"] for n in members}
    real_ports = {int(n.config["stream"]["listen"].rpartition(":")[2]) for n in members}
    # Every member's presence is in `leases`: the JetStream a rogue would read.
    wait_for(lambda: len((member.status()["fleet"] or {}).get("nodes", [])) == 3, 60,
             what="three nodes present")
    cluster_addr = member.config["stream"]["cluster"]["listen"]
    leaf_addr = leaf_urls[0].partition("://")[2]
    secret, = credentials.read_fleet_secrets(make_node.fleet_secret)
    right = f"{credentials.fleet_user(secret)}:{secret}@"
    wrong_secret = credentials.new_fleet_secret()
    wrongs = {"no credentials": "", "a wrong secret": f"{credentials.fleet_user(secret)}:{wrong_secret}@",
              "the old public leaf user": "crewlet-leaf:crewlet-leaf@"}

    for what, who in wrongs.items():
        for kind in ("route", "leaf"):
            conf = _route_conf(cluster_addr, who) if kind == "route" else _leaf_conf(leaf_addr, who)
            rogue = _rogue(short_tmp, f"rogue-{kind}-{len(who)}", conf)
            try:
                wait_for(lambda: _refusals(rogue) >= REFUSALS, 15,
                         what=f"the member refusing a {kind} with {what}, {REFUSALS} times")
                assert asyncio.run(_peer_ports(member)) <= real_ports, f"a {kind} with {what} joined"
                reads, hears = asyncio.run(_what_the_rogue_sees(rogue, member, domain="crewlet"
                                                                if kind == "leaf" else None))
                assert not reads and not hears, f"a {kind} with {what}: reads {reads}, hears {hears}"
            finally:
                rogue.stop()

    # The control: the same rogues holding the fleet's secret do join.
    route = _rogue(short_tmp, "with-route", _route_conf(cluster_addr, right))
    leaf = _rogue(short_tmp, "with-leaf", _leaf_conf(leaf_addr, right))
    try:
        wait_for(lambda: route.port in asyncio.run(_peer_ports(member)), 20, what="the route joining")
        for rogue, domain in ((route, None), (leaf, "crewlet")):
            async def sees():
                return await retry(lambda: _sees_all(rogue, member, domain), what=f"{rogue.name} reading")
            assert asyncio.run(sees()) == (True, True)
    finally:
        route.stop()
        leaf.stop()
    assert {n.config["node"]["id"] for n in members} == ids
    for node in members:
        assert all(c["state"] == "running" for c in node.children().values())


async def _sees_all(rogue, member, domain):
    seen = await _what_the_rogue_sees(rogue, member, domain=domain)
    if seen != (True, True):
        raise AssertionError(f"{rogue.name} sees {seen}")
    return seen


def test_a_fleet_config_without_its_secret_exits_78_naming_the_key(make_node):
    node = make_node(node={"id": "nosecret"}, stream={"fleet_credentials": None, "cluster": {
        "name": "c", "listen": f"127.0.0.1:{free_port()}", "routes": [f"nats-route://127.0.0.1:{free_port()}"]}})
    node.start(wait_ready=False)
    assert node.wait_exit(20) == 78
    text = node.read_log()
    assert f"{node.config_path}: stream.fleet_credentials: required with stream.cluster" in text, text[-2000:]
    assert "crewletctl fleet-secret" in text
    assert not os.path.exists(os.path.join(node.run_dir, "nats.conf"))


def test_a_fleet_secret_open_to_others_is_refused_naming_key_and_file(make_node, short_tmp):
    path = make_fleet_secret(os.path.join(short_tmp, "open.secret"))
    os.chmod(path, 0o640)
    node = make_node(node={"id": "leafy", "roles": ["seats"]}, stream={
        "fleet_credentials": path, "leaf": {"remotes": [f"nats-leaf://127.0.0.1:{free_port()}"]}})
    done = subprocess.run([*CREWLETD, "check-config", node.config_path],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 78
    assert f"{node.config_path}: stream.fleet_credentials: {path} is mode 0640" in done.stderr, done.stderr
    assert "\n" not in done.stderr.strip() and "Traceback" not in done.stderr


def test_crewletctl_fleet_secret_makes_rotates_and_retires(short_tmp):
    path = os.path.join(short_tmp, "fleet.secret")
    def run(*args):
        return subprocess.run([*CREWLETCTL, "fleet-secret", path, *args], capture_output=True, text=True,
                              timeout=30)

    made = run()
    assert made.returncode == 0, made.stderr
    assert os.stat(path).st_mode & 0o777 == 0o600
    first, = credentials.read_fleet_secrets(path)
    assert first not in made.stdout + made.stderr  # never printed
    assert run().returncode == 78  # never overwritten without --rotate
    assert run("--rotate").returncode == 0
    new, old = credentials.read_fleet_secrets(path)
    assert old == first and new != first
    assert run("--retire").returncode == 0
    assert credentials.read_fleet_secrets(path) == [new]


@pytest.mark.fleet
@pytest.mark.timeout(60)
@pytest.mark.parametrize("over", ["plaintext", "tls"])
def test_a_member_holding_two_secrets_dials_each_member_with_the_one_it_admits(short_tmp, tmp_path, over):
    """A restarted member asks each other member which secret it admits and
    dials it with that one alone (roles.broker.routes): on the old, a member
    not yet restarted; on the new, one restarted; on the new, one down."""
    old, new = credentials.new_fleet_secret(), credentials.new_fleet_secret()
    path = str(tmp_path / "fleet.secret")
    credentials.write_fleet_secrets(path, [new, old])
    tls, tls_conf = None, ""
    if over == "tls":  # the question is asked as a route is made: TLS, the member checking our cert
        pki = os.path.join(short_tmp, "pki")
        ca = make_ca(pki)
        (cert, key), (ours, our_key) = make_cert(pki, "member", ca), make_cert(pki, "ours", ca)
        tls = {"ca": ca[0], "cert": ours, "key": our_key}
        tls_conf = f', tls {{ cert_file: "{cert}", key_file: "{key}", ca_file: "{ca[0]}", verify: true }}'
    ports = [free_port(), free_port()]
    servers = [_rogue(short_tmp, f"on-{name}", [
        f'cluster {{ name: "{CLUSTER}", listen: "127.0.0.1:{port}", authorization '
        f'{{ user: "{credentials.fleet_user(s)}", password: "{s}" }}{tls_conf} }}'])
        for name, s, port in (("old", old, ports[0]), ("new", new, ports[1]))]
    try:
        urls = [f"nats-route://127.0.0.1:{port}" for port in ports]
        down = f"nats-route://127.0.0.1:{free_port()}"
        cfg = NodeConfig.model_validate({"data_dir": str(tmp_path / "d"), "node": {"id": "n1"}, "stream": {
            "fleet_credentials": path, "tls": tls,
            "cluster": {"name": CLUSTER, "listen": f"127.0.0.1:{free_port()}", "routes": [*urls, down]}}})
        dial, told = asyncio.run(broker_routes.dial_secrets(cfg))
        assert dial == {urls[0]: old, urls[1]: new, down: new}
        assert told[urls[0]] == f"admitted: {credentials.fleet_user(old)}"
        assert told[down] == f"down: {credentials.fleet_user(new)}"
        # One URL per member in the config, never one per secret.
        text = "\n".join(broker.config_lines(cfg, dial=dial)).split("routes: [", 1)[1].split("]", 1)[0]
        assert text.count("nats-route://") == 3
        assert f"{credentials.fleet_user(old)}:{old}@{urls[0].partition('://')[2]}" in text
        assert f"{credentials.fleet_user(new)}:{new}@{urls[1].partition('://')[2]}" in text
        # The question is an answer to the member, never a route: it sends no INFO.
        wait_for(lambda: "Client Closed" in servers[0].log() and "Authentication Failure" in servers[0].log(),
                 5, what="the member on the old secret answering the question for each")
    finally:
        for server in servers:
            server.stop()


async def _put(node, bucket: str, key: str, value: bytes, within: float) -> None:
    """A KV write through *node*'s broker, retried until *within* seconds passed
    (a stream leader election takes ~5 s when the member gone led the bucket)."""
    nc = await nats.connect(node_url(node), connect_timeout=2, allow_reconnect=False)
    try:
        js = nc.jetstream(timeout=2)
        # Made once, then only opened: opening asks the bucket's own stream
        # (its leader), while creating asks the cluster's meta leader, which a
        # member's restart may take away for a while — and what rotating must
        # keep going is the writes.
        async def bucket_kv():
            try:
                return await js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                return await js.create_key_value(bucket=bucket, replicas=3)
        kv = await retry(bucket_kv, within, what="the bucket")
        await retry(lambda: kv.put(key, value), within, what=f"a write through {node.config['node']['id']}")
    finally:
        await nc.close()


def _dialled(node) -> list[str]:
    """The route URLs of *node*'s broker config, without their credentials."""
    with open(os.path.join(node.run_dir, "nats.conf")) as f:
        conf = f.read()
    routes = conf.split("routes: [", 1)[1].split("]", 1)[0]
    return sorted("nats-route://" + u.strip().strip('"').rpartition("@")[2]
                  for u in routes.split("\n") if u.strip())


def _replicas_current(node) -> bool:
    """Every replicated stream has a leader and no replica behind it, as
    *node*'s ``crewletctl status`` shows them."""
    streams = ((node.status() or {}).get("fleet") or {}).get("streams") or []
    clustered = [row for row in streams if "behind" in row]
    return bool(clustered) and all(row.get("leader") and not row["behind"] for row in clustered)


def _restart(node, others: list) -> None:
    """Stop *node* (SIGTERM), check the others still write (quorum), start it again."""
    node.proc.send_signal(signal.SIGTERM)
    assert node.wait_exit(30) == 0
    # A leader election under a loaded machine has taken over 20 s of "JetStream
    # temporarily unavailable" here; a quorum lost for good never answers at all.
    asyncio.run(_put(others[0], "rotation", "while-down", node.config["node"]["id"].encode(), 45))
    start_alone(node, timeout=30)


@pytest.mark.fleet
@pytest.mark.timeout(240)
def test_rotating_the_fleet_secret_member_by_member_keeps_the_quorum(make_node, short_tmp):
    """README, "A fleet's links": `crewletctl fleet-secret --rotate`, members restarted
    one at a time, then `--retire` and the same again. A restarted member
    admits only the new secret and dials each member with the one it admits
    (asked before its broker starts), so it reaches the members not yet
    restarted; two members stay routed, and writes are stored, at every step.

    Dialling each member with both secrets (as crewlet once did) failed here
    now and then: nats-server took the connection about to be refused for
    the route and closed the right one as a duplicate, leaving two members
    that gossiped each other without the route JetStream votes on; with the
    third stopped, writes got no response for 45 s."""
    members, _ = make_members(make_node, cluster=CLUSTER)
    for node in members:
        start_alone(node)
    for node in members:
        node.wait_running(timeout=60)
    real_ports = {int(n.config["stream"]["listen"].rpartition(":")[2]) for n in members}

    def others_of(node) -> list[str]:
        return sorted(node.config["stream"]["cluster"]["routes"])

    asyncio.run(_put(members[0], "rotation", "before", b"1", 30))
    path = make_node.fleet_secret  # one file here; on a real fleet, a copy on each node
    old, = credentials.read_fleet_secrets(path)
    run = subprocess.run([*CREWLETCTL, "fleet-secret", path, "--rotate"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    for step in ("rotate", "retire"):
        for i, node in enumerate(members):
            _restart(node, [m for m in members if m is not node])
            # Back, it is routed to both others again, and writes through it are stored.
            wait_for(lambda: asyncio.run(_peer_ports(node)) >= real_ports - {int(
                node.config["stream"]["listen"].rpartition(":")[2])}, 30,
                what=f"{node.config['node']['id']} routed to the others after the {step} restart")
            asyncio.run(_put(node, "rotation", f"{step}-{i}", b"1", 30))
            # It dials each member with one secret, the one that member admits
            # (never both: two URLs to one member race in nats-server and can
            # leave the pair without the route their votes travel on).
            assert _dialled(node) == others_of(node), _dialled(node)
            if step == "rotate":
                asked = node.wait_event("broker_routes_asked")["routes"]
                assert sorted(asked) == sorted(others_of(node)), asked
                assert all(said.startswith("admitted: ") for said in asked.values()), asked
            # And back as the README means it: no replica of any stream behind
            # (crewletctl status, "replicas current"). Stopping the next member
            # before then leaves one current replica of three, and no quorum
            # until the lagging one has caught up. (The 503s for over 45 s CI
            # once put down to this were the missing route; see the docstring.)
            # The status samples every second while a replica is behind.
            try:
                wait_for(lambda: _replicas_current(node), 60, what="replicas current")
            except AssertionError:
                streams = ((node.status() or {}).get("fleet") or {}).get("streams")
                raise AssertionError(f"a stream's replicas still behind 60 s after {node.config['node']['id']}'s "
                                     f"{step} restart: {streams}") from None
        if step == "rotate":
            run = subprocess.run([*CREWLETCTL, "fleet-secret", path, "--retire"], capture_output=True, text=True,
                                 timeout=30)
            assert run.returncode == 0, run.stderr
    # The old secret admits nobody now.
    rogue = _rogue(short_tmp, "old-secret", _route_conf(members[0].config["stream"]["cluster"]["listen"],
                                                        f"{credentials.fleet_user(old)}:{old}@"))
    try:
        wait_for(lambda: _refusals(rogue) >= REFUSALS, 15, what="the old secret refused")
        assert asyncio.run(_peer_ports(members[0])) <= real_ports
    finally:
        rogue.stop()
