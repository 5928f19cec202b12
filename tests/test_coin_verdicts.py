"""The coin-fed levels never say a false "ok" or a false "differs" (SPEC §5.1, §11.9, §11.11).

Each test builds the smallest kernel that shows one way a verdict could overstate what it
covered, and says why it can fail.  Everything is deterministic: the coin grids are enumerated,
and the exponential vectors of ``vllm_coins`` are seeded from ``Settings.seed`` (its default).
"""

import dataclasses
import itertools
import re
from fractions import Fraction

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.verification.laws.coins import coin_law, resolution_text
from specref.verification.levels.coins import kernels as C
from specref.verification.levels.coins import vllm_coins as ec
from specref.verification.oracle import check
from specref.verification.running.report import DIFFERS, INVALID, OK


def _check(level, fn, cases=None, **kw):
    return check(level, fn, cases=cases, mode="exact", isolate=False, **kw).results


# ---------------------------------------------------------------- an ok states its resolution


_WINDOW = (0.3, 0.3 + 2.0 ** -10)  # no probe of 16 per coin, no threshold of the cases inside


def _final_window_kernel(p, q, x, u, f):
    """(wrong) The engine kernel, but the final token moves one id up when the final coin is in _WINDOW."""
    out = C.engine_coin_kernel(p, q, x, u, f)
    for b in range(out.shape[0]):
        if _WINDOW[0] <= f[b] < _WINDOW[1]:
            last = int((out[b] >= 0).sum()) - 1
            out[b, last] = (out[b, last] + 1) % p.shape[2]
    return out


def _tree_window_kernel(candidates, first, sibling, u, u_final, p):
    """(wrong) SGLang's tree kernel, but the next token moves one id up when the final coin is in _WINDOW."""
    accept, tokens = C.sglang_coin_kernel(candidates, first, sibling, u, u_final, p)
    return accept, [(t + 1) % p.shape[2] if _WINDOW[0] <= u_final[b] < _WINDOW[1] else t for b, t in enumerate(tokens)]


def test_a_narrow_wrong_window_is_an_ok_only_to_a_stated_resolution_and_differs_at_a_finer_one():
    """No probe of 16 per coin lands in the window, so a bare "ok" (TV 0) would be false.  Fails if an
    ok's detail does not say that pieces narrower than its probe spacing were not probed, or if a
    probe spacing of 2^-10 does not see the window (then the stated resolution would be false)."""
    word = f"no piece narrower than {resolution_text(16)} probed"
    for level, kernel, cases in (("batched_coins", _final_window_kernel, C.default_coin_cases()[:1]),
                                 ("tree_coins", _tree_window_kernel, C.default_tree_coin_cases()[2:])):
        (r,) = _check(level, kernel, cases)
        assert r.status == OK and f"ok to resolution {resolution_text(16)}" in r.detail and word in r.detail, r
    p = C._f([[["1/2", "1/4", "1/4"], ["1/4", "1/2", "1/4"]]])  # B = 1, K = 1, V = 3: two coins
    q = C._f([[["1/4", "1/2", "1/4"]]])
    fine = C.CoinCase("one-row-fine", p, q, drafts=(((1,),),), probes=2**10)
    (r,) = _check("batched_coins", _final_window_kernel, [fine])
    assert r.status == DIFFERS and r.tv >= 2.0 ** -11, r  # the window's mass is 2^-10 of each final draw


def test_an_ok_of_vllm_coins_states_both_resolutions():
    """Fails if the vllm_coins ok says less than what it covered: the acceptance coins' resolution
    and the recovered token's (its probe points along the rejected coin and its exponentials)."""
    (r,) = _check("vllm_coins", ec.vllm_coin_reference, ec.default_vllm_coin_cases()[:1])
    assert r.status == OK, r
    for words in ("acceptance ok to resolution 2^-3", "no piece of a rejected coin narrower than 2^-3 probed",
                  "times 1, 2^5, 2^40", "12 seeded vectors (4 in the tail)"):
        assert words in r.detail, (words, r.detail)


# ---------------------------------------------------------------- vllm_coins: the whole interval, the tail


def _race_switch(threshold):
    """(wrong) vLLM's algorithm, but the recovered token races on p, not the residual, when the
    rejected coin is >= threshold."""
    def kernel(*args):
        seen = {}

        def accept(px, qx, u):
            seen["u"] = u
            return qx > 0 and u < px / qx

        def rows(p, q, x):
            return p.copy() if seen["u"] >= threshold else ec._residual32(p, q, x)

        return ec._vllm_numpy(*args, accept=accept, race_rows=rows)
    return kernel


def test_a_race_that_changes_inside_the_rejection_interval_differs():
    """A fit at the interval's middle alone sees one race and says "ok" (TV 5e-9).  Fails if the level
    does not probe the whole interval, cut the rejected coin at 0.9 and judge both pieces: the worst
    draft tuple rejects the first draft of each row with probability 1/2, on [1/2, 1), whose last
    fifth races on p (TV 0.05 and 0.1 from the residual over the interval): TV 0.075 in all."""
    (r,) = _check("vllm_coins", _race_switch(0.9), ec.default_vllm_coin_cases()[:1])
    assert r.status == DIFFERS and abs(r.tv - 0.075) < 1e-6, r
    assert "u in [0.9, 1)" in r.detail, r.detail


def _clamped_at_8(*args):
    """(wrong) The reference with every exponential clamped to 8 (a float16-style guard)."""
    meta = args[7]
    clamped = np.minimum(np.asarray(meta.exponentials, dtype=np.float32), np.float32(8))
    return ec.vllm_coin_reference(*args[:7], dataclasses.replace(meta, exponentials=clamped))


def _on_p_in_the_tail(*args):
    """(wrong) The race on p instead of the residual whenever an exponential exceeds 8."""
    tail = (np.asarray(args[7].exponentials) > 8).any()
    return ec._vllm_numpy(*args, accept=lambda px, qx, u: qx > 0 and u < px / qx,
                          race_rows=(lambda p, q, x: p.copy()) if tail else ec._residual32)


@pytest.mark.parametrize("kernel", [_clamped_at_8, _on_p_in_the_tail])
def test_a_kernel_wrong_only_for_exponentials_above_8_is_not_a_race(kernel):
    """8 seeded Exp(1) vectors rarely hold an entry above 8, so they alone would say "ok".  Fails if the
    witnesses scaled into the tail (times 2^5) do not see them: then "ok" would be false."""
    (r,) = _check("vllm_coins", kernel, ec.default_vllm_coin_cases()[:1])
    assert r.status == ec.NOT_RACE, r
    assert "every exponential times 32" in r.detail, r.detail


# ---------------------------------------------------------------- vllm_coins: a correct law is never "differs"


def _token_from_the_rejected_coin(*args):
    """(correct, no race) The recovered token by inverse CDF of the residual at (u - a)/(1 - a):
    the rejected coin rescaled, uniform on [0, 1) given the rejection, so the law is right."""
    seen = {}

    def accept(px, qx, u):
        seen["a"] = min(1.0, float(px) / float(qx)) if qx > 0 else 0.0
        seen["u"] = float(u)
        return qx > 0 and u < px / qx

    def one_hot(p, q, x):
        s = ec._residual32(p, q, x).astype(np.float64)
        r = (seen["u"] - seen["a"]) / (1 - seen["a"])
        out = np.zeros_like(p)
        out[min(int(np.searchsorted(np.cumsum(s) / s.sum(), r, side="right")), len(p) - 1)] = 1
        return out

    return ec._vllm_numpy(*args, accept=accept, race_rows=one_hot)


def test_a_recovered_token_read_off_the_rejected_coin_is_judged_by_its_law():
    """A fit at the interval's middle sees one token and would say "differs" (TV 0.375).  Fails if the
    level does not cut the rejected coin where the token changes and mix the
    pieces' (one-hot) laws: their mixture is the residual, so the verdict must be ok."""
    results = _check("vllm_coins", _token_from_the_rejected_coin)
    assert [r.status for r in results] == [OK] * 3, results
    assert all(r.tv <= ec.race_bound(4) for r in results), results


def _token_from_an_exponential(*args):
    """(correct, no race) The recovered token by inverse CDF of the residual at 1 - exp(-E[b, 0]):
    uniform, so the law is right, but it is no race and not a function of the rejected coin."""
    out = ec.vllm_coin_reference(*args)
    E = np.asarray(args[7].exponentials, dtype=np.float64)
    start = 0
    for b, n in enumerate(args[1]):
        m = int((out[b] >= 0).sum()) - 1
        if m < n:
            p = ec.softmax32(args[5][start + m])
            q = None if args[4] is None else np.asarray(args[4][start + m], dtype=np.float32)
            s = ec._residual32(p, q, int(args[0][start + m])).astype(np.float64)
            out[b, m] = int(np.searchsorted(np.cumsum(s) / s.sum(), 1 - np.exp(-E[b, 0]), side="right"))
        start += n
    return out


def test_a_correct_kernel_that_is_no_race_is_never_called_differs():
    """Fails if a kernel whose law is right but which is no exponential race gets "differs": its law
    is not computed, so the verdict can only be that it is not a race."""
    results = _check("vllm_coins", _token_from_an_exponential)
    assert [r.status for r in results] == [ec.NOT_RACE] * 3, results


# ---------------------------------------------------------------- tree_coins: the output read as tree_batch reads it


def _garbled(change):
    def kernel(*args):
        accept, tokens = C.sglang_coin_kernel(*args)
        return change([list(a) for a in accept]), tokens
    return kernel


@pytest.mark.parametrize("change, words", [
    (lambda acc: [[a[0]] + [i + 0.75 if i >= 0 else i for i in a[1:]] for a in acc], "(float) is not an id"),
    (lambda acc: np.array(acc, dtype=np.float64), "holds 0.0 (float64) is not an id"),
    (lambda acc: [[a[0], -1] + a[1:] for a in acc], "= -1 but accepted node"),
    (lambda acc: [[5] + a[1:] for a in acc], "accept_index[0][0] = 5, not the root 0"),
    (lambda acc: [[True] + a[1:] for a in acc], "is a bool, not an id"),
])
def test_a_tree_kernels_accept_index_is_read_strictly(change, words):
    """A float id truncated (2.75 read as 2), a -1 before accepted nodes dropped or a root entry never
    read would let these outputs pass as "ok".  Fails if any is not invalid output."""
    (r,) = _check("tree_coins", _garbled(change), C.default_tree_coin_cases()[:1])
    assert r.status == INVALID and words in r.detail, r


# ---------------------------------------------------------------- coin order


def _final_and_first_swapped(p, q, x, u, f):
    """(correct law, another coin order) final_coins[b] tests draft 0; uniform_coins[b, 0] draws the final token."""
    u2 = u.copy()
    u2[:, 0] = f
    return C.engine_coin_kernel(p, q, x, u2, u[:, 0].copy())


def test_a_kernel_that_uses_its_iid_coins_in_another_order_is_judged_by_its_law():
    """In the contract's order this kernel fails the method's checks on all four default cases.  Fails
    if the level does not find the order the kernel uses, judge the law in it (TV 0: the coins are
    i.i.d.), and say so."""
    results = _check("batched_coins", _final_and_first_swapped)
    assert [(r.status, r.tv) for r in results] == [(OK, 0)] * 4, results
    for r in results:
        assert ("uses its coins in another order than the contract (final_coins[b] as draft 0's coin, "
                "uniform_coins[b, 0] as the final coin)") in r.detail, r.detail


def test_another_order_does_not_hide_a_wrong_law():
    """Fails if a kernel in another coin order with a wrong law (the residual drawn from p) passes:
    the order search must judge the law, not excuse it."""
    def wrong(p, q, x, u, f):  # the swapped order, and the token after a rejection drawn from p
        u2 = u.copy()
        u2[:, 0] = f
        return _rejected_from_p(p, q, x, u2, u[:, 0].copy())

    (r,) = _check("batched_coins", wrong, C.default_coin_cases()[:1])
    assert r.status == DIFFERS and r.tv > 0.01 and "another order than the contract" in r.detail, r


def _rejected_from_p(p, q, x, u, f):
    """The engine kernel with the final token drawn from p after a rejection (not the residual)."""
    out = C.engine_coin_kernel(p, q, x, u, f)
    for b in range(out.shape[0]):
        n = int((out[b] >= 0).sum()) - 1
        cdf = np.cumsum(p[b, n])
        out[b, n] = min(int(np.sum(cdf <= f[b] * cdf[-1])), int(np.flatnonzero(p[b, n] > 0)[-1]))
    return out


def test_coin_law_in_another_order_is_the_brute_force_law():
    """Fails if searching the coins in a given order changes the law, or the cells are not reported in
    the kernel's own coin indices (4-bit grid: every coin vector enumerated)."""
    def kernel(c):  # coin 2 tests the first draft, coin 0 the second, coin 1 draws the token
        n = 0 if c[2] >= 0.625 else (1 if c[0] >= 0.25 else 2)
        return n, int(c[1] * 3)

    size = 16
    brute: dict = {}
    for ks in itertools.product(range(size), repeat=3):
        out = kernel(np.array(ks, dtype=np.float32) / size)
        brute[out] = brute.get(out, 0) + Fraction(1, size ** 3)
    got = coin_law(kernel, 3, dtype="float32", bits=4, probes=4, order=(2, 0, 1))
    assert dict(got) == brute and got.order == (2, 0, 1)
    for cell, out in got.cells:  # each cell in the kernel's own coins: its low corner gives its output
        assert kernel(np.array([lo for lo, _ in cell], dtype=np.float32) / size) == out, (cell, out)
    with pytest.raises(SpecrefError, match=re.escape("permutation of range(3)")):
        coin_law(kernel, 3, dtype="float32", order=(0, 0, 1))


# ---------------------------------------------------------------- malformed cases, refused by name before any case runs


def _counting(kernel):
    """``kernel`` that counts its calls: a malformed case must be refused before any case runs."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    return counted, calls


def _refused_before_any_case(level, kernel, good, bad):
    counted, calls = _counting(kernel)
    with pytest.raises(SpecrefError) as e:
        _check(level, counted, [good, bad])
    assert calls == [], "a case ran before the malformed one was refused"
    return str(e.value)


@pytest.mark.parametrize("name", [(), 3, None])
def test_a_coin_case_name_that_is_not_a_string_is_refused_by_name(name):
    """Fails if the name reaches BatchedCase inside the running case (an ``internal error``, as it did
    at batched_coins and vllm_coins) instead of a SpecrefError naming ``name`` and its value."""
    for level, kernel, good in (("batched_coins", C.engine_coin_kernel, C.default_coin_cases()[0]),
                                ("vllm_coins", ec.vllm_coin_reference, ec.default_vllm_coin_cases()[0]),
                                ("tree_coins", C.sglang_coin_kernel, C.default_tree_coin_cases()[2])):
        text = _refused_before_any_case(level, kernel, good, dataclasses.replace(good, name=name))
        assert "name" in text and repr(name) in text, (level, text)


@pytest.mark.parametrize("num_draft", [float("nan"), "ab", 10 ** 400, None, 1.0, True],
                         ids=["nan", "str", "10**400", "None", "1.0", "True"])
def test_a_coin_case_num_draft_that_is_not_counts_is_refused_by_name(num_draft):
    """``num_draft = (value, 2)`` on a ragged case: fails if NaN, a string, 10**400 or None escape as a
    bare ValueError, OverflowError or TypeError (from ``CoinCase.k``, as they did), or if a float or a
    bool is taken as a count (``np.array(..., int64)`` cast them)."""
    for level, kernel, good in (("batched_coins", C.engine_coin_kernel, C.default_coin_cases()[2]),
                                ("vllm_coins", ec.vllm_coin_reference, ec.default_vllm_coin_cases()[1])):
        for value in [(num_draft, 2)] + ([] if num_draft is None else [num_draft]):  # None alone: the default
            text = _refused_before_any_case(level, kernel, good, dataclasses.replace(good, num_draft=value))
            assert "num_draft" in text and f"'{good.name}'" in text and repr(num_draft)[:10] in text, (level, text)


@pytest.mark.parametrize("dtype", [np.array(["float32", "float64"]), np.full((2, 2), np.nan), None],
                         ids=["str array", "NaN array", "None"])
def test_a_coin_case_dtype_that_is_not_a_string_is_refused_by_name(dtype):
    """Fails if an array dtype is compared with the dtype names (NumPy's "truth value of an array is
    ambiguous" ValueError escaped ``check``, as it did at all three coin levels)."""
    for level, kernel, good in (("batched_coins", C.engine_coin_kernel, C.default_coin_cases()[0]),
                                ("vllm_coins", ec.vllm_coin_reference, ec.default_vllm_coin_cases()[0]),
                                ("tree_coins", C.sglang_coin_kernel, C.default_tree_coin_cases()[2])):
        text = _refused_before_any_case(level, kernel, good, dataclasses.replace(good, dtype=dtype))
        assert "dtype" in text and f"'{good.name}'" in text, (level, text)
