"""The sender duty's sending, against a real nats-server and a real SMTP
server (aiosmtpd on loopback, tests/smtp.py): a 5xx refusal is dead-lettered
with the server's words, a 4xx is sent again later, a repeat is not sent, a
notification found claimed by a dead sender is ``unknown`` and not sent, a
deposed sender is refused by the valve, and the ``notify`` tool puts one
notification however often its turn is redone.

The sender runs in this process (:class:`roles.workers.duties.sender.Sender`,
what the duty runs); the fleet test (tests/fleet/test_sender_fleet.py) runs
it in real nodes and kills them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from types import SimpleNamespace

import nats
import pytest

from crewlet import outbox
from crewlet.agent.tools import Registry, ToolContext, builtin_tools
from crewlet.config.model import SmtpSection
from crewlet.coord import buckets
from crewlet.coord.valve import Deposed, Valve
from roles.workers.duties.sender import Sender
from tests.smtp import SmtpServer


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture
def smtpd():
    server = SmtpServer().start()
    yield server
    server.stop()


def note(i, **fields) -> outbox.Notification:
    return outbox.Notification(**{"id": f"n-{i}", "to": ["ops@example.com"], "subject": f"subject {i}",
                                  "body": f"body {i}", **fields})


def smtp_config(smtpd, **over) -> SmtpSection:
    return SmtpSection(**{"host": "127.0.0.1", "port": smtpd.port, "tls": "none", "retry_after": 0.2,
                          "attempts": 3, "timeout": 5, **over})


class Running:
    """A Sender in this process, on its own connection, until closed."""

    def __init__(self, url: str, smtp: SmtpSection, token: int, rate=(100.0, 10)):
        self.url, self.smtp, self.token, self.rate = url, smtp, token, rate

    async def __aenter__(self):
        self.nc = await nats.connect(self.url)
        self.js = self.nc.jetstream()
        await buckets.ensure_all(self.js, 1)
        await outbox.ensure_stream(self.js, 1)
        self.sender = Sender(self.js, self.nc, self.smtp, self.token, "t1", lambda: self.rate)
        self.task = asyncio.create_task(self.sender.run())
        return self

    async def __aexit__(self, *exc):
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):
            pass
        await self.nc.close()

    async def states(self) -> dict[str, str]:
        return {r["id"]: r["state"] for r in await outbox.outcomes(self.js, limit=1000)}

    async def until(self, predicate, timeout: float = 15.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while True:
            assert not self.task.done() or self.task.cancelled(), self.task.exception()
            got = await predicate()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; outcomes: {await self.states()}")
            await asyncio.sleep(0.05)


def test_a_refusal_for_good_is_dead_with_the_servers_words_and_a_passing_one_is_sent_again(natsd, smtpd):
    smtpd.refuse["n-dead"] = "550 5.1.1 <nobody@example.com>: mailbox unknown"
    smtpd.defer["n-later"] = 1

    async def main():
        async with Running(natsd.url, smtp_config(smtpd), token=5) as r:
            for n in (note("ok"), note("dead"), note("later")):
                await outbox.put(r.js, n)

            async def settled():
                s = await r.states()
                return s if s.get("n-ok") == "sent" and s.get("n-dead") == "dead" \
                    and s.get("n-later") == "sent" else None
            await r.until(settled, what="ok sent, dead dead, later sent")
            rows = {x["id"]: x for x in await outbox.outcomes(r.js)}
            dead = rows["n-dead"]
            assert dead["reason"] == "550 5.1.1 <nobody@example.com>: mailbox unknown"
            assert dead["notification"]["subject"] == "subject dead"   # kept, to be seen or sent by hand
            assert rows["n-later"]["attempt"] == 2 and rows["n-ok"]["attempt"] == 1
            assert (await r.js.stream_info(outbox.STREAM)).state.messages == 0  # all acked
            # dead only: the listing's filter
            assert [x["id"] for x in await outbox.outcomes(r.js, state="dead")] == ["n-dead"]
    run(main())
    assert sorted(smtpd.ids()) == ["n-later", "n-ok"]
    assert smtpd.deferred == ["n-later"] and smtpd.refused == ["n-dead"]


def test_passing_failures_past_the_attempts_are_dead_with_the_last_answer(natsd, smtpd):
    smtpd.defer["n-never"] = 100

    async def main():
        async with Running(natsd.url, smtp_config(smtpd, attempts=2), token=5) as r:
            await outbox.put(r.js, note("never"))
            await r.until(lambda: _state(r, "n-never", "dead"), what="n-never dead")
            (row,) = await outbox.outcomes(r.js, state="dead")
            assert row["reason"].startswith("2 sends failed; the last: 451 4.3.0")
    run(main())
    assert smtpd.ids() == [] and smtpd.deferred == ["n-never", "n-never"]


async def _state(r: Running, id: str, state: str) -> bool:
    return (await r.states()).get(id) == state


def test_a_repeat_is_not_sent_and_a_claim_left_by_a_dead_sender_is_unknown_never_resent(natsd, smtpd):
    async def main():
        async with Running(natsd.url, smtp_config(smtpd), token=5) as r:
            await outbox.put(r.js, note(1))
            await r.until(lambda: _state(r, "n-1", "sent"), what="n-1 sent")
            # The same id again, past the stream's dedupe (another id on the wire,
            # the same notification id): the claim says sent.
            await outbox.put(r.js, note(1), patience=2)
            dup = outbox.Notification(**{**note(1).model_dump()})
            await r.js.publish(outbox.SUBJECT + "email", dup.encode(), headers={"Nats-Msg-Id": "other"})
            # A sender (token 4) claimed n-2 and died before the server answered.
            kv = await r.js.key_value(buckets.CLAIMS.name)
            await kv.create(outbox.claim_key("n-2"),
                            outbox.record(note(2), outbox.SENDING, node="gone", token=4, claim="x", attempt=1))
            await outbox.put(r.js, note(2))
            await r.until(lambda: _state(r, "n-2", "unknown"), what="n-2 unknown")
            await r.until(lambda: _stream_empty(r), what="OUTBOX drained")
            (row,) = [x for x in await outbox.outcomes(r.js) if x["id"] == "n-2"]
            assert "claimed by gone (token 4)" in row["reason"] and "not sent again" in row["reason"]
    run(main())
    assert smtpd.ids() == ["n-1"]


async def _stream_empty(r: Running) -> bool:
    return (await r.js.stream_info(outbox.STREAM)).state.messages == 0


def test_the_valve_refuses_a_deposed_holder_and_a_new_holders_takeover_beats_its_cas(natsd):
    async def main():
        nc = await nats.connect(natsd.url)
        js = nc.jetstream()
        await buckets.ensure_all(js, 1)
        old, new = Valve(js, "email", token=7), Valve(js, "email", token=9)
        await old.take_over()
        await old.admit(1000.0, 1)          # old holds the valve's revision it last wrote
        await new.take_over()               # the new holder writes its token in first
        with pytest.raises(Deposed):
            await old.admit(1000.0, 1)      # its CAS loses, its re-read names token 9
        await new.admit(1000.0, 1)
        seq, data = await buckets.last(js, buckets.RATE.name, "email", leader=True)
        assert json.loads(data)["token"] == 9
        with pytest.raises(Deposed):
            await Valve(js, "email", token=8).take_over()   # an older token than the valve's
        await nc.close()
    run(main())


def test_the_notify_tool_puts_one_notification_however_often_the_turn_is_redone(natsd, smtpd):
    async def main():
        async with Running(natsd.url, smtp_config(smtpd), token=5) as r:
            reg = Registry()
            for tool in builtin_tools():
                reg.add(tool)
            services = SimpleNamespace(outbox=functools.partial(outbox.put, r.js), seats=frozenset())
            args = {"to": "boss@example.com", "subject": "weekly", "body": "all good"}
            for _ in range(3):  # the turn, and two redos of it: the same call key
                ctx = ToolContext(seat="ceo", trigger="t-9", token=3, call_key="t-9.1.0", services=services)
                text, error = await reg.call(ctx, "notify", args)
                assert not error and "queued" in text, text
            # Another call of the same turn is another notification.
            ctx = ToolContext(seat="ceo", trigger="t-9", token=3, call_key="t-9.1.1", services=services)
            assert not (await reg.call(ctx, "notify", {**args, "to": ["a@example.com", "b@example.com"]}))[1]
            # What the tool refuses, the model reads.
            text, error = await reg.call(ctx, "notify", {**args, "to": "not an address"})
            assert error and "to" in text and "email address" in text, text
            text, error = await reg.call(ctx, "notify", {**args, "subject": "two\nlines"})
            assert error and "subject" in text, text

            async def both_sent():
                s = await r.states()
                return s.get("ceo.t-9.1.0") == "sent" and s.get("ceo.t-9.1.1") == "sent"
            await r.until(both_sent, what="both notifications sent")
    run(main())
    assert sorted(smtpd.ids()) == ["ceo.t-9.1.0", "ceo.t-9.1.1"]
    first = next(m for m in smtpd.messages if m["X-Crewlet-Notification"] == "ceo.t-9.1.0")
    assert first["To"] == "boss@example.com" and first["Subject"] == "weekly"
    assert first.get_payload().strip() == "all good"


def test_smtp_password_file_must_be_0600(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    secret.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        SmtpSection(host="h", password_file=str(secret))
    secret.chmod(0o600)
    assert SmtpSection(host="h", password_file=str(secret)).password() == "hunter2"
