"""The kinds of implementation, the small cases and the bad inputs that fuzz 0.3's surfaces.

Shared by ``tests/test_fuzz_coins_trees_mrv2.py`` (which asserts on them) and
``benchmarks/fuzz_record.py`` (which counts them into a JSON record), so that the test and the
record run the same kinds on the same inputs.  The surfaces: the coin levels ``batched_coins``,
``tree_coins`` and ``vllm_coins`` (SPEC §11.9, §11.11); ``mrv2`` (§11.10); the greedy levels
``greedy_tree`` and ``greedy_tree_step`` (§12.5); user-built trees at the ``tree`` level
(§12.4.1); the construction of ``CoinCase``, ``TreeCoinCase``, ``MRV2Case``, ``GreedyTreeCase``
and ``UserTreeCase``; ``check`` and ``plan``'s arguments (§13.1, §13.2); and the CLI (§13.3).

Outcome classes (those of ``tests/test_fuzz_surfaces.py``), per kind:

- **false ok**: a wrong kind whose report is ok;
- **false alarm**: a correct kind whose report is not ok;
- **escape**: an exception out of ``check``;
- **hang**: a check that ran past its calls' limits plus :data:`SLACK`;
- **crash**: an ``internal error`` status (the oracle's own failure, never an implementation's);

and per bad input (:data:`OUTCOMES`): **refused** by a ``SpecrefError`` naming the field or
argument, or **accepted** (taken, and judged with no internal error) -- else an escape, a crash,
a SpecrefError that names something else, or a bad value taken (a float held in an int field).

Each wrong kind is wrong on the small cases of its level (a coupling shows on two rows, a tie rule
on a row with a tie, a stale buffer on cases of the same shapes with other rows); each correct kind
is correct by the spec (another coin order at ``batched_coins``, a recovered token read off the
rejected coin at ``vllm_coins``, entries past ``num_sampled`` at ``mrv2``, declared split ties at
the greedy levels).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
import zlib
from dataclasses import dataclass, field
from fractions import Fraction as F
from functools import partial, wraps

import numpy as np
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from specref.core.errors import SpecrefError
from specref.core.tree import DraftTree
from specref.core.tree_verify import pointmass_verify
from specref.verification.levels import level_named
from specref.verification.levels.batched.mrv2 import MRV2Case, mrv2_reference
from specref.verification.levels.coins import kernels as C
from specref.verification.levels.coins import vllm_coins as VC
from specref.verification.levels.coins.kernels import CoinCase, TreeCoinCase
from specref.verification.levels.trees.greedy import (GreedyTreeCase, declare_ties, default_greedy_cases,
                                                      greedy_reference, greedy_step_reference, sglang_step)
from specref.verification.levels.trees.sampled import UserTreeCase, user_tree_cases
from specref.verification.oracle import check
from specref.verification.running.calling import Misbehaved
from specref.verification.running.report import INTERNAL
from specref.verification.zoo.trees import USER_TREE_BUGS

LIMIT_FLOOR = 0.2  # seconds per call of the implementation in the misbehaviour suite, at the least ...
LIMIT_MARGIN = 20.0  # ... else this many times the slowest call of specref's own implementations, measured here
CASE_LIMIT = 20.0  # seconds per case: every case here takes well under a second when it runs to its end
SLACK = 10.0  # seconds a check may take beyond its calls' limits before it counts as a hang
# the per-call limit itself comes from measured calls, once, when first asked for: limit() at the end of the module

LEVELS_03 = ("batched_coins", "tree_coins", "vllm_coins", "mrv2", "greedy_tree", "greedy_tree_step", "tree")
"""The surfaces with implementations: the six 0.3 levels and the tree level on user-built trees."""


def reference(level: str):
    """specref's own implementation at ``level``, found through the level object."""
    return level_named(level).reference_for()


# ---------------------------------------------------------------- small cases


def frac(rows) -> np.ndarray:
    """Nested lists of "a/b" strings -> an object array of Fractions."""
    def conv(r):
        return [conv(v) for v in r] if isinstance(r, (list, tuple)) else F(r)
    return np.array(conv(rows), dtype=object)


# B = 2, K = 1, V = 2, dyadic: every threshold a float32 grid point (tight), rows that survive a float32 softmax
P2 = frac([[["1/4", "3/4"], ["1/2", "1/2"]], [["3/4", "1/4"], ["1/4", "3/4"]]])
Q2 = frac([[["1/2", "1/2"]], [["1/2", "1/2"]]])
# drafts (0, 1): each row accepts with 1/2 and its residual is one token; drafts (1, 0): sure accepts, then the bonus rows
DRAFTS = (((0,), (1,)), ((1,), (0,)))


def coin_case(**changes) -> CoinCase:
    fields_ = dict(name="tiny-coins", p_target=P2, q_draft=Q2, drafts=DRAFTS)
    fields_.update(changes)
    return CoinCase(**fields_)


def vllm_case() -> CoinCase:
    """The level's own first case (B = 2, K = 2, V = 4): its residuals have two tokens or more, so
    that the exponential race is judged (on the tiny rows every residual is one token)."""
    return VC.default_vllm_coin_cases()[0]


def tree_coin_case() -> TreeCoinCase:
    """V = 4, top-2 children one of which has target probability 0, two trees per call."""
    return C.default_tree_coin_cases()[0]


# mrv2: row 0 at T = 2 with a draft row that T changes, row 1 at T = 1; the same rows with row 0 greedy (a tie
# at its bonus row); the rows swapped (other target logits of the same shapes: a stale buffer shows)
MQ = frac([[["3/4", "1/4"]], [["1/4", "3/4"]]])


def mrv2_cases() -> list:
    return [MRV2Case("tiny-mrv2-T2", P2, MQ, temperature=(2, 1)),
            MRV2Case("tiny-mrv2-greedy", P2, MQ, temperature=(0, 1)),
            MRV2Case("tiny-mrv2-swapped", P2[::-1].copy(), MQ[::-1].copy(), temperature=(1, 2))]


def greedy_cases() -> list:
    return default_greedy_cases()  # V = 4, five small cases (ties, duplicates, padding, a chain, no match)


def user_cases() -> list:
    by_name = {c.name: c for c in user_tree_cases()}
    return [by_name["topk-with-q"], by_name["deterministic-repeats"]]


def cases_of(level: str) -> list:
    return {"batched_coins": lambda: [coin_case()], "vllm_coins": lambda: [vllm_case()],
            "tree_coins": lambda: [tree_coin_case()], "mrv2": mrv2_cases, "greedy_tree": greedy_cases,
            "greedy_tree_step": greedy_cases, "tree": user_cases}[level]()


# ---------------------------------------------------------------- every level: exceptions, exits, hangs


class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError


class _BadBase(BaseException):
    pass


def _raiser(exc):
    def fn(*args, **kwargs):
        raise exc
    return fn


def _recursion(*args):
    return _recursion(*args)


EXCEPTIONS = {f"raises {e!r}": _raiser(e) for e in [
    ValueError("v"), TypeError("t"), ZeroDivisionError(), KeyError("k"), IndexError(), RuntimeError(), MemoryError(),
    AssertionError(), NotImplementedError(), StopIteration(), OverflowError(), FloatingPointError(), SystemExit(0),
    SystemExit(1), SystemExit("msg"), KeyboardInterrupt(), GeneratorExit(), _BadStr(), _BadBase(),
    SpecrefError("claims specref"), Misbehaved("ok", "claims ok"),
]}
EXCEPTIONS["recursion"] = _recursion


def _sleeps(*args):
    time.sleep(30)


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


ISOLATED_ONLY = {
    "sleeps": _sleeps, "busy loop": _busy, "retries on BaseException": _retry, "C-level hang": _c_hang,
    "blocks SIGALRM": _block_alarm, "ignores SIGALRM": _ignore_alarm, "os._exit(0)": _exit0, "os._exit(3)": _exit3,
    "abort": _abort, "segfault": _segv, "SIGKILL itself": _kill_self,
}
"""Kinds that would end or hang an in-process oracle: checked isolated only."""

_METHODS = {"cpu": "cpu", "array": "__array__", "iterate": "__iter__", "len": "__len__", "index": "__index__"}


def hostile(*, shape=(2, 2), **thunks):
    """An output whose ``.cpu()``, ``__array__``, ``__iter__``, ``__len__`` or ``__index__`` run a thunk."""
    namespace = {"__repr__": lambda self: "<hostile output>"}
    if shape is not None:
        namespace["shape"] = shape
    for name, thunk in thunks.items():
        namespace[_METHODS[name]] = (lambda t: lambda self, *a, **k: t())(thunk)
    return type("Hostile", (), namespace)()


def _exits(code=0):
    def fn():
        raise SystemExit(code)
    return fn


def _hang():
    time.sleep(30)


def _returns(make):
    return lambda *args: make()


class _BadNe(np.ndarray):
    def __ne__(self, other):
        raise SystemExit(0)


def _ids_garbage(B=2, K1=2, V=2):
    """Outputs that are not ``[B, K+1]`` ids (the batched levels' parser, SPEC §11.7)."""
    return {f"returns {name}": _returns(make) for name, make in [
        ("None", lambda: None), ("[]", lambda: []), ("int", lambda: 0), ("str", lambda: "ab"), ("bytes", lambda: b"\x00"),
        ("dict", lambda: {0: 1}), ("object", object), ("float ids", lambda: np.zeros((B, K1))),
        ("ids + 0.5", lambda: np.full((B, K1), 0.5)), ("bool ids", lambda: np.ones((B, K1), bool)),
        ("object ids", lambda: np.zeros((B, K1), dtype=object)), ("complex ids", lambda: np.zeros((B, K1), complex)),
        ("1-D ids", lambda: np.zeros(B, int)), ("3-D ids", lambda: np.zeros((B, K1, 1), int)),
        ("[B, K] ids", lambda: np.zeros((B, K1 - 1), int)), ("[B+1, K+1] ids", lambda: np.zeros((B + 1, K1), int)),
        ("id V", lambda: np.full((B, K1), V)), ("id -2", lambda: np.full((B, K1), -2)),
        ("placeholder gap", lambda: np.array([[-1, 0]] + [[0, 1]] * (B - 1))),
        ("empty rows", lambda: np.full((B, K1), -1)), ("uint64 max", lambda: np.full((B, K1), 2**64 - 1, np.uint64)),
        ("2**40", lambda: np.full((B, K1), 2**40)), ("ragged lists", lambda: [[0], [0, 1, 1]]),
        ("list of str", lambda: [["a", "b"]] * B), ("nan list", lambda: [[float("nan")] * K1] * B),
        ("4-tuple", lambda: (np.zeros((B, K1), int),) * 4),
        ("counts not ints", lambda: (np.zeros((B, K1), int), "ab")),
        ("counts wrong shape", lambda: (np.zeros((B, K1), int), np.zeros(5, int))),
        ("NaN counts", lambda: (np.array([[0, -1]] * B), np.full(B, np.nan))),
        ("counts 1.5", lambda: (np.array([[0, -1]] * B), np.full(B, 1.5))),
        ("generator", lambda: (r for r in [[0, 1]] * B)),
        ("raising __array__", lambda: hostile(array=_raiser(ValueError("array")))),
        ("SystemExit in __array__", lambda: hostile(array=_exits())),
        ("KeyboardInterrupt in __array__", lambda: hostile(array=_raiser(KeyboardInterrupt()))),
        ("SystemExit in .cpu()", lambda: hostile(cpu=_exits())),
        ("GeneratorExit in .cpu()", lambda: hostile(cpu=_raiser(GeneratorExit()))),
        ("__array__ not an array", lambda: hostile(array=lambda: 7)), ("hanging __array__", lambda: hostile(array=_hang)),
        ("hanging .cpu()", lambda: hostile(cpu=_hang)),
        ("ndarray subclass, SystemExit in !=", lambda: np.zeros((B, K1), int).view(_BadNe)),
    ]}


# ---------------------------------------------------------------- batched_coins


def _inv_cdf(w, u):
    """The first token whose cumulative weight passes ``u * total`` (a draw by inverse CDF, comparisons only)."""
    total, cum = sum(w), 0.0
    for j, wj in enumerate(w):
        cum += wj
        if wj > 0 and u * total < cum:
            return j
    return max(j for j in range(len(w)) if w[j] > 0)


def _coin_rows(p, q, x, u, f, *, share=False, share_final=False, resample_p=False, bonus_row0=False, never=False,
               always=False, off_by_one=False, inclusive=False, final_as_coin=False):
    """The chain rule on the coins row by row in float64 (all switches off: correct; dyadic rows are exact)."""
    p = np.asarray(p, dtype=np.float64)
    q = None if q is None else np.asarray(q, dtype=np.float64)
    x, u, f = np.asarray(x), np.asarray(u, dtype=np.float64), np.asarray(f, dtype=np.float64)
    B, K1, V = p.shape
    out = np.full((B, K1), -1, dtype=np.int64)
    for b in range(B):
        ub = u[0] if share else u[b]
        fb = f[0] if (share or share_final) else (ub[0] if final_as_coin else f[b])
        k = int((x[b] >= 0).sum())
        emitted = []
        for i in range(k):
            t = int(x[b, i])
            judge = p[b, min(i + 1, K1 - 1)] if off_by_one else p[b, i]
            qt = 1.0 if q is None else q[b, i, t]
            accept = always or (not never and (ub[i] * qt <= judge[t] if inclusive else ub[i] * qt < judge[t]))
            if accept:
                emitted.append(t)
                continue
            if resample_p:
                w = list(p[b, i])
            elif q is None:
                w = [v if j != t else 0.0 for j, v in enumerate(p[b, i])]
            else:
                w = [max(a - z, 0.0) for a, z in zip(p[b, i], q[b, i])]
            emitted.append(_inv_cdf(w if sum(w) > 0 else list(p[b, i]), fb))
            break
        else:
            emitted.append(_inv_cdf(list(p[b, 0] if bonus_row0 else p[b, k]), fb))
        out[b, :len(emitted)] = emitted
    return out


def _coins(**bug):
    return lambda p, q, x, u, f: _coin_rows(p, q, x, u, f, **bug)


def _coins_swapped_order(p, q, x, u, f):
    """(correct law) final_coins[b] tests draft 0 and uniform_coins[b, 0] draws the final token (SPEC §11.9: any order)."""
    u2 = np.array(u, copy=True)
    u2[:, 0] = f
    return C.engine_coin_kernel(p, q, x, u2, np.array(u[:, 0], copy=True))


def _coins_with_counts(p, q, x, u, f):
    out = C.engine_coin_kernel(p, q, x, u, f)
    n = (out >= 0).sum(axis=1)
    return out, n - 1, n


_SEEN_DRAFTS: dict = {}


def _coins_cached_by_drafts(p, q, x, u, f):
    """(wrong, keeps state) The output of the first call for these drafts, whatever the coins."""
    key = np.asarray(x).tobytes()
    if key not in _SEEN_DRAFTS:
        _SEEN_DRAFTS[key] = C.engine_coin_kernel(p, q, x, u, f)
    return _SEEN_DRAFTS[key].copy()


_OWN = np.random.default_rng(11)  # seeded: deterministic; still not the coins handed over


def _coins_own_uniforms(p, q, x, u, f):
    return C.engine_coin_kernel(p, q, x, _OWN.random(np.shape(u)).astype(np.asarray(u).dtype),
                                _OWN.random(np.shape(f)).astype(np.asarray(f).dtype))


def _coins_global_random(p, q, x, u, f):
    return C.engine_coin_kernel(p, q, x, np.random.random(np.shape(u)).astype(np.asarray(u).dtype), f)


def _coins_mutates_and_wrong(p, q, x, u, f):
    p[...] = 0.5
    return C.engine_coin_kernel(p, q, x, u, f)


def _coins_swapped_rows(p, q, x, u, f):
    return C.engine_coin_kernel(p, q, x, u, f)[::-1].copy()


def _coins_ignores_coins(p, q, x, u, f):
    return C.engine_coin_kernel(p, q, x, np.zeros_like(u), np.zeros_like(f))


def _coins_wrong_counts(p, q, x, u, f):
    out = C.engine_coin_kernel(p, q, x, u, f)
    return out, (out >= 0).sum(axis=1) + 1


BATCHED_COINS_WRONG = {
    "shares row 0's coins": _coins(share=True), "shares the final coin": _coins(share_final=True),
    "residual from p": _coins(resample_p=True), "bonus from p[0]": _coins(bonus_row0=True),
    "never accepts": _coins(never=True), "accepts every draft": _coins(always=True),
    "judges with the next row": _coins(off_by_one=True), "final token from draft 0's coin": _coins(final_as_coin=True),
    "inclusive u * q <= p": C.inclusive_zero_kernel, "inclusive at the threshold": C.threshold_inclusive_kernel,
    "coins taken for (0, 1]": C.one_minus_coin_kernel, "swapped rows": _coins_swapped_rows,
    "ignores its coins": _coins_ignores_coins, "n_emitted off by one": _coins_wrong_counts,
    "caches its output by drafts": _coins_cached_by_drafts, "own generator": _coins_own_uniforms,
    "global np.random": _coins_global_random, "writes its rows, wrong": _coins_mutates_and_wrong,
}
BATCHED_COINS_CORRECT = {
    "reference (engine_coin_kernel)": reference("batched_coins"), "plain Python rows": _coins(),
    "(tokens, n_accepted, n_emitted)": _coins_with_counts,
    "list of lists": lambda *a: C.engine_coin_kernel(*a).tolist(),
    "int32 ids": lambda *a: C.engine_coin_kernel(*a).astype(np.int32),
    "another coin order": _coins_swapped_order,
}

# A narrow wrong piece of the final coin, away from every threshold (SPEC §11.9: ok to the stated resolution
# at 16 probes per coin; a case with probes >= 2^10 sees it)
WINDOW = (0.3, 0.3 + 2.0 ** -10)


def coins_window_kernel(p, q, x, u, f):
    """(wrong) The engine kernel, but the last token moves one id up while the final coin is in WINDOW."""
    out = C.engine_coin_kernel(p, q, x, u, f)
    for b in range(out.shape[0]):
        if WINDOW[0] <= f[b] < WINDOW[1]:
            last = int((out[b] >= 0).sum()) - 1
            out[b, last] = (out[b, last] + 1) % np.shape(p)[2]
    return out


def tree_window_kernel(candidates, first, sibling, u, u_final, p):
    """(wrong) SGLang's coin kernel, but the next token moves one id up while the final coin is in WINDOW."""
    accept, tokens = C.sglang_coin_kernel(candidates, first, sibling, u, u_final, p)
    return accept, [(t + 1) % np.shape(p)[2] if WINDOW[0] <= u_final[b] < WINDOW[1] else t for b, t in enumerate(tokens)]


def fine_coin_case() -> CoinCase:
    """B = 1, K = 1, V = 3 (two coins), 2^10 probes per coin: the WINDOW is a probed piece."""
    return CoinCase("one-row-fine", frac([[["1/2", "1/4", "1/4"], ["1/4", "1/2", "1/4"]]]),
                    frac([[["1/4", "1/2", "1/4"]]]), drafts=(((1,),),), probes=2**10)


# ---------------------------------------------------------------- vllm_coins


def _vllm(accept=None, race_rows=None):
    accept = accept or (lambda px, qx, u: qx > 0 and u < px / qx)
    return lambda *args: VC._vllm_numpy(*args, accept=accept, race_rows=race_rows or VC._residual32)


def _vllm_race_switch(threshold):
    """(wrong) The race on p, not the residual, when the rejected coin is >= threshold."""
    def kernel(*args):
        seen = {}

        def accept(px, qx, u):
            seen["u"] = u
            return qx > 0 and u < px / qx

        return VC._vllm_numpy(*args, accept=accept,
                              race_rows=lambda p, q, x: p.copy() if seen["u"] >= threshold else VC._residual32(p, q, x))
    return kernel


def _vllm_clamped_at_8(*args):
    """(wrong) Every exponential clamped at 8: no race in the tail."""
    import dataclasses

    meta = args[7]
    clamped = np.minimum(np.asarray(meta.exponentials, dtype=np.float32), np.float32(8))
    return VC.vllm_coin_reference(*args[:7], dataclasses.replace(meta, exponentials=clamped))


def _vllm_other_bonus(*args):
    out = VC.vllm_coin_reference(*args)
    V = np.shape(args[5])[1]
    for b, n in enumerate(args[1]):
        if out[b, n] >= 0 and out[b, n] == int(np.asarray(args[6]).reshape(-1)[b]):
            out[b, n] = (out[b, n] + 1) % V
    return out


def _vllm_shared_exponentials(*args):
    import dataclasses

    meta = args[7]
    E = np.asarray(meta.exponentials, dtype=np.float32)
    return VC.vllm_coin_reference(*args[:7], dataclasses.replace(meta, exponentials=np.repeat(E[:1], len(E), axis=0)))


def _vllm_ignores_exponentials(*args):
    import dataclasses

    meta = args[7]
    return VC.vllm_coin_reference(*args[:7], dataclasses.replace(meta, exponentials=np.ones_like(meta.exponentials)))


def _vllm_from_rejected_coin(*args):
    """(correct law, no race) The recovered token by inverse CDF of the residual at (u - a)/(1 - a): the
    rejected coin rescaled, uniform given the rejection (SPEC §11.11: judged by its law)."""
    seen = {}

    def accept(px, qx, u):
        seen["a"] = min(1.0, float(px) / float(qx)) if qx > 0 else 0.0
        seen["u"] = float(u)
        return qx > 0 and u < px / qx

    def one_hot(p, q, x):
        s = VC._residual32(p, q, x).astype(np.float64)
        r = (seen["u"] - seen["a"]) / (1 - seen["a"])
        out = np.zeros_like(p)
        out[min(int(np.searchsorted(np.cumsum(s) / s.sum(), r, side="right")), len(p) - 1)] = 1
        return out

    return VC._vllm_numpy(*args, accept=accept, race_rows=one_hot)


VLLM_COINS_WRONG = {
    "never accepts": _vllm(accept=lambda px, qx, u: False), "accepts every draft": _vllm(accept=lambda px, qx, u: True),
    "races on p (vllm_race_on_p_kernel)": VC.vllm_race_on_p_kernel,
    "inclusive p / q >= u (vllm_inclusive_kernel)": VC.vllm_inclusive_kernel,
    "races on p above u = 0.9": _vllm_race_switch(0.9), "exponentials clamped at 8": _vllm_clamped_at_8,
    "not the caller's bonus token": _vllm_other_bonus, "row 0's exponentials for every row": _vllm_shared_exponentials,
    "ignores the exponentials": _vllm_ignores_exponentials,
    "races on the uniform row": _vllm(race_rows=lambda p, q, x: np.ones_like(p)),
}
VLLM_COINS_CORRECT = {
    "reference (vllm_coin_reference)": reference("vllm_coins"),
    "int64 ids": lambda *a: VC.vllm_coin_reference(*a).astype(np.int64),
    "list of lists": lambda *a: VC.vllm_coin_reference(*a).tolist(),
    "token read off the rejected coin": _vllm_from_rejected_coin,
}


# ---------------------------------------------------------------- tree_coins


def _tree_rows_shared(c, f, s, u, uf, p):
    u, uf = np.asarray(u), np.asarray(uf)
    return C.sglang_coin_kernel(c, f, s, np.repeat(u[:1], len(u), axis=0), np.repeat(uf[:1], len(uf)), p)


def _tree_final_shared(c, f, s, u, uf, p):
    uf = np.asarray(uf)
    return C.sglang_coin_kernel(c, f, s, u, np.repeat(uf[:1], len(uf)), p)


def _tree_copies_row0(c, f, s, u, uf, p):
    a, t = C.sglang_coin_kernel(c, f, s, u, uf, p)
    return [a[0]] * len(a), [t[0]] * len(t)


def _tree_ignores_coins(c, f, s, u, uf, p):
    return [[0, -1]] * len(c), [int(np.argmax(np.asarray(p)[b, 0])) for b in range(len(c))]


def _tree_from_p(c, f, s, u, uf, p):
    """(wrong) The next token from the node's target row, the tried children not removed."""
    a, _ = C.sglang_coin_kernel(c, f, s, u, uf, p)
    p = np.asarray(p)
    tokens = []
    for b, row in enumerate(a):
        last = [n for n in row if n >= 0][-1]
        cdf = np.cumsum(p[b, last])
        tokens.append(min(int(np.sum(cdf <= uf[b] * cdf[-1])), int(np.flatnonzero(p[b, last] > 0)[-1])))
    return a, tokens


def _tree_first_child_always(c, f, s, u, uf, p):
    accepts, tokens = [], []
    for b in range(len(c)):
        row, cur = [0], 0
        while f[b][cur] != -1:
            cur = f[b][cur]
            row.append(cur)
        accepts.append(row)
        tokens.append(int(np.argmax(np.asarray(p)[b, cur])))
    width = max(map(len, accepts))
    return [r + [-1] * (width - len(r)) for r in accepts], tokens


def _tree_argmax_token(c, f, s, u, uf, p):
    """(wrong) The next token the residual's most likely one, whatever the final coin."""
    a, _ = C.sglang_coin_kernel(c, f, s, u, np.zeros_like(np.asarray(uf)), p)
    p = np.asarray(p)
    tokens = []
    for b, row in enumerate(a):
        last = [n for n in row if n >= 0][-1]
        w = p[b, last].copy()
        tried, child = [], f[b][last]
        while child != -1 and child not in row:
            tried.append(c[b][child])
            child = s[b][child]
        w[tried] = 0
        tokens.append(int(np.argmax(w)))
    return a, tokens


def _tree_garbled(change):
    def kernel(*args):
        accept, tokens = C.sglang_coin_kernel(*args)
        return change([list(a) for a in accept]), tokens
    return kernel


TREE_COINS_WRONG = {
    "inclusive u <= running sum (sglang_inclusive_kernel)": C.sglang_inclusive_kernel,
    "shares row 0's coins": _tree_rows_shared, "shares the final coin": _tree_final_shared,
    "copies row 0": _tree_copies_row0, "ignores its coins": _tree_ignores_coins,
    "next token from p, tried children kept": _tree_from_p, "first child always": _tree_first_child_always,
    "float ids (2.75)": _tree_garbled(lambda acc: [[a[0]] + [i + 0.75 if i >= 0 else i for i in a[1:]] for a in acc]),
    "float64 accept_index": _tree_garbled(lambda acc: np.array(acc, dtype=np.float64)),
    "-1 before an accepted node": _tree_garbled(lambda acc: [[a[0], -1] + a[1:] for a in acc]),
    "root entry 5": _tree_garbled(lambda acc: [[5] + a[1:] for a in acc]),
    "bool root entry": _tree_garbled(lambda acc: [[True] + a[1:] for a in acc]),
    "next token ignores the final coin": _tree_argmax_token,
    "root padding only": _tree_garbled(lambda acc: [[-1] * len(a) for a in acc]),
    "accepted node twice": _tree_garbled(lambda acc: [a[:2] + a[1:2] + a[2:] for a in acc]),
    **{f"returns {name}": _returns(make) for name, make in [
        ("None", lambda: None), ("one row", lambda: ([[0, -1]], [0])), ("three rows", lambda: ([[0, -1]] * 3, [0] * 3)),
        ("tokens short", lambda: ([[0, -1]] * 2, [0])), ("node 9", lambda: ([[0, 9]] * 2, [0, 0])),
        ("token V", lambda: ([[0, -1]] * 2, [4, 4])), ("float tokens", lambda: ([[0, -1]] * 2, [0.5, 0.5])),
        ("bool tokens", lambda: ([[0, -1]] * 2, [True, True])), ("str rows", lambda: ("ab", [0, 0])),
        ("endless rows", lambda: ([itertools.count(), itertools.count()], [0, 0])),
        ("object iterating to SystemExit", lambda: hostile(iterate=_exits())),
        ("hanging iteration", lambda: hostile(iterate=_hang)),
        ("rows that exit", lambda: (hostile(iterate=_exits()), [0, 0])),
    ]},
}
TREE_COINS_CORRECT = {
    "reference (sglang_coin_kernel)": reference("tree_coins"),
    "NumPy outputs": lambda *a: tuple(np.asarray(v) for v in C.sglang_coin_kernel(*a)),
    "int64 tokens": lambda *a: (lambda out: (out[0], np.asarray(out[1], dtype=np.int64)))(C.sglang_coin_kernel(*a)),
}


# ---------------------------------------------------------------- mrv2


def _no_temperature(tl, dl, ds, cu, pos, idx, eidx, elp, temp, seed, k):
    """(wrong) The draft logits used as if the temperature were applied already."""
    return mrv2_reference(tl, None if dl is None else dl * temp[:, None, None], ds, cu, pos, idx, eidx, elp, temp, seed, k)


# ignores q, reads slot r, ties to the highest id: the mrv2 level's own wrong variants
from tests.test_mrv2_level import _by_request, _ignores_q, _ties_highest  # noqa: E402


def _greedy_sampled(tl, dl, ds, cu, pos, idx, eidx, elp, temp, seed, k):
    """(wrong) Temperature 0 taken as 1: greedy rows sampled."""
    t2 = np.where(temp == 0, np.float32(1), temp)
    return mrv2_reference(tl, dl, ds, cu, pos, idx, eidx, elp, t2, seed, k)


_MRV2_BUFFERS: dict = {}


def _stale_mrv2(target_logits, *rest):
    """(wrong, keeps state) A scratch copy of the target logits made once per vocabulary size, never refreshed."""
    V = np.shape(target_logits)[1]
    if V not in _MRV2_BUFFERS:
        _MRV2_BUFFERS[V] = np.array(target_logits, copy=True)
    return mrv2_reference(_MRV2_BUFFERS[V], *rest)


def _mrv2_writes(name_index):
    def fn(*args):
        a = args[name_index]
        a.reshape(-1)[:1] = a.reshape(-1)[:1]
        return mrv2_reference(*args)
    return fn


def _mrv2_own_rng(*args):
    return mrv2_reference(*args[:9], _OWN, args[10])


def _mrv2_counts(change):
    def fn(*args):
        sampled, num = mrv2_reference(*args)
        return change(sampled, num)
    return fn


def _mrv2_garbage_past(*args):
    """(correct) Entries past num_sampled are ignored (MRV2 leaves them unset): filled with 7 here."""
    sampled, num = mrv2_reference(*args)
    sampled = sampled.copy()
    sampled[np.arange(sampled.shape[1])[None, :] >= num[:, None]] = 7
    return sampled, num


MRV2_WRONG = {
    "temperature not applied to the draft": _no_temperature, "ignores q": _ignores_q,
    "reads slot r, not idx_mapping[r]": _by_request, "greedy ties to the highest id": _ties_highest,
    "greedy rows sampled": _greedy_sampled, "stale target buffer": _stale_mrv2,
    "writes target_logits": _mrv2_writes(0), "writes temperature": _mrv2_writes(8),
    "writes draft_sampled": _mrv2_writes(2), "own generator": _mrv2_own_rng,
    "num_sampled + 1": _mrv2_counts(lambda s, n: (s, n + 1)), "num_sampled 0": _mrv2_counts(lambda s, n: (s, n * 0)),
    "float sampled": _mrv2_counts(lambda s, n: (s + 0.5, n)), "float num_sampled": _mrv2_counts(lambda s, n: (s, n + 0.5)),
    "NaN num_sampled": _mrv2_counts(lambda s, n: (s, np.full(n.shape, np.nan))),
    "sampled token V": _mrv2_counts(lambda s, n: (np.where(s >= 0, 9, s), n)),
    "sampled [R, K]": _mrv2_counts(lambda s, n: (s[:, :1], n)), "one output": _mrv2_counts(lambda s, n: s),
    "-1 inside the emitted tokens": _mrv2_counts(lambda s, n: (np.where(np.arange(s.shape[1]) == 0, -1, s), n)),
    "rows swapped": _mrv2_counts(lambda s, n: (s[::-1].copy(), n[::-1].copy())),
    "num_sampled [R + 1]": _mrv2_counts(lambda s, n: (s, np.append(n, 1))),
    **{f"returns {name}": _returns(make) for name, make in [
        ("None", lambda: None), ("str", lambda: "ab"), ("3-tuple", lambda: (np.zeros((2, 2), int),) * 3),
        ("SystemExit in __array__", lambda: (hostile(array=_exits()), np.ones(2, np.int32))),
        ("hanging __array__", lambda: (hostile(array=_hang), np.ones(2, np.int32))),
        ("object iterating to SystemExit", lambda: hostile(iterate=_exits(), shape=None)),
    ]},
}
MRV2_CORRECT = {
    "reference (mrv2_reference)": reference("mrv2"),
    "int32 sampled": _mrv2_counts(lambda s, n: (s.astype(np.int32), n)),
    "lists": _mrv2_counts(lambda s, n: (s.tolist(), n.tolist())),
    "entries past num_sampled filled": _mrv2_garbage_past,
    "int64 num_sampled": _mrv2_counts(lambda s, n: (s, n.astype(np.int64))),
}


# ---------------------------------------------------------------- greedy_tree (SGLang's call, in place)


def _greedy_functional(*args):
    """(correct) Returns new output arrays instead of writing the ones handed over."""
    outs = [np.array(a, copy=True) for a in args[:3]]
    greedy_reference(*outs, *args[3:])
    return tuple(outs)


def _greedy_accepts_nothing(predicts, accept_index, accept_token_num, candidates, retrieve_index, first, sibling,
                            target_predict):
    flat = np.asarray(target_predict).reshape(-1)
    for b in range(len(candidates)):
        root = int(retrieve_index[b][0])
        accept_index[b][0], accept_token_num[b], predicts[root] = root, 0, flat[root]


def _greedy_last_match(predicts, accept_index, accept_token_num, candidates, retrieve_index, first, sibling,
                       target_predict):
    """(wrong) Accepts the last child carrying the argmax in sibling order, not the first."""
    S = accept_index.shape[1]
    flat = np.asarray(target_predict).reshape(-1)
    for b in range(len(candidates)):
        cur, last, n = 0, int(retrieve_index[b][0]), 0
        accept_index[b][0] = last
        for _ in range(1, S):
            want, child, found = flat[last], int(first[b][cur]), -1
            while child != -1:
                if candidates[b][child] == want:
                    found = child
                child = int(sibling[b][child])
            if found == -1:
                break
            predicts[last] = want
            n += 1
            last = int(retrieve_index[b][found])
            accept_index[b][n] = last
            cur = found
        accept_token_num[b] = n
        predicts[last] = flat[last]


def _greedy_scans(predicts, accept_index, accept_token_num, candidates, retrieve_index, first, sibling, target_predict):
    """(wrong) At the root, finds the argmax's node by scanning the candidates, not by following the links."""
    flat = np.asarray(target_predict).reshape(-1)
    for b in range(len(candidates)):
        root = int(retrieve_index[b][0])
        accept_index[b][0] = root
        hits = [j for j in range(1, len(candidates[b])) if candidates[b][j] == flat[root]]
        if not hits:
            accept_token_num[b], predicts[root] = 0, flat[root]
            continue
        j = hits[-1]
        predicts[root] = flat[root]
        accept_index[b][1], accept_token_num[b] = int(retrieve_index[b][j]), 1
        predicts[int(retrieve_index[b][j])] = flat[int(retrieve_index[b][j])]


def _greedy_one_level_short(predicts, accept_index, accept_token_num, *rest):
    greedy_reference(predicts, accept_index[:, :-1], accept_token_num, *rest)


def _greedy_writes(index):
    def fn(*args):
        args[index][(0,) * np.ndim(args[index])] = args[index][(0,) * np.ndim(args[index])]
        greedy_reference(*args)
    return fn


_GREEDY_CACHE: dict = {}


def _greedy_cached(*args):
    """(wrong, keeps state) The outputs of the first call of each shape, whatever the inputs."""
    key = tuple(np.shape(a) for a in args)
    if key not in _GREEDY_CACHE:
        greedy_reference(*args)
        _GREEDY_CACHE[key] = [np.array(a, copy=True) for a in args[:3]]
    return tuple(np.array(a, copy=True) for a in _GREEDY_CACHE[key])


def _greedy_outputs(change):
    def fn(*args):
        greedy_reference(*args)
        return change(*args[:3])
    return fn


def _greedy_root_wrong(predicts, accept_index, accept_token_num, *rest):
    greedy_reference(predicts, accept_index, accept_token_num, *rest)
    accept_index[:, 0] += 1


def _greedy_entries_after(predicts, accept_index, accept_token_num, *rest):
    greedy_reference(predicts, accept_index, accept_token_num, *rest)
    accept_index[:, -1] = accept_index[:, 0]
    accept_token_num[:] = 0


def _greedy_predicts_off(predicts, *rest):
    greedy_reference(predicts, *rest)
    predicts[:] = (predicts + 1) % 4


GREEDY_TREE_WRONG = {
    "accepts nothing": _greedy_accepts_nothing, "last matching child": _greedy_last_match,
    "scans the candidates": _greedy_scans, "one level short": _greedy_one_level_short,
    "writes candidates": _greedy_writes(3), "writes target_predict": _greedy_writes(7),
    "writes retrieve_next_token": _greedy_writes(5), "caches its outputs by shape": _greedy_cached,
    "accept_index[b, 0] not the root": _greedy_root_wrong, "entries after the accepted nodes": _greedy_entries_after,
    "predicts disagree": _greedy_predicts_off,
    "accept_token_num out of range": _greedy_outputs(lambda pr, ai, n: (pr, ai, n + 9)),
    "str outputs": _greedy_outputs(lambda *o: tuple(a.astype(str) for a in o)),
    "ids + 0.5": _greedy_outputs(lambda pr, ai, n: (pr + 0.5, ai, n)),
    "bool outputs": _greedy_outputs(lambda pr, ai, n: (pr.astype(bool), ai, n)),
    "object outputs": _greedy_outputs(lambda pr, ai, n: (pr.astype(object), ai, n)),
    "wrong shapes": _greedy_outputs(lambda pr, ai, n: (pr[:1], ai, n)),
    **{f"returns {name}": _returns(make) for name, make in [
        ("SystemExit in __array__", lambda: (hostile(array=_exits()),) * 3),
        ("KeyboardInterrupt in __array__", lambda: (hostile(array=_raiser(KeyboardInterrupt())),) * 3),
        ("hanging __array__", lambda: (hostile(array=_hang),) * 3), ("str", lambda: ("ab", "cd", "ef")),
    ]},
    "does nothing": lambda *args: None,
    "float accept_index": _greedy_outputs(lambda pr, ai, n: (pr, ai.astype(np.float64), n)),
    "accept_token_num -1": _greedy_outputs(lambda pr, ai, n: (pr, ai, n * 0 - 1)),
    "bool accept_index": _greedy_outputs(lambda pr, ai, n: (pr, ai.astype(bool), n)),
}
GREEDY_TREE_CORRECT = {
    "reference (greedy_reference)": reference("greedy_tree"), "returns new arrays": _greedy_functional,
    "declared split ties": declare_ties(greedy_reference, "split"),
    "int64 outputs": _greedy_outputs(lambda *o: tuple(a.astype(np.int64) for a in o)),
    "int16 outputs": _greedy_outputs(lambda *o: tuple(a.astype(np.int16) for a in o)),
}


# ---------------------------------------------------------------- greedy_tree_step


def _argmax_step(tree, p_target, rng, *, pick=lambda tied, rng: tied[0], depth_first=False, stop=False):
    rows = np.asarray(p_target)
    path, cur = [], 0
    while True:
        row = list(rows[cur])
        top = max(row)
        t = pick([j for j, v in enumerate(row) if v == top], rng)
        child = next((c for c in tree.children(cur) if tree.tokens[c] == t), None)
        if depth_first and tree.children(cur):
            child = tree.children(cur)[0]
        if child is None or stop:
            return path, int(t)
        path.append(child)
        cur = child


def _rewrites_its_tree(tree, p_target, rng):
    object.__setattr__(tree, "tokens", (-1,) + (len(p_target[0]),) * (tree.size - 1))
    row = [float(v) for v in p_target[0]]
    return [], row.index(max(row))


def _poisons_tables(tree, p_target, rng):
    tree.children(0)
    object.__setattr__(tree, "_shape_tables", ([[] for _ in range(tree.size)], [0] * tree.size))
    return greedy_step_reference(tree, p_target, rng)


def _writes_rows(tree, p_target, rng):
    p_target[0, 0] = p_target[0, 0]
    return greedy_step_reference(tree, p_target, rng)


def _adds_attribute(tree, p_target, rng):
    object.__setattr__(tree, "seen", True)
    return greedy_step_reference(tree, p_target, rng)


def _step_out(change):
    def fn(tree, p_target, rng):
        path, token = greedy_step_reference(tree, p_target, rng)
        return change(path, token)
    return fn


_STEP_CACHE: dict = {}


def _step_cached(tree, p_target, rng):
    key = np.shape(p_target)
    if key not in _STEP_CACHE:
        _STEP_CACHE[key] = greedy_step_reference(tree, p_target, rng)
    return _STEP_CACHE[key]


def _copies_then_writes(tree, p_target, rng):
    """(correct) Writes into its own copy of the rows, never into the rows handed over."""
    rows = np.array(p_target, copy=True)
    rows[0, 0] = rows[0, 0]
    return greedy_step_reference(tree, rows, rng)


GREEDY_STEP_WRONG = {
    "rewrites its tree": _rewrites_its_tree, "poisons the tree's shape tables": _poisons_tables,
    "writes its rows": _writes_rows, "adds an attribute to its tree": _adds_attribute,
    "ties to the highest id": partial(_argmax_step, pick=lambda tied, rng: tied[-1]),
    "ties from the rng (declared lowest)": partial(_argmax_step, pick=lambda tied, rng: int(rng.choice(tied))),
    "declares split, breaks to the lowest": declare_ties(greedy_step_reference, "split"),
    "stops at the root": partial(_argmax_step, stop=True), "first child always": partial(_argmax_step, depth_first=True),
    "caches its output by shape": _step_cached,
    "float token": _step_out(lambda p, t: (p, t + 0.5)), "integral float token": _step_out(lambda p, t: (p, float(t))),
    "bool token": _step_out(lambda p, t: (p, True)), "str token": _step_out(lambda p, t: (p, str(t))),
    "token V": _step_out(lambda p, t: (p, 4)), "token -1": _step_out(lambda p, t: (p, -1)),
    "0-d float token": _step_out(lambda p, t: (p, np.array(float(t)))),
    "float path": _step_out(lambda p, t: ([float(n) for n in p] or [1.0], t)),
    "bool path": _step_out(lambda p, t: ([True] + list(p), t)),
    "path None": _step_out(lambda p, t: (None, t)), "root in the path": _step_out(lambda p, t: ([0] + list(p), t)),
    "grandchild first": _step_out(lambda p, t: (list(p)[1:] or [3], t)),
    "endless path": _step_out(lambda p, t: (itertools.count(1), t)),
    "one item": _step_out(lambda p, t: (p,)), "three items": _step_out(lambda p, t: (p, t, t)),
    **{f"returns {name}": _returns(make) for name, make in [
        ("None", lambda: None), ("str", lambda: "ab"), ("dict", lambda: {0: 1}),
        ("object iterating to SystemExit", lambda: hostile(iterate=_exits(), shape=None)),
        ("object whose iteration hangs", lambda: hostile(iterate=_hang, shape=None)),
        ("token whose __index__ exits", lambda: ([], hostile(index=_exits(), shape=None))),
    ]},
}
GREEDY_STEP_CORRECT = {
    "reference (greedy_step_reference)": reference("greedy_tree_step"),
    "SGLang kernel as a step": sglang_step(greedy_reference),
    "NumPy path, 0-d token": _step_out(lambda p, t: (np.array(p, dtype=np.int64), np.int64(t))),
    "tuple path": _step_out(lambda p, t: (tuple(p), t)), "generator path": _step_out(lambda p, t: (iter(p), t)),
    "declared split ties, drawn from the rng": declare_ties(partial(greedy_step_reference, ties="split"), "split"),
    "copies its rows, then writes them": _copies_then_writes,
}


# ---------------------------------------------------------------- the tree level on user-built trees


def _user_garbage():
    return {f"returns {name}": _returns(make) for name, make in [
        ("None", lambda: None), ("token V", lambda: ([], 3)), ("float token", lambda: ([], 1.5)),
        ("node 99", lambda: ([99], 0)), ("path None", lambda: (None, 0)),
        ("object iterating to SystemExit", lambda: hostile(iterate=_exits(), shape=None)),
    ]}


def _user_writes_q(tree, p_target, q_draft, rng):
    if q_draft is not None:
        q_draft[0, 0] = q_draft[0, 0]
    return pointmass_verify(tree, p_target, q_draft, rng)


USER_TREE_WRONG = {**{f"zoo: {name}": bug.fn for name, bug in USER_TREE_BUGS.items()}, **_user_garbage(),
                   "writes its q rows": _user_writes_q,
                   "first child, argmax token": lambda tree, p, q, rng: ([tree.children(0)[0]],
                                                                          int(np.argmax(p[tree.children(0)[0]])))}
USER_TREE_CORRECT = {"pointmass_verify": pointmass_verify,
                     "pointmass_verify, NumPy path": lambda tree, p, q, rng: (lambda out: (np.array(out[0], dtype=np.int64),
                                                                                          np.int64(out[1])))(
                         pointmass_verify(tree, p, q, rng))}


# ---------------------------------------------------------------- per level


WRONG = {"batched_coins": BATCHED_COINS_WRONG, "vllm_coins": VLLM_COINS_WRONG, "tree_coins": TREE_COINS_WRONG,
         "mrv2": MRV2_WRONG, "greedy_tree": GREEDY_TREE_WRONG, "greedy_tree_step": GREEDY_STEP_WRONG,
         "tree": USER_TREE_WRONG}
"""The level's own wrong kinds (besides :data:`EXCEPTIONS` and the garbage outputs)."""

CORRECT = {"batched_coins": BATCHED_COINS_CORRECT, "vllm_coins": VLLM_COINS_CORRECT, "tree_coins": TREE_COINS_CORRECT,
           "mrv2": MRV2_CORRECT, "greedy_tree": GREEDY_TREE_CORRECT, "greedy_tree_step": GREEDY_STEP_CORRECT,
           "tree": USER_TREE_CORRECT}


def bad_kinds(level: str) -> dict:
    """Every wrong kind at ``level``: the exceptions, the level's garbage outputs, its wrong kinds."""
    garbage = _ids_garbage() if level in ("batched_coins", "vllm_coins") else {}
    return {**EXCEPTIONS, **garbage, **WRONG[level]}


def kind_count() -> dict:
    return {level: {"wrong": len(bad_kinds(level)), "correct": len(CORRECT[level])} for level in LEVELS_03}


# ---------------------------------------------------------------- running kinds: the outcome classes


@dataclass
class Tally:
    """What a run of kinds found: each list names the kinds of one outcome class."""

    tried: int = 0
    escaped: list = field(default_factory=list)
    false_ok: list = field(default_factory=list)
    false_alarm: list = field(default_factory=list)
    hangs: list = field(default_factory=list)
    crashes: list = field(default_factory=list)
    statuses: dict = field(default_factory=dict)
    seconds: float = 0.0

    def failures(self) -> dict:
        return {"escape": self.escaped, "false ok": self.false_ok, "false alarm": self.false_alarm,
                "hang": self.hangs, "crash": self.crashes}

    def clean(self) -> bool:
        return not any(self.failures().values())


def tally(level: str, kinds: dict, correct: dict = (), *, cases=None, calls: int = 1, **settings) -> Tally:
    """Check every kind at ``level`` on ``cases`` (default: the level's small cases; a kind whose name says
    it hangs: the first of them): each wrong kind must not be ok, each correct kind must be ok, nothing
    may escape, hang or be an internal error."""
    out = Tally()
    correct = dict(correct)
    settings = {**suite_settings(), **settings}
    started = time.monotonic()
    for name, fn in {**kinds, **correct}.items():
        out.tried += 1
        t0 = time.monotonic()
        chosen = cases_of(level) if cases is None else cases
        if "hang" in name:  # each case would wait out the time limit: the first shows the time-out
            chosen = chosen[:1]
        try:
            report = check(level, fn, cases=chosen, **settings)
        except BaseException as e:  # noqa: BLE001 - counted: nothing may escape
            out.escaped.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
            continue
        took = time.monotonic() - t0
        if took > calls * settings["time_limit"] * max(1, len(report.results)) + SLACK:
            out.hangs.append(f"{name}: {took:.1f} s")
        out.statuses[name] = [r.status for r in report.results]
        if any(r.status == INTERNAL for r in report.results):
            out.crashes.append(f"{name}: {[r.detail[:300] for r in report.results if r.status == INTERNAL]}")
        if name in correct:
            if not report.ok:
                bad = [r for r in report.results if r.status != "ok"]
                out.false_alarm.append(f"{name}: {[r.status for r in report.results]} {bad[0].detail[:300]}")
        elif report.ok:
            out.false_ok.append(f"{name}: {out.statuses[name]}")
    out.seconds = time.monotonic() - started
    return out


# ---------------------------------------------------------------- bad inputs: case fields and arguments


class _Weird:
    def __repr__(self):
        return "<weird>"


BAD_VALUES = [
    None, "abc", "", b"x", 3, -1, 0, 2**70, 10**400, -10**400, 1.5, 2.0, float("nan"), float("inf"), -float("inf"), True,
    False, [], [[]], {}, (), (1.5,), ("a",), (None,), (10**400,), (-1,), (float("nan"),), _Weird(), object,
    np.random.Generator, np.array([]), np.zeros((0, 2)), np.full((2, 2, 2), np.nan), -P2, P2 * 2, P2[..., :1], P2[None],
    np.full((2, 2, 2), 0.5, dtype=np.float16), np.full((2, 2, 2), 0.5 + 0j), np.array([["a", "b"]]), F(1, 3),
    lambda *a: None,
]
"""Wrong types, NaN, infinities, negatives, huge ints (10**400), strings, None, floats where ints belong,
empty and malformed arrays: the pool every case field and argument is fuzzed with (with hypothesis's
own floats, integers and text besides)."""

SEED = 2026
"""Every property is drawn with ``@seed(seed_of(surface))``: the test and the record draw the same inputs."""
FUZZ = settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate])  # no shrinking: a failing input is reported as drawn
FUZZ_FEW = settings(FUZZ, max_examples=6)
FUZZ_MANY = settings(FUZZ, max_examples=60)

VALUES = st.one_of(st.sampled_from(BAD_VALUES),
                   st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**400), 10**400),
                             st.text(max_size=3), st.tuples(st.floats(), st.integers(-3, 3))))
"""A drawn bad value: half the time one of the pool, else any float, int (to 10**400), short string or pair."""

_TOKENS = [np.array([[0, -1], [1, -1]]), np.array([[0, 1], [1, 0]]), np.array([[1, -1], [0, -1]]),
           np.array([[0, 1], [0, -1]])]
_COUNT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 5), st.sampled_from([1.0, 2.0, 1.5]))
_COUNTS = st.lists(_COUNT, min_size=2, max_size=2).map(lambda c: np.array(c))
OUTPUTS = st.one_of(
    st.sampled_from(_TOKENS),
    st.tuples(st.sampled_from(_TOKENS), _COUNTS),
    st.tuples(st.sampled_from(_TOKENS), _COUNTS, _COUNTS),
    st.tuples(st.sampled_from(_TOKENS), st.sampled_from(BAD_VALUES)),
)
"""A B = 2, K = 1, V = 2 step's output (drafts [[0], [1]]): ids, with drawn counts (NaN, inf, 1.5, ints)."""

TIE_FNS = [greedy_step_reference, None, 3, "greedy_step_reference", b"f", object(), [greedy_step_reference],
           partial(greedy_step_reference, ties="split"), print]


RELATED = {"target": ("tokens", "q_draft", "prompt")}
"""A field whose change can make another field wrong: a user tree's target sets the vocabulary its
tokens, q rows and prompt are checked against, so an error may name those instead."""


def names_it(error: BaseException, name: str) -> bool:
    return any(n in str(error) for n in (name,) + RELATED.get(name, ()))


OUTCOMES = ("refused", "accepted", "escape", "crash", "unnamed", "not refused")
"""A probe's outcome: ``refused`` (a SpecrefError naming the input) and ``accepted`` (taken, and judged
with no internal error) hold the property; ``escape`` (another exception got out), ``crash`` (an
internal error status), ``unnamed`` (a SpecrefError that does not name the input) and ``not refused``
(a bad value taken: a float in an int field, a count that is not the tokens') break it."""


def refused(thunk, name: str, *, stage: str) -> tuple:
    """``("ok", value)`` if ``thunk()`` returned, ``("refused", message)`` for a SpecrefError naming ``name``,
    ``("unnamed", text)`` for one that does not, ``("escape", text)`` for any other exception."""
    try:
        return "ok", thunk()
    except SpecrefError as e:
        if names_it(e, name):
            return "refused", str(e)
        return "unnamed", f"{stage}: SpecrefError does not name {name!r}: {str(e)[:300]}"
    except BaseException as e:  # noqa: BLE001 - a bare error is the finding
        return "escape", f"{stage}: {type(e).__name__} (not a SpecrefError naming {name!r}): {str(e)[:300]}"


def judged(report) -> tuple:
    """``("accepted", statuses)`` when a check on a case taken at the door ran with no internal error."""
    statuses = [r.status for r in report.results]
    if INTERNAL in statuses:
        return "crash", f"internal error: {[r.detail[:300] for r in report.results if r.status == INTERNAL]}"
    return "accepted", statuses


def probe_case(make, level: str, name: str, cases_from=lambda case: [case], **settings) -> tuple:
    """A case with one bad field: refused at construction or by ``check`` (a SpecrefError naming the
    field), or taken and judged with no internal error and no exception out of ``check``."""
    outcome, value = refused(make, name, stage="construction")
    if outcome != "ok":
        return outcome, value
    outcome, report = refused(lambda: check(level, reference(level), cases=cases_from(value),
                                            **{**probe_settings(), **settings}), name, stage="check")
    if outcome != "ok":
        return outcome, report
    return judged(report)


def is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def int_field_taken(value) -> bool:
    """Whether an int field that was taken holds an int (never a float, bool or string cast to one)."""
    return value is None or is_int(value) or (isinstance(value, (tuple, list)) and all(is_int(v) for v in value))


def deep_chain(n: int, V: int = 2) -> tuple:
    """``(tree, rows)``: a chain of ``n`` nodes every one of whose tokens is the target's argmax."""
    tree = DraftTree(tuple(range(-1, n)), (-1,) + (1,) * n)
    rows = np.array([[F(1, 3), F(2, 3)] + [F(0)] * (V - 2)] * (n + 1), dtype=object)
    return tree, rows


def greedy_case(**changes) -> GreedyTreeCase:
    tree = DraftTree((-1, 0, 0), (-1, 1, 0))
    rows = frac([["1/4", "3/4"], ["1/2", "1/2"], ["1/3", "2/3"]])
    fields_ = dict(name="fuzz-greedy", trees=(tree,), target=(rows,))
    fields_.update(changes)
    return GreedyTreeCase(**fields_)


USER_P = np.array([[0.2, 0.5, 0.3], [0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]])


def user_case(**changes) -> UserTreeCase:
    fields_ = dict(name="fuzz-user", target=USER_P, parents=(-1, 0, 0), tokens=(-1, 1, 2))
    fields_.update(changes)
    return UserTreeCase(**fields_)


def mrv2_case(**changes) -> MRV2Case:
    fields_ = dict(name="fuzz-mrv2", p_target=P2, q_draft=MQ, temperature=1)
    fields_.update(changes)
    return MRV2Case(**fields_)


def small_coin_case(**changes) -> CoinCase:
    """B = 1, K = 1, V = 2, one draft tuple: the cheapest case a coin level judges."""
    fields_ = dict(name="fuzz-coins", p_target=P2[:1], q_draft=Q2[:1], drafts=(((0,),),))
    fields_.update(changes)
    return CoinCase(**fields_)


def tree_coin_fields(**changes) -> TreeCoinCase:
    fields_ = dict(name="fuzz-tree-coins", tree=C.default_tree_coin_cases()[2].tree, batch=1)
    fields_.update(changes)
    return TreeCoinCase(**fields_)


CASE_FIELDS = {
    "CoinCase": ("batched_coins", small_coin_case, ("name", "p_target", "q_draft", "drafts", "num_draft", "dtype",
                                                     "probes")),
    "CoinCase at vllm_coins": ("vllm_coins", lambda **c: small_coin_case(**{"dtype": "float64", "probes": 4, **c}),
                               ("p_target", "q_draft", "drafts", "num_draft", "dtype", "probes")),
    "TreeCoinCase": ("tree_coins", tree_coin_fields, ("name", "tree", "batch", "dtype", "probes")),
    "MRV2Case": ("mrv2", mrv2_case, ("name", "p_target", "q_draft", "num_draft", "grid", "array", "dtype",
                                      "temperature")),
    "GreedyTreeCase": ("greedy_tree", greedy_case, ("name", "trees", "target", "width", "root_tokens")),
    "GreedyTreeCase (step)": ("greedy_tree_step", greedy_case, ("name", "trees", "target", "width", "root_tokens")),
    "UserTreeCase": ("tree", user_case, ("name", "target", "parents", "tokens", "q_draft", "drafting", "prompt",
                                         "ties")),
}
"""Per case class: its level, a maker of a small valid case with fields changed, and the fields fuzzed."""

INT_FIELDS = {"probes", "batch", "num_draft", "grid", "width", "root_tokens", "prompt", "parents", "tokens"}
"""Fields that hold ints: a float, bool or string taken there (cast or truncated) is a finding."""


def probe_case_field(kind: str, name: str, value) -> tuple:
    """One case class, one field set to ``value``: the outcome class of :func:`probe_case`, and for an
    int field that was taken, whether it holds ints."""
    level, make, _ = CASE_FIELDS[kind]
    outcome, detail = probe_case(lambda: make(**{name: value}), level, name)
    if outcome == "accepted" and name in INT_FIELDS:
        case = make(**{name: value})
        held = getattr(case, name)
        if not int_field_taken(held):
            return "not refused", f"{name}={value!r:.80} was taken and is held as {held!r:.80}, not ints"
    return outcome, detail


API_ARGS = ("settings", "cases", "executor", "batch", "rules", "mode", "time_limit", "case_time_limit", "max_paths",
            "tolerance", "seed", "isolate", "state_check", "samples")
"""``check``'s arguments fuzzed one at a time (SPEC §13.1, §13.2)."""

PLAN_ARGS = ("settings", "cases", "file", "executor", "batch", "rules", "calls", "time_limit", "max_paths")
"""``plan``'s arguments fuzzed one at a time."""

API_LEVELS = ("batched_coins", "vllm_coins", "tree_coins", "mrv2", "greedy_tree", "greedy_tree_step")


def _api_cases(level):
    return {"batched_coins": lambda: [small_coin_case()],
            "vllm_coins": lambda: [small_coin_case(dtype="float64", probes=4)],
            "tree_coins": lambda: [tree_coin_fields()], "mrv2": lambda: [mrv2_case()],
            "greedy_tree": lambda: [greedy_case()], "greedy_tree_step": lambda: [greedy_case()]}[level]()


def probe_check_arg(level: str, value, *, name: str) -> tuple:
    """``check(level, reference, **{name: value})`` on a small case: a SpecrefError naming ``name``, or a
    report with no internal error; nothing else escapes."""
    if name == "cases" and value is None:
        return "accepted", "None: the level's default cases (judged by the misbehaviour suite)"
    kwargs = {**probe_settings(), "cases": _api_cases(level)}
    kwargs[name] = value
    outcome, report = refused(lambda: check(level, reference(level), **kwargs), name, stage="check")
    if outcome != "ok":
        return outcome, report
    return judged(report)


def probe_plan_arg(level: str, value, *, name: str) -> tuple:
    """``plan(level, reference, **{name: value})`` in exact mode, in-process: a SpecrefError naming
    ``name``, or rows; nothing else escapes (``file`` is written to, so plan prints)."""
    from io import StringIO

    from specref.verification.campaigns.planning import plan

    if name == "cases" and value is None:
        return "accepted", "None: the level's default cases"
    kwargs = dict(mode="exact", isolate=False, time_limit=limit() * 10, calls=1, file=StringIO())
    kwargs[name] = value
    cases = kwargs.pop("cases", _api_cases(level))
    outcome, rows = refused(lambda: plan(level, reference(level), cases, **kwargs), name, stage="plan")
    if outcome != "ok":
        return outcome, rows
    if not isinstance(rows, list) or not rows:
        return "crash", f"plan returned {rows!r:.120}"
    return "accepted", [r.note[:60] for r in rows]


def probe_declare_ties(fn, ties) -> tuple:
    """``declare_ties(fn, ties)``: a SpecrefError naming the argument that is wrong (``fn`` not callable,
    ``ties`` not a convention), or a callable that the greedy_tree_step level judges with no internal error."""
    valid_ties = isinstance(ties, str) and ties in ("lowest", "split")
    name = "ties" if callable(fn) else "fn"
    outcome, declared = refused(lambda: declare_ties(fn, ties), name, stage="declare_ties")
    if outcome == "unnamed" and not callable(fn) and "callable" in declared:
        outcome = "refused"  # "fn must be callable" or "declare_ties needs a callable": either names it
    if outcome == "refused" and callable(fn) and valid_ties:
        return "unnamed", f"declare_ties refused a valid declaration (ties={ties!r}): {declared}"
    if outcome != "ok":
        return outcome, declared
    if not (callable(fn) and valid_ties):
        return "not refused", f"declare_ties({fn!r:.40}, {ties!r:.40}) took a bad {name}"
    try:
        return judged(check("greedy_tree_step", declared, cases=[greedy_case()], **suite_settings()))
    except BaseException as e:  # noqa: BLE001
        return "escape", f"check raised {type(e).__name__}: {e}"


def probe_parse_output(out) -> tuple:
    """The batched parser on an output of a B = 2, K = 1, V = 2 step: the tokens and counts, or
    ``Misbehaved`` with ``invalid output`` (or ``emits an invalid id``: a placeholder before a real
    token, an id outside the vocabulary); never another exception, and never counts that disagree
    with the tokens."""
    from specref.verification.levels.batched.steps import parse_output

    x = np.array([[0], [1]])
    try:
        tokens, n = parse_output(out, 2, 1, 2, np.array([1, 1]), x, what="kernel")
    except Misbehaved as m:
        refused = m.status in ("invalid output", "emits an invalid id")
        return ("refused", m.detail) if refused else ("crash", f"status {m.status}")
    except BaseException as e:  # noqa: BLE001
        return "escape", f"parse_output raised {type(e).__name__}: {str(e)[:200]}"
    counts = out[1:] if isinstance(out, tuple) else ()
    real = (np.asarray(tokens) >= 0).sum(axis=1)
    wants = [real] if len(counts) == 1 else [real - 1, real]
    for c, want in zip(counts, wants):
        given = np.asarray(c, dtype=object).reshape(-1).tolist()
        if len(given) != len(want) or any(not (v == w) for v, w in zip(given, want.tolist())):
            return "not refused", f"counts {given} taken, but the tokens {np.asarray(tokens).tolist()} emit {real.tolist()}"
    if (np.asarray(n) != real).any():
        return "not refused", f"n_emitted {np.asarray(n).tolist()} disagrees with the tokens {np.asarray(tokens).tolist()}"
    return "accepted", np.asarray(tokens).tolist()


def probe_deep_greedy(n: int, level: str) -> tuple:
    """A chain ``n`` deep whose argmax path runs to its leaf, at a greedy level: ok with TV 0 (no recursion)."""
    tree, rows = deep_chain(n)
    try:
        report = check(level, reference(level), cases=[GreedyTreeCase("deep", (tree,), (rows,))], **suite_settings())
    except BaseException as e:  # noqa: BLE001
        return "escape", f"check raised {type(e).__name__}: {str(e)[:200]}"
    got = [(r.status, r.tv) for r in report.results]
    if got != [("ok", 0)]:
        return "crash" if "internal error" in got[0][0] else "not refused", f"a {n}-deep chain: {got} {report.results[0].detail[:200]}"
    return "accepted", got


def probe_deep_user(n: int) -> tuple:
    """A user-built chain ``n`` deep over V = 2 at ``max_paths = 500``: ok where its law fits the budget (always
    at depth 3 or less), ``over budget`` at once where it does not; never an internal error."""
    table = frac([["1/3", "2/3"], ["1/2", "1/2"]])
    try:
        case = UserTreeCase("deep-chain", table, tuple(range(-1, n)), (-1,) + (1,) * n)
        (r,) = check("tree", reference("tree"), cases=[case], max_paths=500, **suite_settings()).results
    except BaseException as e:  # noqa: BLE001
        return "escape", f"raised {type(e).__name__}: {str(e)[:200]}"
    if r.status not in ("ok", "over budget") or (n <= 3 and r.status != "ok"):
        return "crash" if r.status == INTERNAL else "not refused", f"a {n}-deep user chain: {r.status}: {r.detail[:200]}"
    return "accepted", r.status


def probe_malformed_deep(n: int, where: str) -> tuple:
    """A user-built chain ``n`` deep, malformed at its last slot: a SpecrefError naming the field and slot."""
    parents, tokens = list(range(-1, n)), [-1] + [1] * n
    if where == "cycle":
        parents[1], name = n, "parents"
    elif where == "forward":
        parents[n], name = n, "parents"
    elif where == "padded parent":
        parents[n - 1], tokens[n - 1], name = -1, -1, f"parents[{n}]"
    else:
        tokens[n], name = 3, f"tokens[{n}]"
    outcome, detail = refused(lambda: UserTreeCase("malformed-deep", USER_P, tuple(parents), tuple(tokens)), name,
                              stage="construction")
    return ("not refused", f"a malformed {n}-deep chain ({where}) was taken") if outcome == "ok" else (outcome, detail)


@dataclass(frozen=True)
class Property:
    """One fuzzed property: its drawn arguments, the probe that classifies an input, its settings, and
    inputs tried on every run besides the drawn ones (one of each kind of bad value)."""

    strategies: dict
    probe: object
    fuzz: object = FUZZ
    examples: tuple = ()


EXPLICIT = (None, "abc", float("nan"), -1, 10**400, 1.5, True, (), np.full((2, 2, 2), np.nan))
"""One bad value of each kind, tried on every case field and argument besides the drawn ones: None, a
string, NaN, a negative, a huge int, a float where an int belongs, a bool, an empty tuple, a NaN array."""


def _field_examples():
    return tuple({"value": v} for v in EXPLICIT)


def _arg_examples():
    return tuple({"level": API_LEVELS[i % len(API_LEVELS)], "value": v} for i, v in enumerate(EXPLICIT))


def fuzzed(surface: str, body):
    """``body(**drawn)`` as the hypothesis test of ``surface``: its explicit inputs, then its drawn ones,
    with its settings and ``@seed(seed_of(surface))`` (the test and the record run exactly this)."""
    prop = PROPERTIES[surface]
    test = given(**prop.strategies)(body)
    for ex in prop.examples:
        test = example(**ex)(test)
    return prop.fuzz(seed(seed_of(surface))(test))


FUZZ_FIELD = settings(FUZZ, max_examples=20)


def seed_of(surface: str) -> int:
    """The seed a surface's inputs are drawn with: :data:`SEED` and the surface's name (each its own draws)."""
    return SEED + zlib.crc32(surface.encode())


PROPERTIES = {
    **{f"case field: {kind}.{name}": Property({"value": VALUES}, partial(probe_case_field, kind, name), FUZZ_FIELD,
                                              _field_examples())
       for kind, (_, _, names) in CASE_FIELDS.items() for name in names},
    **{f"check argument: {name}": Property(dict(level=st.sampled_from(API_LEVELS), value=VALUES),
                                           partial(probe_check_arg, name=name), FUZZ_FIELD, _arg_examples())
       for name in API_ARGS},
    **{f"plan argument: {name}": Property(dict(level=st.sampled_from(API_LEVELS), value=VALUES),
                                          partial(probe_plan_arg, name=name), FUZZ_FIELD, _arg_examples())
       for name in PLAN_ARGS},
    "declare_ties": Property(dict(fn=st.sampled_from(TIE_FNS),
                                  ties=st.one_of(st.sampled_from(["lowest", "split", "LOWEST", "any", ""]), VALUES)),
                             probe_declare_ties),
    "parse_output counts": Property(dict(out=OUTPUTS), probe_parse_output, FUZZ_MANY),
    "deep greedy trees": Property(dict(n=st.integers(1, 6000), level=st.sampled_from(["greedy_tree", "greedy_tree_step"])),
                                  probe_deep_greedy, FUZZ_FEW),
    "deep user chains": Property(dict(n=st.integers(1, 20000)), probe_deep_user, FUZZ_FEW),
    "malformed deep user trees": Property(dict(n=st.integers(2, 20000),
                                               where=st.sampled_from(["cycle", "forward", "padded parent", "token V"])),
                                          probe_malformed_deep, FUZZ_FEW),
}
"""Every bad-input property, by surface: the test asserts each input is refused by name or accepted; the
record counts them."""


# ---------------------------------------------------------------- the CLI: kinds importable as tests.fuzz_kinds_03:<name>


def _cli_kinds() -> dict:
    """``{attribute: (level, kind, exit status)}``: per level two correct kinds (exit 0) and four wrong
    ones, each with the exit status of its outcome (SPEC §13.3): 1 a wrong law, 3 a misbehaviour (a
    write, an output that misbehaves, state kept, SystemExit raised, os._exit(0): crashed), 6 a time-out."""
    picks = {
        "batched_coins": (("reference (engine_coin_kernel)", "plain Python rows"),
                          (("shares row 0's coins", 1), ("returns SystemExit in .cpu()", 3))),
        "vllm_coins": (("reference (vllm_coin_reference)", "list of lists"),
                       (("races on p above u = 0.9", 1), ("returns hanging __array__", 6))),
        "tree_coins": (("reference (sglang_coin_kernel)", "NumPy outputs"),
                       (("shares row 0's coins", 1), ("float ids (2.75)", 3))),
        "mrv2": (("reference (mrv2_reference)", "entries past num_sampled filled"),
                 (("stale target buffer", 3), ("writes target_logits", 3))),
        "greedy_tree": (("reference (greedy_reference)", "declared split ties"),
                        (("last matching child", 1), ("returns SystemExit in __array__", 3))),
        "greedy_tree_step": (("reference (greedy_step_reference)", "declared split ties, drawn from the rng"),
                             (("rewrites its tree", 3), ("endless path", 3))),
        "tree": (("pointmass_verify", "pointmass_verify, NumPy path"),
                 (("zoo: min_p_over_q_on_topk", 1), ("writes its q rows", 3))),
    }
    out = {}
    for level, (good, bad) in picks.items():
        kinds = bad_kinds(level)
        chosen = [(k, CORRECT[level][k], 0) for k in good] + [(k, kinds[k], code) for k, code in bad]
        chosen += [("raises SystemExit(0)", EXCEPTIONS["raises SystemExit(0)"], 3), ("os._exit(0)", _exit0, 3)]
        for i, (kind, fn, code) in enumerate(chosen):
            out[f"cli_{level}_{i}"] = (level, kind, code, fn)
    return out


CLI_KINDS = _cli_kinds()
globals().update({attr: fn for attr, (_, _, _, fn) in CLI_KINDS.items()})
cli_vllm_race_above_09 = VLLM_COINS_WRONG["races on p above u = 0.9"]  # the real-process CLI runs: exit 1 (differs)
cli_greedy_reference = greedy_reference  # exit 0


def measured_limit() -> float:
    """The suite's per-call limit: :data:`LIMIT_MARGIN` x the slowest call of specref's own implementation
    of each level on the cases the suite checks, measured in this process (so a loaded machine gets a
    longer limit), at least :data:`LIMIT_FLOOR`.  Hanging kinds must be cut within it, so it stays short;
    a fixed guess broke under load (a correct kernel timed out)."""
    slowest = [0.0]

    def timed(fn):
        @wraps(fn)
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                slowest[0] = max(slowest[0], time.perf_counter() - start)
        return call

    for level in LEVELS_03:
        report = check(level, timed(CORRECT[level][next(iter(CORRECT[level]))]), cases=cases_of(level),
                       isolate=False, time_limit=None)
        assert report.ok, (level, [r.detail[:200] for r in report.results])  # the measure of a correct call
    return max(LIMIT_FLOOR, LIMIT_MARGIN * slowest[0])



_LIMIT: list = []  # measured_limit(), once per process, when a test first asks (not when the CLI imports a kind)


def limit() -> float:
    """The per-call limit of this process's misbehaviour checks (:func:`measured_limit`, measured once)."""
    if not _LIMIT:
        _LIMIT.append(measured_limit())
    return _LIMIT[0]


def suite_settings() -> dict:
    """The misbehaviour suite's time settings: :func:`limit` per call, :data:`CASE_LIMIT` per case."""
    return dict(time_limit=limit(), case_time_limit=CASE_LIMIT)


def probe_settings() -> dict:
    """A check of a case taken at the door: :func:`limit` per call, a quarter of a second per case, so that
    a value that is valid but costly (``probes = 2**70``) ends at the case's time limit (``timeout``), not
    at the end of the work it asks for."""
    return dict(time_limit=limit(), case_time_limit=0.25)


def __getattr__(name):  # K.SETTINGS and K.LIMIT for the test modules: the measured values
    if name == "SETTINGS":
        return suite_settings()
    if name == "LIMIT":
        return limit()
    raise AttributeError(name)
