"""What each user of the embedded broker may publish and subscribe to.

Every role connects to its node's broker as a user of its own, named as the
role's child (:mod:`crewlet.credentials`), and the broker lets it publish and
subscribe only to the subjects :func:`grants` lists for it; anything else is
refused by the broker, which says ``Permissions Violation`` to the client
and logs it (a ``Publish Violation`` or ``Subscription Violation`` line of
the ``broker`` child naming the user and the subject). A JetStream call through a refused subject goes unanswered: the
caller times out. crewletd itself and ``crewletctl`` are the ``crewlet``
user and keep every right: crewletd's fleet child makes the streams and
buckets, claims the node's presence, applies companies, creates mailboxes;
crewletctl is the operator's tool (evict, dlq requeue, apply).

The JetStream API is subjects too: ``$JS.API.<verb>.<stream>…``, and from a
leaf ``$JS.<domain>.API.…`` (both forms are allowed alike), so what a role
may do to a stream is which verbs it may publish under that stream's name.
A KV bucket is the stream ``KV_<bucket>``; a write to one of its keys is a
publish to ``$KV.<bucket>.<key>`` (from a leaf, under the domain's API
prefix). The verbs, grouped by what they let a role do to one stream
(:data:`ABILITIES`):

=========  ==============================================================
look       its info, a message by sequence or subject (a KV read), its
           consumers' names and info
fetch      take messages from a consumer that exists, ack or NAK them
follow     create consumers (an ordered reader, a KV watch, a durable
           group of its own), fetch from them, answer flow control
forget     delete a consumer (a KV watch deletes its own when it closes)
make       create the stream, or update its config: the idempotent ensure
           a role does where it may come up before crewletd's fleet child
           has made the stream
drop       delete one message (a dead letter out of a mailbox, a requeued
           one out of ``DLQ``)
rewind     reset a consumer to its ack floor (a seat's holder taking back
           what the broker handed a process of its node that then died)
purge      purge a subject's messages (the mailbox retirement duty)
=========  ==============================================================

Deleting a stream, and purging or dropping anything but the above, is
nobody's but ``crewlet``'s. What the roles may do, in the order it matters:

``data_applier``
    The only role that writes the ``grants`` bucket (the verdicts on fencing
    tokens that every estate copy follows, :mod:`roles.data_applier.grants`)
    and the only one that answers estate requests: it alone may subscribe
    to ``estate.req.<its node>.>`` (and an older node's bare
    ``estate.req.<its node>``), and it answers them (``allow_responses``).
    Publishes ops to the estate log's own subject ``estate.ops`` (only ops
    it checked against their origin, below); follows ``ESTATE``
    (ordered consumer) and ``EVENTS`` (custody's durable); writes its own
    ``status`` key ``estate.<node>``; reads ``leases`` (the evidence a
    fence is judged on). Makes ``ESTATE``, ``status``, ``grants`` and
    ``leases`` when they are missing (a data node may be the fleet's first).
``seats``
    Publishes to the estate log on its own node's subject only,
    ``estate.ops.seats.<node>``: a seat's fence and its turn records go
    straight to the log (:mod:`roles.seats.turns`; routing them through the
    applier's write request would cost every turn a round trip), each
    carrying the seat's lease token, which every copy checks — and every
    copy refuses any other kind there, or an op of another node
    (:mod:`crewlet.estate.origins`). Never ``estate.ops``: no operator op.
    Asks an applier (``estate.req.*.seats.<node>``) for a seat's writes
    only. Mail to any seat (the send tool), dead letters, turn events, a
    conversation turn's events (``runs.>``: the turn runs where the seat is
    held, :mod:`crewlet.conversations.sink`); writes ``leases`` keys
    ``seat.*`` and its node's ``life.<node>`` only — not ``node.*`` (the
    presence is crewletd's), ``duty.*``, ``conv.*`` nor another node's
    ``life.*`` — the ledger, budgets and cooldowns; never ``config`` or
    ``grants``. Fetches from the mailboxes but cannot create, delete or
    purge one. Reads the ``secrets`` bucket (its providers' API keys). On a
    node without ingress, takes its share of the ``NOTIFY`` group
    (deliveries made mail; :mod:`crewlet.groups`).

    Why ``seat.*`` cannot be narrowed to this node's seats: a seat's lease
    key is the seat's own, ``seat.<seat>``, one key fleet-wide that any node
    running seats may claim (a KV create) when the seat is free, and its
    holder's node is in the value, not the key; which seats a node holds
    changes with every sweep. So a seats user may write any seat's lease,
    as the role must. What holds the estate against a forged one is the
    fence: a token that would raise a seat's fence is judged by the applier
    against the leases (:mod:`roles.data_applier.grants`) for the node the
    op names, and the op's node is the node of the subject it came on.
``ingress``
    Never the estate log, never ``grants``; asks an applier
    (``estate.req.*.ingress.<node>``) for the API's and a run driver's
    writes only (the operator's: none as a seat). Of ``leases``, only
    ``conv.*``: a conversation run's driver
    lease (the API's runs and the session runner,
    :mod:`crewlet.conversations.lease`). Mail (the API, a requeue, a
    webhook's mail), webhook deliveries (``notify.>``) and their dedupe
    (``claims``), the ``config`` bucket (a company applied through the API,
    which the API token's ``admin`` scope guards); reads mailboxes and dead
    letters, drops a requeued dead letter. Publishes a run's own events
    (``runs.>``: its start, an interruption) and follows a run's events
    (an ordered consumer on ``RUNS``, deleted when the reader goes). Reads
    the ``secrets`` bucket (webhook signing secrets).
``workers``
    Writes ``leases`` keys ``duty.*`` only; the mailbox retirement duty
    deletes a retired seat's mailbox and purges worked mail. Never the
    estate log; asks an applier (``estate.req.*.workers.<node>``) for the
    maintenance duty's ``turn.trim`` only.

The ``secrets`` bucket (:mod:`crewlet.vault`) is read by ``seats``,
``ingress`` and ``workers`` only, the roles that use a secret (providers'
keys, webhook secrets, the reconcile duty's GitHub token), and written by
``crewlet`` alone; ``data_applier`` cannot read a sealed record at all.

What each origin may write to the estate
----------------------------------------
The broker cannot read an op; it can only refuse a subject. So each way
into the estate names its origin (the role) and node in its subject, each
role's user may publish on its own alone, and every applier checks that an
op fits the origin it arrived from (:mod:`crewlet.estate.origins`, which
holds the table; ``tests/unit/test_estate_origins.py`` holds it against
the code):

================  ================================  ===================================
role              publishes to the log               asks an applier to write
================  ================================  ===================================
``data_applier``  ``estate.ops``: what it checked    (it answers; it asks nobody)
``seats``         ``estate.ops.seats.<node>``:       a seat's: ``task.create``,
                  ``seat.fence``, ``turn.record``    ``task.update``, ``task.comment``,
                                                     ``page.write``, ``file.register``,
                                                     ``diary.write``,
                                                     ``conversation.message``,
                                                     ``approval.request``, ``run.update``
``ingress``       nothing                            the operator's: ``task.*``,
                                                     ``page.write``, ``file.register``,
                                                     ``file.delete``,
                                                     ``conversation.create``,
                                                     ``run.create``, ``run.update``,
                                                     ``conversation.rollback``,
                                                     ``approval.decide``
``workers``       nothing                            the operator's ``turn.trim``
``crewlet``       anything                           anything
================  ================================  ===================================

Reads (``estate.req.*.<role>.<node>`` too) are open to every role that asks.
An op refused on the log is passed over by every copy alike (logged
``estate_op_refused``, counted, never applied, no outcome kept); a write
request refused is answered ``bad_request`` (``estate_request_refused``).

**Mixed versions.** A node older than these subjects publishes its seats'
ops on ``estate.ops`` and asks on the bare ``estate.req.<node>``: an
applier of this version still applies and answers those as before (every
kind), and a role of this version's node may publish on neither (its broker
refuses). The other way round: an older applier reads only ``estate.ops``
and answers only the bare subject. So while any live data node reports an
older protocol (its presence), a newer node's seats do not publish on
``estate.ops.seats.<node>``: they send each fence and turn record as a write
request to an applier of this version, which checks it and publishes it on
``estate.ops`` (:meth:`crewlet.estate.router.Router.to_log`); once every
data node reports protocol 2 they publish straight. A newer node's request
to an older applier finds nobody on its subject and goes to the next data
node. Upgrading data nodes first still keeps the asking short.

A role's rights hold on its own node's broker, where it connects: on a leaf
node, the leaf's broker checks them, and what the leaf forwards to the
members travels as the leaf user (:mod:`crewlet.credentials`).

Every role subscribes only to its own inbox, ``_INBOX.<role>.<node>.>``
(:func:`inbox`; its replies and its consumers' deliveries come there), not
to every reply on the broker, and to the few core subjects it listens on.

Not narrowed, on purpose: which seats a role may mail or fetch from (every
``agents.inbox.<seat>`` is one wildcard) and which keys of the ledger,
budgets, cooldowns, claims and config it writes.

How this was drawn up: from the code (the subjects live in
:mod:`crewlet.estate.log`, :mod:`crewlet.estate.wire`, :mod:`crewlet.estate.origins`,
:mod:`crewlet.queue.jetstream`, :mod:`crewlet.queue.notify`,
:mod:`crewlet.coord.buckets`) and by running the whole-node tests, single
node and fleet (leaves included), with the permissions on: the broker
logged no violation. ``tests/integration/test_broker_permissions.py`` holds
the important refusals against a real node. A role that starts doing
something new on the broker must be given it here, or the broker refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from crewlet import outbox
from crewlet.conversations import lease as conversation_lease
from crewlet.conversations import runs
from crewlet.coord import buckets, duty_reports, fired
from crewlet.estate import log as estate_log
from crewlet.estate import wire
from crewlet.queue import jetstream as mail
from crewlet.queue import notify, post
from crewlet.skills import registry as skills_registry

# The JetStream API verbs of each ability, ``{s}`` the stream's name.
ABILITIES: dict[str, tuple[str, ...]] = {
    "look": ("STREAM.INFO.{s}", "STREAM.MSG.GET.{s}", "DIRECT.GET.{s}", "DIRECT.GET.{s}.>",
             "CONSUMER.NAMES.{s}", "CONSUMER.LIST.{s}", "CONSUMER.INFO.{s}.>"),
    "fetch": ("CONSUMER.MSG.NEXT.{s}.>",),
    "follow": ("CONSUMER.CREATE.{s}", "CONSUMER.CREATE.{s}.>", "CONSUMER.DURABLE.CREATE.{s}.>",
               "CONSUMER.MSG.NEXT.{s}.>"),
    "forget": ("CONSUMER.DELETE.{s}.>",),
    "make": ("STREAM.CREATE.{s}", "STREAM.UPDATE.{s}"),
    "drop": ("STREAM.MSG.DELETE.{s}",),
    "rewind": ("CONSUMER.RESET.{s}.>",),
    "purge": ("STREAM.PURGE.{s}",),
}
# Published to the reply subject of a message a consumer delivered (with
# fetch or follow): acks, NAKs, in-progress — several per message, which
# allow_responses (one answer per request) would refuse — and flow control.
CONSUMER_REPLIES = ("$JS.ACK.{s}.>", "$JS.FC.{s}.>")

LOOK = ("look",)
WATCH = ("look", "follow", "forget")  # a KV watch: an ordered consumer, deleted when closed


def kv(bucket: buckets.Bucket) -> str:
    return buckets.stream(bucket.name)


@dataclass(frozen=True)
class Grant:
    """What one role's user may do on the broker."""

    publish: tuple[str, ...] = ()              # subjects, core or a stream's
    streams: dict[str, tuple[str, ...]] = field(default_factory=dict)  # stream -> abilities
    # bucket -> the keys it writes (a pattern, or several)
    writes: dict[str, str | tuple[str, ...]] = field(default_factory=dict)
    subscribe: tuple[str, ...] = ()            # besides its inbox
    responds: bool = False                     # answers requests (allow_responses)
    # The files bucket (crewlet.objects.nats): write and read objects, purge a
    # put's own chunks (a failed or replaced put, a delete). Making the bucket is
    # crewletd's, at boot.
    files: bool = False


ANY = ">"  # every key of a bucket
# Seconds a role that answers requests (the applier) may take to answer one:
# the broker lets one answer through to a request's reply subject for this
# long. Longer than any estate request waits (wire.WRITE_WAIT).
ANSWER_WITHIN = 120


def estate_ask(role: str, node: str) -> str:
    """A request of *role* on node *node* to any data node's applier:
    ``estate.req.*.<role>.<node>``, its origin and node in the subject
    (:mod:`crewlet.estate.origins`), so the applier knows who asks."""
    return wire.subject("*", role, node)


EVENTS = mail.EVENTS_STREAM
NOTIFICATIONS = outbox.SUBJECT + ">"  # the notify tool, crewlet's notices (crewlet.outbox)
TURN_FEED = post.TURN_SUBJECT + ">"  # the live feed: crewlet.queue.post, send --wait
TURN_BATCHES = post.TURNS_SUBJECT + ">"  # the same records in batches: the ingress projection
RUN_EVENTS = runs.SUBJECT + ">"  # a conversation run's events (crewlet.conversations.runs)
DRIVER_LEASES = conversation_lease.KEY_PREFIX + ">"  # conv.<id>: a run's driver
SKILLS_CHANGED = skills_registry.CHANGED_SUBJECT  # a skill changed: every node's registry reads it again


def grants(node: str) -> dict[str, Grant]:
    """Each role's grant on the broker of node *node* (the user is the role's child name)."""
    return {
        "data_applier": Grant(
            # The log's own subject (every kind: ops it checked), and notices
            # (a copy out of service). Never a seats subject.
            publish=(estate_log.SUBJECT, NOTIFICATIONS, SKILLS_CHANGED),
            streams={
                # ensure_stream at every start: a data node may come up first.
                estate_log.STREAM: ("look", "follow", "make"),
                # custody's durable pull consumer (it waits for the stream, never makes it)
                EVENTS: ("look", "follow"),
                kv(buckets.STATUS): (*WATCH, "make"),
                kv(buckets.GRANTS): ("look", "make"),
                # The evidence a fence is judged on; the data nodes' presences
                # (which copy makes the snapshots).
                kv(buckets.LEASES): (*WATCH, "make"),
                kv(buckets.OBJECTS): LOOK,   # the snapshots the slot names
            },
            files=True,                      # snapshots: made here, and started from
            writes={buckets.STATUS.name: f"estate.{node}", buckets.GRANTS.name: ANY,
                    buckets.OBJECTS.name: "snapshots"},
            # Requests to this node's applier: each origin's, and an older
            # node's (the bare subject, crewlet.estate.wire).
            subscribe=wire.subjects(node),
            responds=True),
        "seats": Grant(
            publish=(
                # Straight to the log, on this node's seats subject only: a
                # seat's fence and its turn records (roles.seats.turns), each
                # carrying the seat's lease token; every applier refuses any
                # other kind there (crewlet.estate.origins).
                estate_log.seats_subject(node),
                mail.SUBJECT + ">",        # the send tool: mail to any seat
                mail.DLQ_SUBJECT + ">",    # dead letters
                TURN_FEED,                 # turn records for the live feed
                TURN_BATCHES,              # ... and in batches, for ingress
                RUN_EVENTS,                # a conversation turn's progress (its RunSink)
                NOTIFICATIONS,             # the notify tool; a dead letter's notice
                estate_ask("seats", node)),  # the seat's tools, a conversation turn's writes
            streams={
                # Fetch from the mailboxes crewletd made, ack; a dead letter is
                # dropped from the mailbox once copied to DLQ; a delivery lost
                # to a crash mid-fetch is taken back by a reset.
                mail.STREAM: (*LOOK, "fetch", "drop", "rewind"),
                kv(buckets.LEASES): WATCH,
                kv(buckets.STATUS): WATCH,   # the estate copies' state (the router)
                kv(buckets.LEDGER): LOOK,
                kv(buckets.BUDGETS): WATCH,
                kv(buckets.COOLDOWNS): WATCH,  # read before every provider request: watched
                runs.STREAM: LOOK,           # a request to stop a run (runs.request_cancel)
                kv(buckets.CONFIG): LOOK,    # the company revision a conversation run pinned
                kv(buckets.SECRETS): WATCH,  # its providers' API keys (crewlet.vault)
                # The NOTIFY group, on a node without ingress (roles.seats): stored
                # webhook deliveries made mail.
                notify.STREAM: (*LOOK, "follow"),
            },
            # Seat leases, and this node's seats process's life they are bound to.
            # seat.* (a seat's name has no dot): any seat's, as the module doc says why.
            writes={buckets.LEASES.name: ("seat.*", f"life.{node}"), buckets.LEDGER.name: ANY,
                    buckets.BUDGETS.name: ANY, buckets.COOLDOWNS.name: ANY},
            files=True,                      # the file tools
            # Mail wakes its seat; a conversation run's turn hears a request to stop it;
            # the skills registry hears of a changed skill.
            subscribe=(mail.SUBJECT + "*", RUN_EVENTS, SKILLS_CHANGED)),
        "ingress": Grant(
            publish=(
                mail.SUBJECT + ">",        # mail from the API, a webhook, a requeue
                notify.SUBJECT + ">",      # webhook deliveries, stored before they are answered
                RUN_EVENTS,                # a run's start and interruption, by its driver
                SKILLS_CHANGED,            # a skill written through the API
                estate_ask("ingress", node)),  # the API's writes, a run driver's
            streams={
                mail.STREAM: LOOK,          # mailbox state for the API and the dashboard
                mail.DLQ_STREAM: (*LOOK, "drop"),  # dead letters read; a requeued one dropped
                notify.STREAM: (*LOOK, "follow"),  # the NOTIFY group (notify.deliver)
                kv(buckets.CONFIG): (*WATCH, "make"),      # the control plane (apply via the API)
                kv(buckets.CLAIMS): LOOK,
                kv(buckets.LEASES): WATCH,
                kv(buckets.STATUS): WATCH,
                kv(buckets.LEDGER): LOOK,   # send --wait: was the trigger worked already
                # A run's stream, resumed on any node: an ordered consumer per
                # reader, deleted when it goes.
                runs.STREAM: WATCH,
                kv(buckets.SECRETS): WATCH,  # webhook signing secrets (crewlet.vault)
                # /v1/admin/capacity: the estate log's length and its first entry's
                # age, and the snapshots the slot names.
                estate_log.STREAM: LOOK,
                kv(buckets.OBJECTS): LOOK,
            },
            writes={buckets.CONFIG.name: ANY, buckets.CLAIMS.name: ANY,
                    buckets.LEASES.name: DRIVER_LEASES},
            files=True,                      # uploads and downloads through the API
            subscribe=(TURN_FEED, TURN_BATCHES)),  # send --wait; the live feed, in batches
        "workers": Grant(
            publish=(
                mail.SUBJECT + ">",        # the scheduler's ticks
                # turn.trim (maintenance), the learning passes' ops: through an applier
                estate_ask("workers", node)),
            streams={
                # The maintenance duty: a retired seat's mailbox is deleted
                # and its mail purged, worked mail trimmed.
                mail.STREAM: (*LOOK, "forget", "purge"),
                # The estate log's trim, below what every copy in service applied.
                estate_log.STREAM: (*LOOK, "purge"),
                kv(buckets.OBJECTS): LOOK,  # the newest snapshot: the trim never passes it
                kv(buckets.LEASES): WATCH,  # duty leases; the fleet shape reads node.*
                # The estate copies' state (the router); the scheduler's fired
                # records and the duties' reports.
                kv(buckets.STATUS): WATCH,
                kv(buckets.LEDGER): LOOK,   # a tick already worked
                # The sender: its durable on OUTBOX (made at boot; ensured again
                # as a backstop), the claims and outcomes, the rate valve.
                outbox.STREAM: (*LOOK, "follow", "make"),
                kv(buckets.CLAIMS): LOOK,
                kv(buckets.RATE): LOOK,
                kv(buckets.SECRETS): WATCH,  # the reconcile duty's GitHub token, the learning duty's API keys
                kv(buckets.COOLDOWNS): LOOK,  # the learning duty's provider calls: a cooling key waited for
            },
            files=True,                     # the collector removes what no file row names
            writes={buckets.OBJECTS.name: "collector",
                    buckets.LEASES.name: "duty.>",
                    buckets.STATUS.name: (fired.PREFIX + ">", duty_reports.PREFIX + ">"),
                    buckets.CLAIMS.name: outbox.CLAIM_PREFIX + ">",
                    buckets.RATE.name: ANY,
                    buckets.COOLDOWNS.name: ANY}),  # a 429 the learning duty met cools the key fleet-wide
    }


def inbox(role: str, node: str) -> str:
    """The inbox prefix of role *role*'s connection on node *node*: its
    replies and consumer deliveries come there, and only it may subscribe."""
    return f"_INBOX.{role}.{node}"


def api_prefixes(domain: str) -> tuple[str, ...]:
    """The JetStream API's prefixes: plain, and through the fleet's domain (a leaf's)."""
    return ("$JS.API", f"$JS.{domain}.API")


def subjects(grant: Grant, *, role: str, node: str, domain: str,
             files_bucket: str = "files") -> tuple[list[str], list[str]]:
    """(publish allow list, subscribe allow list) of *grant*; *files_bucket*
    is the node's ``files.bucket``."""
    publish = list(grant.publish)
    prefixes = api_prefixes(domain)
    streams = dict(grant.streams)
    if grant.files:
        # An object's chunks and its meta are publishes to $O.<bucket>.…
        # (through a leaf's domain too); reads are direct gets and meta gets.
        streams[f"OBJ_{files_bucket}"] = ("look", "purge")
        publish += [f"$O.{files_bucket}.>", f"$JS.{domain}.API.$O.{files_bucket}.>"]
    for stream, abilities in streams.items():
        for ability in abilities:
            for verb in ABILITIES[ability]:
                publish += [f"{p}.{verb.format(s=stream)}" for p in prefixes]
        if "fetch" in abilities or "follow" in abilities:
            publish += [r.format(s=stream) for r in CONSUMER_REPLIES]
    for bucket, patterns in grant.writes.items():
        for keys in (patterns,) if isinstance(patterns, str) else patterns:
            publish += [f"$KV.{bucket}.{keys}", f"$JS.{domain}.API.$KV.{bucket}.{keys}"]
    subscribe = [inbox(role, node) + ".>", *grant.subscribe]
    return list(dict.fromkeys(publish)), list(dict.fromkeys(subscribe))
