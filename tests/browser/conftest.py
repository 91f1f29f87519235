"""The dashboard in a real headless Chromium (Playwright's sync API).

The browser is Debian's ``chromium`` (the CI installs it; Playwright's own
download is never used): without one, every test here is skipped, saying so —
or fails, with ``CREWLET_TEST_BROWSER=required`` (CI sets it).
Each test gets a fresh browser context (its own local storage) and fails if
the page threw a JavaScript error.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from typing import Any

import pytest

CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# "required" (CI sets it): no chromium fails the browser tests rather than skipping them.
REQUIRED_ENV = "CREWLET_TEST_BROWSER"
# Milliseconds Playwright waits for a page condition unless a test says otherwise.
EXPECT_TIMEOUT = 10_000


def chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


@pytest.fixture
def browser():
    """A Chromium for one test. Not shared wider: while Playwright's sync API
    is started, asyncio.run() fails in this thread ("cannot be called from a
    running event loop"), and the rest of the suite uses it."""
    path = chromium()
    if path is None:
        why = "no chromium: install Debian's chromium package (the CI does)"
        if os.environ.get(REQUIRED_ENV) == "required":
            pytest.fail(f"{why}; {REQUIRED_ENV}=required says the browser tests must run")
        pytest.skip(why)
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install '.[test]')")
    from playwright.sync_api import expect
    expect.set_options(timeout=EXPECT_TIMEOUT)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A page in a fresh context; JavaScript errors it threw fail the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(EXPECT_TIMEOUT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"the dashboard threw: {errors}"


# ------------------------------------------------------------------ a node's API, from the test


def token_of(node) -> str:
    """The first-start admin token the node wrote (no tokens configured)."""
    with open(os.path.join(node.run_dir, "api-token")) as f:
        return f.read().strip()


def base_url(node) -> str:
    return f"http://{node.config['ingress']['listen']}"


def dashboard(node) -> str:
    return base_url(node) + "/ui/"


def call(node, method: str, path: str, body: Any = None, token: str | None = None,
         timeout: float = 30.0) -> tuple[int, Any]:
    """One API request with urllib: (status, decoded JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base_url(node) + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token if token is not None else token_of(node)}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def ready(node, timeout: float = 30.0) -> None:
    """Wait until the node says it is ready (``/readyz``: its estate answers too)."""
    from tests.conftest import wait_for

    def answered() -> bool:
        try:
            with urllib.request.urlopen(base_url(node) + "/readyz", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False
    wait_for(answered, timeout, interval=0.1, what="the node ready (/readyz)")


def company_known(node, timeout: float = 30.0) -> dict:
    """Wait until the node's ingress has the company in force (``GET
    /v1/company`` names its revision): its routes answer 503 ``no_company``
    until then. Each role of a node hears of the company on its own, so a
    seat held (the seats' doing) says nothing of ingress."""
    from tests.conftest import wait_for

    def heard() -> dict | None:
        status, answer = call(node, "GET", "/v1/company")
        return answer if status == 200 and (answer or {}).get("rev") else None
    return wait_for(heard, timeout, interval=0.1, what="ingress has the company (GET /v1/company)")


def ok(node, method: str, path: str, body: Any = None) -> Any:
    status, answer = call(node, method, path, body)
    assert 200 <= status < 300, (method, path, status, answer)
    return answer
