"""``python -m specref.bench``: measured speedups of speculative decoding, where speculation can pay.

Speculative decoding pays when one decoding step is memory-bound: reading the weights
dominates, so scoring K+1 tokens costs about as much as one.  Two targets:

- ``--target wide`` (default): the trained 8-layer target widened six times by Net2WiderNet
  (:mod:`toy_models.widen`; same function, 56.8 M parameters, 227 MB float32, far beyond the
  caches of a core), built in memory from the saved weights in about 3 s;
- ``--target small``: the trained target itself (1.57 M parameters, 12.5 MB in float64): its
  weights sit in cache, so a K+1-token call costs several one-token steps -- the
  compute-bound contrast.

Drafts: the 1-layer transformer distilled from the target, and a 3-gram fitted to the same
corpus.  ``--backend numpy`` runs the transformers on NumPy (OpenBLAS); ``--backend torch``
on torch's CPU tensors (MKL) through the array API (needs the ``hf`` extra).  One BLAS thread.

For each draft, temperature (greedy, 0.7, 1), output length (``--tokens``, default 32 and
256) and K = 1..8: ``--repeats`` runs (default 3, each a different seed), each paired with
a plain target run of the same prompt and seed just before it (drift on the machine touches
both sides of the ratio).  Reported per cell:

- the measured speedup (median of the per-repeat ratios, and its range);
- the SPEC §8 model ``E[L] / (1 + K c)`` from the measured alpha and c, and the
  calls-priced model ``E[L] t_step / (t_verify(K) + K t_draft + t_overhead)``;
- draft, verify, rollback and overhead (the rest) seconds; ``t_verify(K) / t_step``;
- time to first token (the first iteration, prompt prefill included);
- per-token latency p50 and p99: each iteration's wall time shared out evenly over the
  tokens it emitted (what a streaming client waits per token, bursts averaged), pooled over
  the repeats;
- tokens per second, and peak memory (the process's maximum resident set).

**The rule for K, stated before any result is seen.**  Before the sweep, a pilot (its own
seeds, never reused) measures, per draft and temperature, alpha (three K = 4 runs of 64 tokens), one target
step ``t_step``, a K+1-token target call ``t_verify(K)`` for every K, and a draft call
``t_draft`` (medians of 5 calls).  The rule picks ``K_rule = argmax_K E[L](alpha, K) t_step
/ (t_verify(K) + K t_draft)``; the report gives its measured speedup beside the best K
found afterwards.

Batches (``--batch``, default 1, 4, 16), with the transformer draft at T = 1 and K_rule:
:func:`specref.decoding.serving.batched_speculative_decode` against
:func:`~specref.decoding.serving.batched_target_decode`, all requests of a batch in one
target call per iteration (:class:`toy_models.transformer.BatchedCachedTransformer`):
throughput, per-request latency (until the request's last token), and the padding that
ragged acceptance costs (placeholder slots of the ``[B, K+1]`` blocks: target positions
scored and thrown away).  Timing lives here and never in the tests.
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
from specref.core.errors import SpecrefError
from specref.core.sampling import GREEDY, SamplingConfig
from specref.decoding.chain import speculative_transition, target_transition
from specref.decoding.serving import batched_speculative_decode, batched_target_decode

PROMPT_LENGTH = 16
TEMPERATURES = {"greedy": GREEDY, "0.7": SamplingConfig(temperature=0.7), "1": SamplingConfig()}
PILOT_SEED = 10_000  # the pilot's seeds; the sweep uses 0 .. repeats - 1


class Timed:
    """A model proxy that adds the wall time spent inside the model to ``seconds``."""

    def __init__(self, model):
        self.model, self.seconds, self.calls = model, 0.0, 0
        self.vocab_size = getattr(model, "vocab_size", None) or model.n_vocab
        self.ends = []  # perf_counter at the end of each call

    def __call__(self, tokens):
        return self._timed(self.model, tokens)

    def batch(self, token_lists):
        return self._timed(self.model.batch, token_lists)

    def _timed(self, fn, arg):
        t0 = time.perf_counter()
        out = fn(arg)
        self.ends.append(time.perf_counter())
        self.seconds += self.ends[-1] - t0
        self.calls += 1
        return out


# ---------------------------------------------------------------- models


def _backend(name):
    if name == "numpy":
        return {"dtype": np.float32}
    try:
        import array_api_compat.torch as xt
        import torch
    except ImportError:
        raise SpecrefError("--backend torch needs torch: pip install -e '.[hf]'") from None
    torch.set_num_threads(1)
    return {"xp": xt, "dtype": torch.float32}


def models(target: str, backend: str, n_ctx: int, batch: int = 0, n_gram_order: int = 3):
    """``(target, {draft name: draft}, facts)``; ``batch > 0`` gives batched models with that many slots."""
    from toy_models.corpus import VOCAB, corpus
    from toy_models.ngram import NGramModel
    from toy_models.transformer import BatchedCachedTransformer, CachedTransformer, flatten_params, load
    from toy_models.widen import extend_context, wide_target

    kw = _backend(backend)
    if target == "wide":
        t_params, t_cfg = wide_target(n_ctx)
    else:
        t_params, t_cfg = extend_context(*load("target"), n_ctx)
    d_params, d_cfg = extend_context(*load("draft_small"), n_ctx)
    make = (lambda p, c: BatchedCachedTransformer(p, c, batch, **kw)) if batch else (lambda p, c: CachedTransformer(p, c, **kw))
    ngram = NGramModel.fit([corpus(20_000, seed=1)], order=n_gram_order, vocab_size=VOCAB, add_k=0.05)
    facts = {"target": target, "backend": backend, "n_embd": t_cfg.n_embd, "n_layer": t_cfg.n_layer,
             "n_mlp": t_cfg.n_mlp, "n_ctx": t_cfg.n_ctx,
             "params": int(sum(np.size(a) for a in flatten_params(t_params).values())),
             "weights_mb_float32": 4 * sum(np.size(a) for a in flatten_params(t_params).values()) / 1e6}
    return make(t_params, t_cfg), {"transformer-small": make(d_params, d_cfg), f"{n_gram_order}-gram": ngram}, facts


def prompts(n: int, length: int = PROMPT_LENGTH):
    from toy_models.corpus import corpus

    return [corpus(length, seed=1000 + i) for i in range(n)]


def _reset(*ms):
    for m in ms:
        if hasattr(m, "reset"):
            m.reset()


def _rollback_seconds(*ms):
    return sum(m.stats.rollback_seconds for m in ms if hasattr(m, "stats"))


# ---------------------------------------------------------------- one run


def _run(iteration, n_tokens, rng):
    """Run ``iteration`` to the end; wall time, tokens and per-iteration (seconds, tokens)."""
    state, tokens, its = (), [], []
    t0 = t_prev = time.perf_counter()
    while state is not None:
        block, state = iteration(state, rng)
        now = time.perf_counter()
        its.append((now - t_prev, len(block)))
        t_prev = now
        tokens += block
    return time.perf_counter() - t0, tokens, its


def run_target(target, prompt, n_tokens, config, seed):
    _reset(target)
    t = Timed(target)
    it = target_transition(t, prompt, config=config, max_new_tokens=n_tokens, memo=False)
    seconds, tokens, its = _run(it, n_tokens, np.random.default_rng(seed))
    return {"seconds": seconds, "target_seconds": t.seconds, "target_calls": t.calls, "tokens": len(tokens),
            "iterations": its}


def run_speculative(target, draft, prompt, n_tokens, k, config, seed):
    _reset(target, draft)
    rb0 = _rollback_seconds(target, draft)
    t, d = Timed(target), Timed(draft)
    it = speculative_transition(t, d, prompt, k=k, config=config, max_new_tokens=n_tokens, memo=False)
    seconds, tokens, its = _run(it, n_tokens, np.random.default_rng(seed))
    tested, accepted = np.zeros(k, int), np.zeros(k, int)
    for _, n in its[:-1]:  # the last block may be cut at n_tokens: its acceptance is not known
        a = n - 1
        tested[: min(a + 1, k)] += 1
        accepted[:a] += 1
    return {
        "seconds": seconds, "verify_seconds": t.seconds, "draft_seconds": d.seconds,
        "rollback_seconds": _rollback_seconds(target, draft) - rb0,
        "overhead_seconds": seconds - t.seconds - d.seconds,
        "target_calls": t.calls, "draft_calls": d.calls, "tokens": len(tokens), "iterations": its,
        "tested": tested.tolist(), "accepted": accepted.tolist(),
    }


def _latencies(runs):
    per_token = [s / n for r in runs for s, n in r["iterations"] for _ in range(n)]
    return float(np.percentile(per_token, 50)), float(np.percentile(per_token, 99))


def _range(values):
    return [min(values), max(values)]


# ---------------------------------------------------------------- the pilot and the rule


def _median_call(model, prefix, new, repeats=5):
    """Median seconds of one call scoring ``new`` after a cached ``prefix``."""
    times = []
    for _ in range(repeats):
        _reset(model)
        model(prefix)
        t0 = time.perf_counter()
        model(prefix + new)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pilot(target, drafts, prompt, ks, configs):
    """Measured before the sweep: t_step, t_verify(K), t_draft and alpha per draft and temperature."""
    from toy_models.corpus import corpus

    base = prompt + corpus(48, seed=PILOT_SEED)[:32]
    t_step = _median_call(target, base, [1])
    t_verify = {k: _median_call(target, base, [1] * (k + 1)) for k in ks}
    out = {"t_step": t_step, "t_verify": {str(k): v for k, v in t_verify.items()}, "drafts": {}}
    for name, draft in drafts.items():
        t_draft = _median_call(draft, base, [1])
        for tname, config in configs.items():
            runs = [run_speculative(target, draft, prompt, 64, 4, config, seed=PILOT_SEED + i) for i in range(3)]
            alpha = sum(sum(r["accepted"]) for r in runs) / max(sum(sum(r["tested"]) for r in runs), 1)
            alpha = min(alpha, 1 - 1e-9)
            predicted = {k: float(expected_tokens(alpha, k)) * t_step / (t_verify[k] + k * t_draft) for k in ks}
            k_rule = max(predicted, key=predicted.get)
            out["drafts"][f"{name}|{tname}"] = {"alpha": alpha, "t_draft": t_draft, "k_rule": k_rule,
                                                "predicted": {str(k): v for k, v in predicted.items()}}
    return out


# ---------------------------------------------------------------- the sweep


def cell(target, draft, ks, prompt, n_tokens, config, repeats):
    """Every K for one draft, temperature and length; each repeat pairs a plain run with each K's run."""
    base, spec = [], {k: [] for k in ks}
    for r in range(repeats):
        base.append(run_target(target, prompt, n_tokens, config, seed=r))
        for k in ks:
            spec[k].append(run_speculative(target, draft, prompt, n_tokens, k, config, seed=r))
    t_step = sum(b["target_seconds"] for b in base) / sum(b["target_calls"] for b in base)
    t_step_total = sum(b["seconds"] for b in base) / sum(b["target_calls"] for b in base)
    b50, b99 = _latencies(base)
    rows = []
    for k in ks:
        runs = spec[k]
        tested = np.sum([r["tested"] for r in runs], axis=0)
        accepted = np.sum([r["accepted"] for r in runs], axis=0)
        alpha = float(accepted.sum() / max(tested.sum(), 1))
        t_draft = sum(r["draft_seconds"] for r in runs) / max(sum(r["draft_calls"] for r in runs), 1)
        t_verify = sum(r["verify_seconds"] for r in runs) / sum(r["target_calls"] for r in runs)
        t_over = sum(r["overhead_seconds"] for r in runs) / sum(r["target_calls"] for r in runs)
        c = t_draft / t_step
        ratios = [b["seconds"] / s["seconds"] for b, s in zip(base, runs)]
        e_l = float(expected_tokens(min(alpha, 1 - 1e-12), k))
        p50, p99 = _latencies(runs)
        seconds = statistics.median(r["seconds"] for r in runs)
        rows.append({
            "k": k,
            "speedup_measured": statistics.median(ratios), "speedup_range": _range(ratios),
            "speedup_model": float(speed_ratio(min(alpha, 1 - 1e-12), k, c)),
            "speedup_calls": e_l * t_step_total / (t_verify + k * t_draft + t_over),
            "seconds_median": seconds, "baseline_seconds_median": statistics.median(b["seconds"] for b in base),
            "tokens_per_second": n_tokens / seconds,
            "ttft_seconds": statistics.median(r["iterations"][0][0] for r in runs),
            "latency_p50_seconds": p50, "latency_p99_seconds": p99,
            "alpha": alpha, "alpha_per_position": (accepted / np.maximum(tested, 1)).tolist(),
            "tested_per_position": tested.tolist(), "accepted_per_position": accepted.tolist(),
            "c": c, "expected_tokens_model": e_l,
            "tokens_per_iteration": n_tokens * len(runs) / sum(r["target_calls"] for r in runs),
            "draft_seconds": statistics.median(r["draft_seconds"] for r in runs),
            "verify_seconds": statistics.median(r["verify_seconds"] for r in runs),
            "rollback_seconds": statistics.median(r["rollback_seconds"] for r in runs),
            "overhead_seconds": statistics.median(r["overhead_seconds"] for r in runs),
            "t_step": t_step, "t_draft_call": t_draft, "t_verify_call": t_verify,
            "verify_cost_ratio": t_verify / t_step,  # SPEC §8 assumes 1
        })
    baseline = {"seconds_median": statistics.median(b["seconds"] for b in base),
                "seconds_range": _range([b["seconds"] for b in base]),
                "tokens_per_second": n_tokens / statistics.median(b["seconds"] for b in base),
                "ttft_seconds": statistics.median(b["iterations"][0][0] for b in base),
                "latency_p50_seconds": b50, "latency_p99_seconds": b99, "t_step": t_step}
    return rows, baseline


def batch_runs(target_b, draft_b, batch, prompt_list, n_tokens, k, config, repeats):
    """Batched plain and speculative decoding of ``batch`` requests, paired per repeat."""
    out = []
    for r in range(repeats):
        res = {}
        for kind in ("plain", "speculative"):
            _reset(target_b, draft_b)
            t = Timed(target_b)
            t0 = time.perf_counter()
            if kind == "plain":
                br = batched_target_decode(t, prompt_list, config=config, max_new_tokens=n_tokens,
                                           rng=np.random.default_rng(r))
            else:
                br = batched_speculative_decode(t, draft_b, prompt_list, k=k, config=config,
                                                max_new_tokens=n_tokens, rng=np.random.default_rng(r))
            seconds = time.perf_counter() - t0
            latency = [t.ends[i - 1] - t0 for i in br.finished_at]
            res[kind] = {"seconds": seconds, "tokens": sum(len(x) for x in br.tokens), "iterations": br.iterations,
                         "request_latency_median": statistics.median(latency), "request_latency_max": max(latency),
                         "padding_fraction": br.padding_fraction, "slots": br.slots, "padded": br.padded}
        out.append(res)
    spec, plain = [o["speculative"] for o in out], [o["plain"] for o in out]
    ratios = [p["seconds"] / s["seconds"] for p, s in zip(plain, spec)]
    med = statistics.median
    return {
        "batch": batch, "k": k, "tokens": n_tokens,
        "speedup_measured": med(ratios), "speedup_range": _range(ratios),
        "throughput_tokens_per_second": med(s["tokens"] / s["seconds"] for s in spec),
        "plain_throughput_tokens_per_second": med(p["tokens"] / p["seconds"] for p in plain),
        "request_latency_median_seconds": med(s["request_latency_median"] for s in spec),
        "plain_request_latency_median_seconds": med(p["request_latency_median"] for p in plain),
        "padding_fraction": med(s["padding_fraction"] for s in spec),
        "iterations": med(s["iterations"] for s in spec), "plain_iterations": med(p["iterations"] for p in plain),
    }


# ---------------------------------------------------------------- command line


def _int_list(name, minimum=1, maximum=None):
    def parse(text):
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            values = None
        if not values or any(v < minimum or (maximum is not None and v > maximum) for v in values):
            raise argparse.ArgumentTypeError(f"must be integers in {minimum}..{maximum} separated by commas, got {text!r}")
        return values
    parse.__name__ = name
    return parse


def _positive(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return v


def _temperatures(text):
    names = text.split(",")
    bad = [n for n in names if n not in TEMPERATURES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"must be a comma list of {sorted(TEMPERATURES)}, got {text!r}")
    return names


PROG = "python -m specref.bench"  # the command's name in its usage and JSON record; ``specref bench`` passes its own


def parse_args(argv, *, prog: str = PROG):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=["wide", "small"], default="wide", help="the wide target, 227 MB float32, far beyond the caches (default), or the small one")
    ap.add_argument("--backend", choices=["numpy", "torch"], default="numpy", help="array library of the transformers")
    ap.add_argument("--ks", type=_int_list("ks", 1, 16), default=list(range(1, 9)), help="draft lengths (default 1..8)")
    ap.add_argument("--tokens", type=_int_list("tokens", 1, 1024), default=[32, 256], help="output lengths (default 32,256)")
    ap.add_argument("--temperatures", type=_temperatures, default=list(TEMPERATURES), help="greedy,0.7,1 (default all)")
    ap.add_argument("--repeats", type=_positive, default=3, help="paired runs per cell, each its own seed (default 3)")
    ap.add_argument("--batch", type=_int_list("batch", 1, 64), default=[1, 4, 16], help="batch sizes (default 1,4,16)")
    ap.add_argument("--drafts", default="transformer-small,3-gram", help="comma list of drafts (default both)")
    ap.add_argument("--quick", action="store_true", help="K 1,4,8; T = 1; 32 tokens; batch 1,4; 2 repeats")
    ap.add_argument("--json", metavar="PATH", help="write every number as JSON (figures and the README read it)")
    args = ap.parse_args(argv)
    if args.quick:
        args.ks, args.tokens, args.temperatures, args.batch, args.repeats = [1, 4, 8], [32], ["1"], [1, 4], 2
    known = {"transformer-small", "3-gram"}
    args.drafts = args.drafts.split(",")
    if not args.drafts or set(args.drafts) - known:
        ap.error(f"argument --drafts: must be a comma list of {sorted(known)}, got {','.join(args.drafts)!r}")
    return args


def main(argv=None, *, prog: str = PROG) -> int:
    from threadpoolctl import threadpool_limits

    args = parse_args(argv, prog=prog)
    # one BLAS thread: with two threads on two cores that anything else touches, a
    # forward call can stall for 5x its time (measured), which would swamp the comparison
    with threadpool_limits(limits=1, user_api="blas"):
        try:
            return _main(args, argv, prog)
        except SpecrefError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2


def _main(args, argv, prog: str = PROG) -> int:
    t_start = time.perf_counter()
    n_ctx = max(128, PROMPT_LENGTH + max(args.tokens) + max(args.ks) + 2)  # 128: the trained window
    target, drafts, facts = models(args.target, args.backend, n_ctx)
    drafts = {n: drafts[n] for n in args.drafts}
    configs = {t: TEMPERATURES[t] for t in args.temperatures}
    prompt = prompts(1)[0]
    machine = (f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
               f"Python {platform.python_version()}, numpy {np.__version__}, backend {args.backend}, one BLAS thread")
    print(f"specref.bench: target {args.target} ({facts['params'] / 1e6:.1f}M params, "
          f"{facts['weights_mb_float32']:.0f} MB float32), {args.backend}; {machine}", flush=True)
    pil = pilot(target, drafts, prompt, args.ks, configs)
    print(f"pilot: t_step {pil['t_step'] * 1e3:.2f} ms; t_verify/t_step " +
          " ".join(f"K={k}:{v / pil['t_step']:.2f}" for k, v in pil["t_verify"].items()), flush=True)
    for key, d in pil["drafts"].items():
        print(f"  rule: {key:<24} alpha {d['alpha']:.3f}  c {d['t_draft'] / pil['t_step']:.3f}  -> K_rule = {d['k_rule']}",
              flush=True)
    cells = _cells(args, target, drafts, configs, prompt, pil)
    batches = _batches(args, drafts, configs, pil, n_ctx)
    report = _report(args, argv, cells, batches, pil, machine, facts, configs, t_start, prog)
    print(f"peak memory {report['peak_memory_mib']:.0f} MiB; {report['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _cells(args, target, drafts, configs, prompt, pil) -> list:
    """One cell per (temperature, length, draft): every K timed, the best K and the rule's K."""
    cells = []
    for tname, config in configs.items():
        for n_tokens in args.tokens:
            for name, draft in drafts.items():
                rows, baseline = cell(target, draft, args.ks, prompt, n_tokens, config, args.repeats)
                k_rule = pil["drafts"][f"{name}|{tname}"]["k_rule"]
                best = max(rows, key=lambda r: r["speedup_measured"])
                rule = next(r for r in rows if r["k"] == k_rule)
                cells.append({"draft": name, "temperature": tname, "tokens": n_tokens, "baseline": baseline,
                              "runs": rows, "best_k": best["k"], "best_speedup": best["speedup_measured"],
                              "best_speedup_range": best["speedup_range"], "k_rule": k_rule,
                              "rule_speedup": rule["speedup_measured"], "rule_speedup_range": rule["speedup_range"]})
                print(f"  {name:<18} T={tname:<6} {n_tokens:>4} tokens: plain {baseline['tokens_per_second']:6.1f} tok/s, "
                      f"TTFT {baseline['ttft_seconds'] * 1e3:.1f} ms", flush=True)
                for r in rows:
                    lo, hi = r["speedup_range"]
                    print(f"    K={r['k']}  {r['speedup_measured']:.2f}x [{lo:.2f}, {hi:.2f}]  model {r['speedup_model']:.2f}x  "
                          f"calls {r['speedup_calls']:.2f}x  alpha {r['alpha']:.3f} c {r['c']:.3f}  "
                          f"t_verify/t_step {r['verify_cost_ratio']:.2f}  TTFT {r['ttft_seconds'] * 1e3:.1f} ms  "
                          f"p50/p99 {r['latency_p50_seconds'] * 1e3:.1f}/{r['latency_p99_seconds'] * 1e3:.1f} ms  "
                          f"{r['tokens_per_second']:.0f} tok/s", flush=True)
                print(f"    best K={best['k']} {best['speedup_measured']:.2f}x; rule K={k_rule} "
                      f"{rule['speedup_measured']:.2f}x", flush=True)
    return cells


def _batches(args, drafts, configs, pil, n_ctx) -> list:
    """Batched serving at T = 1 with the small transformer draft at its rule K (empty otherwise)."""
    batches: list[dict] = []
    if "transformer-small" not in drafts or "1" not in configs:
        return batches
    k = pil["drafts"]["transformer-small|1"]["k_rule"]
    for b in args.batch:
        t_b, d_b, _ = models(args.target, args.backend, n_ctx, batch=b)
        for n_tokens in args.tokens:
            row = batch_runs(t_b, d_b["transformer-small"], b, prompts(b), n_tokens, k, TEMPERATURES["1"], args.repeats)
            batches.append(row)
            print(f"  batch {b:>2} {n_tokens:>4} tokens K={k}: {row['speedup_measured']:.2f}x "
                  f"[{row['speedup_range'][0]:.2f}, {row['speedup_range'][1]:.2f}]  "
                  f"{row['throughput_tokens_per_second']:.0f} tok/s (plain {row['plain_throughput_tokens_per_second']:.0f})  "
                  f"request latency {row['request_latency_median_seconds']:.2f} s "
                  f"(plain {row['plain_request_latency_median_seconds']:.2f})  padding {row['padding_fraction']:.1%}",
                  flush=True)
        del t_b, d_b
    return batches


def _report(args, argv, cells, batches, pil, machine, facts, configs, t_start, prog: str = PROG) -> dict:
    """The JSON record: the cells with their model agreement, the pairs figure 4 draws, the machine."""
    for c in cells:
        for key in ("speedup_model", "speedup_calls"):
            c[f"within_15pct_{key}"] = sum(abs(r["speedup_measured"] / r[key] - 1) <= 0.15 for r in c["runs"])
    longest = max(args.tokens)
    pairs = [{"name": c["draft"], "alpha": statistics.median(r["alpha"] for r in c["runs"]),
              "c": statistics.median(r["c"] for r in c["runs"]),
              "alpha_per_position": c["runs"][-1]["alpha_per_position"], "runs": c["runs"],
              "best_k": c["best_k"], "best_speedup": c["best_speedup"]}
             for c in cells if c["temperature"] == ("1" if "1" in configs else args.temperatures[0]) and c["tokens"] == longest]
    return {
        "command": f"{prog} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine, "target": facts,
        "config": {"ks": args.ks, "tokens": args.tokens, "temperatures": args.temperatures, "repeats": args.repeats,
                   "batch": args.batch, "prompt_length": PROMPT_LENGTH},
        "pilot": pil, "cells": cells, "batches": batches, "pairs": pairs,
        "peak_memory_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "seconds": time.perf_counter() - t_start,
    }


if __name__ == "__main__":
    sys.exit(main())
