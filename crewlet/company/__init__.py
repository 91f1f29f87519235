"""Tier B config: the company — seats, providers, schedules, budgets, retention, learning, integrations.

    from crewlet.company import load_company
    from crewlet.config import ConfigError
    try:
        company = load_company("etc/company.yaml")
    except ConfigError as e:
        sys.exit(f"crewletctl: {e}")       # one line: <file>: <key>: <problem>; exit e.EXIT_CODE (78)
    company.digest()                       # 16 hex chars, stable across key order and omitted defaults

The file, in short (``crewlet/company/model.py`` holds the defaults and
every check; ``etc/company.yaml`` is the annotated sample)::

    company: {name: Acme}                  # required
    providers:                             # at least one, by name
      local: {kind: scripted, rules: [{match: hello, reply: hi}]}
    seats:                                 # at least one; names unique
      - {name: pm, persona: "...", provider: local, placement: {labels: {zone: eu}}}
    schedules: [{name: standup, seat: pm, cron: "0 9 * * 1-5", tz: Europe/Paris, message: "..."}]  # every XOR cron; catch_up
    budgets: {org: 500000, seats: {pm: 50000}}
    retention: {turns_days: 90, mail_days: 14, events_days: 7}
    learning: {every: 600, compact_after: 604800, min_cluster: 3, auto_promote: false,
               max_drafts_per_pass: 5}   # provider: one of providers (default: each seat's own)
    integrations:                          # inbound webhooks at /v1/hooks/<name> (crewlet.hooks)
      gh: {kind: github, secret_env: GITHUB_WEBHOOK_SECRET,   # github, slack or generic
           routes: [{event: issues, repository: acme/web, seat: pm}]}   # first match wins

A company is applied to the fleet with ``crewletctl apply``, which stores it
as an append-only revision (:mod:`crewlet.coord.control_plane`).
"""

from .load import load_company, parse_company
from .model import Company, Integration, Provider, Route, Schedule, Seat

__all__ = ["Company", "Integration", "Provider", "Route", "Schedule", "Seat", "load_company", "parse_company"]
