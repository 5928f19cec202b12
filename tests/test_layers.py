"""The floors of the README are import-linter contracts in pyproject.toml; these tests run them.

The second test shows the check can fail: the same contracts, run on a copy of the
tree with one upward import added, must report a broken contract.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    script = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename='pyproject.toml'))"
    return subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_the_layer_contracts_hold():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 kept, 0 broken" in run.stdout


@pytest.mark.parametrize("module, upward", [
    ("specref/core/step.py", "import specref.decoding.chain"),  # the ground floor reaching up
    ("toy_models/ngram.py", "import specref.verification.oracle"),  # toy models beyond the ground floor
    ("specref/verification/oracle.py", "import toy_models.ngram"),  # the oracle leaning on the toy models
])
def test_an_upward_import_breaks_a_contract(tmp_path, module, upward):
    for name in ("specref", "toy_models"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{upward}  # added by the test\n")
    run = lint_imports(tmp_path)
    assert run.returncode != 0 and "BROKEN" in run.stdout, run.stdout + run.stderr
