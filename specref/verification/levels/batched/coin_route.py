"""The ``vllm`` level's coin route (``route="coins"``, SPEC §11.14): the engine's own coins, replayed.

An interpreted Triton kernel costs milliseconds a row, so the ``vllm`` level's statistical check of
vLLM's Triton path detects a TV of 0.1, not 0.02, in minutes.  The coin route splits the check in
two, each at the speed of what it runs:

1. *Replay, through the engine.*  :func:`replay_calls` ``= ceil(ln(1 - 0.9) / ln(1 - REPLAY_TV))``
   calls (230) of the real engine, one copy of the case's rows each, with its own generators, and
   the coins it draws recorded (:class:`CoinRoute`'s ``record``).  Every call's output must equal
   :func:`coin_route_reference` on the coins the engine drew, and the draws alone (``draw``: the
   engine's module with every kernel stubbed) must give the same coins bit for bit.  An engine
   whose output is off the reference on its own coins in at least ``REPLAY_TV`` of its calls shows
   a mismatch with probability at least 0.9 (the planner's power, ``PLAN_POWER``).  A mismatch is
   ``not replayed``: no verdict by this route (the detail names the requests and both outputs).
   The engine's own outputs are judged statistically as well, at that N.
2. *The coins' law, without the kernels.*  The ``vllm`` level's statistical check (its planned N,
   every statistic) of ``coin_route_reference`` applied to ``draw``'s coins: the engine's own
   draws (its generators, seeds, dtypes and order) at the speed of torch, the kernels replaced by
   the reference on the coins.

Together, at power 0.9: a statistic of the engine's law off the target by ``detect_tv + REPLAY_TV``
either comes from outputs off the reference on their coins in at least ``REPLAY_TV`` of the calls
(step 1 sees it) or moves step 2's law by ``detect_tv`` (step 2 sees it).  What the route does not
see: a deviation in fewer than about ``REPLAY_TV`` of the calls whose coins the reference maps
right (single grid coins: the ``vllm_coins`` level, exact), and one that needs more than one copy
of the case in a call (the default route tiles copies).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from specref.core.errors import SpecrefError
from specref.verification.statistics.counts import PLAN_POWER
from specref.verification.running.level import Option
from specref.verification.running.report import NOT_REPLAYED, OK, RAISED, CaseResult, Report

__all__ = ["CoinRoute", "coin_route_reference", "coin_route_engine", "replay_calls", "run_coin_route", "drawn_calls",
           "REPLAY_TV", "CoinRouteMismatch", "VLLM", "BATCHED", "chain_on_coins", "softmax32", "ROUTE", "ROUTES", "routed_planner", "routed_run"]

REPLAY_TV = 0.01  # the bound the replay puts on P(an output is not the reference on the engine's coins)


@dataclass(frozen=True)
class CoinRoute:
    """How the coin route reaches an engine in the ``vllm`` level's call (``fn.specref_coin_route``).

    ``record(*call) -> (output [B, K+1], uniform [T] | None, exponentials [B, V] | None)``: the
    engine's call, its own draws recorded (None where it drew none: an all-greedy call);
    ``draw(*call) -> (uniform, exponentials)``: the same draws with every kernel stubbed.
    :func:`specref.adapters.engines.vllm_engine` attaches one.  At the ``batched`` level the call
    is the step_fn's and the coins are ``(uniform_coins [B, K], final_coins [B])``
    (:func:`specref.adapters.real_engines.sglang_chain_engine` attaches one).

    ``on_coins(*call, *coins) -> tokens [B, K+1]``, where given: the engine's own rule on coins of its
    own kind, in place of the level's (:func:`coin_route_reference`, :func:`chain_on_coins`), for an
    engine whose coins are not the level's (MRV2's ``tl.rand`` and Gumbel uniforms:
    :func:`specref.adapters.real_engines.mrv2_engine`).  It need not be right: the replay holds it
    equal to the engine on the engine's coins, and step 2 checks the law of its outputs.  A coin
    that is NaN in ``record``'s coins was not drawn, and is not compared with ``draw``'s."""

    record: Callable
    draw: Callable
    on_coins: Callable | None = None


class CoinRouteMismatch(Exception):
    """A replayed call whose output is not the reference on its own coins (``not replayed``)."""


def replay_calls() -> int:
    """Replayed calls that show a mismatch with probability at least ``PLAN_POWER`` when at least
    :data:`REPLAY_TV` of the calls mismatch: ``(1 - REPLAY_TV)^n <= 1 - PLAN_POWER`` (230)."""
    return math.ceil(math.log1p(-PLAN_POWER) / math.log1p(-REPLAY_TV))


def softmax32(z):
    """The float32 softmax of logits rows, as an engine computes it (``exp(z - max)``, normalised)."""
    z = np.asarray(z, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _accepted(x, live, g_t, logits, q, uniform):
    """``[T]``: a greedy request's draft is accepted when it is the argmax; a sampled one's when
    ``u < p / q`` (float32 ratio, strict; ``q > 0``); a placeholder never."""
    accept = np.zeros(len(x), dtype=bool)
    accept[g_t] = (x == logits.argmax(axis=1))[g_t]
    s = ~g_t
    if s.any():
        xi = np.where(live, x, 0)[s]
        rows = np.arange(int(s.sum()))
        px = softmax32(logits[s])[rows, xi]
        qx = np.ones_like(px) if q is None else q[s][rows, xi]
        with np.errstate(divide="ignore", invalid="ignore"):
            accept[s] = live[s] & (qx > 0) & (np.asarray(uniform, dtype=np.float64)[s] < px / qx)
    return accept


def coin_route_reference(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, uniform, exponentials):
    """(correct) vLLM V1's step in its call on given coins: the tokens the target law's chain rule
    makes from ``uniform [T]`` (one acceptance coin per draft) and ``exponentials [B, V]`` (one race
    per request) -> ``[B, K+1]`` padded with -1.

    A greedy request (``sampling_metadata.greedy``) accepts while the draft is the argmax of its
    logits and then emits that argmax.  A sampled one: ``p`` the float32 softmax of its logits,
    draft ``x`` accepted when ``u < p[x] / q[x]`` (``q`` one-hot without ``draft_probs``; a
    placeholder ``-1`` is rejected); at the first rejection the token ``argmax_v s_v / E[b, v]``
    with ``s = max(p - q, 0)`` (``p`` with ``p[x] = 0`` for a point-mass draft, nothing removed for
    a placeholder), computed as vLLM does (``s * (1 / E)`` in float32, first index on ties); after
    ``k_b`` acceptances the caller's bonus token."""
    x = np.asarray(draft_token_ids, dtype=np.int64).reshape(-1)
    num = np.asarray(num_draft_tokens, dtype=np.int64).reshape(-1)
    B, K = len(num), int(max_spec_len)
    logits = np.asarray(target_logits, dtype=np.float32)
    q = None if draft_probs is None else np.asarray(draft_probs, dtype=np.float32)
    req = np.repeat(np.arange(B), num)  # [T] the request of each draft
    start = np.concatenate(([0], np.cumsum(num)[:-1])).astype(np.int64)
    pos = np.arange(len(x)) - start[req]
    g_t = np.asarray(sampling_metadata.greedy(B), dtype=bool)[req]
    live = x >= 0
    accept = _accepted(x, live, g_t, logits, q, uniform)
    first = num.copy()  # the first rejected position, or k_b
    np.minimum.at(first, req[~accept], pos[~accept])
    out = np.full((B, K + 1), -1, dtype=np.int64)
    kept = pos < first[req]
    out[req[kept], pos[kept]] = x[kept]
    done = np.flatnonzero(first == num)
    out[done, num[done]] = np.asarray(bonus_token_ids, dtype=np.int64).reshape(-1)[done]
    rb = np.flatnonzero(first < num)
    rt = start[rb] + first[rb]
    greedy_rb = g_t[rt]
    out[rb[greedy_rb], first[rb[greedy_rb]]] = logits[rt[greedy_rb]].argmax(axis=1)
    sb, st = rb[~greedy_rb], rt[~greedy_rb]
    if len(st):
        p = softmax32(logits[st])
        if q is None:
            own = live[st]
            p[np.flatnonzero(own), x[st][own]] = 0
            s = p
        else:
            s = np.maximum(p - q[st], np.float32(0))
        E = np.asarray(exponentials)
        with np.errstate(divide="ignore", invalid="ignore"):  # an exponential of 0 scores inf, as in the kernel
            inv = (np.ones((), dtype=E.dtype) / E[sb]).astype(np.float32)
            out[sb, first[sb]] = np.argmax(s * inv, axis=1)
    return out


def _numpy_coins(num_draft_tokens, target_logits, sampling_metadata):
    """NumPy's coins for the call, drawn as vLLM draws its own (none when every request is greedy): a
    seeded request's from a generator of its own (``request_seeds``), the others' from one generator
    (``global_seed()``); float64 uniforms, float32 exponentials (drawn in float64: NumPy's float32
    draw can be exactly 0, where ``s / E`` is NaN)."""
    num = np.asarray(num_draft_tokens, dtype=np.int64).reshape(-1)
    B, V = len(num), np.shape(target_logits)[-1]
    if np.asarray(sampling_metadata.greedy(B)).all():
        return None, None
    shared = np.random.default_rng(np.random.SeedSequence(sampling_metadata.global_seed()))
    uniform = shared.random(int(num.sum()))
    exponentials = shared.standard_exponential((B, V)).astype(np.float32)  # float64 draws: none rounds to 0
    seeded = sampling_metadata.seeded or (False,) * B
    seeds, start = sampling_metadata.request_seeds(B), np.concatenate(([0], np.cumsum(num)))
    for b in np.flatnonzero(seeded):
        own = np.random.default_rng(np.random.SeedSequence(int(seeds[b])))
        uniform[start[b]:start[b + 1]] = own.random(int(num[b]))
        exponentials[b] = own.standard_exponential(V).astype(np.float32)
    return uniform, exponentials


def coin_route_engine():
    """(correct) specref's own engine in the ``vllm`` call with a coin route: NumPy's coins
    (:func:`_numpy_coins`) through :func:`coin_route_reference`.  Judged by the default route it
    checks the reference's law with ideal coins; by the coin route, the route itself."""

    def draw(*call):
        return _numpy_coins(call[1], call[5], call[7])

    def fn(*call):
        return coin_route_reference(*call, *draw(*call))

    fn.specref_coin_route = CoinRoute(record=lambda *call: (fn(*call), *draw(*call)), draw=draw)
    fn.__name__ = "coin_route_engine"
    return fn


def _used(call) -> tuple:
    """Where the reference reads coins: the uniforms of the sampled requests' drafts and the
    exponential rows of the sampled requests with drafts.  The others may come from a generator
    nobody seeded (vLLM fills a zero-draft request's row from the global one, then skips it)."""
    num = np.asarray(call[1], dtype=np.int64).reshape(-1)
    sampled = ~np.asarray(call[7].greedy(len(num)), dtype=bool)
    return np.repeat(sampled, num), sampled & (num > 0)


def _emits_invalid(got, V: int) -> bool:
    """An id no engine may emit: outside ``0..V-1`` other than ``-1``, or a ``-1`` before a token."""
    placeholder = got == -1
    return bool(((got < -1) | (got >= V)).any() or (np.maximum.accumulate(placeholder, axis=1) & ~placeholder).any())


@dataclass(frozen=True)
class _Call:
    """What the route needs of a level's call: the reference on the coins, where it reads them,
    the tokens of an output, and V."""

    reference: Callable  # (call, coins) -> tokens [B, K+1]
    used: Callable  # call -> one index per coin array: where the reference reads it
    tokens: Callable  # output -> tokens [B, K+1]
    vocab: Callable  # call -> V


VLLM = _Call(lambda call, coins: coin_route_reference(*call, *coins), _used, np.asarray,
             lambda call: np.shape(call[5])[-1])
"""The ``vllm`` level's call (vLLM V1's ``rejection_sample``): coins ``(uniform [T], exponentials [B, V])``."""


def chain_on_coins(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
    """(correct) The chain rule on float coins, every row at once: ``[B, K+1]`` padded with -1.

    The ``batched_coins`` level's convention (and ``engine_coin_kernel``'s, which loops over rows;
    a test holds the two equal): draft ``i`` of row ``b`` accepted iff ``uniform_coins[b, i] * q < p``
    (point mass: ``coin < p``) until the row's ``k_b`` drafts (-1 pads); then the token
    ``#{j : cdf_j <= u * total}`` of the residual ``max(p - q, 0)`` (point mass: ``p`` without the
    draft; ``p`` itself when the residual is empty) at a rejection, else of the bonus row ``p[k_b]``,
    with ``u = final_coins[b]``, capped at the row's last token of positive weight."""
    p = np.asarray(p_target)
    q = None if q_draft is None else np.asarray(q_draft)
    x = np.asarray(draft_tokens).astype(np.int64)
    u, fin = np.asarray(uniform_coins), np.asarray(final_coins)
    B, K1, V = p.shape
    K, rows, cols = K1 - 1, np.arange(B), np.arange(K1 - 1)
    pad = x == -1
    k = np.where(pad.any(axis=1), pad.argmax(axis=1), K)
    xi = np.where(pad, 0, x)
    px = p[rows[:, None], cols[None, :], xi]
    accept = u * q[rows[:, None], cols[None, :], xi] < px if q is not None else u < px
    accept &= cols[None, :] < k[:, None]
    n = np.where((~accept).any(axis=1), (~accept).argmax(axis=1), K)  # the first position not accepted
    out = np.full((B, K1), -1, dtype=np.int64)
    out[:, :K] = np.where(cols[None, :] < n[:, None], x, -1)
    row = p[rows, n]  # [B, V]: the rejected position's target row, or the bonus row
    w = row.copy()
    rejected = np.flatnonzero(n < k)
    if q is None:
        w[rejected, x[rejected, n[rejected]]] = 0
    else:
        w[rejected] = np.maximum(row[rejected] - q[rejected, n[rejected]], 0)
    empty = ~(w.sum(axis=1) > 0)
    w[empty] = row[empty]
    cdf = np.cumsum(w, axis=1)
    y = (cdf <= fin[:, None] * cdf[:, -1:]).sum(axis=1)
    last = V - 1 - np.argmax(w[:, ::-1] > 0, axis=1)
    out[rows, n] = np.minimum(y, last)  # u * total == total only by rounding
    return out


def _chain_on_coins(call, coins):
    return chain_on_coins(*call[:3], *coins)


BATCHED = _Call(_chain_on_coins, lambda call: (slice(None), slice(None)),
                lambda out: np.asarray(out[0] if isinstance(out, tuple) else out), lambda call: np.shape(call[0])[-1])
"""The ``batched`` level's call (``step_fn(p_target, q_draft, draft_tokens, seed)``): coins
``(uniform_coins [B, K], final_coins [B])`` read as the ``batched_coins`` level reads them
(:func:`chain_on_coins`: ``coin * q < p``, the inverse CDF of the residual or bonus row)."""


def _own_rule(route: CoinRoute, shape: _Call) -> _Call:
    """``shape`` with the route's own rule on coins (``on_coins``), where it has one, and every coin compared."""
    rule = route.on_coins
    if rule is None:
        return shape
    return dataclasses.replace(shape, reference=lambda call, coins: rule(*call, *coins),
                               used=lambda call: (slice(None), slice(None)))


def _same_draws(a, b, used) -> bool:
    """Recorded coins ``a`` and drawn coins ``b`` agree bit for bit where the reference reads them
    (``used``) and ``a`` is not NaN (a coin the engine did not draw)."""
    if (a is None) != (b is None) or a is None:
        return a is None and b is None
    a, b = np.asarray(a)[used], np.asarray(b)[used]
    drew = ~np.isnan(a) if a.dtype.kind == "f" else np.ones(a.shape, dtype=bool)
    return a.shape == b.shape and bool(np.array_equal(a[drew], b[drew]))


def _filled(recorded, drawn):
    """The recorded coins with the drawn ones where the engine drew none (NaN): what the reference reads
    in the replay, so that it reads exactly the coins step 2 reads for the same seeds."""
    if recorded is None or drawn is None or np.asarray(recorded).dtype.kind != "f":
        return recorded
    a, b = np.asarray(recorded), np.asarray(drawn)
    return np.where(np.isnan(a), b, a) if a.shape == b.shape else a


def _replaying(route: CoinRoute, shape: _Call):
    """The level's call that makes the engine's recorded call, checks it against the reference on
    its coins and against the draws alone, and returns the engine's output (raising
    :class:`CoinRouteMismatch` on a mismatch)."""
    shape = _own_rule(route, shape)

    def fn(*call):
        out, *coins = route.record(*call)
        again = route.draw(*call)
        want = shape.reference(call, [_filled(a, b) for a, b in zip(coins, again)])
        got = shape.tokens(out)
        if got.shape == want.shape and (got != want).any() and _emits_invalid(got, shape.vocab(call)):
            return out  # the oracle names it: emits an invalid id, whatever the route
        if got.shape != want.shape or (got != want).any():
            rows = sorted({int(b) for b in np.argwhere(got != want)[:, 0]}) if got.shape == want.shape else "all"
            raise CoinRouteMismatch(f"the engine's output is not the reference on the coins it drew: request(s) "
                                    f"{rows}: engine {got.tolist()!s:.160}, reference on its coins {want.tolist()!s:.160}")
        for i, (a, b, used) in enumerate(zip(coins, again, shape.used(call))):
            if not _same_draws(a, b, used):
                raise CoinRouteMismatch(f"the draws alone (kernels stubbed) gave other {_COIN_NAMES[i]} than the "
                                        "engine's call with the same seeds: the route cannot reproduce its coins")
        return out

    fn.__name__ = "coin_route_replay"
    return fn


_COIN_NAMES = ("uniform coins", "exponentials, final coins or Gumbel uniforms")


def _drawn(route: CoinRoute, shape: _Call):
    """Step 2's call: the engine's own draws, then the reference on them."""
    shape = _own_rule(route, shape)

    def fn(*call):
        return shape.reference(call, route.draw(*call))

    fn.__name__ = "coin_route_reference(engine draws)"
    return fn


def drawn_calls(fn, shape: _Call = VLLM):
    """Step 2's function for ``fn`` (its coin route's draws through the reference): what a plan of
    the coin route times."""
    return _drawn(_route_of(fn), shape)


def _route_of(fn) -> CoinRoute:
    try:
        route = getattr(fn, "specref_coin_route", None)
    except Exception as e:  # noqa: BLE001 - a hostile __getattr__: a usage error, named
        raise SpecrefError(f"reading fn.specref_coin_route raised {type(e).__name__}") from None
    if not isinstance(route, CoinRoute):
        raise SpecrefError(f"route='coins' needs fn.specref_coin_route, a CoinRoute (vllm_engine's functions carry "
                           f"one: specref.adapters.engines.vllm_engine), got {route!r:.80}")
    return route


def _merged(replayed: CaseResult, drawn: CaseResult | None, calls: int) -> CaseResult:
    """One case's verdict: the replay's status when it is not ok, ``not replayed`` on a mismatch,
    else step 2's status with both parts in the detail."""
    marker = f"{CoinRouteMismatch.__name__}: "
    if replayed.status == RAISED and marker in replayed.detail:
        return dataclasses.replace(replayed, status=NOT_REPLAYED, tv=None, detail=(
            f"no verdict by the coin route: {replayed.detail.partition(marker)[2]}; check it by the vllm level's "
            "default route"))
    if replayed.status != OK or drawn is None:
        return dataclasses.replace(replayed, detail=f"the engine's own calls (the replay's {calls}): {replayed.detail}")
    head = (f"replayed on {calls} calls: each output is the reference on the coins the engine drew, and its "
            f"draws alone give those coins (outputs off them in {REPLAY_TV:.0%} of the calls are seen with probability "
            f"{PLAN_POWER}; its own outputs: {replayed.status}); the engine's draws through the reference: ")
    return dataclasses.replace(drawn, detail=head + drawn.detail)


def run_coin_route(run_batched, level, step_style, fn, cases, settings, shape: _Call = VLLM) -> Report:
    """The coin route over ``cases``: the replay of every case (one ``run_batched`` check, one copy of
    the rows per call), then step 2 for the cases the replay passed (another), merged per case."""
    route = _route_of(fn)
    if settings.mode != "statistical":
        raise SpecrefError(f"route='coins' is a statistical check (mode='statistical'), got mode={settings.mode!r}")
    calls = replay_calls()
    one_copy = [dataclasses.replace(c, memory_budget=1) for c in cases]
    replay = run_batched(level, step_style(_replaying(route, shape)), one_copy,
                         dataclasses.replace(settings, samples=calls))
    passed = [i for i, r in enumerate(replay.results) if r.status == OK]
    drawn = {}
    if passed:
        second = run_batched(level, step_style(_drawn(route, shape)), [cases[i] for i in passed], settings)
        drawn = dict(zip(passed, second.results))
    results = [_merged(r, drawn.get(i), calls) for i, r in enumerate(replay.results)]
    for r, case in zip(results, cases):
        r.case = case
    return Report(replay.level, replay.mode, results)


ROUTES = ("engine", "coins")


def _route(value):
    if not isinstance(value, str) or value not in ROUTES:
        raise SpecrefError(f"route must be 'engine' (the engine's outputs, judged statistically) or 'coins' (its own "
                           f"coins replayed through the reference, SPEC §11.14), got {value!r:.80}")
    return value


ROUTE = Option("route", "how the level reaches the engine: 'engine' or 'coins'",
               phrase="route (how the engine is reached) applies", default="engine", check=_route)
"""``check("vllm", fn, mode="statistical", route="coins")`` (or ``"batched"``): the coin route
(``fn.specref_coin_route``, which :func:`specref.adapters.engines.vllm_engine`,
:func:`specref.adapters.real_engines.sglang_chain_engine` and
:func:`specref.adapters.real_engines.mrv2_engine` attach)."""


def routed_planner(planner, shape: _Call | None):
    """``planner`` of the function the check's statistical calls are made on: under ``route="coins"``,
    step 2's (the engine's draws through the reference), whose calls are the check's many."""

    def plan(level, fn, case, settings, seed):
        if shape is not None and level.option("route") == "coins":
            fn = drawn_calls(fn, shape)
        return planner(level, fn, case, settings, seed)

    return plan


def routed_run(run_batched):
    """The ``batched`` level's run: ``run_batched``, or the coin route (:data:`BATCHED`) under ``route="coins"``."""

    def run(level, fn, cases, settings):
        if level.option("route") == "coins":
            return run_coin_route(run_batched, level, lambda step: step, fn, cases, settings, BATCHED)
        return run_batched(level, fn, cases, settings)

    return run
