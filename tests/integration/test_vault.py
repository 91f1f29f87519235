"""Secrets through the control plane on one real node (crewlet.vault).

The company names its provider's key and its webhook's secret as fleet
secrets, none of them set yet. ``crewletctl secret set`` stores each (from
standard input, never argv); the seat's next request to a local endpoint
that speaks OpenAI's wire carries the key, and a rotated key is used from
the moment the seats process has it, with no restart. A webhook secret
rotated with a grace takes the old signature until the grace ends, then
only the new. Nothing of any value is left in the node's log, status, data
dir (the estate's LMDB, the broker's store: sealed there), the API's
answers, or any process's environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import psutil
import pytest

from crewlet import tokens
from tests.conftest import CREWLETCTL, wait_for
from tests.estate import until
from tests.integration.test_hooks_api import api_url, github_delivery, http, new_id, post_hook
from tests.integration.wire import Canned, WireServer, openai_reply
from tests.seats import ctl_json, held, write_company

pytestmark = pytest.mark.timeout(180)

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
KEYS = ("llm-key-one-0123456789abcdef", "llm-key-two-fedcba9876543210")
HOOKS = ("hook-secret-one-0123456789", "hook-secret-two-9876543210")
API_VALUE = "set-through-the-api-0123456789"
GRACE = 3.0  # seconds the first hook secret is still taken after the second is set
COMPANY = """
company: {{name: vault}}
providers:
  llm: {{kind: openai, base_url: '{url}', model: m, api_key_secret: llm}}
integrations:
  gh: {{kind: github, secret: gh-hook, routes: [{{seat: w}}]}}
seats:
  - {{name: w, persona: a worker, provider: llm}}
"""


def secret(node, *args: str, value: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CREWLETCTL, "-c", node.config_path, "secret", *args], input=value or "",
                          capture_output=True, text=True, timeout=30)


def changed(node, role: str, name: str, version: int) -> bool:
    """Has *role* said it holds version *version* of secret *name*?"""
    return any('"secret_changed"' in line and f'"role":"{role}"' in line.replace(" ", "")
               and f'"secret":"{name}"' in line.replace(" ", "") and f'"version":{version}' in line.replace(" ", "")
               for line in node.read_log().splitlines())


def keys_sent(srv: WireServer, since: int = 0) -> list[str]:
    return [r.headers.get("authorization", "") for r in srv.received()[since:]]


def test_secrets_set_rotate_and_never_leak(make_node):
    with WireServer(always=Canned(200, openai_reply("done"))) as srv:
        node = make_node(fleet=FAST)
        node.start(args=("--company", write_company(node.dir, COMPANY.format(url=srv.url))))
        wait_for(lambda: held(node).get("w"), 30, what="seat w held")

        # Named by the company, not set yet: said by the listing, and a
        # webhook is answered 503 (not 401: the sender did nothing wrong).
        listed = json.loads(secret(node, "list", "--json").stdout)
        assert listed["secrets"] == []
        assert {m["name"]: m["named_by"] for m in listed["missing"]} == {
            "llm": ["providers.llm.api_key_secret"], "gh-hook": ["integrations.gh.secret"]}
        status, body = post_hook(node, "gh", github_delivery(new_id("gh"), secret=HOOKS[0]))
        assert (status, body["code"]) == (503, "secret_missing"), body

        # Bad input: a clear answer, nothing stored.
        assert secret(node, "set", "llm", "the-value-on-argv").returncode == 2
        empty = secret(node, "set", "llm", value="")
        assert empty.returncode == 2 and "empty" in empty.stderr, empty
        bad = secret(node, "set", "9lives", value="whatever-it-is")
        assert bad.returncode == 1 and "bad secret name" in bad.stderr, bad
        gone = secret(node, "rm", "nope")
        assert gone.returncode == 1 and "no secret" in gone.stderr, gone

        # The key, set: the next request carries it.
        out = secret(node, "set", "llm", value=KEYS[0] + "\n")
        assert out.returncode == 0 and "version 1" in out.stdout, out
        wait_for(lambda: changed(node, "seats", "llm", 1), 10, what="the seats process holds llm v1")
        turn = ctl_json(node, "send", "w", "hello", "--wait", "30", "--trigger", "k-1")["turn"]
        assert turn["outcome"] == "done", turn
        assert keys_sent(srv) == [f"Bearer {KEYS[0]}"]

        # Rotated, from a file: every request from the moment the seats
        # process has it carries the new key; no restart.
        path = os.path.join(node.dir, "key2.txt")
        with open(path, "w") as f:
            f.write(KEYS[1])
        os.chmod(path, 0o600)
        pids = node.process_pids()
        assert secret(node, "set", "llm", "--file", path).returncode == 0
        wait_for(lambda: changed(node, "seats", "llm", 2), 10, what="the seats process holds llm v2")
        since = len(srv.received())
        for n in range(3):
            turn = ctl_json(node, "send", "w", f"again {n}", "--wait", "30", "--trigger", f"k-2-{n}")["turn"]
            assert turn["outcome"] == "done", turn
        assert keys_sent(srv, since) == [f"Bearer {KEYS[1]}"] * 3
        assert node.process_pids() == pids, "no child was restarted"

        # A webhook secret, rotated with a grace: the old signature is taken
        # until the grace ends, the new one always.
        assert secret(node, "set", "gh-hook", value=HOOKS[0]).returncode == 0
        wait_for(lambda: changed(node, "ingress", "gh-hook", 1), 10, what="ingress holds gh-hook v1")
        assert post_hook(node, "gh", github_delivery(new_id("gh"), secret=HOOKS[0]))[0] == 200
        assert secret(node, "set", "gh-hook", "--grace", str(GRACE), value=HOOKS[1]).returncode == 0
        set_at = time.monotonic()
        wait_for(lambda: changed(node, "ingress", "gh-hook", 2), 10, what="ingress holds gh-hook v2")
        assert post_hook(node, "gh", github_delivery(new_id("gh"), secret=HOOKS[1]))[0] == 200
        if time.monotonic() - set_at < GRACE - 0.5:  # the old one, inside the grace
            assert post_hook(node, "gh", github_delivery(new_id("gh"), secret=HOOKS[0]))[0] == 200
        wait_for(lambda: post_hook(node, "gh", github_delivery(new_id("gh"), secret=HOOKS[0]))[0] == 401,
                 GRACE + 5, interval=0.2, what="the old hook secret refused once the grace is over")
        assert time.monotonic() - set_at >= GRACE - 0.5
        assert post_hook(node, "gh", github_delivery(new_id("gh"), secret=HOOKS[1]))[0] == 200

        # The same through the API, for an admin token: set, listed (never the value), removed.
        token = tokens.read_admin_token(node.run_dir)
        status, body = http("PUT", api_url(node) + "/v1/secrets/via-api",
                            json.dumps({"value": API_VALUE, "grace": 0}).encode(), token=token)
        assert status == 200 and body["secret"]["version"] == 1 and body["secret"]["by"].startswith("api:"), body
        status, body = http("GET", api_url(node) + "/v1/secrets", token=token)
        assert status == 200 and "via-api" in [s["name"] for s in body["secrets"]], body
        assert API_VALUE not in json.dumps(body)
        status, body = http("PUT", api_url(node) + "/v1/secrets/via-api", b'{"value": ""}', token=token)
        assert status == 422, body
        assert http("DELETE", api_url(node) + "/v1/secrets/via-api", token=token)[0] == 200
        assert http("DELETE", api_url(node) + "/v1/secrets/via-api", token=token)[0] == 404

        listed = json.loads(secret(node, "list", "--json").stdout)
        assert {s["name"]: (s["version"], s["readable"], s["named_by"]) for s in listed["secrets"]} == {
            "llm": (2, True, ["providers.llm.api_key_secret"]),
            "gh-hook": (2, True, ["integrations.gh.secret"])}
        assert listed["missing"] == []
        wait_for(lambda: (node.status()["node"].get("secrets") or {}).get("held") == 2, 10,
                 what="crewletctl status: two secrets held, none unreadable")
        assert node.status()["node"]["secrets"]["unreadable"] == []
        table = secret(node, "list")
        assert table.returncode == 0 and "gh-hook" in table.stdout and "never shown" in table.stdout

        # No value anywhere: the log, status, the data dir (LMDB, the broker's
        # store), the API's answers, any process's environment.
        values = [v.encode() for v in (*KEYS, *HOOKS, API_VALUE)]
        shown = [node.read_log(), json.dumps(node.status()), table.stdout,
                 json.dumps(listed)]
        for route in ("/v1/fleet", "/v1/company", "/v1/seats/w", "/v1/turns?seat=w", "/readyz"):
            shown.append(json.dumps(http("GET", api_url(node) + route, token=token)[1]))
        leaks = [i for i, text in enumerate(shown) if any(v in text.encode() for v in values)]
        assert not leaks, leaks
        for root, _, files in os.walk(node.config["data_dir"]):
            for name in files:
                p = os.path.join(root, name)
                if os.path.isfile(p):
                    with open(p, "rb") as f:
                        data = f.read()
                    assert not any(v in data for v in values), p
        for pid in node.tree_pids():
            try:
                environ = psutil.Process(pid).environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            assert not any(v.decode() in "\0".join(environ.values()) for v in values), pid

        # Removed: the next request says which secret is missing, no key sent.
        assert secret(node, "rm", "llm").returncode == 0
        wait_for(lambda: changed(node, "seats", "llm", "null"), 10, what="the seats process dropped llm")
        since = len(srv.received())
        turn = ctl_json(node, "send", "w", "no key", "--wait", "30", "--trigger", "k-3")["turn"]
        assert turn["outcome"] != "done" and re.search(r"secret llm", turn.get("error") or ""), turn
        assert keys_sent(srv, since) == []


def test_versions_graces_reseal_and_a_version_this_process_cannot_open(natsd):
    """The store and a process's Vault on a real broker: each set is the next
    version, the replaced one carried for its grace; a Vault follows within a
    moment, keeps what it had when a version is sealed with a key it lacks,
    and a re-seal with the rotated fleet secret makes that version readable."""
    import asyncio

    import nats

    from crewlet.coord import buckets
    from crewlet.vault import Keys, Vault
    from crewlet.vault import store

    old, new = Keys(["o" * 43]), Keys(["n" * 43, "o" * 43])  # the fleet secret mid-rotation

    async def go():
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=5)
        try:
            await buckets.ensure(js, buckets.SECRETS, 1)
            follower = Vault(js, old, role="test")
            assert await follower.value("llm") is None  # before its listing: read directly
            task = asyncio.create_task(follower.run())
            first = await store.put(js, old, "llm", "value-one", by="t", grace=0)
            second = await store.put(js, old, "llm", "value-two", by="t", grace=60)
            assert (first.version, second.version) == (1, 2)
            assert first.previous is None and second.previous["version"] == 1

            async def holds(name, value, timeout=5.0):
                async with asyncio.timeout(timeout):
                    while await follower.value(name) != value:
                        await asyncio.sleep(0.01)
            await holds("llm", "value-two")  # may be read directly, before the listing
            await until(lambda: follower.listed, 5, "the follower's listing")
            assert await follower.accepted("llm") == ["value-two", "value-one"]

            # Sealed with the new line, which this follower lacks: it keeps v2.
            await store.put(js, new, "llm", "value-three", by="t", grace=0)
            async with asyncio.timeout(5):
                while "llm" not in follower.unreadable:
                    await asyncio.sleep(0.01)
            assert await follower.value("llm") == "value-two"

            # Written under the old line by a node not yet restarted; the
            # first crewletd restarted with both lines re-seals it.
            await store.put(js, old, "hook", "hook-one", by="t")
            assert await store.reseal(js, new) == ["hook"]
            assert await store.reseal(js, new) == []  # nothing left to do
            _, hook = await store.read(js, "hook")
            assert hook.sealed["key"] == new.sealing_id and hook.version == 1
            assert Keys(["n" * 43]).open("hook", 1, hook.sealed) == "hook-one"

            assert await store.remove(js, "hook") and not await store.remove(js, "hook")
            await holds("hook", None)
            # Set anew after a removal: version 1 again, and the new value is the one held.
            await store.put(js, old, "hook", "hook-again", by="t")
            await holds("hook", "hook-again")
            await store.remove(js, "hook")
            assert sorted(r.name for r in await store.records(js)) == ["llm"]
            # A damaged record: passed over by the listing, replaced by a set, removable.
            await js.publish("$KV.secrets.damaged", b"not a record")
            assert sorted(r.name for r in await store.records(js)) == ["llm"]
            assert (await store.put(js, old, "damaged", "mended", by="t")).version == 1
            assert await store.remove(js, "damaged")
            task.cancel()
        finally:
            await nc.close()

    asyncio.run(go())
