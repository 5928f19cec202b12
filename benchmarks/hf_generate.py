"""Hugging Face ``generate`` with an assistant under the decoder-level oracle, at planned N; JSON output.

For every case of :func:`specref.adapters.hf_generate.hf_cases` (temperature, top-k,
top-p, min-p, EOS inside a block, ``max_new_tokens`` mid-block, greedy): the
statistical verdict of assisted ``generate`` against plain sampling with HF's own
processors, and the control (plain ``generate(do_sample=True)``) on the same case;
the efficiency verdict (target calls per decode against the reference's exact value);
and the exact cost of the assistant's doubled warpers (the reference's target calls
with the draft warped once and twice).  Versions and run times go into the JSON.

    python benchmarks/hf_generate.py                       # planned N: TV >= 0.01, alpha = 1e-6 (hours)
    python benchmarks/hf_generate.py --samples 2000 --out hf_generate.json
    python benchmarks/hf_generate.py --table benchmarks/out/hf_generate_planned.json   # the table in docs/guide/huggingface.md
    python benchmarks/hf_generate.py --merge a.json b.json --out all.json    # cases run separately, one record

The exact iteration laws are enumerated one iteration at a time (memoised on the
generated prefix), for cases with K <= ``--exact-k`` (default 3: all of them).
"""

from __future__ import annotations

import argparse
import json
import platform
import time


def _n(v):
    return f"{v:,}"


def _verdict(r):
    if r is None:
        return "not run | | |"
    lo, hi = r["tv_interval"]
    return f"{r['status']}, N = {_n(r['n'])} | {r['p_value']:.2g} | {r['tv']:.4f} [{lo:.4f}, {hi:.4f}] | {r['seconds']:.0f}"


def planned_table(record: dict) -> str:
    """Markdown: one row per case of a ``hf_generate.py`` record, assisted and plain side by side.

    ``tests/test_hf_generate_table.py`` checks that docs/guide/huggingface.md holds exactly this table
    for ``benchmarks/out/hf_generate_planned.json``.
    """
    lines = [
        "| case | K, new tokens | assisted | p | TV [99% interval] | s | plain | p | TV [99% interval] | s "
        "| target calls per decode vs reference once / twice |",
        "|---|---|---|---:|---|---:|---|---:|---|---:|---|",
    ]
    for row in record["cases"]:
        e = row.get("efficiency")
        eff = "" if e is None else (
            f"{e['measured']:.4f} [{e['interval_99'][0]:.4f}, {e['interval_99'][1]:.4f}] vs "
            f"{e['reference_once']:.4f} / {e['reference_twice']:.4f}: {e['verdict']}")
        lines.append(f"| {row['case']} | {row['k']}, {row['max_new_tokens']} | {_verdict(row.get('assisted'))} "
                     f"| {_verdict(row.get('plain'))} | {eff} |")
    return "\n".join(lines)


def merge(records: list[dict]) -> dict:
    """One record from several runs of this script (e.g. one case per process).

    Runs must share versions and settings.  A case's ``assisted``, ``plain`` and
    ``efficiency`` parts are taken from whichever run measured them; a part measured
    twice is an error, not a silent choice.
    """
    if not records:
        raise ValueError("merge: records is empty")
    first = records[0]
    for key in ("versions", "settings", "assistant_processors"):
        for r in records[1:]:
            if r[key] != first[key]:
                raise ValueError(f"merge: {key} differ between runs: {first[key]!r} vs {r[key]!r}")
    cases: dict[str, dict] = {}
    for r in records:
        for row in r["cases"]:
            into = cases.setdefault(row["case"], {})
            for part, value in row.items():
                if part in ("assisted", "plain", "efficiency") and part in into:
                    raise ValueError(f"merge: case {row['case']!r} has {part!r} from two runs")
                if part in into and into[part] != value:
                    raise ValueError(f"merge: case {row['case']!r} differs in {part!r}: {into[part]!r} vs {value!r}")
                into[part] = value
    return {**{k: first[k] for k in ("versions", "settings", "assistant_processors")}, "cases": list(cases.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=None, help="N per case (default: planned for --detect-tv)")
    ap.add_argument("--detect-tv", type=float, default=0.01)
    ap.add_argument("--alpha", type=float, default=1e-6)
    ap.add_argument("--cases", nargs="*", default=None, help="case names (default: all)")
    ap.add_argument("--no-control", action="store_true", help="skip plain generate")
    ap.add_argument("--no-assisted", action="store_true", help="skip assisted generate (run the control alone)")
    ap.add_argument("--exact-k", type=int, default=3, help="enumerate iteration laws for cases with K <= this")
    ap.add_argument("--out", default="hf_generate.json")
    ap.add_argument("--case-time-limit", type=float, default=4 * 3600.0,
                    help="seconds per case (default 4 h; planned N took 7-38 min a case here, one torch thread)")
    ap.add_argument("--table", metavar="JSON", help="print the guide's table of a record and stop")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="merge records of separate runs into --out and stop")
    args = ap.parse_args(argv)
    if args.merge:
        records = []
        for path in args.merge:
            with open(path) as f:
                records.append(json.load(f))
        with open(args.out, "w") as f:
            json.dump(merge(records), f, indent=1)
        print(f"wrote {args.out}")
        return 0
    if args.table:
        with open(args.table) as f:
            print(planned_table(json.load(f)))
        return 0

    import torch
    import transformers
    from transformers.utils import logging

    from specref.adapters.hf_generate import HFGenerate, assistant_processors, hf_cases, hf_rules, hf_rules_twice
    from specref.core.sampling import SamplingConfig
    from specref.verification.statistics.efficiency import _mean, efficiency, reference_iterations
    from specref.verification.oracle import check_decoder

    logging.set_verbosity_error()
    cases = [c for c in hf_cases() if not args.cases or c.name in args.cases]
    settings = dict(mode="statistical", samples=args.samples, detect_tv=args.detect_tv, alpha=args.alpha,
                    progress=False, case_time_limit=args.case_time_limit)
    record = {
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": platform.python_version(), "machine": platform.machine()},
        "settings": {"samples": args.samples, "detect_tv": args.detect_tv, "alpha": args.alpha},
        "assistant_processors": assistant_processors(SamplingConfig(temperature=0.7, top_k=2, top_p=0.9)),
        "cases": [],
    }
    for case in cases:
        row = {"case": case.name, "k": case.k, "max_new_tokens": case.max_new_tokens, "config": vars(case.config),
               "stop_tokens": list(case.stop_tokens)}
        for name, assisted in (("assisted", True), ("plain", False)):
            if (name == "plain" and args.no_control) or (name == "assisted" and args.no_assisted):
                continue
            impl = HFGenerate(assisted=assisted)
            t0 = time.perf_counter()
            r = check_decoder(impl, cases=[case], **settings).results[0]
            seconds = time.perf_counter() - t0
            row[name] = {"status": r.status, "n": r.n_samples, "p_value": r.p_value, "tv": r.tv,
                         "tv_interval": r.tv_interval, "seconds": seconds, "detail": r.detail,
                         "ms_per_call": 1e3 * seconds / r.n_samples if r.n_samples else None}
            if assisted and case.k <= args.exact_k and not case.config.greedy:
                eff = efficiency(impl.target_calls, case, rules=hf_rules)
                twice = float(_mean(reference_iterations(case, rules=hf_rules, draft_rules=hf_rules_twice)))
                row["efficiency"] = {"measured": eff.mean, "interval_99": eff.interval, "reference_once": eff.reference,
                                     "reference_twice": twice, "verdict": eff.verdict}
            print(f"{case.name:<22} {name:<8} {r.status:<8} N={r.n_samples} p={r.p_value:.3g} TV={r.tv:.4f} "
                  f"[{r.tv_interval[0]:.4f}, {r.tv_interval[1]:.4f}] {seconds:.0f} s", flush=True)
        if "efficiency" in row:
            e = row["efficiency"]
            print(f"{'':<22} target calls per decode: {e['measured']:.4f} [{e['interval_99'][0]:.4f}, "
                  f"{e['interval_99'][1]:.4f}]; reference, draft warped once {e['reference_once']:.4f}, "
                  f"twice {e['reference_twice']:.4f}: {e['verdict']}", flush=True)
        record["cases"].append(row)
        with open(args.out, "w") as f:  # after every case: a stopped run keeps what it finished
            json.dump(record, f, indent=1, default=str)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
