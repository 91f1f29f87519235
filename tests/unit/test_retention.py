"""Retention's numbers: the company's bounds, the turns cutoff, the ledger's TTL."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from crewlet.company.model import RETENTION_DAYS_MAX, Retention
from crewlet.queue.jetstream import EVENTS_DAYS, MAX_DELIVER
from roles.seats import LEDGER_MARGIN_DAYS, ledger_ttl
from roles.workers.duties.maintenance import CUTOFF_GRAIN, cutoff

DAY = 86400


def test_retention_defaults_and_bounds():
    r = Retention()
    assert (r.turns_days, r.mail_days, r.events_days) == (90, 14, EVENTS_DAYS)
    for field in ("turns_days", "mail_days", "events_days"):
        for bad in (0, RETENTION_DAYS_MAX + 1):
            with pytest.raises(ValidationError, match=field):
                Retention(**{field: bad})
        assert getattr(Retention(**{field: RETENTION_DAYS_MAX}), field) == RETENTION_DAYS_MAX


def test_the_turns_cutoff_is_rounded_so_overlapping_holders_agree():
    """Two holders sweeping within one grain compute the same cutoff, hence the
    same op ids; the cutoff is never after now - turns_days."""
    now = 1_800_000_123.5
    a, b = cutoff(now, 90), cutoff(now + CUTOFF_GRAIN / 3, 90)
    assert a % CUTOFF_GRAIN == 0 and a <= now - 90 * DAY < a + CUTOFF_GRAIN
    assert b in (a, a + CUTOFF_GRAIN)
    assert cutoff(10.0, 90) == 0  # never before the epoch


def test_a_ledger_entry_outlives_every_redelivery_of_its_mail():
    """mail_days (+ a day) at the default ack wait; at a day's ack wait, the
    redeliveries' bound (every delivery of the budget waiting out the ack wait)."""
    assert ledger_ttl(14, 1800) == (14 + LEDGER_MARGIN_DAYS) * DAY
    assert ledger_ttl(1, DAY) == MAX_DELIVER * DAY + LEDGER_MARGIN_DAYS * DAY
    assert ledger_ttl(1, DAY) > MAX_DELIVER * DAY
    assert isinstance(ledger_ttl(1, 1800.5), int)  # the broker's TTL header takes whole seconds
