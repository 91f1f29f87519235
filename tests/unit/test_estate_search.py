"""The knowledge-base search index (crewlet.estate.search) against real LMDB and SQLite files.

The LMDB copy is built here directly, in the layout the applier writes
(``pages``, ``pages_by_seq``, ``meta``), so these tests need nothing but the
index itself. Readers in other processes and a catch-up killed with SIGKILL
are real processes.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import struct
import subprocess
import sys

import lmdb
import msgpack
import pytest

from crewlet.estate.search import SearchIndex, SearchUnavailable, fts_query, last_page_change
from tests.conftest import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
U64 = struct.Struct(">Q")


class Copy:
    """An LMDB copy with the applier's page tables; every change takes the next seq."""

    def __init__(self, path: str):
        self.env = lmdb.open(path, max_dbs=32, map_size=1 << 30)
        self.pages = self.env.open_db(b"pages")
        self.by_seq = self.env.open_db(b"pages_by_seq")
        self.meta = self.env.open_db(b"meta")
        self.seq = 0

    def write(self, path: str, title: str, body: str) -> int:
        return self.write_many([(path, title, body)])

    def write_many(self, pages) -> int:
        with self.env.begin(write=True) as txn:
            for path, title, body in pages:
                self.seq += 1
                old = txn.get(path.encode(), db=self.pages)
                version = msgpack.unpackb(old)["version"] + 1 if old else 1
                row = {"path": path, "title": title, "body": body, "version": version,
                       "seq": self.seq, "created_at": 1.0, "created_by": "cto",
                       "updated_at": 1.0, "updated_by": "cto"}
                txn.put(path.encode(), msgpack.packb(row), db=self.pages)
                txn.put(U64.pack(self.seq), path.encode(), db=self.by_seq)
            txn.put(b"applied", U64.pack(self.seq), db=self.meta)
        return self.seq

    def delete(self, path: str) -> int:
        with self.env.begin(write=True) as txn:
            self.seq += 1
            txn.delete(path.encode(), db=self.pages)
            txn.put(U64.pack(self.seq), path.encode(), db=self.by_seq)
            txn.put(b"applied", U64.pack(self.seq), db=self.meta)
        return self.seq

    def other_op(self) -> int:
        """An op of another kind (a task, say): applied moves, pages do not."""
        with self.env.begin(write=True) as txn:
            self.seq += 1
            txn.put(b"applied", U64.pack(self.seq), db=self.meta)
        return self.seq


@pytest.fixture
def copy(tmp_path):
    c = Copy(str(tmp_path / "estate"))
    yield c
    c.env.close()


@pytest.fixture
def index(tmp_path):
    idx = SearchIndex(str(tmp_path / "estate-search.sqlite"))
    yield idx
    idx.close()


def paths(hits):
    return [h["path"] for h in hits]


def test_pages_are_found_by_words_of_title_and_body(copy, index):
    copy.write("ops/deploy", "Deploy runbook", "Roll the canary first, then the fleet.")
    last = copy.write("eng/onboarding", "Onboarding", "Ask the CTO for a Kubernetes account.")

    assert index.catch_up(copy.env) == last == index.indexed()
    assert paths(index.search("runbook")) == ["ops/deploy"]
    [hit] = index.search("kubernetes account")
    assert hit["path"] == "eng/onboarding" and hit["title"] == "Onboarding"
    assert "**Kubernetes**" in hit["snippet"] and "**account**" in hit["snippet"]
    assert isinstance(hit["score"], float) and hit["score"] > 0
    assert index.search("kubernetes runbook") == []  # every word must match
    assert index.count() == 2


def test_a_title_hit_outranks_a_body_hit(copy, index):
    copy.write_many([
        ("a/body", "Weekly notes", "We talked about billing and then about the invoice run."),
        ("b/title", "Billing", "How the monthly run works, step by step, for everyone."),
        ("c/none", "Hiring", "Nothing to see here."),
    ])
    index.catch_up(copy.env)
    hits = index.search("billing")
    assert paths(hits) == ["b/title", "a/body"]
    assert hits[0]["score"] > hits[1]["score"]


def test_a_new_version_replaces_the_old_text(copy, index):
    copy.write("kb/vpn", "VPN", "Use the wireguard client.")
    index.catch_up(copy.env)
    assert paths(index.search("wireguard")) == ["kb/vpn"]

    last = copy.write("kb/vpn", "VPN access", "Use the tailscale client.")
    assert index.catch_up(copy.env) == last
    assert index.search("wireguard") == []
    assert paths(index.search("tailscale")) == ["kb/vpn"]
    assert index.search("access")[0]["title"] == "VPN access"
    assert index.count() == 1


def test_a_deleted_page_is_no_longer_found(copy, index):
    copy.write("kb/old", "Legacy", "The mainframe procedure.")
    copy.write("kb/new", "Current", "The cloud procedure.")
    index.catch_up(copy.env)
    last = copy.delete("kb/old")
    assert index.catch_up(copy.env) == last
    assert index.search("mainframe") == []
    assert paths(index.search("procedure")) == ["kb/new"]
    assert index.count() == 1


def test_catch_up_is_idempotent_and_can_go_in_slices(copy, index):
    for i in range(5):
        copy.write(f"kb/p{i}", f"Page {i}", f"alpha beta{i}")
    copy.write("kb/p0", "Page 0", "alpha gamma")  # the same path again, later
    last = copy.delete("kb/p4")

    assert index.catch_up(copy.env, limit=2) == 2
    assert index.catch_up(copy.env, limit=2) == 4
    assert index.catch_up(copy.env, limit=2) == 6
    assert index.catch_up(copy.env, limit=2) == last == 7
    assert index.catch_up(copy.env) == last  # nothing new: nothing done
    assert index.catch_up(copy.env) == last
    assert sorted(paths(index.search("alpha"))) == ["kb/p0", "kb/p1", "kb/p2", "kb/p3"]
    assert paths(index.search("gamma")) == ["kb/p0"] and index.search("beta0") == []


def test_indexed_reaches_applied_past_the_last_page(copy, index):
    copy.write("kb/a", "A", "text")
    applied = copy.other_op()
    assert index.catch_up(copy.env) == applied == index.indexed()
    # a limit that stops short of the end reaches only the entries it took
    copy.write_many([("kb/b", "B", "x"), ("kb/c", "C", "y")])
    assert index.catch_up(copy.env, limit=1) == applied + 1


def test_an_index_not_caught_up_after_other_ops_still_reflects_the_copy(copy, index):
    """The applier catches up only after commits that changed pages: the
    index's own mark stays behind while other ops apply, and what a reader
    holding a floor compares is reflects(), the copy's applied up to which
    the index answers for it."""
    assert index.reflects(copy.env) == 0 and last_page_change(copy.env) == 0
    page = copy.write("kb/a", "A", "alpha")
    assert index.reflects(copy.env) == 0  # a page the index lacks: not past it
    index.catch_up(copy.env)
    others = [copy.other_op() for _ in range(3)]
    assert index.indexed() == page and last_page_change(copy.env) == page
    assert index.reflects(copy.env) == others[-1]  # nothing to index since: current
    # A page written and not yet indexed: the index reflects only what it has,
    # so a search carrying that page's seq as its floor waits.
    second = copy.write("kb/b", "B", "beta")
    copy.other_op()
    assert last_page_change(copy.env) == second
    assert index.reflects(copy.env) == page < second
    index.catch_up(copy.env)
    assert index.reflects(copy.env) == copy.seq and paths(index.search("beta")) == ["kb/b"]
    # A deleted page is a change too.
    gone = copy.delete("kb/a")
    assert index.reflects(copy.env) < gone
    index.catch_up(copy.env)
    assert index.reflects(copy.env) == gone and index.search("alpha") == []


def test_an_index_ahead_of_its_copy_is_rebuilt(tmp_path, index):
    first = Copy(str(tmp_path / "first"))
    first.write_many([(f"kb/{i}", "Old", "stale words") for i in range(5)])
    index.catch_up(first.env)
    first.env.close()

    replaced = Copy(str(tmp_path / "replaced"))  # a wiped, re-seeded copy
    last = replaced.write("kb/x", "Fresh", "new words")
    assert index.catch_up(replaced.env) == last
    assert index.search("stale") == [] and paths(index.search("fresh")) == ["kb/x"]
    replaced.env.close()


def test_a_copy_without_page_tables_indexes_nothing(tmp_path, index):
    env = lmdb.open(str(tmp_path / "empty"), max_dbs=32)
    assert index.catch_up(env) == 0
    env.close()


def test_readers_in_another_process_see_committed_catch_ups(tmp_path, copy, index):
    copy.write("kb/first", "First", "zebra crossing")
    index.catch_up(copy.env)
    code = ("import sys, json\n"
            "from crewlet.estate.search import SearchIndex\n"
            "idx = SearchIndex(sys.argv[1], readonly=True)\n"
            "for line in sys.stdin:\n"
            "    hits = idx.search(line.strip())\n"
            "    print(json.dumps([idx.indexed(), [h['path'] for h in hits]]), flush=True)\n")
    reader = subprocess.Popen([sys.executable, "-c", code, index.path], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": REPO},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        def ask(query):
            reader.stdin.write(query + "\n")
            reader.stdin.flush()
            return json.loads(reader.stdout.readline())

        assert ask("zebra") == [1, ["kb/first"]]
        last = copy.write("kb/second", "Second", "zebra stripes")
        index.catch_up(copy.env)  # committed while the reader stays open
        indexed, found = ask("zebra")
        assert indexed == last and sorted(found) == ["kb/first", "kb/second"]
    finally:
        reader.stdin.close()
        reader.wait(timeout=10)
    assert reader.returncode == 0


def test_a_reader_before_the_index_exists_is_unavailable(tmp_path):
    path = str(tmp_path / "nothing-yet.sqlite")
    with pytest.raises(SearchUnavailable, match="no search index at .*nothing-yet.sqlite"):
        SearchIndex(path, readonly=True)
    assert not os.path.exists(path)  # a reader never creates it


def test_a_read_only_handle_cannot_write(copy, index):
    reader = SearchIndex(index.path, readonly=True)
    with pytest.raises(PermissionError):
        reader.catch_up(copy.env)
    reader.close()
    with pytest.raises(SearchUnavailable, match="closed"):
        reader.search("anything")


def test_an_unreadable_index_file_is_rebuilt_by_the_writer(tmp_path, copy):
    path = tmp_path / "estate-search.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(SearchUnavailable, match="cannot be read"):
        SearchIndex(str(path), readonly=True)
    idx = SearchIndex(str(path))
    copy.write("kb/a", "Back", "rebuilt from the copy")
    assert idx.catch_up(copy.env) == 1 and paths(idx.search("rebuilt")) == ["kb/a"]
    idx.close()


HOSTILE = ['"', '""', 'AND OR', 'NOT', '*', '**', 'NEAR(', 'NEAR(a b, 2)', '-x', ':', 'title:deploy',
           '(', ')', '^', '+', '{title body}: x', "'; DROP TABLE docs; --", 'a"b', '"deploy',
           'x\x00y', '\x00', '\ud800', 'ünïcödé', '東京', '🙂', 'naïve café', 'dep* AND *',
           'a' * 500, ' '.join(['x'] * 250)]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_never_raise_sqlite_errors(copy, index, query):
    copy.write("kb/a", "Deploy", "Run the deploy script. NOT for NEAR use. Café in 東京 x y")
    index.catch_up(copy.env)
    try:
        hits = index.search(query)
    except ValueError as e:
        assert "nothing to search for" in str(e)
    else:
        assert isinstance(hits, list)
    assert paths(index.search("deploy")) == ["kb/a"]  # and the index is intact


@pytest.mark.parametrize("query", ['"', "*", ":", "", "   ", "🙂", "-- ()", "\x00"])
def test_queries_with_nothing_searchable_are_value_errors(index, query):
    with pytest.raises(ValueError, match="nothing to search for"):
        index.search(query)


def test_words_are_quoted_terms_and_a_trailing_star_a_prefix():
    assert fts_query("deploy the app") == '"deploy" "the" "app"'
    assert fts_query("dep*") == '"dep"*'
    assert fts_query('a"b NEAR(') == '"a""b" "NEAR("'
    assert fts_query("x\x00y") == '"x" "y"'


def test_prefix_and_diacritics(copy, index):
    copy.write("kb/a", "Deploying", "How we deploy the Café app")
    copy.write("kb/b", "Depot", "Where the trucks park")
    index.catch_up(copy.env)
    assert sorted(paths(index.search("dep*"))) == ["kb/a", "kb/b"]
    assert paths(index.search("deplo*")) == ["kb/a"]
    assert index.search("dep") == []  # without the star a word matches whole words only
    assert paths(index.search("cafe")) == ["kb/a"]
    assert paths(index.search("CAFÉ")) == ["kb/a"]


def test_limits(copy, index):
    copy.write_many([(f"kb/{i}", "Same", "common words") for i in range(20)])
    index.catch_up(copy.env)
    assert len(index.search("common", limit=7)) == 7
    for bad in (0, 101):
        with pytest.raises(ValueError, match="out of range"):
            index.search("common", limit=bad)


KILL_PAGES = 50_000
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa")


def test_a_catch_up_killed_midway_is_redone(tmp_path, copy):
    """SIGKILL a process in the middle of one big catch-up: nothing of it is
    committed, and the next catch-up indexes every page."""
    copy.write_many(
        (f"kb/page-{i}", f"Page {i}",
         " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(20)) + f" unique{i}")
        for i in range(KILL_PAGES))
    copy.env.sync()
    path = str(tmp_path / "estate-search.sqlite")
    code = ("import sys, lmdb, time\n"
            "from crewlet.estate.search import SearchIndex\n"
            "env = lmdb.open(sys.argv[1], max_dbs=32, readonly=True)\n"
            "SearchIndex(sys.argv[2]).catch_up(env)\n"
            "time.sleep(120)\n")  # finished too early: the test sees it committed
    child = subprocess.Popen([sys.executable, "-c", code, copy.env.path(), path], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": REPO})
    try:
        # The one transaction is under way once its pages spill into the WAL.
        wait_for(lambda: os.path.exists(path + "-wal") and os.path.getsize(path + "-wal") > 1 << 20,
                 timeout=30, what="the child's catch-up to be writing")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL

    reader = SearchIndex(path, readonly=True)
    assert reader.indexed() == 0 and reader.count() == 0  # nothing of it was committed

    index = SearchIndex(path)
    assert index.catch_up(copy.env) == copy.seq == KILL_PAGES
    assert index.indexed() == KILL_PAGES and reader.indexed() == KILL_PAGES
    assert index.count() == KILL_PAGES
    # Every page is in the index, and the FTS index agrees with the text it
    # holds to the token (FTS5's own check); searching all 50,000 one by one
    # would cost seconds, so a sample of them is searched for by its word.
    db = sqlite3.connect(path)
    assert {p for (p,) in db.execute("SELECT path FROM docs")} == {
        f"kb/page-{i}" for i in range(KILL_PAGES)}
    db.execute("INSERT INTO pages_fts(pages_fts, rank) VALUES ('integrity-check', 1)")
    db.close()
    for i in [*range(0, KILL_PAGES, 25), KILL_PAGES - 1]:
        assert paths(reader.search(f"unique{i}")) == [f"kb/page-{i}"]
    reader.close()
    index.close()
