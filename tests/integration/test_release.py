"""A seat released on a live node takes its MCP servers with it (roles.seats).

One real node holds a seat whose MCP server forks a grandchild that ignores
SIGTERM and keeps the server's pipes open (the worst case). The seat is
released while the node goes on — dropped from the company — and within a
bound the server and its grandchild are gone, and nothing else of the seats
process's is left behind; the node's other seat works on.
"""

from __future__ import annotations

import os
import sys

import psutil

from tests.conftest import alive, wait_for
from tests.seats import MCP_SERVER, ctl, ctl_json, held, write_company

FAST = {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5}
GONE_WITHIN = 15.0  # seconds: the servers' stop (its grace, then SIGKILL of the group) and a sweep
COMPANY = """
company: {{name: t}}
providers: {{p: {{kind: scripted, rules: [{{match: '.*', reply: 'ok'}}]}}}}
seats:
  - {{name: stay, persona: stays, provider: p}}
{tooled}"""
TOOLED = "  - {{name: tooled, persona: has a tool, provider: p, mcp: [{{name: t, command: {python}, " \
         "args: [{server}, --grandchild, {pidfile}]}}]}}\n"


def test_a_seat_released_on_a_live_node_leaves_no_tool_process_behind(make_node):
    # Unconfined, so the grandchild's pid file holds a pid of this machine's (confined,
    # it would be one of its pid namespace's).
    node = make_node(fleet=FAST, sandbox={"mode": "off"})
    pidfile = os.path.join(node.dir, "grandchild.pid")
    tooled = TOOLED.format(python=sys.executable, server=MCP_SERVER, pidfile=pidfile)
    node.start(args=("--company", write_company(node.dir, COMPANY.format(tooled=tooled))))
    wait_for(lambda: {"stay", "tooled"} <= set(held(node)), 30, what="both seats held")
    grandchild = int(wait_for(lambda: os.path.exists(pidfile) and open(pidfile).read().strip(), 30,
                              what="the MCP server's grandchild started"))
    seats = psutil.Process(node.process_pids()["seats"])
    tools = [p for p in seats.children(recursive=True) if p.pid != grandchild]
    assert tools and alive(grandchild), tools
    assert any(MCP_SERVER in " ".join(p.cmdline()) for p in tools), [p.cmdline() for p in tools]

    out = ctl(node, "apply", write_company(node.dir, COMPANY.format(tooled=""), "dropped.yaml"))
    assert out.returncode == 0, out.stderr
    wait_for(lambda: "tooled" not in held(node), 20, what="the seat released")
    wait_for(lambda: not alive(grandchild) and not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                                       for p in tools), GONE_WITHIN, interval=0.2,
             what="the released seat's MCP server and its grandchild gone")
    assert seats.is_running() and node.process_pids()["seats"] == seats.pid, "the seats process went on"
    turn = ctl_json(node, "send", "stay", "still here", "--wait", "20")["turn"]
    assert turn["outcome"] == "done", turn
