"""A node's copy of the estate: the LMDB layout, the reads, the digest.

One LMDB environment per data node, ``<data_dir>/estate``. LMDB allows one
writer and many readers in many processes: the applier (:mod:`apply`) is the
writer, and any role of the node reads the same files through a
:class:`Reader`, without asking anybody (DESIGN §6).

Values are msgpack; numbers in keys are 8-byte big-endian (:func:`seq_key`)
so keys sort as the log does. The tables:

================  ===========================================  ===============
table             key → value                                  kind
================  ===========================================  ===============
``meta``          ``applied`` → seq                            replicated
``ops``           op id → its outcome                          replicated
``fences``        seat → the highest token seen                replicated
``tasks``         task id → row                                replicated
``comments``      task id, seq → row                           replicated
``pages``         path → row                                   replicated
``pages_by_seq``  seq → path (every page write and delete)     replicated
``files``         project, path → row                          replicated
``turns``         place → turn record                          replicated
``episodes``      seat, place → row                            replicated
``diary``         seat, seq → row                              replicated
``diary_digest``  seat, text digest → seq                      replicated
``conversations`` conversation id → row                        replicated
``messages``      conversation, place → row (below)            replicated
``runs``          run id → row                                 replicated
``approvals``     approval id → row                            replicated
``index``         secondary indexes (below) → a row's key      replicated
``events``        stream seq → event (the custody log)         this node's own
``local``         this node's own bookkeeping                  this node's own
================  ===========================================  ===============

``local`` keeps, among others, the rules the rows were applied under
(:func:`rules`): a copy applied under older rules is emptied (:func:`reset`)
and applied again from the log, so it holds what a copy made now would.

``index`` keys, ``\\0``-separated: ``task·all·seq``, ``task·status·<status>·seq``,
``task·assignee·<seat>·seq`` → task id; ``turn·seat·<seat>·seq`` → turns key;
``conv·all·seq``, ``conv·seat·<seat>·seq``, ``conv·status·<status>·seq`` →
conversation id (seq: the conversation's creation); ``run·conv·<conv>·all·seq``,
``run·conv·<conv>·<status>·seq``, ``run·status·<status>·seq`` → run id (seq:
the run's creation, so queued runs list in the order they were queued);
``run·messages·<run>`` → how many messages the run wrote (8 bytes);
``msg·id·<conv>·<message id>`` → the message's place; ``appr·all·seq``,
``appr·status·<status>·seq``, ``appr·conv·<conv>·seq`` → approval id.

A message's **place** is its run's start seq and its own seq, 8 bytes each:
a conversation's messages read in the order its runs ran (one at a time),
each run's in log order — a late tool result of an interrupted run stays
with its run, before the next run's — and one run's messages are one range
of keys, which a rollback removes. The queries give a place as ``[run start
seq, seq]``, the resume point of a page of messages.

A turn's **place** (:func:`turn_place`) orders turns as the log does and
names one turn among many an op may carry: the seq of the op that carried
its record times :data:`TURN_PLACES`, plus the record's position in that op
(0 for a lone ``turn.record``). It is the record's ``seq`` field, the
``before`` of ``turn.list`` and the key of the ``turns`` table; an episode's
``seq`` is a place too (a turn's, or the op's that wrote it at position 0),
so episodes and the turns they came from sort alike. A place is never a
floor: a floor is a log seq (a turn's log seq is its place //
:data:`TURN_PLACES`).

Turn records past the company's ``retention.turns_days`` are removed, with
their index entries, by ``turn.trim`` ops (the maintenance duty's), so every
copy removes the same rows. No retention removes conversations, their runs,
messages or approvals yet.

The replicated tables are what :func:`digest` hashes: two copies that applied
the same log have the same digest. ``events`` is not replicated: each event
of the ``EVENTS`` stream is kept by exactly one data node (custody).

An environment may be open once per process (an LMDB rule), so
:func:`open_env` hands out one handle per path and process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import struct
import threading
from typing import Any, Iterator

import lmdb
import msgpack

from crewlet import private
from crewlet.estate.ops import ANSWER_MAX_BYTES, LIST_DEFAULT, TURN_RECORDS_MAX, check_query

# Address space only: LMDB grows the file as it is written.
MAP_SIZE = 1 << 36
MAX_READERS = 512  # reader slots: every role's threads on the node, with room to spare

REPLICATED = ("meta", "ops", "fences", "tasks", "comments", "pages", "pages_by_seq", "files",
              "turns", "episodes", "diary", "diary_digest", "conversations", "messages", "runs",
              "approvals", "index")
NODE_LOCAL = ("events", "local")
TABLES = REPLICATED + NODE_LOCAL

APPLIED = b"applied"
RULES = b"estate.rules"  # in ``local``: see :func:`rules`
LOG_CREATED = b"estate.log_created"  # in ``local``: the log this copy follows (its creation time)
SEP = b"\0"

_U64 = struct.Struct(">Q")


def copy_path(data_dir: str) -> str:
    """Where a node's copy lives: ``<data_dir>/estate``."""
    return os.path.join(data_dir, "estate")


# Places per log seq (module doc): as many as an op carries turn records at
# most, so the two are one constant; a place stays under 2**53 (exact as
# JSON) for log seqs below 2**43.
TURN_PLACES = TURN_RECORDS_MAX


def turn_place(seq: int, position: int = 0) -> int:
    """The place of the turn record at *position* of the op at log seq *seq*."""
    return seq * TURN_PLACES + position


def seq_key(seq: int) -> bytes:
    return _U64.pack(seq)


def key_seq(key: bytes) -> int:
    return _U64.unpack(key[-8:])[0]


def join(*parts: str | bytes) -> bytes:
    # A list, not a generator: this makes every index key the applier writes.
    return SEP.join([p.encode() if p.__class__ is str else p for p in parts])


def place_key(conversation: str, started: int, seq: int) -> bytes:
    """Where a message is kept: its conversation, its run's start seq, its seq."""
    return join(conversation, b"") + _U64.pack(started) + _U64.pack(seq)


def key_place(key: bytes) -> list[int]:
    """``[run start seq, seq]`` of a ``messages`` key (:func:`place_key`)."""
    return [_U64.unpack(key[-16:-8])[0], _U64.unpack(key[-8:])[0]]


def fenced_key(op_id: str, token: int) -> bytes:
    """Where ``ops`` keeps an op's refusal for a stale fencing token: beside,
    not under, its id (an op id is printable ASCII, so it holds no NUL)."""
    return op_id.encode() + SEP + str(token).encode()


# One Packer per thread, reused: msgpack.packb makes a Packer for every call,
# a third of packing a row, and the applier packs every row and outcome (a
# Packer is not thread-safe; the writer thread and readers pack apart).
_packers = threading.local()


def pack(value: Any) -> bytes:
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(value)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


class StoreUnavailable(Exception):
    """This node has no copy to read (yet): no environment at the path."""


class Store:
    """An open environment and its tables."""

    def __init__(self, env: lmdb.Environment, dbs: dict[str, Any], path: str, readonly: bool):
        self.env = env
        self.dbs = dbs
        self.path = path
        self.readonly = readonly

    def applied(self) -> int:
        with self.env.begin() as txn:
            raw = txn.get(APPLIED, db=self.dbs["meta"])
        return _U64.unpack(raw)[0] if raw else 0


_open: dict[tuple[int, str], Store] = {}
_open_lock = threading.Lock()


def _skills():
    # apply first: it imports skills once the names skills takes from it are
    # defined; skills imported first would find apply half made (crewletd's
    # reads of its own copy import neither before).
    from crewlet.estate import apply, skills  # noqa: F401
    return skills


def open_env(path: str, *, readonly: bool = False) -> Store:
    """This process's handle on the copy at *path* (made on the first call).

    The writer (``readonly=False``) creates the environment and every table.
    A reader gets :class:`StoreUnavailable` while no writer has made them.
    """
    path = os.path.abspath(path)
    key = (os.getpid(), path)
    with _open_lock:
        store = _open.get(key)
        if store is not None and (readonly or not store.readonly):
            return store  # a writer's handle reads as well
        if store is not None:  # a reader's, and now this process writes: one handle, the writer's
            store.env.close()
            del _open[key]
        if readonly and not os.path.exists(os.path.join(path, "data.mdb")):
            raise StoreUnavailable(f"no estate copy at {path} (the applier has not made one)")
        if not readonly:
            private.make_dir(path)
        # sync on, metasync off: a commit is durable once the next one is, and
        # a system crash may undo only the last commit, which the log redoes
        # (the applied sequence is committed with the rows). Measured here:
        # 0.19 ms a commit against 0.33 ms with metasync.
        env = lmdb.open(path, map_size=MAP_SIZE, max_dbs=len(TABLES) + 4, subdir=True,
                        readonly=readonly, metasync=False, sync=True, max_readers=MAX_READERS,
                        create=not readonly, mode=private.FILE_MODE)
        try:
            dbs = {name: env.open_db(name.encode(), create=not readonly) for name in TABLES}
        except lmdb.NotFoundError:
            env.close()
            raise StoreUnavailable(f"the estate copy at {path} is not initialised yet") from None
        store = _open[key] = Store(env, dbs, path, readonly)
        return store


def open_file(path: str, *, readonly: bool = False) -> tuple[lmdb.Environment, dict[str, Any]]:
    """A copy at *path* that is not this node's live one (a snapshot being
    fetched or restored, an old copy being replaced), opened by itself with
    its tables: ``(env, dbs)``; the caller closes *env*. Not cached, unlike
    :func:`open_env`."""
    env = lmdb.open(path, map_size=MAP_SIZE, max_dbs=len(TABLES) + 4, subdir=True,
                    create=False, readonly=readonly)
    try:
        return env, {name: env.open_db(name.encode(), create=False) for name in TABLES}
    except BaseException:
        env.close()
        raise


def rules(store: Store) -> int | None:
    """The rules (:data:`crewlet.estate.apply.RULES`) this copy's rows were
    applied under; None if it never said (a copy made before rules were kept)."""
    with store.env.begin() as txn:
        raw = txn.get(RULES, db=store.dbs["local"])
    return int(raw) if raw is not None else None


class MigrationBusy(Exception):
    """Another process holds this copy's migration lock."""


@contextlib.contextmanager
def migration_lock(store: Store) -> Iterator[None]:
    """Hold this copy's advisory migration lock (``<copy>/migrate.lock``,
    ``flock``) for the block, or raise :class:`MigrationBusy` at once: a copy
    is migrated (emptied and applied again under new rules) by one process,
    never two — a restarted applier beside one that has not yet died, a
    second crewletd pointed at the same data dir. The kernel drops the lock
    with its holder, so a killed migrator leaves none behind."""
    fd = os.open(os.path.join(store.path, "migrate.lock"), os.O_RDWR | os.O_CREAT, private.FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise MigrationBusy(f"another process is migrating the estate copy at {store.path}") from None
        yield
    finally:
        os.close(fd)  # and the lock with it


def record_rules(store: Store, version: int) -> None:
    with store.env.begin(write=True) as txn:
        txn.put(RULES, str(version).encode(), db=store.dbs["local"])


def reset(store: Store, version: int) -> None:
    """Empty every replicated table (``applied`` with them) and record that
    the rows to come are applied under rules *version*, in one transaction: a
    copy is then "the log up to 0" and is applied again from the first op.
    Readers in other processes keep the snapshot they hold until they end it
    (LMDB); the node-local tables stay."""
    with store.env.begin(write=True) as txn:
        for name in REPLICATED:
            txn.drop(store.dbs[name], delete=False)
        txn.put(RULES, str(version).encode(), db=store.dbs["local"])


def close_env(store: Store) -> None:
    with _open_lock:
        if _open.get((os.getpid(), store.path)) is store:
            del _open[(os.getpid(), store.path)]
    store.env.close()


def digest(store: Store) -> str:
    """sha256 over every replicated table's keys and values, in order."""
    with store.env.begin() as txn:
        return digest_txn(txn, store.dbs)


def digest_txn(txn, dbs: dict[str, Any]) -> str:
    """:func:`digest` as *txn* sees the tables *dbs*."""
    h = hashlib.sha256()
    for name in REPLICATED:
        h.update(name.encode() + b"\n")
        for k, v in txn.cursor(db=dbs[name]):
            h.update(_U64.pack(len(k)) + k + _U64.pack(len(v)) + v)
    return h.hexdigest()


def dump(store: Store, tables: tuple[str, ...] = REPLICATED) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every row of *tables*, raw (for tests comparing copies, and debugging)."""
    with store.env.begin() as txn:
        return {name: list(txn.cursor(db=store.dbs[name])) for name in tables}


# ------------------------------------------------------------------- reads

class Reader:
    """The read queries (:data:`crewlet.estate.ops.QUERIES` but ``page.search``,
    which is :mod:`crewlet.estate.search`'s), each in its own read transaction."""

    def __init__(self, store: Store):
        self.store = store
        self.dbs = store.dbs

    def applied(self) -> int:
        return self.store.applied()

    def outcome(self, op_id: str, token: int | None = None) -> dict[str, Any] | None:
        """Op *op_id*'s outcome; with *token*, also its refusal for that stale
        token (kept apart: :func:`fenced_key`)."""
        with self.store.env.begin() as txn:
            raw = txn.get(op_id.encode(), db=self.dbs["ops"])
            if raw is None and token is not None:
                raw = txn.get(fenced_key(op_id, token), db=self.dbs["ops"])
        return unpack(raw) if raw else None

    def query(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run query *name*; OpError for an unknown query or bad arguments."""
        check_query(name, args)
        fn = getattr(self, "_q_" + name.replace(".", "_"))
        with self.store.env.begin(buffers=False) as txn:
            return fn(txn, args)

    # ---- one function per query

    def _get(self, txn, table: str, key: bytes) -> Any:
        raw = txn.get(key, db=self.dbs[table])
        return unpack(raw) if raw is not None else None

    def _newest(self, txn, table: str, prefix: bytes, limit: int | None,
                before: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Up to *limit* (None: all) rows of *table* whose key starts with
        *prefix*, newest (highest key) first, starting below *before* if given."""
        cur = txn.cursor(db=self.dbs[table])
        start = before if before is not None else prefix + b"\xff" * 9
        if not cur.set_range(start):
            if not cur.last():
                return
        elif cur.key() >= start and not cur.prev():
            return
        n = 0
        while limit is None or n < limit:
            k = cur.key()
            if not k.startswith(prefix):
                return
            yield k, cur.value()
            n += 1
            if not cur.prev():
                return

    def _q_task_get(self, txn, args):
        task = self._get(txn, "tasks", args["id"].encode())
        if task is None:
            return {"task": None, "comments": []}
        prefix = join(args["id"], b"")
        comments = []
        cur = txn.cursor(db=self.dbs["comments"])
        if cur.set_range(prefix):
            for k, v in cur:
                if not k.startswith(prefix):
                    break
                comments.append(unpack(v))
        return {"task": task, "comments": comments}

    def _q_task_list(self, txn, args):
        limit = args.get("limit", LIST_DEFAULT)
        if "status" in args:
            prefix = join("task", "status", args["status"], b"")
        elif "assignee" in args:
            prefix = join("task", "assignee", args["assignee"], b"")
        else:
            prefix = join("task", "all", b"")
        before = prefix + seq_key(int(args["after"][1:])) if "after" in args else None
        # Both given: the status index, filtered by assignee until enough matched.
        wanted = args.get("assignee") if "status" in args else None
        tasks = []
        for _, task_id in self._newest(txn, "index", prefix, None, before):
            row = self._get(txn, "tasks", task_id)
            if row is None or (wanted is not None and row.get("assignee") != wanted):
                continue
            row.pop("body", None)  # a list is lines: task.get has the body
            tasks.append(row)
            if len(tasks) >= limit:
                break
        return {"tasks": tasks}

    def _q_page_read(self, txn, args):
        return {"page": self._get(txn, "pages", args["path"].encode())}

    def _q_page_list(self, txn, args):
        prefix = args.get("prefix", "").encode()
        limit = args.get("limit", LIST_DEFAULT)
        pages = []
        cur = txn.cursor(db=self.dbs["pages"])
        # after: the next page of a listing starts past that path.
        start = max(prefix, args["after"].encode() + b"\x00") if "after" in args else prefix
        if cur.set_range(start):
            for k, v in cur:
                if not k.startswith(prefix) or len(pages) >= limit:
                    break
                row = unpack(v)
                row.pop("body", None)
                pages.append(row)
        return {"pages": pages}

    def _q_page_search(self, txn, args):
        raise NotImplementedError("page.search is answered by the search index")

    def _q_file_get(self, txn, args):
        return {"file": self._get(txn, "files", join(args["project"], args["path"]))}

    def _q_file_list(self, txn, args):
        prefix = join(args["project"], b"") if "project" in args else b""
        limit = args.get("limit", LIST_DEFAULT)
        files = []
        cur = txn.cursor(db=self.dbs["files"])
        # after: the next page starts past that (project, path).
        start = prefix
        if "after" in args:
            start = max(prefix, join(args["after"]["project"], args["after"]["path"]) + b"\x00")
        if cur.set_range(start):
            for k, v in cur:
                if not k.startswith(prefix) or len(files) >= limit:
                    break
                files.append(unpack(v))
        return {"files": files}

    def _q_turn_list(self, txn, args):
        limit = args.get("limit", LIST_DEFAULT)
        before = seq_key(args["before"]) if "before" in args else None
        since = args.get("since")
        if "seat" in args:
            prefix = join("turn", "seat", args["seat"], b"")
            rows = ((v, self._get(txn, "turns", v))
                    for _, v in self._newest(txn, "index", prefix, None,
                                             prefix + before if before else None))
        else:
            rows = ((k, unpack(v)) for k, v in self._newest(txn, "turns", b"", None, before))
        turns = []
        for _, turn in rows:
            if turn is None:
                continue
            # Newest first by log seq, which follows the start times closely but not
            # exactly (records land when turns end): stop at the first older than since.
            if since is not None and (turn.get("started_at") or 0) < since:
                break
            turns.append(turn)
            if len(turns) >= limit:
                break
        return {"turns": turns}

    def _seat_rows(self, txn, table: str, seat: str, limit: int) -> list[Any]:
        rows = [unpack(v) for _, v in self._newest(txn, table, join(seat, b""), limit)]
        rows.reverse()  # the newest N, oldest first: how a history reads
        return rows

    def _q_diary_list(self, txn, args):
        return {"entries": self._seat_rows(txn, "diary", args["seat"], args.get("limit", LIST_DEFAULT))}

    # Skills and episodes: crewlet.estate.skills reads them (imported at the
    # first read: it holds their apply functions too, which import this module).
    def _q_episode_list(self, txn, args):
        return _skills().q_episode_list(txn, self.dbs, args)

    def _q_episode_scan(self, txn, args):
        return _skills().q_episode_scan(txn, self.dbs, args)

    def _q_episode_count(self, txn, args):
        return _skills().q_episode_count(txn, self.dbs, args)

    def _q_skill_list(self, txn, args):
        return _skills().q_skill_list(txn, self.dbs, args)

    def _q_skill_read(self, txn, args):
        return _skills().q_skill_read(txn, self.dbs, args)

    def _q_skill_revisions(self, txn, args):
        return _skills().q_skill_revisions(txn, self.dbs, args)

    def _q_skill_drafts(self, txn, args):
        return _skills().q_skill_drafts(txn, self.dbs, args)

    def _q_op_outcome(self, txn, args):
        return {"outcome": self._get(txn, "ops", args["id"].encode())}

    def _q_event_list(self, txn, args):
        limit = args.get("limit", LIST_DEFAULT)
        events = []
        cur = txn.cursor(db=self.dbs["events"])
        if cur.set_range(seq_key(args.get("after", 0) + 1)):
            for k, v in cur:
                if len(events) >= limit:
                    break
                events.append({"seq": key_seq(k), "event": unpack(v)})
        return {"events": events}

    # ---- conversations (the index keys: module doc)

    def _ids(self, txn, prefix: bytes, *, newest: bool, limit: int, start: bytes | None,
             keep=None) -> tuple[list[Any], int | None]:
        """Up to *limit* rows named by the ``index`` entries under *prefix*
        (each a seq-keyed entry whose value is a row id, which *keep* looks
        up, None to pass it over), newest or oldest first, from past *start*;
        and the seq to resume from (None: no more). A page stops growing past
        :data:`ANSWER_MAX_BYTES` too."""
        cur = txn.cursor(db=self.dbs["index"])
        rows: list[Any] = []
        last = None
        size = 0
        if newest:
            entries = self._newest(txn, "index", prefix, None, start)
        else:
            def forward():
                if cur.set_range(start if start is not None else prefix):
                    for k, v in cur:
                        if not k.startswith(prefix):
                            return
                        yield k, v
            entries = forward()
        for k, v in entries:
            if len(rows) >= limit:
                return rows, last
            row = keep(v)
            if row is None:
                continue
            size += len(pack(row))
            if rows and size > ANSWER_MAX_BYTES:
                return rows, last
            rows.append(row)
            last = key_seq(k)
        return rows, None

    def _q_conversation_get(self, txn, args):
        conv = self._get(txn, "conversations", args["id"].encode())
        if conv is None:
            return {"conversation": None, "run": None, "approval": None}
        run = self._get(txn, "runs", conv["run"].encode()) if conv.get("run") else None
        if run is not None:
            run.pop("input", None)  # run.get has it: one answer stays one NATS message
        approval = (self._get(txn, "approvals", conv["approval"].encode())
                    if conv.get("approval") else None)
        return {"conversation": conv, "run": run, "approval": approval}

    def _q_conversation_list(self, txn, args):
        if "status" in args:
            prefix = join("conv", "status", args["status"], b"")
        elif "seat" in args:
            prefix = join("conv", "seat", args["seat"], b"")
        else:
            prefix = join("conv", "all", b"")
        start = prefix + seq_key(args["before"]) if "before" in args else None
        # Both given: the status index, filtered by seat.
        seat = args.get("seat") if "status" in args else None

        def keep(conv_id):
            row = self._get(txn, "conversations", conv_id)
            return row if row is not None and (seat is None or row["seat"] == seat) else None
        rows, nxt = self._ids(txn, prefix, newest=True, limit=args.get("limit", LIST_DEFAULT),
                              start=start, keep=keep)
        return {"conversations": rows, "next": nxt}

    def _q_conversation_messages(self, txn, args):
        prefix = join(args["conversation"], b"")
        limit = args.get("limit", LIST_DEFAULT)
        cur = txn.cursor(db=self.dbs["messages"])
        backward = "before" in args or args.get("newest", False)
        picked: list[tuple[bytes, bytes]] = []
        size = 0
        if backward:
            start = (prefix + seq_key(args["before"][0]) + seq_key(args["before"][1])
                     if "before" in args else None)
            for k, v in self._newest(txn, "messages", prefix, None, start):
                if len(picked) >= limit or (picked and size + len(v) > ANSWER_MAX_BYTES):
                    break
                picked.append((k, v))
                size += len(v)
            picked.reverse()
        else:
            start = prefix
            if "after" in args:
                start = prefix + seq_key(args["after"][0]) + seq_key(args["after"][1]) + b"\0"
            if cur.set_range(start):
                for k, v in cur:
                    if not k.startswith(prefix) or len(picked) >= limit \
                            or (picked and size + len(v) > ANSWER_MAX_BYTES):
                        break
                    picked.append((k, v))
                    size += len(v)

        def beyond(key: bytes, later: bool) -> bool:
            """Whether the conversation holds a message past *key* that way."""
            if later:
                return cur.set_range(key + b"\0") and cur.key().startswith(prefix)
            return any(True for _ in self._newest(txn, "messages", prefix, 1, key))
        if not picked:
            return {"messages": [], "after": None, "before": None}
        first, last = picked[0][0], picked[-1][0]
        return {"messages": [unpack(v) for _, v in picked],
                "after": key_place(last) if beyond(last, True) else None,
                "before": key_place(first) if beyond(first, False) else None}

    def _q_run_get(self, txn, args):
        return {"run": self._get(txn, "runs", args["id"].encode())}

    def _q_run_list(self, txn, args):
        status = args.get("status", "all")
        if "conversation" in args:
            prefix = join("run", "conv", args["conversation"], status, b"")
        elif "status" in args:
            prefix = join("run", "status", status, b"")
        else:
            return {"runs": [], "next": None}  # runs are listed by conversation or by status

        def keep(run_id):
            row = self._get(txn, "runs", run_id)
            if row is not None:
                row.pop("input", None)  # a list is lines: run.get has the input
            return row
        start = prefix + seq_key(args["after"]) + b"\0" if "after" in args else None
        rows, nxt = self._ids(txn, prefix, newest=False, limit=args.get("limit", LIST_DEFAULT),
                              start=start, keep=keep)
        return {"runs": rows, "next": nxt}

    def _q_approval_get(self, txn, args):
        return {"approval": self._get(txn, "approvals", args["id"].encode())}

    def _q_approval_list(self, txn, args):
        status = args.get("status")
        if "conversation" in args:
            prefix = join("appr", "conv", args["conversation"], b"")
        elif status is not None:
            prefix = join("appr", "status", status, b"")
            status = None  # the index says it already
        else:
            prefix = join("appr", "all", b"")

        def keep(approval_id):
            row = self._get(txn, "approvals", approval_id)
            return row if row is not None and (status is None or row["status"] == status) else None
        start = prefix + seq_key(args["after"]) + b"\0" if "after" in args else None
        rows, nxt = self._ids(txn, prefix, newest=False, limit=args.get("limit", LIST_DEFAULT),
                              start=start, keep=keep)
        return {"approvals": rows, "next": nxt}
