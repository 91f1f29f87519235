"""Skills: what a seat knows how to do, kept as Agent Skills folders (DESIGN §15).

A **skill** is a folder in the open Agent Skills format (agentskills.io): a
``SKILL.md`` — YAML front matter (``name``, ``description``, optional
``license``, ``compatibility``, ``allowed-tools``, ``metadata``) then Markdown
— and optional resource files beside it (``scripts/``, ``references/``,
``assets/``…), all text. crewlet's own keys (the seats and tools a skill is
for, the cluster curation drafted it from) live under ``metadata``, so a
skill stays valid for every other runtime that reads the format.

The company keeps its skills in the estate: one page per file under
``skills/<name>/…`` (each write a new revision, history kept), and what the
curation pass proposes under ``skills/drafts/<name>/…``. A turn's prompt lists
the skills that apply to its seat; ``skill_read`` loads a body or a resource
on demand.

Following a skill, by module:

==========================  =================================================
``format.py``               the format as crewlet stores it: parsing and
                            checking a skill's files (the applier's rule),
                            reading a folder, finding skills in a checkout,
                            the page of a file, the seats a skill applies
                            to, the prompt's list of skills
==========================  =================================================
"""
