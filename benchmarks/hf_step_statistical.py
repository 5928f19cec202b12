"""Hugging Face's ``_speculative_sampling`` under the statistical oracle at planned N.

    python benchmarks/hf_step_statistical.py --workers 2 --json benchmarks/out/hf_step_statistical.json

N per case is planned to detect TV >= 0.01 with power 0.9 at alpha = 1e-6; the
default step cases except ``random-sparse``; the shards run on ``--workers`` processes
(the numbers do not depend on the worker count).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be a positive integer, got {args.workers}")

    from specref.adapters.cluster import local_pool
    from specref.adapters.hf import hf_speculative_step, installed_versions
    from specref.verification.oracle import check_step, default_cases

    import torch  # noqa: F401  imported here, before the workers fork: an import is not a call to time
    import transformers  # noqa: F401

    cases = [c for c in default_cases("step") if c.name != "random-sparse"]
    t0 = time.perf_counter()
    with local_pool(args.workers) as pool:
        report = check_step(hf_speculative_step, mode="statistical", cases=cases, executor=pool, progress=False)
    seconds = time.perf_counter() - t0
    print(report)
    rows = [{"case": r.case.name, "k": r.case.k, "status": r.status, "n": r.n_samples, "p_value": r.p_value,
             "tv": None if r.tv is None else float(r.tv),
             "tv_interval": None if r.tv_interval is None else [float(x) for x in r.tv_interval],
             "detail": r.detail} for r in report.results]
    record = {"command": "python benchmarks/hf_step_statistical.py " + " ".join(argv or []),
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "numpy": np.__version__}, "versions": installed_versions(),
              "workers": args.workers, "seconds": round(seconds, 1), "ok": report.ok, "cases": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1, default=str)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
