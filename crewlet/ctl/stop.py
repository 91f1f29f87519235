"""``crewletctl stop``: stop the whole node, as SIGTERM to crewletd does."""

from __future__ import annotations

import time

import click

from crewlet import ipc
from crewlet.ctl import CALL_TIMEOUT, EXIT_REFUSED, STOP_POLL, STOP_WAIT, Ctl, fail, request


@click.command()
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until crewletd no longer answers.")
@click.option("--timeout", default=STOP_WAIT, show_default=True, metavar="SECONDS",
              type=click.FloatRange(min=0.0), help="How long --wait waits.")
@click.pass_obj
def stop(ctl: Ctl, wait: bool, timeout: float) -> None:
    """Stop the node: its children in reverse start order, then crewletd.

    Exits 0 once stopped (or once asked, with --no-wait), 1 if the node still
    answers after --timeout, 69 when no node answers in the first place.
    """
    node_id = (ctl.ask("status", CALL_TIMEOUT).get("node") or {}).get("id", "?")
    ctl.ask("stop", CALL_TIMEOUT)
    click.echo(f"stopping node {node_id}")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            request(ctl.target, "status", min(1.0, max(0.1, deadline - time.monotonic())))
        except ipc.NodeUnreachable:
            click.echo("stopped")
            return
        time.sleep(STOP_POLL)
    fail(f"node {node_id} still answers after {timeout:g}s", EXIT_REFUSED)
