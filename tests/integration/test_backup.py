"""Backup and restore (crewlet/estate/backup.py, ``crewletctl backup`` and
``restore``) on real nodes: a fleet's tasks, pages, files and turns are all
there after its backup is restored into a fresh fleet, whose seats then write
under their own new tokens; a fleet that already has an estate is refused."""

from __future__ import annotations

import hashlib
import json
import os

import httpx2

from crewlet import tokens
from tests.conftest import wait_for
from tests.integration.test_api import FAST
from tests.seats import ctl

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "company.yaml")


class Api:
    def __init__(self, node):
        self.http = httpx2.Client(base_url=f"http://{node.config['ingress']['listen']}", timeout=60,
                                  trust_env=False)
        self.token = tokens.read_admin_token(node.run_dir)

    def __call__(self, method: str, path: str, *, headers=None, **kw):
        headers = {**(headers or {}), "Authorization": f"Bearer {self.token}"}
        return self.http.request(method, path, headers=headers, **kw)

    def ok(self, method: str, path: str, **kw):
        r = self(method, path, **kw)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r


def _node(make_node, **args):
    node = make_node(fleet=FAST)
    node.start(**args)
    wait_for(lambda: httpx2.get(f"http://{node.config['ingress']['listen']}/readyz",
                                trust_env=False).status_code == 200, 60, what="the node ready")
    return node


def _turns(api: Api, seat: str) -> list[dict]:
    return api.ok("GET", "/v1/turns", params={"seat": seat}).json()["items"]


def test_a_fleet_restored_from_its_backup_has_its_tasks_pages_files_and_turns(make_node, short_tmp):
    old = _node(make_node, args=("--company", SAMPLE))
    api = Api(old)
    task = api.ok("POST", "/v1/tasks", json={"title": "carried over", "body": "by a backup"}).json()["task"]
    api.ok("PUT", "/v1/pages/eng/runbook", json={"title": "Runbook", "body": "restart the thing"})
    blob = os.urandom(300_000)
    api.ok("PUT", "/v1/files/site/logo.bin", content=blob, headers={"Content-Type": "image/png"})
    sent = ctl(old, "send", "ceo", "hello before the backup", "--wait", "60")
    assert sent.returncode == 0, sent.stderr
    wait_for(lambda: _turns(api, "ceo"), 30, what="the ceo's turn recorded")
    turns_before = {t["trigger"] for t in _turns(api, "ceo")}

    dest = os.path.join(short_tmp, "bk")
    out = ctl(old, "backup", dest)
    assert out.returncode == 0, out.stderr
    assert "backed up to" in out.stdout and "1 files" in out.stdout, out.stdout
    assert os.stat(dest).st_mode & 0o077 == 0
    made = json.load(open(os.path.join(dest, "backup.json")))
    assert made["estate"]["seq"] > 0 and made["company_rev"] == 1

    # The old fleet has an estate: it is not restored into.
    refused = ctl(old, "restore", dest)
    assert refused.returncode == 1 and "not empty" in refused.stderr, refused.stderr

    new = _node(make_node)
    out = ctl(new, "restore", dest)
    assert out.returncode == 0, out.stderr
    fresh = Api(new)
    wait_for(lambda: fresh("GET", f"/v1/tasks/{task['id']}").status_code == 200, 60,
             what="the restored estate served")
    assert fresh.ok("GET", f"/v1/tasks/{task['id']}").json()["task"]["title"] == "carried over"
    assert fresh.ok("GET", "/v1/pages/eng/runbook").json()["body"] == "restart the thing"
    got = fresh.ok("GET", "/v1/files/site/logo.bin")
    assert hashlib.sha256(got.content).digest() == hashlib.sha256(blob).digest()
    assert got.headers["content-type"] == "image/png"
    assert turns_before <= {t["trigger"] for t in _turns(fresh, "ceo")}
    wait_for(lambda: "estate_bootstrapped" in new.read_log(), 5, what="the copy started from the backup")
    # The company came along, and its seats work here under the new fleet's tokens.
    wait_for(lambda: fresh("GET", "/v1/company").json().get("rev"), 30, what="the company applied")
    sent = ctl(new, "send", "ceo", "create a task after the restore", "--wait", "60")
    assert sent.returncode == 0, sent.stderr
    wait_for(lambda: any(t["title"] == "after the restore"
                         for t in fresh.ok("GET", "/v1/tasks").json()["items"]), 30,
             what="a task written by a seat of the new fleet")
