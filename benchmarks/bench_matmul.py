"""Why a K+1-token call of the wide target costs more than one token on this CPU: the matrix products alone.

    python benchmarks/bench_matmul.py --json benchmarks/out/matmul.json

The wide target's 32 weight matrices (8 layers of [768, 2304], [768, 768], [768, 3072],
[3072, 768]; 227 MB of float32, random values) multiplied by an [M, n_in] activation for
M = 1..17 rows, on NumPy (OpenBLAS) and torch (MKL, when installed), one thread, median of 7.
Reported: milliseconds, GFLOP/s (2 M flops per weight), the weights' read rate in GB/s, and
the ratio to M = 1 (what ``t_verify(K) / t_step`` would be if the products were the whole
call).  Beside it, a large square product's GFLOP/s: the core's compute rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)] * 8
ROWS = [1, 2, 3, 5, 9, 17]


def _median_seconds(fn, repeats=7):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(weights, make_x, matmul):
    n_weights = sum(w.shape[0] * w.shape[1] for w in weights)
    out = []
    for m in ROWS:
        xs = {n: make_x(m, n) for n in {w.shape[0] for w in weights}}
        s = _median_seconds(lambda: [matmul(xs[w.shape[0]], w) for w in weights])
        out.append({"rows": m, "ms": s * 1e3, "gflops": 2 * m * n_weights / s / 1e9, "gb_per_s": 4 * n_weights / s / 1e9})
    for r in out:
        r["ratio_to_one_row"] = r["ms"] / out[0]["ms"]
    return out


def main(argv=None) -> int:
    from threadpoolctl import threadpool_limits

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    report = {"command": "python benchmarks/bench_matmul.py" + (f" --json {args.json}" if args.json else ""),
              "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, numpy {np.__version__}, one thread",
              "weights_mb": sum(w.nbytes for w in weights) / 1e6, "backends": {}}
    big = rng.standard_normal((2048, 2048), dtype=np.float32)
    with threadpool_limits(limits=1, user_api="blas"):
        report["backends"]["numpy"] = {
            "rows": measure(weights, lambda m, n: rng.standard_normal((m, n), dtype=np.float32), lambda x, w: x @ w),
            "square_2048_gflops": 2 * 2048**3 / _median_seconds(lambda: big @ big, 3) / 1e9}
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            torch.set_num_threads(1)
            tw = [torch.from_numpy(w) for w in weights]
            tb = torch.from_numpy(big)
            with torch.no_grad():
                report["backends"]["torch"] = {
                    "rows": measure(tw, lambda m, n: torch.randn(m, n), lambda x, w: x @ w),
                    "square_2048_gflops": 2 * 2048**3 / _median_seconds(lambda: tb @ tb, 3) / 1e9}
    for name, b in report["backends"].items():
        print(f"{name}: square product {b['square_2048_gflops']:.0f} GFLOP/s; " + "; ".join(
            f"M={r['rows']}: {r['ms']:.1f} ms, {r['gflops']:.0f} GFLOP/s, x{r['ratio_to_one_row']:.2f}" for r in b["rows"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
