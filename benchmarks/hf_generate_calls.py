"""Target calls of Hugging Face assisted ``generate`` against the exact law of a model of it.

The efficiency verdict (``benchmarks/hf_generate.py``) compares HF's mean target calls
per decode with the reference's, the draft warped once and twice.  This script asks the
sharper question for one case: is the joint law of (output, target calls) of assisted
``generate`` the law of standard speculative sampling with the target warped once and
the draft warped ``--passes`` times (transformers 5.24 warps the draft twice)?

- the exact joint law is enumerated here, iteration by iteration, over the case's rows
  (HF's processors, :func:`specref.adapters.hf_generate.hf_rules`); its mean number of
  calls must equal :func:`specref.verification.statistics.efficiency.reference_iterations`, an
  independent route (checked, the script stops otherwise);
- ``--decodes`` seeded decodes of ``HFGenerate`` in ``--blocks`` blocks (seeds from
  ``SeedSequence(--seed).spawn(blocks)``, so the numbers do not depend on ``--workers``);
- reported: mean calls with its standard error, its distance from the model's mean in
  standard errors, and the G-test of the joint counts against the exact law.

    python benchmarks/hf_generate_calls.py --case hf-top-p --decodes 150000 --workers 2 \\
        --json benchmarks/out/hf_generate_calls_top_p.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def _rows(case, passes):
    from specref.adapters.hf_generate import hf_rules

    def norm(a):
        return a / a.sum(axis=1, keepdims=True)

    return norm(hf_rules(case.target, case.config)), norm(hf_rules(case.draft, case.config, passes=passes))


def joint_law(case, passes: int = 2) -> dict:
    """Exact law of ((output tokens), target calls) for a bigram logits case: K drafts per
    iteration, capped so that an iteration never drafts past ``max_new_tokens`` (HF's
    ``max_new_tokens - generated - 1``), accept with min(1, p/q), resample from the
    residual, a bonus token when all pass.  No stop tokens."""
    if case.stop_tokens or case.target.ndim != 2 or case.config.greedy:
        raise ValueError(f"joint_law: case {case.name!r} needs bigram rows, sampling and no stop tokens")
    P, Q = _rows(case, passes)
    K, N = case.k, case.max_new_tokens
    law: dict = defaultdict(float)

    def iteration(tokens, calls, w):
        if len(tokens) >= N:
            law[(tuple(tokens[:N]), calls)] += w
            return
        drafts = min(K, N - len(tokens) - 1)

        def draft(j, ctx, accepted, w):
            if j == drafts:  # all drafts accepted: the bonus token
                for y in np.flatnonzero(P[ctx] > 0):
                    iteration(tokens + accepted + [int(y)], calls + 1, w * P[ctx, y])
                return
            residual = np.maximum(P[ctx] - Q[ctx], 0)
            for x in np.flatnonzero(Q[ctx] > 0):
                a = min(1.0, P[ctx, x] / Q[ctx, x])
                if a > 0:
                    draft(j + 1, int(x), accepted + [int(x)], w * Q[ctx, x] * a)
                if a < 1:
                    for y in np.flatnonzero(residual > 0):
                        iteration(tokens + accepted + [int(y)], calls + 1,
                                  w * Q[ctx, x] * (1 - a) * residual[y] / residual.sum())

        draft(0, tokens[-1] if tokens else case.prompt[-1], [], w)

    iteration([], 0, 1.0)
    if abs(sum(law.values()) - 1) > 1e-9:
        raise AssertionError(f"joint_law: the law sums to {sum(law.values())}")
    return dict(law)


def _block(name, seeds, one_stream=False):
    from transformers.utils import logging

    from specref.adapters.hf_generate import HFGenerate, hf_cases
    from specref.verification.cases.tables import LogitTable

    logging.set_verbosity_error()
    case = {c.name: c for c in hf_cases()}[name].as_float()
    impl = HFGenerate()
    decode = impl
    if one_stream:  # torch seeded once for the block; the decodes draw one after another from its stream
        import torch

        torch.manual_seed(int(seeds[0]))
        decode = impl._generate
    out = []
    for s in seeds:
        tokens = decode(LogitTable(case.target), LogitTable(case.draft), case.prompt, k=case.k, config=case.config,
                        max_new_tokens=case.max_new_tokens, stop_tokens=case.stop_tokens, rng=int(s))
        out.append((tuple(tokens), impl.last_target_calls))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="hf-top-p")
    ap.add_argument("--decodes", type=int, default=150_000)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--passes", type=int, default=2, help="draft warps in the model (transformers 5.24: 2)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--one-stream", action="store_true",
                    help="seed torch once per block instead of once per decode (the oracle's way)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    for arg in ("decodes", "blocks", "workers", "passes"):
        if getattr(args, arg) < 1:
            ap.error(f"--{arg} must be >= 1, got {getattr(args, arg)}")

    import torch
    import transformers
    from scipy import stats

    from specref.adapters.hf_generate import hf_cases, hf_rules
    from specref.verification.statistics.efficiency import _mean, reference_iterations

    cases = {c.name: c for c in hf_cases()}
    if args.case not in cases:
        ap.error(f"--case must be one of {sorted(cases)}, got {args.case!r}")
    case = cases[args.case].as_float()
    law = joint_law(case, args.passes)
    model_mean = sum(calls * w for (_, calls), w in law.items())
    ref = float(_mean(reference_iterations(case, rules=hf_rules,
                                           draft_rules=lambda x, c: hf_rules(x, c, passes=args.passes))))
    if abs(model_mean - ref) > 1e-9:
        raise SystemExit(f"the enumerated law's mean calls {model_mean} != reference_iterations {ref}")

    per_block = [args.decodes // args.blocks + (i < args.decodes % args.blocks) for i in range(args.blocks)]
    seeds = [np.random.default_rng(child).integers(2 ** 63, size=n)
             for child, n in zip(np.random.SeedSequence(args.seed).spawn(args.blocks), per_block)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        blocks = list(pool.map(_block, [args.case] * args.blocks, seeds, [args.one_stream] * args.blocks))
    seconds = time.perf_counter() - t0
    samples = [s for b in blocks for s in b]
    calls = np.array([c for _, c in samples], dtype=float)
    mean, se = calls.mean(), calls.std(ddof=1) / np.sqrt(len(calls))
    counts = Counter(samples)
    outside = [k for k in counts if k not in law]
    keys = sorted(law)
    g = stats.power_divergence([counts.get(k, 0) for k in keys], [law[k] * len(samples) for k in keys],
                               lambda_="log-likelihood")
    g_p = 0.0 if outside else float(g.pvalue)  # an output the model cannot make refutes it outright
    record = {
        "command": "python benchmarks/hf_generate_calls.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": platform.python_version(), "machine": platform.machine()},
        "case": args.case, "decodes": len(samples), "blocks": args.blocks, "seed": args.seed, "passes": args.passes, "one_stream": args.one_stream,
        "seconds": seconds, "mean_calls": mean, "se": se, "block_means": [float(np.mean([c for _, c in b])) for b in blocks],
        "model_mean_calls": model_mean, "z": (mean - model_mean) / se, "outcomes": len(keys),
        "outside_support": len(outside), "g": float(g.statistic), "g_p_value": g_p,
    }
    print(f"{args.case}: {len(samples):,} decodes in {seconds:.0f} s; mean target calls {mean:.4f} +- {se:.4f} "
          f"(model, draft warped {args.passes}x: {model_mean:.4f}; z = {record['z']:.2f}); joint law of (output, "
          f"calls): {len(keys)} outcomes, {len(outside)} outside the support, G = {g.statistic:.2f}, p = {g_p:.3g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
