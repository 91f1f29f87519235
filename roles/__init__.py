"""One package per child process of a node.

Each role package exposes ``async def main(ctx)`` (see :mod:`crewlet.runtime`);
the broker is the exception — it is ``nats-server`` itself, exec'd from a
forked child (:mod:`roles.broker`).
"""
