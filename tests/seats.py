"""Helpers for tests of seats at work: crewletctl calls, what a node holds, and
reading what landed on the broker (turn records, mailboxes, the ledger).

Readers open a NATS connection of their own to the broker at *url* and read
streams with ordered consumers, so they change nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import nats

from crewlet.coord import buckets
from crewlet.credentials import client_url as credentials_url
from crewlet.estate import log as estate_log
from crewlet.estate.ops import Op
from crewlet.queue.jetstream import JetStreamMailboxes
from tests.conftest import CREWLETCTL

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "..", "etc", "company.yaml")
MCP_SERVER = os.path.join(HERE, "integration", "mcp_server.py")


# Worker seats whose turns nap in its own MCP server, then sends "job N done" to a
# sink nobody may hold: the sink's mailbox counts the turn's side effects.
WORKER_COMPANY = """
company: {{name: t}}
providers:
  p:
    kind: scripted
    rules:
      - match: 'job (\\d+)'
        reply: 'finished \\1'
        tools:
          - {{name: slow__nap, args: {{seconds: {nap}}}}}
          - {{name: send, args: {{seat: sink, text: 'job \\1 done'}}}}
seats:
{workers}
  - {{name: sink, persona: a sink, provider: p, placement: {{labels: {{zone: nowhere}}}}}}
"""


def worker_company(nap: float, workers: tuple[str, ...] = ("w",)) -> str:
    """The worker company: *workers* seats (each with its slow MCP server) and the sink."""
    lines = "\n".join(f"  - {{name: {w}, persona: a worker, provider: p, "
                      f"mcp: [{{name: slow, command: {sys.executable}, args: [{MCP_SERVER}]}}]}}"
                      for w in workers)
    return WORKER_COMPANY.format(nap=nap, workers=lines)


def ctl(node, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CREWLETCTL, "-c", node.config_path, *args], capture_output=True,
                          text=True, timeout=timeout)


def ctl_json(node, *args: str, timeout: float = 60) -> dict:
    out = ctl(node, *args, "--json", timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def write_company(dir: str, text: str, name: str = "company.yaml") -> str:
    path = os.path.join(dir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def wait_napping(node, seat: str, seconds: float, timeout: float = 30) -> None:
    """Wait until *seat*'s turn on *node* is in the MCP test server's
    ``nap(seconds)``: the server said so on its stderr, in the node's log.
    Stronger than the stats' running turn, which may be one whose tool call
    failed and that is over before a test acts on it. Failing, say what
    *node* logged of its MCP servers and turns."""
    try:
        node.wait_event("mcp_server_output", timeout, seat=seat, line=f"napping {seconds:g}")
    except AssertionError:
        seen = [e for e in node.events() if str(e.get("event", "")).startswith(("mcp_", "turn", "tool"))]
        raise AssertionError(f"{seat}'s turn never napped on {node.config['node']['id']}; "
                             f"its MCP and turn events: {seen}") from None


def held(node) -> dict[str, str]:
    """seat -> holding node, as *node*'s fleet view shows it."""
    st = node.status() or {}
    return {s["name"]: s["node"] for s in ((st.get("fleet") or {}).get("seats") or [])}


def deferrals(node, seat: str) -> list[str]:
    """Why *node* deferred *seat*'s turns, as its log says (``turn_deferred``):
    a deferral is not a turn worked, said on the feed and in the log, never
    stored (roles/seats/turns.py)."""
    return [e.get("reason") or "" for e in node.events()
            if e.get("event") == "turn_deferred" and e.get("seat") == seat]


def seats_stats(node) -> dict:
    """The stats the node's seats children last reported, the pool's whole
    ({} before any): what crewletctl status shows."""
    from crewlet.ctl.render import seats_stats as whole
    return whole((node.status() or {}).get("children", [])) or {}


def node_url(node) -> str:
    """The client URL of a node's embedded broker, with the node's own
    credentials in it: the broker admits nobody else (crewlet.credentials).
    Read from the node's run dir, so only once the node has started. A URL
    rather than connect options so that a pool of several nodes' URLs works
    too (nats-py takes each server's user from its URL)."""
    return credentials_url(node.config["stream"]["listen"], node.run_dir)


def read_nats(url: str, fn):
    """Run ``await fn(nc, js)`` on a connection of our own to the broker at *url*."""
    async def go():
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
        try:
            return await fn(nc, nc.jetstream(timeout=5))
        finally:
            await nc.close()
    return asyncio.run(go())


def send_all(node, mail: list[tuple[str, str, str | None]]) -> None:
    """Put every ``(seat, text, trigger)`` of *mail* on its mailbox at once,
    over one connection: what ``crewletctl send`` does, without a process
    start between two (which spaces a test's sends by half a second)."""
    send_all_to(node_url(node), mail)


def send_all_to(url: str, mail: list[tuple[str, str, str | None]]) -> None:
    """:func:`send_all` through the broker at *url* (an external one)."""
    async def put(nc, js):
        boxes = JetStreamMailboxes(js, nc)
        for seat, text, trigger in mail:
            await boxes.put(seat, text, trigger=trigger)
    read_nats(url, put)


async def _all(js, subject: str) -> list[bytes]:
    out: list[bytes] = []
    sub = await js.subscribe(subject, ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except Exception:  # nothing more within the pause: we have it all
                return out
            out.append(msg.data)
    finally:
        await sub.unsubscribe()


async def turn_records(nc, js) -> list[dict]:
    """Every turn record in the estate's log, oldest first: the records of
    each ``turn.records`` op (roles/seats/kept.py) and each lone ``turn.record``."""
    info = await js.stream_info(estate_log.STREAM)
    out: list[dict] = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            op = Op.decode((await js.get_msg(estate_log.STREAM, seq)).data)
        except Exception:  # deleted, or not an op: not a turn record
            continue
        if op.kind == "turn.records":
            out += [entry["record"] for entry in op.args["records"]]
        elif op.kind == "turn.record":
            out.append(op.args["record"])
    return out


async def mail_of(seat: str, nc, js) -> list[str]:
    """The texts in *seat*'s mailbox subject, worked or not, in order."""
    return [data.decode() for data in await _all(js, f"agents.inbox.{seat}")]


async def ledger_keys(nc, js) -> set[str]:
    # Asked of the stream: nats-py's kv.keys() would leave a watch behind.
    return set(await buckets.subjects(js, "ledger"))
