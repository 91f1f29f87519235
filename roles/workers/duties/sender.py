"""Duty ``sender``: send the notifications on ``OUTBOX``, at the company's
rate fleet-wide, each at most once (DESIGN §12; seed: "the email-queue
advisory lock elects exactly one sender across the whole deployment").

One node of the fleet holds ``duty.sender`` — only a node whose Tier A
``smtp.host`` is set takes it (:func:`wanted`) — and drains ``OUTBOX`` through
the durable consumer :data:`CONSUMER`, one notification at a time:

1. **a repeat?** — its claim record (:mod:`crewlet.outbox`) already says
   ``sent``, ``dead`` or ``unknown``: acked, not sent. Found ``sending``
   under a claim that is not this process's: the sender that claimed it died
   between its claim and the server's answer, so it is marked ``unknown``
   and never sent again (at-most-once: a recipient prefers a lost email to a
   duplicate);
2. **admission** — the valve in ``rate`` (:class:`crewlet.coord.valve.Valve`)
   admits the send by a compare-and-set under this duty's fencing token,
   *before* the send; a slot is waited for as long as the rate says;
3. **the claim** — the record goes to ``sending`` by a compare-and-set on the
   revision read in 1 (create-only the first time), so two holders
   overlapping at a hand-over cannot both send it;
4. **the send** (:class:`crewlet.mailer.Mailer`) and its outcome recorded:
   ``sent``; ``dead`` for a permanent refusal (5xx) with the server's words,
   or once ``smtp.attempts`` sends failed; ``unknown`` when the answer was
   lost after the message was handed over; ``retry`` for a passing failure
   (4xx, no connection), NAKed to come back after ``smtp.retry_after``
   doubling per attempt (at most :data:`RETRY_MAX`);
5. the ack (it leaves the work-queue stream).

While one notification is in hand its ack wait is kept alive
(:data:`ACK_WAIT`, ``in_progress`` every :data:`PROGRESS_EVERY`), so one
waiting for a slot or a slow server is not handed out again, and one held by
a sender that was killed comes back :data:`ACK_WAIT` seconds later.

Outcomes are listed by ``crewletctl outbox`` (and the control command
``outbox``); each is logged (``outbox_sent``, ``outbox_dead``, …).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Callable

from nats.js.errors import KeyWrongLastSequenceError
from pydantic import ValidationError

from crewlet import groups, log, outbox
from crewlet.config.model import SmtpSection
from crewlet.coord import buckets
from crewlet.coord.valve import Deposed, Valve
from crewlet.mailer import Mailer
from crewlet.queue.jetstream import api_prefix, create_consumer
from roles.workers.duties import Duty, going_on, rest

CONSUMER = groups.durable(groups.SENDER)
VALVE = "email"                    # the valve's key in the rate bucket
# Seconds a notification in hand stays ours without a sign of life: a killed
# sender's comes back this long after (kept alive meanwhile by in_progress).
ACK_WAIT = 10.0
PROGRESS_EVERY = ACK_WAIT / 3
MAX_ACK_PENDING = 64               # a dead sender's in-hand ones do not block its successor
FETCH_WAIT = 2.0
RETRY_MAX = 3600.0                 # the longest pause between two sends of one notification
TROUBLE_PAUSE = 1.0                # after the broker failed us (no quorum, a leader moving)
OUTCOME_ATTEMPTS = 5               # tries of an outcome's write (it follows a send: never resent)
OUTCOME_PAUSE = 0.5
NO_COMPANY_PAUSE = 0.5             # no company yet: no rate to send at


def wanted(config) -> bool:
    """Only a node with an SMTP server takes the duty."""
    return config.smtp.host is not None


def backoff(smtp: SmtpSection, attempt: int) -> float:
    """Seconds before send number *attempt* + 1 after a passing failure."""
    return min(RETRY_MAX, smtp.retry_after * 2 ** (attempt - 1))


class Sender:
    """One holder's sending: *rate* gives the company's ``(rate, burst)``
    (None while no company is in force)."""

    def __init__(self, js, nc, smtp: SmtpSection, token: int, node: str,
                 rate: Callable[[], tuple[float, int] | None], *, replicas: int = 1):
        self.js, self.nc, self.smtp, self.replicas = js, nc, smtp, replicas
        self.token, self.node, self.rate = token, node, rate
        self.valve = Valve(js, VALVE, token)
        self.mailer = Mailer(smtp)
        self.claims = None
        # Claims this process wrote whose write's answer was lost, so it never
        # sent them: found again as `sending`, they are ours to take back.
        self.unsent: set[str] = set()
        self.counts = {s: 0 for s in outbox.STATES}

    async def run(self) -> None:
        await outbox.ensure_stream(self.js, self.replicas)  # made at boot already: a backstop
        self.claims = await self.js.key_value(buckets.CLAIMS.name)
        await self.valve.take_over()
        log.event("sender_started", token=self.token)
        config = {"name": CONSUMER, "durable_name": CONSUMER, "deliver_policy": "all",
                  "ack_policy": "explicit", "ack_wait": int(ACK_WAIT * 1e9), "max_deliver": -1,
                  "max_ack_pending": MAX_ACK_PENDING, "replay_policy": "instant",
                  "filter_subject": outbox.SUBJECT + ">", "num_replicas": 0}
        if await create_consumer(self.nc, api_prefix(self.js), outbox.STREAM, config):
            log.event("sender_consumer_created", consumer=CONSUMER)
        psub = await self.js.pull_subscribe_bind(durable=CONSUMER, stream=outbox.STREAM)
        try:
            while going_on():
                if self.rate() is None:
                    await rest(NO_COMPANY_PAUSE)
                    continue
                try:
                    msgs = await psub.fetch(1, timeout=FETCH_WAIT)
                except asyncio.TimeoutError:
                    continue
                for msg in msgs:
                    await self.one(msg)
        finally:
            await self.mailer.close()
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def one(self, msg) -> None:
        try:
            n = outbox.Notification.decode(msg.data)
        except (ValidationError, ValueError) as exc:
            log.event("outbox_malformed", "warning", seq=msg.metadata.sequence.stream,
                      error=outbox.problem(exc) if isinstance(exc, ValidationError) else str(exc))
            await msg.term()
            return
        alive = asyncio.create_task(_keep_alive(msg))
        try:
            await self._one(msg, n)
        except Deposed:
            await _quietly(msg.nak())
            raise
        except Exception as exc:
            # The broker failed us before the send: nothing went out. Asked
            # again shortly (the NAK), after a pause.
            log.event("sender_trouble", "warning", id=n.id, error=f"{type(exc).__name__}: {exc}")
            await _quietly(msg.nak(delay=TROUBLE_PAUSE))
            await asyncio.sleep(TROUBLE_PAUSE)
        finally:
            alive.cancel()

    async def _one(self, msg, n: outbox.Notification) -> None:
        revision, rec = await outbox.read(self.js, n.id)
        state = (rec or {}).get("state")
        if state in outbox.FINAL:
            log.event("outbox_repeat", "debug", id=n.id, state=state)
            await msg.ack()
            return
        if state == outbox.SENDING and rec.get("claim") not in self.unsent:
            await self._unknown(msg, n, revision, rec)
            return
        attempt = int((rec or {}).get("attempt") or 0) + 1
        rate, burst = self.rate()
        admitted = await self.valve.admit(rate, burst)
        claim = uuid.uuid4().hex
        self.unsent.add(claim)
        try:
            claimed = await self.claims.update(
                outbox.claim_key(n.id), outbox.record(n, outbox.SENDING, node=self.node, token=self.token,
                                                      claim=claim, attempt=attempt, admitted=admitted),
                last=revision)
        except KeyWrongLastSequenceError:
            # Another holder (overlapping at a hand-over) changed it: look again.
            self.unsent.discard(claim)
            await msg.nak()
            return
        self.unsent.discard(claim)  # from here on it may be sent
        verdict = await self.mailer.send(n)
        state, reason = verdict.state, verdict.reason
        if state == outbox.RETRY and attempt >= self.smtp.attempts:
            state, reason = outbox.DEAD, f"{attempt} sends failed; the last: {reason}"
        extra = {"notification": n.model_dump()} if state == outbox.DEAD else {}
        await self._record(n, claimed, outbox.record(n, state, node=self.node, token=self.token,
                                                     attempt=attempt, admitted=admitted, reason=reason,
                                                     **extra))
        self.counts[state] += 1
        log.event(f"outbox_{state}", "info" if state == outbox.SENT else "warning",
                  id=n.id, attempt=attempt, reason=reason)
        if state == outbox.RETRY:
            await msg.nak(delay=backoff(self.smtp, attempt))
        else:
            await msg.ack()

    async def _unknown(self, msg, n: outbox.Notification, revision: int, rec: dict) -> None:
        why = (f"claimed by {rec.get('node')} (token {rec.get('token')}), which left no answer: "
               "it may or may not have been delivered, and is not sent again")
        try:
            await self.claims.update(outbox.claim_key(n.id),
                                     outbox.record(n, outbox.UNKNOWN, node=self.node, token=self.token,
                                                   attempt=rec.get("attempt"), admitted=rec.get("admitted"),
                                                   reason=why),
                                     last=revision)
        except KeyWrongLastSequenceError:
            await msg.nak()  # its claimer, alive after all, wrote its outcome: look again
            return
        self.counts[outbox.UNKNOWN] += 1
        log.event("outbox_unknown", "warning", id=n.id, reason=why)
        await msg.ack()

    async def _record(self, n: outbox.Notification, claimed: int, value: bytes) -> None:
        """Write an outcome after a send, on the claim's revision (ours), tried
        again while unanswered; a write that timed out yet landed is found on
        the re-read. Never resends anything: the worst left is ``sending``,
        which a later look reports as ``unknown``."""
        key = outbox.claim_key(n.id)
        for _ in range(OUTCOME_ATTEMPTS):
            try:
                await self.claims.update(key, value, last=claimed)
                return
            except KeyWrongLastSequenceError:
                return  # ours landed already, or another holder reported it unknown
            except Exception as exc:
                log.event("outbox_record_failed", "warning", id=n.id, error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(OUTCOME_PAUSE)


async def _keep_alive(msg) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY)
        with contextlib.suppress(Exception):
            await msg.in_progress()


async def _quietly(coro) -> None:
    with contextlib.suppress(Exception):
        await coro


def _rate_of(ctx) -> Callable[[], tuple[float, int] | None]:
    def rate() -> tuple[float, int] | None:
        company = ctx.company()
        return None if company is None else (company.notify.rate, company.notify.burst)
    return rate


async def run(ctx) -> None:
    sender = Sender(ctx.role.jetstream(), ctx.role.nats, ctx.config.smtp, ctx.token,
                    ctx.config.node.id, _rate_of(ctx), replicas=ctx.config.stream.replicas)
    await sender.run()


DUTY = Duty("sender", run, wanted=wanted)
