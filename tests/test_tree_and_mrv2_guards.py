"""The greedy tree levels, the tree level's user-built trees and the mrv2 level never lie and never die.

Every call gets copies of its inputs and the expected law is computed before the first call, so a
write into an input is ``writes into its inputs``, never ``ok`` (SPEC §11.10, §12.4, §12.5); an
output is converted inside the guarded call, strictly and with bounded reads, so its misbehaviour
is ``invalid output`` or ``timeout``, never ``internal error`` or an exception out of ``check``
(the CLI then exits 1, not 2: SPEC §13.3); malformed cases are a ``SpecrefError`` naming the case,
the field and the value, before any case runs; the mrv2 level's cases run one after another, so a
stale buffer is ``stateful`` (SPEC §13.5), and every valid seed is valid for every case.  Each
test builds the smallest implementation or case that misbehaves and says what makes it fail.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from dataclasses import replace
from fractions import Fraction as F
from pathlib import Path

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.tree import DraftTree
from specref.verification.levels.batched.mrv2 import default_mrv2_cases, mrv2_reference
from specref.verification.levels.trees.greedy import (MAX_WIDTH, GreedyTreeCase, argmax_law, declare_ties,
                                                      default_greedy_cases, greedy_reference, greedy_step_reference)
from specref.verification.levels.trees.sampled import (UserTreeCase, batched_reference_kernel, from_coins,
                                                       sglang_style_kernel, tree_cases)
from specref.verification.oracle import check

ROOT = Path(__file__).resolve().parents[1]

# The implementations the CLI tests import (written to a module in tmp_path); the API tests use them too.
IMPLS = '''
import numpy as np
from specref.verification.levels.batched.mrv2 import mrv2_reference

_BUFFERS = {}


def stale_mrv2(target_logits, *rest):
    """A scratch copy of the target logits allocated once per vocabulary size and never refreshed:
    right on the first case a process sees, stale on every later one."""
    V = np.shape(target_logits)[1]
    if V not in _BUFFERS:
        _BUFFERS[V] = np.array(target_logits, copy=True)
    return mrv2_reference(_BUFFERS[V], *rest)


def rewrites_its_tree(tree, p_target, rng):
    """Stops at the root, and rewrites the tree's tokens out of the vocabulary so that stopping
    looks right to a law computed from the tree after the call."""
    object.__setattr__(tree, "tokens", (-1,) + (len(p_target[0]),) * (tree.size - 1))
    row = [float(v) for v in p_target[0]]
    return [], row.index(max(row))
'''
_NS: dict = {}
exec(compile(IMPLS, "impls_guards", "exec"), _NS)  # noqa: S102 - the same source the CLI tests import
stale_mrv2, rewrites_its_tree = _NS["stale_mrv2"], _NS["rewrites_its_tree"]


def greedy_cases(*names):
    by_name = {c.name: c for c in default_greedy_cases()}  # fresh cases: a mutation cannot leak between tests
    return [by_name[n] for n in names]


def one(report):
    (r,) = report.results
    return r


# ---------------------------------------------------------------- copies, and the law before any call


def test_a_greedy_step_that_rewrites_its_tree_writes_into_its_inputs():
    """Fails if the step gets the case's own tree, or if the expected law is computed after the call
    from a tree the step rewrote (both made this step ``ok``); the case must come back untouched."""
    (case,) = greedy_cases("distinct-children")
    before = [t.tokens for t in case.trees]
    r = one(check("greedy_tree_step", rewrites_its_tree, cases=[case]))
    assert r.status == "writes into its inputs" and "tokens" in r.detail, r
    assert [t.tokens for t in case.trees] == before

    def poisons_its_tables(tree, p_target, rng):  # the children the tree reports, rewritten in its cache
        tree.children(0)
        object.__setattr__(tree, "_shape_tables", ([[] for _ in range(tree.size)], [0] * tree.size))
        return greedy_step_reference(tree, p_target, rng)

    assert one(check("greedy_tree_step", poisons_its_tables, cases=greedy_cases("duplicate-children"))).status == \
        "writes into its inputs"


def test_greedy_inputs_are_read_only_copies():
    """Fails if a write into SGLang's inputs or a step's rows goes unreported (``ok``), or if the rows
    can be made writeable again (they must be views of a read-only copy)."""
    def writes_candidates(predicts, accept_index, accept_token_num, candidates, *rest):
        candidates[0, 0] = candidates[0, 0]
        greedy_reference(predicts, accept_index, accept_token_num, candidates, *rest)

    assert one(check("greedy_tree", writes_candidates, cases=greedy_cases("duplicate-children"))).status == \
        "writes into its inputs"

    def writes_rows(tree, p_target, rng):
        p_target[0, 0] = p_target[0, 0]
        return greedy_step_reference(tree, p_target, rng)

    assert one(check("greedy_tree_step", writes_rows, cases=greedy_cases("duplicate-children"))).status == \
        "writes into its inputs"

    def unlocks_rows(tree, p_target, rng):
        p_target.flags.writeable = True
        return greedy_step_reference(tree, p_target, rng)

    r = one(check("greedy_tree_step", unlocks_rows, cases=greedy_cases("duplicate-children")))
    assert r.status == "raised" and "WRITEABLE" in r.detail, r


def test_a_tree_step_and_a_dense_batch_kernel_that_write_into_their_inputs():
    """The tree level: fails if a rewritten tree copy or a written link list is reported ``ok``."""
    reference = from_coins(sglang_style_kernel)

    def rewrites(tree, p_target, q_draft, rng):
        out = reference(tree, p_target, q_draft, rng)
        object.__setattr__(tree, "tokens", tree.tokens[:-1] + (0,))  # its last node now carries token 0
        return out

    case = tree_cases("topk")[2]  # chain-depth2
    assert one(check("tree", rewrites, cases=[case])).status == "writes into its inputs"

    def writes_links(candidates, first, sibling, coins, finals, rows):
        out = batched_reference_kernel(candidates, first, sibling, coins, finals, rows)
        sibling[0].append(-1)
        return out

    assert one(check("tree_batch", writes_links, cases=[case])).status == "writes into its inputs"


# ---------------------------------------------------------------- outputs read inside the guarded call


def test_sglang_outputs_must_be_integer_arrays_never_cast():
    """Fails if strings or ``ids + 0.5`` pass through a cast to int64 (they did: ``ok``)."""
    def as_strings(*args):
        greedy_reference(*args)
        return tuple(a.astype(str) for a in args[:3])

    def plus_half(*args):
        greedy_reference(*args)
        return (args[0] + 0.5, args[1], args[2])

    for kernel, dtype in ((as_strings, "<U"), (plus_half, "float64")):
        r = one(check("greedy_tree", kernel, cases=greedy_cases("duplicate-children")))
        assert r.status == "invalid output" and "integer" in r.detail and dtype in r.detail, r


class _Hostile:
    """An output whose conversion misbehaves: ``__array__`` and ``__iter__`` run ``act``."""

    def __init__(self, act):
        self.act = act

    def __array__(self, *args, **kwargs):
        return self.act()

    def __iter__(self):
        return self.act()


def _raise(error):
    def act():
        raise error
    return act


def test_output_conversions_run_inside_the_guarded_call():
    """Fails if a SystemExit or KeyboardInterrupt from an output's conversion is an internal error
    (CLI exit 2) or escapes ``check`` (both did), if a conversion that hangs is not cut at the
    time limit, or if an endless path is read with an unbounded ``list()`` (it hung)."""
    cases = greedy_cases("duplicate-children")
    for error in (SystemExit(3), KeyboardInterrupt()):
        r = one(check("greedy_tree", lambda *a, e=error: (_Hostile(_raise(e)),) * 3, cases=cases))
        assert r.status == "invalid output" and type(error).__name__ in r.detail, r
        r = one(check("greedy_tree_step", lambda tree, p, rng, e=error: _Hostile(_raise(e)), cases=cases))
        assert r.status == "invalid output" and type(error).__name__ in r.detail, r
    r = one(check("greedy_tree_step", lambda tree, p, rng: (itertools.count(), 0), cases=cases))
    assert r.status == "invalid output" and "more than" in r.detail, r
    started = time.perf_counter()
    r = one(check("greedy_tree", lambda *a: (_Hostile(lambda: time.sleep(30)),) * 3, cases=cases, time_limit=0.3))
    assert r.status == "timeout" and time.perf_counter() - started < 10, r


# ---------------------------------------------------------------- malformed cases, named before any case runs


_T = DraftTree((-1, 0), (-1, 1))
_ROWS = np.array([[F(1, 4), F(3, 4)], [F(1, 2), F(1, 2)]], dtype=object)


@pytest.mark.parametrize("field, value, words", [
    ("width", "7", "width"), ("width", 7.5, "width"), ("width", True, "width"), ("width", 1, "width"),
    ("root_tokens", ("a",), "root_tokens[0]"), ("root_tokens", (2,), "root_tokens[0]"),
    ("root_tokens", (0, 1), "root_tokens"),
    ("trees", None, "trees"), ("trees", (), "trees"), ("trees", ("tree",), "trees[0]"),
    ("target", None, "target"), ("target", (_ROWS[0],), "target[0]"), ("target", (_ROWS, _ROWS), "target"),
    ("name", 3, "name"),
])
def test_malformed_greedy_cases_name_the_case_the_field_and_the_value(field, value, words):
    """Fails if a malformed field raises TypeError, ValueError or IndexError out of ``check`` or
    becomes an ``internal error`` (each did), or if the message leaves out the field."""
    case = replace(GreedyTreeCase("bad-case", (_T,), (_ROWS,)), **{field: value})
    with pytest.raises(SpecrefError) as e:
        check("greedy_tree", greedy_reference, cases=[case])
    text = str(e.value)
    assert words in text and (field == "name" or "'bad-case'" in text), text
    if field in ("width", "root_tokens", "name") and value not in ((), (0, 1)):
        assert repr(value if field != "root_tokens" else value[0]) in text, text


@pytest.mark.parametrize("level", ["greedy_tree", "greedy_tree_step"])
def test_a_width_past_max_width_is_refused_before_any_case_runs(level):
    """Fails if ``width = 10**400`` is taken and the dense batch is allocated inside the case (NumPy's
    "Maximum allowed dimension exceeded": an ``internal error``, as it was), or if a width one past
    ``MAX_WIDTH`` is not refused with the bound stated."""
    calls = []

    def counted(*args):
        calls.append(1)
        return (greedy_reference if level == "greedy_tree" else greedy_step_reference)(*args)

    good = GreedyTreeCase("good-case", (_T,), (_ROWS,))
    for width in (10 ** 400, MAX_WIDTH + 1):
        with pytest.raises(SpecrefError) as e:
            check(level, counted, cases=[good, replace(good, name="bad-case", width=width)], isolate=False)
        text = str(e.value)
        assert "width" in text and "'bad-case'" in text and str(MAX_WIDTH) in text and str(width)[:10] in text, text
    assert calls == []


@pytest.mark.parametrize("ties", [np.array(["lowest", "split"]), np.array([[F(1, 4), F(3, 4)]] * 2, dtype=object),
                                  np.array(["lowest"]), None, "LOWEST"],
                         ids=["str array", "Fraction array", "one-entry array", "None", "LOWEST"])
def test_declare_ties_refuses_a_bad_ties_by_name(ties):
    """Fails if an array ``ties`` is compared with the conventions (NumPy's ambiguous-truth ValueError
    escaped, as it did) or taken (a one-entry array compared equal), instead of a SpecrefError naming
    ``ties`` and its value."""
    with pytest.raises(SpecrefError) as e:
        declare_ties(greedy_step_reference, ties)
    assert "ties" in str(e.value) and repr(ties)[:12] in str(e.value), str(e.value)


def test_a_tree_thousands_deep_is_judged_without_recursion():
    """A 3,000-deep chain whose argmax path runs to its leaf: fails if the law recurses (a
    RecursionError: ``internal error``)."""
    n = 3000
    tree = DraftTree(tuple(range(-1, n)), (-1,) + (1,) * n)
    rows = np.array([[F(1, 3), F(2, 3)]] * (n + 1), dtype=object)
    assert argmax_law(tree, rows) == {(tuple(range(1, n + 1)), 1): 1}
    r = one(check("greedy_tree_step", greedy_step_reference, cases=[GreedyTreeCase("deep", (tree,), (rows,))]))
    assert r.status == "ok" and r.tv == 0, r


# ---------------------------------------------------------------- user-built trees


P = np.array([[0.2, 0.5, 0.3], [0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]])
PARENTS, TOKENS = (-1, 0, 0), (-1, 0, 1)


def test_a_user_chain_thousands_deep_is_over_budget():
    """Fails if the budget message formats Σ V^i (4,500 digits here) and raises instead of
    reporting ``over budget`` (it was an ``internal error``)."""
    n = 9500
    deep = UserTreeCase("deep-chain", P, tuple(range(-1, n)), (-1,) + (1,) * n)
    r = one(check("tree", from_coins(sglang_style_kernel), cases=[deep]))
    assert r.status == "over budget" and "max_paths" in r.detail, r


@pytest.mark.parametrize("change, words", [
    (lambda p: np.array([["a", "b", "c"]] * 3), "target must hold"),
    (lambda p: np.where(np.eye(3, dtype=bool), np.nan, p), "target[0][0] is not finite"),
    (lambda p: p + np.array([[-0.3, 0.3, 0]] * 3), "target[0][0] is negative"),
    (lambda p: p * 1.1, "target row 0 sums to"),
    (lambda p: p[0], "target must have shape"),
])
def test_malformed_user_targets_name_the_case_and_the_field(change, words):
    """Fails if a target is refused by NumPy's bare ValueError, or with a message that names neither
    the case nor the field (``table[0][0]``, as it was)."""
    with pytest.raises(SpecrefError) as e:
        UserTreeCase("user-case", change(P), PARENTS, TOKENS)
    assert "UserTreeCase 'user-case'" in str(e.value) and words in str(e.value), str(e.value)


def test_a_float32_user_target_is_judged_within_its_tolerance():
    """Rows that sum to 1 in float32 but not within 1e-9 in float64: fails if they are refused with a
    message about float64 (as they were) instead of accepted within float32's tolerance."""
    p32 = np.array([[0.1, 0.2, 0.7]] * 3, dtype=np.float32)
    assert abs(p32.astype(np.float64).sum(axis=1) - 1).max() > 1e-9
    with pytest.warns(Warning, match="float32"):
        case = UserTreeCase("float32-target", p32, PARENTS, TOKENS)
    assert case.target.dtype == np.float64
    assert one(check("tree", from_coins(sglang_style_kernel), cases=[case])).status == "ok"


# ---------------------------------------------------------------- the mrv2 level


def _twin_cases():
    """Two cases of the same shapes (the rows of one swapped), so the state check runs each after the other."""
    (c,) = [c for c in default_mrv2_cases() if c.name == "zero-draft-row-T2"]
    return [c, replace(c, name="zero-draft-row-T2-swapped", p_target=c.p_target[::-1].copy(),
                       q_draft=c.q_draft[::-1].copy())]


def test_a_stale_mrv2_buffer_is_stateful():
    """Fails if each case runs in a run of its own, where the state check can only run a case after
    itself (the stale kernel was ``ok`` with isolate=True and state_check=True)."""
    report = check("mrv2", stale_mrv2, cases=_twin_cases(), isolate=True, state_check=True)
    assert {r.status for r in report.results} == {"stateful"}, str(report)


def test_mrv2_inputs_are_read_only():
    """Fails if a write into the call's arrays is reported ``ok``."""
    def writes(target_logits, *rest):
        target_logits[0, 0] = target_logits[0, 0]
        return mrv2_reference(target_logits, *rest)

    assert one(check("mrv2", writes, cases=_twin_cases()[:1])).status == "writes into its inputs"


def test_mrv2_output_conversions_are_invalid_output():
    """An output whose ``__array__`` or iteration raises SystemExit or KeyboardInterrupt: fails if that is
    ``raised`` (it was: the conversion ran outside the guard, as if the call itself had raised) instead
    of ``invalid output`` naming the exception (SPEC §11.10, §13.3), or if a hanging ``__array__`` is
    not a ``timeout``."""
    cases = _twin_cases()[:1]
    for error in (SystemExit(3), KeyboardInterrupt()):
        for name, out in (("__array__", lambda e: (_Hostile(_raise(e)),) * 2), ("iteration", _Hostile)):
            hostile = out(error) if name == "__array__" else out(_raise(error))
            r = one(check("mrv2", lambda *a, o=hostile: o, cases=cases, isolate=False))
            assert r.status == "invalid output" and type(error).__name__ in r.detail, (name, r)
    r = one(check("mrv2", lambda *a: (_Hostile(lambda: time.sleep(30)),) * 2, cases=cases, isolate=False,
                  time_limit=0.3))
    assert r.status == "timeout", r


@pytest.mark.parametrize("temperature, words", [
    (10 ** 400, "10000000000"), (10 ** 5000, "5001 digits"), (1e300, "1e+300"), ((1, float("nan")), "nan"),
    ((1, True), "True"), ((-1, 1), "-1"),
], ids=["10**400", "10**5000", "1e300", "nan", "bool", "negative"])
def test_mrv2_temperatures_are_named_when_refused(temperature, words):
    """Fails if a temperature raises OverflowError (10**400 did) or is handed over as float32 inf."""
    (c,) = _twin_cases()[:1]
    with pytest.raises(SpecrefError, match=r"temperature\[\d\]") as e:
        check("mrv2", mrv2_reference, cases=[replace(c, temperature=temperature)])
    assert "'zero-draft-row-T2'" in str(e.value) and words in str(e.value), str(e.value)


def test_the_largest_seed_is_valid_for_every_mrv2_case():
    """seed = 2**63 - 1: fails if case 1's seed is re-validated as a Settings seed (it raised
    "seed must be below 2**63" after the first case ran).  Seeded; over seeds the reference would
    fail a case with probability at most alpha = 1e-6."""
    report = check("mrv2", mrv2_reference, cases=_twin_cases(), mode="statistical", samples=200, seed=2 ** 63 - 1,
                   isolate=False, progress=False)
    assert [r.status for r in report.results] == ["ok", "ok"], str(report)


# ---------------------------------------------------------------- the CLI's exit statuses


@pytest.mark.parametrize("impl, level, words", [("stale_mrv2", "mrv2", "stateful"),
                                                ("rewrites_its_tree", "greedy_tree_step", "writes into its inputs")])
def test_the_cli_exits_3(tmp_path, impl, level, words):
    """The real process, isolated, default cases and state check: fails if the stale kernel or the
    tree-rewriting step exits 0 (both did); each misbehaves (SPEC §13.3), exit 3."""
    (tmp_path / "impls_guards.py").write_text(IMPLS)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    run = subprocess.run([sys.executable, "-m", "specref.verify", "--no-progress", "--impl", f"impls_guards:{impl}",
                          "--level", level], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert run.returncode == 3 and words in run.stdout and "MISBEHAVES" in run.stdout, run.stdout + run.stderr
