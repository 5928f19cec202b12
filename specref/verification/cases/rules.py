"""Sampling rules as a parameter: check an implementation against its own declared rules (SPEC §2, §4).

specref's documented order is ``temperature -> top-k -> top-p -> min-p``
(:mod:`specref.core.sampling`).  An implementation that documents another order (say
top-k and top-p before temperature), or that samples through its own processors,
is not wrong for that: speculative decoding must reproduce *its own* plain sampler.
At the logits and decoder levels the oracle therefore accepts ``rules``:

- an **order**, a permutation of :data:`DEFAULT_ORDER` (``("temperature", "top_k", "top_p",
  "min_p")``, specref's own; an implementation might declare ``("top_k", "top_p", "min_p",
  "temperature")``), each rule applied with the case's settings by
  :func:`specref.core.sampling.process_probs` (exact on Fraction rows);
- or a **plain sampler**, ``rules(logits [n, V], config) -> probs [n, V]``: the
  implementation's own processing (float64 logits in; for probability tables ``log p``).

The oracle then draws its draft tokens and computes the target law with those
rules (:func:`ruled`), and the report says "self-consistent with a non-default rule
order" (:class:`RulesReport`) instead of comparing with specref's order.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig, process, process_probs
from specref.verification.running.report import Report

__all__ = ["DEFAULT_ORDER", "declare_rules", "rules_of", "describe_rules", "ruled", "RuledModel", "RulesReport"]

#: specref's order (specref.core.sampling).
DEFAULT_ORDER = ("temperature", "top_k", "top_p", "min_p")


def _check_rules(rules):
    if callable(rules):
        return rules
    order = tuple(rules) if isinstance(rules, (tuple, list)) else None
    if order is None or sorted(order) != sorted(DEFAULT_ORDER):
        raise SpecrefError(f"rules must be a permutation of {DEFAULT_ORDER} or a callable "
                           f"rules(logits [n, V], config) -> probs [n, V], got {rules!r}")
    return order


def describe_rules(rules) -> str:
    """``"top_k -> top_p -> min_p -> temperature"``, or the sampler's name."""
    if callable(rules):
        return f"own sampler {getattr(rules, '__qualname__', None) or type(rules).__name__}"
    return " -> ".join(rules)


class declare_rules:
    """``fn`` with its declared rules attached (``fn.specref_rules``); calls go straight to ``fn``."""

    def __init__(self, fn, rules):
        self.fn, self.specref_rules = fn, _check_rules(rules)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return f"declare_rules({self.fn!r}, {describe_rules(self.specref_rules)})"


def rules_of(fn):
    """The rules ``fn`` declares (``fn.specref_rules``), or None: specref's own order."""
    rules = getattr(fn, "specref_rules", None)
    return None if rules is None else _check_rules(rules)


def _apply_order(order, probs, config):  # [n, V] -> [n, V]
    if config.greedy:  # every rule keeps the most probable token: T = 0 is the argmax in any order
        return process_probs(probs, config)
    one = {"temperature": SamplingConfig(temperature=config.temperature), "top_k": SamplingConfig(top_k=config.top_k),
           "top_p": SamplingConfig(top_p=config.top_p), "min_p": SamplingConfig(min_p=config.min_p)}
    for rule in order:
        probs = process_probs(probs, one[rule])
    return probs


class RuledModel:
    """``model`` seen through ``rules``: ``probs(tokens) -> [n, V]`` rows already processed.

    Read with ``SamplingConfig()`` (no further processing), it is the implementation's
    own plain sampler, which is what :func:`specref.verification.laws.enumeration.target_law` and
    the oracle's draft draws then use.
    """

    def __init__(self, model, rules, config: SamplingConfig):
        self.model, self.rules, self.config = model, _check_rules(rules), config
        self.vocab_size = getattr(model, "vocab_size", None)
        self._memo = {}  # rows per context: an enumeration asks for the same prefixes again and again

    def probs(self, tokens):  # [n] -> [n, V]
        key = tuple(int(t) for t in tokens)
        if key not in self._memo:
            self._memo[key] = self._probs(list(key))
        return self._memo[key].copy()

    def _probs(self, tokens):
        exact = hasattr(self.model, "probs")
        if callable(self.rules):
            rows = np.asarray(self.model.probs(tokens), dtype=np.float64) if exact else self.model(tokens)
            if exact:
                with np.errstate(divide="ignore"):
                    rows = np.log(rows)
            out = np.asarray(self.rules(np.asarray(rows, dtype=np.float64), self.config), dtype=np.float64)
            if out.shape != rows.shape:
                raise SpecrefError(f"rules returned shape {out.shape}, expected {rows.shape}")
            return out / out.sum(axis=-1, keepdims=True)  # float32 processors: renormalise in float64
        probs = self.model.probs(tokens) if exact else process(self.model(tokens), SamplingConfig())
        return _apply_order(self.rules, probs, self.config)

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

    @classmethod
    def of(cls, report: Report, rules) -> "RulesReport":
        return cls(**{f.name: getattr(report, f.name) for f in fields(report)}, rules=describe_rules(rules))

    def __str__(self):
        text = super().__str__()
        head, _, rest = text.partition("\n")
        if self.ok:
            head = (f"{self.level}-level check, {self.mode} mode: self-consistent with a non-default rule order "
                    f"({self.rules}): the speculative output has the law of its own plain sampler")
        else:
            head = head.replace("from the target distribution", f"from its own plain sampler ({self.rules})")
        return head + "\n" + rest
