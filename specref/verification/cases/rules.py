"""Sampling rules as a parameter: check an implementation against its own declared rules (SPEC §2, §4).

specref's documented order is ``temperature -> top-k -> top-p -> min-p``
(:mod:`specref.core.sampling`).  An implementation that documents another order (say
top-k and top-p before temperature), another tie convention, or that samples through
its own processors, is not wrong for that: speculative decoding must reproduce *its own*
plain sampler.  At the logits and decoder levels the oracle therefore accepts ``rules``:

- an **order**, a permutation of :data:`DEFAULT_ORDER` (``("temperature", "top_k", "top_p", "min_p")``,
  specref's own; an implementation might declare ``("top_k", "top_p", "min_p",
  "temperature")``), each rule applied with the case's settings by
  :func:`specref.core.sampling.process_probs` (exact on Fraction rows);
- **conventions** for ties, by name (:data:`CONVENTIONS`), in one :class:`Rules` object
  with the order (``Rules(top_p_ties="lowest_id")``, or a dict of its fields):

  - ``top_p_ties``: the tokens tied with the one that crosses ``top_p``.  ``"keep_all"``
    (specref's rule: every tied token is kept); ``"lowest_id"``: ties ordered by token id,
    lowest first, and the smallest prefix of that order whose mass reaches ``top_p`` kept
    (a stable descending sort and a cumulative-sum cut: one of two tied tokens when one
    suffices); ``"highest_id"``: ties ordered highest id first (a stable *ascending* sort
    cut on the low side, as ``cumsum <= 1 - top_p`` samplers do);
  - ``top_k_ties``: the same three for the k-th largest probability (``"lowest_id"``,
    ``"highest_id"``: exactly k tokens kept);
  - ``greedy_ties``: at temperature 0, ``"lowest_id"`` (specref's argmax),
    ``"highest_id"``, or ``"split"`` (uniform over every tied maximum);

- or a **plain sampler**, ``rules(logits [n, V], config) -> probs [n, V]``: the
  implementation's own processing (float64 logits in; for probability tables ``log p``).

The oracle then draws its draft tokens and computes the target law with those
rules (:func:`ruled`), and the report says "self-consistent with a non-default rule
order" (:class:`RulesReport`) instead of comparing with specref's order.  An unknown
convention name is a :class:`~specref.core.errors.SpecrefError` that lists the known ones.

:func:`parse_rules` reads the command line's form (``python -m specref.verify --rules ...``):
``name=value`` items separated by spaces, the order's rules separated by commas, e.g.
``order=top_k,top_p,min_p,temperature top_p_ties=lowest_id greedy_ties=split``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from specref.core.errors import SpecrefError
from specref.core.numbers import is_exact
from specref.core.sampling import SamplingConfig, process, process_probs
from specref.verification.running.report import Report

__all__ = ["DEFAULT_ORDER", "CONVENTIONS", "Rules", "parse_rules", "declare_rules", "rules_of", "describe_rules",
           "ruled", "apply_rules", "RuledModel", "RulesReport"]

#: specref's order (specref.core.sampling).
DEFAULT_ORDER = ("temperature", "top_k", "top_p", "min_p")

#: The conventions a :class:`Rules` may declare, each with its names; the first is specref's.
CONVENTIONS = {
    "top_p_ties": ("keep_all", "lowest_id", "highest_id"),
    "top_k_ties": ("keep_all", "lowest_id", "highest_id"),
    "greedy_ties": ("lowest_id", "highest_id", "split"),
}


@dataclass(frozen=True)
class Rules:
    """An implementation's declared sampler: the rule order and the tie conventions
    (:data:`CONVENTIONS`), or its own plain ``sampler(logits [n, V], config) -> probs [n, V]``
    (which then decides everything, and ``order`` and the ties are not used)."""

    order: tuple = DEFAULT_ORDER
    top_p_ties: str = "keep_all"
    top_k_ties: str = "keep_all"
    greedy_ties: str = "lowest_id"
    sampler: Callable | None = None

    def __post_init__(self):
        order = tuple(self.order) if isinstance(self.order, (tuple, list)) else None
        if order is None or sorted(order) != sorted(DEFAULT_ORDER):
            raise SpecrefError(f"rules must be a permutation of {DEFAULT_ORDER} or a callable "
                               f"rules(logits [n, V], config) -> probs [n, V], got {self.order!r}")
        object.__setattr__(self, "order", order)
        for name, known in CONVENTIONS.items():
            value = getattr(self, name)
            if value not in known:
                raise SpecrefError(f"unknown {name} convention {value!r}; known: {', '.join(known)} "
                                   f"({known[0]} is specref's)")
        if self.sampler is not None and not callable(self.sampler):
            raise SpecrefError(f"sampler must be a callable rules(logits [n, V], config) -> probs [n, V], "
                               f"got {self.sampler!r:.80}")

    @property
    def conventions(self) -> dict:
        """The declared conventions that are not specref's: ``{name: value}``."""
        return {name: getattr(self, name) for name, known in CONVENTIONS.items() if getattr(self, name) != known[0]}

    @property
    def is_default(self) -> bool:
        """Whether these rules are specref's own (the default order, specref's ties, no sampler)."""
        return self.sampler is None and self.order == DEFAULT_ORDER and not self.conventions


def _check_rules(rules) -> Rules:
    """Any accepted form of ``rules`` as a :class:`Rules`: a Rules, an order, a callable
    sampler, or a dict of Rules fields (``{"top_p_ties": "lowest_id"}``)."""
    if isinstance(rules, Rules):
        return rules
    if callable(rules):
        return Rules(sampler=rules)
    if isinstance(rules, dict):
        unknown = set(rules) - {f.name for f in fields(Rules)}
        if unknown:
            raise SpecrefError(f"unknown rules field(s) {sorted(unknown)}; Rules has order, "
                               f"{', '.join(CONVENTIONS)} and sampler")
        return Rules(**rules)
    return Rules(order=rules)


def parse_rules(text) -> Rules:
    """``"order=top_k,top_p,min_p,temperature top_p_ties=lowest_id"`` (or its items as a list of
    strings) -> :class:`Rules`: ``name=value`` items, ``name`` one of ``order`` and the
    :data:`CONVENTIONS`; items left out keep specref's value.  Anything else is a
    :class:`~specref.core.errors.SpecrefError` naming the item and what is known."""
    if isinstance(text, str):
        items = text.split()
    elif isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
        items = [item for t in text for item in t.split()]
    else:
        raise SpecrefError(f"rules text must be a string of name=value items, got {text!r:.80}")
    known = ("order", *CONVENTIONS)
    if not items:
        raise SpecrefError(f"rules text is empty; give name=value items, name one of {', '.join(known)}")
    given: dict[str, Any] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not value:
            raise SpecrefError(f"rules item {item!r} is not name=value (e.g. top_p_ties=lowest_id)")
        if name not in known:
            raise SpecrefError(f"unknown rules field {name!r} in {item!r}; known: {', '.join(known)}")
        if name in given:
            raise SpecrefError(f"rules field {name!r} is given twice ({given[name]!r} and {value!r})")
        given[name] = value
    if "order" in given:
        given["order"] = tuple(given["order"].split(","))
    return Rules(**given)


def describe_rules(rules) -> str:
    """``"top_k -> top_p -> min_p -> temperature"``, the sampler's name, and any non-default conventions."""
    rules = _check_rules(rules)
    if rules.sampler is not None:
        return f"own sampler {getattr(rules.sampler, '__qualname__', None) or type(rules.sampler).__name__}"
    text = " -> ".join(rules.order)
    return text + "".join(f"; {name.replace('_', ' ')}: {value}" for name, value in rules.conventions.items())


class declare_rules:
    """``fn`` with its declared rules attached (``fn.specref_rules``); calls go straight to ``fn``.

    A batch declaration of ``fn`` (``fn.specref_batch``, :mod:`specref.verification.levels.chain.programs`)
    stays visible on the wrapper."""

    def __init__(self, fn, rules):
        self.fn, self.specref_rules = fn, _check_rules(rules)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        batch = getattr(fn, "specref_batch", None)
        if batch is not None:
            self.specref_batch = batch

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return f"declare_rules({self.fn!r}, {describe_rules(self.specref_rules)})"


def rules_of(fn):
    """The rules ``fn`` declares (``fn.specref_rules``) as a :class:`Rules`, or None: specref's own."""
    rules = getattr(fn, "specref_rules", None)
    return None if rules is None else _check_rules(rules)


# ---------------------------------------------------------------- the rules applied


def _order_key(row, j, ties):
    """Sort key of token ``j`` (most probable first; ties by id as the convention says)."""
    return (-row[j], j if ties == "lowest_id" else -j)


def _keep_first(w, counts, ties):
    """Rows ``w [n, V]`` with only the first ``counts[i]`` tokens of row ``i`` kept, in the
    order of :func:`_order_key`, renormalised (Fraction rows stay exact)."""
    out = w.copy()
    for i, row in enumerate(w):
        order = sorted(range(len(row)), key=lambda j: _order_key(row, j, ties))
        for j in order[counts[i]:]:
            out[i, j] = 0 * row[j]
        out[i] = out[i] / out[i].sum()
    return out


def _top_k(probs, config, ties):
    if ties == "keep_all" or config.top_k is None or config.top_k >= probs.shape[-1]:
        return process_probs(probs, SamplingConfig(top_k=config.top_k))
    w = process_probs(probs, SamplingConfig())  # float64 (or Fraction) rows
    return _keep_first(w, [config.top_k] * w.shape[0], ties)


def _top_p(probs, config, ties):
    if ties == "keep_all" or config.top_p >= 1:
        return process_probs(probs, SamplingConfig(top_p=config.top_p))
    w = process_probs(probs, SamplingConfig())
    counts = []
    for row in w:  # specref's count (the mass before a token < top_p, summed in sorted order), ties not added
        before, n = 0 * row[0], 0
        for v in sorted(row, reverse=True):
            if not before < config.top_p:
                break
            before, n = before + v, n + 1
        counts.append(max(n, 1))
    return _keep_first(w, counts, ties)


def _greedy(probs, ties):
    if ties == "lowest_id":
        return process_probs(probs, SamplingConfig(temperature=0))
    w = process_probs(probs, SamplingConfig())
    exact = is_exact(w)
    one, out = (Fraction(1), np.full(w.shape, Fraction(0), dtype=object)) if exact else (1.0, np.zeros(w.shape))
    for i, row in enumerate(w):
        top = max(row)
        tied = [j for j in range(len(row)) if row[j] == top]
        keep = tied if ties == "split" else tied[-1:]  # split: uniform over the maxima; highest_id: the last
        for j in keep:
            out[i, j] = one / len(keep)
    return out


def _apply_order(rules: Rules, probs, config):  # [n, V] -> [n, V]
    if config.greedy:  # every rule keeps the most probable token: T = 0 is the argmax in any order
        return _greedy(probs, rules.greedy_ties)
    for rule in rules.order:
        if rule == "top_k":
            probs = _top_k(probs, config, rules.top_k_ties)
        elif rule == "top_p":
            probs = _top_p(probs, config, rules.top_p_ties)
        else:
            probs = process_probs(probs, SamplingConfig(**{rule: getattr(config, rule)}))
    return probs


def apply_rules(rows, config: SamplingConfig, rules, *, probs: bool = False):
    """Rows ``[n, V]`` -> the probabilities the declared ``rules`` sample from.

    ``rows`` are logits, or with ``probs=True`` probability rows (exact on Fraction rows
    unless a sampler is declared; a sampler gets ``log p``).  ``rules=None``: specref's own
    (:func:`~specref.core.sampling.process` / :func:`~specref.core.sampling.process_probs`).
    """
    if rules is None:
        return process_probs(rows, config) if probs else process(rows, config)
    rules = _check_rules(rules)
    if rules.sampler is not None:
        rows = np.asarray(rows, dtype=np.float64)
        if probs:
            with np.errstate(divide="ignore"):
                rows = np.log(rows)
        out = np.asarray(rules.sampler(rows, config), dtype=np.float64)
        if out.shape != rows.shape:
            raise SpecrefError(f"rules returned shape {out.shape}, expected {rows.shape}")
        return out / out.sum(axis=-1, keepdims=True)  # float32 processors: renormalise in float64
    return _apply_order(rules, rows if probs else process(rows, SamplingConfig()), config)


class RuledModel:
    """``model`` seen through ``rules``: ``probs(tokens) -> [n, V]`` rows already processed.

    Read with ``SamplingConfig()`` (no further processing), it is the implementation's
    own plain sampler, which is what :func:`specref.verification.laws.enumeration.target_law` and
    the oracle's draft draws then use.
    """

    def __init__(self, model, rules, config: SamplingConfig):
        self.model, self.rules, self.config = model, _check_rules(rules), config
        self.vocab_size = getattr(model, "vocab_size", None)
        self._memo: dict = {}  # rows per context: an enumeration asks for the same prefixes again and again

    def probs(self, tokens):  # [n] -> [n, V]
        key = tuple(int(t) for t in tokens)
        if key not in self._memo:
            self._memo[key] = self._probs(list(key))
        return self._memo[key].copy()

    def _probs(self, tokens):
        exact = hasattr(self.model, "probs")
        rows = self.model.probs(tokens) if exact else self.model(tokens)
        return apply_rules(rows, self.config, self.rules, probs=exact)

    def __repr__(self):
        return f"RuledModel({self.model!r}, {describe_rules(self.rules)})"


def ruled(model, config: SamplingConfig, rules):
    """``(model, config)`` for the oracle's own rows: unchanged when ``rules`` is None,
    else ``(RuledModel(model, rules, config), SamplingConfig())``."""
    if rules is None:
        return model, config
    return RuledModel(model, rules, config), SamplingConfig()


@dataclass
class RulesReport(Report):
    """A report on an implementation checked against its own declared rules."""

    rules: str = ""  # describe_rules(...)
    declared: str = "a non-default rule order"  # what the rules change: the order (or a sampler), or conventions

    @classmethod
    def of(cls, report: Report, rules) -> "RulesReport":
        rules = _check_rules(rules)
        declared = ("declared conventions" if rules.sampler is None and rules.order == DEFAULT_ORDER
                    else "a non-default rule order")
        return cls(**{f.name: getattr(report, f.name) for f in fields(report)}, rules=describe_rules(rules),
                   declared=declared)

    def __str__(self):
        text = super().__str__()
        head, _, rest = text.partition("\n")
        if self.ok:
            head = (f"{self.level}-level check, {self.mode} mode: self-consistent with {self.declared} "
                    f"({self.rules}): the speculative output has the law of its own plain sampler")
        else:
            head = head.replace("from the target distribution", f"from its own plain sampler ({self.rules})")
        return head + "\n" + rest
