"""``crewletctl apply FILE``: store a company file as a new revision and activate it.

The file is validated first; a bad one is one line on stderr naming the
file, the key and the problem, exit 78, and nothing is sent. So is a company
whose stored revision would exceed the limit of a company revision
(``REVISION_MAX``, 64 MiB of JSON), with ``--check`` too: the line names the
size and the limit. A company of any size within it is stored in parts
(:mod:`crewlet.coord.control_plane`). Then crewletctl
dials the node's NATS (the ``stream`` section of its Tier A config: see
``crewletctl --help`` for how the config is found), appends the company as
revision n+1 in the ``config`` bucket and bumps the activation epoch, which
every node of the fleet watches. NATS unreachable (or without JetStream):
exit 69, naming the URLs tried. The node's disk below ``node.disk_floor``
(:mod:`crewlet.disk`): exit 69, "no space on <path>: N bytes free, …",
nothing sent — not a timeout of a broker that cannot store it.

:func:`with_control_plane` is shared with ``crewletctl history``, :func:`with_fleet`
with ``backup`` and ``restore``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
import nats

from crewlet import bus, credentials, disk
from crewlet.bus import servers_of
from crewlet.company import load_company
from crewlet.config import ConfigError, NodeConfig, load_node_config
from crewlet.company.model import Company
from crewlet.coord.control_plane import JS_TIMEOUT, ControlPlane, ControlPlaneError, RevisionTooLarge, check_size
from crewlet.ctl import EXIT_CONFIG, EXIT_UNREACHABLE, PROG, Ctl, fail

CONNECT_TIMEOUT = 2.0  # seconds to reach the node's NATS

T = TypeVar("T")


def node_config(ctl: Ctl) -> NodeConfig:
    """The Tier A config of the node crewletctl talks to (defaults with --data-dir)."""
    source = ctl.target.config
    if source is None or source == "<defaults>":
        return NodeConfig()
    try:
        return load_node_config(source)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", EXIT_CONFIG)


def broker_auth(ctl: Ctl, cfg) -> dict[str, str]:
    """The node's broker credentials, from its run dir (crewlet.credentials);
    exits 69 saying where it looked when they cannot be read (the node never
    started, or crewletctl runs as a user who may not read the run dir)."""
    try:
        return credentials.client_options(cfg.stream, ctl.target.run_dir)
    except (OSError, ValueError) as exc:
        fail(f"cannot read the broker's credentials: {exc} "
             f"({ctl.target.where()})", EXIT_UNREACHABLE)


def with_control_plane(ctl: Ctl, work: Callable[[ControlPlane], Awaitable[T]]) -> T:
    """Run ``work(control_plane)`` on a fresh connection to the node's NATS;
    exits 69 when NATS cannot be reached or the control plane fails."""
    return with_fleet(ctl, lambda nc, js, plane: work(plane))


def with_fleet(ctl: Ctl, work: Callable[..., Awaitable[T]]) -> T:
    """Run ``work(nc, js, control_plane)`` on a fresh connection to the
    node's NATS (the JetStream context through the fleet's domain from a
    leaf); exits 69 when NATS cannot be reached or the control plane fails."""
    cfg = node_config(ctl)
    servers = servers_of(cfg.stream)
    where = ", ".join(servers)
    auth = broker_auth(ctl, cfg)

    async def run() -> T:
        errors: list[Exception] = []

        async def keep(exc: Exception) -> None:
            errors.append(exc)  # reported once, below, instead of logged by nats-py

        try:
            # nats-py's first connect walks the pool max_reconnect_attempts+1 times
            # (0 means forever) even without reconnects: make that one quick pass.
            nc = await nats.connect(servers, name=PROG, connect_timeout=CONNECT_TIMEOUT,
                                    allow_reconnect=False, max_reconnect_attempts=1,
                                    reconnect_time_wait=0.1, error_cb=keep, **auth)
        except Exception as exc:  # refused, timed out, bad greeting: all "unreachable"
            why = errors[-1] if errors else exc  # the cause, rather than "no servers available"
            text = str(why).strip()
            raise ControlPlaneError(f"cannot reach NATS at {where}: {type(why).__name__}"
                                    + (f": {text}" if text else "")) from exc
        try:
            # Through the domain from a leaf (a node without data), as every role does.
            js = bus.jetstream(nc, cfg.stream, timeout=JS_TIMEOUT)
            plane = await ControlPlane.open(js, cfg.stream.replicas)
            return await work(nc, js, plane)
        except ControlPlaneError as exc:
            raise ControlPlaneError(f"{exc} (NATS at {where})") from exc
        finally:
            await nc.close()

    space = disk.Watch(ctl.target.data_dir, cfg.node.disk_floor)
    try:
        return asyncio.run(run())
    except ControlPlaneError as exc:
        why = space.explain(exc)  # a broker that cannot store answers nothing: say why
        fail(f"{why} ({exc})" if why else str(exc), EXIT_UNREACHABLE)


def loadable(file: str) -> Company:
    """The company in *file*, valid and small enough to store; else one line
    naming the file and the problem, exit 78 (nothing is sent)."""
    try:
        company = load_company(file)
        try:
            check_size(company)
        except RevisionTooLarge as exc:
            raise ConfigError(file, None, str(exc)) from None
    except ConfigError as exc:
        fail(str(exc), EXIT_CONFIG)
    return company


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--check", is_flag=True, help="Only validate FILE and print its digest; send nothing.")
@click.pass_obj
def apply(ctl: Ctl, file: str, check: bool) -> None:
    """Apply a company file: store it as a new revision and activate it.

    Every node of the fleet then applies the new revision. Exits 0 when
    stored and activated, 78 when FILE is invalid or its revision would be
    over 64 MiB of JSON (nothing is sent), 69 when the node's NATS cannot
    be reached or its disk is below node.disk_floor ("no space on PATH").
    """
    company = loadable(file)
    if check:
        click.echo(f"valid {file}: {len(company.seats)} seats, digest {company.digest()}")
        return
    try:
        disk.Watch(ctl.target.data_dir, node_config(ctl).node.disk_floor).refuse_if_low("nothing was applied")
    except disk.NoSpace as exc:
        fail(str(exc), EXIT_UNREACHABLE)
    rev, epoch = with_control_plane(ctl, lambda plane: plane.apply(company, os.path.abspath(file)))
    click.echo(f"applied {file}: revision {rev} (epoch {epoch}), {len(company.seats)} seats, "
               f"digest {company.digest()}")
