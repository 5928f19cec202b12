"""The ``mrv2`` level: vLLM Model Runner V2's call, judged by the batched level's criterion.

The reference passes exactly (TV = 0 in Fractions, logits as exact logarithms); wrong variants of
it are flagged; the real MRV2 sampler (vllm 0.33.0, in Triton's interpreter) passes in
statistical mode at a small N and its signature is the documented call.  The real-engine tests
need the pinned wheels (``python scripts/fetch_engines.py``) and torch, and are skipped without.
"""

import inspect
import time
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.verification.levels import LEVELS
from specref.verification.levels.batched.steps import default_batched_cases
from specref.verification.levels.batched.mrv2 import (PARAMETERS, REQUIRED, SOURCE, ExactLog, MRV2Case, default_mrv2_cases,
                                              mrv2_call, mrv2_reference, softmax)
from specref.verification.oracle import check
from tests.implementations import engines_missing



def cases(*names):
    by_name = {c.name: c for c in default_mrv2_cases()}
    return [by_name[n] for n in names]


MISSING = engines_missing()
needs_engines = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


# ---------------------------------------------------------------- the level and its reference


def test_the_level_is_registered_with_the_call_it_documents():
    level = LEVELS["mrv2"]
    assert level.signature.startswith("fn(target_logits [num_logits, V], draft_logits [max_num_reqs, K, V] | None")
    assert SOURCE == ("vllm", "0.33.0", "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py", "rejection_sample")
    assert tuple(inspect.signature(mrv2_reference).parameters) == PARAMETERS and REQUIRED == PARAMETERS[:11]


def test_the_reference_passes_every_default_case_exactly():
    report = check("mrv2", mrv2_reference)
    assert report.ok, str(report)
    assert len(report.results) == 8 and all(r.tv == 0 and isinstance(r.tv, Fraction) for r in report.results)


def _no_temperature(tl, dl, ds, cu, pos, idx, eidx, elp, temp, seed, k):
    """Uses MRV2's draft logits as if the temperature were applied already (q^T, renormalised)."""
    return mrv2_reference(tl, None if dl is None else dl * temp[:, None, None], ds, cu, pos, idx, eidx, elp, temp,
                          seed, k)


def _ignores_q(tl, dl, ds, cu, pos, idx, eidx, elp, temp, seed, k):
    """Judges every draft as a point mass (accept with p(x)), whatever the draft logits say."""
    return mrv2_reference(tl, None, ds, cu, pos, idx, eidx, elp, temp, seed, k)


def _by_request(tl, dl, ds, cu, pos, idx, eidx, elp, temp, seed, k):
    """Reads draft logits and temperature at slot r instead of slot idx_mapping[r]."""
    dl2, t2 = None if dl is None else dl.copy(), temp.copy()
    for r, s in enumerate(idx):
        if dl is not None:
            dl2[s] = dl[r]
        t2[s] = temp[r]
    return mrv2_reference(tl, dl2, ds, cu, pos, idx, eidx, elp, t2, seed, k)


def _ties_highest(tl, dl, ds, cu, pos, idx, eidx, elp, temp, seed, k):
    """The reference on the vocabulary reversed: sampled rows keep their law, greedy ties go to the highest id."""
    V = tl.shape[1]

    def flip(a):
        return None if a is None else a[..., ::-1].copy()

    out, n = mrv2_reference(flip(tl), flip(dl), np.where(ds >= 0, V - 1 - ds, ds), cu, pos, idx, eidx, elp, temp,
                            seed, k)
    return np.where(out >= 0, V - 1 - out, out), n


@pytest.mark.parametrize("wrong, flagged, passed", [
    (_no_temperature, ["probabilistic-T2-ragged"], ["probabilistic-T1"]),  # invisible at T = 1
    (_ignores_q, ["probabilistic-T1"], ["one-hot-drafts-ragged"]),  # one-hot drafts have no q to ignore
    (_by_request, ["greedy-one-hot-drafts"], []),
    (_ties_highest, ["greedy-one-hot-drafts"], []),
])
def test_wrong_variants_are_flagged_exactly(wrong, flagged, passed):
    report = check("mrv2", wrong, cases=cases(*flagged, *passed))
    status = {r.case.name: r.status for r in report.results}
    assert all(status[n] == "differs" for n in flagged), str(report)
    assert all(status[n] == "ok" for n in passed), str(report)
    bad = report.counterexample
    assert isinstance(bad, MRV2Case) and bad.name in flagged  # plain data, with its temperatures
    again = check("mrv2", wrong, cases=[bad])
    assert not again.ok and again.results[0].tv == max(r.tv for r in report.results)


def test_the_reference_passes_in_statistical_mode():
    report = check("mrv2", mrv2_reference, cases=cases("probabilistic-T2-ragged", "greedy-and-sampled",
                                                        "one-hot-drafts-ragged"),
                   mode="statistical", samples=3000, seed=3, progress=False)
    assert report.ok, str(report)
    assert all(r.n_samples >= 1500 and r.detectable_tv < 0.1 for r in report.results)


def test_a_wrong_variant_is_flagged_in_statistical_mode():
    report = check("mrv2", _ignores_q, cases=cases("probabilistic-T1"), mode="statistical", samples=3000, seed=4,
                   progress=False)
    assert report.results[0].status == "differs", str(report)


# ---------------------------------------------------------------- the call's layout


def test_the_call_lays_out_requests_slots_and_draft_logits_as_mrv2_reads_them():
    c = cases("probabilistic-T2-ragged")[0].as_float()  # k = (1, 2), T = 2
    x = np.array([[1, -1], [2, 0]])
    args = mrv2_call(c.p_target, c.q_draft, x, 7, (2, 2))
    (tl, dl, ds, cu, pos, idx, eidx, elp, temp, seeds, K) = args
    assert cu.tolist() == [0, 2, 5] and K == 2 and tl.shape == (5, 3) and tl.dtype == np.float32
    assert idx.tolist() == [2, 1] and eidx.tolist() == [2, 2, 1, 1, 1] and elp.tolist() == [0, 1, 0, 1, 2]
    assert ds.tolist() == [0, 1, 0, 2, 0]  # the committed token, then each request's drafts
    assert dl.shape == (3, 2, 3) and temp.tolist() == [1.0, 2.0, 2.0] and not dl[0].any()  # slot 0: a decoy
    np.testing.assert_allclose(softmax(dl[2, :1] / 2), c.q_draft[0, :1], rtol=1e-6)  # T log q, divided back
    np.testing.assert_allclose(softmax(tl[2:5]), c.p_target[1], rtol=1e-6)
    assert seeds.shape == (3,) and seeds.dtype == np.int64 and (seeds >= 0).all()
    assert (np.diff(pos[:2]) == 1).all() and (np.diff(pos[2:]) == 1).all()
    again = mrv2_call(c.p_target, c.q_draft, x, 7, (2, 2))
    assert np.array_equal(again[9], seeds) and np.array_equal(again[4], pos)  # keyed by the oracle's seed
    assert not np.array_equal(mrv2_call(c.p_target, c.q_draft, x, 8, (2, 2))[9], seeds)


def test_exact_logarithms_are_exact_and_refuse_irrational_powers():
    third, half, zero = ExactLog(Fraction(1, 3)), ExactLog(Fraction(1, 2)), ExactLog(0)
    assert (third + half).ratio == Fraction(1, 6) and (third - half).ratio == Fraction(2, 3)
    assert (ExactLog(Fraction(4, 9)) / np.float32(2)).ratio == Fraction(2, 3) and (third * 2).ratio == Fraction(1, 9)
    assert zero < third < half and zero == -np.inf and float(half) == pytest.approx(np.log(0.5))
    rows = np.array([[third, half, zero]], dtype=object)
    assert softmax(rows).tolist() == [[Fraction(2, 5), Fraction(3, 5), Fraction(0)]]
    with pytest.raises(SpecrefError, match="not the logarithm of a rational"):
        third / 2


def test_usage_errors_are_refused_before_any_case_runs():
    with pytest.raises(SpecrefError, match="not an integer"):
        check("mrv2", mrv2_reference, cases=[replace(cases("probabilistic-T1")[0], temperature=0.5)])
    with pytest.raises(SpecrefError, match="MRV2Case"):
        check("mrv2", mrv2_reference, cases=default_batched_cases()[:1])
    with pytest.raises(SpecrefError, match="3 temperatures for 2 rows"):
        check("mrv2", mrv2_reference, cases=[replace(cases("probabilistic-T1")[0], temperature=(1, 1, 1))])
    args = mrv2_call(*[getattr(cases("probabilistic-T1")[0].as_float(), a) for a in ("p_target", "q_draft")],
                     np.array([[0, 1], [1, 0]]), 5, (1, 1))
    with pytest.raises(SpecrefError, match="use_block_verification"):
        mrv2_reference(*args, use_block_verification=True)


def test_a_malformed_output_is_an_invalid_output_naming_the_shape():
    report = check("mrv2", lambda *args: mrv2_reference(*args)[0], cases=cases("probabilistic-T1"))
    assert report.results[0].status == "invalid output" and "num_sampled" in report.results[0].detail


# ---------------------------------------------------------------- the real MRV2 sampler


def real_mrv2():
    """vLLM 0.33.0's MRV2 ``rejection_sample`` in the level's call: NumPy in, torch inside, NumPy out."""
    import torch

    from specref.adapters.real_engines import mrv2

    rejection_sample, shim = mrv2._mrv2()

    def fn(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
           expanded_local_pos, temperature, seed, num_speculative_steps):
        def t(a, dtype):
            return torch.from_numpy(np.array(a, dtype=dtype))  # a copy: the inputs are handed read-only

        with shim.active():
            sampled, num = rejection_sample(
                t(target_logits, np.float32), None if draft_logits is None else t(draft_logits, np.float32),
                t(draft_sampled, np.int64), t(cu_num_logits, np.int32), t(pos, np.int64), t(idx_mapping, np.int32),
                t(expanded_idx_mapping, np.int32), t(expanded_local_pos, np.int32), t(temperature, np.float32),
                t(seed, np.int64), int(num_speculative_steps))
        return sampled.numpy(), num.numpy()

    fn.__name__ = "vllm_mrv2_rejection_sample"
    return fn, rejection_sample


@needs_engines
def test_the_real_mrv2_signature_is_the_documented_call():
    _, rejection_sample = real_mrv2()
    assert tuple(inspect.signature(rejection_sample).parameters) == PARAMETERS


@needs_engines
def test_the_real_mrv2_passes_in_statistical_mode():
    """T = 2 draft logits on ragged rows, and a greedy row with ties beside one-hot drafts; N = 100 per row
    (each statistic detects TV ~0.3-0.8 at that N; Triton's interpreter costs ~30 ms a row here)."""
    fn, _ = real_mrv2()
    started = time.perf_counter()
    report = check("mrv2", fn, cases=cases("probabilistic-T2-ragged", "greedy-one-hot-drafts"), mode="statistical",
                   samples=100, seed=21, time_limit=60.0, progress=False)
    print(f"\n{report}\n{time.perf_counter() - started:.1f} s")
    assert report.ok, str(report)


@needs_engines
def test_the_real_mrv2_greedy_rows_are_the_references_token_for_token():
    """Greedy rows are deterministic: on random raw logits with ties (float32 logs of 1/4 repeat) and
    random drafts the real sampler's outputs equal the reference's."""
    fn, _ = real_mrv2()
    rng = np.random.default_rng(5)
    R, K, V = 12, 3, 4
    p = rng.choice([1 / 4, 1 / 8, 1 / 2], size=(R, K + 1, V))
    p /= p.sum(axis=2, keepdims=True)
    x = rng.integers(V, size=(R, K))
    x[::4, 2:] = -1  # ragged rows
    args = mrv2_call(p, None, x, 11, (0,) * R)
    got, want = fn(*args), mrv2_reference(*args)
    n = want[1]
    assert np.array_equal(np.asarray(got[1]), n)
    keep = np.arange(K + 1)[None, :] < n[:, None]
    assert np.array_equal(np.where(keep, got[0], -1), want[0])
