"""Scaling of a sharded statistical check, and the per-shard overhead through Dask.

    python benchmarks/bench_distributed.py --json benchmarks/out/distributed.json

1. One statistical check of the reference step (``worked-example-rows``, N samples)
   on a process pool of 1 and of 2 workers, and on a Dask LocalCluster of 2
   processes; median and range of ``--repeats`` runs; the verdicts must be identical.
2. The overhead of one shard through Dask: ``--tasks`` no-op shards through the
   client's executor, wall time per task.
3. An estimate for a 10^8-sample check on 100 workers from the measured per-sample
   cost and per-shard overhead (the arithmetic is in the JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np


def _noop(i):
    return i


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--shard-blocks", type=int, default=4)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    for name in ("samples", "repeats", "tasks", "shard_blocks"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")

    from specref.adapters.cluster import dask_executor, local_pool
    from specref.verification.zoo import chain as zoo
    from specref.verification.oracle import check_step, default_cases
    from specref.verification.statistics.shards import BLOCK

    case = [c for c in default_cases("step") if c.name == "worked-example-rows"]

    def run(executor):
        t0 = time.perf_counter()
        r = check_step(zoo.reference, mode="statistical", cases=case, samples=args.samples, seed=1,
                       executor=executor, shard_blocks=args.shard_blocks, progress=False).results[0]
        return time.perf_counter() - t0, (r.status, r.p_value, float(r.tv))

    rows, verdicts = {}, {}
    for label, opener in (("pool-1", lambda: local_pool(1)), ("pool-2", lambda: local_pool(2)),
                          ("dask-2", lambda: dask_executor(workers=2))):
        with opener() as executor:
            run(executor)  # warm the workers (imports, first shard)
            times = []
            for _ in range(args.repeats):
                seconds, verdict = run(executor)
                times.append(seconds)
                verdicts[label] = verdict
            if label == "dask-2":
                t0 = time.perf_counter()
                for f in [executor.submit(_noop, i) for i in range(args.tasks)]:
                    f.result()
                per_task = (time.perf_counter() - t0) / args.tasks
        rows[label] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": times}
        print(f"{label}: median {rows[label]['median_s']:.2f} s [{min(times):.2f}, {max(times):.2f}] for "
              f"N = {args.samples:,}", flush=True)
    assert len(set(verdicts.values())) == 1, verdicts
    speedup = rows["pool-1"]["median_s"] / rows["pool-2"]["median_s"]
    per_sample = rows["pool-1"]["median_s"] / args.samples
    shard = args.shard_blocks * BLOCK
    n_big, workers = 10**8, 100
    shards = -(-n_big // shard)
    estimate = (n_big * per_sample + shards * per_task) / workers
    print(f"scaling 1 -> 2 workers: {speedup:.2f}x; Dask overhead per shard {per_task * 1e3:.2f} ms; "
          f"estimate for 1e8 samples on 100 workers: {estimate:.0f} s")
    record = {
        "command": "python benchmarks/bench_distributed.py " + " ".join(argv or []),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
                    "cpus": __import__("os").cpu_count()},
        "samples": args.samples, "repeats": args.repeats, "shard_blocks": args.shard_blocks,
        "runs": rows, "verdict": verdicts["pool-1"], "speedup_1_to_2": speedup,
        "dask_overhead_per_shard_s": per_task, "per_sample_s": per_sample,
        "estimate_1e8_on_100_workers_s": estimate,
        "estimate_formula": "(1e8 * per_sample_s + ceil(1e8 / (shard_blocks * 1024)) * overhead) / 100",
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
