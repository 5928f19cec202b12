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
from specref.verification import zoo_engines as zoo
from specref.verification.batched import BatchedCase, default_batched_cases
from specref.verification.laws import law
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
    from specref.verification.batched import check_draft_and_verify, large_vocab_case

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
