"""roles/seats/pool.py: shares and parts of a seats pool."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crewlet.ctl.render import seats_stats
from roles.seats.pool import POOL_PROC, Pool, member_of, part

SEATS = [f"seat-{i}" for i in range(1000)]


def test_every_seat_has_one_member_and_the_shares_are_even():
    for size in (1, 2, 3, 16):
        counts = [0] * size
        for seat in SEATS:
            m = member_of(seat, size)
            assert 0 <= m < size
            assert sum(Pool(k, size).mine(seat) for k in range(size)) == 1
            counts[m] += 1
        assert min(counts) >= len(SEATS) / size * 0.7, (size, counts)


def test_a_share_is_the_same_in_every_process():
    """Not Python's salted hash(): another interpreter puts each seat in the same share."""
    code = "from roles.seats.pool import member_of; print([member_of(f'seat-{i}', 7) for i in range(50)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.strip() == str([member_of(f"seat-{i}", 7) for i in range(50)])


@pytest.mark.parametrize("total,size", [(32, 2), (33, 2), (7, 3), (1000, 16), (4, 4)])
def test_parts_add_up_to_the_whole(total, size):
    parts = [part(total, k, size) for k in range(size)]
    assert sum(parts) == total and max(parts) - min(parts) <= 1


def test_a_part_is_never_below_one():
    assert [part(4, k, 8) for k in range(8)] == [1] * 8


def test_a_lone_process_renews_its_life_as_its_own_and_a_pool_as_the_pool():
    assert Pool().alone and Pool().proc("123.abc") == "123.abc"
    assert Pool(1, 2).proc("123.abc") == POOL_PROC
    with pytest.raises(ValueError):
        Pool(2, 2)


def test_the_status_adds_the_pool_up():
    children = [
        {"name": "seats", "stats": {"running": 2, "max_concurrent": 16, "turns": 5, "held": 3,
                                    "org_spent": 10, "skills": {"skills": 4}, "seats": {"a": {"turns": 5}}}},
        {"name": "seats.1", "stats": {"running": 1, "max_concurrent": 16, "turns": 7, "held": 2,
                                      "org_spent": 12, "skills": {"skills": 4}, "seats": {"b": {"turns": 7}}}},
        {"name": "workers", "stats": {"turns": 100}},
    ]
    whole = seats_stats(children)
    assert whole["running"] == 3 and whole["max_concurrent"] == 32 and whole["turns"] == 12
    assert whole["held"] == 5 and whole["org_spent"] == 12 and whole["members"] == 2
    assert whole["seats"] == {"a": {"turns": 5}, "b": {"turns": 7}} and whole["skills"] == {"skills": 4}
    # One process: its report as it is.
    assert seats_stats(children[:1]) == children[0]["stats"]
    assert seats_stats(children[2:]) is None
