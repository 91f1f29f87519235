"""Issue 24 §3, the sharp edges a probe found, each on a real node over real
sockets on loopback:

* file paths are held to the page paths' rule (``..``, ``a//b``, NUL,
  ``.hidden``, a right-to-left override, a backslash): a 422 naming what is
  wrong, nothing stored; a good path with spaces and accents still works;
* an Idempotency-Key reused with another body is a 422
  ``idempotency_key_reused`` naming the key, and the second write is not
  dropped silently; the same request again still answers its first result;
  a request refused as invalid does not keep the key;
* a WebSocket client that leaves before authenticating logs no error;
* a client trickling its headers a byte a second is cut (408) within the
  header deadline, while a normal client is served meanwhile.

One node serves the module (tokens for read and write).
"""

from __future__ import annotations

import json
import socket
import time
import uuid

import pytest

from crewlet.estate import ops
from roles.ingress import deadlines
from tests.conftest import Nodes, wait_for
from tests.integration.test_files_api import Api, _started, listed, problem


@pytest.fixture(scope="module")
def api():
    nodes = Nodes()
    try:
        api = _started(nodes)
        yield api
        api.http.close()
    finally:
        nodes.close()


def key() -> dict:
    return {"Idempotency-Key": uuid.uuid4().hex}


# ------------------------------------------------------------------ file paths

@pytest.mark.parametrize("raw, why", [
    ("%2e%2e/%2e%2e/etc/passwd", "'.' or '..' segment"),
    ("a/%2E/b", "'.' or '..' segment"),
    ("a//b", "empty segment"),
    ("a/", "empty segment"),
    ("a%00b", "control character (U+0000)"),
    ("a%1bb", "control character (U+001B)"),
    (".hidden", "starting with '.'"),
    ("docs/.env", "starting with '.'"),
    ("invoice%E2%80%AEfdp.exe", "bidi control (U+202E)"),
    ("a%E2%81%A6b", "bidi control (U+2066)"),
    ("a%5Cb", "'\\'"),
    ("%20lead", "starting with a space"),
])
def test_a_file_path_outside_the_rule_is_a_422_with_its_reason_and_nothing_is_stored(api, raw, why):
    project = "edge" + uuid.uuid4().hex[:8]
    r = api("PUT", f"/v1/files/{project}/{raw}", content=b"x")
    body = problem(r, 422, "invalid")
    assert why in body["detail"] and "segments joined by single '/'" in body["detail"], body
    assert listed(api, project) == []
    for method in ("GET", "DELETE"):
        problem(api(method, f"/v1/files/{project}/{raw}"), 422, "invalid")


def test_a_file_path_within_the_rule_keeps_its_spaces_case_and_accents(api):
    r = api("PUT", "/v1/files/edge/Reports/Q3 résumé <final>.txt", content=b"ok")
    assert r.status_code == 201, r.text
    got = api("GET", "/v1/files/edge/Reports/Q3 résumé <final>.txt", as_="read")
    assert got.content == b"ok"
    assert got.headers["content-disposition"] == (
        "attachment; filename=\"Q3 r_sum_ <final>.txt\"; filename*=UTF-8''Q3%20r%C3%A9sum%C3%A9%20%3Cfinal%3E.txt")


def test_the_estate_refuses_a_bad_file_path_from_any_writer():
    # What the applier checks every op it applies by (so a bad path arriving
    # from the log is refused, as its outcome), and the seats' file tools too.
    for path in ("../../etc/passwd", "a//b", "a\x00b", ".hidden", "x\u202etxt.exe"):
        with pytest.raises(ops.OpError, match="file.register: path"):
            ops.Op(id="o1", kind="file.register", args={"project": "p", "path": path, "size": 0,
                                                         "sha256": "0" * 64},
                   seat=None, token=None, node="n", at=1.0).check()
        with pytest.raises(ops.OpError, match="file.get: path"):
            ops.check_query("file.get", {"project": "p", "path": path})


# ------------------------------------------------------------------ Idempotency-Key

def test_an_idempotency_key_reused_with_another_body_is_a_422_naming_the_key(api):
    k = key()
    first = api("PUT", "/v1/pages/eng/idem", json={"title": "One", "body": "first"}, headers=k)
    assert first.status_code == 201, first.text
    # The same request again: its first result (a retry).
    again = api("PUT", "/v1/pages/eng/idem", json={"title": "One", "body": "first"}, headers=k)
    assert again.status_code == 201 and again.json() == first.json(), again.text
    # Another body under the same key: refused, not answered with the first result.
    other = api("PUT", "/v1/pages/eng/idem", json={"title": "One", "body": "second"}, headers=k)
    body = problem(other, 422, "idempotency_key_reused")
    assert body["key"] == k["Idempotency-Key"] and k["Idempotency-Key"] in body["detail"], body
    assert api("GET", "/v1/pages/eng/idem", as_="read").json()["body"] == "first"
    # Another query is another request too (a task: a POST).
    k = key()
    assert api("POST", "/v1/tasks", json={"title": "once"}, headers=k).status_code == 201
    problem(api("POST", "/v1/tasks", json={"title": "twice"}, headers=k), 422, "idempotency_key_reused")


def test_a_request_refused_as_invalid_does_not_keep_its_key(api):
    k = key()
    problem(api("POST", "/v1/tasks", json={"title": ""}, headers=k), 422, "invalid")
    r = api("POST", "/v1/tasks", json={"title": "fixed"}, headers=k)
    assert r.status_code == 201, r.text
    problem(api("POST", "/v1/tasks", json={"title": "other"}, headers=k), 422, "idempotency_key_reused")


def test_an_upload_under_a_used_key_with_other_bytes_is_a_422(api):
    k = key()
    first = api("PUT", "/v1/files/idem/a.txt", content=b"first", headers=k)
    assert first.status_code == 201, first.text
    again = api("PUT", "/v1/files/idem/a.txt", content=b"first", headers=k)
    assert again.status_code == 201 and again.json() == first.json()
    body = problem(api("PUT", "/v1/files/idem/a.txt", content=b"second", headers=k), 422,
                   "idempotency_key_reused")
    assert body["key"] == k["Idempotency-Key"]
    problem(api("PUT", "/v1/files/idem/a.txt", content=b"first", headers={**k, "Content-Type": "text/x-other"}),
            422, "idempotency_key_reused")
    assert api("GET", "/v1/files/idem/a.txt", as_="read").content == b"first"
    assert [f["version"] for f in listed(api, "idem")] == [1]


# ------------------------------------------------------------------ the WebSocket

def _ws_handshake(address: tuple[str, int]) -> socket.socket:
    s = socket.create_connection(address, timeout=5)
    s.sendall(b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = s.recv(4096)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 101"), answer
    return s


def _address(api: Api) -> tuple[str, int]:
    host, _, port = api.node.config["ingress"]["listen"].rpartition(":")
    return host, int(port)


def test_a_websocket_client_leaving_before_its_token_logs_no_error(api):
    start = len(api.node.events())
    for polite in (False, True):
        s = _ws_handshake(_address(api))
        if polite:  # a close frame (masked, code 1000), then gone
            s.sendall(bytes([0x88, 0x82, 1, 2, 3, 4, 0x03 ^ 1, 0xE8 ^ 2]))
        s.close()
    # The server has met both departures once a later socket is served to its end.
    s = _ws_handshake(_address(api))
    s.sendall(bytes([0x81, 0x80 | 2, 0, 0, 0, 0]) + b"{}")  # no token: refused, 4401
    s.settimeout(10)
    assert s.recv(64)[:1] == b"\x88"
    s.close()
    time.sleep(0.5)  # the node's log is written by another process: let its lines land
    log = api.node.read_log()
    assert "Exception in ASGI application" not in log
    loud = [e for e in api.node.events()[start:] if e.get("level") in ("error", "critical")]
    assert not loud, loud


# ------------------------------------------------------------------ slow clients

def test_a_client_trickling_its_headers_is_cut_while_a_normal_one_is_served(api):
    address = _address(api)
    slow = [socket.create_connection(address, timeout=5) for _ in range(20)]
    line = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    started = time.monotonic()
    cut: dict[int, bytes] = {}
    sent = 0
    try:
        while len(cut) < len(slow):
            assert time.monotonic() - started < deadlines.HEADER_TIMEOUT + 5, f"{len(cut)} of 20 cut"
            for i, s in enumerate(slow):
                if i in cut:
                    continue
                try:
                    s.sendall(line[sent:sent + 1])
                except OSError:
                    cut[i] = b""
            sent += 1
            # A normal client meanwhile: answered at once.
            t = time.monotonic()
            assert api.http.get("/healthz").status_code == 200 and time.monotonic() - t < 2
            time.sleep(1)
            for i, s in enumerate(slow):
                if i in cut:
                    continue
                s.settimeout(0.01)
                try:
                    got = s.recv(4096)
                except (TimeoutError, BlockingIOError):
                    continue
                except OSError:
                    got = b""
                cut[i] = got
    finally:
        for s in slow:
            s.close()
    took = time.monotonic() - started
    assert deadlines.HEADER_TIMEOUT - 1 <= took <= deadlines.HEADER_TIMEOUT + 5, took
    assert any(got.startswith(b"HTTP/1.1 408") for got in cut.values()), cut
    api.node.wait_event("ingress_slow_client_cut", 5, part="headers")
