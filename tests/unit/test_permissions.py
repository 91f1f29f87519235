"""The broker's users file and what each role's user may do, as written to nats.conf
(crewlet.credentials, crewlet.permissions). A real broker enforcing them:
tests/integration/test_broker_permissions.py."""

from __future__ import annotations

import json
import os
import stat

from crewlet import credentials, permissions
from crewlet.config import NodeConfig
from crewlet.config.model import CHILD_FOR_ROLE
from crewlet.estate import wire
from roles import broker


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_first_start_makes_one_user_per_role_and_crewlet_each_with_its_own_password(tmp_path):
    users = credentials.ensure(str(tmp_path))
    assert set(users) == {"crewlet", *CHILD_FOR_ROLE.values()} == set(credentials.USERS)
    assert len(set(users.values())) == len(users)
    assert _mode(credentials.path(str(tmp_path))) == 0o600
    assert credentials.ensure(str(tmp_path)) == users  # kept across restarts


def test_an_older_file_with_crewlet_alone_is_upgraded_in_place_keeping_its_password(tmp_path):
    run_dir = str(tmp_path)
    with open(credentials.path(run_dir), "w") as f:
        json.dump({"users": {"crewlet": "the-old-one"}}, f)
    os.chmod(credentials.path(run_dir), 0o600)
    # Before crewletd upgrades it, a role's user is missing: said, naming the file.
    try:
        credentials.client_options(NodeConfig().stream, run_dir, "seats")
        raise AssertionError("a missing user was not said")
    except ValueError as exc:
        assert credentials.CREDENTIALS_FILE in str(exc) and "'seats'" in str(exc)

    users = credentials.ensure(run_dir)
    assert users["crewlet"] == "the-old-one"
    assert set(users) == set(credentials.USERS)
    assert credentials.read(run_dir) == users
    assert _mode(credentials.path(run_dir)) == 0o600
    assert os.listdir(run_dir) == [credentials.CREDENTIALS_FILE]  # no temporary left behind


def test_every_role_has_a_grant_and_crewlet_none():
    grants = permissions.grants("n1")
    assert set(grants) == set(credentials.ROLE_USERS)
    assert credentials.CREWLET_USER not in grants


def _allowed(role: str, node: str = "n1", domain: str = "crewlet") -> tuple[list[str], list[str]]:
    return permissions.subjects(permissions.grants(node)[role], role=role, node=node, domain=domain)


def test_only_the_applier_may_write_grants_and_answer_estate_requests():
    for role in credentials.ROLE_USERS:
        publish, subscribe = _allowed(role)
        writes_grants = any("$KV.grants." in s or "KV_grants" in s and "STREAM.UPDATE" in s
                            for s in publish)
        assert writes_grants == (role == "data_applier"), role
        # Every origin's requests to this node's applier, and an older node's.
        assert ({"estate.req.n1.>", "estate.req.n1"} <= set(subscribe)) == (role == "data_applier"), role
        assert not any(s.startswith("estate.req") and s not in ("estate.req.n1.>", "estate.req.n1")
                       for s in subscribe)


def test_each_role_asks_an_applier_under_its_own_origin_and_node_only():
    asks = {role: [s for s in _allowed(role)[0] if s.startswith("estate.req")]
            for role in credentials.ROLE_USERS}
    assert asks == {"data_applier": [], "seats": ["estate.req.*.seats.n1"],
                    "ingress": ["estate.req.*.ingress.n1"], "workers": ["estate.req.*.workers.n1"]}


def test_only_the_applier_publishes_on_the_log_s_own_subject_and_seats_on_their_node_s():
    logs = {role: [s for s in _allowed(role)[0] if s.startswith("estate.ops")]
            for role in credentials.ROLE_USERS}
    assert logs == {"data_applier": ["estate.ops"], "seats": ["estate.ops.seats.n1"],
                    "ingress": [], "workers": []}


def test_ingress_and_workers_never_publish_to_the_estate_log_and_nobody_deletes_a_stream():
    for role in credentials.ROLE_USERS:
        publish, _ = _allowed(role)
        assert ("estate.ops" in publish) == (role == "data_applier"), role
        assert not any("STREAM.DELETE" in s for s in publish), role
        assert not any(s.endswith(">") and s.count(".") <= 2 and s.startswith("$JS") for s in publish), \
            f"{role}: a wildcard over the whole JetStream API"
        # Purging mailboxes and the estate log is the maintenance duty's alone; the
        # roles that handle files purge the files bucket's chunks, nothing else.
        files = ["$JS.API.STREAM.PURGE.OBJ_files", "$JS.crewlet.API.STREAM.PURGE.OBJ_files"]
        assert [s for s in publish if "STREAM.PURGE" in s] == (
            (["$JS.API.STREAM.PURGE.AGENTS", "$JS.crewlet.API.STREAM.PURGE.AGENTS",
              "$JS.API.STREAM.PURGE.ESTATE", "$JS.crewlet.API.STREAM.PURGE.ESTATE"] if role == "workers"
             else []) + files), role


def test_the_roles_that_handle_files_write_only_the_files_bucket_they_are_given():
    for role in ("data_applier", "ingress", "seats", "workers"):
        publish, _ = permissions.subjects(permissions.grants("n1")[role], role=role, node="n1",
                                          domain="crewlet", files_bucket="docs")
        assert [s for s in publish if "$O." in s] == ["$O.docs.>", "$JS.crewlet.API.$O.docs.>"], role
        assert not any("OBJ_files" in s for s in publish), role


def test_each_role_subscribes_under_its_own_inbox_only():
    for role in credentials.ROLE_USERS:
        _, subscribe = _allowed(role)
        assert subscribe[0] == f"_INBOX.{role}.n1.>"
        assert not any(s.startswith("_INBOX") for s in subscribe[1:])


def test_leases_keys_are_split_between_seats_workers_and_the_run_drivers():
    leases = {role: [s for s in _allowed(role)[0] if s.startswith("$KV.leases.")]
              for role in credentials.ROLE_USERS}
    assert leases == {"data_applier": [], "ingress": ["$KV.leases.conv.>"],
                      "seats": ["$KV.leases.seat.*", "$KV.leases.life.n1"],
                      "workers": ["$KV.leases.duty.>"]}
    # From a leaf, through the domain, alike.
    assert "$JS.fleet.API.$KV.leases.conv.>" in _allowed("ingress", domain="fleet")[0]


def test_run_events_are_published_by_seats_and_ingress_and_followed_by_ingress_alone():
    for role in credentials.ROLE_USERS:
        publish, _ = _allowed(role)
        assert ("runs.>" in publish) == (role in ("seats", "ingress")), role
        runs_api = sorted(s for s in publish if s.startswith("$JS.API.") and "RUNS" in s.split("."))
        if role == "ingress":
            # An ordered consumer per reader: created, read (flow control
            # answered), deleted; the stream looked at; never made or purged.
            assert "$JS.API.CONSUMER.CREATE.RUNS" in runs_api
            assert "$JS.API.CONSUMER.DELETE.RUNS.>" in runs_api
            assert "$JS.API.STREAM.INFO.RUNS" in runs_api
            assert "$JS.FC.RUNS.>" in publish
            assert not [s for s in runs_api if "STREAM.CREATE" in s or "STREAM.UPDATE" in s
                        or "PURGE" in s or "MSG.DELETE" in s], runs_api
        elif role == "seats":
            # A turn reads the request to stop its run (one message by
            # subject) and hears it as it is published; it follows nothing.
            assert "$JS.API.STREAM.MSG.GET.RUNS" in runs_api and "runs.>" in _allowed(role)[1]
            assert not [s for s in runs_api if "CONSUMER.CREATE" in s or "STREAM.CREATE" in s
                        or "PURGE" in s or "MSG.DELETE" in s], runs_api
        else:
            assert runs_api == [], (role, runs_api)


def test_the_apis_domain_form_is_allowed_alike_for_a_leaf():
    publish, _ = _allowed("seats", domain="fleet")
    assert "$JS.fleet.API.$KV.leases.seat.*" in publish
    assert "$JS.fleet.API.CONSUMER.MSG.NEXT.AGENTS.>" in publish
    assert "$JS.API.CONSUMER.MSG.NEXT.AGENTS.>" in publish


def test_nats_conf_gives_crewlet_every_right_and_each_role_its_list(tmp_path):
    cfg = NodeConfig(node={"id": "n1"}, data_dir=str(tmp_path))
    users = credentials.ensure(str(tmp_path))
    text = "\n".join(broker.config_lines(cfg, users))
    assert f'{{ user: "crewlet", password: {json.dumps(users["crewlet"])} }}' in text
    for role in credentials.ROLE_USERS:
        assert f'{{ user: "{role}", password: {json.dumps(users[role])}, permissions: {{' in text
    # The applier answers estate requests, one answer each, within longer than they wait.
    assert text.count("allow_responses:") == 1
    assert f'allow_responses: {{ max: 1, expires: "{permissions.ANSWER_WITHIN}s" }}' in text
    assert permissions.ANSWER_WITHIN > wire.WRITE_WAIT


def test_the_role_users_are_the_role_children():
    # credentials cannot import the config (the config imports it): kept equal here.
    assert set(credentials.ROLE_USERS) == set(CHILD_FOR_ROLE.values())
