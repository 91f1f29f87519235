"""The ``scheduler`` duty on one real node: schedules become turns, follow revisions,
refuse bad ones, and a tick sent again is worked once.

The node dials an outside nats-server (``stream.type: nats``), so the test
reads and writes the fleet's state straight on it. Turns are counted from
their records on ``EVENTS`` (``done`` per trigger id).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections import Counter


from crewlet.coord import buckets
from crewlet.coord.control_plane import ControlPlane
from crewlet.schedules import tick_of
from tests.conftest import wait_for
from tests.seats import ctl, ctl_json, read_nats, turn_records, write_company

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
# The schedules' period: the shortest a schedule may have (every: 1s), so the
# ticks a test waits for come a second apart.
PERIOD = 1

COMPANY = """
company: {{name: t}}
providers: {{p: {{kind: scripted, rules: [{{match: '.*', reply: ok}}]}}}}
seats: [{{name: pm, persona: a seat, provider: p}}]
schedules:
{schedules}
"""


def company(dir: str, name: str, schedules: str) -> str:
    return write_company(dir, COMPANY.format(schedules=schedules), name)


def node(make_node, natsd, node_id: str = "t1", **overrides):
    return make_node(node={"id": node_id, **overrides.pop("node", {})},
                     stream={"type": "nats", "servers": [natsd.url]}, fleet=FAST, **overrides)


def done(natsd, schedule: str | None = None) -> Counter:
    """Turns worked (outcome done) per trigger id, of *schedule*'s ticks (any's: None)."""
    records = read_nats(natsd.url, turn_records)
    return Counter(r["trigger"] for r in records if r.get("outcome") == "done"
                   and (tick := tick_of(r.get("trigger") or "")) and schedule in (None, tick[0]))


def test_schedules_fire_follow_revisions_and_refuse_a_bad_one(natsd, make_node):
    n = node(make_node, natsd).start()
    out = ctl(n, "apply", company(n.dir, "one.yaml", f"  - {{name: beat, seat: pm, every: {PERIOD}s, message: beat}}"))
    assert out.returncode == 0, out.stderr
    wait_for(lambda: len(done(natsd, "beat")) >= 2, 30, interval=0.3, what="two beats worked")

    # crewletctl schedules: the next and the last fire, and by whom.
    duty = wait_for(lambda: {d["name"]: d for d in n.status()["fleet"]["duties"]}.get("scheduler"), 10)
    shown = ctl_json(n, "schedules")
    (beat,) = shown["schedules"]
    assert shown["holder"] == {"node": "t1", "token": duty["token"]}
    assert beat["timing"] == f"every {PERIOD}s" and beat["catch_up"] == "latest"
    assert beat["last"]["node"] == "t1" and beat["last"]["token"] == duty["token"]
    assert beat["last"]["trigger"].startswith("beat=") and beat["next"] > beat["last"]["scheduled"]
    text = ctl(n, "schedules")
    assert text.returncode == 0 and "beat" in text.stdout and "held by t1" in text.stdout
    with open(os.path.join(n.run_dir, "api-token")) as f:
        token = f.read().strip()
    ask = urllib.request.Request(f"http://{n.config['ingress']['listen']}/v1/schedules",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(ask, timeout=10) as answer:
        api = json.load(answer)
    assert api["rev"] == 1 and api["holder"] == shown["holder"]
    assert api["schedules"][0]["name"] == "beat" and api["schedules"][0]["last"]["node"] == "t1"

    # A new revision: beat goes, pulse comes, without a restart.
    out = ctl(n, "apply", company(n.dir, "two.yaml", f"  - {{name: pulse, seat: pm, every: {PERIOD}s, message: pulse}}"))
    assert out.returncode == 0, out.stderr
    wait_for(lambda: done(natsd, "pulse"), 20, interval=0.3, what="a pulse worked")
    beats = len(done(natsd, "beat"))
    wait_for(lambda: len(done(natsd, "pulse")) >= 3, 20, interval=0.3, what="three pulses worked")
    assert len(done(natsd, "beat")) == beats  # beat stopped with its revision

    # A bad file is refused at apply, naming the file and the key: nothing is sent.
    bad = ctl(n, "apply", company(n.dir, "bad.yaml",
                                  '  - {name: x, seat: pm, cron: "61 * * * *", message: x}'))
    assert bad.returncode == 78 and "bad.yaml: schedules[0].cron" in bad.stderr, bad.stderr

    # A bad revision stored anyway (an older node's, or written by hand) is refused by
    # the node, naming the revision and the key; revision 2 stays in force.
    async def sneak(nc, js):
        kv = await js.key_value(buckets.CONFIG.name)
        rev2 = await ControlPlane(js, kv).revision(2)  # its record, and its company read from its parts
        rev2["company"]["schedules"] = [{"name": "x", "seat": "pm", "cron": "0 9 * * *",
                                         "tz": "Mars/Olympus", "message": "x"}]
        rev2.pop("body")  # a record with its company inline, as a hand (or an older crewlet) writes it
        await kv.create("rev.3", json.dumps({**rev2, "rev": 3}).encode())
        active = await kv.get("active")
        await kv.update("active", json.dumps({"rev": 3, "epoch": 3}).encode(), last=active.revision)
    read_nats(natsd.url, sneak)
    refused = n.wait_event("company_refused", timeout=20, rev=3)
    assert refused["error"].startswith("revision 3: schedules[0].tz: unknown time zone 'Mars/Olympus'")
    fleet = n.status()["fleet"]
    assert fleet["company"]["rev"] == 2 and fleet["error"] == refused["error"]
    pulses = len(done(natsd, "pulse"))
    wait_for(lambda: len(done(natsd, "pulse")) > pulses, 20, interval=0.3, what="pulse going on")
    assert all(count == 1 for count in done(natsd).values()), done(natsd)


def test_a_tick_sent_again_is_worked_once(natsd, make_node):
    """The record rewound three ticks (what a holder that fired and died
    before recording leaves, times three): the duty sends those ticks again
    under their trigger ids, and the mailbox drops every repeat."""
    n = node(make_node, natsd).start()
    out = ctl(n, "apply", company(n.dir, "one.yaml", f"  - {{name: beat, seat: pm, every: {PERIOD}s, message: beat}}"))
    assert out.returncode == 0, out.stderr
    wait_for(lambda: len(done(natsd, "beat")) >= 4, 30, interval=0.3, what="four beats worked")

    async def rewind(nc, js):
        kv = await js.key_value(buckets.STATUS.name)
        entry = await kv.get("schedule.beat")
        record = json.loads(entry.value)
        record["settled"] -= 3 * PERIOD
        await kv.update("schedule.beat", json.dumps(record).encode(), last=entry.revision)
        return record["settled"]
    read_nats(natsd.url, rewind)
    wait_for(lambda: n.events_named("schedule_fired", duplicate=True),
             20, what="ticks sent again, and dropped as repeats")
    wait_for(lambda: len(done(natsd, "beat")) >= 7, 30, interval=0.3, what="beats going on")
    worked = done(natsd, "beat")
    assert all(count == 1 for count in worked.values()), worked
    times = sorted(tick_of(t)[1] for t in worked)
    assert all(b - a == PERIOD for a, b in zip(times, times[1:])), times  # none lost either
