"""The reconcile duty against a local server speaking GitHub's deliveries API
(roles/workers/duties/reconcile.py), on one real node.

GitHub's record of four deliveries of one webhook: one answered 200 (mail
already); one GitHub saw time out that the node stored all the same; one that
failed with a 502 while no ingress could take it; one that timed out and was
never stored. The duty asks GitHub to redeliver the last two, once each —
the server then delivers them to the node's ``/v1/hooks/gh`` signed as GitHub
signs, as GitHub would — and each of the four is worked exactly once. Later
looks ask nothing more: the redeliveries are 200s in GitHub's record now.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.integration.test_hooks_api import github_delivery, post_hook
from tests.seats import held, node_url, read_nats, turn_records, write_company

pytestmark = pytest.mark.timeout(180)

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
HOOK_SECRET = "reconcile-hook-secret-0123"
TOKEN = "ghp_reconcile_test_token_0123456789"
COMPANY = """
company: {{name: t}}
providers: {{p: {{kind: scripted, rules: [{{match: '.*', reply: 'ok'}}]}}}}
seats:
  - {{name: w, persona: works, provider: p}}
integrations:
  gh:
    kind: github
    secret_env: CW_TEST_RECON_HOOK
    routes: [{{seat: w}}]
    reconcile: {{repository: acme/web, hook_id: 7, token_env: CW_TEST_RECON_TOKEN, api_url: '{api}', every: 1}}
"""


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeGitHub:
    """The part of GitHub's REST API the duty uses: a hook's deliveries, two a
    page (so the duty follows ``Link: rel="next"``), and redelivery, which
    sends the delivery to *hook_url* as GitHub would and records the attempt."""

    def __init__(self) -> None:
        self.deliveries: list[dict[str, Any]] = []      # newest first
        self.bodies: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.asked: list[str] = []                      # GUIDs redelivery was asked for
        self.looks = 0
        self.hook_url = ""
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def record(self, guid: str, status: int, body: tuple[bytes, dict[str, str]], ago: float = 60) -> None:
        with self.lock:
            self.bodies[guid] = body
            self.deliveries.insert(0, {"id": len(self.deliveries) + 1000, "guid": guid, "status_code": status,
                                       "delivered_at": _stamp(time.time() - ago), "redelivery": False,
                                       "event": "issues", "action": "opened"})
            self.deliveries.sort(key=lambda d: d["delivered_at"], reverse=True)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(401, {"message": "Bad credentials"})
                    return False
                return True

            def do_GET(self) -> None:
                m = re.fullmatch(r"/repos/acme/web/hooks/7/deliveries\?per_page=\d+(?:&cursor=(\d+))?", self.path)
                if m is None:
                    return self._send(404, {"message": "Not Found"})
                if not self._authorized():
                    return
                start = int(m.group(1) or 0)
                with fake.lock:
                    fake.looks += start == 0
                    page = fake.deliveries[start:start + 2]
                    more = start + 2 < len(fake.deliveries)
                link = {"Link": f'<{fake.url}/repos/acme/web/hooks/7/deliveries?per_page=2&cursor={start + 2}>; '
                                'rel="next"'} if more else {}
                self._send(200, page, link)

            def do_POST(self) -> None:
                m = re.fullmatch(r"/repos/acme/web/hooks/7/deliveries/(\d+)/attempts", self.path)
                if m is None:
                    return self._send(404, {"message": "Not Found"})
                if not self._authorized():
                    return
                with fake.lock:
                    found = next((d for d in fake.deliveries if d["id"] == int(m.group(1))), None)
                if found is None:
                    return self._send(404, {"message": "Not Found"})
                body, headers = fake.bodies[found["guid"]]
                req = urllib.request.Request(fake.hook_url, data=body, method="POST",
                                             headers={**headers, "Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        status = r.status
                except urllib.error.HTTPError as exc:
                    status = exc.code
                with fake.lock:
                    fake.asked.append(found["guid"])
                    fake.deliveries.insert(0, {"id": len(fake.deliveries) + 2000, "guid": found["guid"],
                                               "status_code": status, "delivered_at": _stamp(time.time()),
                                               "redelivery": True, "event": "issues", "action": "opened"})
                self._send(202, {})

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def test_missed_github_deliveries_are_redelivered_once_and_become_mail_once(make_node, monkeypatch):
    monkeypatch.setenv("CW_TEST_RECON_HOOK", HOOK_SECRET)
    monkeypatch.setenv("CW_TEST_RECON_TOKEN", TOKEN)
    github = FakeGitHub()
    try:
        node = make_node(fleet=FAST)
        node.start(args=("--company", write_company(node.dir, COMPANY.format(api=github.url))))
        wait_for(lambda: held(node).get("w"), 30, what="seat w held")
        github.hook_url = f"http://{node.config['ingress']['listen']}/v1/hooks/gh"
        sent = {g: github_delivery(g, secret=HOOK_SECRET) for g in ("g-ok", "g-timed-out-stored",
                                                                    "g-failed", "g-timed-out-lost")}
        # Two reached the node (one of them GitHub saw time out); two never did.
        for guid in ("g-ok", "g-timed-out-stored"):  # (a 503 while ingress starts: stored nothing, sent again)
            wait_for(lambda: post_hook(node, "gh", sent[guid])[0] == 200, 20, what=f"{guid} taken")
        for n, (guid, status) in enumerate((("g-ok", 200), ("g-timed-out-stored", 0), ("g-failed", 502),
                                            ("g-timed-out-lost", 0))):
            github.record(guid, status, sent[guid], ago=60 - n)

        wait_for(lambda: sorted(github.asked) == ["g-failed", "g-timed-out-lost"], 30, interval=0.2,
                 what="the missed deliveries redelivered")
        looked = github.looks
        wait_for(lambda: github.looks >= looked + 3, 20, interval=0.2, what="three more looks")
        assert sorted(github.asked) == ["g-failed", "g-timed-out-lost"], github.asked  # each once
        # Each worked once (its mail may be trimmed from the mailbox once worked: the turns say).
        def worked() -> dict[str, int]:
            counts = {g: 0 for g in sent}
            for r in read_nats(node_url(node), turn_records):
                if r["trigger"] in counts and r["outcome"] == "done":
                    counts[r["trigger"]] += 1
            return counts
        wait_for(lambda: worked() == {g: 1 for g in sent}, 30, what=f"each delivery worked once ({worked()})")
        wait_for(lambda: "reconcile_redelivered" in node.read_log(), 5, what="the redelivery said")
        assert TOKEN not in node.read_log()
    finally:
        github.stop()
