"""``crewletctl tasks``: the company's tracker, from the estate.

crewletd asks the estate through its router (``estate_read``): this node's
own copy when it has one in service, else a data node over the broker, so
it answers on a node that holds no data too. Two shapes:

- ``crewletctl tasks [--status S] [--assignee A] [--limit N] [--json]``
  lists tasks, newest first;
- ``crewletctl tasks ID [--json]`` shows one with its body and comments.

:func:`ask_estate` is the one way a command reads the estate (``pages``
uses it too).
"""

from __future__ import annotations

import re
from typing import Any

import click

from crewlet.ctl import CALL_TIMEOUT, EXIT_REFUSED, Ctl, fail
from crewlet.ctl.plain import normalize_task, normalize_tasks
from crewlet.ctl.status import show
from crewlet.estate import ops

# Seconds crewletd's router may take for one read or search (it asks the data
# nodes in turn, each up to its read wait): sent as the request's ``wait``,
# and the control request waits CALL_TIMEOUT more. The one place it is set.
ESTATE_TIMEOUT = 15.0
# The estate's own limits: its schemas compile when first used, so importing
# them costs crewletctl ~6 ms.
STATUSES = ops.TASK_STATUSES
LIST_DEFAULT, LIST_MAX = ops.LIST_DEFAULT, ops.LIST_MAX
SEARCH_DEFAULT, SEARCH_MAX = ops.SEARCH_DEFAULT, ops.SEARCH_MAX
# Tasks listed by default: the estate's default, a screenful of the newest.
LIMIT = LIST_DEFAULT
TASK_ID = re.compile(r"^[Tt]?([0-9]+)$")


def ask_estate(ctl: Ctl, query: str, args: dict[str, Any]) -> dict[str, Any]:
    """The answer of estate read *query*; exits 1 if nobody could answer, 69 if no node does."""
    return ctl.ask("estate_read", ESTATE_TIMEOUT + CALL_TIMEOUT, query=query, args=args,
                   wait=ESTATE_TIMEOUT)


def task_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """'T12' for T12, t12 or 12."""
    if value is None:
        return None
    found = TASK_ID.match(value)
    if not found:
        raise click.BadParameter(f"{value!r} is not a task id (like T12)")
    return f"T{found.group(1)}"


@click.command()
@click.argument("id", required=False, callback=task_id)
@click.option("--status", type=click.Choice(STATUSES), help="Only tasks with this status.")
@click.option("--assignee", metavar="SEAT", help="Only tasks assigned to SEAT.")
@click.option("--limit", type=click.IntRange(1, LIST_MAX), metavar="N",
              help=f"List at most N, the newest (default {LIMIT}).")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: `tasks`, a list of objects with the keys id, title, status, assignee, "
                   "labels, parent, rev, body, created_at, created_by, updated_at, updated_by; with "
                   "ID, `task` (one such object) and `comments` (id, task, body, created_at, created_by).")
@click.pass_obj
def tasks(ctl: Ctl, id: str | None, status: str | None, assignee: str | None, limit: int | None,
          as_json: bool) -> None:
    """List the tracker's tasks, newest first, or show task ID.

    One row per task: its ID, status, title, assignee, labels, revision
    and when it was last updated. With ID (T12, or just 12): the task's
    fields, its description and its comments, oldest first.

    Exits 0, 1 if there is no task ID or the estate could not be read (the
    message names each data node's answer), 69 when no node answers.
    """
    if id is not None:
        if status or assignee or limit:
            raise click.UsageError("ID cannot be combined with --status, --assignee or --limit")
        result = normalize_task(ask_estate(ctl, "task.get", {"id": id}))
        if result["task"] is None:
            fail(f"no task {id}", EXIT_REFUSED)
        show(result, as_json, lambda render: render.task_view(result))
        return
    limit = limit or LIMIT
    args: dict[str, Any] = {"limit": limit}
    if status:
        args["status"] = status
    if assignee:
        args["assignee"] = assignee
    result = normalize_tasks(ask_estate(ctl, "task.list", args))
    show(result, as_json,
         lambda render: render.tasks_view(result, limit=limit, status=status, assignee=assignee))
