"""``crewletctl seats``: every seat of the company, who runs it, its mailbox and last turn.

crewletd asks each seat's mailbox (its consumer info) and the last turn
record on ``EVENTS``, a few dozen seats at a time, so one answer costs a
broker round trip per seat: :data:`SEATS_TIMEOUT` allows for a large
company. ``--watch`` asks again every interval (:func:`watch_live`, a
loop that any command showing one control answer live can use).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable

import click

from crewlet import ipc
from crewlet.ctl import (EXIT_OK, WATCH_INTERVAL, WATCH_MAX_INTERVAL, WATCH_MIN_INTERVAL, Ctl, request)
from crewlet.ctl.plain import normalize_seats
from crewlet.ctl.status import show

if TYPE_CHECKING:
    from rich.console import RenderableType

# Seconds one seats request may take: ~2 ms a seat on an R3 cluster, 32 at a
# time, is ~1 s for 10,000 seats; the rest is room for a busy broker.
SEATS_TIMEOUT = 10.0

# One frame of a --watch: (the last answer, crewletd's refusal of this
# round's request or None) -> what to show.
Frame = Callable[[dict[str, Any] | None, str | None], "RenderableType"]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the seats as JSON (stable keys).")
@click.option("--watch", "-w", is_flag=True, help="Keep showing the seats, live, until Ctrl-C.")
@click.option("--interval", "-n", default=WATCH_INTERVAL, show_default=True, metavar="SECONDS",
              type=click.FloatRange(WATCH_MIN_INTERVAL, WATCH_MAX_INTERVAL, clamp=True),
              help=f"Refresh period of --watch, clamped to {WATCH_MIN_INTERVAL:g}..{WATCH_MAX_INTERVAL:g}.")
@click.pass_obj
def seats(ctl: Ctl, as_json: bool, watch: bool, interval: float) -> None:
    """Show every seat: owner, mailbox, dead letters and last turn.

    One row per seat of the company in force: the node holding it (OWNER),
    mail waiting (PENDING) and being worked (IN FLIGHT), its dead letters
    (DEAD, see `crewletctl dlq`), its last turn's outcome and when it
    ended, and how long it took. The last line sums them up. In --json:
    `rev` and `seats`, a list of objects with the keys seat, owner, token,
    pending, in_flight, redelivered, ack_floor, dead_letters, last_turn (a
    turn record or null) and error (why the mailbox could not be read, or
    null).

    Exits 0, 1 if crewletd refuses (e.g. no company applied yet), 69 when
    no node answers. With --watch, exits 0 on Ctrl-C and keeps retrying
    while the node is unreachable.
    """
    if as_json and watch:
        raise click.UsageError("--json and --watch cannot be combined")
    if watch:
        sys.exit(watch_live(ctl, "seats", SEATS_TIMEOUT, interval, _frame))
    result = normalize_seats(ctl.ask("seats", SEATS_TIMEOUT))
    show(result, as_json, lambda render: render.seats_view(result))


def _frame(result: dict[str, Any] | None, refused: str | None) -> RenderableType:
    from rich.text import Text

    from crewlet.ctl.render import seats_view

    if refused is not None:
        return Text(f"crewletd refused: {refused}", style="bold red")
    return seats_view(normalize_seats(result or {}))


def watch_live(ctl: Ctl, op: str, timeout: float, interval: float, frame: Frame) -> int:
    """Ask *op* every *interval* seconds and show ``frame(result, refusal)``
    live until Ctrl-C (then 0); while no node answers, say so and retry."""
    from rich.console import Console
    from rich.live import Live

    from crewlet.ctl.render import live_view

    target = ctl.target
    result: dict[str, Any] | None = None
    last_ok: float | None = None
    try:
        with Live(auto_refresh=False, console=Console()) as live:
            while True:
                started = time.monotonic()
                error = refused = None
                try:
                    reply = request(target, op, timeout)
                    last_ok = time.time()
                    if reply.get("ok"):
                        result = reply.get("result") or {}
                    else:
                        refused = str(reply.get("error") or "request refused")
                except ipc.NodeUnreachable as exc:
                    error = str(exc)
                body = frame(result, refused) if error is None else None
                live.update(live_view(body, error, target.where(), last_ok, interval), refresh=True)
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return EXIT_OK
