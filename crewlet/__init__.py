"""crewlet: runs a company of AI agents ("seats") on one machine or a fleet.

The library every role shares. See ``README.md`` and ``DESIGN.md``.
"""

import os

__version__ = "0.1.0"
# Bumped when nodes of different versions can no longer work together.
# 2: estate ops and requests name their origin (crewlet.estate.origins): an
# applier of 1 reads none of the seats subjects, so while one is live the seats
# of 2 ask an applier of 2 to log their fences and turn records (Router.to_log).
# 3: a seats process sends many turns' records in one ``turn.records`` op
# (roles/seats/kept.py), which an applier of 2 refuses as an unknown kind.
# 4: the seats of a data node publish their tools' and conversation turns'
# writes on their own subject (Router.write), which an applier of 3 passes over.
PROTOCOL_VERSION = 4
# Tests only: what this process says its protocol is, in place of
# PROTOCOL_VERSION — how a protocol bump's procedure (drain the whole fleet)
# is tested without two versions of the code (tests/fleet/test_drain.py).
PROTOCOL_ENV = "CREWLET_TEST_PROTOCOL"


def protocol() -> int:
    """The protocol this node speaks (its presence says it; a node of another
    than the fleet's refuses to start, exit 78: supervisor/fleet.py)."""
    value = os.environ.get(PROTOCOL_ENV, "")
    return int(value) if value.isdigit() else PROTOCOL_VERSION
