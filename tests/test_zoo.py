"""The zoo (SPEC §7): every wrong entry is caught exactly, the correct ones pass.

Independent of the oracle: each entry is lifted into a program by hand here and
enumerated with :mod:`specref.verification.laws.enumeration` (or sampled, for the statistical-only entry).

- step level: one speculative block on bigram tables (V = 3, K = 2), completed to
  K + 1 tokens by target sampling, against the target's law of K + 1 tokens;
- logits level: the same on logit tables, with temperature and top-p;
- decoders: the whole output (max_new_tokens = 3, a stop token) on n-gram models
  of order 3 (the rolled-back context is only visible two tokens back).
"""

from collections import Counter
from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.sampling import SamplingConfig, process
from specref.core.step import draw
from specref.decoding.chain import next_token_probs, speculative_block
from specref.verification.zoo import chain as zoo
from specref.verification.cases.chain import extra_cases
from specref.verification.laws.enumeration import compare, law, target_law
from specref.verification.statistics.counts import detectable_tv, g_test, samples_needed
from specref.verification.cases.tables import LogitTable, ProbTable
from tests.implementations import decoder_reference, logits_reference
from toy_models.ngram import NGramModel

K = 2

# ---------------------------------------------------------------- step level: exact bigram tables
# Row 0 of each is the worked example of SPEC §3 (p = [1/5, 1/2, 3/10], q = [3/5, 3/10, 1/10]).
P_TABLE = np.array(
    [[F(1, 5), F(1, 2), F(3, 10)], [F(1, 2), F(1, 6), F(1, 3)], [F(1, 4), F(1, 4), F(1, 2)]], dtype=object
)
Q_TABLE = np.array(
    [[F(3, 5), F(3, 10), F(1, 10)], [F(1, 3), F(1, 3), F(1, 3)], [F(1, 10), F(7, 10), F(1, 5)]], dtype=object
)
STEP_TARGET, STEP_DRAFT = ProbTable(P_TABLE), ProbTable(Q_TABLE)
STEP_PROMPT = [0]
PLAIN = SamplingConfig()


def completed(target, prompt, block, config, rng):
    """The block followed by target samples up to K + 1 tokens (a prefix of a correct law is correct)."""
    out = list(block)
    while len(out) < K + 1:
        out.append(draw(rng, next_token_probs(target, prompt + out, config)))
    return tuple(out)


def step_law(fn, target=STEP_TARGET, draft=STEP_DRAFT):
    def program(rng):
        block = speculative_block(target, draft, STEP_PROMPT, k=K, config=PLAIN, rng=rng, step=fn)
        return completed(target, STEP_PROMPT, block, PLAIN, rng)

    return law(program)


STEP_TRUTH = target_law(STEP_TARGET, STEP_PROMPT, PLAIN, K + 1)

# ---------------------------------------------------------------- logits level: float logit tables
# After token 1 the target's softmax is [0.5, 0.3, 0.2]: at temperature 1/2 it is
# [0.66, 0.24, 0.10] and top-p 0.6 keeps token 0 alone, while top-p on the untempered
# row keeps tokens 0 and 1 -- the order of the rules matters (rules_reordered).  After
# token 0 top-p cuts token 2 from the draft (top_p_target_only).
LOGIT_CONFIG = SamplingConfig(temperature=0.5, top_p=0.6)
LOGIT_TARGET = LogitTable(np.log([[0.3, 0.3, 0.4], [0.5, 0.3, 0.2], [0.2, 0.45, 0.35]]))
LOGIT_DRAFT = LogitTable(np.log([[0.45, 0.35, 0.2], [0.3, 0.3, 0.4], [0.1, 0.6, 0.3]]))
LOGIT_PROMPT = [0]


def logits_law(fn, config=LOGIT_CONFIG):
    def program(rng):
        drafted = []
        for _ in range(K):  # the draft tokens come from the correctly processed draft
            drafted.append(draw(rng, process(LOGIT_DRAFT(LOGIT_PROMPT + drafted)[-1], config)))
        full, n = LOGIT_PROMPT + drafted, len(LOGIT_PROMPT)
        target_logits = LOGIT_TARGET(full)[n - 1 :]  # [K+1, V]
        draft_logits = LOGIT_DRAFT(full)[n - 1 : n - 1 + K]  # [K, V]
        block = fn(target_logits, draft_logits, np.array(drafted), config, rng)
        return completed(LOGIT_TARGET, LOGIT_PROMPT, block, config, rng)

    return law(program)


# ---------------------------------------------------------------- decoders: exact n-gram models
DEC_TARGET = NGramModel.random(order=3, vocab_size=3, seed=5).exact
DEC_DRAFT = NGramModel.random(order=2, vocab_size=3, seed=6).exact
DEC_PROMPT, DEC_STOP, DEC_MAX = [0, 1], (2,), 3
# bonus_from_draft drafts k + 1 tokens: at k = 2 its tree has 5,464 paths (~12 s), at k = 1 360.
DEC_K = {"bonus_from_draft": 1}
# kv_cache_refeeds_prefix leaves the last tokens right, so only a position-aware model sees it
DEC_POSITION = next(c for c in extra_cases("decoder") if c.name == "position-aware")


def decoder_law(fn, k=K):
    return law(lambda rng: tuple(fn(DEC_TARGET, DEC_DRAFT, DEC_PROMPT, k=k, config=PLAIN,
                                    max_new_tokens=DEC_MAX, stop_tokens=DEC_STOP, rng=rng)))


DEC_TRUTH = target_law(DEC_TARGET, DEC_PROMPT, PLAIN, DEC_MAX, DEC_STOP)


def exact_tv(entry):
    """Exact TV of an entry from the target on its level's case, with the comparison."""
    if entry.level == "step":
        c = compare(step_law(entry.fn), STEP_TRUTH)
    elif entry.level == "logits":
        c = compare(logits_law(entry.fn), target_law(LOGIT_TARGET, LOGIT_PROMPT, LOGIT_CONFIG, K + 1))
    elif entry.name == "kv_cache_refeeds_prefix":
        (t, d), case = DEC_POSITION.models(), DEC_POSITION
        c = compare(law(lambda rng: tuple(entry.fn(t, d, list(case.prompt), k=1, config=case.config,
                                                   max_new_tokens=case.max_new_tokens, rng=rng))),
                    target_law(t, list(case.prompt), case.config, case.max_new_tokens))
    else:
        c = compare(decoder_law(entry.fn, DEC_K.get(entry.name, K)), DEC_TRUTH)
    return c


# ---------------------------------------------------------------- the registry


def test_registry_covers_every_spec_item_and_is_well_formed():
    wrong = zoo.entries(kind="wrong")
    assert sorted({e.spec_item for e in wrong}) == list(range(1, 13))
    for item in (2, 5, 7, 10):  # the classes with more than one variant
        assert sum(e.spec_item == item for e in wrong) >= 2
    assert {e.name for e in zoo.entries(kind="correct")} == {"reference", "exponential_race"}
    assert {e.name for e in zoo.entries(kind="approximate")} == {"typical_acceptance", "lenience"}
    assert {e.level for e in wrong} == set(zoo.LEVELS)
    for name, e in zoo.ZOO.items():
        assert name == e.name and callable(e.fn)
        assert e.description and "\n" not in e.description and len(e.description) <= 110
        assert (e.kind == "wrong") == (e.spec_item is not None)
    assert zoo.ZOO["exponential_race"].modes == ("statistical",)
    assert all("exact" in e.modes for e in zoo.entries() if e.name != "exponential_race")
    assert zoo.entries(kind="wrong", level="decoder") == [e for e in wrong if e.level == "decoder"]
    with pytest.raises(SpecrefError):
        zoo.entries(kind="buggy")
    with pytest.raises(SpecrefError):
        zoo.ZooEntry("x", "step", zoo.reference, "wrong", None, "no spec item")


# ---------------------------------------------------------------- exact mode


def test_harnesses_give_tv_zero_for_correct_implementations():
    """Each lifting is right: the reference at every level has the target's law."""
    assert compare(step_law(zoo.reference), STEP_TRUTH).tv == 0  # Fractions: exactly 0
    for k in (1, 2):
        assert compare(decoder_law(decoder_reference, k), DEC_TRUTH).tv == 0
    truth = target_law(LOGIT_TARGET, LOGIT_PROMPT, LOGIT_CONFIG, K + 1)
    assert compare(logits_law(logits_reference), truth).tv <= 1e-12


def test_reference_entry_is_exact():
    assert exact_tv(zoo.ZOO["reference"]).tv <= 1e-12


# Exact TVs on the cases above (recorded; the assertion is only TV > 1e-9).
@pytest.mark.parametrize("name", [e.name for e in zoo.entries(kind="wrong")])
def test_every_wrong_entry_is_caught_exactly(name):
    entry = zoo.ZOO[name]
    c = exact_tv(entry)
    assert float(c.tv) > 1e-9, f"{name} was not caught:\n{c}"
    output, a, b = c.worst[0]  # the counterexample: an output whose probability differs
    assert a != b


def test_residual_from_p_matches_the_worked_example():
    """SPEC §3: on the worked example the classic bug gives [7/25, 1/2, 11/50] for the first token."""
    p = np.array([[F(1, 5), F(1, 2), F(3, 10)]] * 2, dtype=object)
    q = np.array([[F(3, 5), F(3, 10), F(1, 10)]], dtype=object)

    def first(fn):
        def program(rng):
            x = draw(rng, q[0])
            return fn(p, q, [x], rng)[0]

        return law(program)

    assert first(zoo.residual_from_p) == {0: F(7, 25), 1: F(1, 2), 2: F(11, 50)}
    assert first(zoo.reference) == {0: F(1, 5), 1: F(1, 2), 2: F(3, 10)}


@pytest.mark.parametrize("name", [e.name for e in zoo.entries(kind="approximate")])
def test_approximate_entries_report_a_positive_exact_tv(name):
    tv = exact_tv(zoo.ZOO[name]).tv
    assert 0 < tv < 1
    print(f"{name}: exact TV from the target = {float(tv):.6f}")


def test_lenience_one_is_the_reference_and_its_acceptance_rate_is_alpha_l():
    assert compare(step_law(zoo.lenience(1)), STEP_TRUTH).tv == 0
    p, q = P_TABLE[0], Q_TABLE[0]
    for l in (F(1, 2), F(3, 10)):
        step = zoo.lenience(l)
        accepted = law(lambda rng: len(step(p[None].repeat(2, 0), q[None], [draw(rng, q)], rng)) == 2)
        assert accepted[True] == sum(min(pi / l, qi) for pi, qi in zip(p, q))  # SPEC §10: sum min(p/l, q)
    with pytest.raises(SpecrefError):
        zoo.lenience(0)


def test_typical_acceptance_threshold():
    """Accept iff p(x) > min(eps, delta exp(-H(p))); a failure emits a sample from p, a pass a bonus."""
    p = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])  # H(p_1) = 1.0297 nats
    q = np.array([[0.1, 0.1, 0.8]])
    # defaults: threshold min(0.09, 0.3 * 0.357) = 0.09, so token 2 (p = 0.2) passes: (2, bonus ~ p_2)
    passed = law(lambda rng: tuple(zoo.ZOO["typical_acceptance"].fn(p, q, [2], rng)))
    assert passed == pytest.approx({(2, 0): 0.1, (2, 1): 0.1, (2, 2): 0.8})
    # eps = 0.25, delta = 1: threshold min(0.25, 0.357) = 0.25, so token 2 fails: one token ~ p_1
    strict = zoo.typical_acceptance(eps=0.25, delta=1.0)
    assert law(lambda rng: tuple(strict(p, q, [2], rng))) == pytest.approx({(0,): 0.5, (1,): 0.3, (2,): 0.2})


def test_entries_return_valid_tokens_on_random_float_inputs():
    """Every step/logits entry returns 1..K+1 valid ids on random inputs (both rng kinds)."""
    g = np.random.default_rng(3)
    V, k = 5, 3
    for trial in range(30):
        p = g.dirichlet(np.full(V, 0.4), size=k + 1)
        q = g.dirichlet(np.full(V, 0.4), size=k)
        x = [int(g.choice(V, p=row)) for row in q]
        tl, dl = g.normal(size=(k + 1, V)), g.normal(size=(k, V))
        cfg = SamplingConfig(temperature=0.8, top_k=4, top_p=0.9)
        xl = [int(g.choice(V, p=row)) for row in process(dl, cfg)]
        for e in zoo.entries():
            if e.level == "decoder":
                continue
            rng = int(g.integers(2**31)) if trial % 2 or e.modes == ("statistical",) else g
            out = e.fn(p, q, x, rng) if e.level == "step" else e.fn(tl, dl, xl, cfg, rng)
            assert 1 <= len(out) <= k + 1 and all(isinstance(t, int) and 0 <= t < V for t in out), e.name


def test_decoders_respect_the_protocol():
    for e in zoo.entries(level="decoder"):
        out = e.fn(DEC_TARGET, DEC_DRAFT, DEC_PROMPT, k=K, config=PLAIN, max_new_tokens=4, stop_tokens=(), rng=7)
        assert isinstance(out, list) and all(isinstance(t, int) and 0 <= t < 3 for t in out)
        assert e.fn(DEC_TARGET, DEC_DRAFT, DEC_PROMPT, k=K, config=PLAIN, max_new_tokens=0,
                    stop_tokens=(), rng=7) == []


# ---------------------------------------------------------------- statistical mode

ALPHA = 1e-6


def sampled_counts(step, n, seed):
    """Counts of the completed block over ``n`` runs on the float bigram tables, by hand.

    Draft x_1 ~ q(. | 0), x_2 ~ q(. | x_1); rows p(. | 0), p(. | x_1), p(. | x_2); the
    step gets an integer seed per run; the block is completed to K + 1 tokens from p.
    """
    g = np.random.default_rng(seed)
    P, Q = P_TABLE.astype(np.float64), Q_TABLE.astype(np.float64)
    cq, cp = np.cumsum(Q, axis=1), np.cumsum(P, axis=1)  # inverse-CDF tables: g.choice(p=...) is slow
    cq[:, -1] = cp[:, -1] = 1.0  # u < 1 always lands on a token, whatever the rounding of the sums
    u = g.random((n, 2 + K + 1))  # two draft draws, up to K + 1 completion draws
    seeds = g.integers(2**63, size=n)
    counts = Counter()
    for j in range(n):
        x1 = int(np.searchsorted(cq[STEP_PROMPT[-1]], u[j, 0], side="right"))
        x2 = int(np.searchsorted(cq[x1], u[j, 1], side="right"))
        out = step(P[[STEP_PROMPT[-1], x1, x2]], Q[[STEP_PROMPT[-1], x1]], [x1, x2], int(seeds[j]))
        for c in range(K + 1 - len(out)):
            out.append(int(np.searchsorted(cp[out[-1]], u[j, 2 + c], side="right")))
        counts[tuple(out)] += 1
    return counts


def test_exponential_race_passes_and_the_same_test_catches_residual_from_p():
    """N = 10,000 seeded runs; G-tests at alpha = 1e-6 (rare bins pooled below 5 expected).

    Passing: neither the test of the 27 completed outcomes (against the target law) nor
    the test of the first emitted token (against p_1) rejects -- a correct sampler fails
    one of them about twice per million seeds.  At this N the 27-outcome test detects,
    with power 0.999, any law at TV >= 0.053 from the target (the planner); the classic
    bug is at TV 0.105 here, which needs 2,487 samples.  Catching: at the same N the same
    test rejects residual_from_p sampled as a black box (integer seeds).  ~3 s.
    """
    n = 10_000
    outcomes = sorted(STEP_TRUTH)
    truth = np.array([float(STEP_TRUTH[o]) for o in outcomes])
    tv_bug = float(compare(step_law(zoo.residual_from_p), STEP_TRUTH).tv)
    assert tv_bug == pytest.approx(0.105)
    assert samples_needed(tv_bug, ALPHA, 0.999, len(outcomes), null=truth) <= n
    assert detectable_tv(n, ALPHA, 0.999, len(outcomes), null=truth) < 0.06

    def tests(counts):
        full = g_test(np.array([counts[o] for o in outcomes]), truth)
        first = Counter()
        for o, c in counts.items():
            first[o[0]] += c
        head = g_test(np.array([first[x] for x in range(3)]), P_TABLE[0].astype(np.float64))
        return full, head

    race = sampled_counts(zoo.exponential_race, n, seed=1)
    assert set(race) <= set(outcomes)
    full, head = tests(race)
    assert not full.rejects(ALPHA), str(full)
    assert not head.rejects(ALPHA), str(head)
    full_bug, _ = tests(sampled_counts(zoo.residual_from_p, n, seed=2))
    assert full_bug.rejects(ALPHA), str(full_bug)


def test_exponential_race_is_statistical_only():
    p = P_TABLE[:K + 1].astype(np.float64)
    q = Q_TABLE[:K].astype(np.float64)
    with pytest.raises(SpecrefError, match="statistical mode only"):
        law(lambda rng: tuple(zoo.exponential_race(p, q, [0, 1], rng)))
    assert zoo.exponential_race(p, q, [0, 1], 5) == zoo.exponential_race(p, q, [0, 1], np.int64(5))
