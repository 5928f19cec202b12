"""Scaling of a sharded statistical check on a process pool and on Dask, and where Dask's time goes.

    python benchmarks/bench_distributed.py --json benchmarks/out/bench_distributed.json

1. One statistical check of the reference step (``worked-example-rows``, N samples) on a
   process pool of 1 and of 2 workers and on a Dask LocalCluster of 1 and of 2 processes
   (``dask_executor``: each shard on the main thread of a process of its worker's own);
   median and range of ``--repeats`` runs after one warm-up run; the verdicts must be
   identical.  The pool and the LocalCluster of the same size are open together and their
   runs alternate, so that the machine's drift over minutes falls on both alike; the Dask/pool
   ratio is the median of the paired runs' ratios (each pair also in the record).  ``--diagnose`` adds the LocalCluster of 2 with shards on the Dask thread
   (``main_thread=False``, what ``dask_executor`` did before).
2. Where the time goes: the oracle's and the implementation's seconds per sample when the
   check runs on the main thread and on another thread (a Dask worker runs tasks on
   threads: the per-call time limit then starts a watchdog thread per call); the bytes that
   travel per shard (the cloudpickled task) and the seconds to rebuild the program in a shard;
   the overhead of one no-op task through Dask.
3. An estimate for a 10^8-sample check on 100 workers from the measured per-sample cost and
   per-shard overhead (the arithmetic is in the JSON).

The record holds the machine line and the load average before and after: on a shared machine
the timings are noisy, and only a record taken with the machine quiet should be kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time

import numpy as np


def _noop(i):
    return i


def _thread_split(case, samples):
    """Seconds per sample (implementation, oracle) of a check run on this main thread and on a thread."""
    from specref.verification.oracle import check_step
    from specref.verification.zoo import chain as zoo

    def one():
        r = check_step(zoo.reference, mode="statistical", cases=case, samples=samples, seed=2, progress=False)
        return r.results[0].seconds_per_sample

    main = one()
    box = []
    t = threading.Thread(target=lambda: box.append(one()))
    t.start()
    t.join()
    return {"main_thread": main, "other_thread": box[0]}


def _shard_cost(case, shard_blocks):
    """Bytes of one shard's task (cloudpickled, as it travels) and seconds to rebuild its program."""
    import cloudpickle
    from functools import partial

    from specref.verification.levels.chain.programs import _sampler_of, tally_chain_blocks
    from specref.verification.zoo import chain as zoo

    recipe = partial(_sampler_of, "step", zoo.reference, case[0].as_float(), 10.0)
    payload = cloudpickle.dumps((tally_chain_blocks, (recipe, tuple(range(27)), 1, 0, shard_blocks, 10**6, 300.0), {}))
    t0 = time.perf_counter()
    for _ in range(100):
        recipe()
    return {"task_bytes": len(payload), "rebuild_s": (time.perf_counter() - t0) / 100}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--shard-blocks", type=int, default=4)
    ap.add_argument("--diagnose", action="store_true", help="also Dask with shards on the Dask thread")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    for name in ("samples", "repeats", "tasks", "shard_blocks"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")

    from specref.adapters.cluster import dask_executor, local_pool
    from specref.verification.oracle import check_step, default_cases
    from specref.verification.statistics.shards import BLOCK
    from specref.verification.zoo import chain as zoo

    case = [c for c in default_cases("step") if c.name == "worked-example-rows"]
    load_before = os.getloadavg()

    def run(executor):
        t0 = time.perf_counter()
        r = check_step(zoo.reference, mode="statistical", cases=case, samples=args.samples, seed=1,
                       executor=executor, shard_blocks=args.shard_blocks, progress=False).results[0]
        return time.perf_counter() - t0, (r.status, r.p_value, float(r.tv))

    rows, verdicts, per_task, pairs = {}, {}, None, {}

    def record_row(label, times):
        rows[label] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": times}
        print(f"{label}: median {rows[label]['median_s']:.2f} s [{min(times):.2f}, {max(times):.2f}] for "
              f"N = {args.samples:,}", flush=True)

    for n in (1, 2):  # the pool and the LocalCluster of n processes open together, their runs alternating
        with local_pool(n) as pool, dask_executor(workers=n) as dask:
            run(pool)  # warm the workers (imports, the shard processes, the first shard)
            run(dask)
            times = {"pool": [], "dask": []}
            for _ in range(args.repeats):
                for kind, executor in (("pool", pool), ("dask", dask)):
                    seconds, verdicts[f"{kind}-{n}"] = run(executor)
                    times[kind].append(seconds)
            if n == 2:
                t0 = time.perf_counter()
                for f in [dask.submit(_noop, i) for i in range(args.tasks)]:
                    f.result()
                per_task = (time.perf_counter() - t0) / args.tasks
        record_row(f"pool-{n}", times["pool"])
        record_row(f"dask-{n}", times["dask"])
        pairs[f"dask-{n}/pool-{n}"] = [d / p for d, p in zip(times["dask"], times["pool"])]
    if args.diagnose:
        with dask_executor(workers=2, main_thread=False) as executor:
            run(executor)
            times = []
            for _ in range(args.repeats):
                seconds, verdicts["dask-2-thread"] = run(executor)
                times.append(seconds)
        record_row("dask-2-thread", times)
    assert len(set(verdicts.values())) == 1, verdicts
    split = _thread_split(case, min(args.samples, 20_000))
    shard = _shard_cost(case, args.shard_blocks)
    load_after = os.getloadavg()
    speedup = rows["pool-1"]["median_s"] / rows["pool-2"]["median_s"]
    ratios = {k: statistics.median(v) for k, v in pairs.items()}  # the median of the paired runs' ratios
    if args.diagnose:
        ratios["dask-2-thread/pool-2"] = rows["dask-2-thread"]["median_s"] / rows["pool-2"]["median_s"]
    per_sample = rows["pool-1"]["median_s"] / args.samples
    samples_per_shard = args.shard_blocks * BLOCK
    n_big, workers = 10**8, 100
    estimate = (n_big * per_sample + -(-n_big // samples_per_shard) * per_task) / workers
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
          + f"; pool 1 -> 2 workers {speedup:.2f}x; Dask overhead per task {per_task * 1e3:.2f} ms")
    print(f"seconds per sample on the main thread {split['main_thread']}, on another thread {split['other_thread']}; "
          f"a shard's task {shard['task_bytes']} bytes, its program rebuilt in {shard['rebuild_s'] * 1e6:.0f} us")
    print(f"load average {load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} cores; "
          f"estimate for 1e8 samples on 100 workers: {estimate:.0f} s")
    record = {
        "command": "python benchmarks/bench_distributed.py " + " ".join(argv if argv is not None else []),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
                    "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after},
        "samples": args.samples, "repeats": args.repeats, "shard_blocks": args.shard_blocks,
        "runs": rows, "verdict": verdicts["pool-1"], "speedup_1_to_2": speedup, "ratios": ratios,
        "paired_ratios": pairs,
        "seconds_per_sample_by_thread": split, "shard": shard,
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
    import sys

    raise SystemExit(main(sys.argv[1:]))
