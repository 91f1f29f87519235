"""Clustering episodes: which turns did the same kind of work (DESIGN §15).

:func:`cluster` takes episode rows (dicts as the estate answers them: ``seat``,
``seq``, ``tools``, ``ask``, ``summary``…) and answers the clusters worth a
skill, each a :class:`Cluster`. No model is asked and nothing is random: the
same episodes give the same clusters, in the same order, whatever order they
come in.

How episodes are grouped
------------------------
1. **By the tools used.** An episode's tool set is the set of its ``tools``
   (names) but :data:`UNCOUNTED_TOOLS` (reading a skill); episodes are
   grouped by it exactly. An episode that used no tool is never clustered: a
   skill is about doing something with tools, and talk alone has nothing to
   repeat.
2. **By their words**, inside a tool set. An episode's tokens are the words
   of its ask and summary: lowercased runs of letters and digits, without
   :data:`STOP` words, words shorter than :data:`TOKEN_MIN` and numbers
   (issue numbers and ids tell episodes apart, not what they were about). Two
   episodes are **similar** when the Jaccard index of their token sets
   (shared / all) is at least :data:`SIMILAR`; an episode without tokens is
   similar to none. Clusters are single-linkage: the connected components of
   "similar" — an episode joins a cluster when it is similar to any one of
   its episodes, so a cluster may drift along a chain of small changes (a
   task asked a hundred ways). The episodes are taken in ``(seat, seq)``
   order, which decides which earlier episodes an episode is compared with
   (module doc, "Speed"), so the same episodes give the same components.
3. A component of at least ``min_cluster`` episodes (:data:`MIN_CLUSTER`) is
   a cluster; fewer is not a pattern yet.

An episode is identified by ``(seat, seq)``; the same one given twice counts
once. ``seq`` is the estate's log seq of the turn's record: unique, and in
the order turns ended.

A cluster's id (the stable part)
--------------------------------
``id`` is the first :data:`ID_HEX` hex characters of a sha256 of the tool set
and the cluster's **key terms**: the :data:`KEY_TERMS` tokens found in most of
its first ``min_cluster`` episodes by seq (ties: alphabetical). New episodes
have higher seqs, so while a cluster grows by similar episodes its first
episodes — and its id — stay the same; the curation pass recognises a
cluster it drafted before by it. The id names the *topic* (tools and terms),
not the episodes: two components that come out with the same id are one
cluster (their episodes together), and a cluster re-formed from other
episodes on the same topic keeps its id. It changes when the first episodes
go (compacted away) or when a new episode joins two clusters into one; a
skill or draft of the old cluster then still covers the new one by
:func:`covered`'s second rule.

What a cluster holds
--------------------
``tools`` (sorted), ``key_terms`` (the id's), ``terms`` (the :data:`TERMS`
tokens found in most of its episodes, ties alphabetical), ``seats``
(sorted), ``seat`` (the seat of its first episode), ``episodes`` (their seqs,
sorted), ``rows`` (the episode rows, by seq) and ``name``, a suggested skill
name (:func:`suggested_name`). Clusters come biggest first, then by id.

Covered clusters
----------------
:func:`covered`: a skill or draft covers a cluster when its metadata's
``crewlet-cluster`` names the cluster's id, or when its ``crewlet-tools`` are
the cluster's tool set and at least half the cluster's key terms are tokens of
the skill's name and description.

Speed
-----
100,000 episodes take about three seconds of CPU (``bench/learning_cluster.py``),
where comparing every pair would take hours. Episodes are bucketed by tool set;
episodes with the same tokens are one node; and a node is compared only with
earlier nodes an inverted index over tokens finds: for each of its tokens, the
latest :data:`POSTINGS` nodes holding it. How many of its tokens each of those
holds is counted (in C, ``collections.Counter``); one holding fewer than
``ceil(SIMILAR·(|x|+1) / (1+SIMILAR))`` cannot be similar and is passed over,
one already in the node's cluster too, and the rest are compared exactly.

So a rare token finds every earlier node holding it, and a common one the
latest few: two alike episodes sharing only words that more than
:data:`POSTINGS` episodes between them also said are found alike only through
those later episodes — which, being alike too, are usually in the cluster
already (``bench/learning_cluster.py`` counts the episodes clustered otherwise
than by comparing every pair: 2 of 5,000). With postings long enough to hold
every node, :func:`components` is exact single linkage
(``tests/unit/test_learning_cluster.py`` checks it against every pair).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import re
import unicodedata
from collections import Counter, deque
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain, compress, repeat
from operator import ge, itemgetter
from typing import Any, Iterable, Iterator, Mapping

# Two episodes are similar when the Jaccard index of their tokens is at
# least this: asks about one task share about a third of their words once
# the stop words are gone (tests/unit/test_learning_cluster.py shows the
# phrasings it joins and keeps apart).
SIMILAR = 0.3
# Episodes a cluster needs at least (the company's learning.min_cluster
# defaults to it): fewer is not a pattern yet.
MIN_CLUSTER = 3
# Tokens of a cluster's first episodes its id (and suggested name) is made of.
KEY_TERMS = 3
# Earlier episodes (of a tool set) an episode is compared with through each
# of its tokens: the latest this many holding it. A rarer token finds every
# one; a word hundreds of episodes say finds the latest, which, were they
# alike, are in the cluster already (module doc, "Speed").
POSTINGS = 16
# Tokens a cluster shows as its terms (the drafting prompt's).
TERMS = 8
# Hex characters of a cluster id (64 bits: no two topics of one company meet).
ID_HEX = 16
# Words shorter than this are not tokens ("a", "x", unit letters).
TOKEN_MIN = 2
# A skill name's rule (agentskills.io): 1-64 of a-z, 0-9 and single hyphens.
NAME_MAX = 64
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
# Words that say nothing about what a turn was about: English function words,
# and what every ask and summary says ("please", "done").
STOP = frozenset("""
a about above after again against all also am an and any are as at be because been before
being below between both but by can could did do does doing done down during each few for
from further had has have having he her here hers him his how i if in into is it its itself
just me more most my no nor not now of off on once only or other our ours out over own please
same she should so some such than that the their them then there these they this those
through to too under until up us very was we were what when where which while who whom why
will with would you your yours yes ok okay thanks thank hi hello let get got make made new via
""".split())
# A token: a run of letters and digits, TOKEN_MIN long at least, with a letter
# in it (a number tells episodes apart, not what they were about).
_TOKEN = re.compile(r"(?=[^\W_]*[^\W\d_])[^\W_]{%d,}" % TOKEN_MIN)
# Tools no skill is about: reading a skill. An episode that followed a skill
# did the same work as those before it, and must fall in their cluster (which
# the skill covers), not in a new one.
UNCOUNTED_TOOLS = frozenset({"skill_read"})
# Metadata keys of a skill this module reads (crewlet's own, DESIGN §15).
CLUSTER_KEY = "crewlet-cluster"
TOOLS_KEY = "crewlet-tools"
_LIST_SPLIT = re.compile(r"[\s,]+")


def tokens(text: str | None) -> frozenset[str]:
    """The tokens of *text* (module doc, "How episodes are grouped")."""
    if not text:
        return frozenset()
    return frozenset(_TOKEN.findall(text.lower())) - STOP


def tool_set(row: Mapping[str, Any]) -> tuple[str, ...]:
    """An episode's tool set, sorted, without :data:`UNCOUNTED_TOOLS`: () when
    it used none (or the row names none)."""
    tools = row.get("tools")
    if not isinstance(tools, (list, tuple)):
        return ()
    return tuple(sorted({t for t in tools if isinstance(t, str) and t and t not in UNCOUNTED_TOOLS}))


def episode_tokens(row: Mapping[str, Any]) -> frozenset[str]:
    """The tokens of an episode's ask and summary."""
    ask, summary = row.get("ask"), row.get("summary")
    return tokens(f"{ask if isinstance(ask, str) else ''}\n{summary if isinstance(summary, str) else ''}")


def top_terms(token_sets: Iterable[frozenset[str]], n: int) -> tuple[str, ...]:
    """The *n* tokens found in most of *token_sets*, ties alphabetical."""
    counts = Counter(tok for s in token_sets for tok in s)
    return tuple(tok for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n])


def cluster_id(tools: Iterable[str], key_terms: Iterable[str]) -> str:
    """The digest naming a cluster of *tools* about *key_terms* (module doc)."""
    text = "\x1f".join(sorted(tools)) + "\x1e" + "\x1f".join(key_terms)
    return hashlib.sha256(text.encode()).hexdigest()[:ID_HEX]


def _name_part(text: str) -> str:
    """*text* as name segments: ASCII letters and digits, the rest hyphens."""
    ascii_ = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return "-".join(re.findall(r"[a-z0-9]+", ascii_))


def suggested_name(tools: Iterable[str], key_terms: Iterable[str], cid: str) -> str:
    """A skill name for a cluster: its key terms then its tools, lowercase and
    hyphenated (``invoice-refund-customer-crm-lookup``), cut at a hyphen to
    fit :data:`NAME_MAX`; ``skill-<id>`` when no part has a letter or digit
    in ASCII. Always matches :data:`NAME_RE`."""
    parts = [p for p in (_name_part(t) for t in [*key_terms, *tools]) if p]
    name = ""
    for part in parts:
        joined = f"{name}-{part}" if name else part
        if len(joined) > NAME_MAX:
            break
        name = joined
    if not name:
        name = f"skill-{cid[:8]}"
    return name


@dataclass(frozen=True)
class Cluster:
    """Episodes that did the same kind of work (module doc, "What a cluster holds")."""

    id: str
    tools: tuple[str, ...]
    key_terms: tuple[str, ...]
    terms: tuple[str, ...]
    seats: tuple[str, ...]
    seat: str
    episodes: tuple[int, ...]
    rows: tuple[Mapping[str, Any], ...]
    name: str

    def as_dict(self) -> dict[str, Any]:
        """The cluster without its rows (a log line, a report)."""
        return {"id": self.id, "tools": list(self.tools), "key_terms": list(self.key_terms),
                "terms": list(self.terms), "seats": list(self.seats), "seat": self.seat,
                "episodes": list(self.episodes), "name": self.name}


class _Postings(dict):
    """token -> a deque of the latest sets holding it, made at first use."""

    def __init__(self, keep: int):
        super().__init__()
        self.keep = keep

    def __missing__(self, token: str) -> deque[int]:
        seen = self[token] = deque((), self.keep)
        return seen


def components(sets: list[frozenset[str]], similar: float = SIMILAR,
               postings: int = POSTINGS) -> list[int]:
    """The single-linkage components of *sets*, taken in their order (module
    doc, "Speed"): for each set, the index of the first set of its component.
    An empty set is its own component."""
    t = Fraction(str(similar))
    if not 0 < t <= 1:
        raise ValueError(f"similar must be above 0 and at most 1, got {similar!r}")
    num, den = t.numerator, t.denominator
    sizes = [len(s) for s in sets]
    # comp[i]: i's component, named by a member; members[c]: c's members. A
    # merge relabels the smaller side, so a lookup is one index (each node is
    # relabelled O(log n) times in all).
    comp = list(range(len(sets)))
    members: dict[int, list[int]] = {}
    # token -> the latest *postings* sets holding it, in the order taken.
    index = _Postings(postings)
    for x, sx in enumerate(sets):
        size_x = sizes[x]
        if not size_x:
            continue
        postings_of = [index[tok] for tok in sx]
        # Counted in C: how many of x's tokens each earlier set holds.
        shared = Counter(chain.from_iterable(postings_of))
        for seen in postings_of:
            seen.append(x)
        if not shared:
            continue
        # Similar needs shared ≥ t(|x|+|y|)/(1+t), and |y| ≥ 1: fewer is passed
        # over without looking at the sets (the bulk of the candidates).
        least = -(-num * (size_x + 1) // (num + den))
        cx = x
        for y in compress(shared.keys(), map(ge, shared.values(), repeat(least))):
            cy = comp[y]
            if cy == cx:
                continue  # x is in that cluster already
            size_y = sizes[y]
            # Jaccard ≤ min/max of the sizes: too unequal cannot be similar.
            if den * min(size_x, size_y) < num * max(size_x, size_y):
                continue
            n = len(sx & sets[y])  # exact (a capped posting may have hidden one)
            if den * n >= num * (size_x + size_y - n):
                cx = _merge(comp, members, cx, cy)
    first: dict[int, int] = {}
    return [first.setdefault(c, i) for i, c in enumerate(comp)]


def _merge(comp: list[int], members: dict[int, list[int]], a: int, b: int) -> int:
    """Join components *a* and *b* (the smaller relabelled); the one left."""
    ma, mb = members.get(a) or [a], members.get(b) or [b]
    if len(ma) > len(mb):
        a, b, ma, mb = b, a, mb, ma
    for i in ma:
        comp[i] = b
    mb.extend(ma)
    members[b] = mb
    members.pop(a, None)
    return b


# An episode as clustering holds it: (seq, seat, row, tokens).
_Member = tuple[int, str, Mapping[str, Any], frozenset[str]]
_BY_SEQ = itemgetter(0, 1)  # (seq, seat): unique, so rows are never compared


def cluster(episodes: Iterable[Mapping[str, Any]], *, min_cluster: int = MIN_CLUSTER,
            similar: float = SIMILAR) -> list[Cluster]:
    """The clusters of *episodes* (module doc): biggest first, then by id."""
    with _collector_paused():
        return _cluster(episodes, min_cluster, similar)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused: clustering makes no cycles, but
    its hundreds of thousands of new sets set the collector walking every live
    object again and again (a fifth of the time at 100,000 episodes). For the
    whole process, for the seconds it takes; as it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _cluster(episodes: Iterable[Mapping[str, Any]], min_cluster: int, similar: float) -> list[Cluster]:
    rows: dict[tuple[str, int], tuple[Mapping[str, Any], tuple[str, ...]]] = {}
    for row in episodes:
        seq = row.get("seq")
        tools = tool_set(row)
        if tools and type(seq) is int:
            rows[(str(row.get("seat")), seq)] = (row, tools)
    buckets: dict[tuple[str, ...], list[_Member]] = {}
    for key in sorted(rows):  # (seat, seq): every step in one order
        row, tools = rows[key]
        buckets.setdefault(tools, []).append((key[1], key[0], row, episode_tokens(row)))
    found: dict[str, list[_Member]] = {}  # cluster id -> its members, by seq
    made: dict[str, Cluster] = {}
    for tools in sorted(buckets):
        members = buckets[tools]
        # Episodes with the same tokens are one node (a task asked the same way
        # a thousand times is compared once).
        node_of: dict[frozenset[str], int] = {}
        for m in members:
            node_of.setdefault(m[3], len(node_of))
        comp = components(list(node_of), similar)
        grouped: dict[int, list[_Member]] = {}
        for m in members:
            if m[3]:  # no tokens: similar to none, not even to another without
                grouped.setdefault(comp[node_of[m[3]]], []).append(m)
        for group in grouped.values():
            if len(group) < min_cluster:
                continue
            group.sort(key=_BY_SEQ)
            key_terms = top_terms((m[3] for m in group[:min_cluster]), KEY_TERMS)
            cid = cluster_id(tools, key_terms)
            same = found.get(cid)
            if same is not None:  # the same topic found twice: one cluster
                group = sorted([*same, *group], key=_BY_SEQ)
            found[cid] = group
            made[cid] = _made(cid, tools, key_terms, group)
    return sorted(made.values(), key=lambda c: (-len(c.episodes), c.id))


def _made(cid: str, tools: tuple[str, ...], key_terms: tuple[str, ...], group: list[_Member]) -> Cluster:
    return Cluster(id=cid, tools=tools, key_terms=key_terms, terms=top_terms((m[3] for m in group), TERMS),
                   seats=tuple(sorted({m[1] for m in group})), seat=group[0][1],
                   episodes=tuple(m[0] for m in group), rows=tuple(m[2] for m in group),
                   name=suggested_name(tools, key_terms, cid))


def _listed(value: Any) -> set[str]:
    """A metadata list value (space or comma separated) as a set."""
    return {v for v in _LIST_SPLIT.split(value) if v} if isinstance(value, str) else set()


def _about(skill: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A listed skill's name and description, and its metadata: at its top, or
    under ``meta`` (the estate's ``skill.list`` rows, drafts' too)."""
    meta = skill.get("meta") if isinstance(skill.get("meta"), Mapping) else {}
    metadata = skill.get("metadata") if isinstance(skill.get("metadata"), Mapping) else meta.get("metadata")
    description = skill.get("description") or meta.get("description") or ""
    return f"{skill.get('name') or ''} {description}", metadata if isinstance(metadata, Mapping) else {}


def covered(c: Cluster, skills: Iterable[Mapping[str, Any]]) -> bool:
    """Does any of *skills* (skills and drafts alike, as ``skill.list`` lists
    them: ``name``, ``description``, ``metadata`` at the top or under ``meta``)
    cover cluster *c* (module doc, "Covered clusters")?"""
    for skill in skills:
        words, meta = _about(skill)
        if c.id in _listed(meta.get(CLUSTER_KEY)):
            return True
        if _listed(meta.get(TOOLS_KEY)) != set(c.tools):
            continue
        if c.key_terms and 2 * len(set(c.key_terms) & tokens(words)) >= len(c.key_terms):
            return True
    return False
