"""The batched levels in shards: the same verdict and numbers with no executor, a process
pool of 1 or 2 workers, any shard size and any completion order; a worker that raises or
runs over its case's budget gets the local status; the CLI's --workers and --scheduler.

N is 5,000 batch draws per case (5 blocks of 1024; the last one short) because these
tests compare runs with each other, exactly, not with a planned power.  The one verdict
checked against the truth is the engine zoo's ``coin_reused`` bug on a V = 6 case: at
N = 5,000 its most significant statistic has adjusted p about 1e-134, far below
alpha = 1e-6, so "differs" is not luck; the correct engine's verdict is only compared
between runs.  Only the oracle's own timings (the detail's last clause) may differ.
"""

import concurrent.futures as cf
import json
import re
import subprocess
import sys
import time
from functools import partial

import numpy as np
import pytest

from specref.adapters.cluster import dask_executor, local_pool
from specref.verification.zoo import engines as zoo_engines
from specref.verification.levels.batched.steps import BatchedCase, _count_blocks, _Recipe, statistics_nulls
from specref.verification.oracle import check
from specref.verification.statistics.shards import BLOCK, block_rng, tally
from tests.implementations import ReversedExecutor

N = 5000
SEED = 7
_rng = np.random.default_rng(5)
P, Q = _rng.dirichlet(np.ones(6), size=(2, 3)), _rng.dirichlet(np.ones(6), size=(2, 2))  # [B=2, K+1=3, V=6], [2, 2, 6]
V6 = BatchedCase("V6", P, Q)
RAGGED = BatchedCase("V6-point-mass-ragged", P, None, proposal=Q, num_draft=(2, 1))
RUNS = [  # (level, implementation, cases)
    ("batched", zoo_engines.engine_reference_batched, [V6, RAGGED]),
    ("draft_and_verify", zoo_engines.coin_reused, [V6]),
]
_TIMING = re.compile(r"; oracle overhead [\d.]+ s, implementation [\d.]+ s$")


def numbers(report):
    """Every field of every result; the detail without its measured timings (which must be there)."""
    out = []
    for r in report.results:
        assert _TIMING.search(r.detail or ""), r.detail
        out.append((r.case.name, r.status, r.n_samples, r.p_value, None if r.tv is None else float(r.tv),
                    r.tv_interval, _TIMING.sub("", r.detail)))
    return out


def run_all(**settings):
    return [numbers(check(level, fn, cases=cases, mode="statistical", samples=N, seed=SEED, **settings))
            for level, fn, cases in RUNS]


@pytest.fixture(scope="module")
def single():
    return run_all()


def test_the_correct_engine_passes_and_the_zoo_bug_differs(single):
    (ok_a, ok_b), (bug,) = single
    assert ok_a[1] == ok_b[1] == "ok" and ok_a[2] == ok_b[2] == N
    assert bug[1] == "differs" and bug[3] < 1e-6
    assert "5 calls of up to 2048 rows" in ok_a[6]  # one call per block: 4 full, 1 of 904 copies


def test_same_numbers_for_another_shard_size_here(single):
    assert run_all(shard_blocks=1) == single


class Counted(cf.Executor):
    """An executor that counts the shards sent through it."""

    def __init__(self, inner):
        self.inner, self.count = inner, 0

    def submit(self, fn, *args, **kwargs):
        self.count += 1
        return self.inner.submit(fn, *args, **kwargs)


@pytest.mark.parametrize("workers, shard_blocks, shards", [(1, 1, 5), (2, 4, 2)])
def test_same_numbers_on_a_process_pool(single, workers, shard_blocks, shards):
    with local_pool(workers) as pool:
        counted = Counted(pool)
        assert run_all(executor=counted, shard_blocks=shard_blocks) == single
    assert counted.count == 3 * shards  # three cases, each in shards on the pool


def _tally_of(case, level, fn, shard_blocks, executor=None, progress=None):
    stats = statistics_nulls(case, level, salt=SEED)
    outcomes = [(j, c) for j, s in enumerate(stats) for c in range(len(s.null))]
    recipe = _Recipe(level, fn, case, 10.0, SEED, BLOCK)
    return tally(recipe, outcomes, N, SEED, executor=executor, shard_blocks=shard_blocks, progress=progress,
                 run_blocks=_count_blocks)


def test_shards_finishing_out_of_order_merge_exactly(single):
    reversed_ = ReversedExecutor()
    got = [numbers(check(level, fn, cases=cases, mode="statistical", samples=N, seed=SEED,
                         executor=reversed_, shard_blocks=1)) for level, fn, cases in RUNS]
    assert got == single and reversed_.count == 3 * 5
    # the counts themselves, and the reversal really happened: the short last block is seen first
    order = []
    whole = _tally_of(V6, "batched", zoo_engines.engine_reference_batched, 8)
    parts = _tally_of(V6, "batched", zoo_engines.engine_reference_batched, 1, ReversedExecutor(), order.append)
    assert order == [N - 4 * BLOCK] + [BLOCK] * 4
    assert np.array_equal(parts.counts, whole.counts) and parts.samples == whole.samples == N
    assert whole.counts[-1] == 0 and whole.counts.sum() > N  # every statistic counted, none out of range


def raises_on_seeds(seeds, p_target, q_draft, draft_tokens, seed):
    """The correct engine, except that it raises on the calls whose seed is in ``seeds``."""
    if seed in seeds:
        raise RuntimeError(f"call seed {seed}")
    return zoo_engines.engine_reference_batched(p_target, q_draft, draft_tokens, seed)


def test_a_worker_that_raises_gets_the_local_status():
    # one call per block (1024 copies of 2 rows); the calls of blocks 2 and 4 raise: block 2's is reported
    seeds = [int(block_rng(SEED, j).integers(2**63)) for j in range(5)]
    fn = partial(raises_on_seeds, frozenset({seeds[2], seeds[4]}))
    runs = [check("batched", fn, cases=[V6], mode="statistical", samples=N, seed=SEED, **kw)
            for kw in ({}, {"executor": ReversedExecutor(), "shard_blocks": 1})]
    with local_pool(2) as pool:
        runs.append(check("batched", fn, cases=[V6], mode="statistical", samples=N, seed=SEED, executor=pool,
                          shard_blocks=1))
    results = [(r.results[0].status, r.results[0].detail) for r in runs]
    assert results[0][0] == "raised" and results[0][1].startswith(f"RuntimeError: call seed {seeds[2]} (at ")
    assert results == [results[0]] * 3


def slow_engine(p_target, q_draft, draft_tokens, seed):
    time.sleep(0.3)
    return zoo_engines.engine_reference_batched(p_target, q_draft, draft_tokens, seed)


def test_a_case_over_its_budget_times_out_here_and_on_a_pool():
    """Five calls of 0.3 s against a 0.5 s case budget: in-process shards keep the budget too."""
    kw = dict(cases=[V6], mode="statistical", samples=N, seed=SEED, case_time_limit=0.5, shard_blocks=1)
    here = check("batched", slow_engine, isolate=False, **kw)
    with local_pool(2) as pool:
        pooled = check("batched", slow_engine, executor=pool, **kw)
    assert here.results[0].status == pooled.results[0].status == "timeout", (here, pooled)
    assert "case_time_limit" in here.results[0].detail and "case_time_limit" in pooled.results[0].detail


CALLS = []


def counted_engine(p_target, q_draft, draft_tokens, seed):
    CALLS.append(seed)
    return zoo_engines.engine_reference_batched(p_target, q_draft, draft_tokens, seed)


def test_an_interrupted_batched_sweep_resumes_from_its_shards(tmp_path):
    from specref.verification.campaigns.sweep import run_sweep

    spec = {"impl": "tests.test_batched_shards:counted_engine", "level": "batched",
            "settings": {"mode": "statistical", "samples": 3 * BLOCK, "shard_blocks": 1, "isolate": False},
            "grid": {"case": ["two-rows"], "seed": [0]}}
    path = tmp_path / "sweep.json"
    full = run_sweep(spec, out=path, progress=False)
    record = json.loads(path.read_text())
    (cell,) = record["cells"].values()
    assert len(cell["shards"]) == 3 and cell["result"]["status"] == "ok"
    cell["result"] = None  # as if interrupted after two of its three shards
    dropped = sorted(cell["shards"])[1]
    del cell["shards"][dropped]
    path.write_text(json.dumps(record))
    CALLS.clear()
    resumed = run_sweep(spec, out=path, progress=False)
    assert len(CALLS) == 1  # one call per block of 1024 copies: only the dropped shard ran again
    (a,), (b,) = full["cells"].values(), resumed["cells"].values()
    assert a["shards"] == b["shards"] and sorted(b["shards"]) == sorted(a["shards"])
    assert {k: _TIMING.sub("", v) if k == "detail" else v for k, v in a["result"].items()} == \
        {k: _TIMING.sub("", v) if k == "detail" else v for k, v in b["result"].items()}


# ---------------------------------------------------------------- the CLI, and a Dask cluster


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "specref.verify", "--no-progress", "--impl",
                           "specref.verification.zoo.engines:engine_reference_batched", "--level", "batched",
                           "--mode", "statistical", "--samples", "3000", *args],
                          capture_output=True, text=True, timeout=300)


def cli_results(path):
    rows = json.loads(path.read_text())["results"]
    return [{k: (_TIMING.sub("", v) if k == "detail" else v) for k, v in r.items()} for r in rows]


@pytest.fixture(scope="module")
def cli_alone(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "alone.json"
    run = run_cli("--json", str(path))
    assert run.returncode == 0, run.stdout + run.stderr
    return cli_results(path)


def test_cli_workers_give_the_single_process_results(cli_alone, tmp_path):
    run = run_cli("--workers", "2", "--json", str(tmp_path / "two.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert cli_results(tmp_path / "two.json") == cli_alone and len(cli_alone) >= 5


def test_dask_cluster_and_cli_scheduler_give_the_single_process_numbers(single, cli_alone, tmp_path):
    with dask_executor(workers=2) as executor:
        assert run_all(executor=executor, shard_blocks=2) == single
        address = executor._client.scheduler.address
        run = run_cli("--scheduler", address, "--json", str(tmp_path / "dask.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert cli_results(tmp_path / "dask.json") == cli_alone
