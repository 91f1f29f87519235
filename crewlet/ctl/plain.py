"""What crewletctl prints without rich: the stable keys of ``--json`` and one-line answers.

Pure functions of a result dict, as in :mod:`crewlet.ctl.render` (which
re-exports them, and draws the tables), but importing little beyond the
standard library: a ``--json`` call, or a command that answers in a line
(``send``, ``drain``, ``evict``, ``secret set``), loads neither rich nor the
render module, whose imports are most of such a call's. :func:`normalize` (and :func:`normalize_seats`,
:func:`normalize_dead_letters`, :func:`normalize_tasks`, ...) give the dicts
the stable keys ``--json`` promises; the keys are documented in
:mod:`crewlet.ctl.render`.
"""

from __future__ import annotations

import math
import time
from typing import Any

from crewlet.coord import drain

# Keys every node / child / last_exit has in --json output (None when unknown).
NODE_KEYS = ("id", "roles", "pid", "uptime_s", "version", "broker", "data_dir", "config")
CHILD_KEYS = ("name", "pid", "state", "restarts", "uptime_s", "last_exit", "cpu_percent", "rss_bytes",
              "stats")
EXIT_KEYS = ("code", "signal", "reason", "at")
# Keys of ``fleet`` (when not null) and of its nodes / seats / duties in --json output.
FLEET_KEYS = ("company", "error", "connected", "nodes", "seats", "duties", "streams", "unplaceable",
              "reports", "drains")
# Keys of a broker stream in ``fleet.streams``: its consumers against its
# limit; on a cluster, its leader (null: none) and the replicas behind it.
STREAM_KEYS = ("name", "consumers", "max_consumers", "messages", "leader", "behind")
FLEET_NODE_KEYS = ("id", "roles", "broker", "labels", "version", "protocol", "rev", "renewed_at", "applied",
                   "status_error", "estate", "evicted", "seats", "duties", "conversations", "draining")
# Keys of a fleet node's ``estate`` record (its applier's, in ``status``) when not null.
COPY_KEYS = ("node", "applied", "in_service", "reason", "log_first", "log_last", "at")
FLEET_LEASE_KEYS = ("name", "node", "token")  # a seat or a duty and who holds it
# Keys of a row of ``seats`` and of a dead letter in --json output.
SEAT_KEYS = ("seat", "owner", "token", "pending", "in_flight", "redelivered", "ack_floor", "dead_letters",
             "last_turn", "error")
DEAD_LETTER_KEYS = ("seq", "seat", "reason", "deliveries", "original_seq", "at", "trigger", "text")
# Keys of a task, a comment, a page and a search hit in --json output (rows as
# the estate keeps them: crewlet/estate/apply.py).
TASK_KEYS = ("id", "title", "status", "assignee", "labels", "parent", "rev", "body", "created_at",
             "created_by", "updated_at", "updated_by")
COMMENT_KEYS = ("id", "task", "body", "created_at", "created_by")
PAGE_KEYS = ("path", "title", "version", "created_at", "created_by", "updated_at", "updated_by")
HIT_KEYS = ("path", "title", "snippet", "score")

NONE = "-"
UNKNOWN = "?"  # a value that is there but not a number we can show (NaN, infinite, wrong type)


def normalize(status: dict[str, Any]) -> dict[str, Any]:
    """*status* with every key of NODE_KEYS / CHILD_KEYS / EXIT_KEYS present;
    other keys pass through untouched."""
    out = dict(status)
    out["node"] = {**dict.fromkeys(NODE_KEYS), **(status.get("node") or {})}
    children = []
    for child in status.get("children") or []:
        child = {**dict.fromkeys(CHILD_KEYS), **child}
        if isinstance(child["last_exit"], dict):
            child["last_exit"] = {**dict.fromkeys(EXIT_KEYS), **child["last_exit"]}
        children.append(child)
    out["children"] = children
    out.setdefault("supervisors", [])
    out["fleet"] = normalize_fleet(status.get("fleet"))
    return out


def normalize_fleet(fleet: dict[str, Any] | None) -> dict[str, Any] | None:
    """``fleet`` with FLEET_KEYS (lists empty when missing) and every node /
    seat / duty with its keys; None stays None (the node is in no fleet)."""
    if not isinstance(fleet, dict):
        return None
    out = {**dict.fromkeys(FLEET_KEYS), **fleet}
    out["nodes"] = [{**dict.fromkeys(FLEET_NODE_KEYS), **n, "seats": n.get("seats") or [],
                     "duties": n.get("duties") or [],
                     "estate": {**dict.fromkeys(COPY_KEYS), **n["estate"]}
                     if isinstance(n.get("estate"), dict) else None}
                    for n in fleet.get("nodes") or []]
    for key in ("seats", "duties"):
        out[key] = [{**dict.fromkeys(FLEET_LEASE_KEYS), **x} for x in fleet.get(key) or []]
    if fleet.get("streams") is not None:
        out["streams"] = [{**dict.fromkeys(STREAM_KEYS), **x} for x in fleet["streams"]]
    return out


def normalize_seats(result: dict[str, Any]) -> dict[str, Any]:
    """The ``seats`` result with ``rev`` and every row with SEAT_KEYS (None when
    unknown, e.g. the mailbox numbers of a row with an ``error``)."""
    return {**result, "rev": result.get("rev"),
            "seats": [{**dict.fromkeys(SEAT_KEYS), **row} for row in result.get("seats") or []]}


def normalize_dead_letters(result: dict[str, Any]) -> dict[str, Any]:
    """The ``dlq`` result with every dead letter with DEAD_LETTER_KEYS."""
    return {**result, "dead_letters": [{**dict.fromkeys(DEAD_LETTER_KEYS), **d}
                                       for d in result.get("dead_letters") or []]}


def normalize_tasks(result: dict[str, Any]) -> dict[str, Any]:
    """The ``task.list`` answer with every task with TASK_KEYS."""
    return {**result, "tasks": [{**dict.fromkeys(TASK_KEYS), **t} for t in result.get("tasks") or []]}


def normalize_task(result: dict[str, Any]) -> dict[str, Any]:
    """The ``task.get`` answer: ``task`` with TASK_KEYS (None when there is
    no such task) and every comment with COMMENT_KEYS."""
    task = result.get("task")
    return {**result, "task": {**dict.fromkeys(TASK_KEYS), **task} if isinstance(task, dict) else None,
            "comments": [{**dict.fromkeys(COMMENT_KEYS), **c} for c in result.get("comments") or []]}


def normalize_pages(result: dict[str, Any]) -> dict[str, Any]:
    """The ``page.list`` answer with every page with PAGE_KEYS (no body)."""
    return {**result, "pages": [{**dict.fromkeys(PAGE_KEYS), **p} for p in result.get("pages") or []]}


def normalize_page(result: dict[str, Any]) -> dict[str, Any]:
    """The ``page.read`` answer: ``page`` with PAGE_KEYS and ``body``, or None."""
    page = result.get("page")
    return {**result, "page": {**dict.fromkeys((*PAGE_KEYS, "body")), **page} if isinstance(page, dict) else None}


def normalize_search(result: dict[str, Any]) -> dict[str, Any]:
    """The ``estate_search`` answer with ``searched``, ``node``, ``answers`` and
    every hit with HIT_KEYS."""
    return {**result, "searched": bool(result.get("searched")), "node": result.get("node"),
            "answers": dict(result.get("answers") or {}),
            "hits": [{**dict.fromkeys(HIT_KEYS), **h} for h in result.get("hits") or []]}


# ------------------------------------------------------------------ values

def finite(value: Any) -> float | None:
    """*value* if it is an int or float (not a bool) and finite; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:  # an int too big for a float
        return None


def human_duration(seconds: Any) -> str:
    """12s, 3m12s, 2h05m, 3d04h; '-' for None, '?' for anything not a finite number."""
    if seconds is None:
        return NONE
    if finite(seconds) is None:
        return UNKNOWN
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def took_text(ms: Any) -> str:
    """How long a turn took: 850ms, 1.2s, 3m12s; '-' for None, '?' for not a finite number."""
    if ms is None:
        return NONE
    if finite(ms) is None:
        return UNKNOWN
    if ms < 1000:
        return f"{ms:.0f}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    return human_duration(ms / 1000)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ------------------------------------------------------------------ send

def sent_text(result: dict[str, Any]) -> str:
    """'sent to alice (trigger 3f2a…, seq 12)'; a duplicate says it was not sent again."""
    where = f"(trigger {result.get('trigger')}, seq {result.get('seq')})"
    if result.get("duplicate"):
        return f"already in {result.get('seat')}'s mailbox {where}: not sent again"
    return f"sent to {result.get('seat')} {where}"


def worked_already_text() -> str:
    return "its trigger was worked already: no new turn (crewletctl seats shows the last turns)"


def turn_text(turn: dict[str, Any]) -> str:
    """A turn record for a terminal: outcome, rounds, tool calls, tokens and
    times on one line, a line per tool call, the error, then the reply."""
    tokens = turn.get("tokens") or {}
    calls = turn.get("tool_calls") or []
    head = (f"turn {turn.get('outcome') or 'unknown'} on {turn.get('node') or NONE}: "
            f"{plural(turn.get('rounds') or 0, 'round')}, {plural(len(calls), 'tool call')}, "
            f"tokens {tokens.get('input', 0)} in / {tokens.get('output', 0)} out, "
            f"took {took_text(turn.get('took_ms'))} (provider {took_text(turn.get('provider_ms'))})")
    if (finite(turn.get("deliveries")) or 0) > 1:
        head += f", delivery {turn['deliveries']}"
    lines = [head]
    for call in calls:
        line, error = f"  round {call.get('round', NONE)}: {call.get('name')}", call.get("error")
        if error:  # a message, or just True
            line += f" failed: {error}" if isinstance(error, str) else " failed"
        lines.append(line)
    if turn.get("error"):
        lines.append(f"error: {turn['error']}")
    if turn.get("outcome") in ("failed", "fenced", "interrupted"):
        lines.append("the mail goes back to the mailbox for another delivery, or to the dead letters "
                     "(crewletctl dlq) when it cannot pass")
    if turn.get("reply"):
        lines += ["", str(turn["reply"])]
    return "\n".join(lines)


def no_turn_text(wait: float) -> str:
    return f"no turn finished within {wait:g}s (the mail is in the mailbox)"


# ------------------------------------------------------------------ drain, evict, search, secrets

def drain_text(result: dict[str, Any]) -> str:
    """'draining n2 (by crewletctl@n1): turns running at 12:00:00 are cut short'
    or 'n2 is undrained: it takes work again'."""
    node, order = result.get("node"), result.get("draining")
    if not isinstance(order, dict):
        return f"{node} is undrained: it takes work again"
    until = time.strftime("%H:%M:%S", time.localtime(order.get("until") or 0))
    return f"draining {node} (by {order.get('by', '?')}): turns still running at {until} are cut short"


def drain_progress(node: dict[str, Any] | None, node_id: str) -> str:
    """'n2 holds 3 seats, 1 duty, 0 runs' / 'n2 is drained: it holds nothing' /
    'n2 is not up (it comes back drained)'."""
    if node is None:
        return f"{node_id} is not up (it comes back drained)"
    if drain.holds_nothing(node):
        return f"{node_id} is drained: it holds nothing"
    return (f"{node_id} holds {plural(len(node.get('seats') or []), 'seat')}, "
            f"{len(node.get('duties') or [])} dut{'y' if len(node.get('duties') or []) == 1 else 'ies'}, {plural(node.get('conversations') or 0, 'run')}")


def evict_text(result: dict[str, Any]) -> str:
    """'evicted n2: disk failed' or 'n2 is no longer evicted'."""
    node = result.get("node")
    if result.get("evicted"):
        return f"evicted {node}: {result.get('reason')}"
    return f"{node} is no longer evicted"


def answers_text(answers: dict[str, Any] | None) -> str:
    """Each data node's answer, worded as the router words them."""
    from crewlet.estate.router import describe  # the router imports nats: only a search nobody could run says this

    return describe(answers or {})


def secret_set_text(result: dict[str, Any]) -> str:
    """'set openai, version 3 (sealed with key 1a2b…): every node uses it within a second'."""
    s = result.get("secret") or {}
    grace = s.get("previous_until")
    text = f"set {s.get('name')}, version {s.get('version')} (sealed with key {s.get('key')})"
    if finite(grace):
        text += f"; version {int(s.get('version', 1)) - 1} is still taken until " \
                f"{time.strftime('%H:%M:%S', time.localtime(grace))}"
    return text
