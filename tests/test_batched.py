"""specref.decoding.batched and the batched oracle levels: exact row laws, independence of rows,
backends, bad input, malformed outputs, grid coins, statistical mode."""

from dataclasses import replace
from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.core.step import speculative_step
from specref.decoding.batched import batched_draft_and_verify, batched_step, row_tolerance, sample_drafts
from specref.verification.levels.batched.steps import (
    BatchedCase, default_batched_cases, parse_output, row_law, statistics_nulls,
)
from specref.verification.running.calling import Misbehaved
from specref.verification.laws.enumeration import compare, law
from specref.verification.oracle import LEVELS, check, check_batched_step


def frac(rows):
    return np.array([[[F(v) for v in r] for r in pos] for pos in rows], dtype=object)


P = [["1/5", "1/2", "3/10"], ["1/2", "1/4", "1/4"], ["1/3", "1/3", "1/3"]]
Q = [["3/5", "3/10", "1/10"], ["1/6", "1/2", "1/3"]]
P2 = [["1/2", "1/2", "0"], ["0", "1/4", "3/4"], ["1/4", "1/4", "1/2"]]
Q2 = [["1/4", "1/4", "1/2"], ["1/3", "1/3", "1/3"]]


def emitted(steps, b):
    return tuple(int(t) for t in steps.tokens[b, :int(steps.n_emitted[b])])


def one_hot(x, V):
    rows = np.full((len(x), V), F(0), dtype=object)
    for i, t in enumerate(x):
        rows[i, t] = F(1)
    return rows


# ---------------------------------------------------------------- exact row laws


@pytest.mark.parametrize("point_mass", [False, True])
@pytest.mark.parametrize("drafts", [((0, 1), (2, 0)), ((1, 2), (1, 1)), ((2, 2), (0, 2))])
def test_each_row_has_the_single_sequence_law_exactly(drafts, point_mass):
    p, q = frac([P, P2]), frac([Q, Q2])
    x = np.array(drafts)
    if not point_mass and q[1, 0, x[1, 0]] == 0:
        pytest.skip("draft impossible under q")
    got = law(lambda rng: tuple(emitted(batched_step(p, None if point_mass else q, x, rng), b) for b in range(2)))
    for b in range(2):
        qb = one_hot(x[b], 3) if point_mass else q[b]
        single = law(lambda rng: tuple(speculative_step(p[b], qb, x[b], rng)))
        marginal = {}
        for out, w in got.items():
            marginal[out[b]] = marginal.get(out[b], 0) + w
        assert compare(marginal, single).tv == 0  # Fractions: equal laws, exactly


def test_ragged_rows_and_zero_draft_rows_have_their_own_law():
    p, q = frac([P, P2]), frac([Q, Q2])
    x = np.array([[0, -1], [-1, -1]])  # row 0: one draft, row 1: none (bonus only)
    got = law(lambda rng: tuple(emitted(batched_step(p, q, x, rng), b) for b in range(2)))
    single0 = law(lambda rng: tuple(speculative_step(p[0, :2], q[0, :1], x[0, :1], rng)))
    row1 = {(y,): p[1, 0, y] for y in range(3) if p[1, 0, y] > 0}  # k = 0: the bonus from p_target[1, 0]
    expected = {(a, b_): wa * wb for a, wa in single0.items() for b_, wb in row1.items()}
    assert compare(got, expected).tv == 0


def test_a_rows_law_does_not_depend_on_other_rows_or_its_position():
    p_row, q_row, x_row = frac([P])[0], frac([Q])[0], np.array([0, 1])
    solo = law(lambda rng: emitted(batched_step(p_row[None], q_row[None], x_row[None], rng), 0))
    others = [(frac([P2])[0], frac([Q2])[0], np.array([2, 2])), (frac([P])[0], frac([Q])[0], np.array([1, 0]))]
    for po, qo, xo in others:
        for pos in (0, 1):
            rows = [(po, qo, xo)]
            rows.insert(pos, (p_row, q_row, x_row))
            p, q, x = (np.stack([r[j] for r in rows]) for j in range(3))
            joint = law(lambda rng: tuple(emitted(batched_step(p, q, x, rng), b) for b in range(2)))
            mine = {}
            for out, w in joint.items():
                mine[out[pos]] = mine.get(out[pos], 0) + w
            assert compare(mine, solo).tv == 0
            other = {}
            for out, w in joint.items():
                other[out[1 - pos]] = other.get(out[1 - pos], 0) + w
            product = {(a, c) if pos == 0 else (c, a): wa * wc for a, wa in mine.items() for c, wc in other.items()}
            assert compare(joint, product).tv == 0  # rows independent


def test_closed_form_row_law_matches_the_enumerated_reference():
    for case in default_batched_cases("batched"):
        if case.grid is not None:
            continue
        for b in range(case.shape[0]):
            def program(rng, b=b):
                k = case.k[b:b + 1]
                d = case.drafts_from[b:b + 1]
                x = np.full((1, d.shape[1]), -1)
                for i in range(int(k[0])):
                    x[0, i] = rng.choice(d.shape[2], p=d[0, i])
                q = None if case.q_draft is None else case.q_draft[b:b + 1]
                s = batched_step(case.p_target[b:b + 1], q, x, rng, num_draft=k)
                return tuple(int(t) for t in x[0, :int(k[0])]), emitted(s, 0)
            assert compare(law(program), row_law(case, b)).tv == 0, (case.name, b)


def test_draft_and_verify_reference_law_is_the_chain_law():
    p, q = frac([P, P2]), frac([Q, Q2])
    case = BatchedCase("c", p, q)
    got = law(lambda rng: emitted(batched_draft_and_verify(p[:1], q[:1], rng), 0))
    assert compare(got, row_law(case, 0, with_drafts=False)).tv == 0


# ---------------------------------------------------------------- float rows, backends


def test_float_rows_sample_the_exact_law():
    """N = 200,000 seeded copies of one row; G-test at alpha = 1e-6 against the closed form (fixed drafts)."""
    from specref.verification.statistics.counts import compare_counts

    case = BatchedCase("c", frac([P]), frac([Q])).as_float()
    n = 200_000
    p = np.repeat(case.p_target.astype(np.float32), n, axis=0)
    q = np.repeat(case.q_draft.astype(np.float32), n, axis=0)
    x = np.repeat(np.array([[0, 1]]), n, axis=0)
    s = batched_step(p, q, x, np.random.default_rng(7))
    exact = {k[1]: float(v) for k, v in row_law(BatchedCase("c", frac([P]), frac([Q])), 0).items() if k[0] == (0, 1)}
    total = sum(exact.values())
    outs = sorted(exact)
    index = {o: i for i, o in enumerate(outs)}
    counts = np.zeros(len(outs), dtype=np.int64)
    tokens, ne = s.tokens, s.n_emitted
    for row_out, c in zip(*np.unique(np.where(np.arange(3)[None, :] < ne[:, None], tokens, -1), axis=0, return_counts=True)):
        counts[index[tuple(int(t) for t in row_out if t >= 0)]] += c
    assert not compare_counts(counts, np.array([exact[o] / total for o in outs]), alpha=1e-6).rejected


def test_torch_rows_give_the_numpy_tokens():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(20), size=(16, 4)).astype(np.float32)
    q = rng.dirichlet(np.ones(20), size=(16, 3)).astype(np.float32)
    x = sample_drafts(q, 1)
    a = batched_step(p, q, x, 5)
    b = batched_step(torch.from_numpy(p), torch.from_numpy(q), torch.from_numpy(x), 5)
    assert isinstance(b.tokens, torch.Tensor)
    assert (b.tokens.numpy() == a.tokens).all() and (b.n_emitted.numpy() == a.n_emitted).all()
    assert a.tokens.shape == (16, 4) and ((a.tokens == -1) == (np.arange(4)[None, :] >= a.n_emitted[:, None])).all()


def test_array_api_strict_rows_run():
    xp = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(5), size=(4, 3))
    q = rng.dirichlet(np.ones(5), size=(4, 2))
    x = sample_drafts(q, 2)
    a = batched_step(p, q, x, 3)
    b = batched_step(xp.asarray(p), xp.asarray(q), xp.asarray(x), 3)
    assert (np.asarray(b.tokens) == a.tokens).all()


def test_float32_rows_within_tolerance_are_accepted_and_off_rows_refused():
    V = 32_000
    assert row_tolerance(np.float32, V) == pytest.approx(8 * np.sqrt(V) * np.finfo(np.float32).eps)
    assert row_tolerance(np.float64, 3) == 1e-9
    p = np.full((1, 2, 4), 0.25, dtype=np.float32)
    q = np.full((1, 1, 4), 0.25, dtype=np.float32)
    batched_step(p * np.float32(1 + 1e-6), q, np.array([[0]]), 0)  # inside 8 sqrt(4) eps = 1.9e-6
    with pytest.raises(SpecrefError, match=r"p_target\[0, 1\] \(row 0\) sums to"):
        p2 = p.copy()
        p2[0, 1, 0] += 1e-3
        batched_step(p2, q, np.array([[0]]), 0)


# ---------------------------------------------------------------- bad input


def _inputs():
    rng = np.random.default_rng(3)
    return rng.dirichlet(np.ones(4), size=(3, 3)), rng.dirichlet(np.ones(4), size=(3, 2)), np.array([[0, 1], [2, 3], [1, 1]])


@pytest.mark.parametrize("mutate, message", [
    (lambda p, q, x: (p[:2], q, x), r"p_target must have shape \[B, K\+1, V\] = \[3, 3, V\]"),
    (lambda p, q, x: (p, q[:, :1], x), r"q_draft must have shape \[B, K, V\] = \[3, 2, 4\]"),
    (lambda p, q, x: (p, q[..., :3], x), r"q_draft must have shape"),
    (lambda p, q, x: (p, q, x[:, :1]), r"p_target must have shape"),
    (lambda p, q, x: (np.where(np.arange(3)[:, None, None] == 1, np.nan, p), q, x), r"p_target\[1, 0\] \(row 1\) is not finite"),
    (lambda p, q, x: (p.astype(np.float16), q, x), r"p_target has dtype float16"),
    (lambda p, q, x: (p, q, np.array([[0, 1], [2, 4], [1, 1]])), r"draft_tokens\[1, 1\] = 4 \(row 1\) is out of range"),
    (lambda p, q, x: (p, q, np.array([[0, 1], [-1, 3], [1, 1]])), r"draft_tokens\[1, 1\] = 3 \(row 1\) follows"),
    (lambda p, q, x: (p, q, x.astype(float)), r"draft_tokens must hold integer ids"),
])
def test_bad_input_names_the_argument_and_row(mutate, message):
    p, q, x = mutate(*_inputs())
    with pytest.raises(SpecrefError, match=message):
        batched_step(p, q, x, 0)


def test_bfloat16_and_zero_draft_probability_and_num_draft_are_refused():
    torch = pytest.importorskip("torch")
    p, q, x = _inputs()
    with pytest.raises(SpecrefError, match="p_target has dtype bfloat16"):
        batched_step(torch.from_numpy(p).to(torch.bfloat16), q, x, 0)
    q0 = q.copy()
    q0[2, 0] = [0.5, 0, 0.5, 0]
    with pytest.raises(SpecrefError, match=r"draft_tokens\[2, 0\] = 1 \(row 2\) has q_draft\[2, 0, 1\] = 0"):
        batched_step(p, q0, x, 0)
    with pytest.raises(SpecrefError, match=r"num_draft\[1\] = 3 \(row 1\) is outside 0..K"):
        batched_step(p, q, x, 0, num_draft=np.array([2, 3, 0]))


# ---------------------------------------------------------------- grid coins in the enumerator


def test_grid_coins_make_u_zero_a_branch_and_leave_the_default_unchanged():
    assert law(lambda r: bool(r.random() <= 0)) == {False: 1}
    on_grid = law(lambda r: bool(r.random() <= 0), grid=24)
    assert on_grid[True] == F(1, 2 ** 24)
    assert law(lambda r: bool(r.random() < 0), grid=24) == {False: 1}
    assert law(lambda r: bool(r.random() < F(1, 3)), grid=2)[True] == F(1, 2)  # {0, 1/4} below 1/3
    assert law(lambda r: bool(r.random() <= 0.25), grid=2)[True] == F(1, 2)  # inclusive at a grid point
    assert law(lambda r: bool(r.random() < 0.25), grid=2)[True] == F(1, 4)
    assert law(lambda r: bool(0.25 >= r.random()), grid=2)[True] == F(1, 2)  # reflected: u <= 0.25
    assert law(lambda r: bool(r.random() > 0.25), grid=2)[True] == F(1, 2)
    with pytest.raises(SpecrefError, match="grid"):
        law(lambda r: 0, grid=0)


def test_grid_reference_law_is_close_to_the_continuous_law():
    """On float32 grid coins each threshold rounds up by < 2^-24, so the TV is a few 2^-24."""
    case = [c for c in default_batched_cases() if c.name == "zeros-in-p-grid"][0]
    from specref.verification.levels.batched.steps import _grid_row_law

    for b in range(2):
        tv = compare(_grid_row_law(case, b, True), row_law(case, b)).tv
        assert 0 <= tv < 16 * F(1, 2 ** 24)


# ---------------------------------------------------------------- the batched level


def reference_step(p, q, x, seed):
    return batched_step(p, q, x, seed)


FAST = [c for c in default_batched_cases() if c.name in ("two-rows", "ragged-rows", "zero-draft-row", "point-mass-ragged")]


def test_levels_are_registered():
    assert {"batched", "draft_and_verify"} <= set(LEVELS)


def test_the_reference_passes_the_batched_level_exactly():
    report = check_batched_step(reference_step, cases=FAST)
    assert report.ok and all(r.tv == 0 for r in report.results), str(report)


def test_a_wrong_step_is_caught_exactly():
    def ignores_q(p, q, x, seed):  # judges real drafts by the point-mass rule: accept w.p. p(x)
        return batched_step(p, None, x, seed)

    report = check_batched_step(ignores_q, cases=FAST[:1])
    assert not report.ok and report.results[0].tv > 0.01


def _out(rows):
    return np.array(rows, dtype=np.int64)


@pytest.mark.parametrize("out, message, status", [
    # an id no engine may emit: its own status (SPEC 13.3), "emits an invalid id"
    (_out([[0, -1, 1], [1, -1, -1]]), r"row 0: placeholder at position 1 before the real token", "emits an invalid id"),
    (_out([[0, 1, 2], [1, 5, -1]]), r"row 1: id 5 at position 1 is outside the vocabulary", "emits an invalid id"),
    (_out([[0, 1, 2], [1, -2, -1]]), r"row 1: id -2 at position 1 is outside the vocabulary", "emits an invalid id"),
    (_out([[0, 1, 2], [-1, -1, -1]]), r"row 1: no token emitted", "invalid output"),
    (_out([[2, 1, -1], [1, -1, -1]]), r"row 0: accepted position 0 holds 2, not the draft token 0", "invalid output"),
    (np.zeros((2, 3), dtype=np.float32), r"dtype float32; ids must be integers", "invalid output"),
    (_out([[0, 1], [1, -1]]), r"shape \(2, 2\); expected \[B, K\+1\] = \[2, 3\]", "invalid output"),
    ((_out([[0, 1, 2], [1, -1, -1]]), np.array([3, 2])), r"row 1: n_emitted = 2 disagrees with the tokens \(1\)",
     "invalid output"),
    ((_out([[0, 1, 2], [1, -1, -1]]), np.array([2, 1]), np.array([3, 1])), r"row 1: n_accepted = 1 disagrees",
     "invalid output"),
])
def test_malformed_outputs_get_a_status_naming_the_row(out, message, status):
    with pytest.raises(Misbehaved, match=message) as info:
        parse_output(out, 2, 2, 3, np.array([2, 2]), np.array([[0, 1], [1, 2]]))
    assert info.value.status == status


def test_malformed_output_is_a_status_in_the_report_not_an_exception():
    def too_long(p, q, x, seed):
        out = batched_step(p, q, x, seed).tokens.copy()
        out[:, :] = np.where(out >= 0, out, 0)  # fills the padding with token 0
        return out

    report = check_batched_step(too_long, cases=[c for c in FAST if c.name == "ragged-rows"])
    assert not report.ok and report.results[0].status == "invalid output" and "row 0" in report.results[0].detail


def test_statistics_nulls_are_distributions_and_match_the_exact_law():
    case = [c for c in default_batched_cases() if c.name == "two-rows"][0]
    stats = statistics_nulls(case, "batched")
    assert all(abs(s.null.sum() - 1) < 1e-12 and (s.null >= -1e-15).all() for s in stats)
    length = stats[0].null  # accepted length of row 0 from the closed form, against the enumerated row law
    exact = np.zeros(3)
    for (drafts, out), w in row_law(case, 0).items():
        exact[len(out) - 1] += float(w)
    assert np.allclose(length, exact, atol=1e-15)


def test_statistical_mode_passes_the_reference_and_flags_a_bug():
    """Planned N (detect TV 0.01 at alpha 1e-6, Bonferroni over the case's statistics), seeded."""
    from specref.verification.zoo import engines as zoo_engines

    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(6), size=(2, 3)), rng.dirichlet(np.ones(6), size=(2, 2))
    case = BatchedCase("V6", p, q)
    ok = check("batched", reference_step, cases=[case], mode="statistical", samples=60_000)
    assert ok.ok, str(ok)
    assert ok.results[0].n_samples == 60_000
    assert "Bonferroni" in ok.results[0].detail and "TV detectable at N" in ok.results[0].detail
    bad = check("draft_and_verify", zoo_engines.coin_reused, cases=[case], mode="statistical", samples=60_000)
    assert not bad.ok and bad.results[0].p_value < 1e-6


def test_torch_arrays_in_statistical_mode():
    torch = pytest.importorskip("torch")
    seen = []

    def step(p, q, x, seed):
        seen.append(type(p))
        return batched_step(p, q, x, seed).tokens

    rng = np.random.default_rng(6)
    case = BatchedCase("V5", rng.dirichlet(np.ones(5), size=(2, 3)), rng.dirichlet(np.ones(5), size=(2, 2)),
                       array="torch")
    # in-process (isolate=False): `seen` is filled where the implementation runs
    report = check("batched", step, cases=[replace(case, device="cpu")], mode="statistical", samples=20_000,
                   isolate=False)
    assert report.ok and seen and seen[0] is torch.Tensor
    assert replace(case, array="numpy").array == "numpy"


def test_one_row_calls_leave_the_row_pair_statistics_untested_not_broken():
    rng = np.random.default_rng(9)
    case = BatchedCase("one-row", rng.dirichlet(np.ones(4), size=(1, 3)), rng.dirichlet(np.ones(4), size=(1, 2)),
                       memory_budget=1)  # one copy of the one row per call: no row pairs at all
    report = check("batched", reference_step, cases=[case], mode="statistical", samples=300)
    assert report.ok and report.results[0].n_samples == 300, str(report)
