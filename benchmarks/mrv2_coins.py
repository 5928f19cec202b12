"""vLLM 0.33.0 Model Runner V2's ``rejection_sample`` with its coins handed in: the ``vllm_coins`` level, exact.

MRV2 draws its acceptance coin with ``tl.rand`` (float32) and its resample's Gumbel uniforms with
``murmur3_uniform32``; :func:`specref.adapters.real_engines.mrv2.mrv2_coin_engine` puts the level's
coins there in Triton's interpreter.  Every default case of the level with float32 coins; per case
its status, exact acceptance TV and case TV, the detail, kernel seconds.

    python benchmarks/mrv2_coins.py [--json benchmarks/out/mrv2_coins.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "out" / "mrv2_coins.json"))
    args = ap.parse_args(argv)
    import torch
    from engine_mutants import machine, machine_line

    from specref import check
    from specref.adapters.real_engines.mrv2 import mrv2_coin_engine
    from specref.verification.levels.coins.vllm_coins import default_vllm_coin_cases

    torch.set_num_threads(1)
    fn = mrv2_coin_engine()
    rows = []
    for case in default_vllm_coin_cases("float32"):
        started = time.perf_counter()
        (r,) = check("vllm_coins", fn, cases=[case], coins="float32", isolate=False, progress=False).results
        rows.append({"case": case.name, "status": r.status, "tv": None if r.tv is None else float(r.tv),
                     "detail": r.detail, "seconds": round(time.perf_counter() - started, 2)})
        print(f"{case.name:28s} {r.status:10s} {rows[-1]['tv']} {rows[-1]['seconds']} s", flush=True)
    record = {"machine": machine(), "command": "python benchmarks/mrv2_coins.py", "engine": "vllm 0.33.0 MRV2",
              "coins": "float32", "results": rows}
    print(f"machine: {machine_line(record['machine'])}")
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
