"""GitHub webhooks: ``X-Hub-Signature-256: sha256=<hex>`` of HMAC-SHA256(secret,
body); the delivery id is ``X-GitHub-Delivery`` (a redelivery repeats it), the
event ``X-GitHub-Event`` (``ping`` included); the body is JSON, or a form whose
``payload`` field is JSON when the hook was made with that content type.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import (Read, check_signature, dig, facts, form_fields, hmac_hex, is_form, json_object, pretty,
                   required)

SIGNATURE_HEADER = "X-Hub-Signature-256"
DELIVERY_HEADER = "X-GitHub-Delivery"
EVENT_HEADER = "X-GitHub-Event"
PREFIX = "sha256="


def verify(integration, headers: Mapping[str, str], body: bytes, secret: bytes, now: float) -> None:
    check_signature(headers, SIGNATURE_HEADER, hmac_hex(secret, body), prefix=PREFIX)


def read(integration, headers: Mapping[str, str], body: bytes) -> Read:
    delivery = required(headers, DELIVERY_HEADER, "no_delivery_id")
    event = required(headers, EVENT_HEADER, "no_event")
    data = json_object(form_fields(body).get("payload", ""), "the payload field") if is_form(headers) \
        else json_object(body)
    known = facts(event=event, action=data.get("action"), repository=dig(data, "repository", "full_name"),
                  sender=dig(data, "sender", "login"))
    return Read(delivery, known, pretty(data, body))


def sign(secret: bytes, body: bytes) -> dict[str, str]:
    return {SIGNATURE_HEADER: PREFIX + hmac_hex(secret, body)}
