"""Inbound webhooks, the pure part: prove a delivery, read it, route it, write
its mail. No I/O here; the HTTP layer (ingress, ``/v1/hooks/<name>``) reads
the secret, stores, deduplicates and mails.

    from crewlet import hooks
    integration = company.integrations[name]              # a crewlet.company.Integration
    secret = os.environ.get(integration.secret_env, "").encode()
    try:
        delivery = hooks.receive(name, integration, request.headers, body, secret=secret, now=time.time())
    except hooks.Refused as e:
        return json_response({"error": e.code, "detail": e.detail}, status=e.status)
    if delivery.answer is not None:                       # Slack's url_verification
        return json_response(delivery.answer)             # answered, never stored
    seat = hooks.route(integration, delivery)             # None: no route matches
    ...                                                   # dedupe on (name, delivery.id); mail delivery.text

:func:`receive` proves the body BEFORE parsing any of it: the signature is
an HMAC-SHA256 with the integration's secret, compared in constant time.
Only then are the headers and body read. Headers may come in any case. What
it refuses, and how the HTTP layer answers:

================ ====== ====================================================
code             status when
================ ====== ====================================================
no_secret        503    no *secret*: the node lacks ``secret_env`` or ``secret``
bad_signature    401    the signature header is missing or does not match
bad_timestamp    401    slack: X-Slack-Request-Timestamp missing or not whole
stale_timestamp  401    slack: signed, but more than SLACK_MAX_AGE s from now
no_delivery_id   400    no delivery id (github, generic; slack event_callback)
no_event         400    github: no X-GitHub-Event
bad_body         400    a body that must be JSON (or a form) is not
================ ====== ====================================================

The kinds (one module each, :mod:`.github`, :mod:`.slack`, :mod:`.generic`,
each ``verify``, ``read`` and ``sign``; :data:`KINDS` dispatches):

======== ====================================== =============================
kind     delivery id                            facts
======== ====================================== =============================
github   X-GitHub-Delivery                      event (X-GitHub-Event), action,
                                                repository (full_name), sender
slack    event_id; ``challenge-<digest>`` for   event (event.type), action
         url_verification; a form's trigger_id  (subtype), channel, sender
generic  delivery_header (X-Delivery-Id)        event (event_header), and the
                                                JSON body's repository,
                                                channel, action, sender
======== ====================================== =============================

A delivery id becomes a KV key part and a trigger id part, so
:attr:`Delivery.id` is 1-150 of ``[A-Za-z0-9_=-]``: an id with other
characters (Slack's trigger ids hold '.') or longer keeps its safe
characters, the rest as '_', cut, plus ``-`` and 16 hex of its sha256 —
the same for a resend, different for a different id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from crewlet.company.model import Integration

from . import generic, github, slack
from .base import TEXT_MAX, Delivery, Refused, mail_text, safe_id
from .slack import SLACK_MAX_AGE

__all__ = ["Delivery", "KINDS", "Refused", "SLACK_MAX_AGE", "TEXT_MAX", "receive", "route", "sign"]

# Integration.kind -> the module that proves, reads and signs that kind's deliveries.
KINDS = {"github": github, "slack": slack, "generic": generic}


def receive(name: str, integration: Integration, headers: Mapping[str, str], body: bytes, *,
            secret: bytes | Sequence[bytes], now: float,
            known_as: Callable[[str, str], tuple[str, str] | None] | None = None) -> Delivery:
    """The delivery *body* with *headers* to integration *name*, proved with
    *secret* — or any one of several: a rotated secret's new and old
    versions while its grace lasts (``now`` is the time, seconds since 1970,
    for Slack's age check); :class:`Refused` if it is not taken.

    *known_as(system, id)*: the company's person with that id elsewhere, as
    ``(person id, how mail shows them)`` (:meth:`Company.person_known_as`);
    the system is the kind (github, slack), a generic integration's name."""
    tried = [s for s in ([secret] if isinstance(secret, (bytes, bytearray)) else secret) if s]
    if not tried:
        raise Refused(503, "no_secret", f"{integration.secret or integration.secret_env} is not set "
                                        "on this node")
    kind = KINDS[integration.kind]
    body = bytes(body)
    lower = {k.lower(): v for k, v in headers.items()}
    for n, one in enumerate(tried):
        try:
            kind.verify(integration, lower, body, bytes(one), now)
            break
        except Refused:
            if n == len(tried) - 1:
                raise
    got = kind.read(integration, lower, body)
    delivery_id = safe_id(got.id)
    sender = got.facts.get("sender")
    person = None
    if known_as is not None and sender:
        person = known_as(integration.kind if integration.kind != "generic" else name, sender)
    return Delivery(name, integration.kind, delivery_id, got.facts, got.retry, got.answer,
                    mail_text(name, integration.kind, delivery_id, got.facts, got.retry, got.shown,
                              person[1] if person else None),
                    person[0] if person else None)


def route(integration: Integration, delivery: Delivery) -> str | None:
    """The seat of the first route *delivery* matches; None if none does."""
    return next((r.seat for r in integration.routes if r.matches(delivery.facts)), None)


def sign(kind: str, secret: bytes, body: bytes, *, timestamp: int | None = None,
         header: str | None = None) -> dict[str, str]:
    """The headers a sender of *kind* adds to *body*: github X-Hub-Signature-256;
    slack X-Slack-Signature and X-Slack-Request-Timestamp (*timestamp*, default
    now); generic *header* (default X-Signature-256). For tests and benches."""
    given = {"timestamp": timestamp, "header": header}
    # Only what was given is passed: an option the kind has no use for is a TypeError.
    return KINDS[kind].sign(secret, body, **{k: v for k, v in given.items() if v is not None})

