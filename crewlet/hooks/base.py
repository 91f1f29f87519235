"""What every kind of webhook shares: the refusal, the delivery, and the small
pure helpers the kind modules (:mod:`.github`, :mod:`.slack`, :mod:`.generic`)
are written with. :mod:`crewlet.hooks` is the manual.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs

# A delivery's mail text is cut to this many characters, note included: a
# seat's context is precious and a push of a thousand commits is not.
TEXT_MAX = 20_000
# A delivery id keys the KV (dedupe) and becomes part of a mailbox trigger id,
# so it is a run of KV key characters without '.' (the trigger's separator).
ID_MAX = 150
ID_SAFE_RE = re.compile(r"[A-Za-z0-9_=-]{1,150}")  # fullmatch: "$" would let a final "\n" by
ID_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_=-]")
# Hex characters of sha256 appended to a mapped id, and naming a body that has
# no id of its own: 64 bits, so distinct ids do not collide in practice.
ID_DIGEST = 16
# A form body has a few fields; more is an attack on the parser, not a webhook.
FORM_FIELDS_MAX = 100
FORM = "application/x-www-form-urlencoded"
# A count or whole seconds in a header: ASCII digits only (str.isdigit would take "²").
DIGITS_RE = re.compile(r"[0-9]{1,12}")  # fullmatch


class Refused(Exception):
    """A delivery not taken: answer HTTP ``status`` with ``code`` (a short
    machine word) and ``detail`` (a sentence for the sender's operator)."""

    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


@dataclass(frozen=True)
class Delivery:
    """One proved, parsed delivery."""

    integration: str  # the integration's name (a key of Company.integrations)
    kind: str  # its kind: github, slack or generic
    id: str  # the delivery id made safe: 1-150 of [A-Za-z0-9_=-]; a resend repeats it
    facts: dict[str, str]  # what routes match on, of event, action, repository, channel, sender
    retry: int  # the sender's retry number (Slack's X-Slack-Retry-Num), else 0
    answer: dict | None  # answer the sender with this body instead of storing (Slack's challenge)
    text: str  # the mail a seat receives: a header line, a blank line, the body
    # The company's person its sender is (people.<id>.identities), if one is.
    person: str | None = None


@dataclass(frozen=True)
class Read:
    """What a kind module reads from a proved delivery."""

    id: str  # the sender's delivery id as sent (non-empty; made safe by safe_id)
    facts: dict[str, str]
    shown: str  # the body as a seat reads it
    retry: int = 0
    answer: dict | None = None


def hmac_hex(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def check_signature(headers: Mapping[str, str], name: str, expected: str, *, prefix: str,
                    bare: bool = False) -> None:
    """Refuse unless header *name* equals ``prefix + expected`` (hex, any
    case; with *bare*, the hex alone will do too), compared in constant time."""
    given = headers.get(name.lower(), "").strip().lower()
    if not given:
        raise Refused(401, "bad_signature", f"missing {name} header")
    if bare and not given.startswith(prefix):
        given = prefix + given
    # Bytes, because compare_digest refuses a str with non-ASCII characters.
    if not hmac.compare_digest(given.encode("utf-8", "replace"), (prefix + expected).encode()):
        raise Refused(401, "bad_signature",
                      f"{name} does not match the body (a wrong secret, or a changed body)")


def required(headers: Mapping[str, str], name: str, code: str) -> str:
    """Header *name*'s value; Refused(400, *code*) when it is missing or blank."""
    value = headers.get(name.lower(), "").strip()
    if not value:
        raise Refused(400, code, f"missing {name} header")
    return value


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:ID_DIGEST]


def safe_id(raw: str) -> str:
    """*raw* if it is a safe id already, else its safe characters kept (others
    as '_'), cut, and ``-<digest of raw>`` appended: deterministic, so a resend
    maps alike, and distinct for distinct ids."""
    if ID_SAFE_RE.fullmatch(raw):
        return raw
    tag = digest(raw.encode("utf-8", "surrogatepass"))
    return ID_UNSAFE_RE.sub("_", raw)[:ID_MAX - len(tag) - 1] + "-" + tag


def is_form(headers: Mapping[str, str]) -> bool:
    return headers.get("content-type", "").split(";")[0].strip().lower() == FORM


def json_value(data: str | bytes, what: str = "the body"):
    """*data* parsed as JSON; Refused(400, bad_body) if it is not."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # ValueError holds JSON and UTF-8 errors
        raise Refused(400, "bad_body", f"{what} is not JSON: {str(e)[:200]}") from None


def json_object(data: str | bytes, what: str = "the body") -> dict:
    value = json_value(data, what)
    if not isinstance(value, dict):
        raise Refused(400, "bad_body", f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def form_fields(body: bytes) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body, the first value of each field."""
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=FORM_FIELDS_MAX)
    except ValueError as e:  # not UTF-8, or too many fields
        raise Refused(400, "bad_body", f"the body is not a form: {str(e)[:200]}") from None
    return {k: v[0] for k, v in fields.items()}


def dig(value, *keys):
    """``value[k1][k2]…``, or None wherever a step is missing or not a mapping."""
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def facts(**values) -> dict[str, str]:
    """The non-empty string *values*: facts are strings, compared exactly."""
    return {k: v for k, v in values.items() if isinstance(v, str) and v}


def pretty(value, body: bytes) -> str:
    """Parsed JSON *value* indented for reading; the raw *body* if it is too deep to print."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False)
    except (RecursionError, ValueError):
        return body.decode("utf-8", "replace")


def mail_text(name: str, kind: str, delivery_id: str, known: Mapping[str, str], retry: int,
              shown: str, person: str | None = None) -> str:
    """``github issues opened on acme/web by octocat (delivery <id>, integration <name>)``,
    a blank line and *shown*, cut to TEXT_MAX characters with a note. *person*:
    who the sender is in the company (``Alice Doe <alice@example.com>``), said
    after the sender: ``by octocat, who is Alice Doe <alice@example.com>``."""
    words = [kind, known.get("event"), known.get("action")]
    words += [f"{link} {known[fact]}" for fact, link in (("repository", "on"), ("channel", "in"),
                                                         ("sender", "by")) if fact in known]
    if person and "sender" in known:
        words[-1] += f", who is {person}"
    about = [f"delivery {delivery_id}", f"integration {name}"] + ([f"retry {retry}"] if retry else [])
    # Whitespace collapsed, so a fact cannot forge further lines of the header.
    head = " ".join(" ".join(w.split()) for w in words if w) + f" ({', '.join(about)})"
    text = f"{head}\n\n{shown}"
    if len(text) > TEXT_MAX:
        note = f"\n… (cut at {TEXT_MAX} of {len(text)} characters)"
        text = text[:TEXT_MAX - len(note)] + note
    return text
