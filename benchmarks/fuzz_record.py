"""The fuzzing of 0.3's surfaces, counted: a JSON record of what each kind and each bad input got.

Runs the kinds and the drawn inputs of ``tests/test_fuzz_coins_trees_mrv2.py`` -- the same ones:
the kinds, cases and probes are :mod:`tests.fuzz_kinds_03`'s, and every property is drawn with
the same strategies, settings and ``@seed`` as the test -- and writes, per surface and outcome
class, how many inputs were tried and how many failed:

- the misbehaviour suite per level (in-process, isolated, statistical): **false ok** (a wrong kind
  reported ok; tried = the wrong kinds), **false alarm** (a correct kind not ok; tried = the correct
  kinds), **escape** (an exception out of ``check``), **hang** (a check past its calls' limits plus
  the slack), **crash** (an ``internal error`` status), and in-process **status the spec names**
  (a kind whose status the spec names, e.g. ``invalid output`` for an output whose conversion
  exits, given another non-ok status);
- the CLI (in this process per level, and three real processes): **wrong exit status** (not 0 for
  a correct kind, its outcome's status for a wrong one -- SPEC §13.3: 1 differs, 3 misbehaves, 6 timed
  out -- 2 for ``--batch`` or ``--rules`` where the level takes neither), **escape**;
- the bad-input properties (case fields, ``check`` and ``plan`` arguments, ``declare_ties``, the
  batched parser's counts, trees thousands deep): **bad-input refused** (failed: an input neither
  refused by a SpecrefError naming it nor taken and judged -- any of the next two, a SpecrefError
  that names something else, or a bad value taken), **escape** (another exception got out),
  **crash** (an ``internal error`` status), **hang**.

Each failure keeps its first examples (kind or input, and why), so the record says what to fix.
Unlike the test, which stops at a property's first failing input, the record runs every input.

    python benchmarks/fuzz_record.py [--out benchmarks/out/fuzz_record.json] [--quick]

``--quick`` leaves out the isolated, statistical and CLI runs (forks and processes).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tests import fuzz_kinds_03 as K  # noqa: E402

EXAMPLES = 5  # failing examples kept per class


def machine() -> dict:
    return {"machine": platform.machine(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__}


def _classes(tried: int, failures: dict, tried_by_class: dict | None = None) -> dict:
    tried_by_class = tried_by_class or {}
    return {cls: {"tried": tried_by_class.get(cls, tried), "failed": len(found), "examples": found[:EXAMPLES]}
            for cls, found in failures.items()}


def misbehaviour_surface(tally: K.Tally, wrong: int, correct: int) -> dict:
    failures = tally.failures()
    return {"tried": tally.tried, "seconds": round(tally.seconds, 2),
            "classes": _classes(tally.tried, failures, {"false ok": wrong, "false alarm": correct})}


def run_misbehaviour(quick: bool) -> dict:
    """Every level's kinds: in-process (all), isolated and statistical (the test's subsets)."""
    from tests.test_fuzz_coins_trees_mrv2 import ISOLATED_HANGS, STATUSES

    out = {}
    for level in K.LEVELS_03:
        bad, good = K.bad_kinds(level), K.CORRECT[level]
        t = K.tally(level, bad, good, isolate=False)
        surface = misbehaviour_surface(t, len(bad), len(good))
        named = STATUSES[level]  # the kinds whose status the spec names
        off = [f"{kind}: {t.statuses.get(kind)}, the spec says {want!r}" for kind, want in named.items()
               if any(s != want for s in t.statuses.get(kind, [None]) if s != "ok")]
        surface["classes"]["status the spec names"] = {"tried": len(named), "failed": len(off),
                                                       "examples": off[:EXAMPLES]}
        out[f"{level}: exact, in-process"] = surface
    if quick:
        return out

    for level in K.LEVELS_03:
        kinds = {k: K.ISOLATED_ONLY[k] for k in ("os._exit(0)", "os._exit(3)", "abort", "segfault", "SIGKILL itself")}
        kinds["raises SystemExit(0)"] = K.EXCEPTIONS["raises SystemExit(0)"]
        kinds[ISOLATED_HANGS[level]] = K.ISOLATED_ONLY[ISOLATED_HANGS[level]]
        good = dict(list(K.CORRECT[level].items())[:1])
        t = K.tally(level, kinds, good, cases=K.cases_of(level)[:1], isolate=True)
        out[f"{level}: exact, isolated"] = misbehaviour_surface(t, len(kinds), len(good))
    cases = {"mrv2": (K.mrv2_cases()[0], "ignores q"), "greedy_tree_step": (K.greedy_cases()[1], "ties to the highest id"),
             "greedy_tree": (K.greedy_cases()[2], "last matching child")}
    for level, (case, wrong) in cases.items():
        kinds = {wrong: K.WRONG[level][wrong], "os._exit(0)": K.ISOLATED_ONLY["os._exit(0)"],
                 "raises SystemExit(0)": K.EXCEPTIONS["raises SystemExit(0)"]}
        good = dict(list(K.CORRECT[level].items())[:1])
        t = K.tally(level, kinds, good, cases=[case], mode="statistical", samples=2000, progress=False, calls=2)
        out[f"{level}: statistical, isolated"] = misbehaviour_surface(t, len(kinds), len(good))
    return out


def run_cli() -> dict:
    """The CLI in this process (every level's CLI kinds, its small cases) and the three real processes."""
    import subprocess

    from specref import verify
    from specref.verification.levels import LEVELS

    out = {}
    for level in K.LEVELS_03:
        saved = LEVELS[level]
        LEVELS[level] = replace(saved, cases=lambda level=level: K.cases_of(level))
        wrong_exit, escaped, tried, started = [], [], 0, time.monotonic()
        try:
            for attr, (lv, kind, code, _) in K.CLI_KINDS.items():
                if lv != level:
                    continue
                tried += 1
                buffer = io.StringIO()
                try:
                    with redirect_stdout(buffer), redirect_stderr(buffer):
                        got = verify.main(["--impl", f"tests.fuzz_kinds_03:{attr}", "--level", level,
                                           "--time-limit", "5", "--no-progress"])
                except BaseException as e:  # noqa: BLE001
                    escaped.append(f"{kind}: {type(e).__name__}: {e}")
                    continue
                if got != code:
                    wrong_exit.append(f"{kind}: exit {got}, not {code}: {buffer.getvalue()[-300:]}")
            some = next(attr for attr, (lv, *_) in K.CLI_KINDS.items() if lv == level)
            for extra in (["--batch", "2"], ["--rules", "order=top_k,top_p,min_p,temperature"]):
                tried += 1
                buffer = io.StringIO()
                with redirect_stdout(buffer), redirect_stderr(buffer):
                    try:
                        got = verify.main(["--impl", f"tests.fuzz_kinds_03:{some}", "--level", level, *extra])
                    except SystemExit as e:  # argparse's usage errors
                        got = e.code
                if got != 2:
                    wrong_exit.append(f"{' '.join(extra)}: exit {got}, not 2 (a usage error)")
        finally:
            LEVELS[level] = saved
        out[f"{level}: CLI, in-process"] = {"tried": tried, "seconds": round(time.monotonic() - started, 2),
                                            "classes": _classes(tried, {"wrong exit status": wrong_exit,
                                                                        "escape": escaped})}
    from tests.test_fuzz_coins_trees_mrv2 import test_cli_in_a_real_process

    runs = [("cli_greedy_reference", "greedy_tree", 0), ("cli_vllm_race_above_09", "vllm_coins", 1),
            ("cli_greedy_reference", "mrv2 --batch 2", 2)]
    wrong_exit, started = [], time.monotonic()
    for impl, level, code in runs:
        try:
            test_cli_in_a_real_process(impl, level, code)
        except AssertionError as e:
            wrong_exit.append(f"{impl} --level {level}: {str(e)[:300]}")
        except subprocess.TimeoutExpired:
            wrong_exit.append(f"{impl} --level {level}: ran past 300 s")
    out["CLI, real processes"] = {"tried": len(runs), "seconds": round(time.monotonic() - started, 2),
                                  "classes": _classes(len(runs), {"wrong exit status": wrong_exit})}
    return out


def run_property(name: str) -> dict:
    """One bad-input property, every drawn input (the test's strategies, settings and seed)."""
    prop = K.PROPERTIES[name]  # its probe; K.fuzzed draws its inputs as the test does
    seen = []

    def record(**drawn):
        started = time.monotonic()
        try:
            outcome, detail = prop.probe(**drawn)
        except BaseException as e:  # noqa: BLE001 - a probe never raises; counted if it does
            outcome, detail = "escape", f"the probe raised {type(e).__name__}: {e}"
        took = time.monotonic() - started
        shown = {k: (v if k != "data" else "drawn") for k, v in drawn.items()}
        seen.append((outcome, str(detail)[:300], took, repr(shown)[:200]))

    started = time.monotonic()
    K.fuzzed(name, record)()
    def failing(*outcomes):
        return [f"{outcome}: {inputs}: {detail}" for outcome, detail, _, inputs in seen if outcome in outcomes]

    bad = tuple(o for o in K.OUTCOMES if o not in ("refused", "accepted"))
    hangs = [f"{inputs}: {took:.1f} s" for _, _, took, inputs in seen if took >= K.SLACK]
    counts = {o: sum(1 for s in seen if s[0] == o) for o in K.OUTCOMES}
    return {"tried": len(seen), "seconds": round(time.monotonic() - started, 2), "outcomes": counts,
            "classes": _classes(len(seen), {"bad-input refused": failing(*bad), "escape": failing("escape"),
                                            "crash": failing("crash"), "hang": hangs})}


def by_class(surfaces: dict) -> dict:
    """Per outcome class, the inputs and kinds tried and failed over every surface (an input that
    escaped also counts under "bad-input refused": the classes overlap there)."""
    out: dict = {}
    for s in surfaces.values():
        for cls, c in s["classes"].items():
            t = out.setdefault(cls, {"tried": 0, "failed": 0})
            t["tried"] += c["tried"]
            t["failed"] += c["failed"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "fuzz_record.json"))
    ap.add_argument("--quick", action="store_true", help="in-process runs only")
    args = ap.parse_args(argv)
    started = time.monotonic()
    surfaces = {}
    for name in K.PROPERTIES:
        surfaces[name] = run_property(name)
        print(f"{name}: {surfaces[name]['outcomes']}", flush=True)
    for name, surface in run_misbehaviour(args.quick).items():
        surfaces[name] = surface
        print(f"{name}: {surface['tried']} kinds", flush=True)
    if not args.quick:
        surfaces.update(run_cli())
    failed = {name: {cls: c["failed"] for cls, c in s["classes"].items() if c["failed"]} for name, s in surfaces.items()}
    failed = {name: f for name, f in failed.items() if f}
    record = {
        "command": " ".join(["python", "benchmarks/fuzz_record.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(),
        "seconds": round(time.monotonic() - started, 1),
        "kinds": K.kind_count(),
        "totals": {"surfaces": len(surfaces), "tried": sum(s["tried"] for s in surfaces.values()),
                   "by_class": by_class(surfaces)},
        "failed": failed,
        "surfaces": surfaces,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"{record['totals']}; failing surfaces: {json.dumps(failed, indent=1)}")
    print(f"wrote {args.out} in {record['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
