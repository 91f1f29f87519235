"""``crewletctl send SEAT TEXT``: put mail in a seat's mailbox, and maybe watch its turn.

crewletd publishes the mail (from ``crewletctl@<node>``) under a trigger id,
ours with ``--trigger`` (sending again with the same id is worked once:
the seat's ledger skips a trigger already worked), else a fresh one. With
``--wait`` it also listens for the turn record of that trigger and answers
with the first one, so the request waits up to ``--wait`` seconds plus the
usual call timeout.

The text is checked here, before anything is sent: it must be UTF-8 (from
stdin, or an argument the shell passed as bytes Python could not decode)
and at most :data:`~crewlet.queue.base.MAIL_MAX` characters; else a usage
error naming the problem, exit 2.
"""

from __future__ import annotations

import json
import sys

import click

from crewlet.ctl import CALL_TIMEOUT, Ctl
from crewlet.queue.base import check_mail
from crewlet.ctl.plain import no_turn_text, sent_text, turn_text, worked_already_text

STDIN = "-"  # TEXT that means: read the text from stdin


def mail_text(text: str) -> str:
    """TEXT as a mail may hold it (stdin read for "-"); BadParameter otherwise."""
    if text == STDIN:
        raw = sys.stdin.buffer.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise click.BadParameter(f"stdin is not UTF-8 text: {exc.reason} at byte {exc.start}",
                                     param_hint="TEXT") from None
    else:
        try:
            text.encode("utf-8")  # an argument of undecodable bytes holds lone surrogates
        except UnicodeEncodeError as exc:
            raise click.BadParameter(f"not UTF-8 text: undecodable byte at character {exc.start}",
                                     param_hint="TEXT") from None
    if not text.strip():
        raise click.BadParameter("the text is empty", param_hint="TEXT")
    try:
        return check_mail(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="TEXT") from None


@click.command()
@click.argument("seat")
@click.argument("text")
@click.option("--wait", type=click.FloatRange(min=0.0, min_open=True), metavar="SECONDS",
              help="Wait up to SECONDS for the turn that works the mail and print it.")
@click.option("--trigger", metavar="ID", help="The mail's trigger id (default: a fresh one); "
                                              "mail sent again under a worked trigger is skipped.")
@click.option("--json", "as_json", is_flag=True,
              help="Print crewletd's answer as JSON: seat, seq, trigger, duplicate, worked, turn "
                   "(null without a turn).")
@click.pass_obj
def send(ctl: Ctl, seat: str, text: str, wait: float | None, trigger: str | None, as_json: bool) -> None:
    """Put TEXT in SEAT's mailbox (TEXT "-": read it from stdin).

    Prints "sent to SEAT (trigger ID, seq N)" ("already in SEAT's mailbox"
    when the mailbox held that trigger: not sent again). With --wait, also
    the turn that worked it: outcome, rounds, tool calls, tokens, how long it
    took, and the reply; or "no turn finished within Ns" when none did in
    time (the mail stays in the mailbox and is worked later). A duplicate
    whose trigger was worked already is answered at once: no new turn.

    Exits 0 once the mail is in the mailbox, whatever the turn's outcome
    and whether one finished within --wait (see the output, or `turn` in
    --json); 1 if crewletd refuses (no such seat, no company applied), 2 if
    TEXT is empty, not UTF-8 or over 100,000 characters (nothing is sent),
    69 when no node answers.
    """
    args = {"seat": seat, "text": mail_text(text)}
    if trigger:
        args["trigger"] = trigger
    if wait:
        args["wait"] = wait
    result = ctl.ask("send", CALL_TIMEOUT + (wait or 0.0), **args)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(sent_text(result))
    if wait:
        turn = result.get("turn")
        if isinstance(turn, dict):
            click.echo(turn_text(turn))
        else:
            click.echo(worked_already_text() if result.get("worked") else no_turn_text(wait))
