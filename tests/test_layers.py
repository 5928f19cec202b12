"""The floors of the README are import-linter contracts in pyproject.toml; these tests run them.

The second test shows the check can fail: the same contracts, run on a copy of the
tree with one upward import added, must report a broken contract.  import-linter does not
see a cycle inside one layer, so a cycle finder over grimp's import graph (imports inside
functions included) runs beside it, and is shown to fail on a package with a cycle.
"""

import ast
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
    assert "3 kept, 0 broken" in run.stdout


@pytest.mark.parametrize("module, upward", [
    ("specref/core/step.py", "import specref.decoding.chain"),  # the ground floor reaching up
    ("toy_models/ngram.py", "import specref.verification.oracle"),  # toy models beyond the ground floor
    ("specref/verification/oracle.py", "import toy_models.ngram"),  # the oracle leaning on the toy models
    ("specref/verification/laws/enumeration.py", "import specref.verification.levels.chain"),  # a room reaching up
    ("specref/verification/running/calling.py", "import specref.verification.zoo"),  # the runner leaning on the zoo
])
def test_an_upward_import_breaks_a_contract(tmp_path, module, upward):
    for name in ("specref", "toy_models"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{upward}  # added by the test\n")
    run = lint_imports(tmp_path)
    assert run.returncode != 0 and "BROKEN" in run.stdout, run.stdout + run.stderr


def import_cycles(root: Path, *packages: str) -> list[list[str]]:
    """Every cycle of module imports under ``packages`` (strongly connected components of two or
    more modules, or a module importing itself), by Tarjan's algorithm over grimp's graph."""
    script = (
        "import grimp, json, sys; g = grimp.build_graph(*sys.argv[1:]);"
        "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))")
    run = subprocess.run([sys.executable, "-c", script, *packages], cwd=root, capture_output=True, text=True,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert run.returncode == 0, run.stderr
    import json

    graph = json.loads(run.stdout)
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # recursive Tarjan: the graphs here are a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_imports_a_module_that_imports_it():
    assert import_cycles(ROOT, "specref", "toy_models") == []


def test_the_cycle_finder_finds_a_cycle_inside_one_layer(tmp_path):
    pkg = tmp_path / "loop"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from loop import b\n")
    (pkg / "b.py").write_text("def f():\n    from loop import c  # inside a function: still an import\n")
    (pkg / "c.py").write_text("import loop.a\n")
    (pkg / "d.py").write_text("import loop.a\n")  # imports the cycle without being on it
    assert import_cycles(tmp_path, "loop") == [["loop.a", "loop.b", "loop.c"]]


def test_no_module_imports_a_moved_path():
    """0.2's flat paths are aliases for users (specref.verification._moved); specref itself,
    its tests, benchmarks and figures import the new paths."""
    from specref.verification._moved import MOVED

    offenders = []
    for folder in ("specref", "tests", "benchmarks", "figures", "proofs", "toy_models"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "test_moved.py":
                continue  # the test of the aliases imports them on purpose
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                if isinstance(node, ast.ImportFrom) and node.module == "specref.verification":
                    names = [f"specref.verification.{a.name}" for a in node.names]
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n in MOVED]
    assert offenders == []
