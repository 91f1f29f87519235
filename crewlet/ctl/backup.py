"""``crewletctl backup DEST``: a backup of the company, from this data node.

Writes into DEST (a new directory, 0700): a consistent copy of this node's
estate with the log sequence it stands at, the bytes of every file a row of
that copy names, and the company revision in force; ``backup.json`` last, so
a directory without it is not a backup (crewlet/estate/backup.py). Run it on
a data node: it reads the node's copy straight from its data dir, and the
files and the company through the node's NATS.
"""

from __future__ import annotations

import click

from crewlet.coord.control_plane import ControlPlaneError
from crewlet.ctl import EXIT_REFUSED, Ctl, fail
from crewlet.ctl.apply import node_config, with_fleet
from crewlet.estate import backup as estate_backup
from crewlet.objects.files import store_of


@click.command()
@click.argument("dest", type=click.Path(file_okay=False))
@click.pass_obj
def backup(ctl: Ctl, dest: str) -> None:
    """Back up the company into DEST: this node's copy of the estate (with its
    log sequence), the files' bytes, and the company revision in force.

    DEST must not exist or be empty. Exits 0 when written, 1 when it cannot
    be (no copy on this node, DEST not empty, a file unreadable: nothing
    named a backup is left), 69 when the node's NATS cannot be reached.
    """
    cfg = node_config(ctl)

    async def work(nc, js, plane):
        active = await plane.active()
        company = None
        if active is not None:
            company = await plane.revision(active["rev"])
        objects = store_of(cfg.files, js=js, nc=nc, replicas=cfg.stream.replicas)
        try:
            return await estate_backup.write(dest, data_dir=ctl.target.data_dir, node=cfg.node.id,
                                             objects=objects, company=company)
        finally:
            await objects.close()

    try:
        made = with_fleet(ctl, work)
    except (estate_backup.BackupError, ControlPlaneError, OSError) as exc:
        fail(f"backup failed: {exc}", EXIT_REFUSED)
    click.echo(f"backed up to {dest}: the estate at seq {made['estate']['seq']}, "
               f"{made['objects']} files ({made['object_bytes']:,} bytes), "
               f"company revision {made['company_rev'] if made['company_rev'] is not None else 'none'}")
