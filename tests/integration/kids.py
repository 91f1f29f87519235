"""Children for supervisor tests, forked from a zygote that preloads this module.

``serve`` reports ready on the health endpoint (unless told not to), heartbeats
if asked, and then waits for a signal:

* SIGTERM: exit 0 (or, with ``ignore_term``, keep running; with ``overdue``
  as well, report ``stop_overdue`` with those tasks, as a role still stopping
  past its stop budget does);
* SIGUSR1: exit 0 on its own — a *normal* exit the supervisor did not ask for;
* SIGUSR2: exit ``usr2_code`` (3) — an abnormal exit.

With ``lines``, it writes that many JSON log lines to its output in one burst
once ready (``kid_line`` events numbered from 0), then, after ``quiet`` s, one
more (``kid_late``): what crewletd forwards of a busy and of a quiet child.
"""

from __future__ import annotations

import os
import signal
import time

import msgpack
import zmq


def serve(run_dir: str, name: str, ready_after: float = 0.0, report_ready: bool = True,
          ignore_term: bool = False, heartbeat: float | None = None, beats: int = -1, usr2_code: int = 3,
          fail_from: int = -1, overdue: list[str] | None = None,
          lines: int = 0, quiet: float = 1.0, incarnation: int = 0) -> int:
    if 0 <= fail_from <= incarnation:
        return 5  # from this incarnation on, die before ever being ready
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect("ipc://" + os.path.join(run_dir, "health"))

    def say(kind: str, **fields) -> None:
        push.send(msgpack.packb({"t": kind, "child": name, "pid": os.getpid(), **fields}))

    exit_code: list[int] = []
    termed: list[bool] = []
    signal.signal(signal.SIGTERM, (lambda *_: termed.append(True)) if ignore_term
                  else lambda *_: exit_code.append(0))
    signal.signal(signal.SIGUSR1, lambda *_: exit_code.append(0))
    signal.signal(signal.SIGUSR2, lambda *_: exit_code.append(usr2_code))
    if ready_after:
        time.sleep(ready_after)
    if report_ready:
        say("ready")
    if lines:
        for n in range(lines):
            os.write(1, b'{"ts":%.3f,"level":"info","event":"kid_line","n":%d}\n' % (time.time(), n))
        time.sleep(quiet)
        os.write(1, b'{"ts":%.3f,"level":"info","event":"kid_late"}\n' % time.time())
    while not exit_code:
        if termed and overdue is not None:
            say("stop_overdue", tasks=overdue)
            overdue = None
        if heartbeat is not None and beats != 0:
            say("hb")
            beats -= 1
        time.sleep(heartbeat or 0.05)
    push.close()
    ctx.term()
    return exit_code[0]
