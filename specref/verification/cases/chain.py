"""The oracle's cases: plain data that reproduce a verdict (docs/spec.md §3-§4).

A :class:`Case` holds table models (:mod:`specref.verification.cases.tables`) for target
and draft, a prompt, K and sampling settings, so a counterexample reproduces when it
is passed back in (``check_step(fn, cases=[report.counterexample])``).  Bigram tables
make every row depend on the previous token, which is what exposes bugs such as
judging draft positions after a rejection or a context that is not rolled back.

:func:`default_cases` gives, per protocol level, the fixed edge cases of §3 plus
cases drawn with a fixed seed from :mod:`specref.verification.cases.strategies`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

import numpy as np

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig
from specref.verification.cases.models import PositionLogitTable, PositionProbTable
from specref.verification.cases.tables import LogitTable, ProbTable

__all__ = ["Case", "CASE_LEVELS", "default_cases", "fixed_cases", "strategy_cases", "extra_cases"]

CASE_LEVELS = ("step", "logits", "decoder")  # the levels these tables serve


def _check_level(level):
    if level not in CASE_LEVELS:
        raise SpecrefError(f"level must be one of {', '.join(map(repr, CASE_LEVELS))}, got {level!r}")


@dataclass(frozen=True)
class Case:
    """One input: table models (:mod:`specref.verification.cases.tables`) for target and draft, and settings.

    A table of shape ``[V] * (h + 1)`` holds at ``table[x_1..x_h]`` the row used after
    the tokens ``x_1..x_h`` (``[V, V]``: a bigram).  ``tables`` says what they hold:
    ``"probs"`` (final distributions; step level, or exact models at decoder level) or
    ``"logits"`` (logits level, or logit models).  ``context="position"`` reads a
    ``[V, V, V]`` table as ``table[n % V, sum(prefix) % V]`` instead
    (:mod:`specref.verification.cases.models`): rows that depend on the absolute
    position and on the whole prefix, so a re-fed or shifted context changes the law.
    """

    name: str
    target: np.ndarray  # [V, V] or [V] * (h + 1)
    draft: np.ndarray  # same shape
    prompt: tuple = (0,)
    k: int = 2
    config: SamplingConfig = SamplingConfig()
    max_new_tokens: int = 3  # decoder level only
    stop_tokens: tuple = ()  # decoder level only
    tables: str = "probs"
    context: str = "last"  # "last": rows depend on the last h tokens; "position": on position and whole prefix

    @property
    def vocab_size(self) -> int:
        return self.target.shape[-1]

    def models(self):
        """(target, draft) as specref models: ProbTable or LogitTable."""
        if self.context not in ("last", "position"):
            raise SpecrefError(f"case {self.name!r}: context must be 'last' or 'position', got {self.context!r}")
        if self.context == "position":
            kind = PositionProbTable if self.tables == "probs" else PositionLogitTable
        else:
            kind = ProbTable if self.tables == "probs" else LogitTable
        return kind(self.target), kind(self.draft)

    def as_float(self) -> "Case":
        """The same case with float64 tables (for statistical mode)."""
        return replace(self, target=np.asarray(self.target, dtype=np.float64),
                       draft=np.asarray(self.draft, dtype=np.float64))

    def to_json(self) -> dict:
        def rows(t):
            return np.vectorize(lambda v: str(v) if isinstance(v, Fraction) else float(v), otypes=[object])(t).tolist()

        return {
            "name": self.name, "target": rows(self.target), "draft": rows(self.draft),
            "prompt": list(self.prompt), "k": self.k, "config": dict(vars(self.config)),
            "max_new_tokens": self.max_new_tokens, "stop_tokens": list(self.stop_tokens),
            "tables": self.tables, "context": self.context,
        }

    def __repr__(self):
        return (f"Case({self.name!r}, V={self.vocab_size}, k={self.k}, prompt={self.prompt}, "
                f"config={self.config}, tables={self.tables!r}"
                + (f", context={self.context!r})" if self.context != "last" else ")"))


def _frac_table(rows):
    return np.array([[Fraction(v) for v in row] for row in rows], dtype=object)


def default_cases(level: str, *, drawn: int = 4) -> list[Case]:
    """The fixed edge cases of SPEC §3, seeded random cases, and ``drawn`` cases drawn
    (with a fixed seed) from :mod:`specref.verification.cases.strategies`, for one protocol level."""
    return fixed_cases(level) + (strategy_cases(level, drawn) if drawn else [])


def strategy_cases(level: str, n: int, *, seed: int = 20261129) -> list[Case]:
    """``n`` cases drawn from ``specref.verification.cases.strategies.table_model_pairs`` (V = 3), deterministic in ``seed``.

    Relations between target and draft include identical, independent, disjoint
    (every draft token rejected) and near-equal rows; logits cases also draw a
    sampling configuration.
    """
    from hypothesis import HealthCheck, Phase, given
    from hypothesis import seed as hypothesis_seed
    from hypothesis import settings
    from hypothesis import strategies as st

    from specref.verification.cases import strategies  # hypothesis is imported only when cases are drawn

    _check_level(level)
    kind: Literal["probs", "logits"] = "logits" if level == "logits" else "probs"
    pairs = strategies.table_model_pairs(vocab_size=3, exact=kind == "probs", kind=kind)
    configs = strategies.sampling_configs(vocab_size=3) if level == "logits" else st.just(SamplingConfig())
    drawn = []

    @hypothesis_seed(seed)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(pairs, st.integers(1, 2), configs)
    def collect(pair, k, config):
        drawn.append((pair, k, config))

    collect()
    return [Case(f"drawn-{i}", t.table, d.table, k=k, config=config, tables=kind)
            for i, ((t, d), k, config) in enumerate(drawn[:n])]


def fixed_cases(level: str, *, extra: bool = True) -> list[Case]:
    """The fixed edge cases of SPEC §3 plus seeded random cases, for one protocol level;
    ``extra``: also the greedy and position-aware cases of :func:`extra_cases`."""
    return _fixed_cases(level) + (extra_cases(level) if extra else [])


def extra_cases(level: str) -> list[Case]:
    """Greedy (T = 0) and position-aware cases for one protocol level.

    Greedy: one-hot rows at step level (the final distributions of T = 0), T = 0 on
    logits with a tie (ties go to the lowest id) at the logits and decoder levels.
    Position-aware (``context="position"``): rows that depend on the absolute position
    and on every token of the prefix, which is what shows a re-fed, shifted or
    duplicated context (the n-gram tables only see the last h tokens).
    """
    _check_level(level)
    rng = np.random.default_rng(20261201)
    one_hot = _frac_table([["1", "0", "0"], ["0", "0", "1"], ["0", "1", "0"]])  # greedy p: 0 -> 0, 1 -> 2, 2 -> 1
    other = _frac_table([["1", "0", "0"], ["0", "1", "0"], ["0", "1", "0"]])  # greedy q: agrees after 0 and 2
    ties = rng.normal(0, 1.5, (3, 3))
    ties[1, 2] = ties[1, 0] = ties[1].max() + 0.5  # a tie for the top: T = 0 must pick the lower id, 0
    position = np.stack([_random_table(rng, 3, 0.2) for _ in range(3)])  # [V, V, V] Fractions
    position_q = np.stack([_random_table(rng, 3, 0.0) for _ in range(3)])
    if level == "step":
        return [Case("greedy-one-hot", one_hot, other),
                Case("position-aware", position, position_q, prompt=(0, 1), context="position")]
    if level == "logits":
        return [Case("logits-greedy", ties, rng.normal(0, 1.5, (3, 3)), config=SamplingConfig(temperature=0),
                     tables="logits"),
                Case("logits-position", rng.normal(0, 1.5, (3, 3, 3)), rng.normal(0, 1.5, (3, 3, 3)), prompt=(0, 1),
                     config=SamplingConfig(temperature=0.8, top_p=0.9), tables="logits", context="position")]
    return [Case("greedy", one_hot, other, config=SamplingConfig(temperature=0)),
            Case("greedy-logits", ties, rng.normal(0, 1.5, (3, 3)), config=SamplingConfig(temperature=0),
                 tables="logits"),
            Case("position-aware", position, position_q, prompt=(0, 1), context="position")]


def _fixed_cases(level: str) -> list[Case]:
    _check_level(level)
    rng = np.random.default_rng(20261129)
    if level == "logits":
        cases = []
        configs = [
            SamplingConfig(temperature=0.7), SamplingConfig(top_k=2), SamplingConfig(top_p=0.7),
            SamplingConfig(min_p=0.3), SamplingConfig(temperature=1.3, top_k=3, top_p=0.9, min_p=0.05),
        ]
        for i, config in enumerate(configs):
            t, d = rng.normal(0, 1.5, size=(2, 4, 4))
            cases.append(Case(f"logits-{i}", t, d, k=2, config=config, tables="logits"))
        # rows where the order of the rules matters: top-p before temperature keeps a different set
        peaked = np.log(np.array([[0.5, 0.2, 0.2, 0.1], [0.3, 0.3, 0.25, 0.15],
                                  [0.45, 0.35, 0.15, 0.05], [0.4, 0.4, 0.1, 0.1]]))
        cases.append(Case("logits-rule-order", peaked, peaked[::-1].copy(), k=2, tables="logits",
                          config=SamplingConfig(temperature=0.5, top_k=3, top_p=0.6)))
        return cases
    p = _frac_table([["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"]])
    q = _frac_table([["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"], ["1/2", "1/2", "0"]])
    no_two = _frac_table([["1/2", "1/2", "0"], ["1/4", "3/4", "0"], ["2/3", "1/3", "0"]])
    only_two = _frac_table([["0", "0", "1"]] * 3)
    cases = [
        Case("worked-example-rows", p, q),
        Case("p-equals-q", p, p),
        Case("zeros-in-q", p, q, k=3),
        Case("zeros-in-p", no_two, q),
        Case("always-rejected-at-1", no_two, only_two),
        Case("k-equals-1", p, q, k=1, prompt=(1,)),
        Case("random-dense", _random_table(rng, 3, 0.0), _random_table(rng, 3, 0.0)),
        Case("random-sparse", _random_table(rng, 3, 0.3), _random_table(rng, 3, 0.3), prompt=(2,)),
    ]
    if level == "decoder":
        # whole decodes are enumerated without memoisation: keep K <= 2 and 3 new tokens
        cases = [replace(c, k=min(c.k, 2), max_new_tokens=3) for c in cases]
        cases.append(Case("stop-token", p, q, stop_tokens=(1,), max_new_tokens=3))
        cases.append(Case("logits-top-p", rng.normal(0, 1.5, (3, 3)), rng.normal(0, 1.5, (3, 3)),
                          config=SamplingConfig(temperature=0.8, top_p=0.8), tables="logits"))
        # rows that depend on the last two tokens: a context kept after a rejection shows
        base = _frac_table([["1/2", "1/3", "1/6"], ["1/6", "1/2", "1/3"], ["1/3", "1/6", "1/2"]])
        tri = np.stack([np.roll(base, a, axis=-1) for a in range(3)])  # tri[a][b]: base[b] rotated by a
        cases.append(Case("trigram", tri, np.stack([p, q, p]), prompt=(0, 1), max_new_tokens=3))
    return cases


def _random_table(rng, V, zero_frac):
    counts = rng.integers(1, 7, size=(V, V)) * (rng.random((V, V)) >= zero_frac)
    counts[np.arange(V), rng.integers(V, size=V)] += 1
    return _frac_table([[Fraction(int(c), int(row.sum())) for c in row] for row in counts])
