"""Webhooks on one real node: ``POST /v1/hooks/<integration>`` over real HTTP.

One crewletd for the whole module (embedded broker, all four roles), started
with the sample company plus three integrations — github, slack, and a
generic one with headers of its own — whose secrets are in crewletd's
environment (``secret_env``), as on a real ingress node. Deliveries are
signed with :func:`crewlet.hooks.sign`, as their senders would, and posted
with urllib. What landed is read from the broker with a connection of the
test's own: the ``claims`` bucket, ``NOTIFY``, the seats' mailboxes (read
by sequence, so no consumer is made) and the turn records.

"Exactly one mail" is counted once the ``NOTIFY`` group holds nothing more
(nothing pending, nothing unacked): from then on no further mail can come of
a delivery, so the count is final, not a snapshot.

The helpers here (:func:`http`, :func:`mail_triggers`, :func:`start_module_node`
…) serve tests/fleet/test_api_fleet.py too.
"""

from __future__ import annotations

import http.client as http_client
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import psutil
import pytest
import yaml
from nats.js.errors import NotFoundError

from crewlet import groups, hooks
from crewlet.coord import buckets
from crewlet.queue import notify
from crewlet.queue.base import TRIGGER_HEADER
from crewlet.queue.jetstream import STREAM as AGENTS, SUBJECT as INBOX
from tests.conftest import Nodes, wait_for
from tests.seats import SAMPLE, held, node_url, read_nats, turn_records

pytestmark = pytest.mark.timeout(240)

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
# The signing secrets, by the env var each integration names; given to crewletd
# (and so to its ingress child) through its environment.
SECRETS = {"CW_TEST_GITHUB_SECRET": "gh-secret-0123456789",
           "CW_TEST_SLACK_SECRET": "slack-secret-abcdef",
           "CW_TEST_ACME_SECRET": "acme-secret-xyz"}
INTEGRATIONS = {
    "github": {"kind": "github", "secret_env": "CW_TEST_GITHUB_SECRET",
               "routes": [{"event": "issues", "repository": "acme/web", "seat": "cto"}]},
    "slack": {"kind": "slack", "secret_env": "CW_TEST_SLACK_SECRET",
              "routes": [{"event": "app_mention", "seat": "support-lead"}]},
    "acme": {"kind": "generic", "secret_env": "CW_TEST_ACME_SECRET",
             "signature_header": "X-Acme-Signature", "delivery_header": "X-Acme-Delivery",
             "event_header": "X-Acme-Event", "routes": [{"event": "deploy", "seat": "sre-oncall"}]},
}
ROUTED = {"github": "cto", "slack": "support-lead", "acme": "sre-oncall"}
# Seconds for a stored delivery to become mail. A NOTIFY message held by an
# ingress that was killed comes back after notify.ACK_WAIT (30 s).
MAIL_WITHIN = notify.ACK_WAIT + 30


# ------------------------------------------------------------------ HTTP

def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         token: str | None = None, timeout: float = 30) -> tuple[int, Any]:
    """One real HTTP request: ``(status, body)``, the body parsed when it is JSON.
    Connection errors are raised (a sender sees no answer at all)."""
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, kind = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    return status, (json.loads(raw) if "json" in kind and raw else raw.decode("utf-8", "replace"))


def api_url(node) -> str:
    return f"http://{node.config['ingress']['listen']}"


def api_token(node) -> str:
    """The node's first-start admin token (it has no ``ingress.tokens``)."""
    path = os.path.join(node.run_dir, "api-token")
    wait_for(lambda: os.path.exists(path), 30, what=f"{path} written")
    with open(path) as f:
        return f.read().strip()


# ------------------------------------------------------------------ deliveries, signed as senders do

def github_delivery(delivery: str, *, repository: str = "acme/web", event: str = "issues",
                    secret: str = SECRETS["CW_TEST_GITHUB_SECRET"]) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"action": "opened", "issue": {"number": 7, "title": "the login page is broken"},
                       "repository": {"full_name": repository}, "sender": {"login": "octocat"}}).encode()
    return body, {**hooks.sign("github", secret.encode(), body),
                  "X-GitHub-Delivery": delivery, "X-GitHub-Event": event}


def slack_delivery(event_id: str, *, timestamp: int | None = None,
                   secret: str = SECRETS["CW_TEST_SLACK_SECRET"]) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"type": "event_callback", "event_id": event_id, "team_id": "T1",
                       "event": {"type": "app_mention", "user": "U42", "channel": "C7",
                                 "text": "<@UBOT> the checkout is down"}}).encode()
    return body, hooks.sign("slack", secret.encode(), body,
                            timestamp=int(time.time()) if timestamp is None else timestamp)


def acme_delivery(delivery: str, *, event: str = "deploy",
                  secret: str = SECRETS["CW_TEST_ACME_SECRET"]) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"action": "finished", "repository": "acme/api", "sender": "ci"}).encode()
    return body, {**hooks.sign("generic", secret.encode(), body, header="X-Acme-Signature"),
                  "X-Acme-Delivery": delivery, "X-Acme-Event": event}


def post_hook(node, integration: str, delivery: tuple[bytes, dict[str, str]],
              timeout: float = 30) -> tuple[int, Any]:
    body, headers = delivery
    return http("POST", f"{api_url(node)}/v1/hooks/{integration}", body, headers, timeout=timeout)


def _half_sent(node, integration: str, delivery: tuple[bytes, dict[str, str]]) -> http_client.HTTPConnection:
    """A connection to ingress holding *delivery*'s request: its head and
    the first half of its body sent, the rest not yet (see _rest_answered)."""
    body, headers = delivery
    host, port = node.config["ingress"]["listen"].rsplit(":", 1)
    conn = http_client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", f"/v1/hooks/{integration}")
    for name, value in {"Content-Type": "application/json", **headers,
                        "Content-Length": str(len(body))}.items():
        conn.putheader(name, value)
    conn.endheaders(body[:len(body) // 2])
    return conn


def _rest_answered(conn: http_client.HTTPConnection, delivery: tuple[bytes, dict[str, str]]) -> int | None:
    """The rest of a :func:`_half_sent` request's body sent: the status it
    was answered with, or None if it had no answer."""
    body, _ = delivery
    try:
        conn.send(body[len(body) // 2:])
        return conn.getresponse().status
    except (OSError, http_client.HTTPException):
        return None


def new_id(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:12]}"


# ------------------------------------------------------------------ what landed on the broker

async def _each(js, stream: str, subjects: str) -> list:
    """Every message of *stream* on *subjects*, in order, read by sequence
    (``next_by_subj``): no consumer is made, so polling leaves nothing behind
    (a stream's consumer limit is deliberate and small)."""
    out = []
    seq = 1
    while True:
        try:
            msg = await js.get_msg(stream, seq, subject=subjects, next=True)
        except NotFoundError:
            return out
        out.append(msg)
        seq = msg.seq + 1


async def _mail_triggers(nc, js) -> list[tuple[str, str | None]]:
    """``(seat, trigger)`` of every message on the mailboxes' subjects, in order."""
    return [(m.subject[len(INBOX):], (m.headers or {}).get(TRIGGER_HEADER))
            for m in await _each(js, AGENTS, INBOX + ">")]


def mail_triggers(node) -> list[tuple[str, str | None]]:
    return read_nats(node_url(node), lambda nc, js: _mail_triggers(nc, js))


def mail_count(node, delivery: str) -> dict[str, int]:
    """seat -> how many mails carry *delivery* as their trigger."""
    counts: dict[str, int] = {}
    for seat, trigger in mail_triggers(node):
        if trigger == delivery:
            counts[seat] = counts.get(seat, 0) + 1
    return counts


async def _notify_idle(nc, js) -> bool:
    try:
        info = await js.consumer_info(notify.STREAM, groups.durable(groups.NOTIFY))
    except NotFoundError:
        return False
    return info.num_pending == 0 and info.num_ack_pending == 0


def notify_idle(node) -> bool:
    """The NOTIFY group holds nothing: every stored delivery is mail (or dropped)."""
    return read_nats(node_url(node), _notify_idle)


def settled_mail(node, deliveries: list[str], timeout: float = MAIL_WITHIN) -> dict[str, dict[str, int]]:
    """Once each of *deliveries* is mail and NOTIFY holds nothing more: the
    final count of mail per delivery, per seat."""
    def landed():
        if not notify_idle(node):
            return None
        triggers = mail_triggers(node)
        counts = {d: {} for d in deliveries}
        for seat, trigger in triggers:
            if trigger in counts:
                counts[trigger][seat] = counts[trigger].get(seat, 0) + 1
        return counts if all(counts.values()) else None
    return wait_for(landed, timeout, interval=0.2, what=f"{len(deliveries)} deliveries made mail")


async def _claim(integration: str, delivery: str, nc, js) -> dict | None:
    kv = await js.key_value(buckets.CLAIMS.name)
    try:
        entry = await kv.get(notify.claim_key(integration, delivery))
    except Exception:  # no such key
        return None
    return json.loads(entry.value) if entry and entry.value else None


def claim_of(node, integration: str, delivery: str) -> dict | None:
    return read_nats(node_url(node), lambda nc, js: _claim(integration, delivery, nc, js))


async def _notify_count(nc, js) -> int:
    return (await js.stream_info(notify.STREAM)).state.messages


def notify_count(node) -> int:
    return read_nats(node_url(node), _notify_count)


def done_turns(node, delivery: str) -> list[dict]:
    """The done turn records whose trigger is *delivery*."""
    return [r for r in read_nats(node_url(node), turn_records)
            if r.get("trigger") == delivery and r.get("outcome") == "done"]


# ------------------------------------------------------------------ nodes for a whole module

def hooks_company(dir: str, integrations: dict | None = None) -> str:
    """etc/company.yaml's seats and providers, with *integrations* (default: ours)."""
    with open(SAMPLE) as f:
        company = yaml.safe_load(f)
    company["integrations"] = INTEGRATIONS if integrations is None else integrations
    path = os.path.join(dir, "company-hooks.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(company, f, sort_keys=False)
    return path


def secrets_env(secrets: dict[str, str] = SECRETS) -> list[str]:
    """A ``Node.start`` prefix putting *secrets* in crewletd's environment."""
    return ["env", *(f"{name}={value}" for name, value in secrets.items())]


def company_in_force(node, token: str) -> bool:
    """The node's ingress has a company (webhooks answer other than 503 no_company)."""
    try:
        status, body = http("GET", f"{api_url(node)}/v1/fleet", token=token, timeout=5)
    except OSError:
        return False
    return status == 200 and bool(body.get("company"))


def wait_trimmed_once(nodes, timeout: float = 30) -> None:
    """``maintenance`` trims worked mail on its first sweep, then not for
    an hour: wait for that pass, so mail counted afterwards stays counted."""
    wait_for(lambda: any(n.events_named("mailboxes_trimmed") for n in nodes),
             timeout, interval=0.2, what="maintenance's first trim")


@pytest.fixture(scope="module")
def hub():
    """One node for the module: the sample's seats plus our integrations."""
    made = Nodes()
    try:
        node = made(node={"id": "h1"}, fleet=FAST)
        node.start(prefix=secrets_env(), args=("--company", hooks_company(made.dir)))
        wait_for(lambda: all(held(node).get(s) == "h1" for s in ROUTED.values()), 60,
                 what="the routed seats held")
        token = api_token(node)
        wait_for(lambda: company_in_force(node, token), 30, what="the company in force at ingress")
        wait_trimmed_once([node])
        yield node, token
    finally:
        made.close()


# ------------------------------------------------------------------ the tests

def test_signed_deliveries_of_each_kind_become_one_mail_each(hub):
    """A github, a slack and a generic delivery, each signed with its
    integration's secret, are 200 routed to their seat; each becomes exactly
    one mail in that seat's mailbox, with the delivery id as its trigger, and
    the seat works it (a done turn whose trigger is the delivery id)."""
    node, _ = hub
    ids = {"github": new_id("gh"), "slack": new_id("Ev"), "acme": new_id("acme")}
    sent = {"github": github_delivery(ids["github"]), "slack": slack_delivery(ids["slack"]),
            "acme": acme_delivery(ids["acme"])}
    for integration, delivery in sent.items():
        status, body = post_hook(node, integration, delivery)
        assert status == 200, body
        assert body == {"delivery": ids[integration], "integration": integration, "routed": True,
                        "seat": ROUTED[integration], "duplicate": False, "person": None}
        assert claim_of(node, integration, ids[integration])["state"] == notify.STORED

    counts = settled_mail(node, list(ids.values()))
    assert counts == {ids[i]: {ROUTED[i]: 1} for i in ids}
    for integration, delivery in ids.items():
        turns = wait_for(lambda: done_turns(node, delivery), 30, interval=0.2,
                         what=f"{ROUTED[integration]}'s turn on {delivery}")
        assert [t["seat"] for t in turns] == [ROUTED[integration]]


def test_refused_deliveries_are_answered_and_store_nothing(hub):
    """A wrong signature (401 bad_signature: github with another secret, a
    generic one with its body changed after signing), a Slack request five
    minutes and more old (401 stale_timestamp), an integration the company
    has not (404): none is claimed, none reaches NOTIFY or a mailbox. A Slack
    url_verification is answered with its challenge and stores nothing; a
    delivery no route matches is 202 routed:false and stores nothing."""
    node, _ = hub
    before = notify_count(node)
    refused = []

    gh = new_id("gh")
    status, body = post_hook(node, "github", github_delivery(gh, secret="not-the-secret"))
    assert (status, body["code"]) == (401, "bad_signature"), body
    refused.append(("github", gh))

    acme = new_id("acme")
    payload, headers = acme_delivery(acme)
    status, body = post_hook(node, "acme", (payload.replace(b"finished", b"failed!!"), headers))
    assert (status, body["code"]) == (401, "bad_signature"), body
    refused.append(("acme", acme))

    ev = new_id("Ev")
    status, body = post_hook(node, "slack", slack_delivery(ev, timestamp=int(time.time()) - 10 * 60))
    assert (status, body["code"]) == (401, "stale_timestamp"), body
    assert "old" in body["detail"]
    refused.append(("slack", ev))

    nope = new_id("gh")
    status, body = post_hook(node, "nosuch", github_delivery(nope))
    assert (status, body["code"]) == (404, "no_such_integration"), body
    refused.append(("nosuch", nope))

    # Slack's url_verification: the challenge, at once.
    check = json.dumps({"type": "url_verification", "token": "x", "challenge": "c-3ff1"}).encode()
    status, body = post_hook(node, "slack", (check, hooks.sign("slack", SECRETS["CW_TEST_SLACK_SECRET"]
                                                              .encode(), check)))
    assert (status, body) == (200, {"challenge": "c-3ff1"})

    # No route matches another repository's issues: accepted, stored nowhere.
    other = new_id("gh")
    status, body = post_hook(node, "github", github_delivery(other, repository="acme/other"))
    assert status == 202, body
    assert body == {"delivery": other, "integration": "github", "routed": False, "seat": None,
                    "duplicate": False, "person": None}
    refused.append(("github", other))

    assert all(claim_of(node, i, d) is None for i, d in refused)
    assert notify_count(node) == before
    wait_for(lambda: notify_idle(node), 30, interval=0.2, what="NOTIFY idle")
    triggers = {t for _, t in mail_triggers(node)}
    assert not triggers & {d for _, d in refused}
    assert not any(t and t.startswith("challenge-") for t in triggers)


def test_the_same_delivery_posted_twice_is_one_mail(hub):
    """A sender's redelivery (GitHub's "redeliver") is a 200 duplicate:true
    the second time, and the seat gets one mail."""
    node, _ = hub
    gh = new_id("gh")
    first = post_hook(node, "github", github_delivery(gh))
    second = post_hook(node, "github", github_delivery(gh))
    assert first[0] == 200 and first[1]["duplicate"] is False, first
    assert second[0] == 200, second
    assert second[1] == {"delivery": gh, "integration": "github", "routed": True, "seat": "cto",
                         "duplicate": True, "person": None}
    # Slack's retries repeat the event_id (and count themselves in X-Slack-Retry-Num).
    ev = new_id("Ev")
    body, headers = slack_delivery(ev)
    assert post_hook(node, "slack", (body, headers))[0] == 200
    status, again = post_hook(node, "slack", (body, {**headers, "X-Slack-Retry-Num": "1"}))
    assert status == 200 and again["duplicate"] is True, again
    assert settled_mail(node, [gh, ev]) == {gh: {"cto": 1}, ev: {"support-lead": 1}}


def _write_claim(node, integration: str, delivery: str, seat: str) -> None:
    """The claim a node makes at step 5 (:func:`crewlet.queue.notify.claim`), as
    if that node died right after it."""
    async def claim(nc, js):
        assert await notify.claim(js, integration, delivery, node="dead-node", seat=seat) is None
    read_nats(node_url(node), claim)


def test_a_delivery_claimed_by_a_node_that_died_before_storing_it_is_stored_by_the_retry(hub):
    """A node that died between the claim (step 5) and the store (step 6)
    answered its sender nothing — no 2xx for a delivery nobody stored — so the
    delivery is the sender's to retry, never lost silently. The state that
    leaves is made here exactly: the claim in ``claims`` says ``claimed`` and
    NOTIFY has nothing. The sender's retry, to a live node, takes the claim
    over: 200, stored, exactly one mail; the claim then says ``stored``."""
    node, _ = hub
    gh = new_id("gh")
    _write_claim(node, "github", gh, "cto")
    before = notify_count(node)
    assert claim_of(node, "github", gh)["state"] == notify.CLAIMED

    status, body = post_hook(node, "github", github_delivery(gh))
    assert status == 200, body
    assert body == {"delivery": gh, "integration": "github", "routed": True, "seat": "cto",
                    "duplicate": False, "person": None}
    assert notify_count(node) == before + 1
    assert claim_of(node, "github", gh)["state"] == notify.STORED
    assert settled_mail(node, [gh]) == {gh: {"cto": 1}}
    # And the retry's retry is a duplicate.
    status, body = post_hook(node, "github", github_delivery(gh))
    assert status == 200 and body["duplicate"] is True, body
    assert settled_mail(node, [gh]) == {gh: {"cto": 1}}


def test_a_delivery_stored_by_a_node_that_died_before_marking_it_is_still_one_mail(hub):
    """The reverse: the node claimed the delivery AND stored it in NOTIFY, and
    died before marking the claim stored (and before answering its sender).
    The sender's retry finds the claim ``claimed``, stores again — NOTIFY
    drops the repeat of its message id — and answers 200 duplicate:true:
    still exactly one mail."""
    node, _ = hub
    ev = new_id("Ev")
    body, headers = slack_delivery(ev)
    delivery = hooks.receive("slack", _integration("slack"), headers, body,
                             secret=SECRETS["CW_TEST_SLACK_SECRET"].encode(), now=time.time())
    _write_claim(node, "slack", ev, "support-lead")

    async def store(nc, js):
        return await notify.store(js, "slack", delivery.id, "support-lead", delivery.text)
    assert read_nats(node_url(node), store) is False  # the first store of it
    after_store = notify_count(node)

    status, answer = post_hook(node, "slack", (body, headers))
    assert status == 200, answer
    assert answer == {"delivery": ev, "integration": "slack", "routed": True, "seat": "support-lead",
                      "duplicate": True, "person": None}
    assert notify_count(node) == after_store  # the repeat was dropped
    assert claim_of(node, "slack", ev)["state"] == notify.STORED
    assert settled_mail(node, [ev]) == {ev: {"support-lead": 1}}


def _integration(name: str):
    from crewlet.company.model import Integration
    return Integration.model_validate(INTEGRATIONS[name])


METRIC_RE = re.compile(r'^crewlet_webhook_deliveries_total\{integration="([^"]+)",outcome="([^"]+)"\} '
                       r'([0-9.e+]+)$', re.M)


def webhook_metrics(node, token: str) -> dict[tuple[str, str], float]:
    status, text = http("GET", f"{api_url(node)}/metrics", token=token)
    assert status == 200, text
    return {(i, o): float(v) for i, o, v in METRIC_RE.findall(text)}


def test_metrics_count_webhook_deliveries_by_outcome(hub):
    """``/metrics`` (with the token; without one it is a 401) counts
    crewlet_webhook_deliveries_total by integration and outcome: stored,
    duplicate, the refusal's code, unrouted, and mailed (the NOTIFY group's)."""
    node, token = hub
    assert http("GET", f"{api_url(node)}/metrics")[0] == 401
    before = webhook_metrics(node, token)
    gh = new_id("gh")
    assert post_hook(node, "github", github_delivery(gh))[0] == 200
    assert post_hook(node, "github", github_delivery(gh))[0] == 200
    assert post_hook(node, "github", github_delivery(new_id("gh"), secret="wrong"))[0] == 401
    assert post_hook(node, "github", github_delivery(new_id("gh"), repository="x/y"))[0] == 202
    assert post_hook(node, "slack", slack_delivery(new_id("Ev"), timestamp=1))[0] == 401
    settled_mail(node, [gh])
    want = {("github", "stored"): 1, ("github", "duplicate"): 1, ("github", "bad_signature"): 1,
            ("github", "unrouted"): 1, ("github", "mailed"): 1, ("slack", "stale_timestamp"): 1}

    def delta() -> dict[tuple[str, str], float]:
        now = webhook_metrics(node, token)
        return {k: now.get(k, 0) - before.get(k, 0) for k in now if now.get(k, 0) != before.get(k, 0)}
    try:
        wait_for(lambda: delta() == want, 10, interval=0.2, what="the webhook counters")
    except AssertionError:
        assert delta() == want


def test_sigkill_of_ingress_mid_burst_loses_nothing_and_doubles_nothing(hub):
    """Senders post a burst of distinct deliveries from four threads while the
    ingress child is SIGKILLed under them (crewletd restarts it). A delivery
    answered 2xx became exactly one mail; one that was not (the connection
    dropped mid-request, refused while ingress was down, a 503) is sent again
    until it is answered — some of those the dead ingress had claimed, or even
    stored — and then it too is exactly one mail. One delivery is half sent
    and accepted by ingress at the kill, so one surely dies in its hands."""
    node, _ = hub
    old_pid = node.process_pids()["ingress"]
    answered: dict[str, int] = {}      # delivery id -> the 2xx status it got
    unanswered: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()
    killed = threading.Event()
    after_kill = [0]                   # deliveries answered after the restart

    def sender(worker: int) -> None:
        n = 0
        while not stop.is_set() and n < 1000:
            delivery = f"burst-{worker}-{n}"
            n += 1
            try:
                status, _ = post_hook(node, "github", github_delivery(delivery), timeout=10)
            except (OSError, http_client.HTTPException):
                status = None
            with lock:
                if status is not None and 200 <= status < 300:
                    answered[delivery] = status
                    if killed.is_set():
                        after_kill[0] += 1
                else:
                    unanswered.add(delivery)
            if status != 200:
                stop.wait(0.05)  # a sender's back-off, not a hammering loop while ingress is down

    threads = [threading.Thread(target=sender, args=(w,), name=f"sender-{w}") for w in range(4)]
    for t in threads:
        t.start()
    held = None
    try:
        wait_for(lambda: len(answered) >= 20, 30, interval=0.01, what="20 deliveries answered")
        # One more delivery is surely in ingress's hands at the kill, whatever
        # the senders are doing then (under load they can all be between
        # requests): its head and half its body sent, its connection accepted.
        held = _half_sent(node, "github", github_delivery("burst-held"))
        held_at = held.sock.getsockname()
        wait_for(lambda: any(c.raddr and tuple(c.raddr) == held_at
                             for c in psutil.Process(old_pid).net_connections("tcp")),
                 10, interval=0.01, what="the half-sent delivery accepted by ingress")
        os.kill(old_pid, signal.SIGKILL)
        killed.set()
        assert _rest_answered(held, github_delivery("burst-held")) is None, \
            "a delivery in the killed ingress's hands was answered"
        unanswered.add("burst-held")
        node.wait_running(timeout=30, exclude={"ingress": old_pid})
        wait_for(lambda: after_kill[0] >= 20, 30, interval=0.05, what="deliveries answered after the restart")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        if held is not None:
            held.close()
    assert not any(t.is_alive() for t in threads)
    assert all(status == 200 for status in answered.values())

    # The sender's retries of what went unanswered, until each is answered.
    def resend_all() -> bool:
        for delivery in sorted(unanswered - set(answered)):
            try:
                status, _ = post_hook(node, "github", github_delivery(delivery), timeout=10)
            except (OSError, http_client.HTTPException):
                continue
            if status == 200:
                answered[delivery] = status
        return unanswered <= set(answered)
    wait_for(resend_all, 60, interval=0.5, what="every unanswered delivery answered on a retry")

    counts = settled_mail(node, sorted(answered))
    wrong = {d: c for d, c in counts.items() if c != {"cto": 1}}
    assert not wrong, f"{len(wrong)} of {len(counts)} deliveries not exactly one mail: {wrong}"
    assert len(counts) == len(answered) and len(answered) >= 40
