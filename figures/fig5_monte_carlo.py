"""Figure 5 -- Monte Carlo convergence of the first emitted token (SPEC §6).

The classic experiment: run one speculative step a million times and compare the
frequencies of the first emitted token with the target softmax ``p_1``.  A correct
step emits its first token with law exactly ``p_1`` (SPEC §3), so the empirical total
variation ``T_N = 1/2 Σ |p̂_N - p_1|`` falls like ``1/√N``; a wrong step levels off at
its exact TV from ``p_1``.

Setup: V = 8, K = 2 (the first token does not depend on K), target rows ``p = softmax(TARGET_LOGITS)`` and draft rows
``q = softmax(DRAFT_LOGITS)`` (specref.core.sampling.process, T = 1), the same at every
position; α = Σ min(p, q) ≈ 0.866.  N runs over 41 log-spaced values from 10 to
10^6; each curve is the median over ``STREAMS`` independent seeded streams of 10^6
samples, each evaluated on its first N samples (shaded: min to max over the streams).

- reference: :func:`specref.decoding.vectorized.sample_steps`, the real vectorized step;
- two wrong steps from SPEC §7, ``specref.verification.zoo.chain`` entries ``residual_from_p`` (bug 1) and
  ``deterministic_accept`` (bug 3).  Their scalar Python steps are far too slow for
  5·10^6 runs, so each one's exact first-token law is enumerated
  (:func:`specref.verification.laws.enumeration.law`), checked against the closed form derived by hand --
  bug 1: ``min(p, q) + (1 - α)·p``; bug 3: ``q·[p ≥ q] + ρ·r`` with
  ``ρ = Σ_{x: p(x) < q(x)} q(x)`` and ``r`` the residual -- and sampled with NumPy.
- band: where a correct sampler's ``T_N`` falls with probability ≥ 99%, the
  distribution-free half-width of :func:`specref.verification.statistics.counts.tv_estimate` (a constant over √N);
  dashed: its expected value ``Σ sqrt(p(1 - p) / (2πN))`` (normal approximation).

JSON: ``n``, ``curves`` [{``name``, ``kind``, ``exact_tv``, ``tv_median``, ``tv_min``,
``tv_max``}], ``band`` {``confidence``, ``c``, ``upper``}, ``expected_tv`` {``c``, ``value``}.
"""

from __future__ import annotations

import numpy as np

from figures._common import DEFAULT_OUT_DIR, new_figure, num, render, run_as_script
from specref.core.sampling import SamplingConfig, process
from specref.decoding.vectorized import sample_steps
from specref.verification.laws.enumeration import law
from specref.verification.statistics.counts import tv_estimate
from specref.verification.zoo.chain import ZOO

NAME = "fig5_monte_carlo"
SEED = 20220718  # fixes every stream
STREAMS = 5  # independent streams of N_MAX samples per curve
N_MAX = 10**6
N_GRID = tuple(sorted({int(round(10 ** (1 + 5 * j / 40))) for j in range(41)}))  # 10 .. 10^6
K = 2
TARGET_LOGITS = (2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0)
DRAFT_LOGITS = (2.0, 2.1, 1.0, 0.5, -0.4, -0.5, -1.0, -1.4)
CONFIDENCE = 0.99

CAPTION = (
    "Measured (Monte Carlo), against an exact law: the empirical total variation T_N = ½ Σ|p̂_N - p| between "
    "the first emitted token of N independent speculative steps and the target softmax p (V = {v}, K = {k}, "
    "draft q with α = Σ min(p, q) = {alpha:.3f}), for N = 10 to 10^6. Lines: median over {streams} seeded "
    "streams, each taken at its first N samples; shaded: min-max over the streams. Reference: "
    "specref.decoding.vectorized.sample_steps. The two SPEC §7 bugs are sampled with NumPy from their exact first-token "
    "laws, obtained by enumerating the specref.verification.zoo.chain implementations (specref.verification.laws.enumeration.law) and equal to their "
    "closed forms -- the zoo's scalar steps are too slow to run 5·10^6 times; dotted: their exact TV from p. "
    "Grey band: "
    "T_N ≤ {band_c:.3f}/√N, where a correct sampler's T_N falls with probability ≥ 99% (distribution-free "
    "bound of specref.verification.statistics.counts.tv_estimate); dashed: its expected value ≈ {mean_c:.3f}/√N "
    "(= Σ sqrt(p(1-p)/(2πN)), normal approximation). The reference stays in the band; the bugs leave it."
)


def rows():
    """Target ``p`` and draft ``q`` (one row each, float64).  -> [V], [V]"""
    p = process(np.array(TARGET_LOGITS), SamplingConfig())
    q = process(np.array(DRAFT_LOGITS), SamplingConfig())
    return p, q


BUGS = (  # (label, specref.verification.zoo.chain entry): the two SPEC §7 bugs that change the first emitted token
    ("bug 1: correction from p (zoo residual_from_p)", "residual_from_p"),
    ("bug 3: deterministic accept p ≥ q (zoo deterministic_accept)", "deterministic_accept"),
)


def closed_form_laws(p, q) -> dict:
    """First-token laws of the two wrong steps, derived by hand.  -> {zoo name: [V]}

    bug 1: accepted mass ``min(p, q)``, then a rejection (mass ``1 - α``) draws from ``p``.
    bug 3: ``x ~ q`` is kept iff ``p(x) >= q(x)`` (mass ``q·[p >= q]``); every other proposal
    (mass ``ρ = Σ_{p < q} q``) is rejected and draws from the residual ``r``.
    """
    alpha = np.minimum(p, q).sum()
    res = np.maximum(p - q, 0.0)
    res = res / res.sum()
    kept = p >= q
    rho = q[~kept].sum()
    return {
        "residual_from_p": np.minimum(p, q) + (1.0 - alpha) * p,
        "deterministic_accept": np.where(kept, q, 0.0) + rho * res,
    }


def zoo_first_token_law(p, q, name: str) -> np.ndarray:
    """Exact law of the first token that ``specref.verification.zoo.chain.ZOO[name]`` emits, by enumeration.  -> [V]

    Enumerated at K = 1 (the first emitted token depends on position 1 only, for
    these two bugs as for the reference): draft ``x ~ q``, then the zoo step, every
    random choice enumerated by :func:`specref.verification.laws.enumeration.law`.
    """
    step = ZOO[name].fn
    v = p.shape[0]
    p_target, q_draft = np.stack([p, p]), q[None, :]  # [2, V], [1, V]

    def program(rng):
        x = int(rng.choice(v, p=q))  # 1. draft x ~ q
        return step(p_target, q_draft, [x], rng)[0]  # the wrong step; its first emitted token

    out = law(program)
    return np.array([float(out.get(t, 0.0)) for t in range(v)])


def _tv_curve(tokens: np.ndarray, p: np.ndarray) -> list[float]:
    """T_N of the first N tokens for every N in N_GRID.  # [N_MAX] -> [len(N_GRID)]"""
    v = p.shape[0]
    return [0.5 * float(np.abs(np.bincount(tokens[:n], minlength=v) / n - p).sum()) for n in N_GRID]


def _from_law(law_row: np.ndarray, n: int, rng) -> np.ndarray:
    """n draws from a fixed law, inverse CDF on uniforms.  # [V] -> [n]"""
    cdf = np.cumsum(law_row)
    return np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), law_row.shape[0] - 1)


def compute() -> dict:
    p, q = rows()
    alpha = float(np.minimum(p, q).sum())
    p_target = np.tile(p, (K + 1, 1))  # [K+1, V]
    q_draft = np.tile(q, (K, 1))  # [K, V]
    by_hand = closed_form_laws(p, q)
    runs = [("reference (specref.decoding.vectorized.sample_steps)", "correct", None)]
    for label, name in BUGS:
        row = zoo_first_token_law(p, q, name)
        if not np.allclose(row, by_hand[name], atol=1e-12, rtol=0):
            raise AssertionError(f"{name}: enumerated first-token law {row} != closed form {by_hand[name]}")
        runs.append((label, "bug", row))

    seeds = np.random.SeedSequence(SEED).spawn(len(runs))
    curves = []
    for (name, kind, law_row), seed in zip(runs, seeds):
        tvs = []
        for stream in seed.spawn(STREAMS):
            rng = np.random.default_rng(stream)
            if law_row is None:
                tokens = np.asarray(sample_steps(p_target, q_draft, N_MAX, rng).tokens[:, 0])
            else:
                tokens = _from_law(law_row, N_MAX, rng)
            tvs.append(_tv_curve(tokens, p))
        tvs = np.array(tvs)  # [STREAMS, len(N_GRID)]
        exact_tv = 0.0 if law_row is None else 0.5 * float(np.abs(law_row - p).sum())
        curves.append({
            "name": name, "kind": kind, "exact_tv": num(exact_tv),
            "first_token_law": [num(x) for x in (p if law_row is None else law_row)],
            "tv_median": [num(x) for x in np.median(tvs, axis=0)],
            "tv_min": [num(x) for x in tvs.min(axis=0)],
            "tv_max": [num(x) for x in tvs.max(axis=0)],
        })

    # the band: tv_estimate's half-width and null mean are constants over sqrt(N)
    ref = tv_estimate(np.round(p * N_MAX).astype(np.int64), p, confidence=CONFIDENCE)
    band_c = ref.half_width * np.sqrt(ref.n)
    mean_c = ref.null_mean * np.sqrt(ref.n)
    n = np.array(N_GRID, dtype=np.float64)
    return {
        "figure": NAME,
        "caption": CAPTION.format(v=p.shape[0], k=K, alpha=alpha, streams=STREAMS, band_c=band_c, mean_c=mean_c),
        "seed": SEED, "streams": STREAMS, "k": K,
        "target_logits": list(TARGET_LOGITS), "draft_logits": list(DRAFT_LOGITS),
        "p": [num(x) for x in p], "q": [num(x) for x in q], "alpha": num(alpha),
        "bug_route": "exact first-token laws of specref.verification.zoo.chain entries (specref.verification.laws.enumeration.law, K = 1), equal to "
                     "the closed forms, sampled with NumPy",
        "n": list(N_GRID),
        "curves": curves,
        "band": {"confidence": CONFIDENCE, "c": num(band_c), "upper": [num(x) for x in band_c / np.sqrt(n)]},
        "expected_tv": {"c": num(mean_c), "value": [num(x) for x in mean_c / np.sqrt(n)]},
    }


def draw(data: dict):
    fig, axes = new_figure(1, 1, width=9, height=5.6)
    ax = axes[0, 0]
    n = data["n"]
    ax.fill_between(n, 1e-5, data["band"]["upper"], color="0.85",
                    label=f"{100 * data['band']['confidence']:g}% band of a correct sampler, "
                          f"{data['band']['c']:.3f}/√N")
    ax.plot(n, data["expected_tv"]["value"], "--", color="0.4",
            label=f"expected T_N of a correct sampler ≈ {data['expected_tv']['c']:.3f}/√N")
    colors = {"correct": ["tab:blue"], "bug": ["tab:red", "tab:purple"]}
    for curve in data["curves"]:
        color = colors[curve["kind"]].pop(0)
        ax.fill_between(n, curve["tv_min"], curve["tv_max"], color=color, alpha=0.2, lw=0)
        ax.plot(n, curve["tv_median"], "-", color=color, lw=1.6, label=curve["name"])
        if curve["kind"] == "bug":
            ax.axhline(curve["exact_tv"], color=color, ls=":", lw=1.2,
                       label=f"exact TV of {curve['name'].split(':')[0]} = {curve['exact_tv']:.4f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(n[0], n[-1])
    ax.set_ylim(3e-4, 1.5)
    ax.set_xlabel("number of samples N (speculative steps)")
    ax.set_ylabel("empirical total variation T_N to the target softmax")
    ax.set_title("First emitted token: empirical TV against N")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower left")
    return fig


def main(out_dir=DEFAULT_OUT_DIR) -> list:
    """Draw the figure into ``out_dir``; returns the paths written (PNG, JSON)."""
    return render(NAME, compute, draw, out_dir)


if __name__ == "__main__":
    run_as_script(main)
