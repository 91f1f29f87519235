"""Tier B, the company: the typed model, and the one place its defaults live.

Every model forbids unknown keys, so a typo is an error, never an ignored
setting. Field defaults below are the defaults; nothing else in crewlet may
restate them.

Checks that need one model's own fields are field validators (the error
lands on the key). Checks that cross collections — a seat's provider, a
schedule's or route's seat, budget seat names, unique names — are model
validators that raise :class:`At`, which names the precise key relative to
the model; the loader (:mod:`crewlet.company.load`) joins it to the model's
location, so the message reads ``seats[3].provider: unknown provider 'gpt', known: scripted``.

``integrations`` are inbound webhooks (:mod:`crewlet.hooks` holds their
logic): each is served at ``/v1/hooks/<name>``, proves a delivery with the
HMAC secret named by ``secret`` (a fleet secret, :mod:`crewlet.vault`) or
held in the environment variable ``secret_env`` on every ingress node (the
secret itself never appears in a revision), and mails it to the seat of the
first matching route.
"""

from __future__ import annotations

import fnmatch

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo,
                      field_validator, model_validator)

from crewlet.config.model import Email
from crewlet.learning.cluster import MIN_CLUSTER
from crewlet.queue.base import MAIL_MAX
from crewlet.tokens import PERSON_RE
from crewlet.schedules import CATCH_UP, DEFAULT_CATCH_UP, DEFAULT_TZ, Timing, check_cron, zone

# A seat name is part of NATS subjects and KV keys (agents.inbox.<seat>, seat.<id>).
SEAT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# A provider name is part of KV keys (cooldowns: <provider>.<key id>).
PROVIDER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
# A schedule name is part of its ticks' trigger ids (<name>=<time>) and of a KV key (schedule.<name>).
SCHEDULE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
# An integration name is a URL part (/v1/hooks/<name>) and a KV key part.
INTEGRATION_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# An environment variable name (api_key_env names one; it never holds the key).
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A secret's name (api_key_secret, an integration's secret): a key of the
# `secrets` bucket (crewlet.vault.store), set with `crewletctl secret set NAME`.
SECRET_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
# schedules[].every: a positive whole number and one unit.
DURATION_RE = re.compile(r"^([0-9]+)([smhd])$")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# schedules[].cron: the five classic fields, minute hour day-of-month month day-of-week.
CRON_FIELD_RE = re.compile(r"^[0-9A-Za-z*?/,\-]+$")
CRON_FIELDS = 5
# integrations.<name>.*_header: an HTTP header name (a token; compared case-insensitively).
HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
# Company.digest(): hex characters kept of the sha256.
DIGEST_LENGTH = 16
# Bytes a company may measure as compact JSON -- its stored revision before
# compression (crewlet.coord.control_plane stores it in parts): past it,
# crewletctl apply, crewletd start --company and POST /v1/company refuse it
# (RevisionTooLarge, exit 78 / 413), naming the size and this limit. 10,000
# seats with 2 KiB personas measure ~25 MB. The one place this limit lives.
REVISION_MAX = 64 * 1024 * 1024

CatchUp = Literal[CATCH_UP]
ProviderKind = Literal["scripted", "openai", "anthropic", "cli"]
HTTP_KINDS = ("openai", "anthropic")
# providers.<name>.max_concurrent of a cli provider when not given (None for other kinds).
CLI_MAX_CONCURRENT = 4

IntegrationKind = Literal["github", "slack", "generic"]
# The headers of a generic integration when not given (github and slack have their own, fixed).
GENERIC_SIGNATURE_HEADER = "X-Signature-256"  # sha256=<hex> or <hex> of HMAC-SHA256(secret, body)
GENERIC_DELIVERY_HEADER = "X-Delivery-Id"  # the sender's id of the delivery; a resend repeats it
GENERIC_EVENT_HEADER = "X-Event-Type"  # what happened; routes may match it as `event`
GENERIC_HEADERS = {"signature_header": GENERIC_SIGNATURE_HEADER,
                   "delivery_header": GENERIC_DELIVERY_HEADER,
                   "event_header": GENERIC_EVENT_HEADER}


class At(ValueError):
    """A problem at ``key``, a path relative to the model that raised it
    (``seats[3].provider``); :mod:`crewlet.company.load` prefixes the
    model's own location."""

    def __init__(self, key: str, problem: str):
        super().__init__(problem)
        self.key, self.problem = key, problem


def _pattern(regex: re.Pattern, what: str):
    def check(value: str) -> str:
        if not regex.match(value):
            raise ValueError(f"{what}, got {value!r}")
        return value

    return AfterValidator(check)


def _http_url(value: str) -> str:
    try:
        parts = urlsplit(value)
        ok = (parts.scheme in ("http", "https") and bool(parts.hostname)
              and (parts.port is None or parts.port > 0))
    except ValueError:  # e.g. a non-numeric port
        ok = False
    if not ok:
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return value


SeatName = Annotated[str, _pattern(
    SEAT_NAME_RE, "must be 1-63 of a-z, 0-9, '_' or '-', starting with a letter or digit")]
ProviderName = Annotated[str, _pattern(
    PROVIDER_NAME_RE, "must be 1-63 letters, digits, '_' or '-', starting with a letter or digit")]
ScheduleName = Annotated[str, _pattern(
    SCHEDULE_NAME_RE, "must be 1-63 letters, digits, '_' or '-', starting with a letter or digit")]
IntegrationName = Annotated[str, _pattern(
    INTEGRATION_NAME_RE, "must be 1-63 of a-z, 0-9, '_' or '-', starting with a letter or digit")]
EnvName = Annotated[str, _pattern(
    ENV_NAME_RE, "must be the name of an environment variable (not the key itself)")]
SecretName = Annotated[str, _pattern(
    SECRET_NAME_RE, "must be a secret's name (1-64 letters, digits, '_' or '-', starting with a "
    "letter), set with `crewletctl secret set NAME` (not the secret itself)")]
HeaderName = Annotated[str, _pattern(
    HEADER_NAME_RE, "must be an HTTP header name: 1-64 letters, digits or '-'")]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
PersonId = Annotated[str, _pattern(PERSON_RE, "must be 1-63 of a-z, 0-9, '_', '.' or '-', starting with a "
                                              "letter or digit")]
Tokens = Annotated[int, Field(ge=0)]


def _duplicates(names: list[str], where: str) -> list[At]:
    """An At for every repeat of a name in *names*; *where* is e.g. ``seats[{i}].name``."""
    first: dict[str, int] = {}
    out = []
    for i, name in enumerate(names):
        if name in first:
            out.append(At(where.format(i=i), f"duplicate name {name!r} (also {where.format(i=first[name])})"))
        else:
            first[name] = i
    return out


def _raise_first(problems: list[At]) -> None:
    if problems:
        first = problems[0]
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise At(first.key, first.problem + more)


class _Model(BaseModel):
    # Numbers are accepted where strings are expected (e.g. label values, personas).
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class CompanySection(_Model):
    name: str = Field(min_length=1)  # the company's display name


# ------------------------------------------------------------------ providers

class ToolCall(_Model):
    name: str = Field(min_length=1)  # the tool to call, e.g. send
    args: dict[str, Any] = Field(default_factory=dict)  # its arguments; strings may hold \1, \2 …


class Rule(_Model):
    """A scripted provider's rule: the first whose ``match`` is found in the message answers."""

    match: str  # a Python regular expression, searched in the incoming message
    reply: str  # the text of the reply
    tools: list[ToolCall] = Field(default_factory=list)  # tool calls made before replying
    # Seconds between the words of a streamed reply (a test's slow model); 0: no wait.
    pace: float = Field(0.0, ge=0, le=60)

    @field_validator("match")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regular expression: {e}") from None
        return v


class Provider(_Model):
    """A model provider. Which keys apply depends on ``kind``:

    ========= =====================================================
    scripted  rules (deterministic, offline; the sample's provider)
    openai    model, base_url, api_key_env or api_key_secret (an
              OpenAI-compatible API)
    anthropic model, base_url, api_key_env or api_key_secret
    cli       command (required), max_concurrent, model, api_key_env (the one
              variable of crewlet's environment its agent gets), or
              api_key_secret with api_key_env (the secret's value, given to
              the agent under that variable's name)
    ========= =====================================================

    ``api_key_secret`` names a fleet secret (``crewletctl secret set``,
    :mod:`crewlet.vault`): a new version is used from the next request on,
    on every node, with no restart.
    """

    kind: ProviderKind  # what talks to the model
    model: str | None = Field(None, min_length=1)  # model name passed to the provider
    base_url: HttpUrl | None = None  # API endpoint (openai/anthropic); None: the vendor's
    # env var holding the API key (openai/anthropic); for cli, the one variable of
    # crewlet's environment its agent is given, under the same name
    api_key_env: EnvName | None = None
    # the fleet secret holding the API key (crewletctl secret set NAME); with kind cli, its
    # value reaches the agent as the variable api_key_env names
    api_key_secret: SecretName | None = Field(None, validate_default=True)
    # argv of the CLI agent (cli; required there)
    command: list[str] | None = Field(None, min_length=1, validate_default=True)
    # CLI agent subprocesses at once, per node (cli only; unset: CLI_MAX_CONCURRENT)
    max_concurrent: int | None = Field(None, ge=1, validate_default=True)
    rules: list[Rule] = Field(default_factory=list)  # scripted replies, first match wins (scripted)

    @field_validator("base_url")
    @classmethod
    def _http_only(cls, v: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("kind")
        if v is not None and kind is not None and kind not in HTTP_KINDS:
            raise ValueError(f"only for kind openai or anthropic, not {kind}")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _keyed(cls, v: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("kind")
        if v is not None and kind is not None and kind not in (*HTTP_KINDS, "cli"):
            raise ValueError(f"only for kind openai, anthropic or cli, not {kind}")
        return v

    @field_validator("api_key_secret")
    @classmethod
    def _secret(cls, v: str | None, info: ValidationInfo) -> str | None:
        kind, env = info.data.get("kind"), info.data.get("api_key_env")
        if v is None or kind is None:
            return v
        if kind not in (*HTTP_KINDS, "cli"):
            raise ValueError(f"only for kind openai, anthropic or cli, not {kind}")
        if kind == "cli" and env is None:
            raise ValueError("with kind cli, give api_key_env too: the variable the agent reads "
                             "the secret's value from")
        if kind != "cli" and env is not None:
            raise ValueError("give api_key_env or api_key_secret, not both")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        kind = info.data.get("kind")
        if kind == "cli" and v is None:
            raise ValueError("required for kind cli: the argv of the agent, e.g. [claude, -p]")
        if kind not in (None, "cli") and v is not None:
            raise ValueError(f"only for kind cli, not {kind}")
        return v

    @field_validator("max_concurrent")
    @classmethod
    def _cli_only(cls, v: int | None, info: ValidationInfo) -> int | None:
        kind = info.data.get("kind")
        if kind == "cli":
            return CLI_MAX_CONCURRENT if v is None else v
        if kind is not None and v is not None:
            raise ValueError(f"only for kind cli, not {kind}")
        return v

    @field_validator("rules")
    @classmethod
    def _scripted_only(cls, v: list[Rule], info: ValidationInfo) -> list[Rule]:
        kind = info.data.get("kind")
        if v and kind not in (None, "scripted"):
            raise ValueError(f"only for kind scripted, not {kind}")
        return v


# ------------------------------------------------------------------ seats

class Placement(_Model):
    labels: dict[str, str] = Field(default_factory=dict)  # only a node whose labels include these

    def allows(self, node_labels: Mapping[str, str]) -> bool:
        """May a node with *node_labels* hold the seat?"""
        return all(node_labels.get(k) == v for k, v in self.labels.items())


class SandboxPolicy(_Model):
    """What a seat's tool processes may see and use (crewlet.sandbox). On a
    seat it is the policy of its CLI agent and the default of its MCP
    servers; on a server, each key given overrides the seat's. A key not
    given (null) takes the seat's, then crewlet.sandbox's default; a limit
    of 0 is no limit."""

    network: Literal["host", "none"] | None = None  # none: an empty network namespace of its own
    # Absolute host paths shown read-only / read-write at the same path (never the data dir).
    read_only: list[Annotated[str, Field(pattern=r"^/", max_length=4096)]] | None = Field(None, max_length=64)
    read_write: list[Annotated[str, Field(pattern=r"^/", max_length=4096)]] | None = Field(None, max_length=64)
    memory: int | None = Field(None, ge=0, le=1 << 44)  # bytes of heap (RLIMIT_DATA); 16 MiB at least
    processes: int | None = Field(None, ge=0, le=1 << 20)  # processes and threads of the seat (RLIMIT_NPROC)
    open_files: int | None = Field(None, ge=0, le=1 << 20)  # RLIMIT_NOFILE; 16 at least
    cpu_seconds: int | None = Field(None, ge=0, le=1 << 31)  # CPU time, then SIGXCPU (RLIMIT_CPU)

    @field_validator("memory")
    @classmethod
    def _enough_memory(cls, v: int | None) -> int | None:
        if v and v < 16 << 20:
            raise ValueError(f"expected 0 (no limit) or at least 16 MiB ({16 << 20}), got {v}: "
                             "no program starts in less")
        return v

    @field_validator("open_files")
    @classmethod
    def _enough_files(cls, v: int | None) -> int | None:
        if v and v < 16:
            raise ValueError(f"expected 0 (no limit) or at least 16, got {v}")
        return v


# The limits of a policy, where 0 says "no limit" (None is "not given").
_LIMITS = ("memory", "processes", "open_files", "cpu_seconds")


def effective_sandbox(*layers: SandboxPolicy | None):
    """The :class:`crewlet.sandbox.Policy` of a tool: crewlet's defaults,
    then each of *layers* (a seat's, a server's) key by key where given."""
    from crewlet.sandbox import DEFAULT_POLICY, Policy

    values = {k: getattr(DEFAULT_POLICY, k) for k in Policy.__dataclass_fields__}
    for layer in layers:
        if layer is None:
            continue
        for key in values:
            value = getattr(layer, key)
            if value is None:
                continue
            if key in _LIMITS:
                value = value or None  # 0: none
            values[key] = tuple(value) if isinstance(value, list) else value
    return Policy(**values)


class McpServer(_Model):
    name: str = Field(min_length=1)  # unique per seat; names the server's tools
    command: str = Field(min_length=1)  # executable of the stdio MCP server
    args: list[str] = Field(default_factory=list)  # its arguments
    env: dict[str, str] = Field(default_factory=dict)  # extra environment of the server
    approval: bool = False  # every tool of this server waits for a person's approval (conversations)
    sandbox: SandboxPolicy | None = None  # overrides the seat's sandbox, key by key


class Seat(_Model):
    name: SeatName  # unique; the mailbox and lease are named after it
    persona: str  # the system prompt: who this seat is and what it does
    provider: str  # a key of `providers`
    placement: Placement = Field(default_factory=Placement)  # where the seat may run
    mcp: list[McpServer] = Field(default_factory=list)  # the seat's own tool servers, spawned with its lease
    sandbox: SandboxPolicy | None = None  # what its tools and CLI agent may see and use (crewlet.sandbox)
    # Tools whose calls in a conversation wait for a person's approval: names or shell-style
    # patterns as the model sees them ("send_mail", "github__*"; "*": every tool of the seat).
    approval: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_mcp(self) -> Seat:
        _raise_first(_duplicates([m.name for m in self.mcp], "mcp[{i}].name"))
        return self

    def needs_approval(self, tool: str) -> bool:
        """Does a call of *tool* (its name as offered to the model) wait for a
        person in a conversation? Mail turns never wait: nobody is there."""
        if any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.approval):
            return True
        return any(server.approval and tool.startswith(server.name + "__") for server in self.mcp)


# ------------------------------------------------------------------ the rest

class Schedule(_Model):
    """A message sent to a seat's mailbox at its times: exactly one of every, cron.

    The ``scheduler`` duty sends it (:mod:`crewlet.schedules` says when, and
    what ``catch_up`` does with ticks missed while no node held the duty).
    """

    name: ScheduleName  # unique among schedules; part of each tick's trigger id
    seat: str  # the seat that receives the message
    every: str | None = None  # a period: a whole number and s, m, h or d ("30s", "5m", "1h", "1d")
    cron: str | None = Field(None, validate_default=True)  # five cron fields: minute hour day month weekday
    # the IANA time zone cron is read in (cron only; every counts from the Unix epoch, UTC)
    tz: str | None = Field(None, validate_default=True)
    catch_up: CatchUp = DEFAULT_CATCH_UP  # ticks missed while no node held the duty: latest, all or none
    message: str = Field(max_length=MAIL_MAX)  # the text delivered (a mail's limit)

    @field_validator("every")
    @classmethod
    def _every(cls, v: str | None) -> str | None:
        if v is None:
            return v
        m = DURATION_RE.match(v)
        if not m or int(m.group(1)) == 0:
            raise ValueError(f"expected a positive duration like 30s, 5m, 1h or 1d, got {v!r}")
        return v

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str | None, info: ValidationInfo) -> str | None:
        every = info.data.get("every")
        if v is not None and every is not None:
            raise ValueError("give either every or cron, not both")
        if v is None:
            if every is None and "every" in info.data:
                raise ValueError("required when every is not given: give exactly one of every or cron")
            return v
        fields = v.split()
        if len(fields) != CRON_FIELDS or not all(CRON_FIELD_RE.match(f) for f in fields):
            raise ValueError(f"expected five cron fields (minute hour day month weekday), got {v!r}")
        return check_cron(v)

    @field_validator("tz")
    @classmethod
    def _tz(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return DEFAULT_TZ if info.data.get("every") is None else None
        if info.data.get("every") is not None:
            raise ValueError("only for cron: every counts from the Unix epoch, in UTC")
        zone(v)
        return v

    @property
    def period(self) -> int | None:
        """``every`` in seconds (None for a cron schedule)."""
        if self.every is None:
            return None
        m = DURATION_RE.match(self.every)
        return int(m.group(1)) * DURATION_UNITS[m.group(2)]

    @property
    def timing(self) -> Timing:
        """When it ticks (:class:`crewlet.schedules.Timing`)."""
        if self.every is not None:
            return Timing(every=self.period)
        return Timing(cron=self.cron, tz=self.tz or DEFAULT_TZ)


class Route(_Model):
    """Where a delivery goes: every field given must equal the delivery's fact
    of that name (exactly; an absent field matches anything)."""

    seat: str  # the seat that receives the delivery as mail
    event: str | None = Field(None, min_length=1)  # e.g. issues (github), app_mention (slack)
    repository: str | None = Field(None, min_length=1)  # owner/name (github; generic: the body's)
    channel: str | None = Field(None, min_length=1)  # a channel id (slack; generic: the body's)
    action: str | None = Field(None, min_length=1)  # e.g. opened (github), a message subtype (slack)

    def matches(self, facts: Mapping[str, str]) -> bool:
        """Does a delivery with *facts* take this route?"""
        return all(want is None or facts.get(fact) == want
                   for fact, want in (("event", self.event), ("repository", self.repository),
                                      ("channel", self.channel), ("action", self.action)))


def _exactly_one(v: Any, info: ValidationInfo, other: str, message: str) -> Any:
    """*v* (the field being validated), when exactly one of it and the field
    *other* (validated before it) is given; ValueError *message* otherwise."""
    named = info.data.get(other)
    if v is None and named is None and other not in info.data:
        return v  # the other was invalid itself: that error is the one to read
    if (v is None) == (named is None):
        raise ValueError(message)
    return v


# integrations.<name>.reconcile.repository: a GitHub owner/name.
GITHUB_REPOSITORY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")
GITHUB_API = "https://api.github.com"


class Reconcile(_Model):
    """A GitHub webhook's deliveries looked over by the ``reconcile`` duty
    (roles/workers/duties/reconcile.py): each one that failed and that no node
    stored is redelivered by GitHub, so a delivery missed while every ingress
    was down still becomes mail, once. GitHub keeps three days of deliveries."""

    repository: Annotated[str, _pattern(GITHUB_REPOSITORY_RE, "must be a GitHub repository, owner/name")]
    hook_id: int = Field(ge=1)  # the webhook's id (its settings page's URL ends with it)
    # a token that may read and redeliver the hook's deliveries (repository webhooks: read
    # and write): a fleet secret's name, or an environment variable on the workers nodes
    token_secret: SecretName | None = None
    token_env: EnvName | None = Field(None, validate_default=True)
    api_url: HttpUrl = GITHUB_API  # GitHub's REST API (GitHub Enterprise: https://<host>/api/v3)
    every: int = Field(300, ge=1, le=86400)  # seconds between looks
    window: int = Field(86400, ge=60, le=3 * 86400)  # seconds back a look goes (GitHub keeps 3 days)

    @field_validator("token_env")
    @classmethod
    def _one_token(cls, v: str | None, info: ValidationInfo) -> str | None:
        return _exactly_one(v, info, "token_secret", "give token_secret (a fleet secret's name) or "
                                                     "token_env, exactly one")


class Integration(_Model):
    """An inbound webhook, served at ``/v1/hooks/<name>``. Which keys apply
    depends on ``kind``:

    ======== ==============================================================
    github   X-Hub-Signature-256, X-GitHub-Delivery, X-GitHub-Event (fixed);
             reconcile: its missed deliveries redelivered
    slack    X-Slack-Signature over v0:<timestamp>:<body> (fixed)
    generic  signature_header, delivery_header, event_header (defaults above)
    ======== ==============================================================
    """

    kind: IntegrationKind  # who sends, and so how a delivery is proved and read
    # the fleet secret that signs deliveries (crewletctl secret set NAME; a rotation keeps
    # the old one accepted for its grace), or:
    secret: SecretName | None = None
    # env var, on every ingress node, holding the signing secret (never the secret itself)
    secret_env: EnvName | None = Field(None, validate_default=True)
    # generic only: the header with sha256=<hex> (or <hex>) of HMAC-SHA256(secret, body)
    signature_header: HeaderName | None = Field(None, validate_default=True)
    delivery_header: HeaderName | None = Field(None, validate_default=True)  # generic only: the delivery id
    event_header: HeaderName | None = Field(None, validate_default=True)  # generic only: the event type
    routes: list[Route] = Field(min_length=1)  # the first whose fields all match takes the delivery
    # github only: its deliveries looked over and the missed ones redelivered (a duty)
    reconcile: Reconcile | None = Field(None, validate_default=True)

    @field_validator("reconcile")
    @classmethod
    def _github_only(cls, v: Reconcile | None, info: ValidationInfo) -> Reconcile | None:
        kind = info.data.get("kind")
        if v is not None and kind is not None and kind != "github":
            raise ValueError(f"only for kind github (the only sender with a deliveries API), not {kind}")
        return v

    @field_validator("secret_env")
    @classmethod
    def _one_secret(cls, v: str | None, info: ValidationInfo) -> str | None:
        return _exactly_one(v, info, "secret", "give secret (a fleet secret's name) or secret_env (an "
                                               "environment variable's), exactly one")

    @field_validator("signature_header", "delivery_header", "event_header")
    @classmethod
    def _generic_only(cls, v: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("kind")
        if kind == "generic":
            return GENERIC_HEADERS[info.field_name] if v is None else v
        if kind is not None and v is not None:
            raise ValueError(f"only for kind generic, not {kind}")
        return v


# people.<id>.identities: the system a person is known by (github, slack, or a generic
# integration's name) and their id there (a login, a user id, an address).
IDENTITY_SYSTEM_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
IDENTITY_MAX = 200


class Decides(_Model):
    """What a person may decide."""

    # Seats whose tool calls this person may approve or deny: names, or shell-style
    # patterns ("eng-*"; "*": every seat). When any person is named for a seat, only
    # they may decide its approvals; a seat nobody is named for is decided by any
    # token with the write scope, as without people.
    approvals: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list)
    promotions: bool = False  # may promote a drafted skill (the learning passes)

    def approves(self, seat: str) -> bool:
        return any(fnmatch.fnmatchcase(seat, pattern) for pattern in self.approvals)


class Person(_Model):
    """Someone the company knows (an identity map entry): who they are here and
    elsewhere, and what they may decide."""

    name: str = Field(min_length=1, max_length=200)  # how mail and records name them
    email: Email | None = None  # where a notification to them goes
    # their ids elsewhere, by system: github (a login), slack (a user id), or a generic
    # integration's name (its deliveries' sender field); one person per id
    identities: dict[Annotated[str, _pattern(IDENTITY_SYSTEM_RE, "must be a system's name: github, slack, "
                                            "or a generic integration's name")],
                     Annotated[str, Field(min_length=1, max_length=IDENTITY_MAX)]] = Field(default_factory=dict)
    decides: Decides = Field(default_factory=Decides)  # approvals (by seat), skill promotions

    def says(self) -> str:
        """'Alice Doe <alice@example.com>' or 'Alice Doe'."""
        return f"{self.name} <{self.email}>" if self.email else self.name


class Budgets(_Model):
    org: Tokens | None = None  # tokens the whole company may spend; None: no cap
    seats: dict[str, Tokens] = Field(default_factory=dict)  # per-seat token caps, by seat name


# Days any retention may name: ten years, past which "for ever" is the honest word.
RETENTION_DAYS_MAX = 3650


class Retention(_Model):
    """How long records are kept (the ``maintenance`` duty and each data node
    apply it; unworked mail is never aged out while its seat exists)."""

    turns_days: int = Field(90, ge=1, le=RETENTION_DAYS_MAX)  # days a turn record is kept
    # A dropped seat's mailbox still holding mail is retired after this many days,
    # and the ledger remembers a worked trigger at least this long.
    mail_days: int = Field(14, ge=1, le=RETENTION_DAYS_MAX)
    events_days: int = Field(7, ge=1, le=RETENTION_DAYS_MAX)  # days a kept turn event is kept


class Notify(_Model):
    """Notifications out: the fleet-wide rate of the ``sender`` duty's valve
    (a GCRA in the ``rate`` bucket). In any window of T seconds at most
    ``burst + rate·T`` emails are sent, whichever node sends them; how to reach
    the SMTP server is each node's Tier A ``smtp:``."""

    # Emails a second, fleet-wide: 0.01 (one in 100 s) to 1,000 (past what one
    # SMTP connection carries).
    rate: float = Field(1.0, ge=0.01, le=1000, allow_inf_nan=False)
    # Emails sent back to back after a quiet spell (1: strictly spaced).
    burst: int = Field(5, ge=1, le=1000)


class Learning(_Model):
    """The learning passes (the ``learning`` duty, DESIGN §15): old episodes
    compacted, the recent ones clustered, a skill drafted per new cluster,
    drafts promoted. A provider is asked to compact and to draft only; the
    clustering asks none."""

    every: int = Field(600, ge=1, le=7 * 86400)  # seconds between passes
    # seconds after which an episode is compacted into its seat and counterparty's summary
    compact_after: int = Field(7 * 86400, ge=1, le=RETENTION_DAYS_MAX * 86400)
    min_cluster: int = Field(MIN_CLUSTER, ge=2, le=10_000)  # episodes a cluster needs to be drafted
    # approve a draft whose cluster kept growing since it was drafted, without a person
    auto_promote: bool = False
    # the provider that compacts and drafts (one of providers); None: each seat's own
    provider: ProviderName | None = None
    max_drafts_per_pass: int = Field(5, ge=0, le=100)  # skills drafted a pass at most (0: none)


def _people_problems(people: Mapping[str, Person], seats: set[str]) -> list[At]:
    """An id elsewhere is one person's (a delivery from it names one person),
    and an approval right names a seat there is (or a pattern)."""
    problems: list[At] = []
    owner: dict[tuple[str, str], str] = {}
    for pid, person in people.items():
        for system, ident in person.identities.items():
            other = owner.setdefault((system, ident.lower() if system == "github" else ident), pid)
            if other != pid:
                problems.append(At(f"people.{pid}.identities.{system}",
                                   f"{ident!r} is {other}'s already: an id elsewhere is one person's"))
        problems += [At(f"people.{pid}.decides.approvals[{i}]", f"unknown seat {seat!r}")
                     for i, seat in enumerate(person.decides.approvals)
                     if not any(c in seat for c in "*?[") and seat not in seats]
    return problems


class Company(_Model):
    """The whole Tier B file. ``Company.model_validate(revision["company"])``
    rebuilds one from a stored revision."""

    company: CompanySection  # who this is
    providers: dict[ProviderName, Provider] = Field(min_length=1)  # model providers, by name
    seats: list[Seat] = Field(min_length=1)  # the agents
    schedules: list[Schedule] = Field(default_factory=list)  # periodic messages to seats
    budgets: Budgets = Field(default_factory=Budgets)  # token caps
    retention: Retention = Field(default_factory=Retention)  # how long records are kept
    integrations: dict[IntegrationName, Integration] = Field(default_factory=dict)  # webhooks, by name
    notify: Notify = Field(default_factory=Notify)  # the email rate, fleet-wide
    learning: Learning = Field(default_factory=Learning)  # the learning passes: compaction, skills
    # the identity map: people by id (a token's person, a notify recipient), their ids
    # elsewhere (webhook senders) and what they may decide (crewlet.people)
    people: dict[PersonId, Person] = Field(default_factory=dict)
    # (system, id elsewhere) -> (person id, how mail shows them): made at first use.
    _identities: dict[tuple[str, str], tuple[str, str]] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _references(self) -> Company:
        problems = _duplicates([s.name for s in self.seats], "seats[{i}].name")
        known = ", ".join(self.providers)
        problems += [At(f"seats[{i}].provider", f"unknown provider {s.provider!r}, known: {known}")
                     for i, s in enumerate(self.seats) if s.provider not in self.providers]
        seats = {s.name for s in self.seats}
        problems += _duplicates([s.name for s in self.schedules], "schedules[{i}].name")
        problems += [At(f"schedules[{i}].seat", f"unknown seat {s.seat!r}")
                     for i, s in enumerate(self.schedules) if s.seat not in seats]
        problems += [At(f"budgets.seats.{name}", f"unknown seat {name!r}")
                     for name in self.budgets.seats if name not in seats]
        problems += [At(f"integrations.{name}", "the name outbox is crewlet's own (notification claims "
                        "share the claims bucket's outbox. keys): choose another")
                     for name in self.integrations if name == "outbox"]
        problems += [At(f"integrations.{name}.routes[{i}].seat", f"unknown seat {r.seat!r}")
                     for name, integration in self.integrations.items()
                     for i, r in enumerate(integration.routes) if r.seat not in seats]
        problems += _people_problems(self.people, seats)
        if self.learning.provider is not None and self.learning.provider not in self.providers:
            problems.append(At("learning.provider",
                               f"unknown provider {self.learning.provider!r}, known: {known}"))
        _raise_first(problems)
        return self

    def person_known_as(self, system: str, ident: str) -> tuple[str, str] | None:
        """The person whose id in *system* (github, slack, a generic integration's
        name) is *ident*: ``(person id, 'Name <email>')``; None if nobody is.
        GitHub logins are matched without regard to case, as GitHub does."""
        index = self._identities
        if index is None:
            index = {}
            for pid, person in self.people.items():
                for sys_, value in person.identities.items():
                    index[(sys_, value.lower() if sys_ == "github" else value)] = (pid, person.says())
            self._identities = index
        return index.get((system, ident.lower() if system == "github" else ident))

    def approvers(self, seat: str) -> list[str]:
        """The people who may decide *seat*'s approvals ([]: nobody is named,
        and any token with the write scope may)."""
        return [pid for pid, person in self.people.items() if person.decides.approves(seat)]

    def canonical(self) -> str:
        """The validated company as canonical JSON: defaults filled in, keys
        sorted, no whitespace. Key order and omitted defaults in the file do
        not change it; list order does."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False)

    def digest(self) -> str:
        """The first 16 hex characters of the sha256 of :meth:`canonical`."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()[:DIGEST_LENGTH]

    def seat(self, name: str) -> Seat:
        """The seat called *name*; KeyError if there is none."""
        for s in self.seats:
            if s.name == name:
                return s
        raise KeyError(name)
