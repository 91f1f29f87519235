"""Learning: what the company's seats did, turned into memory and skills (DESIGN §15).

Every turn leaves an **episode** in the estate (the applier derives it from
the turn's record): its seat, trigger, counterparty, ask, the tools it used,
outcome and summary. The learning passes — the ``learning`` duty
(:mod:`roles.workers.duties.learning`), one holder in the fleet at a time —
read them back and do four things, in order, each step at most once however
often a pass is cut short and run again (its op id is derived from its
inputs):

==============  ==============================================================
compaction      episodes older than ``learning.compact_after`` become one
                summary per seat and counterparty (a provider writes it):
                op ``episode.compact``
clustering      the recent episodes grouped by the tools they used and the
                words of their ask and summary (:mod:`crewlet.learning.cluster`:
                deterministic, no model); a cluster an existing skill or draft
                covers is dropped
curation        a provider drafts a ``SKILL.md`` for each new cluster (made
                valid when the model's is not): op ``skill.draft``, with a
                pending promotion approval
promotion       a person decides the approval (the approvals API), or, with
                ``learning.auto_promote``, the pass approves a draft whose
                cluster kept growing: op ``approval.decide``
==============  ==============================================================

Modules:

==============  ==============================================================
``cluster.py``  episodes → clusters: the tokens, the similarity, the stable
                cluster id, the suggested skill name, whether a skill covers
                a cluster. Pure: no I/O, the same clusters for the same
                episodes in any order
==============  ==============================================================

The company's ``learning:`` section sets the pace and the provider
(:class:`crewlet.company.model.Learning`).
"""
