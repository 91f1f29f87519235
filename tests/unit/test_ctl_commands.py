"""crewletctl's argument checks: a bad command line is a usage error (exit 2)
before any node is asked.

No node runs and nothing is faked: the data dir has no control socket, so a
command that went as far as asking would exit 69 instead (the last test
shows that it does).
"""

import pytest
from click.testing import CliRunner

import crewlet.ctl as ctl


def run(tmp_path, *args, input=None):
    return CliRunner().invoke(ctl.cli, ["--data-dir", str(tmp_path), *args], input=input)


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


@pytest.mark.parametrize("args", [
    ["send", "alice", "hi"], ["send", "alice", "hi", "--wait", "1"], ["seats"], ["dlq"], ["dlq", "bob"],
    ["dlq", "list"], ["dlq", "requeue", "4"],
])
def test_good_command_lines_go_on_to_ask_the_node(tmp_path, args):
    result = run(tmp_path, *args)
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
])
def test_estate_usage_errors_exit_2_without_asking_a_node(tmp_path, args, says):
    result = run(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert says in result.stderr
    assert "no crewlet node reachable" not in result.stderr


def test_estate_help_needs_no_node(tmp_path):
    for name in ("tasks", "pages", "search", "evict"):
        result = run(tmp_path, name, "--help")
        assert result.exit_code == 0 and "Usage: " in result.stdout, name
    assert "--undo" in run(tmp_path, "evict", "-h").stdout
    listed = run(tmp_path, "--help").stdout
    assert all(f"  {name} " in listed for name in ("tasks", "pages", "search", "evict"))


@pytest.mark.parametrize("args", [
    ["tasks"], ["tasks", "T12"], ["tasks", "12", "--json"], ["tasks", "--status", "open", "--assignee", "cto"],
    ["pages"], ["pages", "eng/runbook"], ["pages", "--prefix", "eng/", "--json"], ["search", "deploy"],
    ["search", "deploy", "--limit", "3", "--json"], ["evict", "n2"], ["evict", "n2", "--reason", "disk"],
    ["evict", "n2", "--undo"],
])
def test_good_estate_command_lines_go_on_to_ask_the_node(tmp_path, args):
    result = run(tmp_path, *args)
    assert result.exit_code == 69 and "no crewlet node reachable" in result.stderr
