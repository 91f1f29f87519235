"""``crewletctl search QUERY``: full-text search of the knowledge base.

crewletd's router asks a data node whose search index is in service (this
node's first, when it has one). A search nobody could run is not an empty
result: it prints why each data node could not ("could not be searched:
...") and exits 1, where "no pages matched" exits 0.

A search split between data nodes (a large knowledge base) that some did not
answer is partial: the answer's ``coverage`` says how many of the 64 search
shards were searched and whose were missing, and this prints it under the
hits ("partial: searched 43 of 64 shards; n2 did not answer"). It still
exits 0: what was searched is right, only not all of it.
"""

from __future__ import annotations

import json
import sys

import click

from crewlet.ctl import CALL_TIMEOUT, EXIT_REFUSED, Ctl, fail
from crewlet.ctl.plain import answers_text, normalize_search
from crewlet.ctl.status import _console  # the same width rules as `status` when piped
from crewlet.ctl.tasks import ESTATE_TIMEOUT, SEARCH_DEFAULT, SEARCH_MAX

# Hits shown by default, best first: page.search's default.
LIMIT = SEARCH_DEFAULT


def partial_text(coverage) -> str | None:
    """None for a whole search (or no coverage given); else what was not searched."""
    if not isinstance(coverage, dict):
        return None
    searched, of = coverage.get("searched"), coverage.get("of")
    if not isinstance(searched, int) or not isinstance(of, int) or searched >= of:
        return None
    text = f"partial: searched {searched} of {of} shards"
    missing = [str(m) for m in coverage.get("missing") or []]
    if missing:
        text += f"; {', '.join(missing)} did not answer"
    return text


@click.command()
@click.argument("query")
@click.option("--limit", default=LIMIT, show_default=True, type=click.IntRange(1, SEARCH_MAX),
              metavar="N", help="Show at most N hits, the best.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: searched (false: nobody could), node (who searched), answers (each "
                   "data node's answer when nobody could), hits (path, title, snippet, score), "
                   "coverage (searched shards of 64, missing nodes).")
@click.pass_obj
def search(ctl: Ctl, query: str, limit: int, as_json: bool) -> None:
    """Search the knowledge base's pages for the words of QUERY.

    One row per hit, best first: the page's path, title and the text
    around the words found. `crewletctl pages PATH` shows a whole page.

    Exits 0 (with hits or "no pages matched"), 1 if the knowledge base
    could not be searched (the message names each data node's answer), 69
    when no node answers.
    """
    if not query.strip():
        raise click.BadParameter("the query is empty", param_hint="QUERY")
    result = normalize_search(ctl.ask("estate_search", ESTATE_TIMEOUT + CALL_TIMEOUT, query=query,
                                      limit=limit, wait=ESTATE_TIMEOUT))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        sys.exit(0 if result["searched"] else EXIT_REFUSED)
    if not result["searched"]:
        fail(f"could not be searched: {answers_text(result['answers'])}", EXIT_REFUSED)
    from rich.text import Text

    from crewlet.ctl.render import search_view

    _console().print(search_view(result, query=query, limit=limit))
    partial = partial_text(result.get("coverage"))
    if partial:
        _console().print(Text(partial, style="yellow"))
