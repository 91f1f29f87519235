"""When schedules tick, their trigger ids, and catch_up (crewlet.schedules): pure, no processes."""

from __future__ import annotations

import calendar
import time

import pytest

from crewlet.company import parse_company
from crewlet.config import ConfigError
from crewlet.schedules import CATCH_UP_ALL_MAX, Timing, check_cron, iso, plan, tick_of, trigger, zone


def at(stamp: str) -> float:
    """A UTC time written ``2025-03-10 09:00:00`` as unix seconds."""
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")))


def ticks(timing: Timing, start: str, end: str) -> list[str]:
    got, _ = timing.between(at(start), at(end), 1000)
    return [iso(t) for t in got]


def test_every_ticks_on_multiples_of_its_period_since_the_epoch():
    t = Timing(every=3)
    assert t.next_after(at("2025-01-01 00:00:00")) == at("2025-01-01 00:00:03")
    assert t.next_after(at("2025-01-01 00:00:01") + 0.5) \
        == at("2025-01-01 00:00:03")
    day = Timing(every=86400)
    assert iso(day.next_after(at("2025-03-10 17:45:00"))) == "2025-03-11T00:00:00Z"
    assert ticks(Timing(every=600), "2025-01-01 00:00:00", "2025-01-01 00:30:00") == [
        "2025-01-01T00:10:00Z", "2025-01-01T00:20:00Z", "2025-01-01T00:30:00Z"]  # (after, until]


def test_cron_in_utc_and_in_a_time_zone():
    weekdays = Timing(cron="0 9 * * 1-5")
    # Friday 2025-03-07 09:00 UTC, then Monday.
    assert iso(weekdays.next_after(at("2025-03-07 08:59:59"))) == "2025-03-07T09:00:00Z"
    assert iso(weekdays.next_after(at("2025-03-07 09:00:00"))) == "2025-03-10T09:00:00Z"
    paris = Timing(cron="0 9 * * *", tz="Europe/Paris")
    assert iso(paris.next_after(at("2025-01-15 00:00:00"))) == "2025-01-15T08:00:00Z"  # CET, +1
    assert iso(paris.next_after(at("2025-07-15 00:00:00"))) == "2025-07-15T07:00:00Z"  # CEST, +2
    ny = Timing(cron="30 17 * * *", tz="America/New_York")
    assert iso(ny.next_after(at("2025-01-15 00:00:00"))) == "2025-01-15T22:30:00Z"


def test_dst_spring_forward_fires_a_skipped_time_once_at_the_jump():
    # Europe/Berlin skips 02:00-03:00 on 2025-03-30: 02:30 does not exist that day.
    t = Timing(cron="30 2 * * *", tz="Europe/Berlin")
    assert ticks(t, "2025-03-28 12:00:00", "2025-04-01 00:00:00") == [
        "2025-03-29T01:30:00Z",   # 02:30 CET
        "2025-03-30T01:00:00Z",   # the jump: 03:00 CEST, once
        "2025-03-31T00:30:00Z"]   # 02:30 CEST


def test_dst_fall_back_fires_a_fixed_hour_once_and_every_real_quarter_hour():
    # Europe/Berlin repeats 02:00-03:00 on 2025-10-26.
    once = Timing(cron="30 2 * * *", tz="Europe/Berlin")
    assert ticks(once, "2025-10-25 12:00:00", "2025-10-27 12:00:00") == [
        "2025-10-26T00:30:00Z",   # 02:30 CEST, the first of the two; not again at 02:30 CET
        "2025-10-27T01:30:00Z"]
    quarter = Timing(cron="*/15 * * * *", tz="Europe/Berlin")
    got = ticks(quarter, "2025-10-25 23:50:00", "2025-10-26 02:10:00")
    assert len(got) == len(set(got)) == 9  # 00:00 .. 02:00 UTC: every real quarter, none twice


def test_trigger_ids_name_the_scheduled_time_in_utc():
    when = at("2025-03-10 09:00:00")
    assert trigger("daily-standup", when) == "daily-standup=20250310T090000Z"
    assert tick_of("daily-standup=20250310T090000Z") == ("daily-standup", when)
    assert tick_of("hello") is None and tick_of("x=notatime") is None
    from crewlet.queue.base import check_trigger
    check_trigger(trigger("a" * 63, when))  # a KV key and a valid trigger, at the longest name


def test_check_cron_and_zone_refuse_what_cannot_run():
    assert check_cron("0 9 * * mon-fri") == "0 9 * * mon-fri"
    for bad in ("61 * * * *", "* * * * 8", "0 0 30 2 *", "0 9 * *", "*/0 * * * *"):
        with pytest.raises(ValueError):
            check_cron(bad)
    zone("Europe/Paris")
    with pytest.raises(ValueError, match="unknown time zone"):
        zone("Mars/Olympus")


# ------------------------------------------------------------------ catch_up

P = 10  # an every: 10s schedule
T = Timing(every=P)
BASE = 1_000_000.0  # a multiple of P


def test_on_time_a_holder_fires_the_one_tick_due():
    p = plan(T, BASE, BASE + P + 0.01, since=BASE - 100)
    assert p.fire == [BASE + P] and p.settled == BASE + P and p.skipped == 0
    assert plan(T, BASE, BASE + P - 0.01, since=BASE - 100) is None  # nothing due yet


def test_latest_fires_the_most_recent_missed_tick_once():
    # Settled at BASE; no holder until BASE + 55 (5 ticks came due meanwhile).
    p = plan(T, BASE, BASE + 55, since=BASE + 55, catch_up="latest")
    assert p.fire == [BASE + 50] and p.settled == BASE + 50
    assert (p.skipped, p.first_skipped, p.last_skipped) == (4, BASE + 10, BASE + 40)


def test_all_fires_every_missed_tick_up_to_the_bound():
    p = plan(T, BASE, BASE + 55, since=BASE + 55, catch_up="all")
    assert p.fire == [BASE + 10 * k for k in range(1, 6)] and p.skipped == 0
    long = plan(T, BASE, BASE + 100 * P + 5, since=BASE + 100 * P + 5, catch_up="all")
    assert len(long.fire) == CATCH_UP_ALL_MAX and long.fire[-1] == BASE + 100 * P
    assert long.skipped == 100 - CATCH_UP_ALL_MAX and long.first_skipped == BASE + P


def test_none_fires_no_missed_tick_but_every_on_time_one():
    p = plan(T, BASE, BASE + 55, since=BASE + 55, catch_up="none")
    assert p.fire == [] and p.settled == BASE + 50 and p.skipped == 5
    # Ticks due after the holder started are its own, late or not (a broker away).
    p = plan(T, BASE, BASE + 55, since=BASE + 25, catch_up="none")
    assert p.fire == [BASE + 30, BASE + 40, BASE + 50] and p.skipped == 2


def test_a_huge_gap_is_counted_not_walked():
    second = Timing(every=1)
    years = 10 * 365 * 86400
    p = plan(second, BASE, BASE + years + 0.5, since=BASE + years + 0.5)
    assert p.fire == [BASE + years] and p.skipped == years - 1 and p.first_skipped == BASE + 1
    cron = Timing(cron="* * * * *")
    p = plan(cron, BASE, BASE + 30 * 86400, since=BASE + 30 * 86400, catch_up="all")
    assert len(p.fire) == CATCH_UP_ALL_MAX and p.skipped == 30 * 1440 - CATCH_UP_ALL_MAX


# ------------------------------------------------------------------ the company's words

BASE_COMPANY = """
company: {name: t}
providers: {p: {kind: scripted}}
seats: [{name: pm, persona: x, provider: p}]
schedules:
  - {name: ok, seat: pm, every: 5m, message: m}
"""


@pytest.mark.parametrize("line, key, problem", [
    ('{name: s, seat: pm, cron: "61 * * * *", message: m}', "schedules[1].cron", "Bad minute"),
    ('{name: s, seat: pm, cron: "0 9 * * *", tz: Mars/Olympus, message: m}', "schedules[1].tz",
     "unknown time zone 'Mars/Olympus'"),
    ('{name: s, seat: ghost, cron: "0 9 * * *", message: m}', "schedules[1].seat", "unknown seat 'ghost'"),
    ('{name: s, seat: pm, every: 5m, tz: UTC, message: m}', "schedules[1].tz", "only for cron"),
    ('{name: s, seat: pm, every: 5m, catch_up: some, message: m}', "schedules[1].catch_up", "latest"),
    ('{name: s.x, seat: pm, every: 5m, message: m}', "schedules[1].name", "letters, digits"),
])
def test_bad_schedules_are_refused_naming_the_key(line, key, problem):
    with pytest.raises(ConfigError) as info:
        parse_company(BASE_COMPANY + "  - " + line + "\n", "c.yaml")
    assert info.value.key == key and problem in info.value.problem, str(info.value)


def test_a_schedules_defaults_and_timing():
    company = parse_company(BASE_COMPANY + '  - {name: c, seat: pm, cron: "0 9 * * 1-5", message: m}\n')
    every, cron = company.schedules
    assert (every.tz, every.catch_up, every.timing) == (None, "latest", Timing(every=300))
    assert (cron.tz, cron.timing.spec) == ("UTC", "cron 0 9 * * 1-5 UTC")


def test_crewletctl_schedules_shows_next_and_last_fire_and_who():
    from crewlet.ctl.schedules import table
    from crewlet.schedules import rows
    company = parse_company(BASE_COMPANY + '  - {name: c, seat: pm, cron: "0 9 * * *", tz: Europe/Paris, '
                                           'message: m}\n')
    fired = at("2025-03-10 10:00:00")
    records = {"ok": {"spec": "every 300s", "settled": fired, "fired": fired, "trigger": trigger("ok", fired),
                      "fired_at": fired + 0.2, "node": "n1", "token": 7},
               "c": {"spec": "cron 0 9 * * * UTC", "settled": fired, "fired": fired}}  # another tz: history
    now = fired + 60
    ok, c = rows(company.schedules, records, now)
    assert ok["next"] == "2025-03-10T10:05:00Z" and not ok["due"]
    assert ok["last"] == {"scheduled": "2025-03-10T10:00:00Z", "trigger": "ok=20250310T100000Z",
                          "fired_at": fired + 0.2, "node": "n1", "token": 7}
    assert c["last"] is None and c["next"] == "2025-03-11T08:00:00Z"  # 09:00 Paris, CET
    late = rows(company.schedules, records, fired + 3600)[0]
    assert late["due"]  # nobody fired 10:05: no holder
    text = table(3, {"node": "n1", "token": 7}, [ok, c], now)
    assert "n1 (token 7)" in text and "60s ago" in text and "held by n1 (token 7)" in text
    assert "held by no node" in table(3, None, [], now) and "no schedules" in table(3, None, [], now)
