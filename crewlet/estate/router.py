"""Where a request to the estate goes: the router (reference, "How a request
reaches the estate"; DESIGN §6).

Every role of every node reaches the estate through one :class:`Router`,
with data or without, so a seat's tools and the operator's surfaces behave
the same on either kind of node.

Who is asked, in order
----------------------
1. **This node's copy**, when the node is a data node (the router was given
   its :class:`~crewlet.estate.local.LocalCopy`) and the copy is in service.
   Nobody else is asked unless it answers ``out_of_service`` or ``behind``,
   does not answer, or answers ``unvouched`` for an op that may move on.
2. **The data nodes** the fleet's presence names (:mod:`crewlet.estate.view`),
   in the order :func:`order` gives: the node that last answered this
   router; then an order that spreads askers over the data nodes (each
   asker ranks the nodes by a hash of its own id and theirs, so two askers
   seldom start at the same node, and one asker keeps its order); a node
   that went silent in the last :data:`SILENT_FOR` seconds, a lagging node,
   and a node whose last record is behind the caller's floor are asked after
   the others. A node out of service is passed over without being asked
   and recorded as such.

Each node gets up to :data:`READ_WAIT` for a read or search and
:data:`WRITE_WAIT` for a write, never past the caller's ``timeout``. The
request tells the applier a slightly shorter wait (:func:`applier_wait`), so
that its own answer ("behind", "unvouched") arrives before the router stops
listening.

What may be repeated
--------------------
A node that ran nothing (``out_of_service``, ``behind``, nobody listening on
its subject) is passed over whatever the op. Once a node **may have run** a
write — it did not answer within its wait, or answered ``unvouched`` (its
ledger cannot say whether the op landed) — the op's own retry rule decides
(:data:`crewlet.estate.ops.KINDS`):

``move_on``  ask the next node under the same op id (every applier keeps
             each op id's outcome, so the op lands once); if no node vouches
             for an outcome, :class:`OutcomeUnknown` with every node's answer;
``once``     never send it again: :class:`OutcomeUnknown` at once.

Nobody answering is :class:`NobodyAnswered`, whose message names what each
data node said — never an empty answer, which would say the company holds
none of what was asked for. A search is the one exception that does not
raise: :meth:`Router.search` answers ``searched=False`` with no hits, which
every surface renders as "could not be searched" rather than "nothing matched".

A search split between data nodes
---------------------------------
The knowledge index has :data:`SHARDS` (64) search shards, each page in one
(a hash of its path, :func:`crewlet.estate.search.shard_of`). While the
corpus is small (under :data:`SPLIT_AT` pages, as the last search answer
said; unknown before the first) or only one data node is live, a search
goes to one copy, whole, as any read does: coverage 64 of 64. Above it,
:meth:`Router.search` splits the 64 shards evenly between the live data
nodes — in service, not silent in the last :data:`SILENT_FOR` seconds, not
lagging; sorted by id; this node's own copy for its share when it has one —
asks them all at once, each with the read wait, and merges their hits by
score (bm25 over the whole copy on every node, so the scores compare). A
node that answers at once that it cannot (out of service, behind, nobody
listening) has its range asked again of the next node that answered, while
the wait allows; a node that does not answer within the wait costs the
result its range, not the search: the answer's ``coverage`` says how many
shards were searched, of 64, and which nodes' shards are missing. Nodes
without the data role are never in the view, so never counted.

Who asks
--------
Every request names its origin — the broker user this process connected
as, :attr:`Router.origin` (:mod:`crewlet.estate.origins`) — and this node:
over NATS in its subject (``estate.req.<data node>.<origin>.<this node>``,
which that user alone may publish on), to this node's own copy in the
request. An applier answers a write the origin does not make with
``bad_request`` (:class:`BadRequest`; every node would say the same, so
nobody else is asked).

Straight to the log
-------------------
What an origin publishes to the log itself — the seats' fences and turn
records (:data:`crewlet.estate.origins.LOG_KINDS`) — goes through
:meth:`Router.to_log`, which chooses the way each time:

* an origin with no subject of its own (the operator: crewletd, or any role
  on a broker that is not the node's own) publishes on ``estate.ops``;
* the seats publish on their node's subject, ``estate.ops.seats.<node>``,
  while every live data node's presence says a protocol whose applier reads
  it (:func:`crewlet.estate.log.reads_seats`);
* otherwise — an older data node is live, or the fleet's presence is not
  read yet — the op is asked for like any write (:meth:`Router.write`): an
  applier of this version checks it and publishes it on ``estate.ops``,
  which an older applier reads too. A change of way is said once
  (``estate_seats_log_way``).

On a data node whose copy is in service, :meth:`Router.write` takes the same
road for a write its origin may publish itself — the seats' tools' and
conversation turns' writes (:data:`crewlet.estate.origins.SEAT_WRITES`, once
every live data node applies them there: :func:`crewlet.estate.log.reads_writes`),
and every write of the operator, on ``estate.ops``: it publishes the op
(one try), waits for this node's copy to apply its seq, and reads the
outcome the copy keeps under its id — no request to the applier, whose
check the applying copy makes anyway (an entry passed over for its origin
keeps no outcome: its writer is told ``wrong_origin``). An outcome already
kept is answered without publishing. A publish that stored nothing, or a
``move_on`` op the copy did not apply within the wait, is asked for as
below, under the same id (the floor names its seq when it is in the log);
a ``once`` op that may be in the log is :class:`OutcomeUnknown`.

The floor
---------
:attr:`Router.floor` is the highest seq of this router's own writes (and of
the node's, when it is given the node's shared floor; a refused write counts
too: it is in the log like any other); every request carries it, so
whichever node answers has applied them, or says it is behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NoReturn

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from crewlet import log
from crewlet.bus import JETSTREAM_TIMEOUT
from crewlet.estate import log as estate_log
from crewlet.estate import origins, wire
from crewlet.estate.local import ApplierSilent
from crewlet.estate.ops import Op, check_query
from crewlet.estate.view import EstateView, NodeState

# Per data node (DESIGN §4's numbers): a read waits up to ten seconds on one
# node before the next is asked, a write up to a minute.
READ_WAIT = wire.READ_WAIT      # 10 s
WRITE_WAIT = wire.WRITE_WAIT    # 60 s
# A node that did not answer within its wait is asked last for this long.
SILENT_FOR = 30.0
# How often :meth:`Router.serving` looks again for a copy in service.
SERVING_POLL = 0.2
# How long a role's first reads at a node's start wait for a copy in service
# (the node's own applier starts beside the role) before trying anyway.
START_WAIT = 30.0
# The applier is told to answer this much before the router stops listening
# (a fifth of the wait, at most half a second): "behind" and "unvouched" are
# answers worth having, and they travel back.
MARGIN_SHARE = 0.2
MARGIN_MAX = 0.5
# How long a first request waits for the view's first listing of the fleet.
VIEW_READY_WAIT = 5.0
# Less time than this left before the caller's deadline: a node is not asked
# (no answer could come back in it).
MIN_WAIT = 0.01
# One publish of a straight write waits this long for the log's acknowledgement
# before the op is asked for instead (under the same id).
PUBLISH_TIMEOUT = JETSTREAM_TIMEOUT
# The knowledge index's search shards, and the corpus size (pages) from which
# a search is split between the live data nodes (module docstring).
SHARDS = wire.SEARCH_SHARDS
SPLIT_AT = 10_000


class EstateError(Exception):
    """The estate could not give an answer (the subclasses say which way)."""


class BadRequest(EstateError):
    """A data node refused the request itself (not the op: the request)."""


class NobodyAnswered(EstateError):
    """No data node could answer; :attr:`answers` says what each said."""

    def __init__(self, answers: dict[str, str]):
        self.answers = dict(answers)
        super().__init__("no data node answered: " + describe(self.answers))


class OutcomeUnknown(EstateError):
    """A write may have landed and no data node vouched for its outcome."""

    def __init__(self, op_id: str, answers: dict[str, str]):
        self.op_id = op_id
        self.answers = dict(answers)
        super().__init__(f"the outcome of op {op_id} is unknown: " + describe(self.answers))


def describe(answers: dict[str, str]) -> str:
    """``node b: no answer within 10s; node c: out of service: applier stopped``."""
    if not answers:
        return "the fleet's presence names no data node"
    return "; ".join(f"node {node}: {why}" for node, why in answers.items())


def coverage(searched: int, missing: Iterable[str] = ()) -> dict[str, Any]:
    """``{"searched": n, "of": 64, "missing": [node, ...]}``."""
    return {"searched": searched, "of": SHARDS, "missing": sorted(set(missing))}


def coverage_text(cov: dict[str, Any] | None) -> str | None:
    """None for a whole search; else "partial: searched 43 of 64 shards; b did not answer"."""
    if not cov or cov.get("searched", SHARDS) >= cov.get("of", SHARDS):
        return None
    missing = list(cov.get("missing") or [])
    text = f"partial: searched {cov.get('searched')} of {cov.get('of', SHARDS)} shards"
    if missing:
        text += f"; {', '.join(map(str, missing))} did not answer"
    return text


@dataclass
class SearchAnswer:
    """A knowledge-base search: ``searched`` False means nobody could run it
    (no hits, no part of the corpus covered) — not that nothing matched.

    ``coverage`` (:func:`coverage`) says how much of the corpus was searched:
    64 of 64 shards unless data nodes missing from a split search cost it
    theirs (``missing`` names them; *answers* says what each said). ``node``
    is who searched (``"a, b, c"`` for a split search; ``nodes`` lists them).
    """

    hits: list[dict[str, Any]]
    searched: bool
    node: str | None
    answers: dict[str, str] = field(default_factory=dict)
    coverage: dict[str, Any] = field(default_factory=lambda: coverage(SHARDS))
    nodes: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return self.coverage.get("searched", SHARDS) < self.coverage.get("of", SHARDS)


def split_shards(nodes: list[str]) -> dict[str, tuple[int, int]]:
    """The 64 shards split evenly between *nodes* (in the order given): node -> [lo, hi)."""
    n = len(nodes)
    return {node: (i * SHARDS // n, (i + 1) * SHARDS // n) for i, node in enumerate(nodes)}


def merge_hits(parts: Iterable[list[dict[str, Any]]], limit: int) -> list[dict[str, Any]]:
    """The best *limit* hits of several ranges' (each best first): by score, then path."""
    seen: dict[str, dict[str, Any]] = {}
    for hits in parts:
        for h in hits:
            path = h.get("path")
            if path not in seen or (h.get("score") or 0) > (seen[path].get("score") or 0):
                seen[path] = h
    return sorted(seen.values(), key=lambda h: (-(h.get("score") or 0), str(h.get("path"))))[:limit]


# ------------------------------------------------------------------- order

def spread(asker: str, node: str) -> int:
    """The rank of *node* in *asker*'s order: askers differ, each keeps its own."""
    return int.from_bytes(hashlib.sha256(f"{asker}\0{node}".encode()).digest()[:8], "big")


def order(asker: str, states: Iterable[NodeState], floor: int, last_answered: str | None,
          silent_since: dict[str, float], now: float, *,
          exclude: Iterable[str] = ()) -> list[NodeState]:
    """The data nodes *asker* asks, in order (module docstring).

    Out-of-service nodes and *exclude* (this node, when its own copy was
    tried) are left out. Healthy nodes come first, then lagging nodes and
    nodes whose record is behind *floor*, then nodes silent since less than
    :data:`SILENT_FOR` before *now* (monotonic, as *silent_since*'s values);
    within each, the last node that answered first, then the asker's spread.
    """
    skip = set(exclude)

    def rank(s: NodeState) -> tuple[int, int, int]:
        since = silent_since.get(s.id)
        if since is not None and now - since < SILENT_FOR:
            tier = 2
        elif s.lagging or s.applied < floor:
            tier = 1
        else:
            tier = 0
        return tier, 0 if s.id == last_answered else 1, spread(asker, s.id)

    return sorted((s for s in states if s.in_service and s.id not in skip), key=rank)


def _unknown(op: Op, answers: dict[str, str]) -> NoReturn:
    """Say that *op* may have run and nobody can vouch for its outcome, and raise it."""
    log.event("estate_outcome_unknown", "warning", op=op.id, kind=op.kind, answers=answers)
    raise OutcomeUnknown(op.id, answers)


def applier_wait(wait: float) -> float:
    """What the applier is told to wait, given the router's *wait* for it."""
    return max(wait - min(MARGIN_MAX, wait * MARGIN_SHARE), 0.0)


def _secs(seconds: float) -> str:
    return f"{round(seconds, 1):g}s"


# ------------------------------------------------------------------ router

class _Verdict:
    """What one node's answer means for the request."""

    OK, NEXT, RAN = "ok", "next", "ran"   # done; nothing ran there; may have run there


@dataclass(frozen=True)
class _NoAnswer:
    """A node asked that gave no answer: why, whether it may have run the
    request, and whether it counts as silent (asked last for a while)."""

    why: str
    ran: bool
    silent: bool


NOBODY = _NoAnswer("nobody listening (no applier running)", ran=False, silent=True)


class Router:
    """This process's way to the estate (module docstring).

    *local* is this node's own copy when the node is a data node.
    *node_floor*, if given, is the node's shared floor (``get()`` and
    ``raise_to(seq)``: :class:`crewlet.estate.floor.NodeFloor`), so the node's
    processes read one another's writes; without it the floor is this
    router's own. *read_wait* and *write_wait* are the waits per data node.
    """

    def __init__(self, nc, *, node_id: str, view: EstateView, local=None,
                 read_wait: float = READ_WAIT, write_wait: float = WRITE_WAIT,
                 node_floor=None, clock: Callable[[], float] = time.monotonic,
                 origin: str | None = None, js=None):
        self.nc = nc
        # The JetStream context of straight writes (made from *nc* when none is given).
        self.js = js
        self.node_id = node_id
        # Who asks (crewlet.estate.origins): by default the broker user *nc*
        # connected as, the one whose subject that user may publish on.
        self.origin = origin or origins.of_connection(nc)
        self.view = view
        self.local = local
        self.read_wait = read_wait
        self.write_wait = write_wait
        self.shared_floor = node_floor
        self.clock = clock
        self._floor = 0
        self.last_answered: str | None = None
        self.silent_since: dict[str, float] = {}
        # Pages in the knowledge index, as the last search answer said (None:
        # not asked yet): a split search is worth it only for a large one.
        self.corpus: int | None = None
        # How to_log put the last op of a subject of this origin's own in the
        # log ("straight" or "asked"; None: none yet), so a change is said once.
        self.log_way: str | None = None

    # ----------------------------------------------------------- floor

    @property
    def floor(self) -> int:
        if self.shared_floor is not None:
            return max(self._floor, self.shared_floor.get())
        return self._floor

    def raise_floor(self, seq: Any) -> None:
        """Read from here on as one who wrote *seq* (another process's write
        this one was told of: a conversation run's mail names the seq of the
        run's start, so the turn never reads a copy that has not seen it)."""
        self._raise_floor(seq)

    def _raise_floor(self, seq: Any) -> None:
        if isinstance(seq, int) and seq > self._floor:
            self._floor = seq
            if self.shared_floor is not None:
                self.shared_floor.raise_to(seq)

    # ---------------------------------------------------------- service

    def unserved(self) -> str | None:
        """Why a request would find no copy in service now; None when one
        would. As :meth:`_ask` chooses: this node's own copy by what its
        applier last told this process (its status record may say "in
        service" sooner), then the others by their records. ``/readyz``
        answers with it; :meth:`serving` waits on it."""
        why: list[str] = []
        if self.local is not None:
            mine = self.local.reason()
            if mine is None:
                return None
            why.append(f"{self.node_id}: {mine}")
        if not self.view.ready:
            return "; ".join(why + ["the other copies' state is not read yet"])
        for state in self.view.data_nodes():
            if self.local is not None and state.id == self.node_id:
                continue
            if state.in_service:
                return None
            why.append(f"{state.id}: {state.reason}")
        return "no copy of the estate in service: " + ("; ".join(why) or "no data node is up")

    async def serving(self, within: float, going_on: Callable[[], bool] = lambda: True) -> bool:
        """Wait until a copy serves (:meth:`unserved` is None), for at most *within* s (or while
        *going_on*); whether it does. For a role's first reads at a node's
        start, which would otherwise find no copy in service yet and say so
        as a warning every time."""
        deadline = time.monotonic() + within
        while self.unserved() is not None:
            if not going_on() or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(SERVING_POLL)
        return True

    # ------------------------------------------------------------- api

    async def write(self, op: Op, *, timeout: float | None = None) -> dict[str, Any]:
        """Write *op*; its outcome (``ok`` False: refused, ``error`` says why).

        On a data node whose copy serves, an op this router's origin may
        publish itself goes to the log straight, and its outcome is read
        from the copy (module doc, "Straight to the log"); otherwise, or when
        that cannot vouch for one, the copies are asked.

        Raises OpError (a bad op, nothing sent), :class:`OutcomeUnknown`,
        :class:`NobodyAnswered`, :class:`BadRequest`.
        """
        op.check()
        subject = await self._straight_subject(op)
        if subject is not None:
            until = None if timeout is None else self.clock() + timeout
            outcome = await self._write_straight(op, subject, until)
            if outcome is not None:
                self._raise_floor(outcome.get("seq"))
                return outcome
            if until is not None:
                timeout = max(until - self.clock(), 0.0)
        answer, _node, _answers = await self._ask(
            lambda floor, wait, deadline: wire.write_request(op, floor, wait, deadline),
            self.write_wait, timeout, op.kind, op=op)
        outcome = answer.get("answer") or {}
        self._raise_floor(outcome.get("seq", answer.get("seq")))
        return outcome

    async def _straight_subject(self, op: Op) -> str | None:
        """The subject this router publishes *op* on itself, for a write whose
        outcome this node's copy then tells; None: the op is asked for."""
        if self.local is None:
            return None
        await self.local.first_word()
        if self.local.reason() is not None:
            return None
        if self.origin not in origins.LOG_KINDS:
            # No subject of its own: the operator's, which takes every kind.
            return estate_log.SUBJECT if self.origin == origins.OPERATOR else None
        if op.kind not in origins.LOG_KINDS[self.origin] or not self.view.ready:
            return None
        nodes = self.view.data_nodes()
        if not nodes or not all(estate_log.reads_writes(s.protocol) for s in nodes):
            return None  # an older applier would pass it over: asked for, as before
        return estate_log.seats_subject(self.node_id)

    async def _write_straight(self, op: Op, subject: str,
                              until: float | None) -> dict[str, Any] | None:
        """Publish *op* on *subject* and read its outcome from this node's copy
        once the copy has applied it: the outcome, or None when the copies
        are to be asked instead (nothing was stored, or a ``move_on`` op this
        copy could not vouch for, under the same id). Raises
        :class:`OutcomeUnknown` for a ``once`` op that may be in the log."""
        assert self.local is not None
        wait = self._wait(self.write_wait, until)
        if wait < MIN_WAIT:
            return None
        local_until = time.monotonic() + wait
        try:
            first = self.local.outcome(op)
        except Exception:  # no copy to read (replaced meanwhile): the applier answers
            return None
        if first is not None:
            return first   # written before (a retry): not published again
        once = op.retry == "once"
        try:
            seq, _ = await estate_log.publish(self._jetstream(), op, subject=subject,
                                              timeout=wait if once else min(PUBLISH_TIMEOUT, wait))
        except (NatsTimeoutError, asyncio.TimeoutError, TimeoutError):
            if once:
                _unknown(op, {self.node_id: "the log did not acknowledge the op in time: it may be in it"})
            return None    # asked for under the same id: it lands once
        except Exception as exc:
            # Not stored (no stream listening, refused, no connection): the
            # applier asked publishes it, or says why it cannot.
            log.event("estate_straight_refused", "debug", op=op.id, kind=op.kind,
                      error=f"{type(exc).__name__}: {exc}")
            return None
        self._raise_floor(seq)
        try:
            if await self.local.reach(seq, local_until):
                outcome = self.local.outcome(op)
                if outcome is None:
                    # Applied past it and nothing kept: passed over for its origin
                    # (the applier said why: estate_op_refused).
                    return {"ok": False, "seq": seq, "code": origins.WRONG_ORIGIN,
                            "error": f"the log's entry {seq} was passed over for its origin"}
                return outcome
            why = f"in the log at {seq}; this copy did not apply it within the wait"
        except Exception as exc:  # the copy could not be read (replaced meanwhile): as not applied
            why = f"in the log at {seq}; this copy could not be read: {type(exc).__name__}: {exc}"
        if once:
            _unknown(op, {self.node_id: why})
        self._pass_over({}, self.node_id, why, op.kind)
        return None

    def _jetstream(self):
        """The JetStream context straight writes are published through."""
        if self.js is None:
            self.js = self.nc.jetstream()
        return self.js

    async def to_log(self, js, op: Op, *, timeout: float,
                     deadline: float | None = None) -> int | None:
        """Put *op*, of a kind this router's origin publishes to the log
        itself, in the log through JetStream context *js*: the seq it landed
        at (the way: module doc, "Straight to the log").

        *timeout* is one publish's wait; with a monotonic *deadline* the op
        (a kind that may be sent twice) is sent again until then — asked
        for instead, the deadline bounds the whole write. Raises what
        :func:`crewlet.estate.log.publish` raises, or what :meth:`write`
        raises when asked.
        """
        if self.origin not in origins.LOG_KINDS:
            # No subject of its own: the operator's, which it may use.
            seq, _ = await estate_log.publish(js, op, timeout=timeout, deadline=deadline)
            return seq
        if not self.view.ready:
            await self.view.wait_ready(min(VIEW_READY_WAIT, timeout if deadline is None
                                           else max(deadline - time.monotonic(), 0.0)))
        older = ({s.id: s.protocol for s in self.view.data_nodes()
                  if not estate_log.reads_seats(s.protocol)}
                 if self.view.ready else None)
        way = "straight" if older == {} else "asked"
        if way != self.log_way and (self.log_way is not None or way == "asked"):
            log.event("estate_seats_log_way", way=way, origin=self.origin,
                      older=older if older is not None else "the fleet's presence is not read yet")
        self.log_way = way
        if way == "straight":
            seq, _ = await estate_log.publish(js, op, timeout=timeout, deadline=deadline,
                                              subject=estate_log.seats_subject(self.node_id))
            return seq
        # An older applier would take the seats' subject for a gap: an applier
        # of this version publishes it on estate.ops, which every one reads.
        outcome = await self.write(op, timeout=timeout if deadline is None
                                   else max(deadline - time.monotonic(), 0.0))
        return outcome.get("seq")

    def batches_records(self) -> bool:
        """Whether this origin's turn records go to the log many in one
        ``turn.records`` op (roles/seats/kept.py): it publishes them itself
        and every live data node's presence says a protocol whose applier
        applies that kind (:func:`crewlet.estate.log.reads_records`). Else
        each goes as a ``turn.record`` op of its own, by :meth:`to_log`."""
        if "turn.records" not in origins.LOG_KINDS.get(self.origin, ()) or not self.view.ready:
            return False
        nodes = self.view.data_nodes()
        return bool(nodes) and all(estate_log.reads_records(s.protocol) for s in nodes)

    async def read(self, query: str, args: dict[str, Any], *,
                   timeout: float | None = None) -> dict[str, Any]:
        """The answer to read *query*. Raises OpError (bad query or args,
        nothing sent), :class:`NobodyAnswered`, :class:`BadRequest`."""
        check_query(query, args)
        answer, _node, _answers = await self._ask(self._reading(query, args), self.read_wait,
                                                  timeout, query)
        return answer.get("answer")

    async def search(self, query: str, limit: int = 10, *,
                     timeout: float | None = None) -> SearchAnswer:
        """Search the knowledge base; ``searched`` False when nobody could.

        Split between the live data nodes above :data:`SPLIT_AT` pages, else
        one copy's whole search (module docstring); ``coverage`` says how
        much was searched.
        """
        args = {"query": query, "limit": limit}
        check_query("page.search", args)
        until = None if timeout is None else self.clock() + timeout
        if not self.view.ready:
            await self.view.wait_ready(self._wait(VIEW_READY_WAIT, until))
        live = self._search_nodes()
        if self.corpus is not None and self.corpus >= SPLIT_AT and len(live) > 1:
            return await self._split_search(args, live, until)
        left = None if until is None else max(until - self.clock(), 0.0)
        try:
            answer, node, answers = await self._ask(self._reading("page.search", args),
                                                    self.read_wait, left, "page.search")
        except NobodyAnswered as exc:
            return SearchAnswer(hits=[], searched=False, node=None, answers=exc.answers,
                                coverage=coverage(0, exc.answers))
        found = answer.get("answer") or {}
        self._learn_corpus(found)
        return SearchAnswer(hits=list(found.get("hits") or []), searched=True, node=node,
                            answers=answers, nodes=[node])

    def _learn_corpus(self, found: dict[str, Any]) -> None:
        docs = found.get("docs")
        if isinstance(docs, int) and not isinstance(docs, bool):
            self.corpus = docs

    def _search_nodes(self) -> list[str]:
        """The data nodes a split search is divided between, sorted by id:
        in service, not silent lately, not lagging (this node's own copy:
        as it says itself, when the router has it)."""
        now = self.clock()
        live = []
        for s in self.view.data_nodes():
            if s.id == self.node_id and self.local is not None:
                if self.local.reason() is None:
                    live.append(s.id)
                continue
            since = self.silent_since.get(s.id)
            if (s.in_service and not s.lagging
                    and (since is None or now - since >= SILENT_FOR)):
                live.append(s.id)
        if self.local is not None and self.node_id not in live and self.local.reason() is None \
                and self.view.state(self.node_id) is None:
            live.append(self.node_id)   # this node's copy, before the view lists it
        return sorted(live)

    async def _search_range(self, node: str, args: dict[str, Any], shards: tuple[int, int],
                            until: float | None) -> dict[str, Any] | _NoAnswer:
        """*node*'s answer to a search of *shards* (this node's copy, or over NATS)."""
        wait = self._wait(self.read_wait, until)
        if wait < MIN_WAIT:
            return _NoAnswer("not asked: the caller's deadline had passed", ran=False, silent=False)
        request = self._request(lambda floor, told, deadline: wire.read_request(
            "page.search", args, floor, told, deadline, shards=shards), wait)
        if node == self.node_id and self.local is not None:
            return await self._ask_local(request, wait)
        return await self._ask_node(node, request, wait)

    async def _split_search(self, args: dict[str, Any], live: list[str],
                            until: float | None) -> SearchAnswer:
        """Ask every live node for its share of the shards at once; merge."""
        plan = split_shards(live)
        answers: dict[str, str] = {}
        parts: list[list[dict[str, Any]]] = []
        covered = 0
        ok: list[str] = []           # nodes that answered, in the order of *live*
        failed: dict[str, tuple[int, int]] = {}   # a node -> its range, not searched

        def take(node: str, shards: tuple[int, int], answer: Any) -> bool:
            nonlocal covered
            try:
                verdict = self._judge(node, answer, answers, None, "page.search")
            except BadRequest as exc:
                answer = _NoAnswer(str(exc), ran=False, silent=False)
                self._pass_over(answers, node, answer.why, "page.search")
                verdict = _Verdict.NEXT
            if verdict != _Verdict.OK:
                return False
            found = answer.get("answer") or {}
            self._learn_corpus(found)
            parts.append(list(found.get("hits") or []))
            covered += shards[1] - shards[0]
            if node not in ok:
                ok.append(node)
            return True

        got = await asyncio.gather(*(self._search_range(node, args, plan[node], until)
                                     for node in live))
        for node, answer in zip(live, got):
            if not take(node, plan[node], answer):
                failed[node] = plan[node]
        # A range whose node said at once it could not (time is left) is asked
        # of the next node that answered, once; one that timed out left none.
        retry: list[tuple[str, str, tuple[int, int]]] = []
        if failed and ok:
            for node, shards in failed.items():
                if self._wait(self.read_wait, until) < MIN_WAIT:
                    break
                after = [n for n in live[live.index(node) + 1:] + live[:live.index(node)] if n in ok]
                if after:
                    retry.append((node, after[0], shards))
        if retry:
            got = await asyncio.gather(*(self._search_range(peer, args, shards, until)
                                         for _, peer, shards in retry))
            for (node, peer, shards), answer in zip(retry, got):
                before = answers.get(peer)
                if take(peer, shards, answer):
                    failed.pop(node, None)
                elif before is not None:   # keep what the peer said first as well
                    answers[peer] = f"{before}; then {answers[peer]}"
        missing = sorted(failed)
        hits = merge_hits(parts, args["limit"])
        if not ok:
            log.event("estate_nobody_answered", "warning", what="page.search", answers=answers)
            return SearchAnswer(hits=[], searched=False, node=None, answers=answers,
                                coverage=coverage(0, missing))
        if missing:
            log.event("estate_search_partial", "warning", searched=covered, missing=missing,
                      answers=answers)
        return SearchAnswer(hits=hits, searched=True, node=", ".join(ok), answers=answers,
                            coverage=coverage(covered, missing), nodes=list(ok))

    # ------------------------------------------------------------ asking

    @staticmethod
    def _reading(query: str, args: dict[str, Any]) -> Callable[[int, float, float], dict]:
        return lambda floor, wait, deadline: wire.read_request(query, args, floor, wait, deadline)

    async def _ask(self, make: Callable[[int, float, float], dict[str, Any]], per_node: float,
                   timeout: float | None, what: str, *,
                   op: Op | None = None) -> tuple[dict[str, Any], str, dict[str, str]]:
        """Ask this node's copy, then the data nodes in order, until one answers.

        Returns ``(answer, node, answers)``; *answers* is what each node
        asked (or passed over) before it said.
        """
        until = None if timeout is None else self.clock() + timeout
        answers: dict[str, str] = {}
        ran = False   # a node may have run the write

        if self.local is not None:
            await self.local.first_word()   # this process's first seconds: not "stopped" yet
            why = self.local.reason()
            if why is not None:
                self._pass_over(answers, self.node_id, f"out of service: {why}", what)
            else:
                wait = self._wait(per_node, until)
                if wait < MIN_WAIT:
                    self._pass_over(answers, self.node_id,
                                    "not asked: the caller's deadline had passed", what)
                else:
                    answer = await self._ask_local(self._request(make, wait), wait)
                    verdict = self._judge(self.node_id, answer, answers, op, what)
                    if verdict == _Verdict.OK:
                        return answer, self.node_id, answers
                    ran = ran or verdict == _Verdict.RAN

        if not self.view.ready:
            await self.view.wait_ready(self._wait(VIEW_READY_WAIT, until))
        states = self.view.data_nodes()
        exclude = {self.node_id} if self.local is not None else set()
        for s in states:
            if not s.in_service and s.id not in exclude:
                self._pass_over(answers, s.id, f"out of service: {s.reason}", what)
        for s in order(self.node_id, states, self.floor, self.last_answered, self.silent_since,
                       self.clock(), exclude=exclude):
            wait = self._wait(per_node, until)
            if wait < MIN_WAIT:
                self._pass_over(answers, s.id, "not asked: the caller's deadline had passed", what)
                continue
            answer = await self._ask_node(s.id, self._request(make, wait), wait)
            verdict = self._judge(s.id, answer, answers, op, what)
            if verdict == _Verdict.OK:
                return answer, s.id, answers
            ran = ran or verdict == _Verdict.RAN

        if op is not None and ran:
            _unknown(op, answers)
        log.event("estate_nobody_answered", "warning", what=what, answers=answers)
        raise NobodyAnswered(answers)

    def _wait(self, per_node: float, until: float | None) -> float:
        if until is None:
            return per_node
        return min(per_node, until - self.clock())

    def _request(self, make: Callable[[int, float, float], dict[str, Any]],
                 wait: float) -> dict[str, Any]:
        told = applier_wait(wait)
        return make(self.floor, told, time.time() + told)

    async def _ask_local(self, request: dict[str, Any], wait: float) -> dict[str, Any] | _NoAnswer:
        """This node's copy's answer (it waits up to *wait* for the applier on a write)."""
        try:
            # The node's own applier is told who asks in the request (over NATS
            # the subject says it).
            return await self.local.ask({**request, "origin": self.origin}, timeout=wait)
        except ApplierSilent as exc:  # it stopped while we waited: it may run the op when it goes on
            return _NoAnswer(f"no answer: {exc}", ran=True, silent=False)
        except (TimeoutError, asyncio.TimeoutError):
            return _NoAnswer(f"no answer within {_secs(wait)}", ran=True, silent=False)
        except Exception as exc:  # the copy's trouble: a peer may still answer
            why = f"this node's copy failed: {type(exc).__name__}: {exc}"
            log.event("estate_local_failed", "warning", error=why)
            return _NoAnswer(why, ran=True, silent=False)

    async def _ask_node(self, node: str, request: dict[str, Any],
                        wait: float) -> dict[str, Any] | _NoAnswer:
        """A peer's answer to *request*, over NATS, waiting up to *wait*."""
        try:
            msg = await self.nc.request(wire.subject(node, self.origin, self.node_id),
                                        wire.encode(request), timeout=wait)
        except NoRespondersError:
            return NOBODY
        except (NatsTimeoutError, asyncio.TimeoutError, TimeoutError):
            return _NoAnswer(f"no answer within {_secs(wait)}", ran=True, silent=True)
        except Exception as exc:
            # Raised before anything was sent (connection closed or draining,
            # a payload too large): nothing ran there.
            return _NoAnswer(f"could not be asked: {type(exc).__name__}: {exc}", ran=False,
                             silent=False)
        try:
            answer = wire.decode(msg.data)
        except ValueError as exc:
            answer = exc
        if not isinstance(answer, dict):
            return _NoAnswer(f"unreadable answer: {answer}", ran=True, silent=False)
        return answer

    def _judge(self, node: str, answer: dict[str, Any] | _NoAnswer, answers: dict[str, str],
               op: Op | None, what: Any) -> str:
        """Record what *node* said in *answers* and decide what it means.

        Raises :class:`BadRequest` for ``bad_request``, and
        :class:`OutcomeUnknown` at once when a ``once`` op may have run.
        """
        peer = node != self.node_id or self.local is None
        if isinstance(answer, _NoAnswer):
            if peer and answer.silent:
                self.silent_since[node] = self.clock()
            self._pass_over(answers, node, answer.why, what)
            return self._may_have_run(op, answers) if answer.ran else _Verdict.NEXT
        if peer:
            self.silent_since.pop(node, None)
        status = answer.get("status")
        if status == wire.OK:
            if peer:
                self.last_answered = node
            return _Verdict.OK
        if status == wire.BAD_REQUEST:
            raise BadRequest(f"node {node}: bad request: {answer.get('reason')}")
        if status == wire.OUT_OF_SERVICE:
            self._pass_over(answers, node, f"out of service: {answer.get('reason')}", what)
            return _Verdict.NEXT
        if status == wire.BEHIND:
            self._pass_over(answers, node, f"behind: applied {answer.get('applied')}, "
                                           f"the floor is {answer.get('floor')}", what)
            return _Verdict.NEXT
        if status == wire.UNVOUCHED:
            seq = answer.get("seq")
            at = f" (published at seq {seq})" if seq is not None else ""
            # It is in the log at that seq: whatever answers later must have applied it.
            self._raise_floor(seq)
            self._pass_over(answers, node, f"unvouched{at}: {answer.get('reason')}", what)
            return self._may_have_run(op, answers)
        # An answer we cannot read: as good as none (it may have run a write).
        self._pass_over(answers, node, f"unreadable answer ({status}): {answer.get('reason')}",
                        what)
        return self._may_have_run(op, answers)

    def _may_have_run(self, op: Op | None, answers: dict[str, str]) -> str:
        if op is None:
            return _Verdict.NEXT    # a read that ran changed nothing
        if op.retry == "once":
            _unknown(op, answers)
        return _Verdict.RAN

    def _pass_over(self, answers: dict[str, str], node: str, why: str, what: Any) -> None:
        answers[node] = why
        log.event("estate_pass_over", "debug", node=node, why=why, request=what)
