"""The routes of ``/v1``, one module per area; :data:`ROUTERS` is every one.

=========  ==================================================================
fleet      ``GET /v1/fleet``: nodes, their children and copies, duties, revision
seats      ``GET /v1/seats``, ``/v1/seats/{seat}``, ``POST .../mail``
estate     turns, tasks, pages and search: through the estate router
files      ``PUT``/``GET``/``DELETE /v1/files/{project}/{path}``: a file's bytes and row
dlq        dead letters, and requeueing one
company    the revision in force; ``POST`` applies one (admin)
hooks      ``POST /v1/hooks/{integration}``: webhooks (no token: signatures)
feed       ``GET /v1/events`` (SSE) and ``/v1/ws`` (WebSocket)
=========  ==================================================================
"""
