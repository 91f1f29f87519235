"""crewlet: runs a company of AI agents ("seats") on one machine or a fleet.

The library every role shares. See ``README.md`` and ``DESIGN.md``.
"""

__version__ = "0.1.0"
# Bumped when nodes of different versions can no longer work together.
# 2: estate ops and requests name their origin (crewlet.estate.origins): an
# applier of 1 reads none of the seats subjects, so while one is live the seats
# of 2 ask an applier of 2 to log their fences and turn records (Router.to_log).
PROTOCOL_VERSION = 2
