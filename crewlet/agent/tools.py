"""Tools: the registry a provider sees as schemas, and the built-in tool.

A :class:`Tool` is a name, a description, a JSON schema of its arguments and
a coroutine that does the work. A seat's :class:`Registry` holds its tools —
the built-ins ``send`` and ``notify`` (:func:`builtin_tools`), the estate's (tracker,
knowledge base, files and the seat's own notes:
:mod:`crewlet.agent.estate_tools`) and its MCP servers' (``mcp:<server>``,
added and removed as the servers come and go) — and offers them to the
provider as :class:`~crewlet.agent.types.ToolSpec`.

:meth:`Registry.call` is the one way a turn calls a tool. Whatever goes wrong
— an unknown name, arguments the schema refuses, a tool's own refusal
(:class:`ToolError`), a bug — comes back as an error *result* the model reads
and may correct; only cancellation propagates. A model that called a tool
badly is a normal event in a turn, not a crash of it.

Every call carries a :class:`ToolContext` with a ``call_key`` that is the same
when a turn is redone (``<trigger>.<round>.<index>``): side effects key on it,
so a redone turn does not do them twice — the ``send`` tool's key is the
message's ``Nats-Msg-Id`` and trigger (the broker drops a duplicate within
its 2-minute window; one redone later, after a whole node died and the ack
wait passed, is stored again and skipped by the receiver's ledger), an
estate write's is its op id.

=============  ============================================================
send           mail another seat of the company (``Crewlet-From`` names us)
notify         an email out (``OUTBOX``, :mod:`crewlet.outbox`): its id is
               ``<seat>.<call key>``, so a redone turn's lands once
=============  ============================================================
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from jsonschema import exceptions as schema_errors
from jsonschema import validators

from pydantic import ValidationError

from crewlet import log
from crewlet.agent.types import TOOL_NAME_MAX, ToolSpec
from crewlet.outbox import BODY_MAX, SUBJECT_MAX, TO_MAX, Notification
from crewlet.outbox import problem as notification_problem

# What every provider accepts as a tool name (OpenAI's rule is the narrowest).
TOOL_NAME = re.compile(rf"^[A-Za-z0-9_-]{{1,{TOOL_NAME_MAX}}}$")

# Seats the send tool's refusal lists, so a model that guessed a name can pick
# a real one without a company of thousands flooding its context.
_SEATS_LISTED = 20


@dataclass(frozen=True)
class ToolContext:
    """Who is calling and what the built-ins need.

    ``services`` carries ``.mailboxes`` (:class:`crewlet.queue.base.Mailboxes`),
    ``.seats`` (the company's seat names), ``.estate`` (the node's
    :class:`~crewlet.estate.router.Router`), ``.node`` (this node's id) and
    ``.outbox`` (``await outbox(notification)`` puts one on ``OUTBOX``).
    """

    seat: str
    trigger: str        # the trigger (message) this turn works
    token: int          # the seat's fencing token
    call_key: str       # f"{trigger}.{round}.{index}": the same when a turn is redone
    services: Any
    deadline: float | None = None  # time.monotonic() by which the turn must be done
    # The log seq a conversation run pinned its skills at (skill_read reads them as of
    # it); None: the current skills (a mail's turn).
    skills_as_of: int | None = None

    def time_left(self) -> float | None:
        """Seconds the turn has left (None: no deadline): what a tool may wait."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of type "object"
    run: Callable[[ToolContext, dict[str, Any]], Awaitable[str]]
    owner: str = "builtin"      # "builtin" or "mcp:<server>"

    def spec(self) -> ToolSpec:
        return self._spec

    @functools.cached_property
    def _spec(self) -> ToolSpec:
        # One per tool: a provider caches the JSON of a tool list by its specs.
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


def _addresses(ctx: ToolContext, to: list[str]) -> list[str]:
    """*to* with each person's id of the company (``people:``) made their
    email address; an address stays as it is."""
    people = getattr(ctx.services, "people", None) or {}
    out = []
    for item in to:
        if "@" in item:
            out.append(item)
            continue
        person = people.get(item)
        if person is None:
            known = ", ".join(sorted(people)[:20]) or "none"
            raise ToolError(f"notify refused: to: {item!r} is neither an email address nor a person of "
                            f"the company (people: {known})")
        if not person.email:
            raise ToolError(f"notify refused: to: {item} ({person.name}) has no email address in the company")
        out.append(person.email)
    return out


async def _notify(ctx: ToolContext, args: dict[str, Any]) -> str:
    put = getattr(ctx.services, "outbox", None)
    if put is None:
        raise ToolError("notifications are not available on this node")
    to = _addresses(ctx, args["to"] if isinstance(args["to"], list) else [args["to"]])
    # The id is the call's place in the turn: a redone turn puts the same
    # one, and the outbox sends it once (crewlet.outbox).
    try:
        n = Notification(id=f"{ctx.seat}.{ctx.call_key}", to=to, subject=args["subject"],
                         body=args["body"], by=f"seat:{ctx.seat}")
    except ValidationError as exc:
        raise ToolError(f"notify refused: {notification_problem(exc)}") from None
    await put(n)
    return f"email to {', '.join(to)} queued (it is sent at the company's rate)"


def builtin_tools() -> list[Tool]:
    """The tools every seat has without the estate: send, notify."""
    return list(_builtins())


@functools.lru_cache(maxsize=1)
def _builtins() -> tuple[Tool, ...]:
    """Made once: every seat a node claims gets the same ones."""
    return (
        Tool("send", "Send a message to another seat's mailbox. It is worked as a turn of that seat, "
                     "which sees who sent it.",
             {"type": "object",
              "properties": {"seat": {"type": "string", "description": "the seat to send to"},
                             "text": {"type": "string", "minLength": 1, "description": "the message"}},
              "required": ["seat", "text"], "additionalProperties": False},
             _send),
        Tool("notify", "Send an email to people (at most 20): email addresses, or the ids of the "
                       "company's people, who get it at their address. It is queued and sent at the "
                       "company's rate; each call sends once.",
             {"type": "object",
              "properties": {"to": {"anyOf": [{"type": "string"},
                                              {"type": "array", "items": {"type": "string"},
                                               "minItems": 1, "maxItems": TO_MAX}],
                                    "description": "an email address or a person's id, or a list of them"},
                             "subject": {"type": "string", "minLength": 1, "maxLength": SUBJECT_MAX},
                             "body": {"type": "string", "maxLength": BODY_MAX}},
              "required": ["to", "subject", "body"], "additionalProperties": False},
             _notify),
    )
