"""The habits of a kept library: ruff and mypy read ``specref/`` cleanly.

- ``python -m ruff check specref`` finds nothing under ``ruff.toml``'s rules (pyflakes, the
  pycodestyle errors that are not layout, and bugbear: see the file for why these);
- ``python -m mypy specref`` finds nothing under ``mypy.ini`` (not strict: the annotated code and
  every call into it are checked; an unannotated function is not asked for annotations);
- each check fails on a file that breaks its rules, so a clean run means something;
- ``specref/py.typed`` is there, so a type checker reads specref's annotations in a user's code.

Neither tool has a time limit here: both finish on their own (ruff in well under a second,
mypy in about a minute from a cold cache on 2 shared cores, seconds from a warm one), and a
limit guessed below a slow machine's time would fail a clean tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    pytest.importorskip(args[0])  # both are in the test extra
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True)
    print(f"\npython -m {' '.join(args)}: exit {run.returncode} in {time.perf_counter() - start:.1f} s")
    return run


def test_ruff_finds_nothing_in_specref():
    run = _tool("ruff", "check", "specref", "--output-format", "concise")
    assert run.returncode == 0, run.stdout + run.stderr


def test_mypy_finds_nothing_in_specref():
    run = _tool("mypy", "specref")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("Success: no issues found"), run.stdout


def _broken_package(tmp_path: Path) -> Path:
    """A copy of the two configurations beside a one-module ``specref`` that breaks both."""
    for name in ("ruff.toml", "mypy.ini"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "specref").mkdir()
    (tmp_path / "specref" / "__init__.py").write_text("")
    (tmp_path / "specref" / "bad.py").write_text(
        "import os\n"  # F401: imported and unused
        "\n\n"
        "def rows(n: int) -> list[int]:\n"
        "    calls = [lambda: i for i in range(n)]\n"  # B023: every closure sees the last i
        "    return [c() for c in calls] + ['one']\n"  # mypy: a str in a list[int]
    )
    return tmp_path


def test_the_checks_can_fail(tmp_path):
    root = _broken_package(tmp_path)
    ruff = _tool("ruff", "check", "specref", "--output-format", "concise", cwd=root)
    assert ruff.returncode == 1 and "F401" in ruff.stdout and "B023" in ruff.stdout, ruff.stdout + ruff.stderr
    mypy = _tool("mypy", "specref", "--cache-dir", str(tmp_path / ".mypy_cache"), cwd=root)
    assert mypy.returncode == 1 and "bad.py:6" in mypy.stdout, mypy.stdout + mypy.stderr


def test_specref_ships_its_annotations():
    assert (ROOT / "specref" / "py.typed").is_file()
