"""The performance page's benchmark tables (docs/results/performance.md), printed from committed ``python -m specref.bench --json`` runs.

    python benchmarks/bench_tables.py benchmarks/out/bench_wide_torch.json

``tests/test_bench.py`` checks that that page holds exactly these tables for every
committed run listed in ``RUNS``, so a published number cannot drift from its JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
RUNS = ["bench_wide_torch.json", "bench_wide_numpy.json", "bench_small.json"]
REPEATS = ["bench_repro_1.json", "bench_repro_2.json", "bench_repro_3.json"]  # one cell, three invocations


def _x(v):
    return f"{v:.2f}x"


def _rng(r):
    return f"[{r[0]:.2f}, {r[1]:.2f}]"


def _ms(s):
    return f"{s * 1e3:.1f}"


def tables(report: dict) -> str:
    """Markdown: the run's line, the per-cell table and the batch table."""
    t = report["target"]
    pil = report["pilot"]
    ratio = {int(k): v / pil["t_step"] for k, v in pil["t_verify"].items()}
    lines = [
        f"`{report['command']}` -- target {t['target']}: {t['n_layer']} layers x {t['n_embd']} wide, "
        f"{t['params'] / 1e6:.1f}M params, {t['weights_mb_float32']:.0f} MB float32; {report['machine']}; "
        f"{report['config']['repeats']} paired runs per cell; {report['seconds'] / 60:.0f} min, "
        f"peak RSS {report['peak_memory_mib']:.0f} MiB.",
        "",
        f"Pilot: t_step {_ms(pil['t_step'])} ms; t_verify(K)/t_step "
        + ", ".join(f"K={k}: {v:.2f}" for k, v in sorted(ratio.items())) + ".",
        "",
        "| draft | T | tokens | best K: speedup [range] | K_rule: speedup [range] | alpha | c | "
        "within 15% of calls-priced | tok/s plain / best | TTFT ms plain / best | p50 / p99 ms plain | p50 / p99 ms best |",
        "|---|---|---:|---|---|---:|---:|---:|---|---|---|---|",
    ]
    for c in report["cells"]:
        best = next(r for r in c["runs"] if r["k"] == c["best_k"])
        b = c["baseline"]
        lines.append(
            f"| {c['draft']} | {c['temperature']} | {c['tokens']} | K={c['best_k']}: {_x(c['best_speedup'])} "
            f"{_rng(c['best_speedup_range'])} | K={c['k_rule']}: {_x(c['rule_speedup'])} {_rng(c['rule_speedup_range'])} "
            f"| {statistics.median(r['alpha'] for r in c['runs']):.3f} | {statistics.median(r['c'] for r in c['runs']):.3f} "
            f"| {c['within_15pct_speedup_calls']}/{len(c['runs'])} "
            f"| {b['tokens_per_second']:.0f} / {best['tokens_per_second']:.0f} "
            f"| {_ms(b['ttft_seconds'])} / {_ms(best['ttft_seconds'])} "
            f"| {_ms(b['latency_p50_seconds'])} / {_ms(b['latency_p99_seconds'])} "
            f"| {_ms(best['latency_p50_seconds'])} / {_ms(best['latency_p99_seconds'])} |")
    longest = max(c["tokens"] for c in report["cells"])
    temps = {c["temperature"] for c in report["cells"]}
    t = "1" if "1" in temps else sorted(temps)[0]
    lines += ["", f"Every K at T = {t}, {longest} tokens (medians of the 3 runs; ms per run):", "",
              "| draft | K | measured [range] | SPEC §8 model | calls priced | t_verify/t_step | "
              "draft / verify / rollback / overhead ms | tok/s |",
              "|---|---:|---|---:|---:|---:|---|---:|"]
    for c in report["cells"]:
        if c["temperature"] != t or c["tokens"] != longest:
            continue
        for r in c["runs"]:
            lines.append(
                f"| {c['draft']} | {r['k']} | {_x(r['speedup_measured'])} {_rng(r['speedup_range'])} "
                f"| {_x(r['speedup_model'])} | {_x(r['speedup_calls'])} | {r['verify_cost_ratio']:.2f} "
                f"| {_ms(r['draft_seconds'])} / {_ms(r['verify_seconds'])} / {r['rollback_seconds'] * 1e3:.2f} / "
                f"{_ms(r['overhead_seconds'])} | {r['tokens_per_second']:.0f} |")
    if report["batches"]:
        lines += ["", "| batch | tokens | K | speedup [range] | tok/s plain / spec | request latency s plain / spec | padding |",
                  "|---:|---:|---:|---|---|---|---:|"]
        for r in report["batches"]:
            lines.append(
                f"| {r['batch']} | {r['tokens']} | {r['k']} | {_x(r['speedup_measured'])} {_rng(r['speedup_range'])} "
                f"| {r['plain_throughput_tokens_per_second']:.0f} / {r['throughput_tokens_per_second']:.0f} "
                f"| {r['plain_request_latency_median_seconds']:.2f} / {r['request_latency_median_seconds']:.2f} "
                f"| {r['padding_fraction']:.1%} |")
    return "\n".join(lines)


def reproduction(reports: list, full: dict) -> str:
    """One line: the same cell (and batch row) measured by separate invocations, beside the full run."""
    def cell(r):
        (c,) = [c for c in r["cells"] if c["draft"] == "transformer-small" and c["temperature"] == "1" and c["tokens"] == 256]
        return next(x for x in c["runs"] if x["k"] == 8)["speedup_measured"]

    def batch1(r):
        return next(b for b in r["batches"] if b["batch"] == 1 and b["tokens"] == 256 and b["k"] == 8)["speedup_measured"]

    cells, batches = [cell(r) for r in reports], [batch1(r) for r in reports]
    spread = max(cells) / min(cells) - 1
    return (f"Reproduction: `{reports[0]['command'].replace(reports[0]['command'].split()[-1], 'PATH')}`, run "
            f"{len(reports)} times: transformer draft, T = 1, 256 tokens, K = 8: "
            + ", ".join(_x(v) for v in cells) + f" (max/min - 1 = {spread:.1%}; the full run: {_x(cell(full))}); "
            f"the same at batch 1 through the batched loop: " + ", ".join(_x(v) for v in batches)
            + f" (the full run: {_x(batch1(full))}).")


def main(argv=None) -> int:
    paths = (argv if argv is not None else sys.argv[1:]) or [str(OUT / r) for r in RUNS]
    for p in paths:
        print(tables(json.loads(Path(p).read_text())))
        print()
    if argv is None and len(sys.argv) == 1:
        reports = [json.loads((OUT / r).read_text()) for r in REPEATS]
        print(reproduction(reports, json.loads((OUT / RUNS[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
