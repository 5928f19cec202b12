"""Engine-shaped adapters (vLLM V1 style, FlashInfer style) and the engine zoo under the batched levels."""

import re
from dataclasses import replace
from fractions import Fraction as F

import numpy as np
import pytest

from specref.adapters.engines import (
    check_ragged_layout, flashinfer_reference, flashinfer_style, vllm_engine, vllm_reference, vllm_style,
)
from specref.verification.levels import LEVELS as LEVELS_
from specref.verification.levels.batched.engines import (
    VLLM_CALL, VLLM_PARAMETERS, ExactLog, SamplingMetadata, check_logit_rows, check_probability_rows, softmax_rows,
)
from specref.core.errors import SpecrefError
from specref.decoding.batched import batched_step
from specref.verification.zoo import engines as zoo
from specref.verification.levels.batched.steps import BatchedCase, default_batched_cases
from specref.verification.laws.enumeration import law
from specref.verification.oracle import check


def cases(level, *names):
    found = [c for c in default_batched_cases(level) if c.name in names]
    assert len(found) == len(names)
    return found


# ---------------------------------------------------------------- the engine zoo, exact mode


def test_the_zoo_lists_every_bug_class_once():
    wrong = {e.name for e in zoo.entries("wrong")}
    assert wrong == {"shared_noise_stream", "coin_reused", "inclusive_zero_coin", "dirty_scratch",
                     "placeholder_indexed", "out_of_vocab_id", "row_position_noise", "cross_row_residual"}
    assert {e.name for e in zoo.entries("correct")} == {"engine_reference", "engine_reference_batched"}
    with pytest.raises(SpecrefError):
        zoo.entries("approximate")


def test_correct_entries_pass_exactly():
    dv = check("draft_and_verify", zoo.engine_reference)
    assert dv.ok and all(r.tv == 0 for r in dv.results), str(dv)
    b = check("batched", zoo.engine_reference_batched, cases=cases("batched", "ragged-rows", "zero-draft-row", "two-rows"))
    assert b.ok and all(r.tv == 0 for r in b.results), str(b)


@pytest.mark.parametrize("name", ["shared_noise_stream", "coin_reused", "dirty_scratch", "row_position_noise",
                                  "cross_row_residual"])
def test_wrong_entries_differ_exactly(name):
    entry = next(e for e in zoo.entries() if e.name == name)
    report = check(entry.level, entry.fn, cases=cases(entry.level, "two-rows"))
    assert report.results[0].status == "differs" and report.results[0].tv > F(1, 100), str(report)


def test_a_residual_from_the_wrong_row_is_seen_statistically_at_a_large_vocabulary():
    # Its TV lives in which tail tokens the residual draws, below 3e-4 on the bucketed statistics;
    # the residual-support statistic sees draws outside max(0, p - q)'s support.  V = 2,000, K = 2,
    # N = 2,000 per row (seeded): the bug is flagged (Bonferroni-adjusted p < 1e-6) and the correct
    # engine on the same case and seed is not (alpha = 1e-6: a false alarm has probability <= 1e-6).
    from specref.verification.levels.batched.steps import large_vocab_case
    from specref.verification.oracle import check_draft_and_verify

    case = large_vocab_case(V=2000, K=2, B=2)
    run = lambda fn: check_draft_and_verify(fn, cases=[case], mode="statistical", samples=2000, seed=1,  # noqa: E731
                                            progress=False).results[0]
    bad, good = run(zoo.cross_row_residual), run(zoo.engine_reference)
    assert bad.status == "differs" and "outside-support" in bad.detail, bad.detail
    assert good.status == "ok", good.detail


def test_u_zero_accepting_p_zero_is_an_exact_nonzero_tv_on_grid_coins():
    (case,) = cases("draft_and_verify", "zeros-in-p-grid")
    report = check("draft_and_verify", zoo.inclusive_zero_coin, cases=[case])
    assert report.results[0].status == "differs" and 0 < report.results[0].tv < 1e-6
    # the bug itself: row 0 proposes token 2 (p = 0, q = 1/2) and the coin u = 0 (mass 2^-24) accepts it
    p, q = case.p_target[:1], case.q_draft[:1]
    first = lambda rng: int(zoo.inclusive_zero_coin(p, q, rng)[0, 0])  # noqa: E731
    assert law(first, grid=24).get(2, 0) == F(1, 2) * F(1, 2 ** 24)
    assert law(first).get(2, 0) == 0  # continuous coins: a set of measure zero, invisible
    assert law(lambda rng: int(zoo.engine_reference(p, q, rng)[0, 0]), grid=24).get(2, 0) == 0


def test_out_of_vocab_id_emits_an_invalid_id_naming_the_row():
    report = check("draft_and_verify", zoo.out_of_vocab_id, cases=cases("draft_and_verify", "p-equals-q-row"))
    r = report.results[0]
    assert r.status == "emits an invalid id" and "row 1" in r.detail and "id 7" in r.detail, str(report)
    (case,) = cases("draft_and_verify", "p-equals-q-row")
    # continuous coins: u = 1 exactly has probability 0, so the bug cannot show
    assert check("draft_and_verify", zoo.out_of_vocab_id, cases=[replace(case, grid=None)]).ok


def test_placeholder_indexed_emits_an_invalid_id_on_ragged_rows():
    report = check("batched", zoo.placeholder_indexed, cases=cases("batched", "ragged-rows", "two-rows"))
    by_name = {r.case.name: r for r in report.results}
    ragged, dense = by_name["ragged-rows"], by_name["two-rows"]
    assert ragged.status == "emits an invalid id" and "row 0" in ragged.detail
    assert dense.ok  # dense rows carry no placeholder: the bug cannot show there


# ---------------------------------------------------------------- the engine zoo's hooks


def _tokens_law(fn, case, with_drafts):
    """The exact law of ``fn``'s tokens on ``case`` (the drafts drawn by the program when ``with_drafts``)."""
    from specref.decoding.batched import sample_drafts

    def program(rng):
        if with_drafts:
            x = sample_drafts(case.drafts_from, rng, num_draft=case.k)
            return tuple(map(tuple, np.asarray(fn(case.p_target, case.q_draft, x, rng)).tolist()))
        return tuple(map(tuple, np.asarray(fn(case.p_target, case.q_draft, rng)).tolist()))

    return law(program, grid=case.grid)


@pytest.mark.parametrize("level", ["batched", "draft_and_verify"])
def test_the_engine_with_no_hook_replaced_is_the_specref_batched_reference(level):
    from specref.decoding.batched import batched_draft_and_verify

    if level == "batched":
        ours = zoo.engine_reference_batched
        theirs = lambda p, q, x, rng: batched_step(p, q, x, rng).tokens  # noqa: E731
    else:
        ours = zoo.engine_reference
        theirs = lambda p, q, rng: batched_draft_and_verify(p, q, rng).tokens  # noqa: E731
    for case in default_batched_cases(level):  # exact rows, grid coins included: equal laws
        assert _tokens_law(ours, case, level == "batched") == _tokens_law(theirs, case, level == "batched"), case
    rng = np.random.default_rng(5)  # float rows: the same tokens seed for seed
    for seed in range(20):
        p, q = rng.dirichlet(np.full(6, 0.5), size=(3, 4)), rng.dirichlet(np.full(6, 0.5), size=(3, 3))
        for dtype in (np.float32, np.float64):
            pd, qd = p.astype(dtype), q.astype(dtype)
            if level == "batched":
                x = rng.integers(0, 6, size=(3, 3))
                x[1, 1:] = -1  # a ragged row
                for q_in in (qd, None):  # point-mass drafts too
                    np.testing.assert_array_equal(ours(pd, q_in, x, seed), theirs(pd, q_in, x, seed))
            else:
                np.testing.assert_array_equal(ours(pd, qd, seed), theirs(pd, qd, seed))


BUG_HOOKS = {  # each wrong entry and the hooks it replaces
    "shared_noise_stream": {"coins"}, "coin_reused": {"coins"}, "row_position_noise": {"coins"},
    "inclusive_zero_coin": {"accepts"}, "dirty_scratch": {"scratch"}, "cross_row_residual": {"scratch"},
    "placeholder_indexed": {"drafts"},
    "out_of_vocab_id": {"accepts", "sample"},  # two defects that show only together
}


def test_each_bug_replaces_exactly_its_hooks_of_the_reference(monkeypatch):
    from dataclasses import fields

    assert set(zoo.HOOKS) == {e.name for e in zoo.entries()}
    assert set(BUG_HOOKS) == {e.name for e in zoo.entries("wrong")}
    for e in zoo.entries():
        hooks = zoo.HOOKS[e.name]
        changed = {f.name for f in fields(zoo.Hooks) if getattr(hooks, f.name) is not getattr(zoo.REFERENCE, f.name)}
        assert changed == BUG_HOOKS.get(e.name, set()), e.name
    # and each entry runs the one loop with its own hooks
    seen = []
    monkeypatch.setattr(zoo, "_engine", lambda *args, hooks: seen.append(hooks))
    p, q = np.full((2, 3, 4), 0.25), np.full((2, 2, 4), 0.25)
    for e in zoo.entries():
        e.fn(p, q, np.zeros((2, 2), dtype=np.int64), 0) if e.level == "batched" else e.fn(p, q, 0)
        assert seen.pop() is zoo.HOOKS[e.name], e.name


def test_each_bug_hook_differs_from_the_reference_hook_where_its_bug_lives():
    R = zoo.REFERENCE
    # the accept comparisons: at u = 0 with p = 0, and at u = 0 with p = q
    assert not R.accepts(0.0, 0.0) and zoo.inclusive_below(0.0, 0.0)
    assert R.accepts(0.0, 1.0) and not zoo.half_open_above(0.0, 1.0)
    # the scratch rows: row 1 at position 1 of q
    q = np.arange(2 * 2 * 3, dtype=np.float64).reshape(2, 2, 3)
    rows, at = np.arange(2), np.array([1, 1])
    np.testing.assert_array_equal(R.scratch(q, rows, at, 0.0), q[:, 1])
    np.testing.assert_array_equal(zoo.previous_draft_row_left(q, rows, at, 0.0), q[:, 1] + q[:, 0])
    np.testing.assert_array_equal(zoo.previous_batch_row(q, rows, at, 0.0), q[[0, 0], 1])
    # the draft count: placeholders end a row, or are judged
    x = np.array([[0, -1], [1, 2]])
    assert R.drafts(x, 2).tolist() == [1, 2] and zoo.every_position(x, 2).tolist() == [2, 2]
    # the coin sources: the same generator state, the streams the docstrings name
    ref = R.coins(np.random.default_rng(0), 4, 2, True)
    one = zoo.one_stream(np.random.default_rng(0), 4, 2, True)
    assert one.accept is one.draft and one.recovery is one.draft
    np.testing.assert_array_equal(one.draft, ref.draft)
    reused = zoo.acceptance_coin_recovers(np.random.default_rng(0), 4, 2, True)
    assert reused.recovery is reused.accept and ref.recovery is None
    pairs = zoo.streams_of_row_pairs(np.random.default_rng(0), 4, 2, True)
    np.testing.assert_array_equal(pairs.accept[0], pairs.accept[1])
    assert not (ref.accept[0] == ref.accept[1]).all()
    # the last draw: an all-zero residual after a rejection draws a padded lane
    final, coin = np.array([[0.5, 0.5, 0.0]]), np.array([0.9])
    args = (final, coin, np.array([True]), np.array([0.0]), 0.0, 3)
    assert R.sample(*args).tolist() == [1] and zoo.tiled_argmax(*args).tolist() == [7]


# ---------------------------------------------------------------- vLLM V1: the engine's call


def vllm_no_bonus(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_logits, bonus, metadata):
    """Wrong: a fully accepted request gets no bonus token (the output stops at K)."""
    out = vllm_reference(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_logits, bonus,
                         metadata)
    full = (out != -1).sum(axis=1) == np.asarray(num_draft_tokens) + 1
    out[full, np.asarray(num_draft_tokens)[full]] = -1
    return out


def vllm_exclusive_cu(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_logits, bonus, metadata):
    """Wrong: reads cu as exclusive starts, so request b judges its drafts on request b-1's rows."""
    starts = np.concatenate([[0], np.asarray(cu)[:-1]])
    order = np.concatenate([np.arange(s, s + n) for s, n in zip(np.roll(starts, 1), num_draft_tokens)]).astype(int)
    order = np.minimum(order, len(draft_token_ids) - 1)
    return vllm_reference(draft_token_ids, num_draft_tokens, max_spec_len, cu,
                          None if draft_probs is None else draft_probs, target_logits[order], bonus, metadata)


def vllm_probs_for_logits(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_logits, bonus,
                          metadata):
    """Wrong: the pre-0.32 call -- probabilities handed where the engine takes logits."""
    return vllm_reference(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs,
                          softmax_rows(target_logits), bonus, metadata)


def vllm_logits_for_draft_probs(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_logits,
                                bonus, metadata):
    """Wrong: a draft model's logits (here log q) handed where the engine takes probabilities."""
    with np.errstate(divide="ignore"):
        logits = None if draft_probs is None else np.log(np.asarray(draft_probs, dtype=np.float64))
    return vllm_reference(draft_token_ids, num_draft_tokens, max_spec_len, cu, logits, target_logits, bonus, metadata)


def flashinfer_logits_for_probs(draft_probs, draft_token_ids, target_probs, seed):
    """Wrong: a target model's log-probabilities handed where FlashInfer's call takes probabilities."""
    with np.errstate(divide="ignore"):
        return flashinfer_reference(draft_probs, draft_token_ids, np.log(target_probs.astype(float)), seed)


def test_vllm_style_reference_passes_and_broken_ones_are_caught():
    few = cases("batched", "ragged-rows", "zero-draft-row")
    ok = check("batched", vllm_style(vllm_reference), cases=few)
    assert ok.ok and all(r.tv == 0 for r in ok.results), str(ok)
    assert not check("batched", vllm_style(vllm_no_bonus), cases=few[:1]).ok
    bad = check("batched", vllm_style(vllm_exclusive_cu), cases=few[:1])
    assert not bad.ok and bad.results[0].tv > F(1, 100), str(bad)


def test_vllm_level_is_exact_on_grid_coins():
    """Exact mode hands ExactLog logits: the reference's softmax gives the Fraction rows back, so TV = 0
    exactly, also where float64 logits would move a ratio across a float32-grid coin (this case, with
    log p handed as floats, differed by TV 2.4e-8 > the 1e-9 tolerance)."""
    report = check("vllm", vllm_reference, cases=cases("batched", "p-equals-q-row"))
    assert report.ok and all(r.tv == 0 for r in report.results), str(report)


def test_vllm_style_statistical_mode():
    rng = np.random.default_rng(2)
    case = BatchedCase("V5-ragged", rng.dirichlet(np.ones(5), size=(2, 3)), rng.dirichlet(np.ones(5), size=(2, 2)),
                       num_draft=(2, 1))
    report = check("batched", vllm_style(vllm_reference), cases=[case], mode="statistical", samples=20_000)
    assert report.ok, str(report)


def _captured_call(case, seed):
    captured = {}
    vllm_style(lambda *args: captured.setdefault("args", args))(case.p_target, case.q_draft,
                                                                np.array([[0, 1], [2, -1]]), seed)
    return dict(zip(VLLM_PARAMETERS, captured["args"]))


def test_the_level_hands_log_p_and_specref_sampling_metadata():
    """The call as vLLM 0.33.0 reads it: ``target_logits = log p`` (-inf at zeros), ``sampling_metadata``
    a SamplingMetadata with the oracle's seed; exact mode: ExactLog logits whose softmax is p exactly."""
    (case,) = cases("batched", "ragged-rows")
    judged = np.concatenate([case.p_target[0, :2], case.p_target[1, :1]])  # the T = 3 judged rows
    exact = _captured_call(case, rng := np.random.default_rng(0))  # any object with random() stands in
    z = exact["target_logits"]
    assert z.dtype == object and all(isinstance(v, ExactLog) for v in z.flat)
    assert (softmax_rows(z) == judged).all() and softmax_rows(z).dtype == object  # Fractions, exactly
    meta = exact["sampling_metadata"]
    assert isinstance(meta, SamplingMetadata) and meta.seed is rng
    assert (meta.temperature, meta.all_greedy, meta.all_random) == (1.0, False, True)
    with pytest.raises(SpecrefError, match="statistical mode"):
        meta.request_seeds(2)
    f = case.as_float()
    stat = _captured_call(replace(f, p_target=f.p_target.astype(np.float32), q_draft=f.q_draft.astype(np.float32)), 7)
    assert stat["target_logits"].dtype == np.float32
    np.testing.assert_allclose(np.exp(stat["target_logits"]), judged.astype(np.float64), rtol=1e-6)
    meta = stat["sampling_metadata"]
    assert meta.seed == 7 and len(set(meta.request_seeds(2))) == 2 and meta.global_seed() >= 0
    assert (meta.request_seeds(2) == SamplingMetadata(7).request_seeds(2)).all()
    assert (meta.request_seeds(2) != SamplingMetadata(8).request_seeds(2)).all()
    assert LEVELS_["vllm"].signature.index("target_logits") > 0 and VLLM_CALL[1] in LEVELS_["vllm"].signature
    assert VLLM_CALL == ("vllm", "0.33.0", "vllm/v1/sample/rejection_sampler.py", "rejection_sample")


def test_exact_logs_are_exact():
    z = np.array([ExactLog(F(1, 2)), ExactLog(F(1, 3)), ExactLog(F(1, 6)), ExactLog(0)], dtype=object)
    assert (softmax_rows(z[None]) == [F(1, 2), F(1, 3), F(1, 6), 0]).all()
    assert z.max() == ExactLog(F(1, 2)) and int(np.argmax(z)) == 0 and float(z[3]) == -np.inf
    assert abs(float(z[1]) - np.log(1 / 3)) < 1e-15 and (z[0] - z[1]).exp() == F(3, 2)
    assert z.astype(np.float64)[3] == -np.inf and z[0] / 1 is z[0]
    with pytest.raises((TypeError, ValueError), match="rational"):
        z[0] / 2  # log(1/2) / 2 is log of an irrational: a temperature other than 1 leaves the rationals
    with pytest.raises((TypeError, ValueError)):
        z[0] - z[3]  # -inf subtracted


def test_one_exact_log_for_the_vllm_and_mrv2_levels():
    """One class, importable from both levels; what each level's exact mode needs holds on it: the
    vllm level's (``+ 0``, ``/ 1`` and ``sum`` leave the logs exact) and MRV2's (a temperature
    ``T`` is the power ``r ** T``: ``log(1/2) * 2`` is ``log(1/4)``), and a tiny ratio still has a
    finite float logarithm (``log 2^-2000``, below float64's smallest number)."""
    from specref.verification.levels.batched import mrv2

    assert mrv2.ExactLog is ExactLog
    half, third = ExactLog(F(1, 2)), ExactLog(F(1, 3))
    assert (half + 0) is half and (half - 0) is half and (half * 1) is half and sum([half, third]).ratio == F(1, 6)
    assert (half * 2).ratio == F(1, 4) and (ExactLog(F(1, 9)) / 2).ratio == F(1, 3) and (-half).ratio == 2
    assert float(ExactLog(F(1, 2**2000))) == pytest.approx(-2000 * np.log(2))
    assert ExactLog(0) < third < 0 < ExactLog(2) < np.inf and ExactLog(1) == 0 and ExactLog(0) == -np.inf


def test_probabilities_for_logits_and_logits_for_probabilities_are_named_from_the_rows():
    """The issue-22 bug (probabilities handed as target_logits: softmax(p) sampled, a false 'differs' of
    TV 0.136 on the real engine) and its mirror (draft logits handed as draft_probs) are refused from the
    rows, naming the argument -- in exact and statistical mode."""
    few = cases("batched", "two-rows")
    for mode in ("exact", "statistical"):
        kw = dict(mode="statistical", samples=200, seed=3) if mode == "statistical" else {}
        probs = check("vllm", vllm_probs_for_logits, cases=few, **kw).results[0]
        assert probs.status == "raised" and "target_logits" in probs.detail and "probability rows" in probs.detail
        assert "log(p)" in probs.detail, probs.detail
        logits = check("vllm", vllm_logits_for_draft_probs, cases=few, **kw).results[0]
        assert logits.status == "raised" and "draft_probs" in logits.detail, logits.detail
        assert "takes probabilities" in logits.detail and "(row 0)" in logits.detail, logits.detail
    flat = check("flashinfer", flashinfer_logits_for_probs, cases=few).results[0]
    assert flat.status == "raised" and "target_probs" in flat.detail and "negative entry" in flat.detail


@pytest.mark.parametrize("rows, message", [
    (np.array([[0.2, 0.3, 0.5], [0.5, -0.1, 0.6]]), r"draft_probs\[1\] \(row 1\) has a negative entry \(-0\.1\)"),
    (np.array([[0.2, 0.3, 0.5], [0.5, 0.2, 0.2]]), r"draft_probs\[1\] \(row 1\) sums to 0\.9"),
    (np.array([[0.2, np.nan, 0.5]]), r"draft_probs\[0\] \(row 0\) is not finite"),
    (np.array([[[0.5, 0.5]], [[2.0, -1.0]]]), r"draft_probs\[1, 0\] \(row 1\) has a negative entry"),
    (np.array([[F(1, 2), F(1, 3)]], dtype=object), r"draft_probs\[0\] \(row 0\) sums to 5/6"),
])
def test_probability_rows_refused_name_argument_and_row(rows, message):
    with pytest.raises(SpecrefError, match=message):
        check_probability_rows("draft_probs", rows)


def test_logit_rows():
    ok = np.array([[np.log(0.5), np.log(0.5), -np.inf], np.log([0.2, 0.3, 0.5])])
    assert check_logit_rows("target_logits", ok) is not None
    assert check_logit_rows("target_logits", np.full((2, 3), 1 / 3)) is not None  # uniform: its own softmax
    assert check_logit_rows("target_logits", np.array([[0.2, 0.3, 0.5], [3.0, 1.0, 0.0]])) is not None  # one real row
    for rows, message in [(np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]]), r"\[0\] \(row 0\) and every other row are "
                                                                          r"probability rows"),
                          (np.array([[1 / 3, 1 / 3, 1 / 3], [0.2, 0.3, 0.5]]), r"\[1\] \(row 1\) and every other"),
                          (np.array([[0.0, np.inf, 1.0]]), r"\(row 0\) is not finite"),
                          (np.array([[0.0, 1.0], [-np.inf, -np.inf]]), r"\[1\] \(row 1\) is -inf everywhere")]:
        with pytest.raises(SpecrefError, match=message):
            check_logit_rows("target_logits", rows)


def test_an_integer_seed_for_sampling_metadata_is_refused_with_the_call():
    args = {**_layout(), "sampling_metadata": 0}
    with pytest.raises(SpecrefError, match="sampling_metadata must carry the oracle's seed"):
        vllm_reference(**args)


def _layout():
    rng = np.random.default_rng(4)
    t = rng.dirichlet(np.ones(4), size=3)
    return dict(draft_token_ids=np.array([0, 1, 2]), num_draft_tokens=[2, 0, 1], max_spec_len=2,
                cu_num_draft_tokens=np.array([2, 2, 3]), draft_probs=rng.dirichlet(np.ones(4), size=3),
                target_logits=np.log(t), bonus_token_ids=np.array([[1], [2], [3]]))


@pytest.mark.parametrize("change, message", [
    (dict(cu_num_draft_tokens=np.array([2, 1, 3]), num_draft_tokens=[2, 0, 2]), r"non-decreasing.*row 1 has 1 after 2"),
    (dict(num_draft_tokens=[1, 1, 1]), r"cu_num_draft_tokens row 0 gives 2 drafts, num_draft_tokens\[0\] = 1"),
    (dict(draft_token_ids=np.array([0, 1])), r"draft_token_ids must have shape \[T\] = \[3\]"),
    (dict(draft_probs=np.ones((3, 5)) / 5), r"draft_probs must have shape \[T, V\] = \[3, 4\]"),
    (dict(bonus_token_ids=np.array([[1], [4], [0]])), r"bonus_token_ids\[1\] = 4 \(row 1\) is out of range"),
    (dict(max_spec_len=1), r"num_draft_tokens\[0\] = 2 \(row 0\) exceeds max_spec_len = 1"),
    (dict(num_draft_tokens=[2, 0]), r"num_draft_tokens has 2 entries, cu_num_draft_tokens has 3"),
    (dict(target_logits=np.zeros((2, 4))), r"target_logits must have shape \[T, V\] = \[3, V\]"),
])
def test_vllm_layout_bad_input_names_argument_and_row(change, message):
    args = {**_layout(), **change}
    with pytest.raises(SpecrefError, match=message):
        check_ragged_layout(**args)


_EMPTY = dict(draft_token_ids=np.zeros(0, np.int64), num_draft_tokens=[], max_spec_len=0,
              cu_num_draft_tokens=np.zeros(0, np.int64), draft_probs=np.zeros((0, 4)), target_logits=np.zeros((0, 4)),
              bonus_token_ids=np.zeros((0, 1), np.int64))


@pytest.mark.parametrize("change, message", [
    (dict(num_draft_tokens=["2", "0", "1"]), r"num_draft_tokens\[0\] = '2' is not an integer draft count \(a str\)"),
    (dict(num_draft_tokens=[2.0, 0, 1]), r"num_draft_tokens\[0\] = 2\.0 is not an integer draft count \(a float\)"),
    (dict(num_draft_tokens=[True, 0, 1]), r"num_draft_tokens\[0\] = True is not an integer draft count \(a bool\)"),
    (dict(num_draft_tokens=1.0), r"num_draft_tokens must be a sequence of draft counts .* got float 1\.0"),
    (dict(num_draft_tokens=True), r"num_draft_tokens must be a sequence of draft counts .* got bool True"),
    (dict(num_draft_tokens=[2, -1, 1]), r"num_draft_tokens\[1\] = -1 is negative"),
    (dict(max_spec_len=True), r"max_spec_len must be an integer .* got bool True"),
    (dict(max_spec_len=1.5), r"max_spec_len must be an integer .* got float 1\.5"),
    (dict(max_spec_len=1), r"num_draft_tokens\[0\] = 2 \(row 0\) exceeds max_spec_len = 1"),
    (_EMPTY, r"num_draft_tokens is empty: a batch has at least one request \(B >= 1\)"),
    (dict(cu_num_draft_tokens=np.array([2.0, 2.0, 3.0])), r"cu_num_draft_tokens must hold integers, got dtype float64"),
    (dict(draft_token_ids=np.array([0.0, 1.0, 2.0])), r"draft_token_ids must hold integers, got dtype float64"),
    (dict(draft_token_ids=np.array([0, 7, 2])), r"draft_token_ids\[1\] = 7 \(request 0\) is out of range for V = 4"),
    (dict(draft_token_ids=np.array([0, 1, -2])), r"draft_token_ids\[2\] = -2 \(request 2\) is out of range"),
    (dict(bonus_token_ids=np.array([[1.0], [2.0], [3.0]])), r"bonus_token_ids must hold integers"),
    (dict(draft_probs=np.array([[0.0, 0.5, 0.5, 0.0], [0.25] * 4, [0.25] * 4])),
     r"draft_token_ids\[0\] = 0 has draft_probs\[0, 0\] = 0: the draft cannot have proposed it"),
    (dict(sampling_metadata=SamplingMetadata("seven")), r"sampling_metadata\.seed must be an int seed >= 0 .* 'seven'"),
    (dict(sampling_metadata=SamplingMetadata(-3)), r"sampling_metadata\.seed must be an int seed >= 0, got -3"),
])
def test_vllm_reference_refuses_each_bad_input_in_the_callers_words(change, message):
    """One bad input at a time: a SpecrefError whose message names the argument of the vLLM call (never
    the batched step's own ``p_target``, ``q_draft`` or ``draft_tokens``), not an IndexError or a
    silent truncation (``2.0`` drafts, float ids)."""
    args = {**_layout(), "sampling_metadata": SamplingMetadata(0), **change}
    with pytest.raises(SpecrefError, match=message) as e:
        vllm_reference(**args)
    assert not re.search(r"\b(p_target|q_draft|draft_tokens|rng)\b", str(e.value)), e.value


def test_vllm_reference_output_and_nan_rows():
    args = _layout()
    out = vllm_reference(**args, sampling_metadata=SamplingMetadata(0))
    assert out.shape == (3, 3) and out.dtype == np.int32
    assert out[1, 0] == 2 and (out[1, 1:] == -1).all()  # zero drafts: the bonus only
    args["target_logits"] = args["target_logits"].copy()
    args["target_logits"][2, 1] = np.nan
    with pytest.raises(SpecrefError, match=r"target_logits\[2\] \(row 2\) is not finite"):
        vllm_reference(**args, sampling_metadata=SamplingMetadata(0))


# ---------------------------------------------------------------- vllm_engine: an installed rejection_sample


FAKE_ENGINE = """
from dataclasses import dataclass

import torch


@dataclass
class SamplingMetadata:  # the engine's own, as vllm/v1/sample/metadata.py has it (fewer fields)
    temperature: object
    all_greedy: bool
    all_random: bool
    generators: dict
    top_p: object = None


SEEN = []


def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                     target_logits, bonus_token_ids, sampling_metadata, synthetic_mode=False):
    SEEN.append(dict(locals()))
    g = sampling_metadata.generators.get(0)
    SEEN[-1]["draw"] = seed = int(torch.randint(1 << 30, (), generator=g))
    return torch.as_tensor(RULE(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                                target_logits, bonus_token_ids, seed))
"""


def _fake_engine():
    """A stand-in for vllm.v1.sample.rejection_sampler: a module with its own SamplingMetadata and a
    torch rejection_sample in the documented call that records what it was handed and runs
    specref's rule with a seed drawn from the engine's generators."""
    import types

    torch = pytest.importorskip("torch")
    mod = types.ModuleType("fake_rejection_sampler")

    def rule(x, n, m, cu, dp, tl, b, seed):
        return vllm_reference(x.numpy(), n, m, cu.numpy(), None if dp is None else dp.numpy(), tl.numpy(), b.numpy(),
                              SamplingMetadata(seed))

    mod.RULE = rule
    exec(FAKE_ENGINE, mod.__dict__)
    return torch, mod


def test_vllm_engine_builds_the_engines_own_metadata_and_generators():
    torch, mod = _fake_engine()
    args = _layout()
    for generators in ("per_request", "global"):
        fn = vllm_engine(mod.rejection_sample, generators=generators, device="cpu")
        torch.manual_seed(123)
        before = torch.random.get_rng_state()
        out = fn(**args, sampling_metadata=SamplingMetadata(5))
        assert out.shape == (3, 3) and out.dtype == torch.int32
        call = mod.SEEN[-1]
        meta = call["sampling_metadata"]
        assert isinstance(meta, mod.SamplingMetadata)  # the class beside rejection_sample, found in its globals
        assert meta.all_random and not meta.all_greedy and meta.top_p is None
        assert meta.temperature.tolist() == [1.0, 1.0, 1.0]
        assert call["target_logits"].dtype == torch.float32 and call["draft_token_ids"].dtype == torch.int32
        assert call["bonus_token_ids"].shape == (3, 1) and call["bonus_token_ids"].dtype == torch.int64
        assert torch.allclose(call["target_logits"], torch.as_tensor(args["target_logits"], dtype=torch.float32))
        if generators == "per_request":
            assert sorted(meta.generators) == [0, 1, 2]
            assert meta.generators[1].initial_seed() == int(SamplingMetadata(5).request_seeds(3)[1])
        else:
            assert meta.generators == {}
            assert torch.equal(torch.random.get_rng_state(), before)  # the caller's global state is restored
        fn(**args, sampling_metadata=SamplingMetadata(5))
        assert mod.SEEN[-1]["draw"] == call["draw"]  # seeded from the oracle's seed, call by call
        fn(**args, sampling_metadata=SamplingMetadata(6))
        assert mod.SEEN[-1]["draw"] != call["draw"]
    with pytest.raises(SpecrefError, match="statistical mode"):
        vllm_engine(mod.rejection_sample, device="cpu")(**args,
                                                        sampling_metadata=SamplingMetadata(np.random.default_rng(0)))
    with pytest.raises(SpecrefError, match="target_logits.*probability rows"):  # the issue-22 call, refused
        vllm_engine(mod.rejection_sample, device="cpu")(**{**args, "target_logits": np.exp(args["target_logits"])},
                                                        sampling_metadata=SamplingMetadata(5))
    with pytest.raises(SpecrefError, match="generators must be"):
        vllm_engine(mod.rejection_sample, generators="shared")


def test_vllm_engine_under_the_level_with_a_torch_stand_in():
    """The fake engine (specref's rule behind the engine's call) through vllm_engine at the vllm level."""
    torch, mod = _fake_engine()
    report = check("vllm", vllm_engine(mod.rejection_sample, device="cpu"), cases=cases("batched", "ragged-rows"),
                   mode="statistical", samples=5_000, seed=4, progress=False)
    assert report.ok, str(report)


def test_vllm_engine_refuses_another_call_naming_the_version_read():
    """The two calls read (``target_logits`` from 0.16.0, ``target_probs`` before) are taken; any other is
    refused naming the parameters found and the version read."""
    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_scores, bonus_token_ids, sampling_metadata):
        pass

    with pytest.raises(SpecrefError, match=r"target_scores.*vllm 0\.33\.0 \(vllm/v1/sample/rejection_sampler\.py\)"):
        vllm_engine(rejection_sample)

    def needs_more(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                   target_logits, bonus_token_ids, sampling_metadata, fly_window_size):
        pass

    with pytest.raises(SpecrefError, match="later parameters without a default: fly_window_size"):
        vllm_engine(needs_more)


# ---------------------------------------------------------------- FlashInfer style


def flashinfer_counts_bonus(draft_probs, draft_token_ids, target_probs, seed):
    """Wrong: emitted_num counts the bonus token too."""
    ids, acc, emitted = flashinfer_reference(draft_probs, draft_token_ids, target_probs, seed)
    return ids, acc, emitted + 1


def flashinfer_resample_from_p(draft_probs, draft_token_ids, target_probs, seed):
    """Wrong: on rejection, the correction is drawn from the target row, not the residual."""
    steps = batched_step(target_probs, draft_probs, draft_token_ids, seed)
    tokens, n = np.array(steps.tokens), np.asarray(steps.n_accepted)
    rng = np.random.default_rng([seed, 9])
    p = np.asarray(target_probs, dtype=np.float64)
    for b in np.flatnonzero(n < draft_token_ids.shape[1]):
        tokens[b, n[b]] = rng.choice(p.shape[2], p=p[b, n[b]] / p[b, n[b]].sum())
    return tokens.astype(np.int32), n, n


def test_flashinfer_style_reference_passes_and_broken_ones_are_caught():
    dense = cases("batched", "two-rows", "point-mass-drafts")
    ok = check("batched", flashinfer_style(flashinfer_reference), cases=dense)
    assert ok.ok and all(r.tv == 0 for r in ok.results), str(ok)
    counts = check("batched", flashinfer_style(flashinfer_counts_bonus), cases=dense[:1])
    assert counts.results[0].status == "invalid output" and "n_accepted" in counts.results[0].detail
    rng = np.random.default_rng(8)
    case = BatchedCase("V4", rng.dirichlet(np.ones(4), size=(2, 3)), rng.dirichlet(np.ones(4), size=(2, 2)))
    stat = check("batched", flashinfer_style(flashinfer_resample_from_p), cases=[case], mode="statistical",
                 samples=30_000)
    assert not stat.ok and stat.results[0].p_value < 1e-6, str(stat)
    ragged = check("batched", flashinfer_style(flashinfer_reference), cases=cases("batched", "ragged-rows"))
    assert ragged.results[0].status == "raised" and "dense rows" in ragged.results[0].detail


def test_real_flashinfer_kernel_when_importable():
    pytest.importorskip("flashinfer")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("FlashInfer's sampling kernels need CUDA")
    from specref.adapters.engines import flashinfer_engine

    rng = np.random.default_rng(0)
    case = BatchedCase("V64", rng.dirichlet(np.ones(64), size=(2, 4)), rng.dirichlet(np.ones(64), size=(2, 3)))
    report = check("batched", flashinfer_style(flashinfer_engine()), cases=[case], mode="statistical")
    assert report.ok, str(report)


def test_engine_shaped_levels_take_the_engine_call_as_it_is():
    from specref.verification.levels import LEVELS

    assert {"vllm", "flashinfer"} <= set(LEVELS)
    v = check("vllm", vllm_reference, cases=cases("batched", "ragged-rows"))
    assert v.ok and v.level == "vllm", str(v)
    f = check("flashinfer", flashinfer_counts_bonus, cases=cases("batched", "two-rows"))
    assert f.level == "flashinfer" and f.results[0].status == "invalid output"
    assert all(c.num_draft is None for c in LEVELS["flashinfer"].cases())
