"""Rules as a parameter: an implementation checked against its own declared rule order or plain sampler.

Exact mode throughout: TV is computed, not estimated.
"""

from dataclasses import replace

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig, process, process_probs
from specref.core.step import speculative_step
from specref.decoding.chain import speculative_decode
from specref.verification.oracle import check_decoder, check_logits_step, check_step, default_cases
from specref.verification.cases.rules import DEFAULT_ORDER, RuledModel, declare_rules
from tests.implementations import logits_reference

TRUNCATE_FIRST = ("top_k", "top_p", "min_p", "temperature")  # another engine's documented order


def truncate_then_temper(logits, config):  # [n, V] -> [n, V]: top-k, top-p, min-p on softmax, then temperature
    if config.greedy:
        return process(logits, config)
    return process_probs(process(logits, replace(config, temperature=1.0)), SamplingConfig(temperature=config.temperature))


def self_consistent(target_logits, draft_logits, draft_tokens, config, rng):
    """Correct speculative sampling under the truncate-first order, on both sides."""
    return speculative_step(truncate_then_temper(target_logits, config), truncate_then_temper(draft_logits, config),
                            draft_tokens, rng)


def rule_order_case():
    return [c for c in default_cases("logits") if c.name == "logits-rule-order"]


def test_a_self_consistent_other_order_differs_by_default_and_passes_when_declared():
    default = check_logits_step(self_consistent, cases=rule_order_case())
    assert not default.ok and default.worst_tv > 0.4  # exact TV 0.424 against specref's order
    for rules in (TRUNCATE_FIRST, truncate_then_temper):
        report = check_logits_step(self_consistent, rules=rules)  # every default logits case
        assert report.ok and report.worst_tv <= 1e-12, report
        assert "self-consistent with a non-default rule order" in str(report)
    declared = check_logits_step(declare_rules(self_consistent, TRUNCATE_FIRST), cases=rule_order_case())
    assert declared.ok and "top_k -> top_p -> min_p -> temperature" in str(declared)


def test_declared_rules_do_not_excuse_a_wrong_implementation():
    report = check_logits_step(logits_reference, cases=rule_order_case(), rules=TRUNCATE_FIRST)
    assert not report.ok and "from its own plain sampler" in str(report)


def test_decoder_level_takes_rules_too():
    def decode(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
        t, d = RuledModel(target, TRUNCATE_FIRST, config), RuledModel(draft, TRUNCATE_FIRST, config)
        return speculative_decode(t, d, prompt, k=k, config=SamplingConfig(), max_new_tokens=max_new_tokens,
                                  stop_tokens=stop_tokens, rng=rng).tokens

    case = replace(rule_order_case()[0], max_new_tokens=2)
    assert check_decoder(decode, cases=[case], rules=TRUNCATE_FIRST).ok
    assert not check_decoder(decode, cases=[case]).ok


def test_ruled_model_in_the_default_order_is_specref_processing():
    case = default_cases("logits")[4]  # temperature, top-k, top-p and min-p together
    target, _ = case.models()
    rows = RuledModel(target, DEFAULT_ORDER, case.config).probs([0, 1, 2])
    np.testing.assert_allclose(rows, process(target([0, 1, 2]), case.config), atol=1e-12)


def test_bad_rules_are_refused():
    with pytest.raises(SpecrefError, match="permutation"):
        check_logits_step(logits_reference, rules=("temperature", "top_k"))
    with pytest.raises(SpecrefError, match="logits and decoder"):
        check_step(speculative_step, rules=TRUNCATE_FIRST)


def test_the_module_docstring_shows_default_order_as_it_is():
    from specref.verification.cases import rules

    shown = str(DEFAULT_ORDER).replace("'", '"').replace('", "', '", "')
    assert " ".join(rules.__doc__.split()).count(" ".join(shown.split())) == 1, shown
