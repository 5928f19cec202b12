"""specref.verification.cases.strategies: every output is valid, every promised edge case really occurs,
and the strategies drive one property test of the single-position law (SPEC §3)."""

import doctest
import inspect
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument, NoSuchExample

from specref.core.errors import check_prob_rows
from specref.core.sampling import SamplingConfig, process, process_probs
from specref.core.step import RESIDUAL_TOL, accepted_mass, residual, residual_mass, speculative_step
from specref.verification.cases import strategies
from specref.verification.cases.strategies import (
    StepInput,
    distribution_pairs,
    distributions,
    logits,
    sampling_configs,
    step_inputs,
    table_model_pairs,
    table_models,
)
from specref.verification.cases.tables import LogitTable, ProbTable

FIND = settings(max_examples=1000, database=None, derandomize=True, phases=[Phase.generate], deadline=None)
PUBLIC = [distributions, distribution_pairs, logits, sampling_configs, step_inputs, table_models, table_model_pairs]


def collect(strategy, n=120):
    """``n`` examples of ``strategy``, the same ones on every run (derandomized)."""
    seen = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None)
    @given(strategy)
    def run(value):
        seen.append(value)

    run()
    return seen


def assert_occurs(strategy, **features):
    """Each feature (a predicate) holds for some example of ``strategy``: hypothesis
    searches for it (derandomized, no shrinking), so the check does not depend on how
    often the first few hundred examples happen to hit it."""
    for name, has in features.items():
        try:
            find(strategy, has, settings=FIND)
        except NoSuchExample:
            pytest.fail(f"{name}: no example in {FIND.max_examples}")


def is_fraction_row(row):
    return row.dtype == object and all(type(v) is F for v in row.ravel())


def assert_float_rows(rows):
    assert rows.dtype == np.float64
    check_prob_rows("rows", rows)
    assert (rows >= 0).all()
    assert np.all(np.abs(rows.sum(axis=-1) - 1) <= 1e-12)


def assert_exact_rows(rows):
    assert is_fraction_row(rows)
    check_prob_rows("rows", rows)
    assert all(sum(r, F(0)) == 1 for r in rows.reshape(-1, rows.shape[-1]))


def positive_gaps(row):
    """Differences between distinct pairs of nonzero entries (0 for exact ties)."""
    v = sorted(x for x in row if x > 0)
    return [b - a for a, b in zip(v, v[1:])]


# ---------------------------------------------------------------- the module's surface


def test_all_lists_every_strategy_with_keyword_only_options_and_an_example():
    for fn in PUBLIC:
        assert fn.__name__ in strategies.__all__
        assert ">>>" in fn.__doc__ and ".example()" in fn.__doc__, fn.__name__
        params = inspect.signature(fn).parameters.values()
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), fn.__name__
        assert isinstance(fn(), st.SearchStrategy)
    assert set(strategies.__all__) <= set(dir(strategies))


def test_docstring_examples_run():
    result = doctest.testmod(strategies, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: distributions(vocab_size=0),
        lambda: distributions(vocab_size=3, min_zeros=3),
        lambda: distributions(min_zeros=1, allow_zeros=False),
        lambda: distributions(shapes=["lumpy"]),
        lambda: distributions(shapes=[]),
        lambda: distributions(exact="yes"),
        lambda: distribution_pairs(relations=["swapped"]),
        lambda: sampling_configs(vocab_size=0),
        lambda: step_inputs(k=0),
        lambda: table_models(kind="logits", exact=True),
        lambda: table_models(kind="counts"),
        lambda: table_model_pairs(relations=["far"]),
    ],
)
def test_bad_options_are_invalid_arguments(make):
    with pytest.raises(InvalidArgument):
        make()


def test_a_vocab_size_strategy_that_draws_too_small_is_named():
    with pytest.raises(InvalidArgument, match="min_zeros"):
        collect(distributions(vocab_size=st.just(2), min_zeros=2), n=1)


def test_draws_are_deterministic_under_hypothesis():
    # no NumPy random state: the same hypothesis draws give the same examples
    for strategy in (distributions(), step_inputs(exact=True), table_model_pairs()):
        first, second = collect(strategy, n=20), collect(strategy, n=20)
        assert [repr(v) for v in first] == [repr(v) for v in second]


# ---------------------------------------------------------------- distributions


@settings(max_examples=100, deadline=None)
@given(distributions())
def test_float_rows_are_distributions(row):
    assert row.ndim == 1 and 2 <= row.shape[0] <= 8
    assert_float_rows(row)


@settings(max_examples=100, deadline=None)
@given(distributions(exact=True))
def test_exact_rows_are_fraction_arrays_summing_to_one(row):
    assert row.ndim == 1 and 2 <= row.shape[0] <= 8
    assert_exact_rows(row)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_options_are_honoured(data):
    V = data.draw(st.integers(1, 8))
    exact = data.draw(st.booleans())
    assert data.draw(distributions(vocab_size=V, exact=exact)).shape == (V,)
    assert data.draw(distributions(vocab_size=st.just(V))).shape == (V,)
    assert (data.draw(distributions(vocab_size=V, exact=exact, allow_zeros=False)) > 0).all()
    z = data.draw(st.integers(0, V - 1))
    assert (data.draw(distributions(vocab_size=V, exact=exact, min_zeros=z)) == 0).sum() >= z
    flat = data.draw(distributions(vocab_size=V, exact=exact, shapes=["flat"]))
    assert len({v for v in flat if v > 0}) == 1
    peak = data.draw(distributions(vocab_size=V, exact=exact, shapes=["peaked"]))
    assert peak.max() >= 0.99 - 1e-12  # M / (M + 1) with M >= 99


def support(row):
    return [v for v in row if v > 0]


@pytest.mark.parametrize("exact", [False, True])
def test_every_shape_occurs(exact):
    near = F(1, 10**6) if exact else 1e-12
    assert_occurs(
        distributions(exact=exact),
        zeros=lambda r: (r == 0).any(),
        ties=lambda r: 0 in positive_gaps(r),
        near_ties=lambda r: any(0 < g <= near for g in positive_gaps(r)),
        peaked=lambda r: r.max() >= 0.99 - 1e-12 and len(support(r)) >= 2,
        one_hot=lambda r: len(support(r)) == 1,
        flat=lambda r: len(r) >= 2 and len(support(r)) == len(r) and len(set(r)) == 1,
        random=lambda r: len(set(r)) == len(r) >= 4,
        tiny=lambda r: 0 < min(support(r)) <= 1e-9,
        large_vocab=lambda r: len(r) == 8,
    )
    if not exact:  # float near-ties at the scale of rounding
        assert_occurs(distributions(), rounding_ties=lambda r: any(0 < g <= 1e-14 for g in positive_gaps(r)))


# ---------------------------------------------------------------- pairs and the single-position law


@settings(max_examples=60, deadline=None)
@given(distribution_pairs(), distribution_pairs(exact=True))
def test_pairs_are_valid(floats, exact):
    for (p, q), check in ((floats, assert_float_rows), (exact, assert_exact_rows)):
        assert p.shape == q.shape
        check(p)
        check(q)


@pytest.mark.parametrize("exact", [False, True])
def test_every_relation_occurs(exact):
    near = F(1, 10**6) if exact else 1e-12
    gap = lambda pq: max(abs(a - b) for a, b in zip(*pq))  # noqa: E731
    alpha = lambda pq: accepted_mass(*pq).sum()  # noqa: E731
    assert_occurs(
        distribution_pairs(exact=exact),
        equal=lambda pq: gap(pq) == 0 and len(pq[0]) >= 2,
        near=lambda pq: 0 < gap(pq) <= near,
        q_zeros=lambda pq: ((pq[1] == 0) & (pq[0] > 0)).any(),
        p_zeros=lambda pq: ((pq[0] == 0) & (pq[1] > 0)).any(),
        disjoint=lambda pq: alpha(pq) == 0,
        overlap=lambda pq: 0 < alpha(pq) < 1,
        permuted=lambda pq: gap(pq) > 0 and sorted(pq[0]) == sorted(pq[1]),
    )
    if not exact:  # p and q that differ by rounding only: residual mass below RESIDUAL_TOL
        assert_occurs(distribution_pairs(), rounding=lambda pq: 0 < gap(pq) <= 1e-15)


@settings(max_examples=200, deadline=None)
@given(distribution_pairs(exact=True))
def test_accepted_plus_rejected_residual_is_p_exactly(pair):
    p, q = pair
    rejection = residual_mass(p, q)
    assert rejection == 1 - accepted_mass(p, q).sum()
    if rejection == 0:  # p == q: the residual is 0/0 and never evaluated
        assert (p == q).all()
        return
    assert list(accepted_mass(p, q) + rejection * residual(p, q)) == list(p)


# ---------------------------------------------------------------- logits and sampling configs


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_logit_rows_are_valid_and_processable(data):
    V = data.draw(st.integers(1, 8))
    z = data.draw(logits(vocab_size=V))
    assert z.dtype == np.float64 and z.shape == (V,)
    assert not np.isnan(z).any() and not np.isposinf(z).any() and np.isfinite(z).any()
    assert np.isfinite(data.draw(logits(vocab_size=V, allow_neg_inf=False))).all()
    config = data.draw(sampling_configs(vocab_size=V))
    assert_float_rows(process(z, config))


def test_logit_edge_cases_occur():
    gaps = lambda z: np.diff(np.sort(z[np.isfinite(z)]))  # noqa: E731
    assert_occurs(
        logits(),
        masked=lambda z: np.isneginf(z).any(),
        ties=lambda z: (gaps(z) == 0).any(),
        near_ties=lambda z: ((gaps(z) > 0) & (gaps(z) <= 1e-12)).any(),
        large=lambda z: np.abs(z[np.isfinite(z)]).max() >= 1e3,
        peaked=lambda z: len(z) >= 2 and (gaps(z)[-1:] >= 20).all(),
    )


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_exact_configs_keep_fraction_rows_exact(data):
    V = data.draw(st.integers(1, 6))
    config = data.draw(sampling_configs(vocab_size=V, exact=True))
    assert all(type(v) is F for v in (config.temperature, config.top_p, config.min_p))
    assert config.greedy or (1 / config.temperature).denominator == 1
    assert config.top_k is None or 1 <= config.top_k <= V
    assert_exact_rows(process_probs(data.draw(distributions(vocab_size=V, exact=True)), config))


@pytest.mark.parametrize("exact", [False, True])
def test_every_config_kind_occurs(exact):
    assert_occurs(
        sampling_configs(vocab_size=4, exact=exact),
        greedy=lambda c: c.greedy,
        tempered=lambda c: not c.greedy and c.temperature != 1,
        top_k=lambda c: c.top_k is not None,
        top_k_is_V=lambda c: c.top_k == 4,
        top_p=lambda c: c.top_p < 1,
        min_p=lambda c: c.min_p > 0,
        all_rules=lambda c: not c.greedy and c.top_k and c.top_p < 1 and c.min_p > 0,
        plain=lambda c: c == SamplingConfig(temperature=c.temperature),
    )
    assert not any(c.greedy for c in collect(sampling_configs(allow_greedy=False, exact=exact), n=50))


# ---------------------------------------------------------------- step inputs


@settings(max_examples=60, deadline=None)
@given(step_inputs(), step_inputs(exact=True), st.integers(0, 2**32 - 1))
def test_step_inputs_are_valid_for_speculative_step(floats, exact, seed):
    for step, check in ((floats, assert_float_rows), (exact, assert_exact_rows)):
        assert isinstance(step, StepInput)
        K, V = step.q_draft.shape
        assert 1 <= K <= 4 and 2 <= V <= 8
        assert step.p_target.shape == (K + 1, V) and step.draft_tokens.shape == (K,)
        check(step.p_target)
        check(step.q_draft)
        assert all(step.q_draft[i, x] > 0 for i, x in enumerate(step.draft_tokens))
        out = speculative_step(*step, np.random.default_rng(seed))
        assert 1 <= len(out) <= K + 1


def at_x(step):
    """``[(p_i(x_i), q_i(x_i))]`` for the K draft tokens."""
    return [(step.p_target[i, x], step.q_draft[i, x]) for i, x in enumerate(step.draft_tokens)]


def all_equal(step):
    return all((p == q).all() for p, q in zip(step.p_target, step.q_draft))


@pytest.mark.parametrize("exact", [False, True])
def test_every_step_case_occurs(exact):
    K = lambda s: len(s.draft_tokens)  # noqa: E731
    assert_occurs(
        step_inputs(exact=exact),
        K_is_1=lambda s: K(s) == 1,
        K_is_4=lambda s: K(s) == 4,
        equal=lambda s: K(s) >= 2 and all_equal(s),
        all_accept=lambda s: K(s) >= 2 and not all_equal(s) and all(p >= q for p, q in at_x(s)),
        reject_first=lambda s: at_x(s)[0][0] == 0,
        reject_later=lambda s: any(p == 0 for p, _ in at_x(s)[1:]),
        q_zeros=lambda s: (s.q_draft == 0).any(axis=1).all(),
        near=lambda s: not all_equal(s) and all(abs(p - q).max() <= 1e-12 for p, q in zip(s.p_target, s.q_draft)),
    )


@pytest.mark.parametrize("exact", [False, True])
def test_step_edge_cases_behave_as_their_rows_say(exact):
    rng = np.random.default_rng(0)
    for step in collect(step_inputs(exact=exact), n=100):
        p, q, x = step
        K = len(x)
        emitted = speculative_step(*step, rng)
        if all(pt >= qt for pt, qt in at_x(step)):  # accepted with probability 1: K tokens and the bonus
            assert len(emitted) == K + 1 and emitted[:K] == list(x)
        if at_x(step)[0][0] == 0:  # rejected with probability 1: one token, from the residual
            assert len(emitted) == 1
            if exact or residual_mass(p[0], q[0]) > RESIDUAL_TOL:
                assert p[0, emitted[0]] > q[0, emitted[0]]
            else:  # q(x_1) ~ 1e-14 (a "near" row): rounding-level mass, drawn from p (SPEC §3)
                assert p[0, emitted[0]] > 0


def test_step_inputs_take_fixed_sizes():
    for step in collect(step_inputs(k=3, vocab_size=st.just(5)), n=20):
        assert step.q_draft.shape == (3, 5)


# ---------------------------------------------------------------- table models


@settings(max_examples=50, deadline=None)
@given(table_models(), table_models(exact=True), table_models(kind="logits"), sampling_configs(vocab_size=2))
def test_table_models_are_valid(floats, exact, logit_table, config):
    assert isinstance(floats, ProbTable) and isinstance(exact, ProbTable) and isinstance(logit_table, LogitTable)
    for model, check in ((floats, assert_float_rows), (exact, assert_exact_rows)):
        V = model.vocab_size
        assert model.table.shape == (V, V)
        check(model.table)
        check(model.probs(list(range(V))))
    V = logit_table.vocab_size
    rows = logit_table(list(range(V)))
    assert rows.shape == (V, V) and np.isfinite(rows).any(axis=1).all()
    assert_float_rows(process(rows, config))


def table_rows(pair):
    target, draft = pair
    if isinstance(target, LogitTable):
        return process(target.table, SamplingConfig()), process(draft.table, SamplingConfig())
    return target.table, draft.table


@pytest.mark.parametrize("kind, exact", [("probs", False), ("probs", True), ("logits", False)])
def test_table_pairs_are_valid(kind, exact):
    for target, draft in collect(table_model_pairs(kind=kind, exact=exact), n=40):
        assert type(target) is type(draft) and target.vocab_size == draft.vocab_size
        assert target is not draft
        for rows in table_rows((target, draft)):
            (assert_exact_rows if exact else assert_float_rows)(rows)


@pytest.mark.parametrize("kind, exact", [("probs", False), ("probs", True), ("logits", False)])
def test_table_pair_relations_occur(kind, exact):
    near = F(1, 10**6) if exact else 1e-12
    alpha = lambda pair: np.minimum(*table_rows(pair)).sum(axis=1)  # noqa: E731
    gap = lambda pair: np.abs(np.subtract(*table_rows(pair))).max()  # noqa: E731
    assert_occurs(
        table_model_pairs(kind=kind, exact=exact),
        identical=lambda pair: pair[0].vocab_size >= 2 and np.array_equal(pair[0].table, pair[1].table),
        always_reject=lambda pair: pair[0].vocab_size >= 2 and (alpha(pair) == 0).all(),
        near=lambda pair: 0 < gap(pair) <= near,
        other=lambda pair: gap(pair) > 1e-6 and (alpha(pair) > 0).any(),
    )
