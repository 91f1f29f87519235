"""Retention across real nodes (duty ``maintenance``): the same old turn records
gone from every copy, an unowned seat's unworked mail kept, worked mail trimmed.

Three data nodes with the workers role share one real broker (``stream.type:
nats``), as in test_fleet; no node runs seats, so no seat is owned: the test
process works one seat's mailbox itself (a real consumer, real acks), as the
seat's holder would. Turn records are ops on the real log, backdated by
their ``started_at``; a sweep is asked for by a revision that changes
``retention`` (the duty sweeps at once on one).
"""

from __future__ import annotations

import time

import nats
import pytest

from crewlet.estate import store
from crewlet.queue.jetstream import STREAM, SUBJECT, JetStreamMailboxes
from tests.conftest import start_all, wait_for
from tests.estate import applied, copy_of, log_last, op, publish_to, query, run
from tests.fleet.test_estate_fleet import data_node
from tests.fleet.test_fleet import apply
from tests.seats import write_company

pytestmark = pytest.mark.fleet

WORKERS = {"roles": ["data", "workers"]}
COMPANY = """
company: {{name: t}}
providers: {{p: {{kind: scripted}}}}
seats:
  - {{name: idle, persona: nobody holds me, provider: p}}
  - {{name: busy, persona: the test works my mail, provider: p}}
retention: {{turns_days: {turns_days}, mail_days: 1}}
"""
DAY = 86400


def report(node) -> dict | None:
    return (((node.status() or {}).get("fleet") or {}).get("reports") or {}).get("maintenance")


def swept_after(node, since: float, turns_days: int) -> dict | None:
    got = report(node)
    if got and got.get("at", 0) > since and (got.get("turns") or {}).get("days") == turns_days:
        return got
    return None


async def mail_state(url: str) -> dict[str, int]:
    """Messages per seat in AGENTS, read from the stream itself, and its age limit."""
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(STREAM, subjects_filter=SUBJECT + ">")
        counts = {s[len(SUBJECT):]: n for s, n in (info.state.subjects or {}).items()}
        return {**counts, "max_age": info.config.max_age or 0}
    finally:
        await nc.close()


async def work(url: str, seat: str, n: int) -> None:
    """Fetch and ack *seat*'s first *n* messages, as its holder would."""
    nc = await nats.connect(url)
    try:
        boxes = JetStreamMailboxes(nc.jetstream(timeout=5), nc)
        box = boxes.attach(seat)
        for _ in range(n):
            d = await box.next(wait=5)
            assert d is not None
            await box.ack(d)
    finally:
        await nc.close()


async def mail(url: str, seat: str, n: int) -> None:
    nc = await nats.connect(url)
    try:
        boxes = JetStreamMailboxes(nc.jetstream(timeout=5), nc)
        for i in range(n):
            await boxes.put(seat, f"mail {i}", trigger=f"{seat}-{i}")
    finally:
        await nc.close()


def test_old_turn_records_go_from_every_copy_and_unworked_mail_stays(natsd, make_node, short_tmp):
    nodes = start_all([data_node(make_node, natsd, n, node=WORKERS) for n in "abc"])
    a = nodes[0]
    apply(a, write_company(short_tmp, COMPANY.format(turns_days=90), "company-90.yaml"))
    wait_for(lambda: any(report(n) for n in nodes), 30, interval=0.2, what="the first sweep reported")

    now = time.time()
    old = [op("turn.record", {"record": {"seat": "busy", "trigger": f"old-{i}", "outcome": "done",
                                         "started_at": now - 100 * DAY + i}}, id=f"old-{i}", at=now)
           for i in range(5)]
    young = [op("turn.record", {"record": {"seat": "busy", "trigger": f"young-{i}", "outcome": "done",
                                           "started_at": now - DAY + i}}, id=f"young-{i}", at=now)
             for i in range(3)]
    run(publish_to(natsd.url, old + young))
    run(mail(natsd.url, "idle", 3))   # nobody holds idle: its mail waits for an owner
    run(mail(natsd.url, "busy", 4))
    run(work(natsd.url, "busy", 2))   # two of busy's worked: below its ack floor
    last = run(log_last(natsd.url))
    wait_for(lambda: all(applied(n) >= last for n in nodes), 20, what="every copy applied the records")
    assert all(len(query(n, "turn.list")["turns"]) == 8 for n in nodes)

    # A revision that changes retention: the holder sweeps at once.
    since = time.time()
    apply(a, write_company(short_tmp, COMPANY.format(turns_days=91), "company-91.yaml"))
    swept = wait_for(lambda: next((r for n in nodes if (r := swept_after(n, since, 91))), None), 30, 0.2,
                     what="a sweep under turns_days 91 reported")
    assert swept["removed"]["turns"] == 5 and swept["removed"]["mail"] == 2, swept
    assert not swept["errors"] and not swept["turns"]["more"], swept
    assert swept["totals"]["turns"] >= 5

    # The same rows gone from every copy, the younger kept: the copies are equal.
    last = run(log_last(natsd.url))
    wait_for(lambda: all(applied(n) >= last for n in nodes), 20, what="every copy applied the trims")
    for n in nodes:
        kept = sorted(t["trigger"] for t in query(n, "turn.list")["turns"])
        assert kept == ["young-0", "young-1", "young-2"], kept
    assert len({store.digest(copy_of(n)) for n in nodes}) == 1

    # Unworked mail stays: the stream has no age limit, and the sweep left it.
    state = run(mail_state(natsd.url))
    assert state == {"idle": 3, "busy": 2, "max_age": 0}, state
