"""Seats at work on one real node: mail in, turns run, tools called, acks out.

Every test starts a real crewletd (embedded nats-server, real roles) and talks
to it through crewletctl and a plain NATS connection for reading what landed
(the ledger, the mailboxes, the turn records). Fleet timings are shortened
by config so seats are claimed within a second.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time

import pytest

from crewlet import ipc
from crewlet.queue.base import TRIGGER_HEADER
from crewlet.queue.jetstream import JetStreamMailboxes
from crewlet.queue.post import TURN_SUBJECT, TURNS_SUBJECT
from roles.seats.turns import POISON_CRASHES, POISON_REASON, parse_inflight
from tests.conftest import Nodes, wait_for
from tests.estate import query
from tests.seats import (SAMPLE, ctl, ctl_json, held, ledger_keys, mail_of, node_url,
                          read_nats, seats_stats, send_all, turn_records, worker_company, write_company)

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}


async def mail_one_at_a_time(nc, js, seat: str, prefix: str, count: int):
    """Mail *seat* *count* times, each once the last one's ``done`` record is
    on the feed; the mailboxes and the feed's queue, for more of the same."""
    mailboxes = JetStreamMailboxes(js, nc)
    done: asyncio.Queue = asyncio.Queue()

    async def seen(msg):
        done.put_nowait(json.loads(msg.data))
    await nc.subscribe(TURN_SUBJECT + seat, cb=seen)
    for n in range(count):
        await mailboxes.send(seat, f"note {n}", trigger=f"{prefix}-{n}")
        record = await asyncio.wait_for(done.get(), 5)
        assert (record["trigger"], record["outcome"]) == (f"{prefix}-{n}", "done")
    return mailboxes, done


def read(node, fn):
    return read_nats(node_url(node), fn)


@pytest.fixture(scope="module")
def sample_node():
    """One node of the sample company for the module's tests that neither break
    nor reconfigure their node (each sends mail of its own triggers, to its own
    seats or after the earlier tests' turns ended): its start is paid once."""
    made = Nodes()
    try:
        node = made(fleet=FAST).start(args=("--company", SAMPLE))
        wait_for(lambda: held(node).get("ceo") == "t1" and held(node).get("cto") == "t1", 30,
                 what="ceo and cto held")
        yield node
    finally:
        made.close()


# --------------------------------------------------------------------------


def test_sample_company_does_a_turn_with_each_kind_of_tool(sample_node):
    """The README's demo: hello, an MCP tool of the seat's own, mail to another
    seat, private notes — and crewletctl seats and status show it."""
    node = sample_node
    wait_for(lambda: held(node).get("ceo") == "t1" and held(node).get("cto") == "t1", 30,
             what="ceo and cto held")

    out = ctl_json(node, "send", "ceo", "hello there", "--wait", "30")
    assert out["turn"]["outcome"] == "done", out
    assert out["turn"]["reply"].startswith("Hello!")

    # The ceo's own MCP server (crewlet-demo-mcp) answers through the registry.
    out = ctl_json(node, "send", "ceo", "calculate (2 + 3) * 7", "--wait", "30")
    turn = out["turn"]
    assert turn["outcome"] == "done", turn
    assert turn["tool_calls"] == [{"name": "desk__calc", "error": False, "round": 1}]
    assert turn["reply"] == "(2 + 3) * 7 = 35"

    # Mail to another seat: the cto works it, and says who it came from.
    out = ctl_json(node, "send", "ceo", "ask cto to review the plan", "--wait", "30")
    assert out["turn"]["tool_calls"] == [{"name": "send", "error": False, "round": 1}]

    def cto_turn():
        rows = {r["seat"]: r for r in ctl_json(node, "seats")["seats"]}
        last = rows["cto"]["last_turn"]
        return last if last and last["outcome"] == "done" else None
    last = wait_for(cto_turn, 30, what="the cto's turn")
    assert last["sender"] == "ceo"

    # Notes are the seat's own and survive between turns.
    ctl_json(node, "send", "ceo", "remember the launch is on friday", "--wait", "30")
    out = ctl_json(node, "send", "ceo", "remember coffee", "--wait", "30")
    assert "the launch is on friday" in out["turn"]["reply"] and "coffee" in out["turn"]["reply"]

    rows = {r["seat"]: r for r in ctl_json(node, "seats")["seats"]}
    assert len(rows) == 30 and rows["ceo"]["owner"] == "t1"
    assert rows["ceo"]["pending"] == 0 and rows["ceo"]["in_flight"] == 0
    wait_for(lambda: seats_stats(node).get("turns", 0) >= 6, 5, what="the turns counted in status")


def test_mail_to_an_idle_seat_is_worked_at_once(sample_node):
    """Each message wakes its seat: none waits for the seat's next poll (a minute)."""
    node = sample_node
    wait_for(lambda: held(node).get("cto") == "t1", 30, what="cto held")

    async def one_at_a_time(nc, js):
        # The wake reaches the seat before the stream has stored the message in
        # a few percent of sends (measured): a hundred sends meet that case.
        await mail_one_at_a_time(nc, js, "cto", "idle", 100)
    read(node, one_at_a_time)


def test_send_wait_with_a_worked_trigger_answers_at_once(sample_node):
    """Issue 16: mail sent again under a trigger already worked is a duplicate
    the mailbox drops, so no turn will come: --wait answers at once saying
    so, instead of waiting out its time."""
    node = sample_node
    wait_for(lambda: held(node).get("ceo") == "t1", 30, what="ceo held")
    first = ctl_json(node, "send", "ceo", "hello there", "--trigger", "once-1", "--wait", "30")
    assert first["turn"]["outcome"] == "done" and first["duplicate"] is False
    assert first["worked"] is False

    started = time.monotonic()
    again = ctl_json(node, "send", "ceo", "hello there", "--trigger", "once-1", "--wait", "30")
    assert time.monotonic() - started < 5, "waited for a turn that will not come"
    assert (again["duplicate"], again["worked"], again["turn"]) == (True, True, None)
    assert again["seq"] == first["seq"]
    out = ctl(node, "send", "ceo", "hello there", "--trigger", "once-1", "--wait", "30")
    assert out.returncode == 0 and "not sent again" in out.stdout and "worked already" in out.stdout

    # A duplicate of mail not worked yet is waited for: its first copy's turn.
    ctl_json(node, "send", "ceo", "hello there", "--trigger", "once-2")
    pending = ctl_json(node, "send", "ceo", "hello there", "--trigger", "once-2", "--wait", "30")
    assert pending["duplicate"] is True
    # (its first copy's turn may have ended before the duplicate was looked up)
    assert pending["worked"] or pending["turn"]["outcome"] == "done", pending
    assert [r["trigger"] for r in read(node, turn_records)].count("once-2") == 1


def test_unknown_seat_and_empty_text_are_refused(sample_node):
    node = sample_node
    wait_for(lambda: node.status()["fleet"]["company"], 20, what="the company applied")
    out = ctl(node, "send", "nobody", "hi")
    assert out.returncode == 1 and "no seat named 'nobody'" in out.stderr
    out = ctl(node, "send", "ceo", "   ")
    assert out.returncode == 2 and "the text is empty" in out.stderr
    # crewletd refuses it too, for callers other than crewletctl.
    reply = ipc.call(node.run_dir, "send", 3.0, seat="ceo", text=" ")
    assert not reply["ok"] and "non-empty" in reply["error"]


def test_killing_the_seats_child_mid_turn_loses_nothing_and_duplicates_nothing(make_node):
    """Exactly one completed turn per message, over many SIGKILLs mid-turn:
    one ledger entry per trigger, one message in the sink per job."""
    jobs = 24
    node = make_node(fleet=FAST)
    company = write_company(node.dir, worker_company(nap=0.5))
    node.start(args=("--company", company))
    wait_for(lambda: held(node).get("w") == "t1", 30, what="seat w held")
    send_all(node, [("w", f"job {i}", f"job-{i}") for i in range(jobs)])

    rng = random.Random(7)
    kills = 0
    record = os.path.join(node.run_dir, "inflight", "w")

    def crashes_in_hand() -> int:
        try:
            with open(record) as f:
                return parse_inflight(f.read())[2]
        except FileNotFoundError:
            return 0

    def running_or_all_done():
        # A turn running whose mail was not in hand at so many kills in a row
        # that one more would make it poison mail (that is the next test's).
        if seats_stats(node).get("running") and crashes_in_hand() < POISON_CRASHES - 1:
            return "running"
        return "done" if len(read(node, ledger_keys)) == jobs else None

    while kills < 5:
        # Wait for a turn to be running, then kill the seats child somewhere in it.
        if wait_for(running_or_all_done, 30, what="a turn running") == "done":
            break
        pid = node.process_pids()["seats"]
        time.sleep(rng.uniform(0.0, 0.5))  # a random point in the turn, not a wait for anything
        os.kill(pid, signal.SIGKILL)
        kills += 1
        node.wait_running(exclude={"seats": pid})
    assert kills >= 3, "the jobs finished before the seats child could be killed a few times"

    wait_for(lambda: len(read(node, ledger_keys)) == jobs, 60, what="every job in the ledger")
    assert read(node, ledger_keys) == {f"job-{i}" for i in range(jobs)}
    sink = read(node, lambda nc, js: mail_of("sink", nc, js))
    assert sorted(sink) == sorted(f"job {i} done" for i in range(jobs)), sink
    # The last ack is sent unconfirmed after the ledger entry: it may still be
    # on its way; one a kill cut off is sent again by the next seats child.
    def w_mailbox() -> tuple[int, int]:
        row = next(r for r in ctl_json(node, "seats")["seats"] if r["seat"] == "w")
        return row["pending"], row["in_flight"]
    wait_for(lambda: w_mailbox() == (0, 0), 20, what="nothing of w's mail pending or in flight")
    node.wait_event("turn_recovered", 10)  # forwarded by crewletd up to a moment late


def test_a_delivery_lost_to_a_crash_mid_fetch_comes_back_at_once(make_node):
    """The broker hands a delivery to the seats process, which dies before it
    notes the token (its loop wedged, then killed): nobody can NAK it, and the
    ack wait is 30 min. The in-flight record said ``fetching``, so the next
    incarnation resets the seat's mailbox and the mail is worked at once."""
    node = make_node(fleet=FAST)
    node.start(args=("--company", write_company(node.dir, POISON_COMPANY)))
    wait_for(lambda: held(node).get("other") == "t1", 30, what="seat other held")
    seats = node.process_pids()["seats"]
    os.kill(seats, signal.SIGSTOP)  # wedged: the delivery below reaches nobody's hands
    try:
        send_all(node, [("other", "hello lost", "lost-1")])

        async def take(nc, js):  # the broker hands it over, as to the wedged process
            return await JetStreamMailboxes(js, nc).attach("other").next(wait=5)
        delivery = read(node, take)
        assert delivery is not None and delivery.trigger == "lost-1"
        with open(os.path.join(node.run_dir, "inflight", "other"), "w") as f:
            f.write("fetching 0 0 deadbeef0000\n")  # what that process wrote before its fetch
    finally:
        os.kill(seats, signal.SIGKILL)
    node.wait_running(exclude={"seats": seats})
    node.wait_event("mailbox_reset", 30, seat="other")

    def worked():
        return [r for r in read(node, turn_records) if r["trigger"] == "lost-1" and r["outcome"] == "done"]
    (record,) = wait_for(worked, 30, what="the lost delivery worked")
    assert record["deliveries"] == 1  # a reset forgets the delivery count with the delivery
    assert read(node, ledger_keys) >= {"lost-1"}


def test_an_ack_a_kill_cut_off_is_sent_again_by_the_next_seats_child(make_node):
    """A turn's ack goes out unconfirmed, after its ledger entry; a kill can
    cut it off before the connection writes it. The in-flight record then
    says ``acked`` (what the process wrote after queueing the ack), and the
    next incarnation sends the ack again, confirmed: the delivery is settled
    at once — not redelivered as a crash's would be (no skip, no crash
    counted), nor left to the 30-minute ack wait."""
    # Stopped (SIGSTOP) while the test plays the broker: on a loaded machine that
    # outlasts the watchdog's default 10 + 5 s, which would end it as wedged first.
    node = make_node(fleet=FAST, supervisor={"wedge_after": 60})
    node.start(args=("--company", write_company(node.dir, POISON_COMPANY)))
    wait_for(lambda: held(node).get("other") == "t1", 30, what="seat other held")
    seats = node.process_pids()["seats"]
    os.kill(seats, signal.SIGSTOP)
    try:
        send_all(node, [("other", "hello acked", "acked-1")])

        async def take(nc, js):  # the broker hands it over, as to the process about to die
            return await JetStreamMailboxes(js, nc).attach("other").next(wait=5)
        delivery = read(node, take)
        assert delivery is not None and delivery.trigger == "acked-1"

        async def worked(nc, js) -> None:  # its turn was done and in the ledger
            entry = {"seat": "other", "node": "t1", "token": 1, "outcome": "done", "at": time.time(),
                     "rounds": 1}
            await js.publish("$KV.ledger.acked-1", json.dumps(entry).encode())
        read(node, worked)
        with open(os.path.join(node.run_dir, "inflight", "other"), "w") as f:
            f.write(f"{delivery.ack_token} {delivery.seq} 0 acked\n")
    finally:
        os.kill(seats, signal.SIGKILL)
    node.wait_running(exclude={"seats": seats})

    def other_mailbox() -> tuple[int, int]:
        row = next(r for r in ctl_json(node, "seats")["seats"] if r["seat"] == "other")
        return row["pending"], row["in_flight"]
    wait_for(lambda: other_mailbox() == (0, 0), 20, what="the delivery acked by the next seats child")
    send_all(node, [("other", "hello after", "after-1")])
    def after() -> bool:
        return any(r["trigger"] == "after-1" and r["outcome"] == "done" for r in read(node, turn_records))
    wait_for(after, 30, what="the next mail worked")
    assert not [r for r in read(node, turn_records) if r["trigger"] == "acked-1"], "not delivered again"
    assert not node.events_named("turn_recovered"), "no crash counted"


POISON_COMPANY = """
company: {name: t}
providers:
  p:
    kind: scripted
    rules:
      # Catastrophic backtracking on a run of a's that does not end the text:
      # the seats process's loop stops turning, and crewletd kills it.
      - {match: '^(a|aa)+$', reply: never}
      - {match: 'hello', reply: hi}
seats:
  - {name: victim, persona: v, provider: p}
  - {name: other, persona: o, provider: p}
"""


def test_mail_whose_turn_kills_the_seats_process_is_dead_lettered_and_the_others_go_on(make_node):
    """Issue 16: a poison mail (here a catastrophic regex in a scripted rule,
    which wedges the seats process until crewletd kills it) is dead-lettered
    once it was in hand at POISON_CRASHES crashes in a row, not redone for
    ever; the other seat's mail is worked meanwhile and afterwards."""
    node = make_node(fleet=FAST)
    node.start(args=("--company", write_company(node.dir, POISON_COMPANY)))
    wait_for(lambda: held(node).get("victim") == "t1" and held(node).get("other") == "t1", 30,
             what="both seats held")
    first = node.process_pids()["seats"]
    ctl_json(node, "send", "victim", "a" * 60 + "!", "--trigger", "poison")
    ctl_json(node, "send", "other", "hello 1", "--trigger", "other-1")

    def poisoned():
        return [d for d in ctl_json(node, "dlq")["dead_letters"] if d["trigger"] == "poison"]
    (letter,) = wait_for(poisoned, 90, interval=0.5, what="the poison mail dead-lettered")
    assert letter["seat"] == "victim" and letter["reason"] == POISON_REASON
    assert POISON_REASON == f"in hand at {POISON_CRASHES} crashes of the seats process"
    node.wait_event("turn_poison", 5, seat="victim", trigger="poison", crashes=POISON_CRASHES)
    recovered = [e["crashes"] for e in node.events_named("turn_recovered", seat="victim")]
    assert recovered[-POISON_CRASHES:] == list(range(1, POISON_CRASHES + 1)), recovered

    # The seats process that dead-lettered it stays up, and both seats work.
    survivor = node.process_pids()["seats"]
    assert survivor != first
    for seat in ("other", "victim"):
        out = ctl_json(node, "send", seat, "hello 2", "--wait", "30")
        assert out["turn"]["outcome"] == "done" and out["turn"]["reply"] == "hi", out
    assert node.process_pids()["seats"] == survivor
    outcomes = {(r["trigger"], r["outcome"]) for r in read(node, turn_records)}
    assert ("other-1", "done") in outcomes
    assert ("poison", "failed") in outcomes
    rows = {r["seat"]: r for r in ctl_json(node, "seats")["seats"]}
    assert rows["victim"]["pending"] == 0 and rows["victim"]["in_flight"] == 0
    assert seats_stats(node).get("poisoned") == 1


CLI_COMPANY = """
company: {{name: t}}
providers:
  slow:
    kind: cli
    command: [sh, -c, 'cat >/dev/null; sleep {nap}; echo ok']
    max_concurrent: 8
seats:
{seats}
"""


def test_max_concurrent_is_never_exceeded(make_node):
    seats = [f"c{i}" for i in range(5)]
    node = make_node(fleet=FAST, node={"id": "t1", "max_concurrent": 2})
    company = write_company(node.dir, CLI_COMPANY.format(
        nap=0.5, seats="\n".join(f"  - {{name: {s}, persona: p, provider: slow}}" for s in seats)))
    node.start(args=("--company", company))
    wait_for(lambda: set(held(node)) == set(seats), 30, what="every seat held")
    # All at once: the gate, not the pace of the sends, decides what runs.
    send_all(node, [(seat, f"work {n}", None) for seat in seats for n in range(2)])

    def finished():
        records = [r for r in read(node, turn_records) if r["outcome"] == "done"]
        return records if len(records) == 2 * len(seats) else None
    records = wait_for(finished, 60, what="every turn done")
    # The most turns running at any instant, from the records' own timings.
    edges = sorted([(r["started_at"], 1) for r in records]
                   + [(r["started_at"] + r["took_ms"] / 1000, -1) for r in records])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak == 2, f"at most 2 turns at once, and the gate was used: peak {peak}"
    stats = seats_stats(node)
    assert stats["max_concurrent"] == 2 and stats["peak"] <= 2


FAILING_COMPANY = """
company: {name: t}
providers:
  gone:
    kind: openai
    base_url: http://127.0.0.1:9/v1
    api_key_env: CREWLET_TEST_NO_SUCH_KEY
seats:
  - {name: f, persona: p, provider: gone}
"""


def test_a_turn_that_cannot_succeed_lands_in_the_dead_letters_and_can_be_requeued(make_node):
    node = make_node(fleet=FAST)
    node.start(args=("--company", write_company(node.dir, FAILING_COMPANY)))
    wait_for(lambda: held(node).get("f") == "t1", 30, what="seat f held")
    out = ctl_json(node, "send", "f", "please work", "--wait", "30")
    assert out["turn"]["outcome"] == "failed" and "CREWLET_TEST_NO_SUCH_KEY" in out["turn"]["error"]

    letters = wait_for(lambda: ctl_json(node, "dlq")["dead_letters"], 10, what="a dead letter")
    (letter,) = letters
    assert letter["seat"] == "f" and letter["text"] == "please work"
    assert "CREWLET_TEST_NO_SUCH_KEY" in letter["reason"]
    rows = {r["seat"]: r for r in ctl_json(node, "seats")["seats"]}
    assert rows["f"]["dead_letters"] == 1 and rows["f"]["pending"] == 0

    out = ctl(node, "dlq", "requeue", str(letter["seq"]))
    assert out.returncode == 0, out.stderr
    # Back in the mailbox, worked again (and dead-lettered again: still no key).
    wait_for(lambda: len(ctl_json(node, "dlq")["dead_letters"]) == 1
             and ctl_json(node, "dlq")["dead_letters"][0]["seq"] != letter["seq"], 30,
             what="the requeued letter worked and dead-lettered again")


ECHO_COMPANY = """
company: {{name: t}}
providers:
  echo:
    kind: openai
    base_url: {url}/v1
    api_key_env: CREWLET_TEST_ECHO_KEY
seats:
  - {{name: f, persona: p, provider: echo}}
"""
ECHO_KEY = "correcthorse-0123456789-battery"  # no vendor's shape: found by its value


def test_a_provider_error_echoing_the_key_leaves_it_nowhere(make_node, monkeypatch):
    """Issue 16: an endpoint whose error echoes the key. The turn fails and is
    dead-lettered saying what the endpoint said, redacted: the key is in no
    turn record, dead letter, estate row, status or log line, nor in any file
    under the data dir (the broker's streams and the estate's copy)."""
    from crewlet.estate import store
    from tests.estate import copy_of
    from tests.integration.wire import WireServer, openai_error

    monkeypatch.setenv("CREWLET_TEST_ECHO_KEY", ECHO_KEY)
    with WireServer() as wire:
        for _ in range(3):
            wire.queue(openai_error(f"Incorrect API key provided: {ECHO_KEY} (Bearer {ECHO_KEY})"), 401)
        node = make_node(fleet=FAST)
        node.start(args=("--company", write_company(node.dir, ECHO_COMPANY.format(url=wire.url))))
        wait_for(lambda: held(node).get("f") == "t1", 30, what="seat f held")
        out = ctl_json(node, "send", "f", "please work", "--wait", "30", "--trigger", "echo-1")
        assert wire.received()[0].headers["authorization"] == f"Bearer {ECHO_KEY}"  # it was sent
    turn = out["turn"]
    assert turn["outcome"] == "failed" and "Incorrect API key provided: [redacted]" in turn["error"], turn

    (letter,) = wait_for(lambda: ctl_json(node, "dlq")["dead_letters"], 10, what="a dead letter")
    assert "HTTP 401" in letter["reason"] and "[redacted]" in letter["reason"]

    def estate_row():
        copy = copy_of(node)
        rows = [store.unpack(v) for _, v in store.dump(copy, ("turns",))["turns"]] if copy else []
        return [r for r in rows if r.get("trigger") == "echo-1" and r.get("outcome") == "failed"]
    (row,) = wait_for(estate_row, 20, what="the turn's row in the estate")
    assert "[redacted]" in row["error"]

    shown = ctl(node, "status").stdout + ctl(node, "seats", "--json").stdout + ctl(node, "dlq").stdout
    assert "[redacted]" in shown and ECHO_KEY not in shown
    assert ECHO_KEY not in node.read_log()
    leaks = []
    for root, _, files in os.walk(node.config["data_dir"]):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.isfile(path):
                continue  # the run dir's sockets
            with open(path, "rb") as f:
                if ECHO_KEY.encode() in f.read():
                    leaks.append(path)
    assert not leaks, leaks


@pytest.mark.parametrize("company_text", [FAILING_COMPANY])
def test_removed_seats_mailboxes_are_retired(make_node, company_text):
    node = make_node(fleet=FAST)
    node.start(args=("--company", write_company(node.dir, company_text)))
    wait_for(lambda: held(node).get("f") == "t1", 30, what="seat f held")

    async def mailboxes(nc, js):
        return {c.name for c in await js.consumers_info("AGENTS")}
    assert read(node, mailboxes) == {"inbox-f"}
    smaller = company_text.replace("  - {name: f, persona: p, provider: gone}",
                                   "  - {name: g, persona: p, provider: gone}")
    out = ctl(node, "apply", write_company(node.dir, smaller))
    assert out.returncode == 0, out.stderr
    wait_for(lambda: read(node, mailboxes) == {"inbox-g"}, 30,
             what="f's mailbox retired, g's created")
    node.wait_event("mailbox_retired", 5, seat="f")


def test_a_turn_whose_ledger_entry_cannot_be_written_is_not_acked_and_is_worked_once_it_can(make_node):
    """Issue 10: the side effects are done, the ledger refuses the entry (here:
    its stream takes no message that big). The delivery is not acked as if all
    were well: the turn's record says unsettled, the node counts it, the mail
    comes back — and once the ledger takes writes again, it is worked and the
    ledger holds it."""
    node = make_node(fleet=FAST).start(args=("--company", SAMPLE))
    wait_for(lambda: held(node).get("ceo") == "t1", 30, what="ceo held")

    async def ledger_max_msg_size(nc, js, size: int) -> None:
        info = await js.stream_info("KV_ledger")
        info.config.max_msg_size = size
        await js.update_stream(info.config)

    read(node, lambda nc, js: ledger_max_msg_size(nc, js, 16))
    ctl_json(node, "send", "ceo", "hello there", "--trigger", "unsettled-1")

    def unsettled():
        return [r for r in read(node, turn_records)
                if r["trigger"] == "unsettled-1" and r["outcome"] == "unsettled"]
    (first, *_) = wait_for(unsettled, 30, what="an unsettled record")
    assert "ledger entry was not written" in first["error"]
    assert "unsettled-1" not in read(node, ledger_keys)
    wait_for(lambda: (seats_stats(node).get("unsettled") or 0) >= 1, 10, what="the node counting it")
    assert "unsettled (ledger not written)" in ctl(node, "status").stdout

    read(node, lambda nc, js: ledger_max_msg_size(nc, js, -1))
    # Handed back with the retry delay (5 s, doubling per delivery), and
    # looked for then: worked again, settled now.
    wait_for(lambda: "unsettled-1" in read(node, ledger_keys), 45, what="the ledger entry, at last")
    # One done row in the estate's turns table (keyed by op id: a trigger's done
    # record lands once there). Custody, at least once, keeps both it was sent:
    # the first, published beside the ledger write that failed, and the redo's.
    def done():
        return [r for r in query(node, "turn.list", seat="ceo", limit=50)["turns"]
                if r["trigger"] == "unsettled-1" and r["outcome"] == "done"]
    assert len(wait_for(done, 20, what="the done row in the estate")) == 1, done()
    (row,) = [r for r in ctl_json(node, "seats")["seats"] if r["seat"] == "ceo"]
    assert row["in_flight"] == 0 and row["dead_letters"] == 0, row


def test_a_worked_trigger_read_beside_the_model_call_does_nothing_but_that_call(sample_node):
    """The ledger is read while the model is first asked (plain mail): a
    trigger already worked is skipped before the turn's first side effect —
    the model's answer here asks for a `send`, which never happens — while
    fresh mail, read the same way, is worked and settled as always."""
    node = sample_node
    wait_for(lambda: held(node).get("ceo") == "t1" and held(node).get("cto") == "t1", 30,
             what="ceo and cto held")

    async def worked_before(nc, js) -> None:
        entry = {"seat": "ceo", "node": "t1", "token": 1, "outcome": "done", "at": time.time(), "rounds": 2}
        await js.publish("$KV.ledger.early-1", json.dumps(entry).encode())
    read(node, worked_before)
    ctl_json(node, "send", "ceo", "ask cto to review the old plan", "--trigger", "early-1")
    ctl_json(node, "send", "ceo", "ask cto to review the new plan", "--trigger", "early-2")

    def cto_saw(trigger: str) -> bool:
        return any(r["seat"] == "cto" and r["trigger"] == trigger and r["outcome"] == "done"
                   for r in read(node, turn_records))
    # Mail to one seat is worked in order: once the cto worked early-2's
    # mail, early-1's (sent first) would have been worked before it.
    wait_for(lambda: cto_saw("early-2.1.0"), 30, what="the fresh trigger's send worked by the cto")
    records = read(node, turn_records)
    mine = {r["outcome"]: r for r in records if r["seat"] == "ceo" and r["trigger"] == "early-1"}
    assert sorted(mine) == ["done", "skipped"], "skipped, and its done record written from the ledger"
    assert mine["done"]["rounds"] == 2 and mine["skipped"]["rounds"] == 1, "the skip's one round: the model's"
    assert not [r for r in records if r["trigger"].startswith("early-1.")], "no side effect of the worked one"
    assert [r["outcome"] for r in records if r["seat"] == "ceo" and r["trigger"] == "early-2"] == ["done"]
    assert "early-2" in read(node, ledger_keys)


def test_a_trigger_worked_by_a_turn_cut_short_before_its_record_gets_its_done_record(sample_node):
    """A turn whose process died between its ledger entry and its durable
    record (here: the ledger entry written by hand, no record) — its mail
    comes back, is skipped by the ledger, and the skip writes the `done`
    record from the ledger entry. Once: a second skip adds no row."""
    from tests.estate import copy_of
    from crewlet.estate import store

    node = sample_node
    wait_for(lambda: held(node).get("ceo") == "t1", 30, what="ceo held")

    async def worked_elsewhere(nc, js) -> None:
        # Worked a moment ago: a record dated 1970 is the maintenance duty's turn
        # retention's to remove, whenever its first sweep comes.
        entry = {"seat": "ceo", "node": "gone", "token": 1, "outcome": "done", "at": time.time() - 5,
                 "rounds": 2}
        await js.publish("$KV.ledger.cut-1", json.dumps(entry).encode())
        # The same trigger worked by another seat: not the ceo's turn to record.
        await js.publish("$KV.ledger.cut-2", json.dumps({**entry, "seat": "cto"}).encode())
    read(node, worked_elsewhere)

    def done_rows():
        copy = copy_of(node)
        rows = [store.unpack(v) for _, v in store.dump(copy, ("turns",))["turns"]] if copy else []
        return [r for r in rows if r.get("trigger") == "cut-1" and r.get("outcome") == "done"]
    ctl_json(node, "send", "ceo", "hello there", "--trigger", "cut-1")

    async def again(nc, js) -> None:  # the same trigger once more, past the send's own dedupe
        await js.publish("agents.inbox.ceo", b"hello again", headers={TRIGGER_HEADER: "cut-1"})
    (row,) = wait_for(done_rows, 20, what="the done record written from the ledger")
    assert row["node"] == "gone" and row["rounds"] == 2
    read(node, again)
    ctl_json(node, "send", "ceo", "hello there", "--trigger", "cut-2")
    wait_for(lambda: sum(1 for r in read(node, turn_records) if r["trigger"] in ("cut-1", "cut-2")
                         and r["outcome"] == "skipped") == 3, 20, what="every send skipped")
    assert len(done_rows()) == 1
    copy = copy_of(node)
    assert not [r for _, v in store.dump(copy, ("turns",))["turns"]
                if (r := store.unpack(v)).get("trigger") == "cut-2" and r.get("outcome") == "done"]


def test_mail_one_at_a_time_takes_one_look_a_turn_and_a_trigger_mailed_twice_is_worked_once(make_node):
    """Issue 28: a delivery that left nothing behind it in the mailbox is not
    followed by a look that finds nothing (a broker request a turn), yet mail
    published while a turn runs is worked at once, not at the seat's next
    poll; and the ledger read a wake begins (beside the fetch) is never one a
    turn of the same seat could still make stale: the same trigger in two
    messages, published together, is worked once and skipped once."""
    node = make_node(fleet=FAST).start(args=("--company", SAMPLE))
    wait_for(lambda: held(node).get("cto") == "t1", 30, what="cto held")

    def looks() -> int:
        return ((seats_stats(node).get("seats") or {}).get("cto") or {}).get("looks") or 0

    def turns() -> int:
        return ((seats_stats(node).get("seats") or {}).get("cto") or {}).get("turns") or 0

    async def one_at_a_time(nc, js) -> None:
        mailboxes, done = await mail_one_at_a_time(nc, js, "cto", "look", 30)
        # Mail published while a turn runs is worked at once: the turn's
        # delivery said nothing was behind it, the wake says otherwise.
        for n in range(10):
            await mailboxes.send("cto", f"note burst {n}", trigger=f"burst-{n}")
        triggers = set()
        while len(triggers) < 10:
            triggers.add((await asyncio.wait_for(done.get(), 5))["trigger"])
        assert triggers == {f"burst-{n}" for n in range(10)}
        # The same trigger twice (two messages: another message id), at once.
        for copy in (1, 2):
            await nc.publish("agents.inbox.cto", b"note twice",
                             headers={TRIGGER_HEADER: "twice-1", "Nats-Msg-Id": f"twice-1.{copy}"})
        records = []
        while not any(r["outcome"] == "skipped" for r in records):
            records.append(await asyncio.wait_for(done.get(), 5))
        # Worked once (the skip writes the worked turn's `done` record again,
        # from its ledger entry: no time of its own).
        assert [r["outcome"] for r in records if r["took_ms"] > 0] == ["done", "skipped"], records

    before_looks, before_turns = looks(), turns()  # 0, 0: a seat's stats show once it worked
    read(node, one_at_a_time)
    wait_for(lambda: turns() >= before_turns + 42, 10, what="the turns in the seat's stats")
    # One look a turn, and a few more (a wake that outran the stream's store
    # of its message, the burst's end, a poll): not two a turn as before.
    assert looks() - before_looks <= 42 + 12, (looks() - before_looks, turns() - before_turns)


def test_turn_records_reach_the_feed_in_batches_as_well_as_each_on_its_seat(make_node):
    """Issue 28: every record goes out on its seat's subject (send --wait
    hears it there) and, for ingress, in a batch of its seats process's
    records: turns ending together share one message."""
    node = make_node(fleet=FAST).start(args=("--company", SAMPLE))
    seats = ["ceo", "cto", "product-manager", "designer", "eng-manager", *[f"backend-{i}" for i in range(1, 5)],
             *[f"frontend-{i}" for i in range(1, 4)], "mobile-1", "mobile-2", "platform-1", "platform-2",
             "sre-oncall", "data-engineer", "ml-engineer", "qa-lead", "qa-1", "security"]
    wait_for(lambda: all(held(node).get(s) == "t1" for s in seats), 30, what="the seats held")

    async def burst(nc, js) -> None:
        singles: dict[str, dict] = {}
        batches: list[list[dict]] = []
        all_heard = asyncio.Event()

        def heard() -> None:
            batched = {r["trigger"] for b in batches for r in b}
            if set(singles) <= batched and len(singles) == len(seats):
                all_heard.set()

        async def single(msg):
            record = json.loads(msg.data)
            if record["trigger"].startswith("batch-"):
                singles[record["trigger"]] = record
            heard()

        async def batch(msg):
            batches.append([r for r in json.loads(msg.data) if r["trigger"].startswith("batch-")])
            heard()
        await nc.subscribe(TURN_SUBJECT + ">", cb=single)
        await nc.subscribe(TURNS_SUBJECT + ">", cb=batch)
        mailboxes = JetStreamMailboxes(js, nc)
        for seat in seats:
            await mailboxes.send(seat, "hello there", trigger=f"batch-{seat}")
        await asyncio.wait_for(all_heard.wait(), 20)
        batched = {r["trigger"]: r for b in batches for r in b}
        assert {t: batched[t] for t in singles} == singles, "the same records, in batches"
        assert max(len(b) for b in batches) > 1, [len(b) for b in batches]
        assert sum(len(b) for b in batches) < 2 * len(seats)
    read(node, burst)
