"""A whole speculative block preserves the target law of sequences (SPEC §3, §4).

V = 2 tokens, K = 2 draft tokens.  The target is ``p1(t1)`` at the first position and
``p2(t2 | t1)`` at the second; the draft is ``q1(x1)`` and ``q2(x2 | x1)``; the bonus
row ``p3(· | x1, x2)`` is scored by the same target call.  One iteration:

1. draft ``x1 ~ q1`` and ``x2 ~ q2(· | x1)``;
2. one target call gives ``p1``, ``p2(· | x1)``, ``p3(· | x1, x2)``;
3. accept ``x1`` with probability ``min(1, p1/q1)``, then ``x2`` with
   ``min(1, p2/q2)``, stopping at the first rejection;
4. on a rejection emit one token from the residual at that position (and discard
   ``x2`` if it was ``x1`` that fell); if both were accepted emit a bonus ``~ p3``.

The block holds 1 to 3 tokens.  Cut to its first 2 tokens, or completed to 2 by
target sampling (``t2 ~ p2(· | t1)``) when it holds only one, its law must be the
target law ``p1(t1)·p2(t2 | t1)``.  Each row pair is split by the ordering of ``p``
against ``q`` (5 feasible patterns for V = 2), so 5³ = 125 cases in all.
Leviathan et al. notation (p target, q draft); tokens and positions are 0-based in
code, positions 1-based in the text.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import sympy as sp

from proofs.core import (
    INFEASIBLE,
    Case,
    CaseOutcome,
    Result,
    check_zero,
    is_identically_zero,
    until_first_failure,
)
from proofs.step_law import ORDERINGS, accepted, rejected, residual, row_case

__all__ = ["block_law", "target_law", "prove_block_law", "VOCAB", "DRAFT_LEN"]

VOCAB = 2  # tokens 0 and 1
DRAFT_LEN = 2  # K
TOKENS = range(VOCAB)


def _bonus_case(x1: int, x2: int) -> Case:
    """The bonus row ``p3(· | x1, x2) = (c, 1 - c)`` with ``0 <= c <= 1``."""
    c = sp.Symbol(f"c_{x1}{x2}", nonnegative=True)
    return Case(f"p3|{x1}{x2}", (c,), {f"p3|{x1}{x2}": [c, 1 - c]}, domain=(c <= 1,))


def block_law(case: Case, correction=residual) -> dict:
    """Law of the first two tokens one iteration yields  # -> {(t1, t2): probability}

    ``case`` holds the rows ``p1, q1`` (labels ``"p1"``, ``"q1"``), ``p2|x1, q2|x1``
    and ``p3|x1x2``.  Branches whose probability is 0 in this case are skipped before
    their residual is built (a residual of ``p = q`` is 0/0 and is never evaluated).
    """
    rows = case.rows
    p1, q1 = rows["p1"], rows["q1"]
    p2 = {x: rows[f"p2|{x}"] for x in TOKENS}
    q2 = {x: rows[f"q2|{x}"] for x in TOKENS}
    law = defaultdict(lambda: sp.Integer(0))

    def emit(weight, prefix, next_row):
        """Emit ``prefix`` then one token ``~ next_row()``; cut or complete to 2 tokens."""
        weight = case.apply(weight)
        if is_identically_zero(weight):
            return
        for y, p_y in enumerate(next_row()):
            block = prefix + (y,)
            if len(block) >= 2:  # cut: later tokens do not change the 2-token law
                law[block[:2]] += weight * case.apply(p_y)
            else:  # complete by target sampling: t2 ~ p2(· | t1)
                for t2 in TOKENS:
                    law[(y, t2)] += weight * case.apply(p_y) * p2[y][t2]

    for x1, x2 in itertools.product(TOKENS, TOKENS):  # 1. draft x1 ~ q1, x2 ~ q2(· | x1)
        if q1[x1] == 0 or q2[x1][x2] == 0:
            continue  # never drafted
        drafted = q1[x1] * q2[x1][x2]
        keep1 = accepted(p1[x1], q1[x1]) / q1[x1]  # min(1, p1/q1)
        drop1 = rejected(p1[x1], q1[x1]) / q1[x1]
        keep2 = accepted(p2[x1][x2], q2[x1][x2]) / q2[x1][x2]
        drop2 = rejected(p2[x1][x2], q2[x1][x2]) / q2[x1][x2]
        # 3-4. first rejection at position 1: residual there; x2 is discarded
        emit(drafted * drop1, (), lambda: correction(p1, q1))
        # first rejection at position 2: x1 is kept, residual at position 2
        emit(drafted * keep1 * drop2, (x1,), lambda x1=x1: correction(p2[x1], q2[x1]))
        # both accepted: x1, x2, and a bonus token from p3(· | x1, x2)
        emit(drafted * keep1 * keep2, (x1, x2), lambda x1=x1, x2=x2: rows[f"p3|{x1}{x2}"])
    return dict(law)


def target_law(case: Case) -> dict:
    """Target sampling of 2 tokens: ``p1(t1)·p2(t2 | t1)``."""
    rows = case.rows
    return {(t1, t2): rows["p1"][t1] * rows[f"p2|{t1}"][t2] for t1, t2 in itertools.product(TOKENS, TOKENS)}


def _feasible_rows(tag: str, label: str):
    """The feasible ordering patterns of one row pair, as solved cases."""
    cases, ruled_out = [], 0
    for pattern in itertools.product(ORDERINGS, repeat=VOCAB):
        case, why_not = row_case(pattern, tag, label)
        if why_not is None:
            cases.append(case)
        else:
            ruled_out += 1
    return cases, ruled_out


def prove_block_law(correction=residual) -> Result:
    """SPEC §3/§4: V = 2, K = 2, every ordering at every position."""
    first, ruled_out = _feasible_rows("1", "1")
    second = {x: _feasible_rows(f"2{x}", f"2|{x}")[0] for x in TOKENS}
    bonus = [_bonus_case(x1, x2) for x1, x2 in itertools.product(TOKENS, TOKENS)]
    outcomes = [
        CaseOutcome(
            "orderings with Σp ≠ Σq",
            INFEASIBLE,
            f"{ruled_out} of {len(ORDERINGS) ** VOCAB} orderings per row pair cannot sum to 1 on both sides",
        )
    ]

    def each_case():
        for c1, c20, c21 in itertools.product(first, second[0], second[1]):
            case = c1.merge(c20).merge(c21)
            for b in bonus:
                case = case.merge(b)
            case = Case(f"{c1.name}; {c20.name}; {c21.name}", case.base, case.rows, case.solved, case.domain)
            spec_law, target = block_law(case, correction), target_law(case)
            diffs = {f"law{t} = target{t}": spec_law.get(t, 0) - target[t] for t in target}
            yield check_zero(case.name, diffs, case)

    outcomes.extend(until_first_failure(each_case()))
    return Result(
        title="Two-token block law (V = 2, K = 2)",
        spec="SPEC §3, §4",
        statement=(
            "One iteration with K = 2 (draft x1 ~ q1, x2 ~ q2(·|x1); accept until the first "
            "rejection; residual or bonus), cut to 2 tokens or completed to 2 by target "
            "sampling, emits (t1, t2) with probability p1(t1)·p2(t2|t1)."
        ),
        assumptions=(
            "V = 2; p1, q1, p2(·|t), q2(·|t), p3(·|t1,t2) are symbolic rows, non-negative, each summing to 1",
            "the rows at the second position depend on the first token (independent symbols per t)",
            "every row pair is split by the ordering of p against q: "
            + "; ".join(o.format(i="_i") for o in ORDERINGS.values()),
            "a token with q = 0 is never drafted; a branch of probability 0 is never evaluated",
        ),
        cases=tuple(outcomes),
    )
