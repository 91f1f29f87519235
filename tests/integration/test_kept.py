"""roles/seats/kept.py: turn records to custody in batches, against a real
nats-server (a stream like ``EVENTS``, written through ``publish_until`` as the
seats process writes it)."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest

from crewlet.bus import publish_until
from crewlet.queue.jetstream import KEPT_TURNS
from roles.seats.kept import BATCH_BYTES, KeptTurns


def _run(natsd, scenario):
    async def main():
        nc = await nats.connect(natsd.url, connect_timeout=2, allow_reconnect=False)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="EVENTS", subjects=["events.>"])
        sent: list[int] = []  # the records of each batch sent, in order (stored or not)

        async def send(body: bytes, msg_id: str, deadline: float) -> None:
            sent.append(len(json.loads(body)["records"]))
            await publish_until(js, KEPT_TURNS, body, msg_id=msg_id, deadline=deadline)

        kept = KeptTurns(send)
        try:
            return await scenario(kept, js, sent)
        finally:
            await kept.close()
            await nc.close()
    return asyncio.run(main())


async def _stored(js) -> list[dict]:
    """Every batch in the stream, oldest first, as its records."""
    info = await js.stream_info("EVENTS")
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg("EVENTS", seq)
        assert msg.subject == KEPT_TURNS
        out.append(json.loads(msg.data)["records"])
    return out


async def _until(check) -> None:
    while not check():
        await asyncio.sleep(0.01)


def _record(i: int, size: int = 0) -> bytes:
    return json.dumps({"seat": f"s{i % 7}", "trigger": f"t{i}", "pad": "x" * size}).encode()


def test_records_of_turns_ending_together_share_a_message_and_each_lands_once(natsd):
    async def scenario(kept, js, sent):
        deadline = time.monotonic() + 10
        await kept.keep(_record(-1), deadline)  # a lone record goes out at once, alone
        await asyncio.gather(*(kept.keep(_record(i), deadline) for i in range(300)))
        batches = await _stored(js)
        assert batches[0] == [json.loads(_record(-1))]
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
        await asyncio.gather(*(kept.keep(_record(i, size), time.monotonic() + 10) for i in range(40)))
        batches = await _stored(js)
        assert sum(len(b) for b in batches) == 40
        assert all(len(json.dumps({"records": b}).encode()) <= BATCH_BYTES + 64 for b in batches)
        assert max(len(b) for b in batches) > 1
    _run(natsd, scenario)


def test_a_record_waits_only_until_its_own_deadline_and_the_others_still_land(natsd):
    async def scenario(kept, js, sent):
        # The stream is gone: nothing can be stored until it is back.
        await js.delete_stream("EVENTS")
        short = asyncio.create_task(kept.keep(_record(1), time.monotonic() + 0.5))
        long = asyncio.create_task(kept.keep(_record(2), time.monotonic() + 15))
        with pytest.raises(TimeoutError):
            await short
        await js.add_stream(name="EVENTS", subjects=["events.>"])
        await long  # the batch went on trying until the latest deadline in it
        records = [r["trigger"] for batch in await _stored(js) for r in batch]
        assert "t2" in records
    _run(natsd, scenario)


def test_closing_tells_whoever_still_waits(natsd):
    async def scenario(kept, js, sent):
        await js.delete_stream("EVENTS")  # the first batch cannot land
        for started in (False, True):  # closed before its sender first ran, and while it tries
            waiting = asyncio.create_task(kept.keep(_record(1), time.monotonic() + 30))
            if started:
                await asyncio.wait_for(_until(lambda: sent), 5)  # its batch is being sent
            else:
                await asyncio.sleep(0)  # keep() ran up to its wait; the sender has not
            await kept.close()
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(waiting, 5)
    _run(natsd, scenario)
