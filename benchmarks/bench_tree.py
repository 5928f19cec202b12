"""Cost of exact tree verification, and expected accepted length per tree shape.

Headline: the exact law of one tree step, depth 3, width 2 (14 draft nodes), V = 8,
random bigram tables (``toy_models.ngram.NGramModel.random``, order 2), Fraction rows:

- ``pointmass``: the tree-level oracle's program for the point-mass verifier (top-2
  drafting, every coin enumerated, the block completed to 4 tokens), against the target
  law of 4 tokens (TV must be 0);
- ``rrs`` / ``rrs_without_replacement`` / ``kseq``: the verifier's own law over
  ``(path, next token)`` for one drafted tree with sampled children (the drafts fixed).

Then E[accepted draft tokens per step] for chain / width 2 / width 4 trees of depth
1..4, exact (from the law of one step at the prompt) beside a measured mean on the toy
transformer pair (``specref.verify.transformer_pair``, float rows, N steps).  Last, the
per-node acceptance of each verifier against the optimum over random rational (p, q), V = 4,
k = 2 and 3 (:func:`specref.verification.laws.optimal.acceptance_table`), optionally drawn.

    python benchmarks/bench_tree.py [--repeats 3] [--quick] [--json PATH] [--figure PATH.png]
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
    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__}


def timed(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def headline(repeats: int) -> list[dict]:
    from specref.core import tree_verify
    from specref.decoding.tree import draft_tree, tree_rows
    from specref.verification.laws.enumeration import compare, law
    from specref.verification.levels.trees.sampled import TreeCase, tree_program
    from toy_models.ngram import NGramModel

    V = 8
    target = NGramModel.random(order=2, vocab_size=V, seed=1).exact
    draft = NGramModel.random(order=2, vocab_size=V, seed=2, zero_frac=0.25).exact
    rows = []
    def table(model):  # [V, V]: the bigram row after each token
        return np.stack([model.probs([a])[-1] for a in range(V)])

    case = TreeCase("bench", table(target), table(draft), widths=(2, 2, 2), drafting="topk")
    program, expected = tree_program(tree_verify.pointmass_verify, case, time_limit=60)
    seconds, got = timed(lambda: law(lambda rng: program(rng, rng)), repeats)
    rows.append({"what": "pointmass oracle step, depth 3 width 2, V=8", "seconds": seconds, "paths": got.paths,
                 "outputs": len(got), "tv": str(compare(got, expected).tv)})
    for name, scheme in [("rrs_with_replacement", "iid"), ("rrs_without_replacement", "without_replacement"),
                         ("kseq", "iid")]:
        gen = np.random.default_rng(0)
        row_of = {}

        def row(model, path):
            key = (id(model), path)
            if key not in row_of:
                row_of[key] = model.probs([0, *path])[-1]
            return row_of[key]

        tree, q, paths = draft_tree((2, 2, 2), lambda path: row(draft, path), scheme, gen)
        p = tree_rows(lambda path: row(target, path), paths)
        verify = tree_verify.VERIFIERS[name]
        seconds, got = timed(lambda: law(lambda rng: _step(verify, tree, p, q, rng)), repeats)
        rows.append({"what": f"{name} verifier law, one drafted tree, depth 3 width 2, V=8", "seconds": seconds,
                     "paths": got.paths, "outputs": len(got)})
    return rows


def _step(verify, tree, p, q, rng):
    path, token = verify(tree, p, q, rng)
    return tuple(path), token


SHAPES = {"chain": 1, "width 2": 2, "width 4": 4}


def accepted_length(samples: int) -> list[dict]:
    """Exact E[accepted] at the prompt (law of one step) and the mean over `samples` steps, transformer pair."""
    from specref.core.sampling import SamplingConfig
    from specref.decoding.chain import next_token_probs
    from specref.decoding.tree import tree_block
    from specref.verification.laws.enumeration import law
    from specref.verify import transformer_pair

    target, draft, prompt = transformer_pair()
    config = SamplingConfig()
    memo = {}

    def row(model, path):
        key = (id(model), path)
        if key not in memo:
            memo[key] = next_token_probs(model, prompt + list(path), config)
        return memo[key]

    out = []
    for shape, w in SHAPES.items():
        for depth in range(1, 5):
            if w ** depth > 64:  # keep the tree (and the exact enumeration) small
                continue
            widths = (w,) * depth

            def one(rng, widths=widths):
                _, path, _ = tree_block(lambda p: row(target, p), lambda p: row(draft, p), widths=widths,
                                        scheme="topk", verify="pointmass", rng=rng)
                return len(path)

            exact = sum(k * v for k, v in law(one).items())
            gen = np.random.default_rng(depth * 10 + w)
            measured = float(np.mean([one(gen) for _ in range(samples)]))
            out.append({"shape": shape, "depth": depth, "nodes": sum(w ** d for d in range(1, depth + 1)),
                        "exact": float(exact), "measured": measured, "samples": samples})
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one repeat, fewer samples")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--figure", metavar="PATH", help="draw the acceptance table (matplotlib, PNG)")
    args = ap.parse_args(argv)
    from specref.verification.laws.optimal import acceptance_table

    repeats = 1 if args.quick else args.repeats
    out = {"machine": machine_info(), "argv": sys.argv[1:], "headline": headline(repeats),
           "accepted_length": accepted_length(200 if args.quick else 2000),
           "acceptance": acceptance_table(5 if args.quick else 30, V=4, ks=(2, 3), seed=0)}
    for r in out["headline"]:
        print(f"{r['what']:<70} {r['seconds']:7.3f} s  paths={r['paths']}  outputs={r['outputs']}"
              + (f"  TV={r['tv']}" if "tv" in r else ""))
    print(f"\n{'shape':<8} {'depth':>5} {'nodes':>5} {'E[accepted] exact':>18} {'measured':>9}")
    for r in out["accepted_length"]:
        print(f"{r['shape']:<8} {r['depth']:>5} {r['nodes']:>5} {r['exact']:>18.4f} {r['measured']:>9.4f}")
    names = [n for n in out["acceptance"][0] if n not in ("k", "V", "cases")]
    print(f"\n{'mean per-node acceptance (V = 4)':<32}" + "".join(f"{'k = ' + str(r['k']):>10}" for r in out["acceptance"]))
    for n in names:
        print(f"{n:<32}" + "".join(f"{r[n]:>10.4f}" for r in out["acceptance"]))
    if args.figure:
        draw(out["acceptance"], names, args.figure)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


def draw(rows, names, path):
    """Grouped bars: mean per-node acceptance of each verifier and optimum, per k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(rows)
    for j, r in enumerate(rows):
        ax.bar([i + j * width for i in range(len(names))], [r[n] for n in names], width, label=f"k = {r['k']}")
    ax.set_xticks([i + width * (len(rows) - 1) / 2 for i in range(len(names))], names, rotation=25, ha="right",
                  fontsize=8)
    ax.set_ylabel("P(accept at a node)")
    ax.set_ylim(0, 1)
    ax.set_title(f"per-node acceptance vs the optimum, {rows[0]['cases']} random (p, q), V = {rows[0]['V']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
