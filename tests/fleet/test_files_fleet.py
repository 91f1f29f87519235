"""Files across nodes: an upload cut short by a kill -9 of the node taking it
is removed by the collector (on another node) once older than
``files.grace``, and never earlier; a seat on a leaf node without data writes
and reads files through the members' JetStream domain."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import httpx2
import nats
import pytest

from crewlet import tokens
from tests.conftest import start_all, wait_for
from tests.fleet.test_cluster import make_members, start_alone
from tests.fleet.test_fleet import fleet_node
from tests.seats import ctl, held

pytestmark = pytest.mark.fleet

GRACE = 6.0
FILES = {"grace": GRACE, "collect_every": 1}


def _chunks(url: str) -> int:
    """Messages in the files bucket's stream (chunks and metas)."""
    async def read() -> int:
        nc = await nats.connect(url)
        try:
            return (await nc.jetstream().stream_info("OBJ_files")).state.messages
        finally:
            await nc.close()
    return asyncio.run(read())


def test_an_upload_cut_by_a_kill_9_is_collected_after_its_grace_and_never_earlier(natsd, make_node):
    keeper, taker = start_all([fleet_node(make_node, natsd, "keeper", node={"roles": ["data", "workers"]}, files=FILES),
                               fleet_node(make_node, natsd, "taker", node={"roles": ["data", "ingress"]}, files=FILES)])
    base = f"http://{taker.config['ingress']['listen']}"
    wait_for(lambda: httpx2.get(base + "/readyz", trust_env=False).status_code == 200, 60,
             what="the taker's ingress ready")
    token = tokens.read_admin_token(taker.run_dir)
    sent = threading.Event()

    def body():
        for _ in range(8):  # 8 x 256 KiB, then it waits for ever: the node dies mid-upload
            yield b"x" * 262_144
        sent.set()
        time.sleep(120)

    def upload():
        try:
            httpx2.put(base + "/v1/files/site/big.bin", content=body(), trust_env=False, timeout=150,
                       headers={"Authorization": f"Bearer {token}"})
        except Exception:
            pass  # the node died under it

    threading.Thread(target=upload, daemon=True).start()
    assert sent.wait(30)
    wait_for(lambda: _chunks(natsd.url) >= 8, 20, what="the upload's chunks stored")
    stored = time.time()  # the last chunk is no younger than this
    taker.kill_tree()

    # Kept while younger than the grace: the collector walks every second meanwhile.
    wait_for(lambda: "objects_collected" in keeper.read_log(), 20, what="the collector walking")
    while time.time() < stored + GRACE - 1.5:
        assert _chunks(natsd.url) >= 8, "collected before its grace"
        time.sleep(0.25)
    # And removed once older — by the collector's sweep of a dead writer's leftovers,
    # the first walk that swept anything coming after the grace, and saying so.
    wait_for(lambda: _chunks(natsd.url) == 0, GRACE + 20, what="the cut upload collected")
    # (crewletd forwards its children's lines up to a quarter second late.)
    swept = wait_for(lambda: [e for e in keeper.events()
                              if e.get("event") == "objects_collected" and e.get("swept")],
                     10, what="the sweep said in the keeper's log")
    assert swept[0]["error"] is None, swept
    assert swept[0]["ts"] >= stored + GRACE - 1.5, (swept[0]["ts"] - stored, swept)


LEAF_COMPANY = """\
company: {name: Leafy}
providers:
  p:
    kind: scripted
    rules:
      - match: 'store (.+)'
        reply: '{tools}'
        tools:
          - name: file_write
            args: {project: site, path: leaf.txt, text: '\\1'}
      - match: 'read it'
        reply: '{tools}'
        tools:
          - name: file_read
            args: {project: site, path: leaf.txt}
seats:
  - {name: scribe, persona: keeps files, provider: p, placement: {labels: {where: leaf}}}
"""


def test_a_seat_on_a_leaf_writes_and_reads_files_through_the_domain(make_node, short_tmp):
    """A seat held by a node without data, on a leaf of the members: its
    file_write puts the object's chunks and meta through the members'
    JetStream domain; a member's API serves the file, and the seat reads it back."""
    members, leaf_urls = make_members(make_node, ids=("la", "lb", "lc"), cluster="filesleaf")
    leaf = make_node(node={"id": "ld", "roles": ["seats"], "labels": {"where": "leaf"}},
                     stream={"replicas": 3, "leaf": {"remotes": leaf_urls}})
    for node in members:
        start_alone(node)
    leaf.start(wait_ready=False)
    for node in (*members, leaf):
        node.wait_running(timeout=90)
    path = os.path.join(short_tmp, "leafy.yaml")
    with open(path, "w") as f:
        f.write(LEAF_COMPANY)
    done = ctl(members[0], "apply", path, timeout=120)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: held(members[0]).get("scribe") == "ld", 90, interval=0.5, what="the scribe held by the leaf")
    # The member that is asked has the company itself (its control plane follows on its own: a
    # moment behind the leaf's, on a loaded machine).
    wait_for(lambda: ((members[0].status() or {}).get("fleet") or {}).get("company"), 60, interval=0.5,
             what="the company applied on the member asked")
    sent = ctl(members[0], "send", "scribe", "store written from a leaf", "--wait", "90", timeout=120)
    assert sent.returncode == 0 and "wrote site/leaf.txt" in sent.stdout, sent.stdout + sent.stderr
    there = f"http://{members[0].config['ingress']['listen']}"
    got = wait_for(lambda: (r := httpx2.get(there + "/v1/files/site/leaf.txt", trust_env=False, timeout=60,
                                            headers={"Authorization": f"Bearer {tokens.read_admin_token(members[0].run_dir)}"}))
                   .status_code == 200 and r, 30, interval=0.5, what="the file served by a member")
    assert got.content == b"written from a leaf"
    read = ctl(members[0], "send", "scribe", "read it", "--wait", "90", timeout=120)
    assert read.returncode == 0 and "written from a leaf" in read.stdout, read.stdout + read.stderr
    assert leaf.refused_roles() == []
