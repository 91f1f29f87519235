"""The server-sent event reader the HTTP providers share
(crewlet.agent.providers.base.sse_events), on lines as a response gives them,
and the lines of a body as its chunks come (body_lines)."""

from __future__ import annotations

import asyncio

from crewlet.agent.providers.base import body_lines, sse_events


def through(reader, items: tuple) -> list:
    """What *reader* makes of an async iterator of *items*."""
    async def source():
        for item in items:
            yield item

    async def main():
        return [out async for out in reader(source())]
    return asyncio.run(main())


def read(*lines: str) -> list[tuple[str, str]]:
    return through(sse_events, lines)


def test_events_their_names_and_joined_data():
    assert read("event: message_start", 'data: {"a": 1}', "",
                ": a keep-alive comment", "",
                "data: one", "data:two", "id: 7", "retry: 10", "",
                "data: [DONE]", "") == [
        ("message_start", '{"a": 1}'), ("message", "one\ntwo"), ("message", "[DONE]")]


def test_an_event_the_stream_ends_in_is_dropped():
    assert read("data: whole", "", 'data: {"cut sh') == [("message", "whole")]
    assert read("event: ping", "", "") == [], "an event without data is nothing"


def lines_of(*chunks: bytes) -> list[str]:
    return through(body_lines, chunks)


def test_body_lines_end_at_crlf_lf_or_cr_wherever_the_chunks_are_cut():
    assert lines_of(b"data: a\r\n\r\ndata: b\n\ndata: c\r\rtail") == [
        "data: a", "", "data: b", "", "data: c", "", "tail"]
    # A CRLF cut between two chunks is one end; a CR that ends the body ends its line.
    assert lines_of(b"data: a\r", b"\n", b"\r", b"\nevent: x\r") == ["data: a", "", "event: x"]
    assert lines_of(b"da", b"ta: ", b"\xc3", b"\xa9t\xc3\xa9\n") == ["data: été"], "a character cut in two"
    assert lines_of(b"bad \xff byte\n") == ["bad \ufffd byte"]
    assert lines_of() == [] and lines_of(b"") == []
