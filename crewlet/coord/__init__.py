"""Fleet coordination over NATS JetStream KV (DESIGN §4).

* :mod:`crewlet.coord.buckets` — the coordination buckets, created idempotently
* :mod:`crewlet.coord.lease` — leases with a TTL and a fencing token
* :mod:`crewlet.coord.presence` — a node's ``node.<id>`` lease; duplicate ids
* :mod:`crewlet.coord.sweep` — the seat sweep's decision, a pure function
* :mod:`crewlet.coord.control_plane` — company revisions and the activation epoch
"""
