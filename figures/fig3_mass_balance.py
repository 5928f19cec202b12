"""Figure 3 -- the mass balance of one speculative step, for the SPEC §3 worked example.

Tokens A, B, C; target ``p = [1/5, 1/2, 3/10]``, draft ``q = [3/5, 3/10, 1/10]``
(Leviathan et al. notation).  Everything is exact rational arithmetic from
:mod:`specref.core.step`: the accepted mass ``min(p, q)`` (total α = 3/5), the residual
``max(0, p - q) / Σ max(0, p - q)`` that a rejection (mass 2/5) draws from, and their
sum, which is ``p`` token by token.  Beside it, the classic bug "on rejection,
resample from p" (SPEC §7, bug 1): ``min(p, q) + (1 - α)·p = [7/25, 1/2, 11/50]``.

The correct output is computed twice: from the formula, and as the exact law of
:func:`specref.core.step.speculative_step` (K = 1, the draft token drawn from q),
enumerated over its random choices by :func:`specref.verification.laws.enumeration.law`.

JSON: every row as fractions (``"n/d"``) and floats, under ``exact`` and ``float``.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from figures._common import DEFAULT_OUT_DIR, exact, new_figure, num, render, run_as_script
from specref.core.step import acceptance_rate, accepted_mass, residual, residual_mass, speculative_step
from specref.verification.laws.enumeration import law

NAME = "fig3_mass_balance"
TOKENS = ("A", "B", "C")
P = (Fraction(1, 5), Fraction(1, 2), Fraction(3, 10))  # target
Q = (Fraction(3, 5), Fraction(3, 10), Fraction(1, 10))  # draft

CAPTION = (
    "Exact, neither sampled nor modelled: one speculative step on the SPEC §3 worked example, target "
    "p = [1/5, 1/2, 3/10], draft q = [3/5, 3/10, 1/10], in rational arithmetic (specref.core.step). Left: p, q, "
    "the accepted mass min(p, q) (total α = 3/5) and the normalized residual max(0, p - q)/Σ max(0, p - q) "
    "= [0, 1/2, 1/2] that a rejection (probability 2/5) draws from. Right: the law of the emitted token, "
    "stacked as accepted mass + rejection mass × correction. Correct rule (correction from the residual): "
    "exactly p, also confirmed by enumerating every random choice of specref.core.step.speculative_step "
    "(specref.verification.laws.enumeration.law). Wrong rule \"on rejection, resample from p\" (SPEC §7 bug 1): "
    "[7/25, 1/2, 11/50] ≠ p. Black lines: p."
)


def _rows():
    p = np.array(P, dtype=object)
    q = np.array(Q, dtype=object)
    return p, q


def enumerated_output():
    """Exact law of the first emitted token of ``speculative_step`` with K = 1.  -> [V] Fractions"""
    p, q = _rows()
    p_target = np.stack([p, p])  # [K+1, V]; the bonus row does not affect the first token
    q_draft = q[None, :]  # [K, V]

    def program(rng):
        x = int(rng.choice(len(P), p=q))  # 1. draft x ~ q
        return speculative_step(p_target, q_draft, [x], rng)[0]  # 3.-4. accept or correct

    out = law(program)
    return [Fraction(out.get(v, 0)) for v in range(len(P))]


def compute() -> dict:
    p, q = _rows()
    alpha = acceptance_rate(p, q)
    reject = residual_mass(p, q)
    acc = accepted_mass(p, q)
    r = residual(p, q)
    correct = acc + reject * r
    wrong = acc + reject * p
    enumerated = enumerated_output()
    if list(correct) != list(P) or enumerated != list(P):
        raise AssertionError(f"mass balance fails: formula {list(correct)}, enumeration {enumerated}, p {list(P)}")
    rows = {
        "p": p, "q": q, "accepted_mass": acc, "residual": r,
        "rejection_times_residual": reject * r, "correct_output": correct,
        "rejection_times_p": reject * p, "wrong_output_resample_from_p": wrong,
        "enumerated_output": np.array(enumerated, dtype=object),
    }
    return {
        "figure": NAME,
        "caption": CAPTION,
        "tokens": list(TOKENS),
        "acceptance_rate": exact(alpha),
        "rejection_mass": exact(reject),
        "tv_wrong_vs_p": exact(sum(abs(w - x) for w, x in zip(wrong, p)) / 2),
        "exact": {k: [exact(x) for x in v] for k, v in rows.items()},
        "float": {k: [num(x) for x in v] for k, v in rows.items()},
    }


def draw(data: dict):
    fig, axes = new_figure(1, 2, width=12, height=4.6)
    ax_in, ax_out = axes[0]
    ex, fl = data["exact"], data["float"]
    x = np.arange(len(data["tokens"]))

    series = (("p", "target p", "k"), ("q", "draft q", "tab:gray"),
              ("accepted_mass", "accepted mass min(p, q)", "tab:blue"),
              ("residual", "residual (normalized)", "tab:orange"))
    width = 0.2
    for i, (key, label, color) in enumerate(series):
        pos = x + (i - 1.5) * width
        ax_in.bar(pos, fl[key], width, color=color, label=label, alpha=0.85)
        for xi, v, s in zip(pos, fl[key], ex[key]):
            ax_in.text(xi, v + 0.01, s, ha="center", va="bottom", fontsize=7)
    ax_in.set_xticks(x, data["tokens"])
    ax_in.set_xlabel("token")
    ax_in.set_ylabel("probability")
    ax_in.set_ylim(0, 0.7)
    ax_in.set_title(f"Inputs: acceptance α = {data['acceptance_rate']}, rejection mass {data['rejection_mass']}")
    ax_in.legend(loc="upper right")

    width = 0.3
    for j, (extra, total, label, color) in enumerate((
        ("rejection_times_residual", "correct_output", "correct: + rejection × residual", "tab:orange"),
        ("rejection_times_p", "wrong_output_resample_from_p", "wrong: + rejection × p (resample from p)", "tab:red"),
    )):
        pos = x + (j - 0.5) * (width + 0.04)
        ax_out.bar(pos, fl["accepted_mass"], width, color="tab:blue", alpha=0.85,
                   label="accepted mass min(p, q)" if j == 0 else None)
        ax_out.bar(pos, fl[extra], width, bottom=fl["accepted_mass"], color=color, alpha=0.85, label=label)
        for xi, v, s in zip(pos, fl[total], ex[total]):
            ax_out.text(xi, v + 0.01, s, ha="center", va="bottom", fontsize=8)
    ax_out.hlines(fl["p"], x - 0.4, x + 0.4, colors="k", lw=2, label="target p")
    ax_out.set_xticks(x, data["tokens"])
    ax_out.set_xlabel("token (left bar: correct rule, right bar: wrong rule)")
    ax_out.set_ylabel("probability of emitting the token")
    ax_out.set_ylim(0, 0.7)
    ax_out.set_title(f"Output law; wrong rule is off by TV = {data['tv_wrong_vs_p']}")
    ax_out.legend(loc="upper right")
    return fig


def main(out_dir=DEFAULT_OUT_DIR) -> list:
    """Draw the figure into ``out_dir``; returns the paths written (PNG, JSON)."""
    return render(NAME, compute, draw, out_dir)


if __name__ == "__main__":
    run_as_script(main)
