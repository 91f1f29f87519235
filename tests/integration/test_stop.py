"""A stop always ends: a node that cannot do its work still stops when asked,
and exits 0, within its shutdown time (issue 10).

The broker here is a real nats-server whose coordination buckets are full —
every stream at its consumer limit — so every watch the node opens is refused
(err 10026), as when a leak had filled them. The node must still come up
(its roles wait for the fleet, they do not crash-loop) and stop on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import time

import nats

from crewlet.coord import buckets
from tests.fleet.test_fleet import fleet_node

FULL = 2  # the consumer limit the test gives every bucket, then fills


async def _fill_buckets(url: str) -> None:
    """Every bucket made, its consumer limit FULL, and FULL consumers on it."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=5)
        for bucket in buckets.ALL:
            await buckets.ensure(js, bucket, 1)
            info = await js.stream_info(buckets.stream(bucket.name))
            info.config.max_consumers = FULL
            await js.update_stream(info.config)
            for _ in range(FULL):
                await js.add_consumer(buckets.stream(bucket.name), deliver_subject=nc.new_inbox(),
                                      inactive_threshold=600)
    finally:
        await nc.close()


def test_a_node_whose_buckets_refuse_every_watch_still_stops_at_once_and_exits_0(natsd, make_node):
    asyncio.run(_fill_buckets(natsd.url))
    node = fleet_node(make_node, natsd, "full", supervisor={"shutdown_timeout": 3}).start()
    node.wait_event("fleet_joined", 20)
    # It keeps trying to watch, and says so, rather than crash-looping.
    node.wait_event("kv_watch_failed", 20)
    time.sleep(2)  # let it try a few times (a pace, not a condition: nothing to wait for)
    started = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    code = node.wait_exit(30)
    took = time.monotonic() - started
    crashed = [e for e in node.events() if e.get("event") in ("child_exited", "role_crashed")
               and e.get("code") not in (0, None)]
    assert code == 0, node.read_log()[-3000:]
    # Roles stop in parallel within one shutdown, then the fleet task, then
    # the broker (none here: stream.type nats). Room for the machine's noise.
    assert took < 3 * 2 + 3, f"stopping took {took:.1f}s"
    assert not crashed, crashed
