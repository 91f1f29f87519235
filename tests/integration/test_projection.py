"""Ingress's projection against a real nats-server: how it samples the
mailboxes — a whole listing now and then, the seats whose turns it saw in
between, one consumer each."""

from __future__ import annotations

import asyncio

import nats

from crewlet.coord.holders import Holders
from crewlet.queue import JetStreamMailboxes
from roles.ingress.projection import Projection


def test_between_listings_only_the_mailboxes_of_seats_seen_working_are_read(natsd):
    async def main():
        nc = await nats.connect(natsd.url, connect_timeout=2, allow_reconnect=False)
        try:
            js = nc.jetstream(timeout=5)
            boxes = JetStreamMailboxes(js, nc)
            await boxes.ensure_streams(replicas=1, max_consumers=100)
            await boxes.ensure(["a", "b"])
            proj = Projection(node_id="n1", nc=nc, js=js, holders=Holders.of_bucket(js, heartbeat=60),
                              estate_view=None, run_dir="", zctx=None, gone_for=60)
            empty = {"pending": 0, "in_flight": 0}
            proj.mailboxes = await proj._consumers()            # a whole listing
            assert proj.mailboxes == {"a": empty, "b": empty}
            await boxes.put("a", "for a", trigger="t-a")
            await boxes.put("b", "for b", trigger="t-b")
            # A turn record of a's: a is read at the next sample, b waits for a listing.
            proj._keep_turn({"seat": "a", "trigger": "t-0", "outcome": "done", "started_at": 1.0},
                            publish=False)
            sampled = await proj._touched_consumers()
            assert sampled == {"a": {"pending": 1, "in_flight": 0}, "b": empty}
            assert not proj._touched
            assert await proj._consumers() == {"a": {"pending": 1, "in_flight": 0},
                                               "b": {"pending": 1, "in_flight": 0}}
        finally:
            await nc.close()
    asyncio.run(asyncio.wait_for(main(), 30))
