"""``crewletctl status``: the node, its children and the fleet, once, as JSON, or live.

On a data node the status has an ``estate`` line: this node's applier's
last report (how far its copy applied the log, in service or why not, ops
applied per second, requests answered, events kept). The fleet's table has
a COPY column, each node's copy as the fleet last heard of it (on a
terminal too narrow for the column, a ``copies`` line under the table), and
under it the copies out of service, evicted or lagging, and why.
"""

from __future__ import annotations

import json
import os
import sys
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import click

from crewlet import ipc
from crewlet.ctl import (EXIT_NOT_RUNNING, EXIT_OK, PIPE_WIDTH, WATCH_CALL_TIMEOUT, WATCH_INTERVAL,
                         WATCH_MAX_INTERVAL, WATCH_MIN_INTERVAL, Ctl, request)
from crewlet.ctl.plain import normalize

if TYPE_CHECKING:
    from rich.console import Console, RenderableType


def exit_code(status: dict[str, Any]) -> int:
    """0 when the node is not stopping, every child is running and its disk
    is above its floor (and the broker is not waiting for space), else 3."""
    node = status.get("node") or {}
    children = status.get("children") or []
    space = node.get("disk") if isinstance(node.get("disk"), dict) else {}
    healthy = (not node.get("stopping") and all(c.get("state") == "running" for c in children)
               and not space.get("low") and not space.get("broker"))
    return EXIT_OK if healthy else EXIT_NOT_RUNNING


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON (stable keys).")
@click.option("--watch", "-w", is_flag=True, help="Keep showing the status, live, until Ctrl-C.")
@click.option("--interval", "-n", default=WATCH_INTERVAL, show_default=True, metavar="SECONDS",
              type=click.FloatRange(WATCH_MIN_INTERVAL, WATCH_MAX_INTERVAL, clamp=True),
              help=f"Refresh period of --watch, clamped to {WATCH_MIN_INTERVAL:g}..{WATCH_MAX_INTERVAL:g}.")
@click.option("--no-fleet", "no_fleet", is_flag=True,
              help="Leave out the fleet section (table and live views; --json always has `fleet`).")
@click.pass_obj
def status(ctl: Ctl, as_json: bool, watch: bool, interval: float, no_fleet: bool) -> None:
    """Show the node, its children, its supervisors and the fleet.

    On a data node, the `estate` line is this node's copy of the estate:
    applied of the log, in service or why not, ops/s, requests, events kept.

    The fleet section is the fleet as this node sees it: the company
    revision in force here (and why it refused a newer one), the live nodes
    with the revision each applied and their copy of the estate (COPY:
    applied, `out`, `evicted`, how far behind the furthest copy, `no copy`
    without the data role; why under the table), the seats and duties they
    hold. In --json it is `fleet`, null while the node is in no fleet; each
    node's `estate` is its applier's record, `evicted` the eviction if any.

    The `disk` line is the free space on the node's filesystems against
    node.disk_floor; below it, the path and its free bytes.

    Exits 0 when every child is running, 3 when one is not or the disk is
    below its floor, 69 when no node answers; the fleet does not change the
    exit code. With --watch, exits 0
    on Ctrl-C and keeps retrying while the node is unreachable.
    """
    if as_json and watch:
        raise click.UsageError("--json and --watch cannot be combined")
    if watch:
        sys.exit(_watch(ctl, interval, fleet=not no_fleet))
    result = normalize(ctl.ask("status"))
    show(result, as_json, lambda render: render.status_view(result, fleet=not no_fleet))
    sys.exit(exit_code(result))


def show(result: Any, as_json: bool, view: Callable[[ModuleType], RenderableType]) -> None:
    """Print *result* as JSON (``--json``), else the rich table ``view(render)``
    makes of it, *render* being :mod:`crewlet.ctl.render`: imported only then,
    as it and rich are most of what a ``--json`` call would import."""
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        from crewlet.ctl import render

        _console().print(view(render))


def _console() -> Console:
    """A terminal's width, or a wide one when piped, so rows do not wrap."""
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPE_WIDTH)


def _watch(ctl: Ctl, interval: float, fleet: bool = True) -> int:
    from rich.console import Console
    from rich.live import Live

    from crewlet.ctl.render import watch_view

    target = ctl.target
    last: dict[str, Any] | None = None
    last_ok: float | None = None
    try:
        with Live(auto_refresh=False, console=Console()) as live:
            while True:
                started = time.monotonic()
                error = None
                try:
                    reply = request(target, "status", WATCH_CALL_TIMEOUT)
                    if reply.get("ok"):
                        last, last_ok = normalize(reply.get("result") or {}), time.time()
                    else:
                        error = f"crewletd refused: {reply.get('error')}"
                except ipc.NodeUnreachable as exc:
                    error = str(exc)
                live.update(watch_view(last, error, target.where(), last_ok, interval, fleet=fleet),
                            refresh=True)
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return EXIT_OK
