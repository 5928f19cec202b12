"""Mutation testing of the engines' verifier code (``specref.adapters.mutants``): the oracle has teeth on real kernels.

A fast subset of ``benchmarks/engine_mutants.py`` (which runs every mutant): per engine path
one mutant the oracle flags, and the unmutated code passing at the same case, N and seed; a
configuration-dependent mutant (flagged with vLLM's global generator, equivalent with
per-request generators); the patch refused when it does not apply; the proof that the patched
line is the code that ran, and a patched line that never runs reported as not run.  The
results page must hold exactly the tables the committed record prints.

The engine tests need the pinned wheels (``python scripts/fetch_engines.py``) and are skipped
without them; all tests of this module take 30-45 s on 2 cores (about 80 s while other jobs
load them).  N is chosen per mutant so that it is visible: see each mutant's ``why``.
"""

import importlib.util
import json
import tempfile
from pathlib import Path

import pytest

from specref.core.errors import SpecrefError

re_ = pytest.importorskip("specref.adapters.real_engines")
pytest.importorskip("torch")
mu = pytest.importorskip("specref.adapters.mutants")

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "out" / "engine_mutants.json"
PAGE = ROOT / "docs" / "results" / "engine-mutants.md"
MISSING = re_.missing()
needs_wheels = pytest.mark.skipif(bool(MISSING), reason=f"engine wheels not in the cache {re_.wheels_dir()} "
                                                         f"({', '.join(MISSING)}): run `python scripts/fetch_engines.py`")


def benchmark():
    spec = importlib.util.spec_from_file_location("engine_mutants", ROOT / "benchmarks" / "engine_mutants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def show(o):
    print(f"\n{o.engine} {o.version} {o.mutant}: {o.mode} on {o.case}, N = {o.n}, seed {o.seed}: {o.status}, "
          f"TV {o.tv}, p {o.p_value}, detectable TV {o.detectable_tv}, line ran: {o.line_ran}, {o.seconds} s")
    return o


# ---------------------------------------------------------------- one mutant per engine path is flagged

FAST = [  # (engine, mutant, N per row): each visible at this N (its why says why)
    ("vllm-v1-cpp", "target-passed-as-draft", 4000),
    ("vllm-v1-triton", "cu-num-draft-tokens-read-as-exclusive", 60),
    ("mrv2", "token-0-taken-for-the-placeholder", 60),
    ("sglang-chain", "q-missing-from-the-ratio", 100),
    ("sglang-greedy-tree", "bonus-from-the-root-row", None),  # exact mode: the tree level on one-hot targets
]


@needs_wheels
@pytest.mark.parametrize("engine,name,n", FAST, ids=[f"{e}:{m}" for e, m, _ in FAST])
def test_a_mutant_of_each_engine_path_is_flagged_and_the_unmutated_code_passes(engine, name, n):
    (m,) = mu.mutants(engine, name)
    bad = show(mu.run(m, n=n))
    good = show(mu.run(engine, mode=bad.mode, case=m.case, n=n, seed=bad.seed, options=m.options))
    assert bad.flagged and bad.as_expected, bad
    assert bad.line_ran and bad.loaded["from_copy"] and bad.loaded["holds_marker"], bad.loaded
    assert bad.tv is None or bad.tv > 0
    assert good.status == "ok" and good.mutant == "unmutated", good
    assert (good.case, good.n, good.seed, good.mode) == (bad.case, bad.n, bad.seed, bad.mode)


@needs_wheels
def test_one_patch_flagged_with_the_global_generator_is_equivalent_with_per_request_generators():
    """``q.exponential_()`` made ``q.uniform_()`` in vLLM V1's recovered-token race: with the global
    generator the uniform noise is what the race reads (flagged); with a generator per request
    each row is redrawn exponential before it is read, so the draws are the engine's, bit for bit
    (the same TV and p-value as the unmutated code at the same seed)."""
    (flagged,) = mu.mutants("vllm-v1-cpp", "race-noise-uniform-global-generator")
    (same,) = mu.mutants("vllm-v1-cpp", "race-noise-uniform-per-request-generators")
    assert (flagged.line_text_before, flagged.line_text_after) == (same.line_text_before, same.line_text_after)
    a, b = show(mu.run(flagged)), show(mu.run(same))
    clean = show(mu.run("vllm-v1-cpp", case=same.case, n=b.n, seed=b.seed))
    assert a.flagged and a.line_ran and a.as_expected
    assert not b.flagged and b.line_ran and b.as_expected
    assert (b.tv, b.p_value) == (clean.tv, clean.p_value)


# ---------------------------------------------------------------- the patch, and the proof that it ran


def _fake_cache(tmp_path, text):
    """A wheel cache whose sglang tree holds only reject_sampling.py with ``text``."""
    for dist, version in re_.PINNED.items():
        (tmp_path / f"{dist}-{version}").mkdir()
        (tmp_path / f"{dist}-{version}" / ".specref-complete").write_text("fake\n")
    path = tmp_path / "sglang-0.5.23" / mu._CHAIN
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


FAKE = """def kernel(p, q, coin):
    q_is_prob = q > 0
    if q_is_prob & (coin * q < p):
        val = tl.where(diff > 0.0, diff, 0.0)
    # Pass 2
    if q_is_prob:
        val = tl.where(diff > 0.0, diff, 0.0)
    return val
"""


def test_a_patch_that_does_not_apply_names_the_file_the_text_expected_and_what_was_found(tmp_path):
    path = _fake_cache(tmp_path, FAKE)
    before = path.read_text()

    def refused(pattern, named=True, **fields):
        m = mu.Mutant(**{"engine": "sglang-chain", "file": mu._CHAIN, "line_text_after": "x = 1", "name": "demo",
                         "why": "a test", **fields})
        with pytest.raises(SpecrefError, match=pattern) as e:
            with mu.mutate(m, cache=tmp_path):
                pass
        assert (str(path) in str(e.value)) == named
        return str(e.value)

    text = refused(r"expected a line reading 'if q_is_prob & \(coin \* q < p\)', found none",
                   line_text_before="if q_is_prob & (coin * q < p)")  # the colon missing
    assert "closest: line 3: 'if q_is_prob & (coin * q < p):'" in text
    text = refused("found it 2 times", line_text_before="val = tl.where(diff > 0.0, diff, 0.0)")
    assert "line 4: 'val = tl.where(diff > 0.0, diff, 0.0)'; line 7:" in text and "within=" in text
    refused(r"expected one function `def other`, found 0", line_text_before="q_is_prob = q > 0", within="other")
    refused(r"expected one line containing '# Pass 3'.*found 0", line_text_before="val = tl.where(diff > 0.0, diff, 0.0)",
            after="# Pass 3")
    refused("does not compile", line_text_before="if q_is_prob & (coin * q < p):", line_text_after="if q_is_prob & (")
    refused("one non-empty line changed into another", named=False, line_text_before="q_is_prob = q > 0",
            line_text_after="q_is_prob = q > 0")
    assert path.read_text() == before  # nothing written
    assert not list(Path(tempfile.gettempdir()).glob("specref-mutant-demo-*"))  # no mirror made
    # the anchor picks the second one; the patched copy differs from the file in that line only
    m = mu.Mutant("sglang-chain", mu._CHAIN, "val = tl.where(diff > 0.0, diff, 0.0)", "val = diff", "pass-2", "a test",
                  after="# Pass 2")
    assert mu.locate(m, cache=tmp_path) == (7, f"        val = diff  {mu.MARKER} pass-2")


@needs_wheels
def test_every_mutant_applies_to_exactly_one_line_of_its_pinned_file():
    for m in mu.MUTANTS:
        lineno, line = mu.locate(m)
        assert line.strip() == f"{m.line_text_after}  {mu.MARKER} {m.name}", m.name
    for engine in mu.ENGINES:
        assert sum(m.expect == "flagged" for m in mu.mutants(engine)) >= 3, engine


@needs_wheels
def test_the_patched_line_is_the_code_that_ran():
    import numpy as np

    (m,) = mu.mutants("sglang-chain", "q-missing-from-the-ratio")
    real = re_.wheels_dir() / "sglang-0.5.23" / m.file
    original = real.read_text()
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(4), size=(5, 3)).astype(np.float32)
    q = rng.dirichlet(np.ones(4), size=(5, 2)).astype(np.float32)
    x = rng.integers(4, size=(5, 2))
    with mu.mutate(m) as tree:
        assert tree.path.is_file() and not tree.path.is_symlink()
        assert all(s.is_symlink() for s in tree.path.parent.iterdir() if s != tree.path)
        copy = tree.path.read_text().splitlines()
        diff = [i + 1 for i, (a, b) in enumerate(zip(original.splitlines(), copy)) if a != b]
        assert diff == [tree.lineno] and copy[tree.lineno - 1] == tree.line
        fn = tree.engine()
        with tree.probe(count=True) as probe:
            fn(p, q, x, 11)
        loaded = tree.loaded_line(fn)
        print(f"\n{m.name}: line {tree.lineno} ran {probe.hits} times; {loaded}")
        assert probe.hits >= 5  # at least once per request (one program per request)
        assert loaded["from_copy"] and loaded["holds_marker"]
        assert loaded["holder"] == "speculative_sampling_classic_kernel (InterpretedFunction)"
        with tree.probe() as first:  # the default stops at the first execution
            fn(p, q, x, 11)
        assert first.hits == 1
        mirror = tree.cache
    assert not mirror.exists() and real.read_text() == original
    (m,) = mu.mutants("vllm-v1-cpp", "softmax-over-the-batch-axis")  # a Python line that calls the C++ kernels
    with mu.mutate(m) as tree:
        fn = tree.engine()
        loaded = tree.loaded_line(fn)
        assert loaded["holder"] == "rejection_sample" and loaded["from_copy"] and loaded["holds_marker"]


@needs_wheels
def test_a_patched_line_that_never_runs_is_reported_as_not_run():
    """A line of the block-verification branch of SGLang's chain kernel, which the adapter never
    takes (block_verification=False): loaded from the copy, marker in the kernel's source, never
    executed -- so the check passes and the outcome says the patch proves nothing."""
    m = mu.Mutant("sglang-chain", mu._CHAIN, "prefix_prob = tl.where(q_is_prob, tl.minimum(prefix_prob * p / q, 1.0), 0.0)",
                  "prefix_prob = tl.where(q_is_prob, tl.minimum(p / q, 1.0), 0.0)", "block-branch-only",
                  "runs only with block_verification=True")
    o = show(mu.run(m, n=20))
    assert o.line_ran == 0 and not o.as_expected
    assert o.loaded["from_copy"] and o.loaded["holds_marker"]
    assert o.status == "ok"


# ---------------------------------------------------------------- the record and the results page


def test_the_results_page_holds_exactly_the_tables_of_the_committed_record():
    tables = benchmark().tables
    record = json.loads(RECORD.read_text())
    page = PAGE.read_text()
    assert tables(record) in page, "run: python benchmarks/engine_mutants.py --table benchmarks/out/engine_mutants.json"
    changed = json.loads(RECORD.read_text())
    changed["rows"][3]["tv"] = (changed["rows"][3]["tv"] or 0) + 0.01
    assert tables(changed) not in page  # the check can fail


def test_the_committed_record_has_every_mutant_as_expected():
    record = json.loads(RECORD.read_text())
    assert record["all_as_expected"]
    assert [(m["engine"], m["name"]) for m in record["mutants"]] == [(m.engine, m.name) for m in mu.MUTANTS]
    rows = record["rows"]
    clean = {(r["engine"], r["mode"], r["case"], r["n"], r["seed"], json.dumps(r["options"])): r
             for r in rows if r["mutant"] == "unmutated"}
    assert all(r["status"] == "ok" for r in clean.values())
    for r in rows:
        if r["mutant"] != "unmutated":
            assert r["as_expected"] and r["line_ran"], r["mutant"]
            assert (r["engine"], r["mode"], r["case"], r["n"], r["seed"], json.dumps(r["options"])) in clean, r["mutant"]
    for engine in mu.ENGINES:
        caught = {r["mutant"] for r in rows if r["engine"] == engine and r["expect"] == "flagged" and r["status"] != "ok"}
        assert len(caught) >= 3, engine


def test_the_engines_page_holds_the_committed_budget_table():
    import json
    import subprocess
    import sys as _sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    record = root / "benchmarks" / "out" / "bench_engines.json"
    table = subprocess.run([_sys.executable, str(root / "benchmarks" / "bench_engines.py"), "--table", str(record)],
                           capture_output=True, text=True, check=True).stdout.strip()
    page = (root / "docs" / "results" / "engines.md").read_text()
    assert table in page
    changed = json.loads(record.read_text())
    changed["rows"][0]["n"] += 1
    _sys.path.insert(0, str(root / "benchmarks"))
    from bench_engines import table as render

    assert render(changed) not in page  # the check can fail
    assert all(r["status"] == "ok" for r in json.loads(record.read_text())["rows"])
