"""The reference tree verifiers: exact laws (TV == 0 in rationals), each cross-checked by a second route."""

import itertools
from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.core.step import speculative_step
from specref.core.tree import DraftTree, chain_tree
from specref.core.tree_verify import (block_verify, kseq_rho, kseq_verify, pointmass_verify, rrs_with_replacement,
                                      rrs_without_replacement, typical_acceptance)
from specref.decoding.tree import draft_tree, tree_transition
from specref.verification.laws.enumeration import compare, law, law_iterated, target_law
from toy_models.ngram import NGramModel


def frac(*rows):
    return np.array([[F(v) for v in row] for row in rows], dtype=object)


P = frac(["1/5", "1/2", "3/10"])[0]
Q = frac(["3/5", "3/10", "1/10"])[0]


def one_node_step(verify, p, q, k, scheme):
    """The law of the emitted token at one node with k children drawn by `scheme` (enumerated)."""
    def program(rng):
        tree, q_rows, _ = draft_tree((k,), lambda path: q if not path else p, scheme, rng)
        p_rows = np.stack([p] + [p] * k)
        path, y = verify(tree, p_rows, None if scheme == "topk" else q_rows, rng)
        return tree.tokens[path[0]] if path else y
    return law(program)


def direct_one_node(p, q, k, replacement):
    """Second route, no enumerator: sum over the ordered child tuples of the recursion's formulas."""
    V, out = len(p), [F(0)] * len(p)
    for xs in itertools.product(range(V), repeat=k):
        if not replacement and len(set(xs)) < k:
            continue
        weight, qq = F(1), list(q)
        for x in xs:  # probability of drawing this ordered tuple
            weight *= qq[x] / sum(qq) if not replacement else qq[x]
            if not replacement:
                qq[x] = F(0)
        if weight == 0:
            continue
        pt, qt, survive = list(p), [v for v in q], F(1)
        for x in xs:
            a = min(F(1), pt[x] / qt[x])
            out[x] += weight * survive * a
            survive *= 1 - a
            w = [max(pi - qi, F(0)) for pi, qi in zip(pt, qt)]
            pt = [v / sum(w) for v in w] if sum(w) else pt
            if not replacement:
                qt[x] = F(0)
                qt = [v / sum(qt) for v in qt] if sum(qt) else qt
        for y in range(V):
            out[y] += weight * survive * pt[y]
    return out


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("verify, replacement, scheme", [
    (rrs_with_replacement, True, "iid"), (rrs_without_replacement, False, "without_replacement"),
])
def test_one_node_law_is_p_by_enumeration_and_by_formula(verify, replacement, scheme, k):
    got = one_node_step(verify, P, Q, k, scheme)
    assert got == {i: P[i] for i in range(3)}
    assert direct_one_node(list(P), list(Q), k, replacement) == list(P)


def test_kseq_one_node_law_and_acceptance():
    got = one_node_step(kseq_verify, P, Q, 2, "iid")
    assert got == {i: P[i] for i in range(3)}
    rho = kseq_rho(P, Q, 2)
    beta = sum(min(q, p / rho) for p, q in zip(P, Q))
    assert 1 <= rho <= 2 and rho * beta >= 1 - (1 - beta) ** 2  # the residual is non-negative
    assert rho - F(1, 1000) < 1 or (rho - F(1, 1000)) * sum(min(q, p / (rho - F(1, 1000))) for p, q in zip(P, Q)) \
        < 1 - (1 - sum(min(q, p / (rho - F(1, 1000))) for p, q in zip(P, Q))) ** 2  # and rho is the smallest on its grid
    assert abs(kseq_rho(P.astype(float), Q.astype(float), 2) - float(rho)) < 1e-3


def test_pointmass_node_acceptance_is_the_sum_of_the_children():
    tree = DraftTree((-1, 0, 0), (-1, 1, 2))
    rows = np.stack([P, P, P])
    got = law(lambda rng: len(pointmass_verify(tree, rows, None, rng)[0]))
    assert got[1] == P[1] + P[2]


TARGET = NGramModel.random(order=2, vocab_size=3, seed=7).exact
DRAFT = NGramModel.random(order=2, vocab_size=3, seed=8, zero_frac=0.3).exact


@pytest.mark.parametrize("scheme, verify, widths, n", [
    ("topk", "pointmass", (2, 2), 3), ("iid", "rrs_with_replacement", (2, 1), 3),
    ("without_replacement", "rrs_without_replacement", (2, 1), 3), ("iid", "kseq", (2,), 3),
    ("iid", "block", (1, 1), 3), ("topk", "block", (1, 1, 1), 4),
])
def test_tree_decoding_has_the_target_law_exactly(scheme, verify, widths, n):
    config = SamplingConfig()
    it = tree_transition(TARGET, DRAFT, [0], widths=widths, scheme=scheme, verify=verify, config=config,
                         max_new_tokens=n, stop_tokens=(2,))
    got = law_iterated((), it, key=lambda g: (g[-1:], len(g)))
    c = compare(got, target_law(TARGET, [0], config, n, (2,)))
    assert c.exact and c.tv == 0, str(c)


def test_typical_acceptance_is_approximate_with_its_exact_tv():
    config = SamplingConfig()
    it = tree_transition(TARGET, DRAFT, [0], widths=(2, 2), scheme="topk", verify="typical", config=config,
                         max_new_tokens=3)
    c = compare(law_iterated((), it, key=lambda g: (g[-1:], len(g))), target_law(TARGET, [0], config, 3))
    assert c.exact and c.tv > F(1, 10)


# --- block verification: the paper's binary example --------------------------------------------

MB, MS = frac(["1/3", "2/3"])[0], frac(["2/3", "1/3"])[0]  # target favours b, draft favours a


def expected_accepted(verify):
    """E[draft tokens accepted] for gamma = 2 drafts ~ M_s, context-independent rows, exactly."""
    def program(rng):
        tree, q_rows, _ = draft_tree((1, 1), lambda path: MS, "iid", rng)
        return len(verify(tree, np.stack([MB] * 3), q_rows, rng)[0])
    return sum(k * w for k, w in law(program).items())


def test_block_verification_binary_example_10_9_and_11_9():
    assert expected_accepted(rrs_with_replacement) == F(10, 9)  # token verification on a chain
    assert expected_accepted(block_verify) == F(11, 9)


def test_chain_rrs_is_the_chain_step():
    """Second route for token verification: on a chain, RRS is specref.core.step.speculative_step."""
    p_rows = frac(["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"])
    q_rows = frac(["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"], ["1/4", "1/2", "1/4"])
    tree = chain_tree([0, 1])
    mine = law(lambda rng: (lambda r: tuple(tree.tokens[n] for n in r[0]) + (r[1],))(
        rrs_with_replacement(tree, p_rows, q_rows, rng)))
    step = law(lambda rng: tuple(speculative_step(p_rows, q_rows[:2], [0, 1], rng)))
    assert mine == step


def test_block_verification_never_accepts_fewer_than_token_verification_on_random_chains():
    rng = np.random.default_rng(5)
    for _ in range(5):
        rows = [frac(*[[F(int(c), int(r.sum())) for c in r] for r in rng.integers(1, 5, size=(3, 3))]) for _ in "pq"]

        def mean_len(verify, p=rows[0], q=rows[1]):
            def program(r):
                tree, q_rows, _ = draft_tree((1, 1), lambda path: q[len(path)], "iid", r)
                return len(verify(tree, np.stack([p[0], p[1], p[2]]), q_rows, r)[0])
            return sum(k * w for k, w in law(program).items())
        assert mean_len(block_verify) >= mean_len(rrs_with_replacement)


# --- bad input ---------------------------------------------------------------------------------

def test_bad_input_names_the_node():
    rows = np.stack([P, P, P])
    dup = DraftTree((-1, 0, 0), (-1, 1, 1))  # the point-mass rule takes it (see the test below); RSD does not
    with pytest.raises(SpecrefError, match="node 0: children 1 and 2 both carry token 1"):
        rrs_without_replacement(dup, rows, rows.copy(), np.random.default_rng(0))
    zero_q = np.stack([frac(["1/2", "0", "1/2"])[0], P, P])
    with pytest.raises(SpecrefError, match=r"node 1: token 1 has q_draft\[0, 1\] = 0"):
        rrs_with_replacement(DraftTree((-1, 0, 0), (-1, 1, 2)), rows, zero_q, np.random.default_rng(0))
    with pytest.raises(SpecrefError, match="needs the draft rows"):
        kseq_verify(dup, rows, None, np.random.default_rng(0))
    with pytest.raises(SpecrefError, match="block_verify needs a chain"):
        block_verify(DraftTree((-1, 0, 0), (-1, 1, 2)), rows, rows.copy(), np.random.default_rng(0))
    assert typical_acceptance(chain_tree([1]), rows[:2], None, np.random.default_rng(0))[0] == [1]


def test_pointmass_never_accepts_a_repeated_child_and_keeps_the_law_p():
    # root children 1 and 2 both carry token 1.  By hand, P = (1/5, 1/2, 3/10): node 1 is accepted
    # w.p. P[1] = 1/2 and its bonus is ~ P; its rejection sets p~(1) = 0, so node 2 is never
    # accepted; all rejected (1/2): the next token is P restricted to {0, 2}, i.e. 0 w.p. 1/5, 2 w.p. 3/10
    rows = np.stack([P, P, P])
    dup = DraftTree((-1, 0, 0), (-1, 1, 1))
    got = law(lambda rng: (lambda out: (tuple(out[0]), out[1]))(pointmass_verify(dup, rows, None, rng)))
    expected = {((1,), y): F(1, 2) * P[y] for y in range(3)}
    expected.update({((), 0): F(1, 5), ((), 2): F(3, 10)})
    assert dict(got) == expected


def test_tree_decode_samples_the_target_law():
    """Real decoding (numpy rng) against the exact target law: pooled G-test, N = 2000, alpha = 1e-6.

    Outcomes are the 2-token outputs (at most 9, V = 3); the reference fails with probability
    <= 1e-6.  A second route to the exact-law tests above, through the sampling loop itself.
    """
    from specref.decoding.tree import tree_decode
    from specref.verification.statistics.counts import compare_counts

    config = SamplingConfig()
    want = target_law(TARGET, [1], config, 2)
    outcomes = sorted(want)
    gen = np.random.default_rng(12)
    counts = np.zeros(len(outcomes) + 1, dtype=np.int64)
    for _ in range(2000):
        out = tree_decode(TARGET, DRAFT, [1], widths=(2, 1), scheme="iid", verify="rrs_with_replacement",
                          config=config, max_new_tokens=2, rng=gen)
        t = tuple(out["tokens"])
        counts[outcomes.index(t) if t in want else len(outcomes)] += 1
    null = np.array([float(want[o]) for o in outcomes] + [0.0])
    result = compare_counts(counts, null, alpha=1e-6)
    assert counts[-1] == 0 and not result.rejected, result.g


@pytest.mark.parametrize("scheme, verify", [("topk", "pointmass"), ("iid", "rrs_with_replacement")])
def test_tree_decoding_with_the_toy_transformers_has_the_target_law(scheme, verify):
    """Float rows from the tiny cached transformers: TV <= 1e-12 (rounding only)."""
    from specref.verify import transformer_pair

    target, draft, prompt = transformer_pair()
    config = SamplingConfig()
    it = tree_transition(target, draft, prompt, widths=(2, 1), scheme=scheme, verify=verify, config=config,
                         max_new_tokens=3)
    c = compare(law_iterated((), it), target_law(target, prompt, config, 3))
    assert not c.exact and c.tv <= 1e-12, str(c)


def test_kseq_rho_is_exactly_one_when_one_is_feasible():
    """p = q: beta(1) = 1 exactly, so rho = 1; float rounding of the bisection once gave 1001/1000."""
    from fractions import Fraction

    from specref.core.tree_verify import kseq_rho

    for V in (2, 3, 7):
        p = np.array([Fraction(1, V)] * V, dtype=object)
        for k in (2, 3, 5):
            assert kseq_rho(p, p.copy(), k) == Fraction(1)


def test_kseq_rho_keeps_float_and_fraction_rows_apart():
    """Fraction(1, 2) == 0.5 and hashes alike: after a float call an exact law must still get a Fraction."""
    from fractions import Fraction

    from specref.core.tree_verify import _beta, kseq_rho

    pf, qf = np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.5, 0.25])
    pe = np.array([Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)], dtype=object)
    qe = np.array([Fraction(1, 4), Fraction(1, 2), Fraction(1, 4)], dtype=object)
    float_rho = kseq_rho(pf, qf, 2)
    exact_rho = kseq_rho(pe, qe, 2)
    assert isinstance(float_rho, float) and isinstance(exact_rho, Fraction)

    def ok(rho):  # the defining inequality, in exact arithmetic (independent of the bisection)
        b = _beta(pe, qe, rho)
        return rho * b >= 1 - (1 - b) ** 2

    assert ok(exact_rho) and not ok(exact_rho - Fraction(1, 1000))  # the smallest feasible multiple of 1/1000
    assert abs(float(exact_rho) - float_rho) < 1e-3
