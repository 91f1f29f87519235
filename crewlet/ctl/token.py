"""``crewletctl token``: make an API token and the entry that configures it.

The token is printed once, on stdout's first line; the node is given only
its sha256 (:mod:`crewlet.tokens`), as an ``ingress.tokens`` entry or a
tokens-file line. Nothing is sent anywhere and no node needs to be running.
"""

from __future__ import annotations

import json

import click

from crewlet import tokens


@click.command()
@click.option("--name", default="api", show_default=True, metavar="NAME",
              help="What logs and the API show of the token.")
@click.option("--scopes", default="read", show_default=True, metavar="SCOPES",
              help="Comma-separated: read, write, admin (each implies the ones before it).")
@click.option("--person", default=None, metavar="ID",
              help="The company's person (an id of its people:) the token belongs to: approvals "
                   "decided with it are theirs, and only theirs to decide where the company says so.")
@click.option("--json", "as_json", is_flag=True, help="Print token, name, scopes, sha256 and the file line as JSON.")
def token(name: str, scopes: str, person: str | None, as_json: bool) -> None:
    """Make an API token for `Authorization: Bearer <token>`.

    Prints the token, then the `ingress.tokens` entry and the tokens-file
    line that give it to a node (its hash, never the token). Keep the token
    where the caller keeps secrets; it cannot be shown again.
    """
    wanted = [s.strip() for s in scopes.split(",") if s.strip()]
    bad = [s for s in wanted if s not in tokens.SCOPES]
    if not wanted or bad:
        raise click.BadParameter(f"scopes are {', '.join(tokens.SCOPES)}", param_hint="--scopes")
    if not tokens.NAME_RE.match(name):
        raise click.BadParameter("1-63 letters, digits, '_', '.', '@' or '-'", param_hint="--name")
    if person is not None and not tokens.PERSON_RE.match(person):
        raise click.BadParameter("an id of the company's people: 1-63 of a-z, 0-9, '_', '.' or '-'",
                                 param_hint="--person")
    made = tokens.new_token()
    digest = tokens.digest(made)
    line = f"{digest} {','.join(wanted)} {name}" + (f" {person}" if person else "")
    if as_json:
        click.echo(json.dumps({"token": made, "name": name, "scopes": wanted, "sha256": digest,
                               "person": person, "line": line}, indent=2))
        return
    click.echo(made)
    owner = f", person: {person}" if person else ""
    click.echo(f"# ingress.tokens entry:  - {{name: {name}, sha256: {digest}, scopes: [{', '.join(wanted)}]{owner}}}",
               err=True)
    click.echo(f"# tokens_file line:      {line}", err=True)
