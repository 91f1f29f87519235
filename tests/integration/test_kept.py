"""roles/seats/kept.py: turn records to the log, many in one ``turn.records``
op, against a real nats-server (a stream like ``ESTATE``, written through
:func:`crewlet.estate.log.publish` under a deadline as the seats process
writes it) and applied to a real LMDB copy."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest

from crewlet.estate import apply, ops, store
from crewlet.estate import log as estate_log
from crewlet.estate.ops import Op, make_op
from roles.seats.kept import BATCH_BYTES, KeptTurns
from tests.estate import until

SUBJECT = estate_log.seats_subject("n1")


def _run(natsd, scenario):
    async def main():
        nc = await nats.connect(natsd.url, connect_timeout=2, allow_reconnect=False)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="ESTATE", subjects=[SUBJECT])
        sent: list[int] = []  # the records of each op sent, in order (stored or not)

        async def send(records: list[dict], deadline: float) -> None:
            # What the seats process sends (roles/seats/turns.py, _store_kept).
            sent.append(len(records))
            op = make_op("turn.records", {"records": records}, node="n1", id=f"turns:{len(sent)}")
            await estate_log.publish(js, op, timeout=1.0, subject=SUBJECT, deadline=deadline)

        kept = KeptTurns(send)
        try:
            return await scenario(kept, js, sent)
        finally:
            await kept.close()
            await nc.close()
    return asyncio.run(main())


async def _entries(js) -> list[tuple[int, bytes, str]]:
    info = await js.stream_info("ESTATE")
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg("ESTATE", seq)
        assert msg.subject == SUBJECT
        out.append((seq, msg.data, msg.subject))
    return out


async def _stored(js) -> list[list[dict]]:
    """Every op in the stream, oldest first, as its records."""
    return [[r["record"] for r in Op.decode(data).args["records"]] for _, data, _ in await _entries(js)]


def _entry(i: int, size: int = 0) -> dict:
    record = {"seat": f"s{i % 7}", "trigger": f"t{i}", "outcome": "done", "pad": "x" * size}
    return {"id": ops.op_id(record["seat"], "turn", record["trigger"], "done"), "seat": record["seat"],
            "token": 1, "record": record}


async def _keep(kept, i: int, deadline: float, size: int = 0) -> None:
    entry = _entry(i, size)
    await kept.keep(entry, len(json.dumps(entry["record"])), deadline)


def test_records_of_turns_ending_together_share_a_message_and_each_lands_once(natsd):
    async def scenario(kept, js, sent):
        deadline = time.monotonic() + 10
        await _keep(kept, -1, deadline)  # a lone record goes out at once, alone
        await asyncio.gather(*(_keep(kept, i, deadline) for i in range(300)))
        batches = await _stored(js)
        assert batches[0] == [_entry(-1)["record"]]
        records = [r["trigger"] for batch in batches[1:] for r in batch]
        # Every record, once, in the order kept.
        assert records == [f"t{i}" for i in range(300)]
        # Together: the first goes alone, the rest wait for it and go as one.
        assert len(batches) - 1 < 300 / 10, [len(b) for b in batches]
        assert kept.batches == len(batches) and kept.records == 301
    _run(natsd, scenario)


def test_a_batch_never_passes_its_byte_limit(natsd):
    async def scenario(kept, js, sent):
        size = BATCH_BYTES // 8  # eight such records overfill a batch
        await asyncio.gather(*(_keep(kept, i, time.monotonic() + 10, size) for i in range(40)))
        batches = await _stored(js)
        assert sum(len(b) for b in batches) == 40
        assert all(sum(len(json.dumps(r)) for r in b) <= BATCH_BYTES + 64 * len(b) for b in batches)
        assert max(len(b) for b in batches) > 1
    _run(natsd, scenario)


def test_a_record_waits_only_until_its_own_deadline_and_the_others_still_land(natsd):
    async def scenario(kept, js, sent):
        # The stream is gone: nothing can be stored until it is back.
        await js.delete_stream("ESTATE")
        short = asyncio.create_task(_keep(kept, 1, time.monotonic() + 0.5))
        long = asyncio.create_task(_keep(kept, 2, time.monotonic() + 15))
        with pytest.raises(TimeoutError):
            await short
        await js.add_stream(name="ESTATE", subjects=[SUBJECT])
        await long  # the batch went on trying until the latest deadline in it
        records = [r["trigger"] for batch in await _stored(js) for r in batch]
        assert "t2" in records
    _run(natsd, scenario)


def test_a_record_the_op_refuses_fails_alone_and_the_others_of_its_batch_land(natsd):
    async def scenario(kept, js, sent):
        deadline = time.monotonic() + 10
        bad = _entry(5)
        bad["record"]["score"] = float("nan")   # an op carries no NaN: refused, nothing sent
        # The first record goes alone and is held (no stream) while the rest queue behind it.
        await js.delete_stream("ESTATE")
        first = asyncio.create_task(_keep(kept, 0, deadline))
        await until(lambda: sent, what="the first record being sent")
        rest = [asyncio.create_task(_keep(kept, i, deadline)) for i in (1, 2)]
        rest.append(asyncio.create_task(kept.keep(bad, 64, deadline)))
        rest += [asyncio.create_task(_keep(kept, i, deadline)) for i in (3, 4)]
        await until(lambda: len(kept._waiting) == 5, what="each record queued")
        await js.add_stream(name="ESTATE", subjects=[SUBJECT])
        await first
        results = await asyncio.gather(*rest, return_exceptions=True)
        assert [type(r).__name__ for r in results] == ["NoneType", "NoneType", "OpError",
                                                       "NoneType", "NoneType"]
        assert sorted(r["trigger"] for b in await _stored(js) for r in b) == ["t0", "t1", "t2", "t3", "t4"]
        assert sent[1] == 5 and sent[2:] == [1, 1, 1, 1, 1], sent   # the batch, then each alone
    _run(natsd, scenario)


def test_closing_tells_whoever_still_waits(natsd):
    async def scenario(kept, js, sent):
        await js.delete_stream("ESTATE")  # the first batch cannot land
        for started in (False, True):  # closed before its sender first ran, and while it tries
            waiting = asyncio.create_task(_keep(kept, 1, time.monotonic() + 30))
            if started:
                await until(lambda: sent, 5, "its batch being sent")
            else:
                await asyncio.sleep(0)  # keep() ran up to its wait; the sender has not
            await kept.close()
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(waiting, 5)
    _run(natsd, scenario)


def test_each_record_of_the_ops_lands_once_in_a_copy_however_often_it_was_sent(natsd, tmp_path):
    """The log as the seats process writes it, applied to a real copy: every
    record of every op is one row of the turns table, and a record sent
    again in a later op (a redone turn's done record) is applied once."""
    async def scenario(kept, js, sent):
        deadline = time.monotonic() + 10
        await asyncio.gather(*(_keep(kept, i, deadline) for i in range(200)))
        await asyncio.gather(*(_keep(kept, i, deadline) for i in range(0, 200, 10)))   # sent again
        copy = store.open_env(str(tmp_path / "copy"))
        try:
            outcomes = apply.apply_batch(copy, await _entries(js))
            assert len(outcomes) == len(sent) < 200
            results = [o["result"] for _, o in outcomes]
            assert sum(r["turns"] for r in results) == 200 and sum(r["again"] for r in results) == 20
            turns = store.Reader(copy).query("turn.list", {"limit": 500})["turns"]
            assert sorted(t["trigger"] for t in turns) == sorted(f"t{i}" for i in range(200))
        finally:
            store.close_env(copy)
    _run(natsd, scenario)
