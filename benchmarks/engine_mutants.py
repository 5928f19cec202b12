"""Mutation testing of the engines' own verifier code: every mutant, and the code unmutated, under the oracle.

For each of the five engine paths of ``specref.adapters.real_engines`` (vLLM V1 with its C++
kernels, vLLM V1 with its Triton kernels, vLLM Model Runner V2, SGLang's chain kernel,
SGLang's greedy tree kernel), every one-line mutant of ``specref.adapters.mutants.MUTANTS`` is
applied to a temporary copy of its file and checked on its case at its N and seed, and the
unmutated code on the same case, N and seed.  Statistical checks (the chain paths) run the
oracle's G-tests at alpha = 1e-6 (Bonferroni over a case's statistics); the greedy tree runs
the tree level in exact mode on one-hot targets and the deterministic argmax-path check.  Each
case runs in a forked worker (``isolate=True``), so a mutant that corrupts memory is
``crashed``, not the end of the run.

    python benchmarks/engine_mutants.py [--json PATH] [--engine NAME ...]
    python benchmarks/engine_mutants.py --table PATH [--page MD]   # print (and write) a record's tables

Writes ``benchmarks/out/engine_mutants.json`` by default and prints the markdown that
``docs/results/engine-mutants.md`` holds.  About 6 minutes on 2 cores.  Needs the pinned
wheels: ``python scripts/fetch_engines.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "out" / "engine_mutants.json"


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numpy
    import torch

    versions = {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__}
    triton = sys.modules.get("triton")
    if triton is not None:
        versions["triton"] = triton.__version__
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(), **versions}


def machine_line(m: dict) -> str:
    extra = f", triton {m['triton']} (interpreter)" if "triton" in m else ""
    return (f"{m['platform']}; {m['cpu']}, {m['cpu_count']} CPUs; Python {m['python']}, NumPy {m['numpy']}, "
            f"torch {m['torch']}{extra}")


def plan(engines=None) -> list:
    """``[(mutant or engine name, mode, case, n, options)]``: per engine, the unmutated checks
    (one per distinct case, mode, N and options its mutants use), then its mutants."""
    from specref.adapters import mutants as mu

    rows = []
    for name, spec in mu.ENGINES.items():
        if engines and name not in engines:
            continue
        runs = []
        for m in mu.mutants(name):
            for mode in (("exact", "deterministic") if spec.level == "tree" else ("statistical",)):
                runs.append((m, mode, m.case, m.n or spec.n, m.options))
        base = []
        for _, mode, case, n, options in runs:
            if (name, mode, case, n, options) not in base:
                base.append((name, mode, case, n, options))
        rows += base + runs
    return rows


def _cell(v, digits=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        return f"{v:.2g}" if abs(v) < 1e-3 else f"{v:.{digits}g}"
    return str(v).replace("|", "\\|")


def _verdict(row) -> str:
    if row["mutant"] == "unmutated":
        return "passes" if row["status"] == "ok" else "**FAILS**"
    if not row["as_expected"]:
        return "**NOT AS EXPECTED**"
    return {"flagged": "caught", "equivalent": "equivalent: passes",
            "deterministic only": "law unchanged: passes" if row["mode"] == "exact" else "caught"}[row["expect"]]


def tables(record: dict) -> str:
    """The markdown the results page holds: the verdicts, then the patches and why each is (in)visible."""
    lines = [f"Machine: {machine_line(record['machine'])}.  Total run time {record['total_seconds']:.0f} s.", "",
             "| engine | mutant | expected | mode | case | N | status | TV | p-value | detectable TV | line ran | s | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        case = r["case"] + "".join(f", {k}={v}" for k, v in r["options"].items())
        ran = "-" if r["line_ran"] is None else ("yes" if r["line_ran"] else "**no**")
        lines.append(f"| {r['engine']} ({record['engines'][r['engine']]}) | {'`' + r['mutant'] + '`' if r['mutant'] != 'unmutated' else 'unmutated'} "
                     f"| {r['expect']} | {r['mode']} | {_cell(case)} | {_cell(r['n'])} | {r['status']} | {_cell(r['tv'])} "
                     f"| {_cell(r['p_value'])} | {_cell(r['detectable_tv'])} | {ran} | {r['seconds']:.1f} | {_verdict(r)} |")
    lines += ["", "| engine | mutant | file:line | before | after |", "|---|---|---|---|---|"]
    for m in record["mutants"]:
        lines.append(f"| {m['engine']} | `{m['name']}` | `{m['file']}:{m['line']}` | `{_cell(m['before'])}` "
                     f"| `{_cell(m['after'])}` |")
    lines.append("")
    for m in record["mutants"]:
        lines.append(f"- **{m['engine']}, `{m['name']}`** ({m['expect']}). {m['why']}")
    return "\n".join(lines) + "\n"


MARKS = ("<!-- engine-mutants-tables -->\n", "<!-- /engine-mutants-tables -->")


def write_page(record: dict, page: Path) -> None:
    """Put :func:`tables` of ``record`` between the page's markers."""
    text = page.read_text()
    head, rest = text.split(MARKS[0], 1)
    page.write_text(head + MARKS[0] + tables(record) + MARKS[1] + rest.split(MARKS[1], 1)[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH", default=str(OUT), help=f"where to write the record (default {OUT})")
    ap.add_argument("--engine", action="append", help="only this engine path (repeatable)")
    ap.add_argument("--table", metavar="PATH", help="print the tables of a committed record and exit")
    ap.add_argument("--page", metavar="MD", help="write the tables into this page, between its markers")
    args = ap.parse_args(argv)
    if args.table:
        record = json.loads(Path(args.table).read_text())
        if args.page:
            write_page(record, Path(args.page))
        sys.stdout.write(tables(record))
        return 0
    from specref.adapters import mutants as mu
    from specref.adapters import real_engines as re_

    if re_.missing():
        print(f"engine wheels missing from {re_.wheels_dir()} ({', '.join(re_.missing())}): run `{re_.FETCH}`")
        return 2
    t0 = time.perf_counter()
    rows, ok = [], True
    for target, mode, case, n, options in plan(args.engine):
        o = mu.run(target, mode=mode, case=case, n=n, options=options)
        row = {**o.to_json(), "as_expected": o.as_expected}
        ok &= o.as_expected
        rows.append(row)
        print(f"{o.engine:19} {o.mutant:42} {o.mode:13} {o.case:24} N={o.n!s:6} {o.status:14} "
              f"TV={_cell(o.tv):6} p={_cell(o.p_value):8} ran={o.line_ran!s:4} {o.seconds:6.1f} s "
              f"{'ok' if o.as_expected else 'NOT AS EXPECTED'}", flush=True)
    catalogue = []
    for m in mu.MUTANTS:
        if args.engine and m.engine not in args.engine:
            continue
        line = next(r["loaded"].get("lineno") for r in rows if r["mutant"] == m.name and r["engine"] == m.engine)
        catalogue.append({"engine": m.engine, "name": m.name, "file": m.file, "line": line, "before": m.line_text_before,
                          "after": m.line_text_after, "within": m.within, "after_anchor": m.after, "expect": m.expect,
                          "case": m.case if isinstance(m.case, str) else list(m.case), "options": dict(m.options),
                          "why": m.why})
    record = {"machine": machine(), "engines": {k: f"{s.dist} {s.version}" for k, s in mu.ENGINES.items()},
              "alpha": 1e-6, "total_seconds": round(time.perf_counter() - t0, 1), "all_as_expected": ok,
              "rows": rows, "mutants": catalogue}
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    if args.page:
        write_page(record, Path(args.page))
    print(f"\n{'every mutant as expected' if ok else 'SOME NOT AS EXPECTED'}; {record['total_seconds']:.0f} s; "
          f"wrote {args.json}\n")
    sys.stdout.write(tables(record))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
