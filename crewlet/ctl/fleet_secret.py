"""``crewletctl fleet-secret FILE``: make, rotate or retire a fleet's secret.

A fleet's members admit routes and leaves only from nodes holding its secret
(``stream.fleet_credentials``, :mod:`crewlet.credentials`). This writes the
file (0600, whole before it is visible); copy it to every node of the fleet
as the service user's own. Nothing is sent anywhere and no node needs to be
running. The secret is never printed.

- no option: a new file with one secret; an existing file is refused.
- ``--rotate``: a new secret in force, the one it replaces kept after it.
  Restart the members one at a time, then the leaves (README, "A fleet's links").
- ``--retire``: drop the replaced secret, once every node runs on the new one.
"""

from __future__ import annotations

import os

import click

from crewlet import credentials
from crewlet.ctl import EXIT_CONFIG, fail


@click.command("fleet-secret")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--rotate", is_flag=True, help="Put a new secret in force, keeping the current one after it.")
@click.option("--retire", is_flag=True, help="Drop the secret a rotation replaced.")
def fleet_secret(path: str, rotate: bool, retire: bool) -> None:
    """Make the fleet secret file PATH (stream.fleet_credentials)."""
    if rotate and retire:
        raise click.UsageError("--rotate or --retire, not both")
    if not (rotate or retire):
        if os.path.lexists(path):
            fail(f"{path} exists: --rotate to replace its secret, or choose another path", EXIT_CONFIG)
        held: list[str] = []
    else:
        try:
            held = credentials.read_fleet_secrets(path)
        except (OSError, ValueError) as exc:
            fail(f"cannot use {path}: {getattr(exc, 'strerror', None) or exc}", EXIT_CONFIG)
    if rotate:
        lines = [credentials.new_fleet_secret(), held[0]]
    elif retire:
        lines = held[:1]
    else:
        lines = [credentials.new_fleet_secret()]
    try:
        credentials.write_fleet_secrets(os.path.abspath(path), lines)
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}", EXIT_CONFIG)
    said = ("rotated: a new secret in force, the old one kept after it" if rotate
            else "retired the replaced secret" if retire else "made a fleet secret")
    click.echo(f"{path}: {said} (user {credentials.fleet_user(lines[0])}); copy it to every node, mode 0600",
               err=True)
