"""Issue 24 §3, the sharp edges a probe found, each on a real node over real
sockets on loopback:

* file paths are held to the page paths' rule (``..``, ``a//b``, NUL,
  ``.hidden``, a right-to-left override, a backslash): a 422 naming what is
  wrong, nothing stored; a good path with spaces and accents still works;
* an Idempotency-Key reused with another body is a 422
  ``idempotency_key_reused`` naming the key, and the second write is not
  dropped silently; the same request again still answers its first result;
  a request refused as invalid does not keep the key;
* an Idempotency-Key's claim lives a day (its own TTL in ``claims``), and a
  claim let go leaves a tombstone of a minute; letting a claim go deletes
  that claim alone (a compare-and-set on its sequence), and is sent again
  while the broker does not answer (on a nats-server of the test's own);
* a WebSocket client that leaves before authenticating logs no error (the
  log checked once a marker line written after the departures is in it),
  and only a client gone is a quiet departure;
* a client trickling its headers a byte a second is cut (408, with the
  hardening headers) within the header deadline the node is configured
  with (``ingress.header_timeout``, shorter than the default), while a
  normal client, and one sending its headers in two parts within the
  deadline, are served meanwhile.

One node serves the module (tokens for read and write; ``ingress.header_timeout``
of :data:`HEADER_TIMEOUT` s).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import socket
import time
import uuid

import nats
import psutil
import pytest

from crewlet import bus
from crewlet.config.model import IngressSection
from crewlet.coord import buckets
from crewlet.estate import ops
from crewlet.queue import notify
from roles.ingress import hardening
from roles.ingress.api import common, feed
from tests.conftest import Nodes, wait_for
from tests.integration.test_files_api import Api, _started, listed, problem
from tests.seats import node_url, read_nats

# Seconds the module's node gives a request's headers (ingress.header_timeout):
# shorter than the default, so a cut at this deadline is the configured one.
HEADER_TIMEOUT = 4.0
assert HEADER_TIMEOUT + 4 < IngressSection().header_timeout
# A body's clock: after BODY_GRACE s it must have come at BODY_RATE bytes a second.
BODY_GRACE = 3.0
BODY_RATE = 1024
assert BODY_GRACE + 4 < IngressSection().body_grace


@pytest.fixture(scope="module")
def api():
    nodes = Nodes()
    try:
        api = _started(nodes, ingress={"header_timeout": HEADER_TIMEOUT, "body_grace": BODY_GRACE,
                                       "body_min_rate": BODY_RATE})
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


def _claim(api: Api, method: str, path: str, headers: dict):
    """The last message of the claim of *headers*' Idempotency-Key on a route, from the node's broker."""
    name = common.claim_name(method, path, headers["Idempotency-Key"])

    async def last(nc, js):
        return await js.get_msg(buckets.stream(buckets.CLAIMS.name),
                                subject=f"$KV.{buckets.CLAIMS.name}.{name}", direct=False)
    return read_nats(node_url(api.node), last)


def test_an_idempotency_key_is_kept_a_day_and_one_let_go_leaves_a_tombstone_of_a_minute(api):
    k = key()
    assert api("POST", "/v1/tasks", json={"title": "kept"}, headers=k).status_code == 201
    held = _claim(api, "POST", "/v1/tasks", k)
    assert held.headers.get("Nats-TTL") == str(common.IDEMPOTENCY_TTL) == "86400", held.headers
    assert json.loads(held.data)["digest"]
    k = key()
    problem(api("POST", "/v1/tasks", json={"title": ""}, headers=k), 422, "invalid")
    gone = _claim(api, "POST", "/v1/tasks", k)
    assert gone.headers.get("KV-Operation") == "DEL" and not gone.data, gone.headers
    assert gone.headers.get("Nats-TTL") == str(common.LET_GO_TTL), gone.headers


def test_a_claim_let_go_deletes_that_claim_alone_and_outlasts_a_broker_not_answering(natsd):
    name = common.claim_name("POST", "/v1/tasks", "k1")
    stream, subject = buckets.stream(buckets.CLAIMS.name), f"$KV.{buckets.CLAIMS.name}.{name}"

    def soon() -> float:
        return time.monotonic() + common.CLAIM_PATIENCE

    async def unanswered(call):
        """*call* (a coroutine) while the broker answers nothing (SIGSTOP: what a client
        sees through a stream leader election) until past one publish's timeout — it is
        still being sent then — and then answers again: what *call* returned."""
        os.kill(natsd.proc.pid, signal.SIGSTOP)
        try:
            task = asyncio.create_task(call)
            # Past one publish's timeout with the broker silent: the call is resending.
            # (Not asserted as pending: on a loaded machine this process may be
            # descheduled across the pause; the outcome below is what must hold.)
            await asyncio.wait({task}, timeout=bus.JETSTREAM_TIMEOUT + 0.5)
        finally:
            os.kill(natsd.proc.pid, signal.SIGCONT)
        return await asyncio.wait_for(task, common.CLAIM_PATIENCE)

    async def go():
        nc = await nats.connect(natsd.url, connect_timeout=2, max_reconnect_attempts=0)
        js = nc.jetstream(timeout=bus.JETSTREAM_TIMEOUT)
        try:
            await buckets.ensure(js, buckets.CLAIMS, 1)
            made, first, _ = await notify.create_claim(js, name, b'{"digest": "a"}', deadline=soon(),
                                                       msg_ttl=common.IDEMPOTENCY_TTL, take_deleted=True)
            assert made
            # That claim is gone (expired, or purged by hand) and another request took the key.
            await (await js.key_value(buckets.CLAIMS.name)).purge(name)
            made, second, _ = await notify.create_claim(js, name, b'{"digest": "b"}', deadline=soon(),
                                                        msg_ttl=common.IDEMPOTENCY_TTL, take_deleted=True)
            assert made and second > first
            # The first request lets its claim go: the other's is left as it is.
            assert not await notify.release_claim(js, name, first, deadline=soon(), msg_ttl=common.LET_GO_TTL)
            held = await buckets.last(js, buckets.CLAIMS.name, name, leader=True)
            assert held == (second, b'{"digest": "b"}')
            # The second lets go while the broker does not answer: sent again until it
            # does, and its delete, landed unanswered, known as its own.
            assert await unanswered(notify.release_claim(js, name, second, deadline=soon(),
                                                         msg_ttl=common.LET_GO_TTL))
            assert (await buckets.last(js, buckets.CLAIMS.name, name, leader=True))[1] is None
            tombstone = await js.get_msg(stream, subject=subject, direct=False)
            assert tombstone.headers["KV-Operation"] == "DEL"
            assert tombstone.headers["Nats-TTL"] == str(common.LET_GO_TTL)
            # A claim made while the broker does not answer is ours once it does (its
            # create landed unanswered; the resend is refused as a lost race).
            made, third, _ = await unanswered(notify.create_claim(
                js, name, b'{"digest": "c"}', deadline=soon(), msg_ttl=common.IDEMPOTENCY_TTL,
                take_deleted=True))
            held = await buckets.last(js, buckets.CLAIMS.name, name, leader=True)
            assert made and held == (third, b'{"digest": "c"}')
        finally:
            await nc.close()
    asyncio.run(go())


# ------------------------------------------------------------------ the WebSocket

def _ws_handshake(address: tuple[str, int], target: str = "/v1/ws") -> socket.socket:
    s = socket.create_connection(address, timeout=5)
    s.sendall(f"GET {target} HTTP/1.1\r\n".encode() +
              b"Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
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
    departed = set()
    for polite in (False, True):
        s = _ws_handshake(_address(api))
        departed.add(s.getsockname()[1])
        if polite:  # a close frame (masked, code 1000), then gone
            s.sendall(bytes([0x88, 0x82, 1, 2, 3, 4, 0x03 ^ 1, 0xE8 ^ 2]))
        s.close()
    # The server has met both departures: ingress holds neither socket any more.
    ingress = psutil.Process(api.node.process_pids()["ingress"])
    wait_for(lambda: not {c.raddr.port for c in ingress.net_connections("tcp") if c.raddr} & departed, 10,
             what="ingress to let the departed sockets go")
    # A later socket served to its end.
    s = _ws_handshake(_address(api))
    s.sendall(bytes([0x81, 0x80 | 2, 0, 0, 0, 0]) + b"{}")  # no token: refused, 4401
    s.settimeout(10)
    assert s.recv(64)[:1] == b"\x88"
    s.close()
    # A marker after all of that: uvicorn logs a handshake's path with its query's names
    # (the values redacted). The node's log is written by another process: once the marker
    # is in it, every line ingress wrote before it is too.
    marker = f"m{uuid.uuid4().hex}"
    s = _ws_handshake(_address(api), f"/v1/ws?{marker}=1")
    s.close()
    wait_for(lambda: f"/v1/ws?{marker}=" in api.node.read_log(), 10, what="the marker line in the node's log")
    log = api.node.read_log()
    assert "Exception in ASGI application" not in log
    loud = [e for e in api.node.events()[start:] if e.get("level") in ("error", "critical")]
    assert not loud, loud


def test_only_a_client_gone_is_a_quiet_websocket_departure():
    # What the feed's WebSocket lets pass quietly (a departure), and what it raises for
    # uvicorn to log (a fault): a RuntimeError is a departure only when it says the client is gone.
    from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected
    from uvicorn.protocols.utils import ClientDisconnected
    from uvicorn.protocols.websockets import websockets_sansio_impl

    for gone in (WebSocketDisconnect(1001), WebSocketDisconnected('Cannot call "send" once a close message '
                                                                  'has been sent.'),
                 ClientDisconnected(), ConnectionResetError(),
                 RuntimeError("Unexpected ASGI message 'websocket.send', after sending 'websocket.close'.")):
        assert feed.departed(gone), repr(gone)
    for fault in (RuntimeError("Expected ASGI message 'websocket.send' or 'websocket.close', but got "
                               "'websocket.accept'."),
                  RuntimeError("dictionary changed size during iteration"), ValueError("not JSON"),
                  KeyError("text")):
        assert not feed.departed(fault), repr(fault)
    # uvicorn's words the departure is known by are still the ones it raises.
    assert feed._CLOSED_BY_SERVER in inspect.getsource(websockets_sansio_impl)


# ------------------------------------------------------------------ slow clients

def _hardened(answer: bytes) -> None:
    """*answer* (a raw HTTP response) carries the hardening headers, each once."""
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower().split("\r\n")[1:]
    names = [line.partition(":")[0] for line in head]
    for name, value in hardening.HEADERS:
        assert names.count(name.decode()) == 1, (name, head)
        assert f"{name.decode()}: {value.decode().lower()}" in head, (name, head)


def test_a_client_trickling_its_headers_is_cut_at_the_configured_deadline_while_normal_ones_are_served(api):
    address = _address(api)
    slow = [socket.create_connection(address, timeout=5) for _ in range(20)]
    # Sent in two parts, the second well within the deadline: a client on a slow link, not cut.
    unhurried = socket.create_connection(address, timeout=5)
    unhurried.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    line = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    started = time.monotonic()
    cut: dict[int, bytes] = {}
    sent = 0
    try:
        while len(cut) < len(slow):
            assert time.monotonic() - started < HEADER_TIMEOUT + 5, f"{len(cut)} of 20 cut"
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
            if unhurried is not None and time.monotonic() - started >= HEADER_TIMEOUT / 4:
                unhurried.sendall(b"Accept: */*\r\n\r\n")
                answer = b""
                while b"\r\n\r\n" not in answer:
                    chunk = unhurried.recv(4096)
                    assert chunk, answer
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 200"), answer
                unhurried.close()
                unhurried = None
            time.sleep(1)  # the trickle's pace: a byte a second
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
        if unhurried is not None:
            unhurried.close()
    took = time.monotonic() - started
    # At the configured deadline: the default's (10 s) would be past this.
    assert HEADER_TIMEOUT - 1 <= took <= HEADER_TIMEOUT + 4, took
    assert unhurried is None, "the client sending its headers in two parts was not answered"
    timed_out = [got for got in cut.values() if got.startswith(b"HTTP/1.1 408")]
    assert timed_out, cut
    for answer in timed_out:
        _hardened(answer)  # written by the protocol, not the app: hardened all the same
    api.node.wait_event("ingress_slow_client_cut", 5, part="headers")


def test_a_client_trickling_its_body_is_cut_after_the_grace_while_a_fast_upload_is_served(api):
    """The body's deadline (roles/ingress/deadlines.py): start + grace + received / rate. A
    body trickled at 20 bytes a second is cut just past the grace (closed: its request
    never reached the app); a larger one sent at once is taken."""
    from tests.integration.test_files_api import SECRETS
    address = _address(api)
    size = 4096
    head = (f"PUT /v1/pages/eng/slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {SECRETS['write']}\r\nContent-Length: {size}\r\n\r\n").encode()
    slow = socket.create_connection(address, timeout=5)
    slow.sendall(head)
    started = time.monotonic()
    closed_at = None
    try:
        while closed_at is None:
            assert time.monotonic() - started < BODY_GRACE + 6, "the trickled body was never cut"
            try:
                slow.sendall(b" " * 2)   # 20 bytes a second: far below the rate
                slow.settimeout(0.1)
                if slow.recv(4096) == b"":
                    closed_at = time.monotonic()
            except (TimeoutError, BlockingIOError):
                pass
            except OSError:
                closed_at = time.monotonic()
    finally:
        slow.close()
    took = closed_at - started
    # Past the grace (not the default's 20 s), and not before it.
    assert BODY_GRACE - 0.5 <= took <= BODY_GRACE + 3, took
    api.node.wait_event("ingress_slow_client_cut", 5, part="body")
    # A body many times the size, sent at once, is served as ever.
    r = api("PUT", "/v1/pages/eng/fast", json={"title": "fast", "body": "x" * 30_000})
    assert r.status_code in (200, 201), r.text
    assert api("GET", "/v1/pages/eng/slow").status_code == 404  # the cut one never reached the app
