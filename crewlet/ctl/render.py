"""How crewletctl looks: the results crewletd sends, as rich renderables.

Pure functions of a result dict (what crewletd answers for ``status``,
``seats``, ``dlq`` or ``send``) and the wall-clock ``now``, so they are
tested without a node. :func:`normalize` (and :func:`normalize_seats`,
:func:`normalize_dead_letters`) give the dicts the stable keys ``--json``
promises; they and the one-line answers (``send``, ``drain``, ...) are
:mod:`crewlet.ctl.plain`'s, re-exported here, so that printing them does not
import rich.

The ``fleet`` key is the fleet as this node sees it (``Fleet.view()`` in
supervisor/fleet.py), null while the node is not in one. The ``stats`` of
the child named ``seats`` is its turn engine's last report (running turns,
slots, per seat its last turn), null until it sent one; that of the child
named ``data_applier`` is this node's applier's (its copy of the estate:
applied, in service or why not, the log's bounds, ops/s, requests, events
kept).

Each fleet node carries ``estate``, its applier's last record in the
``status`` bucket (``applied``, ``in_service``, ``reason``, ``log_first``,
``log_last``, ``at``; null before the first), and ``evicted`` (``reason``,
``at``; null unless an operator evicted it). The table's COPY column and the
lines under it judge them as the estate's router does
(:mod:`crewlet.estate.view`): a record older than its staleness limit is an
applier stopped, an eviction wins over the record.

Nothing here trusts a result's types: a number is shown only when it is a
finite int or float (:func:`finite`); absent (None) it is '-', anything else
(NaN, infinity, a string, a bool) is '?', never a traceback.

A turn record is what one seat's turn did (``TurnRecord`` in
crewlet/agent/turn.py); the stats keep a short form of each seat's last one
(``trigger, outcome, at, took_ms, error``, ``at`` being its start).
"""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from crewlet.coord import drain
from crewlet.ctl.plain import (CHILD_KEYS, COMMENT_KEYS, COPY_KEYS, DEAD_LETTER_KEYS, EXIT_KEYS,  # noqa: F401
                               FLEET_KEYS, FLEET_LEASE_KEYS, FLEET_NODE_KEYS, HIT_KEYS, NODE_KEYS, NONE,
                               PAGE_KEYS, SEAT_KEYS, STREAM_KEYS, TASK_KEYS, UNKNOWN, answers_text,
                               drain_progress, drain_text, evict_text, finite, human_duration, no_turn_text,
                               normalize, normalize_dead_letters, normalize_fleet, normalize_page,
                               normalize_pages, normalize_search, normalize_seats, normalize_task,
                               normalize_tasks, plural, secret_set_text, sent_text, took_text, turn_text,
                               worked_already_text)
from crewlet.groups import DATA_ROLE

# crewlet.estate.view's limits and words (LAG_OPS, STATUS_STALE, ...) are
# imported where a fleet's copies are judged: it imports nats, which a status
# without copies to show, or any other view, has no use for.

# A stream whose consumers pass this share of its limit is shown as a warning.
CONSUMERS_WARN = 0.8

STATE_STYLE = {
    "running": "green",
    "starting": "yellow", "backoff": "yellow", "stopping": "yellow",
    "exited": "red", "fatal": "bold red", "stopped": "red",
}
OUTCOME_STYLE = {
    "done": "green", "skipped": "dim",
    "fenced": "yellow", "interrupted": "yellow", "deferred": "yellow",
    "failed": "red", "running": "cyan",
}
# Seat names a turns line lists before "+N more": 32 turn slots would fill a screen.
NAMES_SHOWN = 12
# Finished turns the live status lists: enough to see the node work, few enough to fit.
RECENT_TURNS = 5
# Characters of a dead letter's text in its row (one line of a wide table).
LETTER_TEXT = 60
# A width no table reaches: what a table is measured in to learn its natural width.
UNBOUNDED = 10_000










# ------------------------------------------------------------------ values





def human_bytes(n: Any) -> str:
    """Resident memory in MiB (GiB from 10 GiB on); '-' for None, '?' for not a number."""
    if n is None:
        return NONE
    if finite(n) is None:
        return UNKNOWN
    mib = n / 2**20
    return f"{mib / 1024:.1f} GiB" if mib >= 10 * 1024 else f"{mib:.1f} MiB"


def disk_text(space: dict[str, Any]) -> Text:
    """'12.3 GiB free (floor 64.0 MiB)' per filesystem; when low, its reason in
    red (the path and its free bytes); a broker waiting for space to be restarted."""
    if space.get("low"):
        text = Text(str(space.get("reason") or "no space"), style="bold red")
    else:
        rows = [r for r in space.get("filesystems") or [] if isinstance(r, dict)]
        text = Text("  ".join(f"{r.get('path')} {human_bytes(r.get('free_bytes'))} free" for r in rows)
                    or NONE)
        if rows:
            text.append(f" (floor {human_bytes(rows[0].get('floor'))})", style="dim")
    if space.get("broker"):
        text.append(f"\nbroker: {space['broker']}", style="yellow")
    return text


def sandbox_text(box: dict[str, Any]) -> Text:
    """How the seats' tools run: 'confined (bubblewrap)'; unconfined or
    refused in bold, with the reason (what to install, or the operator's mode)."""
    state = str(box.get("state") or UNKNOWN)
    if state == "confined":
        return Text(f"confined (bubblewrap, sandbox.mode {box.get('mode')})")
    style = "bold red" if state == "refused" else "bold yellow"
    text = Text(f"{state.upper()} (sandbox.mode {box.get('mode')})", style=style)
    if box.get("reason"):
        text.append(f": {box['reason']}")
    return text


def secrets_text(held: dict[str, Any]) -> Text:
    """'3 held' (`crewletctl secret list` names them); the ones this node
    cannot open in bold red: it lacks the key they were sealed with."""
    text = Text(f"{held.get('held', 0)} held")
    if held.get("unreadable"):
        text.append(f"; cannot open {', '.join(map(str, held['unreadable']))}: sealed with a key this "
                    "node lacks (secrets.key_file, stream.fleet_credentials)", style="bold red")
    return text


def percent(value: Any) -> str:
    if value is None:
        return NONE
    return UNKNOWN if finite(value) is None else f"{value:.1f}"


def last_exit_text(last_exit: dict[str, Any] | None, now: float) -> str:
    """'signal 9 (SIGKILL), 12s ago'; '-' if the child never exited."""
    if not last_exit:
        return NONE
    reason = last_exit.get("reason")
    if not reason:
        code, sig = last_exit.get("code"), last_exit.get("signal")
        reason = f"signal {sig}" if sig is not None else f"exit {code}" if code is not None else "unknown"
    at = finite(last_exit.get("at"))
    return f"{reason}, {human_duration(now - at)} ago" if at is not None else reason


def state_text(state: str | None) -> Text:
    state = state or "unknown"
    return Text(state, style=STATE_STYLE.get(state, "magenta"))


def ago_text(at: Any, now: float) -> str:
    """'12s ago' for a unix time; '-' for None, '?' for anything not a finite number."""
    if at is None:
        return NONE
    return f"{human_duration(now - at)} ago" if finite(at) is not None else UNKNOWN




def outcome_text(outcome: str | None) -> Text:
    outcome = outcome or "unknown"
    return Text(outcome, style=OUTCOME_STYLE.get(outcome, "magenta"))


def one_line(text: Any, width: int) -> str:
    """*text* on one line (whitespace runs made one space), cut to *width* with '…'."""
    flat = " ".join(("" if text is None else str(text)).split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def names_text(names: list[str], shown: int = NAMES_SHOWN) -> str:
    """'a, b, c' or 'a, b, … +30 more'."""
    more = f", … +{len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


# ------------------------------------------------------------------ views

def node_header(node: dict[str, Any]) -> Table:
    """The node as 'label value' lines."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    title = Text(str(node.get("id") or "?"), style="bold cyan")
    if node.get("version"):
        title.append(f"  crewlet {node['version']}", style="dim")
    if node.get("stopping"):
        title.append("  stopping", style="yellow")
    grid.add_row("node", title)
    grid.add_row("roles", ", ".join(node.get("roles") or []) or NONE)
    if node.get("labels"):
        grid.add_row("labels", ", ".join(f"{k}={v}" for k, v in node["labels"].items()))
    me = f"{node.get('pid') or NONE}  up {human_duration(node.get('uptime_s'))}"
    if node.get("rss_bytes") is not None:
        me += f"  cpu {percent(node.get('cpu_percent'))}%  rss {human_bytes(node['rss_bytes'])}"
    grid.add_row("pid", me)
    broker = node.get("broker") or {}
    grid.add_row("broker", " ".join([str(broker.get("type") or NONE), *broker.get("servers", [])]))
    grid.add_row("config", str(node.get("config") or NONE))
    grid.add_row("data dir", str(node.get("data_dir") or NONE))
    if isinstance(node.get("disk"), dict):
        grid.add_row("disk", disk_text(node["disk"]))
    if isinstance(node.get("sandbox"), dict):
        grid.add_row("tools", sandbox_text(node["sandbox"]))
    if isinstance(node.get("secrets"), dict) and node["secrets"].get("listed"):
        grid.add_row("secrets", secrets_text(node["secrets"]))
    api = node.get("api")
    if isinstance(api, dict):
        where = f"{api.get('url')}  (dashboard; the API is /v1, its docs /docs)"
        grid.add_row("api", where)
        grid.add_row("api token", str(api["token_file"]) if api.get("token_file")
                     else "configured (ingress.tokens)")
    return grid


def children_table(children: list[dict[str, Any]], now: float) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header, justify in (("NAME", "left"), ("PID", "right"), ("STATE", "left"), ("UPTIME", "right"),
                            ("RESTARTS", "right"), ("LAST EXIT", "left"), ("CPU %", "right"), ("RSS", "right")):
        table.add_column(header, justify=justify, no_wrap=header != "LAST EXIT")
    for c in children:
        table.add_row(
            str(c.get("name")), str(c.get("pid") or NONE), state_text(c.get("state")),
            human_duration(c.get("uptime_s")), str(c.get("restarts") or 0),
            last_exit_text(c.get("last_exit"), now), percent(c.get("cpu_percent")),
            human_bytes(c.get("rss_bytes")),
        )
    return table


def supervisors_line(supervisors: list[dict[str, Any]]) -> Text:
    """'supervisors  root rest_for_one 0/5 in 30s · roles one_for_one 1/5 in 30s'."""
    line = Text("supervisors  ", style="bold")
    for i, s in enumerate(supervisors):
        if i:
            line.append(" · ", style="dim")
        period = s.get("period")
        period = f"{period:g}s" if finite(period) is not None else NONE
        line.append(f"{s.get('name')} {s.get('strategy')} "
                    f"{s.get('restarts_in_period')}/{s.get('intensity')} restarts in {period}")
    return line


# ------------------------------------------------------------------ fleet



def company_text(company: dict[str, Any] | None) -> Text:
    """'company rev 2 (epoch 2, digest 0fbb3459f9f04620)' or 'no company applied'."""
    if not company:
        return Text("no company applied", style="yellow")
    text = Text("company ")
    text.append(f"rev {company.get('rev', NONE)}", style="bold")
    text.append(f" (epoch {company.get('epoch', NONE)}, digest {company.get('digest') or NONE})")
    return text


def applied_rev(node: dict[str, Any]) -> Any:
    """The revision a fleet node applied: its status record, else its presence."""
    applied = node.get("applied")
    return applied.get("rev") if isinstance(applied, dict) else node.get("rev")


def rev_text(node: dict[str, Any], here: Any) -> Text:
    """The node's applied revision; yellow when not the one in force here, red
    and 'refused' when the node refused a revision (the why is under the table:
    :func:`refusals_lines`)."""
    rev = applied_rev(node)
    shown = NONE if rev is None else str(rev)
    if node.get("status_error"):
        return Text(f"{shown} refused", style="red")
    return Text(shown, style="yellow" if rev != here else "")


def refusals_lines(nodes: list[dict[str, Any]]) -> list[Text]:
    """'n0, n2 refused revision 3: ValidationError: ...': each node's
    status_error, in red, nodes with the same error on one line."""
    by_error: dict[str, list[str]] = {}
    for n in nodes:
        if n.get("status_error"):
            by_error.setdefault(str(n["status_error"]), []).append(str(n.get("id") or "?"))
    return [Text(f"{', '.join(ids)} refused {error}", style="red") for error, ids in by_error.items()]


def renewed_text(renewed_at: Any, now: float) -> str:
    return ago_text(renewed_at, now)


# ------------------------------------------------------------------ the estate's copies

def number(n: Any) -> str:
    """1,234; '-' for anything not a number."""
    return f"{n:,}" if isinstance(n, int) and not isinstance(n, bool) else NONE


def has_copy(node: dict[str, Any]) -> bool:
    """Whether a fleet node holds a copy of the estate: its presence names the data role."""
    return DATA_ROLE in (node.get("roles") or ())


def copy_applied(node: dict[str, Any]) -> int | None:
    """The applied seq of the node's copy, by its applier's last record; None without one."""
    record = node.get("estate")
    applied = record.get("applied") if isinstance(record, dict) else None
    return applied if isinstance(applied, int) else None


def copy_out(node: dict[str, Any], now: float) -> str | None:
    """Why a data node's copy is out of service (None: it is in service),
    judged as the router judges it: evicted, then no record, a record older
    than STATUS_STALE (the applier stopped writing it), the record's reason."""
    from crewlet.estate.view import NO_RECORD, STATUS_STALE, STOPPED

    evicted = node.get("evicted")
    if isinstance(evicted, dict):
        return f"node evicted: {evicted.get('reason') or 'no reason given'}"
    record = node.get("estate")
    if not isinstance(record, dict):
        return NO_RECORD
    at = finite(record.get("at"))
    if at is None or now - at > STATUS_STALE:
        return f"{STOPPED} (last record {ago_text(at, now)})" if at is not None else STOPPED
    if not record.get("in_service"):
        return str(record.get("reason") or "out of service")
    return None


def furthest_copy(nodes: list[dict[str, Any]]) -> int | None:
    """The highest applied seq among the data nodes' records (what lag is counted from)."""
    seqs = [a for a in (copy_applied(n) for n in nodes if has_copy(n)) if a is not None]
    return max(seqs) if seqs else None


def copies(n: int) -> str:
    return f"{n} {'copy' if n == 1 else 'copies'}"


def copy_text(node: dict[str, Any], furthest: int | None, now: float) -> Text:
    """A node's copy in a few characters: 'no copy' (no data role),
    'evicted', 'no record', '1,234 out' (out of service; why is under the
    table), '1,234 (6 behind)' (in service, behind the furthest copy; yellow
    past LAG_OPS, where the router asks it last), or '1,240'."""
    from crewlet.estate.view import LAG_OPS

    if not has_copy(node):
        return Text("no copy", style="dim")
    if isinstance(node.get("evicted"), dict):
        return Text("evicted", style="yellow")
    if not isinstance(node.get("estate"), dict):
        return Text("no record", style="yellow")
    applied = copy_applied(node)
    if copy_out(node, now) is not None:
        return Text(f"{number(applied)} out", style="yellow")
    behind = (furthest or 0) - (applied or 0)
    if behind <= 0:
        return Text(number(applied))
    return Text(f"{number(applied)} ({behind:,} behind)", style="yellow" if behind > LAG_OPS else "")


def copies_line(nodes: list[dict[str, Any]], now: float) -> Text:
    """'copies  n0 1,240 · n1 1,234 (6 behind) · n2 no copy': the COPY column
    as one line, for a terminal too narrow for the column."""
    furthest = furthest_copy(nodes)
    line = Text("copies  ", style="bold")
    for i, n in enumerate(nodes):
        if i:
            line.append(" · ", style="dim")
        line.append(f"{n.get('id') or '?'} ")
        line.append_text(copy_text(n, furthest, now))
    return line


def copy_problems(nodes: list[dict[str, Any]], now: float) -> list[Text]:
    """A line per data node whose copy is not serving as it should: out of
    service and why, evicted and how to undo it, lagging past LAG_OPS."""
    from crewlet.estate.view import LAG_OPS

    furthest = furthest_copy(nodes)
    lines: list[Text] = []
    for n in nodes:
        if not has_copy(n):
            continue
        nid = str(n.get("id") or "?")
        why = copy_out(n, now)
        if isinstance(n.get("evicted"), dict):
            lines.append(Text(f"{nid} evicted: {n['evicted'].get('reason') or 'no reason given'} "
                              f"(`crewletctl evict {nid} --undo` puts its copy back)", style="yellow"))
        elif why is not None:
            lines.append(Text(f"{nid} copy out of service: {why}", style="yellow"))
        elif (furthest or 0) - (copy_applied(n) or 0) > LAG_OPS:
            lines.append(Text(f"{nid} copy {(furthest or 0) - (copy_applied(n) or 0):,} ops behind the "
                              "furthest: the router asks it after the others", style="yellow"))
    return lines


def copies_summary(nodes: list[dict[str, Any]], now: float) -> Text:
    """'3 copies, 2 in service'; red when no copy serves (nothing can read or
    write the estate) or no node holds one."""
    data = [n for n in nodes if has_copy(n)]
    serving = sum(1 for n in data if copy_out(n, now) is None)
    if not data:
        return Text("no data node: the fleet holds no copy of the estate", style="red")
    if not serving:
        return Text(f"{copies(len(data))}, none in service: the estate can be neither read nor written",
                    style="bold red")
    return Text(f"{copies(len(data))}, {serving} in service")


class WideOrNarrow:
    """Renders *wide* when its natural width fits where it is drawn, else
    *narrow*: the fleet's table keeps its COPY column on a wide terminal
    and gives it up for a line on an 80-column one."""

    def __init__(self, wide: RenderableType, narrow: RenderableType):
        self.wide, self.narrow = wide, narrow

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        natural = Measurement.get(console, options.update_width(UNBOUNDED), self.wide).maximum
        yield self.wide if natural <= options.max_width else self.narrow


def fleet_nodes_table(nodes: list[dict[str, Any]], here_id: str | None, here_rev: Any, now: float,
                      copy: bool = True) -> Table:
    """One row per node; with *copy* a COPY column (:func:`copy_text`)."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    columns = [("NODE", "left"), ("ROLES", "left"), ("BROKER", "left"), ("LABELS", "left"), ("REV", "left"),
               ("SEATS", "right"), ("DUTIES", "left"), ("COPY", "left"), ("RENEWED", "right")]
    for header, justify in columns if copy else [c for c in columns if c[0] != "COPY"]:
        wraps = header in ("ROLES", "LABELS", "DUTIES")  # narrow terminals: these give way, whole
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    furthest = furthest_copy(nodes)
    for n in nodes:
        name = Text(str(n.get("id") or "?"))
        if here_id is not None and n.get("id") == here_id:
            name.stylize("bold cyan")
            name.append(" (here)", style="dim")
        if (state := drain.state(n)) is not None:
            name.append(f" {state}", style="yellow" if state == "draining" else "dim yellow")
        cells = [name, ", ".join(n.get("roles") or []) or NONE, str(n.get("broker") or NONE),
                 ", ".join(f"{k}={v}" for k, v in (n.get("labels") or {}).items()) or NONE,
                 rev_text(n, here_rev), str(len(n.get("seats") or [])),
                 ", ".join(n.get("duties") or []) or NONE, copy_text(n, furthest, now),
                 renewed_text(n.get("renewed_at"), now)]
        if not copy:
            del cells[7]
        table.add_row(*cells)
    return table


def fleet_nodes(nodes: list[dict[str, Any]], here_id: str | None, here_rev: Any, now: float) -> WideOrNarrow:
    """The nodes table with its COPY column, or (too narrow for it) without,
    and the copies as a line under it."""
    return WideOrNarrow(fleet_nodes_table(nodes, here_id, here_rev, now),
                        Group(fleet_nodes_table(nodes, here_id, here_rev, now, copy=False),
                              copies_line(nodes, now)))


def seats_line(seats: list[dict[str, Any]]) -> Text:
    """'30 seats held by 3 nodes (n0 10, n1 10, n2 10)': held leases only —
    which seats of the company nobody holds is not in the status."""
    if not seats:
        return Text("no seats held", style="yellow")
    held: dict[str, int] = {}
    for seat in seats:
        holder = str(seat.get("node") or "?")
        held[holder] = held.get(holder, 0) + 1
    by = ", ".join(f"{node} {count}" for node, count in sorted(held.items()))
    return Text(f"{plural(len(seats), 'seat')} held by {plural(len(held), 'node')} ({by})")


def unplaceable_lines(unplaceable: dict[str, Any] | None) -> list[Text]:
    """'2 seats no live node may hold (placement labels): gpu-eu, mars' — or nothing."""
    count = (unplaceable or {}).get("count") or 0
    if not count:
        return []
    names = ", ".join(unplaceable.get("seats") or [])
    more = ", …" if count > len(unplaceable.get("seats") or []) else ""
    return [Text(f"{plural(count, 'seat')} no live node may hold (placement labels): {names}{more}",
                 style="bold yellow")]


def duties_line(duties: list[dict[str, Any]]) -> Text:
    """'duties: fleet_shape@n0'."""
    held = ", ".join(f"{d.get('name')}@{d.get('node') or '?'}" for d in duties)
    return Text(f"duties: {held or 'none'}")


# What the maintenance duty's report counts, as a line names it.
REMOVED_WORDS = (("turns", "turn record", "turn records"), ("mail", "worked message", "worked messages"),
                 ("mailboxes", "mailbox", "mailboxes"))


def maintenance_line(report: dict[str, Any] | None, now: float) -> Text:
    """'maintenance  swept 12m ago on n1 · removed 120 turn records, 3,400 worked messages,
    0 mailboxes · in all 4,000 turn records, …': the duty's last sweep
    (``status`` key ``duty.maintenance``); its errors in yellow."""
    line = Text("maintenance  ", style="bold")
    if not isinstance(report, dict):
        return line.append("no sweep reported yet", style="dim")
    line.append(f"swept {ago_text(report.get('at'), now)} on {report.get('node') or UNKNOWN}")

    def counts(of: Any) -> str:
        of = of if isinstance(of, dict) else {}
        said = []
        for what, one, many in REMOVED_WORDS:
            n = of.get(what) if isinstance(of.get(what), int) else 0
            said.append(f"{n:,} {one if n == 1 else many}")
        return ", ".join(said)
    line.append(f" · removed {counts(report.get('removed'))}")
    line.append(f" · in all {counts(report.get('totals'))}", style="dim")
    if (report.get("turns") or {}).get("more"):
        line.append(" · old turn records left for the next sweep", style="yellow")
    for error in report.get("errors") or []:
        line.append(f" · {error}", style="yellow")
    return line


def files_line(report: dict[str, Any] | None, now: float) -> Text:
    """'files  nats:files · collected 2m ago on n1 · 1,204 objects, 3.1 GiB · 2 removed
    (1.2 MiB), 1 kept in its grace · in all 40 removed': the collector duty's
    last walk (``status`` key ``duty.collector``); its errors in yellow."""
    line = Text("files  ", style="bold")
    if not isinstance(report, dict):
        return line.append("no collection reported yet", style="dim")
    line.append(f"{report.get('store') or UNKNOWN} · collected {ago_text(report.get('at'), now)} "
                f"on {report.get('node') or UNKNOWN}")

    def n(key: str, of: Any = report) -> int:
        value = (of or {}).get(key) if isinstance(of, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else 0
    line.append(f" · {n('objects'):,} objects, {human_bytes(n('bytes'))}")
    line.append(f" · {n('removed'):,} removed ({human_bytes(n('removed_bytes'))})")
    if n("kept_young"):
        line.append(f", {n('kept_young'):,} kept in their grace")
    if report.get("named") is None:
        line.append(" · the rows were not read: nothing removed", style="yellow")
    line.append(f" · in all {n('removed', report.get('totals')):,} removed", style="dim")
    for error in report.get("errors") or []:
        line.append(f" · {error}", style="yellow")
    return line


# What the learning duty's report counts, as a line names it.
LEARNING_WORDS = (("steps", "step", "steps"), ("provider_calls", "provider call", "provider calls"),
                  ("ops", "op", "ops"), ("skipped", "skipped", "skipped"))


def learning_line(report: dict[str, Any] | None, now: float) -> Text:
    """'learning  passed 3m ago on n1 · 2 steps, 2 provider calls, 2 ops, 0 skipped · 14
    clusters of 1,200 episodes, 1 new · in all 40 steps, …': the learning duty's last
    pass (``status`` key ``duty.learning``); its errors in yellow."""
    line = Text("learning  ", style="bold")
    if not isinstance(report, dict):
        return line.append("no pass reported yet", style="dim")
    line.append(f"passed {ago_text(report.get('at'), now)} on {report.get('node') or UNKNOWN}")

    def n(key: str, of: Any = report) -> int:
        value = of.get(key) if isinstance(of, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def counts(of: Any) -> str:
        return ", ".join(f"{n(what, of):,} {one if n(what, of) == 1 else many}"
                         for what, one, many in LEARNING_WORDS)
    line.append(f" · {counts(report.get('counts'))}")
    line.append(f" · {n('clusters'):,} cluster{'' if n('clusters') == 1 else 's'} of {n('episodes'):,} "
                f"episodes, {n('new'):,} new")
    line.append(f" · in all {counts(report.get('totals'))}", style="dim")
    for error in report.get("errors") or []:
        line.append(f" · {error}", style="yellow")
    return line


def streams_line(streams: list[dict[str, Any]] | None) -> Text:
    """'streams  consumers AGENTS 31/1000 · ESTATE 3/64 · KV_leases 4/256 …': every
    stream on the broker, its consumers against its limit; a stream near it
    (or with none) stands out."""
    line = Text("streams  ", style="bold")
    if streams is None:
        return line.append("not read yet", style="dim")
    line.append("consumers ")
    for i, row in enumerate(streams):
        used, limit = row.get("consumers") or 0, row.get("max_consumers")
        unlimited = not isinstance(limit, int) or limit <= 0
        style = ("bold red" if not unlimited and used >= limit
                 else "yellow" if unlimited or used >= CONSUMERS_WARN * limit else "")
        line.append(" · " if i else "")
        line.append(f"{row.get('name')} {used}/{'no limit' if unlimited else limit}", style=style)
    line.append_text(_replicas(streams))
    return line


def _replicas(streams: list[dict[str, Any]]) -> Text:
    """'\nreplicas current' on a cluster, or which streams have no leader
    and which replicas are catching up (a member just back from a restart
    is, for a while; the next may go only once none is)."""
    clustered = [row for row in streams if "behind" in row]
    if not clustered:
        return Text()
    out = Text("\n         replicas ")
    leaderless = [row["name"] for row in clustered if not row.get("leader")]
    behind: dict[str, list[str]] = {}
    for row in clustered:
        for name in row.get("behind") or ():
            behind.setdefault(name, []).append(row["name"])
    if not leaderless and not behind:
        return out.append("current", style="green")
    if leaderless:
        out.append(f"no leader: {', '.join(leaderless)}", style="bold red")
    for i, (server, names) in enumerate(sorted(behind.items())):
        out.append(" · " if i or leaderless else "")
        out.append(f"{server} catching up on {len(names)} of {len(clustered)}", style="yellow")
    return out


def fleet_view(fleet: dict[str, Any] | None, here_id: str | None, now: float) -> RenderableType:
    """The fleet as this node sees it: the company in force here, why the
    last revision was refused, the nodes with their copies of the estate
    (and why a copy is out of service), who holds the seats (and which seats
    no live node may hold) and duties."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    if fleet is None:
        grid.add_row("fleet", Text("not in a fleet (yet)", style="dim"))
        return grid
    company = fleet.get("company")
    grid.add_row("fleet", company_text(company))
    if fleet.get("error"):
        grid.add_row("", Text(f"refused {fleet['error']}", style="bold red"))
    if fleet.get("connected") is False:
        grid.add_row("", Text("not connected to NATS: this is the fleet as last seen", style="bold yellow"))
    here_rev = (company or {}).get("rev")
    nodes = fleet.get("nodes") or []
    return Group(grid, Text(""), fleet_nodes(nodes, here_id, here_rev, now), *refusals_lines(nodes),
                 *copy_problems(nodes, now), copies_summary(nodes, now), seats_line(fleet.get("seats") or []),
                 *unplaceable_lines(fleet.get("unplaceable")), duties_line(fleet.get("duties") or []),
                 maintenance_line((fleet.get("reports") or {}).get("maintenance"), now),
                 files_line((fleet.get("reports") or {}).get("collector"), now),
                 learning_line((fleet.get("reports") or {}).get("learning"), now),
                 streams_line(fleet.get("streams")))


# ------------------------------------------------------------------ turns

def child_stats(children: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The last report of the child named *name*: its ``stats``, if it sent one."""
    for c in children:
        if c.get("name") == name and isinstance(c.get("stats"), dict):
            return c["stats"]
    return None


# Counts of a seats process's stats that add up over the node's pool.
POOL_SUMS = ("running", "max_concurrent", "peak", "turns", "held", "unsettled", "records_failed",
             "record_batches", "records_kept", "poisoned", "brief_failures")


def seats_stats(children: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The turn engine's last report, the node's whole: the ``stats`` of the
    child named seats, or of every member of its seats pool (``seats``,
    ``seats.1`` …: roles/seats/pool.py) taken together — counts added, each
    seat's line kept (a seat is one member's), the first member's for the
    rest (its skill registry, its sandbox probe); None before any sent one."""
    reports = [c["stats"] for c in children
               if str(c.get("name") or "").partition(".")[0] == "seats" and isinstance(c.get("stats"), dict)]
    if len(reports) <= 1:
        return reports[0] if reports else None
    whole = dict(reports[0])
    for key in POOL_SUMS:
        whole[key] = sum(r.get(key) or 0 for r in reports)
    # The org's spend as the member that heard of it last saw it.
    whole["org_spent"] = max((r.get("org_spent") or 0 for r in reports), default=0)
    whole["seats"] = {name: row for r in reports for name, row in (r.get("seats") or {}).items()}
    whole["members"] = len(reports)
    return whole


def finished_at(turn: dict[str, Any]) -> float | None:
    """When a turn (a record, or the stats' short form) ended, as a unix time."""
    at = finite(turn.get("started_at", turn.get("at")))
    if at is None:
        return None
    took = finite(turn.get("took_ms"))
    return at + (took / 1000 if took is not None else 0)


def turns_line(stats: dict[str, Any]) -> Text:
    """'turns  2/32 running (peak 5) · 1204 finished · running a, b · deferred c: org budget …':
    the node's turn slots, and the seats running a turn or held back now."""
    seats = stats.get("seats") or {}
    line = Text("turns  ", style="bold")
    line.append(f"{stats.get('running') or 0}/{stats.get('max_concurrent') or NONE} running "
                f"(peak {stats.get('peak') or 0}) · {stats.get('turns') or 0} finished")
    if not seats:
        line.append(" · no seats held here", style="dim")
    # Work done whose ledger entry could not be written (handed back to be
    # redone), and records that did not land: never to pass unseen.
    if stats.get("unsettled"):
        line.append(f" · {stats['unsettled']} unsettled (ledger not written)", style="bold red")
    if stats.get("records_failed"):
        line.append(f" · {stats['records_failed']} records lost", style="bold red")
    skills = stats.get("skills")
    if isinstance(skills, dict):
        # The node's skill registry: what its turns' prompts list from.
        line.append(f" · {skills.get('skills') or 0} skills")
        if not skills.get("walked_at"):
            line.append(" (not walked yet)", style="yellow")
    if stats.get("brief_failures"):
        line.append(f" · {stats['brief_failures']} briefs without skills or episodes", style="yellow")
    running = sorted(name for name, s in seats.items() if s.get("running"))
    if running:
        line.append(" · running ")
        line.append(names_text(running), style="cyan")
    deferred: dict[str, list[str]] = {}
    for name, s in sorted(seats.items()):
        if s.get("deferred"):
            deferred.setdefault(str(s["deferred"]), []).append(name)
    for reason, names in deferred.items():
        line.append(f" · deferred {names_text(names)}: {reason}", style="yellow")
    return line


def recent_turns_table(stats: dict[str, Any], now: float, count: int = RECENT_TURNS) -> Table | None:
    """The last *count* finished turns on this node, newest first (one per seat:
    the stats keep each seat's last); None before the first."""
    seats = stats.get("seats") or {}
    last = [(name, s["last"]) for name, s in seats.items() if isinstance(s.get("last"), dict)]
    if not last:
        return None
    last.sort(key=lambda row: finished_at(row[1]) or 0.0, reverse=True)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header, justify in (("SEAT", "left"), ("OUTCOME", "left"), ("TOOK", "right"), ("ENDED", "right"),
                            ("ERROR", "left")):
        table.add_column(header, justify=justify, no_wrap=header != "ERROR")
    for name, turn in last[:count]:
        table.add_row(name, outcome_text(turn.get("outcome")), took_text(turn.get("took_ms")),
                      ago_text(finished_at(turn), now), Text(str(turn.get("error") or "")))
    return table


def turns_view(stats: dict[str, Any], now: float, recent: bool = False) -> RenderableType:
    """The turns line, and with *recent* the last few finished turns."""
    table = recent_turns_table(stats, now) if recent else None
    if table is None:
        return turns_line(stats)
    return Group(turns_line(stats), Text(""), Text("recent turns", style="bold"), table)


# ------------------------------------------------------------------ this node's applier

def rate_text(per_s: Any) -> str:
    """350, 1,204 or 0.4 (ops a second); '-' for None, '?' for not a finite number."""
    if per_s is None:
        return NONE
    if finite(per_s) is None:
        return UNKNOWN
    return f"{per_s:.1f}" if 0 < per_s < 10 else f"{per_s:,.0f}"


def log_text(first: Any, last: Any) -> str:
    """' of log 1,240', or ' of log 1,001–1,240' once the log no longer starts at 1."""
    if not isinstance(last, int):
        return " (the log not read yet)"
    if isinstance(first, int) and first > 1:
        return f" of log {first:,}–{last:,}"
    return f" of log {last:,}"


def estate_line(stats: dict[str, Any]) -> Text:
    """'estate  applied 1,234 of log 1,240 · in service · 350 ops/s · 12 requests · 3 events kept':
    the data_applier child's last report. Out of service: why, in yellow;
    requests dropped past their deadline, log resubscriptions and ops refused
    for their origin when any."""
    line = Text("estate  ", style="bold")
    line.append(f"applied {number(stats.get('applied'))}")
    line.append(log_text(stats.get("log_first"), stats.get("log_last")))
    if stats.get("in_service"):
        line.append(" · in service")
    else:
        line.append(f" · out of service: {stats.get('reason') or 'no reason given'}", style="yellow")
    line.append(f" · {rate_text(stats.get('ops_per_s'))} ops/s")
    line.append(f" · {plural(stats.get('requests') or 0, 'request')}")
    if stats.get("dropped"):
        line.append(f" · {number(stats['dropped'])} dropped past their deadline", style="yellow")
    if stats.get("resubscribed"):
        line.append(f" · log resubscribed {plural(stats['resubscribed'], 'time')}", style="yellow")
    refused = (stats.get("refused") or 0) + (stats.get("asks_refused") or 0)
    if refused:
        # ops passed over on the log, writes refused: not their origin's (crewlet.estate.origins)
        line.append(f" · {plural(refused, 'op')} refused for their origin", style="yellow")
    line.append(f" · {plural(stats.get('events_kept') or 0, 'event')} kept")
    if stats.get("events_pruned"):
        line.append(f", {number(stats['events_pruned'])} pruned")
    return line


# ------------------------------------------------------------------ status

def status_view(status: dict[str, Any], now: float | None = None, fleet: bool = True,
                recent: bool = False) -> RenderableType:
    """The node header, the children table, the supervisors line, the turns
    line (when the seats child reported its stats; with *recent* the last
    finished turns too), the estate line (when the data_applier child
    reported its stats) and (unless *fleet* is false) the fleet section."""
    now = time.time() if now is None else now
    node = status.get("node") or {}
    children = status.get("children") or []
    parts: list[RenderableType] = [node_header(node), Text(""), children_table(children, now)]
    if status.get("supervisors"):
        parts.append(supervisors_line(status["supervisors"]))
    stats = seats_stats(children)
    if stats is not None:
        parts.append(turns_view(stats, now, recent))
    applier = child_stats(children, "data_applier")
    if applier is not None:
        parts.append(estate_line(applier))
    if fleet:
        parts += [Text(""), fleet_view(status.get("fleet"), node.get("id"), now)]
    return Group(*parts)


def watch_view(status: dict[str, Any] | None, error: str | None, where: str,
               last_ok: float | None, interval: float, now: float | None = None,
               fleet: bool = True) -> RenderableType:
    """The live view: the status with the recent turns, or why the node is not reachable right now."""
    now = time.time() if now is None else now
    body = status_view(status, now, fleet, recent=True) if error is None and status is not None else None
    return live_view(body, error, where, last_ok, interval, now)


def live_view(body: RenderableType | None, error: str | None, where: str, last_ok: float | None,
              interval: float, now: float | None = None) -> RenderableType:
    """One frame of a --watch: *body* (None: the node did not answer, *error*
    says why) above a clock line."""
    now = time.time() if now is None else now
    footer = Text(f"{time.strftime('%H:%M:%S', time.localtime(now))}  every {interval:g}s  "
                  "Ctrl-C to quit", style="dim")
    if body is not None:
        return Group(body, Text(""), footer)
    seen = f"last answer {human_duration(now - last_ok)} ago" if last_ok else "no answer yet"
    return Group(Text(f"node not reachable: {error}", style="bold red"),
                 Text(where, style="dim"), Text(f"{seen}; retrying", style="yellow"), Text(""), footer)


# ------------------------------------------------------------------ seats

def last_turn_text(turn: dict[str, Any] | None, now: float) -> Text:
    """'done 12s ago' (when it ended); '-' before a seat's first turn."""
    if not isinstance(turn, dict):
        return Text(NONE)
    text = outcome_text(turn.get("outcome"))
    at = finished_at(turn)
    if at is not None:
        text.append(f" {ago_text(at, now)}", style="")
    return text


def count_text(n: Any, alarm: str | None = None) -> Text:
    """A number, styled *alarm* when above 0; '-' when unknown."""
    if not isinstance(n, int):
        return Text(NONE)
    return Text(str(n), style=alarm if alarm and n > 0 else "")


def seats_table(rows: list[dict[str, Any]], now: float) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header, justify in (("SEAT", "left"), ("OWNER", "left"), ("PENDING", "right"), ("IN FLIGHT", "right"),
                            ("DEAD", "right"), ("LAST TURN", "left"), ("TOOK", "right")):
        table.add_column(header, justify=justify, no_wrap=True)
    for r in rows:
        last = r.get("last_turn") if isinstance(r.get("last_turn"), dict) else {}
        table.add_row(str(r.get("seat")), str(r.get("owner") or NONE), count_text(r.get("pending")),
                      count_text(r.get("in_flight")), count_text(r.get("dead_letters"), "red"),
                      last_turn_text(r.get("last_turn"), now), took_text(last.get("took_ms")))
    return table


def seats_footer(rows: list[dict[str, Any]], rev: Any) -> Text:
    """'12 seats, 10 owned, 34 pending, 3 in flight, 2 dead letters · company rev 3'."""
    def total(key: str) -> int:
        return sum(r[key] for r in rows if isinstance(r.get(key), int))

    owned = sum(1 for r in rows if r.get("owner"))
    text = Text(f"{plural(len(rows), 'seat')}, {owned} owned, {total('pending')} pending, "
                f"{total('in_flight')} in flight, ")
    dead = total("dead_letters")
    text.append(plural(dead, "dead letter"), style="red" if dead else "")
    text.append(f" · company rev {NONE if rev is None else rev}", style="dim")
    return text


def seat_errors_lines(rows: list[dict[str, Any]]) -> list[Text]:
    """'a, b: TimeoutError: ...': the seats whose mailbox could not be read, by error."""
    by_error: dict[str, list[str]] = {}
    for r in rows:
        if r.get("error"):
            by_error.setdefault(str(r["error"]), []).append(str(r.get("seat")))
    return [Text(f"{names_text(seats)}: {error}", style="red") for error, seats in by_error.items()]


def seats_view(result: dict[str, Any], now: float | None = None) -> RenderableType:
    """The ``seats`` result: one row per seat of the company, the seats whose
    mailbox could not be read, and the totals."""
    now = time.time() if now is None else now
    rows = result.get("seats") or []
    if not rows:
        return Text(f"no seats in the company (rev {result.get('rev', NONE)})", style="yellow")
    return Group(seats_table(rows, now), *seat_errors_lines(rows), seats_footer(rows, result.get("rev")))


# ------------------------------------------------------------------ dead letters

def dead_letters_table(letters: list[dict[str, Any]], now: float) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header, justify in (("SEQ", "right"), ("SEAT", "left"), ("DELIVERIES", "right"), ("REASON", "left"),
                            ("AGE", "right"), ("TEXT", "left")):
        wraps = header in ("REASON", "TEXT")  # narrow terminals: these give way
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for d in letters:
        at = d.get("at")
        # Text, not str: a str cell is read as rich markup, and mail may contain "[/x]".
        table.add_row(str(d.get("seq")), str(d.get("seat")), str(d.get("deliveries") or NONE),
                      Text(str(d.get("reason") or NONE)),
                      human_duration(now - at) if finite(at) is not None else human_duration(at),
                      Text(one_line(d.get("text"), LETTER_TEXT)))
    return table


def dead_letters_view(result: dict[str, Any], now: float | None = None, seat: str | None = None,
                      limit: int | None = None) -> RenderableType:
    """The ``dlq`` result, oldest first, and how to put one back; says when
    *limit* may have cut the list short."""
    now = time.time() if now is None else now
    letters = result.get("dead_letters") or []
    if not letters:
        return Text(f"no dead letters{f' for {seat}' if seat else ''}", style="green")
    footer = f"{plural(len(letters), 'dead letter')}, oldest first"
    if limit is not None and len(letters) >= limit:
        footer += f" (the first {limit}: --limit shows more)"
    return Group(dead_letters_table(letters, now),
                 Text(f"{footer}; `crewletctl dlq requeue SEQ` puts one back", style="dim"))


# ------------------------------------------------------------------ send









# ------------------------------------------------------------------ the estate: tasks, pages, search

TASK_STATUS_STYLE = {"open": "cyan", "doing": "yellow", "blocked": "red", "done": "green", "cancelled": "dim"}
# Characters of a task's title / a hit's snippet in a table row.
TITLE_WIDTH = 60
SNIPPET_WIDTH = 100












def task_status_text(status: str | None) -> Text:
    status = status or "unknown"
    return Text(status, style=TASK_STATUS_STYLE.get(status, "magenta"))


def by_text(who: Any, at: Any, now: float) -> str:
    """'cto, 3m12s ago'."""
    return f"{who or NONE}, {ago_text(at, now)}"


def labels_text(labels: Any) -> str:
    """'bug, ui'; '-' for none; a value that is not a list shown as it is."""
    if not labels:
        return NONE
    return ", ".join(map(str, labels)) if isinstance(labels, (list, tuple)) else str(labels)


def tasks_table(tasks: list[dict[str, Any]], now: float) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header, justify in (("ID", "left"), ("STATUS", "left"), ("TITLE", "left"), ("ASSIGNEE", "left"),
                            ("LABELS", "left"), ("REV", "right"), ("UPDATED", "right")):
        wraps = header in ("TITLE", "LABELS")  # narrow terminals: these give way
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for t in tasks:
        # Text, not str: a str cell is read as rich markup, and a title may contain "[/x]".
        table.add_row(str(t.get("id")), task_status_text(t.get("status")),
                      Text(one_line(t.get("title"), TITLE_WIDTH)), Text(str(t.get("assignee") or NONE)),
                      Text(labels_text(t.get("labels"))), str(t.get("rev") or NONE),
                      ago_text(t.get("updated_at"), now))
    return table


def tasks_view(result: dict[str, Any], now: float | None = None, limit: int | None = None,
               status: str | None = None, assignee: str | None = None) -> RenderableType:
    """The ``task.list`` answer, newest first; says when *limit* may have cut it short."""
    now = time.time() if now is None else now
    tasks = result.get("tasks") or []
    which = ", ".join(f"{k} {v}" for k, v in (("status", status), ("assignee", assignee)) if v)
    if not tasks:
        return Text(f"no tasks{f' ({which})' if which else ''}", style="green" if which else "yellow")
    footer = f"{plural(len(tasks), 'task')}{f' ({which})' if which else ''}, newest first"
    if limit is not None and len(tasks) >= limit:
        footer += f" (the first {limit}: --limit shows more)"
    return Group(tasks_table(tasks, now), Text(f"{footer}; `crewletctl tasks ID` shows one", style="dim"))


def _fields(rows: list[tuple[str, Any]]) -> Table:
    """'label value' lines; values as Text, never markup."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in rows:
        grid.add_row(label, value if isinstance(value, Text) else Text(str(value)))
    return grid


def task_view(result: dict[str, Any], now: float | None = None) -> RenderableType:
    """One task (``task.get``): its fields, body and comments, oldest first."""
    now = time.time() if now is None else now
    task = result.get("task") or {}
    title = Text(f"{task.get('id')} ", style="bold cyan")
    title.append(str(task.get("title") or ""), style="bold")
    fields = [("task", title), ("status", task_status_text(task.get("status"))),
              ("assignee", task.get("assignee") or NONE)]
    if task.get("labels"):
        fields.append(("labels", labels_text(task["labels"])))
    if task.get("parent"):
        fields.append(("parent", task["parent"]))
    fields += [("rev", task.get("rev") or NONE),
               ("created", by_text(task.get("created_by"), task.get("created_at"), now)),
               ("updated", by_text(task.get("updated_by"), task.get("updated_at"), now))]
    parts: list[RenderableType] = [_fields(fields), Text("")]
    parts.append(Text(task["body"]) if task.get("body") else Text("(no description)", style="dim"))
    comments = result.get("comments") or []
    parts += [Text(""), Text(f"comments ({len(comments)})" if comments else "no comments", style="bold")]
    for c in comments:
        parts.append(Text(f"{c.get('id')}  {by_text(c.get('created_by'), c.get('created_at'), now)}",
                          style="dim"))
        parts.append(Text(f"  {c.get('body') or ''}"))
    return Group(*parts)


def pages_table(pages: list[dict[str, Any]], now: float) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header, justify in (("PATH", "left"), ("TITLE", "left"), ("VERSION", "right"),
                            ("UPDATED BY", "left"), ("UPDATED", "right")):
        wraps = header == "TITLE"
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for p in pages:
        table.add_row(Text(str(p.get("path"))), Text(one_line(p.get("title"), TITLE_WIDTH)),
                      str(p.get("version") or NONE), Text(str(p.get("updated_by") or NONE)),
                      ago_text(p.get("updated_at"), now))
    return table


def pages_view(result: dict[str, Any], now: float | None = None, prefix: str | None = None,
               limit: int | None = None) -> RenderableType:
    """The ``page.list`` answer, by path; says when *limit* may have cut it short."""
    now = time.time() if now is None else now
    pages = result.get("pages") or []
    under = f" under {prefix!r}" if prefix else ""
    if not pages:
        return Text(f"no pages{under}", style="yellow")
    footer = f"{plural(len(pages), 'page')}{under}"
    if limit is not None and len(pages) >= limit:
        footer += f" (the first {limit}: --limit shows more)"
    return Group(pages_table(pages, now), Text(f"{footer}; `crewletctl pages PATH` shows one", style="dim"))


def page_view(result: dict[str, Any], now: float | None = None) -> RenderableType:
    """One page (``page.read``): title, path, version, who updated it when, its body."""
    now = time.time() if now is None else now
    page = result.get("page") or {}
    fields = [("page", Text(str(page.get("title") or ""), style="bold")), ("path", page.get("path")),
              ("version", page.get("version") or NONE),
              ("created", by_text(page.get("created_by"), page.get("created_at"), now)),
              ("updated", by_text(page.get("updated_by"), page.get("updated_at"), now))]
    body = Text(page["body"]) if page.get("body") else Text("(empty)", style="dim")
    return Group(_fields(fields), Text(""), body)




def search_view(result: dict[str, Any], query: str | None = None, limit: int | None = None) -> RenderableType:
    """The hits of a search, best first; who answered. (A search nobody could
    run is not rendered here: the command says so and exits 1.)"""
    hits = result.get("hits") or []
    if not hits:
        return Text(f"no pages matched{f' {query!r}' if query else ''}", style="yellow")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header in ("PATH", "TITLE", "SNIPPET"):
        wraps = header != "PATH"
        table.add_column(header, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for h in hits:
        table.add_row(Text(str(h.get("path"))), Text(one_line(h.get("title"), TITLE_WIDTH)),
                      Text(one_line(h.get("snippet"), SNIPPET_WIDTH)))
    footer = f"{plural(len(hits), 'hit')}, best first"
    if limit is not None and len(hits) >= limit:
        footer += f" (the first {limit}: --limit shows more)"
    if result.get("node"):
        footer += f" · searched on {result['node']}"
    return Group(table, Text(footer, style="dim"))








# ------------------------------------------------------------------ secrets

def secrets_view(result: dict[str, Any], now: float | None = None) -> RenderableType:
    """The ``secret list`` result: one row a secret (never a value), then the
    names the company uses that are not set."""
    now = time.time() if now is None else now
    shown = result.get("secrets") or []
    missing = result.get("missing") or []
    parts: list[RenderableType] = []
    if shown:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for header in ("NAME", "VERSION", "SET BY", "SET", "OLD ONE TAKEN", "KEY", "USED BY"):
            wraps = header in ("USED BY", "SET BY")
            table.add_column(header, justify="right" if header == "VERSION" else "left",
                             no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
        for s in shown:
            until = s.get("previous_until")
            key = str(s.get("key"))
            if s.get("readable") is False:
                key = Text(f"{key} (not held here)", style="red")
            table.add_row(Text(str(s.get("name"))), str(s.get("version")), Text(str(s.get("by") or NONE)),
                          ago_text(s.get("at"), now),
                          f"{human_duration(until - now)} more" if finite(until) else NONE, key,
                          Text(", ".join(s.get("named_by") or []) or "nothing in the company"))
        parts.append(table)
    else:
        parts.append(Text("no secrets are set", style="green" if not missing else "yellow"))
    for m in missing:
        parts.append(Text(f"{m.get('name')}: named by {', '.join(m.get('named_by') or [])} but not set: "
                          f"crewletctl secret set {m.get('name')}", style="red"))
    if shown:
        parts.append(Text(f"{plural(len(shown), 'secret')}; values are never shown", style="dim"))
    return Group(*parts)


