"""A company revision's parts (crewlet.coord.control_plane): encoded, cut,
joined and checked — a missing, short, altered or foreign part is refused,
never read in half. The broker side is tests/integration/test_control_plane.py."""

from __future__ import annotations

import hashlib
import json
import random
import time
import zlib

import pytest

from crewlet.bus import MAX_PAYLOAD
from crewlet.company.model import REVISION_MAX, Company
from crewlet.coord.control_plane import (PART_BYTES, RevisionDamaged, RevisionTooLarge, _body_of, check_size,
                                         decode, encode, revision_size)

WORDS = ("you answer mail about the quarterly plan and keep the team honest when numbers slip "
         "review every pull request with care write short replies escalate anything legal").split()


def company(seats: int, persona: int = 2048, seed: int = 7) -> Company:
    """*seats* seats, each with a persona of about *persona* characters of prose."""
    rng = random.Random(seed)

    def prose() -> str:
        out, size = [], 0
        while size < persona:
            word = rng.choice(WORDS)
            out.append(word)
            size += len(word) + 1
        return " ".join(out)[:persona]
    return Company.model_validate({
        "company": {"name": "Big"}, "providers": {"p": {"kind": "scripted"}},
        "seats": [{"name": f"s{i:05d}", "persona": prose(), "provider": "p"} for i in range(seats)]})


def with_upload(body: dict) -> dict:
    return {"body": {"upload": "0" * 32, **body}}


def test_parts_fit_a_broker_message_with_room_for_a_leader_reads_base64():
    assert PART_BYTES * 4 // 3 + 4096 < MAX_PAYLOAD


def test_a_company_round_trips_through_its_parts():
    big = company(600)  # ~1.3 MB of JSON
    body, parts = encode(big)
    assert body["size"] == revision_size(big) == len(json.dumps(big.model_dump(mode="json"),
                                                               separators=(",", ":")))
    assert body["bytes"] == sum(map(len, parts)) and body["parts"] == len(parts)
    assert all(len(p) <= PART_BYTES for p in parts)
    assert body["bytes"] < body["size"] / 2.5  # prose personas compress well
    assert Company.model_validate(decode(body, parts, "revision 1")) == big


def test_a_company_that_does_not_compress_is_cut_into_many_parts():
    rng = random.Random(1)
    noisy = Company.model_validate({
        "company": {"name": "Noise"}, "providers": {"p": {"kind": "scripted"}},
        "seats": [{"name": f"s{i}", "persona": rng.randbytes(1500).hex(), "provider": "p"}
                  for i in range(1000)]})
    body, parts = encode(noisy)
    assert len(parts) >= 3 and body["parts"] == len(parts)
    assert all(len(p) == PART_BYTES for p in parts[:-1])
    assert decode(body, parts, "revision 2") == noisy.model_dump(mode="json")


@pytest.mark.parametrize("damage, words", [
    (lambda parts: parts[:-1], "its parts join to"),                              # a part missing
    (lambda parts: [parts[0][:-1], *parts[1:]], "its parts join to"),             # a part short
    (lambda parts: [bytes([parts[0][0] ^ 1]) + parts[0][1:], *parts[1:]], "sha256"),  # a byte altered
    (lambda parts: [*parts[1:], parts[0]], "sha256"),                             # parts out of order
])
def test_damaged_parts_are_refused_naming_the_revision(damage, words):
    rng = random.Random(2)
    noisy = Company.model_validate({
        "company": {"name": "Noise"}, "providers": {"p": {"kind": "scripted"}},
        "seats": [{"name": f"s{i}", "persona": rng.randbytes(1000).hex(), "provider": "p"}
                  for i in range(600)]})
    body, parts = encode(noisy)
    assert len(parts) >= 2
    with pytest.raises(RevisionDamaged) as info:
        decode(body, damage(list(parts)), "revision 9")
    assert str(info.value).startswith("revision 9: ") and words in str(info.value)


def test_a_record_that_lies_about_the_size_is_refused():
    body, parts = encode(company(20))
    for size in (body["size"] - 1, body["size"] + 1):
        with pytest.raises(RevisionDamaged, match="inflates to other than"):
            decode({**body, "size": size}, parts, "revision 3")
    # Parts that hash right but hold no JSON object: the writer's own bug, still refused.
    packed = zlib.compress(b"[1, 2]")
    lying = {"bytes": len(packed), "size": 6, "sha256": hashlib.sha256(packed).hexdigest()}
    with pytest.raises(RevisionDamaged, match="not a JSON object"):
        decode(lying, [packed], "revision 4")


@pytest.mark.parametrize("body, words", [
    ({}, "names no company"),
    ({"parts": 1, "bytes": 1, "size": 1, "sha256": "x"}, "names no company"),  # no encoding
    ({"parts": True, "bytes": 1, "size": 1, "sha256": "x", "encoding": "zlib"}, "names no company"),
    ({"parts": 1, "bytes": 1, "size": 1, "sha256": "x", "encoding": "zstd"}, "encoded as 'zstd'"),
    ({"upload": "a.>", "parts": 1, "bytes": 1, "size": 1, "sha256": "x", "encoding": "zlib"},
     "not an upload id"),
    ({"parts": 0, "bytes": 1, "size": 1, "sha256": "x", "encoding": "zlib"}, "past what any revision"),
    ({"parts": 10**9, "bytes": 1, "size": 1, "sha256": "x", "encoding": "zlib"}, "past what any revision"),
    ({"parts": 1, "bytes": 1, "size": REVISION_MAX + 1, "sha256": "x", "encoding": "zlib"},
     "past what any revision"),
])
def test_a_record_naming_its_parts_badly_is_refused(body, words):
    with pytest.raises(RevisionDamaged, match=words):
        _body_of(with_upload(body) if body else {"rev": 1}, "revision 5")


def test_the_limit_is_on_the_json_before_compression_and_names_both_numbers():
    small = company(3)
    size = revision_size(small)
    assert check_size(small, limit=size) == size
    with pytest.raises(RevisionTooLarge) as info:
        check_size(small, limit=size - 1)
    assert (info.value.size, info.value.limit) == (size, size - 1)
    with pytest.raises(RevisionTooLarge):
        encode(small, limit=size - 1)  # append() refuses before a part is written
    text = str(RevisionTooLarge(70_000_000, REVISION_MAX))
    assert text == ("the company's stored revision would be 70,000,000 bytes, over the limit of "
                    "67,108,864 bytes (64 MiB) a company revision may have: fewer seats, or shorter "
                    "personas and rules")


def test_ten_thousand_seats_of_2_kib_personas_encode_within_the_limit_in_seconds():
    began = time.monotonic()
    big = company(10_000)
    built = time.monotonic() - began
    began = time.monotonic()
    body, parts = encode(big)
    encoded = time.monotonic() - began
    assert 20e6 < body["size"] < REVISION_MAX
    assert body["bytes"] < body["size"] / 2.5
    began = time.monotonic()
    assert len(decode(body, parts, "revision 1")["seats"]) == 10_000
    decoded = time.monotonic() - began
    assert encoded < 10 and decoded < 10, (built, encoded, decoded)
