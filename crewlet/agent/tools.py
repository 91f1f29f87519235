"""Tools: the registry a provider sees as schemas, and the built-in tools.

A :class:`Tool` is a name, a description, a JSON schema of its arguments and
a coroutine that does the work. A seat's :class:`Registry` holds its tools —
the built-ins (:func:`builtin_tools`), its MCP servers' (``mcp:<server>``,
added and removed as the servers come and go) and, later, the tracker,
knowledge-base and file tools — and offers them to the provider as
:class:`~crewlet.agent.types.ToolSpec`.

:meth:`Registry.call` is the one way a turn calls a tool. Whatever goes wrong
— an unknown name, arguments the schema refuses, a tool's own refusal
(:class:`ToolError`), a bug — comes back as an error *result* the model reads
and may correct; only cancellation propagates. A model that called a tool
badly is a normal event in a turn, not a crash of it.

Every call carries a :class:`ToolContext` with a ``call_key`` that is the same
when a turn is redone (``<trigger>.<round>.<index>``): side effects key on it,
so a redone turn does not do them twice — the ``send`` tool's key is the
message's ``Nats-Msg-Id`` (the broker drops the duplicate), ``note_write``'s
is kept in the note.

Built-ins:

=============  ============================================================
send           mail another seat of the company (``Crewlet-From`` names us)
note_write     append to this seat's private notes
notes_read     the newest of this seat's notes
=============  ============================================================

:class:`Notes` keeps a seat's private notes fleet-wide in the ``notes`` KV
bucket, one key per seat holding its newest entries. Writes are
compare-and-set publishes (``Nats-Expected-Last-Subject-Sequence``) to
:func:`crewlet.bus.kv_subject`, so they work from a leaf too, and two turns
writing at once both land.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from jsonschema import exceptions as schema_errors
from jsonschema import validators
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from crewlet import log
from crewlet.agent.types import TOOL_NAME_MAX, ToolSpec
from crewlet.bus import kv_subject
from crewlet.coord.buckets import NOTES

# What every provider accepts as a tool name (OpenAI's rule is the narrowest).
TOOL_NAME = re.compile(rf"^[A-Za-z0-9_-]{{1,{TOOL_NAME_MAX}}}$")

# Seats the send tool's refusal lists, so a model that guessed a name can pick
# a real one without a company of thousands flooding its context.
_SEATS_LISTED = 20

# A note is a thought, not a document: this keeps a seat's whole history
# (NOTES_KEPT of them) well below the broker's 1 MiB message limit.
NOTE_MAX_CHARS = 4000
NOTES_KEPT = 200
# The notes value is trimmed (oldest first) to stay under this many bytes.
_NOTES_MAX_BYTES = 900_000
NOTES_READ_DEFAULT = 20
NOTES_READ_MAX = 100

_NOTES_STREAM = f"KV_{NOTES.name}"
_NOTES_SUBJECT = f"$KV.{NOTES.name}."  # the stream's subjects (reads); writes: Notes._put
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_WRONG_LAST_SEQUENCE = (10071, 10164)
# A compare-and-set lost to another writer is read again and retried; each
# round lets at least one writer through, so this bounds concurrent writers
# of one seat's notes (a seat runs one turn at a time: it is rarely above 2).
_NOTES_ATTEMPTS = 10
_NOTES_PAUSE = 0.02  # seconds, up to double this with jitter, before a retry


@dataclass(frozen=True)
class ToolContext:
    """Who is calling and what the built-ins need.

    ``services`` carries ``.mailboxes`` (:class:`crewlet.queue.base.Mailboxes`),
    ``.seats`` (the company's seat names) and ``.notes`` (:class:`Notes`).
    """

    seat: str
    trigger: str        # the trigger (message) this turn works
    token: int          # the seat's fencing token
    call_key: str       # f"{trigger}.{round}.{index}": the same when a turn is redone
    services: Any


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of type "object"
    run: Callable[[ToolContext, dict[str, Any]], Awaitable[str]]
    owner: str = "builtin"      # "builtin" or "mcp:<server>"

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)


class ToolError(Exception):
    """A tool's own refusal; its message is the tool result the model reads."""


@functools.lru_cache(maxsize=1024)
def _validator(schema_json: str):
    """A checked validator for a schema, made once per distinct schema: every
    claimed seat adds the same built-ins, and checking a schema is costly
    (measured: half the seats process's time while claiming thousands)."""
    schema = json.loads(schema_json)
    cls = validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


class Registry:
    """A seat's tools, by name."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, Any] = {}

    def add(self, tool: Tool) -> None:
        """Add *tool*; ValueError if its name is taken or bad, or its schema is not one."""
        if not TOOL_NAME.match(tool.name):
            raise ValueError(f"bad tool name {tool.name!r}: must match {TOOL_NAME.pattern}")
        if tool.name in self._tools:
            raise ValueError(f"tool name {tool.name!r} is taken (by {self._tools[tool.name].owner})")
        if not isinstance(tool.parameters, dict) or tool.parameters.get("type") != "object":
            raise ValueError(f"tool {tool.name}: parameters must be a JSON schema of type object")
        try:
            self._validators[tool.name] = _validator(json.dumps(tool.parameters, sort_keys=True))
        except schema_errors.SchemaError as exc:
            raise ValueError(f"tool {tool.name}: bad parameters schema: {exc.message}") from None
        self._tools[tool.name] = tool

    def remove_owner(self, owner: str) -> None:
        """Remove every tool *owner* added (an MCP server that went down)."""
        for name in [n for n, t in self._tools.items() if t.owner == owner]:
            del self._tools[name]
            del self._validators[name]

    def specs(self) -> list[ToolSpec]:
        """What the provider is offered, sorted by name (a stable prompt)."""
        return [self._tools[name].spec() for name in self.names()]

    def names(self) -> list[str]:
        return sorted(self._tools)

    async def call(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        """Run tool *name*: ``(text, error)``. Never raises but CancelledError."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self.names()) or "none"
            return f"unknown tool {name!r}; tools: {known}", True
        if not isinstance(args, dict):
            return f"invalid arguments for {name}: expected an object, got {type(args).__name__}", True
        problem = schema_errors.best_match(self._validators[name].iter_errors(args))
        if problem is not None:
            where = "/".join(str(p) for p in problem.absolute_path)
            return f"invalid arguments for {name}: {where + ': ' if where else ''}{problem.message}", True
        try:
            result = await tool.run(ctx, args)
        except asyncio.CancelledError:
            raise
        except ToolError as exc:
            return str(exc) or f"{name} refused", True
        except Exception as exc:
            log.event("tool_failed", "warning", seat=ctx.seat, tool=name, owner=tool.owner,
                      error=f"{type(exc).__name__}: {exc}")
            return f"{name} failed: {type(exc).__name__}: {exc}", True
        return (result if isinstance(result, str) else str(result)), False


# ------------------------------------------------------------------ notes

class NotesError(Exception):
    """The notes could not be written (the broker kept refusing or not answering)."""


class Notes:
    """A seat's private notes, fleet-wide, in the KV bucket ``notes``.

    One key per seat holds a JSON list of ``{at, text, key}``, oldest first,
    at most *keep* long. The bucket is created by the lead
    (:data:`crewlet.coord.buckets.NOTES`).
    """

    def __init__(self, js: JetStreamContext, *, keep: int = NOTES_KEPT):
        self.js = js
        self.keep = keep
        self._put = kv_subject(js, NOTES.name)  # through a leaf's domain when there is one

    async def _last(self, seat: str) -> tuple[int, list[dict[str, Any]]]:
        """The key's last sequence (0: never written) and its entries.

        Read from the stream's leader, not a direct get from any replica: a
        compare-and-set against a follower's stale copy would only lose.
        """
        try:
            msg = await self.js.get_msg(_NOTES_STREAM, subject=_NOTES_SUBJECT + seat, direct=False)
        except NotFoundError:
            return 0, []
        headers = msg.headers or {}
        if headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers:
            return msg.seq, []
        try:
            entries = json.loads(msg.data)
        except ValueError:
            entries = None
        if not isinstance(entries, list):
            # Not ours to interpret; overwriting it loses nothing a reader could use.
            log.event("notes_unreadable", "warning", seat=seat, seq=msg.seq)
            return msg.seq, []
        return msg.seq, [e for e in entries if isinstance(e, dict)]

    def _encode(self, entries: list[dict[str, Any]]) -> bytes:
        entries = entries[-self.keep:]
        data = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
        while len(data) > _NOTES_MAX_BYTES and len(entries) > 1:
            entries = entries[len(entries) // 4 or 1:]
            data = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
        return data

    async def write(self, seat: str, text: str, key: str) -> bool:
        """Append a note; False if one with *key* is already there (a redone turn).

        A publish that got no answer may have been stored: the retry reads
        the key again, and finding its own note there counts as written.
        """
        entry = {"at": round(time.time(), 3), "text": text[:NOTE_MAX_CHARS], "key": key}
        unanswered = False
        last_error = "conflicting writers"
        for attempt in range(_NOTES_ATTEMPTS):
            seq, entries = await self._last(seat)
            if any(e.get("key") == key for e in entries):
                return unanswered
            try:
                await self.js.publish(self._put + seat, self._encode([*entries, entry]),
                                      headers={_EXPECTED_LAST: str(seq)})
                return True
            except APIError as exc:
                if exc.err_code not in _WRONG_LAST_SEQUENCE:
                    raise NotesError(f"writing notes of {seat}: {exc}") from exc
            except (NoStreamResponseError, NatsTimeoutError) as exc:
                unanswered = True
                last_error = type(exc).__name__
            await asyncio.sleep(_NOTES_PAUSE * (1 + random.random()) * (attempt + 1))
        raise NotesError(f"writing notes of {seat}: gave up after {_NOTES_ATTEMPTS} attempts "
                         f"({last_error})")

    async def read(self, seat: str, limit: int = NOTES_READ_DEFAULT) -> list[dict[str, Any]]:
        """The newest *limit* notes of *seat*, newest last."""
        if limit <= 0:
            return []
        return (await self._last(seat))[1][-limit:]


# ------------------------------------------------------------------ built-ins

async def _send(ctx: ToolContext, args: dict[str, Any]) -> str:
    seat, text = args["seat"], args["text"]
    seats = ctx.services.seats
    if seat == ctx.seat:
        raise ToolError("you cannot send to yourself; use note_write to remember something")
    if seat not in seats:
        names = sorted(seats)
        shown = ", ".join(names[:_SEATS_LISTED]) + (", …" if len(names) > _SEATS_LISTED else "")
        raise ToolError(f"unknown seat {seat!r}; seats: {shown}")
    # The call key is the message's trigger and so its Nats-Msg-Id: a redone
    # turn sends under the same one and the broker stores it once.
    await ctx.services.mailboxes.send(seat, text, trigger=ctx.call_key,
                                      headers={"Crewlet-From": ctx.seat})
    return f"sent to {seat}"


async def _note_write(ctx: ToolContext, args: dict[str, Any]) -> str:
    wrote = await ctx.services.notes.write(ctx.seat, args["text"], key=ctx.call_key)
    return "noted" if wrote else "already noted"


async def _notes_read(ctx: ToolContext, args: dict[str, Any]) -> str:
    notes = await ctx.services.notes.read(ctx.seat, args.get("limit", NOTES_READ_DEFAULT))
    if not notes:
        return "no notes yet"
    return "\n".join(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(n.get('at', 0)))}Z {n.get('text', '')}"
                     for n in notes)


def builtin_tools() -> list[Tool]:
    """The tools every seat has: send, note_write, notes_read."""
    return [
        Tool("send", "Send a message to another seat's mailbox. It is worked as a turn of that seat, "
                     "which sees who sent it.",
             {"type": "object",
              "properties": {"seat": {"type": "string", "description": "the seat to send to"},
                             "text": {"type": "string", "minLength": 1, "description": "the message"}},
              "required": ["seat", "text"], "additionalProperties": False},
             _send),
        Tool("note_write", "Write a note to your own private notes, kept across turns.",
             {"type": "object",
              "properties": {"text": {"type": "string", "minLength": 1, "maxLength": NOTE_MAX_CHARS}},
              "required": ["text"], "additionalProperties": False},
             _note_write),
        Tool("notes_read", "Read your newest private notes, oldest first.",
             {"type": "object",
              "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": NOTES_READ_MAX,
                                       "description": f"how many (default {NOTES_READ_DEFAULT})"}},
              "additionalProperties": False},
             _notes_read),
    ]
