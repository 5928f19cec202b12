"""Traversal verification beside token-level tree verification and the optimum: exact expected accepted length.

Three tables, every E[draft tokens accepted per tree step] computed exactly (the law of one
step, enumerated over the drafting and the coins; :func:`specref.verification.laws.optimal.tree_acceptance`):

- ``cases``: the tree level's default cases and a few more (bigram tables, V = 3, Fraction
  rows) for each sampled drafting: traversal verification, the token-level verifiers of that
  drafting (RRS; K-SEQ for i.i.d. children; block verification on chains) and the optimum over
  every valid verifier (:func:`~specref.verification.laws.optimal.tree_optimum`, an LP), each as
  an exact fraction and a decimal; the seconds of the exact tree-level check of traversal;
- ``random``: the means over random rational rows per path (V = 3) per tree shape
  (:func:`~specref.verification.laws.optimal.tree_acceptance_table`);
- ``transformer``: the tiny cached transformer pair (``specref.verify.transformer_pair``,
  V = 4, float rows) at temperatures 0.5 and 1, per shape.

Each row gives traversal's relative gain over the drafting's RRS, the quantity Weng et al.
report (2.2-5.7 % on real models).

    python benchmarks/bench_traversal.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np


def machine_info() -> dict:
    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__}


def _cases():
    from fractions import Fraction as F

    from specref.verification.levels.trees.sampled import TreeCase, tree_cases

    def frac(*rows):
        return np.array([[F(v) for v in row] for row in rows], dtype=object)

    p = frac(["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"])
    q = frac(["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"], ["1/4", "1/2", "1/4"])
    out = []
    for drafting in ("without_replacement", "iid"):
        out += tree_cases(drafting)
        out += [TreeCase("chain-depth3", p, q, widths=(1, 1, 1), drafting=drafting),
                TreeCase("width2-width2", p, q, widths=(2, 2), drafting=drafting),
                TreeCase("width3-depth2", p, q, prompt=(2,), widths=(3, 1), drafting=drafting)]
    return out


def _gain(row: dict, scheme: str) -> float:
    rrs = row["RRS without replacement" if scheme == "without_replacement" else "RRS with replacement"]
    return float(row["traversal"]) / float(rrs) - 1


def case_table() -> list[dict]:
    """The default and extra tree cases: exact values per verifier, the LP optimum, the check's seconds."""
    from specref.core.tree_verify import traversal_verify
    from specref.verification.laws.optimal import tree_acceptance_row
    from specref.verification.levels.trees.sampled import memo_rows
    from specref.verification.oracle import check

    out = []
    for case in _cases():
        target, draft = case.models()
        row = memo_rows(case.prompt)
        values = tree_acceptance_row(lambda path: row(target, path), lambda path: row(draft, path), case.widths,
                                     case.drafting)
        iid = case.drafting == "iid"

        def fn(tree, p_target, q_draft, rng, iid=iid):
            return traversal_verify(tree, p_target, q_draft, rng, replacement=iid)

        t0 = time.perf_counter()
        report = check("tree", fn, cases=[case])
        seconds = time.perf_counter() - t0
        out.append({"case": case.name, "widths": list(case.widths), "drafting": case.drafting,
                    "exact": {k: str(v) for k, v in values.items() if k != "optimum"},
                    "decimal": {k: float(v) for k, v in values.items()},
                    "traversal gain over RRS": _gain(values, case.drafting),
                    "check": {"tv": str(report.worst_tv), "ok": report.ok, "seconds": seconds}})
    return out


def transformer_table(shapes) -> list[dict]:
    """The toy transformer pair at two temperatures: float rows, exact enumeration."""
    from specref.core.sampling import SamplingConfig
    from specref.decoding.chain import next_token_probs
    from specref.verification.laws.optimal import tree_acceptance_row
    from specref.verify import transformer_pair

    target, draft, prompt = transformer_pair()
    out = []
    for temperature in (0.5, 1.0):
        config, memo = SamplingConfig(temperature=temperature), {}

        def row(model, path, config=config, memo=memo):
            key = (id(model), tuple(path))
            if key not in memo:
                memo[key] = next_token_probs(model, list(prompt) + list(path), config)
            return memo[key]

        for widths in shapes:
            for scheme in (("without_replacement",) if all(w == 1 for w in widths) else ("without_replacement", "iid")):
                values = tree_acceptance_row(lambda path: row(target, path), lambda path: row(draft, path), widths,
                                             scheme)
                out.append({"temperature": temperature, "widths": list(widths), "scheme": scheme,
                            **{k: float(v) for k, v in values.items()}, "traversal gain over RRS": _gain(values, scheme)})
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer random cases and shapes")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    from specref.verification.laws.optimal import tree_acceptance_table

    t0 = time.perf_counter()
    shapes = ((1, 1), (1, 1, 1), (2, 1), (1, 2)) if args.quick else ((1, 1), (1, 1, 1), (1, 1, 1, 1), (2, 1), (1, 2),
                                                                    (2, 2), (3, 1))
    out = {"machine": machine_info(), "argv": sys.argv[1:], "cases": case_table(),
           "random": tree_acceptance_table(2 if args.quick else 6, V=3, shapes=shapes[:5] if args.quick else
                                           ((1, 1), (1, 1, 1), (2, 1), (1, 2), (2, 2)), seed=0),
           "transformer": transformer_table(shapes)}
    out["seconds"] = time.perf_counter() - t0
    _print(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


def _print(out: dict) -> None:
    print(f"{'case':<18} {'widths':<10} {'drafting':<20} {'traversal':>20} {'RRS':>20} {'optimum':>8} {'gain':>7}")
    for r in out["cases"]:
        rrs = "RRS without replacement" if r["drafting"] == "without_replacement" else "RRS with replacement"
        cell = {k: f"{r['exact'][k]} ({r['decimal'][k]:.4f})" for k in ("traversal", rrs)}
        print(f"{r['case']:<18} {str(tuple(r['widths'])):<10} {r['drafting']:<20} {cell['traversal']:>20} "
              f"{cell[rrs]:>20} {r['decimal']['optimum']:>8.4f} {100 * r['traversal gain over RRS']:>6.2f}%"
              f"   check TV={r['check']['tv']} {r['check']['seconds']:.2f}s")
    for name in ("random", "transformer"):
        print(f"\n{name}")
        for r in out[name]:
            keys = [k for k in r if k not in ("widths", "scheme", "V", "cases", "temperature", "traversal gain over RRS")]
            head = f"T={r['temperature']} " if "temperature" in r else ""
            head += f"{str(tuple(r['widths'])):<10} {r['scheme']:<20}"
            print(head + "  ".join(f"{k}={r[k]:.4f}" for k in keys) + f"  gain={100 * r['traversal gain over RRS']:.2f}%")
    print(f"\n{out['seconds']:.1f} s")


if __name__ == "__main__":
    main()
