"""``crewletctl outbox``: what became of the notifications (emails out).

One row per notification, in the order its record last changed: its state —
``sent``, ``retry`` (a passing failure; sent again later), ``dead`` (refused
for good: the SMTP server's words), ``unknown`` (its sender died between
handing it over and the server's answer: it may have arrived, and is never
sent again), ``sending`` (in a sender's hands now) — with the recipients,
the subject and the reason (crewlet/outbox.py says more).

``crewletctl outbox [--state STATE] [--limit N] [--after SEQ] [--json]``.
Exits 0, 1 if crewletd refuses, 69 when no node answers.
"""

from __future__ import annotations

import time

import click
from rich.table import Table
from rich.text import Text
from rich.console import Group

from crewlet.ctl import CALL_TIMEOUT, Ctl
from crewlet.ctl.status import show
from crewlet.outbox import STATES

LIMIT = 100
# Seconds the listing may take per record on top of CALL_TIMEOUT (one broker read each).
PER_RECORD = 0.005
STYLE = {"sent": "green", "retry": "yellow", "sending": "cyan", "dead": "red", "unknown": "magenta"}


def view(result: dict, limit: int, now: float | None = None):
    now = time.time() if now is None else now
    rows = result.get("outcomes") or []
    waiting = result.get("waiting")
    told = Text(f"{waiting} waiting in OUTBOX" if waiting is not None else "OUTBOX not reachable",
                style="dim")
    if not rows:
        return Group(Text("no notifications recorded", style="green"), told)
    table = Table(box=None)
    for column in ("SEQ", "STATE", "ID", "TO", "SUBJECT", "AGO", "REASON"):
        table.add_column(column, overflow="fold")
    for r in rows:
        ago = f"{max(0.0, now - float(r.get('at') or now)):.0f}s"
        table.add_row(str(r.get("seq")), Text(str(r.get("state")), style=STYLE.get(r.get("state"), "")),
                      str(r.get("id"))[:40], ", ".join(r.get("to") or [])[:40],
                      str(r.get("subject"))[:40], ago, str(r.get("reason") or "")[:80])
    more = f" (the first {limit}: --after {rows[-1]['seq']} shows the next)" if len(rows) >= limit else ""
    return Group(table, Text(f"{len(rows)} notifications{more}; ", style="dim") + told)


@click.command()
@click.option("--state", type=click.Choice(STATES), help="Only the notifications in this state.")
@click.option("--limit", default=LIMIT, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="List at most N.")
@click.option("--after", default=0, type=click.IntRange(min=0), metavar="SEQ",
              help="Start after this record's SEQ (the next page).")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: `outcomes` (objects with seq, id, state, to, subject, by, at, "
                   "node, token, attempt, reason) and `waiting` (still in OUTBOX).")
@click.pass_obj
def outbox(ctl: Ctl, state: str | None, limit: int, after: int, as_json: bool) -> None:
    """What became of the notifications (emails out), oldest change first.

    A state each: sent, retry (sent again later), dead (refused for good,
    with the server's words), unknown (its sender died before the server
    answered: never sent again), sending (being sent now). Exits 0, 1 if
    crewletd refuses, 69 when no node answers.
    """
    args = {"limit": limit, "after": after, **({"state": state} if state else {})}
    result = ctl.ask("outbox", CALL_TIMEOUT + limit * PER_RECORD, **args)
    show(result, as_json, lambda _: view(result, limit))
