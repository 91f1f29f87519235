"""A node's roles come up while its crewletd joins the fleet: what they read
may not be made yet. Against a real nats-server, whose buckets are made a
moment after the readers start, as crewletd makes them (supervisor/fleet.py).
Waiting for them is said at info; only what went away after it was there is
a warning."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from types import SimpleNamespace

import nats

from crewlet import log
from crewlet.coord import buckets
from crewlet.coord.holders import Holders
from crewlet.coord.lease import Leases
from crewlet.coord.presence import Presence
from roles.workers.duties import fleet_shape


class Said:
    """This process's log events, from a fresh stream, for the test's length."""

    def __enter__(self) -> "Said":
        self.out = io.StringIO()
        log.configure(node="t1", role="test", level="debug", fmt="json", stream=self.out)
        return self

    def __exit__(self, *exc) -> None:
        log.configure(node=None, role="crewlet", fmt="json", stream=sys.stdout)

    def events(self, name: str | None = None) -> list[dict]:
        found = [json.loads(line) for line in self.out.getvalue().splitlines() if line.strip()]
        return [e for e in found if name is None or e["event"] == name]

    def warnings(self) -> list[dict]:
        return [e for e in self.events() if e["level"] in ("warning", "error")]


async def _until(check, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


def _run(natsd, scenario):
    async def main():
        nc = await nats.connect(natsd.url, connect_timeout=2, allow_reconnect=False)
        try:
            return await scenario(nc.jetstream(timeout=5))
        finally:
            await nc.close()
    return asyncio.run(main())


def test_a_watch_of_a_bucket_not_made_yet_waits_quietly_and_follows_it_once_made(natsd):
    async def scenario(js):
        seen: list[str] = []
        with Said() as said:
            watch = asyncio.create_task(buckets.follow(
                lambda: js.key_value(buckets.COOLDOWNS.name), ">",
                lambda entry: seen.append(entry.key), name="cooldowns"))
            await _until(lambda: said.events("kv_watch_waiting"))
            await asyncio.sleep(0.3)  # a few more looks while it is not there: said once
            kv = await buckets.ensure(js, buckets.COOLDOWNS, 1)
            await kv.put("openai.k1", b'{"until": 1}')
            await _until(lambda: seen == ["openai.k1"])
            watch.cancel()
            waiting = said.events("kv_watch_waiting")
            assert len(waiting) == 1 and waiting[0]["level"] == "info"
            assert waiting[0]["watch"] == "cooldowns" and "NotFound" in waiting[0]["error"]
            assert not said.warnings(), said.warnings()
    _run(natsd, scenario)


def test_a_bucket_deleted_under_a_watch_that_had_opened_is_a_warning(natsd):
    async def scenario(js):
        await buckets.ensure(js, buckets.COOLDOWNS, 1)
        listed = asyncio.Event()
        with Said() as said:
            # Opened anew after 0.2 s without an entry: the next opening finds the bucket gone.
            watch = asyncio.create_task(buckets.follow(
                lambda: js.key_value(buckets.COOLDOWNS.name), ">", lambda entry: None,
                listed=listed.set, name="cooldowns", idle=0.2))
            await asyncio.wait_for(listed.wait(), 10)
            await js.delete_key_value(buckets.COOLDOWNS.name)
            await _until(lambda: said.events("kv_watch_failed"))
            watch.cancel()
            failed = said.events("kv_watch_failed")
            assert failed[0]["level"] == "warning" and "NotFound" in failed[0]["error"]
            assert not said.events("kv_watch_waiting")
    _run(natsd, scenario)


def test_the_fleet_is_judged_once_this_node_has_joined_not_before(natsd):
    """The workers' fleet_shape duty, started before its crewletd claimed the
    node's presence: a fleet of no nodes is not said to lack every role."""
    async def scenario(js):
        await buckets.ensure(js, buckets.LEASES, 1)
        holders = Holders.of_bucket(js, heartbeat=1.0)
        ctx = SimpleNamespace(config=SimpleNamespace(node=SimpleNamespace(id="t1"),
                                                     stream=SimpleNamespace(replicas=1)),
                              holders=holders, interval=0.1, company=lambda: None)
        with Said() as said:
            watch = asyncio.create_task(holders.run())
            duty = asyncio.create_task(fleet_shape.run(ctx))
            await asyncio.wait_for(holders.listed.wait(), 10)
            await asyncio.sleep(1.0)  # ten intervals with the watch listed and nobody there
            assert not said.warnings(), said.warnings()
            # crewletd joins, as a node that runs every role but workers.
            await Presence(Leases(js, "t1", "boot-1", ttl=30), "t1", "/data/t1",
                           lambda: {"roles": ["data", "ingress", "seats"]}).join()
            await _until(lambda: said.events("fleet_role_unmanned"))
            duty.cancel()
            watch.cancel()
            assert [e["roles"] for e in said.warnings()] == [["workers"]]
            assert said.warnings()[0]["nodes"] == ["t1"]
    _run(natsd, scenario)
