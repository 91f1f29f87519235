"""Secrets through the control plane (DESIGN §16; seed coupling 1).

A fleet's secrets — provider API keys, webhook signing secrets — are stored
once, fleet-wide, and reach every node within a second of being set, with
no restart:

    crewletctl secret set openai < key.txt        # a new version, sealed
    crewletctl secret set gh-hook --grace 86400   # the old one still taken a day
    crewletctl secret list                        # names, versions, who; never values

and the company names them beside (or instead of) environment variables::

    providers:
      llm: {kind: openai, api_key_secret: openai}
    integrations:
      gh: {kind: github, secret: gh-hook, routes: [...]}

========  ================================================================
keys      the vault key (derived from the fleet secret, or a key file, or
          a single node's own) and sealing: AES-256-GCM, name and version
          bound in (:mod:`.keys`)
store     the ``secrets`` bucket: one sealed record per secret, its newest
          version and the one it replaced while a grace lasts; set,
          remove, list, re-seal (:mod:`.store`)
follow    a process's opened secrets, kept by one watch: what a provider
          request and a webhook check read (:mod:`.follow`)
========  ================================================================

Who holds what. crewletd writes (``crewletctl secret`` and the API's admin
route go through its control socket) and re-seals at start what is sealed
with an older key it holds. The ``seats`` role reads (its providers' keys;
a CLI agent is given its own provider's key and no other), ``ingress`` reads
(webhook secrets), ``workers`` reads (the reconcile duty's GitHub token);
the broker refuses the ``secrets`` bucket to ``data_applier``
(:mod:`crewlet.permissions`). A value is
never logged, never in status, the estate or an API answer, never in any
child's environment but a CLI agent's own key; every process that opens
one learns it (:mod:`crewlet.redaction`), so text from a tool that says it
back is kept redacted.
"""

from crewlet.vault.follow import Opened, Vault
from crewlet.vault.keys import Keys, Unsealable, ensure_own, vault_keys
from crewlet.vault.store import BadSecret, Record

__all__ = ["BadSecret", "Keys", "Opened", "Record", "Unsealable", "Vault", "ensure_own", "vault_keys"]
