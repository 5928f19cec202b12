"""REST (SPEC §16.4): the suffix array, retrieval and the trie worked by hand, the published sampling
rule's one-call law by hand, the exact law against the target's (the published rule is not
lossless; point-mass verification of the same trie is), greedy identity, calls per token, bad
input and the zoo's REST slips.

Exact laws use Fraction rows (TV == 0 means equal).  The datastore is built from the corpus the
target was trained on: a random table corpus (V = 3) for the exact laws, the toy language
(``toy_models.corpus``, V = 40) for the greedy checks on a trigram model and on the trained
one-layer transformer, 100 prompts each.
"""

from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import GREEDY, SamplingConfig
from specref.core.tree import DraftTree
from specref.decoding.chain import sample_target
from specref.decoding.rest import RestDatastore, rest_decode, rest_retrieve, rest_transition, rest_trie, rest_verify, \
    suffix_array
from specref.verification.cases.chain import Case
from specref.verification.cases.tables import ProbTable
from specref.verification.laws.enumeration import compare, iterate, law, law_iterated, target_law
from specref.verification.statistics.efficiency import iterations_law, reference_iterations
from specref.verification.zoo.retrieval import calls_per_token, chain_calls_per_token, entries, rest_calls_per_token
from toy_models.ngram import NGramModel, random_table_corpus

F = Fraction
PROMPT = [0, 1, 2, 0, 1]
SMALL = dict(num_draft=16, length=6, max_matches=200)  # the greedy checks: the code's defaults are 64, 10, 5000


@lru_cache(maxsize=None)
def _small():
    """A bigram target fitted to a random table corpus (V = 3), and that corpus as the datastore."""
    docs = random_table_corpus(3, 12, 30, seed=5)
    return NGramModel.fit(docs, order=2, vocab_size=3, add_k=1), RestDatastore([t for d in docs for t in d])


@lru_cache(maxsize=None)
def _corpus():
    from toy_models.corpus import corpus
    from toy_models.transformer import CachedTransformer

    trigram = NGramModel.fit([corpus(20000, seed=2)], order=3, vocab_size=40)
    prompts = [corpus(200, seed=100 + i)[50 + i: 58 + i] for i in range(100)]
    return trigram, CachedTransformer.from_saved("draft_small"), RestDatastore(corpus(5000, seed=1)), prompts


# ---------------------------------------------------------------- the datastore, by hand


@pytest.mark.parametrize("seed", range(5))
def test_the_suffix_array_is_the_sorted_suffixes(seed):
    tokens = [int(x) for x in np.random.default_rng(seed).integers(0, 3, size=40)]
    assert suffix_array(tokens) == sorted(range(40), key=lambda i: tokens[i:])


def test_occurrences_are_every_match_in_suffix_order():
    ds = RestDatastore([1, 2, 3, 1, 2, 4, 1, 2, 3, 0, 2, 3])
    assert ds.occurrences([1, 2]) == [6, 0, 3]  # (1 2 3 0 ..) < (1 2 3 1 ..) < (1 2 4 ..)
    assert ds.occurrences([2, 3]) == [10, 7, 1] and ds.occurrences([4, 4]) == []
    tokens = [int(x) for x in np.random.default_rng(9).integers(0, 3, size=60)]
    scan = [i for i in range(59) if tokens[i:i + 2] == [1, 0]]
    assert sorted(RestDatastore(tokens).occurrences([1, 0])) == scan


def test_retrieval_takes_the_longest_suffix_with_a_continuation():
    ds = RestDatastore([1, 2, 3, 1, 2, 4, 1, 2, 3, 0, 2, 3])
    # (9 1 2) is nowhere; (1 2) at 6, 0, 3 (suffix order): the two tokens after each
    assert rest_retrieve(ds, [9, 1, 2], max_suffix=3, length=2) == (2, [(3, 0), (3, 1), (4, 1)])
    # (2 3) at 10 (the datastore's end: nothing follows), 7, 1
    assert rest_retrieve(ds, [7, 2, 3], max_suffix=3, length=2) == (2, [(0, 2), (1, 2)])
    assert rest_retrieve(ds, [1, 2, 3], max_suffix=3, length=1) == (3, [(0,), (1,)])
    assert rest_retrieve(ds, [1, 2, 3], max_suffix=3, length=1, max_matches=1) == (3, [(0,)])
    assert rest_retrieve(ds, [5, 5], max_suffix=3) == (0, [])


def test_the_trie_keeps_the_most_frequent_prefixes():
    # counts: (3) 2, (4) 1, (3 0) 1, (3 1) 1, (4 1) 1; three kept: (3), then the shorter (4), then (3 0)
    tree, paths = rest_trie([(3, 1), (4, 1), (3, 0)], 3)
    assert tree == DraftTree((-1, 0, 1, 0), (-1, 3, 0, 4)) and paths == [(), (3,), (3, 0), (4,)]
    tree, _ = rest_trie([(3, 1), (4, 1), (3, 0)], 10)  # every prefix: depth-first, siblings by count then token
    assert tree == DraftTree((-1, 0, 1, 1, 0, 4), (-1, 3, 0, 1, 4, 1))


# ---------------------------------------------------------------- the published rule, one call, by hand


def _row(*values):
    return np.array([F(v) for v in values], dtype=object)


def test_the_published_rule_on_one_draft_token_is_worked_by_hand():
    # root row p = (1/2, 1/3, 1/6), one draft token 1, its row r = (1/4, 1/4, 1/2).  The path passes with
    # p(1) = 1/3 and emits (1, y ~ r); else a fresh y ~ p is emitted alone -- token 1 again with 1/3
    p, r = _row("1/2", "1/3", "1/6"), _row("1/4", "1/4", "1/2")
    tree = DraftTree((-1, 0), (-1, 1))
    block = law(lambda rng: _block(tree, np.stack([p, r]), rng))
    want = {(1, y): F(1, 3) * r[y] for y in range(3)}
    want.update({(y,): F(2, 3) * p[y] for y in range(3)})
    assert block == want
    first = {x: sum(w for out, w in block.items() if out[0] == x) for x in range(3)}
    assert first[1] == F(1, 3) + F(2, 3) * F(1, 3) == F(5, 9)  # the target says 1/3


def test_the_published_rule_gives_every_path_its_own_try():
    # two one-token paths, 0 then 2, under p = (1/2, 1/3, 1/6): 0 comes first with 1/2 + (1/2)(5/6)(1/2)
    p = _row("1/2", "1/3", "1/6")
    tree = DraftTree((-1, 0, 0), (-1, 0, 2))
    block = law(lambda rng: _block(tree, np.stack([p, p, p]), rng))
    first = {x: sum(w for out, w in block.items() if out[0] == x) for x in range(3)}
    assert first == {0: F(1, 2) + F(1, 2) * F(5, 6) * F(1, 2), 1: F(1, 2) * F(5, 6) * F(1, 3),
                     2: F(1, 2) * F(1, 6) + F(1, 2) * F(5, 6) * F(1, 6)}


def _block(tree, p_target, rng):
    path, token = rest_verify(tree, p_target, None, rng)
    return tuple(tree.tokens[n] for n in path) + (int(token),)


# ---------------------------------------------------------------- the exact law


SETTINGS = [  # (num_draft, length, max_suffix, max_new_tokens, stops, config)
    (4, 3, 16, 4, (), SamplingConfig()),
    (6, 3, 4, 4, (2,), SamplingConfig()),
    (3, 2, 16, 4, (), SamplingConfig(temperature=F(1, 2))),
    (1, 4, 3, 4, (), SamplingConfig(top_k=2)),
]


@pytest.mark.parametrize("num_draft, length, max_suffix, n, stops, config", SETTINGS)
def test_pointmass_verification_of_the_trie_keeps_the_target_law_and_the_published_rule_does_not(
        num_draft, length, max_suffix, n, stops, config):
    model, ds = _small()
    target = model.exact
    want = target_law(target, PROMPT, config, n, stops)
    settings = dict(max_new_tokens=n, config=config, stop_tokens=stops, num_draft=num_draft, length=length,
                    max_suffix=max_suffix)
    lossless = rest_transition(target, PROMPT, ds, verify="pointmass", **settings)
    c = compare(law_iterated((), lossless), want)
    assert c.exact and c.tv == 0, str(c)
    assert min(iterations_law(lossless)) < n  # drafts were accepted: the rule was exercised
    published = compare(law_iterated((), rest_transition(target, PROMPT, ds, **settings)), want)
    assert published.exact and published.tv > 0, "the published rule: not lossless"


def test_the_memoised_law_is_the_whole_runs_law():
    model, ds = _small()
    it = rest_transition(model.exact, PROMPT, ds, max_new_tokens=3, num_draft=4, length=3)
    assert law_iterated((), it) == law_iterated((), it, memoise=False)


def test_float_rows_on_the_tiny_transformer():
    from specref.verify import transformer_pair

    target, _, prompt = transformer_pair()
    ds = RestDatastore(iterate((), rest_transition(target, prompt, RestDatastore([0]), max_new_tokens=12,
                                                   config=GREEDY), np.random.default_rng(0)))
    config = SamplingConfig(temperature=0.8)
    want = target_law(target, prompt, config, 3)
    lossless = rest_transition(target, prompt, ds, max_new_tokens=3, config=config, verify="pointmass", num_draft=4,
                               length=3)
    assert compare(law_iterated((), lossless), want).tv < 1e-12
    published = rest_transition(target, prompt, ds, max_new_tokens=3, config=config, num_draft=4, length=3)
    assert compare(law_iterated((), published), want).tv > 1e-6


# ---------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("which", ["trigram", "transformer"])
@pytest.mark.parametrize("verify", ["rest", "pointmass"])
def test_greedy_rest_is_greedy_decoding_token_for_token(which, verify):
    trigram, transformer, ds, prompts = _corpus()
    model = trigram if which == "trigram" else transformer
    saved = 0
    for prompt in prompts:
        want = sample_target(model, prompt, config=GREEDY, max_new_tokens=12, rng=np.random.default_rng(0)).tokens
        got = rest_decode(model, prompt, ds, max_new_tokens=12, config=GREEDY, rng=np.random.default_rng(1),
                          verify=verify, **SMALL)
        assert got.tokens == want, prompt
        saved += 12 - got.target_calls
    assert saved > 0


# ---------------------------------------------------------------- calls


def test_calls_on_a_target_that_repeats_itself_are_worked_by_hand():
    # always 0, datastore all zeros, continuations of 3: the trie is the chain 0 0 0, accepted whole with
    # the token after it: 4 tokens a call, 6 tokens in 2 calls
    target = ProbTable(np.array([[F(1), F(0)], [F(1), F(0)]], dtype=object))
    settings = dict(max_new_tokens=6, length=3, num_draft=3)
    for verify in ("rest", "pointmass"):
        it = rest_transition(target, [0, 0], RestDatastore([0] * 10), verify=verify, **settings)
        assert iterations_law(it) == {2: 1}
    assert rest_calls_per_token(target, [0, 0], RestDatastore([0] * 10), **settings).per_token == F(2, 6)


def test_calls_per_token_is_the_iterations_law_and_sits_beside_algorithm_1():
    model, ds = _small()
    target = model.exact
    draft = NGramModel.fit(random_table_corpus(3, 2, 30, seed=5), order=1, vocab_size=3, add_k=1).exact
    it = rest_transition(target, PROMPT, ds, max_new_tokens=4, verify="pointmass", num_draft=4, length=3)
    mine = calls_per_token(it)
    assert mine.law == iterations_law(it, memoise=False) and mine.tokens == 4
    chain = chain_calls_per_token(target, draft, PROMPT, k=2, config=SamplingConfig(), max_new_tokens=4)
    rows = lambda m: np.array([list(m.model.row(m.model.context([x]))) for x in range(3)], dtype=object)  # noqa: E731
    case = Case("pair", rows(target), rows(draft), prompt=tuple(PROMPT), k=2, max_new_tokens=4)
    assert chain.law == reference_iterations(case)  # Algorithm 1's calls, through the chain case's tables
    assert 0 < mine.per_token <= 1 and 0 < chain.per_token <= 1


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, named", [
    (dict(num_draft=0), "num_draft must be an integer >= 1, got 0"),
    (dict(length=0), "length must be an integer >= 1, got 0"),
    (dict(max_suffix=0), "max_suffix must be an integer >= 1, got 0"),
    (dict(min_suffix=0), "min_suffix must be an integer >= 1, got 0"),
    (dict(max_matches=-2), "max_matches must be an integer >= 1, got -2"),
    (dict(max_suffix=2, min_suffix=3), "max_suffix must be >= min_suffix = 3, got 2"),
    (dict(verify="nonsense"), "verify must be 'rest', one of"),
])
def test_bad_sizes_are_named(kwargs, named):
    model, ds = _small()
    with pytest.raises(SpecrefError, match=named):
        rest_transition(model, PROMPT, ds, **{"max_new_tokens": 3, **kwargs})


def test_an_empty_datastore_and_a_retrieved_token_outside_v_are_named():
    model, _ = _small()
    with pytest.raises(SpecrefError, match=r"datastore tokens must hold at least one token, got \[\]"):
        RestDatastore([])
    with pytest.raises(SpecrefError, match="datastore must be a RestDatastore"):
        rest_transition(model, PROMPT, [0, 1, 2], max_new_tokens=3)
    it = rest_transition(model, [0, 1], RestDatastore([0, 1, 7, 2]), max_new_tokens=3)
    with pytest.raises(SpecrefError, match=r"datastore: the retrieved candidate \[7\] holds token 7, outside the "
                                           r"target's vocabulary \(V = 3\)"):
        it((), np.random.default_rng(0))


# ---------------------------------------------------------------- the zoo's REST entries


def _zoo_law(entry, config=SamplingConfig()):
    model, ds = _small()
    it = entry.transition(model.exact, PROMPT, ds, max_new_tokens=4, config=config, num_draft=4, length=3)
    return it, compare(law_iterated((), it), target_law(model.exact, PROMPT, config, 4))


@pytest.mark.parametrize("entry", entries(method="rest"), ids=lambda e: e.name)
def test_each_rest_entry_earns_its_verdict(entry):
    it, c = _zoo_law(entry)
    if entry.kind == "approximate":
        assert c.tv > 0
    elif entry.kind == "wrong":
        assert entry.changes in ("verified", "emitted")
        if "law" in entry.caught_by:
            assert c.tv > 0
    else:  # correct: the law holds; a cost-only slip changes the calls
        assert c.tv == 0, str(c)
        if "efficiency" in entry.caught_by:
            ref, _ = _zoo_law(entries(kind="correct", method="rest")[0])
            assert calls_per_token(it).per_token != calls_per_token(ref).per_token


@pytest.mark.parametrize("entry", [e for e in entries(method="rest") if "greedy" in e.caught_by], ids=lambda e: e.name)
def test_the_greedy_slips_break_greedy_identity(entry):
    trigram, _, ds, prompts = _corpus()
    differ = 0
    for prompt in prompts[:30]:
        want = sample_target(trigram, prompt, config=GREEDY, max_new_tokens=12, rng=np.random.default_rng(0)).tokens
        it = entry.transition(trigram, prompt, ds, max_new_tokens=12, config=GREEDY, num_draft=8, length=4,
                              max_matches=100)
        differ += list(iterate((), it, np.random.default_rng(0))) != want
    assert differ > 0


def test_the_padding_slip_moves_the_published_rules_law():
    # the published rule is already off the target's law; the padding moves it again (short paths exist)
    model, ds = _small()
    settings = dict(max_new_tokens=4, num_draft=6, length=3)
    padded = entries(method="rest")[-1]
    assert padded.name == "rest_padded_paths"
    got = law_iterated((), padded.transition(model.exact, PROMPT, ds, **settings))
    assert compare(got, law_iterated((), rest_transition(model.exact, PROMPT, ds, **settings))).tv > 0


def test_every_rest_slip_is_caught():
    assert all(e.caught_by for e in entries(kind="wrong", method="rest"))
    assert [e.name for e in entries(method="rest") if e.cost_only] == ["rest_stale_query"]
