"""Every Hugging Face ``generate`` speculative path under the decoder-level oracle, at planned N; JSON output.

One row per path of :mod:`specref.adapters.hf_paths` (prompt lookup, early exit, different
tokenizers with sampling -- as shipped and with the repaired translator -- and greedy, the
ensemble weight at two weights, MTP, DFlash and Gemma 4 on the tiny models of
``benchmarks/hf_experiments.py``, sampling and greedy): the statistical
verdict against plain sampling with HF's processors (N, p, TV and its 99% interval, the TV the
run detects with power 0.9), target calls per decode and the efficiency verdict where the path
has a reference call count, seconds, and the peak RSS of this process and of the largest shard
worker after the row; the ensemble rows add the exact TV of
:func:`~specref.adapters.hf_paths.ensemble_law`.  Each row states the planned N (TV >= 0.01 at
alpha = 1e-6, power 0.9); ``--planned`` runs every sampling path at it, at alpha = 1e-6.  One torch thread per
process.

``--workers W`` (W > 1) runs each verdict's shards on a ``ProcessPoolExecutor`` of W processes
(the oracle's seeds come from ``SeedSequence`` per block, so the counts do not depend on W); the
target calls are then counted in the workers, so the efficiency verdict comes from a second,
in-process run of ``--efficiency-samples`` seeded decodes (its own seeds).  With one worker the
verdict's own decodes are counted.  The different-tokenizer rows list the draft's vocabulary in
one seeded order (:func:`~specref.adapters.hf_paths.seeded_vocab_order`): the shipped path's loss
depends on that order, which is otherwise random per process.

    python benchmarks/hf_paths.py --planned --workers 2 --out benchmarks/out/hf_paths.json
    python benchmarks/hf_paths.py --samples 1000 --out hf_paths_small.json
    python benchmarks/hf_paths.py --table benchmarks/out/hf_paths.json   # the table in docs/results/hf-paths.md
    python benchmarks/hf_paths.py --readme-table benchmarks/out/hf_paths.json   # the README's
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # specref from this checkout

PLANNED_TV, PLANNED_ALPHA = 0.01, 1e-6
ALPHA = 1e-3  # the level of a run at a stated N, as in tests/test_hf_paths.py; --planned runs at PLANNED_ALPHA
GREEDY_N = 20  # a greedy law is a point mass: one wrong output fails it

EFFICIENCY_SAMPLES = 20_000  # decodes of the separate efficiency run (--workers > 1)
EFFICIENCY_SEED = 20261202  # SeedSequence entropy of the efficiency run's decodes
EFFICIENCY_LEVEL = 0.99  # the efficiency interval's confidence at a stated N; --planned: 1 - PLANNED_ALPHA

NO_REFERENCE = {
    "architecture, greedy": "none: greedy rounds do not pass the draft rows to _speculative_sampling, where "
                            "the observed reference reads them",
}


def _cross_vocab(config):
    """(case over the character tokenizer's ids, piece draft, tokenizers): ``tests/test_hf_paths.py``'s pair."""
    import numpy as np

    from specref.verification.cases.chain import Case
    from specref.verification.cases.tables import LogitTable
    from toy_models.tokenizers import char_tokenizer, fitted_bigram, piece_tokenizer

    chars, pieces = char_tokenizer(), piece_tokenizer()
    with np.errstate(divide="ignore"):
        t = np.log(fitted_bigram(chars, keep=2, seed=3).astype(np.float64))
        d = LogitTable(np.log(fitted_bigram(pieces, keep=4, seed=4).astype(np.float64)))
    case = Case("chars-target", t, t, prompt=tuple(chars.encode("the")), k=2, max_new_tokens=3, config=config,
                tables="logits")
    return case, d, chars, pieces


def paths():
    """``[(path, generator, settings, make() -> (impl, case), efficiency)]``; ``efficiency`` is
    one of :data:`REFERENCES` -- ``"reference"`` (the chain reference's exact law of calls), ``"lookup"``
    (prompt lookup decoding's, :func:`~specref.verification.statistics.efficiency.lookup_iterations`),
    ``"tli"`` or ``"slem"`` (Timor et al.'s algorithms with the path's draft and tokenizers, TLI's draft
    reading the committed tokens one by one as transformers does), ``"observed"`` (Algorithm 1 with
    the path's own draft rows as observed, :meth:`~specref.adapters.hf_paths.HFArchitecturePath.reference_calls`)
    -- or the reason there is none."""
    from hf_experiments import HFMTP, HFDFlash, HFGemma4, path_cases
    from specref.adapters import hf_paths as P
    from specref.core.sampling import SamplingConfig

    cases = {c.name: c for c in path_cases()}
    greedy, top_k, plain = SamplingConfig(temperature=0), SamplingConfig(top_k=2), SamplingConfig()

    def universal(config, repaired=False):
        case, draft, chars, pieces = _cross_vocab(config)
        return P.HFUniversal(draft, chars, pieces, repaired=repaired, seeded_vocab_order=True), case

    def arch(cls, config, k):
        impl = cls()
        return impl, impl.case(cls.__name__, config=config, k=k)

    same = "PromptLookupCandidateGenerator"
    rows = [
        ("prompt lookup", same, "T 0.8, K 2", lambda: (P.HFPromptLookup(), cases["lookup-temperature"]), "lookup"),
        ("early exit", "EarlyExitCandidateGenerator", "top-k 2, layer 1 of 2, K 2",
         lambda: (P.HFEarlyExit(), cases["early-exit-top-k"]), "reference"),
        ("different tokenizers, sampling", "UniversalSpeculativeDecodingGenerator", "chars <- pieces, T 1, K 2",
         lambda: universal(plain), "tli"),
        ("different tokenizers, sampling, repaired", "UniversalSpeculativeDecodingGenerator",
         "chars <- pieces, T 1, K 2, repaired_translator", lambda: universal(plain, True), "tli"),
        ("different tokenizers, greedy", "AssistedCandidateGeneratorDifferentTokenizers", "chars <- pieces, greedy",
         lambda: universal(greedy), "slem"),
    ]
    for w in (0.5, 0.8):
        rows.append((f"ensemble weight {w}", "AssistedCandidateGenerator", f"assistant_ensemble_weight {w}, T 1, K 2",
                     lambda w=w: (P.HFEnsemble(w), cases["ensemble"]), "reference"))
    for cls, generator, k, what in ((HFMTP, "MTPCandidateGenerator", 1, "Mellum, 1 MTP layer"),
                                    (HFDFlash, "DFlashTokenCandidateGenerator", 2, "Llama + MuseGlimmerAssistant"),
                                    (HFGemma4, "SinglePositionMultiTokenCandidateGenerator", 2,
                                     "Gemma4 + Gemma4Assistant")):
        config = plain if cls is HFGemma4 else top_k
        for name, c in ((f"{cls.__name__[2:]}, sampling", config), (f"{cls.__name__[2:]}, greedy", greedy)):
            label = "greedy" if c.greedy else ("top-k 2" if c.top_k else "T 1")
            rows.append((name, generator, f"{what}, {label}, K {k}", lambda cls=cls, c=c, k=k: arch(cls, c, k),
                         NO_REFERENCE["architecture, greedy"] if c.greedy else "observed"))
    return rows


def _planned(case):
    """The planned N (TV >= 0.01, alpha 1e-6, power 0.9) against the case's law under HF's rules."""
    import numpy as np

    from specref.adapters.hf_generate import hf_rules
    from specref.verification.cases.rules import ruled
    from specref.verification.laws.enumeration import target_law
    from specref.verification.statistics.counts import samples_needed

    case = case.as_float()
    t, config = ruled(case.models()[0], case.config, hf_rules)
    law = target_law(t, list(case.prompt), config, case.max_new_tokens, case.stop_tokens)
    null = np.array([float(w) for w in law.values()] + [0.0])
    return int(samples_needed(PLANNED_TV, PLANNED_ALPHA, 0.9, len(null), null=null))


REFERENCES = ("reference", "lookup", "tli", "slem", "observed")  # the efficiency kinds with an exact law of calls


def _efficiency_calls(impl, case, decodes, seed=EFFICIENCY_SEED):
    """Target calls of ``decodes`` seeded decodes in this process (seeds from ``SeedSequence(seed)``)."""
    import numpy as np

    target, draft = case.models()
    seeds = np.random.default_rng(np.random.SeedSequence(seed)).integers(0, 2**63, decodes)
    impl.target_calls.clear()
    for s in seeds:
        impl(target, draft, list(case.prompt), k=case.k, config=case.config, max_new_tokens=case.max_new_tokens,
             stop_tokens=case.stop_tokens, rng=int(s))
    return list(impl.target_calls)


def _efficiency(impl, case, calls, decodes, level, seed=EFFICIENCY_SEED):
    """``(the row's efficiency part, the calls it used)``: ``calls`` (the verdict's decodes, when they ran
    here), else a run of ``decodes`` of their own (``GREEDY_N`` for a greedy case) in this process."""
    from specref.adapters.hf_generate import hf_rules
    from specref.verification.statistics.efficiency import efficiency

    source = "the verdict's decodes"
    if len(calls) < 2:  # the decodes ran in the executor's workers: a run of their own, here
        t1 = time.perf_counter()
        calls = _efficiency_calls(impl, case, GREEDY_N if case.config.greedy else decodes, seed)
        source = f"{len(calls):,} decodes of their own (seed {seed}), {time.perf_counter() - t1:.0f} s"
    e = efficiency(calls, case, rules=hf_rules, reference=impl.reference_calls(case), level=level)
    histogram = {str(c): calls.count(c) for c in sorted(set(calls))}
    return {"measured": e.mean, "interval": list(e.interval), "level": level, "reference": e.reference,
            "verdict": e.verdict, "decodes": e.n, "from": source, "calls": histogram}, calls


def _fill_efficiency(row, eff_kind, impl, case, calls, decodes, level, seed):
    """The row's efficiency verdict, calls per decode and (the ensemble rows) exact TV, from ``calls``
    or, when the decodes ran elsewhere, from :func:`_efficiency`'s run of their own."""
    from specref.adapters.hf_paths import ensemble_law

    if eff_kind not in REFERENCES:  # no reference: the reason
        row["efficiency"] = {"verdict": eff_kind}
        row.setdefault("calls_per_decode", sum(calls) / len(calls) if calls else None)
        return
    row["efficiency"], calls = _efficiency(impl, case, calls, decodes, level, seed)
    row["calls_per_decode"] = sum(calls) / len(calls)
    if hasattr(impl, "weight"):
        row["exact_tv"] = ensemble_law(case, impl.weight)[2]


def _efficiency_level(planned):
    return 1 - PLANNED_ALPHA if planned else EFFICIENCY_LEVEL


def _peak_mb(who):
    return resource.getrusage(who).ru_maxrss / 1024


def run_path(path, generator, settings, make, eff_kind, samples, *, planned=False, executor=None,
             efficiency_samples=EFFICIENCY_SAMPLES, efficiency_seed=EFFICIENCY_SEED):
    """One row of the record: N is ``samples``, or the planned N with ``planned`` (greedy paths: ``GREEDY_N``)."""
    from specref.verification.oracle import check_decoder

    impl, case = make()
    planned_n = GREEDY_N if case.config.greedy else _planned(case)
    n = GREEDY_N if case.config.greedy else planned_n if planned else samples
    t0 = time.perf_counter()
    r = check_decoder(impl, cases=[case], mode="statistical", samples=n, alpha=PLANNED_ALPHA if planned else ALPHA,
                      progress=False, executor=executor).results[0]
    seconds = time.perf_counter() - t0
    row = {"path": path, "generator": generator, "settings": settings, "case": case.name, "status": r.status,
           "n": r.n_samples, "p_value": r.p_value, "tv": r.tv, "tv_interval": list(r.tv_interval),
           "detectable_tv": r.detectable_tv, "seconds": seconds, "detail": r.detail[:300],
           "workers": getattr(executor, "_max_workers", 1)}
    _fill_efficiency(row, eff_kind, impl, case, list(impl.target_calls), efficiency_samples,
                     _efficiency_level(planned), efficiency_seed)
    row["seconds_per_call"] = seconds / max(1, r.n_samples)
    row["planned_n"] = planned_n
    row["projected_s_at_planned_n"] = row["planned_n"] * row["seconds_per_call"]
    row["peak_rss_mb"] = _peak_mb(resource.RUSAGE_SELF)
    row["peak_worker_rss_mb"] = _peak_mb(resource.RUSAGE_CHILDREN) if executor is not None else None
    return row


def _efficiency_cell(row, short=False):
    e = row["efficiency"]
    if "measured" not in e:
        return e["verdict"].split(":")[0] if short else e["verdict"]
    lo, hi = e["interval"]
    return f"{e['measured']:.3f} [{lo:.3f}, {hi:.3f}] vs {e['reference']:.3f}: {e['verdict']}"


def _p(p):
    return "< 1e-300" if p == 0 else f"{p:.2g}"  # a G-test p below the smallest float prints as 0


def _tv_cell(row):
    lo, hi = row["tv_interval"]
    tv = f"{row['tv']:.3f} [{lo:.3f}, {hi:.3f}]"
    return tv + (f"; exact {row['exact_tv']:.3f}" if "exact_tv" in row else "")


def table(record: dict) -> str:
    """Markdown: one row per path of a record (``tests/test_hf_paths_table.py`` checks the results page holds it)."""
    lines = ["| path | generator | settings | N | status | p | TV [99% interval] | calls per decode; efficiency | s "
             "| peak RSS MB, main / worker |",
             "|---|---|---|---:|---|---:|---|---|---:|---|"]
    for row in record["paths"]:
        calls = "" if row["calls_per_decode"] is None else f"{row['calls_per_decode']:.3f}; "
        worker = row.get("peak_worker_rss_mb")
        rss = f"{row['peak_rss_mb']:.0f}" + ("" if worker is None else f" / {worker:.0f}")
        lines.append(f"| {row['path']} | `{row['generator']}` | {row['settings']} | {row['n']:,} | {row['status']} "
                     f"| {_p(row['p_value'])} | {_tv_cell(row)} | {calls}{_efficiency_cell(row)} "
                     f"| {row['seconds']:.0f} | {rss} |")
    return "\n".join(lines)


def readme_table(record: dict) -> str:
    """Markdown: the README's shorter table of a record, one row per path (checked by ``tests/test_hf_paths_table.py``)."""
    lines = ["| path | generator | settings | N | status, p | TV [99% interval] | efficiency | s |",
             "|---|---|---|---:|---|---|---|---:|"]
    for row in record["paths"]:
        lines.append(f"| {row['path']} | `{row['generator']}` | {row['settings']} | {row['n']:,} "
                     f"| {row['status']}, {_p(row['p_value'])} | {_tv_cell(row)} | {_efficiency_cell(row, True)} "
                     f"| {row['seconds']:.0f} |")
    return "\n".join(lines)


def _worker_setup():
    """A shard worker: one torch thread, transformers quiet (as this process)."""
    import torch
    from transformers.utils import logging

    torch.set_num_threads(1)
    logging.set_verbosity_error()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1000, help="N per sampling path (greedy paths: 20)")
    ap.add_argument("--planned", action="store_true", help="N per sampling path: its planned N (TV >= 0.01, alpha 1e-6)")
    ap.add_argument("--workers", type=int, default=1, help="processes for each verdict's shards (1: this process)")
    ap.add_argument("--efficiency-samples", type=int, default=EFFICIENCY_SAMPLES,
                    help="decodes of the in-process efficiency run when --workers > 1")
    ap.add_argument("--paths", nargs="*", default=None, help="path names (default: all)")
    ap.add_argument("--out", default="hf_paths.json")
    ap.add_argument("--efficiency-seed", type=int, default=EFFICIENCY_SEED,
                    help="SeedSequence entropy of the efficiency run's decodes")
    ap.add_argument("--efficiency-only", action="store_true",
                    help="with --into: redo only the efficiency verdicts of --out's rows (the same seeded decodes)")
    ap.add_argument("--into", action="store_true",
                    help="keep --out's other rows: the paths run here replace theirs (same versions and settings)")
    ap.add_argument("--table", metavar="JSON", help="print the results page's table of a record and stop")
    ap.add_argument("--readme-table", metavar="JSON", help="print the README's table of a record and stop")
    args = ap.parse_args(argv)
    for name in ("samples", "efficiency_samples"):
        if getattr(args, name) < 2:
            ap.error(f"--{name.replace('_', '-')} must be >= 2, got {getattr(args, name)}")
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    for path, make_table in ((args.table, table), (args.readme_table, readme_table)):
        if path:
            with open(path) as f:
                print(make_table(json.load(f)))
            return 0

    known = [spec[0] for spec in paths()]
    unknown = sorted(set(args.paths or ()) - set(known))
    if unknown:
        ap.error(f"--paths: unknown {unknown}; the paths are {known}")

    import torch
    import transformers
    from transformers.utils import logging

    torch.set_num_threads(1)
    logging.set_verbosity_error()
    record = {"versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                           "python": platform.python_version(), "machine": platform.machine()},
              "settings": {"samples": "planned" if args.planned else args.samples, "greedy_samples": GREEDY_N,
                           "alpha": PLANNED_ALPHA if args.planned else ALPHA, "torch_threads": 1, "workers": args.workers,
                           "efficiency_samples": args.efficiency_samples if args.workers > 1 else None,
                           "planned_tv": PLANNED_TV, "planned_alpha": PLANNED_ALPHA, "planned_power": 0.9},
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
              "command": shlex.join(["python", "benchmarks/hf_paths.py", *(sys.argv[1:] if argv is None else argv)]),
              "paths": []}
    if args.into and os.path.exists(args.out):
        with open(args.out) as f:
            earlier = json.load(f)
        for key in ("versions",) if args.efficiency_only else ("versions", "settings"):
            if earlier[key] != record[key]:
                ap.error(f"--into: {args.out}'s {key} differ from this run's: {earlier[key]!r} vs {record[key]!r}")
        redo = args.paths if args.paths and not args.efficiency_only else ()
        record["paths"] = [row for row in earlier["paths"] if row["path"] not in redo]
        record["command"] = earlier["command"] + " ; " + record["command"]
    executor = None
    if args.workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        executor = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("forkserver"),
                                       initializer=_worker_setup)
    if args.efficiency_only:
        if not args.into or not os.path.exists(args.out):
            ap.error(f"--efficiency-only needs --into and an existing --out, got {args.out!r}")
        for spec in paths():
            if args.paths and spec[0] not in args.paths:
                continue
            row = next(r for r in record["paths"] if r["path"] == spec[0])
            impl, case = spec[3]() if spec[4] in REFERENCES else (None, None)
            _fill_efficiency(row, spec[4], impl, case, [], args.efficiency_samples, _efficiency_level(args.planned),
                             args.efficiency_seed)
            print(f"{row['path']:<42} {_efficiency_cell(row)}", flush=True)
            with open(args.out, "w") as f:
                json.dump(record, f, indent=1, default=str)
        record["seconds"] = sum(r["seconds"] for r in record["paths"])
        with open(args.out, "w") as f:  # the rows without a reference too
            json.dump(record, f, indent=1, default=str)
        return 0
    for spec in paths():
        if args.paths and spec[0] not in args.paths:
            continue
        row = run_path(*spec, args.samples, planned=args.planned, executor=executor,
                       efficiency_samples=args.efficiency_samples, efficiency_seed=args.efficiency_seed)
        print(f"{row['path']:<42} {row['status']:<8} N={row['n']} p={row['p_value']:.3g} "
              f"TV={row['tv']:.3f} {row['seconds']:.1f} s", flush=True)
        record["paths"].append(row)
        order = {name: i for i, name in enumerate(known)}
        record["paths"].sort(key=lambda r: order[r["path"]])
        with open(args.out, "w") as f:  # after every path: a stopped run keeps what it finished
            json.dump(record, f, indent=1, default=str)
    if executor is not None:
        executor.shutdown()
    record["seconds"] = sum(r["seconds"] for r in record["paths"])
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1, default=str)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
