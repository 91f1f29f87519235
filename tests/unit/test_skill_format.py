"""Skill folders in the Agent Skills format (crewlet.skills.format): real
folders in temp dirs read, checked and refused, each refusal naming the file
and the field."""

from __future__ import annotations

import os

import pytest

from crewlet.skills import format as fmt
from crewlet.skills.format import Meta, SkillError, SkillFile, check, parse, read_folder

PDF_SKILL = """\
---
name: pdf-processing
description: >-
  Extract text and tables from PDF files, fill forms, merge documents.
  Use when working with PDF files or when the user mentions PDFs, forms or extraction.
license: Apache-2.0
compatibility: Needs Python 3.11 and pdfplumber
allowed-tools: Bash(python:*) Read
metadata:
  author: example-org
  version: "1.0"
---
# PDF processing

## When to use this skill
Use it when the user needs to read a PDF, fill a form, or merge files.

## How to extract text
1. Run `scripts/extract.py <file.pdf>`.
2. See [the reference](references/REFERENCE.md) for tables.
"""
REFERENCE = "# pdfplumber reference\r\n\r\nTables: `page.extract_tables()`.\r\n"  # CRLF, kept as is
EXTRACT = '''#!/usr/bin/env python3
"""Print the text of each page of a PDF."""
import sys

import pdfplumber

with pdfplumber.open(sys.argv[1]) as pdf:
    for page in pdf.pages:
        print(page.extract_text() or "")
'''
RELEASE_SKILL = """\
---
name: release-notes
description: Write the release notes of a version from its merged pull requests.
metadata:
  crewlet-seats: writer, eng-*  docs
  crewlet-tools: github.search github.pr
  crewlet-cluster: c-7f3a
---
Group the changes by area; lead with what a user notices.
"""


def write(folder, files: dict[str, str | bytes]):
    """Write *files* (path -> text or bytes) under *folder*, bytes exactly."""
    for path, body in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    return folder


def skill_md(name: str = "pdf-processing", description: str = "Does a thing. Use it when asked.",
             extra: str = "") -> str:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\nBody.\n"


def refusal(name: str, files) -> SkillError:
    with pytest.raises(SkillError) as info:
        check(name, files)
    return info.value


# ---- a folder, read and checked


def test_a_pdf_skill_folder_round_trips_byte_for_byte_skipping_dot_entries(tmp_path):
    folder = write(tmp_path / "pdf-processing", {
        "SKILL.md": PDF_SKILL, "references/REFERENCE.md": REFERENCE, "scripts/extract.py": EXTRACT,
        ".DS_Store": b"\x00\x00\x00\x01Bud1\x00", ".git/config": "[core]\n",
        "scripts/.cache/x.pyc": b"\xff\x00",
    })
    name, files = read_folder(folder)
    assert name == "pdf-processing"
    assert files == [SkillFile("SKILL.md", PDF_SKILL), SkillFile("references/REFERENCE.md", REFERENCE),
                     SkillFile("scripts/extract.py", EXTRACT)]
    for f in files:
        assert f.body.encode("utf-8") == (folder / f.path).read_bytes()
    meta = check(name, files)
    assert meta == Meta(
        name="pdf-processing",
        description="Extract text and tables from PDF files, fill forms, merge documents. Use when working "
                    "with PDF files or when the user mentions PDFs, forms or extraction.",
        license="Apache-2.0", compatibility="Needs Python 3.11 and pdfplumber",
        allowed_tools=("Bash(python:*)", "Read"), metadata={"author": "example-org", "version": "1.0"})
    assert (meta.seats, meta.tools, meta.cluster) == ((), (), None)
    assert [fmt.page_path(name, f.path) for f in files] == [
        "skills/pdf-processing/skill.md", "skills/pdf-processing/references/reference.md",
        "skills/pdf-processing/scripts/extract.py"]


def test_crewlets_own_metadata_keys_give_the_seats_tools_and_cluster(tmp_path):
    name, files = read_folder(write(tmp_path / "release-notes", {"SKILL.md": RELEASE_SKILL}))
    meta = check(name, files)
    assert meta.seats == ("writer", "eng-*", "docs")
    assert meta.tools == ("github.search", "github.pr")
    assert meta.cluster == "c-7f3a"
    assert meta.as_dict() == {
        "name": "release-notes",
        "description": "Write the release notes of a version from its merged pull requests.",
        "license": None, "compatibility": None, "allowed_tools": [],
        "metadata": {"crewlet-cluster": "c-7f3a", "crewlet-seats": "writer, eng-*  docs",
                     "crewlet-tools": "github.search github.pr"},
        "seats": ["writer", "eng-*", "docs"], "tools": ["github.search", "github.pr"], "cluster": "c-7f3a"}
    assert list(meta.as_dict()) == ["name", "description", "license", "compatibility", "allowed_tools",
                                    "metadata", "seats", "tools", "cluster"]
    assert Meta.from_dict(meta.as_dict()) == meta


def test_applies_to_matches_seats_and_patterns_case_sensitively_and_none_means_every_seat():
    meta = parse(RELEASE_SKILL)
    seats = ("writer", "eng-lead", "eng-", "docs", "ENG-lead", "sales", "writers")
    assert [fmt.applies_to(meta, s) for s in seats] == [True, True, True, True, False, False, False]
    assert fmt.applies_to(parse(skill_md()), "anyone") is True


def test_check_is_the_same_whatever_order_or_shape_the_files_come_in():
    files = [("SKILL.md", PDF_SKILL), ("scripts/extract.py", EXTRACT), ("references/REFERENCE.md", REFERENCE)]
    as_ops = [{"path": p, "body": b} for p, b in reversed(files)]
    assert check("pdf-processing", files) == check("pdf-processing", as_ops) \
        == check("pdf-processing", [SkillFile(*f) for f in files])
    bad = files + [("references/My Notes.md", "x"), ("assets/a b.txt", "y")]
    first, second = refusal("pdf-processing", bad), refusal("pdf-processing", list(reversed(bad)))
    assert str(first) == str(second)
    assert (first.file, first.field) == ("pdf-processing/assets/a b.txt", "path")


def test_a_crlf_skill_md_parses():
    meta = parse(skill_md().replace("\n", "\r\n"))
    assert (meta.name, meta.description) == ("pdf-processing", "Does a thing. Use it when asked.")


# ---- SKILL.md refused, naming the file and the field

LONG = "x" * 1025
NO_FRONT_MATTER = ("no front matter: SKILL.md begins with a '---' line, then YAML (name, description…), "
                   "then a '---' line")


@pytest.mark.parametrize("text, field, problem", [
    ("# PDF processing\nNo front matter here.\n", None, NO_FRONT_MATTER),
    ("\n---\nname: pdf-processing\ndescription: d\n---\n", None, NO_FRONT_MATTER),
    ("---\nname: pdf-processing\ndescription: d\n", None,
     "front matter not closed: no '---' line after the first"),
    ("---\n- name\n- description\n---\n", None, "front matter must be a mapping of keys to values, got list"),
    ("---\nname: pdf-processing\nname: pdf\ndescription: d\n---\n", None,
     "front matter: duplicate key 'name' (line 3)"),
    ("---\nname: pdf-processing\ndescription: [[[[[[[[[[x]]]]]]]]]]\n---\n", None,
     "front matter: nested deeper than 8 levels (line 3)"),
    (skill_md(name="PDF_Processing"), "name",
     "'PDF_Processing' is not a skill name: 1-64 lower-case letters, digits and single hyphens, "
     "not starting or ending with a hyphen"),
    (skill_md(name="pdf--processing"), "name",
     "'pdf--processing' is not a skill name: 1-64 lower-case letters, digits and single hyphens, "
     "not starting or ending with a hyphen"),
    (skill_md(name="-pdf"), "name",
     "'-pdf' is not a skill name: 1-64 lower-case letters, digits and single hyphens, "
     "not starting or ending with a hyphen"),
    ("---\ndescription: d\n---\n", "name", "missing: every skill has one"),
    (skill_md(name="12"), "name", "must be a string, got int"),
    (skill_md(name="pdf"), "name",
     "the front matter says 'pdf', the folder is 'pdf-processing': a skill's name is its folder's"),
    ("---\nname: pdf-processing\n---\n", "description", "missing: every skill has one"),
    (skill_md(description="''"), "description", "is empty"),
    (skill_md(description=LONG), "description", "is 1025 characters, more than 1024"),
    (skill_md(extra="compatibility: " + "y" * 501 + "\n"), "compatibility",
     "is 501 characters, more than 500"),
    (skill_md(extra="license: [MIT]\n"), "license", "must be a string, got list"),
    (skill_md(extra="allowed-tools: [Read, Grep]\n"), "allowed-tools",
     "must be a string of tool names separated by spaces, got list"),
    (skill_md(extra="metadata:\n  author: me\n  version: 1.0\n"), "metadata.version",
     'must be a string, got float (quote it: version: "1.0")'),
    (skill_md(extra="metadata:\n  crewlet-seats: [writer]\n"), "metadata.crewlet-seats",
     "must be a string, got list"),
    (skill_md(extra="metadata: writer\n"), "metadata",
     "must be a mapping of string keys to string values, got str"),
    (skill_md(extra="version: 1.0.0\n"), "version",
     "not a key of the format (name, description, license, compatibility, allowed-tools, metadata): "
     "crewlet's keys and any other go under metadata"),
])
def test_a_bad_skill_md_is_refused_naming_the_file_and_the_field(text, field, problem):
    error = refusal("pdf-processing", [("SKILL.md", text), ("references/REFERENCE.md", REFERENCE)])
    assert (error.file, error.field, error.problem) == ("pdf-processing/SKILL.md", field, problem)
    assert str(error) == (f"pdf-processing/SKILL.md: {field}: {problem}" if field
                          else f"pdf-processing/SKILL.md: {problem}")


def test_parse_alone_names_the_file_it_was_given():
    with pytest.raises(SkillError) as info:
        parse(skill_md(description=LONG), file="x/SKILL.md")
    assert str(info.value) == "x/SKILL.md: description: is 1025 characters, more than 1024"
    assert isinstance(info.value, ValueError)


# ---- a skill's files refused


def test_a_folder_without_skill_md_is_refused_and_a_lower_case_one_is_not_it(tmp_path):
    name, files = read_folder(write(tmp_path / "pdf-processing", {"README.md": "# hi\n"}))
    error = refusal(name, files)
    assert str(error) == "pdf-processing/SKILL.md: missing: a skill is a folder with a SKILL.md at its top"
    error = refusal(name, [("skill.md", skill_md())])
    assert (error.file, error.field) == ("pdf-processing/SKILL.md", None)
    assert error.problem.endswith("('skill.md' is not it: the name is upper case, the extension lower)")
    assert str(refusal(name, [])) == str(refusal(name, [("README.md", "")]))


def test_two_files_differing_only_in_case_are_refused():
    error = refusal("pdf-processing", [("SKILL.md", skill_md()), ("references/Reference.md", "a"),
                                       ("references/REFERENCE.md", "b")])
    assert (error.file, error.field) == ("pdf-processing/references/Reference.md", "path")
    assert error.problem == ("differs from 'references/REFERENCE.md' only in case: both would be the page "
                             "'skills/pdf-processing/references/reference.md'")
    error = refusal("pdf-processing", [("SKILL.md", skill_md()), ("skill.md", "")])
    assert (error.file, error.field) == ("pdf-processing/skill.md", "path")


def test_a_binary_file_is_refused_naming_it(tmp_path):
    folder = write(tmp_path / "pdf-processing", {
        "SKILL.md": PDF_SKILL, "assets/logo.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"})
    with pytest.raises(SkillError) as info:
        read_folder(folder)
    assert (info.value.file, info.value.field) == ("pdf-processing/assets/logo.png", None)
    assert str(info.value) == ("pdf-processing/assets/logo.png: not UTF-8 text: "
                               "crewlet keeps a skill's resources as text pages")
    (folder / "assets/logo.png").write_bytes("ab".encode("utf-16-le"))  # valid UTF-8, but NULs
    with pytest.raises(SkillError) as info:
        read_folder(folder)
    assert info.value.problem == fmt.NOT_TEXT
    error = refusal("pdf-processing", [("SKILL.md", PDF_SKILL), ("data.txt", "a\x00b")])
    assert (error.file, error.field) == ("pdf-processing/data.txt", "body")
    assert error.problem == "holds a NUL character (at 1): crewlet keeps a skill's resources as text pages"
    error = refusal("pdf-processing", [("SKILL.md", PDF_SKILL), ("data.bin", b"\x89PNG")])
    assert (error.file, error.field, error.problem) == ("pdf-processing/data.bin", "body",
                                                        "must be text (str), got bytes")


def test_a_path_with_a_space_is_read_but_refused_by_check(tmp_path):
    folder = write(tmp_path / "pdf-processing", {"SKILL.md": PDF_SKILL, "references/my notes.md": "notes"})
    name, files = read_folder(folder)
    assert [f.path for f in files] == ["SKILL.md", "references/my notes.md"]
    error = refusal(name, files)
    assert (error.file, error.field) == ("pdf-processing/references/my notes.md", "path")
    assert error.problem == ("segment 'my notes.md' has a character other than A-Z, a-z, 0-9, '_', '.', '-': "
                             "a path is segments of A-Z, a-z, 0-9, '_', '.', '-' joined by single '/', "
                             "each starting with a letter or digit")


@pytest.mark.parametrize("path, problem", [
    ("", "is empty"),
    ("references//a.md", "'references//a.md' has an empty segment"),
    ("/etc/passwd", "'/etc/passwd' has an empty segment"),
    ("../x.md", "segment '..' starts with '.'"),
    ("scripts/.env", "segment '.env' starts with '.'"),
    ("scripts/-x.py", "segment '-x.py' does not start with a letter, a digit or '_'"),
    ("notes\\a.md", "segment 'notes\\\\a.md' has a character other than"),
    ("résumé.md", "segment 'résumé.md' has a character other than"),
    ("a.md\n", "segment 'a.md\\n' has a character other than"),
])
def test_a_path_that_cannot_be_a_page_is_refused(path, problem):
    error = refusal("pdf-processing", [("SKILL.md", skill_md()), (path, "x")])
    assert (error.file, error.field) == (f"pdf-processing/{path}", "path")
    assert error.problem.startswith(problem)


def test_a_page_path_is_at_most_200_characters_and_a_drafts_prefix_counts():
    prefix = "skills/pdf-processing/"
    fits = "r/" + "a" * (200 - len(prefix) - 2)
    assert len(fmt.page_path("pdf-processing", fits)) == 200
    assert check("pdf-processing", [("SKILL.md", skill_md()), (fits, "x")]).name == "pdf-processing"
    error = refusal("pdf-processing", [("SKILL.md", skill_md()), (fits + "b", "x")])
    assert (error.field, error.problem[-32:]) == ("path", "is 201 characters, more than 200")
    with pytest.raises(SkillError) as info:
        check("pdf-processing", [("SKILL.md", skill_md()), (fits, "x")], draft=True)
    assert info.value.problem.endswith("is 207 characters, more than 200")


def test_the_limits_of_a_skill():
    top = ("SKILL.md", skill_md())
    assert check("pdf-processing", [top] + [(f"r/{i}.md", "x") for i in range(fmt.FILES_MAX - 1)])
    error = refusal("pdf-processing", [top] + [(f"r/{i}.md", "x") for i in range(fmt.FILES_MAX)])
    assert str(error) == "pdf-processing: more than 100 files: a skill holds at most 100"
    error = refusal("pdf-processing", [top, ("big.md", "x" * (fmt.FILE_CHARS_MAX + 1))])
    assert str(error) == "pdf-processing/big.md: body: is 200001 characters, more than 200000"
    three = [top] + [(f"r/{i}.md", "é" * 90_000) for i in range(3)]  # 180,000 bytes each
    error = refusal("pdf-processing", three)
    assert error.file == "pdf-processing" and error.field is None
    assert error.problem == (f"its files are {540_000 + len(top[1])} bytes of UTF-8, more than 524288 "
                             "(512 KiB) a skill may hold")
    error = refusal("pdf-processing", [top, ("odd.md", "a\ud800")])
    assert (error.field, error.problem) == ("body", "is not Unicode text (a lone surrogate at 1)")


def test_a_folder_name_that_is_no_skill_name_or_is_reserved_is_refused():
    assert str(refusal("PDF Processing", [("SKILL.md", skill_md())])) == (
        "PDF Processing: name: 'PDF Processing' is not a skill name: 1-64 lower-case letters, digits and "
        "single hyphens, not starting or ending with a hyphen")
    assert str(refusal("drafts", [("SKILL.md", skill_md(name="drafts"))])) == (
        "drafts: name: 'drafts' is reserved: skills/drafts/ holds the drafts")
    assert refusal("a" * 65, [("SKILL.md", skill_md(name="a" * 65))]).field == "name"
    assert check("a" * 64, [("SKILL.md", skill_md(name="a" * 64))]).name == "a" * 64


# ---- links, from disk


def test_links_are_followed_inside_the_folder_and_refused_outside_it(tmp_path):
    folder = write(tmp_path / "pdf-processing", {"SKILL.md": PDF_SKILL, "references/REFERENCE.md": REFERENCE})
    (tmp_path / "secret.txt").write_text("hunter2")
    os.symlink("references/REFERENCE.md", folder / "REFERENCE.md")
    name, files = read_folder(folder)
    assert [(f.path, f.body == REFERENCE) for f in files] == [
        ("REFERENCE.md", True), ("SKILL.md", False), ("references/REFERENCE.md", True)]
    os.symlink("../../secret.txt", folder / "references/secret.txt")
    with pytest.raises(SkillError) as info:
        read_folder(folder)
    assert str(info.value) == ("pdf-processing/references/secret.txt: a symbolic link to outside the skill's "
                               "folder: copy the file in instead")
    os.remove(folder / "references/secret.txt")
    os.symlink("..", folder / "references/loop")
    with pytest.raises(SkillError) as info:
        read_folder(folder)
    assert str(info.value) == ("pdf-processing/references/loop: "
                               "a symbolic link to a folder read already (a loop)")


def test_read_folder_stops_past_the_file_limit(tmp_path):
    folder = write(tmp_path / "many", {f"r/{i:03}.md": "x" for i in range(fmt.FILES_MAX + 1)})
    with pytest.raises(SkillError) as info:
        read_folder(folder)
    assert str(info.value) == "many: more than 100 files: a skill holds at most 100"


# ---- a checkout


def test_find_skills_in_a_checkout_of_a_skills_repository(tmp_path):
    root = write(tmp_path / "checkout", {
        "README.md": "# Our skills\n",
        "skills/release-notes/SKILL.md": RELEASE_SKILL,
        "skills/pdf-processing/SKILL.md": PDF_SKILL,
        "skills/pdf-processing/examples/SKILL.md": skill_md(name="examples"),  # inside a skill: its resource
        "skills/lower/skill.md": skill_md(name="lower"),                       # not SKILL.md
        "skills/empty/README.md": "nothing",
        "team/ops/oncall/SKILL.md": skill_md(name="oncall"),                  # depth 3
        "a/b/c/d/SKILL.md": skill_md(name="d"),                               # depth 4: too deep
        ".github/skills/ci/SKILL.md": skill_md(name="ci"),                    # dot-dir
        "skills/.hidden/SKILL.md": skill_md(name="hidden"),
    })
    os.symlink(root / "skills/release-notes", root / "linked")
    assert fmt.find_skills(root) == [str(root / "skills/pdf-processing"), str(root / "skills/release-notes"),
                                     str(root / "team/ops/oncall")]
    assert fmt.find_skills(root / "skills/release-notes") == [str(root / "skills/release-notes")]
    assert fmt.find_skills(root / "skills/empty") == []


# ---- pages


def test_page_paths_and_the_skill_a_page_belongs_to():
    assert fmt.SKILL_PAGE == "skill.md"
    assert fmt.page_path("pdf-processing", "SKILL.md") == "skills/pdf-processing/skill.md"
    assert fmt.page_path("pdf-processing", "Scripts/Extract.PY", draft=True) == \
        "skills/drafts/pdf-processing/scripts/extract.py"
    assert [fmt.skill_of_page(p) for p in (
        "skills/pdf-processing/skill.md", "skills/pdf-processing/references/reference.md",
        "skills/drafts/pdf-processing/skill.md", "skills/drafts/skill.md", "skills/pdf-processing",
        "skills/Bad_Name/skill.md", "eng/skills/x/skill.md", "skills/pdf-processing/")] == [
        ("pdf-processing", False), ("pdf-processing", False), ("pdf-processing", True), None, None,
        None, None, None]


# ---- the prompt's list


def test_prompt_list_lists_skills_in_name_order_with_descriptions_on_one_line():
    metas = [parse(RELEASE_SKILL), parse(PDF_SKILL)]
    assert fmt.prompt_list(metas) == (
        "Skills you can use (read one with the skill_read tool before you rely on it):\n"
        "- pdf-processing: Extract text and tables from PDF files, fill forms, merge documents. Use when "
        "working with PDF files or when the user mentions PDFs, forms or extraction.\n"
        "- release-notes: Write the release notes of a version from its merged pull requests.")
    assert fmt.prompt_list([]) == ""
    assert fmt.prompt_list([Meta("a", "one\n  two\tthree")]).endswith("\n- a: one two three")


def test_prompt_list_is_bounded_and_says_how_many_it_left_out():
    metas = [Meta(f"skill-{i:02}", f"Does thing number {i}.") for i in range(40)]
    text = fmt.prompt_list(list(reversed(metas)), max_chars=500)
    lines = text.split("\n")
    assert len(text) <= 500
    assert lines[0] == fmt.PROMPT_HEADER
    kept = lines[1:-1]
    assert kept == [f"- skill-{i:02}: Does thing number {i}." for i in range(len(kept))]
    # The header's 77 characters, ten lines of 1 + 32, the count's 1 + 62: 470. An eleventh
    # line (1 + 33) would make it 504.
    assert len(text) == 470 and len(kept) == 10
    assert lines[-1] == '- … and 30 more (skill_read lists them: call it with name "?")'
    assert fmt.prompt_list(metas, max_chars=500) == text
    everything = fmt.prompt_list(metas, max_chars=100_000)
    assert "more" not in everything and len(everything.split("\n")) == 41
    # Exactly the room for every line: no count.
    assert fmt.prompt_list(metas, max_chars=len(everything)) == everything
    tiny = fmt.prompt_list(metas, max_chars=10)
    assert tiny == fmt.PROMPT_HEADER + '\n- … and 40 more (skill_read lists them: call it with name "?")'


def test_prompt_list_never_passes_its_bound_and_keeps_a_prefix_in_name_order():
    metas = [Meta(f"s{i}", "d" * (i * 13 % 97 + 1)) for i in range(60)]
    everything = fmt.prompt_list(metas, max_chars=10**6).split("\n")
    floor = len(fmt.PROMPT_HEADER) + 1 + len(fmt._more(60))
    for bound in range(0, len("\n".join(everything)) + 50, 37):
        text = fmt.prompt_list(metas, max_chars=bound)
        assert len(text) <= max(bound, floor)
        lines = text.split("\n")
        if lines[-1].startswith("- … and "):
            kept = lines[:-1]
            assert lines[-1] == fmt._more(len(everything) - len(kept))
        else:
            kept = lines
        assert kept == everything[:len(kept)]


def test_yaml_merge_keys_are_read_and_a_key_given_twice_is_refused():
    merged = parse(skill_md(extra="metadata:\n  <<: {author: a, version: '1'}\n  version: '2'\n"))
    assert merged.metadata == {"author": "a", "version": "2"}
    with pytest.raises(SkillError) as info:
        parse(skill_md(extra="metadata:\n  crewlet-seats: writer\n  crewlet-seats: eng-*\n"))
    assert str(info.value) == "SKILL.md: front matter: duplicate key 'crewlet-seats' (line 6)"
    # Only ASCII white space separates names: a no-break space is part of one.
    meta = parse(skill_md(extra="allowed-tools: Read\u00a0Grep  Bash\n"))
    assert meta.allowed_tools == ("Read\u00a0Grep", "Bash")
