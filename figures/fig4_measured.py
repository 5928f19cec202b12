"""Figure 4 -- measured against modelled: acceptance per draft position, and speedup (SPEC §8).

Reads the benchmark JSON that ``python -m specref.bench --json figures/data/bench.json``
writes (a committed copy lives in ``figures/data/bench.json``).  Keys used::

    {
      "machine": str,                 # where it was measured (optional)
      "command": str,                 # how it was produced (optional)
      "pairs": [                      # one entry per toy target/draft pair
        {
          "name": str,
          "alpha_per_position": [float, ...],  # measured acceptance rate at draft position
                                               # 1, 2, ..., given that the position was reached
          "alpha": float,             # measured acceptance rate (the model's α)
          "c": float,                 # measured draft cost / target cost (the model's c)
          "runs": [{"k": int, "speedup_measured": float}, ...]
                                      # wall-clock speedup over plain decoding at draft length k;
                                      # a "speedup_model" key, if present, is not used
        }
      ]
    }

Left panel: the measured acceptance per position against the constant-α model (a
flat line at the pair's α: the model assumes every position accepts with the same
probability).  Right panel: the measured wall-clock speedup against K, beside the
model's ``S = E[L] / (1 + K·c)`` from :func:`specref.core.cost.speed_ratio`, evaluated here
from the measured α and c (SPEC §8: measured speedups are reported beside the model,
never replaced by it).

When the file is missing, the figure is still drawn, with panels that say how to
produce the data, and its JSON records ``"status": "no benchmark data"``.  A file
that exists but lacks the keys above is an error.
"""

from __future__ import annotations

from figures._common import (
    DATA_DIR,
    DEFAULT_OUT_DIR,
    display_path,
    new_figure,
    num,
    placeholder,
    read_json,
    render,
    run_as_script,
)
from specref.core.cost import speed_ratio

NAME = "fig4_measured"
DEFAULT_BENCH = DATA_DIR / "bench.json"
HINT = "run python -m specref.bench --json figures/data/bench.json"

CAPTION = (
    "Measured against modelled, on the toy target/draft pairs of the benchmark ({machine}). Left: measured "
    "acceptance rate per draft position (given the position was reached; markers) against the constant-α "
    "model, a flat line at the pair's measured α. Right: measured wall-clock speedup over plain decoding "
    "against the draft length K (markers, solid), beside the modelled S = E[L]/(1 + K·c) "
    "(specref.core.cost.speed_ratio, dashed) evaluated at the measured α and the measured draft/target cost "
    "ratio c. Source: {source}."
)
CAPTION_MISSING = (
    "No benchmark data: {source} does not exist, so nothing measured is shown ({hint}). When present, "
    "the left panel shows the measured acceptance rate per draft position against the constant-α model, "
    "and the right panel the measured wall-clock speedup against K beside the modelled "
    "S = E[L]/(1 + K·c) at the measured α and c."
)


def _need(obj: dict, key: str, kind, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"{where}: missing key {key!r} (see the figures.fig4_measured docstring)")
    value = obj[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: {key!r} must be {kind.__name__}, got {value!r}")
    return value


def load_bench(path) -> dict | None:
    """The benchmark JSON reduced to what the figure uses, or None when the file is missing."""
    raw = read_json(path)
    if raw is None:
        return None
    where = str(path)
    pairs = []
    for i, pair in enumerate(_need(raw, "pairs", list, where)):
        at = f"{where}: pairs[{i}]"
        alphas = _need(pair, "alpha_per_position", list, at)
        if not all(isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in alphas):
            raise ValueError(f"{at}: 'alpha_per_position' must hold rates in [0, 1], got {alphas!r}")
        runs = []
        for j, run in enumerate(_need(pair, "runs", list, at)):
            runs.append({"k": _need(run, "k", int, f"{at}.runs[{j}]"),
                         "speedup_measured": _need(run, "speedup_measured", float, f"{at}.runs[{j}]"),
                         # optional: the model with each call priced at its measured time
                         "speedup_calls": run.get("speedup_calls")})
        pairs.append({
            "name": _need(pair, "name", str, at),
            "alpha": _need(pair, "alpha", float, at),
            "c": _need(pair, "c", float, at),
            "alpha_per_position": [float(a) for a in alphas],
            "runs": sorted(runs, key=lambda r: r["k"]),
        })
    return {"pairs": pairs, "machine": str(raw.get("machine", "machine not recorded")),
            "command": str(raw.get("command", "command not recorded"))}


def compute(bench_path=DEFAULT_BENCH) -> dict:
    bench = load_bench(bench_path)
    source = display_path(bench_path)
    if bench is None:
        return {"figure": NAME, "caption": CAPTION_MISSING.format(source=source, hint=HINT),
                "status": "no benchmark data", "source": source, "hint": HINT, "pairs": []}
    pairs = []
    for pair in bench["pairs"]:
        k_max = max([r["k"] for r in pair["runs"]] + [len(pair["alpha_per_position"]), 1])
        model_k = list(range(1, k_max + 1))
        pairs.append({
            **pair,
            "alpha_per_position": [num(a) for a in pair["alpha_per_position"]],
            "model_k": model_k,
            "speedup_model": [num(speed_ratio(pair["alpha"], k, pair["c"])) for k in model_k],
        })
    return {"figure": NAME, "caption": CAPTION.format(machine=bench["machine"], source=source),
            "status": "ok", "source": source, "machine": bench["machine"], "command": bench["command"],
            "pairs": pairs}


def draw(data: dict):
    import matplotlib

    fig, axes = new_figure(1, 2, width=12, height=4.6)
    ax_a, ax_s = axes[0]
    labels = {"a": ("draft position i (1 = first draft token)", "acceptance rate at position i"),
              "s": ("draft length K (tokens per iteration proposed)", "speedup over plain decoding (wall clock)")}
    if data["status"] != "ok":
        msg = f"No benchmark data: {data['source']} is missing. To produce it, {data['hint']}."
        placeholder(ax_a, msg, xlabel=labels["a"][0], ylabel=labels["a"][1])
        placeholder(ax_s, msg, xlabel=labels["s"][0], ylabel=labels["s"][1])
        ax_a.set_title("Acceptance per draft position (no data)")
        ax_s.set_title("Measured against modelled speedup (no data)")
        return fig
    cmap = matplotlib.colormaps["tab10"]
    for i, pair in enumerate(data["pairs"]):
        color = cmap(i % 10)
        pos = list(range(1, len(pair["alpha_per_position"]) + 1))
        ax_a.plot(pos, pair["alpha_per_position"], "o-", color=color, label=f"{pair['name']}: measured")
        ax_a.axhline(pair["alpha"], color=color, ls="--", lw=1,
                     label=f"{pair['name']}: model, α = {pair['alpha']:.3f}")
        ks = [r["k"] for r in pair["runs"]]
        ax_s.plot(ks, [r["speedup_measured"] for r in pair["runs"]], "o-", color=color,
                  label=f"{pair['name']}: measured")
        ax_s.plot(pair["model_k"], pair["speedup_model"], "--", color=color,
                  label=f"{pair['name']}: model (α = {pair['alpha']:.3f}, c = {pair['c']:.3g})")
        priced = [(r["k"], r["speedup_calls"]) for r in pair["runs"] if r.get("speedup_calls") is not None]
        if priced:
            ax_s.plot(*zip(*priced), ":", color=color, marker="x",
                      label=f"{pair['name']}: model, calls priced at measured times")
    ax_a.set_xlabel(labels["a"][0])
    ax_a.set_ylabel(labels["a"][1])
    ax_a.set_ylim(0, 1.05)
    ax_a.set_title("Acceptance per draft position: measured vs constant-α model")
    ax_a.grid(alpha=0.3)
    ax_a.legend(loc="lower left")
    ax_s.axhline(1.0, color="0.3", ls=":", lw=1, label="plain decoding (1×)")
    ax_s.set_xlabel(labels["s"][0])
    ax_s.set_ylabel(labels["s"][1])
    ax_s.set_ylim(0, None)
    ax_s.set_title("Speedup: measured vs modelled")
    ax_s.grid(alpha=0.3)
    ax_s.legend(loc="best")
    return fig


def main(out_dir=DEFAULT_OUT_DIR, *, bench_path=DEFAULT_BENCH) -> list:
    """Draw the figure into ``out_dir`` from ``bench_path``; returns the paths written (PNG, JSON)."""
    return render(NAME, compute, draw, out_dir, bench_path)


if __name__ == "__main__":
    run_as_script(main)
