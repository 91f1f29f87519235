"""A knowledge base of 20,000 pages searched across three data nodes: the
search is split between them (64 shards), and with one node's applier
SIGSTOPped it still answers within the caller's wait, without that node's
shards, naming it.

Nodes share one real broker, as in test_fleet; the test process publishes
the pages straight to the log and searches as a node without data would
(tests/estate.py's ``routed``).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from crewlet.estate.router import SHARDS, SPLIT_AT, coverage, split_shards
from crewlet.estate.search import SearchIndex, SearchUnavailable, index_path
from tests.conftest import start_all, wait_for
from tests.estate import applied, log_last, op, publish_to, routed, run, until
from tests.fleet.test_fleet import fleet_node

pytestmark = pytest.mark.fleet

PAGES = 20_000
# The caller's wait for the search with a node stopped: the stopped node's
# range is given up when it passes.
WAIT = 4.0
TOPICS = ["deploy", "invoice", "rollback", "lease", "queue", "backup", "alert", "billing"]


def pages() -> list:
    return [op("page.write", {"path": f"kb/{TOPICS[i % 8]}/{i:05d}",
                              "title": f"{TOPICS[i % 8]} note {i}",
                              "body": f"runbook {TOPICS[i % 8]} {TOPICS[(i * 3) % 8]} step {i % 97} "
                                      + "detail " * (i % 5)},
               id=f"page-{i}", node="writer")
            for i in range(PAGES)]


def indexed(node) -> int:
    try:
        with SearchIndex(index_path(node.config["data_dir"]), readonly=True) as index:
            return index.indexed()
    except SearchUnavailable:
        return 0


@pytest.mark.timeout(240)
def test_a_search_over_20000_pages_with_a_data_node_stopped_answers_without_its_shards(natsd, make_node):
    # A long grace: crewletd must not end (and restart) the stopped applier.
    nodes = dict(zip("abc", start_all([fleet_node(make_node, natsd, n, node={"roles": ["data"]},
                                                  supervisor={"heartbeat_grace": 120, "wedge_after": 120})
                                       for n in "abc"])))
    wait_for(lambda: all(applied(n) >= 0 and os.path.exists(index_path(n.config["data_dir"]))
                         for n in nodes.values()), 30, what="three copies made")
    run(publish_to(natsd.url, pages()), 120)
    last = run(log_last(natsd.url))
    wait_for(lambda: all(indexed(n) >= last for n in nodes.values()), 120,
             what=f"every copy applied and indexed {PAGES} pages")

    async def searches():
        async with routed(natsd.url) as router:
            # A copy whose last record (every 2 s) is far behind the others is
            # left out of a split: wait for all three records to say caught up.
            await until(lambda: sorted(s.id for s in router.view.data_nodes()
                                       if s.in_service and not s.lagging and s.applied >= last)
                        == ["a", "b", "c"], 20, "three data nodes in service, none lagging")
            # The first search learns the corpus's size from one copy's whole search.
            first = await router.search("runbook deploy", 10, timeout=10)
            assert first.searched and first.coverage == coverage(SHARDS)
            assert router.corpus == PAGES >= SPLIT_AT
            split = await router.search("runbook deploy", 10, timeout=10)
            assert split.searched and split.nodes == ["a", "b", "c"], split
            assert split.coverage == {"searched": 64, "of": 64, "missing": []}
            assert [h["score"] for h in split.hits] == [h["score"] for h in first.hits]
            assert len(split.hits) == 10 and all("/deploy/" in h["path"] for h in split.hits)

            applier = nodes["b"].process_pids()["data_applier"]
            os.kill(applier, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                partial = await router.search("runbook deploy", 10, timeout=WAIT)
                took = time.monotonic() - t0
            finally:
                os.kill(applier, signal.SIGCONT)
            lo, hi = split_shards(["a", "b", "c"])["b"]
            assert took < WAIT + 0.5, took
            assert partial.searched and partial.partial and partial.nodes == ["a", "c"]
            assert partial.coverage == {"searched": SHARDS - (hi - lo), "of": SHARDS, "missing": ["b"]}
            assert partial.coverage["searched"] == 43
            assert "no answer within" in partial.answers["b"]
            assert len(partial.hits) == 10
            return took

    took = run(searches(), 60)
    print(f"partial search answered in {took:.2f}s")
