"""Seat mailboxes on JetStream against real nats-servers: the conformance suite.

Every check of :mod:`crewlet.queue.conformance` runs against a single server;
the hand-over checks (re-attach replay, NAK hand-over, ack-wait expiry) also on a
three-member R3 cluster with the two clients on different members, and through a
leaf that reaches the members' JetStream by its domain. A few JetStream-specific
facts (consumer config, stream updates, no subscription per mailbox) follow.
"""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import asynccontextmanager

import nats
import pytest

from crewlet.queue import JetStreamMailboxes, MailboxError
from crewlet.queue import jetstream as jsq
from crewlet.queue.conformance import CHECKS
from tests.conftest import NatsServer, free_port, nats_binary, wait_for

CHECKS_BY_NAME = dict(CHECKS)
ON_R3 = ("reattach_replays_in_order", "successor_gets_unacked")
DEADLINE = 60.0             # s for one whole check, connection setup included


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


async def _retrying(make, timeout: float = 20.0):
    """*make()* until it works: a fresh cluster may refuse its first streams."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await make()
        except (MailboxError, nats.errors.Error):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


def factory_for(urls: list[str], replicas: int, *, domain: str | None = None):
    """The conformance factory: two clients (on the first and last URL), streams ensured."""
    @asynccontextmanager
    async def factory(ack_wait: float = jsq.DEFAULT_ACK_WAIT):
        ncs = []
        try:
            for url in (urls[0], urls[-1]):
                ncs.append(await nats.connect(url, connect_timeout=2, allow_reconnect=False))
            pair = tuple(JetStreamMailboxes(nc.jetstream(domain=domain, timeout=2), nc, ack_wait=ack_wait)
                         for nc in ncs)
            await _retrying(lambda: pair[0].ensure_streams(replicas=replicas, max_consumers=1000))
            yield pair
        finally:
            for nc in ncs:
                await nc.close()
    return factory


@pytest.mark.parametrize("name", [n for n, _ in CHECKS])
def test_conformance_single_server(natsd, name):
    run(CHECKS_BY_NAME[name](factory_for([natsd.url], 1)))


@pytest.mark.parametrize("name", ON_R3)
def test_conformance_r3_cluster(nats_cluster, name):
    run(CHECKS_BY_NAME[name](factory_for([s.url for s in nats_cluster], 3)))


@pytest.fixture
def leaf(short_tmp):
    """A JetStream hub with domain ``crewlet`` and a leaf of it without JetStream."""
    hub_port, leaf_port, leafnode_port = free_port(), free_port(), free_port()
    hub_conf = os.path.join(short_tmp, "hub.conf")
    with open(hub_conf, "w") as f:
        f.write(f"listen: 127.0.0.1:{hub_port}\n"
                f"jetstream {{ store_dir: \"{short_tmp}/hubjs\", domain: crewlet }}\n"
                f"leafnodes {{ listen: 127.0.0.1:{leafnode_port} }}\n")
    leaf_conf = os.path.join(short_tmp, "leaf.conf")
    with open(leaf_conf, "w") as f:
        f.write(f"listen: 127.0.0.1:{leaf_port}\n"
                f"leafnodes {{ remotes: [ {{ url: \"nats-leaf://127.0.0.1:{leafnode_port}\" }} ] }}\n")
    servers = []
    for name, conf, port in (("hub", hub_conf, hub_port), ("leaf", leaf_conf, leaf_port)):
        server = _ConfServer(name, os.path.join(short_tmp, name), port, conf=conf)
        servers.append(server.start())
    yield servers
    for server in reversed(servers):
        server.stop()


class _ConfServer(NatsServer):
    """A nats-server run from a config file (the fixtures' NatsServer takes flags only)."""

    def __init__(self, name: str, dir: str, port: int, *, conf: str):
        super().__init__(name, dir, port)
        self.conf = conf

    def start(self) -> "_ConfServer":
        import subprocess
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "nats.log"), "ab") as log:
            self.proc = subprocess.Popen([nats_binary(), "-c", self.conf], stdout=log,
                                         stderr=subprocess.STDOUT)
        wait_for(self._listening, 10, what=f"nats-server {self.name} listening")
        return self


@pytest.mark.parametrize("name", ("durable_mailbox_keeps_mail", "successor_gets_unacked",
                                  "budget_spent_goes_to_dead_letters"))
def test_conformance_through_a_leaf(leaf, name):
    """Clients on a leaf reach the hub's JetStream through the domain prefix; the
    second client sits on the hub itself."""
    hub, leafnode = leaf
    wait_for(lambda: _answers_through(leafnode.url, "crewlet"), 15, what="the leaf's link to the hub")
    run(CHECKS_BY_NAME[name](factory_for([leafnode.url, hub.url], 1, domain="crewlet")))


def _answers_through(url: str, domain: str) -> bool:
    async def check() -> bool:
        nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False)
        try:
            await nc.jetstream(domain=domain, timeout=1).account_info()
            return True
        except Exception:
            return False
        finally:
            await nc.close()
    return asyncio.run(check())


# --------------------------------------------------------------------------- JetStream specifics

def _plain(value):
    return getattr(value, "value", value)


def test_mailbox_consumer_config_and_no_subscription_per_mailbox(natsd):
    """The consumer is what the fleet expects (durable, explicit ack, the ack wait,
    max_deliver = budget + headroom, stream replicas), and fetching from many mailboxes
    adds one subscription to the connection, not one per mailbox."""
    async def main():
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=2)
        mb = JetStreamMailboxes(js, nc, ack_wait=600)
        await mb.ensure_streams(replicas=1, max_consumers=500)
        seats = [f"s{i}" for i in range(50)]
        assert await mb.ensure(seats) == 50
        ci = await js.consumer_info("AGENTS", "inbox-s7")
        c = ci.config
        assert (c.durable_name, c.filter_subject, c.ack_wait, c.max_deliver) == \
            ("inbox-s7", "agents.inbox.s7", 600, jsq.MAX_DELIVER)
        assert (_plain(c.deliver_policy), _plain(c.ack_policy)) == ("all", "explicit")
        assert not c.inactive_threshold
        subs_before = len(nc._subs)
        for seat in seats:
            await mb.send(seat, "x")
        for seat in seats:
            d = await mb.attach(seat).next(wait=2)
            assert d is not None and d.seat == seat and d.data == b"x"
            await mb.ack(d.ack_token)
        assert len(nc._subs) - subs_before <= 1
        si = await js.stream_info("AGENTS")
        assert _plain(si.config.retention) == jsq.RETENTION
        assert si.config.max_consumers == 500 and not si.config.max_age  # mail is never aged out
        await nc.close()
    run(main())


def test_ensure_streams_updates_and_never_shrinks(natsd):
    """Applying a grown company raises max_consumers (the 1001st consumer is refused
    otherwise); a smaller figure from a stale node does not lower it; mail stays.
    An ``AGENTS`` an older version made with an age limit loses it (unworked
    mail is never aged out); ``EVENTS`` follows the company's events_days."""
    async def main():
        nc = await nats.connect(natsd.url)
        js = nc.jetstream(timeout=2)
        await js.add_stream(name="AGENTS", subjects=["agents.inbox.>"], retention="limits",
                            max_age=14 * 86400, max_consumers=100)  # as an older version made it
        mb = JetStreamMailboxes(js, nc)
        await mb.ensure_streams(replicas=1, max_consumers=100)
        await mb.ensure(["keep"])
        seq = await mb.send("keep", "still here")
        await mb.ensure_streams(replicas=1, max_consumers=1200, events_days=30)
        await mb.ensure_streams(replicas=1, max_consumers=100, events_days=30)
        si = await js.stream_info("AGENTS")
        assert si.config.max_consumers == 1200 and not si.config.max_age
        assert si.state.messages == 1
        d = await mb.attach("keep").next()
        assert d is not None and d.seq == seq
        for name in ("DLQ", "EVENTS"):
            assert (await js.stream_info(name)).config.num_replicas == 1
        assert (await js.stream_info("EVENTS")).config.max_age == 30 * 86400
        await nc.close()
    run(main())


async def until(predicate, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_a_fetch_that_gave_up_gives_its_message_back(natsd):
    """A message that reaches us after its fetch was cancelled is NAKed at once
    rather than held for the ack wait; a missing mailbox is an error, not 'empty'."""
    async def main():
        nc = await nats.connect(natsd.url)
        mb = JetStreamMailboxes(nc.jetstream(timeout=2), nc)
        await mb.ensure_streams(replicas=1, max_consumers=100)
        await mb.ensure(["late"])
        box = mb.attach("late")
        waiting = asyncio.ensure_future(box.next(wait=30))
        await until(lambda: "late" in mb._waiting, "the fetch to be sent")
        await nc.flush()                # the pull request has reached the server
        waiting.cancel()
        await mb.send("late", "orphan")
        # The server hands it to the cancelled fetch's request (first in its queue); we
        # give it straight back, so another client finds it without waiting out the ack
        # wait (30 min). (A fetch of our own in flight then would simply take it.)
        other_nc = await nats.connect(natsd.url)
        other = JetStreamMailboxes(other_nc.jetstream(timeout=2), other_nc).attach("late")
        d = await until(other.next, "the orphan to be NAKed back", timeout=5)
        assert (d.data, d.deliveries) == (b"orphan", 2)
        await other.ack(d)
        await other_nc.close()
        with pytest.raises(MailboxError):
            await mb.attach("nobody").next()
        with pytest.raises(ValueError):
            mb.attach("Bad.Seat")
        await nc.close()
    run(main())


def test_a_waiting_fetch_asks_again_while_the_mailbox_does_not_answer(natsd):
    """A fetch that hears "no responders" (no mailbox, or, on a cluster, a
    consumer just made whose leader is still being chosen) says so at once
    when it does not wait, asks again while its wait lasts, and gets the mail
    of a mailbox that answers meanwhile."""
    async def main():
        nc = await nats.connect(natsd.url)
        mb = JetStreamMailboxes(nc.jetstream(timeout=2), nc)
        await mb.ensure_streams(replicas=1, max_consumers=100)
        began = time.monotonic()
        with pytest.raises(MailboxError, match="has no mailbox"):
            await mb.attach("nobody").next()
        assert time.monotonic() - began < 1.0
        began = time.monotonic()
        with pytest.raises(MailboxError, match="has no mailbox"):
            await mb.attach("nobody").next(wait=1.0)
        assert time.monotonic() - began >= 0.9 - jsq.NO_RESPONDERS_PAUSE, "told before its wait was spent"
        # The mailbox comes to answer while a fetch waits: the fetch gets its mail.
        waiting = asyncio.ensure_future(mb.attach("soon").next(wait=10))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await mb.ensure(["soon"])
        await mb.send("soon", "here")
        d = await asyncio.wait_for(waiting, 10)
        assert d is not None and d.data == b"here"
        await mb.attach("soon").ack(d)
        await nc.close()
    run(main())


def test_a_later_publish_rides_the_next_write_or_goes_within_its_time(natsd):
    """crewlet.bus.publish_later (a turn's ack): it waits in the connection's
    buffer for another write — and goes with it, in order — or is written on
    its own within its time when none comes."""
    from crewlet.bus import publish_later

    async def go() -> None:
        sender = await nats.connect(natsd.url, connect_timeout=2, allow_reconnect=False)
        hearer = await nats.connect(natsd.url, connect_timeout=2, allow_reconnect=False)
        try:
            heard: asyncio.Queue = asyncio.Queue()

            async def seen(msg):
                heard.put_nowait((msg.subject, time.monotonic()))
            await hearer.subscribe("later.>", cb=seen)
            await hearer.flush()
            # Alone: written once its time is up, not at once, not later.
            began = time.monotonic()
            await publish_later(sender, "later.alone", b"+ACK", within=0.3)
            subject, at = await asyncio.wait_for(heard.get(), 5)
            assert subject == "later.alone" and 0.25 <= at - began < 2.0, at - began
            # With another publish after it: they go together, in order, at once.
            began = time.monotonic()
            await publish_later(sender, "later.first", b"+ACK", within=5.0)
            await sender.publish("later.second", b"x")
            got = [await asyncio.wait_for(heard.get(), 2) for _ in range(2)]
            assert [s for s, _ in got] == ["later.first", "later.second"]
            assert got[-1][1] - began < 1.0
        finally:
            await sender.close()
            await hearer.close()
    run(go())
