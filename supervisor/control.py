"""The ``control`` endpoint: what crewletctl (and children) may ask crewletd.

One small function per command, registered in :data:`COMMANDS`; its docstring
is its help. A request is ``{"id", "op", "deadline", "args"}``; the reply is
``{"id", "ok": true, "result"}`` or ``{"id", "ok": false, "error"}``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import zmq

from crewlet import bus, disk, ipc, log, outbox, redaction, vault
from crewlet.company.model import Company
from crewlet.config.model import NODE_ID_RE
from crewlet.coord import buckets, capacity, drain as drains
from crewlet.coord.counters import Ledger
from crewlet.estate.ops import SEARCH_DEFAULT, SEARCH_MAX, OpError
from crewlet.estate.router import EstateError
from crewlet.queue.base import MailboxError
from crewlet.queue.post import post
from crewlet.vault import store as vault_store

if TYPE_CHECKING:
    from supervisor.node import Node


class CommandError(Exception):
    """A request crewletd understood and refuses; the message says why, and
    ``code`` (in the reply when given) what kind of refusal it is, for the
    API to answer with (``not_found``: what it names is not there)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


async def status(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """The node, its children and its supervisors, and the fleet as this node
    sees it (``fleet``; null while the node is not in one)."""
    result = node.status()
    result["fleet"] = node.fleet.view() if node.fleet is not None else None
    return result


async def children(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """This node's children in brief (name, state, pid, restarts, last exit),
    as its presence tells the fleet, its disk's condition and how its seats'
    tools run (the sandbox): ``status``
    without the stats or the fleet (~1 MB at 10,000 seats), for callers that
    ask often (ingress's projection every second, ``/readyz`` at every probe)."""
    return {"children": node.children_brief(), "disk": node.disk_condition(),
            "sandbox": node.sandbox_condition()}


async def company(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """The company revision in force on this node (``null`` before one is applied).
    ``epoch``: the one the asker has already — while it is still in force the
    answer is ``{"rev", "epoch", "digest"}`` without the company (roles ask
    every 30 s, and 10,000 seats are ~25 MB)."""
    current = node.fleet.company if node.fleet is not None else None
    if current is not None and args.get("epoch") is not None and args["epoch"] == current.get("epoch"):
        return {"company": {k: v for k, v in current.items() if k != "company"}}
    return {"company": current}


async def restart(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Stop and start one child by name (``child``); not counted as a failure."""
    name = args.get("child")
    sup = node.root.find(name) if node.root and isinstance(name, str) else None
    if sup is None:
        names = [c["name"] for c in node.status()["children"]]
        raise CommandError(f"no child named {name!r}; children: {', '.join(names)}")
    # Answer once the restart is done, so `crewletctl restart` returns when the
    # child is ready again.
    await sup.restart_child(name)
    return {"restarted": name}


async def stop(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Stop the whole node, as SIGTERM does; answers before stopping."""
    node.request_stop("crewletctl stop")
    return {"stopping": True}


def _mail(node: "Node"):
    """The fleet child's mailboxes and the company in force, or a refusal saying why not."""
    fleet = node.fleet
    if fleet is None or fleet.mailboxes is None:
        raise CommandError("this node has not joined the fleet yet")
    if fleet.company is None:
        raise CommandError("no company is applied yet (crewletctl apply FILE)")
    # Validated once, when it was applied: 10,000 seats take a second or two.
    return fleet, fleet.mailboxes, fleet.model


def _seat_arg(company: Company, args: dict[str, Any], key: str = "seat") -> str:
    seat = args.get(key)
    if not isinstance(seat, str) or seat not in {s.name for s in company.seats}:
        known = ", ".join(s.name for s in company.seats[:10])
        more = ", …" if len(company.seats) > 10 else ""
        raise CommandError(f"no seat named {seat!r} in the company; seats: {known}{more}")
    return seat


async def send(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Put ``text`` in the mailbox of ``seat`` (``trigger``: an id that makes a resend land
    once; ``wait``: seconds to wait for the turn that works it, whose record is answered)."""
    fleet, mailboxes, company = _mail(node)
    seat = _seat_arg(company, args)
    text = args.get("text")
    if not isinstance(text, str) or not text.strip():
        raise CommandError("text must be a non-empty string")
    wait = args.get("wait")
    try:
        # Before the disk is full, not as a publish the broker never answers.
        node.disk_watch.refuse_if_low("the mail was not sent")
        return await post(fleet.nc, mailboxes, seat, text, sender=f"crewletctl@{node.cfg.node.id}",
                          trigger=args.get("trigger") or None, wait=wait or None,
                          ledger=Ledger(fleet.js, ttl=0))  # read only: no ttl of its own
    except (ValueError, disk.NoSpace) as exc:
        raise CommandError(str(exc)) from None
    except MailboxError as exc:
        why = node.disk_watch.explain(exc)
        raise CommandError(f"{why}: the mailbox did not confirm the mail" if why
                           else f"the mailbox did not take the mail: {exc}") from None


async def seats(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Every seat of the company: owner, mailbox pending and in flight, last turn, dead letters."""
    fleet, mailboxes, company = _mail(node)
    js = fleet.js
    owners = {s["name"].removeprefix("seat."): s for s in fleet.view()["seats"]}
    router = getattr(fleet, "router", None)
    limit = asyncio.Semaphore(SEATS_PARALLEL)

    async def one(seat: str) -> dict[str, Any]:
        async with limit:
            row: dict[str, Any] = {"seat": seat, "owner": (owners.get(seat) or {}).get("node"),
                                   "token": (owners.get(seat) or {}).get("token")}
            try:
                row.update(await mailboxes.info(seat))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
            row["last_turn"] = None
            if router is not None:  # from the estate's turns table: its newest row of the seat
                try:
                    turns = await router.read("turn.list", {"seat": seat, "limit": 1}, timeout=SEAT_TURN_WAIT)
                    row["last_turn"] = ((turns or {}).get("turns") or [None])[0]
                except Exception as exc:  # one seat's trouble (no copy answering) is that row's
                    row["error"] = f"{type(exc).__name__}: {exc}"
            return row

    rows = await asyncio.gather(*(one(s.name) for s in company.seats))
    try:
        info = await js.stream_info("DLQ", subjects_filter="dlq.>")
        dead = {subject.removeprefix("dlq."): n for subject, n in (info.state.subjects or {}).items()}
    except Exception:
        dead = {}
    for row in rows:
        row["dead_letters"] = dead.get(row["seat"], 0)
    return {"seats": rows, "rev": fleet.company.get("rev")}


async def dlq(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Dead letters (``seat``: one seat's; ``limit``), or with ``requeue``: put that one back."""
    _, mailboxes, company = _mail(node)
    if args.get("requeue") is not None:
        seq = args["requeue"]
        if not isinstance(seq, int) or seq < 1:
            raise CommandError("requeue takes a dead letter's number (a positive integer)")
        try:
            new = await mailboxes.requeue(seq)
        except (LookupError, MailboxError) as exc:
            raise CommandError(str(exc)) from None
        return {"requeued": seq, "seq": new}
    seat = _seat_arg(company, args) if args.get("seat") is not None else None
    limit = args.get("limit") or 100
    letters = await mailboxes.dead_letters(seat, limit=int(limit))
    return {"dead_letters": [d.row() for d in letters]}


async def outbox_(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """What became of the notifications (``state``: only those; ``limit``,
    ``after``: a page), oldest change first, and how many wait in OUTBOX."""
    fleet = node.fleet
    if fleet is None or fleet.js is None:
        raise CommandError("this node has not joined the fleet yet")
    state = args.get("state")
    if state is not None and state not in outbox.STATES:
        raise CommandError(f"state must be one of {', '.join(outbox.STATES)}, got {state!r}")
    limit, after = args.get("limit") or 100, args.get("after") or 0
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (limit, after)):
        raise CommandError("limit and after must be whole numbers")
    rows = await outbox.outcomes(fleet.js, state=state, after=after, limit=limit)
    try:
        waiting = (await fleet.js.stream_info(outbox.STREAM)).state.messages
    except Exception:
        waiting = None
    return {"outcomes": rows, "waiting": waiting}


# ------------------------------------------------------------------ the estate

EVICTED_KEY = "evicted."  # + node id, in the status bucket: present = evicted


def _router(node: "Node"):
    """The fleet child's estate router, or a refusal saying why not."""
    router = getattr(node.fleet, "router", None) if node.fleet is not None else None
    if router is None:
        raise CommandError("this node has not joined the fleet yet")
    return router


def _wait(args: dict[str, Any]) -> float:
    """The ``wait`` a request gives the router: the caller's, who knows how
    long it waits for the answer (crewletctl's crewlet.ctl.tasks.ESTATE_TIMEOUT).
    Not "timeout": the word crewlet.ipc.call takes for its own wait, so no
    argument can be named so."""
    wait = args.get("wait")
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait <= 0:
        raise CommandError(f"wait must be a positive number of seconds, got {wait!r}")
    return float(wait)


async def estate_read(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Read the estate: ``query`` (a name of crewlet.estate.ops.QUERIES) with its
    ``args``, within ``wait`` seconds; answers what the query answers."""
    router = _router(node)
    query, query_args = args.get("query"), args.get("args") or {}
    if not isinstance(query, str) or not isinstance(query_args, dict):
        raise CommandError("estate_read takes a query name and its args (an object)")
    try:
        return await router.read(query, query_args, timeout=_wait(args)) or {}
    except (OpError, EstateError) as exc:
        raise CommandError(str(exc)) from None


async def estate_search(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Search the knowledge base for ``query`` (``limit`` hits, page.search's
    default if not given, within ``wait`` seconds): ``hits``, ``searched``
    (false: nobody could), ``node`` (who did), ``answers`` (each data
    node's answer when nobody could), ``coverage`` (shards searched of 64,
    the nodes missing) and ``partial``."""
    router = _router(node)
    # The estate's modules load when the estate is first asked.
    query, limit = args.get("query"), args.get("limit", SEARCH_DEFAULT)
    if not isinstance(query, str) or not query.strip():
        raise CommandError("query must be a non-empty string")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= SEARCH_MAX:
        raise CommandError(f"limit must be 1..{SEARCH_MAX}, got {limit!r}")
    try:
        answer = await router.search(query, limit, timeout=_wait(args))
    except (OpError, EstateError) as exc:
        raise CommandError(str(exc)) from None
    return {"hits": list(answer.hits), "searched": bool(answer.searched), "node": answer.node,
            "answers": dict(answer.answers or {}), "coverage": dict(answer.coverage),
            "partial": bool(answer.searched and answer.partial)}


async def evict(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Evict data node ``node``'s copy of the estate (``reason``), or with
    ``undo`` end its eviction: the ``status`` key ``evicted.<node>``."""
    js = node.fleet.js if node.fleet is not None else None
    if js is None:
        raise CommandError("this node has not joined the fleet yet")
    target = args.get("node")
    if not isinstance(target, str) or not NODE_ID_RE.match(target):
        raise CommandError(f"bad node id {target!r}: must match {NODE_ID_RE.pattern}")
    subject = bus.kv_subject(js, buckets.STATUS.name) + EVICTED_KEY + target
    try:
        if args.get("undo"):
            # A delete marker, as kv.delete writes it, published plainly so a leaf's is answered too.
            await js.publish(subject, b"", headers={"KV-Operation": "DEL"})
            log.event("node_eviction_undone", node=target)
            return {"node": target, "evicted": False}
        reason = args.get("reason") or "evicted by the operator"
        if not isinstance(reason, str):
            raise CommandError("reason must be a string")
        view = _router(node).view
        copies = view.data_nodes()
        # A copy is known by a live data node's presence or by its applier's record
        # (a node that is down now: evicting it before it comes back is the point).
        if target not in {c.id for c in copies} and view.record(target) is None:
            # Never an eviction of a copy the fleet does not know: a typo would sit in the
            # bucket for ever, waiting for a node of that name.
            raise CommandError(f"no copy of the estate is known on node {target!r}", code="not_found")
        # The eviction gate: never the last copy in service (crewlet/coord/capacity.py),
        # unless the operator says so (a copy serving wrong rows is worse than none).
        refused = capacity.eviction_refused(copies, target)
        if refused is not None and not args.get("force"):
            raise CommandError(f"eviction refused: {refused}; --force evicts it all the same")
        by = args.get("by") if isinstance(args.get("by"), str) else f"crewletctl@{node.cfg.node.id}"
        record = {"reason": reason, "at": time.time(), "by": by}
        await js.publish(subject, json.dumps(record).encode())
    except CommandError:
        raise
    except Exception as exc:  # the broker unanswered or refusing: say so, do not claim it is done
        raise CommandError(f"could not write {EVICTED_KEY}{target} to the status bucket: "
                           f"{type(exc).__name__}: {exc}") from None
    log.event("node_evicted", "warning", node=target, reason=reason)
    return {"node": target, "evicted": True, "reason": reason}


async def drain(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """Drain node ``node`` (this one when not given): the ``status`` key
    ``drain.<node>`` (:mod:`crewlet.coord.drain`), its running turns given
    ``deadline`` seconds (Tier A ``fleet.drain_deadline`` when not given);
    with ``undo``, undrain it. ``by`` names who asked (the API's token)."""
    js = node.fleet.js if node.fleet is not None else None
    if js is None:
        raise CommandError("this node has not joined the fleet yet")
    target = args.get("node") or node.cfg.node.id
    if not isinstance(target, str) or not NODE_ID_RE.match(target):
        raise CommandError(f"bad node id {target!r}: must match {NODE_ID_RE.pattern}")
    by = args.get("by") or f"crewletctl@{node.cfg.node.id}"
    if not isinstance(by, str):
        raise CommandError("by must be a string")
    subject = bus.kv_subject(js, buckets.STATUS.name) + drains.KEY + target
    live = node.fleet.holders is not None and node.fleet.holders.get(f"node.{target}") is not None
    ordered = target in node.fleet.drains.orders
    if not live and not ordered:
        # Never a drain order for a node the fleet does not know: a typo would
        # sit in the bucket for ever, waiting for a node of that name.
        raise CommandError(f"no node {target!r} is up in the fleet (nor drained)", code="not_found")
    if args.get("undo"):
        _undrain_refused(node, target)
        try:
            await js.publish(subject, b"", headers={"KV-Operation": "DEL"})
        except Exception as exc:
            raise CommandError(f"could not delete {drains.KEY}{target} from the status bucket: "
                               f"{type(exc).__name__}: {exc}") from None
        log.event("node_undrain_ordered", node=target, by=by)
        return {"node": target, "draining": None}
    deadline = args.get("deadline")
    try:
        order = drains.new(node.cfg.fleet.drain_deadline if deadline is None else deadline, by)
    except drains.BadOrder as exc:
        raise CommandError(str(exc)) from None
    try:
        await js.publish(subject, order.record())
    except Exception as exc:  # the broker unanswered or refusing: say so, do not claim it is done
        raise CommandError(f"could not write {drains.KEY}{target} to the status bucket: "
                           f"{type(exc).__name__}: {exc}") from None
    log.event("node_drain_ordered", "warning", node=target, by=by, deadline=order.deadline)
    return {"node": target, "draining": order.presence()}


async def secret(node: "Node", args: dict[str, Any]) -> dict[str, Any]:
    """The fleet's secrets (:mod:`crewlet.vault`). ``action``: ``set``
    (``name``, ``value``, ``grace`` seconds the replaced version is still
    accepted, ``by``), ``remove`` (``name``) or ``list``. A value is taken,
    sealed and stored; it is never answered nor logged (crewletd keeps it
    only among the values it redacts)."""
    js = node.fleet.js if node.fleet is not None else None
    if js is None:
        raise CommandError("this node has not joined the fleet yet")
    action = args.get("action")
    by = args.get("by") or f"crewletctl@{node.cfg.node.id}"
    company = (node.fleet.company or {}).get("company")
    try:
        keys = vault.Keys.of(node.cfg)
    except (OSError, ValueError) as exc:
        if action == "set":
            raise CommandError(f"the vault key cannot be read on this node: {exc}") from None
        keys = None  # listing and removing need none
    try:
        if action == "set":
            value = args.get("value")
            record = await vault_store.put(js, keys, args.get("name"), value, by=str(by),
                                           grace=args.get("grace"))
            redaction.learn([value])  # a child that says it back is redacted from now on
            log.event("secret_set", "warning", secret=record.name, version=record.version, by=record.by,
                      key=record.sealed["key"])
            return {"secret": record.listing(keys)}
        if action == "remove":
            name = vault_store.check_name(args.get("name"))
            if not await vault_store.remove(js, name):
                raise CommandError(f"no secret {name!r} is set", code="not_found")
            log.event("secret_removed", "warning", secret=name, by=by)
            return {"removed": name, "named_by": vault_store.named_by(company).get(name, [])}
        if action == "list":
            named = vault_store.named_by(company)
            shown = []
            for record in await vault_store.records(js):
                shown.append({**record.listing(keys), "named_by": named.pop(record.name, [])})
            return {"secrets": shown, "missing": [{"name": k, "named_by": v} for k, v in sorted(named.items())],
                    "key": keys.sealing_id if keys is not None else None}
    except vault_store.BadSecret as exc:
        raise CommandError(str(exc)) from None
    except CommandError:
        raise
    except Exception as exc:  # the broker unanswered: say so, never claim it is done
        raise CommandError(f"the secrets bucket did not answer: {type(exc).__name__}: {exc}") from None
    raise CommandError(f"unknown action {action!r}: set, remove or list")


def _undrain_refused(node: "Node", target: str) -> None:
    """A drained node of another protocol than the nodes serving is not put
    back to work: the fleet would mix protocols (upgrade it first)."""
    holders = node.fleet.holders if node.fleet is not None else None
    if holders is None:
        return
    nodes = {k.removeprefix("node."): o.info for k, o in holders.of("node.").items()}
    mine = (nodes.get(target) or {}).get("protocol")
    serving = {n: info.get("protocol") for n, info in nodes.items()
               if n != target and drains.draining(info) is None}
    differ = sorted(f"{n} ({p})" for n, p in serving.items() if p != mine)
    if mine is not None and differ:
        raise CommandError(f"undrain refused: {target} speaks protocol {mine}, the nodes serving speak "
                           f"another: {', '.join(differ)}; upgrade {target} first")


# Mailbox infos asked at once by `seats`.
SEATS_PARALLEL = 32
# How long `seats` waits for a seat's last turn from the estate.
SEAT_TURN_WAIT = 5.0

COMMANDS: dict[str, Callable[["Node", dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "status": status,
    "children": children,
    "company": company,
    "restart": restart,
    "stop": stop,
    "send": send,
    "seats": seats,
    "dlq": dlq,
    "outbox": outbox_,
    "estate_read": estate_read,
    "estate_search": estate_search,
    "evict": evict,
    "drain": drain,
    "secret": secret,
}


async def serve(node: "Node", sock: zmq.asyncio.Socket) -> None:
    """Answer requests on the bound ROUTER *sock* until cancelled."""
    while True:
        frames = await sock.recv_multipart()
        asyncio.create_task(_answer(node, sock, frames))


async def _answer(node: "Node", sock, frames: list[bytes]) -> None:
    envelope, payload = frames[:-1], frames[-1]
    try:
        req = ipc.unpack(payload)
        op = req.get("op")
    except Exception:
        req, op = {}, None
    reply: dict[str, Any] = {"id": req.get("id")}
    command = COMMANDS.get(op)  # type: ignore[arg-type]
    if command is None:
        reply.update(ok=False, error=f"unknown command {op!r}; known: {', '.join(COMMANDS)}")
    elif isinstance(req.get("deadline"), (int, float)) and req["deadline"] < time.time():
        reply.update(ok=False, error="deadline passed before the request was read")
    else:
        try:
            reply.update(ok=True, result=await command(node, req.get("args") or {}))
        except CommandError as exc:
            reply.update(ok=False, error=str(exc))
            if exc.code is not None:
                reply["code"] = exc.code
        except Exception as exc:  # a bug: say so to the caller and in the log
            log.event("control_command_failed", "error", op=op, error=repr(exc))
            reply.update(ok=False, error=f"internal error: {exc!r}")
    await sock.send_multipart([*envelope, ipc.pack(reply)])
