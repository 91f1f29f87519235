"""Inside crewlet, each role may do on the broker only what it needs (crewlet.permissions).

One real node. The test reads its ``broker-users.json``, connects as each
role's user, and tries what that role must not do: write the ``grants``
bucket (the fence verdicts every copy follows), publish to the estate log,
write another role's leases, delete or purge a stream, answer estate
requests, read every reply on the broker. The broker refuses each one — the
client hears ``Permissions Violation`` — and nothing changed: the verdict is
not written, the log's last sequence and the streams are as they were. The
same connections do what the role is there for (``data_applier`` writes a
verdict), so the refusals are the permissions' and not a broken login; and
the node's own roles, connected as these users, run and log no violation.
"""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from crewlet import credentials, permissions
from crewlet.config import NodeConfig
from crewlet.conversations import runs
from crewlet.conversations.lease import Drivers
from crewlet.coord import buckets
from tests.conftest import wait_for
from tests.seats import node_url, read_nats

NODE = "perm"
MAX_EVENTS = NodeConfig().conversations.max_events
REFUSAL_WAIT = 0.5  # s: an answer that has not come by now was not going to


@pytest.fixture(scope="module")
def node():
    from tests.conftest import Nodes
    nodes = Nodes()
    try:
        n = nodes(node={"id": NODE})
        n.start()
        # Ready means the children run; crewletd makes the buckets and the
        # estate's log as it joins, which may still be under way.
        wait_for(lambda: _streams(n) >= {"KV_grants", "KV_leases", "ESTATE"}, 30,
                 what="crewlet's streams made")
        yield n
    finally:
        nodes.close()


class Client:
    """A connection as one role's user, keeping what the broker says back."""

    def __init__(self, node, user: str):
        self.url = credentials.client_url(node.config["stream"]["listen"], node.run_dir, user)
        self.user = user
        self.node_id = node.config["node"]["id"]
        self.errors: list[str] = []

    async def __aenter__(self) -> "Client":
        async def keep(exc: Exception) -> None:
            self.errors.append(str(exc).lower())

        self.nc = await nats.connect(self.url, connect_timeout=2, allow_reconnect=False, error_cb=keep,
                                     inbox_prefix=permissions.inbox(self.user, self.node_id))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.nc.close()

    async def refused(self, subject: str, data: bytes = b"x", *, request: bool = False,
                      named: str | None = None) -> bool:
        """Publish (or ask) on *subject*: True if the broker refused it (naming
        *named*, when the server maps the subject before it checks it)."""
        before = len(self.errors)
        if request:
            try:
                await self.nc.request(subject, data, timeout=REFUSAL_WAIT)
                return False  # answered: it went through
            except NatsTimeoutError:
                pass
        else:
            await self.nc.publish(subject, data)
        await self.nc.flush(timeout=2)
        return await _said(self.errors, before, f'publish to "{(named or subject).lower()}"')

    async def sub_refused(self, subject: str) -> bool:
        before = len(self.errors)
        sub = await self.nc.subscribe(subject)
        await self.nc.flush(timeout=2)
        refused = await _said(self.errors, before, f'subscription to "{subject.lower()}"')
        await sub.unsubscribe()
        return refused


async def _said(errors: list[str], before: int, what: str) -> bool:
    """Whether a permissions violation about *what* arrives (it follows the PONG closely)."""
    deadline = asyncio.get_running_loop().time() + REFUSAL_WAIT
    while True:
        if any("permissions violation" in e and what in e for e in errors[before:]):
            return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)


def _streams(node) -> set[str]:
    async def read(nc, js):
        return {s.config.name for s in await js.streams_info()}
    try:
        return read_nats(node_url(node), read)
    except Exception:
        return set()


def _state(node) -> dict:
    """What the refused calls would have changed, read as crewlet."""
    async def read(nc, js):
        estate = await js.stream_info("ESTATE")
        grants = await js.stream_info("KV_grants")
        streams = {s.config.name: s.state.messages for s in await js.streams_info()}
        return {"estate": estate.state.last_seq, "grants": grants.state.last_seq, "streams": streams,
                "leases": set(await buckets.subjects(js, "leases"))}
    return read_nats(node_url(node), read)


def test_every_role_has_its_own_user_and_the_node_runs_with_them(node):
    users = credentials.read(node.run_dir)
    assert set(users) == set(credentials.USERS)
    assert len(set(users.values())) == len(users), "every user has a password of its own"
    # The node's roles run, each connected as its own user, and nothing of
    # theirs was refused.
    assert {c["state"] for c in node.children().values()} == {"running"}
    theirs = [line for line in node.read_log().splitlines()
              if "Violation" in line and f":{NODE}/" in line]  # a role's connection is named <node>/<role>
    assert not theirs, theirs


def test_only_the_applier_writes_the_fence_verdicts(node):
    before = _state(node)

    async def go():
        async with Client(node, "data_applier") as applier:
            ack = await applier.nc.jetstream(timeout=2).publish("$KV.grants.probe.1.0", b"{}")
            assert ack.stream == "KV_grants"
        refused = {}
        for role in ("ingress", "seats", "workers"):
            async with Client(node, role) as c:
                refused[role] = tuple(await asyncio.gather(
                    c.refused("$KV.grants.probe.2.0", request=True),
                    # Through the domain, as a leaf writes: the broker maps it
                    # to the bucket's own subject, and refuses that.
                    c.refused("$JS.crewlet.API.$KV.grants.probe.3.0", request=True,
                              named="$KV.grants.probe.3.0"),
                    c.refused("$JS.API.STREAM.UPDATE.KV_grants", b"{}", request=True)))
        return refused

    refused = asyncio.run(go())
    assert refused == {r: (True, True, True) for r in ("ingress", "seats", "workers")}, refused
    # The applier's one verdict landed; nobody else's.
    assert _state(node)["grants"] == before["grants"] + 1


def test_only_the_applier_publishes_to_the_estate_log_s_own_subject(node):
    # The seats publish on their node's subject of the log only
    # (tests/integration/test_estate_origin.py).
    before = _state(node)

    async def go():
        out = {}
        for role in ("ingress", "workers", "seats"):
            async with Client(node, role) as c:
                out[role] = await c.refused("estate.ops", b"{}", request=True)
        return out

    assert asyncio.run(go()) == {"ingress": True, "workers": True, "seats": True}
    assert _state(node)["estate"] == before["estate"]


def test_no_role_deletes_the_log_or_a_bucket_and_only_workers_trim_the_log(node):
    before = _state(node)

    async def go():
        out = {}
        for role in credentials.ROLE_USERS:
            async with Client(node, role) as c:
                # A purge "below seq 1" removes nothing, allowed or not.
                out[role] = list(await asyncio.gather(*(
                    c.refused(f"$JS.API.{verb}", b'{"seq": 1}', request=True)
                    for verb in ("STREAM.DELETE.ESTATE", "STREAM.PURGE.ESTATE", "STREAM.DELETE.KV_leases",
                                 "STREAM.PURGE.KV_grants", "STREAM.DELETE.KV_config"))))
        return out

    out = asyncio.run(go())
    # The log's trim is the maintenance duty's: workers alone may purge ESTATE.
    assert out == {r: [True, r != "workers", True, True, True] for r in credentials.ROLE_USERS}, out
    after = _state(node)
    assert after["estate"] == before["estate"]
    # Every stream is still there, and those asked to be purged kept every message.
    assert set(after["streams"]) == set(before["streams"])
    for name in ("ESTATE", "KV_grants"):
        assert after["streams"][name] == before["streams"][name], name


def test_leases_are_written_by_seats_and_workers_each_for_its_own_keys(node):

    async def go():
        out = {}
        for role, key in (("ingress", "seat.x"), ("data_applier", "seat.x"),
                          ("workers", "seat.x"), ("seats", "duty.x"), ("seats", "node.x"),
                          ("seats", "conv.x"), ("workers", "node.x")):
            async with Client(node, role) as c:
                out[(role, key)] = await c.refused(f"$KV.leases.{key}", request=True)
        return out

    out = asyncio.run(go())
    assert all(out.values()), out
    assert not {"seat.x", "duty.x", "node.x", "conv.x"} & _state(node)["leases"]


def test_only_the_applier_answers_estate_requests_and_nobody_reads_every_reply(node):
    async def go():
        out = {}
        for role in ("ingress", "seats", "workers"):
            async with Client(node, role) as c:
                out[role] = (await c.sub_refused(f"estate.req.{NODE}"),
                             await c.sub_refused("_INBOX.>"),
                             await c.sub_refused(f"{permissions.inbox('data_applier', NODE)}.>"))
        async with Client(node, "data_applier") as c:
            out["data_applier"] = (not await c.sub_refused(f"estate.req.{NODE}"),
                                   await c.sub_refused("_INBOX.>"),
                                   await c.sub_refused(f"{permissions.inbox('seats', NODE)}.>"))
        return out

    out = asyncio.run(go())
    assert out == {r: (True, True, True) for r in credentials.ROLE_USERS}, out


def test_the_sealed_secrets_are_read_only_by_the_roles_that_use_them(node):
    """seats (providers' keys) and ingress (webhook secrets) read the
    ``secrets`` bucket; data_applier and workers cannot read it at all, and
    no role writes it (crewletd alone does, as ``crewlet``)."""
    from crewlet.vault import Keys
    from crewlet.vault import store as vault_store

    wait_for(lambda: "KV_secrets" in _streams(node), 30, what="the secrets bucket made")
    read_nats(node_url(node), lambda nc, js: vault_store.put(js, Keys(["p" * 43]), "probe", "sealed-value",
                                                               by="test"))
    get = "$JS.API.DIRECT.GET.KV_secrets.$KV.secrets.probe"

    async def go():
        out = {}
        for role in credentials.ROLE_USERS:
            async with Client(node, role) as c:
                read = not await c.refused(get, request=True) and not await c.refused(
                    "$JS.API.STREAM.MSG.GET.KV_secrets", b'{"last_by_subj": "$KV.secrets.probe"}', request=True)
                write = not await c.refused("$KV.secrets.probe", b"{}", request=True)
                out[role] = (read, write)
        return out

    out = asyncio.run(go())
    assert out == {"seats": (True, False), "ingress": (True, False),
                   "data_applier": (False, False), "workers": (True, False)}, out
    _, record = read_nats(node_url(node), lambda nc, js: vault_store.read(js, "probe"))
    assert record is not None and record.version == 1  # no role's write landed


def test_a_conversation_run_is_driven_and_followed_within_the_rights(node):
    """ingress takes a conversation's driver lease and follows the run's
    events in RUNS; the seats publish a turn's events there. Nobody else
    writes ``conv.*`` or reads RUNS."""
    # crewletd makes RUNS with the other streams once a company is applied
    # (this node has none: made as crewletd would; see the duties test).
    read_nats(node_url(node), lambda nc, js: runs.ensure_stream(js, 1, MAX_EVENTS))

    async def go():
        async with Client(node, "ingress") as ingress, Client(node, "seats") as seats:
            ingress_js, seats_js = ingress.nc.jetstream(timeout=2), seats.nc.jetstream(timeout=2)
            drivers = Drivers(ingress_js, NODE, "perm-boot", ttl=5)
            async with await drivers.acquire("perm-c1", "r1", wait=0) as driving:
                started = await runs.RunEvents(ingress_js, "perm-c1", "r1", ttl=60).publish(
                    {"type": runs.STARTED, "node": NODE})
                turn = runs.RunEvents(seats_js, "perm-c1", "r1", ttl=60)
                told = [await turn.publish({"type": runs.DELTA, "round": 1, "text": "hi"}),
                        await turn.publish({"type": runs.COMPLETED})]
                async with runs.follow(ingress_js, "perm-c1", "r1", after_seq=started) as events:
                    followed = [seq async for seq, _ in events]
                assert driving.holds() and await driving.current()
            assert followed == told
            assert await drivers.holder("perm-c1") is None  # released
            assert not ingress.errors and not seats.errors, (ingress.errors, seats.errors)
        refused = {}
        for role in ("seats", "workers", "data_applier"):
            async with Client(node, role) as c:
                refused[role] = (
                    await c.refused("$KV.leases.conv.perm-c2", request=True),
                    await c.refused("$JS.API.CONSUMER.CREATE.RUNS", b"{}", request=True),
                    role == "seats" or await c.refused("runs.perm-c2.r1", b"{}", request=True))
        return refused

    refused = asyncio.run(go())
    assert refused == {r: (True, True, True) for r in ("seats", "workers", "data_applier")}, refused
    after = read_nats(node_url(node), _runs_state)
    assert after == {"consumers": 0, "leases": [], "subjects": ["runs.perm-c1.r1"]}, after


async def _runs_state(nc, js) -> dict:
    info = await js.stream_info(runs.STREAM, subjects_filter="runs.>")
    return {"consumers": info.state.consumer_count,
            "leases": [k for k in await buckets.subjects(js, "leases") if k.startswith("conv.perm-c2")],
            "subjects": sorted(info.state.subjects or {})}


# ------------------------------------------------ the duties under their rights

DUTIES_COMPANY = """
company: {name: Duties}
providers:
  local:
    kind: scripted
    rules:
      - match: standup
        tools:
          - name: notify
            args: {to: [ops@example.com], subject: standup, body: done}
        reply: "notified: {tools}"
seats: [{name: solo, persona: does everything, provider: local}]
schedules: [{name: beat, seat: solo, every: 2s, message: standup, catch_up: none}]
notify: {rate: 50, burst: 5}
"""


def test_the_duties_and_the_notify_tool_work_within_their_rights(make_node, short_tmp):
    """Every duty and the notify tool on a node with an embedded broker, so the
    roles' users hold only their grants: the scheduler's tick (workers: mail),
    the notify tool (seats: OUTBOX), the sender (workers: OUTBOX's durable,
    claims, the rate valve) and the maintenance sweep (workers: an estate
    write through an applier, its report). Nodes.close fails the test on any
    refusal the broker logged."""
    from tests.conftest import wait_for
    from tests.seats import write_company
    from tests.smtp import SmtpServer

    smtpd = SmtpServer().start()
    try:
        company = write_company(short_tmp, DUTIES_COMPANY)
        n = make_node(node={"id": "duties"}, fleet={"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5},
                      smtp={"host": "127.0.0.1", "port": smtpd.port, "tls": "none",
                            "notices_to": ["ops@example.com"]})
        n.start(args=("--company", company))
        wait_for(lambda: any(m["Subject"] == "standup" for m in smtpd.messages), 45, interval=0.3,
                 what="a scheduled turn's notification sent")
        n.wait_event("maintenance_swept", timeout=30)
        # The fleet made RUNS with the company's streams, for a run's events.
        config = read_nats(node_url(n), lambda nc, js: js.stream_info(runs.STREAM)).config
        assert config.allow_msg_ttl and config.subjects == [runs.SUBJECT + ">"]
    finally:
        smtpd.stop()
