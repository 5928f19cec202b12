"""Blockwise parallel decoding: k heads propose, one target call verifies (SPEC §16.1).

Stern, Shazeer & Uszkoreit, *Blockwise Parallel Decoding for Deep Autoregressive Models*
(NeurIPS 2018, arXiv 1811.03115).  Greedy only: the paper's scoring model is greedy decoding
and its guarantee is "the same output as greedy decoding".  In the paper's notation ``p_1`` is
the scoring (target) model and ``p_2 .. p_k`` are proposal models; here the target is ``p_1`` and
the ``k`` **heads** are ``p_2 .. p_{k+1}``, so a block holds up to ``k + 1`` tokens.

**Heads.** ``heads(tokens) -> [K, V]``: ``K >= 1`` probability rows read from **one view** of
``tokens`` (the hidden state at its last position, in the paper and in Medusa).  Row ``j``
(0-based) is the head's distribution of the token ``j + 1`` positions after the target's next
token: with ``n = len(tokens)`` tokens, the target's own row gives the token at (0-based)
position ``n`` and head row ``j`` the token at position ``n + 1 + j``.

One decoding step, the paper's three substeps (its Figure 1):

1. **predict** -- from the view of the context ``c``: the target's next token
   ``y_0 = argmax p(. | c)`` and the proposals ``d_i = argmax heads(c)[i - 1]``, ``i = 1..k``;
2. **verify** -- one target call scores ``c + y_0 + d_1..d_k``: the ``k + 1`` argmax rows
   ``g_i = argmax p(. | c, y_0, d_1..d_i)``, ``i = 0..k``; ``k^`` is the largest ``i`` with
   ``d_j = g_{j-1}`` for every ``j <= i`` (the longest prefix on which the target agrees);
3. **accept** -- ``d_1..d_k^`` join the output, and ``g_k^`` (the target's own next token after
   them) is the next step's ``y_0``.

**Calls.** The paper merges verify with the next predict (its combined scoring and proposal
model): the call that verifies a block also computes, at the last accepted position, the target's
next token and the heads' next proposals.  An iteration here is that one target call
(:func:`blockwise_transition`): the first scores the prompt and decides ``y_0`` only (there are no
proposals yet); every later one verifies the proposals the previous view made and emits
``d_1..d_k^`` and ``g_k^`` -- 1 to ``k + 1`` tokens a call, as Algorithm 1 (SPEC §4).  The state
is the tuple of generated tokens; the heads' view is the context without its last token (the
position whose target row decided it).

**Approximate acceptance.** The paper also trades exactness for speed; ``top > 1`` is its top-k
selection (a proposal passes when it is among the target's ``top`` most likely tokens, ranked at
temperature 1, lowest id first on ties).  It is approximate: its output may differ from greedy
decoding, and the deviation is reported exactly (SPEC §16.1), never called lossless.  The paper's
distance-based selection (for ordinal outputs such as pixel intensities) is not implemented.

Confirmed against the paper: the abstract, the three substeps and Figure 1's caption, the
combined model, and the names of its approximate variants; section numbers are not cited.

- :func:`blockwise_verify`: the verify and accept substeps on the argmax rows;
- :func:`blockwise_transition`: one target call as ``(state, rng) -> (block, next state)`` for
  :func:`specref.verification.laws.enumeration.law_iterated` (the exact law of the output and,
  via :func:`specref.verification.statistics.efficiency.iterations_law`, of the calls);
- :func:`blockwise_decode`: the loop, a :class:`~specref.decoding.chain.DecodeResult`;
- :func:`calls_per_token`: expected target calls per generated token (deterministic: one run).
"""

from __future__ import annotations

from fractions import Fraction

from specref.core.errors import SpecrefError, SpecrefTypeError, check_positive_int, check_prob_rows, check_tokens
from specref.core.sampling import GREEDY, SamplingConfig
from specref.decoding.chain import DecodeResult, kept_block, model_rows, next_token_probs

__all__ = ["head_rows", "ranked", "blockwise_verify", "blockwise_transition", "blockwise_decode",
           "calls_per_token", "window_key", "check_run"]


def ranked(row, r: int) -> list[int]:
    """The ``r`` most likely tokens of ``row`` ([V]), most likely first, lowest id first on ties."""
    return sorted(range(row.shape[0]), key=lambda j: (-row[j], j))[:r]


def head_rows(heads, context, V: int, *, k: int | None = None):
    """``heads(context)`` checked: ``[K, V]`` probability rows, ``K >= 1``; the first ``k`` of them.

    ``[n] -> [k, V]``.  SpecrefError naming ``heads`` and the shape when ``heads`` returns no rows,
    rows of another length than the target's ``V``, or fewer than ``k`` rows.
    """
    if not callable(heads):
        raise SpecrefTypeError(f"heads must be a callable heads(tokens) -> [K, V] rows, got {type(heads).__name__}")
    rows = heads(list(context))
    shape = tuple(getattr(rows, "shape", ()) or ())
    if len(shape) != 2:
        raise SpecrefError(f"heads(tokens) must return rows of shape [K, V], got shape {shape}")
    if shape[0] < 1:
        raise SpecrefError(f"heads(tokens) returned {shape[0]} rows: the heads count K must be >= 1 (shape {shape})")
    if shape[1] != V:
        raise SpecrefError(f"heads(tokens) rows must have the target's V = {V} entries, got shape {shape}")
    rows = check_prob_rows("heads(tokens)", rows)
    if k is not None and k > shape[0]:
        raise SpecrefError(f"k = {k} exceeds the K = {shape[0]} rows heads(tokens) returned")
    return rows if k is None else rows[:k]


def window_key(prompt, window: int):
    """A memo key for :func:`~specref.verification.laws.enumeration.law_iterated` when target and heads
    read at most ``window`` tokens back: the last ``window + 1`` tokens and the count generated
    (the heads' view ends one token before the context)."""
    prompt = tuple(int(t) for t in prompt)
    window = check_positive_int("window", window)

    def key(generated):
        return (prompt + tuple(generated))[-(window + 1):], len(generated)

    return key


def blockwise_verify(drafts, rows, *, top: int = 1) -> list[int]:
    """Verify and accept: ``drafts [k]`` against the target's rows ``[k + 1, V]`` of one call.

    Row ``i`` is the target after ``c, y_0, d_1..d_i``.  ``d_{i+1}`` passes when it is the row's
    argmax (``top = 1``, the paper's rule) or among its ``top`` most likely tokens (top-k
    selection, approximate).  Returns the accepted prefix and the target's argmax after it:
    1 to ``k + 1`` tokens.
    """
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] in ranked(rows[accepted], top):
        accepted += 1
    return list(drafts[:accepted]) + [ranked(rows[accepted], 1)[0]]


def _identity_view(context):
    return context


def check_run(target, prompt, max_new_tokens, stop_tokens) -> tuple[list[int], frozenset, int]:
    """``(prompt, stop tokens, V)`` checked: a non-empty prompt and stop tokens in the target's
    vocabulary (``V`` from ``target.vocab_size`` or one target row), ``max_new_tokens >= 0``."""
    check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
    prompt = check_tokens("prompt", prompt, 2**62)
    if not prompt:
        raise SpecrefError("prompt must hold at least one token (the heads and the target read it), got []")
    V = getattr(target, "vocab_size", None)
    if V is None:
        V = next_token_probs(target, prompt, SamplingConfig(), name="target").shape[-1]
    prompt = check_tokens("prompt", prompt, V)
    return prompt, frozenset(check_tokens("stop_tokens", stop_tokens, V)), int(V)


def _settings(target, prompt, k, max_new_tokens, stop_tokens, top, verify, draft_view):
    prompt, stops, V = check_run(target, prompt, max_new_tokens, stop_tokens)
    k = None if k is None else check_positive_int("k", k)
    top = check_positive_int("top", top)
    for name, hook in (("verify", verify), ("draft_view", draft_view)):
        if hook is not None and not callable(hook):
            raise SpecrefError(f"{name} must be None or a callable, got {hook!r:.80}")
    return prompt, stops, V, k, top


def _step(target, heads, prompt, generated, *, V, k, top, verify, draft_view):
    """One target call after ``generated``: ``(emitted tokens, proposals)`` (no proposals on the first)."""
    config = GREEDY if top == 1 else SamplingConfig()  # top-k selection ranks the temperature-1 rows
    if not generated:  # 1. the call on the prompt: the target's own next token, proposals for the next call
        return [ranked(model_rows(target, prompt, 1, config, name="target")[0], 1)[0]], []
    view = draft_view(prompt + list(generated[:-1]))  # the view that decided generated[-1]
    drafts = [ranked(row, 1)[0] for row in head_rows(heads, view, V, k=k)]  # 1. predict
    rows = model_rows(target, prompt + list(generated) + drafts, len(drafts) + 1, config, name="target")  # 2.
    return verify(drafts, rows, top=top), drafts  # 2.-3. verify and accept


def blockwise_transition(target, heads, prompt, *, k: int | None = None, max_new_tokens: int, stop_tokens=(),
                         top: int = 1, verify=None, draft_view=None, stats: DecodeResult | None = None):
    """One iteration (one target call) of blockwise parallel decoding, as ``(state, rng) -> (block, next state)``.

    ``k`` heads are used (default: every row ``heads`` returns).  The block is cut at the first stop
    token and at ``max_new_tokens`` (:func:`~specref.decoding.chain.kept_block`).  No randomness:
    ``rng`` is not used.  Hooks (the zoo's slips plug in here): ``verify(drafts, rows, top=)`` replaces
    :func:`blockwise_verify`; ``draft_view(context) -> tokens`` replaces the view the heads read.
    ``stats``: a :class:`~specref.decoding.chain.DecodeResult` the iterations are counted into.
    """
    prompt, stops, V, k, top = _settings(target, prompt, k, max_new_tokens, stop_tokens, top, verify, draft_view)
    verify = verify or blockwise_verify
    draft_view = draft_view or _identity_view

    def iteration(generated: tuple, rng):
        emitted, drafts = _step(target, heads, prompt, generated, V=V, k=k, top=top, verify=verify,
                                draft_view=draft_view)
        if stats is not None:
            _record(stats, emitted, drafts)
        return kept_block(generated, emitted, max_new_tokens, stops)

    return iteration


def _record(result: DecodeResult, emitted, drafts) -> None:
    result.iterations += 1
    result.target_calls += 1
    accepted = len(emitted) - 1
    result.accepted_per_iteration.append(accepted)
    if len(result.tested_per_position) < len(drafts):
        grow = len(drafts) - len(result.tested_per_position)
        result.tested_per_position += [0] * grow
        result.accepted_per_position += [0] * grow
    for i in range(min(accepted + 1, len(drafts))):  # proposals 1..accepted+1 were judged
        result.tested_per_position[i] += 1
        result.accepted_per_position[i] += i < accepted


def blockwise_decode(target, heads, prompt, *, k: int | None = None, max_new_tokens: int, stop_tokens=(),
                     top: int = 1) -> DecodeResult:
    """Decode with blockwise parallel decoding until a stop token or ``max_new_tokens``.

    ``iterations == target_calls`` (the call on the prompt included, which emits one token);
    ``accepted_per_iteration`` counts the heads' tokens accepted per call (0 for the first);
    ``tested_per_position[i]`` / ``accepted_per_position[i]``: calls that judged / accepted proposal
    ``i + 1``.  ``draft_calls`` is 0: the heads read the target's own view.
    """
    result = DecodeResult(tokens=[])
    iteration = blockwise_transition(target, heads, prompt, k=k, max_new_tokens=max_new_tokens,
                                     stop_tokens=stop_tokens, top=top, stats=result)
    state = () if max_new_tokens > 0 else None
    while state is not None:
        block, state = iteration(state, None)
        result.tokens += block
    result.stopped = bool(result.tokens) and result.tokens[-1] in set(int(t) for t in stop_tokens)
    return result


def calls_per_token(target, heads, prompt, *, k: int | None = None, max_new_tokens: int, stop_tokens=(),
                    top: int = 1) -> Fraction:
    """Target calls per generated token, exact: greedy decoding is deterministic, so one run is its law.

    ``calls / tokens`` of :func:`blockwise_decode` (the call on the prompt counted).  The exact
    enumerator gives the same number through
    :func:`~specref.verification.statistics.efficiency.iterations_law` of :func:`blockwise_transition`.
    """
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    result = blockwise_decode(target, heads, prompt, k=k, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens,
                              top=top)
    return Fraction(result.target_calls, len(result.tokens))
