"""crewletd end to end: a real node, real nats-server, real signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import psutil
import pytest

from crewlet import tokens

from tests.conftest import CREWLETCTL, CREWLETD, Nodes, alive, wait_for
from tests.seats import SAMPLE, held

ROLES = ("data_applier", "ingress", "seats", "workers")


@pytest.fixture(scope="module")
def running_node():
    """One node, started once, for the module's tests that only look at it
    (neither signal, kill nor reconfigure it)."""
    made = Nodes()
    try:
        yield made().start()
    finally:
        made.close()


def test_node_starts_every_child_and_restarts_a_killed_one_within_a_second(make_node):
    node = make_node().start()
    kids = node.children()
    assert set(kids) == {"broker", "fleet", *ROLES}
    assert all(c["state"] == "running" and c["pid"] for c in kids.values())
    # Process titles name node and role.
    for name in ROLES:
        assert psutil.Process(kids[name]["pid"]).cmdline()[0] == f"crewlet t1 {name}"
    for name in ROLES:
        old = node.children()[name]["pid"]
        t0 = time.monotonic()
        os.kill(old, signal.SIGKILL)
        now = node.wait_running(timeout=5, exclude={name: old})
        took = time.monotonic() - t0
        assert took < 1.0, f"{name} took {took:.3f}s to come back"
        assert now[name]["restarts"] == 1
        assert now[name]["last_exit"]["signal"] == signal.SIGKILL
        assert now[name]["last_exit"]["reason"] == "signal 9 (SIGKILL)"


def test_sigterm_stops_everything_including_grandchildren(make_node):
    node = make_node(debug={"faults": [{"role": "seats", "kind": "grandchild"}]}).start()
    ev = node.wait_event("fault_grandchild_spawned")
    grandchild = ev["grandchild_pid"]
    assert alive(grandchild)
    tree = node.tree_pids()
    assert grandchild in tree and len(tree) >= 7  # crewletd, zygote, broker, 4 roles, +
    node.proc.send_signal(signal.SIGTERM)
    assert node.wait_exit(30) == 0
    wait_for(lambda: not any(alive(p) for p in tree), 5, what="every process gone")
    assert not alive(grandchild), "a grandchild that ignores SIGTERM must not survive"


def test_sigkill_of_crewletd_leaves_nothing_behind(make_node):
    node = make_node(debug={"faults": [{"role": "seats", "kind": "grandchild"}]}).start()
    grandchild = node.wait_event("fault_grandchild_spawned")["grandchild_pid"]
    tree = node.tree_pids()
    node.proc.kill()
    node.wait_exit(10)
    # zygote: parent-death SIGKILL; roles: parent-death signal, they stop and
    # kill what they started; the broker: SIGTERM.
    wait_for(lambda: not any(alive(p) for p in tree), 15, what="every process gone")
    assert not alive(grandchild)


def test_wedged_loop_exits_75_and_is_restarted_with_that_reason(make_node):
    node = make_node(debug={"faults": [{"role": "workers", "kind": "wedge", "after": 0.2}]}).start()
    old = node.children()["workers"]["pid"]
    kids = node.wait_running(timeout=15, exclude={"workers": old})
    assert kids["workers"]["last_exit"] == {**kids["workers"]["last_exit"], "code": 75,
                                            "reason": "wedged event loop"}
    node.wait_event("event_loop_wedged", role="workers")
    # The stack dump says where the loop was stuck.
    wait_for(lambda: "time.sleep(fault.seconds)" in node.read_log() or "_inject" in node.read_log(), 5,
             what="the stack dump forwarded")


def test_silent_child_is_killed_for_lost_heartbeat(make_node):
    # The loop keeps turning (so the watchdog stays quiet) but no heartbeat
    # arrives: crewletd kills it after wedge_after + heartbeat_grace.
    node = make_node(supervisor={"wedge_after": 2, "heartbeat_grace": 0.5},
                     debug={"faults": [{"role": "seats", "kind": "mute"}]}).start()
    old = node.children()["seats"]["pid"]
    t0 = time.monotonic()
    kids = node.wait_running(timeout=20, exclude={"seats": old})
    assert kids["seats"]["last_exit"]["reason"] == "killed: no heartbeat"
    assert kids["seats"]["last_exit"]["signal"] == signal.SIGKILL
    assert time.monotonic() - t0 >= 2.0
    node.wait_event("heartbeat_lost", child="seats")


def test_crash_reason_and_restart(make_node):
    # after: the ready report leaves the child before it dies (a child that
    # dies before it is seen ready fails the node's start instead).
    node = make_node(debug={"faults": [{"role": "ingress", "kind": "crash", "code": 3,
                                        "after": 0.3}]}).start()
    exited = node.wait_event("child_exited", child="ingress")
    assert exited["code"] == 3 and exited["reason"] == "exit 3"
    kids = node.wait_running(timeout=10)
    assert kids["ingress"]["last_exit"]["code"] == 3
    assert kids["ingress"]["last_exit"]["reason"] == "exit 3"


def test_broker_death_restarts_the_roles_after_it(make_node):
    node = make_node().start()
    before = node.process_pids()
    os.kill(before["broker"], signal.SIGKILL)
    after = node.wait_running(timeout=20, exclude=before)
    assert after["broker"]["restarts"] == 1
    for name in ROLES:
        assert after[name]["pid"] != before[name], f"{name} should restart after the broker"
        assert not alive(before[name])


def test_sighup_is_forwarded_to_every_child(make_node):
    node = make_node().start()
    before = {name: c["pid"] for name, c in node.children().items()}
    node.proc.send_signal(signal.SIGHUP)
    node.wait_event("signal_forwarded", signal="SIGHUP")
    for role in ROLES:
        node.wait_event("reload_requested", role=role)
    wait_for(lambda: any(e.get("role") == "broker" and "Reloaded" in e.get("line", "")
                         for e in node.events()), 10, what="the broker reloading")
    assert {name: c["pid"] for name, c in node.children().items()} == before


def test_zygote_death_restarts_every_child_from_a_new_zygote(make_node):
    node = make_node().start()
    before = node.process_pids()
    zygote = node.status()["node"]["zygote_pid"]
    os.kill(zygote, signal.SIGKILL)
    # Its children die with it (parent-death signal); crewletd, the subreaper,
    # reaps them and the supervisors start them again from a fresh zygote.
    after = node.wait_running(timeout=20, exclude=before)
    assert node.status()["node"]["zygote_pid"] not in (None, zygote)
    for name, pid in before.items():
        assert not alive(pid), f"old {name} still alive"
        assert psutil.Process(after[name]["pid"]).ppid() == node.status()["node"]["zygote_pid"]


def test_restart_intensity_exceeded_exits_69(make_node):
    node = make_node(supervisor={"intensity": 2, "period": 30, "backoff_min": 0.01},
                     debug={"faults": [{"role": "workers", "kind": "crash", "once": False,
                                        "after": 0.3}]})
    node.start(wait_ready=False)
    assert node.wait_exit(60) == 69
    ev = node.wait_event("node_exiting")
    assert "intensity" in ev["reason"]
    assert not any(alive(p) for p in node.tree_pids())


def test_child_exiting_78_makes_crewletd_exit_78(make_node):
    node = make_node(debug={"faults": [{"role": "seats", "kind": "crash", "code": 78}]})
    node.start(wait_ready=False)
    assert node.wait_exit(30) == 78
    assert "bad configuration" in node.wait_event("node_exiting")["reason"]


def test_bad_config_exits_78_with_file_key_and_problem(short_tmp):
    path = os.path.join(short_tmp, "bad.yaml")
    with open(path, "w") as f:
        f.write("node:\n  id: ok\nsupervisor:\n  intensity: lots\n")
    out = subprocess.run([*CREWLETD, "start", "-c", path], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 78
    assert path in out.stderr and "supervisor.intensity" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    check = subprocess.run([*CREWLETD, "check-config", path], capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 78 and "supervisor.intensity" in check.stderr


def _session_left(sid: int) -> list[psutil.Process]:
    """Processes of session *sid* still alive (zombies aside)."""
    left = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
        except (OSError, psutil.Error):
            pass
    return left


def test_exit_78_leaves_no_zygote_behind(running_node, short_tmp):
    # crewletd starts its zygote before it reads its config: refused early
    # (a bad key) or late (the data dir held by another crewletd), it takes
    # the zygote with it before it exits.
    bad = os.path.join(short_tmp, "bad.yaml")
    with open(bad, "w") as f:
        f.write("node:\n  id: ok\nsupervisor:\n  intensity: lots\n")
    for path in (bad, running_node.config_path):
        proc = subprocess.Popen([*CREWLETD, "start", "-c", path], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            assert proc.wait(30) == 78
            assert _session_left(proc.pid) == []
        finally:
            for left in _session_left(proc.pid):
                left.kill()


def test_too_long_run_dir_exits_78(short_tmp):
    deep = os.path.join(short_tmp, "d" * 60, "e" * 60)
    path = os.path.join(short_tmp, "long.yaml")
    with open(path, "w") as f:
        f.write(f"data_dir: {deep}\n")
    out = subprocess.run([*CREWLETD, "start", "-c", path], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 78
    assert "data_dir" in out.stderr and "107" in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_broker_binary_exits_78(make_node):
    node = make_node(stream={"binary": "/nonexistent/nats-server"})
    node.start(wait_ready=False)
    code = node.wait_exit(30)
    # CI saw 75 once (crewletd's own loop judged wedged) beside a fleet test: say what it said.
    assert code == 78, f"exit {code}:\n{node.read_log()[-3000:]}"


def test_second_crewletd_on_the_same_data_dir_is_refused(running_node):
    node = running_node
    out = subprocess.run([*CREWLETD, "start", "-c", node.config_path], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 78 and "another crewletd" in out.stderr


def test_ingress_health_and_readiness(running_node):
    node = running_node
    base = f"http://{node.config['ingress']['listen']}"
    with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
        assert r.status == 200 and json.load(r)["node"] == "t1"

    def ready():  # once its children run and its copy of the estate is in service
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=5) as r:
                return r.status == 200 and json.load(r)
        except urllib.error.HTTPError:
            return False
    body = wait_for(ready, 30, what="/readyz 200")
    assert body["ready"] is True and body["not_running"] == [] and body["estate"] is None


def test_a_fresh_node_with_the_sample_company_starts_without_a_warning(make_node):
    """The quick start, as a new user meets it: a node on a fresh data dir
    starts its roles before its streams and its copy of the estate are in
    service. Its roles wait for them (their first reads, the session runner's
    first sweep, notify's consumer, the mailboxes' sampling) instead of
    failing first and warning about it."""
    node = make_node()
    node.start(wait_ready=False, args=("--company", SAMPLE))
    base = f"http://{node.config['ingress']['listen']}"
    answers = []

    def ready():  # probed as a load balancer would: its 503s while starting are answers, not failures
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=5) as r:
                answers.append(r.status)
                return r.status == 200
        except urllib.error.HTTPError as exc:
            answers.append(exc.code)
            return False
        except OSError:
            return False
    wait_for(ready, 60, interval=0.05, what="/readyz 200")
    wait_for(lambda: len(held(node)) == 30, 60, what="all 30 seats held")
    # The last of the start-up readers: notify's consumer (on NOTIFY, made with
    # the mailboxes) and the collector's first walk (once a copy serves).
    node.wait_event("notify_attached", 30)
    node.wait_event("objects_collected", 30)
    said = [e for e in node.events() if e.get("level") in ("warning", "error")]
    assert not said, "\n".join(json.dumps(e) for e in said)
    assert 503 in answers, f"never probed while starting: {answers}"  # the 503 path was taken


def test_once_ready_a_new_node_answers_from_the_estate(make_node):
    """Ready means the estate answers: a node just started is not ready until
    a copy of it is in service (its own applier caught up), so the first
    request a load balancer sends it is not a 503 estate_unavailable."""
    node = make_node()
    node.start(wait_ready=False)
    base = f"http://{node.config['ingress']['listen']}"
    seen = []

    def ready():
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=5) as r:
                return r.status == 200
        except urllib.error.HTTPError as exc:
            seen.append(json.load(exc))
            return False
        except OSError:
            return False
    wait_for(ready, 60, interval=0.05, what="/readyz 200")
    token = tokens.read_admin_token(node.run_dir)
    request = urllib.request.Request(base + "/v1/tasks", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200 and "items" in json.load(r)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"ready, yet {exc.code}: {exc.read().decode()}") from None
    # Not ready before, and saying why (not only children starting).
    assert seen and all("estate" in body for body in seen)


def test_readyz_reports_a_child_that_is_not_running(make_node):
    node = make_node(supervisor={"backoff_min": 30, "backoff_max": 30, "stable_after": 60},
                     debug={"faults": [{"role": "workers", "kind": "crash", "once": False,
                                        "after": 0.3}]})
    node.start(wait_ready=False)
    base = f"http://{node.config['ingress']['listen']}"

    def in_backoff():
        kids = node.children()
        return kids and kids.get("workers", {}).get("state") == "backoff"
    wait_for(in_backoff, 30, what="workers in backoff")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(base + "/readyz", timeout=5)
    assert err.value.code == 503
    body = json.load(err.value)
    assert {"name": "workers", "state": "backoff"} in body["not_running"]
    # crewletctl status exits 3 when a child is not running.
    out = subprocess.run([*CREWLETCTL, "-c", node.config_path, "status"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 3, out.stdout + out.stderr


def test_crewletctl_status_restart_and_stop(make_node):
    node = make_node().start()
    ctl = [*CREWLETCTL, "-c", node.config_path]
    out = subprocess.run([*ctl, "status"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "t1" in out.stdout and "seats" in out.stdout
    js = subprocess.run([*ctl, "status", "--json"], capture_output=True, text=True, timeout=30)
    data = json.loads(js.stdout)
    assert data["node"]["id"] == "t1" and data["node"]["roles"] == ["data", "ingress", "seats", "workers"]
    for c in data["children"]:
        assert {"name", "pid", "state", "restarts", "uptime_s", "last_exit", "cpu_percent",
                "rss_bytes"} <= set(c)
    old = node.children()["seats"]["pid"]
    out = subprocess.run([*ctl, "restart", "seats"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert node.children()["seats"]["pid"] != old and not alive(old)
    bad = subprocess.run([*ctl, "restart", "nope"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "nope" in bad.stderr
    out = subprocess.run([*ctl, "stop"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert node.wait_exit(30) == 0


def test_crewletctl_without_a_node_exits_69(short_tmp):
    out = subprocess.run([*CREWLETCTL, "--data-dir", os.path.join(short_tmp, "none"), "status"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 69
    assert "control" in out.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare for a PID namespace")
def test_as_pid1_in_a_pid_namespace_reaps_orphans(make_node):
    node = make_node(debug={"faults": [{"role": "seats", "kind": "orphan"}]})
    node.start(wait_ready=False, prefix=["unshare", "--pid", "--fork", "--mount-proc"])
    started = node.wait_event("crewletd_starting", timeout=30)
    assert started["pid1"] is True and started["pid"] == 1
    spawned = node.wait_event("fault_orphan_spawned", timeout=30)
    reaped = node.wait_event("orphan_reaped", timeout=10, orphan_pid=spawned["orphan_pid"])
    assert reaped["role"] == "crewletd"
    # Nothing in the namespace is left a zombie.
    tree = node.tree_pids()
    assert not [p for p in tree if not alive(p) and psutil.pid_exists(p)]
    crewletd = psutil.Process(node.proc.pid).children()[0]  # unshare's child, PID 1 inside
    crewletd.send_signal(signal.SIGTERM)
    assert node.wait_exit(30) == 0  # unshare exits with its child's status


def test_systemd_notify_ready_and_watchdog(make_node, short_tmp):
    import socket as _socket
    path = os.path.join(short_tmp, "notify")
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(20)
    node = make_node()
    os.environ["NOTIFY_SOCKET"] = path
    os.environ["WATCHDOG_USEC"] = "200000"  # systemd's WatchdogSec=0.2
    try:
        node.start(wait_ready=False)
    finally:
        del os.environ["NOTIFY_SOCKET"], os.environ["WATCHDOG_USEC"]
    seen: list[str] = []
    try:
        while "READY=1" not in seen or seen.count("WATCHDOG=1") < 3:
            seen.append(sock.recv(256).decode())
        # READY=1 comes only once every child is running.
        kids = node.children()
        assert all(c["state"] == "running" for c in kids.values())
        node.proc.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in seen:
            seen.append(sock.recv(256).decode())
    finally:
        sock.close()
    assert node.wait_exit(30) == 0


def test_crewletd_own_wedged_loop_exits_75_and_takes_its_children_with_it(make_node):
    node = make_node(debug={"faults": [{"role": "crewletd", "kind": "wedge", "after": 0.2}]})
    node.start()
    tree = node.tree_pids()
    assert node.wait_exit(30) == 75
    assert "event_loop_wedged" in node.read_log()
    # Parent-death signals: nothing it started outlives it.
    wait_for(lambda: not any(alive(p) for p in tree), 15, what="every child gone")


PLACED_COMPANY = """
company: {name: t}
providers:
  p: {kind: scripted}
seats:
  - {name: anywhere, persona: p, provider: p}
  - {name: on-mars, persona: p, provider: p, placement: {labels: {zone: %s}}}
"""


def test_a_seat_no_live_node_may_hold_is_said_once_and_shown_in_status(make_node):
    """Issue 16: a seat whose placement labels no live node has gets a warning
    (fleet_seat_unplaceable, once per change, from the fleet_shape duty) and a
    line in crewletctl status; a company that places it anew resolves it."""
    from tests.seats import ctl, held, write_company

    node = make_node(node={"id": "t1", "labels": {"zone": "earth"}},
                     fleet={"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5})
    node.start(args=("--company", write_company(node.dir, PLACED_COMPANY % "mars")))
    wait_for(lambda: held(node).get("anywhere") == "t1", 30, what="the placeable seat held")
    node.wait_event("fleet_seat_unplaceable", 10, seats=["on-mars"], count=1)
    assert "1 seat no live node may hold (placement labels): on-mars" in ctl(node, "status").stdout
    assert json.loads(ctl(node, "status", "--json").stdout)["fleet"]["unplaceable"] == \
        {"seats": ["on-mars"], "count": 1}

    out = ctl(node, "apply", write_company(node.dir, PLACED_COMPANY % "earth", "placed.yaml"))
    assert out.returncode == 0, out.stderr
    node.wait_event("fleet_resolved_seat_unplaceable", 10)
    wait_for(lambda: held(node).get("on-mars") == "t1", 10, what="the seat held once placeable")
    assert "may hold" not in ctl(node, "status").stdout
    said = node.events_named("fleet_seat_unplaceable")
    assert len(said) == 1, said
