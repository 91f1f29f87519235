"""This ingress node's own picture of the company, kept live (DESIGN §10).

Built from what the fleet already publishes, so any ingress answers the
fleet's reads and the live feed without asking its peers:

==========  ===============================================  =================
what        from                                             how fresh
==========  ===============================================  =================
nodes,      the ``leases`` bucket (one :class:`Holders`      a watch: ~1 ms
seats,      watch): presences, seat and duty leases
duties
copies      the estate view (``status`` ``estate.*``)        a watch, looked
                                                             at every second
turns       ``feed.turns.>``: every turn record, in the      a subscription:
            batches each seats process publishes             within
                                                             ``FEED_EVERY``
                                                             (0.1 s)
mailboxes,  the ``AGENTS`` consumers and ``DLQ`` subjects,   a busy seat's:
dead        sampled: a seat whose turn was seen at the next  every :data:`SAMPLE`
letters     sample, all of them in a listing paced by its    s; the rest: that
            cost (:data:`LIST_REST`), or when the busy ones  or slower
            are many (:data:`LOOKUPS_PER_PAGE`)
reports     each duty's last pass (``status`` ``duty.*``)    sampled every
                                                             :data:`SAMPLE` s
children    this node's from crewletd (``control``           every second;
            ``children``); the
            others' from their presence                      every heartbeat
==========  ===============================================  =================

Each change goes out on the :class:`~roles.ingress.feed.Feed` as it is seen
(``turn``, ``node``, ``seat``, ``duty``, ``copy``, ``mailboxes``,
``children``, ``company``); :meth:`Projection.snapshot` is the whole state, the
feed's first event for every subscriber.

A node whose presence went is kept as ``gone`` for ``ingress.gone_for``
seconds, so a dashboard shows a node that died rather than one that
silently vanished.

The turn subscription is plain NATS, as the feed is (nothing stores it):
live, a gap while the connection is down is repaired by the next snapshot.
It hears the records in batches (``feed.turns.<node>.<process>``: the records
a seats process ended within 0.1 s, in one message) rather than each on its
seat's subject (``feed.turn.<seat>``, still published for ``send --wait``): a
NATS message, a decode and a wake a turn were most of what ingress spent per
turn (bench/slow_turns.py, issue 28).
A seat may publish one record twice (a trigger's ``done`` record sent again
after a redo), so records are told apart by seat, trigger, outcome and start.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from typing import Any, Callable

from crewlet import ipc, log
from crewlet.coord import drain, duty_reports
from crewlet.coord.holders import Holders
from crewlet.queue.base import MailboxError
from crewlet.queue.post import TURNS_SUBJECT
from crewlet.queue.jetstream import (CONSUMER, DLQ_STREAM, DLQ_SUBJECT, STREAM, JetStreamMailboxes,
                                    api_prefix, jetstream_api)
from roles.ingress.feed import Feed

# Seconds between samples of the mailboxes and dead letters.
SAMPLE = 2.0
# A whole listing of the mailboxes waits this many times what the last one
# took (and at least SAMPLE s); the busy seats' mailboxes are looked at between.
LIST_REST = 100
# Mailboxes of busy seats looked at one by one in a sample at most.
TOUCHED_MAX = 256
# Busy seats' mailboxes worth one page of a listing: with more of them than
# this per page a listing takes, a sample lists them all instead of asking one
# by one (100 busy seats of 100: one request every SAMPLE s, not 100).
LOOKUPS_PER_PAGE = 8
# Seconds between asks of crewletd for this node's children.
CHILDREN_EVERY = 1.0
# Turn records kept: the newest overall, and the newest per seat.
RECENT_TURNS = 200
TURNS_PER_SEAT = 10
# A consumer listing page (the JetStream API's own page size).
LIST_PAGE = 256
# Seconds one broker request of the sampler may take.
SAMPLE_TIMEOUT = 5.0


def _final(record: dict[str, Any]) -> bool:
    return record.get("outcome") not in (None, "running")


class Projection:
    """Invariants: ``seats`` holds a row for every seat of the company in
    force (and only those); ``turns`` is newest-first, each record once;
    ``gone`` holds nodes whose presence went less than ``gone_for`` ago."""

    def __init__(self, *, node_id: str, nc, js, holders: Holders, estate_view, run_dir: str, zctx,
                 gone_for: float, clock: Callable[[], float] = time.time):
        self.node_id = node_id
        self.nc, self.js = nc, js
        self.holders = holders
        self.estate_view = estate_view
        self.run_dir, self.zctx = run_dir, zctx
        self.gone_for = gone_for
        self.clock = clock
        self.feed = Feed()
        self.company: dict[str, Any] | None = None     # {rev, epoch, digest, company}
        # Set once a company was heard: crewletd makes the mailboxes' streams
        # (MAIL, its dead letters, NOTIFY) before it tells the roles of one.
        self.company_heard = asyncio.Event()
        self.seat_names: list[str] = []
        self.mailboxes: dict[str, dict[str, int]] = {}  # seat -> {pending, in_flight}
        self.dead: dict[str, int] = {}                   # seat -> dead letters
        self.turns: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_TURNS)
        self.by_seat: dict[str, collections.deque] = {}
        self.gone: dict[str, dict[str, Any]] = {}        # node -> {info..., gone_at}
        self.children: list[dict[str, Any]] | None = None  # this node's, from crewletd
        self.copies: dict[str, dict[str, Any] | None] = {}
        self.reports: dict[str, dict[str, Any]] = {}     # duty -> its last pass (metrics)
        self.sampled_at: float | None = None
        self._touched: set[str] = set()  # seats whose turns were seen since the last sample
        self._boxes = JetStreamMailboxes(js, nc, timeout=SAMPLE_TIMEOUT)
        self._control = ipc.Caller(zctx, run_dir)  # one socket for the asks every CHILDREN_EVERY
        self._seen_turns: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self._shown: dict[str, dict[str, Any]] = {}      # node key -> the row the feed last told
        self.on_turn: Callable[[dict[str, Any]], None] = lambda record: None  # each new record seen live
        holders.on_change = self._lease_changed

    # ------------------------------------------------------------- running

    async def run(self) -> None:
        sub = await self.nc.subscribe(TURNS_SUBJECT + ">", cb=self._turns_seen)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.holders.run(), name="projection holders")
                group.create_task(self._sample_mailboxes(), name="projection mailboxes")
                group.create_task(self._follow_children(), name="projection children")
                group.create_task(self._follow_copies(), name="projection copies")
                group.create_task(self._sample_reports(), name="projection reports")
        finally:
            self._control.close()
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    def set_company(self, current: dict[str, Any]) -> None:
        """The company revision in force changed (``ctx.companies()``)."""
        self.company = current
        self.company_heard.set()
        names = [s["name"] for s in current["company"]["seats"]]
        self.seat_names = names
        for seat in names:
            self.by_seat.setdefault(seat, collections.deque(maxlen=TURNS_PER_SEAT))
        for seat in set(self.by_seat) - set(names):
            self.by_seat.pop(seat, None)
        self.feed.publish("company", self.company_summary() or {})

    async def seed_turns(self, records: list[dict[str, Any]]) -> None:
        """Fill the recent turns from the estate's durable records (oldest first)."""
        for record in records:
            self._keep_turn(record, publish=False)

    # ------------------------------------------------------------- changes

    def _lease_changed(self, key: str, was, now) -> None:
        """A lease appeared, moved, went — or was only renewed (a new revision):
        the feed hears of what a reader would see change, not of renewals."""
        kind, _, name = key.partition(".")
        holder = (now.node, now.token) if now is not None else None
        before = (was.node, was.token) if was is not None else None
        if kind == "node":
            if now is None:
                if was is not None:
                    self.gone[name] = {**was.info, "gone_at": self.clock()}
                    self._shown.pop(key, None)
                    self.feed.publish("node", {"id": name, "state": "gone", "gone_at": self.clock()})
                return
            self.gone.pop(name, None)
            row = self._node_row(name, now)
            if self._shown.get(key) != row:  # a renewal that changed nothing shown is not news
                self._shown[key] = row
                self.feed.publish("node", row)
        elif before != holder:
            if kind == "seat":
                self.feed.publish("seat", {"seat": name, "owner": now.node if now else None,
                                           "token": now.token if now else None})
            elif kind == "duty":
                self.feed.publish("duty", {"name": name, "node": now.node if now else None,
                                           "token": now.token if now else None})

    async def _turns_seen(self, msg) -> None:
        """A batch of turn records (a JSON array) from a seats process."""
        try:
            records = json.loads(msg.data)
        except ValueError:
            return
        for record in records if isinstance(records, list) else ():
            if isinstance(record, dict) and isinstance(record.get("seat"), str):
                self._keep_turn(record, publish=True)

    def _keep_turn(self, record: dict[str, Any], *, publish: bool) -> None:
        ident = (record.get("seat"), record.get("trigger"), record.get("outcome"),
                 record.get("started_at"))
        if ident in self._seen_turns:
            return
        self._seen_turns[ident] = None
        while len(self._seen_turns) > 4 * RECENT_TURNS:
            self._seen_turns.popitem(last=False)
        if _final(record):
            self.turns.appendleft(record)
            self.by_seat.setdefault(record["seat"], collections.deque(maxlen=TURNS_PER_SEAT)
                                    ).appendleft(record)
        if isinstance(record.get("seat"), str):
            self._touched.add(record["seat"])  # its mailbox changed: the next sample looks
        if publish:
            self.on_turn(record)
            self.feed.publish("turn", record)

    async def _sample_mailboxes(self) -> None:
        """Every :data:`SAMPLE` s: the mailboxes of the seats whose turns were
        seen since the last look, one consumer each, and every
        :data:`SAMPLE` s or more the whole listing. A listing costs the broker
        a consumer's state per seat (40 pages at 10,000 seats), so the next
        one waits :data:`LIST_REST` times what this one took: with many idle
        seats, their rows are a little older and the broker is left alone.
        When the busy seats are more than :data:`LOOKUPS_PER_PAGE` a page of
        the listing, the sample is a listing: fewer requests than looking at
        them one by one (so a sample costs a few requests, however many
        turns ended since the last)."""
        failing = False
        next_listing = 0.0  # monotonic
        pages = 1           # the last listing's pages
        await self.company_heard.wait()  # before: no stream to list
        while True:
            try:
                if time.monotonic() >= next_listing or len(self._touched) > LOOKUPS_PER_PAGE * pages:
                    began = time.monotonic()
                    self._touched.clear()
                    pending = await self._consumers()
                    pages = max(1, -(-len(pending) // LIST_PAGE))
                    next_listing = time.monotonic() + max(SAMPLE, (time.monotonic() - began) * LIST_REST)
                else:
                    pending = await self._touched_consumers()
                dead = await self._dead_letters()
                changed = [s for s in set(pending) | set(self.mailboxes)
                           if pending.get(s) != self.mailboxes.get(s)]
                changed += [s for s in set(dead) | set(self.dead) if dead.get(s) != self.dead.get(s)]
                self.mailboxes, self.dead = pending, dead
                self.sampled_at = self.clock()
                if changed:
                    self.feed.publish("mailboxes", {"seats": [self._mailbox_row(s)
                                                              for s in sorted(set(changed))]})
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no quorum, a leader moving: keep the last sample
                if not failing:
                    log.event("projection_sample_failed", "warning",
                              error=f"{type(exc).__name__}: {exc}")
                failing = True
            await asyncio.sleep(SAMPLE)

    async def _sample_reports(self) -> None:
        """Each duty's last pass, for ``/metrics`` (a failed read keeps the last)."""
        while True:
            try:
                self.reports = await duty_reports.read_all(self.js)
            except asyncio.CancelledError:
                raise
            except Exception:
                pass  # the mailbox sampler says when the broker is away
            await asyncio.sleep(SAMPLE)

    async def _consumers(self) -> dict[str, dict[str, int]]:
        prefix, out, offset = api_prefix(self.js), {}, 0
        while True:
            page = await jetstream_api(self.nc, prefix, f"CONSUMER.LIST.{STREAM}", {"offset": offset},
                                       SAMPLE_TIMEOUT)
            infos = page.get("consumers") or []
            for info in infos:
                name = (info.get("name") or "")
                if name.startswith(CONSUMER):
                    out[name[len(CONSUMER):]] = {"pending": int(info.get("num_pending") or 0),
                                                 "in_flight": int(info.get("num_ack_pending") or 0)}
            offset += len(infos)
            if not infos or offset >= int(page.get("total") or 0):
                return out

    async def _touched_consumers(self) -> dict[str, dict[str, int]]:
        """The last sample with the mailboxes of the seats whose turns were seen
        since (at most :data:`TOUCHED_MAX` of them; the rest wait their turn)."""
        out = dict(self.mailboxes)
        touched = sorted(self._touched)[:TOUCHED_MAX]
        self._touched.difference_update(touched)

        async def one(seat: str) -> None:
            try:
                info = await self._boxes.info(seat)
            except MailboxError:
                return  # gone, or the broker busy: the next listing says
            out[seat] = {"pending": info["pending"], "in_flight": info["in_flight"]}

        await asyncio.gather(*(one(seat) for seat in touched))
        return out

    async def _dead_letters(self) -> dict[str, int]:
        try:
            info = await self.js.stream_info(DLQ_STREAM, subjects_filter=DLQ_SUBJECT + ">")
        except Exception as exc:
            if "not found" in str(exc).lower():
                return {}
            raise
        return {subject[len(DLQ_SUBJECT):]: n for subject, n in (info.state.subjects or {}).items()}

    async def _follow_children(self) -> None:
        while True:
            try:
                reply = await self._control.call("children", timeout=2.0)
                kids = reply["result"]["children"]  # crewletd's brief rows, as presences carry them
            except Exception:
                kids = None
            if kids != self.children:
                self.children = kids
                self.feed.publish("children", {"node": self.node_id, "children": kids})
            await asyncio.sleep(CHILDREN_EVERY)

    async def _follow_copies(self) -> None:
        while True:
            seen = {s.id: _copy(s) for s in self.estate_view.data_nodes()}
            for node in set(seen) | set(self.copies):
                if seen.get(node) != self.copies.get(node):
                    self.feed.publish("copy", {"node": node, "copy": seen.get(node)})
            self.copies = seen
            now = self.clock()
            for node, row in list(self.gone.items()):
                if now - row["gone_at"] > self.gone_for:
                    del self.gone[node]
            await asyncio.sleep(1.0)

    # ------------------------------------------------------------- answers

    def company_summary(self) -> dict[str, Any] | None:
        if self.company is None:
            return None
        c = self.company
        return {"name": c["company"]["company"]["name"], "rev": c.get("rev"), "epoch": c.get("epoch"),
                "digest": c.get("digest"), "seats": len(self.seat_names)}

    def _node_row(self, node: str, owner, seats: dict | None = None,
                  duties: dict | None = None, conversations: dict | None = None) -> dict[str, Any]:
        """A live node as the API and the feed show it (*seats*, *duties*, *conversations*: the
        leases, when the caller has them listed already)."""
        info = dict(owner.info)
        children = self.children if node == self.node_id else info.get("children")
        seats = self.holders.of("seat.") if seats is None else seats
        duties = self.holders.of("duty.") if duties is None else duties
        conversations = self.holders.of("conv.") if conversations is None else conversations
        row = {"id": node, "state": "up", "roles": info.get("roles") or [],
               "broker": info.get("broker"), "labels": info.get("labels") or {},
               "version": info.get("version"), "protocol": info.get("protocol"),
               "started_at": info.get("started_at"),
               "rev": info.get("rev"), "max_concurrent": info.get("max_concurrent"),
               "children": children, "copy": self.copies.get(node), "gone_at": None,
               "sandbox": info.get("sandbox"),
               "seats": sum(1 for o in seats.values() if o.node == node),
               "duties": sorted(k.removeprefix("duty.") for k, o in duties.items() if o.node == node),
               "conversations": sum(1 for o in conversations.values() if o.node == node),
               "draining": drain.draining(info)}
        row["drain"] = drain.state(row)
        return row

    def nodes(self) -> list[dict[str, Any]]:
        live = {k.removeprefix("node."): o for k, o in self.holders.of("node.").items()}
        seats = self.holders.of("seat.")
        duties = self.holders.of("duty.")
        conversations = self.holders.of("conv.")
        rows = [self._node_row(node, owner, seats, duties, conversations) for node, owner in live.items()]
        for node, info in self.gone.items():
            if node not in live:
                rows.append({"id": node, "state": "gone", "roles": info.get("roles") or [],
                             "broker": info.get("broker"), "labels": info.get("labels") or {},
                             "version": info.get("version"), "started_at": info.get("started_at"),
                             "rev": info.get("rev"), "max_concurrent": info.get("max_concurrent"),
                             "children": None, "copy": None, "gone_at": info["gone_at"],
                             "seats": 0, "duties": [], "conversations": 0, "draining": None,
                             "drain": None})
        return sorted(rows, key=lambda r: r["id"])

    def duties(self) -> list[dict[str, Any]]:
        return [{"name": k.removeprefix("duty."), "node": o.node, "token": o.token}
                for k, o in sorted(self.holders.of("duty.").items())]

    def _mailbox_row(self, seat: str) -> dict[str, Any]:
        box = self.mailboxes.get(seat) or {}
        return {"seat": seat, "pending": box.get("pending"), "in_flight": box.get("in_flight"),
                "dead_letters": self.dead.get(seat, 0)}

    def seat(self, seat: str) -> dict[str, Any]:
        owner = self.holders.get("seat." + seat)
        recent = self.by_seat.get(seat) or ()
        return {**self._mailbox_row(seat), "owner": owner.node if owner else None,
                "token": owner.token if owner else None,
                "last_turn": recent[0] if recent else None}

    def seats(self) -> list[dict[str, Any]]:
        return [self.seat(s) for s in sorted(self.seat_names)]

    def snapshot(self) -> dict[str, Any]:
        return {"node": self.node_id, "at": self.clock(), "company": self.company_summary(),
                "nodes": self.nodes(), "duties": self.duties(), "seats": self.seats(),
                "turns": list(self.turns)[:50], "sampled_at": self.sampled_at}


def _copy(state) -> dict[str, Any]:
    return {"in_service": state.in_service, "reason": state.reason, "applied": state.applied,
            "at": state.at, "lagging": state.lagging}
