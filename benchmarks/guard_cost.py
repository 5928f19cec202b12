"""What the oracle's guards cost, and the suite on a loaded machine; JSON output.

Two measurements, each against a tree given by path (a ``git worktree`` of the commit before the
guards, beside this checkout):

- ``--verify BEFORE``: ``python -m specref.verify`` (the whole scenario matrix) in BEFORE and in
  this checkout, in alternating paired runs (``--repeats`` each, before then after): the median
  seconds of each with its range, the median of the paired ratios after / before.
- ``--suite TREE ...``: the README's test command (``python -m pytest``) in each TREE (``.`` for
  this checkout), once each, with ``--burners`` CPU-bound processes (a Python busy loop each)
  running beside it for the whole run: seconds, exit status, pytest's summary line and the load
  average at the end.  mypy's cache (``.mypy_cache``) is removed first, so each run is cold, as on
  a fresh checkout.

``--workers N ...`` runs each ``--suite`` once per worker count, in the order given, with ``-n N``
in place of the ``-n`` of ``addopts`` (``0``: the command as it stands), and records the CPU
seconds of the run and everything it waited for (``getrusage``) beside its wall seconds: the record
behind the worker count in ``pyproject.toml``.

Each tree is run with ``PYTHONPATH`` set to it, so its own ``specref`` is imported::

    git worktree add /tmp/before 0994a30
    python benchmarks/guard_cost.py --verify /tmp/before --repeats 5 \\
        --suite /tmp/before . --burners 0 --out benchmarks/out/guard_cost.json
    python benchmarks/guard_cost.py --suite . --burners 2 --merge benchmarks/out/guard_cost.json \\
        --out benchmarks/out/guard_cost.json
    python benchmarks/guard_cost.py --suite . --workers 2 3 --out benchmarks/out/suite_workers.json
    python benchmarks/guard_cost.py --suite . --workers 3 2 --merge benchmarks/out/suite_workers.json \\
        --out benchmarks/out/suite_workers.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(argv: list[str], tree: Path) -> tuple[float, int, str]:
    """Seconds, exit status and last line of ``argv`` run in ``tree`` with its own ``specref`` imported."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    run = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    lines = (run.stdout.strip() or run.stderr.strip() or "-").splitlines()
    return time.perf_counter() - started, run.returncode, lines[-1]


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def verify_pairs(before: Path, repeats: int) -> dict:
    """``python -m specref.verify`` in ``before`` and here, alternating, ``repeats`` pairs."""
    argv = [sys.executable, "-m", "specref.verify"]
    times: dict[str, list[float]] = {"before": [], "after": []}
    lines = {}
    for _ in range(repeats):
        for name, tree in (("before", before), ("after", ROOT)):
            seconds, code, line = _timed(argv, tree)
            if code != 0:
                raise SystemExit(f"python -m specref.verify failed in {tree} (exit {code}): {line}")
            times[name].append(seconds)
            lines[name] = line
    ratios = [a / b for a, b in zip(times["after"], times["before"])]
    return {"command": "python -m specref.verify", "before": _summary(times["before"]),
            "after": _summary(times["after"]), "paired_ratio": _summary(ratios), "last_lines": lines}


def _burn(stop) -> None:
    """A CPU-bound loop until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        for i in range(100_000):
            x ^= i


def _cpu_of_children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def suite(tree: Path, burners: int, workers: int = 0) -> dict:
    """The README's test command in ``tree`` (``-n workers`` when not 0), cold mypy cache, ``burners``
    busy processes beside it."""
    shutil.rmtree(tree / ".mypy_cache", ignore_errors=True)
    argv = [sys.executable, "-m", "pytest"] + (["-n", str(workers)] if workers else [])
    cpu, load_before = _cpu_of_children(), os.getloadavg()
    stop = multiprocessing.Event()
    procs = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True) for _ in range(burners)]
    for p in procs:
        p.start()
    try:
        seconds, code, line = _timed(argv, tree)
        load = os.getloadavg()
        cpu = _cpu_of_children() - cpu  # the burners are not waited for yet: the suite's own
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    out = {"tree": "this checkout" if tree == ROOT else tree.name, "burners": burners, "seconds": seconds,
           "exit": code, "summary": line, "load_at_end": load}
    if workers:
        out.update(workers=workers, command=f"python -m pytest -n {workers}",
                   cpu_seconds=round(cpu, 1), load_before=load_before)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verify", type=Path, metavar="BEFORE", help="compare python -m specref.verify with this tree")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--suite", type=Path, nargs="*", default=[], metavar="TREE")
    ap.add_argument("--burners", type=int, default=0)
    ap.add_argument("--workers", type=int, nargs="*", default=[0], metavar="N",
                    help="run each --suite once per N, with -n N (0: addopts' own)")
    ap.add_argument("--merge", type=Path, help="a record whose entries this run's are added to")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    record = json.loads(args.merge.read_text()) if args.merge else {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "verify": None, "suites": []}
    if args.verify:
        record["verify"] = verify_pairs(args.verify.resolve(), args.repeats)
        print(json.dumps(record["verify"]["paired_ratio"]))
    for tree in args.suite:
        tree = tree.resolve()
        for workers in args.workers:
            run = suite(tree, args.burners, workers)
            run["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                                           text=True).stdout.strip()
            record["suites"].append(run)
            print(json.dumps(run), flush=True)
            args.out.write_text(json.dumps(record, indent=1) + "\n")  # each run kept as it ends
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
