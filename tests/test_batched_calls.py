"""Calls in batches at the step, logits and decoder levels (``declare_batch``).

The reference, called once per sample and once per ``n`` samples, must give the same counts for
the same seed: sample ``i`` of block ``j`` gets the same seed and the same coins either way
(:mod:`specref.verification.levels.chain.programs`).  N is small (3,000: three blocks) because runs are
compared with each other, exactly.
"""

import numpy as np
import pytest

from specref.adapters.cluster import local_pool
from specref.core.draws import coerce_rng
from specref.core.errors import SpecrefError
from specref.core.sampling import process
from specref.core.step import speculative_step
from specref.decoding.chain import speculative_decode
from specref.verification.cases.rules import declare_rules
from specref.verification.levels.chain.programs import BatchForm, batch_of, declare_batch
from specref.verification.oracle import check_decoder, check_logits_step, check_step, default_cases
from specref.verification.statistics.shards import BLOCK
from tests.implementations import resample_from_p

N = 3000


# ---------------------------------------------------------------- implementations (module level: they travel)


def step_one(p, q, x, seed):
    return speculative_step(p, q, x, coerce_rng(seed))


def step_many(P, Q, X, seeds):
    return [speculative_step(P[i], Q[i], X[i], coerce_rng(seeds[i])) for i in range(len(seeds))]


def step_padded(P, Q, X, seeds):  # an [n, K+1] array padded with -1, as the batched level returns
    out = np.full((len(seeds), X.shape[1] + 1), -1)
    for i, tokens in enumerate(step_many(P, Q, X, seeds)):
        out[i, :len(tokens)] = tokens
    return out


def logits_one(t, d, x, config, seed):
    return speculative_step(process(t, config), process(d, config), x, coerce_rng(seed))


def logits_many(T, D, X, config, seeds):
    return [logits_one(T[i], D[i], X[i], config, seeds[i]) for i in range(len(seeds))]


def decode_one(target, draft, prompt, *, rng, **kw):
    return speculative_decode(target, draft, list(prompt), rng=coerce_rng(rng), **kw).tokens


def decode_many(target, draft, prompts, *, rng, **kw):
    return [decode_one(target, draft, p, rng=r, **kw) for p, r in zip(prompts.tolist(), rng)]


def resample_many(P, Q, X, seeds):  # SPEC §7.1, batched
    return [resample_from_p(P[i], Q[i], X[i], np.random.default_rng(int(seeds[i]))) for i in range(len(seeds))]


def numbers(report):
    return [(r.case.name, r.status, r.n_samples, r.p_value, None if r.tv is None else float(r.tv), r.detail)
            for r in report.results]


LEVELS = {
    "step": (check_step, step_one, step_many),
    "logits": (check_logits_step, logits_one, logits_many),
    "decoder": (check_decoder, decode_one, decode_many),
}


def cases(level):
    return default_cases(level, drawn=0)[:1 if level == "decoder" else 2]


# ---------------------------------------------------------------- the same counts


@pytest.mark.parametrize("level", LEVELS)
def test_batches_of_any_size_give_the_one_call_counts(level):
    check, one, many = LEVELS[level]
    alone = numbers(check(one, mode="statistical", cases=cases(level), samples=N, seed=3, progress=False))
    assert all(row[1] == "ok" for row in alone), alone
    for size in (1, 7, 256, 2 * BLOCK):  # 2 * BLOCK: cut to one block per call
        got = check(declare_batch(many, size), mode="statistical", cases=cases(level), samples=N, seed=3,
                    progress=False)
        assert numbers(got) == alone, size


def test_batches_on_a_pool_give_the_same_counts():
    alone = numbers(check_step(step_one, mode="statistical", cases=cases("step"), samples=N, seed=5, progress=False))
    with local_pool(2) as pool:
        pooled = check_step(declare_batch(step_many, 100), mode="statistical", cases=cases("step"), samples=N,
                            seed=5, executor=pool, shard_blocks=1, progress=False)
    assert numbers(pooled) == alone


def test_one_call_per_batch():
    calls = []

    def counted(P, Q, X, seeds):
        calls.append(len(seeds))
        return step_many(P, Q, X, seeds)

    check_step(declare_batch(counted, 256), mode="statistical", cases=cases("step")[:1], samples=N, progress=False,
               isolate=False)  # in this process: the calls are recorded here
    # 3,000 samples: blocks of 1024, 1024 and 952, each cut into calls of 256
    assert calls == [256] * 4 + [256] * 4 + [256] * 3 + [952 - 3 * 256]


def test_the_attribute_form_and_a_padded_array():
    def attributed(P, Q, X, seeds):
        return step_padded(P, Q, X, seeds)

    attributed.specref_batch = 64
    assert batch_of(attributed) == BatchForm(64)
    alone = numbers(check_step(step_one, mode="statistical", cases=cases("step"), samples=N, seed=1, progress=False))
    assert numbers(check_step(attributed, mode="statistical", cases=cases("step"), samples=N, seed=1,
                              progress=False)) == alone


def test_a_wrong_batched_step_is_caught():
    case = [c for c in default_cases("step", drawn=0) if c.name == "worked-example-rows"]
    report = check_step(declare_batch(resample_many, 512), mode="statistical", cases=case, samples=5000,
                        progress=False)
    assert report.results[0].status == "differs"


def test_exact_mode_hands_batches_of_one():
    seen = []

    def exact_many(P, Q, X, seeds):
        seen.append((P.shape, len(seeds)))
        return step_many(P, Q, X, seeds)

    report = check_step(declare_batch(exact_many, 64), cases=cases("step"), isolate=False)  # `seen` is read here
    assert report.ok and float(report.worst_tv) <= 1e-12, report
    assert {shape[0] for shape, _ in seen} == {1} and {n for _, n in seen} == {1}
    assert check_decoder(declare_batch(decode_many, 8), cases=cases("decoder")[:1]).ok


def test_declared_rules_and_a_batch_together():
    from tests.test_rules import TRUNCATE_FIRST, rule_order_case, truncate_then_temper

    def own(T, D, X, config, seeds):
        return [speculative_step(truncate_then_temper(T[i], config), truncate_then_temper(D[i], config), X[i],
                                 coerce_rng(seeds[i])) for i in range(len(seeds))]

    fn = declare_rules(declare_batch(own, 32), TRUNCATE_FIRST)
    assert batch_of(fn).size == 32
    report = check_logits_step(fn, mode="statistical", cases=rule_order_case(), samples=N, progress=False)
    assert report.ok and "self-consistent" in str(report), report


# ---------------------------------------------------------------- bad input


def test_too_few_rows_is_a_status_naming_the_call():
    def short(P, Q, X, seeds):
        return step_many(P, Q, X, seeds)[:-1]

    r = check_step(declare_batch(short, 100), mode="statistical", cases=cases("step")[:1], samples=N,
                   progress=False).results[0]
    assert r.status == "invalid output"
    assert "99 rows for a batch of 100 samples" in r.detail and "the call for samples 0..99" in r.detail


def test_too_many_rows_and_a_bad_row_are_named():
    def long(P, Q, X, seeds):
        return step_many(P, Q, X, seeds) + [[0]]

    def bad_row(P, Q, X, seeds):
        out = step_many(P, Q, X, seeds)
        out[17] = [P.shape[-1]]  # a token outside the vocabulary, in row 17
        return out

    r = check_step(declare_batch(long, 100), mode="statistical", cases=cases("step")[:1], samples=N,
                   progress=False).results[0]
    assert r.status == "invalid output" and "or more rows for a batch of 100" in r.detail
    r = check_step(declare_batch(bad_row, 100), mode="statistical", cases=cases("step")[:1], samples=N,
                   progress=False).results[0]
    assert r.status == "invalid output" and "(row 17)" in r.detail and "outside the vocabulary" in r.detail


def test_a_batched_call_that_raises_is_raised():
    def boom(P, Q, X, seeds):
        raise RuntimeError("device lost")

    r = check_step(declare_batch(boom, 100), mode="statistical", cases=cases("step")[:1], samples=N,
                   progress=False).results[0]
    assert r.status == "raised" and "device lost" in r.detail


@pytest.mark.parametrize("kwargs, word", [
    (dict(size=0), "batch"),
    (dict(size=8, array="jax"), "array"),
    (dict(size=8, dtype="float16"), "dtype"),
    (dict(size=8, device="cuda"), "device"),
])
def test_bad_declarations_are_named(kwargs, word):
    with pytest.raises(SpecrefError, match=word):
        declare_batch(step_many, **kwargs)


def test_a_bad_attribute_is_a_usage_error():
    def fn(P, Q, X, seeds):
        return step_many(P, Q, X, seeds)

    fn.specref_batch = "lots"
    with pytest.raises(SpecrefError, match="specref_batch"):
        check_step(fn, mode="statistical", cases=cases("step")[:1], samples=10)


def test_torch_tensors_on_request():
    torch = pytest.importorskip("torch")
    seen = []

    def on_torch(T, D, X, config, seeds):
        seen.append((type(T), T.dtype, X.dtype))
        return logits_many(T.double().numpy(), D.double().numpy(), X.numpy(), config, seeds)

    report = check_logits_step(declare_batch(on_torch, 128, array="torch", dtype="float32"), mode="statistical",
                               cases=cases("logits")[:1], samples=2000, progress=False,
                               isolate=False)  # in this process: what the calls get is recorded here
    assert report.ok, report
    assert set(seen) == {(torch.Tensor, torch.float32, torch.int64)}


def test_what_the_implementation_does_to_its_rows_stays_there():
    def scribbles(P, Q, X, seeds):
        out = step_many(P, Q, X, seeds)
        P[:] = 0.0
        Q[:] = 0.0  # a batched call that overwrites its input must not change the next call's rows
        return out

    alone = numbers(check_step(step_one, mode="statistical", cases=cases("step"), samples=N, seed=2, progress=False))
    assert numbers(check_step(declare_batch(scribbles, 50), mode="statistical", cases=cases("step"), samples=N,
                              seed=2, progress=False)) == alone


def test_the_benchmarks_torch_decoder_passes_in_batches():
    """``benchmarks/bench_batched_calls.py``'s lockstep torch decoder (an ``[n, L]`` tensor padded with -1)."""
    pytest.importorskip("torch")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_batched_calls as bench

    bench.DEVICE_S[0] = 0.0
    chosen = [c for c in default_cases("decoder", drawn=0) if c.name in ("stop-token", "position-aware")]
    report = check_decoder(declare_batch(bench.torch_decode, 256), mode="statistical", cases=chosen, samples=N,
                           progress=False)
    assert report.ok, report


# ---------------------------------------------------------------- check(..., batch=n)


@pytest.mark.parametrize("level", LEVELS)
def test_the_batch_argument_is_declare_batch(level):
    """``check(level, fn, batch=n)`` and each shorthand: the counts of ``declare_batch(fn, n)``, one call per n."""
    from specref.verification.oracle import check

    shorthand, _, many = LEVELS[level]
    calls = []

    def counted(*args, **kwargs):
        calls.append(len(kwargs["rng"]) if level == "decoder" else len(args[-1]))
        return many(*args, **kwargs)

    kw = dict(mode="statistical", cases=cases(level), samples=N, seed=4, progress=False, isolate=False)
    declared = numbers(shorthand(declare_batch(many, 100), **kw))
    assert numbers(check(level, counted, batch=100, **kw)) == declared
    # 3,000 samples: blocks of 1024, 1024 and 952, cut into calls of 100 (and 24, 24, 52)
    assert calls == ([100] * 10 + [24] + [100] * 10 + [24] + [100] * 9 + [52]) * len(cases(level))
    assert numbers(shorthand(many, batch=100, **kw)) == declared


def test_the_batch_argument_is_validated_and_keeps_a_declared_form():
    from specref.verification.oracle import check, declared

    for bad in (0, -3, True, 2.0, "8", None.__class__):
        with pytest.raises(SpecrefError, match=r"batch \(samples per call\) must be a positive integer, got"):
            check_step(step_many, batch=bad, cases=cases("step"))
    with pytest.raises(SpecrefError, match="batch .* applies at the step, logits, decoder levels, not 'batched'"):
        check("batched", step_many, batch=8)
    fn = declared("logits", declare_batch(logits_many, 8, dtype="float32"), batch=np.int64(16))
    assert batch_of(fn) == BatchForm(16, dtype="float32")
