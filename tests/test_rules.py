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


# ---------------------------------------------------------------- declared conventions: ties


def keep_lowest_ids_top_p(logits, config):  # [n, V] -> [n, V]: a stable sort, a cumulative-sum cut
    """top-p as many samplers write it: ties kept lowest id first, only as many as the mass needs."""
    p = process(logits, replace(config, top_p=1.0))
    out = np.zeros_like(p)
    for i, row in enumerate(p):
        order = np.argsort(-row, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(row[order])[:-1]])
        keep = order[before < config.top_p]
        out[i, keep] = row[keep] / row[keep].sum()
    return out


def one_tie_kept(target_logits, draft_logits, draft_tokens, config, rng):
    """Correct speculative sampling whose top-p keeps one of two tied tokens."""
    return speculative_step(keep_lowest_ids_top_p(target_logits, config), keep_lowest_ids_top_p(draft_logits, config),
                            draft_tokens, rng)


def tie_case():
    from specref.verification.cases.chain import Case

    tied = np.log(np.array([[0.4, 0.3, 0.3], [0.3, 0.4, 0.3], [0.2, 0.4, 0.4]]))  # ties at the top-p boundary
    draft = np.log(np.array([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]]))
    return Case("top-p-tie", tied, draft, k=1, tables="logits", config=SamplingConfig(top_p=0.5))


def test_a_top_p_tie_convention_is_named_and_can_be_declared():
    from specref.verification.cases.rules import Rules

    default = check_logits_step(one_tie_kept, cases=[tie_case()])
    assert not default.ok and default.results[0].status == "differs" and default.worst_tv > 0.1, default
    assert "top_p_ties='lowest_id'" in default.results[0].detail  # reported by its name
    declared = check_logits_step(one_tie_kept, cases=[tie_case()], rules=Rules(top_p_ties="lowest_id"))
    assert declared.ok and float(declared.worst_tv) <= 1e-12, declared
    assert "declared conventions" in str(declared) and "top p ties: lowest_id" in str(declared)
    assert check_logits_step(one_tie_kept, cases=[tie_case()], rules={"top_p_ties": "lowest_id"}).ok
    assert not check_logits_step(one_tie_kept, cases=[tie_case()], rules=Rules(top_p_ties="highest_id")).ok
    # a sampler that keeps every tie (specref's) passes by default and is not renamed
    assert check_logits_step(logits_reference, cases=[tie_case()]).ok


def test_greedy_tie_conventions_at_the_decoder_level():
    from specref.verification.cases.rules import Rules

    case = next(c for c in default_cases("decoder") if c.name == "greedy-logits")  # a tie for the top

    def decode_highest(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
        rules = Rules(greedy_ties="highest_id")
        t, d = RuledModel(target, rules, config), RuledModel(draft, rules, config)
        return speculative_decode(t, d, prompt, k=k, config=SamplingConfig(), max_new_tokens=max_new_tokens,
                                  stop_tokens=stop_tokens, rng=rng).tokens

    report = check_decoder(decode_highest, cases=[case])
    assert not report.ok and "greedy_ties='highest_id'" in report.results[0].detail, report
    assert check_decoder(decode_highest, cases=[case], rules=Rules(greedy_ties="highest_id")).ok


def test_tie_rules_on_exact_rows():
    from fractions import Fraction as F

    from specref.verification.cases.rules import Rules, apply_rules

    p = np.array([[F(2, 5), F(3, 10), F(3, 10)], [F(1, 3)] * 3], dtype=object)
    top_p = SamplingConfig(top_p=0.5)
    assert apply_rules(p, top_p, Rules(), probs=True).tolist() == p.tolist()  # specref keeps every tie
    assert apply_rules(p, top_p, Rules(top_p_ties="lowest_id"), probs=True).tolist() == [
        [F(4, 7), F(3, 7), 0], [F(1, 2), F(1, 2), 0]]
    assert apply_rules(p, top_p, Rules(top_p_ties="highest_id"), probs=True).tolist() == [
        [F(4, 7), 0, F(3, 7)], [0, F(1, 2), F(1, 2)]]
    top_k = SamplingConfig(top_k=1)
    assert apply_rules(p, top_k, Rules(top_k_ties="highest_id"), probs=True).tolist() == [[1, 0, 0], [0, 0, 1]]
    greedy = SamplingConfig(temperature=0)
    assert apply_rules(p, greedy, Rules(greedy_ties="split"), probs=True)[1].tolist() == [F(1, 3)] * 3
    assert apply_rules(p, greedy, Rules(greedy_ties="highest_id"), probs=True)[1].tolist() == [0, 0, 1]


def test_unknown_conventions_list_the_known_ones():
    from specref.verification.cases.rules import Rules

    with pytest.raises(SpecrefError, match="known: keep_all, lowest_id, highest_id"):
        Rules(top_p_ties="keep_one")
    with pytest.raises(SpecrefError, match="unknown rules field"):
        check_logits_step(logits_reference, rules={"top_p_tie": "lowest_id"})


def test_the_command_line_form_of_rules():
    from specref.verification.cases.rules import Rules, parse_rules

    assert parse_rules("order=top_k,top_p,min_p,temperature top_p_ties=lowest_id greedy_ties=split") == Rules(
        order=TRUNCATE_FIRST, top_p_ties="lowest_id", greedy_ties="split")
    assert parse_rules(["top_k_ties=highest_id", "order=temperature,top_k,top_p,min_p"]) == Rules(
        top_k_ties="highest_id")
    for text, message in [
        ("top_p_ties=keep_one", "unknown top_p_ties convention 'keep_one'; known: keep_all, lowest_id, highest_id"),
        ("top_p_tie=lowest_id", "unknown rules field 'top_p_tie' .* known: order, top_p_ties, top_k_ties, greedy_ties"),
        ("order=top_k,top_p", "permutation of"),
        ("lowest_id", "'lowest_id' is not name=value"),
        ("greedy_ties=split greedy_ties=lowest_id", "given twice"),
        ("", "empty"),
        (3, "must be a string"),
    ]:
        with pytest.raises(SpecrefError, match=message):
            parse_rules(text)
