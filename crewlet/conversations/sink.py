"""A turn's progress as a run's events: :class:`RunSink`, a :class:`~crewlet.agent.types.Sink`.

Give it to :func:`crewlet.agent.turn.run_rounds` (``sink=``) and the turn's
progress goes to ``RUNS`` (:mod:`crewlet.conversations.runs`) as it happens:

* the model's text → ``message.delta`` ``{round, text}``. ``round`` is the
  provider call of the turn, from 1: text after a tool call is the next
  round's (the model answering what the tools said).
* a tool call as it starts → ``tool.call`` ``{round, call, name, args}``;
  its result as it ends → ``tool.result`` ``{round, call, name, result,
  error}``.
* a **restart** (the provider's attempt failed after streaming some text,
  and that text is void: :class:`~crewlet.agent.types.Sink`) → the next
  ``message.delta`` of the round carries ``restart: true``: a client drops
  what it showed of this round, then appends the event's text (which may
  be empty: a restart followed by no text before the next tool call, or
  the end, is told as an empty delta). Text that had not been published yet
  is simply dropped, and a round none of whose text went out needs no
  restart at all: most restarts never reach a client.

**Deltas are coalesced**: text is held up to :data:`DELTA_WINDOW` seconds
after the first piece of a batch, or until :data:`DELTA_MAX` characters, and
published as one event, so a fast model (hundreds of tokens a second) costs
at most ~20 publishes a second per run rather than one per token, while a
person still sees it come as it comes. A tool call, a tool result and
:meth:`RunSink.flush` publish what is held first, so events keep the order
they happened in. Publishing happens in the background between pieces: a
provider's stream is not slowed by the broker. An event the broker would not
store fails the next call of the sink (the turn ends, as a sink's error
does).

The sink does not end the run: whoever does (the turn's code, the driver)
calls :meth:`RunSink.close` — which publishes what is held — and then
publishes the terminal event through the same :class:`RunEvents`.
"""

from __future__ import annotations

import asyncio

from crewlet.agent.types import Sink, ToolCall
from crewlet.conversations.runs import DELTA, TOOL_CALL, TOOL_RESULT, RunEvents, RunsError

# Seconds text waits for more before it is published: 20 updates a second
# reads as live, and keeps a run's publishes well under what one JetStream
# publisher does (~2,500/s sequential, DESIGN §4) across many runs.
DELTA_WINDOW = 0.05
# Characters of text one message.delta carries at most: more is published at
# once, in events of this size (an event must fit runs.EVENT_MAX bytes even
# when every character takes 6 as JSON).
DELTA_MAX = 4096


class RunSink(Sink):
    """One turn's progress, published as *events*' run events.

    Invariants: the held text (``_held``) is the current round's only (every
    round change is preceded by a flush, at the tool call); ``_shown`` says
    some text of this round left the buffer (published or being published),
    so a restart must be told; ``_restart`` is a restart not told yet.
    """

    def __init__(self, events: RunEvents, *, window: float = DELTA_WINDOW, max_chars: int = DELTA_MAX,
                 redo: bool = False):
        self.events = events
        # A turn done again (picked up after a crash): the first round it asks
        # may have been shown in part by the attempt that died, so its first
        # delta says restart.
        self._redo = redo
        self.window = window
        self.max_chars = max_chars
        self.round = 1
        self._held: list[str] = []
        self._held_chars = 0
        self._shown = False
        self._restart = False
        self._tools_since = False  # a tool ran since the last text: the next text is a new round
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------ the Sink

    def redo(self) -> None:
        """The turn is done again: the next round's first delta says restart."""
        self._redo = True

    async def begin_round(self, round_no: int) -> None:
        await self.flush()
        self.round = round_no
        self._tools_since = False
        self._shown = False
        if self._redo:
            self._redo = False
            self._restart = True

    async def delta(self, text: str) -> None:
        self._raise_failure()
        if self._tools_since:
            self.round += 1
            self._tools_since = False
            self._shown = False
        if not text:
            return
        self._held.append(text)
        self._held_chars += len(text)
        if self._held_chars >= self.max_chars:
            await self._flush()
        elif self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._flush_later())

    async def restart(self) -> None:
        self._raise_failure()
        self._held.clear()
        self._held_chars = 0
        if self._shown:
            self._restart = True

    async def tool_call(self, call: ToolCall) -> None:
        await self.flush()
        self._tools_since = True
        await self.events.publish({"type": TOOL_CALL, "round": self.round, "call": call.id,
                                   "name": call.name, "args": call.args})

    async def tool_result(self, call: ToolCall, result: str, error: bool) -> None:
        await self.flush()
        self._tools_since = True
        await self.events.publish({"type": TOOL_RESULT, "round": self.round, "call": call.id,
                                   "name": call.name, "result": result, "error": bool(error)})

    # ------------------------------------------------------------ flushing

    async def flush(self) -> None:
        """Publish the text held (and a restart not told yet) now."""
        self._raise_failure()
        await self._flush()

    async def close(self) -> None:
        """Publish what is held and stop the timer: before the run's
        terminal (or ``approval.requested``) event."""
        await self.flush()
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            # Asleep, or about to find nothing held: never mid-publish, which
            # happens under the lock the flush above just held.
            timer.cancel()
            await asyncio.gather(timer, return_exceptions=True)

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(self.window)
            await self._flush()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._error = exc  # told at the sink's next call

    async def _flush(self) -> None:
        async with self._lock:
            if not self._held and not self._restart:
                return
            text = "".join(self._held)
            self._held.clear()
            self._held_chars = 0
            restart, self._restart = self._restart, False
            if text:
                # Before the publish: a restart arriving meanwhile voids it too.
                self._shown = True
            for n, start in enumerate(range(0, max(len(text), 1), self.max_chars)):
                event = {"type": DELTA, "round": self.round, "text": text[start:start + self.max_chars]}
                if restart and n == 0:
                    event["restart"] = True
                await self.events.publish(event)

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise RunsError(f"publishing run {self.events.run}'s text: {self._error}") from self._error
