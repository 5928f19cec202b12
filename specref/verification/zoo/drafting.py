"""Typical slips in decoders that draft from heads: blockwise parallel decoding and Medusa (SPEC §16).

Leviathan et al. notation (``p`` target).  Every entry is a :class:`DraftingEntry`: an iteration
factory with the reference transition's signature -- :func:`specref.decoding.blockwise.blockwise_transition`
``(target, heads, prompt, *, k, max_new_tokens, stop_tokens=())`` or
:func:`specref.decoding.medusa.medusa_transition` ``(target, heads, prompt, *, choices, max_new_tokens,
config, stop_tokens=())`` -- whose iterations :func:`~specref.verification.laws.enumeration.law_iterated`
enumerates.  Each slip changes one thing in the reference through its hooks.

**What can be caught.**  Both references are lossless for *any* proposals: greedy verification
keeps a proposal only where it is the target's own argmax, and point-mass verification accepts a
deterministic candidate ``x`` with probability ``p~(x)`` whatever put it there.  So a slip in what
is *drafted* alone -- the heads read a stale view, a head's row used one depth off -- leaves the
output law exactly the target's and only costs calls (``changes="drafted"``: kind ``"correct"``,
seen by the efficiency verdict, never by a law).  A slip is caught by the law, or by identity with
greedy decoding, only when it changes what is *verified* or *emitted*; those are the ``"wrong"``
entries, each with the test that catches it (``caught_by``):

=========================  =========  ========  ==========  =============================================
name                       method     changes   caught_by   what is wrong
=========================  =========  ========  ==========  =============================================
verify_wrong_offset        blockwise  verified  greedy      proposal ``d_i`` compared with the target's
                                                            argmax one position later
emits_rejected_proposal    blockwise  emitted   greedy      the first rejected proposal emitted in place
                                                            of the target's own next token
node_judged_by_parent_row  medusa     verified  greedy,     a node's children judged against its parent's
                                                law         row, not the node's own
residual_keeps_rejected    medusa     emitted   law         a rejected candidate is not removed: later
                                                            siblings and the token after the path are
                                                            drawn from the full row
typical_claimed_lossless   medusa     verified  law         typical acceptance (§2.3.1) run where a
                                                            lossless method is claimed
heads_read_stale_view      blockwise  drafted   efficiency  (correct, costlier) the heads read the view
                                                            one token earlier
heads_one_depth_off        medusa     drafted   efficiency  (correct, costlier) depth ``d`` filled from
                                                            head ``d + 1``'s row
top2_selection             blockwise  verified  -           (approximate) Stern et al.'s top-k selection,
                                                            k = 2
typical                    medusa     verified  -           (approximate) the paper's typical acceptance
typical_sampled            medusa     verified  -           (approximate) the token after the prefix drawn
                                                            from ``p``
blockwise_reference        blockwise  -         -           (correct) the reference
medusa_reference           medusa     -         -           (correct) the reference, point mass
=========================  =========  ========  ==========  =============================================

This room never imports ``toy_models``: targets and heads come from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specref.core.draws import draw
from specref.core.errors import SpecrefError
from specref.core.tree import ROOT
from specref.decoding.blockwise import blockwise_transition, ranked
from specref.decoding.medusa import medusa_transition

__all__ = ["DraftingEntry", "DRAFTING_ZOO", "entries", "KINDS", "METHODS"]

KINDS = ("wrong", "approximate", "correct")
METHODS = ("blockwise", "medusa")
CHANGES = ("verified", "emitted", "drafted", "-")


@dataclass(frozen=True)
class DraftingEntry:
    """One named decoder that drafts from heads, and what it is."""

    name: str
    method: str  # "blockwise" | "medusa"
    transition: Callable  # the iteration factory (module docstring)
    kind: str  # "wrong" | "approximate" | "correct"
    changes: str  # what the slip touches: "verified" | "emitted" | "drafted" | "-"
    caught_by: tuple  # ("greedy",): identity with greedy decoding; ("law",): exact law at T = 1; ("efficiency",)
    description: str  # one line

    def __post_init__(self):
        if self.kind not in KINDS or self.method not in METHODS or self.changes not in CHANGES:
            raise SpecrefError(f"DraftingEntry {self.name!r}: kind in {KINDS}, method in {METHODS}, "
                               f"changes in {CHANGES}")
        if self.kind == "wrong" and (self.changes == "drafted" or not self.caught_by):
            raise SpecrefError(f"DraftingEntry {self.name!r}: a wrong entry changes what is verified or "
                               "emitted, and names the test that catches it")
        if not self.description or "\n" in self.description:
            raise SpecrefError(f"DraftingEntry {self.name!r}: the description must be one non-empty line")


# ---------------------------------------------------------------- blockwise


def _wrong_offset(drafts, rows, *, top=1):
    """BUG: ``d_{i+1}`` is compared with row ``i + 1`` (the target after ``d_{i+1}`` itself), not row ``i``."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == ranked(rows[accepted + 1], 1)[0]:
        accepted += 1
    return list(drafts[:accepted]) + [ranked(rows[accepted], 1)[0]]


def verify_wrong_offset(target, heads, prompt, **settings):
    """Blockwise decoding whose verify step reads the target's row one position late."""
    return blockwise_transition(target, heads, prompt, verify=_wrong_offset, **settings)


def _emit_rejected(drafts, rows, *, top=1):
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == ranked(rows[accepted], 1)[0]:
        accepted += 1
    tail = drafts[accepted] if accepted < len(drafts) else ranked(rows[accepted], 1)[0]  # BUG: the proposal
    return list(drafts[:accepted]) + [tail]


def emits_rejected_proposal(target, heads, prompt, **settings):
    """Blockwise decoding that keeps the first rejected proposal instead of the target's own token."""
    return blockwise_transition(target, heads, prompt, verify=_emit_rejected, **settings)


def _stale(context):
    return context[:-1] if len(context) > 1 else context  # one token behind


def heads_read_stale_view(target, heads, prompt, **settings):
    """(correct, costlier) the heads read the view one token before the one that decided the last token."""
    return blockwise_transition(target, heads, prompt, draft_view=_stale, **settings)


def top2_selection(target, heads, prompt, **settings):
    """(approximate) Stern et al.'s top-k selection with k = 2."""
    return blockwise_transition(target, heads, prompt, top=2, **settings)


# ---------------------------------------------------------------- Medusa


def _own_row(tree, node):
    return node


def _pointmass(tree, p_target, rng, *, row=_own_row, remove_rejected=True):
    """Point-mass tree verification with two hooks: the row a node's children are judged by, and
    whether a rejected child is removed from it (and the rest renormalised)."""
    path, node = [], ROOT
    while True:
        p = p_target[row(tree, node)].copy()
        for c in tree.children(node):
            x = tree.tokens[c]
            if rng.random() < p[x]:
                path.append(c)
                node = c
                break
            if remove_rejected:
                p[x] = 0 * p[x]
                p = p / p.sum()
        else:
            return path, draw(rng, p)


def _parent_row(tree, node):
    return tree.parents[node] if node != ROOT else ROOT  # BUG: the parent's row judges the children


def node_judged_by_parent_row(target, heads, prompt, **settings):
    """Medusa whose tree verification judges node ``c``'s children against ``p_target[parent(c)]``."""
    return medusa_transition(target, heads, prompt, verify=lambda tree, p, q, rng: _pointmass(
        tree, p, rng, row=_parent_row), **settings)


def residual_keeps_rejected(target, heads, prompt, **settings):
    """Medusa whose point-mass verification never removes a rejected candidate (no residual)."""
    return medusa_transition(target, heads, prompt, verify=lambda tree, p, q, rng: _pointmass(
        tree, p, rng, remove_rejected=False), **settings)


def typical_claimed_lossless(target, heads, prompt, **settings):
    """Medusa with typical acceptance (paper defaults) in a place where a lossless decoder is claimed."""
    return medusa_transition(target, heads, prompt, verify="typical", **settings)


def typical_sampled(target, heads, prompt, **settings):
    """(approximate) typical acceptance with the token after the prefix drawn from ``p``."""
    return medusa_transition(target, heads, prompt, verify="typical_sampled", **settings)


def _one_depth_off(heads):
    return lambda tokens: heads(tokens)[1:]  # depth d reads head d + 1's row


def heads_one_depth_off(target, heads, prompt, **settings):
    """(correct, costlier) every depth's candidates come from the next head's row (needs K > depth)."""
    return medusa_transition(target, _one_depth_off(heads), prompt, **settings)


def _entries():
    E = DraftingEntry
    return [
        E("verify_wrong_offset", "blockwise", verify_wrong_offset, "wrong", "verified", ("greedy",),
          "proposal d_i compared with the target's argmax one position later"),
        E("emits_rejected_proposal", "blockwise", emits_rejected_proposal, "wrong", "emitted", ("greedy",),
          "the first rejected proposal emitted in place of the target's own next token"),
        E("node_judged_by_parent_row", "medusa", node_judged_by_parent_row, "wrong", "verified",
          ("greedy", "law"), "a node's children judged against its parent's target row"),
        E("residual_keeps_rejected", "medusa", residual_keeps_rejected, "wrong", "emitted", ("law",),
          "rejected candidates stay in the row: no residual"),
        E("typical_claimed_lossless", "medusa", typical_claimed_lossless, "wrong", "verified", ("law",),
          "typical acceptance run where a lossless decoder is claimed"),
        E("heads_read_stale_view", "blockwise", heads_read_stale_view, "correct", "drafted", ("efficiency",),
          "the heads read the view one token earlier: same law, more calls"),
        E("heads_one_depth_off", "medusa", heads_one_depth_off, "correct", "drafted", ("efficiency",),
          "depth d filled from head d + 1's row: same law, more calls"),
        E("top2_selection", "blockwise", top2_selection, "approximate", "verified", (),
          "Stern et al.'s top-k selection with k = 2"),
        E("typical", "medusa", typical_claimed_lossless, "approximate", "verified", (),
          "Medusa's typical acceptance (§2.3.1), greedy token after the prefix"),
        E("typical_sampled", "medusa", typical_sampled, "approximate", "verified", (),
          "typical acceptance with the token after the prefix drawn from p"),
        E("blockwise_reference", "blockwise", blockwise_transition, "correct", "-", (), "the reference"),
        E("medusa_reference", "medusa", medusa_transition, "correct", "-", (), "the reference (point mass)"),
    ]


DRAFTING_ZOO: dict[str, DraftingEntry] = {e.name: e for e in _entries()}


def entries(kind: str | None = None, method: str | None = None) -> list[DraftingEntry]:
    """The entries with the given kind and/or method, in registry order."""
    if kind is not None and kind not in KINDS:
        raise SpecrefError(f"kind must be None or one of {KINDS}, got {kind!r}")
    if method is not None and method not in METHODS:
        raise SpecrefError(f"method must be None or one of {METHODS}, got {method!r}")
    return [e for e in DRAFTING_ZOO.values()
            if (kind is None or e.kind == kind) and (method is None or e.method == method)]
