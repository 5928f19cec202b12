"""Prompt lookup decoding: the draft rule, and the exact law of its target calls (SPEC §8.1, §15).

The drafts below are worked by hand from the rule in the spec; the laws of calls on the two
small cases too.  The enumerated law is checked against whole runs (the independent route) and
its output against the target law.  No torch: ``tests/test_hf_paths.py`` holds transformers'
``PromptLookupCandidateGenerator`` against it.
"""

from fractions import Fraction

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.decoding.prompt_lookup import lookup_draft, lookup_transition
from specref.verification.cases.chain import Case
from specref.verification.laws.enumeration import compare, law_iterated, target_law
from specref.verification.statistics.efficiency import efficiency, lookup_iterations


@pytest.mark.parametrize("tokens, num_tokens, stops, draft", [
    ([0, 1, 2, 0, 1], 2, (), [2, 0]),  # the bigram (0, 1) at 0: the two tokens after it
    ([2, 8, 1, 2, 9, 1, 2], 2, (), [9, 1]),  # the bigram (1, 2) at 2 decides before the unigram (2) at 0
    ([0, 1, 0], 3, (), [1, 0]),  # (1, 0) is only the tail itself; (0) at 0, cut at the context's end
    ([0, 1, 2, 0], 3, (2,), [1]),  # cut before the stop token
    ([0, 1, 0, 2, 0], 3, (1,), []),  # the earliest match starts with a stop: empty, no later match tried
    ([0, 1, 2], 2, (), []),  # no earlier occurrence
    ([4], 2, (), []),  # one token: nothing to match
])
def test_the_draft_is_the_continuation_of_the_earliest_longest_match(tokens, num_tokens, stops, draft):
    assert lookup_draft(tokens, num_tokens, 2, stops) == draft


def test_a_longer_ngram_is_only_used_up_to_max_ngram():
    tokens = [2, 8, 1, 2, 9, 1, 2]
    assert lookup_draft(tokens, 2, max_ngram=1) == [8, 1]  # the unigram (2) at 0
    assert lookup_draft(tokens, 2, max_ngram=3) == [9, 1]  # no earlier (9, 1, 2); the bigram at 2


@pytest.mark.parametrize("kwargs, named", [(dict(num_tokens=0), "num_tokens must be an int >= 1, got 0"),
                                            (dict(num_tokens=2, max_ngram=True), "max_ngram must be an int >= 1")])
def test_bad_sizes_are_named(kwargs, named):
    with pytest.raises(SpecrefError, match=named):
        lookup_draft([0, 1, 0], **kwargs)


def _case(target, prompt, *, k, max_new_tokens, config=SamplingConfig(), stop_tokens=()):
    V = target.shape[-1]
    return Case("lookup", target, np.full((V, V), 1.0 / V), prompt=prompt, k=k, max_new_tokens=max_new_tokens,
                config=config, stop_tokens=stop_tokens)


def test_a_target_that_repeats_itself_is_decoded_in_two_calls():
    # always token 0: after [0, 0] the draft is [0] (one token follows the unigram's first 0), accepted,
    # plus the call's own token; after [0, 0, 0, 0] the draft [0, 0] is capped at 4 - 2 - 1 = 1: 2 calls
    target = np.array([[1.0, 0.0], [1.0, 0.0]])
    assert lookup_iterations(_case(target, (0, 0), k=2, max_new_tokens=4)) == {2: 1.0}


def test_the_law_of_calls_on_a_fair_coin_is_worked_by_hand():
    # after [0, 1, 0]: (1, 0) is the tail only, (0) at 0 drafts [1, 0], capped at 2 - 0 - 1 = 1 token;
    # a 1 (prob 1/2) is kept with the bonus: 1 call; a 0 ends the block and one more call follows
    target = [[Fraction(1, 2)] * 2] * 2
    law = lookup_iterations(_case(np.array(target, dtype=object), (0, 1, 0), k=2, max_new_tokens=2))
    assert law == {1: Fraction(1, 2), 2: Fraction(1, 2)}


def test_the_enumerated_law_is_the_whole_runs_law_and_keeps_the_target_law():
    rng = np.random.default_rng(7)
    target = rng.dirichlet(np.ones(3), size=3)
    case = _case(target, (0, 1, 2, 0, 1), k=3, max_new_tokens=4, config=SamplingConfig(temperature=0.8),
                 stop_tokens=(2,))
    memo, runs = lookup_iterations(case), lookup_iterations(case, memoise=False)
    assert memo.keys() == runs.keys() and all(abs(memo[n] - runs[n]) < 1e-12 for n in memo)
    assert abs(sum(memo.values()) - 1) < 1e-12 and len(memo) >= 2
    iteration = lookup_transition(case.models()[0], list(case.prompt), num_tokens=3, max_new_tokens=4,
                                  config=case.config, stop_tokens=(2,))
    out = law_iterated((), iteration)
    truth = target_law(case.models()[0], list(case.prompt), case.config, 4, (2,))
    assert compare(out, truth).tv < 1e-12


def test_drafting_fewer_tokens_costs_calls_that_the_verdict_sees():
    rng = np.random.default_rng(3)
    case = _case(rng.dirichlet(np.ones(3) * 0.3, size=3), (0, 1, 2, 0, 1), k=2, max_new_tokens=4)
    two, one = lookup_iterations(case), lookup_iterations(case, num_tokens=1)
    mean = {n: sum(c * w for c, w in law.items()) for n, law in (("two", two), ("one", one))}
    assert mean["one"] > mean["two"] + 0.05
    calls = [c for c, w in two.items() for _ in range(round(w * 4000))]  # the law of two drafts, as counts
    assert efficiency(calls, case, reference=two).verdict == "as efficient as the reference"
    assert efficiency(calls, case, reference=one).verdict == "fewer calls than the reference"


def test_a_reference_that_is_not_a_law_is_refused():
    case = _case(np.full((2, 2), 0.5), (0, 1, 0), k=2, max_new_tokens=2)
    with pytest.raises(SpecrefError, match="reference must be a law of calls summing to 1"):
        efficiency([1, 2, 1], case, reference={1: 0.5})
