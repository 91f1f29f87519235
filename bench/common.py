"""What the bench scripts share: messages, free ports, statistics, a bare nats-server, a crewletd, CPU meters.

A benchmark prints crewlet's figure beside a baseline measured in the same
run (DESIGN §8); most baselines are bare nats-py on a bare ``nats-server
-js`` that the script starts itself. This module is that part, written once:

* :func:`say` — progress on stderr, so stdout stays the report (``--json``);
* :func:`free_ports`, :func:`summary` (median, p95, p99), :func:`ratio`, :func:`split`;
* :func:`find_nats_server` — the binary crewlet's embedded broker would use
  (``--nats-server``, ``$CREWLET_NATS_SERVER``, beside this python, the PATH);
* :class:`NatsServer` — one ``nats-server -js`` on 127.0.0.1 with its store in
  a directory of the caller's, stopped by its pid (SIGTERM, then SIGKILL);
* :func:`wait_jetstream` — until its JetStream answers;
* :class:`Crewletd` — one real ``crewletd start`` on loopback ports, its config
  and log in a directory of the caller's, its log's warnings and errors
  counted, stopped by its pid (SIGTERM, then SIGKILL of its process group and
  of anything it left behind); :func:`child_env` — the environment a python
  child of a bench gets (this checkout first on its path);
* :class:`CpuMeter` — CPU % of some processes over a window (100 % = one core),
  from their CPU times, so a window may span awaits;
* :func:`add_smoke` — a bench's ``--smoke``: tiny sizes that run every part of it
  once in seconds (``tests/integration/test_benches.py`` runs each), so a bench
  whose code rotted fails; its figures mean nothing.

``bench/leases.py`` predates it and keeps its own nats-server class.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import psutil

from crewlet import ipc
from crewlet.credentials import client_url as credentials_url

if TYPE_CHECKING:
    import argparse

# This checkout: a child python (crewletd among them) imports crewlet from here.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Seconds a SIGTERM'd nats-server gets before SIGKILL: a server holding
# thousands of consumers takes ~10 s to stop (DESIGN §4).
SERVER_STOP_GRACE = 30.0


class BenchError(Exception):
    """The benchmark could not measure what it set out to."""


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def free_ports(n: int) -> list[int]:
    """*n* distinct free loopback ports (all sockets open at once, so no repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def summary(values: list[float]) -> dict[str, Any]:
    """n, median, p95 and p99 (nearest rank), min and max of *values*, in the values' unit."""
    s = sorted(values)
    if not s:
        return {"n": 0, "median": None, "p95": None, "p99": None, "min": None, "max": None}

    def rank(q: float) -> float:
        return s[max(0, math.ceil(q * len(s)) - 1)]

    return {"n": len(s), "median": statistics.median(s), "p95": rank(0.95), "p99": rank(0.99),
            "min": s[0], "max": s[-1]}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero."""
    return None if a is None or not b else a / b


def split(total: int, parts: int) -> list[int]:
    """*total* in *parts* near-equal whole shares, the larger first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def find_nats_server(explicit: str | None = None) -> str:
    candidates = [explicit] if explicit else [
        os.environ.get("CREWLET_NATS_SERVER"),
        os.path.join(os.path.dirname(sys.executable), "nats-server"),
        shutil.which("nats-server")]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise BenchError("nats-server not found (give --nats-server)")


def server_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.strip().split()[-1].lstrip("v")
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


def stop_process(proc: "subprocess.Popen | None", what: str, grace: float) -> None:
    """SIGTERM *proc* (a baseline server the bench started), SIGKILL after *grace* s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        say(f"{what} (pid {proc.pid}) did not stop in {grace:g}s: SIGKILL")
        proc.kill()
        proc.wait(10)


def collapsed_stacks(path: str) -> Iterator[tuple[list[str], int]]:
    """The stacks of a py-spy raw (collapsed) file: each one's frames, root first,
    and its sample count; malformed lines are passed over."""
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                yield stack.split(";"), int(count)


def tail(path: str, n: int) -> str:
    """The last *n* lines of the file at *path* ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class NatsServer:
    """One bare ``nats-server -js`` we started on 127.0.0.1, stopped by its pid."""

    def __init__(self, binary: str, dir: str, port: int | None = None, name: str = "bare"):
        self.binary, self.dir, self.name = binary, dir, name
        self.port = port if port is not None else free_ports(1)[0]
        self.log_path = os.path.join(dir, "nats.log")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 15.0) -> "NatsServer":
        """Start it and wait until it accepts connections."""
        os.makedirs(self.dir, exist_ok=True)
        argv = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-n", self.name,
                "-js", "-sd", os.path.join(self.dir, "js")]
        with open(self.log_path, "ab") as log:
            # A session of its own: a Ctrl-C reaches us, and we stop it in order.
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"nats-server {self.name} exited with {self.proc.returncode}:\n"
                                 + self.log_tail())
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if time.monotonic() > deadline:
                raise BenchError(f"nats-server {self.name} not listening within {timeout:g}s:\n"
                                 + self.log_tail())
            time.sleep(0.05)

    def log_tail(self, n: int = 15) -> str:
        return tail(self.log_path, n)

    def stop(self, grace: float = SERVER_STOP_GRACE) -> float | None:
        """SIGTERM, wait up to *grace*, then SIGKILL; the seconds it took (None: not running)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        t0 = time.monotonic()
        try:
            self.proc.terminate()
            self.proc.wait(grace)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            say(f"nats-server {self.name} (pid {self.proc.pid}) did not stop in {grace:g}s: SIGKILL")
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        return time.monotonic() - t0


async def wait_jetstream(url: str, timeout: float = 15.0) -> None:
    """Until JetStream answers on *url*."""
    import nats

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False, max_reconnect_attempts=0)
            try:
                await nc.jetstream(timeout=1).account_info()
                return
            finally:
                await nc.close()
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            raise BenchError(f"JetStream not answering on {url} within {timeout:g}s: "
                             f"{type(last).__name__}: {last}")
        await asyncio.sleep(0.2)


# Seconds a SIGTERM'd crewletd gets before SIGKILL, unless its bench says otherwise.
NODE_STOP_GRACE = 30.0


def child_env() -> dict[str, str]:
    """The environment of a python child of a bench: this checkout first on its path, and no
    ``CREWLET_CONFIG`` of the caller's (a crewletd is given its own config)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.pop("CREWLET_CONFIG", None)
    return env


class Crewletd:
    """One real ``crewletd start`` we started on loopback ports, stopped by its pid.

    *base* is its working directory and holds its config (``crewlet.yaml``,
    written here) and its log (``crewletd.log``, JSON lines); its data dir is
    ``base/d`` unless *data_dir* names another. *config* is the bench's own
    part of the config (``node``, ``supervisor``, ``fleet`` ...), laid over
    what every bench's node has: the data dir, an embedded broker on a free
    127.0.0.1 port (the nats-server *binary* when given), ingress on another,
    JSON logs at info. A bench subclasses it for what only it needs, and may
    change the class attributes.
    """

    STOP_GRACE = NODE_STOP_GRACE   # s a SIGTERM'd crewletd gets before SIGKILL
    STATUS_TIMEOUT = 1.0           # s for a status answer
    TAIL = 20                      # lines of its log that a failure quotes

    def __init__(self, base: str, config: dict[str, Any], *, binary: str | None = None,
                 data_dir: str | None = None):
        self.dir = base
        self.data_dir = data_dir or os.path.join(base, "d")
        self.run_dir = os.path.join(self.data_dir, "run")
        self.stream_port, self.ingress_port = free_ports(2)
        self.config_path = os.path.join(base, "crewlet.yaml")
        self.log_path = os.path.join(base, "crewletd.log")
        self.proc: subprocess.Popen | None = None
        os.makedirs(base, exist_ok=True)
        stream = {"type": "embedded", "listen": f"127.0.0.1:{self.stream_port}"}
        if binary:
            stream["binary"] = binary
        cfg = {  # JSON is YAML; see etc/crewlet.yaml and crewlet/config/model.py
            "data_dir": self.data_dir, "stream": stream,
            "ingress": {"listen": f"127.0.0.1:{self.ingress_port}"},
            "log": {"level": "info", "format": "json"}, **config}
        with open(self.config_path, "w") as f:
            json.dump(cfg, f, indent=1)

    @property
    def url(self) -> str:
        """The node's broker, with the node's own credentials in it (the broker
        admits nobody else: crewlet.credentials); read once the node started."""
        return credentials_url(f"127.0.0.1:{self.stream_port}", self.run_dir)

    def start(self, *args: str) -> None:
        """``crewletd start -c <config> *args`` in a session of its own, its output to its log."""
        exe = os.path.join(os.path.dirname(sys.executable), "crewletd")
        argv = [exe] if os.access(exe, os.X_OK) else [sys.executable, "-m", "supervisor.crewletd"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv + ["start", "-c", self.config_path, *args],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=child_env(), cwd=self.dir, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise :class:`BenchError` (:meth:`exit_message`) if crewletd has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(self.exit_message())

    def exit_message(self) -> str:
        assert self.proc is not None
        return f"crewletd exited with {self.proc.returncode}:\n{self.log_tail()}"

    def log_tail(self, n: int | None = None) -> str:
        return tail(self.log_path, self.TAIL if n is None else n)

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def status(self) -> dict[str, Any] | None:
        """Its ``status`` answer over its control socket; None when it does not answer."""
        try:
            reply = ipc.call(self.run_dir, "status", timeout=self.STATUS_TIMEOUT)
        except ipc.NodeUnreachable:
            return None
        return reply.get("result") if reply.get("ok") else None

    def processes(self, *, others: bool = False) -> dict[str, psutil.Process]:
        """crewletd, its broker (the descendant named nats-server), the zygote and the
        role children by name; with *others*, every other descendant too (``other <pid>``)."""
        assert self.proc is not None
        me = psutil.Process(self.proc.pid)
        found: dict[str, psutil.Process] = {"crewletd": me}
        roles = {c["pid"]: c["name"] for c in (self.status() or {}).get("children", []) if c.get("pid")}
        for p in me.children(recursive=True):
            try:
                if p.name() == "nats-server":
                    found["broker"] = p
                elif roles.get(p.pid) not in (None, "broker", "fleet"):
                    found[roles[p.pid]] = p
                elif "zygote" in " ".join(p.cmdline()):
                    found["zygote"] = p
                elif others:
                    found[f"other {p.pid}"] = p
            except psutil.Error:
                pass
        return found

    def warnings(self, start: int = 0, end: int | None = None) -> Iterator[dict[str, Any]]:
        """The warning and error records in its log's bytes [start, end)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                blob = f.read(-1 if end is None else max(0, end - start))
        except OSError:
            return
        for line in blob.decode(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("level") in ("warning", "error"):
                yield rec

    @staticmethod
    def problem(rec: dict[str, Any]) -> str:
        """What a warning or error record is counted as: its level, role and event."""
        return f"{rec['level']} {rec.get('role', '?')}/{rec.get('event', '?')}"

    def problems(self) -> dict[str, int]:
        """Warnings and errors in its log, counted by :meth:`problem` (first seen first)."""
        counts: dict[str, int] = {}
        for rec in self.warnings():
            key = self.problem(rec)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def stop(self) -> float | None:
        """SIGTERM crewletd and wait :attr:`STOP_GRACE`; SIGKILL its process group (by its
        pid) on timeout, then whatever it left behind. The seconds it took (None: never started)."""
        if self.proc is None:
            return None
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True) \
                if self.proc.poll() is None else []
        except psutil.Error:
            family = []
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.STOP_GRACE)
            except subprocess.TimeoutExpired:
                say(f"crewletd did not stop within {self.STOP_GRACE:g}s: SIGKILL")
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self.proc.wait(10)
        took = time.monotonic() - t0
        leftovers = []
        for p in family:  # crewletd should leave nothing; whatever it did leave, end it
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    say(f"left behind: pid {p.pid} {p.name()}: SIGKILL")
                    p.kill()
                    leftovers.append(p)
            except psutil.Error:
                pass
        psutil.wait_procs(leftovers, timeout=5)
        return took


class CpuMeter:
    """CPU % of named processes between :meth:`start` and :meth:`read` (100 % = one core).

    From CPU times (user + system) over wall time, so the window may span
    awaits and other work of the caller. A process gone meanwhile reads None.
    """

    def __init__(self, procs: dict[str, psutil.Process | None]):
        self.procs = {name: p for name, p in procs.items() if p is not None}
        self._t0 = 0.0
        self._cpu0: dict[str, float] = {}

    @staticmethod
    def _cpu(proc: psutil.Process) -> float | None:
        try:
            t = proc.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return None

    def start(self) -> "CpuMeter":
        self._cpu0 = {name: self._cpu(p) for name, p in self.procs.items()}
        self._t0 = time.monotonic()
        return self

    def read(self) -> dict[str, float | None]:
        wall = time.monotonic() - self._t0
        out: dict[str, float | None] = {}
        for name, proc in self.procs.items():
            before, now = self._cpu0.get(name), self._cpu(proc)
            out[name] = None if before is None or now is None or wall <= 0 \
                else max(0.0, (now - before) / wall * 100.0)
        return out


def emit(report: dict[str, Any], as_json: bool, print_text: Callable[[dict[str, Any]], None]) -> int:
    """Print *report* as JSON (``--json``) or as the script's text; exit status 0."""
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print_text(report)
    return 0


def add_smoke(ap: "argparse.ArgumentParser", argv: list[str] | None, sizes: dict[str, Any]) -> None:
    """Give *ap* a ``--smoke`` flag: every part of the bench once, with *sizes* (argparse
    ``dest`` → value) as the defaults of the options the caller does not give, so a run takes
    seconds. The suite runs each bench so (tests/integration/test_benches.py): a bench that no
    longer runs fails CI. Its figures are printed as always, beside their baselines, but at these
    sizes they are not measurements."""
    shown = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in sizes.items() if not isinstance(v, bool))
    ap.add_argument("--smoke", action="store_true",
                    help="seconds, tiny sizes, every part once: does the bench still run? "
                         "(the suite's test; figures meaningless)" + (f" [{shown}]" if shown else ""))
    if "--smoke" in (sys.argv[1:] if argv is None else argv):
        ap.set_defaults(**sizes)
