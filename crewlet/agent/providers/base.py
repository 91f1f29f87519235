"""What every provider is, and the one retry loop of the HTTP providers.

A :class:`Provider` answers a conversation with a :class:`~crewlet.agent.types.Reply`
by a caller's deadline (``time.monotonic()``), or raises :class:`ProviderError`
saying whether trying again later could help. One instance serves every seat
of a process that names it.

:class:`HttpProvider` is the retry loop the openai and anthropic providers
share, and the only one in crewlet (the turn loop never retries a call itself):

* before each attempt the key's cooldown is read — from the fleet's
  ``cooldowns`` bucket when there is one, and from what this instance saw
  itself. A key cooling until before the deadline is waited for; one cooling
  past it raises :class:`CoolingDown` without calling the endpoint;
* a 429 cools the key until now + ``Retry-After`` (seconds or an HTTP date,
  at least the current backoff; :data:`DEFAULT_COOLDOWN` when absent), written
  to ``cooldowns`` so every node holds back, then the loop above waits or
  gives up;
* 5xx, 408, 409 and connection errors back off exponentially (honouring
  ``Retry-After`` when given) and retry within the deadline;
* any other 4xx fails at once, with what the endpoint said.

**Streaming.** Given a :class:`~crewlet.agent.types.Sink`, an HTTP provider
asks for a server-sent event stream (:attr:`HttpProvider.stream_fields`) and
hands the model's text to the sink as it comes, while a subclass's
:class:`Assembly` rebuilds, from the events, the very body the endpoint would
have answered without streaming — so the :class:`Reply` is read by the same
code either way. Failures take the same paths: an HTTP error before the
stream starts is the status it is; an error event in the stream is read as
the status it names (:meth:`Assembly.feed`); a stream cut mid-way (the
connection lost, or the stream closed before its end marker) is retried like
a lost connection. An attempt that had streamed text calls the sink's
``restart`` before it fails (see :class:`~crewlet.agent.types.Sink`). Without
a sink nothing of this happens: one JSON request, one JSON answer.

A key is known to the fleet only by its *key id*, the first 12 hex characters
of its sha256 (``default`` for a provider without a key): the key itself is
never written or logged. What an endpoint (or a CLI agent's stderr) says about
a failure is passed through :func:`redact` before it becomes a
:class:`ProviderError`, so an endpoint that echoes the key does not put it in
the logs, the dead letters, the turn records and the estate: the configured
key's value, every secret value the process knows, and anything shaped like
a key or a credential header, become :data:`REDACTED` (:mod:`crewlet.redaction`).
"""

from __future__ import annotations

import abc
import asyncio
import email.utils
import hashlib
import json
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

from crewlet import log, redaction
from crewlet.agent.types import Message, Reply, Sink, ToolSpec
from crewlet.company.model import Provider as ProviderSpec

if TYPE_CHECKING:
    from crewlet.coord.counters import Cooldowns
    from crewlet.vault import Vault

# A 429 without Retry-After cools the key this long (seconds): long enough that
# a fleet of nodes does not hammer a limit it knows nothing more about.
DEFAULT_COOLDOWN = 30.0
# Backoff after a 5xx or a connection error: the first wait, doubling up to the cap.
BACKOFF_FIRST = 0.5
BACKOFF_CAP = 8.0
# One HTTP attempt never waits longer than this, whatever the deadline: a hung
# connection is then retried instead of holding the turn to its end.
REQUEST_TIMEOUT_CAP = 120.0
# Statuses worth trying again besides 5xx: request timeout, conflict.
_RETRY_4XX = (408, 409)
# Characters of an endpoint's error body quoted in a ProviderError.
_ERROR_QUOTE = 500
_KEY_ID_HEX = 12
NO_KEY_ID = "default"
# What a secret in provider error text becomes, the shortest secret looked
# for, and the shapes looked for whatever the key: crewlet.redaction's, the
# one place text is kept from holding a secret.
REDACTED = redaction.REDACTED
SECRET_MIN = redaction.SECRET_MIN


class ProviderError(Exception):
    """A provider call failed. ``retryable``: might the same call succeed later?"""

    def __init__(self, message: str, *, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


class StreamCut(Exception):
    """A response stream ended before its end: retried like a lost connection."""


class Refused(Exception):
    """The endpoint answered an attempt with an error: ``status`` (an HTTP status,
    or the one an error event in a stream stands for), ``said`` (the failure in
    words: ``HTTP 503: …``, ``stream error: …``) and ``asked``, the
    ``Retry-After`` in seconds, if any. The retry loop decides what follows."""

    def __init__(self, status: int, said: str, asked: float | None = None):
        super().__init__(said)
        self.status, self.said, self.asked = status, said, asked


class CoolingDown(ProviderError):
    """The provider's key cools until ``until`` (wall clock), past the caller's deadline."""

    def __init__(self, message: str, *, until: float, key: str, provider: str):
        super().__init__(message, retryable=True)
        self.until, self.key, self.provider = until, key, provider


class Provider(abc.ABC):
    """A model behind a name of ``providers`` in the company."""

    kind: str
    name: str
    # Subprocesses at once on this node (cli only); None: no bound of its own.
    max_concurrent: int | None = None

    def __init__(self, name: str, spec: ProviderSpec, *, env: Mapping[str, str] = os.environ,
                 vault: Vault | None = None):
        self.name = name
        self.spec = spec
        self._env = env        # where api_key_env is read
        self._vault = vault    # where api_key_secret is read (this process's, crewlet.vault)

    @abc.abstractmethod
    async def complete(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], *,
                       deadline: float, sink: Sink | None = None) -> Reply:
        """The model's answer to *messages*, or ProviderError by *deadline* (monotonic).
        *sink*: told the answer's text as it comes (its ``delta`` and ``restart``)."""

    async def cooling(self) -> float | None:
        """The wall-clock time this provider's key cools until, if it cools now."""
        return None

    async def api_key(self) -> str | None:
        """The API key as of now, read at every request (a rotated secret is
        used from the next one on): the fleet secret ``api_key_secret``
        names, else the environment variable ``api_key_env`` names; None for
        a provider without a key. ProviderError when the one named is not there."""
        secret = self.spec.api_key_secret
        if secret is not None:
            key = await self._vault.value(secret) if self._vault is not None else None
            if not key:
                raise ProviderError(f"provider {self.name}: secret {secret} (its API key) is not set "
                                    f"in the fleet, or this node cannot open it "
                                    f"(crewletctl secret set {secret}; crewletctl secret list)",
                                    retryable=False)
            return key
        var = self.spec.api_key_env
        if var is None:
            return None
        key = self._env.get(var)
        if not key:
            raise ProviderError(f"provider {self.name}: environment variable {var} (its API key) "
                                f"is not set", retryable=False)
        return key

    async def close(self) -> None:
        """Release connections; the instance is not used again."""


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """*text* with every secret in it replaced by :data:`REDACTED`: each of
    *secrets* (the configured key's value; those under :data:`SECRET_MIN`
    characters are left alone), every secret value this process knows, and
    anything shaped like a key or a credential
    (:data:`crewlet.redaction.SECRET_SHAPES`). The one function provider
    error text goes through before it is stored or logged
    (:func:`crewlet.redaction.redact`)."""
    return redaction.redact(text, secrets)


def env_secrets(env: Mapping[str, str]) -> list[str]:
    """The values in *env* named like secrets (``*_KEY``, ``*TOKEN*``…): what a
    CLI agent, which has the whole environment, might echo."""
    return redaction.env_secrets(env)


def key_id(key: str | None) -> str:
    """How the fleet names a key without knowing it."""
    if not key:
        return NO_KEY_ID
    return hashlib.sha256(key.encode()).hexdigest()[:_KEY_ID_HEX]


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the endpoint asks us to wait, from ``Retry-After`` (seconds or an
    HTTP date) or OpenAI's ``retry-after-ms``; None when it does not say."""
    now = time.time() if now is None else now
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def endpoint_says(raw: bytes, reason: str | None = None) -> str:
    """The endpoint's own words about a failed request, from its body *raw*
    (and the status line's *reason* when the body says nothing)."""
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    return error_words(body) or text.strip()[:_ERROR_QUOTE] or reason or "no body"


def error_words(body: Any) -> str | None:
    """What an error body (``{"error": {"type", "message"}}`` and its kin) says, if it is one."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict) and err.get("message"):
        kind = err.get("type") or err.get("code")
        return f"{kind}: {err['message']}" if kind else str(err["message"])
    if isinstance(err, str):
        return err
    if body.get("message"):
        return str(body["message"])
    return None


# A line of a server-sent event stream ends at CRLF, LF or a lone CR.
_EOL = re.compile(rb"\r\n|\r|\n")


async def body_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a response body read as *chunks* (bytes as they arrive),
    each without its end (CRLF, LF or CR, as an event stream may end them),
    UTF-8 decoded (an invalid byte becomes U+FFFD). A CR that ends a chunk
    is held until the next one says whether an LF follows it, so a CRLF cut
    between two chunks is one end, not two. What follows the last end is the
    last line."""
    rest = b""
    async for chunk in chunks:
        rest += chunk
        held = rest.endswith(b"\r")
        *lines, rest = _EOL.split(rest[:-1] if held else rest)
        for line in lines:
            yield line.decode("utf-8", "replace")
        if held:
            rest += b"\r"
    if rest:
        for line in _EOL.split(rest[:-1] if rest.endswith(b"\r") else rest):
            yield line.decode("utf-8", "replace")


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
    """The (event, data) pairs of a server-sent event stream, read from its lines.

    As the HTML standard reads them: ``data:`` lines join with newlines, a
    blank line ends an event, ``:`` starts a comment (a keep-alive), the
    event name defaults to ``message``, one space after the colon is not the
    value's, and an event the stream ends in the middle of is dropped (it
    may be cut short: the caller sees a stream without its end). ``id`` and
    ``retry`` mean nothing to a one-shot request.
    """
    event, data = "", []
    async for line in lines:
        if not line:
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value


class Assembly(abc.ABC):
    """One streamed answer being rebuilt from its events (a subclass per wire)."""

    # Has the stream's end marker come? Without it the stream was cut.
    done: bool = False

    @abc.abstractmethod
    def feed(self, event: str, data: str) -> str:
        """Take one event; the text it adds to the answer ("" for none). Refused
        for an error event; ValueError/KeyError/TypeError for a malformed one."""

    @abc.abstractmethod
    def body(self) -> Any:
        """The body the endpoint would have answered without streaming."""


class HttpProvider(Provider):
    """A provider behind an HTTP JSON endpoint: subclasses say what to send and how
    to read the answer; the retry loop, cooldowns and the client live here."""

    def __init__(self, name: str, spec: ProviderSpec, *, cooldowns: Cooldowns | None = None,
                 env: Mapping[str, str] = os.environ, vault: Vault | None = None):
        super().__init__(name, spec, env=env, vault=vault)
        self._cooldowns = cooldowns
        # What this instance itself learnt from a 429, for when the fleet's bucket cannot answer.
        self._local_until = 0.0
        self._session = _Session()
        # Tool lists' JSON by the ids of their specs; each entry keeps its
        # specs, so an id is never another spec's while it is here.
        self._tools_json: dict[tuple[int, ...], tuple[tuple[ToolSpec, ...], bytes]] = {}

    # ------------------------------------------------------------ subclass surface

    @abc.abstractmethod
    def _url(self) -> str:
        """Where requests are posted."""

    @abc.abstractmethod
    def _headers(self, key: str | None) -> dict[str, str]:
        """Headers carrying *key* and the API version, if any."""

    @abc.abstractmethod
    def _body(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
              ) -> dict[str, Any]:
        """The request body for one call, without its tools (see :meth:`_tool`)."""

    @abc.abstractmethod
    def _tool(self, tool: ToolSpec) -> dict[str, Any]:
        """One entry of the body's ``tools``."""

    def _encode(self, body: dict[str, Any], tools: Sequence[ToolSpec]) -> bytes:
        """*body* as JSON, with ``tools`` made of *tools*. A seat offers the
        same tools turn after turn: their JSON (most of a request's) is made
        once per list of specs, not per request (bench/slow_turns.py: encoding
        it was a tenth of the seats process at 1,000 turns in flight)."""
        data = _dumps(body)
        if not tools:
            return data
        key = tuple(id(t) for t in tools)
        hit = self._tools_json.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], tools)):
            hit = (tuple(tools), _dumps([self._tool(t) for t in tools]))
            if len(self._tools_json) >= TOOLS_JSON_KEPT:
                self._tools_json.pop(next(iter(self._tools_json)))
            self._tools_json[key] = hit
        return b'{"tools":' + hit[1] + (b"," + data[1:] if data != b"{}" else b"}")

    @abc.abstractmethod
    def _reply(self, body: Any) -> Reply:
        """A successful response body as a Reply; ValueError/KeyError/TypeError if malformed."""

    # What a request body gains to be answered as a stream.
    stream_fields: dict[str, Any] = {"stream": True}

    @abc.abstractmethod
    def _assembly(self) -> Assembly:
        """A fresh rebuilder of one streamed answer."""

    # ------------------------------------------------------------ the key

    async def _key_id(self) -> str:
        try:
            return key_id(await self.api_key())
        except ProviderError:
            return NO_KEY_ID

    def _redact(self, text: str) -> str:
        """*text* (what the endpoint said) without the key in it (:func:`redact`;
        a fleet secret's value is known to the process already, crewlet.vault)."""
        var = self.spec.api_key_env
        return redact(text, [self._env.get(var)] if var else [])

    async def cooling(self) -> float | None:
        return await self._cooling_until(await self._key_id())

    async def _cooling_until(self, kid: str) -> float | None:
        until = self._local_until
        if self._cooldowns is not None:
            try:
                shared = await self._cooldowns.until(self.name, kid)
            except Exception as exc:  # the fleet's state is unreachable: go on with what we know
                log.event("cooldown_read_failed", "warning", provider=self.name, key_id=kid,
                          error=f"{type(exc).__name__}: {exc}")
                shared = None
            until = max(until, shared or 0.0)
        return until if until > time.time() else None

    async def _cool(self, kid: str, until: float, reason: str) -> None:
        self._local_until = max(self._local_until, until)
        log.event("provider_cooling", "warning", provider=self.name, key_id=kid,
                  until=round(until, 3), reason=reason)
        if self._cooldowns is not None:
            try:
                await self._cooldowns.cool(self.name, kid, until, reason)
            except Exception as exc:  # this node still holds back; the others learn by their own 429
                log.event("cooldown_write_failed", "warning", provider=self.name, key_id=kid,
                          error=f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------ the retry loop

    async def complete(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], *,
                       deadline: float, sink: Sink | None = None) -> Reply:
        body = self._body(system, messages, tools)
        if sink is not None:
            body = {**body, **self.stream_fields}
        data = self._encode(body, tools)
        backoff = BACKOFF_FIRST
        last = "no attempt made"
        while True:
            # Read at every attempt: a key rotated meanwhile (crewlet.vault) is
            # the one the next attempt sends.
            key = await self.api_key()
            kid = key_id(key)
            headers = {"content-type": "application/json", **self._headers(key)}
            await self._wait_cooldown(kid, deadline)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProviderError(f"provider {self.name}: deadline passed ({last})", retryable=True)
            timeout = min(remaining, REQUEST_TIMEOUT_CAP)
            try:
                if sink is None:
                    return await self._attempt(headers, data, timeout)
                return await self._stream(headers, data, timeout, sink)
            except (aiohttp.ClientError, TimeoutError, StreamCut) as exc:
                last = self._redact(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
                wait = backoff
            except Refused as refused:
                status, asked = refused.status, refused.asked
                last = self._redact(refused.said)
                if status == 429:
                    # At least the backoff: a "Retry-After: 0" repeated must not become a busy loop.
                    cool = DEFAULT_COOLDOWN if asked is None else max(asked, backoff)
                    backoff = min(backoff * 2, BACKOFF_CAP)
                    await self._cool(kid, time.time() + cool, last)
                    continue  # the cooldown check at the top waits or gives up
                if status in (401, 403) and await self._key_id() != kid:
                    continue  # refused a key rotated meanwhile: the next attempt sends the new one
                if status < 500 and status not in _RETRY_4XX:
                    raise ProviderError(f"provider {self.name}: {last}", retryable=False) from None
                wait = backoff if asked is None else asked
            if time.monotonic() + wait >= deadline:
                raise ProviderError(f"provider {self.name}: {last}; no time left to retry",
                                    retryable=True)
            log.event("provider_retry", "warning", provider=self.name, error=last, wait=round(wait, 3))
            await asyncio.sleep(wait)
            backoff = min(backoff * 2, BACKOFF_CAP)

    async def _wait_cooldown(self, kid: str, deadline: float) -> None:
        """Return once the key is not cooling; CoolingDown if it cools past *deadline*."""
        while (until := await self._cooling_until(kid)) is not None:
            wait = until - time.time()
            if time.monotonic() + wait >= deadline:
                raise CoolingDown(f"provider {self.name}: key {kid} cools for {wait:.1f}s more, "
                                  f"past the deadline", until=until, key=kid, provider=self.name)
            await asyncio.sleep(wait)

    async def _attempt(self, headers: dict[str, str], data: bytes, timeout: float) -> Reply:
        """One request answered in one JSON body."""
        async with asyncio.timeout(timeout):  # the whole attempt: connect, send, the body read
            async with self._session.post(self._url(), data, headers, self._env) as response:
                raw = await response.read()
                if not 200 <= response.status < 300:
                    raise _refused(response, raw)
        return self._parsed(lambda: self._reply(json.loads(raw)), raw)

    async def _stream(self, headers: dict[str, str], data: bytes, timeout: float,
                      sink: Sink) -> Reply:
        """One request answered as a stream, its text told to *sink* as it comes."""
        assembly = self._assembly()
        streamed = False
        seen = ""  # the event being read: quoted if it is malformed
        try:
            # The timeout bounds the whole attempt, as _attempt's does.
            async with asyncio.timeout(timeout), self._session.post(
                    self._url(), data, headers, self._env) as response:
                if not 200 <= response.status < 300:
                    raise _refused(response, await response.read())
                async for event, seen in sse_events(body_lines(response.content.iter_any())):
                    text = self._parsed(lambda: assembly.feed(event, seen), seen)
                    if text:
                        streamed = True
                        await sink.delta(text)
                    if assembly.done:
                        break
            if not assembly.done:
                raise StreamCut("the stream ended before its end marker")
            return self._parsed(lambda: self._reply(assembly.body()), seen)
        except (aiohttp.ClientError, TimeoutError, StreamCut, Refused, ProviderError):
            # The stream's own failures, not the sink's: what the sink was told is void.
            if streamed:
                await sink.restart()
            raise

    def _parsed(self, read: Callable[[], Any], quoted: str | bytes) -> Any:
        """*read*() — reading what the endpoint sent (*quoted*, decoded only
        if it must be quoted) — or a ProviderError quoting it."""
        try:
            return read()
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            if isinstance(quoted, bytes):
                quoted = quoted[:_ERROR_QUOTE * 4].decode("utf-8", "replace")
            raise ProviderError(self._redact(
                f"provider {self.name}: unexpected response ({type(exc).__name__}: {exc}): "
                f"{quoted[:_ERROR_QUOTE]}"), retryable=False) from exc

    async def close(self) -> None:
        await self._session.close()


# Tool lists whose JSON a provider keeps (a seat's list changes only with its MCP servers).
TOOLS_JSON_KEPT = 64


def _dumps(value: Any) -> bytes:
    """JSON as a request body carries it: compact, UTF-8, no NaN."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class _Session:
    """A provider's HTTP client: one aiohttp session (and its pool of
    keep-alive connections) for the event loop it is used on.

    Why aiohttp: bench/slow_turns.py at 1,000 turns in flight measured the
    HTTP client at 0.67 ms of CPU a request with httpx2 (already cut into
    clients of 16 connections: its pool scans every connection on each
    request) against 0.21 ms with aiohttp, whose pool is a queue per host and
    whose response parser is C; the client was ~half the seats process.

    The pool has no bound of its own: the node's turn slots
    (``node.max_concurrent``) bound the requests in flight. A proxy is taken
    from the provider's environment as httpx and curl do (``HTTPS_PROXY``,
    ``HTTP_PROXY``, ``NO_PROXY``, any case), read once per URL: aiohttp's own
    ``trust_env`` looks it up again in a thread on every request (two
    executor jobs a request, measured).

    Invariant: ``_session`` is None or a session made on ``_loop``. A session
    belongs to the loop it was made on, so a provider used from another loop
    (a test's second ``asyncio.run``) gets a session of its own there."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proxies: dict[str, str | None] = {}  # url -> its proxy from the environment

    def post(self, url: str, data: bytes, headers: dict[str, str], env: Mapping[str, str]) -> Any:
        """``session.post`` through the proxy *env* names for *url*, if any: use as ``async with``."""
        proxy = self._proxies.get(url, "")
        if proxy == "":
            proxy = self._proxies[url] = env_proxy(url, env)
        return self._get().post(url, data=data, headers=headers, proxy=proxy)

    def _get(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None))  # each attempt's own asyncio.timeout bounds it
            self._loop = loop
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed and self._loop is asyncio.get_running_loop():
            await session.close()


def env_proxy(url: str, env: Mapping[str, str]) -> str | None:
    """The proxy *env* names for *url*: ``<scheme>_proxy`` (``HTTPS_PROXY``…;
    the lower-case name wins over the upper), unless ``no_proxy`` covers its
    host (as :mod:`urllib.request` reads it); None for none."""
    proxies: dict[str, str] = {}
    for name in sorted(env, key=str.islower):  # lower case last: it wins
        if name.lower().endswith("_proxy") and env[name]:
            proxies[name[:-6].lower()] = env[name]
    parts = urllib.parse.urlsplit(url)
    if not proxies.get(parts.scheme):
        return None
    no = proxies.get("no")
    if no and urllib.request.proxy_bypass_environment(parts.hostname or "", {"no": no}):
        return None
    return proxies[parts.scheme]


def _refused(response: aiohttp.ClientResponse, raw: bytes) -> Refused:
    status = response.status
    return Refused(status, f"HTTP {status}: {endpoint_says(raw, response.reason)}",
                   retry_after(response.headers))


def tool_args(raw: Any) -> dict[str, Any]:
    """A call's arguments as a dict: JSON text is decoded; anything that is not an
    object comes as ``{"_raw": text}``, so the tool reports it to the model."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return {"_raw": raw}
        return value if isinstance(value, dict) else {"_raw": raw}
    return {"_raw": json.dumps(raw)}
