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
from concurrent import futures

import pytest

import crewlet
from crewlet.coord import drain
from tests.conftest import CREWLETCTL, start_all, wait_for
from tests.fleet.test_fleet import apply, fleet_node, seats_of
from tests.fleet.test_reform import Client, start_streaming
from tests.integration.test_conversations import _blocks
from tests.seats import MCP_SERVER, held, read_nats, send_all_to, turn_records, wait_napping, write_company

pytestmark = pytest.mark.fleet

SEATS = 6
DEADLINE = 4.0   # seconds the drained node's running turns are given
NAP = 14.0       # the long job's turn: well past the deadline, so it is cut short
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


def fleet_row(node, node_id: str) -> dict | None:
    return next((n for n in (node.status() or {}).get("fleet", {}).get("nodes", [])
                 if n["id"] == node_id), None)


class Mail(threading.Thread):
    """A steady load: a batch of mail to the plain seats every 0.1 s, each
    with a trigger of its own, until stopped. ``sent``: trigger -> when."""

    def __init__(self, natsd):
        super().__init__(daemon=True)
        self.natsd = natsd
        self.sent: dict[str, float] = {}
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                batch = [(f"s{(n + i) % SEATS}", f"job {n + i}", f"job-{n + i}") for i in range(4)]
                at = time.time()
                send_all_to(self.natsd.url, batch)
                self.sent.update((t, at) for _, _, t in batch)
                n += len(batch)
                self.stop.wait(0.1)
        except Exception as exc:  # said by the test
            self.error = f"{type(exc).__name__}: {exc}"


def readiness(client: Client) -> tuple[int, dict]:
    try:
        r = client.http.get("/readyz")
    except Exception as exc:  # a node stopping or starting: not ready
        return 0, {"error": str(exc)}
    return r.status_code, r.json()


def node_id(node) -> str:
    return node.config["node"]["id"]


def read_run(api: Client, conv: str, run: str, seen: list) -> list:
    """The run's events after *seen*, read through *api* to its end."""
    events = list(seen)
    with api.http.stream("GET", f"/v1/conversations/{conv}/runs/{run}/stream",
                         headers={"Last-Event-ID": str(events[-1][0])}, timeout=60) as s:
        for block in _blocks(s.iter_lines()):
            if "event" in block:
                events.append((int(block["id"]), block["event"], json.loads(block["data"])))
                if block["event"] in ("run.completed", "run.failed", "run.interrupted"):
                    break
    return events


def test_a_rolling_upgrade_drains_each_node_in_turn_under_load(natsd, make_node):
    """Drain (--stop), start, undrain, one node at a time, under a steady load:
    the first node drained has a turn past the deadline and a run it drives
    in hand. Each step's outage is measured: how long mail sent meanwhile
    waited for its turn (printed with ``pytest -s``)."""
    nodes = start_all([fleet_node(make_node, natsd, f"n{i}", fleet={"drain_deadline": DEADLINE})
                       for i in range(3)])
    apply(nodes[0], company(nodes[0].dir))
    wait_for(lambda: len(seats_of(nodes[0])) == SEATS + 1 and len(set(seats_of(nodes[0]).values())) == 3,
             60, what="every seat held, on all three nodes")
    first = next(n for n in nodes if node_id(n) == held(nodes[0])["w"])
    order = [first, *[n for n in nodes if n is not first]]
    api = Client(first)
    mail = Mail(natsd)
    steps: list[dict] = []
    try:
        wait_for(lambda: readiness(api)[0] == 200, 30, what="the first node ready")
        # In the first node's hands when it drains: a turn that outlives the
        # deadline, and a conversation run it drives (its stream read through it).
        send_all_to(natsd.url, [("w", "long job", "long-1")])
        wait_napping(first, "w", NAP)  # the long turn running on the first node, surely in its tool
        conv, run, seen = start_streaming(api, words=2, seat="s0")
        mail.start()
        wait_for(lambda: len(mail.sent) >= 20, 10, what="the load under way before the first drain")
        for victim in order:
            vid, peer = node_id(victim), next(n for n in nodes if n is not victim)
            step = {"node": vid, "from": time.time()}
            t0 = time.monotonic()
            # On the victim's machine: drain, then stop once it holds nothing.
            drained = subprocess.Popen([*CREWLETCTL, "-c", victim.config_path, "drain", "--stop"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if victim is first:
                # Not ready from the moment it drains (its presence says so at once).
                status, body = wait_for(lambda: (r := readiness(api))[0] == 503 and r, 10,
                                        what="/readyz 503 on the drained node")
                step["unready_s"] = time.monotonic() - t0
                # The run it drove goes on elsewhere; its stream is read through
                # it from now, while it drains: once drained it stops at once
                # (--stop), and a read begun only then may find it gone.
                reading, pool = Client(first), futures.ThreadPoolExecutor(1)
                stream = pool.submit(read_run, reading, conv, run, seen)
                assert body["draining"]["by"].startswith("crewletctl@"), body
                step["unready_at"] = time.time()
                # A new run through it is refused, naming the reason: a client goes elsewhere.
                conv2 = api.ok("POST", "/v1/conversations", 201, json={"seat": "s0"})["id"]
                r = api.http.post(f"/v1/conversations/{conv2}/runs", json={"input": "hi", "stream": False})
                assert r.status_code == 503 and r.json()["code"] == "node_draining", r.text
                assert r.headers.get("retry-after")
                # Drained, it keeps its copy of the estate in service.
                wait_for(lambda: drain.state(fleet_row(peer, vid) or {}) == "drained", DEADLINE + 60,
                         interval=0.1, what="the first node drained")
                step["drained_s"] = time.monotonic() - t0
                row = fleet_row(peer, vid)
                assert row["duties"] == [] and row["conversations"] == 0, row
                assert (row.get("estate") or {}).get("in_service"), row
                # The run's stream, read through it, ends once.
                try:
                    events = stream.result(timeout=60)
                finally:
                    reading.close()
                    pool.shutdown(wait=False)
                ids = [e[0] for e in events]
                assert ids == sorted(set(ids)), "every event once, in order"
                assert [e[1] for e in events].count("run.completed") == 1, [e[1] for e in events]
            out, err = drained.communicate(timeout=DEADLINE + 90)
            assert drained.returncode == 0 and f"{vid} is drained: it holds nothing" in out, (out, err)
            assert victim.wait_exit(30) == 0
            step["stopped_s"] = time.monotonic() - t0
            # The upgrade would be here. Started again, it comes back drained: it takes nothing.
            victim.start()
            step["started_s"] = time.monotonic() - t0
            row = wait_for(lambda: fleet_row(peer, vid), 20, what=f"{vid} back in the fleet")
            assert drain.state(row) == "drained", row
            back = Client(victim)
            try:
                assert readiness(back)[0] == 503
            finally:
                back.close()
            out = ctl(peer, "undrain", vid)
            assert out.returncode == 0 and "undrained" in out.stdout, out
            wait_for(lambda: vid in set(seats_of(peer).values()), 30, what=f"{vid} holding seats again")
            step["back_s"] = time.monotonic() - t0
            step["to"] = time.time()
            steps.append(step)
        mail.stop.set()
        mail.join(10)
        assert mail.error is None, mail.error
        # Every mail worked, once; the long job cut short on the first node and done once elsewhere.
        triggers = [*mail.sent, "long-1"]

        def done() -> dict[str, list[dict]]:
            out: dict[str, list[dict]] = {}
            for r in read_nats(natsd.url, turn_records):
                if r["outcome"] == "done":
                    out.setdefault(r["trigger"], []).append(r)
            return out
        worked = wait_for(lambda: (d := done()) and all(t in d for t in triggers) and d, NAP + 60,
                          what="every mail worked")
        assert {t: len(worked[t]) for t in triggers if len(worked[t]) != 1} == {}, "a mail worked twice"
        records = read_nats(natsd.url, turn_records)
        long = [r for r in records if r["trigger"] == "long-1"]
        # (Cut short again if the node it went to is drained before it ends.)
        assert long[0]["node"] == node_id(first) and long[0]["outcome"] == "interrupted", long
        # No turn started on the first node between its /readyz 503 and its stop.
        unready_at = steps[0]["unready_at"]
        late = [r for r in records if r["node"] == node_id(first) and unready_at + 0.5 < r["started_at"]
                and r["trigger"] != "long-1" and r["started_at"] < steps[0]["from"] + steps[0]["stopped_s"]]
        assert late == [], late
        # The outage each step opened: how long mail sent meanwhile waited for its turn.
        for step in steps:
            waits = [worked[t][0]["started_at"] + worked[t][0]["took_ms"] / 1000 - at
                     for t, at in mail.sent.items() if step["from"] <= at <= step["to"]]
            step["mail_wait_max_s"] = max(waits) if waits else None
            step["mails"] = len(waits)
        print("\nrolling upgrade (deadline %gs):" % DEADLINE)
        for step in steps:
            print("  " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in step.items() if k not in ("from", "to", "unready_at")))
        # Bounded: a mail waits at most a drain's deadline and a handover, never the ack wait.
        assert all(s["mail_wait_max_s"] is None or s["mail_wait_max_s"] < DEADLINE + 15 for s in steps), steps
    finally:
        mail.stop.set()
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
    api = Client(old)
    try:
        r = api.http.post("/v1/fleet/nodes/old/undrain")
        assert r.status_code == 409 and "upgrade old first" in r.json()["detail"], r.text
        # A node the fleet does not know is no drain order: a typo would wait for ever.
        r = api.http.post("/v1/fleet/nodes/nobody/drain", json={"deadline": 5})
        assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
        # The new node drained through the API, and undrained: the order, and its deadline, said back.
        drained = api.ok("POST", "/v1/fleet/nodes/new/drain", json={"deadline": 7})
        assert drained["draining"]["until"] - drained["draining"]["since"] == 7
        assert drained["draining"]["by"].startswith("api:")
        wait_for(lambda: not held(old), 30, what="nobody holding seats: both drained")
        assert api.ok("POST", "/v1/fleet/nodes/new/undrain")["draining"] is None
        wait_for(lambda: set(held(old).values()) == {"new"} and len(held(old)) == SEATS + 1, 30,
                 what="the new node holding every seat again")
    finally:
        api.close()
