"""``crewletctl stop``: stop the whole node, as SIGTERM to crewletd does.

``--wait`` polls: first until the control socket stops answering, then until
crewletd has let go of ``run/crewletd.lock`` (it holds that lock for its
whole life), so "stopped" means the process is gone.
"""

from __future__ import annotations

import fcntl
import os
import time

import click

from crewlet import ipc
from crewlet.ctl import CALL_TIMEOUT, EXIT_REFUSED, STOP_POLL, STOP_WAIT, Ctl, fail, request

LOCK_FILE = "crewletd.lock"


@click.command()
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until crewletd has exited.")
@click.option("--timeout", default=STOP_WAIT, show_default=True, metavar="SECONDS",
              type=click.FloatRange(min=0.0), help="How long --wait waits.")
@click.pass_obj
def stop(ctl: Ctl, wait: bool, timeout: float) -> None:
    """Stop the node and wait until it is gone (as SIGTERM to crewletd).

    Children stop in reverse start order, then crewletd exits. Exits 0 once
    stopped (or once asked, with --no-wait), 1 if the node is still there
    after --timeout, 69 when no node answers in the first place.
    """
    node_id = (ctl.ask("status", CALL_TIMEOUT).get("node") or {}).get("id", "?")
    ctl.ask("stop", CALL_TIMEOUT)
    click.echo(f"stopping node {node_id}")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _answers(ctl, deadline) and _lock_free(ctl.target.run_dir):
            click.echo("stopped")
            return
        time.sleep(STOP_POLL)
    fail(f"node {node_id} is still there after {timeout:g}s", EXIT_REFUSED)


def _answers(ctl: Ctl, deadline: float) -> bool:
    try:
        request(ctl.target, "status", min(1.0, max(0.1, deadline - time.monotonic())))
        return True
    except ipc.NodeUnreachable:
        return False


def _lock_free(run_dir: str) -> bool:
    """True unless a process holds crewletd's lock (unreadable or absent: free)."""
    try:
        fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released at once by close
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
