"""A fleet over TLS (``stream.tls``): routes, leaf links and the client port.

A CA and one certificate per node made in the test (tests/tls.py, the
openssl command line). Two members and a leaf come up and see each other
(each one's presence reaches the others over the routes and the leaf link);
crewlet's clients dial with an SSL context trusting the CA. A client without
TLS, and a rogue server routing with the fleet's very secret but in
plaintext, are refused.
"""

from __future__ import annotations

import asyncio
import os
import ssl

import nats
import pytest

from crewlet import credentials
from crewlet.config import NodeConfig
from tests.conftest import NatsServer, free_port, wait_for
from tests.fleet.test_cluster import start_alone
from tests.tls import make_ca, make_cert

CLUSTER = "tlsfleet"


def _options(node) -> dict:
    """What crewlet's own clients of *node* connect with: its user and the CA."""
    return credentials.client_options(NodeConfig.model_validate(node.config).stream, node.run_dir)


async def _connect(node, **extra):
    return await nats.connect(f"nats://127.0.0.1:{node.config['stream']['listen'].rpartition(':')[2]}",
                              connect_timeout=2, allow_reconnect=False, **{**_options(node), **extra})


@pytest.mark.fleet
@pytest.mark.timeout(150)
def test_two_members_and_a_leaf_over_tls_and_plaintext_is_refused(make_node, short_tmp):
    pki = os.path.join(short_tmp, "pki")
    ca = make_ca(pki)
    cports, lports = [free_port(), free_port()], [free_port(), free_port()]
    members = []
    for i, node_id in enumerate(("ta", "tb")):
        cert, key = make_cert(pki, node_id, ca)
        members.append(make_node(node={"id": node_id}, stream={
            "replicas": 1, "tls": {"ca": ca[0], "cert": cert, "key": key},
            "cluster": {"name": CLUSTER, "listen": f"127.0.0.1:{cports[i]}",
                        "routes": [f"nats-route://127.0.0.1:{cports[1 - i]}"],
                        "leaf_listen": f"127.0.0.1:{lports[i]}"}}))
    cert, key = make_cert(pki, "td", ca)
    leaf = make_node(node={"id": "td", "roles": ["seats"]}, stream={
        "replicas": 1, "tls": {"ca": ca[0], "cert": cert, "key": key},
        "leaf": {"remotes": [f"nats-leaf://127.0.0.1:{p}" for p in lports]}})
    nodes = [*members, leaf]
    for node in nodes:
        start_alone(node, timeout=30)
    for node in nodes:
        node.wait_running(timeout=60)
    for node in members:
        conf = open(os.path.join(node.run_dir, "nats.conf")).read()
        assert conf.count("tls {") == 3 and "verify: true" in conf  # client port, routes, leaves
    # Each node's presence went over the routes (and the leaf link) to the others.
    for node in nodes:
        wait_for(lambda: len((node.status()["fleet"] or {}).get("nodes", [])) == 3, 60,
                 what=f"{node.config['node']['id']} seeing all three nodes")

    async def clients():
        nc = await _connect(members[0])
        try:
            assert nc._server_info.get("tls_required")
            assert (await nc.jetstream(timeout=2).account_info()).domain == "crewlet"
        finally:
            await nc.close()
        # The right password without TLS, or TLS trusting anything but the CA: refused.
        for extra in ({"tls": None}, {"tls": ssl.create_default_context()}):
            with pytest.raises(Exception):
                bad = await _connect(members[0], **extra)
                await bad.close()
    asyncio.run(clients())

    # A rogue holding the fleet's secret but routing in plaintext does not join.
    secret, = credentials.read_fleet_secrets(make_node.fleet_secret)
    rogue = NatsServer("plain", os.path.join(short_tmp, "plain"), free_port(), conf=[
        "cluster {", f'  name: "{CLUSTER}"', f'  listen: "127.0.0.1:{free_port()}"',
        f'  routes: ["nats-route://{credentials.fleet_user(secret)}:{secret}@127.0.0.1:{cports[0]}"]', "}"]).start()
    try:
        # The member closes each plaintext route at once; the rogue retries every second.
        wait_for(lambda: rogue.log().count("Router connection closed") >= 3, 20,
                 what="the rogue's plaintext route closed three times")

        async def peers():
            nc = await _connect(members[0])
            try:
                return {int(u.rpartition(":")[2]) for u in nc._server_info.get("connect_urls") or []}
            finally:
                await nc.close()
        assert rogue.port not in asyncio.run(peers()), rogue.log()[-2000:]
    finally:
        rogue.stop()
