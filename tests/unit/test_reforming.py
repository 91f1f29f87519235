"""The fleet re-forming is a 503 with Retry-After, never a 500 (issue 29):
how :mod:`roles.ingress.problems` tells a leader election's failures from a
bug, answers them and logs them, and how a read rides one out
(:func:`roles.ingress.api.common.ride_out`). The whole of it, on a real
three-member fleet under a member's death, is tests/fleet/test_reform.py."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import nats.errors
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from crewlet import log
from crewlet.bus import Unanswered
from crewlet.conversations.runs import RunsError
from crewlet.coord.lease import LeaseError
from roles.ingress import problems
from roles.ingress.api import common
from roles.ingress.problems import REFORMING, reforming


def _wrapped(inner: BaseException, outer: type[Exception] = RunsError, *,
             suppress: bool = False) -> Exception:
    """*outer* raised from *inner* (``from exc``), or over it ``from None``."""
    try:
        try:
            raise inner
        except BaseException as exc:
            if suppress:
                raise outer("wrapped") from None
            raise outer("wrapped") from exc
    except Exception as exc:
        return exc


def _in_handler(inner: BaseException) -> Exception:
    """A bug raised while handling *inner* (implicit chaining only)."""
    try:
        try:
            raise inner
        except BaseException:
            return {}["missing"]
    except Exception as exc:
        return exc


@pytest.mark.parametrize("exc", [
    nats.errors.TimeoutError(), nats.errors.NoRespondersError(), nats.errors.ConnectionClosedError(),
    ServiceUnavailableError(code=503, description="JetStream system temporarily unavailable"),
    APIError(code=500, err_code=10009, description="JetStream cluster can not handle request"),
    APIError(code=503, err_code=10008, description="JetStream system temporarily unavailable"),
    Unanswered("publishing: no answer in time"),
])
def test_a_leader_elections_failures_are_the_fleet_reforming(exc):
    assert reforming(exc) is exc
    assert reforming(_wrapped(exc)) is exc                      # raise RunsError(...) from exc
    assert reforming(_wrapped(_wrapped(exc), LeaseError)) is exc
    assert reforming(_wrapped(exc, suppress=True)) is exc       # raise ... from None over it


@pytest.mark.parametrize("exc", [
    NotFoundError(code=404, err_code=10037, description="no message found"),
    APIError(code=400, err_code=10071, description="wrong last sequence"),
    RuntimeError("a bug"), KeyError("x"), TimeoutError(),      # asyncio's own timeout is not the broker's
    _in_handler(nats.errors.TimeoutError()),                    # a bug while handling a timeout stays a bug
])
def test_anything_else_is_not(exc):
    assert reforming(exc) is None
    assert reforming(_wrapped(exc)) is None


def test_a_group_is_reforming_only_when_each_of_it_is():
    timeout = nats.errors.TimeoutError()
    assert reforming(BaseExceptionGroup("g", [timeout, Unanswered("x")])) is timeout
    assert reforming(BaseExceptionGroup("g", [timeout, RuntimeError("bug")])) is None


def test_a_routes_own_503_says_the_fleet_reforms_when_that_is_its_cause():
    election = problems.unavailable(_wrapped(nats.errors.TimeoutError()), "runs_unavailable",
                                    "following run r")
    assert election.status == 503 and election.code == REFORMING and election.headers["Retry-After"] == "2"
    assert "re-forming" in election.detail and "following run r" in election.detail
    other = problems.unavailable(RunsError("refused"), "runs_unavailable", "refused", retry_after=5)
    assert other.code == "runs_unavailable" and other.headers == {"Retry-After": "5"}
    assert problems.lately_reforming() is not None  # readiness says it a moment


def test_every_503_carries_retry_after():
    plain = problems.problem_response(503, "unavailable", "not yet")
    assert plain.headers["retry-after"] == str(problems.RETRY_AFTER)
    own = problems.problem_response(503, "estate_unavailable", "nobody", headers={"Retry-After": "5"})
    assert own.headers["retry-after"] == "5"
    assert "retry-after" not in problems.problem_response(409, "conflict", "x").headers


@pytest.fixture
def logged():
    out = io.StringIO()
    stream, log._state.stream = log._state.stream, out
    try:
        yield lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    finally:
        log._state.stream = stream


def _app() -> TestClient:
    app = FastAPI()
    problems.install(app)

    @app.get("/election")
    async def election():
        raise _wrapped(nats.errors.TimeoutError())

    @app.get("/bug")
    async def bug():
        raise _in_handler(nats.errors.TimeoutError())

    @app.get("/cut")
    async def cut():
        async def body():
            yield b"a first part"
            raise nats.errors.TimeoutError()
        return StreamingResponse(body())

    return TestClient(app, raise_server_exceptions=False)


def test_an_election_escaping_a_route_is_a_503_logged_as_a_warning_and_a_bug_a_500(logged):
    client = _app()
    r = client.get("/election")
    assert r.status_code == 503 and r.headers["retry-after"] == str(problems.RETRY_AFTER)
    assert r.headers["content-type"].startswith(problems.MEDIA_TYPE) and r.json()["code"] == REFORMING
    r = client.get("/bug")
    assert r.status_code == 500 and r.json()["code"] == "internal"
    events = {e["event"]: e for e in logged()}
    assert events["api_fleet_reforming"]["level"] == "warning"
    assert events["api_fleet_reforming"]["error"] == "TimeoutError: nats: timeout"
    bug = events["api_internal_error"]
    assert bug["level"] == "error" and "KeyError" in bug["error"]


def test_an_answer_cut_short_by_an_election_is_cut_and_logged_as_a_warning(logged):
    client = _app()
    with pytest.raises(nats.errors.TimeoutError):   # raised on: the server cuts the connection
        with TestClient(client.app) as strict:
            strict.get("/cut")
    events = [e for e in logged() if e["event"] in ("api_fleet_reforming", "api_internal_error")]
    seen = [(e["event"], e["level"], e.get("cut")) for e in events]
    assert seen == [("api_fleet_reforming", "warning", True)]
    # uvicorn's own record of it ("Exception in ASGI application") is a warning.
    record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application\n",
                               (), (nats.errors.TimeoutError, nats.errors.TimeoutError(), None))
    assert problems.QuietReforming().filter(record) and record.levelno == logging.WARNING
    record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application\n",
                               (), (KeyError, KeyError("x"), None))
    assert problems.QuietReforming().filter(record) and record.levelno == logging.ERROR


def test_a_read_rides_an_election_out_within_its_patience(monkeypatch):
    monkeypatch.setattr(common, "RIDE_PAUSE", 0.01)
    tries = []

    async def flaky():
        tries.append(1)
        if len(tries) < 3:
            raise _wrapped(nats.errors.TimeoutError())
        return "read"
    assert asyncio.run(common.ride_out(flaky, patience=5)) == "read" and len(tries) == 3

    async def never():
        tries.append(1)
        raise nats.errors.NoRespondersError()
    tries.clear()
    with pytest.raises(nats.errors.NoRespondersError):
        asyncio.run(common.ride_out(never, patience=0.2))
    assert 2 <= len(tries) <= 10

    async def bug():
        tries.append(1)
        raise KeyError("x")
    tries.clear()
    with pytest.raises(KeyError):
        asyncio.run(common.ride_out(bug, patience=5))
    assert len(tries) == 1  # not tried again: only the fleet re-forming is
