"""The server-sent event reader the HTTP providers share
(crewlet.agent.providers.base.sse_events), on lines as a response gives them."""

from __future__ import annotations

import asyncio

from crewlet.agent.providers.base import sse_events


def read(*lines: str) -> list[tuple[str, str]]:
    async def source():
        for line in lines:
            yield line

    async def main():
        return [e async for e in sse_events(source())]
    return asyncio.run(main())


def test_events_their_names_and_joined_data():
    assert read("event: message_start", 'data: {"a": 1}', "",
                ": a keep-alive comment", "",
                "data: one", "data:two", "id: 7", "retry: 10", "",
                "data: [DONE]", "") == [
        ("message_start", '{"a": 1}'), ("message", "one\ntwo"), ("message", "[DONE]")]


def test_an_event_the_stream_ends_in_is_dropped():
    assert read("data: whole", "", 'data: {"cut sh') == [("message", "whole")]
    assert read("event: ping", "", "") == [], "an event without data is nothing"
