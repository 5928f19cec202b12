"""``python -m specref.bench``: measured speedups of speculative decoding on the toy pairs.

Autoregressive target decoding against speculative decoding for K = 1..8, with each
cheaper draft (a one-layer transformer, an n-gram fitted to the same corpus), fixed
prompts and lengths, medians of repeated runs.  Reported separately per run: draft
time, verify (target) time, KV rollback time, the rest (overhead: sampling rules, the
step, bookkeeping), tokens per second, the measured acceptance alpha and cost ratio c,
and the speedup SPEC §8 predicts from them beside the measured one.

The SPEC §8 model charges one unit per target call whatever its width; on a CPU a
call that scores K+1 tokens costs more than a one-token step, so the report also
gives ``speedup_calls``, the same model with every call priced at its measured median
(``E[L] t_step / (t_verify(K) + K t_draft + t_overhead)``).  Timing lives here and
never in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

import numpy as np

from specref.core.cost import expected_tokens, speed_ratio
from specref.core.sampling import GREEDY, SamplingConfig
from specref.decoding.chain import sample_target, speculative_decode


class Timed:
    """A model proxy that adds the wall time spent inside the model to ``seconds``."""

    def __init__(self, model):
        self.model, self.seconds, self.calls = model, 0.0, 0
        self.vocab_size = getattr(model, "vocab_size", None) or getattr(model, "n_vocab")

    def __call__(self, tokens):
        t0 = time.perf_counter()
        out = self.model(tokens)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def pairs(n_gram_order: int = 3):
    """(name, target, draft) for the benchmark: the saved transformers and a fitted n-gram."""
    from toy_models.corpus import VOCAB, corpus
    from toy_models.ngram import NGramModel
    from toy_models.transformer import CachedTransformer

    target = CachedTransformer.from_saved("target")
    small = CachedTransformer.from_saved("draft_small")
    ngram = NGramModel.fit([corpus(20_000, seed=1)], order=n_gram_order, vocab_size=VOCAB, add_k=0.05)
    return target, [("transformer-small", small), (f"{n_gram_order}-gram", ngram)]


def prompts(n: int, length: int):
    from toy_models.corpus import corpus

    return [corpus(length, seed=1000 + i) for i in range(n)]


def _reset(*models):
    for m in models:
        if hasattr(m, "reset"):
            m.reset()


def _rollback_seconds(*models):
    return sum(m.stats.rollback_seconds for m in models if hasattr(m, "stats"))


def run_target(target, prompt, n_tokens, config, seed):
    _reset(target)
    t = Timed(target)
    t0 = time.perf_counter()
    out = sample_target(t, prompt, config=config, max_new_tokens=n_tokens, rng=np.random.default_rng(seed))
    total = time.perf_counter() - t0
    return {"seconds": total, "target_seconds": t.seconds, "target_calls": t.calls, "tokens": len(out.tokens)}


def run_speculative(target, draft, prompt, n_tokens, k, config, seed):
    _reset(target, draft)
    rb0 = _rollback_seconds(target, draft)
    t, d = Timed(target), Timed(draft)
    t0 = time.perf_counter()
    out = speculative_decode(t, d, prompt, k=k, config=config, max_new_tokens=n_tokens,
                             rng=np.random.default_rng(seed))
    total = time.perf_counter() - t0
    return {
        "seconds": total, "verify_seconds": t.seconds, "draft_seconds": d.seconds,
        "rollback_seconds": _rollback_seconds(target, draft) - rb0,
        "overhead_seconds": total - t.seconds - d.seconds,
        "target_calls": t.calls, "draft_calls": d.calls, "tokens": len(out.tokens),
        "tested": out.tested_per_position, "accepted": out.accepted_per_position,
    }


def median_of(runs, key):
    return statistics.median(r[key] for r in runs)


def bench_pair(target, name, draft, ks, prompts_, n_tokens, config, repeats):
    """Speculative runs for each K, interleaved with autoregressive runs of the same prompts
    and seeds, so that drift in the machine's speed touches both sides of each ratio."""
    rows = []
    for k in ks:
        runs, base = [], []
        for r in range(repeats):
            for p in prompts_:
                base.append(run_target(target, p, n_tokens, config, seed=r))
                runs.append(run_speculative(target, draft, p, n_tokens, k, config, seed=r))
        t_step = sum(b["target_seconds"] for b in base) / sum(b["target_calls"] for b in base)
        t_step_total = sum(b["seconds"] for b in base) / sum(b["target_calls"] for b in base)
        tested = np.sum([r["tested"] for r in runs], axis=0)
        accepted = np.sum([r["accepted"] for r in runs], axis=0)
        alpha = float(accepted.sum() / tested.sum())  # MLE of a constant per-position acceptance
        t_draft = sum(r["draft_seconds"] for r in runs) / sum(r["draft_calls"] for r in runs)
        t_verify = sum(r["verify_seconds"] for r in runs) / sum(r["target_calls"] for r in runs)
        t_over = sum(r["overhead_seconds"] for r in runs) / sum(r["target_calls"] for r in runs)
        c = t_draft / t_step
        seconds, base_seconds = median_of(runs, "seconds"), median_of(base, "seconds")
        e_l = float(expected_tokens(alpha, k))
        rows.append({
            "k": k,
            "seconds_median": seconds,
            "baseline_seconds_median": base_seconds,
            "tokens_per_second": n_tokens / seconds,
            "baseline_tokens_per_second": n_tokens / base_seconds,
            "speedup_measured": base_seconds / seconds,
            "speedup_model": float(speed_ratio(alpha, k, c)),
            "speedup_calls": e_l * t_step_total / (t_verify + k * t_draft + t_over),
            "alpha": alpha,
            "alpha_per_position": (accepted / np.maximum(tested, 1)).tolist(),
            "tested_per_position": tested.tolist(), "accepted_per_position": accepted.tolist(),
            "c": c,
            "expected_tokens_model": e_l,
            "tokens_per_iteration": n_tokens * len(runs) / sum(r["target_calls"] for r in runs),
            "draft_seconds": median_of(runs, "draft_seconds"),
            "verify_seconds": median_of(runs, "verify_seconds"),
            "rollback_seconds": median_of(runs, "rollback_seconds"),
            "overhead_seconds": median_of(runs, "overhead_seconds"),
            "t_step": t_step, "t_draft_call": t_draft, "t_verify_call": t_verify,
            "verify_cost_ratio": t_verify / t_step,  # SPEC §8 assumes 1
        })
        r = rows[-1]
        print(f"  {name:<18} K={k}  {r['seconds_median'] * 1e3:6.1f} ms vs {base_seconds * 1e3:6.1f} ms  "
              f"{r['tokens_per_second']:6.0f} tok/s  alpha={alpha:.3f} c={c:.3f}  "
              f"speedup {r['speedup_measured']:.2f}x  model {r['speedup_model']:.2f}x  "
              f"calls-priced {r['speedup_calls']:.2f}x  t_verify/t_step {r['verify_cost_ratio']:.2f}  "
              f"[draft {r['draft_seconds'] * 1e3:.1f} / verify {r['verify_seconds'] * 1e3:.1f} / "
              f"rollback {r['rollback_seconds'] * 1e3:.2f} / overhead {r['overhead_seconds'] * 1e3:.1f} ms]",
              flush=True)
    best = max(rows, key=lambda r: r["speedup_measured"])
    # the pair's constant-alpha model, pooled over every K: alpha = accepted / tested,
    # per position over the runs that had it, c the median over K
    tested = np.zeros(max(ks))
    accepted = np.zeros(max(ks))
    for r, k in zip(rows, ks):
        tested[:k] += np.array(r["tested_per_position"])
        accepted[:k] += np.array(r["accepted_per_position"])
    return {"name": name, "runs": rows, "best_k": best["k"], "best_speedup": best["speedup_measured"],
            "alpha": float(accepted.sum() / tested.sum()), "c": statistics.median(r["c"] for r in rows),
            "alpha_per_position": (accepted / np.maximum(tested, 1)).tolist()}


def acceptance_table(target, drafts, prompts_, n_tokens, k=4):
    """Measured per-position acceptance for each pair and temperature (greedy, 0.7, 1)."""
    table = []
    for name, draft in drafts:
        for tname, config in [("greedy", GREEDY), ("T=0.7", SamplingConfig(temperature=0.7)),
                              ("T=1", SamplingConfig())]:
            runs = [run_speculative(target, draft, p, n_tokens, k, config, seed=0) for p in prompts_]
            tested = np.sum([r["tested"] for r in runs], axis=0)
            accepted = np.sum([r["accepted"] for r in runs], axis=0)
            per = (accepted / np.maximum(tested, 1)).tolist()
            table.append({"pair": name, "temperature": tname, "k": k, "alpha": float(accepted.sum() / tested.sum()),
                          "alpha_per_position": per, "tested_per_position": tested.tolist()})
            print(f"  {name:<18} {tname:<7} alpha per position " + " ".join(f"{a:.3f}" for a in per))
    return table


def main(argv=None) -> int:
    from threadpoolctl import threadpool_limits

    # one BLAS thread: with two threads on two cores that anything else touches, a
    # forward call can stall for 5x its time (measured), which would swamp the comparison
    with threadpool_limits(limits=1, user_api="blas"):
        return _main(argv)


def _main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m specref.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer K, prompts and repeats (about a minute)")
    ap.add_argument("--json", metavar="PATH", help="write every number as JSON (figures read it)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per run (default 64)")
    ap.add_argument("--repeats", type=int, default=3, help="seeds per prompt (default 3)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts (default 4)")
    args = ap.parse_args(argv)
    ks = [1, 2, 4, 6] if args.quick else list(range(1, 9))
    n_prompts, repeats = (2, 1) if args.quick else (args.prompts, args.repeats)
    config = SamplingConfig()  # T = 1: the sampled (not greedy) regime
    t_start = time.perf_counter()
    target, drafts = pairs()
    prompts_ = prompts(n_prompts, 16)
    print(f"specref.bench: {len(prompts_)} prompts x {repeats} seeds, {args.tokens} new tokens, T=1; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, numpy {np.__version__}, one BLAS thread")
    results = [bench_pair(target, name, draft, ks, prompts_, args.tokens, config, repeats)
               for name, draft in drafts]
    print("acceptance per position (K = 4):")
    acc = acceptance_table(target, drafts, prompts_[:2], args.tokens)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {
        "command": "python -m specref.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"numpy {np.__version__}, one BLAS thread",
        "config": {"temperature": 1.0, "tokens": args.tokens, "prompts": len(prompts_), "repeats": repeats},
        "pairs": results, "acceptance": acc,
        "peak_memory_mib": peak_mib, "seconds": time.perf_counter() - t_start,
    }
    for pair in results:
        for model_key in ("speedup_model", "speedup_calls"):
            close = sum(abs(r["speedup_measured"] / r[model_key] - 1) <= 0.15 for r in pair["runs"])
            pair[f"within_15pct_{model_key}"] = close
            print(f"  {pair['name']}: measured within 15% of {model_key} for {close}/{len(pair['runs'])} K")
    best = max(results, key=lambda r: r["best_speedup"])
    print(f"best: {best['name']} at K={best['best_k']}: {best['best_speedup']:.2f}x measured; "
          f"peak memory {peak_mib:.0f} MiB; {report['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
