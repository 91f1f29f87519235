"""How ``crewletctl status`` looks: the status dict as rich renderables.

Pure functions of a status dict (the ``result`` crewletd sends for
``status``) and the wall-clock ``now``, so they are tested without a node.
:func:`normalize` gives the dict the stable keys ``--json`` promises.
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


def status_view(status: dict[str, Any], now: float | None = None) -> RenderableType:
    """The node header, the children table and the supervisors line."""
    now = time.time() if now is None else now
    parts: list[RenderableType] = [node_header(status.get("node") or {}), Text(""),
                                   children_table(status.get("children") or [], now)]
    if status.get("supervisors"):
        parts.append(supervisors_line(status["supervisors"]))
    return Group(*parts)


def watch_view(status: dict[str, Any] | None, error: str | None, where: str,
               last_ok: float | None, interval: float, now: float | None = None) -> RenderableType:
    """The live view: the status, or why the node is not reachable right now."""
    now = time.time() if now is None else now
    footer = Text(f"{time.strftime('%H:%M:%S', time.localtime(now))}  every {interval:g}s  "
                  "Ctrl-C to quit", style="dim")
    if error is None and status is not None:
        return Group(status_view(status, now), Text(""), footer)
    seen = f"last answer {human_duration(now - last_ok)} ago" if last_ok else "no answer yet"
    return Group(Text(f"node not reachable: {error}", style="bold red"),
                 Text(where, style="dim"), Text(f"{seen}; retrying", style="yellow"), Text(""), footer)
