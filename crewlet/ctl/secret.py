"""``crewletctl secret``: the fleet's secrets — set, list, remove.

A secret is stored once for the whole fleet, sealed (:mod:`crewlet.vault`),
and every node uses a new version within a second, with no restart. The
company names it: a provider's ``api_key_secret``, an integration's
``secret``.

- ``crewletctl secret set NAME [--file PATH] [--grace SECONDS]``: the value
  from PATH, else from standard input (asked for without echo at a
  terminal) — never from the command line, which other users of the
  machine can read in the process list. One trailing newline is dropped.
- ``crewletctl secret list [--json]``: names, versions, who set them and
  when, and what in the company uses each; never a value.
- ``crewletctl secret rm NAME``: remove every version of it.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from crewlet.ctl import EXIT_USAGE, Ctl, fail
from crewlet.ctl.plain import secret_set_text
from crewlet.ctl.status import show

# Bytes read of a value: past the vault's limit, so its refusal is the one said.
READ_MAX = 1024 * 1024


@click.group()
def secret() -> None:
    """Set, list or remove the fleet's secrets (values are never shown).

    \b
      crewletctl secret set NAME < value.txt   a new version, on every node within a second
      crewletctl secret list                   names, versions, who set them, what uses them
      crewletctl secret rm NAME                every version gone
    """


def ask_vault(ctl: Ctl, action: str, **args: Any) -> dict[str, Any]:
    """crewletd's answer to secret *action*, waited for as long as the vault's writer may take."""
    from crewlet.vault.store import CALLER_WAIT  # the store imports nats and the company's models

    return ctl.ask("secret", CALLER_WAIT, action=action, **args)


def _value(path: str | None) -> str:
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read(READ_MAX)
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}", EXIT_USAGE)
    elif sys.stdin.isatty():
        text = click.prompt("value", hide_input=True, err=True)
    else:
        try:
            text = sys.stdin.read(READ_MAX)
        except UnicodeDecodeError:
            fail("the value on standard input is not UTF-8 text", EXIT_USAGE)
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    if not text:
        fail("the value is empty: give it on standard input or with --file", EXIT_USAGE)
    return text


@secret.command("set")
@click.argument("name")
@click.option("--file", "path", type=click.Path(dir_okay=False), help="Read the value from PATH.")
@click.option("--grace", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="How long the version it replaces is still accepted for webhook signatures "
                   "(default 3600; 0: at once only the new one).")
@click.pass_obj
def set_(ctl: Ctl, name: str, path: str | None, grace: float | None) -> None:
    """Store a new version of secret NAME, fleet-wide.

    The value comes from --file, else standard input; never the command
    line. Exits 0, 1 if crewletd refuses (a bad name, an empty or oversize
    value), 2 for input that cannot be read, 69 when no node answers.
    """
    value = _value(path)
    click.echo(secret_set_text(ask_vault(ctl, "set", name=name, value=value, grace=grace)))


@secret.command("list")
@click.option("--json", "as_json", is_flag=True,
              help="Print it as JSON: `secrets` (name, version, by, at, key, readable, "
                   "previous_until, named_by), `missing` (named by the company, not set), `key`.")
@click.pass_obj
def list_(ctl: Ctl, as_json: bool) -> None:
    """List the fleet's secrets: never a value.

    Exits 0, 1 if crewletd refuses, 69 when no node answers.
    """
    result = ask_vault(ctl, "list")  # a read of every record, from the leader
    show(result, as_json, lambda render: render.secrets_view(result))


@secret.command("rm")
@click.argument("name")
@click.pass_obj
def rm(ctl: Ctl, name: str) -> None:
    """Remove secret NAME (every version), fleet-wide.

    What the company names it with stops working at its next use. Exits 0,
    1 if crewletd refuses (no such secret), 69 when no node answers.
    """
    result = ask_vault(ctl, "remove", name=name)
    used = result.get("named_by") or []
    click.echo(f"removed {name}" + (f"; still named by {', '.join(used)}" if used else ""))
