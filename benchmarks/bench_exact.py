"""Cost of the exact verifier (specref.verification.laws.enumeration): enumerating speculative decoding.

Headline: a random bigram pair (``toy_models.ngram.NGramModel.random``, order 2,
zero_frac 0.25), V = 8, K = 3, 6 new tokens, enumerated with ``law_iterated`` and the
bigram memo key ``(last token, tokens generated)``; float64 rows and exact Fraction
rows, each checked against ``target_law`` (TV).  Then how the cost grows with V, K
and the output length (one varied at a time), and what memoisation saves.
Times are the median of ``--repeats`` runs; leaves/s = distinct outputs per second,
paths/s = program runs (one speculative iteration each) per second.

    python benchmarks/bench_exact.py [--repeats 3] [--quick] [--no-exact] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def bigram_pair(V: int, *, exact: bool, seed: int = 0):
    from toy_models.ngram import NGramModel

    target = NGramModel.random(order=2, vocab_size=V, seed=2 * seed + 1)
    draft = NGramModel.random(order=2, vocab_size=V, seed=2 * seed + 2)
    return (target.exact, draft.exact) if exact else (target, draft)


def enumerate_speculative(V: int, K: int, length: int, *, exact: bool, memoise: bool = True, repeats: int = 1):
    """Median seconds and the law of speculative decoding for one configuration."""
    from specref.core.sampling import SamplingConfig
    from specref.decoding.chain import speculative_transition
    from specref.verification.laws.enumeration import law_iterated

    target, draft = bigram_pair(V, exact=exact)
    prompt = [0]

    def key(state):  # bigram models: the rest depends only on the last token and the count
        return (state[-1] if state else prompt[-1], len(state))

    times, result = [], None
    for _ in range(repeats):
        # a fresh transition per run, so that any row cache inside it starts cold
        it = speculative_transition(target, draft, prompt, k=K, config=SamplingConfig(), max_new_tokens=length)
        start = time.perf_counter()
        result = law_iterated((), it, key=key if memoise else None, memoise=memoise)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _row(V, K, length, seconds, law) -> dict:
    return {
        "V": V, "K": K, "length": length, "seconds": seconds,
        "paths": law.paths, "states": law.states, "leaves": law.leaves,
        "leaves_per_s": law.leaves / seconds, "paths_per_s": law.paths / seconds,
    }


def _table(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    print("|  V |  K | len |  seconds |     paths | states |   leaves |  leaves/s |   paths/s |")
    print("|---:|---:|----:|---------:|----------:|-------:|---------:|----------:|----------:|")
    for r in rows:
        print(f"| {r['V']:2d} | {r['K']:2d} | {r['length']:3d} | {r['seconds']:8.3f} | {r['paths']:9d} | "
              f"{r['states']:6d} | {r['leaves']:8d} | {r['leaves_per_s']:9.0f} | {r['paths_per_s']:9.0f} |")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per headline case; the median is reported")
    ap.add_argument("--quick", action="store_true", help="smaller growth grid, one run each")
    ap.add_argument("--no-exact", action="store_true", help="skip the (slow) Fraction headline")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)

    from specref.core.sampling import SamplingConfig
    from specref.verification.laws.enumeration import compare, target_law

    out: dict = {"machine": machine_info(), "argv": sys.argv[1:], "headline": [], "growth": {}, "memo": []}
    print("machine:", out["machine"])

    # -- headline: V = 8, K = 3, 6 tokens -------------------------------------------------
    for exact in ([False] if args.no_exact else [False, True]):
        reps = args.repeats if not exact else max(1, args.repeats // 3)
        seconds, law = enumerate_speculative(8, 3, 6, exact=exact, repeats=reps)
        target, _ = bigram_pair(8, exact=exact)
        start = time.perf_counter()
        want = target_law(target, [0], SamplingConfig(), 6)
        t_target = time.perf_counter() - start
        row = _row(8, 3, 6, seconds, law) | {
            "rows": "Fraction" if exact else "float64", "repeats": reps,
            "tv_vs_target_law": float(compare(law, want).tv), "target_law_seconds": t_target,
        }
        out["headline"].append(row)
        _table([row], f"headline, {row['rows']} rows (median of {reps}): TV vs target_law = "
                      f"{row['tv_vs_target_law']:.3g}; target_law itself {t_target:.2f} s")

    # -- growth: one of V, K, length varied around a base --------------------------------
    base = dict(V=4, K=2, length=4)
    grid = {
        "V": [2, 4, 6, 8, 10] if not args.quick else [2, 4, 8],
        "K": [1, 2, 3, 4, 5] if not args.quick else [1, 2, 4],
        "length": [2, 4, 6, 8] if not args.quick else [2, 4, 6],
    }
    reps = 1 if args.quick else max(1, args.repeats // 2)
    for name, values in grid.items():
        rows = []
        for v in values:
            cfg = base | {name: v}
            seconds, law = enumerate_speculative(cfg["V"], cfg["K"], cfg["length"], exact=False, repeats=reps)
            rows.append(_row(cfg["V"], cfg["K"], cfg["length"], seconds, law))
        out["growth"][name] = rows
        _table(rows, f"growth in {name} (float64 rows, others at V=4, K=2, len=4; median of {reps})")

    # -- what memoisation buys -------------------------------------------------------------
    rows = []
    for memoise in (True, False):
        seconds, law = enumerate_speculative(4, 2, 4, exact=False, memoise=memoise, repeats=reps)
        rows.append(_row(4, 2, 4, seconds, law) | {"memoise": memoise})
    out["memo"] = rows
    _table(rows, "memoised (first row, key = (last token, count)) vs unmemoised (second row)")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
