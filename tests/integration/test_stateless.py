"""A node without data, on a real broker: what the fleet's design promises it.

It keeps only a scratch store (``<data_dir>/scratch``: its floor, the
highest log sequence of its own writes, crewlet.estate.floor). Whatever a
previous life left there — a floor, anything else — is gone once crewletd
starts again, a clean stop or a kill -9 before it alike.

It runs no ingress (the API needs the estate), yet takes its share of the
``NOTIFY`` group (crewlet.groups): its seats role makes stored webhook
deliveries mail.
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


def test_a_stateless_node_s_scratch_store_is_wiped_at_every_boot(natsd, make_node):
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
        # Gone — the floor's file may be there again, made anew by this life's
        # first read (the skill registry's walk), never holding the old floor.
        floor, *rest = left
        assert not any(os.path.exists(p) for p in rest), os.listdir(scratch_dir(data_dir))
        if os.path.exists(floor):
            with open(floor, "rb") as f:
                assert f.read() != b"\xff" * 8, "the previous life's floor is still there"
        assert os.stat(scratch_dir(data_dir)).st_mode & 0o777 == 0o700
        # The node works on: its seats role is up, with a store of its own again.
        wait_for(lambda: node.children().get("seats", {}).get("state") == "running", 20,
                 what="the seats role running")


def test_a_node_without_data_takes_its_share_of_the_notify_group(natsd, make_node):
    """No ingress runs on a node without data; its seats role is its share of
    the NOTIFY group: a delivery stored by any node (here, the test) becomes
    mail to its seat, once, with nobody else attached."""
    from crewlet.queue import notify
    from tests.seats import held, mail_of, read_nats, write_company

    node = make_node(node={"id": "notified", "roles": ["seats"]}, fleet=FAST,
                     stream={"type": "nats", "servers": [natsd.url]})
    company = "company: {name: t}\nproviders: {p: {kind: scripted}}\nseats:\n  - {name: w, persona: w, provider: p}\n"
    node.start(args=("--company", write_company(node.dir, company)))
    wait_for(lambda: held(node).get("w") == "notified", 30, what="seat w held")

    async def store(nc, js):
        for n in range(3):
            await notify.store(js, "gh", f"d-{n}", "w", f"delivery {n}")
        await notify.store(js, "gh", "d-0", "w", "delivery 0")  # a repeat: one mail still
    read_nats(natsd.url, store)
    texts = wait_for(lambda: (t := read_nats(natsd.url, lambda nc, js: mail_of("w", nc, js)))
                     and len(t) >= 3 and t, 30, what="the deliveries made mail by the node without data")

    async def idle(nc, js):
        from crewlet import groups
        info = await js.consumer_info(notify.STREAM, groups.durable(groups.NOTIFY))
        return info.num_pending == 0 and info.num_ack_pending == 0
    wait_for(lambda: read_nats(natsd.url, idle), 20, what="NOTIFY drained")
    texts = read_nats(natsd.url, lambda nc, js: mail_of("w", nc, js))
    assert sorted(texts) == ["delivery 0", "delivery 1", "delivery 2"], texts
    node.wait_event("notify_attached", 10, role="seats")
