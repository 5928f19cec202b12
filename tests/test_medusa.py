"""Medusa (SPEC §16.2): the tree of candidates, the lossless law, typical acceptance's exact TV, calls, slips.

Exact throughout: the lossless variant's law is enumerated by
:func:`~specref.verification.laws.enumeration.law_iterated` and compared with
:func:`~specref.verification.laws.enumeration.target_law` (TV exactly 0 on Fraction rows); the same law
comes a second way from :func:`specref.decoding.medusa.medusa_output_law` (each iteration's closed form,
no rng), and the calls from :func:`~specref.verification.statistics.efficiency.iterations_law`.  The
typical rule's TV is exact too (its thresholds are float decisions; the probabilities stay Fractions).
"""

import itertools
from fractions import Fraction

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import GREEDY, SamplingConfig
from specref.core.tree import DraftTree
from specref.core.tree_verify import typical_acceptance
from specref.decoding.blockwise import window_key
from specref.decoding.chain import speculative_transition
from specref.decoding.medusa import (
    PAPER_DELTA,
    PAPER_EPSILON,
    PAPER_GRID,
    calls_per_token,
    cartesian_choices,
    medusa_candidates,
    medusa_decode,
    medusa_output_law,
    medusa_shape,
    medusa_transition,
    sparse_choices,
    tv_to_target,
    typical_passes,
    typical_path,
    typical_tv_table,
)
from specref.verification.cases.tables import ProbTable
from specref.verification.laws.enumeration import compare, law_iterated, target_law
from specref.verification.statistics.efficiency import iterations_law
from specref.verification.zoo.drafting import DRAFTING_ZOO, DraftingEntry, entries
from toy_models.heads import RolledHeads, fit_transformer_heads, random_heads
from toy_models.ngram import NGramModel, random_table_corpus
from toy_models.transformer import CachedTransformer, TransformerConfig, init_params

T1 = SamplingConfig()
TREE = cartesian_choices([2, 2])  # 6 candidates, depth 2


def peaked_table(V, seed, concentration=0.4):
    """A bigram table of exact rows: Dirichlet(concentration) in 1/200ths, 1 added (no zeros)."""
    rng = np.random.default_rng(seed)
    counts = np.round(rng.dirichlet(np.full(V, concentration), size=V) * 200).astype(int) + 1
    table = np.vectorize(Fraction, otypes=[object])(counts)
    return table / table.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def bigram():
    target = NGramModel.random(order=2, vocab_size=4, seed=7).exact
    return target, RolledHeads(target, 3, window=1)


@pytest.fixture(scope="module")
def peaked():
    target = ProbTable(peaked_table(6, 4))
    return target, RolledHeads(target, 2, window=1)


def calls_law(iteration, key):
    """:func:`iterations_law` memoised on ``key``: each block marked with -1, the marks counted."""
    def marked(state, rng):
        block, following = iteration(state, rng)
        return tuple(block) + (-1,), following

    out: dict = {}
    for tokens, w in law_iterated((), marked, key=key).items():
        out[tokens.count(-1)] = out.get(tokens.count(-1), 0) + w
    return out


def mean(law):
    return sum(n * w for n, w in law.items())


# ---------------------------------------------------------------- the tree of candidates


def test_the_choices_make_the_papers_trees():
    assert cartesian_choices([2, 3]) == [(0,), (1,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]  # 2 + 2 x 3
    shape = medusa_shape([[1], [0, 1], [0], [0, 0]])
    assert shape.choices == ((0,), (1,), (0, 0), (0, 1)) and shape.parents == (-1, 0, 0, 1, 1)
    rows = np.array([[0.1, 0.5, 0.4, 0.0], [0.3, 0.3, 0.2, 0.2]])  # head 1 ranks 1, 2, 0, 3; head 2: 0, 1, 2, 3
    assert medusa_candidates(shape, rows) == DraftTree((-1, 0, 0, 1, 1), (-1, 1, 2, 0, 1))
    # §2.3.3: add the connected node with the largest product of accuracies, 5 times
    accuracy = [[0.6, 0.2, 0.1], [0.5, 0.3, 0.1]]  # (0,) .6, (0, 0) .3, (1,) .2, (0, 1) .18, (2,) .1 ...
    assert sparse_choices(accuracy, 5) == [(0,), (1,), (2,), (0, 0), (0, 1)]


# ---------------------------------------------------------------- greedy identity


def greedy_output(target, prompt, n):
    (out,) = target_law(target, prompt, GREEDY, n)
    return list(out)


def test_medusa_at_temperature_0_is_greedy_decoding_on_125_ngram_prompts():
    target = NGramModel.fit(random_table_corpus(5, 12, 30, seed=1), order=3, vocab_size=5, add_k=Fraction(1, 2)).exact
    heads = RolledHeads(target, 3, window=2)
    accepted = []
    for prompt in itertools.product(range(5), repeat=3):
        result = medusa_decode(target, heads, list(prompt), choices=cartesian_choices([2, 2, 1]), max_new_tokens=8,
                               config=GREEDY, rng=np.random.default_rng(0))
        assert result.tokens == greedy_output(target, list(prompt), 8), prompt
        accepted += result.accepted_per_iteration[1:]
    counts = np.bincount(accepted, minlength=4)
    assert counts[0] > 0 and counts[1:].sum() > 0  # rejections and acceptances


def test_medusa_at_temperature_0_is_greedy_decoding_on_100_transformer_prompts():
    config = TransformerConfig(n_vocab=8, n_ctx=20, n_embd=32, n_layer=2, n_head=2)
    params = init_params(config, seed=5)
    params["wte"] = params["wte"] * 4
    model = CachedTransformer(params, config)
    heads = fit_transformer_heads(model, 3, seed=1, n_seqs=120, length=14)
    rng = np.random.default_rng(0)
    accepted = []
    for _ in range(100):
        prompt = [int(t) for t in rng.integers(8, size=rng.integers(1, 5))]
        result = medusa_decode(model, heads, prompt, choices=cartesian_choices([2, 2, 1]), max_new_tokens=8,
                               config=GREEDY, rng=rng)
        assert result.tokens == greedy_output(model, prompt, 8), prompt
        accepted += result.accepted_per_iteration[1:]
    assert 0 in accepted and max(accepted) == 3


# ---------------------------------------------------------------- the lossless law


@pytest.mark.parametrize("config, n, stops", [(T1, 4, (2,)), (SamplingConfig(temperature=Fraction(1, 2)), 4, ()),
                                              (SamplingConfig(top_k=2), 5, (3,))])
def test_the_lossless_variants_law_is_the_targets_exactly(bigram, config, n, stops):
    target, heads = bigram
    iteration = medusa_transition(target, heads, [0, 1], choices=TREE, max_new_tokens=n, config=config,
                                  stop_tokens=stops)
    got = law_iterated((), iteration, key=window_key([0, 1], 1))
    c = compare(got, target_law(target, [0, 1], config, n, stops))
    assert c.exact and c.tv == 0
    closed = medusa_output_law(target, heads, [0, 1], choices=TREE, max_new_tokens=n, config=config, stop_tokens=stops)
    assert closed == dict(got)  # the closed form, no rng: the same law to the last Fraction


def test_the_lossless_law_holds_for_heads_that_rarely_accept_and_a_trigram_target():
    target = NGramModel.random(order=3, vocab_size=3, seed=5).exact
    heads = random_heads(3, 2, window=2, seed=9, exact=True)
    iteration = medusa_transition(target, heads, [2, 0], choices=cartesian_choices([2, 1]), max_new_tokens=4)
    got = law_iterated((), iteration, key=window_key([2, 0], 2))
    assert compare(got, target_law(target, [2, 0], T1, 4)).tv == 0


# ---------------------------------------------------------------- calls


def test_the_calls_by_three_routes_agree(bigram):
    target, heads = bigram
    iteration = medusa_transition(target, heads, [0], choices=TREE, max_new_tokens=4, stop_tokens=(2,))
    enumerated = iterations_law(iteration)  # whole states, no key
    assert calls_law(iteration, window_key([0], 1)) == enumerated
    tokens = sum(len(out) * w for out, w in target_law(target, [0], T1, 4, (2,)).items())
    assert calls_per_token(target, heads, [0], choices=TREE, max_new_tokens=4, stop_tokens=(2,)) == \
        mean(enumerated) / tokens


def test_calls_per_token_against_algorithm_1_with_a_draft_model(peaked):
    # the values are recorded by benchmarks/methods_heads.py; here: exact, and within the bounds a call allows
    target, heads = peaked
    draft = ProbTable((peaked_table(6, 4) + peaked_table(6, 40)) / 2)
    n = 4
    medusa = calls_per_token(target, heads, [0], choices=TREE, max_new_tokens=n)
    algorithm_1 = mean(calls_law(speculative_transition(target, draft, [0], k=2, config=T1, max_new_tokens=n),
                                 window_key([0], 1))) / n
    for value in (medusa, algorithm_1):
        assert isinstance(value, Fraction) and Fraction(2, n) <= value <= 1


# ---------------------------------------------------------------- typical acceptance (§2.3.1)


def test_typical_acceptance_at_temperature_0_is_greedy_decoding(bigram):
    # the paper: "when the temperature is set to 0, it reverts to greedy decoding"
    target, heads = bigram
    for verify in ("typical", "typical_sampled"):
        law = medusa_output_law(target, heads, [3], choices=TREE, max_new_tokens=5, config=GREEDY, verify=verify)
        assert compare(law, target_law(target, [3], GREEDY, 5)).tv == 0


def test_with_delta_below_1_the_greedy_token_always_passes():
    # the paper: "the outcome of greedy decoding will consistently be accepted with appropriate epsilon,
    # delta": exp(-H(p)) <= max p, so delta < 1 puts the threshold below max p; with delta = 1 a uniform
    # row's argmax fails the strict test
    rng = np.random.default_rng(0)
    for _ in range(200):
        row = rng.dirichlet(np.full(5, rng.choice([0.1, 1.0, 10.0])))
        assert typical_passes(row, int(np.argmax(row)), 1.0, 0.999)
    assert not typical_passes(np.full(4, 0.25), 0, 1.0, 1.0)


def test_the_typical_path_is_the_existing_verifiers_path():
    rng = np.random.default_rng(3)
    tree = medusa_candidates(medusa_shape(TREE), rng.dirichlet(np.ones(5), size=2))
    for _ in range(50):
        p = rng.dirichlet(np.full(5, 0.5), size=tree.size)
        ours = typical_path(tree, p, 0.2, 0.4)
        theirs, _ = typical_acceptance(tree, p, None, np.random.default_rng(0), epsilon=0.2, delta=0.4)
        assert ours == theirs


def test_typical_acceptance_has_a_positive_exact_tv_and_the_sampled_variant_none_when_nothing_passes(peaked):
    target, heads = peaked
    settings = dict(choices=TREE, max_new_tokens=4)
    never = (1.0, 1e6)  # threshold min(1, 1e6 exp(-H)) = 1: no p(x) > 1
    default, *_, limit = typical_tv_table(target, heads, [0], grid=[(PAPER_EPSILON, PAPER_DELTA), never], **settings)
    assert default["tv"] > 0 and default["tv_sampled_next"] > 0
    assert limit["tv_sampled_next"] == 0 and limit["calls_per_token_sampled_next"] == 1
    # the paper's rule is deterministic: accepting nothing leaves greedy decoding, whose TV is 1 - P(greedy output)
    greedy = tuple(greedy_output(target, [0], 4))
    assert limit["tv"] == 1 - target_law(target, [0], T1, 4)[greedy] > 0
    # the table's TV by a second route: law_iterated of the transition against target_law
    iteration = medusa_transition(target, heads, [0], verify="typical_sampled", **settings)
    assert compare(law_iterated((), iteration), target_law(target, [0], T1, 4)).tv == default["tv_sampled_next"]


def test_the_tv_table_over_the_papers_grid_is_exact(peaked):
    target, heads = peaked
    table = typical_tv_table(target, heads, [0], choices=TREE, max_new_tokens=4)
    assert [(r["epsilon"], r["delta"]) for r in table] == list(PAPER_GRID)
    for row in table:
        assert isinstance(row["tv"], Fraction) and 0 < row["tv"] < 1 and 0 < row["tv_sampled_next"] < 1


def test_tv_to_target_is_the_total_variation(bigram):
    target, heads = bigram
    law = medusa_output_law(target, heads, [1], choices=TREE, max_new_tokens=3, verify="typical_sampled",
                            stop_tokens=(2,))
    assert tv_to_target(law, target, [1], T1, 3, (2,)) == compare(law, target_law(target, [1], T1, 3, (2,))).tv


def test_a_higher_temperature_does_not_lengthen_the_accepted_prefix_on_this_table():
    # the paper: "an increased temperature will correspondingly result in longer accepted sequences"; on a
    # peaked V = 6 bigram (seed 4, tree [3, 2], 5 tokens) the exact calls per token of the sampled variant
    # go up from T = 1/2 to T = 1, i.e. the accepted prefix gets shorter: the claim does not hold here
    target = ProbTable(peaked_table(6, 4))
    heads = RolledHeads(target, 2, window=1)
    calls = [calls_per_token(target, heads, [0], choices=cartesian_choices([3, 2]), max_new_tokens=5,
                             config=SamplingConfig(temperature=t), verify="typical_sampled")
             for t in (Fraction(1, 2), Fraction(1))]
    assert calls[1] > calls[0]


# ---------------------------------------------------------------- the zoo's slips


@pytest.mark.parametrize("name", [e.name for e in entries(method="medusa") if e.kind == "wrong"])
def test_a_slip_in_what_is_verified_or_emitted_is_caught(bigram, name):
    target, heads = bigram
    entry = DRAFTING_ZOO[name]
    tvs = {}
    for label, config in (("law", T1), ("greedy", GREEDY)):
        iteration = entry.transition(target, heads, [0, 1], choices=TREE, max_new_tokens=4, config=config)
        tvs[label] = compare(law_iterated((), iteration, key=window_key([0, 1], 1)),
                             target_law(target, [0, 1], config, 4)).tv
    assert all(tvs[c] > 0 for c in entry.caught_by), tvs
    if "greedy" not in entry.caught_by:  # a rule that is greedy at T = 0 slips past greedy identity
        assert tvs["greedy"] == 0


def test_a_slip_in_what_is_drafted_keeps_the_law_and_costs_calls(bigram):
    target, heads = bigram
    key = window_key([0, 1], 1)
    slip = DRAFTING_ZOO["heads_one_depth_off"].transition(target, heads, [0, 1], choices=TREE, max_new_tokens=4,
                                                           config=T1)
    assert compare(law_iterated((), slip, key=key), target_law(target, [0, 1], T1, 4)).tv == 0
    reference = medusa_transition(target, heads, [0, 1], choices=TREE, max_new_tokens=4)
    assert mean(calls_law(slip, key)) > mean(calls_law(reference, key))


def test_the_approximate_entries_are_reported_not_lossless(bigram):
    target, heads = bigram
    for entry in entries(kind="approximate", method="medusa"):
        iteration = entry.transition(target, heads, [0, 1], choices=TREE, max_new_tokens=4, config=T1)
        assert compare(law_iterated((), iteration), target_law(target, [0, 1], T1, 4)).tv > 0


def test_the_zoo_refuses_a_wrong_entry_that_only_changes_the_draft():
    with pytest.raises(SpecrefError, match="changes what is verified or emitted"):
        DraftingEntry("x", "medusa", lambda *a, **k: None, "wrong", "drafted", ("law",), "a drafting slip")
    with pytest.raises(SpecrefError, match="kind must be None or one of"):
        entries(kind="lossy")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("choices, message", [
    ([], "at least one rank path"),
    ("00", "must be a list of rank paths"),
    ([[0], []], r"choices\[1\] = \[\] must be a non-empty path"),
    ([[0], [-1]], r"choices\[1\] = \[-1\] must hold ranks"),
    ([[0], [True]], r"choices\[1\] = \[True\] must hold ranks"),
    ([[0], [0]], r"choices\[1\] = \[0\] repeats choices\[0\]"),
    ([[0], [1, 0]], r"choices\[1\] = \[1, 0\]: its prefix \[1\] is not a choice"),
    ([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]], "reach depth 4 but heads"),
    ([[0], [5]], "rank 5, which needs V > 5"),
])
def test_malformed_choices_are_named(bigram, choices, message):
    target, heads = bigram
    with pytest.raises(SpecrefError, match=message):
        medusa_decode(target, heads, [0], choices=choices, max_new_tokens=3, rng=np.random.default_rng(0))


@pytest.mark.parametrize("kwargs, message", [
    (dict(epsilon=0.0), r"epsilon must be in \(0, 1\], got 0.0"),
    (dict(epsilon=1.5), r"epsilon must be in \(0, 1\], got 1.5"),
    (dict(delta=-0.1), r"delta must be in \(0, inf\), finite, got -0.1"),
    (dict(delta=float("inf")), "delta must be in"),
    (dict(epsilon="0.1"), "epsilon must be a real number"),
    (dict(verify="rejection"), "verify must be a tree verifier or one of"),
    (dict(config=0.5), "config must be a SamplingConfig"),
])
def test_bad_thresholds_and_settings_are_named(bigram, kwargs, message):
    target, heads = bigram
    settings = dict(choices=TREE, max_new_tokens=3, verify="typical") | kwargs
    with pytest.raises(SpecrefError, match=message):
        medusa_decode(target, heads, [0], rng=np.random.default_rng(0), **settings)


def test_a_head_row_of_the_wrong_length_is_named(bigram):
    target, _ = bigram
    with pytest.raises(SpecrefError, match=r"V = 4 entries, got shape \(3, 5\)"):
        medusa_decode(target, lambda t: np.full((3, 5), 0.2), [0], choices=TREE, max_new_tokens=3,
                      rng=np.random.default_rng(0))
    with pytest.raises(SpecrefError, match="heads count K must be >= 1"):
        medusa_decode(target, lambda t: np.empty((0, 4)), [0], choices=TREE, max_new_tokens=3,
                      rng=np.random.default_rng(0))
