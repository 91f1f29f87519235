"""A CLI agent (``claude -p``, say) run once per call, the prompt on its stdin.

The agent is a process group of its own (``start_new_session``): whatever it
starts goes with it. When the deadline passes — or the turn is cancelled —
the *whole group* is SIGKILLed and reaped, so no grandchild outlives the turn;
when the agent exits by itself, what it left running in its group is killed
too. At most ``max_concurrent`` agents of one provider run at once on a node
(the instance is shared by every seat of the process).

The prompt is the system prompt, then the conversation as plain text
(``user: …``, ``assistant: …``, ``tool <name>: …``). The reply is the agent's
stdout, stripped; it makes no tool calls through us — a CLI agent uses its
own tools. A non-zero exit fails with the tail of its stderr, redacted of
secrets the agent may print (:func:`~crewlet.agent.providers.base.redact`,
with every value of its environment named like a key or token). Usage is
counted in words, as for the scripted provider. It does not stream: a sink
gets the whole reply as one delta once the agent has exited (its stdout is
only the reply when it is complete and the exit code says so).

``CREWLET_SPAWNED_BY`` in the agent's environment carries this process's
``CREWLET_SPAWN_MARK``, so a restarted role can find what its predecessor
spawned.

**Confined, and holding no secret but its own.** The agent's environment is
built from nothing: the one variable its provider names (``api_key_env``,
its own key), ``LANG``, the spawn mark, and — when the turn has a tool
bridge (:mod:`crewlet.agent.bridge`) — the bridge's URL, its per-turn token
and an MCP config file that names them (written in the run dir, bound
read-only at :data:`crewlet.sandbox.BRIDGE_CONFIG` into this agent's sandbox
alone: the seat's MCP servers share its workspace), so an agent in agent
mode calls crewlet's tools as its seat and through nothing else. The seat
whose turn it is, and the turn's grant, are :data:`crewlet.sandbox.SEAT`
(set by the seats role for the turn's length, :func:`crewlet.sandbox.turn`):
the agent runs under that seat's sandbox, in its workspace; a node whose
``sandbox.mode`` is ``required`` and cannot confine fails the call with the
reason.

The agent's stderr is a pipe of its own, read here: never the seats role's
output, whose lines crewletd takes for crewlet's own log events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

from crewlet import log, sandbox
from crewlet.agent.providers.base import Provider, ProviderError, env_secrets, redact
from crewlet.agent.providers.scripted import conversation_words, words
from crewlet.agent.types import Message, Reply, Sink, ToolSpec, Usage
from crewlet.company.model import Provider as ProviderSpec

SPAWN_MARK_ENV = "CREWLET_SPAWN_MARK"
SPAWNED_BY_ENV = "CREWLET_SPAWNED_BY"
# Names the MCP client config (the tool bridge under this turn's grant) in
# the agent's environment: a file of the run dir bound read-only into the
# agent's sandbox alone (crewlet.sandbox.BRIDGE_CONFIG), gone with the turn.
CONFIG_ENV = "CREWLET_MCP_CONFIG"
# Characters of stderr quoted when the agent fails: its last words, not its whole log.
STDERR_TAIL = 2000
# After the agent exits, how long its pipes may take to close once its group is killed.
_DRAIN = 5.0
# Seconds to wait for a SIGKILLed agent to be reaped before the turn goes on
# without (its exit is then the child watcher's, whenever it comes).
REAP_WAIT = 5.0


class CliProvider(Provider):
    kind = "cli"

    def __init__(self, name: str, spec: ProviderSpec, *, cooldowns: Any = None,
                 env: Mapping[str, str] = os.environ, vault: Any = None):
        super().__init__(name, spec, env=env, vault=vault)
        assert spec.command, "a cli provider has a command (the company model requires it)"
        self.command = list(spec.command)
        self.max_concurrent = spec.max_concurrent
        self._slots = asyncio.Semaphore(spec.max_concurrent) if spec.max_concurrent else None

    async def complete(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec], *,
                       deadline: float, sink: Sink | None = None) -> Reply:
        prompt = render(system, messages)
        if self._slots is None:
            out = await self._run(prompt, deadline)
        else:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns
                # the acquire that completed as a cancel arrived, losing the cancel
                # (a released seat's turn then ran its agent to the end; CI, once).
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._slots.acquire()
            except TimeoutError:
                raise ProviderError(f"provider {self.name}: deadline passed waiting for one of "
                                    f"{self.max_concurrent} agent slots", retryable=True) from None
            try:
                out = await self._run(prompt, deadline)
            finally:
                self._slots.release()
        if sink is not None and out:
            await sink.delta(out)
        return Reply(text=out, usage=Usage(conversation_words(system, messages), words(out)))

    async def environment(self) -> dict[str, str]:
        """The agent's environment, before its sandbox's additions: nothing of
        crewlet's but its own key (as of now: a rotated secret reaches the
        next agent started), the locale and the spawn mark."""
        env = {SPAWNED_BY_ENV: self._env.get(SPAWN_MARK_ENV, "")}
        for name in ("LANG", "LC_ALL", "TZ"):
            if self._env.get(name):
                env[name] = self._env[name]
        var = self.spec.api_key_env
        if var:
            # A secret named must be there (ProviderError); an environment
            # variable unset leaves the agent to its own login, as before.
            key = await self.api_key() if self.spec.api_key_secret else self._env.get(var)
            if key:
                env[var] = key
        return env

    async def _launch(self) -> tuple[list[str], dict[str, str], str | None]:
        """(argv, environment, cwd) of this call's agent: under the sandbox of
        the seat whose turn it is, with the turn's bridge when it has one."""
        env = await self.environment()
        seat = sandbox.SEAT.get()
        grant = seat.grant if seat is not None else None
        if grant is not None:
            env.update(grant.env())
        if seat is None or seat.sandbox is None:
            # Called outside a seat's turn (tests, tools), or a node without a
            # sandbox (unit tests): run as it is.
            env.setdefault("PATH", self._env.get("PATH", sandbox.SANDBOX_PATH))
            return list(self.command), env, None
        box = seat.sandbox
        if box.state == "refused":  # nothing is made for a call that cannot run
            raise ProviderError(f"provider {self.name}: sandbox.mode is required and tools cannot be "
                                f"confined: {box.reason}", retryable=False)
        env["CREWLET_SEAT"] = seat.seat
        binds = seat.binds
        # Once a call: made (and, as root, owned by the seat's uid) here, used
        # by the config's owner and the wrap alike.
        try:
            place = await asyncio.to_thread(box.workspace, seat.seat)
        except sandbox.SandboxError as exc:
            raise ProviderError(f"provider {self.name}: {exc}", retryable=False) from None
        if grant is not None:
            # The config holds the turn's token: outside the workspace, which
            # the seat's own MCP servers share, and shown to this agent alone.
            folder = await asyncio.to_thread(box.grants_dir)
            written = grant.config_file(folder, place[1])  # on the loop: a revoke cannot race it
            confined = box.state == "confined"
            env[CONFIG_ENV] = sandbox.BRIDGE_CONFIG if confined else written
            if confined:
                binds = (*binds, (written, sandbox.BRIDGE_CONFIG))
            if grant.socket_path and confined:
                binds = (*binds, (grant.socket_path, sandbox.BRIDGE_SOCKET))
                env["CREWLET_MCP_BRIDGE_SOCKET"] = sandbox.BRIDGE_SOCKET
        try:
            launch = await asyncio.to_thread(box.wrap, self.command, env, seat.seat, seat.policy, binds, place)
        except (sandbox.SandboxError, FileNotFoundError) as exc:
            raise ProviderError(f"provider {self.name}: {exc}", retryable=False) from None
        return launch.argv, launch.env, launch.cwd

    async def _run(self, prompt: str, deadline: float) -> str:
        argv, env, cwd = await self._launch()
        proc = await self._spawn(argv, env, cwd)
        io = asyncio.ensure_future(_talk(proc, prompt.encode()))
        exited = False  # by itself: its output is read to the end below
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await proc.wait()
            exited = True
        except TimeoutError:
            raise ProviderError(f"provider {self.name}: timed out: {self.command[0]} ran past the "
                                f"deadline and was killed with its process group",
                                retryable=False) from None
        finally:
            # Its own group (pgid = its pid): the agent on timeout or cancellation, what it
            # left behind otherwise. Then reap it, so nothing of the run is left.
            _kill_group(proc.pid)
            try:
                # Bounded: SIGKILLed, it exits at once; a reap that never comes
                # (the child watcher missed it) must not hold the turn for ever.
                await asyncio.wait_for(asyncio.shield(proc.wait()), REAP_WAIT)
            except TimeoutError:
                log.event("cli_agent_unreaped", "warning", provider=self.name, pid=proc.pid)
            finally:
                if not exited and not io.done():
                    io.cancel()
        try:
            out, err = await asyncio.wait_for(io, _DRAIN)
        except TimeoutError:
            raise ProviderError(f"provider {self.name}: {self.command[0]} exited but its output "
                                f"stayed open (a process outside its group holds it)",
                                retryable=False) from None
        if proc.returncode != 0:
            how = (f"exit {proc.returncode}" if proc.returncode > 0
                   else f"signal {-proc.returncode} ({signal.Signals(-proc.returncode).name})")
            tail = redact(err.decode(errors="replace").strip()[-STDERR_TAIL:],
                          [*env_secrets(self._env), *env_secrets(env)])
            raise ProviderError(f"provider {self.name}: {self.command[0]} failed, {how}: {tail}",
                                retryable=False)
        return out.decode(errors="replace").strip()

    async def _spawn(self, argv: list[str], env: dict[str, str], cwd: str | None) -> asyncio.subprocess.Process:
        """The agent, started in a process group of its own.

        Shielded from cancellation: asyncio, cancelled while it connects a new
        process's pipes, kills the process and then waits for those pipes to
        close (Python 3.11, measured) — which never happens while a child the
        agent left behind holds them, so the cancelled turn hung and the
        group ran on. A cancel here lets the start finish, ends the group,
        then goes on."""
        starting = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=cwd, start_new_session=True))
        try:
            return await asyncio.shield(starting)
        except OSError as exc:
            raise ProviderError(f"provider {self.name}: cannot run {self.command[0]}: {exc}",
                                retryable=False) from exc
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                proc = await asyncio.wait_for(asyncio.shield(starting), REAP_WAIT)
                _kill_group(proc.pid)
                await asyncio.wait_for(proc.wait(), REAP_WAIT)
            raise


async def _talk(proc: asyncio.subprocess.Process, prompt: bytes) -> tuple[bytes, bytes]:
    """Write the prompt, read stdout and stderr to their ends."""
    async def write() -> None:
        try:
            proc.stdin.write(prompt)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):  # the agent did not read it all
            pass
        finally:
            proc.stdin.close()

    _, out, err = await asyncio.gather(write(), proc.stdout.read(), proc.stderr.read())
    return out, err


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def render(system: str, messages: Sequence[Message]) -> str:
    """The conversation as the plain text a CLI agent reads."""
    lines = [system, ""] if system else []
    for m in messages:
        if m.role == "tool":
            lines.append(f"tool {m.name}{' (failed)' if m.error else ''}: {m.text}")
            continue
        if m.text or m.role == "user":
            lines.append(f"{m.role}: {m.text}")
        for c in m.calls:
            lines.append(f"assistant calls {c.name}: {json.dumps(c.args)}")
    return "\n".join(lines) + "\n"
