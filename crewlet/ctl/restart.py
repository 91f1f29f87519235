"""``crewletctl restart CHILD``: stop and start one child of the node."""

from __future__ import annotations

import click

from crewlet.ctl import CALL_TIMEOUT, RESTART_TIMEOUT, Ctl


@click.command()
@click.argument("child")
@click.option("--timeout", default=RESTART_TIMEOUT, show_default=True, metavar="SECONDS",
              type=click.FloatRange(min=1.0), help="How long to wait for the child to be ready again.")
@click.pass_obj
def restart(ctl: Ctl, child: str, timeout: float) -> None:
    """Restart CHILD and wait until it is ready again.

    CHILD is a NAME from `status`. A restart asked for here does not count
    against the supervisor's restart intensity. Exits 1 if crewletd refuses
    (e.g. no such child), 69 when no node answers.
    """
    ctl.ask("status", CALL_TIMEOUT)  # fail fast on a dead node rather than after --timeout
    ctl.ask("restart", timeout, child=child)
    click.echo(f"restarted {child}")
