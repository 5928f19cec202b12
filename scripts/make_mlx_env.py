"""Make the cached virtual environment in which specref runs mlx-lm's OpenAI-compatible server (Linux CPU).

``python scripts/make_mlx_env.py`` (``--venv DIR``; default ``$SPECREF_MLX_VENV``, else
``~/.cache/specref/venvs/mlx-lm-0.32.2``) does, once:

1. ``python -m venv DIR`` with this interpreter (mlx-lm 0.32.2 needs CPython >= 3.11);
2. ``pip install mlx[cpu]==0.32.4 mlx-lm==0.32.2``: on Linux the ``mlx`` wheel holds the Python
   package only, and its ``cpu`` extra brings the CPU backend (``mlx-cpu==0.32.4``; without it
   ``import mlx.core`` fails); mlx-lm brings transformers (>= 5.7, its tokenizers; no torch),
   numpy, sentencepiece, protobuf, pyyaml and jinja2.  Nothing of specref's: the server runs in
   this environment, specref's client and the target's law in the caller's interpreter;
3. a check in the new environment: ``import mlx.core, mlx_lm, mlx_lm.server`` and one
   ``mx.eval`` on the CPU, with the versions printed;
4. the marker ``DIR/.specref-complete`` (JSON: the pins, the versions the check read, seconds).

Idempotent: with the marker in place and naming the same pins, nothing is done (``--check``
re-runs step 3; ``--force`` remakes it).  Exit status 0 when the environment is ready, 1
otherwise (what failed is printed).  About 30 s and 400 MB the first time.
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

MLX = ("mlx", "0.32.4")
MLX_LM = ("mlx-lm", "0.32.2")
MARKER = ".specref-complete"
ENV_VAR = "SPECREF_MLX_VENV"

CHECK = """
import json, mlx.core as mx, mlx_lm, mlx_lm.server, transformers
mx.eval(mx.ones(2) + 1)
print(json.dumps({"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "transformers": transformers.__version__,
                  "device": str(mx.default_device())}))
"""


def default_venv() -> Path:
    """``$SPECREF_MLX_VENV``, else ``~/.cache/specref/venvs/mlx-lm-0.32.2``."""
    return Path(os.environ.get(ENV_VAR) or Path.home() / ".cache" / "specref" / "venvs" / f"{MLX_LM[0]}-{MLX_LM[1]}"
                ).expanduser()


def pins() -> dict:
    return {MLX[0]: MLX[1], MLX_LM[0]: MLX_LM[1], "extra": "cpu"}


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def check(venv: Path) -> dict | None:
    """The versions the environment imports, or None (printed why)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    out = subprocess.run([str(venv_python(venv)), "-c", CHECK], capture_output=True, text=True, env=env, cwd=str(venv))
    if out.returncode != 0:
        print(f"  the check failed in {venv}:\n{out.stderr[-3000:]}")
        return None
    versions = json.loads(out.stdout.strip().splitlines()[-1])
    if versions["mlx"] != MLX[1] or versions["mlx_lm"] != MLX_LM[1]:
        print(f"  mlx {versions['mlx']}, mlx-lm {versions['mlx_lm']} in {venv}, not {MLX[1]}, {MLX_LM[1]}")
        return None
    return versions


def make(venv: Path) -> int:
    start = time.perf_counter()
    if venv.exists():
        print(f"  removing the incomplete environment {venv}")
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [([sys.executable, "-m", "venv", venv], "python -m venv"),
             ([venv_python(venv), "-m", "pip", "--disable-pip-version-check", "install",
               f"{MLX[0]}[cpu]=={MLX[1]}", f"{MLX_LM[0]}=={MLX_LM[1]}"], f"pip install {MLX_LM[0]}=={MLX_LM[1]}")]
    for cmd, what in steps:
        print("  $", " ".join(str(c) for c in cmd), flush=True)
        if subprocess.run([str(c) for c in cmd]).returncode != 0:
            print(f"  {what} failed")
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
    ap.add_argument("--check", action="store_true", help="also import mlx-lm in an environment already made")
    ap.add_argument("--force", action="store_true", help="remake the environment even if it is complete")
    args = ap.parse_args(argv)
    venv = Path(args.venv).expanduser() if args.venv else default_venv()
    print(f"mlx-lm environment {venv} ({MLX[0]}[cpu]=={MLX[1]}, {MLX_LM[0]}=={MLX_LM[1]})")
    try:
        marker = json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        marker = None
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
