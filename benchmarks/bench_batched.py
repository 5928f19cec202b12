"""The batched oracle level's cost: oracle overhead, a real-vocabulary check, the engine zoo at V = 32,000.

Three measurements, written as JSON (default ``benchmarks/out/bench_batched.json``):

1. **overhead**: a statistical check of the reference batched step at small V (default V = 32,
   K = 4, B = 4 rows, N = 250,000 per row = 1,000,000 samples); samples per second overall and
   for the oracle alone (drawing drafts, parsing, counting, testing: total minus the time inside
   the implementation).
2. **large**: the case ``large_vocab_case(V, K)`` (default V = 32,000, K = 5, B = 2): the planned
   N (detect TV 0.01 at alpha = 1e-6, power 0.9, Bonferroni over the statistics), the reference's
   throughput in rows per second, a check at ``--large-samples`` per row, and the time the
   planned-N check would take at the measured throughput.
3. **zoo**: every engine-zoo entry whose bug shows statistically, and the correct reference, on
   the large case at ``--zoo-samples`` per row: status, Bonferroni-adjusted p, TV estimate, time.

Peak memory is the process's maximum RSS (``resource.getrusage``).

    python benchmarks/bench_batched.py [--v 32000] [--k 5] [--large-samples 2000] [--zoo-samples 3000]
                                       [--skip-zoo] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specref.decoding.batched import batched_step, sample_drafts  # noqa: E402
from specref.verification.zoo import engines as zoo_engines  # noqa: E402
from specref.verification.levels.batched.steps import BatchedCase, large_vocab_case, statistics_nulls  # noqa: E402
from specref.verification.oracle import check  # noqa: E402
from specref.verification.statistics.counts import samples_needed  # noqa: E402

_TIMES = re.compile(r"oracle overhead ([\d.]+) s, implementation ([\d.]+) s")


def reference(p, q, x, seed):
    return batched_step(p, q, x, seed)


def timed_check(level, fn, case, samples):
    t0 = time.perf_counter()
    report = check(level, fn, cases=[case], mode="statistical", samples=samples)
    wall = time.perf_counter() - t0
    r = report.results[0]
    m = _TIMES.search(r.detail or "")
    overhead, inside = (float(m.group(1)), float(m.group(2))) if m else (None, None)
    return r, wall, overhead, inside


def overhead(args):
    rng = np.random.default_rng(0)
    case = BatchedCase(f"V={args.small_v}", rng.dirichlet(np.ones(args.small_v), size=(4, args.small_k + 1)),
                       rng.dirichlet(np.ones(args.small_v), size=(4, args.small_k)))
    r, wall, over, inside = timed_check("batched", reference, case, args.small_samples)
    total = args.small_samples * 4
    return {"V": args.small_v, "K": args.small_k, "B": 4, "samples": total, "status": r.status,
            "p_adjusted": r.p_value, "wall_s": round(wall, 3), "oracle_s": over, "implementation_s": inside,
            "samples_per_s": round(total / wall), "oracle_samples_per_s": round(total / over) if over else None}


def large(args):
    case = large_vocab_case(V=args.v, K=args.k, B=2)
    stats = statistics_nulls(case, "batched")
    planned = max(samples_needed(0.01, 1e-6 / len(stats), 0.9, len(s.null), null=s.null / s.null.sum())
                  for s in stats if (s.null > 0).sum() >= 2)
    rows = 64
    p = np.tile(case.p_target, (rows // 2, 1, 1)).astype(np.float32)
    q = np.tile(case.q_draft, (rows // 2, 1, 1)).astype(np.float32)
    x = sample_drafts(q, 0)
    t0 = time.perf_counter()
    for seed in range(3):
        batched_step(p, q, x, seed)
    rows_per_s = 3 * rows / (time.perf_counter() - t0)
    r, wall, over, inside = timed_check("batched", reference, case, args.large_samples)
    return {"V": args.v, "K": args.k, "B": 2, "statistics": len(stats), "planned_N_per_row": int(planned),
            "reference_rows_per_s": round(rows_per_s, 1),
            "check": {"N_per_row": args.large_samples, "status": r.status, "p_adjusted": r.p_value,
                      "wall_s": round(wall, 2), "oracle_s": over, "implementation_s": inside,
                      "detail": r.detail},
            "planned_check_estimate_s": round(2 * planned / rows_per_s + (over or 0) * planned / args.large_samples, 1)}


def zoo(args):
    case = large_vocab_case(V=args.v, K=args.k, B=2)
    out = []
    for e in zoo_engines.entries():
        if e.shows != "both":
            continue
        level_case = case
        if e.name == "placeholder_indexed":  # its bug needs ragged rows
            level_case = BatchedCase(case.name + "-ragged", case.p_target, case.q_draft, num_draft=(args.k, 2))
        r, wall, _, _ = timed_check(e.level, e.fn, level_case, args.zoo_samples)
        out.append({"name": e.name, "kind": e.kind, "level": e.level, "N_per_row": args.zoo_samples,
                    "status": r.status, "p_adjusted": r.p_value, "tv_estimate": r.tv, "wall_s": round(wall, 1),
                    "detail": (r.detail or "")[:400]})
        print(f"  {e.name:<26} {r.status:<16} p={r.p_value if r.p_value is not None else '-'} ({wall:.0f} s)", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--v", type=int, default=32_000)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--small-v", type=int, default=32)
    ap.add_argument("--small-k", type=int, default=4)
    ap.add_argument("--small-samples", type=int, default=250_000)
    ap.add_argument("--large-samples", type=int, default=2_000)
    ap.add_argument("--zoo-samples", type=int, default=3_000)
    ap.add_argument("--skip-zoo", action="store_true")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "out" / "bench_batched.json"))
    args = ap.parse_args(argv)
    result = {"command": "python benchmarks/bench_batched.py " + " ".join(argv or sys.argv[1:]),
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                          "python": platform.python_version(), "numpy": np.__version__}}
    print("overhead ...", flush=True)
    result["overhead"] = overhead(args)
    print(json.dumps(result["overhead"]), flush=True)
    print("large vocabulary ...", flush=True)
    result["large"] = large(args)
    print(json.dumps({k: v for k, v in result["large"].items() if k != "check"}), flush=True)
    if not args.skip_zoo:
        print("engine zoo at the large case ...", flush=True)
        result["zoo"] = zoo(args)
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2, default=float) + "\n")
    print(f"peak RSS {result['peak_rss_mib']} MiB; wrote {args.json}")


if __name__ == "__main__":
    main()
