"""The notification valve's GCRA (crewlet/coord/valve.py), as arithmetic: what
it admits, when it makes a sender wait, and that no window of its admissions
ever holds more than ``burst + rate·L``."""

from __future__ import annotations

import random

import pytest

from crewlet.coord.valve import gcra, most_in_window
from tests.smtp import worst_window


def admitted(requests: list[float], rate: float, burst: int) -> list[float]:
    """When each request is sent: it waits for its slot, as Valve.admit does."""
    tat, out = 0.0, []
    for now in requests:
        now = max(now, out[-1] if out else now)  # one sender: requests in turn
        while True:
            d = gcra(tat, now, rate, burst)
            if d.admit:
                tat = d.tat
                out.append(now)
                break
            assert d.wait > 0
            now += d.wait
    return out


def test_a_quiet_valve_lets_a_burst_through_then_spaces_sends_at_the_rate():
    times = admitted([10.0] * 8, rate=2.0, burst=3)
    assert times[:3] == [10.0] * 3                # the burst, back to back
    assert times[3:] == pytest.approx([10.5, 11.0, 11.5, 12.0, 12.5])


def test_burst_one_is_strict_spacing_and_a_quiet_spell_earns_no_credit():
    assert admitted([0.0, 0.0, 0.0], rate=5.0, burst=1) == pytest.approx([0.0, 0.2, 0.4])
    # After ten quiet seconds, still one at a time.
    assert admitted([0.0, 10.0, 10.0, 10.0], rate=5.0, burst=1) == pytest.approx([0.0, 10.0, 10.2, 10.4])


def test_a_refusal_names_the_wait_until_the_slot():
    d = gcra(tat=11.0, now=10.0, rate=1.0, burst=1)
    assert not d.admit and d.wait == pytest.approx(1.0) and d.tat == 11.0
    d = gcra(tat=11.0, now=10.0, rate=1.0, burst=2)  # tolerance of one interval
    assert d.admit and d.tat == pytest.approx(12.0)


@pytest.mark.parametrize("rate,burst", [(1.0, 1), (5.0, 1), (10.0, 4), (100.0, 10), (0.5, 3)])
def test_no_window_of_admissions_holds_more_than_burst_plus_rate_times_its_length(rate, burst):
    rng = random.Random(f"{rate}-{burst}")
    requests = sorted(rng.uniform(0, 50 / rate) for _ in range(300))
    times = admitted(requests, rate, burst)
    assert len(times) == 300
    assert worst_window(times, rate, burst) <= 1e-6
    assert most_in_window(0.0, rate, burst) == burst
    assert most_in_window(1.0, rate, burst) == burst + int(rate)
