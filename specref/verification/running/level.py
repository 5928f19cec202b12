"""What a level is: one object that carries everything the oracle needs to check an implementation there.

A :class:`Level` holds its call (``signature``), its default ``cases``, the validation of a
case, specref's own implementation there (``reference``), the body that judges cases in exact
and statistical mode (``run``), how a statistical (and, where the level knows, an exact) check
of a case plans N and its calls (``planner``, ``exact_planner``), and the keywords of its own
(``options``).  :func:`~specref.verification.oracle.check`,
:func:`~specref.verification.campaigns.planning.plan`, the state check and sweeps read these
fields and never a level's name, so a level defined outside specref and added with
:func:`specref.verification.levels.register` works the same as specref's own.

The registry of every level is :data:`specref.verification.levels.LEVELS`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from specref.core.errors import SpecrefError, SpecrefTypeError

__all__ = ["Level", "Option", "CasePlan", "REQUIRED_PARTS", "missing_parts", "fixed_reference"]


@dataclass(frozen=True)
class Option:
    """One keyword a level takes in ``check`` and ``plan`` besides :class:`Settings`' fields.

    ``check(value) -> value`` validates a given value (SpecrefError naming the option);
    ``declare(fn, value) -> fn`` declares it on the implementation (the chain levels' ``batch``
    and ``rules`` travel with ``fn`` to where its samples are drawn); ``cases(value) -> list``
    gives the default cases under the value (the tree level's ``drafting``), ``for_cases(cases,
    value) -> list`` the cases handed in under it (the batched levels' ``array``).  A value kept
    only on the level (the ``tree_batch`` level's trees per call) is read with :meth:`Level.option`.
    ``declared(fn)``: the value ``fn`` declares itself (an attribute), an error at a level
    without this option.
    """

    name: str
    doc: str  # a few words, for messages: "samples per call"
    phrase: str = ""  # the option in a sentence, "batch (samples per call) applies" (default: "<name> applies")
    default: Any = None  # the value when none is given
    check: Callable[[Any], Any] | None = None
    declare: Callable[[Callable, Any], Callable] | None = None
    cases: Callable[[Any], list] | None = None
    for_cases: Callable[[list, Any], list] | None = None
    declared: Callable[[Callable], Any] | None = None


@dataclass(frozen=True)
class CasePlan:
    """How a check of one case calls the implementation: N, the samples per call and the calls.

    ``timer(calls) -> call`` is built where the calls are timed (a forked worker): ``call(i)``
    makes the check's call ``i`` (``i = 0`` first, then ``1..calls``, each on its own samples).
    No ``timer``: nothing to time (the row gives ``note`` instead)."""

    outcomes: int | None  # outputs with positive target probability (None where the law is not one table)
    n: int | None  # statistical: samples; exact: the implementation calls of the check (None: chosen at run time)
    per_call: int  # samples per call
    calls: int | None  # calls of the implementation the check makes (None: unknown, with the reason in ``note``)
    timer: Callable[[int], Callable[[int], Any]] | None = None
    note: str = ""


@dataclass(frozen=True)
class Level:
    """One protocol level: how the oracle calls an implementation, and what it expects.

    ``run(level, fn, cases, settings) -> Report`` judges the cases in either mode (the exact and
    the statistical body, through :func:`specref.verification.levels.runner.run_cases`); the step,
    logits and decoder levels share :func:`specref.verification.levels.chain.programs.run_programs`.
    ``planner(level, fn, case, settings, seed) -> CasePlan`` plans a statistical check of a case
    (how N, the samples per call and the calls follow from the case); ``exact_planner`` the same
    in exact mode where the level plans it itself (without it: the calls of the level's exact
    check of ``reference``, counted).  Options chosen for a check are kept on a copy of the level
    (:meth:`with_options`) and read with :meth:`option`.
    """

    name: str
    signature: str  # the call, for messages and the CLI's help
    cases: Callable[[], list]  # the default cases
    run: Callable  # (level, fn, cases, settings) -> Report
    tables: str | None = None  # the Case tables this level needs: "probs", "logits", or None for either
    program: Callable | None = None  # run_programs: (fn, case, time_limit) -> (program(rng, impl_rng), exact law)
    validate: Callable | None = None  # (level, case, settings) -> None; SpecrefError for a malformed case
    reference: Callable[[Any], Callable] | None = None  # (declared rules or None) -> specref's own implementation
    statistical: bool = True  # False: coins in, exact out (no statistical mode)
    exact: bool = True  # False: statistical only (float logits, an engine's own generators)
    planner: Callable | None = None  # (level, fn, case, settings, seed) -> CasePlan, statistical mode
    exact_planner: Callable | None = None  # the same in exact mode
    options: tuple[Option, ...] = ()  # the level's own keywords
    chosen: tuple[tuple[str, Any], ...] = ()  # option values given for one check (with_options)
    shorthand: str | None = None  # the 0.2 function name, check_<...>, kept for 0.3 (deprecated)

    def reference_for(self, rules=None) -> Callable | None:
        """specref's own implementation at this level (sampling through ``rules`` where the level
        takes them), or None where it has none."""
        return None if self.reference is None else self.reference(rules)

    def option(self, name: str):
        """The value of option ``name`` for this check: the one chosen, else the option's default."""
        for key, value in self.chosen:
            if key == name:
                return value
        for opt in self.options:
            if opt.name == name:
                return opt.default
        raise SpecrefError(f"the {self.name} level has no option {name!r}; its options: {self.option_names()}")

    def option_names(self) -> list[str]:
        return [opt.name for opt in self.options]

    def with_options(self, **values) -> "Level":
        """A copy of this level with ``values`` chosen (each validated by its option's ``check``);
        a value of None is not given."""
        known = {opt.name: opt for opt in self.options}
        chosen = dict(self.chosen)
        for name, value in values.items():
            if name not in known:
                raise SpecrefError(f"the {self.name} level has no option {name!r}; its options: {self.option_names()}")
            check = known[name].check
            if value is not None:
                chosen[name] = value if check is None else check(value)
        return replace(self, chosen=tuple(chosen.items()))

    def prepared(self, fn, cases) -> tuple[Callable, list]:
        """``fn`` with the chosen options declared on it (in the order the level lists its options),
        and the cases under them (``cases`` None: the level's default cases, or those an option gives)."""
        chosen = dict(self.chosen)
        given = [(opt, chosen[opt.name]) for opt in self.options if opt.name in chosen]
        for opt, value in given:
            if opt.declare is not None:
                fn = opt.declare(fn, value)
            if opt.cases is not None and cases is None:
                cases = opt.cases(value)
        if cases is None:
            cases = self.cases()
        try:
            cases = list(cases)
        except TypeError:
            raise SpecrefTypeError(f"cases must be an iterable of cases, got {cases!r:.80}") from None
        for opt, value in given:
            if opt.for_cases is not None:
                cases = opt.for_cases(cases, value)
        return fn, cases


def fixed_reference(implementation: Callable) -> Callable[[Any], Callable]:
    """A :attr:`Level.reference` for a level whose reference takes no declared rules."""
    return lambda rules: implementation


REQUIRED_PARTS = {"name": "a non-empty str", "signature": "a str (the documented call)",
                  "cases": "a callable returning the default cases", "run": "a callable (level, fn, cases, settings) -> Report"}
"""The parts a level cannot do without, and what each must be (:func:`~specref.verification.levels.register`)."""


def missing_parts(level: Level) -> list[str]:
    """The parts of ``level`` that are missing or malformed, each with what it must be."""
    bad = []
    for part, what in REQUIRED_PARTS.items():
        value = getattr(level, part, None)
        ok = (isinstance(value, str) and bool(value.strip())) if part in ("name", "signature") else callable(value)
        if not ok:
            bad.append(f"{part} ({what}, got {value!r:.60})")
    if level.shorthand is not None and not (isinstance(level.shorthand, str) and level.shorthand.isidentifier()):
        bad.append(f"shorthand (a function name or None, got {level.shorthand!r:.60})")
    for part in ("validate", "reference", "planner", "exact_planner", "program"):
        value = getattr(level, part, None)
        if value is not None and not callable(value):
            bad.append(f"{part} (a callable or None, got {value!r:.60})")
    if not isinstance(level.options, tuple) or not all(isinstance(o, Option) for o in level.options):
        bad.append(f"options (a tuple of Option, got {level.options!r:.60})")
    return bad
