"""A stateless node's scratch store is wiped at every boot (crewlet.estate.floor).

A node without the data role keeps only a scratch store (``<data_dir>/scratch``:
its floor, the highest log sequence of its own writes). Whatever a previous
life left there — a floor, anything else — is gone once crewletd starts again,
a clean stop or a kill -9 before it alike.
"""

from __future__ import annotations

import os
import signal

from crewlet.estate.floor import FILE, scratch_dir
from tests.conftest import wait_for

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}


def _litter(data_dir: str) -> list[str]:
    scratch = scratch_dir(data_dir)
    os.makedirs(os.path.join(scratch, "left", "over"), exist_ok=True)
    paths = [os.path.join(scratch, FILE), os.path.join(scratch, "left", "over", "file")]
    for path in paths:
        with open(path, "wb") as f:
            f.write(b"\xff" * 8)  # a floor far ahead: would hold every read back for ever
    return paths


def test_a_stateless_node_s_scratch_store_is_wiped_at_every_boot(make_node, natsd):
    node = make_node(node={"id": "scratchy", "roles": ["seats"]}, fleet=FAST,
                     stream={"type": "nats", "servers": [natsd.url]})
    data_dir = node.config["data_dir"]
    for stop in (None, signal.SIGTERM, signal.SIGKILL):
        if stop is not None:
            if stop == signal.SIGKILL:
                node.kill_tree()
            else:
                node.proc.send_signal(stop)
                assert node.wait_exit(30) == 0
        left = _litter(data_dir)
        node.start()
        assert os.path.isdir(scratch_dir(data_dir))
        assert not any(os.path.exists(p) for p in left), os.listdir(scratch_dir(data_dir))
        assert os.stat(scratch_dir(data_dir)).st_mode & 0o777 == 0o700
        # The node works on: its seats role is up, with a store of its own again.
        wait_for(lambda: node.children().get("seats", {}).get("state") == "running", 20,
                 what="the seats role running")
