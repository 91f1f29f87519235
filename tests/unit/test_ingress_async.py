"""Every /v1 route of ingress and every dependency it takes is a coroutine: FastAPI
runs a plain ``def`` in its thread pool, a hop to a thread and back (and a GIL hand-off
each way) on every request, for what here is a sha256 or a regex (bench/conversations.py
measured it in the 409's time)."""

from __future__ import annotations

import inspect

from roles.ingress.app import ROUTERS


def _coroutine(call) -> bool:
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(getattr(call, "__call__", None)) \
        or inspect.isasyncgenfunction(call)


def _calls(dependant):
    for dep in dependant.dependencies:
        yield dep.call
        yield from _calls(dep)


def test_no_route_or_dependency_runs_in_the_thread_pool():
    sync = set()
    routes = 0
    for router in ROUTERS:
        for route in router.routes:
            dependant = getattr(route, "dependant", None)
            if dependant is None:
                continue
            routes += 1
            for call in [route.endpoint, *_calls(dependant)]:
                if not _coroutine(call):
                    sync.add(f"{getattr(call, '__module__', '?')}.{getattr(call, '__qualname__', call)}")
    assert routes > 20
    assert not sync, f"run in the thread pool on every request: {sorted(sync)}"
