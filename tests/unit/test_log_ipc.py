"""Log lines and ZeroMQ endpoint paths."""

from __future__ import annotations

import io
import json
import os

import pytest

from crewlet import ipc, log


def test_events_are_one_json_line_with_identity_fields():
    out = io.StringIO()
    log.configure(node="n1", role="seats", fmt="json", stream=out)
    log.event("child_started", child="seats", child_pid=12)
    record = json.loads(out.getvalue())
    assert out.getvalue().count("\n") == 1
    assert {k: record[k] for k in ("node", "role", "event", "child", "child_pid")} == \
        {"node": "n1", "role": "seats", "event": "child_started", "child": "seats", "child_pid": 12}
    assert record["pid"] == os.getpid() and record["level"] == "info"


def test_text_format_is_readable():
    out = io.StringIO()
    log.configure(node="n1", role="crewletd", fmt="text", stream=out)
    log.event("child_exited", "warning", child="seats", reason="signal 9 (SIGKILL)")
    line = out.getvalue()
    assert "WARN n1/crewletd[" in line and "child_exited" in line
    assert 'reason="signal 9 (SIGKILL)"' in line


def test_forward_passes_records_through_and_tags_stray_output():
    out = io.StringIO()
    log.configure(node="n1", role="crewletd", fmt="json", stream=out)
    ours = json.dumps({"ts": 1.0, "level": "info", "node": "n1", "role": "seats", "pid": 7,
                       "event": "role_ready"})
    log.forward(ours.encode() + b"\n", role="seats", pid=7)
    log.forward(b"Traceback (most recent call last):\n", role="seats", pid=7)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first == json.loads(ours)
    assert second["event"] == "child_output" and second["role"] == "seats" and second["pid"] == 7
    assert second["line"] == "Traceback (most recent call last):"


def test_levels_below_the_configured_one_are_dropped():
    out = io.StringIO()
    log.configure(node="n1", role="x", level="warning", fmt="json", stream=out)
    log.event("chatty", "info")
    log.event("loud", "error")
    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["loud"]


def test_run_dir_is_private_and_socket_paths_must_fit(tmp_path):
    run = tmp_path / "run"
    ipc.ensure_run_dir(str(run))
    assert (run.stat().st_mode & 0o777) == 0o700
    assert ipc.endpoint(str(run), "control") == f"ipc://{run}/control"
    too_long = "/tmp/" + "x" * 120
    with pytest.raises(ValueError, match="at most 107"):
        ipc.ensure_run_dir(too_long)
    assert not os.path.exists(too_long)


def test_a_caller_keeps_one_socket_and_leaves_nothing_queued_after_an_ask_unanswered(tmp_path):
    import asyncio

    import zmq
    import zmq.asyncio

    async def main():
        ctx = zmq.asyncio.Context()
        router = ipc.bind(ctx, str(tmp_path), zmq.ROUTER, "control")
        caller = ipc.Caller(ctx, str(tmp_path))

        async def answer():
            ident, empty, frame = await router.recv_multipart()
            msg = ipc.unpack(frame)
            await router.send_multipart([ident, empty, ipc.pack({"id": msg["id"], "ok": True, "op": msg["op"]})])

        try:
            for op in ("one", "two"):
                _, reply = await asyncio.gather(answer(), caller.call(op, timeout=2))
                assert reply["op"] == op
            kept = caller._sock
            with pytest.raises(ipc.NodeUnreachable):
                await caller.call("unanswered", timeout=0.2)
            assert caller._sock is None  # closed, with the unanswered ask
            await router.recv_multipart()  # the unanswered ask, read late
            _, reply = await asyncio.gather(answer(), caller.call("three", timeout=2))
            assert reply["op"] == "three" and caller._sock is not kept
        finally:
            caller.close()
            router.close()
            ctx.term()

    asyncio.run(main())
