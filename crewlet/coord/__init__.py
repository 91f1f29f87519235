"""Fleet coordination over NATS JetStream KV (DESIGN §4).

* :mod:`crewlet.coord.buckets` — the coordination buckets, created idempotently
* :mod:`crewlet.coord.lease` — leases with a TTL and a fencing token
"""
