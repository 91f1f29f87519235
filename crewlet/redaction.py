"""Secrets kept: known secret values out of what crewlet stores, shows and logs (DESIGN §14).

A model reads whatever its tools bring back, and a tool (or the model it
serves) may say a secret back: an MCP server printing its environment, a CLI
agent echoing a key, a web page quoting a token. What crewlet keeps of that
text — a conversation's messages, the run events, the turn record, the live
feed, the estate, the node's log — must not hold one. So every process keeps
a set of the secret values it knows, and text from a tool or an agent passes
through :func:`scrub` where it enters crewlet:

* :mod:`crewlet.agent.turn`: every tool result, and every provider reply's
  text and tool-call arguments, before the model, the hooks, the sink or the
  record see them (a model that never reads a secret cannot be talked into
  sending it; a call whose arguments name one sends :data:`REDACTED`
  instead). Streamed text goes through a :class:`Stream`, which holds back
  the little tail that might still become a secret.
* :func:`crewlet.log.forward`: every line a child wrote, in crewletd (so a
  tool's stray stderr, which lands in its role's output, is covered too).

**What is known.** :func:`learn` adds values (ones under :data:`SECRET_MIN`
characters are ignored: replacing every "abc" would garble text and protect
nothing worth the name); nothing is ever forgotten, so a rotated key stays
redacted. :func:`known_secrets` gathers a node's: the values of the
environment variables the company names (providers' ``api_key_env``,
integrations' ``secret_env``), ``smtp.password_env``/``_file``,
``files.secret_key_env``/``_file``, the first-start API token in the run dir
(``ingress.tokens`` and ``tokens_file`` hold digests only), the embedded
broker's passwords (``broker-users.json``), the fleet secrets
(``stream.fleet_credentials``) and an external broker's ``user:password``
(``stream.credentials``). :func:`learn_company` learns them all when a
company is applied: crewletd calls it as it hands a revision out, and every
role as it receives one (:meth:`crewlet.runtime.RoleContext.companies`).

**Shapes.** Besides the values known, :func:`scrub` replaces what is shaped
like a credential whatever its value (:data:`SECRET_SHAPES`: vendor keys,
an Authorization header's credentials, ``password=…`` pairs with a digit in
them); only the credential goes, what names it stays, so the text still
reads. :func:`redact` is the same with a caller's own secrets as well: the
one function provider error text goes through
(:func:`crewlet.agent.providers.base.redact` is this one).

**Cost.** :func:`scrub` runs on every tool result and model reply, and the
known values on every forwarded log line, so a text without a secret costs
little: known values are first looked for with ``str in`` (a few µs a KB
for a dozen values; one compiled alternation, rebuilt only when the set
changes, replaces them when one is there), and the shapes regex (~100 µs a
KB) runs only on text whose lower case holds one of its trigger words.

**The environment of other programs.** A process's environment is readable
by anything of its uid (``/proc/<pid>/environ``), and crewletd's holds every
provider key and webhook secret. So a program crewlet starts that is not
crewlet's own Python (the embedded ``nats-server``, a fault's ``sh``) gets
:func:`bare_env`: an environment built from nothing (``PATH``, locale and
time zone, and the Go runtime's tuning knobs), plus what its caller adds on
purpose. crewlet's own children (the zygote, the roles) keep the environment
they need; MCP servers and CLI agents are :mod:`crewlet.agent.mcp`'s and
:mod:`crewlet.agent.providers.cli`'s to build.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

# What a secret becomes.
REDACTED = "[redacted]"
# Secrets shorter than this are not searched for: replacing every "abc" in a
# text would garble it and protect nothing worth the name.
SECRET_MIN = 8
# Shapes of secrets whatever key is configured: vendor keys (sk-…, sk-ant-…,
# sk-proj-…), an Authorization header's credentials, and key=value / "key":
# "value" pairs named like a key, token, secret or password — the last two
# only with a digit in them, so "Bearer authentication failed" stays words.
# Only the credential (group key, auth or pair) goes; what names it stays, so
# the message still reads.
SECRET_SHAPES = re.compile(
    r"(?P<key>\bsk-[A-Za-z0-9_-]{8,})"
    r"|(?i:\b(?:bearer|basic)\s+)(?=[^\s]*\d)(?P<auth>[A-Za-z0-9._~+/=-]{8,})"
    r"|(?i:(?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|secret|password)"
    r"[\"']?\s*[:=]\s*[\"']?)(?=[^\s\"',;}&]*\d)(?P<pair>[^\s\"',;}&]{8,})")
# Words one of which the lower case of any text SECRET_SHAPES matches holds:
# a text without any is not searched (the regex costs ~25x the look).
_SHAPE_WORDS = ("sk-", "bearer", "basic", "key", "token", "secret", "password")
# Environment variables whose values a program might print back: named like a secret.
SECRET_ENV = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)")
# What bare_env keeps of this process's environment: where programs are, the
# locale and time zone (how a program writes its lines), and the Go runtime's
# tuning (nats-server is Go; an operator may set GOMEMLIMIT for it). None of
# it is a secret.
BARE_ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
                 "GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG", "GOTRACEBACK")
# Characters of a streamed text's tail a Stream holds back whatever the values
# known: the room a shape still being written needs ("password: abc1" waits
# for its digits) — about eight tokens of a model's text.
STREAM_HOLD = 32


class _Known:
    """The process's known values. Invariants: ``values`` is longest first,
    ``pattern`` their alternation (None when none is known), ``firsts`` maps a
    first character to the values that start with it; all three are replaced
    together, under ``lock``, so a reader without the lock sees one set's."""

    values: tuple[str, ...] = ()
    pattern: re.Pattern | None = None
    firsts: dict[str, tuple[str, ...]] = {}
    longest: int = 0
    lock = threading.Lock()


_known = _Known()


def learn(values: Iterable[str | None]) -> int:
    """Add *values* to the secrets this process knows (those under
    :data:`SECRET_MIN` characters, and None, are ignored); how many were new."""
    fresh = {v for v in values if isinstance(v, str) and len(v) >= SECRET_MIN}
    # As a JSON line shows them too ("\"" and non-ASCII escaped): log.forward
    # scrubs the line a child wrote, not its decoded fields.
    fresh |= {json.dumps(v)[1:-1] for v in fresh} - {""}
    with _known.lock:
        new = fresh.difference(_known.values)
        if new:
            _set(set(_known.values) | new)
    return len(new)


def known() -> frozenset[str]:
    """The secret values this process knows."""
    return frozenset(_known.values)


def forget_all() -> None:
    """Know nothing again (for tests: a process never forgets a secret)."""
    with _known.lock:
        _set(set())


def _set(values: set[str]) -> None:
    ordered = tuple(sorted(values, key=lambda v: (-len(v), v)))  # longest first: no partial match wins
    firsts: dict[str, list[str]] = {}
    for v in ordered:
        firsts.setdefault(v[0], []).append(v)
    pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
    _known.firsts = {c: tuple(vs) for c, vs in firsts.items()}
    _known.longest = len(ordered[0]) if ordered else 0
    _known.pattern = pattern
    _known.values = ordered


def scrub(text: str) -> str:
    """*text* with every known secret value, and everything shaped like a
    credential (:data:`SECRET_SHAPES`), replaced by :data:`REDACTED`."""
    return scrub_shapes(scrub_known(text))


def scrub_known(text: str) -> str:
    """*text* with every known secret value replaced by :data:`REDACTED`;
    *text* itself, at the cost of an attribute read, while none is known."""
    values, pattern = _known.values, _known.pattern
    if not values or not text:
        return text
    for value in values:
        if value in text:
            return pattern.sub(REDACTED, text)
    return text


def scrub_shapes(text: str) -> str:
    """*text* with what is shaped like a credential replaced (:data:`SECRET_SHAPES`)."""
    lowered = text.lower()
    if not any(word in lowered for word in _SHAPE_WORDS):
        return text
    return SECRET_SHAPES.sub(_hide, text)


def _hide(match: re.Match) -> str:
    group = next(g for g in ("key", "auth", "pair") if match.group(g) is not None)
    start, end = match.span(group)
    whole = match.group(0)
    return whole[:start - match.start()] + REDACTED + whole[end - match.start():]


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """*text* with each of *secrets* (those under :data:`SECRET_MIN`
    characters are left alone) replaced by :data:`REDACTED`, then
    :func:`scrub`-bed: the values known and the shapes go too."""
    for secret in sorted({s for s in secrets if s and len(s) >= SECRET_MIN}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return scrub(text)


def scrub_value(value: Any) -> Any:
    """*value* (JSON-like: a tool call's arguments) with every string in it,
    keys too, :func:`scrub`-bed; *value* itself when nothing changed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        out = {scrub_value(k): scrub_value(v) for k, v in value.items()}
        same = len(out) == len(value) and all(
            k in value and out[k] is value[k] for k in out)
        return value if same else out
    if isinstance(value, (list, tuple)):
        items = [scrub_value(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    return value


class Stream:
    """Scrubs a text that arrives in pieces (a model's streamed reply), so
    that what is released holds no secret even when one is split between
    pieces: :meth:`feed` returns what may be shown now, :meth:`end` the
    rest once the text is whole, :meth:`drop` forgets what is held (the text
    was void). The joined output is the text :func:`scrub`-bed, as far as a
    secret split at a piece's edge goes: held are the last
    :data:`STREAM_HOLD` characters, any tail that begins a known value, and
    any match that reaches into either."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, piece: str) -> str:
        text = self._held + piece
        cut = max(0, len(text) - STREAM_HOLD)
        firsts, longest = _known.firsts, _known.longest
        # A known value that begins before the cut and runs past the end of
        # what came so far: hold from its start.
        for i in range(max(0, len(text) - longest + 1), cut):
            for value in firsts.get(text[i], ()):
                if value.startswith(text[i:]):
                    cut = i
                    break
            if cut == i:
                break
        # A whole match across the cut: hold all of it (one pass, from the
        # right: a match further left that reaches past the new cut is met after).
        spans = [m.span() for m in SECRET_SHAPES.finditer(text)]
        if _known.pattern is not None:
            spans += [m.span() for m in _known.pattern.finditer(text)]
        for start, end in sorted(spans, reverse=True):
            if start < cut < end:
                cut = start
        self._held = text[cut:]
        return scrub(text[:cut]) if cut else ""

    def end(self) -> str:
        """The rest of the text, scrubbed; the stream starts afresh."""
        rest, self._held = self._held, ""
        return scrub(rest) if rest else ""

    def drop(self) -> None:
        """Forget what is held."""
        self._held = ""


# --------------------------------------------------------------------------
# What a node knows
# --------------------------------------------------------------------------

def company_env_names(company: Any) -> list[str]:
    """The environment variables *company* (a :class:`~crewlet.company.model.Company`
    or its JSON dump) names as holding a secret: providers' ``api_key_env``,
    integrations' ``secret_env``."""
    if company is None:
        return []
    providers = _get(company, "providers") or {}
    integrations = _get(company, "integrations") or {}
    names = [_get(p, "api_key_env") for p in providers.values()]
    names += [_get(i, "secret_env") for i in integrations.values()]
    return [n for n in names if n]


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def known_secrets(config: Any = None, run_dir: str | None = None, company: Any = None,
                  environ: Mapping[str, str] | None = None) -> set[str]:
    """The secret values a node knows (see the module docstring): from its
    *config* (a :class:`~crewlet.config.NodeConfig`), its *run_dir* (the
    config's by default), the environment variables *company* names, read
    in *environ* (this process's by default). A source that cannot be read
    (not made yet, unreadable) gives nothing; this never raises for one."""
    environ = os.environ if environ is None else environ
    found: set[str | None] = {environ.get(name) for name in company_env_names(company)}
    found.update(_mcp_env_secrets(company))
    if config is not None:
        run_dir = run_dir or config.run_dir
        found.add(_quietly(config.smtp.password))
        found.add(_quietly(config.files.secret_key))
        stream = config.stream
        if stream.fleet_credentials:
            from crewlet import credentials
            found.update(_quietly(lambda: credentials.read_fleet_secrets(stream.fleet_credentials)) or ())
        if stream.credentials:
            from crewlet import credentials
            found.add((_quietly(lambda: credentials.read_external(stream.credentials)) or {}).get("password"))
    if run_dir:
        from crewlet import credentials, tokens
        found.add(_quietly(lambda: tokens.read_admin_token(run_dir)))
        found.update((_quietly(lambda: credentials.read(run_dir)) or {}).values())
    return {v for v in found if isinstance(v, str) and len(v) >= SECRET_MIN}


def _mcp_env_secrets(company: Any) -> list[str]:
    """The values of the seats' MCP servers' ``env`` named like secrets: the
    company holds them literally (``GITHUB_TOKEN: ghp_…``), and the server
    that has them may print them."""
    found: list[str] = []
    for seat in _get(company, "seats") or () if company is not None else ():
        for server in _get(seat, "mcp") or ():
            env = _get(server, "env")
            if isinstance(env, Mapping):
                found += env_secrets(env)
    return found


def _quietly(read) -> Any:
    try:
        return read()
    except (OSError, ValueError, KeyError, TypeError):
        return None


def learn_company(company: Any, config: Any = None, run_dir: str | None = None) -> int:
    """Learn the node's secrets (:func:`known_secrets`) as *company* (a
    :class:`~crewlet.company.model.Company` or its dump) is applied; how many
    were new. Never raises: learning must not stop an apply."""
    try:
        return learn(known_secrets(config, run_dir, company))
    except Exception:  # noqa: BLE001 - a node's odd config must not stop its company
        return 0


def env_secrets(env: Mapping[str, str]) -> list[str]:
    """The values in *env* named like secrets (``*_KEY``, ``*TOKEN*``…): what a
    program given the whole environment might echo."""
    return [v for k, v in env.items() if SECRET_ENV.search(k) and v]


def bare_env(extra: Mapping[str, str] | None = None,
             environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment built from nothing for a program that is not crewlet's
    own: :data:`BARE_ENV_KEEP` of *environ* (this process's by default), and
    *extra*, what the caller passes on purpose."""
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in BARE_ENV_KEEP if k in environ}
    env.update(extra or {})
    return env
