"""The control plane against a real nats-server: revisions, the epoch, watch,
crewletctl; a revision's company in parts (written before its record, read
back whole, refused when a part is missing or altered), also on an R3 cluster
with a member down."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import random

import nats
import pytest
from nats.js.errors import KeyWrongLastSequenceError

from crewlet.company import Company, load_company, parse_company
from crewlet.coord.buckets import last, subjects
from crewlet.coord.control_plane import (JS_TIMEOUT, PART_BYTES, PART_PREFIX, ControlPlane, RevisionDamaged,
                                         RevisionNotFound, part_key)
from tests.conftest import CREWLETCTL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "etc", "company.yaml")
SMALL = """
company: {name: Small}
providers: {local: {kind: scripted}}
seats: [{name: solo, persona: does everything, provider: local}]
"""


def run(natsd, scenario, timeout: float = 30):
    """Run ``scenario(plane, js)`` on a fresh connection to *natsd*."""
    async def main():
        nc = await nats.connect(natsd.url, connect_timeout=2)
        try:
            js = nc.jetstream(timeout=JS_TIMEOUT)
            return await asyncio.wait_for(scenario(await ControlPlane.open(js, 1), js), timeout)
        finally:
            await nc.close()
    return asyncio.run(main())


def test_apply_twice_gives_revisions_1_and_2_at_epoch_2(natsd):
    sample, small = load_company(SAMPLE), parse_company(SMALL, "small.yaml")

    async def scenario(plane, js):
        assert await plane.active() is None and await plane.history() == []
        assert await plane.apply(sample, "/etc/company.yaml", by="ann@box") == (1, 1)
        assert await plane.apply(small, "small.yaml") == (2, 2)
        return await plane.history(), await plane.active(), await plane.revision(1)

    history, active, first = run(natsd, scenario)
    assert [(h["rev"], h["active"], h["seats"]) for h in history] == [(1, False, 30), (2, True, 1)]
    assert history[0]["digest"] == sample.digest() and history[1]["digest"] == small.digest()
    assert history[0]["source"] == "/etc/company.yaml" and history[0]["applied_by"] == "ann@box"
    assert "@" in history[1]["applied_by"] and history[1]["at"] >= history[0]["at"]
    assert active["rev"] == 2 and active["epoch"] == 2
    assert first["rev"] == 1 and first["digest"] == sample.digest()
    assert type(sample).model_validate(first["company"]) == sample


def test_revisions_are_immutable(natsd):
    small = parse_company(SMALL, "small.yaml")

    async def scenario(plane, js):
        await plane.apply(small, "small.yaml")
        with pytest.raises(KeyWrongLastSequenceError):
            await plane.kv.create("rev.1", b"{}")
        with pytest.raises(RevisionNotFound):
            await plane.revision(7)
        return await plane.revision(1)

    assert run(natsd, scenario)["digest"] == small.digest()


def test_concurrent_applies_both_land_and_both_count(natsd):
    small, sample = parse_company(SMALL, "small.yaml"), load_company(SAMPLE)

    async def scenario(plane, js):
        other = await ControlPlane.open(js, 1)  # two writers, as two crewletctl would be
        results = await asyncio.gather(plane.apply(small, "a.yaml"), other.apply(sample, "b.yaml"),
                                       plane.apply(small, "c.yaml"))
        return results, await plane.history(), await plane.active()

    results, history, active = run(natsd, scenario)
    assert sorted(rev for rev, _ in results) == [1, 2, 3]
    assert sorted(epoch for _, epoch in results) == [1, 2, 3]
    assert [h["rev"] for h in history] == [1, 2, 3]
    assert sorted(h["source"] for h in history) == ["a.yaml", "b.yaml", "c.yaml"]
    assert active["epoch"] == 3
    # The revision activated last is the active one.
    assert active["rev"] == next(rev for rev, epoch in results if epoch == 3)
    assert [h["rev"] for h in history if h["active"]] == [active["rev"]]


def test_concurrent_applies_through_every_member_of_an_r3_cluster(nats_cluster):
    small = parse_company(SMALL, "small.yaml")

    async def main():
        ncs = [await nats.connect(s.url, connect_timeout=2) for s in nats_cluster]
        try:
            planes = [await ControlPlane.open(nc.jetstream(timeout=JS_TIMEOUT), 3) for nc in ncs]
            results = await asyncio.wait_for(asyncio.gather(
                *(p.apply(small, f"{i}.yaml") for i, p in enumerate(planes * 3))), 30)
            return results, [await p.history() for p in planes], await planes[1].active()
        finally:
            for nc in ncs:
                await nc.close()

    results, histories, active = asyncio.run(main())
    assert sorted(rev for rev, _ in results) == list(range(1, 10))
    assert sorted(epoch for _, epoch in results) == list(range(1, 10))
    assert active["epoch"] == 9
    for history in histories:  # every member tells the same story
        assert [h["rev"] for h in history] == list(range(1, 10))
        assert [h["rev"] for h in history if h["active"]] == [active["rev"]]


def test_watch_yields_the_current_pointer_then_the_next(natsd):
    small = parse_company(SMALL, "small.yaml")

    async def scenario(plane, js):
        await plane.apply(small, "one.yaml")
        stream = plane.watch()
        try:
            first = await asyncio.wait_for(anext(stream), 5)
            applied = asyncio.ensure_future(plane.apply(small, "two.yaml"))
            second = await asyncio.wait_for(anext(stream), 5)
            await applied
        finally:
            await stream.aclose()
        return first, second

    first, second = run(natsd, scenario)
    assert (first["rev"], first["epoch"]) == (1, 1)
    assert (second["rev"], second["epoch"]) == (2, 2)


def test_watch_before_anything_is_active_yields_the_first_activation(natsd):
    small = parse_company(SMALL, "small.yaml")

    async def scenario(plane, js):
        stream = plane.watch()
        try:
            waiting = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.2)  # let the watcher start (and see nothing) first
            assert not waiting.done()
            await plane.apply(small, "one.yaml")
            return await asyncio.wait_for(waiting, 5)
        finally:
            await stream.aclose()

    assert run(natsd, scenario)["epoch"] == 1


# ------------------------------------------------------------------ crewletctl

def ctl(config: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CREWLETCTL, "-c", config, *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_crewletctl_apply_and_history(tier_a, short_tmp):
    digest = load_company(SAMPLE).digest()
    empty = ctl(tier_a, "history")
    assert empty.returncode == 0 and empty.stdout.startswith("no revisions yet"), empty.stderr
    done = ctl(tier_a, "apply", "etc/company.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"applied etc/company.yaml: revision 1 (epoch 1), 30 seats, digest {digest}"
    again = ctl(tier_a, "apply", "etc/company.yaml")
    assert again.returncode == 0, again.stderr
    assert "revision 2 (epoch 2)" in again.stdout

    listed = ctl(tier_a, "history", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["rev"], r["active"], r["seats"], r["digest"]) for r in rows] == \
        [(1, False, 30, digest), (2, True, 30, digest)]
    assert rows[0]["source"] == SAMPLE
    assert set(rows[0]) == {"rev", "active", "at", "seats", "digest", "source", "applied_by"}

    table = ctl(tier_a, "history")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[0] == "rev" and lines[2].split()[:2] == ["2", "*"]
    assert lines[-1] == "active: revision 2, epoch 2"

    bad = os.path.join(short_tmp, "bad.yaml")
    with open(bad, "w") as f:
        f.write(SMALL.replace("provider: local", "provider: gpt"))
    refused = ctl(tier_a, "apply", bad)
    assert refused.returncode == 78
    assert refused.stderr.strip() == \
        f"crewletctl: {bad}: seats[0].provider: unknown provider 'gpt', known: local"
    assert "Traceback" not in refused.stderr
    assert len(json.loads(ctl(tier_a, "history", "--json").stdout)) == 2  # nothing was sent


def test_crewletctl_apply_with_nats_down_exits_69(natsd, tier_a):
    natsd.stop()
    done = ctl(tier_a, "apply", "etc/company.yaml")
    assert done.returncode == 69
    assert natsd.url in done.stderr and "Traceback" not in done.stderr


# ------------------------------------------------------------------ a company in parts

def noisy(seats: int = 2000, seed: int = 3) -> Company:
    """A company whose JSON does not compress much (hex personas): several parts."""
    rng = random.Random(seed)
    return Company.model_validate({
        "company": {"name": "Noise"}, "providers": {"p": {"kind": "scripted"}},
        "seats": [{"name": f"s{i:04d}", "persona": rng.randbytes(800).hex(), "provider": "p"}
                  for i in range(seats)]})


def test_a_company_in_parts_is_written_before_its_record_and_read_back_whole(natsd):
    big, small = noisy(), parse_company(SMALL, "small.yaml")

    async def scenario(plane, js):
        assert await plane.apply(big, "big.yaml", by="ann@box") == (1, 1)
        assert await plane.apply(small, "small.yaml") == (2, 2)
        record = await plane.record(1)
        body = record["body"]
        seqs = [(await last(js, "config", part_key(body["upload"], i), leader=True))[0]
                for i in range(body["parts"])]
        rev_seq = (await last(js, "config", "rev.1", leader=True))[0]
        return (record, seqs, rev_seq, await plane.revision(1), await plane.revision(2),
                await plane.history(), await subjects(js, "config", PART_PREFIX + ">"))

    record, seqs, rev_seq, full, second, history, parts = run(natsd, scenario)
    assert "company" not in record and record["seats"] == 2000 and record["digest"] == big.digest()
    body = record["body"]
    assert body["parts"] >= 3 and body["bytes"] > 2 * PART_BYTES and body["encoding"] == "zlib"
    assert all(seqs) and max(seqs) < rev_seq  # every part stored before the record naming it
    assert Company.model_validate(full["company"]) == big and full["body"] == body
    assert Company.model_validate(second["company"]) == small and second["body"]["parts"] == 1
    assert [(h["rev"], h["seats"], h["active"]) for h in history] == [(1, 2000, False), (2, 1, True)]
    assert len(parts) == body["parts"] + 1  # the small one's single part


def test_a_missing_or_altered_part_is_refused_and_nothing_of_the_company_is_read(natsd):
    big = noisy(1500)

    async def scenario(plane, js):
        await plane.apply(big, "big.yaml")
        await plane.apply(big, "big.yaml")
        one, two = (await plane.record(1))["body"], (await plane.record(2))["body"]
        await plane.kv.purge(part_key(one["upload"], 1))           # a part gone
        await plane.kv.put(part_key(two["upload"], 0), b"x" * PART_BYTES)  # a part overwritten
        refused = []
        for n in (1, 2):
            with pytest.raises(RevisionDamaged) as info:
                await plane.revision(n)
            refused.append(str(info.value))
        # A record with its company inline (an older crewlet's, or a hand's) is read as it is.
        await plane.kv.create("rev.3", json.dumps({"rev": 3, "company": small.model_dump(mode="json"),
                                                   "digest": small.digest()}).encode())
        inline = await plane.revision(3)
        return one, refused, inline, await plane.history()

    small = parse_company(SMALL, "small.yaml")
    one, refused, inline, history = run(natsd, scenario)
    assert refused[0] == (f"revision 1: part 1 of {one['parts']} (config/{part_key(one['upload'], 1)}) "
                          "is missing")
    assert refused[1] == "revision 2: its parts do not match the sha256 its record names"
    assert Company.model_validate(inline["company"]) == small
    assert [h["seats"] for h in history] == [1500, 1500, 1]  # history reads records only


def test_a_company_in_parts_is_stored_and_read_with_a_member_of_an_r3_cluster_down(nats_cluster):
    big = noisy(1500)

    async def main():
        ncs = [await nats.connect(s.url, connect_timeout=2) for s in nats_cluster]
        try:
            planes = [await ControlPlane.open(nc.jetstream(timeout=JS_TIMEOUT), 3) for nc in ncs]
            await planes[0].apply(parse_company(SMALL, "small.yaml"), "small.yaml")  # the bucket, R3
            # The bucket's leader goes: the parts are written through an election.
            leader = (await planes[0].js.stream_info("KV_config")).cluster.leader
            down = next(i for i, s in enumerate(nats_cluster) if s.name == leader)
            writer, reader = (i for i in range(3) if i != down)
            await ncs[down].close()
            nats_cluster[down].kill()
            began = time.monotonic()
            rev, epoch = await asyncio.wait_for(planes[writer].apply(big, "big.yaml"), 60)
            took = time.monotonic() - began
            return rev, epoch, took, await asyncio.wait_for(planes[reader].revision(rev), 30)
        finally:
            for nc in ncs:
                await nc.close()

    rev, epoch, took, full = asyncio.run(main())
    assert (rev, epoch) == (2, 2) and full["body"]["parts"] >= 2
    assert took < 30, took  # an election (~6 s) waited out, not a failure
    assert Company.model_validate(full["company"]) == big
