"""nats-py's ordered consumers' flow control, made on demand by crewlet.bus: a
watch costs no wakeup while nothing happens, and a flow-control request the
broker makes is still answered. On a real nats-server."""

from __future__ import annotations

import asyncio

import nats

from crewlet import bus  # noqa: F401  (importing it makes flow control on demand)
from tests.estate import until


def _parked(task: asyncio.Task) -> bool:
    """True when *task* waits on an event, not on a sleep's timer."""
    coro, frames = task.get_coro(), []
    while hasattr(coro, "cr_code"):
        frames.append(coro.cr_code.co_name)
        coro = coro.cr_await
    return "wait" in frames and "sleep" not in frames


def test_an_idle_watch_sleeps_and_a_flow_control_request_is_answered(natsd):
    async def main():
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=5)
        kv = await js.create_key_value(bucket="fc")
        for i in range(50):
            await kv.put(f"k{i}", b"v" * 1000)
        watch = await kv.watchall()
        seen = 0
        while (entry := await watch.updates(timeout=5)) is not None:
            seen += 1
        assert seen == 50
        jsi = watch._sub._sub._jsi  # the watch -> its PushSubscription -> the core one
        # Idle: the flow-control task waits for a request instead of polling.
        await until(lambda: _parked(jsi._fctask), 5)
        # The broker asks (what nats-py does with a flow-control message that
        # came behind undelivered data): the reply goes out, with no poll to wait for.
        replies = await nc.subscribe("fc.reply")
        await nc.flush()
        jsi.schedule_flow_control_response("fc.reply")
        got = await replies.next_msg(timeout=2)
        assert got.subject == "fc.reply"
        await until(lambda: jsi._fcr is None and _parked(jsi._fctask), 5)
        # And the watch goes on seeing changes.
        await kv.put("k0", b"again")
        entry = await watch.updates(timeout=5)
        assert entry is not None and entry.key == "k0" and entry.value == b"again"
        await watch.stop()
        await nc.close()

    asyncio.run(main())


def test_a_watch_left_open_ends_its_flow_control_task_with_the_connection(natsd):
    """Closed or drained with a watch still open, the connection takes the
    watch's flow-control task with it (nats-py's poll saw the close; the
    wait on demand is woken by it): none is left pending for ever."""
    async def main():
        for end in ("close", "drain"):
            nc = await nats.connect(natsd.url)
            kv = await nc.jetstream(timeout=5).create_key_value(bucket="fc")
            await kv.put("k", b"v")
            watch = await kv.watchall()
            while await watch.updates(timeout=5) is not None:
                pass
            task = watch._sub._sub._jsi._fctask
            await until(lambda: _parked(task), 5)
            await getattr(nc, end)()
            await until(task.done, 5)

    asyncio.run(main())
