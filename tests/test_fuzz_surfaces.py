"""Fuzzing 0.2's surfaces: the batched levels (engine-shaped outputs through the batched call
included), the tree and tree-batch levels, sweeps, ``plan`` and the CLI.

The outcome classes are those of ``tests/test_fuzz.py``:

1. **Properties of the entry points** (hypothesis): each public function of the new surfaces is
   called with one argument replaced by a bad value.  It returns a valid output or raises a
   ``SpecrefError`` (or ``TypeError``) naming the argument; nothing else, and no crash inside
   NumPy.
2. **Bad input, one by one**: every reproducer of a defect of these surfaces gets its named error or its status.
3. **A misbehaviour suite**: more than 60 kinds of implementation for the new levels that raise,
   exit, crash, hang, return garbage (objects whose ``.cpu()``, ``__array__`` or iteration raise
   ``SystemExit`` or never end), misuse the rng, write into their inputs or are simply wrong;
   and correct ones.  Each wrong kind must get a status that is not ``ok`` (0 false ok), each
   correct kind ``ok`` (0 false alarms), no exception may escape (0 escapes), no check may run
   past its limits (0 hangs) -- in exact mode (in-process and isolated), in statistical mode
   (isolated by default), through the CLI (exit status of its outcome for every wrong kind, 0 for every
   correct one, 2 for a module that cannot be imported), through sweeps and through ``plan``.

The cases are the smallest that show every wrong kind (B = 2, K = 1, V = 2 for the batched
level), so the whole module runs in well under a minute.
"""

import io
import os
import re
import signal
import subprocess
import sys
import time
import types
import warnings
from contextlib import redirect_stderr, redirect_stdout
from fractions import Fraction as F
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specref import verify

try:  # imported here, not inside an implementation: an import cut by the time limit would leave torch half-made
    import torch
except ImportError:
    torch = None
from specref.core.errors import LowPrecisionRows, SpecrefError
from specref.core.step import speculative_step
from specref.core.tree import DraftTree, chain_tree, check_tree_rows
from specref.core.tree_verify import pointmass_verify
from specref.decoding.batched import batched_draft_and_verify, batched_step, sample_drafts
from specref.verification.campaigns.planning import plan
from specref.verification.levels.batched import steps as batched_level
from specref.verification.levels.trees import sampled as tree_level
from specref.verification.levels.batched.steps import BatchedCase
from specref.verification.levels.trees.sampled import TreeCase, batched_reference_kernel, from_coins, sglang_style_kernel
from specref.verification.oracle import check, check_batched_step, check_tree, check_tree_batch, default_cases
from specref.verification.running.calling import Misbehaved, can_isolate
from specref.verification.running.report import INTERNAL, OK, WRITES
from specref.verification.zoo.trees import tree_bugs

ROOT = Path(__file__).resolve().parents[1]
needs_fork = pytest.mark.skipif(not can_isolate(), reason="isolation needs the fork start method")
FUZZ = settings(max_examples=40, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
LIMIT = 0.5  # seconds per call in the misbehaviour suite
SLACK = 10.0  # seconds a check may take beyond its calls' limits before it counts as a hang


def frac(rows):
    return np.array([[[F(v) for v in pos] for pos in row] for row in rows], dtype=object)


# B = 2, K = 1, V = 2: every wrong kind below is far from the law on these rows (TV > 0.05)
TINY = BatchedCase("tiny", frac([[["1/4", "3/4"], ["1/2", "1/2"]], [["2/3", "1/3"], ["1/3", "2/3"]]]),
                   frac([[["3/4", "1/4"]], [["1/3", "2/3"]]]))
TREE = tree_level.tree_cases("topk")[:1]  # width2-depth2: every zoo tree bug shows on it
TREE_BATCH = [TreeCase("tiny-tree", tree_level.tree_cases("topk")[0].target, tree_level.tree_cases("topk")[0].draft,
                       widths=(2,))]
STEP = default_cases("step")[:1]


# ---------------------------------------------------------------- 1. properties of the entry points


class _Weird:
    def __repr__(self):
        return "<weird>"


P3 = np.full((2, 3, 3), 1 / 3)  # [B, K+1, V]
Q3 = np.full((2, 2, 3), 1 / 3)
X3 = np.array([[0, 1], [2, 2]])
BAD = st.sampled_from([
    None, "abc", b"x", 3, -1, 0, 2**70, 1.5, float("nan"), True, [], [[]], {}, (), _Weird(), object,
    np.random.Generator, np.random, np.random.RandomState(0), np.array([]), np.zeros((2, 0)), np.zeros((0, 2, 3)),
    np.full((2, 3, 3), np.nan), -P3, P3 * 2, P3[:, :, :2], P3[None], P3.astype(np.float16), P3.astype(complex),
    np.zeros((2, 1, 3)), np.zeros((2, 0), dtype=int), np.array([1, 1, 1]), np.array([3, 0]), np.array([[5, 0], [0, 0]]),
    F(1, 3), [0.2, 0.5, 0.3], lambda *a: None,
])


def outcome(fn, name):
    """fn()'s value, or None after checking that it raised SpecrefError/TypeError naming ``name``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LowPrecisionRows)
            return fn()
    except SpecrefError as e:  # SpecrefTypeError too
        assert name in str(e), f"{type(e).__name__} does not name {name!r}: {e}"
    except TypeError as e:
        assert name in str(e), f"TypeError does not name {name!r}: {e}"
    return None


def valid_steps(out, B, K):
    tokens, n = np.asarray(out.tokens), np.asarray(out.n_emitted)
    assert tokens.shape == (B, K + 1) and ((1 <= n) & (n <= K + 1)).all()


@FUZZ
@given(st.sampled_from(["p_target", "q_draft", "draft_tokens", "rng", "num_draft", "placeholder"]), BAD)
def test_batched_step_refuses_or_works(name, bad):
    args = dict(p_target=P3, q_draft=Q3, draft_tokens=X3, rng=np.random.default_rng(0), num_draft=None,
                placeholder=-1)
    args[name] = bad
    out = outcome(lambda: batched_step(args.pop("p_target"), args.pop("q_draft"), args.pop("draft_tokens"),
                                       args.pop("rng"), **args), name)
    if out is not None:
        valid_steps(out, 2, 2)
    assert batched_step(P3, Q3, X3, 1).tokens.shape == (2, 3)  # nothing poisoned


@FUZZ
@given(st.sampled_from(["q_draft", "rng", "num_draft", "placeholder"]), BAD)
def test_sample_drafts_refuses_or_works(name, bad):
    args = dict(q_draft=Q3, rng=np.random.default_rng(0), num_draft=None, placeholder=-1)
    args[name] = bad
    q = args["q_draft"]
    out = outcome(lambda: sample_drafts(args.pop("q_draft"), args.pop("rng"), **args), name)
    if out is not None:
        assert out.ndim == 2 and out.shape == np.asarray(q).shape[:2]


@FUZZ
@given(st.sampled_from(["p_target", "q_draft", "rng", "num_draft"]), BAD)
def test_draft_and_verify_refuses_or_works(name, bad):
    args = dict(p_target=P3, q_draft=Q3, rng=np.random.default_rng(0), num_draft=None)
    args[name] = bad
    out = outcome(lambda: batched_draft_and_verify(args.pop("p_target"), args.pop("q_draft"), args.pop("rng"), **args),
                  name)
    if out is not None:
        valid_steps(out, 2, 2)


@FUZZ
@given(st.sampled_from(["p_target", "q_draft", "proposal", "num_draft", "grid", "array", "dtype", "memory_budget",
                        "device", "name"]), BAD)
def test_batched_case_refuses_or_is_valid(name, bad):
    fields = dict(name="c", p_target=TINY.p_target, q_draft=TINY.q_draft)
    fields[name] = bad
    case = outcome(lambda: BatchedCase(**fields), name)
    if case is not None:  # a case that constructs runs, or is refused at the door naming its field
        report = outcome(lambda: check_batched_step(_ref, cases=[case], time_limit=5), name)
        if report is not None:
            assert report.results[0].status != INTERNAL, report


@FUZZ
@given(st.sampled_from(["widths", "prompt", "drafting", "name", "target"]), BAD)
def test_tree_case_refuses_or_is_valid(name, bad):
    base = tree_level.tree_cases("topk")[0]
    fields = dict(name="t", target=base.target, draft=base.draft, widths=(2,), prompt=(0,))
    fields[name] = bad
    case = outcome(lambda: TreeCase(**fields), name)
    if case is not None:
        report = outcome(lambda: check_tree(pointmass_verify, cases=[case]), name if name != "target" else "table")
        if report is not None:
            assert report.results[0].status != INTERNAL, report


@FUZZ
@given(st.sampled_from(["parents", "tokens"]), BAD)
def test_draft_tree_refuses_or_is_valid(name, bad):
    fields = dict(parents=(-1, 0, 0), tokens=(-1, 1, 2))
    fields[name] = bad
    tree = outcome(lambda: DraftTree(**fields), name)
    if tree is not None:
        assert tree.depth() >= 0 and tree.size >= 1


@FUZZ
@given(st.sampled_from(["batch", "tolerance", "max_paths", "time_limit", "isolate", "mode"]), BAD)
def test_tree_batch_options_refuse_or_work(name, bad):
    report = outcome(lambda: check_tree_batch(batched_reference_kernel, cases=TREE_BATCH, **{name: bad}), name)
    if report is not None:
        assert report.results[0].status in (OK, "over budget"), report


@FUZZ
@given(st.sampled_from(["fn", "calls", "level", "cases"]), BAD)
def test_plan_refuses_or_works(name, bad):
    args = dict(level="step", fn=_seeded_step, cases=STEP, calls=1)
    args[name] = bad
    rows = outcome(lambda: plan(args.pop("level"), args.pop("fn"), args.pop("cases"), quiet=True, samples=100,
                                isolate=False, case_time_limit=2, **args), name)
    if rows is not None:
        assert len(rows) >= 1


# ---------------------------------------------------------------- 2. bad inputs, one by one


def _ref(p, q, x, seed):
    return batched_step(p, q, x, seed)


def _seeded_step(p, q, x, seed):
    return speculative_step(p, q, x, np.random.default_rng(seed))


def _float(case):
    return case.as_float()


@pytest.mark.parametrize("change, word", [
    (dict(p_target=TINY.p_target * F(11, 10)), "sums to 11/10"),
    (dict(p_target=-TINY.p_target), "negative"),
    (dict(p_target=np.where(np.ones((2, 2, 2), bool), np.nan, 0.0)), "not finite"),
    (dict(p_target=TINY.p_target[0]), "3-D"),
    (dict(q_draft=TINY.q_draft[:, :, :1]), "q_draft must have shape"),
    (dict(grid=0), "grid"), (dict(grid=-1), "grid"), (dict(grid=2.5), "grid"), (dict(grid=True), "grid"),
    (dict(memory_budget=0), "memory_budget"), (dict(memory_budget=-5), "memory_budget"),
    (dict(device="cuda"), "device"),  # without array="torch"
    (dict(num_draft=(1, 1, 1)), "num_draft"), (dict(num_draft=(2, 0)), "num_draft"),
    (dict(array="jax"), "array"), (dict(dtype="float16"), "dtype"),
])
def test_batched_case_is_validated_at_the_door(change, word):
    fields = {**dict(name="c", p_target=TINY.p_target, q_draft=TINY.q_draft), **change}
    with pytest.raises(SpecrefError, match=word):
        BatchedCase(**fields)


def test_a_device_that_is_not_there_is_a_usage_error_not_an_internal_error():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    case = BatchedCase("c", TINY.as_float().p_target, TINY.as_float().q_draft, array="torch", device="cuda")
    with pytest.raises(SpecrefError, match="device 'cuda' is not available"):
        check_batched_step(_ref, cases=[case], mode="statistical", samples=100)


@pytest.mark.parametrize("widths", [(0,), (-1,), (2.5,), (), "22", (True,), (10**4, 10**4)])
def test_tree_case_widths_are_validated_at_the_door(widths):
    base = tree_level.tree_cases("topk")[0]
    with pytest.raises(SpecrefError, match="widths"):
        TreeCase("w", base.target, base.draft, widths=widths)


def test_tree_widths_over_the_vocabulary_are_a_usage_error():
    base = tree_level.tree_cases("topk")[0]
    with pytest.raises(SpecrefError, match="widths <= V"):
        check_tree(pointmass_verify, cases=[TreeCase("w", base.target, base.draft, widths=(4,))])


@pytest.mark.parametrize("tolerance", [1.0, -1, 0, "x", float("nan"), 1e-3])
def test_tree_batch_tolerance_is_validated(tolerance):
    with pytest.raises(SpecrefError, match="tolerance"):
        check_tree_batch(batched_reference_kernel, tolerance=tolerance, cases=TREE_BATCH)


def test_shared_coins_are_caught_in_a_tree_batch_at_every_valid_tolerance():
    def shared(candidates, first, sibling, coins, finals, p):  # row 0's coins for every row
        return batched_reference_kernel(candidates, first, sibling, [coins[0]] * len(coins), [finals[0]] * len(finals), p)

    for tolerance in (1e-9, 9e-4):
        assert not check_tree_batch(shared, tolerance=tolerance, cases=TREE_BATCH).ok


@pytest.mark.parametrize("batch, widths, max_paths", [(6, (2, 2), 10**6), (2, (3, 3, 3, 3), 10**4)])
def test_tree_batches_too_large_to_enumerate_are_over_budget_at_once(batch, widths, max_paths):
    """batch = 6: 27^6 = 3.9e8 joint outcomes, over the default budget; widths (3, 3, 3, 3): 243^2 = 59,049
    joint outcomes (under the default 10^6 that case runs, about 10^5 paths, ~2 min on one core)."""
    base = tree_level.tree_cases("topk")[0]
    case = TreeCase("big", base.target, base.draft, widths=widths)
    t0 = time.monotonic()
    report = check_tree_batch(batched_reference_kernel, batch=batch, cases=[case], max_paths=max_paths)
    assert report.results[0].status == "over budget" and "max_paths" in report.results[0].detail
    assert time.monotonic() - t0 < 5


def test_draft_tree_validation_is_linear():
    t0 = time.monotonic()
    tree = DraftTree(tuple(range(-1, 30_000)), (-1,) + (0,) * 30_000)
    assert tree.depth() == 30_000 and tree.is_chain() and tree.children(29_999) == [30_000]
    assert time.monotonic() - t0 < 2  # was 19 s (N x depth)
    with pytest.raises(SpecrefError, match="cycle"):
        DraftTree((-1,) + tuple(range(2, 30_001)) + (1,), (-1,) + (0,) * 30_000)


def test_float16_tree_rows_come_back_renormalised():
    p = np.full((3, 3), 1 / 3, dtype=np.float16)
    with pytest.warns(LowPrecisionRows):
        rows, _ = check_tree_rows(chain_tree([0, 1]), p)
    assert rows.dtype == np.float64 and np.abs(rows.sum(axis=1) - 1).max() < 1e-12
    with pytest.warns(LowPrecisionRows):
        path, token = pointmass_verify(chain_tree([0, 1]), p, None, np.random.default_rng(0))
    assert 0 <= token < 3


def test_batched_inputs_that_crashed_inside_numpy():
    p = np.full((2, 1, 3), 1 / 3)
    steps = batched_step(p, None, np.zeros((2, 0), dtype=np.int64), 0)  # K = 0: the bonus only
    assert steps.tokens.shape == (2, 1) and (steps.n_emitted == 1).all()
    with pytest.raises(SpecrefError, match="placeholder"):
        batched_step(P3, Q3, X3, 0, placeholder=None)
    with pytest.raises(SpecrefError, match="placeholder"):
        batched_step(P3, Q3, X3, 0, placeholder=1)  # a token of the vocabulary
    with pytest.raises(SpecrefError, match="num_draft"):
        sample_drafts(Q3, 0, num_draft=[1, 1, 1])  # B + 1 counts
    for rng in (np.random.Generator, np.random.PCG64, np.random, None, np.random.RandomState(0)):
        for call in (lambda: batched_step(P3, Q3, X3, rng), lambda: sample_drafts(Q3, rng),
                     lambda: batched_draft_and_verify(P3, Q3, rng)):
            with pytest.raises(TypeError, match="rng"):  # was SIGSEGV / SIGBUS
                call()


@pytest.mark.parametrize("calls", [0, -1, 2.5, True, "3"])
def test_plan_validates_calls(calls):
    with pytest.raises(SpecrefError, match="calls"):
        plan("step", _seeded_step, STEP, calls=calls, quiet=True)


@pytest.mark.parametrize("fn", [42, None, "specref.core.step:speculative_step"])
def test_plan_validates_fn(fn):
    with pytest.raises(TypeError, match="fn"):
        plan("step", fn, STEP, quiet=True)


def test_a_tree_implementation_returning_a_generator_that_raises_is_invalid_output():
    def gen(tree, p, q, rng):
        yield [1]
        raise RuntimeError("midway")

    r = check_tree(gen, cases=TREE).results[0]
    assert r.status == "invalid output" and "midway" in r.detail


def test_a_stateful_decoder_that_mutates_its_table_is_told_it_writes_into_its_inputs():
    """The tables a decoder is handed are read-only copies (SPEC 13.3): the write is named where it
    happens (before, the replays it changed made it ``bad rng use``, or an ``internal error``)."""
    from specref.decoding.chain import speculative_decode

    calls = [0]

    def stateful(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
        calls[0] += 1
        if calls[0] > 3:  # its own state changes what it does on a replay
            target.table[...] = draft.table
        return speculative_decode(target, draft, prompt, k=k, config=config, max_new_tokens=max_new_tokens,
                                  stop_tokens=stop_tokens, rng=rng).tokens

    r = check("decoder", stateful, cases=default_cases("decoder")[:1]).results[0]
    assert r.status == "writes into its inputs", r


def test_the_inputs_are_fresh_and_read_only_and_never_read_back():
    def writes_after(p, q, x, seed):  # correct, then writes into what it was handed
        out = batched_step(p, q, x, seed)
        p[...] = 0
        return out

    def copies_then_writes(p, q, x, seed):  # correct, and writes into its own copies: fine
        p, q, x = p.copy(), q.copy(), x.copy()
        out = batched_step(p, q, x, seed)
        p[...], x[...] = 0, 0
        return out

    for mode, extra in (("exact", {}), ("statistical", dict(samples=2048, isolate=False))):
        case = TINY if mode == "exact" else TINY.as_float()
        r = check_batched_step(writes_after, cases=[case], mode=mode, **extra).results[0]
        assert r.status == WRITES and "read-only" in r.detail, r
        assert check_batched_step(copies_then_writes, cases=[case], mode=mode, **extra).ok
    writes_tree = lambda tree, p, q, rng: (p.__setitem__((0, 0), 1.0), pointmass_verify(tree, p, q, rng))[1]  # noqa: E731
    assert check_tree(writes_tree, cases=TREE).results[0].status == WRITES


def test_torch_inputs_written_into_are_reported():
    torch = pytest.importorskip("torch")

    def writes(p, q, x, seed):
        out = batched_step(p, q, x, seed)
        p.zero_()
        return out.tokens

    case = BatchedCase("c", TINY.as_float().p_target, TINY.as_float().q_draft, array="torch")
    r = check_batched_step(writes, cases=[case], mode="statistical", samples=2048).results[0]
    assert r.status == WRITES and torch is not None


def test_a_shard_store_filled_in_an_isolated_worker_comes_back():
    store = {}
    report = check_batched_step(_ref, cases=[TINY.as_float()], mode="statistical", samples=3 * 1024, shard_blocks=1,
                                shard_store=store)
    assert report.ok and len(store) == 3
    again = check_batched_step(_ref, cases=[TINY.as_float()], mode="statistical", samples=3 * 1024, shard_blocks=1,
                               shard_store=store)
    assert [r.p_value for r in again.results] == [r.p_value for r in report.results]


# ---------------------------------------------------------------- 3. the misbehaviour suite: kinds


def _gen(seed):  # the implementation's generator: the enumerator (exact) or one seeded by the oracle's seed
    return np.random.default_rng(seed) if isinstance(seed, (int, np.integer)) else seed


def _cat(w, u):
    """Inverse CDF by comparisons only (works on the enumerator's lazy uniforms)."""
    total, cum = sum(w), 0
    for j, wj in enumerate(w):
        cum = cum + wj
        if wj > 0 and u < cum / total:
            return j
    return max(j for j in range(len(w)) if w[j] > 0)


def _rows_step(p, q, x, seed, *, share=False, resample_p=False, bonus_row0=False, never=False, always=False,
               off_by_one=False, other_q=False):
    """Algorithm 1 row by row in plain Python, with one bug switched on (all off: correct)."""
    rng = _gen(seed)
    B, K1, V = p.shape
    K = K1 - 1
    coins = [[rng.random() for _ in range(K)] for _ in range(B)]
    finals = [rng.random() for _ in range(B)]
    out = np.full((B, K1), -1, dtype=np.int64)
    for b in range(B):
        c, f = (coins[0], finals[0]) if share else (coins[b], finals[b])
        k = int(sum(1 for t in x[b] if t >= 0))
        qb = q[(b + 1) % B] if other_q else q[b]
        emitted = []
        for i in range(k):
            t = int(x[b, i])
            judge = p[b, min(i + 1, K)] if off_by_one else p[b, i]
            ratio = judge[t] / qb[i][t]
            if always or (not never and c[i] < ratio):
                emitted.append(t)
                continue
            w = list(p[b, i]) if resample_p else [max(a - z, 0) for a, z in zip(p[b, i], qb[i])]
            emitted.append(_cat(w if sum(w) > 0 else list(p[b, i]), f))
            break
        else:
            emitted.append(_cat(list(p[b, 0] if bonus_row0 else p[b, k]), f))
        out[b, :len(emitted)] = emitted
    return out


def _rows(**bug):
    return lambda p, q, x, seed: _rows_step(p, q, x, seed, **bug)


def _raiser(exc):
    def fn(*args):
        raise exc
    return fn


class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError


class _BadBase(BaseException):
    pass


def _recursion(*args):
    return _recursion(*args)


_METHODS = {"cpu": "cpu", "array": "__array__", "iterate": "__iter__"}


def _Obj(*, shape=(2, 2), **thunks):
    """An output object with hostile methods: each of ``cpu``, ``__array__``, ``__iter__`` given runs its
    thunk; a ``shape`` (unless None) makes the oracle treat it as an array of some backend."""
    namespace = {"__repr__": lambda self: "<hostile output>"}
    if shape is not None:
        namespace["shape"] = shape
    for name, thunk in thunks.items():
        namespace[_METHODS[name]] = (lambda t: lambda self, *args, **kwargs: t())(thunk)
    return type("Hostile", (), namespace)()


def _exits(code=0):
    def fn():
        raise SystemExit(code)
    return fn


def _sleeps():
    time.sleep(30)


def _hard_exit():
    os._exit(0)


def _returns(make):
    return lambda *args: make()


class _BadNe(np.ndarray):
    def __ne__(self, other):
        raise SystemExit(0)


def _declared(fn):
    def in_process(p, q, x, seed):
        return fn(p, q, x, seed)
    in_process.specref_isolate = False  # runs in-process under the default isolation
    return in_process


def _correct_tokens(p, q, x, seed):
    return batched_step(p, q, x, seed).tokens


def _torch_tokens(p, q, x, seed):
    return torch.as_tensor(np.asarray(batched_step(p, q, x, seed).tokens))


def _int32_tokens(p, q, x, seed):
    return np.asarray(batched_step(p, q, x, seed).tokens).astype(np.int32)


def _flashinfer_triple(p, q, x, seed):  # (ids, n_accepted, n_emitted) in an engine's dtypes
    s = batched_step(p, q, x, seed)
    return np.asarray(s.tokens).astype(np.int32), np.asarray(s.n_accepted).astype(np.int32), np.asarray(s.n_emitted)


def _list_of_lists(p, q, x, seed):
    return batched_step(p, q, x, seed).tokens.tolist()


def _wrong_counts(p, q, x, seed):
    s = batched_step(p, q, x, seed)
    return s.tokens, s.n_emitted + 1


def _swapped_rows(p, q, x, seed):
    return batched_step(p, q, x, seed).tokens[::-1].copy()


def _bonus_only(p, q, x, seed):  # ignores the drafts: one token from p[b, 0]
    out = np.full((p.shape[0], p.shape[1]), -1)
    for b in range(p.shape[0]):
        out[b, 0] = _cat(list(p[b, 0]), _gen(seed).random())
    return out


def _lazy_arith(p, q, x, seed):
    out = _correct_tokens(p, q, x, seed)
    out[0, -1] = int(_gen(seed).random() * 2) if out[0, -1] >= 0 else -1
    return out


def _lazy_float(p, q, x, seed):
    float(_gen(seed).random())
    return _correct_tokens(p, q, x, seed)


_OWN = np.random.default_rng(11)


def _own_rng(p, q, x, seed):  # forgot statistical mode: draws from its own generator
    return batched_step(p, q, x, _OWN)


def _global_rng(p, q, x, seed):
    return batched_step(p, q, x, int(np.random.randint(2**31)))


def _busy(*args):
    while True:
        pass


def _retry(*args):
    while True:
        try:
            time.sleep(30)
        except BaseException:  # noqa: BLE001
            pass


def _c_hang(*args):
    re.match(r"(a+)+b", "a" * 40)


def _block_alarm(*args):
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(30)


def _ignore_alarm(*args):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(30)


def _exit0(*args):
    os._exit(0)


def _exit3(*args):
    os._exit(3)


def _abort(*args):
    os.abort()


def _segv(*args):
    import ctypes

    ctypes.string_at(0)


def _kill_self(*args):
    os.kill(os.getpid(), signal.SIGKILL)


EXCEPTIONS = {f"raises {e!r}": _raiser(e) for e in [
    ValueError("v"), TypeError("t"), ZeroDivisionError(), KeyError("k"), IndexError(), RuntimeError(), MemoryError(),
    AssertionError(), NotImplementedError(), StopIteration(), OverflowError(), SystemExit(0), SystemExit(1),
    SystemExit("msg"), KeyboardInterrupt(), GeneratorExit(), _BadStr(), _BadBase(), SpecrefError("claims specref"),
    Misbehaved("ok", "claims ok"),
]}
EXCEPTIONS["recursion"] = _recursion

BATCHED_GARBAGE = {f"returns {name}": _returns(make) for name, make in [
    ("None", lambda: None), ("[]", lambda: []), ("int", lambda: 0), ("str", lambda: "ab"), ("bytes", lambda: b"\x00"),
    ("dict", lambda: {0: 1}), ("object", object), ("float ids", lambda: np.zeros((2, 2))),
    ("bool ids", lambda: np.ones((2, 2), bool)), ("object ids", lambda: np.zeros((2, 2), dtype=object)),
    ("complex ids", lambda: np.zeros((2, 2), complex)), ("1-D ids", lambda: np.zeros(2, int)),
    ("3-D ids", lambda: np.zeros((2, 2, 1), int)), ("[B, K] ids", lambda: np.zeros((2, 1), int)),
    ("[B+1, K+1] ids", lambda: np.zeros((3, 2), int)), ("id V", lambda: np.full((2, 2), 2)),
    ("id -2", lambda: np.full((2, 2), -2)), ("placeholder gap", lambda: np.array([[-1, 0], [0, 1]])),
    ("empty rows", lambda: np.full((2, 2), -1)), ("uint64 max", lambda: np.full((2, 2), 2**64 - 1, dtype=np.uint64)),
    ("2**40", lambda: np.full((2, 2), 2**40)), ("ragged lists", lambda: [[0], [0, 1, 1]]),
    ("list of str", lambda: [["a", "b"], ["c", "d"]]), ("nan list", lambda: [[float("nan")] * 2] * 2),
    ("4-tuple", lambda: (np.zeros((2, 2), int),) * 4), ("counts not ints", lambda: (np.zeros((2, 2), int), "ab")),
    ("counts wrong shape", lambda: (np.zeros((2, 2), int), np.zeros(5, int))),
    ("generator", lambda: (r for r in [[0, 1], [0, 1]])),
    ("raising __array__", lambda: _Obj(array=_raiser(ValueError("array")))),
    ("SystemExit in __array__", lambda: _Obj(array=_exits())),
    ("KeyboardInterrupt in __array__", lambda: _Obj(array=_raiser(KeyboardInterrupt()))),
    ("SystemExit in .cpu()", lambda: _Obj(cpu=_exits())), ("SystemExit(1) in .cpu()", lambda: _Obj(cpu=_exits(1))),
    ("GeneratorExit in .cpu()", lambda: _Obj(cpu=_raiser(GeneratorExit()))),
    ("__array__ not an array", lambda: _Obj(array=lambda: 7)), ("hanging __array__", lambda: _Obj(array=_sleeps)),
    ("hanging .cpu()", lambda: _Obj(cpu=_sleeps)),
    ("ndarray subclass, SystemExit in !=", lambda: np.zeros((2, 2), int).view(_BadNe)),
    ("tuple whose first item has no shape", lambda: (_Obj(array=_exits(), shape=None), np.zeros(2))),
]}
BATCHED_WRONG = {
    "shares row 0's coins": _rows(share=True), "residual from p": _rows(resample_p=True),
    "bonus from p[0]": _rows(bonus_row0=True), "never accepts": _rows(never=True), "accepts every draft": _rows(always=True),
    "judges with the next row": _rows(off_by_one=True), "divides by the other row's q": _rows(other_q=True),
    "swapped rows": _swapped_rows, "ignores the drafts": _bonus_only, "n_emitted off by one": _wrong_counts,
    "lazy-uniform arithmetic": _lazy_arith, "float() of a lazy uniform": _lazy_float,
    "point-mass rule for real drafts": lambda p, q, x, seed: batched_step(p, None, x, seed),
}
BATCHED_EXACT_ONLY = {"own generator": _own_rng, "global np.random": _global_rng}  # correct with its own randomness
BATCHED_CORRECT = {
    "reference (BatchedSteps)": _ref, "reference tokens": _correct_tokens, "plain Python rows": _rows(),
    "list of lists": _list_of_lists, "int32 ids": _int32_tokens, "(ids, n_accepted, n_emitted)": _flashinfer_triple,
    "declares specref_isolate = False": _declared(_ref), **({"torch tensor": _torch_tokens} if torch is not None else {}),
}
ISOLATED_ONLY = {
    "sleeps": lambda *a: time.sleep(30), "busy loop": _busy,
    "retries on BaseException": _retry, "C-level hang": _c_hang, "blocks SIGALRM": _block_alarm,
    "ignores SIGALRM": _ignore_alarm, "os._exit(0)": _exit0, "os._exit(3)": _exit3, "abort": _abort,
    "segfault": _segv, "SIGKILL itself": _kill_self,
    "os._exit(0) in __array__": _returns(lambda: _Obj(array=_hard_exit)),
}

BATCHED_BAD = {**EXCEPTIONS, **BATCHED_GARBAGE, **BATCHED_WRONG}
# The CLI's exit status for each kind's outcome (SPEC §13.3), reasoned from what the kind does: 1 a wrong law (a
# kernel with its own generator is one fixed draw in exact mode: a wrong law too), 6 a hang, 3 every other
# misbehaviour (an exception, garbage or an inconsistent output, a crash, lazy-uniform misuse), 0 a correct kind.
BATCHED_HANGS = {"returns hanging __array__", "returns hanging .cpu()", "sleeps", "busy loop", "retries on BaseException",
                 "C-level hang", "blocks SIGALRM", "ignores SIGALRM"}
BATCHED_WRONG_LAW = {*BATCHED_WRONG, *BATCHED_EXACT_ONLY} - {
    "swapped rows", "n_emitted off by one", "lazy-uniform arithmetic", "float() of a lazy uniform"}


def _want_exit(name: str) -> int:
    if name in BATCHED_CORRECT:
        return 0
    return 1 if name in BATCHED_WRONG_LAW else 6 if name in BATCHED_HANGS else 3


def _tree_garbage():
    def gen_raises(tree, p, q, rng):
        yield [1]
        raise RuntimeError("midway")

    def endless(tree, p, q, rng):
        while True:
            yield 0

    def path_gen_exits(tree, p, q, rng):
        def path():
            yield 1
            raise SystemExit(0)
        return path(), 0

    class Pair:
        def __iter__(self):
            raise SystemExit(0)

    kinds = {f"returns {name}": _returns(make) for name, make in [
        ("None", lambda: None), ("()", lambda: ()), ("str", lambda: "ab"), ("dict", lambda: {0: 1}),
        ("3-tuple", lambda: ([], 0, 0)), ("token V", lambda: ([], 3)), ("token -1", lambda: ([], -1)),
        ("float token", lambda: ([], 1.5)), ("bool token", lambda: ([], True)), ("str token", lambda: ([], "a")),
        ("node 99", lambda: ([99], 0)), ("grandchild first", lambda: ([3], 0)), ("root in the path", lambda: ([0], 0)),
        ("path too long", lambda: (list(range(1, 500)), 0)), ("float path", lambda: ([1.0], 0)),
        ("path None", lambda: (None, 0)), ("object iterating to SystemExit", Pair),
        ("object whose iteration raises", lambda: _Obj(iterate=_raiser(ValueError()))),
    ]}
    kinds.update({"generator that raises": gen_raises, "endless generator": endless,
                  "path generator exits": path_gen_exits})
    return kinds


def _tree_wrong():
    def first_child_argmax(tree, p, q, rng):
        kids = tree.children(0)
        return [kids[0]], int(np.argmax(p[kids[0]]))

    def uniform_token(tree, p, q, rng):
        return [], int(rng.choice(p.shape[1]))

    def deepest(tree, p, q, rng):
        path, node = [], 0
        while tree.children(node):
            node = tree.children(node)[0]
            path.append(node)
        return path, pointmass_verify(tree, p, q, rng)[1]

    def lazy_arith(tree, p, q, rng):
        return [], int(rng.random() * 3)

    kinds = {f"zoo: {b.name}": b.fn for b in tree_bugs("tree") if b.drafting == "topk"}
    kinds.update({"first child, argmax token": first_child_argmax, "uniform next token": uniform_token,
                  "deepest path always": deepest, "lazy-uniform arithmetic": lazy_arith})
    return kinds


TREE_BAD = {**EXCEPTIONS, **_tree_garbage(), **_tree_wrong()}
TREE_CORRECT = {
    "pointmass_verify": pointmass_verify, "SGLang-style kernel, coins passed": from_coins(sglang_style_kernel),
    "never accepts (draws from p[0])": lambda tree, p, q, rng: ([], int(rng.choice(p.shape[1], p=p[0]))),
    "numpy path and 0-d token": lambda tree, p, q, rng: (lambda out: (np.array(out[0], dtype=np.int64),
                                                                        np.int64(out[1])))(pointmass_verify(tree, p, q, rng)),
}


def _tree_batch_kinds():
    def shared(c, f, s, u, uf, p):
        return batched_reference_kernel(c, f, s, [u[0]] * len(u), [uf[0]] * len(uf), p)

    def shared_final(c, f, s, u, uf, p):
        return batched_reference_kernel(c, f, s, u, [uf[0]] * len(uf), p)

    def copies_row0(c, f, s, u, uf, p):
        a, t = batched_reference_kernel(c, f, s, u, uf, p)
        return [a[0]] * len(a), [t[0]] * len(t)

    def ignores_coins(c, f, s, u, uf, p):
        return [[0, -1]] * len(c), [0] * len(c)

    def numpy_out(c, f, s, u, uf, p):
        a, t = batched_reference_kernel(c, f, s, u, uf, p)
        return np.array(a), np.array(t)

    def torch_out(c, f, s, u, uf, p):
        a, t = batched_reference_kernel(c, f, s, u, uf, p)
        return torch.tensor(a), torch.tensor(t)

    bad = {f"returns {name}": _returns(make) for name, make in [
        ("None", lambda: None), ("one row", lambda: ([[0, -1]], [0])), ("three rows", lambda: ([[0, -1]] * 3, [0] * 3)),
        ("tokens short", lambda: ([[0, -1]] * 2, [0])), ("node 9", lambda: ([[0, 9]] * 2, [0, 0])),
        ("token V", lambda: ([[0, -1]] * 2, [3, 3])), ("float tokens", lambda: ([[0, -1]] * 2, [0.5, 0.5])),
        ("bool tokens", lambda: ([[0, -1]] * 2, [True, True])), ("str rows", lambda: ("ab", [0, 0])),
        ("object iterating to SystemExit", lambda: _Obj(iterate=_exits())),
        ("hanging iteration", lambda: _Obj(iterate=_sleeps)),
        ("rows that exit", lambda: (_Obj(iterate=_exits()), [0, 0])),
    ]}
    bad.update({"shares row 0's coins": shared, "shares the final coin": shared_final, "copies row 0": copies_row0,
                "ignores its coins": ignores_coins})
    correct = {"batched_reference_kernel": batched_reference_kernel, "numpy outputs": numpy_out}
    if torch is not None:
        correct["torch outputs"] = torch_out
    return {**EXCEPTIONS, **bad}, correct


TREE_BATCH_BAD, TREE_BATCH_CORRECT = _tree_batch_kinds()


def test_the_suite_has_at_least_60_kinds_for_the_new_levels():
    batched = len(BATCHED_BAD) + len(BATCHED_EXACT_ONLY) + len(ISOLATED_ONLY)
    trees = len(set(_tree_garbage()) | set(_tree_wrong()))
    tree_batch = len(set(TREE_BATCH_BAD) - set(EXCEPTIONS))
    assert batched >= 60 and batched + trees + tree_batch >= 120, (batched, trees, tree_batch)


# ---------------------------------------------------------------- 3. the misbehaviour suite: runs


def _tally(run, kinds, correct=(), *, cases_time_limit=LIMIT, calls=1):
    """Run every kind: (escaped, false ok, false alarms, hangs, statuses)."""
    escaped, false_ok, false_alarm, hangs, statuses = [], [], [], [], {}
    for name, fn in {**kinds, **dict(correct)}.items():
        t0 = time.monotonic()
        try:
            report = run(fn)
        except BaseException as e:  # noqa: BLE001 - counted: nothing may escape
            escaped.append(f"{name}: {type(e).__name__}: {e}")
            continue
        took = time.monotonic() - t0
        if took > calls * cases_time_limit + SLACK:
            hangs.append(f"{name}: {took:.1f} s")
        statuses[name] = [r.status for r in report.results]
        if name in dict(correct):
            if not report.ok:
                false_alarm.append(f"{name}: {statuses[name]} {report.results[0].detail[:200]}")
        elif report.ok or any(s == INTERNAL for s in statuses[name]):
            false_ok.append(f"{name}: {statuses[name]}")
    return escaped, false_ok, false_alarm, hangs, statuses


def _clean(tally):
    escaped, false_ok, false_alarm, hangs, statuses = tally
    assert (escaped, false_ok, false_alarm, hangs) == ([], [], [], []), (escaped, false_ok, false_alarm, hangs)
    return statuses


def test_batched_misbehaviour_exact_in_process():
    statuses = _clean(_tally(lambda fn: check_batched_step(fn, cases=[TINY], time_limit=LIMIT),
                             {**BATCHED_BAD, **BATCHED_EXACT_ONLY}, BATCHED_CORRECT))
    assert statuses["returns SystemExit in .cpu()"] == ["invalid output"]
    assert statuses["returns hanging __array__"] == ["timeout"] and statuses["shares row 0's coins"] == ["differs"]
    assert statuses["lazy-uniform arithmetic"] == ["lazy-uniform arithmetic"]
    assert statuses["raises SystemExit(0)"] == ["raised"] and statuses["returns generator"] == ["invalid output"]


@needs_fork
def test_batched_misbehaviour_exact_isolated():
    kinds = {**ISOLATED_ONLY, **{k: BATCHED_BAD[k] for k in list(BATCHED_BAD)[::4]}}
    statuses = _clean(_tally(lambda fn: check_batched_step(fn, cases=[TINY], time_limit=LIMIT, isolate=True), kinds,
                             {"reference": _ref}))
    assert statuses["segfault"] == ["crashed"] and statuses["C-level hang"] == ["timeout"]
    assert statuses["os._exit(0) in __array__"] == ["crashed"]


@needs_fork
def test_batched_misbehaviour_statistical_isolated_by_default():
    # N = 2048 per row at alpha = 1e-6 (Bonferroni over the case's statistics): every wrong kind here is at
    # TV >= 0.05 on TINY, where the tests' power is ~1; seeded, so deterministic
    # (every wrong kind; a third of the exceptions and of the garbage, which no mode treats differently)
    case = TINY.as_float()
    kinds = {**dict(list(EXCEPTIONS.items())[::3]), **dict(list(BATCHED_GARBAGE.items())[::3]), **BATCHED_WRONG,
             **{k: ISOLATED_ONLY[k] for k in ("os._exit(0)", "segfault", "ignores SIGALRM")}}
    kinds = {k: v for k, v in kinds.items() if not k.startswith(("lazy", "float()"))}  # seeds, not lazy uniforms
    statuses = _clean(_tally(lambda fn: check_batched_step(fn, cases=[case], mode="statistical", samples=2048,
                                                           time_limit=LIMIT, progress=False), kinds, BATCHED_CORRECT,
                             calls=2))
    assert statuses["os._exit(0)"] == ["crashed"] and statuses["residual from p"] == ["differs"]


def test_engine_shaped_outputs_through_the_engine_levels():
    """The vllm and flashinfer levels call the batched level through an adapter: an engine kernel whose
    returned objects misbehave gets a status there too (the levels' own cases, point-mass rows included)."""
    from specref.verification.levels import LEVELS

    if "flashinfer" not in LEVELS:
        pytest.skip("no flashinfer level")
    flashinfer_cases = [c for c in LEVELS["flashinfer"].cases() if c.q_draft is not None][:1]
    kinds = {"SystemExit in .cpu()": lambda d, x, t, s: (_Obj(cpu=_exits()), np.zeros(2), np.zeros(2)),
             "hanging __array__": lambda d, x, t, s: (_Obj(array=_sleeps), np.zeros(2), np.zeros(2)),
             "raises SystemExit": _raiser(SystemExit(0)), "returns None": lambda d, x, t, s: None}
    _clean(_tally(lambda fn: check("flashinfer", fn, cases=flashinfer_cases, time_limit=LIMIT), kinds))


def test_tree_misbehaviour_exact_in_process():
    statuses = _clean(_tally(lambda fn: check_tree(fn, cases=TREE, time_limit=LIMIT), TREE_BAD, TREE_CORRECT))
    assert statuses["generator that raises"] == ["invalid output"]
    assert statuses["returns object iterating to SystemExit"] == ["invalid output"]


@needs_fork
def test_tree_misbehaviour_statistical_isolated_by_default():
    kinds = {k: TREE_BAD[k] for k in ("raises SystemExit(0)", "generator that raises", "returns token V",
                                      "uniform next token", "first child, argmax token")}
    kinds.update({k: ISOLATED_ONLY[k] for k in ("os._exit(0)", "busy loop")})
    statuses = _clean(_tally(lambda fn: check_tree(fn, cases=TREE, mode="statistical", samples=2000, time_limit=LIMIT,
                                                   progress=False), kinds, {"pointmass_verify": pointmass_verify}))
    assert statuses["os._exit(0)"] == ["crashed"]


def test_tree_batch_misbehaviour_exact_in_process():
    statuses = _clean(_tally(lambda fn: check_tree_batch(fn, cases=TREE_BATCH, time_limit=LIMIT), TREE_BATCH_BAD,
                             TREE_BATCH_CORRECT))
    assert statuses["shares row 0's coins"] == ["differs"] and statuses["returns hanging iteration"] == ["timeout"]


@needs_fork
def test_tree_batch_misbehaviour_isolated():
    kinds = {k: ISOLATED_ONLY[k] for k in ("os._exit(0)", "segfault", "retries on BaseException")}
    kinds["raises SystemExit(0)"] = EXCEPTIONS["raises SystemExit(0)"]
    _clean(_tally(lambda fn: check_tree_batch(fn, cases=TREE_BATCH, time_limit=LIMIT, isolate=True), kinds,
                  {"batched_reference_kernel": batched_reference_kernel}))


@needs_fork
def test_plan_survives_every_kind():
    kinds = {"raises SystemExit(0)": _raiser(SystemExit(0)), "os._exit(0)": _exit0, "segfault": _segv,
             "sleeps": ISOLATED_ONLY["sleeps"], "C-level hang": _c_hang, "returns garbage": _returns(object),
             "KeyboardInterrupt": _raiser(KeyboardInterrupt())}
    for name, fn in kinds.items():
        t0 = time.monotonic()
        rows = plan("step", fn, STEP, calls=2, quiet=True, time_limit=LIMIT)  # isolated by default
        assert rows[0].eta_s is None and rows[0].note, (name, rows)
        assert time.monotonic() - t0 < 2 * LIMIT + SLACK, name
    assert plan("step", _seeded_step, STEP, calls=2, quiet=True)[0].eta_s > 0


# ---------------------------------------------------------------- the CLI


def _main(*args):
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        try:
            code = verify.main(list(args))
        except SystemExit as e:  # argparse's usage errors only
            code = e.code
    return code, out.getvalue()


@pytest.fixture
def kinds_module(monkeypatch):
    """Every batched kind as an attribute of a module ``fuzz23``; the batched level's default cases: TINY."""
    module = types.ModuleType("fuzz23")
    names = {}
    everything = {**BATCHED_BAD, **BATCHED_EXACT_ONLY, **ISOLATED_ONLY, **BATCHED_CORRECT}
    for i, (name, fn) in enumerate(everything.items()):
        setattr(module, f"kind{i}", fn)
        names[name] = f"kind{i}"
    monkeypatch.setitem(sys.modules, "fuzz23", module)
    monkeypatch.setattr(batched_level, "default_batched_cases", lambda level="batched": [TINY])
    return names


@needs_fork
def test_cli_exit_codes_for_every_batched_kind(kinds_module):
    codes, escaped = {}, []
    for name, attr in kinds_module.items():
        try:
            codes[name] = _main("--impl", f"fuzz23:{attr}", "--level", "batched", "--time-limit", str(LIMIT))[0]
        except BaseException as e:  # noqa: BLE001
            escaped.append(f"{name}: {type(e).__name__}: {e}")
    assert escaped == []
    want = {name: _want_exit(name) for name in codes}
    assert {n: c for n, c in codes.items() if c != want[n]} == {}


def test_cli_no_isolate_exit_codes(kinds_module):
    """--no-isolate: every kind an in-process oracle survives (SystemExit from .cpu() / __array__ included)."""
    codes = {name: _main("--impl", f"fuzz23:{attr}", "--level", "batched", "--time-limit", str(LIMIT), "--no-isolate")[0]
             for name, attr in kinds_module.items() if name not in ISOLATED_ONLY}
    want = {name: _want_exit(name) for name in codes}
    assert {n: c for n, c in codes.items() if c != want[n]} == {}


IMPORTS = {
    "sys.exit(0)": "import sys\nsys.exit(0)\n", "raise SystemExit(1)": "raise SystemExit(1)\n",
    "os._exit(0)": "import os\nos._exit(0)\n", "segfault": "import ctypes\nctypes.string_at(0)\n",
    "raises": "raise ImportError('nope')\n", "not callable": "f = 3\n",
}


@needs_fork
@pytest.mark.parametrize("what", sorted(IMPORTS))
def test_cli_a_module_that_exits_or_crashes_at_import_is_a_usage_error(what, tmp_path, monkeypatch):
    name = "import23_" + re.sub(r"\W", "_", what)
    (tmp_path / f"{name}.py").write_text(IMPORTS[what])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    code, text = _main("--impl", f"{name}:f", "--level", "batched")
    assert code == 2 and ("cannot load" in text or "not a callable" in text), text[-500:]


@needs_fork
def test_cli_a_module_that_hangs_at_import_is_a_usage_error_in_time(tmp_path, monkeypatch):
    (tmp_path / "hang23.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("specref.verification.running.calling.IMPORT_TIME_LIMIT", 1.0)
    t0 = time.monotonic()
    code, text = _main("--impl", "hang23:f", "--level", "batched")
    assert code == 2 and "timeout" in text and time.monotonic() - t0 < 10, text[-500:]


def _sweep_file(tmp_path, impl, **settings_):
    import json

    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"impl": impl, "level": "batched", "settings": {"time_limit": LIMIT, **settings_},
                                "grid": {"case": ["tiny"]}}))
    return path


@needs_fork
@pytest.mark.parametrize("name, code", [
    ("os._exit(0)", 3), ("segfault", 3), ("raises SystemExit(0)", 3), ("C-level hang", 6), ("shares row 0's coins", 1),
    ("returns SystemExit in .cpu()", 3), ("reference (BatchedSteps)", 0),
])
def test_cli_sweep_exit_codes(kinds_module, tmp_path, name, code):
    got, text = _main("--sweep", str(_sweep_file(tmp_path, f"fuzz23:{kinds_module[name]}")), "--no-progress",
                      "--out", str(tmp_path / "record.json"))
    assert got == code, text[-1000:]


@needs_fork
def test_cli_sweep_statistical_cell_isolated(kinds_module, tmp_path):
    path = _sweep_file(tmp_path, f"fuzz23:{kinds_module['os._exit(0)']}", mode="statistical", samples=1024)
    got, text = _main("--sweep", str(path), "--no-progress")
    assert got == 3 and "crashed" in text, text[-1000:]  # crashed: misbehaves


IMPLS = (
    "import os, sys\n"
    "class _Out:\n"
    "    shape = (2, 3)\n"
    "    def cpu(self): raise SystemExit(0)\n"
    "    def __array__(self, *a, **k): raise SystemExit(0)\n"
    "def exits_in_cpu(p, q, x, seed): return _Out()\n"
    "def hard_exit(p, q, x, seed): os._exit(0)\n"
)


@needs_fork
def test_the_three_false_passes_of_the_real_cli_exit_nonzero(tmp_path):
    """Three ways the CLI used to exit 0 (a false PASS), in a real process: --no-isolate with an output whose .cpu()/__array__
    exits; --sweep with os._exit(0); a module that exits at import (sys.exit in a sweep, os._exit)."""
    (tmp_path / "impls23.py").write_text(IMPLS)
    (tmp_path / "exits23.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "hardexit23.py").write_text("import os\nos._exit(0)\n")
    sweeps = {}
    for impl in ("impls23:hard_exit", "exits23:f"):
        path = _sweep_file(tmp_path, impl)
        sweeps[impl] = tmp_path / f"{impl.partition(':')[0]}.json"
        sweeps[impl].write_text(path.read_text().replace('"tiny"', '"two-rows"'))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    runs = {  # each of these exited 0 before the guards
        "no-isolate, SystemExit in .cpu()": (["--impl", "impls23:exits_in_cpu", "--level", "batched", "--no-isolate"], 3),
        "sweep, os._exit(0)": (["--sweep", str(sweeps["impls23:hard_exit"]), "--no-progress"], 3),
        "sweep, sys.exit(0) at import": (["--sweep", str(sweeps["exits23:f"]), "--no-progress"], 2),
        "impl, os._exit(0) at import": (["--impl", "hardexit23:f", "--level", "batched"], 2),
    }
    for what, (args, code) in runs.items():
        run = subprocess.run([sys.executable, "-m", "specref.verify", *args], capture_output=True, text=True,
                             timeout=300, env=env, cwd=ROOT)
        assert run.returncode == code, (what, run.stdout[-1000:], run.stderr[-1000:])


def test_vllm_coins_outputs_and_failures_are_statuses():
    """The vllm_coins level calls an implementation hundreds of times per case, in vLLM's call: a
    returned object that exits or hangs in its conversion, garbage, an exception of any class, or a
    kernel that follows its coins continuously gets a status; the reference passes."""
    from specref.verification.levels.coins import vllm_coins as ec

    case = [ec.default_vllm_coin_cases()[0]]
    ones = lambda *a: np.zeros((2, 3), dtype=np.int64)  # noqa: E731 - every row's first token 0: not the draft
    kinds = {"SystemExit in .cpu()": lambda *a: _Obj(shape=(2, 3), cpu=_exits()),
             "hanging __array__": lambda *a: _Obj(shape=(2, 3), array=_sleeps),
             "raises SystemExit": _raiser(SystemExit(0)), "raises KeyboardInterrupt": _raiser(KeyboardInterrupt()),
             "returns None": lambda *a: None, "wrong shape": lambda *a: np.zeros((3, 3), dtype=np.int64),
             "never the drafts": ones,
             "follows its coins": lambda *a: np.array([[int(1e6 * a[7].uniform_probs[0]) % 4, -1, -1]] * 2)}
    statuses = _clean(_tally(lambda fn: check("vllm_coins", fn, cases=case, time_limit=LIMIT), kinds,
                             {"reference": ec.vllm_coin_reference}))
    assert statuses["SystemExit in .cpu()"] == ["invalid output"] and statuses["hanging __array__"] == ["timeout"]
    assert statuses["raises KeyboardInterrupt"] == ["raised"] and statuses["wrong shape"] == ["invalid output"]
