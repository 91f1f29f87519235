"""A conversation's run, worked as a turn where its seat is held (DESIGN §11).

The run's driver puts the run in the seat's mailbox as a mail like any
other — its trigger ``run=<run id>`` (:func:`trigger`), its headers naming
the run and the conversation (:data:`RUN_HEADER`, :data:`CONVERSATION_HEADER`)
— so turns of one seat stay one at a time, and the ledger, the fence, the
in-flight record and the hand-backs of :mod:`roles.seats.turns` hold for it
as for mail. What this module adds is what a run is besides a mail:

* **the history** the model reads is the conversation's messages (the estate),
  not the mail's text; the run's input is written as its first message;
* **every message is kept as it happens**, as a ``conversation.message`` op
  under the seat's fence, with an id made of the run, the round and the call
  (``<run>.r<round>.a``, ``<run>.r<round>.t<index>``): a turn redone after a
  crash (or by the seat's next holder) reads what its predecessor kept and
  goes on from there. A round whose model message was kept is not asked
  again; a call whose result was kept is not run again; the calls of the
  last round without a result run first, under their own round's number, so
  a tool keying its side effect on the call does it once;
* **its progress goes to ``RUNS``** (:class:`~crewlet.conversations.sink.RunSink`),
  then exactly one terminal event, under the run's one end id (``<run>:end``);
* **a request to stop** (:func:`crewlet.conversations.runs.request_cancel`) is
  read when the turn starts and before each round: the run ends
  ``interrupted`` before asking the model again;
* **a call that needs a person** (the company's ``approval:``,
  :meth:`crewlet.company.model.Seat.needs_approval`) ends the run: the
  approval is recorded (``approval.request``: the tool, its exact arguments,
  the run), ``approval.requested`` is told, and the run completes with the
  conversation ``awaiting_approval``. The decision starts a new run (its
  ``approval``), which runs the recorded call exactly as recorded when it was
  approved — the model is not asked again — or tells the model it was denied.

**The revision.** A run pins the company revision in force when it started
(a resumption, the one of the run that asked for the approval): the seat's
persona, provider and approval rules are that revision's
(:meth:`roles.seats.turns.TurnEngine.pinned`, read from the control plane),
its tools the ones its servers offer now (they run with the seat's lease).

The run's end, in order: its status in the estate (``run.update``, or the
approval request), then the terminal event; the seats role then writes the
ledger and acks. A turn killed between the two finds the run ended when the
mail comes back (the ledger skips it, or the run's status does) and tells the
end again (:meth:`RunTurn.end_again`), landing once under the end id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from typing import Any

from crewlet import log, outbox, redaction
from crewlet.agent.providers import ProviderError
from crewlet.agent.turn import ASK_KEPT, AwaitingApproval, Fenced, Hooks, TurnRecord, run_rounds
from crewlet.agent.types import Message, ToolCall
from crewlet.company.model import Seat
from crewlet.conversations import runs
from crewlet.conversations.sink import RunSink
from crewlet.estate.apply import CONFLICT, NOT_FOUND
from crewlet.estate.ops import LIST_MAX, RUN_ENDED, make_op, op_id

RUN_HEADER = "Crewlet-Run"
CONVERSATION_HEADER = "Crewlet-Conversation"
# The estate log seq of the driver's write that started the run: the turn
# reads no copy that has not applied it (another node's copy may lag).
FLOOR_HEADER = "Crewlet-Floor"
TRIGGER_PREFIX = "run="
# Seconds one estate read or write of a run's turn waits (the router asks the
# data nodes in turn; a write may wait out a stream leader election).
ESTATE_WAIT = 30.0
# Where each message of a run is kept: its id says the run, the round, and
# for a tool's result the call's place in the round.
_MESSAGE_ID = re.compile(r"^(?P<run>.+)\.r(?P<round>\d+)\.(?:a|t(?P<index>\d+))$")
# What the model reads of a call it made that was never run: a new message
# came before it was decided (an interrupt denies the pending approval).
NOT_RUN = "This call was not run: a person sent a new message instead of approving it."
TERMINAL_OF = {"completed": runs.COMPLETED, "failed": runs.FAILED, "interrupted": runs.INTERRUPTED}


def trigger(run: str) -> str:
    """The mail trigger of *run* (the ledger's key: a run is worked once)."""
    return TRIGGER_PREFIX + run


def input_id(run: str) -> str:
    return f"{run}.in"


def said_id(run: str, round_no: int) -> str:
    return f"{run}.r{round_no}.a"


def result_id(run: str, round_no: int, index: int) -> str:
    return f"{run}.r{round_no}.t{index}"


def approval_id(run: str, round_no: int, index: int) -> str:
    return f"{run}.p{round_no}.{index}"


class RunGone(Exception):
    """The run is not this turn's to work any more: it ended (interrupted,
    timed out by its driver), was rolled back, or does not exist."""


class Interrupted(Exception):
    """Somebody asked the run to stop."""


class RunTurnError(Exception):
    """The estate refused one of the run's writes for a reason that may pass."""


class _Interruptible:
    """A provider whose call a request to stop the run cuts short: the model
    is not waited for (nothing it says has effects until its calls run, and
    those come after the call), the text it streamed so far stays shown."""

    def __init__(self, provider, turn: "RunTurn"):
        self.provider, self.turn = provider, turn

    async def complete(self, *args, **kw):
        asking = asyncio.ensure_future(self.provider.complete(*args, **kw))
        stop = asyncio.ensure_future(self.turn._stop.wait())
        try:
            await asyncio.wait({asking, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not asking.done():
                asking.cancel()
                await asyncio.gather(asking, return_exceptions=True)
        if asking.cancelled():
            raise Interrupted(f"{self.turn._stop_why} while the model answered")
        return asking.result()


def _left_calls(rows: list[dict[str, Any]]) -> tuple[int | None, list[tuple[int, dict[str, Any]]]]:
    """The place of the last model message in *rows* that made calls (None:
    the last made none), and its calls with no result after it, by index."""
    last = next((i for i in range(len(rows) - 1, -1, -1) if rows[i]["role"] == "assistant"), None)
    if last is None or not rows[last].get("calls"):
        return None, []
    answered = {row.get("call_id") for row in rows[last + 1:] if row["role"] == "tool"}
    return last, [(i, c) for i, c in enumerate(rows[last]["calls"]) if c["id"] not in answered]


def _message(row: dict[str, Any]) -> Message:
    calls = tuple(ToolCall(c["id"], c["name"], c.get("args") or {}) for c in row.get("calls") or ())
    return Message(row["role"], row.get("text") or "", calls=calls, call_id=row.get("call_id"),
                   name=row.get("name"), error=bool(row.get("error")))


class RunTurn(Hooks):
    """One run, worked by the seat's holder: see the module doc.

    *redo*: the mail was delivered before (a crash, a hand-back): the model's
    text of the round it asks first may have been shown in part already.
    """

    def __init__(self, *, estate, js, nc, node: str, seat: Seat, token: int, conversation: str, run: str,
                 event_ttl: float, approval_ttl: float, redo: bool = False, floor: int = 0, pin=None,
                 notices_to: list[str] | tuple[str, ...] = (), brief=None):
        self.estate = estate
        # await brief(seat, counterparty, as_of) -> what the persona is given
        # besides: the skills as of the run's pin, the recent episodes (TurnEngine.brief).
        self.brief = brief
        self.js = js
        self.nc = nc
        self.node = node
        self.seat = seat
        self.token = token
        self.conversation = conversation
        self.run = run
        self.approval_ttl = approval_ttl
        # Who is told by email that a call waits for a decision: the people who may
        # decide the seat's approvals, and the operators (Tier A smtp.notices_to).
        self.notices_to = list(notices_to)
        self.floor = floor
        # await pin(rev, seat) -> (seat, provider) as the run's pinned company
        # revision has them, or None: the revision in force (the seats role's).
        self.pin = pin
        self.events = runs.RunEvents(js, conversation, run, ttl=event_ttl)
        self.sink = RunSink(self.events, redo=redo)
        self.approval: dict[str, Any] | None = None  # the decided approval this run resumes
        # Set once somebody asked the run to stop (why: ``_stop_why``): heard on
        # the cancel subject as it is published, or found stored when the turn starts.
        self._stop = asyncio.Event()
        self._stop_why: str | None = None

    # ------------------------------------------------------------ the turn

    async def work(self, record: TurnRecord, *, provider, registry, services, fence, deadline: float) -> None:
        """Work the run into *record* (``done``, ``interrupted`` or ``failed``:
        settle the mail; the run ended and said so). Raises
        :class:`~crewlet.agent.turn.Fenced`, a retryable
        :class:`~crewlet.agent.providers.ProviderError` (hand the mail back:
        the run goes on when it comes again), :class:`RunTurnError` and the
        estate router's errors (the same)."""
        self.estate.raise_floor(self.floor)
        sub = await self.nc.subscribe(runs.cancel_subject(self.conversation, self.run), cb=self._heard)
        try:
            run = await self._start()
            if self.pin is not None:
                pinned = await self.pin(run["revision"], self.seat.name)
                if pinned is not None:
                    self.seat, provider = pinned
            history, pending = await self._history(run)
            # The run's skills are those of the log as of its start, on any node.
            pin = run.get("skills") or run.get("started_seq") or run.get("seq")
            record.skills_seq = pin if isinstance(pin, int) else None
            record.ask = redaction.scrub((run.get("input") or "")[:ASK_KEPT])
            persona = self.seat.persona
            if self.brief is not None:
                persona += await self.brief(self.seat.name, record.counterparty, record.skills_seq)
            await run_rounds(record, history=history, persona=persona,
                             provider=_Interruptible(provider, self), registry=registry, services=services,
                             fence=fence, deadline=deadline, sink=self.sink, hooks=self, pending=pending)
        except AwaitingApproval as wait:
            try:
                await self._ask(wait)
            except RunGone:
                await self.end_again()
            record.outcome = "done"
            return
        except Interrupted as stop:
            await self._end("interrupted", str(stop))
            record.outcome, record.error = "interrupted", str(stop)
            return
        except RunGone as gone:
            await self.end_again()
            record.outcome, record.error = "done", f"nothing to do: {gone}"
            return
        except ProviderError as exc:
            if exc.retryable:
                raise
            await self._end("failed", f"the model's provider refused: {exc}")
            record.outcome, record.error = "failed", str(exc)
            return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if record.outcome == "done":
            await self._end("completed", None, reply=record.reply)
        else:  # no final reply within the rounds a turn may take
            await self._end("failed", record.error)

    async def _heard(self, msg) -> None:
        try:
            asked = json.loads(msg.data or b"{}")
        except ValueError:
            asked = {}
        self._stopped(asked if isinstance(asked, dict) else {})

    def _stopped(self, asked: dict[str, Any]) -> None:
        if not self._stop.is_set():
            self._stop_why = str(asked.get("why") or "cancelled")
            self._stop.set()

    async def end_again(self) -> None:
        """Tell the end of a run that ended (by its status in the estate): the
        terminal event its ender may not have lived to publish. Lands once."""
        run = (await self.estate.read("run.get", {"id": self.run}, timeout=ESTATE_WAIT) or {}).get("run")
        if run is None or run["status"] not in RUN_ENDED:
            return
        event: dict[str, Any] = {"type": TERMINAL_OF[run["status"]]}
        if run.get("error"):
            event["error"] = run["error"]
        await self.sink.close()
        await self.events.publish(event)

    # ------------------------------------------------------------ the hooks

    async def before_round(self, round_no: int) -> None:
        if self._stop.is_set():
            raise Interrupted(f"{self._stop_why} before round {round_no}")

    async def message(self, message: Message, round_no: int, index: int | None) -> None:
        args: dict[str, Any] = {"conversation": self.conversation, "run": self.run, "role": message.role,
                                "text": message.text}
        if message.role == "assistant":
            args["id"] = said_id(self.run, round_no)
            if message.calls:
                args["calls"] = [{"id": c.id, "name": c.name, "args": c.args} for c in message.calls]
        else:
            args.update(id=result_id(self.run, round_no, index or 0), call_id=message.call_id,
                        name=message.name, error=message.error)
        await self._write("conversation.message", args, args["id"])

    def decision(self, call: ToolCall) -> tuple[str, str | None] | None:
        approval = self.approval
        if approval is not None and approval.get("call_id") == call.id and approval["status"] == "decided":
            return approval["decision"], approval.get("note")
        return None

    def needs_approval(self, call: ToolCall) -> bool:
        return self.seat.needs_approval(call.name)

    # ------------------------------------------------------------ steps

    async def _start(self) -> dict[str, Any]:
        """The run, if it is this turn's to work (else :class:`RunGone`)."""
        run = (await self.estate.read("run.get", {"id": self.run}, timeout=ESTATE_WAIT) or {}).get("run")
        if run is None or run["conversation"] != self.conversation:
            raise RunGone(f"no run {self.run} in conversation {self.conversation}")
        if run["status"] != "running" or run.get("rolled_back"):
            raise RunGone(f"run {self.run} is {run['status']}")
        if run.get("approval"):
            self.approval = (await self.estate.read("approval.get", {"id": run["approval"]},
                                                    timeout=ESTATE_WAIT) or {}).get("approval")
        asked = await runs.cancel_requested(self.js, self.conversation, self.run)
        if asked is not None:
            self._stopped(asked)
        await self.before_round(1)
        return run

    async def _history(self, run: dict[str, Any]) -> tuple[list[Message], tuple[int, list] | None]:
        """The conversation's messages, this run's input kept first if it was
        not; and where the rounds go on: ``(round, [(index, call)])`` of the
        last model message's calls that have no result yet."""
        rows: list[dict[str, Any]] = []
        args: dict[str, Any] = {"conversation": self.conversation, "limit": LIST_MAX}
        while True:
            page = await self.estate.read("conversation.messages", args, timeout=ESTATE_WAIT) or {}
            rows += page.get("messages") or []
            if not page.get("after"):
                break
            args["after"] = page["after"]
        mine = [row for row in rows if row.get("run") == self.run]
        if mine:
            # An attempt before this one got as far as keeping the input: it may
            # have shown part of the round asked first here.
            self.sink.redo()
        if not mine and run.get("input"):
            # A new message after calls an earlier run left without a result (it
            # asked for an approval, which a new run interrupting it denied):
            # each is answered first as not run — a model must read a result
            # for every call it made — then the message.
            rows += await self._answer_left_calls(rows)
            await self._write("conversation.message", {
                "conversation": self.conversation, "run": self.run, "id": input_id(self.run),
                "role": "user", "text": run["input"]}, input_id(self.run))
            rows.append({"role": "user", "text": run["input"], "run": self.run, "id": input_id(self.run)})
        history = [_message(row) for row in rows]
        # The rounds this run asked already (its kept model messages).
        asked = [int(m["round"]) for row in mine if (m := _MESSAGE_ID.match(row["id"])) and m["index"] is None]
        done_round = max(asked, default=0)
        last, left = _left_calls(rows)
        if last is None:
            return history, (done_round, [])
        todo = [(i, ToolCall(c["id"], c["name"], c.get("args") or {})) for i, c in left]
        # Calls of this run's own round keep their round's number (their call
        # keys); those of the run that asked for an approval are this run's round 0.
        own = _MESSAGE_ID.match(rows[last]["id"])
        round_no = int(own["round"]) if own and own["run"] == self.run else 0
        if not todo:
            return history, (max(done_round, round_no), [])
        return history, (round_no, todo)

    async def _answer_left_calls(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Tool messages for the calls of the last model message in *rows* that
        have none: never run (denied, or overtaken by a new message). Kept."""
        kept = []
        for index, call in _left_calls(rows)[1]:
            row = {"conversation": self.conversation, "run": self.run, "id": result_id(self.run, 0, index),
                   "role": "tool", "text": NOT_RUN, "call_id": call["id"], "name": call["name"], "error": True}
            await self._write("conversation.message", row, row["id"])
            kept.append(row)
        return kept

    async def _ask(self, wait: AwaitingApproval) -> None:
        """Record the approval *wait* is for; the run ends, the conversation awaits it."""
        call = wait.call
        ident = approval_id(self.run, wait.round_no, wait.index)
        await self._write("approval.request", {
            "id": ident, "conversation": self.conversation, "run": self.run, "seat": self.seat.name,
            "tool": call.name, "call_id": call.id, "args": call.args,
            "expires_at": time.time() + self.approval_ttl}, ident)
        await self.sink.close()
        await self.events.publish({"type": runs.APPROVAL_REQUESTED, "approval": ident, "tool": call.name,
                                   "call": call.id, "args": call.args},
                                  id=f"{self.run}:approval:{ident}")
        await self.events.publish({"type": runs.COMPLETED, "awaiting_approval": ident})
        log.event("run_awaits_approval", seat=self.seat.name, run=self.run, approval=ident, tool=call.name)
        # Whoever may decide is told (its id is the approval's: a redone turn's
        # is the same notice, sent once); what it shows was scrubbed of secrets.
        args = json.dumps(call.args, ensure_ascii=False, indent=2, sort_keys=True)
        await outbox.notice(
            self.js, self.notices_to, f"notice.approval.{ident}",
            f"{self.seat.name} waits for a decision: {call.name}",
            f"Seat {self.seat.name} asks to call {call.name} in conversation {self.conversation} "
            f"(run {self.run}) with:\n\n{args}\n\nApprove or deny it on the dashboard's approvals, or "
            f"POST /v1/approvals/{ident} {{\"decision\": \"approve\" | \"deny\", \"note\": \"...\"}}. "
            f"Undecided, it is denied as expired at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(time.time() + self.approval_ttl))}.")

    async def _end(self, status: str, error: str | None, reply: str | None = None) -> None:
        args: dict[str, Any] = {"id": self.run, "status": status, "node": self.node}
        if error:
            args["error"] = error[:2000]
        try:
            await self._write("run.update", args, f"{self.run}:{status}")
        except RunGone:
            await self.end_again()  # ended otherwise meanwhile: that end stands
            return
        event: dict[str, Any] = {"type": TERMINAL_OF[status]}
        if error:
            event["error"] = error
        if reply is not None:
            event["reply"] = reply
        await self.sink.close()
        await self.events.publish(event)

    async def _write(self, kind: str, args: dict[str, Any], part: str) -> dict[str, Any]:
        """Write one op of the run under the seat's fence; its outcome."""
        op = make_op(kind, args, node=self.node, seat=self.seat.name, token=self.token,
                     id=op_id(self.seat.name, kind, part))
        outcome = await self.estate.write(op, timeout=ESTATE_WAIT)
        if outcome.get("ok"):
            return outcome
        why = str(outcome.get("error") or "refused")
        code = outcome.get("code")
        if code is None:  # the fence: a newer holder of the seat writes from here
            raise Fenced(f"the estate refused {kind} of run {self.run}: {why}")
        if code in (CONFLICT, NOT_FOUND):
            raise RunGone(why)
        raise RunTurnError(f"{kind} of run {self.run}: {why}")
