"""Position-aware tables, plain logits callables, and the greedy and position-aware cases.

Everything here is exact (Fractions, TV == 0 or a positive Fraction) and needs no torch.
"""

from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.verification.zoo import chain as zoo
from specref.verification.cases.models import PositionLogitTable, PositionProbTable, case_logits_fns, logits_fn
from specref.verification.cases.chain import Case, default_cases, extra_cases, fixed_cases
from specref.verification.oracle import check_decoder, check_logits_step, check_step
from specref.verification.cases.tables import LogitTable, ProbTable
from tests.implementations import decoder_reference, logits_reference
from toy_models.ngram import NGramModel


def _position_case():
    return next(c for c in extra_cases("decoder") if c.name == "position-aware")


def test_position_rows_depend_on_position_and_whole_prefix():
    table = np.random.default_rng(0).normal(size=(3, 3, 3))  # [3, 3, 3]: a different row at every index
    model = PositionProbTable(np.full((3, 3, 3), Fraction(1, 3), dtype=object))
    assert model.probs([0, 1]).shape == (2, 3) and model.probs([0, 1])[0, 0] == Fraction(1, 3)
    m = PositionLogitTable(table)
    rows = m([2, 1, 0])  # prefixes (2), (2, 1), (2, 1, 0): n = 1, 2, 3; sums 2, 3, 3
    np.testing.assert_array_equal(rows, np.stack([table[1, 2], table[2, 0], table[0, 0]]))
    # a bigram sees only the last token: re-feeding the prefix changes nothing for it, but here it does
    assert not np.array_equal(m([0, 1])[-1], m([0, 1, 0, 1])[-1])
    bigram = LogitTable(table[0])
    np.testing.assert_array_equal(bigram([0, 1])[-1], bigram([0, 1, 0, 1])[-1])
    with pytest.raises(SpecrefError):
        PositionLogitTable(np.zeros((3, 3)))([0])


def test_logits_fn_gives_rows_for_every_position_and_log_probs_for_prob_models():
    case = default_cases("step")[0]  # worked-example rows: Fractions
    t_fn, _ = case_logits_fns(case)
    target, _ = case.models()
    out = t_fn([0, 1, 2])  # [3, 3]
    np.testing.assert_allclose(np.exp(out), np.array(target.probs([0, 1, 2]), dtype=float))
    assert t_fn(np.array([[0, 1, 2], [2, 1, 0]])).shape == (2, 3, 3)  # [B, n] -> [B, n, V]
    zeros = ProbTable(np.array([[0.5, 0.5, 0.0]] * 3))
    assert logits_fn(zeros)([0])[0, 2] == -np.inf  # p = 0 -> -inf, softmax weight exactly 0
    ngram = NGramModel.random(order=2, vocab_size=3, seed=1)
    np.testing.assert_array_equal(logits_fn(ngram)([0, 2]), ngram([0, 2]))  # a toy model's own logits
    with pytest.raises(SpecrefError):
        logits_fn(object())
    with pytest.raises(SpecrefError):
        t_fn(np.zeros((1, 1, 1), dtype=int))


def test_extra_cases_exist_at_every_level_and_the_reference_passes_them_exactly():
    for level in ("step", "logits", "decoder"):
        names = [c.name for c in extra_cases(level)]
        assert any("greedy" in n for n in names) and any("position" in n for n in names)
        assert set(names) <= {c.name for c in fixed_cases(level)}  # in the defaults
        assert not set(names) & {c.name for c in fixed_cases(level, extra=False)}
    assert any(c.config.greedy for lv in ("logits", "decoder") for c in extra_cases(lv))
    assert check_step(zoo.reference, cases=extra_cases("step")).worst_tv == 0
    assert check_logits_step(logits_reference, cases=extra_cases("logits")).worst_tv <= 1e-12
    assert check_decoder(decoder_reference, cases=extra_cases("decoder")).worst_tv == 0


def test_position_case_round_trips_through_json_and_repr():
    case = _position_case()
    data = case.to_json()
    assert data["context"] == "position" and "context='position'" in repr(case)
    rebuilt = Case(**{**data, "target": case.target, "draft": case.draft, "config": SamplingConfig(**data["config"]),
                      "prompt": tuple(data["prompt"]), "stop_tokens": tuple(data["stop_tokens"])})
    assert rebuilt.to_json() == data
    with pytest.raises(SpecrefError, match="context"):
        replace(case, context="absolute").models()


def test_kv_cache_refeeds_prefix_is_invisible_to_ngrams_and_caught_by_the_position_case():
    """The last tokens of a doubled context are right: the trigram case cannot tell; the position case can."""
    dec = {c.name: c for c in default_cases("decoder")}
    ngram = check_decoder(zoo.kv_cache_refeeds_prefix, cases=[replace(dec["trigram"], k=1)])
    assert ngram.ok and ngram.worst_tv == 0
    position = check_decoder(zoo.kv_cache_refeeds_prefix, cases=[replace(_position_case(), k=1)])
    assert not position.ok and position.worst_tv > Fraction(1, 10)  # exact: 59551/122304 ~ 0.49
    assert position.counterexample.context == "position"


def test_greedy_logits_case_catches_softmax_acceptance_with_argmax_resampling():
    """A bug of the kind found in the wild: draft tokens accepted by raw softmax ratios while T = 0 resamples
    by argmax.  At T = 0 every row is a point mass; the bug rejects tokens greedy decoding keeps."""
    from specref.core.sampling import process

    def softmax_accept_argmax_resample(target_logits, draft_logits, draft_tokens, config, rng):
        p_raw, q_raw = process(target_logits, SamplingConfig()), process(draft_logits, SamplingConfig())
        out = []
        for i, x in enumerate(draft_tokens):
            if rng.random() < p_raw[i, x] / q_raw[i, x]:  # BUG: at T = 0 the ratio of one-hot rows decides
                out.append(int(x))
                continue
            out.append(int(np.argmax(target_logits[i] - q_raw[i])))  # BUG: argmax of a mixed quantity
            return out
        return out + [int(np.argmax(target_logits[len(draft_tokens)]))]

    greedy = [c for c in extra_cases("logits") if c.config.greedy]
    assert not check_logits_step(softmax_accept_argmax_resample, cases=greedy).ok
    assert check_logits_step(logits_reference, cases=greedy).ok
