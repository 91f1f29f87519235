"""Duty ``learning``: the learning passes — compaction, clustering, curation, promotion (DESIGN §15).

While this node holds ``duty.learning`` it runs a **pass** at once and then
every ``learning.every`` seconds (the company's ``learning:`` section,
:class:`crewlet.company.model.Learning`). A pass reads every episode of the
company (query ``episode.scan``, page by page) and does four steps, in order:

1. **Compaction.** Per seat and counterparty with an episode older than
   ``learning.compact_after`` not compacted yet: its episodes up to the
   newest old one (compacted ones included: the summary carries them on),
   the oldest :data:`COMPACT_BATCH` of them at most, are summarised by a
   provider (user message ``Summarise these episodes…``, one ask and summary
   a line) and op ``episode.compact {seat, counterparty, through, summary}``
   replaces them with one compacted episode. The cutoff is rounded down to
   :data:`CUTOFF_GRAIN` (or ``compact_after``, if shorter) so two holders
   overlapping at a hand-over see the same episodes as old. At most
   :data:`COMPACTIONS_PER_PASS` a pass, the oldest first; the rest next pass.
2. **Clustering** of the recent episodes (not compacted, not old) by
   :func:`crewlet.learning.cluster.cluster` with ``learning.min_cluster``;
   a cluster a skill or a draft covers is dropped (query ``skill.list``, the
   skills and the drafts, :func:`~crewlet.learning.cluster.covered`), and so
   is one drafted before whatever became of the draft (query
   ``skill.drafts``, any status: promoted, rejected or pending).
3. **Curation.** For each new cluster, the biggest first, at most
   ``learning.max_drafts_per_pass``: a provider drafts a ``SKILL.md`` (user
   message ``Draft a skill…`` with the cluster's tools, terms and latest
   :data:`DRAFT_EPISODES` episodes). A draft that is a valid skill (held to
   :func:`crewlet.skills.format.check`, its name set to the cluster's) is
   kept as the model wrote it; one that is not becomes a valid one made here
   from its text: the cluster's suggested name, the description from its
   first line, its text as the body. Either way its metadata says
   ``crewlet-cluster`` (the cluster's id; always), and ``crewlet-tools`` and
   ``crewlet-seats`` (the cluster's, unless the model said). Then op
   ``skill.draft {name, cluster, seat, episodes, files, approval, expires_at}``
   — ``seat`` the seat of the cluster's first episode, ``episodes`` its
   seqs (the first :data:`DRAFT_EPISODES_MAX`) — with approval
   ``promote-<cluster id>``, which expires after :data:`DRAFT_TTL`. A name a skill or draft has already gets the
   cluster id's first characters after it.
4. **Promotion**, with ``learning.auto_promote`` only: a pending draft whose
   cluster has more episodes now than it had when drafted (it kept growing:
   the skill is being needed) is approved — op ``approval.decide {id,
   decision: approve, by: auto-promote}``. Otherwise a person with
   ``decides.promotions`` decides it through the approvals API.

Each step once
--------------
Every op's id is derived from its inputs: ``learning:compact:<seat>:
<counterparty>:<through>``, ``learning:draft:<cluster id>``,
``learning:promote:<approval>`` (:func:`crewlet.estate.ops.op_id`). Before
a provider is asked, the op's outcome is looked up (query ``op.outcome``):
one that landed already — a pass cut short after its write, run again here
or by another node — is skipped without asking the provider again (as the
copy that answers has it: one that has not applied the op yet says it has
not landed, the provider is asked once more, and the op still lands once, by
its id). Mostly the step is not even there to skip: the compacted episodes
are gone, the drafted cluster is covered. Before every step the lease is
looked at (:meth:`crewlet.coord.lease.Leases.current` with this holder's
token): a holder that lost it stops at once, so two holders overlap by one
step at most, and that step lands once by its id.

What a pass fails at is said and left to the next pass: a provider's error
skips that one item (``errors`` in the report), the estate's ends the pass.

Reports
-------
Each pass writes its record to ``status`` key ``duty.learning``
(:mod:`crewlet.coord.duty_reports`): ``counts`` (this pass's :data:`COUNTED`:
``steps`` done — compactions, drafts and promotions written —,
``provider_calls``, ``ops`` written, ``skipped`` — landed before, or no
provider for it —, ``tokens`` the provider calls used), ``totals`` (carried on
from the previous holder's record), ``episodes``, ``clusters``, ``new``
(clusters no skill or draft covers), and ``errors``. ``crewletctl status``
shows it as the ``learning`` line; ``/metrics`` the totals as
``crewlet_learning_steps_total``, ``crewlet_learning_provider_calls_total``,
``crewlet_learning_ops_total``, ``crewlet_learning_skipped_total`` and
``crewlet_learning_tokens_total``. The tokens are not charged to the
company's ``budgets`` (a pass is nobody's turn).

Rights: the ops go through an applier as the ``workers`` origin
(``episode.compact``, ``skill.draft``, ``approval.decide``:
crewlet/estate/origins.py gives them), a provider's key cooling after a 429
is written to ``cooldowns`` (crewlet/permissions.py), and a provider's
``api_key_secret`` is read with the workers role's vault.

Events: ``learning_pass`` (each pass's counts), ``learning_compacted``,
``learning_drafted`` (``own``: the model's SKILL.md was valid),
``learning_promoted``, ``learning_failed`` (warning: an item or the pass),
``learning_op_refused`` (warning), ``learning_deposed``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import yaml

from crewlet import log
from crewlet.agent.providers import Provider, ProviderError, make_provider
from crewlet.agent.types import Message
from crewlet.company import Company
from crewlet.coord import duty_reports
from crewlet.coord.counters import Cooldowns
from crewlet.estate.ops import LIST_MAX, TASK_BODY_MAX, make_op, op_id
from crewlet.learning.cluster import Cluster, cluster, covered
from crewlet.skills import format as skill_format
from crewlet.vault import Vault
from roles.workers.duties import Duty, going_on, rest

NAME = "learning"
# The old-episode cutoff is rounded down to this many seconds (or to
# compact_after, if shorter), so two holders within it see the same episodes
# as old and make the same compaction ops.
CUTOFF_GRAIN = 3600
# Episodes a page of episode.scan, skills a skill.list.
PAGE = LIST_MAX
# Episodes a pass reads at most; past it the last seat read is left out whole
# (a seat's episodes are compacted from complete rows only) and said.
EPISODES_MAX = 500_000
# Episodes one compaction summarises at most: a provider's prompt stays
# bounded, and a backlog is worked off one batch a pass.
COMPACT_BATCH = 200
# Compactions a pass makes at most (a provider call each): the oldest first.
COMPACTIONS_PER_PASS = 100
# Episodes a drafting prompt shows (the cluster's latest).
DRAFT_EPISODES = 20
# Seqs a draft records at most (its first ones): an op stays far under 1 MiB.
DRAFT_EPISODES_MAX = 1000
# Characters of an ask or a summary in a prompt line.
LINE_MAX = 300
# Characters of a compaction's summary kept (an episode summary's limit).
SUMMARY_MAX = TASK_BODY_MAX
# A draft's promotion approval expires after this many seconds.
DRAFT_TTL = 30 * 86400
# The approval's id: promote-<cluster id>; its decider when auto-promoted.
APPROVAL = "promote-{}"
AUTO = "auto-promote"
# Seconds a provider call may take (a cli agent takes minutes).
PROVIDER_TIMEOUT = 300.0
# Seconds a read or a write through the router may take.
READ_TIMEOUT = 30.0
WRITE_TIMEOUT = 60.0
# Seconds the first pass waits for a copy of the estate to serve, at most.
COPY_WAIT = 30.0
# Seconds between looks for the company while none is known yet.
UNHEARD = 1.0
# What a pass counts, in the order a report shows them.
COUNTED = ("steps", "provider_calls", "ops", "skipped", "tokens")

COMPACT_SYSTEM = ("You keep an agent's memory short. Summarise the episodes you are given — what was "
                  "asked, what was done, what was decided, what is still open — in one short paragraph "
                  "of plain text, keeping names, numbers and commitments a later turn may need.")
COMPACT_ASK = "Summarise these episodes of seat {seat} with {counterparty}, oldest first:\n{lines}"
DRAFT_SYSTEM = ("You write Agent Skills (agentskills.io) for a company's agents. Answer with one SKILL.md "
                "and nothing else: YAML front matter between '---' lines with name (the one given) and "
                "description (what the skill does and when to use it, one sentence), then concise "
                "Markdown instructions generalised from the episodes given: the steps, the tools and "
                "in what order, what to check, what to avoid.")
DRAFT_ASK = ("Draft a skill named {name} for what these episodes have in common.\n"
             "Tools used: {tools}\nTerms: {terms}\nSeats: {seats}\n"
             "Episodes ({shown} of {count}, the latest):\n{lines}")


class Deposed(Exception):
    """This holder's lease no longer carries its token: another node runs the passes."""


def cutoff(now: float, compact_after: int) -> int:
    """The time before which an episode is old: now − *compact_after*, rounded down."""
    grain = max(1, min(CUTOFF_GRAIN, compact_after))
    raw = int(now) - compact_after
    return max(0, raw - raw % grain)


def _cut(text: Any, limit: int = LINE_MAX) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _line(row: dict[str, Any]) -> str:
    tools = ", ".join(row.get("tools") or []) or "none"
    if row.get("compacted"):
        return f"- (earlier, {row['compacted']} episodes) {_cut(row.get('summary'), SUMMARY_MAX)}"
    return (f"- ask: {_cut(row.get('ask'))} | tools: {tools} | outcome: {row.get('outcome')} | "
            f"summary: {_cut(row.get('summary'))}")


Compaction = tuple[str, str, int, list[dict[str, Any]]]  # seat, counterparty, through, the episodes


def compactions(rows: list[dict[str, Any]], old_before: float) -> list[Compaction]:
    """What to compact: ``(seat, counterparty, through, its rows)`` for each seat
    and counterparty with an old episode not compacted yet, oldest first (module
    doc, step 1). *rows* must hold every episode of the seats they name."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        seat, party = row.get("seat"), row.get("counterparty")
        if isinstance(seat, str) and isinstance(party, str) and isinstance(row.get("seq"), int):
            groups.setdefault((seat, party), []).append(row)
    out = []
    for (seat, party), members in groups.items():
        old = [r for r in members if _at(r) < old_before]
        if not any(not r.get("compacted") for r in old):
            continue  # nothing new to compact (a compacted episode alone is not summarised again)
        members.sort(key=lambda r: r["seq"])
        newest_old = max(r["seq"] for r in old)
        # Every episode up to through goes (the op removes them all), so the
        # batch is a prefix of the seat and counterparty's episodes by seq.
        upto = [r for r in members if r["seq"] <= newest_old][:COMPACT_BATCH]
        out.append((seat, party, upto[-1]["seq"], upto))
    return sorted(out, key=lambda c: (c[3][0]["seq"], c[0], c[1]))


def _at(row: dict[str, Any]) -> float:
    at = row.get("at")
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else 0.0


def recent(rows: list[dict[str, Any]], old_before: float) -> list[dict[str, Any]]:
    """The episodes clustering looks at: not compacted, not old."""
    return [r for r in rows if not r.get("compacted") and _at(r) >= old_before]


# ---------------------------------------------------------------- SKILL.md

def _front_and_body(text: str) -> tuple[list[str] | None, list[str]]:
    """*text*'s front matter lines (None: it has none that closes) and the rest."""
    lines = text.split("\n")
    if lines and lines[0].rstrip(" \t\r") == skill_format.FENCE:
        end = next((i for i in range(1, len(lines)) if lines[i].rstrip(" \t\r") == skill_format.FENCE), None)
        if end is not None:
            return lines[1:end], lines[end + 1:]
        return None, lines[1:]
    return None, lines


def _unwrapped(text: str) -> str:
    """A model's answer without a code fence around it (```markdown … ```)."""
    text = text.strip()
    lines = text.split("\n")
    if len(lines) >= 2 and lines[0].startswith("```") and lines[-1].strip() == "```":
        text = "\n".join(lines[1:-1]).strip()
    return text + "\n"


def _metadata(c: Cluster, given: dict[str, str]) -> dict[str, str]:
    meta = dict(given)
    meta.setdefault(skill_format.TOOLS_KEY, " ".join(c.tools))
    meta.setdefault(skill_format.SEATS_KEY, " ".join(c.seats))
    meta[skill_format.CLUSTER_KEY] = c.id  # always: the cluster is then covered, never drafted again
    return meta


def _skill_md(front: dict[str, Any], body_lines: list[str]) -> str:
    dumped = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, width=1 << 20)
    return f"{skill_format.FENCE}\n{dumped}{skill_format.FENCE}\n" + "\n".join(body_lines).lstrip("\n")


def _valid(name: str, body: str) -> bool:
    try:
        skill_format.check(name, [{"path": skill_format.SKILL_FILE, "body": body}], draft=True)
        return True
    except skill_format.SkillError:
        return False


def _as_written(c: Cluster, name: str, text: str) -> str | None:
    """The model's SKILL.md, its name set to *name* and its metadata to the
    cluster's, when it is a valid skill so; None when it is not."""
    front_lines, body = _front_and_body(text)
    if front_lines is None:
        return None
    try:
        skill_format.parse(text)  # the format's own reading: a valid front matter, whatever its name
        front = yaml.safe_load("\n".join(front_lines))
    except (skill_format.SkillError, yaml.YAMLError):
        return None
    if not isinstance(front, dict):
        return None
    front["name"] = name
    front["metadata"] = _metadata(c, front.get("metadata") or {})
    made = _skill_md(front, body)
    return made if _valid(name, made) else None


def _examples(c: Cluster) -> list[str]:
    return ["# " + " ".join(c.key_terms), "", f"Tools: {', '.join(c.tools)}.", "",
            "What was asked, and what was done:", "", *(_line(r) for r in c.rows[-DRAFT_EPISODES:])]


def _made_here(c: Cluster, name: str, text: str) -> str:
    """A valid SKILL.md made from the model's *text* (module doc, step 3)."""
    _, body = _front_and_body(text)
    said = (line.strip().lstrip("#*->").strip() for line in body)  # a heading's or a bullet's words
    first = next((line for line in said if line), "")
    description = _cut(first, skill_format.DESCRIPTION_MAX) or \
        _cut(f"How the company does {' '.join(c.key_terms)} with {', '.join(c.tools)}.",
             skill_format.DESCRIPTION_MAX)
    front = {"name": name, "description": description, "metadata": _metadata(c, {})}
    made = _skill_md(front, body if first else _examples(c))  # no text: the episodes are the body
    if not _valid(name, made):  # the text itself cannot be kept (too long, a NUL…): the episodes then
        made = _skill_md(front, _examples(c))
        skill_format.check(name, [{"path": skill_format.SKILL_FILE, "body": made}], draft=True)
    return made


def draft_md(c: Cluster, name: str, reply: str) -> tuple[str, bool]:
    """The SKILL.md drafted for cluster *c* under *name* from the model's
    *reply*, and whether it is the model's own (else made here). Always valid,
    always with ``crewlet-cluster``."""
    text = _unwrapped(reply)
    own = _as_written(c, name, text)
    return (own, True) if own is not None else (_made_here(c, name, text), False)


def draft_name(c: Cluster, taken: set[str]) -> str:
    """The cluster's suggested name, or, when a skill or draft has it, the name
    with the cluster id's first eight characters after it."""
    if c.name not in taken and c.name not in skill_format.RESERVED_NAMES:
        return c.name
    suffix = "-" + c.id[:8]
    return c.name[:skill_format.NAME_MAX - len(suffix)].rstrip("-") + suffix


# ---------------------------------------------------------------- the passes

class Learning:
    """One holder's passes. Invariant: ``providers[name]`` was made from
    ``specs[name]``, the company's spec of that provider as last seen."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.router = ctx.estate
        self.node = ctx.config.node.id
        self.js = ctx.role.jetstream()
        # Read at each request (no watches): a pass makes a few calls at most.
        self.cooldowns = Cooldowns(self.js)
        self.vault: Vault | None = None  # made with the first provider (a keyless node says so then)
        self.providers: dict[str, Provider] = {}
        self.specs: dict[str, Any] = {}
        self.totals = {what: 0 for what in COUNTED}
        self.counts = {what: 0 for what in COUNTED}
        self.errors: list[str] = []  # this pass's

    async def carry_totals(self) -> None:
        await duty_reports.carry_totals(self.js, NAME, self.totals)

    async def close(self) -> None:
        for provider in self.providers.values():
            try:
                await provider.close()
            except Exception as exc:  # closing is best effort
                log.event("learning_provider_close_failed", "warning", provider=provider.name, error=str(exc))
        self.providers.clear()

    # ---- the estate, the lease, the providers

    async def fence(self) -> None:
        if not await self.ctx.leases.current(f"duty.{NAME}", self.ctx.token):
            raise Deposed(f"duty.{NAME} no longer carries token {self.ctx.token}")

    async def read(self, query: str, args: dict[str, Any]) -> dict[str, Any]:
        return await self.router.read(query, args, timeout=READ_TIMEOUT) or {}

    async def landed(self, oid: str) -> bool:
        """Did the op with id *oid* land already (any outcome)?"""
        return (await self.read("op.outcome", {"id": oid})).get("outcome") is not None

    async def write(self, kind: str, args: dict[str, Any], oid: str,
                    at: float | None = None) -> dict[str, Any]:
        op = make_op(kind, args, node=self.node, id=oid, at=at)
        outcome = await self.router.write(op, timeout=WRITE_TIMEOUT)
        self.counts["ops"] += 1
        if not outcome.get("ok"):
            self.errors.append(f"{kind} {oid} refused: {outcome.get('error')}")
            log.event("learning_op_refused", "warning", kind=kind, op=oid, error=outcome.get("error"))
        return outcome

    async def provider(self, company: Company, seat: str) -> Provider | None:
        """The provider that works for *seat*: ``learning.provider``, else the
        seat's own; None when the seat is gone from the company."""
        name = company.learning.provider
        if name is None:
            seat_cfg = next((s for s in company.seats if s.name == seat), None)
            name = seat_cfg.provider if seat_cfg is not None else None
        spec = company.providers.get(name) if name is not None else None
        if spec is None:
            return None
        dumped = spec.model_dump()
        if self.specs.get(name) != dumped:
            old = self.providers.pop(name, None)
            if old is not None:
                await old.close()  # the company changed it; no call of ours runs on it now
            if self.vault is None:
                self.vault = Vault.of(self.js, self.ctx.config, "workers")
            self.providers[name] = make_provider(name, spec, cooldowns=self.cooldowns, vault=self.vault)
            self.specs[name] = dumped
        return self.providers[name]

    async def ask(self, provider: Provider, system: str, text: str) -> str:
        self.counts["provider_calls"] += 1
        reply = await provider.complete(system, [Message(role="user", text=text)], [],
                                        deadline=time.monotonic() + PROVIDER_TIMEOUT)
        self.counts["tokens"] += reply.usage.total
        return reply.text

    async def episodes(self) -> list[dict[str, Any]]:
        """Every episode, in key order (seat, seq), page by page."""
        rows: list[dict[str, Any]] = []
        after = None
        while going_on():
            args: dict[str, Any] = {"limit": PAGE}
            if after is not None:
                args["after"] = after
            page = await self.read("episode.scan", args)
            rows += page.get("episodes") or []
            after = page.get("next")
            if not after:
                return rows
            if len(rows) >= EPISODES_MAX:
                last = rows[-1].get("seat")
                kept = [r for r in rows if r.get("seat") != last]
                log.event("learning_episodes_capped", "warning", read=len(rows), kept=len(kept),
                          left_from=last)
                return kept
        return rows

    # ---- the steps

    async def compact(self, company: Company, rows: list[dict[str, Any]], old_before: float) -> None:
        for seat, party, through, upto in compactions(rows, old_before)[:COMPACTIONS_PER_PASS]:
            going_on()
            await self.fence()
            oid = op_id(NAME, "compact", seat, party, str(through))
            if await self.landed(oid):
                self.counts["skipped"] += 1
                continue
            provider = await self.provider(company, seat)
            if provider is None:
                self.counts["skipped"] += 1
                continue
            earlier_first = sorted(upto, key=lambda r: (not r.get("compacted"), r["seq"]))
            lines = "\n".join(_line(r) for r in earlier_first)
            try:
                said = await self.ask(provider, COMPACT_SYSTEM,
                                      COMPACT_ASK.format(seat=seat, counterparty=party, lines=lines))
            except ProviderError as exc:
                self.errors.append(f"compacting {seat} with {party}: {exc}")
                log.event("learning_failed", "warning", step="compaction", seat=seat, counterparty=party,
                          error=str(exc))
                continue
            summary = said.strip()[:SUMMARY_MAX] or \
                f"{len(upto)} episodes with {party} (no summary was written)"
            outcome = await self.write("episode.compact", {"seat": seat, "counterparty": party,
                                                           "through": through, "summary": summary}, oid)
            if outcome.get("ok") and not outcome.get("duplicate"):
                self.counts["steps"] += 1
                log.event("learning_compacted", seat=seat, counterparty=party, through=through,
                          episodes=len(upto))

    async def curate(self, company: Company, new: list[Cluster], taken: set[str]) -> None:
        for c in new[:company.learning.max_drafts_per_pass]:
            going_on()
            await self.fence()
            oid = op_id(NAME, "draft", c.id)
            if await self.landed(oid):
                self.counts["skipped"] += 1
                continue
            provider = await self.provider(company, c.seat)
            if provider is None:
                self.counts["skipped"] += 1
                continue
            name = draft_name(c, taken)
            shown = c.rows[-DRAFT_EPISODES:]
            try:
                reply = await self.ask(provider, DRAFT_SYSTEM, DRAFT_ASK.format(
                    name=name, tools=", ".join(c.tools), terms=", ".join(c.terms), seats=", ".join(c.seats),
                    shown=len(shown), count=len(c.episodes), lines="\n".join(_line(r) for r in shown)))
            except ProviderError as exc:
                self.errors.append(f"drafting {name}: {exc}")
                log.event("learning_failed", "warning", step="curation", cluster=c.id, error=str(exc))
                continue
            body, own = draft_md(c, name, reply)
            at = time.time()
            outcome = await self.write("skill.draft", {
                "name": name, "cluster": c.id, "seat": c.seat,
                "episodes": list(c.episodes[:DRAFT_EPISODES_MAX]),
                "files": [{"path": skill_format.SKILL_FILE, "body": body}], "approval": APPROVAL.format(c.id),
                "expires_at": at + DRAFT_TTL}, oid, at=at)
            if not outcome.get("ok") or outcome.get("duplicate"):
                continue
            taken.add(name)
            if (outcome.get("result") or {}).get("already"):
                self.counts["skipped"] += 1  # drafted before, under another op: nothing written
                continue
            self.counts["steps"] += 1
            log.event("learning_drafted", cluster=c.id, skill=name, own=own, episodes=len(c.episodes),
                      seats=list(c.seats), tools=list(c.tools))

    async def promote(self, drafts: list[dict[str, Any]], clusters: dict[str, Cluster]) -> None:
        for d in drafts:
            c = clusters.get(d.get("cluster"))
            approval = d.get("approval")
            if d.get("status") != "pending" or c is None or not isinstance(approval, str):
                continue
            had = len(d.get("episodes") or [])
            if len(c.episodes) <= had:
                continue  # not grown since it was drafted
            going_on()
            await self.fence()
            oid = op_id(NAME, "promote", approval)
            if await self.landed(oid):
                self.counts["skipped"] += 1
                continue
            outcome = await self.write("approval.decide", {
                "id": approval, "decision": "approve", "by": AUTO,
                "note": f"cluster {c.id} grew from {had} to {len(c.episodes)} episodes since it was drafted"},
                oid)
            if outcome.get("ok") and not outcome.get("duplicate"):
                self.counts["steps"] += 1
                log.event("learning_promoted", draft=d.get("name"), approval=approval, cluster=c.id,
                          had=had, now=len(c.episodes))

    async def run_pass(self, company: Company) -> dict[str, Any]:
        """One pass (module doc); its report, written and returned. Raises Deposed."""
        started = time.monotonic()
        self.counts = {what: 0 for what in COUNTED}
        self.errors = errors = []
        learning = company.learning
        found: dict[str, Any] = {"episodes": 0, "clusters": 0, "new": 0}
        try:
            await self.fence()
            rows = await self.episodes()
            found["episodes"] = len(rows)
            old_before = cutoff(time.time(), learning.compact_after)
            await self.compact(company, rows, old_before)
            await self.fence()
            clusters = await asyncio.to_thread(cluster, recent(rows, old_before),
                                               min_cluster=learning.min_cluster)
            skills = (await self.read("skill.list", {"limit": PAGE})).get("skills") or []
            drafted = (await self.read("skill.list", {"limit": PAGE, "drafts": True})).get("skills") or []
            drafts = (await self.read("skill.drafts", {"limit": PAGE})).get("drafts") or []
            seen = {d.get("cluster") for d in drafts}
            new = [c for c in clusters if c.id not in seen and not covered(c, [*skills, *drafted])]
            found.update(clusters=len(clusters), new=len(new))
            taken = {s.get("name") for s in [*skills, *drafted, *drafts]}
            await self.curate(company, new, taken)
            if learning.auto_promote:
                drafts = (await self.read("skill.drafts", {"limit": PAGE})).get("drafts") or []
                await self.promote(drafts, {c.id: c for c in clusters})
        except (asyncio.CancelledError, Deposed):
            raise
        except Exception as exc:  # the estate, a malformed answer: the next pass
            errors.append(f"{type(exc).__name__}: {exc}")
            log.event("learning_failed", "warning", step="pass", error=f"{type(exc).__name__}: {exc}")
        for what, n in self.counts.items():
            self.totals[what] += n
        report = {"node": self.node, "token": self.ctx.token, "at": time.time(),
                  "took_ms": round((time.monotonic() - started) * 1000, 1), "counts": dict(self.counts),
                  "totals": dict(self.totals), **found, "errors": errors}
        log.event("learning_pass", "warning" if errors else "info", counts=self.counts, **found,
                  errors=errors[:5])
        try:
            await duty_reports.write(self.js, NAME, report)
        except Exception as exc:  # the next pass writes again; the totals are kept here meanwhile
            log.event("learning_report_failed", "warning", error=f"{type(exc).__name__}: {exc}")
        return report


async def run(ctx) -> None:
    if ctx.estate is None:  # the workers role always gives one; a test's runner may not
        log.event("learning_failed", "error", step="start", error="no estate router on this node")
        await asyncio.Event().wait()  # held, idle: ended, the runner would start it again at once
    work = Learning(ctx)
    try:
        await work.carry_totals()
        await ctx.estate.serving(COPY_WAIT, going_on)
        last: float | None = None  # monotonic; None: not yet (a new holder passes at once)
        while going_on():
            company = ctx.company()
            if company is not None and (last is None or time.monotonic() - last >= company.learning.every):
                last = time.monotonic()
                await work.run_pass(company)
            every = company.learning.every if company is not None else UNHEARD
            wait = every - (time.monotonic() - last) if last is not None else UNHEARD
            await rest(max(0.05, min(ctx.interval, wait)))
    except Deposed as exc:
        # Another holder runs the passes: stop here. The runner finds the lease
        # lost at its next tend (or, were it still ours, starts us again).
        log.event("learning_deposed", "warning", error=str(exc))
    finally:
        await work.close()


DUTY = Duty(NAME, run)
