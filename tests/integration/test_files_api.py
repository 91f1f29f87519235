"""A company's files over the API (roles/ingress/api/files.py), on a real node
over real HTTP: PUT streams the bytes into the node's file store (the broker's
object store bucket) and writes the row, GET streams them back, DELETE removes
the row; ``files.max_bytes`` is a 413 with nothing left behind.

One node serves the module: ``files.max_bytes`` of 5 MiB, past the default
``ingress.max_body`` of 4 MiB (uploads are held to the files limit alone), tokens
for each scope.
The bucket is read over NATS only to see that a refused upload left no object.
"""

from __future__ import annotations

import hashlib
import os

import httpx2
import pytest

from crewlet import tokens
from crewlet.objects.nats import NatsObjectStore
from tests.conftest import Nodes, wait_for
from tests.integration.test_api import FAST
from tests.seats import node_url, read_nats

MIB = 1024 * 1024
MAX_BYTES = 5 * MIB
PROBLEM = "application/problem+json"
SECRETS = {scope: tokens.new_token() for scope in ("read", "write")}


class Api:
    def __init__(self, node):
        self.node = node
        self.http = httpx2.Client(base_url=f"http://{node.config['ingress']['listen']}", timeout=60,
                                  trust_env=False)

    def __call__(self, method: str, path: str, *, as_: str | None = "write", headers=None, **kw):
        headers = dict(headers or {})
        if as_ is not None:
            headers["Authorization"] = f"Bearer {SECRETS[as_]}"
        return self.http.request(method, path, headers=headers, **kw)


def _started(nodes: Nodes, **overrides) -> Api:
    node = nodes(fleet=FAST, ingress={**overrides.pop("ingress", {}), "tokens": [
        {"name": f"{scope}er", "sha256": tokens.digest(secret), "scopes": [scope]}
        for scope, secret in SECRETS.items()]}, **overrides)
    node.start()
    api = Api(node)
    # The estate in service (the applier caught up): writes are taken from here on.
    wait_for(lambda: api.http.get("/readyz").status_code == 200, 60, what="the node ready")
    return api


@pytest.fixture(scope="module")
def api():
    nodes = Nodes()
    try:
        api = _started(nodes, files={"max_bytes": MAX_BYTES})
        yield api
        api.http.close()
    finally:
        nodes.close()


def objects(api: Api, project: str) -> list[str]:
    """The names of the bucket's objects for *project*'s files."""
    async def names(nc, js):
        store = NatsObjectStore(js, nc, bucket="files")
        return [info.name async for info in store.names() if info.name.startswith(f"files/{project}/")]
    return read_nats(node_url(api.node), names)


def listed(api: Api, project: str) -> list[dict]:
    r = api("GET", "/v1/files", params={"project": project}, as_="read")
    assert r.status_code == 200, r.text
    return r.json()["items"]


def problem(r, status: int, code: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["code"] == code, body
    return body


def chunked(data: bytes, size: int = 256 * 1024):
    """*data* as a generator: httpx sends it chunked, with no Content-Length."""
    for at in range(0, len(data), size):
        yield data[at:at + size]


def test_upload_list_download_replace_delete(api):
    data = os.urandom(3 * MIB + 12345)
    digest = hashlib.sha256(data).hexdigest()
    url = "/v1/files/site/reports/q3 résumé.bin"

    r = api("PUT", url, content=data, headers={"Content-Type": "application/x-report"})
    assert r.status_code == 201, r.text
    row = r.json()
    assert (row["project"], row["path"], row["size"], row["sha256"], row["version"]) == \
        ("site", "reports/q3 résumé.bin", len(data), digest, 1)
    assert row["content_type"] == "application/x-report"

    assert [(f["path"], f["size"], f["sha256"]) for f in listed(api, "site")] == \
        [("reports/q3 résumé.bin", len(data), digest)]

    r = api("GET", url, as_="read")
    assert r.status_code == 200, r.text
    assert hashlib.sha256(r.content).hexdigest() == digest and r.content == data
    assert r.headers["content-type"] == "application/x-report"
    assert r.headers["content-length"] == str(len(data))
    assert r.headers["etag"] == f'"{digest}"'
    assert r.headers["content-disposition"] == \
        "attachment; filename=\"q3 r_sum_.bin\"; filename*=UTF-8''q3%20r%C3%A9sum%C3%A9.bin"
    head = api("HEAD", url, as_="read")
    assert head.status_code == 200 and head.headers["content-length"] == str(len(data))
    assert head.headers["etag"] == f'"{digest}"' and head.content == b""

    # Uploaded again, chunked (no Content-Length): a new version, a new object.
    again = os.urandom(2 * MIB + 1)
    r = api("PUT", url, content=chunked(again), headers={"Content-Type": "text/plain"})
    assert r.status_code == 200, r.text
    assert (r.json()["version"], r.json()["size"]) == (2, len(again))
    r = api("GET", url, as_="read")
    assert r.content == again and r.headers["content-type"].startswith("text/plain")
    assert len(objects(api, "site")) == 2  # the first one is the collector's now

    # An upload without a Content-Type is served as octets.
    r = api("PUT", "/v1/files/site/empty", content=b"")
    assert r.status_code == 201 and r.json()["size"] == 0, r.text
    r = api("GET", "/v1/files/site/empty", as_="read")
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-type"] == "application/octet-stream"

    problem(api("DELETE", url, params={"expect_version": 1}), 409, "conflict")
    r = api("DELETE", url)
    assert r.status_code == 204, r.text
    body = problem(api("GET", url, as_="read"), 404, "not_found")
    assert body["detail"] == "no file reports/q3 résumé.bin in project site"
    assert api("HEAD", url, as_="read").status_code == 404
    problem(api("DELETE", url), 404, "not_found")
    assert [f["path"] for f in listed(api, "site")] == ["empty"]


def test_scopes_and_bad_names(api):
    problem(api("PUT", "/v1/files/site/x.txt", content=b"x", as_="read"), 403, "forbidden")
    problem(api("GET", "/v1/files/site/x.txt", as_=None), 401, "unauthorized")
    problem(api("DELETE", "/v1/files/site/x.txt", as_="read"), 403, "forbidden")
    body = problem(api("PUT", "/v1/files/-bad/x.txt", content=b"x"), 422, "invalid")
    assert "project" in body["detail"]
    body = problem(api("PUT", "/v1/files/site/" + "p" * 301, content=b"x"), 422, "invalid")
    assert "path" in body["detail"]
    problem(api("PUT", "/v1/files/site/x.txt", content=b"x", headers={"Content-Type": "a/" + "b" * 250}),
            422, "invalid")
    r = api("GET", "/v1/files", params={"project": "site"}, as_="read")
    assert "x.txt" not in [f["path"] for f in r.json()["items"]]


def test_past_max_bytes_is_a_413_and_nothing_is_stored(api):
    over = os.urandom(MAX_BYTES + 1)
    # By its Content-Length: refused before a byte is read.
    body = problem(api("PUT", "/v1/files/big/over.bin", content=over), 413, "file_too_large")
    assert f"{MAX_BYTES:,} bytes: files.max_bytes" in body["detail"] and "nothing was stored" in body["detail"]
    # Chunked: refused once the stream passes the limit.
    body = problem(api("PUT", "/v1/files/big/over.bin", content=chunked(over)), 413, "file_too_large")
    assert "files.max_bytes" in body["detail"]
    assert listed(api, "big") == []
    assert objects(api, "big") == []
    # Exactly the limit is taken.
    exact = over[:MAX_BYTES]
    r = api("PUT", "/v1/files/big/exact.bin", content=chunked(exact))
    assert r.status_code == 201 and r.json()["size"] == MAX_BYTES, r.text
    assert api("GET", "/v1/files/big/exact.bin", as_="read").content == exact
    # A refused new version leaves the old one as it was.
    problem(api("PUT", "/v1/files/big/exact.bin", content=chunked(over)), 413, "file_too_large")
    assert [(f["path"], f["version"]) for f in listed(api, "big")] == [("exact.bin", 1)]
    assert len(objects(api, "big")) == 1


def test_files_max_bytes_governs_uploads_not_ingress_max_body(make_node):
    """A file past ``ingress.max_body`` (4 MiB by default) but within
    ``files.max_bytes`` is taken: the upload route is exempt from the body limit."""
    api = _started(make_node)
    data = os.urandom(4 * MIB + 1)
    try:
        r = api("PUT", "/v1/files/site/big.bin", content=chunked(data))
        assert r.status_code == 201, r.text
        assert hashlib.sha256(api("GET", "/v1/files/site/big.bin", as_="read").content).digest() == \
            hashlib.sha256(data).digest()
    finally:
        api.http.close()


def test_a_retried_upload_with_its_idempotency_key_registers_once(api):
    key = {"Idempotency-Key": "upload-once-1"}
    first = api("PUT", "/v1/files/retry/a.txt", content=b"first", headers=key)
    assert first.status_code == 201, first.text
    # Sent again (its answer lost, say): the first outcome, not a second version.
    again = api("PUT", "/v1/files/retry/a.txt", content=b"first", headers=key)
    assert again.status_code == 201 and again.json() == first.json(), again.text
    assert [f["version"] for f in listed(api, "retry")] == [1]
    assert api("GET", "/v1/files/retry/a.txt", as_="read").content == b"first"
    problem(api("PUT", "/v1/files/retry/a.txt", content=b"x", headers={"Idempotency-Key": "not a key"}),
            400, "bad_idempotency_key")
