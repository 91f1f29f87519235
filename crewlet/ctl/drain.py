"""``crewletctl drain [NODE]``: take a node out of service without stopping it.

The node (this one when NODE is not given) stops claiming, hands its seats
over (their mail NAKed: a peer has it at once), lets its running turns
finish up to the deadline, gives up its duties and the conversation runs it
drives, and answers ``/readyz`` 503 ``draining``; it keeps its broker and
its copy of the estate (:mod:`crewlet.coord.drain`). The order is a key of
the fleet's ``status`` bucket that crewletd writes for us, so it works from
any node, and it outlives NODE's restarts until ``crewletctl undrain``.

By default the command then waits until NODE holds nothing, saying what it
still holds as that changes; ``--stop`` then stops the node (this node only).
"""

from __future__ import annotations

import time

import click

from crewlet.coord import drain as drains
from crewlet.ctl import CALL_TIMEOUT, DRAIN_POLL, EXIT_REFUSED, Ctl, fail
from crewlet.ctl.plain import drain_progress, drain_text
from crewlet.ctl.stop import stop

# Seconds --wait waits past the order's deadline before giving up: the
# handover of what the deadline cut short (a sweep, a tend, a session sweep).
SETTLE = 60.0


@click.command()
@click.argument("node", required=False)
@click.option("--deadline", type=click.FloatRange(0, drains.DEADLINE_MAX), metavar="SECONDS",
              help="Seconds running turns are given before they are cut short and handed over "
                   "(default: fleet.drain_deadline).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until NODE holds no seat, duty or run.")
@click.option("--stop", "then_stop", is_flag=True, help="Once drained, stop the node (this node only).")
@click.pass_context
def drain(click_ctx: click.Context, node: str | None, deadline: float | None, wait: bool,
          then_stop: bool) -> None:
    """Drain NODE (default: this node): it hands its work over and serves nothing.

    Exits 0 once NODE holds nothing (at once with --no-wait), 1 if crewletd
    refuses or NODE still holds something a minute past the deadline, 69
    when no node answers. Undo with `crewletctl undrain NODE`.
    """
    ctl: Ctl = click_ctx.obj
    here = (ctl.ask("status", CALL_TIMEOUT).get("node") or {}).get("id")
    target = node or here
    if then_stop and target != here:
        raise click.UsageError(f"--stop stops this node ({here}) only: run it on {target}'s machine")
    args = {"node": target} if deadline is None else {"node": target, "deadline": deadline}
    result = ctl.ask("drain", CALL_TIMEOUT, **args)
    click.echo(drain_text(result))
    if not wait:
        return
    until = (result.get("draining") or {}).get("until") or time.time()
    give_up = time.monotonic() + max(0.0, until - time.time()) + SETTLE
    said = None
    while True:
        fleet = ctl.ask("status", CALL_TIMEOUT).get("fleet") or {}
        row = next((n for n in fleet.get("nodes") or [] if n.get("id") == target), None)
        line = drain_progress(row, target)
        if line != said:
            click.echo(line)
            said = line
        if row is None or drains.holds_nothing(row):
            break
        if time.monotonic() > give_up:
            fail(f"{target} still holds work {SETTLE:g}s past its deadline", EXIT_REFUSED)
        time.sleep(DRAIN_POLL)
    if then_stop:
        click_ctx.invoke(stop)
