"""The seat tool over the company's skills: ``skill_read`` (DESIGN §15).

A turn's system prompt lists the skills that apply to its seat by name and
description only (:meth:`crewlet.skills.registry.Registry.prompt`); the model
reads a skill's body — or one of its resource files — when it decides to use
it, so a skill costs tokens only then (progressive disclosure, as the Agent
Skills format intends). ``skill_read("?")`` lists the seat's skills, every one
(the prompt's list is bounded).

A conversation run reads the skills as of its pin (the context's
``skills_as_of``), whichever node serves the request; a mail's turn reads the
current ones. The registry is the tool's way in: ``services.skills``.
"""

from __future__ import annotations

import functools
from typing import Any

from crewlet.agent.tools import Tool, ToolContext, ToolError
from crewlet.estate.router import EstateError

# Characters of a file shown at once (a resource may be 200,000 characters).
FILE_SHOWN = 50_000


async def _skill_read(ctx: ToolContext, args: dict[str, Any]) -> str:
    skills = getattr(ctx.services, "skills", None)
    if skills is None:
        raise ToolError("this node has no skill registry")
    name, file = args["name"].strip(), args.get("file") or None
    timeout = ctx.time_left()
    try:
        if name in ("?", "*", ""):
            rows = await skills.listing(ctx.seat, ctx.skills_as_of)
            if not rows:
                return "No skills apply to you."
            return "\n".join(f"- {r['name']}: {r.get('description') or ''} (files: {', '.join(r.get('files') or [])})"
                             for r in rows)
        answer = await skills.read(name, file, as_of=ctx.skills_as_of,
                                   timeout=timeout if timeout is not None else 10.0)
    except EstateError as exc:
        raise ToolError(f"the skills could not be read: {exc}") from None
    skill, found = answer.get("skill"), answer.get("file")
    if skill is None:
        raise ToolError(f"no skill {name}: skill_read with name \"?\" lists yours")
    if found is None:
        raise ToolError(f"skill {name} has no file {file}; its files: {', '.join(skill.get('files') or [])}")
    body = found["body"]
    cut = f"\n[… {len(body) - FILE_SHOWN} more characters]" if len(body) > FILE_SHOWN else ""
    head = f"{skill['name']}/{found['path']} (revision {skill['seq']}"
    others = [f for f in skill.get("files") or [] if f != found["path"]]
    head += f"; other files: {', '.join(others)})" if others else ")"
    return f"{head}\n\n{body[:FILE_SHOWN]}{cut}"


def skill_tools() -> list[Tool]:
    return list(_made())


@functools.lru_cache(maxsize=1)
def _made() -> tuple[Tool, ...]:
    """Made once: every seat a node claims gets the same one, so a provider
    encodes a seat's tool list once for every seat offering the same tools
    (its JSON is kept by the specs' identity: crewlet.agent.providers.base)."""
    return (Tool(
        "skill_read",
        "Read one of your skills (listed in your instructions) before you use it: its SKILL.md, "
        "or one of its files. name \"?\" lists every skill you have.",
        {"type": "object",
         "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 64,
                                 "description": "the skill's name, or ? for the list"},
                        "file": {"type": "string", "maxLength": 200,
                                 "description": "a file of the skill, e.g. references/REFERENCE.md "
                                                "(default: SKILL.md)"}},
         "required": ["name"], "additionalProperties": False},
        _skill_read),)
