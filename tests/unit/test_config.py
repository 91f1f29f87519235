"""Tier A node config: defaults, expansion, validation and error messages."""

import os
import textwrap
from pathlib import Path

import pytest
import yaml

from crewlet.config import DEFAULT_CONFIG_PATHS, ConfigError, NodeConfig, expand_env, load_node_config
from tests.conftest import make_fleet_secret

REPO = Path(__file__).resolve().parents[2]
NODE0_WARNING = "node.id is unset; using node-0 — set CREWLET_NODE_ID or node.id to a distinct, stable id per node"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, short_tmp):
    for var in ("CREWLET_CONFIG", "CREWLET_NODE_ID", "CREWLET_DATA_DIR", "XDG_DATA_HOME", "N"):
        monkeypatch.delenv(var, raising=False)
    # Short: the default data dir is under HOME, and its socket paths must fit
    # 107 bytes (tmp_path is longer under pytest-xdist).
    monkeypatch.setenv("HOME", os.path.join(short_tmp, "home"))


def write(tmp_path: Path, text: str, name: str = "crewlet.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def error(path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    err = info.value
    # Every error is one line that starts with the file.
    assert "\n" not in str(err) and str(err).startswith(f"{err.file}: ")
    return err


def no_system_config():
    if any(os.path.exists(p) for p in DEFAULT_CONFIG_PATHS):
        pytest.skip("a system-wide crewlet config exists on this machine")


# -- defaults -----------------------------------------------------------------


def test_defaults_without_a_file(short_tmp):
    no_system_config()
    cfg = load_node_config(None)
    assert cfg.source == "<defaults>"
    assert cfg.node.id == "node-0"
    assert cfg.warnings == [NODE0_WARNING]
    assert cfg.node.roles == ["data", "ingress", "seats", "workers"]
    # The seats pool: one seats process a CPU this process may run on.
    cpus = len(os.sched_getaffinity(0))
    assert cfg.node.seats_processes is None and cfg.seats_pool == cpus
    assert cfg.children() == ["data_applier", "ingress", "seats",
                              *(f"seats.{k}" for k in range(1, cpus)), "workers"]
    assert cfg.data_dir == os.path.join(short_tmp, "home/.local/share/crewlet")
    assert cfg.run_dir == os.path.join(cfg.data_dir, "run")
    assert cfg.stream.type == "embedded" and cfg.stream.listen == "127.0.0.1:4222"
    assert cfg.supervisor.period == 30 and cfg.supervisor.backoff_min == 0.1
    assert cfg == NodeConfig().model_copy(update={"warnings": [NODE0_WARNING]})


def test_defaults_honour_env(monkeypatch, short_tmp):
    no_system_config()
    monkeypatch.setenv("CREWLET_NODE_ID", "alpha-1")
    monkeypatch.setenv("XDG_DATA_HOME", os.path.join(short_tmp, "xdg"))
    cfg = load_node_config(None)
    assert cfg.node.id == "alpha-1" and cfg.warnings == []
    assert cfg.data_dir == os.path.join(short_tmp, "xdg/crewlet")
    monkeypatch.setenv("CREWLET_DATA_DIR", "~/d")
    assert load_node_config(None).data_dir == os.path.join(short_tmp, "home/d")


def test_crewlet_config_env_names_the_file(monkeypatch, tmp_path):
    path = write(tmp_path, "node: {id: from-env-file}\n")
    monkeypatch.setenv("CREWLET_CONFIG", path)
    cfg = load_node_config(None)
    assert cfg.source == path and cfg.node.id == "from-env-file"
    monkeypatch.setenv("CREWLET_CONFIG", str(tmp_path / "nope.yaml"))
    assert "CREWLET_CONFIG" in error(None).problem


def test_absent_node_id_in_a_file(monkeypatch, tmp_path):
    path = write(tmp_path, "log: {level: debug}\n")
    cfg = load_node_config(path)
    assert cfg.node.id == "node-0" and cfg.warnings == [NODE0_WARNING]
    monkeypatch.setenv("CREWLET_NODE_ID", "n7")
    cfg = load_node_config(path)
    assert cfg.node.id == "n7" and cfg.warnings == []


def test_empty_file_is_all_defaults(tmp_path):
    cfg = load_node_config(write(tmp_path, "# nothing\n"))
    assert cfg.model_dump() == NodeConfig().model_dump()


# -- a full file ----------------------------------------------------------------

FULL = """\
node:
  id: edge-7
  roles: [workers, data]
  labels: {zone: eu-1, rack: 12}
  max_concurrent: 8
  seats_processes: 3
  disk_floor: 1048576
data_dir: /srv/crewlet
stream:
  type: nats
  listen: 0.0.0.0:5222
  servers: [nats://a:4222, tls://b:4222]
  binary: /opt/nats-server
  replicas: 3
  domain: fleet1
  cluster: {name: crew, listen: 0.0.0.0:6222, routes: [nats-route://c:6222], leaf_listen: 0.0.0.0:7422}
  leaf: {remotes: [nats-leaf://hub:7422]}
ingress: {listen: "[::1]:8080"}
supervisor:
  intensity: 0
  period: 60
  backoff_min: 0
  backoff_max: 0.5
  stable_after: 2
  auto_shutdown: any_significant
  shutdown_timeout: 1.5
  broker_shutdown_timeout: 4
  ready_timeout: 5
  wedge_after: 3
  heartbeat_interval: 0.25
  heartbeat_grace: 0
log: {level: error, format: json}
fleet: {heartbeat: 1, lease_ttl: 3, sweep: 0.5, claims_per_sweep: 8, releases_per_sweep: 3, ack_wait: 60,
        drain_deadline: 30}
smtp: {host: mail.example.com, port: 465, tls: implicit, username: crewlet, password_env: SMTP_PASSWORD,
       password_file: null, sender: bots@example.com, timeout: 10, retry_after: 5, attempts: 3,
       notices_to: [ops@example.com]}
files: {store: s3, bucket: crewlet-files, endpoint: "https://s3.example.com", region: eu-west-1,
        access_key: AKIAEXAMPLE, secret_key_env: S3_SECRET, secret_key_file: null, max_bytes: 1048576,
        grace: 600, collect_every: 60}
estate: {snapshot_every: 5000, trim_every: 60}
conversations: {busy_wait: 0.5, lease_ttl: 3, retention: 120, max_run: 60, max_events: 50000}
sessions: {runner_concurrency: 3, sweep: 0.5}
approvals: {ttl: 600}
sandbox: {mode: required}
secrets: {key_file: null}
skills: {walk_every: 30}
debug:
  faults:
    - {role: seats, kind: crash, code: 9}
    - {role: workers, kind: wedge, after: 2, seconds: 5, once: false}
"""


def test_full_file_round_trip(tmp_path):
    path = write(tmp_path, FULL)
    cfg = load_node_config(path)
    assert cfg.source == path and cfg.warnings == []
    dumped = cfg.model_dump()
    expected = yaml.safe_load(FULL)
    expected["node"]["labels"]["rack"] = "12"  # numbers are accepted as strings
    expected["ingress"] = {**NodeConfig().ingress.model_dump(), "listen": "[::1]:8080"}
    expected["stream"].update(fleet_credentials=None, credentials=None, tls=None)
    expected["debug"]["faults"] = [
        {"role": "seats", "kind": "crash", "after": 0, "seconds": 3600, "code": 9, "once": True},
        {"role": "workers", "kind": "wedge", "after": 2, "seconds": 5, "code": 1, "once": False},
    ]
    assert dumped == expected
    assert cfg.children() == ["data_applier", "workers"]
    # What the model dumps loads back to the same config.
    again = load_node_config(write(tmp_path, yaml.safe_dump(dumped), "again.yaml"))
    assert again.model_dump() == dumped


def test_example_file_is_the_defaults(tmp_path):
    example = REPO / "etc" / "crewlet.yaml"
    cfg = load_node_config(str(example))
    assert cfg.source == str(example)
    assert cfg.warnings == [NODE0_WARNING]  # id: ${CREWLET_NODE_ID}, unset here
    # No documented differences: every value in the example is the default.
    assert cfg.model_dump() == NodeConfig().model_dump()
    # Every top-level key and every section key is present (data_dir only as a comment).
    raw = yaml.safe_load(example.read_text())
    for name, field in NodeConfig.model_fields.items():
        if field.exclude or name == "data_dir":
            continue
        assert name in raw
        section = field.annotation
        assert set(raw[name]) == set(section.model_fields), name
    assert "# data_dir:" in example.read_text()


# -- expansion ------------------------------------------------------------------


def test_expansion(monkeypatch, tmp_path):
    monkeypatch.setenv("CREWLET_NODE_ID", "n1")
    monkeypatch.setenv("ZONE", "eu-2")
    monkeypatch.setenv("EMPTY", "")
    path = write(tmp_path, """\
        node:
          id: ${CREWLET_NODE_ID}
          max_concurrent: "${N:-32}"
          labels: {zone: "${ZONE}", price: "$$5", both: "${ZONE}/${EMPTY:-none}", lone: "a$b", "${KEY}": x}
        """)
    cfg = load_node_config(path)
    assert cfg.node.id == "n1"
    assert cfg.node.max_concurrent == 32
    assert cfg.node.labels == {"zone": "eu-2", "price": "$5", "both": "eu-2/none", "lone": "a$b", "${KEY}": "x"}
    monkeypatch.setenv("N", "4")
    assert load_node_config(path).node.max_concurrent == 4


def test_unset_variable_names_key_and_variable(tmp_path):
    path = write(tmp_path, "stream:\n  type: nats\n  servers: [nats://a:4222, '${NATS_URL}']\n")
    err = error(path)
    assert (err.file, err.key) == (path, "stream.servers[1]")
    assert "NATS_URL" in err.problem and "not set" in err.problem


def test_expand_env_directly():
    env = {"A": "1", "E": ""}
    assert expand_env("${A}-${E}-${E:-d}-${B:-x y}-$$-$${A}", env, "k") == "1--d-x y-$-${A}"
    with pytest.raises(ConfigError) as info:
        expand_env("${B}", env, "some.key")
    assert str(info.value).startswith("<env>: some.key: ") and "B" in info.value.problem
    with pytest.raises(ConfigError, match="malformed"):
        expand_env("${1x}", env, "k")


# -- errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, key, problem",
    [
        ("node: {idd: x}\n", "node.idd", "unknown key"),
        ("supervisor: {perod: 3}\n", "supervisor.perod", "unknown key"),
        ("warnings: [x]\n", "warnings", "unknown key"),
        ("node: {max_concurrent: abc}\n", "node.max_concurrent", "expected an integer, got 'abc'"),
        ("node: {max_concurrent: 0}\n", "node.max_concurrent", "must be >= 1, got 0"),
        ("supervisor: {period: soon}\n", "supervisor.period", "expected a number, got 'soon'"),
        ("node: [1]\n", "node", "expected a mapping, got a list"),
        ("node: {roles: [data, web]}\n", "node.roles[1]", "must be one of data, ingress, seats, workers, got 'web'"),
        ("node: {roles: [data, data]}\n", "node.roles", "duplicate role 'data'"),
        ("node: {roles: [ingress, seats]}\n", "node.roles", "ingress needs the data role"),
        ("node: {roles: [seats, workers, ingress]}\n", "node.roles",
         "ingress and workers need the data role"),
        ("node: {roles: []}\n", "node.roles", "must not be empty"),
        ("node: {id: 'has space'}\n", "node.id", "got 'has space'"),
        ("stream: {type: nats}\n", "stream.servers", "at least one nats:// URL"),
        ("stream: {servers: ['http://x']}\n", "stream.servers[0]", "expected a nats:// or tls:// URL"),
        ("stream: {listen: 'localhost'}\n", "stream.listen", "host:port"),
        ("ingress: {listen: 'localhost:0'}\n", "ingress.listen", "port 1..65535"),
        ("stream: {replicas: 6}\n", "stream.replicas", "must be <= 5, got 6"),
        ("supervisor: {backoff_min: 5, backoff_max: 1}\n", "supervisor.backoff_max", "must be >= backoff_min"),
        ("supervisor: {wedge_after: 1}\n", "supervisor.heartbeat_interval", "must be < wedge_after"),
        ("fleet: {heartbeat: 50}\n", "fleet.lease_ttl", "must be > heartbeat"),
        ("debug: {faults: [{role: broker, kind: crash}]}\n", "debug.faults[0].role", "broker"),
        ("debug: {faults: [{role: crewletd, kind: crash}]}\n", "debug.faults[0].kind", "crewletd only takes kind wedge"),
        ("debug: {faults: [{role: ingress, kind: late}]}\n", "debug.faults[0].kind", "kind late is the seats role's"),
        ("debug: {faults: [{role: seats, kind: lag}]}\n", "debug.faults[0].kind", "kind lag is the data_applier role's"),
        ("debug: {faults: [{role: seats, kind: crash, code: 256}]}\n", "debug.faults[0].code", "<= 255"),
        ("debug: {faults: [{kind: crash}]}\n", "debug.faults[0].role", "required key is missing"),
        ("data_dir: ''\n", "data_dir", "must not be empty"),
        ("node: {roles: [web], max_concurrent: x}\n", "node.roles[0]", "(+1 more)"),
    ],
)
def test_validation_errors(tmp_path, text, key, problem):
    path = write(tmp_path, text)
    err = error(path)
    assert (err.file, err.key) == (path, key)
    assert problem in err.problem
    assert str(err) == f"{path}: {key}: {err.problem}"
    assert ConfigError.EXIT_CODE == 78


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    path = write(tmp_path, "node:\n  id: n1\n  roles: x: y\n")
    err = error(path)
    assert err.key is None
    assert err.problem.startswith("invalid YAML at line 3, column ")
    assert str(err).startswith(f"{path}: invalid YAML at line 3")


def test_duplicate_yaml_key(tmp_path):
    err = error(write(tmp_path, "log: {level: info}\nlog: {level: debug}\n"))
    assert "duplicate key 'log'" in err.problem and "line 2" in err.problem


def test_top_level_must_be_a_mapping(tmp_path):
    err = error(write(tmp_path, "- a\n- b\n"))
    assert err.key is None and "mapping" in err.problem


def test_explicit_missing_file(tmp_path):
    path = str(tmp_path / "missing.yaml")
    err = error(path)
    assert (err.file, err.key, err.problem) == (path, None, "no such file")
    assert str(err) == f"{path}: no such file"


def test_data_dir_too_long_for_a_unix_socket(tmp_path):
    long_dir = str(tmp_path / ("d" * 120))
    path = write(tmp_path, f"node: {{id: n1}}\ndata_dir: {long_dir}\n")
    err = error(path)
    assert err.key == "data_dir"
    run_bytes = len(os.fsencode(os.path.join(long_dir, "run")))
    assert f"is {run_bytes} bytes" in err.problem and "at most 107" in err.problem and "shorter data_dir" in err.problem


def test_data_dir_just_fits(tmp_path):
    # <data_dir>/run/applied is exactly 107 bytes.
    base = str(tmp_path) + "/"
    data_dir = base + "x" * (107 - len(os.fsencode(base)) - len("/run/applied"))
    cfg = load_node_config(write(tmp_path, f"node: {{id: n1}}\ndata_dir: {data_dir}\n"))
    assert len(os.fsencode(os.path.join(cfg.run_dir, "applied"))) == 107
    err = error(write(tmp_path, f"node: {{id: n1}}\ndata_dir: {data_dir}y\n"))
    assert err.key == "data_dir"


def test_relative_paths_resolve_against_the_file(tmp_path, monkeypatch):
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    monkeypatch.chdir(tmp_path)  # not the file's directory
    path = write(conf_dir, "node: {id: n1}\ndata_dir: state\nstream: {binary: bin/nats-server}\n")
    cfg = load_node_config(path)
    assert cfg.data_dir == str(conf_dir / "state")
    assert cfg.stream.binary == str(conf_dir / "bin/nats-server")
    assert cfg.run_dir == str(conf_dir / "state/run")


# -- fleet: what the embedded broker is (stream.cluster / stream.leaf) ------------------

def with_fleet_secret(tmp_path, text: str) -> str:
    """*text* whose stream section names the fleet secret file made in *tmp_path*."""
    make_fleet_secret(str(tmp_path / "fleet.secret"))
    return text.replace("stream: {", "stream: {fleet_credentials: fleet.secret, ")


CLUSTER = "{name: crew, listen: '127.0.0.1:6222', routes: ['nats-route://127.0.0.1:6223']}"
LEAF = "{remotes: ['nats-leaf://127.0.0.1:7422']}"


@pytest.mark.parametrize(
    "text, key, problem",
    [
        (f"stream: {{leaf: {LEAF}}}\n", "stream.leaf", "a data node must be a broker member, not a leaf"),
        (f"node: {{roles: [data, seats]}}\nstream: {{leaf: {LEAF}}}\n", "stream.leaf",
         "a data node must be a broker member, not a leaf"),
        (f"node: {{roles: [seats]}}\nstream: {{cluster: {CLUSTER}}}\n", "stream.cluster",
         "a node without the data role runs a leaf of the members, not a member"),
        (f"stream: {{cluster: {CLUSTER}, leaf: {LEAF}}}\n", "stream.leaf", "cannot be set together with stream.cluster"),
        (f"node: {{roles: [seats]}}\nstream: {{cluster: {CLUSTER}, leaf: {LEAF}}}\n", "stream.leaf",
         "cannot be set together with stream.cluster"),
        ("stream: {cluster: {name: crew, listen: '127.0.0.1:6222'}}\n", "stream.cluster.routes",
         "at least one other member"),
        ("stream: {cluster: {name: crew, listen: '0.0.0.0:6222', routes: ['nats-route://127.0.0.1:6222']}}\n",
         "stream.cluster.routes", "own listen address does not count"),
        ("stream: {cluster: {name: 'my crew', listen: '127.0.0.1:6222', routes: ['nats-route://h:6222']}}\n",
         "stream.cluster.name", "got 'my crew'"),
        ("stream: {cluster: {name: crew, listen: '127.0.0.1:6222', routes: ['nats-route://h:6222'], "
         "leaf_listen: '7422'}}\n", "stream.cluster.leaf_listen", "host:port"),
        ("stream: {cluster: {name: crew, listen: '127.0.0.1:6222', routes: ['http://h:6222']}}\n",
         "stream.cluster.routes[0]", "nats-route://"),
        ("stream: {cluster: {listen: '127.0.0.1:6222', routes: ['nats-route://h:6222']}}\n",
         "stream.cluster.name", "required key is missing"),
        ("node: {roles: [seats]}\nstream: {leaf: {remotes: []}}\n", "stream.leaf.remotes", "must not be empty"),
        ("node: {roles: [seats]}\nstream: {leaf: {remotes: ['http://hub:7422']}}\n", "stream.leaf.remotes[0]",
         "nats-leaf://"),
        ("stream: {domain: 'a.b'}\n", "stream.domain", "got 'a.b'"),
        ("stream: {domain: ''}\n", "stream.domain", "got ''"),
    ],
)
def test_fleet_broker_refusals(tmp_path, text, key, problem):
    path = write(tmp_path, with_fleet_secret(tmp_path, text))
    err = error(path)
    assert (err.file, err.key) == (path, key)
    assert problem in err.problem
    assert str(err) == f"{path}: {key}: {err.problem}"


def test_broker_kind_follows_the_stream_section(tmp_path):
    assert NodeConfig().stream.broker_kind == "standalone"
    assert NodeConfig().stream.domain == "crewlet"
    member = load_node_config(write(tmp_path, with_fleet_secret(
        tmp_path, f"node: {{id: a}}\nstream: {{cluster: {CLUSTER}}}\n")))
    assert member.stream.broker_kind == "member" and member.stream.cluster.leaf_listen is None
    leaf = load_node_config(write(tmp_path, with_fleet_secret(
        tmp_path, f"node: {{id: d, roles: [seats]}}\nstream: {{leaf: {LEAF}}}\n")))
    assert leaf.stream.broker_kind == "leaf"
    # A node without data and without cluster or leaf runs a standalone broker (a single node).
    alone = load_node_config(write(tmp_path, "node: {id: s, roles: [seats]}\n"))
    assert alone.stream.broker_kind == "standalone"


def test_cluster_and_leaf_are_ignored_when_the_stream_is_external(tmp_path):
    # type nats runs no broker: somebody else's cluster, so neither key applies,
    # whatever the roles (the same as listen and binary).
    path = write(tmp_path, f"""\
        node: {{id: x, roles: [data]}}
        stream: {{type: nats, servers: ['nats://h:4222'], cluster: {CLUSTER}, leaf: {LEAF}}}
        """)
    cfg = load_node_config(path)
    assert cfg.stream.broker_kind is None
    assert cfg.stream.cluster is not None and cfg.stream.leaf is not None


FLEET_FILES = ("node-a", "node-b", "node-c", "node-d-leaf")


def test_fleet_example_files(monkeypatch, tmp_path):
    monkeypatch.setenv("CREWLET_FLEET_DIR", str(tmp_path / "fleet"))
    (tmp_path / "fleet").mkdir()
    make_fleet_secret(str(tmp_path / "fleet" / "fleet.secret"))  # as etc/fleet/README.md says
    cfgs = {name: load_node_config(str(REPO / "etc" / "fleet" / f"{name}.yaml")) for name in FLEET_FILES}
    assert all(c.warnings == [] for c in cfgs.values())
    members = [cfgs[n] for n in FLEET_FILES[:3]]
    leaf = cfgs["node-d-leaf"]
    assert [c.node.id for c in cfgs.values()] == ["node-a", "node-b", "node-c", "node-d"]
    assert [c.stream.broker_kind for c in cfgs.values()] == ["member", "member", "member", "leaf"]
    assert all("data" in c.node.roles for c in members)
    assert leaf.node.roles == ["seats"]  # no data: seats only
    assert [c.data_dir for c in cfgs.values()] == [str(tmp_path / "fleet" / d) for d in "abcd"]
    assert {c.stream.replicas for c in cfgs.values()} == {3}
    assert {c.stream.domain for c in cfgs.values()} == {"crewlet"}
    assert {c.stream.fleet_credentials for c in cfgs.values()} == {str(tmp_path / "fleet" / "fleet.secret")}
    assert len({c.stream.cluster.name for c in members}) == 1
    # Every member routes to the other two, and the leaf dials every member's leaf port.
    for me in members:
        others = {f"nats-route://{c.stream.cluster.listen}" for c in members if c is not me}
        assert set(me.stream.cluster.routes) == others
    assert leaf.stream.leaf.remotes == [f"nats-leaf://{c.stream.cluster.leaf_listen}" for c in members]
    # Every address on loopback and no port used twice.
    addresses = [a for c in members for a in (c.stream.listen, c.stream.cluster.listen,
                                              c.stream.cluster.leaf_listen, c.ingress.listen)]
    addresses += [leaf.stream.listen]  # it runs no ingress
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert len({a.rpartition(":")[2] for a in addresses}) == len(addresses)


def test_session_runner_concurrency_from_the_environment_wins(monkeypatch, tmp_path):
    path = write(tmp_path, "sessions: {runner_concurrency: 4}\n")
    assert load_node_config(path).sessions.runner_concurrency == 4
    monkeypatch.setenv("SESSION_RUNNER_CONCURRENCY", "16")
    assert load_node_config(path).sessions.runner_concurrency == 16
    monkeypatch.setenv("SESSION_RUNNER_CONCURRENCY", "lots")
    with pytest.raises(ConfigError) as refused:
        load_node_config(path)
    assert refused.value.key == "sessions.runner_concurrency" and "integer" in str(refused.value)
    monkeypatch.setenv("SESSION_RUNNER_CONCURRENCY", "")  # empty: unset
    assert load_node_config(path).sessions.runner_concurrency == 4


def test_an_s3_files_store_without_boto3_is_a_config_error_naming_the_key(monkeypatch, tmp_path):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "boto3" else real(name, *a))
    path = tmp_path / "crewlet.yaml"
    path.write_text("files: {store: s3, bucket: b}\n")
    with pytest.raises(ConfigError) as info:
        load_node_config(str(path))
    assert (info.value.file, info.value.key) == (str(path), "files.store")
    assert "pip install 'crewlet[s3]'" in str(info.value)
