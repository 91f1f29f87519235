"""crewletctl without a node: rendering of status dicts and the exit codes."""

import io
import json
import time

import pytest
from click.testing import CliRunner
from rich.console import Console

import crewlet.ctl as ctl
from crewlet import ipc
from crewlet.ctl import render
from crewlet.ctl.status import exit_code
from crewlet.estate.view import STATUS_STALE

NOW = 1796021400.0


def child(name, state="running", **kw):
    c = {"name": name, "type": "worker", "supervisor": "roles", "restart": "permanent", "pid": 100,
         "state": state, "restarts": 0, "uptime_s": 192.4, "started_at": NOW - 192.4, "last_exit": None,
         "cpu_percent": 1.25, "rss_bytes": 45 * 2**20}
    return {**c, **kw}


def sample(*children):
    return {
        "node": {"id": "n1", "roles": ["data", "seats"], "labels": {}, "pid": 3159, "version": "0.1.0",
                 "started_at": NOW - 12.3, "uptime_s": 12.3, "data_dir": "/tmp/cw1/data",
                 "config": "/tmp/cw1/c.yaml", "stopping": False, "cpu_percent": 0.5, "rss_bytes": 45000000,
                 "broker": {"type": "embedded", "servers": ["nats://127.0.0.1:14222"]}},
        "children": list(children) or [child("broker"), child("seats")],
        "supervisors": [{"name": "root", "strategy": "rest_for_one", "restarts_in_period": 0,
                         "intensity": 5, "period": 30.0},
                        {"name": "roles", "strategy": "one_for_one", "restarts_in_period": 1,
                         "intensity": 5, "period": 30.0}],
    }


def text(renderable, width=200) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


# ------------------------------------------------------------------ values

@pytest.mark.parametrize("seconds, shown", [
    (None, "-"), (0, "0s"), (12.9, "12s"), (192.4, "3m12s"), (3600, "1h00m"), (7500, "2h05m"),
    (3 * 86400 + 4 * 3600 + 5, "3d04h"), (-3, "0s"),
])
def test_human_duration(seconds, shown):
    assert render.human_duration(seconds) == shown


def test_human_bytes():
    assert render.human_bytes(None) == "-"
    assert render.human_bytes(45 * 2**20) == "45.0 MiB"
    assert render.human_bytes(1536 * 2**20) == "1536.0 MiB"
    assert render.human_bytes(12 * 2**30) == "12.0 GiB"


def test_last_exit_text():
    assert render.last_exit_text(None, NOW) == "-"
    killed = {"code": None, "signal": 9, "reason": "signal 9 (SIGKILL)", "at": NOW - 75}
    assert render.last_exit_text(killed, NOW) == "signal 9 (SIGKILL), 1m15s ago"
    assert render.last_exit_text({"code": 3, "signal": None, "reason": None, "at": None}, NOW) == "exit 3"


def test_states_are_colored():
    assert render.state_text("running").style == "green"
    for state in ("starting", "backoff", "stopping"):
        assert render.state_text(state).style == "yellow"
    for state in ("exited", "fatal", "stopped"):
        assert "red" in render.state_text(state).style
    assert render.state_text(None).plain == "unknown"


# ------------------------------------------------------------------ json

def test_normalize_gives_stable_keys_and_passes_others_through():
    status = sample(child("seats", "backoff", pid=None, uptime_s=None, cpu_percent=None, rss_bytes=None,
                          last_exit={"code": 1, "reason": "exit 1"}))
    del status["node"]["version"]
    out = render.normalize(status)
    assert set(render.NODE_KEYS) <= set(out["node"]) and out["node"]["version"] is None
    assert out["node"]["labels"] == {} and out["supervisors"] == status["supervisors"]
    (c,) = out["children"]
    assert set(render.CHILD_KEYS) <= set(c) and c["supervisor"] == "roles"
    assert c["last_exit"] == {"code": 1, "signal": None, "reason": "exit 1", "at": None}
    assert json.loads(json.dumps(out)) == out
    assert render.normalize({})["children"] == [] and set(render.normalize({})["node"]) == set(render.NODE_KEYS)


# ------------------------------------------------------------------ views

def test_status_view_shows_node_children_and_supervisors():
    killed = {"code": None, "signal": 9, "reason": "signal 9 (SIGKILL)", "at": NOW - 5}
    out = text(render.status_view(sample(child("broker"), child("seats", restarts=1, last_exit=killed)), NOW))
    for expected in ("n1", "data, seats", "3159", "up 12s", "embedded nats://127.0.0.1:14222",
                     "/tmp/cw1/c.yaml", "/tmp/cw1/data", "NAME", "RSS", "broker", "3m12s", "45.0 MiB", "1.2",
                     "signal 9 (SIGKILL), 5s ago", "root rest_for_one 0/5 restarts in 30s",
                     "roles one_for_one 1/5 restarts in 30s"):
        assert expected in out, expected


def test_status_view_says_where_the_api_and_its_first_token_are():
    status = sample(child("ingress"))
    status["node"]["api"] = {"url": "http://127.0.0.1:7420/", "token_file": "/tmp/cw1/data/run/api-token"}
    out = text(render.status_view(status, NOW))
    assert "http://127.0.0.1:7420/" in out and "/tmp/cw1/data/run/api-token" in out
    status["node"]["api"]["token_file"] = None  # tokens configured: there is no file to name
    assert "configured (ingress.tokens)" in text(render.status_view(status, NOW))


def test_status_view_says_which_secrets_this_node_cannot_open():
    status = sample(child("seats"))
    status["node"]["secrets"] = {"held": 3, "unreadable": [], "listed": True}
    out = text(render.status_view(status, NOW))
    assert "3 held" in out and "cannot open" not in out
    status["node"]["secrets"] = {"held": 3, "unreadable": ["llm"], "listed": True}
    assert "cannot open llm: sealed with a key this node lacks" in text(render.status_view(status, NOW))
    status["node"]["secrets"] = None  # not joined yet
    assert "held" not in text(render.status_view(status, NOW))


def test_secret_listing_shows_no_value_and_what_is_missing():
    listed = {"secrets": [{"name": "llm", "version": 2, "by": "crewletctl@n1", "at": NOW - 60, "key": "abc123",
                           "readable": False, "previous_until": NOW + 30, "named_by": ["providers.p.api_key_secret"]}],
              "missing": [{"name": "hook", "named_by": ["integrations.gh.secret"]}], "key": "def456"}
    out = text(render.secrets_view(listed, NOW))
    assert "llm" in out and "crewletctl@n1" in out and "not held here" in out and "providers.p.api_key_secret" in out
    assert "hook: named by integrations.gh.secret but not set" in out and "never shown" in out
    assert "no secrets are set" in text(render.secrets_view({"secrets": [], "missing": []}, NOW))


def test_status_view_with_null_fields():
    down = child("seats", "backoff", pid=None, uptime_s=None, cpu_percent=None, rss_bytes=None)
    row = next(line for line in text(render.status_view(sample(down), NOW)).splitlines() if "seats" in line
               and "backoff" in line)
    assert row.split() == ["seats", "-", "backoff", "-", "0", "-", "-", "-"]


def test_watch_view_unreachable():
    out = text(render.watch_view(None, "no control socket at /x/run/control", "looked at /x", NOW - 4, 1.0, NOW))
    assert "node not reachable: no control socket at /x/run/control" in out
    assert "last answer 4s ago" in out and "looked at /x" in out
    assert "n1" in text(render.watch_view(sample(), None, "w", NOW, 1.0, NOW))


@pytest.mark.parametrize("states, stopping, code", [
    (["running", "running"], False, 0), (["running", "backoff"], False, 3), (["fatal"], False, 3),
    (["running"], True, 3), ([], False, 0),
])
def test_exit_code(states, stopping, code):
    status = sample(*(child(f"c{i}", s) for i, s in enumerate(states)))
    status["children"] = [child(f"c{i}", s) for i, s in enumerate(states)]
    status["node"]["stopping"] = stopping
    assert exit_code(status) == code


# ------------------------------------------------------------------ the command

@pytest.fixture
def node(monkeypatch, tmp_path):
    """A fake crewletd: ``node.replies[op]`` is a result dict, an error string, or None (unreachable)."""
    for var in ("CREWLET_CONFIG", "CREWLET_DATA_DIR", "XDG_DATA_HOME", "CREWLET_NODE_ID"):
        monkeypatch.delenv(var, raising=False)

    class Fake:
        replies: dict = {"status": sample(), "stop": {"stopping": True}}
        calls: list = []

    def call(run_dir, op, timeout=3.0, **args):
        Fake.calls.append((run_dir, op, timeout, args))
        reply = Fake.replies.get(op, {})
        if reply is None:
            raise ipc.NodeUnreachable(f"nothing answered on {run_dir}")
        if isinstance(reply, str):
            return {"id": "x", "ok": False, "error": reply}
        return {"id": "x", "ok": True, "result": reply}

    monkeypatch.setattr(ipc, "call", call)
    monkeypatch.setattr(ctl, "_probe", lambda path: None)
    Fake.calls = []
    return Fake


def run(tmp_path, *args):
    return CliRunner().invoke(ctl.cli, ["--data-dir", str(tmp_path), *args])


def test_status_exit_codes(node, tmp_path):
    assert run(tmp_path, "status").exit_code == 0
    assert node.calls[0][0] == str(tmp_path / "run")
    node.replies["status"] = sample(child("broker"), child("seats", "backoff"))
    result = run(tmp_path, "status")
    assert result.exit_code == 3 and "backoff" in result.stdout


def test_status_json(node, tmp_path):
    result = run(tmp_path, "status", "--json")
    out = json.loads(result.stdout)
    assert result.exit_code == 0
    assert set(render.NODE_KEYS) <= set(out["node"]) and len(out["supervisors"]) == 2
    assert all(set(render.CHILD_KEYS) <= set(c) for c in out["children"])
    assert run(tmp_path, "status", "--json", "--watch").exit_code == 2


def test_unreachable_exits_69_and_says_where(node, tmp_path):
    node.replies["status"] = None
    for command in (["status"], ["status", "--json"], ["restart", "seats"], ["stop"]):
        result = run(tmp_path, *command)
        assert result.exit_code == 69, command
        assert "crewletctl: no crewlet node reachable: nothing answered" in result.stderr
        assert f"{tmp_path}/run/control (data dir from --data-dir)" in result.stderr


def test_config_error_exits_78(node, tmp_path):
    result = CliRunner().invoke(ctl.cli, ["-c", str(tmp_path / "missing.yaml"), "status"])
    assert result.exit_code == 78 and "missing.yaml: no such file" in result.stderr


def test_data_dir_from_config(node, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"node: {{id: c1}}\ndata_dir: {tmp_path}/d\n")
    node.replies["status"] = None
    result = CliRunner().invoke(ctl.cli, ["-c", str(cfg), "status"])
    assert result.exit_code == 69
    assert f"{tmp_path}/d/run/control (data dir from --config {cfg})" in result.stderr


def test_restart(node, tmp_path):
    result = run(tmp_path, "restart", "seats")
    assert result.exit_code == 0 and result.stdout == "restarted seats\n"
    assert node.calls[-1][1:] == ("restart", ctl.RESTART_TIMEOUT, {"child": "seats"})
    node.replies["restart"] = "no child named 'nope'; children: broker, seats"
    result = run(tmp_path, "restart", "nope")
    assert result.exit_code == 1 and "crewletctl: no child named 'nope'" in result.stderr


def test_stop_without_wait(node, tmp_path):
    result = run(tmp_path, "stop", "--no-wait")
    assert result.exit_code == 0 and result.stdout == "stopping node n1\n"
    assert [c[1] for c in node.calls] == ["status", "stop"]


def test_stop_waits_until_unreachable(node, tmp_path, monkeypatch):
    monkeypatch.setattr("crewlet.ctl.stop.time.sleep", lambda s: node.replies.update(status=None))
    result = run(tmp_path, "stop")
    assert result.exit_code == 0 and result.stdout == "stopping node n1\nstopped\n"


def test_watch_keeps_going_when_unreachable_and_exits_0_on_ctrl_c(node, tmp_path, monkeypatch):
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        node.replies["status"] = None  # the node goes away after the first round
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr("crewlet.ctl.status.time.sleep", sleep)
    result = run(tmp_path, "status", "--watch", "--interval", "5")
    assert result.exit_code == 0
    assert [c[1] for c in node.calls] == ["status"] * 3  # kept asking after the node went away
    assert "node not reachable: nothing answered" in result.stdout  # the last frame
    assert all(s <= 1.0 for s in sleeps)


# ------------------------------------------------------------------ the fleet

def copy_record(nid, applied=1240, in_service=True, reason=None, log_first=1, log_last=1240, ago=1.5):
    """A data node's applier record in ``status`` (``estate.<id>``)."""
    return {"node": nid, "applied": applied, "in_service": in_service, "reason": reason,
            "log_first": log_first, "log_last": log_last, "at": NOW - ago}


def fleet_node(nid, rev=2, seats=(), duties=(), **kw):
    n = {"id": nid, "roles": ["data", "seats", "workers"], "broker": "member", "labels": {"zone": "eu"},
         "version": "0.1.0", "protocol": 1, "boot": "0b65adc15b87", "max_concurrent": 32,
         "started_at": NOW - 60, "rev": rev, "host": "vm", "data_dir": f"/tmp/{nid}", "pid": 19977,
         "renewed_at": NOW - 2.4, "applied": {"rev": rev, "epoch": rev, "at": NOW - 30},
         "status_error": None, "estate": copy_record(nid), "evicted": None, "seats": list(seats),
         "duties": list(duties), "conversations": 0, "draining": None}
    return {**n, **kw}


def fleet(*nodes, company=None, error=None, connected=True, reports=None):
    company = {"rev": 2, "epoch": 2, "digest": "0fbb3459f9f04620"} if company is None else company
    return {"company": company or None, "error": error, "connected": connected, "nodes": list(nodes),
            "seats": [{"name": s, "node": n["id"], "token": 10 + i}
                      for n in nodes for i, s in enumerate(n["seats"])],
            "duties": [{"name": d, "node": n["id"], "token": 2} for n in nodes for d in n["duties"]],
            "streams": None, "unplaceable": {"seats": [], "count": 0}, "reports": reports or {},
            "drains": {}}


def three_nodes(**kw):
    """n0 (with the fleet_shape duty), n1 (this node, the sample's id) and n2: 10 seats each."""
    return fleet(*(fleet_node(f"n{i}", seats=[f"s{i}-{j}" for j in range(10)],
                              duties=["fleet_shape"] if i == 0 else [])
                   for i in range(3)), **kw)


def with_fleet(value):
    status = sample()
    status["fleet"] = value
    return status


def line_of(out, start):
    return next(line for line in out.splitlines() if line.startswith(start))


def test_fleet_null_says_not_in_a_fleet():
    out = text(render.status_view(with_fleet(None), NOW))
    assert "not in a fleet (yet)" in line_of(out, "fleet ")
    assert "NODE" not in out and "seats held" not in out
    assert "not in a fleet" in text(render.status_view(sample(), NOW))  # a reply without the key


def test_fleet_with_three_nodes():
    out = text(render.status_view(with_fleet(three_nodes()), NOW))
    assert "company rev 2 (epoch 2, digest 0fbb3459f9f04620)" in line_of(out, "fleet ")
    for header in ("NODE", "ROLES", "BROKER", "LABELS", "REV", "SEATS", "DUTIES", "COPY", "RENEWED"):
        assert header in out, header
    assert line_of(out, "n0").split() == ["n0", "data,", "seats,", "workers", "member", "zone=eu", "2", "10",
                                          "fleet_shape", "1,240", "2s", "ago"]
    assert line_of(out, "n1").split()[:2] == ["n1", "(here)"]  # the sample's node id
    assert "(here)" not in line_of(out, "n0") + line_of(out, "n2")
    assert line_of(out, "n2").split()[-5:] == ["10", "-", "1,240", "2s", "ago"]
    assert "3 copies, 3 in service" in out and "out of service" not in out
    assert "30 seats held by 3 nodes (n0 10, n1 10, n2 10)" in out
    assert "duties: fleet_shape@n0" in out
    assert "refused" not in out and "not connected" not in out
    # the fleet comes after the children table and the supervisors
    assert out.index("supervisors") < out.index("company rev 2") < out.index("NODE")


def test_fleet_with_an_error_and_a_node_on_another_revision():
    bad = "revision 3: ValidationError: seats.0.name: bad"
    f = fleet(fleet_node("n0", seats=[f"a{j}" for j in range(10)], duties=["fleet_shape"], status_error=bad),
              fleet_node("n1", seats=[f"b{j}" for j in range(10)]), fleet_node("n2", rev=1), error=bad)
    status = with_fleet(f)
    out = text(render.status_view(status, NOW))
    assert "refused revision 3: ValidationError: seats.0.name: bad" in out
    assert line_of(out, "n0").split()[6:8] == ["2", "refused"]
    assert "n0 refused revision 3: ValidationError: seats.0.name: bad" in out
    assert line_of(out, "n2").split()[6] == "1"
    assert "20 seats held by 2 nodes (n0 10, n1 10)" in out
    # colors: the refusal red, the node on another revision yellow, n1 plain
    grid, _, nodes, *_ = render.fleet_view(render.normalize(status)["fleet"], "n1", NOW).renderables
    assert any("red" in str(cell.style) for cell in grid.columns[1].cells if "refused" in cell.plain)
    table = nodes.wide
    revs = {row: cell for row, cell in zip(["n0", "n1", "n2"], table.columns[4].cells)}
    assert revs["n0"].style == "red" and revs["n2"].style == "yellow" and revs["n1"].style == ""
    # a node that applied nothing yet, or a company not applied here
    assert render.rev_text(fleet_node("n9", applied=None, rev=None), 2).style == "yellow"
    assert render.rev_text(fleet_node("n9", applied=None, rev=None), None).plain == "-"
    out = text(render.status_view(with_fleet(fleet(fleet_node("n1", rev=None, applied=None), company={})), NOW))
    assert "no company applied" in line_of(out, "fleet ")
    assert "no seats held" in out and "duties: none" in out


def test_fleet_not_connected():
    out = text(render.status_view(with_fleet(three_nodes(connected=False)), NOW))
    assert "not connected to NATS" in out
    assert "30 seats held by 3 nodes" in out  # still shows the last view
    assert "not connected" not in text(render.status_view(with_fleet(three_nodes()), NOW))


def test_fleet_in_watch_view_and_hidden_with_no_fleet():
    status = with_fleet(three_nodes())
    assert "duties: fleet_shape@n0" in text(render.watch_view(status, None, "w", NOW, 1.0, NOW))
    assert "duties:" not in text(render.watch_view(status, None, "w", NOW, 1.0, NOW, fleet=False))
    assert "NODE" not in text(render.status_view(status, NOW, fleet=False))


def test_the_maintenance_line_says_what_the_last_sweep_removed():
    """The duty's last sweep (status duty.maintenance), on every node's status:
    when and where, what it removed, in all, and its errors."""
    out = text(render.status_view(with_fleet(three_nodes()), NOW))
    assert "no sweep reported yet" in line_of(out, "maintenance")
    report = {"node": "n0", "token": 4, "at": NOW - 720, "took_ms": 12.5,
              "removed": {"turns": 1200, "mail": 1, "mailboxes": 0},
              "totals": {"turns": 4000, "mail": 3400, "mailboxes": 2},
              "turns": {"days": 90, "before": NOW - 90 * 86400, "more": True},
              "errors": ["turn records: NobodyAnswered: no data node answered"]}
    line = line_of(text(render.status_view(with_fleet(three_nodes(reports={"maintenance": report})),
                                           NOW), width=400), "maintenance")
    assert "swept 12m00s ago on n0" in line
    assert "removed 1,200 turn records, 1 worked message, 0 mailboxes" in line
    assert "in all 4,000 turn records, 3,400 worked messages, 2 mailboxes" in line
    assert "old turn records left for the next sweep" in line and "NobodyAnswered" in line


def test_the_files_line_says_what_the_collector_found_and_removed():
    out = text(render.status_view(with_fleet(three_nodes()), NOW))
    assert "no collection reported yet" in line_of(out, "files")
    report = {"node": "n1", "at": NOW - 125, "store": "nats:files", "objects": 1204, "bytes": 3 * 2**30,
              "named": 1200, "kept_young": 1, "removed": 2, "removed_bytes": 2**20,
              "totals": {"removed": 40}, "errors": []}
    line = line_of(text(render.status_view(with_fleet(three_nodes(reports={"collector": report})),
                                           NOW), width=400), "files")
    assert "nats:files · collected 2m05s ago on n1" in line
    assert "1,204 objects, 3072.0 MiB" in line and "2 removed (1.0 MiB), 1 kept in their grace" in line
    assert "in all 40 removed" in line and "not read" not in line
    unread = {**report, "named": None, "errors": ["the rows could not be read: NobodyAnswered"]}
    line = line_of(text(render.status_view(with_fleet(three_nodes(reports={"collector": unread})),
                                           NOW), width=400), "files")
    assert "the rows were not read: nothing removed" in line and "NobodyAnswered" in line


def test_the_learning_line_says_what_the_last_pass_did():
    out = text(render.status_view(with_fleet(three_nodes()), NOW))
    assert "no pass reported yet" in line_of(out, "learning")
    report = {"node": "n2", "token": 3, "at": NOW - 180, "counts": {"steps": 2, "provider_calls": 1, "ops": 2,
                                                                    "skipped": 0, "tokens": 310},
              "totals": {"steps": 40, "provider_calls": 35, "ops": 41, "skipped": 3}, "episodes": 1200,
              "clusters": 14, "new": 1, "errors": ["drafting x: provider p: HTTP 500"]}
    line = line_of(text(render.status_view(with_fleet(three_nodes(reports={"learning": report})),
                                           NOW), width=400), "learning")
    assert "passed 3m00s ago on n2 · 2 steps, 1 provider call, 2 ops, 0 skipped" in line
    assert "14 clusters of 1,200 episodes, 1 new" in line
    assert "in all 40 steps, 35 provider calls, 41 ops, 3 skipped" in line and "HTTP 500" in line


def test_normalize_fleet():
    assert render.normalize(sample())["fleet"] is None
    assert render.normalize(with_fleet(None))["fleet"] is None
    out = render.normalize(with_fleet({"nodes": [{"id": "n0"}], "seats": [{"name": "a", "node": "n0"}]}))
    f = out["fleet"]
    assert set(render.FLEET_KEYS) <= set(f) and f["duties"] == [] and f["company"] is None
    assert set(render.FLEET_NODE_KEYS) <= set(f["nodes"][0]) and f["nodes"][0]["seats"] == []
    assert f["seats"] == [{"name": "a", "node": "n0", "token": None}]
    full = three_nodes()
    assert render.normalize(with_fleet(full))["fleet"] == full  # a complete view passes unchanged


def test_status_json_has_the_fleet(node, tmp_path):
    node.replies["status"] = with_fleet(three_nodes())
    result = run(tmp_path, "status", "--json")
    f = json.loads(result.stdout)["fleet"]
    assert result.exit_code == 0
    assert [n["id"] for n in f["nodes"]] == ["n0", "n1", "n2"]
    assert all(set(render.FLEET_NODE_KEYS) <= set(n) for n in f["nodes"])
    assert len(f["seats"]) == 30 and set(f["seats"][0]) == {"name", "node", "token"}
    assert f["duties"] == [{"name": "fleet_shape", "node": "n0", "token": 2}]
    assert json.loads(run(tmp_path, "status", "--json", "--no-fleet").stdout)["fleet"] == f
    node.replies["status"] = sample()  # no fleet key at all: null
    out = json.loads(run(tmp_path, "status", "--json").stdout)
    assert "fleet" in out and out["fleet"] is None


def test_status_fleet_section_and_no_fleet(node, tmp_path):
    node.replies["status"] = with_fleet(three_nodes(error="revision 3: ValueError: x", connected=False))
    result = run(tmp_path, "status")
    assert result.exit_code == 0  # the fleet does not change the exit code
    assert "30 seats held by 3 nodes (n0 10, n1 10, n2 10)" in result.stdout
    assert "refused revision 3" in result.stdout
    result = run(tmp_path, "status", "--no-fleet")
    assert result.exit_code == 0 and "n1" in result.stdout
    assert "seats held" not in result.stdout and "company rev" not in result.stdout
    node.replies["status"] = with_fleet(three_nodes())
    node.replies["status"]["children"] = [child("seats", "backoff")]
    assert run(tmp_path, "status").exit_code == 3


def test_watch_with_no_fleet(node, tmp_path, monkeypatch):
    node.replies["status"] = with_fleet(three_nodes())

    def sleep(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr("crewlet.ctl.status.time.sleep", sleep)
    result = run(tmp_path, "status", "--watch")
    assert result.exit_code == 0 and "duties: fleet_shape@n0" in result.stdout
    result = run(tmp_path, "status", "--watch", "--no-fleet")
    assert result.exit_code == 0 and "n1" in result.stdout and "duties:" not in result.stdout


# ------------------------------------------------------------------ the estate in the status

def copies_fleet(*nodes):
    return with_fleet(fleet(*nodes))


def copy_cells(status, nodes=("n0", "n1", "n2")):
    """Each node's COPY cell as rendered (Text: plain and style)."""
    f = render.normalize(status)["fleet"]
    furthest = render.furthest_copy(f["nodes"])
    return {n["id"]: render.copy_text(n, furthest, NOW) for n in f["nodes"] if n["id"] in nodes}


def test_copies_in_service_and_behind():
    status = copies_fleet(fleet_node("n0"), fleet_node("n1", estate=copy_record("n1", applied=1234)),
                          fleet_node("n2", estate=copy_record("n2", applied=200)))
    out = text(render.status_view(status, NOW))
    assert "COPY" in out
    assert line_of(out, "n0").split()[-3:] == ["1,240", "2s", "ago"]
    assert line_of(out, "n1").split()[-5:] == ["1,234", "(6", "behind)", "2s", "ago"]
    assert line_of(out, "n2").split()[-5:] == ["200", "(1,040", "behind)", "2s", "ago"]
    # a few ops behind is the normal gap between records; past LAG_OPS the router asks it last
    cells = copy_cells(status)
    assert cells["n0"].style == "" and cells["n1"].style == "" and cells["n2"].style == "yellow"
    assert "n2 copy 1,040 ops behind the furthest: the router asks it after the others" in out
    assert "n1 copy" not in out and "out of service" not in out
    assert "3 copies, 3 in service" in out


def test_copy_out_of_service_with_its_reason():
    below = "rows below the log's first sequence (applied 120, the log starts at 400)"
    status = copies_fleet(
        fleet_node("n0"),
        fleet_node("n1", estate=copy_record("n1", applied=120, in_service=False, reason=below,
                                            log_first=400)),
        fleet_node("n2", estate=copy_record("n2", ago=45)))  # no record for 45 s: its applier stopped
    out = text(render.status_view(status, NOW))
    assert line_of(out, "n1").split()[-4:] == ["120", "out", "2s", "ago"]
    assert line_of(out, "n2").split()[-4:] == ["1,240", "out", "2s", "ago"]
    assert f"n1 copy out of service: {below}" in out
    assert "n2 copy out of service: applier stopped (last record 45s ago)" in out
    assert "3 copies, 1 in service" in out
    cells = copy_cells(status)
    assert cells["n1"].style == "yellow" and cells["n2"].style == "yellow"
    # the out-of-service lines are yellow, as the estate line's reason is
    _, _, _, *lines = render.fleet_view(render.normalize(status)["fleet"], "n1", NOW).renderables
    assert [t.style for t in lines if "out of service" in t.plain] == ["yellow", "yellow"]
    # a record just inside the staleness limit is still in service
    fresh = copies_fleet(fleet_node("n0", estate=copy_record("n0", ago=STATUS_STALE - 1)))
    assert "1 copy, 1 in service" in text(render.status_view(fresh, NOW))


def test_seats_no_live_node_may_hold_are_named():
    status = copies_fleet(fleet_node("n0"))
    assert "may hold" not in text(render.status_view(status, NOW))
    status["fleet"]["unplaceable"] = {"seats": ["gpu-eu", "mars"], "count": 2}
    assert "2 seats no live node may hold (placement labels): gpu-eu, mars" in \
        text(render.status_view(status, NOW))
    status["fleet"]["unplaceable"] = {"seats": ["a", "b"], "count": 40}
    assert "40 seats no live node may hold (placement labels): a, b, …" in \
        text(render.status_view(status, NOW))


def test_copy_evicted_and_without_a_record():
    evicted = {"reason": "disk failed", "at": NOW - 60}
    status = copies_fleet(fleet_node("n0"), fleet_node("n1", evicted=evicted),
                          fleet_node("n2", estate=None))
    out = text(render.status_view(status, NOW))
    assert line_of(out, "n1").split()[-3:] == ["evicted", "2s", "ago"]  # the eviction wins over the record
    assert "n1 evicted: disk failed (`crewletctl evict n1 --undo` puts its copy back)" in out
    assert line_of(out, "n2").split()[-4:] == ["no", "record", "2s", "ago"]
    assert "n2 copy out of service: no applier record" in out
    assert "3 copies, 1 in service" in out
    assert "n1 copy out of service" not in out  # said once, as evicted
    assert render.copy_out(fleet_node("n1", evicted={"at": NOW}), NOW) == "node evicted: no reason given"


def test_nodes_without_data_have_no_copy():
    leaf = fleet_node("n3", roles=["seats"], broker="leaf", estate=None)
    status = copies_fleet(fleet_node("n0"), leaf)
    out = text(render.status_view(status, NOW))
    assert line_of(out, "n3").split()[-4:] == ["no", "copy", "2s", "ago"]
    assert copy_cells(status, ("n3",))["n3"].style == "dim"
    assert "1 copy, 1 in service" in out and "n3 copy" not in out  # not counted, not a problem
    # a stale record of a node that no longer has the data role is no copy either
    assert render.copy_text(fleet_node("n3", roles=["seats"]), 1240, NOW).plain == "no copy"
    out = text(render.status_view(copies_fleet(leaf), NOW))
    assert "no data node: the fleet holds no copy of the estate" in out
    down = copies_fleet(fleet_node("n0", estate=copy_record("n0", ago=60)),
                        fleet_node("n1", evicted={"reason": "x", "at": NOW}))
    summary = render.copies_summary(render.normalize(down)["fleet"]["nodes"], NOW)
    assert summary.plain == "2 copies, none in service: the estate can be neither read nor written"
    assert "red" in summary.style


def test_copies_give_way_to_a_line_on_a_narrow_terminal():
    status = copies_fleet(fleet_node("n0"), fleet_node("n1", estate=copy_record("n1", applied=1234)),
                          fleet_node("n2", roles=["seats"], broker="leaf", estate=None))
    wide = text(render.status_view(status, NOW), width=120)
    assert "COPY" in wide and "copies  " not in wide
    narrow = text(render.status_view(status, NOW), width=80)
    assert "COPY" not in narrow and "NODE" in narrow
    assert "copies  n0 1,240 · n1 1,234 (6 behind) · n2 no copy" in narrow
    assert "2 copies, 2 in service" in narrow
    assert max(len(line) for line in narrow.splitlines()) <= 80


def test_normalize_fleet_gives_copy_records_their_keys():
    status = copies_fleet(fleet_node("n0", estate={"applied": 3, "in_service": True}),
                          fleet_node("n1", estate=None, evicted={"reason": "x", "at": NOW}))
    n0, n1 = render.normalize(status)["fleet"]["nodes"]
    assert n0["estate"] == {**dict.fromkeys(render.COPY_KEYS), "applied": 3, "in_service": True}
    assert n1["estate"] is None and n1["evicted"] == {"reason": "x", "at": NOW}
    bare = render.normalize(with_fleet({"nodes": [{"id": "n0"}]}))["fleet"]["nodes"][0]
    assert bare["estate"] is None and bare["evicted"] is None


def applier_stats(**kw):
    st = {"applied": 1234, "in_service": True, "reason": None, "ops_per_s": 350.2, "log_first": 1,
          "log_last": 1240, "requests": 12, "dropped": 0, "resubscribed": 0, "events_kept": 3}
    return {**st, **kw}


def with_applier(stats, fleet_value=None):
    status = sample(child("broker"), child("data_applier", stats=stats),
                    child("seats", stats=engine_stats(alice=seat_stats())))
    if fleet_value is not None:
        status["fleet"] = fleet_value
    return status


def test_estate_line_in_service():
    out = text(render.status_view(with_applier(applier_stats()), NOW))
    assert line_of(out, "estate").split("  ", 1)[1] == \
        "applied 1,234 of log 1,240 · in service · 350 ops/s · 12 requests · 3 events kept"
    # after the turns line, before the fleet
    assert out.index("turns  ") < out.index("estate  ") < out.index("fleet ")
    line = render.estate_line(applier_stats(applied=1, requests=1, events_kept=1, ops_per_s=0.4))
    assert line.plain == ("estate  applied 1 of log 1,240 · in service · 0.4 ops/s · 1 request · "
                          "1 event kept")
    assert "dropped" not in line.plain and "resubscribed" not in line.plain
    assert not [span for span in line.spans if span.style == "yellow"]


def test_estate_line_out_of_service():
    below = "rows below the log's first sequence (applied 120, the log starts at 400)"
    line = render.estate_line(applier_stats(applied=120, in_service=False, reason=below, log_first=400,
                                            ops_per_s=0.0, dropped=2, resubscribed=1))
    assert line.plain == (f"estate  applied 120 of log 400–1,240 · out of service: {below} · 0 ops/s · "
                          "12 requests · 2 dropped past their deadline · log resubscribed 1 time · "
                          "3 events kept")
    yellow = [line.plain[span.start:span.end] for span in line.spans if span.style == "yellow"]
    assert yellow[0] == f" · out of service: {below}"
    stopped = render.estate_line(applier_stats(in_service=False, reason="applier stopped", log_last=None))
    assert stopped.plain.startswith("estate  applied 1,234 (the log not read yet) · "
                                    "out of service: applier stopped")
    assert "no reason given" in render.estate_line({"in_service": False}).plain


def test_estate_line_only_with_the_appliers_stats():
    assert "estate  " not in text(render.status_view(sample(), NOW))  # no data_applier child (no data role)
    no_report = sample(child("broker"), child("data_applier"))  # its first report not in yet
    assert "estate  " not in text(render.status_view(no_report, NOW))
    assert render.child_stats(with_applier(applier_stats())["children"], "data_applier") == applier_stats()


def test_status_json_carries_the_estate(node, tmp_path):
    f = fleet(fleet_node("n0"), fleet_node("n1", evicted={"reason": "disk failed", "at": NOW}),
              fleet_node("n2", roles=["seats"], estate=None))
    node.replies["status"] = with_applier(applier_stats(), f)
    out = json.loads(run(tmp_path, "status", "--json").stdout)
    applier = next(c for c in out["children"] if c["name"] == "data_applier")
    assert applier["stats"] == applier_stats()
    n0, n1, n2 = out["fleet"]["nodes"]
    assert n0["estate"] == copy_record("n0") and n0["evicted"] is None
    assert n1["evicted"] == {"reason": "disk failed", "at": NOW}
    assert n2["estate"] is None and n2["roles"] == ["seats"]


def test_status_and_watch_show_the_estate(node, tmp_path, monkeypatch):
    now = time.time()  # the command judges records by the real clock
    f = fleet(fleet_node("n0", estate={**copy_record("n0"), "at": now - 1}),
              fleet_node("n1", estate={**copy_record("n1"), "at": now - 120}))
    node.replies["status"] = with_applier(applier_stats(in_service=False, reason="applier stopped"), f)
    monkeypatch.setenv("COLUMNS", "150")
    result = run(tmp_path, "status")
    assert result.exit_code == 0  # the estate does not change the exit code
    assert "out of service: applier stopped" in line_of(result.stdout, "estate")
    assert "n1 copy out of service: applier stopped" in result.stdout
    assert "2 copies, 1 in service" in result.stdout

    def sleep(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr("crewlet.ctl.status.time.sleep", sleep)
    result = run(tmp_path, "status", "--watch")
    assert result.exit_code == 0 and "estate  applied 1,234 of log 1,240" in result.stdout
    assert "2 copies, 1 in service" in result.stdout
    result = run(tmp_path, "status", "--watch", "--no-fleet")
    assert "estate  applied" in result.stdout and "copies" not in result.stdout


# ------------------------------------------------------------------ turns, seats, dead letters, send

def turn_record(seat="alice", outcome="done", **kw):
    r = {"seat": seat, "trigger": "t-1", "node": "n1", "token": 7, "deliveries": 1, "sender": "crewletctl@n1",
         "outcome": outcome, "error": None, "rounds": 2, "tokens": {"input": 120, "output": 40},
         "tool_calls": [{"name": "notes.write", "error": None, "round": 1},
                        {"name": "search", "error": "boom", "round": 2}],
         "reply": "Hello [bold]there[/x]\nsecond line", "started_at": NOW - 14.2, "took_ms": 1234.5,
         "provider_ms": 900.1}
    return {**r, **kw}


def seat_stats(running=False, deferred=None, last=None, turns=0):
    return {"running": running, "turns": turns, "deferred": deferred, "last": last, "mcp": {}}


def last_of(outcome, ended_ago, took_ms=800.0, error=None):
    return {"trigger": "t", "outcome": outcome, "at": NOW - ended_ago - took_ms / 1000, "took_ms": took_ms,
            "error": error}


def engine_stats(**seats):
    return {"running": sum(1 for s in seats.values() if s["running"]), "max_concurrent": 32, "peak": 5,
            "turns": 1204, "seats": seats}


def with_stats(stats):
    return sample(child("broker"), child("seats", stats=stats))


@pytest.mark.parametrize("ms, shown", [
    (None, "-"), ("x", "?"), (float("nan"), "?"), (float("inf"), "?"), (True, "?"), (0, "0ms"), (849.6, "850ms"), (1234.5, "1.2s"), (59_940, "59.9s"),
    (192_400, "3m12s"),
])
def test_took_text(ms, shown):
    assert render.took_text(ms) == shown


def test_small_values():
    assert render.ago_text(NOW - 12.5, NOW) == "12s ago" and render.ago_text(None, NOW) == "-"
    assert render.one_line("a  b\n\tc", 10) == "a b c" and render.one_line(None, 5) == ""
    assert render.one_line("abcdefghij", 5) == "abcd…" and len(render.one_line("x" * 99, 60)) == 60
    assert render.names_text(["a", "b"]) == "a, b" and render.names_text([]) == ""
    assert render.names_text([f"s{i}" for i in range(5)], shown=3) == "s0, s1, s2, … +2 more"
    assert render.outcome_text("done").style == "green" and "red" in render.outcome_text("failed").style
    assert render.outcome_text(None).plain == "unknown"
    assert render.finished_at({"started_at": NOW - 10, "took_ms": 4000}) == NOW - 6
    assert render.finished_at({"at": NOW - 10, "took_ms": None}) == NOW - 10
    assert render.finished_at({}) is None


def test_normalize_gives_children_stats():
    stats = engine_stats(alice=seat_stats())
    out = render.normalize(with_stats(stats))
    assert [c["stats"] for c in out["children"]] == [None, stats]  # broker: none; seats: passed through


def test_status_turns_line():
    over = "org budget of 1000 tokens spent (1200)"
    stats = engine_stats(alice=seat_stats(running=True), bob=seat_stats(True, last=last_of("done", 3)),
                         carol=seat_stats(deferred=over), dave=seat_stats(deferred=over), erin=seat_stats())
    out = text(render.status_view(with_stats(stats), NOW))
    line = line_of(out, "turns")
    assert "2/32 running (peak 5) · 1204 finished · running alice, bob" in line
    assert "deferred carol, dave: org budget of 1000 tokens spent (1200)" in line
    assert "erin" not in line
    # after the supervisors, before the fleet; the static view lists no recent turns
    assert out.index("supervisors") < out.index("turns  ") < out.index("fleet ")
    assert "recent turns" not in out


def test_status_turns_line_with_many_running_and_no_seats():
    stats = engine_stats(**{f"s{i:02d}": seat_stats(running=True) for i in range(20)})
    line = line_of(text(render.status_view(with_stats(stats), NOW)), "turns")
    assert "20/32 running" in line and "s11, … +8 more" in line and "s12" not in line
    empty = {"running": 0, "max_concurrent": 32, "peak": 0, "turns": 0, "seats": {}}
    assert line_of(text(render.status_view(with_stats(empty), NOW)), "turns").split("  ", 1)[1] == \
        "0/32 running (peak 0) · 0 finished · no seats held here"


def test_status_without_stats_has_no_turns_line():
    for status in (sample(), with_stats(None)):  # no key at all, or the seats child has not reported
        out = text(render.status_view(status, NOW))
        assert "turns" not in out and "n1" in out
    # stats on another child are not turns
    assert "turns" not in text(render.status_view(sample(child("broker", stats=engine_stats())), NOW))


def test_watch_view_shows_the_recent_turns_newest_first():
    stats = engine_stats(**{"alice": seat_stats(last=last_of("done", 30)),
                            "bob": seat_stats(running=True, last=last_of("failed", 2, 8000, "provider 500")),
                            "carol": seat_stats(), **{f"x{i}": seat_stats(last=last_of("done", 100 + i))
                                                      for i in range(6)}})
    out = text(render.watch_view(with_stats(stats), None, "w", NOW, 1.0, NOW))
    assert "running bob" in line_of(out, "turns")
    recent = out[out.index("recent turns"):].splitlines()
    assert recent[1].split() == ["SEAT", "OUTCOME", "TOOK", "ENDED", "ERROR"]
    assert recent[3].split() == ["bob", "failed", "8.0s", "2s", "ago", "provider", "500"]
    assert recent[4].split() == ["alice", "done", "800ms", "30s", "ago"]
    assert [line.split()[0] for line in recent[5:8]] == ["x0", "x1", "x2"]  # RECENT_TURNS = 5 rows
    assert "x3" not in out and "carol" not in out[out.index("recent turns"):]
    # before any turn finished: the line, no table
    busy = with_stats(engine_stats(alice=seat_stats(running=True)))
    out = text(render.watch_view(busy, None, "w", NOW, 1.0, NOW))
    assert "running alice" in out and "recent turns" not in out


def test_live_view():
    assert "hello" in text(render.live_view(render.Text("hello"), None, "w", NOW, 0.5, NOW))
    assert "every 0.5s" in text(render.live_view(render.Text("hello"), None, "w", NOW, 0.5, NOW))
    out = text(render.live_view(None, "gone", "looked at /x", None, 1.0, NOW))
    assert "node not reachable: gone" in out and "no answer yet; retrying" in out and "looked at /x" in out


def seats_result():
    return {"rev": 3, "seats": [
        {"seat": "alice", "owner": "n1", "token": 7, "pending": 0, "in_flight": 1, "redelivered": 0,
         "ack_floor": 3, "dead_letters": 0, "last_turn": turn_record()},
        {"seat": "bob", "owner": None, "token": None, "pending": 4, "in_flight": 0, "redelivered": 1,
         "ack_floor": 0, "dead_letters": 2, "last_turn": None},
        {"seat": "carol", "owner": "n2", "token": 9, "error": "TimeoutError: consumer info",
         "last_turn": None, "dead_letters": 0},
        {"seat": "dave", "owner": "n2", "token": 9, "error": "TimeoutError: consumer info",
         "last_turn": None, "dead_letters": 0},
        {"seat": "erin", "owner": "n1", "token": 3, "pending": 0, "in_flight": 0, "redelivered": 0,
         "ack_floor": 9, "dead_letters": 0, "last_turn": turn_record("erin", "failed", took_ms=None)},
    ]}


def test_seats_view():
    out = text(render.seats_view(render.normalize_seats(seats_result()), NOW))
    assert line_of(out, "SEAT").split() == ["SEAT", "OWNER", "PENDING", "IN", "FLIGHT", "DEAD", "LAST",
                                            "TURN", "TOOK"]
    assert line_of(out, "alice").split() == ["alice", "n1", "0", "1", "0", "done", "12s", "ago", "1.2s"]
    assert line_of(out, "bob").split() == ["bob", "-", "4", "0", "2", "-", "-"]
    assert line_of(out, "carol").split() == ["carol", "n2", "-", "-", "0", "-", "-"]
    assert line_of(out, "erin").split() == ["erin", "n1", "0", "0", "0", "failed", "14s", "ago", "-"]
    assert "carol, dave: TimeoutError: consumer info" in out
    assert "5 seats, 4 owned, 4 pending, 1 in flight, 2 dead letters · company rev 3" in out
    dead = render.seats_table(seats_result()["seats"], NOW).columns[4].cells
    assert [c.style for c in dead][:2] == ["", "red"]


def test_seats_view_empty_and_normalize():
    assert "no seats in the company (rev 3)" in text(render.seats_view({"rev": 3, "seats": []}, NOW))
    assert "no seats in the company" in text(render.seats_view({}, NOW))
    out = render.normalize_seats(seats_result())
    assert out["rev"] == 3 and all(set(row) == set(render.SEAT_KEYS) for row in out["seats"])
    assert out["seats"][2]["pending"] is None and out["seats"][0]["error"] is None
    assert render.normalize_seats({}) == {"rev": None, "seats": []}
    assert "1 seat, 0 owned, 0 pending, 0 in flight, 0 dead letters" in text(
        render.seats_view({"rev": 1, "seats": [{"seat": "a"}]}, NOW))


def letter(seq, seat="bob", **kw):
    d = {"seq": seq, "seat": seat, "reason": "delivery budget of 25 spent", "deliveries": 26,
         "original_seq": 100 + seq, "at": NOW - 3600, "trigger": f"t{seq}",
         "text": "please  do\nthe [/x] thing"}
    return {**d, **kw}


def test_dead_letters_view():
    letters = [letter(4), letter(9, "carol", text="y" * 200)]
    out = text(render.dead_letters_view({"dead_letters": letters}, NOW))
    assert line_of(out, "SEQ").split() == ["SEQ", "SEAT", "DELIVERIES", "REASON", "AGE", "TEXT"]
    assert line_of(out, "  4").split() == ["4", "bob", "26", "delivery", "budget", "of", "25", "spent",
                                           "1h00m", "please", "do", "the", "[/x]", "thing"]  # not markup
    assert line_of(out, "  9").split()[-1] == "y" * (render.LETTER_TEXT - 1) + "…"
    assert "2 dead letters, oldest first; `crewletctl dlq requeue SEQ` puts one back" in out
    assert "--limit" not in out
    assert "the first 2: --limit shows more" in text(
        render.dead_letters_view({"dead_letters": [letter(4), letter(9)]}, NOW, limit=2))


def test_dead_letters_view_empty_and_normalize():
    assert text(render.dead_letters_view({"dead_letters": []}, NOW)).strip() == "no dead letters"
    assert text(render.dead_letters_view({}, NOW, seat="bob")).strip() == "no dead letters for bob"
    out = render.normalize_dead_letters({"dead_letters": [{"seq": 1, "seat": "a"}]})
    assert out == {"dead_letters": [{**dict.fromkeys(render.DEAD_LETTER_KEYS), "seq": 1, "seat": "a"}]}
    line = line_of(text(render.dead_letters_view(out, NOW)), "  1")
    assert line.split() == ["1", "a", "-", "-", "-"]


def test_turn_text():
    sent = render.sent_text({"seat": "alice", "seq": 12, "trigger": "t-1"})
    assert sent == "sent to alice (trigger t-1, seq 12)"
    assert render.turn_text(turn_record()).splitlines() == [
        "turn done on n1: 2 rounds, 2 tool calls, tokens 120 in / 40 out, took 1.2s (provider 900ms)",
        "  round 1: notes.write", "  round 2: search failed: boom", "",
        "Hello [bold]there[/x]", "second line"]
    failed = render.turn_text(turn_record(outcome="failed", error="provider 500", deliveries=3, tool_calls=[],
                                          reply="", rounds=1)).splitlines()
    assert failed[0] == ("turn failed on n1: 1 round, 0 tool calls, tokens 120 in / 40 out, took 1.2s "
                         "(provider 900ms), delivery 3")
    assert failed[1] == "error: provider 500" and "dead letters (crewletctl dlq)" in failed[2]
    assert len(failed) == 3
    assert render.turn_text({}).splitlines() == [
        "turn unknown on -: 0 rounds, 0 tool calls, tokens 0 in / 0 out, took - (provider -)"]
    assert render.no_turn_text(30.0) == "no turn finished within 30s (the mail is in the mailbox)"
    flags = [{"name": "calc", "error": True, "round": 1}, {"name": "send", "error": False, "round": 2}]
    assert render.turn_text(turn_record(tool_calls=flags)).splitlines()[1:3] == [
        "  round 1: calc failed", "  round 2: send"]  # the records' bool errors


# ------------------------------------------------------------------ send, seats, dlq against a fake crewletd

def test_send(node, tmp_path):
    node.replies["send"] = {"seat": "alice", "seq": 12, "trigger": "t-1", "turn": None}
    result = run(tmp_path, "send", "alice", "hello there")
    assert result.exit_code == 0 and result.stdout == "sent to alice (trigger t-1, seq 12)\n"
    assert node.calls[-1][1:] == ("send", ctl.CALL_TIMEOUT, {"seat": "alice", "text": "hello there"})
    result = CliRunner().invoke(ctl.cli, ["--data-dir", str(tmp_path), "send", "alice", "-"],
                                input="from\nstdin\n")
    assert result.exit_code == 0 and node.calls[-1][3] == {"seat": "alice", "text": "from\nstdin\n"}
    result = run(tmp_path, "send", "alice", "hi", "--json", "--trigger", "abc")
    assert json.loads(result.stdout) == node.replies["send"]
    assert node.calls[-1][3] == {"seat": "alice", "text": "hi", "trigger": "abc"}


def test_send_wait_prints_the_turn(node, tmp_path):
    node.replies["send"] = {"seat": "alice", "seq": 12, "trigger": "t-1", "turn": turn_record()}
    result = run(tmp_path, "send", "alice", "hi", "--wait", "30")
    assert result.exit_code == 0
    assert node.calls[-1][1:] == ("send", 30 + ctl.CALL_TIMEOUT,
                                  {"seat": "alice", "text": "hi", "wait": 30.0})
    lines = result.stdout.splitlines()
    assert lines[:2] == ["sent to alice (trigger t-1, seq 12)", "turn done on n1: 2 rounds, 2 tool calls, "
                         "tokens 120 in / 40 out, took 1.2s (provider 900ms)"]
    assert lines[-2:] == ["Hello [bold]there[/x]", "second line"]
    # no turn in time: the mail was accepted, so still 0
    node.replies["send"] = {**node.replies["send"], "turn": None}
    result = run(tmp_path, "send", "alice", "hi", "--wait", "2.5")
    assert result.exit_code == 0 and result.stdout.splitlines()[1] == \
        "no turn finished within 2.5s (the mail is in the mailbox)"
    assert node.calls[-1][2] == 2.5 + ctl.CALL_TIMEOUT
    # A duplicate already worked: said at once, no wait for a turn.
    node.replies["send"] = {**node.replies["send"], "duplicate": True, "worked": True}
    result = run(tmp_path, "send", "alice", "hi", "--wait", "30")
    assert result.exit_code == 0 and result.stdout.splitlines() == [
        "already in alice's mailbox (trigger t-1, seq 12): not sent again",
        "its trigger was worked already: no new turn (crewletctl seats shows the last turns)"]
    # A duplicate not worked in time says what any mail would.
    node.replies["send"] = {**node.replies["send"], "worked": False}
    assert run(tmp_path, "send", "alice", "hi", "--wait", "2").stdout.splitlines()[1] == \
        "no turn finished within 2s (the mail is in the mailbox)"


def test_send_refused(node, tmp_path):
    node.replies["send"] = "no seat named 'zed' in the company; seats: alice, bob"
    result = run(tmp_path, "send", "zed", "hi")
    assert result.exit_code == 1 and "crewletctl: no seat named 'zed'" in result.stderr
    node.replies["send"] = None
    assert run(tmp_path, "send", "alice", "hi", "--wait", "5").exit_code == 69


def test_seats(node, tmp_path):
    from crewlet.ctl.seats import SEATS_TIMEOUT
    node.replies["seats"] = seats_result()
    result = run(tmp_path, "seats")
    assert result.exit_code == 0 and node.calls[-1][1:] == ("seats", SEATS_TIMEOUT, {})
    assert line_of(result.stdout, "bob").split() == ["bob", "-", "4", "0", "2", "-", "-"]
    assert "5 seats, 4 owned, 4 pending, 1 in flight, 2 dead letters · company rev 3" in result.stdout
    out = json.loads(run(tmp_path, "seats", "--json").stdout)
    assert out["rev"] == 3 and [r["seat"] for r in out["seats"]] == ["alice", "bob", "carol", "dave", "erin"]
    assert all(set(r) == set(render.SEAT_KEYS) for r in out["seats"])
    assert out["seats"][0]["last_turn"] == turn_record()
    node.replies["seats"] = "no company is applied yet (crewletctl apply FILE)"
    result = run(tmp_path, "seats")
    assert result.exit_code == 1 and "no company is applied yet" in result.stderr


@pytest.mark.parametrize("rounds, shown", [
    (1, "5 seats, 4 owned"),  # the table
    (2, "crewletd refused: no company is applied yet"),  # refused: said, not "unreachable"
    (3, "node not reachable: nothing answered"),  # gone: the retry frame
])
def test_seats_watch(node, tmp_path, monkeypatch, rounds, shown):
    node.replies["seats"] = seats_result()
    later = ["no company is applied yet (crewletctl apply FILE)", None]
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == rounds:
            raise KeyboardInterrupt
        node.replies["seats"] = later[len(sleeps) - 1]

    monkeypatch.setattr("crewlet.ctl.seats.time.sleep", sleep)
    result = run(tmp_path, "seats", "--watch", "-n", "0.5")
    assert result.exit_code == 0 and shown in result.stdout  # the last frame
    assert [c[1] for c in node.calls] == ["seats"] * rounds and all(s <= 0.5 for s in sleeps)


def test_dlq_list(node, tmp_path):
    from crewlet.ctl.dlq import LIMIT, PER_LETTER
    node.replies["dlq"] = {"dead_letters": [letter(4), letter(9)]}
    result = run(tmp_path, "dlq")
    assert result.exit_code == 0 and line_of(result.stdout, "  4").split()[:3] == ["4", "bob", "26"]
    assert node.calls[-1][1:] == ("dlq", ctl.CALL_TIMEOUT + LIMIT * PER_LETTER, {"limit": LIMIT})
    for command in (["dlq", "bob", "--limit", "2"], ["dlq", "list", "bob", "--limit", "2"],
                    ["dlq", "--limit", "2", "bob"]):
        result = run(tmp_path, *command)
        assert result.exit_code == 0, command
        assert node.calls[-1][1:] == ("dlq", ctl.CALL_TIMEOUT + 2 * PER_LETTER, {"seat": "bob", "limit": 2})
        assert "the first 2: --limit shows more" in result.stdout
    out = json.loads(run(tmp_path, "dlq", "--json").stdout)
    assert [d["seq"] for d in out["dead_letters"]] == [4, 9]
    assert all(set(d) == set(render.DEAD_LETTER_KEYS) for d in out["dead_letters"])
    node.replies["dlq"] = {"dead_letters": []}
    assert run(tmp_path, "dlq", "bob").stdout.strip() == "no dead letters for bob"


def test_dlq_requeue(node, tmp_path):
    node.replies["dlq"] = {"requeued": 4, "seq": 107}
    result = run(tmp_path, "dlq", "requeue", "4")
    assert result.exit_code == 0 and result.stdout == "requeued dead letter 4 (mailbox seq 107)\n"
    assert node.calls[-1][1:] == ("dlq", ctl.CALL_TIMEOUT, {"requeue": 4})
    node.replies["dlq"] = "no dead letter 5"
    result = run(tmp_path, "dlq", "requeue", "5")
    assert result.exit_code == 1 and "crewletctl: no dead letter 5" in result.stderr


def test_status_with_turns(node, tmp_path, monkeypatch):
    stats = engine_stats(alice=seat_stats(running=True), bob=seat_stats(last=last_of("done", 3)))
    node.replies["status"] = with_stats(stats)
    result = run(tmp_path, "status")
    assert result.exit_code == 0 and "2/32" not in result.stdout
    assert "1/32 running (peak 5) · 1204 finished · running alice" in result.stdout
    assert "recent turns" not in result.stdout
    out = json.loads(run(tmp_path, "status", "--json").stdout)
    assert out["children"][1]["stats"] == stats and out["children"][0]["stats"] is None

    def sleep(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr("crewlet.ctl.status.time.sleep", sleep)
    result = run(tmp_path, "status", "--watch")
    assert result.exit_code == 0 and "recent turns" in result.stdout and "running alice" in result.stdout


# ------------------------------------------------------------------ the estate: tasks, pages, search, evict

def task_row(tid="T12", **kw):
    t = {"id": tid, "title": "Ship the [bold]thing[/x]", "body": "Do it\nwell.", "status": "open",
         "assignee": "cto", "labels": ["release", "q3"], "parent": None, "rev": 3, "seq": 12,
         "created_at": NOW - 7200, "created_by": "ceo", "updated_at": NOW - 60, "updated_by": "cto"}
    return {**t, **kw}


def comment_row(cid="C14", **kw):
    c = {"id": cid, "task": "T12", "body": "on it [/x]", "seq": 14, "created_at": NOW - 90, "created_by": "cto"}
    return {**c, **kw}


def page_row(path="eng/runbook", **kw):
    p = {"path": path, "title": "Deploy runbook", "body": "# Steps\n1. [red]build[/red]", "version": 4,
         "seq": 20, "created_at": NOW - 86400, "created_by": "cto", "updated_at": NOW - 300,
         "updated_by": "operator@n1"}
    return {**p, **kw}


def hit(path="eng/runbook", **kw):
    return {"path": path, "title": "Deploy runbook", "snippet": "run the\n[deploy] script", "score": -3.2, **kw}


def test_tasks_view():
    tasks = [task_row(), task_row("T9", status="done", assignee=None, labels=[], rev=1)]
    out = text(render.tasks_view({"tasks": tasks}, NOW))
    assert line_of(out, "ID").split() == ["ID", "STATUS", "TITLE", "ASSIGNEE", "LABELS", "REV", "UPDATED"]
    assert line_of(out, "T12").split() == ["T12", "open", "Ship", "the", "[bold]thing[/x]", "cto", "release,",
                                           "q3", "3", "1m00s", "ago"]  # not markup
    assert line_of(out, "T9").split()[1] == "done" and line_of(out, "T9").split()[-5:-2] == ["-", "-", "1"]
    assert "2 tasks, newest first; `crewletctl tasks ID` shows one" in out
    statuses = render.tasks_table(tasks, NOW).columns[1].cells
    assert [c.style for c in statuses] == ["cyan", "green"]
    assert "(the first 2: --limit shows more)" in text(render.tasks_view({"tasks": tasks}, NOW, limit=2))
    assert "1 task (status open, assignee cto), newest first" in text(
        render.tasks_view({"tasks": tasks[:1]}, NOW, status="open", assignee="cto"))


def test_tasks_view_empty_and_normalize():
    assert text(render.tasks_view({"tasks": []}, NOW)).strip() == "no tasks"
    assert text(render.tasks_view({}, NOW, status="blocked")).strip() == "no tasks (status blocked)"
    out = render.normalize_tasks({"tasks": [{"id": "T1", "title": "a"}]})
    assert out == {"tasks": [{**dict.fromkeys(render.TASK_KEYS), "id": "T1", "title": "a"}]}
    assert line_of(text(render.tasks_view(out, NOW)), "T1").split() == ["T1", "unknown", "a", "-", "-", "-", "-"]
    assert render.normalize_tasks({}) == {"tasks": []}


def test_task_view():
    out = text(render.task_view({"task": task_row(parent="T3"), "comments": [comment_row(),
                                                                             comment_row("C15", body="done")]}, NOW))
    assert line_of(out, "task").split() == ["task", "T12", "Ship", "the", "[bold]thing[/x]"]
    assert line_of(out, "status").split() == ["status", "open"]
    assert line_of(out, "assignee").split() == ["assignee", "cto"]
    assert line_of(out, "labels").split() == ["labels", "release,", "q3"]
    assert line_of(out, "parent").split() == ["parent", "T3"]
    assert line_of(out, "created").split() == ["created", "ceo,", "2h00m", "ago"]
    assert line_of(out, "updated").split() == ["updated", "cto,", "1m00s", "ago"]
    lines = out.splitlines()
    assert lines[lines.index("Do it") + 1] == "well."
    assert "comments (2)" in out and "C14  cto, 1m30s ago" in out and "  on it [/x]" in out
    assert out.index("Do it") < out.index("comments (2)") < out.index("C14") < out.index("C15")
    bare = text(render.task_view(render.normalize_task({"task": {"id": "T1", "title": "a"}}), NOW))
    assert "(no description)" in bare and "no comments" in bare and "labels" not in bare
    assert line_of(bare, "assignee").split() == ["assignee", "-"]


def test_normalize_task():
    out = render.normalize_task({"task": {"id": "T1"}, "comments": [{"id": "C2"}]})
    assert set(out["task"]) == set(render.TASK_KEYS) and set(out["comments"][0]) == set(render.COMMENT_KEYS)
    assert render.normalize_task({"task": None, "comments": []}) == {"task": None, "comments": []}
    assert render.normalize_task({}) == {"task": None, "comments": []}


def test_pages_view():
    pages = [{k: v for k, v in page_row().items() if k != "body"}, page_row("eng/x", title="X", version=1)]
    out = text(render.pages_view({"pages": pages}, NOW))
    assert line_of(out, "PATH").split() == ["PATH", "TITLE", "VERSION", "UPDATED", "BY", "UPDATED"]
    assert line_of(out, "eng/runbook").split() == ["eng/runbook", "Deploy", "runbook", "4", "operator@n1", "5m00s",
                                                   "ago"]
    assert "2 pages; `crewletctl pages PATH` shows one" in out
    assert "2 pages under 'eng/' (the first 2: --limit shows more)" in text(
        render.pages_view({"pages": pages}, NOW, prefix="eng/", limit=2))
    assert text(render.pages_view({"pages": []}, NOW)).strip() == "no pages"
    assert text(render.pages_view({}, NOW, prefix="ops/")).strip() == "no pages under 'ops/'"
    out = render.normalize_pages({"pages": [{"path": "a"}]})
    assert out == {"pages": [{**dict.fromkeys(render.PAGE_KEYS), "path": "a"}]}


def test_page_view():
    out = text(render.page_view({"page": page_row()}, NOW))
    assert line_of(out, "page").split() == ["page", "Deploy", "runbook"]
    assert line_of(out, "path").split() == ["path", "eng/runbook"]
    assert line_of(out, "version").split() == ["version", "4"]
    assert line_of(out, "created").split() == ["created", "cto,", "1d00h", "ago"]
    assert line_of(out, "updated").split() == ["updated", "operator@n1,", "5m00s", "ago"]
    assert out.splitlines()[-2:] == ["# Steps", "1. [red]build[/red]"]  # the body as written, not markup
    assert "(empty)" in text(render.page_view({"page": page_row(body="")}, NOW))
    out = render.normalize_page({"page": {"path": "a"}})
    assert set(out["page"]) == {*render.PAGE_KEYS, "body"} and render.normalize_page({}) == {"page": None}


def test_search_view():
    result = render.normalize_search({"hits": [hit(), hit("eng/x", title="X", snippet="y" * 300)],
                                      "searched": True, "node": "n2", "answers": {}})
    out = text(render.search_view(result, "deploy"))
    assert line_of(out, "PATH").split() == ["PATH", "TITLE", "SNIPPET"]
    assert line_of(out, "eng/runbook").split() == ["eng/runbook", "Deploy", "runbook", "run", "the", "[deploy]",
                                                   "script"]
    assert line_of(out, "eng/x").split()[-1] == "y" * (render.SNIPPET_WIDTH - 1) + "…"
    assert "2 hits, best first · searched on n2" in out
    assert "(the first 2: --limit shows more)" in text(render.search_view(result, "deploy", limit=2))
    assert text(render.search_view({"hits": [], "searched": True}, "nothing")).strip() == "no pages matched 'nothing'"


def test_normalize_search_and_answers_text():
    assert render.normalize_search({}) == {"hits": [], "searched": False, "node": None, "answers": {}}
    out = render.normalize_search({"hits": [{"path": "a"}], "searched": True})
    assert out["hits"] == [{**dict.fromkeys(render.HIT_KEYS), "path": "a"}]
    answers = {"n1": "behind: applied 3, the floor is 9", "n2": "out of service: applier stopped"}
    assert render.answers_text(answers) == \
        "node n1: behind: applied 3, the floor is 9; node n2: out of service: applier stopped"
    assert render.answers_text({}) == "the fleet's presence names no data node"
    from crewlet.estate.router import describe
    assert render.answers_text(answers) == describe(answers) and render.answers_text({}) == describe({})


def test_evict_text():
    assert render.evict_text({"node": "n2", "evicted": True, "reason": "disk failed"}) == "evicted n2: disk failed"
    assert render.evict_text({"node": "n2", "evicted": False}) == "n2 is no longer evicted"


def test_every_task_status_has_a_style():
    from crewlet.estate.ops import TASK_STATUSES
    assert set(render.TASK_STATUS_STYLE) == set(TASK_STATUSES)


def estate_call(query, args):
    from crewlet.ctl.tasks import ESTATE_TIMEOUT
    return ("estate_read", ESTATE_TIMEOUT + ctl.CALL_TIMEOUT, {"query": query, "args": args,
                                                               "wait": ESTATE_TIMEOUT})


def test_tasks(node, tmp_path, monkeypatch):
    from crewlet.ctl.tasks import LIMIT
    monkeypatch.setenv("COLUMNS", "200")  # the summary on one line, whatever runs the test
    node.replies["estate_read"] = {"tasks": [task_row(), task_row("T9", status="blocked")]}
    result = run(tmp_path, "tasks")
    assert result.exit_code == 0 and node.calls[-1][1:] == estate_call("task.list", {"limit": LIMIT})
    assert line_of(result.stdout, "T12").split()[:2] == ["T12", "open"]
    assert "2 tasks, newest first" in result.stdout
    result = run(tmp_path, "tasks", "--status", "blocked", "--assignee", "cto", "--limit", "2")
    assert result.exit_code == 0 and "the first 2: --limit shows more" in result.stdout
    assert node.calls[-1][1:] == estate_call("task.list", {"limit": 2, "status": "blocked", "assignee": "cto"})
    out = json.loads(run(tmp_path, "tasks", "--json").stdout)
    assert [t["id"] for t in out["tasks"]] == ["T12", "T9"]
    assert all(set(render.TASK_KEYS) <= set(t) for t in out["tasks"])
    node.replies["estate_read"] = {"tasks": []}
    assert run(tmp_path, "tasks", "--assignee", "bob").stdout.strip() == "no tasks (assignee bob)"


def test_tasks_one(node, tmp_path):
    node.replies["estate_read"] = {"task": task_row(), "comments": [comment_row()]}
    for given in ("T12", "t12", "12"):
        result = run(tmp_path, "tasks", given)
        assert result.exit_code == 0 and node.calls[-1][1:] == estate_call("task.get", {"id": "T12"})
        assert "comments (1)" in result.stdout and "on it [/x]" in result.stdout
    out = json.loads(run(tmp_path, "tasks", "T12", "--json").stdout)
    assert out["task"]["id"] == "T12" and set(out["task"]) >= set(render.TASK_KEYS)
    assert [c["id"] for c in out["comments"]] == ["C14"]
    node.replies["estate_read"] = {"task": None, "comments": []}
    result = run(tmp_path, "tasks", "T99")
    assert result.exit_code == 1 and result.stderr == "crewletctl: no task T99\n"


def test_estate_refused(node, tmp_path):
    node.replies["estate_read"] = ("no data node answered: n1: out of service (applier stopped); "
                                   "n2: behind (applied 3, floor 9)")
    for command in (["tasks"], ["tasks", "T1"], ["pages"], ["pages", "a"]):
        result = run(tmp_path, *command)
        assert result.exit_code == 1, command
        assert "crewletctl: no data node answered: n1: out of service (applier stopped); n2:" in result.stderr
    node.replies["estate_read"] = "this node has not joined the fleet yet"
    assert "has not joined the fleet yet" in run(tmp_path, "tasks").stderr
    node.replies["estate_read"] = None
    assert run(tmp_path, "pages").exit_code == 69


def test_pages(node, tmp_path):
    from crewlet.ctl.pages import LIMIT
    node.replies["estate_read"] = {"pages": [page_row(), page_row("eng/x")]}
    result = run(tmp_path, "pages")
    assert result.exit_code == 0 and node.calls[-1][1:] == estate_call("page.list", {"limit": LIMIT})
    assert line_of(result.stdout, "eng/x").split()[0] == "eng/x" and "2 pages" in result.stdout
    result = run(tmp_path, "pages", "--prefix", "eng/", "--limit", "5")
    assert result.exit_code == 0 and "2 pages under 'eng/'" in result.stdout
    assert node.calls[-1][1:] == estate_call("page.list", {"prefix": "eng/", "limit": 5})
    out = json.loads(run(tmp_path, "pages", "--json").stdout)
    assert [p["path"] for p in out["pages"]] == ["eng/runbook", "eng/x"]
    node.replies["estate_read"] = {"page": page_row()}
    result = run(tmp_path, "pages", "eng/runbook")
    assert result.exit_code == 0 and node.calls[-1][1:] == estate_call("page.read", {"path": "eng/runbook"})
    assert line_of(result.stdout, "version").split() == ["version", "4"] and "[red]build[/red]" in result.stdout
    out = json.loads(run(tmp_path, "pages", "eng/runbook", "--json").stdout)
    assert out["page"]["body"] == page_row()["body"] and set(render.PAGE_KEYS) <= set(out["page"])
    node.replies["estate_read"] = {"page": None}
    result = run(tmp_path, "pages", "eng/gone")
    assert result.exit_code == 1 and result.stderr == "crewletctl: no page at eng/gone\n"


def test_search(node, tmp_path):
    from crewlet.ctl.search import LIMIT
    from crewlet.ctl.tasks import ESTATE_TIMEOUT
    node.replies["estate_search"] = {"hits": [hit()], "searched": True, "node": "n1", "answers": {}}
    result = run(tmp_path, "search", "deploy script")
    assert result.exit_code == 0 and "1 hit, best first · searched on n1" in result.stdout
    assert node.calls[-1][1:] == ("estate_search", ESTATE_TIMEOUT + ctl.CALL_TIMEOUT,
                                  {"query": "deploy script", "limit": LIMIT, "wait": ESTATE_TIMEOUT})
    out = json.loads(run(tmp_path, "search", "deploy", "--json", "--limit", "3").stdout)
    assert out["searched"] is True and out["hits"] == [hit()] and node.calls[-1][3]["limit"] == 3
    # nothing matched: said so, and 0
    node.replies["estate_search"] = {"hits": [], "searched": True, "node": "n1", "answers": {}}
    result = run(tmp_path, "search", "zebra")
    assert result.exit_code == 0 and result.stdout.strip() == "no pages matched 'zebra'"


def test_search_nobody_could(node, tmp_path):
    node.replies["estate_search"] = {"hits": [], "searched": False, "node": None,
                                     "answers": {"n1": "out of service: applier stopped",
                                                 "n2": "behind: applied 3, the floor is 9"}}
    result = run(tmp_path, "search", "zebra")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == ("crewletctl: could not be searched: node n1: out of service: applier stopped; "
                             "node n2: behind: applied 3, the floor is 9\n")
    assert "no pages matched" not in result.output
    result = run(tmp_path, "search", "zebra", "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["searched"] is False
    node.replies["estate_search"] = {"searched": False, "answers": {}}
    assert run(tmp_path, "search", "x").stderr == \
        "crewletctl: could not be searched: the fleet's presence names no data node\n"


def test_evict(node, tmp_path):
    from crewlet.ctl.evict import REASON
    node.replies["evict"] = {"node": "n2", "evicted": True, "reason": "disk failed"}
    result = run(tmp_path, "evict", "n2", "--reason", "disk failed")
    assert result.exit_code == 0 and result.stdout == "evicted n2: disk failed\n"
    assert node.calls[-1][1:] == ("evict", ctl.CALL_TIMEOUT, {"node": "n2", "reason": "disk failed"})
    run(tmp_path, "evict", "n2")
    assert node.calls[-1][3] == {"node": "n2", "reason": REASON}
    node.replies["evict"] = {"node": "n2", "evicted": False}
    result = run(tmp_path, "evict", "n2", "--undo")
    assert result.exit_code == 0 and result.stdout == "n2 is no longer evicted\n"
    assert node.calls[-1][3] == {"node": "n2", "undo": True}
    node.replies["evict"] = "bad node id 'n.2': must match ..."
    result = run(tmp_path, "evict", "n.2")
    assert result.exit_code == 1 and "crewletctl: bad node id 'n.2'" in result.stderr


def test_streams_line_shows_each_streams_consumers_against_its_limit():
    fleet = {**three_nodes(), "streams": [
        {"name": "AGENTS", "consumers": 31, "max_consumers": 1000, "messages": 5},
        {"name": "KV_leases", "consumers": 210, "max_consumers": 256, "messages": 40},
        {"name": "KV_status", "consumers": 256, "max_consumers": 256, "messages": 3},
        {"name": "OTHER", "consumers": 2, "max_consumers": -1, "messages": 0}]}
    line = line_of(text(render.status_view(with_fleet(fleet), NOW)), "streams")
    assert line == ("streams  consumers AGENTS 31/1000 · KV_leases 210/256 · KV_status 256/256 · "
                    "OTHER 2/no limit")
    styles = {span.style for span in render.streams_line(fleet["streams"]).spans}
    assert "bold red" in styles and "yellow" in styles  # at its limit; near it or with none
    assert "not read yet" in line_of(text(render.status_view(with_fleet(three_nodes()), NOW)), "streams")
    assert render.normalize_fleet(fleet)["streams"][3]["max_consumers"] == -1


def test_status_turns_line_says_unsettled_turns_and_lost_records():
    stats = {**engine_stats(alice=seat_stats()), "unsettled": 2, "records_failed": 1}
    line = line_of(text(render.status_view(with_stats(stats), NOW)), "turns")
    assert "2 unsettled (ledger not written)" in line and "1 records lost" in line
    quiet = line_of(text(render.status_view(with_stats(engine_stats(alice=seat_stats())), NOW)), "turns")
    assert "unsettled" not in quiet and "lost" not in quiet


# Issue 16: an op applied with `at: NaN` made every `crewletctl tasks` crash from then on.
WRONG_NUMBERS = [float("nan"), float("inf"), float("-inf"), "yesterday", True, [1], 10**400]
WRONG_IDS = ["nan", "inf", "-inf", "str", "bool", "list", "huge_int"]


@pytest.mark.parametrize("bad", WRONG_NUMBERS, ids=WRONG_IDS)
def test_tasks_render_a_number_that_is_not_one_as_a_question_mark(node, tmp_path, bad):
    node.replies["estate_read"] = {"tasks": [task_row(updated_at=bad, created_at=bad, labels=bad, title=bad),
                                             task_row("T9")]}
    result = run(tmp_path, "tasks")
    assert result.exit_code == 0 and result.exception is None, result.output
    assert line_of(result.stdout, "T12").split()[-1] == "?"
    assert line_of(result.stdout, "T9").endswith(" ago")  # the sane row beside it, as ever
    node.replies["estate_read"] = {"task": task_row(updated_at=bad, created_at=bad, labels=bad),
                                   "comments": [comment_row(created_at=bad)]}
    result = run(tmp_path, "tasks", "T12")
    assert result.exit_code == 0 and result.exception is None, result.output
    assert "ceo, ?" in result.stdout and "cto, ?" in result.stdout


@pytest.mark.parametrize("bad", WRONG_NUMBERS, ids=WRONG_IDS)
def test_every_number_renderer_shows_a_question_mark(bad):
    for show in (render.human_duration, render.human_bytes, render.percent, render.took_text, render.rate_text):
        assert show(bad) == "?", show
        assert show(None) == "-", show
    assert render.ago_text(bad, NOW) == "?"
    assert render.finished_at({"at": bad}) is None
    letter = {"seq": 77, "seat": "a", "deliveries": 2, "reason": "r", "at": bad, "text": "t"}
    rows = [line.split() for line in text(render.dead_letters_view({"dead_letters": [letter]}, NOW)).splitlines()]
    assert next(row for row in rows if row[:2] == ["77", "a"])[4] == "?"
    turn = {"outcome": "done", "took_ms": bad, "provider_ms": bad, "deliveries": bad, "rounds": 1}
    assert "took ?" in render.turn_text(turn)


def test_streams_line_says_which_replicas_are_catching_up_on_a_cluster():
    def stream(name, leader="n1", behind=()):
        return {"name": name, "consumers": 1, "max_consumers": 64, "messages": 0,
                "leader": leader, "behind": list(behind)}
    current = {**three_nodes(), "streams": [stream("ESTATE"), stream("KV_leases")]}
    view = text(render.status_view(with_fleet(current), NOW))
    assert "replicas current" in view
    lagging = {**three_nodes(), "streams": [stream("ESTATE", behind=["n2"]), stream("KV_leases", behind=["n2"]),
                                           stream("KV_status", leader=None, behind=["n2", "n3"])]}
    view = text(render.status_view(with_fleet(lagging), NOW))
    assert "no leader: KV_status" in view and "n2 catching up on 3 of 3" in view
    assert "n3 catching up on 1 of 3" in view
    # A single server's streams have no replicas to speak of.
    alone = {**three_nodes(), "streams": [{"name": "ESTATE", "consumers": 1, "max_consumers": 64, "messages": 0}]}
    assert "replicas" not in text(render.status_view(with_fleet(alone), NOW))


def test_a_drained_node_says_so_in_the_table_and_drain_says_what_it_still_holds():
    order = {"since": NOW - 5, "until": NOW + 55, "by": "crewletctl@n1"}
    fleet_view = three_nodes()
    fleet_view["nodes"][2].update(draining=order, seats=["s2-0"], duties=[], conversations=1)
    out = text(render.status_view(with_fleet(fleet_view), NOW))
    assert line_of(out, "n2").split()[:2] == ["n2", "draining"]
    assert "draining" not in line_of(out, "n0")
    n2 = fleet_view["nodes"][2]
    assert render.drain_progress(n2, "n2") == "n2 holds 1 seat, 0 duties, 1 run"
    n2.update(seats=[], conversations=0)
    assert render.drain_progress(n2, "n2") == "n2 is drained: it holds nothing"
    assert line_of(text(render.status_view(with_fleet(fleet_view), NOW)), "n2").split()[:2] == ["n2", "drained"]
    assert render.drain_progress(None, "n2") == "n2 is not up (it comes back drained)"
    assert render.drain_text({"node": "n2", "draining": order}).startswith("draining n2 (by crewletctl@n1)")
    assert render.drain_text({"node": "n2", "draining": None}) == "n2 is undrained: it takes work again"
