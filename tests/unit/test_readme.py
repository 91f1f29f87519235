"""The README's config reference, commands, quick start, seat tools and
benchmarks stay true to the code."""

from __future__ import annotations

import glob
import os
import re
import shlex

import click
from pydantic import BaseModel

import crewlet.ctl as ctl
from crewlet.agent.estate_tools import ESTATE_TOOL_NAMES
from crewlet.company.load import load_company
from crewlet.config.model import NodeConfig
from crewlet.estate import view
from roles.data_applier import applier

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def _keys(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _keys(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def test_every_config_key_is_in_the_reference_with_its_default():
    rows = {m.group(1): m.group(2) for m in
            re.finditer(r"^\| `([a-z_.]+)` \| `([^`]*)` \|", _readme(), re.M)}
    for key, field in _keys(NodeConfig):
        assert key in rows, f"README's config reference lacks {key}"
        if key == "data_dir":
            continue  # depends on the environment; the row says how
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list):
            shown = "[" + ", ".join(map(str, default)) + "]"
        else:
            shown = str(default)
        assert rows[key] == shown, f"{key}: README says {rows[key]!r}, the model {shown!r}"
    documented = set(rows)
    actual = {k for k, _ in _keys(NodeConfig)}
    assert documented <= actual, f"README documents keys that do not exist: {documented - actual}"


def test_quick_start_test_command_is_what_ci_runs():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert "python -m pytest -q" in _readme()
    assert re.search(r"^python -m pytest -q", ci, re.M)


# ------------------------------------------------------------------ crewletctl

def _options(command: click.Command) -> set[str]:
    """Every option of *command* and of its subcommands (``dlq requeue``)."""
    opts = {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
    for sub in getattr(command, "commands", {}).values():
        opts |= _options(sub)
    return opts


def _commands_table() -> dict[str, str]:
    """The 'Operating a node' rows: command name -> the row's first cell."""
    rows = {}
    for line in _readme().splitlines():
        if line.startswith("| `crewletctl "):
            cell = line.replace("\\|", "").split("|")[1]  # an escaped | is not a cell's end
            rows[cell.split()[1].rstrip("`")] = cell
    return rows


def _quick_start_calls() -> list[list[str]]:
    """Each crewletctl command line of the quick start, split as a shell would (comments dropped)."""
    return [shlex.split(line, comments=True)[1:] for line in _readme().splitlines()
            if line.startswith(".venv/bin/crewletctl ")]


def _command(name: str) -> click.Command:
    """crewletctl's command *name* (its module is imported only when asked for)."""
    return ctl.cli.get_command(click.Context(ctl.cli), name)


def test_every_crewletctl_command_is_in_the_table_and_every_one_named_exists():
    commands = set(ctl.cli.list_commands(click.Context(ctl.cli)))
    rows = _commands_table()
    assert set(rows) == commands, f"table rows {sorted(rows)} != commands {sorted(commands)}"
    named = set(re.findall(r"(?:`|bin/)crewletctl ([a-z][a-z-]*)", _readme()))
    assert named <= commands, f"the README names commands that do not exist: {named - commands}"


def test_the_options_the_readme_gives_exist():
    common = {o for p in ctl.cli.params for o in p.opts}  # crewletctl's own: --config, --data-dir
    for name, row in _commands_table().items():
        given = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", row))
        missing = given - _options(_command(name)) - common
        assert not missing, f"crewletctl {name}: the README gives {missing}, which it does not take"
    for args in _quick_start_calls():
        command = _command(args[0])
        missing = {a for a in args[1:] if a.startswith("--")} - _options(command) - common
        assert not missing, f"quick start: crewletctl {' '.join(args)}: no {missing}"


# ------------------------------------------------------------------ the sample company

def test_quick_start_mail_meets_a_rule_of_the_sample_company():
    """Each `send SEAT TEXT` goes to a seat of etc/company.yaml whose scripted
    provider has a rule for TEXT other than the catch-all, calling tools the seat has."""
    company = load_company(os.path.join(ROOT, "etc", "company.yaml"))
    seats = {seat.name: seat for seat in company.seats}
    sends = [args for args in _quick_start_calls() if args[0] == "send"]
    assert any("task" in args[2] for args in sends) and any("page" in args[2] for args in sends)
    for _, name, text, *_ in sends:
        assert name in seats, f"quick start mails {name}, not a seat of the sample company"
        seat = seats[name]
        rule = next(r for r in company.providers[seat.provider].rules if re.search(r.match, text))
        assert rule.match != ".*", f"{text!r} meets only the catch-all rule"
        servers = {f"{m.name}__" for m in seat.mcp}
        for tool in rule.tools:
            known = (tool.name == "send" or tool.name in ESTATE_TOOL_NAMES
                     or tool.name.startswith(tuple(servers)))
            assert known, f"{text!r}: the rule calls {tool.name}, which {name} does not have"


# ------------------------------------------------------------------ the estate

def test_every_estate_seat_tool_is_named():
    readme = _readme()
    missing = [name for name in ESTATE_TOOL_NAMES if f"`{name}`" not in readme]
    assert not missing, f"the README does not name the seat tools {missing}"


def test_out_of_service_reasons_are_the_appliers():
    readme = _readme()
    reasons = (view.STOPPED, "node evicted: <reason>", applier.rows_below(1, 3),
               applier.log_made_anew(1, "x", "y"), applier.ahead_of_log(3, 1))
    for reason in (r.split(" (")[0] for r in reasons):  # the words, not the numbers
        assert f"`{reason}" in readme, f"the README's out-of-service table lacks {reason!r}"


# ------------------------------------------------------------------ benchmarks

def test_every_benchmark_is_listed_and_every_one_listed_exists():
    listed = set(re.findall(r"^python (bench/[a-z_]+\.py)", _readme(), re.M))
    present = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "bench", "*.py"))}
    assert listed <= present, f"the README lists benchmarks that do not exist: {listed - present}"
    assert present - {"bench/common.py"} <= listed, f"benchmarks the README does not list: {present - listed}"
