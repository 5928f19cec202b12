"""Calls per token of blockwise parallel decoding and Medusa against Algorithm 1, exact (SPEC §16).

One toy pair: a peaked bigram target over V = 5 (Dirichlet(0.4) rows, float64), a draft that is the
average of the target and another such table, and exact-marginal heads of the target
(:class:`toy_models.heads.RolledHeads`, 4 heads).  Every number is an exact expectation (the
enumerator or the closed form, float64 arithmetic), averaged over the V one-token prompts, for
``N = 8`` generated tokens (no stop token, so every decode has N tokens and calls per token is
``E[calls] / N``):

- ``greedy``: blockwise parallel decoding with k = 1..4 heads against Algorithm 1 with the draft
  model and K = k (:func:`~specref.verification.statistics.efficiency.reference_iterations`), both at
  temperature 0; and Medusa's point-mass rule on the chain tree of depth k (the same candidates);
- ``sampling``: Medusa's lossless (point-mass) rule at temperature 1 on Cartesian and sparse
  (§2.3.3) trees, against Algorithm 1 with K = the tree's depth (its law of calls enumerated one
  iteration at a time, memoised on the bigram state: ``reference_iterations``' computation);
- ``typical``: the exact TV from the target of Medusa's typical acceptance (the paper's rule and the
  variant that samples the token after the prefix) and its calls per token, over the paper's
  ``delta = sqrt(epsilon)`` points and an ``epsilon x delta`` grid, prompt 0, 6 tokens.

    python benchmarks/methods_heads.py [--json figures/data/methods_heads.json]

The lead's figure reads the JSON; the numbers are exact, so reruns give the same file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

V, N, HEADS = 5, 8, 4


def toy_pair():
    from specref.verification.cases.tables import ProbTable
    from toy_models.heads import RolledHeads

    def table(seed):
        rng = np.random.default_rng(seed)
        return rng.dirichlet(np.full(V, 0.4), size=V)

    target_table = table(4)
    draft_table = (target_table + table(40)) / 2
    target = ProbTable(target_table)
    return target_table, draft_table, target, RolledHeads(target, HEADS, window=1)


def calls_law(iteration, key) -> dict:
    """The law of the number of iterations, memoised on ``key`` (each block marked with -1)."""
    from specref.verification.laws.enumeration import law_iterated

    def marked(state, rng):
        block, following = iteration(state, rng)
        return tuple(block) + (-1,), following

    out: dict = {}
    for tokens, w in law_iterated((), marked, key=key).items():
        out[tokens.count(-1)] = out.get(tokens.count(-1), 0) + w
    return out


def mean(law) -> float:
    return float(sum(n * w for n, w in law.items()))


def greedy_rows(target_table, draft_table, target, heads) -> list[dict]:
    from specref.core.sampling import GREEDY
    from specref.decoding import blockwise, medusa
    from specref.verification.cases.chain import Case
    from specref.verification.statistics.efficiency import reference_iterations

    rows = []
    for k in range(1, HEADS + 1):
        chain = [(0,) * d for d in range(1, k + 1)]
        per_prompt = []
        for x in range(V):
            case = Case("pair", target_table, draft_table, prompt=(x,), k=k, max_new_tokens=N, config=GREEDY)
            per_prompt.append((float(blockwise.calls_per_token(target, heads, [x], k=k, max_new_tokens=N)),
                               mean(reference_iterations(case)) / N,
                               float(medusa.calls_per_token(target, heads, [x], choices=chain, max_new_tokens=N,
                                                            config=GREEDY))))
        b, a, m = (float(np.mean(c)) for c in zip(*per_prompt))
        rows.append({"k": k, "blockwise_calls_per_token": b, "blockwise_tokens_per_call": 1 / b,
                     "algorithm_1_calls_per_token": a, "medusa_chain_calls_per_token": m})
    return rows


def accuracy(heads) -> list[list[float]]:
    """Per head, the mean i-th largest probability over the V contexts: for exact-marginal heads, how
    often the i-th top prediction is the token (the calibration §2.3.3 measures on data)."""
    rows = np.stack([heads([x]) for x in range(V)]).astype(np.float64)  # [V, K, V]
    return np.sort(rows, axis=2)[:, :, ::-1].mean(axis=0).tolist()


def sampling_rows(target_table, draft_table, target, heads) -> list[dict]:
    from specref.core.sampling import SamplingConfig
    from specref.decoding import medusa
    from specref.decoding.blockwise import window_key
    from specref.decoding.chain import speculative_transition
    from specref.verification.cases.tables import ProbTable

    draft, config = ProbTable(draft_table), SamplingConfig()
    trees = [(f"cartesian {w}", medusa.cartesian_choices(w)) for w in ([1], [1, 1], [1, 1, 1], [2], [2, 2], [3, 2],
                                                                       [2, 2, 2], [3, 3, 2])]
    trees += [(f"sparse {n}", medusa.sparse_choices(accuracy(heads), n)) for n in (2, 4, 8, 12, 16)]
    algorithm_1: dict = {}
    rows = []
    for name, choices in trees:
        depth = max(len(c) for c in choices)
        if depth not in algorithm_1:  # both bigrams: the last token and the count generated are the state
            algorithm_1[depth] = float(np.mean([mean(calls_law(speculative_transition(
                target, draft, [x], k=depth, config=config, max_new_tokens=N),
                lambda g, x=x: ((x,) + tuple(g))[-1:] + (len(g),))) / N for x in range(V)]))
        m = float(np.mean([float(medusa.calls_per_token(target, heads, [x], choices=choices, max_new_tokens=N,
                                                        config=config, key=window_key([x], 1))) for x in range(V)]))
        rows.append({"tree": name, "nodes": len(choices), "depth": depth, "medusa_calls_per_token": m,
                     "medusa_tokens_per_call": 1 / m, "algorithm_1_calls_per_token": algorithm_1[depth]})
    return rows


def typical_rows(target, heads) -> list[dict]:
    from specref.decoding import medusa
    from specref.decoding.blockwise import window_key

    grid = list(medusa.PAPER_GRID) + [(e, d) for e in (0.05, 0.3, 1.0) for d in (0.1, 0.5, 1.0, 3.0)]
    table = medusa.typical_tv_table(target, heads, [0], choices=medusa.cartesian_choices([2, 2]), max_new_tokens=6,
                                    grid=grid, key=window_key([0], 1))
    return [{k: float(v) for k, v in row.items()} | {"paper_point": math.isclose(row["delta"] ** 2, row["epsilon"])}
            for row in table]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "..", "figures", "data",
                                                   "methods_heads.json"))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    target_table, draft_table, target, heads = toy_pair()
    record = {
        "what": "exact calls per token of blockwise parallel decoding and Medusa against Algorithm 1 (SPEC §16)",
        "case": {"V": V, "tokens": N, "head_count": HEADS, "prompts": "each one-token prompt, averaged",
                 "target": "bigram, Dirichlet(0.4) rows, seed 4", "draft": "(target + the seed-40 table) / 2",
                 "heads": "toy_models.heads.RolledHeads (exact marginals at temperature 1)"},
        "greedy": greedy_rows(target_table, draft_table, target, heads),
        "sampling": sampling_rows(target_table, draft_table, target, heads),
        "typical": typical_rows(target, heads),
    }
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"wrote {args.json} in {time.perf_counter() - t0:.1f} s")
    for part in ("greedy", "sampling", "typical"):
        for row in record[part]:
            print(part, {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
