"""Everything too big is refused before it is sent, naming the limit (issue 16).

A company revision is stored in parts (crewlet.coord.control_plane), up to
``REVISION_MAX`` (64 MiB) of JSON: a company of exactly that size is stored
and read back from a real nats-server, one byte more is refused before a
part is written, and a company over it is refused by ``crewletctl apply
--check``, ``crewletctl apply`` and ``crewletd start --company`` with exit
78, nothing stored. Mail holds at most ``MAIL_MAX`` characters, the most of
them (4-byte characters included) fits the real broker, and ``crewletctl
send`` refuses more, bad UTF-8 and a ``dlq requeue`` number past a stream
sequence as one line, never a traceback.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import nats
import pytest

from crewlet.company import Company
from crewlet.company.model import REVISION_MAX
from crewlet.coord.buckets import subjects
from crewlet.coord.control_plane import JS_TIMEOUT, ControlPlane, RevisionTooLarge, revision_size
from crewlet.queue.base import MAIL_MAX, SEQ_MAX
from tests.conftest import CREWLETCTL, wait_for

SOURCE = "/srv/company.yaml"
LIMIT_TEXT = f"over the limit of {REVISION_MAX:,} bytes (64 MiB) a company revision may have"


def company_doc(persona: int) -> dict:
    return {"company": {"name": "Big"},
            "providers": {"local": {"kind": "scripted", "rules": [{"match": "hello", "reply": "hi"}]}},
            "seats": [{"name": "solo", "provider": "local", "persona": "p" * persona}]}


def company_text(persona: int) -> str:
    """The YAML of :func:`company_doc`, written by hand: PyYAML's emitter
    takes a minute over a 64 MB scalar."""
    return ("company: {name: Big}\n"
            "providers: {local: {kind: scripted, rules: [{match: hello, reply: hi}]}}\n"
            f"seats:\n- name: solo\n  provider: local\n  persona: {'p' * persona}\n")


def sized(bytes_: int) -> Company:
    """A company whose revision measures exactly *bytes_* (an ASCII persona is a byte a character)."""
    base = revision_size(Company.model_validate(company_doc(1)))
    company = Company.model_validate(company_doc(1 + bytes_ - base))
    assert revision_size(company) == bytes_
    return company


def on(natsd, scenario):
    async def main():
        nc = await nats.connect(natsd.url, connect_timeout=2)
        try:
            return await scenario(await ControlPlane.open(nc.jetstream(timeout=JS_TIMEOUT), 1), nc)
        finally:
            await nc.close()
    return asyncio.run(main())


def test_a_company_at_the_limit_is_stored_and_one_byte_over_is_refused_unsent(natsd):
    within = sized(REVISION_MAX)

    async def scenario(plane, nc):
        assert await plane.append(within, SOURCE, by="op@host") == 1  # the real broker takes it, in parts
        stored = await plane.revision(1)
        parts = await subjects(plane.js, "config", "part.>")
        with pytest.raises(RevisionTooLarge) as info:
            await plane.append(sized(REVISION_MAX + 1), SOURCE, by="op@host")
        return stored, parts, info.value, await plane.highest(), await subjects(plane.js, "config", "part.>")

    stored, parts, refused, highest, parts_after = on(natsd, scenario)
    assert stored["digest"] == within.digest() and len(stored["company"]["seats"][0]["persona"]) > 60_000_000
    assert refused.limit == REVISION_MAX and refused.size == REVISION_MAX + 1
    assert highest == 1 and parts_after == parts  # nothing of the refused one was written


@pytest.fixture
def big_company(short_tmp):
    path = os.path.join(short_tmp, "big.yaml")
    with open(path, "w") as f:
        f.write(company_text(REVISION_MAX + 1000))
    return path


def test_crewletctl_apply_refuses_a_company_over_the_limit(natsd, tier_a, big_company):
    for args in (["apply", "--check", big_company], ["apply", big_company]):
        done = subprocess.run([*CREWLETCTL, "-c", tier_a, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 78, (args, done.stdout, done.stderr)
        assert done.stderr.startswith(f"crewletctl: {big_company}: the company's stored revision would be ")
        assert LIMIT_TEXT in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr

    async def written(plane, nc):
        return await plane.highest(), await subjects(plane.js, "config", ">")
    assert on(natsd, written) == (0, [])  # nothing was sent


def test_crewletd_start_refuses_a_company_over_the_limit(make_node, big_company):
    node = make_node().start(wait_ready=False, args=("--company", big_company))
    assert node.proc.wait(60) == 78
    log = node.read_log()
    assert f"{big_company}: the company's stored revision would be " in log and LIMIT_TEXT in log, log
    assert "Traceback" not in log
    assert not os.path.exists(os.path.join(node.run_dir, "control"))  # it never started a thing


# ------------------------------------------------------------------ crewletctl send and dlq on a real node

SMALL = """
company: {name: Small}
providers: {local: {kind: scripted, rules: [{match: hello, reply: hi}]}}
seats: [{name: solo, persona: does everything, provider: local}]
"""


def ctl(node, *args: str, input: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CREWLETCTL, "-c", node.config_path, *args], input=input, capture_output=True,
                          timeout=60, env=env)


def refused(done: subprocess.CompletedProcess, code: int, *words: str) -> str:
    err = done.stderr.decode()
    assert done.returncode == code, (done.returncode, err)
    assert "Traceback" not in err and all(w in err for w in words), err
    return err


def test_send_and_dlq_refuse_bad_input_and_the_limit_is_what_the_broker_takes(make_node, short_tmp):
    company = os.path.join(short_tmp, "small.yaml")
    with open(company, "w") as f:
        f.write(SMALL)
    node = make_node().start(args=("--company", company))
    # The company is applied once the node has joined: then the largest mail goes through.
    widest = ("😀" * MAIL_MAX).encode()  # 4 bytes a character: 400,000 bytes
    sent = wait_for(lambda: (lambda d: d if d.returncode == 0 else None)(ctl(node, "send", "solo", "-", input=widest)),
                    30, interval=0.5, what="the largest mail sent")
    assert b"sent to solo" in sent.stdout
    assert ctl(node, "send", "solo", "-", input=b"a" * MAIL_MAX).returncode == 0

    refused(ctl(node, "send", "solo", "-", input=b"a" * (MAIL_MAX + 1)), 2,
            f"the text is {MAIL_MAX + 1:,} characters; a mail holds at most {MAIL_MAX:,}")
    refused(ctl(node, "send", "solo", "-", input=b"a" * 5_000_000), 2, "a mail holds at most")
    refused(ctl(node, "send", "solo", "-", input=b"caf\xe9 \xff"), 2, "stdin is not UTF-8 text")
    # An argument of undecodable bytes: Python hands it over with surrogates (surrogateescape).
    refused(ctl(node, "send", "solo", os.fsdecode(b"caf\xe9")), 2, "not UTF-8 text")
    refused(ctl(node, "send", os.fsdecode(b"s\xffolo"), "hello"), 2, "an argument is not UTF-8 text")
    refused(ctl(node, "send", "solo", "hi", "--trigger", os.fsdecode(b"t\xff")), 2, "not UTF-8 text")

    refused(ctl(node, "dlq", "requeue", str(SEQ_MAX)), 1, f"no dead letter {SEQ_MAX}")
    refused(ctl(node, "dlq", "requeue", str(SEQ_MAX + 1)), 2, "is not in the range")
    refused(ctl(node, "dlq", "requeue", "9" * 400), 2, "is not in the range")
    assert ctl(node, "status").returncode == 0  # the node took none of it badly


def test_post_refuses_a_text_over_the_limit_before_publishing(natsd):
    """post() is what crewletd's `send` and the API's mail both call: it holds the
    limit itself, so a surface that forgot to check still sends nothing too big."""
    from crewlet.queue import JetStreamMailboxes
    from crewlet.queue.post import post

    async def main():
        nc = await nats.connect(natsd.url, connect_timeout=2)
        try:
            boxes = JetStreamMailboxes(nc.jetstream(timeout=JS_TIMEOUT), nc)
            await boxes.ensure_streams(replicas=1, max_consumers=10)
            await boxes.ensure(["solo"])
            with pytest.raises(ValueError, match=f"a mail holds at most {MAIL_MAX:,}"):
                await post(nc, boxes, "solo", "a" * (MAIL_MAX + 1), sender="test")
            before = await boxes.info("solo")
            sent = await post(nc, boxes, "solo", "a" * MAIL_MAX, sender="test")
            # The consumer's pending count follows the stored mail a moment later.
            deadline = time.monotonic() + 10
            while (after := await boxes.info("solo"))["pending"] < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return before, sent, after
        finally:
            await nc.close()

    before, sent, after = asyncio.run(main())
    assert before["pending"] == 0 and sent["seq"] >= 1 and after["pending"] == 1
