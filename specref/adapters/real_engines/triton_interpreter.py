"""Triton in its interpreter, on the CPU: the engines' Triton kernels run there, with five
adjustments, each where it is done.  Follows triton 3.9.0 (the pinned wheel).

Triton is imported from the wheel cache with ``TRITON_INTERPRET=1`` (:func:`_triton`; its
directory leaves ``sys.path`` once it is imported), and the engine trees that run Triton kernels
set ``TRITON_INTERPRET=1`` while active and enter these hooks (vLLM's sampler module on the
interpreted Triton path, :mod:`specref.adapters.vllm_sampler`, enters them too, with
:func:`_interpreter_range`):

- Triton 3.9's interpreter returns None from ``triton.language.extra.libdevice`` calls
  (triton-lang/triton#8825): :func:`_interpreter_libdevice` gives ``libdevice.log1p`` (the one
  such call on these paths, MRV2's residual in probabilistic mode) a NumPy ``log1p`` of the
  same dtype while a vLLM 0.33.0 tree is active, and only if a probe kernel shows the bug;
- :func:`_interpreter_patch_once` skips the interpreter's repeated re-patching of
  ``triton.language`` at every ``@triton.jit`` helper call within a launch (a speed-up of
  about 2x on MRV2; a test shows the outputs are bit-identical without it);
- :func:`_interpreter_as_compiled` leaves out the interpreter's integer-overflow asserts, which a
  compiled kernel compiles out without ``debug=True`` (a speed-up of about 1.8x on vLLM V1's kernels);
- :func:`_quiet_numpy` turns NumPy's floating-point warnings off (the interpreter evaluates
  both sides of ``tl.where``);
- :func:`_interpreter_range` makes ``tl.range``'s induction variable a scalar tensor, as in
  compiled Triton, where the interpreter hands a Python ``int`` (so ``row_id.to(tl.int64)``, in
  vLLM 0.32.0's top-k/top-p kernel, raises ``AttributeError``), and only if a probe kernel shows it.

One more adjustment outside the engines' files, vLLM's driver probe answered True, is the vLLM
tree's own (:mod:`specref.adapters.real_engines.vllm_tree`).
"""

from __future__ import annotations

import contextlib
import inspect
import sys

import numpy as np

from specref.adapters.real_engines.shim import _env
from specref.adapters.real_engines.wheels import PINNED, _tree
from specref.core.errors import SpecrefError


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


@contextlib.contextmanager
def _interpreter_as_compiled():
    """While active: the interpreter leaves out the integer-overflow checks a compiled kernel leaves out.

    Triton 3.9's interpreter runs with ``InterpreterOptions.sanitize_overflow = True``, so every
    ``+``, ``-`` and ``*`` of 32-bit integers is redone in 64 bits and compared with the type's
    range, and a device assert it cannot compile out raises (about 45% of the time of vLLM V1's
    rejection kernels on the CPU).  A compiled kernel emits that assert only to drop it: device
    asserts are compiled out without ``debug=True``, which no engine sets; so a kernel whose
    integers wrap, wraps there.  With the check off the interpreter computes what the compiled
    kernel computes, and faster; ``_AS_COMPILED["on"] = False`` keeps the interpreter's check (a
    test compares the outputs both ways).
    """
    from dataclasses import replace  # noqa: PLC0415

    from triton.runtime import interpreter  # noqa: PLC0415

    builder = interpreter.interpreter_builder
    original = builder.options
    if not _AS_COMPILED["on"]:
        yield
        return
    builder.options = replace(original, sanitize_overflow=False)
    try:
        yield
    finally:
        builder.options = original


_AS_COMPILED = {"on": True}  # tests switch it off to compare outputs


_RANGE_FIX: dict = {}


@contextlib.contextmanager
def _interpreter_range():
    """While active: ``tl.range`` (not ``tl.static_range``) yields scalar tensors in the interpreter.

    Compiled Triton gives a ``for i in tl.range(a, b, s)`` loop an induction variable that is a
    scalar tensor of the bounds' integer type (int32, or int64 when a bound is int64), with
    ``.to`` and the other tensor methods; Triton 3.9's interpreter maps ``tl.range`` to Python's
    ``range`` (``_patch_lang_core`` in ``triton/runtime/interpreter.py``), so the variable is an
    ``int``.  The replacement iterates the same integers and wraps each as such a tensor; the
    kernels' arithmetic is then the compiled kernels'.  Applied only if :func:`_range_gives_int`
    shows the interpreter's behaviour.
    """
    from triton.runtime import interpreter  # noqa: PLC0415

    if "needed" not in _RANGE_FIX:
        _RANGE_FIX["needed"] = _range_gives_int()
    if not _RANGE_FIX["needed"]:
        yield
        return
    original = interpreter._patch_lang_core

    def patch_lang_core(lang, scope):
        original(lang, scope)
        scope.set_attr(lang, "range", _tensor_range)

    interpreter._patch_lang_core = patch_lang_core
    try:
        yield
    finally:
        interpreter._patch_lang_core = original


def _tensor_range(arg1, arg2=None, step=None, **_hints):
    """``tl.range`` for the interpreter: the integers of ``range(start, end, step)`` as scalar tensors
    (int64 when a bound is an int64 tensor, else int32); the compiler hints (``num_stages``,
    ``loop_unroll_factor``, ...) change nothing here."""
    from triton.language import core  # noqa: PLC0415
    from triton.runtime.interpreter import TensorHandle  # noqa: PLC0415

    start, end = (0, arg1) if arg2 is None else (arg1, arg2)
    bounds = (start, end, 1 if step is None else step)
    wide = any(isinstance(b, core.tensor) and b.dtype == core.int64 for b in bounds)
    dtype, np_dtype = (core.int64, np.int64) if wide else (core.int32, np.int32)
    for i in range(*(int(b.handle.data.squeeze()) if isinstance(b, core.tensor) else int(b) for b in bounds)):
        yield core.tensor(TensorHandle(np.array([i], dtype=np_dtype), dtype), dtype)


def _range_gives_int() -> bool:
    """Run an interpreted kernel that calls ``.to`` on a ``tl.range`` variable; True if it fails."""
    import torch  # noqa: PLC0415
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

    def probe(y_ptr, n):
        for i in tl.range(0, n):
            tl.store(y_ptr + i, i.to(tl.int64) * 2)

    with _env(TRITON_INTERPRET="1"):
        kernel = triton.jit(probe)
        y = torch.zeros(3, dtype=torch.int64)
        try:
            kernel[(1,)](y, 3)
        except Exception as e:  # noqa: BLE001 - the interpreter wraps it in its InterpreterError
            if "no attribute 'to'" in str(e):  # the induction variable is an int: the bug
                return True
            raise SpecrefError(f"the tl.range probe kernel failed otherwise under Triton's interpreter: {e!r:.300}") from e
    return y.tolist() != [0, 2, 4]
