"""Coins in at Hugging Face's ``_speculative_sampling`` (every minor release 4.40 - 5.25) and at
LMDeploy 0.18.0's portable rejection sampler: the ``batched_coins`` level, exactly.

    python benchmarks/hf_coins.py --json benchmarks/out/hf_coins.json
    python benchmarks/hf_coins.py --table benchmarks/out/hf_coins.json   # the results page's tables

Releases: the last patch of each minor from 4.40 (the first with today's signature) to 5.25, the newest
(one past what :func:`specref.adapters.hf.supported_versions` admits for the statistical adapter).  Each
release's wheel is fetched once with ``pip download --no-deps transformers==X`` into
``<wheel cache>/transformers-releases/`` (the wheel cache of ``scripts/fetch_engines.py``); only
``transformers/generation/utils.py`` is read from it, and only its ``_speculative_sampling`` is defined
(:func:`specref.adapters.hf.load_speculative_sampling`: it needs nothing but torch), then checked through
the coin seam (:func:`specref.adapters.hf.hf_coin_kernel`) on the default cases ``V4-K2-float32`` (the coin
width ``generate`` draws) and ``V4-K2-float64``.  Nothing is installed.

Engines: the installed transformers' function, LMDeploy 0.18.0 (:mod:`specref.adapters.real_engines.lmdeploy`,
from the pinned wheel) and specref's ``inclusive_zero_kernel`` (``coin * q <= p``, the twin both should
equal) and ``engine_coin_kernel`` (correct) on every default ``batched_coins`` case.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import platform
import re
import subprocess
import sys
import time
import zipfile
from fractions import Fraction
from pathlib import Path

RELEASES = ("4.40.2", "4.41.2", "4.42.4", "4.43.4", "4.44.2", "4.45.2", "4.46.3", "4.47.1", "4.48.3", "4.49.0",
            "4.50.3", "4.51.3", "4.52.4", "4.53.3", "4.54.1", "4.55.4", "4.56.2", "4.57.6", "5.0.0", "5.1.0", "5.2.0",
            "5.3.0", "5.4.0", "5.5.4", "5.6.2", "5.7.0", "5.8.1", "5.9.0", "5.10.4", "5.11.0", "5.12.1", "5.13.1",
            "5.14.1", "5.15.1", "5.16.1", "5.17.0", "5.18.0", "5.19.0", "5.20.2", "5.21.1", "5.22.2", "5.23.0",
            "5.24.0", "5.25.0")
"""The last patch release of each minor, 4.40 - 5.25 (``pip index versions transformers``)."""

RELEASE_CASES = ("V4-K2-float32", "V4-K2-float64")
_TEST = re.compile(r"is_accepted = r_i (<=?) probability_ratio")


def releases_dir() -> Path:
    from specref.adapters.real_engines.wheels import wheels_dir

    return wheels_dir() / "transformers-releases"


def wheel(version: str) -> Path:
    """The release's wheel in :func:`releases_dir`, downloaded (no dependencies) when missing."""
    folder = releases_dir()
    found = sorted(folder.glob(f"transformers-{version}-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        f"transformers=={version}", "-d", str(folder)], check=True)
        found = sorted(folder.glob(f"transformers-{version}-*.whl"))
    return found[0]


def _cases(names=None):
    from specref.verification.levels.coins.kernels import default_coin_cases

    cases = default_coin_cases()
    return cases if names is None else [c for c in cases if c.name in names]


def _judge(kernel, cases) -> list:
    from specref.verification.oracle import check

    rows = []
    for case in cases:
        started = time.perf_counter()
        r = check("batched_coins", kernel, cases=[case], mode="exact", isolate=False, time_limit=120.0).results[0]
        seconds = time.perf_counter() - started
        calls = re.search(r"(\d+) kernel calls", r.detail)
        rows.append({"case": case.name, "status": r.status, "tv": str(Fraction(r.tv)), "tv_float": float(r.tv),
                     "kernel_calls": int(calls.group(1)) if calls else None, "seconds": round(seconds, 2),
                     "detail": r.detail[:300]})
    return rows


def run_releases(versions) -> list:
    from specref.adapters.hf import hf_coin_kernel, load_speculative_sampling

    out = []
    for version in versions:
        text = zipfile.ZipFile(wheel(version)).read("transformers/generation/utils.py").decode()
        fn, source = load_speculative_sampling(text, version)
        test = _TEST.search(source)
        row = {"release": version, "parameters": list(inspect.signature(fn).parameters),
               "accept_test": f"r_i {test.group(1)} probability_ratio" if test else None,
               "source_sha1": hashlib.sha1(source.encode()).hexdigest()[:12],
               "cases": _judge(hf_coin_kernel(fn, version=version, source=source), _cases(RELEASE_CASES))}
        print(version, row["accept_test"], [(c["case"], c["status"], c["seconds"]) for c in row["cases"]], flush=True)
        out.append(row)
    return out


def run_engines() -> list:
    import torch
    import transformers

    from specref.adapters.hf import hf_coin_kernel
    from specref.adapters.real_engines.lmdeploy import lmdeploy_coin_kernel
    from specref.verification.levels.coins.kernels import engine_coin_kernel, inclusive_zero_kernel

    paths = [("hf_coin_kernel", f"transformers {transformers.__version__}", "_speculative_sampling, torch, one row "
              "a call", hf_coin_kernel()),
             ("lmdeploy_coin_kernel", "lmdeploy 0.18.0", "DefaultRejectionSamplingImpl.forward, torch",
              lmdeploy_coin_kernel()),
             ("inclusive_zero_kernel", "specref", "NumPy, coin * q <= p", inclusive_zero_kernel),
             ("engine_coin_kernel", "specref", "NumPy, coin * q < p", engine_coin_kernel)]
    out = []
    for name, engine, how, kernel in paths:
        rows = _judge(kernel, _cases())
        print(name, [(r["case"], r["status"], r["seconds"]) for r in rows], flush=True)
        out.append({"kernel": name, "engine": engine, "how": how, "torch": torch.__version__, "cases": rows})
    return out


def tables(record: dict) -> str:
    """The results page's two tables (engines on every default case; releases)."""
    lines = ["| kernel | engine, version | how | case | status | TV (exact) | kernel calls | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for path in record["engines"]:
        for c in path["cases"]:
            lines.append(f"| `{path['kernel']}` | {path['engine']} | {path['how']} | {c['case']} | {c['status']} | "
                         f"{c['tv_float']:.3g} | {c['kernel_calls']} | {c['seconds']:.2f} |")
    lines += ["", "| transformers | accept test | " + " | ".join(f"{n}: status, TV" for n in RELEASE_CASES) + " |",
              "|---|---|" + "---|" * len(RELEASE_CASES)]
    for row in record["releases"]:
        cells = " | ".join(f"{c['status']}, {c['tv_float']:.3g}" for c in row["cases"])
        lines.append(f"| {row['release']} | `{row['accept_test']}` | {cells} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the record here")
    ap.add_argument("--table", help="print the page's tables from this record")
    ap.add_argument("--releases", nargs="*", default=list(RELEASES), help="transformers releases (default: all)")
    args = ap.parse_args(argv)
    if args.table:
        print(tables(json.loads(Path(args.table).read_text())))
        return 0
    import numpy as np
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    record = {"machine": f"{platform.platform()}, Python {platform.python_version()}, numpy {np.__version__}, torch "
                         f"{torch.__version__} on one intra-op thread",
              "command": "python benchmarks/hf_coins.py --json benchmarks/out/hf_coins.json",
              "engines": run_engines(), "releases": run_releases(args.releases)}
    record["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    print(tables(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
