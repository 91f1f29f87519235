#!/usr/bin/env python3
"""Benchmark: clustering episodes (crewlet/learning/cluster.py), beside reading their words.

The learning duty clusters every recent episode of the company each pass.
Measured in this process, no broker, on a made-up corpus that looks like a
busy company's week: ``--topics`` tasks (each a phrase of six words, one left
out, plus three words of a Zipf vocabulary of 30,000 and two of 300 common
business words), popular by a Zipf law, each done with one of 40 tool sets,
and 30 % noise (ten words of the vocabulary and two business words, any tool
set). For each size:

* **cluster**: :func:`crewlet.learning.cluster.cluster` on the episodes
  (CPU seconds, the median of ``--rounds``), beside the **floor**: reading
  the episodes' tokens alone (:func:`episode_tokens` on each), which any
  clustering pays; x = cluster / floor;
* the clusters found, the episodes in them, and how many of the planted
  topics came out whole.

At the smallest size the bench also runs **all pairs** — exact single
linkage comparing every pair of episodes of a tool set — as the baseline the
inverted index replaces, and counts the episodes whose cluster differs from
it (``differ``: what the postings bound costs, 0 when none).

Target (informational): 100,000 episodes in a few seconds.

    python bench/learning_cluster.py [--sizes 10000,100000] [--pairs 5000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import statistics
from collections import Counter
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import add_smoke, emit, ratio, say  # noqa: E402
from crewlet.learning import cluster as clustering  # noqa: E402

VOCAB = 30_000       # the Zipf vocabulary's words
BUSINESS = 300       # words every task may say
TOOL_SETS = 40
NOISE = 0.3          # the share of episodes on no topic
SEATS = 50


def corpus(n: int, topics: int, seed: int = 1) -> list[dict[str, Any]]:
    """*n* episodes (module doc); each row also says its planted ``topic`` (None: noise)."""
    rnd = random.Random(seed)
    vocab = [f"g{i}w" for i in range(VOCAB)]
    cum = list(itertools.accumulate(1 / (i + 1) for i in range(VOCAB)))
    business = [f"b{i}w" for i in range(BUSINESS)]
    phrases = [[f"t{t}k{j}" for j in range(6)] for t in range(topics)]
    tools = [[f"tool{k}" for k in rnd.sample(range(15), rnd.randint(1, 3))] for _ in range(TOOL_SETS)]
    tools_of = [rnd.randrange(TOOL_SETS) for _ in range(topics)]
    popular = list(itertools.accumulate(1 / (i + 1) for i in range(topics)))
    rows = []
    for i in range(n):
        if rnd.random() < NOISE:
            topic = None
            words = rnd.choices(vocab, cum_weights=cum, k=10) + rnd.sample(business, 2)
            used = tools[rnd.randrange(TOOL_SETS)]
        else:
            topic = rnd.choices(range(topics), cum_weights=popular)[0]
            phrase = list(phrases[topic])
            phrase.pop(rnd.randrange(len(phrase)))
            words = phrase + rnd.choices(vocab, cum_weights=cum, k=3) + rnd.sample(business, 2)
            used = tools[tools_of[topic]]
        rnd.shuffle(words)
        rows.append({"seat": f"s{rnd.randrange(SEATS)}", "seq": i + 1, "tools": used, "topic": topic,
                     "ask": " ".join(words[:6]) + f" #{i}", "summary": " ".join(words[6:]),
                     "counterparty": "operator", "outcome": "done", "at": 0.0})
    return rows


def cpu(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.process_time()
    result = call()
    return time.process_time() - started, result


def all_pairs(rows: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """Exact single linkage comparing every pair of a tool set: episode -> component."""
    by_tools: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (r["seat"], r["seq"])):
        by_tools.setdefault(clustering.tool_set(row), []).append(row)
    t = clustering.SIMILAR
    out: dict[tuple[str, int], int] = {}
    label = 0
    for members in by_tools.values():
        sets = [clustering.episode_tokens(r) for r in members]
        parent = list(range(len(sets)))

        def find(a: int) -> int:
            while parent[a] != a:
                a = parent[a]
            return a
        for i, j in itertools.combinations(range(len(sets)), 2):
            a, b = sets[i], sets[j]
            if a and b and len(a & b) >= t * len(a | b) - 1e-9:
                parent[find(i)] = find(j)
        for i, row in enumerate(members):
            out[(row["seat"], row["seq"])] = label + find(i)
        label += len(sets)
    return out


def differ(found: list[clustering.Cluster], exact: dict[tuple[str, int], int], min_cluster: int) -> int:
    """Episodes clustered otherwise than exactly: each exact cluster (of at least
    *min_cluster*) is matched with the cluster holding most of its episodes, each
    cluster matched once (the bigger exact one first); an episode differs when it
    is not in its exact cluster's match (or is clustered where exactly it is not)."""
    got = {(r["seat"], r["seq"]): c.id for c in found for r in c.rows}
    members: dict[int, list[tuple[str, int]]] = {}
    for key, comp in exact.items():
        members.setdefault(comp, []).append(key)
    match: dict[int, str | None] = {}
    taken: set[str] = set()
    for comp, keys in sorted(members.items(), key=lambda kv: -len(kv[1])):
        if len(keys) < min_cluster:
            continue
        counts = Counter(got[k] for k in keys if k in got and got[k] not in taken)
        best = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0] if counts else None
        match[comp] = best
        if best is not None:
            taken.add(best)
    return sum(1 for key, comp in exact.items() if got.get(key) != match.get(comp))


def run(sizes: list[int], pairs: int, rounds: int, topics: int) -> dict[str, Any]:
    report: dict[str, Any] = {"rounds": rounds, "topics": topics, "similar": clustering.SIMILAR,
                              "postings": clustering.POSTINGS, "sizes": {}}
    for n in sizes:
        rows = corpus(n, topics)
        say(f"{n:,} episodes")
        times, floors, found = [], [], []
        for r in range(rounds):
            floor, _ = cpu(lambda: [clustering.episode_tokens(row) for row in rows])
            took, found = cpu(lambda: clustering.cluster(rows))
            times.append(took)
            floors.append(floor)
        planted: dict[int, set[int]] = {}
        for row in rows:
            if row["topic"] is not None:
                planted.setdefault(row["topic"], set()).add(row["seq"])
        whole = {frozenset(c.episodes) for c in found}
        big = [seqs for seqs in planted.values() if len(seqs) >= clustering.MIN_CLUSTER]
        med, floor = statistics.median(times), statistics.median(floors)
        report["sizes"][str(n)] = {
            "cluster_s": round(med, 3), "floor_s": round(floor, 3), "x": round(ratio(med, floor) or 0, 2),
            "clusters": len(found), "clustered": sum(len(c.episodes) for c in found),
            "topics": len(big), "topics_whole": sum(1 for seqs in big if frozenset(seqs) in whole)}
    if pairs:
        rows = corpus(pairs, max(4, topics * pairs // max(sizes + [pairs])), seed=2)
        say(f"all pairs of {pairs:,} episodes")
        exact_s, exact = cpu(lambda: all_pairs(rows))
        took, found = cpu(lambda: clustering.cluster(rows))
        report["all_pairs"] = {"episodes": pairs, "all_pairs_s": round(exact_s, 3),
                               "cluster_s": round(took, 3),
                               "x": round(ratio(took, exact_s) or 0, 4),
                               "differ": differ(found, exact, clustering.MIN_CLUSTER)}
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000",
                    help="episodes, comma separated (default 10000,100000)")
    ap.add_argument("--pairs", type=int, default=5000,
                    help="episodes of the all-pairs baseline (0: none; default 5000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds a size (default 3)")
    ap.add_argument("--topics", type=int, default=400, help="planted tasks (default 400)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    add_smoke(ap, None, {"sizes": "2000", "pairs": 300, "rounds": 1, "topics": 40})
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = run([int(s) for s in args.sizes.split(",") if s], args.pairs, args.rounds, args.topics)

    def text(r: dict[str, Any]) -> None:
        print(f"cluster(), CPU s (median of {r['rounds']}); floor = reading the tokens; "
              f"SIMILAR {r['similar']}, POSTINGS {r['postings']}")
        print(f"{'episodes':>9} {'cluster':>8} {'floor':>7} {'x':>6} {'clusters':>9} {'clustered':>10} "
              f"{'topics whole':>13}")
        for n, row in r["sizes"].items():
            print(f"{int(n):>9,} {row['cluster_s']:>8.2f} {row['floor_s']:>7.2f} {row['x']:>6.1f} "
                  f"{row['clusters']:>9,} {row['clustered']:>10,} {row['topics_whole']:>6}/{row['topics']}")
        p = r.get("all_pairs")
        if p:
            print(f"all pairs of {p['episodes']:,}: {p['all_pairs_s']:.2f} s; "
                  f"cluster() {p['cluster_s']:.3f} s "
                  f"(x {p['x']:.4f}); episodes clustered otherwise: {p['differ']}")
    return emit(report, args.json, text)


if __name__ == "__main__":
    sys.exit(main())
