"""``crewletctl``: ask a running crewletd about its node, or tell it what to do.

Finding the node: the control socket is ``<data_dir>/run/control``. The data
dir is ``--data-dir`` if given, else the one in the Tier A config
(``--config``, else ``$CREWLET_CONFIG``, ``/etc/crewlet/crewlet.yaml``, else
the defaults, ``$CREWLET_DATA_DIR`` among them). The config is read only
when a command needs the node, so ``--help`` works with a broken one.

Exit codes (sysexits where one fits): 0 ok, 1 crewletd refused, 2 bad
input (click's usage errors, and an argument that cannot be sent: not UTF-8,
a number past 64 bits), 3 ``status`` found a child not running, 69 no node
reachable, 78 configuration error. Bad input is one line, never a traceback.

One module per command, named as the command (``fleet-secret`` is
:mod:`crewlet.ctl.fleet_secret`), its docstring the command's help, and
loaded when its command runs: a call imports what its own command needs
and no other's (nats, pydantic's models, rich). ``COMMANDS`` names them,
each with its summary, the first sentence of its help, which ``--help``
lists without importing any (tests/unit/test_ctl_commands.py checks that
they agree). Rendering lives in :mod:`crewlet.ctl.render` (rich), and what
is printed without rich, ``--json``'s keys and one-line answers, in
:mod:`crewlet.ctl.plain`.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import click
import zmq

from crewlet import ipc

# Exit codes.
EXIT_OK = 0
EXIT_REFUSED = 1        # crewletd answered ok: false
EXIT_USAGE = 2          # bad input, as click's own usage errors
EXIT_NOT_RUNNING = 3    # status: some child is not running (LSB "not running")
EXIT_UNREACHABLE = 69   # EX_UNAVAILABLE: no crewletd answered
EXIT_CONFIG = 78        # EX_CONFIG, as ConfigError.EXIT_CODE (crewlet.config: imported to read a config)

# Timeouts and intervals, in seconds.
CALL_TIMEOUT = 3.0          # status, stop and the reachability check before restart
RESTART_TIMEOUT = 60.0      # crewletd answers restart once the child is ready again
STOP_WAIT = 120.0           # stop --wait: give up waiting after this long
STOP_POLL = 0.25            # stop --wait: how often to ask whether it still answers
DRAIN_POLL = 0.5            # drain --wait: how often to ask what the node still holds (a whole status)
WATCH_INTERVAL = 1.0        # status --watch: default refresh
WATCH_MIN_INTERVAL = 0.1    # --interval is clamped into [min, max]
WATCH_MAX_INTERVAL = 1.0
WATCH_CALL_TIMEOUT = 1.0    # one status request while watching

PROG = "crewletctl"
PIPE_WIDTH = 160  # columns for tables when stdout is not a terminal (and $COLUMNS unset)


@dataclass(frozen=True)
class Target:
    """Where a node's control socket is, and how we came to look there."""

    data_dir: str
    origin: str        # e.g. "--data-dir", "--config /etc/x.yaml", "defaults ($CREWLET_DATA_DIR)"
    config: str | None  # the config file read, "<defaults>", or None with --data-dir

    @property
    def run_dir(self) -> str:
        return os.path.join(self.data_dir, "run")

    @property
    def control_socket(self) -> str:
        return os.path.join(self.run_dir, "control")

    def where(self) -> str:
        """One line for "it is not there" messages."""
        return f"looked for the control socket {self.control_socket} (data dir from {self.origin})"


def _defaults_origin() -> str:
    env = os.environ
    if env.get("CREWLET_DATA_DIR"):
        return "defaults ($CREWLET_DATA_DIR)"
    if env.get("XDG_DATA_HOME"):
        return "defaults ($XDG_DATA_HOME/crewlet)"
    return "defaults (~/.local/share/crewlet)"


def locate(config_path: str | None, data_dir: str | None) -> Target:
    """The node to talk to; raises :class:`ConfigError` for a bad config."""
    if data_dir:
        return Target(os.path.abspath(os.path.expanduser(data_dir)), "--data-dir", None)
    from crewlet.config import load_node_config
    from crewlet.config.load import CONFIG_ENV, DEFAULT_CONFIG_PATHS

    cfg = load_node_config(config_path)
    if config_path is not None:
        origin = f"--config {cfg.source}"
    elif os.environ.get(CONFIG_ENV):
        origin = f"${CONFIG_ENV} ({cfg.source})"
    elif cfg.source in DEFAULT_CONFIG_PATHS:
        origin = cfg.source
    else:
        origin = _defaults_origin()
    if cfg.source != "<defaults>" and "data_dir" not in cfg.model_fields_set:
        origin += f", which sets no data_dir: {_defaults_origin()}"
    return Target(cfg.data_dir, origin, cfg.source)


class Ctl:
    """The group's options, shared by every command through ``click.pass_obj``."""

    def __init__(self, config_path: str | None, data_dir: str | None):
        self._config_path, self._data_dir = config_path, data_dir
        self._target: Target | None = None

    @property
    def target(self) -> Target:
        if self._target is None and self._data_dir:
            self._target = locate(None, self._data_dir)  # no config is read: nothing to go wrong
        elif self._target is None:
            from crewlet.config import ConfigError  # pydantic's models: only when a config is read

            try:
                self._target = locate(self._config_path, None)
            except ConfigError as exc:
                fail(f"configuration error: {exc}", EXIT_CONFIG)
        return self._target

    def ask(self, op: str, timeout: float = CALL_TIMEOUT, **args: Any) -> dict[str, Any]:
        """The ``result`` of one control request; exits 69 if no node answers
        and 1 if crewletd refuses, 2 if an argument cannot be sent at all."""
        try:
            ipc.pack(args)  # before anything is sent: lone surrogates (argv of undecodable bytes), huge ints
        except UnicodeEncodeError as exc:
            fail(f"an argument is not UTF-8 text (an undecodable byte at character {exc.start})", EXIT_USAGE)
        except (OverflowError, ValueError, TypeError) as exc:
            fail(f"an argument cannot be sent: {exc}", EXIT_USAGE)
        try:
            reply = request(self.target, op, timeout, **args)
        except ipc.NodeUnreachable as exc:
            unreachable(self.target, str(exc))
        if not reply.get("ok"):
            fail(str(reply.get("error") or "request refused"), EXIT_REFUSED)
        return reply.get("result") or {}


def request(target: Target, op: str, timeout: float, **args: Any) -> dict[str, Any]:
    """:func:`crewlet.ipc.call`, failing at once on a socket nobody listens on
    (a stopped crewletd leaves its socket files behind), and with socket
    errors (e.g. a path too long) as unreachable too."""
    _probe(target.control_socket)
    try:
        return ipc.call(target.run_dir, op, timeout, **args)
    except zmq.ZMQError as exc:
        raise ipc.NodeUnreachable(f"{target.control_socket}: {exc}") from None


def _probe(path: str) -> None:
    """Raise NodeUnreachable if connecting to unix socket *path* is refused."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(path)
        except ConnectionRefusedError:
            raise ipc.NodeUnreachable(f"nothing listens on {path}: crewletd is not running (stale socket)") from None
        except FileNotFoundError:
            raise ipc.NodeUnreachable(f"no control socket at {path}") from None
        except OSError:
            pass  # anything else: let ipc.call try and say what it finds


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"{PROG}: {message}", err=True)
    sys.exit(code)


def unreachable(target: Target, reason: str) -> NoReturn:
    click.echo(f"{PROG}: no crewlet node reachable: {reason}", err=True)
    fail(target.where(), EXIT_UNREACHABLE)


# Every command, by name, with its summary: the first sentence of its help.
COMMANDS = {
    "status": "Show the node, its children, its supervisors and the fleet.",
    "restart": "Restart CHILD and wait until it is ready again.",
    "stop": "Stop the node and wait until it is gone (as SIGTERM to crewletd).",
    "apply": "Apply a company file: store it as a new revision and activate it.",
    "history": "List the company revisions, oldest first; * marks the active one.",
    "schedules": "Show each schedule's next and last fire, and which node fired it.",
    "send": 'Put TEXT in SEAT\'s mailbox (TEXT "-": read it from stdin).',
    "seats": "Show every seat: owner, mailbox, dead letters and last turn.",
    "dlq": "List dead letters, or put one back in its mailbox.",
    "outbox": "What became of the notifications (emails out), oldest change first.",
    "tasks": "List the tracker's tasks, newest first, or show task ID.",
    "pages": "List the knowledge base's pages, or show the page at PATH.",
    "search": "Search the knowledge base's pages for the words of QUERY.",
    "skills": "The company's skills: list, read, push, retire, promote drafts.",
    "evict": "Take NODE's copy of the estate out of service, or with --undo put it back.",
    "drain": "Drain NODE (default: this node): it hands its work over and serves nothing.",
    "undrain": "Put NODE (default: this node) back to work after `crewletctl drain`.",
    "secret": "Set, list or remove the fleet's secrets (values are never shown).",
    "mcp": "Serve the company as MCP tools on stdin/stdout (for a desktop agent).",
    "token": "Make an API token for `Authorization: Bearer <token>`.",
    "fleet-secret": "Make the fleet secret file PATH (stream.fleet_credentials).",
    "backup": ("Back up the company into DEST: this node's copy of the estate (with its log sequence), "
               "the files' bytes, and the company revision in force."),
    "restore": "Start a new fleet from the backup in SRC: its estate, files and company.",
}


class LazyGroup(click.Group):
    """Click's lazy group: a command's module is imported when the command
    runs, never to list the commands."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = cmd_name.replace("-", "_")
        return getattr(importlib.import_module(f"{__name__}.{module}"), module)

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            # click's "Did you mean" draws on self.commands, empty here.
            raise click.exceptions.NoSuchCommand(exc.command_name, possibilities=COMMANDS, ctx=ctx) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Stand-ins holding the summaries, laid out by click's own code: a
        # summary shortens to the width as the whole help would.
        stand_ins = click.Group(commands=[click.Command(name, help=summary)
                                          for name, summary in COMMANDS.items()])
        stand_ins.format_commands(ctx, formatter)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "-c", "config_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Tier A config file of the node (default: $CREWLET_CONFIG, "
                   "/etc/crewlet/crewlet.yaml, else built-in defaults).")
@click.option("--data-dir", type=click.Path(file_okay=False), metavar="PATH",
              help="The node's data dir; overrides the config.")
@click.version_option(package_name="crewlet")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, data_dir: str | None) -> None:
    """Control a crewlet node through its crewletd."""
    ctx.obj = Ctl(config_path, data_dir)


def main() -> None:
    cli(prog_name=PROG)
