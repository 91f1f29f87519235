"""One node: its supervision tree, its endpoints, its signals and its lifetime.

The tree (DESIGN §2)::

    root      rest_for_one   [broker (embedded stream only), fleet, roles]
    roles     one_for_one    [data_applier, ingress, seats, workers] ∩ node.roles

``fleet`` is a task of crewletd (:mod:`supervisor.fleet`): the node's presence
and its company revision. When the broker dies, fleet and roles restart after
it (rest_for_one). Both levels
take intensity, period, backoff and auto_shutdown from ``supervisor.*``. With
``auto_shutdown`` other than ``never``, role children are transient and
significant: one ending by itself ends the node (the container fails fast).

crewletd's duties beside the tree: it binds ``control``, ``health`` and
``events``; it is the child subreaper and, as PID 1, reaps every orphan;
SIGTERM and SIGINT stop the node (a second one kills what is left), SIGHUP is
forwarded to every child's process group; its own loop has a watchdog (exit
75); under systemd it sends ``READY=1`` and ``WATCHDOG=1``.

Exit codes: 0 stopped, 69 gave up (restart intensity), 75 own loop wedged, 78
configuration (including a child that exited 78, and a child that could not
listen on its address: the broker's fatal line or a role's ``config_error``
event read as the key at fault, :attr:`Node.config_problem`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

import psutil
import zmq
import zmq.asyncio

import crewlet
from crewlet import bus, credentials, disk, ipc, log, redaction, runtime, sysd, tokens
from crewlet.sandbox import Sandbox
from crewlet.config import ConfigError, NodeConfig
from crewlet.config.model import pool_member
from crewlet.watchdog import Watchdog
from roles import broker
from roles.broker import routes as broker_routes
from supervisor import control, procs
from supervisor import spec as S
from supervisor.procs import EXIT_CONFIG, EXIT_OK, EXIT_UNAVAILABLE, ExitInfo
from supervisor.fleet import Fleet
from supervisor.process import ProcessHost, process_child
from supervisor.spec import StartFailed, SupFlags
from supervisor.supervisor import Supervisor, nested
from supervisor.task import task_child
from supervisor.zygote import Zygote


class Node:
    """crewletd's state for one run.

    Invariants: ``root`` is the running root supervisor (None before start);
    ``_stop_reason`` is set once a stop was asked for.
    """

    def __init__(self, cfg: NodeConfig, zygote: Zygote, seed: tuple | None = None):
        self.cfg = cfg
        self.zygote = zygote
        # (Company, source path) to apply if the fleet has no company yet.
        self.seed = seed
        self.root: Supervisor | None = None
        self.started_at = time.time()
        # This run's boot instance: what tells our leases from a previous run's.
        self.boot = uuid.uuid4().hex[:12]
        self.fleet: Fleet | None = None
        self._stop_reason: str | None = None
        self._stop = asyncio.Event()
        self._ctx = zmq.asyncio.Context()
        self._events: zmq.asyncio.Socket | None = None
        self.host = ProcessHost(cfg.run_dir, zygote, self._ctx, notify=self.publish)
        self._stats: dict[int, psutil.Process] = {}
        # The node's own record per child name. A nested supervisor that is
        # restarted starts its children's counts afresh; the node's view of a
        # role does not: restarts = starts - 1, and the last exit seen.
        self._starts: dict[str, int] = {}
        self._last_exit: dict[str, dict] = {}
        self._ready = False
        # The first configuration problem a child stated ("<file>: <key>: <problem>").
        self.config_problem: str | None = None
        self.exit_reason: str | None = None  # why the tree ended by itself
        # The node's disk as last surveyed (crewlet.disk), and the broker's
        # line saying a stream's store met a full disk (it is restarted once
        # space returns; None while the broker is whole).
        self.disk: list[disk.Space] = []
        self.disk_watch = disk.Watch.of(cfg)
        # How this node's seats run their tools (crewlet.sandbox), probed at
        # start when it runs seats; None until then, or without seats.
        self.sandbox: Sandbox | None = None
        self.broker_wounded: str | None = None
        # While a rotation holds two fleet secrets: the one each route is
        # dialled with, the one its member admits (roles.broker.routes).
        self.route_dial: dict[str, str] = {}

    # ------------------------------------------------------------- the tree

    def _flags(self, strategy: str) -> SupFlags:
        s = self.cfg.supervisor
        return SupFlags(strategy=strategy, intensity=s.intensity, period=s.period,
                        auto_shutdown=s.auto_shutdown, backoff_min=s.backoff_min,
                        backoff_max=s.backoff_max, stable_after=s.stable_after)

    def _significance(self) -> dict[str, Any]:
        if self.cfg.supervisor.auto_shutdown == S.NEVER:
            return {"restart": S.PERMANENT}
        return {"restart": S.TRANSIENT, "significant": True}

    def build_tree(self) -> Supervisor:
        cfg, s = self.cfg, self.cfg.supervisor
        dump = cfg.model_dump(mode="json")
        # The seats pool's size as resolved here, once (cfg.seats_pool): every
        # member splits the seats by it (roles/seats/pool.py), one restarted
        # alone too — not by the CPUs it finds itself then.
        dump["node"]["seats_processes"] = cfg.seats_pool

        def roles() -> Supervisor:
            children = [
                process_child(
                    self.host, name, target="crewlet.runtime:run_role",
                    kwargs={"role": role, "member": member, "config": dump, "boot": self.boot},
                    title=f"crewlet {cfg.node.id} {name}", ready_timeout=s.ready_timeout,
                    heartbeat_silence=s.wedge_after + s.heartbeat_grace,
                    pdeathsig=runtime.PARENT_GONE, shutdown=s.shutdown_timeout,
                    diagnose=self._role_problem, **self._significance())
                for name in cfg.children() for role, member in [pool_member(name)]]
            return Supervisor("roles", self._flags(S.ONE_FOR_ONE), children, notify=self.publish)

        root_children = [self.broker_child()] if cfg.stream.type == "embedded" else []
        root_children.append(self._fleet_child())
        root_children.append(nested("roles", roles, **self._significance()))
        return Supervisor("root", self._flags(S.REST_FOR_ONE), root_children, notify=self.publish)

    def broker_child(self):
        """The embedded broker (roles.broker): ready when it answers, and is ours."""
        cfg, s = self.cfg, self.cfg.supervisor
        binary = broker.find_binary(cfg)
        conf = broker.write_config(cfg, self.route_dial)  # makes the broker's credentials at first start
        url = bus.servers_of(cfg.stream)[0]
        auth = credentials.client_options(cfg.stream, cfg.run_dir)

        async def probe(pid: int) -> None:
            await broker.probe(url, asyncio.get_running_loop().time() + s.ready_timeout,
                               name=cfg.node.id, pid=pid, auth=auth)

        return process_child(
            self.host, "broker", target="roles.broker:exec_server",
            kwargs={"binary": binary, "conf": conf},
            title=f"crewlet {cfg.node.id} broker", ready_timeout=s.ready_timeout,
            heartbeat_silence=None, probe=probe, shutdown=s.broker_shutdown_timeout,
            diagnose=self._broker_problem)

    def _broker_problem(self, line: bytes) -> str | None:
        if disk.broker_store_failed(line) and self.broker_wounded is None:
            self.broker_wounded = line.decode(errors="replace").strip()
            self.publish("broker_store_failed", "error", line=self.broker_wounded,
                         then="restarted once the disk is above node.disk_floor")
        found = broker.listen_problem(self.cfg, line)
        return self._stated(*found) if found else None

    def _role_problem(self, line: bytes) -> str | None:
        found = runtime.config_problem(line)
        return self._stated(*found) if found else None

    def _stated(self, key: str | None, problem: str) -> str:
        """A child's configuration problem, named with our config file."""
        message = str(ConfigError(self.cfg.source, key, problem))
        if self.config_problem is None:
            self.config_problem = message
        return message

    def _fleet_child(self):
        """The node's membership in the fleet, a task of crewletd (supervisor.fleet)."""
        fleet: dict[str, Fleet] = {}

        async def setup() -> None:
            fleet["now"] = self.fleet = Fleet(self.cfg, self.boot, self.publish, self.broadcast,
                                              seed=self.seed, zctx=self._ctx, children=self.children_brief,
                                              sandbox=self.sandbox_condition)
            await self.fleet.setup()

        async def run() -> None:
            await fleet["now"].run()

        async def teardown() -> None:
            await fleet["now"].teardown()

        return task_child("fleet", setup=setup, run=run, teardown=teardown,
                          ready_timeout=self.cfg.supervisor.ready_timeout,
                          shutdown=self.cfg.supervisor.shutdown_timeout)

    # --------------------------------------------------------------- running

    async def run(self) -> int:
        """Run the node until stopped or given up; returns crewletd's exit code."""
        loop = asyncio.get_running_loop()
        watchdog = Watchdog(self.cfg.supervisor.wedge_after)
        watchdog.start()
        self.zygote.attach()
        await self.host.open()
        self._events = self._bind(zmq.PUB, "events")
        control_sock = self._bind(zmq.ROUTER, "control")
        serving = asyncio.create_task(control.serve(self, control_sock))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name, True)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
        loop.add_signal_handler(signal.SIGCHLD, self.host.reap)
        self.host.reap()  # anything that ended before the handler was in place
        sampler = asyncio.create_task(self._sample_stats())
        pinger = asyncio.create_task(self._systemd_watchdog())
        looker = asyncio.create_task(self._watch_disk())
        if "seats" in self.cfg.node.roles:
            asyncio.create_task(self._probe_sandbox())
        try:
            return await self._supervise()
        finally:
            sysd.notify("STOPPING=1")
            for task in (serving, sampler, pinger, looker):
                task.cancel()
            await self._kill_leftovers()
            watchdog.stop()
            control_sock.close()
            self._events.close()
            self.host.close()
            self._ctx.term()

    async def _supervise(self) -> int:
        if self.cfg.stream.type == "embedded":
            # Before the broker's config is written: which secret each member
            # admits, while a rotation holds two (one URL per member, never both).
            self.route_dial, told = await broker_routes.dial_secrets(self.cfg)
            if told:
                self.publish("broker_routes_asked", routes=told)
        self.root = self.build_tree()
        self.publish("node_starting", roles=self.cfg.node.roles, version=crewlet.__version__)
        starting = asyncio.create_task(self.root.start())
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            # Asked to stop while starting: abandon the start (it stops what
            # it had started, and the child it was waiting for).
            starting.cancel()
        try:
            await starting
        except StartFailed as exc:
            stop.cancel()
            return self._exit_code(exc.info)
        except asyncio.CancelledError:
            self.publish("node_stopped", reason=self._stop_reason)
            return EXIT_OK
        self._ready = True
        sysd.notify("READY=1")
        self._inject_own_faults()
        self.publish("node_ready", children=[c["name"] for c in self.root.children()])
        await asyncio.wait({stop, self.root.exited}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if self.root.exited.done():
            return self._exit_code(self.root.exited.result())
        self.publish("node_stopping", reason=self._stop_reason)
        await self.root.stop()
        self.publish("node_stopped")
        return EXIT_OK

    def _inject_own_faults(self) -> None:
        """``debug.faults`` for crewletd itself: wedge its loop (tests its watchdog)."""
        loop = asyncio.get_running_loop()
        for fault in self.cfg.debug.faults:
            if fault.role == "crewletd":
                def wedge(seconds: float = fault.seconds) -> None:
                    self.publish("fault_injected", "warning", kind="wedge")
                    time.sleep(seconds)  # blocks the loop on purpose
                loop.call_later(fault.after, wedge)

    def _exit_code(self, info: ExitInfo) -> int:
        code = info.code if info.code in (EXIT_OK, EXIT_CONFIG) else EXIT_UNAVAILABLE
        self.exit_reason = info.reason
        self.publish("node_exiting", "error" if code else "info", code=code, reason=info.reason)
        return code

    def request_stop(self, reason: str, force_if_repeated: bool = False) -> None:
        if self._stop.is_set():
            if not force_if_repeated:
                return
            # Asked twice: stop waiting for children to end politely.
            self.publish("node_stop_forced", "warning", reason=reason)
            for child in self._process_children():
                procs.signal_group(child["pid"], signal.SIGKILL)
            return
        self._stop_reason = reason
        self._stop.set()
        if self.fleet is not None:
            self.fleet.leaving = True  # the roles stop before it: it then ends the seats' life

    def _forward(self, sig: int) -> None:
        """As tini does: pass the signal on to every child's process group."""
        self.publish("signal_forwarded", signal=signal.Signals(sig).name)
        for child in self._process_children():
            procs.signal_group(child["pid"], sig)

    async def _kill_leftovers(self) -> None:
        """After a stop nothing we started may remain: SIGKILL any descendant
        still alive (the zygote aside, which exits on its own)."""
        try:
            rest = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        for proc in rest:
            if proc.pid != self.zygote.pid:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
        await self.zygote.aclose()
        self.host.reap()

    # ---------------------------------------------------------------- status

    def broadcast(self, topic: str, payload: dict) -> None:
        """Publish *payload* on ``events`` under *topic*, without logging it.
        A company handed out is first learned from: the secrets it names, and
        the node's, are kept out of every line crewletd forwards
        (:func:`crewlet.redaction.learn_company`, :func:`crewlet.log.forward`)."""
        if topic == "company":
            redaction.learn_company(payload.get("company"), self.cfg)
        if self._events is not None:
            try:
                self._events.send_multipart([topic.encode(), ipc.pack(payload)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def publish(self, name: str, level: str = "info", **fields: Any) -> None:
        """Log an event and publish it on ``events`` for local subscribers."""
        log.event(name, level, **fields)
        child = fields.get("child")
        if name == "child_started":
            self._starts[child] = self._starts.get(child, 0) + 1
        elif name in ("child_exited", "child_stopped", "child_start_failed"):
            self._last_exit[child] = {"code": fields.get("code"), "signal": fields.get("signal"),
                                      "reason": fields.get("reason"), "at": time.time()}
        if self._events is not None:
            try:
                self._events.send_multipart([name.encode(), ipc.pack(fields)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _process_children(self) -> list[dict]:
        """Running children that are processes of their own (not crewletd's tasks)."""
        if self.root is None:
            return []
        return [c for c in self.root.children()
                if c["type"] == S.WORKER and c["pid"] and c["pid"] != os.getpid()]

    def expected_children(self) -> list[str]:
        """Every worker child this node runs when all is well, in start order."""
        broker = ["broker"] if self.cfg.stream.type == "embedded" else []
        return broker + ["fleet"] + self.cfg.children()

    def children_brief(self) -> list[dict[str, Any]]:
        """Each child's name, state, restarts and last exit: what this node's
        presence tells the fleet (ingress's dashboards of other nodes show it)."""
        return [{"name": c["name"], "state": c["state"], "pid": c.get("pid"),
                 "restarts": c.get("restarts", 0), "last_exit": c.get("last_exit")}
                for c in self._children_rows()]

    def _children_rows(self) -> list[dict[str, Any]]:
        """Every child this node should run, as its supervisor has it."""
        rows = []
        current = {c["name"]: c for c in (self.root.children() if self.root else [])
                   if c["type"] == S.WORKER}
        for name in self.expected_children():
            # Not under a running supervisor (it is being started or restarted).
            c = current.get(name) or {"name": name, "type": S.WORKER, "pid": None,
                                      "state": "stopped", "uptime_s": None, "started_at": None}
            rows.append({**c, "restarts": max(0, self._starts.get(name, 0) - 1),
                         "last_exit": c.get("last_exit") or self._last_exit.get(name)})
        return rows

    def status(self) -> dict[str, Any]:
        children = []
        for c in self._children_rows():
            proc = self._stats.get(c["pid"]) if c["pid"] else None
            cpu, rss = None, None
            if proc is not None:
                try:
                    cpu, rss = proc.cpu_percent(None), proc.memory_info().rss
                except psutil.Error:
                    pass
            stats = self.host.stats.get(c["pid"]) if c["pid"] else None
            children.append({**c, "cpu_percent": cpu, "rss_bytes": rss, "stats": stats})
        me = psutil.Process()
        return {
            "node": {
                "id": self.cfg.node.id, "roles": list(self.cfg.node.roles),
                "labels": dict(self.cfg.node.labels), "pid": os.getpid(),
                "zygote_pid": self.zygote.pid,
                "version": crewlet.__version__, "started_at": self.started_at,
                "uptime_s": round(time.time() - self.started_at, 3),
                "data_dir": self.cfg.data_dir, "config": self.cfg.source,
                "broker": {"type": self.cfg.stream.type, "servers": bus.servers_of(self.cfg.stream)},
                "api": self._api(),
                "ready": self._ready and not self._stop.is_set(),
                "disk": self.disk_condition(),
                "sandbox": self.sandbox_condition(),
                # The fleet's secrets as this node's crewletd opens them (never a value).
                "secrets": self.fleet.vault.stats() if getattr(self.fleet, "vault", None) else None,
                "stopping": self._stop.is_set(),
                "cpu_percent": me.cpu_percent(None), "rss_bytes": me.memory_info().rss,
            },
            "children": children,
            "supervisors": [
                {"name": sup.name, "strategy": sup.flags.strategy,
                 "restarts_in_period": sup.restarts_in_period(),
                 "intensity": sup.flags.intensity, "period": sup.flags.period}
                for sup in self._supervisors()],
        }

    def _api(self) -> dict[str, Any] | None:
        """Where this node's HTTP API and dashboard are, and where its first
        token is kept (None: tokens are configured, or it has no ingress)."""
        if "ingress" not in self.cfg.node.roles:
            return None
        ingress = self.cfg.ingress
        host, _, port = ingress.listen.rpartition(":")
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return {"url": f"http://{host}:{port}/",
                "token_file": None if ingress.configured_tokens else tokens.admin_token_path(self.cfg.run_dir)}

    def _supervisors(self) -> list[Supervisor]:
        found, todo = [], [self.root] if self.root else []
        while todo:
            sup = todo.pop(0)
            found.append(sup)
            todo.extend(c.running.supervisor for c in sup._children
                        if c.running is not None and hasattr(c.running, "supervisor"))
        return found

    async def _sample_stats(self) -> None:
        """Keep a psutil handle per child so CPU % covers the last second."""
        while True:
            live = {c["pid"] for c in self._process_children()}
            for pid in list(self._stats):
                if pid not in live:
                    del self._stats[pid]
            for pid in live - self._stats.keys():
                try:
                    self._stats[pid] = psutil.Process(pid)
                    self._stats[pid].cpu_percent(None)
                except psutil.Error:
                    pass
            await asyncio.sleep(1.0)

    async def _probe_sandbox(self) -> None:
        """Find out how this node's seats will run their tools (a run of
        `true` under bubblewrap, ~20 ms), for the status surfaces; the seats
        role probes and says it for itself."""
        try:
            self.sandbox = await asyncio.to_thread(Sandbox.of, self.cfg)
        except Exception as exc:  # a probe must never take the node down
            log.event("sandbox_probe_failed", "warning", error=f"{type(exc).__name__}: {exc}")

    def sandbox_condition(self) -> dict[str, Any] | None:
        """``node.sandbox`` of the status: mode, state (confined | unconfined |
        refused), confined, reason, and ``by``: the seats role's own probe
        once it reported it in its stats (its tools run under that one, and
        the two can disagree — a PATH, a restart apart), crewletd's until
        then; None before either, or without seats."""
        for child in self._process_children():
            if child["name"] == "seats":
                found = (self.host.stats.get(child["pid"]) or {}).get("sandbox")
                if isinstance(found, dict):
                    return {**found, "by": "seats"}
        return {**self.sandbox.describe(), "by": "crewletd"} if self.sandbox is not None else None

    def disk_condition(self) -> dict[str, Any]:
        """``node.disk`` of the status (crewlet.disk.condition)."""
        waiting = None
        if self.broker_wounded is not None:
            waiting = f"a stream's store met a full disk; restarted once space returns ({self.broker_wounded})"
        return disk.condition(self.disk_watch.spaces(), waiting)  # at most FRESH_FOR old

    async def _watch_disk(self) -> None:
        """Survey the disk every CHECK_EVERY s: say when it goes low and back,
        and restart a broker whose store met a full disk once it is not low."""
        was_low: str | None = None
        while True:
            # Afresh, not the status's cache: a restart on a stale "not low" would
            # bring the broker up on a disk still full.
            self.disk = disk.survey(disk.node_paths(self.cfg.data_dir), self.cfg.node.disk_floor)
            worst = disk.lowest(self.disk)
            if worst is not None and was_low is None:
                self.publish("disk_low", "error", path=worst.path, free_bytes=worst.free,
                             floor=worst.floor, reason=worst.reason())
            elif worst is None and was_low is not None:
                self.publish("disk_ok", path=was_low,
                             free_bytes={s.path: s.free for s in self.disk})
            was_low = worst.path if worst is not None else None
            if worst is None and self.broker_wounded is not None and not self._stop.is_set():
                await self._restart_broker()
            await asyncio.sleep(disk.CHECK_EVERY)

    async def _restart_broker(self) -> None:
        """nats-server answers no publish to a stream whose store met a full
        disk until it restarts (crewlet.disk): the one cure, done as
        ``crewletctl restart broker`` does it."""
        sup = self.root.find("broker") if self.root is not None else None
        if sup is None:
            return  # not running it (stream.type nats), or being restarted already
        why, self.broker_wounded = self.broker_wounded, None
        self.publish("broker_restarting", "warning", reason=f"its store met a full disk: {why}")
        try:
            await sup.restart_child("broker")
        except Exception as exc:  # its supervisor handles a failed start; say what we saw
            self.publish("broker_restart_failed", "error", error=f"{type(exc).__name__}: {exc}")

    async def _systemd_watchdog(self) -> None:
        interval = sysd.watchdog_interval()
        if interval is None:
            return
        while True:
            sysd.notify("WATCHDOG=1")  # sent from the loop: a stuck loop stops sending
            await asyncio.sleep(interval)

    def _bind(self, kind: int, name: str) -> zmq.asyncio.Socket:
        return ipc.bind(self._ctx, self.cfg.run_dir, kind, name)  # the run dir lock says we own it
