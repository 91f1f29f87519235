"""The vault's keys, sealing and records (crewlet.vault.keys, crewlet.vault.store)."""

from __future__ import annotations

import json
import os

import pytest

from crewlet import credentials, hooks
from crewlet.company.model import Integration
from crewlet.config import NodeConfig
from crewlet.vault import keys as vault_keys
from crewlet.vault.keys import Keys, Unsealable
from crewlet.vault.store import BadRecord, BadSecret, Record, check_grace, check_name, check_value, named_by, parse

FLEET, NEXT = "f" * 43, "n" * 43


def test_nodes_holding_the_same_fleet_secret_open_each_others_secrets():
    a, b = Keys([FLEET]), Keys([FLEET])
    sealed = a.seal("openai", 3, "sk-the-key")
    assert b.open("openai", 3, sealed) == "sk-the-key"
    assert sealed["key"] == a.sealing_id == b.sealing_id
    assert "sk-the-key" not in json.dumps(sealed)
    # A fresh nonce each time: the same value twice is two boxes.
    assert a.seal("openai", 3, "sk-the-key")["box"] != sealed["box"]
    with pytest.raises(Unsealable, match="does not hold"):
        Keys([NEXT]).open("openai", 3, sealed)


def test_a_box_opens_only_for_its_own_name_and_version():
    k = Keys([FLEET])
    sealed = k.seal("openai", 3, "sk-the-key")
    for name, version in (("anthropic", 3), ("openai", 2)):
        with pytest.raises(Unsealable, match="not sealed for this name and version"):
            k.open(name, version, sealed)
    tampered = {**sealed, "box": sealed["box"][:-4] + ("AAAA" if not sealed["box"].endswith("AAAA") else "BBBB")}
    with pytest.raises(Unsealable):
        k.open("openai", 3, tampered)
    with pytest.raises(Unsealable):
        k.open("openai", 3, {**sealed, "nonce": "not base64!"})


def test_mid_rotation_the_new_line_seals_and_both_open():
    old = Keys([FLEET]).seal("hook", 1, "old-value")
    both = Keys([NEXT, FLEET])
    assert both.sealing_id == Keys([NEXT]).sealing_id
    assert both.open("hook", 1, old) == "old-value"
    assert both.holds(old["key"]) and not Keys([NEXT]).holds(old["key"])


def test_a_node_s_key_comes_from_key_file_then_fleet_secret_then_its_own(tmp_path):
    def secret_file(name: str, lines: list[str]) -> str:
        path = str(tmp_path / name)
        credentials.write_fleet_secrets(path, lines)
        return path

    run = tmp_path / "data" / "run"
    run.mkdir(parents=True)
    alone = NodeConfig(data_dir=str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError):
        Keys.of(alone)
    vault_keys.ensure_own(alone)
    assert os.stat(vault_keys.own_path(alone.run_dir)).st_mode & 0o777 == 0o600
    own = Keys.of(alone)
    vault_keys.ensure_own(alone)  # kept once made
    assert Keys.of(alone).sealing_id == own.sealing_id

    fleet = NodeConfig.model_validate({"data_dir": str(tmp_path / "data"),
                                       "stream": {"fleet_credentials": secret_file("fleet", [FLEET])}})
    assert Keys.of(fleet).sealing_id == Keys([FLEET]).sealing_id
    # crewletd's own_too: the run dir's key opens too (a single node become a fleet re-seals).
    assert Keys.of(fleet, own_too=True).holds(own.sealing_id) and not Keys.of(fleet).holds(own.sealing_id)
    keyed = NodeConfig.model_validate({"data_dir": str(tmp_path / "data"),
                                       "stream": {"fleet_credentials": secret_file("fleet", [FLEET])},
                                       "secrets": {"key_file": secret_file("vault", [NEXT])}})
    assert Keys.of(keyed).sealing_id == Keys([NEXT]).sealing_id
    # A fleet node makes no key of its own.
    other = tmp_path / "other" / "run"
    other.mkdir(parents=True)
    fleet2 = NodeConfig.model_validate({"data_dir": str(tmp_path / "other"),
                                        "stream": {"fleet_credentials": secret_file("fleet", [FLEET])}})
    vault_keys.ensure_own(fleet2)
    assert not os.path.exists(vault_keys.own_path(fleet2.run_dir))


def test_records_are_checked_before_they_are_used():
    k = Keys([FLEET])
    record = Record("openai", 2, "crewletctl@a", 1.0, k.seal("openai", 2, "v2"),
                    {"version": 1, "sealed": k.seal("openai", 1, "v1"), "until": 9e9})
    assert parse("openai", record.to_bytes()) == record
    shown = record.listing(k)
    assert shown["readable"] is True and shown["previous_until"] == 9e9
    assert "v2" not in json.dumps(shown) and "box" not in json.dumps(shown)
    raw = json.loads(record.to_bytes())
    bad = [b"not json", json.dumps({**raw, "name": "other"}).encode(),
           json.dumps({**raw, "version": 0}).encode(), json.dumps({**raw, "version": True}).encode(),
           json.dumps({**raw, "sealed": {"key": "k"}}).encode(),
           json.dumps({**raw, "previous": {**raw["previous"], "version": 2}}).encode(),
           json.dumps({k_: v for k_, v in raw.items() if k_ != "by"}).encode()]
    for data in bad:
        with pytest.raises(BadRecord):
            parse("openai", data)


def test_names_values_and_graces_are_refused_with_a_reason():
    assert check_name("gh-hook_2") == "gh-hook_2"
    for name in ("", "9x", "a.b", "a b", "x" * 65, None):
        with pytest.raises(BadSecret, match="bad secret name"):
            check_name(name)
    for value, why in (("", "empty"), ("a\0b", "NUL"), ("x" * (64 * 1024 + 1), "at most"), (3, "text")):
        with pytest.raises(BadSecret, match=why):
            check_value(value)
    assert check_grace(None) == 3600 and check_grace(0) == 0
    for grace in (-1, 8 * 86400, True, "1h"):
        with pytest.raises(BadSecret, match="grace"):
            check_grace(grace)


def test_the_company_s_secret_names_are_found_with_the_keys_naming_them():
    company = {"providers": {"a": {"kind": "openai", "api_key_secret": "llm"},
                             "b": {"kind": "anthropic", "api_key_secret": "llm"},
                             "c": {"kind": "openai", "api_key_env": "X"}},
               "integrations": {"gh": {"kind": "github", "secret": "hook"}}}
    assert named_by(company) == {"llm": ["providers.a.api_key_secret", "providers.b.api_key_secret"],
                                 "hook": ["integrations.gh.secret"]}
    assert named_by(None) == {}


def test_a_delivery_is_taken_when_any_version_in_force_signed_it():
    spec = Integration(kind="github", secret="hook", routes=[{"seat": "w"}])
    body = b'{"action": "opened"}'
    headers = {**hooks.sign("github", b"old-secret", body), "X-GitHub-Delivery": "d1", "X-GitHub-Event": "issues"}
    for secrets in ([b"new-secret", b"old-secret"], [b"old-secret"], b"old-secret"):
        assert hooks.receive("gh", spec, headers, body, secret=secrets, now=0).id == "d1"
    with pytest.raises(hooks.Refused) as refused:
        hooks.receive("gh", spec, headers, body, secret=[b"new-secret"], now=0)
    assert refused.value.code == "bad_signature"
    with pytest.raises(hooks.Refused) as refused:
        hooks.receive("gh", spec, headers, body, secret=[], now=0)
    assert refused.value.code == "no_secret" and "hook" in refused.value.detail


def test_a_delivery_from_a_known_sender_says_who_they_are():
    spec = Integration(kind="github", secret="hook", routes=[{"seat": "w"}])
    body = b'{"action": "opened", "sender": {"login": "Alice-GH"}, "repository": {"full_name": "acme/web"}}'
    headers = {**hooks.sign("github", b"s", body), "X-GitHub-Delivery": "d2", "X-GitHub-Event": "issues"}
    asked = []

    def known_as(system, ident):
        asked.append((system, ident))
        return ("alice", "Alice Doe <alice@example.com>") if ident == "Alice-GH" else None
    d = hooks.receive("gh", spec, headers, body, secret=b"s", now=0, known_as=known_as)
    assert asked == [("github", "Alice-GH")] and d.person == "alice"
    assert d.text.splitlines()[0].startswith(
        "github issues opened on acme/web by Alice-GH, who is Alice Doe <alice@example.com> (delivery d2")
    assert hooks.receive("gh", spec, headers, body, secret=b"s", now=0).person is None
