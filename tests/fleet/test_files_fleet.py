"""A file upload cut short by a kill -9 of the node taking it: what it left in
the fleet's store is removed by the collector (on another node) once older
than ``files.grace``, and never earlier."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx2
import nats
import pytest

from crewlet import tokens
from tests.conftest import wait_for
from tests.fleet.test_fleet import fleet_node

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
    keeper = fleet_node(make_node, natsd, "keeper", node={"roles": ["data", "workers"]}, files=FILES).start()
    taker = fleet_node(make_node, natsd, "taker", node={"roles": ["data", "ingress"]}, files=FILES).start()
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
    # And removed once older.
    wait_for(lambda: _chunks(natsd.url) == 0, GRACE + 20, what="the cut upload collected")
    assert time.time() >= stored + GRACE - 1.5
