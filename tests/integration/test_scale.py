"""Scale up (issue 13): one node with thousands of seats, at the design's timings.

A seat without MCP servers is one KV write to claim and nothing to hold, so
a node serves every seat within seconds of its start, and again within
seconds of its seats child being killed (its life is adopted whole); only
MCP process trees are paced, at most ``claims_per_sweep`` a sweep window.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import nats

from crewlet.queue.post import TURN_SUBJECT
from tests.conftest import wait_for
from tests.seats import MCP_SERVER, held, node_url, seats_stats, write_company

SEATS = 2000
# Seconds from crewletd start, and from the seats child's kill, until every
# seat is served: the 10 s and 2 s on a quiet machine, with room for
# a CI machine busy with other tests.
BOOT_BOUND = 30.0
CRASH_BOUND = 8.0


def _company(dir: str, seats: int, *, mcp: int = 0) -> str:
    lines = ["company: {name: big}", "providers: {p: {kind: scripted}}", "seats:"]
    lines += [f"  - {{name: c{i:04d}, persona: seat {i}, provider: p}}" for i in range(seats)]
    lines += [f"  - {{name: m{i:02d}, persona: tools, provider: p, "
              f"mcp: [{{name: t, command: {sys.executable}, args: [{MCP_SERVER}]}}]}}"
              for i in range(mcp)]
    return write_company(dir, "\n".join(lines) + "\n")


async def _serve_all(url: str, seats: list[str], tag: str, timeout: float) -> float:
    """Mail every seat once; seconds until every one's turn record says done."""
    nc = await nats.connect(url, connect_timeout=2)
    js = nc.jetstream(timeout=10)
    done: set[str] = set()
    finished = asyncio.Event()

    async def seen(msg) -> None:
        if b'"outcome":"done"' in msg.data or b'"outcome": "done"' in msg.data:
            done.add(msg.subject.rpartition(".")[2])
            if len(done) == len(seats):
                finished.set()
    sub = await nc.subscribe(TURN_SUBJECT + ">", cb=seen)
    try:
        t0 = time.monotonic()
        await asyncio.gather(*(js.publish(f"agents.inbox.{s}", b"hello",
                                          headers={"Crewlet-Trigger": f"{tag}-{s}",
                                                   "Nats-Msg-Id": f"{tag}-{s}"})
                               for s in seats))
        try:
            await asyncio.wait_for(finished.wait(), timeout)
        except TimeoutError:
            missing = sorted(set(seats) - done)
            raise AssertionError(f"{len(missing)} seats not served within {timeout:g}s: "
                                 f"{missing[:10]}") from None
        return time.monotonic() - t0
    finally:
        await sub.unsubscribe()
        await nc.close()


def _mailboxes_ready(node) -> bool:
    async def look() -> bool:
        nc = await nats.connect(node_url(node), connect_timeout=1, allow_reconnect=False)
        try:
            await nc.jetstream(timeout=1).stream_info("AGENTS")
            return True
        except Exception:
            return False
        finally:
            await nc.close()
    try:
        return asyncio.run(look())
    except Exception:
        return False


def test_two_thousand_seats_are_served_within_seconds_of_a_start_and_of_a_crash(make_node, short_tmp):
    seats = [f"c{i:04d}" for i in range(SEATS)]
    # The design's fleet timings (15 s heartbeat, 45 s TTL, 5 s sweep, 4
    # claims a sweep): what is tested is that they no longer pace these seats.
    node = make_node(supervisor={"heartbeat_grace": 5})
    t0 = time.monotonic()
    node.start(wait_ready=False, args=("--company", _company(short_tmp, SEATS)))
    wait_for(lambda: _mailboxes_ready(node), 30, what="the mailboxes")
    took = time.monotonic() - t0 + asyncio.run(_serve_all(node_url(node), seats, "boot", 60))
    print(f"start -> {SEATS} seats served: {took:.1f}s")
    # Quiet, this is ~7 s (bench/turns.py measures it against the 10 s);
    # the bound is for a CI machine running other tests beside it. Paced at
    # the design's 4 claims per 5 s sweep it would take 40 minutes.
    assert took < BOOT_BOUND, took
    # kill -9 of the seats child: the next one adopts the life, every seat at once.
    pid = node.process_pids()["seats"]
    lives_before = len(node.events_named("seats_life_begun"))
    os.kill(pid, signal.SIGKILL)
    t1 = time.monotonic()
    wait_for(lambda: node.process_pids().get("seats") not in (None, pid)
             and seats_stats(node).get("held") == SEATS, 10, interval=0.05,
             what="every seat at work in the next seats child")
    took = time.monotonic() - t1
    print(f"seats child killed -> {SEATS} seats at work again: {took:.1f}s")
    # The next child's own line (forwarded a moment late), not an earlier one.
    events = wait_for(lambda: len(ev := node.events_named("seats_life_begun")) > lives_before and ev, 10,
                      what="the next child's seats_life_begun")
    assert events[-1]["adopted"] == SEATS, events  # no seat claimed anew
    # Quiet, ~1.3 s with the 1 s stats cadence the test reads through; paced,
    # 40 minutes again.
    assert took < CRASH_BOUND, took
    again = asyncio.run(_serve_all(node_url(node), seats, "crash", 60))
    print(f"then a mail to each worked in {again:.1f}s")
    assert len(held(node)) == SEATS


def test_mcp_spawns_are_paced_per_sweep_window_and_other_seats_are_not(make_node, short_tmp):
    sweep = 1.0
    node = make_node(fleet={"sweep": sweep, "heartbeat": 3, "lease_ttl": 9, "claims_per_sweep": 4})
    node.start(args=("--company", _company(short_tmp, 100, mcp=20)))
    wait_for(lambda: seats_stats(node).get("held") == 120, 60, what="120 seats held")
    # (crewletd forwards its children's lines up to a quarter second late.)
    def logged() -> dict | None:
        found = {e["seat"]: e["ts"] for e in node.events_named("seat_claimed")}
        return found if len(found) >= 120 else None
    claims = wait_for(logged, 10, what="every claim in the log")
    costly = sorted(t for s, t in claims.items() if s.startswith("m"))
    cheap = [t for s, t in claims.items() if s.startswith("c")]
    assert len(costly) == 20 and len(cheap) == 100
    # Every seat without servers was claimed in the first sweep's burst.
    assert max(cheap) - min(cheap) < sweep, max(cheap) - min(cheap)
    for i, t in enumerate(costly):
        assert sum(1 for u in costly[i:] if u - t < sweep) <= 4, costly
