"""Statistical power of the engines' Triton kernels in Triton's interpreter: rows per second, the TV
a check detects, and the N and seconds a TV of 0.02 needs -- with the interpreter's integer-overflow
asserts (``sanitize_overflow``, Triton 3.9's interpreter default) and without them, as compiled
(:func:`specref.adapters.real_engines.triton_interpreter._interpreter_as_compiled`).

One case per path, statistical mode, ``--samples`` rows per case, seed 2026, the oracle's own
planning of statistics (its Bonferroni-adjusted G-tests), ``--repeats`` runs per setting:

- ``vllm-v1-triton``: vllm 0.33.0's ``rejection_sample`` (``vllm_v1_engine("triton")``), the
  ``vllm`` level's ``two-rows`` case (B = 2, K = 2, V = 4);
- ``sglang-chain``: SGLang 0.5.23's ``chain_speculative_sampling_triton``, the ``batched`` level's
  first dense default case;
- ``mrv2``: vLLM 0.33.0 Model Runner V2's ``rejection_sample`` (four kernels a call,
  ``mrv2_engine()``), the same ``batched`` case.

Per path and setting: the median wall seconds of the runs with their range, rows per second
(``samples x B / seconds``), the TV the best and the worst statistic detect at N (power 0.9, from
the report), and, since a detectable TV scales as ``1 / sqrt(N)``, the N per row at which the best
statistic detects 0.02 and the seconds that N costs at the measured rate.

    python benchmarks/interpreter_power.py [--samples 1000] [--repeats 3] [--json benchmarks/out/interpreter_power.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SEED = 2026
GOAL_TV = 0.02
LONG = {"time_limit": 600.0, "case_time_limit": 1800.0, "progress": False, "isolate": False}


def _paths() -> dict:
    """``{path: (level, fn, case)}``."""
    import specref.adapters.real_engines as re_
    from specref.verification.levels import LEVELS

    def case(level, name=None):
        found = [c for c in LEVELS[level].cases() if (c.name == name if name else c.num_draft is None)]
        return found[0]

    return {"vllm-v1-triton": ("vllm", re_.vllm_v1_engine("triton"), case("vllm", "two-rows")),
            "sglang-chain": ("batched", re_.sglang_chain_engine(), case("batched")),
            "mrv2": ("batched", re_.mrv2_engine(), case("batched"))}


def _detectable(detail: str) -> tuple[float, float]:
    found = re.search(r"TV detectable at N \(power 0\.9\): ([0-9.]+) \(best statistic\) to ([0-9.]+)", detail)
    if not found:
        raise SystemExit(f"no detectable TV in the report's detail: {detail[-300:]}")
    return float(found.group(1)), float(found.group(2))


def run_path(level, fn, case, samples: int, repeats: int, as_compiled: bool) -> dict:
    from specref.adapters.real_engines import triton_interpreter
    from specref.verification.oracle import check

    triton_interpreter._AS_COMPILED["on"] = as_compiled
    seconds, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        report = check(level, fn, cases=[case], mode="statistical", samples=samples, seed=SEED, **LONG)
        seconds.append(time.perf_counter() - started)
        (result,) = report.results
        if result.status != "ok":
            raise SystemExit(f"{level} {case.name}: {result.status}: {result.detail[-300:]}")
    best, worst = _detectable(result.detail)
    median = statistics.median(seconds)
    rows = samples * case.shape[0]
    n_goal = samples * (best / GOAL_TV) ** 2
    return {"seconds_median": round(median, 2), "seconds_range": [round(min(seconds), 2), round(max(seconds), 2)],
            "rows_per_second": round(rows / median, 1), "samples_per_row": samples, "rows_per_sample": case.shape[0],
            "detectable_tv_best": best, "detectable_tv_worst": worst, "n_for_tv_0.02": round(n_goal),
            "seconds_for_tv_0.02": round(median * n_goal / samples)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1000, help="N per row of the case")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paths", type=lambda s: set(s.split(",")), help="vllm-v1-triton,sglang-chain,mrv2 (default: all)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "out" / "interpreter_power.json"))
    args = ap.parse_args(argv)
    from engine_mutants import machine, machine_line

    import torch

    torch.set_num_threads(1)
    paths = _paths()
    record = {"machine": machine(), "command": "python benchmarks/interpreter_power.py " + " ".join(argv or sys.argv[1:]),
              "seed": SEED, "goal_tv": GOAL_TV, "paths": {}}
    for name, (level, fn, case) in paths.items():
        if args.paths and name not in args.paths:
            continue
        record["paths"][name] = {"level": level, "case": case.name}
        for setting, on in (("sanitized", False), ("as_compiled", True)):
            r = run_path(level, fn, case, args.samples, args.repeats, on)
            record["paths"][name][setting] = r
            print(f"{name:16s} {setting:12s} {r['seconds_median']:7.2f} s [{r['seconds_range'][0]}, "
                  f"{r['seconds_range'][1]}]  {r['rows_per_second']:7.1f} rows/s  TV {r['detectable_tv_best']}"
                  f"-{r['detectable_tv_worst']} at N {args.samples}; TV 0.02: N {r['n_for_tv_0.02']}, "
                  f"{r['seconds_for_tv_0.02']} s", flush=True)
        a, b = record["paths"][name]["sanitized"], record["paths"][name]["as_compiled"]
        record["paths"][name]["speed_up"] = round(b["rows_per_second"] / a["rows_per_second"], 2)
    print(f"machine: {machine_line(record['machine'])}")
    out = Path(args.json)
    if args.paths and out.exists():  # a part: merged into the record
        record["paths"] = {**json.loads(out.read_text())["paths"], **record["paths"]}
    out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
