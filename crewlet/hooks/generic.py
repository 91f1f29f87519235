"""Any other sender: the integration names its headers (defaults in
:mod:`crewlet.company.model`). The signature header holds ``sha256=<hex>`` or
the bare ``<hex>`` of HMAC-SHA256(secret, body); the delivery-id header is
required (a resend must repeat it, or it is not deduplicated); the event
header is optional. The body may be any bytes: when it is a JSON object, its
top-level string ``repository``, ``channel``, ``action`` and ``sender`` are facts.
"""

from __future__ import annotations

from collections.abc import Mapping

from crewlet.company.model import GENERIC_SIGNATURE_HEADER

from .base import Read, Refused, check_signature, facts, hmac_hex, json_value, pretty, required

PREFIX = "sha256="


def verify(integration, headers: Mapping[str, str], body: bytes, secret: bytes, now: float) -> None:
    check_signature(headers, integration.signature_header, hmac_hex(secret, body), prefix=PREFIX, bare=True)


def read(integration, headers: Mapping[str, str], body: bytes) -> Read:
    delivery = required(headers, integration.delivery_header, "no_delivery_id")
    event = headers.get(integration.event_header.lower(), "").strip()
    try:
        data = json_value(body)
    except Refused:  # not JSON is fine here: shown as text, no facts from it
        return Read(delivery, facts(event=event), body.decode("utf-8", "replace"))
    known = {} if not isinstance(data, dict) else {
        k: data.get(k) for k in ("repository", "channel", "action", "sender")}
    return Read(delivery, facts(event=event, **known), pretty(data, body))


def sign(secret: bytes, body: bytes, *, header: str = GENERIC_SIGNATURE_HEADER) -> dict[str, str]:
    return {header: PREFIX + hmac_hex(secret, body)}
