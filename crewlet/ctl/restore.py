"""``crewletctl restore SRC``: start a new fleet from a backup.

Into a fleet whose estate log is empty (a fleet just started; refused
otherwise, nothing changed): the files' bytes go to the fleet's store, the
backup's copy becomes the fleet's first snapshot and the log moves on to
start after it, so every data node's copy starts from that snapshot; then
the backup's company is applied as a new revision (crewlet/estate/backup.py).
"""

from __future__ import annotations

import json
import os

import click

from crewlet.company.load import from_revision
from crewlet.config import ConfigError
from crewlet.coord.control_plane import ControlPlaneError
from crewlet.ctl import EXIT_REFUSED, Ctl, fail
from crewlet.ctl.apply import node_config, with_fleet
from crewlet.estate import backup as estate_backup
from crewlet.objects.files import store_of


@click.command()
@click.argument("src", type=click.Path(file_okay=False, exists=True))
@click.pass_obj
def restore(ctl: Ctl, src: str) -> None:
    """Start a new fleet from the backup in SRC: its estate, files and company.

    The fleet's estate log must be empty. Exits 0 when restored, 1 when
    refused (not a backup, the fleet not new) or failed, 69 when the node's
    NATS cannot be reached.
    """
    cfg = node_config(ctl)
    try:
        estate_backup.manifest(src)
        company = None
        if os.path.exists(os.path.join(src, estate_backup.COMPANY)):
            with open(os.path.join(src, estate_backup.COMPANY)) as f:
                company = from_revision((json.load(f) or {}).get("company"),
                                        os.path.join(src, estate_backup.COMPANY))
    except (estate_backup.BackupError, ConfigError, OSError, ValueError, AttributeError) as exc:
        fail(f"restore refused: {exc}", EXIT_REFUSED)

    async def work(nc, js, plane):
        objects = store_of(cfg.files, js=js, nc=nc, replicas=cfg.stream.replicas)
        try:
            done = await estate_backup.restore(src, js=js, objects=objects, replicas=cfg.stream.replicas,
                                               node=cfg.node.id)
        finally:
            await objects.close()
        if company is not None:
            done["rev"], _ = await plane.apply(company, f"restore of {os.path.abspath(src)}")
        return done

    try:
        done = with_fleet(ctl, work)
    except (estate_backup.BackupError, ControlPlaneError, OSError) as exc:
        fail(f"restore failed: {exc}", EXIT_REFUSED)
    click.echo(f"restored {src}: the estate at seq {done['seq']} (every data node starts from it), "
               f"{done['objects']} files, company "
               + (f"as revision {done['rev']}" if "rev" in done else "none in the backup"))
