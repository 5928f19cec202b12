"""An outside implementation under the oracle: Hugging Face transformers' speculative sampling.

Assisted generation in transformers (``model.generate(..., assistant_model=draft,
do_sample=True)``) accepts and resamples draft tokens in one private function,
``transformers.generation.utils._speculative_sampling`` -- Leviathan et al. 2022,
Algorithm 1 (SPEC §3), written in PyTorch.  :func:`hf_speculative_step` puts that
function behind specref's probability-level protocol, so that
:func:`specref.verification.oracle.check_step` can judge it in statistical mode (SPEC §6)::

    from specref.adapters.hf import hf_speculative_step
    from specref.verification.oracle import check_step
    print(check_step(hf_speculative_step, mode="statistical"))

Leviathan et al. notation: ``p`` is the target, ``q`` the draft.

What the function expects, and how the adapter feeds it (read from its source in
every supported release):

- ``candidate_logits [1, K, V]`` (draft) and ``new_logits [1, K+1, V]`` (target) are
  logits *after* the logits processors: it takes ``softmax`` of them itself and
  applies no sampling rule.  In ``generate`` they are float32 (the target's logits
  are cast with ``.to(torch.float32)`` before the processors run).  The adapter hands
  it ``log p`` and ``log q`` as float32 (``-inf`` where a probability is 0), whose
  softmax is the row again up to float32 rounding.
- ``candidate_input_ids [1, n]`` ends with the K draft tokens (only the last
  ``candidate_length = K`` are read); the adapter passes just those.
- it returns ``(valid_tokens [1, n_matches + 1], n_matches)``; the adapter returns
  ``valid_tokens[0]`` as a list of 1..K+1 ints.

Signature history (``pip download transformers==X`` and ``inspect``):

- < 4.38: no such function;
- 4.38 - 4.39: ``(..., new_logits, last_assistant_token_is_eos, max_matches)`` -- not supported;
- 4.40 - 5.13: ``(..., new_logits, is_done_candidate)``;
- 5.14 - 5.17: ``(..., new_logits, is_done_candidate, assistant_ensemble_weight=None)``;
- 5.18 - 5.24: ``(..., new_logits, assistant_ensemble_weight=None)``.

``is_done_candidate`` (the last draft token is EOS or hits the length limit) is
passed as False: the stop rule belongs to the decoding loop, not to the step.
``assistant_ensemble_weight`` (DIVERSE ensemble verification, an approximate method
that HF documents as biased) is left at None -- the distribution-preserving path --
unless the caller asks for it.  Releases outside :data:`SUPPORTED_TRANSFORMERS` are
refused: the function is private and its signature has changed three times.

One deviation from SPEC §3, read from the source and shown with a found seed in
``tests/test_hf.py``: the accept test is ``r_i <= p_i / q_i`` with ``r_i = torch.rand``
in [0, 1), so a draft token with ``p(x_i) = 0`` is accepted when ``r_i == 0.0`` --
probability 2**-24 per such position in float32 (2**-53 in float64).  In ``generate``
that happens whenever top-k/top-p leave the target a zero where the draft proposed a
token.  It moves the law by at most 2**-24 per position, far below what sampling can see.
transformers 5.25 makes the comparison strict (``r_i < probability_ratio``).

Coins in (SPEC §11.9): :func:`hf_coin_kernel` puts the same function, unmodified, in the
``batched_coins`` level's call with its two draws (:data:`HF_SEAM`) answered from the
handed-in coins, so the oracle computes its exact law and names that deviation
``boundary`` (``tests/test_hf_coins.py``); :func:`load_speculative_sampling` takes the
function out of any release's ``generation/utils.py`` for the same check
(``benchmarks/hf_coins.py`` runs every minor release 4.40 - 5.25)::

    from specref import check
    print(check("batched_coins", hf_coin_kernel()))

Randomness: the function draws ``torch.rand_like`` and ``torch.multinomial`` from
torch's *global* CPU generator and takes no generator argument, so a seed can only
reach it through that global state.  The adapter seeds it with the integer ``rng``
inside :func:`torch.random.fork_rng`, which restores the caller's generator state on
exit -- the global seeding is a necessity of wrapping this function, not a pattern
to copy.  torch's CPU generator (mt19937) uses only the low 32 bits of a seed.

torch and transformers are imported inside the functions, so ``import specref.adapters.hf``
works without them; calling the adapter without them raises ``ImportError`` naming
the ``hf`` extra (``pip install 'specref[hf]'``).
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap

import numpy as np

from specref.adapters.real_engines.shim import _one_torch_thread
from specref.core.errors import SpecrefError
from specref.core.step import check_step_inputs

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "supported_versions",
    "installed_versions",
    "hf_speculative_step",
    "to_hf_logits",
    "HF_SEAM",
    "RANDOM_CALLS",
    "seam_calls",
    "check_seam",
    "load_speculative_sampling",
    "inverse_cdf",
    "exact_logits",
    "hf_coin_kernel",
]

SUPPORTED_TRANSFORMERS = (4, 40), (5, 25)
"""``(lowest, first excluded)`` (major, minor) releases of transformers: ``>=4.40,<5.25``."""

_EXTRA = "pip install 'specref[hf]'"


def supported_versions() -> str:
    """The supported transformers releases as a requirement string: ``">=4.40,<5.25"``."""
    (a, b), (c, d) = SUPPORTED_TRANSFORMERS
    return f">={a}.{b},<{c}.{d}"


def installed_versions() -> dict:
    """``{"transformers": ..., "torch": ...}`` as installed, after checking both are usable.

    Raises ``ImportError`` when either cannot be imported or transformers is outside
    :func:`supported_versions`; the message says how to install a supported one.
    """
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ImportError(
            f"specref.adapters.hf needs torch and transformers{supported_versions()} ({e}): {_EXTRA}"
        ) from e
    version = transformers.__version__
    match = re.match(r"(\d+)\.(\d+)", version)
    lowest, excluded = SUPPORTED_TRANSFORMERS
    if match is None or not lowest <= (int(match[1]), int(match[2])) < excluded:
        raise ImportError(
            f"specref.adapters.hf supports transformers{supported_versions()}, found {version}: "
            f"_speculative_sampling is private and its signature changes between releases; {_EXTRA}"
        )
    return {"transformers": version, "torch": torch.__version__}


@functools.cache  # the import and signature checks cost ~15 ms: once per process
def _speculative_sampling():
    """The checked function and the names of its parameters."""
    installed_versions()
    from transformers.generation.utils import _speculative_sampling as fn

    return fn, tuple(inspect.signature(fn).parameters)


def to_hf_logits(rows, dtype="float32"):
    """Probability rows ``[n, V]`` -> a torch tensor ``[1, n, V]`` of log-probabilities.

    ``softmax(log p) = p`` (up to rounding in ``dtype``); a probability of 0 becomes
    ``-inf``, whose softmax weight is exactly 0, as a masking logits processor leaves it.
    """
    import torch

    with np.errstate(divide="ignore"):  # log 0 = -inf is the intended masked logit
        logp = np.log(np.asarray(rows, dtype=np.float64))
    return torch.from_numpy(logp.astype(dtype))[None]  # [n, V] -> [1, n, V]


def hf_speculative_step(p_target, q_draft, draft_tokens, rng, *, dtype="float32",
                        assistant_ensemble_weight=None) -> list[int]:
    """One speculative step by ``transformers.generation.utils._speculative_sampling``.

    - ``p_target``: ``[K+1, V]`` target distributions (after all sampling rules).
    - ``q_draft``: ``[K, V]`` draft distributions ``draft_tokens`` were drawn from.
    - ``draft_tokens``: ``[K]`` ints.
    - ``rng``: an integer seed for torch's global CPU generator (statistical mode; the
      caller's generator state is restored afterwards).
    - ``dtype``: the logits' dtype; ``"float32"`` is what ``generate`` hands it.
    - ``assistant_ensemble_weight``: None (the lossless algorithm) or HF's DIVERSE weight
      ``w`` in (0, 1) -- an approximate method, in transformers >= 5.14.

    Returns the emitted tokens, 1 to K+1 of them.
    """
    fn, params = _speculative_sampling()
    import torch

    if isinstance(rng, bool) or not isinstance(rng, (int, np.integer)):
        raise TypeError(f"rng must be an integer seed (torch draws its own random numbers), got {rng!r}")
    p_target, q_draft, tokens = check_step_inputs(p_target, q_draft, draft_tokens)
    K = q_draft.shape[0]
    kwargs: dict[str, object] = {}
    if "is_done_candidate" in params:  # 4.40 - 5.17: the loop's stop rule, not the step's
        kwargs["is_done_candidate"] = False
    if assistant_ensemble_weight is not None:
        if "assistant_ensemble_weight" not in params:
            raise TypeError("assistant_ensemble_weight needs transformers >= 5.14")
        kwargs["assistant_ensemble_weight"] = float(assistant_ensemble_weight)
    candidate_logits = to_hf_logits(q_draft, dtype)  # [1, K, V]
    new_logits = to_hf_logits(p_target, dtype)  # [1, K+1, V]
    candidate_ids = torch.tensor([list(tokens)], dtype=torch.long)  # [1, K]
    threads = torch.get_num_threads()
    # [1, K+1, V] tensors are too small to share: the intra-op pool only adds overhead (~5x on 2 cores)
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's global generator state comes back on exit
            torch.default_generator.manual_seed(int(rng))  # not torch.manual_seed: that also seeds every device (~0.3 ms)
            valid_tokens, _ = fn(candidate_ids, candidate_logits, K, new_logits, **kwargs)
    finally:
        torch.set_num_threads(threads)
    return [int(t) for t in valid_tokens[0].tolist()]  # [1, n_matches + 1] -> 1..K+1 ints


# ---------------------------------------------------------------- coins in: the batched_coins level (SPEC §11.9)

HF_SEAM = ("rand_like", "multinomial")
"""The calls of ``_speculative_sampling`` that draw its randomness, in the order it makes them (read in
every release 4.40 - 5.25): ``r_i = torch.rand_like(probability_ratio)`` (the acceptance coins of the K
drafts), then ``torch.multinomial(p_prime, num_samples=1)`` (the residual or bonus token)."""

RANDOM_CALLS = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "multinomial", "bernoulli",
    "normal", "poisson", "exponential_", "uniform_", "normal_", "bernoulli_", "random_", "geometric_", "cauchy_",
    "log_normal_"})
"""torch functions and tensor methods that draw random numbers: a coin seam replaces the ones its function
makes and refuses any other (the coins would not hold all of the function's randomness)."""

_EXACT_ROUNDS = 8  # passes over a row in the search for exact logits (the sum couples the entries)
_EXACT_STEPS = 64  # ulps one entry may walk in one pass


def seam_calls(source: str) -> list[tuple[int, str, str]]:
    """``(line, receiver, name)`` of every call in ``source`` named in :data:`RANDOM_CALLS`, in source
    order: ``torch.rand_like(x)`` is ``(line, "torch", "rand_like")``, ``q.exponential_()`` is
    ``(line, "q", "exponential_")``."""
    found = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RANDOM_CALLS:
            receiver = node.func.value.id if isinstance(node.func.value, ast.Name) else ast.unparse(node.func.value)
            found.append((node.lineno, receiver, node.func.attr))
    return sorted(found)


def check_seam(source: str, expected, what: str) -> None:
    """The random draws in ``source`` must be exactly ``expected`` (``(receiver, name)`` pairs, in source
    order), else a :class:`SpecrefError` naming ``what`` (the function and its release) and what was found:
    a coin seam that patches calls the function no longer makes would leave its randomness in place."""
    got = [(receiver, name) for _, receiver, name in seam_calls(source)]
    if got != [tuple(e) for e in expected]:
        want = ", ".join(f"{r}.{n}" for r, n in expected)
        found = ", ".join(f"{r}.{n}" for r, n in got) or "no random draw"
        raise SpecrefError(f"{what}: the coin seam replaces exactly {want} (in that order), but the function's source "
                           f"draws {found}. Re-read the function and update its coin seam in specref/adapters/")


def load_speculative_sampling(module_source: str, version: str):
    """``(function, its source)``: ``_speculative_sampling`` taken out of the text of a release's
    ``transformers/generation/utils.py`` (its AST; nothing else of the module runs) and defined with
    torch as its only global -- all it uses in 4.40 - 5.25.  ``version`` names the release in errors;
    a module without the function is a :class:`SpecrefError` naming both."""
    import __future__

    import torch

    try:
        tree = ast.parse(module_source)
    except SyntaxError as e:
        raise SpecrefError(f"transformers {version}: generation/utils.py does not parse ({e})") from None
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_speculative_sampling"]
    if not found:
        raise SpecrefError(f"transformers {version}: generation/utils.py defines no _speculative_sampling (the "
                           "function whose coins the seam replaces; it exists in 4.38 and later)")
    source = ast.get_source_segment(module_source, found[0])
    assert source is not None  # a node parsed from module_source has its segment
    namespace = {"torch": torch, "__name__": f"transformers-{version}.generation.utils"}
    # annotations stay strings (5.14+ writes ``float | None``): the function runs as defined
    code = compile(source, f"<transformers {version} generation/utils.py>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - the released function's own text, to call it on coins
    return namespace["_speculative_sampling"], source


@functools.cache
def _seam_class():
    """:class:`CoinSeam`, made on first use (torch is imported inside the functions)."""
    from torch.overrides import TorchFunctionMode

    class CoinSeam(TorchFunctionMode):
        """For one call: each torch function in ``handlers`` answered by its handler (from the coins), in
        the order ``order`` names them; any other random draw a :class:`SpecrefError` naming ``what``."""

        def __init__(self, handlers: dict, order: tuple, what: str):
            super().__init__()
            self.handlers, self.order, self.what = handlers, tuple(order), what
            self.made: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if func in self.handlers:
                self.made.append(name)
                if tuple(self.made) != self.order[:len(self.made)]:
                    raise SpecrefError(f"{self.what} drew {' then '.join(self.made)}; the coin seam expects "
                                       f"{' then '.join(self.order)}, once each")
                return self.handlers[func](*args, **kwargs)
            if name in RANDOM_CALLS:
                raise SpecrefError(f"{self.what} drew torch's {name}, which the coin seam does not replace")
            return func(*args, **kwargs)

        def finished(self):
            if tuple(self.made) != self.order:
                raise SpecrefError(f"{self.what} drew {' then '.join(self.made) or 'nothing'}; the coin seam expects "
                                   f"{' then '.join(self.order)}, once each")

    return CoinSeam


def inverse_cdf(weights, u) -> int:
    """The token that final coin ``u`` in [0, 1) draws from ``weights [V]`` (not normalised): the level's
    ``#{j : cdf_j <= u * total}`` (:func:`~specref.verification.levels.coins.kernels.engine_coin_kernel`),
    in float64, at most the last token of positive weight."""
    import torch

    w = weights.to(torch.float64)
    cdf = torch.cumsum(w, 0)
    y = int((cdf <= float(u) * cdf[-1]).sum())
    return min(y, int(torch.nonzero(w > 0)[-1]))


def _exact_logit_row(row: np.ndarray, dtype: str) -> np.ndarray | None:
    """Logits ``[V]`` of ``dtype`` whose torch softmax (in ``dtype``) is ``row`` exactly, or None.

    From ``log(p / p_max)`` (the largest 0: ``exp(0) = 1`` exactly; ``-inf`` where ``p = 0``), each other
    entry walks an ulp at a time toward its probability; ``p_max`` itself depends on the sum alone, so when
    only it is off one other entry moves by an ulp; a few passes, since every step moves the sum."""
    import torch

    dt = np.dtype(dtype)
    target = row.astype(dt)
    m = int(np.argmax(target))
    with np.errstate(divide="ignore"):  # log 0 = -inf: a masked logit, weight exactly 0
        x = np.log(target.astype(np.float64) / float(target[m])).astype(dt)
    x[m] = 0
    others = [int(j) for j in np.flatnonzero(target > 0) if j != m]
    up, down = dt.type(np.inf), dt.type(-np.inf)

    def softmax(z):
        return torch.from_numpy(z).softmax(-1).numpy()

    for r in range(_EXACT_ROUNDS):
        if np.array_equal(softmax(x), target):
            return x
        for j in others:
            for _ in range(_EXACT_STEPS):
                s = softmax(x)
                if s[j] == target[j]:
                    break
                x[j] = np.nextafter(x[j], up if s[j] < target[j] else down)
        s = softmax(x)
        if s[m] != target[m] and others:
            j = others[r % len(others)]
            x[j] = np.nextafter(x[j], up if s[m] > target[m] else down)
    return x if np.array_equal(softmax(x), target) else None


@functools.lru_cache(maxsize=4096)
def _exact_logit_row_cached(data: bytes, dtype: str) -> bytes | None:
    x = _exact_logit_row(np.frombuffer(data, dtype=np.float64).copy(), dtype)
    return None if x is None else x.tobytes()


def exact_logits(rows, dtype: str = "float64"):
    """Probability rows ``[n, V]`` -> a torch tensor ``[n, V]`` of ``dtype`` logits whose softmax in
    ``dtype`` is each row *exactly* (:func:`to_hf_logits` gives ``log p``, whose softmax is the row only
    up to rounding: ``log`` and ``exp`` of 1/8, 3/8, 1/4, 1/4 in float32 come back an ulp off).

    A coin law measures a function's comparisons of its coins with its probabilities to the last grid
    point, so the probabilities it computes must be the rows, not their rounding.  A row with no such
    logits (float32 ``(1/8, 3/8, 1/4, 1/4)``: ``exp`` jumps over ``1/3``) is a :class:`SpecrefError`
    naming it; float64 logits exist for every row tried."""
    import torch

    host = np.asarray(rows, dtype=np.float64)
    out = np.empty(host.shape, dtype=dtype)
    for i, row in enumerate(host):
        found = _exact_logit_row_cached(np.ascontiguousarray(row).tobytes(), dtype)
        if found is None:
            raise SpecrefError(f"no {dtype} logits whose softmax is the row {row.tolist()} exactly (rows[{i}]): "
                               f"a coin law would measure the rounding of the logits, not the function")
        out[i] = np.frombuffer(found, dtype=dtype)
    return torch.from_numpy(out)


def _one_hot_logits(tokens, V: int):
    """Point-mass drafts as logits ``[len(tokens), V]``: 0 at the draft, ``-inf`` elsewhere (softmax: one-hot)."""
    import torch

    out = torch.full((len(tokens), V), -torch.inf, dtype=torch.float64)
    out[torch.arange(len(tokens)), torch.as_tensor(list(tokens), dtype=torch.long)] = 0.0
    return out


def _hf_handlers(u: np.ndarray, final: float, what: str) -> dict:
    """The seam's answers: ``torch.rand_like`` -> the row's acceptance coins (the shape and dtype of its
    argument), ``torch.multinomial(p_prime, 1)`` -> :func:`inverse_cdf` of ``p_prime`` at the final coin."""
    import torch

    real_multinomial = torch.multinomial

    def rand_like(like, *args, **kwargs):
        if like.numel() != len(u):
            raise SpecrefError(f"{what}: torch.rand_like asked for {like.numel()} coins; the row has {len(u)} drafts")
        return torch.as_tensor(u, dtype=like.dtype).reshape(like.shape)

    def multinomial(weights, num_samples, replacement=False, *, generator=None, out=None):
        if num_samples != 1 or weights.dim() != 2 or weights.shape[0] != 1 or out is not None:
            raise SpecrefError(f"{what}: torch.multinomial(weights {list(weights.shape)}, {num_samples}); the seam "
                               f"reads one row, one sample (the residual or bonus token) from the final coin")
        w = weights.to(torch.float64)
        if not (torch.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
            return real_multinomial(weights, num_samples)  # torch's own error for such weights, as the engine gets
        return torch.tensor([[inverse_cdf(w[0], final)]], dtype=torch.long)

    return {torch.rand_like: rand_like, torch.multinomial: multinomial}


def hf_coin_kernel(fn=None, *, version: str | None = None, source: str | None = None):
    """``_speculative_sampling`` in the ``batched_coins`` level's call, its randomness the handed-in coins.

    ``kernel(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], uniform_coins [B, K],
    final_coins [B]) -> [B, K+1]`` padded with -1.  ``fn=None``: the installed transformers' function
    (:func:`supported_versions`); else a function of the same release line with ``version`` and its
    ``source`` (:func:`load_speculative_sampling` gives both from a release's file).

    The function runs unmodified, once per row (it is a one-sequence function), with K = ``k_b`` (-1 ends a
    ragged row).  The seam is a :class:`torch.overrides.TorchFunctionMode` active for the call only, which
    answers exactly the calls of :data:`HF_SEAM` in that order: ``torch.rand_like(probability_ratio)``
    returns ``uniform_coins[b, :k_b]`` (its argument's shape and dtype), and
    ``torch.multinomial(p_prime, num_samples=1)`` returns the inverse-CDF read of ``final_coins[b]``
    (:func:`inverse_cdf`, the level's definition of the final coin: ``p_prime`` is the normalised
    residual after a rejection or the bonus row).  Any other random draw, or these in another number or
    order, raises; so does a source whose draws are not :data:`HF_SEAM` (:func:`check_seam`), naming the
    function and the release.

    The rows go in as float64 logits whose softmax is the row exactly (:func:`exact_logits`; point-mass
    drafts one-hot), so the law measured is the function's, not the rounding of ``log p`` (``generate``'s
    float32 softmax of ``1/8, 3/8, 1/4, 1/4`` is an ulp off whatever the logits).  float32 coins are exact
    in float64.
    """
    if fn is None:
        fn, _ = _speculative_sampling()
        version = installed_versions()["transformers"]
        source = inspect.getsource(fn)
    elif version is None or source is None:
        raise SpecrefError("hf_coin_kernel(fn): pass the function's release as version= and its text as source= "
                           "(load_speculative_sampling gives both)")
    what = f"transformers {version}: _speculative_sampling"
    check_seam(source, [("torch", name) for name in HF_SEAM], what)
    # 4.40 - 5.17: is_done_candidate, the loop's stop rule (not the step's)
    extra = {"is_done_candidate": False} if "is_done_candidate" in inspect.signature(fn).parameters else {}
    seam_class = _seam_class()

    def kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
        import torch

        p, x = np.asarray(p_target), np.asarray(draft_tokens, dtype=np.int64)
        u, fin = np.asarray(uniform_coins, dtype=np.float64), np.asarray(final_coins, dtype=np.float64)
        B, K1, V = p.shape
        out = np.full((B, K1), -1, dtype=np.int64)
        with _one_torch_thread():  # rows of a few tokens: the pool costs ~5x
            for b in range(B):
                kb = int(np.argmax(x[b] == -1)) if (x[b] == -1).any() else K1 - 1
                drafts = [int(t) for t in x[b, :kb]]
                candidate = (_one_hot_logits(drafts, V) if q_draft is None
                             else exact_logits(np.asarray(q_draft)[b, :kb]))[None]  # [1, k_b, V]
                seam = seam_class(_hf_handlers(u[b, :kb], fin[b], what), HF_SEAM, what)
                with seam:  # new_logits [1, k_b + 1, V]; candidate_input_ids [1, k_b]
                    valid, _ = fn(torch.tensor([drafts], dtype=torch.long).reshape(1, kb), candidate, kb,
                                  exact_logits(p[b, :kb + 1])[None], **extra)
                seam.finished()
                tokens = [int(t) for t in valid[0].tolist()]  # [1, n_matches + 1]
                out[b, :len(tokens)] = tokens
        return out

    kernel.__name__ = f"hf_coin_kernel(transformers {version})"
    return kernel
