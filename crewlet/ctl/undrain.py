"""``crewletctl undrain [NODE]``: put a drained node back to work.

Deletes NODE's drain order (``status`` ``drain.<node>``, written by
``crewletctl drain``): within a sweep the node claims its fair share of
seats again, and takes duties and conversation runs. A node that speaks
another protocol than the nodes serving is refused: upgrade it first.
"""

from __future__ import annotations

import click

from crewlet.ctl import CALL_TIMEOUT, Ctl
from crewlet.ctl.plain import drain_text


@click.command()
@click.argument("node", required=False)
@click.pass_obj
def undrain(ctl: Ctl, node: str | None) -> None:
    """Put NODE (default: this node) back to work after `crewletctl drain`.

    Exits 0, 1 if crewletd refuses (another protocol, a bad node id, the
    fleet not reachable), 69 when no node answers.
    """
    target = node or (ctl.ask("status", CALL_TIMEOUT).get("node") or {}).get("id")
    click.echo(drain_text(ctl.ask("drain", CALL_TIMEOUT, node=target, undo=True)))
