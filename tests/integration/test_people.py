"""The identity map (company ``people:``) on one real node.

Its people: Alice, known on GitHub as ``Alice-GH`` and allowed to decide the
clerk's approvals; Bob, known on GitHub too and allowed nothing. Its API
tokens: an admin's that belongs to nobody, and one for each of them. Then:
a GitHub delivery from Alice's login (in another case, as GitHub logins
are) is mail that says it is from her and carries her id; an approval of the
clerk's decided with Bob's token or the admin's is a 403 naming who may,
and with Alice's is recorded as hers; a seat's notification to ``alice``
reaches her address at a real SMTP server, as does the notice of the
approval waiting for her; a notification to a person the company does not
know is refused to the model, naming who it knows.
"""

from __future__ import annotations

import json
import os
import uuid

import httpx2
import pytest

from crewlet import hooks, tokens
from crewlet.queue.jetstream import STREAM as AGENTS, SUBJECT as INBOX
from crewlet.queue.notify import PERSON_HEADER
from tests.conftest import wait_for
from tests.integration.test_conversations import _blocks
from tests.seats import ctl_json, held, node_url, read_nats
from tests.smtp import ID_HEADER, SmtpServer

pytestmark = pytest.mark.timeout(180)

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
HOOK_SECRET = "people-hook-secret-0123"
COMPANY = r"""
company: {name: People}
providers:
  p:
    kind: scripted
    rules:
      - match: '(?i)create a task (.+)'
        reply: 'Created: {tools}'
        tools: [{name: task_create, args: {title: '\1'}}]
      - match: '(?i)tell (\S+)'
        reply: 'told'
        tools: [{name: notify, args: {to: '\1', subject: 'a word', body: 'the build is green'}}]
      - match: '.*'
        reply: 'Heard you.'
seats:
  - {name: clerk, persona: You file tasks., provider: p, approval: [task_create]}
  - {name: w, persona: You tell people., provider: p}
integrations:
  gh: {kind: github, secret_env: CW_TEST_PEOPLE_HOOK, routes: [{seat: w}]}
people:
  alice:
    name: Alice Doe
    email: alice@example.com
    identities: {github: alice-gh, slack: U42}
    decides: {approvals: [clerk]}
  bob:
    name: Bob Roe
    identities: {github: bob-gh}
"""


def _token(name: str, scopes: list[str], person: str | None = None) -> tuple[str, dict]:
    made = tokens.new_token()
    entry = {"name": name, "sha256": tokens.digest(made), "scopes": scopes}
    if person:
        entry["person"] = person
    return made, entry


def test_deliveries_approvals_and_notifications_know_who_a_person_is(make_node, monkeypatch):
    monkeypatch.setenv("CW_TEST_PEOPLE_HOOK", HOOK_SECRET)
    admin, admin_entry = _token("ops", ["admin"])
    alice, alice_entry = _token("alice-laptop", ["write"], "alice")
    bob, bob_entry = _token("bob-laptop", ["write"], "bob")
    smtpd = SmtpServer().start()
    try:
        node = make_node(fleet=FAST, ingress={"tokens": [admin_entry, alice_entry, bob_entry]},
                         smtp={"host": "127.0.0.1", "port": smtpd.port, "tls": "none"})
        path = os.path.join(node.dir, "company.yaml")
        with open(path, "w") as f:
            f.write(COMPANY)
        node.start(args=("--company", path))
        wait_for(lambda: {"clerk", "w"} <= set(held(node)), 30, what="the seats held")
        base = f"http://{node.config['ingress']['listen']}"

        def client(token: str) -> httpx2.Client:
            return httpx2.Client(base_url=base, timeout=60, trust_env=False,
                                 headers={"Authorization": f"Bearer {token}"})
        ops, as_alice, as_bob = client(admin), client(alice), client(bob)
        wait_for(lambda: ops.get("/readyz").status_code == 200, 30, what="the node ready")

        # A delivery from Alice's GitHub login: mail from her, saying so.
        delivery = f"d-{uuid.uuid4().hex[:10]}"
        body = json.dumps({"action": "opened", "issue": {"number": 3, "title": "login broken"},
                           "repository": {"full_name": "acme/web"}, "sender": {"login": "Alice-GH"}}).encode()
        headers = {**hooks.sign("github", HOOK_SECRET.encode(), body), "X-GitHub-Delivery": delivery,
                   "X-GitHub-Event": "issues", "Content-Type": "application/json"}
        r = httpx2.post(f"{base}/v1/hooks/gh", content=body, headers=headers, trust_env=False)
        assert r.status_code == 200 and r.json()["person"] == "alice", r.text

        async def mail(nc, js):
            msg = await js.get_msg(AGENTS, subject=INBOX + "w", direct=False)
            return msg.data.decode(), dict(msg.headers or {})
        text, mail_headers = wait_for(lambda: read_nats(node_url(node), mail), 30, what="the delivery's mail")
        assert "by Alice-GH, who is Alice Doe <alice@example.com>" in text.splitlines()[0], text
        assert mail_headers.get(PERSON_HEADER) == "alice", mail_headers

        # An approval of the clerk's: only Alice may decide it; the decision is hers.
        conv = ops.post("/v1/conversations", json={"seat": "clerk"}).json()["id"]
        events = []
        with ops.stream("POST", f"/v1/conversations/{conv}/runs",
                        json={"input": "create a task ship it", "stream": True}) as s:
            for block in _blocks(s.iter_lines()):
                if "event" in block:
                    events.append((block["event"], json.loads(block["data"])))
        approval = next(data["approval"] for kind, data in events if kind == "approval.requested")
        # Alice, who may decide, is told by email (there are no operators' notices_to here).
        notice = wait_for(lambda: next((m for m in list(smtpd.messages)
                                        if m[ID_HEADER] == f"notice.approval.{approval}"), None), 30,
                          what="the approval's notice sent")
        assert notice["To"] == "alice@example.com", notice["To"]
        for who in (as_bob, ops):
            r = who.post(f"/v1/approvals/{approval}", json={"decision": "approve"})
            assert r.status_code == 403 and r.json()["code"] == "not_allowed", r.text
            assert "decided by alice" in r.json()["detail"], r.text
        r = as_alice.post(f"/v1/approvals/{approval}", json={"decision": "approve", "note": "go"})
        assert r.status_code == 200, r.text
        assert r.json()["by"] == "person:alice" and r.json()["decision"] == "approve", r.text
        # The approval's record says whose decision it was.
        assert ops.get(f"/v1/approvals/{approval}").json()["by"] == "person:alice"

        # A notification to a person goes to her address; to nobody the company knows, refused.
        turn = ctl_json(node, "send", "w", "tell alice", "--wait", "30", "--trigger", "tell-1")["turn"]
        assert turn["outcome"] == "done" and not turn["tool_calls"][0]["error"], turn
        sent = wait_for(lambda: next((m for m in list(smtpd.messages) if m["Subject"] == "a word"), None), 30,
                        what="the notification to alice sent")
        assert sent["To"] == "alice@example.com", sent["To"]
        turn = ctl_json(node, "send", "w", "tell carol", "--wait", "30", "--trigger", "tell-2")["turn"]
        assert turn["tool_calls"][0]["error"], turn
        for c in (ops, as_alice, as_bob):
            c.close()
    finally:
        smtpd.stop()
