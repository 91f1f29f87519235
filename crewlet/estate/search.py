"""The knowledge base's full-text index: SQLite FTS5 beside the node's copy.

What it is
----------
A file, ``<data_dir>/estate-search.sqlite``, holding every knowledge-base
page's title and body in an FTS5 table, so ``page.search`` answers with the
best pages first (bm25, a title hit weighing :data:`TITLE_WEIGHT` times a
body hit) and a snippet of each body around the words that matched.

Why FTS5
--------
It ships inside Python's own ``sqlite3`` (no dependency to vet or build), it
is maintained with SQLite itself, it ranks (bm25), makes snippets, does
prefix queries, folds case and diacritics (``unicode61 remove_diacritics
2``), and its WAL mode lets any number of reader processes search while one
process writes. A hand-written inverted index would have to earn all of that.

Derived from LMDB, never the truth
----------------------------------
The node's LMDB copy is the truth; this file is a cache of it that may be
deleted at any time and is then rebuilt. Only the applier (the one writer of
the copy) writes it, through :meth:`SearchIndex.catch_up`, after its own
commits. The index keeps one number, :meth:`SearchIndex.indexed`: the
sequence up to which it reflects the copy. Every page write and every page
delete puts the page's path into ``pages_by_seq`` at the op's seq, so
catching up is: read ``pages_by_seq`` after ``indexed``, and for each path
named there index what ``pages`` holds *now* (a row: upsert it; no row: the
page was deleted, drop it). Reading the current row rather than replaying
history makes every step idempotent: indexing a path twice leaves the same
index as indexing it once.

When the scan reaches the end of ``pages_by_seq`` (no ``limit`` cut it) the
indexed seq becomes the copy's ``applied`` seq read in the same LMDB
transaction, not just the last page seq: the index then says "current as of
applied", which is what a reader holding a floor needs to know.

The applier catches up only after a commit that changed a page (most ops are
tracker and turn writes: a catch-up with nothing to index was still a SQLite
write, 0.1-0.5 ms on every commit). So ``indexed`` may stay behind the copy
while pages do not change, and a reader asks :meth:`SearchIndex.reflects`: the
index reflects the copy up to its ``applied`` whenever ``indexed`` has
reached the copy's last page change (the last key of ``pages_by_seq``, which
only grows), else up to ``indexed``.

Crash safety
------------
One catch-up is one SQLite transaction holding both the index changes and
the new indexed seq. A process killed part-way leaves an uncommitted
transaction in the WAL, which SQLite discards on the next open; the indexed
seq is still the old one, so the next catch-up reads the same
``pages_by_seq`` entries again and, being idempotent, redoes exactly what was
lost. ``synchronous=NORMAL`` may lose the last commits on a power cut (never
corrupt the file): the indexed seq is lost with them, so they are redone too.

An index that claims more than the copy has applied belongs to another
history (the copy was wiped or replaced): :meth:`SearchIndex.catch_up`
empties it and indexes from the start. A file SQLite cannot read, or one
written by another schema version (``PRAGMA user_version``), is likewise
dropped and rebuilt by the writer.

Readers
-------
Other processes open the file with ``readonly=True`` (URI ``mode=ro``) and
see every committed catch-up. A reader finding no file, no tables yet, or an
unreadable file raises :class:`SearchUnavailable`, which callers report as
"could not be searched" — never as "nothing matched". A reader holding a
floor (its own page write's seq) searches once :meth:`SearchIndex.reflects`
the copy has reached it.

Queries
-------
:func:`fts_query` turns a user's words into quoted FTS5 terms ANDed
together, so no input is ever FTS5 syntax: ``AND``, ``NEAR(``, ``-x``,
``col:`` and quotes are searched as words. A word ending in ``*`` stays a
prefix search (``dep*`` finds "deploy").

Cost (measured: 100,000 pages of 80 words from a 20,000-word Zipf vocabulary)
------------------------------------------------------------------------------
Indexing them in one catch-up: ~7.5 s (~13,000 pages/s), a 125 MB file; a
catch-up of one page: ~0.2 ms; one with nothing to do: ~0.03 ms. A search:
median 0.4 ms for a word drawn uniformly from the vocabulary, ~10 ms for
one drawn by frequency, ~80-110 ms for a word on nearly every page (bm25
scores every matching page; FTS5 does not prune to the top k). A first
catch-up over a large copy can be taken in slices with ``limit``.

Shards
------
Every page belongs to one of :data:`SHARDS` (64) search shards, a stable hash
of its path (:func:`shard_of`: the first 8 bytes of its sha256, mod 64; the
same in every process and on every node). Above
:data:`crewlet.estate.router.SPLIT_AT` documents the router splits the
shards between the live data nodes; each searches its range
(``search(..., shards=(lo, hi))``) and the router merges. Every node holds
every page, so bm25's corpus statistics (document count, average length,
term frequencies) are the whole copy's on every node, and the scores of
hits from different ranges compare exactly: merging by score gives the same
top hits as one whole search.

A page's rowid carries its shard in its high bits (``shard << 32 | n``, *n*
counting up within the shard), so a shard range is one rowid range, which
FTS5 applies while it walks the matches: a third of the shards costs about a
third of the time (measured: 100,000 pages, a word on 36 % of them, 46 ms
whole, 14 ms for 21 of 64 shards).

Layout
------
``docs(id, path)`` maps a page path to the FTS rowid (``shard << 32 | n``),
so an upsert or delete by path is one index lookup; ``pages_fts(title,
body)`` is the FTS5 table (rowid = ``docs.id``); ``state(key, value)`` holds
``indexed`` and ``docs`` (how many pages, kept with every change so a search
answer can say how big the corpus is without counting it).
Schema 1 (rowids in insertion order) is rebuilt as schema 2 on the writer's
first open, from the copy, like any index of another version.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import unicodedata
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import lmdb
import msgpack

from crewlet import private
from crewlet.estate.ops import SEARCH_MAX
from crewlet.estate.store import APPLIED, key_seq, seq_key
from crewlet.estate.wire import SEARCH_SHARDS as SHARDS

# Bump when the tables change: a writer finding another version rebuilds.
SCHEMA_VERSION = 2
# A rowid's shard is its bits from here up (module docstring, "Shards").
SHARD_SHIFT = 32
# A title hit counts five body hits: a page named for the words is the page
# the searcher most likely wants.
TITLE_WEIGHT = 5.0
BODY_WEIGHT = 1.0
# Case-folded, diacritics removed ("cafe" finds "café"), Unicode-aware words.
TOKENIZER = "unicode61 remove_diacritics 2"
# The snippet: markdown bold around matched words (seats read markdown), and
# about a line of text around them.
SNIPPET_OPEN = "**"
SNIPPET_CLOSE = "**"
SNIPPET_ELLIPSIS = "…"
SNIPPET_TOKENS = 16
# A reader waits this long for a lock (a WAL reader rarely needs one: only
# while a crashed writer's WAL is recovered); the writer for a checkpoint.
BUSY_TIMEOUT = 5.0
# A big catch-up (a whole corpus at first start) grows the WAL to the size of
# the index; once checkpointed it is cut back to this rather than kept.
WAL_SIZE_LIMIT = 32 << 20
# What SQLite says of a file that is not (or no longer) a database: the
# writer drops such a file and rebuilds it. Nothing else is a reason to.
UNREADABLE = ("SQLITE_NOTADB", "SQLITE_CORRUPT")

_SCHEMA = (
    "CREATE TABLE docs (id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE)",
    f"CREATE VIRTUAL TABLE pages_fts USING fts5(title, body, tokenize='{TOKENIZER}')",
    f"INSERT INTO pages_fts(pages_fts, rank) VALUES ('rank', 'bm25({TITLE_WEIGHT}, {BODY_WEIGHT})')",
    "CREATE TABLE state (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT INTO state(key, value) VALUES ('indexed', 0)",
    "INSERT INTO state(key, value) VALUES ('docs', 0)",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)

# The best pages first: FTS5 sorts by its configured rank (the weighted
# bm25 above) itself and stops at the limit, so snippets are made for the
# returned rows only; the paths are joined on afterwards.
_SEARCH = f"""
SELECT d.path, h.title, h.snip, h.rank FROM (
    SELECT rowid, title, rank,
           snippet(pages_fts, 1, ?, ?, ?, {SNIPPET_TOKENS}) AS snip
    FROM pages_fts WHERE pages_fts MATCH ? AND rowid BETWEEN ? AND ?
    ORDER BY rank LIMIT ?
) AS h JOIN docs AS d ON d.id = h.rowid
ORDER BY h.rank
"""


def index_path(data_dir: str) -> str:
    """Where a node's index lives, beside its copy: ``<data_dir>/estate-search.sqlite``."""
    return os.path.join(data_dir, "estate-search.sqlite")


def shard_of(path: str) -> int:
    """The search shard of the page at *path*: 0..SHARDS-1, the same everywhere."""
    return int.from_bytes(hashlib.sha256(path.encode("utf-8", "surrogatepass")).digest()[:8],
                          "big") % SHARDS


def check_shards(shards: Any) -> tuple[int, int]:
    """*shards* (``[lo, hi)``, a list or tuple of two ints, 0 <= lo < hi <= SHARDS)
    as a tuple; ValueError otherwise."""
    if (not isinstance(shards, (list, tuple)) or len(shards) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in shards)
            or not 0 <= shards[0] < shards[1] <= SHARDS):
        raise ValueError(f"shards must be [lo, hi) with 0 <= lo < hi <= {SHARDS}, got {shards!r}")
    return shards[0], shards[1]


def _rowids(shards: tuple[int, int]) -> tuple[int, int]:
    """The rowid range (inclusive) of shards ``[lo, hi)``."""
    lo, hi = shards
    return lo << SHARD_SHIFT, (hi << SHARD_SHIFT) - 1


class SearchUnavailable(Exception):
    """This node's search index cannot be read (yet): missing, being made, or broken."""


# ------------------------------------------------------------------ queries

def fts_query(text: str) -> str:
    """The user's words as an FTS5 query that cannot be a syntax error.

    Every whitespace-separated word becomes a quoted term (FTS5 then splits
    it into tokens as it split the pages, so ``foo-bar`` is the phrase
    "foo bar"); terms are ANDed. A word ending in ``*`` is a prefix term.
    Words without a letter or digit are dropped; ValueError if none is left.
    """
    # NUL ends an FTS5 string early and a lone surrogate cannot be encoded:
    # control and surrogate characters separate words like spaces do.
    cleaned = "".join(" " if unicodedata.category(ch) in ("Cc", "Cs") else ch for ch in text)
    terms = []
    for word in cleaned.split():
        prefix = word.endswith("*")
        core = word.rstrip("*")
        if not any(ch.isalnum() for ch in core):
            continue
        terms.append('"' + core.replace('"', '""') + '"' + ("*" if prefix else ""))
    if not terms:
        raise ValueError(f"nothing to search for in {text!r}: "
                         "a query needs at least one word with a letter or digit")
    return " ".join(terms)


# -------------------------------------------------------------------- index

class SearchIndex:
    """The index file at *path*: the applier's (writer) or a reader's handle.

    Connections are guarded by locks, so the handle may be used from worker
    threads (``asyncio.to_thread``) as well as the thread that made it. The
    writer reads through a second, read-only connection: under WAL a search
    then runs beside a long catch-up instead of waiting for it to commit.
    """

    def __init__(self, path: str, *, readonly: bool = False):
        self.path = os.path.abspath(path)
        self.readonly = readonly
        self._lock = threading.Lock()   # reads (_rdb)
        self._wlock = threading.Lock()  # catch-ups (_db, the writer's connection)
        self._db: sqlite3.Connection | None = None if readonly else self._open_writer()
        try:
            self._rdb: sqlite3.Connection | None = self._open_reader()
        except BaseException:
            if self._db is not None:
                self._db.close()
            raise

    # ---- opening

    def _open_reader(self) -> sqlite3.Connection:
        if not os.path.exists(self.path):
            raise SearchUnavailable(f"no search index at {self.path} "
                                    "(the applier has not made one yet)")
        db = None
        try:
            db = _connect(Path(self.path).as_uri() + "?mode=ro", uri=True)
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as e:
            if db is not None:
                db.close()
            raise SearchUnavailable(f"the search index at {self.path} cannot be read: {e}") from e
        if version not in (0, SCHEMA_VERSION):  # 0: the writer is still making it
            db.close()
            raise SearchUnavailable(f"the search index at {self.path} has schema {version}, "
                                    f"this code reads {SCHEMA_VERSION} (the applier rebuilds it)")
        return db

    def _open_writer(self) -> sqlite3.Connection:
        private.make_dir(os.path.dirname(self.path))
        # Made 0600 here, whatever the umask: SQLite gives the journal files
        # the database's mode, and an empty file is an empty database.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, private.FILE_MODE))
        try:
            return _prepare(_connect(self.path))
        except sqlite3.DatabaseError as e:
            if getattr(e, "sqlite_errorname", None) not in UNREADABLE:
                raise
        # Not a database SQLite can read: it is derived, so drop and rebuild.
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.remove(self.path + suffix)
            except FileNotFoundError:
                pass
        return _prepare(_connect(self.path))

    # ---- reading

    def indexed(self) -> int:
        """The log sequence up to which the index reflects the copy."""
        with self._lock:
            return self._read(_indexed)

    def reflects(self, env) -> int:
        """The log seq up to which this index reflects the copy *env* (a store
        or an ``lmdb.Environment``): what a reader holding a floor compares
        with it (the module doc, "Derived from LMDB"). The copy is read
        first: a page change it has not committed yet is after the seq
        returned, and ``indexed`` read after it only grows (or is reset to
        0 by a rebuild, which answers low, never high)."""
        applied, last_change = _page_marks(*_tables(env))
        indexed = self.indexed()
        return max(indexed, applied) if indexed >= last_change else indexed

    def count(self) -> int:
        """How many pages the index holds (kept with every change: not counted)."""
        with self._lock:
            return self._read(_docs)

    def search(self, query: str, limit: int = 10,
               shards: tuple[int, int] | list[int] | None = None) -> list[dict[str, Any]]:
        """The pages matching every word of *query*, best first.

        ``[{"path", "title", "snippet", "score"}]``; score is the weighted
        bm25 made positive (higher is better; the same for a page whichever
        range it was found in). *shards* ``[lo, hi)`` limits the search to
        the pages of those shards (None: all). ValueError for a query with
        nothing to search for, a limit out of 1..SEARCH_MAX (``page.search``'s)
        or a bad shard range; SearchUnavailable when the index cannot be read.
        """
        if not 1 <= limit <= SEARCH_MAX:
            raise ValueError(f"limit {limit} is out of range: 1..{SEARCH_MAX}")
        low, high = _rowids((0, SHARDS) if shards is None else check_shards(shards))
        args = (SNIPPET_OPEN, SNIPPET_CLOSE, SNIPPET_ELLIPSIS, fts_query(query), low, high, limit)
        with self._lock:
            rows = self._read(lambda db: db.execute(_SEARCH, args).fetchall())
        return [{"path": path, "title": title, "snippet": snip, "score": -rank}
                for path, title, snip, rank in rows]

    def _read(self, fn):
        if self._rdb is None:
            raise SearchUnavailable(f"the search index at {self.path} is closed")
        try:
            return fn(self._rdb)
        except sqlite3.Error as e:
            # A reader may look before the applier made the tables; anything
            # else SQLite says is equally "could not be searched".
            raise SearchUnavailable(f"the search index at {self.path} cannot be read: {e}") from e

    def _writer(self) -> sqlite3.Connection:
        if self.readonly:
            raise PermissionError(f"the search index at {self.path} is open read-only")
        if self._db is None:
            raise SearchUnavailable(f"the search index at {self.path} is closed")
        return self._db

    # ---- writing (the applier)

    def catch_up(self, env, limit: int | None = None) -> int:
        """Index the pages written or deleted since :meth:`indexed`; the new indexed seq.

        *env* is the copy: an ``lmdb.Environment``, or a store with ``.env``
        and ``.dbs`` (its open tables by name). *limit* caps how many
        ``pages_by_seq`` entries one call takes, so the applier can index in
        slices between its own commits. One SQLite transaction.
        """
        if limit is not None and limit < 1:
            raise ValueError(f"limit {limit} must be at least 1")
        lmdb_env, dbs = _tables(env)
        with self._wlock:
            db = self._writer()
            done = _indexed(db)
            change = _changes(lmdb_env, dbs, done, limit)
            if change.applied is not None and change.applied < done:
                # The copy has applied less than the index claims: the index
                # was made from another history (a wiped or replaced copy).
                _reset(db)
                done = 0
                change = _changes(lmdb_env, dbs, done, limit)
            if change.reached == done:
                return done
            _write(db, change)
            return change.reached

    def close(self) -> None:
        with self._lock:
            if self._rdb is not None:
                self._rdb.close()
                self._rdb = None
        with self._wlock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> "SearchIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------ sqlite

def _connect(target: str, *, uri: bool = False) -> sqlite3.Connection:
    # Autocommit (isolation_level=None): a transaction is exactly what
    # _transaction opens, never one Python's sqlite3 begins on its own.
    return sqlite3.connect(target, uri=uri, timeout=BUSY_TIMEOUT, isolation_level=None,
                           check_same_thread=False)


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    # IMMEDIATE: take the write lock up front rather than fail half-way.
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _prepare(db: sqlite3.Connection) -> sqlite3.Connection:
    """The writer's connection, WAL mode, tables of this schema version."""
    try:
        db.execute("PRAGMA journal_mode=WAL")
        # Durable against a killed process; a power cut may lose the last
        # commits, which the next catch-up redoes (module docstring).
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            with _transaction(db):
                for table in ("pages_fts", "docs", "state"):
                    db.execute(f"DROP TABLE IF EXISTS {table}")
                for statement in _SCHEMA:
                    db.execute(statement)
    except BaseException:
        db.close()
        raise
    return db


def _indexed(db: sqlite3.Connection) -> int:
    return db.execute("SELECT value FROM state WHERE key = 'indexed'").fetchone()[0]


def _docs(db: sqlite3.Connection) -> int:
    return db.execute("SELECT value FROM state WHERE key = 'docs'").fetchone()[0]


def _reset(db: sqlite3.Connection) -> None:
    with _transaction(db):
        db.execute("DELETE FROM pages_fts")
        db.execute("DELETE FROM docs")
        db.execute("UPDATE state SET value = 0 WHERE key IN ('indexed', 'docs')")


def _write(db: sqlite3.Connection, change: "_Change") -> None:
    """Apply *change* and store the seq it reaches, in one transaction."""
    with _transaction(db):
        # Drop the old text of every touched page (nothing for a new one),
        # forget deleted paths, then insert the current text under the
        # path's id: kept across versions, made for a new path as the next
        # free number of its shard (module docstring, "Shards").
        added = 0
        for path in change.deletes:
            row = db.execute("SELECT id FROM docs WHERE path = ?", (path,)).fetchone()
            if row is not None:
                db.execute("DELETE FROM pages_fts WHERE rowid = ?", row)
                db.execute("DELETE FROM docs WHERE id = ?", row)
                added -= 1
        for path, title, body in change.upserts:
            row = db.execute("SELECT id FROM docs WHERE path = ?", (path,)).fetchone()
            if row is not None:
                rowid = row[0]
                db.execute("DELETE FROM pages_fts WHERE rowid = ?", row)
            else:
                low, high = _rowids((shard := shard_of(path), shard + 1))
                top = db.execute("SELECT max(id) FROM docs WHERE id BETWEEN ? AND ?",
                                 (low, high)).fetchone()[0]
                rowid = low if top is None else top + 1
                db.execute("INSERT INTO docs(id, path) VALUES (?, ?)", (rowid, path))
                added += 1
            db.execute("INSERT INTO pages_fts(rowid, title, body) VALUES (?, ?, ?)",
                       (rowid, title, body))
        if added:
            db.execute("UPDATE state SET value = value + ? WHERE key = 'docs'", (added,))
        db.execute("UPDATE state SET value = ? WHERE key = 'indexed'", (change.reached,))


# -------------------------------------------------------------------- lmdb

class _Change:
    """What changed in the copy after some seq, read in one LMDB snapshot."""

    __slots__ = ("upserts", "deletes", "reached", "applied")

    def __init__(self, upserts: list[tuple[str, str, str]], deletes: list[str], reached: int,
                 applied: int | None):
        self.upserts = upserts    # (path, title, body) of pages present now
        self.deletes = deletes    # paths no longer in ``pages``
        self.reached = reached    # the seq the index reaches with this change
        self.applied = applied    # the copy's applied seq (None: not recorded)


def _tables(env) -> tuple[lmdb.Environment, tuple[Any, Any, Any] | None]:
    """The LMDB environment and its (pages, pages_by_seq, meta) handles.

    None for the handles when the copy has no such tables yet (nothing to index).
    """
    lmdb_env = getattr(env, "env", env)
    dbs = getattr(env, "dbs", None)
    names = ("pages", "pages_by_seq", "meta")
    if isinstance(dbs, dict) and all(name in dbs for name in names):
        return lmdb_env, tuple(dbs[name] for name in names)
    try:
        # open_db caches handles per environment: cheap after the first call.
        return lmdb_env, tuple(lmdb_env.open_db(name.encode(), create=False) for name in names)
    except lmdb.NotFoundError:
        return lmdb_env, None


def _page_marks(env: lmdb.Environment, dbs) -> tuple[int, int]:
    """The copy's applied seq and the seq of its last page change (0: none),
    read in one LMDB snapshot."""
    if dbs is None:
        return 0, 0
    _pages, by_seq, meta = dbs
    with env.begin() as txn:
        raw = txn.get(APPLIED, db=meta)
        cursor = txn.cursor(db=by_seq)
        last = key_seq(cursor.key()) if cursor.last() else 0
    return (key_seq(raw) if raw is not None else 0), last


def last_page_change(env) -> int:
    """The seq of the copy's last page write or delete (0: none): the
    applier catches the index up only when a commit moved it."""
    return _page_marks(*_tables(env))[1]


def _changes(env: lmdb.Environment, dbs, after: int, limit: int | None) -> _Change:
    """The pages named in ``pages_by_seq`` after seq *after* (at most *limit*
    entries), each as ``pages`` holds it now, and the seq that reaches.

    One read transaction, so the rows are those the entries led to; when the
    scan reaches the end, the seq reached is the copy's ``applied`` from the
    same snapshot (everything up to it is then reflected).
    """
    if dbs is None:
        return _Change([], [], after, None)
    pages, by_seq, meta = dbs
    paths: dict[bytes, None] = {}  # each path once, in log order
    reached, taken = after, 0
    with env.begin() as txn:
        raw = txn.get(APPLIED, db=meta)
        applied = key_seq(raw) if raw is not None else None  # the seq, packed as keys are
        cursor = txn.cursor(db=by_seq)
        more = cursor.set_range(seq_key(after + 1))
        while more and (limit is None or taken < limit):
            reached = key_seq(cursor.key())
            paths[bytes(cursor.value())] = None
            taken += 1
            more = cursor.next()
        if not more and applied is not None:
            reached = max(reached, applied)
        upserts, deletes = [], []
        for path in paths:
            raw = txn.get(path, db=pages)
            if raw is None:
                deletes.append(path.decode())
            else:
                row = msgpack.unpackb(raw, raw=False)
                upserts.append((path.decode(), row.get("title") or "", row.get("body") or ""))
    return _Change(upserts, deletes, reached, applied)
