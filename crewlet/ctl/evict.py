"""``crewletctl evict NODE``: take a data node's copy of the estate out of service.

An evicted node's copy answers no estate request ("node evicted: <reason>")
and is not counted as a copy, until the eviction is undone. It is a key of
the ``status`` bucket, ``evicted.<node>`` (JSON ``{reason, at, by}``), that
crewletd writes for us, so it works from any node of the fleet and whether
or not NODE is up:

- ``crewletctl evict NODE [--reason TEXT]`` writes it;
- ``crewletctl evict NODE --undo`` deletes it.
"""

from __future__ import annotations

import click

from crewlet.ctl import CALL_TIMEOUT, Ctl
from crewlet.ctl.plain import evict_text

REASON = "evicted by the operator"  # when --reason is not given


@click.command()
@click.argument("node")
@click.option("--reason", metavar="TEXT", help=f"Why, shown where the copy refuses (default: {REASON!r}).")
@click.option("--undo", is_flag=True, help="Put NODE's copy back in service.")
@click.option("--force", is_flag=True, help="Evict NODE's copy even when it is the last one in service.")
@click.pass_obj
def evict(ctl: Ctl, node: str, reason: str | None, undo: bool, force: bool) -> None:
    """Take NODE's copy of the estate out of service, or with --undo put it back.

    The copy stays on disk; once the eviction is undone it answers again
    (when it has caught up with the log). The last copy in service is not
    evicted without --force: the fleet would have none. Exits 0, 1 if
    crewletd refuses (the last copy, a bad node id, the fleet not
    reachable), 69 when no node answers.
    """
    if undo and (reason is not None or force):
        raise click.UsageError("--reason and --force cannot be combined with --undo")
    if reason is not None and not reason.strip():
        raise click.BadParameter("the reason is empty", param_hint="--reason")
    args = {"node": node, "undo": True} if undo else {"node": node, "reason": reason or REASON}
    if force:
        args["force"] = True
    click.echo(evict_text(ctl.ask("evict", CALL_TIMEOUT, **args)))
