"""Draining a node, and a protocol bump (issue 26; crewlet/coord/drain.py).

Three nodes share one real broker (``stream.type: nats``), as in test_fleet.
Under a steady load of mail and a streamed conversation run, one node is
drained: it hands its seats over (a turn still running at the deadline is
cut short and NAKed, and done once by its successor), gives up its duties
and the run it drives, answers ``/readyz`` 503 from the moment it drains,
and holds nothing within a bounded time — nothing lost, nothing worked
twice. Undrained, it takes its share back.

A node of another protocol (the test-only ``CREWLET_TEST_PROTOCOL``) is
refused at start, exit 78 naming both, until every node serving is drained;
then it takes the work, and the drained node of the old protocol is not put
back to work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

import crewlet
from tests.conftest import CREWLETCTL, wait_for
from tests.fleet.test_fleet import apply, fleet_node, seats_of
from tests.fleet.test_reform import Client, start_streaming
from tests.integration.test_conversations import _blocks
from crewlet.queue.jetstream import JetStreamMailboxes
from tests.seats import MCP_SERVER, held, read_nats, turn_records, write_company

pytestmark = pytest.mark.fleet

SEATS = 6
DEADLINE = 4.0   # seconds the drained node's running turns are given
NAP = 15.0       # the long job's turn: well past the deadline, so it is cut short
COMPANY = """
company: {{name: drain}}
providers:
  p:
    kind: scripted
    rules:
      - match: '(?i)slowly (.+)'
        reply: 'one two three four five six seven eight nine ten \\1'
        pace: 0.25
      - match: 'long job'
        reply: 'long job done'
        tools: [{{name: slow__nap, args: {{seconds: {nap}}}}}]
      - match: '.*'
        reply: 'done'
seats:
  - name: w
    persona: a worker with a slow tool
    provider: p
    mcp: [{{name: slow, command: {python}, args: [{server}]}}]
{seats}
"""


def company(dir: str) -> str:
    seats = "\n".join(f"  - {{name: s{i}, persona: seat {i}, provider: p}}" for i in range(SEATS))
    return write_company(dir, COMPANY.format(nap=NAP, python=sys.executable, server=MCP_SERVER, seats=seats),
                         "drain.yaml")


def ctl(node, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([*CREWLETCTL, "-c", node.config_path, *args], capture_output=True, text=True,
                          timeout=timeout)


def send_all(natsd, mail: list[tuple[str, str, str]]) -> None:
    """Every ``(seat, text, trigger)`` of *mail* on its mailbox, over one connection."""
    async def put(nc, js):
        boxes = JetStreamMailboxes(js, nc)
        for seat, text, trigger in mail:
            await boxes.put(seat, text, trigger=trigger)
    read_nats(natsd.url, put)


def fleet_row(node, node_id: str) -> dict | None:
    return next((n for n in (node.status() or {}).get("fleet", {}).get("nodes", [])
                 if n["id"] == node_id), None)


class Mail(threading.Thread):
    """A steady load: a batch of mail to the plain seats every 0.1 s, each
    with a trigger of its own, until stopped."""

    def __init__(self, natsd):
        super().__init__(daemon=True)
        self.natsd = natsd
        self.sent: list[str] = []
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                batch = [(f"s{(n + i) % SEATS}", f"job {n + i}", f"job-{n + i}") for i in range(4)]
                send_all(self.natsd, batch)
                self.sent.extend(t for _, _, t in batch)
                n += len(batch)
                self.stop.wait(0.1)
        except Exception as exc:  # said by the test
            self.error = f"{type(exc).__name__}: {exc}"


def readiness(client: Client) -> tuple[int, dict]:
    r = client.http.get("/readyz")
    return r.status_code, r.json()


def test_a_drained_node_hands_everything_over_under_load_and_comes_back(natsd, make_node):
    nodes = [fleet_node(make_node, natsd, f"n{i}", fleet={"drain_deadline": DEADLINE}).start()
             for i in range(3)]
    apply(nodes[0], company(nodes[0].dir))
    wait_for(lambda: len(seats_of(nodes[0])) == SEATS + 1 and len(set(seats_of(nodes[0]).values())) == 3,
             60, what="every seat held, on all three nodes")
    victim_id = held(nodes[0])["w"]
    victim = next(n for n in nodes if n.config["node"]["id"] == victim_id)
    others = [n for n in nodes if n is not victim]
    api = Client(victim)
    try:
        wait_for(lambda: readiness(api)[0] == 200, 30, what="the victim ready")
        # In the victim's hands when it drains: a turn that outlives the deadline,
        # and a conversation run it drives (its stream read through it).
        send_all(natsd, [("w", "long job", "long-1")])
        wait_for(lambda: any((c.get("stats") or {}).get("running") for c in victim.status()["children"]
                             if c["name"] == "seats"), 30, what="the long turn running on the victim")
        conv, run, seen = start_streaming(api, words=2, seat="s0")
        mail = Mail(natsd)
        mail.start()
        time.sleep(1.0)  # the load under way before the drain
        t0 = time.monotonic()
        drained = subprocess.Popen([*CREWLETCTL, "-c", others[0].config_path, "drain", victim_id],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Not ready from the moment it drains (its presence says so at once).
        status, body = wait_for(lambda: (r := readiness(api))[0] == 503 and r, 10,
                                what="/readyz 503 on the drained node")
        unready_after = time.monotonic() - t0
        assert body["draining"]["by"].startswith("crewletctl@"), body
        # A new run through it is refused, naming the reason: a client goes elsewhere.
        conv2 = api.ok("POST", "/v1/conversations", 201, json={"seat": "s0"})["id"]
        r = api.http.post(f"/v1/conversations/{conv2}/runs", json={"input": "hello", "stream": False})
        assert r.status_code == 503 and r.json()["code"] == "node_draining", r.text
        assert r.headers.get("retry-after")
        out, err = drained.communicate(timeout=DEADLINE + 90)
        took = time.monotonic() - t0
        assert drained.returncode == 0, (out, err)
        assert f"{victim_id} is drained: it holds nothing" in out, out
        # It holds nothing; the other two hold every seat and every duty.
        row = fleet_row(others[0], victim_id)
        assert row["seats"] == [] and row["duties"] == [] and row["conversations"] == 0, row
        assert row["draining"]["until"] - row["draining"]["since"] == DEADLINE
        assert set(seats_of(others[0]).values()) <= {n.config["node"]["id"] for n in others}
        # It keeps its copy of the estate, in service, and every child running.
        assert (row.get("estate") or {}).get("in_service"), row
        assert all(c["state"] == "running" for c in victim.status()["children"])
        mail.stop.set()
        mail.join(10)
        assert mail.error is None, mail.error
        print(f"\ndrain: /readyz 503 after {unready_after:.2f}s; holds nothing after {took:.2f}s "
              f"(deadline {DEADLINE:g}s); {len(mail.sent)} mails under way")
        # The streamed run ends, once, read through the drained node all along.
        events = list(seen)
        with api.http.stream("GET", f"/v1/conversations/{conv}/runs/{run}/stream",
                             headers={"Last-Event-ID": str(events[-1][0])}, timeout=60) as s:
            for block in _blocks(s.iter_lines()):
                if "event" in block:
                    events.append((int(block["id"]), block["event"], json.loads(block["data"])))
                    if block["event"] in ("run.completed", "run.failed", "run.interrupted"):
                        break
        ids = [e[0] for e in events]
        assert ids == sorted(set(ids)), "every event once, in order"
        assert [e[1] for e in events].count("run.completed") == 1, [e[1] for e in events]
        # Every mail worked, once; the long job cut short on the victim and done once elsewhere.
        triggers = [*mail.sent, "long-1"]

        def done() -> Counter:
            return Counter(r["trigger"] for r in read_nats(natsd.url, turn_records) if r["outcome"] == "done")
        counts = wait_for(lambda: (c := done()) and all(c[t] for t in triggers) and c, NAP + 60,
                          what="every mail worked")
        assert {t: counts[t] for t in triggers if counts[t] != 1} == {}, "a mail worked twice"
        records = read_nats(natsd.url, turn_records)
        long = [r for r in records if r["trigger"] == "long-1"]
        assert [r["node"] for r in long if r["outcome"] == "done"] != [victim_id], long
        assert any(r["node"] == victim_id and r["outcome"] == "interrupted" for r in long), long
        assert not [r for r in records if r["node"] == victim_id and r["outcome"] == "done"
                    and r["trigger"] in mail.sent[len(mail.sent) // 2:]], "a turn started on the drained node"
        # Undrained: it claims its share again and is ready.
        out = ctl(others[1], "undrain", victim_id)
        assert out.returncode == 0 and "undrained" in out.stdout, out
        wait_for(lambda: victim_id in set(seats_of(others[0]).values()), 30, what="the victim holding seats again")
        wait_for(lambda: readiness(api)[0] == 200, 30, what="the victim ready again")
    finally:
        api.close()


def test_a_node_of_another_protocol_waits_for_the_whole_fleet_drained(natsd, make_node, short_tmp):
    old = fleet_node(make_node, natsd, "old", fleet={"drain_deadline": 2}).start()
    apply(old, company(old.dir))
    wait_for(lambda: len(held(old)) == SEATS + 1, 60, what="the old node holding every seat")
    bump = str(crewlet.PROTOCOL_VERSION + 1)
    new = fleet_node(make_node, natsd, "new")
    new.start(wait_ready=False, prefix=["env", f"{crewlet.PROTOCOL_ENV}={bump}"])
    assert new.wait_exit(60) == 78
    said = new.read_log()
    assert f"speaks protocol {bump}" in said and f"old ({crewlet.PROTOCOL_VERSION})" in said, said[-2000:]
    assert set(held(old).values()) == {"old"}  # the refused node took nothing
    # The procedure: drain every node of the old protocol, then start the new.
    out = ctl(old, "drain")
    assert out.returncode == 0 and "old is drained" in out.stdout, out
    new.start(prefix=["env", f"{crewlet.PROTOCOL_ENV}={bump}"])
    wait_for(lambda: len(held(new)) == SEATS + 1 and set(held(new).values()) == {"new"}, 60,
             what="the new node holding every seat")
    # The drained node of the old protocol is not put back to work beside it.
    out = ctl(old, "undrain")
    assert out.returncode == 1 and f"speaks protocol {crewlet.PROTOCOL_VERSION}" in out.stderr, out
