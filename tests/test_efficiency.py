"""The efficiency verdict: the reference's exact law of target calls, and a measured mean against it.

The measured decodes are the reference itself, seeded: N = 2000 decodes give a 99%
interval of half-width ~0.03 target calls around the mean, so the reference must be
"as efficient as the reference", and the same counts plus one call "wasteful".
"""

from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.decoding.chain import speculative_decode
from specref.verification.cases.chain import default_cases
from specref.verification.statistics.efficiency import efficiency, reference_iterations

N = 2000


def test_reference_iterations_is_an_exact_law():
    by_name = {c.name: c for c in default_cases("decoder")}
    same = reference_iterations(by_name["p-equals-q"])  # p = q: every draft accepted, 3 tokens in one call
    assert same == {1: Fraction(1)}
    law = reference_iterations(by_name["worked-example-rows"])
    assert sum(law.values()) == 1 and set(law) <= {1, 2, 3}
    for name in ("worked-example-rows", "stop-token", "trigram"):  # two routes, one law, exactly
        assert reference_iterations(by_name[name]) == reference_iterations(by_name[name], memoise=False)


def test_the_reference_measured_is_as_efficient_and_one_more_call_is_wasteful():
    case = {c.name: c for c in default_cases("decoder")}["worked-example-rows"]
    target, draft = replace(case).as_float().models()
    rng = np.random.default_rng(7)
    calls = [speculative_decode(target, draft, list(case.prompt), k=case.k, config=case.config,
                                max_new_tokens=case.max_new_tokens, rng=rng).iterations for _ in range(N)]
    good = efficiency(calls, case)
    assert good.verdict == "as efficient as the reference", good
    assert efficiency([c + 1 for c in calls], case).verdict == "wasteful"
    assert efficiency([1] * N, case).verdict == "fewer calls than the reference"
    with pytest.raises(SpecrefError):
        efficiency([1], case)


def test_every_decode_the_same_count_is_judged_within_rounding():
    # once reported as "3 [3, 3] vs the reference's exact 3: fewer calls than the reference"
    from specref.verification.statistics.efficiency import Efficiency

    for reference in (3.0000000000000004, 2.9999999999999996, 3.0):
        assert Efficiency(2, 3.0, (3.0, 3.0), reference, 0.99).verdict == "as efficient as the reference"
    assert Efficiency(2, 3.0, (3.0, 3.0), 3.001, 0.99).verdict == "fewer calls than the reference"
    # a float case whose law is one call with mass 0.9999999999999999: two decodes of one call each
    case = {c.name: c for c in default_cases("decoder")}["p-equals-q"].as_float()
    assert efficiency([1, 1], case).verdict == "as efficient as the reference"
    assert efficiency([2, 2], case).verdict == "wasteful"


def test_a_sample_without_spread_takes_the_reference_spread():
    # calls that vary under the reference: a few decodes that happen to agree prove little
    case = {c.name: c for c in default_cases("decoder")}["worked-example-rows"]
    law = reference_iterations(case)
    assert len(law) > 1
    few = efficiency([2, 2, 2], case)
    assert few.interval[0] < few.interval[1] and few.verdict == "as efficient as the reference", few
    assert efficiency([1] * N, case).verdict == "fewer calls than the reference"  # many decodes: a real difference
