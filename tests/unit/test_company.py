"""Tier B, the company file: the sample, every check's key, the digest, expansion."""

from __future__ import annotations

import os

import pytest
import yaml

from crewlet.company import Company, load_company, parse_company
from crewlet.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "etc", "company.yaml")


def minimal(**overrides) -> dict:
    data = {
        "company": {"name": "Acme"},
        "providers": {"local": {"kind": "scripted", "rules": [{"match": "hello", "reply": "hi"}]}},
        "seats": [{"name": "pm", "persona": "plans", "provider": "local"},
                  {"name": "dev", "persona": "builds", "provider": "local"}],
    }
    data.update(overrides)
    return data


def parse(data: dict, env: dict | None = None) -> Company:
    return parse_company(yaml.safe_dump(data, sort_keys=False), "acme.yaml", env=env or {})


def error(data: dict, env: dict | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(data, env)
    err = info.value
    assert err.file == "acme.yaml"
    assert "\n" not in str(err)
    return err


def test_the_sample_company_loads_with_30_seats():
    company = load_company(SAMPLE)
    assert len(company.seats) == 30
    assert set(company.providers) == {"scripted"}
    assert {s.provider for s in company.seats} == {"scripted"}
    # Placement is shown commented out, so the sample runs whole on one node.
    assert all(s.placement.labels == {} for s in company.seats)
    assert len(company.schedules) == 1
    assert company.budgets.org and company.budgets.org > 0
    rules = company.providers["scripted"].rules
    assert rules[0].match.startswith("^Summarise") and rules[1].match.startswith("^Draft a skill")  # learning
    rule = rules[3]
    assert rule.match == r"(?i)\bask ([a-z0-9_-]+) (?:to )?(.+)"
    assert rule.tools[0].name == "send" and rule.tools[0].args == {"seat": r"\1", "text": r"\2"}
    # The ceo's own MCP server, shipped with crewlet as a console script.
    assert [(m.name, m.command) for m in company.seat("ceo").mcp] == [("desk", "crewlet-demo-mcp")]
    assert Company.model_validate(company.model_dump(mode="json")) == company  # as stored in a revision


def test_minimal_company_gets_the_defaults():
    company = parse(minimal())
    assert company.retention.turns_days == 90 and company.retention.mail_days == 14
    assert company.budgets.org is None and company.budgets.seats == {}
    assert company.schedules == [] and company.integrations == {}
    assert company.seat("pm").placement.allows({"zone": "us"})
    learning = company.learning
    assert (learning.every, learning.compact_after, learning.min_cluster, learning.auto_promote,
            learning.provider, learning.max_drafts_per_pass) == (600, 7 * 86400, 3, False, None, 5)


def test_the_learning_section():
    learning = parse(minimal(learning={"every": 60, "compact_after": 3600, "min_cluster": 5,
                                       "auto_promote": True, "provider": "local",
                                       "max_drafts_per_pass": 0})).learning
    assert (learning.every, learning.min_cluster, learning.provider, learning.max_drafts_per_pass) == \
        (60, 5, "local", 0)
    for key, bad in (("every", 0), ("compact_after", 0), ("min_cluster", 1), ("max_drafts_per_pass", -1),
                     ("max_drafts_per_pass", 101)):
        assert error(minimal(learning={key: bad})).key == f"learning.{key}"
    assert error(minimal(learning={"promote": True})).key == "learning.promote"


@pytest.mark.parametrize("mutate, key, words", [
    (lambda d: d["seats"][1].update(provider="gpt"), "seats[1].provider",
     "unknown provider 'gpt', known: local"),
    (lambda d: d.update(schedules=[{"name": "s", "seat": "ghost", "every": "1h", "message": "m"}]),
     "schedules[0].seat", "unknown seat 'ghost'"),
    (lambda d: d.update(budgets={"org": 10, "seats": {"pm": 5, "ghost": 1}}),
     "budgets.seats.ghost", "unknown seat 'ghost'"),
    (lambda d: d.update(integrations={"gh": {"kind": "github", "secret_env": "GH_SECRET", "routes": [
        {"seat": "pm"}, {"event": "push", "seat": "ghost"}]}}),
     "integrations.gh.routes[1].seat", "unknown seat 'ghost'"),
    (lambda d: d.update(learning={"provider": "gpt"}), "learning.provider",
     "unknown provider 'gpt', known: local"),
])
def test_each_cross_reference_error_names_its_key(mutate, key, words):
    data = minimal()
    mutate(data)
    err = error(data)
    assert err.key == key
    assert str(err) == f"acme.yaml: {key}: {words}"


def test_unknown_key_is_an_error_at_that_key():
    data = minimal()
    data["seats"][0]["persona_text"] = "typo"
    assert str(error(data)) == "acme.yaml: seats[0].persona_text: unknown key"
    assert error(minimal(retentoin={})).key == "retentoin"
    data = minimal()
    data["providers"]["local"]["temperature"] = 0.2
    assert error(data).key == "providers.local.temperature"


def test_duplicate_seat_name():
    data = minimal()
    data["seats"].append({"name": "pm", "persona": "again", "provider": "local"})
    err = error(data)
    assert err.key == "seats[2].name"
    assert "duplicate name 'pm' (also seats[0].name)" in err.problem


def test_duplicate_mcp_server_name_within_a_seat():
    data = minimal()
    data["seats"][1]["mcp"] = [{"name": "git", "command": "git-mcp"}, {"name": "git", "command": "other"}]
    assert error(data).key == "seats[1].mcp[1].name"


def test_bad_seat_name():
    data = minimal()
    data["seats"][0]["name"] = "Project Manager"
    err = error(data)
    assert err.key == "seats[0].name"


def test_bad_regex():
    data = minimal()
    data["providers"]["local"]["rules"].append({"match": "ask (\\w+", "reply": "x"})
    err = error(data)
    assert err.key == "providers.local.rules[1].match"
    assert "not a valid regular expression" in err.problem


def test_schedule_with_both_every_and_cron_or_neither():
    both = minimal(schedules=[{"name": "s", "seat": "pm", "every": "5m", "cron": "0 9 * * *",
                               "message": "m"}])
    err = error(both)
    assert err.key == "schedules[0].cron" and "not both" in err.problem
    neither = minimal(schedules=[{"name": "s", "seat": "pm", "message": "m"}])
    assert error(neither).key == "schedules[0].cron"
    bad = minimal(schedules=[{"name": "s", "seat": "pm", "every": "5 minutes", "message": "m"}])
    assert error(bad).key == "schedules[0].every"
    ok = parse(minimal(schedules=[{"name": "s", "seat": "pm", "every": "5m", "message": "m"},
                                  {"name": "t", "seat": "dev", "cron": "*/15 9-17 * * 1-5", "message": "m"}]))
    assert ok.schedules[0].period == 300 and ok.schedules[1].period is None
    dup = minimal(schedules=[{"name": "s", "seat": "pm", "every": "1d", "message": "m"}] * 2)
    assert error(dup).key == "schedules[1].name"


def test_provider_keys_follow_the_kind():
    cli = minimal(providers={"agent": {"kind": "cli"}})
    assert str(error(cli)).startswith("acme.yaml: providers.agent.command: required for kind cli")
    wrong = minimal(providers={"local": {"kind": "scripted", "base_url": "https://x.example"}})
    assert error(wrong).key == "providers.local.base_url"
    url = minimal(providers={"local": {"kind": "openai", "base_url": "ftp://x"}})
    assert error(url).key == "providers.local.base_url"
    env = minimal(providers={"local": {"kind": "anthropic", "api_key_env": "sk-ant-123"}})
    assert error(env).key == "providers.local.api_key_env"
    ok = parse(minimal(providers={"local": {"kind": "cli", "command": ["claude", "-p"],
                                            "max_concurrent": 2}}))
    assert ok.providers["local"].max_concurrent == 2


@pytest.mark.parametrize("spec, problem", [
    ({"kind": "openai", "api_key_secret": "openai", "api_key_env": "OPENAI_API_KEY"},
     "give api_key_env or api_key_secret, not both"),
    ({"kind": "cli", "command": ["claude", "-p"], "api_key_secret": "anthropic"},
     "with kind cli, give api_key_env too"),
    ({"kind": "scripted", "api_key_secret": "x"}, "only for kind openai, anthropic or cli"),
    ({"kind": "openai", "api_key_secret": "sk-proj-abc.def"}, "must be a secret's name"),
])
def test_a_provider_names_its_key_as_a_fleet_secret_or_an_environment_variable(spec, problem):
    err = error(minimal(providers={"local": spec}))
    assert err.key == "providers.local.api_key_secret" and err.problem.startswith(problem), err
    ok = parse(minimal(providers={"local": {"kind": "anthropic", "api_key_secret": "anthropic"},
                                  "c": {"kind": "cli", "command": ["claude", "-p"],
                                        "api_key_secret": "anthropic", "api_key_env": "ANTHROPIC_API_KEY"}}))
    assert ok.providers["local"].api_key_secret == ok.providers["c"].api_key_secret == "anthropic"


def test_missing_and_empty_sections():
    assert error({"providers": minimal()["providers"], "seats": minimal()["seats"]}).key == "company"
    assert error(minimal(seats=[])).key == "seats"
    assert error(minimal(providers={})).key == "providers"
    with pytest.raises(ConfigError) as info:
        parse_company("- a list\n", "acme.yaml")
    assert "top level must be a mapping" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_company("company: {name: a}\ncompany: {name: b}\n", "acme.yaml")
    assert "duplicate key 'company'" in str(info.value)


def test_digest_is_stable_across_key_order_and_omitted_defaults():
    a = minimal()
    b = {"seats": [dict(reversed(list(s.items()))) for s in a["seats"]],
         "providers": a["providers"], "company": a["company"],
         "retention": {"mail_days": 14, "turns_days": 90}}
    assert yaml.safe_dump(a, sort_keys=False) != yaml.safe_dump(b, sort_keys=False)
    digest = parse(a).digest()
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert parse(b).digest() == digest
    assert parse(minimal(company={"name": "Other"})).digest() != digest
    # A revision round-trips: the stored dump rebuilds the same company.
    company = parse(a)
    assert Company.model_validate(company.model_dump(mode="json")).digest() == digest


def test_env_expansion():
    data = minimal(company={"name": "${COMPANY}"})
    data["seats"][0]["persona"] = "${PERSONA:-a planner}"
    company = parse(data, env={"COMPANY": "Initech"})
    assert company.company.name == "Initech"
    assert company.seat("pm").persona == "a planner"
    err = error(data, env={})
    assert err.key == "company.name" and "COMPANY" in err.problem


def test_load_company_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_company(missing)
    assert str(info.value) == f"{missing}: no such file"
    bad = tmp_path / "bad.yaml"
    bad.write_text("company: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_company(bad)
    assert str(info.value).startswith(f"{bad}: invalid YAML at line")


def test_cli_max_concurrent_defaults_to_4_and_belongs_to_cli_only():
    cli = parse(minimal(providers={"local": {"kind": "cli", "command": ["agent"]}}))
    assert cli.providers["local"].max_concurrent == 4
    assert parse(minimal()).providers["local"].max_concurrent is None
    wrong = minimal(providers={"local": {"kind": "openai", "max_concurrent": 3}})
    assert error(wrong).key == "providers.local.max_concurrent"


def github_integration(**overrides) -> dict:
    data = {"kind": "github", "secret_env": "GH_SECRET",
            "routes": [{"event": "issues", "repository": "acme/web", "seat": "pm"}, {"seat": "dev"}]}
    data.update(overrides)
    return data


@pytest.mark.parametrize("integration, key, words", [
    (github_integration(signature_header="X-Sig"), "integrations.gh.signature_header",
     "only for kind generic, not github"),
    (github_integration(delivery_header="X-Id"), "integrations.gh.delivery_header",
     "only for kind generic, not github"),
    (github_integration(event_header="X-Kind"), "integrations.gh.event_header",
     "only for kind generic, not github"),
    ({"kind": "github", "routes": [{"seat": "pm"}]}, "integrations.gh.secret_env", "give secret (a fleet secret's name) or secret_env"),
    (github_integration(secret_env="ghp-not-a-name!"), "integrations.gh.secret_env",
     "must be the name of an environment variable"),
    (github_integration(routes=[]), "integrations.gh.routes", "must not be empty"),
    (github_integration(secret="gh-hook"), "integrations.gh.secret_env", "give secret (a fleet secret's name)"),
    ({"kind": "github", "secret": "gh.hook", "routes": [{"seat": "pm"}]}, "integrations.gh.secret",
     "must be a secret's name"),
    (github_integration(routes=[{"seat": "pm", "repo": "acme/web"}]), "integrations.gh.routes[0].repo",
     "unknown key"),
    (github_integration(kind="gitlab"), "integrations.gh.kind", "must be one of github, slack, generic"),
    (github_integration(kind="generic", signature_header="X Sig"), "integrations.gh.signature_header",
     "must be an HTTP header name"),
])
def test_integration_errors_name_their_key(integration, key, words):
    err = error(minimal(integrations={"gh": integration}))
    assert err.key == key
    assert str(err).startswith(f"acme.yaml: {key}: {words}")


def test_bad_integration_name():
    # Lower case only, unlike a provider's: it is a URL part, /v1/hooks/<name>.
    err = error(minimal(integrations={"GitHub": github_integration()}))
    assert err.key == "integrations.GitHub" and err.problem.startswith("must be 1-63 of a-z")
    assert error(minimal(integrations={"gh/v2": github_integration()})).key == "integrations.gh/v2"


def test_integrations_get_their_defaults_and_round_trip():
    company = parse(minimal(integrations={
        "gh": github_integration(),
        "slack": {"kind": "slack", "secret_env": "SLACK_SECRET",
                  "routes": [{"channel": "C1", "seat": "dev"}]},
        "alerts": {"kind": "generic", "secret_env": "ALERTS_SECRET", "delivery_header": "X-Request-Id",
                   "routes": [{"event": "firing", "seat": "dev"}]}}))
    gh, alerts = company.integrations["gh"], company.integrations["alerts"]
    assert gh.signature_header is gh.delivery_header is gh.event_header is None
    assert (alerts.signature_header, alerts.delivery_header, alerts.event_header) == (
        "X-Signature-256", "X-Request-Id", "X-Event-Type")
    assert gh.routes[0].matches({"event": "issues", "repository": "acme/web", "action": "opened"})
    assert not gh.routes[0].matches({"event": "issues", "repository": "acme/api"})
    assert gh.routes[1].matches({})
    assert Company.model_validate(company.model_dump(mode="json")) == company  # as stored in a revision


def test_people_are_one_per_id_elsewhere_and_may_decide_only_for_seats_there_are():
    alice = {"name": "Alice", "email": "alice@example.com", "identities": {"github": "Alice-GH"},
             "decides": {"approvals": ["pm", "d*"]}}
    ok = parse(minimal(people={"alice": alice, "bob": {"name": "Bob", "identities": {"github": "bob"}}}))
    assert ok.person_known_as("github", "alice-gh") == ("alice", "Alice <alice@example.com>")
    assert ok.person_known_as("slack", "Alice-GH") is None
    assert ok.person_known_as("github", "bob") == ("bob", "Bob")
    assert ok.approvers("pm") == ok.approvers("dev") == ["alice"] and ok.approvers("ops") == []
    same = minimal(people={"alice": alice, "eve": {"name": "Eve", "identities": {"github": "alice-gh"}}})
    err = error(same)
    assert err.key == "people.eve.identities.github" and "alice's already" in err.problem, err
    unknown = minimal(people={"alice": {**alice, "decides": {"approvals": ["nobody"]}}})
    assert error(unknown).key == "people.alice.decides.approvals[0]"
    for bad, key in (({"Alice": alice}, "people.Alice"),
                     ({"alice": {**alice, "email": "not an address"}}, "people.alice.email"),
                     ({"alice": {**alice, "identities": {"Git Hub": "x"}}}, "people.alice.identities.Git Hub"),
                     ({"alice": {**alice, "phone": "123"}}, "people.alice.phone")):
        assert error(minimal(people=bad)).key.startswith(key), bad
