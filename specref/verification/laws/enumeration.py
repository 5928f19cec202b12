"""The exact verifier: a decoder's output distribution, by replay over its random choices.

SPEC §5.  A randomized decoder ``program(rng) -> output`` draws all its randomness
from the generator it is handed.  :func:`law` hands it an *enumerating* generator
and re-runs it once per path of its tree of random choices:

- ``rng.choice(n, p=probs)`` branches over every index with ``probs > 0``;
- ``rng.random()`` returns a :class:`LazyUniform`, a uniform on ``[0, 1)`` that
  supports only comparisons.  Each comparison ``u < t`` that is not already decided
  splits the interval ``[lo, hi)`` still possible for ``u`` at ``t`` into two
  branches weighted by their lengths; comparing ``u`` again refines the interval.
  Arithmetic on ``u`` raises :class:`LazyUniformError`.

Every run replays a *forced prefix* of earlier decisions, takes branch 0 at each new
decision and leaves the sibling branches (with their path weights) on a stack, so
each run finds exactly one new leaf.  Probabilities multiply along a path and equal
outputs add up.  When every probability is a ``fractions.Fraction`` the law is
exact rationals; otherwise it is float64.

:func:`law_iterated` enumerates a decoder written as repeated
``iteration(state, rng)`` one iteration at a time and memoises the law of the rest
of the output on the state, so the cost grows with (distinct states) x (paths of
one iteration) instead of the product over iterations.

:func:`target_law` is the independent cross-check: the target sampler's law as a
product of conditionals over the tree of prefixes, with no enumeration and no rng.
:func:`compare` measures two laws against each other (total variation, largest
difference on one output, the outputs that differ most).
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Hashable, Mapping

import numpy as np

from specref.core.backend import to_numpy
from specref.core.errors import FLOAT_ROW_TOL, SpecrefError, SpecrefTypeError, check_positive_int, check_tokens
from specref.decoding.chain import next_token_probs  # the query the decoders make; exact sits above decode

__all__ = [
    "DEFAULT_MAX_PATHS",
    "LazyUniform",
    "LazyUniformError",
    "Law",
    "LawComparison",
    "law",
    "law_iterated",
    "iterate",
    "compare",
    "target_law",
]

DEFAULT_MAX_PATHS = 10**7  # program runs before enumeration gives up (a runaway program)
_MAX_ITERATIONS = 100_000  # iterations of one `iterate` run before it is declared endless
_ONE = Fraction(1)  # probability of a certain output
_END = object()  # marks "generation ended" in a one-iteration outcome


class LazyUniformError(SpecrefError):
    """Arithmetic (or another non-comparison use) of a lazy uniform."""


def _show(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------
# Laws
# ---------------------------------------------------------------------------


class Law(dict):
    """An output distribution: ``law[output]`` is its probability (Fraction or float).

    Counts of the enumeration that built it:
    ``paths``  -- program runs (each run is one path of the choice tree);
    ``states`` -- distinct memoised states enumerated (1 for a plain :func:`law`);
    ``leaves`` -- distinct outputs, ``len(law)``.
    """

    def __init__(self, probs=(), *, paths: int = 0, states: int = 0):
        super().__init__(probs)
        exact = all(isinstance(v, (Fraction, int)) for v in self.values())
        for output, v in self.items():  # one float makes the whole law float
            if type(v) is not (Fraction if exact else float):
                self[output] = Fraction(v) if exact else float(v)
        self.paths = paths
        self.states = states

    @property
    def leaves(self) -> int:
        return len(self)

    @property
    def exact(self) -> bool:
        """True when every probability is a Fraction (exact rational arithmetic)."""
        return all(isinstance(v, Fraction) for v in self.values())

    def total(self):
        """Sum of the probabilities: exactly 1 for an exact law, 1 within rounding otherwise."""
        return _sum(self.values())

    def __repr__(self) -> str:
        return f"Law({dict.__repr__(self)}, paths={self.paths}, states={self.states})"


def _sum(values):
    """Exact sum for Fractions, ``math.fsum`` for anything involving floats."""
    values = list(values)
    if all(isinstance(v, (Fraction, int)) for v in values):
        return sum(values, Fraction(0))
    return math.fsum(float(v) for v in values)


def _add(probs: dict, output, weight) -> None:
    try:
        probs[output] = probs.get(output, 0) + weight
    except TypeError:
        raise SpecrefError(
            f"the program's output must be hashable (return a tuple, e.g. tuple(result.tokens)), "
            f"got {type(output).__name__}: {_show(output)}"
        ) from None


# ---------------------------------------------------------------------------
# The lazy uniform
# ---------------------------------------------------------------------------

_ARITHMETIC_HELP = (
    "a lazy uniform from the enumerating generator supports only comparisons with a number "
    "(u < t, u <= t, u > t, u >= t); {what} cannot be enumerated. Compare the uniform with "
    "a threshold (accept if u < p/q), or draw a categorical with rng.choice(n, p=probs)."
)


def _refuse(what: str):
    def method(self, *args, **kwargs):
        raise LazyUniformError(_ARITHMETIC_HELP.format(what=what))

    method.__name__ = what
    return method


_COMPARE_UFUNCS = {np.less: "<", np.less_equal: "<=", np.greater: ">", np.greater_equal: ">="}


class LazyUniform:
    """A uniform on [0, 1) whose value is never fixed: it only answers comparisons.

    ``lo`` and ``hi`` bound the values still possible given the comparisons answered
    so far on this path.  ``u < t`` and ``u <= t`` differ only on a set of measure
    zero and are enumerated alike.
    """

    __slots__ = ("_rng", "lo", "hi", "_split")

    def __init__(self, rng: "_EnumeratingGenerator"):
        self._rng = rng
        self.lo = 0  # ints: exact with Fraction thresholds, cheap to compare with floats
        self.hi = 1
        self._split = False  # True once a comparison has narrowed [lo, hi)

    # u < t and u <= t: "u is below t"; u > t and u >= t: "u is not below t".
    # Reflected comparisons (t > u) reach these through Python's operator swap.
    def __lt__(self, t):
        return self._rng._below(self, t, True, True)

    def __le__(self, t):
        return self._rng._below(self, t, True, False)

    def __gt__(self, t):  # u > t is "not u <= t"
        return self._rng._below(self, t, False, False)

    def __ge__(self, t):  # u >= t is "not u < t"
        return self._rng._below(self, t, False, True)

    def __eq__(self, other):
        if other is self:
            return True
        raise LazyUniformError(_ARITHMETIC_HELP.format(what="an equality test (it has probability 0)"))

    def __ne__(self, other):
        if other is self:
            return False
        raise LazyUniformError(_ARITHMETIC_HELP.format(what="an inequality test (it has probability 1)"))

    __hash__ = object.__hash__

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        # NumPy scalars on the left (np.float64(t) > u) arrive here; answer comparisons only.
        if ufunc in _COMPARE_UFUNCS and method == "__call__" and len(inputs) == 2 and not kwargs:
            a, b = inputs
            if a is self and np.ndim(b) == 0:  # NumPy hands scalars over as 0-d arrays
                return {"<": a.__lt__, "<=": a.__le__, ">": a.__gt__, ">=": a.__ge__}[_COMPARE_UFUNCS[ufunc]](b)
            if b is self and np.ndim(a) == 0:
                # t < u  is  u > t, and so on
                return {"<": b.__gt__, "<=": b.__ge__, ">": b.__lt__, ">=": b.__le__}[_COMPARE_UFUNCS[ufunc]](a)
            what = f"np.{ufunc.__name__} against an array (compare each uniform with a scalar)"
            raise LazyUniformError(_ARITHMETIC_HELP.format(what=what))
        raise LazyUniformError(_ARITHMETIC_HELP.format(what=f"np.{ufunc.__name__}"))

    __add__ = __radd__ = _refuse("addition")
    __sub__ = __rsub__ = _refuse("subtraction")
    __mul__ = __rmul__ = _refuse("multiplication")
    __truediv__ = __rtruediv__ = _refuse("division")
    __floordiv__ = __rfloordiv__ = _refuse("floor division")
    __mod__ = __rmod__ = __divmod__ = __rdivmod__ = _refuse("modulo")
    __pow__ = __rpow__ = _refuse("exponentiation")
    __matmul__ = __rmatmul__ = _refuse("matrix multiplication")
    __neg__ = _refuse("negation")
    __pos__ = _refuse("unary plus")
    __abs__ = _refuse("abs()")
    __float__ = _refuse("float()")
    __int__ = _refuse("int()")
    __index__ = _refuse("use as an index")
    __complex__ = _refuse("complex()")
    __round__ = _refuse("round()")
    __trunc__ = _refuse("math.trunc()")
    __floor__ = _refuse("math.floor()")
    __ceil__ = _refuse("math.ceil()")
    __bool__ = _refuse("truth testing of the uniform itself")

    def __repr__(self) -> str:
        return f"LazyUniform(in [{self.lo}, {self.hi}))"


def _threshold(t):
    """A comparison threshold as a float, an int or a Fraction (None for NaN)."""
    kind = type(t)
    if kind is np.float64 or kind is float:  # the common case first: p/q from float rows
        return None if t != t else float(t)
    if kind is Fraction or kind is int:
        return t
    if isinstance(t, LazyUniform):
        raise LazyUniformError(
            _ARITHMETIC_HELP.format(what="comparing two lazy uniforms (the split is not an interval)")
        )
    if isinstance(t, (bool, np.bool_)):
        raise LazyUniformError(_ARITHMETIC_HELP.format(what=f"comparison with a boolean {t!r}"))
    if isinstance(t, np.ndarray) and t.ndim == 0:
        return _threshold(t.item())
    if isinstance(t, (np.integer, numbers.Rational)):
        return int(t) if isinstance(t, np.integer) else Fraction(t)
    if isinstance(t, (np.floating, numbers.Real)):
        return _threshold(float(t))
    raise LazyUniformError(
        _ARITHMETIC_HELP.format(what=f"comparison with {type(t).__name__} {_show(t)} (not a real number)")
    )


# ---------------------------------------------------------------------------
# The enumerating generator and the replay loop
# ---------------------------------------------------------------------------

_NOT_REPLAYABLE = (
    "the program made different random calls when replayed with the same earlier choices; "
    "it must draw all its randomness from the rng it is given and be otherwise deterministic"
)


class _EnumeratingGenerator:
    """The generator handed to a program on one run: forced prefix, then branch 0.

    A decision is an ``int`` (the index chosen by ``choice``) or a ``bool`` (whether
    a lazy uniform fell below a threshold).  Paths are cons cells ``(parent, decision)``
    so that pushing a sibling branch costs O(1), not a copy of the path.

    A path's probability is (the product of its ``choice`` probabilities, carried in
    ``_weight`` and on the stack) x (the length of the final interval of every lazy
    uniform it narrowed, multiplied in at the leaf).  Taking interval lengths at the
    end, rather than multiplying conditional ratios per comparison, saves a division
    per comparison and a rounding error per refinement.
    """

    __slots__ = ("_forced", "_n_forced", "_pos", "_node", "_weight", "_stack", "_split", "_grid")

    def __init__(self, forced: list, node, weight, stack: list, grid: int | None = None):
        self._forced = forced
        self._n_forced = len(forced)
        self._pos = 0
        self._node = node  # the path so far (new decisions hang below it)
        self._weight = weight  # product of the path's choice probabilities
        self._stack = stack  # branches still to explore: (node, choice weight)
        self._split: list = []  # lazy uniforms narrowed on this run
        self._grid = grid  # None: continuous uniforms; m: uniforms on the grid {k 2^-m} in [0, 1)

    def _branch(self, branches: list):
        """Take ``branches[0]``, leave the others for later runs; returns its decision."""
        node, weight = self._node, self._weight
        push = self._stack.append
        for decision, w in branches[1:]:
            push(((node, decision), weight * w))
        decision, w = branches[0]
        self._node = (node, decision)
        self._weight = weight * w
        return decision

    def _path_probability(self):
        w = self._weight
        for u in self._split:
            w = w * (u.hi - u.lo)
        return w

    # -- uniforms -----------------------------------------------------------

    def random(self, size=None, dtype=None, out=None):
        """A :class:`LazyUniform` (``size=None``) or an object array of them."""
        if out is not None:
            raise SpecrefError("rng.random(out=...) is not supported by the enumerating generator")
        if dtype is not None and np.dtype(dtype) != np.float64:
            raise SpecrefError(f"rng.random(dtype=...) must be float64 when enumerating, got {dtype!r}")
        if size is None:
            return LazyUniform(self)
        arr = np.empty(size, dtype=object)
        flat = arr.reshape(-1)
        for i in range(flat.size):
            flat[i] = LazyUniform(self)
        return arr

    def _below(self, u: LazyUniform, t, want: bool, strict: bool = True) -> bool:
        """Answer "u is below t" (== want): decided by the interval, forced, or a new branch.

        ``strict``: below means ``u < t`` (else ``u <= t``).  For a continuous uniform the two
        differ on a set of measure zero; on the grid of ``law(..., grid=m)`` the comparison
        splits at the first grid point not below t, so ``u <= 0`` has probability ``2^-m``.
        """
        if u._rng is not self:
            raise SpecrefError("a lazy uniform was kept from another run of the program and compared later")
        t = _threshold(t)
        if t is None:  # NaN: every comparison is False, as for a real float
            return False
        if self._grid is not None:  # the grid points below t are k 2^-m with k < s
            scaled = Fraction(t) * (1 << self._grid)  # exact: floats are dyadic rationals
            s = math.ceil(scaled) if strict else math.floor(scaled) + 1
            t = Fraction(s, 1 << self._grid)
        lo, hi = u.lo, u.hi
        if t <= lo:
            return not want  # u >= lo >= t: never below
        if t >= hi:
            return want  # u < hi <= t: always below
        pos = self._pos
        if pos < self._n_forced:
            below = self._forced[pos]
            self._pos = pos + 1
            if below.__class__ is not bool:
                raise SpecrefError(_NOT_REPLAYABLE)
        else:  # a new decision: explore "below" now, "not below" on a later run
            node = self._node
            self._stack.append(((node, False), self._weight))
            self._node = (node, True)
            below = True
        if not u._split:
            u._split = True
            self._split.append(u)
        if below:
            u.hi = t
        else:
            u.lo = t
        return below is want

    # -- categoricals -------------------------------------------------------

    def choice(self, a, size=None, replace=True, p=None, axis=0, shuffle=True):
        """Like ``numpy.random.Generator.choice`` with replacement: branches over ``p > 0``."""
        if size is not None:
            if not replace:
                raise SpecrefError("rng.choice(replace=False) is not supported by the enumerating generator")
            shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
            out = [self.choice(a, p=p) for _ in range(math.prod(shape))]
            return np.array(out).reshape(shape)
        pos = self._pos
        if pos < self._n_forced:  # replay: the branch was validated on the run that made it
            index = self._forced[pos]
            self._pos = pos + 1
            if index.__class__ is bool:
                raise SpecrefError(_NOT_REPLAYABLE)
        else:
            index = self._branch(_choice_branches(a, p))
        if isinstance(a, (int, np.integer)):
            return index
        return a[index]

    def integers(self, low, high=None, size=None, endpoint=False):
        """A uniform integer in ``[low, high)`` (``[0, low)`` when ``high`` is None)."""
        if high is None:
            low, high = 0, low
        if endpoint:
            high = high + 1
        n = int(high) - int(low)
        if n < 1:
            raise SpecrefError(f"rng.integers needs high > low, got low={low}, high={high}")
        if size is not None:
            return int(low) + self.choice(n, size=size)
        return int(low) + self.choice(n)

    def __getattr__(self, name):
        raise SpecrefError(
            f"the enumerating generator has no {name!r}: a program under enumeration may use only "
            f"rng.choice(n, p=probs), rng.random() (compare it with thresholds) and rng.integers(n)"
        )


def _choice_branches(a, p) -> list:
    """``[(index, probability)]`` over indices with positive probability, validated."""
    if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
        n = int(a)
    else:
        try:
            n = len(a)
        except TypeError:
            raise SpecrefError(f"rng.choice: a must be an int or a sequence, got {_show(a)}") from None
    if n < 1:
        raise SpecrefError(f"rng.choice: a must be a positive int or a non-empty sequence, got {_show(a)}")
    if p is None:
        w = Fraction(1, n)  # exact; it turns float when multiplied with a float weight
        return [(i, w) for i in range(n)]
    row = to_numpy(p)
    if row.ndim != 1 or row.shape[0] != n:
        raise SpecrefError(f"rng.choice: p must be a 1-D array of length {n}, got shape {tuple(row.shape)}")
    if row.dtype.kind not in "fiuO":
        raise SpecrefError(f"rng.choice: p must hold real numbers, got dtype {row.dtype}")
    vals = row.tolist()  # Python numbers: for the small V enumerated, faster than NumPy calls
    if row.dtype == object:
        for i, v in enumerate(vals):
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise SpecrefError(f"rng.choice: p[{i}] must be a number, got {_show(v)}")
        if all(isinstance(v, (Fraction, int)) for v in vals):
            if min(vals) < 0:
                raise SpecrefError(f"rng.choice: p must be non-negative, got {_show(vals)}")
            total = sum(vals, Fraction(0))
            if total != 1:
                raise SpecrefError(f"rng.choice: p sums to {total}, not exactly 1")
            return [(i, v) for i, v in enumerate(vals) if v > 0]
        vals = [float(v) for v in vals]
    if not all(map(math.isfinite, vals)):
        raise SpecrefError(f"rng.choice: p must be finite, got {_show(vals)}")
    if min(vals) < 0:
        raise SpecrefError(f"rng.choice: p must be non-negative, got {_show(vals)}")
    total = math.fsum(vals)
    if abs(total - 1.0) > FLOAT_ROW_TOL:
        raise SpecrefError(f"rng.choice: p sums to {total!r}, not 1 (tolerance {FLOAT_ROW_TOL})")
    # NumPy's Generator.choice samples from p / sum(p); so does the enumeration.
    return [(i, v / total) for i, v in enumerate(vals) if v > 0]


def _enumerate(program: Callable, leaf: Callable, max_paths: int, paths: int = 0, grid: int | None = None) -> int:
    """Run ``program`` once per path, calling ``leaf(output, probability)``.

    ``paths`` runs were already spent (by earlier states); returns the new total.
    """
    stack: list = [(None, 1)]  # int 1: exact with Fractions, float with floats, cheap either way
    while stack:
        node, weight = stack.pop()
        paths += 1
        if paths > max_paths:
            raise SpecrefError(
                f"enumeration exceeded max_paths={max_paths} program runs; shrink the problem "
                f"(vocabulary, K, length), memoise with law_iterated, or raise max_paths"
            )
        forced = []
        cell = node
        while cell is not None:  # the path's decisions, root first
            cell, decision = cell
            forced.append(decision)
        forced.reverse()
        rng = _EnumeratingGenerator(forced, node, weight, stack, grid)
        output = program(rng)
        if rng._pos < rng._n_forced:
            raise SpecrefError(_NOT_REPLAYABLE)
        leaf(output, rng._path_probability())
    return paths


# ---------------------------------------------------------------------------
# Public enumeration
# ---------------------------------------------------------------------------


def law(program: Callable[[Any], Hashable], *, max_paths: int = DEFAULT_MAX_PATHS, grid: int | None = None) -> Law:
    """The exact output distribution of ``program(rng) -> output`` (output hashable).

    ``program`` is run once per path of its tree of random choices, each time with a
    fresh enumerating generator (``choice``, ``random``, ``integers``).  Equal outputs
    add up.  Probabilities are Fractions when every probability the program used was
    a Fraction (or came from ``choice(n)`` without ``p``), float64 otherwise.
    Exceptions raised by ``program`` propagate.  More than ``max_paths`` runs raise
    SpecrefError.

    ``grid``: None (default) for continuous uniforms; an int ``m`` (24 for float32 coins,
    53 for float64) makes every ``rng.random()`` uniform on ``{k 2^-m : 0 <= k < 2^m}``, the
    coins engines draw, so that ``u <= t`` and ``u < t`` differ by ``2^-m`` where ``t`` is a
    grid point (``u <= 0`` included) and an inclusive test shows as an exact, nonzero TV.

    >>> law(lambda rng: rng.choice(2, p=[Fraction(1, 3), Fraction(2, 3)]))
    Law({0: Fraction(1, 3), 1: Fraction(2, 3)}, paths=2, states=1)
    """
    max_paths = check_positive_int("max_paths", max_paths)
    if grid is not None:
        grid = check_positive_int("grid", grid)
    if not callable(program):
        raise SpecrefTypeError(f"program must be a callable program(rng) -> output, got {_show(program)}")
    probs: dict = {}
    paths = _enumerate(program, lambda output, w: _add(probs, output, w), max_paths, grid=grid)
    return Law(probs, paths=paths, states=1)


def iterate(start_state, iteration: Callable, rng) -> tuple:
    """Run ``iteration(state, rng) -> (block, next_state)`` from ``start_state`` until
    ``next_state`` is None; the concatenated blocks, as a tuple of ints.

    This is the program that :func:`law_iterated` enumerates one iteration at a time;
    ``law(lambda rng: iterate(start, iteration, rng))`` is the same law, unmemoised.
    """
    out: list = []
    state = start_state
    for _ in range(_MAX_ITERATIONS):
        if state is None:
            return tuple(out)
        block, state = iteration(state, rng)
        out.extend(int(x) for x in block)
    raise SpecrefError(f"iteration did not end generation within {_MAX_ITERATIONS} iterations")


def law_iterated(
    start_state,
    iteration: Callable,
    *,
    key: Callable | None = None,
    memoise: bool = True,
    max_paths: int = DEFAULT_MAX_PATHS,
) -> Law:
    """The law of the concatenated output of a decoder written as repeated iterations.

    ``iteration(state, rng) -> (block, next_state)``: one iteration emits the tokens
    ``block`` and returns the next state, or None once generation has ended.  Each
    state's law is enumerated once, memoised on ``key(state)`` (default: the state
    itself, which must then be hashable):

        law(state) = sum over one-iteration outcomes (block, next) of
                     P(block, next) x [block + rest for rest ~ law(next)]

    so the cost grows with (distinct keys) x (paths of one iteration), not with the
    product over iterations.  ``key`` must capture everything the rest of the output
    depends on; for bigram models ``(last token, tokens generated)`` is enough.
    A start state of None gives the empty output with probability 1.

    ``memoise=False`` enumerates the whole run (:func:`iterate`) with :func:`law`
    instead -- the independent route the tests compare against.

    Counts on the result: ``paths`` (program runs, over all states), ``states``
    (distinct keys enumerated), ``leaves`` (distinct outputs).  ``max_paths`` caps
    the total number of program runs.
    """
    max_paths = check_positive_int("max_paths", max_paths)
    if not memoise:
        return law(lambda rng: iterate(start_state, iteration, rng), max_paths=max_paths)
    if start_state is None:
        return Law({(): _ONE}, paths=0, states=0)
    key_of = _memo_key(key)
    start_key = key_of(start_state)
    memo, paths = _memoised_laws(iteration, start_state, start_key, key_of, max_paths)
    return Law(memo[start_key], paths=paths, states=len(memo))


def _memo_key(key) -> Callable:
    """``key_of(state)``: ``key(state)`` (the state itself when ``key`` is None), checked hashable."""
    key = (lambda s: s) if key is None else key

    def key_of(state):
        k = key(state)
        try:
            hash(k)
        except TypeError:
            raise SpecrefError(
                f"law_iterated: the memo key of a state must be hashable, got {_show(k)} "
                f"(pass key=... mapping the state to a tuple)"
            ) from None
        return k

    return key_of


def _memoised_laws(iteration, start_state, start_key, key_of, max_paths) -> tuple:
    """The law of the rest of the output from every key reachable from the start.

    Depth-first: a key's one-iteration outcomes are enumerated once (:func:`_outcomes`), and its
    law is combined (:func:`_combine`) once the laws of all its successors are known.
    Returns ``({key: {rest of output: probability}}, program runs)``.
    """
    memo: dict = {}  # key -> {rest of output: probability}
    steps: dict = {}  # key -> one-iteration outcomes {(block, next key or _END): probability}
    states: dict = {start_key: start_state}  # key -> a representative state
    paths = 0
    stack = [start_key]  # depth-first; a key is combined once all its successors are known
    on_stack = {start_key}
    while stack:
        k = stack[-1]
        if k not in steps:
            steps[k], paths = _outcomes(iteration, states[k], key_of, states, max_paths, paths)
        pending = [nk for (_, nk) in steps[k] if nk is not _END and nk not in memo]
        if pending:
            _refuse_recurrence(pending, on_stack)
            nk = pending[0]
            stack.append(nk)
            on_stack.add(nk)
            continue
        stack.pop()
        on_stack.discard(k)
        memo[k] = _combine(steps.pop(k), memo)
    return memo, paths


def _outcomes(iteration, state, key_of, states: dict, max_paths: int, paths: int) -> tuple:
    """One iteration from ``state``, enumerated: ``{(block, next key or _END): probability}``.

    Each next state is kept in ``states`` under its key (the first one seen).  ``paths`` program
    runs were spent already; returns ``(outcomes, the new total)``.
    """
    outcomes: dict = {}

    def leaf(output, w):
        block, nxt = output
        block = tuple(int(x) for x in block)
        if nxt is None:
            nk = _END
        else:
            nk = key_of(nxt)
            states.setdefault(nk, nxt)
        outcomes[block, nk] = outcomes.get((block, nk), 0) + w

    paths = _enumerate(lambda rng: iteration(state, rng), leaf, max_paths, paths)
    return outcomes, paths


def _refuse_recurrence(pending, on_stack) -> None:
    """SpecrefError when a successor key is still being expanded: a key that recurs along one run."""
    for nk in pending:
        if nk in on_stack:
            raise SpecrefError(
                f"law_iterated: the state key {_show(nk)} recurs along one run, so generation "
                f"could go on forever; make the key include how many tokens were generated"
            )


def _combine(outcomes: dict, memo: dict) -> dict:
    """``law(state) = sum over (block, next) of P(block, next) x [block + rest for rest ~ law(next)]``."""
    rest: dict = {}
    for (block, nk), w in outcomes.items():
        if nk is _END:
            rest[block] = rest.get(block, 0) + w
        else:
            for tail, pw in memo[nk].items():
                out = block + tail
                rest[out] = rest.get(out, 0) + w * pw
    return rest


# ---------------------------------------------------------------------------
# The product of conditionals (no enumeration)
# ---------------------------------------------------------------------------


TARGET_LAW_MAX_PREFIXES = 10**5  # model queries of target_law before it gives up (the verify matrix needs < 4e4)


def target_law(model, prompt, config, max_new_tokens: int, stop_tokens=(), *,
               max_paths: int = TARGET_LAW_MAX_PREFIXES) -> Law:
    """The target sampler's law as a product of conditionals over the tree of prefixes.

    For every prefix, the next-token row is ``specref.decoding.chain.next_token_probs(model,
    prompt + prefix, config)`` -- the same query the decoders make.  A generated stop
    token ends its sequence (and is part of it); so does reaching ``max_new_tokens``.
    Tokens with probability 0 open no branch.  No rng and no enumeration: this is the
    independent cross-check of :func:`law`.  ``paths`` counts model queries; more than
    ``max_paths`` of them raise SpecrefError (16 new tokens over V = 3 would be 2e7).
    """
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
    max_paths = check_positive_int("max_paths", max_paths)
    prompt = check_tokens("prompt", prompt, sys.maxsize)  # ids checked against V below
    if not prompt:
        raise SpecrefError("prompt must hold at least one token (models condition on it), got []")
    first = next_token_probs(model, prompt, config, name="model")  # [V]; also fixes V for the checks
    prompt = check_tokens("prompt", prompt, first.shape[0])
    stops = frozenset(check_tokens("stop_tokens", stop_tokens, first.shape[0]))
    if max_new_tokens == 0:
        return Law({(): _ONE}, paths=1, states=1)
    probs: dict = {}
    queries = 0
    stack: list[tuple[tuple[int, ...], Any]] = [((), _ONE)]  # (generated prefix, its probability)
    while stack:
        prefix, w = stack.pop()
        queries += 1
        if queries > max_paths:
            raise SpecrefError(f"target_law exceeded max_paths={max_paths} prefixes (model queries); "
                               f"shrink max_new_tokens ({max_new_tokens}) or the vocabulary, or raise max_paths")
        row = first if not prefix else next_token_probs(model, prompt + list(prefix), config, name="model")
        exact = row.dtype == object
        values = row.tolist()
        for x, px in enumerate(values):
            if not px > 0:
                continue
            seq = prefix + (x,)
            pw = w * (px if exact else float(px))
            if x in stops or len(seq) >= max_new_tokens:
                probs[seq] = probs.get(seq, 0) + pw
            else:
                stack.append((seq, pw))
    return Law(probs, paths=queries, states=queries)


# ---------------------------------------------------------------------------
# Comparing laws
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LawComparison:
    """Two laws measured against each other."""

    tv: Any  # total variation 1/2 sum |a - b| over the union of outputs (Fraction when both are exact)
    max_diff: Any  # largest |a - b| on one output
    worst: tuple  # ((output, a, b), ...) by |a - b| descending, at most `top` of them
    n_outputs: int  # outputs in the union of the two supports
    exact: bool  # True when both laws hold only Fractions (then tv == 0 means equal)
    law_a: Mapping | None = field(default=None, repr=False, compare=False)  # the first law (the runner's state check)

    def __str__(self) -> str:
        lines = [f"TV = {self.tv} ({float(self.tv):.3e}), max |a - b| = {float(self.max_diff):.3e} "
                 f"over {self.n_outputs} outputs{' (exact)' if self.exact else ''}"]
        for output, a, b in self.worst:
            if a != b:
                lines.append(f"  {output}: {a} vs {b}")
        return "\n".join(lines)


LAW_TOTAL_TOL = 1e-6  # a float law must sum to 1 within this (enumerated laws: ~1e-12)


def _check_law(name, values):
    if not isinstance(values, Mapping):
        raise SpecrefError(f"{name} must be a mapping output -> probability (a Law), got {type(values).__name__}")
    for output, v in values.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise SpecrefError(f"{name}[{_show(output)}] must be a probability, got {_show(v)}")
        if not (isinstance(v, (Fraction, int)) or math.isfinite(v)) or v < 0:
            raise SpecrefError(f"{name}[{_show(output)}] = {_show(v)} is not a probability (finite, >= 0)")
    total = _sum(values.values())
    exact = isinstance(total, Fraction)
    if (total != 1) if exact else not abs(total - 1) <= LAW_TOTAL_TOL:
        raise SpecrefError(f"{name} sums to {total}, not {'exactly ' if exact else ''}1: not a normalised law")


def compare(law_a: Mapping, law_b: Mapping, *, top: int = 10) -> LawComparison:
    """Total variation, largest difference on one output, and the outputs that differ most.

    Outputs missing from one law have probability 0 there.  Each law must be a mapping
    of probabilities: real, finite, non-negative, summing to 1 (exactly for Fractions,
    within ``LAW_TOTAL_TOL`` for floats); else SpecrefError naming ``law_a`` or ``law_b``.
    """
    top = check_positive_int("top", top, minimum=0)
    _check_law("law_a", law_a)
    _check_law("law_b", law_b)
    exact = all(isinstance(v, (Fraction, int)) for v in (*law_a.values(), *law_b.values()))
    rows = [(o, law_a.get(o, 0), law_b.get(o, 0)) for o in {**dict.fromkeys(law_a), **dict.fromkeys(law_b)}]
    diffs = [abs(a - b) for _, a, b in rows]
    if exact:
        tv = sum(diffs, Fraction(0)) / 2
        max_diff = max(diffs, default=Fraction(0))
    else:
        tv = math.fsum(float(d) for d in diffs) / 2
        max_diff = float(max(diffs, default=0.0))
    order = sorted(range(len(rows)), key=lambda i: diffs[i], reverse=True)[:top]
    return LawComparison(tv=tv, max_diff=max_diff, worst=tuple(rows[i] for i in order),
                      n_outputs=len(rows), exact=exact, law_a=law_a)
