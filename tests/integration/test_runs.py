"""A run's events in RUNS (crewlet.conversations.runs, .sink) against a real
nats-server: published once each and in order, followed from any sequence
to the terminal event, kept for their TTL, and a turn's progress (the
scripted provider through run_rounds) told as events. A follower leaves no
consumer behind, whether it ended or was stopped."""

from __future__ import annotations

import asyncio
import contextlib
import time

import nats
import pytest

from crewlet.agent.providers import make_provider
from crewlet.agent.turn import TurnRecord, run_rounds
from crewlet.conversations import runs
from crewlet.conversations.driver import END_GRACE, Conductor
from crewlet.conversations.runs import RunEvents, follow
from crewlet.conversations.sink import RunSink
from tests.unit.test_turn import SCRIPT, calculator

TTL = 3600.0
MAX_EVENTS = 50_000


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@contextlib.asynccontextmanager
async def stream(url: str):
    nc = await nats.connect(url, connect_timeout=2)
    js = nc.jetstream(timeout=2)
    await runs.ensure_stream(js, 1, MAX_EVENTS)
    try:
        yield js
    finally:
        await nc.close()


async def consumers(js) -> int:
    return (await js.stream_info(runs.STREAM)).state.consumer_count


async def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def read_all(js, conversation: str, run_id: str, after_seq: int = 0) -> list[tuple[int, dict]]:
    async with follow(js, conversation, run_id, after_seq=after_seq) as events:
        return [item async for item in events]


async def a_run(events: RunEvents, deltas: int = 5) -> list[int]:
    seqs = [await events.publish({"type": runs.STARTED, "node": "node-a"})]
    for n in range(deltas):
        seqs.append(await events.publish({"type": runs.DELTA, "round": 1, "text": f"w{n} "}))
    seqs.append(await events.publish({"type": runs.COMPLETED}))
    return seqs


def test_the_stream_is_made_once_with_its_bounds(natsd):
    async def main():
        async with stream(natsd.url) as js:
            await runs.ensure_stream(js, 1, MAX_EVENTS // 2)  # again: left as it is
            config = (await js.stream_info(runs.STREAM)).config
            assert config.subjects == ["runs.>"] and config.allow_msg_ttl
            assert (config.max_msgs, config.max_msg_size, config.max_consumers) == (
                MAX_EVENTS, runs.EVENT_MAX + runs.HEADERS_MAX, runs.MAX_FOLLOWERS)
            assert not config.max_bytes or config.max_bytes < 0
            # A node asking for more raises it; nothing lowers it.
            await runs.ensure_stream(js, 1, MAX_EVENTS * 2)
            assert (await js.stream_info(runs.STREAM)).config.max_msgs == MAX_EVENTS * 2
    run(main())


def test_a_follower_from_any_sequence_gets_the_rest_once_in_order_and_ends_at_the_terminal_event(natsd):
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            other = RunEvents(js, "c1", "r2", ttl=TTL)  # interleaved: another run of the conversation
            seqs = []
            for n in range(4):
                seqs.append(await events.publish({"type": runs.DELTA, "round": 1, "text": f"{n}"}))
                await other.publish({"type": runs.DELTA, "round": 1, "text": "other"})
            seqs.append(await events.publish({"type": runs.COMPLETED}))
            assert seqs == sorted(seqs) and events.last_seq == seqs[-1]

            everything = await read_all(js, "c1", "r1")
            assert [s for s, _ in everything] == seqs
            assert [e.get("text") for _, e in everything] == ["0", "1", "2", "3", None]
            assert everything[-1][1]["type"] == runs.COMPLETED
            for _, event in everything:
                assert (event["run"], event["conversation"]) == ("r1", "c1") and event["at"] > 0

            # Last-Event-ID: the middle one, on a fresh reader.
            rest = await read_all(js, "c1", "r1", after_seq=seqs[1])
            assert [s for s, _ in rest] == seqs[2:]
            # Past the terminal one's predecessor: the terminal alone.
            assert [s for s, _ in await read_all(js, "c1", "r1", after_seq=seqs[-2])] == seqs[-1:]
            assert await runs.last(js, "c1", "r1") == (seqs[-1], everything[-1][1])
            assert await runs.last(js, "c1", "r9") is None
            await until(lambda: _none(js), 2, "the readers' consumers deleted")
    run(main())


async def _none(js) -> bool:
    return await consumers(js) == 0


def test_a_live_follower_sees_events_as_they_are_published(natsd):
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            first = await events.publish({"type": runs.STARTED, "node": "node-a"})
            seen: list[tuple[int, dict]] = []

            async def reader():
                async with follow(js, "c1", "r1", after_seq=first) as followed:
                    async for item in followed:
                        seen.append(item)

            reading = asyncio.create_task(reader())
            await until(lambda: _some(js), 5, "the reader's consumer")
            later = [await events.publish({"type": runs.DELTA, "round": 1, "text": "hi"})]
            await until(lambda: _count(seen, 1), 5, "the delta seen live")
            later.append(await events.publish({"type": runs.FAILED, "error": "provider down"}))
            await asyncio.wait_for(reading, 5)  # ended by the terminal event
            assert [s for s, _ in seen] == later
            assert await consumers(js) == 0
    run(main())


async def _drain(follower) -> list:
    return [item async for item in follower]


async def _some(js) -> bool:
    return await consumers(js) > 0


async def _count(items: list, n: int) -> bool:
    return len(items) >= n


def test_a_follower_stopped_before_the_end_deletes_its_consumer(natsd):
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            await events.publish({"type": runs.STARTED, "node": "node-a"})
            got = asyncio.Event()

            async def reader():
                async with follow(js, "c1", "r1") as followed:
                    async for _ in followed:
                        got.set()

            reading = asyncio.create_task(reader())
            await asyncio.wait_for(got.wait(), 5)
            assert await consumers(js) == 1
            reading.cancel()  # the client went away mid-run
            await asyncio.gather(reading, return_exceptions=True)
            # At once, not after the inactive threshold.
            await until(lambda: _none(js), runs.FOLLOW_INACTIVE / 2, "the consumer deleted")

            # Closed from another task while its reader waits: the reader ends.
            waiting = follow(js, "c1", "r1", after_seq=10_000)
            await waiting.open()
            reader3 = asyncio.create_task(_drain(waiting))
            await asyncio.sleep(0.1)
            await waiting.close()
            assert await asyncio.wait_for(reader3, 5) == []
            assert await consumers(js) == 0

            # Closed by hand, the same.
            reader2 = await follow(js, "c1", "r1").open()
            assert await consumers(js) == 1
            await reader2.close()
            assert await consumers(js) == 0
            assert [item async for item in reader2] == []  # a closed reader yields nothing
    run(main())


def test_an_event_sent_again_under_its_id_lands_once(natsd):
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            once = await events.publish({"type": runs.TOOL_CALL, "round": 1, "call": "k1", "name": "x",
                                         "args": {}}, id="r1:1.0:call")
            again = await events.publish({"type": runs.TOOL_CALL, "round": 1, "call": "k1", "name": "x",
                                          "args": {}}, id="r1:1.0:call")
            assert again == once and events.duplicate
            # Two publishers ending one run (the turn completes while the
            # driver interrupts): one terminal event, the first.
            driver = RunEvents(js, "c1", "r1", ttl=TTL)
            done = await events.publish({"type": runs.COMPLETED})
            assert not events.duplicate
            assert await driver.publish({"type": runs.INTERRUPTED}) == done and driver.duplicate
            followed = await read_all(js, "c1", "r1")
            assert [(s, e["type"]) for s, e in followed] == [(once, runs.TOOL_CALL), (done, runs.COMPLETED)]
            # Events of distinct publishers never share an id.
            assert driver.event_id(runs.DELTA) != events.event_id(runs.DELTA)
    run(main())


def test_runs_whose_ids_differ_only_by_where_a_dot_is_never_share_a_subject(natsd):
    async def main():
        async with stream(natsd.url) as js:
            ab_c = RunEvents(js, "a.b", "c", ttl=TTL)
            a_bc = RunEvents(js, "a", "b.c", ttl=TTL)
            assert ab_c.subject != a_bc.subject
            await ab_c.publish({"type": runs.COMPLETED, "note": "a.b/c"})
            await a_bc.publish({"type": runs.COMPLETED, "note": "a/b.c"})
            assert [e["note"] for _, e in await read_all(js, "a.b", "c")] == ["a.b/c"]
            assert [e["note"] for _, e in await read_all(js, "a", "b.c")] == ["a/b.c"]
    run(main())


def test_each_event_carries_its_ttl_and_goes_when_it_runs_out(natsd):
    async def main():
        async with stream(natsd.url) as js:
            kept = RunEvents(js, "c1", "r1", ttl=runs.event_ttl(3600, 900))
            seq = await kept.publish({"type": runs.STARTED, "node": "n"})
            msg = await js.get_msg(runs.STREAM, seq)
            assert msg.headers["Nats-TTL"] == "4500"
            short = RunEvents(js, "c1", "r2", ttl=1)
            await short.publish({"type": runs.COMPLETED})

            async def gone() -> bool:
                return await runs.last(js, "c1", "r2") is None
            await until(gone, 5, "the 1 s event to expire")
            assert await runs.last(js, "c1", "r1") is not None
    run(main())


def test_an_oversized_event_is_cut_to_fit(natsd):
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            big = "é" * (runs.EVENT_MAX * 2)
            seq = await events.publish({"type": runs.TOOL_RESULT, "round": 1, "call": "k", "name": "x",
                                        "result": big, "error": False})
            msg = await js.get_msg(runs.STREAM, seq)
            assert len(msg.data) <= runs.EVENT_MAX
            event = runs.decode(msg.data)
            assert event["truncated"] and event["result"].startswith("éé") and event["call"] == "k"
            with pytest.raises(ValueError):
                await events.publish({"type": "run.exploded"})
    run(main())


# ---------------------------------------------------------------- the sink

def test_a_turn_told_to_the_sink_becomes_the_runs_events(natsd):
    """The scripted provider through run_rounds: the tool call and its result
    in round 1, the reply's words coalesced into round 2's text, then the
    terminal event the run's ender publishes after closing the sink."""
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            started = await events.publish({"type": runs.STARTED, "node": "node-a"})
            sink = RunSink(events)
            record = TurnRecord(seat="cto", trigger="r1", node="n1", token=1, deliveries=1)
            await run_rounds(record, text="calculate 6 * 7", persona="You count.",
                             provider=make_provider("s", SCRIPT), registry=calculator(), services=None,
                             fence=lambda: True, deadline=time.monotonic() + 10, sink=sink)
            await sink.close()
            await events.publish({"type": runs.COMPLETED, "reply": record.reply})

            told = [e for _, e in await read_all(js, "c1", "r1", after_seq=started)]
            assert [(e["type"], e.get("round")) for e in told] == [
                (runs.TOOL_CALL, 1), (runs.TOOL_RESULT, 1), (runs.DELTA, 2), (runs.COMPLETED, None)]
            call, result, delta, done = told
            assert (call["call"], call["name"], call["args"]) == ("call_1", "calc", {"expression": "6 * 7"})
            assert (result["call"], result["result"], result["error"]) == ("call_1", "42", False)
            # Five words streamed at once: one event, not five.
            assert delta["text"] == "6 * 7 is 42" == done["reply"] and "restart" not in delta
    run(main())


def test_a_restart_voids_what_a_round_showed_and_nothing_it_did_not(natsd):
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            sink = RunSink(events, window=60)  # only flushes publish: the test says when
            await sink.delta("Hel")
            await sink.restart()            # nothing went out: nothing to void
            await sink.delta("Hello, ")
            await sink.flush()              # out
            await sink.delta("wor")         # held
            await sink.restart()            # void "Hello, " (out) and "wor" (held)
            await sink.delta("Hi!")
            await sink.close()
            await sink.restart()            # after the end of the text: told as an empty delta
            await sink.close()
            await events.publish({"type": runs.FAILED})
            told = [e for _, e in await read_all(js, "c1", "r1")]
            assert [(e.get("text"), e.get("restart", False)) for e in told[:-1]] == [
                ("Hello, ", False), ("Hi!", True), ("", True)]
            assert {e["round"] for e in told[:-1]} == {1}
    run(main())


def test_long_text_goes_out_in_bounded_events_without_waiting_for_the_window(natsd):
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            sink = RunSink(events, window=60, max_chars=100)
            await sink.delta("x" * 250)     # past max_chars: published at once
            assert events.last_seq > 0
            await sink.delta("y" * 10)
            await sink.close()
            await events.publish({"type": runs.COMPLETED})
            texts = [e["text"] for _, e in await read_all(js, "c1", "r1") if e["type"] == runs.DELTA]
            assert texts == ["x" * 100, "x" * 100, "x" * 50, "y" * 10]
    run(main())


def test_held_text_goes_out_after_the_window_by_itself(natsd):
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            sink = RunSink(events, window=0.05)
            await sink.delta("a ")
            await sink.delta("b")

            async def published() -> bool:
                return events.last_seq > 0
            await until(published, 5, "the held text published by the timer")
            await sink.close()
            seq, event = await runs.last(js, "c1", "r1")
            assert event["text"] == "a b" and seq == events.last_seq
    run(main())


def test_a_follower_follows_on_after_the_broker_was_silent_past_its_heartbeats(natsd):
    """A broker silent past two of the follower's heartbeats (frozen here; an
    election, a member dead) makes nats-py re-create the ordered consumer,
    and the re-creation itself times out while the silence lasts: the
    follower still yields every later event once, in order, once the broker
    answers again (checked for issue 29, whose resumed stream once saw
    nothing more after the RUNS leader's broker died: not this)."""
    import os
    import signal

    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c1", "r1", ttl=TTL)
            first = await events.publish({"type": runs.STARTED, "node": "node-a"})
            seen: list[tuple[int, dict]] = []

            async def reader():
                async with follow(js, "c1", "r1", after_seq=first) as followed:
                    async for item in followed:
                        seen.append(item)

            reading = asyncio.create_task(reader())
            await until(lambda: _some(js), 5, "the reader's consumer")
            # Silent past two heartbeats and the re-creation's timeout (2 s here).
            os.kill(natsd.proc.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(runs.FOLLOW_HEARTBEAT * 2 + 4)
            finally:
                os.kill(natsd.proc.pid, signal.SIGCONT)
            later = [await events.publish({"type": runs.DELTA, "round": 1, "text": "after"})]
            await until(lambda: _count(seen, 1), 15, "the event after the silence")
            later.append(await events.publish({"type": runs.COMPLETED}))
            await asyncio.wait_for(reading, 10)
            assert [s for s, _ in seen] == later   # each once, in order
    run(main())


def test_an_end_written_but_never_told_is_told_by_its_waiter_after_the_grace_once(natsd):
    """Issue 29: a turn cut off between writing its run's end in the estate and
    telling it on RUNS (its seat lost in the election that stalled the publish),
    its driver gone with its lease: whoever waits for the run (an SSE stream,
    the driver) tells the end from the estate's row — not before END_GRACE (the
    turn may still be telling its last words), once, and not over an end told."""
    async def main():
        async with stream(natsd.url) as js:
            events = RunEvents(js, "c29", "r29", ttl=TTL)
            seqs = [await events.publish({"type": runs.STARTED, "node": "node-a"}),
                    await events.publish({"type": runs.DELTA, "round": 1, "text": "w"})]
            row = {"id": "r29", "conversation": "c29", "status": "running", "ended_at": None,
                   "error": None}
            # Given the row: no estate is asked (the waiter read it already).
            conductor = Conductor(js=js, router=None, mailboxes=None, drivers=None, node="n",
                                  busy_wait=0, max_run=60, event_ttl=TTL, runner_concurrency=1, sweep=1,
                                  company=lambda: 1)
            assert not await conductor.tell_untold_end("c29", "r29", row)  # it runs
            row.update(status="completed", ended_at=time.time())
            assert not await conductor.tell_untold_end("c29", "r29", row)  # its turn may be telling it
            assert (await runs.last(js, "c29", "r29"))[0] == seqs[-1]
            row["ended_at"] = time.time() - END_GRACE - 1
            assert await conductor.tell_untold_end("c29", "r29", row)
            told = await read_all(js, "c29", "r29", after_seq=seqs[-1])
            assert [e["type"] for _, e in told] == [runs.COMPLETED]
            # Told already: not told again (the stream gains nothing).
            last_seq = (await js.stream_info(runs.STREAM)).state.last_seq
            assert await conductor.tell_untold_end("c29", "r29", row)
            assert (await js.stream_info(runs.STREAM)).state.last_seq == last_seq
    run(main())
