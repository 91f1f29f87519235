"""``crewletd``: start a node, or check a node's config.

``crewletd start`` is the root supervisor (and a container's PID 1). In
order, before any thread, loop or ZeroMQ context exists:

0. restrict the umask (:func:`crewlet.private.restrict`), take systemd's
   variables out of the environment, and start the zygote (fork+exec,
   :mod:`supervisor.zygote`) with both: its preload (~1.4 s of imports)
   then runs while this process imports the rest of itself and reads its
   config, rather than after. It is named once the config says the node's
   id; a crewletd that exits 78 below kills it first;
1. load and validate Tier A config, and the ``--company`` file if given (its
   revision must fit the broker's message) — a problem is one line naming the
   file, key and problem, and exit 78;
2. make the data dir the service user's only (:mod:`crewlet.private`: the
   umask first, then what others could reach is fixed, and said), and take
   its lock, so two crewletd never share one run dir;
3. bind and close every address the node will listen on
   (:func:`crewlet.ports.preflight`) — one that cannot be bound (in use, not
   an address of this machine, not resolvable) is one line naming the file
   and key, and exit 78;
4. become the child subreaper, title this process and the zygote;
5. run the node's loop (:class:`supervisor.node.Node`).

This module imports only what step 0 needs at its top; the rest is
imported after it (that is what the zygote's preload overlaps).

A child that exits 78 makes crewletd exit 78 too, the child's problem (one
line naming the file and key, where the child said which) on stderr.
"""

from __future__ import annotations

import fcntl
import os
import sys

import click

from crewlet import private, sysd
from supervisor.procs import EXIT_CONFIG
from supervisor.zygote import Zygote


def _fail_config(message: str) -> None:
    click.echo(f"crewletd: configuration error: {message}", err=True)
    sys.exit(EXIT_CONFIG)


def _load(path: str | None):
    from crewlet.config import ConfigError, load_node_config
    try:
        return load_node_config(path)
    except ConfigError as exc:
        _fail_config(str(exc))


def _private_data_dir(cfg) -> None:
    """The data dir is the service user's only (crewlet.private): what others
    could reach is fixed, and said; what cannot be fixed is exit 78."""
    from crewlet import log
    try:
        fixed = private.tighten(cfg.data_dir)
    except private.NotPrivate as exc:
        _fail_config(f"{cfg.source}: data_dir: {exc}")
    if fixed:
        log.event("data_dir_tightened", "warning", data_dir=cfg.data_dir, count=len(fixed),
                  paths=fixed[:private.SHOWN])


def _lock_data_dir(cfg) -> int:
    """Hold ``run/crewletd.lock`` for our lifetime; refuse a second crewletd."""
    from crewlet import ipc
    from crewlet.estate.floor import wipe_scratch
    from crewlet.vault.keys import ensure_own
    try:
        ipc.ensure_run_dir(cfg.run_dir)
    except (OSError, ValueError) as exc:
        _fail_config(f"{cfg.source}: data_dir: {exc}")
    path = os.path.join(cfg.run_dir, "crewletd.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        _fail_config(f"{cfg.source}: data_dir: another crewletd (pid {holder}) is running "
                     f"on {cfg.data_dir}")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    # The scratch store is deleted at every boot (crewlet.estate.floor); only
    # now, holding the lock, is no other crewletd using it.
    wipe_scratch(cfg.data_dir)
    # A single node's own vault key, before any role would read it (crewlet.vault).
    try:
        ensure_own(cfg)
    except OSError as exc:
        _fail_config(f"{cfg.source}: data_dir: cannot make the vault key: {exc.strerror or exc}")
    return fd


@click.group()
@click.version_option(package_name="crewlet")
def cli() -> None:
    """crewlet's node daemon."""


@cli.command()
@click.option("--config", "-c", "config_path", type=click.Path(dir_okay=False),
              help="Tier A config file (default: $CREWLET_CONFIG, /etc/crewlet/crewlet.yaml, "
                   "else built-in defaults).")
@click.option("--company", "company_path", type=click.Path(dir_okay=False),
              help="A company file to apply once the node has joined, if the fleet has no "
                   "company yet (as `crewletctl apply` would); ignored when one is active.")
def start(config_path: str | None, company_path: str | None) -> None:
    """Start this node: the broker, then its roles; runs until stopped."""
    # Before anything is created: every file of the node is its user's only.
    private.restrict()
    sysd.take_environment()
    zygote = Zygote(title="crewlet zygote")  # named below, once the config says the node's id
    zygote.start()
    try:
        node, lock = _prepare(config_path, company_path, zygote)
    except BaseException:
        zygote.kill()  # exit 78 (or an error) before the node ran: nothing left behind
        raise
    from crewlet import log
    from crewlet.runtime import LEFTOVERS, run_loop
    from roles.broker import BrokerNotFound
    cfg = node.cfg
    try:
        # Bounded: a task a bounded stop left behind must not hold the exit.
        code = run_loop(node.run(), leftovers=LEFTOVERS)
    except BrokerNotFound as exc:
        zygote.close()
        _fail_config(f"{cfg.source}: {exc}")
    finally:
        os.close(lock)
    log.event("crewletd_exit", code=code)
    if code == EXIT_CONFIG:
        click.echo(f"crewletd: configuration error: {node.config_problem or node.exit_reason}",
                   err=True)
    sys.exit(code)


def _prepare(config_path: str | None, company_path: str | None, zygote: Zygote):
    """Steps 1–4 of the module docstring; the node to run and the lock's fd."""
    from crewlet import log, ports
    from crewlet.company import load_company
    from crewlet.config import ConfigError
    from crewlet.coord.control_plane import RevisionTooLarge, check_size
    from supervisor import procs
    from supervisor.node import Node

    cfg = _load(config_path)
    seed = None
    if company_path is not None:
        try:
            seed = (load_company(company_path), os.path.abspath(company_path))
            check_size(seed[0])  # refused now, not as a node that cannot store it (nor stop)
        except RevisionTooLarge as exc:
            _fail_config(f"{company_path}: {exc}")
        except ConfigError as exc:
            _fail_config(str(exc))
    log.configure(node=cfg.node.id, role="crewletd", level=cfg.log.level, fmt=cfg.log.format)
    for warning in cfg.warnings:
        log.event("config_warning", "warning", message=warning)
    _private_data_dir(cfg)
    lock = _lock_data_dir(cfg)
    try:
        ports.preflight(cfg)
    except ConfigError as exc:
        _fail_config(str(exc))
    try:
        procs.set_child_subreaper()
    except OSError as exc:  # not Linux-like enough; orphans go to init instead
        log.event("subreaper_unavailable", "warning", error=str(exc))
    procs.set_title(f"crewletd {cfg.node.id} supervisor")
    zygote.retitle(f"crewlet {cfg.node.id} zygote")
    log.event("crewletd_starting", pid=os.getpid(), config=cfg.source, data_dir=cfg.data_dir,
              pid1=os.getpid() == 1)
    return Node(cfg, zygote, seed=seed), lock


@cli.command("check-config")
@click.argument("path", type=click.Path(dir_okay=False))
def check_config(path: str) -> None:
    """Validate a Tier A config file without starting anything."""
    cfg = _load(path)
    for warning in cfg.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{path}: ok (node {cfg.node.id}, roles {', '.join(cfg.node.roles)}, "
               f"data_dir {cfg.data_dir})")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
