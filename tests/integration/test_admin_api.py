"""``/v1/admin`` on one real data node (roles/ingress/api/admin.py): capacity,
retention, a backup streamed as a tar, and eviction with its gate; all for an
admin token only."""

from __future__ import annotations

import io
import json
import os
import tarfile

import httpx2
import pytest

from crewlet import tokens
from crewlet.estate import backup as estate_backup
from tests.conftest import wait_for
from tests.seats import ctl_json, held, write_company

pytestmark = pytest.mark.timeout(180)

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
ADMIN, READER = tokens.new_token(), tokens.new_token()
COMPANY = """
company: {name: t}
providers: {p: {kind: scripted, rules: [{match: '.*', reply: 'ok'}]}}
seats:
  - {name: w, persona: works, provider: p}
retention: {turns_days: 30}
"""


def test_capacity_retention_backup_and_eviction_over_http(make_node, tmp_path):
    node = make_node(fleet=FAST, ingress={"tokens": [
        {"name": "ops", "sha256": tokens.digest(ADMIN), "scopes": ["admin"]},
        {"name": "viewer", "sha256": tokens.digest(READER), "scopes": ["read"]}]})
    node.start(args=("--company", write_company(node.dir, COMPANY)))
    wait_for(lambda: held(node).get("w"), 30, what="seat w held")
    for n in range(3):
        assert ctl_json(node, "send", "w", f"work {n}", "--wait", "20")["turn"]["outcome"] == "done"
    base = f"http://{node.config['ingress']['listen']}"
    admin = httpx2.Client(base_url=base, timeout=60, trust_env=False, headers={"Authorization": f"Bearer {ADMIN}"})
    reader = httpx2.Client(base_url=base, timeout=60, trust_env=False, headers={"Authorization": f"Bearer {READER}"})
    try:
        for path in ("/v1/admin/capacity", "/v1/admin/retention", "/v1/admin/backup"):
            assert reader.get(path).status_code == 403, path

        cap = admin.get("/v1/admin/capacity").json()
        assert cap["node"] == node.config["node"]["id"]
        assert cap["disk"]["free"] > 0 and cap["disk"]["size"] >= cap["disk"]["free"]
        assert cap["disk"]["floor"] >= 0 and cap["disk"]["low"] is False
        assert cap["copy"]["bytes"] > 0
        log = cap["log"]
        assert log["last_seq"] >= log["first_seq"] >= 1 and log["messages"] >= 3 and log["bytes"] > 0, log
        assert isinstance(cap["snapshots"], list)
        assert set(cap["growth"]) == {"log_bytes_per_day", "floor_reached_at"}

        kept = admin.get("/v1/admin/retention").json()
        assert kept["retention"]["turns_days"] == 30
        assert kept["next"]["turns_recorded_before"] < cap["at"] - 29 * 86400
        assert set(kept) >= {"last_sweep", "removed_in_all"}

        # The backup, streamed: a tar of what crewletctl backup writes, its manifest inside.
        with admin.stream("GET", "/v1/admin/backup") as r:
            assert r.status_code == 200 and r.headers["content-type"] == "application/x-tar"
            assert "crewlet-backup-" in r.headers["content-disposition"]
            data = b"".join(r.iter_bytes())
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = tar.getnames()
            assert "backup/backup.json" in names and "backup/estate/data.mdb" in names, names
            tar.extractall(tmp_path, filter="data")
        made = estate_backup.manifest(str(tmp_path / "backup"))
        assert made["node"] == node.config["node"]["id"] and made["estate"]["seq"] >= 3
        assert json.loads((tmp_path / "backup" / "company.json").read_text())["company"]["company"]["name"] == "t"
        # The working copy in the data dir is gone once the stream ended.
        wait_for(lambda: not [n for n in os.listdir(node.config["data_dir"]) if n.startswith("backup-")], 10,
                 what="the backup's working copy removed")

        # Eviction, with its gate: the only copy in service is not taken without force.
        me = node.config["node"]["id"]
        r = admin.post(f"/v1/admin/evict/{me}", json={"reason": "disk swap"})
        assert r.status_code == 409 and "the only copy of the estate in service" in r.json()["detail"], r.text
        assert admin.post("/v1/admin/evict/nobody-here", json={}).status_code == 404
        assert reader.post(f"/v1/admin/evict/{me}", json={}).status_code == 403
        assert admin.post(f"/v1/admin/evict/{me}", json={"reason": "x", "force": "yes"}).status_code == 422
    finally:
        admin.close()
        reader.close()
