"""Issue 16 on a real node: a forged fence locks no seat out, and the node's
data is its user's only (crewlet.private, roles/data_applier/grants.py)."""

from __future__ import annotations

import asyncio
import os
import stat

from crewlet.estate import store
from crewlet.estate.ops import make_op
from tests.conftest import wait_for
from tests.estate import copy_of, publish_to
from tests.fleet.test_estate_fleet import estate_company, turn
from tests.fleet.test_fleet import apply
from tests.seats import held, node_url, read_nats, write_company


async def _leases_last(nc, js) -> int:
    return (await js.stream_info("KV_leases")).state.last_seq


def test_a_forged_fence_does_not_lock_the_seat_out_and_the_data_dir_is_private(make_node, short_tmp):
    node = make_node(node={"id": "t1", "labels": {"zone": "z"}})
    data_dir = node.config["data_dir"]
    # An install made before the rule: everything readable by everybody.
    os.makedirs(os.path.join(data_dir, "estate"), mode=0o755)
    os.chmod(data_dir, 0o755)
    os.chmod(os.path.join(data_dir, "estate"), 0o755)
    with open(os.path.join(data_dir, "estate", "leftover"), "w") as f:
        f.write("x")
    os.chmod(os.path.join(data_dir, "estate", "leftover"), 0o644)
    node.start()
    tightened = node.events_named("data_dir_tightened")
    assert tightened and tightened[0]["count"] >= 3, tightened

    apply(node, write_company(short_tmp, estate_company("z")))
    wait_for(lambda: held(node).get("w") == "t1", 30, what="t1 holds w")
    turn(node, "w", "create a task before")
    token = next(s["token"] for s in node.status()["fleet"]["seats"] if s["name"] == "w")

    # Forged fences, published straight to the log as anyone with the
    # broker's credentials could: the right seat and node, tokens no lease
    # granted (far past the bucket; the bucket's last revision, a renewal or
    # another key's).
    last = read_nats(node_url(node), _leases_last)
    forged = [make_op("seat.fence", {}, node="t1", seat="w", token=10**12, id="forged-1"),
              make_op("seat.fence", {}, node="t1", seat="w", token=last, id="forged-2")]
    forged = [o for o in forged if o.token != token]
    asyncio.run(publish_to(node_url(node), forged))

    def outcomes():
        copy = copy_of(node)
        got = [store.Reader(copy).outcome(o.id, o.token) for o in forged] if copy else []
        return got if got and all(got) else None
    for outcome in wait_for(outcomes, 20, what="the forged fences applied"):
        assert outcome["ok"] is False and "not a lease the fleet granted" in outcome["error"], outcome

    # The seat's next write still lands.
    after = turn(node, "w", "create a task after the forgery")
    assert "created T" in after["reply"], after

    # Every directory 0700, every file 0600 (sockets too: only the same user
    # connects), the data dir's and whatever was there before.
    loose = []
    for root, dirs, files in os.walk(data_dir):
        for path in [root] + [os.path.join(root, f) for f in files]:
            mode = os.lstat(path).st_mode
            want = 0o700 if stat.S_ISDIR(mode) else 0o600
            if stat.S_IMODE(mode) != want and not (stat.S_ISSOCK(mode) and not mode & 0o077):
                loose.append(f"{stat.filemode(mode)} {path}")
    assert not loose, loose
    assert os.path.exists(os.path.join(data_dir, "estate", "data.mdb"))
