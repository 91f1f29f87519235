"""``crewletctl pages``: the company's knowledge base, from the estate.

Read like ``tasks`` (:func:`crewlet.ctl.tasks.ask_estate`), so it answers on
a node that holds no data too. Two shapes:

- ``crewletctl pages [--prefix P] [--limit N] [--json]`` lists pages by path;
- ``crewletctl pages PATH [--json]`` shows one: title, version, who updated
  it when, and its body.

Finding pages by their words is ``crewletctl search``.
"""

from __future__ import annotations


import click

from crewlet.ctl import EXIT_REFUSED, Ctl, fail
from crewlet.ctl.plain import normalize_page, normalize_pages
from crewlet.ctl.status import show
from crewlet.ctl.tasks import LIST_DEFAULT, LIST_MAX, ask_estate

# Pages listed by default: the estate's default.
LIMIT = LIST_DEFAULT


@click.command()
@click.argument("path", required=False)
@click.option("--prefix", metavar="P", help="Only pages whose path starts with P.")
@click.option("--limit", type=click.IntRange(1, LIST_MAX), metavar="N",
              help=f"List at most N, in path order (default {LIMIT}).")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: `pages`, a list of objects with the keys path, title, version, "
                   "created_at, created_by, updated_at, updated_by; with PATH, `page` (one such "
                   "object, with body too).")
@click.pass_obj
def pages(ctl: Ctl, path: str | None, prefix: str | None, limit: int | None, as_json: bool) -> None:
    """List the knowledge base's pages, or show the page at PATH.

    One row per page, by path: its title, version, who updated it last and
    when. With PATH: the page's title, version, who created and updated it,
    and its body.

    Exits 0, 1 if there is no page at PATH or the estate could not be read
    (the message names each data node's answer), 69 when no node answers.
    """
    if path is not None:
        if prefix is not None or limit:
            raise click.UsageError("PATH cannot be combined with --prefix or --limit")
        result = normalize_page(ask_estate(ctl, "page.read", {"path": path}))
        if result["page"] is None:
            fail(f"no page at {path}", EXIT_REFUSED)
        show(result, as_json, lambda render: render.page_view(result))
        return
    limit = limit or LIMIT
    args = {"limit": limit} if not prefix else {"prefix": prefix, "limit": limit}
    result = normalize_pages(ask_estate(ctl, "page.list", args))
    show(result, as_json, lambda render: render.pages_view(result, prefix=prefix, limit=limit))
