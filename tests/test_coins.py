"""Coins in, exact out: the breakpoint law of coin-fed kernels and the batched_coins / tree_coins levels."""

import itertools
import re
import math
import time
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.verification.laws.coins import CoinBudgetError, NotPiecewiseConstant, coin_law
from specref.verification.laws.enumeration import law
from specref.verification.levels import LEVELS
from specref.verification.levels.coins import kernels as C
from specref.verification.levels.batched.steps import row_law
from specref.verification.oracle import check
from specref.verification.running.report import BUDGET, DIFFERS, EMITS_INVALID, INVALID, OK, RAISED


# ---------------------------------------------------------------- the breakpoint law


def _brute(kernel, n, bits, dtype="float32"):
    """The law by running the kernel on every coin vector of the 2^-bits grid."""
    counts = {}
    size = 1 << bits
    for ks in itertools.product(range(size), repeat=n):
        out = kernel((np.array(ks, dtype=np.float64) / size).astype(dtype))
        counts[out] = counts.get(out, 0) + 1
    return {o: Fraction(c, size ** n) for o, c in counts.items()}


def _arithmetic_row(u):
    """An engine-style row in float32 arithmetic: two tests ``coin * q < p``, then ``u * total`` inverse CDF."""
    p = np.array([0.25, 0.625], dtype=np.float32)
    q = np.array([0.375, 0.5], dtype=np.float32)
    n = 0
    while n < 2 and u[n] * q[n] < p[n]:
        n += 1
    w = [np.array([1, 2, 0, 3], np.float32), np.array([0, 1, 1, 1], np.float32), np.array([5, 1, 1, 1], np.float32)][n]
    cdf = np.cumsum(w)
    return n, int(np.sum(cdf <= u[2] * cdf[-1]))


@pytest.mark.parametrize("bits, probes", [(4, 2), (5, 4), (5, 16)])
def test_the_breakpoint_law_is_the_brute_force_law_on_a_coarse_grid(bits, probes):
    got = coin_law(_arithmetic_row, 3, dtype="float32", bits=bits, probes=probes)
    assert dict(got) == _brute(_arithmetic_row, 3, bits) and got.exact
    assert got.total() == 1 and got.evaluations == got.probes + got.bisections + got.checks
    assert got.evaluations < (1 << bits) ** 3  # it did not just try every coin vector


def _comparison_row(u):
    """The same shape, with only comparisons of the coins (so lazy uniforms can run it too)."""
    accept = [0.7, 1 / 3]
    n = 0
    while n < 2 and u[n] < accept[n]:
        n += 1
    cdf = [[0.25, 0.5, 1.0], [0.1, 0.6, 1.0], [1 / 3, 2 / 3, 1.0]][n]
    return n, sum(1 for c in cdf if c <= u[2])


def _closed_form_row(bits):
    """The law of :func:`_comparison_row` by hand: on the grid ``P(u < t) = ceil(t 2^m) / 2^m``."""
    size = 1 << bits
    g = lambda t: Fraction(math.ceil(Fraction(t) * size), size)  # noqa: E731
    a = [g(0.7), g(1 / 3)]
    reach = [1 - a[0], a[0] * (1 - a[1]), a[0] * a[1]]
    cdf = [[0.25, 0.5, 1.0], [0.1, 0.6, 1.0], [1 / 3, 2 / 3, 1.0]]
    out = {}
    for n in range(3):
        edges = [Fraction(0)] + [g(c) for c in cdf[n]]  # token y iff cdf_{y-1} <= u < cdf_y
        for y in range(3):
            if edges[y + 1] > edges[y]:
                out[(n, y)] = reach[n] * (edges[y + 1] - edges[y])
    return out


@pytest.mark.parametrize("bits", [24, 53])
def test_the_breakpoint_law_matches_the_closed_form_and_the_lazy_uniform_law(bits):
    got = coin_law(_comparison_row, 3, dtype="float64", bits=bits)
    lazy = law(lambda rng: _comparison_row(rng.random(3)), grid=bits)
    assert dict(got) == _closed_form_row(bits) == dict(lazy)
    assert got.bisections > 0  # no candidates were named: bisection found every threshold


def test_known_small_laws():
    quarters = coin_law(lambda u: int(u[0] * 4), 1, dtype="float32")
    assert dict(quarters) == {j: Fraction(1, 4) for j in range(4)}
    third = coin_law(lambda u: bool(u[0] < 1 / 3), 1, dtype="float64")  # 1/3 is no grid point: rounded up
    assert third[True] == Fraction(math.ceil(Fraction(1 / 3) * 2**53), 2**53)
    for dtype, m in (("float32", 24), ("float64", 53)):  # the inclusive u <= 0: one grid point, exactly
        zero = coin_law(lambda u: bool(u[0] <= 0), 1, dtype=dtype)
        assert zero[True] == Fraction(1, 2**m), dtype
        top = coin_law(lambda u: bool(u[0] >= 1 - 2.0**-m), 1, dtype=dtype)  # the largest coin below 1
        assert top[True] == Fraction(1, 2**m), dtype
    at = coin_law(lambda u: bool(u[0] <= 0.5), 1, dtype="float32", candidates=[0.5])  # inclusive at a threshold
    assert at[True] == Fraction(1, 2) + Fraction(1, 2**24) and at.bisections == 0


def test_candidates_close_the_gap_the_probes_leave():
    """The stated bound: a piece narrower than the probe spacing, with the same output on both sides
    and no candidate inside, is missed; naming its threshold finds it exactly."""
    spike = lambda u: bool(0.3 <= u[0] < 0.3 + 2.0**-10)  # noqa: E731
    missed = coin_law(spike, 1, dtype="float32", probes=16)
    assert dict(missed) == {False: 1}  # the check can fail: this law is wrong
    found = coin_law(spike, 1, dtype="float32", probes=16, candidates=[0.3])
    width = Fraction(math.ceil(Fraction(0.3 + 2.0**-10) * 2**24) - math.ceil(Fraction(0.3) * 2**24), 2**24)
    assert found[True] == width and found.total() == 1


def test_not_piecewise_constant_is_reported():
    with pytest.raises(NotPiecewiseConstant, match="max_pieces=64"):
        coin_law(lambda u: float(u[0]), 1, max_pieces=64)  # the output follows the coin
    with pytest.raises(NotPiecewiseConstant, match="not constant on the cell"):
        coin_law(lambda u: bool(u[0] + u[1] < 1), 2)  # not boxes: the corner check
    lone = np.float32(0.5 - 2.0**-24)  # the midpoint of [0, 1) on the float32 grid, and no probe
    with pytest.raises(NotPiecewiseConstant, match="midpoint"):
        coin_law(lambda u: bool(u[0] == lone), 1, dtype="float32")
    def race(u):  # an exponential race over two tokens: argmax p / E with E = -log(1 - u)
        with np.errstate(divide="ignore"):
            return int(np.argmax(np.array([0.5, 0.5]) / -np.log1p(-u)))

    with pytest.raises(NotPiecewiseConstant, match="exponential race"):
        coin_law(race, 2)


@pytest.mark.parametrize("kwargs, name", [
    ({"kernel": 3}, "kernel"), ({"n": -1}, "n"), ({"n": 1.5}, "n"), ({"dtype": "float16"}, "dtype"),
    ({"bits": 30}, "bits"), ({"dtype": "float64", "bits": 0}, "bits"), ({"probes": 0}, "probes"),
    ({"candidates": [float("nan")]}, "candidates"), ({"candidates": ["1/2"]}, "candidates"),
    ({"candidates": 0.5}, "candidates"), ({"max_pieces": 0}, "max_pieces"), ({"max_evals": 0}, "max_evals"),
    ({"check": "yes"}, "check"),
])
def test_bad_arguments_are_named(kwargs, name):
    args = {"kernel": lambda u: bool(u[0] < 0.5), "n": 1, "dtype": "float32"} | kwargs
    with pytest.raises(SpecrefError, match=name):
        coin_law(args.pop("kernel"), args.pop("n"), **args)


def test_an_unhashable_output_and_the_budget_are_named():
    with pytest.raises(SpecrefError, match="hashable"):
        coin_law(lambda u: {"accept": True}, 1)
    with pytest.raises(CoinBudgetError, match="max_evals=10"):
        coin_law(_arithmetic_row, 3, max_evals=10)


# ---------------------------------------------------------------- the batched_coins level


def test_the_levels_are_registered():
    assert {"batched_coins", "tree_coins"} <= set(LEVELS)
    assert "uniform_coins [B, K]" in LEVELS["batched_coins"].signature


def test_the_default_cases_are_tight():
    """Every default case's rows have all thresholds on the coin grid: row_law is the reference's grid law."""
    for case in C.default_coin_cases() + [C.large_coin_case()]:
        closed = [row_law(case.batched(), b) for b in range(case.shape[0])]
        for x in case.draft_tuples():
            _, tight, _ = C._expected_given(case, closed, x, case.bits)
            assert tight, (case.name, x.tolist())


def test_the_correct_engine_kernel_passes_exactly():
    report = check("batched_coins", C.engine_coin_kernel, cases=C.default_coin_cases() + [C.large_coin_case("float64")])
    assert report.ok and report.worst_tv == 0, str(report)
    assert all("0 bisecting" in r.detail for r in report.results)  # the candidates marked every breakpoint


def test_a_case_off_the_grid_compares_with_the_reference_on_the_grid():
    p = C._f([[["1/4", "1/4", "1/2"], ["1/2", "1/4", "1/4"]]])
    q = C._f([[["3/8", "1/8", "1/2"]]])  # p/q = 2/3: no grid point
    case = C.CoinCase("off-grid", p, q, drafts=(((0,),), ((2,),)))
    closed = [row_law(case.batched(), 0)]
    assert not C._expected_given(case, closed, case.draft_tuples()[0], 24)[1]
    report = check("batched_coins", C.engine_coin_kernel, cases=[case])
    assert report.ok and report.worst_tv == 0 and "off the 2^-24 grid" in report.results[0].detail, str(report)


@pytest.mark.parametrize("kernel, coin_word", [
    (C.inclusive_zero_kernel, "= 0 (one grid point)"),
    (C.threshold_inclusive_kernel, "one grid point past the threshold"),
    (C.one_minus_coin_kernel, "uniform_coins"),
])
def test_each_boundary_bug_is_caught_in_float32_and_float64(kernel, coin_word):
    """One defect, one label at any coin width (SPEC §11.9): the float32 TV (of order 2^-24) is above the
    tolerance, the float64 TV (2^-53) below it; both are ``boundary``, the float32 one because on the grid
    4 bits coarser its TV grows with the grid point's mass (or vanishes)."""
    cases = [c for c in C.default_coin_cases() if c.name.startswith("V4-K2")]
    report = check("batched_coins", kernel, cases=cases)
    by_dtype = {r.case.dtype: r for r in report.results}
    f32, f64 = by_dtype["float32"], by_dtype["float64"]
    assert f32.status == C.BOUNDARY and 2.0**-25 < f32.tv < 1e-6, str(report)  # above the tolerance, yet boundary
    assert "made by single grid points" in f32.detail and "2^-20 grid" in f32.detail, f32.detail
    assert f64.status == C.BOUNDARY and 0 < f64.tv < 1e-15, str(report)  # of order 2^-53: below it, yet caught
    assert coin_word in f64.detail, f64.detail
    assert report.verdict.startswith("BOUNDARY") and report.exit_status == 4, report.verdict


def _emits_zero_token_on_a_window(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
    """The reference kernel, but the first draft is accepted whenever its coin is below 2^-12, even where
    p = 0: a token the target never emits, on a window of 2^12 float32 grid points."""
    out = C.engine_coin_kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins)
    tokens = np.array(out[0] if isinstance(out, tuple) else out)
    for b in range(tokens.shape[0]):
        if uniform_coins[b, 0] < 2.0**-12 and draft_tokens[b, 0] >= 0 and tokens[b, 0] != draft_tokens[b, 0]:
            tokens[b, 0], tokens[b, 1:] = draft_tokens[b, 0], -1
            tokens[b, 1] = 0
    return tokens


def test_a_deviation_that_stays_on_the_coarser_grid_differs_at_every_width():
    """Fails if the two-grid rule hid a real deviation: an output the target gives probability 0, emitted on a
    window of coins (mass about 2^-12 of the rejections, the same on the 2^-24, 2^-20, 2^-53 and 2^-49
    grids), is ``differs`` with float32 and float64 coins, its detail saying that it does not shrink."""
    cases = [c for c in C.default_coin_cases() if c.name.startswith("V4-K2")]
    report = check("batched_coins", _emits_zero_token_on_a_window, cases=cases)
    for r in report.results:
        assert r.status == DIFFERS and r.tv > 1e-5, str(report)
        assert "does not shrink with the grid" in r.detail, r.detail
    assert report.verdict.startswith("DIFFERS") and report.exit_status == 1, report.verdict


def test_made_by_grid_points_reads_the_two_tvs():
    """The rule itself, on numbers chosen by hand: one grid point per threshold grows 2^4 times on the
    coarser grid; vanishing counts as grid points; a TV that stays (or halves) is a deviation of the law."""
    fine = Fraction(3, 2**24)
    assert C.made_by_grid_points(fine, 16 * fine) and C.made_by_grid_points(fine, 8 * fine)
    assert C.made_by_grid_points(fine, 0)
    assert not C.made_by_grid_points(fine, fine) and not C.made_by_grid_points(fine, fine / 2)
    assert not C.made_by_grid_points(fine, 7 * fine)


def test_the_inclusive_zero_bug_names_the_impossible_output_and_its_coin():
    report = check("batched_coins", C.inclusive_zero_kernel, cases=[C.large_coin_case("float64")])
    r = report.results[0]
    assert r.status == C.BOUNDARY and "the reference never makes" in r.detail, r.detail
    assert "uniform_coins[0, 1] = 0 (one grid point)" in r.detail, r.detail


def test_a_tight_row_is_held_exactly_in_a_case_that_is_not_tight():
    p = C._f([[["1/4", "1/4", "1/4", "1/4"]] * 2, [["1/8", "3/8", "1/4", "1/4"], ["1/4", "1/4", "1/4", "1/4"]]])
    q = C._f([[["3/8", "1/8", "1/4", "1/4"]], [["1/4", "1/4", "1/4", "1/4"]]])  # row 0: p/q = 2/3; row 1: 1/2
    case = C.CoinCase("one-tight-row", p, q, drafts=(((0,), (0,)),), dtype="float64")
    ok = check("batched_coins", C.engine_coin_kernel, cases=[case]).results[0]
    assert ok.status == OK and ok.tv < 1e-15, ok  # row 0's float arithmetic may round at 2/3: not judged
    bad = check("batched_coins", C.threshold_inclusive_kernel, cases=[case]).results[0]
    assert bad.status == C.BOUNDARY and "rows [1] are tight" in bad.detail, bad


def test_isolated_cases_give_the_same_verdict():
    case = C.default_coin_cases()[1:2]  # float64 coins: the boundary status
    here = check("batched_coins", C.inclusive_zero_kernel, cases=case).results[0]
    forked = check("batched_coins", C.inclusive_zero_kernel, cases=case, isolate=True).results[0]
    assert (forked.status, forked.tv) == (here.status, here.tv) == (C.BOUNDARY, here.tv)


def test_coupled_rows_differ():
    def shared(p, q, x, u, f):  # row 1 tests its drafts with row 0's coins
        u = u.copy()
        u[1] = u[0]
        return C.engine_coin_kernel(p, q, x, u, f)

    report = check("batched_coins", shared, cases=C.default_coin_cases()[:1])
    assert report.results[0].status == DIFFERS and report.worst_tv > 0.01, str(report)


def test_misbehaviour_is_reported_with_its_coins():
    def raises_at_zero(p, q, x, u, f):
        if (u == 0).any():
            raise RuntimeError("log(0)")
        return C.engine_coin_kernel(p, q, x, u, f)

    def out_of_vocab_at_the_top(p, q, x, u, f):
        out = C.engine_coin_kernel(p, q, x, u, f)
        if (f == np.float32(1 - 2.0**-24)).any():
            out[out != -1] = 4  # the last lane of a padded tile
        return out

    case = C.default_coin_cases()[:1]
    r = check("batched_coins", raises_at_zero, cases=case).results[0]
    assert r.status == RAISED and "log(0)" in r.detail and "uniform_coins = [[0.0" in r.detail, r.detail
    r = check("batched_coins", out_of_vocab_at_the_top, cases=case).results[0]
    assert r.status == EMITS_INVALID and "final_coins = [0.9999999" in r.detail, r.detail
    r = check("batched_coins", C.engine_coin_kernel, cases=case, max_paths=200).results[0]
    assert r.status == BUDGET and "max_evals=200" in r.detail, r.detail


def test_a_kernel_that_mixes_coins_is_not_piecewise_constant():
    def mixed(p, q, x, u, f):  # the final draw uses (acceptance coin + final coin) mod 1
        return C.engine_coin_kernel(p, q, x, u, (u[:, 0].astype(np.float64) + f) % 1)

    r = check("batched_coins", mixed, cases=C.default_coin_cases()[:1]).results[0]
    assert r.status == C.NOT_PIECEWISE, r


def _case(**fields):
    return replace(C.default_coin_cases()[0], **fields)


@pytest.mark.parametrize("case, words", [
    (_case(p_target=C._f([[["1/3", "1/3", "1/3", "0"]] * 3] * 2)), "p_target[0, 0, 0] = 1/3"),
    (_case(drafts=(((1,), (0, 1)),)), "drafts[0][0]"),
    (_case(drafts=(((1, 9), (0, 1)),)), "drafts[0][0][1] = 9"),
    (_case(drafts=(((1, 2),),)), "drafts[0] must hold B = 2"),
    (_case(drafts=()), "drafts must be None"),
    (_case(drafts=None), "MAX_DRAFT_TUPLES"),
    (_case(dtype="float16"), "dtype"),
    (_case(probes=0), "probes"),
    (_case(num_draft=(3, 0)), "num_draft"),
    (_case(q_draft=C._f([[["1/2", "1/2", "0", "0"]] * 2] * 2), drafts=(((2, 2), (0, 1)),)), "q_draft = 0"),
    ("not a case", "CoinCase"),
])
def test_bad_cases_are_named(case, words):
    with pytest.raises(SpecrefError, match=re.escape(words)):
        check("batched_coins", C.engine_coin_kernel, cases=[case])


def test_the_levels_are_exact_only():
    with pytest.raises(SpecrefError, match="exact only"):
        check("batched_coins", C.engine_coin_kernel, mode="statistical", samples=10)


# ---------------------------------------------------------------- the tree_coins level


def test_the_sglang_style_coin_kernel_passes():
    report = check("tree_coins", C.sglang_coin_kernel)
    assert report.ok, str(report)
    assert all(r.tv == 0 for r in report.results if r.case.dtype == "float32"), str(report)


def test_the_inclusive_zero_bug_is_caught_at_the_tree_level():
    report = check("tree_coins", C.sglang_inclusive_kernel)
    by_name = {r.case.name: r for r in report.results}
    r32 = by_name["zero-child-float32"]  # TV of order 2^-24, above the tolerance: boundary all the same
    assert r32.status == C.BOUNDARY and 0 < r32.tv < 1e-6 and "made by single grid points" in r32.detail, str(report)
    r64 = by_name["zero-child-float64"]
    assert r64.status == C.BOUNDARY and 0 < r64.tv < 1e-15, str(report)
    assert "uniform_samples[0, 0] = 0 (one grid point)" in r64.detail and "never makes" in r64.detail, r64.detail


def test_bad_tree_cases_are_named():
    tree = C.default_tree_coin_cases()[0].tree
    with pytest.raises(SpecrefError, match="dtype"):
        check("tree_coins", C.sglang_coin_kernel, cases=[C.TreeCoinCase("x", tree, dtype="float16")])
    with pytest.raises(SpecrefError, match="batch"):
        check("tree_coins", C.sglang_coin_kernel, cases=[C.TreeCoinCase("x", tree, batch=0)])
    thirds = replace(tree, target=C._f([["1/3", "1/3", "1/3", "0"]] * 4))
    with pytest.raises(SpecrefError, match="tree.target"):
        check("tree_coins", C.sglang_coin_kernel, cases=[C.TreeCoinCase("x", thirds)])
    assert OK == "ok"


# ---------------------------------------------------------------- outputs whose conversion misbehaves


class _ExitsWhenRead:
    """A kernel output whose every conversion (``__array__``, iteration, indexing, ``len``) raises SystemExit."""

    def __array__(self, *args, **kwargs):
        raise SystemExit(3)

    __iter__ = __getitem__ = __len__ = __array__


class _SlowOnce:
    """Wraps a real output; the first conversion sleeps 3 s (a stand-in for forever that ends, so that a
    parse outside the time limit makes the case pass slowly instead of hanging the suite)."""

    def __init__(self, out, state):
        self.out, self.state = out, state

    def _first(self):
        if not self.state.get("slept"):
            self.state["slept"] = True
            time.sleep(3)

    def __array__(self, *args, **kwargs):
        self._first()
        return np.asarray(self.out)

    def __getitem__(self, i):
        self._first()
        return self.out[i]


@pytest.mark.parametrize("level, kernel, wrap, status, word", [
    ("batched_coins", C.engine_coin_kernel, lambda out, state: _ExitsWhenRead(), INVALID, "SystemExit"),
    ("batched_coins", C.engine_coin_kernel, _SlowOnce, "timeout", "time_limit"),
    ("tree_coins", C.sglang_coin_kernel, lambda out, state: (_ExitsWhenRead(), out[1]), INVALID, "SystemExit"),
    ("tree_coins", C.sglang_coin_kernel, lambda out, state: (_SlowOnce(out[0], state), out[1]), "timeout",
     "time_limit"),
])
def test_an_output_whose_conversion_exits_or_hangs_is_a_status(level, kernel, wrap, status, word):
    """The output is parsed inside the guarded call: a conversion that raises SystemExit is ``invalid
    output``, one that does not end is ``timeout`` within ``time_limit`` (0.3 s; the sleep is 3 s), at both
    coin levels -- never an escape (``internal error``) or a wait."""
    state = {}

    def hostile(*args):
        return wrap(kernel(*args), state)

    cases = (C.default_coin_cases() if level == "batched_coins" else C.default_tree_coin_cases())[:1]
    t0 = time.monotonic()
    r = check(level, hostile, cases=cases, time_limit=0.3).results[0]
    assert r.status == status and word in r.detail, r
    assert time.monotonic() - t0 < 2.5, "the conversion was stopped at the time limit, not waited for"


class _EndlessRows:
    """``accept_index`` whose every row is an endless iterator (0, 1, 2, ...)."""

    def __getitem__(self, b):
        return itertools.count()


@pytest.mark.parametrize("garbage, words", [
    (lambda out: None, "not (accept_index [B, S], next_tokens [B])"),
    (lambda out: ([[0, 99]] * len(out[1]), out[1]), "is not a path of the tree"),
    (lambda out: (out[0], [7] * len(out[1])), "next token 7 outside the vocabulary"),
    (lambda out: (_EndlessRows(), out[1]), "more than"),
])
def test_a_tree_kernel_that_returns_garbage_is_an_invalid_output(garbage, words):
    """Nothing, a path the tree does not have, a token outside the vocabulary, and endless rows
    (read to a bound, not to the end) are ``invalid output`` naming what is wrong."""
    r = check("tree_coins", lambda *args: garbage(C.sglang_coin_kernel(*args)),
              cases=C.default_tree_coin_cases()[:1], time_limit=5).results[0]
    assert r.status == INVALID and words in r.detail, r


def _mirrored_kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
    """(correct) Another coin convention: accept iff ``coin >= 1 - p/q``; inverse CDF from the last token."""
    B, K1, V = p_target.shape
    k = np.where((draft_tokens == -1).any(axis=1), (draft_tokens == -1).argmax(axis=1), K1 - 1)
    out = np.full((B, K1), -1, dtype=np.int64)
    for b in range(B):
        n = 0
        while n < k[b]:
            x = draft_tokens[b, n]
            ratio = p_target[b, n, x] / (1 if q_draft is None else q_draft[b, n, x])
            if not uniform_coins[b, n] >= 1 - min(ratio, 1):
                break
            out[b, n] = x
            n += 1
        w = p_target[b, n].copy()
        if n < k[b]:
            w = w - (q_draft[b, n] if q_draft is not None else np.eye(V, dtype=w.dtype)[draft_tokens[b, n]] * w)
            w = np.maximum(w, 0)
            if not w.sum() > 0:
                w = p_target[b, n]
        rev = np.cumsum(w[::-1])
        out[b, n] = V - 1 - min(int(np.sum(rev <= final_coins[b] * rev[-1])), int(np.flatnonzero(w[::-1] > 0)[-1]))
    return out


def test_another_correct_coin_convention_passes_exactly_on_tight_cases():
    """On a tight case every threshold is a grid point, so any correct convention has the closed form's law."""
    report = check("batched_coins", _mirrored_kernel)
    assert report.ok and report.worst_tv == 0, str(report)
