"""Sharded statistical checks: the same verdict and numbers on 1 or many workers, any
shard size, any completion order; a real Dask LocalCluster, a killed worker, a resumed sweep.

N is small (5,000 samples per case: 5 blocks of 1024) because these tests compare runs
with each other, exactly, not with a planned power; the G-test's verdicts at that N
are checked only for agreement between runs and for the classic bug (exact TV 0.0875
on the worked example: at N = 5,000 its G statistic rejects at alpha = 1e-6).
"""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

from specref.adapters.cluster import dask_executor, local_pool
from specref.core.errors import SpecrefError
from specref.verification.oracle import check_step, default_cases
from specref.verification.statistics.shards import BLOCK, Tally, block_rng, tally
from specref.verification.campaigns.sweep import cells, load_sweep, run_sweep, sweep_table
from tests.implementations import (
    ReversedExecutor,
    raises_on_token_two,
    reference_with_seed,
    resample_from_p_with_seed,
)

CASES = [c for c in default_cases("step") if c.name in ("worked-example-rows", "zeros-in-p")]
N = 5000


def numbers(report):
    return [(r.case.name, r.status, r.n_samples, r.p_value, None if r.tv is None else float(r.tv), r.tv_interval, r.detail)
            for r in report.results]


@pytest.fixture(scope="module")
def single():
    return numbers(check_step(resample_from_p_with_seed, mode="statistical", cases=CASES, samples=N, seed=7))


def test_block_seeds_are_seed_sequence_children():
    children = np.random.SeedSequence(7).spawn(4)
    for j, child in enumerate(children):
        assert block_rng(7, j).random() == np.random.Generator(np.random.PCG64(child)).random()


def test_the_classic_bug_is_caught_at_this_n(single):
    worked = single[0]
    assert worked[1] == "differs" and worked[3] < 1e-6


@pytest.mark.parametrize("workers, shard_blocks", [(1, 1), (2, 2), (2, 32)])
def test_same_numbers_for_any_worker_count_and_shard_size(single, workers, shard_blocks):
    with local_pool(workers) as pool:
        got = check_step(resample_from_p_with_seed, mode="statistical", cases=CASES, samples=N, seed=7,
                         executor=pool, shard_blocks=shard_blocks)
    assert numbers(got) == single


def test_shards_finishing_out_of_order_merge_exactly(single):
    order = []
    got = check_step(resample_from_p_with_seed, mode="statistical", cases=CASES[:1], samples=N, seed=7,
                     executor=ReversedExecutor(), shard_blocks=1)
    assert numbers(got) == single[:1]
    # and the reversal really happened: tally's progress sees the short last block first
    tally(_recipe(), _outcomes(), N, 7, executor=ReversedExecutor(), shard_blocks=1, progress=order.append)
    assert order[0] == N - 4 * BLOCK and sorted(order) == sorted([BLOCK] * 4 + [N - 4 * BLOCK])


def _recipe():
    from functools import partial

    from specref.verification.levels.chain.programs import _program_of

    return partial(_program_of, "step", reference_with_seed, CASES[0].as_float(), 10.0)


def _outcomes():
    from specref.verification.laws.enumeration import target_law

    t, _ = CASES[0].models()
    return sorted(target_law(t, list(CASES[0].prompt), CASES[0].config, CASES[0].k + 1))


def test_shards_return_counts_not_samples():
    small, large = (tally(_recipe(), _outcomes(), n, 1) for n in (100, 5000))
    assert small.counts.shape == large.counts.shape == (len(_outcomes()) + 1,)
    assert small.samples == 100 and large.samples == 5000 and large.counts.sum() == 5000


def test_a_finished_shard_is_not_run_again():
    store = {}
    whole = tally(_recipe(), _outcomes(), N, 3, shard_blocks=2, store=store)
    assert len(store) == 3
    dropped = sorted(store)[1]
    del store[dropped]
    runs = []
    again = tally(_recipe(), _outcomes(), N, 3, shard_blocks=2, store=store, progress=runs.append)
    assert runs == [2 * BLOCK]  # only the dropped shard ran
    assert np.array_equal(again.counts, whole.counts) and Tally.from_json(store[dropped]).samples == 2 * BLOCK


def test_workers_forked_during_one_case_do_not_inherit_its_time_budget():
    from specref.verification.running.calling import case_budget

    with local_pool(1) as pool:
        with case_budget(0.2):  # the pool's worker is forked here, inside a case with 0.2 s left
            assert pool.submit(abs, -1).result() == 1
        time.sleep(0.5)
        later = check_step(reference_with_seed, mode="statistical", cases=CASES[:1], samples=N, seed=2,
                           executor=pool)
    assert later.results[0].status == "ok", later.results[0].detail


def test_a_worker_that_raises_gets_the_local_status():
    local = check_step(raises_on_token_two, mode="statistical", cases=CASES[:1], samples=N, seed=2)
    with local_pool(2) as pool:
        pooled = check_step(raises_on_token_two, mode="statistical", cases=CASES[:1], samples=N, seed=2,
                            executor=pool, shard_blocks=1)
    assert local.results[0].status == "raised" and numbers(pooled) == numbers(local)


def test_an_implementation_that_cannot_travel_is_a_clear_error():
    with local_pool(1) as pool, pytest.raises(SpecrefError, match="cannot send the implementation"):
        check_step(lambda p, q, x, seed: reference_with_seed(p, q, x, seed), mode="statistical",
                   cases=CASES[:1], samples=N, executor=pool)


def test_bad_executor_arguments_are_named():
    with pytest.raises(SpecrefError, match="executor"):
        check_step(reference_with_seed, mode="statistical", cases=CASES[:1], samples=N, executor=object())
    with pytest.raises(SpecrefError, match="shard_blocks"):
        check_step(reference_with_seed, mode="statistical", cases=CASES[:1], samples=N, shard_blocks=0)
    with pytest.raises(SpecrefError, match="workers"):
        with local_pool(0):
            pass


def test_an_unreachable_scheduler_is_a_clear_error_in_time():
    t0 = time.perf_counter()
    with pytest.raises(SpecrefError, match="cannot reach the Dask scheduler"):
        with dask_executor("tcp://127.0.0.1:9", timeout=2):
            pass
    assert time.perf_counter() - t0 < 10


SWEEP = {
    "impl": "tests.implementations:slow_reference_with_seed",
    "level": "step",
    "settings": {"mode": "statistical", "samples": 2 * BLOCK, "shard_blocks": 1},
    "grid": {"case": ["worked-example-rows"], "seed": [0, 1]},
}


@pytest.fixture(scope="module")
def cluster_executor():
    with dask_executor(workers=2) as executor:
        yield executor


def test_dask_local_cluster_gives_the_single_process_numbers(cluster_executor, single):
    got = check_step(resample_from_p_with_seed, mode="statistical", cases=CASES, samples=N, seed=7,
                     executor=cluster_executor, shard_blocks=1)
    assert numbers(got) == single


def test_a_killed_worker_mid_sweep_changes_nothing(cluster_executor, tmp_path):
    alone = run_sweep(SWEEP, progress=False)
    client = cluster_executor._client
    pids = client.run(os.getpid)  # {worker address: pid}
    done = []
    sweeper = threading.Thread(target=lambda: done.append(run_sweep(SWEEP, out=tmp_path / "s.json",
                                                                    executor=cluster_executor, progress=False)))
    sweeper.start()
    deadline = time.time() + 60
    while not (tmp_path / "s.json").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert sweeper.is_alive(), "the sweep finished before a worker could be killed"
    os.kill(next(iter(pids.values())), signal.SIGKILL)  # one worker dies while shards are in flight
    sweeper.join(timeout=120)
    deadline = time.time() + 30
    while len(client.scheduler_info()["workers"]) < 2 and time.time() < deadline:
        time.sleep(0.1)  # the nanny restarts the killed worker
    assert set(client.run(os.getpid).values()) != set(pids.values())
    assert done, "the sweep did not finish after a worker was killed"
    results = lambda rec: {k: v["result"] for k, v in rec["cells"].items()}  # noqa: E731
    assert results(done[0]) == results(alone) and len(results(alone)) == 2
    assert all(r["status"] == "ok" and r["n_samples"] == 2 * BLOCK for r in results(alone).values())


def test_an_interrupted_sweep_resumes_from_its_json(tmp_path):
    path = tmp_path / "sweep.json"
    (tmp_path / "sweep.toml").write_text(
        'impl = "tests.implementations:reference_with_seed"\nlevel = "step"\n'
        '[settings]\nmode = "statistical"\nsamples = 3072\nshard_blocks = 1\n'
        '[grid]\ncase = ["worked-example-rows", "p-equals-q"]\nseed = [0, 1]\n')
    spec = load_sweep(tmp_path / "sweep.toml")
    assert len(cells(spec)) == 4
    full = run_sweep(spec, out=path, progress=False)
    record = json.loads(path.read_text())
    first = next(iter(record["cells"]))
    record["cells"][first]["result"] = None  # as if interrupted after two of its three shards
    shard = sorted(record["cells"][first]["shards"])[0]
    del record["cells"][first]["shards"][shard]
    path.write_text(json.dumps(record))
    ran = []
    resumed = run_sweep(spec, out=path, progress=False, on_cell=ran.append)
    assert len(ran) == 1 and resumed["cells"] == full["cells"]
    table = sweep_table(resumed)
    assert table.count("\n") == 4 and "worked-example-rows" in table


@pytest.mark.parametrize("bad, word", [
    ({"impl": "nocolon"}, "module:function"),
    ({"impl": "a:b", "level": "nope"}, "level"),
    ({"impl": "a:b", "grid": {"temperature": [1]}}, "unknown field"),
    ({"impl": "a:b", "grid": {"seed": []}}, "non-empty"),
    ({"impl": "a:b", "settings": {"samples": 0}}, "samples"),
])
def test_bad_sweeps_are_named(bad, word):
    from specref.verification.campaigns.sweep import validate

    with pytest.raises(SpecrefError, match=word):
        validate(bad)


def run_cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "specref.verify", "--no-progress", *args], capture_output=True,
                          text=True, timeout=300)


def test_the_matrix_on_two_workers_gives_the_same_rows(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    runs = [run_cli("--scenario", "table2-V3", "--json", str(one)),
            run_cli("--scenario", "table2-V3", "--workers", "2", "--json", str(two))]
    assert all(r.returncode == 0 for r in runs), runs[1].stderr
    rows = [[(s["name"], s["status"], s["tv"], s["tv_exact"]) for s in json.loads(p.read_text())["scenarios"]]
            for p in (one, two)]
    assert rows[0] == rows[1] and len(rows[0]) >= 5


def test_cli_sweep_and_unreachable_scheduler(tmp_path):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({**SWEEP, "impl": "tests.implementations:resample_from_p_with_seed",
                                 "settings": {"mode": "statistical", "samples": 2 * BLOCK}}))
    run = run_cli("--sweep", str(sweep), "--out", str(tmp_path / "out.json"), "--workers", "2")
    assert run.returncode == 1 and "differs" in run.stdout  # the classic bug, in every cell
    assert all(not c["result"]["ok"] for c in json.loads((tmp_path / "out.json").read_text())["cells"].values())
    t0 = time.perf_counter()
    bad = run_cli("--sweep", str(sweep), "--scheduler", "tcp://127.0.0.1:9")
    assert bad.returncode == 2 and "cannot reach the Dask scheduler" in bad.stderr
    assert time.perf_counter() - t0 < 60


def test_the_tree_level_shards_the_same_way():
    from specref.core.tree_verify import pointmass_verify
    from specref.verification.levels.trees.sampled import tree_cases
    from specref.verification.oracle import check_tree

    cases = tree_cases("topk")[:2]
    alone = check_tree(pointmass_verify, cases=cases, mode="statistical", samples=3000, seed=4)
    with local_pool(2) as pool:
        pooled = check_tree(pointmass_verify, cases=cases, mode="statistical", samples=3000, seed=4,
                            executor=pool, shard_blocks=1)
    assert numbers(pooled) == numbers(alone) and all(r.status == "ok" for r in alone.results)
