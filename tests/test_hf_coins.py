"""Hugging Face's ``_speculative_sampling`` with its coins handed in: the ``batched_coins`` level, exactly
(SPEC §11.9), through the seam of :func:`specref.adapters.hf.hf_coin_kernel`.

The installed function (transformers 5.24) accepts on ``r_i <= probability_ratio``; on grid coins that
is a deviation of one grid point per threshold, ``boundary``.  Its law is compared with specref's
``inclusive_zero_kernel`` (``coin * q <= p``), written independently in NumPy: the TVs must be equal,
exactly.  The same function with the comparison made strict (as transformers 5.25 writes it) must pass
with TV 0, so the seam itself adds nothing.  The documented five-line tests are run (their checks on
small cases) and must fail on the boundary.  About 15 s on 2 busy cores.
"""

import re
from pathlib import Path

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.verification.levels.coins.kernels import (BOUNDARY, CoinCase, default_coin_cases, engine_coin_kernel,
                                                       inclusive_zero_kernel)
from specref.verification.oracle import check, default_cases

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
hf = pytest.importorskip("specref.adapters.hf")

ROOT = Path(__file__).resolve().parents[1]
_BASE = default_coin_cases()
F64 = _BASE[1]  # V4-K2-float64: B = 2, three draft tuples (a p = 0 draft, p/q = 1/2 thresholds, sure accepts)
# row 0 of the float32 case: drafts (1, 2) draft a p = 0 token first; (0, 3) accept with 1/2, then surely
SMALL = CoinCase("V4-K2-B1", _BASE[0].p_target[:1], _BASE[0].q_draft[:1], drafts=(((1, 2),), ((0, 3),)), probes=4)


@pytest.fixture(scope="module", autouse=True)
def _one_intra_op_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _coins(kernel, cases):
    return check("batched_coins", kernel, cases=cases, mode="exact", isolate=False).results


def test_the_installed_function_on_coins_is_a_boundary_and_its_law_is_the_inclusive_kernels():
    # transformers 4.40 - 5.24, generation/utils.py, _speculative_sampling:
    #     r_i = torch.rand_like(probability_ratio)
    #     is_accepted = r_i <= probability_ratio
    # r_i = 0 accepts a draft of p = 0; r_i = 1/2 accepts at p/q = 1/2: one grid point each
    got = _coins(hf.hf_coin_kernel(), [F64, SMALL])
    twin = _coins(inclusive_zero_kernel, [F64, SMALL])
    for g, t in zip(got, twin):
        assert g.status == t.status == BOUNDARY, (g, t)
        assert g.tv == t.tv > 0, (g.tv, t.tv)  # the same law, exactly
        assert "uniform_coins[" in g.detail and "= 0 (one grid point)" in g.detail, g.detail
    assert got[0].tv < 1e-15  # float64 coins: mass 2^-53 per grid point, below any statistical test


def _strict_module_source() -> str:
    import inspect

    import transformers.generation.utils as utils

    text = inspect.getsource(utils)
    assert text.count("is_accepted = r_i <= probability_ratio") == 1
    return text.replace("is_accepted = r_i <= probability_ratio", "is_accepted = r_i < probability_ratio")


def test_the_same_function_with_a_strict_comparison_passes_with_tv_zero():
    """transformers 5.25 changes only that comparison to ``<``: through the same seam, TV exactly 0."""
    fn, source = hf.load_speculative_sampling(_strict_module_source(), "5.24.0-strict")
    results = _coins(hf.hf_coin_kernel(fn, version="5.24.0-strict", source=source), [F64, SMALL])
    assert [(r.status, r.tv) for r in results] == [("ok", 0), ("ok", 0)], results
    assert [r.status for r in _coins(engine_coin_kernel, [F64, SMALL])] == ["ok", "ok"]  # specref's own strict kernel


def test_a_release_without_the_function_is_named_with_the_function_and_the_release():
    with pytest.raises(SpecrefError, match=r"transformers 4\.99\.0: .*defines no _speculative_sampling"):
        hf.load_speculative_sampling("import torch\n\ndef _assisted_sampling(x):\n    return x\n", "4.99.0")


FAKE_DRAWS = '''
def _speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits):
    r_i = torch.rand(candidate_length)
    return candidate_input_ids, 0
'''


def test_a_source_whose_draws_changed_is_named_with_the_function_and_the_release():
    fn, source = hf.load_speculative_sampling(FAKE_DRAWS, "9.0.0")
    with pytest.raises(SpecrefError, match=r"transformers 9\.0\.0: _speculative_sampling.*torch\.rand_like, "
                                           r"torch\.multinomial.*draws torch\.rand\b") as e:
        hf.hf_coin_kernel(fn, version="9.0.0", source=source)
    assert "update its coin seam" in str(e.value)
    with pytest.raises(SpecrefError, match="version="):
        hf.hf_coin_kernel(fn)  # a function of one's own needs its release and text


TWICE = '''
def _speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits):
    for _ in range(2):
        r_i = torch.rand_like(new_logits[0, 0, :1])
    t = torch.multinomial(new_logits[0, :1].softmax(-1), num_samples=1)
    return t, 0
'''


def test_the_seam_refuses_draws_it_was_not_told_of_and_is_gone_after_the_call():
    fn, source = hf.load_speculative_sampling(TWICE, "9.0.1")
    kernel = hf.hf_coin_kernel(fn, version="9.0.1", source=source)  # the text draws rand_like once, the run twice
    p = np.full((1, 2, 4), 0.25, dtype=np.float32)
    x = np.array([[0]])
    with pytest.raises(SpecrefError, match=r"transformers 9\.0\.1: _speculative_sampling drew rand_like then rand_like"):
        kernel(p, p[:, :1], x, np.array([[0.5]], np.float32), np.array([0.5], np.float32))
    out = hf.hf_coin_kernel()(p, p[:, :1], x, np.array([[0.25]], np.float32), np.array([0.6], np.float32))
    assert out.tolist() == [[0, 2]]  # p = q: accepted; the bonus at 0.6 of a uniform row of 4 is token 2
    assert not torch._C._is_torch_function_mode_enabled()  # the mode left with the call
    assert not torch.equal(torch.rand_like(torch.zeros(8)), torch.rand_like(torch.zeros(8)))  # torch's own again


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exact_logits_give_the_rows_back_and_a_row_without_them_is_refused(dtype):
    rows = np.array([[float(v) for v in r] for c in _BASE for r in c.p_target.reshape(-1, 4)])
    rows = rows if dtype == "float64" else rows[[not np.array_equal(r, [0.125, 0.375, 0.25, 0.25]) for r in rows]]
    logits = hf.exact_logits(rows, dtype)
    assert torch.equal(logits[None].softmax(-1)[0], torch.from_numpy(rows.astype(dtype)))
    if dtype == "float64":  # log p: the rows only up to rounding (4 entries of these rows an ulp off)
        assert not torch.equal(hf.to_hf_logits(rows, dtype).softmax(-1)[0], torch.from_numpy(rows))
    else:  # exp jumps over 1/3 near log(1/3): no float32 logits give 1/8, 3/8, 1/4, 1/4
        with pytest.raises(SpecrefError, match=r"no float32 logits .*0\.125, 0\.375, 0\.25, 0\.25"):
            hf.exact_logits([[0.125, 0.375, 0.25, 0.25]], "float32")


def test_the_final_coin_is_the_inverse_cdf_the_level_defines():
    w = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25], dtype=torch.float64)
    cdf = np.cumsum(w.numpy())
    for u in (0.0, 0.25 - 2.0**-53, 0.25, 0.5, 0.75 - 2.0**-53, 0.75, 1 - 2.0**-53):
        want = int(np.searchsorted(cdf, u, side="right"))  # the first token whose CDF passes u
        assert hf.inverse_cdf(w, u) == want, u
        assert hf.inverse_cdf(w * 4, u) == want  # unnormalised weights: u * total
    assert hf.inverse_cdf(torch.tensor([1.0, 0.0]), 1 - 2.0**-53) == 0  # never past the last positive weight


def _five_line_block(marker: str) -> str:
    text = (ROOT / "docs" / "guide" / "batched.md").read_text()
    section = text.split("## Check an engine's own verifier in five lines of pytest")[1].split("\n## ")[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL) if marker in b]
    assert len(blocks) == 1, marker
    return blocks[0]


def run_five_line_test(marker: str, small: dict):
    """The guide's test for one engine, run as written except that ``check`` gets ``small[level]`` (cases
    and samples): the full defaults take minutes.  Returns what the test raised."""
    namespace: dict = {"__name__": "five_line_test"}
    exec(compile(_five_line_block(marker), "docs/guide/batched.md", "exec"), namespace)
    real = namespace["check"]
    namespace["check"] = lambda level, fn, **kw: real(level, fn, **{**kw, **small[level], "isolate": False})
    (test,) = [f for name, f in namespace.items() if name.startswith("test_")]
    with pytest.raises(AssertionError) as e:
        test()
    return e.value


def test_the_guides_five_line_hf_test_fails_on_the_boundary():
    step = [c for c in default_cases("step") if c.name == "k-equals-1"]
    error = run_five_line_test("hf_coin_kernel", {"step": {"cases": step, "samples": 500},
                                                  "batched_coins": {"cases": [SMALL]}})
    assert "boundary" in str(error) and "V4-K2-B1" in str(error), error


def test_every_five_line_block_compiles_and_names_what_exists():
    import importlib

    text = (ROOT / "docs" / "guide" / "batched.md").read_text()
    section = text.split("## Check an engine's own verifier in five lines of pytest")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 5  # vLLM, Hugging Face, LMDeploy, MRV2, SGLang
    for block in blocks:
        compile(block, "batched.md", "exec")
        assert sum(1 for line in block.splitlines() if line.strip()) <= 7, block
        assert '"batched_coins"' in block or '"vllm_coins"' in block  # every engine's test checks coins
        for module, names in re.findall(r"^from ([\w.]+) import (.+)$", block, flags=re.MULTILINE):
            if module.startswith("vllm."):
                continue  # vLLM itself: not installed here (tests/test_documented_calls.py runs it from the wheel)
            mod = importlib.import_module(module)
            assert all(hasattr(mod, n.strip()) for n in names.split(",")), (module, names)


def test_the_results_page_holds_the_records_tables():
    import json
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hf_coins import RELEASES, tables

    record = json.loads((ROOT / "benchmarks" / "out" / "hf_coins.json").read_text())
    page = (ROOT / "docs" / "results" / "engine-coins.md").read_text()
    assert tables(record) in page, "run: python benchmarks/hf_coins.py --table benchmarks/out/hf_coins.json"
    assert [r["release"] for r in record["releases"]] == list(RELEASES)
    changed = json.loads(json.dumps(record))
    changed["releases"][-1]["cases"][0]["status"] = "boundary"
    assert tables(changed) not in page
