"""One structured line per event.

Every process of a node logs through :func:`event`: one line per event with the
time, level, node, role, pid and an event name, plus the event's own fields.

Children always write JSON lines to their stdout, which is a pipe crewletd reads
(:func:`forward_lines`); crewletd is the one place that decides how lines look on the
terminal — JSON when its stdout is not a TTY, a readable line when it is. A line
a child printed that is not one of ours (a stray ``print``, a traceback, the
broker's own log) is wrapped as a ``child_output`` event tagged with the child's
role and pid, so nothing a child says is lost or left unattributed. crewletd
reads a busy child's lines in batches, each batch one write of its own output
(:mod:`supervisor.process`): a line a turn costs it a few writes a second, not
one a turn.

No known secret passes :func:`forward_lines` (DESIGN §14, :mod:`crewlet.redaction`):
every forwarded line has the secret values crewletd knows replaced (a cost of
one attribute read while none is known, a few µs a line when some are), and a
line that is not one of ours is scrubbed of credential shapes too.

A line a child writes in our JSON shape is taken for its own event, so no
third-party program a role starts may write to that role's output: a seat's
MCP servers have stderr pipes of their own, which the seats role reads and
logs as their output, tagged and redacted (:mod:`crewlet.agent.mcp`); a CLI
agent's stderr is read by its provider, and quoted, redacted, only when the
agent fails (:mod:`crewlet.agent.providers.cli`).

Python's stdlib ``logging`` (used by nats-py, uvicorn, …) is routed into the
same stream as ``log`` events, so third-party messages are tagged too.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any, TextIO

from crewlet import redaction

LEVELS = ("debug", "info", "warning", "error")
_LEVEL_NO = {name: i for i, name in enumerate(LEVELS)}

# The fields every record carries, in the order a reader expects them.
_HEAD = ("ts", "level", "node", "role", "pid", "event")


class _State:
    """Process-wide logging state; set once by :func:`configure`."""

    node: str | None = None
    role: str = "crewlet"
    level: int = _LEVEL_NO["info"]
    stream: TextIO = sys.stdout
    # True: render readable text lines; False: JSON lines.
    text: bool = False
    lock = threading.Lock()  # the watchdog thread logs too


_state = _State()


def configure(*, node: str | None, role: str, level: str = "info", fmt: str = "json",
              stream: TextIO | None = None) -> None:
    """Set this process's identity and output format.

    ``fmt`` is ``json``, ``text`` or ``auto`` (text when the stream is a TTY).
    """
    _state.node = node
    _state.role = role
    _state.level = _LEVEL_NO[level]
    _state.stream = stream or sys.stdout
    if fmt == "auto":
        fmt = "text" if _isatty(_state.stream) else "json"
    _state.text = fmt == "text"
    _route_stdlib_logging()


def event(name: str, level: str = "info", **fields: Any) -> None:
    """Log one event: ``event("child_started", child="seats", pid=123)``."""
    if _LEVEL_NO[level] < _state.level:
        return
    record = {"ts": round(time.time(), 3), "level": level, "node": _state.node,
              "role": _state.role, "pid": os.getpid(), "event": name}
    record.update(fields)
    emit(record)


def emit(record: dict[str, Any]) -> None:
    """Write an already-built record in this process's format."""
    _write(render_text(record) if _state.text else render_json(record))


def _write(text: str) -> None:
    """Write *text* (one line or several, without the last newline), flushed."""
    with _state.lock:
        try:
            _state.stream.write(text + "\n")
            _state.stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # stdout closed under us: nothing better to do with a log line


def forward(line: bytes, *, role: str, pid: int | None) -> None:
    """Re-emit one line a child wrote, in this process's format (see
    :func:`forward_lines`)."""
    forward_lines([line], role=role, pid=pid)


def forward_lines(lines: list[bytes], *, role: str, pid: int | None) -> None:
    """Re-emit lines a child wrote, in this process's format, with one write.

    Our own JSON records pass through unchanged but for the known secret
    values in them (as the child wrote them when this process writes JSON
    too: not decoded and encoded again); anything else becomes a
    ``child_output`` event tagged with the child's role and pid, scrubbed of
    credential shapes too.
    """
    out = [text for text in (_forwarded(line, role, pid) for line in lines) if text]
    if out:
        _write("\n".join(out))


def _forwarded(line: bytes, role: str, pid: int | None) -> str | None:
    """One line a child wrote, as this process writes it; None for an empty one."""
    text = redaction.scrub_known(line.decode("utf-8", "replace").rstrip("\r\n"))
    if not text:
        return None
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and "event" in parsed and "ts" in parsed:
            return render_text(parsed) if _state.text else text
    return (render_text if _state.text else render_json)(
        {"ts": round(time.time(), 3), "level": "info", "node": _state.node, "role": role, "pid": pid,
         "event": "child_output", "line": redaction.scrub_shapes(text)})


def render_json(record: dict[str, Any]) -> str:
    return json.dumps(record, default=str, separators=(",", ":"))


def render_text(record: dict[str, Any]) -> str:
    ts = time.strftime("%H:%M:%S", time.localtime(record.get("ts", time.time())))
    ms = int((record.get("ts", 0) % 1) * 1000)
    head = (f"{ts}.{ms:03d} {record.get('level', 'info')[:4].upper():4} "
            f"{record.get('node') or '-'}/{record.get('role', '?')}[{record.get('pid', '?')}] "
            f"{record.get('event', '?')}")
    rest = " ".join(f"{k}={_short(v)}" for k, v in record.items() if k not in _HEAD)
    return f"{head} {rest}" if rest else head


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(text) if (" " in text or not text) and isinstance(value, str) else text


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _StdlibHandler(logging.Handler):
    """Turns stdlib logging records into ``log`` events."""

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D102
        level = {logging.DEBUG: "debug", logging.INFO: "info",
                 logging.WARNING: "warning"}.get(record.levelno, "error")
        try:
            message = record.getMessage()
        except Exception:  # a bad format string in somebody's log call
            message = str(record.msg)
        fields: dict[str, Any] = {"logger": record.name, "message": message}
        if record.exc_info:
            fields["exc"] = logging.Formatter().formatException(record.exc_info)
        event("log", level, **fields)


def _route_stdlib_logging() -> None:
    root = logging.getLogger()
    root.handlers[:] = [_StdlibHandler()]
    root.setLevel(logging.DEBUG if _state.level == 0 else logging.INFO)
    # uvicorn installs its own handlers unless told not to; ours already tag it.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    # A line per provider request ("HTTP Request: POST ... 200") is a log line
    # per turn that says nothing the turn's own event does not.
    for name in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)
