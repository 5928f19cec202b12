"""Lookahead decoding (SPEC §16.3): the window and pool worked by hand, the published verification
against the tree route, the exact law against the target's, greedy identity, calls per token,
bad input and the zoo's lookahead slips.

Exact laws use Fraction rows (TV == 0 means equal); the greedy checks compare token for token
with plain greedy decoding (:func:`specref.decoding.chain.sample_target` under ``GREEDY``) on 100
prompts, on a trigram model and on the trained one-layer transformer.
"""

from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import GREEDY, SamplingConfig
from specref.decoding.chain import sample_target
from specref.decoding.lookahead import (LookaheadState, candidate_trie, lookahead_decode, lookahead_transition,
                                        lookahead_verify, pointmass_candidates_verify)
from specref.verification.cases.chain import Case
from specref.verification.cases.tables import ProbTable
from specref.verification.laws.enumeration import compare, iterate, law, law_iterated, target_law
from specref.verification.statistics.efficiency import iterations_law, reference_iterations
from specref.verification.zoo.retrieval import calls_per_token, chain_calls_per_token, entries
from toy_models.ngram import NGramModel

F = Fraction
PROMPT = [0, 1, 2, 0, 1]


def _cycle(V):
    """A deterministic table: after ``x`` always ``x + 1 mod V`` (its Jacobi steps are known by hand)."""
    return ProbTable(np.array([[F(int(j == (i + 1) % V)) for j in range(V)] for i in range(V)], dtype=object))


@lru_cache(maxsize=None)
def _table():
    return NGramModel.random(order=2, vocab_size=3, seed=7)


@lru_cache(maxsize=None)
def _corpus_models():
    from toy_models.corpus import corpus
    from toy_models.transformer import CachedTransformer

    trigram = NGramModel.fit([corpus(20000, seed=2)], order=3, vocab_size=40)
    prompts = [corpus(200, seed=100 + i)[50 + i: 58 + i] for i in range(100)]
    return trigram, CachedTransformer.from_saved("draft_small"), prompts


# ---------------------------------------------------------------- the window and the pool, by hand


def test_the_window_fills_then_moves_and_feeds_the_pool_as_worked_by_hand():
    # target: after x always x + 1 (mod 5).  W = 2, N = 3: level 0 starts with W + N - 3 = 2 guesses,
    # the prompt's tokens in order: (0, 1).  Call 1 fills: columns (1 | 0, 1) give argmaxes 2, 1, 2;
    # level 0 drops its first guess -> (1,), o[1:] = (1, 2) goes on top; the call emits 2.
    # Call 2 (full): level 0 = (2 | 1), level 1 = (1, 2): column 0 reads (1) -> 2, column 1 reads
    # (1, 2) -> 3; n-grams (2 | 1, 2) and (1 | 2, 3); the window becomes ((2,), (2, 3)).
    # Call 3: columns (2) -> 3 and (2, 3) -> 4: n-grams (3 | 2, 3), (2 | 3, 4).
    it = lookahead_transition(_cycle(5), [0, 1], window=2, ngram=3, guesses=2, max_new_tokens=8, config=GREEDY)
    rng = np.random.default_rng(0)
    states = []
    state = ()
    for _ in range(3):
        _, state = it(state, rng)
        states.append(state)
    assert states[0] == LookaheadState((2,), ((1,), (1, 2)), ())
    assert states[1] == LookaheadState((2, 3), ((2,), (2, 3)), ((1, ((2, 3),)), (2, ((1, 2),))))
    assert states[2].window == ((3,), (3, 4))
    assert states[2].pool == ((1, ((2, 3),)), (2, ((1, 2), (3, 4))), (3, ((2, 3),)))


def test_a_pooled_ngram_is_verified_and_emits_at_most_n_minus_1_tokens():
    # the same target: calls 4 and 5 emit 0 and 1 alone (no pool entry under 4, under 0); call 6 finds
    # (2, 3) under 1 and accepts both -- N - 1 = 2 tokens and no third (the code's rule); call 7
    # tries (2, 3) under 3 (rejected: p(2) = 0), then (4, 0): 4 is kept, 0 falls past the budget of 8
    it = lookahead_transition(_cycle(5), [0, 1], window=2, ngram=3, guesses=2, max_new_tokens=8, config=GREEDY)
    blocks = []
    state = ()
    while state is not None:
        block, state = it(state, np.random.default_rng(0))
        blocks.append(block)
    assert blocks == [(2,), (3,), (4,), (0,), (1,), (2, 3), (4,)]
    bonus = lookahead_transition(_cycle(5), [0, 1], window=2, ngram=3, guesses=2, max_new_tokens=8,
                                 config=GREEDY, bonus=True)
    assert iterate((), bonus, np.random.default_rng(0)) == (2, 3, 4, 0, 1, 2, 3, 4)  # the bonus 4 ends it


def test_the_pool_keeps_at_most_g_continuations_least_recently_added_first():
    # G = 1: under each key only the newest continuation survives
    it = lookahead_transition(_cycle(5), [0, 1], window=2, ngram=3, guesses=1, max_new_tokens=8, config=GREEDY)
    state = ()
    for _ in range(3):
        _, state = it(state, np.random.default_rng(0))
    assert dict(state.pool) == {1: ((2, 3),), 2: ((3, 4),), 3: ((2, 3),)}


# ---------------------------------------------------------------- the published rule and the tree route


def _rows_for(V, seed):
    rng = np.random.default_rng(seed)

    def row(prefix):  # a rational row per prefix, zeros included
        r = np.random.default_rng([seed, len(prefix)] + list(prefix))
        w = r.integers(0, 4, size=V)
        w[r.integers(V)] += 1
        return np.array([F(int(x), int(w.sum())) for x in w], dtype=object)

    cands = [tuple(int(x) for x in rng.integers(0, V, size=2)) for _ in range(3)] + [(0, 1)]  # shared prefixes
    return row, cands


@pytest.mark.parametrize("seed", range(6))
def test_the_published_rule_has_the_law_of_pointmass_tree_verification(seed):
    row, cands = _rows_for(3, seed)
    tree_law = law(lambda rng: tuple(pointmass_candidates_verify(cands, row, rng)[0]))
    published = law(lambda rng: tuple(lookahead_verify(cands, row, rng, bonus=True)[0]))
    assert compare(published, tree_law).tv == 0 and published.exact
    # without the bonus: the same law with the token after a fully accepted candidate left off
    tree, paths = candidate_trie(cands)
    full = {paths[n] for n in range(1, tree.size) if not tree.children(n)}
    cut: dict = {}
    for out, w in tree_law.items():
        key = out[:-1] if out[:-1] in full else out
        cut[key] = cut.get(key, 0) + w
    assert compare(law(lambda rng: tuple(lookahead_verify(cands, row, rng)[0])), cut).tv == 0


def test_a_repeated_candidate_token_is_not_accepted_twice():
    # p = (1/2, 1/2): candidates (0,), (0,), (1,): P(emit 0 first) must stay 1/2
    row = lambda prefix: np.array([F(1, 2), F(1, 2)], dtype=object)  # noqa: E731
    got = law(lambda rng: lookahead_verify([(0,), (0,), (1,)], row, rng)[0][0])
    assert got == {0: F(1, 2), 1: F(1, 2)}


# ---------------------------------------------------------------- the exact law


SETTINGS = [  # (W, N, G, max_new_tokens, stops, config, extra)
    (2, 3, 2, 4, (), SamplingConfig(), {"pool_from_prompt": True}),
    (3, 3, 3, 4, (2,), SamplingConfig(temperature=F(1, 2)), {"pool_from_prompt": True}),
    (2, 2, 2, 4, (), SamplingConfig(), {"pool_from_prompt": True, "bonus": True}),  # N = 2: 2-grams, the bonus
    (1, 4, 2, 5, (), SamplingConfig(top_k=2), {"pool_from_prompt": True}),  # N > W: allowed
    (3, 4, 1, 5, (), SamplingConfig(), {}),  # G = 1, the pool only from the window
    (2, 3, 2, 4, (), SamplingConfig(), {"pool_from_prompt": True, "bonus": True}),
    (2, 3, 2, 4, (), SamplingConfig(), {"pool_from_prompt": True, "verify": "pointmass"}),
]


@pytest.mark.parametrize("W, N, G, n, stops, config, extra", SETTINGS)
def test_the_exact_law_is_the_target_law(W, N, G, n, stops, config, extra):
    target = _table().exact
    it = lookahead_transition(target, PROMPT, window=W, ngram=N, guesses=G, max_new_tokens=n, config=config,
                              stop_tokens=stops, **extra)
    got = law_iterated((), it)
    c = compare(got, target_law(target, PROMPT, config, n, stops))
    assert c.exact and c.tv == 0, str(c)
    calls = iterations_law(it)
    assert min(calls) < n and sum(calls.values()) == 1  # some call verified a candidate: the rule was exercised


def test_the_memoised_law_is_the_whole_runs_law():
    it = lookahead_transition(_table().exact, PROMPT, window=2, ngram=3, guesses=2, max_new_tokens=3,
                              pool_from_prompt=True)
    assert law_iterated((), it) == law_iterated((), it, memoise=False)


def test_float_rows_on_the_tiny_transformer_keep_the_target_law():
    from specref.verify import transformer_pair

    target, _, prompt = transformer_pair()
    config = SamplingConfig(temperature=0.8)
    it = lookahead_transition(target, prompt + [3, 1, 2], window=2, ngram=3, guesses=2, max_new_tokens=3,
                              config=config, pool_from_prompt=True)
    c = compare(law_iterated((), it), target_law(target, prompt + [3, 1, 2], config, 3))
    assert not c.exact and c.tv < 1e-12, str(c)  # float64 rows: equal up to rounding


# ---------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("which", ["trigram", "transformer"])
def test_greedy_lookahead_is_greedy_decoding_token_for_token(which):
    trigram, transformer, prompts = _corpus_models()
    model = trigram if which == "trigram" else transformer
    saved = 0
    for prompt in prompts:
        want = sample_target(model, prompt, config=GREEDY, max_new_tokens=12, rng=np.random.default_rng(0)).tokens
        got = lookahead_decode(model, prompt, window=4, ngram=3, guesses=4, max_new_tokens=12, config=GREEDY,
                               rng=np.random.default_rng(1), pool_from_prompt=True)
        assert got.tokens == want, prompt
        saved += 12 - got.target_calls
    assert saved > 0  # candidates were accepted: the identity covers the verification branch


# ---------------------------------------------------------------- calls


def test_calls_on_a_target_that_repeats_itself_are_worked_by_hand():
    # always token 0, prompt (0, 0, 0), W = 2, N = 3, G = 2, the prompt's n-grams pooled: call 1 fills the
    # window and emits one token; each later call accepts the pooled (0, 0): 1 + 2 + 2 + 2 -> 6 tokens in
    # 4 calls (the last cut); with the bonus 1 + 3 + 3: 3 calls
    target = ProbTable(np.array([[F(1), F(0)], [F(1), F(0)]], dtype=object))
    settings = dict(window=2, ngram=3, guesses=2, max_new_tokens=6, pool_from_prompt=True)
    assert iterations_law(lookahead_transition(target, [0, 0, 0], **settings)) == {4: 1}
    assert iterations_law(lookahead_transition(target, [0, 0, 0], bonus=True, **settings)) == {3: 1}
    assert calls_per_token(lookahead_transition(target, [0, 0, 0], **settings)).per_token == F(4, 6)


def test_calls_per_token_is_the_iterations_law_and_sits_beside_algorithm_1():
    target, draft = _table().exact, NGramModel.random(order=2, vocab_size=3, seed=8, zero_frac=0.3).exact
    it = lookahead_transition(target, PROMPT, window=2, ngram=3, guesses=2, max_new_tokens=4, pool_from_prompt=True)
    mine = calls_per_token(it)
    assert mine.law == iterations_law(it, memoise=False)  # the law of calls by whole runs
    assert mine.tokens == 4 and mine.calls == sum(n * w for n, w in mine.law.items())
    chain = chain_calls_per_token(target, draft, PROMPT, k=2, config=SamplingConfig(), max_new_tokens=4)
    ref = reference_iterations(_chain_case(2))
    assert chain.law == ref  # Algorithm 1's calls, two routes
    assert 0 < mine.per_token <= 1 and 0 < chain.per_token <= 1


def _chain_case(k):
    """The same pair as a chain case: the rows of the two bigram tables, for reference_iterations."""
    t, d = _table(), NGramModel.random(order=2, vocab_size=3, seed=8, zero_frac=0.3)
    rows = lambda m: np.array([list(m.row((x,))) for x in range(3)], dtype=object)  # noqa: E731
    return Case("pair", rows(t), rows(d), prompt=tuple(PROMPT), k=k, max_new_tokens=4)


# ---------------------------------------------------------------- records and bad input


def test_the_decode_record_matches_the_transition_run_with_the_same_seed():
    target = _table()
    r = lookahead_decode(target, PROMPT, window=2, ngram=3, guesses=2, max_new_tokens=10,
                         rng=np.random.default_rng(5), pool_from_prompt=True)
    it = lookahead_transition(target, PROMPT, window=2, ngram=3, guesses=2, max_new_tokens=10, pool_from_prompt=True)
    assert r.tokens == list(iterate((), it, np.random.default_rng(5)))
    assert r.iterations == r.target_calls == len(r.accepted_per_iteration) and max(r.accepted_per_iteration) <= 2
    assert r.draft_calls == 0 and len(r.tokens) == 10


@pytest.mark.parametrize("kwargs, named", [
    (dict(window=0), r"window \(W\) must be an integer >= 1, got 0"),
    (dict(ngram=1), r"ngram \(N\) must be an integer >= 2, got 1"),
    (dict(guesses=0), r"guesses \(G\) must be an integer >= 1, got 0"),
    (dict(guesses=-3), r"guesses \(G\) must be an integer >= 1, got -3"),
    (dict(window=True), r"window \(W\) must be an integer >= 1, got True"),
    (dict(verify="typical"), "verify must be 'published', 'pointmass' or a callable"),
    (dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0, got -1"),
])
def test_bad_sizes_are_named(kwargs, named):
    settings = {**dict(window=2, ngram=3, guesses=2, max_new_tokens=3), **kwargs}
    with pytest.raises(SpecrefError, match=named):
        lookahead_transition(_table(), PROMPT, **settings)


def test_an_empty_prompt_and_a_token_outside_v_are_named():
    with pytest.raises(SpecrefError, match="prompt must hold at least one token"):
        lookahead_transition(_table(), [], window=2, ngram=3, guesses=2, max_new_tokens=3)
    with pytest.raises(SpecrefError, match=r"prompt\[1\] = 7 is out of range for vocabulary size 3"):
        lookahead_transition(_table(), [0, 7], window=2, ngram=3, guesses=2, max_new_tokens=3)


# ---------------------------------------------------------------- the zoo's lookahead entries


def _zoo_law(entry, config=SamplingConfig()):
    target = _table().exact
    it = entry.transition(target, PROMPT, window=2, ngram=3, guesses=2, max_new_tokens=4, config=config,
                          pool_from_prompt=True)
    return it, compare(law_iterated((), it), target_law(target, PROMPT, config, 4))


@pytest.mark.parametrize("entry", entries(method="lookahead"), ids=lambda e: e.name)
def test_each_lookahead_entry_earns_its_verdict(entry):
    it, c = _zoo_law(entry)
    if entry.kind == "wrong":
        assert entry.changes in ("verified", "emitted")
        if "law" in entry.caught_by:
            assert c.tv > 0, "a slip in what is verified must change the law"
    else:  # correct: the law holds; a cost-only slip changes the calls
        assert c.tv == 0, str(c)
        if "efficiency" in entry.caught_by:
            ref, _ = _zoo_law(entries(method="lookahead")[0])
            assert calls_per_token(it).per_token != calls_per_token(ref).per_token


@pytest.mark.parametrize("entry", [e for e in entries(method="lookahead") if "greedy" in e.caught_by],
                         ids=lambda e: e.name)
def test_the_greedy_slips_break_greedy_identity(entry):
    trigram, _, prompts = _corpus_models()
    differ = 0
    for prompt in prompts[:20]:
        want = sample_target(trigram, prompt, config=GREEDY, max_new_tokens=12, rng=np.random.default_rng(0)).tokens
        it = entry.transition(trigram, prompt, window=4, ngram=3, guesses=4, max_new_tokens=12, config=GREEDY,
                              pool_from_prompt=True)
        differ += list(iterate((), it, np.random.default_rng(0))) != want
    assert differ > 0


def test_every_lookahead_slip_is_caught():
    assert entries(method="lookahead")[0].name == "lookahead_reference"
    assert all(e.caught_by for e in entries(kind="wrong", method="lookahead"))
    assert [e.name for e in entries(method="lookahead") if e.cost_only] == ["lookahead_stale_key"]
