"""One speculative step (SPEC §3; Leviathan et al. 2022, Algorithm 1; Chen et al. 2023).

Leviathan et al. notation: ``p`` is the **target**, ``q`` the **draft**.  (Chen et
al. use the letters the other way round; the names ``p_target``/``q_draft`` below
cannot be swapped by accident.)

Indexing: the paper counts draft positions 1..K; the arrays here count 0..K-1, so
row ``i`` of ``q_draft`` is the draft distribution ``x_{i+1}`` was drawn from, row
``i`` of ``p_target`` is the target distribution for the same prefix, and row ``K``
of ``p_target`` is the bonus row (the prefix with all K draft tokens).

Why it is exact, at one position: the accepted mass is ``q(x) min(1, p(x)/q(x)) =
min(p(x), q(x))``; rejection has mass ``1 - sum min(p, q) = sum max(0, p - q)``; the
residual gives each token back exactly its missing ``max(0, p(x) - q(x))``.

Works on float64 rows (any array backend; the rows are moved to the host once,
since the step's work is K scalar comparisons and one draw) and on NumPy object
arrays of ``Fraction``, where every quantity is exact.
"""

from __future__ import annotations

import numpy as np

from specref.core.backend import to_numpy
from specref.core.draws import check_rng, draw  # re-exported: their home is specref.core.draws
from specref.core.errors import SpecrefError, check_prob_rows, check_tokens
from specref.core.numbers import is_exact

__all__ = [
    "speculative_step",
    "accepted_mass",
    "acceptance_rate",
    "residual_mass",
    "residual",
    "RESIDUAL_TOL",
    "residual_weights",
    "residual_usable",
    "normalised",
    "correction_weights",
    "correction_row",
    "check_step_inputs",
    "check_rng",
    "draw",
]

RESIDUAL_TOL = 1e-12
"""A float residual with mass <= this is rounding noise: the correction then draws
from ``p`` itself.  A rejection is only possible there through rounding (its
probability equals the residual mass), so either choice moves the law by at most
~1e-12, and dividing by ~0 is never done.  With ``Fraction`` rows the residual mass
is exactly 0 whenever rejection is impossible, and this tolerance is not used."""


def accepted_mass(p, q):
    """``min(p, q)`` per token: the mass that the accept test lets through.  ``[V] -> [V]``"""
    p, q = _pair(p, q)
    return np.minimum(p, q)


def acceptance_rate(p, q):
    """``alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q)``: probability one draft token is accepted."""
    return accepted_mass(p, q).sum()


def residual_mass(p, q):
    """``sum_x max(0, p(x) - q(x))``: the rejection probability, ``1 - alpha``."""
    p, q = _pair(p, q)
    return residual_weights(p, q).sum()


def residual(p, q):
    """The normalised residual ``max(0, p - q) / sum max(0, p - q)``.  ``[V] -> [V]``

    Raises ``SpecrefError`` when the residual mass is 0 (exact) or <= ``RESIDUAL_TOL``
    (float): then ``p`` and ``q`` agree, rejection cannot happen, and the residual is
    undefined (0/0).
    """
    p, q = _pair(p, q)
    r = normalised(residual_weights(p, q))
    if r is None:
        raise SpecrefError(
            f"residual undefined: its mass sum max(0, p - q) = {residual_mass(p, q)!r} is "
            f"{'0' if is_exact(p) else f'<= RESIDUAL_TOL = {RESIDUAL_TOL}'}, so p and q agree and rejection cannot happen"
        )
    return r


def speculative_step(p_target, q_draft, draft_tokens, rng, *, check: bool = True) -> list[int]:
    """Accept draft tokens until the first rejection; then a residual or a bonus token.

    - ``p_target``: ``[K+1, V]`` target distributions for the K+1 prefixes (one target call).
    - ``q_draft``: ``[K, V]`` draft distributions that ``draft_tokens`` were drawn from.
    - ``draft_tokens``: ``[K]`` ints; ``draft_tokens[i] ~ q_draft[i]``.
    - ``rng``: anything with ``random()`` (a uniform in [0, 1), only compared with
      thresholds) and ``choice(n, p=probs)``: a ``numpy.random.Generator``, or the exact
      enumerator's generator.

    Returns the emitted tokens, 1 to K+1 of them.

    Edge cases:

    - ``q(x_i) = 0``: the draft cannot have proposed ``x_i``; SpecrefError.
    - ``p(x_i) = 0``: the ratio is 0, so ``x_i`` is always rejected.
    - ``p = q``: every ratio is 1, every token accepted; the residual (0/0) is never evaluated.
    - residual mass positive only through rounding (float, <= RESIDUAL_TOL): the
      correction draws from ``p_i`` instead of dividing by ~0.
    - rejection at position 1 emits one token; all K accepted emit K+1 (the bonus
      from ``p_target[K]``); K = 1 is the same algorithm with one draft token.

    Set ``check=False`` only when the rows come from :mod:`specref.core.sampling` already.
    """
    if check:
        p_target, q_draft, draft_tokens = check_step_inputs(p_target, q_draft, draft_tokens)
        check_rng(rng)
    else:
        p_target, q_draft = to_numpy(p_target), to_numpy(q_draft)
    K, V = q_draft.shape
    emitted: list[int] = []
    # 3. accept x_1..x_K in order, until the first rejection
    for i in range(K):  # 0-based: paper position i + 1
        x = int(draft_tokens[i])
        u = rng.random()
        if u < p_target[i, x] / q_draft[i, x]:  # P(accept) = min(1, p(x)/q(x))
            emitted.append(x)
            continue
        # 4a. rejected: draw the correction from the residual; later draft tokens are discarded
        emitted.append(draw(rng, correction_row(p_target[i], q_draft[i])))
        return emitted
    # 4b. all K accepted: the bonus token comes from the (K+1)-th target row
    emitted.append(draw(rng, p_target[K]))
    return emitted


# ---------------------------------------------------------------- the residual, written once
# Every rejection in specref draws from what these functions return: the step below,
# the tree verifiers (specref.core.tree_verify) on host rows, and the batched and
# vectorised samplers (specref.decoding) on [..., V] rows of any array-API backend.


def residual_weights(p, q, *, xp=np):
    """``max(0, p - q)``, the unnormalised residual.  ``[..., V], [..., V] -> [..., V]``

    Its zeros are ``0 * p``, so Fraction rows stay Fraction and no float 0 enters
    them.  ``xp``: the rows' array-API namespace (NumPy for host and Fraction rows).
    """
    return xp.maximum(p - q, 0 * p)


def residual_usable(mass, *, exact: bool):
    """Whether a residual of total ``mass`` is drawn from.  ``[...] -> [...]`` bool

    Exact rows: ``mass > 0``.  Float rows: ``mass > RESIDUAL_TOL`` -- at or below it a
    rejection was possible only through rounding, so the caller draws from ``p``
    instead of dividing by ~0 (SPEC §3; see ``RESIDUAL_TOL``).
    """
    return mass > 0 if exact else mass > RESIDUAL_TOL


def normalised(w):
    """``w / sum(w)`` for one host row, or None when that mass is not usable.  ``[V] -> [V] | None``

    "Usable" is :func:`residual_usable`: the mass is not 0, nor (float rows) rounding noise.
    """
    mass = w.sum()
    return w / mass if residual_usable(mass, exact=is_exact(w)) else None


def correction_weights(w, p, *, xp, exact: bool):
    """The unnormalised rows a rejection draws from: ``w`` where its mass is usable, else ``p``.

    ``w [..., V]`` are residual weights (:func:`residual_weights`, or the point-mass
    residual ``p`` without the draft token), ``p [..., V]`` the target rows -> ``[..., V]``.
    Never normalised: :func:`specref.core.draws.categorical` needs only a positive total,
    so nothing divides by a mass that may be tiny.
    """
    mass = xp.sum(w, axis=-1, keepdims=True)
    return xp.where(residual_usable(mass, exact=exact), w, p)


def correction_row(p, q, *, normalise_fallback: bool = False):
    """The row a rejected position draws its correction from.  ``[V], [V] -> [V]``

    The normalised residual ``max(0, p - q) / sum``; when that mass is 0 or, for float
    rows, at most ``RESIDUAL_TOL`` (a rejection only rounding made possible): ``p``
    itself, or with ``normalise_fallback=True`` ``p / sum(p)`` (None if that mass is
    not usable either) -- for callers whose ``p`` is a scaled row (block verification).
    """
    r = normalised(residual_weights(p, q))
    if r is not None:
        return r
    return normalised(p) if normalise_fallback else p


def _pair(p, q):
    p, q = to_numpy(p), to_numpy(q)
    p, q = check_prob_rows("p", p), check_prob_rows("q", q)  # float32/16 rows: renormalised float64
    for name, row in (("p", p), ("q", q)):
        if row.ndim != 1:
            raise SpecrefError(f"{name} must be one distribution of shape [V], got shape {row.shape}")
    if p.shape != q.shape:
        raise SpecrefError(f"p and q must have the same vocabulary size, got {p.shape[0]} and {q.shape[0]}")
    if is_exact(p) != is_exact(q):
        raise SpecrefError("p and q must both be Fraction (object) rows or both float rows")
    return p, q


def check_step_inputs(p_target, q_draft, draft_tokens):
    """Validated host rows ``(p_target [K+1, V], q_draft [K, V], tokens [K])`` for one step.

    Float rows come back as float64.  Both sides must be of one kind (the loops
    make them so with :func:`specref.core.numbers.same_kind`).
    """
    q_draft = to_numpy(q_draft)
    p_target = to_numpy(p_target)
    if getattr(q_draft, "ndim", None) != 2 or q_draft.shape[0] < 1:
        raise SpecrefError(
            f"q_draft must have shape [K, V] with K >= 1, got {getattr(q_draft, 'shape', type(q_draft).__name__)}"
        )
    K, V = q_draft.shape
    if getattr(p_target, "ndim", None) != 2:
        raise SpecrefError(f"p_target must have shape [K+1, V] = [{K + 1}, {V}], got {getattr(p_target, 'shape', None)}")
    if p_target.shape[1] != V:
        raise SpecrefError(f"vocabulary mismatch: p_target has V={p_target.shape[1]}, q_draft has V={V}")
    if p_target.shape[0] != K + 1:
        raise SpecrefError(f"p_target must have K+1 = {K + 1} rows for K = {K} draft rows (q_draft), "
                           f"got {p_target.shape[0]}")
    if is_exact(p_target) != is_exact(q_draft):
        raise SpecrefError("p_target and q_draft must both be Fraction (object) rows or both float rows")
    p_target = check_prob_rows("p_target", p_target)  # float32/16 rows: renormalised float64
    q_draft = check_prob_rows("q_draft", q_draft)
    tokens = check_tokens("draft_tokens", draft_tokens, V, length=K)
    for i, x in enumerate(tokens):
        if q_draft[i, x] == 0:
            raise SpecrefError(
                f"draft_tokens[{i}] = {x} has q_draft[{i}, {x}] = 0: the draft cannot have proposed it"
            )
    if not is_exact(p_target):
        p_target, q_draft = p_target.astype(np.float64), q_draft.astype(np.float64)
    return p_target, q_draft, tokens

