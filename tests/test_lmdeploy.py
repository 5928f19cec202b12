"""LMDeploy 0.18.0's portable rejection sampler (``lmdeploy/pytorch/backends/default/rejection_sampling.py``),
run unmodified from the pinned wheel: its signature, a statistical check as a ``batched`` step, and the
exact check with its coins handed in (``batched_coins``, SPEC §11.9).

Needs the wheel in the cache (``python scripts/fetch_engines.py``); skipped otherwise.

Statistical: N = 4,000 per row on each of the 7 default cases, seeded; the oracle G-tests each case's
statistics at alpha = 1e-6 with a Bonferroni correction over them, so a correct sampler is flagged with
probability at most 1e-6 per case; at this N the statistics detect TV of about 0.05-0.09 (power 0.9,
printed per case).  Exact: LMDeploy accepts on ``target / draft >= uniform`` (inclusive), so every coin
case is ``boundary``, with the law of specref's ``inclusive_zero_kernel`` exactly; with the comparison
made strict (a copy of the file) the same seam gives ``ok`` with TV 0.  About 20 s on 2 busy cores.
"""

import inspect
import shutil
from pathlib import Path

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.verification.levels import LEVELS
from specref.verification.levels.coins.kernels import BOUNDARY, CoinCase, default_coin_cases, inclusive_zero_kernel
from specref.verification.oracle import check

torch = pytest.importorskip("torch")
wheels = pytest.importorskip("specref.adapters.real_engines.wheels")
from specref.adapters.hf import seam_calls  # noqa: E402
from specref.adapters.real_engines import lmdeploy as lmd  # noqa: E402

PIN = f"lmdeploy {wheels.PINNED['lmdeploy']}"
needs_wheel = pytest.mark.skipif(PIN in wheels.missing(), reason=f"{PIN} is not in the wheel cache "
                                                                 f"{wheels.wheels_dir()}: run `python scripts/fetch_engines.py`")
FILE = "lmdeploy/pytorch/backends/default/rejection_sampling.py"
N = 4_000

_BASE = default_coin_cases()
F64 = _BASE[1]  # V4-K2-float64: B = 2, three draft tuples (a p = 0 draft, p/q = 1/2 thresholds, sure accepts)
_P, _Q = _BASE[2].p_target, _BASE[2].q_draft
RAGGED = CoinCase("V4-ragged-float64", _P, _Q, drafts=(((1,), (0, 1)),), num_draft=(1, 2), dtype="float64", probes=4)
POINT_MASS = CoinCase("V4-point-mass-B1", _P[:1], None, drafts=(((1, 3),),), probes=4)  # p(1) = 0: u = 0 accepts it


@pytest.fixture(scope="module", autouse=True)
def _one_intra_op_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _coins(kernel, cases):
    return check("batched_coins", kernel, cases=cases, mode="exact", isolate=False).results


@needs_wheel
def test_the_wheels_forward_has_the_signature_read_in_0_18_0():
    forward, cls, shim = lmd._lmdeploy()
    assert tuple(inspect.signature(forward).parameters) == lmd.LMDEPLOY_FORWARD
    assert Path(inspect.getfile(forward)).as_posix().endswith(FILE)
    assert wheels._found_version(shim.root, "lmdeploy") == wheels.PINNED["lmdeploy"] == "0.18.0"
    assert [(r, n) for _, r, n in seam_calls(inspect.getsource(forward))] == list(lmd.LMDEPLOY_SEAM)


@needs_wheel
def test_the_sampler_preserves_the_target_in_statistical_mode():
    report = check("batched", lmd.lmdeploy_engine(), mode="statistical", samples=N, seed=23, isolate=False,
                   progress=False)
    print(f"\nlmdeploy 0.18.0, N = {N} per row:\n{report}")
    assert report.ok and len(report.results) == 7, str(report)


@needs_wheel
def test_on_coins_every_case_is_a_boundary_with_the_inclusive_kernels_law():
    # lmdeploy 0.18.0, rejection_sampling.py, DefaultRejectionSamplingImpl.forward:
    #     random_accepted = target_draft_probs >= uniform_probs                       (point-mass drafts)
    #     random_accepted = ((draft_token_probs > 0)
    #                        & (target_draft_probs / draft_token_probs >= uniform_probs))
    # u = 0 accepts a draft of p = 0; u = p/q accepts at the threshold: one grid point each
    cases = [F64, RAGGED, POINT_MASS]
    got, twin = _coins(lmd.lmdeploy_coin_kernel(), cases), _coins(inclusive_zero_kernel, cases)
    for g, t in zip(got, twin):
        assert g.status == t.status == BOUNDARY, (g, t)
        assert g.tv == t.tv > 0, (g.case.name, g.tv, t.tv)  # the same law, exactly
        assert "= 0 (one grid point)" in g.detail, g.detail


def _copy_tree(tmp_path, version="0.18.0", change=None):
    """A wheel cache whose lmdeploy tree holds the two files the adapter loads, ``change(text)`` applied
    to the sampler's, and metadata naming ``version``."""
    real = wheels.wheels_dir() / "lmdeploy-0.18.0"
    root = tmp_path / "lmdeploy-0.18.0"
    for rel in (FILE, "lmdeploy/pytorch/backends/rejection_sampling.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(real / rel, root / rel)
    if change is not None:
        (root / FILE).write_text(change((root / FILE).read_text()))
    meta = root / f"lmdeploy-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: lmdeploy\nVersion: {version}\n")
    (root / ".specref-complete").write_text("fake\n")
    return tmp_path


def _strict(text):
    assert text.count(">= uniform_probs") == 2
    return text.replace(">= uniform_probs", "> uniform_probs")


@needs_wheel
def test_with_the_comparison_made_strict_the_same_seam_gives_ok(tmp_path):
    kernel = lmd.lmdeploy_coin_kernel(cache=_copy_tree(tmp_path, change=_strict))
    results = _coins(kernel, [F64, POINT_MASS])
    assert [(r.status, r.tv) for r in results] == [("ok", 0), ("ok", 0)], results


@needs_wheel
def test_a_changed_signature_names_both_versions(tmp_path):
    def change(text):
        return text.replace("        *,\n        is_greedy: torch.Tensor | None,", "        generator=None,\n        *,\n"
                                                                                   "        is_greedy: torch.Tensor | None,")

    with pytest.raises(SpecrefError, match=r"lmdeploy 0\.18\.0.*lmdeploy 0\.18\.1") as e:
        lmd.lmdeploy_engine(cache=_copy_tree(tmp_path, "0.18.1", change))
    assert "DefaultRejectionSamplingImpl.forward" in str(e.value) and "generator" in str(e.value)


@needs_wheel
def test_a_source_whose_draws_changed_names_the_function_and_the_release(tmp_path):
    cache = _copy_tree(tmp_path, "0.18.1", lambda text: text.replace("q.exponential_()", "q.uniform_()"))
    with pytest.raises(SpecrefError, match=r"lmdeploy 0\.18\.1: .*DefaultRejectionSamplingImpl\.forward.*"
                                           r"draws torch\.rand, q\.uniform_"):
        lmd.lmdeploy_coin_kernel(cache=cache)


@needs_wheel
def test_the_statistical_step_refuses_exact_mode():
    p = np.full((1, 2, 3), 1 / 3)
    with pytest.raises(SpecrefError, match=r"statistical mode \(an integer seed\)"):
        lmd.lmdeploy_engine()(p, p[:, :1], np.array([[0]]), np.random.default_rng(0))


def test_a_missing_wheel_names_the_fetch_script(tmp_path):
    for make in (lmd.lmdeploy_engine, lmd.lmdeploy_coin_kernel):
        with pytest.raises(SpecrefError, match=r"lmdeploy 0\.18\.0 .*python scripts/fetch_engines\.py"):
            make(cache=tmp_path)


@needs_wheel
def test_the_guides_five_line_lmdeploy_test_fails_on_the_boundary():
    from tests.test_hf_coins import run_five_line_test

    two_rows = [c for c in LEVELS["batched"].cases() if c.name == "two-rows"]
    error = run_five_line_test("lmdeploy_coin_kernel", {"batched": {"cases": two_rows, "samples": 2_000},
                                                        "batched_coins": {"cases": [POINT_MASS]}})
    assert "boundary" in str(error) and "V4-point-mass-B1" in str(error), error
