"""Skills and episodes in the estate: what their ops write and how they are read (DESIGN §15).

**A skill** is an Agent Skills folder (:mod:`crewlet.skills.format`); the
estate keeps every **revision** of it whole — all its files, checked as one
by :func:`crewlet.skills.format.check` on every copy — at the log seq of the
op that made it. The knowledge base mirrors the current revision as pages,
``skills/<name>/<path, lower case>`` titled with the file's own path, so a
seat's ``page_read`` and the search find a skill like any page. Revisions are
made by:

* ``skill.write`` — every file of the skill (a person: the API, ``crewletctl
  skills push``);
* ``page.write`` / ``page.delete`` of a page under ``skills/<name>/`` — one
  file changed, the others kept (a seat's ``page_write``); the first write of
  a skill must be its ``skill.md``, and deleting that page retires the skill;
* ``skill.retire`` — the skill's pages go; its history stays;
* a **promotion** — a draft's files become the skill's next revision, in the
  same op as the ``approval.decide`` that approves it (or the learning
  passes' own, under ``learning.auto_promote``).

``skill.draft`` is curation's: the draft's pages under ``skills/drafts/<name>/``,
the draft's row (its cluster, seat, episodes) and a pending approval of kind
``promotion`` that a person decides through the approvals API. A cluster is
drafted once: a second draft of it changes nothing.

A run **pins** the skills as of a log seq (its ``run.create``'s): the
``skill.list`` and ``skill.read`` queries take ``as_of`` and answer from the
revisions at or below it — so a run's next request, served by any copy,
sees the skills its run started with.

**Episodes** are derived, not written: a ``turn.record`` op whose record
says ``done`` or ``failed`` makes its seat's episode for the trigger (who it
worked with, what was asked, the tools used, how it ended, a summary), one per
(seat, trigger) — a redone turn's record, a replay, a second ``done`` land no
second episode (a ``done`` replaces a ``failed``), and the interaction count of
(seat, counterparty) rises once per trigger. ``episode.compact`` folds a seat's
episodes with one counterparty, up to a seq, into one.

Keys, in the ``index`` table (``\\0``-separated; seq8: 8-byte big-endian):

=================================  =============================================
``skill·rev·<name>·seq8``          a revision: name, seq, at, by, note, retired,
                                   meta, files [{path, body}], draft
``skill·now·<name>``               seq8 of the current revision (none: retired)
``skill·draft·<name>``             a draft's row
``skill·cluster·<cluster>``        the draft made of that cluster
``ep·trig·<seat>·<digest>``        seq8 of the trigger's episode (kept after a
                                   compaction: the trigger stays seen)
``ep·cp·<seat>·<cp>·seq8``         an episode with counterparty *cp*
``ep·count·<seat>·<cp>``           the interaction count, 8 bytes
=================================  =============================================

The episode rows themselves are the ``episodes`` table's (seat, seq8). An
episode's seq (seq8 in these keys) is a place (:func:`crewlet.estate.store.turn_place`):
its turn's, or the op's that wrote it at position 0.

This module's apply functions are :mod:`crewlet.estate.apply`'s (registered
there); like every apply function they read only the op and the tables.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterator

from crewlet.estate.apply import CONFLICT, FORBIDDEN, NOT_FOUND, Refused, _by, _get
from crewlet.estate.ops import COUNTERPARTY, EPISODE_TEXT_MAX, LIST_DEFAULT, Op
from crewlet.estate.store import join, key_seq, pack, seq_key, turn_place, unpack
from crewlet.skills import format as skill_format

PREFIX = "skills/"
DRAFTS = "skills/drafts/"
# The outcome key that names the skills an op changed: the applier broadcasts
# them (roles/data_applier) so every node's registry reads them again.
CHANGED = "skills_changed"
# What an episode keeps of a turn's ask and reply.
ASK_KEPT = 500
SUMMARY_KEPT = 500
TOOLS_KEPT = 50
_COUNTERPARTY = re.compile(COUNTERPARTY)


# ------------------------------------------------------------------ keys

def _rev_key(name: str, seq: int) -> bytes:
    return join("skill", "rev", name, seq_key(seq))


def _now_key(name: str) -> bytes:
    return join("skill", "now", name)


def _draft_key(name: str) -> bytes:
    return join("skill", "draft", name)


def _cluster_key(cluster: str) -> bytes:
    return join("skill", "cluster", cluster)


def _prefix_items(txn, dbs, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    cur = txn.cursor(db=dbs["index"])
    if cur.set_range(prefix):
        for k, v in cur:
            if not k.startswith(prefix):
                return
            yield k, v


# ------------------------------------------------------------- revisions

def _current(txn, dbs, name: str) -> dict[str, Any] | None:
    at = txn.get(_now_key(name), db=dbs["index"])
    return _get(txn, dbs, "index", _rev_key(name, key_seq(at))) if at is not None else None


def _as_of(txn, dbs, name: str, seq: int) -> dict[str, Any] | None:
    """The revision of *name* that was current at log seq *seq* (None: none yet, or retired)."""
    cur = txn.cursor(db=dbs["index"])
    prefix = join("skill", "rev", name, b"")
    if cur.set_range(_rev_key(name, seq + 1)):
        found = cur.prev()
    else:
        found = cur.last()
    if not found or not cur.key().startswith(prefix):
        return None
    row = unpack(cur.value())
    return None if row["retired"] else row


def _check(name: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        meta = skill_format.check(name, [(f["path"], f["body"]) for f in files])
    except skill_format.SkillError as exc:
        raise Refused(f"skill {name}: {exc}") from None
    return meta.as_dict()


def _mirror(txn, dbs, op: Op, seq: int, base: str, old: list[dict[str, Any]],
            new: list[dict[str, Any]]) -> None:
    """The pages under *base* become *new*'s files (those only in *old* go)."""
    new_paths = {}
    for f in new:
        path = base + f["path"].lower()
        new_paths[path] = f
    for f in old:
        path = base + f["path"].lower()
        if path not in new_paths and txn.delete(path.encode(), db=dbs["pages"]):
            txn.put(seq_key(seq), path.encode(), db=dbs["pages_by_seq"])
    for path, f in new_paths.items():
        key = path.encode()
        page = _get(txn, dbs, "pages", key)
        if page is not None and page["body"] == f["body"] and page["title"] == f["path"]:
            continue  # unchanged: its version stays
        txn.put(key, pack({"path": path, "title": f["path"], "body": f["body"],
                           "version": (page["version"] + 1) if page else 1, "seq": seq,
                           "created_at": page["created_at"] if page else op.at,
                           "created_by": page["created_by"] if page else _by(op),
                           "updated_at": op.at, "updated_by": _by(op)}), db=dbs["pages"])
        txn.put(seq_key(seq), key, db=dbs["pages_by_seq"])


def _revise(txn, dbs, op: Op, seq: int, name: str, files: list[dict[str, Any]] | None, *,
            note: str | None = None, draft: str | None = None) -> dict[str, Any]:
    """Write revision *seq* of skill *name*: *files* (checked), or None to retire it."""
    old = _current(txn, dbs, name)
    if files is None:
        if old is None:
            raise Refused(f"no skill {name}", NOT_FOUND)
        meta, files = old["meta"], []
    else:
        files = sorted(({"path": f["path"], "body": f["body"]} for f in files), key=lambda f: f["path"])
        meta = _check(name, files)
    row = {"name": name, "seq": seq, "at": op.at, "by": _by(op), "note": note,
           "retired": not files, "meta": meta, "files": files, "draft": draft}
    txn.put(_rev_key(name, seq), pack(row), db=dbs["index"])
    if files:
        txn.put(_now_key(name), seq_key(seq), db=dbs["index"])
    else:
        txn.delete(_now_key(name), db=dbs["index"])
    _mirror(txn, dbs, op, seq, f"{PREFIX}{name}/", old["files"] if old else [], files)
    return {"skill": _brief(row), CHANGED: [name]}


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    """A revision without its files' bodies: what a listing shows."""
    return {"name": row["name"], "seq": row["seq"], "at": row["at"], "by": row["by"],
            "note": row.get("note"), "retired": row["retired"], "draft": row.get("draft"),
            "description": row["meta"].get("description"), "meta": row["meta"],
            "files": [f["path"] for f in row["files"]]}


def skill_write(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    name = op.args["name"]
    if name == "drafts":
        raise Refused("the name drafts is curation's (skills/drafts/): choose another", FORBIDDEN)
    return _revise(txn, dbs, op, seq, name, op.args["files"], note=op.args.get("note"))


def skill_retire(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    return _revise(txn, dbs, op, seq, op.args["name"], None, note=op.args.get("note"))


def page_write(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    """A ``page.write`` under ``skills/``: one file of a skill (module doc)."""
    path = op.args["path"]
    name, rel = _split(path)
    old = _current(txn, dbs, name)
    files = {f["path"].lower(): f for f in (old["files"] if old else [])}
    was = files.get(rel)
    version = _get(txn, dbs, "pages", path.encode())
    want = op.args.get("expect_version")
    if want is not None and want != (version["version"] if version else 0):
        raise Refused(f"page {path} is at version {version['version'] if version else 0}, not {want}")
    if old is None and rel != skill_format.SKILL_PAGE:
        raise Refused(f"skill {name} does not exist: write {PREFIX}{name}/{skill_format.SKILL_PAGE} first")
    # The file keeps the name a person gave it (its page's title), else the title given.
    title = op.args["title"]
    file_path = was["path"] if was else (title if title.lower() == rel else rel)
    if rel == skill_format.SKILL_PAGE:
        file_path = skill_format.SKILL_FILE
    files[rel] = {"path": file_path, "body": op.args["body"]}
    out = _revise(txn, dbs, op, seq, name, list(files.values()))
    return {"page": _get(txn, dbs, "pages", path.encode()), **out}


def page_delete(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    """A ``page.delete`` under ``skills/``: the file goes (its ``skill.md``: the skill retires)."""
    path = op.args["path"]
    name, rel = _split(path)
    page = _get(txn, dbs, "pages", path.encode())
    if page is None:
        raise Refused(f"no page {path}")
    want = op.args.get("expect_version")
    if want is not None and want != page["version"]:
        raise Refused(f"page {path} is at version {page['version']}, not {want}")
    old = _current(txn, dbs, name)
    if rel == skill_format.SKILL_PAGE or old is None:
        out = _revise(txn, dbs, op, seq, name, None)
    else:
        out = _revise(txn, dbs, op, seq, name, [f for f in old["files"] if f["path"].lower() != rel])
    return {"deleted": path, **out}


def _split(path: str) -> tuple[str, str]:
    """(skill name, file path under it) of a page under ``skills/``; refused
    for a draft's page (curation's) or one that names no skill."""
    if path.startswith(DRAFTS):
        raise Refused(f"{DRAFTS} is curation's: a draft is promoted, not written", FORBIDDEN)
    name, _, rel = path[len(PREFIX):].partition("/")
    if not rel or not re.match(r"^[a-z0-9]+(-[a-z0-9]+)*$", name) or len(name) > 64:
        raise Refused(f"page {path}: a skill's page is {PREFIX}<name>/<file>, its name lower-case "
                      f"letters, digits and single hyphens")
    return name, rel


# ------------------------------------------------------------------ drafts

def skill_draft(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    name, cluster = a["name"], a["cluster"]
    had = txn.get(_cluster_key(cluster), db=dbs["index"])
    if had is not None:
        return {"draft": _get(txn, dbs, "index", _draft_key(had.decode())), "already": True}
    if txn.get(_draft_key(name), db=dbs["index"]) is not None:
        raise Refused(f"a draft named {name} exists (another cluster's)", CONFLICT)
    if txn.get(a["approval"].encode(), db=dbs["approvals"]) is not None:
        raise Refused(f"approval {a['approval']} exists", CONFLICT)
    files = sorted(({"path": f["path"], "body": f["body"]} for f in a["files"]), key=lambda f: f["path"])
    meta = _check(name, files)
    draft = {"name": name, "cluster": cluster, "seat": a["seat"], "episodes": sorted(a["episodes"]),
             "status": "pending", "approval": a["approval"], "seq": seq, "at": op.at, "by": _by(op),
             "meta": meta, "files": files, "decided_at": None, "decided_by": None}
    txn.put(_draft_key(name), pack(draft), db=dbs["index"])
    txn.put(_cluster_key(cluster), name.encode(), db=dbs["index"])
    _mirror(txn, dbs, op, seq, f"{DRAFTS}{name}/", [], files)
    # The approval a person decides (the approvals API, the dashboard) — a
    # tool call's kind of approval, of no conversation: the skill.promote call.
    approval = {"id": a["approval"], "kind": "promotion", "conversation": None, "run": None,
                "seat": a["seat"], "tool": "skill.promote", "call_id": None,
                "args": {"skill": name, "draft": name, "cluster": cluster,
                         "description": meta.get("description"), "episodes": len(draft["episodes"])},
                "expires_at": a["expires_at"], "status": "pending", "decision": None, "note": None,
                "by": None, "expired": False, "seq": seq, "requested_at": op.at,
                "requested_by": _by(op), "decided_at": None}
    seq8 = seq_key(seq)
    for index_key in (join("appr", "all", seq8), join("appr", "status", "pending", seq8)):
        txn.put(index_key, a["approval"].encode(), db=dbs["index"])
    txn.put(a["approval"].encode(), pack(approval), db=dbs["approvals"])
    return {"draft": _draft_brief(draft), "approval": a["approval"]}


def _draft_brief(draft: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in draft.items() if k != "files"} | {"files": [f["path"] for f in draft["files"]]}


def decided(txn, dbs, op: Op, seq: int, approval: dict[str, Any]) -> dict[str, Any]:
    """A promotion approval was decided (``approval.decide``, in its op):
    approved, the draft becomes the skill's next revision; denied, it stays
    a draft, rejected. The outcome's additions."""
    name = approval["args"]["draft"]
    draft = _get(txn, dbs, "index", _draft_key(name))
    if draft is None:
        return {}
    approved = approval["decision"] == "approve"
    draft.update(status="promoted" if approved else "rejected", decided_at=op.at, decided_by=approval["by"])
    txn.put(_draft_key(name), pack(draft), db=dbs["index"])
    if not approved:
        return {}
    return _revise(txn, dbs, op, seq, name, draft["files"], note=f"promoted from draft {name}", draft=name)


# ---------------------------------------------------------------- episodes

def _counterparty(record: dict[str, Any]) -> str:
    cp = record.get("counterparty")
    if isinstance(cp, str) and _COUNTERPARTY.match(cp):
        return cp
    return "operator"


def _text(value: Any, kept: int) -> str:
    return value[:kept] if isinstance(value, str) else ""


def _tools(record: dict[str, Any]) -> list[str]:
    calls = record.get("tool_calls")
    names: list[str] = []
    if isinstance(calls, list):
        for call in calls:
            name = call.get("name") if isinstance(call, dict) else None
            if isinstance(name, str) and 0 < len(name) <= 200 and name not in names:
                names.append(name)
                if len(names) >= TOOLS_KEPT:
                    break
    return names


def _trig_key(seat: str, trigger: str) -> bytes:
    return join("ep", "trig", seat, hashlib.sha256(trigger.encode()).digest()[:16])


def _cp_key(seat: str, cp: str, seq: int) -> bytes:
    return join("ep", "cp", seat, cp, seq_key(seq))


def _count_key(seat: str, cp: str) -> bytes:
    return join("ep", "count", seat, cp)


def episode_of_turn(txn, dbs, op: Op, seq: int, record: dict[str, Any]) -> dict[str, Any] | None:
    """The episode a ``turn.record`` makes (module doc), or None: not a turn
    that ended, or its trigger's episode is in already."""
    outcome, trigger, seat = record.get("outcome"), record.get("trigger"), op.seat
    if seat is None or outcome not in ("done", "failed") or not isinstance(trigger, str) \
            or not 0 < len(trigger) <= 300:
        return None
    trig = _trig_key(seat, trigger)
    had = txn.get(trig, db=dbs["index"])
    cp = _counterparty(record)
    if had is not None:
        old = _get(txn, dbs, "episodes", join(seat, had))
        if old is None or old["outcome"] == "done" or outcome != "done":
            return None  # worked once: a redone turn, a replay, a compacted one
        txn.delete(join(seat, had), db=dbs["episodes"])  # a done replaces a failed
        txn.delete(_cp_key(seat, old["counterparty"], key_seq(had)), db=dbs["index"])
    row = {"seat": seat, "trigger": trigger, "counterparty": cp,
           "ask": _text(record.get("ask"), ASK_KEPT), "tools": _tools(record), "outcome": outcome,
           "summary": _text(record.get("error") if outcome == "failed" else record.get("reply"),
                            SUMMARY_KEPT),
           "seq": seq, "at": op.at, "compacted": 0}
    episode_put(txn, dbs, row)
    txn.put(trig, seq_key(seq), db=dbs["index"])
    if had is None:
        count = txn.get(_count_key(seat, cp), db=dbs["index"])
        txn.put(_count_key(seat, cp), seq_key((key_seq(count) if count else 0) + 1), db=dbs["index"])
    return row


def episode_put(txn, dbs, row: dict[str, Any]) -> None:
    txn.put(join(row["seat"], seq_key(row["seq"])), pack(row), db=dbs["episodes"])
    txn.put(_cp_key(row["seat"], row["counterparty"], row["seq"]), b"", db=dbs["index"])


def episode_compact(txn, dbs, op: Op, seq: int) -> dict[str, Any]:
    a = op.args
    seat, cp, through = a["seat"], a["counterparty"], a["through"]
    prefix = join("ep", "cp", seat, cp, b"")
    gone = [k for k, _ in _prefix_items(txn, dbs, prefix) if key_seq(k[-8:]) <= through]
    if not gone:
        raise Refused(f"seat {seat} has no episodes with {cp} up to seq {through}", NOT_FOUND)
    folded = 0
    for k in gone:
        seq8 = k[-8:]
        row = _get(txn, dbs, "episodes", join(seat, seq8))
        if row is not None:
            folded += row.get("compacted") or 1
            txn.delete(join(seat, seq8), db=dbs["episodes"])
        txn.delete(k, db=dbs["index"])
    row = {"seat": seat, "trigger": f"compacted:{through}", "counterparty": cp, "ask": "",
           "tools": [], "outcome": "compacted", "summary": a["summary"][:EPISODE_TEXT_MAX],
           # A place, as every episode's seq (crewlet.estate.store.turn_place).
           "seq": turn_place(seq), "at": op.at, "compacted": folded}
    episode_put(txn, dbs, row)
    return {"episode": row, "removed": len(gone)}


# -------------------------------------------------------------------- reads

def q_skill_list(txn, dbs, args: dict[str, Any]) -> dict[str, Any]:
    limit = args.get("limit", LIST_DEFAULT)
    seat = args.get("seat")
    if args.get("drafts"):
        drafts = [_draft_brief(unpack(v)) for _, v in _prefix_items(txn, dbs, join("skill", "draft", b""))]
        return {"skills": drafts[:limit]}
    as_of = args.get("as_of")
    skills = []
    if as_of is None:
        for k, v in _prefix_items(txn, dbs, join("skill", "now", b"")):
            skills.append(unpack(txn.get(_rev_key(k.split(b"\0")[2].decode(), key_seq(v)), db=dbs["index"])))
            if len(skills) >= limit and seat is None:
                break
    else:
        for name in _names(txn, dbs):
            row = _as_of(txn, dbs, name, as_of)
            if row is not None:
                skills.append(row)
    if seat is not None:
        skills = [r for r in skills if skill_format.applies_to(skill_format.Meta.from_dict(r["meta"]), seat)]
    return {"skills": [_brief(r) for r in skills[:limit]], "as_of": as_of}


def _names(txn, dbs) -> Iterator[str]:
    """Every skill name that ever had a revision, in order."""
    cur = txn.cursor(db=dbs["index"])
    prefix = join("skill", "rev", b"")
    key = prefix
    while cur.set_range(key) and cur.key().startswith(prefix):
        name = cur.key()[len(prefix):].split(b"\0")[0]
        yield name.decode()
        key = prefix + name + b"\x01"  # past every revision of that name


def q_skill_read(txn, dbs, args: dict[str, Any]) -> dict[str, Any]:
    name = args["name"]
    if args.get("draft"):
        row = _get(txn, dbs, "index", _draft_key(name))
    elif args.get("as_of") is not None:
        row = _as_of(txn, dbs, name, args["as_of"])
    else:
        row = _current(txn, dbs, name)
    if row is None:
        return {"skill": None, "file": None}
    want = (args.get("file") or skill_format.SKILL_FILE).lower()
    found = next((f for f in row["files"] if f["path"].lower() == want), None)
    brief = _draft_brief(row) if args.get("draft") else _brief(row)
    return {"skill": brief, "file": dict(found) if found is not None else None}


def q_skill_revisions(txn, dbs, args: dict[str, Any]) -> dict[str, Any]:
    limit = args.get("limit", LIST_DEFAULT)
    rows = [_brief(unpack(v)) for _, v in _prefix_items(txn, dbs, join("skill", "rev", args["name"], b""))]
    return {"revisions": rows[-limit:][::-1]}  # newest first


def q_skill_drafts(txn, dbs, args: dict[str, Any]) -> dict[str, Any]:
    limit, status = args.get("limit", LIST_DEFAULT), args.get("status")
    drafts = []
    for _, v in _prefix_items(txn, dbs, join("skill", "draft", b"")):
        draft = unpack(v)
        if status is None or draft["status"] == status:
            drafts.append(_draft_brief(draft))
            if len(drafts) >= limit:
                break
    return {"drafts": drafts}


def q_episode_list(txn, dbs, args: dict[str, Any]) -> dict[str, Any]:
    seat, limit, cp = args["seat"], args.get("limit", LIST_DEFAULT), args.get("counterparty")
    if cp is None:
        prefix = join(seat, b"")
        cur = txn.cursor(db=dbs["episodes"])
        rows = []
        found = _last_under(cur, prefix)
        while found and len(rows) < limit:
            rows.append(unpack(cur.value()))
            found = cur.prev() and cur.key().startswith(prefix)
    else:
        prefix = join("ep", "cp", seat, cp, b"")
        cur = txn.cursor(db=dbs["index"])
        rows = []
        found = _last_under(cur, prefix)
        while found and len(rows) < limit:
            row = _get(txn, dbs, "episodes", join(seat, cur.key()[-8:]))
            if row is not None:
                rows.append(row)
            found = cur.prev() and cur.key().startswith(prefix)
    rows.reverse()
    return {"episodes": rows}


def _last_under(cur, prefix: bytes) -> bool:
    """Put *cur* on the last key starting with *prefix*; False when there is none."""
    if cur.set_range(prefix[:-1] + bytes([prefix[-1] + 1])):
        found = cur.prev()
    else:
        found = cur.last()
    return bool(found) and cur.key().startswith(prefix)


def q_episode_scan(txn, dbs, args: dict[str, Any]) -> dict[str, Any]:
    limit = args.get("limit", LIST_DEFAULT)
    after = args.get("after")
    cur = txn.cursor(db=dbs["episodes"])
    start = join(after[0], seq_key(after[1])) + b"\0" if after else b""
    rows = []
    found = cur.set_range(start)
    while found and len(rows) < limit:
        rows.append(unpack(cur.value()))
        found = cur.next()
    nxt = [rows[-1]["seat"], rows[-1]["seq"]] if found and rows else None
    return {"episodes": rows, "next": nxt}


def q_episode_count(txn, dbs, args: dict[str, Any]) -> dict[str, Any]:
    prefix = join("ep", "count", args["seat"], b"")
    return {"counts": {k[len(prefix):].decode(): key_seq(v) for k, v in _prefix_items(txn, dbs, prefix)}}
