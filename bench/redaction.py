#!/usr/bin/env python3
"""Benchmark: what keeping secrets out of text costs (crewlet/redaction.py), beside bare scans.

Every tool result and model reply passes through :func:`crewlet.redaction.scrub`
(the values known, then the credential shapes), and a streamed reply through a
:class:`~crewlet.redaction.Stream`. Measured in this process, no broker, each
case on the same text beside its raw baselines in the same run:

* **json, no shape word**: a ~7 KB JSON tool result whose fields say ``key``
  and ``tokens`` (a tracker's listing) and no secret — the common case, which
  must take the fast path: ``scrub`` beside a **bare scan** (one ``str in`` of
  a 31-character value absent from it, the floor of looking at a text at all)
  and the **bare regex** (``SECRET_SHAPES.sub`` alone: what every text would
  pay without the look);
* **json, a shape word**: the same with ``"password_hint"`` in it (the look
  says maybe, so the regex runs): ``scrub`` beside the same two;
* **words, 20 values known**: ~10 KB of random words with twenty 40-character
  values known and none in it (the speed check ``tests/unit/test_redaction.py``
  once asserted: "~0.1 ms; 2 ms is generous", now a target here): ``scrub``
  beside the bare scan of each value (``all(v not in text)``);
* **stream**: the json text with a shape word fed to a ``Stream`` in pieces
  of 4 characters (a model's tokens), beside ``scrub`` of the whole text once.

Figures are µs a KB (median of ``--rounds`` rounds of ``--repeat`` calls,
the cases interleaved); x = crewlet / baseline. Targets (informational):
json without a shape word ≤ 10 µs a KB and ≤ 0.5x the bare regex (which
itself went from ~100 to ~23 µs a KB once it was entered only at a shape's
first letter); words ≤ 2 ms for 10 KB.

    python bench/redaction.py [--rounds 15] [--repeat 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import string
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.common import add_smoke, emit, ratio, say  # noqa: E402
from crewlet import redaction  # noqa: E402

PIECE = 4            # characters a streamed piece (a model's token is ~4)
ABSENT = "correcthorse-0123456789-battery"   # a value none of the texts holds


def _json_result(shape_word: bool) -> str:
    items = [{"key": f"PROJ-{i}", "title": f"fix the thing number {i}", "status": "open",
              "tokens": {"input": 1200 + i, "output": 45}, "assignee": "bob", "labels": ["ui", "bug"]}
             for i in range(50)]
    if shape_word:
        items[25]["password_hint"] = "the usual one"
    return json.dumps({"items": items, "next": None})


def _words(rnd: random.Random) -> str:
    text = " ".join("".join(rnd.choices(string.ascii_letters + string.digits, k=rnd.randint(2, 9)))
                    for _ in range(1500))
    return text.replace("sk", "xx").lower()


def _timed(call: Callable[[], Any], repeat: int) -> float:
    """Seconds one *call* takes, the mean of *repeat*."""
    started = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - started) / repeat


def _stream(text: str) -> None:
    stream = redaction.Stream()
    for i in range(0, len(text), PIECE):
        stream.feed(text[i:i + PIECE])
    stream.end()


def run(rounds: int, repeat: int) -> dict[str, Any]:
    rnd = random.Random(1)
    plain, worded, words = _json_result(False), _json_result(True), _words(rnd)
    values = ["".join(rnd.choices(string.ascii_letters, k=40)) for _ in range(20)]
    shapes = redaction.SECRET_SHAPES
    hide = redaction._hide  # what scrub_shapes substitutes with
    # Each case: (text, values known, {side: call}); crewlet's side first in the table.
    cases: dict[str, tuple[str, list[str], dict[str, Callable[[], Any]]]] = {
        "json, no shape word": (plain, [], {
            "crewlet": lambda: redaction.scrub(plain),
            "bare scan": lambda: ABSENT in plain,
            "bare regex": lambda: shapes.sub(hide, plain)}),
        "json, a shape word": (worded, [], {
            "crewlet": lambda: redaction.scrub(worded),
            "bare scan": lambda: ABSENT in worded,
            "bare regex": lambda: shapes.sub(hide, worded)}),
        "words, 20 values known": (words, values, {
            "crewlet": lambda: redaction.scrub(words),
            "bare scan": lambda: all(v not in words for v in values)}),
        "stream, 4-char pieces": (worded, [], {
            "crewlet": lambda: _stream(worded),
            "scrub whole": lambda: redaction.scrub(worded)}),
    }
    # The fast path is what is measured: check it is taken (and the slow one where meant).
    assert redaction.scrub(plain) is plain and not redaction.may_hold_shape(plain)
    assert redaction.may_hold_shape(worded)
    samples: dict[str, dict[str, list[float]]] = {name: {side: [] for side in sides}
                                                  for name, (_, _, sides) in cases.items()}
    for r in range(rounds):
        say(f"round {r + 1}/{rounds}")
        for name, (text, known, sides) in cases.items():
            redaction.forget_all()
            redaction.learn(known)
            order = list(sides.items())
            if r % 2:
                order.reverse()  # neither side always warm first
            for side, call in order:
                # Stream rounds are a few hundred feeds each: fewer of them.
                n = max(1, repeat // 20) if "stream" in name and side == "crewlet" else repeat
                samples[name][side].append(_timed(call, n) * 1e6 / (len(text) / 1024))
    redaction.forget_all()
    report: dict[str, Any] = {"rounds": rounds, "repeat": repeat, "piece_chars": PIECE, "cases": {}}
    for name, (text, known, sides) in cases.items():
        medians = {side: statistics.median(v) for side, v in samples[name].items()}
        row: dict[str, Any] = {"kb": round(len(text) / 1024, 2), "known_values": len(known),
                               "us_per_kb": {side: round(m, 3) for side, m in medians.items()}}
        row["x"] = {side: round(ratio(medians["crewlet"], m), 3)
                    for side, m in medians.items() if side != "crewlet"}
        report["cases"][name] = row
    words_row = report["cases"]["words, 20 values known"]
    words_row["crewlet_ms"] = round(words_row["us_per_kb"]["crewlet"] * words_row["kb"] / 1000, 4)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15, help="rounds, the cases interleaved (default 15)")
    ap.add_argument("--repeat", type=int, default=200, help="calls a side makes a round (default 200)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    add_smoke(ap, None, {"rounds": 2, "repeat": 5})
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = run(args.rounds, args.repeat)

    def text(r: dict[str, Any]) -> None:
        print(f"scrub and Stream, µs a KB (median of {r['rounds']} rounds of {r['repeat']} calls); "
              "x = crewlet / baseline")
        print(f"{'case':<24} {'KB':>5} {'crewlet':>9}  baselines")
        for name, row in r["cases"].items():
            us = row["us_per_kb"]
            others = "  ".join(f"{side} {us[side]:.2f} (x {row['x'][side]:.2f})"
                               for side in us if side != "crewlet")
            print(f"{name:<24} {row['kb']:>5.1f} {us['crewlet']:>9.2f}  {others}")
        w = r["cases"]["words, 20 values known"]
        print(f"10 KB of words with 20 values known: {w['crewlet_ms']:.3f} ms a scrub (target ≤ 2 ms)")
    return emit(report, args.json, text)


if __name__ == "__main__":
    sys.exit(main())
