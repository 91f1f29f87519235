"""The ``objects`` slot (crewlet.objects.slot): the first node records which
store the company's files are in, and a node configured with another refuses
to boot — exit 78, naming its config file, both stores and who recorded the
fleet's — having taken nothing."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from tests.conftest import wait_for
from tests.fleet.test_fleet import company, apply, fleet_node, seats_of

pytestmark = pytest.mark.fleet


def _slot(url: str) -> dict:
    async def read() -> dict:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value("objects")
            return json.loads((await kv.get("store")).value)
        finally:
            await nc.close()
    return asyncio.run(read())


def test_a_node_configured_with_another_store_is_refused_naming_both(natsd, make_node, short_tmp):
    first = fleet_node(make_node, natsd, "f1").start()
    apply(first, company(short_tmp, 4))
    wait_for(lambda: len(seats_of(first)) == 4, 30, what="4 seats held")
    assert _slot(natsd.url)["store"] == "nats:files"
    assert _slot(natsd.url)["node"] == "f1"
    tokens = {s["name"]: s["token"] for s in first.status()["fleet"]["seats"]}

    for other_files, named in (({"bucket": "elsewhere"}, "nats:elsewhere"),
                               ({"store": "s3", "bucket": "files", "endpoint": "http://127.0.0.1:9"},
                                "s3:http://127.0.0.1:9/files")):
        other = fleet_node(make_node, natsd, "f2", files=other_files)
        other.start(wait_ready=False)
        assert other.wait_exit(30) == 78
        text = other.read_log()
        assert f"{other.config_path}: files:" in text, text[-2000:]
        assert named in text and "nats:files" in text and "recorded by node f1" in text, text[-2000:]
        # Said as one line on stderr, the last crewletd writes (the node's roles, up for a
        # moment meanwhile as they are while a fleet forms, log what they log).
        assert text.strip().splitlines()[-1].startswith("crewletd: configuration error: "), text[-2000:]
    # Nothing was taken from the node whose store it is, and the record stands.
    assert {s["name"]: s["token"] for s in first.status()["fleet"]["seats"]} == tokens
    assert _slot(natsd.url)["store"] == "nats:files"
    # A node of the same store joins.
    same = fleet_node(make_node, natsd, "f3").start()
    assert same.proc.poll() is None
