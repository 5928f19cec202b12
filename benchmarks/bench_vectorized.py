"""Throughput of the vectorised speculative step (specref.decoding.vectorized).

Times ``sample_steps`` on fixed random rows (default: 1e6 steps, K = 4, V = 32) and
the classic experiment ``first_token_frequencies`` at the same N; reports the median
of ``--repeats`` runs with the machine it ran on.

    python benchmarks/bench_vectorized.py [--n 1000000] [--k 4] [--v 32] [--repeats 5]
                                          [--backend numpy|array_api_strict|cupy] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shlex
import statistics
import sys
import time

import numpy as np


def machine_info(backend: str) -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "backend": backend,
    }
    if backend != "numpy":
        info[backend] = getattr(importlib.import_module(backend), "__version__", "?")
    return info


def _timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="steps per run")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per step")
    ap.add_argument("--v", type=int, default=32, help="vocabulary size")
    ap.add_argument("--repeats", type=int, default=5, help="runs; the median is reported")
    ap.add_argument("--backend", default="numpy", choices=["numpy", "array_api_strict", "cupy"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)

    from specref.core.backend import namespace
    from specref.decoding.vectorized import first_token_frequencies, sample_steps

    xp = np if args.backend == "numpy" else importlib.import_module(args.backend)
    rng = np.random.default_rng(args.seed)
    p = xp.asarray(rng.dirichlet(np.ones(args.v), size=args.k + 1))
    q = xp.asarray(rng.dirichlet(np.ones(args.v), size=args.k))
    ns = namespace(p)

    def steps():
        out = sample_steps(p, q, args.n, rng)
        int(ns.sum(out.n_emitted))  # wait for the device (a no-op on the CPU)

    def classic():
        first_token_frequencies(p, q, args.n, rng)

    steps()  # warm-up (imports, allocator, GPU kernels)
    t_steps = _timed(steps, args.repeats)
    t_classic = _timed(classic, args.repeats)
    med, med_c = statistics.median(t_steps), statistics.median(t_classic)
    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "machine": machine_info(args.backend),
        "n": args.n,
        "k": args.k,
        "v": args.v,
        "repeats": args.repeats,
        "sample_steps_seconds": t_steps,
        "sample_steps_median_s": med,
        "steps_per_second": args.n / med,
        "first_token_frequencies_seconds": t_classic,
        "first_token_frequencies_median_s": med_c,
    }
    print(f"command : {result['command']}")
    for key, value in result["machine"].items():
        print(f"{key:9}: {value}")
    print(f"sample_steps            n={args.n} K={args.k} V={args.v}: median {med:.3f} s "
          f"over {args.repeats} runs ({args.n / med:,.0f} steps/s; runs {', '.join(f'{t:.3f}' for t in t_steps)})")
    print(f"first_token_frequencies n={args.n}: median {med_c:.3f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
