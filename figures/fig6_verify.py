"""Figure 6 -- the exact verification summary (SPEC §5, §7).

Reads the JSON that ``python -m specref.verify --json figures/data/verify.json`` writes
(a committed copy lives in ``figures/data/verify.json``).  Keys used::

    {
      "command": str,                  # how it was produced (optional)
      "scenarios": [
        {
          "name": str,
          "kind": "correct" | "control" | "approximate",
                                       # a distribution-preserving implementation, a negative
                                       # control (a known bug, SPEC §7), or an approximate
                                       # algorithm (reported, not judged)
          "tv": float | "n/d" | null,  # total variation to the target law (null: the
                                       # scenario could not run)
          "tv_exact": "n/d" | null,    # the same TV as an exact fraction, when rational (optional)
          "status": str,               # the verifier's verdict ("ok", "detected", "MISSED", ...)
          "n_outputs": int | null      # outputs in the exact law (optional)
        }
      ]
    }

One horizontal bar per scenario on a log scale of TV; ``TV = 0`` cannot sit on a log
axis, so a zero is drawn as a marker at the left edge, labelled "0 (exact)" when it
is an exact rational zero.  Dotted lines: the thresholds of :mod:`specref.verify` --
a correct float scenario passes at TV <= 1e-12 (SPEC §5), a negative control is
detected at TV > 1e-9.

When the file is missing, the figure is still drawn, with a panel that says how to
produce the data, and its JSON records ``"status": "no verification data"``.  A file
that exists but lacks the keys above is an error.
"""

from __future__ import annotations

from fractions import Fraction

from figures._common import (
    DATA_DIR,
    DEFAULT_OUT_DIR,
    display_path,
    new_figure,
    placeholder,
    read_json,
    render,
    run_as_script,
)
from specref.verify import DETECT_TOL, FLOAT_TOL

NAME = "fig6_verify"
DEFAULT_VERIFY = DATA_DIR / "verify.json"
HINT = "run python -m specref.verify --json figures/data/verify.json"
ZERO_AT = 1e-18  # where a zero TV is drawn on the log axis
KINDS = ("correct", "control", "approximate")
COLORS = {"correct": "tab:blue", "control": "tab:red", "approximate": "tab:orange"}
LABELS = {"correct": "correct implementation (should be 0)",
          "control": "negative control, SPEC §7 bug (must be flagged)",
          "approximate": "approximate algorithm (reported)"}

CAPTION = (
    "Computed exactly, neither sampled nor modelled: the total variation between each scenario's output "
    "law and the target law, from enumerating every random choice (python -m specref.verify; source: "
    "{source}). Blue: implementations that should preserve the distribution; red: negative controls, "
    "deliberately wrong implementations (SPEC §7) that the verifier must flag; orange: approximate algorithms, "
    "reported only. TV = 0 is drawn at the left edge (\"0 (exact)\": a rational zero). Dotted lines: a correct "
    "float64 scenario passes at TV ≤ 1e-12 (SPEC §5); a control is detected at TV > 1e-9. Right of each bar: "
    "the verifier's verdict and the number of distinct outputs enumerated, where recorded."
)
CAPTION_MISSING = (
    "No verification data: {source} does not exist, so nothing is shown ({hint}). When present, this "
    "figure shows the exact total variation of every verification scenario on a log scale, correct "
    "implementations and negative controls told apart."
)


def _tv(value, where: str) -> Fraction | float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{where}: 'tv' must be a number, an 'n/d' string or null, got {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            return Fraction(value)
        except ValueError:
            pass
    raise ValueError(f"{where}: 'tv' must be a number, an 'n/d' string or null, got {value!r}")


def load_verify(path) -> dict | None:
    """The verify JSON reduced to what the figure uses, or None when the file is missing."""
    raw = read_json(path)
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("scenarios"), list):
        raise ValueError(f"{path}: missing list 'scenarios' (see the figures.fig6_verify docstring)")
    scenarios = []
    for i, s in enumerate(raw["scenarios"]):
        where = f"{path}: scenarios[{i}]"
        for key in ("name", "kind", "tv", "status"):
            if not isinstance(s, dict) or key not in s:
                raise ValueError(f"{where}: missing key {key!r} (see the figures.fig6_verify docstring)")
        if s["kind"] not in KINDS:
            raise ValueError(f"{where}: 'kind' must be one of {KINDS}, got {s['kind']!r}")
        tv = _tv(s["tv"], where)
        if s.get("tv_exact") is not None:  # the exact value wins over its float rounding
            tv = _tv(str(s["tv_exact"]), where)
        if tv is not None and not 0 <= tv <= 1:
            raise ValueError(f"{where}: 'tv' must be in [0, 1], got {s['tv']!r}")
        scenarios.append({
            "name": str(s["name"]), "kind": s["kind"], "status": str(s["status"]),
            "tv": None if tv is None else float(tv),
            "tv_exact": str(tv) if isinstance(tv, Fraction) else None,
            "tv_is_exact_zero": isinstance(tv, Fraction) and tv == 0,
            "n_outputs": s.get("n_outputs"),
        })
    # correct implementations first, then controls, then approximate ones; input order within each
    scenarios.sort(key=lambda s: KINDS.index(s["kind"]))
    return {"scenarios": scenarios, "command": str(raw.get("command", "command not recorded"))}


def compute(verify_path=DEFAULT_VERIFY) -> dict:
    source = display_path(verify_path)
    loaded = load_verify(verify_path)
    if loaded is None:
        return {"figure": NAME, "caption": CAPTION_MISSING.format(source=source, hint=HINT),
                "status": "no verification data", "source": source, "hint": HINT, "scenarios": []}
    return {"figure": NAME, "caption": CAPTION.format(source=source), "status": "ok", "source": source,
            "command": loaded["command"], "float_tolerance": FLOAT_TOL, "detect_tolerance": DETECT_TOL,
            "zero_drawn_at": ZERO_AT,
            "scenarios": loaded["scenarios"]}


def draw(data: dict):
    n = max(len(data["scenarios"]), 6)
    fig, axes = new_figure(1, 1, width=12, height=1.6 + 0.26 * n)
    ax = axes[0, 0]
    xlabel, ylabel = "total variation to the target law (log scale; 0 = exact zero)", "scenario"
    if data["status"] != "ok":
        placeholder(ax, f"No verification data: {data['source']} is missing. To produce it, {data['hint']}.",
                    xlabel=xlabel, ylabel=ylabel)
        ax.set_title("Exact verification summary (no data)")
        return fig
    seen = set()
    scen = data["scenarios"]
    for y, s in enumerate(scen):
        color = COLORS[s["kind"]]
        label = None if s["kind"] in seen else LABELS[s["kind"]]
        seen.add(s["kind"])
        if s["tv"] is None:
            ax.plot(ZERO_AT, y, "x", color=color, ms=7, label=label)
            value = "none (did not run)"
        elif s["tv"] <= ZERO_AT:
            ax.plot(ZERO_AT, y, "o", color=color, ms=6, label=label)
            value = "0 (exact)" if s["tv_is_exact_zero"] else ("0 (float)" if s["tv"] == 0 else f"{s['tv']:.1e}")
        else:
            ax.barh(y, s["tv"], left=ZERO_AT, color=color, height=0.6, label=label)
            value = s["tv_exact"] if s["tv_exact"] is not None and len(s["tv_exact"]) <= 9 else f"{s['tv']:.3g}"
        outputs = "" if s["n_outputs"] is None else f", {s['n_outputs']} outputs"
        ax.text(1.6, y, f"TV = {value}: {s['status']}{outputs}", va="center", fontsize=7)
    ax.axvline(FLOAT_TOL, color="tab:blue", ls=":", lw=1, label="correct float scenario: TV ≤ 1e-12 (SPEC §5)")
    ax.axvline(DETECT_TOL, color="tab:red", ls=":", lw=1, label="control detected: TV > 1e-9")
    ax.set_yticks(range(len(scen)), [s["name"] for s in scen], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(ZERO_AT / 3, 1.5)
    ticks = [ZERO_AT, 1e-15, 1e-12, 1e-9, 1e-6, 1e-3, 1.0]
    ax.set_xticks(ticks, ["0"] + [f"$10^{{{e}}}$" for e in (-15, -12, -9, -6, -3, 0)])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("Exact verification: TV of every scenario")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(loc="upper right", fontsize=7)  # the correct scenarios (top rows) leave this corner empty
    return fig


def main(out_dir=DEFAULT_OUT_DIR, *, verify_path=DEFAULT_VERIFY) -> list:
    """Draw the figure into ``out_dir`` from ``verify_path``; returns the paths written (PNG, JSON)."""
    return render(NAME, compute, draw, out_dir, verify_path)


if __name__ == "__main__":
    run_as_script(main)
