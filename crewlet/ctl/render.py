"""How ``crewletctl status`` looks: the status dict as rich renderables.

Pure functions of a status dict (the ``result`` crewletd sends for
``status``) and the wall-clock ``now``, so they are tested without a node.
:func:`normalize` gives the dict the stable keys ``--json`` promises.

The ``fleet`` key is the fleet as this node sees it (``Fleet.view()`` in
supervisor/fleet.py), null while the node is not in one.
"""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

# Keys every node / child / last_exit has in --json output (None when unknown).
NODE_KEYS = ("id", "roles", "pid", "uptime_s", "version", "broker", "data_dir", "config")
CHILD_KEYS = ("name", "pid", "state", "restarts", "uptime_s", "last_exit", "cpu_percent", "rss_bytes")
EXIT_KEYS = ("code", "signal", "reason", "at")
# Keys of ``fleet`` (when not null) and of its nodes / seats / duties in --json output.
FLEET_KEYS = ("company", "error", "connected", "nodes", "seats", "duties")
FLEET_NODE_KEYS = ("id", "roles", "broker", "labels", "version", "rev", "renewed_at", "applied",
                   "status_error", "seats", "duties")
FLEET_LEASE_KEYS = ("name", "node", "token")  # a seat or a duty and who holds it

STATE_STYLE = {
    "running": "green",
    "starting": "yellow", "backoff": "yellow", "stopping": "yellow",
    "exited": "red", "fatal": "bold red", "stopped": "red",
}
NONE = "-"


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
                     "duties": n.get("duties") or []} for n in fleet.get("nodes") or []]
    for key in ("seats", "duties"):
        out[key] = [{**dict.fromkeys(FLEET_LEASE_KEYS), **x} for x in fleet.get(key) or []]
    return out


# ------------------------------------------------------------------ values

def human_duration(seconds: float | None) -> str:
    """12s, 3m12s, 2h05m, 3d04h; '-' for None."""
    if seconds is None:
        return NONE
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def human_bytes(n: int | None) -> str:
    """Resident memory in MiB (GiB from 10 GiB on); '-' for None."""
    if n is None:
        return NONE
    mib = n / 2**20
    return f"{mib / 1024:.1f} GiB" if mib >= 10 * 1024 else f"{mib:.1f} MiB"


def percent(value: float | None) -> str:
    return NONE if value is None else f"{value:.1f}"


def last_exit_text(last_exit: dict[str, Any] | None, now: float) -> str:
    """'signal 9 (SIGKILL), 12s ago'; '-' if the child never exited."""
    if not last_exit:
        return NONE
    reason = last_exit.get("reason")
    if not reason:
        code, sig = last_exit.get("code"), last_exit.get("signal")
        reason = f"signal {sig}" if sig is not None else f"exit {code}" if code is not None else "unknown"
    at = last_exit.get("at")
    return f"{reason}, {human_duration(now - at)} ago" if isinstance(at, (int, float)) else reason


def state_text(state: str | None) -> Text:
    state = state or "unknown"
    return Text(state, style=STATE_STYLE.get(state, "magenta"))


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
        period = f"{period:g}s" if isinstance(period, (int, float)) else NONE
        line.append(f"{s.get('name')} {s.get('strategy')} "
                    f"{s.get('restarts_in_period')}/{s.get('intensity')} restarts in {period}")
    return line


# ------------------------------------------------------------------ fleet

def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


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
    return f"{human_duration(now - renewed_at)} ago" if isinstance(renewed_at, (int, float)) else NONE


def fleet_nodes_table(nodes: list[dict[str, Any]], here_id: str | None, here_rev: Any, now: float) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header, justify in (("NODE", "left"), ("ROLES", "left"), ("BROKER", "left"), ("LABELS", "left"),
                            ("REV", "left"), ("SEATS", "right"), ("DUTIES", "left"), ("RENEWED", "right")):
        wraps = header in ("ROLES", "LABELS", "DUTIES")  # narrow terminals: these give way, whole
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for n in nodes:
        name = Text(str(n.get("id") or "?"))
        if here_id is not None and n.get("id") == here_id:
            name.stylize("bold cyan")
            name.append(" (here)", style="dim")
        table.add_row(
            name, ", ".join(n.get("roles") or []) or NONE, str(n.get("broker") or NONE),
            ", ".join(f"{k}={v}" for k, v in (n.get("labels") or {}).items()) or NONE,
            rev_text(n, here_rev), str(len(n.get("seats") or [])),
            ", ".join(n.get("duties") or []) or NONE, renewed_text(n.get("renewed_at"), now),
        )
    return table


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


def duties_line(duties: list[dict[str, Any]]) -> Text:
    """'duties: fleet_shape@n0'."""
    held = ", ".join(f"{d.get('name')}@{d.get('node') or '?'}" for d in duties)
    return Text(f"duties: {held or 'none'}")


def fleet_view(fleet: dict[str, Any] | None, here_id: str | None, now: float) -> RenderableType:
    """The fleet as this node sees it: the company in force here, why the
    last revision was refused, the nodes, who holds the seats and duties."""
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
    return Group(grid, Text(""), fleet_nodes_table(nodes, here_id, here_rev, now), *refusals_lines(nodes),
                 seats_line(fleet.get("seats") or []), duties_line(fleet.get("duties") or []))


def status_view(status: dict[str, Any], now: float | None = None, fleet: bool = True) -> RenderableType:
    """The node header, the children table, the supervisors line and (unless
    *fleet* is false) the fleet section."""
    now = time.time() if now is None else now
    node = status.get("node") or {}
    parts: list[RenderableType] = [node_header(node), Text(""),
                                   children_table(status.get("children") or [], now)]
    if status.get("supervisors"):
        parts.append(supervisors_line(status["supervisors"]))
    if fleet:
        parts += [Text(""), fleet_view(status.get("fleet"), node.get("id"), now)]
    return Group(*parts)


def watch_view(status: dict[str, Any] | None, error: str | None, where: str,
               last_ok: float | None, interval: float, now: float | None = None,
               fleet: bool = True) -> RenderableType:
    """The live view: the status, or why the node is not reachable right now."""
    now = time.time() if now is None else now
    footer = Text(f"{time.strftime('%H:%M:%S', time.localtime(now))}  every {interval:g}s  "
                  "Ctrl-C to quit", style="dim")
    if error is None and status is not None:
        return Group(status_view(status, now, fleet), Text(""), footer)
    seen = f"last answer {human_duration(now - last_ok)} ago" if last_ok else "no answer yet"
    return Group(Text(f"node not reachable: {error}", style="bold red"),
                 Text(where, style="dim"), Text(f"{seen}; retrying", style="yellow"), Text(""), footer)
