"""crewlet: runs a company of AI agents ("seats") on one machine or a fleet.

The library every role shares. See ``README.md`` and ``DESIGN.md``.
"""

__version__ = "0.1.0"
# Bumped when nodes of different versions can no longer work together.
PROTOCOL_VERSION = 1
