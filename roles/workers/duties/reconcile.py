"""Duty ``reconcile``: GitHub's webhook deliveries looked over, the missed ones redelivered.

A delivery GitHub sent while no ingress could take it (every one down, a
partition, a 5xx) is mail nobody will ever see unless someone asks GitHub to
send it again. For each integration of kind github with ``reconcile:``, every
``every`` seconds, this duty lists the hook's recent deliveries through
GitHub's REST API (``GET /repos/{owner}/{repo}/hooks/{hook_id}/deliveries``,
newest first, back ``window`` seconds) and asks GitHub to redeliver
(``POST …/deliveries/{id}/attempts``) each delivery — by its GUID, the
``X-GitHub-Delivery`` every attempt of it carries — that

* no attempt of which got a 2xx from us (a 202 for a delivery no route takes
  is an answer too: there is nothing to redeliver), and
* no node stored (its claim in the ``claims`` bucket is not ``stored``: an
  attempt GitHub saw time out may have been stored all the same).

What comes back is an ordinary delivery to ``/v1/hooks/<name>``: its claim
makes it mail once, however many times it is sent. A GUID asked for is not
asked again for ``every`` seconds (GitHub's redelivery is itself a delivery,
which the next look sees). The token is a fleet secret (``token_secret``,
read by the workers role) or an environment variable (``token_env``).

Which kinds cannot be reconciled: ``slack`` (Slack has no API listing the
events it sent; it retries a failed one three times within an hour, and then
the event is gone) and ``generic`` (no standard API to ask a sender; such a
sender's own retries are all there is).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import datetime
from typing import Any

import aiohttp

from crewlet import log
from crewlet.company.model import Integration
from crewlet.hooks.base import safe_id
from crewlet.queue import notify
from crewlet.vault import Vault
from roles.workers.duties import Duty, going_on, rest

PAGE = 100              # deliveries a page (GitHub's most)
PAGES_MAX = 20          # pages a look reads at most: 2,000 deliveries
REQUEST_TIMEOUT = 30.0  # seconds one GitHub request may take
REDELIVERIES_MAX = 50   # redeliveries asked a look, per integration (GitHub rate-limits its API)
IDLE = 30.0             # seconds between looks for a company with nothing to reconcile
UNHEARD = 1.0           # seconds between looks for the company while none is known yet
API_VERSION = "2022-11-28"


class ReconcileError(Exception):
    """GitHub did not answer as expected; the message says what it said."""


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION, "User-Agent": "crewlet-reconcile"}


def _at(stamp: Any) -> float:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _next_link(header: str | None) -> str | None:
    """The ``rel="next"`` URL of a Link header."""
    for part in (header or "").split(","):
        url, _, rel = part.partition(";")
        if 'rel="next"' in rel:
            return url.strip().strip("<>")
    return None


async def deliveries(session: aiohttp.ClientSession, spec, token: str, since: float) -> list[dict[str, Any]]:
    """The hook's deliveries since *since* (wall clock), newest first."""
    url: str | None = (f"{spec.api_url.rstrip('/')}/repos/{spec.repository}/hooks/{spec.hook_id}"
                       f"/deliveries?per_page={PAGE}")
    found: list[dict[str, Any]] = []
    for _ in range(PAGES_MAX):
        if url is None:
            break
        async with session.get(url, headers=_headers(token),
                               timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as r:
            text = await r.text()
            if r.status != 200:
                raise ReconcileError(f"GET deliveries: {r.status} {text[:300]}")
            try:
                page = json.loads(text)
            except ValueError:
                raise ReconcileError(f"GET deliveries: not JSON: {text[:300]}") from None
            url = _next_link(r.headers.get("Link"))
        if not isinstance(page, list):
            raise ReconcileError(f"GET deliveries: not a list: {text[:300]}")
        rows = [d for d in page if isinstance(d, dict)]
        found += rows
        if not rows or min(_at(d.get("delivered_at")) for d in rows) < since:
            break
        if url is not None and not url.startswith(spec.api_url.rstrip("/") + "/"):
            raise ReconcileError(f"GET deliveries: the next page is elsewhere ({url[:200]}): "
                                 "the token goes to the API it is for only")
    return [d for d in found if _at(d.get("delivered_at")) >= since]


async def redeliver(session: aiohttp.ClientSession, spec, token: str, delivery_id: int) -> None:
    url = (f"{spec.api_url.rstrip('/')}/repos/{spec.repository}/hooks/{spec.hook_id}"
           f"/deliveries/{delivery_id}/attempts")
    async with session.post(url, headers=_headers(token),
                            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as r:
        text = await r.text()
        if r.status not in (200, 201, 202):
            raise ReconcileError(f"POST attempts for {delivery_id}: {r.status} {text[:300]}")


def missed(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """GUID -> its newest delivery, for the GUIDs no attempt of which got a 2xx."""
    by_guid: dict[str, list[dict[str, Any]]] = {}
    for d in found:
        if isinstance(d.get("guid"), str) and isinstance(d.get("id"), int):
            by_guid.setdefault(d["guid"], []).append(d)
    return {guid: max(attempts, key=lambda d: _at(d.get("delivered_at")))
            for guid, attempts in by_guid.items()
            if not any(_succeeded(d) for d in attempts)}


def _succeeded(delivery: dict[str, Any]) -> bool:
    code = delivery.get("status_code")
    return isinstance(code, int) and not isinstance(code, bool) and 200 <= code < 300


async def stored(js, integration: str, guid: str) -> bool:
    """Did a node store this delivery (its claim says so)?"""
    _, data, _ = await notify.read_claim(js, notify.claim_key(integration, safe_id(guid)),
                                         time.monotonic() + REQUEST_TIMEOUT)
    try:
        return data is not None and json.loads(data).get("state") == notify.STORED
    except (ValueError, AttributeError):
        return False


class Reconciler:
    """One holder's looks. Invariant: ``asked[(integration, guid)]`` is when
    this holder last asked GitHub to redeliver that delivery (monotonic)."""

    def __init__(self, js, vault: Vault, session: aiohttp.ClientSession):
        self.js, self.vault, self.session = js, vault, session
        self.asked: dict[tuple[str, str], float] = {}
        self.complained: set[str] = set()

    async def token(self, spec) -> str | None:
        if spec.token_secret is not None:
            return await self.vault.value(spec.token_secret)
        return os.environ.get(spec.token_env or "") or None

    async def look(self, name: str, integration: Integration) -> dict[str, Any]:
        spec = integration.reconcile
        token = await self.token(spec)
        if not token:
            if name not in self.complained:
                log.event("reconcile_no_token", "error", integration=name,
                          secret=spec.token_secret, env=spec.token_env)
                self.complained.add(name)
            return {"integration": name, "error": "no token"}
        self.complained.discard(name)
        found = await deliveries(self.session, spec, token, time.time() - spec.window)
        asked = []
        now = time.monotonic()
        for key in [k for k, at in self.asked.items() if now - at > spec.window]:
            del self.asked[key]  # older than anything a look sees
        for guid, newest in missed(found).items():
            if len(asked) >= REDELIVERIES_MAX:
                break
            if now - self.asked.get((name, guid), -1e18) < spec.every:
                continue  # asked a moment ago: its redelivery is on its way
            if await stored(self.js, name, guid):
                continue  # GitHub saw a failure, but a node stored it all the same
            await redeliver(self.session, spec, token, newest["id"])
            self.asked[(name, guid)] = now
            asked.append(guid)
        if asked:
            log.event("reconcile_redelivered", "warning", integration=name, guids=asked[:20], count=len(asked))
        return {"integration": name, "deliveries": len(found), "redelivered": len(asked)}


async def run(ctx) -> None:
    js = ctx.role.jetstream()
    vault = Vault.of(js, ctx.config, "workers")
    following = asyncio.create_task(vault.run())
    try:
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(js, vault, session)
            due: dict[str, float] = {}
            while going_on():
                company = ctx.company()
                wanted = {name: i for name, i in (company.integrations if company else {}).items()
                          if i.reconcile is not None}
                now = time.monotonic()
                for name in [n for n in due if n not in wanted]:
                    del due[name]  # gone from the company
                for name, integration in wanted.items():
                    if now < due.get(name, 0.0):
                        continue
                    due[name] = now + integration.reconcile.every
                    try:
                        await reconciler.look(name, integration)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # GitHub, the broker, a malformed answer: the next look
                        log.event("reconcile_failed", "warning", integration=name,
                                  error=f"{type(exc).__name__}: {exc}")
                # Not before the company is heard (a holder starts before its role has it): soon.
                nxt = min(due.values(), default=now + (IDLE if company is not None else UNHEARD))
                await rest(max(0.2, min(nxt - time.monotonic(), IDLE)))
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


DUTY = Duty("reconcile", run)
