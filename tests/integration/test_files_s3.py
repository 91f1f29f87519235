"""A node whose ``files:`` section names an S3 store (``store: s3``, the
secret key from a 0600 file): uploads go to the bucket on a real S3-compatible
server (moto, started on 127.0.0.1 by tests/integration/test_objects.py's
fixture), downloads come back from it, and the ``objects`` slot records it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os

import httpx2
import nats

from crewlet import tokens
from tests.conftest import wait_for
from tests.integration.test_api import FAST
from tests.integration import test_objects
from tests.integration.test_objects import S3_KEYS
from tests.seats import node_url

BUCKET = "company-files"
moto_s3 = test_objects.moto_s3  # the fixture: a moto S3 server on 127.0.0.1


def _objects(url: str) -> list[str]:
    import boto3
    s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id=S3_KEYS["access_key"],
                      aws_secret_access_key=S3_KEYS["secret_key"], region_name=S3_KEYS["region"])
    return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def test_a_node_with_an_s3_store_keeps_its_files_there(moto_s3, make_node, short_tmp):
    import boto3
    boto3.client("s3", endpoint_url=moto_s3, aws_access_key_id=S3_KEYS["access_key"],
                 aws_secret_access_key=S3_KEYS["secret_key"],
                 region_name=S3_KEYS["region"]).create_bucket(Bucket=BUCKET)
    secret = os.path.join(short_tmp, "s3-secret")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(S3_KEYS["secret_key"])
    node = make_node(fleet=FAST, files={"store": "s3", "bucket": BUCKET, "endpoint": moto_s3,
                                        "region": S3_KEYS["region"], "access_key": S3_KEYS["access_key"],
                                        "secret_key_file": secret}).start()
    base = f"http://{node.config['ingress']['listen']}"
    wait_for(lambda: httpx2.get(base + "/readyz", trust_env=False).status_code == 200, 60, what="ready")
    auth = {"Authorization": f"Bearer {tokens.read_admin_token(node.run_dir)}"}
    blob = os.urandom(9 * 1024 * 1024)  # past one 8 MiB part: a multipart upload
    r = httpx2.put(base + "/v1/files/site/video.bin", content=blob, headers=auth, trust_env=False, timeout=60)
    assert r.status_code == 201, r.text
    assert [k for k in _objects(moto_s3) if k.startswith("files/site/")] == [r.json()["object"]]
    got = httpx2.get(base + "/v1/files/site/video.bin", headers=auth, trust_env=False, timeout=60)
    assert got.status_code == 200 and hashlib.sha256(got.content).digest() == hashlib.sha256(blob).digest()

    async def slot():
        nc = await nats.connect(node_url(node))
        try:
            return json.loads((await (await nc.jetstream().key_value("objects")).get("store")).value)
        finally:
            await nc.close()
    assert asyncio.run(slot())["store"] == f"s3:{moto_s3}/{BUCKET}"
