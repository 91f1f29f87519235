"""Who may write what to the estate: each op's origin, and the kinds it may carry.

The broker knows who published a message only by the subject its user was
allowed to publish on (:mod:`crewlet.permissions`): a header or a field of
the op is whatever the publisher wrote. So every way into the estate names
its **origin** in its subject, each role's broker user may publish only on
its own, and an applier refuses an op whose kind does not fit the origin it
arrived from (DESIGN §14: broker rights as defence in depth). A stolen
password of one role then writes at most what that role writes.

The origin is the broker user a process connected as (:func:`of_connection`:
the role's child name, :mod:`crewlet.credentials`); a connection as
``crewlet`` (crewletd, crewletctl), or to a broker that is not the node's
own (``stream.type: nats``, whose users are the operator's), is the
**operator** and keeps every right.

Two ways in
-----------
**The log** (``ESTATE``): ``estate.ops`` is the appliers' own subject (and
the operator's); an applier publishes there only ops it checked, as below.
``estate.ops.seats.<node>`` is the seats role of node ``<node>``: a seat's
fence and its turn records go to the log straight, without asking an
applier (:mod:`roles.seats.turns`, through
:meth:`crewlet.estate.router.Router.to_log`; the hot path of every turn),
once every data node reads that subject (Mixed versions, below); so do its
tools' and conversation turns' writes (:data:`SEAT_WRITES`) on a data node
whose copy is in service (:meth:`crewlet.estate.router.Router.write`), once
every data node applies them there (:func:`crewlet.estate.log.reads_writes`).

**A request** to a data node's applier (:mod:`crewlet.estate.wire`):
``estate.req.<data node>.<origin>.<asking node>``. Reads are open to every
origin; a write's op must fit the table.

=================  =========================  ====================================================
origin             on the log                 writes it may ask for
=================  =========================  ====================================================
``crewlet``        ``estate.ops``: every kind every kind (crewletd, crewletctl)
``data_applier``   ``estate.ops``: every kind none: it is the one that answers
                   (the requests it checked)
``seats``          ``estate.ops.seats.<n>``:  a seat's tools (:mod:`crewlet.agent.estate_tools`,
                   ``seat.fence``,            :mod:`crewlet.agent.file_tools`): ``task.create``,
                   ``turn.record``,           ``task.update``, ``task.comment``, ``page.write``,
                   ``turn.records``, and the  ``file.register``, ``diary.write``; a conversation
                   writes it may ask for      run's turn (:mod:`crewlet.conversations.turn`):
                   (:data:`SEAT_WRITES`)      ``conversation.message``, ``approval.request``,
                                              ``run.update``; and what it publishes to the log,
                                              asked for while an older applier cannot read its
                                              subject (below)
``ingress``        none                       the API (:mod:`roles.ingress.api`): ``task.create``,
                                              ``task.update``, ``task.comment``, ``page.write``,
                                              ``file.register``, ``file.delete``,
                                              ``conversation.create``; a run's driver
                                              (:mod:`crewlet.conversations.driver`): ``run.create``,
                                              ``run.update``, ``conversation.rollback``,
                                              ``approval.decide``; the skills API
                                              (:mod:`roles.ingress.api.skills`):
                                              ``skill.write``, ``skill.retire``
``workers``        none                       the maintenance duty's ``turn.trim``; the
                                              learning passes' ``episode.compact``,
                                              ``skill.draft``, ``approval.decide``
=================  =========================  ====================================================

Besides the kind:

* a ``seats`` op is a seat's: it carries its seat and fencing token (an op
  without one is the operator's, which no seat writes), so the fence and the
  fleet's verdict on the token (:mod:`roles.data_applier.grants`) hold it to a
  lease — but ``turn.records`` (:data:`NODE_KINDS`), the records of many
  seats' turns, whose every record carries its seat and token and is held to
  them alone; an ``ingress`` or ``workers`` op is the operator's and carries none
  (neither may write as a seat);
* an op names the node that issued it (``node``, which rows record as
  ``operator@<node>``): it must be the node in the subject, which the broker
  user of that node alone may publish on — so the seats of one node can
  neither write as another node nor have the fleet's verdict judge another
  node's lease for them.

Refused, on the log: the entry is passed over — not applied, no outcome kept
under its id (a forger must not claim an id a real op will use later), the
fences untouched — and the copy's ``applied`` moves past it like any other;
every copy reads the same subject, so every copy passes over the same
entries. It is logged (``estate_op_refused``, warning) and counted (the
applier's ``refused`` stat). Refused, as a request: ``bad_request`` naming
the origin and the kind, nothing published (``estate_request_refused``).

Mixed versions
--------------
An older node (protocol 1) asks on ``estate.req.<data node>`` without an
origin and publishes its seats' ops on ``estate.ops``; an applier still
answers and applies those as before (:data:`LEGACY`: every kind; a role of
a node of this version may publish on neither: its broker refuses). The
other way round, an older applier follows ``estate.ops`` alone: a seats
entry is a gap to it (it starts its follow again, and its copy misses the
entry). So the seats of this version publish on their subject only while
every live data node's presence says a protocol that reads it
(:func:`crewlet.estate.log.reads_seats`); until then they ask an applier
of this version for the same ops (:meth:`crewlet.estate.router.Router.to_log`),
which checks them as it would on their subject (:func:`may_ask`: an origin
may ask for what it may publish itself) and publishes them on
``estate.ops``, which every applier reads. Likewise an applier of protocol 3
passes over the seats' own writes (:data:`SEAT_WRITES`) on their subject, so
they go there only while every live data node says protocol 4 or later
(:func:`crewlet.estate.log.reads_writes`), and are asked for until then. See
the permissions module's note on upgrading.

``tests/unit/test_estate_origins.py`` holds this table against the code in
both directions: every kind a role's code writes is in its row, and every
kind in a row is written somewhere in that role's code. A role that starts
writing a new kind must be given it here, or every applier refuses it.
"""

from __future__ import annotations

from typing import Any

from crewlet.credentials import CREWLET_USER, USERS
from crewlet.estate.ops import KINDS, Op

# An origin is the broker user its process connects as (crewlet.credentials).
OPERATOR = CREWLET_USER       # crewletd and crewletctl: every right
APPLIER, SEATS, INGRESS, WORKERS = "data_applier", "seats", "ingress", "workers"
ORIGINS = USERS
assert set(ORIGINS) == {OPERATOR, APPLIER, SEATS, INGRESS, WORKERS}

# A request or a log entry from a node older than origins: no origin in its
# subject. Answered and applied as before (every kind): see the module doc.
LEGACY = "legacy"

# The writes of a seat's turn: asked of an applier by a node without a copy
# in service, published straight on a data node whose copy serves
# (crewlet.estate.router, "Straight to the log").
SEAT_WRITES = frozenset({
    # a seat's tools (crewlet.agent.estate_tools, crewlet.agent.file_tools)
    "task.create", "task.update", "task.comment", "page.write", "file.register", "diary.write",
    # a conversation run's turn (crewlet.conversations.turn)
    "conversation.message", "approval.request", "run.update"})

# What each origin publishes on the log straight (its own subject); the
# operator's and the appliers' subject, estate.ops, takes every kind.
LOG_KINDS: dict[str, frozenset[str]] = {
    SEATS: frozenset({"seat.fence", "turn.record", "turn.records"}) | SEAT_WRITES,
}

# The kinds of the writes each origin asks an applier for (the operator: all).
ASKS: dict[str, frozenset[str]] = {
    SEATS: SEAT_WRITES,
    INGRESS: frozenset({
        # the API (roles.ingress.api.estate, .files, .conversations)
        "task.create", "task.update", "task.comment", "page.write", "file.register", "file.delete",
        "conversation.create",
        # a conversation run's driver (crewlet.conversations.driver)
        "run.create", "run.update", "conversation.rollback", "approval.decide",
        # the skills API (roles.ingress.api.skills); a promotion's approval.decide is above
        "skill.write", "skill.retire"}),
    WORKERS: frozenset({
        "turn.trim",                     # the maintenance duty (roles.workers.duties.maintenance)
        # the learning passes (roles.workers.duties.learning)
        "episode.compact", "skill.draft", "approval.decide"}),
    APPLIER: frozenset(),
}

# The code of the outcome of a log entry passed over for its origin (its
# refusal is kept nowhere: crewlet.estate.apply, step 0).
WRONG_ORIGIN = "wrong_origin"

# Whether an origin's ops are a seat's (True: carry a seat and token) or the
# operator's (False: carry none): every origin whose ops are judged beyond
# their kind (the operator's and an older node's are not; the appliers' ask
# for nothing).
SEATED: dict[str, bool] = {SEATS: True, INGRESS: False, WORKERS: False}

assert all(k in KINDS for kinds in (*LOG_KINDS.values(), *ASKS.values()) for k in kinds)


def of_connection(nc: Any) -> str:
    """The origin of what a process sends over *nc*: the role whose broker
    user it connected as; the operator for ``crewlet``, for a connection
    without a user of ours (a broker that is not the node's own), or none."""
    options = getattr(nc, "options", None)
    user = options.get("user") if isinstance(options, dict) else None
    return user if user in ORIGINS else OPERATOR


def _names(kinds: frozenset[str]) -> str:
    return ", ".join(sorted(kinds)) or "none"


def may_ask(origin: str) -> frozenset[str]:
    """The kinds *origin* may ask an applier to write: its row of
    :data:`ASKS`, and what it publishes to the log itself
    (:data:`LOG_KINDS`) — the way those reach the log while an older applier
    cannot read its subject (module doc); no right it lacks otherwise.
    Raises KeyError for an origin that is not a role's."""
    return ASKS[origin] | LOG_KINDS.get(origin, frozenset())


# Kinds of a seated origin that are its node's, not one seat's: each record
# of a turn.records op carries its own seat and token, and is held to them
# one by one (crewlet.estate.apply._turn_records).
NODE_KINDS = frozenset({"turn.records"})


def _fits(origin: str, node: str | None, op: Op) -> str | None:
    """What is wrong with *op* from *origin* on *node*, besides its kind (None: nothing)."""
    if op.kind in NODE_KINDS:
        if not SEATED[origin]:
            return f"{op.kind} is the seats' ({origin} writes as no seat)"
    elif SEATED[origin] and op.seat is None:
        return f"a {origin} op is a seat's: it carries its seat and fencing token ({op.kind} carries none)"
    if not SEATED[origin] and op.seat is not None:
        return f"a {origin} op is the operator's: it writes as no seat ({op.kind} names seat {op.seat})"
    if op.node != node:
        return f"a {origin} op of node {node} names node {op.node!r}"
    return None


def log_refusal(origin: str, node: str, op: Op) -> str | None:
    """Why *op*, found on the log subject of *origin* for node *node*, is
    refused (None: it is applied). *origin* is one that has a subject of
    its own (:data:`LOG_KINDS`: the seats); the operator's subject takes
    every op and is not judged (:mod:`crewlet.estate.apply`)."""
    allowed = LOG_KINDS[origin]
    if op.kind not in allowed:
        return (f"{op.kind} may not be published by {origin} to the log "
                f"({origin} publishes there: {_names(allowed)})")
    return _fits(origin, node, op)


def request_refusal(origin: str, node: str | None, op: Op) -> str | None:
    """Why a write of *op* asked for by *origin* from node *node* is refused
    (None: it may be written). The operator, and an older node's request
    (:data:`LEGACY`, which names no node), may ask for any; every other
    origin is a role's (the subject names one of :data:`ORIGINS`) and names
    its node."""
    if origin in (OPERATOR, LEGACY):
        return None
    allowed = may_ask(origin)
    if op.kind not in allowed:
        return f"{origin} may not write {op.kind} (what {origin} asks for: {_names(allowed)})"
    return _fits(origin, node, op)
