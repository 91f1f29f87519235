"""The operator's tools: each one route of the HTTP API, its schema the route's own.

A tool is named in :data:`ROUTES` by the method and path of the ``/v1`` route
it calls. Its input schema is made from that route in the API's own OpenAPI
document (:func:`tools_of`): the path and query parameters and the request
body's fields, flattened into one object, the body's models under ``$defs``
— the same pydantic models the API validates with, so a tool takes what its
route takes and nothing the route would refuse is offered. A call
(:func:`call`) sends the request with the caller's own token: the API checks
the scope, validates, answers; the tool's result is the answer's JSON (a 4xx
or 5xx is an error result carrying the problem's detail).

``run_events`` is the one tool that is not a single request: it reads a
conversation run's event stream (server-sent events) from after a given
event id until the run ends or ``wait`` seconds pass.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from crewlet import redaction

# tool -> (method, path, what it is for). The description is the tool's; the
# schema comes from the route.
ROUTES: dict[str, tuple[str, str, str]] = {
    "fleet": ("GET", "/v1/fleet", "The fleet: nodes, their roles and children, copies of the estate, "
                                  "duties, the company revision in force."),
    "seats_list": ("GET", "/v1/seats", "The company's seats: who holds each, mail pending and in flight."),
    "seat_get": ("GET", "/v1/seats/{seat}", "One seat: its holder, mailbox, dead letters, last turns."),
    "mail_send": ("POST", "/v1/seats/{seat}/mail", "Put mail in a seat's mailbox; with wait, answer its turn."),
    "turns_list": ("GET", "/v1/turns", "Turn records, newest first (of one seat, since a time)."),
    "tasks_list": ("GET", "/v1/tasks", "The tracker's tasks, newest first."),
    "task_get": ("GET", "/v1/tasks/{id}", "One task with its comments."),
    "task_create": ("POST", "/v1/tasks", "Create a task in the tracker."),
    "task_update": ("PATCH", "/v1/tasks/{id}", "Change a task: status, assignee, title, description."),
    "task_comment": ("POST", "/v1/tasks/{id}/comments", "Comment on a task."),
    "pages_list": ("GET", "/v1/pages", "The knowledge base's pages, by path."),
    "page_get": ("GET", "/v1/pages/{path}", "One knowledge-base page and its body."),
    "page_put": ("PUT", "/v1/pages/{path}", "Write a knowledge-base page (a new revision)."),
    "search": ("GET", "/v1/search", "Search the knowledge base; the answer says how much was searched."),
    "files_list": ("GET", "/v1/files", "The company's files (of a project)."),
    "conversations_list": ("GET", "/v1/conversations", "Conversations with seats, newest first."),
    "conversation_start": ("POST", "/v1/conversations", "Start a conversation with a seat."),
    "conversation_get": ("GET", "/v1/conversations/{conversation}",
                         "A conversation: its status, current run, pending approval and messages."),
    "run_start": ("POST", "/v1/conversations/{conversation}/runs",
                  "Send a message in a conversation: a run; read it with run_events or run_get."),
    "run_get": ("GET", "/v1/conversations/{conversation}/runs/{run}", "One run: its status and end."),
    "run_cancel": ("POST", "/v1/conversations/{conversation}/runs/{run}/cancel", "Stop a run."),
    "approvals_list": ("GET", "/v1/approvals", "Tool calls waiting for a person's decision (status=pending)."),
    "approval_decide": ("POST", "/v1/approvals/{approval}", "Approve or deny a waiting tool call, with a note."),
    "dead_letters": ("GET", "/v1/dlq", "Mail that spent its delivery budget, with why."),
    "dead_letter_requeue": ("POST", "/v1/dlq/{seq}/requeue", "Put a dead letter back in its seat's mailbox."),
    "schedules": ("GET", "/v1/schedules", "The company's schedules: when each fires next, what it last did."),
    "skills_list": ("GET", "/v1/skills", "The company's skills (of a seat; as of a log seq)."),
    "skill_get": ("GET", "/v1/skills/{name}", "One skill: its description, files and one file's body."),
    "skill_revisions": ("GET", "/v1/skills/{name}/revisions", "A skill's revisions, newest first."),
    "skill_drafts": ("GET", "/v1/skills/drafts", "Skills the learning passes drafted, waiting to be promoted."),
    "skill_promote": ("POST", "/v1/skills/drafts/{name}/promote", "Promote a drafted skill: it becomes a skill."),
}
# The run_events tool: the run's stream, read to its end or for `wait` seconds.
STREAM_PATH = "/v1/conversations/{conversation}/runs/{run}/stream"
EVENTS_WAIT_MAX = 30.0
TERMINAL = ("run.completed", "run.failed", "run.interrupted")
RESULT_MAX = 200_000  # characters of an answer a tool returns (a page of turns is well under)
_REF = re.compile(r"#/components/schemas/")


@dataclass(frozen=True)
class OperatorTool:
    name: str
    method: str
    path: str
    description: str
    schema: dict[str, Any]
    path_params: tuple[str, ...] = ()
    query_params: tuple[str, ...] = ()
    body: bool = False


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.rsplit("/", 1)[1])
        for value in node.values():
            _refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _refs(value, found)


def _rewrite(node: Any) -> Any:
    """*node* with its ``#/components/schemas/X`` refs made ``#/$defs/X``."""
    return json.loads(_REF.sub("#/$defs/", json.dumps(node)))


def _defs(schema: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The components *schema* refers to, and theirs, transitively."""
    wanted: set[str] = set()
    _refs(schema, wanted)
    done: dict[str, Any] = {}
    while wanted - set(done):
        name = (wanted - set(done)).pop()
        done[name] = components.get(name, {})
        _refs(done[name], wanted)
    return done


def tools_of(openapi: dict[str, Any]) -> list[OperatorTool]:
    """The operator's tools, their schemas made from the API's OpenAPI document."""
    components = (openapi.get("components") or {}).get("schemas") or {}
    tools = []
    for name, (method, path, description) in ROUTES.items():
        op = ((openapi.get("paths") or {}).get(path) or {}).get(method.lower())
        if op is None:
            continue  # a route this node's API does not have
        props: dict[str, Any] = {}
        required: list[str] = []
        path_params, query_params = [], []
        for p in op.get("parameters") or ():
            if p.get("in") not in ("path", "query"):
                continue  # headers (Idempotency-Key, Last-Event-ID) are the tool's own business
            props[p["name"]] = {**(p.get("schema") or {}), **({"description": p["description"]}
                                                              if p.get("description") else {})}
            (path_params if p["in"] == "path" else query_params).append(p["name"])
            if p.get("required"):
                required.append(p["name"])
        body = ((op.get("requestBody") or {}).get("content") or {}).get("application/json", {}).get("schema")
        if body is not None:
            ref = body.get("$ref", "")
            model = components.get(ref.rsplit("/", 1)[1], body) if ref else body
            for field, spec in (model.get("properties") or {}).items():
                props.setdefault(field, spec)
            required += [r for r in model.get("required") or () if r not in required]
        schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
        if required:
            schema["required"] = required
        defs = _defs(schema, components)
        if defs:
            schema["$defs"] = defs
        tools.append(OperatorTool(name, method, path, description, _rewrite(schema), tuple(path_params),
                                  tuple(query_params), body is not None))
    tools.append(_run_events(openapi))
    return tools


def _run_events(openapi: dict[str, Any]) -> OperatorTool:
    del openapi  # the stream's parameters are the two ids and where to start
    schema = {"type": "object", "additionalProperties": False, "required": ["conversation", "run"],
              "properties": {
                  "conversation": {"type": "string", "description": "the conversation's id"},
                  "run": {"type": "string", "description": "the run's id"},
                  "after": {"type": "integer", "minimum": 0,
                            "description": "read the events after this event id (0: from the start)"},
                  "wait": {"type": "number", "minimum": 0, "maximum": EVENTS_WAIT_MAX,
                           "description": "seconds to wait for the run to end (default 10)"}}}
    return OperatorTool("run_events", "GET", STREAM_PATH,
                        "A conversation run's events (words as they came, tool calls and results, its "
                        "end), after an event id, until the run ends or `wait` seconds pass.",
                        schema, ("conversation", "run"))


def _quoted(name: str, value: Any) -> str | None:
    """A path parameter as a URL part: one segment, quoted whole — but a page's
    or file's ``path``, whose slashes are its own, with no ``.``, ``..`` or
    empty segment (None: refused), so a value never reaches another route."""
    text = str(value)
    if name != "path":
        return quote(text, safe="")
    segments = text.split("/")
    if any(seg in ("", ".", "..") for seg in segments):
        return None
    return "/".join(quote(seg, safe="") for seg in segments)


async def call(client, tool: OperatorTool, args: dict[str, Any], token: str) -> tuple[str, bool]:
    """Call *tool* with *args* through *client* (an httpx2 AsyncClient on the
    API) as the holder of *token*: ``(text, is_error)``."""
    args = dict(args or {})
    missing = [p for p in tool.path_params if p not in args]
    if missing:
        return f"missing argument {missing[0]!r}", True
    path = tool.path
    for p in tool.path_params:
        part = _quoted(p, args.pop(p))
        if part is None:
            return f"bad argument {p!r}: no empty, '.' or '..' segment", True
        path = path.replace("{" + p + "}", part)
    headers = {"Authorization": f"Bearer {token}"}
    if tool.name == "run_events":
        return await _events(client, path, args, headers)
    query = {k: args.pop(k) for k in list(args) if k in tool.query_params and args[k] is not None}
    body = args if tool.body else None
    if not tool.body and args:
        return f"unknown argument {next(iter(args))!r}", True
    response = await client.request(tool.method, path, params=query, json=body, headers=headers)
    try:
        answer: Any = response.json()
    except ValueError:
        answer = response.text
    text = answer if isinstance(answer, str) else json.dumps(answer, indent=2, ensure_ascii=False)
    if response.status_code >= 400 and isinstance(answer, dict):
        text = f"{response.status_code} {answer.get('code', '')}: {answer.get('detail', text)}"
    return redaction.scrub(text[:RESULT_MAX]), response.status_code >= 400


async def _events(client, path: str, args: dict[str, Any], headers: dict[str, str]) -> tuple[str, bool]:
    import anyio
    after = int(args.get("after") or 0)
    wait = min(float(args.get("wait", 10.0)), EVENTS_WAIT_MAX)
    if after:
        headers = {**headers, "Last-Event-ID": str(after)}
    events: list[dict[str, Any]] = []
    block: dict[str, str] = {}
    with anyio.move_on_after(wait):
        async with client.stream("GET", path, headers=headers) as response:
            if response.status_code >= 400:
                await response.aread()
                return f"{response.status_code}: {response.text[:2000]}", True
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    continue
                if line:
                    field, _, value = line.partition(":")
                    block[field] = value[1:] if value.startswith(" ") else value
                    continue
                if "event" in block:
                    try:
                        data = json.loads(block.get("data") or "null")
                    except ValueError:
                        data = block.get("data")
                    events.append({"id": int(block.get("id") or 0), "event": block["event"], "data": data})
                    if block["event"] in TERMINAL:
                        break
                block = {}
    ended = bool(events) and events[-1]["event"] in TERMINAL
    text = json.dumps({"events": events, "ended": ended,
                       "next_after": events[-1]["id"] if events else after}, indent=2, ensure_ascii=False)
    return redaction.scrub(text[:RESULT_MAX]), False
