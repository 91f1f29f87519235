"""The API against its own OpenAPI document: schemathesis on a real node.

Every operation of ``/v1/openapi.json`` is called with generated requests,
valid and invalid (schemathesis's examples, coverage and fuzzing phases), over
real HTTP to a node running the sample company, with an admin token. Every
answer must be no 5xx, a documented status with a documented content type, a
body matching its schema (problems included), and the rest of schemathesis's
default checks: invalid requests refused, valid ones taken, a missing or wrong
token a 401, a 405 naming the path's methods in ``Allow``.

The document is made at collection from the same code (the app's own
``openapi()``; no node needed): schemathesis parametrizes when it collects,
and its fixture-loaded schemas (``schemathesis.pytest.from_fixture``) fail on
this pytest (``Function._nodeid`` is gone). The first test checks that the
node serves exactly that document.

Left out: ``/v1/events`` (a stream never ends; test_api reads it) and
``/v1/ws`` (not HTTP; not in the document). The webhooks stay in: the sample
company has no integrations, so they must be 4xx.

Two things a JSON schema cannot say, so a valid-looking request may still be
refused (and only with that problem's code): a cursor is opaque (only a
page's ``next`` is one: ``bad_cursor``), and a company has rules across its
keys (a seat's provider must exist: ``invalid_company``).

The node takes bodies up to 8 MB: a page body of ``PAGE_BODY_MAX`` characters,
JSON-escaped, can pass the default ``ingress.max_body``, and that 413 (tested
in test_api) is not what this module is about.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from crewlet import tokens
from crewlet.config import NodeConfig
from roles.ingress.app import make_app
from tests.conftest import Nodes, wait_for
from tests.integration.test_api import FAST
from tests.seats import SAMPLE, held

# Generated cases per operation in the fuzzing phase (examples and coverage come on
# top): the module stays well under 90 s on two slow cores.
MAX_EXAMPLES = 25
# The admin token the node is configured with, given to schemathesis as its auth
# (AdminToken): it then knows which requests carry it, and its own auth cases (no
# token, a wrong one) stay its own. A header added at call time would undo them.
TOKEN = tokens.new_token()
# Seconds a generated mail may wait for its turn: a resent Idempotency-Key is never
# worked again, so its wait would run out in full (up to the 120 s the API allows).
WAIT_CAP = 2.0

DOCUMENT = make_app(SimpleNamespace(config=NodeConfig(), node_id="doc"), None, None).openapi()
schema = schemathesis.openapi.from_dict(DOCUMENT).exclude(path_regex=r"^/v1/(events|ws)$")


@schema.auth()
class AdminToken:
    def get(self, case, context):
        return TOKEN

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture(scope="module")
def node():
    made = Nodes()
    node = made(fleet=FAST, ingress={
        "max_body": 8 * 1024 * 1024,
        "tokens": [{"name": "schemathesis", "sha256": tokens.digest(TOKEN), "scopes": ["admin"]}]})
    try:
        node.start(args=("--company", SAMPLE))
        wait_for(lambda: len(held(node)) == 30, 60, what="all 30 seats held")
        node.base = f"http://{node.config['ingress']['listen']}"
        node.auth = {"Authorization": f"Bearer {TOKEN}"}
        node.session = requests.Session()
        node.session.trust_env = False  # loopback, never through a proxy from the environment
        wait_for(lambda: node.session.get(f"{node.base}/v1/company", headers=node.auth).json().get("rev"),
                 20, what="the company in ingress")
        yield node
    finally:
        made.close()


def test_the_node_serves_the_document_under_test(node):
    served = node.session.get(f"{node.base}/v1/openapi.json", timeout=30)
    assert served.status_code == 200 and served.json() == DOCUMENT


def _valid(case) -> bool:
    """Every part of *case* was generated valid. schemathesis 4.32 marks a coverage
    case positive by the scenario it is about even when it made another part
    invalid (seen: mail with the body ``0`` in an Idempotency-Key "null value"
    case); such a case is not one the API must take."""
    meta = case.meta
    return meta is None or (meta.generation.mode == schemathesis.GenerationMode.POSITIVE and all(
        c.mode == schemathesis.GenerationMode.POSITIVE for c in meta.components.values()))


def _opaque(case) -> tuple[str, ...]:
    """The problem codes a schema-valid *case* may still be refused with (none: ())."""
    codes: list[str] = []
    method, path = case.operation.method.upper(), case.operation.path
    if method == "POST" and path == "/v1/company":
        codes.append("invalid_company")
    # A skill's files: SKILL.md's front matter, names, paths (crewlet.skills.format).
    if method == "PUT" and path == "/v1/skills/{name}":
        codes.append("invalid_skill")
    if isinstance(case.query, dict) and case.query.get("cursor"):
        codes.append("bad_cursor")
    # Generated keys repeat ("0") with other bodies: the key reused, refused (issue 24).
    if any(k.lower() == "idempotency-key" for k in (case.headers or {})):
        codes.append("idempotency_key_reused")
    return tuple(codes)


@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large])
@schema.parametrize()
def test_every_answer_is_as_documented(case, node):
    body = case.body
    if case.operation.path.endswith("/mail") and isinstance(body, dict) \
            and isinstance(body.get("wait"), (int, float)) and not isinstance(body["wait"], bool) \
            and body["wait"] > WAIT_CAP:
        case.body = {**body, "wait": WAIT_CAP}
    if isinstance(case.path_parameters, dict) and case.path_parameters.get("node") == node.config["node"]["id"]:
        # Draining the node under test would make the rest of the run a test of a drained node.
        case.path_parameters = {**case.path_parameters, "node": "not-" + node.config["node"]["id"]}
    reason = _opaque(case)
    valid = _valid(case)
    excluded = [positive_data_acceptance] if reason or not valid else None
    response = case.call_and_validate(base_url=node.base, session=node.session, timeout=60,
                                      excluded_checks=excluded)
    if reason and valid and response.status_code in (400, 422):
        assert response.json()["code"] in reason, response.text
    if case.operation.path.startswith("/v1/hooks/"):
        assert 400 <= response.status_code < 500, (response.status_code, response.text)
