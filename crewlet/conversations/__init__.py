"""Conversations on the fleet: what a run of one stands on (DESIGN §11, issue 12).

A conversation and its runs, messages and approvals are estate data
(:mod:`crewlet.estate.ops`). What a run needs besides, on the broker:

==============  ==================================================================
``lease.py``    the driver lease ``conv.<id>``: one driver per conversation, a
                second one waiting briefly and then told who drives it
                (:class:`~crewlet.conversations.lease.Drivers`)
``runs.py``     the ``RUNS`` stream: a run's events, one subject per run, kept
                ``retention`` after the run; publishing them once each, and
                following one run from any sequence on any node
``sink.py``     a turn's progress (:class:`crewlet.agent.types.Sink`) as ``RUNS``
                events, deltas coalesced
==============  ==================================================================

Their numbers that an operator sets are Tier A's ``conversations`` section
(:class:`crewlet.config.model.ConversationsSection`); the rest are constants
of each module, with their reasons.
"""
