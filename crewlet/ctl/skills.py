"""``crewletctl skills``: the company's skills — list, read, push, retire, promote.

A skill is an Agent Skills folder (:mod:`crewlet.skills.format`): a
``SKILL.md`` with front matter, and resource files beside it. The estate
keeps every revision of it.

Reads ask the estate as ``tasks`` and ``pages`` do
(:func:`crewlet.ctl.tasks.ask_estate`), so they answer on a node that holds
no data too. Writes — ``push``, ``retire``, ``promote``, ``reject`` — are
requests to the node's HTTP API (``/v1/skills``), made as ``crewletctl
mcp`` makes them (:func:`crewlet.ctl.mcp.api_access`: ``--token-file``,
else ``$CREWLET_API_TOKEN``, else the node's first-start admin token), so
they are held to the token's scope and, for a promotion, to who the company
says decides them, exactly as the API and the dashboard are.

``push`` checks every skill on this machine first (:func:`~crewlet.skills.format.check`)
and says each problem, naming the file and the field; a skill with one is
not sent, the others are. Exits 0, 1 when the node refused a write (or a
read found nothing), 2 when a skill was refused here (bad input, as
crewletctl's usage errors), 69 when no node answers, 78 when no API token
can be found.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

import click
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from crewlet.ctl import EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, Ctl, fail
from crewlet.ctl.dlq import ListByDefault
from crewlet.ctl.mcp import api_access
from crewlet.ctl.render import NONE, _fields, ago_text, by_text, one_line, plural
from crewlet.ctl.status import show
from crewlet.ctl.tasks import LIST_DEFAULT, LIST_MAX, ask_estate
from crewlet.estate.ops import INT_MAX, NOTE_MAX

# Seconds one API write may take: the API's own wait for the estate (a
# leader election ridden out, another data node asked) and a little more.
WRITE_TIMEOUT = 75.0
DESCRIPTION_WIDTH = 80
DRAFT_STATUSES = ("pending", "promoted", "rejected")


# ------------------------------------------------------------------ the API


class ApiRefused(Exception):
    """The API answered a 4xx or 5xx: its problem's ``status``, ``code`` and ``detail``."""

    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def _api(url: str, token: str, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request to the node's API: the answer's JSON; :class:`ApiRefused`
    for an error answer; exits 69 when nothing answers."""
    data = json.dumps(body, ensure_ascii=False).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json",
        **({"Content-Type": "application/json"} if data is not None else {})})
    # Loopback or the operator's own address: never through a proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=WRITE_TIMEOUT) as answer:
            return json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            problem = json.loads(exc.read() or b"{}")
        except ValueError:
            problem = {}
        raise ApiRefused(exc.code, str(problem.get("code") or exc.code),
                         str(problem.get("detail") or exc.reason)) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        fail(f"the node's API at {url} did not answer: {reason}", EXIT_UNREACHABLE)


class Api:
    """The node's API, found at first use (:func:`crewlet.ctl.mcp.api_access`)."""

    def __init__(self, ctl: Ctl, token_file: str | None):
        self.ctl, self.token_file = ctl, token_file
        self._access: tuple[str, str] | None = None

    def __call__(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._access is None:
            self._access = api_access(self.ctl, self.token_file, "crewletctl skills")
        return _api(*self._access, method, path, body)


def _refused(exc: ApiRefused) -> None:
    fail(f"{exc.detail} ({exc.status} {exc.code})", EXIT_REFUSED)


TOKEN_FILE = click.option("--token-file", type=click.Path(dir_okay=False), default=None,
                          help="A file holding the API token to write with (default: $CREWLET_API_TOKEN, "
                               "else the node's first-start admin token).")


# ------------------------------------------------------------------ how it looks


def _skills_table(rows: list[dict[str, Any]], now: float, drafts: bool = False) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    headers = (("NAME", "left"), ("STATUS" if drafts else "REV", "left" if drafts else "right"),
               ("SEAT" if drafts else "FILES", "left" if drafts else "right"), ("BY", "left"),
               ("AT", "right"), ("DESCRIPTION", "left"))
    for header, justify in headers:
        wraps = header == "DESCRIPTION"
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for r in rows:
        meta = r.get("meta") if isinstance(r.get("meta"), dict) else {}
        description = r.get("description") or meta.get("description")
        if drafts:
            second, third = Text(str(r.get("status") or NONE)), Text(str(r.get("seat") or NONE))
        else:
            second, third = str(r.get("seq") or NONE), str(len(r.get("files") or []))
        table.add_row(Text(str(r.get("name"))), second, third, Text(str(r.get("by") or NONE)),
                      ago_text(r.get("at"), now), Text(one_line(description, DESCRIPTION_WIDTH)))
    return table


def _list_view(result: dict[str, Any], what: str, drafts: bool = False) -> RenderableType:
    rows = result.get("drafts" if drafts else "skills") or []
    if not rows:
        return Text(f"no {what}", style="yellow")
    hint = "`crewletctl skills drafts NAME` shows one" if drafts else "`crewletctl skills show NAME` shows one"
    return Group(_skills_table(rows, time.time(), drafts), Text(f"{plural(len(rows), what[:-1])}; {hint}",
                                                                 style="dim"))


def _skill_view(result: dict[str, Any], drafted: bool = False) -> RenderableType:
    now = time.time()
    skill, file = result.get("skill") or {}, result.get("file") or {}
    meta = skill.get("meta") if isinstance(skill.get("meta"), dict) else {}
    rows: list[tuple[str, Any]] = [("skill", Text(str(skill.get("name")), style="bold")),
                                   ("description", Text(str(meta.get("description") or NONE)))]
    if drafted:
        rows += [("status", skill.get("status") or NONE), ("seat", skill.get("seat") or NONE),
                 ("cluster", skill.get("cluster") or NONE), ("approval", skill.get("approval") or NONE),
                 ("drafted", by_text(skill.get("by"), skill.get("at"), now))]
    else:
        rows += [("revision", skill.get("seq") or NONE), ("written", by_text(skill.get("by"), skill.get("at"), now))]
        if skill.get("note"):
            rows.append(("note", Text(str(skill["note"]))))
    rows += [("seats", ", ".join(meta.get("seats") or []) or "every seat"),
             ("files", Text(", ".join(skill.get("files") or []) or NONE))]
    body = Text(str(file.get("body") or "")) if file.get("body") else Text("(empty)", style="dim")
    return Group(_fields(rows), Text(""), Text(f"── {file.get('path')}", style="dim"), body)


def _raw(body: str) -> None:
    """*body* on standard output exactly: UTF-8, its line endings and escape codes kept."""
    sys.stdout.flush()
    sys.stdout.buffer.write(body.encode("utf-8"))
    sys.stdout.buffer.flush()


# ------------------------------------------------------------------ the commands


@click.group(cls=ListByDefault, options_metavar="",
             subcommand_metavar="[--seat SEAT] [--as-of SEQ] [--json] | show | revisions | push | retire | "
                                "drafts | promote | reject ...")
def skills() -> None:
    """The company's skills: list, read, push, retire, promote drafts.

    \b
      crewletctl skills [--seat SEAT] [--as-of SEQ]   the skills (of a seat; as of a log seq)
      crewletctl skills show NAME [FILE] [--as-of SEQ] a skill and SKILL.md; FILE: that file, as stored
      crewletctl skills revisions NAME                 its history, newest first
      crewletctl skills push DIR...                    skill folders, or checkouts holding them
      crewletctl skills retire NAME                    its pages go, its history stays
      crewletctl skills drafts [NAME]                  what the learning passes drafted
      crewletctl skills promote NAME [--note TEXT]     a draft becomes the skill's next revision
      crewletctl skills reject NAME [--note TEXT]      it stays a draft, rejected

    A skill is an Agent Skills folder: SKILL.md (YAML front matter with name
    and description, then Markdown) and resource files beside it. Writes go
    through the node's API with --token-file, else $CREWLET_API_TOKEN, else
    the node's first-start token; a promotion needs a person who decides them
    when the company names any (people.<id>.decides.promotions), else admin.
    """


@skills.command("list")
@click.option("--seat", metavar="SEAT", help="Only the skills that apply to SEAT.")
@click.option("--as-of", "as_of", type=click.IntRange(1, INT_MAX), metavar="SEQ",
              help="As they were at estate log seq SEQ (a run's pin).")
@click.option("--limit", type=click.IntRange(1, LIST_MAX), default=LIST_DEFAULT, show_default=True, metavar="N",
              help="List at most N, by name.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: `skills`, a list of objects with the keys name, seq, at, by, note, retired, "
                   "draft, description, meta, files; and `as_of`.")
@click.pass_obj
def list_skills(ctl: Ctl, seat: str | None, as_of: int | None, limit: int, as_json: bool) -> None:
    """List the skills, by name: revision, files, who wrote it when, description.

    Exits 0, 1 if the estate could not be read, 69 when no node answers.
    """
    args: dict[str, Any] = {"limit": limit}
    if seat:
        args["seat"] = seat
    if as_of is not None:
        args["as_of"] = as_of
    result = ask_estate(ctl, "skill.list", args)
    show(result, as_json, lambda _: _list_view(result, "skills"))


@skills.command("show")
@click.argument("name")
@click.argument("file", required=False)
@click.option("--as-of", "as_of", type=click.IntRange(1, INT_MAX), metavar="SEQ",
              help="The revision current at estate log seq SEQ.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: `skill` (as `skills list` gives one) and `file` (path, body).")
@click.pass_obj
def show_skill(ctl: Ctl, name: str, file: str | None, as_of: int | None, as_json: bool) -> None:
    """Show skill NAME and its SKILL.md; with FILE, print that file alone,
    exactly as stored (redirect it to a file to get it back byte for byte).

    Exits 0, 1 if there is no such skill or file (or the estate could not
    be read), 69 when no node answers.
    """
    args: dict[str, Any] = {"name": name}
    if file is not None:
        args["file"] = file
    if as_of is not None:
        args["as_of"] = as_of
    result = ask_estate(ctl, "skill.read", args)
    if not result.get("skill"):
        fail(f"no skill {name}" + (f" as of seq {as_of}" if as_of is not None else ""), EXIT_REFUSED)
    if not result.get("file"):
        fail(f"skill {name} has no file {file} (its files: {', '.join(result['skill'].get('files') or [])})",
             EXIT_REFUSED)
    if file is not None and not as_json:
        _raw(result["file"]["body"])
        return
    show(result, as_json, lambda _: _skill_view(result))


@skills.command("revisions")
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, LIST_MAX), default=LIST_DEFAULT, show_default=True, metavar="N",
              help="At most N, the newest.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: `revisions`, newest first, each as `skills list` gives a skill.")
@click.pass_obj
def revisions(ctl: Ctl, name: str, limit: int, as_json: bool) -> None:
    """List skill NAME's revisions, newest first (a retirement is one too).

    Exits 0, 1 if it was never written (or the estate could not be read),
    69 when no node answers.
    """
    result = ask_estate(ctl, "skill.revisions", {"name": name, "limit": limit})
    rows = result.get("revisions") or []
    if not rows:
        fail(f"no skill {name} was ever written", EXIT_REFUSED)

    def view(_) -> RenderableType:
        now = time.time()
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for header in ("REV", "BY", "AT", "FILES", "NOTE"):
            table.add_column(header, no_wrap=header != "NOTE", overflow="fold" if header == "NOTE" else "ellipsis")
        for r in rows:
            files = "retired" if r.get("retired") else str(len(r.get("files") or []))
            table.add_row(str(r.get("seq")), Text(str(r.get("by") or NONE)), ago_text(r.get("at"), now), files,
                          Text(one_line(r.get("note") or (f"from draft {r['draft']}" if r.get("draft") else ""),
                                        DESCRIPTION_WIDTH)))
        return table
    show(result, as_json, view)


def _problem(where: str, field: str | None, problem: str) -> dict[str, Any]:
    return {"file": where, "field": field, "problem": problem}


def _on_disk(folder: str, file: str) -> str:
    """The file a SkillError names (``<name>/<path>``, or ``<name>``: the
    whole skill) as a path under *folder*, the skill's folder as given."""
    name = os.path.basename(os.path.abspath(folder))
    if file == name:
        return folder
    if file.startswith(name + "/"):
        return os.path.join(folder, file[len(name) + 1:])
    return file


@skills.command("push")
@click.argument("dirs", nargs=-1, required=True, metavar="DIR...")
@click.option("--note", metavar="TEXT", help="What changed, kept with each revision written.")
@TOKEN_FILE
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: `written` (each skill as `skills list` gives one, and `folder`), `problems` "
                   "(file, field, problem: refused here, not sent) and `refused` (name, status, code, "
                   "detail: refused by the node).")
@click.pass_obj
def push(ctl: Ctl, dirs: tuple[str, ...], note: str | None, token_file: str | None, as_json: bool) -> None:
    """Write the skills in each DIR: a skill's folder (it holds SKILL.md),
    or a folder holding skills (a skills repository's checkout: every
    folder with a SKILL.md, up to three levels down).

    Every skill is checked here first, whole; each problem is said naming
    the file and the field, and that skill is not sent. The others are
    written, each as its next revision (every file of it: a file gone from
    the folder is gone from the revision). Entries starting with '.' are
    no part of a skill. Exits 0, 2 if a skill was refused here, 1 if the
    node refused one, 69 when no node answers.
    """
    from crewlet.skills import format as skill_format

    if note is not None and len(note) > NOTE_MAX:
        raise click.BadParameter(f"at most {NOTE_MAX} characters", param_hint="'--note'")
    problems: list[dict[str, Any]] = []
    folders: list[str] = []
    for d in dirs:
        if not os.path.isdir(d):
            problems.append(_problem(d, None, "not a folder"))
            continue
        try:
            found = skill_format.find_skills(d)
        except OSError as exc:
            problems.append(_problem(d, None, f"cannot be read: {exc.strerror or exc}"))
            continue
        if not found:
            problems.append(_problem(d, None, f"holds no skill: no {skill_format.SKILL_FILE} in it nor in a "
                                              f"folder up to {skill_format.FIND_DEPTH} levels below it"))
        seen = {os.path.realpath(f) for f in folders}
        folders += [f for f in found if os.path.realpath(f) not in seen]
    ready: dict[str, tuple[str, list[dict[str, str]]]] = {}
    twice: set[str] = set()
    for folder in folders:
        try:
            name, files = skill_format.read_folder(folder)
            skill_format.check(name, files)
        except skill_format.SkillError as exc:
            problems.append(_problem(_on_disk(folder, exc.file), exc.field, exc.problem))
            continue
        except OSError as exc:
            problems.append(_problem(folder, None, f"cannot be read: {exc.strerror or exc}"))
            continue
        if name in ready:
            problems.append(_problem(name, "name", f"two folders are skill {name}: {ready[name][0]} and {folder}"))
            twice.add(name)
            continue
        ready[name] = (folder, [{"path": f.path, "body": f.body} for f in files])
    for name in twice:
        del ready[name]
    written: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    api = Api(ctl, token_file)
    for name, (folder, files) in ready.items():
        body: dict[str, Any] = {"files": files}
        if note:
            body["note"] = note
        try:
            skill = api("PUT", f"/v1/skills/{quote(name, safe='')}", body)
        except ApiRefused as exc:
            refused.append({"name": name, "folder": folder, "status": exc.status, "code": exc.code,
                            "detail": exc.detail})
            continue
        written.append({**skill, "folder": folder})
    if as_json:
        click.echo(json.dumps({"written": written, "problems": problems, "refused": refused}, indent=2))
    else:
        for w in written:
            click.echo(f"wrote {w['name']}: revision {w.get('seq')}, {plural(len(w.get('files') or []), 'file')} "
                       f"(from {w['folder']})")
    for p in problems:
        where = f"{p['file']}: {p['field']}" if p["field"] else p["file"]
        click.echo(f"crewletctl: {where}: {p['problem']}", err=True)
    for r in refused:
        click.echo(f"crewletctl: {r['name']}: refused by the node ({r['status']} {r['code']}): {r['detail']}",
                   err=True)
    if problems:
        sys.exit(EXIT_USAGE)
    if refused:
        sys.exit(EXIT_REFUSED)


@skills.command("retire")
@click.argument("name")
@TOKEN_FILE
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the revision that retired it.")
@click.pass_obj
def retire(ctl: Ctl, name: str, token_file: str | None, as_json: bool) -> None:
    """Retire skill NAME: its pages go, it leaves every seat's prompt; its
    history stays (`skills revisions NAME`), and a push brings it back.

    Exits 0, 1 if there is no such skill (or the node refused), 69 when no
    node answers.
    """
    try:
        skill = Api(ctl, token_file)("DELETE", f"/v1/skills/{quote(name, safe='')}")
    except ApiRefused as exc:
        _refused(exc)
    if as_json:
        click.echo(json.dumps(skill, indent=2))
    else:
        click.echo(f"retired {name} (revision {skill.get('seq')})")


@skills.command("drafts")
@click.argument("name", required=False)
@click.argument("file", required=False)
@click.option("--status", type=click.Choice(DRAFT_STATUSES), help="Only drafts with this status.")
@click.option("--limit", type=click.IntRange(1, LIST_MAX), default=LIST_DEFAULT, show_default=True, metavar="N",
              help="List at most N, by name.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: `drafts` (name, cluster, seat, episodes, status, approval, seq, at, by, meta, "
                   "files, decided_at, decided_by); with NAME, `skill` (the draft) and `file`.")
@click.pass_obj
def drafts(ctl: Ctl, name: str | None, file: str | None, status: str | None, limit: int, as_json: bool) -> None:
    """List the skills the learning passes drafted, or show draft NAME and
    its SKILL.md (with FILE: that file alone, as stored).

    Exits 0, 1 if there is no such draft (or the estate could not be read),
    69 when no node answers.
    """
    if name is None:
        args: dict[str, Any] = {"limit": limit}
        if status:
            args["status"] = status
        result = ask_estate(ctl, "skill.drafts", args)
        show(result, as_json, lambda _: _list_view(result, "drafts", drafts=True))
        return
    if status:
        raise click.UsageError("NAME cannot be combined with --status")
    args = {"name": name, "draft": True}
    if file is not None:
        args["file"] = file
    result = ask_estate(ctl, "skill.read", args)
    if not result.get("skill"):
        fail(f"no draft {name}", EXIT_REFUSED)
    if not result.get("file"):
        fail(f"draft {name} has no file {file}", EXIT_REFUSED)
    if file is not None and not as_json:
        _raw(result["file"]["body"])
        return
    show(result, as_json, lambda _: _skill_view(result, drafted=True))


def _decide(ctl: Ctl, name: str, verdict: str, note: str | None, token_file: str | None, as_json: bool) -> None:
    try:
        answer = Api(ctl, token_file)("POST", f"/v1/skills/drafts/{quote(name, safe='')}/{verdict}",
                                      {"note": note} if note else {})
    except ApiRefused as exc:
        _refused(exc)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    elif verdict == "promote":
        skill = answer.get("skill") or {}
        click.echo(f"promoted {name}: revision {skill.get('seq')} of skill {skill.get('name') or name}")
    else:
        click.echo(f"rejected {name}")


NOTE = click.option("--note", metavar="TEXT", help="Why, kept with the decision.")


@skills.command("promote")
@click.argument("name")
@NOTE
@TOKEN_FILE
@click.option("--json", "as_json", is_flag=True, help="Print JSON: `draft`, `approval`, `skill` (the revision "
                                                       "made of the draft).")
@click.pass_obj
def promote(ctl: Ctl, name: str, note: str | None, token_file: str | None, as_json: bool) -> None:
    """Promote draft NAME: its files become skill NAME's next revision.

    Exits 0, 1 if the node refused (no such draft, decided already the
    other way, a token that may not decide promotions), 69 when no node
    answers.
    """
    _decide(ctl, name, "promote", note, token_file, as_json)


@skills.command("reject")
@click.argument("name")
@NOTE
@TOKEN_FILE
@click.option("--json", "as_json", is_flag=True, help="Print JSON: `draft`, `approval`, `skill` (null).")
@click.pass_obj
def reject(ctl: Ctl, name: str, note: str | None, token_file: str | None, as_json: bool) -> None:
    """Reject draft NAME: it stays a draft, rejected.

    Exits 0, 1 if the node refused (no such draft, decided already the
    other way, a token that may not decide promotions), 69 when no node
    answers.
    """
    _decide(ctl, name, "reject", note, token_file, as_json)
