"""Statistical mode against the zoo, at the planned N: every wrong implementation whose
TV is at least 0.01 must be flagged, using the N planned for alpha = 1e-6.

For each zoo entry at step and logits level: its exact TV on one small case (exact
mode), then the oracle in statistical mode with N planned by
``specref.verification.statistics.counts.samples_needed(0.01, 1e-6, 0.9, n_outcomes, null=...)``.  An entry with
exact TV >= 0.01 must be flagged; the correct ones must pass.

    python benchmarks/zoo_statistical.py [--json PATH]

Slow (about 15 s per entry on 2 cores: ~130,000 black-box calls each); the test suite
runs the same comparison planned for TV >= 0.05 (tests/test_zoo_statistical.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from fractions import Fraction as F

import numpy as np

from specref.core.sampling import SamplingConfig
from specref.verification.zoo import chain as zoo
from specref.verification.oracle import Case, check_logits_step, check_step

STEP_CASE = Case("v2-k2", np.array([[F(1, 5), F(4, 5)], [F(3, 5), F(2, 5)]], dtype=object),
                 np.array([[F(1, 2), F(1, 2)], [F(1, 4), F(3, 4)]], dtype=object), k=2)
LOGITS_CASE = Case("v3-k2-rules", np.log(np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]])),
                   np.log(np.array([[0.4, 0.4, 0.2], [0.3, 0.3, 0.4], [0.6, 0.2, 0.2]])), k=2,
                   config=SamplingConfig(temperature=0.7, top_p=0.8), tables="logits")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--level", choices=["step", "logits"], action="append", help="only this level (repeatable)")
    args = ap.parse_args(argv)
    rows, ok = [], True
    for level, check, case in [("step", check_step, STEP_CASE), ("logits", check_logits_step, LOGITS_CASE)]:
        if args.level and level not in args.level:
            continue
        for e in zoo.entries(level=level):
            exact_tv = float(check(e.fn, cases=[case]).worst_tv) if "exact" in e.modes else None
            t0 = time.perf_counter()
            r = check(e.fn, mode="statistical", cases=[case], seed=1).results[0]
            seconds = time.perf_counter() - t0
            must_flag = e.kind != "correct" and exact_tv is not None and exact_tv >= 0.01
            good = (r.status != "ok") if must_flag else (r.status == "ok" or e.kind != "correct")
            ok &= good
            rows.append({"name": e.name, "level": level, "kind": e.kind, "exact_tv": exact_tv, "n": r.n_samples,
                         "p_value": r.p_value, "tv_estimate": r.tv, "tv_interval": r.tv_interval,
                         "status": r.status, "as_required": good, "seconds": round(seconds, 1)})
            print(f"{level:6} {e.name:28} {e.kind:11} exact TV {exact_tv if exact_tv is None else round(exact_tv, 4)!s:>8}"
                  f"  N={r.n_samples}  p={r.p_value:.2g}  -> {r.status:8} {'ok' if good else 'NOT AS REQUIRED'}"
                  f"  ({seconds:.0f} s)", flush=True)
    print("every entry with TV >= 0.01 flagged, correct ones pass" if ok else "FAILED")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
