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
  the tail that might still become a secret: the last few characters, and
  a shape from its opening (``password=``, ``Bearer``…) until it is decided.
* :func:`crewlet.log.forward`: every line a child wrote, in crewletd; and a
  seat's MCP server's stderr, read by the seats role from its own pipe and
  re-emitted, scrubbed, as ``mcp_server_output`` (:mod:`crewlet.agent.mcp`).

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
changes, replaces them when one is there), and the shapes regex runs only
on text whose lower case holds one of the words a shape opens with
(:data:`_SHAPE_WORDS`: ``api_key``, ``access-token``, ``password``…, never
a bare ``key`` or ``token``, which most JSON tool results hold): the look is
~6 µs a KB, a twentieth of the regex it spares. A text that does hold one
pays the regex, ~25 µs a KB (entered only where a shape's first letter is).
``bench/redaction.py`` measures both beside bare scans of the same text.

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
    # Entered only where one of them may begin (a shape's first letter; "ſ" is
    # an s to (?i)): ~4x faster than trying every alternative at every character.
    r"(?=[sSbBaAxXpP\u017f])(?:"
    r"(?P<key>\bsk-[A-Za-z0-9_-]{8,})"
    r"|(?i:\b(?:bearer|basic)\s+)(?=[^\s]*\d)(?P<auth>[A-Za-z0-9._~+/=-]{8,})"
    r"|(?i:(?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|secret|password)"
    r"[\"']?\s*[:=]\s*[\"']?)(?=[^\s\"',;}&]*\d)(?P<pair>[^\s\"',;}&]{8,}))")
# Words one of which the lower case of any text SECRET_SHAPES matches holds
# (each shape opens with one): a text without any is not searched. Not "key"
# nor "token" alone: most JSON tool results hold those, and would all pay the
# regex (~25x the look) for nothing.
_SHAPE_WORDS = ("sk-", "bearer", "basic", "api_key", "api-key", "apikey", "access_token",
                "access-token", "accesstoken", "auth_token", "auth-token", "authtoken",
                "secret", "password")
# What (?i) takes for an ASCII letter of those words but str.lower() does not
# make one (U+0130 lowers to "i" + a combining dot): the look folds them too,
# so it never passes over a text the regex would match.
_FOLD = (("i\u0307", "i"), ("\u0131", "i"), ("\u017f", "s"))
# The tail of a text that may still become a shape: a shape's opening, and
# whatever of its credential came so far, to the end of the text (its digits,
# or more of it, may be yet to come). A Stream holds from its start until the
# credential ends, whatever its length. Each alternative is SECRET_SHAPES's
# with its credential's run made open-ended (auth's lookahead reads the whole
# non-space run, so that run must end).
_UNDECIDED = re.compile(
    r"(?=[sSbBaAxXpP\u017f])(?:"
    r"(?P<key>\bsk-[A-Za-z0-9_-]*)"
    r"|(?P<auth>(?i:\b(?:bearer|basic))(?:\s+\S*)?)"
    r"|(?P<pair>(?i:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|secret|password)"
    r"(?:[\"']?\s*(?:[:=]\s*[\"']?[^\s\"',;}&]*)?)?)"
    r")\Z")
# For each shape, a piece made only of characters that do not end its
# credential: appended to an undecided tail of that shape, it leaves it
# undecided (or no shape at all: holding it a while longer is harmless), so
# Stream.feed takes it without searching again — a long credential streamed
# in small pieces is not searched once a piece.
_UNDECIDING = {"key": re.compile(r"[A-Za-z0-9_-]*"), "auth": re.compile(r"\S*"),
               "pair": re.compile(r"[^\s\"',;}&]*")}
# Environment variables whose values a program might print back: named like a secret.
SECRET_ENV = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)")
# What bare_env keeps of this process's environment: where programs are, the
# locale and time zone (how a program writes its lines), and the Go runtime's
# tuning (nats-server is Go; an operator may set GOMEMLIMIT for it). None of
# it is a secret.
BARE_ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
                 "GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG", "GOTRACEBACK")
# Characters of a streamed text's tail a Stream holds back whatever the values
# known and the shapes begun: the room a shape's opening still being written
# needs ("x-api-key" split in two) — about eight tokens of a model's text.
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
    if not may_hold_shape(text):
        return text
    return SECRET_SHAPES.sub(_hide, text)


def may_hold_shape(text: str) -> bool:
    """False when *text* cannot hold a match of :data:`SECRET_SHAPES` (none
    of :data:`_SHAPE_WORDS` is in its lower case): the cheap look before the
    regex. True is only a maybe."""
    lowered = text.lower()
    if not text.isascii():
        for odd, plain in _FOLD:
            lowered = lowered.replace(odd, plain)
    return any(word in lowered for word in _SHAPE_WORDS)


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
    secret split at a piece's edge goes. Held are:

    * the last :data:`STREAM_HOLD` characters (a shape's opening being written);
    * any tail that begins a known value;
    * a shape from its opening on while it is undecided (:data:`_UNDECIDED`:
      ``password=`` and then forty letters is held until its credential ends,
      for a digit at the fiftieth character makes it one) — however long;
    * any match that reaches into one of those;
    * never a cut inside a word a shape's ``\\b`` would then see begin
      (``xsk-…``, which is no key, held whole).
    """

    def __init__(self) -> None:
        self._known = ""   # held back from the known values' pass
        self._held = ""    # held back from the shapes' pass (known values replaced)
        self._open: re.Pattern | None = None  # _held ends in an undecided shape: _UNDECIDING's

    def feed(self, piece: str) -> str:
        # Two passes, as scrub() makes them: the known values, then the shapes
        # on what that released (a value replaced can end a word a shape's \b
        # then sees begin: "…[redacted]Bearer").
        text = self._feed_known(piece)
        return self._feed_shapes(text) if text else ""

    def _feed_known(self, piece: str) -> str:
        text = self._known + piece
        if _known.pattern is None:
            self._known = ""
            return text
        cut = len(text)
        firsts, longest = _known.firsts, _known.longest
        # A known value that begins here and runs past the end of what came
        # so far: hold from its start.
        for i in range(max(0, len(text) - longest + 1), cut):
            if any(value.startswith(text[i:]) for value in firsts.get(text[i], ())):
                cut = i
                break
        # A whole value across the cut (a longer one met first): hold all of it.
        for m in _known.pattern.finditer(text):
            if m.start() < cut < m.end():
                cut = m.start()
                break
        self._known = text[cut:]
        return scrub_known(text[:cut]) if cut else ""

    def _feed_shapes(self, piece: str) -> str:
        if self._open is not None and self._open.fullmatch(piece):
            # More of an undecided shape's credential: still undecided, all held.
            self._held += piece
            return ""
        text = self._held + piece
        cut = max(0, len(text) - STREAM_HOLD)
        # A shape not decided yet (its credential may still turn into one, or
        # grow): hold from its opening.
        undecided = _UNDECIDED.search(text)
        self._open = None if undecided is None else _UNDECIDING[undecided.lastgroup]
        if undecided is not None and undecided.start() < cut:
            cut = undecided.start()
        # Not inside a word before what would open a shape at a word's edge
        # (sk-, Bearer, Basic): held alone, "xsk-abcdefgh1" would start with one.
        if 0 < cut < len(text) and text[cut] in "sbB" and _is_word(text[cut - 1]):
            while cut > 0 and _is_word(text[cut - 1]):
                cut -= 1
        # A whole match across the cut, or whose lookahead read past it (auth's
        # reads the credential's whole non-space run, for a digit): hold all of
        # it (one pass, from the right: a match further left that reaches past
        # the new cut is met after; each starts at a word's edge or needs none).
        if may_hold_shape(text):
            for start, end in sorted(map(_reach, SECRET_SHAPES.finditer(text)), reverse=True):
                if start < cut < end:
                    cut = start
        self._held = text[cut:]
        return scrub_shapes(text[:cut]) if cut else ""

    def end(self) -> str:
        """The rest of the text, scrubbed; the stream starts afresh."""
        rest = self._held + scrub_known(self._known)
        self._known, self._held, self._open = "", "", None
        return scrub_shapes(rest) if rest else ""

    def drop(self) -> None:
        """Forget what is held."""
        self._known, self._held, self._open = "", "", None


def _reach(match: re.Match) -> tuple[int, int]:
    """Where a :data:`SECRET_SHAPES` match starts, and the end of what decided
    it: its end, or for ``auth`` the end of the non-space run its lookahead read."""
    if match.group("auth") is None:
        return match.span()
    return match.start(), _NON_SPACE.match(match.string, match.start("auth")).end()


_NON_SPACE = re.compile(r"\S*")


def _is_word(char: str) -> bool:
    """Is *char* a word character, as ``\\b`` sees one (re's \\w: alphanumeric or _)?"""
    return char.isalnum() or char == "_"


# --------------------------------------------------------------------------
# What a node knows
# --------------------------------------------------------------------------

def company_env_names(company: Any) -> list[str]:
    """The environment variables *company* (a :class:`~crewlet.company.model.Company`
    or its JSON dump) names as holding a secret: providers' ``api_key_env``,
    integrations' ``secret_env`` and their reconcile's ``token_env``."""
    if company is None:
        return []
    providers = _get(company, "providers") or {}
    integrations = _get(company, "integrations") or {}
    names = [_get(p, "api_key_env") for p in providers.values()]
    names += [_get(i, "secret_env") for i in integrations.values()]
    names += [_get(_get(i, "reconcile") or {}, "token_env") for i in integrations.values()]
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
