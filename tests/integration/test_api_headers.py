"""Browser hardening of a real node's ingress (issue 24 §2, roles/ingress/hardening.py).

Every answer — the API, the dashboard, the API docs, errors, 404s, /healthz —
carries a strict Content-Security-Policy, X-Frame-Options, nosniff and a
referrer policy; /docs is served from this origin only; and a token put in a
URL, whatever its parameter's name, is not written to the node's log (uvicorn
writes a WebSocket handshake's path with its query). What the server answers
before the app is reached — the 503 past ``ingress.max_connections``, the 400
of a request it cannot parse or whose headers run past
``ingress.max_header_bytes`` — carries the same headers. Real nodes over real
HTTP and WebSocket on loopback; waits are conditions with deadlines.
"""

from __future__ import annotations

import re
import socket

import httpx2
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.browser.conftest import base_url, token_of
from tests.conftest import Nodes, wait_for

WANTED = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def csp_of(response) -> dict[str, list[str]]:
    policy = response.headers.get("content-security-policy")
    assert policy, (response.request.url, response.status_code, dict(response.headers))
    directives = {}
    for part in policy.split(";"):
        name, *values = part.split()
        directives[name] = values
    return directives


def assert_hardened(response) -> None:
    where = f"{response.request.method} {response.request.url.path} -> {response.status_code}"
    for name, value in WANTED.items():
        assert response.headers.get(name) == value, (where, name, dict(response.headers))
        assert len(response.headers.get_list(name)) == 1, (where, name, "sent twice")
    csp = csp_of(response)
    assert csp.get("default-src") in (["'none'"], ["'self'"]), (where, csp)
    assert csp.get("script-src") == ["'self'"], (where, csp)
    assert csp.get("style-src") == ["'self'"], (where, csp)
    assert csp.get("img-src") == ["'self'", "data:"], (where, csp)
    assert csp.get("connect-src") == ["'self'"], (where, csp)
    assert csp.get("frame-ancestors") == ["'none'"], (where, csp)
    assert csp.get("base-uri") == ["'none'"], (where, csp)
    assert csp.get("form-action") == ["'self'"], (where, csp)
    assert not any("unsafe" in v for values in csp.values() for v in values), (where, csp)


@pytest.fixture(scope="module")
def node():
    """One node for the module's tests that only make requests of it (its log
    read by the second holds the first's requests too: nothing secret in them either)."""
    made = Nodes()
    try:
        # debug: the websockets library's request lines are logged too (uvicorn.error).
        yield made(log={"level": "debug"}, ingress={"max_body": 4096}).start()
    finally:
        made.close()


def test_every_answer_carries_the_security_headers_and_docs_stay_on_this_origin(node):
    token = token_of(node)
    bearer = {"Authorization": f"Bearer {token}"}
    with httpx2.Client(base_url=base_url(node), timeout=30, trust_env=False) as http:
        wait_for(lambda: http.get("/healthz").status_code == 200, 30, what="ingress answering")
        # The dashboard's script, wherever its page says it is (its files move).
        script = "/ui/" + re.search(r'<script\b[^>]*\bsrc="([^"]+)"', http.get("/ui/").text).group(1)
        answers = {
            "api": http.get("/v1/fleet", headers=bearer),
            "unauthorized": http.get("/v1/fleet"),
            "openapi": http.get("/v1/openapi.json"),
            "missing": http.get("/no/such/thing"),
            "missing api": http.get("/v1/nothing-here", headers=bearer),
            "not allowed": http.delete("/v1/fleet", headers=bearer),
            "too big": http.post("/v1/tasks", headers={**bearer, "Content-Type": "application/json"},
                                 content=b"{" + b" " * 8192 + b"}"),
            "healthz": http.get("/healthz"),
            "readyz": http.get("/readyz"),
            "root": http.get("/"),
            "dashboard": http.get("/ui/"),
            "dashboard script": http.get(script),
            "dashboard style": http.get("/ui/style.css"),
            "missing static": http.get("/ui/nope.js"),
            "docs": http.get("/docs"),
            "docs init": http.get("/docs/init.js"),
            "docs script": http.get("/docs/assets/swagger-ui-bundle.js"),
            "docs style": http.get("/docs/assets/swagger-ui.css"),
        }
        expected = {"api": 200, "unauthorized": 401, "openapi": 200, "missing": 404, "missing api": 404,
                    "not allowed": 405, "too big": 413, "healthz": 200, "root": 307, "dashboard": 200,
                    "dashboard script": 200, "dashboard style": 200, "missing static": 404, "docs": 200,
                    "docs init": 200, "docs script": 200, "docs style": 200}
        for what, status in expected.items():
            assert answers[what].status_code == status, (what, answers[what].status_code, answers[what].text[:300])
        for response in answers.values():
            assert_hardened(response)
        assert answers["dashboard script"].headers["content-type"].startswith(("text/javascript",
                                                                               "application/javascript"))
        assert answers["docs init"].headers["content-type"].startswith("text/javascript")

        # The docs page: our files only, no inline script or style, nothing from another origin.
        page = answers["docs"].text
        assert "<style" not in page and " style=" not in page
        scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
        assert scripts and all('src="/' in attrs and not body.strip() for attrs, body in scripts), scripts
        links = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", page)
        assert links and all(link.startswith("/") and not link.startswith("//") or link == "data:,"
                             for link in links), links
        assert "cdn" not in page.lower() and "http" not in page.lower()
        assert "http" not in answers["docs init"].text and "/v1/openapi.json" in answers["docs init"].text
        assert "SwaggerUIBundle" in answers["docs script"].text
        # The dashboard's page has no inline script or style either.
        ui = answers["dashboard"].text
        assert "<style" not in ui and " style=" not in ui
        assert all('src="' in attrs and not body.strip()
                   for attrs, body in re.findall(r"<script\b([^>]*)>(.*?)</script>", ui, re.S))


def test_a_token_in_a_url_never_reaches_the_log(node):
    secret = "SeCrEt7q2Lx9Vb"  # shaped like nothing scrub() knows: only the query's redaction hides it
    token = token_of(node)
    bearer = {"Authorization": f"Bearer {token}"}
    base = base_url(node)
    ws = "ws://" + base.removeprefix("http://") + "/v1/ws"
    with httpx2.Client(base_url=base, timeout=30, trust_env=False) as http:
        wait_for(lambda: http.get("/healthz").status_code == 200, 30, what="ingress answering")
        for name in ("token", "access_token", "x"):
            assert http.get(f"/v1/fleet?{name}={secret}", headers=bearer).status_code == 200
            assert http.get(f"/v1/fleet?{name}={secret}").status_code == 401
            assert http.get(f"/nowhere?{name}={secret}&b=2").status_code == 404
            # A write is logged (api_request): by its route, never its URL.
            assert http.post(f"/v1/tasks?{name}={secret}", headers=bearer,
                             json={"title": 7}).status_code == 422
    for name in ("token", "access_token", "x"):
        # Accepted (a token in the header), then refused (none at all): uvicorn logs each with its path.
        with ws_connect(f"{ws}?{name}={secret}&since=1", open_timeout=10,
                        additional_headers=bearer) as conn:
            assert conn.recv(timeout=10)
        try:
            with ws_connect(f"{ws}?{name}={secret}", open_timeout=10) as conn:
                conn.send('{"token": "wrong-token-here"}')
                conn.recv(timeout=10)
        except (ConnectionClosed, InvalidStatus):
            pass

    # uvicorn did write the handshakes' lines, their query values redacted...
    for name in ("token", "access_token", "x"):
        wait_for(lambda: f"/v1/ws?{name}=[redacted]" in node.read_log(), 10,
                 what=f"the handshake with ?{name}= logged, redacted")
    # ... and the secret is nowhere in the log.
    log = node.read_log()
    assert secret not in log, [line for line in log.splitlines() if secret in line][:5]
    assert token not in log


def _raw(address: tuple[str, int], request: bytes, *, whole: bool = True) -> tuple[socket.socket, bytes]:
    """*request* sent on a socket of its own; the socket and the answer's head (all of the
    answer, until the server closes, with *whole*)."""
    s = socket.create_connection(address, timeout=10)
    s.sendall(request)
    answer = b""
    while whole or b"\r\n\r\n" not in answer:
        chunk = s.recv(65536)
        if not chunk:
            break
        answer += chunk
    return s, answer


def assert_raw_hardened(answer: bytes) -> None:
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    status, *lines = head.split("\r\n")
    headers = httpx2.Headers([tuple(part.strip() for part in line.split(":", 1)) for line in lines])
    response = httpx2.Response(int(status.split()[1]), headers=headers,
                               request=httpx2.Request("GET", "http://node/raw"))
    assert_hardened(response)


def test_the_servers_own_early_answers_carry_the_security_headers(make_node):
    # A node bounded to 8 connections (the least it takes), its headers to 2 KiB.
    node = make_node(ingress={"max_connections": 8, "max_header_bytes": 2048}).start()
    host, _, port = node.config["ingress"]["listen"].rpartition(":")
    address = (host, int(port))
    with httpx2.Client(base_url=base_url(node), timeout=30, trust_env=False) as http:
        wait_for(lambda: http.get("/healthz").status_code == 200, 30, what="ingress answering")
    token = token_of(node)
    # A request h11 cannot parse, and one whose headers run past max_header_bytes: uvicorn's 400.
    for request in (b"NOT HTTP AT ALL\r\n\r\n",
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 4096):
        s, answer = _raw(address, request)
        s.close()
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
        assert_raw_hardened(answer)
    # Live feeds held open until one more request is past the bound: uvicorn's 503 there.
    feeds: list[socket.socket] = []
    try:
        for _ in range(16):
            s, answer = _raw(address, f"GET /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}"
                                      f"\r\n\r\n".encode(), whole=False)
            feeds.append(s)
            if not answer.startswith(b"HTTP/1.1 200"):
                break
        assert answer.startswith(b"HTTP/1.1 503"), (len(feeds), answer[:300])
        assert len(feeds) <= 9, len(feeds)  # 8 served, then refused
        assert_raw_hardened(answer)
    finally:
        for s in feeds:
            s.close()
    # And once they are gone, served again.
    with httpx2.Client(base_url=base_url(node), timeout=30, trust_env=False) as http:
        wait_for(lambda: http.get("/healthz").status_code == 200, 30, what="ingress serving again")
