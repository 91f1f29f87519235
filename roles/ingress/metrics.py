"""``GET /metrics``: Prometheus text, with prometheus-client.

Two kinds of figures:

* **counted here**, as this ingress sees them happen: turns by seat and
  outcome and their durations (every turn record of the fleet reaches every
  ingress), router requests by outcome, webhook deliveries by outcome, API
  requests by route and status;
* **read at scrape time** from the :class:`~roles.ingress.projection.Projection`
  (:class:`_Live`): mailbox pending and in flight per seat, leases held per
  node, children's restarts and last exit per node, and each copy of the
  estate's applied seq, how far behind the furthest it is, and whether it is
  in service; what retention removed in all (``crewlet_retention_removed_total``,
  by ``what``: turns, mail, mailboxes — the ``maintenance`` duty's totals,
  carried from holder to holder — and events, each data node's own, by
  ``node``); what the learning passes did in all (``crewlet_learning_steps_total``,
  ``_provider_calls_total``, ``_ops_total``, ``_skipped_total``, ``_tokens_total``: the
  ``learning`` duty's totals, carried likewise). Nothing is kept twice, so a seat or node
  that went has no stale series.

``/metrics`` takes a token with ``read`` unless ``ingress.metrics_open``.
Each ingress process has its own registry (the suite runs several nodes in
one machine; the global default registry would mix them).
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Turn durations, seconds: a scripted turn takes milliseconds, a model's minutes.
TURN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
# The learning duty's totals /metrics shows, and what each says.
LEARNING_COUNTS = (("steps", "Learning steps done: compactions, drafts and promotions written"),
                   ("provider_calls", "Provider calls of the learning passes"),
                   ("ops", "Estate ops the learning passes wrote"),
                   ("skipped", "Learning steps skipped: landed before, or no provider for them"),
                   ("tokens", "Tokens the learning passes' provider calls used"))
API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class Metrics:
    def __init__(self, projection):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.turns = Counter("crewlet_turns", "Turns that ended, by seat and outcome",
                             ["seat", "outcome"], registry=r)
        self.turn_seconds = Histogram("crewlet_turn_duration_seconds", "How long turns took",
                                      buckets=TURN_BUCKETS, registry=r)
        self.router_requests = Counter("crewlet_router_requests", "Estate requests of this ingress, "
                                       "by kind and outcome", ["kind", "outcome"], registry=r)
        self.webhooks = Counter("crewlet_webhook_deliveries", "Webhook deliveries, by integration "
                                "and outcome", ["integration", "outcome"], registry=r)
        self.mail_sent = Counter("crewlet_api_mail", "Mail sent through the API", registry=r)
        self.api = Histogram("crewlet_api_request_duration_seconds", "API requests, by route and status",
                             ["method", "route", "status"], buckets=API_BUCKETS, registry=r)
        r.register(_Live(projection))

    def turn(self, record: dict[str, Any]) -> None:
        outcome = record.get("outcome")
        if outcome in (None, "running"):
            return
        self.turns.labels(str(record.get("seat")), str(outcome)).inc()
        took = record.get("took_ms")
        if isinstance(took, (int, float)) and took >= 0:
            self.turn_seconds.observe(took / 1000)

    def router(self, kind: str, outcome: str) -> None:
        self.router_requests.labels(kind, outcome).inc()

    def webhook(self, integration: str, outcome: str) -> None:
        self.webhooks.labels(integration, outcome).inc()


class _Live(Collector):
    """Gauges read from the projection when scraped."""

    def __init__(self, projection):
        self.p = projection

    def describe(self) -> list:
        return []  # the families depend on the fleet; nothing to check up front

    def collect(self) -> Iterator[GaugeMetricFamily]:
        p = self.p
        pending = GaugeMetricFamily("crewlet_mailbox_pending", "Mail waiting in a seat's mailbox",
                                    labels=["seat"])
        flight = GaugeMetricFamily("crewlet_mailbox_in_flight", "Mail being worked", labels=["seat"])
        dead = GaugeMetricFamily("crewlet_mailbox_dead_letters", "Dead letters of a seat", labels=["seat"])
        for seat in p.seat_names:
            box = p.mailboxes.get(seat) or {}
            if "pending" in box:
                pending.add_metric([seat], box["pending"])
                flight.add_metric([seat], box["in_flight"])
            dead.add_metric([seat], p.dead.get(seat, 0))
        yield from (pending, flight, dead)

        leases = GaugeMetricFamily("crewlet_leases_held", "Leases held, by node and kind",
                                   labels=["node", "kind"])
        counts: dict[tuple[str, str], int] = {}
        for kind in ("seat", "duty"):
            for owner in p.holders.of(kind + ".").values():
                counts[(owner.node, kind)] = counts.get((owner.node, kind), 0) + 1
        for (node, kind), n in sorted(counts.items()):
            leases.add_metric([node, kind], n)
        yield leases

        up = GaugeMetricFamily("crewlet_node_up", "1 while a node's presence is live, 0 once gone",
                               labels=["node"])
        restarts = GaugeMetricFamily("crewlet_child_restarts", "Restarts of a role child since its "
                                     "node started", labels=["node", "child"])
        running = GaugeMetricFamily("crewlet_child_running", "1 while a role child runs",
                                    labels=["node", "child"])
        last_exit = GaugeMetricFamily("crewlet_child_last_exit", "A child's last exit: code, with its "
                                      "reason as a label", labels=["node", "child", "reason"])
        applied = GaugeMetricFamily("crewlet_estate_applied", "The last log seq a copy applied",
                                    labels=["node"])
        behind = GaugeMetricFamily("crewlet_estate_behind", "Ops a copy is behind the furthest copy",
                                   labels=["node"])
        in_service = GaugeMetricFamily("crewlet_estate_in_service", "1 while a copy answers requests",
                                       labels=["node"])
        nodes = p.nodes()
        top = max((n["copy"]["applied"] for n in nodes if n.get("copy")), default=0)
        for node in nodes:
            up.add_metric([node["id"]], 1 if node["state"] == "up" else 0)
            for child in node.get("children") or []:
                name = str(child.get("name"))
                restarts.add_metric([node["id"], name], child.get("restarts") or 0)
                running.add_metric([node["id"], name], 1 if child.get("state") == "running" else 0)
                exit_ = child.get("last_exit")
                if isinstance(exit_, dict):
                    code = exit_.get("code")
                    last_exit.add_metric([node["id"], name, str(exit_.get("reason") or "")],
                                         code if isinstance(code, (int, float)) else -1)
            copy = node.get("copy")
            if copy:
                applied.add_metric([node["id"]], copy["applied"])
                behind.add_metric([node["id"]], top - copy["applied"])
                in_service.add_metric([node["id"]], 1 if copy["in_service"] else 0)
        yield from (up, restarts, running, last_exit, applied, behind, in_service)
        yield self._retention()
        yield from self._learning()

    def _learning(self) -> Iterator[CounterMetricFamily]:
        """What the learning passes did in all: the learning duty's totals
        (roles/workers/duties/learning.py), carried from holder to holder."""
        totals = (self.p.reports.get("learning") or {}).get("totals") or {}
        for what, says in LEARNING_COUNTS:
            n = totals.get(what)
            if isinstance(n, int) and not isinstance(n, bool):
                family = CounterMetricFamily(f"crewlet_learning_{what}", says)
                family.add_metric([], n)
                yield family

    def _retention(self) -> CounterMetricFamily:
        """What retention removed: the maintenance duty's totals (node ""), and
        each data node's pruned events since its applier started (its
        ``estate.<node>`` status record: a restart starts it again, as
        Prometheus expects of a counter)."""
        removed = CounterMetricFamily("crewlet_retention_removed", "What retention removed, by what "
                                      "(turns, mail, mailboxes: the fleet's; events: each data node's)",
                                      labels=["what", "node"])
        totals = (self.p.reports.get("maintenance") or {}).get("totals") or {}
        for what in ("turns", "mail", "mailboxes"):
            if isinstance(totals.get(what), int):
                removed.add_metric([what, ""], totals[what])
        view = self.p.estate_view
        for node in sorted(s.id for s in view.data_nodes()):
            pruned = (view.record(node) or {}).get("events_pruned")
            if isinstance(pruned, int):
                removed.add_metric(["events", node], pruned)
        return removed
