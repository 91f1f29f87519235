"""Clustering episodes (crewlet/learning/cluster.py): what is similar, what a
cluster holds, that it is the same in any input order, that its id holds
while it grows, what covers it — and that the fast linking finds exactly what
comparing every pair finds while no token is past its postings."""

from __future__ import annotations

import itertools
import random

import pytest

from crewlet.learning.cluster import (MIN_CLUSTER, NAME_MAX, NAME_RE, SIMILAR, Cluster, cluster,
                                      cluster_id, components, covered, episode_tokens, suggested_name,
                                      tokens)

TRIAGE = [
    "Triage issue #412: login page returns 500. Labelled bug, assigned to the web team.",
    "Triage issue #977: signup email never arrives. Labelled bug, assigned to the web team.",
    "Triage issue #1020: dark mode toggle missing. Labelled bug, assigned to the web team.",
    "Triage issue #1101: search results empty for accents. Labelled bug, assigned to the web team.",
    "Triage issue #1202: avatar upload times out. Labelled bug, assigned to the web team.",
]
REFUND = [
    "Refund order 1234 for customer Alice: duplicate charge. Refund issued via Stripe, customer notified.",
    "Customer Bob asks a refund for order 5521, charged twice. "
    "Issued the refund in Stripe, told the customer.",
    "Refund order 7781, customer Carol, duplicate charge. Stripe refund issued and customer notified.",
]


def ep(seq: int, text: str, tools=("github",), seat: str = "pm", **more) -> dict:
    ask, _, summary = text.partition(". ")
    return {"seat": seat, "seq": seq, "trigger": f"t{seq}", "counterparty": "operator",
            "ask": ask, "summary": summary, "tools": list(tools), "outcome": "done", "at": 1000.0 + seq,
            **more}


def shapes(found: list[Cluster]) -> list[dict]:
    return [c.as_dict() for c in found]


def test_tokens_are_lowercased_words_without_stop_words_numbers_or_single_letters():
    assert tokens("Please FIX the Login-page on prod_eu #4312 in 2 hours: a x") == \
        {"fix", "login", "page", "prod", "eu", "hours"}
    # Letters of any script; a number alone goes.
    assert tokens("v2 3d 1234 ü café") == {"v2", "3d", "café"}
    assert tokens(None) == tokens("") == frozenset()
    assert episode_tokens({"ask": "Deploy billing", "summary": None}) == {"deploy", "billing"}


def test_similar_phrasings_of_one_task_join_and_other_tasks_stay_apart():
    eps = [ep(i + 1, t, ("github",)) for i, t in enumerate(TRIAGE)]
    eps += [ep(10 + i, t, ("github",)) for i, t in enumerate(REFUND)]
    (triage, refund) = sorted(cluster(eps), key=lambda c: c.episodes)
    assert triage.episodes == (1, 2, 3, 4, 5) and refund.episodes == (10, 11, 12)
    assert {"triage", "bug", "labelled"} <= set(triage.terms)
    assert {"refund", "customer"} <= set(refund.terms)


def test_an_episode_without_tools_is_never_clustered_and_tool_sets_are_kept_apart():
    same = TRIAGE[0]
    no_tools = [ep(i, same, ()) for i in range(1, 6)]
    assert cluster(no_tools) == []
    assert cluster([{**e, "tools": None} for e in no_tools]) == []
    # The same words with another tool set are another cluster; the order of
    # the tools and a repeated name do not make a different set.
    eps = [ep(1, same, ("github", "send")), ep(2, same, ("send", "github", "send")),
           ep(3, same, ("github", "send")), ep(4, same, ("github",)), ep(5, same, ("github",)),
           ep(6, same, ("github",))]
    found = cluster(eps)
    assert sorted((c.tools, c.episodes) for c in found) == [(("github",), (4, 5, 6)),
                                                           (("github", "send"), (1, 2, 3))]
    assert len({c.id for c in found}) == 2
    # Reading a skill is not what a skill is about: following one is the same work.
    followed = [ep(7, same, ("github", "skill_read")), ep(8, same, ("skill_read",))]
    assert [c.episodes for c in cluster(eps + followed) if c.tools == ("github",)] == [(4, 5, 6, 7)]


def test_an_episode_without_words_is_similar_to_none():
    eps = [ep(i, "Done. Ok", ("github",)) for i in range(1, 6)]
    assert all(not episode_tokens(e) for e in eps)
    assert cluster(eps) == []


def test_min_cluster_and_the_threshold():
    three = [ep(i + 1, t) for i, t in enumerate(TRIAGE[:3])]
    assert cluster(three[:2]) == []
    assert [c.episodes for c in cluster(three)] == [(1, 2, 3)]
    assert cluster(three, min_cluster=4) == []
    assert [c.episodes for c in cluster(three[:2], min_cluster=2)] == [(1, 2)]
    # Jaccard exactly at SIMILAR links (0.3 = 3 shared of 10), just under does not.
    base = ["alpha", "bravo", "charlie"]
    at = [" ".join(base + [f"{w}{i}" for w in ("xa", "xb", "xc", "xd")[:3 + i]]) for i in range(2)]
    a, b = (tokens(t) for t in at)
    assert len(a & b) / len(a | b) == pytest.approx(0.3) and SIMILAR == 0.3
    assert [c.episodes for c in cluster([ep(1, at[0]), ep(2, at[1])], min_cluster=2)] == [(1, 2)]
    under = [" ".join(base + [f"{w}{i}" for w in ("xa", "xb", "xc", "xd")]) for i in range(2)]
    assert cluster([ep(1, under[0]), ep(2, under[1])], min_cluster=2) == []


def test_single_linkage_follows_a_chain():
    """A ~ B and B ~ C but not A ~ C: one cluster (a task asked a hundred ways)."""
    a, b = "one two three four five six", "four five six seven eight nine"
    c = "seven eight nine ten eleven twelve"
    assert len(tokens(a) & tokens(c)) == 0
    assert [x.episodes for x in cluster([ep(1, a), ep(2, b), ep(3, c)])] == [(1, 2, 3)]


def test_a_cluster_holds_its_seats_episodes_tools_and_a_valid_name():
    tools = ("github", "send")
    eps = [ep(30, TRIAGE[0], ("send", "github"), seat="qa"), ep(10, TRIAGE[1], tools, seat="dev"),
           ep(20, TRIAGE[2], tools, seat="qa"), ep(40, TRIAGE[3], tools, seat="dev")]
    (c,) = cluster(eps)
    assert c.seats == ("dev", "qa") and c.seat == "dev"   # the first episode's (seq 10)
    assert c.episodes == (10, 20, 30, 40) and [r["seq"] for r in c.rows] == [10, 20, 30, 40]
    assert c.tools == ("github", "send")
    assert len(c.key_terms) == 3 and len(c.terms) <= 8 and set(c.key_terms) <= set(c.terms)
    assert c.id == cluster_id(c.tools, c.key_terms) and len(c.id) == 16
    assert NAME_RE.match(c.name) and len(c.name) <= NAME_MAX
    assert c.name.endswith("-github-send") and c.name.startswith("-".join(c.key_terms))
    assert c.as_dict()["episodes"] == [10, 20, 30, 40] and "rows" not in c.as_dict()


def test_the_same_episodes_give_the_same_clusters_in_any_order():
    rnd = random.Random(7)
    eps = [ep(i + 1, t, seat=rnd.choice(["a", "b", "c"])) for i, t in enumerate(TRIAGE + REFUND)]
    eps += _corpus(rnd, 600)
    want = shapes(cluster(eps))
    assert len(want) >= 3
    for _ in range(10):
        rnd.shuffle(eps)
        assert shapes(cluster(eps)) == want
    # The same episode given twice counts once.
    assert shapes(cluster(eps + eps[:50])) == want


def test_the_id_holds_while_the_cluster_grows():
    first = [ep(i + 1, t) for i, t in enumerate(TRIAGE[:3])]
    (c,) = cluster(first)
    later = [ep(100 + i, t.replace("web team", "web team today"), seat=s)
             for i, (t, s) in enumerate(itertools.product(TRIAGE, ["pm", "qa"]))]
    (grown,) = cluster(first + later)
    assert grown.id == c.id and grown.name == c.name and grown.key_terms == c.key_terms
    assert len(grown.episodes) == 13 and grown.seats == ("pm", "qa")


def test_two_components_with_one_id_are_one_cluster():
    """Apart by their words, alike by their first episodes' key terms: one topic."""
    one = [ep(i, "alpha bravo charlie zp1 zp2 zp3 zp4 zp5 zp6") for i in (1, 2, 3)]
    two = [ep(i, "alpha bravo charlie zq1 zq2 zq3 zq4 zq5 zq6") for i in (4, 5, 6)]
    assert components([tokens(one[0]["ask"]), tokens(two[0]["ask"])]) == [0, 1]
    (c,) = cluster(one + two)
    assert c.key_terms == ("alpha", "bravo", "charlie") and c.episodes == (1, 2, 3, 4, 5, 6)


def test_suggested_names_follow_the_skill_name_rule():
    assert suggested_name(["mcp.jira__search", "send"], ["invoice", "refund"], "ab" * 8) == \
        "invoice-refund-mcp-jira-search-send"
    assert suggested_name(["send"], ["éclair", "naïve"], "0123456789abcdef") == "eclair-naive-send"
    assert suggested_name(["日本"], ["東京"], "0123456789abcdef") == "skill-01234567"
    long = suggested_name(["x" * 40, "send"], ["y" * 30, "z" * 30], "0" * 16)
    assert long == "y" * 30 + "-" + "z" * 30   # cut where the next part would not fit
    for tools, terms in (([], []), (["a--b"], ["-c-"]), (["A_B"], ["9"])):
        assert NAME_RE.match(suggested_name(tools, terms, "f" * 16))


def test_covered_by_a_skill_naming_the_cluster_or_about_its_tools_and_terms():
    eps = [ep(i + 1, t, ("github", "send")) for i, t in enumerate(TRIAGE)]
    (c,) = cluster(eps)
    k1, k2, k3 = c.key_terms
    assert not covered(c, [])
    assert covered(c, [{"name": "whatever", "metadata": {"crewlet-cluster": c.id}}])
    assert covered(c, [{"name": "x", "metadata": {"crewlet-cluster": f"other, {c.id}"}}])
    about = {"name": f"{k1}-things", "description": f"How to {k2} a report",
             "metadata": {"crewlet-tools": "send github"}}
    assert covered(c, [about])                                                  # 2 of 3 terms, same tools
    assert covered(c, [{**about, "metadata": {"crewlet-tools": "github,send"}}])
    assert not covered(c, [{**about, "metadata": {"crewlet-tools": "github"}}])  # another tool set
    assert not covered(c, [{**about, "metadata": {}}])                          # tools not said
    assert not covered(c, [{**about, "description": "Something else"}])         # 1 of 3 terms
    assert not covered(c, [{"name": "x", "description": None, "metadata": None}])
    # As the estate lists them: the front matter under meta (a draft has no description of its own).
    listed = {"name": f"{k1}-{k3}",
              "meta": {"description": "d", "metadata": {"crewlet-tools": "github send"}}}
    assert covered(c, [listed])
    assert covered(c, [{"name": "y", "meta": {"metadata": {"crewlet-cluster": c.id}}}])


def test_the_fast_linking_finds_what_comparing_every_pair_finds():
    """With postings long enough to hold every set, components() is exact
    single-linkage; with the default, the corpus of the other tests is the same."""
    rnd = random.Random(3)
    for trial in range(30):
        vocab = [f"w{i}" for i in range(rnd.randint(8, 40))]
        sets = [frozenset(rnd.sample(vocab, rnd.randint(0, 8))) for _ in range(rnd.randint(2, 60))]
        want = _brute(sets, SIMILAR)
        assert components(sets, SIMILAR, postings=10 ** 9) == want, trial
        for similar in (0.2, 0.5, 1.0):
            assert components(sets, similar, postings=10 ** 9) == _brute(sets, similar), (trial, similar)


def test_a_big_corpus_clusters_by_topic():
    """Thousands of episodes: every planted topic found whole, the noise in none."""
    rnd = random.Random(11)
    eps = _corpus(rnd, 5000)
    found = cluster(eps)
    topics = {}
    for e in eps:
        if e["topic"] is not None:
            topics.setdefault(e["topic"], set()).add(e["seq"])
    by_topic = {}
    for c in found:
        planted = {e["topic"] for e in c.rows}
        assert None not in planted and len(planted) == 1, planted
        by_topic[planted.pop()] = set(c.episodes)
    for topic, seqs in topics.items():
        if len(seqs) >= MIN_CLUSTER:
            assert by_topic.get(topic) == seqs, topic


def _corpus(rnd: random.Random, n: int) -> list[dict]:
    """Episodes on 40 topics (a fixed phrase, a few words of its own) and 30 % noise."""
    vocab = [f"word{i}" for i in range(4000)]
    phrases = [[f"topic{t}term{j}" for j in range(5)] for t in range(40)]
    tools = [["github"], ["github", "send"], ["crm", "send"], ["search"]]
    out = []
    for i in range(n):
        if rnd.random() < 0.3:
            topic, words, used = None, rnd.sample(vocab, 8), rnd.choice(tools)
        else:
            topic = rnd.randrange(40)
            words, used = phrases[topic] + rnd.sample(vocab, 3), tools[topic % len(tools)]
        rnd.shuffle(words)
        out.append({"seat": f"s{rnd.randrange(5)}", "seq": i + 1000, "tools": used,
                    "ask": " ".join(words[:5]), "summary": " ".join(words[5:]), "topic": topic})
    return out


def _brute(sets: list[frozenset[str]], similar: float) -> list[int]:
    n = len(sets)
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a
    for i, j in itertools.combinations(range(n), 2):
        a, b = sets[i], sets[j]
        if a and b and len(a & b) / len(a | b) >= similar - 1e-12:
            parent[find(i)] = find(j)
    first: dict[int, int] = {}
    return [first.setdefault(find(i), i) for i in range(n)]
