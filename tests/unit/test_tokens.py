"""API tokens (crewlet.tokens) and their Tier A keys (ingress.tokens, ingress.tokens_file)."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from crewlet import tokens
from crewlet.config import ConfigError, load_node_config


def test_a_token_is_checked_by_its_digest_and_scopes_imply_the_lesser_ones():
    made = tokens.new_token()
    assert made.startswith(tokens.PREFIX) and len(made) > 40
    ring = tokens.Keyring([tokens.Grant("ci", tokens.digest(made), tokens.implied(["write"]))])
    grant = ring.check(made)
    assert grant is not None and grant.name == "ci"
    assert grant.scopes == {"read", "write"}
    assert ring.check(made + "x") is None and ring.check("") is None
    assert tokens.implied(["admin"]) == set(tokens.SCOPES)
    assert tokens.implied([]) == frozenset()


@pytest.mark.parametrize("line, problem", [
    ("abc read ci", "sha256"),
    ("a" * 64 + " read", "got 2 fields"),
    ("a" * 64 + " read,root ci", "unknown scope 'root'"),
    ("a" * 64 + " read c i j", "got 5 fields"),
    ("a" * 64 + " read ci Alice", "bad person 'Alice'"),
    ("a" * 64 + " read " + "x" * 70, "bad token name"),
])
def test_a_bad_tokens_file_line_is_refused_naming_the_problem(line, problem):
    with pytest.raises(ValueError, match=problem):
        tokens.parse_line(line)


def test_a_tokens_file_skips_comments_and_blank_lines(tmp_path):
    path = tmp_path / "tokens"
    sha = tokens.digest("t")
    path.write_text(f"# team tokens\n\n{sha} read,write ci  # the CI\n")
    [grant] = tokens.read_file(str(path))
    assert (grant.name, grant.sha256, grant.scopes, grant.person) == ("ci", sha, {"read", "write"}, None)
    path.write_text(f"{sha} write alice-laptop alice\n")
    assert tokens.read_file(str(path))[0].person == "alice"


def test_the_first_start_admin_token_is_made_once_0600_and_kept(tmp_path):
    run = str(tmp_path)
    token, made = tokens.ensure_admin_token(run)
    assert made
    mode = stat.S_IMODE(os.stat(tokens.admin_token_path(run)).st_mode)
    assert mode == 0o600
    again, made_again = tokens.ensure_admin_token(run)
    assert (again, made_again) == (token, False)


def test_racing_starts_agree_on_one_admin_token(tmp_path):
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(tokens.ensure_admin_token(str(tmp_path))[0]))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


def _load(tmp_path, text: str):
    path = tmp_path / "crewlet.yaml"
    path.write_text(text)
    return load_node_config(str(path))


def test_configured_tokens_load_and_turn_off_the_first_start_token(tmp_path):
    sha = tokens.digest("secret")
    cfg = _load(tmp_path, f"ingress: {{tokens: [{{name: ci, sha256: {sha}, scopes: [read]}}]}}\n")
    assert cfg.ingress.configured_tokens and cfg.ingress.tokens[0].sha256 == sha
    (tmp_path / "tokens").write_text(f"{sha} admin ops\n")
    cfg = _load(tmp_path, "ingress: {tokens_file: tokens}\n")
    assert cfg.ingress.tokens_file == str(tmp_path / "tokens")  # relative to the config file
    assert not load_node_config(None).ingress.configured_tokens


@pytest.mark.parametrize("text, key, problem", [
    ("ingress: {tokens: [{name: ci, sha256: nothex, scopes: [read]}]}", "ingress.tokens[0].sha256",
     "never the token itself"),
    ("ingress: {tokens: [{name: ci, sha256: " + "a" * 64 + ", scopes: [root]}]}",
     "ingress.tokens[0].scopes[0]", "read"),
    ("ingress: {tokens: [{name: ci, sha256: " + "a" * 64 + ", scopes: []}]}", "ingress.tokens[0].scopes",
     "must not be empty"),
    ("ingress: {tokens_file: missing}", "ingress.tokens_file", "cannot read"),
    ("ingress: {cors_origins: ['example.com/x']}", "ingress.cors_origins", "origins like"),
    ("ingress: {max_body: 10}", "ingress.max_body", "1024"),
])
def test_bad_token_config_names_the_key(tmp_path, text, key, problem):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text + "\n")
    assert info.value.key == key and problem in info.value.problem
    assert info.value.EXIT_CODE == 78


def test_a_bad_tokens_file_line_is_a_config_error_naming_the_line(tmp_path):
    (tmp_path / "tokens").write_text("# ok\n" + "a" * 64 + " read,boss ci\n")
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, "ingress: {tokens_file: tokens}\n")
    assert info.value.key == "ingress.tokens_file"
    assert "line 2" in info.value.problem and "unknown scope 'boss'" in info.value.problem
