"""Slack: ``X-Slack-Signature: v0=<hex>`` of HMAC-SHA256(secret,
``v0:<timestamp>:<body>``) with ``X-Slack-Request-Timestamp``, which must be
within SLACK_MAX_AGE seconds of now either way.

Checked in this order: the timestamp is a whole number (it is part of what is
signed), then the signature in constant time, then the age. The age comes
after the signature so that only a holder of the secret ever learns about our
clock window, and ``stale_timestamp`` always means a genuine request that is
old: a replay, or a clock off by minutes, never noise.

Bodies: the Events API's JSON — ``url_verification`` is answered with its
challenge and not stored; ``event_callback`` is a delivery whose id is the
``event_id`` (Slack's retries repeat it; X-Slack-Retry-Num counts them); other
types are named by a digest of the body. A form body is an interactive
``payload`` (JSON; id its ``trigger_id``) or a slash command's fields.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from .base import (DIGITS_RE, Read, Refused, check_signature, dig, digest, facts, form_fields, hmac_hex,
                   is_form, json_object, pretty)

# Seconds a request's timestamp may be from now, either way (Slack's advice: 5 minutes).
SLACK_MAX_AGE = 300
SIGNATURE_HEADER = "X-Slack-Signature"
TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
RETRY_HEADER = "X-Slack-Retry-Num"
VERSION = "v0"


def _base(timestamp: str, body: bytes) -> bytes:
    return f"{VERSION}:{timestamp}:".encode() + body


def verify(integration, headers: Mapping[str, str], body: bytes, secret: bytes, now: float) -> None:
    stamp = headers.get(TIMESTAMP_HEADER.lower(), "").strip()
    if not DIGITS_RE.fullmatch(stamp):
        raise Refused(401, "bad_timestamp",
                      f"{TIMESTAMP_HEADER} must be whole seconds since 1970, got {stamp[:40]!r}")
    check_signature(headers, SIGNATURE_HEADER, hmac_hex(secret, _base(stamp, body)), prefix=VERSION + "=")
    age = now - int(stamp)
    if abs(age) > SLACK_MAX_AGE:
        when = f"{age:.0f} s old" if age > 0 else f"{-age:.0f} s in the future"
        raise Refused(401, "stale_timestamp", f"{TIMESTAMP_HEADER} is {when}, more than {SLACK_MAX_AGE} s "
                                              f"either way: a replay, or a clock is off")


def read(integration, headers: Mapping[str, str], body: bytes) -> Read:
    retry = headers.get(RETRY_HEADER.lower(), "").strip()
    retry = int(retry) if DIGITS_RE.fullmatch(retry) else 0
    if is_form(headers):
        return _form(body, retry)
    data = json_object(body)
    kind = data.get("type")
    if kind == "url_verification":
        challenge = data.get("challenge")
        if not isinstance(challenge, str):
            raise Refused(400, "bad_body", "a url_verification without a challenge string")
        return Read("challenge-" + digest(body), facts(event=kind), pretty(data, body), retry,
                    answer={"challenge": challenge})
    if kind == "event_callback":
        event_id = data.get("event_id")
        if not isinstance(event_id, str) or not event_id:
            raise Refused(400, "no_delivery_id", "an event_callback without an event_id")
        event = data.get("event")
        known = facts(event=dig(event, "type"), action=dig(event, "subtype"), channel=dig(event, "channel"),
                      sender=dig(event, "user"))
        return Read(event_id, known, pretty(data, body), retry)
    name = kind if isinstance(kind, str) and kind else "slack"
    return Read(f"{name}-{digest(body)}", facts(event=name), pretty(data, body), retry)


def _form(body: bytes, retry: int) -> Read:
    fields = form_fields(body)
    if "payload" in fields:  # an interactive payload: a button, a shortcut, a modal
        data = json_object(fields["payload"], "the payload field")
        actions = data.get("actions")
        action = dig(actions[0], "action_id") if isinstance(actions, list) and actions else None
        known = facts(event=data.get("type"), action=action, channel=dig(data, "channel", "id"),
                      sender=dig(data, "user", "id"))
    else:  # a slash command
        data = fields
        known = facts(event="slash_command" if "command" in data else None, action=data.get("command"),
                      channel=data.get("channel_id"), sender=data.get("user_id"))
    trigger = data.get("trigger_id")
    delivery = trigger if isinstance(trigger, str) and trigger else "form-" + digest(body)
    return Read(delivery, known, pretty(data, body), retry)


def sign(secret: bytes, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    return {SIGNATURE_HEADER: f"{VERSION}=" + hmac_hex(secret, _base(stamp, body)), TIMESTAMP_HEADER: stamp}
