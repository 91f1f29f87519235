"""Driving conversation runs from a node with ``ingress`` (DESIGN §11).

A run's **driver** holds the conversation's lease ``conv.<id>``
(:mod:`.lease`) from the run's start to its terminal event, streaming or not:
it writes the run ``running`` in the estate, puts it in the seat's mailbox
(the turn runs where the seat is held: :mod:`.turn`), tells ``run.started``,
then waits for the run's end on ``RUNS``. One :class:`Conductor` per ingress
process does this for the API's requests and for its **session runner**.

Starting a run (:meth:`Conductor.start`), by ``multitask_strategy``:

==============  ===========================================================
``reject``      wait up to ``conversations.busy_wait`` for the lease, then
                :class:`~.lease.ConversationBusy` (the API's 409, sent before
                any SSE header) naming the run that drives it
``enqueue``     start now if the conversation is free and nothing is queued
                before it; otherwise the run is kept ``queued`` and the
                session runner starts the queue in order, each run when the
                conversation is free
``interrupt``   ask the running run to stop (it does before its next round,
                ending ``run.interrupted``); a pending approval is denied;
                then start, waiting up to :data:`INTERRUPT_WAIT` for the lease
``rollback``    as ``interrupt``, then the interrupted run's messages are
                removed (``conversation.rollback``) before the new run
                starts; the tool calls it ran stay done, and are listed
==============  ===========================================================

A conversation awaiting a decision refuses ``reject`` with
:class:`PendingApproval`; ``enqueue`` waits behind it.

The **session runner** (:meth:`Conductor.run_sessions`) drives what no
request does, every ``sessions.sweep`` seconds or at once when this process
queued something: the oldest queued run of each free conversation; the
resumption of a conversation whose approval was decided (a new run carrying
the approval); a pending approval past its ``expires_at`` (denied as
expired, which the model is then told); and a run ``running`` whose
conversation has no driver lease — its driver died — which it takes over:
the run is put in the seat's mailbox again under a trigger of the new
lease's token, and the turn goes on from what the estate kept (rounds kept
are not asked again, calls with a result are not run again). It takes every
lease **without waiting**, so a conversation driven elsewhere is left there,
and drives at most ``sessions.runner_concurrency`` runs at once.

While this node is **drained** (its presence says ``draining``:
:mod:`crewlet.coord.drain`) it starts no run (:class:`Draining`: the API's
503 ``node_draining``, a client retries elsewhere) and its session runner
takes none; the runs it drives are left to end until the order's deadline,
then let go — their leases released, the runs going on where their seats
are held — for a session runner elsewhere to take over.

A driver whose run gives no end within ``conversations.max_run`` ends it
``failed`` (and asks its turn to stop); a driver that loses its lease (its
renewals unanswered for a TTL) stops driving and leaves the run to whoever
takes the lease next.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from crewlet import log
from crewlet.coord import drain
from crewlet.coord.lease import LeaseError
from crewlet.conversations import runs
from crewlet.conversations import turn as run_turn
from crewlet.conversations.lease import ConversationBusy, Drivers, Driving, key as lease_key
from crewlet.estate.apply import BUSY, CONFLICT, NOT_FOUND, PENDING_APPROVAL
from crewlet.estate.ops import EXPIRED, RUN_ENDED, make_op, op_id
from crewlet.estate.router import START_WAIT
from crewlet.queue.post import FROM_HEADER

# Seconds an interrupt (or a rollback) waits for the running run to stop and
# let go of the lease: the run stops before its next round, so up to one
# model call (a long streamed answer) and its driver's teardown.
INTERRUPT_WAIT = 60.0
# Seconds between a driver's looks at its run's status in the estate while it
# waits for the run's end: the backstop for an end written but never told.
STATUS_EVERY = 5.0
# Seconds after a run's end was written in the estate (its ``ended_at``) before
# anybody but its turn tells that end on RUNS (:meth:`Conductor.tell_untold_end`).
# The turn writes the end first, then publishes its held text and the terminal
# event, each ridden through a leader election for up to runs.PUBLISH_PATIENCE:
# an end told sooner by somebody else can land before that text (issue 29: the
# terminal event at one sequence, the last words after it, never shown), and
# the dedupe window then drops the turn's own terminal event.
END_GRACE = runs.PUBLISH_PATIENCE
# Seconds one estate request of a driver waits (the router asks the data
# nodes in turn; a write may wait out a leader election on one, then ask the next).
ESTATE_WAIT = 30.0
# Seconds after a decision before the session runner resumes its conversation
# itself: the decider writes the resumption (or its interrupting run) at once.
RESUME_GRACE = 10.0
# Rows the session runner reads per look at each of its lists.
SWEEP_PAGE = 200
# What a run without input is mailed as (the mail's text is only shown in
# the mailbox views: the turn reads the run from the estate).
NO_INPUT = "(a conversation run: the turn reads it from the estate)"


class PendingApproval(Exception):
    """The conversation awaits a person's decision on an approval first."""

    def __init__(self, conversation: str, approval: str):
        super().__init__(f"conversation {conversation} awaits a decision on approval {approval}")
        self.conversation, self.approval = conversation, approval


class Draining(Exception):
    """This node is drained: it starts no run (another node does)."""

    def __init__(self, node: str, draining: dict[str, Any]):
        super().__init__(f"node {node} is draining (by {draining.get('by', '?')}): "
                         f"start the run through another node")
        self.node = node


class Refused(Exception):
    """The estate refused a write of the driver: ``code`` says why
    (``not_found``, ``conflict``, …), ``outcome`` is the estate's answer."""

    def __init__(self, outcome: dict[str, Any]):
        super().__init__(str(outcome.get("error") or "refused"))
        self.code = outcome.get("code")
        self.outcome = outcome


@dataclass
class Started:
    """A run this node drives now: ``run`` its row, ``events_from`` the
    sequence to follow its events after (its ``run.started`` comes next)."""

    run: dict[str, Any]
    node: str
    rolled_back: dict[str, Any] | None = None


@dataclass
class Queued:
    """A run kept ``queued``: the session runner starts it in its turn."""

    run: dict[str, Any]
    rolled_back: dict[str, Any] | None = None


def run_id(conversation: str, key: str | None) -> str:
    """A new run's id: from the caller's Idempotency-Key (the same key on the
    same conversation is the same run), else fresh. Letters, digits and '-'
    only, so it is a trigger's part too."""
    if key is None:
        return "r-" + uuid.uuid4().hex[:24]
    return "r-" + hashlib.sha256(f"{conversation}\0{key}".encode()).hexdigest()[:24]


def resumption_id(approval: str) -> str:
    """The id of the run that resumes a conversation after *approval*'s decision."""
    return "r-" + hashlib.sha256(f"resume\0{approval}".encode()).hexdigest()[:24]


@dataclass
class _Sessions:
    """The session runner's state. Invariant: ``driving`` maps each run this
    process drives to its task; ``runner`` counts the runner's own among them
    (with ``reserved``, at most ``limit``)."""

    limit: int
    driving: dict[str, asyncio.Task] = field(default_factory=dict)
    runner: set[str] = field(default_factory=set)
    reserved: int = 0  # places held by starts under way (Conductor._runner_slot)
    nudged: asyncio.Event = field(default_factory=asyncio.Event)


class Conductor:
    """Every run this ingress process drives, and its session runner.

    *router*: the estate router; *mailboxes*: the seats' mailboxes;
    *company*: a callable giving the revision of the company in force (what a
    new run pins; None before one is applied).
    """

    def __init__(self, *, js, router, mailboxes, drivers: Drivers, node: str, busy_wait: float,
                 max_run: float, event_ttl: float, runner_concurrency: int, sweep: float, company):
        self.js = js
        self.router = router
        self.mailboxes = mailboxes
        self.drivers = drivers
        self.node = node
        self.busy_wait = busy_wait
        self.max_run = max_run
        self.event_ttl = event_ttl
        self.sweep = sweep
        self.company = company
        self.sessions = _Sessions(runner_concurrency)
        self.stopping = False
        self._background: set[asyncio.Task] = set()  # referenced until done

    # ------------------------------------------------------------ estate

    async def read(self, query: str, args: dict[str, Any]) -> dict[str, Any]:
        return await self.router.read(query, args, timeout=ESTATE_WAIT) or {}

    async def write(self, kind: str, args: dict[str, Any], ident: str) -> dict[str, Any]:
        """Write one op as the operator; its result (:class:`Refused` when refused)."""
        op = make_op(kind, args, node=self.node, id=op_id("conv", kind, ident))
        outcome = await self.router.write(op, timeout=ESTATE_WAIT)
        if not outcome.get("ok"):
            raise Refused(outcome)
        return outcome.get("result") or {}

    async def conversation(self, conversation: str) -> dict[str, Any]:
        """``{conversation, run, approval}``; :class:`Refused` ``not_found`` if none."""
        got = await self.read("conversation.get", {"id": conversation})
        if got.get("conversation") is None:
            raise Refused({"error": f"no conversation {conversation}", "code": NOT_FOUND})
        return got

    # ------------------------------------------------------------ starting

    async def start(self, conversation: str, *, input: str, strategy: str, on_disconnect: str,
                    key: str | None, stream: bool = True) -> Started | Queued:
        """Start a run of *conversation* by *strategy* (the module doc).

        A run nobody streams (*stream* False) is the session runner's: it
        counts against ``sessions.runner_concurrency``, and with no room left
        it is kept queued (after the strategy was honoured: a busy
        conversation still refuses it) and started as room comes.

        Raises :class:`~.lease.ConversationBusy`, :class:`PendingApproval`,
        :class:`Refused` (``not_found``: no such conversation),
        :class:`~crewlet.coord.lease.LeaseError` (the leases bucket did not
        answer) and the estate router's errors.
        """
        if (draining := self.draining()) is not None:
            raise Draining(self.node, draining)
        got = await self.conversation(conversation)
        conv, approval = got["conversation"], got.get("approval")
        ident = run_id(conversation, key)
        # The same request again (its Idempotency-Key) is answered with its run; without a key
        # the id is fresh (96 random bits), so there is nothing to look up.
        existing = (await self.read("run.get", {"id": ident})).get("run") if key is not None else None
        if existing is not None:
            if existing["status"] == "queued":
                return Queued(existing)
            return Started(existing, existing.get("node") or self.node)
        pending = approval if approval is not None and approval.get("status") == "pending" else None
        rolled: dict[str, Any] | None = None
        wait = self.busy_wait
        if strategy in ("interrupt", "rollback"):
            if pending is not None:
                # No resumption of its own: this run answers the call as not run.
                await self.decide(pending["id"], "deny", note=f"interrupted by run {ident}", by="crewlet",
                                  resume=False)
                pending = None
            current = conv.get("run") if conv["status"] == "running" else None
            if current:
                await runs.request_cancel(self.js, conversation, current, ttl=self.event_ttl,
                                          by=f"run {ident}", why=f"interrupted by run {ident}")
                await self._ended(current, INTERRUPT_WAIT)
                if strategy == "rollback":
                    rolled = await self.write("conversation.rollback",
                                              {"conversation": conversation, "run": current}, current)
                    rolled = {"run": current, "removed": rolled.get("removed", 0),
                              "calls": rolled.get("calls", [])}
            wait = INTERRUPT_WAIT
        revision = self._revision()
        base = {"id": ident, "conversation": conversation, "strategy": strategy,
                "on_disconnect": on_disconnect, "revision": revision, "input": input}
        if strategy == "enqueue":
            queued = (await self.read("run.list", {"conversation": conversation, "status": "queued",
                                                   "limit": 1})).get("runs")
            if pending is not None or queued or conv["status"] == "running":
                row = (await self.write("run.create", base, ident))["run"]
                self.nudge()
                return Queued(row, rolled)
            wait = 0.0
        elif pending is not None:
            raise PendingApproval(conversation, pending["id"])
        try:
            driving = await self.drivers.acquire(conversation, ident, wait=wait)
        except ConversationBusy:
            if strategy != "enqueue":
                raise
            row = (await self.write("run.create", base, ident))["run"]
            self.nudge()
            return Queued(row, rolled)
        with self._runner_slot() if not stream else contextlib.nullcontext(True) as room:
            if not room:
                await driving.release()
                row = (await self.write("run.create", base, ident))["run"]
                self.nudge()
                return Queued(row, rolled)
            try:
                row = (await self.write("run.create", {**base, "status": "running", "node": self.node},
                                        ident))["run"]
            except Refused as exc:
                await driving.release()
                if exc.code == BUSY:
                    # Running with no driver: its driver died; the session runner
                    # takes it over. A retry is let in once it has ended.
                    self.nudge()
                    raise ConversationBusy(conversation, exc.outcome.get("detail", {}).get("run")
                                           or conv.get("run"), None, None, int(self.drivers.ttl)) from None
                if exc.code == PENDING_APPROVAL:
                    raise PendingApproval(conversation, exc.outcome.get("detail", {}).get("approval")
                                          or "") from None
                raise
            except BaseException:
                await driving.release()
                raise
            await self._launch(row, driving, taken_over=False, runner=not stream,
                               told={"rolled_back": rolled} if rolled else None)
        return Started(row, self.node, rolled)

    def _revision(self) -> int:
        revision = self.company()
        if not isinstance(revision, int) or revision < 1:
            raise Refused({"error": "no company is applied yet", "code": "no_company"})
        return revision

    async def _ended(self, run: str, wait: float) -> dict[str, Any] | None:
        """Wait up to *wait* s for *run* to end in the estate; its row."""
        deadline = time.monotonic() + wait
        while True:
            row = (await self.read("run.get", {"id": run})).get("run")
            if row is None or row["status"] in RUN_ENDED or time.monotonic() >= deadline:
                return row
            await asyncio.sleep(0.25)

    async def _launch(self, run: dict[str, Any], driving: Driving, *, taken_over: bool,
                      runner: bool = False, told: dict[str, Any] | None = None) -> None:
        """Mail the seat *run* and tell ``run.started`` (with *told*: what a
        rollback removed); then drive it in the background until its end (the
        task is this process's, not a request's)."""
        conversation, ident = run["conversation"], run["id"]
        try:
            seat = run.get("seat") or (await self.conversation(conversation))["conversation"]["seat"]
            # Told before the seat has the run: its turn's events come after.
            events = runs.RunEvents(self.js, conversation, ident, ttl=self.event_ttl)
            started = {"type": runs.STARTED, "node": self.node, "seat": seat}
            if taken_over:
                started["taken_over"] = True
            started.update(told or {})
            await events.publish(started, id=f"{ident}:started:{driving.token}")
            await self.mailboxes.put(seat, run.get("input") or NO_INPUT,
                                     trigger=f"{run_turn.trigger(ident)}.{driving.token}",
                                     headers={run_turn.RUN_HEADER: ident,
                                              run_turn.CONVERSATION_HEADER: conversation,
                                              run_turn.FLOOR_HEADER: str(self.router.floor),
                                              FROM_HEADER: f"run:{ident}"})
        except BaseException:
            await driving.release()
            raise
        task = asyncio.get_running_loop().create_task(self._drive(run, driving), name=f"drive {ident}")
        self.sessions.driving[ident] = task
        if runner:
            self.sessions.runner.add(ident)
        task.add_done_callback(lambda _t: self._driven(ident))

    def _driven(self, ident: str) -> None:
        self.sessions.driving.pop(ident, None)
        self.sessions.runner.discard(ident)
        self.nudge()  # the conversation is free: its queue may go on

    async def _drive(self, run: dict[str, Any], driving: Driving) -> None:
        """Hold the lease until *run*'s terminal event (or max_run, or the lease lost)."""
        conversation, ident = run["conversation"], run["id"]
        deadline = time.monotonic() + self.max_run
        try:
            async with driving:
                ended = await self._watch(conversation, ident, driving, deadline)
                if ended is None and driving.holds():
                    await self._time_out(conversation, ident)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.event("run_drive_failed", "warning", run=ident, conversation=conversation,
                      error=f"{type(exc).__name__}: {exc}")

    async def _watch(self, conversation: str, ident: str, driving: Driving,
                     deadline: float) -> dict[str, Any] | None:
        """The run's terminal event as it comes; None at *deadline* or once the
        lease is lost. Every :data:`STATUS_EVERY` s the estate is asked too: a
        run ended there whose end was never told is told (by its status) once
        :data:`END_GRACE` passed (:meth:`tell_untold_end`)."""
        async with runs.follow(self.js, conversation, ident) as follower:
            reading = asyncio.ensure_future(_terminal(follower))
            lost = asyncio.ensure_future(driving.lost.wait())
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    done, _ = await asyncio.wait({reading, lost}, timeout=min(left, STATUS_EVERY),
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if reading in done:
                        return reading.result()
                    if lost in done:
                        log.event("run_driver_lost", "warning", run=ident, why=getattr(driving, "why", None))
                        return None
                    row = (await self.read("run.get", {"id": ident})).get("run")
                    if row is None:
                        await self._tell_end(conversation, ident, row)
                    elif row["status"] in RUN_ENDED:
                        await self.tell_untold_end(conversation, ident, row)
            finally:
                for task in (reading, lost):
                    task.cancel()
                await asyncio.gather(reading, lost, return_exceptions=True)

    async def tell_untold_end(self, conversation: str, ident: str, row: dict[str, Any]) -> bool:
        """Tell the end of *ident* (its estate *row*) on RUNS if nobody did:
        the backstop of whoever waits for the run's terminal event (this
        driver; an SSE stream of the run, :mod:`roles.ingress.api.conversations`).
        True once the run has ended and its end is told, or was told now; False
        while the row says it runs, or its end is younger than :data:`END_GRACE`
        (its turn may still be telling it).

        Why the waiter and not only the turn and its driver (issue 29): the turn
        writes the end in the estate, then tells it; a turn cut off in between
        (its seat lost in the same election that stalls its publishes) tells it
        only when its mail comes back — after a retry delay that doubles with
        each delivery, or the mailbox's ack wait (30 min) when its hand-back
        failed and the seat moved — and its driver, whose lease lapsed in the
        same election, no longer watches, while the session runner takes over
        only runs still running. A stream of that run waited for ever. Told
        under the run's end id, it lands once whoever tells it."""
        if row["status"] not in RUN_ENDED:
            return False
        ended = row.get("ended_at")
        if isinstance(ended, (int, float)) and time.time() - ended < END_GRACE:
            return False
        try:
            latest = await runs.last(self.js, conversation, ident)
        except Exception:
            # Not known (an election): told again, it lands once within the
            # broker's dedupe window, and the publish rides the election out.
            latest = None
        if latest is not None and latest[1].get("type") in runs.TERMINAL:
            return True  # told: its readers get it
        await self._tell_end(conversation, ident, row)
        log.event("run_end_told", "warning", run=ident, conversation=conversation, status=row["status"],
                  by=self.node)
        return True

    async def _tell_end(self, conversation: str, ident: str, row: dict[str, Any] | None) -> None:
        status = row["status"] if row is not None else "failed"
        event: dict[str, Any] = {"type": run_turn.TERMINAL_OF[status]}
        if row is None:
            event["error"] = "the run is gone from the estate"
        elif row.get("error"):
            event["error"] = row["error"]
        await runs.RunEvents(self.js, conversation, ident, ttl=self.event_ttl).publish(event)

    async def _time_out(self, conversation: str, ident: str) -> None:
        why = f"no end within conversations.max_run ({self.max_run:g}s)"
        with contextlib.suppress(Exception):
            await runs.request_cancel(self.js, conversation, ident, ttl=self.event_ttl, by=self.node, why=why)
        try:
            await self.write("run.update", {"id": ident, "status": "failed", "error": why}, f"{ident}:timeout")
        except Refused:
            pass  # it ended meanwhile: that end stands, and is told below
        row = (await self.read("run.get", {"id": ident})).get("run")
        await self._tell_end(conversation, ident, row)

    # ------------------------------------------------------------ stopping, deciding

    async def cancel(self, conversation: str, ident: str, *, by: str) -> dict[str, Any]:
        """Stop *ident*: idempotent, from any node. A queued run ends at once;
        a running one is asked to stop before its next round. Its row."""
        row = (await self.read("run.get", {"id": ident})).get("run")
        if row is None or row["conversation"] != conversation:
            raise Refused({"error": f"no run {ident} in conversation {conversation}", "code": NOT_FOUND})
        if row["status"] in RUN_ENDED:
            return row
        await runs.request_cancel(self.js, conversation, ident, ttl=self.event_ttl, by=by)
        if row["status"] == "queued":
            try:
                await self.write("run.update", {"id": ident, "status": "interrupted", "error": f"cancelled by {by}"},
                                 f"{ident}:cancel")
            except Refused as exc:
                if exc.code != CONFLICT:
                    raise
            row = (await self.read("run.get", {"id": ident})).get("run") or row
            if row["status"] in RUN_ENDED:
                await self._tell_end(conversation, ident, row)
        return row

    async def decide(self, approval: str, decision: str, *, note: str | None, by: str,
                     resume: bool = True) -> dict[str, Any]:
        """Decide *approval*; then the conversation resumes as a new run (the
        session runner starts it). Deciding the same again answers the same;
        a conflicting decision is :class:`Refused` ``conflict``."""
        args: dict[str, Any] = {"id": approval, "decision": decision, "by": by}
        if note:
            args["note"] = note
        result = await self.write("approval.decide", args, f"{approval}:{decision}")
        row = result.get("approval") or {}
        if resume:
            await self._resume(row)
        return row

    async def _resume(self, approval: dict[str, Any]) -> None:
        """The run that resumes a conversation after *approval*'s decision:
        queued once (its id is the approval's), started by the session runner."""
        conversation = approval.get("conversation")
        if not conversation or approval.get("status") != "decided":
            return
        ident = resumption_id(approval["id"])
        asked = (await self.read("run.get", {"id": approval["run"]})).get("run") or {}
        revision = asked.get("revision") or self._revision()  # the pinned one
        try:
            await self.write("run.create", {"id": ident, "conversation": conversation, "strategy": "enqueue",
                                            "on_disconnect": "continue", "revision": revision,
                                            "approval": approval["id"]}, ident)
        except Refused as exc:
            if exc.code != CONFLICT:
                raise
        self.nudge()

    # ------------------------------------------------------------ the session runner

    def nudge(self) -> None:
        """Look for work now (something was queued or freed on this node)."""
        self.sessions.nudged.set()

    async def run_sessions(self) -> None:
        """The session runner: until cancelled (the module doc)."""
        failing: str | None = None  # the last sweep's failure, said once until it changes
        # At a node's start: not before a copy serves (the first sweep would fail).
        await self.router.serving(START_WAIT, lambda: not self.stopping)
        while not self.stopping:
            self.sessions.nudged.clear()
            try:
                await self._sweep()
                if failing is not None:
                    log.event("session_sweep_recovered", was=failing)
                    failing = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the estate or the broker did not answer: next sweep
                error = f"{type(exc).__name__}: {exc}"
                if error != failing:
                    # No copy in service (none came at the start, or all went):
                    # said once, not every sweep.
                    log.event("session_sweep_failed", "warning", error=error)
                    failing = error
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sweep):
                    await self.sessions.nudged.wait()

    @contextlib.contextmanager
    def _runner_slot(self):
        """A place among the session runner's runs, held while a run is being
        started (True), or False when all are taken. Held from the check to
        the run's launch, which keeps it: two starts racing between their
        awaits cannot both take the last place."""
        s = self.sessions
        if len(s.runner) + s.reserved >= s.limit:
            yield False
            return
        s.reserved += 1
        try:
            yield True
        finally:
            s.reserved -= 1

    def draining(self) -> dict[str, Any] | None:
        """This node's drain, as its presence says it (None: it serves)."""
        holders = self.drivers.holders
        mine = holders.get(f"node.{self.node}") if holders is not None else None
        return drain.draining(mine.info) if mine is not None else None

    async def _sweep(self) -> None:
        await self._expire()
        await self._resume_decided()
        if (draining := self.draining()) is not None:
            await self._hand_over(draining)
            return
        await self._take_orphans()
        await self._start_queued()

    async def _hand_over(self, draining: dict[str, Any]) -> None:
        """Drained: past the deadline, let go of every run driven here (its
        lease released as its driving task ends; the run goes on, and a
        session runner elsewhere drives it on)."""
        if not self.sessions.driving or not drain.past_deadline({"draining": draining}):
            return
        tasks = list(self.sessions.driving.values())
        log.event("runs_handed_over", runs=sorted(self.sessions.driving))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _expire(self) -> None:
        """Deny the pending approvals past their time (``expired``)."""
        now = time.time()
        page = await self.read("approval.list", {"status": "pending", "limit": SWEEP_PAGE})
        for approval in page.get("approvals") or []:
            if approval["expires_at"] <= now:
                try:
                    row = (await self.write("approval.decide", {"id": approval["id"], "decision": "deny",
                                                                "note": EXPIRED, "by": "crewlet"},
                                            f"{approval['id']}:deny"))["approval"]
                except Refused:
                    continue  # decided meanwhile
                log.event("approval_expired", approval=approval["id"], conversation=approval["conversation"])
                await self._resume(row)

    async def _resume_decided(self) -> None:
        """A conversation awaiting an approval that was decided, with no run
        resuming it yet (its decider died between the two writes)."""
        page = await self.read("conversation.list", {"status": "awaiting_approval", "limit": SWEEP_PAGE})
        for conv in page.get("conversations") or []:
            if not conv.get("approval"):
                continue
            approval = (await self.read("approval.get", {"id": conv["approval"]})).get("approval")
            # Decided a moment ago: its decider is about to start the run that
            # follows (its resumption, or an interrupting run).
            if approval is not None and approval["status"] == "decided" \
                    and time.time() - (approval.get("decided_at") or 0) > RESUME_GRACE:
                await self._resume(approval)

    async def _take_orphans(self) -> None:
        """Runs ``running`` whose conversation has no driver: take them over."""
        page = await self.read("run.list", {"status": "running", "limit": SWEEP_PAGE})
        for run in page.get("runs") or []:
            if run["id"] not in self.sessions.driving and not await self._take(run, taken_over=True):
                return

    async def _start_queued(self) -> None:
        """The oldest queued run of each free conversation."""
        page = await self.read("run.list", {"status": "queued", "limit": SWEEP_PAGE})
        seen: set[str] = set()
        for run in page.get("runs") or []:
            if run["conversation"] in seen:
                continue
            seen.add(run["conversation"])  # only its oldest: the queue keeps its order
            if not await self._take(run, taken_over=False):
                return

    async def _take(self, run: dict[str, Any], *, taken_over: bool) -> bool:
        """Drive *run* (a queued one, or a running one whose driver died) if
        its conversation's lease is free; False when the runner has no room."""
        with self._runner_slot() as room:
            if not room:
                return False
            if self.drivers.holders is not None and self.drivers.holders.get(
                    lease_key(run["conversation"])) is not None:
                return True  # driven (as far as this node's watch knows)
            driving = await self._try_lease(run)
            if driving is None:
                return True
            try:
                # Under this lease's token: another node's start of the same run
                # (from a copy that had not seen this one) is another op, refused
                # as the conflict it is rather than answered as ours.
                row = (await self.write("run.update", {"id": run["id"], "status": "running", "node": self.node},
                                        f"{run['id']}:running:{driving.token}"))["run"]
                full = (await self.read("run.get", {"id": run["id"]})).get("run") or row
            except Refused as exc:
                await driving.release()  # it started or ended meanwhile
                if exc.code not in (BUSY, PENDING_APPROVAL, CONFLICT):
                    log.event("run_start_refused", "warning", run=run["id"], error=str(exc))
                return True
            except BaseException:
                await driving.release()
                raise
            if taken_over:
                log.event("run_taken_over", run=run["id"], conversation=run["conversation"], was=run.get("node"))
            await self._launch({**full, **row, "input": full.get("input")}, driving, taken_over=taken_over,
                               runner=True)
        return True

    async def _try_lease(self, run: dict[str, Any]) -> Driving | None:
        try:
            return await self.drivers.acquire(run["conversation"], run["id"], wait=0)
        except ConversationBusy:
            return None
        except LeaseError as exc:
            log.event("session_lease_failed", "warning", run=run["id"], error=str(exc))
            return None

    def background(self, coro) -> asyncio.Task:
        """Run *coro* as this process's (a request's client went away), said
        if it fails; its task."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.event("conversation_background_failed", "warning",
                      error=f"{type(task.exception()).__name__}: {task.exception()}")

    async def close(self) -> None:
        """Stop driving (the leases are released; the runs go on where their
        seats are held, and another node's session runner drives them on)."""
        self.stopping = True
        tasks = [*self.sessions.driving.values(), *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _terminal(follower: runs.Follower) -> dict[str, Any]:
    async for _seq, event in follower:
        if event["type"] in runs.TERMINAL:
            return event
    raise runs.RunsError("the run's events ended without a terminal one")
