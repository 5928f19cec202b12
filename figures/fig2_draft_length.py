"""Figure 2 -- expected tokens per iteration, and the best draft length (SPEC §8, §10).

Left: ``E[L] = Σ_{i=0}^{K} α^i`` (Leviathan et al. 2022, eq. 1) against K for several
α, with its limit ``1 / (1 - α)`` as K grows.  Middle: the K that maximizes the
speed ratio ``S = E[L] / (1 + K·c)`` against α, for several draft costs c (from
:func:`specref.core.cost.best_k`, which searches all K, not a capped range, when c > 0).
Right: the speed ratio at that best K, beside ``S(K = 1) = (1 + α)/(1 + c)``, the
guarantee of their Cor 3.9 (above 1 whenever α > c).  Marked: α = 0.8, c = 0.1,
where the best K is 6 (S ≈ 2.470, SPEC §10).  Model only; nothing is measured.

JSON: ``expected_tokens`` [{``alpha``, ``k``, ``expected_tokens``, ``limit``}],
``alpha`` (grid for the best K), ``best_k`` [{``c``, ``k``, ``speed_ratio``}], ``marked``.
"""

from __future__ import annotations

from figures._common import DEFAULT_OUT_DIR, new_figure, num, render, run_as_script
from specref.core.cost import best_k, expected_tokens

NAME = "fig2_draft_length"
EL_ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
EL_K = tuple(range(1, 17))
BEST_K_COSTS = (0.01, 0.05, 0.1, 0.2)
ALPHA_GRID = tuple(i / 100 for i in range(100))  # 0 .. 0.99 (at α = 1 no finite K is best)
MARKED = (0.8, 0.1)  # SPEC §10: best K = 6, S ≈ 2.470

CAPTION = (
    "Modelled, not measured (i.i.d. acceptance with probability α per draft token; Leviathan et al. 2022). "
    "Left: expected tokens per iteration E[L] = (1 - α^(K+1))/(1 - α) against the draft length K; dashed: "
    "the limit 1/(1 - α) for K → ∞. Middle: the draft length K that maximizes the speed ratio "
    "S = E[L]/(1 + K·c) (specref.core.cost.best_k, searched over all K), for draft costs c in units of one "
    "target call. Right: S at that K; dotted: S at K = 1, (1 + α)/(1 + c), above 1 whenever α > c "
    "(their Cor. 3.9); below S = 1 speculation loses for every K. "
    "Marked: α = 0.8, c = 0.1, best K = 6, S = 2.470 (SPEC §10)."
)


def compute() -> dict:
    el = [
        {"alpha": a, "k": list(EL_K), "expected_tokens": [num(expected_tokens(a, k)) for k in EL_K],
         "limit": num(1 / (1 - a))}
        for a in EL_ALPHAS
    ]
    curves = []
    for c in BEST_K_COSTS:
        best = [best_k(a, c) for a in ALPHA_GRID]
        curves.append({
            "c": c,
            "k": [k for k, _ in best],
            "speed_ratio": [num(s) for _, s in best],
            "cor_3_9_bound": [num((1 + a) / (1 + c)) for a in ALPHA_GRID],
        })
    k, s = best_k(*MARKED)
    return {
        "figure": NAME,
        "caption": CAPTION,
        "model": "E[L] = sum_{i=0}^{K} alpha^i; S = E[L] / (1 + K c); best K = argmax_K S (specref.core.cost)",
        "expected_tokens": el,
        "alpha": list(ALPHA_GRID),
        "best_k": curves,
        "marked": {"alpha": MARKED[0], "c": MARKED[1], "k": k, "speed_ratio": num(s)},
    }


def draw(data: dict):
    import matplotlib

    fig, axes = new_figure(1, 3, width=13, height=4.4)
    ax_el, ax_k, ax_s = axes[0]
    cmap = matplotlib.colormaps["plasma"]

    for i, row in enumerate(data["expected_tokens"]):
        color = cmap(i / len(data["expected_tokens"]) * 0.85)
        ax_el.plot(row["k"], row["expected_tokens"], "o-", ms=3, color=color, label=f"α = {row['alpha']:g}")
        ax_el.axhline(row["limit"], color=color, ls="--", lw=0.8)
    ax_el.plot([], [], "k--", lw=0.8, label="limit 1/(1 - α)")
    ax_el.set_xlabel("draft length K (tokens per iteration proposed)")
    ax_el.set_ylabel("expected tokens per iteration E[L]")
    ax_el.set_title("Expected tokens per iteration")
    ax_el.set_ylim(0.9, None)
    ax_el.grid(alpha=0.3)
    ax_el.legend(loc="upper left")

    mk = data["marked"]
    for i, curve in enumerate(data["best_k"]):
        color = matplotlib.colormaps["viridis"](i / len(data["best_k"]) * 0.9)
        ax_k.step(data["alpha"], curve["k"], where="mid", color=color, label=f"c = {curve['c']:g}")
        ax_s.plot(data["alpha"], curve["speed_ratio"], color=color, label=f"c = {curve['c']:g}")
        ax_s.plot(data["alpha"], curve["cor_3_9_bound"], ":", color=color, lw=0.9)
    ax_s.plot([], [], "k:", lw=0.9, label="K = 1: (1 + α)/(1 + c), Cor. 3.9")
    for ax, y in ((ax_k, mk["k"]), (ax_s, mk["speed_ratio"])):
        ax.plot(mk["alpha"], y, "o", ms=8, mfc="none", mec="tab:red", mew=1.8,
                label=f"α = {mk['alpha']:g}, c = {mk['c']:g}: K = {mk['k']}, S = {mk['speed_ratio']:.3f}")
    ax_k.set_yscale("log")
    ax_k.set_yticks([1, 2, 3, 5, 10, 20, 50, 100], labels=["1", "2", "3", "5", "10", "20", "50", "100"])
    ax_k.set_xlabel("acceptance rate α per draft token")
    ax_k.set_ylabel("best draft length K (log scale)")
    ax_k.set_title("Draft length that maximizes the speed ratio")
    ax_k.set_xlim(0, 1)
    ax_k.grid(alpha=0.3, which="both")
    ax_k.legend(loc="upper left")

    ax_s.axhline(1.0, color="0.3", ls="-", lw=0.6)
    ax_s.set_yscale("log")
    ax_s.set_yticks([1, 2, 5, 10, 20], labels=["1", "2", "5", "10", "20"])
    ax_s.set_xlabel("acceptance rate α per draft token")
    ax_s.set_ylabel("speed ratio S at the best K (log scale)")
    ax_s.set_title("Speed ratio at the best draft length")
    ax_s.set_xlim(0, 1)
    ax_s.grid(alpha=0.3, which="both")
    ax_s.legend(loc="upper left")
    return fig


def main(out_dir=DEFAULT_OUT_DIR) -> list:
    """Draw the figure into ``out_dir``; returns the paths written (PNG, JSON)."""
    return render(NAME, compute, draw, out_dir)


if __name__ == "__main__":
    run_as_script(main)
