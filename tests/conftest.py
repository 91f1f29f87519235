"""Shared test helpers: short temp dirs, free loopback ports, deadlines, real nodes.

Everything here starts real processes and listens on 127.0.0.1 only. Waits
are conditions with deadlines (:func:`wait_for`), never bare sleeps.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil
import pytest
import yaml

from crewlet import ipc

def _script(name: str, module: str) -> list[str]:
    """The installed console script next to this interpreter, else ``-m``."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return [path] if os.access(path, os.X_OK) else [sys.executable, "-m", module]


# ---------------------------------------------------------------- running in parallel
# pytest-xdist runs the suite on as many workers as the machine has CPUs
# (pyproject's addopts: -n auto --dist loadgroup). Each test file is one group,
# so a module's nodes start once, on one worker; every test of tests/fleet is
# the one group "fleet", so at most one fleet (three nodes, their cluster)
# runs at a time, beside the single-node tests. With -n 0 the marks are
# inert and the suite runs in one process, as before.
FLEET_GROUP = "fleet"
# Fleet files light enough — a few nodes on one test broker, no cluster or chaos of their
# own, as heavy as an integration file with nodes — to run beside the fleet group, each
# a group of its own, rather than in it: the fleet group is the suite's critical path.
BESIDE_THE_FLEET = frozenset({"tests/fleet/test_vault_fleet.py", "tests/fleet/test_snapshot_fleet.py",
                              "tests/fleet/test_skills_fleet.py", "tests/fleet/test_seats_pool_fleet.py"})
# (Measured 2026-12-06: three workers on two cores — one more than the CPUs — with six
# more light fleet files beside the group took the suite from 24.7 to 21.5 min, but the
# machine so loaded made four tests fail in three runs for their timing, the chaos test's
# settle among them. Two workers until the suite's work is cut instead.)


# Files whose tests share nothing (no module fixture: each starts what it needs
# as a subprocess of its own), each test a group of its own: ~19 bench smoke runs
# (~140 s in all) are not one block on one worker but fill both workers' gaps.
EACH_TEST_A_GROUP = frozenset({"tests/integration/test_benches.py"})


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks into the test ids
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        fleet = path.startswith("tests/fleet/") and path not in BESIDE_THE_FLEET
        group = FLEET_GROUP if fleet else item.nodeid if path in EACH_TEST_A_GROUP else path
        item.add_marker(pytest.mark.xdist_group(group))


# ---------------------------------------------------------------- throwing dirs away
# A fleet test leaves tens of thousands of files (a broker's consumers, LMDB
# copies): removing them took 12 s and more on CI's disk, on the fleet group's
# critical path. A test's dirs are renamed away at once (no later test can
# see them: every one has a fresh name) and removed by one thread of this
# worker while the next tests run; the session waits for it at its end.
_discarded: "queue.Queue[str | None]" = queue.Queue()
_remover: threading.Thread | None = None


def _remove_discarded() -> None:
    while (path := _discarded.get()) is not None:
        shutil.rmtree(path, ignore_errors=True)


def discard(path: str) -> None:
    """Remove *path* (a test's temp dir) in the background; it is gone from
    its name at once."""
    global _remover
    gone = f"{path}.gone"
    try:
        os.rename(path, gone)
    except OSError:
        gone = path  # not there, or not renameable: removed where it is
    if _remover is None:
        _remover = threading.Thread(target=_remove_discarded, name="discarded dirs", daemon=True)
        _remover.start()
    _discarded.put(gone)


def pytest_sessionfinish(session, exitstatus) -> None:
    if _remover is not None:
        _discarded.put(None)
        _remover.join()


CREWLETD = _script("crewletd", "supervisor.crewletd")
CREWLETCTL = _script("crewletctl", "crewlet.ctl")


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
             what: str = "condition") -> Any:
    """Poll *predicate* until it returns something truthy; fail after *timeout*."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# Ports for the servers tests start: below the kernel's ephemeral range (a
# client socket's local port never takes one), and each xdist worker has its
# own share of them, handed out in turn. With bind(0) two workers could be
# given one port a moment apart — the first one's nats-server then holds the
# second one's ingress port, and crewletd refuses to start (exit 78), as CI
# saw once in ~1,350 tests. In turn, a port comes round again only after the
# worker's whole share (~10,000 ports with two workers) was handed out, long
# after the test that had it stopped its servers.
PORTS = range(12000, 32000)


def _port_share() -> range:
    """This test process's share of :data:`PORTS`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker) % count if worker.isdigit() else 0
    size = len(PORTS) // count
    return range(PORTS.start + index * size, PORTS.start + (index + 1) * size)


_SHARE = _port_share()
_ports = itertools.cycle(_SHARE)


def free_port() -> int:
    """The next port of this worker's share that nothing listens on now."""
    for _ in range(len(_SHARE)):
        port = next(_ports)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken by somebody else: the next one
        return port
    raise RuntimeError(f"no free port in {_SHARE}")


@pytest.fixture
def short_tmp():
    """A temp dir with a short path: unix socket paths must fit in 107 bytes."""
    path = tempfile.mkdtemp(prefix="cw", dir="/tmp")
    yield path
    discard(path)


@dataclass
class Node:
    """A real crewletd started by a test."""

    dir: str
    config_path: str
    config: dict
    proc: subprocess.Popen | None = None
    log_path: str = ""
    _seen: int = field(default=0)

    @property
    def run_dir(self) -> str:
        return os.path.join(self.config["data_dir"], "run")

    def start(self, *, wait_ready: bool = True, prefix: list[str] | None = None,
              args: tuple[str, ...] = ()) -> "Node":
        self.log_path = os.path.join(self.dir, "crewletd.log")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([*(prefix or []), *CREWLETD, "start", "-c", self.config_path,
                                      *args],
                                     stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                                     start_new_session=True)
        log.close()
        if wait_ready:
            self.wait_running()
        return self

    def status(self, timeout: float = 2.0) -> dict | None:
        try:
            reply = ipc.call(self.run_dir, "status", timeout=timeout)
        except ipc.NodeUnreachable:
            return None
        return reply["result"] if reply.get("ok") else None

    def children(self) -> dict[str, dict]:
        st = self.status()
        return {c["name"]: c for c in st["children"]} if st else {}

    def process_pids(self) -> dict[str, int]:
        """Children that are processes of their own (not crewletd's tasks), by name."""
        st = self.status()
        me = st["node"]["pid"] if st else None
        return {c["name"]: c["pid"] for c in (st or {}).get("children", [])
                if c["pid"] and c["pid"] != me}

    def wait_running(self, timeout: float = 30.0, exclude: dict[str, int] | None = None) -> dict:
        """Wait until every child runs (with a pid other than *exclude*'s)."""
        def ready():
            assert self.proc is None or self.proc.poll() is None, \
                f"crewletd exited {self.proc.returncode}:\n{self.read_log()[-3000:]}"
            st = self.status()
            if not st or not st["node"]["ready"]:
                return None
            kids = {c["name"]: c for c in st["children"]}
            if any(c["state"] != "running" for c in kids.values()):
                return None
            if exclude and any(kids[n]["pid"] == pid for n, pid in exclude.items()):
                return None
            return kids
        return wait_for(ready, timeout, what="all children running")

    def events(self) -> list[dict]:
        out = []
        for line in self.read_log().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def events_named(self, name: str, **match: Any) -> list[dict]:
        """The log's *name* events (those whose fields equal *match*), in order."""
        return [ev for ev in self.events()
                if ev.get("event") == name and all(ev.get(k) == v for k, v in match.items())]

    def wait_event(self, name: str, timeout: float = 10.0, **match: Any) -> dict:
        return wait_for(lambda: next(iter(self.events_named(name, **match)), None), timeout,
                        what=f"event {name} {match}")

    def read_log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def refused_roles(self) -> list[str]:
        """The broker's ``Permissions Violation`` lines about this node's own
        roles (their connections are named ``<node>/<role>``; a test's own
        clients are not), from its log: each one is a role refused something
        it tried to do (crewlet.permissions)."""
        mark = f":{self.config['node']['id']}/"
        return [line for line in self.read_log().splitlines()
                if " Violation - " in line and mark in line]

    def wait_exit(self, timeout: float = 30.0) -> int:
        """crewletd's exit code, once it exited within *timeout*; else a
        failure that shows where it was (the tail of its log and events)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            events = "\n".join(json.dumps(e) for e in self.events()[-25:])
            raise AssertionError(f"crewletd did not exit within {timeout:g}s; its log ends:\n"
                                 f"{self.read_log()[-3000:]}\nits last events:\n{events}") from None

    def tree_pids(self) -> set[int]:
        """crewletd and every descendant alive now."""
        if self.proc is None:
            return set()
        try:
            root = psutil.Process(self.proc.pid)
            return {root.pid, *(p.pid for p in root.children(recursive=True))}
        except psutil.NoSuchProcess:
            return set()

    def brokers_left(self) -> list[psutil.Process] | None:
        """The node's own brokers, if every role below crewletd has stopped
        (its zygote lives on until crewletd ends); None while a role runs.
        [] when crewletd is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        brokers = []
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    if p.status() == psutil.STATUS_ZOMBIE or p.name().endswith(" zygote"):
                        continue
                    if p.name() != "nats-server":
                        return None
                    brokers.append(p)
        except psutil.NoSuchProcess:
            return []
        return brokers

    def log_size(self) -> int:
        """How far the log is written now: an offset for :meth:`fleet_stopped_since`."""
        try:
            return os.path.getsize(self.log_path)
        except (OSError, TypeError):
            return 0

    def fleet_stopped_since(self, offset: int) -> bool:
        """Has crewletd said, past *offset* of its log, that its ``fleet`` task
        (presence in the fleet: it leaves through the broker) is down?"""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return _FLEET_DOWN.search(f.read()) is not None
        except (OSError, TypeError):
            return False

    def kill_tree(self) -> set[int]:
        """``kill -9`` on crewletd's whole process tree; returns the pids hit."""
        pids = self.tree_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def kill_all(self) -> None:
        """Last-resort cleanup: SIGKILL crewletd's session, whatever is left."""
        if self.proc is None:
            return
        pids = self.tree_pids()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def start_all(nodes: list["Node"], timeout: float = 60.0) -> list["Node"]:
    """Start every node of *nodes* at once, then wait until each runs: a fleet
    test's nodes come up side by side, not one start after another."""
    for node in nodes:
        node.start(wait_ready=False)
    for node in nodes:
        node.wait_running(timeout=timeout)
    return nodes


def node_config(dir: str, **overrides: Any) -> dict:
    """A fast single-node config in *dir*, on free loopback ports."""
    cfg: dict[str, Any] = {
        # One seats process, not one a CPU: a test's node stays small beside
        # the others the suite runs at once; the pool's tests ask for more
        # (tests/integration/test_seats_pool.py).
        "node": {"id": "t1", "seats_processes": 1},
        "data_dir": os.path.join(dir, "data"),
        "stream": {"listen": f"127.0.0.1:{free_port()}"},
        "ingress": {"listen": f"127.0.0.1:{free_port()}"},
        "supervisor": {"shutdown_timeout": 5, "broker_shutdown_timeout": 10,
                       "wedge_after": 2, "heartbeat_interval": 0.2, "heartbeat_grace": 1,
                       "backoff_min": 0.05, "backoff_max": 0.5, "stable_after": 1},
        "log": {"format": "json"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def make_fleet_secret(path: str) -> str:
    """Write a new fleet secret file at *path* (0600), as ``crewletctl
    fleet-secret`` does; returns *path*."""
    from crewlet import credentials
    credentials.write_fleet_secrets(path, [credentials.new_fleet_secret()])
    return path


# crewletd's line saying its fleet task is down (tests run with log.format json).
_FLEET_DOWN = re.compile(rb'"event":"child_(?:stopped|exited)","child":"fleet"')
# Seconds the nodes of a test are given to stop at its end before SIGKILL.
TEARDOWN_GRACE = 20.0


class Nodes:
    """A factory of nodes in one short temp dir: ``nodes(**config_overrides)``
    writes a config (:func:`node_config`) and gives the :class:`Node`, not
    started; :meth:`close` stops them all (SIGTERM, then SIGKILL of whatever is
    left) and removes the dir. :func:`make_node` is one per test; a module's
    fixture makes its own to share nodes between tests.

    The nodes of one factory are one fleet: a node given ``stream.cluster``
    or ``stream.leaf`` without ``stream.fleet_credentials`` is given the
    factory's fleet secret file (:attr:`fleet_secret`, made at first use)."""

    def __init__(self, dir: str | None = None):
        self.dir = dir or tempfile.mkdtemp(prefix="cw", dir="/tmp")  # short: socket paths
        self.owned = dir is None
        self.nodes: list[Node] = []
        self._fleet_secret: str | None = None

    @property
    def fleet_secret(self) -> str:
        """The path of this factory's fleet secret file (0600)."""
        if self._fleet_secret is None:
            self._fleet_secret = make_fleet_secret(os.path.join(self.dir, "fleet.secret"))
        return self._fleet_secret

    def __call__(self, **overrides: Any) -> Node:
        d = os.path.join(self.dir, f"n{len(self.nodes)}")
        os.makedirs(d)
        stream = overrides.get("stream")
        if isinstance(stream, dict) and ("cluster" in stream or "leaf" in stream) \
                and "fleet_credentials" not in stream:
            overrides["stream"] = {**stream, "fleet_credentials": self.fleet_secret}
        cfg = node_config(d, **overrides)
        path = os.path.join(d, "crewlet.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        node = Node(d, path, cfg)
        self.nodes.append(node)
        return node

    def close(self) -> None:
        """Stop every node: SIGTERM to all at once (they stop side by side),
        their roles stopped as crewletd stops them; then the brokers, once
        every node's roles are down, by SIGKILL. A broker's own clean stop
        walks its mailboxes one by one (about 10 ms each, measured: 10 s from
        1,000 up), and a test's broker is thrown away. Whatever is left at
        the deadline is killed.

        Leaf nodes go first, alone: their roles reach JetStream through the
        hub's members, and a member's crewletd stops its own broker once its
        own roles are down — stopped side by side, a leaf's roles waited out
        their requests (4-6 s a test)."""
        offsets = [node.log_size() for node in self.nodes]
        deadline = time.monotonic() + TEARDOWN_GRACE
        leaves = [node for node in self.nodes if "leaf" in node.config.get("stream", {})]
        for wave in ([leaves, [n for n in self.nodes if n not in leaves]] if leaves else [self.nodes]):
            for node in wave:
                if node.proc is not None and node.proc.poll() is None:
                    node.proc.send_signal(signal.SIGTERM)
            while wave is leaves and time.monotonic() < deadline \
                    and any(node.brokers_left() is None for node in wave):
                time.sleep(0.05)
        while time.monotonic() < deadline:
            left = [node.brokers_left() for node in self.nodes]
            # A broker is killed only once its node's fleet task has left
            # through it too: killed a moment before, that task tried the dead
            # broker again for a second (seen in 1 stop of 4).
            if all(brokers is not None and (not brokers or node.fleet_stopped_since(offset))
                   for node, brokers, offset in zip(self.nodes, left, offsets)):
                for broker in itertools.chain.from_iterable(left):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        broker.kill()
                break
            time.sleep(0.05)
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            node.kill_all()
        refused = [line for node in self.nodes for line in node.refused_roles()]
        if self.owned:
            discard(self.dir)
        # Every test that runs a node tests the roles' broker permissions too.
        assert not refused, "the broker refused a role (crewlet/permissions.py):\n" + "\n".join(refused)


@pytest.fixture
def make_node(short_tmp):
    """Factory: ``make_node(**config_overrides)`` writes a config; ``.start()`` runs it.

    A test whose nodes use a broker fixture (``natsd``, ``nats_cluster``) asks
    for that fixture first: fixtures end in the reverse order, so the nodes
    stop while their broker still answers (stopped after it, each role waits
    out its reconnects: seconds a test)."""
    nodes = Nodes(short_tmp)
    yield nodes
    nodes.close()


def alive(pid: int) -> bool:
    """True if *pid* exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --------------------------------------------------------------------------
# Real nats-servers for tests that talk to NATS directly
# --------------------------------------------------------------------------

def nats_binary() -> str:
    from crewlet.config import NodeConfig
    from roles.broker import find_binary
    return find_binary(NodeConfig())


# Seconds a test's nats-server is given to stop on SIGTERM before SIGKILL.
BROKER_STOP_GRACE = 1.0


@dataclass
class NatsServer:
    """One real nats-server with JetStream on loopback, started by a test."""

    name: str
    dir: str
    port: int
    cluster_port: int | None = None
    routes: list[str] = field(default_factory=list)
    cluster_name: str | None = None
    proc: subprocess.Popen | None = None
    conf: list[str] | None = None  # the lines of a config file to run with instead of the options above

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> "NatsServer":
        os.makedirs(self.dir, exist_ok=True)
        argv = [nats_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-n", self.name,
                "-js", "-sd", os.path.join(self.dir, "js")]
        if self.conf is not None:
            path = os.path.join(self.dir, "nats.conf")
            with open(path, "w") as f:
                f.write("\n".join(self.conf) + "\n")
            argv = [nats_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-n", self.name, "-c", path]
        elif self.cluster_port is not None:
            argv += ["--cluster", f"nats://127.0.0.1:{self.cluster_port}",
                     "--cluster_name", self.cluster_name or "test"]
            if self.routes:
                argv += ["--routes", ",".join(self.routes)]
        log = open(os.path.join(self.dir, "nats.log"), "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for(self._listening, 10, what=f"nats-server {self.name} listening")
        return self

    def _listening(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, "nats-server exited"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def log(self) -> str:
        with open(os.path.join(self.dir, "nats.log"), errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`BROKER_STOP_GRACE` s: a broker
        holding thousands of consumers takes 20 s and more to shut down
        cleanly, and a test's broker is thrown away (its tests read it before)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(BROKER_STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def natsd(short_tmp):
    """A single JetStream nats-server on a free loopback port."""
    server = NatsServer("solo", os.path.join(short_tmp, "nats"), free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def tier_a(natsd, short_tmp):
    """A Tier A file of a node whose broker is the external :func:`natsd`
    (``stream.type: nats``): what crewletctl's control-plane commands read."""
    path = os.path.join(short_tmp, "crewlet.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"node": {"id": "t1"}, "data_dir": os.path.join(short_tmp, "data"),
                        "stream": {"type": "nats", "servers": [natsd.url]}}, f)
    return path


@pytest.fixture
def nats_cluster(short_tmp):
    """Three JetStream cluster members on loopback (R3 capable)."""
    cports = [free_port() for _ in range(3)]
    routes = [f"nats://127.0.0.1:{p}" for p in cports]
    servers = [NatsServer(f"m{i}", os.path.join(short_tmp, f"m{i}"), free_port(), cports[i],
                          [r for j, r in enumerate(routes) if j != i], "tc")
               for i in range(3)]
    for server in servers:
        server.start()
    wait_for(lambda: _jetstream_ready([s.url for s in servers]), 30,
             what="the cluster's JetStream meta leader")
    yield servers
    for server in servers:
        server.stop()


def _jetstream_ready(urls: list[str]) -> bool:
    """Every server answers JetStream requests (the meta group has a leader)."""
    import asyncio

    import nats

    async def check() -> bool:
        for url in urls:
            nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False)
            try:
                await nc.jetstream(timeout=1).account_info()
            except Exception:
                return False
            finally:
                await nc.close()
        return True
    return asyncio.run(check())
