"""``crewletctl dlq``: the dead letters, and putting one back.

A dead letter is mail that spent its delivery budget (or whose turn failed
in a way that will not pass); the broker keeps it in the ``DLQ`` stream
under a number of its own, SEQ. Two shapes:

- ``crewletctl dlq [SEAT] [--limit N] [--json]`` lists them, oldest first
  (it is ``dlq list ...``: :class:`ListByDefault` runs ``list`` unless the
  first word names a subcommand);
- ``crewletctl dlq requeue SEQ`` sends dead letter SEQ back to its seat's
  mailbox with a fresh delivery budget and removes it from the DLQ.
"""

from __future__ import annotations

import click

from crewlet.ctl import CALL_TIMEOUT, Ctl
from crewlet.queue.base import SEQ_MAX
from crewlet.ctl.plain import normalize_dead_letters
from crewlet.ctl.status import show

# Dead letters listed by default: a screenful of the oldest.
LIMIT = 100
# Seconds the listing may take per dead letter on top of CALL_TIMEOUT:
# crewletd reads them one broker request each (~2 ms on an R3 cluster).
PER_LETTER = 0.005


class ListByDefault(click.Group):
    """A group whose first word is a subcommand only when it names one;
    anything else (a seat, an option, nothing) goes to ``list``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ctx.help_option_names):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group(cls=ListByDefault, options_metavar="",
             subcommand_metavar="[SEAT] [--limit N] [--json] | requeue SEQ")
def dlq() -> None:
    """List dead letters, or put one back in its mailbox.

    \b
      crewletctl dlq [SEAT] [--limit N] [--json]   the same as `dlq list ...`
      crewletctl dlq requeue SEQ                   SEQ from the listing

    A dead letter is mail that spent its delivery budget, or whose turn
    failed in a way that will not pass. For a seat named `list` or
    `requeue`, say `dlq list SEAT`.
    """


@dlq.command("list")
@click.argument("seat", required=False)
@click.option("--limit", default=LIMIT, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="List at most N, the oldest.")
@click.option("--json", "as_json", is_flag=True,
              help="Print them as JSON: `dead_letters`, a list of objects with the keys "
                   "seq, seat, reason, deliveries, original_seq, at, trigger, text.")
@click.pass_obj
def list_letters(ctl: Ctl, seat: str | None, limit: int, as_json: bool) -> None:
    """List the dead letters (of SEAT), oldest first.

    One row each: SEQ (what `dlq requeue` takes), the seat, how many
    deliveries it had, why it is dead, how long ago it died, and the start
    of its text. Exits 0 (with or without dead letters), 1 if crewletd
    refuses (e.g. no such seat), 69 when no node answers.
    """
    args = {"limit": limit} if seat is None else {"seat": seat, "limit": limit}
    result = normalize_dead_letters(ctl.ask("dlq", CALL_TIMEOUT + limit * PER_LETTER, **args))
    show(result, as_json, lambda render: render.dead_letters_view(result, seat=seat, limit=limit))


@dlq.command()
@click.argument("seq", type=click.IntRange(min=1, max=SEQ_MAX))
@click.pass_obj
def requeue(ctl: Ctl, seq: int) -> None:
    """Put dead letter SEQ back in its seat's mailbox.

    It goes back with a fresh delivery budget under a new trigger (the old
    one with `.requeue.SEQ` appended, so the seat's ledger does not skip it)
    and leaves the DLQ. Exits 0, 1 if crewletd refuses (e.g. no dead letter
    SEQ), 69 when no node answers.
    """
    result = ctl.ask("dlq", CALL_TIMEOUT, requeue=seq)
    click.echo(f"requeued dead letter {seq} (mailbox seq {result.get('seq')})")
