"""The Agent Skills format (agentskills.io), as crewlet stores it.

A skill is a folder named for the skill: a ``SKILL.md`` at its top, then any
resource files beside it (``scripts/``, ``references/``, ``assets/``…)::

    pdf-processing/
        SKILL.md
        references/REFERENCE.md
        scripts/extract.py

``SKILL.md`` begins with YAML front matter — its first line is ``---``, a
later line ``---`` closes it — then Markdown, the skill's instructions. The
front matter is a mapping of these keys and no others (:data:`KEYS`):

``name``           required; 1–64 lower-case letters, digits and single
                   hyphens, not starting or ending with one (:data:`NAME`),
                   equal to the folder's name
``description``    required; what the skill does and when to use it, 1–1,024
                   characters
``license``        a string: a license's name, or a bundled file's
``compatibility``  a string of 1–500 characters: the environment it needs
``allowed-tools``  a string of tool names separated by spaces
``metadata``       a mapping of string keys to string values (write
                   ``version: "1.0"``, quoted: a bare ``1.0`` is a number)

An optional key written with no value (``license:``) is as if absent. A key
may not appear twice, and nothing nests deeper than :data:`NESTING_MAX`.

crewlet's own keys go under ``metadata``, so the skill stays valid for every
other runtime that reads the format:

``crewlet-seats``    the seats it applies to: names or ``fnmatch`` patterns
                     (``eng-*``, matched case-sensitively), separated by
                     commas or ASCII white space; absent or empty, every
                     seat (:func:`applies_to`)
``crewlet-tools``    the tools it is about, the same way
``crewlet-cluster``  set by the curation pass: the cluster it was drafted from

Files and pages
    Each file of a skill is one estate page, ``skills/<name>/<path in lower
    case>`` (a draft's: ``skills/drafts/<name>/…``; :func:`page_path`),
    whose title is the file's own path, case kept. So a path is segments of
    ``A-Z a-z 0-9 _ . -`` joined by single ``/``, each starting with a letter,
    a digit or ``_`` (a page path's rule, ``crewlet.estate.ops.PAGE_PATH``: no
    hidden files, no ``..``, no spaces), two paths may not differ only in
    case, and the page path is at most ``PAGE_PATH_MAX`` (200) characters.
    ``SKILL.md`` itself is matched exactly (``skill.md`` is not it). The name
    ``drafts`` is reserved: its pages would be the drafts'.

Limits
    At most :data:`FILES_MAX` (100) files, each at most
    :data:`FILE_CHARS_MAX` (200,000) characters of text without NUL, all of
    them at most :data:`SKILL_BYTES_MAX` (512 KiB) of UTF-8: one write of a
    skill stays one op on the log, well under the broker's 1 MiB.

Checking
    :func:`parse` reads a ``SKILL.md``'s front matter into a :class:`Meta`;
    :func:`check` holds a whole skill (its name and files) to every rule
    above and answers its Meta (``draft=True``: a draft's, whose page paths
    are seven characters longer). Both are pure and deterministic — no clock,
    no locale, no file system, files taken in path order whatever order they
    came in — because every data node's applier calls :func:`check` on the
    same op and must reach the same answer. Every refusal is a
    :class:`SkillError` naming the file (``<name>/<path>``, or ``<name>`` for
    a problem of the whole skill) and the field (``name``, ``description``,
    ``metadata.version``, ``path``, ``body``…; None when no one field is at
    fault); its ``str`` is one short line, ``<file>: <field>: <problem>``.

From disk
    :func:`read_folder` reads a folder into ``(name, files)`` — the name is
    the folder's own, the files sorted by path, bodies byte for byte (line
    endings kept) — and leaves :func:`check` to the caller, so a push can
    report every skill's problem before sending any. Entries whose name
    starts with ``.`` (``.git``, ``.DS_Store``, ``.gitignore``) are skipped,
    at every depth. A file that is not UTF-8 text (or holds NUL) is refused:
    crewlet keeps a skill's resources as text pages. A symbolic link is
    followed while it stays inside the folder and refused when it points
    outside it (or back to a folder already read). :func:`find_skills`
    finds the skill folders of a checkout.

In a turn
    :func:`applies_to` says whether a skill is for a seat, and
    :func:`prompt_list` writes the bounded list of skills a turn's system
    prompt gets.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from crewlet.config.load import StrictLoader
# The page rules and sizes are the estate's. (So crewlet.estate.ops imports
# nothing of this module at its top: the applier, which imports both, does.)
from crewlet.estate import ops

# ---- the format (agentskills.io)
SKILL_FILE = "SKILL.md"
KEYS = ("name", "description", "license", "compatibility", "allowed-tools", "metadata")
FENCE = "---"
NAME_MAX = 64
NAME = r"^[a-z0-9]+(?:-[a-z0-9]+)*$"
DESCRIPTION_MAX = 1024
COMPATIBILITY_MAX = 500
# The front matter is a mapping of strings holding one mapping of strings: a
# bound far above that keeps PyYAML's recursive composer (and its scanner's
# look-ahead, quadratic in a flow nest's depth) short, and refuses a deep
# document the same way on every copy — a RecursionError would depend on how
# deep the caller's stack already was.
NESTING_MAX = 8
# crewlet's keys under metadata.
SEATS_KEY = "crewlet-seats"
TOOLS_KEY = "crewlet-tools"
CLUSTER_KEY = "crewlet-cluster"

# ---- pages
PAGES = "skills"
DRAFTS = "drafts"
SKILL_PAGE = SKILL_FILE.lower()
# skills/drafts/<name>/… are the drafts' pages: a skill named "drafts" would write over them.
RESERVED_NAMES = (DRAFTS,)
# A file path's segment: a page path's segment (ops.PAGE_PATH) before lower-casing.
SEGMENT = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
PAGE_PATH_MAX = ops.PAGE_PATH_MAX
# A page holds text: a file that is not UTF-8 (a PNG, a PDF) has no page to be.
NOT_TEXT = "not UTF-8 text: crewlet keeps a skill's resources as text pages"

# ---- limits: one skill.write op stays well under the broker's 1 MiB
FILES_MAX = 100
FILE_CHARS_MAX = ops.PAGE_BODY_MAX
SKILL_BYTES_MAX = 512 * 1024
# How deep under a checkout's root find_skills looks: skills/<name>/ is two.
FIND_DEPTH = 3

# ---- a turn's prompt
PROMPT_MAX = 4000
PROMPT_HEADER = "Skills you can use (read one with the skill_read tool before you rely on it):"

# fullmatch throughout: '$' alone also matches before a trailing newline.
_NAME = re.compile(NAME)
_SEGMENT = re.compile(SEGMENT)
# ASCII white space only: what counts as a space in Unicode moves with its versions.
_SPACES = re.compile(r"[ \t\n\r\f\v]+")
_WORDS = re.compile(r"[ \t\n\r\f\v,]+")
NAME_RULE = ("1-64 lower-case letters, digits and single hyphens, "
             "not starting or ending with a hyphen")
SEGMENT_RULE = ("a path is segments of A-Z, a-z, 0-9, '_', '.', '-' joined by single '/', "
                "each starting with a letter or digit")


class SkillError(ValueError):
    """A skill that cannot be kept: ``file`` (``<name>/<path>``, ``<name>``
    for the whole skill, or the file :func:`parse` was given), ``field``
    (``name``, ``metadata.version``, ``path``…; None when no one field is at
    fault) and ``problem`` (one line)."""

    def __init__(self, file: str, field: str | None, problem: str):
        problem = " ".join(str(problem).split())  # one line, whatever the source text was
        super().__init__(file, field, problem)
        self.file, self.field, self.problem = file, field, problem

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.problem}" if self.field else f"{self.file}: {self.problem}"


@dataclass(frozen=True)
class SkillFile:
    """One file of a skill: its *path* in the folder, as the team named it
    (``references/REFERENCE.md``), and its text."""

    path: str
    body: str


@dataclass(frozen=True)
class Meta:
    """A skill's front matter. ``seats``, ``tools`` and ``cluster`` are read
    from ``metadata`` (crewlet's keys), however the Meta was made;
    ``metadata`` is a copy, its keys sorted."""

    name: str
    description: str
    license: str | None = None
    compatibility: str | None = None
    allowed_tools: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict, hash=False)
    seats: tuple[str, ...] = field(init=False, default=())
    tools: tuple[str, ...] = field(init=False, default=())
    cluster: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        metadata = dict(sorted(self.metadata.items()))
        set_ = object.__setattr__  # frozen: set once, here
        set_(self, "allowed_tools", tuple(self.allowed_tools))
        set_(self, "metadata", metadata)
        set_(self, "seats", _words(metadata.get(SEATS_KEY, "")))
        set_(self, "tools", _words(metadata.get(TOOLS_KEY, "")))
        set_(self, "cluster", metadata.get(CLUSTER_KEY, "").strip(" \t\n\r\f\v") or None)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types, keys always in this order: the stored form."""
        return {"name": self.name, "description": self.description, "license": self.license,
                "compatibility": self.compatibility, "allowed_tools": list(self.allowed_tools),
                "metadata": dict(self.metadata), "seats": list(self.seats), "tools": list(self.tools),
                "cluster": self.cluster}

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> Meta:
        """The Meta :meth:`as_dict` stored (the derived keys are derived again)."""
        return cls(name=stored["name"], description=stored["description"], license=stored.get("license"),
                   compatibility=stored.get("compatibility"),
                   allowed_tools=tuple(stored.get("allowed_tools") or ()),
                   metadata=dict(stored.get("metadata") or {}))


# ---- SKILL.md


class _Loader(StrictLoader):
    """The config's strict loader (a key given twice refused, plain data only),
    nesting held to this module's NESTING_MAX."""

    nesting = NESTING_MAX


def _is_fence(line: str) -> bool:
    return line.rstrip(" \t\r") == FENCE  # "---" with a CRLF ending, or trailing blanks, is one


def _front_matter(text: str, file: str) -> dict:
    """The front matter of *text*, a mapping; SkillError otherwise."""
    if not isinstance(text, str):
        raise SkillError(file, None, f"must be text, got {type(text).__name__}")
    lines = text.split("\n")  # not splitlines: that also splits on \v, \f, U+2028…
    if not _is_fence(lines[0]):
        raise SkillError(file, None, "no front matter: SKILL.md begins with a '---' line, "
                         "then YAML (name, description…), then a '---' line")
    end = next((i for i in range(1, len(lines)) if _is_fence(lines[i])), None)
    if end is None:
        raise SkillError(file, None, "front matter not closed: no '---' line after the first")
    try:
        data = yaml.load("\n".join(lines[1:end]), Loader=_Loader)
    except yaml.YAMLError as e:
        raise SkillError(file, None, f"front matter: {_yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise SkillError(file, None, f"front matter must be a mapping of keys to values, got {_kind(data)}")
    return data


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    # The mark counts from the front matter's first line, the file's second.
    return f"{problem} (line {mark.line + 2})" if mark is not None else problem


def _text(data: dict, key: str, file: str, *, required: bool = False, limit: int | None = None) -> str | None:
    """The string under *key* (None when absent or null and not *required*)."""
    value = data.get(key)
    if value is None:
        if required:
            raise SkillError(file, key, "missing: every skill has one")
        return None
    if not isinstance(value, str):
        raise SkillError(file, key, f"must be a string, got {_kind(value)}")
    if not value.strip():
        raise SkillError(file, key, "is empty")
    if limit is not None and len(value) > limit:
        raise SkillError(file, key, f"is {len(value)} characters, more than {limit}")
    return value


def _metadata(value: Any, file: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SkillError(file, "metadata", "must be a mapping of string keys to string values, "
                         f"got {_kind(value)}")
    for key, item in value.items():
        if not isinstance(key, str):
            raise SkillError(file, f"metadata.{_show(key)}", f"the key must be a string, got {_kind(key)}")
        if not isinstance(item, str):
            hint = f' (quote it: {_cut(key)}: "{item}")' if isinstance(item, (bool, int, float)) else ""
            raise SkillError(file, f"metadata.{_cut(key)}", f"must be a string, got {_kind(item)}{hint}")
    return dict(value)


def parse(text: str, file: str = SKILL_FILE) -> Meta:
    """The :class:`Meta` of a ``SKILL.md``'s *text*; SkillError naming
    *file* and the field otherwise. The name is held to the format, not to a
    folder (that is :func:`check`'s)."""
    data = _front_matter(text, file)
    unknown = sorted(_cut(k) if isinstance(k, str) else _show(k) for k in data if k not in KEYS)
    if unknown:
        raise SkillError(file, unknown[0], f"not a key of the format ({', '.join(KEYS)}): "
                         "crewlet's keys and any other go under metadata")
    name = _text(data, "name", file, required=True)
    if len(name) > NAME_MAX or not _NAME.fullmatch(name):
        raise SkillError(file, "name", f"{_show(name)} is not a skill name: {NAME_RULE}")
    description = _text(data, "description", file, required=True, limit=DESCRIPTION_MAX)
    license_ = _text(data, "license", file)
    compatibility = _text(data, "compatibility", file, limit=COMPATIBILITY_MAX)
    tools = data.get("allowed-tools")
    if tools is not None and not isinstance(tools, str):
        raise SkillError(file, "allowed-tools", f"must be a string of tool names separated by spaces, "
                         f"got {_kind(tools)}")
    return Meta(name=name, description=description, license=license_, compatibility=compatibility,
                allowed_tools=tuple(w for w in _SPACES.split(tools or "") if w),
                metadata=_metadata(data.get("metadata"), file))


# ---- a skill's files


def _files(name: str, files: Iterable[Any]) -> list[SkillFile]:
    """*files* as SkillFiles (from SkillFiles, ``(path, body)`` pairs or
    ``{"path", "body"}`` mappings, an op's form), at most FILES_MAX of them."""
    out: list[SkillFile] = []
    for item in files:
        if len(out) == FILES_MAX:
            raise SkillError(name, None, f"more than {FILES_MAX} files: a skill holds at most {FILES_MAX}")
        if isinstance(item, Mapping):
            item = (item.get("path"), item.get("body"))
        if isinstance(item, SkillFile):
            path, body = item.path, item.body
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            path, body = item
        else:
            raise SkillError(name, None, f"a file must be (path, body), got {_show(item)}")
        if not isinstance(path, str):
            raise SkillError(name, "path", f"must be a string, got {_kind(path)}")
        if not isinstance(body, str):
            raise SkillError(_where(name, path), "body", f"must be text (str), got {_kind(body)}")
        out.append(SkillFile(path, body))
    return out


def _path_problem(name: str, path: str, draft: bool) -> str | None:
    """What is wrong with *path* as the path of a file of skill *name*."""
    if not path:
        return "is empty"
    for segment in path.split("/"):
        if not segment:
            return f"{_show(path)} has an empty segment ('//', or '/' at its start or end): {SEGMENT_RULE}"
        if not _SEGMENT.fullmatch(segment):
            why = ("starts with '.' (hidden files are no part of a skill)" if segment.startswith(".")
                   else "does not start with a letter, a digit or '_'" if not _SEGMENT.match(segment[0])
                   else "has a character other than A-Z, a-z, 0-9, '_', '.', '-'")
            return f"segment {_show(segment)} {why}: {SEGMENT_RULE}"
    page = page_path(name, path, draft)
    if len(page) > PAGE_PATH_MAX:
        return f"its page {_show(page)} is {len(page)} characters, more than {PAGE_PATH_MAX}"
    return ops.path_problem(page, page=True)  # the estate's own rule, should it ever narrow


def _body_size(where: str, body: str) -> int:
    """The UTF-8 bytes of *body*, held to a page's rules."""
    if "\x00" in body:
        raise SkillError(where, "body", f"holds a NUL character (at {body.index(chr(0))}): "
                         "crewlet keeps a skill's resources as text pages")
    if len(body) > FILE_CHARS_MAX:
        raise SkillError(where, "body", f"is {len(body)} characters, more than {FILE_CHARS_MAX}")
    try:
        return len(body.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate, as a JSON "\ud800" decodes to
        raise SkillError(where, "body", f"is not Unicode text (a lone surrogate at {e.start})") from None


def check(name: str, files: Iterable[Any], *, draft: bool = False) -> Meta:
    """The :class:`Meta` of skill *name* made of *files* (SkillFiles,
    ``(path, body)`` pairs or ``{"path", "body"}`` mappings), held to every
    rule of the module doc; SkillError otherwise. *draft*: its pages are a
    draft's (``skills/drafts/<name>/…``), whose longer prefix leaves the
    paths less room. Deterministic: the files are taken in path order, so
    the same files in any order are refused for the same reason."""
    if not isinstance(name, str):
        raise SkillError(_show(name), "name", f"must be a string, got {_kind(name)}")
    if len(name) > NAME_MAX or not _NAME.fullmatch(name):
        raise SkillError(name, "name", f"{_show(name)} is not a skill name: {NAME_RULE}")
    if name in RESERVED_NAMES:
        raise SkillError(name, "name", f"{name!r} is reserved: skills/{name}/ holds the drafts")
    items = sorted(_files(name, files), key=lambda f: f.path)
    seen: dict[str, str] = {}  # lower-cased path -> the path
    total = 0
    for item in items:
        where = _where(name, item.path)
        problem = _path_problem(name, item.path, draft)
        if problem:
            raise SkillError(where, "path", problem)
        lower = item.path.lower()
        if lower in seen:
            raise SkillError(where, "path", f"differs from {seen[lower]!r} only in case: both would be the "
                             f"page {page_path(name, item.path, draft)!r}")
        seen[lower] = item.path
        total += _body_size(where, item.body)
    if total > SKILL_BYTES_MAX:
        raise SkillError(name, None, f"its files are {total} bytes of UTF-8, more than {SKILL_BYTES_MAX} "
                         "(512 KiB) a skill may hold")
    top = next((f for f in items if f.path == SKILL_FILE), None)
    if top is None:
        near = seen.get(SKILL_PAGE)
        hint = f" ({near!r} is not it: the name is upper case, the extension lower)" if near else ""
        raise SkillError(f"{name}/{SKILL_FILE}", None, f"missing: a skill is a folder with a {SKILL_FILE} "
                         f"at its top{hint}")
    meta = parse(top.body, f"{name}/{SKILL_FILE}")
    if meta.name != name:
        raise SkillError(f"{name}/{SKILL_FILE}", "name", f"the front matter says {meta.name!r}, the folder "
                         f"is {name!r}: a skill's name is its folder's")
    return meta


# ---- pages


def page_path(name: str, path: str, draft: bool = False) -> str:
    """The estate page of file *path* of skill *name* (a draft's with *draft*);
    *name* and *path* as :func:`check` passed them."""
    prefix = f"{PAGES}/{DRAFTS}/{name}" if draft else f"{PAGES}/{name}"
    return f"{prefix}/{path.lower()}"


def skill_of_page(page: str) -> tuple[str, bool] | None:
    """``(name, draft)`` of the skill a page under ``skills/`` belongs to;
    None for any other page."""
    parts = page.split("/") if isinstance(page, str) else []
    if len(parts) < 3 or parts[0] != PAGES:
        return None
    draft = parts[1] == DRAFTS
    if draft:
        parts = parts[1:]
        if len(parts) < 3:
            return None
    name = parts[1]
    if len(name) > NAME_MAX or not _NAME.fullmatch(name) or not parts[-1]:
        return None
    return name, draft


# ---- from disk


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _read_text(disk: str, where: str, size: int) -> str:
    """The text of the file at *disk*, refused unread when bigger than a whole skill may be."""
    if size > SKILL_BYTES_MAX:
        raise SkillError(where, "body", f"is {size} bytes, more than the {SKILL_BYTES_MAX} (512 KiB) "
                         "a whole skill may hold")
    with open(disk, "rb") as f:
        raw = f.read(SKILL_BYTES_MAX + 1)  # never more: it may have grown since
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SkillError(where, None, NOT_TEXT) from None
    if "\x00" in text:  # valid UTF-8 all the same: UTF-16, or a binary of mostly ASCII
        raise SkillError(where, None, NOT_TEXT)
    return text


def read_folder(folder: str | os.PathLike) -> tuple[str, list[SkillFile]]:
    """``(name, files)`` of the skill folder *folder*: the name is the
    folder's own, the files every file under it (entries starting with '.'
    skipped, links followed inside the folder only) sorted by their path
    with '/' separators, bodies exactly as on disk. Checks nothing of the
    format (call :func:`check`); SkillError for a file it cannot read as
    a skill's, or past FILES_MAX files."""
    folder = os.fspath(folder)
    name = os.path.basename(os.path.abspath(folder))  # "." names the current folder
    if not os.path.isdir(folder):
        raise SkillError(name, None, f"{folder!r} is not a folder")
    root = os.path.realpath(folder)
    walked = {root}
    files: list[SkillFile] = []
    pending = [("", folder)]  # (path in the skill, path on disk)
    while pending:
        rel_dir, disk_dir = pending.pop()
        for entry in sorted(os.listdir(disk_dir)):
            if entry.startswith("."):
                continue  # .git, .DS_Store, .gitignore: no part of a skill
            rel = f"{rel_dir}/{entry}" if rel_dir else entry
            disk, where = os.path.join(disk_dir, entry), f"{name}/{rel}"
            real = os.path.realpath(disk)
            if not _inside(real, root):
                raise SkillError(where, None, "a symbolic link to outside the skill's folder: "
                                 "copy the file in instead")
            try:
                st = os.stat(disk)
            except OSError as e:
                raise SkillError(where, None, f"cannot read: {e.strerror or e}") from None
            if stat.S_ISDIR(st.st_mode):
                if real in walked:
                    raise SkillError(where, None, "a symbolic link to a folder read already (a loop)")
                walked.add(real)
                pending.append((rel, disk))
            elif stat.S_ISREG(st.st_mode):
                if len(files) == FILES_MAX:
                    raise SkillError(name, None, f"more than {FILES_MAX} files: a skill holds at most "
                                     f"{FILES_MAX}")
                files.append(SkillFile(rel, _read_text(disk, where, st.st_size)))
            else:
                raise SkillError(where, None, "not a file or a folder (a pipe, a socket, a device)")
    files.sort(key=lambda f: f.path)
    return name, files


def _holds_skill(folder: str) -> bool:
    # listdir, not isfile(join(...)): "skill.md" is not SKILL.md, even on a
    # file system that folds case.
    return SKILL_FILE in os.listdir(folder) and os.path.isfile(os.path.join(folder, SKILL_FILE))


def find_skills(root: str | os.PathLike) -> list[str]:
    """The skill folders under *root*: *root* itself when it holds a
    ``SKILL.md``; else, sorted, every folder at most FIND_DEPTH levels below
    it that holds one (a skills repository's ``skills/<name>/SKILL.md``) —
    not looking inside a skill's folder, nor in folders starting with '.',
    nor through symbolic links to folders (a checkout's link may lead
    anywhere)."""
    root = os.fspath(root)
    if _holds_skill(root):
        return [root]
    found: list[str] = []
    pending = [(root, 1)]  # (folder, the depth of its entries)
    while pending:
        folder, depth = pending.pop()
        for entry in os.listdir(folder):
            disk = os.path.join(folder, entry)
            if entry.startswith(".") or os.path.islink(disk) or not os.path.isdir(disk):
                continue
            if _holds_skill(disk):
                found.append(disk)
            elif depth < FIND_DEPTH:
                pending.append((disk, depth + 1))
    return sorted(found)


# ---- in a turn


def applies_to(meta: Meta, seat: str) -> bool:
    """Whether the skill is for *seat*: its ``crewlet-seats`` names it or a
    pattern matches it (case-sensitive on every platform), or it names none."""
    return not meta.seats or any(fnmatch.fnmatchcase(seat, pattern) for pattern in meta.seats)


def _more(count: int) -> str:
    return f'- … and {count} more (skill_read lists them: call it with name "?")'


def prompt_list(metas: Iterable[Meta], max_chars: int = PROMPT_MAX) -> str:
    """The lines a turn's system prompt gets: :data:`PROMPT_HEADER`, then
    ``- <name>: <description>`` (its whitespace folded to single spaces) in
    name order; "" with no skills. When they pass *max_chars*, as many as
    fit beside a last line counting the rest (``- … and N more``). At most
    *max_chars* characters, save that the header and the count are always
    there."""
    ordered = sorted(metas, key=lambda m: (m.name, m.description))
    if not ordered:
        return ""
    lines = [f"- {m.name}: {' '.join(m.description.split())}" for m in ordered]
    size = len(PROMPT_HEADER)
    if size + sum(1 + len(line) for line in lines) <= max_chars:
        return "\n".join([PROMPT_HEADER, *lines])
    kept: list[str] = []
    for line in lines:
        if size + 1 + len(line) + 1 + len(_more(len(lines) - len(kept) - 1)) > max_chars:
            break
        kept.append(line)
        size += 1 + len(line)
    return "\n".join([PROMPT_HEADER, *kept, _more(len(lines) - len(kept))])


# ---- words


def _words(value: str) -> tuple[str, ...]:
    """The names in a comma- or space-separated string, each once, in order."""
    return tuple(dict.fromkeys(w for w in _WORDS.split(value) if w))


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _show(value: Any) -> str:
    """*value* for a refusal, cut short: a refusal is kept as an op's outcome on every copy."""
    return _cut(repr(value))


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _where(name: str, path: str) -> str:
    """A file named in a refusal: ``<name>/<path>``, whole unless far past any page path's length."""
    return _cut(f"{name}/{path}", 2 * PAGE_PATH_MAX)
