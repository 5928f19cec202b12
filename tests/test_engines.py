"""Engine-shaped adapters (vLLM V1 style, FlashInfer style) and the engine zoo under the batched levels."""

from dataclasses import replace
from fractions import Fraction as F

import numpy as np
import pytest

from specref.adapters.engines import (
    check_ragged_layout, flashinfer_reference, flashinfer_style, vllm_reference, vllm_style,
)
from specref.core.errors import SpecrefError
from specref.decoding.batched import batched_step
from specref.verification.zoo import engines as zoo
from specref.verification.levels.batched import BatchedCase, default_batched_cases
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
    from specref.verification.levels.batched import large_vocab_case
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


def test_out_of_vocab_id_is_an_invalid_output_naming_the_row():
    report = check("draft_and_verify", zoo.out_of_vocab_id, cases=cases("draft_and_verify", "p-equals-q-row"))
    r = report.results[0]
    assert r.status == "invalid output" and "row 1" in r.detail and "id 7" in r.detail, str(report)
    (case,) = cases("draft_and_verify", "p-equals-q-row")
    # continuous coins: u = 1 exactly has probability 0, so the bug cannot show
    assert check("draft_and_verify", zoo.out_of_vocab_id, cases=[replace(case, grid=None)]).ok


def test_placeholder_indexed_is_an_invalid_output_on_ragged_rows():
    report = check("batched", zoo.placeholder_indexed, cases=cases("batched", "ragged-rows", "two-rows"))
    by_name = {r.case.name: r for r in report.results}
    ragged, dense = by_name["ragged-rows"], by_name["two-rows"]
    assert ragged.status == "invalid output" and "row 0" in ragged.detail
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


# ---------------------------------------------------------------- vLLM V1 style


def vllm_no_bonus(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_probs, bonus, seed):
    """Wrong: a fully accepted request gets no bonus token (the output stops at K)."""
    out = vllm_reference(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_probs, bonus, seed)
    full = (out != -1).sum(axis=1) == np.asarray(num_draft_tokens) + 1
    out[full, np.asarray(num_draft_tokens)[full]] = -1
    return out


def vllm_exclusive_cu(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_probs, bonus, seed):
    """Wrong: reads cu as exclusive starts, so request b judges its drafts on request b-1's rows."""
    starts = np.concatenate([[0], np.asarray(cu)[:-1]])
    order = np.concatenate([np.arange(s, s + n) for s, n in zip(np.roll(starts, 1), num_draft_tokens)]).astype(int)
    order = np.minimum(order, len(draft_token_ids) - 1)
    return vllm_reference(draft_token_ids, num_draft_tokens, max_spec_len, cu,
                          None if draft_probs is None else draft_probs, target_probs[order], bonus, seed)


def test_vllm_style_reference_passes_and_broken_ones_are_caught():
    few = cases("batched", "ragged-rows", "zero-draft-row")
    ok = check("batched", vllm_style(vllm_reference), cases=few)
    assert ok.ok and all(r.tv == 0 for r in ok.results), str(ok)
    assert not check("batched", vllm_style(vllm_no_bonus), cases=few[:1]).ok
    bad = check("batched", vllm_style(vllm_exclusive_cu), cases=few[:1])
    assert not bad.ok and bad.results[0].tv > F(1, 100), str(bad)


def test_vllm_style_statistical_mode():
    rng = np.random.default_rng(2)
    case = BatchedCase("V5-ragged", rng.dirichlet(np.ones(5), size=(2, 3)), rng.dirichlet(np.ones(5), size=(2, 2)),
                       num_draft=(2, 1))
    report = check("batched", vllm_style(vllm_reference), cases=[case], mode="statistical", samples=20_000)
    assert report.ok, str(report)


def _layout():
    rng = np.random.default_rng(4)
    t = rng.dirichlet(np.ones(4), size=3)
    return dict(draft_token_ids=np.array([0, 1, 2]), num_draft_tokens=[2, 0, 1], max_spec_len=2,
                cu_num_draft_tokens=np.array([2, 2, 3]), draft_probs=rng.dirichlet(np.ones(4), size=3),
                target_probs=t, bonus_token_ids=np.array([[1], [2], [3]]))


@pytest.mark.parametrize("change, message", [
    (dict(cu_num_draft_tokens=np.array([2, 1, 3]), num_draft_tokens=[2, -1, 2]), r"non-decreasing.*row 1 has 1 after 2"),
    (dict(num_draft_tokens=[1, 1, 1]), r"cu_num_draft_tokens row 0 gives 2 drafts, num_draft_tokens\[0\] = 1"),
    (dict(draft_token_ids=np.array([0, 1])), r"draft_token_ids must have shape \[T\] = \[3\]"),
    (dict(draft_probs=np.ones((3, 5)) / 5), r"draft_probs must have shape \[T, V\] = \[3, 4\]"),
    (dict(bonus_token_ids=np.array([[1], [4], [0]])), r"bonus_token_ids\[1\] = 4 \(row 1\) is out of range"),
    (dict(max_spec_len=1), r"num_draft_tokens\[0\] = 2 \(row 0\) exceeds max_spec_len = 1"),
    (dict(num_draft_tokens=[2, 0]), r"num_draft_tokens has 2 entries, cu_num_draft_tokens has 3"),
])
def test_vllm_layout_bad_input_names_argument_and_row(change, message):
    args = {**_layout(), **change}
    with pytest.raises(SpecrefError, match=message):
        check_ragged_layout(**args)


def test_vllm_reference_output_and_nan_rows():
    args = _layout()
    out = vllm_reference(**args, seed=0)
    assert out.shape == (3, 3) and out.dtype == np.int32
    assert out[1, 0] == 2 and (out[1, 1:] == -1).all()  # zero drafts: the bonus only
    args["target_probs"] = args["target_probs"].copy()
    args["target_probs"][2, 1] = np.nan
    with pytest.raises(SpecrefError, match=r"\(row 2\) is not finite"):
        vllm_reference(**args, seed=0)


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
