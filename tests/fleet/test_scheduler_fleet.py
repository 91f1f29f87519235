"""The ``scheduler`` duty across a fleet: each tick worked once while the duty moves,
and ``catch_up`` after a gap with no holder.

Nodes share one real broker (``stream.type: nats``), timings shortened as in
test_fleet (lease TTL 3 s). The seat the schedules mail is pinned by its
placement label to node ``s``, which runs no workers, so killing the duty's
holder never touches the turns: what is counted is what the scheduler sent.
Turns are counted from their records on ``EVENTS`` (``done`` per trigger id).
"""

from __future__ import annotations

import calendar
import json
import time
from collections import Counter

import pytest

from crewlet.coord import buckets
from crewlet.schedules import tick_of
from tests.conftest import start_all, wait_for
from tests.fleet.test_fleet import apply, fleet_node
from tests.seats import ctl, read_nats, turn_records, write_company

pytestmark = pytest.mark.fleet

PERIOD = 2
COMPANY = """
company: {{name: t}}
providers: {{p: {{kind: scripted, rules: [{{match: '.*', reply: ok}}]}}}}
seats: [{{name: pm, persona: a seat, provider: p, placement: {{labels: {{zone: s}}}}}}]
schedules:
{schedules}
"""


def seat_node(make_node, natsd):
    return fleet_node(make_node, natsd, "s", node={"roles": ["data", "seats"], "labels": {"zone": "s"}})


# The duty nodes' lease TTL: a holder killed leaves the duty unheld until it lapses.
DUTY_TTL = 6


def duty_node(make_node, natsd, node_id: str):
    return fleet_node(make_node, natsd, node_id, node={"roles": ["data", "workers"]},
                      fleet={"lease_ttl": DUTY_TTL})


def worked(natsd) -> dict[str, Counter]:
    """schedule -> {scheduled time: turns done}."""
    out: dict[str, Counter] = {}
    for r in read_nats(natsd.url, turn_records):
        tick = tick_of(r.get("trigger") or "")
        if tick and r.get("outcome") == "done":
            out.setdefault(tick[0], Counter())[tick[1]] += 1
    return out


def from_iso(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def settled(natsd, name: str) -> float:
    """The tick up to which the duty's record of *name* has fired or skipped."""
    async def read(nc, js):
        kv = await js.key_value(buckets.STATUS.name)
        return json.loads((await kv.get(f"schedule.{name}")).value)["settled"]
    return read_nats(natsd.url, read)


def holder(node) -> str | None:
    st = node.status() or {}
    return {d["name"]: d["node"] for d in (st.get("fleet") or {}).get("duties", [])}.get("scheduler")


def row(node, node_id: str) -> dict | None:
    """*node_id*'s row in *node*'s view of the fleet."""
    return next((n for n in ((node.status() or {}).get("fleet") or {}).get("nodes", []) if n["id"] == node_id),
                None)


def events(node, name: str, since: float = 0.0) -> list[dict]:
    return [e for e in node.events_named(name) if e.get("ts", 0) >= since]


def test_each_tick_is_worked_once_while_the_holder_is_killed_and_the_duty_moves(natsd, make_node):
    s, *started = start_all([seat_node(make_node, natsd), *(duty_node(make_node, natsd, i) for i in ("w1", "w2"))])
    workers = dict(zip(("w1", "w2"), started))
    apply(s, write_company(s.dir, COMPANY.format(
        schedules=f"  - {{name: beat, seat: pm, every: {PERIOD}s, message: beat}}")))
    first = wait_for(lambda: holder(s), 20, what="the scheduler duty held")
    wait_for(lambda: len(worked(natsd).get("beat", ())) >= 3, 30, interval=0.3, what="three beats worked")

    (other,) = [i for i in workers if i != first]
    # Nobody may take the duty for a while after its holder dies, whatever the
    # load: the other duty node is drained first (it takes no duty), and put
    # back to work only once ticks have come due unheld. (Leaving it to the
    # lease's TTL, a loaded machine's late renewals could leave none unheld.)
    out = ctl(s, "drain", other, "--no-wait")
    assert out.returncode == 0, out
    wait_for(lambda: (row(s, other) or {}).get("draining"), 10, what=f"{other} draining")
    killed_at = time.time()
    workers[first].kill_tree()
    wait_for(lambda: holder(s) is None, DUTY_TTL + 10, interval=0.2, what="the dead holder's lease lapsed")
    unheld = time.time()
    wait_for(lambda: time.time() > unheld + 2.5 * PERIOD, 3 * PERIOD + 5, interval=0.2,
             what="ticks coming due while nobody holds the duty")
    assert holder(s) is None
    out = ctl(s, "undrain", other)
    assert out.returncode == 0, out
    wait_for(lambda: holder(s) == other, 20, interval=0.2, what=f"the duty moving to {other}")
    running = wait_for(lambda: events(workers[other], "scheduler_running"), 10)[-1]
    wait_for(lambda: max(worked(natsd)["beat"]) >= running["since"] + 4 * PERIOD, 30, interval=0.3,
             what="four beats after the move")

    beats = worked(natsd)["beat"]
    twice = {t: n for t, n in beats.items() if n != 1}
    assert not twice, f"ticks worked more than once: {twice}"
    times = sorted(beats)
    grid = [times[0] + PERIOD * k for k in range(int((times[-1] - times[0]) / PERIOD) + 1)]
    missing = sorted(set(grid) - set(times))
    assert set(times) <= set(grid), "a tick off its schedule's grid"
    # What catch_up: latest documents: of the ticks due while no node held the
    # duty, the most recent is fired once and the others are skipped, said so.
    skipped = events(workers[other], "schedule_ticks_skipped")
    assert len(missing) >= 2, (missing, times)
    (said,) = skipped
    assert said["catch_up"] == "latest" and said["skipped"] >= len(missing) >= 1, (said, missing)
    lo, hi = from_iso(said["first"]), from_iso(said["last"])
    assert all(lo <= t <= hi for t in missing), (missing, said)
    assert hi + PERIOD in beats and hi + PERIOD < running["since"], "the latest missed tick was fired"
    assert all(t > killed_at - 2 * PERIOD for t in missing), "only ticks of the hand-over are missing"
    print(f"\nbeats worked {len(times)}, each once; holder {first} killed, {other} took over; "
          f"ticks skipped by catch_up latest: {len(missing)}")


def test_catch_up_after_a_gap_with_no_holder(natsd, make_node):
    s, w = start_all([seat_node(make_node, natsd), duty_node(make_node, natsd, "w")])
    apply(s, write_company(s.dir, COMPANY.format(schedules="\n".join(
        f"  - {{name: {name}, seat: pm, every: {PERIOD}s, catch_up: {policy}, message: {name}}}"
        for name, policy in (("latest", "latest"), ("all", "all"), ("none", "none"))))))
    wait_for(lambda: all(len(worked(natsd).get(n, ())) >= 2 for n in ("latest", "all", "none")), 30,
             interval=0.3, what="every schedule worked twice")

    w.proc.terminate()  # a graceful stop releases the duty: from now on nobody holds it
    assert w.wait_exit(30) == 0
    # What the stopped holder settled: every tick up to it was sent (its turn may still run).
    before = {n: settled(natsd, n) for n in ("latest", "all", "none")}
    time.sleep(4 * PERIOD)  # the gap: ticks come due with no holder (the scenario, not a wait)
    w.start()
    running = wait_for(lambda: events(w, "scheduler_running", since=max(before.values())), 20)[-1]
    since = running["since"]
    wait_for(lambda: all(max(worked(natsd).get(n, [0])) >= since + 2 * PERIOD
                         for n in ("latest", "all", "none")), 30, interval=0.3,
             what="every schedule worked after the gap")
    now = worked(natsd)
    gap = {n: sorted(t for t in now[n] if before[n] < t < since) for n in before}
    due = {n: [before[n] + PERIOD * k for k in range(1, int((since - before[n]) / PERIOD) + 1)] for n in before}
    assert all(len(d) >= 3 for d in due.values()), due
    after = {n: sorted(t for t in now[n] if t >= since) for n in before}
    for n in before:  # on time after the gap: every tick, once
        assert after[n] == [after[n][0] + PERIOD * k for k in range(len(after[n]))], (n, after[n])
        assert all(count == 1 for count in now[n].values()), (n, now[n])
    assert gap["all"] == due["all"], "all: every missed tick fired"
    assert gap["latest"] == due["latest"][-1:], "latest: the most recent missed tick, once"
    assert gap["none"] == [], "none: no missed tick"
    skipped = {e["schedule"]: e["skipped"] for e in events(w, "schedule_ticks_skipped", since=since - 1)}
    assert skipped == {"latest": len(due["latest"]) - 1, "none": len(due["none"])}, skipped
    print(f"\nmissed per schedule {[len(d) for d in due.values()]}; fired: all {len(gap['all'])}, "
          f"latest {len(gap['latest'])}, none {len(gap['none'])}")
