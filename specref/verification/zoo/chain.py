"""Named implementations of speculative decoding: wrong, approximate and correct (SPEC §7).

Leviathan et al. notation: ``p`` is the **target**, ``q`` the **draft** (Leviathan,
Kalman & Matias 2022, Algorithm 1; Chen et al. 2023).  Arrays are 0-based: row ``i``
of ``q_draft`` / ``p_target`` belongs to draft position ``i + 1``; row ``K`` of
``p_target`` is the bonus row.

Every entry of :data:`ZOO` is a :class:`ZooEntry`: a name, the protocol level it is
written at, the function, its kind, the SPEC §7 item it commits, a one-line
description and the verification modes it supports.  The oracle (and the tests)
check the functions; nothing here checks itself.

Protocol levels (the shapes the oracle drives):

- ``"step"``: ``fn(p_target [K+1, V], q_draft [K, V], draft_tokens [K], rng) -> 1..K+1 tokens``;
  rows are float64 or object arrays of ``Fraction``.  The reference is
  :func:`specref.core.step.speculative_step`.
- ``"logits"``: ``fn(target_logits [K+1, V], draft_logits [K, V], draft_tokens [K], config, rng)``;
  the function applies the sampling rules (:class:`~specref.core.sampling.SamplingConfig`)
  itself, which is where processor bugs live.  The draft tokens it receives were
  drawn from ``specref.core.sampling.process(draft_logits, config)``.
- ``"decoder"``: ``fn(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng)
  -> list[int]``, models as in :mod:`specref.decoding.chain`.  Decoders reuse
  :mod:`specref.decoding.chain`; only the entries whose bug lives in the loop have a loop here.

Modes: ``"exact"`` -- all randomness comes from the ``rng`` passed in, through
``rng.random()`` (compared with thresholds only) and ``rng.choice(n, p=...)``, so
:func:`specref.verification.laws.enumeration.law` can enumerate it; ``"statistical"`` -- ``rng`` is an
integer seed and the function draws its own random numbers.  Every entry that
supports exact mode also takes an integer seed (it then draws from
``numpy.random.default_rng(seed)``), so each one can be sampled as a black box too.

The catalogue (``python -c "import specref.verification.zoo.chain as z; [print(e) for e in z.entries()]"``):

==  ===========================  =======  ======================================================
§7  name                         level    what is wrong
==  ===========================  =======  ======================================================
1   residual_from_p              step     correction drawn from p_i, not the residual
2   fallback_to_draft_token      step     no correction: the rejected draft token is kept
2   fallback_to_argmax           step     no correction: argmax p_i is emitted
3   deterministic_accept         step     accept iff p >= q; no random 1 - p/q rejection
4   no_truncation                step     every position judged; rejected ones replaced, no stop
5   bonus_from_p_K               step     bonus drawn from p_K instead of p_{K+1}
5   bonus_from_draft             decoder  bonus replaced by an unverified (K+1)-th draft token
6   off_by_one_rows              step     draft token i judged against target row i+1
7   top_p_target_only            logits   top-p left off the draft side of the test
7   temperature_draft_only       logits   temperature applied to the draft only
7   rules_reordered              logits   target truncated before temperature, draft after
8   raw_acceptance               logits   accept ratio from raw softmax, sampling processed
9   residual_unnormalised        step     residual never normalised (inverse-CDF sampler)
9   residual_wrong_axis          step     residual normalised over positions, not tokens
10  eos_mid_block_continues      decoder  stop token mid-block does not end generation
10  max_length_leak              decoder  last block not cut at max_new_tokens
11  residual_clipped_after_norm  step     p - q normalised by its L1 norm, then clipped
12  kv_cache_not_rolled_back     decoder  the context keeps discarded draft tokens
12  kv_cache_refeeds_prefix      decoder  the whole prefix fed again on top of the target's cache
-   typical_acceptance           step     (approximate) Medusa typical acceptance
-   lenience                     step     (approximate) accept with min(1, p / (l q)), l = 0.5
-   reference                    step     (correct) specref.core.step.speculative_step
-   exponential_race             step     (correct, statistical) argmax(w / E) recovery
==  ===========================  =======  ======================================================

Decisions where the bug's description leaves room (each also at its function):

- §7.9 and §7.11 leave a vector that does not sum to 1; ``rng.choice`` would raise on
  it, so these entries sample it the way a hand-written sampler does: inverse CDF,
  ``u = rng.random()`` against the cumulative sums, falling back to the last token.
- §7.11: the literal "divide p - q by its sum" divides by 0 (the sum is exactly 0), a
  crash rather than a distribution; the entry divides by the L1 norm ``sum |p - q|``
  (twice the residual mass) and clips afterwards, so the kept part sums to 1/2.
- §7.12 is simulated by a decoder whose one context (the "KV cache" both models read)
  keeps all K drafted tokens after a rejection and appends the correction behind
  them.  With a bigram model the last token -- the correction -- is right anyway;
  the bug shows with models that look two or more tokens back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Callable

import numpy as np

from specref.core.backend import to_numpy
from specref.core.draws import coerce_rng
from specref.core.errors import SpecrefError, check_positive_int
from specref.core.numbers import is_exact, same_kind
from specref.core.sampling import SamplingConfig, process, process_probs
from specref.core.step import correction_row, draw, speculative_step
from specref.decoding.chain import model_rows, next_token_probs, speculative_block, speculative_decode

__all__ = [
    "ZooEntry",
    "ZOO",
    "entries",
    "LEVELS",
    "KINDS",
    "MODES",
    # correct
    "reference",
    "exponential_race",
    # approximate
    "typical_acceptance",
    "lenience",
    # wrong, probability level
    "residual_from_p",
    "fallback_to_draft_token",
    "fallback_to_argmax",
    "deterministic_accept",
    "no_truncation",
    "bonus_from_p_K",
    "off_by_one_rows",
    "residual_unnormalised",
    "residual_wrong_axis",
    "residual_clipped_after_norm",
    # wrong, logits level
    "top_p_target_only",
    "temperature_draft_only",
    "rules_reordered",
    "raw_acceptance",
    # wrong, decoders
    "bonus_from_draft",
    "eos_mid_block_continues",
    "max_length_leak",
    "kv_cache_not_rolled_back",
    "kv_cache_refeeds_prefix",
]

LEVELS = ("step", "logits", "decoder")
KINDS = ("wrong", "approximate", "correct")
MODES = ("exact", "statistical")
_BOTH = ("exact", "statistical")


@dataclass(frozen=True)
class ZooEntry:
    """One named implementation and what it is."""

    name: str  # the key in ZOO
    level: str  # "step" | "logits" | "decoder": the protocol fn is written at (module docstring)
    fn: Callable  # the implementation
    kind: str  # "wrong" | "approximate" | "correct"
    spec_item: int | None  # the SPEC §7 item a wrong entry commits; None otherwise
    description: str  # one line
    modes: tuple = _BOTH  # "exact" (drives the enumerator's rng) and/or "statistical" (integer seed)

    def __post_init__(self):
        if self.level not in LEVELS:
            raise SpecrefError(f"ZooEntry {self.name!r}: level must be one of {LEVELS}, got {self.level!r}")
        if self.kind not in KINDS:
            raise SpecrefError(f"ZooEntry {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if not self.modes or any(m not in MODES for m in self.modes):
            raise SpecrefError(
                f"ZooEntry {self.name!r}: modes must be a non-empty subset of {MODES}, got {self.modes!r}"
            )
        if (self.kind == "wrong") != (self.spec_item is not None):
            raise SpecrefError(f"ZooEntry {self.name!r}: a spec_item is given exactly for wrong entries")
        if self.spec_item is not None and not 1 <= self.spec_item <= 12:
            raise SpecrefError(f"ZooEntry {self.name!r}: spec_item must be in 1..12, got {self.spec_item!r}")
        if not self.description or "\n" in self.description:
            raise SpecrefError(f"ZooEntry {self.name!r}: the description must be one non-empty line")

    def __str__(self) -> str:
        item = f"§7.{self.spec_item}" if self.spec_item else "-"
        return f"{self.name:28s} {self.level:8s} {self.kind:12s} {item:6s} {self.description}"


# ----------------------------------------------------------------------------- shared pieces


def _rows(p_target, q_draft):
    """Host copies of the rows; one exact and one float side are compared in float64."""
    return same_kind(to_numpy(p_target), to_numpy(q_draft))


def _inverse_cdf(rng, weights) -> int:
    """A hand-written sampler: the first ``j`` with ``u < cumsum(weights)[j]``, else the last token.

    Right only when ``weights`` sums to 1 -- the entries that use it hand it vectors that do not.
    """
    u = rng.random()
    for j, c in enumerate(np.cumsum(weights)):
        if u < c:
            return j
    return len(weights) - 1


def _accept(rng, p, q, i, x) -> bool:  # P(accept) = min(1, p_i(x) / q_i(x))
    return rng.random() < p[i, x] / q[i, x]


def _correct(rng, p, q, i, x) -> int:  # the residual norm(max(0, p_i - q_i))
    return draw(rng, correction_row(p[i], q[i]))


def _bonus(rng, p, q) -> int:  # the bonus row is p_target[K]
    return draw(rng, p[q.shape[0]])


def _step_loop(p_target, q_draft, draft_tokens, rng, *, accept=_accept, correct=_correct, bonus=_bonus):
    """Algorithm 1's loop with pluggable pieces: accept test, correction, bonus.

    With the defaults it is the reference step; each wrong entry swaps exactly one piece,
    so its bug is the only line that differs.  ``rng`` may be an integer seed.
    """
    rng = coerce_rng(rng)
    p, q = _rows(p_target, q_draft)
    out: list[int] = []
    for i in range(q.shape[0]):
        x = int(draft_tokens[i])
        if accept(rng, p, q, i, x):
            out.append(x)
            continue
        out.append(int(correct(rng, p, q, i, x)))
        return out
    out.append(int(bonus(rng, p, q)))
    return out


# ----------------------------------------------------------------------------- correct


def reference(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """:func:`specref.core.step.speculative_step`, also taking an integer seed (statistical mode)."""
    return speculative_step(p_target, q_draft, draft_tokens, coerce_rng(rng))


def exponential_race(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """Speculative step written independently of :mod:`specref.core.step` (statistical mode only).

    ``rng`` is an integer seed; the step draws from its own ``np.random.default_rng(seed)``.
    Acceptance is the usual ``u < p(x)/q(x)`` (written ``u q(x) < p(x)``).  The token
    after a rejection is recovered as some serving engines do it, by an *exponential
    race*: ``argmax_j w_j / E_j`` with ``E_j ~ Exp(1)`` iid, where ``w = max(0, p - q)``
    unnormalised.  ``E_j / w_j`` is exponential with rate ``w_j``, and the smallest of
    independent exponentials is ``j`` with probability ``w_j / sum(w)``: a residual
    sample with no division by the residual mass.  The bonus token is a race on
    ``p_{K+1}`` (``argmax p / E`` is a sample from ``p``).
    """
    if isinstance(rng, bool) or not isinstance(rng, (int, np.integer)):
        raise SpecrefError(
            f"exponential_race runs in statistical mode only: rng must be an integer seed, got {type(rng).__name__}"
        )
    gen = np.random.default_rng(int(rng))
    p = np.asarray(to_numpy(p_target), dtype=np.float64)  # [K+1, V]
    q = np.asarray(to_numpy(q_draft), dtype=np.float64)  # [K, V]
    K = int(q.shape[0])
    u = gen.random(K)  # one uniform per draft position
    out: list[int] = []
    for i in range(K):
        x = int(draft_tokens[i])
        if u[i] * q[i, x] < p[i, x]:  # P(accept) = min(1, p/q)
            out.append(x)
            continue
        w = np.maximum(p[i] - q[i], 0.0)  # [V]; the race needs no normalisation
        if not (w > 0).any():  # a rejection reachable only through rounding (p ~ q): draw from p
            w = p[i]
        out.append(_race(gen, w))
        return out
    out.append(_race(gen, p[K]))
    return out


def _race(gen, w) -> int:
    """``argmax_j w_j / E_j``, ``E_j ~ Exp(1)`` iid: ``j`` wins with probability ``w_j / sum(w)``."""
    return int(np.argmax(w / gen.exponential(size=w.shape[0])))


# ----------------------------------------------------------------------------- approximate


def typical_acceptance(eps: float = 0.09, delta: float = 0.3):
    """Medusa's typical acceptance (Cai et al. 2024, Medusa; its `evaluate_posterior`) as a step; a factory.

    Accept ``x_i`` iff ``p_i(x_i) > min(eps, delta * exp(-H(p_i)))`` (``H`` the entropy in
    nats, ``0 log 0 = 0``): no draft probability, no randomness in the test.  On the
    first failure emit a token drawn from ``p_i`` (what the next Medusa round does: its
    first token is the base model's own sample) and stop; if all ``K`` pass, the bonus
    is drawn from ``p_{K+1}``.  Defaults follow Medusa's code (``posterior_threshold =
    0.09`` as the hard threshold ``eps``, ``posterior_alpha = 0.3 = sqrt(0.09)`` as the
    entropy factor ``delta``); with ``eps = 0.3, delta = 0.09`` the hard threshold could
    never bind (``delta exp(-H) <= 0.09``).  Medusa's ``log(p + 1e-5)`` entropy guard is
    replaced by the exact entropy.
    """
    eps, delta = float(eps), float(delta)
    if not (eps > 0 and delta > 0):
        raise SpecrefError(f"typical_acceptance needs eps > 0 and delta > 0, got eps={eps!r}, delta={delta!r}")

    def accept(rng, p, q, i, x):  # no draft probability, no randomness in the test
        row = p[i].astype(np.float64)
        nz = row[row > 0]
        entropy = float(-(nz * np.log(nz)).sum())
        return p[i, x] > min(eps, delta * np.exp(-entropy))

    def typical_step(p_target, q_draft, draft_tokens, rng) -> list[int]:
        return _step_loop(p_target, q_draft, draft_tokens, rng, accept=accept,
                          correct=lambda rng, p, q, i, x: draw(rng, p[i]))

    typical_step.__name__ = typical_step.__qualname__ = f"typical_acceptance_eps{eps:g}_delta{delta:g}"
    return typical_step


def lenience(l: float = 0.5):  # noqa: E741 -- the paper's letter
    """Leviathan et al. (2022)'s lenient acceptance with factor ``0 < l <= 1``; a factory.

    Accept ``x_i`` with probability ``min(1, p_i(x_i) / (l q_i(x_i)))``: the per-position
    acceptance rate becomes ``alpha_l = sum min(p / l, q)`` (SPEC §10).  On the first
    rejection the token comes from the unchanged residual ``norm(max(0, p_i - q_i))``
    (only the acceptance test is lenient here; a variant that also rescales the
    residual to ``max(0, p - l q)`` is a different algorithm), then the block stops; all ``K`` accepted gives a bonus from ``p_{K+1}``.  ``l = 1``
    is exactly the reference algorithm.  Exact rows keep ``l`` as a ``Fraction``.
    """
    if isinstance(l, bool) or not isinstance(l, (int, float, Fraction, np.floating)) or not 0 < l <= 1:
        raise SpecrefError(f"lenience l must be a number in (0, 1], got {l!r}")

    def accept(rng, p, q, i, x):  # P(accept) = min(1, p / (l q))
        lq = Fraction(l) if is_exact(p) else float(l)
        return rng.random() < p[i, x] / (lq * q[i, x])

    def lenient_step(p_target, q_draft, draft_tokens, rng) -> list[int]:
        return _step_loop(p_target, q_draft, draft_tokens, rng, accept=accept)

    lenient_step.__name__ = lenient_step.__qualname__ = f"lenience_{float(l):g}"
    lenient_step.l = l  # type: ignore[attr-defined]
    return lenient_step


# ----------------------------------------------------------------------------- wrong: probability level
# Each is the reference loop (`_step_loop`) with one piece replaced, marked "BUG (§7.n)".


def residual_from_p(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.1: on rejection the correction is drawn from ``p_i`` instead of the residual."""
    # BUG (§7.1): must be norm(max(0, p_i - q_i)); p_i counts the accepted mass twice
    return _step_loop(p_target, q_draft, draft_tokens, rng, correct=lambda rng, p, q, i, x: draw(rng, p[i]))


def fallback_to_draft_token(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.2: no correction; on rejection the draft token is emitted anyway and the block ends."""
    # BUG (§7.2): "keep the draft token" -- the first token of every block is then ~ q_1
    return _step_loop(p_target, q_draft, draft_tokens, rng, correct=lambda rng, p, q, i, x: x)


def fallback_to_argmax(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.2: no correction; on rejection the target's argmax is emitted (greedy fallback)."""
    # BUG (§7.2): a deterministic token instead of a residual sample
    return _step_loop(p_target, q_draft, draft_tokens, rng, correct=lambda rng, p, q, i, x: np.argmax(p[i]))


def deterministic_accept(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.3: accept iff ``p(x) >= q(x)``; tokens with ``p < q`` are always rejected."""
    # BUG (§7.3): when p < q, x must still be accepted with probability p/q
    return _step_loop(p_target, q_draft, draft_tokens, rng, accept=lambda rng, p, q, i, x: p[i, x] >= q[i, x])


def no_truncation(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.4: all K positions judged at once (vectorised); rejected ones replaced, nothing discarded."""
    rng = coerce_rng(rng)
    p, q = _rows(p_target, q_draft)
    K = q.shape[0]
    x = [int(t) for t in draft_tokens]
    accepted = [_accept(rng, p, q, i, x[i]) for i in range(K)]  # [K] accept mask
    # BUG (§7.4): tokens = where(accepted, draft, recovered) over all K positions.  After the
    # first rejection, rows i+1.. were computed for a prefix holding the *discarded* x_i, so
    # every later position must be dropped, not judged.
    out = [x[i] if accepted[i] else _correct(rng, p, q, i, x[i]) for i in range(K)]
    out.append(_bonus(rng, p, q))
    return out


def bonus_from_p_K(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.5: the bonus token is drawn from ``p_K`` (the last judged row), not ``p_{K+1}``."""
    # BUG (§7.5): p_target[K-1] scored x_K; the bonus row is p_target[K]
    return _step_loop(p_target, q_draft, draft_tokens, rng, bonus=lambda rng, p, q: draw(rng, p[q.shape[0] - 1]))


def off_by_one_rows(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.6: draft token ``i`` is judged against target row ``i + 1`` (the prefix that already holds it)."""
    # BUG (§7.6): a training-style shift (logits[:, :-1] vs labels[:, 1:]) applied where none is due:
    # p_target[i] already is the distribution of x_{i+1}; p_target[i + 1] is one prefix too long.
    return _step_loop(
        p_target, q_draft, draft_tokens, rng,
        accept=lambda rng, p, q, i, x: rng.random() < p[i + 1, x] / q[i, x],
        correct=lambda rng, p, q, i, x: draw(rng, correction_row(p[i + 1], q[i])),
    )


def residual_unnormalised(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.9: residual ``max(0, p - q)`` never normalised; inverse-CDF sampling gives the rest to the last token."""
    # BUG (§7.9): sums to the rejection mass, not 1: never divided; u beyond the total falls to token V-1
    return _step_loop(p_target, q_draft, draft_tokens, rng,
                      correct=lambda rng, p, q, i, x: _inverse_cdf(rng, np.maximum(p[i] - q[i], 0 * p[i])))


def residual_wrong_axis(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.9: the ``[K, V]`` residual matrix normalised over positions (axis 0) instead of tokens."""

    def correct(rng, p, q, i, x):
        K = q.shape[0]
        diff = np.maximum(p[:K] - q, 0 * q)  # [K, V], all positions at once
        total = diff.sum(axis=0, keepdims=True)  # BUG (§7.9): axis=0 sums over positions; must be axis=-1 (tokens)
        residuals = diff / np.where(total > 0, total, 1)  # [K, V]; the guard against 0/0 hides the bug
        return _inverse_cdf(rng, residuals[i])  # rows need not sum to 1: inverse CDF, as a hand-written sampler

    return _step_loop(p_target, q_draft, draft_tokens, rng, correct=correct)


def residual_clipped_after_norm(p_target, q_draft, draft_tokens, rng) -> list[int]:
    """§7.11: ``p - q`` normalised by its L1 norm, then clipped: sums to 1/2, the rest to the last token."""

    def correct(rng, p, q, i, x):
        diff = p[i] - q[i]  # signed: sums to 0, so it is "normalised" by its L1 norm instead of its sum
        diff = diff / np.abs(diff).sum()  # > 0 here: a rejection needs some p < q
        diff = np.maximum(diff, 0 * diff)  # BUG (§7.11): clipping after normalising leaves mass 1/2, not 1
        return _inverse_cdf(rng, diff)  # the missing half falls through to token V-1

    return _step_loop(p_target, q_draft, draft_tokens, rng, correct=correct)


# ----------------------------------------------------------------------------- wrong: logits level
# Each processes the logits itself and then runs the reference step on its rows.


def top_p_target_only(target_logits, draft_logits, draft_tokens, config: SamplingConfig, rng) -> list[int]:
    """§7.7: top-p applied to the target rows only; the test's q is not the truncated q sampled from."""
    p = process(target_logits, config)  # [K+1, V]
    q = process(draft_logits, replace(config, top_p=1.0))  # BUG (§7.7): the draft was sampled with top-p
    return speculative_step(p, q, draft_tokens, coerce_rng(rng), check=False)


def temperature_draft_only(target_logits, draft_logits, draft_tokens, config: SamplingConfig, rng) -> list[int]:
    """§7.7: temperature applied to the draft only; the target is used at temperature 1."""
    p = process(target_logits, replace(config, temperature=1.0))  # BUG (§7.7): the target needs the temperature too
    q = process(draft_logits, config)
    return speculative_step(p, q, draft_tokens, coerce_rng(rng), check=False)


def _truncate_then_temper(logits, config: SamplingConfig):
    """Another engine's order: top-k -> top-p -> min-p on softmax(logits), then temperature."""
    if config.greedy:
        return process(logits, config)
    w = process(logits, replace(config, temperature=1.0))  # truncation on the untempered distribution
    return process_probs(w, SamplingConfig(temperature=config.temperature))  # w ** (1/T), renormalised


def rules_reordered(target_logits, draft_logits, draft_tokens, config: SamplingConfig, rng) -> list[int]:
    """§7.7: target truncated (top-k/top-p/min-p) before temperature, draft in the documented order."""
    p = _truncate_then_temper(target_logits, config)  # BUG (§7.7): the documented order is temperature first
    q = process(draft_logits, config)
    return speculative_step(p, q, draft_tokens, coerce_rng(rng), check=False)


def raw_acceptance(target_logits, draft_logits, draft_tokens, config: SamplingConfig, rng) -> list[int]:
    """§7.8: acceptance ratio from the raw softmax; residual and bonus from the processed rows."""
    p, q = process(target_logits, config), process(draft_logits, config)  # what is sampled from
    p_raw, q_raw = process(target_logits, SamplingConfig()), process(draft_logits, SamplingConfig())
    # BUG (§7.8): the acceptance ratio of unprocessed probabilities
    return _step_loop(p, q, draft_tokens, rng, accept=lambda rng, p, q, i, x: rng.random() < p_raw[i, x] / q_raw[i, x])


# ----------------------------------------------------------------------------- wrong: decoders


def bonus_from_draft(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens=(), rng) -> list[int]:
    """§7.5: the draft proposes K+1 tokens; when K are accepted the (K+1)-th is emitted unverified."""
    k = check_positive_int("k", k)

    def step(p_target, q_draft, draft_tokens, rng):  # [K+2, V], [K+1, V], K+1 tokens
        emitted = speculative_step(p_target[: k + 1], q_draft[:k], draft_tokens[:k], rng, check=False)
        if len(emitted) == k + 1:  # all k accepted
            # BUG (§7.5): "the draft already has the next token" -- it is ~ q_{K+1}, not p_{K+1}
            emitted[-1] = int(draft_tokens[k])
        return emitted

    return speculative_decode(
        target, draft, prompt, k=k + 1, config=config, max_new_tokens=max_new_tokens,
        stop_tokens=stop_tokens, rng=coerce_rng(rng), step=step,
    ).tokens


def eos_mid_block_continues(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens=(), rng) -> list[int]:
    """§7.10: only a block's last token is checked for a stop token; one mid-block does not end generation."""
    rng = coerce_rng(rng)
    stops = set(int(t) for t in stop_tokens)
    out: list[int] = []
    while len(out) < max_new_tokens:
        block = speculative_block(target, draft, list(prompt) + out, k=k, config=config, rng=rng)
        out += block[: max_new_tokens - len(out)]
        if out[-1] in stops:  # BUG (§7.10): must stop at the first stop token inside the block and drop the rest
            break
    return out


def max_length_leak(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens=(), rng) -> list[int]:
    """§7.10: the last block is not cut at ``max_new_tokens``; up to K extra tokens leak out."""
    rng = coerce_rng(rng)
    stops = set(int(t) for t in stop_tokens)
    out: list[int] = []
    while len(out) < max_new_tokens:
        block = speculative_block(target, draft, list(prompt) + out, k=k, config=config, rng=rng)
        for x in block:  # BUG (§7.10): iterates the whole block; must stop once len(out) == max_new_tokens
            out.append(x)
            if x in stops:
                return out
    return out


def kv_cache_not_rolled_back(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens=(), rng) -> list[int]:
    """§7.12: after a rejection the models' context keeps all K drafted tokens, correction appended behind."""
    k = check_positive_int("k", k)
    rng = coerce_rng(rng)
    stops = set(int(t) for t in stop_tokens)
    cache = list(prompt)  # the tokens both models have "in their KV cache"
    out: list[int] = []
    while len(out) < max_new_tokens:
        # 1. draft k tokens; each one is written to the cache as it is produced
        q_rows: list = []
        drafted: list[int] = []
        for _ in range(k):
            q = next_token_probs(draft, cache + drafted, config, name="draft")
            drafted.append(draw(rng, q))
            q_rows.append(q)
        # 2. one target call over the cache + the k drafted tokens
        p_target = model_rows(target, cache + drafted, k + 1, config, name="target")  # [K+1, V]
        q_draft = np.stack(q_rows)  # [K, V]
        p_target, q_draft = same_kind(p_target, q_draft)
        # 3.-4. the reference step
        emitted = speculative_step(p_target, q_draft, drafted, rng, check=False)
        # BUG (§7.12): the cache should become cache + emitted (drop the k + 1 - len(emitted)
        # rejected and discarded draft tokens, then append the correction); instead the
        # drafted tokens stay and only the step's last token is appended.
        cache += drafted + emitted[-1:]
        for x in emitted:  # output: truncated correctly at max_new_tokens and stop tokens
            if len(out) == max_new_tokens:
                break
            out.append(x)
            if x in stops:
                return out
    return out


def kv_cache_refeeds_prefix(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens=(), rng) -> list[int]:
    """§7.12: the target's KV cache already holds the prefix, and the whole prefix is fed again on top of it.

    From the second iteration the target reads ``cache + prefix + drafts``: the prefix
    twice, every position shifted.  The last tokens are right, so a model that looks
    ``h`` tokens back cannot tell; a position-aware one can (``context="position"`` cases).
    """
    k = check_positive_int("k", k)
    rng = coerce_rng(rng)
    stops = set(int(t) for t in stop_tokens)
    cached: list[int] = []  # the tokens in the target's KV cache
    out: list[int] = []
    while len(out) < max_new_tokens:
        seq = list(prompt) + out
        q_rows: list = []
        drafted: list[int] = []
        for _ in range(k):  # 1. draft k tokens (the draft recomputes: no cache)
            q = next_token_probs(draft, seq + drafted, config, name="draft")
            drafted.append(draw(rng, q))
            q_rows.append(q)
        # 2. one target call.  BUG (§7.12): the cache holds seq[:len(cached)] already; only
        # seq[len(cached):] + drafted should be fed, so the target reads cached + seq + drafted
        context = cached + seq + drafted
        p_target, q_draft = same_kind(model_rows(target, context, k + 1, config, name="target"), np.stack(q_rows))
        emitted = speculative_step(p_target, q_draft, drafted, rng, check=False)  # 3.-4. the reference step
        cached = context[: len(context) - k + len(emitted) - 1]  # cropped to the accepted tokens
        for x in emitted:
            if len(out) == max_new_tokens:
                break
            out.append(x)
            if x in stops:
                return out
    return out


# ----------------------------------------------------------------------------- the registry


def _entries() -> list[ZooEntry]:
    """The registry in order: correct, then approximate, then wrong in §7 order."""
    return _correct_and_approximate_entries() + _wrong_entries()


def _correct_and_approximate_entries() -> list[ZooEntry]:
    E = ZooEntry
    stat = ("statistical",)
    return [
        # correct
        E("reference", "step", reference, "correct", None,
          "specref.core.step.speculative_step: accept min(1, p/q), residual max(0, p-q), bonus p_{K+1}"),
        E("exponential_race", "step", exponential_race, "correct", None,
          "independent step; residual and bonus drawn by argmax(w / E), E ~ Exp(1) (as some engines do)",
          modes=stat),
        # approximate
        E("typical_acceptance", "step", typical_acceptance(), "approximate", None,
          "Medusa typical acceptance: accept iff p(x) > min(0.09, 0.3 exp(-H(p))); else a sample from p"),
        E("lenience", "step", lenience(0.5), "approximate", None,
          "Leviathan lenience l = 0.5: accept with min(1, p / (l q)); residual max(0, p - q) on rejection"),
    ]


def _wrong_entries() -> list[ZooEntry]:
    """One wrong entry per committed bug, in SPEC §7 order."""
    E = ZooEntry
    return [
        E("residual_from_p", "step", residual_from_p, "wrong", 1,
          "correction after a rejection drawn from p_i instead of the residual max(0, p_i - q_i)"),
        E("fallback_to_draft_token", "step", fallback_to_draft_token, "wrong", 2,
          "no correction: a rejected draft token is emitted anyway and the block ends"),
        E("fallback_to_argmax", "step", fallback_to_argmax, "wrong", 2,
          "no correction: a rejection emits argmax p_i instead of a residual sample"),
        E("deterministic_accept", "step", deterministic_accept, "wrong", 3,
          "accept iff p(x) >= q(x): no random acceptance with probability p/q when p < q"),
        E("no_truncation", "step", no_truncation, "wrong", 4,
          "all K positions judged independently; rejected ones replaced, later ones kept"),
        E("bonus_from_p_K", "step", bonus_from_p_K, "wrong", 5,
          "bonus token drawn from p_K (the row that judged x_K) instead of p_{K+1}"),
        E("bonus_from_draft", "decoder", bonus_from_draft, "wrong", 5,
          "bonus replaced by an unverified (K+1)-th draft token when all K are accepted"),
        E("off_by_one_rows", "step", off_by_one_rows, "wrong", 6,
          "draft token i judged against target row i+1 (a training-style shift)"),
        E("top_p_target_only", "logits", top_p_target_only, "wrong", 7,
          "top-p applied to the target only: the test uses an untruncated q"),
        E("temperature_draft_only", "logits", temperature_draft_only, "wrong", 7,
          "temperature applied to the draft only: the target runs at temperature 1"),
        E("rules_reordered", "logits", rules_reordered, "wrong", 7,
          "target truncated (top-k/top-p/min-p) before temperature; draft in the documented order"),
        E("raw_acceptance", "logits", raw_acceptance, "wrong", 8,
          "acceptance ratio from raw softmax probabilities while sampling from processed ones"),
        E("residual_unnormalised", "step", residual_unnormalised, "wrong", 9,
          "residual max(0, p - q) not normalised; an inverse-CDF sampler gives the rest to token V-1"),
        E("residual_wrong_axis", "step", residual_wrong_axis, "wrong", 9,
          "the [K, V] residual normalised over positions (axis 0) instead of tokens"),
        E("eos_mid_block_continues", "decoder", eos_mid_block_continues, "wrong", 10,
          "a stop token accepted mid-block does not end generation (only the block's end is checked)"),
        E("max_length_leak", "decoder", max_length_leak, "wrong", 10,
          "the last block is not cut at max_new_tokens: up to K extra tokens leak"),
        E("residual_clipped_after_norm", "step", residual_clipped_after_norm, "wrong", 11,
          "p - q divided by sum|p - q|, negatives clipped afterwards: mass 1/2, rest to token V-1"),
        E("kv_cache_not_rolled_back", "decoder", kv_cache_not_rolled_back, "wrong", 12,
          "context not rolled back after a rejection: the next iteration sees the discarded tokens"),
        E("kv_cache_refeeds_prefix", "decoder", kv_cache_refeeds_prefix, "wrong", 12,
          "the whole prefix fed again on top of the target's KV cache: the prefix doubled, positions shifted"),
    ]


ZOO: dict[str, ZooEntry] = {e.name: e for e in _entries()}
"""Every named implementation, by name (correct first, then approximate, then wrong in §7 order)."""


def entries(kind: str | None = None, level: str | None = None) -> list[ZooEntry]:
    """The entries of :data:`ZOO` with the given kind and/or level, in registry order."""
    if kind is not None and kind not in KINDS:
        raise SpecrefError(f"kind must be None or one of {KINDS}, got {kind!r}")
    if level is not None and level not in LEVELS:
        raise SpecrefError(f"level must be None or one of {LEVELS}, got {level!r}")
    return [e for e in ZOO.values() if (kind is None or e.kind == kind) and (level is None or e.level == level)]
