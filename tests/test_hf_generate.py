"""Hugging Face ``generate`` with an assistant, end to end under the decoder-level oracle (statistical).

The ground truth is the exact law of plain target sampling with HF's own processors
(:func:`specref.adapters.hf_generate.hf_rules`).  Every run is seeded (the oracle's
seed reaches torch through ``fork_rng``), so each verdict is reproducible.  N and
the level, chosen to fit the suite's budget (~15 ms per assisted ``generate`` call,
~7 ms per plain one, one torch thread):

- assisted, temperature 0.7 (27 outcomes): ``N = 600``, ``alpha = 1e-3``; detects
  TV >= ``detectable_tv(600, 1e-3, 0.9, 28)`` ~ 0.37 with power 0.9;
- assisted, EOS inside a block and ``max_new_tokens`` reached mid-block (K = 3,
  4 new tokens): ``N = 300``; a smoke test of those paths at this N (TV >= ~0.5);
- assisted greedy (``do_sample=False``): ``N = 20``, the law is a point mass, so a
  single wrong output fails it;
- the control, plain ``generate(do_sample=True)`` with min-p 0.3 (11 outcomes):
  ``N = 600``, detects TV >= ~0.22; the positive control -- the same plain
  ``generate`` run without min-p, judged against the min-p law (exact TV 0.26,
  computed below) -- must be flagged at that N.

``alpha = 1e-3`` instead of the oracle's 1e-6: with fixed seeds a false alarm cannot
come and go between runs, and the smaller level buys power at this N.  The README
table runs the planned N (TV >= 0.01 at alpha = 1e-6) in ``benchmarks/hf_generate.py``.

The efficiency verdict on the temperature case: transformers 5.24 hands the assistant
each warper twice (temperature 0.7 becomes 0.49 on the draft), so generate needs more
target calls than the reference (exact 2.043 per decode) and matches the reference
with the draft warped twice (exact 2.190).  About 25 s in all.
"""

from dataclasses import replace

import pytest

from specref.verification.oracle import check_decoder
from specref.verification.statistics.counts import detectable_tv

pytest.importorskip("torch")
pytest.importorskip("transformers")

from specref.adapters.hf_generate import (  # noqa: E402
    HFGenerate,
    assistant_processors,
    hf_cases,
    hf_rules,
    hf_rules_twice,
)
from specref.core.sampling import SamplingConfig  # noqa: E402
from specref.verification.statistics.efficiency import _mean, efficiency, reference_iterations  # noqa: E402
from specref.verification.laws.enumeration import compare, target_law  # noqa: E402
from specref.verification.cases.rules import ruled  # noqa: E402

ALPHA = 1e-3
CASES = {c.name: c for c in hf_cases()}


@pytest.fixture(scope="module", autouse=True)
def quiet_transformers():
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()  # generate warns about passing config and kwargs together
    yield
    logging.set_verbosity(level)


def test_assisted_generate_preserves_the_law_of_plain_sampling_with_hf_processors():
    impl = HFGenerate()
    case = CASES["hf-temperature"]
    report = check_decoder(impl, cases=[case], mode="statistical", samples=600, alpha=ALPHA)
    assert detectable_tv(600, ALPHA, 0.9, 28) < 0.38
    assert report.ok, report
    assert "self-consistent" in str(report)  # checked against its own (HF's) rules
    # the efficiency verdict: wasteful against the reference, in line with a draft warped twice;
    # HFGenerate declares specref_isolate = False, so its 600 calls were recorded in this process
    assert len(impl.target_calls) == 600, len(impl.target_calls)
    calls = impl.target_calls[-600:]
    verdict = efficiency(calls, case, rules=hf_rules)
    assert abs(verdict.reference - 2.0429) < 1e-3, verdict
    if _warper_passes(case.config) == 2:  # the installed transformers warps the draft twice (5.24 does)
        twice = float(_mean(reference_iterations(case, rules=hf_rules, draft_rules=hf_rules_twice)))
        assert verdict.verdict == "wasteful", verdict
        assert abs(twice - 2.1903) < 1e-3 and verdict.interval[0] <= twice <= verdict.interval[1], verdict


def test_assisted_generate_eos_inside_a_block_and_max_new_tokens_mid_block():
    # K = 3, 4 new tokens, stop token 2: a second block is cut at max_new_tokens unless EOS ends it first
    case = CASES["hf-eos-mid-block"]
    report = check_decoder(HFGenerate(), cases=[case], mode="statistical", samples=300, alpha=ALPHA)
    assert report.ok, report


def test_assisted_greedy_generate_is_the_argmax_chain():
    report = check_decoder(HFGenerate(), cases=[CASES["hf-greedy"]], mode="statistical", samples=20, alpha=ALPHA)
    assert report.ok and report.results[0].tv == 0, report


def test_isolated_generate_gives_the_same_verdict():
    """HFGenerate runs in a forked worker when asked (torch on one thread there): the same counts,
    so the same TV, as in-process; the records stay in the worker.  N = 100: a smoke test (about 1 s)."""
    case = CASES["hf-top-k"]
    runs = {}
    for isolate in (False, True):
        impl = HFGenerate()
        report = check_decoder(impl, cases=[case], mode="statistical", samples=100, alpha=ALPHA, isolate=isolate,
                               progress=False)
        runs[isolate] = (report.results[0].status, report.results[0].tv, len(impl.target_calls))
    assert runs[False][:2] == runs[True][:2] and runs[True][0] == "ok", runs
    assert runs[False][2] == 100 and runs[True][2] == 0, runs


def _warper_passes(config) -> int:
    """How many times the installed transformers applies the warpers to the assistant's logits,
    read by the spy (:func:`assistant_processors`): the number of temperature warpers it records."""
    return assistant_processors(config).count("TemperatureLogitsWarper")


def test_control_plain_generate_passes_and_a_wrong_plain_sampler_is_flagged():
    from transformers import GenerationConfig

    if not hasattr(GenerationConfig(), "min_p"):
        pytest.skip("this transformers has no min-p (GenerationConfig.min_p, from 4.41): the min-p case cannot run")
    case = CASES["hf-min-p"]
    plain = check_decoder(HFGenerate(assisted=False), cases=[case], mode="statistical", samples=600, alpha=ALPHA)
    assert plain.ok, plain
    target, _ = case.models()
    truth_model, config = ruled(target, case.config, hf_rules)
    wrong_model, _ = ruled(target, replace(case.config, min_p=0.0), hf_rules)
    tv = compare(target_law(wrong_model, list(case.prompt), config, case.max_new_tokens),
                 target_law(truth_model, list(case.prompt), config, case.max_new_tokens)).tv
    assert tv > detectable_tv(600, ALPHA, 0.9, 12)  # 0.26 > 0.22: planned power >= 0.9

    no_min_p = HFGenerate(assisted=False)

    def forgets_min_p(target, draft, prompt, *, config, **kwargs):
        return no_min_p(target, draft, prompt, config=replace(config, min_p=0.0), **kwargs)

    flagged = check_decoder(forgets_min_p, cases=[case], mode="statistical", samples=600, alpha=ALPHA, rules=hf_rules)
    assert not flagged.ok, flagged


def test_the_assistant_applies_every_warper_twice_in_this_transformers():
    import transformers

    names = assistant_processors(SamplingConfig(temperature=0.7, top_k=2, top_p=0.9))
    passes = names.count("TemperatureLogitsWarper")
    # whole passes of the three warpers, in HF's order (transformers 4.40 builds the assistant's
    # warpers outside _get_logits_processor, so the spy sees none there)
    assert names == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"] * passes, names
    if transformers.__version__.startswith("5.24"):
        assert passes == 2


def test_hf_generate_travels_to_a_worker_and_is_seeded():
    import pickle

    case = CASES["hf-temperature"]
    target, draft = case.models()
    impl = HFGenerate()
    kwargs = dict(k=case.k, config=case.config, max_new_tokens=case.max_new_tokens, stop_tokens=(), rng=11)
    first = impl(target, draft, list(case.prompt), **kwargs)
    copy = pickle.loads(pickle.dumps(impl))  # what a process-pool shard receives: settings, no built models
    assert copy.assisted and copy._models == {} and copy(target, draft, list(case.prompt), **kwargs) == first


@pytest.mark.parametrize("name", ["hf-temperature", "hf-top-p", "hf-max-new-mid-block"])
@pytest.mark.parametrize("passes", [1, 2])
def test_the_calls_script_joint_law_agrees_with_reference_iterations(name, passes):
    # benchmarks/hf_generate_calls.py enumerates the joint law of (output, target calls) on its own;
    # its mean calls and its output marginal must be the reference's (two independent routes)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from hf_generate_calls import joint_law

    case = CASES[name].as_float()
    law = joint_law(case, passes)
    assert abs(sum(law.values()) - 1) < 1e-12
    mean = sum(calls * w for (_, calls), w in law.items())
    ref = float(_mean(reference_iterations(case, rules=hf_rules,
                                           draft_rules=hf_rules if passes == 1 else hf_rules_twice)))
    assert abs(mean - ref) < 1e-9, (mean, ref)
    outputs = {}
    for (tokens, _), w in law.items():
        outputs[tokens] = outputs.get(tokens, 0.0) + w
    target, _ = case.models()
    model, config = ruled(target, case.config, hf_rules)
    truth = target_law(model, list(case.prompt), config, case.max_new_tokens)
    assert compare(outputs, truth).tv < 1e-6  # lossless: the output marginal is plain sampling's law
