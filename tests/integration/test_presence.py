"""Presence against a real nats-server: join, duplicate ids, own restarts."""

from __future__ import annotations

import asyncio
import socket

import nats
import pytest

from crewlet.coord import buckets
from crewlet.coord.lease import Leases
from crewlet.coord.presence import DuplicateNode, Presence


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def leases_for(url: str, boot: str) -> tuple:
    nc = await nats.connect(url, connect_timeout=2)
    js = nc.jetstream(timeout=2)
    await buckets.ensure(js, buckets.LEASES, 1)
    return nc, Leases(js, "n1", boot, ttl=30)


def test_join_describes_the_node_and_leave_removes_it(natsd):
    async def main():
        nc, leases = await leases_for(natsd.url, "boot-1")
        presence = Presence(leases, "n1", "/data/n1", lambda: {"roles": ["seats"], "labels": {}})
        await presence.join()
        owner = await leases.owner("node.n1")
        assert owner.boot == "boot-1" and owner.info["roles"] == ["seats"]
        assert owner.info["host"] == socket.gethostname() and owner.info["data_dir"] == "/data/n1"
        assert await presence.renew() is not None
        await presence.leave()
        assert await leases.owner("node.n1") is None
        await nc.close()
    run(main())


def test_another_node_with_our_id_is_refused(natsd):
    async def main():
        nc1, first = await leases_for(natsd.url, "boot-1")
        await Presence(first, "n1", "/data/one", dict).join()
        nc2, second = await leases_for(natsd.url, "boot-2")
        with pytest.raises(DuplicateNode, match="node id 'n1' is held by a live node"):
            await Presence(second, "n1", "/data/other", dict).join()
        await nc1.close()
        await nc2.close()
    run(main())


def test_our_own_previous_incarnation_is_taken_over_not_waited_out(natsd):
    async def main():
        nc1, old = await leases_for(natsd.url, "boot-old")
        before = await Presence(old, "n1", "/data/n1", dict).join()
        await nc1.close()  # it "crashed": its lease is live for another TTL
        nc2, new = await leases_for(natsd.url, "boot-new")
        held = await Presence(new, "n1", "/data/n1", dict).join()
        assert held.token > before.token
        owner = await new.owner("node.n1")
        assert owner.boot == "boot-new"
        await nc2.close()
    run(main())


def test_rejoining_under_our_own_boot_takes_our_presence_back(natsd):
    """crewletd's fleet child restarted (its broker died): same boot instance."""
    async def main():
        nc, leases = await leases_for(natsd.url, "boot-1")
        first = await Presence(leases, "n1", "/data/n1", dict).join()
        again = await Presence(leases, "n1", "/data/n1", dict).join()
        assert again.token > first.token
        await nc.close()
    run(main())
