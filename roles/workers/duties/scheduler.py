"""Duty ``scheduler``: the company's ``schedules:`` become mail to their seats at their times.

While this node holds ``duty.scheduler`` the duty sleeps until the next
tick of any schedule (looking at least every :data:`LOOK_EVERY` seconds for
a new company revision, so schedules added, changed or removed take effect
without a restart), then for each schedule due:

1. :func:`crewlet.schedules.plan` says which ticks to fire — those due since
   the schedule's record was last settled, missed ones by its ``catch_up``;
2. the duty's fence is checked (its lease still carries this holder's token);
3. each tick is posted to the seat's mailbox (:func:`crewlet.queue.post.post`,
   the mail every surface sends) with its trigger id
   ``<schedule>=<YYYYMMDDTHHMMSSZ>`` — the scheduled time, not the time sent;
4. then the record (:mod:`crewlet.coord.fired`) is moved on, under the fence;
   a record somebody else changed meanwhile is read again and the schedule
   decided anew at once (what was sent meanwhile is sent again under the
   same trigger ids, and dropped as repeats).

Mail goes before the record, so a holder killed between the two leaves the
tick to be fired again by the next holder (or the same one restarted) under
the same trigger id: the mailbox drops the repeat within its duplicate window
and the seat's ledger skips a trigger it worked after that. Two holders
overlapping at a hand-over do the same, and the older one's record write
loses (:class:`~crewlet.coord.fired.Deposed`): it stops.

A schedule seen for the first time, or with another timing than its record's
(``cron``, ``every`` or ``tz`` changed), starts anew from now: no tick before
that is fired. A record of a schedule the company dropped is left as it is
(small, and the schedule's history should it come back with the same timing).

Events: ``scheduler_running`` (this holder's start: ticks due before it
are missed), ``schedule_started``, ``schedule_fired`` (per tick: trigger, seat,
scheduled time, how late), ``schedule_ticks_skipped`` (missed ticks
``catch_up`` did not fire: how many, the first and last), ``schedule_failed``
(the mailbox or the record could not be written: tried again after
:data:`RETRY_AFTER` seconds), ``schedule_deposed``.
"""

from __future__ import annotations

import time
from typing import Any

from crewlet import log
from crewlet.company.model import Schedule
from crewlet.coord.fired import Conflict, Deposed, Fired, FiredError
from crewlet.coord.lease import LeaseError
from crewlet.queue.base import MailboxError
from crewlet.queue.jetstream import JetStreamMailboxes
from crewlet.queue.post import post
from crewlet.schedules import iso, plan, trigger
from roles.workers.duties import Duty, going_on, rest

NAME = "scheduler"
# Seconds between looks at the company in force while no tick is due.
LOOK_EVERY = 1.0
# Seconds before a schedule whose mail or record could not be written is tried again.
RETRY_AFTER = 2.0
# Seconds slept past a tick, so a wake a hair early (the loop's clock is
# monotonic, ticks are wall clock) does not find it not yet due.
WAKE_SLACK = 0.005
# The sender a scheduled mail names (Crewlet-From): schedule:<name>.
SENDER = "schedule:{}"


class Scheduler:
    """One holder's run of the schedules. Invariant: ``books[name]`` is the
    (sequence, record) of ``status/schedule.<name>`` as this holder last
    read or wrote it."""

    def __init__(self, ctx, since: float):
        self.ctx = ctx
        self.since = since  # when this holder started: ticks due before it are missed
        js = ctx.role.jetstream()
        self.mailboxes = JetStreamMailboxes(js, ctx.role.nats)
        self.fired = Fired(js)
        self.node = ctx.config.node.id
        self.books: dict[str, tuple[int, dict[str, Any] | None]] = {}
        self.next_at: dict[str, float] = {}  # when each schedule is next due (wall clock)
        self.failing: set[str] = set()  # schedules whose last try failed (logged once per run)

    def _fence(self, name: str, record: dict[str, Any] | None) -> None:
        if record is not None and int(record.get("token") or 0) > self.ctx.token:
            raise Deposed(f"schedule.{name} was written under token {record.get('token')} "
                          f"by {record.get('node')}; ours is {self.ctx.token}")

    async def _write(self, name: str, record: dict[str, Any]) -> dict[str, Any]:
        seq, _ = self.books[name]
        seq, written = await self.fired.write(name, record, expected=seq, token=self.ctx.token, node=self.node)
        self.books[name] = (seq, written)
        return written

    async def tend(self, s: Schedule, now: float) -> float:
        """Fire what of *s* is due at *now*; when it is next due."""
        timing = s.timing
        if s.name not in self.books:
            self.books[s.name] = await self.fired.read(s.name)
        seq, record = self.books[s.name]
        self._fence(s.name, record)
        if record is None or record.get("spec") != timing.spec:
            await self._write(s.name, {"spec": timing.spec, "start": now, "settled": now,
                                       "fired": None, "trigger": None, "fired_at": None})
            log.event("schedule_started", schedule=s.name, seat=s.seat, spec=timing.spec,
                      was=(record or {}).get("spec"), next=iso(timing.next_after(now)))
            return timing.next_after(now)
        todo = plan(timing, float(record["settled"]), now, self.since, s.catch_up)
        if todo is None:
            return timing.next_after(float(record["settled"]))
        update: dict[str, Any] = {**record, "settled": todo.settled}
        if todo.fire:
            if not await self.ctx.leases.current(f"duty.{NAME}", self.ctx.token):
                raise Deposed(f"duty.{NAME} no longer carries token {self.ctx.token}")
            for when in todo.fire:
                tid = trigger(s.name, when)
                sent = await post(self.ctx.role.nats, self.mailboxes, s.seat, s.message,
                                  sender=SENDER.format(s.name), trigger=tid)
                log.event("schedule_fired", schedule=s.name, seat=s.seat, trigger=tid,
                          scheduled=iso(when), late=round(now - when, 3), duplicate=sent["duplicate"])
            update.update(fired=todo.fire[-1], trigger=trigger(s.name, todo.fire[-1]), fired_at=time.time())
        if todo.skipped:
            log.event("schedule_ticks_skipped", "warning", schedule=s.name, catch_up=s.catch_up,
                      skipped=todo.skipped, first=iso(todo.first_skipped), last=iso(todo.last_skipped))
        await self._write(s.name, update)
        return timing.next_after(todo.settled)

    async def run(self) -> None:
        while going_on():
            company = self.ctx.company()
            schedules = {s.name: s for s in company.schedules} if company is not None else {}
            for name in set(self.next_at) - set(schedules):
                self.next_at.pop(name, None)  # dropped by the company; its record stays
                self.books.pop(name, None)
            now = time.time()
            for s in schedules.values():
                book = self.books.get(s.name)
                if (self.next_at.get(s.name, 0) > now and book is not None
                        and (book[1] or {}).get("spec") == s.timing.spec):
                    continue  # not due, and not changed
                try:
                    self.next_at[s.name] = await self.tend(s, now)
                    if s.name in self.failing:
                        self.failing.discard(s.name)
                        log.event("schedule_recovered", schedule=s.name)
                except Conflict as exc:
                    # Written by somebody else since we read it: read it and decide again, now.
                    self.books.pop(s.name, None)
                    self.next_at[s.name] = now
                    log.event("schedule_record_changed", schedule=s.name, error=str(exc))
                except (FiredError, MailboxError, LeaseError, ValueError) as exc:
                    # The tick stays due; the next try fires it, under the same trigger.
                    self.books.pop(s.name, None)  # read the record again
                    self.next_at[s.name] = now + RETRY_AFTER
                    if s.name not in self.failing:
                        self.failing.add(s.name)
                        log.event("schedule_failed", "warning", schedule=s.name,
                                  error=f"{type(exc).__name__}: {exc}")
            wake = min([now + LOOK_EVERY, *self.next_at.values()])
            await rest(min(LOOK_EVERY, max(0.0, wake - time.time())) + WAKE_SLACK)


async def run(ctx) -> None:
    since = time.time()
    log.event("scheduler_running", since=since, token=ctx.token)
    try:
        await Scheduler(ctx, since=since).run()
    except Deposed as exc:
        # Another holder runs the schedules: stop here. The runner finds the
        # lease lost at its next tend (or, were it still ours, starts us again).
        log.event("schedule_deposed", "warning", error=str(exc))


DUTY = Duty(NAME, run)
