"""The knowledge index split over 64 search shards: a page's shard, a search
limited to a shard range on one index, the router's merge, and a search
split between in-process data nodes (one silent, one not listening).

The fleet-wide form (three crewletd data nodes, 20,000 pages, one applier
SIGSTOPped) is tests/fleet/test_search_fleet.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import subprocess
import sys
import time

import pytest

from crewlet.estate import router as router_mod
from crewlet.estate import wire
from crewlet.estate.origins import OPERATOR
from crewlet.estate.router import coverage, coverage_text, merge_hits, split_shards
from crewlet.estate.search import (SCHEMA_VERSION, SHARD_SHIFT, SHARDS, SearchIndex, check_shards,
                                   shard_of)
from tests.integration.test_router import fleet_test, page_op
from tests.unit.test_estate_search import Copy
from tests.estate import until

THIRDS = [(0, 21), (21, 42), (42, 64)]


def same_top(merged, whole) -> bool:
    """The same scores, best first, and the same pages above the last score
    (pages tied at the cut may differ: FTS5 breaks ties its own way, the
    merge by path)."""
    scores = [h["score"] for h in whole]
    if [h["score"] for h in merged] != scores:
        return False
    cut = scores[-1] if scores else None
    return ({h["path"] for h in merged if h["score"] != cut}
            == {h["path"] for h in whole if h["score"] != cut})


# ------------------------------------------------------------------ shards

def test_a_pages_shard_is_a_stable_hash_of_its_path_the_same_in_every_process():
    paths = [f"kb/page-{i}" for i in range(6400)] + ["kb/café", "運用/手順"]
    mine = [shard_of(p) for p in paths]
    assert all(0 <= s < SHARDS for s in mine)
    assert mine[0] == int.from_bytes(hashlib.sha256(b"kb/page-0").digest()[:8], "big") % 64
    # Another interpreter (another hash seed) gives the same shards.
    code = ("import sys; from crewlet.estate.search import shard_of; "
            "print(','.join(str(shard_of(p)) for p in sys.stdin.read().split('\\n')))")
    out = subprocess.run([sys.executable, "-c", code], input="\n".join(paths), text=True,
                         capture_output=True, env={"PYTHONHASHSEED": "12345"}, check=True,
                         cwd=sys.path[0] or None)
    assert [int(x) for x in out.stdout.strip().split(",")] == mine
    # Spread: every shard gets pages, none much more than its share.
    counts = [mine.count(s) for s in range(SHARDS)]
    assert min(counts) > 50 and max(counts) < 160


def test_a_shard_range_must_be_lo_below_hi_within_64():
    assert check_shards([0, 64]) == (0, 64) and check_shards((3, 4)) == (3, 4)
    for bad in ([0, 65], [5, 5], [-1, 3], [0], "0-3", [0.0, 3], [True, 3], None):
        with pytest.raises(ValueError):
            check_shards(bad)


# ------------------------------------------------------------------ one index

WORDS = ["deploy", "rollback", "invoice", "queue", "lease", "shard"]


def corpus(n: int):
    return [(f"kb/p{i:05d}", f"page {i} {WORDS[i % 6]}",
             " ".join(["deploy"] * (1 + i % 7) + [WORDS[(i * 7) % 6], f"tag{i % 13}"]))
            for i in range(n)]


@pytest.fixture
def indexed(tmp_path):
    copy = Copy(str(tmp_path / "estate"))
    copy.write_many(corpus(3000))
    index = SearchIndex(str(tmp_path / "estate-search.sqlite"))
    index.catch_up(copy.env)
    yield copy, index
    index.close()
    copy.env.close()


def test_every_page_is_stored_under_its_shard_and_counted(indexed):
    copy, index = indexed
    assert index.count() == 3000
    db = sqlite3.connect(index.path)
    rows = db.execute("SELECT id, path FROM docs").fetchall()
    db.close()
    assert len(rows) == 3000 and all(rowid >> SHARD_SHIFT == shard_of(path) for rowid, path in rows)
    # A rewrite keeps its rowid, a delete uncounts, a new page counts.
    copy.write("kb/p00001", "changed", "entirely different words")
    copy.delete("kb/p00002")
    copy.write("kb/new", "new page", "deploy")
    index.catch_up(copy.env)
    assert index.count() == 3000
    db = sqlite3.connect(index.path)
    after = dict(db.execute("SELECT path, id FROM docs").fetchall())
    db.close()
    assert after["kb/p00001"] == dict((p, r) for r, p in rows)["kb/p00001"]
    assert "kb/p00002" not in after and after["kb/new"] >> SHARD_SHIFT == shard_of("kb/new")


def test_a_range_search_finds_only_its_shards_and_the_ranges_merge_to_the_whole(indexed):
    _, index = indexed
    for query, limit in (("deploy", 10), ("deploy", 100), ("rollback", 25), ("tag3", 7)):
        whole = index.search(query, limit)
        parts = [index.search(query, limit, shards) for shards in THIRDS]
        for (lo, hi), hits in zip(THIRDS, parts):
            assert all(lo <= shard_of(h["path"]) < hi for h in hits)
        merged = merge_hits(parts, limit)
        # bm25 is the whole copy's on every range: the same pages, the same scores.
        assert same_top(merged, whole), (query, limit)
    # One shard, and every shard one by one, cover every match exactly once.
    every = [h["path"] for s in range(SHARDS) for h in index.search("invoice", 100, (s, s + 1))]
    assert len(every) == len(set(every)) == 500


def test_an_index_of_the_old_layout_is_rebuilt_with_shards(tmp_path):
    copy = Copy(str(tmp_path / "estate"))
    copy.write_many(corpus(200))
    path = str(tmp_path / "estate-search.sqlite")
    db = sqlite3.connect(path, isolation_level=None)
    for statement in ("CREATE TABLE docs (id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE)",
                      "CREATE VIRTUAL TABLE pages_fts USING fts5(title, body)",
                      "CREATE TABLE state (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
                      f"INSERT INTO state(key, value) VALUES ('indexed', {copy.seq})",
                      "INSERT INTO docs(id, path) VALUES (1, 'kb/p00000')",
                      "PRAGMA user_version = 1"):
        db.execute(statement)
    db.close()
    with SearchIndex(path) as index:
        assert index.indexed() == 0 and index.count() == 0    # dropped: made anew
        index.catch_up(copy.env)
        assert index.count() == 200 and index.indexed() == copy.seq
        halves = index.search("tag3", 100, (0, 32)) + index.search("tag3", 100, (32, 64))
        assert sorted(h["path"] for h in halves) == sorted(h["path"] for h in index.search("tag3", 100))
        assert len(halves) == 16
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    db.close()
    copy.env.close()


# ------------------------------------------------------------------ merging

def test_shards_split_evenly_between_nodes_and_coverage_says_what_is_missing():
    assert split_shards(["a", "b", "c"]) == {"a": (0, 21), "b": (21, 42), "c": (42, 64)}
    assert split_shards(["a"]) == {"a": (0, 64)}
    plan = split_shards([f"n{i}" for i in range(10)])
    assert sum(hi - lo for lo, hi in plan.values()) == 64
    assert all(hi - lo in (6, 7) for lo, hi in plan.values())
    assert coverage_text(coverage(64)) is None
    assert coverage(43, ["b"]) == {"searched": 43, "of": 64, "missing": ["b"]}
    assert coverage_text(coverage(43, ["b"])) == "partial: searched 43 of 64 shards; b did not answer"


def test_merge_takes_the_best_scores_first_and_each_page_once():
    a = [{"path": "x", "score": 9.0}, {"path": "y", "score": 2.0}]
    b = [{"path": "z", "score": 5.0}, {"path": "w", "score": 5.0}, {"path": "x", "score": 9.0}]
    assert [h["path"] for h in merge_hits([a, b], 3)] == ["x", "w", "z"]
    assert merge_hits([], 5) == [] and len(merge_hits([a, b], 10)) == 4


# ------------------------------------------------------------------ split between nodes

def wire_search(query: str, limit: int = 10, shards=None):
    return wire.read_request("page.search", {"query": query, "limit": limit}, shards=shards)


@fleet_test
async def test_a_split_search_merges_three_nodes_and_a_silent_one_costs_its_shards(fleet):
    """60 pages, the split threshold lowered to 10: the first search (corpus
    unknown) goes to one copy whole and learns the size; then every search
    is split a/b/c. A node nobody listens for has its range asked of the
    next, and is left out of the next split while silent; a node that does
    not answer within the wait costs its shards and is named."""
    old = router_mod.SPLIT_AT
    router_mod.SPLIT_AT = 10
    try:
        apps = {n: await fleet.add(n) for n in ("a", "b", "c")}
        router = await fleet.router("asker")
        await fleet.in_service(router.view, "a", "b", "c")
        for i in range(60):
            assert (await router.write(page_op(f"kb/p{i:02d}", f"deploy {'deploy ' * (i % 5)} n{i}")))["ok"]
        last = await fleet.log_last()
        await until(lambda: all(a.index.indexed() >= last for a in apps.values()), 10, "indexed")

        first = await router.search("deploy", 20)
        assert first.searched and first.coverage == coverage(64) and len(first.nodes) == 1
        assert router.corpus == 60
        # The applier answers a range search with its hits, its size and the range.
        ranged = (await apps["a"].handle(wire_search("deploy", 100, [21, 42]), origin=OPERATOR))["answer"]
        assert ranged["docs"] == 60 and ranged["shards"] == [21, 42]
        assert ranged["hits"] and all(21 <= shard_of(h["path"]) < 42 for h in ranged["hits"])
        bad = await apps["a"].handle(wire_search("deploy", 10, [3, 99]), origin=OPERATOR)
        assert bad["status"] == wire.BAD_REQUEST and "shards" in bad["reason"]

        split = await router.search("deploy", 20)
        assert split.searched and split.coverage == coverage(64) and split.nodes == ["a", "b", "c"]
        assert split.node == "a, b, c" and not split.partial
        assert same_top(split.hits, first.hits)

        # b not listening: it says so at once, and c searches b's shards too.
        await fleet.unlisten("b")
        moved = await router.search("deploy", 20)
        assert moved.coverage == coverage(64) and moved.nodes == ["a", "c"]
        assert moved.answers == {"b": "nobody listening (no applier running)"}
        assert same_top(moved.hits, first.hits)

        # c stuck: within the caller's wait the search answers without c's shards.
        async def stuck(*args, **kwargs):
            await asyncio.sleep(30)
        apps["c"]._read = stuck
        t0 = time.monotonic()
        partial = await router.search("deploy", 20, timeout=1.0)
        took = time.monotonic() - t0
        assert took < 1.5, took
        assert partial.searched and partial.partial
        # b went silent (nobody listening): this search was split a/c, 32 shards each.
        assert partial.coverage == {"searched": 32, "of": 64, "missing": ["c"]}
        assert partial.nodes == ["a"] and "b" not in partial.answers
        assert "c" in partial.answers and "no answer within" in partial.answers["c"]
        assert all(0 <= shard_of(h["path"]) < 32 for h in partial.hits)
        # c is silent now: the next search is split between the others only.
        after = await router.search("deploy", 20, timeout=2.0)
        assert after.coverage == coverage(64) and after.nodes == ["a"]
    finally:
        router_mod.SPLIT_AT = old
