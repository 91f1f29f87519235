"""Consumer groups: every durable consumer the code creates, and who may attach to it.

A durable consumer is a group: whichever process attaches to it is handed
the next message nobody acked, wherever the last one went. So a node that
holds no data (reference, "A node that holds no data") must never attach to
a group whose handler needs the estate: it would answer its share of the
messages from nothing. Which groups those are is this one table, and
``tests/unit/test_groups.py`` holds it against the code in both directions:
every row is used, and every durable consumer the code creates is named by
:func:`durable` from a row here.

==========  ====================  ======  ============  =============================================
row         consumer (durable)    stream  needs estate  who attaches
==========  ====================  ======  ============  =============================================
MAILBOX     ``inbox-<seat>``      AGENTS  no            the holder of the seat's lease (seats role)
CUSTODY     ``custody``           EVENTS  yes           data nodes (each turn event kept by one)
NOTIFY      ``notify``            NOTIFY  no            any node (ingress; seats where no ingress runs)
SENDER      ``sender``            OUTBOX  no            the holder of ``duty.sender`` (workers role)
==========  ====================  ======  ============  =============================================

A name with a ``<param>`` placeholder is a family of consumers, one per
value (one mailbox per seat); :func:`durable` fills it in. Ephemeral
(ordered) consumers, such as the applier's reading of the ``ESTATE`` log,
are nobody's group and are not in the table.

A new group is a new row (and a constant naming it), then
``durable(ROW, ...)`` where the consumer is created;
:func:`check_attach` where a process is about to attach refuses, by name, a
node whose roles do not fit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

# The role every group whose handler reads or writes the estate demands:
# only a data node holds a copy (reference, "Every data node is a full replica").
DATA_ROLE = "data"

_PLACEHOLDER = re.compile(r"<([a-z_]+)>")


class GroupRefused(Exception):
    """A node may not attach to a group; the message names the group, the roles and why."""


@dataclass(frozen=True)
class Group:
    name: str           # the durable consumer's name; may hold one <param> placeholder
    stream: str         # the stream it consumes
    needs_estate: bool  # its handler reads or writes the estate: data nodes only
    attach: str         # who attaches, in words
    why: str            # why the group exists and why that rule
    role: str | None = None  # a role a node must run to attach (besides DATA_ROLE when needs_estate)

    @property
    def params(self) -> tuple[str, ...]:
        """The placeholders of :attr:`name` (``("seat",)`` for ``inbox-<seat>``)."""
        return tuple(_PLACEHOLDER.findall(self.name))

    def pattern(self) -> re.Pattern[str]:
        """A regex matching every consumer name of this group."""
        parts = _PLACEHOLDER.split(self.name)
        # split() alternates literal text and placeholder names.
        regex = "".join(re.escape(p) if i % 2 == 0 else r"(?P<%s>[^.*>\s]+)" % p
                        for i, p in enumerate(parts))
        return re.compile(f"^{regex}$")


MAILBOX = Group(
    name="inbox-<seat>", stream="AGENTS", needs_estate=False,
    attach="the holder of the seat's lease (seats role)",
    why="a seat's mail waits here until the node that holds the seat's lease works it; the "
        "turn reaches the estate through the router, so a node without data may hold it",
    role="seats")

CUSTODY = Group(
    name="custody", stream="EVENTS", needs_estate=True,
    attach="data nodes",
    why="each turn event is kept in exactly one data node's event log; a node without a copy "
        "would take its share of the events and keep them nowhere",
    role=DATA_ROLE)

NOTIFY = Group(
    name="notify", stream="NOTIFY", needs_estate=False,
    attach="any node: the ingress role runs it, and on a node without ingress (a node "
           "without data) the seats role",
    why="a stored webhook delivery becomes mail to the seat it was routed to; that needs the "
        "mailboxes only, so any node may, stateless or not")

SENDER = Group(
    name="sender", stream="OUTBOX", needs_estate=False,
    attach="the holder of the sender duty's lease (workers role)",
    why="notifications go out through one sender fleet-wide, so the rate stays exact and a "
        "notification is claimed once; it needs the claims and rate buckets and SMTP, not the estate",
    role="workers")

GROUPS: tuple[Group, ...] = (MAILBOX, CUSTODY, NOTIFY, SENDER)


def durable(group: Group, **params: str) -> str:
    """The consumer name of *group* for *params*: ``durable(MAILBOX, seat="cto") == "inbox-cto"``.

    ValueError when a placeholder is missing or unknown, or a value could not
    be a consumer name (empty, or holding ``.``, ``*``, ``>`` or whitespace).
    """
    wanted = set(group.params)
    if set(params) != wanted:
        raise ValueError(f"group {group.name} takes {', '.join(sorted(wanted)) or 'no parameters'}, "
                         f"not {', '.join(sorted(params)) or 'none'}")
    name = group.name
    for key, value in params.items():
        if not isinstance(value, str) or not value or re.search(r"[.*>\s]", value):
            raise ValueError(f"bad {key} for group {group.name}: {value!r}")
        name = name.replace(f"<{key}>", value)
    return name


def of_consumer(stream: str, name: str) -> Group | None:
    """The group consumer *name* on *stream* belongs to; None if it is none of ours."""
    for group in GROUPS:
        if group.stream == stream and group.pattern().match(name):
            return group
    return None


def may_attach(group: Group, roles: Iterable[str]) -> bool:
    """Whether a node running *roles* may attach to *group*."""
    roles = set(roles)
    if group.needs_estate and DATA_ROLE not in roles:
        return False
    return group.role is None or group.role in roles


def check_attach(group: Group, roles: Iterable[str]) -> None:
    """Raise :class:`GroupRefused` unless a node running *roles* may attach to *group*."""
    roles = sorted(set(roles))
    if may_attach(group, roles):
        return
    need = "holds no estate copy" if group.needs_estate and DATA_ROLE not in roles \
        else f"does not run the {group.role} role"
    raise GroupRefused(f"a node with roles {', '.join(roles) or 'none'} may not attach to consumer group "
                       f"{group.name} on {group.stream}: it {need}; attaches: {group.attach} ({group.why})")
