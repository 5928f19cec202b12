"""The repository describes itself truly: no path outside it, no narrative about how
it was made, a layout table (on the layout page, ``docs/layout.md``) that matches the tree,
counts in the README and the guides that match the code, and a wheel that holds exactly the
packages and data the code needs."""

import re
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
LAYOUT = (ROOT / "docs" / "layout.md").read_text()  # the floors, the rooms and every module
GUIDES = sorted((ROOT / "docs" / "guide").glob("*.md"))

OUTSIDE = re.compile(r"\.\./shared|shared/SPEC|SPEC\.md|/work/")
NARRATIVE = re.compile(
    r"\bissue \d+|\bthis session\b|\bthe session\b|not at hand|\bearlier session|\bwas written\b|\bwe (?:found|tried)\b",
    re.IGNORECASE,
)


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        path = ROOT / name
        if path.suffix in {".py", ".md", ".toml", ".txt", ".cfg"} or path.parent.name == ".ci":
            yield name, path.read_text(errors="replace")


def test_the_scanners_see_what_they_look_for():
    outside = "see " + "../" + "shared/SPEC" + ".md"  # spelt in pieces, so this file holds no such path
    assert OUTSIDE.search(outside) and NARRATIVE.search("as issue 5 asked")
    assert not OUTSIDE.search("docs/spec.md") and not NARRATIVE.search("the residual is reissued")


def test_no_tracked_file_refers_outside_the_repository_or_narrates():
    files = dict(tracked_text_files())
    assert "README.md" in files and "docs/spec.md" in files
    bad = [f"{name}:{i}: {line.strip()}"
           for name, text in files.items() if name != "tests/test_repository.py"
           for i, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line) or NARRATIVE.search(line)]
    assert not bad, "\n".join(bad)


def test_the_layout_table_covers_the_tree():
    """Its rows are floors and rooms (the same page names every module below): each exists, and
    every module lies under one of them."""
    table = LAYOUT[LAYOUT.index("<!-- layout-table -->"):LAYOUT.index("<!-- /layout-table -->")]
    listed = {p for row in re.findall(r"^\| (`[^|]+`) \|", table, flags=re.MULTILINE)
              for p in re.findall(r"`([^`]+)`", row)}
    assert len(listed) >= 10, "no layout table found"
    missing = [r for r in listed if not (ROOT / r).exists()]
    assert not missing, f"docs/layout.md lists paths that do not exist: {missing}"
    modules = {str(p.relative_to(ROOT)) for pkg in ("specref", "toy_models") for p in (ROOT / pkg).rglob("*.py")
               if p.name != "__init__.py" and p.name != "__main__.py"}
    uncovered = sorted(m for m in modules if not any(m == r or (r.endswith("/") and m.startswith(r)) for r in listed))
    assert not uncovered, f"modules under no row of docs/layout.md's layout table: {uncovered}"


def test_the_layer_picture_matches_the_contract():
    import tomllib

    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    picture = re.search(r"```\n(specref\..*?)```", LAYOUT, flags=re.DOTALL).group(1)  # the first drawing
    drawn = [line.split("  ")[0].strip() for line in picture.strip().splitlines()]
    assert drawn == layers


def test_readme_counts_come_from_the_code():
    """The zoo's and the self-check's counts, in the README and wherever a guide states them."""
    from specref import verify
    from specref.verification.zoo import chain as zoo

    pages = {"README.md": README, **{f"docs/guide/{p.name}": p.read_text() for p in GUIDES}}
    kinds = Counter(e.kind for e in zoo.entries())
    zoo_count = r"\((\d+)\s+entries: (\d+) wrong, (\d+)\s+approximate.*?and (\d+)\s+correct"
    assert re.search(zoo_count, README, flags=re.DOTALL), "the zoo count sentence is missing"
    for name, text in pages.items():
        for m in re.finditer(zoo_count, text, flags=re.DOTALL):
            assert tuple(map(int, m.groups())) == (len(zoo.entries()), kinds["wrong"], kinds["approximate"],
                                                   kinds["correct"]), name
    scenarios = verify.matrix() + verify.controls()
    kinds = Counter(s.kind for s in scenarios)
    scenario_count = r"\((\d+) scenarios: (\d+)\s+correct, (\d+) negative\s+controls, (\d+) approximate"
    assert re.findall(scenario_count, README), "the self-check's count is missing"
    for name, text in pages.items():
        for claim in re.findall(scenario_count, text):
            assert tuple(map(int, claim)) == (len(scenarios), kinds["correct"], kinds["control"],
                                              kinds["approximate"]), name
    quick = re.findall(r"--quick`? (?:\((\d+) scenarios\)|runs (\d+) of them)", README)
    assert quick and all(int(a or b) == sum(s.quick for s in scenarios) for a, b in quick)


def test_the_wheel_holds_the_packages_and_data_and_nothing_else(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (wheel,) = tmp_path.glob("specref-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"specref", "toy_models"}
    data = sorted(n for n in names if not n.endswith(".py") and ".dist-info" not in n)
    weights = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "toy_models" / "weights").glob("*.npz"))
    shipped = sorted(["specref/py.typed", *weights])  # py.typed: type checkers read specref's annotations
    assert data == shipped and weights, (data, shipped)
    for sub in ("core", "decoding", "verification", "adapters"):
        assert f"specref/{sub}/__init__.py" in names


def long_functions(root: Path, limit: int = 60) -> list[str]:
    """Functions longer than ``limit`` lines whose docstring does not say why ("Over 60 lines")."""
    import ast

    found = []
    for path in sorted((root / "specref").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit and "Over 60 lines" not in (ast.get_docstring(node) or ""):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_runs_over_60_lines_without_a_stated_reason(tmp_path):
    assert long_functions(ROOT) == []
    (tmp_path / "specref").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (tmp_path / "specref" / "long.py").write_text(f"def f():\n    \"\"\"No reason.\"\"\"\n{body}\n")
    assert long_functions(tmp_path) == ["specref/long.py:1 f (63 lines)"]  # the check can fail
