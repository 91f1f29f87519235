"""crewletctl's argument checks: a bad command line is a usage error (exit 2)
before any node is asked.

No node runs. A usage error is told before anything is asked: the data dir
has no control socket, so a command that went as far as asking would exit
69 instead. A good command line is held against a real control socket in
its place (:class:`ControlSocket`), which keeps what it was asked and
refuses it: the command asked exactly that, once.
"""

import os
import subprocess
import sys
import threading

import click
import pytest
import zmq
from click.testing import CliRunner

import crewlet.ctl as ctl
from crewlet import ipc

REFUSAL = "refused by the test's control socket"


def run(tmp_path, *args, input=None):
    return CliRunner().invoke(ctl.cli, ["--data-dir", str(tmp_path), *args], input=input)


class ControlSocket(threading.Thread):
    """A real control socket where crewletd's would be, keeping what each
    request asked (op and args) and refusing it: a command that got this far
    exits 1 with the refusal, having asked exactly what it asked."""

    def __init__(self, data_dir):
        super().__init__(daemon=True)
        run_dir = os.path.join(str(data_dir), "run")
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ipc.endpoint(run_dir, "control"))
        self.asked: list[tuple[str, dict]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if not self.sock.poll(50):
                continue
            *envelope, payload = self.sock.recv_multipart()
            req = ipc.unpack(payload)
            self.asked.append((req["op"], req.get("args") or {}))
            self.sock.send_multipart([*envelope, ipc.pack({"id": req.get("id"), "ok": False, "error": REFUSAL})])

    def close(self) -> None:
        self.done.set()
        self.join(2)
        self.sock.close()


@pytest.fixture
def control(tmp_path):
    listener = ControlSocket(tmp_path)
    listener.start()
    yield listener
    listener.close()


def asked_only(control, result, op: str, **args) -> None:
    """The command asked crewletd once, *op* with (at least) *args*, and said its refusal."""
    assert result.exit_code == 1 and REFUSAL in result.stderr, (result.exit_code, result.output)
    [(got, given)] = control.asked
    assert got == op and {k: given.get(k) for k in args} == args, (got, given)


@pytest.mark.parametrize("args, input, says", [
    (["send"], None, "Missing argument 'SEAT'"),
    (["send", "alice"], None, "Missing argument 'TEXT'"),
    (["send", "alice", "   "], None, "the text is empty"),
    (["send", "alice", "-"], "\n\n", "the text is empty"),
    (["send", "alice", "hi", "--wait", "0"], None, "'--wait'"),
    (["send", "alice", "hi", "--wait", "-3"], None, "'--wait'"),
    (["send", "alice", "hi", "--wait", "soon"], None, "'--wait'"),
    (["send", "alice", "hi", "extra"], None, "unexpected extra argument"),
    (["seats", "--json", "--watch"], None, "cannot be combined"),
    (["seats", "alice"], None, "unexpected extra argument"),
    (["dlq", "requeue"], None, "Missing argument 'SEQ'"),
    (["dlq", "requeue", "abc"], None, "'abc' is not a valid integer"),
    (["dlq", "requeue", "0"], None, "Invalid value for 'SEQ'"),
    (["dlq", "requeue", "4", "5"], None, "unexpected extra argument"),
    (["dlq", "--limit", "0"], None, "Invalid value for '--limit'"),
    (["dlq", "bob", "carol"], None, "unexpected extra argument"),
    (["dlq", "--nope"], None, "No such option"),
])
def test_usage_errors_exit_2_without_asking_a_node(tmp_path, args, input, says):
    result = run(tmp_path, *args, input=input)
    assert result.exit_code == 2, result.output
    assert says in result.stderr
    assert "no crewlet node reachable" not in result.stderr


def test_help_needs_no_node(tmp_path):
    for args in (["send", "--help"], ["seats", "-h"], ["dlq", "--help"], ["dlq", "list", "-h"],
                 ["dlq", "requeue", "--help"]):
        result = run(tmp_path, *args)
        assert result.exit_code == 0 and "Usage: " in result.stdout, args
    assert "requeue SEQ" in run(tmp_path, "dlq", "-h").stdout
    listed = run(tmp_path, "--help").stdout
    assert all(f"  {name} " in listed for name in ("send", "seats", "dlq"))


@pytest.mark.parametrize("args, op, asked", [
    (["send", "alice", "hi"], "send", {"seat": "alice", "text": "hi", "wait": None}),
    (["send", "alice", "hi", "--wait", "1"], "send", {"seat": "alice", "text": "hi", "wait": 1.0}),
    (["seats"], "seats", {}),
    (["dlq"], "dlq", {"seat": None}), (["dlq", "bob"], "dlq", {"seat": "bob"}),
    (["dlq", "list"], "dlq", {"seat": None}), (["dlq", "requeue", "4"], "dlq", {"requeue": 4}),
])
def test_good_command_lines_go_on_to_ask_the_node(tmp_path, control, args, op, asked):
    asked_only(control, run(tmp_path, *args), op, **asked)


def test_every_command_is_its_module_and_help_lists_its_own_summary():
    """``--help`` lists each command from ctl.COMMANDS without importing it:
    each summary shortens, at any width, as the command's own help does."""
    ctx = click.Context(ctl.cli)
    modules = sorted(f[:-3].replace("_", "-") for f in os.listdir(os.path.dirname(ctl.__file__))
                     if f.endswith(".py") and f not in ("__init__.py", "render.py", "plain.py"))
    assert ctl.cli.list_commands(ctx) == modules
    for name in modules:
        command = ctl.cli.get_command(ctx, name)
        assert command.name == name
        for limit in (20, 45, 70, 1000):
            summary = click.Command(name, help=ctl.COMMANDS[name]).get_short_help_str(limit)
            assert summary == command.get_short_help_str(limit), (name, limit)


def test_exit_config_is_the_config_errors_code():
    from crewlet.config import ConfigError  # crewlet.ctl does not import it: it says 78 itself

    assert ctl.EXIT_CONFIG == ConfigError.EXIT_CODE


LOADED = ("import sys; from crewlet.ctl import main; sys.argv[0] = 'crewletctl'\n"
          "try: main()\nexcept SystemExit: pass\n"
          "print(sorted(m for m in sys.modules if m.startswith(('crewlet.ctl.', 'rich', 'nats', 'pydantic'))))")


@pytest.mark.parametrize("args, loaded", [
    (["--help"], []),
    (["status", "--json"], ["crewlet.ctl.plain", "crewlet.ctl.status"]),
    (["send", "alice", "hi"], ["crewlet.ctl.plain", "crewlet.ctl.send"]),
    (["seats", "--json"], ["crewlet.ctl.plain", "crewlet.ctl.seats", "crewlet.ctl.status"]),
])
def test_a_call_imports_its_own_command_only(tmp_path, args, loaded):
    """Neither the other commands' modules nor rich, nats or pydantic: a
    call of crewletctl costs its own imports (the tests make hundreds)."""
    out = subprocess.run([sys.executable, "-c", LOADED, "--data-dir", str(tmp_path), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines()[-1] == repr(loaded), out.stdout + out.stderr


def test_with_no_node_a_good_command_line_exits_69(tmp_path):
    result = run(tmp_path, "seats")
    assert result.exit_code == 69 and "no crewlet node reachable" in result.stderr


# ------------------------------------------------------------------ the estate: tasks, pages, search, evict

@pytest.mark.parametrize("args, says", [
    (["tasks", "abc"], "'abc' is not a task id (like T12)"),
    (["tasks", "T1x"], "is not a task id"),
    (["tasks", "T1", "T2"], "unexpected extra argument"),
    (["tasks", "T1", "--status", "open"], "cannot be combined"),
    (["tasks", "T1", "--limit", "5"], "cannot be combined"),
    (["tasks", "--status", "closed"], "Invalid value for '--status'"),
    (["tasks", "--limit", "0"], "Invalid value for '--limit'"),
    (["tasks", "--limit", "501"], "Invalid value for '--limit'"),
    (["pages", "a", "b"], "unexpected extra argument"),
    (["pages", "eng/x", "--prefix", "eng/"], "cannot be combined"),
    (["pages", "--limit", "x"], "Invalid value for '--limit'"),
    (["search"], "Missing argument 'QUERY'"),
    (["search", "  "], "the query is empty"),
    (["search", "a", "b"], "unexpected extra argument"),
    (["search", "a", "--limit", "101"], "Invalid value for '--limit'"),
    (["evict"], "Missing argument 'NODE'"),
    (["evict", "n1", "n2"], "unexpected extra argument"),
    (["evict", "n1", "--undo", "--reason", "x"], "cannot be combined"),
    (["evict", "n1", "--reason", " "], "the reason is empty"),
    (["evict", "n1", "--reason"], "requires an argument"),
    (["skills", "show"], "Missing argument 'NAME'"),
    (["skills", "--as-of", "0"], "Invalid value for '--as-of'"),
    (["skills", "show", "x", "--as-of", "soon"], "Invalid value for '--as-of'"),
    (["skills", "revisions"], "Missing argument 'NAME'"),
    (["skills", "push"], "Missing argument 'DIR...'"),
    (["skills", "drafts", "--status", "nope"], "Invalid value for '--status'"),
    (["skills", "drafts", "x", "--status", "pending"], "cannot be combined"),
    (["skills", "promote"], "Missing argument 'NAME'"),
    (["skills", "reject", "a", "b"], "unexpected extra argument"),
])
def test_estate_usage_errors_exit_2_without_asking_a_node(tmp_path, args, says):
    result = run(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert says in result.stderr
    assert "no crewlet node reachable" not in result.stderr


def test_estate_help_needs_no_node(tmp_path):
    for name in ("tasks", "pages", "search", "evict", "skills"):
        result = run(tmp_path, name, "--help")
        assert result.exit_code == 0 and "Usage: " in result.stdout, name
    assert "--undo" in run(tmp_path, "evict", "-h").stdout
    for sub in ("list", "show", "revisions", "push", "retire", "drafts", "promote", "reject"):
        result = run(tmp_path, "skills", sub, "--help")
        assert result.exit_code == 0 and "--json" in result.stdout, sub
    listed = run(tmp_path, "--help").stdout
    assert all(f"  {name} " in listed for name in ("tasks", "pages", "search", "evict", "skills"))


@pytest.mark.parametrize("args, op, asked", [
    (["tasks"], "estate_read", {"query": "task.list", "args": {"limit": 100}}),
    (["tasks", "T12"], "estate_read", {"query": "task.get", "args": {"id": "T12"}}),
    (["tasks", "12", "--json"], "estate_read", {"query": "task.get", "args": {"id": "T12"}}),
    (["tasks", "--status", "open", "--assignee", "cto"], "estate_read",
     {"query": "task.list", "args": {"limit": 100, "status": "open", "assignee": "cto"}}),
    (["pages"], "estate_read", {"query": "page.list"}),
    (["pages", "eng/runbook"], "estate_read", {"query": "page.read", "args": {"path": "eng/runbook"}}),
    (["pages", "--prefix", "eng/", "--json"], "estate_read",
     {"query": "page.list", "args": {"prefix": "eng/", "limit": 100}}),
    (["search", "deploy"], "estate_search", {"query": "deploy"}),
    (["search", "deploy", "--limit", "3", "--json"], "estate_search", {"query": "deploy", "limit": 3}),
    (["evict", "n2"], "evict", {"node": "n2", "undo": None}),
    (["evict", "n2", "--reason", "disk"], "evict", {"node": "n2", "reason": "disk"}),
    (["evict", "n2", "--undo"], "evict", {"node": "n2", "undo": True}),
    (["skills"], "estate_read", {"query": "skill.list", "args": {"limit": 100}}),
    (["skills", "--seat", "cto", "--as-of", "7", "--json"], "estate_read",
     {"query": "skill.list", "args": {"limit": 100, "seat": "cto", "as_of": 7}}),
    (["skills", "show", "pdf"], "estate_read", {"query": "skill.read", "args": {"name": "pdf"}}),
    (["skills", "show", "pdf", "scripts/x.py", "--as-of", "3"], "estate_read",
     {"query": "skill.read", "args": {"name": "pdf", "file": "scripts/x.py", "as_of": 3}}),
    (["skills", "revisions", "pdf"], "estate_read", {"query": "skill.revisions", "args": {"name": "pdf", "limit": 100}}),
    (["skills", "drafts", "--status", "pending"], "estate_read",
     {"query": "skill.drafts", "args": {"limit": 100, "status": "pending"}}),
    (["skills", "drafts", "pdf"], "estate_read", {"query": "skill.read", "args": {"name": "pdf", "draft": True}}),
    # Writes go through the node's API: crewletctl asks where it is first.
    (["skills", "retire", "pdf"], "status", {}),
    (["skills", "promote", "pdf", "--note", "ok"], "status", {}),
])
def test_good_estate_command_lines_go_on_to_ask_the_node(tmp_path, control, args, op, asked):
    asked_only(control, run(tmp_path, *args), op, **asked)


def test_a_skill_push_refused_here_asks_no_node(tmp_path):
    """Every skill pushed is checked first: each problem names the file and
    the field, and nothing is sent (no node is asked: exit 2, not 69)."""
    broken = tmp_path / "skills" / "broken"
    (broken / "scripts").mkdir(parents=True)
    (broken / "SKILL.md").write_text("---\nname: broken\ndescription: x\nmetadata: {version: 1.0}\n---\n")
    (broken / "scripts" / "tool.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00")
    (tmp_path / "empty").mkdir()
    result = run(tmp_path, "skills", "push", str(tmp_path / "skills"), str(tmp_path / "empty"))
    assert result.exit_code == 2, result.output
    assert f"{broken}/scripts/tool.bin: not UTF-8 text" in result.stderr, result.stderr
    assert f"{tmp_path / 'empty'}: holds no skill" in result.stderr, result.stderr
    assert "no crewlet node reachable" not in result.stderr
    broken.joinpath("scripts", "tool.bin").unlink()
    result = run(tmp_path, "skills", "push", str(broken), "--json")
    assert result.exit_code == 2 and "no crewlet node reachable" not in result.stderr, result.output
    assert '"field": "metadata.version"' in result.stdout and f"{broken}/SKILL.md" in result.stdout
