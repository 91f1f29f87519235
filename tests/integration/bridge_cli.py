"""A CLI agent in agent mode, for the tool bridge's test on a real node: run
by a ``cli`` provider (confined, like any seat's agent), it finds the bridge
the way a real agent would — the MCP config file its environment names
(``CREWLET_MCP_CONFIG``) or, with ``socket`` in the prompt, the unix socket
bound into its sandbox — and through it creates a task and mails the seat
``sink`` (tests/integration/bridge_agent.py speaks MCP). It keeps its turn's
token in its workspace (``token.txt``), so the test can try it after the turn,
and prints what each call answered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    prompt = sys.stdin.read()
    with open("token.txt", "w") as f:
        f.write(os.environ.get("CREWLET_MCP_BRIDGE_TOKEN", ""))
    how = ["--env", "--socket"] if "socket" in prompt else ["--config", os.environ["CREWLET_MCP_CONFIG"]]
    over = "socket" if "--socket" in how else "config"
    steps = [["call", "task_create", {"title": f"filed by the agent over {over}"}],
             ["call", "send", {"seat": "sink", "text": "the agent says hi"}]]
    done = subprocess.run([sys.executable, os.path.join(HERE, "bridge_agent.py"), *how, json.dumps(steps)],
                          capture_output=True, text=True, timeout=60)
    print(done.stdout.strip().replace("\n", " | ") or done.stderr.strip()[-500:])


if __name__ == "__main__":
    main()
