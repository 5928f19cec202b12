"""The exact verifier (SPEC §5): enumeration by replay, memoisation, comparison of laws.

Every law here is checked against a second, independent computation: a hand-computed
law, the product of conditionals (``target_law``), or the unmemoised enumeration.
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.core.step import speculative_step
from specref.decoding.chain import sample_target, speculative_decode, speculative_transition, target_transition
from specref.verification.laws.enumeration import (
    Law,
    LawComparison,
    LazyUniform,
    LazyUniformError,
    compare,
    iterate,
    law,
    law_iterated,
    target_law,
)

# ----------------------------------------------------------------------------- models


class ExactBigram:
    """An exact model: ``probs(tokens)`` gives Fraction rows ``[len(tokens), V]``, row i = table[tokens[i]]."""

    def __init__(self, table):
        self.table = np.array([[F(x) for x in row] for row in table], dtype=object)  # [V, V]

    def probs(self, tokens):  # [n] -> [n, V]
        return self.table[list(tokens)]


class LogitBigram:
    """A float model: ``model(tokens) -> logits [len(tokens), V]``, row i = logits[tokens[i]]."""

    def __init__(self, logits):
        self.logits = np.asarray(logits, dtype=np.float64)  # [V, V]

    def __call__(self, tokens):  # [n] -> [n, V]
        return self.logits[list(tokens)]


class LogitTable:
    """Fixed logits per position (depends on how many tokens there are, not which)."""

    def __init__(self, logits):
        self.logits = np.asarray(logits, dtype=np.float64)  # [positions, V]

    def __call__(self, tokens):  # [n] -> [n, V]
        n = len(tokens)
        return self.logits[[min(i, len(self.logits) - 1) for i in range(n)]]


def random_exact_bigram(V, seed, *, zeros=True):
    rng = np.random.default_rng(seed)
    table = []
    for _ in range(V):
        counts = rng.integers(0 if zeros else 1, 5, size=V)
        counts[rng.integers(V)] += 1  # at least one positive count per row
        table.append([F(int(c), int(counts.sum())) for c in counts])
    return ExactBigram(table)


def bigram_key(prompt):
    """Memo key for bigram models: the last token and how many were generated."""
    return lambda state: (state[-1] if state else prompt[-1], len(state))


P_EX = np.array([F(1, 5), F(1, 2), F(3, 10)], dtype=object)  # SPEC §3 worked example, target
Q_EX = np.array([F(3, 5), F(3, 10), F(1, 10)], dtype=object)  # ... and draft
EXACT = SamplingConfig()  # temperature 1: exact on Fraction rows

# ----------------------------------------------------------------------------- hand-computed laws


def _nested_program(rng):
    """Choices whose number and sizes depend on earlier outcomes, plus uniforms compared twice."""
    n = 1 + rng.choice(3, p=np.array([F(1, 2), F(1, 3), F(1, 6)], dtype=object))
    out = []
    for _ in range(n):
        u = rng.random()
        out.append(0 if u < F(1, 7) else (1 if u < F(5, 7) else int(rng.choice(n + 1))))
    return tuple(out)


@pytest.mark.parametrize(
    "program",
    [
        _nested_program,
        lambda rng: (rng.choice(5, p=[0.1, 0.2, 0.3, 0.15, 0.25]), rng.random() < 0.3, rng.random() >= 0.9),
        lambda rng: tuple(rng.choice(4, size=3)),
    ],
)
def test_enumerated_law_sums_to_one(program):
    got = law(program)
    total = got.total()
    assert total == 1 if got.exact else abs(total - 1) <= 1e-12
    assert all(v > 0 for v in got.values()) and got.leaves == len(got) <= got.paths



def test_worked_example_one_step_gives_p_exactly():
    def program(rng):
        x = rng.choice(3, p=Q_EX)
        return speculative_step(np.stack([P_EX, P_EX]), Q_EX[None], [x], rng)[0]

    got = law(program)
    assert dict(got) == {0: F(1, 5), 1: F(1, 2), 2: F(3, 10)}
    assert got.exact and got.total() == 1


def test_worked_example_classic_bug_resample_from_p():
    # SPEC §3: "on rejection, resample from p" gives [7/25, 1/2, 11/50]
    def buggy(rng):
        x = rng.choice(3, p=Q_EX)
        if rng.random() < P_EX[x] / Q_EX[x]:
            return x
        return rng.choice(3, p=P_EX)

    got = law(buggy)
    assert dict(got) == {0: F(7, 25), 1: F(1, 2), 2: F(11, 50)}
    c = compare(got, {0: F(1, 5), 1: F(1, 2), 2: F(3, 10)})
    assert c.exact and c.tv == F(2, 25) and c.max_diff == F(2, 25)
    assert {c.worst[0][0], c.worst[1][0]} == {0, 2} and c.worst[2][0] == 1


@pytest.mark.parametrize("t1, t2", [(F(3, 10), F(4, 5)), (0.3, 0.8)])
def test_one_uniform_compared_twice_refines_its_interval(t1, t2):
    def program(rng):
        u = rng.random()
        if u < t1:
            return "A"
        if u < t2:  # only [t1, 1) is still possible here
            return "B"
        return "C"

    got = law(program)
    assert got.paths == 3 and got.leaves == 3
    if isinstance(t1, F):
        assert dict(got) == {"A": F(3, 10), "B": F(1, 2), "C": F(1, 5)} and got.exact
    else:
        assert got == pytest.approx({"A": 0.3, "B": 0.5, "C": 0.2}, abs=1e-15)
        assert math.fsum(got.values()) == pytest.approx(1.0, abs=1e-15)


def test_all_comparison_forms_and_threshold_types():
    def program(rng):
        u = rng.random()
        return (
            bool(u < 0.5),  # float
            bool(F(1, 4) > u),  # reflected, Fraction
            bool(np.float64(0.75) <= u),  # NumPy scalar on the left
            bool(u >= np.float32(0.125)),
            bool(u > 2),  # never: decided without a branch
            bool(u <= 0),  # probability 0: no branch
        )

    got = law(program)
    # interval cut points 1/8, 1/4, 1/2, 3/4 -> five cells of lengths 1/8, 1/8, 1/4, 1/4, 1/4
    assert got == pytest.approx(
        {
            (True, True, False, False, False, False): 0.125,
            (True, True, False, True, False, False): 0.125,
            (True, False, False, True, False, False): 0.25,
            (False, False, False, True, False, False): 0.25,
            (False, False, True, True, False, False): 0.25,
        }
    )
    assert got.paths == 5


def test_array_of_uniforms_and_exactness_of_choice_without_p():
    def program(rng):
        us = rng.random(3)
        assert us.shape == (3,) and isinstance(us[0], LazyUniform)
        below = us < np.array([0.5, 0.25, 1.0])  # elementwise comparisons
        return tuple(bool(b) for b in below) + (rng.choice(3), rng.integers(1, 3))

    got = law(program)
    assert got.total() == pytest.approx(1.0, abs=1e-15)
    assert got[(True, True, True, 0, 1)] == pytest.approx(0.5 * 0.25 / 6)
    assert law(lambda rng: (rng.choice(3), rng.choice(["a", "b"]))) == {
        (i, s): F(1, 6) for i in range(3) for s in "ab"
    }


def test_nan_threshold_behaves_like_a_float():
    got = law(lambda rng: (rng.random() < float("nan"), rng.random() >= float("nan")))
    assert dict(got) == {(False, False): 1}


def test_zero_probabilities_open_no_branch():
    got = law(lambda rng: (rng.choice(4, p=[0.0, 0.5, 0.0, 0.5]), rng.random() < 0.0))
    assert set(got) == {(1, False), (3, False)} and got.paths == 2


def test_deterministic_program():
    got = law(lambda rng: "only")
    assert dict(got) == {"only": 1} and got.exact and got.paths == 1


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "use",
    [
        lambda u: u + 1,
        lambda u: 1 - u,
        lambda u: u * 2,
        lambda u: 0.5 / u,
        lambda u: -u,
        lambda u: float(u),
        lambda u: int(u),
        lambda u: bool(u),
        lambda u: np.exp(u),
        lambda u: np.float64(2.0) * u,
        lambda u: u == 0.5,
        lambda u: u < u,  # two lazy uniforms: not an interval split
        lambda u: u < np.array([0.1, 0.2]),
        lambda u: u < "0.5",
    ],
)
def test_arithmetic_on_a_lazy_uniform_is_refused(use):
    with pytest.raises(LazyUniformError, match=r"comparisons.*choice") as info:
        law(lambda rng: use(rng.random()))
    assert isinstance(info.value, SpecrefError)


def test_array_arithmetic_on_uniforms_is_refused():
    with pytest.raises(LazyUniformError):
        law(lambda rng: tuple(rng.random(2) * 2 < 1))


@pytest.mark.parametrize(
    "p, match",
    [
        ([0.5, 0.6], "p sums to"),
        ([0.5, 0.25, 0.25], "length 2"),
        ([1.5, -0.5], "non-negative"),
        ([float("nan"), 1.0], "finite"),
        ([F(1, 3), F(1, 3)], "not exactly 1"),
    ],
)
def test_choice_validates_p(p, match):
    with pytest.raises(SpecrefError, match=match):
        law(lambda rng: rng.choice(2, p=np.array(p, dtype=object if isinstance(p[0], F) else float)))


def test_unknown_generator_method_and_unhashable_output():
    with pytest.raises(SpecrefError, match="normal"):
        law(lambda rng: rng.normal())
    with pytest.raises(SpecrefError, match="hashable"):
        law(lambda rng: [rng.choice(2)])


def test_program_exceptions_propagate():
    def program(rng):
        if rng.choice(2) == 1:
            raise KeyError("boom")
        return 0

    with pytest.raises(KeyError, match="boom"):
        law(program)


def test_program_not_replayable_is_detected():
    runs = []

    def program(rng):  # hidden state: the first run draws twice, every replay once
        runs.append(None)
        return tuple(rng.choice(2) for _ in range(2 if len(runs) == 1 else 1))

    with pytest.raises(SpecrefError, match="replayed"):
        law(program)


def test_max_paths_caps_a_runaway_program():
    with pytest.raises(SpecrefError, match="max_paths=100"):
        law(lambda rng: tuple(rng.choice(2) for _ in range(10)), max_paths=100)
    with pytest.raises(SpecrefError, match="max_paths=10"):
        law_iterated((), _coin_iteration(5), max_paths=10)


# ----------------------------------------------------------------------------- memoisation


def _coin_iteration(length):
    """Emits 1 or 2 fair-ish tokens per iteration until `length` tokens; state = tokens so far."""

    def iteration(state, rng):
        n = 1 + (rng.random() < F(1, 3))
        block = tuple(int(rng.choice(2, p=[F(1, 4), F(3, 4)])) for _ in range(n))[: length - len(state)]
        nxt = state + block
        return block, (None if len(nxt) >= length else nxt)

    return iteration


def test_memoised_and_unmemoised_agree_on_a_hand_written_decoder():
    it = _coin_iteration(5)
    memo = law_iterated((), it)
    plain = law_iterated((), it, memoise=False)
    assert memo == plain and memo.exact and memo.total() == 1
    # every output is 5 tokens with independent Bernoulli(3/4) entries
    assert dict(memo) == {
        o: F(3, 4) ** sum(o) * F(1, 4) ** (5 - sum(o)) for o in plain
    } and memo.leaves == 32
    # memo key = number of tokens so far (the law of the rest depends on nothing else)
    by_length = law_iterated((), it, key=len)
    assert by_length == memo and by_length.states == 5 and by_length.paths < memo.paths < plain.paths


def test_memo_key_that_recurs_is_an_error():
    def endless(state, rng):
        return (int(rng.choice(2)),), state  # never ends

    with pytest.raises(SpecrefError, match="recurs"):
        law_iterated((), endless)
    assert dict(law_iterated(None, endless)) == {(): 1}


@pytest.mark.parametrize("k, max_new, stops", [(1, 3, ()), (2, 4, (0,)), (3, 2, (1,))])
def test_memoised_and_unmemoised_agree_on_speculative_decoding(k, max_new, stops):
    target, draft = random_exact_bigram(3, 1), random_exact_bigram(3, 2)
    prompt = [2]
    it = speculative_transition(
        target, draft, prompt, k=k, config=EXACT, max_new_tokens=max_new, stop_tokens=stops
    )
    memo = law_iterated((), it, key=bigram_key(prompt))
    plain = law_iterated((), it, memoise=False)
    assert memo == plain
    c = compare(memo, plain)
    assert c.exact and c.tv == 0
    assert memo.total() == 1 and memo.states <= 3 * max_new
    assert memo.paths < plain.paths


# ------------------------------------------------------------------ target sampling == product of conditionals


@pytest.mark.parametrize("max_new, stops", [(1, ()), (3, ()), (4, (0,)), (3, (0, 2))])
def test_target_sampling_law_equals_product_of_conditionals_exact(max_new, stops):
    target = random_exact_bigram(3, 7)
    prompt = [1]

    def program(rng):
        r = sample_target(target, prompt, config=EXACT, max_new_tokens=max_new, stop_tokens=stops, rng=rng)
        return tuple(r.tokens)

    enumerated = law(program)
    conditionals = target_law(target, prompt, EXACT, max_new, stops)
    assert enumerated.exact and conditionals.exact
    assert enumerated.total() == 1 and conditionals.total() == 1
    assert compare(enumerated, conditionals).tv == 0
    assert enumerated == conditionals
    # the memoised route agrees too
    it = target_transition(target, prompt, config=EXACT, max_new_tokens=max_new, stop_tokens=stops)
    assert law_iterated((), it) == conditionals


@pytest.mark.parametrize(
    "config",
    [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=3), SamplingConfig(top_p=0.8, min_p=0.05),
     SamplingConfig(temperature=0)],
)
def test_target_sampling_law_equals_product_of_conditionals_float(config):
    rng0 = np.random.default_rng(3)
    model = LogitTable(rng0.normal(size=(4, 4)) * 2)
    prompt = [0]

    def program(rng):
        r = sample_target(model, prompt, config=config, max_new_tokens=3, stop_tokens=(3,), rng=rng)
        return tuple(r.tokens)

    enumerated = law(program)
    conditionals = target_law(model, prompt, config, 3, (3,))
    assert abs(enumerated.total() - 1) <= 1e-12
    assert compare(enumerated, conditionals).tv <= 1e-12
    assert set(enumerated) == set(conditionals)
    if config.greedy:
        assert len(enumerated) == 1


def test_target_law_by_hand():
    model = ExactBigram([[F(1, 2), F(1, 2)], [F(1, 4), F(3, 4)]])
    got = target_law(model, [0], EXACT, 2, stop_tokens=(1,))
    assert dict(got) == {(1,): F(1, 2), (0, 0): F(1, 4), (0, 1): F(1, 4)}
    assert dict(target_law(model, [0], EXACT, 0)) == {(): 1}
    with pytest.raises(SpecrefError, match="prompt"):
        target_law(model, [], EXACT, 2)
    with pytest.raises(SpecrefError, match="stop_tokens"):
        target_law(model, [0], EXACT, 2, stop_tokens=(5,))


# ------------------------------------------------------------------ speculative decoding preserves the target law


@pytest.mark.parametrize("k", [1, 2, 3])
def test_speculative_decoding_preserves_the_target_law_exactly(k):
    target, draft = random_exact_bigram(3, 11), random_exact_bigram(3, 12)
    prompt = [0]

    def program(rng):
        r = speculative_decode(
            target, draft, prompt, k=k, config=EXACT, max_new_tokens=3, stop_tokens=(2,), rng=rng
        )
        return tuple(r.tokens)

    spec = law(program)
    want = target_law(target, prompt, EXACT, 3, (2,))
    c = compare(spec, want)
    assert c.exact and c.tv == 0 and spec.total() == 1


def test_speculative_decoding_float_bigram_memoised():
    rng0 = np.random.default_rng(5)
    V = 4
    target, draft = LogitBigram(rng0.normal(size=(V, V))), LogitBigram(rng0.normal(size=(V, V)))
    prompt, cfg = [1], SamplingConfig(temperature=0.9, top_k=3)
    it = speculative_transition(target, draft, prompt, k=2, config=cfg, max_new_tokens=4, stop_tokens=(0,))
    spec = law_iterated((), it, key=bigram_key(prompt))
    want = target_law(target, prompt, cfg, 4, (0,))
    assert compare(spec, want).tv <= 1e-12 and abs(spec.total() - 1) <= 1e-12
    assert spec.leaves == len(want)


def test_speculative_decoding_ngram_pair_with_sampling_rules():
    from toy_models.ngram import NGramModel

    target = NGramModel.random(order=2, vocab_size=4, seed=1)
    draft = NGramModel.random(order=2, vocab_size=4, seed=2)
    prompt, cfg = [3], SamplingConfig(top_k=3, top_p=0.9)
    for t, d in ((target.exact, draft.exact), (target, draft)):  # Fraction rows, then float64 rows
        it = speculative_transition(t, d, prompt, k=2, config=cfg, max_new_tokens=4, stop_tokens=(0,))
        spec = law_iterated((), it, key=bigram_key(prompt))
        c = compare(spec, target_law(t, prompt, cfg, 4, (0,)))
        assert c.tv == 0 if spec.exact else c.tv <= 1e-12
    assert spec.states > 1 and spec.paths > spec.states


def test_greedy_speculative_decoding_has_one_output():
    rng0 = np.random.default_rng(8)
    target, draft = LogitBigram(rng0.normal(size=(5, 5))), LogitBigram(rng0.normal(size=(5, 5)))
    it = speculative_transition(target, draft, [0], k=3, config=SamplingConfig(temperature=0), max_new_tokens=5)
    spec = law_iterated((), it)
    want = target_law(target, [0], SamplingConfig(temperature=0), 5)
    assert len(spec) == 1 and dict(spec) == dict(want) and spec.paths == spec.states


def test_a_buggy_decoder_is_caught():
    # Known bug 1 (SPEC §7): the correction drawn from p instead of the residual.
    target, draft = random_exact_bigram(3, 21, zeros=False), random_exact_bigram(3, 22, zeros=False)
    prompt = [0]

    def buggy_iteration(state, rng):
        tokens = prompt + list(state)
        q = draft.probs(tokens)[-1]
        x = int(rng.choice(3, p=q))
        p = target.probs(tokens)[-1]
        block = (x,) if rng.random() < p[x] / q[x] else (int(rng.choice(3, p=p)),)
        nxt = state + block
        return block, (None if len(nxt) >= 3 else nxt)

    got = law_iterated((), buggy_iteration)
    c = compare(got, target_law(target, prompt, EXACT, 3))
    assert c.exact and c.tv > 0 and c.max_diff == abs(c.worst[0][1] - c.worst[0][2])


# ----------------------------------------------------------------------------- comparing laws


def test_compare_reports_tv_max_diff_and_worst_outputs():
    a = {"x": F(1, 2), "y": F(1, 2)}
    b = {"x": F(1, 4), "y": F(1, 4), "z": F(1, 2)}
    c = compare(a, b, top=2)
    assert isinstance(c, LawComparison)
    assert c.tv == F(1, 2) and c.max_diff == F(1, 2) and c.n_outputs == 3 and c.exact
    assert c.worst[0] == ("z", 0, F(1, 2)) and len(c.worst) == 2
    f = compare({"x": 0.5, "y": 0.5}, {"x": 0.5, "y": 0.5})
    assert f.tv == 0.0 and not f.exact
    assert "TV" in str(c)


def test_law_counts_and_float_promotion():
    got = law(lambda rng: (rng.random() < 0.5, rng.random() < F(1, 3)))
    assert isinstance(got, Law) and got.paths == 4 and got.leaves == 4 and got.states == 1
    assert not got.exact and all(type(v) is float for v in got.values())
    assert iterate((), _coin_iteration(2), np.random.default_rng(0)) in law_iterated((), _coin_iteration(2))
