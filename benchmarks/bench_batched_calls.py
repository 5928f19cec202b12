"""A planned-N decoder check of a torch decoder that costs ~5 ms a call: one call per sample
against one call per ``--batch`` samples (``declare_batch``).

    python benchmarks/bench_batched_calls.py [--batch 256] [--one-call-samples 2048] [--json PATH]

The decoder decodes B prompts in lockstep with torch (drafts, acceptance coins and the
residual or bonus draws by ``torch.multinomial`` / ``torch.rand`` on one generator seeded from
the batch's first seed), with ``time.sleep(--device-ms)`` once per call standing for the
device's share of a call (a GPU forward at small B costs the same for 1 row or 256; the CPU
is idle meanwhile).  Its "forward" is a gather from the rows of every context the decode can
reach (``next_token_probs`` on the case's models, computed once per table and kept), so the
decoder is vectorised over the batch and returns ``[B, max_new_tokens]`` padded with -1.

1. **one call per sample** (``decode_fn(..., prompt [P], rng=seed)``, B = 1): ``--one-call-samples``
   samples, timed, and the planned N extrapolated from its rate (the whole run would take
   ~15 min at 5 ms a call);
2. **batched** (``declare_batch(decode_fn, B)``): the planned N of the case (detect TV 0.01 at
   alpha = 1e-6, power 0.9: 181,452 on ``worked-example-rows``), timed whole, with its verdict.

Both run on the calling process (no executor).  The machine and its load (``os.getloadavg``
before and after) are in the record: timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEVICE_S = [0.005]  # the device's share of one call (--device-ms)


_TABLES = {}  # (model's table, config, context lengths) -> the rows of every context, as torch tensors


def _all_rows(model, config, prompt_len, longest):
    """``[sum V^l, V]``: the processed row after every context of ``prompt_len..longest`` tokens,
    context ``c`` of length ``l`` at ``offset[l] + (c in base V)`` (a model's forward, precomputed)."""
    import torch

    from specref.decoding.chain import next_token_probs

    key = (model.table.tobytes(), model.table.shape, config, prompt_len, longest)
    if key not in _TABLES:
        V = model.table.shape[-1]
        offsets, rows = {}, []
        for length in range(prompt_len, longest + 1):
            offsets[length] = len(rows)
            for code in range(V ** length):
                context = [(code // V ** (length - 1 - i)) % V for i in range(length)]
                rows.append(np.asarray(next_token_probs(model, context, config), dtype=np.float64))
        _TABLES[key] = (torch.from_numpy(np.stack(rows)), offsets)
    return _TABLES[key]


def torch_decode(target, draft, prompts, *, k, config, max_new_tokens, stop_tokens, rng):
    """B = len(prompts) speculative decodes in lockstep (Leviathan et al. 2022, Algorithm 1), in torch;
    returns ``[B, max_new_tokens]`` padded with -1."""
    import torch

    time.sleep(DEVICE_S[0])
    seeds = np.atleast_1d(np.asarray(rng, dtype=np.int64))
    g = torch.Generator().manual_seed(int(seeds[0]))
    prompts = torch.as_tensor(np.asarray(prompts), dtype=torch.int64)
    B, P = prompts.shape
    V = target.table.shape[-1]
    longest = P + max_new_tokens + k
    p_rows, offsets = _all_rows(target, config, P, longest)
    q_rows, _ = _all_rows(draft, config, P, longest)
    offset = torch.zeros(longest + 1, dtype=torch.int64)
    for length, o in offsets.items():
        offset[length] = o
    code = torch.zeros(B, dtype=torch.int64)  # each request's context in base V
    for i in range(P):
        code = code * V + prompts[:, i]
    length = torch.full((B,), P, dtype=torch.int64)
    out = torch.full((B, max_new_tokens), -1, dtype=torch.int64)
    made = torch.zeros(B, dtype=torch.int64)
    stops = torch.tensor(sorted(int(s) for s in stop_tokens) or [-2])
    live = torch.arange(B)
    while len(live):
        A, c, ln = len(live), code[live], length[live]
        codes, drafts = [c], torch.empty((A, k), dtype=torch.int64)
        for t in range(k):  # K draft tokens per live request
            q = q_rows[offset[ln + t] + codes[t]]
            drafts[:, t] = torch.multinomial(q, 1, generator=g)[:, 0]
            codes.append(codes[t] * V + drafts[:, t])
        idx = torch.stack([offset[ln + t] + codes[t] for t in range(k + 1)], 1)  # [A, K+1]
        p, q = p_rows[idx], q_rows[idx[:, :k]]  # [A, K+1, V], [A, K, V]
        px, qx = p[:, :k].gather(2, drafts[:, :, None])[..., 0], q.gather(2, drafts[:, :, None])[..., 0]
        accept = torch.rand((A, k), generator=g, dtype=torch.float64) * qx < px
        n = torch.cumprod(accept.to(torch.int64), 1).sum(1)  # [A] drafts accepted
        rows = torch.arange(A)
        final = p[rows, n].clone()  # the bonus row, or p at the first rejection
        rejected = torch.nonzero(n < k)[:, 0]
        if len(rejected):
            residual = torch.clamp(final[rejected] - q[rejected, n[rejected]], min=0)
            mass = residual.sum(1, keepdim=True)
            final[rejected] = torch.where(mass > 1e-12, residual / mass.clamp_min(1e-300), final[rejected])
        nxt = torch.multinomial(final, 1, generator=g)[:, 0]
        block = torch.cat([drafts, torch.full((A, 1), -1, dtype=torch.int64)], 1)
        block[rows, n] = nxt  # [A, K+1]: the n accepted drafts, the new token, then unused slots
        valid = torch.arange(k + 1)[None, :] <= n[:, None]
        stop_at = torch.where(valid & torch.isin(block, stops), torch.arange(k + 1)[None, :], k + 1).min(1).values
        keep = torch.minimum(torch.minimum(n + 1, stop_at + 1), max_new_tokens - made[live])  # tokens kept
        for j in range(k + 1):  # write the kept tokens
            w = keep > j
            out[live[w], made[live[w]] + j] = block[w, j]
        stacked = torch.stack(codes, 1)  # [A, K+1]: the context codes after 0..K drafts
        after = torch.where(keep <= n, stacked[rows, keep.clamp(max=k)], stacked[rows, n] * V + nxt)
        code[live], length[live], made[live] = after, ln + keep, made[live] + keep
        finished = (stop_at < keep) | (made[live] >= max_new_tokens)
        live = live[~finished]
    return out


def one_call(target, draft, prompt, *, rng, **kw):
    """The same decoder, one sample a call."""
    return torch_decode(target, draft, [list(prompt)], rng=[rng], **kw)[0].tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--one-call-samples", type=int, default=2048)
    ap.add_argument("--device-ms", type=float, default=5.0)
    ap.add_argument("--case", default="worked-example-rows")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    DEVICE_S[0] = args.device_ms / 1e3

    import torch

    from specref.verification.levels.chain.programs import declare_batch
    from specref.verification.oracle import check_decoder, default_cases

    torch.set_num_threads(1)
    case = [c for c in default_cases("decoder", drawn=0) if c.name == args.case]
    load_before = os.getloadavg()

    t0 = time.perf_counter()
    alone = check_decoder(one_call, mode="statistical", cases=case, samples=args.one_call_samples, seed=1,
                          progress=False).results[0]
    one_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batched = check_decoder(declare_batch(torch_decode, args.batch), mode="statistical", cases=case, seed=1,
                            progress=False).results[0]
    batched_s = time.perf_counter() - t0
    load_after = os.getloadavg()

    n = batched.n_samples
    per_sample_one = one_s / args.one_call_samples
    record = {
        "command": "python benchmarks/bench_batched_calls.py " + " ".join(argv or sys.argv[1:]),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
                    "torch": torch.__version__, "cpus": os.cpu_count(), "torch_threads": 1,
                    "loadavg_before": load_before, "loadavg_after": load_after},
        "case": args.case, "device_ms_per_call": args.device_ms, "batch": args.batch,
        "one_call_per_sample": {"samples": args.one_call_samples, "seconds": one_s, "per_sample_s": per_sample_one,
                                "status": alone.status, "planned_n_extrapolated_s": per_sample_one * n},
        "batched": {"samples": n, "seconds": batched_s, "per_sample_s": batched_s / n, "status": batched.status,
                    "p_value": batched.p_value, "tv": float(batched.tv), "detectable_tv": batched.detectable_tv,
                    "seconds_per_sample": batched.seconds_per_sample},
        "speedup_per_sample": per_sample_one / (batched_s / n),
    }
    print(f"one call per sample: {args.one_call_samples:,} samples in {one_s:.1f} s ({per_sample_one * 1e3:.2f} ms a "
          f"sample): planned N = {n:,} would take {per_sample_one * n:.0f} s")
    print(f"batch of {args.batch}: planned N = {n:,} in {batched_s:.1f} s ({batched_s / n * 1e6:.0f} us a sample), "
          f"{batched.status}, p = {batched.p_value:.3g}; speedup {record['speedup_per_sample']:.0f}x; "
          f"load average {load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
