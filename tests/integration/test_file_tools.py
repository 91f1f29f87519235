"""The seat tools over the company's files (crewlet.agent.file_tools), called as
a turn calls them: through a seat's Registry, with a router over a real
nats-server to a real applier (the harness of test_router and
test_estate_tools), the bytes in a real object store bucket on that server.
"""

from __future__ import annotations

import hashlib

from crewlet.agent import file_tools
from crewlet.agent.file_tools import FILE_TOOL_NAMES, READ_SHOWN
from crewlet.config.model import FilesSection
from crewlet.estate import ops
from crewlet.objects.files import upload
from crewlet.objects.nats import NatsObjectStore
from tests.integration.test_estate_tools import call, ok, routed_services, seat_tools
from tests.integration.test_router import fleet_test


async def file_services(fleet, **files):
    services = await routed_services(fleet, "a")
    nc, js = await fleet.connect()
    await NatsObjectStore(js, nc, bucket="files").ensure()  # crewletd's, on a node
    services.files, services.js, services.nc = FilesSection(**files), js, nc
    return services


@fleet_test
async def test_a_seat_writes_a_file_and_reads_it_back(fleet):
    applier = await fleet.add("a")
    services = await file_services(fleet)
    reg = seat_tools()
    assert set(FILE_TOOL_NAMES) <= set(reg.names())

    text = "# Plan\n\nShip the estate — then the files. ✓\n"
    first = call(services, "f1.0.0")
    wrote = await ok(reg, first, "file_write", {"project": "site", "path": "docs/plan.md", "text": text,
                                                "content_type": "text/markdown"})
    data = text.encode()
    assert wrote == (f"wrote site/docs/plan.md (version 1, {len(data)} bytes, "
                     f"sha256 {hashlib.sha256(data).hexdigest()})")
    # The turn is redone (the same call key): the row lands once, the answer is the first.
    assert await ok(reg, first, "file_write", {"project": "site", "path": "docs/plan.md", "text": text,
                                               "content_type": "text/markdown"}) == wrote
    row = applier.reader.query("file.get", {"project": "site", "path": "docs/plan.md"})["file"]
    assert (row["version"], row["content_type"], row["registered_by"]) == (1, "text/markdown", "cto")

    shown = await ok(reg, call(services, "f2.0.0", seat="ceo"), "file_read",
                     {"project": "site", "path": "docs/plan.md"})
    head, body = shown.split("\n\n", 1)
    assert head.startswith(f"site/docs/plan.md · version 1 · {len(data)} bytes · text/markdown · by cto ")
    assert body == text

    # Written again: a new version.
    assert (await ok(reg, call(services, "f3.0.0"), "file_write",
                     {"project": "site", "path": "docs/plan.md", "text": "v2"})).startswith(
        "wrote site/docs/plan.md (version 2, 2 bytes")
    head, body = (await ok(reg, call(services, "f4.0.0"), "file_read",
                           {"project": "site", "path": "docs/plan.md"})).split("\n\n", 1)
    assert head.startswith("site/docs/plan.md · version 2 · 2 bytes · text/plain; charset=utf-8 · by cto ")
    assert body == "v2"

    # A long file is cut, saying so; a binary one is described, not shown.
    long = "x" * (READ_SHOWN + 10)
    await ok(reg, call(services, "f5.0.0"), "file_write", {"project": "site", "path": "long.txt", "text": long})
    shown = await ok(reg, call(services, "f5.1.0"), "file_read", {"project": "site", "path": "long.txt"})
    assert shown.endswith(f"\n… (cut: showing the first {READ_SHOWN:,} of {READ_SHOWN + 10:,} bytes)")
    assert shown.split("\n\n", 1)[1].startswith("x" * READ_SHOWN + "\n…")
    objects, _ = file_tools.store(call(services, "f6.0.0"))
    blob = bytes(range(256)) * 10

    async def by_operator(args):
        op = ops.make_op("file.register", args, node="test")
        return (await services.estate.write(op))["result"]["file"]

    await upload(objects, project="site", path="logo.png", source=blob, max_bytes=10_000,
                 register=by_operator, content_type="image/png")
    shown = await ok(reg, call(services, "f6.1.0"), "file_read", {"project": "site", "path": "logo.png"})
    assert shown.endswith(f"binary, not shown (sha256 {hashlib.sha256(blob).hexdigest()})")
    assert "· 2,560 bytes · image/png ·" in shown


@fleet_test
async def test_refusals_say_why(fleet):
    await fleet.add("a")
    services = await file_services(fleet, max_bytes=100)
    reg = seat_tools()

    text, error = await reg.call(call(services, "r1.0.0"), "file_read", {"project": "site", "path": "nope"})
    assert error and text == "no file nope in project site"
    text, error = await reg.call(call(services, "r2.0.0"), "file_write",
                                 {"project": "site", "path": "big.txt", "text": "é" * 51})
    assert error and text == "the text is 102 bytes of UTF-8; file_write takes at most 100"
    text, error = await reg.call(call(services, "r3.0.0"), "file_write",
                                 {"project": "-bad", "path": "a", "text": "x"})
    assert error and text.startswith("invalid arguments for file_write: project:")
    # A stale fencing token (below the one the seat's last write raised its fence to):
    # the bytes may be stored, the row is refused.
    mine = services.tokens["cto"]
    await ok(reg, call(services, "r4.0.0"), "file_write", {"project": "site", "path": "mine.txt", "text": "ok"})
    text, error = await reg.call(call(services, "r4.1.0", token=mine - 1), "file_write",
                                 {"project": "site", "path": "zombie.txt", "text": "boo"})
    assert error and text == f"refused: stale fencing token {mine - 1} for seat cto: the seat is at {mine}"
    text, error = await reg.call(call(services, "r5.0.0"), "file_read", {"project": "site", "path": "zombie.txt"})
    assert error and text == "no file zombie.txt in project site"

    # A process given no file store says so.
    services.files = None
    text, error = await reg.call(call(services, "r6.0.0"), "file_read", {"project": "site", "path": "a"})
    assert error and text == "files are not available on this node (its seats process has no file store)"
