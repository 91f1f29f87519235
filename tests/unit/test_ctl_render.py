"""crewletctl without a node: rendering of status dicts and the exit codes."""

import io
import json

import pytest
from click.testing import CliRunner
from rich.console import Console

import crewlet.ctl as ctl
from crewlet import ipc
from crewlet.ctl import render
from crewlet.ctl.status import exit_code

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


def text(renderable) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
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

def fleet_node(nid, rev=2, seats=(), duties=(), **kw):
    n = {"id": nid, "roles": ["data", "seats", "workers"], "broker": "member", "labels": {"zone": "eu"},
         "version": "0.1.0", "protocol": 1, "boot": "0b65adc15b87", "max_concurrent": 32,
         "started_at": NOW - 60, "rev": rev, "host": "vm", "data_dir": f"/tmp/{nid}", "pid": 19977,
         "renewed_at": NOW - 2.4, "applied": {"rev": rev, "epoch": rev, "at": NOW - 30},
         "status_error": None, "seats": list(seats), "duties": list(duties)}
    return {**n, **kw}


def fleet(*nodes, company=None, error=None, connected=True):
    company = {"rev": 2, "epoch": 2, "digest": "0fbb3459f9f04620"} if company is None else company
    return {"company": company or None, "error": error, "connected": connected, "nodes": list(nodes),
            "seats": [{"name": s, "node": n["id"], "token": 10 + i}
                      for n in nodes for i, s in enumerate(n["seats"])],
            "duties": [{"name": d, "node": n["id"], "token": 2} for n in nodes for d in n["duties"]]}


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
    for header in ("NODE", "ROLES", "BROKER", "LABELS", "REV", "SEATS", "DUTIES", "RENEWED"):
        assert header in out, header
    assert line_of(out, "n0").split() == ["n0", "data,", "seats,", "workers", "member", "zone=eu", "2", "10",
                                          "fleet_shape", "2s", "ago"]
    assert line_of(out, "n1").split()[:2] == ["n1", "(here)"]  # the sample's node id
    assert "(here)" not in line_of(out, "n0") + line_of(out, "n2")
    assert line_of(out, "n2").split()[-4:] == ["10", "-", "2s", "ago"]
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
    grid, _, table, *_ = render.fleet_view(render.normalize(status)["fleet"], "n1", NOW).renderables
    assert any("red" in str(cell.style) for cell in grid.columns[1].cells if "refused" in cell.plain)
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
