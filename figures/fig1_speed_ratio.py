"""Figure 1 -- the speed ratio S against the acceptance rate α (SPEC §8, §10).

The idealized cost model of Leviathan, Kalman & Matias (2022), Thm 3.8, as computed
by :mod:`specref.core.cost`: ``S = E[L] / (1 + K·c)`` with ``E[L] = (1 - α^{K+1}) / (1 - α)``.
One panel per draft cost ``c`` (0.1 -- the SPEC's worked example -- then 0, 0.05, 0.2),
one curve per draft length K = 1..8.  Marked: the worked example (α = 0.8, K = 4,
c = 0.1 → S ≈ 2.401; α = 0.2 → S ≈ 0.893) and, in the c = 0 panel, the entries of
their Table 1 with K ≤ 8.  Everything here is the model; nothing is measured.

JSON: ``alpha`` (the grid), ``panels`` [{``c``, ``curves`` [{``k``, ``speed_ratio``}]}],
``worked_example`` and ``paper_table1`` (each point with the model's value, exact
as a fraction and as a float).
"""

from __future__ import annotations

from fractions import Fraction

from figures._common import DEFAULT_OUT_DIR, exact, new_figure, num, render, run_as_script
from specref.core.cost import expected_tokens, speed_ratio

NAME = "fig1_speed_ratio"
K_VALUES = tuple(range(1, 9))
C_PANELS = (Fraction(1, 10), Fraction(0), Fraction(1, 20), Fraction(1, 5))  # the first is the worked example's
ALPHA_STEPS = 100  # α = 0, 0.01, ..., 1
WORKED_EXAMPLE = ((Fraction(4, 5), 4, Fraction(1, 10)), (Fraction(1, 5), 4, Fraction(1, 10)))  # SPEC §8
# Leviathan et al. Table 1 (c = 0): (α, γ) -> speed as printed in the paper; γ <= 8 only
PAPER_TABLE1 = (((Fraction(3, 5), 2), 1.96), ((Fraction(7, 10), 3), 2.53), ((Fraction(4, 5), 2), 2.44),
                ((Fraction(4, 5), 5), 3.69), ((Fraction(9, 10), 2), 2.71))

CAPTION = (
    "Modelled, not measured: the speed ratio S = E[L]/(1 + K·c) of speculative over plain decoding "
    "(Leviathan et al. 2022, Thm 3.8; SPEC §8), with E[L] = (1 - α^(K+1))/(1 - α) expected tokens per "
    "iteration, under i.i.d. acceptance with probability α per draft token; c is the cost of one draft "
    "token in units of one target call. Curves computed by specref.core.cost.speed_ratio. Marked: the SPEC "
    "worked example (α = 0.8, K = 4, c = 0.1: S = 2.401; α = 0.2: S = 0.893, slower than plain "
    "decoding) and, at c = 0, the paper's Table 1 entries with K ≤ 8. Below the dotted line S = 1 "
    "speculation loses."
)


def compute() -> dict:
    """The numbers of the figure (pure model, exact arithmetic rounded for the JSON)."""
    alphas = [Fraction(i, ALPHA_STEPS) for i in range(ALPHA_STEPS + 1)]
    panels = [
        {
            "c": num(c),
            "curves": [{"k": k, "speed_ratio": [num(speed_ratio(a, k, c)) for a in alphas]} for k in K_VALUES],
        }
        for c in C_PANELS
    ]
    worked = []
    for alpha, k, c in WORKED_EXAMPLE:
        s = speed_ratio(alpha, k, c)
        worked.append({
            "alpha": num(alpha), "k": k, "c": num(c),
            "expected_tokens": num(expected_tokens(alpha, k)), "cost": num(1 + k * c),
            "speed_ratio": num(s), "speed_ratio_exact": exact(s),
        })
    table = []
    for (alpha, k), printed in PAPER_TABLE1:
        s = speed_ratio(alpha, k, 0)
        table.append({"alpha": num(alpha), "k": k, "c": 0.0, "speed_ratio": num(s), "paper": printed})
    return {
        "figure": NAME,
        "caption": CAPTION,
        "model": "S = E[L] / (1 + K c), E[L] = sum_{i=0}^{K} alpha^i (specref.core.cost.speed_ratio)",
        "alpha": [num(a) for a in alphas],
        "k_values": list(K_VALUES),
        "panels": panels,
        "worked_example": worked,
        "paper_table1": table,
    }


def draw(data: dict):
    import matplotlib

    fig, axes = new_figure(2, 2, width=11, height=8.2)
    cmap = matplotlib.colormaps["viridis"]
    colors = {k: cmap((k - 1) / (len(K_VALUES) - 1) * 0.9) for k in data["k_values"]}
    for ax, panel in zip(axes.flat, data["panels"]):
        for curve in panel["curves"]:
            ax.plot(data["alpha"], curve["speed_ratio"], color=colors[curve["k"]], lw=1.4, label=f"K = {curve['k']}")
        ax.axhline(1.0, color="0.3", ls=":", lw=1, label="S = 1 (break-even)")
        if panel["c"] == data["worked_example"][0]["c"]:
            for i, pt in enumerate(data["worked_example"]):
                ax.plot(pt["alpha"], pt["speed_ratio"], "o", ms=8, mfc="none", mec="tab:red", mew=1.8,
                        label="SPEC §8 worked example (K = 4)" if i == 0 else None)
                ax.annotate(f"α = {pt['alpha']:g}: S = {pt['speed_ratio']:.3f}", (pt["alpha"], pt["speed_ratio"]),
                            xytext=(-105, 22) if pt["alpha"] > 0.5 else (12, 40), textcoords="offset points",
                            color="tab:red", fontsize=8,
                            arrowprops={"arrowstyle": "-", "color": "tab:red", "lw": 0.8})
            ax.set_title(f"c = {panel['c']:g} (the SPEC worked example)")
        else:
            ax.set_title(f"c = {panel['c']:g}")
        if panel["c"] == 0:
            for i, pt in enumerate(data["paper_table1"]):
                ax.plot(pt["alpha"], pt["paper"], "s", ms=6, mfc="none", mec="k",
                        label="Leviathan et al. Table 1 (printed)" if i == 0 else None)
        ax.set_xlabel("acceptance rate α per draft token")
        ax.set_ylabel("speed ratio S (plain decoding = 1)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", ncol=2)
    fig.suptitle("Speed ratio against acceptance rate, for K = 1..8 draft tokens (idealized cost model)")
    return fig


def main(out_dir=DEFAULT_OUT_DIR) -> list:
    """Draw the figure into ``out_dir``; returns the paths written (PNG, JSON)."""
    return render(NAME, compute, draw, out_dir)


if __name__ == "__main__":
    run_as_script(main)
