"""crewlet: runs a company of AI agents ("seats") on one machine or a fleet.

The library every role shares. See ``README.md`` and ``DESIGN.md``.
"""

__version__ = "0.1.0"
# Bumped when nodes of different versions can no longer work together.
# 2: estate ops and requests name their origin (crewlet.estate.origins): an
# applier of 1 reads none of a seats process's ops of 2 — upgrade data nodes first.
PROTOCOL_VERSION = 2
