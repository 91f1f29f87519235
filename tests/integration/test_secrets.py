"""No secret outside its owner (DESIGN §14), on one real node: the embedded
nats-server's environment holds none of crewletd's secrets, and a tool that
says a known secret back — as its result and on its stderr — leaves it in no
turn record, estate row, log line or file of the node (crewlet.redaction)."""

from __future__ import annotations

import os
import sys

from crewlet import redaction
from tests.conftest import wait_for
from tests.seats import MCP_SERVER, ctl_json, held, read_nats, node_url, turn_records, write_company

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
# No vendor's shape, no credential's words: found only as a value the node knows.
KEY = "correcthorse-0123456789-battery"
HOOK = "staplegun-9876543210-saddle"

# The scripted model asks the seat's own MCP server to reverse what the mail
# says; reversed, that is the provider key of a provider no seat uses (its
# key is still the company's), so neither the mail nor the call's arguments
# hold the secret — only the tool's result does.
COMPANY = """
company: {{name: t}}
providers:
  p:
    kind: scripted
    rules:
      - match: 'reverse (\\S+)'
        reply: 'it says {{tools}}'
        tools: [{{name: t__reverse, args: {{text: '\\1'}}}}]
  spare: {{kind: openai, api_key_env: CREWLET_TEST_REDACT_KEY}}
integrations:
  gh:
    kind: github
    secret_env: CREWLET_TEST_REDACT_HOOK
    routes: [{{seat: w}}]
seats:
  - name: w
    persona: a worker
    provider: p
    mcp: [{{name: t, command: {python}, args: [{server}, --reverse]}}]
"""


def test_the_broker_runs_with_an_environment_built_from_nothing(make_node, monkeypatch):
    monkeypatch.setenv("CREWLET_TEST_REDACT_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-" + KEY)
    node = make_node().start()
    kids = node.children()
    with open(f"/proc/{kids['broker']['pid']}/environ", "rb") as f:
        environ = dict(entry.split(b"=", 1) for entry in f.read().split(b"\0") if entry)
    assert set(environ) <= {k.encode() for k in redaction.BARE_ENV_KEEP}, environ
    assert KEY.encode() not in b"".join(environ.values())


def test_a_tool_saying_a_known_secret_leaves_it_nowhere(make_node, monkeypatch):
    from crewlet.estate import store
    from tests.estate import copy_of

    monkeypatch.setenv("CREWLET_TEST_REDACT_KEY", KEY)
    monkeypatch.setenv("CREWLET_TEST_REDACT_HOOK", HOOK)
    node = make_node(fleet=FAST)
    company = COMPANY.format(python=sys.executable, server=MCP_SERVER)
    node.start(args=("--company", write_company(node.dir, company)))
    wait_for(lambda: held(node).get("w") == "t1", 30, what="seat w held")

    for n, secret in enumerate((KEY, HOOK)):
        out = ctl_json(node, "send", "w", f"reverse {secret[::-1]}", "--wait", "30", "--trigger", f"rev-{n}")
        turn = out["turn"]
        assert turn["outcome"] == "done", turn
        assert turn["tool_calls"] == [{"name": "t__reverse", "error": False, "round": 1}], out
        assert turn["reply"] == f"it says {redaction.REDACTED}", turn  # the model read it redacted

    def kept():
        records = [r for r in read_nats(node_url(node), turn_records) if r["trigger"].startswith("rev-")]
        return records if len(records) == 2 else None
    records = wait_for(kept, 20, what="both turn records kept on EVENTS")
    assert all(r["reply"] == f"it says {redaction.REDACTED}" for r in records)

    def estate_rows():
        copy = copy_of(node)
        rows = [store.unpack(v) for _, v in store.dump(copy, ("turns",))["turns"]] if copy else []
        rows = [r for r in rows if str(r.get("trigger", "")).startswith("rev-")]
        return rows if len(rows) == 2 else None
    rows = wait_for(estate_rows, 20, what="both turns' rows in the estate")
    assert all(redaction.REDACTED in r["reply"] for r in rows), rows

    # The tool said it on its stderr too: a line its role's output carried to
    # crewletd, which forwards it knowing the company's secrets.
    wait_for(lambda: node.read_log().count(f"reversed: {redaction.REDACTED}") == 2, 10,
             what="the tool's stderr lines, redacted, in the node's log")
    secrets = (KEY.encode(), HOOK.encode())
    log = node.read_log().encode()
    assert not any(s in log for s in secrets)
    leaks = []
    for root, _, files in os.walk(node.config["data_dir"]):
        for name in files:
            path = os.path.join(root, name)
            if os.path.isfile(path):  # not the run dir's sockets
                with open(path, "rb") as f:
                    data = f.read()
                leaks += [path for s in secrets if s in data]
    assert not leaks, leaks
