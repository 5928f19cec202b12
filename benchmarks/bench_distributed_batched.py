"""Scaling of the batched level's sharded statistical check from 1 to 2 worker processes.

    python benchmarks/bench_distributed_batched.py --json benchmarks/out/distributed_batched.json

The reference engine (``zoo_engines.engine_reference_batched``) under ``check_batched_step``
in statistical mode on one ``large_vocab_case`` (V = 4,000, K = 4, B = 2; N copies of its
rows), on a process pool of 1 and of 2 workers; median and range of ``--repeats`` runs after
one warm-up run each; the verdicts and numbers must be identical.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=32_768)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    for name in ("samples", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be a positive integer, got {getattr(args, name)}")

    from specref.adapters.cluster import local_pool
    from specref.verification.levels.batched.steps import large_vocab_case
    from specref.verification.oracle import check_batched_step
    from specref.verification.zoo.engines import engine_reference_batched

    case = large_vocab_case(V=4000, K=4, B=2)

    def run(executor):
        t0 = time.perf_counter()
        r = check_batched_step(engine_reference_batched, cases=[case], mode="statistical", samples=args.samples,
                               seed=1, executor=executor, progress=False).results[0]
        return time.perf_counter() - t0, (r.status, r.p_value, float(r.tv), r.n_samples)

    rows, verdicts = {}, {}
    for label, workers in (("pool-1", 1), ("pool-2", 2)):
        with local_pool(workers) as pool:
            run(pool)
            times = []
            for _ in range(args.repeats):
                seconds, verdicts[label] = run(pool)
                times.append(seconds)
        rows[label] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": times}
        print(f"{label}: median {rows[label]['median_s']:.2f} s [{min(times):.2f}, {max(times):.2f}] "
              f"for N = {args.samples:,}; {verdicts[label]}", flush=True)
    assert verdicts["pool-1"] == verdicts["pool-2"], verdicts
    speedup = rows["pool-1"]["median_s"] / rows["pool-2"]["median_s"]
    print(f"scaling 1 -> 2 workers: {speedup:.2f}x")
    record = {"command": "python benchmarks/bench_distributed_batched.py " + " ".join(argv or []),
              "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                         f"numpy {np.__version__}",
              "case": "large_vocab_case(V=4000, K=4, B=2)", "samples": args.samples, "repeats": args.repeats,
              "runs": rows, "verdict": list(verdicts["pool-1"]), "speedup_1_to_2": speedup}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
